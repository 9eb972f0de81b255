"""Three-stage schedules (warm-up, hold, decay): transformers'
``warmup_stable_decay`` and fairseq's ``tri_stage``."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator
from torch.optim import Optimizer

from .._errors import ConfigError, warn_user
from .._fields import HParams, Literalish
from ._base import Fraction, PositiveSteps, Schedule, Steps, WarmupSteps
from .cosine import cosine_wave

Shape = Annotated[Literal["linear", "cosine", "1-sqrt"], Literalish]


class WarmupStableDecayConfig(HParams):
    warmup_steps: WarmupSteps = 0
    num_decay_steps: Annotated[int, Field(ge=0, description="steps of the final decay"), Literalish]
    num_training_steps: Annotated[
        PositiveSteps | None, Field(description="total steps; the stable phase fills what the others leave"), Literalish
    ] = None
    num_stable_steps: Annotated[
        Steps | None, Field(description="steps at the base lr (default: the rest of num_training_steps)"), Literalish
    ] = None
    warmup_type: Shape = "linear"
    decay_type: Shape = "cosine"
    min_lr_ratio: Annotated[Fraction, Field(description="floor of warm-up and decay, as a fraction of the base lr")] = (
        0.0
    )
    num_cycles: Annotated[float, Field(ge=0.0, description="cosine waves of a cosine decay"), Literalish] = 0.5

    @model_validator(mode="after")
    def _length(self) -> WarmupStableDecayConfig:
        if self.num_training_steps is None and self.num_stable_steps is None:
            raise ValueError("give num_training_steps (or pass it to build_scheduler) or num_stable_steps")
        return self


class WarmupStableDecaySchedule(Schedule):
    """Warm-up, a long stable phase at the base lr, then a decay
    (transformers' ``warmup_stable_decay``, "WSD").

    With ``W = warmup_steps``, ``S = num_stable_steps`` (default
    ``T - W - D``), ``D = num_decay_steps``, ``m = min_lr_ratio``, and
    ``shape`` one of ``linear: x``, ``cosine: (1 - cos(pi x)) / 2``,
    ``1-sqrt: 1 - sqrt(1 - x)`` (the decay uses ``1 - shape(1 - x)``,
    cosine with ``num_cycles``)::

        factor(t) = max(0, m + (1 - m) shape_w(t / max(1, W)))        if t < W
                    1                                                 if t < W + S
                    max(0, m + (1 - m) shape_d((t - W - S) / max(1, D)))   if t < W + S + D
                    m                                                 otherwise
    """

    name = "warmup_stable_decay"
    config_schema = WarmupStableDecayConfig
    total_field = "num_training_steps"
    example: ClassVar[dict[str, Any]] = {
        "warmup_steps": 100,
        "num_decay_steps": 200,
        "min_lr_ratio": 0.1,
    }

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        num_decay_steps: int,
        warmup_steps: int = 0,
        num_training_steps: int | None = None,
        num_stable_steps: int | None = None,
        warmup_type: str = "linear",
        decay_type: str = "cosine",
        min_lr_ratio: float = 0.0,
        num_cycles: float = 0.5,
        last_epoch: int = -1,
    ) -> None:
        hp = self._validate(
            warmup_steps=warmup_steps,
            num_decay_steps=num_decay_steps,
            num_training_steps=num_training_steps,
            num_stable_steps=num_stable_steps,
            warmup_type=warmup_type,
            decay_type=decay_type,
            min_lr_ratio=min_lr_ratio,
            num_cycles=num_cycles,
        )
        if hp["num_training_steps"] is not None and hp["num_stable_steps"] is not None:
            warn_user(
                "warmup_stable_decay: both num_training_steps and num_stable_steps are given; "
                "num_stable_steps is used (as in transformers).", UserWarning)
        stable = hp["num_stable_steps"]
        if stable is None:
            stable = hp["num_training_steps"] - hp["warmup_steps"] - hp["num_decay_steps"]
            if stable < 0:
                raise ConfigError(
                    f"warmup_stable_decay: warmup_steps ({hp['warmup_steps']}) + num_decay_steps "
                    f"({hp['num_decay_steps']}) exceed num_training_steps ({hp['num_training_steps']}).",
                    problems=[("num_decay_steps", "longer than the run")],
                    target=self.name,
                )
        self.warmup_steps = hp["warmup_steps"]
        self.num_stable_steps = stable
        self.num_decay_steps = hp["num_decay_steps"]
        self.warmup_type = hp["warmup_type"]
        self.decay_type = hp["decay_type"]
        self.min_lr_ratio = hp["min_lr_ratio"]
        self.num_cycles = hp["num_cycles"]
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        w, s, d, m = self.warmup_steps, self.num_stable_steps, self.num_decay_steps, self.min_lr_ratio
        if step < w:
            progress = float(step) / float(max(1, w))
            if self.warmup_type == "linear":
                factor = progress
            elif self.warmup_type == "cosine":
                factor = cosine_wave(1.0 - progress, 0.5)  # the half-wave decay, run backwards
            else:  # "1-sqrt"
                factor = 1.0 - math.sqrt(1.0 - progress)
            return max(0.0, factor * (1.0 - m) + m)
        if step < w + s:
            return 1.0
        if step < w + s + d:
            progress = float(step - w - s) / float(max(1, d))
            if self.decay_type == "linear":
                factor = 1.0 - progress
            elif self.decay_type == "cosine":
                factor = cosine_wave(progress, self.num_cycles)
            else:  # "1-sqrt"
                factor = 1.0 - math.sqrt(progress)
            return max(0.0, factor * (1.0 - m) + m)
        return m


class TriStageConfig(HParams):
    warmup_steps: WarmupSteps = 0
    hold_steps: Annotated[int, Field(ge=0, description="steps at the peak lr"), Literalish] = 0
    decay_steps: Annotated[int, Field(ge=0, description="steps of exponential decay"), Literalish] = 0
    phase_ratio: Annotated[
        tuple[Fraction, Fraction, Fraction] | None,
        Field(description="(warm-up, hold, decay) as fractions of max_update; replaces the three step counts"),
        Literalish,
    ] = None
    init_lr_scale: Annotated[float, Field(ge=0.0, description="first warm-up lr, times the peak lr"), Literalish] = 0.01
    final_lr_scale: Annotated[float, Field(gt=0.0, description="final lr, times the peak lr"), Literalish] = 0.01
    max_update: Annotated[
        PositiveSteps | None, Field(description="total updates, for phase_ratio (num_training_steps)")
    ] = None

    @model_validator(mode="after")
    def _phases(self) -> TriStageConfig:
        if self.phase_ratio is not None:
            if self.max_update is None:
                raise ValueError("phase_ratio needs max_update (or num_training_steps)")
            if not math.isclose(sum(self.phase_ratio), 1.0, abs_tol=1e-9):
                raise ValueError(f"phase_ratio must add up to 1, got {self.phase_ratio}")
        return self


class TriStageSchedule(Schedule):
    """Linear warm-up from ``init_lr_scale`` times the peak lr, hold, then
    exponential decay to ``final_lr_scale`` times it, where it stays (fairseq's
    ``tri_stage``, from SpecAugment, arXiv:1904.08779).

    With ``W, H, D`` the warm-up, hold and decay steps (or
    ``int(max_update * phase_ratio[i])``), ``a = init_lr_scale``,
    ``f = final_lr_scale``::

        factor(t) = a + (1 - a) t / W                    if t < W
                    1                                    if t < W + H
                    exp(log(f) (t - W - H) / D)          if t <= W + H + D
                    f                                    otherwise
    """

    name = "tri_stage"
    config_schema = TriStageConfig
    total_field = "max_update"
    example: ClassVar[dict[str, Any]] = {"phase_ratio": (0.1, 0.4, 0.5)}

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        warmup_steps: int = 0,
        hold_steps: int = 0,
        decay_steps: int = 0,
        phase_ratio: tuple[float, float, float] | None = None,
        init_lr_scale: float = 0.01,
        final_lr_scale: float = 0.01,
        max_update: int | None = None,
        last_epoch: int = -1,
    ) -> None:
        hp = self._validate(
            warmup_steps=warmup_steps,
            hold_steps=hold_steps,
            decay_steps=decay_steps,
            phase_ratio=phase_ratio,
            init_lr_scale=init_lr_scale,
            final_lr_scale=final_lr_scale,
            max_update=max_update,
        )
        if hp["phase_ratio"] is not None:
            total, ratio = hp["max_update"], hp["phase_ratio"]
            self.warmup_steps = int(total * ratio[0])
            self.hold_steps = int(total * ratio[1])
            self.decay_steps = int(total * ratio[2])
        else:
            self.warmup_steps, self.hold_steps, self.decay_steps = (
                hp["warmup_steps"],
                hp["hold_steps"],
                hp["decay_steps"],
            )
        if self.decay_steps <= 0:
            raise ConfigError(
                "tri_stage needs a decay phase: give decay_steps > 0, or phase_ratio with max_update.",
                problems=[("decay_steps", "must be > 0")],
                target=self.name,
            )
        self.init_lr_scale = hp["init_lr_scale"]
        self.final_lr_scale = hp["final_lr_scale"]
        self.decay_factor = -math.log(self.final_lr_scale) / self.decay_steps
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        w, h, d = self.warmup_steps, self.hold_steps, self.decay_steps
        if step < w:
            return self.init_lr_scale + (1.0 - self.init_lr_scale) / w * step
        if step < w + h:
            return 1.0
        if step <= w + h + d:
            return math.exp(-self.decay_factor * (step - w - h))
        return self.final_lr_scale


__all__ = ["TriStageSchedule", "WarmupStableDecaySchedule"]
