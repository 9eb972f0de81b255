"""The built-in named schedules, one module per family.

=====================  ==========================================================
module                 schedules
=====================  ==========================================================
:mod:`.constant`       ``constant``, ``constant_with_warmup``, ``pass_through``
:mod:`.polynomial`     ``linear``, ``polynomial``, ``inverse_sqrt``, ``polynomial_decay``
:mod:`.cosine`         ``cosine``, ``cosine_with_restarts``, ``cosine_with_min_lr``,
                       ``cosine_warmup_with_min_lr``
:mod:`.staged`         ``warmup_stable_decay``, ``tri_stage``
:mod:`.cyclic`         ``triangular``
:mod:`.piecewise`      ``step``, ``fixed``, ``manual``
:mod:`.metric`         ``greedy``
=====================  ==========================================================

``reduce_lr_on_plateau`` is ``torch.optim.lr_scheduler.ReduceLROnPlateau``
(as in transformers); the name resolves there. Each class carries its
``name``, ``config_schema`` (pydantic), ``needs_total``, ``total_field``,
``needs_metric``, ``decays`` and an ``example`` config, and its docstring gives
the formula. :data:`BUILTINS` is what the registry serves.
"""

from __future__ import annotations

from ._base import EpochSchedule, Schedule, base_lr
from .constant import ConstantSchedule, ConstantWithWarmupSchedule, PassThroughSchedule
from .cosine import CosineSchedule, CosineWarmupWithMinLRSchedule, CosineWithMinLRSchedule, CosineWithRestartsSchedule
from .cyclic import TriangularSchedule
from .metric import GreedyLR
from .piecewise import FixedSchedule, ManualSchedule, StepSchedule
from .polynomial import InverseSqrtSchedule, LinearSchedule, PolynomialDecaySchedule, PolynomialSchedule
from .staged import TriStageSchedule, WarmupStableDecaySchedule

#: The built-in schedules, transformers' names first, then fairseq's.
BUILTINS: tuple[type, ...] = (
    LinearSchedule,
    CosineSchedule,
    CosineWithRestartsSchedule,
    PolynomialSchedule,
    ConstantSchedule,
    ConstantWithWarmupSchedule,
    InverseSqrtSchedule,
    CosineWithMinLRSchedule,
    CosineWarmupWithMinLRSchedule,
    WarmupStableDecaySchedule,
    GreedyLR,
    TriStageSchedule,
    TriangularSchedule,
    FixedSchedule,
    PolynomialDecaySchedule,
    StepSchedule,
    ManualSchedule,
    PassThroughSchedule,
)

__all__ = [
    "BUILTINS",
    "ConstantSchedule",
    "ConstantWithWarmupSchedule",
    "CosineSchedule",
    "CosineWarmupWithMinLRSchedule",
    "CosineWithMinLRSchedule",
    "CosineWithRestartsSchedule",
    "EpochSchedule",
    "FixedSchedule",
    "GreedyLR",
    "InverseSqrtSchedule",
    "LinearSchedule",
    "ManualSchedule",
    "PassThroughSchedule",
    "PolynomialDecaySchedule",
    "PolynomialSchedule",
    "Schedule",
    "StepSchedule",
    "TriStageSchedule",
    "TriangularSchedule",
    "WarmupStableDecaySchedule",
    "base_lr",
]
