"""Entry-point discovery: read once, cache, load only what is asked for.

Reading the metadata imports nothing; a plugin's module is imported when one
of its names is built or described, and any failure then (``SystemExit`` and
other ``BaseException`` included, ``KeyboardInterrupt`` excepted) becomes a
:class:`PluginLoadError` for that name alone.

Distributions are read in ``sys.path`` order and, within one path entry, in
sorted order, so that two plugins declaring one name resolve the same way on
every machine (the other is reported as shadowed). As with
``importlib.metadata``, the first distribution of a name on ``sys.path``
wins, and an entry point is listed once.

Why not ``importlib.metadata``: the first look-up of a group in a fresh
process, after ``import torch, optcore`` (torch imports importlib.metadata
already), with 50 extra fake distributions on ``sys.path`` (156 in all, 10
fakes with optcore entry points), median of 7, routes interleaved, on a
shared 2-core machine at load ~14 (``benchmarks/bench_discovery.py --fakes 50
--runs 7``): this scan 11.3 ms; ``distributions()`` with a
``read_text("entry_points.txt")`` pre-check 21.1 ms; ``entry_points(group=...)``
25.1 ms (79.6 ms for the three optcore groups); ``entry_points()`` once, then
``select`` 31.4 ms. At load ~1 the same run gave 3.4 ms for this scan and
7.1 ms for ``distributions()`` + pre-check, but that route must read each
plugin's name and version from its parsed METADATA (this scan takes them from
the ``.dist-info`` directory's name): with all 50 extra distributions
declaring optcore entry points (``benchmarks/bench_core.py``'s plugin
resolution), the first look-up took 37-42 ms on it against 9-10 ms with this
scan. The standard route costs more than the ~5 ms we would pay to be on it,
so the scan stays. Path
entries that are missing (``python311.zip``) are skipped rather than handed
to importlib.metadata, so a process without torch need not import it (55-100
ms at that load).

``OPTCORE_DISABLE_PLUGIN_AUTOLOAD=1`` turns discovery off; ``OPTCORE_PLUGINS``
(comma-separated distribution or entry-point names) keeps only those.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._errors import PluginLoadError
from ._names import normalize

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

    @property
    def module(self) -> str:
        return self.value.partition(":")[0].strip()

    def load(self, validate: Callable[[Any], None] | None = None) -> Any:
        """Import the entry point's object and check it with ``validate``, or
        raise :class:`PluginLoadError`."""
        from importlib.metadata import EntryPoint  # lazily: listing needs no importlib.metadata

        try:
            obj = EntryPoint(self.name, self.value, self.group).load()
            if validate is not None:
                validate(obj)
            return obj
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # any failure inside a plugin is the plugin's, sys.exit() too
            raise PluginLoadError(self.distribution, f"{self.group}:{self.name} = {self.value}", exc, self.version) from exc

    def loader(self, validate: Callable[[Any], None] | None = None) -> Callable[[], Any]:
        """A memoised zero-argument loader (specs call it on first use, under their lock)."""
        return functools.cache(functools.partial(self.load, validate))


def autoload_disabled() -> bool:
    return os.environ.get("OPTCORE_DISABLE_PLUGIN_AUTOLOAD", "").strip().lower() not in {"", "0", "false", "no"}


def _allowed() -> frozenset[str] | None:
    raw = os.environ.get("OPTCORE_PLUGINS", "")
    return frozenset(normalize(part) for part in raw.split(",") if part.strip()) if raw.strip() else None


def _metadata_header(info_dir: str) -> tuple[str | None, str | None]:
    """Name and Version from a .dist-info/METADATA or .egg-info/PKG-INFO header."""
    name = version = None
    for fname in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(info_dir, fname), encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if not line.strip():
                        break  # end of the header
                    key, _, value = line.partition(":")
                    if key == "Name":
                        name = value.strip()
                    elif key == "Version":
                        version = value.strip()
                    if name and version:
                        break
            return name, version
        except OSError:
            continue
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
    """Every ``optcore.*`` entry point of the distributions on ``path``.

    Each ``entry_points.txt`` is read as text and only the files that mention
    an ``optcore.`` group are parsed, which is what makes the first look-up in
    a process cheap (see the module docstring). Path entries that are files
    (zipped eggs) go through ``importlib.metadata``.
    """
    found: dict[str, list[PluginEntry]] = {}
    seen: set[str] = set()
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
            # "{name}-{version}.dist-info" (name normalised with "_"): the
            # canonical project name and version, without opening METADATA.
            stem = fname.rsplit(".", 1)[0]
            dist, _, rest = stem.partition("-")
            version = rest.split("-")[0] or None
            if not dist or not version:
                dist, version = _metadata_header(info_dir)
                dist = dist or stem
            dist = dist.replace("_", "-").replace(".", "-").lower()
            if normalize(dist) in seen:
                continue
            seen.add(normalize(dist))
            for group, items in _parse_entry_points(text).items():
                if group.startswith("optcore."):
                    found.setdefault(group, []).extend(PluginEntry(n, v, group, dist, version) for n, v in items)
    return {group: tuple(items) for group, items in found.items()}


def _scan_with_metadata(entry: str, found: dict[str, list[PluginEntry]], seen: set[str]) -> None:
    from importlib import metadata

    for dist in sorted(metadata.distributions(path=[entry]), key=lambda d: normalize(d.metadata["Name"] or "")):
        name = dist.metadata["Name"]
        if normalize(name or "") in seen:
            continue
        seen.add(normalize(name or ""))
        for ep in dist.entry_points:
            if ep.group.startswith("optcore."):
                found.setdefault(ep.group, []).append(PluginEntry(ep.name, ep.value, ep.group, name, dist.version))


@functools.lru_cache(maxsize=None)
def _discover(group: str, allowed: frozenset[str] | None, path: tuple[str, ...]) -> tuple[PluginEntry, ...]:
    entries: dict[tuple[str | None, str], PluginEntry] = {}
    for e in _scan(path).get(group, ()):
        if allowed is None or normalize(e.name) in allowed or normalize(e.distribution or "") in allowed:
            entries.setdefault((e.distribution, e.name), e)  # an entry point is listed once
    return tuple(entries.values())


def entry_points(group: str) -> tuple[PluginEntry, ...]:
    """The entry points of ``group`` (cached per ``sys.path``; honours the
    environment switches)."""
    return () if autoload_disabled() else _discover(group, _allowed(), tuple(sys.path))


def refresh() -> None:
    """Forget cached metadata (after installing a plugin in a running process);
    the hook manager sees new entry points and rebuilds itself."""
    _discover.cache_clear()
    _scan.cache_clear()
