"""``optcore check``'s last step: the plan's classes constructed over stand-in
parameters, so that their own validation runs too.

A schema says what a field may hold; a constructor may still refuse a value
(lion-pytorch's ``assert lr > 0``), a combination (a precision wrapper refusing
an inner optimizer that has state already, bf16 with a loss scaler), or a
per-group value. Constructing is the only way to hear those. The stand-ins are
2-D CPU tensors of four elements (some classes step matrices only: Muon), one
per group the build can make (the default group, the no-decay group, one per
``param_groups`` entry), in the dtype a precision wrapper asks for.

They are real CPU tensors, not meta ones, because the verdict is the one a CPU
build gives: a meta tensor has no data, so a constructor's fill of a value its
dtype cannot hold passes there and fails on the CPU (torch's Adagrad's
``initial_accumulator_value=1e30`` in fp16, or 1e39 in fp32), ``.item()`` has
nothing to read, and the plan picks torch's fused kernel for CPU parameters
only. The trial writes nothing and calls no ``optcore_optimizer_built`` hook;
warnings the constructors give are the build's to show, not the check's. A
constructor that loads a plugin's C kernel (optcore-adafactor's
``implementation: c``) builds it into the kernel cache as the build would.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

import torch

from .._build import construct
from .._group_rules import compile_rules
from .._plan import BuildPlan, with_groups

#: a stand-in parameter: 2-D, since some classes step matrices only (Muon), and small
SHAPE = (2, 2)


def trial_construct(plan_: BuildPlan) -> None:
    """Construct ``plan_`` (made without parameters) over stand-in parameters and
    discard it; raises the :class:`~optcore.OptcoreError` the build would."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        construct(_with_stand_ins(plan_, "cpu", plan_.param_dtype or torch.float32), announce=False)


def _with_stand_ins(plan_: BuildPlan, device: str, dtype: torch.dtype) -> BuildPlan:
    if plan_.inner is not None:
        return replace(plan_, inner=_with_stand_ins(plan_.inner, device, dtype))
    if plan_.parts:  # a composite: each optimizer over stand-ins of its own, labelled as the build labels them
        parts = [_with_stand_ins(replace(part, group_specs=()), device, dtype) for part in plan_.parts]
        for i, part in enumerate(parts):
            for group in part.groups:
                group["optimizer"] = f"{part.spec.name}-{i}"
        return replace(plan_, parts=tuple(parts), groups=tuple(g for part in parts for g in part.groups))

    def param() -> torch.nn.Parameter:
        return torch.nn.Parameter(torch.zeros(SHAPE, dtype=dtype, device=device))

    groups: list[dict[str, Any]] = [{"params": [param()]}]
    decay = plan_.hparams.get("weight_decay") if "weight_decay" in plan_.spec.schema.model_fields else None
    if plan_.no_decay and decay:
        groups.append({"weight_decay": 0.0, "params": [param()]})
    groups += [{**values, "params": [param()]} for _, values in compile_rules(plan_.group_specs, "param_groups")]
    return with_groups(plan_, groups)
