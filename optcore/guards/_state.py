"""What a state dict must be before it loads: its structure, its param groups'
values, and each parameter's state judged against the *live* parameter by the
rule of the optimizer that owns it; then every state tensor as a whole
(:mod:`._state_tensors`: finite, no shared memory).

A checkpoint's own record (``"optcore": {"param_shapes": ...}``) can only
refuse, never vouch: a crafted one says whatever fits. A fused kernel writes
as many elements as the parameter has through each state tensor, so one of
another shape corrupts the heap instead of raising; a misspelt key loads as a
state the step never reads, so the statistics restart from zero unnoticed.

The rule is data the optimizer declares as ``state_shapes``:

- a callable ``(group, param) -> {key: shape}``: exactly the state it keeps
  for ``param`` once ``param`` has stepped under ``group``'s values (the
  group as it will be after the load: the saved values and the overrides).
  A parameter's saved state lacks none of these keys and has no other; a
  shape ``()`` is a 0-dim tensor or a number, and ``"step"`` a count. It may
  return ``None`` for a parameter whose state it does not know;
- ``"elementwise"`` (:data:`ELEMENTWISE`): every state tensor with a dimension
  has the parameter's shape; the keys are not judged;
- ``None`` (the default): a layout optcore does not know; the step counts,
  the dtypes, finiteness and shared memory are checked only.

An optimizer made of others (a composite) names the one that owns a param
group with a ``part_for(group)`` method; that one's rule and schema judge it.
``torch.optim``'s classes declare nothing; their rules are
:data:`optcore._torch_facts.TORCH_STATE`.
"""

from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from .._errors import ConfigError
from .._torch_facts import TORCH_FACTS, TORCH_STATE
from .._values import clean_text, short_repr
from ._state_tensors import non_finite, sharing_problem, state_values

ELEMENTWISE = "elementwise"

#: bitsandbytes' 8-bit moments: quantised floats, not integers.
_QUANTISED = ("uint8", "int8")

Shapes = Mapping[str, Sequence[int]]
Rule = Callable[[Mapping[str, Any], Tensor], Shapes | None] | str | None
#: ``(owner, values, label)``: a ConfigError if ``values`` (a param group's) are not a valid config of ``owner``
GroupCheck = Callable[[Any, Mapping[str, Any], str], None]

_OTHER_MODEL = (
    "It was saved for another model (or another parameter order); load the matching checkpoint, or skip "
    "load_state_dict to start the optimizer fresh."
)
_DAMAGED = (
    "The checkpoint is damaged or was edited; load the checkpoint as it was saved, or skip load_state_dict "
    "to start the optimizer fresh."
)
#: param group entries that are not hyper-parameters
_GROUP_META = frozenset({"params", "param_names", "name", "lr_scale", "optimizer", "initial_lr"})


def state_rule(optimizer: Any) -> Rule:
    """The ``state_shapes`` rule of ``optimizer`` (torch's classes' from the table)."""
    declared = getattr(optimizer, "state_shapes", None)
    if declared is not None:
        return declared  # type: ignore[no-any-return]
    cls = getattr(type(optimizer), "adapted_from", type(optimizer))
    if cls.__module__.startswith("torch.optim") and cls.__name__ in TORCH_FACTS:
        return _torch_rule(cls.__name__) if cls.__name__ in TORCH_STATE else None
    return None


def torch_adafactor_shapes(group: Mapping[str, Any], param: Tensor) -> dict[str, tuple[int, ...]]:
    """torch.optim.Adafactor's: row and column factors keeping a 1 where they reduce."""
    shape = tuple(param.shape)
    if len(shape) < 2:
        return {"variance": shape}
    return {"row_var": shape[:-1] + (1,), "col_var": shape[:-2] + (1, shape[-1])}


@functools.cache
def _torch_rule(name: str) -> Callable[[Mapping[str, Any], Tensor], dict[str, tuple[int, ...]]]:
    """The callable rule :data:`TORCH_STATE` spells for ``name``."""
    keys = []
    for token in TORCH_STATE[name].split():
        key, _, flag = token.partition("?")
        keys.append((key.removesuffix("()"), key.endswith("()"), flag or None))
    factored = name == "Adafactor"

    def rule(group: Mapping[str, Any], param: Tensor) -> dict[str, tuple[int, ...]]:
        shapes = {key: () if scalar else tuple(param.shape) for key, scalar, flag in keys if not flag or group.get(flag)}
        return {**shapes, **torch_adafactor_shapes(group, param)} if factored else shapes

    rule.__qualname__ = f"torch.optim.{name}'s state"
    return rule


def check_state_dict(
    optimizer: Any,
    state_dict: Mapping[str, Any],
    saved_shapes: Any = None,
    overrides: Mapping[str, Any] | None = None,
    check_group: GroupCheck | None = None,
) -> None:
    """A :class:`ConfigError` naming the first param group, parameter or state
    that cannot be right for ``optimizer``, before anything loads. ``check_group``
    validates a group's values as a config of its owner would be (the contract
    passes its schema check); ``overrides`` are the values the load will set."""
    groups, state = _structure(optimizer, state_dict)
    located: list[tuple[str, Mapping[str, Any]]] = []
    position = 0
    for g, (saved, live) in enumerate(zip(groups, optimizer.param_groups)):
        owner = optimizer.part_for(live) if hasattr(optimizer, "part_for") else optimizer
        group = _group_after_load(saved, live, overrides)
        if check_group is not None:
            _check_group(check_group, owner, group, g)
        rule = state_rule(owner)
        for i, (index, param) in enumerate(zip(saved["params"], live["params"])):
            names = live.get("param_names")
            name = f"{short_repr(names[i], 80)} " if isinstance(names, (list, tuple)) and i < len(names) else ""
            where = f"parameter {position + i} {name}(#{i} of param group {g}, shape {tuple(param.shape)})"
            problem, tail = _record_problem(param, index, saved_shapes), _OTHER_MODEL
            entry = state.get(index)
            if problem is None and not entry and isinstance(saved_shapes, Mapping) and index in saved_shapes:
                problem, tail = "the checkpoint's record says it had state, and the state has none for it", _DAMAGED
            if problem is None and entry is not None:
                problem, tail = _entry_problem(param, entry, rule, group)
            if problem:
                raise ConfigError(
                    f"The state_dict does not fit this optimizer's parameters: {where}: {problem}. {tail}",
                    problems=[(f"state[{short_repr(index)}]", problem)],
                )
            if isinstance(entry, Mapping):
                located.append((where, entry))
        position += len(live["params"])
    _check_tensors(located)


def _group_after_load(saved: Mapping[str, Any], live: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The param group as the optimizer will hold it after the load: torch takes
    the saved values over the live ones, and the overrides go over both."""
    values = {k: v for k, v in saved.items() if k != "params"}
    return {**live, **values, **(overrides or {}), "params": live["params"]}


def _check_group(check_group: GroupCheck, owner: Any, group: Mapping[str, Any], g: int) -> None:
    values = {k: v for k, v in group.items() if isinstance(k, str) and k not in _GROUP_META}
    try:
        check_group(owner, values, f"{type(owner).__name__} (param group {g} of the state_dict)")
    except ConfigError as exc:
        said = "; ".join(f"{field}: {msg}" for field, msg in exc.problems[:6]) or clean_text(exc, 300)
        raise ConfigError(
            f"This state_dict's param group {g} holds values {type(owner).__name__} refuses in a config ({said}). "
            f"{_DAMAGED} To resume with other values, pass them as load_state_dict(..., optimizer_overrides=...).",
            problems=[(f"param_groups[{g}].{field}", msg) for field, msg in exc.problems] or [(f"param_groups[{g}]", said)],
            accepted=exc.accepted, target=exc.target,
        ) from None


def _check_tensors(located: list[tuple[str, Mapping[str, Any]]]) -> None:
    values = state_values(located)
    bad = non_finite(values)
    if bad is not None:
        where, key, _ = bad
        raise ConfigError(
            f"The state_dict's state {short_repr(key)} of {where} holds a NaN or an infinity: the next step would "
            f"make the parameter non-finite. {_DAMAGED}",
            problems=[(f"state {where}", f"{clean_text(key, 80)}: not finite")],
        )
    shared = sharing_problem(values)
    if shared is not None:
        (where, key, _), why = shared
        raise ConfigError(
            f"The state_dict's state {short_repr(key)} of {where} is not a tensor of its own: {why}, so one update "
            f"would write into another's statistics. {_DAMAGED}",
            problems=[(f"state {where}", f"{clean_text(key, 80)}: shares memory")],
        )


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
    elif len({i for g in groups for i in g["params"]}) != sum(len(g["params"]) for g in groups):
        problem = "a parameter index appears twice in its param groups"
    elif not all(_is_index(i) for i in state):
        problem = "its 'state' has a key that is not a parameter index"
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
        defaults = (optimizer.part_for(group) if hasattr(optimizer, "part_for") else optimizer).defaults
        missing = sorted(k for k, v in group.items() if k not in saved and k in defaults and _required(v))
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
    """What is wrong with one parameter's saved state, and what to do about it."""
    if not isinstance(entry, Mapping):
        return f"its state is {short_repr(entry, 40)}, not a mapping", _DAMAGED
    if not all(isinstance(key, str) for key in entry):
        return f"its state has a key that is not a name ({short_repr(list(entry), 60)})", _DAMAGED
    present = [key for key, value in entry.items() if value is not None]  # None: absent (older torch's SGD)
    try:
        expected = rule(group, param) if callable(rule) and present else None
    except (TypeError, ValueError, KeyError, RuntimeError) as exc:
        return f"its param group's values do not fit this optimizer ({type(exc).__name__}: {clean_text(exc, 120)})", _DAMAGED
    if expected is not None:
        problem = _keys_problem(present, expected)
        if problem:
            return problem, _DAMAGED if any(k in expected for k in present) else _OTHER_MODEL
    for key in present:
        value = entry[key]
        if key == "step":
            problem = _step_problem(value)
            if problem:
                return problem, _DAMAGED
            continue
        want = tuple(expected[key]) if expected is not None else None
        if not isinstance(value, Tensor):
            if expected is not None and (want or not _finite_number(value)):
                kind = f"a tensor of shape {want}" if want else "a finite number or a 0-dim tensor"
                return f"state {short_repr(key)} is {short_repr(value, 40)}, not {kind}", _DAMAGED
            continue
        if (
            value.shape == param.shape
            and value.is_floating_point() != param.is_floating_point()
            and str(value.dtype).removeprefix("torch.") not in _QUANTISED
        ):
            return f"state {short_repr(key)} is {value.dtype} and the parameter {param.dtype} (floating vs integer)", _OTHER_MODEL
        if want is None and (value.dim() == 0 or rule is None):
            continue
        want = tuple(param.shape) if want is None else want
        if tuple(value.shape) != want:
            return f"state {short_repr(key)} has shape {tuple(value.shape)}, expected {want}", _OTHER_MODEL
    return None, _OTHER_MODEL


def _keys_problem(present: list[str], expected: Shapes) -> str | None:
    """A missing or unknown key, with the close names: ``exp_avgg`` for ``exp_avg``."""
    missing = [k for k in expected if k not in present]
    unknown = [k for k in present if k not in expected]
    if not missing and not unknown:
        return None
    parts = []
    if unknown:
        parts.append(f"state {', '.join(map(short_repr, unknown[:4]))} is not one this optimizer keeps")
    if missing:
        close = {k: difflib.get_close_matches(k, unknown, n=1, cutoff=0.6) for k in missing}
        said = [f"{short_repr(k)} (saved as {short_repr(close[k][0])}?)" if close[k] else short_repr(k) for k in missing]
        parts.append(f"state {', '.join(said[:4])} is missing, so the step would restart it from zero or fail")
    return f"{'; '.join(parts)} (it keeps {sorted(expected)} for this parameter)"


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


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
