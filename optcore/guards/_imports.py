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
