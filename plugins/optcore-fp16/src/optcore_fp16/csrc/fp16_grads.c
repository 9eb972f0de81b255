/* fp16 gradients to unscaled fp32 master gradients in one pass, noting any inf/NaN
   (optcore_fp16._cpu_kernel loads it; optcore.kernels builds it on first use). */
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
  (void)threads; /* used by the OpenMP pragma only */
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
