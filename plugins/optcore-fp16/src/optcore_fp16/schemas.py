"""Pydantic schemas of the precision options, shared by both ways in.

``{"type": "FP16Optimizer", "optimizer": {...}, "loss_scaler": {...}}`` is
validated by the wrapper classes' ``config_schema`` (the core handles the
``optimizer`` key itself); the shorthand ``{"type": "AdamW", "precision":
"fp16", "memory_efficient": true, "loss_scaler": {...}}`` by
:class:`PrecisionOptions`. The loss-scaler block is the same model in both.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AliasChoices, Field

from optcore.plugin import HParams, Literalish

Precision = Literal["fp16", "bf16"]


def _fairseq(name: str, fairseq_name: str) -> AliasChoices:
    """Accept fairseq's option name (``--fp16-init-scale`` is ``fp16_init_scale``) too."""
    return AliasChoices(name, fairseq_name)


_Finite = {"allow_inf_nan": False}


class LossScalerConfig(HParams):
    """Dynamic loss scaling as fairseq's training config defines it.

    fairseq's names are accepted as aliases: ``fp16_init_scale``,
    ``fp16_scale_window``, ``fp16_scale_tolerance``, ``threshold_loss_scale``
    (and ``min_loss_scale``, the same in both). Every number must be finite: an
    infinite or NaN scale would make every gradient overflow, so every step
    would be skipped.
    """

    init_scale: Annotated[
        float,
        Field(gt=0.0, validation_alias=_fairseq("init_scale", "fp16_init_scale"), **_Finite,
              description="loss scale at the start of training (fairseq: fp16_init_scale)"),
        Literalish,
    ] = 2.0**7
    scale_factor: Annotated[
        float,
        Field(gt=1.0, **_Finite,
              description="the scale is divided by this on overflow, multiplied after a clean window"),
        Literalish,
    ] = 2.0
    scale_window: Annotated[
        Annotated[int, Field(ge=1)] | None,
        Field(validation_alias=_fairseq("scale_window", "fp16_scale_window"),
              description="clean steps before the scale grows; default 2**14 / world_size / update_freq "
              "(fairseq: fp16_scale_window)"),
        Literalish,
    ] = None
    tolerance: Annotated[
        float,
        Literalish,
        Field(
            ge=0.0, le=1.0, validation_alias=_fairseq("tolerance", "fp16_scale_tolerance"),
            description="fraction of overflowing steps since the last rescale tolerated before lowering "
            "(fairseq: fp16_scale_tolerance)",
        ),
    ] = 0.0
    threshold: Annotated[
        Annotated[float, Field(gt=0.0, **_Finite)] | None,
        Field(validation_alias=_fairseq("threshold", "threshold_loss_scale"),
              description="floor of the scale (fairseq: threshold_loss_scale); above min_loss_scale, overflowing "
              "steps at the floor are skipped without end (a warning says so)"),
        Literalish,
    ] = None
    min_loss_scale: Annotated[
        float,
        Field(gt=0.0, **_Finite,
              description="training stops (MinimumLossScaleError, a FloatingPointError) when the scale would "
              "fall to this"),
        Literalish,
    ] = 1e-4
    update_freq: Annotated[
        int, Field(ge=1, description="gradient-accumulation steps; only sets the default scale_window"), Literalish
    ] = 1


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
    """The shorthand keys this plugin's ``optcore_rewrite_config`` hook owns and validates."""

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
