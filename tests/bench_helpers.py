"""What the bench tests share: docs/figures.py as a module, one run of a
benchmark at its tiny size, and the check that its README section fills from
the rows it wrote (the timings at that size mean nothing)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load_figures():
    if "figures" in sys.modules:
        return sys.modules["figures"]
    spec = importlib.util.spec_from_file_location("figures", ROOT / "docs" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["figures"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


figures = _load_figures()


def run_bench(script: str, out: Path, *args: str) -> dict:
    """``benchmarks/<script> *args --json out`` in a subprocess; its results."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args, "--json", str(out)],
        check=False, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())


def assert_readme_section_fills(name: str, render, data: dict, tmp_path: Path) -> None:
    """The figure ``name`` renders with ``render`` from ``data`` into a copy of its page."""
    (figure,) = [f for f in figures.FIGURES if f.name == name]
    results_name = f"{name.replace('-', '_')}.json"
    assert figure.render is render and figure.results.name == results_name
    assert f"--json docs/results/{results_name}" in figure.command
    page, results = tmp_path / "README.md", tmp_path / results_name
    page.write_text(figure.page.read_text())
    results.write_text(json.dumps(data))
    copy = figures.Figure(figure.name, page, results, figure.command, figure.render)
    figures.write(copy)
    assert figures.current(copy) == figures.expected(copy) and data["command"] in page.read_text()
