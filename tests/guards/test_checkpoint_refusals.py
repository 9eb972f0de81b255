"""Every optimizer optcore builds refuses each class of crafted checkpoint by
name, before anything loads (issue 40): unknown and missing state keys,
shapes that do not fit (composites too), step counts that are not whole
numbers >= 0, non-finite state, state tensors that share memory, group values
the optimizer's schema refuses, and a record whose text would restyle the
terminal. After a refusal the state, the param groups and the parameters are
as they were, and the optimizer still steps."""

from __future__ import annotations

import copy
import math
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import optcore

sys.path.insert(0, str(Path(__file__).parent))
from checkpoints import Case, cases, first_entry, same, snapshot, tensor_keys  # noqa: E402

CASES = cases()


def _refused(case: Case, sd: dict[str, Any], *names: str) -> optcore.ConfigError:
    """Loading ``sd`` is a ConfigError whose message holds each of ``names``, and changes nothing."""
    opt, model = case.fresh()
    before, params = snapshot(opt, model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(optcore.ConfigError) as info:
            opt.load_state_dict(sd)
    message = str(info.value)
    for name in names:
        assert name in message, f"{case.name}: the refusal does not name {name!r}: {message}"
    after, params_after = snapshot(opt, model)
    assert same(before, after), f"{case.name}: a refused load changed the optimizer's state or param groups"
    assert same(params, params_after), f"{case.name}: a refused load changed the parameters"
    case.train(opt, model, 1, seed=3)  # and it still steps
    assert all(torch.isfinite(p).all() for p in model.parameters())
    return info.value


def _where(sd: dict[str, Any], index: Any) -> str:
    """How the refusal names the parameter at ``index``: by its position over all groups."""
    flat = [i for g in sd["param_groups"] for i in g["params"]]
    return f"parameter {flat.index(index)} "


@pytest.fixture(params=CASES, ids=lambda c: c.name)
def case(request: pytest.FixtureRequest) -> Case:
    return request.param


def test_a_misspelt_state_key_is_refused_by_name(case):
    """``exp_avg`` saved as ``exp_avgg``: SGD and Lion loaded it and restarted the
    momentum from zero; AdamW, Adam and Adagrad loaded it and failed at step with a KeyError."""
    sd = case.saved()
    index, entry = first_entry(sd)
    key = tensor_keys(entry)[0]
    entry[key + "g"] = entry.pop(key)
    _refused(case, sd, _where(sd, index), f"'{key}g'", f"'{key}'")


def test_a_missing_state_key_is_refused_by_name(case):
    """A removed key (FP16Optimizer's AdamW: a KeyError at step); where a
    parameter keeps one key only, the record that it had state refuses it."""
    sd = case.saved()
    index, entry = first_entry(sd)
    keys = [k for k in entry if entry[k] is not None]
    key = tensor_keys(entry)[0]
    del entry[key]
    _refused(case, sd, _where(sd, index), *([f"'{key}'"] if len(keys) > 1 else []))


@pytest.mark.parametrize("change", ["transposed", "shrunk"])
def test_state_of_another_shape_is_refused_for_composites_too(case, change):
    """The Muon+AdamW composite skipped the shape check and failed at step with a RuntimeError."""
    sd = case.saved()
    del sd["optcore"]  # no record to refuse it: the state itself is judged
    for group in sd["param_groups"]:
        group.pop("optcore", None)
    index, entry = first_entry(sd)
    key = tensor_keys(entry)[0]
    value = entry[key]
    if change == "transposed":
        if value.dim() < 2 or value.shape[0] == value.shape[-1]:
            pytest.skip(f"{case.name}'s {key!r} is {tuple(value.shape)}: a transpose keeps its shape")
        entry[key] = value.transpose(0, -1).contiguous()
    else:
        entry[key] = value[..., :1].contiguous() if value.shape[-1] > 1 else value[:0].contiguous()
    _refused(case, sd, _where(sd, index), f"'{key}'")


def _step_counters(sd: dict[str, Any]) -> list[tuple[Callable[[Any], None], bool]]:
    """Setters of every step counter the state dict keeps, and whether it counts
    whole steps: the per-parameter ``step``, AdaScaleSGD's progress (a sum of
    gains: fractional), the loss scaler's ``iter``; a state without one gets a
    ``step`` (which the optimizer does not keep)."""
    _, entry = first_entry(sd)
    setters: list[tuple[Callable[[Any], None], bool]] = []
    if "step" in entry:
        tensor = isinstance(entry["step"], torch.Tensor)
        setters.append((lambda v: entry.__setitem__("step", torch.tensor(float(v)) if tensor else v), True))
    if "adascale" in sd:
        setters.append((lambda v: sd["adascale"].__setitem__("progress", v), False))
    if "loss_scaler" in sd:
        setters.append((lambda v: sd["loss_scaler"].__setitem__("iter", v), True))
    return setters or [(lambda v: entry.__setitem__("step", v), True)]


@pytest.mark.parametrize("count", [-5, 2.5, math.nan])
def test_a_negative_or_fractional_step_count_is_refused(case, count):
    """AdaScaleSGD (its progress) and MemoryEfficientFP16Optimizer (its loss
    scaler's iter) loaded ``-5``."""
    for position in range(len(_step_counters(case.saved()))):
        sd = case.saved()
        sd["param_groups"][0].pop("optcore", None)  # AdaScale's and the wrappers' copies of their entries
        setter, whole = _step_counters(sd)[position]
        if count == 2.5 and not whole:
            continue
        setter(count)
        error = _refused(case, sd)
        assert re.search(r"step|progress|iter", str(error)), str(error)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_state_is_refused(case, value):
    sd = case.saved()
    index, entry = first_entry(sd)
    key = tensor_keys(entry)[0]
    entry[key] = entry[key].clone()
    entry[key].view(-1)[0] = value
    _refused(case, sd, _where(sd, index), f"'{key}'", "NaN or an infinity")


def test_a_non_finite_loss_scale_is_refused():
    for case in CASES:
        sd = case.saved()
        if "loss_scaler" not in sd:
            continue
        sd["param_groups"][0].pop("optcore", None)
        for bad in ({"loss_scaler": {**sd["loss_scaler"], "loss_scale": math.inf}},
                    {"loss_scaler": None, "loss_scale": math.nan}):
            crafted = {**copy.deepcopy(sd), **bad}
            if crafted["loss_scaler"] is None:
                del crafted["loss_scaler"]
            _refused(case, crafted, "loss_scale")


@pytest.mark.parametrize("how", ["views of one buffer", "one tensor twice", "expanded"])
def test_state_tensors_that_share_memory_are_refused(case, how):
    """Two moments that are views of one buffer: one update writes into the
    other's statistics (the parameters went non-finite without a word)."""
    sd = case.saved()
    index, entry = first_entry(sd)
    key = tensor_keys(entry)[0]
    big = entry[key]
    if how == "expanded":
        entry[key] = big.reshape(-1)[:1].expand(big.shape)
    else:
        others = [(i, e, k) for i, e in sd["state"].items() if i != index and e for k in tensor_keys(e)]
        i, other, other_key = next(o for o in others if o[1][o[2]].numel() <= big.numel())
        small = other[other_key]
        other[other_key] = big if how == "one tensor twice" and small.shape == big.shape else (
            big.reshape(-1)[: small.numel()].view(small.shape))
    _refused(case, sd, f"'{key}'")


@pytest.mark.parametrize(("field", "value"), [("lr", -1e9), ("lr", math.nan), ("lr", "fast")])
def test_a_group_value_is_validated_by_the_schema_as_a_config_is(case, field, value):
    sd = case.saved()
    sd["param_groups"][0][field] = value
    _refused(case, sd, "param group 0", field)


def test_a_group_value_fixed_by_the_overrides_loads(case):
    """The refusal says to pass optimizer_overrides; doing so loads."""
    sd = case.saved()
    sd["param_groups"][0]["lr"] = -1e9
    opt, model = case.fresh()
    lr = opt.param_groups[0]["lr"]
    opt.load_state_dict(sd, optimizer_overrides={"lr": lr})
    assert opt.param_groups[0]["lr"] == lr
    case.train(opt, model, 1)


@pytest.mark.parametrize("field", ["version", "name", "provider"])
def test_the_records_text_reaches_no_message_or_warning_raw(case, field):
    """An identity record with terminal escape sequences was printed raw in the version warning."""
    sd = case.saved()
    sd["optcore"][field] = "\x1b[31mred\x1b]0;title\x07\r\n\x9b2J"
    for group in sd["param_groups"]:
        group.pop("optcore", None)
    opt, _ = case.fresh()
    said = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            opt.load_state_dict(sd)
        except optcore.OptcoreError as exc:
            said.append(str(exc))
    said += [str(w.message) for w in caught]
    assert any("red" in text for text in said), f"{case.name}: nothing said about the record's {field}: {said}"
    for text in said:
        assert not any(ch in text for ch in "\x1b\x07\r\x9b"), f"{case.name}: a raw control character: {text!r}"


def test_an_honest_checkpoint_still_loads_and_continues_the_same(case):
    """The checks refuse nothing honest: a round trip continues the trajectory."""
    model_a = case.model()
    opt_a = case.build(model_a)
    case.train(opt_a, model_a, 2)
    model_b = copy.deepcopy(model_a)
    opt_b = case.build(model_b)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    case.train(opt_a, model_a, 2, seed=11)
    case.train(opt_b, model_b, 2, seed=11)
    for a, b in zip(model_a.parameters(), model_b.parameters()):
        assert torch.allclose(a.float(), b.float(), atol=1e-6), case.name
