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

import torch
from torch import Tensor

from optcore.kernels import build_c_library, pointer_problem

SOURCE = r"""
#include <stdint.h>
#include <string.h>

static inline float as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t as_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* d[i] = float(s[i]) * scale; nonzero if any s[i] is inf or NaN. Branch-free, so it vectorises. */
static uint32_t convert_portable(const uint16_t *restrict s, float *restrict d, int64_t len, float scale) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < len; ++i) {
    uint32_t h = s[i];
    uint32_t em = (h & 0x7fffu) << 13;                      /* exponent and mantissa, float position */
    uint32_t exp = em & 0x0f800000u;
    uint32_t special = 0u - (uint32_t)(exp == 0x0f800000u); /* inf/NaN: all-ones mask */
    uint32_t small = 0u - (uint32_t)(exp == 0u);            /* zero/subnormal: all-ones mask */
    uint32_t u = em + (112u << 23) + (special & (112u << 23)) + (small & (1u << 23));
    float f = as_float(u) - as_float(small & (113u << 23)); /* renormalise subnormals */
    d[i] = as_float(as_bits(f) | ((h & 0x8000u) << 16)) * scale;
    bad |= special;
  }
  return bad;
}

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
/* The same with the x86 F16C conversion instruction, 8 values at a time. */
static uint32_t convert(const uint16_t *restrict s, float *restrict d, int64_t len, float scale) {
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m128i exp_mask = _mm_set1_epi16(0x7c00);
  __m128i special = _mm_setzero_si128();
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    __m128i h = _mm_loadu_si128((const __m128i *)(s + i));
    _mm256_storeu_ps(d + i, _mm256_mul_ps(_mm256_cvtph_ps(h), vscale));
    special = _mm_or_si128(special, _mm_cmpeq_epi16(_mm_and_si128(h, exp_mask), exp_mask));
  }
  uint32_t bad = (uint32_t)_mm_movemask_epi8(special);
  return bad | convert_portable(s + i, d + i, len - i, scale);
}
#else
#define convert convert_portable
#endif

#define CHUNK 16384

/* dst[t] = float(src[t]) * scale over n fp16 tensors; returns 1 if any source is inf or NaN. */
int half_to_float_scaled(int64_t n, const uint16_t *const *src, float *const *dst, const int64_t *numel,
                         float scale, int threads) {
  uint32_t bad = 0;
#pragma omp parallel num_threads(threads) reduction(| : bad)
  for (int64_t t = 0; t < n; ++t) {
    int64_t chunks = (numel[t] + CHUNK - 1) / CHUNK;
#pragma omp for schedule(static) nowait
    for (int64_t c = 0; c < chunks; ++c) {
      int64_t start = c * CHUNK, len = numel[t] - start < CHUNK ? numel[t] - start : CHUNK;
      bad |= convert(src[t] + start, dst[t] + start, len, scale);
    }
  }
  return bad != 0;
}
"""

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
    base = [["-O3", "-shared", "-fPIC", "-fopenmp"], ["-O3", "-shared", "-fPIC"]]
    # the F16C build only where this CPU runs it (the cache key has the flags)
    candidates = [[*f, "-mavx2", "-mf16c"] for f in base] if _has_f16c() else []
    lib, unavailable_reason = build_c_library("fp16_grads", SOURCE, candidates + base)
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
