"""Gradient arithmetic in torch's ``_foreach_`` units: tensors bucketed by
(device, dtype), and the total 2-norm of many gradients.

Its own module because three places share it and none owns it: the contract's
``multiply_grads``/``clip_grad_norm``, ``average_params``' flat buffers, and
the precision wrappers of optcore-fp16 (public as ``optcore.by_device_and_dtype``
and ``optcore.total_grad_norm``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor


def params_with_grad(groups: Iterable[Mapping[str, Any]]) -> list[Tensor]:
    """The parameters of ``groups`` that have a gradient."""
    return [p for g in groups for p in g["params"] if p.grad is not None]


def by_device_and_dtype(tensors: Iterable[Tensor]) -> dict[tuple[torch.device, torch.dtype], list[Tensor]]:
    """Tensors bucketed by (device, dtype): the unit of torch's ``_foreach_`` ops."""
    buckets: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for t in tensors:
        buckets.setdefault((t.device, t.dtype), []).append(t)
    return buckets


def total_grad_norm(grads: Sequence[Tensor]) -> Tensor:
    """The 2-norm of all ``grads`` together, one fused call per bucket.

    Accumulated in at least fp32 (an fp16 grad whose norm exceeds 65504 is not
    an overflow) and in the grads' own precision when higher: fp64 grads get an
    fp64 norm, as ``torch.nn.utils.get_total_norm`` gives; complex grads are
    normed in their own precision, as torch does."""
    if not grads:
        return torch.zeros(())
    norms = []
    for (_, dtype), bucket in by_device_and_dtype(grads).items():
        if dtype.is_floating_point:
            per_tensor = torch._foreach_norm(bucket, 2.0, dtype=torch.promote_types(dtype, torch.float32))
        else:
            per_tensor = torch._foreach_norm(bucket, 2.0)
        norms.append(torch.linalg.vector_norm(torch.stack(per_tensor), 2.0))
    first = norms[0].device
    dtype = functools.reduce(torch.promote_types, (n.dtype for n in norms))
    return torch.linalg.vector_norm(torch.stack([n.to(first, dtype) for n in norms]), 2.0)

