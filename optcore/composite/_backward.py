"""``step_in_backward``: each parameter stepped as soon as its gradient is ready.

A post-accumulate-grad hook steps the parameter with the optimizer that owns it
(the part, in a composite), through a one-parameter view of its param group,
and frees the gradient; so at most the gradients autograd is still producing are
alive, not all of them. The optimizer is the same object the ordinary loop
steps, so state, param groups and ``state_dict`` are its own; ``step()`` after
``backward()`` applies nothing and marks the end of the iteration.

Refused, with the reason: gradient accumulation (each backward steps), global
clipping (no moment holds every gradient), loss scaling (the step would see
scaled gradients before any overflow check), and more than one rank (DDP and
FSDP reduce a gradient after it is accumulated, when the hook has already
stepped with the local one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from .._contract import ContractMixin, GroupSelector
from .._errors import ConfigError


class StepInBackward(ContractMixin, torch.optim.Optimizer):
    """An optimizer whose step runs per parameter during ``backward``."""

    supports_groups = False
    flat_params_unsupported_reason = "each parameter is stepped on its own as its gradient is ready"

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        owners = getattr(optimizer, "parts", None) or {"": optimizer}
        for owner in owners.values():
            if getattr(owner, "_passes_closure", False) or not getattr(owner, "supports_groups", False):
                raise ConfigError(
                    f"step_in_backward steps one parameter at a time, and {type(owner).__name__} may couple parameters "
                    "in its update (a closure it re-evaluates, or statistics pooled over groups), so per-parameter "
                    "steps could differ from its own step. Drop step_in_backward for it.",
                    problems=[("step_in_backward", f"{type(owner).__name__} is not per-parameter")],
                )
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise _refusal(
                "data-parallel training", "DDP and FSDP reduce each gradient across ranks after it is accumulated, "
                "and the hook that steps the parameter runs at accumulation, so each rank would step with its own "
                "unreduced gradient and the replicas would drift apart")
        self.inner = optimizer
        super().__init__(optimizer.param_groups, {})
        self.optcore_spec = getattr(optimizer, "optcore_spec", None)
        self._link()
        self._since_step: set[int] = set()
        self._handles = [p.register_post_accumulate_grad_hook(self._hook) for p in self._owner]

    def _link(self) -> None:
        """The shared groups and state, and each parameter's owning optimizer and group."""
        self.param_groups = self.inner.param_groups
        self.state = self.inner.state
        owners = getattr(self.inner, "parts", None) or {"": self.inner}
        self._owner = {p: (owner, group) for owner in owners.values() for group in owner.param_groups for p in group["params"]}

    @property  # type: ignore[override]
    def supports_memory_efficient_fp16(self) -> bool:
        return bool(getattr(self.inner, "supports_memory_efficient_fp16", False))

    @property
    def optimizer_config(self) -> dict[str, Any]:  # type: ignore[override]
        return {**self.inner.optimizer_config, "step_in_backward": True}

    @torch.no_grad()
    def _hook(self, p: Tensor) -> None:
        if getattr(self, "grad_scale", None) is not None:
            raise _refusal("loss scaling", "a GradScaler unscales and checks for overflow after the backward, when every parameter is already stepped with scaled gradients; use bf16 autocast without a scaler")
        if id(p) in self._since_step:
            raise _refusal("gradient accumulation", "each backward steps every parameter, so a second backward before optimizer.step() would step again instead of accumulating; call optimizer.step() after every backward (it applies nothing), or drop step_in_backward to accumulate")
        owner, group = self._owner[p]
        view = {**group, "params": [p]}
        saved = owner.param_groups
        owner.param_groups = [view]
        try:
            owner.step()
        finally:
            owner.param_groups = saved
        group.update((k, v) for k, v in view.items() if k != "params")  # values a step writes (a count, a d estimate)
        p.grad = None
        self._since_step.add(id(p))

    def step(  # type: ignore[override]
        self, closure: Callable[[], float] | None = None, scale: float = 1.0, groups: GroupSelector = None
    ) -> float | None:
        """Applies nothing (the backward stepped each parameter); runs ``closure``,
        whose backward does the stepping, and ends the iteration."""
        if getattr(self, "grad_scale", None) is not None or scale != 1.0:
            raise _refusal("loss scaling", "the parameters were stepped during backward with the gradients as they were; a scale given afterwards cannot be divided out")
        if groups is not None:
            raise _refusal("step(groups=...)", "every parameter with a gradient was stepped during backward")
        with torch.enable_grad():
            loss = closure() if closure is not None else None
        self._since_step = set()
        return loss

    def clip_grad_norm(self, max_norm: float, aggregate_norm_fn: Any = None) -> Tensor:
        raise _refusal("global gradient clipping", "each parameter is stepped as soon as its gradient is ready, so no moment holds all gradients to measure their norm")

    def multiply_grads(self, c: float | Tensor) -> None:
        raise _refusal("multiply_grads", "the gradients are freed as each parameter is stepped")

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any], optimizer_overrides: Mapping[str, Any] | None = None) -> None:  # type: ignore[override]
        self.inner.load_state_dict(state_dict, optimizer_overrides)
        self._link()

    def remove_hooks(self) -> None:
        """Detaches the hooks: the parameters' gradients are kept again, and nothing steps in backward."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def _refusal(what: str, why: str) -> ConfigError:
    return ConfigError(f"step_in_backward does not support {what}: {why}.", problems=[("step_in_backward", what)])
