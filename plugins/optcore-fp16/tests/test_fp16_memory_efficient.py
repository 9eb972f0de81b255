"""MemoryEfficientFP16Optimizer: no master copy, fp32 state that survives a
checkpoint, skipped overflows, and the optimizers it accepts."""

from __future__ import annotations

import copy
import importlib.util
import io
from typing import Any

import pytest
import torch
from fp16_helpers import HalfSGD, adamw, all_finite, data, loss_fn, mlp, poison, same, snapshot
from optcore_fp16 import MemoryEfficientFP16Optimizer

from optcore import ConfigError


def train(model: torch.nn.Module, opt: Any, steps: int) -> list[float]:
    x, y = data()
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model, x, y)
        opt.backward(loss) if hasattr(opt, "backward") else loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _plugin_optimizers() -> list[Any]:
    """Lion and Adafactor when their plugins are installed (their own tests
    check their numerics; here they only need to train under the wrapper)."""
    cases = []
    if importlib.util.find_spec("optcore_lion"):
        from optcore_lion import Lion

        cases.append(pytest.param(lambda ps: Lion(ps, lr=3e-3), 3e-3, id="Lion"))
    else:
        cases.append(pytest.param(None, 0, id="Lion", marks=pytest.mark.skip("optcore-lion not installed")))
    if importlib.util.find_spec("optcore_adafactor"):
        from optcore_adafactor import Adafactor

        cases.append(
            pytest.param(
                lambda ps: Adafactor(ps, lr=1e-2, relative_step=False, scale_parameter=False), 1e-2, id="Adafactor"
            )
        )
    else:
        cases.append(pytest.param(None, 0, id="Adafactor", marks=pytest.mark.skip("optcore-adafactor not installed")))
    cases.append(pytest.param(lambda ps: HalfSGD(ps, lr=0.1), 0.1, id="HalfSGD"))
    return cases


@pytest.mark.parametrize(("make", "lr"), _plugin_optimizers())
@pytest.mark.parametrize(
    ("precision", "dtype", "tolerance"), [("fp16", torch.float16, 0.05), ("bf16", torch.bfloat16, 0.15)]
)
def test_training_tracks_fp32(make: Any, lr: float, precision: str, dtype: torch.dtype, tolerance: float) -> None:
    ref_model = mlp(torch.float32)
    ref = train(ref_model, make(ref_model.parameters()), steps=40)
    model = mlp(dtype)
    opt = MemoryEfficientFP16Optimizer(make(model.parameters()), precision=precision)
    losses = train(model, opt, steps=40)
    assert losses[-1] < losses[0] / 2
    # half-precision parameters round every update: the curves agree to a few percent
    assert abs(losses[-1] - ref[-1]) <= tolerance * ref[0], (losses[-1], ref[-1])
    for state in opt.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel() > 1:
                assert value.dtype == torch.float32


def test_holds_no_fp32_copy_of_the_params() -> None:
    model = mlp(torch.float16)
    opt = MemoryEfficientFP16Optimizer(HalfSGD(model.parameters()))
    assert opt.param_groups is opt.optimizer.param_groups
    assert all(p.dtype == torch.float16 for g in opt.param_groups for p in g["params"])
    train(model, opt, steps=2)
    state_bytes = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if v.dim())
    param_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert state_bytes == param_bytes  # the fp32 momentum only
    assert not any(isinstance(v, torch.Tensor) for v in vars(opt).values())


def test_overflow_skips_without_touching_params_or_state() -> None:
    model = mlp(torch.float16)
    opt = MemoryEfficientFP16Optimizer(HalfSGD(model.parameters()), loss_scaler={"init_scale": 64.0, "scale_window": 2})
    x, y = data()
    scales = []
    for step in range(8):
        opt.zero_grad()
        opt.backward(loss_fn(model, x, y))
        if step in (2, 5):
            poison(model, "inf" if step == 2 else "nan")
        before = snapshot(opt, model)
        opt.step()
        assert all_finite(snapshot(opt, model))
        assert same(before, snapshot(opt, model)) == (step in (2, 5))
        scales.append(opt.loss_scale)
    assert scales == [64, 128, 64, 64, 128, 64, 64, 128]
    assert opt.skipped_steps == 2


def test_state_stays_fp32_across_a_checkpoint() -> None:
    model = mlp(torch.float16)
    opt = MemoryEfficientFP16Optimizer(HalfSGD(model.parameters()))
    train(model, opt, steps=3)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    rest = train(model, opt, steps=5)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    resumed_model = mlp(torch.float16, seed=7)
    resumed_model.load_state_dict(ckpt["model"])
    resumed = MemoryEfficientFP16Optimizer(HalfSGD(resumed_model.parameters()))
    resumed.load_state_dict(ckpt["opt"])
    for state in resumed.state.values():
        assert state["momentum_buffer"].dtype == torch.float32
    assert train(resumed_model, resumed, steps=5) == rest


def test_scheduler_and_lr_reach_the_inner_optimizer_after_load() -> None:
    model = mlp(torch.float16)
    opt = MemoryEfficientFP16Optimizer(HalfSGD(model.parameters(), lr=0.1))
    opt.load_state_dict(copy.deepcopy(opt.state_dict()), optimizer_overrides={"lr": 0.05})
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    train(model, opt, steps=1)
    sched.step()
    assert opt.optimizer.param_groups[0]["lr"] == pytest.approx(0.025)


def test_rejects_optimizers_without_the_flag() -> None:
    model = mlp(torch.float16)
    with pytest.raises(ConfigError) as err:
        MemoryEfficientFP16Optimizer(adamw(model))
    message = str(err.value)
    for needle in ("AdamW", "FP16Optimizer", "Lion", "Adafactor", "allow_unsupported"):
        assert needle in message
    opt = MemoryEfficientFP16Optimizer(adamw(model), allow_unsupported=True)
    assert train(model, opt, steps=3)[-1] < 10
