"""The plugin authors' API: what an optimizer or hook plugin builds on.

``optcore`` is the users' API (build, resolve, register, schedule); this module
is the authors': the contract's base classes and step preamble, the schema helpers, the hook
marker, the tensor-grouping helpers and the conformance kit's entry points.
A plugin imports only these two modules (and ``optcore.testing`` in its
tests); import-linter and ``tests/core/test_architecture.py`` hold plugins to that.

Like ``optcore``, each name is loaded from its module on first use (PEP 562),
so importing this module imports neither pydantic nor pluggy nor the kit.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name -> the module that defines it (the TYPE_CHECKING block below
#: says the same to type checkers; tests/core/test_architecture.py keeps them equal)
_LAZY = {
    name: module
    for module, names in {
        "optcore._contract": "Optimizer ContractMixin GroupSelector",
        "optcore.grads": "by_device_and_dtype total_grad_norm",
        "optcore._adapt": "adapt",
        "optcore._fields": "HParams LR Beta Betas Eps WeightDecay Momentum Flag OptionalFlag Literalish",
        "optcore._schema": "validate_hparams schema_from_signature",
        "optcore._literals": "parse_optim_args parse_literal",
        "optcore._hooks": "hookimpl",
        "optcore.plugin._step": "prepare_step PreparedStep check_step_state",
        "optcore.placement": "in_dcp_get",
        "optcore.testing": "conformance_cases run_check run_conformance ConformanceInputs ConformanceSkip",
    }.items()
    for name in names.split()
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'optcore.plugin' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from optcore._adapt import adapt
    from optcore._contract import ContractMixin, GroupSelector, Optimizer
    from optcore._fields import LR, Beta, Betas, Eps, Flag, HParams, Literalish, Momentum, OptionalFlag, WeightDecay
    from optcore.grads import by_device_and_dtype, total_grad_norm
    from optcore._hooks import hookimpl
    from optcore._literals import parse_literal, parse_optim_args
    from optcore._schema import schema_from_signature, validate_hparams
    from optcore.plugin._step import PreparedStep, check_step_state, prepare_step
    from optcore.placement import in_dcp_get
    from optcore.testing import ConformanceInputs, ConformanceSkip, conformance_cases, run_check, run_conformance
