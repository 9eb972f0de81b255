"""The Trainer callback that gives ``trainer.optimizer`` the optcore contract.

Its own module because it subclasses transformers' ``TrainerCallback``:
:mod:`.hf` imports it (and transformers) only when ``hf.ContractCallback`` is
first asked for.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from .accelerate import with_contract


class ContractCallback(TrainerCallback):
    """``Trainer(..., callbacks=[hf.ContractCallback()])``: when training
    starts, after the Trainer wrapped the optimizer in accelerate's
    ``AcceleratedOptimizer``, that wrapper (``trainer.optimizer``) gets the
    contract of the optcore optimizer inside: ``get_lr``, ``set_lr``,
    ``clip_grad_norm``, ``step(scale=, groups=)``,
    ``load_state_dict(..., optimizer_overrides=)`` and the capability flags
    (:mod:`optcore.integrations.accelerate`). An optimizer optcore did not
    build is a :class:`~optcore.ConfigError` here, before the first step."""

    def on_train_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> None:
        if optimizer is not None:
            with_contract(optimizer)
