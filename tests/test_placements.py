"""Every shipped optimizer, and torch's, under every placement of the kit
(optcore.testing.check_placements): DDP, FSDP2, torch ZeRO, DeepSpeed ZeRO-1/2
and DCP resume across world sizes, each against one process on the full batch.

One 2-rank gloo group runs the whole table once per session. A cell may be
``equal`` or ``refused`` (a ConfigError naming why); ``differs`` and ``crashed``
are bugs, allowed only where :data:`KNOWN` names them with the reason and the
work that removes them: that list only shrinks.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import optcore
from optcore.testing import PlacementCase, check_placements

pytestmark = pytest.mark.distributed


class UserSGD(torch.optim.SGD):
    """A user's class optcore knows nothing about (sharding 'unknown')."""


FP16_INNER = {"type": "torch:AdamW", "lr": 1e-2}
SCALER = {"init_scale": 2.0**10, "scale_window": 1000}

#: row name -> what the kit runs; plugins' rows need the plugin installed
CASES: dict[str, Any] = {
    "AdamW": {"type": "AdamW", "lr": 1e-2, "weight_decay": 0.1},
    "Adam": {"type": "Adam", "lr": 1e-2},
    "SGD": {"type": "SGD", "lr": 0.1, "momentum": 0.9},
    "RMSprop": {"type": "RMSprop", "lr": 1e-2},
    "Adagrad": {"type": "Adagrad", "lr": 0.1},
    "torch:Adafactor": {"type": "torch:Adafactor", "lr": 1e-2},
    "Muon+AdamW": {"type": "torch:Muon", "lr": 0.02, "fallback": {"type": "AdamW", "lr": 1e-2}},
    "UserSGD": {"type": UserSGD, "lr": 0.1, "momentum": 0.9},
    "Lion": {"type": "optcore-lion:Lion", "lr": 1e-3, "weight_decay": 0.1},
    "Adafactor": {"type": "optcore-adafactor:Adafactor", "weight_decay": 0.01},
    "AdaScaleSGD": PlacementCase(
        {"type": "optcore-adascale:AdaScaleSGD", "lr": 0.1, "momentum": 0.9},
        reference_config={"type": "optcore-adascale:AdaScaleSGD", "lr": 0.1, "momentum": 0.9,
                          "num_gradients_to_accumulate": 2},
        micro_batches=2,  # one process: the two ranks' halves as two accumulated backward passes
    ),
    "FP16Optimizer": PlacementCase(
        {"type": "optcore-fp16:FP16Optimizer", "optimizer": FP16_INNER, "loss_scaler": SCALER},
        dtype="float16", atol=2e-3,
    ),
    "MemoryEfficientFP16Optimizer": PlacementCase(
        {"type": "optcore-fp16:MemoryEfficientFP16Optimizer", "optimizer": {"type": "optcore-lion:Lion", "lr": 1e-3},
         "loss_scaler": SCALER},
        dtype="float16", atol=2e-3,
    ),
}
