"""What a state dict must be before it loads: its structure, a step count per
parameter, and every state tensor's shape judged against the *live* parameter
by the rule of the optimizer that owns it.

A checkpoint's own record (``"optcore": {"param_shapes": ...}``) can only
refuse, never vouch: a crafted one says whatever fits. A fused kernel writes
as many elements as the parameter has through each state tensor, so one of
another shape corrupts the heap instead of raising.

The rule is data the optimizer declares as ``state_shapes``:

- ``"elementwise"`` (:data:`ELEMENTWISE`): every state tensor with a dimension
  has the parameter's shape (Adam's moments, SGD's momentum);
- a callable ``(group, param) -> {key: shape}``: the state tensors it keeps for
  ``param`` and their shapes (Adafactor's row and column statistics); a tensor
  under another key is refused;
- ``None`` (the default): a layout optcore does not know; only the step count,
  the dtypes and the record are checked.

``torch.optim``'s classes declare nothing; their rules follow from their
sharding in :data:`optcore._torch_facts.TORCH_FACTS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from .._errors import ConfigError
from .._torch_facts import TORCH_FACTS
from .._values import short_repr

ELEMENTWISE = "elementwise"

#: bitsandbytes' 8-bit moments: quantised floats, not integers.
_QUANTISED = ("uint8", "int8")

Rule = Callable[[Mapping[str, Any], Tensor], Mapping[str, Sequence[int]]] | str | None

_OTHER_MODEL = (
    "It was saved for another model (or another parameter order); load the matching checkpoint, or skip "
    "load_state_dict to start the optimizer fresh."
)
_DAMAGED = (
    "The checkpoint is damaged or was edited; load the checkpoint as it was saved, or skip load_state_dict "
    "to start the optimizer fresh."
)


def state_rule(optimizer: Any) -> Rule:
    """The ``state_shapes`` rule of ``optimizer``'s class (torch's from the table)."""
    cls = getattr(type(optimizer), "adapted_from", type(optimizer))
    declared = getattr(cls, "state_shapes", None)
    if declared is not None:
        return declared  # type: ignore[no-any-return]
    if cls.__module__.startswith("torch.optim") and cls.__name__ in TORCH_FACTS:
        return _TORCH_RULES.get(TORCH_FACTS[cls.__name__][2])
    return None


def torch_adafactor_shapes(group: Mapping[str, Any], param: Tensor) -> dict[str, tuple[int, ...]]:
    """torch.optim.Adafactor's: row and column factors keeping a 1 where they reduce."""
    shape = tuple(param.shape)
    if len(shape) < 2:
        return {"variance": shape}
    return {"row_var": shape[:-1] + (1,), "col_var": shape[:-2] + (1, shape[-1])}


#: torch's classes by how they couple elements: elementwise updates keep
#: elementwise moments, and so does the per-tensor Muon (its momentum); Adafactor
#: keeps factors; LBFGS's global history is not judged.
_TORCH_RULES: dict[str, Rule] = {"elementwise": ELEMENTWISE, "per_tensor": ELEMENTWISE, "factored": torch_adafactor_shapes}


def check_state_dict(optimizer: Any, state_dict: Mapping[str, Any], saved_shapes: Any = None) -> None:
    """A :class:`ConfigError` naming the first parameter whose saved state cannot
    be right for it, before anything loads."""
    groups, state = _structure(optimizer, state_dict)
    rule = state_rule(optimizer)
    position = 0
    for g, (saved, group) in enumerate(zip(groups, optimizer.param_groups)):
        for i, (index, param) in enumerate(zip(saved["params"], group["params"])):
            problem, tail = _record_problem(param, index, saved_shapes), _OTHER_MODEL
            entry = state.get(index)
            if problem is None and entry is not None:
                problem, tail = _entry_problem(param, entry, rule, group)
            if problem:
                raise ConfigError(
                    f"The state_dict does not fit this optimizer's parameters: parameter {position + i} (param "
                    f"group {g}, position {i}, shape {tuple(param.shape)}): {problem}. {tail}",
                    problems=[(f"state[{short_repr(index)}]", problem)],
                )
        position += len(group["params"])


def _structure(optimizer: Any, state_dict: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]], Mapping[Any, Any]]:
    """``param_groups`` and ``state`` when they have torch's layout and this optimizer's group sizes."""
    groups, state = state_dict.get("param_groups"), state_dict.get("state")
    problem = None
    if not isinstance(state, Mapping):
        problem = f"its 'state' is {short_repr(state, 40)}, not a mapping of parameter index to state"
    elif not isinstance(groups, (list, tuple)) or not all(isinstance(g, Mapping) for g in groups):
        problem = f"its 'param_groups' is {short_repr(groups, 40)}, not a list of mappings"
    elif not all(isinstance(g.get("params"), (list, tuple)) for g in groups):
        problem = "a param group's 'params' is not a list of parameter indices"
    elif not all(_is_index(i) for g in groups for i in g["params"]):
        problem = "a param group's 'params' holds something other than parameter indices"
    if problem:
        raise ConfigError(
            f"This is not an optimizer state_dict: {problem}. {_DAMAGED}", problems=[("state_dict", problem)]
        )
    saved_sizes = [len(g["params"]) for g in groups]  # type: ignore[union-attr]
    sizes = [len(g["params"]) for g in optimizer.param_groups]
    if saved_sizes != sizes:
        raise ConfigError(
            f"The state_dict does not fit this optimizer's parameters: it has param groups of {saved_sizes} "
            f"parameters, this optimizer {sizes}. {_OTHER_MODEL}",
            problems=[("param_groups", f"sizes {saved_sizes} != {sizes}")],
        )
    for g, (saved, group) in enumerate(zip(groups, optimizer.param_groups)):  # type: ignore[arg-type]
        missing = sorted(k for k, v in group.items() if k not in saved and k in optimizer.defaults and _required(v))
        if missing:
            raise ConfigError(
                f"This state_dict's param group {g} has no {missing}, which this optimizer's steps read. {_DAMAGED}",
                problems=[(f"param_groups[{g}]", f"missing {missing}")],
            )
    return list(groups), state  # type: ignore[arg-type]


def _required(value: Any) -> bool:
    """A number or tuple of numbers (lr, betas) has no stand-in; a switch or
    ``None`` a loader fills in (torch's ``__setstate__`` does, for older checkpoints)."""
    return isinstance(value, (int, float, tuple, Tensor)) and not isinstance(value, bool)


def _is_index(value: Any) -> bool:
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def _record_problem(param: Tensor, index: Any, saved_shapes: Any) -> str | None:
    """The record may refuse (its shape is not the parameter's), never vouch."""
    if not isinstance(saved_shapes, Mapping) or index not in saved_shapes:
        return None
    shape = saved_shapes[index]
    if not isinstance(shape, (list, tuple)) or not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
        return f"the checkpoint's record of its shape is {short_repr(shape, 40)}, not a shape"
    if tuple(shape) != tuple(param.shape):
        return f"the state was saved for shape {tuple(shape)}"
    return None


def _entry_problem(param: Tensor, entry: Any, rule: Rule, group: Mapping[str, Any]) -> tuple[str | None, str]:
    if not isinstance(entry, Mapping):
        return f"its state is {short_repr(entry, 40)}, not a mapping", _DAMAGED
    expected: Mapping[str, Sequence[int]] | None = None
    if callable(rule):
        expected = rule(group, param)
    for key, value in entry.items():
        if key == "step":
            problem = _step_problem(value)
            if problem:
                return problem, _DAMAGED
            continue
        if not isinstance(value, Tensor):
            continue
        if (
            value.shape == param.shape
            and value.is_floating_point() != param.is_floating_point()
            and str(value.dtype).removeprefix("torch.") not in _QUANTISED
        ):
            return f"state {short_repr(key)} is {value.dtype} and the parameter {param.dtype} (floating vs integer)", _OTHER_MODEL
        if value.dim() == 0 or rule is None:
            continue
        if expected is not None and key not in expected:
            return (
                f"state {short_repr(key)} (shape {tuple(value.shape)}) is not one this optimizer keeps "
                f"(it keeps {sorted(expected)} for this parameter)",
                _OTHER_MODEL,
            )
        want = tuple(expected[key]) if expected is not None else tuple(param.shape)
        if tuple(value.shape) != want:
            return f"state {short_repr(key)} has shape {tuple(value.shape)}, expected {want}", _OTHER_MODEL
    return None, _OTHER_MODEL


def _step_problem(value: Any) -> str | None:
    """A step count is a whole number >= 0: a NaN or negative one turns every
    later update's bias correction into NaN or a sign flip."""
    if isinstance(value, Tensor):
        if value.numel() != 1 or value.is_complex() or value.dtype == torch.bool:
            return f"state 'step' is a {value.dtype} tensor of shape {tuple(value.shape)}, not one count"
        number = value.detach().reshape(()).item()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = value
    else:
        return f"state 'step' is {short_repr(value, 40)}, not a count"
    if not math.isfinite(number) or number < 0 or number != int(number):
        return f"state 'step' is {short_repr(number, 40)}: a step count is a whole number >= 0"
    return None
