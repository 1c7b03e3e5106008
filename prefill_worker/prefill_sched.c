/* Prefill scheduler (see prefill_sched.h for the contract).
 *
 * Requests live in one doubly linked list in arrival order (FCFS is a walk
 * from the head); lookups by id are linear, which is fine for the few
 * hundred requests a prefill worker holds. Early destinations (KVDestination
 * that overtook its PrefillRequest) sit in a small array with a deadline. */
#include "prefill_worker/prefill_sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/block_hash.h"
#include "common/log.h"

#define MAX_EARLY_DEST 1024

typedef enum req_state {
    REQ_QUEUED = 0,
    REQ_RUNNING,
    REQ_WAIT_DEST,
    REQ_DONE,
} req_state_t;

typedef struct req {
    struct req *prev, *next;
    uint8_t id[PREFILL_SCHED_ID_BYTES];
    void *user;
    req_state_t state;
    bool local;
    int32_t *tokens;
    int32_t n_tokens;
    block_hash_t *hashes; /* [n_full] chain hashes of the full blocks */
    int32_t n_full;
    int32_t n_blocks_total; /* ceil(n_tokens / B) */
    kv_block_table_t table;
    int32_t n_computed;     /* prompt tokens whose KV is in the table */
    int32_t n_cached;       /* of which reused from the radix cache */
    sampler_t *sampler;
    sampling_result_t sample;
    /* destination */
    bool has_dest;
    int32_t *dst_blocks;    /* [n_blocks_total] */
    int32_t n_skip;
    void *dest_user;
    int32_t n_sent;         /* blocks [0, n_sent) sent in every layer */
    int32_t n_sent_real;    /* of which not skipped */
    /* step-local */
    int32_t step_chunk;
    int32_t step_send_end;
    baton_status_t step_err;
    /* times, monotonic us */
    uint64_t t_submit, t_first, t_computed, t_dest;
    uint64_t deadline_us; /* WAIT_DEST */
    uint64_t device_us;   /* share of the steps' forward time (by tokens) */
} req_t;

typedef struct early_dest {
    uint8_t id[PREFILL_SCHED_ID_BYTES];
    int32_t *blocks;
    int32_t n_blocks, n_skip;
    void *dest_user;
    uint64_t deadline_us;
} early_dest_t;

struct prefill_sched {
    model_t *model;
    kv_pool_t *pool;
    radix_cache_t *cache;
    prefill_sched_config_t cfg;
    prefill_sched_hooks_t hooks;
    int32_t block_size;
    int32_t n_vocab;
    int32_t n_ctx;
    model_kv_t kv;
    req_t *head, *tail;
    early_dest_t *early;
    int32_t n_early;
    /* step scratch */
    model_seq_t *seqs;       /* [max_seqs_per_step] */
    req_t **step_reqs;       /* [max_seqs_per_step] */
    int32_t step_n;
    float *logits;           /* [max_seqs_per_step, n_vocab] */
    kv_transfer_block_pair_t *pairs; /* [pair_cap] */
    size_t pair_cap;
    int32_t *match_ids;      /* [match_cap] */
    size_t match_cap;
    prefill_sched_stats_t st;
    uint64_t t_last_step_end; /* monotonic us; 0 before the first step */
    bool work_left;           /* prompt tokens were left after the last step */
};

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

prefill_sched_config_t prefill_sched_config_default(void) {
    prefill_sched_config_t c = {
        .max_batch_tokens = 512,
        .max_seqs_per_step = 64,
        .hash_seed = 0,
        .kv_destination_timeout_ms = 10000,
    };
    return c;
}

baton_status_t prefill_sched_init(model_t *model, kv_pool_t *pool, radix_cache_t *cache,
                                  const prefill_sched_config_t *config,
                                  const prefill_sched_hooks_t *hooks, prefill_sched_t **out) {
    if (!model || !pool || !cache || !config || !hooks || !hooks->finished || !out)
        return baton_error(BATON_ERR_INVALID_ARG, "prefill_sched_init: NULL argument");
    if (config->max_batch_tokens < 1 || config->max_seqs_per_step < 1 ||
        config->max_seqs_per_step > 4096)
        return baton_error(BATON_ERR_INVALID_ARG,
                           "prefill_sched_init: max_batch_tokens %d / max_seqs_per_step %d out "
                           "of range",
                           config->max_batch_tokens, config->max_seqs_per_step);
    const backend_kv_geom_t *g = kv_pool_geom(pool);
    backend_kv_geom_t mg = model_kv_geom(model, g->n_blocks, g->block_size);
    if (mg.n_layers != g->n_layers || mg.n_kv_heads != g->n_kv_heads ||
        mg.head_dim != g->head_dim || mg.dtype != g->dtype)
        return baton_error(BATON_ERR_INVALID_ARG,
                           "prefill_sched_init: pool geometry (%d layers, %d kv heads, head_dim "
                           "%d) is not the model's (%d, %d, %d)",
                           g->n_layers, g->n_kv_heads, g->head_dim, mg.n_layers, mg.n_kv_heads,
                           mg.head_dim);
    prefill_sched_t *s = calloc(1, sizeof(*s));
    if (!s) return baton_error(BATON_ERR_NO_MEMORY, "prefill_sched_init");
    s->model = model;
    s->pool = pool;
    s->cache = cache;
    s->cfg = *config;
    s->hooks = *hooks;
    s->block_size = g->block_size;
    s->n_vocab = model_hparams(model)->n_vocab;
    s->n_ctx = model_hparams(model)->n_ctx_train;
    s->kv.geom = *g;
    s->kv.k_pool = kv_pool_k_base(pool);
    s->kv.v_pool = kv_pool_v_base(pool);
    size_t ns = (size_t)config->max_seqs_per_step;
    s->seqs = calloc(ns, sizeof(*s->seqs));
    s->step_reqs = calloc(ns, sizeof(*s->step_reqs));
    s->logits = malloc(ns * (size_t)s->n_vocab * sizeof(float));
    s->early = calloc(MAX_EARLY_DEST, sizeof(*s->early));
    if (!s->seqs || !s->step_reqs || !s->logits || !s->early) {
        prefill_sched_free(s);
        return baton_error(BATON_ERR_NO_MEMORY, "prefill_sched_init: scratch");
    }
    *out = s;
    return BATON_OK;
}

static void req_free(prefill_sched_t *s, req_t *r) {
    kv_block_table_release(&r->table, s->pool);
    sampler_free(r->sampler);
    free(r->tokens);
    free(r->hashes);
    free(r->dst_blocks);
    free(r);
}

static void req_unlink(prefill_sched_t *s, req_t *r) {
    if (r->prev) r->prev->next = r->next;
    else s->head = r->next;
    if (r->next) r->next->prev = r->prev;
    else s->tail = r->prev;
    r->prev = r->next = NULL;
}

static void early_drop(prefill_sched_t *s, int32_t i) {
    free(s->early[i].blocks);
    s->early[i] = s->early[--s->n_early];
    memset(&s->early[s->n_early], 0, sizeof(s->early[0]));
}

void prefill_sched_free(prefill_sched_t *s) {
    if (!s) return;
    req_t *r = s->head;
    while (r) {
        req_t *n = r->next;
        req_free(s, r);
        r = n;
    }
    while (s->n_early > 0) early_drop(s, s->n_early - 1);
    free(s->seqs);
    free(s->step_reqs);
    free(s->logits);
    free(s->early);
    free(s->pairs);
    free(s->match_ids);
    free(s);
}

static req_t *find_req(const prefill_sched_t *s, const uint8_t *id) {
    for (req_t *r = s->head; r; r = r->next)
        if (memcmp(r->id, id, PREFILL_SCHED_ID_BYTES) == 0) return r;
    return NULL;
}

static int32_t find_early(const prefill_sched_t *s, const uint8_t *id) {
    for (int32_t i = 0; i < s->n_early; i++)
        if (memcmp(s->early[i].id, id, PREFILL_SCHED_ID_BYTES) == 0) return i;
    return -1;
}

/* Fails `r`: unlinks, releases its blocks, reports `st` with `why`, frees. */
static void fail_req(prefill_sched_t *s, req_t *r, baton_status_t st, const char *why) {
    req_unlink(s, r);
    kv_block_table_release(&r->table, s->pool);
    prefill_sched_result_t res = {
        .request_id = r->id,
        .user = r->user,
        .status = st,
        .error = why ? why : baton_status_str(st),
        .n_prompt_tokens = r->n_tokens,
        .n_cached_tokens = r->n_cached,
        .n_blocks = r->n_blocks_total,
        .n_blocks_sent = r->n_sent_real,
    };
    uint8_t id[PREFILL_SCHED_ID_BYTES];
    memcpy(id, r->id, sizeof(id));
    res.request_id = id;
    s->st.failed++;
    LOG_DEBUG("prefill", "request failed: %s", res.error);
    req_free(s, r);
    s->hooks.finished(s->hooks.arg, &res);
}

static baton_status_t ensure_pairs(prefill_sched_t *s, size_t n) {
    if (n <= s->pair_cap) return BATON_OK;
    kv_transfer_block_pair_t *p = realloc(s->pairs, n * sizeof(*p));
    if (!p) return baton_error(BATON_ERR_NO_MEMORY, "prefill_sched: transfer pairs");
    s->pairs = p;
    s->pair_cap = n;
    return BATON_OK;
}

/* Sends layer `layer` of blocks [from, to) of `r` (skipping n_skip). */
static baton_status_t send_blocks_layer(prefill_sched_t *s, req_t *r, int32_t layer,
                                        int32_t from, int32_t to) {
    if (from < r->n_skip) from = r->n_skip;
    if (to <= from) return BATON_OK;
    if (!s->hooks.send_layer)
        return baton_error(BATON_ERR_INVALID_ARG, "prefill_sched: no send_layer hook");
    baton_status_t st = ensure_pairs(s, (size_t)(to - from));
    if (st != BATON_OK) return st;
    size_t n = 0;
    for (int32_t j = from; j < to; j++) {
        s->pairs[n].src_block = r->table.blocks[j];
        s->pairs[n].dst_block = r->dst_blocks[j];
        n++;
    }
    return s->hooks.send_layer(s->hooks.arg, r->dest_user, layer, s->pairs, n);
}

/* Sends every layer of blocks [r->n_sent, to). */
static baton_status_t send_blocks_all_layers(prefill_sched_t *s, req_t *r, int32_t to) {
    for (int32_t l = 0; l < s->kv.geom.n_layers; l++) {
        baton_status_t st = send_blocks_layer(s, r, l, r->n_sent, to);
        if (st != BATON_OK) return st;
    }
    int32_t from = r->n_sent > r->n_skip ? r->n_sent : r->n_skip;
    if (to > from) r->n_sent_real += to - from;
    if (to > r->n_sent) r->n_sent = to;
    return BATON_OK;
}

/* A computed request with its destination (or local): report DONE. */
static void finish_ok(prefill_sched_t *s, req_t *r) {
    r->state = REQ_DONE;
    s->st.finished_ok++;
    prefill_sched_result_t res = {
        .request_id = r->id,
        .user = r->user,
        .status = BATON_OK,
        .error = "",
        .sample = r->sample,
        .n_prompt_tokens = r->n_tokens,
        .n_cached_tokens = r->n_cached,
        .n_blocks = r->n_blocks_total,
        .n_blocks_sent = r->n_sent_real,
        .queue_us = r->t_first - r->t_submit,
        .compute_us = r->t_computed - r->t_first,
        .device_us = r->device_us,
        .wait_dest_us = r->t_dest > r->t_computed ? r->t_dest - r->t_computed : 0,
    };
    /* the hook may release/detach r: copy the id it points to */
    uint8_t id[PREFILL_SCHED_ID_BYTES];
    memcpy(id, r->id, sizeof(id));
    res.request_id = id;
    s->hooks.finished(s->hooks.arg, &res);
}

static baton_status_t attach_dest(prefill_sched_t *s, req_t *r, const int32_t *blocks, int32_t n,
                                  int32_t n_skip, void *dest_user) {
    if (n != r->n_blocks_total) {
        char why[160];
        snprintf(why, sizeof(why),
                 "KVDestination has %d blocks, the prompt of %d tokens needs %d", n, r->n_tokens,
                 r->n_blocks_total);
        fail_req(s, r, BATON_ERR_OUT_OF_RANGE, why);
        return baton_error(BATON_ERR_OUT_OF_RANGE, "prefill_sched_set_destination: %s", why);
    }
    r->dst_blocks = malloc(sizeof(int32_t) * (size_t)n);
    if (!r->dst_blocks) return baton_error(BATON_ERR_NO_MEMORY, "prefill_sched: destination");
    memcpy(r->dst_blocks, blocks, sizeof(int32_t) * (size_t)n);
    r->n_skip = n_skip;
    r->dest_user = dest_user;
    r->has_dest = true;
    r->t_dest = now_us();
    if (r->state == REQ_QUEUED) return BATON_OK; /* nothing final yet; the first step sends */
    int32_t final_to = (r->state == REQ_RUNNING) ? r->n_computed / s->block_size : r->n_blocks_total;
    baton_status_t st = send_blocks_all_layers(s, r, final_to);
    if (st != BATON_OK) {
        char why[600];
        snprintf(why, sizeof(why), "KV send failed: %s", baton_last_error());
        fail_req(s, r, st, why);
        return baton_error(st, "prefill_sched_set_destination: %s", why);
    }
    if (r->state == REQ_WAIT_DEST) finish_ok(s, r);
    return BATON_OK;
}

baton_status_t prefill_sched_submit(prefill_sched_t *s, const prefill_sched_request_t *q) {
    if (!s || !q || !q->request_id || (!q->tokens && q->n_tokens > 0))
        return baton_error(BATON_ERR_INVALID_ARG, "prefill_sched_submit: NULL argument");
    if (q->n_tokens < 1 || q->n_tokens > s->n_ctx)
        return baton_error(BATON_ERR_OUT_OF_RANGE,
                           "prefill_sched_submit: prompt of %d tokens (model context %d)",
                           q->n_tokens, s->n_ctx);
    for (int32_t i = 0; i < q->n_tokens; i++)
        if (q->tokens[i] < 0 || q->tokens[i] >= s->n_vocab)
            return baton_error(BATON_ERR_OUT_OF_RANGE,
                               "prefill_sched_submit: token %d is %d, outside the vocabulary "
                               "of %d",
                               i, q->tokens[i], s->n_vocab);
    if (find_req(s, q->request_id))
        return baton_error(BATON_ERR_INVALID_ARG, "prefill_sched_submit: request id already queued");
    const int32_t B = s->block_size;
    int32_t n_blocks = (q->n_tokens + B - 1) / B;
    if (n_blocks > s->kv.geom.n_blocks)
        return baton_error(BATON_ERR_NO_SPACE,
                           "prefill_sched_submit: prompt needs %d blocks, the pool has %d",
                           n_blocks, s->kv.geom.n_blocks);
    req_t *r = calloc(1, sizeof(*r));
    if (!r) return baton_error(BATON_ERR_NO_MEMORY, "prefill_sched_submit");
    baton_status_t st = sampler_init(&q->sampling, s->n_vocab, &r->sampler);
    if (st != BATON_OK) {
        free(r);
        return st;
    }
    memcpy(r->id, q->request_id, PREFILL_SCHED_ID_BYTES);
    r->user = q->user;
    r->local = q->local;
    r->n_tokens = q->n_tokens;
    r->n_full = q->n_tokens / B;
    r->n_blocks_total = n_blocks;
    r->tokens = malloc(sizeof(int32_t) * (size_t)q->n_tokens);
    r->hashes = malloc(sizeof(block_hash_t) * (size_t)(r->n_full > 0 ? r->n_full : 1));
    if (!r->tokens || !r->hashes) {
        req_free(s, r);
        return baton_error(BATON_ERR_NO_MEMORY, "prefill_sched_submit: copies");
    }
    memcpy(r->tokens, q->tokens, sizeof(int32_t) * (size_t)q->n_tokens);
    block_hash_t salt = {0, q->cache_salt};
    size_t nh = 0;
    st = block_hash_chain(r->tokens, (size_t)r->n_tokens, (uint32_t)B, s->cfg.hash_seed,
                          q->cache_salt ? &salt : NULL, r->hashes, (size_t)r->n_full, &nh);
    if (st != BATON_OK) {
        req_free(s, r);
        return st;
    }
    /* penalties look at the prompt (common/sampling.h: engines accept it) */
    for (int32_t i = 0; i < r->n_tokens; i++) {
        st = sampler_accept(r->sampler, r->tokens[i]);
        if (st != BATON_OK) {
            req_free(s, r);
            return st;
        }
    }
    kv_block_table_init(&r->table);
    r->state = REQ_QUEUED;
    r->t_submit = now_us();
    r->prev = s->tail;
    if (s->tail) s->tail->next = r;
    else s->head = r;
    s->tail = r;
    int32_t e = find_early(s, r->id);
    if (e >= 0) {
        early_dest_t d = s->early[e];
        s->early[e].blocks = NULL;
        early_drop(s, e);
        st = attach_dest(s, r, d.blocks, d.n_blocks, d.n_skip, d.dest_user);
        free(d.blocks);
        /* a mismatching early destination failed the request via the hook */
        if (st == BATON_ERR_OUT_OF_RANGE) return BATON_OK;
        if (st != BATON_OK) return st;
    }
    return BATON_OK;
}

baton_status_t prefill_sched_set_destination(prefill_sched_t *s, const uint8_t *request_id,
                                             const int32_t *dst_blocks, int32_t n_dst_blocks,
                                             int32_t n_skip_blocks, void *dest_user) {
    if (!s || !request_id || !dst_blocks || n_dst_blocks < 1 || n_skip_blocks < 0 ||
        n_skip_blocks > n_dst_blocks)
        return baton_error(BATON_ERR_INVALID_ARG,
                           "prefill_sched_set_destination: bad arguments (%d blocks, skip %d)",
                           n_dst_blocks, n_skip_blocks);
    req_t *r = find_req(s, request_id);
    if (r) {
        if (r->has_dest || r->state == REQ_DONE)
            return baton_error(BATON_ERR_INVALID_ARG,
                               "prefill_sched_set_destination: request already has a destination");
        return attach_dest(s, r, dst_blocks, n_dst_blocks, n_skip_blocks, dest_user);
    }
    if (find_early(s, request_id) >= 0)
        return baton_error(BATON_ERR_INVALID_ARG,
                           "prefill_sched_set_destination: request already has a destination");
    if (s->n_early >= MAX_EARLY_DEST)
        return baton_error(BATON_ERR_NO_SPACE,
                           "prefill_sched_set_destination: %d destinations wait for their "
                           "requests",
                           s->n_early);
    early_dest_t *d = &s->early[s->n_early];
    d->blocks = malloc(sizeof(int32_t) * (size_t)n_dst_blocks);
    if (!d->blocks) return baton_error(BATON_ERR_NO_MEMORY, "prefill_sched: early destination");
    memcpy(d->blocks, dst_blocks, sizeof(int32_t) * (size_t)n_dst_blocks);
    memcpy(d->id, request_id, PREFILL_SCHED_ID_BYTES);
    d->n_blocks = n_dst_blocks;
    d->n_skip = n_skip_blocks;
    d->dest_user = dest_user;
    d->deadline_us = now_us() + (uint64_t)s->cfg.kv_destination_timeout_ms * 1000u;
    s->n_early++;
    return BATON_OK;
}

static void expire(prefill_sched_t *s, uint64_t now) {
    for (int32_t i = 0; i < s->n_early;) {
        if (s->early[i].deadline_us <= now) {
            LOG_WARN("prefill", "KVDestination for an unknown request expired");
            early_drop(s, i);
        } else {
            i++;
        }
    }
    /* rescan from the head after each failure: its hook may have released
     * other (DONE) requests */
    for (;;) {
        req_t *r = s->head;
        while (r && !(r->state == REQ_WAIT_DEST && r->deadline_us <= now)) r = r->next;
        if (!r) break;
        char why[128];
        snprintf(why, sizeof(why), "no KVDestination within %u ms", s->cfg.kv_destination_timeout_ms);
        fail_req(s, r, BATON_ERR_TIMEOUT, why);
    }
}

/* Radix match before the first chunk. */
static baton_status_t start_req(prefill_sched_t *s, req_t *r) {
    const int32_t B = s->block_size;
    int32_t max_match = (r->n_tokens - 1) / B;
    if (max_match > r->n_full) max_match = r->n_full;
    if ((size_t)max_match > s->match_cap) {
        int32_t *m = realloc(s->match_ids, sizeof(int32_t) * (size_t)max_match);
        if (!m) return baton_error(BATON_ERR_NO_MEMORY, "prefill_sched: match ids");
        s->match_ids = m;
        s->match_cap = (size_t)max_match;
    }
    size_t n_matched = 0;
    baton_status_t st = BATON_OK;
    if (max_match > 0) {
        st = radix_cache_match(s->cache, r->hashes, (size_t)max_match, s->match_ids, &n_matched);
        if (st != BATON_OK) return st;
    }
    if (n_matched > 0) {
        st = kv_block_table_append_shared(&r->table, s->pool, s->match_ids, (int32_t)n_matched);
        for (size_t i = 0; i < n_matched; i++) kv_pool_unref(s->pool, s->match_ids[i]);
        if (st != BATON_OK) return st;
    }
    r->n_cached = (int32_t)n_matched * B;
    r->n_computed = r->n_cached;
    r->state = REQ_RUNNING;
    r->t_first = now_us();
    return BATON_OK;
}

/* Grows r's table to `n_tokens`, evicting from the radix cache when short.
 * BATON_ERR_NO_SPACE when the pool cannot give the blocks now. */
static baton_status_t reserve(prefill_sched_t *s, req_t *r, int32_t n_tokens) {
    baton_status_t st = kv_block_table_reserve(&r->table, s->pool, n_tokens);
    if (st != BATON_ERR_NO_SPACE) return st;
    int32_t need = (n_tokens + s->block_size - 1) / s->block_size - r->table.n_blocks;
    int32_t short_by = need - kv_pool_n_free(s->pool);
    if (short_by > 0) {
        size_t ev = 0;
        st = radix_cache_evict(s->cache, (size_t)short_by, &ev);
        if (st != BATON_OK) return st;
    }
    return kv_block_table_reserve(&r->table, s->pool, n_tokens);
}

static void on_layer(void *arg, int32_t layer) {
    prefill_sched_t *s = arg;
    for (int32_t i = 0; i < s->step_n; i++) {
        req_t *r = s->step_reqs[i];
        if (!r->has_dest || r->step_err != BATON_OK) continue;
        baton_status_t st = send_blocks_layer(s, r, layer, r->n_sent, r->step_send_end);
        if (st != BATON_OK) r->step_err = st;
    }
}

baton_status_t prefill_sched_step(prefill_sched_t *s, int32_t *n_tokens_out) {
    if (!s) return baton_error(BATON_ERR_INVALID_ARG, "prefill_sched_step: NULL");
    uint64_t t0 = now_us();
    expire(s, t0);
    const int32_t B = s->block_size;
    int32_t budget = s->cfg.max_batch_tokens;
    s->step_n = 0;
    int32_t n_tok = 0;
    req_t *r = s->head;
    while (r && budget > 0 && s->step_n < s->cfg.max_seqs_per_step) {
        req_t *next = r->next;
        if (r->state != REQ_QUEUED && r->state != REQ_RUNNING) {
            r = next;
            continue;
        }
        if (r->state == REQ_QUEUED) {
            baton_status_t st = start_req(s, r);
            if (st != BATON_OK) {
                char why[600];
                snprintf(why, sizeof(why), "prefix match failed: %s", baton_last_error());
                fail_req(s, r, st, why);
                r = next;
                continue;
            }
        }
        int32_t left = r->n_tokens - r->n_computed;
        int32_t chunk = left < budget ? left : budget;
        baton_status_t st = reserve(s, r, r->n_computed + chunk);
        if (st == BATON_ERR_NO_SPACE) break; /* it (and every younger one) waits */
        if (st != BATON_OK) {
            char why[600];
            snprintf(why, sizeof(why), "block allocation failed: %s", baton_last_error());
            fail_req(s, r, st, why);
            r = next;
            continue;
        }
        bool final = chunk == left;
        model_seq_t *q = &s->seqs[s->step_n];
        q->tokens = r->tokens + r->n_computed;
        q->n_tokens = chunk;
        q->pos = r->n_computed;
        q->block_table = r->table.blocks;
        q->n_blocks = r->table.n_blocks;
        q->logits = final ? MODEL_LOGITS_LAST : MODEL_LOGITS_NONE;
        r->step_chunk = chunk;
        r->step_send_end = final ? r->n_blocks_total : (r->n_computed + chunk) / B;
        r->step_err = BATON_OK;
        s->step_reqs[s->step_n++] = r;
        budget -= chunk;
        n_tok += chunk;
        r = next;
    }
    if (s->step_n == 0) {
        if (n_tokens_out) *n_tokens_out = 0;
        return BATON_OK;
    }
    model_batch_t batch = {.seqs = s->seqs, .n_seqs = s->step_n};
    if (s->work_left && s->t_last_step_end) { /* the scheduler idled with work pending */
        uint64_t gap = t0 - s->t_last_step_end;
        s->st.idle_gaps++;
        s->st.idle_gap_us += gap;
        if (gap > s->st.idle_gap_max_us) s->st.idle_gap_max_us = gap;
    }
    uint64_t t_fwd = now_us();
    baton_status_t fst = model_forward_layers(s->model, &s->kv, &batch, s->logits, on_layer, s);
    uint64_t t1 = now_us();
    /* device time: the forward's duration split over the step's requests in
     * proportion to their tokens (DESIGN "Observability and cost") */
    for (int32_t i = 0; i < s->step_n && n_tok > 0; i++)
        s->step_reqs[i]->device_us +=
            (t1 - t_fwd) * (uint64_t)s->step_reqs[i]->step_chunk / (uint64_t)n_tok;
    s->st.steps++;
    s->st.step_tokens += (uint64_t)n_tok;
    int32_t n = s->step_n;
    s->step_n = 0;
    if (fst != BATON_OK) {
        char why[600];
        snprintf(why, sizeof(why), "forward failed: %s", baton_last_error());
        LOG_ERROR("prefill", "%s", why);
        for (int32_t i = 0; i < n; i++) fail_req(s, s->step_reqs[i], fst, why);
        s->st.busy_us += now_us() - t0;
        if (n_tokens_out) *n_tokens_out = n_tok;
        return BATON_OK;
    }
    int32_t row = 0;
    for (int32_t i = 0; i < n; i++) {
        r = s->step_reqs[i];
        bool final = r->n_computed + r->step_chunk == r->n_tokens;
        const float *lrow = final ? s->logits + (size_t)row++ * s->n_vocab : NULL;
        r->n_computed += r->step_chunk;
        if (r->step_err != BATON_OK) {
            char why[600];
            snprintf(why, sizeof(why), "KV send failed: %s", baton_status_str(r->step_err));
            fail_req(s, r, r->step_err, why);
            continue;
        }
        if (r->has_dest) {
            int32_t from = r->n_sent > r->n_skip ? r->n_sent : r->n_skip;
            if (r->step_send_end > from) r->n_sent_real += r->step_send_end - from;
            if (r->step_send_end > r->n_sent) r->n_sent = r->step_send_end;
        }
        if (!final) continue;
        r->t_computed = t1;
        baton_status_t st = sampler_sample(r->sampler, lrow, &r->sample);
        if (st != BATON_OK) {
            char why[600];
            snprintf(why, sizeof(why), "sampling failed: %s", baton_last_error());
            fail_req(s, r, st, why);
            continue;
        }
        if (r->n_full > 0) {
            st = radix_cache_insert(s->cache, r->hashes, r->table.blocks, (size_t)r->n_full, NULL);
            if (st != BATON_OK)
                LOG_WARN("prefill", "radix cache insert failed (request continues): %s",
                         baton_last_error());
        }
        if (r->has_dest || r->local) {
            finish_ok(s, r);
        } else {
            r->state = REQ_WAIT_DEST;
            r->deadline_us = t1 + (uint64_t)s->cfg.kv_destination_timeout_ms * 1000u;
        }
    }
    s->st.busy_us += now_us() - t0;
    s->t_last_step_end = now_us();
    s->work_left = false;
    for (const req_t *q = s->head; q; q = q->next)
        if (q->state == REQ_QUEUED || q->state == REQ_RUNNING) {
            s->work_left = true;
            break;
        }
    if (n_tokens_out) *n_tokens_out = n_tok;
    return BATON_OK;
}

bool prefill_sched_has_work(const prefill_sched_t *s) {
    if (!s) return false;
    for (const req_t *r = s->head; r; r = r->next)
        if (r->state == REQ_QUEUED || r->state == REQ_RUNNING) return true;
    return false;
}

int64_t prefill_sched_next_deadline_us(const prefill_sched_t *s) {
    if (!s) return -1;
    uint64_t best = UINT64_MAX;
    for (const req_t *r = s->head; r; r = r->next)
        if (r->state == REQ_WAIT_DEST && r->deadline_us < best) best = r->deadline_us;
    for (int32_t i = 0; i < s->n_early; i++)
        if (s->early[i].deadline_us < best) best = s->early[i].deadline_us;
    if (best == UINT64_MAX) return -1;
    uint64_t now = now_us();
    return best > now ? (int64_t)(best - now) : 0;
}

baton_status_t prefill_sched_release(prefill_sched_t *s, const uint8_t *request_id) {
    if (!s || !request_id) return baton_error(BATON_ERR_INVALID_ARG, "prefill_sched_release: NULL");
    req_t *r = find_req(s, request_id);
    if (!r) return baton_error(BATON_ERR_NOT_FOUND, "prefill_sched_release: unknown request");
    if (r->state != REQ_DONE)
        return baton_error(BATON_ERR_INVALID_ARG, "prefill_sched_release: request not done");
    req_unlink(s, r);
    req_free(s, r);
    return BATON_OK;
}

baton_status_t prefill_sched_detach(prefill_sched_t *s, const uint8_t *request_id,
                                    kv_block_table_t *out) {
    if (!s || !request_id || !out)
        return baton_error(BATON_ERR_INVALID_ARG, "prefill_sched_detach: NULL");
    if (out->n_blocks != 0 || out->blocks)
        return baton_error(BATON_ERR_INVALID_ARG, "prefill_sched_detach: table not empty");
    req_t *r = find_req(s, request_id);
    if (!r) return baton_error(BATON_ERR_NOT_FOUND, "prefill_sched_detach: unknown request");
    if (r->state != REQ_DONE)
        return baton_error(BATON_ERR_INVALID_ARG, "prefill_sched_detach: request not done");
    req_unlink(s, r);
    *out = r->table;
    out->n_tokens = r->n_tokens;
    kv_block_table_init(&r->table);
    req_free(s, r);
    return BATON_OK;
}

baton_status_t prefill_sched_abort(prefill_sched_t *s, const uint8_t *request_id,
                                   bool *was_active) {
    if (!s || !request_id) return baton_error(BATON_ERR_INVALID_ARG, "prefill_sched_abort: NULL");
    bool found = false, active = false;
    int32_t e = find_early(s, request_id);
    if (e >= 0) {
        early_drop(s, e);
        found = true;
    }
    req_t *r = find_req(s, request_id);
    if (r) {
        req_unlink(s, r);
        req_free(s, r);
        found = active = true;
    }
    if (!found) return baton_error(BATON_ERR_NOT_FOUND, "prefill_sched_abort: unknown request");
    if (was_active) *was_active = active;
    return BATON_OK;
}

void prefill_sched_get_stats(const prefill_sched_t *s, prefill_sched_stats_t *out) {
    if (!s || !out) return;
    prefill_sched_stats_t st = s->st;
    st.queued_prefill_tokens = 0;
    st.n_waiting = st.n_running = st.n_wait_dest = st.n_done = 0;
    for (const req_t *r = s->head; r; r = r->next) {
        switch (r->state) {
        case REQ_QUEUED: st.n_waiting++; break;
        case REQ_RUNNING: st.n_running++; break;
        case REQ_WAIT_DEST: st.n_wait_dest++; break;
        case REQ_DONE: st.n_done++; break;
        }
        if (r->state == REQ_QUEUED || r->state == REQ_RUNNING)
            st.queued_prefill_tokens += (uint64_t)(r->n_tokens - r->n_computed);
    }
    st.n_early_dest = (uint32_t)s->n_early;
    *out = st;
}

int32_t prefill_sched_block_size(const prefill_sched_t *s) { return s ? s->block_size : 0; }
