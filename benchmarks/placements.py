"""The support table of docs/distributed.md: every shipped optimizer, and
torch's, under every placement of optcore's kit (``optcore.testing.check_placements``).

    python benchmarks/placements.py                                        # print the table
    python benchmarks/placements.py --json docs/results/placements.json    # the figure (docs/figures.py renders it)

Each row runs at least 12 steps on spawned gloo ranks (CPU): DDP, FSDP2 on 2,
3 and 4 ranks, HSDP on a 2x2 mesh, ``optcore.distributed.zero_redundancy``,
DeepSpeed ZeRO-1/2/3 and DCP resumes across world sizes (2->1, 1->2, 2->3,
3->2, 4->1), each compared with one process on the full batch. The table
records each cell's outcome (equal, refused, differs, crashed) and its largest
difference from one process as a multiple of the row's one-process noise;
``tests/distributed/test_placements.py`` runs the same rows on a slice of the
placements and fails when an outcome differs from the committed results.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from optcore.testing import PlacementCase, check_placements


class UserSGD(torch.optim.SGD):
    """A user's class optcore knows nothing about (its sharding is 'unknown')."""


FP16_SCALER = {"init_scale": 2.0**10, "scale_window": 1000}

#: row -> what the kit runs (optimizers of plugins that are not installed are refused by the kit's one process)
CASES: dict[str, Any] = {
    "AdamW": {"type": "AdamW", "lr": 1e-2, "weight_decay": 0.1},
    "Adam": {"type": "Adam", "lr": 1e-2},
    "SGD (momentum)": {"type": "SGD", "lr": 0.1, "momentum": 0.9},
    "RMSprop": {"type": "RMSprop", "lr": 1e-2},
    "Adagrad": {"type": "Adagrad", "lr": 0.1},
    "torch:Adafactor": {"type": "torch:Adafactor", "lr": 1e-2},
    "torch:Muon + AdamW": {"type": "torch:Muon", "lr": 0.02, "fallback": {"type": "AdamW", "lr": 1e-2}},
    "torch:Muon + AdamW, bf16 (optcore-fp16)": PlacementCase(
        {"type": "torch:Muon", "lr": 0.02, "fallback": {"type": "AdamW", "lr": 1e-2}, "precision": "bf16"},
        dtype="bfloat16",
    ),
    "torch:Muon + AdamW, fp16 (optcore-fp16)": PlacementCase(
        {"type": "torch:Muon", "lr": 0.02, "fallback": {"type": "AdamW", "lr": 1e-2}, "precision": "fp16",
         "loss_scaler": FP16_SCALER},
        dtype="float16",
    ),
    "a user's SGD subclass": {"type": UserSGD, "lr": 0.1, "momentum": 0.9},
    "Lion (optcore-lion)": {"type": "optcore-lion:Lion", "lr": 1e-3, "weight_decay": 0.1},
    "Adafactor (optcore-adafactor)": {"type": "optcore-adafactor:Adafactor", "weight_decay": 0.01},
    "AdaScaleSGD (optcore-adascale)": PlacementCase(
        {"type": "optcore-adascale:AdaScaleSGD", "lr": 0.1, "momentum": 0.9},
        reference_config=lambda world: {"type": "optcore-adascale:AdaScaleSGD", "lr": 0.1, "momentum": 0.9,
                                        "num_gradients_to_accumulate": world},
        micro_batches="world",  # one process: each rank's share as one accumulated backward pass
    ),
    "FP16Optimizer(AdamW) (optcore-fp16)": PlacementCase(
        {"type": "optcore-fp16:FP16Optimizer", "optimizer": {"type": "torch:AdamW", "lr": 1e-2},
         "loss_scaler": FP16_SCALER},
        dtype="float16",
    ),
    "MemoryEfficientFP16Optimizer(Lion) (optcore-fp16)": PlacementCase(
        {"type": "optcore-fp16:MemoryEfficientFP16Optimizer", "optimizer": {"type": "optcore-lion:Lion", "lr": 1e-3},
         "loss_scaler": FP16_SCALER},
        dtype="float16",
    ),
}

COMMAND = "python benchmarks/placements.py --json docs/results/placements.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    import placements  # this file by its module name: the spawned ranks unpickle placements.UserSGD, not __main__'s

    report = check_placements(placements.CASES)
    seconds = time.perf_counter() - start
    print(report)
    print(f"\n{seconds:.1f} s")
    if args.json:
        data = report.to_dict()
        data.update(
            command=COMMAND,
            when=time.strftime("%Y-%m-%d", time.gmtime()),
            machine=f"{platform.machine()} CPU, {os.cpu_count()} cores, {platform.system()}, "
            f"Python {platform.python_version()}",
            seconds=round(seconds, 1),
        )
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
