/* Batch invariance of the CPU backend's decode-path ops (kernels/backend.h,
 * matmul and attention contracts): a token's result must be bit-identical
 * (memcmp) whether it is computed alone on one thread or inside any batch at
 * any thread count. Random data; the accuracy of the same paths against
 * double-precision references is in test_kernels_cpu.c.
 *   matmul: every row of X alone (n = 1) vs inside slices of n = 2..64 rows
 *   (the small-batch path) starting at varying offsets, 1/2/4/8 threads, with
 *   and without bias, shapes with and without an in % 8 tail.
 *   attention: 8 sequences of different context lengths (short, one block,
 *   several 256-key segments), one of them a multi-token chunk; each alone
 *   on 1 thread vs all together, subsets, and alone at 2/4/8 threads (where
 *   few units trigger the parallel segment split). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "tests/test_util.h"

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static float rng_float(float lo, float hi) {
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return lo + (hi - lo) * (float)((x >> 40) * (1.0 / 16777216.0));
}

static float *rand_vec(size_t n, float lo, float hi) {
    float *v = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++)
        v[i] = rng_float(lo, hi);
    return v;
}

/* 8 threads: few (tile, KV head) units per thread, so a long sequence's
 * segments are spread over parallel tasks and merged (for 8 sequences and
 * for one alone alike). */
#define N_THREADS 4
static const int thread_counts[N_THREADS] = {1, 2, 4, 8};

static void test_matmul_invariance(backend_t *bes[N_THREADS]) {
    const int shapes[][2] = {/* in, out */ {576, 1536}, {581, 101}, {1536, 576}, {13, 7}};
    const int n_max = 64;
    const int ns[] = {2, 3, 4, 5, 7, 8, 13, 32, 63, 64};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        const int in = shapes[si][0], out = shapes[si][1];
        float *W = rand_vec((size_t)out * in, -1, 1);
        float *B = rand_vec((size_t)out, -1, 1);
        float *X = rand_vec((size_t)(n_max + 8) * in, -2, 2);
        float *alone = malloc((size_t)(n_max + 8) * out * sizeof(float));
        float *y = malloc((size_t)n_max * out * sizeof(float));
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            backend_weight_t *w[N_THREADS], *b[N_THREADS];
            for (int ti = 0; ti < N_THREADS; ti++) {
                w[ti] = b[ti] = NULL;
                CHECK_OK(bes[ti]->ops->weight_create(bes[ti], W, out, in, &w[ti]));
                if (with_bias)
                    CHECK_OK(bes[ti]->ops->weight_create(bes[ti], B, 1, out, &b[ti]));
            }
            /* the baseline: each row alone, one thread */
            for (int r = 0; r < n_max + 8; r++)
                CHECK_OK(bes[0]->ops->matmul(bes[0], w[0], b[0], X + (size_t)r * in,
                                             alone + (size_t)r * out, 1));
            int mismatches = 0;
            for (int ti = 0; ti < N_THREADS; ti++)
                for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
                    const int n = ns[ni], off = (int)(ni + (size_t)ti) % 8;
                    CHECK_OK(bes[ti]->ops->matmul(bes[ti], w[ti], b[ti], X + (size_t)off * in, y, n));
                    for (int r = 0; r < n; r++)
                        if (memcmp(y + (size_t)r * out, alone + (size_t)(off + r) * out,
                                   (size_t)out * sizeof(float)) != 0) {
                            if (mismatches++ < 5)
                                CHECK_MSG(0, "matmul in=%d out=%d bias=%d: row %d of n=%d "
                                          "(threads %d) differs from the row alone", in, out,
                                          with_bias, r, n, thread_counts[ti]);
                        }
                }
            CHECK_MSG(mismatches == 0, "matmul in=%d out=%d bias=%d: %d rows differ", in, out,
                      with_bias, mismatches);
            for (int ti = 0; ti < N_THREADS; ti++) {
                bes[ti]->ops->weight_free(bes[ti], w[ti]);
                bes[ti]->ops->weight_free(bes[ti], b[ti]);
            }
        }
        free(W), free(B), free(X), free(alone), free(y);
    }
}

/* Attention over a pool filled with random K/V; sequences own disjoint
 * blocks. The step's tokens of sequence s are n_new[s] tokens ending at
 * position ctx[s] - 1. */
#define A_SEQS 8
#define A_BS 16
#define A_KVH 3
#define A_GROUP 3
#define A_HD 64
static const int a_ctx[A_SEQS] = {1100, 5, 300, 17, 600, 256, 257, 40};
static const int a_new[A_SEQS] = {1, 1, 1, 1, 22, 1, 1, 1}; /* 22 = tiles of 16 + 6 */

typedef struct {
    backend_kv_geom_t g;
    float *kp, *vp;
    int32_t bt[A_SEQS][80];
    float *q[A_SEQS]; /* [n_new, heads, hd] */
} attn_fixture_t;

/* Runs attention on sequences `which[0..n)` (in that order) and copies each
 * one's output rows to outs[which[i]]. */
static void attn_run(backend_t *be, const attn_fixture_t *f, const int *which, int n,
                     float *outs[A_SEQS]) {
    int32_t tok_seq[64], tok_pos[64], first[A_SEQS], ntk[A_SEQS], nctx[A_SEQS];
    int32_t bt[A_SEQS * 80];
    const int heads = A_KVH * A_GROUP, per_tok = heads * A_HD;
    float *q = malloc(sizeof(float) * 64 * per_tok), *out = malloc(sizeof(float) * 64 * per_tok);
    int t = 0;
    for (int i = 0; i < n; i++) {
        const int s = which[i];
        first[i] = t, ntk[i] = a_new[s], nctx[i] = a_ctx[s];
        memcpy(bt + i * 80, f->bt[s], sizeof(f->bt[s]));
        memcpy(q + (size_t)t * per_tok, f->q[s], sizeof(float) * a_new[s] * per_tok);
        for (int j = 0; j < a_new[s]; j++, t++)
            tok_seq[t] = i, tok_pos[t] = a_ctx[s] - a_new[s] + j;
    }
    backend_attn_batch_t b = {.n_tokens = t, .n_seqs = n, .tok_seq = tok_seq, .tok_pos = tok_pos,
                              .seq_first_tok = first, .seq_n_tok = ntk, .seq_n_ctx = nctx,
                              .block_tables = bt, .max_blocks = 80};
    CHECK_OK(be->ops->attention(be, &f->g, f->kp, f->vp, 1, &b, q, out, heads));
    for (int i = 0; i < n; i++)
        memcpy(outs[which[i]], out + (size_t)first[i] * per_tok,
               sizeof(float) * a_new[which[i]] * per_tok);
    free(q), free(out);
}

static void test_attention_invariance(backend_t *bes[N_THREADS]) {
    attn_fixture_t f = {.g = {.n_layers = 2, .n_blocks = 0, .block_size = A_BS, .n_kv_heads = A_KVH,
                              .head_dim = A_HD, .dtype = BACKEND_DTYPE_F32}};
    int used = 0;
    for (int s = 0; s < A_SEQS; s++)
        used += (a_ctx[s] + A_BS - 1) / A_BS;
    f.g.n_blocks = used;
    const size_t pool_floats = backend_kv_block_offset(&f.g, f.g.n_layers, 0) / sizeof(float);
    f.kp = rand_vec(pool_floats, -1, 1);
    f.vp = rand_vec(pool_floats, -1, 1);
    /* blocks handed out interleaved (block j of sequence s = j * A_SEQS + s
     * where it fits) so that no sequence's blocks are contiguous */
    int next = 0;
    for (int s = 0; s < A_SEQS; s++)
        for (int j = 0; j < 80; j++)
            f.bt[s][j] = j < (a_ctx[s] + A_BS - 1) / A_BS ? (used - 1 - next++) : -1;
    const int per_tok = A_KVH * A_GROUP * A_HD;
    float *alone[A_SEQS], *got[A_SEQS];
    for (int s = 0; s < A_SEQS; s++) {
        f.q[s] = rand_vec((size_t)a_new[s] * per_tok, -3, 3);
        alone[s] = malloc(sizeof(float) * a_new[s] * per_tok);
        got[s] = malloc(sizeof(float) * a_new[s] * per_tok);
    }
    for (int s = 0; s < A_SEQS; s++)
        attn_run(bes[0], &f, &s, 1, alone);
    const int all[A_SEQS] = {0, 1, 2, 3, 4, 5, 6, 7};
    const int rev[A_SEQS] = {7, 6, 5, 4, 3, 2, 1, 0};
    const int some[3] = {6, 0, 4};
    int mismatches = 0;
    for (int ti = 0; ti < N_THREADS; ti++) {
        const struct {
            const int *which;
            int n;
            const char *name;
        } runs[] = {{all, A_SEQS, "all 8"}, {rev, A_SEQS, "all 8 reversed"}, {some, 3, "3 of 8"}};
        for (size_t ri = 0; ri < sizeof(runs) / sizeof(runs[0]); ri++) {
            attn_run(bes[ti], &f, runs[ri].which, runs[ri].n, got);
            for (int i = 0; i < runs[ri].n; i++) {
                const int s = runs[ri].which[i];
                if (memcmp(got[s], alone[s], sizeof(float) * a_new[s] * per_tok) != 0 &&
                    mismatches++ < 5)
                    CHECK_MSG(0, "attention: seq %d (ctx %d) in batch '%s' at %d threads differs "
                              "from alone", s, a_ctx[s], runs[ri].name, thread_counts[ti]);
            }
        }
        /* alone at this thread count (1 unit-tile: the segment split runs) */
        for (int s = 0; s < A_SEQS; s++) {
            attn_run(bes[ti], &f, &s, 1, got);
            if (memcmp(got[s], alone[s], sizeof(float) * a_new[s] * per_tok) != 0 && mismatches++ < 5)
                CHECK_MSG(0, "attention: seq %d (ctx %d) alone at %d threads differs from 1 thread", s,
                          a_ctx[s], thread_counts[ti]);
        }
    }
    CHECK_MSG(mismatches == 0, "attention: %d sequence outputs differ", mismatches);
    for (int s = 0; s < A_SEQS; s++)
        free(f.q[s]), free(alone[s]), free(got[s]);
    free(f.kp), free(f.vp);
}

int main(void) {
    backend_t *bes[N_THREADS] = {NULL};
    for (int ti = 0; ti < N_THREADS; ti++) {
        CHECK_OK(backend_cpu_create(thread_counts[ti], &bes[ti]));
        if (!bes[ti])
            return TEST_DONE();
    }
    test_matmul_invariance(bes);
    test_attention_invariance(bes);
    for (int ti = 0; ti < N_THREADS; ti++)
        backend_free(bes[ti]);
    return TEST_DONE();
}
