"""The ``optcore_wrap_optimizer`` hook: the shorthand precision keys.

``{"type": "AdamW", "lr": 3e-4, "precision": "fp16", "memory_efficient": false,
"loss_scaler": {...}}`` — the core strips the three keys, builds AdamW, and
asks its hook plugins to wrap the result; this one answers for fp16/bf16.
"""

from __future__ import annotations

from typing import Any

import torch

from optcore import ConfigError, hookimpl, validate_hparams

from .fp16_optimizer import FP16Optimizer
from .memory_efficient import MemoryEfficientFP16Optimizer
from .schemas import PrecisionOptions


@hookimpl
def optcore_wrap_optimizer(optimizer: torch.optim.Optimizer, options: dict[str, Any]) -> torch.optim.Optimizer | None:
    """FP16Optimizer (or MemoryEfficientFP16Optimizer with ``memory_efficient``)
    around ``optimizer`` for ``precision`` fp16/bf16; ``None`` for fp32 or none."""
    given = {k: v for k, v in options.items() if v is not None}
    name = type(optimizer).__name__
    opts = validate_hparams(PrecisionOptions, given, f"{name} (precision options)")
    precision = opts["precision"]
    if precision in (None, "fp32"):
        stray = [k for k in ("memory_efficient", "loss_scaler") if given.get(k) not in (None, False)]
        if stray:
            raise ConfigError(
                f"{name}: {' and '.join(stray)} only apply to half-precision training; add "
                "precision='fp16' (or 'bf16'), or remove them.",
                problems=[(k, "needs precision fp16 or bf16") for k in stray],
                target=name,
            )
        return None
    wrapper = MemoryEfficientFP16Optimizer if opts["memory_efficient"] else FP16Optimizer
    return wrapper(optimizer, loss_scaler=opts["loss_scaler"], precision=precision)
