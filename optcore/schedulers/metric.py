"""Metric-driven schedules: ``greedy`` (GreedyLR, arXiv:2512.14527).

transformers' ``reduce_lr_on_plateau`` is ``torch.optim.lr_scheduler.
ReduceLROnPlateau`` itself; the name resolves to it. ``GreedyLR`` subclasses
it, so trainers that step a plateau scheduler with the validation metric
(the Hugging Face ``Trainer``, Lightning) do the same for this one.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, SupportsFloat

from pydantic import Field
from torch.optim import Optimizer
from torch.optim.lr_scheduler import ReduceLROnPlateau

from .._errors import ConfigError
from .._fields import HParams, Literalish
from .._schema import validate_hparams
from ._base import Flag, write_lrs

PerGroupLR = Annotated[float | list[float], Literalish]


class GreedyConfig(HParams):
    mode: Annotated[Literal["min", "max"], Field(description="minimise or maximise the metric"), Literalish] = "min"
    factor: Annotated[
        float, Field(gt=0.0, lt=1.0, description="lr *= factor on a plateau, lr /= factor on improvement"), Literalish
    ] = 0.95
    patience: Annotated[int, Field(ge=0, description="steps of one trend before the lr moves"), Literalish] = 10
    threshold: Annotated[float, Field(ge=0.0, description="smallest change that counts"), Literalish] = 1e-6
    threshold_mode: Annotated[Literal["rel", "abs"], Literalish] = "abs"
    cooldown: Annotated[int, Field(ge=0, description="steps to wait after a decrease"), Literalish] = 0
    warmup: Annotated[
        int, Field(ge=0, description="steps to wait after an increase (not a lr warm-up)"), Literalish
    ] = 0
    min_lr: Annotated[PerGroupLR, Field(description="lower bound (absolute; scaled by a group's lr_scale)")] = 1e-3
    max_lr: Annotated[PerGroupLR, Field(description="upper bound (absolute; scaled by a group's lr_scale)")] = 1.0
    eps: Annotated[float, Field(ge=0.0, description="smallest lr change that is applied"), Literalish] = 1e-8
    verbose: Flag = False
    smooth: Annotated[Flag, Field(description="compare a moving average of the metric")] = False
    window_size: Annotated[int, Field(gt=0, description="length of that moving average"), Literalish] = 50
    reset_start: Annotated[
        int, Field(ge=1, description="plateaus at min_lr before everything restarts from the initial lr"), Literalish
    ] = 500


class GreedyLR(ReduceLROnPlateau):
    """Raise the lr while the metric keeps improving, lower it on a plateau,
    within ``[min_lr, max_lr]`` (transformers' ``greedy``, GreedyLR).

    Call ``step(metric)`` after every evaluation. With ``m`` the metric (or its
    moving average over ``window_size`` values if ``smooth``), after
    ``patience`` consecutive improvements, or non-improvements::

        improving:   lr = min(lr / factor, max_lr), then wait `warmup` steps
        plateau:     lr = max(lr * factor, min_lr), then wait `cooldown` steps

    An improvement beats the best ``m`` by ``threshold`` (``abs``) or by a
    ``threshold`` fraction (``rel``). After ``reset_start`` plateaus with every
    group at ``min_lr``, the lrs and the best metric are reset to their
    initial values.
    """

    name: ClassVar[str] = "greedy"
    config_schema: ClassVar[type[HParams]] = GreedyConfig
    needs_total: ClassVar[bool] = False
    total_field: ClassVar[str | None] = None
    needs_metric: ClassVar[bool] = True
    decays: ClassVar[bool] = True
    example: ClassVar[dict[str, Any]] = {"patience": 5, "factor": 0.9, "min_lr": 1e-4, "max_lr": 3e-3}

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        mode: str = "min",
        factor: float = 0.95,
        patience: int = 10,
        threshold: float = 1e-6,
        threshold_mode: str = "abs",
        cooldown: int = 0,
        warmup: int = 0,
        min_lr: float | list[float] = 1e-3,
        max_lr: float | list[float] = 1.0,
        eps: float = 1e-8,
        verbose: bool = False,
        smooth: bool = False,
        window_size: int = 50,
        reset_start: int = 500,
    ) -> None:
        hp = validate_hparams(
            GreedyConfig,
            dict(
                mode=mode,
                factor=factor,
                patience=patience,
                threshold=threshold,
                threshold_mode=threshold_mode,
                cooldown=cooldown,
                warmup=warmup,
                min_lr=min_lr,
                max_lr=max_lr,
                eps=eps,
                verbose=verbose,
                smooth=smooth,
                window_size=window_size,
                reset_start=reset_start,
            ),
            self.name,
        )
        # A group's lr_scale scales its bounds and its eps, so that layer-wise
        # ratios survive every increase, decrease and reset.
        self.scales = [float(g.get("lr_scale", 1.0)) for g in optimizer.param_groups]
        super().__init__(
            optimizer,
            mode=hp["mode"],
            factor=hp["factor"],
            patience=hp["patience"],
            threshold=hp["threshold"],
            threshold_mode=hp["threshold_mode"],
            cooldown=hp["cooldown"],
            min_lr=self._per_group(hp["min_lr"], "min_lr"),
            eps=hp["eps"],
        )
        self.max_lrs = self._per_group(hp["max_lr"], "max_lr")
        self.warmup = hp["warmup"]
        self.warmup_counter = 0
        self.verbose = hp["verbose"]
        self.smooth = hp["smooth"]
        self.window_size = hp["window_size"]
        self.reset_start = self.reset_start_original = hp["reset_start"]
        self.num_good_epochs = 0
        self._init_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        self._window: list[float] = []
        self._window_sum = 0.0

    def _per_group(self, value: float | list[float], field: str) -> list[float]:
        if isinstance(value, (list, tuple)):
            if len(value) != len(self.scales):
                raise ConfigError(
                    f"greedy: {field} has {len(value)} values for {len(self.scales)} param groups; "
                    "give one number or one per group.",
                    problems=[(field, "wrong length")],
                    target=self.name,
                )
            return [float(v) for v in value]
        return [float(value) * s for s in self.scales]

    def _smoothed(self, value: float) -> float:
        """Moving average over the last ``window_size`` values (a running sum,
        as transformers keeps it)."""
        self._window.append(value)
        self._window_sum += value
        if len(self._window) > self.window_size:
            self._window_sum -= self._window.pop(0)
        return self._window_sum / len(self._window)

    def step(self, metrics: SupportsFloat, epoch: int | None = None) -> None:  # type: ignore[override]
        """One evaluation: move the lr according to ``metrics``."""
        current = float(metrics)
        if self.smooth:
            current = self._smoothed(current)
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch

        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = self.num_good_epochs = 0
        elif self.warmup_counter > 0:
            self.warmup_counter -= 1
            self.num_bad_epochs = self.num_good_epochs = 0
        else:
            if self._is_better(current, self.best):
                self.best = current
                self.num_bad_epochs = 0
                self.num_good_epochs += 1
            else:
                self.num_bad_epochs += 1
                self.num_good_epochs = 0
            if self.num_good_epochs > self.patience:
                self._increase_lr(self.last_epoch)
                self.warmup_counter = self.warmup
                self.num_good_epochs = 0
            elif self.num_bad_epochs > self.patience:
                self._reduce_lr(self.last_epoch)
                self.cooldown_counter = self.cooldown
                self.num_bad_epochs = 0
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def _reduce_lr(self, epoch: int) -> None:
        all_at_min = True
        for i, group in enumerate(self.optimizer.param_groups):
            old_lr = float(group["lr"])
            new_lr = max(old_lr * self.factor, self.min_lrs[i])
            if old_lr - new_lr > self.eps * self.scales[i]:
                group["lr"] = new_lr
                if self.verbose:
                    print(f"Epoch {epoch}: reducing learning rate of group {i} to {new_lr:.4e}.")
            if group["lr"] > self.min_lrs[i]:
                all_at_min = False
        if all_at_min:
            self.reset_start -= 1
            if self.reset_start <= 0:
                self._restart()

    def _increase_lr(self, epoch: int) -> None:
        for i, group in enumerate(self.optimizer.param_groups):
            old_lr = float(group["lr"])
            new_lr = min(old_lr / self.factor, self.max_lrs[i])
            if new_lr - old_lr > self.eps * self.scales[i]:
                group["lr"] = new_lr
                if self.verbose:
                    print(f"Epoch {epoch}: increasing learning rate of group {i} to {new_lr:.4e}.")
        self.reset_start = self.reset_start_original

    def _restart(self) -> None:
        """Back to the initial lrs, best metric, counters and window."""
        write_lrs(self, list(self._init_lrs))
        self.best = self.mode_worse
        self.num_bad_epochs = self.num_good_epochs = 0
        self.cooldown_counter = self.warmup_counter = 0
        self.reset_start = self.reset_start_original
        self._window, self._window_sum = [], 0.0
        if self.verbose:
            print("Scheduler reset to initial state.")
