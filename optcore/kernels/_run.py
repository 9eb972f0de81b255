"""``run_kernel``: the one way a plugin calls its C code, so that a step can be
predicted as well as run.

``optcore memory`` predicts a step by running it on the meta device, where
tensors have shapes and no data. A plugin's C kernel cannot run there, and
its own memory (``malloc`` inside C) is invisible to torch. So a kernel call
goes through :func:`run_kernel`, which says how many bytes of scratch the
call holds while it runs (the kernel's own declaration), tells whoever is
counting (:func:`counting_scratch`), and, within :func:`predicting`, skips
the call: a prediction then takes the path a CPU step takes, kernel
included, rather than the torch ops a meta tensor would otherwise fall
back to. Within :func:`predicting`, :func:`~optcore.kernels.pointer_problem`
takes a meta tensor where it would take the same tensor on the CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")

_predicting: ContextVar[bool] = ContextVar("optcore_kernels_predicting", default=False)
_counters: ContextVar[tuple[Callable[[int], None], ...]] = ContextVar("optcore_kernels_counters", default=())


@contextlib.contextmanager
def predicting() -> Iterator[None]:
    """A step on the meta device stands for the same step on the CPU: kernels
    accept meta tensors, declare their scratch and do not run."""
    token = _predicting.set(True)
    try:
        yield
    finally:
        _predicting.reset(token)


def is_predicting() -> bool:
    """Whether the current step is a prediction (see :func:`predicting`)."""
    return _predicting.get()


@contextlib.contextmanager
def counting_scratch(count: Callable[[int], None]) -> Iterator[None]:
    """Within it, every :func:`run_kernel` call reports its scratch bytes to
    ``count`` before it runs (or would run)."""
    token = _counters.set((*_counters.get(), count))
    try:
        yield
    finally:
        _counters.reset(token)


def run_kernel(call: Callable[[], T], *, scratch: int | Callable[[], int] = 0) -> T | None:
    """``call()`` (the C function with its arguments bound), which holds
    ``scratch`` bytes of memory of its own while it runs; ``None`` without
    calling it within :func:`predicting`. ``scratch`` is the kernel's own
    account of what it allocates, as its source computes it: a prediction
    and a measured step both count it, so the two agree only when both take
    the kernel. A callable is asked only while something counts, so that a
    training step pays nothing for the account."""
    counters = _counters.get()
    if counters:
        nbytes = scratch() if callable(scratch) else scratch
        if nbytes < 0:
            raise ValueError(f"run_kernel: scratch is {nbytes} bytes; give the bytes the kernel allocates (0 or more)")
        for count in counters:
            count(nbytes)
    if _predicting.get():
        return None
    return call()
