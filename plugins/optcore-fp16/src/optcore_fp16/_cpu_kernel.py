"""One pass from fp16 gradients to unscaled fp32 master gradients, on CPU.

FP16Optimizer needs three things from the fp16 gradients before the inner step:
an fp32 copy, the loss scale divided out, and to know whether any is inf/NaN.
As torch ops that is three passes over memory (copy, check, multiply — or a
check plus the fused optimizer writing the unscaled gradient back); this plain C
kernel reads each fp16 gradient once and writes its fp32 value once, so the
wrapper costs what a hand-written master-copy loop costs. The half-to-float
conversion is integer arithmetic (no F16C needed, subnormals renormalised
without denormal arithmetic), which the compiler vectorises.

Built with the system C compiler on first use and cached (``$OPTCORE_CACHE_DIR``,
else ``~/.cache/optcore``); loaded with :mod:`ctypes` (the GIL is released during
the call); OpenMP threads follow ``torch.get_num_threads()``. Where no compiler
works, :func:`load` returns ``None`` with the reason in :data:`unavailable_reason`,
and the wrapper uses torch ops instead.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
from pathlib import Path

import torch
from torch import Tensor

from optcore.kernels import build_c_library, pointer_problem

#: The kernel's C source, shipped in the package (package data).
SOURCE = Path(__file__).parent / "csrc" / "fp16_grads.c"

_PARALLEL_MIN = 1 << 16  # elements below which one thread is faster than waking more

#: Why the kernel could not be built, once :func:`load` has failed.
unavailable_reason: str | None = None

#: Set to False to make FP16Optimizer use torch ops (tests, benchmarks).
enabled = True


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel (built and cached on first call), or ``None``."""
    global unavailable_reason
    if os.environ.get("OPTCORE_FP16_DISABLE_KERNEL", "").strip() not in {"", "0"}:
        unavailable_reason = "disabled by OPTCORE_FP16_DISABLE_KERNEL"
        return None
    base = [["-fopenmp"], ["-Wno-unknown-pragmas"]]
    # the F16C build only where this CPU runs it (the cache key has the flags)
    candidates = [[*f, "-mavx2", "-mf16c"] for f in base] if _has_f16c() else []
    lib, unavailable_reason = build_c_library("fp16_grads", [SOURCE], candidates + base)
    if lib is not None:
        P = ctypes.POINTER(ctypes.c_void_p)
        lib.half_to_float_scaled.argtypes = [
            ctypes.c_int64,
            P,
            P,
            ctypes.POINTER(ctypes.c_int64),
            ctypes.c_float,
            ctypes.c_int,
        ]
        lib.half_to_float_scaled.restype = ctypes.c_int
    return lib


def available() -> bool:
    """Whether FP16Optimizer may use the kernel (enabled, and it builds)."""
    return enabled and load() is not None


def _has_f16c() -> bool:
    if platform.machine().lower() not in {"x86_64", "amd64"}:
        return False
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - older torch: be conservative
        return False
    return capability in {"AVX2", "AVX512"}  # every AVX2 CPU has F16C


def _tensor_problem(t: Tensor | None, dtype: torch.dtype) -> str | None:
    """Why the kernel cannot read or write ``t`` as ``dtype``, or ``None``."""
    return pointer_problem(t, dtype)


def problem(srcs: list[Tensor | None], dsts: list[Tensor]) -> str | None:
    """Why the kernel cannot take these pairs, or ``None``: every source must be
    a plain contiguous fp16 CPU tensor with storage behind it, every destination
    the same in fp32, and each pair of the same shape (the kernel reads and
    writes ``numel(src)`` elements)."""
    if len(srcs) != len(dsts):
        return f"{len(srcs)} sources but {len(dsts)} destinations"
    for i, (s, d) in enumerate(zip(srcs, dsts)):
        for role, t, dtype in (("source", s, torch.float16), ("destination", d, torch.float32)):
            why = _tensor_problem(t, dtype)
            if why:
                return f"the {role} of pair {i} {why}"
        if s.shape != d.shape:  # type: ignore[union-attr]
            return f"pair {i} has source shape {tuple(s.shape)} and destination shape {tuple(d.shape)}"  # type: ignore[union-attr]
    return None


def eligible(srcs: list[Tensor | None], dsts: list[Tensor]) -> bool:
    """True if the kernel can take these pairs (see :func:`problem`)."""
    return problem(srcs, dsts) is None


def half_to_float_scaled_(srcs: list[Tensor], dsts: list[Tensor], scale: float) -> bool:
    """``dst.copy_(src).mul_(scale)`` for each pair, in one pass; True if any
    source holds an inf or a NaN. Every pair is checked first (``ValueError``
    unless :func:`eligible`): the kernel never runs on tensors it did not check."""
    why = problem(srcs, dsts)  # type: ignore[arg-type]
    if why:
        raise ValueError(f"fp16 gradient kernel: {why}")
    lib = load()
    if lib is None:
        raise RuntimeError(f"the fp16 gradient kernel is unavailable: {unavailable_reason}")
    n = len(srcs)
    if n == 0:
        return False
    src_ptrs = (ctypes.c_void_p * n)(*[t.data_ptr() for t in srcs])
    dst_ptrs = (ctypes.c_void_p * n)(*[t.data_ptr() for t in dsts])
    sizes = [t.numel() for t in srcs]
    threads = torch.get_num_threads() if sum(sizes) >= _PARALLEL_MIN else 1
    return bool(lib.half_to_float_scaled(n, src_ptrs, dst_ptrs, (ctypes.c_int64 * n)(*sizes), float(scale), threads))
