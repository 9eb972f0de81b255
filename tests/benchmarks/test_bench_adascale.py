"""benchmarks/bench_adascale.py runs end to end at its tiny size, writes the rows
docs/figures.py renders (the timings at this size mean nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_helpers import assert_readme_section_fills, figures, run_bench

pytest.importorskip("optcore_adascale")

KEYS = {"params", "tensors", "step_ms", "sgd_step_ms", "step_ratio", "step_x_bound", "step_x_bound_range",
        "hooks_ms", "hooks_bound_ms", "hooks_x_bound", "hooks_x_bound_range", "iteration_ms", "sgd_iteration_ms",
        "iteration_ratio", "add_gbs"}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_bench("bench_adascale.py", tmp_path_factory.mktemp("adascale") / "bench_adascale.json", "--sizes",
                     "tiny", "--rounds", "2", "--reps", "2", "--threads", "1")


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
    assert_readme_section_fills("bench-adascale", figures.render_bench_adascale, data, tmp_path)
