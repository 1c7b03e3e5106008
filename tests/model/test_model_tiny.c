/* Model load + forward on the tiny random GGUF models (tests/data/tiny_*,
 * made by tests/golden/make_tiny_model.py) against the golden logits of the
 * independent NumPy forward (tests/golden/numpy_llama.py, float64 on weights
 * dequantized by the `gguf` package).
 *
 * Checks: one-shot prefill; prefill in chunks of 1, 7, 16 and 64 tokens; 8
 * sequences in one mixed batch (prefill chunks next to decode tokens,
 * physical blocks interleaved between sequences); every logits row is
 * compared with the golden row of its position. Seeded sampling gives the
 * same tokens alone and batched. Load errors (unsupported
 * tensor type, missing key / tensor, other architecture) and forward
 * argument errors. */
#define _GNU_SOURCE /* memmem */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf.h"
#include "common/model.h"
#include "common/sampling.h"
#include "kernels/backend.h"
#include "tests/test_util.h"

/* |ours - numpy| allowed per logit: the reference is float64, we compute in
 * fp32 with ~1e-7 relative rounding per op over 2 layers of 64-128-wide dot
 * products; logits here have magnitude up to ~30. */
#define TOL 1e-4

typedef struct golden {
    int32_t n_tokens, n_vocab;
    int32_t *tokens;
    float *logits;
} golden_t;

static char *data_path(const char *name) {
    static char buf[4][1024];
    static int k = 0;
    const char *src = getenv("BATON_SOURCE_DIR");
    char *b = buf[k++ & 3];
    snprintf(b, 1024, "%s/tests/data/%s", src ? src : ".", name);
    return b;
}

static int read_golden(const char *name, golden_t *g) {
    FILE *f = fopen(data_path(name), "rb");
    if (!f) return -1;
    int32_t hdr[2];
    int ok = fread(hdr, 4, 2, f) == 2;
    if (ok) {
        g->n_tokens = hdr[0];
        g->n_vocab = hdr[1];
        g->tokens = malloc(4 * (size_t)hdr[0]);
        g->logits = malloc(4 * (size_t)hdr[0] * hdr[1]);
        ok = fread(g->tokens, 4, hdr[0], f) == (size_t)hdr[0] &&
             fread(g->logits, 4, (size_t)hdr[0] * hdr[1], f) == (size_t)hdr[0] * hdr[1];
    }
    fclose(f);
    return ok ? 0 : -1;
}

static double row_diff(const float *a, const float *b, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* NaN propagates */
    }
    return m;
}

/* Runs `g` through the model with every sequence chunked by `chunk`, 8
 * sequences at staggered progress in each step (sequence s starts s steps
 * late), blocks interleaved: sequence s uses physical blocks s, s+8, s+16...
 * Compares every returned row with the golden row. Returns max diff. */
static double run_schedule(model_t *m, const golden_t *g, int n_seq, int chunk, int block_size) {
    const int max_blocks = (g->n_tokens + block_size - 1) / block_size;
    model_kv_t kv;
    if (model_kv_alloc(m, n_seq * max_blocks, block_size, &kv) != BATON_OK) return INFINITY;
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)n_seq * max_blocks);
    for (int s = 0; s < n_seq; s++)
        for (int j = 0; j < max_blocks; j++) bt[s * max_blocks + j] = j * n_seq + s;
    int *pos = calloc((size_t)n_seq, sizeof(int));
    int *start = calloc((size_t)n_seq, sizeof(int));
    model_seq_t *seqs = calloc((size_t)n_seq, sizeof(model_seq_t));
    int *seq_of = calloc((size_t)n_seq, sizeof(int));
    float *logits = malloc(sizeof(float) * (size_t)g->n_tokens * n_seq * g->n_vocab);
    double worst = 0;
    for (int step = 0;; step++) {
        int ns = 0;
        for (int s = 0; s < n_seq; s++) {
            if (step < s || pos[s] >= g->n_tokens) continue;
            /* sequence s alternates: a chunk of `chunk`, else (odd s after its
             * first chunk) single decode-like tokens */
            int c = (s % 2 == 1 && pos[s] > 0) ? 1 : chunk;
            if (c > g->n_tokens - pos[s]) c = g->n_tokens - pos[s];
            model_seq_t *q = &seqs[ns];
            q->tokens = g->tokens + pos[s];
            q->n_tokens = c;
            q->pos = pos[s];
            q->block_table = bt + s * max_blocks;
            q->n_blocks = (pos[s] + c + block_size - 1) / block_size;
            q->logits = MODEL_LOGITS_ALL;
            seq_of[ns] = s;
            start[ns] = pos[s];
            ns++;
        }
        if (ns == 0) break;
        model_batch_t b = {seqs, ns};
        baton_status_t st = model_forward(m, &kv, &b, logits);
        if (st != BATON_OK) {
            fprintf(stderr, "model_forward: %s\n", baton_last_error());
            worst = INFINITY;
            break;
        }
        int row = 0;
        for (int i = 0; i < ns; i++) {
            for (int t = 0; t < seqs[i].n_tokens; t++, row++) {
                double d = row_diff(logits + (size_t)row * g->n_vocab,
                                    g->logits + (size_t)(start[i] + t) * g->n_vocab, g->n_vocab);
                if (!(d <= worst)) worst = d;
            }
            pos[seq_of[i]] += seqs[i].n_tokens;
        }
    }
    model_kv_free(m, &kv);
    free(bt);
    free(pos);
    free(start);
    free(seqs);
    free(seq_of);
    free(logits);
    return worst;
}

static void test_model_vs_numpy(backend_t *be, const char *gguf_name, const char *logits_name,
                                model_arch_t arch) {
    golden_t g = {0};
    CHECK_MSG(read_golden(logits_name, &g) == 0, "cannot read %s", logits_name);
    if (!g.logits) return;
    model_load_params_t lp = model_load_params_default();
    lp.max_batch_tokens = 320;
    lp.max_logit_rows = 7; /* exercise multi-pass logits */
    model_t *m = NULL;
    baton_status_t st = model_load(data_path(gguf_name), be, &lp, &m);
    CHECK_MSG(st == BATON_OK, "load %s: %s", gguf_name, baton_last_error());
    if (!m) goto out;
    const model_hparams_t *hp = model_hparams(m);
    CHECK_EQ_INT(hp->arch, arch);
    CHECK_EQ_INT(hp->n_vocab, g.n_vocab);
    CHECK_EQ_INT(hp->n_layer, 2);
    CHECK_EQ_INT(hp->n_head, 4);
    CHECK_EQ_INT(hp->n_head_kv, 2);
    CHECK_EQ_INT(hp->head_dim, 16);
    CHECK_EQ_INT(hp->n_ctx_train, 96);
    CHECK_EQ_INT(hp->tied_output, arch == MODEL_ARCH_LLAMA);
    CHECK_EQ_INT(hp->has_rope_freqs, arch == MODEL_ARCH_LLAMA);
    CHECK_EQ_INT(hp->rope_neox, arch == MODEL_ARCH_QWEN2);
    CHECK(fabsf(hp->rope_freq_scale - (arch == MODEL_ARCH_QWEN2 ? 0.5f : 1.0f)) < 1e-7f);

    const int chunks[] = {40, 1, 7, 16, 64};
    for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++) {
        double d = run_schedule(m, &g, 1, chunks[i], 16);
        CHECK_MSG(d <= TOL, "%s: one sequence, chunk %d: max |diff| %g", gguf_name, chunks[i], d);
        fprintf(stderr, "%s chunk %2d alone:   max |logit - numpy| = %.3g\n", gguf_name, chunks[i], d);
    }
    const int mixed[] = {7, 16};
    for (size_t i = 0; i < 2; i++) {
        double d = run_schedule(m, &g, 8, mixed[i], i == 0 ? 16 : 5);
        CHECK_MSG(d <= TOL, "%s: 8 mixed sequences, chunk %d: max |diff| %g", gguf_name, mixed[i], d);
        fprintf(stderr, "%s chunk %2d batch 8: max |logit - numpy| = %.3g\n", gguf_name, mixed[i], d);
    }
out:
    model_free(m);
    free(g.tokens);
    free(g.logits);
}


/* Seeded sampling through the model: each request's tokens are the same
 * whether it runs alone or in a batch with other seeded requests that join
 * at different steps (its RNG stream advances only when it samples). */
static void sample_run(model_t *m, model_kv_t *kv, const int32_t *prompt, int n_prompt,
                       const uint64_t *seeds, const int *starts, int n_req, int n_gen,
                       int32_t out[][32]) {
    const int32_t nv = model_hparams(m)->n_vocab;
    sampler_t *smp[8] = {0};
    int32_t seq[8][64], bt[8][8], pos[8] = {0}, done[8] = {0};
    float *logits = malloc(sizeof(float) * 8 * (size_t)nv);
    for (int r = 0; r < n_req; r++) {
        sampling_params_t sp = sampling_params_default();
        sp.temperature = 1.0f;
        sp.top_p = 0.9f;
        sp.seed = seeds[r];
        CHECK_OK(sampler_init(&sp, nv, &smp[r]));
        memcpy(seq[r], prompt, sizeof(int32_t) * (size_t)n_prompt);
        for (int j = 0; j < 8; j++) bt[r][j] = r * 8 + j;
    }
    for (int step = 0;; step++) {
        model_seq_t q[8];
        int idx[8], ns = 0;
        for (int r = 0; r < n_req; r++) {
            if (step < starts[r] || done[r] == n_gen) continue;
            int n = pos[r] == 0 ? n_prompt : 1;
            q[ns] = (model_seq_t){seq[r] + pos[r], n, pos[r], bt[r], 8, MODEL_LOGITS_LAST};
            idx[ns++] = r;
        }
        if (ns == 0) break;
        model_batch_t b = {q, ns};
        baton_status_t st = model_forward(m, kv, &b, logits);
        CHECK_OK(st);
        if (st != BATON_OK) break;
        for (int i = 0; i < ns; i++) {
            int r = idx[i];
            sampling_result_t res;
            CHECK_OK(sampler_sample(smp[r], logits + (size_t)i * nv, &res));
            pos[r] += q[i].n_tokens;
            seq[r][pos[r]] = res.token;
            out[r][done[r]++] = res.token;
        }
    }
    for (int r = 0; r < n_req; r++) sampler_free(smp[r]);
    free(logits);
}

static void test_seeded_batch(backend_t *be) {
    model_t *m = NULL;
    CHECK_OK(model_load(data_path("tiny_qwen2.gguf"), be, NULL, &m));
    if (!m) return;
    model_kv_t kv;
    CHECK_OK(model_kv_alloc(m, 64, 8, &kv));
    const int32_t prompt[5] = {40, 41, 42, 43, 44};
    const uint64_t seeds[4] = {1, 2, 3, 1};
    const int zero[4] = {0, 0, 0, 0}, starts[4] = {0, 2, 3, 5};
    int32_t alone[4][32], batched[4][32];
    for (int r = 0; r < 4; r++) sample_run(m, &kv, prompt, 5, &seeds[r], zero, 1, 24, &alone[r]);
    sample_run(m, &kv, prompt, 5, seeds, starts, 4, 24, batched);
    for (int r = 0; r < 4; r++)
        CHECK_MSG(memcmp(alone[r], batched[r], sizeof(int32_t) * 24) == 0,
                  "seeded request %d differs alone vs batched", r);
    /* same seed -> same text; different seeds -> different text */
    CHECK(memcmp(alone[0], alone[3], sizeof(int32_t) * 24) == 0);
    CHECK(memcmp(alone[0], alone[1], sizeof(int32_t) * 24) != 0);
    model_kv_free(m, &kv);
    model_free(m);
}

static void test_forward_errors(backend_t *be) {
    model_t *m = NULL;
    CHECK_OK(model_load(data_path("tiny_llama.gguf"), be, NULL, &m));
    if (!m) return;
    model_kv_t kv;
    CHECK_OK(model_kv_alloc(m, 8, 16, &kv));
    int32_t toks[4] = {5, 6, 7, 8};
    int32_t bt[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    float logits[4 * 272];
    model_seq_t q = {toks, 4, 0, bt, 1, MODEL_LOGITS_LAST};
    model_batch_t b = {&q, 1};
    CHECK_OK(model_forward(m, &kv, &b, logits));
    toks[2] = 272;
    CHECK_EQ_INT(model_forward(m, &kv, &b, logits), BATON_ERR_INVALID_ARG);
    CHECK(strstr(baton_last_error(), "272") != NULL);
    toks[2] = 7;
    bt[0] = 8;
    CHECK_EQ_INT(model_forward(m, &kv, &b, logits), BATON_ERR_INVALID_ARG);
    bt[0] = 0;
    q.pos = 94; /* 94 + 4 > 96 */
    q.n_blocks = 7;
    CHECK_EQ_INT(model_forward(m, &kv, &b, logits), BATON_ERR_OUT_OF_RANGE);
    q.pos = 14; /* needs 2 blocks, has 1 */
    q.n_blocks = 1;
    CHECK_EQ_INT(model_forward(m, &kv, &b, logits), BATON_ERR_OUT_OF_RANGE);
    q.pos = 0;
    q.n_tokens = 0;
    CHECK_EQ_INT(model_forward(m, &kv, &b, logits), BATON_ERR_INVALID_ARG);
    b.n_seqs = 0;
    CHECK_EQ_INT(model_forward(m, &kv, &b, logits), BATON_ERR_INVALID_ARG);
    /* more tokens than max_batch_tokens (512) */
    int32_t *many = calloc(600, sizeof(int32_t));
    int32_t bt2[40];
    for (int i = 0; i < 40; i++) bt2[i] = i % 8;
    model_seq_t q2 = {many, 600, 0, bt2, 40, MODEL_LOGITS_NONE};
    model_batch_t b2 = {&q2, 1};
    CHECK_EQ_INT(model_forward(m, &kv, &b2, NULL), BATON_ERR_OUT_OF_RANGE);
    free(many);
    /* KV geometry of another model */
    model_kv_t wrong = kv;
    wrong.geom.head_dim = 8;
    q.n_tokens = 4;
    b.n_seqs = 1;
    CHECK_EQ_INT(model_forward(m, &wrong, &b, logits), BATON_ERR_INVALID_ARG);
    model_kv_free(m, &kv);
    model_free(m);
}

/* Loads a copy of `name` with `from` replaced by `to` (same length) at its
 * first occurrence after `after` (NULL: from the start); returns the status. */
static baton_status_t load_patched(backend_t *be, const char *name, const char *after,
                                   const char *from, const char *to) {
    FILE *f = fopen(data_path(name), "rb");
    if (!f) return BATON_ERR_IO;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)sz);
    size_t got = fread(buf, 1, (size_t)sz, f);
    fclose(f);
    if (got != (size_t)sz) {
        free(buf);
        return BATON_ERR_IO;
    }
    char *p = buf;
    if (after) p = memmem(buf, (size_t)sz, after, strlen(after));
    if (p) p = memmem(p, (size_t)sz - (size_t)(p - buf), from, strlen(from));
    if (!p) {
        free(buf);
        return BATON_ERR_INTERNAL;
    }
    memcpy(p, to, strlen(to));
    gguf_file_t *gf = NULL;
    baton_status_t st = gguf_open_memory(buf, (size_t)sz, &gf);
    model_t *m = NULL;
    if (st == BATON_OK) st = model_load_gguf(gf, be, NULL, &m);
    model_free(m);
    gguf_close(gf);
    free(buf);
    return st;
}

static void test_load_errors(backend_t *be) {
    model_t *m = (model_t *)0x1;
    baton_status_t st = model_load(data_path("tiny_unsupported_type.gguf"), be, NULL, &m);
    CHECK_EQ_INT(st, BATON_ERR_UNSUPPORTED);
    CHECK(m == (model_t *)0x1);
    CHECK_MSG(strstr(baton_last_error(), "blk.0.ffn_up.weight") != NULL, "%s", baton_last_error());
    CHECK_MSG(strstr(baton_last_error(), "q5_0") != NULL, "%s", baton_last_error());

    st = load_patched(be, "tiny_llama.gguf", NULL, "llama.block_count", "llama.block_coun_");
    CHECK_EQ_INT(st, BATON_ERR_NOT_FOUND);
    CHECK_MSG(strstr(baton_last_error(), "llama.block_count") != NULL, "%s", baton_last_error());

    st = load_patched(be, "tiny_llama.gguf", "general.architecture", "llama", "gemma");
    CHECK_EQ_INT(st, BATON_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(baton_last_error(), "gemma") != NULL, "%s", baton_last_error());

    st = load_patched(be, "tiny_llama.gguf", NULL, "blk.1.ffn_down.weight", "blk.1.ffn_dowX.weight");
    CHECK_EQ_INT(st, BATON_ERR_NOT_FOUND);
    CHECK_MSG(strstr(baton_last_error(), "blk.1.ffn_down.weight") != NULL, "%s", baton_last_error());

    st = load_patched(be, "tiny_qwen2.gguf", NULL, "blk.0.attn_k.bias", "blk.0.attn_k.bia_");
    CHECK_EQ_INT(st, BATON_ERR_NOT_FOUND);
    CHECK_MSG(strstr(baton_last_error(), "blk.0.attn_k.bias") != NULL, "%s", baton_last_error());

    CHECK_EQ_INT(model_load(data_path("no_such_model.gguf"), be, NULL, &m), BATON_ERR_IO);
    CHECK(m == (model_t *)0x1);
}

int main(void) {
    backend_t *be = NULL;
    if (backend_cpu_create(2, &be) != BATON_OK) {
        fprintf(stderr, "backend_cpu_create: %s\n", baton_last_error());
        return 1;
    }
    test_model_vs_numpy(be, "tiny_llama.gguf", "tiny_llama.logits", MODEL_ARCH_LLAMA);
    test_model_vs_numpy(be, "tiny_qwen2.gguf", "tiny_qwen2.logits", MODEL_ARCH_QWEN2);
    test_seeded_batch(be);
    test_forward_errors(be);
    test_load_errors(be);
    backend_free(be);
    return TEST_DONE();
}
