"""benchmarks/bench_adascale.py runs end to end at its tiny size, writes the rows
docs/figures.py renders (the timings at this size mean nothing)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("optcore_adascale")
ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("figures", ROOT / "docs" / "figures.py")
figures = importlib.util.module_from_spec(spec)
sys.modules["figures"] = figures  # dataclasses look their module up
spec.loader.exec_module(figures)

KEYS = {"params", "tensors", "step_ms", "sgd_step_ms", "step_ratio", "step_x_bound", "step_x_bound_range",
        "hooks_ms", "hooks_bound_ms", "hooks_x_bound", "hooks_x_bound_range", "iteration_ms", "sgd_iteration_ms",
        "iteration_ratio", "add_gbs"}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("adascale") / "bench_adascale.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_adascale.py"), "--sizes", "tiny", "--rounds", "2",
         "--reps", "2", "--threads", "1", "--json", str(out)],
        check=False, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())


def test_tiny_run_writes_rows_the_renderer_renders(data: dict) -> None:
    assert data["command"].startswith("python benchmarks/bench_adascale.py --sizes tiny")
    assert (data["rounds"], data["reps"], data["threads"], data["clock"]) == (2, 2, 1, "wall")
    (row,) = data["rows"]
    assert KEYS <= row.keys()
    for key in ("step_x_bound", "hooks_x_bound"):
        low, high = row[f"{key}_range"]
        assert 0 <= low <= row[key] <= high
    assert row["step_ratio"] == pytest.approx(row["step_ms"] / row["sgd_step_ms"])
    assert row["hooks_bound_ms"] == pytest.approx(row["step_bound_ms"] / 5)  # 4 B vs 20 B per parameter
    table = figures.render_bench_adascale(data)
    assert "\n| 0.2M (64 tensors) | " in table and data["command"] in table


def test_the_readme_has_the_section_the_renderer_fills(data: dict, tmp_path: Path) -> None:
    (figure,) = [f for f in figures.FIGURES if f.name == "bench-adascale"]
    assert figure.render is figures.render_bench_adascale and figure.results.name == "bench_adascale.json"
    assert "--json docs/results/bench_adascale.json" in figure.command
    page, results = tmp_path / "README.md", tmp_path / "bench_adascale.json"
    page.write_text(figure.page.read_text())
    results.write_text(json.dumps(data))
    copy = figures.Figure(figure.name, page, results, figure.command, figure.render)
    figures.write(copy)
    assert figures.current(copy) == figures.expected(copy) and data["command"] in page.read_text()
