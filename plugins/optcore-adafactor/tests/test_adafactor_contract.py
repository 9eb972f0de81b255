"""The optcore contract as Adafactor keeps it: capabilities (each one tested),
learning-rate reporting, memory, checkpoints and bad input."""

from __future__ import annotations

import copy
import io

import pytest
import torch

from optcore import ConfigError, StepError
from optcore_adafactor import Adafactor, relative_step_size

SHAPES = [(12, 9), (2, 3, 4, 5), (9,)]


def _model(seed: int = 0, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen).to(dtype).requires_grad_() for s in SHAPES]


def _grads(params: list[torch.Tensor], seed: int, scale: float = 1.0) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=gen) * scale).to(p.dtype)


def _clone(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


# ------------------------------------------------------------- capabilities
def test_capability_flags_are_what_is_true() -> None:
    assert Adafactor.supports_memory_efficient_fp16 is True
    assert Adafactor.supports_step_with_scale is True
    assert Adafactor.supports_groups is True
    assert Adafactor.supports_flat_params is False
    assert "row and column" in Adafactor.flat_params_unsupported_reason
    assert Adafactor._step_supports_amp_scaling is True


def test_flat_wrapper_shows_the_reason() -> None:
    fp16 = pytest.importorskip("optcore_fp16")
    params = [torch.zeros(4, 3, dtype=torch.float16, requires_grad=True)]
    with pytest.raises(ConfigError, match="row and column"):
        fp16.FP16Optimizer(Adafactor(params), flat=True)


@pytest.mark.parametrize("config", [{}, {"beta1": 0.9, "weight_decay": 0.1}, {"lr": 1e-2, "relative_step": False}])
def test_step_with_scale_equals_unscaled_gradients(config: dict) -> None:
    plain, scaled = _model(), _model()
    opt_plain, opt_scaled = Adafactor(plain, **config), Adafactor(scaled, **config)
    for step in range(5):
        _grads(plain, step)
        _grads(scaled, step, scale=1024.0)
        opt_plain.step()
        opt_scaled.step(scale=1024.0)
    for a, b in zip(plain, scaled):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_grad_scaler_protocol_unscales_and_skips_on_inf() -> None:
    plain, scaled = _model(), _model()
    opt_plain, opt_scaled = Adafactor(plain), Adafactor(scaled)
    _grads(plain, 0)
    _grads(scaled, 0, scale=256.0)
    opt_plain.step()
    opt_scaled.grad_scale, opt_scaled.found_inf = torch.tensor(256.0), torch.tensor(0.0)
    opt_scaled.step()
    for a, b in zip(plain, scaled):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    before = _clone(scaled)
    opt_scaled.found_inf = torch.tensor(1.0)
    opt_scaled.step()  # skipped: nothing moves, no step is counted
    assert all(torch.equal(a, b) for a, b in zip(before, scaled))
    assert all(opt_scaled.state[p]["step"] == 1 for p in scaled)


def test_torch_grad_scaler_drives_it() -> None:
    plain, scaled = _model(), _model()
    opt_plain, opt_scaled = Adafactor(plain), Adafactor(scaled)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    for step in range(3):
        x = torch.randn(9, generator=torch.Generator().manual_seed(step))
        for params, opt in ((plain, opt_plain), (scaled, opt_scaled)):
            opt.zero_grad()
            loss = sum((p.sum(dim=tuple(range(p.dim() - 1))) * x[: p.shape[-1]]).sum() for p in params)
            if opt is opt_plain:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
    for a, b in zip(plain, scaled):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_step_groups_updates_only_the_selected_groups() -> None:
    first, second = _model(0), _model(1)
    opt = Adafactor([{"params": first, "name": "body"}, {"params": second, "name": "head"}])
    _grads(first + second, 0)
    before = _clone(first + second)
    opt.step(groups=["head"])
    assert all(torch.equal(a, b) for a, b in zip(before[: len(first)], first))
    assert all(not torch.equal(a, b) for a, b in zip(before[len(first) :], second))
    assert all(p not in opt.state for p in first)
    opt.step(groups=0)
    assert all(opt.state[p]["step"] == 1 for p in first + second)


# ------------------------------------------------------------ learning rate
def test_group_lr_is_never_overwritten_and_get_lr_reports_the_step_size() -> None:
    params = _model()
    opt = Adafactor(params)
    assert opt.get_lr() == relative_step_size(1, warmup_init=False) == 1e-2
    for step in range(3):
        _grads(params, step)
        opt.step()
    assert opt.param_groups[0]["lr"] is None  # fairseq would have written its step size here
    rms = float(params[0].detach().pow(2).mean().sqrt())
    assert opt.applied_step_size(params[0]) > 0
    assert opt.get_lr() == opt.applied_step_size(params[0])
    # the last step size: rho_3 times the parameter scale before that step
    assert opt.get_lr() == pytest.approx(1e-2 * rms, rel=0.05)
    assert Adafactor(_model(), warmup_init=True).get_lr() == pytest.approx(1e-6)


def test_set_lr_in_relative_step_mode_says_what_to_change() -> None:
    with pytest.raises(ConfigError, match="relative_step=False"):
        Adafactor(_model()).set_lr(1e-3)


def test_external_scheduler_drives_manual_lr_mode() -> None:
    params = _model()
    opt = Adafactor(params, lr=1e-2, relative_step=False, scale_parameter=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5**step)
    for step in range(3):
        _grads(params, step)
        opt.step()
        sched.step()
        assert opt.get_lr() == pytest.approx(1e-2 * 0.5 ** (step + 1))
        assert opt.applied_step_size(params[0]) == pytest.approx(1e-2 * 0.5 ** (step + 1))  # the group's lr now


def test_lr_scale_scales_the_relative_step() -> None:
    a, b = _model(), _model()
    opt = Adafactor([{"params": a}, {"params": b, "lr_scale": 0.5}])
    _grads(a, 0)
    _grads(b, 0)
    opt.step()
    assert opt.applied_step_size(b[0]) == pytest.approx(0.5 * opt.applied_step_size(a[0]))
    assert opt.get_lrs() == pytest.approx([opt.applied_step_size(a[0]), opt.applied_step_size(b[0])])


# ------------------------------------------------------------------- memory
def _state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))


@pytest.mark.parametrize(("n", "m"), [(64, 96), (256, 384)])
def test_state_of_an_n_by_m_weight_is_n_plus_m(n: int, m: int) -> None:
    w = torch.zeros(n, m, requires_grad=True)
    w.grad = torch.ones(n, m)
    opt = Adafactor([w])
    opt.step()
    assert _state_bytes(opt) == 4 * (n + m + 1)  # O(n + m), not O(n m); the 1 is RMS, as HF
    with_momentum = Adafactor([w], beta1=0.9)
    with_momentum.step()
    assert _state_bytes(with_momentum) == 4 * (n + m + 1 + n * m)
    hf = pytest.importorskip("transformers.optimization").Adafactor([w])
    hf.step()
    assert _state_bytes(opt) == _state_bytes(hf)


# ----------------------------------------------------- precision, checkpoints
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_params_keep_fp32_state_through_a_checkpoint(dtype: torch.dtype) -> None:
    params = _model(dtype=dtype)
    opt = Adafactor(params, beta1=0.9)
    _grads(params, 0, scale=1e-4)  # squared, below fp16's smallest number
    opt.step()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    fresh = Adafactor(params, beta1=0.9)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    for p in params:
        for key, value in fresh.state[p].items():
            if torch.is_tensor(value):
                assert value.dtype == torch.float32, key
                torch.testing.assert_close(value, opt.state[p][key])
    assert (fresh.state[params[0]]["exp_avg_sq_row"] > 0).all()


def test_resume_from_state_dict_continues_the_same_trajectory() -> None:
    a = _model()
    opt_a = Adafactor(a, beta1=0.9)
    for step in range(3):
        _grads(a, step)
        opt_a.step()
    b = [p.detach().clone().requires_grad_() for p in a]
    opt_b = Adafactor(b, beta1=0.9)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    for step in range(3, 6):
        _grads(a, step)
        _grads(b, step)
        opt_a.step()
        opt_b.step()
    for x, y in zip(a, b):
        assert torch.equal(x, y)


# ---------------------------------------------------------------- bad input
def test_sparse_gradient_is_refused_before_anything_changes() -> None:
    dense = torch.randn(4, 3, requires_grad=True)
    emb = torch.randn(10, 3, requires_grad=True)
    dense.grad = torch.randn(4, 3)
    emb.grad = torch.randn(10, 3).to_sparse()
    opt = Adafactor([dense, emb])
    before = dense.detach().clone()
    with pytest.raises(StepError, match="sparse"):
        opt.step()
    assert torch.equal(before, dense) and dense not in opt.state


@pytest.mark.parametrize("implementation", ["auto", "torch"])
def test_gradient_of_another_shape_is_a_step_error(implementation: str) -> None:
    """Adafactor's own check after the contract's: named by place and shape, nothing moves."""
    w, v = torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)
    w.grad, v.grad = torch.randn(4, 3), torch.randn(3)
    opt = Adafactor([v, w], implementation=implementation)
    w.data = torch.randn(6, 2)  # the gradient keeps the old shape
    before = [v.detach().clone(), w.detach().clone()]
    named = r"gradient of parameter \(#1 of param group 0, shape \(6, 2\)\) has shape \(4, 3\)"
    with pytest.raises(StepError, match=named):
        opt.step()
    assert torch.equal(before[0], v) and torch.equal(before[1], w) and not opt.state


def test_state_that_is_not_a_tensor_is_a_step_error() -> None:
    w = torch.randn(4, 3, requires_grad=True)
    opt = Adafactor([w])
    w.grad = torch.randn(4, 3)
    opt.step()
    opt.state[w]["exp_avg_sq_row"] = 0.5
    before = w.detach().clone()
    with pytest.raises(StepError, match=r"'exp_avg_sq_row' of parameter \(#0 .* is a float, not a tensor") as info:
        opt.step()
    assert info.value.param is not None and torch.equal(before, w) and opt.state[w]["step"] == 1


def test_complex_parameter_is_refused_with_advice() -> None:
    """At construction, as Lion refuses one; a group added later likewise."""
    z = torch.randn(3, 3, dtype=torch.complex64, requires_grad=True)
    with pytest.raises(ConfigError, match="view_as_real"):
        Adafactor([z])
    opt = Adafactor([torch.randn(3, requires_grad=True)])
    with pytest.raises(ConfigError, match="view_as_real"):
        opt.add_param_group({"params": [z]})


def test_state_of_another_model_is_refused_before_anything_changes() -> None:
    params = _model()
    opt = Adafactor(params)
    _grads(params, 0)
    opt.step()
    other = [torch.zeros(5, 5, requires_grad=True), *(p.detach().clone().requires_grad_() for p in params[1:])]
    wrong = Adafactor([other[1], other[2], other[0]])
    with pytest.raises(ConfigError, match="does not fit this optimizer's parameters"):
        wrong.load_state_dict(opt.state_dict())
    assert not wrong.state
    _grads(other, 1)
    before = _clone(other)
    wrong.step()  # fresh, and stepping
    assert not all(torch.equal(a, b) for a, b in zip(before, other))


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_scale_is_a_step_error(scale: float) -> None:
    params = _model()
    _grads(params, 0)
    with pytest.raises(StepError, match="scale"):
        Adafactor(params).step(scale=scale)


def test_closure_is_evaluated_with_grad_enabled() -> None:
    w = torch.randn(4, 3, requires_grad=True)
    opt = Adafactor([w])

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = (w**2).sum()
        loss.backward()
        return loss

    with torch.no_grad():
        loss = opt.step(closure)
    assert loss is not None and w.grad is not None


def test_resume_overrides_are_validated_before_loading() -> None:
    params = _model()
    opt = Adafactor(params)
    _grads(params, 0)
    opt.step()
    saved = copy.deepcopy(opt.state_dict())
    fresh = Adafactor(params)
    with pytest.raises(ConfigError, match="relative_step=False"):
        fresh.load_state_dict(saved, optimizer_overrides={"lr": 1e-3})
    assert not fresh.state  # nothing was loaded
    fresh.load_state_dict(saved, optimizer_overrides={"lr": 1e-3, "relative_step": False, "scale_parameter": False})
    assert fresh.get_lr() == pytest.approx(1e-3) and fresh.param_groups[0]["relative_step"] is False
