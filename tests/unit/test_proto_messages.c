/* proto message codec tests: seeded random round trips of every message,
 * and every field of every message removed / mistyped / out of range / too
 * long, truncation at every length, unknown keys, newer versions and hostile
 * container sizes. Expected statuses come from the schema written down in
 * proto/messages.h (ranges, optional keys), checked here independently of the
 * codec's field table: mutations are made on the msgpack object tree with
 * msgpack-c, not with the codec. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/messages.h"
#include "tests/test_util.h"

/* ---- deterministic RNG and a per-iteration arena ------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static uint32_t rnd_below(uint32_t n) { return n ? (uint32_t)(rnd() % n) : 0; }
static float rnd_float(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() >> 40) / (float)(1 << 24); }

static void *arena[4096];
static int n_arena;
static void *alloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (!p || n_arena == 4096) abort();
    arena[n_arena++] = p;
    return p;
}
static void arena_reset(void) {
    while (n_arena) free(arena[--n_arena]);
}

static proto_limits_t lim; /* small limits so "too long" is cheap */
static bool force_full;   /* every optional array non-empty */

static uint32_t rnd_count(uint32_t lo, uint32_t hi) {
    if (force_full && lo == 0) lo = 1;
    return lo + rnd_below(hi - lo + 1);
}
static void rnd_bytes(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd();
}
static void rnd_wid(char *out) {
    static const char cs[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-";
    uint32_t n = 1 + rnd_below(PROTO_WORKER_ID_MAX);
    for (uint32_t i = 0; i < n; i++) out[i] = cs[rnd_below(sizeof(cs) - 1)];
    out[n] = '\0';
}
static char *rnd_str(void) {
    uint32_t n = rnd_count(0, lim.max_str_bytes);
    char *s = alloc(n + 1);
    for (uint32_t i = 0; i < n; i++) s[i] = (char)(1 + rnd_below(126)); /* any byte but NUL */
    return s;
}
static uint32_t *rnd_tokens(uint32_t n) {
    uint32_t *t = alloc(n * sizeof(*t));
    for (uint32_t i = 0; i < n; i++) t[i] = rnd_below(lim.vocab_size);
    return t;
}
static uint64_t rnd_u64(void) { return rnd() >> rnd_below(64); }

static void fill_pool(proto_pool_desc_t *p) {
    p->n_regions = rnd_count(0, 3);
    p->regions = alloc(p->n_regions * sizeof(*p->regions));
    for (uint32_t i = 0; i < p->n_regions; i++) {
        p->regions[i].base_addr = rnd();
        p->regions[i].length_bytes = 1 + rnd_u64() / 2;
        p->regions[i].rkey_len = 1 + rnd_below(lim.max_bin_bytes);
        p->regions[i].rkey = alloc(p->regions[i].rkey_len);
        rnd_bytes(p->regions[i].rkey, p->regions[i].rkey_len);
    }
    p->n_blocks = rnd_below(INT32_MAX);
    p->block_bytes = rnd_u64();
}

static void fill_sampling(proto_sampling_t *s) {
    s->temperature = rnd_float(0, 2);
    s->top_p = rnd_float(0.01f, 1);
    s->top_k = rnd_below(lim.vocab_size + 1);
    s->min_p = rnd_float(0, 1);
    s->repetition_penalty = rnd_float(0.5f, 2);
    s->presence_penalty = rnd_float(-2, 2);
    s->frequency_penalty = rnd_float(-2, 2);
    s->seed = rnd();
    s->max_tokens = 1 + rnd_below(lim.max_tokens);
    s->n_stop_token_ids = rnd_count(0, 4);
    s->stop_token_ids = rnd_tokens(s->n_stop_token_ids);
    s->logprobs = rnd() & 1;
    s->top_logprobs = rnd_below(PROTO_MAX_TOP_LOGPROBS + 1);
    s->ignore_eos = rnd() & 1;
    s->n_logit_bias = rnd_count(0, 4);
    s->logit_bias = alloc(s->n_logit_bias * sizeof(*s->logit_bias));
    for (uint32_t i = 0; i < s->n_logit_bias; i++) {
        s->logit_bias[i].token = rnd_below(lim.vocab_size);
        s->logit_bias[i].bias = rnd_float(-100, 100);
    }
}

static proto_token_logprob_t *rnd_top(uint32_t n) {
    proto_token_logprob_t *t = alloc(n * sizeof(*t));
    for (uint32_t i = 0; i < n; i++) {
        t[i].token = rnd_below(lim.vocab_size);
        t[i].logprob = rnd_float(-30, 0);
    }
    return t;
}

static void fill_msg(proto_msg_type_t type, proto_msg_t *m) {
    memset(m, 0, sizeof(*m));
    m->type = type;
    switch (type) {
    case PROTO_MSG_WORKER_REGISTER: {
        proto_worker_register_t *r = &m->u.worker_register;
        rnd_wid(r->worker_id);
        r->role = (proto_role_t)rnd_below(3);
        r->epoch = 1 + rnd_below(1u << 30);
        r->zmq_endpoint = rnd_str();
        rnd_bytes(r->model_sha256, sizeof(r->model_sha256));
        r->vocab_size = 1 + (uint32_t)rnd_below(UINT32_MAX);
        r->kv.n_layers = 1 + rnd_below(1024);
        r->kv.n_kv_heads = 1 + rnd_below(1024);
        r->kv.head_dim = 1 + rnd_below(4096);
        r->kv.block_size = 1 + rnd_below(4096);
        r->kv.dtype = (proto_kv_dtype_t)rnd_below(3);
        r->kv.hash_seed_id = rnd();
        r->ucx_address_len = rnd_count(0, lim.max_bin_bytes);
        r->ucx_address = alloc(r->ucx_address_len);
        rnd_bytes(r->ucx_address, r->ucx_address_len);
        fill_pool(&r->pool);
        break;
    }
    case PROTO_MSG_WORKER_HEARTBEAT: {
        proto_worker_heartbeat_t *h = &m->u.worker_heartbeat;
        rnd_wid(h->worker_id);
        h->role = (proto_role_t)rnd_below(3);
        h->epoch = 1 + rnd_u64() / 2;
        h->timestamp_unix_us = rnd();
        h->queued_prefill_tokens = rnd_u64();
        h->n_running = (uint32_t)rnd();
        h->n_waiting = (uint32_t)rnd();
        h->total_blocks = (uint32_t)rnd();
        h->free_blocks = rnd_below(h->total_blocks + 1);
        h->batch_occupancy = rnd_float(0, 1);
        break;
    }
    case PROTO_MSG_PREFILL_REQUEST: {
        proto_prefill_request_t *p = &m->u.prefill_request;
        rnd_bytes(p->request_id.bytes, PROTO_ID_BYTES);
        rnd_wid(p->decode_worker_id);
        p->decode_epoch = rnd();
        p->n_token_ids = 1 + rnd_below(lim.max_tokens);
        p->token_ids = rnd_tokens(p->n_token_ids);
        fill_sampling(&p->sampling);
        p->tenant = rnd_str();
        p->cache_salt = rnd();
        p->deadline_unix_us = rnd();
        break;
    }
    case PROTO_MSG_DECODE_REQUEST: {
        proto_decode_request_t *d = &m->u.decode_request;
        rnd_bytes(d->request_id.bytes, PROTO_ID_BYTES);
        rnd_wid(d->prefill_worker_id);
        d->n_prompt_tokens = 1 + rnd_below(lim.max_tokens);
        d->n_blocks = 1 + rnd_below(lim.max_blocks);
        d->n_token_ids = (force_full || (rnd() & 1)) ? d->n_prompt_tokens : 0;
        d->token_ids = rnd_tokens(d->n_token_ids);
        fill_sampling(&d->sampling);
        d->tenant = rnd_str();
        d->cache_salt = rnd();
        d->deadline_unix_us = rnd();
        break;
    }
    case PROTO_MSG_KV_DESTINATION: {
        proto_kv_destination_t *k = &m->u.kv_destination;
        rnd_bytes(k->request_id.bytes, PROTO_ID_BYTES);
        rnd_wid(k->decode_worker_id);
        k->decode_epoch = 1 + rnd_u64() / 2;
        k->n_block_ids = 1 + rnd_below(lim.max_blocks);
        k->block_ids = alloc(k->n_block_ids * sizeof(uint32_t));
        for (uint32_t i = 0; i < k->n_block_ids; i++) k->block_ids[i] = rnd_below(INT32_MAX);
        k->n_skip_blocks = rnd_below(k->n_block_ids + 1);
        fill_pool(&k->pool);
        break;
    }
    case PROTO_MSG_PREFILL_DONE: {
        proto_prefill_done_t *p = &m->u.prefill_done;
        rnd_bytes(p->request_id.bytes, PROTO_ID_BYTES);
        rnd_wid(p->prefill_worker_id);
        p->status = -(int32_t)rnd_below(15);
        p->error = rnd_str();
        p->first_token = rnd_below(lim.vocab_size);
        p->first_logprob = rnd_float(-20, 0);
        p->n_top_logprobs = rnd_count(0, PROTO_MAX_TOP_LOGPROBS);
        p->top_logprobs = rnd_top(p->n_top_logprobs);
        p->n_blocks_written = (uint32_t)rnd();
        p->bytes_written = rnd_u64();
        p->queue_us = rnd_u64();
        p->compute_us = rnd_u64();
        p->transfer_us = rnd_u64();
        break;
    }
    case PROTO_MSG_TOKEN_CHUNK: {
        proto_token_chunk_t *c = &m->u.token_chunk;
        rnd_wid(c->worker_id);
        c->step_id = rnd();
        c->n_entries = 1 + rnd_below(lim.max_entries);
        c->entries = alloc(c->n_entries * sizeof(*c->entries));
        for (uint32_t i = 0; i < c->n_entries; i++) {
            proto_token_entry_t *e = &c->entries[i];
            rnd_bytes(e->request_id.bytes, PROTO_ID_BYTES);
            e->n_token_ids = rnd_count(0, 4);
            e->token_ids = rnd_tokens(e->n_token_ids);
            bool lp = force_full || (rnd() & 1);
            e->n_logprobs = lp ? e->n_token_ids : 0;
            e->logprobs = alloc(e->n_logprobs * sizeof(float));
            for (uint32_t j = 0; j < e->n_logprobs; j++) e->logprobs[j] = rnd_float(-20, 0);
            e->top_k = lp ? rnd_count(0, 3) : 0;
            e->n_top_logprobs = e->n_token_ids * e->top_k;
            e->top_logprobs = rnd_top(e->n_top_logprobs);
            e->finish_reason = (proto_finish_reason_t)rnd_below(5);
        }
        break;
    }
    case PROTO_MSG_REQUEST_FINISHED: {
        proto_request_finished_t *r = &m->u.request_finished;
        rnd_bytes(r->request_id.bytes, PROTO_ID_BYTES);
        rnd_wid(r->worker_id);
        r->finish_reason = (proto_finish_reason_t)(1 + rnd_below(4));
        r->status = -(int32_t)rnd_below(15);
        r->error = rnd_str();
        r->prompt_tokens = (uint32_t)rnd();
        r->completion_tokens = (uint32_t)rnd();
        r->cached_tokens = rnd_below(r->prompt_tokens + 1);
        r->timings.queue_us = rnd_u64();
        r->timings.prefill_us = rnd_u64();
        r->timings.transfer_us = rnd_u64();
        r->timings.transfer_bytes = rnd_u64();
        r->timings.decode_us = rnd_u64();
        break;
    }
    case PROTO_MSG_ABORT:
        rnd_bytes(m->u.abort.request_id.bytes, PROTO_ID_BYTES);
        m->u.abort.reason = rnd_str();
        break;
    case PROTO_MSG_KV_EVENT: {
        proto_kv_event_t *e = &m->u.kv_event;
        rnd_wid(e->worker_id);
        e->epoch = 1 + rnd_u64() / 2;
        e->seq = rnd();
        e->full = rnd() & 1;
        e->full_part = (uint32_t)rnd();
        e->full_last = rnd() & 1;
        e->n_stored = rnd_count(0, lim.max_blocks);
        e->stored = alloc(e->n_stored * sizeof(*e->stored));
        for (uint32_t i = 0; i < e->n_stored; i++) {
            rnd_bytes(e->stored[i].hash.bytes, PROTO_ID_BYTES);
            rnd_bytes(e->stored[i].parent_hash.bytes, PROTO_ID_BYTES);
            e->stored[i].n_tokens = 1 + rnd_below(4096);
        }
        e->n_removed = rnd_count(0, lim.max_blocks);
        e->removed = alloc(e->n_removed * sizeof(*e->removed));
        for (uint32_t i = 0; i < e->n_removed; i++) rnd_bytes(e->removed[i].bytes, PROTO_ID_BYTES);
        break;
    }
    case PROTO_MSG_KV_RESYNC:
        rnd_wid(m->u.kv_resync.worker_id);
        m->u.kv_resync.epoch = rnd();
        m->u.kv_resync.last_seq = rnd();
        break;
    default: abort();
    }
}

/* ---- field-by-field comparison ------------------------------------------ */

#define EQ(f) if (a->f != b->f) { fprintf(stderr, "  field %s differs\n", #f); return false; }
#define EQS(f) if (strcmp(a->f, b->f)) { fprintf(stderr, "  field %s differs\n", #f); return false; }
#define EQM(f, n) if ((n) != 0 && memcmp(a->f, b->f, (n))) { fprintf(stderr, "  field %s differs\n", #f); return false; }
#define EQA(f, n) EQ(n) EQM(f, (size_t)a->n * sizeof(*a->f))

static bool eq_pool(const proto_pool_desc_t *a, const proto_pool_desc_t *b) {
    EQ(n_regions) EQ(n_blocks) EQ(block_bytes)
    for (uint32_t i = 0; i < a->n_regions; i++) {
        const proto_pool_region_t *x = &a->regions[i], *y = &b->regions[i];
        if (x->base_addr != y->base_addr || x->length_bytes != y->length_bytes ||
            x->rkey_len != y->rkey_len || memcmp(x->rkey, y->rkey, x->rkey_len))
            return false;
    }
    return true;
}
static bool eq_sampling(const proto_sampling_t *a, const proto_sampling_t *b) {
    EQ(temperature) EQ(top_p) EQ(top_k) EQ(min_p) EQ(repetition_penalty) EQ(presence_penalty)
    EQ(frequency_penalty) EQ(seed) EQ(max_tokens) EQA(stop_token_ids, n_stop_token_ids)
    EQ(logprobs) EQ(top_logprobs) EQ(ignore_eos) EQ(n_logit_bias)
    for (uint32_t i = 0; i < a->n_logit_bias; i++)
        if (a->logit_bias[i].token != b->logit_bias[i].token ||
            a->logit_bias[i].bias != b->logit_bias[i].bias) {
            fprintf(stderr, "  field logit_bias[%u] differs\n", i);
            return false;
        }
    return true;
}
static bool eq_top(const proto_token_logprob_t *a, const proto_token_logprob_t *b, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (a[i].token != b[i].token || a[i].logprob != b[i].logprob) return false;
    return true;
}

static bool eq_msg(const proto_msg_t *x, const proto_msg_t *y) {
    if (x->type != y->type) return false;
    switch (x->type) {
    case PROTO_MSG_WORKER_REGISTER: {
        const proto_worker_register_t *a = &x->u.worker_register, *b = &y->u.worker_register;
        EQS(worker_id) EQ(role) EQ(epoch) EQS(zmq_endpoint) EQM(model_sha256, 32) EQ(vocab_size)
        EQ(kv.n_layers) EQ(kv.n_kv_heads) EQ(kv.head_dim) EQ(kv.block_size) EQ(kv.dtype)
        EQ(kv.hash_seed_id) EQA(ucx_address, ucx_address_len)
        return eq_pool(&a->pool, &b->pool);
    }
    case PROTO_MSG_WORKER_HEARTBEAT: {
        const proto_worker_heartbeat_t *a = &x->u.worker_heartbeat, *b = &y->u.worker_heartbeat;
        EQS(worker_id) EQ(role) EQ(epoch) EQ(timestamp_unix_us) EQ(queued_prefill_tokens)
        EQ(n_running) EQ(n_waiting) EQ(free_blocks) EQ(total_blocks) EQ(batch_occupancy)
        return true;
    }
    case PROTO_MSG_PREFILL_REQUEST: {
        const proto_prefill_request_t *a = &x->u.prefill_request, *b = &y->u.prefill_request;
        EQM(request_id.bytes, 16) EQS(decode_worker_id) EQ(decode_epoch)
        EQA(token_ids, n_token_ids) EQS(tenant) EQ(cache_salt) EQ(deadline_unix_us)
        return eq_sampling(&a->sampling, &b->sampling);
    }
    case PROTO_MSG_DECODE_REQUEST: {
        const proto_decode_request_t *a = &x->u.decode_request, *b = &y->u.decode_request;
        EQM(request_id.bytes, 16) EQS(prefill_worker_id) EQ(n_prompt_tokens) EQ(n_blocks)
        EQA(token_ids, n_token_ids) EQS(tenant) EQ(cache_salt) EQ(deadline_unix_us)
        return eq_sampling(&a->sampling, &b->sampling);
    }
    case PROTO_MSG_KV_DESTINATION: {
        const proto_kv_destination_t *a = &x->u.kv_destination, *b = &y->u.kv_destination;
        EQM(request_id.bytes, 16) EQS(decode_worker_id) EQ(decode_epoch)
        EQA(block_ids, n_block_ids) EQ(n_skip_blocks)
        return eq_pool(&a->pool, &b->pool);
    }
    case PROTO_MSG_PREFILL_DONE: {
        const proto_prefill_done_t *a = &x->u.prefill_done, *b = &y->u.prefill_done;
        EQM(request_id.bytes, 16) EQS(prefill_worker_id) EQ(status) EQS(error) EQ(first_token)
        EQ(first_logprob) EQ(n_top_logprobs) EQ(n_blocks_written) EQ(bytes_written)
        EQ(queue_us) EQ(compute_us) EQ(transfer_us)
        return eq_top(a->top_logprobs, b->top_logprobs, a->n_top_logprobs);
    }
    case PROTO_MSG_TOKEN_CHUNK: {
        const proto_token_chunk_t *c = &x->u.token_chunk, *d = &y->u.token_chunk;
        if (strcmp(c->worker_id, d->worker_id) || c->step_id != d->step_id ||
            c->n_entries != d->n_entries)
            return false;
        for (uint32_t i = 0; i < c->n_entries; i++) {
            const proto_token_entry_t *a = &c->entries[i], *b = &d->entries[i];
            EQM(request_id.bytes, 16) EQA(token_ids, n_token_ids) EQA(logprobs, n_logprobs)
            EQ(top_k) EQ(n_top_logprobs) EQ(finish_reason)
            if (!eq_top(a->top_logprobs, b->top_logprobs, a->n_top_logprobs)) return false;
        }
        return true;
    }
    case PROTO_MSG_REQUEST_FINISHED: {
        const proto_request_finished_t *a = &x->u.request_finished, *b = &y->u.request_finished;
        EQM(request_id.bytes, 16) EQS(worker_id) EQ(finish_reason) EQ(status) EQS(error)
        EQ(prompt_tokens) EQ(completion_tokens) EQ(cached_tokens) EQ(timings.queue_us)
        EQ(timings.prefill_us) EQ(timings.transfer_us) EQ(timings.transfer_bytes)
        EQ(timings.decode_us)
        return true;
    }
    case PROTO_MSG_ABORT: {
        const proto_abort_t *a = &x->u.abort, *b = &y->u.abort;
        EQM(request_id.bytes, 16) EQS(reason)
        return true;
    }
    case PROTO_MSG_KV_EVENT: {
        const proto_kv_event_t *a = &x->u.kv_event, *b = &y->u.kv_event;
        EQS(worker_id) EQ(epoch) EQ(seq) EQ(full) EQ(full_part) EQ(full_last)
        EQA(stored, n_stored) EQA(removed, n_removed)
        return true;
    }
    case PROTO_MSG_KV_RESYNC: {
        const proto_kv_resync_t *a = &x->u.kv_resync, *b = &y->u.kv_resync;
        EQS(worker_id) EQ(epoch) EQ(last_seq)
        return true;
    }
    default: return false;
    }
}

/* ---- round trip --------------------------------------------------------- */

static void test_round_trip(void) {
    int n_ok = 0;
    for (int iter = 0; iter < 300; iter++) {
        for (int t = 0; t < PROTO_MSG_COUNT; t++) {
            force_full = iter % 3 == 0;
            proto_msg_t in, out;
            fill_msg((proto_msg_type_t)t, &in);
            msgpack_sbuffer sb;
            msgpack_sbuffer_init(&sb);
            CHECK_OK(proto_encode(&in, &sb));
            baton_status_t st = proto_decode(sb.data, sb.size, &lim, &out);
            CHECK_MSG(st == BATON_OK, "%s iter %d: %s", proto_msg_type_name(t), iter,
                      baton_last_error());
            if (st == BATON_OK) {
                bool eq = eq_msg(&in, &out);
                CHECK_MSG(eq, "%s iter %d: decoded differs", proto_msg_type_name(t), iter);
                n_ok += eq;
                proto_msg_free(&out);
                CHECK_EQ_INT(out.type, 0); /* zeroed */
            }
            msgpack_sbuffer_destroy(&sb);
            arena_reset();
        }
    }
    CHECK_EQ_INT(n_ok, 300 * PROTO_MSG_COUNT);
    fprintf(stderr, "round trip: %d messages\n", n_ok);
}

/* The typed encoders produce the same bytes as proto_encode. */
static void test_typed_encoders(void) {
    proto_msg_t m;
    fill_msg(PROTO_MSG_PREFILL_REQUEST, &m);
    msgpack_sbuffer a, b;
    msgpack_sbuffer_init(&a);
    msgpack_sbuffer_init(&b);
    CHECK_OK(proto_encode(&m, &a));
    CHECK_OK(proto_encode_prefill_request(&m.u.prefill_request, &b));
    CHECK(a.size == b.size && memcmp(a.data, b.data, a.size) == 0);
    msgpack_sbuffer_destroy(&a);
    msgpack_sbuffer_destroy(&b);
    fill_msg(PROTO_MSG_KV_EVENT, &m);
    msgpack_sbuffer_init(&a);
    CHECK_OK(proto_encode_kv_event(&m.u.kv_event, &a));
    proto_msg_t out;
    CHECK_OK(proto_decode(a.data, a.size, &lim, &out));
    CHECK(eq_msg(&m, &out));
    proto_msg_free(&out);
    msgpack_sbuffer_destroy(&a);
    /* Encoder input errors. */
    m.u.kv_event.stored = NULL;
    m.u.kv_event.n_stored = 3;
    msgpack_sbuffer_init(&a);
    CHECK_EQ_INT(proto_encode(&m, &a), BATON_ERR_INVALID_ARG);
    m.type = PROTO_MSG_COUNT;
    CHECK_EQ_INT(proto_encode(&m, &a), BATON_ERR_INVALID_ARG);
    msgpack_sbuffer_destroy(&a);
    arena_reset();
}

/* ---- mutation on the msgpack object tree -------------------------------- */

typedef enum { MUT_REMOVE, MUT_REPLACE, MUT_ADD_UNKNOWN } mut_kind_t;

typedef struct mutation {
    const char *path[4]; /* keys; "0" = first array element */
    int depth;
    mut_kind_t kind;
    msgpack_sbuffer *value; /* packed replacement (MUT_REPLACE) */
} mutation_t;

static void pack_mutated(msgpack_packer *pk, msgpack_sbuffer *out, const msgpack_object *o,
                         const mutation_t *m, int level) {
    bool on_path = level < m->depth;
    if (on_path && o->type == MSGPACK_OBJECT_MAP) {
        const char *key = m->path[level];
        bool last = level == m->depth - 1;
        uint32_t n = o->via.map.size;
        uint32_t n_out = n;
        bool present = false;
        for (uint32_t i = 0; i < n; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(key) &&
                !memcmp(k->via.str.ptr, key, k->via.str.size))
                present = true;
        }
        if (last && m->kind == MUT_REMOVE && present) n_out--;
        if (last && m->kind == MUT_ADD_UNKNOWN) n_out++;
        msgpack_pack_map(pk, n_out);
        for (uint32_t i = 0; i < n; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
            bool hit = k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(key) &&
                       !memcmp(k->via.str.ptr, key, k->via.str.size);
            if (hit && last && m->kind == MUT_REMOVE) continue;
            msgpack_pack_object(pk, *k);
            if (hit && last && m->kind == MUT_REPLACE)
                msgpack_sbuffer_write(out, m->value->data, m->value->size);
            else if (hit && !last)
                pack_mutated(pk, out, v, m, level + 1);
            else
                msgpack_pack_object(pk, *v);
        }
        if (last && m->kind == MUT_ADD_UNKNOWN) {
            msgpack_pack_str_with_body(pk, "x_future_key", 12);
            msgpack_pack_map(pk, 1);
            msgpack_pack_str_with_body(pk, "nested", 6);
            msgpack_pack_array(pk, 2);
            msgpack_pack_double(pk, 1.5);
            msgpack_pack_bin_with_body(pk, "ab", 2);
        }
        return;
    }
    if (on_path && o->type == MSGPACK_OBJECT_ARRAY && !strcmp(m->path[level], "0")) {
        msgpack_pack_array(pk, o->via.array.size);
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            if (i == 0) pack_mutated(pk, out, &o->via.array.ptr[0], m, level + 1);
            else msgpack_pack_object(pk, o->via.array.ptr[i]);
        }
        return;
    }
    msgpack_pack_object(pk, *o);
}

/* Writes `base` mutated by `m` into `out` (initialised by the caller). */
static void mutate(const msgpack_sbuffer *base, const mutation_t *m, msgpack_sbuffer *out) {
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    if (msgpack_unpack_next(&up, base->data, base->size, &off) != MSGPACK_UNPACK_SUCCESS) abort();
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, msgpack_sbuffer_write);
    pack_mutated(&pk, out, &up.data, m, 0);
    msgpack_unpacked_destroy(&up);
}

/* Decodes `base` mutated by `m`; returns the status. On success the message
 * goes to *keep, or is freed when keep is NULL. */
static baton_status_t decode_mutated(const msgpack_sbuffer *base, const mutation_t *m,
                                     const proto_limits_t *limits, proto_msg_t *keep) {
    msgpack_sbuffer out;
    msgpack_sbuffer_init(&out);
    mutate(base, m, &out);
    proto_msg_t msg;
    baton_status_t st = proto_decode(out.data, out.size, limits, &msg);
    if (st == BATON_OK) {
        if (keep) *keep = msg;
        else proto_msg_free(&msg);
    }
    msgpack_sbuffer_destroy(&out);
    return st;
}

/* Replacement value builders. */
static msgpack_sbuffer vbuf;
static msgpack_packer vpk;
static msgpack_sbuffer *v_begin(void) {
    msgpack_sbuffer_clear(&vbuf);
    msgpack_packer_init(&vpk, &vbuf, msgpack_sbuffer_write);
    return &vbuf;
}
static msgpack_sbuffer *v_uint(uint64_t x) { v_begin(); msgpack_pack_uint64(&vpk, x); return &vbuf; }
static msgpack_sbuffer *v_int(int64_t x) { v_begin(); msgpack_pack_int64(&vpk, x); return &vbuf; }
static msgpack_sbuffer *v_dbl(double x) { v_begin(); msgpack_pack_double(&vpk, x); return &vbuf; }
static msgpack_sbuffer *v_bool(bool x) {
    v_begin();
    x ? msgpack_pack_true(&vpk) : msgpack_pack_false(&vpk);
    return &vbuf;
}
static msgpack_sbuffer *v_str_n(const char *s, size_t n) {
    v_begin();
    msgpack_pack_str_with_body(&vpk, s, n);
    return &vbuf;
}
static msgpack_sbuffer *v_str(const char *s) { return v_str_n(s, strlen(s)); }
static msgpack_sbuffer *v_strlen(size_t n, char c) {
    static char tmp[8192];
    memset(tmp, c, n);
    return v_str_n(tmp, n);
}
static msgpack_sbuffer *v_bin(size_t n) {
    static char tmp[8192];
    memset(tmp, 7, n);
    v_begin();
    msgpack_pack_bin_with_body(&vpk, tmp, n);
    return &vbuf;
}
static msgpack_sbuffer *v_uints(uint32_t n, uint64_t value) {
    v_begin();
    msgpack_pack_array(&vpk, n);
    for (uint32_t i = 0; i < n; i++) msgpack_pack_uint64(&vpk, value);
    return &vbuf;
}
static msgpack_sbuffer *v_bins(uint32_t n, size_t len) {
    static char tmp[64];
    v_begin();
    msgpack_pack_array(&vpk, n);
    for (uint32_t i = 0; i < n; i++) msgpack_pack_bin_with_body(&vpk, tmp, len);
    return &vbuf;
}

/* Keys that may be absent (proto/messages.h), by parent key. */
static bool optional_key(proto_msg_type_t type, const char *parent, const char *key) {
    if (!strcmp(key, "error") || !strcmp(key, "p")) return true;
    if (!strcmp(parent, "sampling")) return !strcmp(key, "logit_bias"); /* OpenAI logit_bias */
    /* optional additions of cluster.md (prefill/decode/router wiring) */
    static const char *const added[] = {"kv_events_endpoint", "used_blocks", "cache_hit_blocks",
                                        "cache_lookup_blocks", "preemptions", "busy_us", "steps",
                                        "decode_endpoint", "prefill_endpoint",
                                        /* issue 6: device-seconds, idle gaps, serving config */
                                        "device_us", "prefill_device_us", "decode_device_us",
                                        "idle_gaps", "idle_gap_us", "idle_gap_max_us",
                                        "max_batch_tokens", "max_batch", "cpu_model", "backend",
                                        "compute_dtype"};
    if (type == PROTO_MSG_PREFILL_DONE && !strcmp(key, "cached_tokens")) return true;
    if (type == PROTO_MSG_KV_DESTINATION && !strcmp(key, "ucx_address")) return true;
    for (size_t i = 0; i < sizeof(added) / sizeof(added[0]); i++)
        if (!strcmp(key, added[i])) return true;
    return !strcmp(key, "top_logprobs") || !strcmp(key, "logprobs") || !strcmp(key, "top_k");
}

/* Walks every key path of the encoded message and checks removal and a
 * wrong-typed value. Returns the number of paths visited. */
static int walk_paths(const msgpack_sbuffer *base, const proto_msg_t *in, const msgpack_object *o,
                      mutation_t *m, int level) {
    proto_msg_type_t type = in->type;
    int n = 0;
    if (o->type != MSGPACK_OBJECT_MAP || level >= 4) return 0;
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
        char key[64];
        snprintf(key, sizeof(key), "%.*s", (int)k->via.str.size, k->via.str.ptr);
        if (level == 0 && (!strcmp(key, "type") || !strcmp(key, "v"))) continue;
        m->path[level] = strdup(key);
        m->depth = level + 1;
        const char *parent = level ? m->path[level - 1] : "";
        if (level >= 2 && !strcmp(parent, "0")) parent = m->path[level - 2];
        n++;

        m->kind = MUT_REMOVE;
        baton_status_t st = decode_mutated(base, m, &lim, NULL);
        baton_status_t want = BATON_ERR_FORMAT;
        if (optional_key(type, parent, key)) {
            /* An entry's top_k only matters when it has top logprobs. */
            want = BATON_OK;
            if (!strcmp(key, "top_k")) want = BATON_ERR_OUT_OF_RANGE;
        }
        CHECK_MSG(st == want, "%s: removing %s/%s gave %d (%s), want %d",
                  proto_msg_type_name(type), parent, key, st, baton_last_error(), want);

        m->kind = MUT_REPLACE;
        m->value = v->type == MSGPACK_OBJECT_BOOLEAN ? v_uint(1) : v_bool(true);
        st = decode_mutated(base, m, &lim, NULL);
        CHECK_MSG(st == BATON_ERR_FORMAT, "%s: mistyped %s/%s gave %d (%s)",
                  proto_msg_type_name(type), parent, key, st, baton_last_error());

        if (v->type == MSGPACK_OBJECT_MAP) {
            n += walk_paths(base, in, v, m, level + 1);
            m->depth = level + 1;
        } else if (v->type == MSGPACK_OBJECT_ARRAY && v->via.array.size > 0 &&
                   v->via.array.ptr[0].type == MSGPACK_OBJECT_MAP && level + 1 < 4) {
            m->path[level + 1] = "0";
            n += walk_paths(base, in, &v->via.array.ptr[0], m, level + 2);
            m->depth = level + 1;
        }
        /* An unknown key added to the map holding this key is ignored. */
        if (i == 0) {
            m->depth = level + 1;
            m->kind = MUT_ADD_UNKNOWN;
            proto_msg_t out;
            st = decode_mutated(base, m, &lim, &out);
            CHECK_MSG(st == BATON_OK, "%s: unknown key next to %s/%s gave %d (%s)",
                      proto_msg_type_name(type), parent, key, st, baton_last_error());
            if (st == BATON_OK) {
                CHECK_MSG(eq_msg(in, &out), "%s: unknown key next to %s changed the message",
                          proto_msg_type_name(type), key);
                proto_msg_free(&out);
            }
        }
        free((void *)m->path[level]);
        m->path[level] = NULL;
    }
    return n;
}

static void test_every_field(void) {
    int n_paths = 0;
    for (int t = 0; t < PROTO_MSG_COUNT; t++) {
        force_full = true;
        proto_msg_t in;
        fill_msg((proto_msg_type_t)t, &in);
        msgpack_sbuffer base;
        msgpack_sbuffer_init(&base);
        CHECK_OK(proto_encode(&in, &base));
        msgpack_unpacked up;
        msgpack_unpacked_init(&up);
        size_t off = 0;
        CHECK(msgpack_unpack_next(&up, base.data, base.size, &off) == MSGPACK_UNPACK_SUCCESS);
        mutation_t m = {{0}, 0, MUT_REMOVE, NULL};
        n_paths += walk_paths(&base, &in, &up.data, &m, 0);

        /* Unknown keys at the top and in a nested map are ignored. */
        mutation_t add = {{"type"}, 1, MUT_ADD_UNKNOWN, NULL};
        proto_msg_t out;
        CHECK_OK(decode_mutated(&base, &add, &lim, &out));
        CHECK(eq_msg(&in, &out));
        proto_msg_free(&out);

        /* Versions: newer major refused, 0 and negative out of range. */
        mutation_t ver = {{"v"}, 1, MUT_REPLACE, v_uint(PROTO_VERSION + 1)};
        CHECK_EQ_INT(decode_mutated(&base, &ver, &lim, NULL), BATON_ERR_VERSION);
        ver.value = v_uint(0);
        CHECK_EQ_INT(decode_mutated(&base, &ver, &lim, NULL), BATON_ERR_OUT_OF_RANGE);
        ver.value = v_int(-1);
        CHECK_EQ_INT(decode_mutated(&base, &ver, &lim, NULL), BATON_ERR_OUT_OF_RANGE);
        ver.value = v_str("1");
        CHECK_EQ_INT(decode_mutated(&base, &ver, &lim, NULL), BATON_ERR_FORMAT);
        ver.kind = MUT_REMOVE;
        CHECK_EQ_INT(decode_mutated(&base, &ver, &lim, NULL), BATON_ERR_FORMAT);
        mutation_t ty = {{"type"}, 1, MUT_REPLACE, v_str("future_message")};
        CHECK_EQ_INT(decode_mutated(&base, &ty, &lim, NULL), BATON_ERR_UNSUPPORTED);
        ty.value = v_uint(3);
        CHECK_EQ_INT(decode_mutated(&base, &ty, &lim, NULL), BATON_ERR_FORMAT);
        ty.kind = MUT_REMOVE;
        CHECK_EQ_INT(decode_mutated(&base, &ty, &lim, NULL), BATON_ERR_FORMAT);

        /* Truncation at every length, and one trailing byte. */
        int n_trunc_bad = 0;
        for (size_t len = 0; len < base.size; len++) {
            proto_msg_t tmp;
            if (proto_decode(base.data, len, &lim, &tmp) != BATON_ERR_FORMAT) n_trunc_bad++;
        }
        CHECK_MSG(n_trunc_bad == 0, "%s: %d truncations not refused as format errors",
                  proto_msg_type_name(t), n_trunc_bad);
        msgpack_sbuffer_write(&base, "\xc0", 1);
        CHECK_EQ_INT(proto_decode(base.data, base.size, &lim, &out), BATON_ERR_FORMAT);
        base.size--;

        /* Whole message above max_msg_bytes. */
        proto_limits_t small = lim;
        small.max_msg_bytes = (uint32_t)base.size - 1;
        CHECK_EQ_INT(proto_decode(base.data, base.size, &small, &out), BATON_ERR_OUT_OF_RANGE);
        small.max_msg_bytes = (uint32_t)base.size;
        CHECK_OK(proto_decode(base.data, base.size, &small, &out));
        proto_msg_free(&out);

        msgpack_unpacked_destroy(&up);
        msgpack_sbuffer_destroy(&base);
        arena_reset();
    }
    fprintf(stderr, "every field: %d key paths removed and mistyped\n", n_paths);
    CHECK(n_paths > 100);
}

/* Value checks, one mutation each, expected status from the header's ranges. */
typedef struct range_case {
    proto_msg_type_t type;
    const char *path[4];
    msgpack_sbuffer *(*make)(void);
    baton_status_t want;
} range_case_t;

#define MK(name, expr) static msgpack_sbuffer *name(void) { return expr; }
MK(mk_zero, v_uint(0))
MK(mk_neg1, v_int(-1))
MK(mk_u32max1, v_uint((uint64_t)UINT32_MAX + 1))
MK(mk_1025, v_uint(1025))
MK(mk_4097, v_uint(4097))
MK(mk_vocab, v_uint(1000))        /* == lim.vocab_size */
MK(mk_vocab1, v_uint(1001))
MK(mk_tokens_vocab, v_uints(3, 1000))
MK(mk_tokens_empty, v_uints(0, 1))
MK(mk_tokens_long, v_uints(65, 1))  /* lim.max_tokens + 1 */
MK(mk_stop_long, v_uints(PROTO_MAX_STOP_TOKENS + 1, 1))
MK(mk_blocks_long, v_uints(33, 1))  /* lim.max_blocks + 1 */
MK(mk_block_2_31, v_uints(2, (uint64_t)INT32_MAX + 1))
MK(mk_str_long, v_strlen(33, 'a'))  /* lim.max_str_bytes + 1 */
MK(mk_str_nul, v_str_n("a\0b", 3))
MK(mk_wid_long, v_strlen(PROTO_WORKER_ID_MAX + 1, 'w'))
MK(mk_wid_empty, v_str(""))
MK(mk_wid_space, v_str("worker 1"))
MK(mk_bin15, v_bin(15))
MK(mk_bin31, v_bin(31))
MK(mk_bin_long, v_bin(65))          /* lim.max_bin_bytes + 1 */
MK(mk_bin0, v_bin(0))
MK(mk_role_bad, v_str("chef"))
MK(mk_dtype_bad, v_str("f64"))
MK(mk_finish_bad, v_str("maybe"))
MK(mk_finish_none, v_str("none"))
MK(mk_temp_neg, v_dbl(-0.01))
MK(mk_temp_big, v_dbl(100.5))
MK(mk_nan, v_dbl(NAN))
MK(mk_inf, v_dbl(INFINITY))
MK(mk_huge, v_dbl(1e300))
MK(mk_1_5, v_dbl(1.5))
MK(mk_2_5, v_dbl(2.5))
MK(mk_m2_5, v_dbl(-2.5))
MK(mk_pos_lp, v_dbl(0.25))
MK(mk_21, v_uint(PROTO_MAX_TOP_LOGPROBS + 1))
MK(mk_status1, v_uint(1))
MK(mk_status_low, v_int(-1001))
MK(mk_big, v_uint(UINT32_MAX))
MK(mk_hash_short, v_bins(2, 8))
MK(mk_hashes_long, v_bins(33, 16))
MK(mk_float_int, v_uint(1))         /* ints are valid floats */
MK(mk_lp_long, v_uints(1000, 0))
static msgpack_sbuffer *mk_tokens_str(void) {
    v_begin();
    msgpack_pack_array(&vpk, 2);
    msgpack_pack_uint32(&vpk, 1);
    msgpack_pack_str_with_body(&vpk, "2", 1);
    return &vbuf;
}
/* logit_bias arrays: n entries {"t": token, "b": bias}, or one with "t" a string */
static msgpack_sbuffer *v_bias(uint32_t n, uint64_t token, double bias) {
    v_begin();
    msgpack_pack_array(&vpk, n);
    for (uint32_t i = 0; i < n; i++) {
        msgpack_pack_map(&vpk, 2);
        msgpack_pack_str_with_body(&vpk, "t", 1);
        msgpack_pack_uint64(&vpk, token);
        msgpack_pack_str_with_body(&vpk, "b", 1);
        msgpack_pack_double(&vpk, bias);
    }
    return &vbuf;
}
MK(mk_bias_max, v_bias(PROTO_MAX_LOGIT_BIAS, 7, -100.0))
MK(mk_bias_long, v_bias(PROTO_MAX_LOGIT_BIAS + 1, 7, 1.0))
MK(mk_bias_vocab, v_bias(1, 1000, 1.0))
MK(mk_bias_vocab1, v_bias(1, 999, 100.0))
MK(mk_bias_big, v_bias(1, 5, 100.5))
MK(mk_bias_small, v_bias(1, 5, -100.5))
MK(mk_bias_nan, v_bias(1, 5, NAN))
MK(mk_bias_empty, v_bias(0, 0, 0))
MK(mk_100_5, v_dbl(100.5))
static msgpack_sbuffer *mk_bias_tstr(void) {
    v_begin();
    msgpack_pack_array(&vpk, 1);
    msgpack_pack_map(&vpk, 2);
    msgpack_pack_str_with_body(&vpk, "t", 1);
    msgpack_pack_str_with_body(&vpk, "5", 1);
    msgpack_pack_str_with_body(&vpk, "b", 1);
    msgpack_pack_double(&vpk, 1.0);
    return &vbuf;
}
static msgpack_sbuffer *mk_bias_notmap(void) { return v_uints(2, 5); }
static msgpack_sbuffer *mk_lp_str(void) {
    v_begin();
    msgpack_pack_array(&vpk, 1);
    msgpack_pack_str_with_body(&vpk, "-1", 2);
    return &vbuf;
}

static const range_case_t range_cases[] = {
    {PROTO_MSG_WORKER_REGISTER, {"epoch"}, mk_zero, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_REGISTER, {"epoch"}, mk_neg1, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_REGISTER, {"worker_id"}, mk_wid_long, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_REGISTER, {"worker_id"}, mk_wid_empty, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_REGISTER, {"worker_id"}, mk_wid_space, BATON_ERR_FORMAT},
    {PROTO_MSG_WORKER_REGISTER, {"role"}, mk_role_bad, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_REGISTER, {"model_sha256"}, mk_bin31, BATON_ERR_FORMAT},
    {PROTO_MSG_WORKER_REGISTER, {"zmq_endpoint"}, mk_str_long, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_REGISTER, {"zmq_endpoint"}, mk_str_nul, BATON_ERR_FORMAT},
    {PROTO_MSG_WORKER_REGISTER, {"vocab_size"}, mk_zero, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_REGISTER, {"vocab_size"}, mk_u32max1, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_REGISTER, {"kv", "n_layers"}, mk_zero, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_REGISTER, {"kv", "n_kv_heads"}, mk_1025, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_REGISTER, {"kv", "head_dim"}, mk_4097, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_REGISTER, {"kv", "block_size"}, mk_4097, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_REGISTER, {"kv", "dtype"}, mk_dtype_bad, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_REGISTER, {"ucx_address"}, mk_bin_long, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_REGISTER, {"ucx_address"}, mk_bin0, BATON_OK},
    {PROTO_MSG_WORKER_REGISTER, {"pool", "regions", "0", "len"}, mk_zero, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_REGISTER, {"pool", "regions", "0", "rkey"}, mk_bin0, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_REGISTER, {"pool", "regions", "0", "rkey"}, mk_bin_long, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_REGISTER, {"pool", "n_blocks"}, mk_u32max1, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_HEARTBEAT, {"free_blocks"}, mk_big, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_HEARTBEAT, {"batch_occupancy"}, mk_1_5, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_HEARTBEAT, {"batch_occupancy"}, mk_nan, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_HEARTBEAT, {"batch_occupancy"}, mk_float_int, BATON_OK},
    {PROTO_MSG_WORKER_HEARTBEAT, {"n_running"}, mk_u32max1, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_WORKER_HEARTBEAT, {"ts_us"}, mk_neg1, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"request_id"}, mk_bin15, BATON_ERR_FORMAT},
    {PROTO_MSG_PREFILL_REQUEST, {"token_ids"}, mk_tokens_vocab, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"token_ids"}, mk_tokens_empty, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"token_ids"}, mk_tokens_long, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"token_ids"}, mk_tokens_str, BATON_ERR_FORMAT},
    {PROTO_MSG_KV_DESTINATION, {"block_ids"}, mk_tokens_str, BATON_ERR_FORMAT},
    {PROTO_MSG_PREFILL_REQUEST, {"decode_worker_id"}, mk_wid_space, BATON_ERR_FORMAT},
    {PROTO_MSG_PREFILL_REQUEST, {"tenant"}, mk_str_long, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "temperature"}, mk_temp_neg, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "temperature"}, mk_temp_big, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "temperature"}, mk_inf, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "temperature"}, mk_huge, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "top_p"}, mk_zero, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "top_p"}, mk_1_5, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "top_k"}, mk_vocab1, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "top_k"}, mk_vocab, BATON_OK},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "min_p"}, mk_1_5, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "repetition_penalty"}, mk_zero, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "presence_penalty"}, mk_2_5, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "frequency_penalty"}, mk_m2_5, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "max_tokens"}, mk_zero, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "max_tokens"}, mk_1025, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "stop_token_ids"}, mk_stop_long, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "stop_token_ids"}, mk_tokens_vocab, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "top_logprobs"}, mk_21, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "seed"}, mk_neg1, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "logit_bias"}, mk_bias_max, BATON_OK},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "logit_bias"}, mk_bias_empty, BATON_OK},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "logit_bias"}, mk_bias_long, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "logit_bias"}, mk_bias_vocab, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "logit_bias"}, mk_bias_vocab1, BATON_OK},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "logit_bias"}, mk_bias_big, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "logit_bias"}, mk_bias_small, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "logit_bias"}, mk_bias_nan, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "logit_bias"}, mk_bias_tstr, BATON_ERR_FORMAT},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "logit_bias"}, mk_bias_notmap, BATON_ERR_FORMAT},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "logit_bias"}, mk_lp_str, BATON_ERR_FORMAT},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "logit_bias", "0", "t"}, mk_vocab, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "logit_bias", "0", "t"}, mk_neg1, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "logit_bias", "0", "b"}, mk_100_5, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "logit_bias", "0", "b"}, mk_float_int, BATON_OK},
    {PROTO_MSG_PREFILL_REQUEST, {"sampling", "logit_bias", "0", "b"}, mk_lp_str, BATON_ERR_FORMAT},
    {PROTO_MSG_DECODE_REQUEST, {"sampling", "logit_bias", "0", "t"}, mk_vocab, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_DECODE_REQUEST, {"sampling", "logit_bias"}, mk_bias_long, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_DECODE_REQUEST, {"n_prompt_tokens"}, mk_zero, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_DECODE_REQUEST, {"n_prompt_tokens"}, mk_1025, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_DECODE_REQUEST, {"n_blocks"}, mk_zero, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_DECODE_REQUEST, {"n_blocks"}, mk_1025, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_DECODE_REQUEST, {"token_ids"}, mk_tokens_vocab, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_DECODE_REQUEST, {"token_ids"}, mk_tokens_empty, BATON_OK},
    {PROTO_MSG_DECODE_REQUEST, {"sampling", "top_p"}, mk_neg1, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_KV_DESTINATION, {"block_ids"}, mk_block_2_31, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_KV_DESTINATION, {"block_ids"}, mk_blocks_long, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_KV_DESTINATION, {"block_ids"}, mk_tokens_empty, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_KV_DESTINATION, {"n_skip_blocks"}, mk_big, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_KV_DESTINATION, {"decode_epoch"}, mk_zero, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_DONE, {"status"}, mk_status1, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_DONE, {"status"}, mk_status_low, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_DONE, {"first_token"}, mk_vocab, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_DONE, {"first_logprob"}, mk_pos_lp, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_DONE, {"first_logprob"}, mk_nan, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_DONE, {"top_logprobs", "0", "t"}, mk_vocab, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_DONE, {"top_logprobs", "0", "lp"}, mk_pos_lp, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_PREFILL_DONE, {"error"}, mk_str_long, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_TOKEN_CHUNK, {"entries"}, mk_tokens_empty, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_TOKEN_CHUNK, {"entries", "0", "token_ids"}, mk_tokens_vocab, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_TOKEN_CHUNK, {"entries", "0", "token_ids"}, mk_tokens_long, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_TOKEN_CHUNK, {"entries", "0", "logprobs"}, mk_lp_long, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_TOKEN_CHUNK, {"entries", "0", "logprobs"}, mk_lp_str, BATON_ERR_FORMAT},
    {PROTO_MSG_TOKEN_CHUNK, {"entries", "0", "finish_reason"}, mk_finish_bad, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_TOKEN_CHUNK, {"entries", "0", "top_k"}, mk_21, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_TOKEN_CHUNK, {"entries", "0", "request_id"}, mk_bin31, BATON_ERR_FORMAT},
    {PROTO_MSG_REQUEST_FINISHED, {"finish_reason"}, mk_finish_none, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_REQUEST_FINISHED, {"cached_tokens"}, mk_big, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_REQUEST_FINISHED, {"timings", "decode_us"}, mk_neg1, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_ABORT, {"reason"}, mk_str_long, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_ABORT, {"request_id"}, mk_bin31, BATON_ERR_FORMAT},
    {PROTO_MSG_KV_EVENT, {"epoch"}, mk_zero, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_KV_EVENT, {"removed"}, mk_hash_short, BATON_ERR_FORMAT},
    {PROTO_MSG_KV_EVENT, {"removed"}, mk_hashes_long, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_KV_EVENT, {"stored", "0", "n"}, mk_zero, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_KV_EVENT, {"stored", "0", "h"}, mk_bin15, BATON_ERR_FORMAT},
    {PROTO_MSG_KV_EVENT, {"full_part"}, mk_u32max1, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_KV_RESYNC, {"worker_id"}, mk_wid_empty, BATON_ERR_OUT_OF_RANGE},
    {PROTO_MSG_KV_RESYNC, {"last_seq"}, mk_neg1, BATON_ERR_OUT_OF_RANGE},
};

static void test_ranges(void) {
    int n = 0;
    for (size_t i = 0; i < sizeof(range_cases) / sizeof(range_cases[0]); i++) {
        const range_case_t *c = &range_cases[i];
        force_full = true;
        proto_msg_t in;
        fill_msg(c->type, &in);
        msgpack_sbuffer base;
        msgpack_sbuffer_init(&base);
        CHECK_OK(proto_encode(&in, &base));
        mutation_t m = {{c->path[0], c->path[1], c->path[2], c->path[3]}, 0, MUT_REPLACE, c->make()};
        while (m.depth < 4 && m.path[m.depth]) m.depth++;
        baton_status_t st = decode_mutated(&base, &m, &lim, NULL);
        CHECK_MSG(st == c->want, "case %zu %s.%s%s%s = ...: got %d (%s), want %d", i,
                  proto_msg_type_name(c->type), c->path[0], c->path[1] ? "." : "",
                  c->path[1] ? c->path[1] : "", st, baton_last_error(), c->want);
        n++;
        msgpack_sbuffer_destroy(&base);
        arena_reset();
    }
    fprintf(stderr, "ranges: %d cases\n", n);
}

/* An empty logit_bias is left out, so a request without one encodes to the
 * same bytes as before the field existed (and older decoders see no new
 * key); a non-empty one adds the key. */
static bool has_bytes(const msgpack_sbuffer *sb, const char *needle) {
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= sb->size; i++)
        if (!memcmp(sb->data + i, needle, n)) return true;
    return false;
}

static void test_logit_bias_omitted(void) {
    for (int t = PROTO_MSG_PREFILL_REQUEST; t <= PROTO_MSG_DECODE_REQUEST; t++) {
        proto_msg_t in;
        fill_msg((proto_msg_type_t)t, &in);
        proto_sampling_t *s = t == PROTO_MSG_PREFILL_REQUEST ? &in.u.prefill_request.sampling
                                                             : &in.u.decode_request.sampling;
        s->n_logit_bias = 0;
        s->logit_bias = NULL;
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        CHECK_OK(proto_encode(&in, &sb));
        CHECK(!has_bytes(&sb, "logit_bias"));
        /* the sampling map has exactly the 13 keys of the first schema */
        msgpack_unpacked up;
        msgpack_unpacked_init(&up);
        size_t off = 0;
        CHECK(msgpack_unpack_next(&up, sb.data, sb.size, &off) == MSGPACK_UNPACK_SUCCESS);
        const msgpack_object *samp = NULL;
        for (uint32_t i = 0; i < up.data.via.map.size; i++)
            if (up.data.via.map.ptr[i].key.via.str.size == 8 &&
                !memcmp(up.data.via.map.ptr[i].key.via.str.ptr, "sampling", 8))
                samp = &up.data.via.map.ptr[i].val;
        CHECK(samp && samp->type == MSGPACK_OBJECT_MAP && samp->via.map.size == 13);
        msgpack_unpacked_destroy(&up);
        proto_msg_t out;
        CHECK_OK(proto_decode(sb.data, sb.size, &lim, &out));
        const proto_sampling_t *o = t == PROTO_MSG_PREFILL_REQUEST ? &out.u.prefill_request.sampling
                                                                  : &out.u.decode_request.sampling;
        CHECK_EQ_INT(o->n_logit_bias, 0);
        CHECK(o->logit_bias == NULL);
        proto_msg_free(&out);
        msgpack_sbuffer_destroy(&sb);

        proto_logit_bias_t lb[2] = {{999, 100.0f}, {0, -100.0f}};
        s->logit_bias = lb;
        s->n_logit_bias = 2;
        msgpack_sbuffer_init(&sb);
        CHECK_OK(proto_encode(&in, &sb));
        CHECK(has_bytes(&sb, "logit_bias"));
        CHECK_OK(proto_decode(sb.data, sb.size, &lim, &out));
        o = t == PROTO_MSG_PREFILL_REQUEST ? &out.u.prefill_request.sampling
                                           : &out.u.decode_request.sampling;
        CHECK_EQ_INT(o->n_logit_bias, 2);
        if (o->n_logit_bias == 2) {
            CHECK_EQ_INT(o->logit_bias[0].token, 999);
            CHECK(o->logit_bias[0].bias == 100.0f);
            CHECK_EQ_INT(o->logit_bias[1].token, 0);
            CHECK(o->logit_bias[1].bias == -100.0f);
        }
        proto_msg_free(&out);
        msgpack_sbuffer_destroy(&sb);
        arena_reset();
    }
}

/* Hostile framing that must be refused before any large allocation. */
static void test_hostile(void) {
    proto_msg_t out;
    /* map32 / array32 claiming 4 billion entries */
    CHECK_EQ_INT(proto_decode("\xdf\xff\xff\xff\xff\xa1x", 7, &lim, &out), BATON_ERR_FORMAT);
    CHECK_EQ_INT(proto_decode("\xdd\xff\xff\xff\xff\x01", 6, &lim, &out), BATON_ERR_FORMAT);
    /* str32 claiming 4 GiB */
    CHECK_EQ_INT(proto_decode("\xdb\xff\xff\xff\xff", 5, &lim, &out), BATON_ERR_FORMAT);
    /* reserved byte, not a map, empty */
    CHECK_EQ_INT(proto_decode("\xc1", 1, &lim, &out), BATON_ERR_FORMAT);
    CHECK_EQ_INT(proto_decode("\x93\x01\x02\x03", 4, &lim, &out), BATON_ERR_FORMAT);
    CHECK_EQ_INT(proto_decode("", 0, &lim, &out), BATON_ERR_FORMAT);
    /* non-string key */
    CHECK_EQ_INT(proto_decode("\x81\x01\x02", 3, &lim, &out), BATON_ERR_FORMAT);
    /* nesting 100 deep */
    char deep[101];
    memset(deep, 0x91, 100);
    deep[100] = 0x01;
    CHECK_EQ_INT(proto_decode(deep, sizeof(deep), &lim, &out), BATON_ERR_FORMAT);
    /* bad arguments */
    proto_limits_t zero_vocab = lim;
    zero_vocab.vocab_size = 0;
    CHECK_EQ_INT(proto_decode("\x80", 1, &zero_vocab, &out), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(proto_decode(NULL, 1, &lim, &out), BATON_ERR_INVALID_ARG);
    proto_msg_free(NULL);
}

static void test_stats(void) {
    proto_stats_t stats;
    memset(&stats, 0, sizeof(stats));
    proto_msg_t in, out;
    fill_msg(PROTO_MSG_ABORT, &in);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    CHECK_OK(proto_encode(&in, &sb));
    CHECK_OK(proto_decode_counted(sb.data, sb.size, &lim, &stats, "peer", &out));
    proto_msg_free(&out);
    CHECK_EQ_INT(proto_decode_counted(sb.data, sb.size - 1, &lim, &stats, "peer", &out),
                 BATON_ERR_FORMAT);
    CHECK_EQ_INT(proto_stats_get(&stats, PROTO_MSG_ABORT, BATON_OK), 1);
    CHECK_EQ_INT(proto_stats_get(&stats, PROTO_MSG_UNKNOWN, BATON_ERR_FORMAT), 1);
    /* a mistyped field is counted under the message's own type */
    mutation_t m = {{"reason"}, 1, MUT_REPLACE, v_uint(5)};
    msgpack_sbuffer bad;
    msgpack_sbuffer_init(&bad);
    mutate(&sb, &m, &bad);
    CHECK_EQ_INT(proto_decode_counted(bad.data, bad.size, &lim, &stats, NULL, &out),
                 BATON_ERR_FORMAT);
    CHECK_EQ_INT(proto_stats_get(&stats, PROTO_MSG_ABORT, BATON_ERR_FORMAT), 1);
    CHECK_EQ_INT(proto_stats_errors(&stats), 2);
    msgpack_sbuffer_destroy(&bad);
    msgpack_sbuffer_destroy(&sb);
    arena_reset();
}

/* Writes one valid message per type (every optional array filled, plus a
 * second random instance) into dir: the fuzz seed corpus
 * tests/fuzz/corpus_proto/ was made with `test_proto_messages --write-corpus
 * tests/fuzz/corpus_proto`. */
static int write_corpus(const char *dir) {
    for (int t = 0; t < PROTO_MSG_COUNT; t++) {
        for (int k = 0; k < 2; k++) {
            force_full = k == 0;
            proto_msg_t m;
            fill_msg((proto_msg_type_t)t, &m);
            msgpack_sbuffer sb;
            msgpack_sbuffer_init(&sb);
            if (proto_encode(&m, &sb) != BATON_OK) return 1;
            char path[4096];
            snprintf(path, sizeof(path), "%s/%s-%d.msgpack", dir, proto_msg_type_name(t), k);
            FILE *f = fopen(path, "wb");
            if (!f || fwrite(sb.data, 1, sb.size, f) != sb.size) return 1;
            fclose(f);
            msgpack_sbuffer_destroy(&sb);
            arena_reset();
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    proto_limits_default(1000, &lim);
    lim.max_tokens = 64;
    lim.max_blocks = 32;
    lim.max_entries = 8;
    lim.max_str_bytes = 32;
    lim.max_bin_bytes = 64;
    if (argc == 3 && !strcmp(argv[1], "--write-corpus")) return write_corpus(argv[2]);
    msgpack_sbuffer_init(&vbuf);
    test_round_trip();
    test_typed_encoders();
    test_every_field();
    test_ranges();
    test_logit_bias_omitted();
    test_hostile();
    test_stats();
    msgpack_sbuffer_destroy(&vbuf);
    return TEST_DONE();
}
