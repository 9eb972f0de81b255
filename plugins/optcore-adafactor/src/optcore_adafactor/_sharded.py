"""Adafactor over FSDP2's DTensor shards, equal to one process.

FSDP2 (``fully_shard``) hands the optimizer ``DTensor`` parameters split
along dim 0 (``Shard(0)``, the last ranks' shards possibly shorter or empty).
Adafactor's statistics are over whole tensors: RMS(X), the column means of a
matrix's squared gradient (its rows are split), the mean of its row
statistic, and the RMS of the update that is clipped. Stepping each shard
alone would be another optimizer. Here every rank computes its shards' partial
sums, and the sums of all parameters travel together, in float64, in two
all-reduces per step whatever the number of parameters:

1. per parameter: sum X², and for a matrix split by rows also the column
   sums of G² + eps1 (m numbers) and the sum of the new row statistic;
2. per parameter: sum U² of the unclipped update (it needs the reduced
   statistics of phase 1).

Everything else is elementwise or along a dim no rank splits, and is done on
the local tensors (``to_local()``: plain tensor ops, no DTensor dispatch).
The update is the one :func:`.functional.adafactor_update` writes down, with
its reductions taken as above; tests/distributed/test_fsdp2_statistics.py checks it
against one process on the full batch.

The state is kept as DTensors of the parameter's placements (the row
statistic and the moments split as the parameter is, a matrix's column
statistic replicated; ``RMS`` a plain 0-dim tensor, the same on every rank),
so ``torch.distributed.checkpoint`` saves and reshards it like the
parameters: a checkpoint resumes across world sizes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from optcore import StepError

from .functional import LOW_PRECISION, relative_step_size, state_shapes

_F64 = torch.float64


def is_sharded(t: Any) -> bool:
    """Whether ``t`` is a DTensor (FSDP2's parameters are)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch without distributed support
        return False
    return isinstance(t, DTensor)


def reduce_group(p: Any, where: Any) -> Any:
    """The process group over which ``p``'s dim 0 is split (``None`` when it
    is replicated). Only ``Shard(0)`` (FSDP2's placement) and ``Replicate``
    are stepped: Adafactor's row and column statistics would need other
    reductions over other splits. ``where()`` names ``p`` in an error."""
    shard_dims = []
    for dim, placement in enumerate(p.placements):
        if placement.is_shard() and getattr(placement, "dim", None) == 0:
            shard_dims.append(dim)
        elif not placement.is_replicate():
            raise StepError(
                f"Adafactor cannot step {where()}: it is a DTensor placed {tuple(p.placements)}, and Adafactor "
                "reduces its statistics over shards of dim 0 only (FSDP2's Shard(0)). Shard it with fully_shard's "
                "default placement, or replicate it.",
                param=where(),
            )
    if len(shard_dims) > 1:
        raise StepError(
            f"Adafactor cannot step {where()}: its dim 0 is split over {len(shard_dims)} mesh dims "
            f"({tuple(p.placements)}); shard it over one (FSDP2's fully_shard on a 1-D mesh, or HSDP's "
            "(Replicate(), Shard(0))).",
            param=where(),
        )
    return p.device_mesh.get_group(shard_dims[0]) if shard_dims else None


def _placements(p: Any, key: str) -> Any:
    """A state tensor's placements: the parameter's, but a matrix's column
    statistic (m numbers over all rows) is replicated."""
    from torch.distributed.tensor import Replicate

    if key == "exp_avg_sq_col" and p.dim() == 2:
        return [Replicate() for _ in p.placements]
    return list(p.placements)


def _as_state(value: Any, p: Any, key: str, shape: torch.Size, dtype: torch.dtype) -> Any:
    """``value`` (None, a plain tensor of the whole shape, or a DTensor) as a
    DTensor of ``p``'s mesh and the state's placements. A whole tensor (a
    checkpoint loaded with ``load_state_dict``) is split locally, without a
    collective; a DTensor placed otherwise is redistributed."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    mesh, placements = p.device_mesh, _placements(p, key)
    if value is None:
        local_shape = list(shape)
        if any(pl.is_shard() for pl in placements):
            local_shape[0] = p.to_local().shape[0]
        local = torch.zeros(local_shape, dtype=dtype, device=p.to_local().device)
        return DTensor.from_local(local, mesh, placements, run_check=False, shape=shape,
                                  stride=torch.empty(shape, device="meta").stride())
    if not isinstance(value, DTensor):
        return distribute_tensor(value.detach().to(device=p.to_local().device, dtype=dtype), mesh, placements,
                                 src_data_rank=None)
    if value.device_mesh != mesh or list(value.placements) != placements:
        value = value.redistribute(mesh, placements)
    if value.dtype != dtype:
        value = value.to(dtype)
    return value


def init_state(optimizer: Any, group: dict[str, Any], p: Any) -> None:
    """Create or place ``p``'s state: DTensors for the statistics and moments,
    a plain 0-dim ``RMS`` (fp32 for fp16/bf16 parameters)."""
    state = optimizer.state[p]
    step = state.setdefault("step", 0)
    if isinstance(step, Tensor):
        state["step"] = int(step.item())
    dtype = torch.float32 if p.dtype in LOW_PRECISION else p.dtype
    device = p.to_local().device
    for key, shape in state_shapes(p, group["beta1"]).items():
        value = state.get(key)
        placed = is_sharded(value) and value.dtype == dtype and (
            all(pl.is_replicate() for pl in value.placements) if key == "exp_avg_sq_col" and p.dim() == 2
            else value.placements == p.placements)
        if not placed:
            state[key] = _as_state(value, p, key, shape, dtype)
    rms = state.get("RMS")
    if is_sharded(rms):
        rms = rms.full_tensor()
    if not isinstance(rms, Tensor):
        state["RMS"] = torch.tensor(float(rms or 0.0), device=device, dtype=dtype)
    elif rms.dtype != dtype or rms.device != device:
        state["RMS"] = rms.to(device=device, dtype=dtype)


class _Job:
    """One parameter's step between the reductions: its local tensors and
    where its partial sums sit in the reduced buffers."""

    __slots__ = ("group", "p", "state", "x", "g", "sq", "param", "reduce", "cross", "step", "at", "numel", "u")

    def __init__(self, optimizer: Any, group: dict[str, Any], p: Any, reduce: Any) -> None:
        self.group, self.p, self.reduce = group, p, reduce
        self.state = optimizer.state[p]
        self.param = p.to_local()
        dtype = torch.float32 if p.dtype in LOW_PRECISION else p.dtype
        self.x = self.param.to(dtype)
        self.g = p.grad.to_local().to(dtype)
        self.numel = p.numel()
        # a matrix split by rows: its column means and mean(R) are over every rank's rows
        self.cross = reduce is not None and p.dim() == 2
        self.state["step"] += 1
        self.step = self.state["step"]
        self.at = 0
        self.u: Tensor | None = None

    def local(self, key: str) -> Tensor:
        return self.state[key].to_local()

    def first(self, inv_scale: float) -> list[Tensor]:
        """Phase 1: update what needs no other rank, return the partial sums
        (float64): sum X², then for a matrix split by rows its column sums of
        G² + eps1 and the sum of its new row statistic."""
        group = self.group
        beta2t = 1.0 - self.step ** group["decay_rate"]
        sq = torch.square(self.g)  # (G / s)² + eps1, in a buffer that later holds U
        if inv_scale != 1.0:
            sq.mul_(inv_scale**2)
        self.sq = sq.add_(group["eps"][0])
        parts = [_sum_of_squares(self.x)]
        if self.p.dim() < 2:
            self.local("exp_avg_sq").mul_(beta2t).add_(sq, alpha=1.0 - beta2t)
            return parts
        row = self.local("exp_avg_sq_row")
        row.mul_(beta2t).add_(sq.mean(-1), alpha=1.0 - beta2t)
        if self.cross:
            parts += [sq.sum(-2).to(_F64), row.sum(dtype=_F64).view(1)]
        else:
            self.local("exp_avg_sq_col").mul_(beta2t).add_(sq.mean(-2), alpha=1.0 - beta2t)
        return parts

    def second(self, sums: Tensor) -> list[Tensor]:
        """Phase 2: with the reduced sums of phase 1, the unclipped update U
        (written over G² + eps1); returns its partial sum of squares."""
        group, state = self.group, self.state
        dtype = self.x.dtype
        state["RMS"].copy_((sums[self.at] / self.numel).sqrt())
        u, self.sq = self.sq, None  # type: ignore[assignment]
        if self.p.dim() < 2:
            torch.rsqrt(self.local("exp_avg_sq"), out=u).mul_(self.g)
        else:
            row = self.local("exp_avg_sq_row").unsqueeze(-1)
            col = self.local("exp_avg_sq_col")
            if self.cross:
                n, m = self.p.shape
                beta2t = 1.0 - self.step ** group["decay_rate"]
                col.mul_(beta2t).add_((sums[self.at + 1 : self.at + 1 + m] / n).to(dtype), alpha=1.0 - beta2t)
                mean_row = (sums[self.at + 1 + m] / n).to(dtype)
            else:
                mean_row = row.mean(-2, keepdim=True)
            torch.mul(self.g, (row / mean_row).rsqrt(), out=u).mul_(col.unsqueeze(-2).rsqrt())
        self.u = u
        return [_sum_of_squares(u)]

    def last(self, sum_u: Tensor, inv_scale: float) -> None:
        """Phase 3: clip U by its RMS over the whole tensor, first moment,
        weight decay, and the step of the local shard."""
        group, state = self.group, self.state
        u, x = self.u, self.x
        self.u = None
        if group["relative_step"]:
            rho = relative_step_size(self.step, group["warmup_init"]) * group.get("lr_scale", 1.0)
        else:
            rho = group["lr"]
        alpha = state["RMS"].clamp(min=group["eps"][1]) * rho if group["scale_parameter"] else rho
        rms_u = (sum_u / self.numel).sqrt().to(x.dtype) * inv_scale
        u.mul_(alpha * inv_scale / (rms_u / group["clip_threshold"]).clamp(min=1.0))  # type: ignore[union-attr]
        beta1 = group["beta1"]
        if beta1 is not None:
            u = self.local("exp_avg").mul_(beta1).add_(u, alpha=1.0 - beta1)
        weight_decay = group["weight_decay"]
        decay = not (isinstance(weight_decay, (int, float)) and weight_decay == 0)
        if x is self.param:  # stepped in place
            if decay:
                x.mul_(1.0 - weight_decay * alpha)
            x.sub_(u)
            return
        if decay:  # fp16/bf16: fp32 math, written back once
            x = x - (weight_decay * alpha) * x
        self.param.copy_(x - u)


def _sum_of_squares(t: Tensor) -> Tensor:
    """sum t² as a 1-element float64 tensor (BLAS ``dot`` for dense fp32/fp64:
    one pass, nothing allocated)."""
    if t.dtype in (torch.float32, torch.float64) and t.is_contiguous():
        flat = t.view(-1)
        return torch.dot(flat, flat).to(_F64).view(1)
    return t.square().sum(dtype=_F64).view(1)


def _all_reduce(jobs: list[_Job], parts: list[list[Tensor]]) -> list[Tensor]:
    """Each job's partial sums, reduced over its group: one flat float64
    buffer and one all-reduce per process group (FSDP2: one). Sets each job's
    offset ``at`` into the buffer it returns for it."""
    import torch.distributed as dist

    buffers: dict[Any, list[int]] = {}
    for index, job in enumerate(jobs):
        buffers.setdefault(job.reduce, []).append(index)
    out: list[Tensor] = [torch.empty(0)] * len(jobs)
    for reduce, members in buffers.items():
        flat = torch.cat([t for i in members for t in parts[i]])
        if reduce is not None and dist.get_world_size(reduce) > 1:
            dist.all_reduce(flat, group=reduce)
        at = 0
        for i in members:
            jobs[i].at = at
            out[i] = flat
            at += sum(t.numel() for t in parts[i])
    return out


@torch.no_grad()
def step(optimizer: Any, work: list[tuple[dict[str, Any], Any]], inv_scale: float) -> None:
    """One Adafactor step of the DTensor parameters in ``work`` (their state
    set up by :func:`init_state`), with the gradients times ``inv_scale``."""
    groups = [reduce_group(p, lambda: optimizer._where(group, p)) for group, p in work]
    jobs = [_Job(optimizer, group, p, reduce) for (group, p), reduce in zip(work, groups)]
    if not jobs:
        return
    sums = _all_reduce(jobs, [job.first(inv_scale) for job in jobs])
    sums = _all_reduce(jobs, [job.second(total) for job, total in zip(jobs, sums)])
    for job, total in zip(jobs, sums):
        job.last(total[job.at], inv_scale)

