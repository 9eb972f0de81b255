"""Param-group settings: ``lr_scale`` is a finite non-negative number,
``no_decay`` a strict switch, and a ``param_groups`` regex that selects no
parameter is an error (unless marked optional)."""

from __future__ import annotations

import math

import pytest
import torch

import optcore
from optcore import ConfigError
from optcore._config import no_decay_flag
from optcore._group_rules import lr_scale_value
from optcore._params import build_param_groups


@pytest.fixture
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))


@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf, "inf", "nan", True, -1.0, "x", None, [1.0]], ids=repr)
def test_bad_lr_scale_is_a_config_error(model, scale):
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ConfigError, match="lr_scale"):
        optcore.build_optimizer({"type": "AdamW", "param_groups": [{"params": r"^2\.", "lr_scale": scale}]}, model)
    with pytest.raises(ConfigError, match="lr_scale"):
        build_param_groups([{"params": list(model.parameters()), "lr_scale": scale}])
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_good_lr_scale_still_scales(model):
    opt = optcore.build_optimizer(
        {"type": "AdamW", "lr": 1e-3, "param_groups": [{"params": r"^2\.", "lr_scale": "0.5"}]}, model
    )
    assert sorted(g["lr"] for g in opt.param_groups) == pytest.approx([5e-4, 5e-4, 1e-3, 1e-3])
    assert lr_scale_value(0) == 0.0 and lr_scale_value("2") == 2.0


def test_no_decay_is_a_strict_switch(model):
    assert no_decay_flag("false") is False and no_decay_flag("True") is True and no_decay_flag(False) is False
    for junk in ["no", "0", 0, 1, None, "", []]:
        with pytest.raises(ConfigError, match="no_decay"):
            no_decay_flag(junk)
    # "false" is read as false, not by truthiness: one group, weight decay everywhere
    groups = build_param_groups(model, weight_decay=0.1, no_decay="false")
    assert len(groups) == 1
    assert len(build_param_groups(model, weight_decay=0.1, no_decay="true")) == 2
    with pytest.raises(ConfigError, match="no_decay"):
        build_param_groups(model, weight_decay=0.1, no_decay="off")


def test_build_optimizer_reads_no_decay_false_as_false(model):
    opt = optcore.build_optimizer({"type": "AdamW", "weight_decay": 0.1, "no_decay": "false"}, model)
    assert len(opt.param_groups) == 1


def test_a_regex_that_matches_nothing_is_an_error(model):
    config = {"type": "AdamW", "param_groups": [{"params": r"^head\.", "lr": 1e-4}]}  # the README's example
    with pytest.raises(ConfigError) as info:
        optcore.build_optimizer(config, model)
    message = str(info.value)
    assert r"'^head\\.'" in message and "matches no trainable parameter" in message
    assert "0.weight" in message and "2.bias" in message  # the names to write a regex against
    assert info.value.problems == [("param_groups[0].params", "matches no parameter")]
    assert config == {"type": "AdamW", "param_groups": [{"params": r"^head\.", "lr": 1e-4}]}  # unchanged


def test_a_regex_over_frozen_parameters_only_matches_nothing(model):
    for p in model[2].parameters():
        p.requires_grad_(False)
    with pytest.raises(ConfigError, match="matches no trainable parameter"):
        optcore.build_optimizer({"type": "AdamW", "param_groups": [{"params": r"^2\.", "lr": 1e-4}]}, model)


def test_optional_groups_may_match_nothing(model):
    config = {"type": "AdamW", "lr": 1e-3, "param_groups": [
        {"params": r"^head\.", "lr": 1e-4, "optional": True},
        {"params": r"^2\.", "lr": 1e-2, "optional": "false"},
    ]}
    opt = optcore.build_optimizer(config, model)
    assert sorted(g["lr"] for g in opt.param_groups) == [1e-3, 1e-3, 1e-2, 1e-2]  # decay / no-decay of each
    assert all("optional" not in g for g in opt.param_groups)
    with pytest.raises(ConfigError, match="optional"):
        optcore.build_optimizer({"type": "AdamW", "param_groups": [{"params": "^2", "optional": "maybe"}]}, model)


def test_many_parameter_names_are_listed_in_part():
    model = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(20)])
    with pytest.raises(ConfigError) as info:
        optcore.build_optimizer({"type": "SGD", "param_groups": [{"params": "^nope", "lr": 1.0}]}, model)
    assert "(40 in all)" in str(info.value) and "19.bias" not in str(info.value)


def test_default_group_names_are_unique_when_regex_groups_meet_the_no_decay_split():
    """"decay" and "no_decay" name only the split's own groups; a group a regex
    also changes is ``group<i>``, so ``step(groups="no_decay")`` selects one group."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    groups = build_param_groups(model, [{"params": r"^0\.", "lr_scale": 2.0}], weight_decay=0.01)
    names = [g["name"] for g in groups]
    assert len(set(names)) == len(names) == 3
    assert {n: len(g["params"]) for n, g in zip(names, groups)} == {"group0": 1, "group1": 1, "no_decay": 2}
    assert [g["name"] for g in build_param_groups(model, weight_decay=0.01)] == ["decay", "no_decay"]


def test_a_name_the_config_gives_is_never_a_default_one_and_selects_all_its_groups():
    """A regex group named ``head`` whose bias goes without decay is two groups,
    both ``head``: ``step(groups="head")`` steps both. A default name yields to
    one the config gave (a config group named ``no_decay`` keeps it alone)."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    taken = build_param_groups(
        model, [{"params": r"^0\.weight", "name": "no_decay"}, {"params": r"^1\.bias", "name": "group1", "lr": 0.1}],
        weight_decay=0.01,
    )
    assert [(g["name"], len(g["params"])) for g in taken] == [("no_decay", 1), ("group1_0", 2), ("group1", 1)]
    opt = optcore.build_optimizer(
        {"type": "AdamW", "lr": 0.1, "weight_decay": 0.01, "param_groups": [{"params": r"^0\.", "name": "head"}]}, model
    )
    assert [(g["name"], g["weight_decay"]) for g in opt.param_groups] == [("head", 0.01), ("head", 0.0), ("no_decay", 0.0)]
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(3, 4)).pow(2).sum().backward()
    opt.step(groups="head")
    changed = [not torch.equal(a, b) for a, b in zip(before, model.parameters())]
    assert changed == [True, True, False, False]  # the Linear's weight and bias; not the LayerNorm's
