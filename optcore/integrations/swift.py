"""ms-swift: ``--optimizer optcore`` builds the optimizer named in ``--optim_args``.

swift picks its optimizer through ``swift.optimizers.optimizers_map``: the
name given as ``--optimizer NAME`` maps to an ``OptimizerCallback`` subclass
that swift's Trainer constructs as ``callback(args, trainer)`` and asks for
``create_optimizer(model=None)`` and ``create_scheduler(num_training_steps,
optimizer)``. :func:`register` adds optcore's callback under ``"optcore"``;
then::

    swift sft ... --external_plugins examples/swift_plugin.py \\
        --optimizer optcore --optim_args "type=Lion,lr=3e-4,betas=(0.9, 0.99)"

``--optim_args`` is the optcore optimizer config in Hugging Face's
``key=value`` form (parsed safely: tuples in parentheses, nothing
``eval``-ed); a ``type`` is required. As with
:mod:`optcore.integrations.hf`, **the config wins**: optcore's param groups
(no weight decay on biases and norm weights) and the config's ``lr`` /
``weight_decay`` apply, and swift's ``--learning_rate`` / ``--weight_decay``
do not (a warning names them when they were set). The schedule is swift's
own (``--lr_scheduler_type``, ``--warmup_ratio``), except for optimizers
that compute their own step size (relative-step Adafactor), which get
:class:`~optcore.integrations.hf.AppliedLR` so the logged lr is the applied one.

swift is imported only by :func:`register`.
"""

from __future__ import annotations

from typing import Any

import torch

from .._build import build_optimizer
from .._errors import ConfigError
from .._literals import parse_optim_args
from .hf import AppliedLR, _warn_unused_training_args

__all__ = ["NAME", "callback_class", "config_from_optim_args", "register"]

#: The ``--optimizer`` name.
NAME = "optcore"

_CALLBACK: type | None = None


def config_from_optim_args(optim_args: str | None) -> dict[str, Any]:
    """``"type=Lion,lr=3e-4,betas=(0.9, 0.99)"`` -> the optcore optimizer config."""
    config = parse_optim_args(optim_args or "")
    if "type" not in config:
        raise ConfigError(
            "--optimizer optcore needs the optimizer in --optim_args, e.g. "
            '--optim_args "type=Lion,lr=3e-4,betas=(0.9, 0.99)" (`optcore list` shows the names).',
            problems=[("type", "missing from --optim_args")],
        )
    return config


def callback_class() -> type:
    """optcore's subclass of swift's ``OptimizerCallback`` (made on first use,
    since it needs swift)."""
    global _CALLBACK
    if _CALLBACK is None:
        from swift.optimizers import OptimizerCallback

        class OptcoreOptimizerCallback(OptimizerCallback):  # type: ignore[misc, valid-type]
            """Builds the ``--optim_args`` config with optcore; swift's schedule."""

            def create_optimizer(self, model: Any = None) -> torch.optim.Optimizer:
                model = model if model is not None else self.trainer.model
                optimizer = build_optimizer(config_from_optim_args(self.args.optim_args), model)
                _warn_unused_training_args(self.args, optimizer, ignore=("optim_args",))
                return optimizer

            def create_scheduler(self, num_training_steps: int, optimizer: Any) -> Any:
                if optimizer is not None and any(g.get("lr") is None for g in optimizer.param_groups):
                    scheduler = AppliedLR(optimizer)
                    self.trainer.lr_scheduler = scheduler
                    return scheduler
                return super().create_scheduler(num_training_steps, optimizer)

        _CALLBACK = OptcoreOptimizerCallback
    return _CALLBACK


def register(name: str = NAME) -> type:
    """Add optcore to swift's ``optimizers_map`` as ``--optimizer name``;
    returns the callback class. Calling it again changes nothing."""
    from swift.optimizers import optimizers_map

    cls = callback_class()
    existing = optimizers_map.get(name)
    if existing is not None and existing is not cls:
        raise ConfigError(
            f"swift already has an optimizer named {name!r} ({existing.__qualname__}): register optcore "
            "under another name, e.g. register('optcore2'), and pass --optimizer with it."
        )
    optimizers_map[name] = cls
    return cls
