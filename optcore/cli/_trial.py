"""``optcore check``'s last step: the plan's classes constructed over stand-in
parameters, so that their own validation runs too.

A schema says what a field may hold; a constructor may still refuse a value
(lion-pytorch's ``assert lr > 0``), a combination (a precision wrapper refusing
an inner optimizer that has state already, bf16 with a loss scaler), or a
per-group value. Constructing is the only way to hear those, and it costs
nothing on the meta device: the stand-ins are 2-D tensors with shapes and no
data, one per group the build can make (the default group, the no-decay group,
one per ``param_groups`` entry), in the dtype a precision wrapper asks for.

A class whose constructor needs real data (``.item()``, a device kernel that
has no meta implementation, torch's ``fused=True``) fails on meta for reasons
of the stand-ins' own; it is tried again over the same stand-ins on the CPU
(a few bytes each), and that verdict is the one a CPU build gives. The trial
writes nothing and calls no ``optcore_optimizer_built`` hook; warnings the
constructors give are the build's to show, not the check's. A constructor that
loads a plugin's C kernel (optcore-adafactor's ``implementation: c``) builds it
into the kernel cache as the build would.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

import torch

from .._build import construct
from .._errors import OptcoreError
from .._group_rules import compile_rules
from .._plan import BuildPlan, with_groups

#: a stand-in parameter: 2-D, since some classes step matrices only (Muon), and small
SHAPE = (2, 2)


def trial_construct(plan_: BuildPlan) -> None:
    """Construct ``plan_`` (made without parameters) over stand-in parameters and
    discard it; raises the :class:`~optcore.OptcoreError` the build would."""
    dtype = plan_.param_dtype or torch.float32
    try:
        _construct_on(plan_, "meta", dtype)
    except OptcoreError as exc:
        if not _meta_only(exc):
            raise
        _construct_on(plan_, "cpu", dtype)


def _meta_only(exc: OptcoreError) -> bool:
    """Whether the constructor failed with an exception of its own (not optcore's
    validation), which meta tensors may have caused."""
    return exc.__cause__ is not None and not isinstance(exc.__cause__, OptcoreError)


def _construct_on(plan_: BuildPlan, device: str, dtype: torch.dtype) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        construct(_with_stand_ins(plan_, device, dtype), announce=False)


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
