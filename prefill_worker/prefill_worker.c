/* baton-prefill: see prefill_worker.h. */
#include "prefill_worker/prefill_worker.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <openssl/evp.h>
#include <xxhash.h>
#include <zmq.h>

#include "common/kv_pool.h"
#include "common/kv_transfer.h"
#include "common/log.h"
#include "common/model.h"
#include "common/radix_cache.h"
#include "prefill_worker/prefill_sched.h"
#include "proto/messages.h"
#include "proto/zmq_channel.h"

#define COMP "prefill"
#define MAX_PEERS 64        /* cached DEALERs to decode workers */
#define MAX_UCX_PEERS 64    /* cached UCX endpoints */
#define REGISTER_EVERY 10   /* heartbeats between WorkerRegister repeats */
#define RESYNC_PART 4096    /* hashes per full-set KVEvent part */
#define PROGRESS_MS 50      /* UCX progress/deadline tick while transfers run */

typedef struct peer {
    char *endpoint;
    proto_chan_t *chan;
} peer_t;

typedef struct ucx_peer {
    char worker_id[PROTO_WORKER_ID_MAX + 1];
    uint64_t epoch;
    kv_transfer_peer_t *peer; /* NULL once failed: that decode run is gone */
    baton_status_t failed;    /* why it failed */
} ucx_peer_t;

/* One request known to the worker (from its PrefillRequest or from a
 * KVDestination that came first). */
typedef struct req_ctx {
    struct req_ctx *prev, *next;
    struct worker *w;
    uint8_t id[16];
    bool has_request;     /* submitted to the scheduler */
    bool has_dest;        /* destination given to the scheduler */
    char decode_worker_id[PROTO_WORKER_ID_MAX + 1];
    char *decode_endpoint;
    uint64_t orphan_deadline_us; /* destination without request: dropped after (monotonic) */
    kv_transfer_t *xfer;
    baton_status_t xfer_status; /* a failure reported before the flush */
    bool sent_any;              /* a put was issued (the deadline restarted) */
    bool flushing;
    prefill_sched_result_t res; /* kept from the finished hook for PrefillDone */
    sampling_logprob_t top[SAMPLING_MAX_LOGPROBS];
    uint64_t t_flush_us;  /* monotonic, flush issued */
} req_ctx_t;

typedef struct worker {
    prefill_worker_config_t cfg;
    char worker_id[PROTO_WORKER_ID_MAX + 1];
    uint64_t epoch;
    uint8_t model_sha256[32];
    char peer_endpoint[256];
    char events_endpoint[256];
    backend_t *be;
    model_t *model;
    kv_pool_t *pool;
    radix_cache_t *cache;
    prefill_sched_t *sched;
    kv_transfer_engine_t *xeng;
    kv_transfer_pool_t *xpool;
    void *zctx;
    proto_chan_opts_t chan_opts;
    proto_chan_t *router, *peer_router, *pub;
    peer_t peers[MAX_PEERS];
    int n_peers;
    ucx_peer_t upeers[MAX_UCX_PEERS];
    int n_upeers;
    req_ctx_t *live;
    struct event_base *base;
    struct event *ev_router, *ev_peer, *ev_ucx, *ev_hb, *ev_step, *ev_deadline, *ev_tick,
        *ev_term, *ev_int;
    uint64_t n_heartbeats;
    uint64_t bad_messages;
    int32_t last_step_tokens;
} worker_t;

static uint64_t unix_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static uint64_t mono_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void id_hex(const uint8_t *id, char out[33]) {
    for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", id[i]);
}

/* SHA-256 of the model file (OpenSSL EVP): the model identity checked at
 * pairing. */
static baton_status_t file_sha256(const char *path, uint8_t out[32]) {
    FILE *f = fopen(path, "rb");
    if (!f) return baton_error(BATON_ERR_IO, "%s: %s", path, strerror(errno));
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    baton_status_t st = BATON_OK;
    unsigned char *buf = malloc(1 << 20);
    if (!ctx || !buf || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        st = baton_error(BATON_ERR_NO_MEMORY, "sha256 init");
        goto out;
    }
    size_t n;
    while ((n = fread(buf, 1, 1 << 20, f)) > 0)
        if (EVP_DigestUpdate(ctx, buf, n) != 1) {
            st = baton_error(BATON_ERR_INTERNAL, "sha256 update");
            goto out;
        }
    if (ferror(f)) {
        st = baton_error(BATON_ERR_IO, "%s: read error", path);
        goto out;
    }
    unsigned int len = 32;
    if (EVP_DigestFinal_ex(ctx, out, &len) != 1 || len != 32)
        st = baton_error(BATON_ERR_INTERNAL, "sha256 final");
out:
    free(buf);
    EVP_MD_CTX_free(ctx);
    fclose(f);
    return st;
}

/* ---- contexts and channels ---------------------------------------------- */

static req_ctx_t *ctx_find(worker_t *w, const uint8_t *id) {
    for (req_ctx_t *c = w->live; c; c = c->next)
        if (memcmp(c->id, id, 16) == 0) return c;
    return NULL;
}

static req_ctx_t *ctx_new(worker_t *w, const uint8_t *id) {
    req_ctx_t *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->w = w;
    memcpy(c->id, id, 16);
    c->next = w->live;
    if (w->live) w->live->prev = c;
    w->live = c;
    return c;
}

/* Unlinks and frees a context; an unfinished transfer is abandoned. */
static void ctx_free(worker_t *w, req_ctx_t *c) {
    if (c->prev) c->prev->next = c->next;
    else if (w->live == c) w->live = c->next;
    if (c->next) c->next->prev = c->prev;
    kv_transfer_free(c->xfer);
    free(c->decode_endpoint);
    free(c);
}

static void send_router(worker_t *w, const proto_msg_t *m) {
    baton_status_t st = proto_chan_send(w->router, NULL, m);
    if (st != BATON_OK)
        LOG_WARN(COMP, "send %s to the router failed: %s", proto_msg_type_name(m->type),
                 baton_last_error());
    if (proto_chan_readable(w->router)) event_active(w->ev_router, EV_READ, 0);
}

static proto_chan_t *peer_chan(worker_t *w, const char *endpoint) {
    for (int i = 0; i < w->n_peers; i++)
        if (strcmp(w->peers[i].endpoint, endpoint) == 0) return w->peers[i].chan;
    if (w->n_peers == MAX_PEERS) { /* drop the oldest */
        proto_chan_free(w->peers[0].chan);
        free(w->peers[0].endpoint);
        memmove(&w->peers[0], &w->peers[1], sizeof(peer_t) * (MAX_PEERS - 1));
        w->n_peers--;
    }
    proto_chan_t *c = NULL;
    if (proto_chan_open(w->zctx, PROTO_CHAN_DEALER, endpoint, w->worker_id, &w->chan_opts, &c) !=
        BATON_OK)
        return NULL;
    char *ep = strdup(endpoint);
    if (!ep) {
        proto_chan_free(c);
        return NULL;
    }
    w->peers[w->n_peers++] = (peer_t){.endpoint = ep, .chan = c};
    return c;
}

/* PrefillDone for `c` with `st` (and the result when OK) to the decode
 * worker (when its endpoint is known and `to_decode`) and to the router. */
static void send_prefill_done(worker_t *w, req_ctx_t *c, baton_status_t st, const char *error,
                              bool to_decode, uint64_t transfer_us, uint64_t bytes) {
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = PROTO_MSG_PREFILL_DONE;
    proto_prefill_done_t *d = &m.u.prefill_done;
    memcpy(d->request_id.bytes, c->id, 16);
    snprintf(d->prefill_worker_id, sizeof(d->prefill_worker_id), "%s", w->worker_id);
    d->status = st;
    d->error = (char *)(error ? error : "");
    proto_token_logprob_t top[SAMPLING_MAX_LOGPROBS];
    if (st == BATON_OK) {
        d->first_token = (uint32_t)c->res.sample.token;
        d->first_logprob = c->res.sample.logprob;
        for (int32_t i = 0; i < c->res.sample.n_top; i++)
            top[i] = (proto_token_logprob_t){(uint32_t)c->top[i].token, c->top[i].logprob};
        d->top_logprobs = top;
        d->n_top_logprobs = (uint32_t)c->res.sample.n_top;
        d->n_blocks_written = (uint32_t)c->res.n_blocks_sent;
        d->bytes_written = bytes;
        d->queue_us = c->res.queue_us;
        d->compute_us = c->res.compute_us;
        d->transfer_us = transfer_us;
        d->cached_tokens = (uint32_t)c->res.n_cached_tokens;
        d->device_us = c->res.device_us;
    }
    if (to_decode && c->decode_endpoint && *c->decode_endpoint) {
        proto_chan_t *pc = peer_chan(w, c->decode_endpoint);
        baton_status_t s2 = pc ? proto_chan_send(pc, NULL, &m) : BATON_ERR_IO;
        if (s2 != BATON_OK)
            LOG_WARN(COMP, "PrefillDone to %s failed: %s", c->decode_endpoint,
                     baton_last_error());
    }
    send_router(w, &m);
}

/* A request failed here (not inside the scheduler): drop it from the
 * scheduler, tell the decode worker and the router, free the context. */
static void fail_ctx(worker_t *w, req_ctx_t *c, baton_status_t st, const char *why, bool to_decode) {
    char hex[33];
    id_hex(c->id, hex);
    LOG_WARN(COMP, "request %s failed: %s", hex, why);
    if (c->has_request || c->has_dest) prefill_sched_abort(w->sched, c->id, NULL);
    send_prefill_done(w, c, st, why, to_decode, 0, 0);
    ctx_free(w, c);
}

/* ---- KV events ------------------------------------------------------------ */

static void fill_stored(proto_kv_stored_t *out, const block_hash_link_t *l, uint32_t n_tokens) {
    block_hash_to_bytes(&l->hash, out->hash.bytes);
    if (l->has_parent) block_hash_to_bytes(&l->parent, out->parent_hash.bytes);
    else memset(out->parent_hash.bytes, 0, PROTO_ID_BYTES);
    out->n_tokens = n_tokens;
}

static void publish_events(worker_t *w) {
    radix_cache_events_t ev;
    if (radix_cache_take_events(w->cache, &ev) != BATON_OK) {
        LOG_WARN(COMP, "KV events: %s", baton_last_error());
        return;
    }
    if (ev.n_stored == 0 && ev.n_removed == 0) {
        radix_cache_events_free(&ev);
        return;
    }
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = PROTO_MSG_KV_EVENT;
    proto_kv_event_t *k = &m.u.kv_event;
    snprintf(k->worker_id, sizeof(k->worker_id), "%s", w->worker_id);
    k->epoch = w->epoch;
    k->seq = ev.seq;
    k->stored = calloc(ev.n_stored ? ev.n_stored : 1, sizeof(proto_kv_stored_t));
    k->removed = calloc(ev.n_removed ? ev.n_removed : 1, sizeof(proto_block_hash_t));
    if (!k->stored || !k->removed) {
        LOG_ERROR(COMP, "KV events: out of memory (the router will resync on the gap)");
    } else {
        uint32_t bs = (uint32_t)prefill_sched_block_size(w->sched);
        for (size_t i = 0; i < ev.n_stored; i++) fill_stored(&k->stored[i], &ev.stored[i], bs);
        for (size_t i = 0; i < ev.n_removed; i++) block_hash_to_bytes(&ev.removed[i], k->removed[i].bytes);
        k->n_stored = (uint32_t)ev.n_stored;
        k->n_removed = (uint32_t)ev.n_removed;
        if (proto_chan_send(w->pub, NULL, &m) != BATON_OK)
            LOG_WARN(COMP, "KV event %llu not published: %s", (unsigned long long)ev.seq,
                     baton_last_error());
    }
    free(k->stored);
    free(k->removed);
    radix_cache_events_free(&ev);
}

/* KVResync: the full set as of the latest published batch, in parts. */
static void answer_resync(worker_t *w) {
    publish_events(w); /* a snapshot needs no pending changes */
    radix_cache_snapshot_t snap;
    if (radix_cache_snapshot(w->cache, &snap) != BATON_OK) {
        LOG_WARN(COMP, "KVResync: %s", baton_last_error());
        return;
    }
    uint32_t bs = (uint32_t)prefill_sched_block_size(w->sched);
    proto_kv_stored_t *buf = calloc(RESYNC_PART, sizeof(*buf));
    if (!buf) {
        radix_cache_snapshot_free(&snap);
        LOG_ERROR(COMP, "KVResync: out of memory");
        return;
    }
    size_t done = 0;
    uint32_t part = 0;
    do {
        size_t n = snap.n - done < RESYNC_PART ? snap.n - done : RESYNC_PART;
        for (size_t i = 0; i < n; i++) fill_stored(&buf[i], &snap.links[done + i], bs);
        proto_msg_t m;
        memset(&m, 0, sizeof(m));
        m.type = PROTO_MSG_KV_EVENT;
        proto_kv_event_t *k = &m.u.kv_event;
        snprintf(k->worker_id, sizeof(k->worker_id), "%s", w->worker_id);
        k->epoch = w->epoch;
        k->seq = snap.seq;
        k->full = true;
        k->full_part = part++;
        done += n;
        k->full_last = done == snap.n;
        k->stored = buf;
        k->n_stored = (uint32_t)n;
        if (proto_chan_send(w->pub, NULL, &m) != BATON_OK)
            LOG_WARN(COMP, "KVResync part %u not published: %s", k->full_part, baton_last_error());
    } while (done < snap.n);
    LOG_INFO(COMP, "KVResync: sent %zu hashes in %u part(s) at seq %llu", snap.n, part,
             (unsigned long long)snap.seq);
    free(buf);
    radix_cache_snapshot_free(&snap);
}

/* ---- scheduler hooks ------------------------------------------------------ */

static baton_status_t on_send_layer(void *arg, void *dest_user, int32_t layer,
                                    const kv_transfer_block_pair_t *pairs, size_t n) {
    worker_t *w = arg;
    req_ctx_t *c = dest_user;
    if (!c->xfer) return baton_error(BATON_ERR_INTERNAL, "no transfer for the request");
    if (c->xfer_status != BATON_OK) return c->xfer_status;
    if (!c->sent_any) { /* the transfer's deadline runs from its first put */
        baton_status_t st = kv_transfer_restart_deadline(c->xfer, w->cfg.transfer_timeout_ms);
        if (st != BATON_OK) return st;
        c->sent_any = true;
    }
    return kv_transfer_send_layer(c->xfer, layer, pairs, n);
}

static void schedule_step(worker_t *w);

static void complete_transfer(worker_t *w, req_ctx_t *c, baton_status_t st) {
    uint64_t transfer_us = mono_us() - c->t_flush_us;
    uint64_t bytes = c->xfer ? kv_transfer_bytes(c->xfer) : 0;
    if (st == BATON_OK) {
        /* the non-overlapped part: last chunk end (or destination) to flush */
        send_prefill_done(w, c, BATON_OK, "", true, transfer_us, bytes);
    } else {
        char why[300];
        snprintf(why, sizeof(why), "KV transfer failed: %s", baton_status_str(st));
        char hex[33];
        id_hex(c->id, hex);
        LOG_WARN(COMP, "request %s: %s", hex, why);
        send_prefill_done(w, c, st == BATON_ERR_TIMEOUT ? st : BATON_ERR_PEER, why, true, 0, 0);
    }
    prefill_sched_release(w->sched, c->id);
    ctx_free(w, c);
    schedule_step(w); /* blocks came back: a waiting request may run */
}

static void on_xfer_done(kv_transfer_t *xfer, baton_status_t st, void *arg) {
    req_ctx_t *c = arg;
    if (c->flushing) {
        complete_transfer(c->w, c, st);
        return;
    }
    /* failed before the flush: the next send or the flush reports it */
    c->xfer_status = st == BATON_OK ? BATON_ERR_INTERNAL : st;
}

static void on_finished(void *arg, const prefill_sched_result_t *res) {
    worker_t *w = arg;
    req_ctx_t *c = res->user;
    if (res->status != BATON_OK) {
        char hex[33];
        id_hex(c->id, hex);
        LOG_WARN(COMP, "request %s failed: %s", hex, res->error);
        c->has_request = c->has_dest = false; /* the scheduler has dropped it */
        send_prefill_done(w, c, res->status, res->error, true, 0, 0);
        ctx_free(w, c);
        schedule_step(w);
        return;
    }
    c->res = *res;
    c->res.request_id = c->id;
    memcpy(c->top, res->sample.top, sizeof(c->top));
    c->t_flush_us = mono_us();
    if (c->xfer_status != BATON_OK) { /* failed earlier; its callback has run */
        complete_transfer(w, c, c->xfer_status);
        return;
    }
    c->flushing = true;
    /* whatever it returns, on_xfer_done completes the request: from inside
     * this call, or later from kv_transfer_engine_progress (a transfer that
     * failed meanwhile has its callback pending) */
    if (!c->sent_any) /* nothing was put: the flush still gets a deadline */
        kv_transfer_restart_deadline(c->xfer, w->cfg.transfer_timeout_ms);
    kv_transfer_flush(c->xfer);
}

/* ---- message handlers ----------------------------------------------------- */

/* The next step runs from a zero-timeout timer, not event_active: libevent
 * runs events activated inside a callback in the same pass, so back-to-back
 * steps would starve the heartbeat and UCX progress timers. */
static void schedule_step(worker_t *w) {
    static const struct timeval now = {0, 0};
    if (!event_pending(w->ev_step, EV_TIMEOUT, NULL)) event_add(w->ev_step, &now);
}

static void handle_prefill_request(worker_t *w, const proto_prefill_request_t *q) {
    req_ctx_t *c = ctx_find(w, q->request_id.bytes);
    if (c && c->has_request) {
        LOG_WARN(COMP, "duplicate PrefillRequest dropped");
        w->bad_messages++;
        return;
    }
    if (!c && !(c = ctx_new(w, q->request_id.bytes))) {
        LOG_ERROR(COMP, "PrefillRequest: out of memory");
        return;
    }
    snprintf(c->decode_worker_id, sizeof(c->decode_worker_id), "%s", q->decode_worker_id);
    free(c->decode_endpoint);
    c->decode_endpoint = q->decode_endpoint ? strdup(q->decode_endpoint) : NULL;
    if (q->deadline_unix_us && q->deadline_unix_us < unix_us()) {
        fail_ctx(w, c, BATON_ERR_TIMEOUT, "request deadline passed before prefill", true);
        return;
    }
    if (q->sampling.n_logit_bias > PROTO_MAX_LOGIT_BIAS) {
        fail_ctx(w, c, BATON_ERR_OUT_OF_RANGE, "too many logit_bias entries", true);
        return;
    }
    int32_t *toks = malloc(sizeof(int32_t) * q->n_token_ids);
    sampling_logit_bias_t bias[PROTO_MAX_LOGIT_BIAS]; /* copied by sampler_init in submit */
    int32_t stop[SAMPLING_MAX_STOP_IDS];
    if (!toks) {
        fail_ctx(w, c, BATON_ERR_NO_MEMORY, "out of memory", true);
        return;
    }
    for (uint32_t i = 0; i < q->n_token_ids; i++) toks[i] = (int32_t)q->token_ids[i];
    sampling_params_t sp = sampling_params_default();
    const proto_sampling_t *ps = &q->sampling;
    sp.temperature = ps->temperature;
    sp.top_k = (int32_t)ps->top_k;
    sp.top_p = ps->top_p;
    sp.min_p = ps->min_p;
    sp.repetition_penalty = ps->repetition_penalty;
    sp.presence_penalty = ps->presence_penalty;
    sp.frequency_penalty = ps->frequency_penalty;
    sp.seed = ps->seed;
    sp.n_logprobs = ps->logprobs ? (int32_t)ps->top_logprobs : 0;
    for (uint32_t i = 0; i < ps->n_logit_bias; i++)
        bias[i] = (sampling_logit_bias_t){(int32_t)ps->logit_bias[i].token, ps->logit_bias[i].bias};
    sp.logit_bias = bias;
    sp.n_logit_bias = (int32_t)ps->n_logit_bias;
    uint32_t ns = ps->n_stop_token_ids < SAMPLING_MAX_STOP_IDS ? ps->n_stop_token_ids
                                                               : SAMPLING_MAX_STOP_IDS;
    for (uint32_t i = 0; i < ns; i++) stop[i] = (int32_t)ps->stop_token_ids[i];
    sp.stop_ids = stop;
    sp.n_stop_ids = (int32_t)ns;
    prefill_sched_request_t r = {
        .request_id = c->id, .tokens = toks, .n_tokens = (int32_t)q->n_token_ids,
        .sampling = sp, .cache_salt = q->cache_salt, .local = false, .user = c,
    };
    /* set before submit: a destination stored earlier is attached inside it */
    c->has_request = true;
    baton_status_t st = prefill_sched_submit(w->sched, &r);
    free(toks);
    if (st != BATON_OK) {
        char why[600];
        snprintf(why, sizeof(why), "refused: %s", baton_last_error());
        c->has_request = false;
        fail_ctx(w, c, st, why, true);
        return;
    }
    schedule_step(w);
}

/* Caches a new endpoint under (decode worker id, epoch). */
static kv_transfer_peer_t *ucx_peer_add(worker_t *w, const proto_kv_destination_t *d,
                                        kv_transfer_peer_t *peer) {
    if (w->n_upeers == MAX_UCX_PEERS) { /* drop the oldest (its transfers fail) */
        kv_transfer_peer_free(w->upeers[0].peer);
        memmove(&w->upeers[0], &w->upeers[1], sizeof(ucx_peer_t) * (MAX_UCX_PEERS - 1));
        w->n_upeers--;
    }
    ucx_peer_t *u = &w->upeers[w->n_upeers++];
    memset(u, 0, sizeof(*u));
    snprintf(u->worker_id, sizeof(u->worker_id), "%s", d->decode_worker_id);
    u->epoch = d->decode_epoch;
    u->peer = peer;
    return peer;
}

/* The endpoint to the decode pool of `d`: cached per (worker id, epoch), or
 * connected from ucx_address, which is either the whole
 * kv_transfer_pool_pack descriptor or the bare UCX worker address with the
 * K/V regions in pool.regions (both forms are accepted). */
static kv_transfer_peer_t *ucx_peer(worker_t *w, const proto_kv_destination_t *d,
                                    baton_status_t *st_out) {
    for (int i = 0; i < w->n_upeers; i++) {
        ucx_peer_t *u = &w->upeers[i];
        if (strcmp(u->worker_id, d->decode_worker_id) || u->epoch != d->decode_epoch) continue;
        if (u->peer && kv_transfer_peer_status(u->peer) == BATON_OK) return u->peer;
        if (u->peer) {
            /* A failed endpoint means this decode run (worker id, epoch) died
             * or became unreachable; a restarted decode worker registers with
             * a new epoch. Requests to the old one fail at once (no reconnect
             * to a dead address). */
            u->failed = kv_transfer_peer_status(u->peer);
            kv_transfer_peer_free(u->peer);
            u->peer = NULL;
        }
        *st_out = baton_error(BATON_ERR_PEER, "decode worker %s (epoch %llu) failed earlier: %s",
                              u->worker_id, (unsigned long long)u->epoch,
                              baton_status_str(u->failed));
        return NULL;
    }
    const proto_pool_desc_t *p = &d->pool;
    const backend_kv_geom_t *g = kv_pool_geom(w->pool);
    kv_transfer_remote_info_t info;
    if (d->ucx_address_len > 0 &&
        kv_transfer_descriptor_parse(d->ucx_address, d->ucx_address_len, &info) == BATON_OK) {
        /* ucx_address holds the whole kv_transfer_pool_pack descriptor
         * (decode_worker.h): use it as it is */
        if (info.n_layers != g->n_layers || info.block_bytes != kv_pool_block_bytes(w->pool)) {
            *st_out = baton_error(BATON_ERR_INVALID_ARG,
                                  "KV geometry differs: decode pool %d layers x %llu-byte blocks, "
                                  "prefill %d x %zu",
                                  info.n_layers, (unsigned long long)info.block_bytes, g->n_layers,
                                  kv_pool_block_bytes(w->pool));
            return NULL;
        }
        kv_transfer_peer_t *peer = NULL;
        baton_status_t st = kv_transfer_peer_connect(w->xeng, d->ucx_address, d->ucx_address_len, &peer);
        if (st != BATON_OK) {
            *st_out = st;
            return NULL;
        }
        return ucx_peer_add(w, d, peer);
    }
    /* otherwise ucx_address is the bare UCX worker address: rebuild the
     * descriptor (format v1 of common/kv_transfer.h: header, u32 checksum,
     * address, K rkey, V rkey) from it and pool.regions [K, V] */
    if (d->ucx_address_len == 0 || p->n_regions != 2) {
        *st_out = baton_error(BATON_ERR_FORMAT,
                              "KVDestination without a UCX address or [K, V] regions (%u regions)",
                              p->n_regions);
        return NULL;
    }
    if (p->block_bytes != kv_pool_block_bytes(w->pool)) {
        *st_out = baton_error(BATON_ERR_INVALID_ARG,
                              "KV geometry differs: decode block_bytes %llu, prefill %zu",
                              (unsigned long long)p->block_bytes, kv_pool_block_bytes(w->pool));
        return NULL;
    }
    uint32_t la = d->ucx_address_len, lk = p->regions[0].rkey_len, lv = p->regions[1].rkey_len;
    size_t len = 4 + 2 + 2 + 4 + 4 + 8 + 8 + 8 + 12 + 4 + (size_t)la + lk + lv;
    uint8_t *b = malloc(len);
    if (!b) {
        *st_out = baton_error(BATON_ERR_NO_MEMORY, "descriptor");
        return NULL;
    }
    uint8_t *q = b;
#define PUT(v, n)                                                        \
    do {                                                                 \
        uint64_t _v = (uint64_t)(v);                                     \
        for (int _i = 0; _i < (n); _i++) *q++ = (uint8_t)(_v >> (8 * _i)); \
    } while (0)
    memcpy(q, "BKVT", 4);
    q += 4;
    PUT(1, 2);
    PUT(0, 2);
    PUT(g->n_layers, 4);
    PUT(p->n_blocks, 4);
    PUT(p->block_bytes, 8);
    PUT(p->regions[0].base_addr, 8);
    PUT(p->regions[1].base_addr, 8);
    PUT(la, 4);
    PUT(lk, 4);
    PUT(lv, 4);
    uint8_t *sum = q;
    PUT(0, 4);
    memcpy(q, d->ucx_address, la);
    memcpy(q + la, p->regions[0].rkey, lk);
    memcpy(q + la + lk, p->regions[1].rkey, lv);
    /* checksum: low 32 bits of XXH3-64 of the descriptor, this field zero */
    q = sum;
    PUT(XXH3_64bits(b, len), 4);
#undef PUT
    kv_transfer_peer_t *peer = NULL;
    baton_status_t st = kv_transfer_peer_connect(w->xeng, b, len, &peer);
    free(b);
    if (st != BATON_OK) {
        *st_out = st;
        return NULL;
    }
    return ucx_peer_add(w, d, peer);
}

static void handle_kv_destination(worker_t *w, const proto_kv_destination_t *d) {
    req_ctx_t *c = ctx_find(w, d->request_id.bytes);
    if (c && (c->has_dest || c->xfer)) {
        LOG_WARN(COMP, "second KVDestination for a request dropped");
        w->bad_messages++;
        return;
    }
    if (!c) { /* it overtook its PrefillRequest */
        if (!(c = ctx_new(w, d->request_id.bytes))) {
            LOG_ERROR(COMP, "KVDestination: out of memory");
            return;
        }
        snprintf(c->decode_worker_id, sizeof(c->decode_worker_id), "%s", d->decode_worker_id);
        c->orphan_deadline_us = mono_us() + (uint64_t)w->cfg.kv_destination_timeout_ms * 1000u;
    }
    baton_status_t st = BATON_OK;
    kv_transfer_peer_t *peer = ucx_peer(w, d, &st);
    if (peer)
        /* No deadline while the request waits for its prefill (the router's
         * request deadline and Abort bound that); on_send_layer starts the
         * transfer's own deadline at the first put. Peer failure is still
         * reported at once by the endpoint's error handler. */
        st = kv_transfer_begin(peer, w->xpool, UINT32_MAX, on_xfer_done, c, &c->xfer);
    if (st != BATON_OK) {
        char why[600];
        snprintf(why, sizeof(why), "KV transfer to %s not possible: %s", d->decode_worker_id,
                 baton_last_error());
        if (c->has_request) fail_ctx(w, c, st, why, true);
        else {
            LOG_WARN(COMP, "%s", why);
            ctx_free(w, c);
        }
        return;
    }
    int32_t *ids = malloc(sizeof(int32_t) * d->n_block_ids);
    if (!ids) {
        fail_ctx(w, c, BATON_ERR_NO_MEMORY, "out of memory", true);
        return;
    }
    for (uint32_t i = 0; i < d->n_block_ids; i++) ids[i] = (int32_t)d->block_ids[i];
    c->has_dest = true;
    st = prefill_sched_set_destination(w->sched, c->id, ids, (int32_t)d->n_block_ids,
                                       (int32_t)d->n_skip_blocks, c);
    free(ids);
    if (st != BATON_OK && ctx_find(w, d->request_id.bytes) == c) {
        /* refused without failing the request inside the scheduler */
        char why[600];
        snprintf(why, sizeof(why), "KVDestination refused: %s", baton_last_error());
        c->has_dest = false;
        if (c->has_request) fail_ctx(w, c, st, why, true);
        else {
            LOG_WARN(COMP, "%s", why);
            ctx_free(w, c);
        }
    }
    /* a request already computed may have finished inside the call */
}

static void handle_abort(worker_t *w, const proto_abort_t *a) {
    bool active = false;
    baton_status_t st = prefill_sched_abort(w->sched, a->request_id.bytes, &active);
    req_ctx_t *c = ctx_find(w, a->request_id.bytes);
    char hex[33];
    id_hex(a->request_id.bytes, hex);
    LOG_INFO(COMP, "abort %s (%s): %s", hex, a->reason ? a->reason : "",
             st == BATON_OK ? (active ? "released" : "dropped its destination") : "unknown");
    if (c) {
        if (active) {
            c->has_request = c->has_dest = false;
            send_prefill_done(w, c, BATON_ERR_CANCELLED, "aborted", false, 0, 0);
        }
        ctx_free(w, c);
    }
    schedule_step(w);
}

static void on_message(void *arg, proto_chan_t *chan, const char *peer, proto_msg_t *msg) {
    worker_t *w = arg;
    switch (msg->type) {
    case PROTO_MSG_PREFILL_REQUEST: handle_prefill_request(w, &msg->u.prefill_request); break;
    case PROTO_MSG_KV_DESTINATION: handle_kv_destination(w, &msg->u.kv_destination); break;
    case PROTO_MSG_ABORT: handle_abort(w, &msg->u.abort); break;
    case PROTO_MSG_KV_RESYNC: answer_resync(w); break;
    default:
        w->bad_messages++;
        LOG_WARN(COMP, "unexpected %s from %s dropped", proto_msg_type_name(msg->type),
                 peer && *peer ? peer : "the router");
        break;
    }
}

static void drain(worker_t *w, proto_chan_t *c) {
    if (proto_chan_drain(c, on_message, w, 256, NULL) == BATON_ERR_BUSY)
        event_active(c == w->router ? w->ev_router : w->ev_peer, EV_READ, 0);
}

static void on_router_readable(evutil_socket_t fd, short ev, void *arg) {
    drain(arg, ((worker_t *)arg)->router);
}
static void on_peer_readable(evutil_socket_t fd, short ev, void *arg) {
    drain(arg, ((worker_t *)arg)->peer_router);
}

static void arm_deadline(worker_t *w) {
    int64_t us = prefill_sched_next_deadline_us(w->sched);
    if (us < 0) return;
    struct timeval tv = {.tv_sec = us / 1000000, .tv_usec = us % 1000000 + 1000};
    event_add(w->ev_deadline, &tv);
}

static void on_ucx(evutil_socket_t fd, short ev, void *arg) {
    worker_t *w = arg;
    kv_transfer_engine_progress(w->xeng);
}

/* A transfer whose peer failed (or whose deadline passed) before its flush
 * fails its request now, not when the prefill's last chunk is computed: the
 * blocks are released and the router and the decode worker told at once.
 * Runs from the event loop, outside any scheduler step. */
static void fail_broken_transfers(worker_t *w) {
    req_ctx_t *c = w->live;
    while (c) {
        req_ctx_t *n = c->next;
        if (c->has_request && c->xfer && !c->flushing && c->xfer_status != BATON_OK) {
            char why[128];
            snprintf(why, sizeof(why), "KV send failed: %s", baton_status_str(c->xfer_status));
            fail_ctx(w, c, c->xfer_status, why, true);
        }
        c = n;
    }
}

static void on_step(evutil_socket_t fd, short ev, void *arg) {
    worker_t *w = arg;
    int32_t n = 0;
    prefill_sched_step(w->sched, &n);
    w->last_step_tokens = n;
    publish_events(w);
    kv_transfer_engine_progress(w->xeng);
    fail_broken_transfers(w);
    /* sockets between steps, without blocking */
    drain(w, w->router);
    drain(w, w->peer_router);
    arm_deadline(w);
    if (n > 0) schedule_step(w);
}

static void on_deadline(evutil_socket_t fd, short ev, void *arg) {
    schedule_step(arg); /* the step expires what is due */
}

static void on_tick(evutil_socket_t fd, short ev, void *arg) {
    worker_t *w = arg;
    kv_transfer_engine_progress(w->xeng); /* transfer deadlines, keepalive */
    fail_broken_transfers(w);
    uint64_t now = mono_us();
    req_ctx_t *c = w->live;
    while (c) {
        req_ctx_t *n = c->next;
        if (!c->has_request && c->orphan_deadline_us && c->orphan_deadline_us <= now) {
            LOG_WARN(COMP, "KVDestination without a PrefillRequest expired");
            prefill_sched_abort(w->sched, c->id, NULL);
            ctx_free(w, c);
        }
        c = n;
    }
}

static proto_kv_dtype_t kv_dtype(backend_dtype_t d) {
    return d == BACKEND_DTYPE_F32 ? PROTO_KV_DTYPE_F32
           : d == BACKEND_DTYPE_F16 ? PROTO_KV_DTYPE_F16 : PROTO_KV_DTYPE_BF16;
}

static void send_register(worker_t *w) {
    const model_hparams_t *hp = model_hparams(w->model);
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = PROTO_MSG_WORKER_REGISTER;
    proto_worker_register_t *r = &m.u.worker_register;
    snprintf(r->worker_id, sizeof(r->worker_id), "%s", w->worker_id);
    r->role = PROTO_ROLE_PREFILL;
    r->epoch = w->epoch;
    r->zmq_endpoint = w->peer_endpoint;
    r->kv_events_endpoint = w->events_endpoint;
    memcpy(r->model_sha256, w->model_sha256, 32);
    r->vocab_size = (uint32_t)hp->n_vocab;
    const backend_kv_geom_t *g = kv_pool_geom(w->pool);
    r->kv.n_layers = (uint32_t)g->n_layers;
    r->kv.n_kv_heads = (uint32_t)g->n_kv_heads;
    r->kv.head_dim = (uint32_t)g->head_dim;
    r->kv.block_size = (uint32_t)g->block_size;
    r->kv.dtype = kv_dtype(g->dtype);
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(w->cfg.hash_seed >> (8 * i));
    r->kv.hash_seed_id = XXH3_64bits(le, sizeof(le)); /* cluster.md: XXH3-64 of the seed */
    r->pool.n_blocks = (uint32_t)g->n_blocks;
    r->pool.block_bytes = kv_pool_block_bytes(w->pool);
    /* serving configuration (issue 6: /v1/serving_config) */
    char cpu[256];
    proto_host_cpu_model(cpu, sizeof(cpu));
    const backend_t *be = model_backend(w->model);
    r->max_batch_tokens = (uint32_t)w->cfg.max_batch_tokens;
    r->cpu_model = cpu;
    r->backend = (char *)be->ops->name;
    r->compute_dtype = (char *)backend_dtype_name(be->weight_dtype);
    send_router(w, &m);
}

static void on_heartbeat(evutil_socket_t fd, short ev, void *arg) {
    worker_t *w = arg;
    if (++w->n_heartbeats % REGISTER_EVERY == 0) send_register(w);
    prefill_sched_stats_t st;
    prefill_sched_get_stats(w->sched, &st);
    radix_cache_stats_t rs;
    radix_cache_get_stats(w->cache, &rs);
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = PROTO_MSG_WORKER_HEARTBEAT;
    proto_worker_heartbeat_t *h = &m.u.worker_heartbeat;
    snprintf(h->worker_id, sizeof(h->worker_id), "%s", w->worker_id);
    h->role = PROTO_ROLE_PREFILL;
    h->epoch = w->epoch;
    h->timestamp_unix_us = unix_us();
    h->queued_prefill_tokens = st.queued_prefill_tokens;
    h->n_running = st.n_running;
    h->n_waiting = st.n_waiting + st.n_wait_dest;
    h->total_blocks = (uint32_t)kv_pool_geom(w->pool)->n_blocks;
    h->free_blocks = (uint32_t)kv_pool_n_free(w->pool);
    h->used_blocks = (uint32_t)kv_pool_n_used(w->pool);
    float occ = (float)w->last_step_tokens / (float)w->cfg.max_batch_tokens;
    h->batch_occupancy = occ > 1.0f ? 1.0f : occ;
    h->cache_hit_blocks = rs.hit_blocks;
    h->cache_lookup_blocks = rs.hit_blocks + rs.miss_blocks;
    h->busy_us = st.busy_us;
    h->steps = st.steps;
    h->idle_gaps = st.idle_gaps;
    h->idle_gap_us = st.idle_gap_us;
    h->idle_gap_max_us = st.idle_gap_max_us;
    send_router(w, &m);
}

static void on_signal(evutil_socket_t fd, short ev, void *arg) {
    worker_t *w = arg;
    LOG_INFO(COMP, "signal %d: shutting down", (int)fd);
    event_base_loopbreak(w->base);
}

/* ---- start-up / shutdown -------------------------------------------------- */

prefill_worker_config_t prefill_worker_config_default(void) {
    prefill_worker_config_t c = {
        .peer_bind = "tcp://127.0.0.1:*",
        .kv_events_bind = "tcp://127.0.0.1:*",
        .backend = "cpu",
        .threads = 0,
        .block_size = 16,
        .kv_blocks = 1024,
        .hash_seed = 0,
        .max_batch_tokens = 512,
        .kv_destination_timeout_ms = 10000,
        .transfer_timeout_ms = 30000,
        .heartbeat_ms = 500,
    };
    return c;
}

static void worker_free(worker_t *w) {
    struct event *evs[] = {w->ev_router, w->ev_peer, w->ev_ucx,  w->ev_hb, w->ev_step,
                           w->ev_deadline, w->ev_tick, w->ev_term, w->ev_int};
    for (size_t i = 0; i < sizeof(evs) / sizeof(evs[0]); i++)
        if (evs[i]) event_free(evs[i]);
    if (w->base) event_base_free(w->base);
    prefill_sched_free(w->sched); /* drops every request's blocks, no hooks */
    while (w->live) ctx_free(w, w->live);
    for (int i = 0; i < w->n_upeers; i++) kv_transfer_peer_free(w->upeers[i].peer);
    for (int i = 0; i < w->n_peers; i++) {
        proto_chan_free(w->peers[i].chan);
        free(w->peers[i].endpoint);
    }
    proto_chan_free(w->router);
    proto_chan_free(w->peer_router);
    proto_chan_free(w->pub);
    if (w->zctx) zmq_ctx_term(w->zctx);
    kv_transfer_pool_free(w->xpool);
    kv_transfer_engine_free(w->xeng);
    radix_cache_free(w->cache);
    kv_pool_free(w->pool);
    model_free(w->model);
    backend_free(w->be);
}

static baton_status_t pool_ref(void *c, int32_t id) { return kv_pool_ref(c, id); }
static baton_status_t pool_unref(void *c, int32_t id) { return kv_pool_unref(c, id); }
static int32_t pool_refcount(void *c, int32_t id) { return kv_pool_refcount(c, id); }

baton_status_t prefill_worker_run(const prefill_worker_config_t *cfg) {
    if (!cfg || !cfg->router || !cfg->model)
        return baton_error(BATON_ERR_INVALID_ARG, "--router and --model are required");
    if (cfg->block_size < 1 || cfg->kv_blocks < 1 || cfg->max_batch_tokens < 1 ||
        cfg->heartbeat_ms < 1)
        return baton_error(BATON_ERR_INVALID_ARG,
                           "--block-size, --kv-blocks, --max-batch-tokens and --heartbeat-ms "
                           "must be positive");
    worker_t w;
    memset(&w, 0, sizeof(w));
    w.cfg = *cfg;
    baton_status_t st = BATON_OK;
    if (cfg->worker_id) {
        if (strlen(cfg->worker_id) > PROTO_WORKER_ID_MAX)
            return baton_error(BATON_ERR_INVALID_ARG, "--worker-id longer than %d bytes",
                               PROTO_WORKER_ID_MAX);
        snprintf(w.worker_id, sizeof(w.worker_id), "%s", cfg->worker_id);
    } else {
        char host[64] = "host";
        gethostname(host, sizeof(host) - 1);
        for (char *c = host; *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                  (*c >= '0' && *c <= '9') || *c == '.' || *c == '-'))
                *c = '-';
        snprintf(w.worker_id, sizeof(w.worker_id), "prefill-%.40s-%d", host, (int)getpid());
    }
    w.epoch = unix_us();

    if ((st = file_sha256(cfg->model, w.model_sha256)) != BATON_OK) goto fail;
    if ((st = backend_create(cfg->backend, cfg->threads, &w.be)) != BATON_OK) goto fail;
    model_load_params_t lp = model_load_params_default();
    if (lp.max_batch_tokens < cfg->max_batch_tokens) lp.max_batch_tokens = cfg->max_batch_tokens;
    if ((st = model_load(cfg->model, w.be, &lp, &w.model)) != BATON_OK) goto fail;
    backend_kv_geom_t g = model_kv_geom(w.model, cfg->kv_blocks, cfg->block_size);
    if ((st = kv_pool_init(w.be, &g, &w.pool)) != BATON_OK) goto fail;
    radix_cache_pool_ops_t ops = {w.pool, pool_ref, pool_unref, pool_refcount};
    if ((st = radix_cache_init(&ops, w.epoch, &w.cache)) != BATON_OK) goto fail;
    if ((st = kv_transfer_engine_init(NULL, &w.xeng)) != BATON_OK) goto fail;
    kv_transfer_pool_desc_t pd = {.k_base = kv_pool_k_base(w.pool),
                                  .v_base = kv_pool_v_base(w.pool),
                                  .n_layers = g.n_layers,
                                  .n_blocks = g.n_blocks,
                                  .block_bytes = kv_pool_block_bytes(w.pool)};
    if ((st = kv_transfer_pool_register(w.xeng, &pd, &w.xpool)) != BATON_OK) goto fail;
    prefill_sched_config_t sc = prefill_sched_config_default();
    sc.max_batch_tokens = cfg->max_batch_tokens;
    sc.hash_seed = cfg->hash_seed;
    sc.kv_destination_timeout_ms = cfg->kv_destination_timeout_ms;
    prefill_sched_hooks_t hk = {.arg = &w, .send_layer = on_send_layer, .finished = on_finished};
    if ((st = prefill_sched_init(w.model, w.pool, w.cache, &sc, &hk, &w.sched)) != BATON_OK)
        goto fail;

    w.zctx = zmq_ctx_new();
    if (!w.zctx) {
        st = baton_error(BATON_ERR_IO, "zmq_ctx_new failed");
        goto fail;
    }
    proto_chan_opts_default((uint32_t)model_hparams(w.model)->n_vocab, &w.chan_opts);
    if ((st = proto_chan_open(w.zctx, PROTO_CHAN_DEALER, cfg->router, w.worker_id, &w.chan_opts,
                              &w.router)) != BATON_OK)
        goto fail;
    if ((st = proto_chan_open(w.zctx, PROTO_CHAN_ROUTER, cfg->peer_bind, NULL, &w.chan_opts,
                              &w.peer_router)) != BATON_OK)
        goto fail;
    if ((st = proto_chan_open(w.zctx, PROTO_CHAN_PUB, cfg->kv_events_bind, w.worker_id,
                              &w.chan_opts, &w.pub)) != BATON_OK)
        goto fail;
    if (cfg->peer_advertise)
        snprintf(w.peer_endpoint, sizeof(w.peer_endpoint), "%s", cfg->peer_advertise);
    else if ((st = proto_chan_endpoint(w.peer_router, w.peer_endpoint, sizeof(w.peer_endpoint))) !=
             BATON_OK)
        goto fail;
    if (cfg->kv_events_advertise)
        snprintf(w.events_endpoint, sizeof(w.events_endpoint), "%s", cfg->kv_events_advertise);
    else if ((st = proto_chan_endpoint(w.pub, w.events_endpoint, sizeof(w.events_endpoint))) !=
             BATON_OK)
        goto fail;

    w.base = event_base_new();
    if (!w.base) {
        st = baton_error(BATON_ERR_NO_MEMORY, "event_base_new failed");
        goto fail;
    }
    w.ev_router = event_new(w.base, proto_chan_fd(w.router), EV_READ | EV_PERSIST,
                            on_router_readable, &w);
    w.ev_peer = event_new(w.base, proto_chan_fd(w.peer_router), EV_READ | EV_PERSIST,
                          on_peer_readable, &w);
    w.ev_ucx = event_new(w.base, kv_transfer_engine_event_fd(w.xeng), EV_READ | EV_PERSIST,
                         on_ucx, &w);
    w.ev_hb = event_new(w.base, -1, EV_PERSIST, on_heartbeat, &w);
    w.ev_tick = event_new(w.base, -1, EV_PERSIST, on_tick, &w);
    w.ev_step = event_new(w.base, -1, 0, on_step, &w);
    w.ev_deadline = event_new(w.base, -1, 0, on_deadline, &w);
    w.ev_term = evsignal_new(w.base, SIGTERM, on_signal, &w);
    w.ev_int = evsignal_new(w.base, SIGINT, on_signal, &w);
    if (!w.ev_router || !w.ev_peer || !w.ev_ucx || !w.ev_hb || !w.ev_tick || !w.ev_step ||
        !w.ev_deadline || !w.ev_term || !w.ev_int) {
        st = baton_error(BATON_ERR_NO_MEMORY, "event_new failed");
        goto fail;
    }
    struct timeval hb = {.tv_sec = cfg->heartbeat_ms / 1000,
                         .tv_usec = (cfg->heartbeat_ms % 1000) * 1000};
    struct timeval tick = {.tv_sec = 0, .tv_usec = PROGRESS_MS * 1000};
    event_add(w.ev_router, NULL);
    event_add(w.ev_peer, NULL);
    event_add(w.ev_ucx, NULL);
    event_add(w.ev_hb, &hb);
    event_add(w.ev_tick, &tick);
    event_add(w.ev_term, NULL);
    event_add(w.ev_int, NULL);
    kv_transfer_engine_progress(w.xeng); /* arm the UCX fd */

    send_register(&w);
    on_heartbeat(-1, 0, &w);
    LOG_INFO(COMP,
             "worker %s: %d KV blocks of %d tokens, budget %d tokens/step, peer endpoint %s, KV "
             "events %s, router %s",
             w.worker_id, cfg->kv_blocks, cfg->block_size, cfg->max_batch_tokens, w.peer_endpoint,
             w.events_endpoint, cfg->router);
    if (proto_chan_readable(w.router)) event_active(w.ev_router, EV_READ, 0);
    if (proto_chan_readable(w.peer_router)) event_active(w.ev_peer, EV_READ, 0);
    event_base_dispatch(w.base);
    LOG_INFO(COMP, "worker %s stopped (%llu bad messages)", w.worker_id,
             (unsigned long long)w.bad_messages);
    worker_free(&w);
    return BATON_OK;
fail: {
    char msg[512];
    snprintf(msg, sizeof(msg), "%s", baton_last_error());
    worker_free(&w);
    return baton_error(st, "%s", msg);
}
}
