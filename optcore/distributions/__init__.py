"""The copies of each plugin distribution found on ``sys.path``, and the
look-alikes among them: :class:`Copies`, which entry-point discovery
(:mod:`optcore._plugins`) fills while it scans.

Two distributions whose normalized names are equal (PEP 503 folds case and
runs of ``-``, ``_`` and ``.``; optcore's names fold those away entirely) are
one name with two meanings: ``Optcore_Lion-1.0.dist-info`` in a ``PYTHONPATH``
folder and the installed ``optcore-lion``. pip would see one of them, Python's
``importlib.metadata`` takes the first in ``sys.path`` order, and so did
optcore, which let whoever can write an earlier folder pick the code that runs
for ``optcore-lion:Lion``. Neither is guessed here: both copies are named, with
their folders, and the caller refuses to load either (:class:`LookAlikeError`).

The same folder reached twice through ``sys.path`` (``""`` and the working
directory) is one copy. Only folders the scan opens anyway are compared, so
this adds no file system work but a ``realpath`` for a name seen twice.
"""

from __future__ import annotations

import os

from .._errors import PluginLoadError
from .._names import normalize
from .._values import clean_text, short_repr

__all__ = ["Copies", "LookAlikeError", "dist_key"]


class LookAlikeError(PluginLoadError):
    """An entry point not loaded because two distributions on ``sys.path`` share its normalized name."""

    def __init__(self, distribution: str | None, entry_point: str, why: str, version: str | None = None) -> None:
        super().__init__(distribution, entry_point, why, version)
        # the whole reason: both folders and what to do, where PluginLoadError cuts a cause to 480 characters
        self.detail = clean_text(why, 4000)
        self.message = f"Plugin entry point {short_repr(entry_point, 240)} is not loaded: {self.detail}."
        self.args = (self.message,)


def dist_key(name: str) -> str:
    """The name two copies of one distribution share (``Optcore_Lion``, ``optcore.lion``: ``optcorelion``)."""
    return normalize(name.replace(".", "-"))


class Copies:
    """The copies of each distribution name, in the order they were found."""

    def __init__(self) -> None:
        # key: (name as spelt, version, folder, the optcore entry points it declares)
        self._found: dict[str, list[tuple[str, str | None, str, frozenset[tuple[str, str, str]]]]] = {}

    def seen_before(self, name: str, version: str | None, where: str,
                    declares: frozenset[tuple[str, str, str]] = frozenset()) -> bool:
        """Records ``name`` found at ``where``, declaring the ``(group, name, value)``
        entry points ``declares``; whether a copy of that name was found before."""
        copies = self._found.setdefault(dist_key(name), [])
        if copies and any(os.path.realpath(c[2]) == os.path.realpath(where) for c in copies):
            return True  # that folder again, through another sys.path entry
        copies.append((name, version, where, declares))
        return len(copies) > 1

    def clashes(self) -> dict[str, str]:
        """For each name found in more than one place (by :func:`dist_key`), why it is not loaded.

        ``pip install -e`` of a setuptools project leaves two records of one
        distribution: its ``.dist-info`` in site-packages, whose
        ``direct_url.json`` names the project folder as editable, and the
        ``.egg-info`` setuptools writes inside that folder, which the editable
        ``.pth`` puts on ``sys.path``. A copy inside the folder another copy of
        the same name installs as editable is that copy, not a look-alike.

        Copies that declare the same entry points are not ambiguous either (a
        source checkout on ``PYTHONPATH`` beside its installed wheel): an entry
        point names a module that ``sys.path`` finds whichever copy declared
        it, so either copy loads the same code."""
        found = {}
        for key, copies in self._found.items():
            if len(copies) > 1:
                projects = [d for d in (_editable_project(c[2]) for c in copies) if d is not None]
                copies = [c for c in copies if not any(_inside(c[2], d) for d in projects)] or copies[:1]
            if len(copies) > 1 and len({c[3] for c in copies}) > 1:
                found[key] = _why(copies)
        return found


def _editable_project(folder: str) -> str | None:
    """The project folder a ``.dist-info``'s ``direct_url.json`` names as installed editable, or None."""
    import json
    from urllib.parse import unquote, urlparse

    try:
        with open(os.path.join(folder, "direct_url.json"), encoding="utf-8") as fh:
            record = json.loads(fh.read(65536))
    except (OSError, ValueError, RecursionError):
        return None
    if not (isinstance(record, dict) and isinstance(record.get("dir_info"), dict)
            and record["dir_info"].get("editable") is True and isinstance(record.get("url"), str)):
        return None
    url = urlparse(record["url"])
    return os.path.realpath(unquote(url.path)) if url.scheme == "file" and url.path else None


def _inside(folder: str, project: str) -> bool:
    """Whether ``folder`` lies within the folder ``project`` (both resolved)."""
    path = os.path.realpath(folder)
    return path != project and path.startswith(project.rstrip(os.sep) + os.sep)


def _why(copies: list[tuple[str, str | None, str, frozenset[tuple[str, str, str]]]]) -> str:
    shown = " and ".join(f"{name}{f' {version}' if version else ''} at {where}" for name, version, where, _ in copies)
    return (
        f"{len(copies)} distributions on sys.path have one normalized name: {shown}; optcore loads neither. "
        "Uninstall the one you do not use (pip uninstall), or take its folder off PYTHONPATH/sys.path"
    )
