/* Batch invariance of the CPU forward on the default model (SmolLM2-135M):
 * a sequence decoded alone and the same sequence decoded together with 7
 * others of different lengths must see bit-identical logits at every decode
 * step (memcmp), so greedy decoding and seeded temperature-1 sampling give
 * the same tokens alone and batched.
 *
 * Each sequence is prefilled alone (a step of its own) or packed with others
 * into steps of up to 64 tokens, then decoded DECODE_STEPS steps: alone (a batch of 1; for
 * sequences 0, 2 and 4: the first, the longest prompt and the shortest) and
 * with all 8 sequences in every step. The reference for a batched row is
 * the same sequence's alone run (an independent execution path through the
 * backend: n = 1 matmuls, one-sequence attention), not a stored value. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/model.h"
#include "common/sampling.h"
#include "kernels/backend.h"
#include "tests/test_util.h"

#define N_SEQS 8
#define DECODE_STEPS 4
#define BLOCK 16
#define MAX_BLOCKS 6 /* 96 positions: prompt (<= 64) + decode steps */
/* Tokens per batched prefill step: prompts are packed up to this (the
 * backend's batch-invariant matmul range, kernels/backend.h). */
#define PREFILL_PACK 64

static const int prompt_len[N_SEQS] = {37, 9, 64, 23, 5, 50, 17, 31};

typedef struct {
    int32_t prompt[64];
    int32_t bt[MAX_BLOCKS];
    sampler_t *sampler;          /* NULL: greedy */
    int32_t tokens[DECODE_STEPS + 1]; /* token fed at each decode step, then the last */
    float *logits;               /* [DECODE_STEPS, n_vocab] decode-step logits */
} seq_t;

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

static int32_t pick(seq_t *s, const float *logits, int32_t n_vocab) {
    if (!s->sampler)
        return argmax(logits, n_vocab);
    sampling_result_t r;
    CHECK_OK(sampler_sample(s->sampler, logits, &r));
    CHECK_OK(sampler_accept(s->sampler, r.token));
    return r.token;
}

/* Prefills sequences `which[0..n)` (alone: one step; batched: several
 * prompts per step, up to PREFILL_PACK tokens), then runs DECODE_STEPS
 * decode steps with all of them in every step. Fills tokens and logits. */
static void run(model_t *m, const model_kv_t *kv, seq_t *seqs, const int *which, int n,
                const sampling_params_t *sp) {
    const int32_t n_vocab = model_hparams(m)->n_vocab;
    float *lg = malloc(sizeof(float) * (size_t)n_vocab * N_SEQS);
    for (int i = 0; i < n; i++) {
        seq_t *s = &seqs[which[i]];
        sampler_free(s->sampler);
        s->sampler = NULL;
        if (sp) {
            sampling_params_t p = *sp;
            p.seed = sp->seed + (uint64_t)which[i];
            CHECK_OK(sampler_init(&p, n_vocab, &s->sampler));
        }
    }
    /* prefill: whole prompts, packed into steps of at most PREFILL_PACK tokens */
    for (int i = 0; i < n;) {
        model_seq_t q[N_SEQS];
        int k = 0, total = 0;
        while (i + k < n && (k == 0 || total + prompt_len[which[i + k]] <= PREFILL_PACK)) {
            seq_t *s = &seqs[which[i + k]];
            q[k] = (model_seq_t){s->prompt, prompt_len[which[i + k]], 0, s->bt, MAX_BLOCKS,
                                 MODEL_LOGITS_LAST};
            total += prompt_len[which[i + k]];
            k++;
        }
        model_batch_t b = {q, k};
        CHECK_OK(model_forward(m, kv, &b, lg));
        for (int j = 0; j < k; j++)
            seqs[which[i + j]].tokens[0] = pick(&seqs[which[i + j]], lg + (size_t)j * n_vocab, n_vocab);
        i += k;
    }
    for (int step = 0; step < DECODE_STEPS; step++) {
        model_seq_t q[N_SEQS];
        for (int i = 0; i < n; i++) {
            seq_t *s = &seqs[which[i]];
            q[i] = (model_seq_t){&s->tokens[step], 1, prompt_len[which[i]] + step, s->bt,
                                 MAX_BLOCKS, MODEL_LOGITS_LAST};
        }
        model_batch_t b = {q, n};
        CHECK_OK(model_forward(m, kv, &b, lg));
        for (int i = 0; i < n; i++) {
            seq_t *s = &seqs[which[i]];
            const float *row = lg + (size_t)i * n_vocab;
            memcpy(s->logits + (size_t)step * n_vocab, row, sizeof(float) * n_vocab);
            s->tokens[step + 1] = pick(s, row, n_vocab);
        }
    }
    free(lg);
}

/* Runs sequences 0, 2, 4 alone, then all 8 together, and compares those. */
static void compare(model_t *m, const model_kv_t *kv, seq_t *alone, seq_t *batched,
                    const sampling_params_t *sp, const char *mode) {
    const int32_t n_vocab = model_hparams(m)->n_vocab;
    const int checked[3] = {0, 2, 4};
    for (int i = 0; i < 3; i++)
        run(m, kv, alone, &checked[i], 1, sp);
    const int order[N_SEQS] = {3, 0, 7, 5, 1, 6, 2, 4}; /* batch rows not in sequence order */
    run(m, kv, batched, order, N_SEQS, sp);
    int same_tokens = 0, same_steps = 0;
    for (int i = 0; i < 3; i++) {
        const int s = checked[i];
        for (int step = 0; step < DECODE_STEPS; step++) {
            const int eq = memcmp(alone[s].logits + (size_t)step * n_vocab,
                                  batched[s].logits + (size_t)step * n_vocab,
                                  sizeof(float) * n_vocab) == 0;
            CHECK_MSG(eq, "%s: seq %d (prompt %d) decode step %d logits differ alone vs batched",
                      mode, s, prompt_len[s], step);
            same_steps += eq;
        }
        const int eq = memcmp(alone[s].tokens, batched[s].tokens, sizeof(alone[s].tokens)) == 0;
        CHECK_MSG(eq, "%s: seq %d tokens differ alone vs batched", mode, s);
        same_tokens += eq;
    }
    /* the run did something: the 8 sequences did not all produce one stream */
    int distinct = 0;
    for (int s = 1; s < N_SEQS; s++)
        distinct += memcmp(batched[s].tokens, batched[0].tokens, sizeof(batched[0].tokens)) != 0;
    CHECK_MSG(distinct > 0, "%s: all sequences generated the same tokens", mode);
    fprintf(stderr, "%s: %d/%d decode-step logit rows bit-identical, %d/%d token streams equal "
            "(seq 0: %d %d %d %d %d)\n", mode, same_steps, 3 * DECODE_STEPS, same_tokens, 3,
            alone[0].tokens[0], alone[0].tokens[1], alone[0].tokens[2], alone[0].tokens[3],
            alone[0].tokens[4]);
}

int main(void) {
    const char *path = test_default_model();
    CHECK(path != NULL);
    if (!path)
        return TEST_DONE();
    backend_t *be = NULL;
    CHECK_OK(backend_cpu_create(2, &be));
    if (!be)
        return TEST_DONE();
    model_t *m = NULL;
    CHECK_MSG(model_load(path, be, NULL, &m) == BATON_OK, "%s", baton_last_error());
    if (!m) {
        backend_free(be);
        return TEST_DONE();
    }
    const int32_t n_vocab = model_hparams(m)->n_vocab;
    model_kv_t kv;
    CHECK_OK(model_kv_alloc(m, N_SEQS * MAX_BLOCKS, BLOCK, &kv));

    static seq_t alone[N_SEQS], batched[N_SEQS];
    uint64_t x = 0x853C49E6748FEA9Bull;
    for (int s = 0; s < N_SEQS; s++) {
        for (int i = 0; i < prompt_len[s]; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            /* ordinary token ids (skip the first few hundred: specials, bytes) */
            alone[s].prompt[i] = 300 + (int32_t)(x % (uint64_t)(n_vocab - 300));
        }
        memcpy(batched[s].prompt, alone[s].prompt, sizeof(alone[s].prompt));
        for (int j = 0; j < MAX_BLOCKS; j++)
            alone[s].bt[j] = batched[s].bt[j] = s * MAX_BLOCKS + (MAX_BLOCKS - 1 - j);
        alone[s].logits = malloc(sizeof(float) * (size_t)n_vocab * DECODE_STEPS);
        batched[s].logits = malloc(sizeof(float) * (size_t)n_vocab * DECODE_STEPS);
    }

    compare(m, &kv, alone, batched, NULL, "greedy");
    sampling_params_t sp = sampling_params_default();
    sp.temperature = 1.0f;
    sp.seed = 1234;
    compare(m, &kv, alone, batched, &sp, "seeded temperature 1");

    for (int s = 0; s < N_SEQS; s++) {
        sampler_free(alone[s].sampler);
        sampler_free(batched[s].sampler);
        free(alone[s].logits);
        free(batched[s].logits);
    }
    model_kv_free(m, &kv);
    model_free(m);
    backend_free(be);
    return TEST_DONE();
}
