"""PyTorch Lightning: ``configure_optimizers`` from an optcore config, in one line.

::

    class Model(pl.LightningModule):
        def configure_optimizers(self):
            return optcore.integrations.lightning.configure_optimizers(self, self.hparams.optim)

:func:`configure_optimizers` returns the dict Lightning takes:
``{"optimizer": ..., "lr_scheduler": {"scheduler": ..., "interval": "step"}}``.
``"interval": "step"`` because optcore's named schedules (``cosine``,
``linear``, ...) count optimizer steps, as transformers' do; Lightning's
default would step them once an epoch. Their length is
``trainer.estimated_stepping_batches`` (max_steps, or epochs x batches
/ gradient accumulation), unless the config says ``num_training_steps``.

Lightning hands ``self.optimizers()`` out as a ``LightningOptimizer``, which
forwards ``step``/``zero_grad`` only; ``optcore.unwrap(self.optimizers())``
is the optcore optimizer, with ``get_lr()``, ``clip_grad_norm()`` and the rest
of the contract. Lightning itself is not imported here: the module and its
trainer are duck-typed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .._build import build
from .._config import to_plain
from .._errors import ConfigError
from .hf import AppliedLR

__all__ = ["configure_optimizers"]


def configure_optimizers(module: Any, config: Any, *, monitor: str | None = None) -> dict[str, Any]:
    """What ``LightningModule.configure_optimizers`` returns, built by optcore.

    ``config`` is ``{"optimizer": {...}, "lr_scheduler": {...}}`` or an
    optimizer config alone. ``monitor`` names the logged metric for a
    ``ReduceLROnPlateau`` schedule.
    """
    plain = to_plain(config)
    if isinstance(plain, str) or (isinstance(plain, Mapping) and "type" in plain):
        plain = {"optimizer": plain}
    if not isinstance(plain, Mapping):
        raise ConfigError(f"an optcore config is a mapping, not {type(plain).__name__}")
    steps = plain.get("num_training_steps")
    if steps is None and plain.get("lr_scheduler") is not None:
        steps = _stepping_batches(module)
    optimizer, scheduler = build(plain, module, num_training_steps=steps)
    if scheduler is None and any(g.get("lr") is None for g in optimizer.param_groups):
        scheduler = AppliedLR(optimizer)  # relative-step Adafactor: LearningRateMonitor reads the applied lr
    if scheduler is None:
        return {"optimizer": optimizer}
    schedule: dict[str, Any] = {"scheduler": scheduler, "interval": "step", "frequency": 1}
    if monitor is not None:
        schedule["monitor"] = monitor
    return {"optimizer": optimizer, "lr_scheduler": schedule}


def _stepping_batches(module: Any) -> int:
    trainer = getattr(module, "trainer", None)
    total = getattr(trainer, "estimated_stepping_batches", None) if trainer is not None else None
    if total is None or not math.isfinite(total):
        raise ConfigError(
            "the schedule needs the number of training steps, and Lightning cannot estimate it here "
            f"(estimated_stepping_batches={total}): set Trainer(max_steps=...), or num_training_steps "
            "in the optcore config.",
            problems=[("num_training_steps", "unknown")],
        )
    return int(total)
