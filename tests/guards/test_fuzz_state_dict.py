"""Fuzzed checkpoints for every optimizer optcore builds (issue 40): a saved
state dict with keys dropped, renamed or added and values replaced by crafted
ones (NaN, negative and huge numbers, text with escapes, nested junk, tensors of
another shape, dtype or layout, views that share memory), anywhere in it: the
state, the param groups, optcore's record, a wrapper's scaler and masters.

Loading one either works or raises an OptcoreError, and a refused load leaves
the state, the param groups and the parameters as they were. A load that works
is then stepped: the step works or raises an OptcoreError too. No other
exception escapes, and no message holds a raw escape character.
"""

from __future__ import annotations

import copy
import functools
import math
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import optcore

sys.path.insert(0, str(Path(__file__).parent))
from checkpoints import Case, cases, same, snapshot  # noqa: E402

CASES = cases()

#: the values a crafted checkpoint puts anywhere (tensors are made per example from a ``("tensor", how)`` tag)
NASTY = st.sampled_from([
    None, True, False, 0, 1, -1, -5, 2**63, 2**200, 0.5, -1e9, 1e308, math.nan, math.inf, -math.inf, "", "x" * 5000,
    "exp_avg", "\x1b[2J\x1b]0;pwned\x07", "[bold red]x[/", b"\x00\xff", [], [0], [None, "a"], {}, {"exp_avg": 1},
    ("tensor", "nan"), ("tensor", "inf"), ("tensor", "scalar"), ("tensor", "vector"), ("tensor", "int"),
    ("tensor", "expanded"), ("tensor", "meta"), ("tensor", "complex"), ("tensor", "bool"), ("tensor", "shared"),
])  # fmt: skip
JUNK = st.recursive(NASTY, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(["step", "exp_avg", "lr", "params", "state", "x"]) | st.integers(-2, 5), inner, max_size=3),
    max_leaves=6)  # fmt: skip
#: one change: (where, by the index of a path among the dict's paths; what; the new value or key)
OPS = st.lists(
    st.tuples(st.integers(0, 10_000), st.sampled_from(["set", "drop", "rename", "add"]), JUNK,
              st.sampled_from(["exp_avgg", "", "step ", "momentum_buffer", "0", "\x1b[31m", "lr", "params"])),
    min_size=1, max_size=4,
)  # fmt: skip


@functools.cache
def _saved(name: str) -> dict[str, Any]:
    return next(c for c in CASES if c.name == name).saved()


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a state dict: each key of each mapping and each item of each list, nested."""
    out = []
    if isinstance(value, dict):
        for key, item in value.items():
            out.append((*prefix, key))
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out.append((*prefix, i))
            out += _paths(item, (*prefix, i))
    return out


def _value(spec: Any, sd: dict[str, Any], like: Any) -> Any:
    """A crafted value: ``spec`` itself, or the tensor its tag names (shaped like ``like`` where it is one)."""
    if isinstance(spec, list):
        return [_value(s, sd, None) for s in spec]
    if isinstance(spec, dict):
        return {k: _value(v, sd, None) for k, v in spec.items()}
    if not (isinstance(spec, tuple) and spec and spec[0] == "tensor"):
        return spec
    shape = tuple(like.shape) if isinstance(like, torch.Tensor) and like.dim() else (2, 3)
    how = spec[1]
    if how == "nan":
        return torch.full(shape, math.nan)
    if how == "inf":
        return torch.full(shape, -math.inf)
    if how == "scalar":
        return torch.tensor(-3.0)
    if how == "vector":
        return torch.zeros(7)
    if how == "int":
        return torch.ones(shape, dtype=torch.int64)
    if how == "expanded":
        return torch.zeros((1,) * len(shape)).expand(shape)
    if how == "meta":
        return torch.empty(shape, device="meta")
    if how == "complex":
        return torch.zeros(shape, dtype=torch.complex64)
    if how == "bool":
        return torch.ones(shape, dtype=torch.bool)
    for entry in sd.get("state", {}).values():  # "shared": a view of another state tensor of the checkpoint
        for other in entry.values() if isinstance(entry, dict) else ():
            if isinstance(other, torch.Tensor) and other.dim() and other.numel() >= 2:
                return other.reshape(-1)[: math.prod(shape)].reshape(shape) if other.numel() >= math.prod(shape) \
                    else other.reshape(-1)[:1].expand(shape)
    return torch.zeros(shape)


def _crafted(saved: dict[str, Any], ops: list[tuple[int, str, Any, str]]) -> dict[str, Any]:
    sd = copy.deepcopy(saved)
    for index, op, value, name in ops:
        paths = _paths(sd)
        if not paths:
            break
        *parent_path, key = paths[index % len(paths)]
        parent: Any = sd
        for step in parent_path:
            parent = parent[step]
        like = parent[key]
        if op == "set":
            parent[key] = _value(value, sd, like)
        elif op == "drop":
            parent.pop(key) if isinstance(parent, dict) else parent.pop(key)
        elif op == "rename" and isinstance(parent, dict):
            parent[name] = parent.pop(key)
        elif op == "add" and isinstance(like, dict):
            like[name] = _value(value, sd, next(iter(like.values()), None))
        elif op == "add" and isinstance(like, list):
            like.append(_value(value, sd, None))
    return sd


def _clean(message: str) -> None:
    assert "\x1b" not in message and "\x07" not in message, f"a raw escape reached the message: {message[:300]!r}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(ops=OPS)
def test_a_fuzzed_checkpoint_loads_or_is_refused_and_changes_nothing(case: Case, ops):
    sd = _crafted(_saved(case.name), ops)
    opt, model = case.fresh()
    before, params = snapshot(opt, model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            opt.load_state_dict(sd)
        except optcore.OptcoreError as exc:
            _clean(str(exc))
            after, now = snapshot(opt, model)
            assert same(before, after) and same(params, now), f"a refused load changed the optimizer ({exc})"
            return
        for warning in caught:
            _clean(str(warning.message))
    try:
        case.train(opt, model, 1, seed=3)
    except optcore.OptcoreError as exc:
        _clean(str(exc))
