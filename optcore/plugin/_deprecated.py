"""The names that left ``optcore``'s top level: each still resolves there, with a
:class:`DeprecationWarning` naming its place, until optcore 0.2.0 removes it."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

REMOVED_IN = "0.2.0"

#: top-level name -> (the module that defines it, the public module to import it from;
#: "" for internals, which have none)
MOVED = {
    name: (module, where)
    for module, where, names in [
        ("optcore._contract", "optcore.plugin", "ContractMixin GroupSelector"),
        ("optcore.grads", "optcore.plugin", "by_device_and_dtype total_grad_norm"),
        ("optcore._adapt", "optcore.plugin", "adapt"),
        ("optcore._fields", "optcore.plugin", "HParams LR Beta Betas Eps WeightDecay Momentum Flag OptionalFlag Literalish"),
        ("optcore._schema", "optcore.plugin", "validate_hparams schema_from_signature"),
        ("optcore._literals", "optcore.plugin", "parse_optim_args parse_literal"),
        ("optcore._hooks", "optcore.plugin", "hookimpl"),
        ("optcore.schedulers", "optcore.schedulers", "validate_scheduler_config"),
        ("optcore._build", "", "construct"),
        ("optcore._params", "", "build_param_groups"),
        ("optcore._hooks", "", "hookspec get_plugin_manager"),
    ]
    for name in names.split()
}


def moved(name: str) -> Any:
    """``optcore.<name>`` for a name in :data:`MOVED`, with the warning pointed at
    the line that asked for it; :class:`AttributeError` for any other name."""
    if name not in MOVED:
        raise AttributeError(f"module 'optcore' has no attribute {name!r}")
    module, where = MOVED[name]
    if where:
        advice = f"import it from {where} instead (from {where} import {name})."
    else:
        advice = "it is internal; build with optcore.build_optimizer(config, params), or plan with optcore.plan(config, params)."
    warnings.warn(
        f"optcore.{name} is deprecated and leaves the top level in optcore {REMOVED_IN}: {advice}",
        DeprecationWarning,
        stacklevel=3,  # past optcore.__getattr__, at the importing line
    )
    return getattr(importlib.import_module(module), name)
