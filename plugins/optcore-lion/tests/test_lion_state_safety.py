"""State that does not fit its parameters, and tensors the C kernel must not
touch: clear errors naming the parameter, raised before any memory is written."""

from __future__ import annotations

import pytest
import torch
from optcore import ConfigError, StepError, build_optimizer, resolve
from optcore_lion import Lion, _cpu_kernel
from torch import nn

IMPLS = {"kernel": {"fused": True}, "default": {}, "forloop": {"fused": False, "foreach": False},
         "foreach": {"foreach": True}}


def _trained_state(size: int, **kw) -> dict:
    model = nn.Linear(size, size)
    opt = Lion(model.named_parameters(), lr=1e-3, **kw)
    model(torch.randn(2, size)).sum().backward()
    opt.step()
    return opt.state_dict()


@pytest.mark.parametrize("impl", IMPLS.values(), ids=IMPLS)
@pytest.mark.parametrize(("saved", "loaded"), [(32, 64), (64, 32)], ids=["smaller->larger", "larger->smaller"])
def test_loading_state_of_another_model_names_the_parameter(saved, loaded, impl):
    state = _trained_state(saved, **impl)
    model = nn.Linear(loaded, loaded)
    opt = Lion(model.named_parameters(), lr=1e-3, **impl)
    with pytest.raises(ConfigError, match=rf"'weight' \(#0 of param group 0, shape \({loaded}, {loaded}\)\): state "
                       rf"'exp_avg' has shape \({saved}, {saved}\)"):
        opt.load_state_dict(state)
    assert not opt.state  # nothing was loaded


@pytest.mark.parametrize("impl", IMPLS.values(), ids=IMPLS)
@pytest.mark.parametrize(("saved", "loaded"), [(32, 64), (64, 32)], ids=["smaller->larger", "larger->smaller"])
def test_state_of_the_wrong_shape_is_refused_at_step_before_any_update(saved, loaded, impl):
    model = nn.Linear(loaded, loaded)
    opt = Lion(model.parameters(), lr=1e-3, **impl)
    model(torch.randn(2, loaded)).sum().backward()
    opt.state[model.bias]["exp_avg"] = torch.zeros(saved)  # bypassing load_state_dict
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(StepError, match=rf"#1 of param group 0, shape \({loaded},\)\) has shape \({saved},\)"):
        opt.step()
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))


def _triple(n: int = 8):
    return torch.zeros(n), torch.ones(n), torch.zeros(n)


def _bad(kind: str):
    p, g, m = _triple()
    if kind == "short momentum":
        m = torch.zeros(4)
    elif kind == "long momentum":
        m = torch.zeros(16)
    elif kind == "float64 grad":
        g = g.double()
    elif kind == "strided param":
        p = torch.zeros(16)[::2]
    elif kind == "no storage":
        m.untyped_storage().resize_(0)
    elif kind == "meta momentum":
        m = torch.zeros(8, device="meta")
    elif kind == "negated view":
        g = torch._neg_view(g)
    return p, g, m


@pytest.mark.parametrize("kind", ["short momentum", "long momentum", "float64 grad", "strided param",
                                  "no storage", "meta momentum", "negated view"])
def test_kernel_checks_every_tensor_before_running(kind):
    p, g, m = _bad(kind)
    with pytest.raises(ValueError, match="Lion kernel"):
        _cpu_kernel.lion_fp32_([p], [g], [m], lr=1.0, weight_decay=0.0, beta1=0.9, beta2=0.99, gscale=1.0)
    assert torch.equal(p, torch.zeros_like(p))
    with pytest.raises(ValueError, match="parameters, 1 gradients"):
        _cpu_kernel.lion_fp32_([p, p], [g], [m], lr=1.0, weight_decay=0.0, beta1=0.9, beta2=0.99, gscale=1.0)


@pytest.mark.parametrize("impl", [{}, {"fused": True}, {"fused": False}, {"foreach": True}], ids=str)
@pytest.mark.parametrize("shared", ["the parameter", "the momentum"])
def test_a_gradient_that_shares_memory_is_stepped_as_its_value_at_the_start_of_the_step(shared, impl):
    """torch allows ``p.grad = p.detach()`` (or the momentum as the gradient).
    Every backend steps the gradient's value when the step began, as lion-pytorch
    steps a copy of it; the kernel itself, which reads its tensors as
    ``restrict``, refuses tensors that share memory."""
    lion_pytorch = pytest.importorskip("lion_pytorch")
    results = []
    for make, copy in ((lambda ps: Lion(ps, lr=1e-2, weight_decay=0.1, **impl), False),
                       (lambda ps: lion_pytorch.Lion(ps, lr=1e-2, weight_decay=0.1), True)):
        p = torch.randn(300, 200, generator=torch.Generator().manual_seed(0)).requires_grad_()
        opt = make([p])
        p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(1))
        opt.step()  # the momentum exists from here on
        for _ in range(3):
            g = p.detach() if shared == "the parameter" else opt.state[p]["exp_avg"]
            p.grad = g.clone() if copy else g
            opt.step()
        results.append((p.detach().clone(), opt.state[p]["exp_avg"].clone()))
    torch.testing.assert_close(results[0], results[1], atol=1e-6, rtol=0)
    p = torch.randn(8)
    with pytest.raises(ValueError, match="parameter and gradient share memory"):
        _cpu_kernel.lion_fp32_([p], [p], [torch.zeros(8)], lr=1.0, weight_decay=0.0, beta1=0.9, beta2=0.99, gscale=1.0)


def test_kernel_runs_on_checked_tensors():
    p, g, m = _triple()
    _cpu_kernel.lion_fp32_([p], [g], [m], lr=0.5, weight_decay=0.0, beta1=0.9, beta2=0.99, gscale=1.0)
    assert torch.equal(p, torch.full((8,), -0.5)) and torch.allclose(m, torch.full((8,), 0.01))


def _wrapper_available(name: str) -> bool:
    try:
        resolve(name)
    except Exception:  # noqa: BLE001 - optcore-fp16 not installed
        return False
    return True


@pytest.mark.parametrize("wrapper", ["MemoryEfficientFP16Optimizer", "FP16Optimizer"])
@pytest.mark.parametrize(("saved", "loaded"), [(32, 64), (64, 32)], ids=["smaller->larger", "larger->smaller"])
def test_wrapped_lion_refuses_state_of_another_model(wrapper, saved, loaded):
    if not _wrapper_available(wrapper):
        pytest.skip("optcore-fp16 is not installed")
    config = {"type": wrapper, "optimizer": {"type": "optcore_lion:Lion", "lr": 1e-3}}

    def build(size):
        model = nn.Linear(size, size).half()
        return model, build_optimizer(config, model)

    model, opt = build(saved)
    opt.backward(model(torch.randn(2, saved).half()).float().sum())
    opt.step()
    state = opt.state_dict()
    model, opt = build(loaded)
    match = "fp32 buffer" if wrapper == "FP16Optimizer" else rf"shape \({loaded}, {loaded}\)\): .*shape \({saved}, {saved}\)"
    with pytest.raises(ConfigError, match=match):
        opt.load_state_dict(state)
