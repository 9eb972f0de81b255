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
from typing import Any

import torch

from optcore import validate_hparams

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
        min_loss_scale: reaching it raises ``FloatingPointError``: the loss is
            diverging and no scale will help.
        update_freq: gradient-accumulation steps (only for the default window).

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
        self.loss_scale: float = float(self.init_scale)
        self.skipped_steps = 0
        self._iter = 0
        self._last_overflow_iter = -1
        self._last_rescale_iter = -1
        self._overflows_since_rescale = 0

    @classmethod
    def from_config(cls, config: LossScalerConfig | dict[str, Any] | None) -> DynamicLossScaler:
        if config is None:
            return cls()
        values = config.model_dump() if isinstance(config, LossScalerConfig) else dict(config)
        return cls(**values)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * loss_scale``, computed in fp32 so the product cannot overflow fp16."""
        return loss.float() * self.loss_scale

    def update(self, overflow: bool) -> None:
        """Account for one step: ``overflow`` means it was skipped."""
        if overflow:
            self._on_overflow()
            return
        # scale_window clean steps since the last overflow (or the start): grow.
        if (self._iter - self._last_overflow_iter) % self.scale_window == 0:
            self.loss_scale *= self.scale_factor
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
            raise FloatingPointError(
                f"Minimum loss scale reached ({self.min_loss_scale:g}) after {self.skipped_steps + 1} skipped steps: "
                "the gradients overflow at every scale, so the loss is probably diverging (NaN/inf in the forward "
                "pass, or exploding). Lower the learning rate, clip gradients, increase the batch size, or check "
                "the data and the model for NaNs."
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
            "scale_factor": self.scale_factor,
            "scale_window": self.scale_window,
            "tolerance": self.tolerance,
            "threshold": self.threshold,
            "min_loss_scale": self.min_loss_scale,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the scale and the counters; the configuration stays as
        constructed (so a resumed run may change ``scale_window`` and the like)."""
        missing = [k for k in _DYNAMIC_KEYS if k not in state]
        if missing:
            raise KeyError(f"loss scaler state lacks {missing}; it is not from DynamicLossScaler.state_dict()")
        self.loss_scale = float(state["loss_scale"])
        self._iter = int(state["iter"])
        self._last_overflow_iter = int(state["last_overflow_iter"])
        self._last_rescale_iter = int(state["last_rescale_iter"])
        self._overflows_since_rescale = int(state["overflows_since_rescale"])
        self.skipped_steps = int(state["skipped_steps"])

    def __repr__(self) -> str:
        return (
            f"DynamicLossScaler(loss_scale={self.loss_scale:g}, scale_factor={self.scale_factor:g}, "
            f"scale_window={self.scale_window}, tolerance={self.tolerance:g}, threshold={self.threshold}, "
            f"min_loss_scale={self.min_loss_scale:g}, skipped_steps={self.skipped_steps})"
        )
