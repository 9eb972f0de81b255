"""What every built-in schedule shares: a multiplier of each group's initial lr.

A built-in schedule is a ``torch.optim.lr_scheduler.LRScheduler`` whose
:meth:`Schedule.factor` says which fraction of each param group's initial
learning rate to use after ``t`` optimizer steps::

    lr_g(t) = initial_lr_g * factor(t)

Three things follow, and are why the built-ins are written this way rather than
as ``LambdaLR`` closures:

- one factor multiplies every group, so layer-wise ratios (``lr_scale``) hold
  under every schedule;
- the factor is a closed form of the step count and of plain attributes, so
  torch's ``state_dict()`` (the scheduler's ``__dict__``) is all a resume
  needs, and it pickles;
- a schedule works with any ``torch.optim.Optimizer``.

References that speak in absolute learning rates (fairseq's
``end_learning_rate`` and ``max_lr``, transformers' ``lr_end`` and ``min_lr``)
are divided by the optimizer's base learning rate (:func:`base_lr`), as
``transformers`` does for ``lr_end``.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from .._errors import ConfigError
from .._fields import Flag as Flag  # re-exported: the schedule modules take the switch type from here
from .._fields import HParams, Numberish
from .._schema import validate_hparams

# Field types the schedule schemas share, so a key reads the same everywhere.
WarmupSteps = Annotated[
    int,
    Field(ge=0, description="steps of warm-up to the base lr (also accepted as num_warmup_steps)"),
    Numberish,
]
TrainingSteps = Annotated[
    int,
    Field(gt=0, description="total optimizer steps of the run (or pass num_training_steps= to build_scheduler)"),
    Numberish,
]
Steps = Annotated[int, Field(ge=0), Numberish]
PositiveSteps = Annotated[int, Field(gt=0), Numberish]
NonNegative = Annotated[float, Field(ge=0.0), Numberish]
Fraction = Annotated[float, Field(ge=0.0, le=1.0), Numberish]


def base_lr(optimizer: Optimizer, who: str) -> float:
    """The optimizer's base learning rate: ``defaults["lr"]`` (what
    ``transformers`` divides ``lr_end`` by), else the first group's lr divided
    by its ``lr_scale``."""
    lr: Any = optimizer.defaults.get("lr")
    if lr is None and optimizer.param_groups:
        group = optimizer.param_groups[0]
        lr = group.get("initial_lr", group.get("lr"))
        if isinstance(lr, (int, float, Tensor)):
            lr = float(lr) / float(group.get("lr_scale", 1.0) or 1.0)
    if isinstance(lr, Tensor):
        lr = float(lr)
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or lr <= 0:
        raise ConfigError(
            f"{who} is given in absolute learning rates and needs the optimizer's base lr, but "
            f"{type(optimizer).__name__} has lr={lr!r}. Give the optimizer a positive lr.",
            problems=[("lr", f"optimizer lr is {lr!r}")],
            target=who,
        )
    return float(lr)


def write_lrs(scheduler: LRScheduler, values: list[Any]) -> None:
    """Write ``values`` into the optimizer's groups (in place for tensor lrs)
    and remember them as the last lrs, as ``LRScheduler.step`` does."""
    for group, lr in zip(scheduler.optimizer.param_groups, values, strict=True):
        if isinstance(group["lr"], Tensor):
            group["lr"].fill_(float(lr))
        else:
            group["lr"] = lr
    scheduler._last_lr = [  # type: ignore[attr-defined]
        g["lr"].clone() if isinstance(g["lr"], Tensor) else g["lr"] for g in scheduler.optimizer.param_groups
    ]


class Schedule(LRScheduler):
    """Base class of the built-in schedules: ``lr_g(t) = initial_lr_g * factor(t)``.

    Subclasses set the class attributes below (read by the registry, the CLI,
    the docs generator and the shared tests) and implement :meth:`factor`.
    Every attribute a subclass sets in ``__init__`` is saved by
    ``state_dict()``, so keep them plain data.
    """

    #: the name it is built by (``{"type": name}``)
    name: ClassVar[str] = ""
    #: the pydantic model of its hyper-parameters
    config_schema: ClassVar[type[HParams]]
    #: it cannot be built without the total number of steps
    needs_total: ClassVar[bool] = False
    #: which field holds the total number of steps (filled from ``num_training_steps``)
    total_field: ClassVar[str | None] = None
    #: ``step(metric)`` drives it
    needs_metric: ClassVar[bool] = False
    #: it lowers the lr over time (warns with schedule-free optimizers)
    decays: ClassVar[bool] = True
    #: a config used by the docs plots and the shared tests
    example: ClassVar[dict[str, Any]] = {}

    @classmethod
    def _validate(cls, **values: Any) -> dict[str, Any]:
        """Validate constructor arguments with the schema, so that building a
        schedule directly rejects bad values the way a config does."""
        return validate_hparams(cls.config_schema, values, cls.name)

    def factor(self, step: int) -> float:
        """The multiplier of each group's initial lr after ``step`` steps."""
        raise NotImplementedError

    def get_lr(self) -> list[float | Tensor]:
        factor = self.factor(self.last_epoch)
        return [base * factor for base in self.base_lrs]

    def _get_closed_form_lr(self) -> list[float | Tensor]:
        return self.get_lr()


class EpochSchedule(Schedule):
    """A schedule that also changes at epoch boundaries (fairseq's
    ``step_begin_epoch``): ``factor`` may read ``self.epoch`` (1-based, as in
    fairseq), which :meth:`step_begin_epoch` sets."""

    epoch: int = 1

    def step_begin_epoch(self, epoch: int | None = None) -> list[float | Tensor]:
        """Start epoch ``epoch`` (default: the next one) and apply its lr now.

        Call it at the start of every epoch, as fairseq's trainer does;
        :meth:`step` after every optimizer step as usual.
        """
        self.epoch = self.epoch + 1 if epoch is None else int(epoch)
        write_lrs(self, self.get_lr())
        return self.get_last_lr()
