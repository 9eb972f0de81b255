/* Lion's step on fp32 CPU tensors in one pass over memory (optcore_lion._cpu_kernel loads it).

   Written as torch ops the step makes six passes over memory (one per op); this
   loop reads p, g, m once and writes p, m once, the step's cost at the bandwidth
   limit. Plain C, no torch headers: optcore.kernels builds it with the system
   compiler (warnings as errors) on first use. The caller checks every tensor
   (plain fp32 CPU, contiguous, same shape) before its pointer comes here: the
   loop trusts numel. */
#include <stdint.h>

/* Lion on n fp32 tensors in one pass; a1 = (1-beta1)*gscale, a2 = (1-beta2)*gscale. */
void lion_fp32(int64_t n, float *const *p, const float *const *g, float *const *m,
               const int64_t *numel, float lr, float decay, float beta1, float a1,
               float beta2, float a2, int threads) {
  (void)threads; /* used by the OpenMP pragma only */
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
