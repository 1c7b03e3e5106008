/* router: worker table (see worker_table.h). */
#include "router/worker_table.h"

#include <stdio.h>
#include <string.h>
#include <xxhash.h>

uint64_t worker_table_seed_id(uint64_t hash_seed) {
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(hash_seed >> (8 * i));
    return XXH3_64bits(le, sizeof(le));
}

void worker_table_init(worker_table_t *t, uint32_t block_size, uint64_t hash_seed,
                       uint32_t vocab_size) {
    memset(t, 0, sizeof(*t));
    for (uint32_t i = 0; i < WORKER_TABLE_MAX; i++)
        t->w[i].slot = i;
    t->block_size = block_size;
    t->hash_seed_id = worker_table_seed_id(hash_seed);
    t->vocab_size = vocab_size;
}

const char *worker_table_role_name(proto_role_t role) {
    switch (role) {
    case PROTO_ROLE_PREFILL: return "prefill";
    case PROTO_ROLE_DECODE: return "decode";
    case PROTO_ROLE_BOTH: return "both";
    }
    return "unknown";
}

worker_entry_t *worker_table_find(worker_table_t *t, const char *id) {
    for (uint32_t i = 0; i < WORKER_TABLE_MAX; i++)
        if (t->w[i].used && strcmp(t->w[i].id, id) == 0)
            return &t->w[i];
    return NULL;
}

baton_status_t worker_table_register(worker_table_t *t, const proto_worker_register_t *reg,
                                     const char *kv_events_endpoint, uint64_t now_ms,
                                     uint32_t *slot_out, bool *new_epoch_out) {
    if (reg->kv.block_size != t->block_size)
        return baton_error(BATON_ERR_UNSUPPORTED,
                           "worker %s: block_size %u differs from the router's %u", reg->worker_id,
                           reg->kv.block_size, t->block_size);
    if (reg->kv.hash_seed_id != t->hash_seed_id)
        return baton_error(BATON_ERR_UNSUPPORTED,
                           "worker %s: hash_seed_id %016llx differs from the router's %016llx "
                           "(different --hash-seed)",
                           reg->worker_id, (unsigned long long)reg->kv.hash_seed_id,
                           (unsigned long long)t->hash_seed_id);
    if (reg->vocab_size != t->vocab_size)
        return baton_error(BATON_ERR_UNSUPPORTED,
                           "worker %s: vocab_size %u differs from the router's tokenizer (%u)",
                           reg->worker_id, reg->vocab_size, t->vocab_size);
    worker_entry_t *e = worker_table_find(t, reg->worker_id);
    bool new_epoch = e && e->epoch != reg->epoch;
    if (!e) {
        for (uint32_t i = 0; i < WORKER_TABLE_MAX && !e; i++)
            if (!t->w[i].used)
                e = &t->w[i];
        if (!e)
            return baton_error(BATON_ERR_NO_SPACE, "worker table full (%d workers)",
                               WORKER_TABLE_MAX);
    }
    if (new_epoch || !e->used) {
        uint32_t slot = e->slot;
        memset(e, 0, sizeof(*e));
        e->slot = slot;
        e->registered_ms = now_ms;
    }
    e->used = true;
    snprintf(e->id, sizeof(e->id), "%s", reg->worker_id);
    e->role = reg->role;
    e->epoch = reg->epoch;
    snprintf(e->zmq_endpoint, sizeof(e->zmq_endpoint), "%s",
             reg->zmq_endpoint ? reg->zmq_endpoint : "");
    snprintf(e->kv_events_endpoint, sizeof(e->kv_events_endpoint), "%s",
             kv_events_endpoint ? kv_events_endpoint : "");
    memcpy(e->model_sha256, reg->model_sha256, sizeof(e->model_sha256));
    e->vocab_size = reg->vocab_size;
    e->kv = reg->kv;
    e->max_batch_tokens = reg->max_batch_tokens;
    e->max_batch = reg->max_batch;
    snprintf(e->cpu_model, sizeof(e->cpu_model), "%s", reg->cpu_model ? reg->cpu_model : "");
    snprintf(e->backend, sizeof(e->backend), "%s", reg->backend ? reg->backend : "");
    snprintf(e->compute_dtype, sizeof(e->compute_dtype), "%s",
             reg->compute_dtype ? reg->compute_dtype : "");
    e->last_seen_ms = now_ms;
    *slot_out = e->slot;
    *new_epoch_out = new_epoch;
    return BATON_OK;
}

baton_status_t worker_table_heartbeat(worker_table_t *t, const proto_worker_heartbeat_t *hb,
                                      uint64_t now_ms) {
    worker_entry_t *e = worker_table_find(t, hb->worker_id);
    if (!e || e->epoch != hb->epoch)
        return baton_error(BATON_ERR_NOT_FOUND, "heartbeat from unregistered worker %s epoch %llu",
                           hb->worker_id, (unsigned long long)hb->epoch);
    e->hb = *hb;
    e->has_heartbeat = true;
    e->last_seen_ms = now_ms;
    return BATON_OK;
}

void worker_table_remove(worker_table_t *t, uint32_t slot) {
    if (slot >= WORKER_TABLE_MAX)
        return;
    memset(&t->w[slot], 0, sizeof(t->w[slot]));
    t->w[slot].slot = slot;
}

int worker_table_next_expired(const worker_table_t *t, uint64_t now_ms, uint64_t timeout_ms) {
    for (uint32_t i = 0; i < WORKER_TABLE_MAX; i++)
        if (t->w[i].used && now_ms > t->w[i].last_seen_ms + timeout_ms)
            return (int)i;
    return -1;
}

static bool prefill_capable(const worker_entry_t *w) {
    return w->used && (w->role == PROTO_ROLE_PREFILL || w->role == PROTO_ROLE_BOTH);
}

static bool decode_capable(const worker_entry_t *w) {
    return w->used && (w->role == PROTO_ROLE_DECODE || w->role == PROTO_ROLE_BOTH);
}

bool worker_table_can_pair(const worker_entry_t *p, const worker_entry_t *d, char *why,
                           size_t why_len) {
    char tmp[8];
    if (!why) {
        why = tmp;
        why_len = sizeof(tmp);
    }
    if (!prefill_capable(p) || !decode_capable(d)) {
        snprintf(why, why_len, "roles do not pair");
        return false;
    }
    if (p->role == PROTO_ROLE_BOTH || d->role == PROTO_ROLE_BOTH) {
        if (p != d) {
            snprintf(why, why_len, "a colocated worker pairs only with itself");
            return false;
        }
        return true;
    }
#define DIFF(field)                                                                          \
    if (p->kv.field != d->kv.field) {                                                        \
        snprintf(why, why_len, "%s and %s differ in kv." #field " (%llu vs %llu)", p->id,     \
                 d->id, (unsigned long long)p->kv.field, (unsigned long long)d->kv.field);    \
        return false;                                                                        \
    }
    DIFF(n_layers)
    DIFF(n_kv_heads)
    DIFF(head_dim)
    DIFF(block_size)
    DIFF(dtype)
    DIFF(hash_seed_id)
#undef DIFF
    if (memcmp(p->model_sha256, d->model_sha256, PROTO_SHA256_BYTES) != 0) {
        snprintf(why, why_len, "%s and %s differ in model_sha256", p->id, d->id);
        return false;
    }
    return true;
}

bool worker_table_ready(const worker_table_t *t, char *why, size_t why_len) {
    size_t n_p = 0, n_d = 0;
    char last[256] = "";
    for (uint32_t i = 0; i < WORKER_TABLE_MAX; i++) {
        const worker_entry_t *p = &t->w[i];
        n_p += prefill_capable(p) && p->role != PROTO_ROLE_BOTH;
        n_d += decode_capable(p) && p->role != PROTO_ROLE_BOTH;
        if (!prefill_capable(p))
            continue;
        if (p->role == PROTO_ROLE_BOTH)
            return true;
        for (uint32_t j = 0; j < WORKER_TABLE_MAX; j++)
            if (decode_capable(&t->w[j]) && t->w[j].role == PROTO_ROLE_DECODE &&
                worker_table_can_pair(p, &t->w[j], last, sizeof(last)))
                return true;
    }
    if (why) {
        if (last[0])
            snprintf(why, why_len, "no compatible prefill/decode pair: %s", last);
        else
            snprintf(why, why_len, "waiting for workers: %zu prefill, %zu decode registered",
                     n_p, n_d);
    }
    return false;
}
