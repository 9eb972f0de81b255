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

A plain name that none of these tables has is then asked of the installed
packages that keep a registry of their own (pytorch_optimizer, timm), which
imports them; listing does only when asked to (``ask_packages=True``). So a
plugin name that only such a registry also has resolves to the plugin,
unreported.

A config is data, and a name in it must not run arbitrary code:

- an import path may name only a class of the registry's kind (a
  ``torch.optim.Optimizer`` subclass; for schedulers an ``LRScheduler``
  subclass or ``ReduceLROnPlateau``) or a factory that was registered or is
  declared by an entry point. Anything else is a :class:`ConfigError`
  raised here, before anything is called;
- importing the named module runs its code, so import paths can be turned
  off: ``allow_import_paths=False``, or ``OPTCORE_ALLOW_IMPORT_PATHS=0``
  (``false``/``no``/``off``) when the keyword is ``None``. Then an import
  path is a :class:`ConfigError` that says how to register the class, and no
  module is imported;
- a name longer than :data:`~optcore._names.MAX_NAME_LENGTH` is refused
  before any work.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import os
import threading
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ._errors import ConfigError, OptimizerNotFoundError, printable, shown
from ._names import MAX_NAME_LENGTH, close_matches, normalize
from ._packages import KNOWN_PACKAGES, PackageRegistries, importable_classes, is_installed, load_package_class, memo, what_it_is
from ._plugins import OPTIMIZERS_GROUP, PluginEntry, entry_points
from ._spec import OptimizerSpec
from ._torch_facts import TORCH_FACTS

SOURCES = ("torch", "package", "builtin", "plugin", "user")
_OFF = {"0", "false", "no", "off"}


class ShadowedNameWarning(UserWarning):
    """A plain name resolved to one provider while another one is installed."""


def import_paths_allowed(flag: bool | None = None) -> bool:
    """``flag``, or when it is ``None`` the ``OPTCORE_ALLOW_IMPORT_PATHS``
    switch (allowed unless ``0``/``false``/``no``/``off``)."""
    if flag is not None:
        return bool(flag)
    return os.environ.get("OPTCORE_ALLOW_IMPORT_PATHS", "").strip().lower() not in _OFF


def _validate_optimizer_target(obj: Any) -> None:
    """What an entry point must point at: a class (or factory) taking params,
    with a pydantic ``config_schema`` if it declares one."""
    if not callable(obj):
        raise TypeError(f"entry point object {obj!r} is not a class or factory")
    schema = getattr(obj, "config_schema", None)
    if schema is not None:
        from pydantic import BaseModel  # lazily: pydantic stays out of listing

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
        reduce_to: Callable[[str], Any] | None = None,
        asked: PackageRegistries | None = None,
    ) -> None:
        self.kind = kind
        self._spec_class = spec_class
        self.group = group
        self._builtin_sources = list(builtin_sources)
        self._not_found = not_found
        self._validate = validate
        self._reduce_to = reduce_to
        self.asked = asked
        self._user: dict[str, OptimizerSpec] = {}
        self._version = 0
        self._lock = threading.RLock()
        self._index_cache: tuple[Any, dict[str, list[OptimizerSpec]]] | None = None
        self._warned: set[str] = set()

    def _own(self, spec: OptimizerSpec) -> OptimizerSpec:
        """``spec`` pickling to this registry's resolve function."""
        if spec.reduce_to is not None or self._reduce_to is None:
            return spec
        return dataclasses.replace(spec, reduce_to=self._reduce_to)

    # ------------------------------------------------------------ the sources
    @functools.cached_property
    def _builtins(self) -> list[OptimizerSpec]:
        return [self._own(spec) for source in self._builtin_sources for spec in source()]

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
                reduce_to=self._reduce_to,
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
    def resolve(self, name: Any, *, allow_import_paths: bool | None = None) -> OptimizerSpec:
        """The spec for ``name`` (see the module docstring for the forms).

        ``allow_import_paths``: whether a dotted path may import its module
        (``None``: the ``OPTCORE_ALLOW_IMPORT_PATHS`` switch, default allowed).
        """
        if not isinstance(name, str):
            if callable(name):
                return self._spec_for_object(name)
            raise ConfigError(
                f"An {self.kind} type must be a name or a class, got {type(name).__name__} {printable(repr(name))}.",
                problems=[("type", "not a string or class")],
            )
        if len(name) > MAX_NAME_LENGTH:
            raise ConfigError(
                f"The {self.kind} type is {len(name):,} characters long; a name or import path has at most "
                f"{MAX_NAME_LENGTH}: {shown(name, 60)}.",
                problems=[("type", f"longer than {MAX_NAME_LENGTH} characters")],
            )
        text = name.strip()
        if not text:
            raise ConfigError(f"Empty {self.kind} type: give a name such as 'AdamW'.", problems=[("type", "empty")])
        allowed = import_paths_allowed(allow_import_paths)
        index = self._index()
        if ":" in text:
            return self._resolve_qualified(text, index, allowed)
        found = index.get(normalize(text))
        if found:
            return self._winner(found)
        if "." in text:
            module, _, attr = text.rpartition(".")
            return self._resolve_import(module, attr, text, allowed)
        if self.asked is not None:
            found = self.asked.find(text, kind=self.kind, reduce_to=self._reduce_to)
            if found:
                return self._winner(found)
        raise self._not_found(text, self._searched(), close_matches(text, self._all_names(index)))

    def _winner(self, found: list[OptimizerSpec]) -> OptimizerSpec:
        winner = found[0]
        if len(found) == 1:
            return winner
        spec = dataclasses.replace(winner, shadowed=tuple(found[1:]))
        spec.__dict__.update({k: v for k, v in winner.__dict__.items() if k in ("target", "schema", "capabilities")})
        overlooked = [s for s in found[1:] if s.source in ("plugin", "user")]
        if overlooked and winner.source in ("torch", "package", "plugin") and normalize(winner.name) not in self._warned:
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

    def _resolve_qualified(self, text: str, index: dict[str, list[OptimizerSpec]], allowed: bool) -> OptimizerSpec:
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
        if self.asked is not None and rest.isidentifier():
            packages = self.asked.matching(prefix)
            if packages:
                found = self.asked.find(rest, packages, kind=self.kind, reduce_to=self._reduce_to)
                if found:
                    return found[0]
        return self._resolve_import(prefix, rest, text, allowed)

    def _resolve_import(self, module: str, attr: str, text: str, allowed: bool) -> OptimizerSpec:
        """An import path: a class of this kind, or a registered or declared
        factory; checked here, so that nothing else is ever called."""
        if not module or not attr or not all(p.isidentifier() for p in [*module.split("."), attr]):
            raise self._not_found(text, self._searched(), close_matches(text, self._all_names(self._index())))
        declared = self._declared(module, attr)
        if declared is not None:  # a registered or plugin name, by its import path: imports nothing here
            return declared
        if not allowed:
            raise self._import_paths_off(module, attr, text)
        top = module.partition(".")[0]
        if not is_installed(top):
            raise self._not_found(
                text,
                [f"import path {module}:{attr}"],
                close_matches(attr, self._all_names(self._index())),
                hint=f"Module {top!r} is not installed; pip install the package that provides it.",
            )
        mod = self._import_module(module, text)
        try:
            obj = getattr(mod, attr)
        except AttributeError:
            classes = self._classes_in(mod)
            sep = ":" if ":" in text else "."
            raise self._not_found(
                text,
                [f"the {self.kind} classes of module {module} ({len(classes)})"],
                [f"{module}{sep}{n}" for n in close_matches(attr, classes)],
                hint=f"Module {module} has no {attr!r}; `optcore list` shows the names optcore knows.",
            ) from None
        except Exception as exc:  # a module __getattr__ that fails
            raise ConfigError(
                f"type {shown(text)}: reading {attr!r} from module {module} failed "
                f"({type(exc).__name__}: {printable(exc)}).",
                problems=[("type", "import failed")],
            ) from exc
        if not (isinstance(obj, type) and issubclass(obj, importable_classes(self.kind))):
            raise ConfigError(
                f"type {shown(text)} names {what_it_is(obj)}, not {self._kind_classes()}. An import path in a config "
                f"may name only such a class; a factory must first be registered "
                f"(optcore.register_{self.kind}('MyName', factory)) or declared as an entry point in group "
                f"{self.group!r}, and is then named by that name.",
                problems=[("type", f"not a {self.kind} class")],
                target=text,
            )
        return self._spec_for_object(obj, qualified=f"{module}:{attr}", source="package")

    def _declared(self, module: str, attr: str) -> OptimizerSpec | None:
        """The registered or entry-point spec whose object is ``module:attr``,
        found by name (nothing is imported)."""
        path = f"{module}:{attr}"
        bases = importable_classes(self.kind)
        for spec in self._user.values():
            target = spec.target  # registered objects are in memory
            if isinstance(target, type) and issubclass(target, bases):
                continue  # a class resolves by its path as itself, not as someone's registration
            if f"{getattr(target, '__module__', '')}:{getattr(target, '__qualname__', '')}" == path:
                return spec
        for specs in self._index().values():
            for spec in specs:
                if spec.source == "plugin" and self._entry_value(spec) == path:
                    return spec
        return None

    def _entry_value(self, spec: OptimizerSpec) -> str | None:
        for entry in entry_points(self.group):
            if entry.name == spec.name and (entry.distribution or entry.module) == spec.provider:
                return entry.value.replace(" ", "")
        return None

    def _import_module(self, module: str, text: str) -> Any:
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if missing and (module == missing or module.startswith(missing + ".")):
                raise self._not_found(
                    text, [f"import path {module}"], [], hint=f"There is no module {missing!r}."
                ) from None
            raise self._import_failed(module, text, exc) from exc
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # the module's own code failed, sys.exit() too
            raise self._import_failed(module, text, exc) from exc

    def _import_failed(self, module: str, text: str, exc: BaseException) -> ConfigError:
        return ConfigError(
            f"type {shown(text)}: importing module {module} failed ({type(exc).__name__}: {printable(exc)}). "
            "Fix or reinstall the package that provides it.",
            problems=[("type", "import failed")],
            target=text,
        )

    def _import_paths_off(self, module: str, attr: str, text: str) -> ConfigError:
        known = self._index().get(normalize(attr))
        also = f" {attr!r} is a known name: use type={known[0].qualified!r}." if known else ""
        return ConfigError(
            f"type {shown(text)} is an import path, and import paths are turned off (allow_import_paths=False or "
            f"OPTCORE_ALLOW_IMPORT_PATHS=0), so no module is imported for a config. Name a known {self.kind} "
            f"instead (`optcore list`), or register the class in code and use its name: "
            f"`optcore.register_{self.kind}({attr!r}, {module}.{attr})`, or declare it as an entry point in group "
            f"{self.group!r}.{also}",
            problems=[("type", "import paths are turned off")],
            target=text,
        )

    def _kind_classes(self) -> str:
        if self.kind == "scheduler":
            return "a torch.optim.lr_scheduler.LRScheduler subclass or ReduceLROnPlateau"
        return "a torch.optim.Optimizer subclass"

    def _classes_in(self, mod: Any) -> list[str]:
        bases = importable_classes(self.kind)
        return [
            n
            for n, v in vars(mod).items()
            if not n.startswith("_") and isinstance(v, type) and issubclass(v, bases) and v not in bases
        ]

    def _spec_for_object(self, obj: Any, qualified: str | None = None, source: str = "user") -> OptimizerSpec:
        module = getattr(obj, "__module__", "") or ""
        name = getattr(obj, "__name__", type(obj).__name__)
        spec = self._spec_class(
            name=name,
            source=source,  # type: ignore[arg-type]
            provider=module.partition(".")[0] or "<object>",
            qualified=qualified or f"{module}:{name}",
            loader=lambda: obj,
            kind=self.kind,
            reduce_to=self._reduce_to,
        )
        spec.__dict__["target"] = obj  # in memory already
        return spec

    def _all_names(self, index: dict[str, list[OptimizerSpec]]) -> list[str]:
        names = [specs[0].name for specs in index.values()]
        return names + (self.asked.all_names() if self.asked is not None else [])

    def _searched(self) -> list[str]:
        where = [f"{self.kind}s of torch, installed packages, register_{self.kind}() and plugins ({self.group})"]
        if self.asked is not None:
            where += [f"{dist}'s registry (unreadable: {why})" for dist, why in self.asked.failures.items()]
        return where

    # ---------------------------------------------------------------- listing
    def list(self, all: bool = False, ask_packages: bool = False) -> list[OptimizerSpec]:
        """Every resolvable name once (the winner, with ``shadowed``), or with
        ``all=True`` every provider of every name. ``ask_packages=True`` adds
        the names that only the packages' own registries have (76 of
        pytorch_optimizer's 128 here), which imports those packages."""
        index = self._index()
        if all:
            specs = [spec for specs in index.values() for spec in specs]
        else:
            specs = [self._quiet_winner(specs) for specs in index.values()]
        if ask_packages and self.asked is not None:
            specs += self.asked.every(index, kind=self.kind, reduce_to=self._reduce_to)
        return specs

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
            from pydantic import BaseModel  # lazily: pydantic stays out of import optcore

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
                reduce_to=self._reduce_to,
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
    from ._torch_optims import TORCH_SCHEMAS  # lazily: the schemas are pydantic models

    return TORCH_SCHEMAS[name]


def _package_specs() -> list[OptimizerSpec]:
    specs = []
    for pkg in KNOWN_PACKAGES:
        if not is_installed(pkg.top_level):
            continue
        for cls in pkg.classes:
            specs.append(
                OptimizerSpec(
                    name=cls,
                    source="package",
                    provider=pkg.distribution,
                    qualified=f"{pkg.module}:{cls}",
                    loader=memo(functools.partial(load_package_class, pkg, cls)),
                )
            )
    return specs


def resolve(name: Any, *, allow_import_paths: bool | None = None) -> OptimizerSpec:
    """The :class:`OptimizerSpec` for ``name``; raises
    :class:`OptimizerNotFoundError` with the closest names if none.

    ``allow_import_paths=False`` (or ``OPTCORE_ALLOW_IMPORT_PATHS=0`` when it
    is ``None``) refuses dotted paths, importing nothing for them."""
    return OPTIMIZERS.resolve(name, allow_import_paths=allow_import_paths)


OPTIMIZERS = Registry(
    "optimizer",
    OPTIMIZERS_GROUP,
    [_torch_specs, _package_specs],
    validate=_validate_optimizer_target,
    reduce_to=resolve,
    asked=PackageRegistries(KNOWN_PACKAGES),
)


def list_optimizers(all: bool = False, ask_packages: bool = False) -> list[OptimizerSpec]:
    """Every resolvable optimizer name (``all=True``: shadowed providers too).
    Nothing of a plugin or package is imported, unless ``ask_packages=True``
    adds the names that only installed packages' own registries have
    (pytorch_optimizer's ``Shampoo``, ...), which imports those packages."""
    return OPTIMIZERS.list(all=all, ask_packages=ask_packages)


def register_optimizer(name_or_target: Any = None, target: Any = None, *, schema: Any = None, override: bool = False) -> Any:
    """Register an optimizer class or factory under a name (see API.md for the
    three spellings). Registering a name twice is an error unless
    ``override=True``."""
    return OPTIMIZERS.register(name_or_target, target, schema=schema, override=override)


def unregister_optimizer(name: str) -> None:
    """Remove a ``register_optimizer`` registration."""
    OPTIMIZERS.unregister(name)
