"""In relative-step mode the group's lr is None; what a trainer logs
(get_lr, get_lrs, optimizer_config["lr"]) is the step size actually applied."""

from __future__ import annotations

import math

import pytest
import torch

from optcore_adafactor import Adafactor, functional, relative_step_size

hf = pytest.importorskip("transformers.optimization")


def _pair(**config):
    gen = torch.Generator().manual_seed(0)
    shapes = [(12, 9), (9,)]
    ours = [torch.randn(s, generator=gen).requires_grad_() for s in shapes]
    ref = [p.detach().clone().requires_grad_() for p in ours]
    return ours, ref


@pytest.mark.parametrize("implementation", ["auto", "torch", "compiled"])
@pytest.mark.parametrize("config", [{}, {"scale_parameter": False}, {"warmup_init": True}, {"beta1": 0.9}])
def test_logged_lr_is_the_step_size_applied(monkeypatch: pytest.MonkeyPatch, implementation: str, config: dict) -> None:
    monkeypatch.setattr(functional.CompiledUpdate, "backend", "eager")
    ours, ref = _pair()
    opt = Adafactor([{"params": ours[:1]}, {"params": ours[1:], "lr_scale": 0.5}], implementation=implementation, **config)
    ref_opt = hf.Adafactor(ref, **config)
    assert opt.get_lr() == relative_step_size(1, config.get("warmup_init", False))  # before any step: rho_1
    for step in range(3):
        gen = torch.Generator().manual_seed(step)
        for a, b in zip(ours, ref):
            a.grad = torch.randn(a.shape, generator=gen)
            b.grad = a.grad.clone()
        rms_before = float(ours[1].detach().pow(2).mean().sqrt())
        opt.step()
        ref_opt.step()
        # what transformers applied to the first parameter this step (its _get_lr)
        applied = float(hf.Adafactor._get_lr(ref_opt.param_groups[0], ref_opt.state[ref[0]]))
        assert opt.param_groups[0]["lr"] is None
        assert opt.get_lr() == pytest.approx(applied, rel=1e-5)
        assert opt.optimizer_config["lr"] == pytest.approx(applied, rel=1e-5)
        lrs = opt.get_lrs()
        assert all(isinstance(lr, float) and math.isfinite(lr) for lr in lrs)
        assert lrs[0] == pytest.approx(applied, rel=1e-5)
        # the second group (lr_scale 0.5, so its own trajectory): HF's formula on its parameter
        scale = max(1e-3, rms_before) if config.get("scale_parameter", True) else 1.0
        rho = relative_step_size(step + 1, config.get("warmup_init", False))
        assert lrs[1] == pytest.approx(0.5 * rho * scale, rel=1e-5)  # lr_scale applied, as stored


def test_logged_lr_survives_a_checkpoint() -> None:
    ours, _ = _pair()
    opt = Adafactor(ours)
    for p in ours:
        p.grad = torch.ones_like(p)
    opt.step()
    fresh = Adafactor([p.detach().clone().requires_grad_() for p in ours])
    fresh.load_state_dict(opt.state_dict())
    assert fresh.get_lr() == opt.get_lr() != relative_step_size(1, False)
