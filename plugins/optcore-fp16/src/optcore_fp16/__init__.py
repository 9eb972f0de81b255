"""optcore-fp16: mixed-precision wrappers for any optimizer optcore builds.

- :class:`FP16Optimizer` — fp32 master copy (flat when the optimizer allows);
- :class:`MemoryEfficientFP16Optimizer` — no master copy, for optimizers that
  step half-precision parameters with fp32 math and state;
- :class:`DynamicLossScaler` — fairseq's dynamic loss scaling (fp16 only).

Both ways in are validated by pydantic schemas: ``{"type": "AdamW",
"precision": "fp16"}`` (rewritten into the second form by the ``optcore_rewrite_config`` hook in
:mod:`optcore_fp16.hooks`) and ``{"type": "FP16Optimizer", "optimizer": {...}}``.
"""

from __future__ import annotations

from ._wrapper import ParamGroupView, PrecisionWrapper
from .fp16_optimizer import FP16Optimizer
from .loss_scaler import DynamicLossScaler, MinimumLossScaleError
from .memory_efficient import MemoryEfficientFP16Optimizer
from .schemas import (
    FP16OptimizerConfig,
    LossScalerConfig,
    MemoryEfficientFP16OptimizerConfig,
    PrecisionOptions,
)

__all__ = [
    "DynamicLossScaler",
    "FP16Optimizer",
    "FP16OptimizerConfig",
    "LossScalerConfig",
    "MemoryEfficientFP16Optimizer",
    "MemoryEfficientFP16OptimizerConfig",
    "MinimumLossScaleError",
    "ParamGroupView",
    "PrecisionOptions",
    "PrecisionWrapper",
]
__version__ = "0.1.0"
