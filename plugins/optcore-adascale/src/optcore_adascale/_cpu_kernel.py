"""One pass over a gradient and ``.grad`` in the last of two backward passes.

With two accumulated gradients in one process, the hook of the second backward
pass needs ``|g|^2`` (a sample), ``|.grad|^2`` (the first sample, deferred from
the first pass) and ``<.grad, g>`` (so ``|.grad + g|^2``, the step's ``|g|^2``,
is known without reading ``.grad`` again). Three torch reductions would read
the two tensors four times; this C kernel reads each once, which is the floor
of one gradient read per backward pass. fp32 sums run in 16 float lanes per
1024-element block (vectorised) and are added up in double; fp64 sums in double.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch
from torch import Tensor

from optcore.kernels import build_c_library

SOURCE = r"""
#include <stdint.h>
#define BLOCK 1024

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float* p) { v8 v; __builtin_memcpy(&v, p, sizeof v); return v; }

void adascale_sums_f32(const float* restrict g, const float* restrict h, int64_t n, int first, double* restrict out) {
  double gg = 0, hh = 0, gh = 0;
  int64_t i = 0;
  for (; i + BLOCK <= n; i += BLOCK) {
    v8 a0 = {0}, a1 = {0}, b0 = {0}, b1 = {0}, c0 = {0}, c1 = {0};
    for (int64_t j = i; j < i + BLOCK; j += 16) {
      v8 x0 = load8(g + j), x1 = load8(g + j + 8), y0 = load8(h + j), y1 = load8(h + j + 8);
      a0 += x0 * x0; a1 += x1 * x1; b0 += y0 * y0; b1 += y1 * y1; c0 += x0 * y0; c1 += x1 * y1;
    }
    for (int k = 0; k < 8; ++k) { gg += a0[k] + a1[k]; hh += b0[k] + b1[k]; gh += c0[k] + c1[k]; }
  }
  for (; i < n; ++i) { double x = g[i], y = h[i]; gg += x * x; hh += y * y; gh += x * y; }
  out[0] += first ? gg + hh : gg; out[1] += gg + hh + 2 * gh;
}

void adascale_sums_f64(const double* restrict g, const double* restrict h, int64_t n, int first,
                       double* restrict out) {
  double gg = 0, hh = 0, gh = 0;
  for (int64_t i = 0; i < n; ++i) { double x = g[i], y = h[i]; gg += x * x; hh += y * y; gh += x * y; }
  out[0] += first ? gg + hh : gg; out[1] += gg + hh + 2 * gh;
}
"""

#: Why the kernel could not be built, once :func:`load` has failed.
unavailable_reason: str | None = None


@functools.lru_cache(maxsize=None)
def load() -> ctypes.CDLL | None:
    """The compiled kernel (built and cached on first call), or ``None``
    (no C compiler, or ``OPTCORE_ADASCALE_KERNEL=0``)."""
    global unavailable_reason
    if os.environ.get("OPTCORE_ADASCALE_KERNEL", "1") == "0":
        unavailable_reason = "disabled by OPTCORE_ADASCALE_KERNEL=0"
        return None
    base = ("-O3", "-shared", "-fPIC")
    lib, unavailable_reason = build_c_library("adascale_sums", SOURCE, (base + ("-march=native",), base))
    if lib is not None:
        for name in ("adascale_sums_f32", "adascale_sums_f64"):
            fn = getattr(lib, name)
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p]
            fn.restype = None
    return lib


def eligible(g: Tensor, h: Tensor) -> bool:
    """Whether the kernel takes ``g`` and ``h``: dense contiguous CPU tensors of
    one dtype, fp32 or fp64, of the same size."""
    return (
        g.device.type == "cpu" and h.device.type == "cpu" and g.dtype == h.dtype
        and g.dtype in (torch.float32, torch.float64) and g.numel() == h.numel()
        and g.is_contiguous() and h.is_contiguous() and not g.is_sparse and not h.is_sparse
    ) and load() is not None


def add_sums(g: Tensor, h: Tensor, first: bool, out: Tensor, row: int) -> None:
    """``out[row] += [|g|^2 (+ |h|^2 if first), |g + h|^2]`` in float64, one pass
    over each of ``g`` (this pass's gradient) and ``h`` (``.grad`` so far; with
    ``first`` it is the first pass's gradient, whose ``|h|^2`` is a sample too).
    ``out`` is a contiguous CPU float64 tensor of shape ``(rows, 2)``."""
    lib = load()
    assert lib is not None
    fn = lib.adascale_sums_f32 if g.dtype == torch.float32 else lib.adascale_sums_f64
    fn(g.data_ptr(), h.data_ptr(), g.numel(), int(first), out.data_ptr() + 16 * row)
