/* baton-decode: the decode worker process (decode_worker.h). One thread,
 * one libevent loop; everything the scheduler reports through its hooks is
 * turned into control messages here. */
#include "decode_worker/decode_worker.h"

#include <errno.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <openssl/evp.h>
#include <xxhash.h>
#include <zmq.h>

#include "common/gguf.h"
#include "common/kv_pool.h"
#include "common/kv_transfer.h"
#include "common/log.h"
#include "common/model.h"
#include "common/tokenizer.h"
#include "decode_worker/decode_sched.h"
#include "proto/messages.h"
#include "proto/zmq_channel.h"

#define COMP "decode"
#define MAX_PEERS 64
#define REGISTER_EVERY 20 /* heartbeats between repeated WorkerRegisters */

/* One request's process-side context (the scheduler's user pointer). */
typedef struct req_ctx {
    proto_request_id_t id;
    char prefill_worker_id[PROTO_WORKER_ID_MAX + 1];
    char *prefill_endpoint;
    struct req_ctx *next_failed; /* deferred abort list */
    struct req_ctx *prev, *next; /* every live context (freed at shutdown) */
    baton_status_t fail_status;
    char fail_msg[200];
} req_ctx_t;

typedef struct peer {
    char *endpoint;
    proto_chan_t *chan;
} peer_t;

typedef struct worker {
    decode_worker_config_t cfg;
    char worker_id[PROTO_WORKER_ID_MAX + 1];
    char peer_endpoint[256];
    uint64_t epoch;
    uint8_t model_sha256[32];
    backend_t *be;
    model_t *model;
    kv_pool_t *pool;
    kv_transfer_engine_t *xeng;
    kv_transfer_pool_t *xpool;
    uint8_t *ucx_addr;
    uint32_t ucx_addr_len;
    proto_pool_region_t regions[2];
    uint8_t *rkeys[2];
    decode_sched_t *sched;
    void *zctx;
    proto_chan_opts_t chan_opts;
    proto_chan_t *router, *peer_router;
    peer_t peers[MAX_PEERS];
    int n_peers;
    struct event_base *base;
    struct event *ev_router, *ev_peer, *ev_ucx, *ev_hb, *ev_step, *ev_deadline, *ev_term, *ev_int;
    req_ctx_t *failed; /* requests to abort after the current scheduler call */
    req_ctx_t *live;   /* contexts of requests the scheduler holds */
    bool step_scheduled;
    uint64_t n_heartbeats, bad_messages;
    /* TokenChunk scratch */
    proto_token_entry_t *ents;
    uint32_t *ent_tokens;
    proto_token_logprob_t *ent_top;
} worker_t;

decode_worker_config_t decode_worker_config_default(void) {
    decode_worker_config_t c;
    memset(&c, 0, sizeof(c));
    c.peer_bind = "tcp://127.0.0.1:*";
    c.backend = "cpu";
    c.block_size = 16;
    c.kv_blocks = 1024;
    c.max_batch = 64;
    c.watermark_blocks = 1;
    c.prefill_timeout_ms = 30000;
    c.heartbeat_ms = 500;
    return c;
}

static uint64_t unix_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void id_hex(const uint8_t *id, char out[33]) {
    for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", id[i]);
}

/* SHA-256 of the file (OpenSSL EVP), the model identity checked at pairing. */
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

/* ---- sending -------------------------------------------------------------- */

static void send_router(worker_t *w, const proto_msg_t *m) {
    baton_status_t st = proto_chan_send(w->router, NULL, m);
    if (st != BATON_OK)
        LOG_WARN(COMP, "send %s to the router failed: %s", proto_msg_type_name(m->type),
                 baton_last_error());
    /* a send may consume the fd's edge */
    if (proto_chan_readable(w->router)) event_active(w->ev_router, EV_READ, 0);
}

static void send_finished_error(worker_t *w, const proto_request_id_t *id, baton_status_t status,
                                const char *error, uint32_t n_prompt) {
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = PROTO_MSG_REQUEST_FINISHED;
    proto_request_finished_t *f = &m.u.request_finished;
    f->request_id = *id;
    snprintf(f->worker_id, sizeof(f->worker_id), "%s", w->worker_id);
    f->finish_reason = PROTO_FINISH_ERROR;
    f->status = status;
    f->error = (char *)error;
    f->prompt_tokens = n_prompt;
    send_router(w, &m);
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

static void live_remove(worker_t *w, req_ctx_t *ctx) {
    if (ctx->prev) ctx->prev->next = ctx->next;
    else if (w->live == ctx) w->live = ctx->next;
    if (ctx->next) ctx->next->prev = ctx->prev;
    ctx->prev = ctx->next = NULL;
}

static void live_add(worker_t *w, req_ctx_t *ctx) {
    ctx->prev = NULL;
    ctx->next = w->live;
    if (w->live) w->live->prev = ctx;
    w->live = ctx;
}

static void defer_fail(worker_t *w, req_ctx_t *ctx, baton_status_t st, const char *msg) {
    if (ctx->fail_status != BATON_OK) return;
    ctx->fail_status = st;
    snprintf(ctx->fail_msg, sizeof(ctx->fail_msg), "%s", msg);
    ctx->next_failed = w->failed;
    w->failed = ctx;
}

/* ---- scheduler hooks ------------------------------------------------------- */

static void on_reserved(void *arg, const uint8_t *request_id, void *user, const int32_t *block_ids,
                        int32_t n_blocks) {
    worker_t *w = arg;
    req_ctx_t *ctx = user;
    proto_chan_t *c = peer_chan(w, ctx->prefill_endpoint);
    if (!c) {
        defer_fail(w, ctx, BATON_ERR_PEER, "cannot open a channel to the prefill worker");
        return;
    }
    uint32_t *ids = malloc(sizeof(uint32_t) * (size_t)n_blocks);
    if (!ids) {
        defer_fail(w, ctx, BATON_ERR_NO_MEMORY, "KVDestination");
        return;
    }
    for (int32_t i = 0; i < n_blocks; i++) ids[i] = (uint32_t)block_ids[i];
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = PROTO_MSG_KV_DESTINATION;
    proto_kv_destination_t *d = &m.u.kv_destination;
    memcpy(d->request_id.bytes, request_id, 16);
    snprintf(d->decode_worker_id, sizeof(d->decode_worker_id), "%s", w->worker_id);
    d->decode_epoch = w->epoch;
    d->block_ids = ids;
    d->n_block_ids = (uint32_t)n_blocks;
    d->n_skip_blocks = 0;
    d->pool.regions = w->regions;
    d->pool.n_regions = 2;
    d->pool.n_blocks = (uint32_t)w->cfg.kv_blocks;
    d->pool.block_bytes = kv_pool_block_bytes(w->pool);
    d->ucx_address = w->ucx_addr;
    d->ucx_address_len = w->ucx_addr_len;
    baton_status_t st = proto_chan_send(c, NULL, &m);
    free(ids);
    if (st != BATON_OK) {
        char msg[200];
        snprintf(msg, sizeof(msg), "KVDestination to %s not sent: %s", ctx->prefill_endpoint,
                 baton_last_error());
        defer_fail(w, ctx, BATON_ERR_PEER, msg);
    }
}

static void on_token_chunk(void *arg, uint64_t step_id, const decode_sched_entry_t *e, int32_t n) {
    worker_t *w = arg;
    uint32_t *tok = w->ent_tokens;
    proto_token_logprob_t *top = w->ent_top;
    for (int32_t k = 0; k < n; k++) {
        proto_token_entry_t *p = &w->ents[k];
        memset(p, 0, sizeof(*p));
        memcpy(p->request_id.bytes, e[k].request_id, 16);
        p->token_ids = tok;
        p->n_token_ids = (uint32_t)e[k].n_tokens;
        for (int32_t j = 0; j < e[k].n_tokens; j++) tok[j] = (uint32_t)e[k].tokens[j];
        tok += e[k].n_tokens;
        if (e[k].logprobs) {
            p->logprobs = (float *)e[k].logprobs;
            p->n_logprobs = (uint32_t)e[k].n_tokens;
        }
        if (e[k].top && e[k].top_k > 0) {
            p->top_k = (uint32_t)e[k].top_k;
            p->top_logprobs = top;
            p->n_top_logprobs = (uint32_t)(e[k].n_tokens * e[k].top_k);
            for (int32_t j = 0; j < e[k].n_tokens * e[k].top_k; j++) {
                top[j].token = (uint32_t)e[k].top[j].token;
                top[j].logprob = e[k].top[j].logprob;
            }
            top += e[k].n_tokens * e[k].top_k;
        }
        p->finish_reason = (proto_finish_reason_t)e[k].finish;
    }
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = PROTO_MSG_TOKEN_CHUNK;
    snprintf(m.u.token_chunk.worker_id, sizeof(m.u.token_chunk.worker_id), "%s", w->worker_id);
    m.u.token_chunk.step_id = step_id;
    m.u.token_chunk.entries = w->ents;
    m.u.token_chunk.n_entries = (uint32_t)n;
    send_router(w, &m);
}

/* After each layer of a forward step: serve incoming KV puts (TCP emulates
 * RMA with active messages that need this side's progress), so a prefill
 * worker's transfer is not held up by a whole decode step. The decode side
 * starts no transfers, so no transfer callback can run in here. */
static void on_layer_done(void *arg) {
    worker_t *w = arg;
    kv_transfer_engine_progress(w->xeng);
}

static void on_finished(void *arg, const decode_sched_result_t *r) {
    worker_t *w = arg;
    req_ctx_t *ctx = r->user;
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = PROTO_MSG_REQUEST_FINISHED;
    proto_request_finished_t *f = &m.u.request_finished;
    memcpy(f->request_id.bytes, r->request_id, 16);
    snprintf(f->worker_id, sizeof(f->worker_id), "%s", w->worker_id);
    f->finish_reason = (proto_finish_reason_t)r->finish;
    f->status = r->status;
    f->error = (char *)r->error;
    if (ctx->fail_status != BATON_OK) { /* aborted by flush_failed: report why */
        f->finish_reason = PROTO_FINISH_ERROR;
        f->status = ctx->fail_status;
        f->error = ctx->fail_msg;
    }
    f->prompt_tokens = (uint32_t)r->n_prompt_tokens;
    f->completion_tokens = (uint32_t)r->n_generated;
    f->cached_tokens = r->prefill.cached_tokens > 0 ? (uint32_t)r->prefill.cached_tokens : 0;
    f->timings.queue_us = r->queue_us + r->prefill.queue_us;
    f->timings.prefill_us = r->prefill.compute_us;
    f->timings.transfer_us = r->prefill.transfer_us;
    f->timings.transfer_bytes = r->prefill.transfer_bytes;
    f->timings.decode_us = r->decode_us;
    f->prefill_device_us = r->prefill.device_us;
    f->decode_device_us = r->device_us;
    send_router(w, &m);
    char hex[33];
    id_hex(r->request_id, hex);
    LOG_DEBUG(COMP, "request %s finished (%d): %d tokens", hex, (int)r->finish, r->n_generated);
    /* a deferred failure of this request is moot now */
    for (req_ctx_t **pp = &w->failed; *pp; pp = &(*pp)->next_failed)
        if (*pp == ctx) {
            *pp = ctx->next_failed;
            break;
        }
    live_remove(w, ctx);
    free(ctx->prefill_endpoint);
    free(ctx);
}

/* Aborts the requests whose KVDestination could not be sent, reporting the
 * reason (the abort's own RequestFinished is replaced by the error). */
static void flush_failed(worker_t *w) {
    while (w->failed) {
        req_ctx_t *ctx = w->failed;
        w->failed = ctx->next_failed;
        LOG_WARN(COMP, "%s", ctx->fail_msg);
        /* its finished hook reports fail_status and frees ctx */
        decode_sched_abort(w->sched, ctx->id.bytes);
    }
}

/* ---- incoming messages ---------------------------------------------------- */

static void schedule_step(worker_t *w) {
    if (!w->step_scheduled && decode_sched_has_work(w->sched)) {
        w->step_scheduled = true;
        event_active(w->ev_step, EV_TIMEOUT, 0);
    }
    int64_t dl = decode_sched_next_deadline_us(w->sched);
    if (dl >= 0) {
        struct timeval tv = {.tv_sec = dl / 1000000, .tv_usec = dl % 1000000 + 1000};
        event_add(w->ev_deadline, &tv);
    }
}

static void handle_decode_request(worker_t *w, const proto_decode_request_t *q) {
    const int32_t B = decode_sched_block_size(w->sched);
    char err[256] = "";
    baton_status_t st = BATON_OK;
    uint32_t want = (q->n_prompt_tokens + (uint32_t)B - 1) / (uint32_t)B;
    if (q->n_blocks != want) {
        st = BATON_ERR_OUT_OF_RANGE;
        snprintf(err, sizeof(err), "n_blocks %u does not match %u prompt tokens at block size %d",
                 q->n_blocks, q->n_prompt_tokens, B);
    } else if (q->n_token_ids != 0 && q->n_token_ids != q->n_prompt_tokens) {
        st = BATON_ERR_OUT_OF_RANGE;
        snprintf(err, sizeof(err), "%u token ids for a prompt of %u", q->n_token_ids, q->n_prompt_tokens);
    } else if (!q->prefill_endpoint || !*q->prefill_endpoint) {
        st = BATON_ERR_INVALID_ARG;
        snprintf(err, sizeof(err), "no prefill_endpoint to send the KVDestination to");
    } else if (q->sampling.n_stop_token_ids > SAMPLING_MAX_STOP_IDS) {
        st = BATON_ERR_OUT_OF_RANGE;
        snprintf(err, sizeof(err), "%u stop token ids (this worker takes %d)",
                 q->sampling.n_stop_token_ids, SAMPLING_MAX_STOP_IDS);
    } else if (q->sampling.n_logit_bias > PROTO_MAX_LOGIT_BIAS) {
        st = BATON_ERR_OUT_OF_RANGE;
        snprintf(err, sizeof(err), "%u logit_bias entries (at most %d)", q->sampling.n_logit_bias,
                 PROTO_MAX_LOGIT_BIAS);
    }
    if (st != BATON_OK) {
        send_finished_error(w, &q->request_id, st, err, q->n_prompt_tokens);
        return;
    }
    req_ctx_t *ctx = calloc(1, sizeof(*ctx));
    int32_t *prompt = q->n_token_ids ? malloc(sizeof(int32_t) * q->n_token_ids) : NULL;
    if (!ctx || (q->n_token_ids && !prompt) || !(ctx->prefill_endpoint = strdup(q->prefill_endpoint))) {
        if (ctx) free(ctx->prefill_endpoint);
        free(ctx);
        free(prompt);
        send_finished_error(w, &q->request_id, BATON_ERR_NO_MEMORY, "out of memory", q->n_prompt_tokens);
        return;
    }
    ctx->id = q->request_id;
    snprintf(ctx->prefill_worker_id, sizeof(ctx->prefill_worker_id), "%s", q->prefill_worker_id);
    for (uint32_t i = 0; i < q->n_token_ids; i++) prompt[i] = (int32_t)q->token_ids[i];
    int32_t stop[SAMPLING_MAX_STOP_IDS];
    for (uint32_t i = 0; i < q->sampling.n_stop_token_ids; i++) stop[i] = (int32_t)q->sampling.stop_token_ids[i];
    decode_sched_request_t r = {.request_id = q->request_id.bytes,
                                .n_prompt_tokens = (int32_t)q->n_prompt_tokens,
                                .prompt_tokens = prompt,
                                .max_tokens = (int32_t)q->sampling.max_tokens,
                                .ignore_eos = q->sampling.ignore_eos,
                                .logprobs = q->sampling.logprobs,
                                .user = ctx};
    sampling_params_t *sp = &r.sampling;
    *sp = sampling_params_default();
    sp->temperature = q->sampling.temperature;
    sp->top_k = (int32_t)q->sampling.top_k;
    sp->top_p = q->sampling.top_p;
    sp->min_p = q->sampling.min_p;
    sp->repetition_penalty = q->sampling.repetition_penalty;
    sp->presence_penalty = q->sampling.presence_penalty;
    sp->frequency_penalty = q->sampling.frequency_penalty;
    sp->seed = q->sampling.seed;
    sp->n_logprobs = (int32_t)q->sampling.top_logprobs;
    sp->stop_ids = stop;
    sp->n_stop_ids = (int32_t)q->sampling.n_stop_token_ids;
    sampling_logit_bias_t bias[PROTO_MAX_LOGIT_BIAS]; /* copied by sampler_init in submit */
    for (uint32_t i = 0; i < q->sampling.n_logit_bias; i++)
        bias[i] = (sampling_logit_bias_t){(int32_t)q->sampling.logit_bias[i].token,
                                          q->sampling.logit_bias[i].bias};
    sp->logit_bias = bias;
    sp->n_logit_bias = (int32_t)q->sampling.n_logit_bias;
    live_add(w, ctx);
    st = decode_sched_submit(w->sched, &r);
    free(prompt);
    if (st != BATON_OK) {
        snprintf(err, sizeof(err), "%s", baton_last_error());
        LOG_INFO(COMP, "decode request refused: %s", err);
        send_finished_error(w, &q->request_id, st, err, q->n_prompt_tokens);
        live_remove(w, ctx);
        free(ctx->prefill_endpoint);
        free(ctx);
        return;
    }
    flush_failed(w);
}

static void handle_prefill_done(worker_t *w, const proto_prefill_done_t *p) {
    sampling_logprob_t top[SAMPLING_MAX_LOGPROBS];
    int32_t n_top = p->n_top_logprobs > SAMPLING_MAX_LOGPROBS ? SAMPLING_MAX_LOGPROBS : (int32_t)p->n_top_logprobs;
    for (int32_t i = 0; i < n_top; i++) top[i] = (sampling_logprob_t){(int32_t)p->top_logprobs[i].token,
                                                                     p->top_logprobs[i].logprob};
    decode_sched_prefill_t d = {.status = (baton_status_t)p->status, .error = p->error,
                                .first_token = (int32_t)p->first_token,
                                .first_logprob = p->first_logprob, .top = top, .n_top = n_top,
                                .n_blocks_written = (int32_t)p->n_blocks_written,
                                .queue_us = p->queue_us, .compute_us = p->compute_us,
                                .transfer_us = p->transfer_us, .transfer_bytes = p->bytes_written,
                                .cached_tokens = (int32_t)p->cached_tokens,
                                .device_us = p->device_us};
    baton_status_t st = decode_sched_prefill_done(w->sched, p->request_id.bytes, &d);
    if (st != BATON_OK) {
        char hex[33];
        id_hex(p->request_id.bytes, hex);
        LOG_WARN(COMP, "PrefillDone for %s from %s dropped: %s", hex, p->prefill_worker_id,
                 baton_last_error());
        w->bad_messages++;
    }
}

static void on_message(void *arg, proto_chan_t *chan, const char *peer, proto_msg_t *msg) {
    worker_t *w = arg;
    switch (msg->type) {
    case PROTO_MSG_DECODE_REQUEST:
        handle_decode_request(w, &msg->u.decode_request);
        break;
    case PROTO_MSG_PREFILL_DONE:
        handle_prefill_done(w, &msg->u.prefill_done);
        break;
    case PROTO_MSG_ABORT:
        if (decode_sched_abort(w->sched, msg->u.abort.request_id.bytes) != BATON_OK)
            LOG_DEBUG(COMP, "abort for an unknown request");
        break;
    default:
        LOG_WARN(COMP, "unexpected %s message from '%s' dropped", proto_msg_type_name(msg->type),
                 peer ? peer : "");
        w->bad_messages++;
        break;
    }
    flush_failed(w);
}

static void drain(worker_t *w, proto_chan_t *c) {
    for (int i = 0; i < 64; i++) /* bounded: a flood cannot starve the steps */
        if (proto_chan_drain(c, on_message, w, 256, NULL) != BATON_ERR_BUSY) break;
    schedule_step(w);
}

static void on_router_readable(evutil_socket_t fd, short ev, void *arg) { drain(arg, ((worker_t *)arg)->router); }
static void on_peer_readable(evutil_socket_t fd, short ev, void *arg) { drain(arg, ((worker_t *)arg)->peer_router); }

static void on_ucx(evutil_socket_t fd, short ev, void *arg) {
    worker_t *w = arg;
    if (kv_transfer_engine_progress(w->xeng) != BATON_OK)
        LOG_WARN(COMP, "UCX progress: %s", baton_last_error());
}

static void on_step(evutil_socket_t fd, short ev, void *arg) {
    worker_t *w = arg;
    int32_t n = 0;
    w->step_scheduled = false;
    if (decode_sched_step(w->sched, &n) != BATON_OK)
        LOG_WARN(COMP, "decode step: %s", baton_last_error());
    flush_failed(w);
    /* drain the sockets between steps (their fds are edge-like) */
    if (proto_chan_readable(w->router)) drain(w, w->router);
    if (proto_chan_readable(w->peer_router)) drain(w, w->peer_router);
    /* a step that ran nothing waits for the next input or deadline, so the
     * loop never spins on work it cannot do yet */
    if (n > 0) schedule_step(w);
}

static void on_deadline(evutil_socket_t fd, short ev, void *arg) {
    worker_t *w = arg;
    int32_t n = 0;
    /* a step expires the timed-out reservations even with nothing running */
    decode_sched_step(w->sched, &n);
    flush_failed(w);
    schedule_step(w);
}

static void send_register(worker_t *w) {
    const model_hparams_t *hp = model_hparams(w->model);
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = PROTO_MSG_WORKER_REGISTER;
    proto_worker_register_t *r = &m.u.worker_register;
    snprintf(r->worker_id, sizeof(r->worker_id), "%s", w->worker_id);
    r->role = PROTO_ROLE_DECODE;
    r->epoch = w->epoch;
    r->zmq_endpoint = w->peer_endpoint;
    memcpy(r->model_sha256, w->model_sha256, 32);
    r->vocab_size = (uint32_t)hp->n_vocab;
    const backend_kv_geom_t *g = kv_pool_geom(w->pool);
    r->kv.n_layers = (uint32_t)g->n_layers;
    r->kv.n_kv_heads = (uint32_t)g->n_kv_heads;
    r->kv.head_dim = (uint32_t)g->head_dim;
    r->kv.block_size = (uint32_t)g->block_size;
    r->kv.dtype = g->dtype == BACKEND_DTYPE_F32 ? PROTO_KV_DTYPE_F32
                  : g->dtype == BACKEND_DTYPE_F16 ? PROTO_KV_DTYPE_F16 : PROTO_KV_DTYPE_BF16;
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(w->cfg.hash_seed >> (8 * i));
    r->kv.hash_seed_id = XXH3_64bits(le, sizeof(le));
    r->ucx_address = w->ucx_addr;
    r->ucx_address_len = w->ucx_addr_len;
    r->pool.regions = w->regions;
    r->pool.n_regions = 2;
    r->pool.n_blocks = (uint32_t)g->n_blocks;
    r->pool.block_bytes = kv_pool_block_bytes(w->pool);
    /* serving configuration (issue 6: /v1/serving_config) */
    char cpu[256];
    proto_host_cpu_model(cpu, sizeof(cpu));
    const backend_t *be = model_backend(w->model);
    r->max_batch = (uint32_t)w->cfg.max_batch;
    r->cpu_model = cpu;
    r->backend = (char *)be->ops->name;
    r->compute_dtype = (char *)backend_dtype_name(be->weight_dtype);
    send_router(w, &m);
}

static void on_heartbeat(evutil_socket_t fd, short ev, void *arg) {
    worker_t *w = arg;
    if (++w->n_heartbeats % REGISTER_EVERY == 0) send_register(w);
    decode_sched_stats_t st;
    decode_sched_get_stats(w->sched, &st);
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = PROTO_MSG_WORKER_HEARTBEAT;
    proto_worker_heartbeat_t *h = &m.u.worker_heartbeat;
    snprintf(h->worker_id, sizeof(h->worker_id), "%s", w->worker_id);
    h->role = PROTO_ROLE_DECODE;
    h->epoch = w->epoch;
    h->timestamp_unix_us = unix_us();
    h->n_running = st.n_running + st.n_ready;
    h->n_waiting = st.n_queued + st.n_preempted;
    h->total_blocks = (uint32_t)w->cfg.kv_blocks;
    h->free_blocks = (uint32_t)kv_pool_n_free(w->pool);
    h->used_blocks = (uint32_t)kv_pool_n_used(w->pool);
    h->batch_occupancy = st.n_running > 0 ? st.batch_occupancy : 0.0f;
    h->preemptions = st.preemptions;
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

/* The pool's wire fields. ucx_address carries the whole
 * kv_transfer_pool_pack descriptor (UCX worker address, region bases,
 * packed rkeys, checksum): a prefill worker hands it unchanged to
 * kv_transfer_peer_connect. pool.regions repeat K and V (base, length,
 * packed rkey) for readers of the schema, taken from the descriptor's
 * variable part (header of KVT_HEADER_BYTES = 56 bytes in
 * common/kv_transfer.c; the total length is checked). */
static baton_status_t export_pool(worker_t *w) {
    void *desc = NULL;
    size_t len = 0;
    baton_status_t st = kv_transfer_pool_pack(w->xpool, &desc, &len);
    if (st != BATON_OK) return st;
    kv_transfer_remote_info_t info;
    st = kv_transfer_descriptor_parse(desc, len, &info);
    const uint8_t *p = desc;
    const size_t hdr = 56;
    uint32_t la = 0, lk = 0, lv = 0;
    if (st == BATON_OK) {
        memcpy(&la, p + 40, 4);
        memcpy(&lk, p + 44, 4);
        memcpy(&lv, p + 48, 4);
        if (hdr + (size_t)la + lk + lv != len || lk == 0 || lv == 0)
            st = baton_error(BATON_ERR_INTERNAL, "KV pool descriptor layout is not the expected v1 (%zu bytes)", len);
    }
    if (st == BATON_OK) {
        const uint8_t *q = p + hdr;
        w->rkeys[0] = malloc(lk);
        w->rkeys[1] = malloc(lv);
        if (!w->rkeys[0] || !w->rkeys[1]) {
            st = baton_error(BATON_ERR_NO_MEMORY, "pool descriptor");
        } else {
            memcpy(w->rkeys[0], q + la, lk);
            memcpy(w->rkeys[1], q + la + lk, lv);
            uint64_t region = (uint64_t)info.n_layers * (uint64_t)info.n_blocks * info.block_bytes;
            w->regions[0] = (proto_pool_region_t){info.k_addr, region, w->rkeys[0], lk};
            w->regions[1] = (proto_pool_region_t){info.v_addr, region, w->rkeys[1], lv};
            w->ucx_addr = desc; /* owned from here */
            w->ucx_addr_len = (uint32_t)len;
            desc = NULL;
        }
    }
    free(desc);
    return st;
}

static baton_status_t load_eog(const char *path, int32_t *ids, int32_t *n) {
    gguf_file_t *f = NULL;
    tokenizer_t *tok = NULL;
    baton_status_t st = gguf_open(path, &f);
    if (st == BATON_OK) st = tokenizer_load(f, &tok);
    *n = 0;
    if (st == BATON_OK)
        for (int32_t t = 0; t < tokenizer_n_vocab(tok) && *n < DECODE_SCHED_MAX_EOG; t++)
            if (tokenizer_is_eog(tok, t)) ids[(*n)++] = t;
    tokenizer_free(tok);
    gguf_close(f);
    return st;
}

static void worker_free(worker_t *w) {
    struct event *evs[] = {w->ev_router, w->ev_peer, w->ev_ucx, w->ev_hb,
                           w->ev_step, w->ev_deadline, w->ev_term, w->ev_int};
    for (size_t i = 0; i < sizeof(evs) / sizeof(evs[0]); i++)
        if (evs[i]) event_free(evs[i]);
    if (w->base) event_base_free(w->base);
    /* requests still held: their contexts are the scheduler's users */
    decode_sched_free(w->sched);
    while (w->live) {
        req_ctx_t *c = w->live;
        w->live = c->next;
        free(c->prefill_endpoint);
        free(c);
    }
    for (int i = 0; i < w->n_peers; i++) {
        proto_chan_free(w->peers[i].chan);
        free(w->peers[i].endpoint);
    }
    proto_chan_free(w->router);
    proto_chan_free(w->peer_router);
    if (w->zctx) zmq_ctx_term(w->zctx);
    kv_transfer_pool_free(w->xpool);
    kv_transfer_engine_free(w->xeng);
    kv_pool_free(w->pool);
    model_free(w->model);
    backend_free(w->be);
    free(w->ucx_addr);
    free(w->rkeys[0]);
    free(w->rkeys[1]);
    free(w->ents);
    free(w->ent_tokens);
    free(w->ent_top);
}

baton_status_t decode_worker_run(const decode_worker_config_t *cfg) {
    if (!cfg || !cfg->router || !cfg->model)
        return baton_error(BATON_ERR_INVALID_ARG, "--router and --model are required");
    worker_t w;
    memset(&w, 0, sizeof(w));
    w.cfg = *cfg;
    baton_status_t st = BATON_OK;
    if (cfg->worker_id) {
        if (strlen(cfg->worker_id) > PROTO_WORKER_ID_MAX)
            return baton_error(BATON_ERR_INVALID_ARG, "--worker-id longer than %d bytes", PROTO_WORKER_ID_MAX);
        snprintf(w.worker_id, sizeof(w.worker_id), "%s", cfg->worker_id);
    } else {
        char host[64] = "host";
        gethostname(host, sizeof(host) - 1);
        for (char *c = host; *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                  *c == '.' || *c == '-'))
                *c = '-';
        snprintf(w.worker_id, sizeof(w.worker_id), "decode-%.40s-%d", host, (int)getpid());
    }
    w.epoch = unix_us();

    int32_t eog[DECODE_SCHED_MAX_EOG], n_eog = 0;
    if ((st = file_sha256(cfg->model, w.model_sha256)) != BATON_OK) goto fail;
    if ((st = load_eog(cfg->model, eog, &n_eog)) != BATON_OK) goto fail;
    if ((st = backend_create(cfg->backend, cfg->threads, &w.be)) != BATON_OK) goto fail;
    model_load_params_t lp = model_load_params_default();
    if (lp.max_batch_tokens < cfg->max_batch) lp.max_batch_tokens = cfg->max_batch;
    if ((st = model_load(cfg->model, w.be, &lp, &w.model)) != BATON_OK) goto fail;
    backend_kv_geom_t g = model_kv_geom(w.model, cfg->kv_blocks, cfg->block_size);
    if ((st = kv_pool_init(w.be, &g, &w.pool)) != BATON_OK) goto fail;
    if ((st = kv_transfer_engine_init(NULL, &w.xeng)) != BATON_OK) goto fail;
    kv_transfer_pool_desc_t pd = {.k_base = kv_pool_k_base(w.pool), .v_base = kv_pool_v_base(w.pool),
                                  .n_layers = g.n_layers, .n_blocks = g.n_blocks,
                                  .block_bytes = kv_pool_block_bytes(w.pool)};
    if ((st = kv_transfer_pool_register(w.xeng, &pd, &w.xpool)) != BATON_OK) goto fail;
    if ((st = export_pool(&w)) != BATON_OK) goto fail;

    decode_sched_config_t sc = decode_sched_config_default();
    sc.max_batch = cfg->max_batch;
    sc.watermark_blocks = cfg->watermark_blocks;
    sc.prefill_timeout_ms = cfg->prefill_timeout_ms;
    sc.max_context = cfg->max_context;
    sc.max_recompute_tokens = lp.max_batch_tokens;
    sc.eog_ids = eog;
    sc.n_eog_ids = n_eog;
    decode_sched_hooks_t hk = {.arg = &w, .reserved = on_reserved, .token_chunk = on_token_chunk,
                               .finished = on_finished, .layer_done = on_layer_done};
    if ((st = decode_sched_init(w.model, w.pool, &sc, &hk, &w.sched)) != BATON_OK) goto fail;
    w.ents = calloc((size_t)cfg->max_batch, sizeof(proto_token_entry_t));
    w.ent_tokens = calloc((size_t)cfg->max_batch * 4, sizeof(uint32_t));
    w.ent_top = calloc((size_t)cfg->max_batch * 4 * SAMPLING_MAX_LOGPROBS, sizeof(proto_token_logprob_t));
    if (!w.ents || !w.ent_tokens || !w.ent_top) {
        st = baton_error(BATON_ERR_NO_MEMORY, "chunk scratch");
        goto fail;
    }

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
    if (cfg->peer_advertise)
        snprintf(w.peer_endpoint, sizeof(w.peer_endpoint), "%s", cfg->peer_advertise);
    else if ((st = proto_chan_endpoint(w.peer_router, w.peer_endpoint, sizeof(w.peer_endpoint))) != BATON_OK)
        goto fail;

    w.base = event_base_new();
    if (!w.base) {
        st = baton_error(BATON_ERR_NO_MEMORY, "event_base_new failed");
        goto fail;
    }
    w.ev_router = event_new(w.base, proto_chan_fd(w.router), EV_READ | EV_PERSIST, on_router_readable, &w);
    w.ev_peer = event_new(w.base, proto_chan_fd(w.peer_router), EV_READ | EV_PERSIST, on_peer_readable, &w);
    w.ev_ucx = event_new(w.base, kv_transfer_engine_event_fd(w.xeng), EV_READ | EV_PERSIST, on_ucx, &w);
    w.ev_hb = event_new(w.base, -1, EV_PERSIST, on_heartbeat, &w);
    w.ev_step = event_new(w.base, -1, 0, on_step, &w);
    w.ev_deadline = event_new(w.base, -1, 0, on_deadline, &w);
    w.ev_term = evsignal_new(w.base, SIGTERM, on_signal, &w);
    w.ev_int = evsignal_new(w.base, SIGINT, on_signal, &w);
    if (!w.ev_router || !w.ev_peer || !w.ev_ucx || !w.ev_hb || !w.ev_step || !w.ev_deadline ||
        !w.ev_term || !w.ev_int) {
        st = baton_error(BATON_ERR_NO_MEMORY, "event_new failed");
        goto fail;
    }
    struct timeval hb = {.tv_sec = cfg->heartbeat_ms / 1000, .tv_usec = (cfg->heartbeat_ms % 1000) * 1000};
    event_add(w.ev_router, NULL);
    event_add(w.ev_peer, NULL);
    event_add(w.ev_ucx, NULL);
    event_add(w.ev_hb, &hb);
    event_add(w.ev_term, NULL);
    event_add(w.ev_int, NULL);
    kv_transfer_engine_progress(w.xeng); /* arm the UCX fd */

    send_register(&w);
    on_heartbeat(-1, 0, &w);
    LOG_INFO(COMP, "worker %s: %d KV blocks of %d tokens, peer endpoint %s, router %s, %d eog ids",
             w.worker_id, cfg->kv_blocks, cfg->block_size, w.peer_endpoint, cfg->router, n_eog);
    if (proto_chan_readable(w.router)) event_active(w.ev_router, EV_READ, 0);
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
