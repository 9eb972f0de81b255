"""``pointer_problem``: may a C kernel be handed this tensor's data pointer?

Its own module because it is the one part of the kernels that needs torch
(the build itself runs without it), and because every plugin calls it on
every tensor before a pointer leaves Python.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._run import is_predicting


def pointer_problem(t: Any, dtype: Any) -> str | None:
    """Why a C kernel may not be handed ``t``'s data pointer as ``dtype``
    elements, or ``None`` when it may: a plain (not subclassed) CPU tensor of
    that dtype, contiguous, not a lazily negated/conjugated view, with an
    allocated storage that holds all of it. Kernels trust the sizes they are
    given, so every plugin checks each tensor with this before its pointer
    leaves Python (and checks shapes against each other itself).

    Within :func:`~optcore.kernels.predicting`, a meta tensor is taken where
    the same tensor on the CPU would be (it has no storage to check)."""
    import torch  # kernels are built without torch; checking a tensor needs it

    # the common case is tested first, in one expression: plugins call this for every tensor every step
    usual = (type(t) is torch.Tensor or type(t) is torch.nn.Parameter) and t.is_cpu and t.dtype == dtype \
        and t.is_contiguous() and not t.is_neg() and not t.is_conj()
    if not usual:
        if t is None:
            return "is missing"
        if type(t) not in (torch.Tensor, torch.nn.Parameter):  # DTensor, FakeTensor...: no plain memory to hand over
            return f"is a {type(t).__name__}, not a plain tensor"
        standing_in = t.is_meta and is_predicting()  # a prediction's meta tensor, judged as its CPU twin
        if t.device.type != "cpu" and not standing_in:
            return f"is on {t.device}, not the CPU"
        if t.dtype != dtype:
            return f"is {t.dtype}, not {dtype}"
        if not t.is_contiguous():
            return "is not contiguous"
        if t.is_neg() or t.is_conj():
            return "is a lazily negated or conjugated view"
        return None  # a meta tensor within predicting(): no storage to check
    if t.numel() == 0:
        return None
    try:
        storage = t.untyped_storage()
        backed = storage.data_ptr() != 0 and (t.storage_offset() + t.numel()) * t.element_size() <= storage.nbytes()
    except (RuntimeError, NotImplementedError):  # no storage at all
        backed = False
    return None if backed else "has no allocated storage of its size"


def disjoint(spans: Iterable[tuple[int, int]]) -> bool:
    """True if no two of these ``(address, bytes)`` spans share memory (address 0
    or no bytes: nothing). The test behind :func:`overlap_problem`, for a kernel
    that holds its pointers as numbers already."""
    return _first_overlap([(start, start + size, i) for i, (start, size) in enumerate(spans) if start and size]) is None


def _extent(t: Any) -> int:
    """How many elements from ``t``'s first to its last, for any strides (its
    ``numel`` when contiguous, the test kernels' inputs take)."""
    if t.is_contiguous():
        return int(t.numel())
    return 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))


def _first_overlap(spans: list[tuple[int, int, int]]) -> tuple[int, int] | None:
    """The indices of two of these ``(start, end, index)`` spans that overlap, or ``None``."""
    spans.sort()
    for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
        if start < end:  # sorted by start: any overlap shows between neighbours
            return (first, second) if first < second else (second, first)
    return None


def overlap_problem(named: dict[str, Any]) -> str | None:
    """Which two of these tensors share memory, or ``None``. Kernels take their
    pointers as ``restrict`` (no two alias, so their loops vectorize), and torch
    allows the aliasing anyway (``p.grad = p.detach()``): such tensors must go
    through torch ops, whose results are defined for it. A strided tensor spans
    the bytes from its first to its last element (two interleaved slices of one
    buffer count as sharing it). Empty tensors and ``None`` hold no memory and
    overlap nothing."""
    tensors = list(named.values())
    pair = _first_overlap([
        (t.data_ptr(), t.data_ptr() + _extent(t) * t.element_size(), i)
        for i, t in enumerate(tensors) if t is not None and t.numel()
    ])  # fmt: skip
    if pair is None:
        return None
    names = list(named)
    return f"its {names[pair[0]]} and {names[pair[1]]} share memory"
