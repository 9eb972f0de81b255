"""``optcore memory --sharding fsdp2|zero1|zero2|zero3 --world-size N``: what
one rank holds, from the tensors that rank's optimizer actually sees.

- ``fsdp2`` (``torch.distributed.fsdp.fully_shard``): every parameter is cut
  along dim 0 into ``N`` chunks of ``ceil(d0 / N)`` rows. A rank stores its chunk
  padded to that size (parameters, and the gradients that the reduce-scatter
  writes into one flat buffer), and the optimizer sees the unpadded local shard,
  so its state has the local shape; rank 0's chunk is the largest, and is the
  one shown. Only an optimizer whose update is elementwise steps a shard as it
  would step the whole (the ``sharding`` capability); others are named, not guessed,
  except torch's ``Muon``, which the plan builds as
  :class:`~optcore.placement.ShardedMuon` (each whole matrix orthogonalised on
  an owner rank): its momentum has the local shape, and the step's transient
  peak counts the rows it sends, the whole matrices rank 0 owns and their
  Newton–Schulz workspace, as rank 0 allocates them. An optimizer whose
  statistics cross shards (``factored``, ``global``) is built over ``Shard(0)``
  DTensors of rank 0's rows and stepped as rank 0 of torch's ``fake`` process
  group (:func:`on_mesh`): optcore-adafactor's Adafactor and optcore-adascale's
  AdaScaleSGD allocate their state and reduction buffers as they do under
  ``fully_shard``, and one the plan refuses over DTensors (torch's Adafactor)
  is shown refused.
- ``zero1|2|3`` (DeepSpeed's ZeRO): each param group is flattened, and each
  rank's optimizer steps one flat 1-D slice of it: ``ceil(n / 2N) * 2``
  elements at stages 1 and 2 (the flat group padded to DeepSpeed's alignment of
  2 per rank), the sum of ``ceil(numel / N)`` per parameter at stage 3 (each
  parameter padded on its own). Stage 1 shards the optimizer state, 2 also the
  gradients, 3 also the parameters. DeepSpeed's own buffers (its fp32 partition
  copy, gradient buckets) belong to its configuration and are not counted.

Either way the optimizer is built and stepped on the meta device over those
per-rank tensors, so the state (a low-bit state's block scales included) is
counted, not estimated.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

import optcore
from optcore import ConfigError

from .._config import typed_config
from .._adapt import adapt
from ..composite import StepInBackward
from ..placement import ShardedMuon
from ..integrations.deepspeed import _WHY, _sharding
from .metascalars import ItemsInKernels, MetaScalars
from .probes import optimizer_state_bytes
from .transient import FusedKernels, LiveStorages

SHARDINGS = ("fsdp2", "zero1", "zero2", "zero3")


def fsdp2_chunk(shape: torch.Size, world_size: int) -> tuple[torch.Size, int]:
    """Rank 0's local shard shape under FSDP2 and the padded numel every rank stores."""
    if len(shape) == 0:
        shape = torch.Size([1])
    rows = math.ceil(shape[0] / world_size)
    rest = math.prod(shape[1:])
    return torch.Size([min(rows, shape[0]), *shape[1:]]), rows * rest


def zero_slice(numels: list[int], stage: int, world_size: int) -> int:
    """Elements of one rank's flat slice of a param group of tensors of ``numels``."""
    if stage == 3:
        return sum(math.ceil(n / world_size) for n in numels)
    align = 2 * world_size
    return math.ceil(sum(numels) / align) * align // world_size


def per_rank(row: dict[str, Any], cfg: Any, model: nn.Module, sharding: str, world_size: int,
             accumulations: int = 1) -> None:  # fmt: skip
    """Fill ``row["per_rank"]`` (parameter, gradient, state, transient and total
    bytes of rank 0) for ``model`` (a fresh model of the run's dtype: on the meta device to predict, real to measure), or
    ``row["per_rank_note"]`` with why it cannot be predicted."""
    row["per_rank"], row["per_rank_bytes"] = None, None
    all_params = list(model.parameters())
    trained = [p for p in all_params if p.requires_grad]
    nbytes = lambda numel, p: numel * p.element_size()  # noqa: E731
    full: dict[str, tuple[int, ...]] = {name: tuple(p.shape) for name, p in model.named_parameters()}
    if sharding == "fsdp2":
        chunks = {id(p): fsdp2_chunk(p.shape, world_size) for p in all_params}
        param_bytes = sum(nbytes(chunks[id(p)][1], p) for p in all_params)
        grad_bytes = sum(nbytes(chunks[id(p)][1], p) for p in trained)
        if on_mesh(cfg, sharding):
            _rank0_on_mesh(row, cfg, model, {id(p): chunks[id(p)][0] for p in all_params}, world_size,
                           param_bytes, grad_bytes)  # fmt: skip
            return
        _to_local_shards(model, {id(p): chunks[id(p)][0] for p in all_params})
        trained = [p for p in model.parameters() if p.requires_grad]
    else:
        stage = int(sharding[-1])
        param_bytes = sum(nbytes(p.numel(), p) for p in all_params)
        grad_bytes = sum(nbytes(p.numel(), p) for p in trained)
    fused = FusedKernels(sharding != "fsdp2")  # DTensor shards have no fused kernels
    try:
        with warnings.catch_warnings(), fused:
            warnings.simplefilter("ignore")
            optimizer = optcore.build_optimizer(cfg, model)
    except Exception as exc:  # noqa: BLE001 - the row shows why
        row["per_rank_note"] = f"build: {exc}"
        return
    if isinstance(optimizer, StepInBackward):
        row["per_rank_note"] = ("step_in_backward is refused on several ranks (DDP and FSDP reduce a gradient after "
                                "the hook has stepped with the local one)")  # fmt: skip
        return
    kind = _sharding(optimizer)
    if kind == "per_tensor" and sharding == "fsdp2":
        why = _owned_matrices(optimizer, {id(p): full[n] for n, p in model.named_parameters()}, world_size)
        if why is not None:
            row["per_rank_note"] = f"not predicted under fsdp2: {why}"
            return
        kind = "elementwise"  # every whole-tensor update runs on its owner, the rest on local rows
    if kind != "elementwise":
        what = "FSDP2 hands it DTensor shards of each parameter" if sharding == "fsdp2" else (
            "ZeRO hands it one flat slice of each param group")  # fmt: skip
        row["per_rank_note"] = f"not predicted under {sharding}: {what}, and its update is {_WHY.get(kind, kind)}"
        return
    if sharding != "fsdp2":
        slices = _flatten_groups(optimizer, stage, world_size)
        if stage >= 2:
            grad_bytes = sum(nbytes(s.numel(), s) for s in slices)
        if stage == 3:
            param_bytes = sum(nbytes(s.numel(), s) for s in slices)
        trained = slices
    try:
        with fused:
            state, transient = _two_steps(optimizer, trained, accumulations)
    except Exception as exc:  # noqa: BLE001 - the row shows why
        row["per_rank_note"] = f"its step over the shards needs real data ({type(exc).__name__}: {exc})"
        return
    _fill(row, param_bytes, grad_bytes, state, transient)


def _fill(row: dict[str, Any], param_bytes: int, grad_bytes: int, state: int, transient: int) -> None:
    total = param_bytes + grad_bytes + state
    row["per_rank"] = {"param_bytes": param_bytes, "grad_bytes": grad_bytes, "state_bytes": state,
                       "transient_bytes": transient, "total_bytes": total}  # fmt: skip
    row["per_rank_bytes"] = total


def on_mesh(cfg: Any, sharding: str | None) -> bool:
    """Whether rank 0 is predicted by stepping the optimizer's own DTensor path:
    under FSDP2, an optimizer whose statistics cross shards (``factored``,
    ``global``) either reduces them over the mesh with buffers of its own
    (optcore-adafactor, optcore-adascale) or is refused when the plan is made,
    and only its build over DTensors tells which, and what it allocates."""
    if sharding != "fsdp2":
        return False
    try:
        spec = optcore.resolve(typed_config(cfg)["type"])
    except Exception:  # noqa: BLE001 - the build reports a bad name
        return False
    return getattr(spec.capabilities, "sharding", None) in ("factored", "global")


@contextlib.contextmanager
def _rank0_of(world_size: int) -> Iterator[Any]:
    """A 1-D device mesh of ``world_size`` ranks in which this process is rank 0,
    over torch's ``fake`` process group: every collective returns at once,
    leaving the tensors as they are, so the step allocates what rank 0's does
    and waits for nobody."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("fake", store=_fake_store()(), rank=0, world_size=world_size)
    try:
        yield init_device_mesh("cpu", (world_size,))
    finally:
        dist.destroy_process_group()


def _fake_store() -> Any:
    """torch's store for the ``fake`` backend (importing it registers the backend), or None."""
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError:
        return None
    return FakeStore


def _rank0_on_mesh(row: dict[str, Any], cfg: Any, model: nn.Module, shapes: dict[int, torch.Size], world_size: int,
                   param_bytes: int, grad_bytes: int) -> None:  # fmt: skip
    """Rank 0's state and step peak with each parameter a ``Shard(0)`` DTensor of
    its local rows, as ``fully_shard`` hands them to the optimizer, built and
    stepped twice as rank 0 of a fake process group (see :func:`on_mesh`)."""
    import torch.distributed as dist

    if not dist.is_available() or _fake_store() is None:
        row["per_rank_note"] = ("not predicted under fsdp2: this torch has no distributed support with its 'fake' "
                                "process group, on which rank 0's step over its shards is simulated")  # fmt: skip
        return
    if dist.is_initialized():
        row["per_rank_note"] = ("not predicted under fsdp2: this process already has a process group, and rank 0's "
                                "step is simulated on a process group of its own; run `optcore memory` alone")  # fmt: skip
        return
    with _rank0_of(world_size) as mesh:
        _to_dtensor_shards(model, shapes, mesh)
        trained = [p for p in model.parameters() if p.requires_grad]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                optimizer = optcore.build_optimizer(cfg, model)
        except Exception as exc:  # noqa: BLE001 - the row shows why
            refused = isinstance(exc, ConfigError) and any("DTensor" in why for _, why in exc.problems)
            row["per_rank_note"] = f"{'refused under fsdp2' if refused else 'build'}: {exc}"
            return
        try:
            # the backward passes run on FSDP2's unsharded parameters, which the optimizer does not hold:
            # the step sees one gradient per shard whatever their number
            state, transient = _two_steps(optimizer, trained, 1)
        except Exception as exc:  # noqa: BLE001 - the row shows why
            row["per_rank_note"] = f"its step over the shards needs real data ({type(exc).__name__}: {exc})"
            return
        finally:
            getattr(optimizer, "unhook", lambda: None)()  # AdaScale's module hooks are process-wide
    _fill(row, param_bytes, grad_bytes, state, transient)


def _to_dtensor_shards(model: nn.Module, shapes: dict[int, torch.Size], mesh: Any) -> None:
    """Each parameter of ``model`` replaced by a ``Shard(0)`` DTensor of ``mesh``
    whose local tensor is rank 0's rows (``shapes``); a 0-dim one replicated."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None:
                continue
            local_shape = shapes[id(p)] if p.dim() else p.shape
            local = torch.zeros(local_shape, dtype=p.dtype, device=p.device)
            placement = Shard(0) if p.dim() else Replicate()
            sharded = DTensor.from_local(local, mesh, [placement], run_check=False, shape=p.shape, stride=p.stride())
            module._parameters[name] = nn.Parameter(sharded, p.requires_grad)


def _owned_matrices(optimizer: Any, full: dict[int, tuple[int, ...]], world_size: int) -> str | None:
    """Each part that the plan builds as ``ShardedMuon`` over FSDP2's shards made to
    step as rank 0 does (its buffers, no collective); why not, when another part's
    whole-tensor update is refused over shards."""
    parts = list(getattr(optimizer, "parts", {}).values()) or [optimizer]
    for part in parts:
        kind = _sharding(part)
        if kind == "elementwise":
            continue
        if kind == "per_tensor" and getattr(type(part), "adapted_from", None) is getattr(torch.optim, "Muon", None):
            part.__class__ = adapt(ShardedMuon)  # the same layout: a subclass adding no slots
            part.as_rank(0, world_size, {id(p): full[id(p)] for g in part.param_groups for p in g["params"]})
            continue
        return (f"{type(part).__name__} is refused over FSDP2's shards (its update is {_WHY.get(kind, kind)}; "
                "only torch's Muon is gathered to an owner rank); see docs/distributed.md")
    return None


def _to_local_shards(model: nn.Module, shapes: dict[int, torch.Size]) -> None:
    """Each parameter of ``model`` replaced by one of its local shard's shape."""
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and p.shape != shapes[id(p)]:
                local = nn.Parameter(torch.zeros(shapes[id(p)], dtype=p.dtype, device=p.device), p.requires_grad)
                module._parameters[name] = local


def _flatten_groups(optimizer: Any, stage: int, world_size: int) -> list[nn.Parameter]:
    """Each param group's parameters replaced by the one flat slice a rank steps
    (as DeepSpeed does to the client optimizer's groups); state made from the
    whole tensors is dropped."""
    slices = []
    for group in optimizer.param_groups:
        params = group["params"]
        if not params:
            continue
        numel = zero_slice([p.numel() for p in params], stage, world_size)
        flat = nn.Parameter(torch.zeros(numel, dtype=params[0].dtype, device=params[0].device))
        group["params"] = [flat]
        slices.append(flat)
    optimizer.state.clear()
    return slices


def _two_steps(optimizer: Any, params: list[torch.Tensor], accumulations: int) -> tuple[int, int]:
    """State bytes after one step and the transient peak of the second (on the meta
    device, its ``.item()`` calls answered by :class:`MetaScalars`; on real tensors, as they are)."""
    from .memory import step_on

    transient = 0
    for watch in (None, LiveStorages()):
        scalars = MetaScalars()
        with contextlib.ExitStack() as mode, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mode.enter_context(scalars)
            mode.enter_context(ItemsInKernels(scalars))
            step_on(None, optimizer, accumulations, watch=watch, params=params)
        if watch is None:
            state = optimizer_state_bytes(optimizer, params)["state_bytes"]
        else:
            transient = watch.peak
    return state, transient
