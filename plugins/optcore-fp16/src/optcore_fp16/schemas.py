"""Pydantic schemas of the precision options, shared by both ways in.

``{"type": "FP16Optimizer", "optimizer": {...}, "loss_scaler": {...}}`` is
validated by the wrapper classes' ``config_schema`` (the core handles the
``optimizer`` key itself); the shorthand ``{"type": "AdamW", "precision":
"fp16", "memory_efficient": true, "loss_scaler": {...}}`` by
:class:`PrecisionOptions`. The loss-scaler block is the same model in both.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from optcore import HParams, Literalish

Precision = Literal["fp16", "bf16"]


class LossScalerConfig(HParams):
    """Dynamic loss scaling as fairseq's training config defines it."""

    init_scale: Annotated[float, Field(gt=0.0, description="loss scale at the start of training"), Literalish] = 2.0**7
    scale_factor: Annotated[
        float,
        Field(gt=1.0, description="the scale is divided by this on overflow, multiplied after a clean window"),
        Literalish,
    ] = 2.0
    scale_window: Annotated[
        Annotated[int, Field(ge=1)] | None,
        Field(description="clean steps before the scale grows; default 2**14 / world_size / update_freq"),
        Literalish,
    ] = None
    tolerance: Annotated[
        float,
        Literalish,
        Field(
            ge=0.0, le=1.0, description="fraction of overflowing steps since the last rescale tolerated before lowering"
        ),
    ] = 0.0
    threshold: Annotated[
        Annotated[float, Field(gt=0.0)] | None,
        Field(description="floor of the scale; must not exceed min_loss_scale"),
        Literalish,
    ] = None
    min_loss_scale: Annotated[
        float, Field(gt=0.0, description="training stops (FloatingPointError) when the scale falls to this"), Literalish
    ] = 1e-4
    update_freq: Annotated[
        int, Field(ge=1, description="gradient-accumulation steps; only sets the default scale_window"), Literalish
    ] = 1

    @model_validator(mode="after")
    def _minimum_reachable(self) -> LossScalerConfig:
        # fairseq clamps the scale at `threshold`; above `min_loss_scale` the scale
        # then never reaches the minimum and every overflowing step is skipped forever.
        if self.threshold is not None and self.threshold > self.min_loss_scale:
            raise ValueError(
                f"threshold={self.threshold:g} is above min_loss_scale={self.min_loss_scale:g}: the scale would stop "
                f"at {self.threshold:g} and overflowing steps would be skipped forever. Set min_loss_scale to "
                f"{self.threshold:g} (training then stops with advice when the scale gets there) or drop threshold"
            )
        if self.init_scale <= self.min_loss_scale:
            raise ValueError(
                f"init_scale={self.init_scale:g} is not above min_loss_scale={self.min_loss_scale:g}: the first "
                "overflow would stop training; raise init_scale or lower min_loss_scale"
            )
        return self


LossScalerField = Annotated[
    LossScalerConfig | None,
    Field(description="dynamic loss scaler options (fp16 only; bf16 needs none)"),
    Literalish,
]
PrecisionField = Annotated[Precision, Field(description="dtype of the model parameters: fp16 or bf16")]


class FP16OptimizerConfig(HParams):
    """Options of :class:`~optcore_fp16.FP16Optimizer` besides ``optimizer``."""

    loss_scaler: LossScalerField = None
    precision: PrecisionField = "fp16"
    flat: Annotated[
        bool | None,
        Field(description="one flat fp32 master buffer per group and device; default: when the optimizer supports it"),
        Literalish,
    ] = None


class MemoryEfficientFP16OptimizerConfig(HParams):
    """Options of :class:`~optcore_fp16.MemoryEfficientFP16Optimizer` besides ``optimizer``."""

    loss_scaler: LossScalerField = None
    precision: PrecisionField = "fp16"
    allow_unsupported: Annotated[
        bool,
        Literalish,
        Field(
            description="accept an optimizer without supports_memory_efficient_fp16 (its state is then low precision)"
        ),
    ] = False


class PrecisionOptions(HParams):
    """The shorthand keys the core passes to the ``optcore_wrap_optimizer`` hook."""

    precision: Annotated[
        Literal["fp32", "fp16", "bf16"] | None,
        Field(description="fp16/bf16 wraps the optimizer; fp32 or absent does not"),
    ] = None
    memory_efficient: Annotated[
        bool,
        Field(description="MemoryEfficientFP16Optimizer (no fp32 master copy) instead of FP16Optimizer"),
        Literalish,
    ] = False
    loss_scaler: LossScalerField = None
