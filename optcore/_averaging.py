"""``average_params``, the contract's one collective: the ranks must agree before
any data moves (a flat all-reduce over buffers of different sizes aborts).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ._errors import ConfigError
from ._grads import by_device_and_dtype


class AveragingMixin:
    param_groups: list[dict[str, Any]]
    state: Any

    @torch.no_grad()
    def average_params(self, group: Any = None) -> None:
        """Parameters and their moments (floating state of their shape), one flat
        buffer per device and dtype: a handful of collectives, not one per tensor."""
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return
        world = dist.get_world_size(group)
        if world == 1:
            return
        tensors: list[Tensor] = []
        for g in self.param_groups:
            for p in g["params"]:
                tensors.append(p.data)
                tensors.extend(
                    v
                    for v in self.state.get(p, {}).values()
                    if isinstance(v, Tensor) and v.is_floating_point() and v.shape == p.shape
                )
        _check_ranks_agree(tensors, group)
        for bucket in by_device_and_dtype(tensors).values():
            flat = torch.cat([t.reshape(-1) for t in bucket])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
            flat.div_(world)
            for t, chunk in zip(bucket, flat.split([t.numel() for t in bucket])):
                t.copy_(chunk.view_as(t))


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
