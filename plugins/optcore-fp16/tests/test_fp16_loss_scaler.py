"""DynamicLossScaler: fairseq's arithmetic, torch.amp.GradScaler's sequence,
the minimum and its error, fairseq's settings and names, the cap, and its state dict."""

from __future__ import annotations

import io

import pytest
import torch
from fp16_helpers import adamw, all_finite, data, loss_fn, mlp, poison, same, snapshot
from optcore_fp16 import DynamicLossScaler, FP16Optimizer, MinimumLossScaleError

import optcore
from optcore import ConfigError, OptcoreError, StepError

# Overflow pattern of the 200-step run: isolated, back-to-back, and a burst
# long enough to drive the scale down several times, then a long clean stretch.
POISONED = {
    3: "inf",
    4: "nan",
    20: "inf",
    41: "nan",
    42: "inf",
    43: "inf",
    44: "nan",
    90: "inf",
    150: "nan",
    151: "inf",
}
# (a window short enough to grow the scale between overflows, long enough that
# it never grows into a natural fp16 overflow of this model's gradients)
STEPS, INIT, FACTOR, WINDOW = 200, 2.0**10, 2.0, 16


def test_fairseq_defaults() -> None:
    s = DynamicLossScaler()
    assert (s.loss_scale, s.scale_factor, s.scale_window, s.tolerance, s.threshold, s.min_loss_scale) == (
        128.0,
        2.0,
        2**14,
        0.0,
        None,
        1e-4,
    )
    assert DynamicLossScaler(update_freq=4).scale_window == 2**12


def _fp16_scale_sequence() -> tuple[list[float], list[bool]]:
    """The scale each step's backward used, and which steps were skipped, with
    every invariant of a skipped step checked on the way."""
    model = mlp(torch.float16)
    opt = FP16Optimizer(adamw(model), loss_scaler={"init_scale": INIT, "scale_factor": FACTOR, "scale_window": WINDOW})
    x, y = data()
    scales, skipped = [], []
    for step in range(STEPS):
        opt.zero_grad()
        scales.append(opt.loss_scale)
        opt.backward(loss_fn(model, x, y))
        if step in POISONED:
            poison(model, POISONED[step])
        before = snapshot(opt, model)
        opt.step()
        after = snapshot(opt, model)
        skipped.append(opt.last_step_skipped)
        assert all_finite(after), f"non-finite parameter or state after step {step}"
        if step in POISONED:
            assert same(before, after), f"skipped step {step} changed parameters or optimizer state"
        else:
            assert not same(before, after), f"clean step {step} changed nothing"
    assert opt.skipped_steps == len(POISONED)
    return scales, skipped


def _grad_scaler_sequence() -> tuple[list[float], list[bool]]:
    """torch.amp.GradScaler with the same init/factor/window on the same pattern."""
    model = mlp(torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(
        "cpu", init_scale=INIT, growth_factor=FACTOR, backoff_factor=1 / FACTOR, growth_interval=WINDOW
    )
    x, y = data()
    scales, skipped = [], []
    for step in range(STEPS):
        opt.zero_grad()
        scales.append(scaler.get_scale())
        scaler.scale(loss_fn(model, x, y)).backward()
        if step in POISONED:
            poison(model, POISONED[step])
        scaler.step(opt)
        scaler.update()
        skipped.append(scaler.get_scale() < scales[-1])
    return scales, skipped


def test_overflow_injection_matches_grad_scaler() -> None:
    scales, skipped = _fp16_scale_sequence()
    assert [i for i, s in enumerate(skipped) if s] == sorted(POISONED)
    # halved at each overflow, doubled after each 16 clean steps in a row
    assert (scales[0], scales[4], scales[5], scales[21], scales[37], scales[45]) == (1024, 512, 256, 128, 256, 16)
    assert scales[-1] == 256  # the third growth comes with the last step's update
    ref_scales, ref_skipped = _grad_scaler_sequence()
    assert scales == ref_scales
    assert skipped == ref_skipped


def test_scale_sequence_by_hand() -> None:
    s = DynamicLossScaler(init_scale=8.0, scale_window=3)
    seen = []
    for overflow in [False, False, False, True, False, False, True, True, False, False, False]:
        s.update(overflow)
        seen.append(s.loss_scale)
    assert seen == [8, 8, 16, 8, 8, 8, 4, 2, 2, 2, 4]
    assert s.skipped_steps == 3


def test_tolerance_lowers_only_past_the_fraction() -> None:
    # fairseq: lower when overflows since the last rescale / steps since it >= tolerance
    s = DynamicLossScaler(init_scale=8.0, scale_window=1000, tolerance=0.25)
    pattern = [True] + [False] * 3 + [True] + [False] * 8 + [True, True, True]
    seen = []
    for overflow in pattern:
        s.update(overflow)
        seen.append(s.loss_scale)
    assert seen[0] == 4  # 1/1 >= 0.25
    assert seen[4] == 2  # 1/4 >= 0.25
    assert seen[13:] == [2, 2, 1]  # 1/9, 2/10 tolerated; 3/11 is not
    assert s.skipped_steps == 5


def test_minimum_raises_with_advice_and_keeps_state() -> None:
    s = DynamicLossScaler(init_scale=1.0, min_loss_scale=0.2)
    s.update(True)
    s.update(True)
    assert s.loss_scale == 0.25
    with pytest.raises(FloatingPointError, match="learning rate"):
        s.update(True)
    assert s.loss_scale == 0.25 and s.skipped_steps == 2


def test_minimum_error_is_optcore_and_floating_point_and_says_what_was_measured() -> None:
    s = DynamicLossScaler(init_scale=16.0, scale_window=1000, min_loss_scale=1.0)
    for _ in range(96):
        s.update(False)
    for _ in range(3):  # 16 -> 8 -> 4 -> 2
        s.update(True)
    with pytest.raises(MinimumLossScaleError) as err:
        s.update(True)  # 2 -> 1 reaches the minimum
    assert isinstance(err.value, OptcoreError) and isinstance(err.value, FloatingPointError)
    assert isinstance(err.value, StepError) and isinstance(err.value, RuntimeError)
    message = str(err.value)
    assert "overflowed (inf/NaN) on 4 of the last 100 steps" in message
    assert "4 of 100 steps skipped in all" in message and "every scale" not in message
    assert (err.value.overflows, err.value.recent, err.value.loss_scale) == (4, 100, 2.0)
    assert s.loss_scale == 2.0 and s.skipped_steps == 3  # the raising step changed nothing


def test_minimum_error_counts_only_the_last_hundred_steps() -> None:
    s = DynamicLossScaler(init_scale=2.0**13, scale_window=10**6, min_loss_scale=1.0)
    for overflow in [True] * 3 + [False] * 200 + [True] * 9:  # 2**13 -> 2**10 -> 2
        s.update(overflow)
    with pytest.raises(MinimumLossScaleError, match=r"on 10 of the last 100 steps \(13 of 213 steps skipped"):
        s.update(True)


def test_minimum_error_comes_from_the_wrapper_step() -> None:
    model = mlp(torch.float16)
    opt = FP16Optimizer(adamw(model), loss_scaler={"init_scale": 4.0, "min_loss_scale": 1.0})
    x, y = data()
    with pytest.raises(FloatingPointError, match="on 2 of the last 2 steps"):
        for _ in range(3):
            opt.zero_grad()
            opt.backward(loss_fn(model, x, y))
            poison(model, "nan")
            opt.step()


def test_fairseq_test_settings_are_accepted_with_a_warning() -> None:
    # fairseq's tests/test_fp16_optimizer.py: fp16_init_scale=1, threshold_loss_scale=1, min_loss_scale=1e-4
    with pytest.warns(UserWarning, match="does not stop"):
        s = DynamicLossScaler.from_config({"fp16_init_scale": 1, "threshold_loss_scale": 1, "min_loss_scale": 1e-4})
    assert (s.loss_scale, s.threshold, s.min_loss_scale) == (1.0, 1.0, 1e-4)
    for _ in range(50):  # fairseq's semantics: clamped at the threshold, skipped, never stopped
        s.update(True)
    assert s.loss_scale == 1.0 and s.skipped_steps == 50
    model = mlp(torch.float16)
    with pytest.warns(UserWarning, match="threshold=1 is above min_loss_scale"):
        opt = FP16Optimizer(adamw(model), loss_scaler={"fp16_init_scale": 1, "threshold_loss_scale": 1})
    x, y = data()
    opt.backward(loss_fn(model, x, y))
    opt.step()
    assert not opt.last_step_skipped


def test_threshold_at_the_minimum_stops_without_a_warning(recwarn: pytest.WarningsRecorder) -> None:
    s = DynamicLossScaler(init_scale=1.0, threshold=0.5, min_loss_scale=0.5)
    with pytest.raises(MinimumLossScaleError):
        s.update(True)
    assert not [w for w in recwarn if "threshold" in str(w.message)]


def test_init_scale_at_or_below_the_minimum_is_accepted_as_fairseq_does() -> None:
    s = DynamicLossScaler(init_scale=1e-5)  # min_loss_scale 1e-4
    s.update(False)
    assert s.loss_scale == 1e-5
    with pytest.raises(MinimumLossScaleError):  # the first overflow stops training
        s.update(True)


def test_fairseq_option_names_are_aliases() -> None:
    s = DynamicLossScaler.from_config(
        {"fp16_init_scale": 4, "fp16_scale_window": 7, "fp16_scale_tolerance": 0.25,
         "threshold_loss_scale": 1e-4, "min_loss_scale": 1e-4}
    )
    assert (s.loss_scale, s.scale_window, s.tolerance, s.threshold, s.min_loss_scale) == (4, 7, 0.25, 1e-4, 1e-4)
    opt = optcore.build_optimizer(
        {"type": "FP16Optimizer", "optimizer": {"type": "SGD", "lr": 0.1},
         "loss_scaler": {"fp16_init_scale": 8, "fp16_scale_window": 3}},
        mlp(torch.float16),
    )
    assert (opt.scaler.loss_scale, opt.scaler.scale_window) == (8, 3)
    with pytest.raises(ConfigError, match="fp16_init_scale"):  # both spellings at once: one is unknown
        DynamicLossScaler.from_config({"init_scale": 4, "fp16_init_scale": 8})


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 0.0, -1.0, "inf", "nan"])
def test_init_scale_must_be_positive_and_finite(bad) -> None:
    with pytest.raises(ConfigError, match="init_scale"):
        DynamicLossScaler(init_scale=bad)
    with pytest.raises(ConfigError, match="init_scale"):
        optcore.build_optimizer(
            {"type": "FP16Optimizer", "optimizer": {"type": "SGD", "lr": 0.1}, "loss_scaler": {"init_scale": bad}},
            mlp(torch.float16),
        )


def test_scale_never_grows_past_the_gradient_dtype() -> None:
    s = DynamicLossScaler(scale_window=1)  # fp16 gradients: at most 65504
    for _ in range(300):
        s.update(False)
    assert s.loss_scale == 2.0**15
    wide = DynamicLossScaler(scale_window=1, grad_dtype=torch.float32)
    for _ in range(300):
        wide.update(False)
    assert wide.loss_scale == 2.0**127 and torch.isfinite(torch.tensor(wide.loss_scale))
    ref = torch.amp.GradScaler("cpu", init_scale=128.0, growth_interval=1)  # torch stays finite too
    assert torch.isfinite(torch.tensor(ref.get_scale()))


def test_the_sequence_is_grad_scalers_up_to_the_cap_as_the_docs_say() -> None:
    """The docs' statement, both halves: with tolerance 0 the scale sequence is
    GradScaler's while it stays below the fp16 maximum; GradScaler then grows to
    65536 and beyond, where the gradient of an fp16 loss (the scale itself) is inf
    and the step overflows, while the cap holds at 32768 and skips nothing."""
    ours = DynamicLossScaler(init_scale=2.0**10, scale_window=2)
    ref = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=2)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)
    seen, theirs = [], []
    for _ in range(20):
        seen.append(ours.loss_scale)
        theirs.append(ref.get_scale())
        ref.scale(opt.param_groups[0]["params"][0].sum() * 0).backward()  # a clean step for GradScaler
        ref.step(opt)
        ref.update()
        ours.update(False)
    below = [i for i, v in enumerate(theirs) if v <= torch.finfo(torch.float16).max]
    assert [seen[i] for i in below] == [theirs[i] for i in below]
    assert max(seen) == 2.0**15 and max(theirs) > 2.0**16
    fp16_loss = torch.ones((), dtype=torch.float16, requires_grad=True)
    (fp16_loss.float() * 2.0**16).backward()  # what the wrappers' backward does at GradScaler's next scale
    assert torch.isinf(fp16_loss.grad)
    fp16_loss.grad = None
    ours.scale(fp16_loss).backward()
    assert torch.isfinite(fp16_loss.grad)
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    for page in (root / "plugins" / "optcore-fp16" / "README.md", root / "docs" / "precision.md"):
        claim = " ".join(page.read_text().split("scale_window` (tested", 1)[1].split("\n\n", 1)[0].split())
        assert "32768" in claim and "65536" in claim, f"{page.name} says the sequence is GradScaler's without its cap"


def test_scale_is_capped_in_training_and_a_too_large_init_is_lowered() -> None:
    model = mlp(torch.float16)
    opt = FP16Optimizer(adamw(model, lr=1e-4), loss_scaler={"scale_window": 1})
    x, y = data()
    for _ in range(20):
        opt.zero_grad()
        opt.backward(loss_fn(model, x, y))
        opt.step()
        assert opt.loss_scale <= torch.finfo(torch.float16).max
    assert opt.loss_scale == 2.0**15
    with pytest.warns(UserWarning, match="not representable"):
        opt = FP16Optimizer(adamw(mlp(torch.float16)), loss_scaler={"init_scale": 2.0**16})
    assert opt.loss_scale == 2.0**15


def test_bad_values_are_reported_together() -> None:
    with pytest.raises(ConfigError) as err:
        DynamicLossScaler(init_scale=-1, scale_factor=0.5, scale_window=0)
    fields = {field for field, _ in err.value.problems}
    assert {"init_scale", "scale_factor", "scale_window"} <= fields


def test_state_dict_survives_weights_only_load() -> None:
    s = DynamicLossScaler(init_scale=64.0, scale_window=2)
    for overflow in [True, False, False, True, False]:
        s.update(overflow)
    buf = io.BytesIO()
    torch.save(s.state_dict(), buf)
    buf.seek(0)
    t = DynamicLossScaler(init_scale=64.0, scale_window=2)
    t.load_state_dict(torch.load(buf, weights_only=True))
    assert t.state_dict() == s.state_dict()
    for overflow in [False, True, False, False]:
        s.update(overflow)
        t.update(overflow)
        assert t.loss_scale == s.loss_scale
