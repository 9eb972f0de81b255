"""Import paths in a config (``"pkg.mod:Class"``, ``"pkg.mod.Class"``), and the
rules that keep them safe (docs/security.md): it is the one place where a
config string makes optcore import a module, so the rules sit together where
a reviewer reads them. An import path names a class of the registry's kind or
a registered or declared factory, checked before anything is called, and
importing can be turned off.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from ._errors import ConfigError
from ._values import clean_text, short_repr
from ._names import close_matches, normalize
from ._packages import KNOWN_PACKAGES, importable_classes, is_installed, what_it_is
from ._plugins import entry_points
from ._spec import OptimizerSpec
from .guards import judging_only, locate, not_judged, paths_turned_off

_OFF = {"0", "false", "no", "off"}
KIND_CLASSES = {
    "optimizer": "a torch.optim.Optimizer subclass",
    "scheduler": "a torch.optim.lr_scheduler.LRScheduler subclass or ReduceLROnPlateau",
}


def import_paths_allowed(flag: bool | None = None) -> bool:
    """``flag``, or when it is ``None`` the ``OPTCORE_ALLOW_IMPORT_PATHS``
    switch (allowed unless ``0``/``false``/``no``/``off``)."""
    if flag is not None:
        return bool(flag)
    return os.environ.get("OPTCORE_ALLOW_IMPORT_PATHS", "").strip().lower() not in _OFF


class ImportPaths:
    """The import-path half of :class:`optcore._resolution.Registry`, whose members it reads."""

    kind: str
    group: str
    _user: dict[str, OptimizerSpec]
    _not_found: Any
    _index: Any
    _searched: Any
    _all_names: Any
    _spec_for_object: Any

    def _resolve_import(self, module: str, attr: str, text: str, allowed: bool) -> OptimizerSpec:
        """A class of this kind, or a registered or declared factory: nothing else is ever called."""
        if not module or not attr or not all(p.isidentifier() for p in [*module.split("."), attr]):
            raise self._not_found(text, self._searched(), close_matches(text, self._all_names(self._index())))
        declared = self._declared(module, attr)
        if declared is not None:  # a registered or plugin name, by its import path: imports nothing here
            return declared
        if not allowed:
            known = self._index().get(normalize(attr))
            raise paths_turned_off(text, self.kind, self.group, module, attr, known[0].qualified if known else None)
        top = module.partition(".")[0]
        if not is_installed(top):
            raise self._not_found(
                text,
                [f"import path {module}:{attr}"],
                close_matches(attr, self._all_names(self._index())),
                hint=f"Module {top!r} is not installed; pip install the package that provides it.",
            )
        if judging_only() and module not in sys.modules and top not in self._trusted_tops():
            raise self._not_judged(module, attr, text)
        mod = self._import_module(module, text)
        try:
            obj = getattr(mod, attr)
        except AttributeError:
            bases = importable_classes(self.kind)
            classes = [
                n for n, v in vars(mod).items()
                if not n.startswith("_") and isinstance(v, type) and issubclass(v, bases) and v not in bases
            ]
            sep = ":" if ":" in text else "."
            raise self._not_found(
                text,
                [f"the {self.kind} classes of module {module} ({len(classes)})"],
                [f"{module}{sep}{n}" for n in close_matches(attr, classes)],
                hint=f"Module {module} has no {attr!r}; `optcore list` shows the names optcore knows.",
            ) from None
        except Exception as exc:  # a module __getattr__ that fails
            raise ConfigError(
                f"type {short_repr(text, 120)}: reading {attr!r} from module {module} failed "
                f"({type(exc).__name__}: {clean_text(exc)}).",
                problems=[("type", "import failed")],
            ) from exc
        if not (isinstance(obj, type) and issubclass(obj, importable_classes(self.kind))):
            raise ConfigError(
                f"type {short_repr(text, 120)} names {what_it_is(obj)}, not {KIND_CLASSES[self.kind]}. An import "
                f"path in a config may name only such a class; a factory must first be registered "
                f"(optcore.register_{self.kind}('MyName', factory)) or declared as an entry point in group "
                f"{self.group!r}, and is then named by that name.",
                problems=[("type", f"not a {self.kind} class")],
                target=text,
            )
        # torch's own class by its path is the torch name: the same schema and defaults (fused where it can)
        same = (b for b in self._builtins if b.source == "torch" and normalize(b.name) == normalize(attr))
        return next((b for b in same if b.target is obj), None) or self._spec_for_object(
            obj, qualified=f"{module}:{attr}", source="package"
        )

    def _trusted_tops(self) -> set[str]:
        return trusted_tops(self.group)

    def _not_judged(self, module: str, attr: str, text: str) -> Exception:
        origin = locate(module)
        if origin is None:
            return self._not_found(text, [f"import path {module}"], [], hint=f"There is no module {module!r}.")
        return not_judged(text, self.kind, self.group, module, attr, origin)

    def _declared(self, module: str, attr: str) -> OptimizerSpec | None:
        """The registered or entry-point spec whose object is ``module:attr`` (imports nothing)."""
        path = f"{module}:{attr}"
        for spec in self._user.values():
            target = spec.target  # registered objects are in memory
            if isinstance(target, type) and issubclass(target, importable_classes(self.kind)):
                continue  # a class resolves by its path as itself, not as someone's registration
            if f"{getattr(target, '__module__', '')}:{getattr(target, '__qualname__', '')}" == path:
                return spec
        entries = entry_points(self.group)
        declared = {(e.distribution or e.module, e.name) for e in entries if e.value.replace(" ", "") == path}
        plugins = (s for specs in self._index().values() for s in specs if s.source == "plugin")
        return next((s for s in plugins if (s.provider, s.name) in declared), None)

    def _import_module(self, module: str, text: str) -> Any:
        try:
            return importlib.import_module(module)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # the module's own code failed, sys.exit() too
            missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
            if missing and (module == missing or module.startswith(missing + ".")):
                raise self._not_found(
                    text, [f"import path {module}"], [], hint=f"There is no module {missing!r}."
                ) from None
            raise ConfigError(
                f"type {short_repr(text, 120)}: importing module {module} failed ({type(exc).__name__}: "
                f"{clean_text(exc)}). Fix or reinstall the package that provides it.",
                problems=[("type", "import failed")],
                target=text,
            ) from exc


def trusted_tops(*groups: str) -> set[str]:
    """Top-level packages a resolution imports anyway: torch, the known optimizer
    packages, and the installed plugins of ``groups`` (not a look-alike's)."""
    plugins = {e.value.partition(":")[0].strip().partition(".")[0] for g in groups for e in entry_points(g) if not e.clash}
    return {"torch", *(p.top_level for p in KNOWN_PACKAGES), *plugins}
