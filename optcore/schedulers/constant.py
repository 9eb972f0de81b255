"""Schedules that hold the learning rate: ``constant``, ``constant_with_warmup``
and fairseq's ``pass_through`` (for optimizers that schedule themselves)."""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from .._fields import HParams
from ._base import Schedule, WarmupSteps


class ConstantConfig(HParams):
    """``constant`` has no hyper-parameters: the lr is the optimizer's."""


class ConstantSchedule(Schedule):
    """Constant learning rate: the optimizer's lr, unchanged (transformers'
    ``constant``).

    ``factor(t) = 1``
    """

    name = "constant"
    config_schema = ConstantConfig
    decays = False
    example: ClassVar[dict[str, Any]] = {}

    def __init__(self, optimizer: Optimizer, *, last_epoch: int = -1) -> None:
        self._validate()
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        return 1.0


class ConstantWithWarmupConfig(HParams):
    warmup_steps: WarmupSteps = 0


class ConstantWithWarmupSchedule(Schedule):
    """Linear warm-up from 0 to the optimizer's lr, then constant
    (transformers' ``constant_with_warmup``).

    With ``W = warmup_steps``::

        factor(t) = t / max(1, W)    if t < W
                    1                otherwise
    """

    name = "constant_with_warmup"
    config_schema = ConstantWithWarmupConfig
    decays = False
    example: ClassVar[dict[str, Any]] = {"warmup_steps": 100}

    def __init__(self, optimizer: Optimizer, *, warmup_steps: int = 0, last_epoch: int = -1) -> None:
        hp = self._validate(warmup_steps=warmup_steps)
        self.warmup_steps = hp["warmup_steps"]
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return float(step) / float(max(1.0, self.warmup_steps))
        return 1.0


class PassThroughConfig(HParams):
    """``pass_through`` has no hyper-parameters."""


class PassThroughSchedule(LRScheduler):
    """Leave the learning rate to the optimizer (fairseq's ``pass_through``).

    For optimizers that compute their own step size (Adafactor with
    ``relative_step=True``, schedule-free optimizers, an optimizer that carries
    its own ``lr_scheduler``): ``step()`` never writes ``group["lr"]``. If the
    optimizer has an ``lr_scheduler`` attribute, ``step``, ``state_dict`` and
    ``load_state_dict`` are delegated to it, as fairseq does.

    ``lr(t) = whatever the optimizer uses``
    """

    name: ClassVar[str] = "pass_through"
    config_schema: ClassVar[type[HParams]] = PassThroughConfig
    needs_total: ClassVar[bool] = False
    total_field: ClassVar[str | None] = None
    needs_metric: ClassVar[bool] = False
    decays: ClassVar[bool] = False
    example: ClassVar[dict[str, Any]] = {}

    def __init__(self, optimizer: Optimizer, *, last_epoch: int = -1) -> None:
        # Deliberately not LRScheduler.__init__: that writes every group's lr,
        # which may be None here (Adafactor's relative-step mode).
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        self.last_epoch = max(0, last_epoch)
        self._step_count = 1
        self.base_lrs = [g.get("lr") for g in optimizer.param_groups]
        self._last_lr = list(self.base_lrs)

    def _inner(self) -> Any:
        return getattr(self.optimizer, "lr_scheduler", None)

    def get_lr(self) -> list[float | Tensor]:
        return [g.get("lr") for g in self.optimizer.param_groups]

    def get_last_lr(self) -> list[Any]:
        """Each group's lr; where a group has none (the optimizer computes its own
        step size), the step sizes the optimizer reports it applied (its
        ``get_lrs()``), as transformers' ``AdafactorSchedule`` does, so a
        trainer logs a number."""
        if all(lr is not None for lr in self._last_lr):
            return list(self._last_lr)
        try:
            return [float(lr) for lr in self.optimizer.get_lrs()]  # type: ignore[attr-defined]
        except (AttributeError, TypeError, ValueError):  # not optcore's contract: what the groups hold
            return list(self._last_lr)

    def step(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        inner = self._inner()
        if inner is not None:
            inner.step(*args, **kwargs)
        self.last_epoch += 1
        self._step_count += 1
        self._last_lr = self.get_lr()

    def state_dict(self) -> dict[str, Any]:
        inner = self._inner()
        state: dict[str, Any] = {"last_epoch": self.last_epoch, "_step_count": self._step_count}
        if inner is not None:
            state["inner"] = inner.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_epoch = state_dict.get("last_epoch", self.last_epoch)
        self._step_count = state_dict.get("_step_count", self._step_count)
        inner = self._inner()
        if inner is not None and "inner" in state_dict:
            inner.load_state_dict(state_dict["inner"])
        self._last_lr = self.get_lr()
