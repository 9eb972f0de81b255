"""Piecewise-constant schedules after fairseq: ``step`` (decay every k
updates), ``fixed`` (a learning rate per epoch, then annealing) and ``manual``
(epoch -> lr and update -> lr maps).

``fixed`` and ``manual`` change at epoch boundaries: call
``scheduler.step_begin_epoch()`` at the start of every epoch (fairseq's
trainer does), and ``scheduler.step()`` after every optimizer step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, Field
from torch.optim import Optimizer

from .._errors import ConfigError
from .._fields import HParams, Literalish
from ._base import EpochSchedule, PositiveSteps, Schedule, base_lr

WarmupUpdates = Annotated[
    int, Field(ge=0, description="updates of linear warm-up (also accepted as warmup_steps)"), Literalish
]


class StepConfig(HParams):
    warmup_updates: WarmupUpdates = 0
    warmup_init_lr: Annotated[
        float, Field(description="first warm-up lr (absolute); negative: min_lr"), Literalish
    ] = -1.0
    min_lr: Annotated[float, Field(ge=0.0, description="floor of the decay (absolute)"), Literalish] = 0.0
    lr_decay_period: Annotated[int, Field(gt=0, description="updates between two decays"), Literalish] = 25000
    lr_decay: Annotated[float, Field(gt=0.0, le=1.0, description="lr multiplier per period"), Literalish] = 0.5


class StepSchedule(Schedule):
    """Linear warm-up from ``warmup_init_lr``, then the lr is multiplied by
    ``lr_decay`` every ``lr_decay_period`` updates, down to ``min_lr``
    (fairseq's ``step``).

    With ``lr0`` the optimizer's lr, ``W = warmup_updates``,
    ``i = warmup_init_lr`` (``min_lr`` if negative), ``P = lr_decay_period``::

        lr(t) = i + t (lr0 - i) / W                                if t < W
                max(lr0 * lr_decay ** floor((t - W) / P), min_lr)  otherwise
    """

    name = "step"
    config_schema = StepConfig
    example: ClassVar[dict[str, Any]] = {"warmup_updates": 50, "lr_decay_period": 200, "lr_decay": 0.5, "min_lr": 5e-5}

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        warmup_updates: int = 0,
        warmup_init_lr: float = -1.0,
        min_lr: float = 0.0,
        lr_decay_period: int = 25000,
        lr_decay: float = 0.5,
        last_epoch: int = -1,
    ) -> None:
        hp = self._validate(
            warmup_updates=warmup_updates,
            warmup_init_lr=warmup_init_lr,
            min_lr=min_lr,
            lr_decay_period=lr_decay_period,
            lr_decay=lr_decay,
        )
        self.max_lr = base_lr(optimizer, self.name)
        self.min_lr = hp["min_lr"]
        if not self.max_lr > self.min_lr:
            raise ConfigError(
                f"step: min_lr ({self.min_lr}) must be below the optimizer's lr ({self.max_lr}).",
                problems=[("min_lr", f"not below the optimizer lr {self.max_lr}")],
                target=self.name,
            )
        self.warmup_updates = hp["warmup_updates"]
        self.warmup_init_lr = hp["warmup_init_lr"] if hp["warmup_init_lr"] >= 0 else self.min_lr
        self.lr_decay_period = hp["lr_decay_period"]
        self.lr_decay = hp["lr_decay"]
        w = self.warmup_updates
        self.warmup_lr_step = (self.max_lr - self.warmup_init_lr) / w if w > 0 else 1
        super().__init__(optimizer, last_epoch)

    def lr(self, n: int) -> float:
        """The absolute lr fairseq sets after ``n`` updates."""
        if n < self.warmup_updates:
            return self.warmup_init_lr + n * self.warmup_lr_step
        decays = (n - self.warmup_updates) // self.lr_decay_period
        return max(self.max_lr * self.lr_decay**decays, self.min_lr)

    def factor(self, step: int) -> float:
        return self.lr(step) / self.max_lr


class FixedConfig(HParams):
    force_anneal: Annotated[
        PositiveSteps | None,
        Field(description="from this epoch on, shrink the lr by lr_shrink every epoch"),
        Literalish,
    ] = None
    lr_shrink: Annotated[float, Field(gt=0.0, description="lr multiplier per annealed epoch"), Literalish] = 0.1
    warmup_updates: WarmupUpdates = 0
    lr: Annotated[
        Annotated[list[Annotated[float, Field(gt=0.0)]], Field(min_length=1)] | None,
        Field(description="lr of epochs 1, 2, ... (absolute; the last repeats); default: the optimizer's"),
        Literalish,
    ] = None


class FixedSchedule(EpochSchedule):
    """One learning rate per epoch (the last one repeats), from epoch
    ``force_anneal`` on shrunk by ``lr_shrink`` each epoch, with an optional
    linear warm-up over the first updates (fairseq's ``fixed``).

    With ``e`` the epoch (1-based), ``L = lr`` (default: the optimizer's lr),
    ``A = force_anneal``, ``W = warmup_updates``::

        base(e) = L[min(e - 1, len(L) - 1)]                 if A is None or e < A
                  L[-1] * lr_shrink ** (e + 1 - A)          otherwise
        lr(t, e) = base(e) (t + 1) / W                      if t < W
                   base(e)                                  otherwise
    """

    name = "fixed"
    config_schema = FixedConfig
    example: ClassVar[dict[str, Any]] = {"warmup_updates": 50, "force_anneal": 4, "lr_shrink": 0.5}

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        force_anneal: int | None = None,
        lr_shrink: float = 0.1,
        warmup_updates: int = 0,
        lr: list[float] | None = None,
        last_epoch: int = -1,
    ) -> None:
        hp = self._validate(force_anneal=force_anneal, lr_shrink=lr_shrink, warmup_updates=warmup_updates, lr=lr)
        self.peak_lr = base_lr(optimizer, self.name)
        self.lrs = list(hp["lr"]) if hp["lr"] is not None else [self.peak_lr]
        self.force_anneal = hp["force_anneal"]
        self.lr_shrink = hp["lr_shrink"]
        self.warmup_updates = hp["warmup_updates"]
        self.epoch = 1
        super().__init__(optimizer, last_epoch)

    def epoch_lr(self, epoch: int) -> float:
        """fairseq's ``get_next_lr``: the lr of ``epoch`` before warm-up."""
        if self.force_anneal is None or epoch < self.force_anneal:
            return self.lrs[min(epoch - 1, len(self.lrs) - 1)]
        return self.lrs[-1] * self.lr_shrink ** (epoch + 1 - self.force_anneal)

    def lr(self, n: int, epoch: int) -> float:
        """The absolute lr fairseq sets after ``n`` updates in ``epoch``."""
        lr = self.epoch_lr(epoch)
        if self.warmup_updates > 0 and n < self.warmup_updates:
            return (n + 1) / float(self.warmup_updates) * lr
        return lr

    def factor(self, step: int) -> float:
        return self.lr(step, self.epoch) / self.peak_lr


def _expand_keys(mapping: Mapping[Any, Any]) -> dict[int, float]:
    """fairseq's key syntax: ``{"1,3": lr}`` (a list), ``{"2-5": lr}`` (an
    inclusive range), ``{7: lr}``."""
    out: dict[int, float] = {}
    for key, value in mapping.items():
        text = str(key).strip()
        try:
            if "," in text:
                keys = [int(k) for k in text.split(",") if k.strip()]
            elif "-" in text.lstrip("-"):
                start, _, end = text.partition("-")
                keys = list(range(int(start), int(end) + 1))
            else:
                keys = [int(text)]
        except ValueError:
            raise ValueError(f"key {key!r} is not an int, 'a,b,c' or 'a-b'") from None
        for k in keys:
            out[k] = float(value)
    return out


LRMap = Annotated[
    dict[int | str, Annotated[float, Field(ge=0.0)]],
    Literalish,
    AfterValidator(_expand_keys),
    Field(description="{key: lr} with keys 3, '1,2' or '4-6' (absolute lrs); a string is parsed as a literal"),
]


class ManualConfig(HParams):
    epoch2lr: LRMap = {}
    update2lr: LRMap = {}


class ManualSchedule(EpochSchedule):
    """The lr is read from an ``epoch -> lr`` and an ``update -> lr`` map: the
    largest key not past the current epoch/update applies, and an update key
    beats an epoch key (fairseq's ``manual``).

    With ``t`` the update, ``e`` the epoch (1-based) and ``lr0`` the
    optimizer's lr::

        lr(t, e) = update2lr[max{k <= t}]       if update2lr has a key <= t
                   epoch2lr[max{k <= e}]        elif epoch2lr has a key <= e
                   lr0                          otherwise
    """

    name = "manual"
    config_schema = ManualConfig
    decays = True
    example: ClassVar[dict[str, Any]] = {"epoch2lr": {"1": 1e-3, "3-4": 5e-4, "5": 2e-4}, "update2lr": {"900": 5e-5}}

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        epoch2lr: Mapping[Any, float] | str | None = None,
        update2lr: Mapping[Any, float] | str | None = None,
        last_epoch: int = -1,
    ) -> None:
        hp = self._validate(epoch2lr=epoch2lr or {}, update2lr=update2lr or {})
        self.peak_lr = base_lr(optimizer, self.name)
        self.epoch2lr: dict[int, float] = _expand_keys(hp["epoch2lr"])
        self.update2lr: dict[int, float] = _expand_keys(hp["update2lr"])
        self.epoch = 1
        super().__init__(optimizer, last_epoch)

    def lr(self, n: int, epoch: int) -> float:
        """The absolute lr fairseq's trainer leaves set after ``n`` updates in ``epoch``."""
        for table, now in ((self.update2lr, n), (self.epoch2lr, epoch)):
            keys = [k for k in table if k <= now]
            if keys:
                return table[max(keys)]
        return self.peak_lr

    def factor(self, step: int) -> float:
        return self.lr(step, self.epoch) / self.peak_lr
