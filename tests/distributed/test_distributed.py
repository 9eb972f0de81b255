"""The optimizer contract across processes, on real gloo groups over loopback.

Each spawned group costs seconds of torch import per rank, so one group runs
every optimizer's check and the tests read its results. Optimizers from plugins
that are not installed are skipped with the command that installs them.
References are single-process runs with the full batch (for AdaScaleSGD, which
needs two gradient samples per step, the same batch as two accumulated halves).
"""

from __future__ import annotations

import copy
import os
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import optcore
from optcore.plugin import adapt, validate_hparams
from _dist_util import RanksFailed, run_ranks

pytestmark = pytest.mark.distributed

CONFIGS: dict[str, dict[str, Any]] = {
    "AdamW": {"type": "AdamW", "lr": 1e-2, "weight_decay": 0.01},
    "SGD": {"type": "SGD", "lr": 0.1, "momentum": 0.9},
    "Lion": {"type": "optcore-lion:Lion", "lr": 1e-3, "weight_decay": 0.1},
    "Adafactor": {"type": "optcore-adafactor:Adafactor"},
    "AdaScaleSGD": {"type": "AdaScaleSGD", "lr": 0.1, "momentum": 0.9},
}
PLUGIN_OF = {"Lion": "optcore-lion", "Adafactor": "optcore-adafactor", "AdaScaleSGD": "optcore-adascale"}
STEPS, HALF = 3, 4  # each rank trains on HALF rows of a 2 * HALF batch


def _missing(name: str) -> str | None:
    """Why ``name`` cannot be tested here, or None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optcore.resolve(CONFIGS[name]["type"])
    except optcore.OptimizerNotFoundError:
        dist_name = PLUGIN_OF[name]
        return f"{dist_name} is not installed (pip install ./plugins/{dist_name})"
    return None


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.LayerNorm(16), nn.Tanh(), nn.Linear(16, 3))


def _batch(step: int, rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(2 * HALF, 6, generator=g), torch.randn(2 * HALF, 3, generator=g)
    return x[rows], y[rows]


def _half(rank: int) -> slice:
    return slice(rank * HALF, (rank + 1) * HALF)


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.mse_loss(model(batch[0]), batch[1])


def _build(name: str, params: Any, **extra: Any) -> torch.optim.Optimizer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optcore.build_optimizer({**CONFIGS[name], **extra}, params)


def _train_single(name: str, model: nn.Module, opt: torch.optim.Optimizer, steps: range) -> None:
    """The full batch in one process (AdaScaleSGD: as two accumulated halves)."""
    for step in steps:
        opt.zero_grad()
        if name == "AdaScaleSGD":
            for rank in range(2):
                (_loss(model, _batch(step, _half(rank))) / 2).backward()
        else:
            _loss(model, _batch(step)).backward()
        opt.step()


def _train_ranks(model: nn.Module, opt: Any, rank: int, steps: range) -> None:
    """This rank's half of each batch; DDP / FSDP average the gradients."""
    for step in steps:
        opt.zero_grad()
        _loss(model, _batch(step, _half(rank))).backward()
        opt.step()


def _reference(name: str, steps: int = STEPS) -> list[torch.Tensor]:
    model = _model()
    extra = {"num_gradients_to_accumulate": 2} if name == "AdaScaleSGD" else {}
    _train_single(name, model, _build(name, model, **extra), range(steps))
    return [p.detach().clone() for p in model.parameters()]


def _assert_close(got: list[torch.Tensor], want: list[torch.Tensor], what: str, atol: float = 1e-5) -> None:
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.allclose(a, b, atol=atol, rtol=1e-4), f"{what}: parameter {i} differs by {(a - b).abs().max():.3g}"


def _each(names: list[str], check: Any, *args: Any) -> dict[str, str | Any]:
    """Run ``check(name, *args)`` for every name; a failure becomes its traceback
    so the other optimizers still report."""
    out: dict[str, Any] = {}
    for name in names:
        try:
            out[name] = check(name, *args)
        except Exception:  # noqa: BLE001 - reported per optimizer by the test
            out[name] = "FAILED\n" + traceback.format_exc()
    return out


def _result(results: dict[str, Any], name: str) -> Any:
    reason = _missing(name)
    if reason:
        pytest.skip(reason)
    value = results[name]
    if isinstance(value, str) and value.startswith("FAILED"):
        pytest.fail(f"{name}: {value}", pytrace=False)
    return value


# ------------------------------------------------------------ average_params
def _average_check(name: str, rank: int, world: int) -> None:
    model = _model(seed=rank)  # every rank starts elsewhere
    opt = _build(name, list(model.parameters()))
    _loss(model, _batch(rank)).backward()
    opt.step()

    def flat() -> torch.Tensor:
        tensors = []
        for p in model.parameters():
            tensors.append(p.detach().reshape(-1))
            tensors += [v.reshape(-1) for v in opt.state[p].values()
                        if torch.is_tensor(v) and v.is_floating_point() and v.shape == p.shape]
        return torch.cat(tensors)

    def gather(t: torch.Tensor) -> torch.Tensor:
        out = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(out, t)
        return torch.stack(out)

    before = gather(flat())
    opt.average_params()
    after = gather(flat())
    assert all(torch.equal(after[0], a) for a in after), "ranks differ after average_params()"
    assert torch.allclose(after[0], before.mean(0), atol=1e-6), "average_params() is not the mean over ranks"
    assert not torch.equal(before[0], before[1]), "test setup: ranks should differ before averaging"


def _average_worker(rank: int, world: int, names: list[str]) -> dict[str, Any]:
    return _each(names, _average_check, rank, world)


@pytest.mark.parametrize("world", [2, 3])
def test_average_params_leaves_every_rank_at_the_mean(world: int) -> None:
    names = [n for n in CONFIGS if not _missing(n)]
    results = run_ranks(_average_worker, world, names)
    failed = {n: r[n] for r in results for n in names if r[n] is not None}
    assert not failed, "\n".join(f"{n}: {msg}" for n, msg in failed.items())


def _out_of_step_worker(rank: int, world: int) -> str | None:
    model = _model()
    opt = _build("AdamW", list(model.parameters()))
    if rank == 0:  # rank 0 steps (and so holds moments), rank 1 does not
        _loss(model, _batch(0)).backward()
        opt.step()
    before = [p.detach().clone() for p in model.parameters()]
    try:
        opt.average_params()
    except optcore.ConfigError as exc:
        assert all(torch.equal(a, p) for a, p in zip(before, model.parameters())), "a refused average changed params"
        return str(exc)
    return None


def test_average_params_with_ranks_out_of_step_is_one_clear_error_on_every_rank() -> None:
    """Ranks whose state sizes differ get the same clear error on every rank, naming
    both, before a collective that would abort a rank (SIGABRT in gloo)."""
    errors = run_ranks(_out_of_step_worker, 2)
    assert errors[0] is not None, "average_params averaged ranks that hold different tensors"
    assert errors[0] == errors[1], f"ranks disagree on the error: {errors}"
    assert "rank 0" in errors[0] and "rank 1" in errors[0] and "same number of steps" in errors[0]


# ------------------------------------------------------------------------ DDP
def _ddp_check(name: str, rank: int) -> list[torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _model()
    ddp = DDP(model)
    _train_ranks(ddp, _build(name, model), rank, range(STEPS))
    return [p.detach().clone() for p in model.parameters()]


def _ddp_worker(rank: int, world: int, names: list[str]) -> dict[str, Any]:
    return _each(names, _ddp_check, rank)


@pytest.fixture(scope="module")
def ddp_results() -> list[dict[str, Any]]:
    return run_ranks(_ddp_worker, 2, [n for n in CONFIGS if not _missing(n)])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_ddp_on_two_ranks_matches_the_full_batch(name: str, ddp_results: list[dict[str, Any]]) -> None:
    per_rank = [_result(r, name) for r in ddp_results]
    want = _reference(name)
    for rank, got in enumerate(per_rank):
        _assert_close(got, want, f"{name} under DDP, rank {rank}")


# ----------------------------------------------------------------------- ZeRO
ZERO_NAMES = ["AdamW", "SGD", "Lion", "Adafactor"]  # ZeRO shards whole tensors: factored state stays whole


def _zero(name: str, model: nn.Module) -> Any:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    config = dict(CONFIGS[name])
    spec = optcore.resolve(config.pop("type"))
    kwargs = validate_hparams(spec.schema, config, spec.name)
    return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=adapt(spec.target), **kwargs)


def _zero_check(name: str, rank: int, ckpt_dir: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _model()
    ddp, opt = DDP(model), _zero(name, model)
    _train_ranks(ddp, opt, rank, range(STEPS))
    want_model = _model()
    want_opt = _build(name, list(want_model.parameters()))
    _train_single(name, want_model, want_opt, range(STEPS))
    _assert_close(list(model.parameters()), list(want_model.parameters()), "ZeRO vs one process")

    opt.consolidate_state_dict(to=0)
    path = Path(ckpt_dir, f"{name}.pt")
    if rank == 0:
        torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, path)
    dist.barrier()
    ckpt = torch.load(path, weights_only=True)

    # the consolidated state dict resumes a sharded run ...
    resumed = _model(seed=1)
    resumed.load_state_dict(ckpt["model"])
    resumed_ddp, resumed_opt = DDP(resumed), _zero(name, resumed)
    resumed_opt.load_state_dict(copy.deepcopy(ckpt["optim"]))  # ZeRO sets other ranks' entries to None in place
    _train_ranks(ddp, opt, rank, range(STEPS, STEPS + 2))
    _train_ranks(resumed_ddp, resumed_opt, rank, range(STEPS, STEPS + 2))
    _assert_close(list(resumed.parameters()), list(model.parameters()), "ZeRO resumed from its consolidated state", 0.0)
    # ... and an unsharded optcore optimizer (it is a plain torch state dict)
    plain = _model(seed=2)
    plain.load_state_dict(ckpt["model"])
    plain_opt = _build(name, list(plain.parameters()))
    plain_opt.load_state_dict(ckpt["optim"])
    _train_single(name, plain, plain_opt, range(STEPS, STEPS + 2))
    _assert_close(list(plain.parameters()), list(model.parameters()), "one process resumed from ZeRO's state")


def _zero_worker(rank: int, world: int, names: list[str], ckpt_dir: str) -> dict[str, Any]:
    return _each(names, _zero_check, rank, ckpt_dir)


@pytest.fixture(scope="module")
def zero_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    ckpt_dir = str(tmp_path_factory.mktemp("zero"))
    return run_ranks(_zero_worker, 2, [n for n in ZERO_NAMES if not _missing(n)], ckpt_dir)


@pytest.mark.parametrize("name", ZERO_NAMES)
def test_zero_redundancy_optimizer_with_an_optcore_class(name: str, zero_results: list[dict[str, Any]]) -> None:
    for r in zero_results:
        _result(r, name)


# ---------------------------------------------------------------------- FSDP2
def _fsdp_check(name: str, rank: int, world: int, extra: dict[str, Any]) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = _model()
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model[0], model[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = _build(name, model, **extra)
    _train_ranks(model, opt, rank, range(STEPS))
    got = [p.full_tensor() for p in model.parameters()]
    want_model = _model()
    _train_single(name, want_model, _build(name, want_model, **extra), range(STEPS))
    _assert_close(got, list(want_model.parameters()), f"{name} {extra} on FSDP2 DTensor params")


def _fsdp_worker(rank: int, world: int, cases: list[tuple[str, dict[str, Any]]]) -> None:
    for name, extra in cases:
        _fsdp_check(name, rank, world, extra)



@pytest.mark.parametrize(
    "cases",
    [
        pytest.param(
            [("AdamW", {}), ("SGD", {"foreach": True}), ("Lion", {"fused": False, "foreach": True})],
            id="AdamW+SGD-foreach+Lion-foreach",
        ),
        # Defaults: optcore must not pick fused SGD for DTensor params; Lion steps the local shards with its C kernel.
        pytest.param([("SGD", {}), ("AdamW", {})], id="SGD+AdamW-default"),
        pytest.param([("Lion", {})], id="Lion-default"),
    ],
)
def test_fsdp2_pointwise_optimizers_step_dtensor_params(cases: list[tuple[str, dict[str, Any]]]) -> None:
    for name, _ in cases:
        if _missing(name):
            pytest.skip(_missing(name))
    run_ranks(_fsdp_worker, 2, cases)


# -------------------------------------------------------------------- failures
def _fail_worker(rank: int, world: int, how: str) -> None:
    if rank == 1:
        if how == "raise":
            raise ValueError("rank 1 gives up")
        if how == "die":
            os._exit(3)
        time.sleep(600)  # hang
    dist.all_reduce(torch.ones(1))  # rank 0 waits for rank 1


@pytest.mark.parametrize("how", ["raise", "die"])
def test_a_failing_rank_makes_the_others_fail_quickly(how: str) -> None:
    start = time.monotonic()
    with pytest.raises(RanksFailed) as info:
        run_ranks(_fail_worker, 2, how, timeout=60.0, grace=15.0)
    elapsed = time.monotonic() - start
    failures = info.value.failures
    assert set(failures) == {0, 1}, failures
    assert ("ValueError: rank 1 gives up" if how == "raise" else "exit code 3") in failures[1]
    assert failures[0].startswith("raised"), f"rank 0 should fail on its own (gloo), not be killed: {failures[0]}"
    assert elapsed < 45, f"took {elapsed:.0f} s"


def test_a_hanging_rank_fails_at_the_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(RanksFailed) as info:
        run_ranks(_fail_worker, 2, "hang", timeout=8.0, grace=2.0)
    assert "hung" in info.value.failures[1]
    assert time.monotonic() - start < 30
