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
