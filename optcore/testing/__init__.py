"""optcore's conformance kit: one set of checks every optimizer runs through.

Like torch's ``OptimizerInfo`` tests, the checks are generic and the
per-optimizer differences are *data*: a :class:`ConformanceInputs` record
(the class's ``conformance_inputs`` attribute, optcore's table for
``torch.optim``, or one given by the caller), which also lists the parameter
dtypes the optimizer supports. Plugins use it from their own tests::

    import pytest
    from optcore.testing import conformance_cases, run_check

    LION = {"type": "optcore-lion:Lion", "lr": 1e-3}

    @pytest.mark.parametrize(("check", "dtype"), conformance_cases(LION))
    def test_conformance(check, dtype):
        run_check(check, LION, dtype=dtype)

and declare what differs on the class::

    class Lion(optcore.Optimizer):
        conformance_inputs = {"config": {"lr": 1e-3}, "dtypes": ("float32", "float64", "bfloat16")}

Public API (everything else in this package is private):

- :class:`ConformanceInputs`, :func:`inputs_for`, :func:`with_config`,
  :data:`DTYPES` -- the record of an optimizer (``optcore.testing._inputs``);
- :data:`CHECKS` -- check name -> ``check(config, inputs, dtype)``, and the
  ``check_*`` functions themselves (``optcore.testing._checks``);
- :func:`run_check`, :func:`run_conformance`, :class:`ConformanceSkip` -- running
  them, and :func:`conformance_cases` -- every check in every dtype the
  optimizer declares, as pytest params (``optcore.testing._runner``).
- :data:`BAD_STEP_INPUTS`, :data:`STEPPABLE_STEP_INPUTS`, :func:`assert_step_refused`,
  :func:`snapshot`, :func:`same` -- gradients and state no step can use, and
  the check that one is refused with nothing changed, for a plugin's tests of
  each of its backends (``optcore.testing._step_inputs``);
- :func:`check_placements`, :class:`PlacementCase`, :class:`PlacementReport`,
  :class:`PlacementResult`, :data:`PLACEMENTS` -- the placement dimension: any
  optimizer under DDP, FSDP2 on 2-4 ranks, HSDP, ZeRO, DeepSpeed ZeRO-1/2/3 and
  DCP resumes across world sizes on spawned gloo ranks, each compared with one
  process within its own noise (``optcore.testing._placements``; what each
  placement runs in ``optcore.testing._placement_runs``, the spawning in
  ``optcore.testing._ranks``).

The kit's problem (a small seeded net and regression task) lives in
``optcore.testing._fixtures``. Each check builds fresh models with a fixed seed
and raises ``AssertionError`` with the optimizer, the dtype and the check named.
"""

from __future__ import annotations

from ._checks import (
    CHECKS,
    check_closure,
    check_contract,
    check_converges,
    check_deepcopy,
    check_grad_ops,
    check_groups,
    check_lr_scheduler,
    check_none_grads,
    check_pickle,
    check_state_dict_checks,
    check_state_dict_roundtrip,
    check_step_with_scale,
)
from ._inputs import DTYPES, ConformanceInputs, inputs_for, with_config
from ._placements import PLACEMENTS, PlacementCase, PlacementReport, PlacementResult, check_placements
from ._runner import ConformanceSkip, conformance_cases, run_check, run_conformance
from ._step_inputs import BAD_STEP_INPUTS, STEPPABLE_STEP_INPUTS, assert_step_refused, same, snapshot

__all__ = [
    "BAD_STEP_INPUTS",
    "CHECKS",
    "PLACEMENTS",
    "PlacementCase",
    "PlacementReport",
    "PlacementResult",
    "STEPPABLE_STEP_INPUTS",
    "assert_step_refused",
    "check_placements",
    "DTYPES",
    "ConformanceInputs",
    "ConformanceSkip",
    "check_closure",
    "check_contract",
    "check_converges",
    "check_deepcopy",
    "check_grad_ops",
    "check_groups",
    "check_lr_scheduler",
    "check_none_grads",
    "check_pickle",
    "check_state_dict_checks",
    "check_state_dict_roundtrip",
    "check_step_with_scale",
    "conformance_cases",
    "inputs_for",
    "run_check",
    "run_conformance",
    "same",
    "snapshot",
    "with_config",
]
