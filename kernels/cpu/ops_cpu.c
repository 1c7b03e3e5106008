/* CPU ops other than attention: projections (a batch-invariant small-batch
 * kernel for decode-sized n, OpenBLAS sgemm above), and elementwise/row ops
 * split over the thread pool when big enough to pay for waking it. */
#include <cblas.h>
#include <math.h>

#include "kernels/cpu/backend_cpu.h"

/* Elements below which a row/elementwise op stays on the calling thread. */
#define CPU_PAR_MIN_ELEMS 32768
#define CPU_ROPE_MAX_HALF 512

/* Splits `total` work items into tasks of at least `min_items` each, at most
 * 4 per thread (dynamic scheduling smooths the rest). */
static int64_t cpu_split(const cpu_ctx_t *c, int64_t total, int64_t min_items) {
    if (total <= 0)
        return 0;
    int64_t tasks = (total + min_items - 1) / min_items;
    int64_t cap = (int64_t)c->n_threads * 4;
    if (tasks > cap)
        tasks = cap;
    return tasks < 1 ? 1 : tasks;
}

static inline void cpu_task_range(int64_t total, int64_t n_tasks, int64_t task, int64_t *lo,
                                  int64_t *hi) {
    *lo = total * task / n_tasks;
    *hi = total * (task + 1) / n_tasks;
}

/* ---------------- matmul ---------------- */

/* Small-batch path (n <= CPU_MM_SMALL_MAX, the decode step): each task owns
 * a block of output rows; inside it, a 4-weight-row x 3-token register tile
 * dots every weight row with the tokens while it is in cache, so the weights
 * stream from memory once per call whatever n is. Every (token, output) is
 * one 8-lane accumulator walked over the input dimension in order (8
 * elements at a time, one fused multiply-add per step), reduced in a fixed
 * lane order, then the scalar tail (in % 8), then the bias: the result for
 * a token never depends on n, on the other tokens, on the tile shape it
 * lands in or on the thread count. */
#define CPU_MM_SMALL_MAX 64      /* n at or below which the small path runs */
#define CPU_MM_BLOCK_BYTES 131072 /* weight bytes per task (L2-resident block) */

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
typedef __m256 mm_v8;
#define MM_ZERO() _mm256_setzero_ps()
#define MM_LOAD(p) _mm256_loadu_ps(p)
#define MM_FMA(acc, a, b) _mm256_fmadd_ps(a, b, acc)
static inline float mm_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#else
/* Portable: GCC/clang vector extension (macros, not functions: a by-value
 * 32-byte vector argument would change the ABI without AVX). */
typedef float mm_v8 __attribute__((vector_size(32)));
#define MM_ZERO() ((mm_v8){0})
#define MM_LOAD(p)                                                                       \
    ({                                                                                   \
        mm_v8 mm_v_;                                                                     \
        memcpy(&mm_v_, (p), sizeof(mm_v_));                                              \
        mm_v_;                                                                           \
    })
#define MM_FMA(acc, a, b) ((acc) + (a) * (b))
#define mm_hsum(v) ((((v)[0] + (v)[4]) + ((v)[2] + (v)[6])) + (((v)[1] + (v)[5]) + ((v)[3] + (v)[7])))
#endif

/* The scalar tail of one dot product, elements i0..in-1, after the vector
 * part `s` (one code path for every tile shape). */
static inline float mm_tail(float s, const float *x, const float *w, int32_t i0, int32_t in) {
    for (int32_t i = i0; i < in; i++)
        s += x[i] * w[i];
    return s;
}

/* y[t0 + t, o0 + r] for r < R, t < T (R <= 4, T <= 3; constants after
 * inlining, so the accumulators live in registers). */
static inline __attribute__((always_inline)) void mm_tile(const float *w, const float *x,
                                                          const float *bias, float *y, int32_t in,
                                                          int32_t out, int32_t o0, int32_t t0,
                                                          const int R, const int T) {
    mm_v8 acc[4][3];
    const float *wr[4], *xt[3];
    for (int r = 0; r < R; r++)
        wr[r] = w + (size_t)(o0 + r) * in;
    for (int t = 0; t < T; t++)
        xt[t] = x + (size_t)(t0 + t) * in;
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            acc[r][t] = MM_ZERO();
    const int32_t in8 = in & ~7;
    for (int32_t i = 0; i < in8; i += 8) {
        mm_v8 xv[3];
        for (int t = 0; t < T; t++)
            xv[t] = MM_LOAD(xt[t] + i);
        for (int r = 0; r < R; r++) {
            const mm_v8 wv = MM_LOAD(wr[r] + i);
            for (int t = 0; t < T; t++)
                acc[r][t] = MM_FMA(acc[r][t], wv, xv[t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            float s = mm_tail(mm_hsum(acc[r][t]), xt[t], wr[r], in8, in);
            if (bias)
                s += bias[o0 + r];
            y[(size_t)(t0 + t) * out + o0 + r] = s;
        }
}

typedef struct {
    const float *w, *bias, *x;
    float *y;
    int32_t in, out, n, rows_per_task;
} mm_args_t;

static void mm_small_task(void *argp, int64_t task, int worker) {
    const mm_args_t *a = argp;
    const int32_t o_lo = (int32_t)task * a->rows_per_task;
    const int32_t o_hi = o_lo + a->rows_per_task < a->out ? o_lo + a->rows_per_task : a->out;
    for (int32_t t0 = 0; t0 < a->n; t0 += 3) {
        const int32_t nt = a->n - t0 < 3 ? a->n - t0 : 3;
        int32_t o = o_lo;
        for (; o + 4 <= o_hi; o += 4) {
            if (nt == 3)
                mm_tile(a->w, a->x, a->bias, a->y, a->in, a->out, o, t0, 4, 3);
            else if (nt == 2)
                mm_tile(a->w, a->x, a->bias, a->y, a->in, a->out, o, t0, 4, 2);
            else
                mm_tile(a->w, a->x, a->bias, a->y, a->in, a->out, o, t0, 4, 1);
        }
        for (; o < o_hi; o++) {
            if (nt == 3)
                mm_tile(a->w, a->x, a->bias, a->y, a->in, a->out, o, t0, 1, 3);
            else if (nt == 2)
                mm_tile(a->w, a->x, a->bias, a->y, a->in, a->out, o, t0, 1, 2);
            else
                mm_tile(a->w, a->x, a->bias, a->y, a->in, a->out, o, t0, 1, 1);
        }
    }
}

baton_status_t cpu_matmul(backend_t *be, const backend_weight_t *w, const backend_weight_t *bias,
                          const float *x, float *y, int32_t n) {
    if (!w || n < 0 || (n > 0 && (!x || !y)))
        return baton_error(BATON_ERR_INVALID_ARG, "cpu matmul: bad argument (n %d)", n);
    if (n > 0 && (const float *)y == x)
        return baton_error(BATON_ERR_INVALID_ARG, "cpu matmul: y aliases x");
    if (w->rows > INT32_MAX || w->cols > INT32_MAX)
        return baton_error(BATON_ERR_UNSUPPORTED, "cpu matmul: weight %lld x %lld too large for BLAS",
                           (long long)w->rows, (long long)w->cols);
    const int out = (int)w->rows, in = (int)w->cols;
    if (bias && (bias->rows * bias->cols != out))
        return baton_error(BATON_ERR_INVALID_ARG, "cpu matmul: bias has %lld elements, out_dim %d",
                           (long long)(bias->rows * bias->cols), out);
    if (n == 0)
        return BATON_OK;
    if (n <= CPU_MM_SMALL_MAX) {
        cpu_ctx_t *c = cpu_ctx(be);
        /* Block height from the shape only: ~CPU_MM_BLOCK_BYTES of weights,
         * a multiple of 4 rows. */
        int64_t rows = CPU_MM_BLOCK_BYTES / ((int64_t)in * (int64_t)sizeof(float));
        rows = rows < 4 ? 4 : rows & ~(int64_t)3;
        mm_args_t a = {w->data, bias ? bias->data : NULL, x, y, in, out, n, (int32_t)rows};
        cpu_pool_run(c->pool, ((int64_t)out + rows - 1) / rows, mm_small_task, &a);
        return BATON_OK;
    }
    float beta = 0.0f;
    if (bias) {
        for (int32_t t = 0; t < n; t++)
            memcpy(y + (size_t)t * out, bias->data, (size_t)out * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, w->data, in, beta,
                y, out);
    return BATON_OK;
}

/* ---------------- rmsnorm ---------------- */

typedef struct {
    const float *x, *w;
    float *y;
    float eps;
    int64_t n, d, n_tasks;
} rmsnorm_args_t;

static void rmsnorm_task(void *argp, int64_t task, int worker) {
    const rmsnorm_args_t *a = argp;
    int64_t lo, hi;
    cpu_task_range(a->n, a->n_tasks, task, &lo, &hi);
    const int32_t d = (int32_t)a->d;
    for (int64_t r = lo; r < hi; r++) {
        const float *xr = a->x + r * a->d;
        float *yr = a->y + r * a->d;
        float ss = cpu_vec_dot(xr, xr, d);
        float inv = 1.0f / sqrtf(ss / (float)d + a->eps);
        for (int32_t i = 0; i < d; i++)
            yr[i] = xr[i] * inv * a->w[i];
    }
}

baton_status_t cpu_rmsnorm(backend_t *be, const float *x, const backend_weight_t *w, float eps,
                           float *y, int32_t n, int32_t d) {
    if (!w || n < 0 || d <= 0 || (n > 0 && (!x || !y)))
        return baton_error(BATON_ERR_INVALID_ARG, "cpu rmsnorm: bad argument (n %d, d %d)", n, d);
    if (w->rows * w->cols != d)
        return baton_error(BATON_ERR_INVALID_ARG, "cpu rmsnorm: weight has %lld elements, d %d",
                           (long long)(w->rows * w->cols), d);
    if (!(eps >= 0.0f))
        return baton_error(BATON_ERR_INVALID_ARG, "cpu rmsnorm: eps %g < 0", (double)eps);
    cpu_ctx_t *c = cpu_ctx(be);
    rmsnorm_args_t a = {x, w->data, y, eps, n, d, 0};
    a.n_tasks = cpu_split(c, n, (CPU_PAR_MIN_ELEMS + d - 1) / d);
    cpu_pool_run(c->pool, a.n_tasks, rmsnorm_task, &a);
    return BATON_OK;
}

/* ---------------- rope ---------------- */

typedef struct {
    float *x;
    const int32_t *pos;
    int64_t n, n_tasks;
    int32_t n_heads, head_dim, neox;
    double theta[CPU_ROPE_MAX_HALF]; /* theta_i, radians per position */
} rope_args_t;

static void rope_task(void *argp, int64_t task, int worker) {
    const rope_args_t *a = argp;
    const int32_t half = a->head_dim / 2;
    float cs[CPU_ROPE_MAX_HALF], sn[CPU_ROPE_MAX_HALF];
    int64_t lo, hi;
    cpu_task_range(a->n, a->n_tasks, task, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        /* Angles in double: pos * theta_i loses ~pos * 2^-24 rad in fp32. */
        for (int32_t i = 0; i < half; i++) {
            double ang = (double)a->pos[t] * a->theta[i];
            cs[i] = (float)cos(ang);
            sn[i] = (float)sin(ang);
        }
        float *xt = a->x + t * (int64_t)a->n_heads * a->head_dim;
        for (int32_t h = 0; h < a->n_heads; h++) {
            float *xh = xt + (int64_t)h * a->head_dim;
            if (a->neox) {
                for (int32_t i = 0; i < half; i++) {
                    float x0 = xh[i], x1 = xh[i + half];
                    xh[i] = x0 * cs[i] - x1 * sn[i];
                    xh[i + half] = x0 * sn[i] + x1 * cs[i];
                }
            } else {
                for (int32_t i = 0; i < half; i++) {
                    float x0 = xh[2 * i], x1 = xh[2 * i + 1];
                    xh[2 * i] = x0 * cs[i] - x1 * sn[i];
                    xh[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
                }
            }
        }
    }
}

baton_status_t cpu_rope(backend_t *be, float *x, const int32_t *pos, int32_t n, int32_t n_heads,
                        int32_t head_dim, float freq_base, float freq_scale,
                        const float *freq_factors, int neox) {
    if (n < 0 || n_heads <= 0 || head_dim <= 0 || (n > 0 && (!x || !pos)))
        return baton_error(BATON_ERR_INVALID_ARG, "cpu rope: bad argument (n %d, heads %d, head_dim %d)",
                           n, n_heads, head_dim);
    if (head_dim % 2 != 0)
        return baton_error(BATON_ERR_INVALID_ARG, "cpu rope: head_dim %d is odd", head_dim);
    if (head_dim / 2 > CPU_ROPE_MAX_HALF)
        return baton_error(BATON_ERR_UNSUPPORTED, "cpu rope: head_dim %d > %d", head_dim,
                           2 * CPU_ROPE_MAX_HALF);
    if (!(freq_base > 0.0f) || !(freq_scale > 0.0f))
        return baton_error(BATON_ERR_INVALID_ARG, "cpu rope: freq_base %g, freq_scale %g must be > 0",
                           (double)freq_base, (double)freq_scale);
    const int32_t half = head_dim / 2;
    if (freq_factors)
        for (int32_t i = 0; i < half; i++)
            if (!(freq_factors[i] > 0.0f))
                return baton_error(BATON_ERR_INVALID_ARG, "cpu rope: freq_factors[%d] = %g must be > 0",
                                   i, (double)freq_factors[i]);
    cpu_ctx_t *c = cpu_ctx(be);
    rope_args_t *a = &(rope_args_t){.x = x, .pos = pos, .n = n, .n_heads = n_heads,
                                    .head_dim = head_dim, .neox = neox};
    /* theta_i = freq_scale * base^(-2i/head_dim) / freq_factors[i]
     * (ggml_rope_ext with ext_factor 0, attn_factor 1). */
    for (int32_t i = 0; i < half; i++) {
        double th = (double)freq_scale * pow((double)freq_base, -2.0 * i / (double)head_dim);
        if (freq_factors)
            th /= (double)freq_factors[i];
        a->theta[i] = th;
    }
    a->n_tasks = cpu_split(c, n, (CPU_PAR_MIN_ELEMS / 4 + (int64_t)n_heads * head_dim - 1) /
                                     ((int64_t)n_heads * head_dim));
    cpu_pool_run(c->pool, a->n_tasks, rope_task, a);
    return BATON_OK;
}

/* ---------------- swiglu, add ---------------- */

typedef struct {
    const float *a, *b;
    float *y;
    int64_t total, n_tasks;
} ew_args_t;

static void swiglu_task(void *argp, int64_t task, int worker) {
    const ew_args_t *e = argp;
    int64_t lo, hi;
    cpu_task_range(e->total, e->n_tasks, task, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        float g = e->a[i];
        e->y[i] = g / (1.0f + expf(-g)) * e->b[i];
    }
}

static void add_task(void *argp, int64_t task, int worker) {
    const ew_args_t *e = argp;
    int64_t lo, hi;
    cpu_task_range(e->total, e->n_tasks, task, &lo, &hi);
    for (int64_t i = lo; i < hi; i++)
        e->y[i] = e->a[i] + e->b[i];
}

baton_status_t cpu_swiglu(backend_t *be, const float *gate, const float *up, float *out,
                          int32_t n, int32_t f) {
    if (n < 0 || f <= 0 || (n > 0 && (!gate || !up || !out)))
        return baton_error(BATON_ERR_INVALID_ARG, "cpu swiglu: bad argument (n %d, f %d)", n, f);
    cpu_ctx_t *c = cpu_ctx(be);
    ew_args_t e = {gate, up, out, (int64_t)n * f, 0};
    e.n_tasks = cpu_split(c, e.total, CPU_PAR_MIN_ELEMS / 4);
    cpu_pool_run(c->pool, e.n_tasks, swiglu_task, &e);
    return BATON_OK;
}

baton_status_t cpu_add(backend_t *be, const float *a, const float *b, float *y, int64_t n) {
    if (n < 0 || (n > 0 && (!a || !b || !y)))
        return baton_error(BATON_ERR_INVALID_ARG, "cpu add: bad argument (n %lld)", (long long)n);
    cpu_ctx_t *c = cpu_ctx(be);
    ew_args_t e = {a, b, y, n, 0};
    e.n_tasks = cpu_split(c, n, CPU_PAR_MIN_ELEMS * 2);
    cpu_pool_run(c->pool, e.n_tasks, add_task, &e);
    return BATON_OK;
}

/* ---------------- embed, gather_rows ---------------- */

baton_status_t cpu_embed(backend_t *be, const backend_weight_t *table, const int32_t *tokens,
                         int32_t n, float *out) {
    if (!table || n < 0 || (n > 0 && (!tokens || !out)))
        return baton_error(BATON_ERR_INVALID_ARG, "cpu embed: bad argument (n %d)", n);
    for (int32_t t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= table->rows)
            return baton_error(BATON_ERR_OUT_OF_RANGE, "cpu embed: token %d = %d outside 0..%lld", t,
                               tokens[t], (long long)table->rows - 1);
    const size_t row_bytes = (size_t)table->cols * sizeof(float);
    for (int32_t t = 0; t < n; t++)
        memcpy(out + (size_t)t * table->cols, table->data + (size_t)tokens[t] * table->cols,
               row_bytes);
    return BATON_OK;
}

baton_status_t cpu_gather_rows(backend_t *be, const float *x, const int32_t *rows, int32_t n,
                               int32_t d, float *y) {
    if (n < 0 || d <= 0 || (n > 0 && (!x || !rows || !y)))
        return baton_error(BATON_ERR_INVALID_ARG, "cpu gather_rows: bad argument (n %d, d %d)", n, d);
    for (int32_t i = 0; i < n; i++)
        if (rows[i] < 0)
            return baton_error(BATON_ERR_OUT_OF_RANGE, "cpu gather_rows: rows[%d] = %d < 0", i, rows[i]);
    for (int32_t i = 0; i < n; i++)
        memmove(y + (size_t)i * d, x + (size_t)rows[i] * d, (size_t)d * sizeof(float));
    return BATON_OK;
}
