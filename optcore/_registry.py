"""Resolution of ``type`` names, in API.md's order.

1. ``torch.optim``;
2. installed third-party packages (:mod:`optcore._packages`) and dotted paths;
3. the registry: ``register_optimizer`` in user code, then entry points in
   group ``optcore.optimizers``.

The first place that has a name wins; the others are kept on the winning spec
as ``shadowed``. A qualified name picks one place explicitly: a source
(``"torch:Adafactor"``, ``"user:MyOpt"``), a provider (``"optcore-lion:Lion"``,
``"optcore_lion:Lion"``, ``"pytorch_optimizer:Lion"``) or an import path
(``"pkg.mod:Class"``, ``"pkg.mod.Class"``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import threading
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from ._errors import ConfigError, OptimizerNotFoundError, PluginLoadError
from ._names import close_matches, normalize
from ._plugins import OPTIMIZERS_GROUP, PluginEntry, entry_points
from ._spec import OptimizerSpec

SOURCES = ("torch", "package", "builtin", "plugin", "user")


class ShadowedNameWarning(UserWarning):
    """A plain name resolved to one provider while another one is installed."""


def _memo(fn: Callable[[], Any]) -> Callable[[], Any]:
    box: list[Any] = []

    def load() -> Any:  # callers hold the specs' load lock
        if not box:
            box.append(fn())
        return box[0]

    return load


def _import_attr(module: str, attr: str, distribution: str | None = None) -> Any:
    try:
        mod = importlib.import_module(module)
    except Exception as exc:
        raise PluginLoadError(distribution or module, f"{module}:{attr}", exc) from exc
    try:
        return getattr(mod, attr)
    except AttributeError as exc:
        raise PluginLoadError(distribution or module, f"{module}:{attr}", exc) from exc


def _is_installed(top_level: str) -> bool:
    try:
        return importlib.util.find_spec(top_level) is not None
    except (ImportError, ValueError):
        return False


def _validate_optimizer_target(obj: Any) -> None:
    """What an entry point must point at: a class (or factory) taking params,
    with a pydantic ``config_schema`` if it declares one."""
    if not callable(obj):
        raise TypeError(f"entry point object {obj!r} is not a class or factory")
    schema = getattr(obj, "config_schema", None)
    if schema is not None:
        from pydantic import BaseModel

        if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
            raise TypeError(f"{obj!r}.config_schema must be a pydantic BaseModel subclass, got {schema!r}")


class Registry:
    """The names of one kind (optimizers here; schedulers reuse it)."""

    def __init__(
        self,
        kind: str,
        group: str,
        builtin_sources: Iterable[Callable[[], list[OptimizerSpec]]],
        not_found: type[OptimizerNotFoundError] = OptimizerNotFoundError,
        validate: Callable[[Any], None] | None = None,
        spec_class: type[OptimizerSpec] = OptimizerSpec,
    ) -> None:
        self.kind = kind
        self._spec_class = spec_class
        self.group = group
        self._builtin_sources = list(builtin_sources)
        self._not_found = not_found
        self._validate = validate
        self._user: dict[str, OptimizerSpec] = {}
        self._version = 0
        self._lock = threading.RLock()
        self._index_cache: tuple[Any, dict[str, list[OptimizerSpec]]] | None = None
        self._warned: set[str] = set()

    # ------------------------------------------------------------ the sources
    @functools.cached_property
    def _builtins(self) -> list[OptimizerSpec]:
        return [spec for source in self._builtin_sources for spec in source()]

    def _plugin_specs(self, entries: tuple[PluginEntry, ...]) -> list[OptimizerSpec]:
        return [
            self._spec_class(
                name=e.name,
                source="plugin",
                provider=e.distribution or e.module,
                qualified=f"{e.distribution or e.module}:{e.name}",
                loader=e.loader(self._validate),
                version=e.version,
                kind=self.kind,
            )
            for e in entries
        ]

    def _index(self) -> dict[str, list[OptimizerSpec]]:
        entries = entry_points(self.group)
        key = (self._version, entries)
        cached = self._index_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        with self._lock:
            index: dict[str, list[OptimizerSpec]] = {}
            for spec in [*self._builtins, *self._user.values(), *self._plugin_specs(entries)]:
                index.setdefault(normalize(spec.name), []).append(spec)
            self._index_cache = (key, index)
            self._warned.clear()  # a new set of providers: say it again
            return index

    # ------------------------------------------------------------- resolving
    def resolve(self, name: Any) -> OptimizerSpec:
        """The spec for ``name`` (see the module docstring for the forms)."""
        if not isinstance(name, str):
            if callable(name):
                return self._spec_for_object(name)
            raise ConfigError(
                f"An {self.kind} type must be a name or a class, got {type(name).__name__} {name!r}.",
                problems=[("type", "not a string or class")],
            )
        text = name.strip()
        if not text:
            raise ConfigError(f"Empty {self.kind} type: give a name such as 'AdamW'.", problems=[("type", "empty")])
        index = self._index()
        if ":" in text:
            return self._resolve_qualified(text, index)
        found = index.get(normalize(text))
        if found:
            return self._winner(found)
        if "." in text:
            module, _, attr = text.rpartition(".")
            return self._resolve_import(module, attr, text)
        raise self._not_found(text, self._searched(), close_matches(text, self._all_names(index)))

    def _winner(self, found: list[OptimizerSpec]) -> OptimizerSpec:
        winner = found[0]
        if len(found) == 1:
            return winner
        import dataclasses

        spec = dataclasses.replace(winner, shadowed=tuple(found[1:]))
        spec.__dict__.update({k: v for k, v in winner.__dict__.items() if k in ("target", "schema", "capabilities")})
        overlooked = [s for s in found[1:] if s.source in ("plugin", "user")]
        if overlooked and winner.source in ("torch", "package") and normalize(winner.name) not in self._warned:
            self._warned.add(normalize(winner.name))
            others = ", ".join(f"{s.provider} ({s.source}; select it with type={s.qualified!r})" for s in overlooked)
            warnings.warn(
                f"{self.kind.capitalize()} name {winner.name!r} resolved to {winner.qualified} ({winner.source}), "
                f"which comes first in the resolution order; also installed: {others}. "
                f"Use type={winner.qualified!r} to keep this choice and silence this warning.",
                ShadowedNameWarning,
                stacklevel=4,
            )
        return spec

    def _resolve_qualified(self, text: str, index: dict[str, list[OptimizerSpec]]) -> OptimizerSpec:
        prefix, _, rest = text.partition(":")
        norm_prefix, norm_rest = normalize(prefix), normalize(rest)
        candidates = index.get(norm_rest, [])
        if norm_prefix in SOURCES:
            picked = [s for s in candidates if s.source == norm_prefix]
            if picked:
                return picked[0]
            raise self._not_found(
                text,
                [f"{norm_prefix} {self.kind}s"],
                [s.qualified for s in candidates] or close_matches(rest, self._all_names(index)),
            )
        picked = [
            s
            for s in candidates
            if normalize(s.provider) == norm_prefix or normalize(s.qualified.partition(":")[0]) == norm_prefix
        ]
        if picked:
            return picked[0]
        return self._resolve_import(prefix, rest, text)

    def _resolve_import(self, module: str, attr: str, text: str) -> OptimizerSpec:
        if not module or not attr or not all(p.isidentifier() for p in [*module.split("."), attr]):
            raise self._not_found(text, self._searched(), close_matches(text, self._all_names(self._index())))
        if not _is_installed(module.partition(".")[0]):
            raise self._not_found(
                text,
                [f"import path {module}:{attr}"],
                close_matches(attr, self._all_names(self._index())),
                hint=f"Module {module.partition('.')[0]!r} is not installed; pip install the package that provides it.",
            )
        target = _import_attr(module, attr)
        return self._spec_for_object(target, qualified=f"{module}:{attr}", source="package")

    def _spec_for_object(self, obj: Any, qualified: str | None = None, source: str = "user") -> OptimizerSpec:
        module = getattr(obj, "__module__", "") or ""
        name = getattr(obj, "__name__", type(obj).__name__)
        return self._spec_class(
            name=name,
            source=source,  # type: ignore[arg-type]
            provider=module.partition(".")[0] or "<object>",
            qualified=qualified or f"{module}:{name}",
            loader=lambda: obj,
            kind=self.kind,
        )

    def _all_names(self, index: dict[str, list[OptimizerSpec]]) -> list[str]:
        return [specs[0].name for specs in index.values()]

    def _searched(self) -> list[str]:
        return [f"{self.kind}s of torch, installed packages, register_{self.kind}() and plugins ({self.group})"]

    # ---------------------------------------------------------------- listing
    def list(self, all: bool = False) -> list[OptimizerSpec]:
        """Every resolvable name once (the winner, with ``shadowed``), or with
        ``all=True`` every provider of every name."""
        index = self._index()
        if all:
            return [spec for specs in index.values() for spec in specs]
        return [self._quiet_winner(specs) for specs in index.values()]

    def _quiet_winner(self, specs: list[OptimizerSpec]) -> OptimizerSpec:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ShadowedNameWarning)
            return self._winner(specs) if len(specs) > 1 else specs[0]

    # ------------------------------------------------------------ registering
    def register(self, name_or_target: Any = None, target: Any = None, *, schema: Any = None, override: bool = False) -> Any:
        """``register(name, cls)``, ``register(cls)``, or as a decorator
        ``@register(name, schema=...)`` / ``@register``."""
        if isinstance(name_or_target, str) or name_or_target is None:
            name = name_or_target
            if target is None:

                def decorator(obj: Any) -> Any:
                    self._add(name or obj.__name__, obj, schema, override)
                    return obj

                return decorator
            self._add(name or target.__name__, target, schema, override)
            return target
        if target is not None:
            raise ConfigError(
                f"register_{self.kind}(name, target): the name must be a string, got {name_or_target!r}."
            )
        self._add(name_or_target.__name__, name_or_target, schema, override)
        return name_or_target

    def _add(self, name: str, target: Any, schema: Any, override: bool) -> None:
        if not callable(target):
            raise ConfigError(f"register_{self.kind}({name!r}, ...) needs a class or factory, got {target!r}.")
        if schema is not None:
            from pydantic import BaseModel

            if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
                raise ConfigError(f"schema for {name!r} must be a pydantic BaseModel subclass, got {schema!r}.")
        key = normalize(name)
        with self._lock:
            existing = self._user.get(key)
            if existing is not None and existing.target is not target and not override:
                raise ConfigError(
                    f"{self.kind.capitalize()} {name!r} is already registered ({existing.qualified}); "
                    f"pass override=True to replace it, or choose another name."
                )
            self._user[key] = self._spec_class(
                name=name,
                source="user",
                provider=(getattr(target, "__module__", "") or "<user>").partition(".")[0],
                qualified=f"user:{name}",
                loader=lambda: target,
                explicit_schema=schema,
                kind=self.kind,
            )
            self._version += 1
            self._warned.discard(key)
        first = next((s for s in self._builtins if normalize(s.name) == key), None)
        if first is not None:
            warnings.warn(
                f"register_{self.kind}({name!r}): {first.qualified} ({first.source}) already has this name and "
                f"resolves first; select yours with type='user:{name}'.",
                ShadowedNameWarning,
                stacklevel=3,
            )

    def unregister(self, name: str) -> None:
        with self._lock:
            if self._user.pop(normalize(name), None) is None:
                raise self._not_found(name, ["register_" + self.kind + "() registrations"], close_matches(name, [s.name for s in self._user.values()]))
            self._version += 1


# ---------------------------------------------------------------- optimizers
def _torch_specs() -> list[OptimizerSpec]:
    import torch

    from ._torch_facts import TORCH_FACTS

    names = [n for n in TORCH_FACTS if isinstance(getattr(torch.optim, n, None), type)]
    names += sorted(
        n
        for n, obj in vars(torch.optim).items()
        if isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer) and obj is not torch.optim.Optimizer
        and n not in TORCH_FACTS
    )
    return [
        OptimizerSpec(
            name=n,
            source="torch",
            provider="torch",
            qualified=f"torch:{n}",
            loader=(lambda n=n: getattr(torch.optim, n)),
            explicit_schema=functools.partial(_torch_schema, n) if n in TORCH_FACTS else None,
            version=torch.__version__,
        )
        for n in names
    ]


def _torch_schema(name: str) -> Any:
    from ._torch_optims import TORCH_SCHEMAS

    return TORCH_SCHEMAS[name]


def _package_specs() -> list[OptimizerSpec]:
    from ._packages import KNOWN_PACKAGES

    specs = []
    for pkg in KNOWN_PACKAGES:
        if not _is_installed(pkg.top_level):
            continue
        for cls in pkg.classes:
            specs.append(
                OptimizerSpec(
                    name=cls,
                    source="package",
                    provider=pkg.distribution,
                    qualified=f"{pkg.module}:{cls}",
                    loader=_memo(functools.partial(_import_attr, pkg.module, cls, pkg.distribution)),
                )
            )
    return specs


OPTIMIZERS = Registry("optimizer", OPTIMIZERS_GROUP, [_torch_specs, _package_specs], validate=_validate_optimizer_target)


def resolve(name: Any, *, allow_import_paths: bool | None = None) -> OptimizerSpec:
    """The :class:`OptimizerSpec` for ``name``; raises
    :class:`OptimizerNotFoundError` with the closest names if none."""
    return OPTIMIZERS.resolve(name)  # allow_import_paths: implemented on the resolution branch


def list_optimizers(all: bool = False) -> list[OptimizerSpec]:
    """Every resolvable optimizer name (``all=True``: shadowed providers too)."""
    return OPTIMIZERS.list(all=all)


def register_optimizer(name_or_target: Any = None, target: Any = None, *, schema: Any = None, override: bool = False) -> Any:
    """Register an optimizer class or factory under a name (see API.md for the
    three spellings). Registering a name twice is an error unless
    ``override=True``."""
    return OPTIMIZERS.register(name_or_target, target, schema=schema, override=override)


def unregister_optimizer(name: str) -> None:
    """Remove a ``register_optimizer`` registration."""
    OPTIMIZERS.unregister(name)
