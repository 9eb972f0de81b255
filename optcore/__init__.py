"""optcore: pick, configure and extend PyTorch optimizers by name.

``import optcore`` imports no plugin and not even pydantic: each public name
below is loaded from its module on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._errors import ConfigError, OptcoreError, OptimizerNotFoundError, PluginLoadError, SchedulerNotFoundError
from ._version import __version__

#: public name -> the module that defines it (the TYPE_CHECKING block below
#: says the same to type checkers; tests/test_architecture.py keeps them equal)
_LAZY = {
    name: module
    for module, names in {
        "._contract": "Optimizer ContractMixin GroupSelector",
        "._grads": "by_device_and_dtype total_grad_norm",
        "._adapt": "adapt",
        "._fields": "HParams LR Beta Betas Eps WeightDecay Momentum Flag OptionalFlag Literalish",
        "._schema": "validate_hparams schema_from_signature",
        "._literals": "parse_optim_args parse_literal",
        "._spec": "OptimizerSpec Capabilities",
        "._registry": "resolve list_optimizers register_optimizer unregister_optimizer",
        "._build": "build_optimizer construct build",
        "._plan": "plan BuildPlan",
        "._params": "build_param_groups",
        ".integrations.unwrap": "unwrap",
        "._hooks": "hookimpl hookspec get_plugin_manager",
        ".schedulers": "build_scheduler register_scheduler resolve_scheduler list_schedulers unregister_scheduler "
        "validate_scheduler_config SchedulerSpec",
        ".integrations.argparse": "add_args config_from_args",
    }.items()
    for name in names.split()
}

__all__ = [
    "ConfigError",
    "OptcoreError",
    "OptimizerNotFoundError",
    "PluginLoadError",
    "SchedulerNotFoundError",
    "__version__",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'optcore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from ._adapt import adapt
    from ._build import build, build_optimizer, construct
    from ._contract import ContractMixin, GroupSelector, Optimizer
    from ._fields import LR, Beta, Betas, Eps, Flag, HParams, Literalish, Momentum, OptionalFlag, WeightDecay
    from ._grads import by_device_and_dtype, total_grad_norm
    from ._hooks import get_plugin_manager, hookimpl, hookspec
    from ._literals import parse_literal, parse_optim_args
    from ._params import build_param_groups
    from ._plan import BuildPlan, plan
    from ._registry import list_optimizers, register_optimizer, resolve, unregister_optimizer
    from ._schema import schema_from_signature, validate_hparams
    from ._spec import Capabilities, OptimizerSpec
    from .integrations.argparse import add_args, config_from_args
    from .integrations.unwrap import unwrap
    from .schedulers import (
        SchedulerSpec,
        build_scheduler,
        list_schedulers,
        register_scheduler,
        resolve_scheduler,
        unregister_scheduler,
        validate_scheduler_config,
    )
