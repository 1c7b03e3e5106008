/* CPU backend ops against naive references written plainly here (double
 * precision loops, textbook formulas: y = x W^T + b, RMSNorm (Zhang &
 * Sennrich 2019), RoPE as a closed-form rotation (Su et al. 2021), SwiGLU,
 * softmax attention with a causal mask over each sequence's positions).
 * Every op runs at several shapes, with 1 and 4 threads. Tolerance: max
 * absolute error / max |reference| < 1e-5. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/test_util.h"

#include <stdatomic.h>

#define TOL 1e-5

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng_next(void) {
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

/* Uniform in [lo, hi). */
static float rng_float(float lo, float hi) {
    return lo + (hi - lo) * (float)((rng_next() >> 40) * (1.0 / 16777216.0));
}

static int32_t rng_int(int32_t n) { return (int32_t)(rng_next() % (uint64_t)n); }

static float *rand_vec(size_t n, float lo, float hi) {
    float *v = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++)
        v[i] = rng_float(lo, hi);
    return v;
}

static double rel_err(const float *got, const double *ref, size_t n) {
    double maxd = 0.0, maxr = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= maxd))
            maxd = d; /* NaN propagates */
        if (fabs(ref[i]) > maxr)
            maxr = fabs(ref[i]);
    }
    return maxr > 0 ? maxd / maxr : maxd;
}

#define CHECK_CLOSE(got, ref, n, what, ...)                                              \
    do {                                                                                 \
        double _e = rel_err(got, ref, n);                                                \
        CHECK_MSG(_e < TOL, what " rel err %.3g", __VA_ARGS__, _e);                      \
    } while (0)

static backend_weight_t *mkweight(backend_t *be, const float *host, int64_t r, int64_t c) {
    backend_weight_t *w = NULL;
    CHECK_OK(be->ops->weight_create(be, host, r, c, &w));
    return w;
}

/* ---------------- matmul ---------------- */

static void test_matmul(backend_t *be) {
    /* n <= 64 runs the small-batch kernel (in % 8 tails, out % 4 rows,
     * token counts not a multiple of its 3-token tile), n > 64 OpenBLAS */
    const int shapes[][3] = {{1, 17, 5},   {7, 64, 33},   {33, 128, 96},  {2, 576, 1536},
                             {1, 576, 49}, {64, 581, 101}, {5, 3, 2},     {65, 96, 70},
                             {100, 64, 33}};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        int n = shapes[si][0], in = shapes[si][1], out = shapes[si][2];
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            float *x = rand_vec((size_t)n * in, -1, 1);
            float *W = rand_vec((size_t)out * in, -1, 1);
            float *bias = rand_vec(out, -1, 1);
            float *y = malloc((size_t)n * out * sizeof(float));
            double *ref = malloc((size_t)n * out * sizeof(double));
            for (int t = 0; t < n; t++)
                for (int o = 0; o < out; o++) {
                    double s = with_bias ? bias[o] : 0.0;
                    for (int i = 0; i < in; i++)
                        s += (double)x[t * in + i] * W[(size_t)o * in + i];
                    ref[(size_t)t * out + o] = s;
                }
            backend_weight_t *w = mkweight(be, W, out, in);
            backend_weight_t *b = with_bias ? mkweight(be, bias, 1, out) : NULL;
            CHECK_OK(be->ops->matmul(be, w, b, x, y, n));
            CHECK_CLOSE(y, ref, (size_t)n * out, "matmul n=%d in=%d out=%d bias=%d", n, in, out,
                        with_bias);
            be->ops->weight_free(be, w);
            be->ops->weight_free(be, b);
            free(x), free(W), free(bias), free(y), free(ref);
        }
    }
    /* bias of the wrong length is refused */
    float W[6] = {1, 2, 3, 4, 5, 6}, bb[3] = {1, 2, 3}, x[3] = {1, 1, 1}, y[2];
    backend_weight_t *w = mkweight(be, W, 2, 3), *b = mkweight(be, bb, 1, 3);
    CHECK_EQ_INT(be->ops->matmul(be, w, b, x, y, 1), BATON_ERR_INVALID_ARG);
    be->ops->weight_free(be, w);
    be->ops->weight_free(be, b);
}

/* ---------------- rmsnorm ---------------- */

static void test_rmsnorm(backend_t *be) {
    const int shapes[][2] = {{1, 7}, {5, 64}, {40, 1000}, {3, 576}};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        int n = shapes[si][0], d = shapes[si][1];
        for (int inplace = 0; inplace < 2; inplace++) {
            float *x = rand_vec((size_t)n * d, -3, 3);
            float *wv = rand_vec(d, -2, 2);
            float *y = inplace ? x : malloc((size_t)n * d * sizeof(float));
            double *ref = malloc((size_t)n * d * sizeof(double));
            const float eps = 1e-5f;
            for (int t = 0; t < n; t++) {
                double ss = 0;
                for (int i = 0; i < d; i++)
                    ss += (double)x[t * d + i] * x[t * d + i];
                double inv = 1.0 / sqrt(ss / d + eps);
                for (int i = 0; i < d; i++)
                    ref[(size_t)t * d + i] = x[t * d + i] * inv * wv[i];
            }
            backend_weight_t *w = mkweight(be, wv, 1, d);
            CHECK_OK(be->ops->rmsnorm(be, x, w, eps, y, n, d));
            CHECK_CLOSE(y, ref, (size_t)n * d, "rmsnorm n=%d d=%d inplace=%d", n, d, inplace);
            be->ops->weight_free(be, w);
            if (!inplace)
                free(y);
            free(x), free(wv), free(ref);
        }
    }
}

/* ---------------- rope ---------------- */

static void test_rope(backend_t *be) {
    const int shapes[][3] = {{1, 1, 8}, {5, 9, 64}, {70, 4, 128}, {3, 2, 6}};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        int n = shapes[si][0], nh = shapes[si][1], hd = shapes[si][2], half = hd / 2;
        for (int neox = 0; neox < 2; neox++)
            for (int use_ff = 0; use_ff < 2; use_ff++) {
                size_t sz = (size_t)n * nh * hd;
                float *x = rand_vec(sz, -1, 1);
                float *x0 = malloc(sz * sizeof(float));
                memcpy(x0, x, sz * sizeof(float));
                int32_t *pos = malloc(n * sizeof(int32_t));
                for (int t = 0; t < n; t++)
                    pos[t] = t == 0 ? 0 : t == n - 1 ? 30000 + t : rng_int(4096);
                float *ff = rand_vec(half, 1.0f, 8.0f);
                const float base = si % 2 ? 500000.0f : 10000.0f, fscale = use_ff ? 0.25f : 1.0f;
                double *ref = malloc(sz * sizeof(double));
                for (int t = 0; t < n; t++)
                    for (int h = 0; h < nh; h++)
                        for (int i = 0; i < half; i++) {
                            double theta = fscale * pow(base, -2.0 * i / hd) / (use_ff ? ff[i] : 1.0);
                            double a = pos[t] * theta;
                            size_t i0 = ((size_t)t * nh + h) * hd + (neox ? i : 2 * i);
                            size_t i1 = i0 + (neox ? half : 1);
                            ref[i0] = x0[i0] * cos(a) - x0[i1] * sin(a);
                            ref[i1] = x0[i0] * sin(a) + x0[i1] * cos(a);
                        }
                CHECK_OK(be->ops->rope(be, x, pos, n, nh, hd, base, fscale, use_ff ? ff : NULL, neox));
                CHECK_CLOSE(x, ref, sz, "rope n=%d heads=%d hd=%d neox=%d ff=%d", n, nh, hd, neox,
                            use_ff);
                /* position 0 is the identity */
                for (int i = 0; i < nh * hd; i++)
                    CHECK(x[i] == x0[i]);
                free(x), free(x0), free(pos), free(ff), free(ref);
            }
    }
    float x[6] = {0};
    int32_t pos[1] = {1};
    CHECK_EQ_INT(be->ops->rope(be, x, pos, 1, 1, 5, 10000.0f, 1.0f, NULL, 0), BATON_ERR_INVALID_ARG);
}

/* ---------------- swiglu, add, embed, gather ---------------- */

static void test_elementwise(backend_t *be) {
    const int shapes[][2] = {{1, 5}, {3, 1536}, {50, 1536}};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        int n = shapes[si][0], f = shapes[si][1];
        size_t sz = (size_t)n * f;
        float *g = rand_vec(sz, -20, 20), *u = rand_vec(sz, -3, 3);
        float *out = malloc(sz * sizeof(float));
        double *ref = malloc(sz * sizeof(double));
        for (size_t i = 0; i < sz; i++)
            ref[i] = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        CHECK_OK(be->ops->swiglu(be, g, u, out, n, f));
        CHECK_CLOSE(out, ref, sz, "swiglu n=%d f=%d", n, f);
        CHECK_OK(be->ops->swiglu(be, g, u, g, n, f)); /* out aliases gate */
        CHECK_CLOSE(g, ref, sz, "swiglu in place n=%d f=%d", n, f);

        float *a = rand_vec(sz, -5, 5), *b = rand_vec(sz, -5, 5);
        for (size_t i = 0; i < sz; i++)
            ref[i] = (double)a[i] + b[i];
        CHECK_OK(be->ops->add(be, a, b, out, (int64_t)sz));
        CHECK_CLOSE(out, ref, sz, "add n=%zu", sz);
        CHECK_OK(be->ops->add(be, a, b, a, (int64_t)sz)); /* y aliases a */
        CHECK_CLOSE(a, ref, sz, "add in place n=%zu", sz);
        free(g), free(u), free(out), free(ref), free(a), free(b);
    }

    /* embed and gather_rows copy rows exactly */
    const int rows = 50, d = 24;
    float *tab = rand_vec((size_t)rows * d, -1, 1);
    backend_weight_t *w = mkweight(be, tab, rows, d);
    int32_t tok[5] = {3, 0, 49, 3, 17};
    float out[5 * 24], sentinel[5 * 24];
    CHECK_OK(be->ops->embed(be, w, tok, 5, out));
    for (int t = 0; t < 5; t++)
        CHECK(memcmp(out + t * d, tab + tok[t] * d, d * sizeof(float)) == 0);
    memcpy(sentinel, out, sizeof(out));
    int32_t bad[2] = {1, 50};
    CHECK_EQ_INT(be->ops->embed(be, w, bad, 2, out), BATON_ERR_OUT_OF_RANGE);
    bad[1] = -1;
    CHECK_EQ_INT(be->ops->embed(be, w, bad, 2, out), BATON_ERR_OUT_OF_RANGE);
    CHECK(memcmp(out, sentinel, sizeof(out)) == 0); /* nothing written on error */
    int32_t rsel[3] = {49, 2, 2};
    float g3[3 * 24];
    CHECK_OK(be->ops->gather_rows(be, tab, rsel, 3, d, g3));
    for (int i = 0; i < 3; i++)
        CHECK(memcmp(g3 + i * d, tab + rsel[i] * d, d * sizeof(float)) == 0);
    be->ops->weight_free(be, w);
    free(tab);
}

/* ---------------- paged KV write + attention ---------------- */

/* One attention scenario: sequences with a cached prefix (written by an
 * earlier kv_write step) and this step's tokens. */
typedef struct {
    int n_seqs;
    int prefix[8]; /* cached tokens before this step */
    int n_new[8];  /* this step's tokens */
} scenario_t;

static void run_attention(backend_t *be, const scenario_t *sc, int block_size, int n_kv_heads,
                          int group, int head_dim) {
    const int n_heads = n_kv_heads * group, layer = 1;
    backend_kv_geom_t g = {.n_layers = 3, .n_blocks = 0, .block_size = block_size,
                           .n_kv_heads = n_kv_heads, .head_dim = head_dim,
                           .dtype = BACKEND_DTYPE_F32};
    int max_blocks = 1, total_blocks = 0;
    for (int s = 0; s < sc->n_seqs; s++) {
        int nb = (sc->prefix[s] + sc->n_new[s] + block_size - 1) / block_size;
        if (nb > max_blocks)
            max_blocks = nb;
        total_blocks += nb;
    }
    g.n_blocks = total_blocks + 5; /* spare blocks stay unused */
    const size_t row = (size_t)n_kv_heads * head_dim;
    const size_t pool_bytes = backend_kv_block_offset(&g, g.n_layers, 0);
    float *kp = be->ops->alloc(be, pool_bytes), *vp = be->ops->alloc(be, pool_bytes);
    CHECK(kp && vp);
    /* Fill with noise so that a wrong block lookup shows. */
    for (size_t i = 0; i < pool_bytes / sizeof(float); i++) {
        kp[i] = rng_float(-1, 1);
        vp[i] = rng_float(-1, 1);
    }
    float *kp_copy = malloc(pool_bytes);
    /* Block tables: a random permutation of the blocks, shared out. */
    int32_t *perm = malloc(g.n_blocks * sizeof(int32_t));
    for (int i = 0; i < g.n_blocks; i++)
        perm[i] = i;
    for (int i = g.n_blocks - 1; i > 0; i--) {
        int j = rng_int(i + 1);
        int32_t tmp = perm[i];
        perm[i] = perm[j], perm[j] = tmp;
    }
    int32_t *bt = malloc((size_t)sc->n_seqs * max_blocks * sizeof(int32_t));
    for (int i = 0; i < sc->n_seqs * max_blocks; i++)
        bt[i] = -1; /* unused entries are never read */
    int used = 0;
    for (int s = 0; s < sc->n_seqs; s++) {
        int nb = (sc->prefix[s] + sc->n_new[s] + block_size - 1) / block_size;
        for (int i = 0; i < nb; i++)
            bt[s * max_blocks + i] = perm[used++];
    }
    /* Host copies of every sequence's K/V: [seq][pos][n_kv_heads*head_dim]. */
    float *K[8], *V[8];
    for (int s = 0; s < sc->n_seqs; s++) {
        int n = sc->prefix[s] + sc->n_new[s];
        K[s] = rand_vec((size_t)n * row, -1, 1);
        V[s] = rand_vec((size_t)n * row, -2, 2);
    }
    /* Step 1 (cached prefix), step 2 (this step): each a kv_write. */
    for (int step = 0; step < 2; step++) {
        int nt = 0;
        for (int s = 0; s < sc->n_seqs; s++)
            nt += step == 0 ? sc->prefix[s] : sc->n_new[s];
        int32_t *tok_seq = malloc((nt + 1) * sizeof(int32_t)), *tok_pos = malloc((nt + 1) * sizeof(int32_t));
        int32_t first[8], ntk[8], nctx[8];
        float *k = malloc((nt * row + 1) * sizeof(float)), *v = malloc((nt * row + 1) * sizeof(float));
        int t = 0;
        for (int s = 0; s < sc->n_seqs; s++) {
            int p0 = step == 0 ? 0 : sc->prefix[s];
            int cnt = step == 0 ? sc->prefix[s] : sc->n_new[s];
            first[s] = t, ntk[s] = cnt, nctx[s] = p0 + cnt;
            for (int i = 0; i < cnt; i++, t++) {
                tok_seq[t] = s, tok_pos[t] = p0 + i;
                memcpy(k + t * row, K[s] + (size_t)(p0 + i) * row, row * sizeof(float));
                memcpy(v + t * row, V[s] + (size_t)(p0 + i) * row, row * sizeof(float));
            }
        }
        backend_attn_batch_t b = {.n_tokens = nt, .n_seqs = sc->n_seqs, .tok_seq = tok_seq,
                                  .tok_pos = tok_pos, .seq_first_tok = first, .seq_n_tok = ntk,
                                  .seq_n_ctx = nctx, .block_tables = bt, .max_blocks = max_blocks};
        memcpy(kp_copy, kp, pool_bytes);
        CHECK_OK(be->ops->kv_write(be, &g, kp, vp, layer, &b, k, v));
        /* kv_write touched exactly this step's slots of this layer */
        size_t changed = 0;
        for (size_t i = 0; i < pool_bytes / sizeof(float); i++)
            changed += memcmp(&kp[i], &kp_copy[i], sizeof(float)) != 0;
        CHECK_MSG(changed <= (size_t)nt * row, "kv_write changed %zu floats for %d tokens", changed, nt);
        for (int tt = 0; tt < nt; tt++) {
            int s = tok_seq[tt], p = tok_pos[tt];
            const float *slot = kp + (backend_kv_block_offset(&g, layer, bt[s * max_blocks + p / block_size]) / sizeof(float)) +
                                (size_t)(p % block_size) * row;
            CHECK(memcmp(slot, k + tt * row, row * sizeof(float)) == 0);
        }

        if (step == 1) {
            float *q = rand_vec((size_t)nt * n_heads * head_dim + 1, -2, 2);
            float *out = malloc(((size_t)nt * n_heads * head_dim + 1) * sizeof(float));
            double *ref = malloc(((size_t)nt * n_heads * head_dim + 1) * sizeof(double));
            double *w = malloc(((size_t)max_blocks * block_size + 1) * sizeof(double));
            for (int tt = 0; tt < nt; tt++) {
                int s = tok_seq[tt], p = tok_pos[tt];
                for (int h = 0; h < n_heads; h++) {
                    int kvh = h / group;
                    const float *qh = q + ((size_t)tt * n_heads + h) * head_dim;
                    double mx = -INFINITY, sum = 0;
                    for (int j = 0; j <= p; j++) {
                        double d = 0;
                        for (int i = 0; i < head_dim; i++)
                            d += (double)qh[i] * K[s][(size_t)j * row + kvh * head_dim + i];
                        w[j] = d / sqrt((double)head_dim);
                        if (w[j] > mx)
                            mx = w[j];
                    }
                    for (int j = 0; j <= p; j++)
                        sum += (w[j] = exp(w[j] - mx));
                    for (int i = 0; i < head_dim; i++) {
                        double o = 0;
                        for (int j = 0; j <= p; j++)
                            o += w[j] * V[s][(size_t)j * row + kvh * head_dim + i];
                        ref[((size_t)tt * n_heads + h) * head_dim + i] = o / sum;
                    }
                }
            }
            CHECK_OK(be->ops->attention(be, &g, kp, vp, layer, &b, q, out, n_heads));
            CHECK_CLOSE(out, ref, (size_t)nt * n_heads * head_dim,
                        "attention seqs=%d tokens=%d bs=%d kvh=%d group=%d hd=%d", sc->n_seqs, nt,
                        block_size, n_kv_heads, group, head_dim);

            /* Bad metadata is refused and writes nothing. */
            if (nt > 0) {
                memcpy(kp_copy, kp, pool_bytes);
                int32_t saved = bt[0];
                bt[0] = g.n_blocks;
                CHECK_EQ_INT(be->ops->kv_write(be, &g, kp, vp, layer, &b, k, v), BATON_ERR_OUT_OF_RANGE);
                CHECK_EQ_INT(be->ops->attention(be, &g, kp, vp, layer, &b, q, out, n_heads),
                             BATON_ERR_OUT_OF_RANGE);
                bt[0] = saved;
                int32_t savedp = tok_pos[nt - 1];
                tok_pos[nt - 1] = nctx[tok_seq[nt - 1]];
                CHECK_EQ_INT(be->ops->kv_write(be, &g, kp, vp, layer, &b, k, v), BATON_ERR_OUT_OF_RANGE);
                tok_pos[nt - 1] = savedp;
                CHECK_EQ_INT(be->ops->kv_write(be, &g, kp, vp, 3, &b, k, v), BATON_ERR_OUT_OF_RANGE);
                ntk[0]--; /* sequence ranges no longer cover the batch */
                CHECK_EQ_INT(be->ops->attention(be, &g, kp, vp, layer, &b, q, out, n_heads),
                             ntk[0] < 0 ? BATON_ERR_OUT_OF_RANGE : BATON_ERR_INVALID_ARG);
                ntk[0]++;
                if (n_kv_heads > 1)
                    CHECK_EQ_INT(be->ops->attention(be, &g, kp, vp, layer, &b, q, out, n_heads + 1),
                                 BATON_ERR_INVALID_ARG);
                CHECK(memcmp(kp, kp_copy, pool_bytes) == 0);
            }
            free(q), free(out), free(ref), free(w);
        }
        free(tok_seq), free(tok_pos), free(k), free(v);
    }
    for (int s = 0; s < sc->n_seqs; s++)
        free(K[s]), free(V[s]);
    be->ops->free(be, kp);
    be->ops->free(be, vp);
    free(kp_copy), free(perm), free(bt);
}

static void test_attention(backend_t *be) {
    /* one sequence, whole prompt in one step, length not a multiple of 16 */
    scenario_t prompt = {1, {0}, {37}};
    /* cached prefix of 20 tokens, then a prefill chunk of 13 */
    scenario_t chunk = {1, {20}, {13}};
    /* one decode token */
    scenario_t one = {1, {0}, {1}};
    scenario_t one_ctx = {1, {150}, {1}};
    /* continuous batching: 4 decode tokens at different context lengths */
    scenario_t decode = {4, {5, 16, 31, 100}, {1, 1, 1, 1}};
    /* mixed: a prefill chunk after a prefix, a decode token, a fresh prompt */
    scenario_t mixed = {3, {7, 49, 0}, {10, 1, 3}};
    const scenario_t *all[] = {&prompt, &chunk, &one, &one_ctx, &decode, &mixed};
    const int geoms[][4] = {/* block_size, n_kv_heads, group, head_dim */
                            {16, 2, 1, 64}, {16, 3, 3, 64}, {16, 1, 4, 32},
                            {5, 2, 4, 24},  {16, 3, 3, 128}, {32, 2, 3, 16}};
    for (size_t gi = 0; gi < sizeof(geoms) / sizeof(geoms[0]); gi++)
        for (size_t si = 0; si < sizeof(all) / sizeof(all[0]); si++)
            run_attention(be, all[si], geoms[gi][0], geoms[gi][1], geoms[gi][2], geoms[gi][3]);
    /* few (token, head) units over long contexts: with several threads the
     * keys are split into ranges and merged (split-K); a second sequence
     * with one key leaves later ranges empty for its rows */
    scenario_t long_decode = {1, {1000}, {1}};
    scenario_t long_short = {2, {999, 0}, {1, 1}};
    scenario_t long_chunk = {1, {700}, {20}};
    run_attention(be, &long_decode, 16, 1, 1, 64);
    run_attention(be, &long_decode, 16, 2, 3, 64);
    run_attention(be, &long_short, 16, 1, 1, 64);
    run_attention(be, &long_short, 5, 1, 4, 24);
    run_attention(be, &long_chunk, 16, 1, 2, 32);
    /* a prompt long enough to exercise several score chunks per block */
    scenario_t longp = {2, {130, 0}, {70, 90}};
    run_attention(be, &longp, 128, 2, 3, 64);
}

/* ---------------- thread pool ---------------- */

typedef struct {
    _Atomic int32_t *hits; /* [n_tasks] */
    _Atomic int32_t bad_worker;
    int n_threads;
} pool_probe_t;

static void pool_probe_task(void *argp, int64_t task, int worker) {
    pool_probe_t *p = argp;
    atomic_fetch_add(&p->hits[task], 1);
    if (worker < 0 || worker >= p->n_threads)
        atomic_fetch_add(&p->bad_worker, 1);
}

/* Every task of every run runs exactly once, on a valid worker id, across
 * many back-to-back runs (a lost wake-up would hang or drop tasks). */
static void test_pool(void) {
    const int threads[] = {1, 2, 5};
    for (int ti = 0; ti < 3; ti++) {
        cpu_pool_t *pool = NULL;
        CHECK_OK(cpu_pool_init(threads[ti], &pool));
        if (!pool)
            continue;
        CHECK_EQ_INT(cpu_pool_n_threads(pool), threads[ti]);
        _Atomic int32_t hits[300];
        pool_probe_t p = {.hits = hits, .n_threads = threads[ti]};
        atomic_init(&p.bad_worker, 0);
        for (int run = 0; run < 500; run++) {
            int n = run % 300;
            for (int i = 0; i < n; i++)
                atomic_init(&hits[i], 0);
            cpu_pool_run(pool, n, pool_probe_task, &p);
            int wrong = 0;
            for (int i = 0; i < n; i++)
                wrong += atomic_load(&hits[i]) != 1;
            CHECK_MSG(wrong == 0, "pool %d threads run %d: %d tasks not run exactly once", threads[ti],
                      run, wrong);
        }
        CHECK_EQ_INT(atomic_load(&p.bad_worker), 0);
        cpu_pool_free(pool);
    }
    cpu_pool_t *pool = NULL;
    CHECK_EQ_INT(cpu_pool_init(0, &pool), BATON_ERR_INVALID_ARG);
    CHECK(pool == NULL);
    cpu_pool_free(NULL);
}

static void test_create(void) {
    backend_t *be = NULL;
    CHECK_EQ_INT(backend_create("nope", 1, &be), BATON_ERR_INVALID_ARG);
    CHECK(be == NULL);
    /* "cuda" is either the CUDA backend (built with CUDA, GPU present) or a
     * clean UNSUPPORTED that leaves `be` alone. */
    baton_status_t st = backend_create("cuda", 1, &be);
    if (st == BATON_OK) {
        CHECK(be && strcmp(be->ops->name, "cuda") == 0);
        backend_free(be);
        be = NULL;
    } else {
        CHECK_EQ_INT(st, BATON_ERR_UNSUPPORTED);
        CHECK(be == NULL);
    }
    CHECK_EQ_INT(backend_cpu_create(-1, &be), BATON_ERR_INVALID_ARG);
    CHECK_OK(backend_create("cpu", 0, &be));
    CHECK(be && strcmp(be->ops->name, "cpu") == 0);
    CHECK_EQ_INT(be->weight_dtype, BACKEND_DTYPE_F32);
    CHECK_EQ_INT(be->kv_dtype, BACKEND_DTYPE_F32);
    backend_free(be);
    backend_free(NULL);
    CHECK_EQ_INT(backend_dtype_size(BACKEND_DTYPE_F32), 4);
    CHECK_EQ_INT(backend_dtype_size(BACKEND_DTYPE_BF16), 2);
    CHECK(strcmp(backend_dtype_name(BACKEND_DTYPE_BF16), "bf16") == 0);
}

int main(void) {
    test_pool();
    test_create();
    const int threads[] = {1, 4};
    for (int ti = 0; ti < 2; ti++) {
        backend_t *be = NULL;
        CHECK_OK(backend_cpu_create(threads[ti], &be));
        if (!be)
            return TEST_DONE();
        test_matmul(be);
        test_rmsnorm(be);
        test_rope(be);
        test_elementwise(be);
        test_attention(be);
        backend_free(be);
    }
    return TEST_DONE();
}
