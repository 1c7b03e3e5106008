/* Decode scheduler (decode_sched.h): reservation, continuous batching,
 * preemption with recompute. Sequences live in one array in arrival order;
 * "newest" for preemption is the largest join stamp. Lookups are linear
 * scans: a worker holds at most a few hundred sequences. */
#include "decode_worker/decode_sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

#define PENDING_MAX 4 /* tokens sampled but not yet streamed (first + one per step) */

typedef struct seq {
    uint8_t id[DECODE_SCHED_ID_BYTES];
    void *user;
    decode_sched_state_t state;
    int32_t n_prompt;
    int32_t *prompt; /* [n_prompt] or NULL */
    int32_t max_tokens;
    bool ignore_eos, logprobs;
    int32_t n_top;   /* sampling.n_logprobs */
    int32_t stop_ids[SAMPLING_MAX_STOP_IDS];
    int32_t n_stop_ids;
    sampler_t *sampler;
    float temperature;
    kv_block_table_t table;
    int32_t n_prompt_blocks;
    int32_t want_blocks; /* prompt + watermark, reserved all or nothing */
    int32_t *gen;        /* [cap_gen] generated tokens */
    int32_t n_gen, cap_gen;
    int32_t n_fed;       /* positions whose KV is in the table */
    /* not yet streamed: gen[n_gen - n_pend .. n_gen) */
    int32_t n_pend;
    float pend_lp[PENDING_MAX];
    sampling_logprob_t pend_top[PENDING_MAX][SAMPLING_MAX_LOGPROBS];
    decode_sched_finish_t finish_pending; /* decided, streamed at the next step */
    uint64_t join_stamp;
    uint64_t t_submit_us, t_reserved_us, t_prefill_us;
    uint64_t queue_us;
    decode_sched_prefill_t prefill;
    uint64_t device_us;  /* share of the decode steps' forward time (and recomputes) */
} seq_t;

struct decode_sched {
    model_t *model;
    kv_pool_t *pool;
    model_kv_t kv;
    decode_sched_config_t cfg;
    int32_t eog[DECODE_SCHED_MAX_EOG];
    decode_sched_hooks_t hooks;
    int32_t n_vocab, block_size, n_pool_blocks;
    seq_t **seqs;
    int32_t n_seqs, cap_seqs;
    uint64_t join_counter, step_id;
    /* per-step scratch, [max_batch] */
    float *logits;        /* [max_batch, n_vocab] */
    model_seq_t *mseqs;
    int32_t *in_tokens;
    seq_t **batch;
    decode_sched_entry_t *entries;
    int32_t *ent_tokens;  /* [max_batch * PENDING_MAX] */
    float *ent_lp;
    sampling_logprob_t *ent_top; /* [max_batch * PENDING_MAX * SAMPLING_MAX_LOGPROBS] */
    float *zero_row;      /* [n_vocab] for the first-token RNG draw */
    decode_sched_stats_t st;
    uint64_t t_last_step_end; /* monotonic us; 0 before the first step */
    bool work_left;           /* sequences were running after the last step */
};

/* model_forward_layers hook: hands each finished layer to hooks.layer_done. */
static void on_layer_done(void *arg, int32_t layer) {
    decode_sched_t *s = arg;
    (void)layer;
    if (s->hooks.layer_done) s->hooks.layer_done(s->hooks.arg);
}

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static int32_t ceil_div(int64_t a, int32_t b) { return (int32_t)((a + b - 1) / b); }

decode_sched_config_t decode_sched_config_default(void) {
    decode_sched_config_t c;
    memset(&c, 0, sizeof(c));
    c.max_batch = 64;
    c.watermark_blocks = 1;
    c.prefill_timeout_ms = 30000;
    c.max_context = 0;
    c.max_recompute_tokens = 512;
    return c;
}

/* ---- sequence helpers ------------------------------------------------------ */

static void seq_free(seq_t *q, kv_pool_t *pool) {
    if (!q) return;
    kv_block_table_release(&q->table, pool);
    sampler_free(q->sampler);
    free(q->prompt);
    free(q->gen);
    free(q);
}

static seq_t *find(const decode_sched_t *s, const uint8_t *id, int32_t *idx) {
    for (int32_t i = 0; i < s->n_seqs; i++)
        if (memcmp(s->seqs[i]->id, id, DECODE_SCHED_ID_BYTES) == 0) {
            if (idx) *idx = i;
            return s->seqs[i];
        }
    return NULL;
}

static void remove_seq(decode_sched_t *s, seq_t *q) {
    for (int32_t i = 0; i < s->n_seqs; i++)
        if (s->seqs[i] == q) {
            memmove(&s->seqs[i], &s->seqs[i + 1], sizeof(seq_t *) * (size_t)(s->n_seqs - i - 1));
            s->n_seqs--;
            return;
        }
}

static int32_t n_in_state(const decode_sched_t *s, decode_sched_state_t st) {
    int32_t n = 0;
    for (int32_t i = 0; i < s->n_seqs; i++) n += s->seqs[i]->state == st;
    return n;
}

/* Sends hooks.finished for q, releases and frees it. */
static void finish_seq(decode_sched_t *s, seq_t *q, decode_sched_finish_t why,
                       baton_status_t status, const char *error) {
    uint64_t t = now_us();
    kv_block_table_release(&q->table, s->pool);
    remove_seq(s, q);
    decode_sched_result_t r;
    memset(&r, 0, sizeof(r));
    r.request_id = q->id;
    r.user = q->user;
    r.finish = why;
    r.status = status;
    r.error = error ? error : "";
    r.n_prompt_tokens = q->n_prompt;
    r.n_generated = q->n_gen;
    r.queue_us = q->queue_us;
    r.prefill = q->prefill;
    r.prefill.error = NULL;
    r.prefill.top = NULL;
    r.decode_us = q->t_prefill_us ? t - q->t_prefill_us : 0;
    r.device_us = q->device_us;
    if (why == DECODE_SCHED_FINISH_ABORT) s->st.aborted++;
    else if (why == DECODE_SCHED_FINISH_ERROR) s->st.failed++;
    else s->st.finished_ok++;
    s->hooks.finished(s->hooks.arg, &r);
    seq_free(q, s->pool);
}

static baton_status_t gen_push(seq_t *q, int32_t tok) {
    if (q->n_gen == q->cap_gen) {
        int32_t cap = q->cap_gen ? q->cap_gen * 2 : 16;
        int32_t *g = realloc(q->gen, sizeof(int32_t) * (size_t)cap);
        if (!g) return baton_error(BATON_ERR_NO_MEMORY, "decode_sched: token history");
        q->gen = g;
        q->cap_gen = cap;
    }
    q->gen[q->n_gen++] = tok;
    return BATON_OK;
}

/* Records a sampled token as pending output. */
static baton_status_t push_token(seq_t *q, int32_t tok, float lp, const sampling_logprob_t *top,
                                 int32_t n_top) {
    if (q->n_pend >= PENDING_MAX)
        return baton_error(BATON_ERR_INTERNAL, "decode_sched: too many unstreamed tokens");
    baton_status_t st = gen_push(q, tok);
    if (st != BATON_OK) return st;
    st = sampler_accept(q->sampler, tok);
    if (st != BATON_OK) {
        q->n_gen--;
        return st;
    }
    q->pend_lp[q->n_pend] = lp;
    memset(q->pend_top[q->n_pend], 0, sizeof(q->pend_top[0]));
    for (int32_t k = 0; k < q->n_top && k < n_top; k++) q->pend_top[q->n_pend][k] = top[k];
    q->n_pend++;
    return BATON_OK;
}

/* Stop conditions after the newest generated token. */
static decode_sched_finish_t check_stop(const decode_sched_t *s, const seq_t *q) {
    int32_t tok = q->gen[q->n_gen - 1];
    if (!q->ignore_eos)
        for (int32_t i = 0; i < s->cfg.n_eog_ids; i++)
            if (s->eog[i] == tok) return DECODE_SCHED_FINISH_STOP;
    for (int32_t i = 0; i < q->n_stop_ids; i++)
        if (q->stop_ids[i] == tok) return DECODE_SCHED_FINISH_STOP;
    if (q->n_gen >= q->max_tokens) return DECODE_SCHED_FINISH_LENGTH;
    if ((int64_t)q->n_prompt + q->n_gen >= s->cfg.max_context) return DECODE_SCHED_FINISH_LENGTH;
    return DECODE_SCHED_FINISH_NONE;
}

/* Tries to reserve q's prompt + watermark blocks; all or nothing. */
static bool try_reserve(decode_sched_t *s, seq_t *q) {
    if (kv_block_table_reserve(&q->table, s->pool, q->want_blocks * s->block_size) != BATON_OK)
        return false;
    q->state = DECODE_SCHED_STATE_RESERVED;
    q->t_reserved_us = now_us();
    q->queue_us = q->t_reserved_us - q->t_submit_us;
    if (s->hooks.reserved)
        s->hooks.reserved(s->hooks.arg, q->id, q->user, q->table.blocks, q->n_prompt_blocks);
    return true;
}

/* Reserves for QUEUED requests in FIFO order while blocks allow; preempted
 * sequences waiting for blocks go first (nothing is reserved while the
 * oldest of them cannot be resumed). */
static void admit_queued(decode_sched_t *s) {
    for (int32_t i = 0; i < s->n_seqs; i++) {
        seq_t *q = s->seqs[i];
        if (q->state == DECODE_SCHED_STATE_PREEMPTED) {
            int32_t need = ceil_div((int64_t)q->n_prompt + q->n_gen, s->block_size);
            if (kv_pool_n_free(s->pool) < need) return;
        }
    }
    for (int32_t i = 0; i < s->n_seqs; i++) {
        seq_t *q = s->seqs[i];
        if (q->state != DECODE_SCHED_STATE_QUEUED) continue;
        if (!try_reserve(s, q)) return; /* strict FIFO */
    }
}

/* ---- init / free ----------------------------------------------------------- */

baton_status_t decode_sched_init(model_t *model, kv_pool_t *pool,
                                 const decode_sched_config_t *config,
                                 const decode_sched_hooks_t *hooks, decode_sched_t **out) {
    if (!model || !pool || !config || !hooks || !out || !hooks->token_chunk || !hooks->finished)
        return baton_error(BATON_ERR_INVALID_ARG, "decode_sched_init: NULL argument or hook");
    const model_hparams_t *hp = model_hparams(model);
    decode_sched_config_t c = *config;
    if (c.max_context == 0) c.max_context = hp->n_ctx_train;
    if (c.max_batch < 1 || c.max_batch > 4096 || c.watermark_blocks < 0 || c.max_context < 1 ||
        c.max_context > hp->n_ctx_train || c.max_recompute_tokens < 1 || c.n_eog_ids < 0 ||
        c.n_eog_ids > DECODE_SCHED_MAX_EOG || (c.n_eog_ids > 0 && !c.eog_ids))
        return baton_error(BATON_ERR_INVALID_ARG,
                           "decode_sched_init: config out of range (max_batch %d, watermark %d, "
                           "max_context %d of %d, recompute %d, eog %d)",
                           c.max_batch, c.watermark_blocks, c.max_context, hp->n_ctx_train,
                           c.max_recompute_tokens, c.n_eog_ids);
    const backend_kv_geom_t *g = kv_pool_geom(pool);
    backend_kv_geom_t mg = model_kv_geom(model, g->n_blocks, g->block_size);
    if (mg.n_layers != g->n_layers || mg.n_kv_heads != g->n_kv_heads ||
        mg.head_dim != g->head_dim || mg.dtype != g->dtype)
        return baton_error(BATON_ERR_INVALID_ARG,
                           "decode_sched_init: pool geometry (layers %d, kv heads %d, head_dim "
                           "%d) is not the model's (%d, %d, %d)",
                           g->n_layers, g->n_kv_heads, g->head_dim, mg.n_layers, mg.n_kv_heads,
                           mg.head_dim);
    for (int32_t i = 0; i < c.n_eog_ids; i++)
        if (c.eog_ids[i] < 0 || c.eog_ids[i] >= hp->n_vocab)
            return baton_error(BATON_ERR_INVALID_ARG, "decode_sched_init: eog id %d out of vocabulary",
                               c.eog_ids[i]);
    decode_sched_t *s = calloc(1, sizeof(*s));
    if (!s) return baton_error(BATON_ERR_NO_MEMORY, "decode_sched_init");
    s->model = model;
    s->pool = pool;
    s->kv.geom = *g;
    s->kv.k_pool = kv_pool_k_base(pool);
    s->kv.v_pool = kv_pool_v_base(pool);
    s->cfg = c;
    memcpy(s->eog, c.eog_ids ? c.eog_ids : s->eog, sizeof(int32_t) * (size_t)c.n_eog_ids);
    s->cfg.eog_ids = NULL;
    s->hooks = *hooks;
    s->n_vocab = hp->n_vocab;
    s->block_size = g->block_size;
    s->n_pool_blocks = g->n_blocks;
    size_t B = (size_t)c.max_batch;
    s->logits = malloc(sizeof(float) * B * (size_t)hp->n_vocab);
    s->mseqs = calloc(B, sizeof(model_seq_t));
    s->in_tokens = calloc(B, sizeof(int32_t));
    s->batch = calloc(B, sizeof(seq_t *));
    s->entries = calloc(B, sizeof(decode_sched_entry_t));
    s->ent_tokens = calloc(B * PENDING_MAX, sizeof(int32_t));
    s->ent_lp = calloc(B * PENDING_MAX, sizeof(float));
    s->ent_top = calloc(B * PENDING_MAX * SAMPLING_MAX_LOGPROBS, sizeof(sampling_logprob_t));
    s->zero_row = calloc((size_t)hp->n_vocab, sizeof(float));
    if (!s->logits || !s->mseqs || !s->in_tokens || !s->batch || !s->entries || !s->ent_tokens ||
        !s->ent_lp || !s->ent_top || !s->zero_row) {
        decode_sched_free(s);
        return baton_error(BATON_ERR_NO_MEMORY, "decode_sched_init: scratch");
    }
    *out = s;
    return BATON_OK;
}

void decode_sched_free(decode_sched_t *s) {
    if (!s) return;
    for (int32_t i = 0; i < s->n_seqs; i++) seq_free(s->seqs[i], s->pool);
    free(s->seqs);
    free(s->logits);
    free(s->mseqs);
    free(s->in_tokens);
    free(s->batch);
    free(s->entries);
    free(s->ent_tokens);
    free(s->ent_lp);
    free(s->ent_top);
    free(s->zero_row);
    free(s);
}

/* ---- submit ------------------------------------------------------------------ */

/* Validates req and builds a sequence (state QUEUED, no blocks). */
static baton_status_t seq_create(decode_sched_t *s, const decode_sched_request_t *req,
                                 seq_t **out) {
    if (!req || !req->request_id)
        return baton_error(BATON_ERR_INVALID_ARG, "decode_sched: NULL request");
    if (find(s, req->request_id, NULL))
        return baton_error(BATON_ERR_INVALID_ARG, "decode_sched: duplicate request id");
    if (req->max_tokens < 1)
        return baton_error(BATON_ERR_INVALID_ARG, "decode_sched: max_tokens %d < 1", req->max_tokens);
    if (req->n_prompt_tokens < 1)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "decode_sched: empty prompt");
    if (req->sampling.n_stop_ids > SAMPLING_MAX_STOP_IDS || req->sampling.n_stop_ids < 0)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "decode_sched: %d stop ids (max %d)",
                           req->sampling.n_stop_ids, SAMPLING_MAX_STOP_IDS);
    if (req->prompt_tokens)
        for (int32_t i = 0; i < req->n_prompt_tokens; i++)
            if (req->prompt_tokens[i] < 0 || req->prompt_tokens[i] >= s->n_vocab)
                return baton_error(BATON_ERR_OUT_OF_RANGE,
                                   "decode_sched: prompt token %d = %d outside the vocabulary (%d)",
                                   i, req->prompt_tokens[i], s->n_vocab);
    int64_t total = (int64_t)req->n_prompt_tokens + req->max_tokens;
    if (total > s->cfg.max_context)
        return baton_error(BATON_ERR_NO_SPACE,
                           "cannot fit: prompt %d + max_tokens %d > context %d",
                           req->n_prompt_tokens, req->max_tokens, s->cfg.max_context);
    int32_t max_blocks = ceil_div(total - 1, s->block_size);
    if (max_blocks > s->n_pool_blocks)
        return baton_error(BATON_ERR_NO_SPACE,
                           "cannot fit: prompt %d + max_tokens %d need %d blocks, pool has %d",
                           req->n_prompt_tokens, req->max_tokens, max_blocks, s->n_pool_blocks);
    seq_t *q = calloc(1, sizeof(*q));
    if (!q) return baton_error(BATON_ERR_NO_MEMORY, "decode_sched: sequence");
    baton_status_t st = sampler_init(&req->sampling, s->n_vocab, &q->sampler);
    if (st != BATON_OK) {
        free(q);
        return st;
    }
    memcpy(q->id, req->request_id, DECODE_SCHED_ID_BYTES);
    q->user = req->user;
    q->n_prompt = req->n_prompt_tokens;
    if (req->prompt_tokens) {
        q->prompt = malloc(sizeof(int32_t) * (size_t)q->n_prompt);
        if (!q->prompt) {
            seq_free(q, s->pool);
            return baton_error(BATON_ERR_NO_MEMORY, "decode_sched: prompt copy");
        }
        memcpy(q->prompt, req->prompt_tokens, sizeof(int32_t) * (size_t)q->n_prompt);
    }
    q->max_tokens = req->max_tokens;
    q->ignore_eos = req->ignore_eos;
    q->logprobs = req->logprobs;
    q->n_top = req->sampling.n_logprobs;
    q->n_stop_ids = req->sampling.n_stop_ids;
    for (int32_t i = 0; i < q->n_stop_ids; i++) q->stop_ids[i] = req->sampling.stop_ids[i];
    q->temperature = req->sampling.temperature;
    kv_block_table_init(&q->table);
    q->n_prompt_blocks = ceil_div(q->n_prompt, s->block_size);
    int32_t wm = max_blocks - q->n_prompt_blocks;
    if (wm > s->cfg.watermark_blocks) wm = s->cfg.watermark_blocks;
    if (wm < 0) wm = 0;
    q->want_blocks = q->n_prompt_blocks + wm;
    q->state = DECODE_SCHED_STATE_QUEUED;
    q->t_submit_us = now_us();
    *out = q;
    return BATON_OK;
}

static baton_status_t seq_insert(decode_sched_t *s, seq_t *q) {
    if (s->n_seqs == s->cap_seqs) {
        int32_t cap = s->cap_seqs ? s->cap_seqs * 2 : 32;
        seq_t **a = realloc(s->seqs, sizeof(seq_t *) * (size_t)cap);
        if (!a) return baton_error(BATON_ERR_NO_MEMORY, "decode_sched: sequence list");
        s->seqs = a;
        s->cap_seqs = cap;
    }
    s->seqs[s->n_seqs++] = q;
    return BATON_OK;
}

baton_status_t decode_sched_submit(decode_sched_t *s, const decode_sched_request_t *req) {
    if (!s) return baton_error(BATON_ERR_INVALID_ARG, "decode_sched_submit: NULL");
    seq_t *q = NULL;
    baton_status_t st = seq_create(s, req, &q);
    if (st != BATON_OK) {
        if (st == BATON_ERR_NO_SPACE) s->st.refused++;
        return st;
    }
    if (q->prompt)
        for (int32_t i = 0; i < q->n_prompt; i++)
            if ((st = sampler_accept(q->sampler, q->prompt[i])) != BATON_OK) {
                seq_free(q, s->pool);
                return st;
            }
    if ((st = seq_insert(s, q)) != BATON_OK) {
        seq_free(q, s->pool);
        return st;
    }
    admit_queued(s);
    return BATON_OK;
}

/* Takes the first token into q (stream position, RNG draw, stop check) and
 * makes it READY. On error q is untouched except its sampler history. */
static baton_status_t take_first_token(decode_sched_t *s, seq_t *q,
                                       const decode_sched_prefill_t *done) {
    if (done->first_token < 0 || done->first_token >= s->n_vocab)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "first token %d outside the vocabulary (%d)",
                           done->first_token, s->n_vocab);
    if (done->n_top < 0 || done->n_top > SAMPLING_MAX_LOGPROBS || (done->n_top > 0 && !done->top))
        return baton_error(BATON_ERR_OUT_OF_RANGE, "first token: %d top logprobs", done->n_top);
    if (q->temperature > 0.0f) {
        /* consume the uniform draw the prefill side spent on this token */
        sampling_result_t tmp;
        baton_status_t st = sampler_sample(q->sampler, s->zero_row, &tmp);
        if (st != BATON_OK) return st;
    }
    baton_status_t st = push_token(q, done->first_token, done->first_logprob, done->top, done->n_top);
    if (st != BATON_OK) return st;
    q->n_fed = q->n_prompt;
    q->prefill = *done;
    q->t_prefill_us = now_us();
    q->finish_pending = check_stop(s, q);
    q->state = DECODE_SCHED_STATE_READY;
    return BATON_OK;
}

baton_status_t decode_sched_prefill_done(decode_sched_t *s, const uint8_t *request_id,
                                         const decode_sched_prefill_t *done) {
    if (!s || !request_id || !done)
        return baton_error(BATON_ERR_INVALID_ARG, "decode_sched_prefill_done: NULL");
    seq_t *q = find(s, request_id, NULL);
    if (!q) return baton_error(BATON_ERR_NOT_FOUND, "prefill_done: unknown request");
    if (q->state != DECODE_SCHED_STATE_RESERVED)
        return baton_error(BATON_ERR_INVALID_ARG, "prefill_done: request is not waiting for its prefill");
    char msg[256];
    if (done->status != BATON_OK) {
        q->prefill = *done;
        snprintf(msg, sizeof(msg), "prefill failed: %s",
                 done->error && *done->error ? done->error : baton_status_str(done->status));
        finish_seq(s, q, DECODE_SCHED_FINISH_ERROR, done->status, msg);
        admit_queued(s);
        return BATON_OK;
    }
    if (done->n_blocks_written != q->n_prompt_blocks) {
        q->prefill = *done;
        snprintf(msg, sizeof(msg), "prefill wrote %d blocks, %d were reserved for the prompt",
                 done->n_blocks_written, q->n_prompt_blocks);
        finish_seq(s, q, DECODE_SCHED_FINISH_ERROR, BATON_ERR_OUT_OF_RANGE, msg);
        admit_queued(s);
        return BATON_OK;
    }
    baton_status_t st = take_first_token(s, q, done);
    if (st != BATON_OK) {
        snprintf(msg, sizeof(msg), "%s", baton_last_error());
        finish_seq(s, q, DECODE_SCHED_FINISH_ERROR, st, msg);
        admit_queued(s);
        return baton_error(st, "%s", msg);
    }
    return BATON_OK;
}

baton_status_t decode_sched_adopt(decode_sched_t *s, const decode_sched_request_t *req,
                                  kv_block_table_t *table, const decode_sched_prefill_t *done) {
    if (!s || !table || !done) return baton_error(BATON_ERR_INVALID_ARG, "decode_sched_adopt: NULL");
    if (done->status != BATON_OK)
        return baton_error(BATON_ERR_INVALID_ARG, "decode_sched_adopt: prefill status %d", done->status);
    seq_t *q = NULL;
    baton_status_t st = seq_create(s, req, &q);
    if (st != BATON_OK) {
        if (st == BATON_ERR_NO_SPACE) s->st.refused++;
        return st;
    }
    if (table->n_blocks < q->n_prompt_blocks) {
        seq_free(q, s->pool);
        return baton_error(BATON_ERR_INVALID_ARG, "decode_sched_adopt: table has %d blocks, prompt needs %d",
                           table->n_blocks, ceil_div(req->n_prompt_tokens, s->block_size));
    }
    if (q->prompt)
        for (int32_t i = 0; i < q->n_prompt; i++)
            if ((st = sampler_accept(q->sampler, q->prompt[i])) != BATON_OK) {
                seq_free(q, s->pool);
                return st;
            }
    if ((st = take_first_token(s, q, done)) != BATON_OK || (st = seq_insert(s, q)) != BATON_OK) {
        seq_free(q, s->pool);
        return st;
    }
    q->table = *table;
    kv_block_table_init(table);
    q->t_reserved_us = q->t_submit_us;
    return BATON_OK;
}

baton_status_t decode_sched_abort(decode_sched_t *s, const uint8_t *request_id) {
    if (!s || !request_id) return baton_error(BATON_ERR_INVALID_ARG, "decode_sched_abort: NULL");
    seq_t *q = find(s, request_id, NULL);
    if (!q) return baton_error(BATON_ERR_NOT_FOUND, "abort: unknown request");
    finish_seq(s, q, DECODE_SCHED_FINISH_ABORT, BATON_OK, "");
    admit_queued(s);
    return BATON_OK;
}

/* ---- step ---------------------------------------------------------------------- */

/* Takes every block from q (newest running), keeping tokens and sampler. */
static void preempt(decode_sched_t *s, seq_t *q) {
    kv_block_table_release(&q->table, s->pool);
    q->n_fed = 0;
    q->state = DECODE_SCHED_STATE_PREEMPTED;
    s->st.preemptions++;
    LOG_DEBUG("decode_sched", "preempted a sequence at %d tokens", q->n_prompt + q->n_gen);
}

static seq_t *newest_running(decode_sched_t *s) {
    seq_t *best = NULL;
    for (int32_t i = 0; i < s->n_seqs; i++) {
        seq_t *q = s->seqs[i];
        if (q->state == DECODE_SCHED_STATE_RUNNING && q->finish_pending == DECODE_SCHED_FINISH_NONE &&
            (!best || q->join_stamp > best->join_stamp))
            best = q;
    }
    return best;
}

/* Recomputes the KV of a preempted sequence: prompt + gen[0..n_gen-2]. */
static baton_status_t recompute(decode_sched_t *s, seq_t *q) {
    int32_t n = q->n_prompt + q->n_gen - 1;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n);
    if (!toks) return baton_error(BATON_ERR_NO_MEMORY, "decode_sched: recompute tokens");
    memcpy(toks, q->prompt, sizeof(int32_t) * (size_t)q->n_prompt);
    memcpy(toks + q->n_prompt, q->gen, sizeof(int32_t) * (size_t)(q->n_gen - 1));
    baton_status_t st = BATON_OK;
    for (int32_t pos = 0; pos < n && st == BATON_OK;) {
        int32_t c = n - pos < s->cfg.max_recompute_tokens ? n - pos : s->cfg.max_recompute_tokens;
        model_seq_t ms = {.tokens = toks + pos, .n_tokens = c, .pos = pos,
                          .block_table = q->table.blocks, .n_blocks = q->table.n_blocks,
                          .logits = MODEL_LOGITS_NONE};
        model_batch_t b = {.seqs = &ms, .n_seqs = 1};
        uint64_t t_fwd = now_us();
        st = model_forward_layers(s->model, &s->kv, &b, s->logits, on_layer_done, s);
        q->device_us += now_us() - t_fwd; /* a recompute is this sequence's alone */
        pos += c;
    }
    free(toks);
    if (st == BATON_OK) {
        q->n_fed = n;
        s->st.recomputed_tokens += (uint64_t)n;
    }
    return st;
}

/* Resumes preempted sequences, oldest first, while blocks and batch slots
 * allow. */
static void resume_preempted(decode_sched_t *s, int32_t *n_running) {
    for (int32_t i = 0; i < s->n_seqs && *n_running < s->cfg.max_batch; i++) {
        seq_t *q = s->seqs[i];
        if (q->state != DECODE_SCHED_STATE_PREEMPTED) continue;
        /* positions 0..n_prompt+n_gen-1: the recompute and the next token */
        if (kv_block_table_reserve(&q->table, s->pool, q->n_prompt + q->n_gen) != BATON_OK) return;
        baton_status_t st = recompute(s, q);
        if (st != BATON_OK) {
            char msg[300];
            snprintf(msg, sizeof(msg), "recompute after preemption failed: %s", baton_last_error());
            finish_seq(s, q, DECODE_SCHED_FINISH_ERROR, st, msg);
            i--;
            continue;
        }
        q->state = DECODE_SCHED_STATE_RUNNING;
        q->join_stamp = ++s->join_counter;
        (*n_running)++;
    }
}

static void expire_prefills(decode_sched_t *s) {
    uint64_t t = now_us(), lim = (uint64_t)s->cfg.prefill_timeout_ms * 1000u;
    for (int32_t i = 0; i < s->n_seqs; i++) {
        seq_t *q = s->seqs[i];
        if (q->state == DECODE_SCHED_STATE_RESERVED && t - q->t_reserved_us >= lim) {
            char msg[128];
            snprintf(msg, sizeof(msg), "no PrefillDone within %u ms", s->cfg.prefill_timeout_ms);
            finish_seq(s, q, DECODE_SCHED_FINISH_ERROR, BATON_ERR_TIMEOUT, msg);
            i--;
        }
    }
}

/* Makes q's table cover position n_fed (its next input). Preempts the
 * newest running sequences when the pool is empty; returns false when q
 * itself had to be preempted (or failed). */
static bool grow(decode_sched_t *s, seq_t *q) {
    for (;;) {
        if (kv_block_table_reserve(&q->table, s->pool, q->n_fed + 1) == BATON_OK) return true;
        seq_t *v = newest_running(s);
        if (!v) v = q;
        if (!v->prompt) {
            finish_seq(s, v, DECODE_SCHED_FINISH_ERROR, BATON_ERR_NO_SPACE,
                       "out of KV blocks: preempted, and the prompt tokens needed to recompute "
                       "were not sent");
            s->st.preemptions++;
        } else {
            preempt(s, v);
        }
        if (v == q) return false;
    }
}

baton_status_t decode_sched_step(decode_sched_t *s, int32_t *n_seqs_out) {
    if (!s) return baton_error(BATON_ERR_INVALID_ARG, "decode_sched_step: NULL");
    uint64_t t0 = now_us();
    expire_prefills(s);
    int32_t n_running = n_in_state(s, DECODE_SCHED_STATE_RUNNING);
    resume_preempted(s, &n_running);
    admit_queued(s);
    /* join READY sequences (prefill order = arrival order among them) */
    for (int32_t i = 0; i < s->n_seqs && n_running < s->cfg.max_batch; i++) {
        seq_t *q = s->seqs[i];
        if (q->state != DECODE_SCHED_STATE_READY) continue;
        q->state = DECODE_SCHED_STATE_RUNNING;
        q->join_stamp = ++s->join_counter;
        n_running++;
    }
    /* batch: running sequences in arrival order; grow tables first */
    int32_t nb = 0;
    for (int32_t i = 0; i < s->n_seqs; i++) {
        seq_t *q = s->seqs[i];
        if (q->state != DECODE_SCHED_STATE_RUNNING || q->finish_pending != DECODE_SCHED_FINISH_NONE)
            continue;
        int32_t before = s->n_seqs;
        if (!grow(s, q) || s->n_seqs < before) i = -1; /* list changed: rescan (grow is idempotent) */
    }
    /* grow() may have preempted sequences already examined: collect now */
    for (int32_t i = 0; i < s->n_seqs; i++) {
        seq_t *q = s->seqs[i];
        if (q->state != DECODE_SCHED_STATE_RUNNING) continue;
        s->batch[nb++] = q;
    }
    int32_t n_fwd = 0;
    for (int32_t k = 0; k < nb; k++) {
        seq_t *q = s->batch[k];
        if (q->finish_pending != DECODE_SCHED_FINISH_NONE) continue;
        s->in_tokens[n_fwd] = q->gen[q->n_gen - 1];
        s->mseqs[n_fwd] = (model_seq_t){.tokens = &s->in_tokens[n_fwd], .n_tokens = 1,
                                        .pos = q->n_fed, .block_table = q->table.blocks,
                                        .n_blocks = q->table.n_blocks, .logits = MODEL_LOGITS_LAST};
        n_fwd++;
    }
    baton_status_t fwd_st = BATON_OK;
    char fwd_err[300] = "";
    if (n_fwd > 0) {
        if (s->work_left && s->t_last_step_end) { /* idled with sequences running */
            uint64_t gap = t0 - s->t_last_step_end;
            s->st.idle_gaps++;
            s->st.idle_gap_us += gap;
            if (gap > s->st.idle_gap_max_us) s->st.idle_gap_max_us = gap;
        }
        model_batch_t b = {.seqs = s->mseqs, .n_seqs = n_fwd};
        uint64_t t_fwd = now_us();
        fwd_st = model_forward_layers(s->model, &s->kv, &b, s->logits, on_layer_done, s);
        /* device time: one token per sequence, so equal shares (DESIGN
         * "Observability and cost": in proportion to tokens in the step) */
        uint64_t share = (now_us() - t_fwd) / (uint64_t)n_fwd;
        for (int32_t k = 0; k < nb; k++)
            if (s->batch[k]->finish_pending == DECODE_SCHED_FINISH_NONE) s->batch[k]->device_us += share;
        if (fwd_st != BATON_OK) snprintf(fwd_err, sizeof(fwd_err), "decode step: %s", baton_last_error());
    }
    /* sample */
    int32_t row = 0;
    for (int32_t k = 0; k < nb; k++) {
        seq_t *q = s->batch[k];
        if (q->finish_pending != DECODE_SCHED_FINISH_NONE) continue;
        if (fwd_st != BATON_OK) {
            q->finish_pending = DECODE_SCHED_FINISH_ERROR;
            continue;
        }
        q->n_fed++;
        sampling_result_t r;
        baton_status_t st = sampler_sample(q->sampler, s->logits + (size_t)row * s->n_vocab, &r);
        row++;
        if (st == BATON_OK) st = push_token(q, r.token, r.logprob, r.top, r.n_top);
        if (st != BATON_OK) {
            q->finish_pending = DECODE_SCHED_FINISH_ERROR;
            if (!fwd_err[0]) snprintf(fwd_err, sizeof(fwd_err), "sampling: %s", baton_last_error());
            continue;
        }
        s->st.tokens_generated++;
        q->finish_pending = check_stop(s, q);
    }
    /* stream */
    for (int32_t k = 0; k < nb; k++) {
        seq_t *q = s->batch[k];
        decode_sched_entry_t *e = &s->entries[k];
        int32_t *toks = s->ent_tokens + (size_t)k * PENDING_MAX;
        float *lps = s->ent_lp + (size_t)k * PENDING_MAX;
        sampling_logprob_t *top = s->ent_top + (size_t)k * PENDING_MAX * SAMPLING_MAX_LOGPROBS;
        for (int32_t j = 0; j < q->n_pend; j++) {
            toks[j] = q->gen[q->n_gen - q->n_pend + j];
            lps[j] = q->pend_lp[j];
            memcpy(top + (size_t)j * q->n_top, q->pend_top[j], sizeof(sampling_logprob_t) * (size_t)q->n_top);
        }
        *e = (decode_sched_entry_t){.request_id = q->id, .user = q->user, .tokens = toks,
                                    .n_tokens = q->n_pend, .logprobs = q->logprobs ? lps : NULL,
                                    .top = q->n_top > 0 ? top : NULL, .top_k = q->n_top,
                                    .finish = q->finish_pending};
        q->n_pend = 0;
    }
    if (nb > 0) {
        s->st.steps++;
        s->st.batch_occupancy = (float)nb / (float)s->cfg.max_batch;
        s->hooks.token_chunk(s->hooks.arg, s->step_id++, s->entries, nb);
    }
    /* finish */
    for (int32_t k = 0; k < nb; k++) {
        seq_t *q = s->batch[k];
        if (q->finish_pending == DECODE_SCHED_FINISH_NONE) continue;
        if (q->finish_pending == DECODE_SCHED_FINISH_ERROR)
            finish_seq(s, q, DECODE_SCHED_FINISH_ERROR, fwd_st != BATON_OK ? fwd_st : BATON_ERR_INTERNAL,
                       fwd_err);
        else
            finish_seq(s, q, q->finish_pending, BATON_OK, "");
    }
    admit_queued(s);
    if (nb > 0) s->st.busy_us += now_us() - t0;
    if (nb > 0 || n_fwd > 0) {
        s->t_last_step_end = now_us();
        s->work_left = n_in_state(s, DECODE_SCHED_STATE_RUNNING) > 0;
    }
    if (n_seqs_out) *n_seqs_out = nb;
    if (fwd_st != BATON_OK) return baton_error(fwd_st, "%s", fwd_err);
    return BATON_OK;
}

/* ---- queries ---------------------------------------------------------------------- */

bool decode_sched_has_work(const decode_sched_t *s) {
    if (!s) return false;
    int32_t free_blocks = kv_pool_n_free(s->pool);
    int32_t n_running = n_in_state(s, DECODE_SCHED_STATE_RUNNING);
    bool preempted_waiting = false, queue_head_seen = false;
    for (int32_t i = 0; i < s->n_seqs; i++) {
        const seq_t *q = s->seqs[i];
        switch (q->state) {
        case DECODE_SCHED_STATE_RUNNING:
            return true;
        case DECODE_SCHED_STATE_READY:
            if (n_running < s->cfg.max_batch) return true;
            break;
        case DECODE_SCHED_STATE_PREEMPTED:
            /* mirrors resume_preempted: oldest first, a batch slot needed */
            if (!preempted_waiting && n_running < s->cfg.max_batch &&
                ceil_div((int64_t)q->n_prompt + q->n_gen, s->block_size) <= free_blocks)
                return true;
            preempted_waiting = true;
            break;
        default:
            break;
        }
    }
    if (preempted_waiting) return false; /* admit_queued waits for them */
    for (int32_t i = 0; i < s->n_seqs && !queue_head_seen; i++) {
        const seq_t *q = s->seqs[i];
        if (q->state != DECODE_SCHED_STATE_QUEUED) continue;
        queue_head_seen = true; /* strict FIFO: only the head can be admitted */
        if (q->want_blocks <= free_blocks) return true;
    }
    return false;
}

int64_t decode_sched_next_deadline_us(const decode_sched_t *s) {
    if (!s) return -1;
    int64_t best = -1;
    uint64_t t = now_us(), lim = (uint64_t)s->cfg.prefill_timeout_ms * 1000u;
    for (int32_t i = 0; i < s->n_seqs; i++) {
        const seq_t *q = s->seqs[i];
        if (q->state != DECODE_SCHED_STATE_RESERVED) continue;
        uint64_t end = q->t_reserved_us + lim;
        int64_t left = end > t ? (int64_t)(end - t) : 0;
        if (best < 0 || left < best) best = left;
    }
    return best;
}

baton_status_t decode_sched_get_state(const decode_sched_t *s, const uint8_t *request_id,
                                      decode_sched_state_t *out) {
    if (!s || !request_id || !out) return baton_error(BATON_ERR_INVALID_ARG, "decode_sched_get_state: NULL");
    const seq_t *q = find(s, request_id, NULL);
    if (!q) return baton_error(BATON_ERR_NOT_FOUND, "unknown request");
    *out = q->state;
    return BATON_OK;
}

baton_status_t decode_sched_block_table(const decode_sched_t *s, const uint8_t *request_id,
                                        const kv_block_table_t **out) {
    if (!s || !request_id || !out) return baton_error(BATON_ERR_INVALID_ARG, "decode_sched_block_table: NULL");
    const seq_t *q = find(s, request_id, NULL);
    if (!q) return baton_error(BATON_ERR_NOT_FOUND, "unknown request");
    *out = &q->table;
    return BATON_OK;
}

void decode_sched_get_stats(const decode_sched_t *s, decode_sched_stats_t *out) {
    if (!s || !out) return;
    decode_sched_stats_t st = s->st;
    st.n_queued = (uint32_t)n_in_state(s, DECODE_SCHED_STATE_QUEUED);
    st.n_reserved = (uint32_t)n_in_state(s, DECODE_SCHED_STATE_RESERVED);
    st.n_ready = (uint32_t)n_in_state(s, DECODE_SCHED_STATE_READY);
    st.n_running = (uint32_t)n_in_state(s, DECODE_SCHED_STATE_RUNNING);
    st.n_preempted = (uint32_t)n_in_state(s, DECODE_SCHED_STATE_PREEMPTED);
    *out = st;
}

int32_t decode_sched_block_size(const decode_sched_t *s) { return s ? s->block_size : 0; }
