"""A one-pass Lion kernel for fp32 CPU tensors: plain C, built on first use.

On CPU the Lion step is memory bound. Written as torch ops it makes six passes
over memory (one per op); this kernel reads ``p, g, m`` once and writes ``p, m``
once, which is what a step costs at the bandwidth limit. It needs no torch
headers, so the system C compiler builds it in well under a second; the shared
library is cached (``$OPTCORE_CACHE_DIR``, else ``~/.cache/optcore``) and loaded
with :mod:`ctypes`, which releases the GIL during the call. OpenMP threads
follow ``torch.get_num_threads()`` (the same ``libgomp`` torch already loaded).

Where no compiler works, :func:`load` returns ``None`` and says why in
:data:`unavailable_reason`; Lion then runs its eager path.
"""

from __future__ import annotations

import ctypes

from optcore.kernels import build_c_library
import functools

import torch
from torch import Tensor

SOURCE = r"""
#include <stdint.h>

/* Lion on n fp32 tensors in one pass; a1 = (1-beta1)*gscale, a2 = (1-beta2)*gscale. */
void lion_fp32(int64_t n, float *const *p, const float *const *g, float *const *m,
               const int64_t *numel, float lr, float decay, float beta1, float a1,
               float beta2, float a2, int threads) {
#pragma omp parallel num_threads(threads)
  for (int64_t t = 0; t < n; ++t) {
    float *pt = p[t], *mt = m[t];
    const float *gt = g[t];
#pragma omp for schedule(static) nowait
    for (int64_t i = 0; i < numel[t]; ++i) {
      float c = beta1 * mt[i] + a1 * gt[i];         /* c = b1*m + (1-b1)*g     */
      float s = (float)((c > 0.f) - (c < 0.f));     /* sign(c), 0 for 0 and NaN */
      pt[i] = pt[i] * decay - lr * s;               /* p = p*(1-lr*wd) - lr*sign(c) */
      mt[i] = beta2 * mt[i] + a2 * gt[i];           /* m = b2*m + (1-b2)*g     */
    }
  }
}
"""

_PARALLEL_MIN = 1 << 16  # elements per step below which one thread is faster

#: Why the kernel could not be built, once :func:`load` has failed.
unavailable_reason: str | None = None


@functools.lru_cache(maxsize=None)
def load() -> ctypes.CDLL | None:
    """The compiled kernel (built and cached on first call), or ``None``."""
    global unavailable_reason
    lib, unavailable_reason = build_c_library("lion_fp32", SOURCE)
    if lib is not None:
        P = ctypes.POINTER(ctypes.c_void_p)
        f = ctypes.c_float
        i64 = ctypes.c_int64
        lib.lion_fp32.argtypes = [i64, P, P, P, ctypes.POINTER(i64), f, f, f, f, f, f, ctypes.c_int]
        lib.lion_fp32.restype = None
    return lib


def eligible(*tensors: Tensor) -> bool:
    """True if the kernel can take these tensors: fp32, on CPU, contiguous."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors)


def lion_fp32_(
    params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
    *, lr: float, weight_decay: float, beta1: float, beta2: float, gscale: float,
) -> None:
    """Run the kernel over tensors that are all :func:`eligible` (in place)."""
    lib = load()
    if lib is None:
        raise RuntimeError(f"the Lion CPU kernel is unavailable: {unavailable_reason}")
    n = len(params)
    pointers = [(ctypes.c_void_p * n)(*[t.data_ptr() for t in ts]) for ts in (params, grads, exp_avgs)]
    sizes = [p.numel() for p in params]
    threads = torch.get_num_threads() if sum(sizes) >= _PARALLEL_MIN else 1  # waking threads costs more
    lib.lion_fp32(
        n, *pointers, (ctypes.c_int64 * n)(*sizes), lr, 1.0 - lr * weight_decay,
        beta1, (1.0 - beta1) * gscale, beta2, (1.0 - beta2) * gscale, threads,
    )
