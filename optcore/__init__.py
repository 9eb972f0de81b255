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
    "by_device_and_dtype": "._contract",
    "total_grad_norm": "._contract",
    "adapt": "._adapt",
    "HParams": "._schema",
    "validate_hparams": "._schema",
    "schema_from_signature": "._schema",
    "parse_optim_args": "._schema",
    "parse_literal": "._schema",
    "LR": "._schema",
    "Beta": "._schema",
    "Betas": "._schema",
    "Eps": "._schema",
    "WeightDecay": "._schema",
    "Momentum": "._schema",
    "Flag": "._schema",
    "OptionalFlag": "._schema",
    "Literalish": "._schema",
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
    "unwrap": "._unwrap",
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
    from ._schema import HParams, parse_literal, parse_optim_args, schema_from_signature, validate_hparams
    from ._spec import Capabilities, OptimizerSpec
    from ._unwrap import unwrap
