"""Dynamic loss scaling with fairseq's semantics.

fp16 has 5 exponent bits: small gradients underflow to zero. Multiplying the
loss by a large ``loss_scale`` before ``backward`` shifts the gradients into
range; the optimizer divides it out again. Too large a scale overflows (inf or
NaN gradients): that step is skipped and the scale lowered. After
``scale_window`` clean steps in a row the scale is raised again, so it hovers
just below the overflow point.

The scaler only keeps the arithmetic; the wrappers decide when a step
overflowed (they check the gradients themselves, whether or not the caller
clips them) and call :meth:`DynamicLossScaler.update`.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections import deque
from typing import Any

import torch

from optcore import ConfigError, StepError
from optcore.plugin import validate_hparams

from .schemas import LossScalerConfig

logger = logging.getLogger(__name__)

#: Keys of the state dict that change during training (the rest is config).
_DYNAMIC_KEYS = (
    "loss_scale",
    "iter",
    "last_overflow_iter",
    "last_rescale_iter",
    "overflows_since_rescale",
    "skipped_steps",
)


#: Steps the error at the minimum looks back over to say how often the gradients overflowed.
HISTORY = 100


class MinimumLossScaleError(StepError, FloatingPointError):
    """The loss scale fell to ``min_loss_scale``: the gradients keep overflowing.

    The contract's :class:`optcore.StepError` (a step that cannot run on what
    it was given: the overflowed step is skipped, the scaler's state left as it
    was) and a :class:`FloatingPointError` (what fairseq raises, and what
    training loops catch to stop). Carries what was measured: ``overflows`` of
    the last ``recent`` steps overflowed, ``skipped_steps`` of ``steps`` in
    all, and the ``loss_scale`` reached.
    """

    def __init__(self, *, min_loss_scale: float, loss_scale: float, init_scale: float, overflows: int,
                 recent: int, skipped_steps: int, steps: int) -> None:
        self.min_loss_scale = min_loss_scale
        self.loss_scale = loss_scale
        self.overflows = overflows
        self.recent = recent
        self.skipped_steps = skipped_steps
        self.steps = steps
        super().__init__(
            f"Minimum loss scale reached: lowering the scale from {loss_scale:g} would take it to or below "
            f"min_loss_scale={min_loss_scale:g} (it started at {init_scale:g}). The gradients overflowed (inf/NaN) "
            f"on {overflows} of the last {recent} steps ({skipped_steps} of {steps} steps skipped in all), so the "
            "loss is probably diverging (NaN/inf in the forward pass, or exploding). Lower the learning rate, clip "
            "gradients, increase the batch size, or check the data and the model for NaNs."
        )


def default_scale_window(update_freq: int = 1) -> int:
    """fairseq's default: ``2**14 / world_size / update_freq`` clean steps, so
    the scale grows after the same number of *samples* whatever the batch layout."""
    dist = torch.distributed
    world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return max(1, int(2**14 / world_size / update_freq))


class DynamicLossScaler:
    """Scale the loss, lower the scale on overflow, raise it after clean windows.

    Args:
        init_scale: loss scale at the start (fairseq: 2**7).
        scale_factor: divide by this on overflow, multiply after ``scale_window``
            clean steps.
        scale_window: clean steps in a row before the scale grows; ``None`` gives
            ``2**14 / world_size / update_freq``.
        tolerance: lower the scale only when the fraction of overflowing steps
            since the last rescale reaches this (0: on every overflow).
        threshold: the scale never goes below this; it must not exceed
            ``min_loss_scale`` (otherwise the minimum is unreachable and
            overflowing steps would be skipped forever: a ConfigError).
        threshold: the scale never goes below this (fairseq's
            ``threshold_loss_scale``). Above ``min_loss_scale`` the minimum is then
            unreachable, so once the scale sits at the threshold every overflowing
            step is skipped and training never stops: accepted, as fairseq does,
            with a warning.
        min_loss_scale: a scale that would fall to this raises
            :class:`MinimumLossScaleError` (a ``FloatingPointError``): the loss is
            diverging and no scale will help. ``init_scale`` at or below it is
            accepted (fairseq's semantics): the first overflow then stops training.
        update_freq: gradient-accumulation steps (only for the default window).
        grad_dtype: the dtype of the gradients the scaled loss produces. The
            scale never grows past ``torch.finfo(grad_dtype).max``: the gradient
            of the loss with respect to itself *is* the scale, so a larger one is
            inf in that dtype and every step would overflow (torch's GradScaler
            likewise keeps its fp32 scale finite). The wrappers set it from the
            model's parameters; fp16 (65504) by default.

    ``loss_scale`` is the current scale, ``skipped_steps`` the number of steps
    skipped for overflow so far; both travel in :meth:`state_dict`.
    """

    def __init__(
        self,
        init_scale: float = 2.0**7,
        scale_factor: float = 2.0,
        scale_window: int | None = None,
        tolerance: float = 0.0,
        threshold: float | None = None,
        min_loss_scale: float = 1e-4,
        update_freq: int = 1,
        grad_dtype: torch.dtype = torch.float16,
    ) -> None:
        cfg = validate_hparams(
            LossScalerConfig,
            {
                "init_scale": init_scale,
                "scale_factor": scale_factor,
                "scale_window": scale_window,
                "tolerance": tolerance,
                "threshold": threshold,
                "min_loss_scale": min_loss_scale,
                "update_freq": update_freq,
            },
            "DynamicLossScaler",
        )
        self.init_scale: float = cfg["init_scale"]
        self.scale_factor: float = cfg["scale_factor"]
        self.scale_window: int = cfg["scale_window"] or default_scale_window(cfg["update_freq"])
        self.tolerance: float = cfg["tolerance"]
        self.threshold: float | None = cfg["threshold"]
        self.min_loss_scale: float = cfg["min_loss_scale"]
        if self.threshold is not None and self.threshold > self.min_loss_scale:
            warnings.warn(
                f"DynamicLossScaler: threshold={self.threshold:g} is above min_loss_scale={self.min_loss_scale:g}, "
                f"so the scale stops at {self.threshold:g} and never reaches the minimum: if the gradients keep "
                "overflowing there, every step is skipped and training does not stop. Set min_loss_scale >= "
                "threshold to stop with an error instead (fairseq accepts this setting too).",
                stacklevel=2,
            )
        self.loss_scale: float = float(self.init_scale)
        self.max_loss_scale = math.inf
        self.limit_to(grad_dtype)
        self.skipped_steps = 0
        self._recent: deque[bool] = deque(maxlen=HISTORY)
        self._iter = 0
        self._last_overflow_iter = -1
        self._last_rescale_iter = -1
        self._overflows_since_rescale = 0

    def limit_to(self, grad_dtype: torch.dtype) -> None:
        """Cap the scale at the largest value ``grad_dtype`` holds (see ``grad_dtype``);
        a larger current scale is lowered by ``scale_factor`` until it fits."""
        self.max_loss_scale = float(torch.finfo(grad_dtype).max)
        if self.loss_scale > self.max_loss_scale:
            start = self.loss_scale
            while self.loss_scale > self.max_loss_scale:
                self.loss_scale /= self.scale_factor
            warnings.warn(
                f"DynamicLossScaler: a loss scale of {start:g} is not representable in {grad_dtype} (max "
                f"{self.max_loss_scale:g}), so every step would overflow; starting at {self.loss_scale:g} instead.",
                stacklevel=3,
            )

    @classmethod
    def from_config(cls, config: LossScalerConfig | dict[str, Any] | None) -> DynamicLossScaler:
        if config is None:
            return cls()
        if isinstance(config, LossScalerConfig):
            return cls(**config.model_dump())
        # validated here first, so fairseq's names (fp16_init_scale, ...) map to the fields
        return cls(**validate_hparams(LossScalerConfig, dict(config), "DynamicLossScaler"))

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * loss_scale``, computed in fp32 so the product cannot overflow fp16."""
        return loss.float() * self.loss_scale

    def update(self, overflow: bool) -> None:
        """Account for one step: ``overflow`` means it was skipped."""
        if overflow:
            self._on_overflow()
            self._recent.append(True)  # after _on_overflow: a raise there leaves the state as it was
            return
        self._recent.append(False)
        # scale_window clean steps since the last overflow (or the start): grow,
        # unless the grown scale would not be representable in the gradients' dtype.
        if (self._iter - self._last_overflow_iter) % self.scale_window == 0:
            grown = self.loss_scale * self.scale_factor
            if grown <= self.max_loss_scale:
                self.loss_scale = grown
                self._last_rescale_iter = self._iter
        self._iter += 1

    def _on_overflow(self) -> None:
        new_scale = self.loss_scale
        overflows = self._overflows_since_rescale + 1
        rescale = overflows / float(self._iter - self._last_rescale_iter) >= self.tolerance
        if rescale:
            new_scale = self.loss_scale / self.scale_factor
            if self.threshold is not None:
                new_scale = max(new_scale, self.threshold)
        if new_scale <= self.min_loss_scale:
            recent = [*self._recent, True][-HISTORY:]
            raise MinimumLossScaleError(
                min_loss_scale=self.min_loss_scale, loss_scale=self.loss_scale, init_scale=self.init_scale,
                overflows=sum(recent), recent=len(recent), skipped_steps=self.skipped_steps + 1,
                steps=self._iter + 1,
            )
        self.skipped_steps += 1
        self._last_overflow_iter = self._iter
        if rescale:
            self.loss_scale = new_scale
            self._last_rescale_iter = self._iter
            self._overflows_since_rescale = 0
        else:
            self._overflows_since_rescale = overflows
        self._iter += 1
        logger.info("gradient overflow: step skipped, loss scale now %g", self.loss_scale)

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Plain Python numbers only, so ``torch.load(weights_only=True)`` reads it."""
        return {
            "loss_scale": self.loss_scale,
            "iter": self._iter,
            "last_overflow_iter": self._last_overflow_iter,
            "last_rescale_iter": self._last_rescale_iter,
            "overflows_since_rescale": self._overflows_since_rescale,
            "skipped_steps": self.skipped_steps,
            "recent_overflows": [int(o) for o in self._recent],
            "scale_factor": self.scale_factor,
            "scale_window": self.scale_window,
            "tolerance": self.tolerance,
            "threshold": self.threshold,
            "min_loss_scale": self.min_loss_scale,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the scale and the counters; the configuration stays as
        constructed (so a resumed run may change ``scale_window`` and the like)."""
        values, recent = self.parse_state(state)
        self.loss_scale = values["loss_scale"]
        self._iter = values["iter"]
        self._last_overflow_iter = values["last_overflow_iter"]
        self._last_rescale_iter = values["last_rescale_iter"]
        self._overflows_since_rescale = values["overflows_since_rescale"]
        self.skipped_steps = values["skipped_steps"]
        self._recent = deque(recent, maxlen=HISTORY)

    @staticmethod
    def parse_state(state: Any) -> tuple[dict[str, Any], list[bool]]:
        """What :meth:`load_state_dict` restores, or a ConfigError (before anything
        changes): a NaN or non-positive scale would turn every step into a skip."""
        missing = [k for k in _DYNAMIC_KEYS if k not in state] if isinstance(state, dict) else list(_DYNAMIC_KEYS)
        try:
            if missing:
                raise ValueError(f"it lacks {missing}")
            values = {k: _count(k, state[k]) if k != "loss_scale" else float(state[k]) for k in _DYNAMIC_KEYS}
            recent = state.get("recent_overflows", ())
            if not isinstance(recent, (list, tuple)) or len(recent) > 16 * HISTORY:
                raise ValueError(f"its recent_overflows is a {type(recent).__name__} of {len(recent)}, not a short list")
            recent = [bool(o) for o in recent][-HISTORY:]
            if not math.isfinite(values["loss_scale"]) or values["loss_scale"] <= 0:
                raise ValueError(f"its loss_scale is {values['loss_scale']}, not a finite number > 0")
            steps = values["iter"]
            for key, low in (("last_overflow_iter", -1), ("last_rescale_iter", -1), ("overflows_since_rescale", 0),
                             ("skipped_steps", 0)):
                if not low <= values[key] <= steps:
                    raise ValueError(f"its {key} is {values[key]}, not between {low} and iter ({steps})")
        except (TypeError, ValueError, OverflowError) as exc:
            raise ConfigError(
                f"The loss scaler state cannot be loaded: {repr(str(exc)[:200])[1:-1]}. It is not from "
                "DynamicLossScaler.state_dict(), or it was edited; load the checkpoint as it was saved.",
                problems=[("loss_scaler", "bad state")],
            ) from None
        return values, recent

    def __repr__(self) -> str:
        return (
            f"DynamicLossScaler(loss_scale={self.loss_scale:g}, scale_factor={self.scale_factor:g}, "
            f"scale_window={self.scale_window}, tolerance={self.tolerance:g}, threshold={self.threshold}, "
            f"min_loss_scale={self.min_loss_scale:g}, skipped_steps={self.skipped_steps})"
        )


def _count(key: str, value: Any) -> int:
    """A counter of the loss scaler's state: a whole number (``iter`` >= 0), not
    a fraction that ``int()`` would cut, nor a flag."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value != int(value):
        raise ValueError(f"its {key} is {value!r:.40}, not a whole number")
    if key == "iter" and value < 0:
        raise ValueError(f"its iter is {value}, not a step count >= 0")
    return int(value)
