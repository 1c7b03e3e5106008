/* baton-worker: the colocated worker (issue 4 "Colocated role", cluster.md
 * "Colocated").
 *
 *   baton-worker --role both --router tcp://HOST:PORT --model FILE [options]
 *
 * One process, one model, one KV pool, one radix prefix cache: the prefill
 * scheduler (prefill_worker/prefill_sched.h) computes each prompt with
 * `local` set, and its finished block table is handed to the decode
 * scheduler (decode_worker/decode_sched.h, decode_sched_adopt) in-process:
 * no UCX, no KVDestination. Towards the router it speaks the same control
 * plane as the two disaggregated workers: WorkerRegister (role "both") at
 * start, WorkerHeartbeat every 500 ms, TokenChunk per decode step,
 * RequestFinished per request, KVEvents on its PUB socket (KVResync answered
 * with the full set). The router sends both the PrefillRequest and the
 * DecodeRequest of a request to this worker ("a colocated worker is its own
 * D", router/route.h); they may arrive in either order and are paired by
 * request id (the first waits at most --pair-timeout-ms for the second).
 *
 * --role prefill / --role decode run the disaggregated workers: the process
 * replaces itself (execv) with baton-prefill / baton-decode, which are built
 * from the same scheduler libraries, passing every other option through.
 *
 * Loop (one thread): poll the sockets (timeout 0 while a scheduler has
 * work), drain them, send a heartbeat when due, run one prefill step and
 * one decode step, publish KV events, expire unpaired requests. SIGINT /
 * SIGTERM end the loop; everything is released before exit. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <xxhash.h>
#include <zmq.h>

#include "common/gguf.h"
#include "common/kv_pool.h"
#include "common/log.h"
#include "common/model.h"
#include "common/radix_cache.h"
#include "common/sampling.h"
#include "common/status.h"
#include "common/tokenizer.h"
#include "decode_worker/decode_sched.h"
#include "kernels/backend.h"
#include "prefill_worker/prefill_sched.h"
#include "proto/messages.h"
#include "proto/zmq_channel.h"

#define COMP "worker"
#define HEARTBEAT_US 500000u
#define KV_EVENT_PART_MAX 4096 /* stored entries per full-set part */

/* ---- options ------------------------------------------------------------- */

typedef struct worker_opts {
    const char *role;
    const char *router;
    const char *worker_id;
    const char *peer_bind;
    const char *peer_advertise;
    const char *kv_events_bind;
    const char *model;
    const char *backend;
    int threads;
    int block_size;
    int kv_blocks;
    uint64_t hash_seed;
    int max_batch_tokens;
    int max_batch;
    uint32_t pair_timeout_ms;
} worker_opts_t;

static void usage(FILE *f) {
    fprintf(f,
            "usage: baton-worker --role both|prefill|decode --router tcp://HOST:PORT --model FILE\n"
            "  --worker-id ID          (default both-HOSTNAME-PID)\n"
            "  --peer-bind EP          worker-to-worker ROUTER bind (default tcp://127.0.0.1:0)\n"
            "  --peer-advertise EP     endpoint advertised instead of the bound one\n"
            "  --kv-events-bind EP     KV-event PUB bind (default tcp://127.0.0.1:0)\n"
            "  --threads N             CPU threads (default 1)\n"
            "  --backend NAME          cpu or cuda (default cpu)\n"
            "  --block-size N          tokens per KV block (default 16)\n"
            "  --kv-blocks N           KV pool blocks (default 512)\n"
            "  --hash-seed S           block-hash cluster secret (default 0)\n"
            "  --max-batch-tokens N    prefill token budget per step (default 512)\n"
            "  --max-batch N           decode sequences per step (default 64)\n"
            "  --pair-timeout-ms N     wait for the other half of a request (default 10000)\n"
            "--role prefill / decode execute baton-prefill / baton-decode with the other options.\n");
}

static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
    if (!s || !*s || *s == '-') return 0;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* Returns 0 on success, 2 on a usage error (message printed). */
static int parse_opts(int argc, char **argv, worker_opts_t *o) {
    memset(o, 0, sizeof(*o));
    o->role = "both";
    o->peer_bind = "tcp://127.0.0.1:0";
    o->kv_events_bind = "tcp://127.0.0.1:0";
    o->backend = "cpu";
    o->threads = 1;
    o->block_size = 16;
    o->kv_blocks = 512;
    o->max_batch_tokens = 512;
    o->max_batch = 64;
    o->pair_timeout_ms = 10000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "baton-worker: %s needs a value (or is unknown)\n", a);
            return 2;
        }
        const char *v = argv[++i];
        uint64_t u;
#define NUM(name, lo, hi, dst)                                                        \
    if (!strcmp(a, name)) {                                                           \
        if (!parse_u64(v, lo, hi, &u)) {                                              \
            fprintf(stderr, "baton-worker: bad %s '%s' (%llu..%llu)\n", name, v,       \
                    (unsigned long long)(lo), (unsigned long long)(hi));              \
            return 2;                                                                 \
        }                                                                             \
        dst = u;                                                                      \
        continue;                                                                     \
    }
        NUM("--threads", 1, 1024, o->threads)
        NUM("--block-size", 1, 4096, o->block_size)
        NUM("--kv-blocks", 1, 1u << 24, o->kv_blocks)
        NUM("--hash-seed", 0, UINT64_MAX, o->hash_seed)
        NUM("--max-batch-tokens", 1, 1u << 20, o->max_batch_tokens)
        NUM("--max-batch", 1, 4096, o->max_batch)
        NUM("--pair-timeout-ms", 1, 3600000, o->pair_timeout_ms)
#undef NUM
        if (!strcmp(a, "--role")) o->role = v;
        else if (!strcmp(a, "--router")) o->router = v;
        else if (!strcmp(a, "--worker-id")) o->worker_id = v;
        else if (!strcmp(a, "--peer-bind")) o->peer_bind = v;
        else if (!strcmp(a, "--peer-advertise")) o->peer_advertise = v;
        else if (!strcmp(a, "--kv-events-bind")) o->kv_events_bind = v;
        else if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--backend")) o->backend = v;
        else {
            fprintf(stderr, "baton-worker: unknown option %s\n", a);
            return 2;
        }
    }
    if (strcmp(o->role, "both") && strcmp(o->role, "prefill") && strcmp(o->role, "decode")) {
        fprintf(stderr, "baton-worker: --role must be both, prefill or decode (got '%s')\n", o->role);
        return 2;
    }
    if (!strcmp(o->role, "both") && (!o->router || !o->model)) {
        fprintf(stderr, "baton-worker: --router and --model are required\n");
        return 2;
    }
    return 0;
}

/* --role prefill|decode: exec the sibling binary with the other options.
 * Looked up next to this executable, then in ../prefill_worker or
 * ../decode_worker (the build tree), then on PATH. */
static int exec_role(const char *role, int argc, char **argv) {
    const char *bin = !strcmp(role, "prefill") ? "baton-prefill" : "baton-decode";
    const char *sub = !strcmp(role, "prefill") ? "prefill_worker" : "decode_worker";
    char **args = calloc((size_t)argc + 1, sizeof(char *));
    if (!args) return 1;
    int n = 0;
    args[n++] = (char *)bin;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--role") && i + 1 < argc) {
            i++;
            continue;
        }
        args[n++] = argv[i];
    }
    args[n] = NULL;
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (len > 0) {
        self[len] = 0;
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = 0;
            char path[PATH_MAX + 64];
            snprintf(path, sizeof(path), "%s/%s", self, bin);
            if (access(path, X_OK) == 0) execv(path, args);
            snprintf(path, sizeof(path), "%s/../%s/%s", self, sub, bin);
            if (access(path, X_OK) == 0) execv(path, args);
        }
    }
    execvp(bin, args);
    fprintf(stderr, "baton-worker: cannot run %s for --role %s: %s\n", bin, role, strerror(errno));
    free(args);
    return 1;
}

/* ---- helpers --------------------------------------------------------------- */

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static uint64_t unix_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* SHA-256 of the whole file (OpenSSL EVP), the model identity of
 * WorkerRegister.model_sha256. */
static baton_status_t file_sha256(const char *path, uint8_t out[PROTO_SHA256_BYTES]) {
    FILE *f = fopen(path, "rb");
    if (!f) return baton_error(BATON_ERR_IO, "%s: %s", path, strerror(errno));
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char *buf = malloc(1 << 20);
    baton_status_t st = BATON_OK;
    if (!ctx || !buf || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        st = baton_error(BATON_ERR_NO_MEMORY, "sha256 context");
        goto out;
    }
    size_t n;
    while ((n = fread(buf, 1, 1 << 20, f)) > 0) EVP_DigestUpdate(ctx, buf, n);
    if (ferror(f)) {
        st = baton_error(BATON_ERR_IO, "%s: read error", path);
        goto out;
    }
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx, out, &len);
out:
    free(buf);
    EVP_MD_CTX_free(ctx);
    fclose(f);
    return st;
}

/* Public id of the hash seed: XXH3-64 of its 8 little-endian bytes (the
 * router's worker_table_seed_id). */
static uint64_t seed_id(uint64_t seed) {
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(seed >> (8 * i));
    return XXH3_64bits(le, sizeof(le));
}

static void hash_to_proto(const block_hash_t *h, proto_block_hash_t *out) {
    for (int i = 0; i < 8; i++) {
        out->bytes[i] = (uint8_t)(h->hi >> (56 - 8 * i));
        out->bytes[8 + i] = (uint8_t)(h->lo >> (56 - 8 * i));
    }
}

/* Endpoint spelled "...:0" means an ephemeral port (ZeroMQ's "*"). */
static void endpoint_bind_form(const char *in, char *out, size_t n) {
    size_t len = strlen(in);
    if (len >= 2 && !strcmp(in + len - 2, ":0"))
        snprintf(out, n, "%.*s:*", (int)(len - 2), in);
    else
        snprintf(out, n, "%s", in);
}

/* proto_sampling_t -> sampling_params_t; stop ids copied into stop_buf,
 * logit_bias into bias_buf (room for PROTO_MAX_LOGIT_BIAS entries); *out
 * points into both. */
static baton_status_t sampling_from_proto(const proto_sampling_t *p, int32_t *stop_buf,
                                          sampling_logit_bias_t *bias_buf,
                                          sampling_params_t *out) {
    if (p->n_stop_token_ids > SAMPLING_MAX_STOP_IDS)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "%u stop token ids (at most %d)",
                           p->n_stop_token_ids, SAMPLING_MAX_STOP_IDS);
    if (p->n_logit_bias > PROTO_MAX_LOGIT_BIAS)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "%u logit_bias entries (at most %d)",
                           p->n_logit_bias, PROTO_MAX_LOGIT_BIAS);
    sampling_params_t sp = sampling_params_default();
    sp.temperature = p->temperature;
    sp.top_k = (int32_t)p->top_k;
    sp.top_p = p->top_p;
    sp.min_p = p->min_p;
    sp.repetition_penalty = p->repetition_penalty;
    sp.presence_penalty = p->presence_penalty;
    sp.frequency_penalty = p->frequency_penalty;
    sp.seed = p->seed;
    sp.n_logprobs = (int32_t)p->top_logprobs;
    for (uint32_t i = 0; i < p->n_stop_token_ids; i++) stop_buf[i] = (int32_t)p->stop_token_ids[i];
    sp.stop_ids = stop_buf;
    sp.n_stop_ids = (int32_t)p->n_stop_token_ids;
    for (uint32_t i = 0; i < p->n_logit_bias; i++)
        bias_buf[i] = (sampling_logit_bias_t){(int32_t)p->logit_bias[i].token, p->logit_bias[i].bias};
    sp.logit_bias = bias_buf;
    sp.n_logit_bias = (int32_t)p->n_logit_bias;
    *out = sp;
    return BATON_OK;
}

static proto_finish_reason_t finish_to_proto(decode_sched_finish_t f) {
    switch (f) {
    case DECODE_SCHED_FINISH_STOP: return PROTO_FINISH_STOP;
    case DECODE_SCHED_FINISH_LENGTH: return PROTO_FINISH_LENGTH;
    case DECODE_SCHED_FINISH_ABORT: return PROTO_FINISH_ABORT;
    case DECODE_SCHED_FINISH_ERROR: return PROTO_FINISH_ERROR;
    default: return PROTO_FINISH_NONE;
    }
}

/* ---- the worker -------------------------------------------------------------- */

/* One request while it is in this process: its PrefillRequest and
 * DecodeRequest halves, paired by id. */
typedef struct colo_req {
    uint8_t id[PROTO_ID_BYTES];
    bool have_prefill;  /* PrefillRequest submitted to the prefill scheduler */
    bool prefill_done;  /* DONE there: blocks held, waiting for the decode half */
    bool have_decode;   /* DecodeRequest stored */
    bool in_decode;     /* adopted by the decode scheduler */
    int32_t *prompt;    /* prompt tokens (PrefillRequest) */
    int32_t n_prompt;
    sampling_params_t dsp; /* decode half's sampling */
    int32_t dstop[SAMPLING_MAX_STOP_IDS];
    sampling_logit_bias_t dbias[PROTO_MAX_LOGIT_BIAS]; /* decode half's logit_bias */
    int32_t max_tokens;
    bool ignore_eos, logprobs;
    decode_sched_prefill_t pre; /* prefill result for the hand-off */
    sampling_logprob_t pre_top[SAMPLING_MAX_LOGPROBS];
    int32_t n_cached_tokens;
    uint64_t wait_since_us; /* half waiting for the other since */
} colo_req_t;

typedef struct worker {
    worker_opts_t o;
    char id[PROTO_WORKER_ID_MAX + 1];
    uint64_t epoch;
    void *zctx;
    proto_chan_t *router, *peer, *pub;
    char peer_ep[256], pub_ep[256];
    backend_t *be;
    tokenizer_t *tok;
    model_t *model;
    kv_pool_t *pool;
    radix_cache_t *cache;
    prefill_sched_t *ps;
    decode_sched_t *ds;
    uint8_t model_sha[PROTO_SHA256_BYTES];
    int32_t n_vocab;
    colo_req_t **reqs;
    size_t n_reqs, cap_reqs;
    uint64_t next_heartbeat_us;
    uint64_t n_heartbeats;
    uint64_t sends_failed;
} worker_t;

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { (void)sig; g_stop = 1; }

static colo_req_t *req_find(worker_t *w, const uint8_t *id, size_t *idx) {
    for (size_t i = 0; i < w->n_reqs; i++)
        if (!memcmp(w->reqs[i]->id, id, PROTO_ID_BYTES)) {
            if (idx) *idx = i;
            return w->reqs[i];
        }
    return NULL;
}

static colo_req_t *req_get(worker_t *w, const uint8_t *id) {
    colo_req_t *r = req_find(w, id, NULL);
    if (r) return r;
    if (w->n_reqs == w->cap_reqs) {
        size_t cap = w->cap_reqs ? w->cap_reqs * 2 : 64;
        colo_req_t **n = realloc(w->reqs, cap * sizeof(*n));
        if (!n) return NULL;
        w->reqs = n;
        w->cap_reqs = cap;
    }
    r = calloc(1, sizeof(*r));
    if (!r) return NULL;
    memcpy(r->id, id, PROTO_ID_BYTES);
    r->wait_since_us = now_us();
    w->reqs[w->n_reqs++] = r;
    return r;
}

static void req_drop(worker_t *w, const uint8_t *id) {
    size_t i;
    colo_req_t *r = req_find(w, id, &i);
    if (!r) return;
    free(r->prompt);
    free(r);
    w->reqs[i] = w->reqs[--w->n_reqs];
}

static void send_router(worker_t *w, const proto_msg_t *m) {
    baton_status_t st = proto_chan_send(w->router, NULL, m);
    if (st != BATON_OK) {
        w->sends_failed++;
        LOG_WARN(COMP, "send %s to the router failed: %s", proto_msg_type_name(m->type),
                 baton_last_error());
    }
}

/* RequestFinished for a request that never reached the decode scheduler. */
static void send_finished_early(worker_t *w, const uint8_t *id, proto_finish_reason_t why,
                                baton_status_t status, const char *error, uint32_t n_prompt) {
    proto_msg_t m = {.type = PROTO_MSG_REQUEST_FINISHED};
    proto_request_finished_t *f = &m.u.request_finished;
    memcpy(f->request_id.bytes, id, PROTO_ID_BYTES);
    snprintf(f->worker_id, sizeof(f->worker_id), "%s", w->id);
    f->finish_reason = why;
    f->status = status;
    f->error = (char *)(error ? error : "");
    f->prompt_tokens = n_prompt;
    send_router(w, &m);
}

/* Moves a computed prompt from the prefill to the decode scheduler. */
static void handoff(worker_t *w, colo_req_t *r) {
    kv_block_table_t table;
    kv_block_table_init(&table);
    baton_status_t st = prefill_sched_detach(w->ps, r->id, &table);
    if (st != BATON_OK) {
        LOG_ERROR(COMP, "detach failed: %s", baton_last_error());
        send_finished_early(w, r->id, PROTO_FINISH_ERROR, st, baton_last_error(), (uint32_t)r->n_prompt);
        req_drop(w, r->id);
        return;
    }
    decode_sched_request_t dq = {
        .request_id = r->id,
        .n_prompt_tokens = r->n_prompt,
        .prompt_tokens = r->prompt,
        .sampling = r->dsp,
        .max_tokens = r->max_tokens,
        .ignore_eos = r->ignore_eos,
        .logprobs = r->logprobs,
        .user = r,
    };
    r->pre.top = r->pre_top;
    st = decode_sched_adopt(w->ds, &dq, &table, &r->pre);
    if (st != BATON_OK) {
        char why[512];
        snprintf(why, sizeof(why), "decode: %s", baton_last_error());
        kv_block_table_release(&table, w->pool);
        LOG_WARN(COMP, "request refused at hand-off: %s", why);
        send_finished_early(w, r->id, PROTO_FINISH_ERROR, st, why, (uint32_t)r->n_prompt);
        req_drop(w, r->id);
        return;
    }
    r->in_decode = true;
}

/* prefill scheduler: a prompt is computed (OK, DONE) or failed (gone). */
static void on_prefill_finished(void *arg, const prefill_sched_result_t *res) {
    worker_t *w = arg;
    colo_req_t *r = req_find(w, res->request_id, NULL);
    if (!r) { /* cannot happen: every submitted id has an entry */
        if (res->status == BATON_OK) prefill_sched_release(w->ps, res->request_id);
        return;
    }
    if (res->status != BATON_OK) {
        send_finished_early(w, r->id, PROTO_FINISH_ERROR, res->status, res->error,
                            (uint32_t)res->n_prompt_tokens);
        req_drop(w, r->id);
        return;
    }
    decode_sched_prefill_t *p = &r->pre;
    memset(p, 0, sizeof(*p));
    p->status = BATON_OK;
    p->first_token = res->sample.token;
    p->first_logprob = res->sample.logprob;
    p->n_top = res->sample.n_top;
    memcpy(r->pre_top, res->sample.top, sizeof(r->pre_top));
    p->n_blocks_written = res->n_blocks;
    p->queue_us = res->queue_us;
    p->compute_us = res->compute_us;
    p->device_us = res->device_us;
    r->n_cached_tokens = res->n_cached_tokens;
    r->prefill_done = true;
    r->wait_since_us = now_us();
    if (r->have_decode) handoff(w, r);
}

static void on_token_chunk(void *arg, uint64_t step_id, const decode_sched_entry_t *e, int32_t n) {
    worker_t *w = arg;
    if (n <= 0) return;
    proto_token_entry_t *ents = calloc((size_t)n, sizeof(*ents));
    uint32_t *ids = NULL;
    proto_token_logprob_t *tops = NULL;
    size_t n_tok = 0, n_top = 0;
    for (int32_t i = 0; i < n; i++) {
        n_tok += (size_t)e[i].n_tokens;
        if (e[i].top) n_top += (size_t)e[i].n_tokens * (size_t)e[i].top_k;
    }
    ids = malloc((n_tok ? n_tok : 1) * sizeof(*ids));
    tops = malloc((n_top ? n_top : 1) * sizeof(*tops));
    if (!ents || !ids || !tops) {
        LOG_ERROR(COMP, "out of memory building a TokenChunk (step %" PRIu64 ")", step_id);
        goto out;
    }
    size_t ti = 0, pi = 0;
    for (int32_t i = 0; i < n; i++) {
        proto_token_entry_t *t = &ents[i];
        memcpy(t->request_id.bytes, e[i].request_id, PROTO_ID_BYTES);
        t->token_ids = ids + ti;
        t->n_token_ids = (uint32_t)e[i].n_tokens;
        for (int32_t k = 0; k < e[i].n_tokens; k++) ids[ti++] = (uint32_t)e[i].tokens[k];
        if (e[i].logprobs) {
            t->logprobs = (float *)e[i].logprobs;
            t->n_logprobs = (uint32_t)e[i].n_tokens;
        }
        if (e[i].top && e[i].top_k > 0) {
            t->top_k = (uint32_t)e[i].top_k;
            t->top_logprobs = tops + pi;
            t->n_top_logprobs = (uint32_t)(e[i].n_tokens * e[i].top_k);
            for (int32_t k = 0; k < e[i].n_tokens * e[i].top_k; k++) {
                tops[pi].token = (uint32_t)e[i].top[k].token;
                tops[pi].logprob = e[i].top[k].logprob;
                pi++;
            }
        }
        t->finish_reason = finish_to_proto(e[i].finish);
    }
    proto_msg_t m = {.type = PROTO_MSG_TOKEN_CHUNK};
    snprintf(m.u.token_chunk.worker_id, sizeof(m.u.token_chunk.worker_id), "%s", w->id);
    m.u.token_chunk.step_id = step_id;
    m.u.token_chunk.entries = ents;
    m.u.token_chunk.n_entries = (uint32_t)n;
    send_router(w, &m);
out:
    free(ents);
    free(ids);
    free(tops);
}

static void on_decode_finished(void *arg, const decode_sched_result_t *res) {
    worker_t *w = arg;
    colo_req_t *r = req_find(w, res->request_id, NULL);
    proto_msg_t m = {.type = PROTO_MSG_REQUEST_FINISHED};
    proto_request_finished_t *f = &m.u.request_finished;
    memcpy(f->request_id.bytes, res->request_id, PROTO_ID_BYTES);
    snprintf(f->worker_id, sizeof(f->worker_id), "%s", w->id);
    f->finish_reason = finish_to_proto(res->finish);
    f->status = res->status;
    f->error = (char *)(res->error ? res->error : "");
    f->prompt_tokens = (uint32_t)res->n_prompt_tokens;
    f->completion_tokens = (uint32_t)res->n_generated;
    f->cached_tokens = r ? (uint32_t)r->n_cached_tokens : 0;
    f->timings.queue_us = res->prefill.queue_us + res->queue_us;
    f->timings.prefill_us = res->prefill.compute_us;
    f->timings.transfer_us = 0;
    f->timings.transfer_bytes = 0;
    f->timings.decode_us = res->decode_us;
    f->prefill_device_us = res->prefill.device_us;
    f->decode_device_us = res->device_us;
    send_router(w, &m);
    if (r) req_drop(w, r->id);
}

/* ---- control messages -------------------------------------------------------- */

static void on_prefill_request(worker_t *w, const proto_prefill_request_t *q) {
    const uint8_t *id = q->request_id.bytes;
    colo_req_t *r = req_find(w, id, NULL);
    if (r && r->have_prefill) {
        LOG_WARN(COMP, "duplicate PrefillRequest ignored");
        return;
    }
    if (!(r = req_get(w, id))) {
        send_finished_early(w, id, PROTO_FINISH_ERROR, BATON_ERR_NO_MEMORY, "out of memory",
                            q->n_token_ids);
        return;
    }
    baton_status_t st;
    char why[512];
    int32_t stop[SAMPLING_MAX_STOP_IDS];
    sampling_logit_bias_t bias[PROTO_MAX_LOGIT_BIAS]; /* copied by sampler_init in submit */
    sampling_params_t sp;
    r->prompt = malloc(q->n_token_ids * sizeof(int32_t));
    if (!r->prompt) {
        st = baton_error(BATON_ERR_NO_MEMORY, "prompt copy");
        goto fail;
    }
    for (uint32_t i = 0; i < q->n_token_ids; i++) r->prompt[i] = (int32_t)q->token_ids[i];
    r->n_prompt = (int32_t)q->n_token_ids;
    if ((st = sampling_from_proto(&q->sampling, stop, bias, &sp)) != BATON_OK) goto fail;
    prefill_sched_request_t pq = {
        .request_id = id,
        .tokens = r->prompt,
        .n_tokens = r->n_prompt,
        .sampling = sp,
        .cache_salt = q->cache_salt,
        .local = true,
        .user = r,
    };
    if ((st = prefill_sched_submit(w->ps, &pq)) != BATON_OK) goto fail;
    r->have_prefill = true;
    r->wait_since_us = now_us();
    return;
fail:
    snprintf(why, sizeof(why), "prefill: %s", baton_last_error());
    LOG_WARN(COMP, "PrefillRequest refused: %s", why);
    send_finished_early(w, id, PROTO_FINISH_ERROR, st, why, q->n_token_ids);
    req_drop(w, id);
}

static void on_decode_request(worker_t *w, const proto_decode_request_t *q) {
    const uint8_t *id = q->request_id.bytes;
    colo_req_t *r = req_find(w, id, NULL);
    if (r && r->have_decode) {
        LOG_WARN(COMP, "duplicate DecodeRequest ignored");
        return;
    }
    baton_status_t st;
    char why[512];
    if (!(r = req_get(w, id))) {
        send_finished_early(w, id, PROTO_FINISH_ERROR, BATON_ERR_NO_MEMORY, "out of memory",
                            q->n_prompt_tokens);
        return;
    }
    if ((st = sampling_from_proto(&q->sampling, r->dstop, r->dbias, &r->dsp)) != BATON_OK) goto fail;
    r->dsp.stop_ids = r->dstop;
    r->dsp.logit_bias = r->dbias;
    r->max_tokens = (int32_t)q->sampling.max_tokens;
    r->ignore_eos = q->sampling.ignore_eos;
    r->logprobs = q->sampling.logprobs;
    /* refuse at once what can never fit (the adopt would refuse it later) */
    const model_hparams_t *hp = model_hparams(w->model);
    int64_t need_tok = (int64_t)q->n_prompt_tokens + r->max_tokens;
    int64_t need_blocks = (need_tok - 1 + w->o.block_size - 1) / w->o.block_size;
    if (need_tok > hp->n_ctx_train || need_blocks > w->o.kv_blocks) {
        st = baton_error(BATON_ERR_NO_SPACE,
                         "cannot fit: %u prompt + %d max tokens need %" PRId64
                         " blocks (pool %d) and context %d",
                         q->n_prompt_tokens, r->max_tokens, need_blocks, w->o.kv_blocks,
                         hp->n_ctx_train);
        goto fail;
    }
    r->have_decode = true;
    if (r->prefill_done) handoff(w, r);
    else r->wait_since_us = now_us();
    return;
fail:
    snprintf(why, sizeof(why), "decode: %s", baton_last_error());
    LOG_WARN(COMP, "DecodeRequest refused: %s", why);
    if (r->have_prefill) prefill_sched_abort(w->ps, id, NULL);
    send_finished_early(w, id, PROTO_FINISH_ERROR, st, why, q->n_prompt_tokens);
    req_drop(w, id);
}

static void on_abort(worker_t *w, const proto_abort_t *a) {
    const uint8_t *id = a->request_id.bytes;
    colo_req_t *r = req_find(w, id, NULL);
    if (!r) {
        LOG_DEBUG(COMP, "abort for an unknown request (already finished)");
        return;
    }
    if (r->have_prefill && !r->in_decode) prefill_sched_abort(w->ps, id, NULL);
    if (r->in_decode) {
        /* finished hook: RequestFinished{abort}, entry dropped */
        if (decode_sched_abort(w->ds, id) == BATON_OK) return;
    }
    send_finished_early(w, id, PROTO_FINISH_ABORT, BATON_ERR_CANCELLED,
                        a->reason ? a->reason : "aborted", (uint32_t)r->n_prompt);
    req_drop(w, id);
}

/* Publishes one KVEvent batch from radix cache links/removals. */
static void publish_kv(worker_t *w, uint64_t epoch, uint64_t seq, bool full, uint32_t part,
                       bool last, const block_hash_link_t *links, size_t n_links,
                       const block_hash_t *removed, size_t n_removed) {
    proto_kv_stored_t *st = calloc(n_links ? n_links : 1, sizeof(*st));
    proto_block_hash_t *rm = calloc(n_removed ? n_removed : 1, sizeof(*rm));
    if (!st || !rm) {
        LOG_ERROR(COMP, "out of memory building a KVEvent");
        goto out;
    }
    for (size_t i = 0; i < n_links; i++) {
        hash_to_proto(&links[i].hash, &st[i].hash);
        if (links[i].has_parent) hash_to_proto(&links[i].parent, &st[i].parent_hash);
        st[i].n_tokens = (uint32_t)w->o.block_size;
    }
    for (size_t i = 0; i < n_removed; i++) hash_to_proto(&removed[i], &rm[i]);
    proto_msg_t m = {.type = PROTO_MSG_KV_EVENT};
    proto_kv_event_t *e = &m.u.kv_event;
    snprintf(e->worker_id, sizeof(e->worker_id), "%s", w->id);
    e->epoch = epoch;
    e->seq = seq;
    e->full = full;
    e->full_part = part;
    e->full_last = last;
    e->stored = st;
    e->n_stored = (uint32_t)n_links;
    e->removed = rm;
    e->n_removed = (uint32_t)n_removed;
    if (proto_chan_send(w->pub, NULL, &m) != BATON_OK)
        LOG_WARN(COMP, "KVEvent publish failed: %s", baton_last_error());
out:
    free(st);
    free(rm);
}

static void flush_kv_events(worker_t *w) {
    radix_cache_events_t ev;
    if (radix_cache_take_events(w->cache, &ev) != BATON_OK) return;
    if (ev.n_stored || ev.n_removed)
        publish_kv(w, ev.epoch, ev.seq, false, 0, false, ev.stored, ev.n_stored, ev.removed,
                   ev.n_removed);
    radix_cache_events_free(&ev);
}

static void on_kv_resync(worker_t *w) {
    flush_kv_events(w);
    radix_cache_snapshot_t snap;
    if (radix_cache_snapshot(w->cache, &snap) != BATON_OK) {
        LOG_WARN(COMP, "KV snapshot failed: %s", baton_last_error());
        return;
    }
    uint32_t part = 0;
    size_t off = 0;
    do {
        size_t n = snap.n - off > KV_EVENT_PART_MAX ? KV_EVENT_PART_MAX : snap.n - off;
        publish_kv(w, snap.epoch, snap.seq, true, part++, off + n == snap.n, snap.links + off, n,
                   NULL, 0);
        off += n;
    } while (off < snap.n);
    radix_cache_snapshot_free(&snap);
}

static void on_router_msg(void *arg, proto_chan_t *chan, const char *peer, proto_msg_t *msg) {
    worker_t *w = arg;
    switch (msg->type) {
    case PROTO_MSG_PREFILL_REQUEST: on_prefill_request(w, &msg->u.prefill_request); break;
    case PROTO_MSG_DECODE_REQUEST: on_decode_request(w, &msg->u.decode_request); break;
    case PROTO_MSG_ABORT: on_abort(w, &msg->u.abort); break;
    case PROTO_MSG_KV_RESYNC: on_kv_resync(w); break;
    default:
        LOG_WARN(COMP, "unexpected %s from the router ignored", proto_msg_type_name(msg->type));
    }
}

static void on_peer_msg(void *arg, proto_chan_t *chan, const char *peer, proto_msg_t *msg) {
    LOG_WARN(COMP, "unexpected %s from peer %s ignored (a colocated worker takes no peer "
             "messages)", proto_msg_type_name(msg->type), peer);
}

static baton_status_t send_register(worker_t *w) {
    const backend_kv_geom_t *g = kv_pool_geom(w->pool);
    proto_msg_t m = {.type = PROTO_MSG_WORKER_REGISTER};
    proto_worker_register_t *r = &m.u.worker_register;
    snprintf(r->worker_id, sizeof(r->worker_id), "%s", w->id);
    r->role = PROTO_ROLE_BOTH;
    r->epoch = w->epoch;
    r->zmq_endpoint = w->o.peer_advertise ? (char *)w->o.peer_advertise : w->peer_ep;
    memcpy(r->model_sha256, w->model_sha, PROTO_SHA256_BYTES);
    r->vocab_size = (uint32_t)w->n_vocab;
    r->kv.n_layers = (uint32_t)g->n_layers;
    r->kv.n_kv_heads = (uint32_t)g->n_kv_heads;
    r->kv.head_dim = (uint32_t)g->head_dim;
    r->kv.block_size = (uint32_t)g->block_size;
    r->kv.dtype = g->dtype == BACKEND_DTYPE_BF16  ? PROTO_KV_DTYPE_BF16
                  : g->dtype == BACKEND_DTYPE_F16 ? PROTO_KV_DTYPE_F16
                                                  : PROTO_KV_DTYPE_F32;
    r->kv.hash_seed_id = seed_id(w->o.hash_seed);
    r->pool.n_blocks = (uint32_t)g->n_blocks;
    r->pool.block_bytes = kv_pool_block_bytes(w->pool);
    r->kv_events_endpoint = w->pub_ep;
    /* serving configuration (issue 6: /v1/serving_config) */
    char cpu[256];
    proto_host_cpu_model(cpu, sizeof(cpu));
    const backend_t *be = model_backend(w->model);
    r->max_batch_tokens = (uint32_t)w->o.max_batch_tokens;
    r->max_batch = (uint32_t)w->o.max_batch;
    r->cpu_model = cpu;
    r->backend = (char *)be->ops->name;
    r->compute_dtype = (char *)backend_dtype_name(be->weight_dtype);
    return proto_chan_send(w->router, NULL, &m);
}

static void send_heartbeat(worker_t *w) {
    prefill_sched_stats_t ps;
    decode_sched_stats_t ds;
    radix_cache_stats_t rs;
    prefill_sched_get_stats(w->ps, &ps);
    decode_sched_get_stats(w->ds, &ds);
    radix_cache_get_stats(w->cache, &rs);
    proto_msg_t m = {.type = PROTO_MSG_WORKER_HEARTBEAT};
    proto_worker_heartbeat_t *h = &m.u.worker_heartbeat;
    snprintf(h->worker_id, sizeof(h->worker_id), "%s", w->id);
    h->role = PROTO_ROLE_BOTH;
    h->epoch = w->epoch;
    h->timestamp_unix_us = unix_us();
    h->queued_prefill_tokens = ps.queued_prefill_tokens;
    h->n_running = ds.n_running + ds.n_ready + ps.n_running;
    h->n_waiting = ps.n_waiting + ds.n_queued + ds.n_preempted;
    h->free_blocks = (uint32_t)kv_pool_n_free(w->pool);
    h->total_blocks = (uint32_t)kv_pool_geom(w->pool)->n_blocks;
    h->batch_occupancy = ds.batch_occupancy;
    h->used_blocks = (uint32_t)kv_pool_n_used(w->pool);
    h->cache_hit_blocks = rs.hit_blocks;
    h->cache_lookup_blocks = rs.hit_blocks + rs.miss_blocks;
    h->preemptions = ds.preemptions;
    h->busy_us = ps.busy_us + ds.busy_us;
    h->steps = ps.steps + ds.steps;
    h->idle_gaps = ps.idle_gaps + ds.idle_gaps;
    h->idle_gap_us = ps.idle_gap_us + ds.idle_gap_us;
    h->idle_gap_max_us = ps.idle_gap_max_us > ds.idle_gap_max_us ? ps.idle_gap_max_us : ds.idle_gap_max_us;
    send_router(w, &m);
}

/* A half that waited past --pair-timeout-ms for the other one fails. */
static void expire_unpaired(worker_t *w) {
    uint64_t now = now_us(), bound = (uint64_t)w->o.pair_timeout_ms * 1000u;
    for (size_t i = 0; i < w->n_reqs;) {
        colo_req_t *r = w->reqs[i];
        bool waiting = !r->in_decode && ((r->prefill_done && !r->have_decode) ||
                                         (r->have_decode && !r->have_prefill));
        if (waiting && now - r->wait_since_us > bound) {
            const char *why = r->prefill_done ? "no DecodeRequest for a computed prompt"
                                              : "no PrefillRequest for a DecodeRequest";
            LOG_WARN(COMP, "%s within %u ms", why, w->o.pair_timeout_ms);
            if (r->prefill_done) prefill_sched_release(w->ps, r->id);
            send_finished_early(w, r->id, PROTO_FINISH_ERROR, BATON_ERR_TIMEOUT, why,
                                (uint32_t)r->n_prompt);
            req_drop(w, r->id); /* moves the last entry to i */
            continue;
        }
        i++;
    }
}

/* The decode scheduler shares the pool with the radix cache: before a step,
 * evict unreferenced cached blocks so running sequences can grow instead of
 * being preempted. */
static void make_room_for_decode(worker_t *w) {
    decode_sched_stats_t ds;
    decode_sched_get_stats(w->ds, &ds);
    int32_t want = (int32_t)(ds.n_running + ds.n_ready + ds.n_preempted + ds.n_queued) + 1;
    int32_t have = kv_pool_n_free(w->pool);
    if (have < want) {
        size_t ev = 0;
        radix_cache_evict(w->cache, (size_t)(want - have), &ev);
    }
}

static int worker_run(worker_t *w) {
    zmq_pollitem_t items[2] = {
        {proto_chan_socket(w->router), 0, ZMQ_POLLIN, 0},
        {proto_chan_socket(w->peer), 0, ZMQ_POLLIN, 0},
    };
    w->next_heartbeat_us = 0;
    while (!g_stop) {
        bool work = prefill_sched_has_work(w->ps) || decode_sched_has_work(w->ds);
        long timeout_ms = 0;
        if (!work) {
            uint64_t now = now_us();
            int64_t t = w->next_heartbeat_us > now ? (int64_t)(w->next_heartbeat_us - now) : 0;
            int64_t d = prefill_sched_next_deadline_us(w->ps);
            if (d >= 0 && d < t) t = d;
            d = decode_sched_next_deadline_us(w->ds);
            if (d >= 0 && d < t) t = d;
            if (w->n_reqs && t > 100000) t = 100000; /* pairing timeouts */
            timeout_ms = (long)((t + 999) / 1000);
        }
        if (zmq_poll(items, 2, timeout_ms) < 0 && zmq_errno() != EINTR) {
            LOG_ERROR(COMP, "zmq_poll: %s", zmq_strerror(zmq_errno()));
            return 1;
        }
        proto_chan_drain(w->router, on_router_msg, w, 256, NULL);
        proto_chan_drain(w->peer, on_peer_msg, w, 256, NULL);
        uint64_t now = now_us();
        if (now >= w->next_heartbeat_us) {
            /* re-register every 10 heartbeats so a restarted router learns
             * this worker again (the decode worker does the same) */
            if (++w->n_heartbeats % 10 == 0 && send_register(w) != BATON_OK)
                LOG_WARN(COMP, "WorkerRegister: %s", baton_last_error());
            send_heartbeat(w);
            w->next_heartbeat_us = now + HEARTBEAT_US;
        }
        prefill_sched_step(w->ps, NULL); /* also expires its deadlines */
        flush_kv_events(w);
        make_room_for_decode(w);
        if (decode_sched_step(w->ds, NULL) != BATON_OK)
            LOG_WARN(COMP, "decode step failed: %s", baton_last_error());
        expire_unpaired(w);
    }
    return 0;
}

static void worker_free(worker_t *w) {
    decode_sched_free(w->ds);
    prefill_sched_free(w->ps);
    radix_cache_free(w->cache);
    kv_pool_free(w->pool);
    model_free(w->model);
    tokenizer_free(w->tok);
    backend_free(w->be);
    proto_chan_free(w->router);
    proto_chan_free(w->peer);
    proto_chan_free(w->pub);
    if (w->zctx) zmq_ctx_term(w->zctx);
    for (size_t i = 0; i < w->n_reqs; i++) {
        free(w->reqs[i]->prompt);
        free(w->reqs[i]);
    }
    free(w->reqs);
}

static baton_status_t pool_ref(void *c, int32_t id) { return kv_pool_ref(c, id); }
static baton_status_t pool_unref(void *c, int32_t id) { return kv_pool_unref(c, id); }
static int32_t pool_rc(void *c, int32_t id) { return kv_pool_refcount(c, id); }

static int fail(const char *what) {
    fprintf(stderr, "baton-worker: error: %s: %s\n", what, baton_last_error());
    return 1;
}

static int worker_open(worker_t *w) {
    const worker_opts_t *o = &w->o;
    if (o->worker_id) {
        snprintf(w->id, sizeof(w->id), "%s", o->worker_id);
    } else {
        char host[64] = "host";
        gethostname(host, sizeof(host) - 1);
        for (char *c = host; *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                  *c == '.' || *c == '-'))
                *c = '-';
        snprintf(w->id, sizeof(w->id), "both-%.40s-%d", host, (int)getpid());
    }
    w->epoch = unix_us();
    if (file_sha256(o->model, w->model_sha) != BATON_OK) return fail("model hash");
    gguf_file_t *f = NULL;
    if (gguf_open(o->model, &f) != BATON_OK) return fail(o->model);
    if (tokenizer_load(f, &w->tok) != BATON_OK) {
        gguf_close(f);
        return fail("tokenizer");
    }
    if (backend_create(o->backend, o->threads, &w->be) != BATON_OK) {
        gguf_close(f);
        return fail("backend");
    }
    model_load_params_t lp = model_load_params_default();
    int32_t mbt = o->max_batch_tokens > o->max_batch ? o->max_batch_tokens : o->max_batch;
    if (mbt < 512) mbt = 512; /* decode recompute chunks */
    lp.max_batch_tokens = mbt;
    baton_status_t st = model_load_gguf(f, w->be, &lp, &w->model);
    gguf_close(f);
    if (st != BATON_OK) return fail(o->model);
    const model_hparams_t *hp = model_hparams(w->model);
    w->n_vocab = hp->n_vocab;
    backend_kv_geom_t g = model_kv_geom(w->model, o->kv_blocks, o->block_size);
    if (kv_pool_init(w->be, &g, &w->pool) != BATON_OK) return fail("KV pool");
    radix_cache_pool_ops_t ops = {w->pool, pool_ref, pool_unref, pool_rc};
    if (radix_cache_init(&ops, w->epoch, &w->cache) != BATON_OK) return fail("radix cache");

    prefill_sched_config_t pc = prefill_sched_config_default();
    pc.max_batch_tokens = o->max_batch_tokens;
    pc.hash_seed = o->hash_seed;
    prefill_sched_hooks_t ph = {.arg = w, .finished = on_prefill_finished};
    if (prefill_sched_init(w->model, w->pool, w->cache, &pc, &ph, &w->ps) != BATON_OK)
        return fail("prefill scheduler");

    int32_t eog[DECODE_SCHED_MAX_EOG];
    int32_t n_eog = 0;
    for (int32_t t = 0; t < w->n_vocab && n_eog < DECODE_SCHED_MAX_EOG; t++)
        if (tokenizer_is_eog(w->tok, t)) eog[n_eog++] = t;
    decode_sched_config_t dc = decode_sched_config_default();
    dc.max_batch = o->max_batch;
    dc.eog_ids = eog;
    dc.n_eog_ids = n_eog;
    decode_sched_hooks_t dh = {.arg = w, .token_chunk = on_token_chunk,
                               .finished = on_decode_finished};
    if (decode_sched_init(w->model, w->pool, &dc, &dh, &w->ds) != BATON_OK)
        return fail("decode scheduler");

    if (!(w->zctx = zmq_ctx_new())) {
        fprintf(stderr, "baton-worker: error: zmq_ctx_new failed\n");
        return 1;
    }
    proto_chan_opts_t co;
    proto_chan_opts_default((uint32_t)w->n_vocab, &co);
    char ep[256];
    endpoint_bind_form(o->peer_bind, ep, sizeof(ep));
    if (proto_chan_open(w->zctx, PROTO_CHAN_ROUTER, ep, NULL, &co, &w->peer) != BATON_OK ||
        proto_chan_endpoint(w->peer, w->peer_ep, sizeof(w->peer_ep)) != BATON_OK)
        return fail("--peer-bind");
    endpoint_bind_form(o->kv_events_bind, ep, sizeof(ep));
    if (proto_chan_open(w->zctx, PROTO_CHAN_PUB, ep, w->id, &co, &w->pub) != BATON_OK ||
        proto_chan_endpoint(w->pub, w->pub_ep, sizeof(w->pub_ep)) != BATON_OK)
        return fail("--kv-events-bind");
    if (proto_chan_open(w->zctx, PROTO_CHAN_DEALER, o->router, w->id, &co, &w->router) != BATON_OK)
        return fail("--router");
    if (send_register(w) != BATON_OK) return fail("WorkerRegister");
    LOG_INFO(COMP, "%s: role both, model %s, %d blocks of %d tokens, peer %s, kv events %s, "
             "router %s", w->id, o->model, o->kv_blocks, o->block_size, w->peer_ep, w->pub_ep,
             o->router);
    return 0;
}

int main(int argc, char **argv) {
    /* --role prefill|decode: every other option belongs to that binary */
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--role") &&
            (!strcmp(argv[i + 1], "prefill") || !strcmp(argv[i + 1], "decode")))
            return exec_role(argv[i + 1], argc, argv);
    worker_t w;
    memset(&w, 0, sizeof(w));
    int rc = parse_opts(argc, argv, &w.o);
    if (rc) {
        usage(stderr);
        return rc;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    rc = worker_open(&w);
    if (!rc) rc = worker_run(&w);
    worker_free(&w);
    return rc;
}
