"""benchmarks/bench_adafactor.py runs at a tiny size in both modes, and its
floor is the two passes it says it is (the timings at this size mean nothing)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("optcore_adafactor")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_adafactor  # noqa: E402
from common import StreamProbe  # noqa: E402


def test_floor_is_one_read_pass_and_one_add_pass() -> None:
    n, add, read = 1000, 12e9, 4e9
    assert bench_adafactor.floor_seconds(n, None, add, read) == pytest.approx(4 * n / read + 12 * n / add)
    assert bench_adafactor.floor_seconds(n, 0.9, add, read) == pytest.approx(4 * n / read + 20 * n / add)


def test_both_probes_sample_a_positive_rate() -> None:
    for kind in ("add", "read"):
        probe = StreamProbe(numel=1 << 16, kind=kind)
        assert probe() > 0 and probe.median() == probe.best() == probe.samples[0]
    with pytest.raises(ValueError, match="kind must be"):
        StreamProbe(numel=8, kind="copy")


@pytest.mark.parametrize("mode", ["relative", "manual"])
def test_bench_prints_every_implementation_with_its_ratios(mode: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    monkeypatch.setattr(bench_adafactor, "OURS", ["c", "torch"])
    monkeypatch.setitem(bench_adafactor.PEERS, "enabled", False)
    bench_adafactor.bench(2e5, 64, rounds=2, steps=1, beta1=None, device="cpu", mode=mode)
    out = capsys.readouterr().out
    assert f"{mode} mode" in out and "Adafactor's floor" in out
    rows = [line for line in out.splitlines() if line.startswith("| optcore") or line.startswith("| transformers")]
    assert {r.split("|")[1].strip() for r in rows} == {
        "optcore_adafactor (c)", "optcore_adafactor (torch)", "transformers Adafactor",
    }
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1]) > 0 and float(cells[2]) > 0 and float(cells[4]) > 0
