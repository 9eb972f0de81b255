"""Import paths judged without importing: ``optcore check`` and ``show`` must
not run the code of a module a config names (``{"type": "this:x"}`` printed
the Zen of Python). :func:`locate` finds where a module would come from
without running any package's ``__init__``; :func:`without_imports` marks a
judging command, and the resolution refuses by name what it would import.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from .._errors import ConfigError
from .._values import clean_text, short_repr

_judging_only: ContextVar[bool] = ContextVar("optcore_judging_only", default=False)


@contextmanager
def without_imports() -> Iterator[None]:
    """Resolution inside runs no module's code: an import path to a module not
    imported yet is located on disk and refused by name (``optcore check`` and
    ``show`` judge a config; they must not run what they judge)."""
    token = _judging_only.set(True)
    try:
        yield
    finally:
        _judging_only.reset(token)


def locate(module: str) -> str | None:
    """Where ``module`` would be imported from, or ``None``: each parent's
    search path from its spec, so no package's ``__init__`` runs (which
    ``importlib.util.find_spec`` would do for a dotted name)."""
    path, spec = None, None
    parts = module.split(".")
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        loaded = sys.modules.get(name)
        if loaded is not None:
            spec, path = getattr(loaded, "__spec__", None), getattr(loaded, "__path__", None)
        else:
            spec = next((s for finder in sys.meta_path if (s := _find_spec(finder, name, path)) is not None), None)
            if spec is None:
                return None
            path = spec.submodule_search_locations
        if path is None and i < len(parts) - 1:
            return None  # a module, not a package: it has no submodules
    return str(getattr(spec, "origin", None) or "a namespace package")


def _find_spec(finder: Any, name: str, path: Any) -> Any:
    try:
        return finder.find_spec(name, list(path) if path is not None else None)
    except Exception:  # a finder that fails on a name it does not know
        return None


def judging_only() -> bool:
    """Whether the caller is inside :func:`without_imports`."""
    return _judging_only.get()


def paths_turned_off(text: str, kind: str, group: str, module: str, attr: str, known: str | None) -> ConfigError:
    """The error for import path ``text`` (``module:attr``) in a config while
    import paths are turned off; ``known`` is the qualified name of a known
    ``kind`` of the same name."""
    also = f" {attr!r} is a known name: use type={known!r}." if known else ""
    return ConfigError(
        f"type {short_repr(text, 120)} is an import path, and import paths are turned off "
        f"(allow_import_paths=False or OPTCORE_ALLOW_IMPORT_PATHS=0), so no module is imported for a config. "
        f"Name a known {kind} instead (`optcore list`), or register the class in code and use its name: "
        f"`optcore.register_{kind}({attr!r}, {module}.{attr})`, or declare it as an entry point in group "
        f"{group!r}.{also}",
        problems=[("type", "import paths are turned off")],
        target=text,
    )


def not_judged(text: str, kind: str, group: str, module: str, attr: str, origin: str) -> ConfigError:
    """The error for an import path to a module found at ``origin`` but not
    imported, met by a command that judges a config (:func:`without_imports`)."""
    return ConfigError(
        f"type {short_repr(text, 120)} is an import path to module {module} ({clean_text(origin, 200)}), "
        "which is not imported, and this command does not import it: importing runs the module's code, and a "
        "check must not run the code it judges. A build imports it. To judge it here, run the command with "
        f"--import-modules (which runs the module), or register the class and name it "
        f"(`optcore.register_{kind}({attr!r}, {module}.{attr})`) or declare it as an entry point in group "
        f"{group!r}. Where configs come from others, turn import paths off in builds too: "
        "OPTCORE_ALLOW_IMPORT_PATHS=0 (or allow_import_paths=False).",
        problems=[("type", "import path not imported by a check")],
        target=text,
    )
