"""``build_optimizer`` and ``build``: a :class:`~optcore._plan.BuildPlan`, constructed.

The plan decides everything before the first constructor runs, so this module
only calls the classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from . import composite
from ._adapt import adapt
from ._config import to_plain
from ._errors import ConfigError, rejected_config
from ._hooks import get_plugin_manager
from ._plan import BuildPlan, plan
from .schedulers import build_scheduler


def build_optimizer(config: Any, params_or_model: Any, *, allow_import_paths: bool | None = None) -> torch.optim.Optimizer:
    """The optimizer ``config`` describes over ``params_or_model``, with the optcore
    contract (API.md); ``allow_import_paths`` is :func:`~optcore.plan`'s."""
    return construct(plan(config, params_or_model, allow_import_paths=allow_import_paths))


def construct(plan_: BuildPlan, *, announce: bool = True) -> Any:
    """The optimizer of a plan made with parameters; ``announce=False`` calls no
    ``optcore_optimizer_built`` hook (a trial construction, not a build)."""
    optimizer = _construct(plan_, announce)
    return composite.StepInBackward(optimizer) if plan_.step_in_backward else optimizer


def _construct(plan_: BuildPlan, announce: bool) -> Any:
    spec = plan_.spec
    if plan_.inner is not None:
        inner = construct(plan_.inner, announce=announce)
        with rejected_config(spec, config={**plan_.hparams, "type": spec.qualified}):
            return spec.target(inner, **plan_.hparams)
    if plan_.groups is None:
        raise ConfigError(f"The plan for {spec.name} was made without parameters; pass them to optcore.plan().")
    if plan_.parts:
        return composite.CompositeOptimizer([_construct(part, announce) for part in plan_.parts], plan_.routing)
    with rejected_config(spec, config={**plan_.hparams, "type": spec.qualified}):
        optimizer = _call(spec, [dict(g) for g in plan_.groups], dict(plan_.hparams))
    optimizer.optcore_spec = spec  # type: ignore[attr-defined]
    if announce:
        (plan_.hooks or get_plugin_manager().hook).optcore_optimizer_built(optimizer=optimizer, config={**plan_.hparams, "type": spec.name})
    return optimizer


def _call(spec: Any, groups: list[dict[str, Any]], kwargs: dict[str, Any]) -> Any:
    target = spec.target
    if isinstance(target, type):
        if not issubclass(target, torch.optim.Optimizer):
            raise ConfigError(
                f"{spec.qualified} is not a torch.optim.Optimizer subclass ({target!r}); "
                "optcore builds optimizers only.",
            )
        return adapt(target)(groups, **kwargs)
    optimizer = target(groups, **kwargs)  # a registered or entry-point factory
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(f"Factory {spec.qualified} returned {type(optimizer).__name__}, not a torch.optim.Optimizer.")
    adapted = adapt(type(optimizer))
    if adapted is not type(optimizer):
        optimizer.__class__ = adapted  # same layout: the subclass adds no slots
    return optimizer


def build(
    config: Any, model: Any, num_training_steps: int | None = None, *, allow_import_paths: bool | None = None
) -> tuple[Any, Any]:
    """``(optimizer, scheduler)`` from ``{"optimizer": {...}, "lr_scheduler": {...}}``;
    the scheduler is ``None`` when the config has none."""
    plain = to_plain(config)
    if not isinstance(plain, Mapping) or "optimizer" not in plain:
        raise ConfigError(
            "build() takes {'optimizer': {...}, 'lr_scheduler': {...}}; for an optimizer alone use build_optimizer().",
            problems=[("optimizer", "missing")],
        )
    optimizer = build_optimizer(plain["optimizer"], model, allow_import_paths=allow_import_paths)
    sched_cfg = plain.get("lr_scheduler", plain.get("scheduler"))
    if sched_cfg is None:
        return optimizer, None
    total = num_training_steps if num_training_steps is not None else plain.get("num_training_steps")
    return optimizer, build_scheduler(sched_cfg, optimizer, num_training_steps=total, allow_import_paths=allow_import_paths)
