"""Adafactor's step as plain C loops, for fp32 CPU tensors.

Written with torch ops (:mod:`optcore_adafactor._kernels`), the statistics
pass costs three times the memory traffic it needs, and the dozen small ops
around it (row mean, factors, RMS(U), RMS(p), ...) cost more than the passes
on small tensors. ``adafactor_step`` does the whole step of a matrix in one
call: one pass reading G (and X, for RMS(X)) for the statistics, the O(n + m)
work, and one pass reading G and X (and M) and writing X (and M).
``adafactor_vector_step`` does the same for a vector (full second moment).
They need no torch headers, so the system C compiler builds them in well
under a second on first use; the library is cached (``$OPTCORE_CACHE_DIR``,
else ``~/.cache/optcore``) and called through :mod:`ctypes`, which releases
the GIL. OpenMP threads follow ``torch.get_num_threads()``.

The loops trust the sizes they get, so every tensor is checked before its
pointer goes to C (:func:`_require`: plain fp32 CPU tensor, exact shape,
contiguous, storage large enough), and nothing runs while torch.compile
traces (the tensors are then stand-ins without memory).

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

/* The whole factored step of an n x m fp32 matrix in two passes (one call):
   pass 1 reads g (and x, for RMS(x) with scale_parameter) and updates row,
   summing the columns of g^2 and g^2/row per thread into part (threads x 2 x m);
   then the small vectors: col, the factors r (into rbuf, n) and c (into part),
   RMS(U) from the column sums (see _kernels), the step size;
   pass 2: x (and mom) updated from g, r and c.
   in:  f[0..10] = beta2t, inv_s2, eps1, eps2, rho, clip, beta1, wd, inv_scale
   out: out[0] = RMS(x) before the step, out[1] = step size, out[2] = RMS(U). */
CLONES void adafactor_step(int64_t n, int64_t m, float *x, const float *g, float *mom, float *row, float *col,
                           float *part, float *rbuf, const float *f, int scale_parameter, double *out, int threads) {
  const float beta2t = f[0], inv_s2 = f[1], eps1 = f[2], eps2 = f[3], rho = f[4], clip = f[5], beta1 = f[6],
              wd = f[7], inv_scale = f[8];
  const float a = (1.0f - beta2t) * inv_s2 / (float)m, b = (1.0f - beta2t) * eps1;
  double xsq = 0.0;
  memset(part, 0, (int64_t)threads * 2 * m * sizeof(float));
#pragma omp parallel num_threads(threads) reduction(+:xsq)
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
      if (scale_parameter) {
        const float *xi = x + i * m;
        double q = 0.0;
#pragma omp simd reduction(+:q)
        for (int64_t j = 0; j < m; ++j) q += (double)xi[j] * xi[j];
        xsq += q;
      }
      float r = beta2t * row[i] + a * (float)s + b;
      float inv = 1.0f / r;
      row[i] = r;
      for (int64_t j = 0; j < m; ++j) {
        float v = gi[j] * gi[j];
        sq[j] += v;
        w[j] += v * inv;
      }
    }
  }
  /* column statistics, RMS(U) and the factors (O(n + m)) */
  for (int tt = 1; tt < threads; ++tt) {
    const float *sq = part + (int64_t)tt * 2 * m, *w = sq + m;
    for (int64_t j = 0; j < m; ++j) {
      part[j] += sq[j];
      part[m + j] += w[j];
    }
  }
  const float ac = (1.0f - beta2t) * inv_s2 / (float)n;
  double row_sum = 0.0, wsum = 0.0;
  for (int64_t i = 0; i < n; ++i) row_sum += row[i];
  const float row_mean = (float)(row_sum / (double)n);
  for (int64_t j = 0; j < m; ++j) {
    float cj = beta2t * col[j] + ac * part[j] + b;
    col[j] = cj;
    wsum += (double)part[m + j] / cj;
    part[j] = 1.0f / sqrtf(cj); /* c_j */
  }
  const double rms_u = sqrt(wsum * row_mean * inv_s2 / ((double)n * (double)m));
  const double rms_x = sqrt(xsq / ((double)n * (double)m));
  const double step = scale_parameter ? (rms_x > eps2 ? rms_x : eps2) * rho : rho;
  const double lr = step / (rms_u / clip > 1.0 ? rms_u / clip : 1.0) * inv_scale;
  const float rs = mom ? (float)((1.0 - beta1) * lr) : (float)(-lr);
  for (int64_t i = 0; i < n; ++i) rbuf[i] = rs / sqrtf(row[i] / row_mean);
  out[0] = rms_x;
  out[1] = step;
  out[2] = rms_u;
  adafactor_apply(n, m, x, g, mom, rbuf, part, (float)(wd * step), beta1, threads);
}

/* The whole step of an fp32 vector (full second moment v, Algorithm 5), two
   passes, for the many small bias and norm vectors a model has (one call
   instead of a dozen torch ops). f and out as for adafactor_step. */
CLONES void adafactor_vector_step(int64_t n, float *x, const float *g, float *mom, float *v, const float *f,
                                  int scale_parameter, double *out) {
  const float beta2t = f[0], eps1 = f[2], eps2 = f[3], rho = f[4], clip = f[5], beta1 = f[6], wd = f[7],
              inv_scale = f[8];
  double usq = 0.0, xsq = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    float gj = g[j] * inv_scale;
    float vj = beta2t * v[j] + (1.0f - beta2t) * (gj * gj + eps1);
    v[j] = vj;
    usq += (double)(gj * gj) / vj;
    xsq += (double)x[j] * x[j];
  }
  const double rms_u = sqrt(usq / (double)n), rms_x = sqrt(xsq / (double)n);
  const double step = scale_parameter ? (rms_x > eps2 ? rms_x : eps2) * rho : rho;
  const float lr = (float)(step / (rms_u / clip > 1.0 ? rms_u / clip : 1.0));
  const float decay = (float)(wd * step);
  for (int64_t j = 0; j < n; ++j) {
    float u = g[j] * inv_scale / sqrtf(v[j]) * lr;
    float xj = x[j] - decay * x[j];
    if (mom) {
      mom[j] = beta1 * mom[j] + (1.0f - beta1) * u;
      x[j] = xj - mom[j];
    } else {
      x[j] = xj - u;
    }
  }
  out[0] = rms_x;
  out[1] = step;
  out[2] = rms_u;
}
"""

_HEADER = "#include <math.h>\n#ifdef _OPENMP\n#include <omp.h>\n#endif\n"

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
        lib.adafactor_step.argtypes = [i64, i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ctypes.c_int, ptr, ctypes.c_int]
        lib.adafactor_step.restype = None
        lib.adafactor_vector_step.argtypes = [i64, ptr, ptr, ptr, ptr, ptr, ctypes.c_int, ptr]
        lib.adafactor_vector_step.restype = None
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
    col_sq, col_w = torch.empty(m, dtype=torch.float32), torch.empty(m, dtype=torch.float32)
    part = torch.empty(threads, 2, m, dtype=torch.float32)
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


def _scalars(beta2t: float, inv_scale: float, eps1: float, eps2: float, rho: float, clip_threshold: float,
             beta1: float, weight_decay: float) -> Tensor:
    """The numbers both whole-step kernels read (``f`` in SOURCE)."""
    return torch.tensor(
        [beta2t, inv_scale * inv_scale, eps1, eps2, rho, clip_threshold, beta1, weight_decay, inv_scale], dtype=torch.float32
    )


def vector_eligible(*tensors: Tensor | None) -> bool:
    """Whether :func:`vector_step_` takes these (fp32 contiguous CPU vectors or scalars)."""
    if torch.compiler.is_compiling():
        return False
    return all(t is None or (_plain_cpu_fp32(t) and t.dim() <= 1 and t.is_contiguous()) for t in tensors) and (
        load() is not None
    )


def vector_step_(
    param: Tensor, grad: Tensor, exp_avg: Tensor | None, exp_avg_sq: Tensor, *, beta2t: float, inv_scale: float,
    eps1: float, eps2: float, rho: float, clip_threshold: float, beta1: float, weight_decay: float,
    scale_parameter: bool,
) -> tuple[float, float]:
    """One whole step of an fp32 CPU vector (``adafactor_vector_step``); returns
    ``(RMS(X) before the step, step size)``."""
    lib = load()
    if lib is None:
        raise RuntimeError(f"Adafactor C kernel unavailable: {unavailable_reason}")
    shape = tuple(param.shape)
    if len(shape) > 1:
        raise ValueError(f"Adafactor C kernel: param must be a vector, got shape {shape}.")
    scalars = _scalars(beta2t, inv_scale, eps1, eps2, rho, clip_threshold, beta1, weight_decay)
    out = torch.empty(3, dtype=torch.float64)
    ptrs = [
        _require("param", param, shape), _require("grad", grad, shape),
        _require("exp_avg", exp_avg, shape) if exp_avg is not None else None,
        _require("exp_avg_sq", exp_avg_sq, shape), _require("scalars", scalars, (9,)),
    ]
    lib.adafactor_vector_step(param.numel(), *ptrs, int(scale_parameter), out.data_ptr())
    rms_x, step_size, _ = out.tolist()
    return rms_x, step_size


def step_(
    param: Tensor, grad: Tensor, exp_avg: Tensor | None, row: Tensor, col: Tensor, *, beta2t: float, inv_scale: float,
    eps1: float, eps2: float, rho: float, clip_threshold: float, beta1: float, weight_decay: float,
    scale_parameter: bool,
) -> tuple[float, float]:
    """One whole factored step of an fp32 CPU matrix (see ``adafactor_step``):
    updates param, exp_avg, row and col in place and returns ``(RMS(X) before
    the step, step size)``. One call per matrix: no torch op in between."""
    lib = load()
    if lib is None:
        raise RuntimeError(f"Adafactor C kernel unavailable: {unavailable_reason}")
    if param.dim() != 2:
        raise ValueError(f"Adafactor C kernel: param must be a matrix, got shape {tuple(param.shape)}.")
    n, m = param.shape
    threads = _threads(n)
    # float32 whatever torch's default dtype is: the kernel reads these as float
    part, rbuf = torch.empty(threads, 2, m, dtype=torch.float32), torch.empty(n, dtype=torch.float32)
    scalars = _scalars(beta2t, inv_scale, eps1, eps2, rho, clip_threshold, beta1, weight_decay)
    out = torch.empty(3, dtype=torch.float64)
    ptrs = [
        _require("param", param, (n, m)), _require("grad", grad, (n, m)),
        _require("exp_avg", exp_avg, (n, m)) if exp_avg is not None else None,
        _require("exp_avg_sq_row", row, (n,)), _require("exp_avg_sq_col", col, (m,)),
        _require("part", part, (threads, 2, m)), _require("rbuf", rbuf, (n,)), _require("scalars", scalars, (9,)),
    ]
    if out.device.type != "cpu" or not out.is_contiguous():  # our own buffer; checked like the rest
        raise ValueError("Adafactor C kernel: bad output buffer.")
    lib.adafactor_step(n, m, *ptrs, int(scale_parameter), out.data_ptr(), threads)
    rms_x, step_size, _ = out.tolist()
    return rms_x, step_size
