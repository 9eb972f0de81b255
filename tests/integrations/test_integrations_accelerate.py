"""optcore.integrations.accelerate with the real accelerate: the contract through
``AcceleratedOptimizer`` (``Accelerator().prepare``), with accelerate's own step
rules kept: no step while gradients accumulate, and a ``GradScaler`` that
unscales (or skips on inf) before ``step(scale=)`` divides."""

from __future__ import annotations

import copy

import pytest
import torch

import optcore

pytest.importorskip("accelerate", reason="install optcore[hf] to test the accelerate integration")

from accelerate import Accelerator  # noqa: E402
from accelerate.optimizer import AcceleratedOptimizer  # noqa: E402

from optcore.integrations import accelerate as oa  # noqa: E402


def linear(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))


def grads_of(model: torch.nn.Module, seed: int = 1) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    model(torch.randn(8, 4)).pow(2).mean().backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def sgd_after(model: torch.nn.Module, grads: list[torch.Tensor], lr: float) -> list[torch.Tensor]:
    return [p.detach() - lr * g for p, g in zip(model.parameters(), grads)]


def assert_params(model: torch.nn.Module, expected: list[torch.Tensor]) -> None:
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.detach(), e)


@pytest.fixture
def accelerator() -> Accelerator:
    return Accelerator(cpu=True)


@pytest.mark.parametrize("config", [{"type": "SGD", "lr": 0.1}, {"type": "AdamW", "lr": 1e-2, "weight_decay": 0.1}])
def test_prepare_hands_back_accelerates_wrapper_with_the_contract(accelerator, config):
    model = linear()
    inner = optcore.build_optimizer(config, model)
    model, wrapper = oa.prepare(accelerator, model, inner)
    assert isinstance(wrapper, AcceleratedOptimizer) and wrapper in accelerator._optimizers
    assert optcore.unwrap(wrapper) is inner
    for flag in ("supports_memory_efficient_fp16", "supports_step_with_scale", "supports_flat_params",
                 "supports_groups", "sharding", "lr_schedule"):  # fmt: skip
        assert getattr(wrapper, flag) == getattr(inner, flag), flag
    assert wrapper.optimizer_config == inner.optimizer_config
    assert wrapper.get_lr() == config["lr"] and wrapper.get_lrs() == inner.get_lrs()
    wrapper.set_lr(0.05)
    assert inner.get_lr() == pytest.approx(0.05)
    grads = grads_of(model)
    total = torch.nn.utils.get_total_norm(grads)
    torch.testing.assert_close(wrapper.clip_grad_norm(total / 2), total)
    torch.testing.assert_close(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]), total / 2, rtol=1e-4, atol=0)
    wrapper.multiply_grads(0.5)
    torch.testing.assert_close(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]), total / 4, rtol=1e-4, atol=0)


def test_step_with_scale_and_groups_reach_the_optcore_step(accelerator):
    model = linear()
    config = {"type": "SGD", "lr": 0.1, "param_groups": [{"params": r"^1\.", "name": "norm"}]}
    model, wrapper = oa.prepare(accelerator, model, optcore.build_optimizer(config, model))
    grads = grads_of(model)
    expected = sgd_after(model, [g / 4.0 for g in grads], 0.1)
    wrapper.step(scale=4.0)
    assert_params(model, expected)

    wrapper.zero_grad()
    before = [p.detach().clone() for p in model.parameters()]
    grads = grads_of(model)
    wrapper.step(groups="norm")  # only the LayerNorm's group steps
    stepped = {id(p) for p in model[1].parameters()}
    for p, b, g in zip(model.parameters(), before, grads):
        torch.testing.assert_close(p.detach(), b - 0.1 * g if id(p) in stepped else b)
    assert "step" not in vars(optcore.unwrap(wrapper))  # scale and groups were for those calls


def test_no_step_while_gradients_accumulate():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = linear()
    model, wrapper = oa.prepare(accelerator, model, optcore.build_optimizer({"type": "SGD", "lr": 0.1}, model))
    before = [p.detach().clone() for p in model.parameters()]
    with accelerator.accumulate(model):  # first micro-batch: gradients do not sync, accelerate skips the step
        grads_of(model)
        assert not accelerator.sync_gradients
        wrapper.step(scale=2.0)
        wrapper.zero_grad()
    assert_params(model, before)
    with accelerator.accumulate(model):  # second: the step runs on the sum, with its scale
        summed = grads_of(model, seed=2)
        assert accelerator.sync_gradients
        wrapper.step(scale=2.0)
    assert_params(model, [b - 0.1 * g / 2.0 for b, g in zip(before, summed)])


@pytest.mark.parametrize(
    "config",
    [{"type": "SGD", "lr": 0.1, "fused": False}, {"type": "SGD", "lr": 0.1}, {"type": "optcore-lion:Lion", "lr": 0.1}],
    ids=["unscaled-by-the-scaler", "fused", "lion"],
)
def test_step_with_scale_through_accelerates_grad_scaler(accelerator, config):
    """accelerate's scaler branch: the GradScaler unscales (or the optimizer
    folds its grad_scale: fused SGD, Lion), then ``scale`` divides; an inf skips the step."""
    if config["type"].startswith("optcore-lion"):
        pytest.importorskip("optcore_lion")
    model, reference_model = linear(), linear()
    inner = optcore.build_optimizer(config, model)
    wrapper = oa.with_contract(AcceleratedOptimizer(inner, scaler=torch.amp.GradScaler("cpu", init_scale=16.0)))
    reference = optcore.build_optimizer(config, reference_model)

    torch.manual_seed(1)
    x = torch.randn(8, 4)
    wrapper.backward(model(x).pow(2).mean())  # scaled by the GradScaler
    reference_model(x).pow(2).mean().backward()
    for p, r in zip(model.parameters(), reference_model.parameters()):
        torch.testing.assert_close(p.grad, 16.0 * r.grad)
    total = torch.nn.utils.get_total_norm([r.grad for r in reference_model.parameters()])
    torch.testing.assert_close(wrapper.clip_grad_norm(0.0), total)  # the norm of the unscaled gradients
    wrapper.step(scale=2.0)
    reference.step(scale=2.0)
    assert not wrapper.step_was_skipped
    assert_params(model, [r.detach() for r in reference_model.parameters()])

    wrapper.zero_grad()
    before = [p.detach().clone() for p in model.parameters()]
    wrapper.backward(model(x).sum() * float("inf"))
    wrapper.step(scale=2.0)
    assert_params(model, before)
    assert wrapper.scaler.get_scale() < 16.0  # the scaler backed off
    # accelerate sees a skip where the GradScaler skips the call; an optimizer that reads the
    # scaler's found_inf itself (_step_supports_amp_scaling) is called, and skips inside
    assert wrapper.step_was_skipped is not getattr(inner, "_step_supports_amp_scaling", False)


def test_clip_grad_norm_refuses_a_partial_sum_under_a_grad_scaler():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = linear()
    wrapper = oa.with_contract(AcceleratedOptimizer(optcore.build_optimizer({"type": "SGD", "lr": 0.1}, model),
                                                    scaler=torch.amp.GradScaler("cpu", init_scale=16.0)))  # fmt: skip
    model = accelerator.prepare(model)
    with accelerator.accumulate(model):
        wrapper.backward(model(torch.randn(8, 4)).sum())
        with pytest.raises(optcore.StepError, match="sync_gradients"):
            wrapper.clip_grad_norm(1.0)


def test_load_state_dict_with_overrides_through_the_wrapper(accelerator):
    model = linear()
    model, wrapper = oa.prepare(accelerator, model, optcore.build_optimizer({"type": "AdamW", "lr": 1e-3}, model))
    grads_of(model)
    wrapper.step()
    saved = wrapper.state_dict()
    assert saved["optcore"]["name"] == "AdamW"
    wrapper.load_state_dict(saved, optimizer_overrides={"lr": 5e-4})
    assert wrapper.get_lr() == pytest.approx(5e-4)
    assert all(g["lr"] == pytest.approx(5e-4) for g in optcore.unwrap(wrapper).param_groups)
    with pytest.raises(optcore.ConfigError, match="unknown hyper-parameter"):
        wrapper.load_state_dict(saved, optimizer_overrides={"lrr": 1.0})
    assert "load_state_dict" not in vars(optcore.unwrap(wrapper))  # the override was for that one call
    wrapper.load_state_dict(saved)  # accelerate's own road
    assert wrapper.get_lr() == pytest.approx(1e-3)


def test_the_wrapper_keeps_its_identity_and_copies(accelerator):
    model = linear()
    inner = optcore.build_optimizer({"type": "SGD", "lr": 0.1}, model)
    wrapper = accelerator.prepare(inner)
    assert type(wrapper) is AcceleratedOptimizer and not hasattr(wrapper, "get_lr")  # what accelerate hands back
    same = oa.with_contract(wrapper)
    assert same is wrapper and isinstance(wrapper, AcceleratedOptimizer) and wrapper.get_lr() == 0.1
    assert oa.with_contract(wrapper) is wrapper and oa.with_contract(inner) is inner
    # through __reduce_ex__, as pickle goes (pickle itself fails on accelerate's shared state once
    # a Trainer has run in the process: its GradientState holds weak references)
    twin = copy.deepcopy(wrapper)
    assert type(twin) is type(wrapper) and twin.get_lr() == 0.1 and optcore.unwrap(twin) is not inner


def test_a_wrapper_around_another_optimizer_is_refused(accelerator):
    model = linear()
    wrapper = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(optcore.ConfigError, match="No optcore optimizer inside AcceleratedOptimizer"):
        oa.with_contract(wrapper)
    assert type(wrapper) is AcceleratedOptimizer  # unchanged
    _, kept = oa.prepare(accelerator, model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert type(kept) is AcceleratedOptimizer  # prepare passes other optimizers through as accelerate made them
