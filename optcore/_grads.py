"""Gradient arithmetic in torch's ``_foreach_`` units, shared by the contract,
``average_params`` and optcore-fp16 (public as ``optcore.plugin.by_device_and_dtype``
and ``optcore.plugin.total_grad_norm``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor


def params_with_grad(groups: Iterable[Mapping[str, Any]]) -> list[Tensor]:
    return [p for g in groups for p in g["params"] if p.grad is not None]


def by_device_and_dtype(tensors: Iterable[Tensor]) -> dict[tuple[torch.device, torch.dtype], list[Tensor]]:
    buckets: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for t in tensors:
        buckets.setdefault((t.device, t.dtype), []).append(t)
    return buckets


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

