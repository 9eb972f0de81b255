"""Cosine decays after a linear warm-up: transformers' ``cosine``,
``cosine_with_restarts``, ``cosine_with_min_lr`` and ``cosine_warmup_with_min_lr``."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar

from pydantic import Field, model_validator
from torch.optim import Optimizer

from .._fields import HParams, Literalish
from ._base import Fraction, NonNegative, Schedule, TrainingSteps, WarmupSteps, base_lr
from .polynomial import linear_warmup

Cycles = Annotated[
    float, Field(ge=0.0, description="number of cosine waves (0.5: one half-wave down to 0)"), Literalish
]


def _progress(step: int, warmup_steps: int, total: int) -> float:
    return float(step - warmup_steps) / float(max(1, total - warmup_steps))


def cosine_wave(progress: float, cycles: float, floor: float = 0.0) -> float:
    """``max(0, m + (1 - m) (1 + cos(2 pi c p)) / 2)``: the one cosine every
    cosine-shaped schedule here decays along (``c = 0.5``: one half-wave from
    1 down to the floor ``m`` as ``p`` goes from 0 to 1)."""
    wave = 0.5 * (1.0 + math.cos(math.pi * float(cycles) * 2.0 * progress))
    return max(0.0, wave * (1.0 - floor) + floor)


class _WarmupThenCosine(Schedule):
    """Linear warm-up from 0 over ``warmup_steps``, then :meth:`decay` of the
    progress through the remaining steps (the shape of transformers' cosine
    schedules). Subclasses set ``warmup_steps``, ``num_training_steps`` and
    ``num_cycles``."""

    warmup_steps: int
    num_training_steps: int
    num_cycles: float

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return linear_warmup(step, self.warmup_steps)
        return self.decay(_progress(step, self.warmup_steps, self.num_training_steps))

    def decay(self, progress: float) -> float:
        return cosine_wave(progress, self.num_cycles)


class CosineConfig(HParams):
    warmup_steps: WarmupSteps = 0
    num_training_steps: TrainingSteps
    num_cycles: Cycles = 0.5


class CosineSchedule(_WarmupThenCosine):
    """Linear warm-up from 0, then cosine decay to 0 (transformers' ``cosine``).

    With ``W = warmup_steps``, ``T = num_training_steps``, ``c = num_cycles``
    and ``p = (t - W) / max(1, T - W)``::

        factor(t) = t / max(1, W)                       if t < W
                    max(0, (1 + cos(2 pi c p)) / 2)     otherwise
    """

    name = "cosine"
    config_schema = CosineConfig
    needs_total = True
    total_field = "num_training_steps"
    example: ClassVar[dict[str, Any]] = {"warmup_steps": 100}

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        num_training_steps: int,
        warmup_steps: int = 0,
        num_cycles: float = 0.5,
        last_epoch: int = -1,
    ) -> None:
        hp = self._validate(warmup_steps=warmup_steps, num_training_steps=num_training_steps, num_cycles=num_cycles)
        self.warmup_steps = hp["warmup_steps"]
        self.num_training_steps = hp["num_training_steps"]
        self.num_cycles = hp["num_cycles"]
        super().__init__(optimizer, last_epoch)


class CosineWithRestartsConfig(HParams):
    warmup_steps: WarmupSteps = 0
    num_training_steps: TrainingSteps
    num_cycles: Annotated[int, Field(ge=1, description="number of hard restarts"), Literalish] = 1


class CosineWithRestartsSchedule(_WarmupThenCosine):
    """Linear warm-up from 0, then ``num_cycles`` cosine decays to 0, each
    restarting at the base lr (transformers' ``cosine_with_restarts``).

    With ``W``, ``T``, ``c`` and ``p`` as for ``cosine``::

        factor(t) = t / max(1, W)                       if t < W
                    0                                   if p >= 1
                    max(0, (1 + cos(pi ((c p) mod 1))) / 2)    otherwise
    """

    name = "cosine_with_restarts"
    config_schema = CosineWithRestartsConfig
    needs_total = True
    total_field = "num_training_steps"
    example: ClassVar[dict[str, Any]] = {"warmup_steps": 100, "num_cycles": 3}

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        num_training_steps: int,
        warmup_steps: int = 0,
        num_cycles: int = 1,
        last_epoch: int = -1,
    ) -> None:
        hp = self._validate(warmup_steps=warmup_steps, num_training_steps=num_training_steps, num_cycles=num_cycles)
        self.warmup_steps = hp["warmup_steps"]
        self.num_training_steps = hp["num_training_steps"]
        self.num_cycles = hp["num_cycles"]
        super().__init__(optimizer, last_epoch)

    def decay(self, progress: float) -> float:
        if progress >= 1.0:
            return 0.0
        return cosine_wave((float(self.num_cycles) * progress) % 1.0, 0.5)  # each cycle one half-wave


class _MinLR(HParams):
    """Exactly one of ``min_lr`` (absolute) and ``min_lr_rate`` (a fraction of the base lr)."""

    min_lr: Annotated[NonNegative | None, Field(description="lr at the end of the cosine (absolute)"), Literalish] = (
        None
    )
    min_lr_rate: Annotated[
        Fraction | None, Field(description="lr at the end, as a fraction of the base lr"), Literalish
    ] = None

    @model_validator(mode="after")
    def _one_floor(self) -> _MinLR:
        if (self.min_lr is None) == (self.min_lr_rate is None):
            raise ValueError("give exactly one of min_lr (absolute) and min_lr_rate (fraction of the base lr)")
        return self


def _min_lr_rate(optimizer: Optimizer, min_lr: float | None, min_lr_rate: float | None, who: str) -> float:
    if min_lr_rate is not None:
        return float(min_lr_rate)
    return float(min_lr) / base_lr(optimizer, who)  # type: ignore[arg-type]


class CosineWithMinLRConfig(_MinLR):
    warmup_steps: WarmupSteps = 0
    num_training_steps: TrainingSteps
    num_cycles: Cycles = 0.5


class CosineWithMinLRSchedule(_WarmupThenCosine):
    """Linear warm-up from 0, then cosine decay to a floor
    (transformers' ``cosine_with_min_lr``).

    With ``W``, ``T``, ``c`` and ``p`` as for ``cosine`` and
    ``m = min_lr_rate`` (or ``min_lr / base lr``)::

        factor(t) = t / max(1, W)                                if t < W
                    max(0, m + (1 - m) (1 + cos(2 pi c p)) / 2)  otherwise
    """

    name = "cosine_with_min_lr"
    config_schema = CosineWithMinLRConfig
    needs_total = True
    total_field = "num_training_steps"
    example: ClassVar[dict[str, Any]] = {"warmup_steps": 100, "min_lr_rate": 0.1}

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        num_training_steps: int,
        warmup_steps: int = 0,
        num_cycles: float = 0.5,
        min_lr: float | None = None,
        min_lr_rate: float | None = None,
        last_epoch: int = -1,
    ) -> None:
        hp = self._validate(
            warmup_steps=warmup_steps,
            num_training_steps=num_training_steps,
            num_cycles=num_cycles,
            min_lr=min_lr,
            min_lr_rate=min_lr_rate,
        )
        self.warmup_steps = hp["warmup_steps"]
        self.num_training_steps = hp["num_training_steps"]
        self.num_cycles = hp["num_cycles"]
        self.min_lr_rate = _min_lr_rate(optimizer, hp["min_lr"], hp["min_lr_rate"], self.name)
        super().__init__(optimizer, last_epoch)

    def decay(self, progress: float) -> float:
        return cosine_wave(progress, self.num_cycles, self.min_lr_rate)


class CosineWarmupWithMinLRConfig(_MinLR):
    warmup_steps: WarmupSteps = 0
    num_training_steps: TrainingSteps
    num_cycles: Cycles = 0.5
    warmup_lr_rate: Annotated[
        Fraction | None,
        Field(description="first warm-up lr as a fraction of the base lr (default: 1 / warmup_steps)"),
    ] = None


class CosineWarmupWithMinLRSchedule(Schedule):
    """Warm-up that starts above 0, then cosine decay to a floor, both one
    step ahead of ``cosine_with_min_lr`` (transformers'
    ``cosine_warmup_with_min_lr``).

    With ``W``, ``T``, ``c``, ``m`` as for ``cosine_with_min_lr``,
    ``a = warmup_lr_rate`` and ``p = (t - W + 1) / max(1, T - W)``::

        factor(t) = (t + 1) / max(1, W)                          if t < W and a is None
                    a + (1 - a) t / max(1, W - 1)                if t < W
                    max(0, m + (1 - m) (1 + cos(2 pi c p)) / 2)  otherwise
    """

    name = "cosine_warmup_with_min_lr"
    config_schema = CosineWarmupWithMinLRConfig
    needs_total = True
    total_field = "num_training_steps"
    example: ClassVar[dict[str, Any]] = {"warmup_steps": 100, "min_lr_rate": 0.1}

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        num_training_steps: int,
        warmup_steps: int = 0,
        num_cycles: float = 0.5,
        min_lr: float | None = None,
        min_lr_rate: float | None = None,
        warmup_lr_rate: float | None = None,
        last_epoch: int = -1,
    ) -> None:
        hp = self._validate(
            warmup_steps=warmup_steps,
            num_training_steps=num_training_steps,
            num_cycles=num_cycles,
            min_lr=min_lr,
            min_lr_rate=min_lr_rate,
            warmup_lr_rate=warmup_lr_rate,
        )
        self.warmup_steps = hp["warmup_steps"]
        self.num_training_steps = hp["num_training_steps"]
        self.num_cycles = hp["num_cycles"]
        self.warmup_lr_rate = hp["warmup_lr_rate"]
        self.min_lr_rate = _min_lr_rate(optimizer, hp["min_lr"], hp["min_lr_rate"], self.name)
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        t, w, total = float(step), float(self.warmup_steps), float(self.num_training_steps)
        if t < w:
            if self.warmup_lr_rate is None:
                return (t + 1.0) / max(1.0, w)
            a = float(self.warmup_lr_rate)
            return a + (1.0 - a) * t / max(1, w - 1)
        return cosine_wave((t - w + 1.0) / max(1.0, total - w), self.num_cycles, self.min_lr_rate)


__all__ = [
    "cosine_wave",
    "CosineSchedule",
    "CosineWithRestartsSchedule",
    "CosineWithMinLRSchedule",
    "CosineWarmupWithMinLRSchedule",
]
