/* The default model (SmolLM2-135M-Instruct Q4_1) against llama.cpp
 * (tests/data/model_ref.bin from tests/golden/gen_model_ref.py, llama-cpp-
 * python 0.3.36), and batching invariance of greedy decoding.
 * Run as `test_model_ref reference` (sections 1-2) or `test_model_ref
 * batching` (section 3); no argument runs both.
 *
 * Two references (see the generator):
 *  - "exact": llama.cpp on the same weights dequantized to F32 (exact) with
 *    an F32 KV cache, i.e. fp32 compute like ours. Tolerance: max |diff|
 *    <= EXACT_TOL on logits of std ~3.5 (fp32 rounding over 30 layers in a
 *    different summation order; measured 2.5e-5..3.5e-5), and greedy continuations
 *    identical token for token (the reference's smallest top-1/top-2 margin
 *    on these prompts is 0.06, far above EXACT_TOL).
 *  - "stock": llama.cpp running the Q4_1 file as shipped. Its CPU path
 *    quantizes activations to Q8 blocks before every Q4_1/Q8_0 dot product
 *    (ggml-cpu vec_dot_q4_1_q8_1) and keeps the KV cache in F16; over 30
 *    layers that moves logits by up to ~1 (0.59..0.99 between stock and exact
 *    on these prompts, which is where the difference comes from: exact and
 *    our NumPy float64 reference agree to 2e-5). Tolerance on the stock
 *    top-64 logits: max |diff| <= 0.35 * std (std ~3.5, i.e. ~1.2), same
 *    top-5 set, same top-1. Greedy: must match token for token except at a
 *    step where the stock margin is below STOCK_NEAR_TIE (a flip the stock
 *    noise can cause), which is reported. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model.h"
#include "kernels/backend.h"
#include "tests/test_util.h"

#define EXACT_TOL 1e-3
#define STOCK_NEAR_TIE 1.0f
#define BLOCK 16

typedef struct ref_prompt {
    int32_t n_prompt;
    int32_t *ids;
    float *exact_last;                /* [n_vocab] */
    int32_t *stock_top_ids;           /* [n_top] */
    float *stock_top;                 /* [n_top] */
    float stock_std;
    int32_t n_gen[2];                 /* 0 exact, 1 stock */
    int32_t *gen[2];
    float *margin[2];
} ref_prompt_t;

static void *rd(FILE *f, size_t n, int *ok) {
    void *p = malloc(n ? n : 1);
    if (*ok && fread(p, 1, n, f) != n) *ok = 0;
    return p;
}

static int read_ref(const char *path, ref_prompt_t **out, int *n_out, int *n_vocab, int *n_top) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    char magic[4];
    int32_t hdr[3];
    int ok = fread(magic, 1, 4, f) == 4 && memcmp(magic, "BRF2", 4) == 0 && fread(hdr, 4, 3, f) == 3;
    ref_prompt_t *p = ok ? calloc((size_t)hdr[0], sizeof(*p)) : NULL;
    for (int i = 0; ok && i < hdr[0]; i++) {
        ok = fread(&p[i].n_prompt, 4, 1, f) == 1;
        if (!ok) break;
        p[i].ids = rd(f, 4 * (size_t)p[i].n_prompt, &ok);
        p[i].exact_last = rd(f, 4 * (size_t)hdr[1], &ok);
        p[i].stock_top_ids = rd(f, 4 * (size_t)hdr[2], &ok);
        p[i].stock_top = rd(f, 4 * (size_t)hdr[2], &ok);
        ok = ok && fread(&p[i].stock_std, 4, 1, f) == 1;
        for (int k = 0; ok && k < 2; k++) {
            ok = fread(&p[i].n_gen[k], 4, 1, f) == 1 && p[i].n_gen[k] > 0 && p[i].n_gen[k] <= 64;
            if (!ok) break;
            p[i].gen[k] = rd(f, 4 * (size_t)p[i].n_gen[k], &ok);
            p[i].margin[k] = rd(f, 4 * (size_t)p[i].n_gen[k], &ok);
        }
    }
    fclose(f);
    if (!ok) return -1;
    *out = p;
    *n_out = hdr[0];
    *n_vocab = hdr[1];
    *n_top = hdr[2];
    return 0;
}

static int32_t argmax(const float *x, int n) {
    int32_t a = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[a]) a = i;
    return a;
}

static void top5(const float *x, int n, int32_t *ids) {
    for (int k = 0; k < 5; k++) {
        int32_t best = -1;
        for (int i = 0; i < n; i++) {
            int used = 0;
            for (int j = 0; j < k; j++) used |= ids[j] == i;
            if (!used && (best < 0 || x[i] > x[best])) best = i;
        }
        ids[k] = best;
    }
}

/* A greedy generation job for run_greedy. */
typedef struct job {
    const int32_t *prompt;
    int32_t n_prompt;
    int32_t chunk;   /* prefill chunk size */
    int32_t start;   /* first step it joins */
    int32_t n_gen;   /* tokens to generate */
    int32_t *out;    /* [n_gen] generated */
    /* state */
    int32_t *seq;    /* prompt + generated */
    int32_t n_seq, pos, done;
    int32_t blocks[64];
} job_t;

/* Runs every job to completion with one model_forward per step over all
 * active jobs (continuous-batching style). Returns 0 on success. */
static int run_greedy(model_t *m, model_kv_t *kv, job_t *jobs, int n_jobs) {
    const int n_vocab = model_hparams(m)->n_vocab;
    int next_block = 0;
    for (int j = 0; j < n_jobs; j++) {
        job_t *jb = &jobs[j];
        jb->seq = malloc(sizeof(int32_t) * (size_t)(jb->n_prompt + jb->n_gen));
        memcpy(jb->seq, jb->prompt, sizeof(int32_t) * (size_t)jb->n_prompt);
        jb->n_seq = jb->n_prompt;
        jb->pos = 0;
        jb->done = 0;
        int nb = (jb->n_prompt + jb->n_gen + BLOCK - 1) / BLOCK;
        if (nb > 64 || next_block + nb > kv->geom.n_blocks) return -1;
        /* interleave: hand out blocks in reverse so tables are not contiguous */
        for (int b = 0; b < nb; b++) jb->blocks[b] = kv->geom.n_blocks - 1 - (next_block++);
    }
    model_seq_t *seqs = calloc((size_t)n_jobs, sizeof(*seqs));
    int *idx = calloc((size_t)n_jobs, sizeof(int));
    float *logits = malloc(sizeof(float) * (size_t)n_jobs * n_vocab);
    int rc = 0;
    for (int step = 0;; step++) {
        int ns = 0;
        for (int j = 0; j < n_jobs; j++) {
            job_t *jb = &jobs[j];
            if (jb->done >= jb->n_gen || step < jb->start) continue;
            model_seq_t *q = &seqs[ns];
            int32_t n = jb->pos < jb->n_prompt ? jb->n_prompt - jb->pos : 1;
            if (jb->pos < jb->n_prompt && n > jb->chunk) n = jb->chunk;
            q->tokens = jb->seq + jb->pos;
            q->n_tokens = n;
            q->pos = jb->pos;
            q->block_table = jb->blocks;
            q->n_blocks = (jb->pos + n + BLOCK - 1) / BLOCK;
            q->logits = jb->pos + n >= jb->n_prompt ? MODEL_LOGITS_LAST : MODEL_LOGITS_NONE;
            idx[ns++] = j;
        }
        if (ns == 0) break;
        model_batch_t b = {seqs, ns};
        if (model_forward(m, kv, &b, logits) != BATON_OK) {
            fprintf(stderr, "model_forward: %s\n", baton_last_error());
            rc = -1;
            break;
        }
        int row = 0;
        for (int i = 0; i < ns; i++) {
            job_t *jb = &jobs[idx[i]];
            jb->pos += seqs[i].n_tokens;
            if (seqs[i].logits == MODEL_LOGITS_LAST) {
                int32_t t = argmax(logits + (size_t)row * n_vocab, n_vocab);
                row++;
                jb->out[jb->done++] = t;
                jb->seq[jb->n_seq++] = t;
            }
        }
    }
    for (int j = 0; j < n_jobs; j++) free(jobs[j].seq);
    free(seqs);
    free(idx);
    free(logits);
    return rc;
}

int main(int argc, char **argv) {
    const int do_ref = argc < 2 || strcmp(argv[1], "reference") == 0;
    const int do_batch = argc < 2 || strcmp(argv[1], "batching") == 0;
    const char *path = test_default_model();
    CHECK(path != NULL);
    if (!path) return TEST_DONE();
    char refpath[1024];
    snprintf(refpath, sizeof(refpath), "%s/tests/data/model_ref.bin",
             getenv("BATON_SOURCE_DIR") ? getenv("BATON_SOURCE_DIR") : ".");
    ref_prompt_t *ref = NULL;
    int n_ref = 0, n_vocab = 0, n_top = 0;
    CHECK_MSG(read_ref(refpath, &ref, &n_ref, &n_vocab, &n_top) == 0, "cannot read %s", refpath);
    if (!ref) return TEST_DONE();

    backend_t *be = NULL;
    CHECK_OK(backend_cpu_create(2, &be));
    model_t *m = NULL;
    CHECK_MSG(model_load(path, be, NULL, &m) == BATON_OK, "%s", baton_last_error());
    if (!m) return TEST_DONE();
    CHECK_EQ_INT(model_hparams(m)->n_vocab, n_vocab);
    model_kv_t kv;
    CHECK_OK(model_kv_alloc(m, 128, BLOCK, &kv));

    float *logits = malloc(sizeof(float) * (size_t)n_vocab);
    /* 1. last-position logits of each prompt vs both references */
    for (int p = 0; do_ref && p < n_ref; p++) {
        int32_t bt[16];
        for (int i = 0; i < 16; i++) bt[i] = i;
        model_seq_t q = {ref[p].ids, ref[p].n_prompt, 0, bt, 16, MODEL_LOGITS_LAST};
        model_batch_t b = {&q, 1};
        CHECK_OK(model_forward(m, &kv, &b, logits));
        double maxe = 0, maxs = 0;
        for (int i = 0; i < n_vocab; i++) {
            double d = fabs((double)logits[i] - ref[p].exact_last[i]);
            if (!(d <= maxe)) maxe = d;
        }
        for (int i = 0; i < n_top; i++) {
            double d = fabs((double)logits[ref[p].stock_top_ids[i]] - ref[p].stock_top[i]);
            if (!(d <= maxs)) maxs = d;
        }
        int32_t a[5];
        top5(logits, n_vocab, a);
        int same = 0;
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < 5; j++) same += a[i] == ref[p].stock_top_ids[j];
        fprintf(stderr, "prompt %d: exact max |diff| %.2e; stock top-%d max |diff| %.3f (%.3f std), "
                "top-5 overlap %d/5\n", p, maxe, n_top, maxs, maxs / ref[p].stock_std, same);
        CHECK_MSG(maxe <= EXACT_TOL, "prompt %d: max |diff| vs exact %.3g", p, maxe);
        CHECK_MSG(maxs <= 0.35 * ref[p].stock_std, "prompt %d: stock max |diff| %.3f", p, maxs);
        CHECK_MSG(same == 5, "prompt %d: top-5 sets differ (%d/5 shared)", p, same);
        CHECK_EQ_INT(a[0], ref[p].stock_top_ids[0]);
    }

    /* 2. greedy continuations vs both references, all prompts in one batch
     * (staggered joins) */
    job_t jobs[16];
    memset(jobs, 0, sizeof(jobs));
    int32_t outs[16][64];
    for (int p = 0; p < n_ref && p < 16; p++)
        jobs[p] = (job_t){.prompt = ref[p].ids, .n_prompt = ref[p].n_prompt, .chunk = 512,
                          .start = p, .n_gen = ref[p].n_gen[0], .out = outs[p]};
    if (do_ref) CHECK_OK(run_greedy(m, &kv, jobs, n_ref));
    int long_match = 0;
    for (int p = 0; do_ref && p < n_ref; p++) {
        for (int k = 0; k < 2; k++) {
            const char *name = k == 0 ? "exact" : "stock";
            int n = ref[p].n_gen[k] < ref[p].n_gen[0] ? ref[p].n_gen[k] : ref[p].n_gen[0];
            int i = 0;
            while (i < n && outs[p][i] == ref[p].gen[k][i]) i++;
            if (i == n) {
                fprintf(stderr, "prompt %d: greedy %d/%d tokens identical to llama.cpp %s\n", p, i,
                        ref[p].n_gen[k], name);
                if (k == 0 && i >= 32) long_match++;
            } else {
                fprintf(stderr, "prompt %d: greedy diverges from llama.cpp %s at token %d (its margin "
                        "%.4f): %d vs %d\n", p, name, i, ref[p].margin[k][i], outs[p][i], ref[p].gen[k][i]);
                if (k == 0) CHECK_MSG(0, "prompt %d: divergence from the exact reference", p);
                else CHECK_MSG(ref[p].margin[k][i] < STOCK_NEAR_TIE,
                               "prompt %d: divergence from stock at a clear margin %.3f", p,
                               ref[p].margin[k][i]);
            }
        }
    }
    if (do_ref) CHECK_MSG(long_match >= 2, "only %d prompts matched llama.cpp for 32+ tokens", long_match);

    /* 3. batching invariance: prompt 1 alone (one chunk) is the baseline;
     * the same with prefill chunks 1, 7, 16, 64, and inside a batch of 8 mixed
     * sequences (others at different stages, some prefilling while it decodes). */
    if (do_batch) {
        const int P = n_ref > 1 ? 1 : 0, NG = 24;
        int32_t base[64], got[64];
        job_t j0 = {.prompt = ref[P].ids, .n_prompt = ref[P].n_prompt, .chunk = 512, .n_gen = NG, .out = base};
        CHECK_OK(run_greedy(m, &kv, &j0, 1));
        const int chunks[] = {1, 7, 16, 64};
        for (int c = 0; c < 4; c++) {
            job_t j1 = {.prompt = ref[P].ids, .n_prompt = ref[P].n_prompt, .chunk = chunks[c], .n_gen = NG, .out = got};
            CHECK_OK(run_greedy(m, &kv, &j1, 1));
            CHECK_MSG(memcmp(base, got, sizeof(int32_t) * NG) == 0, "chunk %d changes the greedy output", chunks[c]);
        }
        job_t mix[8];
        int32_t mouts[8][64];
        for (int j = 0; j < 8; j++) {
            int pp = j == 3 ? P : j % n_ref;
            mix[j] = (job_t){.prompt = ref[pp].ids, .n_prompt = ref[pp].n_prompt, .chunk = 1 + 5 * j,
                             .start = (j * 3) % 7, .n_gen = j == 3 ? NG : 6 + j, .out = mouts[j]};
        }
        CHECK_OK(run_greedy(m, &kv, mix, 8));
        CHECK_MSG(memcmp(base, mouts[3], sizeof(int32_t) * NG) == 0, "batch of 8 changes the greedy output");
        fprintf(stderr, "batching invariance: chunks 1/7/16/64 and batch of 8 give the same %d tokens\n", NG);

    }

    free(logits);
    model_kv_free(m, &kv);
    model_free(m);
    backend_free(be);
    for (int p = 0; p < n_ref; p++) {
        free(ref[p].ids);
        free(ref[p].exact_last);
        free(ref[p].stock_top_ids);
        free(ref[p].stock_top);
        for (int k = 0; k < 2; k++) {
            free(ref[p].gen[k]);
            free(ref[p].margin[k]);
        }
    }
    free(ref);
    return TEST_DONE();
}
