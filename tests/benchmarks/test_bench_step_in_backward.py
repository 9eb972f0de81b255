"""The step-in-backward memory benchmark runs end to end (its figure is the benchmark's, not a test's)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_step_in_backward  # noqa: E402


def test_the_benchmark_runs_both_loops() -> None:
    result = bench_step_in_backward.main(["--size", "300K", "--width", "128"])
    assert set(result) == {"ordinary", "step_in_backward", "ratio", "saved_over_gradients"}
    assert result["ordinary"]["params_bytes"] == result["step_in_backward"]["params_bytes"] > 0
