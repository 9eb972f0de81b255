"""Optimizers whose statistics cross shards, under FSDP2, against one process.

Adafactor's row and column statistics, mean(R), RMS(X) and the clipped
update's RMS are over whole tensors; under ``fully_shard`` each rank holds a
slice of every parameter's rows (uneven slices, and empty ones for a size-1
dim 0). AdaScaleSGD's gain is a statistic over every worker's whole gradient.
Both reduce what they need across the mesh; here 2 gloo ranks, each on half
of the batch, are compared with one process on the full batch (never one
sharded run with another). One spawned group runs every case of the module.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

import optcore

from _dist_util import run_ranks

pytestmark = pytest.mark.distributed

HALF = 4
STEPS = 4

ADAFACTOR: dict[str, dict[str, Any]] = {
    "relative-step-decay": {"type": "optcore-adafactor:Adafactor", "weight_decay": 0.01},
    "warmup-beta1": {"type": "optcore-adafactor:Adafactor", "warmup_init": True, "beta1": 0.9},
    "manual-lr": {"type": "optcore-adafactor:Adafactor", "lr": 1e-2, "relative_step": False,
                  "scale_parameter": False, "clip_threshold": 0.5},
    "manual-lr-scaled": {"type": "optcore-adafactor:Adafactor", "lr": 5e-2, "relative_step": False,
                         "weight_decay": 0.1},
}
DTYPES = {"float32": (torch.float32, 1e-6), "float64": (torch.float64, 1e-12)}
#: bf16 parameters, stepped with fp32 math and fp32 state (memory_efficient)
BF16 = {"type": "optcore-adafactor:Adafactor", "weight_decay": 0.01, "beta1": 0.9}
ADASCALE = {"type": "optcore-adascale:AdaScaleSGD", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}


class Net(nn.Module):
    """Dim 0 sizes 5 (split 3/2), 1 (one rank empty) and 3 (a 3-D parameter,
    split 2/1); factored matrices and unfactored vectors."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 5)
        self.norm = nn.LayerNorm(5)
        self.cube = nn.Parameter(torch.randn(3, 2, 5) * 0.3)
        self.b = nn.Linear(5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.norm(self.a(x)))
        z = torch.einsum("bi,kji->bkj", h, self.cube).sum((1, 2)).unsqueeze(-1)
        return self.b(h) + 0.1 * z


def _model(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return Net().to(dtype)


def _batch(step: int, dtype: torch.dtype, rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(2 * HALF, 6, generator=g), torch.randn(2 * HALF, 1, generator=g)
    return x[rows].to(dtype), y[rows].to(dtype)


def _build(config: dict[str, Any], model: nn.Module) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optcore.build_optimizer(config, model)


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in model.parameters()]


def _one_process(config: dict[str, Any], dtype: torch.dtype) -> list[torch.Tensor]:
    model = _model(dtype)
    opt = _build(config, model)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = _batch(step, dtype)
        nn.functional.mse_loss(model(x).float(), y.float()).backward()
        opt.step()
    return _params(model)


class _Count:
    """Counts the collectives ``torch.distributed`` is asked for while active."""

    NAMES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast",
             "all_to_all_single", "reduce")

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __enter__(self) -> _Count:
        import torch.distributed as dist

        self.saved = {name: getattr(dist, name) for name in self.NAMES}
        for name, fn in self.saved.items():
            setattr(dist, name, self._counting(name, fn))
        return self

    def _counting(self, name: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return fn(*args, **kwargs)

        return call

    def __exit__(self, *exc: Any) -> None:
        import torch.distributed as dist

        for name, fn in self.saved.items():
            setattr(dist, name, fn)


def _fsdp(model: nn.Module, world: int) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    fully_shard(model.a, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _adascale_one_process(dtype: torch.dtype, samples: int = 2) -> dict[str, Any]:
    """The DDP run's reference: one process, the batch's ``samples`` parts
    (rank 0's first) as accumulated gradient samples (S = 2: 2 workers with
    one backward each; S = 4: 2 workers accumulating 2 each)."""
    model = _model(dtype)
    opt = _build({**ADASCALE, "num_gradients_to_accumulate": samples}, model)
    rows = 2 * HALF // samples
    gains = []
    for step in range(STEPS):
        opt.zero_grad()
        for part in range(samples):
            x, y = _batch(step, dtype, slice(part * rows, (part + 1) * rows))
            (nn.functional.mse_loss(model(x), y) / samples).backward()
        opt.step()
        gains.append(opt.gain())
    return {"params": _params(model), "gains": gains, "progress": opt.progress}


def _adascale_on_ranks(rank: int, world: int, dtype: torch.dtype, accumulate: int = 1) -> dict[str, Any]:
    """Each rank's half of the batch, in ``accumulate`` backward passes (the
    first ones without FSDP2's gradient reduction)."""
    model = _fsdp(_model(dtype), world)
    opt = _build({**ADASCALE, "num_gradients_to_accumulate": accumulate}, model)
    rows = HALF // accumulate
    gains, counts = [], []
    for step in range(STEPS):
        with _Count() as count:
            opt.zero_grad()
            for part in range(accumulate):
                model.set_requires_gradient_sync(part == accumulate - 1)
                start = rank * HALF + part * rows
                x, y = _batch(step, dtype, slice(start, start + rows))
                (nn.functional.mse_loss(model(x), y) / accumulate).backward()
            opt.step()
        gains.append(opt.gain())
        counts.append([c for c in count.calls if c in ("all_reduce", "all_gather", "broadcast")])  # not FSDP2's
    return {"params": _params(model), "gains": gains, "progress": opt.progress, "counts": counts}


class ThirdPartyFactored(torch.optim.SGD):
    """A third-party optimizer that says its statistics cross elements of a
    tensor and does not say it reduces them over shards."""

    sharding = "factored"


def _refusals(world: int) -> dict[str, Any]:
    out = {}
    for config in ({"type": "torch:Adafactor"}, {"type": f"{__name__}:ThirdPartyFactored", "lr": 0.1}):
        model = _fsdp(_model(torch.float32), world)
        with _Count() as count:
            try:
                _build(config, model)
            except optcore.ConfigError as exc:
                out[config["type"]] = (str(exc), count.calls)
            else:
                out[config["type"]] = (None, count.calls)
    return out


def _on_ranks(rank: int, world: int, adafactor: dict[str, dict[str, Any]], dtypes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"refusals": _refusals(world)}
    for dtype_name in dtypes:
        out[f"AdaScaleSGD/{dtype_name}"] = _adascale_on_ranks(rank, world, DTYPES[dtype_name][0])
    out["AdaScaleSGD/accumulate-2/float64"] = _adascale_on_ranks(rank, world, torch.float64, accumulate=2)
    for name, config in adafactor.items():
        for dtype_name in ["bfloat16"] if name == "bf16" else dtypes:
            dtype = getattr(torch, dtype_name)
            model = _fsdp(_model(dtype), world)
            local = {n: tuple(p.to_local().shape) for n, p in model.named_parameters()}
            opt = _build(config, model)
            counts = []
            for step in range(STEPS):
                opt.zero_grad()
                x, y = _batch(step, dtype, slice(rank * HALF, (rank + 1) * HALF))
                nn.functional.mse_loss(model(x).float(), y.float()).backward()
                with _Count() as count:
                    opt.step()
                counts.append(list(count.calls))
            state = {k: (type(v).__name__, v.dtype) for k, v in opt.state[model.a.weight].items() if k != "step"}
            out[f"Adafactor/{name}/{dtype_name}"] = {"params": _params(model), "counts": counts, "local": local,
                                                     "state": state}
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    for config in [*ADAFACTOR.values(), ADASCALE]:
        try:
            optcore.resolve(config["type"]).target
        except (optcore.OptimizerNotFoundError, optcore.PluginLoadError) as exc:
            pytest.skip(f"optcore-adafactor is not available here: {exc}")
    return run_ranks(_on_ranks, 2, {**ADAFACTOR, "bf16": BF16}, list(DTYPES), timeout=240)


def test_the_model_has_uneven_and_empty_shards(ranks: list[dict[str, Any]]) -> None:
    local = [r[f"Adafactor/{next(iter(ADAFACTOR))}/float32"]["local"] for r in ranks]
    assert (local[0]["a.weight"], local[1]["a.weight"]) == ((3, 6), (2, 6))
    assert (local[0]["b.weight"], local[1]["b.weight"]) == ((1, 5), (0, 5))
    assert (local[0]["b.bias"], local[1]["b.bias"]) == ((1,), (0,))
    assert (local[0]["cube"], local[1]["cube"]) == ((2, 2, 5), (1, 2, 5))


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("name", list(ADAFACTOR))
def test_adafactor_under_fsdp2_equals_one_process(ranks: list[dict[str, Any]], name: str, dtype_name: str) -> None:
    dtype, tol = DTYPES[dtype_name]
    want = _one_process(ADAFACTOR[name], dtype)
    for rank, result in enumerate(ranks):
        got = result[f"Adafactor/{name}/{dtype_name}"]["params"]
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert a.dtype == dtype
            err = (a - b).abs().max().item()
            assert err <= tol * max(1.0, b.abs().max().item()), f"rank {rank}, parameter {i}: off by {err:.3g}"
        moved = max((a - b).abs().max().item() for a, b in zip(got, _params(_model(dtype))))
        assert moved > (1e-6 if ADAFACTOR[name].get("warmup_init") else 1e-3)  # the steps did something


def test_adafactor_reduces_with_two_all_reduces_per_step(ranks: list[dict[str, Any]]) -> None:
    for result in ranks:
        for key, info in result.items():
            if not key.startswith("Adafactor/"):
                continue
            for calls in info["counts"]:
                assert calls == ["all_reduce", "all_reduce"], (key, calls)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_adascale_under_fsdp2_has_the_ddp_runs_gain_and_steps(ranks: list[dict[str, Any]], dtype_name: str) -> None:
    _check_adascale(ranks, f"AdaScaleSGD/{dtype_name}", dtype_name, samples=2)


def test_adascale_under_fsdp2_with_accumulation(ranks: list[dict[str, Any]]) -> None:
    """2 ranks x 2 backward passes (``set_requires_gradient_sync(False)`` on
    the first): 4 gradient samples per step."""
    _check_adascale(ranks, "AdaScaleSGD/accumulate-2/float64", "float64", samples=4)


def _check_adascale(ranks: list[dict[str, Any]], key: str, dtype_name: str, samples: int) -> None:
    dtype, tol = DTYPES[dtype_name]
    want = _adascale_one_process(dtype, samples)
    assert max(want["gains"]) > 1.05  # the gain is measured, not its initial 1
    for rank, result in enumerate(ranks):
        got = result[key]
        assert got["gains"] == pytest.approx(want["gains"], rel=tol, abs=0)
        assert got["progress"] == pytest.approx(want["progress"], rel=tol, abs=0)
        for i, (a, b) in enumerate(zip(got["params"], want["params"], strict=True)):
            err = (a - b).abs().max().item()
            assert err <= tol * max(1.0, b.abs().max().item()), f"rank {rank}, parameter {i}: off by {err:.3g}"


def test_adascale_all_reduces_once_per_step(ranks: list[dict[str, Any]]) -> None:
    for result in ranks:
        for key, info in result.items():
            if key.startswith("AdaScaleSGD/"):
                assert info["counts"] == [["all_reduce"]] * STEPS, key


def test_statistics_across_shards_not_reduced_are_refused_before_any_collective(ranks: list[dict[str, Any]]) -> None:
    """torch's Adafactor and a third-party class declaring ``sharding =
    "factored"`` do not declare that they reduce their statistics."""
    for result in ranks:
        for name, (error, calls) in result["refusals"].items():
            assert error is not None, f"{name} was built over DTensor shards"
            assert "sharding='factored'" in error and "DTensor" in error and "optcore-adafactor" in error, error
            assert calls == [], f"{name}: collectives before the refusal: {calls}"


def test_adafactor_under_fsdp2_steps_bf16_with_fp32_state(ranks: list[dict[str, Any]]) -> None:
    """bf16 parameters: fp32 math and fp32 state (DTensors placed like the
    parameter), each parameter written back once; one process within the
    rounding of bf16 (one ulp: at most 2^-7 of the value)."""
    want = _one_process(BF16, torch.bfloat16)
    for rank, result in enumerate(ranks):
        info = result["Adafactor/bf16/bfloat16"]
        assert info["state"] == {"exp_avg_sq_row": ("DTensor", torch.float32), "exp_avg_sq_col": ("DTensor", torch.float32),
                                 "exp_avg": ("DTensor", torch.float32), "RMS": ("Tensor", torch.float32)}
        for i, (a, b) in enumerate(zip(info["params"], want, strict=True)):
            assert a.dtype == torch.bfloat16
            assert torch.all((a.float() - b.float()).abs() <= 2**-7 * b.float().abs() + 1e-6), f"rank {rank}, parameter {i}"
        assert any(not torch.equal(a, b) for a, b in zip(info["params"], _params(_model(torch.bfloat16))))
