"""Shared fixtures: a tiny model, and a fake plugin distribution on sys.path."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch


@pytest.fixture
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


@pytest.fixture
def fake_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Install fake plugin distributions (a package + .dist-info with entry points)
    into a temporary sys.path entry; yields a function ``add(dist, module_source, entry_points)``."""
    import optcore._plugins as plugins

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("OPTCORE_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("OPTCORE_PLUGINS", raising=False)
    added: list[str] = []

    def add(dist: str, module: str, source: str, entry_points: dict[str, dict[str, str]], version: str = "1.0") -> None:
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        info = tmp_path / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        lines = []
        for group, eps in entry_points.items():
            lines.append(f"[{group}]")
            lines += [f"{name} = {value}" for name, value in eps.items()]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        added.append(module)
        plugins.refresh()

    yield add
    for module in added:
        sys.modules.pop(module, None)
    plugins.refresh()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist's ``--dist loadgroup`` (scripts/dev test): the tests of a file
    that share something wider than one test (a module- or session-scoped fixture of
    the suite's own, such as a spawned process group or a database server, or the
    results a ``distributed`` module keeps between its tests) run on one worker, so
    it is made once; every other test goes wherever a worker is free."""
    if not config.pluginmanager.hasplugin("xdist"):  # the marker is pytest-xdist's
        return
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        shared = info is not None and any(
            defs and defs[-1].scope != "function" and defs[-1].baseid  # pytest's own (tmp_path_factory) have no baseid
            for defs in info.name2fixturedefs.values()
        )
        if shared or item.get_closest_marker("distributed") is not None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
