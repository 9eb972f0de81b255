"""Sharded optimizers that build what :func:`optcore.build_optimizer` builds.

``ZeroRedundancyOptimizer`` (ZeRO-1) takes an optimizer *class* and keyword
arguments and constructs one optimizer per rank over that rank's shard. Built
by hand from ``model.parameters()`` it loses what optcore's plan decided: the
no-decay and regex param groups, group overrides and ``lr_scale``, and the
implementation choice (the fused kernel). :func:`zero_redundancy` hands ZeRO
the plan's groups, class and hyper-parameters instead, so the sharded run
steps exactly as the unsharded one.
"""

from __future__ import annotations

from typing import Any

from .._adapt import adapt
from .._errors import ConfigError
from .._plan import plan


def zero_redundancy(config: Any, model: Any, *, allow_import_paths: bool | None = None, **zero_kwargs: Any) -> Any:
    """A ``torch.distributed.optim.ZeroRedundancyOptimizer`` with the groups,
    class and hyper-parameters of ``build_optimizer(config, model)``.

    ``zero_kwargs`` go to ZeRO (``process_group``, ``parameters_as_bucket_view``,
    ``overlap_with_ddp``). Call it on every rank after the process group is
    initialised; ``optcore.unwrap(zero)`` is the rank's local optcore optimizer.
    """
    from torch.distributed.optim import ZeroRedundancyOptimizer

    built = plan(config, model, allow_import_paths=allow_import_paths)
    if built.inner is not None:
        raise ConfigError(
            f"{built.spec.name} wraps another optimizer and keeps state across all parameters; ZeRO shards "
            "plain optimizers only. Shard the inner optimizer and handle precision outside, or train unsharded."
        )
    target = built.spec.target
    if not isinstance(target, type):
        raise ConfigError(f"{built.spec.qualified} is a factory; ZeroRedundancyOptimizer needs an optimizer class.")
    if built.spec.capabilities.groups is False or getattr(target, "zero_shardable", True) is False:
        raise ConfigError(
            f"{built.spec.qualified} couples its parameters (its update uses statistics over all of them), so "
            "each rank stepping a shard would change the result; train it unsharded (DDP)."
        )
    groups = [dict(g) for g in built.groups or ()]
    return ZeroRedundancyOptimizer(groups, optimizer_class=adapt(target), **dict(built.hparams), **zero_kwargs)
