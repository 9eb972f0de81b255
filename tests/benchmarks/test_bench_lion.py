"""benchmarks/bench_lion.py runs end to end at its tiny size, writes the rows
docs/figures.py renders (the timings at this size mean nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_helpers import assert_readme_section_fills, figures, run_bench

pytest.importorskip("optcore_lion")

KEYS = {"params", "implementation", "best_ms", "x_bound", "x_bound_range", "x_kernel", "x_best_peer", "first_ms",
        "bound_ms", "add_gbs"}


def lion(tmp_path: Path, *args: str) -> dict:
    return run_bench("bench_lion.py", tmp_path / "bench_lion.json", "--sizes", "tiny", "--rounds", "2", "--threads", "1",
                     "--no-compiled", *args)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return lion(tmp_path_factory.mktemp("lion"))


def test_tiny_run_writes_rows_the_renderer_renders(data: dict) -> None:
    assert data["command"].startswith("python benchmarks/bench_lion.py --sizes tiny")
    assert data["rounds"] == 2 and data["threads"] == 1 and len(data["load_average"]) == 2
    names = {row["implementation"] for row in data["rows"]}
    assert "optcore_lion.Lion (default: one-pass C kernel)" in names
    assert not any("compiled=True" in name for name in names)
    for row in data["rows"]:
        assert KEYS <= row.keys()
        low, high = row["x_bound_range"]
        assert 0 < low <= row["x_bound"] <= high and row["best_ms"] > 0 and row["bound_ms"] > 0
    kernel = next(r for r in data["rows"] if r["implementation"].startswith("optcore_lion.Lion (default"))
    assert kernel["x_kernel"] == 1.0
    table = figures.render_bench_lion(data)
    assert table.count("\n| 0.2M | ") == len(data["rows"])
    assert data["command"] in table and "20 B/param" in table


def test_without_peers_the_peer_column_is_empty(tmp_path: Path) -> None:
    data = lion(tmp_path, "--no-peers")
    assert all(not row["peer"] and row["x_best_peer"] is None for row in data["rows"])
    assert all(line.split("|")[6].strip() == "-" for line in figures.render_bench_lion(data).splitlines()
               if line.startswith("| 0.2M"))


def test_the_readme_has_the_section_the_renderer_fills(data: dict, tmp_path: Path) -> None:
    assert_readme_section_fills("bench-lion", figures.render_bench_lion, data, tmp_path)
