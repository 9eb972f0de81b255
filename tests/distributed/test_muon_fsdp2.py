"""Muon (alone and with an AdamW fallback) under FSDP2 on two gloo ranks, against one process.

Each matrix's Newton–Schulz update runs whole on an owner rank
(:class:`optcore.placement.ShardedMuon`). Given the same gradients the sharded
run is bitwise one process's. Trained on half batches, the reduce-scattered
gradients differ from the full batch's in the last float32 bits, and the
Newton–Schulz iteration carries them on: run in float32 (the iteration torch
writes, with float32 for bf16) they grow to 9.3e-7 of a parameter's largest
element after four steps (tolerance 1e-5). torch's Muon casts the update to
bf16 first, which rounds such bits away (3.3e-10 measured) unless one lands on
a rounding boundary and moves the input one bf16 ulp (2**-8): the tolerance
there is 1e-3, an ulp times the learning rate with room.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import optcore
from _dist_util import run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "composite"))  # the composite tests' models
from test_composite import MUON_ADAMW, batch, tiny  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch has no Muon")]
WORLD = 2
STEPS, SAVED = 4, 2
MUON = {"type": "Muon", "lr": 0.02}
GALORE = {"type": "LowRankAdamW", "lr": 1e-3, "rank": 2, "fallback": {"type": "AdamW"}}


def matrices() -> nn.Module:
    """2-D matrices only, with row counts two ranks do not divide (5, 7, 3) and one row (1)."""
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 5, bias=False), nn.Linear(5, 7, bias=False), nn.Linear(7, 3, bias=False),
                         nn.Linear(3, 1, bias=False))  # fmt: skip


def full_grads(step: int, model: nn.Module) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(50 + step)
    return [torch.randn(p.shape, generator=g) for p in model.parameters()]


def float32_ns(grad: torch.Tensor, ns_coefficients: Any, ns_steps: int, eps: float) -> torch.Tensor:
    """torch's Newton–Schulz iteration with float32 in place of bf16."""
    a, b, c = ns_coefficients
    x = grad.float()
    if grad.size(0) > grad.size(1):
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if grad.size(0) > grad.size(1) else x


def _loss(model: nn.Module, i: int, rows: slice = slice(None)) -> torch.Tensor:
    x, y = batch(i)
    return nn.functional.cross_entropy(model(x[rows]).flatten(0, 1), y[rows].flatten())


def _full(model: nn.Module) -> list[torch.Tensor]:
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in model.parameters()]


def _dcp(model: nn.Module, opt: Any, path: str, load: bool) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict,
    )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
        if not load:
            dcp.save(state, checkpoint_id=path)
            return
        dcp.load(state, checkpoint_id=path)
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, opt, state["optim"])


def _shard(model: nn.Module, world: int, docs_way: bool) -> None:
    """``fully_shard`` on one shared mesh, or as docs/distributed.md does: per block,
    then the root, each call with a mesh of its own, equal to the others (as
    ``fully_shard`` without ``mesh=`` makes in torch versions that do not cache
    its default mesh)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if docs_way:
        for block in model.blocks:
            if any(True for _ in block.parameters()):
                fully_shard(block, mesh=init_device_mesh("cpu", (world,)))
        fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    else:
        fully_shard(model, mesh=init_device_mesh("cpu", (world,)))


def _trained(ns: Any, root: str, rank: int, world: int, docs_way: bool = False) -> dict[str, Any]:
    """Muon + AdamW on FSDP2 shards, half a batch per rank: the parameters after
    each step, and a DCP checkpoint after step ``SAVED``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.optim import _muon

    original = _muon._zeropower_via_newtonschulz
    _muon._zeropower_via_newtonschulz = ns or original
    try:
        model = tiny()
        _shard(model, world, docs_way)
        opt = optcore.build_optimizer(MUON_ADAMW, model)
        half = slice(2 * rank, 2 * rank + 2)
        trace = []
        for i in range(STEPS):
            opt.zero_grad()
            _loss(model, i, half).backward()
            opt.step()
            trace.append(_full(model))
            if i + 1 == SAVED:
                _dcp(model, opt, root, load=False)
        out = {"trace": trace, "parts": {label: type(part).__name__ for label, part in opt.parts.items()}}
        # resumed on two fresh ranks (DCP's initialisation step runs the collectives too): this run's
        # checkpoint, and with the float32 iteration one saved by one process
        sources = {"resumed": root, **({"from_one": str(Path(root).parent / "one")} if ns else {})}
        for key, path in sources.items():
            model = tiny(seed=7)
            _shard(model, world, docs_way)
            opt = optcore.build_optimizer(MUON_ADAMW, model)
            _dcp(model, opt, path, load=True)
            for i in range(SAVED, STEPS):
                opt.zero_grad()
                _loss(model, i, half).backward()
                opt.step()
            out[key] = _full(model)
        return out
    finally:
        _muon._zeropower_via_newtonschulz = original


def _on_local_shards(watch: Any) -> Any:
    """``watch`` (a :class:`~optcore.compare.transient.LiveStorages`) counting a
    DTensor's local shard's storage where it sees the DTensor."""
    from torch.utils._pytree import tree_map_only

    from optcore.compare.transient import LiveStorages

    class Local(type(watch)):  # type: ignore[misc]
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            local = tree_map_only(torch.Tensor, lambda t: getattr(t, "_local_tensor", t), ((args, kwargs), out))
            LiveStorages.__torch_dispatch__(self, lambda *a, **k: local[1], types, local[0][0], local[0][1])
            return out

    watch.__class__ = Local
    return watch


def _memory(rank: int, world: int) -> dict[str, int]:
    """What this rank holds after two steps of Muon + AdamW on FSDP2 shards, counted
    from the local shards' storages, and the most bytes its second step allocated
    at once (a dispatch mode over the local ops: the update's rows, the owned
    matrices gathered whole, their Newton–Schulz workspace, AdamW's temporaries)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from optcore.compare.probes import _count, _tensors
    from optcore.compare.transient import LiveStorages

    model = tiny()
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    opt = optcore.build_optimizer(MUON_ADAMW, model)
    watch = LiveStorages()
    for i in range(2):
        opt.zero_grad()
        _loss(model, i, slice(2 * rank, 2 * rank + 2)).backward()
        with contextlib.ExitStack() as stack:
            if i == 1:
                stack.enter_context(_on_local_shards(watch))
            opt.step()
    params = list(model.parameters())
    seen: set[int] = set()
    return {"param_bytes": _count((p.to_local() for p in params), seen),
            "grad_bytes": _count((p.grad.to_local() for p in params), seen),
            "state_bytes": _count(_tensors(dict(opt.state)), seen),
            "transient_bytes": watch.peak}  # fmt: skip


def _worker(rank: int, world: int, root: str) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Shard

    out: dict[str, Any] = {}
    mesh = init_device_mesh("cpu", (world,))
    # the same gradients as one process: each rank's rows of them
    model = matrices()
    for layer in model:
        fully_shard(layer, mesh=mesh)
    opt = optcore.build_optimizer(MUON, model)
    out["class"] = type(opt).__name__
    calls = []
    exchange = torch.distributed.all_to_all_single
    torch.distributed.all_to_all_single = lambda *a, **k: calls.append(1) or exchange(*a, **k)
    for step in range(3):
        for p, g in zip(model.parameters(), full_grads(step, model)):
            size, start = Shard.local_shard_size_and_offset(g.shape[0], world, rank)
            rows = g[start:start + size].clone()
            p.grad = DTensor.from_local(rows, mesh, p.placements, shape=p.shape, stride=p.stride())
        opt.step()
    torch.distributed.all_to_all_single = exchange
    out["collectives_per_step"] = len(calls) / 3
    out["same_grads"] = _full(model)
    out["memory"] = _memory(rank, world)
    hsdp = matrices()
    fully_shard(hsdp, mesh=init_device_mesh("cpu", (1, world), mesh_dim_names=("replicate", "shard")))
    out["hsdp"] = type(optcore.build_optimizer(MUON, hsdp)).__name__
    columns = [DTensor.from_local(torch.ones(4, 1), mesh, [Shard(1)])]  # tensor parallelism's colwise split
    out["columns"] = optcore.placement.layout_problem(columns)
    # GaLore as optcore sees it: optcore.lowrank's wrapper (what makes galore_torch's classes GaLore to the
    # plan) over torch's AdamW, since importing galore_torch costs each rank bitsandbytes' import (~8 s CPU)
    from optcore.lowrank import low_rank

    optcore.register_optimizer("LowRankAdamW", low_rank(torch.optim.AdamW, "LowRankAdamW"))
    galore = tiny()
    fully_shard(galore, mesh=mesh)
    try:
        optcore.build_optimizer(GALORE, galore)
    except optcore.ConfigError as exc:
        out["galore"] = f"{type(exc).__name__}: {exc}"
    out["bf16"] = _trained(None, str(Path(root, "bf16")), rank, world)
    out["float32"] = _trained(float32_ns, str(Path(root, "float32")), rank, world)
    from torch.distributed.device_mesh import DeviceMesh

    from optcore.placement import layout_problem

    equal = [DeviceMesh("cpu", list(range(world))) for _ in range(2)]  # two objects, one mesh
    out["equal_meshes"] = layout_problem([DTensor.from_local(torch.ones(2, 3), m, [Shard(0)]) for m in equal])
    out["docs_way"] = _trained(float32_ns, str(Path(root, "docs_way")), rank, world, docs_way=True)
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    root = tmp_path_factory.mktemp("muon-fsdp2")
    model, opt, _ = _one_process(float32_ns, range(SAVED))
    _dcp(model, opt, str(root / "one"), load=False)  # for the ranks to resume
    return run_ranks(_worker, WORLD, str(root), timeout=180), root


def _one_process(ns: Any, steps: range, model: nn.Module | None = None, opt: Any = None) -> tuple[Any, Any, list[Any]]:
    from torch.optim import _muon

    original = _muon._zeropower_via_newtonschulz
    _muon._zeropower_via_newtonschulz = ns or original
    try:
        model = model or tiny()
        opt = opt or optcore.build_optimizer(MUON_ADAMW, model)
        trace = []
        for i in steps:
            opt.zero_grad()
            _loss(model, i).backward()
            opt.step()
            trace.append(_full(model))
        return model, opt, trace
    finally:
        _muon._zeropower_via_newtonschulz = original


def _worst(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """The largest difference relative to the largest element of each parameter."""
    return max(float((a - b).abs().max() / b.abs().max().clamp(min=1e-12)) for a, b in zip(got, want, strict=True))


def test_the_plan_builds_muon_that_orthogonalises_on_an_owner_rank(ranks: Any) -> None:
    results, _ = ranks
    for got in results:
        assert got["class"] == "ShardedMuon"
        assert got["bf16"]["parts"] == {"Muon": "ShardedMuon", "AdamW": "AdamW"}


def test_the_same_gradients_give_one_process_s_parameters_bitwise(ranks: Any) -> None:
    results, _ = ranks
    model = matrices()
    opt = torch.optim.Muon(model.parameters(), lr=0.02)
    for step in range(3):
        for p, g in zip(model.parameters(), full_grads(step, model)):
            p.grad = g
        opt.step()
    for got in results:
        for a, b in zip(got["same_grads"], model.parameters(), strict=True):
            assert torch.equal(a, b.detach())
        assert got["collectives_per_step"] == 2  # four matrices: one all_to_all there, one back


@pytest.mark.parametrize("ns,tolerance", [("float32", 1e-5), ("bf16", 1e-3)])
def test_training_on_half_batches_equals_one_process_on_the_full_batch(ranks: Any, ns: str, tolerance: float) -> None:
    """Relative to each parameter's largest element, after every step (the module's docstring says why)."""
    results, _ = ranks
    _, _, want = _one_process(float32_ns if ns == "float32" else None, range(STEPS))
    for got in results:
        for step, (a, b) in enumerate(zip(got[ns]["trace"], want, strict=True)):
            assert _worst(a, b) <= tolerance, (ns, step, _worst(a, b))
    assert results[0][ns]["trace"][-1][1].equal(results[1][ns]["trace"][-1][1])  # every rank has the same matrices


def test_the_docs_fsdp2_example_with_a_mesh_per_call_equals_one_process(ranks: Any) -> None:
    """``fully_shard(block)`` per block and ``fully_shard(model)``, each on a
    DeviceMesh of its own, equal to the others: Muon + AdamW steps them as one
    mesh (it was refused as "3 different device meshes")."""
    results, _ = ranks
    _, _, want = _one_process(float32_ns, range(STEPS))
    for got in results:
        assert got["equal_meshes"] is None  # meshes compared by what they are, not by identity
        assert got["docs_way"]["parts"] == {"Muon": "ShardedMuon", "AdamW": "AdamW"}
        for step, (a, b) in enumerate(zip(got["docs_way"]["trace"], want, strict=True)):
            assert _worst(a, b) <= 1e-5, (step, _worst(a, b))
        assert _worst(got["docs_way"]["resumed"], want[-1]) <= 1e-5


def test_galore_on_fsdp2_shards_is_refused_saying_why_and_what_works(ranks: Any) -> None:
    results, _ = ranks
    for got in results:
        text = got["galore"]
        assert text.startswith("ConfigError") and "per-matrix projector" in text and "DTensor" in text
        assert "DDP" in text and "{'type': 'Muon', 'fallback': {'type': 'AdamW'}}" in text


def test_muon_on_an_hsdp_mesh_orthogonalises_over_the_shard_group_and_columns_are_refused(ranks: Any) -> None:
    """HSDP's (Replicate, Shard(0)) is stepped by ShardedMuon over the shard
    dimension (the kit's hsdp-2x2 cell compares it with one process); a
    column split (tensor parallelism) is not a layout it can step."""
    results, _ = ranks
    for got in results:
        assert got["hsdp"] == "ShardedMuon"
        assert "not sharded as Shard(0) on one mesh dimension" in got["columns"] and "tensor parallelism" in got["columns"]


def test_memory_prediction_is_what_rank_0_holds_and_allocates(ranks: Any) -> None:
    from optcore.compare.memory import predict_all

    results, _ = ranks
    (row,) = predict_all([{"name": "x", "optimizer": MUON_ADAMW}], tiny, world_size=WORLD, sharding="fsdp2")
    predicted = {k: row["per_rank"][k] for k in ("param_bytes", "grad_bytes", "state_bytes", "transient_bytes")}
    assert results[0]["memory"] == predicted
    for k in ("param_bytes", "grad_bytes", "state_bytes"):
        assert results[1]["memory"][k] <= predicted[k]


def test_a_two_rank_dcp_checkpoint_resumes_on_two_ranks(ranks: Any) -> None:
    """Saved after step 2 and loaded into fresh FSDP2 ranks, steps 3 and 4 equal
    one process's uninterrupted run (float32 iteration, as above)."""
    results, _ = ranks
    _, _, want = _one_process(float32_ns, range(STEPS))
    for got in results:
        assert _worst(got["float32"]["resumed"], want[-1]) <= 1e-5


def test_a_one_process_dcp_checkpoint_resumes_on_two_fsdp2_ranks(ranks: Any) -> None:
    """Saved by one process after step 2, loaded into ShardedMuon's DTensor momentum on two ranks."""
    results, _ = ranks
    _, _, want = _one_process(float32_ns, range(STEPS))
    for got in results:
        assert _worst(got["float32"]["from_one"], want[-1]) <= 1e-5


def test_a_two_rank_dcp_checkpoint_resumes_in_one_process(ranks: Any) -> None:
    """Saved after step 2 on two FSDP2 ranks, loaded into one plain process,
    steps 3 and 4 equal the uninterrupted one-process run (float32 iteration)."""
    _, root = ranks
    _, _, want = _one_process(float32_ns, range(STEPS))
    model = tiny(seed=7)
    opt = optcore.build_optimizer(MUON_ADAMW, model)
    _dcp(model, opt, str(root / "float32"), load=True)
    assert all("momentum_buffer" in opt.state[p] for p in opt.parts["Muon"].param_groups[0]["params"])
    _, _, got = _one_process(float32_ns, range(SAVED, STEPS), model, opt)
    for a, b in zip(got, want[SAVED:], strict=True):
        assert _worst(a, b) <= 1e-5
