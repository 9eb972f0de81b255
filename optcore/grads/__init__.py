"""Gradient arithmetic in torch's ``_foreach_`` units, shared by the contract,
ZeRO's wrapper, :mod:`optcore.placement` and optcore-fp16 (public as
``optcore.plugin.by_device_and_dtype`` and ``optcore.plugin.total_grad_norm``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, overload

import torch
from torch import Tensor


def params_with_grad(groups: Iterable[Mapping[str, Any]]) -> list[Tensor]:
    return [p for g in groups for p in g["params"] if p.grad is not None]


Key = tuple[torch.device, torch.dtype]


@overload
def by_device_and_dtype(tensors: Iterable[Tensor], /) -> dict[Key, list[Tensor]]: ...
@overload
def by_device_and_dtype(
    first: Iterable[Tensor], second: Iterable[Tensor], /, *more: Iterable[Tensor]
) -> dict[Key, tuple[list[Tensor], ...]]: ...


def by_device_and_dtype(*tensor_lists: Iterable[Tensor]) -> dict[Key, Any]:
    """Tensors in ``torch._foreach_`` units: one list per (device, dtype) of the
    first list's tensors, in their order. Several lists of one length (params,
    grads, each state) are grouped together, by the first: each key maps to a
    tuple of lists that stay aligned, as torch's own ``foreach`` optimizers group
    them (a state kept in fp32 for fp16 params goes with its param)."""
    if not tensor_lists:
        raise TypeError("by_device_and_dtype() needs at least one list of tensors")
    if len(tensor_lists) == 1:
        buckets: dict[Key, list[Tensor]] = {}
        for t in tensor_lists[0]:
            buckets.setdefault((t.device, t.dtype), []).append(t)
        return buckets
    lists = [list(ts) for ts in tensor_lists]
    if len({len(ts) for ts in lists}) > 1:
        raise ValueError(
            f"by_device_and_dtype() groups aligned lists, got lists of lengths {[len(ts) for ts in lists]}; "
            "pass one entry per parameter in each"
        )
    grouped: dict[Key, tuple[list[Tensor], ...]] = {}
    for row in zip(*lists):
        first = row[0]
        for bucket, t in zip(grouped.setdefault((first.device, first.dtype), tuple([] for _ in lists)), row):
            bucket.append(t)
    return grouped


def total_grad_norm(grads: Sequence[Tensor]) -> Tensor:
    """In at least fp32 (an fp16 norm over 65504 is no overflow), and in the grads'
    own precision when higher or complex, as ``torch.nn.utils.get_total_norm``."""
    if not grads:
        return torch.zeros(())
    norms = []
    for (_, dtype), bucket in by_device_and_dtype(grads).items():
        wide = torch.promote_types(dtype, torch.float32) if dtype.is_floating_point else None
        norms.append(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(bucket, 2.0, dtype=wide)), 2.0))
    first = norms[0].device
    dtype = functools.reduce(torch.promote_types, (n.dtype for n in norms))
    return torch.linalg.vector_norm(torch.stack([n.to(first, dtype) for n in norms]), 2.0)


def multiply(grads: Sequence[Tensor], c: float | Tensor) -> None:
    """``grads`` times ``c`` in place, one ``_foreach_mul_`` per device and dtype."""
    if not isinstance(c, Tensor) and c == 1.0:
        return
    for (device, _), bucket in by_device_and_dtype(grads).items():
        torch._foreach_mul_(bucket, c.to(device) if isinstance(c, Tensor) else c)
