"""optcore.integrations.deepspeed with the real DeepSpeed on its CPU accelerator (gloo).

Every DeepSpeed run (ZeRO stages 0, 1 and 2 on 1 and 2 spawned ranks) is compared
with one plain-torch process on the full batch, never with another sharded run.
The ranks start once per world size and run every case in turn, so the file stays
well under a minute.
"""

from __future__ import annotations

import os

import pytest
import torch

import optcore

from _dist_util import run_ranks

pytestmark = pytest.mark.distributed

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed would look for CUDA first
deepspeed = pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install 'optcore[deepspeed]')")

from optcore.integrations import deepspeed as ds  # after the skip: it runs DeepSpeed

STEPS, BATCH = 3, 16
CLIP = 0.5  # DeepSpeed clips at its "gradient_clipping" (1.0 unless set), by the norm over all ranks

#: name -> (optimizer section of the DeepSpeed JSON, in both spellings; the stages it runs at)
CASES = {
    "AdamW": ({"type": "optcore", "params": {"type": "AdamW", "lr": 1e-2, "weight_decay": 0.1}}, (0, 1, 2)),
    "SGD": ({"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-2}}, (0, 1, 2)),
    "Lion": ({"type": "optcore-lion:Lion", "params": {"lr": 1e-3, "weight_decay": 0.1}}, (0, 1, 2)),
    # not elementwise: right at stage 0 (whole tensors), refused at stages 1-2 (test below)
    "Adafactor": ({"type": "optcore", "params": {"type": "optcore-adafactor:Adafactor"}}, (0,)),
    # optcore-fp16's wrapper over a bf16 model: stage 0 without DeepSpeed's own bf16 section
    "AdamW-bf16": ({"type": "optcore", "params": {"type": "AdamW", "lr": 1e-2, "precision": "bf16"}}, (0,)),
}


def _dtype(name: str) -> torch.dtype:
    return torch.bfloat16 if name.endswith("-bf16") else torch.float32


def _clip(name: str) -> float:
    # DeepSpeed clips a bf16 model's gradients in an order of its own (one bf16 ulp apart from
    # torch's clip_grad_norm_); the wrapper case runs unclipped
    return 0.0 if name.endswith("-bf16") else CLIP


def _model(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3)).to(dtype)


def _batches(dtype: torch.dtype = torch.float32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(BATCH, 6, generator=g).to(dtype), torch.randn(BATCH, 3, generator=g).to(dtype))
        for _ in range(STEPS)
    ]


def _ds_config(section: dict, stage: int, world: int, clip: float = CLIP) -> dict:
    return {
        "train_micro_batch_size_per_gpu": BATCH // world,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": clip,
        "zero_optimization": {"stage": stage},
        "optimizer": section,
    }


def _skip_shm_kernel() -> None:
    # DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce for inference on
    # first use (minutes on a busy CI machine); training uses gloo's collectives.
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def _deepspeed_runs(rank: int, world: int) -> dict:
    """Every (case, stage) on this rank: its final parameters and what DeepSpeed stepped."""
    import deepspeed

    from optcore.integrations import deepspeed as ds_integration

    _skip_shm_kernel()
    # what DeepSpeed's launcher (or torchrun) would set on each rank
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    results = {}
    for name, (section, stages) in CASES.items():
        for stage in stages:
            model = _model(_dtype(name))
            engine, optimizer, _, _ = ds_integration.initialize(model, _ds_config(section, stage, world, _clip(name)))
            n = BATCH // world
            for x, y in _batches(_dtype(name)):
                loss = torch.nn.functional.mse_loss(engine(x[rank * n : (rank + 1) * n]), y[rank * n : (rank + 1) * n])
                engine.backward(loss)
                engine.step()
            basic = engine.basic_optimizer
            results[name, stage] = {
                "params": [p.detach().clone() for p in model.parameters()],
                "basic": type(basic).__module__ + "." + type(basic).__name__,
                "param_shapes": [[tuple(p.shape) for p in g["params"]] for g in basic.param_groups],
                "weight_decay": [g["weight_decay"] for g in basic.param_groups],
                "unwrap": type(optcore.unwrap(optimizer)).__name__,
            }
            engine.destroy()
    try:  # the same JSON without optcore in between
        deepspeed.initialize(model=_model(), config=_ds_config(CASES["Lion"][0], 1, world))
    except AssertionError as error:
        results["plain deepspeed"] = str(error)
    return results


_RUNS: dict[int, list[dict]] = {}


def _runs(world: int) -> list[dict]:
    if world not in _RUNS:
        _RUNS[world] = run_ranks(_deepspeed_runs, world, timeout=300)
    return _RUNS[world]


def _plain_torch(name: str) -> tuple[list[torch.Tensor], torch.optim.Optimizer]:
    """One process, the full batch, the optimizer optcore builds, no DeepSpeed."""
    section = CASES[name][0]
    config = section["params"] if section["type"] == "optcore" else {"type": section["type"], **section["params"]}
    model = _model(_dtype(name))
    opt = optcore.build_optimizer(config, model)
    for x, y in _batches(_dtype(name)):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if _clip(name):
            torch.nn.utils.clip_grad_norm_(model.parameters(), _clip(name))
        opt.step()
    return [p.detach() for p in model.parameters()], opt


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize(("name", "stage"), [(name, stage) for name, (_, stages) in CASES.items() for stage in stages])
def test_deepspeed_steps_as_one_plain_torch_process(name, stage, world):
    expected, reference = _plain_torch(name)
    # fp32: summation order only; bf16 parameters: torch's bf16 tolerance (a rank's half batch
    # and gloo's bf16 all-reduce round differently from the full batch)
    tol = {"rtol": 1e-5, "atol": 1e-6} if _dtype(name) == torch.float32 else {}
    for rank, results in enumerate(_runs(world)):
        got = results[name, stage]
        # optcore's groups reach DeepSpeed: biases and the norm weight undecayed
        assert got["weight_decay"] == [g["weight_decay"] for g in reference.param_groups]
        assert got["basic"] == type(reference).__module__ + "." + type(reference).__name__
        assert got["unwrap"] == type(reference).__name__
        if stage:  # ZeRO: one flat 1-D partition per group, the reason for the refusals below
            assert all(len(shapes) == 1 and len(shapes[0]) == 1 for shapes in got["param_shapes"])
        for i, (a, b) in enumerate(zip(got["params"], expected)):
            torch.testing.assert_close(a, b, **tol, msg=lambda m, rank=rank, i=i: f"rank {rank} parameter {i}: {m}")


# ------------------------------------------------------------------ refused before any collective
@pytest.fixture
def no_deepspeed_initialize(monkeypatch):
    """deepspeed.initialize fails the test if reached; the process has no process group."""
    calls = []
    monkeypatch.setattr(deepspeed, "initialize", lambda **kw: calls.append(kw) or pytest.fail("initialize ran"))
    assert not torch.distributed.is_initialized()
    return calls


def _has(qualified: str) -> bool:
    return any(s.qualified == qualified for s in optcore.list_optimizers(all=True))


@pytest.mark.filterwarnings("ignore:Optimizer name 'Adafactor' resolved to torch")  # as DeepSpeed would build
@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize(
    ("section", "label", "why"),
    [
        (
            {"type": "optcore", "params": {"type": "optcore-adafactor:Adafactor"}},
            "optcore-adafactor:Adafactor",
            "factored",
        ),
        ({"type": "Adafactor", "params": {"lr": 1e-2}}, "torch:Adafactor", "factored"),
        (
            {"type": "optcore-adascale:AdaScaleSGD", "params": {"lr": 0.1, "num_gradients_to_accumulate": 2}},
            "optcore-adascale:AdaScaleSGD",
            "all of the gradients",
        ),
        ({"type": "optcore", "params": {"type": "torch:Muon", "lr": 0.02}}, "torch:Muon", "whole tensor"),
    ],
)
def test_non_elementwise_optimizers_are_refused_at_zero_stages(section, label, why, stage, no_deepspeed_initialize):
    if label.startswith("optcore-") and not _has(label):
        pytest.skip(f"{label.split(':')[0]} is not installed")
    model = _model()
    if label == "torch:Muon":  # Muon takes 2-D parameters only
        model = torch.nn.Sequential(torch.nn.Linear(6, 8, bias=False), torch.nn.Linear(8, 3, bias=False))
    with pytest.raises(optcore.ConfigError) as info:
        ds.initialize(
            model, {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": stage}, "optimizer": section}
        )
    message = str(info.value)
    assert label in message and f"ZeRO stage {stage}" in message and why in message
    assert "stage 0" in message and "FSDP2" in message and "elementwise optimizer" in message
    assert no_deepspeed_initialize == []


def test_an_optimizer_of_unknown_sharding_is_refused(no_deepspeed_initialize):
    class Custom(torch.optim.SGD):  # a user's class: optcore cannot know how it couples elements
        pass

    model = _model()
    with pytest.raises(
        optcore.ConfigError, match=r"Custom cannot run under DeepSpeed ZeRO stage 2.*not declared elementwise"
    ):
        ds.initialize(model, {"zero_optimization": {"stage": 2}}, optimizer=Custom(model.parameters(), lr=0.1))


@pytest.mark.parametrize(
    ("ds_config", "where"),
    [
        ({"zero_optimization": {"stage": 1}}, "ZeRO stage 1"),
        ({"zero_optimization": {"stage": 2}}, "ZeRO stage 2"),
        ({"bf16": {"enabled": True}}, 'the JSON\'s "bf16" section'),
        ({"fp16": {"enabled": True}}, 'the JSON\'s "fp16" section'),
    ],
)
def test_wrappers_are_refused_at_zero_stages_and_beside_deepspeeds_mixed_precision(
    ds_config, where, no_deepspeed_initialize
):
    if not _has("optcore-fp16:FP16Optimizer"):
        pytest.skip("optcore-fp16 is not installed")
    with pytest.raises(optcore.ConfigError) as info:
        ds.initialize(_model(torch.bfloat16), ds_config, optimizer={"type": "SGD", "lr": 0.1, "precision": "bf16"})
    message = str(info.value)
    assert "FP16Optimizer wraps another optimizer" in message and f"under {where}" in message
    assert '"bf16": {"enabled": true}' in message and "stage 0" in message


def test_a_json_optimizer_and_a_client_optimizer_together_are_refused(no_deepspeed_initialize):
    model = _model()
    section = {"type": "AdamW", "params": {"lr": 1e-3}}
    for optimizer in ({"type": "SGD", "lr": 0.1}, torch.optim.SGD(model.parameters(), lr=0.1)):
        with pytest.raises(optcore.ConfigError, match=r"optimizer section \('AdamW'\) and optimizer= was given"):
            ds.initialize(model, {"optimizer": section}, optimizer=optimizer)


def test_no_optimizer_anywhere_is_refused(no_deepspeed_initialize):
    with pytest.raises(optcore.ConfigError, match="No optimizer"):
        ds.initialize(_model(), {"zero_optimization": {"stage": 1}})


@pytest.mark.parametrize(
    "section",
    [
        {"type": "optcore"},
        {"type": "optcore", "params": {}},
        {"type": "Lion", "params": {"lr": 1}, "extra": 1},
        {"type": "optcore-lion:Lion", "params": {"type": "SGD"}},
        {"params": {}},
    ],
)
def test_malformed_optimizer_sections_are_refused(section, no_deepspeed_initialize):
    with pytest.raises(optcore.ConfigError):
        ds.initialize(_model(), {"optimizer": section})


# ------------------------------------------------------------------ what reaches deepspeed.initialize
@pytest.fixture
def captured(monkeypatch):
    calls = []

    def fake_initialize(**kwargs):
        calls.append(kwargs)
        return (None, kwargs.get("optimizer"), None, None)

    monkeypatch.setattr(deepspeed, "initialize", fake_initialize)
    return calls


@pytest.mark.parametrize("where", ["section", "beside", "file"])
def test_the_optcore_optimizer_is_the_client_optimizer_and_the_section_is_removed(where, captured, tmp_path):
    config = {"type": "AdamW", "lr": 3e-4, "weight_decay": 0.1}
    ds_config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}
    kwargs = {}
    if where == "beside":
        kwargs["optimizer"] = config
    else:
        ds_config["optimizer"] = {"type": "optcore", "params": config}
    original = {**ds_config}
    if where == "file":
        path = tmp_path / "ds.json"
        path.write_text(__import__("json").dumps(ds_config))
        ds_config = path
    model = _model()
    ds.initialize(model, ds_config, **kwargs)
    (call,) = captured
    assert "optimizer" not in call["config"]  # nothing for DeepSpeed to ignore silently
    assert call["config"]["zero_allow_untested_optimizer"] is True
    assert call["model"] is model
    reference = optcore.build_optimizer(config, _model())
    assert type(call["optimizer"]) is type(reference)
    assert [g["weight_decay"] for g in call["optimizer"].param_groups] == [
        g["weight_decay"] for g in reference.param_groups
    ]
    if where == "section":
        assert ds_config == original  # the caller's mapping is left as it was


def test_a_json_that_sets_zero_allow_untested_optimizer_keeps_it(captured):
    ds.initialize(
        _model(), {"zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": False}, optimizer="SGD"
    )
    assert captured[0]["config"]["zero_allow_untested_optimizer"] is False


def test_deepspeeds_own_optimizers_stay_deepspeeds(captured):
    section = {"type": "Adam", "params": {"lr": 1e-3}}
    model = _model()
    ds.initialize(model, {"optimizer": section, "zero_optimization": {"stage": 2}})
    (call,) = captured
    assert call["config"]["optimizer"] == section and call.get("optimizer") is None


def test_plain_deepspeed_cannot_build_what_the_json_names():
    """What the integration is for: the JSON that trains above fails in deepspeed.initialize alone."""
    assert "optcore-lion:Lion is not a supported DeepSpeed Optimizer" in _runs(1)[0]["plain deepspeed"]


@pytest.mark.parametrize(
    ("zero", "stage"), [(None, 0), ({"stage": 2}, 2), ({}, 0), (True, 1), (False, 0), ({"stage": "3"}, 3)]
)
def test_zero_stage(zero, stage):
    config = {} if zero is None else {"zero_optimization": zero}
    assert ds.zero_stage(config) == stage


def _raw_client_worker(rank: int, world: int, stage: int) -> dict:
    """An optcore Adafactor handed to deepspeed.initialize directly, past optcore's integration."""
    import deepspeed

    _skip_shm_kernel()
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    model = _model()
    client = optcore.build_optimizer({"type": "optcore-adafactor:Adafactor"}, model)
    config = {**_ds_config({}, stage, world), "zero_allow_untested_optimizer": True}
    del config["optimizer"]
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=client, config=config)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = _batches()[0]
    engine.backward(torch.nn.functional.mse_loss(engine(x), y))
    try:
        engine.step()
    except optcore.ConfigError as exc:
        error = str(exc)
    else:
        error = None
    return {"error": error, "moved": any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))}


def test_a_factored_client_optimizer_refuses_deepspeeds_flat_partitions_at_its_first_step():
    if not _has("optcore-adafactor:Adafactor"):
        pytest.skip("optcore-adafactor is not installed")
    (info,) = run_ranks(_raw_client_worker, 1, 1, timeout=300)
    assert info["error"] is not None, "Adafactor stepped DeepSpeed's flat partition as if it were the tensors"
    assert "flat 1-D partition" in info["error"] and "sharding='factored'" in info["error"]
    assert "optcore.integrations.deepspeed" in info["error"]
    assert not info["moved"]


# ------------------------------------------------------------------ deepspeed.initialize(optimizer=callable)
CALLABLE_CONFIG = {"type": "AdamW", "lr": 1e-2, "weight_decay": 0.1}

#: label -> (the optcore config the callable builds, the stages it runs at)
CALLABLES = {
    "no-decay default": (CALLABLE_CONFIG, (0, 1, 2)),  # the names would make a no-decay group: refused
    "no_decay false": ({**CALLABLE_CONFIG, "no_decay": False}, (0, 1, 2)),  # every parameter decayed on purpose
    "no weight decay": ({"type": "SGD", "lr": 0.05, "momentum": 0.9}, (0,)),  # names change nothing: built
    "regex groups": ({"type": "SGD", "lr": 0.05, "param_groups": [{"params": r"^2\.", "lr_scale": 0.5}]}, (0,)),
}


def _train_engine(engine, rank: int, world: int) -> None:
    n = BATCH // world
    for x, y in _batches():
        engine.backward(torch.nn.functional.mse_loss(engine(x[rank * n : (rank + 1) * n]), y[rank * n : (rank + 1) * n]))
        engine.step()


def _callable_runs(rank: int, world: int) -> dict:
    """``deepspeed.initialize`` called directly, with ``model_parameters`` and an
    optimizer callable that builds with optcore (DeepSpeed hands it bare
    tensors), and with an optimizer optcore built over the model."""
    import deepspeed

    _skip_shm_kernel()
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))

    def ds_config(stage: int) -> dict:
        config = {**_ds_config({}, stage, world), "zero_allow_untested_optimizer": True}
        del config["optimizer"]
        return config

    results: dict = {}
    for label, (config, stages) in CALLABLES.items():
        for stage in stages:
            model = _model()
            try:
                engine, _, _, _ = deepspeed.initialize(
                    model=model, model_parameters=model.parameters(), config=ds_config(stage),
                    optimizer=lambda params, config=config: optcore.build_optimizer(dict(config), params),
                )
            except optcore.ConfigError as exc:
                results[label, stage] = str(exc)
                continue
            _train_engine(engine, rank, world)
            results[label, stage] = [p.detach().clone() for p in model.parameters()]
            engine.destroy()
    for stage in (0, 1, 2):  # the optimizer itself, built over the model
        model = _model()
        built = optcore.build_optimizer(dict(CALLABLE_CONFIG), model)
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=built, config=ds_config(stage))
        _train_engine(engine, rank, world)
        results["built over the model", stage] = [p.detach().clone() for p in model.parameters()]
        engine.destroy()
    return results


def _one_process(config: dict) -> list[torch.Tensor]:
    model = _model()
    opt = optcore.build_optimizer(dict(config), model)
    for x, y in _batches():
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
    return [p.detach() for p in model.parameters()]


def test_an_optimizer_callable_whose_groups_need_names_is_refused_and_the_others_step_as_one_process():
    """DeepSpeed calls ``optimizer=callable`` with bare tensors: where the model's
    names would give other groups (the no-decay group of biases and LayerNorm,
    regex ``param_groups``) the build is refused by name, since it would decay
    every parameter and differ from ``build_optimizer(config, model)`` without a
    word; where they change nothing, and for the optimizer built over the model,
    every ZeRO stage steps as one process on the full batch."""
    for rank, results in enumerate(run_ranks(_callable_runs, 2, timeout=300)):
        for stage in (0, 1, 2):
            error = results["no-decay default", stage]
            assert isinstance(error, str), f"stage {stage}: the callable decayed every parameter without an error"
            assert "bare tensors" in error and "'1.weight'" in error and "4 of the 6 parameters" in error
            assert "weight_decay=0.0 over the model and 0.1 bare" in error
            assert "optimizer=optcore.build_optimizer(config, model)" in error
            assert "optcore.integrations.deepspeed.initialize" in error and '"no_decay": false' in error
        regex = results["regex groups", 0]
        assert isinstance(regex, str) and "bare tensors" in regex and "select parameters by name" in regex
        expected = {
            "no_decay false": _one_process(CALLABLES["no_decay false"][0]),
            "no weight decay": _one_process(CALLABLES["no weight decay"][0]),
            "built over the model": _one_process(CALLABLE_CONFIG),
        }
        for (label, stage), got in results.items():
            if label in expected:
                for i, (a, b) in enumerate(zip(got, expected[label])):
                    where = f"rank {rank} {label} stage {stage} #{i}"
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m, w=where: f"{w}: {m}")
        # what the refusal prevents: the same run with every parameter decayed is not build_optimizer(config, model)
        assert (expected["no_decay false"][2] - expected["built over the model"][2]).abs().max() > 1e-3
