"""100 steps agree with the reference, transformers.optimization.Adafactor.

Both optimizers see the same parameters and gradients; the check is relative
to each parameter's scale (1e-5), in every mode the issue names.
"""

from __future__ import annotations

import pytest
import torch

from optcore_adafactor import Adafactor
from optcore_adafactor import _cpu_kernel, functional

hf = pytest.importorskip("transformers.optimization")

#: matrices, a wide and a tall one, a conv kernel (factored over its last two dims), vectors and a scalar
SHAPES = [(40, 24), (7, 300), (300, 5), (4, 3, 5, 6), (24,), (1,), ()]

MODES = {
    "relative_step": {},
    "relative_step, no scale_parameter": {"scale_parameter": False},
    "relative_step, warmup_init": {"warmup_init": True},
    "relative_step, beta1": {"beta1": 0.9},
    "relative_step, weight_decay": {"weight_decay": 0.1},
    "manual lr": {"lr": 1e-2, "relative_step": False, "scale_parameter": False},
    "manual lr, scale_parameter": {"lr": 1e-3, "relative_step": False},
    "manual lr, beta1, weight_decay": {"lr": 1e-3, "relative_step": False, "beta1": 0.8, "weight_decay": 0.01},
    "manual lr, clip 0.5, decay -0.5": {"lr": 1e-2, "relative_step": False, "clip_threshold": 0.5, "decay_rate": -0.5},
}


#: the implementation _run_both builds (set by the ``path`` fixture)
IMPLEMENTATION = {"name": "auto"}


@pytest.fixture(autouse=True, params=["c-kernel", "functional", "compiled"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs on each CPU path: the C loops (where a compiler is
    found), the functional update eagerly, and the functional update through
    torch.compile (implementation='compiled', run here by torch.compile's eager
    backend to keep the sweep fast; test_adafactor_compile runs inductor)."""
    IMPLEMENTATION["name"] = "auto"
    if request.param == "c-kernel":
        if _cpu_kernel.load() is None:
            pytest.skip(f"C kernel unavailable: {_cpu_kernel.unavailable_reason}")
    elif request.param == "compiled":
        torch._dynamo.reset()  # many optimizers in one process: start each test with a clean cache
        monkeypatch.setattr(functional.CompiledUpdate, "backend", "eager")
        monkeypatch.setitem(IMPLEMENTATION, "name", "compiled")
    else:
        monkeypatch.setattr(_cpu_kernel, "load", lambda: None)
    return request.param


def test_c_kernel_and_functional_update_agree(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    if path != "c-kernel":
        pytest.skip("compares the two paths once")
    fast, _, _, _ = _run_both({"beta1": 0.9, "weight_decay": 0.01}, steps=20)
    monkeypatch.setattr(_cpu_kernel, "load", lambda: None)
    slow, _, _, _ = _run_both({"beta1": 0.9, "weight_decay": 0.01}, steps=20)
    _assert_close(fast, slow, 1e-6)


def _run_both(config: dict, dtype: torch.dtype = torch.float32, steps: int = 100, shapes=SHAPES):
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    ours = [p.clone().requires_grad_() for p in init]
    ref = [p.clone().requires_grad_() for p in init]
    opt, ref_opt = Adafactor(ours, implementation=IMPLEMENTATION["name"], **config), hf.Adafactor(ref, **config)
    for step in range(steps):
        for i, (a, b) in enumerate(zip(ours, ref)):
            # gradients of different scales, an all-zero row now and then
            g = torch.randn(a.shape, generator=gen) * (3.0 if i % 2 else 0.05)
            if g.dim() >= 2 and step % 7 == 0:
                g[..., 0, :] = 0
            a.grad, b.grad = g.to(dtype), g.to(dtype).clone()
        opt.step()
        ref_opt.step()
    return ours, ref, opt, ref_opt


def _assert_close(ours, ref, rtol: float) -> None:
    for a, b in zip(ours, ref):
        scale = b.detach().float().abs().max().clamp(min=1e-12)
        err = float((a.detach().float() - b.detach().float()).abs().max() / scale)
        assert err <= rtol, f"shape {tuple(a.shape)}: difference {err:.3g} of the tensor's scale > {rtol}"


@pytest.mark.parametrize("mode", list(MODES))
def test_100_steps_match_transformers(mode: str) -> None:
    ours, ref, opt, ref_opt = _run_both(MODES[mode])
    _assert_close(ours, ref, 1e-5)
    for a, b in zip(ours, ref):  # the statistics too, under the same state keys
        keys = [k for k in ("exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq", "exp_avg") if k in ref_opt.state[b]]
        if MODES[mode].get("scale_parameter", True):
            keys.append("RMS")
        assert keys and all(k in opt.state[a] for k in keys)
        _assert_close([opt.state[a][k] for k in keys], [ref_opt.state[b][k] for k in keys], 1e-5)
        assert opt.state[a]["step"] == ref_opt.state[b]["step"] == 100


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_params_match_transformers(dtype: torch.dtype) -> None:
    """fp16/bf16 parameters: fp32 math and fp32 state, rounded once per step (as HF)."""
    ours, ref, opt, _ = _run_both({"beta1": 0.9}, dtype=dtype, steps=20)
    for a, b in zip(ours, ref):
        assert a.dtype == dtype
        # one rounding per step in both; allow a couple of ulps of drift
        torch.testing.assert_close(a, b, rtol=2e-2, atol=1e-3)
        assert all(v.dtype == torch.float32 for v in opt.state[a].values() if isinstance(v, torch.Tensor))


def test_non_contiguous_params_match_transformers() -> None:
    """A transposed weight (which the C loops do not take) matches too."""
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(30, 20, generator=gen)
    a = base.clone().t().requires_grad_()  # non-contiguous leaf
    b = base.clone().t().contiguous().requires_grad_()
    assert not a.is_contiguous()
    opt, ref_opt = Adafactor([a], implementation=IMPLEMENTATION["name"]), hf.Adafactor([b])
    for _ in range(20):
        g = torch.randn(20, 30, generator=gen)
        a.grad, b.grad = g.clone(), g.clone()
        opt.step()
        ref_opt.step()
    _assert_close([a], [b], 1e-5)
