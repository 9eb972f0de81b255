"""Polynomial and power-law decays after a linear warm-up: transformers'
``linear``, ``polynomial`` and ``inverse_sqrt``, fairseq's ``polynomial_decay``."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar

from pydantic import Field
from torch.optim import Optimizer

from .._errors import ConfigError
from .._fields import HParams, Literalish
from ._base import NonNegative, PositiveSteps, Schedule, TrainingSteps, WarmupSteps, base_lr


def linear_warmup(step: int, warmup_steps: int) -> float:
    """``t / max(1, W)``: the warm-up every transformers schedule starts with."""
    return float(step) / float(max(1, warmup_steps))


class LinearConfig(HParams):
    warmup_steps: WarmupSteps = 0
    num_training_steps: TrainingSteps


class LinearSchedule(Schedule):
    """Linear warm-up from 0, then linear decay to 0 at the last step
    (transformers' ``linear``).

    With ``W = warmup_steps`` and ``T = num_training_steps``::

        factor(t) = t / max(1, W)                       if t < W
                    max(0, (T - t) / max(1, T - W))     otherwise
    """

    name = "linear"
    config_schema = LinearConfig
    needs_total = True
    total_field = "num_training_steps"
    example: ClassVar[dict[str, Any]] = {"warmup_steps": 100}

    def __init__(
        self, optimizer: Optimizer, *, num_training_steps: int, warmup_steps: int = 0, last_epoch: int = -1
    ) -> None:
        hp = self._validate(warmup_steps=warmup_steps, num_training_steps=num_training_steps)
        self.warmup_steps = hp["warmup_steps"]
        self.num_training_steps = hp["num_training_steps"]
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        w, total = self.warmup_steps, self.num_training_steps
        if step < w:
            return linear_warmup(step, w)
        return max(0.0, float(total - step) / float(max(1, total - w)))


class PolynomialConfig(HParams):
    warmup_steps: WarmupSteps = 0
    num_training_steps: TrainingSteps
    lr_end: Annotated[float, Field(ge=0.0, description="lr reached at the last step (absolute)"), Literalish] = 1e-7
    power: Annotated[float, Field(gt=0.0, description="exponent of the decay (1: linear)"), Literalish] = 1.0


class PolynomialSchedule(Schedule):
    """Linear warm-up from 0, then polynomial decay from the base lr to
    ``lr_end`` (transformers' ``polynomial``, after BERT and fairseq).

    With ``W = warmup_steps``, ``T = num_training_steps``, ``p = power``,
    ``lr0`` the optimizer's base lr and ``r = (T - t) / (T - W)``::

        lr(t) = lr0 * t / max(1, W)                     if t < W
                (lr0 - lr_end) * r**p + lr_end          if W <= t <= T
                lr_end                                  if t > T
    """

    name = "polynomial"
    config_schema = PolynomialConfig
    needs_total = True
    total_field = "num_training_steps"
    example: ClassVar[dict[str, Any]] = {"warmup_steps": 100, "lr_end": 1e-4, "power": 2.0}

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        num_training_steps: int,
        warmup_steps: int = 0,
        lr_end: float = 1e-7,
        power: float = 1.0,
        last_epoch: int = -1,
    ) -> None:
        hp = self._validate(
            warmup_steps=warmup_steps, num_training_steps=num_training_steps, lr_end=lr_end, power=power
        )
        self.warmup_steps = hp["warmup_steps"]
        self.num_training_steps = hp["num_training_steps"]
        self.lr_end = hp["lr_end"]
        self.power = hp["power"]
        self.lr_init = base_lr(optimizer, self.name)
        if not self.lr_init > self.lr_end:
            raise ConfigError(
                f"polynomial: lr_end ({self.lr_end}) must be smaller than the optimizer's lr ({self.lr_init}).",
                problems=[("lr_end", f"not below the optimizer lr {self.lr_init}")],
                target=self.name,
            )
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        w, total, lr_init, lr_end = self.warmup_steps, self.num_training_steps, self.lr_init, self.lr_end
        if step < w:
            return linear_warmup(step, w)
        if step > total:
            return lr_end / lr_init
        pct_remaining = 1 - (step - w) / max(1, total - w)
        return ((lr_init - lr_end) * pct_remaining**self.power + lr_end) / lr_init


class InverseSqrtConfig(HParams):
    warmup_steps: WarmupSteps = 0
    timescale: Annotated[
        PositiveSteps | None, Field(description="decay time scale (default: warmup_steps, or 10000)"), Literalish
    ] = None


class InverseSqrtSchedule(Schedule):
    """Linear warm-up from 0, then decay as one over the square root of the
    step (transformers' ``inverse_sqrt``, after big_vision).

    With ``W = warmup_steps`` and ``s = timescale`` (default ``W``, or 10000
    without warm-up)::

        factor(t) = t / max(1, W)                       if t < W
                    1 / sqrt((t + s - W) / s)           otherwise
    """

    name = "inverse_sqrt"
    config_schema = InverseSqrtConfig
    example: ClassVar[dict[str, Any]] = {"warmup_steps": 100}

    def __init__(
        self, optimizer: Optimizer, *, warmup_steps: int = 0, timescale: int | None = None, last_epoch: int = -1
    ) -> None:
        hp = self._validate(warmup_steps=warmup_steps, timescale=timescale)
        self.warmup_steps = hp["warmup_steps"]
        self.timescale = hp["timescale"] if hp["timescale"] is not None else (self.warmup_steps or 10_000)
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return linear_warmup(step, self.warmup_steps)
        shift = self.timescale - self.warmup_steps
        return 1.0 / math.sqrt((step + shift) / self.timescale)


class PolynomialDecayConfig(HParams):
    warmup_updates: Annotated[
        int, Field(ge=0, description="updates of linear warm-up from 0 (also accepted as warmup_steps)"), Literalish
    ] = 0
    total_num_update: Annotated[
        int, Field(gt=0, description="update at which end_learning_rate is reached (num_training_steps)"), Literalish
    ]
    end_learning_rate: Annotated[float, Field(ge=0.0, description="final lr (absolute)"), Literalish] = 0.0
    zero_lr_warmup_steps: Annotated[
        int, Field(ge=0, description="updates at lr 0 before the warm-up (to fill EMAs)"), Literalish
    ] = 0
    power: NonNegative = 1.0


class PolynomialDecaySchedule(Schedule):
    """Optional updates at lr 0, linear warm-up, then polynomial decay to
    ``end_learning_rate`` (fairseq's ``polynomial_decay``).

    With ``Z = zero_lr_warmup_steps``, ``W = warmup_updates``,
    ``T = total_num_update``, ``p = power``, ``lr0`` the optimizer's lr and
    ``r = 1 - (t - Z - W) / (T - Z - W)``::

        lr(t) = 0                                        if Z > 0 and t <= Z
                lr0 * (t - Z) / W                        if W > 0 and t <= Z + W
                end_learning_rate                        if t >= T
                (lr0 - end_learning_rate) * r**p + end_learning_rate   otherwise
    """

    name = "polynomial_decay"
    config_schema = PolynomialDecayConfig
    needs_total = True
    total_field = "total_num_update"
    example: ClassVar[dict[str, Any]] = {"warmup_updates": 100, "end_learning_rate": 1e-4}

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        total_num_update: int,
        warmup_updates: int = 0,
        end_learning_rate: float = 0.0,
        zero_lr_warmup_steps: int = 0,
        power: float = 1.0,
        last_epoch: int = -1,
    ) -> None:
        hp = self._validate(
            warmup_updates=warmup_updates,
            total_num_update=total_num_update,
            end_learning_rate=end_learning_rate,
            zero_lr_warmup_steps=zero_lr_warmup_steps,
            power=power,
        )
        self.__dict__.update(hp)
        self.peak_lr = base_lr(optimizer, self.name)
        super().__init__(optimizer, last_epoch)

    def lr(self, n: int) -> float:
        """The absolute lr fairseq sets after ``n`` updates."""
        z, w, total, end = self.zero_lr_warmup_steps, self.warmup_updates, self.total_num_update, self.end_learning_rate
        if z > 0 and n <= z:
            return 0.0
        if w > 0 and n <= w + z:
            return (n - z) / float(w) * self.peak_lr
        if n >= total:
            return end
        pct_remaining = 1 - (n - (w + z)) / (total - (w + z))
        return (self.peak_lr - end) * pct_remaining**self.power + end

    def factor(self, step: int) -> float:
        return self.lr(step) / self.peak_lr
