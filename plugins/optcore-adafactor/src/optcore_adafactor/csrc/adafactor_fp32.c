/* Adafactor's step on fp32 CPU tensors as plain C loops (optcore_adafactor._cpu_kernel loads it).

   adafactor_step_batch runs the whole step of many tensors in one call (one
   fork and join of the OpenMP threads). No torch headers: optcore.kernels builds this file with the system
   compiler (warnings as errors) on first use. The caller checks every tensor
   (plain fp32 CPU, contiguous, exact shape, storage that holds it) before its
   pointer comes here: the loops trust the sizes they are given. */
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One build runs everywhere: the loader picks the widest vector unit the CPU has. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(NO_CLONES)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif
#define RESTRICT __restrict__

/* ---- the whole step of many tensors in one call ------------------------- */

/* Job k of a batch is described by
     dims[2k], dims[2k+1]   n, m: an n x m matrix (factored), or m = 0 for a
                            vector of n elements (full second moment v)
     ptrs[7k .. 7k+6]       x, g, mom (or NULL), row (vector: v), col (vector:
                            NULL), rms (NULL: RMS(x) is neither needed nor stored),
                            memo (or NULL; matrices with rms only, see below)
     f[9k .. 9k+8]          beta2t, inv_scale, eps1, eps2, rho, clip, beta1, wd,
                            scale (1: scale_parameter, 0: not)
     out[4k .. 4k+3]        (may be NULL) RMS(x) before the step, step size, RMS(U),
                            1 if pass 1 read x (0: RMS(x) came from memo[0] or
                            from pass 2)
   A non-NULL rms receives RMS(x) before the step (Hugging Face's state). With
   scale the step size is max(eps2, RMS(x)) rho; without it, rho, and pass 2
   adds up RMS(x) of the x it reads anyway: no pass reads x for it alone.

   memo (2 doubles the optimizer keeps per matrix): memo[0] is sum x^2 of the
   x these loops wrote last step (NaN: unknown), memo[1] is 1 when the last
   step found x changed since. Pass 2 reads every x anyway, so it adds up
   sum x^2 of the x it reads and of the x it writes. When memo[0] is known
   and the last check passed, pass 1 does not read x for RMS(x) but takes
   memo[0] (a quarter of the step's memory traffic); pass 2 then checks that
   the x it read adds up to exactly memo[0] (the same loop, order and
   threads as the sum that made it). If not (x was changed between steps,
   e.g. through .data, which no version counter sees), the step size was
   wrong and a fix-up pass redoes the step from what pass 2 wrote, and the
   next step reads x in pass 1 again. Either way the step is the one RMS(x)
   of the x actually read gives. */
#define NPTR 7
#define NF 9

typedef struct {
  int64_t n, m;
  float *x;
  const float *g;
  float *mom, *row, *col, *rms;
  double *memo;
  const double *f;
  double *out;
  int scale;  /* scale_parameter: the step size depends on RMS(x) */
  int read_x; /* pass 1 reads x for RMS(x) */
} job_t;

/* max(eps2, RMS(x)) rho, or rho without scale_parameter */
static double step_size(const job_t *j, double xsq) {
  const double rms_x = sqrt(xsq / ((double)j->n * (double)j->m));
  return j->scale ? (rms_x > j->f[3] ? rms_x : j->f[3]) * j->f[4] : j->f[4];
}

static job_t job_at(int64_t k, const int64_t *dims, void *const *ptrs, const double *f, double *out) {
  job_t j;
  j.n = dims[2 * k];
  j.m = dims[2 * k + 1];
  j.x = (float *)ptrs[NPTR * k];
  j.g = (const float *)ptrs[NPTR * k + 1];
  j.mom = (float *)ptrs[NPTR * k + 2];
  j.row = (float *)ptrs[NPTR * k + 3];
  j.col = (float *)ptrs[NPTR * k + 4];
  j.rms = (float *)ptrs[NPTR * k + 5];
  j.f = f + NF * k;
  j.scale = j.rms && j.f[8] != 0.0;
  j.memo = j.scale && j.m ? (double *)ptrs[NPTR * k + 6] : 0;
  j.out = out ? out + 4 * k : 0;
  /* the memo is trusted only where the fix-up can undo a wrong step size: 1 - decay well above 0 */
  j.read_x = j.scale && !(j.memo && j.memo[1] == 0.0 && j.memo[0] == j.memo[0] && j.f[7] * step_size(&j, j.memo[0]) < 0.5);
  return j;
}

/* Pass 1 over rows [lo, hi) of a factored job: reads g (and x when j->read_x),
   updates row[lo..hi) to R_t and adds sum_i g^2 and sum_i g^2 / R_i of these
   rows to sq[m] and w[m]; returns sum x^2 of these rows. Rows go four at a
   time: first each row's sums (g and x one row after the other, so memory
   is read in one ascending run; float lanes, a row has at most a few
   thousand elements per lane, rows added up in double), then one sweep adds
   all four rows (now in L1 or L2) to sq and w, so these m-vectors are
   loaded and stored once per four rows. */
static CLONES double stats_rows(const job_t *j, int64_t lo, int64_t hi, float *RESTRICT sq, float *RESTRICT w) {
  const int64_t m = j->m;
  const float beta2t = (float)j->f[0], inv_s2 = (float)(j->f[1] * j->f[1]);
  const float a = (1.0f - beta2t) * inv_s2 / (float)m, b = (1.0f - beta2t) * (float)j->f[2];
  float *RESTRICT row = j->row;
  double xsq = 0.0;
  for (int64_t i0 = lo; i0 < hi; i0 += 4) {
    const int64_t rows = hi - i0 < 4 ? hi - i0 : 4;
    float inv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t r = 0; r < rows; ++r) {
      const float *RESTRICT gi = j->g + (i0 + r) * m;
      float s = 0.0f;
      if (j->read_x) {
        const float *RESTRICT xi = j->x + (i0 + r) * m;
        float q = 0.0f;
#pragma omp simd reduction(+ : s, q)
        for (int64_t k = 0; k < m; ++k) {
          s += gi[k] * gi[k];
          q += xi[k] * xi[k];
        }
        xsq += (double)q;
      } else {
#pragma omp simd reduction(+ : s)
        for (int64_t k = 0; k < m; ++k) s += gi[k] * gi[k];
      }
      const float rr = beta2t * row[i0 + r] + a * s + b;
      row[i0 + r] = rr;
      inv[r] = 1.0f / rr;
    }
    const float *RESTRICT g0 = j->g + i0 * m;
    if (rows == 4) {
      const float *RESTRICT g1 = g0 + m, *RESTRICT g2 = g1 + m, *RESTRICT g3 = g2 + m;
      const float i0_ = inv[0], i1 = inv[1], i2 = inv[2], i3 = inv[3];
#pragma omp simd
      for (int64_t k = 0; k < m; ++k) {
        const float v0 = g0[k] * g0[k], v1 = g1[k] * g1[k], v2 = g2[k] * g2[k], v3 = g3[k] * g3[k];
        sq[k] += (v0 + v1) + (v2 + v3);
        w[k] += (v0 * i0_ + v1 * i1) + (v2 * i2 + v3 * i3);
      }
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        const float *RESTRICT gi = g0 + r * m;
        const float ir = inv[r];
#pragma omp simd
        for (int64_t k = 0; k < m; ++k) {
          const float v = gi[k] * gi[k];
          sq[k] += v;
          w[k] += v * ir;
        }
      }
    }
  }
  return xsq;
}

/* Between the passes, O(n + m): C_t into col from the column sums sq, the
   factors c (into cf, m) and r (into rf, n, with the step size and sign in
   it), RMS(U) = sqrt(mean(R) sum_j w_j / C_j / (n m)) (see optcore_adafactor._cpu_kernel), the
   step size; with scale, stores RMS(x) (from xsq, or memo[0] when pass 1 did
   not read x; without scale, store_rms does once pass 2 has read x).
   Returns the decay factor wd * step size. */
static float factors(const job_t *j, const float *sq, const float *w, double xsq, float *RESTRICT cf, float *RESTRICT rf) {
  const int64_t n = j->n, m = j->m;
  const float beta2t = (float)j->f[0], inv_s2 = (float)(j->f[1] * j->f[1]), b = (1.0f - beta2t) * (float)j->f[2];
  const float ac = (1.0f - beta2t) * inv_s2 / (float)n;
  double row_sum = 0.0, wsum = 0.0;
  for (int64_t i = 0; i < n; ++i) row_sum += j->row[i];
  const float row_mean = (float)(row_sum / (double)n);
  for (int64_t k = 0; k < m; ++k) {
    const float ck = beta2t * j->col[k] + ac * sq[k] + b;
    j->col[k] = ck;
    wsum += (double)w[k] / ck;
    cf[k] = 1.0f / sqrtf(ck);
  }
  if (j->scale && !j->read_x) xsq = j->memo[0];
  const double rms_u = sqrt(wsum * row_mean * inv_s2 / ((double)n * (double)m));
  const double rms_x = sqrt(xsq / ((double)n * (double)m));
  const double clip = j->f[5], beta1 = j->f[6];
  const double step = step_size(j, xsq);
  const double lr = step / (rms_u / clip > 1.0 ? rms_u / clip : 1.0) * j->f[1];
  const float rs = j->mom ? (float)((1.0 - beta1) * lr) : (float)(-lr);
  for (int64_t i = 0; i < n; ++i) rf[i] = rs / sqrtf(j->row[i] / row_mean);
  if (j->scale) *j->rms = (float)rms_x;
  if (j->out) { j->out[0] = rms_x; j->out[1] = step; j->out[2] = rms_u; j->out[3] = j->read_x; }
  return (float)(j->f[7] * step);
}

/* Pass 2 over rows [lo, hi), last rows first (those pass 1 read last are the
   likeliest still in cache), in blocks of about 64 KB visited forwards (so
   the hardware prefetcher still sees long ascending runs when rows are
   short): reads g, x (and mom), writes x (and mom):
     x -= decay x;  x += g c r                          (no mom), or
     mom = beta1 mom + g c r;  x -= decay x;  x -= mom  (r carries (1 - beta1) lr).
   With sums (a job with a memo): sums[0], sums[1] = sum x^2 of the x read
   and of the x written, row by row in float lanes, rows added in double. */
static CLONES void apply_rows(const job_t *j, int64_t lo, int64_t hi, const float *RESTRICT cf, const float *RESTRICT rf,
                              float decay, double *sums) {
  const int64_t m = j->m;
  const float beta1 = (float)j->f[6];
  const int64_t block = m >= 16384 ? 1 : 16384 / m;
  double read_sq = 0.0, written_sq = 0.0;
  for (int64_t b_hi = hi; b_hi > lo; b_hi -= block)
  for (int64_t i = b_hi - block > lo ? b_hi - block : lo; i < b_hi; ++i) {
    float *RESTRICT xi = j->x + i * m;
    const float *RESTRICT gi = j->g + i * m;
    const float ri = rf[i];
    float *RESTRICT mi = j->mom ? j->mom + i * m : 0;
    if (sums) {
      float qr = 0.0f, qw = 0.0f;
      if (mi) {
#pragma omp simd reduction(+ : qr, qw)
        for (int64_t k = 0; k < m; ++k) {
          const float xr = xi[k];
          mi[k] = beta1 * mi[k] + gi[k] * cf[k] * ri;
          const float xw = (xr - decay * xr) - mi[k];
          xi[k] = xw;
          qr += xr * xr;
          qw += xw * xw;
        }
      } else {
#pragma omp simd reduction(+ : qr, qw)
        for (int64_t k = 0; k < m; ++k) {
          const float xr = xi[k];
          const float xw = (xr - decay * xr) + gi[k] * cf[k] * ri;
          xi[k] = xw;
          qr += xr * xr;
          qw += xw * xw;
        }
      }
      read_sq += (double)qr;
      written_sq += (double)qw;
    } else if (mi) {
#pragma omp simd
      for (int64_t k = 0; k < m; ++k) {
        mi[k] = beta1 * mi[k] + gi[k] * cf[k] * ri;
        xi[k] = (xi[k] - decay * xi[k]) - mi[k];
      }
    } else {
#pragma omp simd
      for (int64_t k = 0; k < m; ++k) xi[k] = (xi[k] - decay * xi[k]) + gi[k] * cf[k] * ri;
    }
  }
  if (sums) { sums[0] = read_sq; sums[1] = written_sq; }
}

/* The fix-up pass over rows [lo, hi), for a step taken with memo[0] when the
   x pass 2 read did not add up to it: pass 2 used step size s_w (row factors
   rf, decay dw = wd s_w), the right one is s_c = ratio s_w. From what pass 2
   wrote, x before the step is x0 = (x_w - g c r) / (1 - dw), or (x_w + mom_w)
   / (1 - dw) with mom_w = beta1 mom + g c r; the step redone from it:
     x = (x0 - dc x0) + g c r ratio,  or  mom = mom_w + g c r (ratio - 1);  x = (x0 - dc x0) - mom.
   (read_x ensured 1 - dw >= 0.5.) */
static CLONES void fix_rows(const job_t *j, int64_t lo, int64_t hi, const float *RESTRICT cf, const float *RESTRICT rf,
                            float ratio, float dw, float dc) {
  const int64_t m = j->m;
  const float undo = 1.0f / (1.0f - dw);
  for (int64_t i = lo; i < hi; ++i) {
    float *RESTRICT xi = j->x + i * m;
    const float *RESTRICT gi = j->g + i * m;
    const float ri = rf[i];
    if (j->mom) {
      float *RESTRICT mi = j->mom + i * m;
#pragma omp simd
      for (int64_t k = 0; k < m; ++k) {
        const float u = gi[k] * cf[k] * ri, x0 = (xi[k] + mi[k]) * undo;
        mi[k] += u * (ratio - 1.0f);
        xi[k] = (x0 - dc * x0) - mi[k];
      }
    } else {
#pragma omp simd
      for (int64_t k = 0; k < m; ++k) {
        const float u = gi[k] * cf[k] * ri, x0 = (xi[k] - u) * undo;
        xi[k] = (x0 - dc * x0) + u * ratio;
      }
    }
  }
}

/* Without scale: RMS(x) from the sum of squares of the x pass 2 read. */
static void store_rms(const job_t *j, double read_sq) {
  const double rms_x = sqrt(read_sq / ((double)j->n * (double)j->m));
  *j->rms = (float)rms_x;
  if (j->out) j->out[0] = rms_x;
}

/* After pass 2 of a job with a memo, from the sum of the x it read: records
   whether x had changed since these loops wrote it (memo[1]; left as it is
   when memo[0] is unknown), and returns whether the step used memo[0] for a
   changed x and needs fix_rows, with *ratio and *dc for it (RMS(x), the step
   size are then set right). */
static int check_memo(const job_t *j, double read_sq, float *ratio, float *dc) {
  if (j->memo[0] == j->memo[0]) j->memo[1] = read_sq != j->memo[0];
  if (j->read_x || j->memo[1] == 0.0) return 0;
  const double used = step_size(j, j->memo[0]), right = step_size(j, read_sq);
  const double rms_x = sqrt(read_sq / ((double)j->n * (double)j->m));
  *ratio = (float)(right / used);
  *dc = (float)(j->f[7] * right);
  *j->rms = (float)rms_x;
  if (j->out) { j->out[0] = rms_x; j->out[1] = right; }
  return 1;
}

/* The whole step of a vector (Algorithm 5, full second moment v), two passes. */
static CLONES void vector_job(const job_t *j) {
  const int64_t n = j->n;
  const float beta2t = (float)j->f[0], inv_scale = (float)j->f[1], eps1 = (float)j->f[2], beta1 = (float)j->f[6];
  float *RESTRICT x = j->x, *RESTRICT v = j->row, *RESTRICT mom = j->mom;
  const float *RESTRICT g = j->g;
  double usq = 0.0, xsq = 0.0;
  for (int64_t k = 0; k < n; ++k) {
    const float gk = g[k] * inv_scale;
    const float vk = beta2t * v[k] + (1.0f - beta2t) * (gk * gk + eps1);
    v[k] = vk;
    usq += (double)(gk * gk) / vk;
    xsq += (double)x[k] * x[k];
  }
  const double rms_u = sqrt(usq / (double)n), rms_x = sqrt(xsq / (double)n);
  const double rho = j->f[4], clip = j->f[5];
  const double step = j->scale ? (rms_x > j->f[3] ? rms_x : j->f[3]) * rho : rho;
  const float lr = (float)(step / (rms_u / clip > 1.0 ? rms_u / clip : 1.0));
  const float decay = (float)(j->f[7] * step);
  for (int64_t k = 0; k < n; ++k) {
    const float u = g[k] * inv_scale / sqrtf(v[k]) * lr;
    const float xk = x[k] - decay * x[k];
    if (mom) {
      mom[k] = beta1 * mom[k] + (1.0f - beta1) * u;
      x[k] = xk - mom[k];
    } else {
      x[k] = xk - u;
    }
  }
  if (j->rms) *j->rms = (float)rms_x;
  if (j->out) { j->out[0] = rms_x; j->out[1] = step; j->out[2] = rms_u; j->out[3] = 1; }
}

/* One factored job by one thread; scratch: 3 m + n floats. */
static void matrix_job(const job_t *j, float *scratch) {
  const int64_t m = j->m;
  float *sq = scratch, *w = sq + m, *cf = w + m, *rf = cf + m;
  memset(sq, 0, 2 * m * sizeof(float));
  const double xsq = stats_rows(j, 0, j->n, sq, w);
  const float decay = factors(j, sq, w, xsq, cf, rf);
  double sums[2];
  apply_rows(j, 0, j->n, cf, rf, decay, j->memo || (j->rms && !j->scale) ? sums : 0);
  if (!j->memo) {
    if (j->rms && !j->scale) store_rms(j, sums[0]);
    return;
  }
  float ratio, dc;
  const int fix = check_memo(j, sums[0], &ratio, &dc);
  if (fix) fix_rows(j, 0, j->n, cf, rf, ratio, decay, dc);
  j->memo[0] = fix ? NAN : sums[1]; /* after a fix-up: unknown (its sum would not come out as pass 2's) */
}

static int64_t round16(int64_t k) { return (k + 15) & ~(int64_t)15; }

typedef struct { int64_t size, k; } order_t;

/* Each thread's floats of working memory: 3 m + n (a whole job, or 2 m of partial sums). */
static int64_t per_thread_floats(int64_t max_n, int64_t max_m) { return round16(3 * max_m + max_n); }

/* The floats of adafactor_step_batch's working memory, for the largest matrix
   dimensions among its jobs: each thread's; shared m + n, and 3 doubles per
   thread; 16 for alignment. */
static int64_t work_floats(int64_t max_n, int64_t max_m, int threads) {
  return threads * per_thread_floats(max_n, max_m) + round16(max_m) + round16(max_n) + 6 * threads + 16;
}

/* The largest row and column counts of the matrices among the jobs (1 where none). */
static void largest(int64_t count, const int64_t *dims, int64_t *max_n, int64_t *max_m) {
  *max_n = 1;
  *max_m = 1;
  for (int64_t k = 0; k < count; ++k) {
    if (dims[2 * k + 1] == 0) continue;
    if (dims[2 * k] > *max_n) *max_n = dims[2 * k];
    if (dims[2 * k + 1] > *max_m) *max_m = dims[2 * k + 1];
  }
}

/* The bytes adafactor_step_batch allocates for these jobs and threads, held
   while it runs and freed before it returns: the kernel's scratch, which
   optcore.kernels.run_kernel counts (and optcore memory predicts). */
int64_t adafactor_scratch_bytes(int64_t count, const int64_t *dims, int threads) {
  int64_t max_n, max_m;
  if (threads < 1) threads = 1;
  largest(count, dims, &max_n, &max_m);
  const int64_t order_bytes = (count > 0 ? count : 1) * (int64_t)sizeof(order_t);
  return order_bytes + work_floats(max_n, max_m, threads) * (int64_t)sizeof(float);
}

static int larger_first(const void *a, const void *b) {
  const order_t *x = (const order_t *)a, *y = (const order_t *)b;
  return x->size != y->size ? (x->size < y->size ? 1 : -1) : (x->k > y->k) - (x->k < y->k);
}

/* The step of `count` tensors (see job_at), with one fork and join for all.
   Vectors and matrices under `shared_min` elements go whole to one thread
   each, largest first, as threads come free; larger matrices are then split
   by rows over all threads: pass 1 over each thread's rows, a barrier, the
   factors by one thread from the per-thread partial sums added in thread
   order (so results do not depend on timing), a barrier, pass 2 over the
   same rows. Returns 0, or -1 when the scratch memory could not be
   allocated (then nothing was changed). */
int adafactor_step_batch(int64_t count, const int64_t *dims, void *const *ptrs, const double *f, double *out,
                         int64_t shared_min, int threads) {
  int64_t max_n, max_m, whole = 0, shared = 0;
  if (threads < 1) threads = 1;
  order_t *order = (order_t *)malloc((size_t)(count > 0 ? count : 1) * sizeof(order_t));
  if (!order) return -1;
  largest(count, dims, &max_n, &max_m);
  for (int64_t k = 0; k < count; ++k) {
    const int64_t n = dims[2 * k], m = dims[2 * k + 1];
    if (m == 0 || n * m < shared_min || threads == 1) order[whole++] = (order_t){m ? n * m : n, k};
  }
  qsort(order, (size_t)whole, sizeof(order_t), larger_first);
  for (int64_t k = 0; k < count; ++k) /* the rest, in their order */
    if (!(dims[2 * k + 1] == 0 || dims[2 * k] * dims[2 * k + 1] < shared_min || threads == 1))
      order[whole + shared++] = (order_t){dims[2 * k] * dims[2 * k + 1], k};
  const int64_t per_thread = per_thread_floats(max_n, max_m);
  float *mem = (float *)malloc((size_t)work_floats(max_n, max_m, threads) * sizeof(float));
  if (!mem) {
    free(order);
    return -1;
  }
  float *base = (float *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
  float *cf = base + threads * per_thread, *rf = cf + round16(max_m);
  double *xsqs = (double *)(rf + round16(max_n)), *sums = xsqs + threads; /* 2 per thread */
  float decay = 0.0f, ratio = 1.0f, dc = 0.0f;
  int fix = 0;
#pragma omp parallel num_threads(threads)
  {
    int t = 0, nt = 1;
#ifdef _OPENMP
    t = omp_get_thread_num();
    nt = omp_get_num_threads();
#endif
    float *mine = base + t * per_thread;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < whole; ++i) {
      job_t j = job_at(order[i].k, dims, ptrs, f, out);
      if (j.m == 0) vector_job(&j);
      else matrix_job(&j, mine);
    } /* implicit barrier */
    for (int64_t i = whole; i < whole + shared; ++i) {
      job_t j = job_at(order[i].k, dims, ptrs, f, out);
      if (nt == 1) { /* fewer threads than asked for */
        matrix_job(&j, mine);
        continue;
      }
      const int64_t lo = j.n * t / nt, hi = j.n * (t + 1) / nt;
      memset(mine, 0, 2 * j.m * sizeof(float));
      xsqs[t] = stats_rows(&j, lo, hi, mine, mine + j.m);
#pragma omp barrier
#pragma omp single
      {
        double xsq = xsqs[0];
        for (int u = 1; u < nt; ++u) {
          const float *squ = base + u * per_thread, *wu = squ + j.m;
          for (int64_t c = 0; c < j.m; ++c) { base[c] += squ[c]; base[j.m + c] += wu[c]; }
          xsq += xsqs[u];
        }
        decay = factors(&j, base, base + j.m, xsq, cf, rf);
      } /* implicit barrier */
      const int rms_after = j.rms && !j.scale;
      apply_rows(&j, lo, hi, cf, rf, decay, j.memo || rms_after ? sums + 2 * t : 0);
      if (!j.memo && !rms_after) continue;
#pragma omp barrier
#pragma omp single
      {
        double read_sq = 0.0;
        for (int u = 0; u < nt; ++u) read_sq += sums[2 * u];
        if (j.memo) fix = check_memo(&j, read_sq, &ratio, &dc);
        else store_rms(&j, read_sq);
      } /* implicit barrier */
      if (!j.memo) continue;
      if (fix) fix_rows(&j, lo, hi, cf, rf, ratio, decay, dc);
#pragma omp barrier
#pragma omp single
      {
        double written_sq = 0.0;
        for (int u = 0; u < nt; ++u) written_sq += sums[2 * u + 1];
        j.memo[0] = fix ? NAN : written_sq;
      } /* implicit barrier */
    }
  }
  free(mem);
  free(order);
  return 0;
}
