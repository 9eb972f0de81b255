"""FP16Optimizer: training tracks fp32, master copy layout, the contract
surface (schedulers, clipping, groups), checkpoints and errors."""

from __future__ import annotations

import copy
import io
import warnings
from typing import Any

import pytest
import torch
from fp16_helpers import AdamW, ShapedSGD, adamw, all_finite, data, loss_fn, mlp, poison, same, snapshot
from optcore_fp16 import DynamicLossScaler, FP16Optimizer, MemoryEfficientFP16Optimizer

from optcore import ConfigError, StepError, build_optimizer

STEPS = 60


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int = STEPS, clip: float = 0.0) -> list[float]:
    x, y = data()
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model, x, y)
        if hasattr(opt, "backward"):
            opt.backward(loss)
        else:
            loss.backward()
        if clip:
            if hasattr(opt, "clip_grad_norm"):
                opt.clip_grad_norm(clip)
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def fp32_reference(clip: float = 0.0) -> list[float]:
    model = mlp(torch.float32)
    return train(model, torch.optim.AdamW(model.parameters(), lr=1e-2), clip=clip)


@pytest.mark.parametrize(
    ("precision", "dtype", "tolerance"),
    # fp16 rounds activations to 11 bits, bf16 to 8: the loss curves differ by a
    # few percent at most, while training itself lowers the loss ~10x.
    [("fp16", torch.float16, 0.03), ("bf16", torch.bfloat16, 0.10)],
)
def test_half_precision_training_tracks_fp32(precision: str, dtype: torch.dtype, tolerance: float) -> None:
    ref = fp32_reference()
    model = mlp(dtype)
    opt = FP16Optimizer(adamw(model), precision=precision)
    losses = train(model, opt)
    assert losses[-1] < ref[0] / 5  # it trains
    for step in (10, 30, STEPS - 1):
        assert abs(losses[step] - ref[step]) <= tolerance * ref[step] + 1e-3, (step, losses[step], ref[step])
    assert opt.skipped_steps == 0
    assert (opt.loss_scale is None) == (precision == "bf16")


def test_master_copy_is_flat_for_pointwise_optimizers_and_rounds_to_the_model() -> None:
    model = mlp(torch.float16)
    opt = FP16Optimizer(adamw(model))
    assert opt.flat and len(opt.optimizer.param_groups[0]["params"]) == 1
    flat = opt.optimizer.param_groups[0]["params"][0]
    assert flat.dtype == torch.float32 and flat.numel() == sum(p.numel() for p in model.parameters())
    train(model, opt, steps=5)
    for p, view in zip(model.parameters(), opt._masters[0].views):
        assert torch.equal(p, view.half())


def test_per_tensor_copy_follows_the_same_trajectory_as_flat() -> None:
    a, b = mlp(torch.float16), mlp(torch.float16)
    opt_a = FP16Optimizer(adamw(a), flat=True)
    opt_b = FP16Optimizer(adamw(b), flat=False)
    assert len(opt_b.optimizer.param_groups[0]["params"]) == len(list(b.parameters()))
    assert train(a, opt_a, steps=10) == train(b, opt_b, steps=10)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_flat_requested_for_a_shape_dependent_optimizer_says_why() -> None:
    model = mlp(torch.float16)
    with pytest.raises(ConfigError, match="needs each parameter in its own shape") as err:
        FP16Optimizer(ShapedSGD(model.parameters()), flat=True)
    assert err.value.problems[0][0] == "flat"
    assert not FP16Optimizer(ShapedSGD(model.parameters())).flat


def test_frozen_parameters_get_no_master_copy() -> None:
    model = mlp(torch.float16)
    model[0].weight.requires_grad_(False)
    frozen = model[0].weight.detach().clone()
    opt = FP16Optimizer(AdamW([{"params": list(model.parameters())}], lr=1e-2, fused=True))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert opt.optimizer.param_groups[0]["params"][0].numel() == trainable
    train(model, opt, steps=3)
    assert torch.equal(model[0].weight, frozen)


def test_param_groups_show_model_params_and_drive_the_inner_lr() -> None:
    model = mlp(torch.float16)
    opt = FP16Optimizer(adamw(model))
    assert isinstance(opt, torch.optim.Optimizer)
    assert opt.param_groups[0]["params"] == list(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5**step)
    train(model, opt, steps=1)
    sched.step()
    assert opt.optimizer.param_groups[0]["lr"] == pytest.approx(5e-3)
    assert opt.get_lr() == pytest.approx(5e-3)
    opt.set_lr(1e-3)
    assert opt.optimizer.param_groups[0]["lr"] == 1e-3
    assert opt.optimizer_config["lr"] == 1e-3


def test_clip_grad_norm_is_the_true_norm_and_clips_like_fp32() -> None:
    ref_model = mlp(torch.float32)
    x, y = data()
    loss_fn(ref_model, x, y).backward()
    true_norm = torch.nn.utils.clip_grad_norm_(ref_model.parameters(), float("inf"))
    model = mlp(torch.float16)
    opt = FP16Optimizer(adamw(model), loss_scaler={"init_scale": 1024.0})
    opt.backward(loss_fn(model, x, y))
    assert float(opt.clip_grad_norm(0.0)) == pytest.approx(float(true_norm), rel=5e-3)
    # clipping to a tenth of the norm follows the clipped fp32 run
    ref = fp32_reference(clip=0.1)
    model = mlp(torch.float16)
    losses = train(model, FP16Optimizer(adamw(model)), clip=0.1)
    assert abs(losses[-1] - ref[-1]) <= 0.03 * ref[-1] + 1e-3


def test_multiply_grads_and_step_scale_fold_into_one_factor() -> None:
    def one_step(mult: float, scale: float) -> list[torch.Tensor]:
        model = mlp(torch.float16)
        opt = FP16Optimizer(adamw(model, weight_decay=0.0), flat=False)
        x, y = data()
        opt.backward(loss_fn(model, x, y))
        opt.multiply_grads(mult)
        opt.step(scale=scale)
        return [t.clone() for t in opt._masters[0].tensors]

    # Adam is invariant to a constant gradient factor except through eps: compare
    # equivalent factorings instead
    assert all(torch.allclose(a, b) for a, b in zip(one_step(4.0, 2.0), one_step(2.0, 1.0)))


def test_overflow_in_a_clipped_step_is_caught_by_the_norm() -> None:
    model = mlp(torch.float16)
    opt = FP16Optimizer(adamw(model), loss_scaler={"init_scale": 256.0})
    x, y = data()
    opt.backward(loss_fn(model, x, y))
    poison(model, "nan")
    assert not torch.isfinite(opt.clip_grad_norm(1.0))
    opt.step()
    assert opt.last_step_skipped and opt.loss_scale == 128.0 and not opt.state


def test_step_selects_groups() -> None:
    model = mlp(torch.float16)
    groups = [
        {"params": list(model[0].parameters())},
        {"params": list(model[2].parameters()) + list(model[4].parameters()), "name": "head"},
    ]
    opt = FP16Optimizer(AdamW(groups, lr=1e-2, fused=True))
    first, head = model[0].weight.detach().clone(), model[4].weight.detach().clone()
    x, y = data()
    opt.backward(loss_fn(model, x, y))
    opt.step(groups="head")
    assert torch.equal(model[0].weight, first) and not torch.equal(model[4].weight, head)
    opt.step(groups=[0])
    assert not torch.equal(model[0].weight, first)


@pytest.mark.parametrize("wrapper", [FP16Optimizer, MemoryEfficientFP16Optimizer])
@pytest.mark.parametrize("bad", ["scale", "sparse", "groups"])
def test_a_step_the_wrappers_cannot_take_is_a_step_error_before_anything_changes(wrapper, bad) -> None:
    """The contract's preamble: a scale that is no loss scale, a sparse gradient,
    groups a plain inner optimizer cannot step apart."""
    model = mlp(torch.float16)
    inner = torch.optim.SGD if bad == "groups" else AdamW
    kw = {"allow_unsupported": True} if wrapper is MemoryEfficientFP16Optimizer else {}
    opt = wrapper(inner([{"params": list(model[0].parameters())}, {"params": list(model[2:].parameters())}], lr=1e-2),
                  **kw)
    x, y = data()
    opt.backward(loss_fn(model, x, y))
    if bad == "sparse":
        w = model[0].weight
        w.grad = torch.sparse_coo_tensor([[0], [0]], torch.ones(1, dtype=w.dtype), w.shape, check_invariants=True)
    before = snapshot(opt, model)
    with pytest.raises(StepError, match={"scale": "scale must be", "sparse": "sparse", "groups": "all param groups"}[bad]):
        opt.step(**{"scale": {"scale": 0.0}, "sparse": {}, "groups": {"groups": [1]}}[bad])
    assert same(snapshot(opt, model), before)


def test_step_without_backward_warns_and_treats_grads_as_unscaled() -> None:
    a, b = mlp(torch.float16), mlp(torch.float16)
    opt_a, opt_b = FP16Optimizer(adamw(a)), FP16Optimizer(adamw(b))
    x, y = data()
    opt_a.backward(loss_fn(a, x, y))
    opt_a.step()
    loss_fn(b, x, y).backward()
    with pytest.warns(UserWarning, match=r"optimizer.backward\(loss\)"):
        opt_b.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p.float(), q.float(), atol=2e-3)


def test_add_param_group_makes_a_master_copy() -> None:
    model = mlp(torch.float16)
    opt = FP16Optimizer(AdamW(list(model[0].parameters()), lr=1e-2, fused=True))
    opt.add_param_group({"params": list(model[2].parameters()) + list(model[4].parameters()), "lr": 1e-3})
    assert len(opt.param_groups) == 2 and opt.param_groups[1]["lr"] == 1e-3
    before = model[4].weight.detach().clone()
    train(model, opt, steps=2)
    assert not torch.equal(model[4].weight, before)


def _run(model: torch.nn.Module, opt: FP16Optimizer, start: int, stop: int) -> list[tuple[float, float]]:
    """Steps start..stop-1, poisoning a fixed pattern, returning (loss, scale)."""
    x, y = data()
    out = []
    for step in range(start, stop):
        opt.zero_grad()
        loss = loss_fn(model, x, y)
        opt.backward(loss)
        if step in (3, 4, 12):
            poison(model, "inf")
        opt.clip_grad_norm(1.0) if step % 2 else None
        opt.step()
        out.append((float(loss.detach()), opt.loss_scale))
    return out


@pytest.mark.parametrize("flat", [True, False])
def test_checkpoint_resume_continues_the_same_trajectory(flat: bool) -> None:
    scaler = {"init_scale": 512.0, "scale_window": 3}
    model = mlp(torch.float16)
    opt = FP16Optimizer(adamw(model), loss_scaler=scaler, flat=flat)
    first = _run(model, opt, 0, 10)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    rest = _run(model, opt, 10, 20)

    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    resumed_model = mlp(torch.float16, seed=123)  # different weights: all must come from the checkpoint
    resumed_model.load_state_dict(ckpt["model"])
    resumed = FP16Optimizer(adamw(resumed_model), loss_scaler=scaler, flat=flat)
    resumed.load_state_dict(ckpt["opt"])
    assert resumed.loss_scale == ckpt["opt"]["loss_scale"] and resumed.skipped_steps == 2
    assert [s for _, s in first] == [512, 512, 1024, 512, 256, 256, 256, 512, 512, 512]
    assert _run(resumed_model, resumed, 10, 20) == rest
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), resumed_model.parameters()))


def test_state_dict_holds_scaler_and_master_and_loads_with_overrides() -> None:
    model = mlp(torch.float16)
    opt = FP16Optimizer(adamw(model), loss_scaler=DynamicLossScaler(init_scale=64.0))
    train(model, opt, steps=3)
    sd = opt.state_dict()
    assert sd["loss_scaler"]["loss_scale"] == 64.0 and sd["fp16_wrapper"]["flat"] is True
    assert sd["fp32_params"][0][0].dtype == torch.float32
    other = FP16Optimizer(adamw(mlp(torch.float16)))
    other.load_state_dict(copy.deepcopy(sd), optimizer_overrides={"lr": 1e-4})
    assert other.get_lr() == 1e-4 and other.loss_scale == 64.0
    with pytest.raises(ConfigError, match="flat=True"):
        FP16Optimizer(adamw(mlp(torch.float16)), flat=False).load_state_dict(copy.deepcopy(sd))


def test_deepcopy_and_repr() -> None:
    model = mlp(torch.float16)
    opt = FP16Optimizer(adamw(model))
    assert "FP16Optimizer(precision=fp16, flat=True, loss_scale=128)" in repr(opt)
    clone = copy.deepcopy(opt)
    assert clone.loss_scale == 128.0 and clone.param_groups[0]["lr"] == 1e-2


def test_construction_errors() -> None:
    model = mlp(torch.float16)
    with pytest.warns(UserWarning, match="no trainable parameter is torch.float16"):
        FP16Optimizer(adamw(mlp(torch.float32)))
    with pytest.raises(ConfigError, match="bfloat16"):
        FP16Optimizer(adamw(model), precision="bf16")
    with pytest.raises(ConfigError, match="takes no loss_scaler"):
        FP16Optimizer(adamw(mlp(torch.bfloat16)), precision="bf16", loss_scaler={"init_scale": 8})
    with pytest.raises(ConfigError) as err:
        FP16Optimizer(adamw(model), precision="fp8", loss_scaler={"init_scal": 8})
    assert {f for f, _ in err.value.problems} == {"precision", "loss_scaler.init_scal"}
    used = adamw(model)
    x, y = data()
    loss_fn(model, x, y).backward()
    used.step()
    with pytest.raises(ConfigError, match="empty state"):
        FP16Optimizer(used)
    with pytest.raises(ConfigError, match="another precision wrapper"):
        FP16Optimizer(FP16Optimizer(adamw(mlp(torch.float16))))  # type: ignore[arg-type]


def test_plain_torch_optimizer_is_accepted() -> None:
    model = mlp(torch.float16)
    opt = FP16Optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    assert not opt.flat  # a plain torch class declares no capabilities
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        losses = train(model, opt, steps=20)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("flat", [True, False])
def test_parameters_without_grad_are_left_alone(flat: bool) -> None:
    """As torch optimizers do, also with a flat copy (where a missing gradient
    would otherwise be a zero one, moved by weight decay and momentum)."""
    model = mlp(torch.float16)
    opt = FP16Optimizer(adamw(model, weight_decay=0.1), flat=flat)
    x, y = data()
    train(model, opt, steps=2)
    idx = [p is model[2].weight for p in model.parameters()].index(True)
    masters = opt._masters[0]

    def held() -> list[torch.Tensor]:
        if flat:
            buffer, start, end = masters.spans[idx]
            flat_param = masters.tensors[buffer]
            return [flat_param[start:end].clone()] + [
                opt.state[flat_param][k][start:end].clone() for k in ("exp_avg", "exp_avg_sq")
            ]
        return [masters.tensors[idx].clone()] + [
            opt.state[masters.tensors[idx]][k].clone() for k in ("exp_avg", "exp_avg_sq")
        ]

    before, model_before = held(), model[2].weight.detach().clone()
    for _ in range(2):
        opt.zero_grad()
        opt.backward(loss_fn(model, x, y))
        model[2].weight.grad = None
        opt.step()
    assert torch.equal(model[2].weight, model_before)
    assert all(torch.equal(a, b) for a, b in zip(before, held()))
    assert not torch.equal(model[0].weight, mlp(torch.float16)[0].weight)


@pytest.mark.parametrize(
    ("make", "flat"),
    [
        (lambda m: adamw(m), True),  # fused: scale folded into the kernel, read-only sum check
        (lambda m: adamw(m), False),  # per-tensor: check on the fp16 grads
        (lambda m: adamw(m, fused=False, foreach=True), True),  # no folding: check and unscale in one pass
        (lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2), False),  # plain torch optimizer
    ],
    ids=["fused-flat", "fused-per-tensor", "foreach-flat", "plain-torch"],
)
def test_every_overflow_check_path_skips_poisoned_steps(make: Any, flat: bool) -> None:
    model = mlp(torch.float16)
    opt = FP16Optimizer(make(model), flat=flat, loss_scaler={"init_scale": 512.0, "scale_window": 4})
    x, y = data()
    skipped, losses = [], []
    for step in range(12):
        opt.zero_grad()
        loss = loss_fn(model, x, y)
        opt.backward(loss)
        if step in (2, 3, 9):
            poison(model, "nan" if step == 3 else "inf")
        before = snapshot(opt, model)
        opt.step()
        assert all_finite(snapshot(opt, model))
        if opt.last_step_skipped:
            assert same(before, snapshot(opt, model))
        skipped.append(opt.last_step_skipped)
        losses.append(float(loss.detach()))
    assert [i for i, s in enumerate(skipped) if s] == [2, 3, 9]
    assert opt.loss_scale == 128.0  # 512 -> 256 -> 128, x2 after 4 clean steps, then /2 at step 9
    ref = mlp(torch.float16)
    ref_opt = FP16Optimizer(adamw(ref), loss_scaler={"init_scale": 512.0, "scale_window": 4})
    ref_losses = []
    for step in range(12):
        ref_opt.zero_grad()
        loss = loss_fn(ref, x, y)
        ref_opt.backward(loss)
        if step in (2, 3, 9):
            poison(ref, "inf")
        ref_opt.step()
        ref_losses.append(float(loss.detach()))
    assert losses == pytest.approx(ref_losses, rel=1e-3)


def test_an_fp32_checkpoint_resumes_in_fp16_per_tensor() -> None:
    """Moving a run from fp32 to fp16: the unwrapped optimizer's state loads
    into FP16Optimizer(flat=False); flat=True says how to do it."""
    model = mlp(torch.float32)
    fp32 = AdamW(model.parameters(), lr=1e-2)
    train(model, fp32, steps=3)
    sd = copy.deepcopy(fp32.state_dict())
    half = model.half()
    with pytest.raises(ConfigError, match="flat=False"):
        FP16Optimizer(adamw(half)).load_state_dict(copy.deepcopy(sd))
    opt = FP16Optimizer(adamw(half), flat=False)
    opt.load_state_dict(sd)
    assert all(s["exp_avg"].dtype == torch.float32 for s in opt.state.values())
    assert train(half, opt, steps=5)[-1] < train(mlp(torch.float16), FP16Optimizer(adamw(mlp(torch.float16))), 5)[0]


def test_zero_grad_and_average_params() -> None:
    model = mlp(torch.float16)
    opt = FP16Optimizer(adamw(model))
    x, y = data()
    opt.backward(loss_fn(model, x, y))
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    opt.average_params()  # no torch.distributed: nothing changes
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


EDITS = {
    # a pretrained checkpoint loaded after the optimizer is built (the worst case: overwritten, it is lost silently)
    "load_state_dict": lambda model, new: model.load_state_dict(new.state_dict()),
    "in place under no_grad": lambda model, new: [p.copy_(q) for p, q in zip(model.parameters(), new.parameters())],
    "p.data replaced": lambda model, new: [setattr(p, "data", q.detach().clone()) for p, q in zip(model.parameters(), new.parameters())],
}


@pytest.mark.parametrize("edit", list(EDITS))
@pytest.mark.parametrize("flat", [True, False], ids=["flat", "per-tensor"])
def test_weights_changed_after_the_build_are_stepped_from_not_overwritten(edit: str, flat: bool) -> None:
    """The next step starts from the model's new weights; the stale fp32 copy is
    not written back over them."""
    model = mlp(torch.float16)
    opt = FP16Optimizer(adamw(model), flat=flat)
    train(model, opt, steps=3)
    pretrained = mlp(torch.float16, seed=7)
    with torch.no_grad():
        EDITS[edit](model, pretrained)
    assert same(list(model.parameters()), list(pretrained.parameters()))
    train(model, opt, steps=1)
    moved = max(float((p.float() - q.float()).abs().max()) for p, q in zip(model.parameters(), pretrained.parameters()))
    assert moved < 0.05, f"the step did not start from the new weights (moved {moved:.3g} from them)"
    stale = max(float((p.float() - q.float()).abs().max()) for p, q in zip(model.parameters(), mlp(torch.float16).parameters()))
    assert stale > 0.1  # and it is not back near the weights of before the edit


@pytest.mark.parametrize("flat", [True, False])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_an_optimizer_whose_constructor_makes_state_is_wrapped(precision: str, flat: bool) -> None:
    """torch's Adagrad fills its state (``sum``, ``step = 0``) in ``__init__``:
    that state moves onto the fp32 copy, and the run is fp32 Adagrad's on that
    copy (the reference: torch's Adagrad stepping an fp32 model with the
    half-precision gradients, unscaled). State after a step is still refused."""
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    model = mlp(dtype)
    ref_model = copy.deepcopy(model).float()  # the same (rounded) start
    adagrad = {"type": "Adagrad", "lr": 0.05, "initial_accumulator_value": 0.1, "no_decay": False}
    config = {"type": "FP16Optimizer", "optimizer": adagrad, "precision": precision, "flat": flat}
    if precision == "fp16":
        config["loss_scaler"] = {"init_scale": 8.0, "scale_window": 1000}
    opt = build_optimizer(config, model)
    inner = opt.optimizer
    assert opt.flat is flat
    assert all(p.dtype == torch.float32 for g in inner.param_groups for p in g["params"])
    assert set(inner.state) == {p for g in inner.param_groups for p in g["params"]}  # keyed by the fp32 copy
    ref = torch.optim.Adagrad(ref_model.parameters(), lr=0.05, initial_accumulator_value=0.1)
    x, y = data()
    for _ in range(5):
        opt.zero_grad()
        opt.backward(loss_fn(model, x, y))
        opt.step()
        ref.zero_grad()
        for p, q in zip(model.parameters(), ref_model.parameters()):
            q.grad = p.grad.float() / (opt.loss_scale if precision == "fp16" else 1.0)
        ref.step()
        masters = [v for m in opt._masters for v in m.views]
        with torch.no_grad():  # the fp32 copy steps as fp32 Adagrad does; the model holds it rounded
            for p, q, master in zip(model.parameters(), ref_model.parameters(), masters):
                torch.testing.assert_close(master, q, rtol=1e-6, atol=1e-7)  # fused and for-loop kernels
                torch.testing.assert_close(p.float(), q.to(dtype).float(), rtol=torch.finfo(dtype).eps, atol=1e-6)  # one rounding apart
    assert all(float(s["step"]) == 5 for s in inner.state.values())
    stepped = torch.optim.Adagrad(mlp(dtype).parameters(), lr=0.05)
    for p in stepped.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    stepped.step()
    with pytest.raises(ConfigError, match="empty state"):
        FP16Optimizer(stepped, precision=precision, loss_scaler=None)
