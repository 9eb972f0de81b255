"""Gradient norms and parameter averages over the ranks of a process group:
the contract's ``clip_grad_norm`` and ``average_params``, and those of the
ZeRO optimizer whose shards are split over ranks, share these."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from .._errors import ConfigError
from ..grads import by_device_and_dtype, total_grad_norm


def shard_norm(local: Tensor, group: Any, device: torch.device | None = None) -> Tensor:
    """The 2-norm over every rank of ``group`` from this rank's ``local`` 2-norm
    (one all-reduce of its square); ``local`` itself on one rank."""
    dist = torch.distributed
    if group is None or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return local
    square = local.detach().to(device or local.device, torch.float64 if local.dtype == torch.float64 else torch.float32)
    square = square.square().reshape(1)
    if dist.get_backend(group) == "nccl" and square.device.type != "cuda":
        square = square.to(torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(square, op=dist.ReduceOp.SUM, group=group)
    return square.sqrt().reshape(()).to(local.device)


def clip_by_norm(
    grads: Sequence[Tensor],
    max_norm: float,
    multiply: Callable[[Tensor], None],
    group: Any = None,
    aggregate_norm_fn: Callable[[Tensor], Tensor] | None = None,
    device: torch.device | None = None,
) -> Tensor:
    """The norm of ``grads`` over every rank of ``group`` (then through
    ``aggregate_norm_fn``); when finite and over ``max_norm``, ``multiply`` is
    called with the factor that brings it to ``max_norm``. A non-finite norm
    leaves the grads alone, so a loss scaler can skip the step."""
    total = shard_norm(total_grad_norm(grads), group, device)
    if aggregate_norm_fn is not None:
        total = aggregate_norm_fn(total)
    if max_norm > 0 and bool(torch.isfinite(total)):
        multiply((max_norm / (total + 1e-6)).clamp(max=1.0))
    return total


@torch.no_grad()
def average(tensors: Sequence[Tensor], group: Any) -> None:
    """``tensors`` replaced by their mean over the ranks of ``group``: one flat
    buffer per device and dtype, a handful of collectives, not one per tensor."""
    dist = torch.distributed
    world = dist.get_world_size(group)
    _check_ranks_agree(tensors, group)
    for bucket in by_device_and_dtype(tensors).values():
        flat = torch.cat([t.reshape(-1) for t in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        flat.div_(world)
        for t, chunk in zip(bucket, flat.split([t.numel() for t in bucket])):
            t.copy_(chunk.view_as(t))

@torch.no_grad()
def average_optimizer(optimizer: Any, group: Any = None) -> None:
    """The contract's ``average_params``: ``optimizer``'s parameters and their
    moments (floating state of their shape) averaged over ``group``'s ranks."""
    dist = torch.distributed
    world = dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1
    if world == 1:
        return
    if getattr(optimizer, "shard_group", None) is not None:
        raise ConfigError(
            f"average_params on one rank's shard of a ZeroRedundancyOptimizer: each rank holds other "
            f"parameters, so there is nothing to average {type(optimizer).__name__}'s shard with. Call it on the "
            "optimizer optcore.distributed.zero_redundancy returns (it averages all parameters).",
            problems=[("average_params", "sharded optimizer")],
        )
    tensors: list[Tensor] = []
    for g in optimizer.param_groups:
        for p in g["params"]:
            tensors.append(p.data)
            tensors.extend(v for v in optimizer.state.get(p, {}).values()
                           if isinstance(v, Tensor) and v.is_floating_point() and v.shape == p.shape)
    average(tensors, group)


def _check_ranks_agree(tensors: Sequence[Tensor], group: Any) -> None:
    """The same :class:`ConfigError` on every rank unless all average the same
    tensors: one all-gather of (count, elements, checksum of dtypes and shapes)."""
    dist = torch.distributed
    device = tensors[0].device if tensors else torch.device("cpu")
    if dist.get_backend(group) == "nccl" and device.type != "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    layout = zlib.crc32(";".join(f"{t.dtype}{tuple(t.shape)}" for t in tensors).encode())
    mine = torch.tensor([len(tensors), sum(t.numel() for t in tensors), layout], dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    signatures = [t.tolist() for t in gathered]
    if any(sig != signatures[0] for sig in signatures):
        lines = [f"  rank {r}: {n} tensors, {e} elements, layout {c:08x}" for r, (n, e, c) in enumerate(signatures)]
        raise ConfigError(
            "average_params: the ranks do not hold the same parameters and optimizer state, so there is "
            "nothing consistent to average:\n" + "\n".join(lines) + "\n"
            "Optimizer state appears on the first step: call average_params on every rank after the same "
            "number of steps, with the same model and optimizer config.",
            problems=[("average_params", "ranks disagree")],
        )
