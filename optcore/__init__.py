"""optcore: pick, configure and extend PyTorch optimizers by name.

``import optcore`` is cheap: it imports no plugin, no third-party optimizer
package and not even pydantic. Each public name below is loaded from its
module on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._errors import (
    ConfigError,
    OptcoreError,
    OptimizerNotFoundError,
    PluginLoadError,
    SchedulerNotFoundError,
)

from ._version import __version__

# public name -> module that defines it
_LAZY = {
    "Optimizer": "._contract",
    "ContractMixin": "._contract",
    "GroupSelector": "._contract",
    "by_device_and_dtype": "._grads",
    "total_grad_norm": "._grads",
    "adapt": "._adapt",
    "HParams": "._fields",
    "validate_hparams": "._schema",
    "schema_from_signature": "._schema",
    "parse_optim_args": "._literals",
    "parse_literal": "._literals",
    "LR": "._fields",
    "Beta": "._fields",
    "Betas": "._fields",
    "Eps": "._fields",
    "WeightDecay": "._fields",
    "Momentum": "._fields",
    "Flag": "._fields",
    "OptionalFlag": "._fields",
    "Literalish": "._fields",
    "OptimizerSpec": "._spec",
    "Capabilities": "._spec",
    "resolve": "._registry",
    "list_optimizers": "._registry",
    "register_optimizer": "._registry",
    "unregister_optimizer": "._registry",
    "build_optimizer": "._build",
    "construct": "._build",
    "plan": "._plan",
    "BuildPlan": "._plan",
    "build_param_groups": "._params",
    "unwrap": ".integrations.unwrap",
    "hookimpl": "._hooks",
    "hookspec": "._hooks",
    "get_plugin_manager": "._hooks",
    "build_scheduler": ".schedulers",
    "build": "._build",
    "register_scheduler": ".schedulers",
    "resolve_scheduler": ".schedulers",
    "list_schedulers": ".schedulers",
    "unregister_scheduler": ".schedulers",
    "validate_scheduler_config": ".schedulers",
    "SchedulerSpec": ".schedulers",
    "add_args": ".integrations.argparse",
    "config_from_args": ".integrations.argparse",
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
    from ._plan import BuildPlan, plan
    from ._contract import ContractMixin, Optimizer
    from ._hooks import get_plugin_manager, hookimpl, hookspec
    from ._params import build_param_groups
    from ._registry import list_optimizers, register_optimizer, resolve, unregister_optimizer
    from ._fields import HParams
    from ._literals import parse_literal, parse_optim_args
    from ._schema import schema_from_signature, validate_hparams
    from ._spec import Capabilities, OptimizerSpec
    from .integrations.unwrap import unwrap
