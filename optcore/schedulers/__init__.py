"""LR schedulers by name: the registry (:mod:`._registry`) and the built-in named
schedules (:mod:`.builtin`, one module per family).

Importing this package imports pydantic and torch's schedulers; ``import
optcore`` does not import it until a scheduler name is used.
"""

from __future__ import annotations

from ._registry import (
    SchedulerSpec,
    build_scheduler,
    list_schedulers,
    register_scheduler,
    resolve_scheduler,
    unregister_scheduler,
    validate_scheduler_config,
)
from .builtin import BUILTINS

__all__ = [
    "BUILTINS",
    "SchedulerSpec",
    "build_scheduler",
    "list_schedulers",
    "register_scheduler",
    "resolve_scheduler",
    "unregister_scheduler",
    "validate_scheduler_config",
]
