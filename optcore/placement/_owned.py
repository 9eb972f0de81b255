"""Muon over FSDP2's shards: each matrix's Newton–Schulz update on one owner rank.

Muon's momentum, its Nesterov blend, weight decay and the final ``add_`` are
elementwise, so every rank does them on its own rows (``Shard(0)``), and the
momentum stays a ``DTensor`` shaped like its parameter: DCP saves it and
reshards it across world sizes as it does AdamW's moments. Only the
orthogonalisation needs the whole matrix. Each step therefore

1. gives each 2-D matrix an owner (greedy by size over the ranks, the same
   on every rank: it depends only on shapes);
2. sends every rank's rows of each blended update to its owner: one
   ``all_to_all_single`` for all matrices of a dtype;
3. lets the owner run torch's own ``_zeropower_via_newtonschulz`` on the whole
   matrix (bf16 inside, as torch's Muon);
4. sends each rank its rows of the result: a second ``all_to_all_single``.

Two collectives per step and dtype, whatever the number of matrices; the
owner's extra memory is its matrices' whole updates (received, and their
orthogonalised copies), each rank's the send and receive buffers of its rows.
Given the same gradients the parameters equal torch's ``Muon`` on one process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

#: the layouts the owner placement steps: FSDP2's ``Shard(0)`` on one mesh
#: dimension, replicated over any others (HSDP)
_FSDP2 = "Shard(0) on one mesh dimension, replicated over the others (fully_shard, or HSDP)"


def is_dtensor(p: Any) -> bool:
    return hasattr(p, "placements") and hasattr(p, "device_mesh")


def shard_dim(p: Any) -> int | None:
    """The mesh dimension over which ``p``'s rows are split, when every other
    dimension replicates it (FSDP2 on a 1-D mesh, HSDP on a 2-D one); else ``None``."""
    from torch.distributed.tensor import Replicate, Shard

    placements = tuple(p.placements)
    rows = [i for i, place in enumerate(placements) if place == Shard(0)]
    if len(rows) != 1 or not all(isinstance(place, Replicate) for i, place in enumerate(placements) if i != rows[0]):
        return None
    return rows[0]


def layout_problem(params: list[Tensor]) -> str | None:
    """Why the owner placement cannot step ``params`` (``None``: it can): each
    ``DTensor`` must be split by rows over one and the same dimension of one
    mesh and replicated over the others (``fully_shard``, with or without
    HSDP's replicate dimension); plain tensors are stepped whole, as torch's
    Muon steps them. Each replica group of HSDP orthogonalises its matrices
    over its own shard group: the same work on every replica, and nothing
    sent between them."""
    sharded = [p for p in params if is_dtensor(p)]
    # by what a mesh is (device type, ranks, shape, dimension names), as DeviceMesh
    # compares: each fully_shard call without mesh= makes its own equal mesh
    meshes = {p.device_mesh for p in sharded}
    odd = [tuple(p.shape) for p in sharded if shard_dim(p) is None]
    if odd:
        return (f"{len(odd)} parameters are not sharded as {_FSDP2} (shapes {odd[:4]}; tensor parallelism "
                "splits columns or rows of a matrix over another dimension)")
    if len(meshes) > 1:
        return (f"the parameters live on {len(meshes)} different device meshes (other ranks, shapes or dimension "
                "names); shard them all over one mesh")
    if len({shard_dim(p) for p in sharded}) > 1:
        return "the parameters are split over different dimensions of their mesh; shard them all over one"
    return None


def shard_group(p: Any) -> Any:
    """The process group of ``p``'s shard dimension (:func:`shard_dim`)."""
    dim = shard_dim(p)
    mesh = p.device_mesh
    return mesh.get_group() if mesh.ndim == 1 else mesh.get_group(dim)


def _rows(n: int, world: int) -> list[int]:
    """Rows of an ``n``-row matrix on each rank under ``Shard(0)`` (``torch.chunk``'s split)."""
    from torch.distributed.tensor import Shard

    return [Shard.local_shard_size_and_offset(n, world, r)[0] for r in range(world)]


def owners(shapes: list[tuple[int, ...]], world: int) -> list[int]:
    """Each matrix's owner: the least loaded rank so far, largest matrices first
    (ties by position), so every rank computes the same list from the shapes."""
    load = [0] * world
    out = [0] * len(shapes)
    for i in sorted(range(len(shapes)), key=lambda i: (-_numel(shapes[i]), i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        out[i] = rank
        load[rank] += _numel(shapes[i])
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def orthogonalise(
    updates: list[Tensor], shapes: list[tuple[int, ...]], group: Any,
    whole: Callable[[int, Tensor], Tensor], as_rank: tuple[int, int] | None = None,
) -> list[Tensor]:
    """For each local block of rows ``updates[i]`` of a matrix of global shape
    ``shapes[i]``: this rank's rows of ``whole(i, matrix)``, computed by the
    matrix's owner on the whole matrix. Two ``all_to_all_single`` calls per dtype.
    ``as_rank=(rank, world)`` (no ``group``): the buffers of that rank with no
    collective, their contents empty (``optcore memory`` on the meta device)."""
    dist = torch.distributed
    me, world = as_rank if as_rank is not None else (dist.get_rank(group), dist.get_world_size(group))
    out: list[Tensor | None] = [None] * len(updates)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, u in enumerate(updates):
        by_dtype.setdefault(u.dtype, []).append(i)
    for dtype, index in sorted(by_dtype.items(), key=lambda kv: str(kv[0])):
        own = owners([shapes[i] for i in index], world)
        rows = {i: _rows(shapes[i][0], world) for i in index}
        cols = {i: _numel(shapes[i][1:]) for i in index}
        mine = [i for i, o in zip(index, own) if o == me]
        owner_of = dict(zip(index, own))
        device = updates[index[0]].device
        # 1. each rank's rows to the owner
        send = [u for d in range(world) for i in index if owner_of[i] == d for u in (updates[i].reshape(-1),)]
        send_split = [sum(rows[i][me] * cols[i] for i in index if owner_of[i] == d) for d in range(world)]
        recv_split = [sum(rows[i][s] * cols[i] for i in mine) for s in range(world)]
        received = _exchange(send, send_split, recv_split, dtype, device, group)
        pieces: dict[int, list[Tensor]] = {i: [] for i in mine}
        at = 0
        for s in range(world):
            for i in mine:
                n = rows[i][s] * cols[i]
                pieces[i].append(received[at:at + n].view(rows[i][s], *shapes[i][1:]))
                at += n
        done = {i: whole(i, torch.cat(pieces[i])).to(dtype) for i in mine}
        # 2. each rank's rows of the result back
        send = []
        for d in range(world):
            for i in mine:
                start = sum(rows[i][:d])
                send.append(done[i][start:start + rows[i][d]].reshape(-1))
        send_split, recv_split = recv_split, send_split
        received = _exchange(send, send_split, recv_split, dtype, device, group)
        at = 0
        for o in range(world):
            for i in index:
                if owner_of[i] == o:
                    n = rows[i][me] * cols[i]
                    out[i] = received[at:at + n].view(rows[i][me], *shapes[i][1:])
                    at += n
    return out  # type: ignore[return-value]


def _exchange(send: list[Tensor], send_split: list[int], recv_split: list[int], dtype: torch.dtype,
              device: torch.device, group: Any) -> Tensor:
    """One ``all_to_all_single`` of the concatenated ``send`` pieces (none without a group)."""
    source = torch.cat(send) if send else torch.empty(0, dtype=dtype, device=device)
    target = torch.empty(sum(recv_split), dtype=dtype, device=device)
    if group is not None:
        torch.distributed.all_to_all_single(target, source, recv_split, send_split, group=group)
    return target


class ShardedMuon(torch.optim.Muon):
    """torch's ``Muon`` over FSDP2's ``Shard(0)`` parameters: the elementwise parts
    on each rank's rows, the orthogonalisation of each whole matrix on its owner
    (:func:`orthogonalise`). Built by the plan in place of ``Muon`` when its
    parameters are ``DTensor`` shards; state and checkpoints are ``Muon``'s.

    :meth:`as_rank` makes one over plain tensors of a rank's local shapes step
    as that rank would, without collectives: ``optcore memory`` counts its
    buffers on the meta device that way."""

    sharding = "per_tensor"
    supports_groups = True
    _as_rank: tuple[int, int, dict[int, tuple[int, ...]]] | None = None

    def as_rank(self, rank: int, world: int, shapes: dict[int, tuple[int, ...]]) -> None:
        """Step as rank ``rank`` of ``world`` with each parameter (by ``id``) the
        local rows of a matrix of ``shapes[id(p)]``, sending and receiving nothing."""
        self._as_rank = (rank, world, shapes)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        from torch.optim._muon import _adjust_lr
        from torch.optim.optimizer import _to_scalar

        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work: list[tuple[Tensor, dict[str, Any], Tensor]] = []
        for group in self.param_groups:
            params: list[Tensor] = []
            grads: list[Tensor] = []
            bufs: list[Tensor] = []
            self._init_group(group, params, grads, bufs)
            momentum = group["momentum"]
            for p, g, buf in zip(params, grads, bufs):
                g, buf = _local(g), _local(buf)
                buf.lerp_(g, 1 - momentum)
                work.append((p, group, g.lerp(buf, momentum) if group["nesterov"] else buf))
        simulated = self._as_rank
        shapes = [simulated[2][id(p)] if simulated else tuple(p.shape) for p, _, _ in work]
        sharded = [k for k, (p, _, _) in enumerate(work) if simulated or is_dtensor(p)]
        done: dict[int, Tensor] = {k: _newton_schulz(u, grp) for k, (p, grp, u) in enumerate(work) if k not in sharded}
        if sharded:
            group = None if simulated else shard_group(work[sharded[0]][0])
            results = orthogonalise(
                [work[k][2] for k in sharded], [shapes[k] for k in sharded], group,
                lambda i, matrix: _newton_schulz(matrix, work[sharded[i]][1]),
                as_rank=simulated[:2] if simulated else None,
            )
            done.update(zip(sharded, results))
        for k, (p, group, _) in enumerate(work):
            lr = _to_scalar(group["lr"])
            local = _local(p)
            local.mul_(1 - lr * group["weight_decay"])
            local.add_(done[k], alpha=-_adjust_lr(lr, group["adjust_lr_fn"], shapes[k]))
        return loss


def _newton_schulz(update: Tensor, group: dict[str, Any]) -> Tensor:
    """torch's orthogonalisation, looked up at each call (bf16 inside, as its ``Muon``)."""
    from torch.optim import _muon

    return _muon._zeropower_via_newtonschulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"])


def _local(t: Tensor) -> Tensor:
    return t.to_local() if is_dtensor(t) else t  # type: ignore[attr-defined]
