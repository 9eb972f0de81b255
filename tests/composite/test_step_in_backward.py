"""``"step_in_backward": true``: per-parameter steps from post-accumulate-grad hooks."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import optcore
from optcore import ConfigError

from test_composite import MUON_ADAMW, loss_of, tiny, train

CONFIGS = [
    pytest.param({"type": "AdamW", "lr": 1e-2, "weight_decay": 0.1}, id="AdamW-fused-default"),
    pytest.param({"type": "AdamW", "lr": 1e-2, "foreach": True}, id="AdamW-foreach"),
    pytest.param({"type": "SGD", "lr": 0.1, "momentum": 0.9}, id="SGD-momentum"),
    pytest.param({"type": "Adagrad", "lr": 0.1}, id="Adagrad"),
    pytest.param({"type": "optcore-lion:Lion", "lr": 1e-3}, id="Lion"),
    pytest.param(MUON_ADAMW, id="Muon+AdamW"),
]


def _in_backward(config: dict[str, Any]) -> dict[str, Any]:
    return {**config, "step_in_backward": True}


@pytest.mark.parametrize("config", CONFIGS)
def test_numerics_equal_the_ordinary_loop(config: dict[str, Any]) -> None:
    want, got = tiny(), tiny()
    train(want, optcore.build_optimizer(config, want), range(4))
    opt = optcore.build_optimizer(_in_backward(config), got)
    train(got, opt, range(4))
    for (name, a), b in zip(got.named_parameters(), want.parameters()):
        assert torch.equal(a, b), name
    assert all(p.grad is None for p in got.parameters())  # freed as used


@pytest.mark.parametrize("config", CONFIGS[:1] + CONFIGS[-1:])
def test_state_dict_resumes_exactly_and_schedulers_work(config: dict[str, Any]) -> None:
    rule = lambda step: 1.0 / (1 + step)  # noqa: E731
    straight = tiny()
    opt = optcore.build_optimizer(_in_backward(config), straight)
    train(straight, opt, range(6), torch.optim.lr_scheduler.LambdaLR(opt, rule))

    ordinary = tiny()
    plain = optcore.build_optimizer(config, ordinary)
    train(ordinary, plain, range(6), torch.optim.lr_scheduler.LambdaLR(plain, rule))
    for a, b in zip(straight.parameters(), ordinary.parameters()):
        assert torch.equal(a, b)

    first = tiny()
    opt1 = optcore.build_optimizer(_in_backward(config), first)
    sched1 = torch.optim.lr_scheduler.LambdaLR(opt1, rule)
    train(first, opt1, range(3), sched1)
    saved = copy.deepcopy((first.state_dict(), opt1.state_dict(), sched1.state_dict()))
    assert set(saved[1]) == {"state", "param_groups", "optcore"}

    resumed = tiny(seed=3)
    resumed.load_state_dict(saved[0])
    opt2 = optcore.build_optimizer(_in_backward(config), resumed)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, rule)
    opt2.load_state_dict(saved[1])
    sched2.load_state_dict(saved[2])
    train(resumed, opt2, range(3, 6), sched2)
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_gradient_accumulation_is_refused() -> None:
    model = tiny()
    opt = optcore.build_optimizer(_in_backward({"type": "AdamW"}), model)
    loss_of(model, 0).backward()
    with pytest.raises(ConfigError, match="gradient accumulation"):
        loss_of(model, 1).backward()


def test_global_clipping_and_scaling_are_refused() -> None:
    model = tiny()
    opt = optcore.build_optimizer(_in_backward({"type": "AdamW"}), model)
    loss_of(model, 0).backward()
    with pytest.raises(ConfigError, match="global gradient clipping"):
        opt.clip_grad_norm(1.0)
    with pytest.raises(ConfigError, match="loss scaling"):
        opt.step(scale=2.0)


def test_a_grad_scaler_is_refused() -> None:
    model = tiny()
    opt = optcore.build_optimizer(_in_backward({"type": "AdamW"}), model)
    opt.grad_scale = torch.tensor(1024.0)  # what torch.amp.GradScaler sets on optimizers that take it
    with pytest.raises(ConfigError, match="loss scaling"):
        loss_of(model, 0).backward()


def test_a_precision_wrapper_is_refused_at_plan_time() -> None:
    pytest.importorskip("optcore_fp16")
    with pytest.raises(ConfigError, match="step_in_backward cannot run inside"):
        optcore.plan({"type": "AdamW", "precision": "fp16", "step_in_backward": True})


def test_an_optimizer_that_couples_parameters_is_refused() -> None:
    model = nn.Linear(3, 2)
    with pytest.raises(ConfigError, match="LBFGS"):
        optcore.build_optimizer({"type": "LBFGS", "step_in_backward": True}, model)


def test_the_switch_is_a_flag() -> None:
    with pytest.raises(ConfigError, match="step_in_backward"):
        optcore.plan({"type": "AdamW", "step_in_backward": "maybe"})
    assert optcore.plan({"type": "AdamW", "step_in_backward": "false"}).step_in_backward is False


def test_show_and_check_say_step_in_backward(tmp_path: Any, capsys: Any) -> None:
    from optcore.cli import main

    (tmp_path / "ok.yaml").write_text("type: AdamW\nstep_in_backward: true\n")
    (tmp_path / "lbfgs.yaml").write_text("type: LBFGS\nstep_in_backward: true\n")
    assert main(["show", "--config", str(tmp_path / "ok.yaml")]) == 0
    assert "step_in_backward: each parameter steps" in capsys.readouterr().out
    assert main(["check", str(tmp_path / "ok.yaml")]) == 0
    capsys.readouterr()
    assert main(["check", str(tmp_path / "lbfgs.yaml")]) == 1
    assert "LBFGS may couple parameters" in capsys.readouterr().err
