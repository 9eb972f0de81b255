"""MemoryEfficientFP16Optimizer: half-precision training without a master copy.

FP16Optimizer spends 4 bytes per parameter on an fp32 copy (plus 4 on its
gradient). An optimizer that ``supports_memory_efficient_fp16`` instead steps
the fp16/bf16 parameters in place, doing its arithmetic in fp32 and keeping fp32
state (Lion, Adafactor). This wrapper adds only the loss scaling and the
overflow-skipping around it: ``backward`` scales the loss, ``step`` skips
overflowing steps and hands the loss scale to the inner step as ``scale``.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain
from typing import Any, ClassVar

import torch
from torch import Tensor

import optcore
from optcore import ConfigError
from optcore.plugin import validate_hparams

from ._wrapper import PrecisionWrapper, check_inner_state, non_finite
from .loss_scaler import DynamicLossScaler
from .schemas import LossScalerConfig, MemoryEfficientFP16OptimizerConfig


class MemoryEfficientFP16Optimizer(PrecisionWrapper):
    """Loss scaling around an optimizer that steps half-precision parameters itself.

    Args:
        optimizer: built on the model's fp16/bf16 parameters; must declare
            ``supports_memory_efficient_fp16`` (fp32 math and fp32 state).
        loss_scaler: options of the :class:`DynamicLossScaler` (fp16 only), or one.
        precision: ``"fp16"`` or ``"bf16"``.
        allow_unsupported: accept an optimizer without the flag anyway (its
            update then runs in half precision; state is half precision).

    ``param_groups`` are the inner optimizer's own groups.
    """

    steps_local_shards: ClassVar[bool] = True  # no copies: the inner optimizer steps FSDP2's shards

    config_schema: ClassVar[type[MemoryEfficientFP16OptimizerConfig]] = MemoryEfficientFP16OptimizerConfig

    @classmethod
    def check_inner(cls, inner: Any, hparams: Mapping[str, Any]) -> None:
        """Refuse, at plan time, an inner optimizer without ``supports_memory_efficient_fp16``
        (``optcore.plan`` and so ``optcore check`` call this before anything is built)."""
        if not hparams.get("allow_unsupported") and not inner.capabilities.memory_efficient_fp16:
            raise _unsupported(inner.qualified)

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        loss_scaler: LossScalerConfig | DynamicLossScaler | Mapping[str, Any] | None = None,
        precision: str = "fp16",
        allow_unsupported: bool = False,
    ) -> None:
        given_scaler = loss_scaler if isinstance(loss_scaler, DynamicLossScaler) else None
        opts = validate_hparams(
            self.config_schema,
            {
                "loss_scaler": None if given_scaler else loss_scaler,
                "precision": precision,
                "allow_unsupported": allow_unsupported,
            },
            "MemoryEfficientFP16Optimizer",
        )
        if not getattr(optimizer, "supports_memory_efficient_fp16", False) and not opts["allow_unsupported"]:
            raise _unsupported(type(optimizer).__name__)
        super().__init__(optimizer, given_scaler or opts["loss_scaler"], opts["precision"])

    @property  # type: ignore[override]
    def param_groups(self) -> list[dict[str, Any]]:
        """The inner optimizer's own groups (no master copy, nothing to translate)."""
        return self.optimizer.param_groups

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def _step_inner(self, indices: list[int] | None, scale: float, check: bool) -> bool:
        inner_groups = self.optimizer.param_groups  # (the same groups; see PrecisionWrapper.step)
        groups = inner_groups if indices is None else [inner_groups[i] for i in indices]
        check_inner_state(self, [p for g in groups for p in g["params"] if p.grad is not None])
        grads = self._model_grads(groups)
        if check and non_finite(grads):  # read in place (times 1): never unscale fp16 grads here
            return False
        self._call_inner_step(indices, scale, lambda: grads)
        return True

    @torch.no_grad()
    def average_params(self, group: Any = None) -> None:
        if hasattr(self.optimizer, "average_params"):
            self.optimizer.average_params(group)

    def _load_extras(self, extras: Any, sd: Mapping[str, Any]) -> None:
        """``torch.optim.Optimizer.load_state_dict`` casts floating state to the
        parameter's dtype, which would turn fp32 moments into fp16 ones: put
        back the dtype each state tensor was saved with."""
        saved_ids = chain.from_iterable(g["params"] for g in sd["param_groups"])
        params = chain.from_iterable(g["params"] for g in self.optimizer.param_groups)
        for pid, param in zip(saved_ids, params):
            saved = sd["state"].get(pid)
            state = self.optimizer.state.get(param)
            if not saved or state is None:
                continue
            for key, value in saved.items():
                loaded = state.get(key)
                if isinstance(value, Tensor) and isinstance(loaded, Tensor) and loaded.dtype != value.dtype:
                    state[key] = value.to(device=loaded.device)


def _unsupported(name: str) -> ConfigError:
    fitting = ", ".join(repr(q) for q in _with_the_flag()) or "none is installed"
    return ConfigError(
        f"MemoryEfficientFP16Optimizer: {name} does not support memory-efficient fp16 "
        "(supports_memory_efficient_fp16=False): it would step half-precision parameters with "
        "half-precision arithmetic and state. Use FP16Optimizer (an fp32 master copy; shorthand: "
        f"memory_efficient=false), or an optimizer whose flag is set ({fitting}); "
        "allow_unsupported=True accepts it anyway.",
        problems=[("optimizer", f"{name} lacks supports_memory_efficient_fp16")],
        target="MemoryEfficientFP16Optimizer",
    )


def _with_the_flag() -> list[str]:
    """The installed optimizers whose capability flags fit, from the registry. Third-party
    packages are not imported for this (their classes do not declare the flag)."""
    found = []
    for spec in optcore.list_optimizers(all=True):
        if spec.source in ("plugin", "user") and not spec.is_wrapper:
            try:
                if spec.capabilities.memory_efficient_fp16:
                    found.append(spec.qualified)
            except optcore.OptcoreError:
                continue
    return sorted(found)
