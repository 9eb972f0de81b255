"""The two passes of a factored step as plain C loops, for fp32 CPU matrices.

Written with torch ops (:mod:`optcore_adafactor._kernels`), the statistics
pass costs three times the memory traffic it needs: the CPU spends its time on
a square, two matrix-vector products and a fused square-and-sum over each
chunk. These loops read G once for the statistics and read G and X (and M)
once, writing X (and M) once, for the update: the step then runs at the memory
bandwidth. They need no torch headers, so the system C compiler builds them in
well under a second on first use; the library is cached
(``$OPTCORE_CACHE_DIR``, else ``~/.cache/optcore``) and called through
:mod:`ctypes`, which releases the GIL. OpenMP threads follow
``torch.get_num_threads()``.

Where no compiler works, or with ``OPTCORE_ADAFACTOR_KERNEL=0``, :func:`load`
returns ``None`` (the reason is in :data:`unavailable_reason`) and the torch
path runs; both give the same numbers (tested).
"""

from __future__ import annotations

import ctypes

from optcore.kernels import build_c_library
import functools
import os

import torch
from torch import Tensor

SOURCE = r"""
#include <stdint.h>
#include <string.h>

/* One build runs everywhere: the loader picks the widest vector unit the CPU has. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(NO_CLONES)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

/* Statistics pass over an n x m gradient g (the scale folded into a):
     row[i] = beta row[i] + a sum_j g[i,j]^2 + b
     col_sq[j] = sum_i g[i,j]^2,   col_w[j] = sum_i g[i,j]^2 / row[i]
   part: threads x 2 x m floats for per-thread partial sums, added up in
   thread order afterwards (so the result does not depend on timing). */
CLONES void adafactor_stats(int64_t n, int64_t m, const float *g, float *row, float *col_sq, float *col_w,
                            float *part, float beta, float a, float b, int threads) {
  memset(part, 0, (int64_t)threads * 2 * m * sizeof(float));
#pragma omp parallel num_threads(threads)
  {
    int t = 0;
#ifdef _OPENMP
    t = omp_get_thread_num();
#endif
    float *sq = part + (int64_t)t * 2 * m, *w = sq + m;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float *gi = g + i * m;
      double s = 0.0;
#pragma omp simd reduction(+:s)
      for (int64_t j = 0; j < m; ++j) s += (double)gi[j] * gi[j];
      float r = beta * row[i] + a * (float)s + b;
      float inv = 1.0f / r;
      row[i] = r;
      for (int64_t j = 0; j < m; ++j) {
        float v = gi[j] * gi[j];
        sq[j] += v;
        w[j] += v * inv;
      }
    }
  }
  memset(col_sq, 0, m * sizeof(float));
  memset(col_w, 0, m * sizeof(float));
  for (int t = 0; t < threads; ++t) {
    const float *sq = part + (int64_t)t * 2 * m, *w = sq + m;
    for (int64_t j = 0; j < m; ++j) {
      col_sq[j] += sq[j];
      col_w[j] += w[j];
    }
  }
}

/* Update pass: u = g[i,j] c[j] r[i] (r carries the step size and sign), then
     x -= decay x;  x += u                                  (mom == 0), or
     mom = beta1 mom + u;  x -= decay x;  x -= mom          (r carries (1 - beta1) lr). */
CLONES void adafactor_apply(int64_t n, int64_t m, float *x, const float *g, float *mom, const float *r,
                     const float *c, float decay, float beta1, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float *xi = x + i * m;
    const float *gi = g + i * m;
    const float ri = r[i];
    if (mom) {
      float *mi = mom + i * m;
      for (int64_t j = 0; j < m; ++j) {
        mi[j] = beta1 * mi[j] + gi[j] * c[j] * ri;
        xi[j] = (xi[j] - decay * xi[j]) - mi[j];
      }
    } else {
      for (int64_t j = 0; j < m; ++j) xi[j] = (xi[j] - decay * xi[j]) + gi[j] * c[j] * ri;
    }
  }
}
"""

_HEADER = "#ifdef _OPENMP\n#include <omp.h>\n#endif\n"

#: Why the kernel could not be built, once :func:`load` has failed.
unavailable_reason: str | None = None


@functools.lru_cache(maxsize=None)
def load() -> ctypes.CDLL | None:
    """The compiled kernels (built and cached on first call), or ``None``."""
    global unavailable_reason
    if os.environ.get("OPTCORE_ADAFACTOR_KERNEL", "1") == "0":
        unavailable_reason = "disabled by OPTCORE_ADAFACTOR_KERNEL=0"
        return None
    base = ["-O3", "-shared", "-fPIC"]
    flag_sets = (base + ["-fopenmp"], base + ["-fopenmp", "-DNO_CLONES"], base + ["-DNO_CLONES"])
    lib, unavailable_reason = build_c_library("adafactor_fp32", _HEADER + SOURCE, flag_sets)
    if lib is not None:
        i64, f, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
        lib.adafactor_stats.argtypes = [i64, i64, ptr, ptr, ptr, ptr, ptr, f, f, f, ctypes.c_int]
        lib.adafactor_stats.restype = None
        lib.adafactor_apply.argtypes = [i64, i64, ptr, ptr, ptr, ptr, ptr, f, f, ctypes.c_int]
        lib.adafactor_apply.restype = None
    return lib


def _plain_cpu_fp32(t: Tensor) -> bool:
    """A plain strided fp32 CPU tensor: not a subclass (FakeTensor,
    FunctionalTensor, DTensor, ...), whose pointer would not be real memory."""
    return (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.device.type == "cpu"
        and t.dtype == torch.float32
        and t.layout == torch.strided
    )


def eligible(*tensors: Tensor | None) -> bool:
    """Whether the kernels take these tensors (fp32 contiguous CPU matrices,
    ``None`` for an absent one) and are built. Never while torch.compile traces:
    the tensors are then stand-ins without memory, so the traceable torch ops
    must run instead."""
    if torch.compiler.is_compiling():
        return False
    return all(t is None or (_plain_cpu_fp32(t) and t.dim() == 2 and t.is_contiguous()) for t in tensors) and (
        load() is not None
    )


def _threads(n: int) -> int:
    return max(1, min(torch.get_num_threads(), n))


def _require(name: str, t: Tensor | None, shape: tuple[int, ...]) -> int:
    """Check ``t`` before its pointer goes to C, and return that pointer.

    The loops trust the sizes they are given, so everything they touch is
    checked here: a plain fp32 CPU tensor, contiguous, of exactly ``shape``,
    with a storage that holds all of it. A mismatch raises instead of letting
    the loops read or write out of bounds."""
    if t is None:
        raise ValueError(f"Adafactor C kernel: {name} is missing.")
    if torch.compiler.is_compiling():
        raise RuntimeError(
            "Adafactor C kernel called under torch.compile: it runs on real memory only (eager). "
            "This is a bug in optcore-adafactor's dispatch; set implementation='torch' to work around it."
        )
    if not _plain_cpu_fp32(t):
        raise ValueError(
            f"Adafactor C kernel: {name} must be a plain float32 CPU tensor, got "
            f"{type(t).__name__} of dtype {t.dtype} on {t.device}."
        )
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"Adafactor C kernel: {name} has shape {tuple(t.shape)}, expected {tuple(shape)}.")
    if not t.is_contiguous():
        raise ValueError(f"Adafactor C kernel: {name} must be contiguous (strides {t.stride()}).")
    needed = (t.storage_offset() + t.numel()) * t.element_size()
    storage = t.untyped_storage()
    if t.numel() and (t.data_ptr() == 0 or storage.nbytes() < needed):
        raise ValueError(
            f"Adafactor C kernel: {name} has no memory behind it ({storage.nbytes()} bytes of storage "
            f"for {needed} needed)."
        )
    return t.data_ptr()


def stats_(grad: Tensor, row: Tensor, *, beta: float, a: float, b: float) -> tuple[Tensor, Tensor]:
    """R <- beta R + a rowsum(G²) + b in place; returns colsum(G²), colsum(G² / R)."""
    lib = load()
    if lib is None:
        raise RuntimeError(f"Adafactor C kernel unavailable: {unavailable_reason}")
    if grad.dim() != 2:
        raise ValueError(f"Adafactor C kernel: grad must be a matrix, got shape {tuple(grad.shape)}.")
    n, m = grad.shape
    threads = _threads(n)
    col_sq, col_w = torch.empty(m), torch.empty(m)
    part = torch.empty(threads, 2, m)
    ptrs = [
        _require("grad", grad, (n, m)), _require("exp_avg_sq_row", row, (n,)),
        _require("col_sq", col_sq, (m,)), _require("col_w", col_w, (m,)), _require("part", part, (threads, 2, m)),
    ]
    lib.adafactor_stats(n, m, *ptrs, beta, a, b, threads)
    return col_sq, col_w


def apply_(param: Tensor, grad: Tensor, exp_avg: Tensor | None, r: Tensor, c: Tensor, *, decay: float, beta1: float) -> None:
    """X <- X - decay X + G * (r ⊗ c), or through the first moment (see SOURCE)."""
    lib = load()
    if lib is None:
        raise RuntimeError(f"Adafactor C kernel unavailable: {unavailable_reason}")
    if param.dim() != 2:
        raise ValueError(f"Adafactor C kernel: param must be a matrix, got shape {tuple(param.shape)}.")
    n, m = param.shape
    r, c = r.contiguous(), c.contiguous()
    x_ptr, g_ptr = _require("param", param, (n, m)), _require("grad", grad, (n, m))
    mom_ptr = _require("exp_avg", exp_avg, (n, m)) if exp_avg is not None else None
    r_ptr, c_ptr = _require("row factor", r, (n,)), _require("column factor", c, (m,))
    lib.adafactor_apply(n, m, x_ptr, g_ptr, mom_ptr, r_ptr, c_ptr, decay, beta1, _threads(n))
