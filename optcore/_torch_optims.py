"""Schemas for the optimizers in ``torch.optim``: their signatures, with the
constraints torch enforces (or should: it accepts ``momentum=-1`` for SGD);
``tests/test_schema_values.py`` checks them against the installed torch.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from ._fields import LR, Beta, Betas, Eps, Flag, HParams, Literalish, Momentum, OptionalFlag, WeightDecay

NonNegative = Annotated[float, Field(ge=0.0), Literalish]
Positive = Annotated[float, Field(gt=0.0), Literalish]
PositiveInt = Annotated[int, Field(gt=0), Literalish]


class _Impl(HParams):
    """Implementation switches shared by most torch optimizers."""

    maximize: Flag = Field(False, description="maximize the objective instead of minimizing")
    foreach: OptionalFlag = Field(None, description="multi-tensor path; None lets optcore choose")
    differentiable: Flag = Field(False, description="autograd through the step (slow)")


class _Fusable(_Impl):
    fused: OptionalFlag = Field(None, description="fused kernel; None = fused where the device supports it")

    @model_validator(mode="after")
    def _one_path(self) -> _Fusable:
        if self.fused and self.foreach:
            raise ValueError("fused=True and foreach=True are exclusive: set one of them")
        if self.fused and self.differentiable:
            raise ValueError("fused=True does not support differentiable=True")
        return self


class _AdamFamily(_Impl):
    """Adam's fields, for its family (a redeclared default keeps the field's place)."""

    lr: LR = 1e-3
    betas: Betas = (0.9, 0.999)
    eps: Eps = 1e-8
    weight_decay: WeightDecay = 0.0
    capturable: Flag = False


class SGDConfig(_Fusable):
    """Stochastic gradient descent, with optional (Nesterov) momentum."""

    lr: LR = 1e-3
    momentum: Momentum = 0.0
    dampening: NonNegative = 0.0
    weight_decay: WeightDecay = 0.0
    nesterov: Flag = False

    @model_validator(mode="after")
    def _nesterov(self) -> SGDConfig:
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("nesterov=True needs momentum > 0 and dampening = 0")
        return self


class AdamConfig(_AdamFamily, _Fusable):
    """Adam (Kingma & Ba); ``decoupled_weight_decay=True`` makes it AdamW."""

    amsgrad: Flag = False
    decoupled_weight_decay: Flag = False


class AdamWConfig(_AdamFamily, _Fusable):
    """Adam with decoupled weight decay (Loshchilov & Hutter)."""

    weight_decay: WeightDecay = 1e-2
    amsgrad: Flag = False


class AdamaxConfig(_AdamFamily):
    lr: LR = 2e-3


class NAdamConfig(_AdamFamily):
    lr: LR = 2e-3
    momentum_decay: NonNegative = 4e-3
    decoupled_weight_decay: Flag = False


class RAdamConfig(_AdamFamily):
    decoupled_weight_decay: Flag = False


class RMSpropConfig(_Impl):
    lr: LR = 1e-2
    alpha: Annotated[float, Field(ge=0.0, le=1.0, description="smoothing constant"), Literalish] = 0.99
    eps: Eps = 1e-8
    weight_decay: WeightDecay = 0.0
    momentum: Momentum = 0.0
    centered: Flag = False
    capturable: Flag = False


class AdagradConfig(_Fusable):
    lr: LR = 1e-2
    lr_decay: NonNegative = 0.0
    weight_decay: WeightDecay = 0.0
    initial_accumulator_value: NonNegative = 0.0
    eps: Eps = 1e-10


class AdadeltaConfig(_Impl):
    lr: LR = 1.0
    rho: Annotated[float, Field(ge=0.0, le=1.0), Literalish] = 0.9
    eps: Eps = 1e-6
    weight_decay: WeightDecay = 0.0
    capturable: Flag = False


class ASGDConfig(_Impl):
    lr: LR = 1e-2
    lambd: NonNegative = 1e-4
    alpha: NonNegative = 0.75
    t0: NonNegative = 1e6
    weight_decay: WeightDecay = 0.0
    capturable: Flag = False


class RpropConfig(_Impl):
    lr: LR = 1e-2
    etas: Annotated[tuple[Positive, Positive], Field(description="(decrease, increase) factors"), Literalish] = (0.5, 1.2)
    step_sizes: Annotated[tuple[NonNegative, NonNegative], Field(description="(min, max) step"), Literalish] = (1e-6, 50.0)
    capturable: Flag = False

    @model_validator(mode="after")
    def _etas(self) -> RpropConfig:
        if not 0.0 < self.etas[0] < 1.0 < self.etas[1]:
            raise ValueError(f"etas must satisfy 0 < etaminus < 1 < etaplus, got {self.etas}")
        return self


class LBFGSConfig(HParams):
    lr: LR = 1.0
    max_iter: PositiveInt = 20
    max_eval: Annotated[int | None, Field(gt=0), Literalish] = None
    tolerance_grad: NonNegative = 1e-7
    tolerance_change: NonNegative = 1e-9
    history_size: PositiveInt = 100
    line_search_fn: Literal["strong_wolfe"] | None = None


class SparseAdamConfig(HParams):
    lr: LR = 1e-3
    betas: Betas = (0.9, 0.999)
    eps: Eps = 1e-8
    maximize: Flag = False


class TorchAdafactorConfig(HParams):
    """torch's own Adafactor (torch >= 2.5): no relative step, no update
    clipping; not the fairseq/Hugging Face algorithm (see optcore-adafactor)."""

    lr: LR = 1e-2
    beta2_decay: Annotated[float, Field(le=0.0), Literalish] = -0.8
    eps: Annotated[tuple[NonNegative | None, NonNegative], Literalish] = (None, 1e-3)
    d: Positive = 1.0
    weight_decay: WeightDecay = 0.0
    foreach: OptionalFlag = None
    maximize: Flag = False


class MuonConfig(HParams):
    lr: LR = 1e-3
    weight_decay: WeightDecay = 0.1
    momentum: Beta = 0.95
    nesterov: Flag = True
    ns_coefficients: Annotated[tuple[float, float, float], Literalish] = (3.4445, -4.775, 2.0315)
    eps: Eps = 1e-7
    ns_steps: PositiveInt = 5
    adjust_lr_fn: Literal["original", "match_rms_adamw"] | None = None


#: torch's class name -> schema: every ``...Config`` above, named without "Config" (and "Torch")
TORCH_SCHEMAS: dict[str, type[HParams]] = {
    n.removesuffix("Config").removeprefix("Torch"): c for n, c in list(globals().items()) if n.endswith("Config")
}
