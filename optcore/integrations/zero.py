"""Sharded optimizers that build what :func:`optcore.build_optimizer` builds.

``ZeroRedundancyOptimizer`` (ZeRO-1) takes an optimizer *class* and keyword
arguments and constructs one optimizer per rank over that rank's shard. Built
by hand from ``model.parameters()`` it loses what optcore's plan decided: the
no-decay and regex param groups, group overrides and ``lr_scale``, and the
implementation choice (the fused kernel). :func:`zero_redundancy` hands ZeRO
the plan's groups, class and hyper-parameters instead, so the sharded run
steps exactly as the unsharded one, and returns a ZeRO optimizer that keeps
optcore's contract over *all* ranks: the learning rate of every shard, the
gradient norm over every shard, parameters averaged whole.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._adapt import adapt
from .._contract import ContractMixin, GroupSelector
from .._errors import ConfigError
from .._plan import plan
from ..grads import multiply, params_with_grad
from ..placement._ranks import average, clip_by_norm

#: The ``sharding`` kinds whose update ZeRO's whole-tensor shards leave unchanged:
#: each parameter's update needs only that parameter (and its gradient and state).
WHOLE_TENSOR_KINDS = ("elementwise", "factored", "per_tensor")


def zero_redundancy(config: Any, model: Any, *, allow_import_paths: bool | None = None, **zero_kwargs: Any) -> Any:
    """A ``torch.distributed.optim.ZeroRedundancyOptimizer`` with the groups,
    class and hyper-parameters of ``build_optimizer(config, model)``, and
    optcore's contract over all ranks (:func:`sharded_class`).

    ``zero_kwargs`` go to ZeRO (``process_group``, ``parameters_as_bucket_view``,
    ``overlap_with_ddp``). Call it on every rank after the process group is
    initialised. Optimizers whose update ZeRO's shards would change (``sharding``
    ``"global"`` or ``"unknown"``) and precision wrappers are refused with a
    :class:`~optcore.ConfigError` before any collective runs.
    """
    built = plan(config, model, allow_import_paths=allow_import_paths)
    if built.inner is not None:
        raise ConfigError(
            f"{built.spec.name} wraps another optimizer and keeps its fp32 master weights and loss scale over all "
            "parameters; optcore.distributed.zero_redundancy shards plain optimizers only. Keep the parameters "
            "in fp32 and train under torch.autocast with the plain optimizer sharded, or use DDP with the wrapper."
        )
    if built.parts:
        names = ", ".join(f"{part.spec.qualified} ({part.spec.capabilities.sharding})" for part in built.parts)
        raise ConfigError(
            f"{built.spec.qualified} is a composite ({names}): each param group is stepped by its own optimizer, "
            "and ZeroRedundancyOptimizer builds ONE optimizer class over each rank's shard of the groups, so "
            f"every group would be stepped by {built.spec.name} (which may not take them: a 1-D bias). Train "
            "the composite unsharded under DDP (optcore.build_optimizer on every rank), or under FSDP2 with "
            "elementwise optimizers for the sharded parameters.",
            problems=[("fallback", "composite under ZeroRedundancyOptimizer")],
            target=built.spec.name,
        )
    target = built.spec.target
    if not isinstance(target, type):
        raise ConfigError(f"{built.spec.qualified} is a factory; ZeroRedundancyOptimizer needs an optimizer class.")
    sharding = built.spec.capabilities.sharding
    if sharding not in WHOLE_TENSOR_KINDS or getattr(target, "zero_shardable", True) is False:
        why = (
            "its update uses statistics over the gradients of every parameter (sharding='global'), and each "
            "rank's shard would compute its own from part of them"
            if sharding == "global"
            else "optcore does not know how its update couples elements (sharding='unknown'): a class that "
            "updates each tensor on its own declares sharding = 'elementwise', 'factored' or 'per_tensor'"
        )
        raise ConfigError(
            f"{built.spec.qualified} cannot be sharded by ZeRO: {why}. Train it unsharded under DDP "
            "(optcore.build_optimizer(config, model) on every rank), or shard an optimizer whose sharding is "
            f"one of {list(WHOLE_TENSOR_KINDS)} (optcore list --all shows it).",
            problems=[("type", f"sharding={sharding}")],
            target=built.spec.name,
        )
    groups = [dict(g) for g in built.groups or ()]
    cls = sharded_class()
    return cls(groups, optimizer_class=adapt(target), **dict(built.hparams), **zero_kwargs)


@functools.cache
def sharded_class() -> type:
    """``ZeroRedundancyOptimizer`` with optcore's contract (made on first use:
    ``torch.distributed.optim`` is imported only when ZeRO is)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    class ShardedOptimizer(ContractMixin, ZeroRedundancyOptimizer):  # type: ignore[misc]
        """ZeRO-1 with optcore's contract, every member over all ranks.

        ``get_lr``/``set_lr`` are the local optimizer's (``.optim``), over ZeRO's
        ``param_groups``, which ZeRO copies to it before each step;
        ``clip_grad_norm`` measures the norm over every rank's shard (one
        all-reduce of one number) and scales the gradients of all parameters;
        ``average_params`` averages the parameters (the state of each is on one
        rank, so there is none to average); ``step(scale=, groups=)`` reaches
        the local optimizer. ``optcore.unwrap`` returns this object itself.
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.optim.shard_group = self.process_group  # its own clip_grad_norm is global too

        # the capability flags are the local optimizer's
        @property  # type: ignore[override]
        def sharding(self) -> str:
            return str(getattr(self.optim, "sharding", "unknown"))

        @property  # type: ignore[override]
        def lr_schedule(self) -> str:
            return str(getattr(self.optim, "lr_schedule", "any"))

        @property  # type: ignore[override]
        def supports_step_with_scale(self) -> bool:
            return bool(getattr(self.optim, "supports_step_with_scale", False))

        @property  # type: ignore[override]
        def supports_groups(self) -> bool:
            return bool(getattr(self.optim, "supports_groups", False))

        def get_lr(self) -> float | Tensor:
            return self._local("get_lr")

        def get_lrs(self) -> list[float | Tensor]:
            return self._local("get_lrs")

        def set_lr(self, lr: Any) -> None:
            self._local("set_lr", lr)

        def _local(self, member: str, *args: Any) -> Any:
            """The local optimizer's ``member`` (its class may define its own, as
            Adafactor's ``set_lr``) over ZeRO's groups, which are copied to it
            first and back after."""
            self._sync_param_groups(self.param_groups, self.optim.param_groups)
            result = getattr(self.optim, member)(*args)
            self._sync_param_groups(self.optim.param_groups, self.param_groups)
            return result

        def multiply_grads(self, c: float | Tensor) -> None:
            """Every parameter's gradient (each rank holds all of them after DDP's all-reduce)."""
            multiply([p.grad for p in self._all_params if p.grad is not None], c)

        def clip_grad_norm(
            self, max_norm: float, aggregate_norm_fn: Callable[[Tensor], Tensor] | None = None
        ) -> Tensor:
            """The norm of the gradients over every rank's shard; all gradients are
            scaled, so every rank's stay equal to those of the unsharded run."""
            grads = [p.grad for p in params_with_grad(self.optim.param_groups)]
            return clip_by_norm(grads, max_norm, self.multiply_grads, self.process_group, aggregate_norm_fn,
                                self._default_device)

        @torch.no_grad()
        def average_params(self, group: Any = None) -> None:
            """All parameters averaged over the ranks of ``group`` (ZeRO's process
            group when ``None``); the optimizer state is sharded, not replicated."""
            dist = torch.distributed
            group = self.process_group if group is None else group
            if dist.get_world_size(group) == 1:
                return
            average([p.data for p in self._all_params], group)

        def step(  # type: ignore[override]
            self, closure: Callable[[], float] | None = None, scale: float = 1.0, groups: GroupSelector = None
        ) -> float | None:
            kwargs: dict[str, Any] = {}
            if scale != 1.0:
                kwargs["scale"] = scale
            if groups is not None:
                kwargs["groups"] = groups
            return ZeroRedundancyOptimizer.step(self, closure, **kwargs)

        def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
            """ZeRO's (call ``consolidate_state_dict()`` on every rank first)."""
            return ZeroRedundancyOptimizer.state_dict(self)

        def load_state_dict(self, state_dict: Any, optimizer_overrides: Any = None) -> None:  # type: ignore[override]
            ZeroRedundancyOptimizer.load_state_dict(self, state_dict)

    return ShardedOptimizer

