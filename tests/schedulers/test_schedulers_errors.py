"""Scheduler configs fail with one ConfigError that lists every problem, and a
failed build leaves the optimizer as it was."""

from __future__ import annotations

import pytest
import torch

import optcore
from optcore import ConfigError


def sgd(lr: float = 0.1) -> torch.optim.Optimizer:
    return optcore.build_optimizer({"type": "SGD", "lr": lr}, [torch.nn.Parameter(torch.zeros(2))])


def _groups(opt):
    return [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]


def test_every_problem_is_listed_at_once():
    with pytest.raises(ConfigError) as info:
        optcore.build_scheduler({"type": "cosine", "warmup_step": 10}, sgd())
    fields = dict(info.value.problems)
    assert set(fields) == {"num_training_steps", "warmup_step"}
    assert fields["num_training_steps"].startswith("missing") and "warmup_steps" in fields["warmup_step"]
    with pytest.raises(ConfigError) as info:  # torch's run-length field too
        optcore.build_scheduler({"type": "CosineAnnealingLR", "eta_mni": 0.0}, sgd())
    assert {f for f, _ in info.value.problems} == {"T_max", "eta_mni"}


def test_different_warmup_spellings_are_listed_with_the_rest():
    with pytest.raises(ConfigError) as info:
        optcore.build_scheduler({"type": "linear", "warmup_steps": 1, "num_warmup_steps": 2, "foo": 1}, sgd(), 10)
    assert {f for f, _ in info.value.problems} == {"warmup_steps", "foo"}


@pytest.mark.parametrize("value", [[1], {"a": 1}, [1, 2], "abc", True, -1, 1.5, float("inf")], ids=repr)
def test_unusable_warmup_values_are_config_errors(value):
    with pytest.raises(ConfigError, match="warmup_steps"):
        optcore.build_scheduler({"type": "cosine", "warmup_steps": value}, sgd(), num_training_steps=10)
    with pytest.raises(ConfigError, match="warmup_steps"):
        optcore.build_scheduler({"type": "cosine", "warmup_steps": value, "num_warmup_steps": value}, sgd(), 10)


def test_a_huge_one_cycle_run_is_a_config_error_with_its_cause():
    opt = sgd()
    before = _groups(opt)
    with pytest.raises(ConfigError, match="OneCycleLR") as info:
        optcore.build_scheduler({"type": "OneCycleLR", "max_lr": 0.1}, opt, num_training_steps=10**400)
    assert isinstance(info.value.__cause__, OverflowError)
    assert _groups(opt) == before


@pytest.mark.parametrize("exc", [RuntimeError("r"), AssertionError(), IndexError("i"), OverflowError("o")])
def test_any_constructor_exception_is_a_config_error_and_changes_nothing(exc):
    class HalfWay(torch.optim.lr_scheduler.LRScheduler):
        def __init__(self, optimizer, gamma: float = 0.5):
            for group in optimizer.param_groups:
                group["initial_lr"] = group["lr"]
                group["lr"] = group["lr"] * gamma  # touched, then fails
            raise exc

    optcore.register_scheduler("half_way_for_test", HalfWay, override=True)
    try:
        opt = sgd()
        before = _groups(opt)
        with pytest.raises(ConfigError, match="half_way_for_test") as info:
            optcore.build_scheduler({"type": "half_way_for_test"}, opt)
        assert info.value.__cause__ is exc
        assert _groups(opt) == before
    finally:
        optcore.unregister_scheduler("half_way_for_test")


def test_keyboard_interrupt_in_a_constructor_propagates():
    class Interrupted(torch.optim.lr_scheduler.LRScheduler):
        def __init__(self, optimizer):
            raise KeyboardInterrupt

    optcore.register_scheduler("interrupted_for_test", Interrupted, override=True)
    try:
        with pytest.raises(KeyboardInterrupt):
            optcore.build_scheduler({"type": "interrupted_for_test"}, sgd())
    finally:
        optcore.unregister_scheduler("interrupted_for_test")


@pytest.mark.parametrize("schedule", ["cosine", "constant", "constant_with_warmup", "OneCycleLR", "StepLR"])
@pytest.mark.parametrize("value", ["abc", "1e999", True, 0, -5, 2.5, [10]], ids=repr)
def test_num_training_steps_must_be_a_positive_whole_number(schedule, value):
    config = {"type": schedule, **{"OneCycleLR": {"max_lr": 0.1}, "StepLR": {"step_size": 2}}.get(schedule, {})}
    with pytest.raises(ConfigError, match="num_training_steps"):
        optcore.build_scheduler(config, sgd(), num_training_steps=value)
    with pytest.raises(ConfigError):
        optcore.build_scheduler({**config, "num_training_steps": value}, sgd(), num_training_steps=10)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="num_training_steps"):
        optcore.build({"optimizer": {"type": "SGD", "lr": 0.1}, "lr_scheduler": config}, model, value)
    with pytest.raises(ConfigError, match="num_training_steps"):
        optcore.build(
            {"optimizer": {"type": "SGD", "lr": 0.1}, "lr_scheduler": config, "num_training_steps": value}, model
        )


def test_whole_number_spellings_of_the_run_length_work():
    for value in ("100", 100.0, "1e2"):
        sched = optcore.build_scheduler({"type": "cosine"}, sgd(), num_training_steps=value)
        assert sched.num_training_steps == 100
