/* Decode scheduler (decode_worker/decode_sched.h) on the tiny random llama
 * model (tests/data/tiny_llama.gguf: 2 layers, vocab 272, context 96).
 *
 * The reference for every token is an independent single-sequence loop in
 * this file: model_forward over a private contiguous KV, prefill of the
 * whole prompt, then one token at a time, argmax (lowest id on ties) or one
 * seeded sampler for the whole request (prompt accepted, then every token),
 * the way `baton generate` runs a request. The scheduler must reproduce it
 * token for token whatever else shares its batches, whether a sequence was
 * preempted and recomputed, or adopted from a colocated prefill.
 *
 * The PrefillDone input is made here: the test runs the prompt through
 * model_forward into the blocks the scheduler reserved (hooks.reserved) and
 * samples the first token with a sampler seeded like the request's. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/kv_pool.h"
#include "common/model.h"
#include "common/sampling.h"
#include "decode_worker/decode_sched.h"
#include "kernels/backend.h"
#include "tests/test_util.h"

#define MAXR 16    /* requests per scenario */
#define MAXTOK 128

static model_t *g_model;
static bool g_real; /* the default model: shorter generations (CPU time) */
static backend_t *g_be;
static int32_t g_vocab;

static const char *data_path(const char *name) {
    static char buf[1024];
    const char *src = getenv("BATON_SOURCE_DIR");
    snprintf(buf, sizeof(buf), "%s/tests/data/%s", src ? src : ".", name);
    return buf;
}

static int32_t argmax(const float *row, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (row[i] > row[b]) b = i;
    return b;
}

static float log_softmax_at(const float *row, int32_t n, int32_t t) {
    double m = row[0];
    for (int32_t i = 1; i < n; i++)
        if (row[i] > m) m = row[i];
    double z = 0;
    for (int32_t i = 0; i < n; i++) z += exp((double)row[i] - m);
    return (float)((double)row[t] - m - log(z));
}

/* Reference: n_gen tokens for `prompt` alone. temperature 0: argmax; else
 * one sampler seeded `seed` (temperature `temp`). lp gets each token's
 * log-softmax (temperature 1) for greedy. */
static int ref_generate(const int32_t *prompt, int32_t n_prompt, int32_t n_gen, float temp,
                        uint64_t seed, int32_t *out, float *lp) {
    const int32_t B = 16;
    int32_t nb = (n_prompt + n_gen + B - 1) / B;
    model_kv_t kv;
    if (model_kv_alloc(g_model, nb, B, &kv) != BATON_OK) return -1;
    int32_t bt[64];
    for (int32_t i = 0; i < nb; i++) bt[i] = nb - 1 - i; /* reversed: physical order differs */
    float *logits = malloc(sizeof(float) * (size_t)g_vocab);
    sampling_params_t sp = sampling_params_default();
    sp.temperature = temp;
    sp.seed = seed;
    sampler_t *smp = NULL;
    sampler_init(&sp, g_vocab, &smp);
    for (int32_t i = 0; i < n_prompt; i++) sampler_accept(smp, prompt[i]);
    int rc = 0;
    int32_t pos = 0;
    const int32_t *in = prompt;
    int32_t n_in = n_prompt;
    for (int32_t k = 0; k < n_gen; k++) {
        model_seq_t ms = {.tokens = in, .n_tokens = n_in, .pos = pos, .block_table = bt,
                          .n_blocks = nb, .logits = MODEL_LOGITS_LAST};
        model_batch_t b = {.seqs = &ms, .n_seqs = 1};
        if (model_forward(g_model, &kv, &b, logits) != BATON_OK) {
            rc = -1;
            break;
        }
        pos += n_in;
        if (temp == 0.0f) {
            out[k] = argmax(logits, g_vocab);
        } else {
            sampling_result_t r;
            sampler_sample(smp, logits, &r);
            out[k] = r.token;
        }
        if (lp) lp[k] = log_softmax_at(logits, g_vocab, out[k]);
        sampler_accept(smp, out[k]);
        in = &out[k];
        n_in = 1;
    }
    sampler_free(smp);
    free(logits);
    model_kv_free(g_model, &kv);
    return rc;
}

/* ---- harness ------------------------------------------------------------- */

typedef struct req {
    uint8_t id[16];
    int32_t prompt[MAXTOK];
    int32_t n_prompt;
    float temp;
    uint64_t seed;
    int32_t n_logprobs;
    /* reservation */
    int reserved;
    int32_t blocks[64];
    int32_t n_blocks;
    /* output */
    int32_t out[MAXTOK];
    float out_lp[MAXTOK];
    sampling_logprob_t out_top[MAXTOK][4];
    int32_t n_out;
    int finished;
    decode_sched_result_t res;
    int entries_this_step;
    int first_entry_tokens;
} req_t;

typedef struct harness {
    kv_pool_t *pool;
    decode_sched_t *s;
    req_t r[MAXR];
    int n_chunks;
    int bad_chunk; /* a request twice in one chunk, or an empty entry */
    float *logits;
} harness_t;

static req_t *by_id(harness_t *h, const uint8_t *id) {
    for (int i = 0; i < MAXR; i++)
        if (memcmp(h->r[i].id, id, 16) == 0) return &h->r[i];
    return NULL;
}

static void on_reserved(void *arg, const uint8_t *id, void *user, const int32_t *blocks, int32_t n) {
    harness_t *h = arg;
    req_t *r = by_id(h, id);
    if (!r || r != user) {
        h->bad_chunk++;
        return;
    }
    r->reserved++;
    r->n_blocks = n;
    memcpy(r->blocks, blocks, sizeof(int32_t) * (size_t)n);
}

static void on_chunk(void *arg, uint64_t step, const decode_sched_entry_t *e, int32_t n) {
    harness_t *h = arg;
    h->n_chunks++;
    for (int i = 0; i < MAXR; i++) h->r[i].entries_this_step = 0;
    for (int32_t k = 0; k < n; k++) {
        req_t *r = e[k].user;
        if (r->entries_this_step++ || e[k].n_tokens < 1) h->bad_chunk++;
        if (r->n_out == 0) r->first_entry_tokens = e[k].n_tokens;
        for (int32_t j = 0; j < e[k].n_tokens && r->n_out < MAXTOK; j++) {
            r->out_lp[r->n_out] = e[k].logprobs ? e[k].logprobs[j] : NAN;
            for (int32_t t = 0; t < e[k].top_k && t < 4; t++)
                r->out_top[r->n_out][t] = e[k].top[j * e[k].top_k + t];
            r->out[r->n_out++] = e[k].tokens[j];
        }
    }
}

static void on_finished(void *arg, const decode_sched_result_t *res) {
    harness_t *h = arg;
    req_t *r = res->user;
    (void)h;
    r->finished++;
    r->res = *res;
    r->res.request_id = NULL;
    r->res.error = NULL;
}

static int harness_init(harness_t *h, int32_t n_blocks, int32_t block_size,
                        const decode_sched_config_t *cfg) {
    memset(h, 0, sizeof(*h));
    backend_kv_geom_t g = model_kv_geom(g_model, n_blocks, block_size);
    if (kv_pool_init(g_be, &g, &h->pool) != BATON_OK) return -1;
    decode_sched_hooks_t hk = {.arg = h, .reserved = on_reserved, .token_chunk = on_chunk,
                               .finished = on_finished};
    if (decode_sched_init(g_model, h->pool, cfg, &hk, &h->s) != BATON_OK) return -1;
    h->logits = malloc(sizeof(float) * (size_t)g_vocab);
    return 0;
}

static void harness_free(harness_t *h) {
    decode_sched_free(h->s);
    kv_pool_free(h->pool);
    free(h->logits);
}

static void make_req(req_t *r, int tag, int32_t n_prompt, uint32_t seed_tokens) {
    memset(r, 0, sizeof(*r));
    r->id[0] = (uint8_t)tag;
    r->id[15] = 0xab;
    r->n_prompt = n_prompt;
    uint32_t x = seed_tokens * 2654435761u + 12345u;
    for (int32_t i = 0; i < n_prompt; i++) {
        x = x * 1103515245u + 12345u;
        r->prompt[i] = 3 + (int32_t)((x >> 8) % (uint32_t)(g_vocab - 3));
    }
}

static baton_status_t submit(harness_t *h, req_t *r, int32_t max_tokens, bool ignore_eos,
                             const int32_t *stop, int32_t n_stop, bool with_prompt) {
    decode_sched_request_t q = {.request_id = r->id, .n_prompt_tokens = r->n_prompt,
                                .prompt_tokens = with_prompt ? r->prompt : NULL,
                                .max_tokens = max_tokens, .ignore_eos = ignore_eos,
                                .logprobs = r->n_logprobs > 0, .user = r};
    q.sampling = sampling_params_default();
    q.sampling.temperature = r->temp;
    q.sampling.seed = r->seed;
    q.sampling.n_logprobs = r->n_logprobs;
    q.sampling.stop_ids = stop;
    q.sampling.n_stop_ids = n_stop;
    return decode_sched_submit(h->s, &q);
}

/* Runs the prompt into the reserved blocks and samples the first token the
 * way the prefill worker does; fills *d. */
static int run_prefill(harness_t *h, req_t *r, decode_sched_prefill_t *d) {
    model_kv_t kv = {.geom = *kv_pool_geom(h->pool), .k_pool = kv_pool_k_base(h->pool),
                     .v_pool = kv_pool_v_base(h->pool)};
    model_seq_t ms = {.tokens = r->prompt, .n_tokens = r->n_prompt, .pos = 0,
                      .block_table = r->blocks, .n_blocks = r->n_blocks,
                      .logits = MODEL_LOGITS_LAST};
    model_batch_t b = {.seqs = &ms, .n_seqs = 1};
    if (model_forward(g_model, &kv, &b, h->logits) != BATON_OK) return -1;
    sampling_params_t sp = sampling_params_default();
    sp.temperature = r->temp;
    sp.seed = r->seed;
    sp.n_logprobs = r->n_logprobs;
    sampler_t *smp = NULL;
    sampler_init(&sp, g_vocab, &smp);
    for (int32_t i = 0; i < r->n_prompt; i++) sampler_accept(smp, r->prompt[i]);
    static sampling_result_t res;
    sampler_sample(smp, h->logits, &res);
    sampler_free(smp);
    memset(d, 0, sizeof(*d));
    d->status = BATON_OK;
    d->first_token = res.token;
    d->first_logprob = res.logprob;
    d->top = res.top;
    d->n_top = res.n_top;
    d->n_blocks_written = r->n_blocks;
    d->compute_us = 11;
    d->transfer_us = 22;
    d->transfer_bytes = 33;
    return 0;
}

static void prefill_and_done(harness_t *h, req_t *r) {
    decode_sched_prefill_t d;
    CHECK_EQ_INT(r->reserved, 1);
    CHECK_OK(run_prefill(h, r, &d));
    CHECK_OK(decode_sched_prefill_done(h->s, r->id, &d));
}

static void steps(harness_t *h, int n) {
    for (int i = 0; i < n; i++) CHECK_OK(decode_sched_step(h->s, NULL));
}

static void run_until_idle(harness_t *h) {
    for (int i = 0; i < 1000 && decode_sched_has_work(h->s); i++) CHECK_OK(decode_sched_step(h->s, NULL));
}

static void check_ref(req_t *r, int32_t n_expect, const char *what) {
    int32_t ref[MAXTOK];
    float lp[MAXTOK];
    CHECK_OK(ref_generate(r->prompt, r->n_prompt, n_expect, r->temp, r->seed, ref, lp));
    CHECK_MSG(r->n_out == n_expect, "%s: request %d got %d tokens, expected %d", what, r->id[0],
              r->n_out, n_expect);
    int bad = -1;
    for (int32_t i = 0; i < n_expect && i < r->n_out; i++)
        if (r->out[i] != ref[i]) {
            bad = i;
            break;
        }
    CHECK_MSG(bad < 0, "%s: request %d token %d: got %d, reference %d", what, r->id[0], bad,
              bad >= 0 ? r->out[bad] : 0, bad >= 0 ? ref[bad] : 0);
}

/* ---- scenarios ------------------------------------------------------------- */

/* Greedy tokens of each sequence are those of the sequence alone, while
 * others join and leave around it. */
static void test_batching_invariance(void) {
    harness_t h;
    decode_sched_config_t cfg = decode_sched_config_default();
    CHECK_OK(harness_init(&h, 64, 16, &cfg));
    const int32_t lens[6] = {5, 17, 32, 1, 40, 9};
    int32_t maxt[6] = {30, 12, 25, 20, 8, 40};
    int32_t sum_maxt = 0;
    for (int i = 0; i < 6; i++) {
        if (g_real) maxt[i] = maxt[i] / 4 + 2;
        sum_maxt += maxt[i];
    }
    for (int i = 0; i < 6; i++) make_req(&h.r[i], i + 1, lens[i], (uint32_t)i + 100);
    CHECK_OK(submit(&h, &h.r[0], maxt[0], true, NULL, 0, true));
    prefill_and_done(&h, &h.r[0]);
    steps(&h, 3);
    for (int i = 1; i < 4; i++) {
        CHECK_OK(submit(&h, &h.r[i], maxt[i], true, NULL, 0, true));
        prefill_and_done(&h, &h.r[i]);
        steps(&h, 2);
    }
    /* two more join in the same step */
    for (int i = 4; i < 6; i++) {
        CHECK_OK(submit(&h, &h.r[i], maxt[i], true, NULL, 0, true));
        prefill_and_done(&h, &h.r[i]);
    }
    decode_sched_stats_t st;
    run_until_idle(&h);
    for (int i = 0; i < 6; i++) {
        check_ref(&h.r[i], maxt[i], "batching");
        CHECK_EQ_INT(h.r[i].finished, 1);
        CHECK_EQ_INT(h.r[i].res.finish, DECODE_SCHED_FINISH_LENGTH);
        CHECK_EQ_INT(h.r[i].res.n_generated, maxt[i]);
        CHECK_EQ_INT(h.r[i].res.n_prompt_tokens, lens[i]);
        CHECK_EQ_INT(h.r[i].res.prefill.transfer_bytes, 33);
        CHECK_EQ_INT(h.r[i].first_entry_tokens, 2); /* first token rides with the next */
    }
    CHECK_EQ_INT(h.bad_chunk, 0);
    decode_sched_get_stats(h.s, &st);
    CHECK_EQ_INT(st.finished_ok, 6);
    CHECK_EQ_INT(st.n_running, 0);
    CHECK_EQ_INT(st.preemptions, 0);
    /* one chunk per step, each carrying every running request: far fewer
     * chunks than tokens */
    CHECK(h.n_chunks == (int)st.steps);
    CHECK(h.n_chunks < sum_maxt - 6);
    CHECK_EQ_INT(kv_pool_n_used(h.pool), 0);
    harness_free(&h);
}

/* Seeded sampling: a request's stream is its own (same seed -> same tokens
 * alone or batched; another seed -> other tokens) and equals one sampler
 * over the whole request, the first token drawn on the prefill side. */
static void test_seeds(void) {
    harness_t h;
    decode_sched_config_t cfg = decode_sched_config_default();
    CHECK_OK(harness_init(&h, 64, 16, &cfg));
    const uint64_t seeds[4] = {7, 7, 8, 9};
    for (int i = 0; i < 4; i++) {
        make_req(&h.r[i], 10 + i, 12, 555); /* same prompt */
        h.r[i].temp = 1.5f;
        h.r[i].seed = seeds[i];
        CHECK_OK(submit(&h, &h.r[i], 24, true, NULL, 0, true));
        prefill_and_done(&h, &h.r[i]);
        if (i == 1) steps(&h, 1);
    }
    run_until_idle(&h);
    for (int i = 0; i < 4; i++) check_ref(&h.r[i], 24, "seeded");
    CHECK(memcmp(h.r[0].out, h.r[1].out, sizeof(int32_t) * 24) == 0);
    CHECK(memcmp(h.r[0].out, h.r[2].out, sizeof(int32_t) * 24) != 0);
    CHECK(memcmp(h.r[2].out, h.r[3].out, sizeof(int32_t) * 24) != 0);
    CHECK_EQ_INT(kv_pool_n_used(h.pool), 0);
    harness_free(&h);
}

/* Stop token ids, end-of-generation ids (and ignore_eos), max_tokens 1,
 * logprobs of every streamed token. */
static void test_stops(void) {
    req_t probe;
    make_req(&probe, 1, 10, 777);
    int32_t ref[40];
    float ref_lp[40];
    CHECK_OK(ref_generate(probe.prompt, probe.n_prompt, 40, 0.0f, 0, ref, ref_lp));
    /* the first index k >= 2 whose token did not occur before it */
    int32_t k = -1;
    for (int32_t i = 2; i < 40 && k < 0; i++) {
        int seen = 0;
        for (int32_t j = 0; j < i; j++) seen |= ref[j] == ref[i];
        if (!seen) k = i;
    }
    CHECK(k > 0);
    if (k < 0) return;
    int32_t stop_tok = ref[k];

    decode_sched_config_t cfg = decode_sched_config_default();
    cfg.eog_ids = &stop_tok;
    cfg.n_eog_ids = 1;
    harness_t h;
    CHECK_OK(harness_init(&h, 64, 16, &cfg));
    /* 0: stop id; 1: eog; 2: eog ignored; 3: max_tokens 1; 4: logprobs */
    for (int i = 0; i < 5; i++) {
        make_req(&h.r[i], 20 + i, 10, 777);
        if (i == 4) h.r[i].n_logprobs = 3;
    }
    CHECK_OK(submit(&h, &h.r[0], 40, true, &stop_tok, 1, true));
    CHECK_OK(submit(&h, &h.r[1], 40, false, NULL, 0, true));
    CHECK_OK(submit(&h, &h.r[2], 40, true, NULL, 0, true));
    CHECK_OK(submit(&h, &h.r[3], 1, false, NULL, 0, true));
    CHECK_OK(submit(&h, &h.r[4], 40, true, NULL, 0, true));
    for (int i = 0; i < 5; i++) prefill_and_done(&h, &h.r[i]);
    run_until_idle(&h);
    for (int i = 0; i < 3; i++) {
        int32_t n = i < 2 ? k + 1 : 40;
        CHECK_EQ_INT(h.r[i].n_out, n);
        CHECK(memcmp(h.r[i].out, ref, sizeof(int32_t) * (size_t)(h.r[i].n_out < n ? h.r[i].n_out : n)) == 0);
        CHECK_EQ_INT(h.r[i].res.finish, i < 2 ? DECODE_SCHED_FINISH_STOP : DECODE_SCHED_FINISH_LENGTH);
        CHECK_EQ_INT(h.r[i].res.n_generated, n);
    }
    CHECK_EQ_INT(h.r[3].n_out, 1);
    CHECK_EQ_INT(h.r[3].out[0], ref[0]);
    CHECK_EQ_INT(h.r[3].res.finish, DECODE_SCHED_FINISH_LENGTH);
    CHECK_EQ_INT(h.r[3].first_entry_tokens, 1);
    /* logprobs vs the reference log-softmax; top[0] is the greedy token */
    CHECK_EQ_INT(h.r[4].n_out, 40);
    double worst = 0;
    for (int32_t i = 0; i < 40 && i < h.r[4].n_out; i++) {
        double d = fabs((double)h.r[4].out_lp[i] - (double)ref_lp[i]);
        if (!(d <= worst)) worst = d;
        CHECK_EQ_INT(h.r[4].out_top[i][0].token, ref[i]);
        CHECK(h.r[4].out_top[i][0].logprob >= h.r[4].out_top[i][1].logprob);
        CHECK(h.r[4].out_top[i][1].logprob >= h.r[4].out_top[i][2].logprob);
    }
    CHECK_MSG(worst < 1e-3, "logprob diff %g", worst);
    CHECK_EQ_INT(kv_pool_n_used(h.pool), 0);
    harness_free(&h);
}

/* Out of blocks mid-generation: the newest sequence is preempted and later
 * recomputed; both continuations equal the reference. */
static void test_preemption(void) {
    harness_t h;
    decode_sched_config_t cfg = decode_sched_config_default();
    cfg.max_recompute_tokens = 7; /* recompute in several chunks */
    /* B = 4, 9 blocks: each request reserves 2 prompt + 1 watermark and may
     * grow to 6 blocks (8 + 16 - 1 positions): together 12 > 9. */
    CHECK_OK(harness_init(&h, 9, 4, &cfg));
    make_req(&h.r[0], 30, 8, 31);
    make_req(&h.r[1], 31, 8, 32);
    CHECK_OK(submit(&h, &h.r[0], 16, true, NULL, 0, true));
    CHECK_OK(submit(&h, &h.r[1], 16, true, NULL, 0, true));
    prefill_and_done(&h, &h.r[0]);
    steps(&h, 1);
    prefill_and_done(&h, &h.r[1]);
    decode_sched_stats_t st;
    int saw_preempted = 0;
    for (int i = 0; i < 200 && decode_sched_has_work(h.s); i++) {
        CHECK_OK(decode_sched_step(h.s, NULL));
        decode_sched_state_t s1;
        if (decode_sched_get_state(h.s, h.r[1].id, &s1) == BATON_OK &&
            s1 == DECODE_SCHED_STATE_PREEMPTED)
            saw_preempted = 1;
    }
    decode_sched_get_stats(h.s, &st);
    CHECK(saw_preempted);
    CHECK(st.preemptions >= 1);
    CHECK(st.recomputed_tokens >= 8);
    check_ref(&h.r[0], 16, "preemption (kept)");
    check_ref(&h.r[1], 16, "preemption (recomputed)");
    CHECK_EQ_INT(h.r[0].finished + h.r[1].finished, 2);
    CHECK_EQ_INT(h.bad_chunk, 0);
    CHECK_EQ_INT(kv_pool_n_used(h.pool), 0);
    harness_free(&h);

    /* no prompt tokens: preemption cannot recompute, the request fails */
    CHECK_OK(harness_init(&h, 9, 4, &cfg));
    make_req(&h.r[0], 32, 8, 31);
    make_req(&h.r[1], 33, 8, 32);
    CHECK_OK(submit(&h, &h.r[0], 16, true, NULL, 0, true));
    CHECK_OK(submit(&h, &h.r[1], 16, true, NULL, 0, false));
    prefill_and_done(&h, &h.r[0]);
    prefill_and_done(&h, &h.r[1]);
    run_until_idle(&h);
    CHECK_EQ_INT(h.r[1].res.finish, DECODE_SCHED_FINISH_ERROR);
    CHECK_EQ_INT(h.r[1].res.status, BATON_ERR_NO_SPACE);
    check_ref(&h.r[0], 16, "preemption (survivor)");
    CHECK_EQ_INT(kv_pool_n_used(h.pool), 0);
    harness_free(&h);
}

/* Never fits: refused at once; short of blocks: queued FIFO until blocks
 * free up. */
static void test_refusal_and_queueing(void) {
    harness_t h;
    decode_sched_config_t cfg = decode_sched_config_default();
    CHECK_OK(harness_init(&h, 6, 4, &cfg)); /* 24 token slots, context 96 */
    make_req(&h.r[0], 40, 20, 1);
    CHECK_EQ_INT(submit(&h, &h.r[0], 6, true, NULL, 0, true), BATON_ERR_NO_SPACE); /* 25 slots */
    make_req(&h.r[1], 41, 60, 1);
    CHECK_EQ_INT(submit(&h, &h.r[1], 37, true, NULL, 0, true), BATON_ERR_NO_SPACE); /* > ctx 96 */
    CHECK_EQ_INT(h.r[0].reserved + h.r[1].reserved + h.r[0].finished + h.r[1].finished, 0);
    decode_sched_stats_t st;
    decode_sched_get_stats(h.s, &st);
    CHECK_EQ_INT(st.refused, 2);
    CHECK_EQ_INT(kv_pool_n_used(h.pool), 0);
    /* 20 + 5 - 1 = 24 slots: fits exactly */
    CHECK_OK(submit(&h, &h.r[0], 5, true, NULL, 0, true));
    CHECK_EQ_INT(h.r[0].reserved, 1);
    CHECK_EQ_INT(kv_pool_n_used(h.pool), 6); /* 5 prompt + 1 watermark */
    /* two more: both wait (FIFO) */
    make_req(&h.r[2], 42, 4, 2);
    make_req(&h.r[3], 43, 3, 3);
    CHECK_OK(submit(&h, &h.r[2], 4, true, NULL, 0, true));
    CHECK_OK(submit(&h, &h.r[3], 2, true, NULL, 0, true));
    decode_sched_state_t s2;
    CHECK_OK(decode_sched_get_state(h.s, h.r[2].id, &s2));
    CHECK_EQ_INT(s2, DECODE_SCHED_STATE_QUEUED);
    decode_sched_get_stats(h.s, &st);
    CHECK_EQ_INT(st.n_queued, 2);
    CHECK(!decode_sched_has_work(h.s));
    prefill_and_done(&h, &h.r[0]);
    run_until_idle(&h);
    check_ref(&h.r[0], 5, "queue head");
    CHECK_EQ_INT(h.r[2].reserved, 1);
    CHECK_EQ_INT(h.r[3].reserved, 1);
    prefill_and_done(&h, &h.r[2]);
    prefill_and_done(&h, &h.r[3]);
    run_until_idle(&h);
    check_ref(&h.r[2], 4, "queued 1");
    check_ref(&h.r[3], 2, "queued 2");
    CHECK_EQ_INT(kv_pool_n_used(h.pool), 0);
    harness_free(&h);
}

/* Abort in every state frees the blocks; PrefillDone errors. */
static void test_abort_and_prefill_errors(void) {
    harness_t h;
    decode_sched_config_t cfg = decode_sched_config_default();
    cfg.prefill_timeout_ms = 40;
    CHECK_OK(harness_init(&h, 8, 4, &cfg));
    for (int i = 0; i < 8; i++) make_req(&h.r[i], 50 + i, 6, (uint32_t)i);
    /* RUNNING, READY, RESERVED, QUEUED */
    CHECK_OK(submit(&h, &h.r[0], 20, true, NULL, 0, true));
    prefill_and_done(&h, &h.r[0]);
    steps(&h, 2);
    CHECK_OK(submit(&h, &h.r[1], 20, true, NULL, 0, true));
    prefill_and_done(&h, &h.r[1]);
    CHECK_OK(submit(&h, &h.r[2], 20, true, NULL, 0, true));
    CHECK_OK(submit(&h, &h.r[3], 20, true, NULL, 0, true)); /* 3 x 3 blocks > 8: queued */
    decode_sched_state_t st3;
    CHECK_OK(decode_sched_get_state(h.s, h.r[3].id, &st3));
    CHECK_EQ_INT(st3, DECODE_SCHED_STATE_QUEUED);
    int order[4] = {3, 2, 1, 0};
    for (int k = 0; k < 4; k++) {
        req_t *r = &h.r[order[k]];
        CHECK_OK(decode_sched_abort(h.s, r->id));
        CHECK_EQ_INT(r->finished, 1);
        CHECK_EQ_INT(r->res.finish, DECODE_SCHED_FINISH_ABORT);
    }
    CHECK_EQ_INT(kv_pool_n_used(h.pool), 0);
    CHECK_EQ_INT(decode_sched_abort(h.s, h.r[0].id), BATON_ERR_NOT_FOUND);
    CHECK(!decode_sched_has_work(h.s));

    /* block-count mismatch, failed prefill, unknown id, duplicate, timeout */
    decode_sched_prefill_t d;
    CHECK_OK(submit(&h, &h.r[4], 10, true, NULL, 0, true));
    CHECK_OK(run_prefill(&h, &h.r[4], &d));
    d.n_blocks_written = h.r[4].n_blocks - 1;
    CHECK_OK(decode_sched_prefill_done(h.s, h.r[4].id, &d));
    CHECK_EQ_INT(h.r[4].finished, 1);
    CHECK_EQ_INT(h.r[4].res.finish, DECODE_SCHED_FINISH_ERROR);
    CHECK_EQ_INT(h.r[4].res.status, BATON_ERR_OUT_OF_RANGE);
    CHECK_EQ_INT(h.r[4].n_out, 0);
    CHECK_EQ_INT(decode_sched_prefill_done(h.s, h.r[4].id, &d), BATON_ERR_NOT_FOUND);
    CHECK_EQ_INT(kv_pool_n_used(h.pool), 0);

    CHECK_OK(submit(&h, &h.r[5], 10, true, NULL, 0, true));
    memset(&d, 0, sizeof(d));
    d.status = BATON_ERR_PEER;
    d.error = "decode worker unreachable";
    CHECK_OK(decode_sched_prefill_done(h.s, h.r[5].id, &d));
    CHECK_EQ_INT(h.r[5].res.finish, DECODE_SCHED_FINISH_ERROR);
    CHECK_EQ_INT(h.r[5].res.status, BATON_ERR_PEER);

    CHECK_OK(submit(&h, &h.r[6], 10, true, NULL, 0, true));
    prefill_and_done(&h, &h.r[6]);
    CHECK_OK(run_prefill(&h, &h.r[6], &d));
    CHECK_EQ_INT(decode_sched_prefill_done(h.s, h.r[6].id, &d), BATON_ERR_INVALID_ARG); /* twice */
    run_until_idle(&h);
    check_ref(&h.r[6], 10, "after duplicate PrefillDone");

    CHECK_OK(submit(&h, &h.r[7], 10, true, NULL, 0, true));
    int64_t dl = decode_sched_next_deadline_us(h.s);
    CHECK(dl > 0 && dl <= 40000);
    usleep(60000);
    CHECK_OK(decode_sched_step(h.s, NULL));
    CHECK_EQ_INT(h.r[7].finished, 1);
    CHECK_EQ_INT(h.r[7].res.status, BATON_ERR_TIMEOUT);
    CHECK_EQ_INT(decode_sched_next_deadline_us(h.s), -1);
    CHECK_EQ_INT(kv_pool_n_used(h.pool), 0);
    harness_free(&h);
}

/* Colocated hand-off: a prefilled block table adopted as READY. */
static void test_adopt(void) {
    harness_t h;
    decode_sched_config_t cfg = decode_sched_config_default();
    CHECK_OK(harness_init(&h, 16, 16, &cfg));
    req_t *r = &h.r[0];
    make_req(r, 60, 21, 99);
    kv_block_table_t t;
    kv_block_table_init(&t);
    CHECK_OK(kv_block_table_reserve(&t, h.pool, r->n_prompt));
    r->n_blocks = t.n_blocks;
    memcpy(r->blocks, t.blocks, sizeof(int32_t) * (size_t)t.n_blocks);
    decode_sched_prefill_t d;
    CHECK_OK(run_prefill(&h, r, &d));
    decode_sched_request_t q = {.request_id = r->id, .n_prompt_tokens = r->n_prompt,
                                .prompt_tokens = r->prompt, .max_tokens = 30, .ignore_eos = true,
                                .user = r};
    q.sampling = sampling_params_default();
    CHECK_OK(decode_sched_adopt(h.s, &q, &t, &d));
    CHECK_EQ_INT(t.n_blocks, 0);
    run_until_idle(&h);
    check_ref(r, 30, "adopt");
    CHECK_EQ_INT(kv_pool_n_used(h.pool), 0);
    harness_free(&h);
}

/* --max-batch: READY sequences wait for a slot; tokens unchanged. */
static void test_max_batch(void) {
    harness_t h;
    decode_sched_config_t cfg = decode_sched_config_default();
    cfg.max_batch = 2;
    CHECK_OK(harness_init(&h, 32, 16, &cfg));
    for (int i = 0; i < 4; i++) {
        make_req(&h.r[i], 80 + i, 6 + 5 * i, (uint32_t)i + 40);
        CHECK_OK(submit(&h, &h.r[i], 6 + i, true, NULL, 0, true));
        prefill_and_done(&h, &h.r[i]);
    }
    int32_t n = 0;
    CHECK_OK(decode_sched_step(h.s, &n));
    CHECK_EQ_INT(n, 2);
    decode_sched_stats_t st;
    decode_sched_get_stats(h.s, &st);
    CHECK_EQ_INT(st.n_running, 2);
    CHECK_EQ_INT(st.n_ready, 2);
    CHECK(st.batch_occupancy == 1.0f);
    CHECK_EQ_INT(h.r[2].n_out, 0);
    run_until_idle(&h);
    for (int i = 0; i < 4; i++) check_ref(&h.r[i], 6 + i, "max_batch");
    CHECK_EQ_INT(kv_pool_n_used(h.pool), 0);
    harness_free(&h);
}

static void test_bad_args(void) {
    harness_t h;
    decode_sched_config_t cfg = decode_sched_config_default();
    CHECK_OK(harness_init(&h, 8, 16, &cfg));
    req_t *r = &h.r[0];
    make_req(r, 70, 4, 1);
    r->prompt[2] = g_vocab; /* outside the vocabulary */
    CHECK_EQ_INT(submit(&h, r, 4, true, NULL, 0, true), BATON_ERR_OUT_OF_RANGE);
    r->prompt[2] = 5;
    CHECK_EQ_INT(submit(&h, r, 0, true, NULL, 0, true), BATON_ERR_INVALID_ARG);
    CHECK_OK(submit(&h, r, 4, true, NULL, 0, true));
    CHECK_EQ_INT(submit(&h, r, 4, true, NULL, 0, true), BATON_ERR_INVALID_ARG); /* duplicate */
    decode_sched_prefill_t d;
    CHECK_OK(run_prefill(&h, r, &d));
    d.first_token = g_vocab + 5;
    CHECK_EQ_INT(decode_sched_prefill_done(h.s, r->id, &d), BATON_ERR_OUT_OF_RANGE);
    CHECK_EQ_INT(r->res.finish, DECODE_SCHED_FINISH_ERROR);
    CHECK_EQ_INT(kv_pool_n_used(h.pool), 0);
    decode_sched_config_t bad = cfg;
    bad.max_context = 97; /* beyond the model's 96 */
    decode_sched_t *s2 = NULL;
    decode_sched_hooks_t hk = {.token_chunk = on_chunk, .finished = on_finished};
    CHECK_EQ_INT(decode_sched_init(g_model, h.pool, &bad, &hk, &s2), BATON_ERR_INVALID_ARG);
    CHECK(s2 == NULL);
    harness_free(&h);
}

/* No argument: every scenario on the tiny model (label unit). "model":
 * greedy batching invariance, preemption + recompute and the colocated
 * hand-off on the default model, SmolLM2-135M (label model). */
int main(int argc, char **argv) {
    bool real = argc > 1 && strcmp(argv[1], "model") == 0;
    g_real = real;
    const char *path = real ? test_default_model() : data_path("tiny_llama.gguf");
    if (!path) return 1;
    CHECK_OK(backend_cpu_create(2, &g_be));
    CHECK_OK(model_load(path, g_be, NULL, &g_model));
    if (!g_model) return TEST_DONE();
    g_vocab = model_hparams(g_model)->n_vocab;
    test_batching_invariance();
    test_preemption();
    test_adopt();
    if (!real) {
        /* Seeded sampling is compared token for token with the reference
         * only here: the CPU forward is not bitwise batch-invariant (a
         * decode row alone vs in a batch of 2 differs by up to ~1e-5 on
         * this model, ~3e-5 on SmolLM2: GEMM blocking depends on the row
         * count), which can move a high-temperature draw over 49k tokens
         * but does not move it over this model's 272 for these seeds. */
        test_seeds();
        test_stops();
        test_max_batch();
        /* these use the tiny model's context (96) and vocabulary */
        test_refusal_and_queueing();
        test_abort_and_prefill_errors();
        test_bad_args();
    }
    model_free(g_model);
    backend_free(g_be);
    return TEST_DONE();
}
