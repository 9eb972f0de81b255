"""Entry-point discovery: read once, cache, load only what is asked for.

Reading the metadata imports nothing; any failure of a plugin's import
(``SystemExit`` included, ``KeyboardInterrupt`` excepted) is a
:class:`PluginLoadError` for that name alone. Distributions are read in
``sys.path`` order, sorted within a path entry, so a name two plugins declare
resolves the same way on every machine. A distribution found twice under one
normalized name (:mod:`optcore.distributions`) is a look-alike: its entry
points carry the ``clash`` that names both copies, and none of them loads.

Why a scan and not ``importlib.metadata``: the first look-up in a process
with 50 extra distributions (``python benchmarks/bench_discovery.py --fakes 50``,
162 installed, median of 5 fresh processes, 2026-12-02) takes 2.3-2.6 ms with
this scan (names and versions from the ``.dist-info`` directory's name) against
5.3-6.7 ms on the cheapest standard route (``distributions()`` with a text
pre-check when 10 of the 50 declare optcore entry points, ``entry_points()``
once when all 50 do): over issue 10's ~5 ms bar, by little.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._errors import PluginLoadError
from ._names import normalize
from .distributions import Copies, LookAlikeError, dist_key

OPTIMIZERS_GROUP = "optcore.optimizers"
SCHEDULERS_GROUP = "optcore.schedulers"
HOOKS_GROUP = "optcore.hooks"



@dataclass(frozen=True)
class PluginEntry:
    """One entry point, as metadata: nothing imported yet."""

    name: str
    value: str  # "module:attr"
    group: str
    distribution: str | None
    version: str | None
    clash: str | None = None  # why it does not load: another distribution has the same normalized name

    @property
    def module(self) -> str:
        return self.value.partition(":")[0].strip()

    def load(self, validate: Callable[[Any], None] | None = None) -> Any:
        """The entry point's object, checked with ``validate``, or :class:`PluginLoadError`."""
        from importlib.metadata import EntryPoint  # lazily: listing needs no importlib.metadata

        if self.clash is not None:
            raise LookAlikeError(self.distribution, f"{self.group}:{self.name} = {self.value}", self.clash, self.version)
        try:
            obj = EntryPoint(self.name, self.value, self.group).load()
            if validate is not None:
                validate(obj)
            return obj
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # any failure inside a plugin is the plugin's, sys.exit() too
            raise PluginLoadError(self.distribution, f"{self.group}:{self.name} = {self.value}", exc, self.version) from exc


def _metadata_header(info_dir: str) -> tuple[str | None, str | None]:
    """Name and Version from a .dist-info/METADATA or .egg-info/PKG-INFO header
    (read by hand: ``email.parser`` would cost ~18 ms of imports)."""
    name = version = None
    for fname in ("METADATA", "PKG-INFO"):
        with contextlib.suppress(OSError), open(os.path.join(info_dir, fname), encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip() or (name and version):
                    break  # the end of the header, or all we need
                key, _, value = line.partition(":")
                if key in ("Name", "Version"):
                    name, version = (value.strip(), version) if key == "Name" else (name, value.strip())
            return name, version
    return name, version


def _parse_entry_points(text: str) -> dict[str, list[tuple[str, str]]]:
    groups: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = groups.setdefault(line[1:-1].strip(), [])
        elif current is not None and "=" in line:
            name, _, value = line.partition("=")
            current.append((name.strip(), value.strip()))
    return groups


@functools.lru_cache(maxsize=4)
def _scan(path: tuple[str, ...]) -> dict[str, tuple[PluginEntry, ...]]:
    """Every ``optcore.*`` entry point of the distributions on ``path``: only
    the ``entry_points.txt`` files that mention an ``optcore.`` group are parsed."""
    found: dict[str, list[PluginEntry]] = {}
    seen = Copies()
    for entry in path:
        if not os.path.isdir(entry or "."):
            if os.path.isfile(entry):  # a zipped egg or wheel; a missing entry has nothing
                _scan_with_metadata(entry, found, seen)
            continue
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for fname in names:
            if not fname.endswith((".dist-info", ".egg-info")):
                continue
            info_dir = os.path.join(entry, fname)
            try:
                with open(os.path.join(info_dir, "entry_points.txt"), encoding="utf-8") as fh:
                    text = fh.read()
            except OSError:
                continue
            if "[optcore." not in text:
                continue
            # "{name}-{version}.dist-info": name and version without opening METADATA
            stem = fname.rsplit(".", 1)[0]
            dist, _, rest = stem.partition("-")
            version = rest.split("-")[0] or None
            if not dist or not version:
                dist, version = _metadata_header(info_dir)
                dist = dist or stem
            declared = {g: items for g, items in _parse_entry_points(text).items() if g.startswith("optcore.")}
            if seen.seen_before(dist, version, info_dir, _declares(declared)):
                continue
            dist = dist.replace("_", "-").replace(".", "-").lower()
            for group, items in declared.items():
                found.setdefault(group, []).extend(PluginEntry(n, v, group, dist, version) for n, v in items)
    clash = seen.clashes()
    return {g: tuple(dataclasses.replace(e, clash=clash.get(dist_key(e.distribution or ""))) for e in items)
            for g, items in found.items()}


def _declares(groups: dict[str, list[tuple[str, str]]]) -> frozenset[tuple[str, str, str]]:
    """``(group, name, value)`` of each entry point, as :class:`~optcore.distributions.Copies` compares copies."""
    return frozenset((group, name, value.strip()) for group, items in groups.items() for name, value in items)


def _scan_with_metadata(entry: str, found: dict[str, list[PluginEntry]], seen: Copies) -> None:
    from importlib import metadata

    for dist in sorted(metadata.distributions(path=[entry]), key=lambda d: normalize(d.metadata["Name"] or "")):
        name = dist.metadata["Name"]
        points = [ep for ep in dist.entry_points if ep.group.startswith("optcore.")]
        if seen.seen_before(name or "", dist.version, entry, frozenset((ep.group, ep.name, ep.value) for ep in points)):
            continue
        for ep in points:
            found.setdefault(ep.group, []).append(PluginEntry(ep.name, ep.value, ep.group, name, dist.version))


@functools.lru_cache(maxsize=None)
def _discover(group: str, allowed: frozenset[str] | None, path: tuple[str, ...]) -> tuple[PluginEntry, ...]:
    entries: dict[tuple[str | None, str], PluginEntry] = {}
    for e in _scan(path).get(group, ()):
        if allowed is None or normalize(e.name) in allowed or normalize(e.distribution or "") in allowed:
            entries.setdefault((e.distribution, e.name), e)  # an entry point is listed once
    return tuple(entries.values())


def _switches() -> tuple[bool, frozenset[str] | None]:
    """(discovery off, the names ``OPTCORE_PLUGINS`` allows or ``None`` for all)."""
    off = os.environ.get("OPTCORE_DISABLE_PLUGIN_AUTOLOAD", "").strip().lower() not in {"", "0", "false", "no"}
    raw = os.environ.get("OPTCORE_PLUGINS", "")
    return off, frozenset(normalize(part) for part in raw.split(",") if part.strip()) if raw.strip() else None


def entry_points(group: str) -> tuple[PluginEntry, ...]:
    """The entry points of ``group`` (cached per ``sys.path``; honours the
    environment switches)."""
    off, allowed = _switches()
    return () if off else _discover(group, allowed, tuple(sys.path))


def switches_note() -> str | None:
    """The environment switch that narrows discovery, for a "looked in" message."""
    off, allowed = _switches()
    if off:
        return "no plugin: OPTCORE_DISABLE_PLUGIN_AUTOLOAD is set"
    return None if allowed is None else f"only the plugins OPTCORE_PLUGINS={os.environ['OPTCORE_PLUGINS']!r} names"


def declared(distribution: str, group: str) -> list[str]:
    """The names of the installed ``distribution``'s entry points in ``group``, in use or not."""
    key = normalize(distribution)
    return [e.name for e in _scan(tuple(sys.path)).get(group, ()) if normalize(e.distribution or "") == key]


def switched_off(distribution: str, group: str) -> str | None:
    """Why the installed ``distribution``'s entry points in ``group`` are not in
    use (the environment switch that leaves them out), or ``None``: in use, or none installed."""
    key, mine = normalize(distribution), declared(distribution, group)
    off, allowed = _switches()
    if mine and off:
        return "OPTCORE_DISABLE_PLUGIN_AUTOLOAD is set, which turns plugin discovery off: unset it"
    if mine and allowed is not None and key not in allowed and all(normalize(n) not in allowed for n in mine):
        return f"OPTCORE_PLUGINS={os.environ['OPTCORE_PLUGINS']!r} leaves out its {group} entry points: add {distribution} to it"
    return None


def clashes() -> list[str]:
    """Why each plugin distribution that has a look-alike does not load (for ``optcore list``)."""
    found = () if _switches()[0] else _scan(tuple(sys.path)).values()
    return sorted({e.clash for items in found for e in items if e.clash is not None})


def refresh() -> None:
    """Forget cached metadata (after installing a plugin in a running process);
    the hook manager sees new entry points and rebuilds itself."""
    _discover.cache_clear()
    _scan.cache_clear()
