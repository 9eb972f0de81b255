"""optcore: pick, configure and extend PyTorch optimizers by name.

``import optcore`` imports no plugin and not even pydantic: each public name
below is loaded from its module on first use (PEP 562). This is the users'
API; plugin authors build on :mod:`optcore.plugin`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._errors import ConfigError, OptcoreError, OptimizerNotFoundError, PluginLoadError
from ._errors import SchedulerNotFoundError, StepError
from ._version import __version__

#: public name -> the module that defines it (the TYPE_CHECKING block below
#: says the same to type checkers; tests/core/test_architecture.py keeps them equal)
_LAZY = {
    name: module
    for module, names in {
        "._contract": "Optimizer",
        "._spec": "OptimizerSpec Capabilities",
        "._registry": "resolve list_optimizers register_optimizer unregister_optimizer",
        "._build": "build_optimizer build",
        "._plan": "plan BuildPlan",
        ".integrations.unwrap": "unwrap",
        ".schedulers": "build_scheduler register_scheduler resolve_scheduler list_schedulers unregister_scheduler "
        "SchedulerSpec",
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
    "StepError",
    "__version__",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        # a name that left the top level resolves with a DeprecationWarning
        return importlib.import_module(".plugin._deprecated", __name__).moved(name)
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from ._build import build, build_optimizer
    from ._contract import Optimizer
    from ._plan import BuildPlan, plan
    from ._registry import list_optimizers, register_optimizer, resolve, unregister_optimizer
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
    )
