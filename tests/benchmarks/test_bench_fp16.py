"""benchmarks/bench_fp16.py runs end to end at its tiny size, writes the rows
docs/figures.py renders (the timings at this size mean nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_helpers import assert_readme_section_fills, figures, run_bench

pytest.importorskip("optcore_fp16")

KEYS = {"params", "implementation", "best_ms", "x_loop", "x_bound", "x_bound_range", "bound_ms", "add_gbs"}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_bench("bench_fp16.py", tmp_path_factory.mktemp("fp16") / "bench_fp16.json", "--sizes", "tiny",
                     "--rounds", "2", "--steps", "2", "--threads", "1")


def test_tiny_run_writes_rows_the_renderer_renders(data: dict) -> None:
    assert data["command"].startswith("python benchmarks/bench_fp16.py --sizes tiny")
    assert data["rounds"] == 2 and data["threads"] == 1 and len(data["load_average"]) == 2
    assert [row["key"] for row in data["rows"]] == ["baseline", "fp16"]
    for row in data["rows"]:
        assert KEYS <= row.keys()
        low, high = row["x_bound_range"]
        assert 0 < low <= row["x_bound"] <= high and row["best_ms"] > 0 and row["bound_ms"] > 0
    assert data["rows"][0]["x_loop"] == 1.0
    n = data["rows"][0]["params"]
    held = {row["wrapper"]: (row["copies_bytes"] / n, row["state_bytes"] / n) for row in data["memory"]}
    assert held["FP16Optimizer(AdamW)"] == pytest.approx((8.0, 8.0), abs=0.01)
    if "MemoryEfficientFP16Optimizer(Lion)" in held:  # needs optcore-lion
        assert held["MemoryEfficientFP16Optimizer(Lion)"] == pytest.approx((0.0, 4.0), abs=0.01)
    table = figures.render_bench_fp16(data)
    assert table.count("\n| 0.2M | ") == 1 + len(data["rows"]) + len(data["memory"])  # + the bound row
    assert "| 0.2M | FP16Optimizer(AdamW) | 8.00 (" in table
    assert data["command"] in table and "40 B/param" in table


def test_the_readme_has_the_section_the_renderer_fills(data: dict, tmp_path: Path) -> None:
    assert_readme_section_fills("bench-fp16", figures.render_bench_fp16, data, tmp_path)
