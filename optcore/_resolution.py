"""``Registry``: the names of one kind, resolved in API.md's order; optimizers
(:mod:`optcore._registry`) and schedulers are two instances of this one
machine. A qualified name picks one place: a source (``"torch:Adafactor"``,
``"user:MyOpt"``), a provider (``"optcore-lion:Lion"``) or an import path.
A plain name no table has is then asked of the packages that keep a registry
of their own, which imports them; so a plugin name that only such a registry
also has resolves to the plugin, unreported.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from ._errors import ConfigError, OptimizerNotFoundError, warn_user
from ._import_paths import ImportPaths, import_paths_allowed
from ._values import short_repr
from ._names import MAX_NAME_LENGTH, close_matches, normalize
from ._packages import PackageRegistries, is_installed
from ._plugins import entry_points, switches_note
from .missing import not_provided
from ._spec import OptimizerSpec

SOURCES = ("torch", "package", "builtin", "plugin", "user")


class ShadowedNameWarning(UserWarning):
    """A plain name resolved to one provider while another one is installed."""


def _is_schema(schema: Any) -> bool:
    from pydantic import BaseModel  # lazily: pydantic stays out of listing

    return isinstance(schema, type) and issubclass(schema, BaseModel)


def _check_entry_point(obj: Any, kind: str) -> None:
    """A class or factory, with a pydantic ``config_schema`` if it has one."""
    if not callable(obj):
        raise TypeError(f"entry point object {obj!r} is not a {kind} class or factory")
    schema = getattr(obj, "config_schema", None)
    if schema is not None and not _is_schema(schema):
        raise TypeError(f"{obj!r}.config_schema must be a pydantic BaseModel subclass, got {schema!r}")


class Registry(ImportPaths):
    """The names of one kind (optimizers here; schedulers reuse it)."""

    def __init__(
        self,
        kind: str,
        group: str,
        builtin_sources: Iterable[Callable[[], list[OptimizerSpec]]],
        not_found: type[OptimizerNotFoundError] = OptimizerNotFoundError,
        spec_class: type[OptimizerSpec] = OptimizerSpec,
        reduce_to: Callable[[str], Any] | None = None,
        asked: PackageRegistries | None = None,
    ) -> None:
        self.kind = kind
        self._spec_class = spec_class
        self.group = group
        self._builtin_sources = list(builtin_sources)
        self._not_found = not_found
        self._reduce_to = reduce_to
        self.asked = asked
        self._user: dict[str, OptimizerSpec] = {}
        self._version = 0
        self._lock = threading.RLock()
        self._index_cache: tuple[Any, dict[str, list[OptimizerSpec]]] | None = None
        self._warned: set[str] = set()

    def _new_spec(self, **fields: Any) -> OptimizerSpec:
        return self._spec_class(kind=self.kind, reduce_to=self._reduce_to, **fields)

    @functools.cached_property
    def _builtins(self) -> list[OptimizerSpec]:
        return [spec for source in self._builtin_sources for spec in source()]

    def _index(self) -> dict[str, list[OptimizerSpec]]:
        entries = entry_points(self.group)
        key = (self._version, entries)
        cached = self._index_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        check = functools.partial(_check_entry_point, kind=self.kind)
        with self._lock:
            plugins = [
                self._new_spec(
                    name=e.name,
                    source="plugin",
                    provider=e.distribution or e.module,
                    qualified=f"{e.distribution or e.module}:{e.name}",
                    loader=functools.cache(functools.partial(e.load, check)),  # specs call it under their lock
                    version=e.version,
                )
                for e in entries
            ]
            index: dict[str, list[OptimizerSpec]] = {}
            for spec in [*self._builtins, *self._user.values(), *plugins]:
                index.setdefault(normalize(spec.name), []).append(spec)
            self._index_cache = (key, index)
            self._warned.clear()  # a new set of providers: say it again
            return index

    def resolve(self, name: Any, *, allow_import_paths: bool | None = None) -> OptimizerSpec:
        """The spec for ``name``; ``allow_import_paths`` as :func:`~optcore._import_paths.import_paths_allowed`."""
        if not isinstance(name, str):
            if callable(name):
                return self._spec_for_object(name)
            raise ConfigError(
                f"An {self.kind} type must be a name or a class, got {type(name).__name__} {short_repr(name, 120)}.",
                problems=[("type", "not a string or class")],
            )
        if len(name) > MAX_NAME_LENGTH:
            raise ConfigError(
                f"The {self.kind} type is {len(name):,} characters long; a name or import path has at most "
                f"{MAX_NAME_LENGTH}: {short_repr(name, 60)}.",
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
            warn_user(
                f"{self.kind.capitalize()} name {winner.name!r} resolved to {winner.qualified} ({winner.source}), "
                f"which comes first in the resolution order; also installed: {others}. "
                f"Use type={winner.qualified!r} to keep this choice and silence this warning.", ShadowedNameWarning)
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
            found = self.asked.find(rest, self.asked.matching(prefix), kind=self.kind, reduce_to=self._reduce_to)
            if found:
                return found[0]
        module_path = all(p.isidentifier() for p in prefix.split("."))
        if not module_path or (allowed and "." not in prefix and not is_installed(prefix)):
            # a distribution's name ("optcore-sophia"), or a top-level name no module has: say what is missing
            headline, hint = not_provided(prefix, rest, self.group, self.kind, could_be_module=module_path)
            raise self._not_found(text, self._searched(), close_matches(rest, self._all_names(index)),
                                  hint=hint, headline=headline)  # fmt: skip
        return self._resolve_import(prefix, rest, text, allowed)

    def _spec_for_object(self, obj: Any, qualified: str | None = None, source: str = "user") -> OptimizerSpec:
        module = getattr(obj, "__module__", "") or ""
        name = getattr(obj, "__name__", type(obj).__name__)
        spec = self._new_spec(
            name=name,
            source=source,
            provider=module.partition(".")[0] or "<object>",
            qualified=qualified or f"{module}:{name}",
            loader=lambda: obj,
        )
        spec.__dict__["target"] = obj  # in memory already
        return spec

    def _all_names(self, index: dict[str, list[OptimizerSpec]]) -> list[str]:
        names = [specs[0].name for specs in index.values()]
        return names + (self.asked.all_names() if self.asked is not None else [])

    def _searched(self) -> list[str]:
        where = [f"{self.kind}s of torch, installed packages, register_{self.kind}() and plugins ({self.group})"]
        where += [note] if (note := switches_note()) else []
        if self.asked is not None:
            where += [f"{dist}'s registry (unreadable: {why})" for dist, why in self.asked.failures.items()]
        return where

    def list(self, all: bool = False, ask_packages: bool = False) -> list[OptimizerSpec]:
        """Every resolvable name once (the winner, with ``shadowed``), or with
        ``all=True`` every provider of every name; ``ask_packages=True`` adds
        the names only the packages' own registries have (importing them)."""
        index = self._index()
        if all:
            specs = [spec for specs in index.values() for spec in specs]
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ShadowedNameWarning)
                specs = [self._winner(specs) for specs in index.values()]
        if ask_packages and self.asked is not None:
            specs += self.asked.every(index, kind=self.kind, reduce_to=self._reduce_to)
        return specs

    def register(self, name_or_target: Any = None, target: Any = None, *, schema: Any = None, override: bool = False) -> Any:
        """``register(name, cls)``, ``register(cls)``, or as a decorator
        ``@register(name, schema=...)`` / ``@register``."""
        if name_or_target is not None and not isinstance(name_or_target, str):
            if target is not None:
                raise ConfigError(
                    f"register_{self.kind}(name, target): the name must be a string, got {name_or_target!r}."
                )
            name_or_target, target = None, name_or_target

        def add(obj: Any) -> Any:
            self._add(name_or_target or obj.__name__, obj, schema, override)
            return obj

        return add if target is None else add(target)

    def _add(self, name: str, target: Any, schema: Any, override: bool) -> None:
        if not callable(target):
            raise ConfigError(f"register_{self.kind}({name!r}, ...) needs a class or factory, got {target!r}.")
        if schema is not None and not _is_schema(schema):
            raise ConfigError(f"schema for {name!r} must be a pydantic BaseModel subclass, got {schema!r}.")
        key = normalize(name)
        with self._lock:
            existing = self._user.get(key)
            if existing is not None and existing.target is not target and not override:
                raise ConfigError(
                    f"{self.kind.capitalize()} {name!r} is already registered ({existing.qualified}); "
                    f"pass override=True to replace it, or choose another name."
                )
            self._user[key] = self._new_spec(
                name=name,
                source="user",
                provider=(getattr(target, "__module__", "") or "<user>").partition(".")[0],
                qualified=f"user:{name}",
                loader=lambda: target,
                explicit_schema=schema,
            )
            self._version += 1
            self._warned.discard(key)
        first = next((s for s in self._builtins if normalize(s.name) == key), None)
        if first is not None:
            warn_user(
                f"register_{self.kind}({name!r}): {first.qualified} ({first.source}) already has this name and "
                f"resolves first; select yours with type='user:{name}'.", ShadowedNameWarning)

    def unregister(self, name: str) -> None:
        with self._lock:
            if self._user.pop(normalize(name), None) is None:
                known = [s.name for s in self._user.values()]
                raise self._not_found(name, [f"register_{self.kind}() registrations"], close_matches(name, known))
            self._version += 1

