"""benchmarks/bench_gpu.py runs end to end on CPU at a tiny size and reports every row.

The timings at this size mean nothing; what is checked is that every optimizer
and every installed peer builds, steps and lands in the table and the JSON, so
the script is ready for a GPU run.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_gpu.py"

# group -> rows that must be there on CPU, with the package each needs (None: torch or optcore's own)
EXPECTED = {
    "Lion": {
        "optcore-lion:Lion": "optcore_lion",
        "lion_pytorch.Lion": "lion_pytorch",
        "optimi.Lion foreach=True": "optimi",
        "pytorch_optimizer.Lion foreach=True": "pytorch_optimizer",
        "torch.optim.AdamW fused=True": None,
    },
    "Adafactor": {
        "optcore-adafactor:Adafactor": "optcore_adafactor",
        "transformers Adafactor": "transformers",
        "pytorch_optimizer.AdaFactor": "pytorch_optimizer",
        "torch.optim.Adafactor foreach=True": None,
        "torch.optim.AdamW fused=True": None,
    },
    "FP16Optimizer": {
        "optcore-fp16:FP16Optimizer(AdamW fused)": "optcore_fp16",
        "fp32 master by hand + AdamW fused (no scale, no inf check)": None,
        "torch.amp.GradScaler + AdamW fused (fp32 params)": None,
        "torch.optim.AdamW fused=True": None,
    },
    "AdaScaleSGD": {
        "optcore-adascale:AdaScaleSGD(momentum=0.9)": "optcore_adascale",
        "fairscale AdaScale(SGD momentum=0.9)": "fairscale",
        "torch.optim.SGD(momentum=0.9) fused=True": None,
        "torch.optim.SGD(momentum=0.9) foreach=True": None,
        "torch.optim.AdamW fused=True": None,
    },
}
CUDA_ONLY = {"lion_pytorch.Lion use_triton=True", "optimi.Lion triton=True"}


@pytest.mark.slow
def test_bench_gpu_runs_on_cpu_and_reports_every_row(tmp_path: Path) -> None:
    out = tmp_path / "bench_gpu.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--params", "1e5", "--d-model", "64",
         "--rounds", "2", "--steps", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    table = [line for line in proc.stdout.splitlines() if line.startswith("| ") and not line.startswith("| group")]
    rows = {(r["group"], r["implementation"]): r for r in result["rows"]}
    present = 0
    for group, expected in EXPECTED.items():
        for name, package in expected.items():
            if package is not None and importlib.util.find_spec(package) is None:
                continue  # a peer that is not installed is left out by design
            present += 1
            assert (group, name) in rows, f"{group} / {name} missing; skipped: {result['skipped']}"
            row = rows[(group, name)]
            assert row["ms_per_step"] > 0 and math.isfinite(row["x_bound"]) and math.isfinite(row["x_fused_adamw"])
            assert any(f"| {group} |" in line and name in line for line in table), f"{group} / {name} not printed"
        assert result["stream_bandwidth"][group] > 0
    assert not result["skipped"], result["skipped"]
    assert not CUDA_ONLY & {name for _, name in rows}  # Triton rows only on CUDA
    assert len(table) == len(rows) == present
    assert rows[("Lion", "torch.optim.AdamW fused=True")]["x_fused_adamw"] == pytest.approx(1.0)
    assert result["params"] > 0 and result["device"] == "cpu"
