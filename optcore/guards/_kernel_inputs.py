"""The tensors torch's fused optimizer kernels are handed, judged first.

``torch._fused_adamw_`` and its kind take each tensor's data pointer and
write as many elements as the parameter has, without checking the others: a
parameter whose ``.data`` was replaced by a smaller tensor, a storage resized
to nothing, or a state tensor swapped for one of another size corrupts the
heap instead of raising. optcore picks these kernels by default, so it checks
what they would not, from metadata only (shape, dtype, device, storage size):
no tensor is read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from .._errors import StepError
from ..kernels import is_predicting

_PLAIN = (Tensor, torch.nn.Parameter)


def check_fused_inputs(param_groups: Iterable[Mapping[str, Any]], state: Mapping[Any, Any]) -> None:
    """A :class:`~optcore.StepError` naming the first tensor of a ``fused`` group
    that the kernel would read or write out of bounds, or that holds no data
    (``meta``), before anything is written.
    A few attribute reads per tensor (its size in bytes, dtype, device and
    storage; the kernel walks the parameter's element count through each, so
    these decide whether it stays inside them): this runs before every fused
    step, and a message is made only for a tensor that fails."""
    for g, group in enumerate(param_groups):
        if not group.get("fused"):
            continue
        for i, p in enumerate(group["params"]):
            grad = p.grad
            if grad is None or type(p) not in _PLAIN:
                continue
            size, dtype, device = p.nbytes, p.dtype, p.get_device()
            problem = None if _fits(p) else _storage_problem(p, "the parameter")
            if problem is None and p.is_meta and not is_predicting():  # a prediction steps meta tensors
                problem = "the parameter is a meta tensor, which holds no values"
            if problem is None and (grad.nbytes != size or grad.dtype is not dtype or grad.get_device() != device or not _fits(grad)):
                problem = _problem(grad, p, "its gradient")
            entry = state.get(p) if problem is None else None
            for key, value in entry.items() if entry else ():
                if not isinstance(value, Tensor):
                    continue
                if key == "step":
                    if value.numel() != 1 or not _fits(value):
                        problem = f"its step count is a tensor of shape {tuple(value.shape)}, not one number"
                elif value.nbytes != size or value.dtype is not dtype or value.get_device() != device or not _fits(value):
                    problem = _problem(value, p, f"its state {key!r}")
                elif value.is_meta and not p.is_meta:
                    problem = f"its state {key!r} is a meta tensor, which holds no values"
                if problem:
                    break
            if problem:
                raise StepError(
                    f"Cannot step param group {g}, parameter {i} (shape {tuple(p.shape)}): {problem}. torch's fused "
                    "kernel would read and write past it. Change a parameter through its values (p.data.copy_(...)) "
                    "rather than replacing p.data, and build a new optimizer after resizing a model or editing "
                    "optimizer.state.",
                    param=f"param_groups[{g}].params[{i}]",
                )


def _problem(t: Tensor, p: Tensor, what: str) -> str:
    """What is wrong with ``t``, a tensor the fast test refused."""
    if t.shape != p.shape:
        return f"{what} has shape {tuple(t.shape)}, the parameter {tuple(p.shape)}"
    if t.dtype is not p.dtype or t.get_device() != p.get_device():
        return f"{what} is {t.dtype} on {t.device}, the parameter {p.dtype} on {p.device}"
    return _storage_problem(t, what)


def _storage_problem(t: Tensor, what: str) -> str:
    return f"{what} has shape {tuple(t.shape)} but its storage holds only {t.untyped_storage().nbytes()} bytes"


def _fits(t: Tensor) -> bool:
    """Whether ``t``'s storage holds every element its shape, strides and
    offset reach, also when a kernel walks it as ``numel`` contiguous elements."""
    size = t.nbytes
    if not size:
        return True
    offset = t.storage_offset()
    if t.is_contiguous():
        return t.untyped_storage().nbytes() >= (size + offset * t.element_size() if offset else size)
    extent = 1 + sum((n - 1) * stride for n, stride in zip(t.shape, t.stride()))
    return t.untyped_storage().nbytes() >= max(size, extent * t.element_size()) + offset * t.element_size()
