"""Checkpoints: what a state dict says about who saved it and for which
parameters, and what loading refuses (before anything changes)."""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch

import optcore


def _stepped(config, model, steps=2):
    opt = optcore.build_optimizer(config, model)
    for i in range(steps):
        opt.zero_grad()
        model(torch.randn(4, model.in_features, generator=torch.Generator().manual_seed(i))).pow(2).mean().backward()
        opt.step()
    return opt


def _roundtrip(sd):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("config", [{"type": "AdamW"}, {"type": "SGD", "momentum": 0.9}, {"type": "AdamW", "fused": False}])
@pytest.mark.parametrize("sizes", [(32, 64), (64, 32)], ids=["smaller-into-larger", "larger-into-smaller"])
def test_state_for_other_shapes_is_refused(config, sizes):
    """Linear(32, 32) state into Linear(64, 64) segfaulted fused AdamW/SGD on the
    next step; the other way round it stepped silently."""
    saved_in, load_in = sizes
    sd = _roundtrip(_stepped(config, torch.nn.Linear(saved_in, saved_in)).state_dict())
    target = torch.nn.Linear(load_in, load_in)
    opt = optcore.build_optimizer(config, target)
    with pytest.raises(optcore.ConfigError, match=r"parameter 0 .*shape \(%d, %d\)" % (load_in, load_in)):
        opt.load_state_dict(sd)
    assert not opt.state
    plain = {k: v for k, v in sd.items() if k != "optcore"}  # a torch state dict: judged by its tensors
    with pytest.raises(optcore.ConfigError, match="parameter 0"):
        opt.load_state_dict(plain)
    _stepped(config, target)  # the optimizer is untouched and works


def test_state_dict_records_the_optimizer():
    opt = _stepped({"type": "AdamW"}, torch.nn.Linear(3, 3))
    record = _roundtrip(opt.state_dict())["optcore"]
    assert record["name"] == "AdamW" and record["provider"] == "torch"
    assert record["version"] == torch.__version__ and type(record["version"]) is str
    assert record["param_shapes"] == {0: [3, 3], 1: [3]}


def test_another_optimizers_state_is_refused():
    pytest.importorskip("optcore_lion")
    sd = _stepped({"type": "AdamW"}, torch.nn.Linear(3, 3)).state_dict()
    lion = optcore.build_optimizer({"type": "optcore-lion:Lion"}, torch.nn.Linear(3, 3))
    with pytest.raises(optcore.ConfigError, match="saved by AdamW from torch"):
        lion.load_state_dict(sd)
    assert not lion.state


def test_another_version_loads_with_a_warning_and_plain_torch_state_loads():
    model = torch.nn.Linear(3, 3)
    opt = _stepped({"type": "AdamW"}, model)
    sd = opt.state_dict()
    other = copy.deepcopy(sd)
    other["optcore"]["version"] = "1.0.0"
    fresh = optcore.build_optimizer({"type": "AdamW"}, model)
    with pytest.warns(UserWarning, match="version 1.0.0"):
        fresh.load_state_dict(other)
    torch.testing.assert_close(fresh.state_dict()["state"], sd["state"])
    torch_sd = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 3)).sum().backward()
    torch_sd.step()
    fresh = optcore.build_optimizer({"type": "AdamW"}, list(model.parameters()))  # torch's one group
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh.load_state_dict(torch_sd.state_dict())
    torch.testing.assert_close(fresh.state_dict()["state"], torch_sd.state_dict()["state"])


def test_integer_state_for_a_floating_parameter_is_refused():
    model = torch.nn.Linear(3, 3)
    sd = _stepped({"type": "AdamW"}, model).state_dict()
    sd["state"][0]["exp_avg"] = sd["state"][0]["exp_avg"].long()
    with pytest.raises(optcore.ConfigError, match="floating vs integer"):
        optcore.build_optimizer({"type": "AdamW"}, model).load_state_dict(sd)


def test_factored_state_of_torch_adafactor_loads_from_a_plain_torch_state_dict():
    """Without a record, torch's layouts are judged by broadcasting: Adafactor's
    row and column factors fit their parameter."""
    model = torch.nn.Linear(4, 5)
    opt = _stepped({"type": "torch:Adafactor"}, model)
    plain = {k: v for k, v in opt.state_dict().items() if k != "optcore"}
    optcore.build_optimizer({"type": "torch:Adafactor"}, model).load_state_dict(plain)
    with pytest.raises(optcore.ConfigError):
        optcore.build_optimizer({"type": "torch:Adafactor"}, torch.nn.Linear(4, 7)).load_state_dict(plain)
