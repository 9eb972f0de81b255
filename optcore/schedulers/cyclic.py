"""Cyclical schedules: fairseq's ``triangular`` (Smith, arXiv:1506.01186)."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar

from pydantic import Field
from torch.optim import Optimizer

from .._errors import ConfigError
from .._fields import HParams, Literalish
from ._base import Flag, Schedule, base_lr


class TriangularConfig(HParams):
    max_lr: Annotated[
        float, Field(gt=0.0, description="peak lr of the first cycle (absolute, > the optimizer's lr)"), Literalish
    ]
    lr_period_updates: Annotated[float, Field(ge=2, description="updates per cycle"), Literalish] = 5000
    lr_shrink: Annotated[float, Field(gt=0.0, description="peak multiplier per cycle"), Literalish] = 0.1
    shrink_min: Annotated[Flag, Field(description="also shrink the lowest lr")] = False


class TriangularSchedule(Schedule):
    """Triangular cycles: the lr climbs linearly from the optimizer's lr to
    ``max_lr`` and back once per cycle, every cycle's peak ``lr_shrink`` times
    the previous one (fairseq's ``triangular``, after Smith, arXiv:1506.01186).

    With ``lr0`` the optimizer's lr, ``s = lr_period_updates // 2``,
    ``k = floor(t / 2s)`` (the cycle), ``g = lr_shrink ** k``::

        hi = max_lr g,   lo = lr0 g if shrink_min else lr0
        x = |t / s - 2k - 1|
        lr(t) = lo + (hi - lo) max(0, 1 - x)
    """

    name = "triangular"
    config_schema = TriangularConfig
    example: ClassVar[dict[str, Any]] = {"max_lr": 3e-3, "lr_period_updates": 400, "lr_shrink": 0.5}

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        max_lr: float,
        lr_period_updates: float = 5000,
        lr_shrink: float = 0.1,
        shrink_min: bool = False,
        last_epoch: int = -1,
    ) -> None:
        hp = self._validate(
            max_lr=max_lr, lr_period_updates=lr_period_updates, lr_shrink=lr_shrink, shrink_min=shrink_min
        )
        self.min_lr = base_lr(optimizer, self.name)
        self.max_lr = hp["max_lr"]
        if not self.max_lr > self.min_lr:
            raise ConfigError(
                f"triangular: max_lr ({self.max_lr}) must be above the optimizer's lr ({self.min_lr}), "
                "which is the bottom of the cycle.",
                problems=[("max_lr", f"not above the optimizer lr {self.min_lr}")],
                target=self.name,
            )
        self.stepsize = hp["lr_period_updates"] // 2
        self.lr_shrink = hp["lr_shrink"]
        self.shrink_min = hp["shrink_min"]
        super().__init__(optimizer, last_epoch)

    def lr(self, n: int) -> float:
        """The absolute lr fairseq sets after ``n`` updates."""
        cycle = math.floor(n / (2 * self.stepsize))
        shrink = self.lr_shrink**cycle
        max_lr = self.max_lr * shrink
        min_lr = self.min_lr * shrink if self.shrink_min else self.min_lr
        x = abs(n / self.stepsize - 2 * (cycle + 1) + 1)
        return min_lr + (max_lr - min_lr) * max(0, (1 - x))

    def factor(self, step: int) -> float:
        return self.lr(step) / self.min_lr
