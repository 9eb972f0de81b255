"""On a GPU: the same numbers as transformers' Adafactor, state on the device."""

from __future__ import annotations

import pytest
import torch

from optcore_adafactor import Adafactor

hf = pytest.importorskip("transformers.optimization")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SHAPES = [(256, 384), (1024, 64), (8, 4, 3, 3), (384,)]


@pytest.mark.parametrize(
    "config",
    [{}, {"beta1": 0.9, "weight_decay": 0.1}, {"lr": 1e-2, "relative_step": False, "scale_parameter": False}],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_transformers(config: dict, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=gen) for s in SHAPES]
    ours = [p.to("cuda", dtype).requires_grad_() for p in init]
    ref = [p.to("cuda", dtype).requires_grad_() for p in init]
    opt, ref_opt = Adafactor(ours, **config), hf.Adafactor(ref, **config)
    for _ in range(30):
        for a, b in zip(ours, ref):
            g = torch.randn(a.shape, generator=gen).to("cuda", dtype)
            a.grad, b.grad = g, g.clone()
        opt.step()
        ref_opt.step()
    for a, b in zip(ours, ref):
        scale = b.detach().float().abs().max()
        err = float((a.detach().float() - b.detach().float()).abs().max() / scale)
        assert err <= (1e-5 if dtype == torch.float32 else 2e-2), f"{tuple(a.shape)}: {err:.3g}"
        assert all(v.is_cuda and v.dtype == torch.float32 for v in opt.state[a].values() if torch.is_tensor(v))


def test_cuda_step_with_scale() -> None:
    gen = torch.Generator().manual_seed(1)
    init = [torch.randn(s, generator=gen) for s in SHAPES]
    plain = [p.cuda().requires_grad_() for p in init]
    scaled = [p.cuda().requires_grad_() for p in init]
    opt_plain, opt_scaled = Adafactor(plain, beta1=0.9), Adafactor(scaled, beta1=0.9)
    for _ in range(5):
        for a, b in zip(plain, scaled):
            g = torch.randn(a.shape, generator=gen).cuda()
            a.grad, b.grad = g, g * 4096.0
        opt_plain.step()
        opt_scaled.step(scale=4096.0)
    for a, b in zip(plain, scaled):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
