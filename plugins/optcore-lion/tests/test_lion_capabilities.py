"""Each capability flag Lion sets is true: fp16/bf16, step(scale), flat params,
groups, torch.amp.GradScaler, and state_dict round trips."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from optcore_lion import Lion

lion_pytorch = pytest.importorskip("lion_pytorch")

IMPLS = {"default": {}, "foreach": {"foreach": True}, "forloop": {"foreach": False, "fused": False}}


def _tensors(dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen).to(dtype).requires_grad_() for s in [(40, 30), (30,), (7,)]]


def _grads(params, steps, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(p.shape, generator=gen) for p in params] for _ in range(steps)]


def test_lion_declares_its_capabilities():
    assert Lion.supports_memory_efficient_fp16 and Lion.supports_step_with_scale
    assert Lion.supports_flat_params and Lion.supports_groups and Lion._step_supports_amp_scaling


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_lion_low_precision_params_update_in_fp32_with_fp32_state(impl, dtype):
    params, ref = _tensors(dtype), [p.detach().float().requires_grad_() for p in _tensors(dtype)]
    fp32_run = [p.detach().float().requires_grad_() for p in _tensors(dtype)]
    opt = Lion(params, lr=1e-2, weight_decay=0.1, **IMPLS[impl])
    ref_opt = lion_pytorch.Lion(ref, lr=1e-2, weight_decay=0.1)
    fp32_opt = Lion(fp32_run, lr=1e-2, weight_decay=0.1)
    for grads in _grads(params, 10):
        for p, r, f, g in zip(params, ref, fp32_run, grads):
            p.grad, r.grad, f.grad = g.to(dtype), g.to(dtype).float(), g
        opt.step()
        ref_opt.step()
        fp32_opt.step()
        with torch.no_grad():  # the reference: fp32 update of the fp32 copy, written back rounded
            for r in ref:
                r.copy_(r.to(dtype).float())
    for p, r, f in zip(params, ref, fp32_run):
        assert p.dtype == dtype and opt.state[p]["exp_avg"].dtype == torch.float32
        torch.testing.assert_close(p.detach(), r.detach().to(dtype), atol=0, rtol=0)
        torch.testing.assert_close(p.detach().float(), f.detach(), atol=0.05, rtol=0.02)  # close to a pure fp32 run


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("scale", [1024.0, 3.7])
@pytest.mark.parametrize("maximize", [False, True])
def test_lion_step_with_scale_equals_dividing_the_grads_first(impl, scale, maximize):
    a, b = _tensors(), _tensors()
    opt_a = Lion(a, lr=1e-2, maximize=maximize, **IMPLS[impl])
    opt_b = Lion(b, lr=1e-2, maximize=maximize, **IMPLS[impl])
    for grads in _grads(a, 20):
        for pa, pb, g in zip(a, b, grads):
            pa.grad, pb.grad = g * scale, g * scale
        opt_a.step(scale=scale)
        for pb in b:
            pb.grad.div_(scale)
        opt_b.step()
        torch.testing.assert_close(a[0].grad, grads[0] * scale)  # the gradients themselves are untouched
    atol = 0 if scale == 1024.0 else 1e-6  # a power of two divides exactly
    for pa, pb in zip(a, b):
        torch.testing.assert_close(pa, pb, atol=atol, rtol=0)
        ma, mb = opt_a.state[pa]["exp_avg"], opt_b.state[pb]["exp_avg"]
        torch.testing.assert_close(ma, mb, atol=max(atol, 1e-7), rtol=1e-6)


def test_lion_flat_param_equals_per_tensor_params():
    params = _tensors()
    flat = torch.cat([p.detach().reshape(-1) for p in params]).requires_grad_()
    opt, flat_opt = Lion(params, lr=1e-2, weight_decay=0.1), Lion([flat], lr=1e-2, weight_decay=0.1)
    for grads in _grads(params, 10):
        for p, g in zip(params, grads):
            p.grad = g
        flat.grad = torch.cat([g.reshape(-1) for g in grads])
        opt.step()
        flat_opt.step()
    torch.testing.assert_close(flat.detach(), torch.cat([p.detach().reshape(-1) for p in params]), atol=0, rtol=0)


def test_lion_step_groups_steps_only_the_selected_groups():
    a, b, c = _tensors()
    opt = Lion([{"params": [a], "name": "body"}, {"params": [b], "name": "head"}, {"params": [c]}], lr=1e-2)
    before = [t.detach().clone() for t in (a, b, c)]
    for t in (a, b, c):
        t.grad = torch.ones_like(t)
    opt.step(groups=["head", 2])
    assert torch.equal(a, before[0]) and a not in opt.state  # not selected: untouched, no state
    assert not torch.equal(b, before[1]) and not torch.equal(c, before[2])
    opt.step(groups=0)
    assert not torch.equal(a, before[0])


def _amp_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def _loss(model, i):
    gen = torch.Generator().manual_seed(i)
    x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 2, generator=gen)
    return torch.nn.functional.mse_loss(model(x), y)


@pytest.mark.parametrize("unscale_first", [False, True])
def test_lion_with_torch_amp_grad_scaler_matches_unscaled_training(unscale_first):
    plain, scaled = _amp_model(), _amp_model()
    opt_plain, opt_scaled = Lion(plain.parameters(), lr=1e-2), Lion(scaled.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    for i in range(5):
        opt_plain.zero_grad()
        _loss(plain, i).backward()
        opt_plain.step()
        opt_scaled.zero_grad()
        scaler.scale(_loss(scaled, i)).backward()
        if unscale_first:  # the usual place for gradient clipping
            scaler.unscale_(opt_scaled)
        scaler.step(opt_scaled)
        scaler.update()
    assert not hasattr(opt_scaled, "grad_scale") and not hasattr(opt_scaled, "found_inf")
    for p, q in zip(plain.parameters(), scaled.parameters()):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=0)


def test_lion_with_grad_scaler_skips_steps_with_inf_grads():
    model = _amp_model()
    opt = Lion(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    scaler.scale(_loss(model, 0)).backward()
    scaler.step(opt)
    scaler.update()
    before = [p.detach().clone() for p in model.parameters()]
    state_before = [opt.state[p]["exp_avg"].clone() for p in model.parameters()]
    opt.zero_grad()
    scaler.scale(_loss(model, 1)).backward()
    next(model.parameters()).grad[0, 0] = float("inf")
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0**11  # the scaler saw the inf and backed off
    for p, b, m in zip(model.parameters(), before, state_before):
        assert torch.equal(p.detach(), b) and torch.equal(opt.state[p]["exp_avg"], m)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lion_state_dict_round_trip_with_weights_only_load(dtype):
    a, b = _tensors(dtype), _tensors(dtype, seed=5)
    opt_a = Lion([{"params": a[:2]}, {"params": a[2:], "lr": 1e-3}], lr=1e-2, weight_decay=0.1)
    steps = _grads(a, 6)
    for grads in steps[:3]:
        for p, g in zip(a, grads):
            p.grad = g.to(dtype)
        opt_a.step()
    buf = io.BytesIO()
    torch.save(opt_a.state_dict(), buf)
    buf.seek(0)
    with torch.no_grad():
        for p, q in zip(a, b):
            q.copy_(p)
    opt_b = Lion([{"params": b[:2]}, {"params": b[2:]}])
    opt_b.load_state_dict(torch.load(buf, weights_only=True))
    assert opt_b.param_groups[1]["lr"] == 1e-3 and opt_b.param_groups[0]["weight_decay"] == 0.1
    assert all(opt_b.state[q]["exp_avg"].dtype == torch.float32 for q in b)  # fp32 state survives the load
    for grads in steps[3:]:
        for p, q, g in zip(a, b, grads):
            p.grad, q.grad = g.to(dtype), g.to(dtype)
        opt_a.step()
        opt_b.step()
    for p, q in zip(a, b):
        torch.testing.assert_close(q, p, atol=0, rtol=0)


def test_lion_loads_a_lion_pytorch_checkpoint():
    a, b = _tensors(), _tensors()
    ref = lion_pytorch.Lion(a, lr=1e-2, weight_decay=0.1)
    for p, g in zip(a, _grads(a, 1)[0]):
        p.grad = g
    ref.step()
    opt = Lion(b)
    opt.load_state_dict(copy.deepcopy(ref.state_dict()))  # torch shares the state tensors otherwise
    assert opt.param_groups[0]["maximize"] is False and opt.param_groups[0]["lr"] == 1e-2
    with torch.no_grad():
        for p, q in zip(a, b):
            q.copy_(p)
    for p, q, g in zip(a, b, _grads(a, 1, seed=9)[0]):
        p.grad, q.grad = g, g.clone()
    ref.step()
    opt.step()
    for p, q in zip(a, b):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=0)
