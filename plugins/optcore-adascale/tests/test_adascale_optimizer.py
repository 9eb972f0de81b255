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
    return torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g)


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
    with pytest.raises(optcore.ConfigError, match="all param groups"):
        opt.step(groups=[0])


def test_resolves_by_name_through_the_entry_point() -> None:
    spec = optcore.resolve("adascale_sgd")
    assert spec.target is AdaScaleSGD and spec.source == "plugin"
    opt = optcore.build_optimizer({"type": "AdaScaleSGD", "lr": "0.1", "num_gradients_to_accumulate": 2}, _model())
    assert isinstance(opt, AdaScaleSGD) and opt.scale == 2.0


def test_sharded_dtensor_params_are_refused() -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        weight = torch.nn.Parameter(distribute_tensor(torch.ones(4, 2), init_device_mesh("cpu", (1,)), [Shard(0)]))
        with pytest.raises(optcore.ConfigError, match="sharded"):
            AdaScaleSGD([weight], num_gradients_to_accumulate=2)
    finally:
        dist.destroy_process_group()
