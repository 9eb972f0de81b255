"""The contract members on adapted torch optimizers."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

import optcore


def _grads(model, scale=1.0):
    torch.manual_seed(1)
    model.zero_grad()
    (model(torch.randn(16, 4)).pow(2).mean() * scale).backward()


@pytest.mark.parametrize("config", [{"type": "AdamW"}, {"type": "AdamW", "fused": False},
                                    {"type": "SGD", "momentum": 0.9}, {"type": "RMSprop"}])
def test_step_with_scale_equals_dividing_grads(model, config):
    m2 = copy.deepcopy(model)
    a, b = optcore.build_optimizer(config, model), optcore.build_optimizer(config, m2)
    for _ in range(3):
        _grads(model, 1024.0)
        a.step(scale=1024.0)
        _grads(m2)
        b.step()
    for p, q in zip(model.parameters(), m2.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_capability_flags_are_facts(model):
    assert optcore.build_optimizer("AdamW", model).supports_step_with_scale
    assert not optcore.build_optimizer("RMSprop", model).supports_step_with_scale
    assert not optcore.build_optimizer("AdamW", model).supports_memory_efficient_fp16
    assert optcore.build_optimizer("SGD", model).supports_flat_params
    assert not optcore.build_optimizer("Adafactor", model).supports_flat_params
    assert not optcore.build_optimizer("LBFGS", list(model.parameters())).supports_groups


def test_grad_scaler_interoperates(model):
    opt = optcore.build_optimizer({"type": "AdamW", "lr": 1e-2}, model)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(3):
        opt.zero_grad()
        scaler.scale(model(torch.randn(8, 4)).pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert scaler.get_scale() == 256.0


def test_clip_grad_norm(model):
    opt = optcore.build_optimizer("SGD", model)
    _grads(model)
    true = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    assert torch.allclose(opt.clip_grad_norm(0), true)
    assert torch.allclose(opt.clip_grad_norm(true / 2), true)
    assert torch.allclose(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]), true / 2, rtol=1e-4)
    assert opt.clip_grad_norm(0, aggregate_norm_fn=lambda n: n * 0 + 3.0) == 3.0
    model[0].weight.grad[0, 0] = float("inf")
    assert not torch.isfinite(opt.clip_grad_norm(1.0))


def test_load_state_dict_with_overrides(model):
    opt = optcore.build_optimizer({"type": "AdamW", "lr": 1e-3}, model)
    _grads(model)
    opt.step()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    fresh = optcore.build_optimizer({"type": "AdamW", "lr": 1e-3}, model)
    fresh.load_state_dict(torch.load(buf, weights_only=True), optimizer_overrides={"lr": 5e-4, "betas": (0.8, 0.9)})
    assert fresh.get_lr() == 5e-4 and all(g["betas"] == (0.8, 0.9) for g in fresh.param_groups)
    assert fresh.optimizer_config["lr"] == 5e-4
    with pytest.raises(optcore.ConfigError, match="unknown"):
        fresh.load_state_dict(opt.state_dict(), optimizer_overrides={"lrr": 1})


def test_groups_selection(model):
    opt = optcore.build_optimizer({"type": "SGD", "lr": 0.1, "param_groups": [{"params": r"^3\.", "name": "head"}]}, model)
    before = [p.detach().clone() for p in model.parameters()]
    _grads(model)
    opt.step(groups=["head"])
    changed = [not torch.equal(a, p) for a, p in zip(before, model.parameters())]
    assert changed == [False, False, False, False, True, True]
    with pytest.raises(optcore.ConfigError, match="unknown group"):
        opt.step(groups=["nope"])
    with pytest.raises(optcore.ConfigError, match="index"):
        opt.step(groups=[7])


def test_adapted_optimizers_pickle_and_keep_hooks_single(model):
    opt = optcore.build_optimizer("Adam", model)
    calls = []
    opt.register_step_post_hook(lambda *a: calls.append(1))
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])  # hooks torch's own Adam.step as well
    _grads(model)
    opt.step()
    assert calls == [1], "step hooks must run once"
    clone = pickle.loads(pickle.dumps(optcore.build_optimizer("Adam", model)))
    assert type(clone).__name__ == "Adam" and hasattr(clone, "clip_grad_norm")


def test_average_params_is_a_noop_without_distributed(model):
    opt = optcore.build_optimizer("SGD", model)
    before = [p.detach().clone() for p in model.parameters()]
    opt.average_params()
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


@pytest.mark.parametrize("name", ["StepLR", "CosineAnnealingLR", "OneCycleLR", "LinearLR", "ExponentialLR"])
def test_torch_lr_schedulers_work_unchanged(model, name):
    opt = optcore.build_optimizer({"type": "AdamW", "lr": 1e-2}, model)
    kwargs = {"StepLR": {"step_size": 1}, "CosineAnnealingLR": {"T_max": 10}, "OneCycleLR": {"max_lr": 0.1, "total_steps": 10},
              "LinearLR": {}, "ExponentialLR": {"gamma": 0.9}}[name]
    sched = getattr(torch.optim.lr_scheduler, name)(opt, **kwargs)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            _grads(model)
            opt.step()
            sched.step()
    assert opt.get_lr() == pytest.approx(sched.get_last_lr()[0])
