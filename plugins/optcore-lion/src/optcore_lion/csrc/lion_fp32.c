/* Lion's step on fp32 CPU tensors in one pass over memory (optcore_lion._cpu_kernel loads it).

   Written as torch ops the step makes six passes over memory (one per op); this
   loop reads p, g, m once and writes p, m once, the step's cost at the bandwidth
   limit. Plain C, no torch headers: optcore.kernels builds it with the system
   compiler (warnings as errors) on first use. The caller checks every tensor
   (plain fp32 CPU, contiguous, same shape) before its pointer comes here: the
   loop trusts numel. */
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdint.h>

/* One build runs everywhere: the loader picks the widest vector unit the CPU has.
   Where the tensors sit in a large last-level cache, the loop's arithmetic, not
   memory, sets the pace, and 16 lanes do it in a quarter of the time of SSE's 4. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(NO_CLONES)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

/* Elements [lo, hi) of one tensor: p, g and m never overlap (restrict), so the loop vectorizes. */
CLONES static void lion_range(float *__restrict__ p, const float *__restrict__ g, float *__restrict__ m,
                              int64_t lo, int64_t hi, float lr, float decay, float beta1, float a1,
                              float beta2, float a2) {
  for (int64_t i = lo; i < hi; ++i) {
    float c = beta1 * m[i] + a1 * g[i];         /* c = b1*m + (1-b1)*g         */
    float s = (float)((c > 0.f) - (c < 0.f));   /* sign(c), 0 for 0 and NaN    */
    p[i] = p[i] * decay - lr * s;               /* p = p*(1-lr*wd) - lr*sign(c) */
    m[i] = beta2 * m[i] + a2 * g[i];            /* m = b2*m + (1-b2)*g         */
  }
}

/* Lion on n fp32 tensors in one pass; a1 = (1-beta1)*gscale, a2 = (1-beta2)*gscale.
   Each of the threads takes one contiguous slice of every tensor, a multiple of
   16 floats long, so where a tensor starts on a 64-byte line no two threads
   write one cache line. */
void lion_fp32(int64_t n, float *const *p, const float *const *g, float *const *m,
               const int64_t *numel, float lr, float decay, float beta1, float a1,
               float beta2, float a2, int threads) {
  (void)threads; /* used by the OpenMP pragma only */
#pragma omp parallel num_threads(threads)
  {
    int64_t team = 1, me = 0;
#ifdef _OPENMP
    team = omp_get_num_threads();
    me = omp_get_thread_num();
#endif
    for (int64_t t = 0; t < n; ++t) {
      const int64_t slice = ((numel[t] + team - 1) / team + 15) / 16 * 16;
      const int64_t lo = me * slice < numel[t] ? me * slice : numel[t];
      const int64_t hi = lo + slice < numel[t] ? lo + slice : numel[t];
      lion_range(p[t], g[t], m[t], lo, hi, lr, decay, beta1, a1, beta2, a2);
    }
  }
}
