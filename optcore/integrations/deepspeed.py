"""DeepSpeed with an optimizer built by optcore.

``deepspeed.initialize`` builds an optimizer from its JSON's ``optimizer``
section only for DeepSpeed's own names and ``torch.optim`` classes, and takes
anything else as a *client optimizer*, in which case it ignores the JSON's
section without a word. :func:`initialize` puts optcore between the two: the
optcore config, in the JSON or beside it, is built by optcore on the model
(its param groups, validated hyper-parameters, implementation choice) and
handed to DeepSpeed as the client optimizer, with the JSON's section removed::

    from optcore.integrations import deepspeed as ds

    engine, optimizer, _, _ = ds.initialize(model, {
        "train_micro_batch_size_per_gpu": 8,
        "zero_optimization": {"stage": 2},
        "optimizer": {"type": "optcore", "params": {"type": "optcore-lion:Lion", "lr": 1e-4}},
    })

The section's spellings:

- ``{"type": "optcore", "params": CONFIG}``: ``CONFIG`` is any optcore config
  (``param_groups``, wrappers and all).
- ``{"type": NAME, "params": {...}}`` with a ``NAME`` that is not one of
  DeepSpeed's own optimizers (``deepspeed.runtime.config.DEEPSPEED_OPTIMIZERS``:
  Adam, AdamW, Lamb, Lion, Muon, ...): optcore builds ``{"type": NAME, **params}``,
  so a plugin's or a ``torch.optim`` name works directly. DeepSpeed's own names
  stay DeepSpeed's (its fused and CPU kernels); ``"optcore"`` selects optcore's.
- No section, and ``optimizer=CONFIG`` beside the JSON.

**ZeRO hands the optimizer flat partitions.** At stages 1-3 DeepSpeed
replaces each param group's parameters by one flat 1-D slice of the group's
parameters, cut at a boundary that ignores tensor shapes. An update that
couples elements (``sharding`` other than ``"elementwise"``: Adafactor's
factored statistics, Muon's orthogonalised matrices, AdaScale's statistics
over every gradient) would step that slice as if it were one vector and give
a different result without an error, so it is refused with a ``ConfigError``
before ``deepspeed.initialize`` runs any collective. For the same reason
optimizers that wrap another one (optcore-fp16's ``FP16Optimizer``, from
``"precision": "bf16"``) are refused at those stages and beside DeepSpeed's own
``bf16`` / ``fp16`` sections, which keep fp32 master weights of their own; at
stage 0 without those sections they step as on one process. For an elementwise optimizer optcore sets
``zero_allow_untested_optimizer`` (unless the JSON sets it), since that
optimizer steps a flat slice exactly as it steps the whole tensors.

``deepspeed.initialize(optimizer=callable)`` without this module calls the
callable with bare tensors; ``optcore.build_optimizer(config, params)`` inside
it is refused where the model's names would give other param groups
(:mod:`optcore.placement._callable`).

``deepspeed`` is imported only when :func:`initialize` runs.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from os import PathLike
from typing import Any

import torch

from .._adapt import capabilities
from .._build import construct
from .._errors import ConfigError
from .._plan import plan

__all__ = ["OPTCORE_TYPE", "initialize", "zero_stage"]

#: The ``optimizer.type`` whose ``params`` are a whole optcore config.
OPTCORE_TYPE = "optcore"


def initialize(
    model: torch.nn.Module,
    config: Mapping[str, Any] | str | PathLike[str],
    *,
    optimizer: Any = None,
    allow_import_paths: bool | None = None,
    **deepspeed_kwargs: Any,
) -> tuple[Any, ...]:
    """``deepspeed.initialize(model=model, config=..., optimizer=...)`` with the
    optimizer built by optcore; returns what ``deepspeed.initialize`` returns
    (``engine, optimizer, dataloader, lr_scheduler``).

    ``config`` is DeepSpeed's JSON (a mapping or a path); its ``optimizer``
    section (see the module's documentation) or ``optimizer`` (an optcore
    config, or an optimizer already built) is what trains, never both.
    ``deepspeed_kwargs`` go to ``deepspeed.initialize`` (``training_data``,
    ``lr_scheduler``, ``mpu``, ...); the JSON is not modified in place.
    """
    import deepspeed
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    for taken in ("model", "config", "config_params", "model_parameters"):
        if taken in deepspeed_kwargs:
            raise ConfigError(
                f"optcore.integrations.deepspeed.initialize sets deepspeed.initialize's {taken!r} itself "
                "(optcore builds the param groups from the model); pass the model and the DeepSpeed config as "
                "its first two arguments."
            )
    ds_config = _load(config)
    section = ds_config.get("optimizer")
    optcore_config = _optcore_config(section, DEEPSPEED_OPTIMIZERS)
    if section is not None and optimizer is not None:
        what = "an optimizer" if isinstance(optimizer, torch.optim.Optimizer) else "an optcore config"
        raise ConfigError(
            f"The DeepSpeed config has an optimizer section ({_describe(section)}) and optimizer= was given "
            f"{what} as well; DeepSpeed would step one and ignore the other. Keep one: remove the JSON's "
            "'optimizer' section, or drop optimizer= (the section may name an optcore config: "
            '{"type": "optcore", "params": {...}}).'
        )
    if section is not None and optcore_config is None:
        # one of DeepSpeed's own optimizers: DeepSpeed builds it from the JSON
        return tuple(deepspeed.initialize(model=model, config=ds_config, **deepspeed_kwargs))
    if section is None and optimizer is None:
        raise ConfigError(
            "No optimizer: the DeepSpeed config has no 'optimizer' section and optimizer= was not given. "
            'Add {"optimizer": {"type": "optcore", "params": {"type": "AdamW", "lr": 1e-3}}} to the config, '
            "or pass optimizer=<optcore config>."
        )
    ds_config.pop("optimizer", None)
    built = _client_optimizer(optcore_config, optimizer, model, ds_config, allow_import_paths)
    return tuple(deepspeed.initialize(model=model, optimizer=built, config=ds_config, **deepspeed_kwargs))


def _client_optimizer(
    optcore_config: Any, optimizer: Any, model: torch.nn.Module, ds_config: dict[str, Any], allow_import_paths: Any
) -> torch.optim.Optimizer:
    """The optimizer to hand DeepSpeed, refused by name where DeepSpeed would step
    it differently than one process does; never runs a collective."""
    stage = zero_stage(ds_config)
    if optcore_config is None and isinstance(optimizer, torch.optim.Optimizer):
        built, name = optimizer, type(optimizer).__name__
        wraps = isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer)
    else:
        the_plan = plan(
            optimizer if optcore_config is None else optcore_config, model, allow_import_paths=allow_import_paths
        )
        built, name, wraps = None, the_plan.spec.qualified, the_plan.inner is not None
    precision = _mixed_precision(ds_config)
    if wraps and (stage or precision):
        _refuse_wrapper(name, stage, precision)
    if built is None:
        built = construct(the_plan)
    if stage:
        sharding = _sharding(built)
        if sharding != "elementwise":
            raise ConfigError(
                f"{name} cannot run under DeepSpeed ZeRO stage {stage}: ZeRO hands the optimizer one flat 1-D "
                f"slice of each param group's parameters, and {name}'s update is {_WHY[sharding]}, so it would "
                "step differently than on one process. What works instead: ZeRO stage 0 "
                '("zero_optimization": {"stage": 0}, plain data parallel), FSDP2 (optcore.distributed) where the '
                "optimizer supports it, or an elementwise optimizer (AdamW, SGD, Lion) at this stage."
            )
        # checked above: a flat slice steps exactly as the whole tensors do
        ds_config.setdefault("zero_allow_untested_optimizer", True)
    return built


def zero_stage(ds_config: Mapping[str, Any]) -> int:
    """The ZeRO stage a DeepSpeed config selects (0 when it has no ``zero_optimization``)."""
    zero = ds_config.get("zero_optimization", 0)
    if isinstance(zero, bool):  # DeepSpeed's older spelling: true is stage 1
        return int(zero)
    if isinstance(zero, Mapping):
        zero = zero.get("stage", 0)
    try:
        return int(zero)
    except (TypeError, ValueError):
        raise ConfigError(f"zero_optimization.stage must be 0, 1, 2 or 3, got {zero!r}.") from None


_WHY = {
    "factored": "factored (row and column statistics of each matrix need its shape)",
    "per_tensor": "computed over each whole tensor (an orthogonalised update or a trust ratio)",
    "global": "driven by statistics over all of the gradients together",
    "unknown": "not declared elementwise (its class has no `sharding` capability optcore knows)",
}


def _load(config: Mapping[str, Any] | str | PathLike[str]) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    if isinstance(config, (str, PathLike)):
        with open(config, encoding="utf-8") as f:
            loaded = json.load(f)
        if isinstance(loaded, dict):
            return loaded
    raise ConfigError(f"The DeepSpeed config must be a mapping or the path of a JSON object, got {config!r}.")


def _optcore_config(section: Any, deepspeed_names: list[str]) -> Any:
    """The optcore config the JSON's optimizer section names, or ``None`` for
    no section and for DeepSpeed's own optimizers."""
    if section is None:
        return None
    if not isinstance(section, Mapping) or not isinstance(section.get("type"), str):
        raise ConfigError(f"The DeepSpeed config's 'optimizer' section needs a 'type' string, got {section!r}.")
    unknown = sorted(set(section) - {"type", "params"})
    if unknown:
        raise ConfigError(
            f"The DeepSpeed config's 'optimizer' section has {unknown}; it takes 'type' and 'params' only."
        )
    kind, params = section["type"], section.get("params") or {}
    if kind.lower() == OPTCORE_TYPE:
        if not params:
            raise ConfigError(
                'The optimizer section {"type": "optcore"} needs the optcore config as its "params", e.g. '
                '{"type": "optcore", "params": {"type": "AdamW", "lr": 1e-3}}.'
            )
        return params
    if kind.lower() in deepspeed_names:
        return None
    if not isinstance(params, Mapping):
        raise ConfigError(f"The optimizer section's 'params' must be a mapping, got {params!r}.")
    if "type" in params:
        raise ConfigError(
            f"The optimizer section names {kind!r} and its params name {params['type']!r}; say it once "
            '(for an optcore config in params use {"type": "optcore", "params": {...}}).'
        )
    return {"type": kind, **params}


def _sharding(optimizer: torch.optim.Optimizer) -> str:
    declared = getattr(optimizer, "sharding", None)
    if isinstance(declared, str):
        return declared
    return str(capabilities(type(optimizer))["sharding"])


def _mixed_precision(ds_config: Mapping[str, Any]) -> str | None:
    """The JSON's enabled mixed-precision section (``"fp16"``, ``"bf16"``), if any."""
    for key in ("fp16", "bf16", "bfloat16"):
        section = ds_config.get(key)
        if isinstance(section, Mapping) and section.get("enabled"):
            return key
    return None


def _refuse_wrapper(name: str, stage: int, precision: str | None) -> None:
    where = f'the JSON\'s "{precision}" section' if precision else f"ZeRO stage {stage}"
    raise ConfigError(
        f"{name} wraps another optimizer and keeps its own fp32 master weights, and under {where} DeepSpeed "
        "replaces the optimizer's parameters by master copies or flat partitions of its own. Use one of the two: "
        f'the plain optimizer with DeepSpeed\'s mixed precision ("bf16": {{"enabled": true}} or "fp16"), or {name} '
        "at ZeRO stage 0 without DeepSpeed's fp16/bf16 section."
    )


def _describe(section: Any) -> str:
    return repr(section.get("type")) if isinstance(section, Mapping) else repr(section)
