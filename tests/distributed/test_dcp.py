"""torch.distributed.checkpoint (DCP) with every shipped optimizer.

DCP's ``get_optimizer_state_dict`` keeps only ``state`` and ``param_groups``,
fills a fresh optimizer's state by stepping it with zero gradients and
``lr=0``, and ``dcp.load`` loads into a template made from the optimizer it
loads into. Checked here: nothing optcore saves is lost on the way (the
identity record, AdaScale's estimates), the initialisation step changes no
parameter and no state, the implementation (``fused``) is chosen again for
the new placement, and a resume across world sizes (2 -> 1, 1 -> 2, FSDP2 on
gloo ranks) gives the steps of one uninterrupted process.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import optcore

from _dist_util import run_ranks

CONFIGS: dict[str, dict[str, Any]] = {
    "AdamW": {"type": "AdamW", "lr": 1e-2, "weight_decay": 0.1},
    "SGD": {"type": "SGD", "lr": 0.1, "momentum": 0.9, "dampening": 0.1},
    "Lion": {"type": "optcore-lion:Lion", "lr": 1e-3, "weight_decay": 0.1},
    "Adafactor": {"type": "optcore-adafactor:Adafactor", "weight_decay": 0.01},  # relative step
    "AdaScaleSGD": {"type": "optcore-adascale:AdaScaleSGD", "lr": 0.1, "momentum": 0.9, "num_gradients_to_accumulate": 2},
}
#: what FSDP2 steps (elementwise updates over DTensor shards; Adafactor and AdaScaleSGD reduce their statistics)
SHARDED = ["AdamW", "SGD", "Lion", "Adafactor", "AdaScaleSGD"]
#: on 2 ranks: one backward each, the two gradient samples the one process accumulates
ON_RANKS: dict[str, dict[str, Any]] = {"AdaScaleSGD": {"num_gradients_to_accumulate": 1}}
HALF = 4


def _available(name: str) -> str:
    try:
        optcore.resolve(CONFIGS[name]["type"]).target
    except (optcore.OptimizerNotFoundError, optcore.PluginLoadError) as exc:
        pytest.skip(f"{name} is not available here: {exc}")
    return name


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Tanh(), nn.Linear(8, 3))


def _build(name: str, model: nn.Module, **extra: Any) -> torch.optim.Optimizer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optcore.build_optimizer({**CONFIGS[name], **extra}, model)


def _batch(step: int, rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(2 * HALF, 6, generator=g), torch.randn(2 * HALF, 3, generator=g)
    return x[rows], y[rows]


def _train(name: str, model: nn.Module, opt: Any, steps: range, rank: int | None = None) -> None:
    """The full batch (AdaScaleSGD: as two accumulated halves), or ``rank``'s half."""
    for step in steps:
        opt.zero_grad()
        if rank is not None:
            x, y = _batch(step, slice(rank * HALF, (rank + 1) * HALF))
            nn.functional.mse_loss(model(x), y).backward()
        elif name == "AdaScaleSGD":
            for half in range(2):
                x, y = _batch(step, slice(half * HALF, (half + 1) * HALF))
                (nn.functional.mse_loss(model(x), y) / 2).backward()
        else:
            x, y = _batch(step)
            nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in model.parameters()]


def _save(model: nn.Module, opt: Any, path: str, options: Any = None) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optim = get_optimizer_state_dict(model, opt, options=options)
        dcp.save({"model": get_model_state_dict(model), "optim": optim}, checkpoint_id=path)


def _flat() -> Any:
    """torchtitan's options: one flat key per parameter and entry."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


#: the ways a resume loads: the model before the optimizer's template is made,
#: both templates first, and torch's combined get_state_dict/set_state_dict
#: (which loads the optimizer before the model)
WAYS = ("model-first", "together", "combined")


def _load(
    model: nn.Module, opt: Any, path: str, *, model_first: bool = True, options: Any = None, way: str | None = None
) -> list[torch.Tensor]:
    """Load ``path`` the way DCP's docs do; with ``model_first`` the model is
    loaded before the optimizer's template is made (DCP's init step then runs on
    the loaded weights); ``way="combined"``: torch's ``get_state_dict`` and
    ``set_state_dict``. Returns the parameters right after the model loaded."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict, get_optimizer_state_dict, get_state_dict, set_model_state_dict,
        set_optimizer_state_dict, set_state_dict,
    )

    way = way or ("model-first" if model_first else "together")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = None
        if way == "combined":
            model_state, optim_state = get_state_dict(model, opt, options=options)
            state = {"model": model_state, "optim": optim_state}
            dcp.load(state, checkpoint_id=path)
            set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"],
                           options=options)
            return _params(model)
        if way == "model-first":
            state = {"model": get_model_state_dict(model)}
            dcp.load(state, checkpoint_id=path)
            set_model_state_dict(model, state["model"])
            loaded = _params(model)
            state = {"optim": get_optimizer_state_dict(model, opt, options=options)}
        else:
            state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt, options=options)}
        dcp.load(state, checkpoint_id=path)
        if way == "together":
            set_model_state_dict(model, state["model"])
            loaded = _params(model)
        set_optimizer_state_dict(model, opt, state["optim"], options=options)
    return loaded


def _assert_equal(got: list[torch.Tensor], want: list[torch.Tensor], what: str, atol: float = 0.0) -> None:
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.allclose(a, b, rtol=0.0 if atol == 0.0 else 1e-5, atol=atol), (
            f"{what}: parameter {i} differs by {(a - b).abs().max():.3g}"
        )


# ------------------------------------------------------------------ one process
@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_dcp_resumes_every_optimizer_exactly(name: str, way: str, tmp_path: Path) -> None:
    _available(name)
    straight = _model()
    straight_opt = _build(name, straight)
    _train(name, straight, straight_opt, range(5))

    model = _model()
    opt = _build(name, model)
    _train(name, model, opt, range(3))
    _save(model, opt, str(tmp_path))
    saved = _params(model)

    resumed = _model(seed=7)
    resumed_opt = _build(name, resumed)
    loaded = _load(resumed, resumed_opt, str(tmp_path), way=way)
    _assert_equal(loaded, saved, "DCP's init step moved the loaded parameters")
    _assert_equal(_params(resumed), saved, "the parameters after the optimizer loaded")
    if name == "AdaScaleSGD":  # its estimator, kept outside state, came back
        assert resumed_opt.progress == pytest.approx(opt.progress) and resumed_opt.progress > 3.0
        assert resumed_opt.gain() == pytest.approx(opt.gain())
    _train(name, resumed, resumed_opt, range(3, 5))
    _assert_equal(_params(resumed), _params(straight), f"{name} resumed through DCP")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_dcps_initialisation_step_changes_no_parameter_and_no_state(name: str, tmp_path: Path) -> None:
    """A checkpoint of a fresh optimizer (made before the first step) resumes
    as that fresh optimizer: its first step is a first step."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    _available(name)
    straight = _model()
    _train(name, straight, _build(name, straight), range(2))

    model = _model()
    opt = _build(name, model)
    before = _params(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # AdaScale's "stepped on gradients no backward produced" included
        get_optimizer_state_dict(model, opt)
    _assert_equal(_params(model), before, "get_optimizer_state_dict moved a parameter")
    if name == "AdaScaleSGD":
        assert opt.progress == 0.0
    _save(model, opt, str(tmp_path))

    fresh_after_save = _model()
    fresh_opt = _build(name, fresh_after_save)
    _load(fresh_after_save, fresh_opt, str(tmp_path))
    for m, o in ((model, opt), (fresh_after_save, fresh_opt)):
        _train(name, m, o, range(2))
        _assert_equal(_params(m), _params(straight), f"{name} after DCP's init step")


def test_an_adamw_checkpoint_does_not_load_into_adam(tmp_path: Path) -> None:
    model = _model()
    opt = _build("AdamW", model)
    _train("AdamW", model, opt, range(2))
    _save(model, opt, str(tmp_path))
    other = _model()
    adam = optcore.build_optimizer({"type": "Adam", "lr": 1e-2}, other)
    with pytest.raises(optcore.ConfigError, match="saved by AdamW from torch.*this optimizer is Adam"):
        _load(other, adam, str(tmp_path))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_flattened_dcp_state_dicts_resume_every_optimizer_with_its_record(name: str, tmp_path: Path) -> None:
    """StateDictOptions(flatten_optimizer_state_dict=True) rebuilds the groups
    from the live groups' keys: the identity and extra state (AdaScale's
    estimator) are read back from the flat keys they were saved under."""
    _available(name)
    straight = _model()
    _train(name, straight, _build(name, straight), range(5))
    model = _model()
    opt = _build(name, model)
    _train(name, model, opt, range(3))
    _save(model, opt, str(tmp_path), options=_flat())
    resumed = _model(seed=7)
    resumed_opt = _build(name, resumed)
    _load(resumed, resumed_opt, str(tmp_path), options=_flat())
    if name == "AdaScaleSGD":
        assert resumed_opt.progress == pytest.approx(opt.progress) and resumed_opt.progress > 3.0
    _train(name, resumed, resumed_opt, range(3, 5))
    _assert_equal(_params(resumed), _params(straight), f"{name} resumed through DCP's flattened state dict")


def test_a_flattened_adamw_checkpoint_does_not_load_into_adam(tmp_path: Path) -> None:
    model = _model()
    opt = _build("AdamW", model)
    _train("AdamW", model, opt, range(2))
    _save(model, opt, str(tmp_path), options=_flat())
    other = _model()
    adam = optcore.build_optimizer({"type": "Adam", "lr": 1e-2}, other)
    with pytest.raises(optcore.ConfigError, match="saved by AdamW from torch.*this optimizer is Adam"):
        _load(other, adam, str(tmp_path), options=_flat())


def test_the_identity_and_extra_state_are_in_what_dcp_keeps() -> None:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    _available("AdaScaleSGD")
    model = _model()
    opt = _build("AdaScaleSGD", model)
    _train("AdaScaleSGD", model, opt, range(2))
    osd = get_optimizer_state_dict(model, opt)
    assert set(osd) == {"state", "param_groups"}
    record = osd["param_groups"][0]["optcore"]
    assert (record["name"], record["provider"], record["fresh"]) == ("AdaScaleSGD", "optcore-adascale", False)
    assert record["extra"]["adascale"]["progress"] == pytest.approx(opt.progress)
    assert all(g["optcore"]["name"] == "AdaScaleSGD" for g in osd["param_groups"])
    assert all("optcore" not in g for g in opt.param_groups)  # records never reach the live groups


# ----------------------------------------------------------- across world sizes
def _fsdp(model: nn.Module, world: int) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for layer in (model[0], model[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _save_on_ranks(rank: int, world: int, names: list[str], root: str) -> dict[str, Any]:
    """2 ranks under FSDP2 train 3 steps on half batches each and save."""
    out = {}
    for name in names:
        model = _fsdp(_model(), world)
        opt = _build(name, model, **ON_RANKS.get(name, {}))
        _train(name, model, opt, range(3), rank=rank)
        _save(model, opt, str(Path(root, name)))
        out[name] = [g.get("fused") for g in opt.param_groups]
    return out


def _resume_on_ranks(rank: int, world: int, names: list[str], root: str) -> dict[str, Any]:
    """2 ranks under FSDP2 load a checkpoint and train steps 3 and 4."""
    out = {}
    for name in names:
        model = _fsdp(_model(seed=7), world)
        opt = _build(name, model, **ON_RANKS.get(name, {}))
        _load(model, opt, str(Path(root, name)))
        fused = [g.get("fused") for g in opt.param_groups]
        _train(name, model, opt, range(3, 5), rank=rank)
        out[name] = {"params": _params(model), "fused": fused}
    return out


@pytest.mark.distributed
def test_dcp_resumes_fsdp2_from_two_ranks_in_one_process(tmp_path: Path) -> None:
    names = [n for n in SHARDED if _available(n)]
    run_ranks(_save_on_ranks, 2, names, str(tmp_path), timeout=240)
    for name in names:
        straight = _model()
        _train(name, straight, _build(name, straight), range(5))
        model = _model(seed=7)
        opt = _build(name, model)
        _load(model, opt, str(tmp_path / name))
        _train(name, model, opt, range(3, 5))
        _assert_equal(_params(model), _params(straight), f"{name}: FSDP2 on 2 ranks -> 1 process", atol=1e-6)


@pytest.mark.distributed
def test_dcp_resumes_a_one_process_checkpoint_on_two_fsdp2_ranks(tmp_path: Path) -> None:
    """The one process chose torch's fused kernel; the FSDP2 optimizer it loads
    into keeps its own choice (fused kernels have no DTensor rules)."""
    names = [n for n in SHARDED if _available(n)]
    straight_params = {}
    for name in names:
        straight = _model()
        _train(name, straight, _build(name, straight), range(5))
        straight_params[name] = _params(straight)
        model = _model()
        opt = _build(name, model)
        if name in ("AdamW", "SGD"):
            assert all(g["fused"] for g in opt.param_groups)  # what the checkpoint records
        _train(name, model, opt, range(3))
        _save(model, opt, str(tmp_path / name))
    results = run_ranks(_resume_on_ranks, 2, names, str(tmp_path), timeout=240)
    for rank, info in enumerate(results):
        for name in names:
            assert not any(info[name]["fused"]), f"{name} on rank {rank} restored fused=True onto DTensor params"
            _assert_equal(info[name]["params"], straight_params[name], f"{name}: 1 process -> FSDP2 on 2 ranks", atol=1e-6)


# ---------------------------------------------------------- precision wrappers
def _fp16_model(seed: int = 0) -> nn.Module:
    return _model(seed).half()


def _fp16_train(model: nn.Module, opt: Any, steps: range) -> None:
    for step in steps:
        opt.zero_grad()
        x, y = _batch(step)
        opt.backward(nn.functional.mse_loss(model(x.half()).float(), y))
        opt.step()


def _fp16_config(flat: bool) -> dict[str, Any]:
    return {"type": "optcore-fp16:FP16Optimizer", "flat": flat, "loss_scaler": {"init_scale": 2.0**14, "scale_window": 1},
            "optimizer": {"type": "torch:AdamW", "lr": 1e-2}}


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("flat", [False, True], ids=["per-tensor", "flat"])
def test_fp16_optimizer_resumes_with_its_masters_and_loss_scale(flat: bool, way: str, tmp_path: Path) -> None:
    """The fp32 masters, one per model parameter (a flat copy's are given per
    parameter to DCP, and its state sliced), and the loss scaler travel in the
    first group's record (the scale grew after the first step). Loaded in any
    order: torch's ``set_state_dict`` loads the model after the optimizer, and
    its writes of the rounded masters must not replace the fp32 masters."""
    try:
        optcore.resolve("optcore-fp16:FP16Optimizer").target
    except (optcore.OptimizerNotFoundError, optcore.PluginLoadError) as exc:
        pytest.skip(f"optcore-fp16 is not available here: {exc}")
    config = _fp16_config(flat=flat)
    straight = _fp16_model()
    straight_opt = optcore.build_optimizer(config, straight)
    _fp16_train(straight, straight_opt, range(5))
    model = _fp16_model()
    opt = optcore.build_optimizer(config, model)
    _fp16_train(model, opt, range(3))
    assert opt.loss_scale != 2.0**14  # the scaler's state is not its initial one
    _save(model, opt, str(tmp_path))
    resumed = _fp16_model(seed=7)
    resumed_opt = optcore.build_optimizer(config, resumed)
    _load(resumed, resumed_opt, str(tmp_path), way=way)
    assert (resumed_opt.loss_scale, resumed_opt.skipped_steps) == (opt.loss_scale, opt.skipped_steps)
    _fp16_train(resumed, resumed_opt, range(3, 4))  # the first step takes the model's edits, if any
    _fp16_train(model, opt, range(3, 4))
    masters = [t for m in resumed_opt._masters for t in m.tensors]
    assert all(torch.equal(a, b) for a, b in zip(masters, (t for m in opt._masters for t in m.tensors)))
    _fp16_train(resumed, resumed_opt, range(4, 5))
    _assert_equal(_params(resumed), _params(straight), "FP16Optimizer resumed through DCP")


def test_a_layout_dcp_cannot_file_per_parameter_is_refused() -> None:
    """An optimizer whose state dict numbers other tensors than its param groups
    (here: a wrapper that hides a flat copy) would be filed under wrong names."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    class OneEntry(torch.optim.SGD):
        def state_dict(self):
            sd = super().state_dict()
            sd["param_groups"][0]["params"] = sd["param_groups"][0]["params"][:1]
            return sd

    opt = optcore.plugin.adapt(OneEntry)
    model = _model()
    built = opt(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(optcore.ConfigError, match="layout of its own"):
        get_optimizer_state_dict(model, built)


def _ddp_save_on_ranks(rank: int, world: int, names: list[str], root: str) -> None:
    """2 DDP ranks (whole tensors, replicated state) train 3 steps on half batches and save."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    for name in names:
        model = _model()
        ddp = DDP(model)
        opt = _build(name, model)
        _train(name, ddp, opt, range(3), rank=rank)
        _save(model, opt, str(Path(root, name)))


@pytest.mark.distributed
def test_dcp_resumes_ddp_from_two_ranks_in_one_process(tmp_path: Path) -> None:
    """Adafactor's factored state (and relative step count) from 2 DDP ranks
    resumes one process as if it had run all along."""
    names = [n for n in ("Adafactor", "AdamW") if _available(n)]
    run_ranks(_ddp_save_on_ranks, 2, names, str(tmp_path), timeout=240)
    for name in names:
        straight = _model()
        _train(name, straight, _build(name, straight), range(5))
        model = _model(seed=7)
        opt = _build(name, model)
        _load(model, opt, str(tmp_path / name))
        _train(name, model, opt, range(3, 5))
        _assert_equal(_params(model), _params(straight), f"{name}: DDP on 2 ranks -> 1 process", atol=1e-6)


def test_only_dcp_itself_is_taken_for_dcp_asking_for_a_state_dict():
    """torch wraps DCP's getter in torch.no_grad(): any other no_grad-decorated
    function (a user's save routine) must not be taken for it."""
    import torch.distributed.checkpoint.state_dict  # noqa: F401 - the module the checks look for

    from optcore.placement import in_dcp_get, in_dcp_init

    @torch.no_grad()
    def a_users_function() -> tuple[bool, bool]:
        return in_dcp_get(), in_dcp_init()

    assert (in_dcp_get(), in_dcp_init()) == (False, False)
    assert a_users_function() == (False, False)
