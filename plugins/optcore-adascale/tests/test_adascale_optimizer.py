"""AdaScaleSGD in one process: fairscale's numbers, the contract, checkpoints, errors."""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch

import optcore
from optcore_adascale import AccumulationError, AdaScaleSGD
from optcore_adascale import adascale as adascale_module

KW = dict(lr=0.1, momentum=0.9, weight_decay=1e-3)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def _groups(model: torch.nn.Module) -> list[dict]:
    return [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.05}]


def _batch(step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10 * step + micro)
    f32 = torch.float32  # fixed, whatever the default dtype
    return torch.randn(4, 8, generator=g, dtype=f32), torch.randn(4, 2, generator=g, dtype=f32)


def _train(model, opt, steps, accum=2, first=0, scaled_loss=True, loss_scale=1.0, after_backward=None,
           preview=False):
    """Train ``steps`` steps; return the gains per step and group (the last entry:
    all groups): with ``preview``, ``opt.gain()`` read after the last backward and
    before the step (fairscale's documented ``step += optim.gain()``), else after it."""
    gains = []
    n_groups = len(opt.param_groups)

    def read() -> list[float]:
        return [opt.gain(i) for i in range(n_groups)] + [opt.gain()]

    for step in range(first, first + steps):
        opt.zero_grad()
        for micro in range(accum):
            x, y = _batch(step, micro)
            loss = torch.nn.functional.mse_loss(model(x), y)
            (loss * loss_scale / (accum if scaled_loss else 1)).backward()
        if after_backward:
            after_backward()
        if preview:
            gains.append(read())
        if loss_scale != 1.0:
            opt.step(scale=loss_scale)
        else:
            opt.step()
        if not preview:
            gains.append(read())
    return gains


def _assert_params_close(a: torch.nn.Module, b: torch.nn.Module, tol: float = 1e-6) -> None:
    for x, y in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(x, y, atol=tol, rtol=tol)


@pytest.mark.parametrize(
    "sgd, adascale",
    [
        ({}, {}),
        ({"nesterov": True}, {"debias_ewma": False}),
        ({"dampening": 0.5}, {"is_scaled_loss": False}),
        ({}, {"scale": 3.0, "smoothing": 0.5}),
    ],
)
@pytest.mark.parametrize("multi_tensor", [False, True], ids=["per-tensor", "multi-tensor"])
@pytest.mark.parametrize("preview", [False, True], ids=["gain-after-step", "gain-before-step"])
def test_matches_fairscale_with_two_accumulated_gradients(sgd, adascale, multi_tensor, preview, monkeypatch) -> None:
    fairscale = pytest.importorskip("fairscale.optim")
    if multi_tensor:  # the accelerator path, run on CPU
        monkeypatch.setattr(adascale_module, "_chunks", lambda params: [params])
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    ours_model, ref_model = _model(), _model()
    ours = AdaScaleSGD(_groups(ours_model), num_gradients_to_accumulate=2, **KW, **sgd, **adascale)
    ref = fairscale.AdaScale(
        torch.optim.SGD(_groups(ref_model), **KW, **sgd), num_gradients_to_accumulate=2, **adascale
    )
    scaled = adascale.get("is_scaled_loss", True)
    ours_gains = _train(ours_model, ours, 15, scaled_loss=scaled, preview=preview)
    # fairscale wants the accumulated sum divided by hand; AdaScaleSGD does it in step()
    unscale = None if scaled else ref.scale_grad_by_num_grads_to_accum
    # fairscale's gain() before step() is the gain that step applies (and stays so after it)
    ref_gains = _train(ref_model, ref, 15, scaled_loss=scaled, after_backward=unscale, preview=True)
    ref.unhook()
    assert ours_gains[0][-1] > 1.0  # the first step is measured: not the initial gain 1
    assert ours_gains == [pytest.approx(g, abs=1e-6) for g in ref_gains]
    assert ours.progress == pytest.approx(sum(g[-1] for g in ref_gains), abs=1e-5)
    for i in (0, 1, None):
        assert ours.gain(i) == pytest.approx(ref.gain(i), abs=1e-6)
    assert 1.0 < ours.gain() <= ours.scale
    _assert_params_close(ours_model, ref_model)


def test_progress_sums_the_gains_and_schedulers_drive_the_base_lr() -> None:
    model = _model()
    opt = AdaScaleSGD(model.parameters(), num_gradients_to_accumulate=2, **KW)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    gains = []
    for step in range(4):
        gains += _train(model, opt, 1, first=step)
        sched.step()
    assert opt.progress == pytest.approx(sum(g[-1] for g in gains))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**4)  # the gain never leaks into group["lr"]
    assert opt.optimizer_config["scale"] == 2.0 and opt.optimizer_config["num_gradients_to_accumulate"] == 2


def test_set_scale_rescales_the_variance_estimate() -> None:
    model = _model()
    opt = AdaScaleSGD(model.parameters(), num_gradients_to_accumulate=2, **KW)
    _train(model, opt, 3)
    var = opt._avg["grad_var_avg"].clone()
    opt.set_scale(8)
    assert opt.scale == 8.0
    torch.testing.assert_close(opt._avg["grad_var_avg"], var * 2 / 8)
    with pytest.raises(optcore.ConfigError, match="scale must be >= 1"):
        opt.set_scale(0.5)


def test_checkpoint_loads_with_weights_only_and_resumes_the_same_trajectory() -> None:
    model = _model()
    opt = AdaScaleSGD(_groups(model), num_gradients_to_accumulate=2, **KW)
    _train(model, opt, 4)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    resumed_model = _model()
    resumed_model.load_state_dict(ckpt["model"])
    resumed = AdaScaleSGD(_groups(resumed_model), num_gradients_to_accumulate=2, **KW)
    resumed.load_state_dict(ckpt["optim"])
    assert resumed.progress == opt.progress and resumed.gain() == opt.gain()
    _train(model, opt, 4, first=4)
    _train(resumed_model, resumed, 4, first=4)
    for a, b in zip(model.parameters(), resumed_model.parameters()):
        assert torch.equal(a, b)
    assert resumed.progress == opt.progress


def test_load_state_dict_overrides_adascale_hyper_parameters() -> None:
    model = _model()
    opt = AdaScaleSGD(model.parameters(), num_gradients_to_accumulate=2, **KW)
    _train(model, opt, 2)
    fresh = AdaScaleSGD(model.parameters(), num_gradients_to_accumulate=2, **KW)
    fresh.load_state_dict(opt.state_dict(), optimizer_overrides={"lr": 0.01, "scale": 4.0, "smoothing": 0.9})
    assert (fresh.get_lr(), fresh.scale, fresh.smoothing) == (0.01, 4.0, 0.9)
    torch.testing.assert_close(fresh._avg["grad_var_avg"], opt._avg["grad_var_avg"] * 2 / 4)


def test_step_scale_and_grad_scaler_protocol() -> None:
    plain_model, scaled_model = _model(), _model()
    plain = AdaScaleSGD(plain_model.parameters(), num_gradients_to_accumulate=2, **KW)
    scaled = AdaScaleSGD(scaled_model.parameters(), num_gradients_to_accumulate=2, **KW)
    _train(plain_model, plain, 3)
    _train(scaled_model, scaled, 3, loss_scale=1024.0)
    assert scaled.gain() == pytest.approx(plain.gain(), rel=1e-5)
    _assert_params_close(plain_model, scaled_model, 1e-5)
    # gain() before step(scale=...) measures at scale 1; the step measures again on the true scale
    _train(plain_model, plain, 2, first=3)
    _train(scaled_model, scaled, 2, first=3, loss_scale=1024.0, preview=True)
    assert scaled.gain() == pytest.approx(plain.gain(), rel=1e-5)
    _assert_params_close(plain_model, scaled_model, 1e-5)

    # GradScaler sets grad_scale / found_inf (torch's _step_supports_amp_scaling protocol)
    before = [p.detach().clone() for p in scaled_model.parameters()]
    progress = scaled.progress
    scaled.grad_scale, scaled.found_inf = torch.tensor(8.0), torch.tensor(1.0)
    _train(scaled_model, scaled, 1, loss_scale=1.0)
    assert scaled.progress == progress and all(torch.equal(a, b) for a, b in zip(before, scaled_model.parameters()))
    del scaled.grad_scale, scaled.found_inf


def test_gradients_set_by_hand_keep_the_gain() -> None:
    p = torch.nn.Parameter(torch.ones(3))
    opt = AdaScaleSGD([p], lr=0.1, num_gradients_to_accumulate=2)
    p.grad = torch.ones(3)
    with pytest.warns(UserWarning, match="measured nothing"):
        opt.step()
    assert opt.gain() == 1.0 and torch.allclose(p, torch.full((3,), 0.9))


def test_deep_copy_gets_its_own_hooks() -> None:
    model = _model()
    opt = AdaScaleSGD(model.parameters(), num_gradients_to_accumulate=2, **KW)
    _train(model, opt, 2)
    model2, opt2 = copy.deepcopy((model, opt))
    _train(model, opt, 2, first=2)
    _train(model2, opt2, 2, first=2)
    assert opt2.gain() == opt.gain()
    _assert_params_close(model, model2, 0.0)


def test_add_param_group_starts_at_gain_one() -> None:
    model = _model()
    opt = AdaScaleSGD(model[0].parameters(), num_gradients_to_accumulate=2, **KW)
    _train(model, opt, 2)
    opt.add_param_group({"params": model[2].parameters()})
    assert opt.gain(1) == 1.0
    _train(model, opt, 2, first=2)
    assert opt.gain(1) > 1.0


def test_one_gradient_sample_is_a_config_error() -> None:
    with pytest.raises(optcore.ConfigError, match="at least two gradient samples"):
        AdaScaleSGD(_model().parameters())


@pytest.mark.parametrize(
    "bad, field",
    [({"nesterov": True}, "nesterov"), ({"scale": 0.5}, "scale"), ({"smoothing": 1.0}, "smoothing"),
     ({"num_gradients_to_accumulate": 0}, "num_gradients_to_accumulate"), ({"lr": -1}, "lr")],
)
def test_bad_hyper_parameters_are_config_errors(bad, field) -> None:
    with pytest.raises(optcore.ConfigError) as info:
        AdaScaleSGD(_model().parameters(), **{"num_gradients_to_accumulate": 2, **bad})
    assert field in {f for f, _ in info.value.problems}


def test_stepping_some_groups_is_refused() -> None:
    model = _model()
    opt = AdaScaleSGD(_groups(model), num_gradients_to_accumulate=2)
    with pytest.raises(optcore.StepError, match="all param groups"):
        opt.step(groups=[0])


def test_resolves_by_name_through_the_entry_point() -> None:
    spec = optcore.resolve("adascale_sgd")
    assert spec.target is AdaScaleSGD and spec.source == "plugin"
    opt = optcore.build_optimizer({"type": "AdaScaleSGD", "lr": "0.1", "num_gradients_to_accumulate": 2}, _model())
    assert isinstance(opt, AdaScaleSGD) and opt.scale == 2.0


# ------------------------------------------------------------ accumulation protocol
@pytest.mark.parametrize("accum", [2, 3])
def test_gain_before_step_matches_fairscale_for_each_accumulation(accum) -> None:
    fairscale = pytest.importorskip("fairscale.optim")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    ours_model, ref_model = _model(), _model()
    ours = AdaScaleSGD(_groups(ours_model), num_gradients_to_accumulate=accum, **KW)
    ref = fairscale.AdaScale(torch.optim.SGD(_groups(ref_model), **KW), num_gradients_to_accumulate=accum)
    before = [ours.gain()]  # nothing measured yet: 1, as fairscale
    ours_gains = _train(ours_model, ours, 6, accum=accum, preview=True)
    ref_gains = _train(ref_model, ref, 6, accum=accum, preview=True)
    ref.unhook()
    assert before == [1.0] and ours_gains[0][-1] != 1.0
    assert ours_gains == [pytest.approx(g, abs=1e-6) for g in ref_gains]
    _assert_params_close(ours_model, ref_model)


def test_step_before_all_accumulated_backward_passes_is_an_error() -> None:
    model, good_model = _model(), _model()
    opt = AdaScaleSGD(model.parameters(), num_gradients_to_accumulate=3, **KW)
    good = AdaScaleSGD(good_model.parameters(), num_gradients_to_accumulate=3, **KW)
    x, y = _batch(0, 0)
    torch.nn.functional.mse_loss(model(x), y).backward()
    with pytest.raises(AccumulationError, match=r"after 1 backward pass\(es\).*num_gradients_to_accumulate is 3"):
        opt.step()
    assert isinstance(AccumulationError("x"), optcore.OptcoreError) and issubclass(AccumulationError, RuntimeError)
    # nothing changed: the loop may finish the accumulation and step
    for _ in range(2):
        torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    for _ in range(3):
        torch.nn.functional.mse_loss(good_model(x), y).backward()
    good.step()
    assert opt.gain() == good.gain() and opt.gain() > 1.0
    _assert_params_close(model, good_model, 0.0)
    # one backward pass too many is refused as well
    opt.zero_grad()
    for _ in range(4):
        torch.nn.functional.mse_loss(model(x), y).backward()
    with pytest.raises(AccumulationError, match="after 4 backward"):
        opt.step()
    # zero_grad forgets the passes
    opt.zero_grad()
    for _ in range(3):
        torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


@pytest.mark.parametrize("update_smoothing", [True, False])
def test_set_num_gradients_to_accumulate_matches_fairscale(update_smoothing) -> None:
    fairscale = pytest.importorskip("fairscale.optim")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    ours_model, ref_model = _model(), _model()
    ours = AdaScaleSGD(_groups(ours_model), num_gradients_to_accumulate=2, **KW)
    ref = fairscale.AdaScale(torch.optim.SGD(_groups(ref_model), **KW), num_gradients_to_accumulate=2)
    runs = []
    for opt, model in ((ours, ours_model), (ref, ref_model)):
        gains = _train(model, opt, 3, accum=2, preview=True)
        opt.set_num_gradients_to_accumulate(4, update_smoothing=update_smoothing)
        gains += _train(model, opt, 4, accum=4, first=3, preview=True)
        runs.append(gains)
    ref.unhook()
    assert ours.num_gradients_to_accumulate == 4 and ours.scale == ref.scale == 2.0  # scale is left alone
    assert ours.smoothing == pytest.approx(ref.smoothing) == (0.996 if update_smoothing else 0.998)
    assert ours.optimizer_config["num_gradients_to_accumulate"] == 4
    assert runs[0] == [pytest.approx(g, abs=1e-6) for g in runs[1]]
    _assert_params_close(ours_model, ref_model)


def test_set_num_gradients_to_accumulate_errors() -> None:
    model = _model()
    opt = AdaScaleSGD(model.parameters(), num_gradients_to_accumulate=2, **KW)
    x, y = _batch(0, 0)
    torch.nn.functional.mse_loss(model(x), y).backward()
    with pytest.raises(AccumulationError, match="after 1 backward pass"):
        opt.set_num_gradients_to_accumulate(3)
    opt.zero_grad()
    with pytest.raises(optcore.ConfigError, match="at least two gradient samples"):
        opt.set_num_gradients_to_accumulate(1)  # one process: one sample per step
    with pytest.raises(optcore.ConfigError):
        opt.set_num_gradients_to_accumulate(0)
    assert opt.num_gradients_to_accumulate == 2


# --------------------------------------------------------------------- precision
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_fairscale_in_the_params_dtype(dtype) -> None:
    fairscale = pytest.importorskip("fairscale.optim")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    ours_model, ref_model = _model().to(dtype), _model().to(dtype)
    ours = AdaScaleSGD(_groups(ours_model), num_gradients_to_accumulate=2, **KW)
    ref = fairscale.AdaScale(torch.optim.SGD(_groups(ref_model), **KW), num_gradients_to_accumulate=2)
    recorded = []
    real_norm = adascale_module._squared_norm
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(adascale_module, "_squared_norm", lambda t: recorded.append(real_norm(t)) or recorded[-1])
        ours_gains = _train(_cast(ours_model, dtype), ours, 8, preview=True)
    # fairscale sums the per-sample norms in a torch.zeros of the default dtype: make it the params'
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        ref_gains = _train(_cast(ref_model, dtype), ref, 8, preview=True)
    finally:
        torch.set_default_dtype(default)
    ref.unhook()
    assert {t.dtype for t in recorded} == {dtype}  # fp32 norms in fp32, fp64 norms in fp64
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    assert ours_gains == [pytest.approx(g, abs=tol) for g in ref_gains]
    _assert_params_close(ours_model, ref_model, tol)
    assert all(p.dtype == dtype for p in ours_model.parameters())


class _cast(torch.nn.Module):
    """Run ``model`` on inputs cast to ``dtype`` (the test batches are float32)."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.model, self.dtype = model, dtype

    def forward(self, x):  # noqa: D102
        return self.model(x.to(self.dtype)).float()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_params_accumulate_norms_in_float32(dtype) -> None:
    model = _model().to(dtype)
    opt = AdaScaleSGD(model.parameters(), num_gradients_to_accumulate=2, **KW)
    ref_model = _model()
    ref = AdaScaleSGD(ref_model.parameters(), num_gradients_to_accumulate=2, **KW)
    recorded = []
    real_norm = adascale_module._squared_norm
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(adascale_module, "_squared_norm", lambda t: recorded.append(real_norm(t)) or recorded[-1])
        gains = _train(_cast(model, dtype), opt, 3)
    ref_gains = _train(ref_model, ref, 3)
    assert {t.dtype for t in recorded} == {torch.float32}
    assert all(p.dtype == dtype for p in model.parameters())
    assert [g[-1] for g in gains] == pytest.approx([g[-1] for g in ref_gains], rel=0.05)


# ------------------------------------------------------------------ torch.compile
def _backward(model: torch.nn.Module, step: int, accum: int = 2) -> None:
    for micro in range(accum):
        x, y = _batch(step, micro)
        (torch.nn.functional.mse_loss(model(x), y) / accum).backward()


def test_compiled_step_has_no_more_graph_breaks_than_torch_sgd() -> None:
    torch._dynamo.reset()
    sgd_model, model = _model(), _model()
    sgd = torch.optim.SGD(_groups(sgd_model), **KW)
    opt = AdaScaleSGD(_groups(model), num_gradients_to_accumulate=2, **KW)
    explained = {}
    for name, o, m in (("sgd", sgd, sgd_model), ("adascale", opt, model)):
        o.zero_grad()
        _backward(m, 0)
        o.step()  # momentum buffers exist: the steady-state step is traced
        o.zero_grad()
        _backward(m, 1)
        explained[name] = torch._dynamo.explain(o.step)()
    assert explained["sgd"].graph_break_count == 0  # torch's SGD steps in one graph
    ours = explained["adascale"]
    assert ours.graph_break_count <= explained["sgd"].graph_break_count, [str(b.reason) for b in ours.break_reasons]
    assert ours.graph_count == 1


def test_compiled_step_matches_eager() -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager_model, compiled_model = _model(), _model()
    eager = AdaScaleSGD(_groups(eager_model), num_gradients_to_accumulate=2, **KW)
    compiled = AdaScaleSGD(_groups(compiled_model), num_gradients_to_accumulate=2, **KW)
    step = torch.compile(compiled.step)
    for i in range(5):
        for opt, model, run in ((eager, eager_model, eager.step), (compiled, compiled_model, step)):
            opt.zero_grad()
            _backward(model, i)
            if i == 3:  # the fairscale-style read before the step
                assert opt.gain() > 1.0
            run()
        assert compiled.gain() == pytest.approx(eager.gain(), rel=1e-6)
        assert compiled.progress == pytest.approx(eager.progress, rel=1e-6)
        _assert_params_close(eager_model, compiled_model, 1e-6)
    assert not counters["graph_break"], dict(counters["graph_break"])


# ---------------------------------------------------------- checkpoint shape checks
def _sized_model(hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 2))


@pytest.mark.parametrize("saved, loaded", [(32, 16), (16, 32)], ids=["larger-to-smaller", "smaller-to-larger"])
def test_checkpoint_from_a_different_shaped_model_is_an_error(saved, loaded) -> None:
    model = _sized_model(saved)
    opt = AdaScaleSGD(_groups(model), num_gradients_to_accumulate=2, **KW)
    _train(model, opt, 2)
    sd = opt.state_dict()
    other = AdaScaleSGD(_groups(_sized_model(loaded)), num_gradients_to_accumulate=2, **KW)
    before = {k: v.clone() for k, v in other._avg.items()}
    with pytest.raises(optcore.ConfigError, match="different model") as info:
        other.load_state_dict(sd)
    assert "adascale.group_numel" in {f for f, _ in info.value.problems}
    assert all(torch.equal(v, before[k]) for k, v in other._avg.items()) and not other.state  # nothing loaded


def test_checkpoint_estimates_of_another_group_count_are_an_error() -> None:
    model = _model()
    opt = AdaScaleSGD(_groups(model), num_gradients_to_accumulate=2, **KW)
    _train(model, opt, 2)
    sd = opt.state_dict()
    sd["adascale"] = {k: v for k, v in sd["adascale"].items() if k != "group_numel"}  # an older checkpoint
    sd["adascale"]["grad_var_avg"] = torch.zeros(3, dtype=torch.float64)
    fresh = AdaScaleSGD(_groups(_model()), num_gradients_to_accumulate=2, **KW)
    with pytest.raises(optcore.ConfigError, match="different model") as info:
        fresh.load_state_dict(sd)
    assert [f for f, _ in info.value.problems] == ["adascale.grad_var_avg"]


def test_gradients_kept_across_steps_are_measured_as_fairscale_does() -> None:
    """Without zero_grad, .grad keeps the last step's gradient; the hooks' running
    |.grad|^2 counts it, as fairscale's read of .grad does."""
    fairscale = pytest.importorskip("fairscale.optim")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    runs = []
    for make in (lambda m: AdaScaleSGD(_groups(m), num_gradients_to_accumulate=2, **KW),
                 lambda m: fairscale.AdaScale(torch.optim.SGD(_groups(m), **KW), num_gradients_to_accumulate=2)):
        model = _model()
        opt = make(model)
        gains = []
        for step in range(4):
            _backward(model, step)
            gains.append(opt.gain())
            opt.step()
        runs.append((gains, model))
    assert runs[0][0] == pytest.approx(runs[1][0], abs=1e-6)
    _assert_params_close(runs[0][1], runs[1][1])


def test_param_reached_only_by_an_earlier_backward_is_measured_from_grad() -> None:
    """The hooks' |.grad|^2 comes from the last backward; a param that only an
    earlier one reached makes step() read .grad instead. Same numbers as fairscale."""
    fairscale = pytest.importorskip("fairscale.optim")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    runs = []
    for wrap in ("ours", "fairscale"):
        torch.manual_seed(0)
        a, b = torch.nn.Parameter(torch.randn(5)), torch.nn.Parameter(torch.randn(5))
        if wrap == "ours":
            opt = AdaScaleSGD([a, b], num_gradients_to_accumulate=2, **KW)
        else:
            opt = fairscale.AdaScale(torch.optim.SGD([a, b], **KW), num_gradients_to_accumulate=2)
        gains = []
        for step in range(4):
            opt.zero_grad()
            x = torch.randn(5, generator=torch.Generator().manual_seed(step))
            ((a * x).sum() ** 2 + (b * x).sum() ** 2).backward()  # reaches a and b
            ((a * x.flip(0)).sum() ** 2).backward()  # reaches a only
            gains.append(opt.gain())
            opt.step()
        runs.append((gains, a.detach().clone(), b.detach().clone()))
    assert runs[0][0] == pytest.approx(runs[1][0], abs=1e-6) and runs[0][0][0] > 1.0
    torch.testing.assert_close(runs[0][1:], runs[1][1:], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("spoil", ["sparse gradient", "momentum of another shape"])
def test_a_step_it_cannot_take_is_a_step_error_that_changes_nothing(spoil: str) -> None:
    model = _model()
    opt = AdaScaleSGD(model.parameters(), num_gradients_to_accumulate=2, **KW)
    _train(model, opt, 1)
    x, y = _batch(5, 0)
    for _ in range(2):
        torch.nn.functional.mse_loss(model(x), y).backward()
    bias = model[2].bias
    kept = opt.state[bias]["momentum_buffer"]
    if spoil == "sparse gradient":
        bias.grad = bias.grad.to_sparse()
    else:
        opt.state[bias]["momentum_buffer"] = torch.zeros(7)
    before, gain = [p.detach().clone() for p in model.parameters()], opt.gain()
    with pytest.raises(optcore.StepError, match="sparse" if spoil == "sparse gradient" else r"shape \(7,\), not \(2,\)"):
        opt.step()
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters())) and opt.gain() == gain
    assert issubclass(AccumulationError, optcore.StepError)
    bias.grad = bias.grad.to_dense()
    opt.state[bias]["momentum_buffer"] = kept
    opt.step()  # the accumulation is intact: the loop goes on
    assert not torch.equal(before[-1], bias.detach())
