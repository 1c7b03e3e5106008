/* KV data plane over UCX (see kv_transfer.h for the contract).
 *
 * Callback discipline. UCX calls our request and endpoint-error callbacks
 * from inside ucp_worker_progress / ucp_ep_close_nbx; those callbacks only
 * update counters and flags. Everything that frees memory, closes endpoints
 * or calls the user happens in engine_settle(), which runs after UCX calls
 * return (Redis freeClientAsync style), so a user callback may free its
 * transfer and no UCX callback ever sees freed memory. */
#include "common/kv_transfer.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ucp/api/ucp.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "common/log.h"

#define KVT_COMP "kv_transfer"
#define KVT_MAGIC "BKVT"
#define KVT_VERSION 1
#define KVT_HEADER_BYTES 56          /* fixed part of the descriptor */
#define KVT_MAX_BLOB_PART (1u << 20) /* bound on address / rkey sizes */
#define KVT_DEFAULT_TIMEOUT_MS 30000u
#define KVT_CLOSE_WAIT_MS 1000

struct kv_transfer_engine {
    ucp_context_h context;
    ucp_worker_h worker;
    int efd;
    ucp_address_t *worker_addr;
    size_t worker_addr_len;
    kv_transfer_peer_t *peers;     /* every live peer struct */
    kv_transfer_t *xfers;          /* every live transfer struct (incl. abandoned) */
    void **closing;                /* ucp_ep_close_nbx requests in flight */
    size_t n_closing, cap_closing;
    int settling;                  /* engine_settle re-entrancy guard */
    int err_mode_peer;             /* endpoints use UCP_ERR_HANDLING_MODE_PEER */
};

struct kv_transfer_pool {
    kv_transfer_engine_t *eng;
    kv_transfer_pool_desc_t desc;
    uint64_t region_bytes;
    ucp_mem_h k_memh, v_memh;
    void *k_rkey_buf, *v_rkey_buf;
    size_t k_rkey_len, v_rkey_len;
};

struct kv_transfer_peer {
    kv_transfer_engine_t *eng;
    kv_transfer_peer_t *next, *prev;
    kv_transfer_remote_info_t info;
    ucp_ep_h ep;                   /* NULL once closed */
    ucp_rkey_h k_rkey, v_rkey;     /* NULL once destroyed */
    baton_status_t status;         /* BATON_OK while healthy */
    int ep_error;                  /* set by the UCX error handler */
    int released;                  /* the user called kv_transfer_peer_free */
    int refs;                      /* user reference + transfer structs */
};

struct kv_transfer {
    kv_transfer_engine_t *eng;
    kv_transfer_t *next, *prev;
    kv_transfer_peer_t *peer;
    const kv_transfer_pool_t *src;
    kv_transfer_state_t state;
    baton_status_t status;
    int flush_done;                /* flush request completed (successfully or not) */
    int cb_pending;                /* terminal, user callback not yet run */
    int abandoned;                 /* the user freed the handle */
    uint64_t outstanding;          /* UCX requests not yet completed (puts + flush) */
    uint64_t bytes, n_puts;
    uint64_t deadline_ns;
    kv_transfer_done_cb_t cb;
    void *cb_arg;
};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static baton_status_t ucx_error(baton_status_t st, const char *what, ucs_status_t us) {
    return baton_error(st, "kv_transfer: %s: %s", what, ucs_status_string(us));
}

/* ---------- little-endian helpers for the descriptor ---------- */

static void put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Low 32 bits of XXH3-64 over the descriptor with its checksum field
 * (bytes 52..55) read as zero. */
static uint32_t descriptor_checksum(const uint8_t *b, size_t len) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, b, 52);
    static const uint8_t zero[4] = {0};
    XXH3_64bits_update(&st, zero, 4);
    XXH3_64bits_update(&st, b + 56, len - 56);
    return (uint32_t)XXH3_64bits_digest(&st);
}

/* ---------- engine ---------- */

baton_status_t kv_transfer_engine_init(const kv_transfer_engine_config_t *config,
                                       kv_transfer_engine_t **out) {
    if (!out) return baton_error(BATON_ERR_INVALID_ARG, "kv_transfer_engine_init: out is NULL");
    /* UCX's own keepalive default (20 s in 1.13) unless configured: a short
     * interval makes a busy peer (a long forward step between progress
     * calls) look dead. A dead process is still seen at once (connection
     * reset), a hung one by the transfer deadline and the heartbeats. */
    uint32_t keepalive_ms = config ? config->keepalive_ms : 0;
    kv_transfer_engine_t *eng = calloc(1, sizeof(*eng));
    if (!eng) return baton_error(BATON_ERR_NO_MEMORY, "kv_transfer: engine allocation failed");
    eng->efd = -1;
    eng->err_mode_peer = !(config && config->no_peer_error_handling);

    ucp_config_t *ucfg = NULL;
    ucs_status_t us = ucp_config_read(NULL, NULL, &ucfg);
    baton_status_t st;
    if (us != UCS_OK) {
        st = ucx_error(BATON_ERR_IO, "ucp_config_read", us);
        goto err_free;
    }
    if (keepalive_ms && !getenv("UCX_KEEPALIVE_INTERVAL")) {
        char val[32];
        snprintf(val, sizeof(val), "%ums", keepalive_ms);
        us = ucp_config_modify(ucfg, "KEEPALIVE_INTERVAL", val);
        if (us != UCS_OK) LOG_WARN(KVT_COMP, "cannot set UCX keepalive: %s", ucs_status_string(us));
    }
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = 0,
    };
    us = ucp_init(&params, ucfg, &eng->context);
    ucp_config_release(ucfg);
    if (us != UCS_OK) {
        st = ucx_error(BATON_ERR_IO, "ucp_init", us);
        goto err_free;
    }
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_EVENTS,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
        .events = UCP_WAKEUP_RMA | UCP_WAKEUP_TX | UCP_WAKEUP_RX,
    };
    us = ucp_worker_create(eng->context, &wp, &eng->worker);
    if (us != UCS_OK) {
        st = ucx_error(BATON_ERR_IO, "ucp_worker_create", us);
        goto err_cleanup_context;
    }
    us = ucp_worker_get_efd(eng->worker, &eng->efd);
    if (us != UCS_OK) {
        st = ucx_error(BATON_ERR_IO, "ucp_worker_get_efd", us);
        goto err_destroy_worker;
    }
    us = ucp_worker_get_address(eng->worker, &eng->worker_addr, &eng->worker_addr_len);
    if (us != UCS_OK) {
        st = ucx_error(BATON_ERR_IO, "ucp_worker_get_address", us);
        goto err_destroy_worker;
    }
    *out = eng;
    return BATON_OK;

err_destroy_worker:
    ucp_worker_destroy(eng->worker);
err_cleanup_context:
    ucp_cleanup(eng->context);
err_free:
    free(eng);
    return st;
}

int kv_transfer_engine_event_fd(const kv_transfer_engine_t *eng) { return eng ? eng->efd : -1; }

static void list_unlink_xfer(kv_transfer_t *x) {
    if (x->prev) x->prev->next = x->next;
    else x->eng->xfers = x->next;
    if (x->next) x->next->prev = x->prev;
    x->next = x->prev = NULL;
}

static void list_unlink_peer(kv_transfer_peer_t *p) {
    if (p->prev) p->prev->next = p->next;
    else p->eng->peers = p->next;
    if (p->next) p->next->prev = p->prev;
    p->next = p->prev = NULL;
}

/* Marks a non-terminal transfer FAILED; the user callback runs in settle. */
static void xfer_fail(kv_transfer_t *x, baton_status_t st) {
    if (x->state == KV_TRANSFER_STATE_DONE || x->state == KV_TRANSFER_STATE_FAILED) return;
    x->state = KV_TRANSFER_STATE_FAILED;
    x->status = st;
    x->cb_pending = !x->abandoned;
}

static void engine_track_close(kv_transfer_engine_t *eng, void *req) {
    if (eng->n_closing == eng->cap_closing) {
        size_t cap = eng->cap_closing ? eng->cap_closing * 2 : 8;
        void **n = realloc(eng->closing, cap * sizeof(*n));
        if (!n) {
            /* Cannot track it: wait for it here, bounded. */
            uint64_t end = now_ns() + (uint64_t)KVT_CLOSE_WAIT_MS * 1000000ull;
            while (ucp_request_check_status(req) == UCS_INPROGRESS && now_ns() < end)
                ucp_worker_progress(eng->worker);
            if (ucp_request_check_status(req) != UCS_INPROGRESS) ucp_request_free(req);
            return;
        }
        eng->closing = n;
        eng->cap_closing = cap;
    }
    eng->closing[eng->n_closing++] = req;
}

/* Destroys the rkeys and closes the endpoint (FORCE when the peer failed or
 * requests are still outstanding on it, otherwise a flushing close). */
static void peer_close_ep(kv_transfer_peer_t *p, int force) {
    if (p->k_rkey) ucp_rkey_destroy(p->k_rkey);
    if (p->v_rkey) ucp_rkey_destroy(p->v_rkey);
    p->k_rkey = p->v_rkey = NULL;
    if (!p->ep) return;
    ucp_ep_h ep = p->ep;
    p->ep = NULL;
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
        .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0,
    };
    void *req = ucp_ep_close_nbx(ep, &prm);
    if (req && !UCS_PTR_IS_ERR(req)) engine_track_close(p->eng, req);
}

static void peer_unref(kv_transfer_peer_t *p) {
    if (--p->refs > 0) return;
    peer_close_ep(p, 1);
    list_unlink_peer(p);
    free(p);
}

static void xfer_destroy(kv_transfer_t *x) {
    list_unlink_xfer(x);
    kv_transfer_peer_t *p = x->peer;
    free(x);
    peer_unref(p);
}

/* After UCX calls: handles endpoint failures and deadlines, runs user
 * callbacks, reaps abandoned transfers whose requests have all completed and
 * finished endpoint closes. Safe against callbacks freeing transfers. */
static void engine_settle(kv_transfer_engine_t *eng) {
    if (eng->settling) return;
    eng->settling = 1;
    uint64_t now = now_ns();

    /* Deadlines: a transfer past its deadline fails with TIMEOUT and its
     * endpoint is treated as broken (its state is unknown). */
    for (kv_transfer_t *x = eng->xfers; x; x = x->next) {
        if ((x->state == KV_TRANSFER_STATE_ACTIVE || x->state == KV_TRANSFER_STATE_FLUSHING) &&
            now > x->deadline_ns) {
            LOG_WARN(KVT_COMP, "transfer timed out after %llu bytes",
                     (unsigned long long)x->bytes);
            xfer_fail(x, BATON_ERR_TIMEOUT);
            if (x->peer->status == BATON_OK) x->peer->status = BATON_ERR_TIMEOUT;
        }
    }
    /* Broken endpoints: fail every transfer on them, force-close. */
    for (kv_transfer_peer_t *p = eng->peers; p; p = p->next) {
        if (p->ep_error && p->status == BATON_OK) p->status = BATON_ERR_PEER;
        if (p->status != BATON_OK && p->ep) {
            for (kv_transfer_t *x = eng->xfers; x; x = x->next)
                if (x->peer == p) xfer_fail(x, p->status);
            peer_close_ep(p, 1);
        }
    }
    /* User callbacks and reaping; restart the scan after anything that may
     * have changed the list. */
    for (;;) {
        int changed = 0;
        for (kv_transfer_t *x = eng->xfers; x; x = x->next) {
            if (x->state == KV_TRANSFER_STATE_FLUSHING && x->flush_done && x->outstanding == 0) {
                if (x->status == BATON_OK) {
                    x->state = KV_TRANSFER_STATE_DONE;
                    x->cb_pending = !x->abandoned;
                } else {
                    xfer_fail(x, x->status);
                }
            }
            if (x->cb_pending) {
                x->cb_pending = 0;
                if (x->cb) {
                    x->cb(x, x->status, x->cb_arg);
                    changed = 1;
                    break;
                }
            }
            if (x->abandoned && x->outstanding == 0) {
                xfer_destroy(x);
                changed = 1;
                break;
            }
        }
        if (!changed) break;
    }
    /* Finished endpoint closes. */
    for (size_t i = 0; i < eng->n_closing;) {
        if (ucp_request_check_status(eng->closing[i]) != UCS_INPROGRESS) {
            ucp_request_free(eng->closing[i]);
            eng->closing[i] = eng->closing[--eng->n_closing];
        } else {
            i++;
        }
    }
    eng->settling = 0;
}

baton_status_t kv_transfer_engine_progress(kv_transfer_engine_t *eng) {
    if (!eng) return baton_error(BATON_ERR_INVALID_ARG, "kv_transfer_engine_progress: NULL engine");
    baton_status_t st = BATON_OK;
    for (;;) {
        while (ucp_worker_progress(eng->worker)) {
        }
        engine_settle(eng);
        ucs_status_t us = ucp_worker_arm(eng->worker);
        if (us == UCS_OK) break;
        if (us != UCS_ERR_BUSY) {
            st = ucx_error(BATON_ERR_IO, "ucp_worker_arm", us);
            break;
        }
    }
    engine_settle(eng);
    return st;
}

baton_status_t kv_transfer_engine_wait(kv_transfer_engine_t *eng, int timeout_ms) {
    if (!eng) return baton_error(BATON_ERR_INVALID_ARG, "kv_transfer_engine_wait: NULL engine");
    int slice = timeout_ms < 0 ? 100 : (timeout_ms < 100 ? timeout_ms : 100);
    struct pollfd pfd = {.fd = eng->efd, .events = POLLIN};
    int rc = poll(&pfd, 1, slice);
    if (rc < 0 && errno != EINTR)
        return baton_error(BATON_ERR_IO, "kv_transfer: poll on UCX event fd: %s", strerror(errno));
    return kv_transfer_engine_progress(eng);
}

void kv_transfer_engine_free(kv_transfer_engine_t *eng) {
    if (!eng) return;
    if (eng->peers || eng->xfers)
        LOG_WARN(KVT_COMP, "engine freed with peers or transfers still alive");
    for (kv_transfer_t *x = eng->xfers; x; x = x->next) xfer_fail(x, BATON_ERR_CANCELLED);
    for (kv_transfer_peer_t *p = eng->peers; p; p = p->next) peer_close_ep(p, 1);
    engine_settle(eng);
    uint64_t end = now_ns() + (uint64_t)KVT_CLOSE_WAIT_MS * 1000000ull;
    while ((eng->n_closing || eng->xfers) && now_ns() < end) {
        ucp_worker_progress(eng->worker);
        engine_settle(eng);
    }
    for (size_t i = 0; i < eng->n_closing; i++) ucp_request_free(eng->closing[i]);
    free(eng->closing);
    /* Anything the user leaked goes with the worker (endpoints are closed
     * above). */
    while (eng->xfers) {
        kv_transfer_t *x = eng->xfers;
        list_unlink_xfer(x);
        free(x);
    }
    while (eng->peers) {
        kv_transfer_peer_t *p = eng->peers;
        list_unlink_peer(p);
        free(p);
    }
    ucp_worker_release_address(eng->worker, eng->worker_addr);
    ucp_worker_destroy(eng->worker);
    ucp_cleanup(eng->context);
    free(eng);
}

/* ---------- pools ---------- */

/* Maps [*base, *base + bytes), or allocates it when *base is NULL (then
 * *base receives the address). */
static baton_status_t map_region(kv_transfer_engine_t *eng, void **base, uint64_t bytes,
                                 ucp_mem_h *memh, void **rkey_buf, size_t *rkey_len) {
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .address = *base,
        .length = bytes,
        .flags = *base ? 0 : UCP_MEM_MAP_ALLOCATE,
    };
    ucs_status_t us = ucp_mem_map(eng->context, &mp, memh);
    if (us != UCS_OK) return ucx_error(BATON_ERR_IO, "ucp_mem_map", us);
    if (!*base) {
        ucp_mem_attr_t attr = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
        us = ucp_mem_query(*memh, &attr);
        if (us != UCS_OK) {
            ucp_mem_unmap(eng->context, *memh);
            *memh = NULL;
            return ucx_error(BATON_ERR_IO, "ucp_mem_query", us);
        }
        *base = attr.address;
    }
    us = ucp_rkey_pack(eng->context, *memh, rkey_buf, rkey_len);
    if (us != UCS_OK) {
        ucp_mem_unmap(eng->context, *memh);
        *memh = NULL;
        return ucx_error(BATON_ERR_IO, "ucp_rkey_pack", us);
    }
    return BATON_OK;
}

static baton_status_t pool_make(kv_transfer_engine_t *eng, const kv_transfer_pool_desc_t *desc,
                                int allocate, kv_transfer_pool_t **out);

baton_status_t kv_transfer_pool_register(kv_transfer_engine_t *eng,
                                         const kv_transfer_pool_desc_t *desc,
                                         kv_transfer_pool_t **out) {
    return pool_make(eng, desc, 0, out);
}

baton_status_t kv_transfer_pool_alloc(kv_transfer_engine_t *eng, int32_t n_layers,
                                      int32_t n_blocks, uint64_t block_bytes,
                                      kv_transfer_pool_t **out) {
    kv_transfer_pool_desc_t d = {.n_layers = n_layers, .n_blocks = n_blocks,
                                 .block_bytes = block_bytes};
    return pool_make(eng, &d, 1, out);
}

const kv_transfer_pool_desc_t *kv_transfer_pool_get_desc(const kv_transfer_pool_t *pool) {
    return pool ? &pool->desc : NULL;
}

static baton_status_t pool_make(kv_transfer_engine_t *eng, const kv_transfer_pool_desc_t *desc,
                                int allocate, kv_transfer_pool_t **out) {
    if (!eng || !desc || !out)
        return baton_error(BATON_ERR_INVALID_ARG, "kv_transfer_pool_register: NULL argument");
    if ((!allocate && (!desc->k_base || !desc->v_base)) || desc->n_layers <= 0 || desc->n_blocks <= 0 ||
        desc->block_bytes == 0)
        return baton_error(BATON_ERR_INVALID_ARG,
                           "kv_transfer_pool_register: bad pool (n_layers %d, n_blocks %d, "
                           "block_bytes %llu, bases %p/%p)",
                           desc->n_layers, desc->n_blocks,
                           (unsigned long long)desc->block_bytes, desc->k_base, desc->v_base);
    uint64_t blocks = (uint64_t)desc->n_layers * (uint64_t)desc->n_blocks;
    if (desc->block_bytes > UINT64_MAX / blocks || blocks * desc->block_bytes > (uint64_t)SIZE_MAX / 2)
        return baton_error(BATON_ERR_INVALID_ARG, "kv_transfer_pool_register: pool size overflows");
    kv_transfer_pool_t *pool = calloc(1, sizeof(*pool));
    if (!pool) return baton_error(BATON_ERR_NO_MEMORY, "kv_transfer: pool allocation failed");
    pool->eng = eng;
    pool->desc = *desc;
    pool->region_bytes = blocks * desc->block_bytes;
    if (allocate) pool->desc.k_base = pool->desc.v_base = NULL;
    baton_status_t st = map_region(eng, &pool->desc.k_base, pool->region_bytes, &pool->k_memh,
                                   &pool->k_rkey_buf, &pool->k_rkey_len);
    if (st != BATON_OK) goto err_free;
    st = map_region(eng, &pool->desc.v_base, pool->region_bytes, &pool->v_memh,
                    &pool->v_rkey_buf, &pool->v_rkey_len);
    if (st != BATON_OK) goto err_unmap_k;
    *out = pool;
    return BATON_OK;

err_unmap_k:
    ucp_rkey_buffer_release(pool->k_rkey_buf);
    ucp_mem_unmap(eng->context, pool->k_memh);
err_free:
    free(pool);
    return st;
}

void kv_transfer_pool_free(kv_transfer_pool_t *pool) {
    if (!pool) return;
    ucp_rkey_buffer_release(pool->k_rkey_buf);
    ucp_rkey_buffer_release(pool->v_rkey_buf);
    ucp_mem_unmap(pool->eng->context, pool->k_memh);
    ucp_mem_unmap(pool->eng->context, pool->v_memh);
    free(pool);
}

baton_status_t kv_transfer_pool_pack(const kv_transfer_pool_t *pool, void **out_buf,
                                     size_t *out_len) {
    if (!pool || !out_buf || !out_len)
        return baton_error(BATON_ERR_INVALID_ARG, "kv_transfer_pool_pack: NULL argument");
    const kv_transfer_engine_t *eng = pool->eng;
    size_t len = KVT_HEADER_BYTES + eng->worker_addr_len + pool->k_rkey_len + pool->v_rkey_len;
    uint8_t *b = malloc(len);
    if (!b) return baton_error(BATON_ERR_NO_MEMORY, "kv_transfer: descriptor allocation failed");
    memcpy(b, KVT_MAGIC, 4);
    put_u16(b + 4, KVT_VERSION);
    put_u16(b + 6, 0);
    put_u32(b + 8, (uint32_t)pool->desc.n_layers);
    put_u32(b + 12, (uint32_t)pool->desc.n_blocks);
    put_u64(b + 16, pool->desc.block_bytes);
    put_u64(b + 24, (uint64_t)(uintptr_t)pool->desc.k_base);
    put_u64(b + 32, (uint64_t)(uintptr_t)pool->desc.v_base);
    put_u32(b + 40, (uint32_t)eng->worker_addr_len);
    put_u32(b + 44, (uint32_t)pool->k_rkey_len);
    put_u32(b + 48, (uint32_t)pool->v_rkey_len);
    put_u32(b + 52, 0);
    uint8_t *p = b + KVT_HEADER_BYTES;
    memcpy(p, eng->worker_addr, eng->worker_addr_len);
    p += eng->worker_addr_len;
    memcpy(p, pool->k_rkey_buf, pool->k_rkey_len);
    p += pool->k_rkey_len;
    memcpy(p, pool->v_rkey_buf, pool->v_rkey_len);
    put_u32(b + 52, descriptor_checksum(b, len));
    *out_buf = b;
    *out_len = len;
    return BATON_OK;
}

/* Parses the descriptor; on success also returns the offsets of its three
 * variable parts. */
static baton_status_t descriptor_parse(const void *buf, size_t len, kv_transfer_remote_info_t *info,
                                       const uint8_t **addr, size_t *addr_len,
                                       const uint8_t **krk, size_t *krk_len,
                                       const uint8_t **vrk, size_t *vrk_len) {
    const uint8_t *b = buf;
    if (!b || len < KVT_HEADER_BYTES)
        return baton_error(BATON_ERR_FORMAT, "kv_transfer descriptor: %zu bytes, need at least %d",
                           len, KVT_HEADER_BYTES);
    if (memcmp(b, KVT_MAGIC, 4) != 0)
        return baton_error(BATON_ERR_FORMAT, "kv_transfer descriptor: bad magic");
    uint16_t ver = get_u16(b + 4);
    if (ver > KVT_VERSION)
        return baton_error(BATON_ERR_VERSION, "kv_transfer descriptor: version %u, newest known %d",
                           ver, KVT_VERSION);
    if (ver == 0) return baton_error(BATON_ERR_FORMAT, "kv_transfer descriptor: version 0");
    uint32_t n_layers = get_u32(b + 8), n_blocks = get_u32(b + 12);
    uint64_t block_bytes = get_u64(b + 16);
    if (n_layers == 0 || n_layers > INT32_MAX || n_blocks == 0 || n_blocks > INT32_MAX ||
        block_bytes == 0 || block_bytes > (1ull << 40))
        return baton_error(BATON_ERR_FORMAT,
                           "kv_transfer descriptor: geometry out of range (n_layers %u, "
                           "n_blocks %u, block_bytes %llu)",
                           n_layers, n_blocks, (unsigned long long)block_bytes);
    uint64_t region = (uint64_t)n_layers * n_blocks;
    if (block_bytes > UINT64_MAX / region)
        return baton_error(BATON_ERR_FORMAT, "kv_transfer descriptor: pool size overflows");
    region *= block_bytes;
    uint64_t k_addr = get_u64(b + 24), v_addr = get_u64(b + 32);
    if (k_addr == 0 || v_addr == 0 || k_addr > UINT64_MAX - region || v_addr > UINT64_MAX - region)
        return baton_error(BATON_ERR_FORMAT, "kv_transfer descriptor: bad region address");
    uint32_t al = get_u32(b + 40), kl = get_u32(b + 44), vl = get_u32(b + 48);
    if (al == 0 || kl == 0 || vl == 0 || al > KVT_MAX_BLOB_PART || kl > KVT_MAX_BLOB_PART ||
        vl > KVT_MAX_BLOB_PART)
        return baton_error(BATON_ERR_FORMAT,
                           "kv_transfer descriptor: bad part lengths (address %u, rkeys %u/%u)",
                           al, kl, vl);
    if ((uint64_t)KVT_HEADER_BYTES + al + kl + vl != len)
        return baton_error(BATON_ERR_FORMAT,
                           "kv_transfer descriptor: %zu bytes, header says %llu", len,
                           (unsigned long long)KVT_HEADER_BYTES + al + kl + vl);
    if (get_u32(b + 52) != descriptor_checksum(b, len))
        return baton_error(BATON_ERR_FORMAT, "kv_transfer descriptor: checksum mismatch");
    info->n_layers = (int32_t)n_layers;
    info->n_blocks = (int32_t)n_blocks;
    info->block_bytes = block_bytes;
    info->k_addr = k_addr;
    info->v_addr = v_addr;
    if (addr) {
        *addr = b + KVT_HEADER_BYTES;
        *addr_len = al;
        *krk = *addr + al;
        *krk_len = kl;
        *vrk = *krk + kl;
        *vrk_len = vl;
    }
    return BATON_OK;
}

baton_status_t kv_transfer_descriptor_parse(const void *buf, size_t len,
                                            kv_transfer_remote_info_t *out) {
    if (!out) return baton_error(BATON_ERR_INVALID_ARG, "kv_transfer_descriptor_parse: out is NULL");
    kv_transfer_remote_info_t info;
    baton_status_t st = descriptor_parse(buf, len, &info, NULL, NULL, NULL, NULL, NULL, NULL);
    if (st == BATON_OK) *out = info;
    return st;
}

/* ---------- peers ---------- */

static void peer_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status) {
    kv_transfer_peer_t *p = arg;
    LOG_WARN(KVT_COMP, "peer endpoint failed: %s", ucs_status_string(status));
    p->ep_error = 1;
}

baton_status_t kv_transfer_peer_connect(kv_transfer_engine_t *eng, const void *desc,
                                        size_t desc_len, kv_transfer_peer_t **out) {
    if (!eng || !out)
        return baton_error(BATON_ERR_INVALID_ARG, "kv_transfer_peer_connect: NULL argument");
    kv_transfer_remote_info_t info;
    const uint8_t *addr, *krk, *vrk;
    size_t al, kl, vl;
    baton_status_t st = descriptor_parse(desc, desc_len, &info, &addr, &al, &krk, &kl, &vrk, &vl);
    if (st != BATON_OK) return st;

    kv_transfer_peer_t *p = calloc(1, sizeof(*p));
    if (!p) return baton_error(BATON_ERR_NO_MEMORY, "kv_transfer: peer allocation failed");
    p->eng = eng;
    p->info = info;
    p->refs = 1;
    /* UCX reads the address during ucp_ep_create only; copy it so that the
     * buffer it reads is aligned and owned. */
    void *addr_copy = malloc(al);
    if (!addr_copy) {
        free(p);
        return baton_error(BATON_ERR_NO_MEMORY, "kv_transfer: address copy failed");
    }
    memcpy(addr_copy, addr, al);
    ucp_ep_params_t ep_params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = addr_copy,
        .err_mode = eng->err_mode_peer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE,
        .err_handler = {.cb = peer_err_cb, .arg = p},
    };
    ucs_status_t us = ucp_ep_create(eng->worker, &ep_params, &p->ep);
    free(addr_copy);
    if (us != UCS_OK) {
        free(p);
        return ucx_error(BATON_ERR_PEER, "ucp_ep_create", us);
    }
    /* Link now so that failures below close the endpoint through the engine. */
    p->next = eng->peers;
    if (eng->peers) eng->peers->prev = p;
    eng->peers = p;
    void *rk_copy = malloc(kl > vl ? kl : vl);
    if (!rk_copy) {
        st = baton_error(BATON_ERR_NO_MEMORY, "kv_transfer: rkey copy failed");
        goto err_close;
    }
    memcpy(rk_copy, krk, kl);
    us = ucp_ep_rkey_unpack(p->ep, rk_copy, &p->k_rkey);
    if (us == UCS_OK) {
        memcpy(rk_copy, vrk, vl);
        us = ucp_ep_rkey_unpack(p->ep, rk_copy, &p->v_rkey);
    }
    free(rk_copy);
    if (us != UCS_OK) {
        st = ucx_error(BATON_ERR_PEER, "ucp_ep_rkey_unpack", us);
        goto err_close;
    }
    *out = p;
    return BATON_OK;

err_close:
    p->refs = 0;
    peer_close_ep(p, 1);
    list_unlink_peer(p);
    free(p);
    return st;
}

const kv_transfer_remote_info_t *kv_transfer_peer_info(const kv_transfer_peer_t *peer) {
    return peer ? &peer->info : NULL;
}

baton_status_t kv_transfer_peer_status(const kv_transfer_peer_t *peer) {
    if (!peer) return BATON_ERR_INVALID_ARG;
    if (peer->status != BATON_OK) return peer->status;
    return peer->ep_error ? BATON_ERR_PEER : BATON_OK;
}

void kv_transfer_peer_free(kv_transfer_peer_t *peer) {
    if (!peer || peer->released) return;
    kv_transfer_engine_t *eng = peer->eng;
    peer->released = 1;
    int outstanding = 0;
    for (kv_transfer_t *x = eng->xfers; x; x = x->next) {
        if (x->peer != peer) continue;
        xfer_fail(x, BATON_ERR_CANCELLED);
        if (x->outstanding) outstanding = 1;
    }
    peer_close_ep(peer, outstanding || peer->status != BATON_OK || peer->ep_error);
    if (peer->status == BATON_OK) peer->status = BATON_ERR_CANCELLED;
    engine_settle(eng);
    peer_unref(peer);
}

/* ---------- transfers ---------- */

baton_status_t kv_transfer_begin(kv_transfer_peer_t *peer, const kv_transfer_pool_t *src,
                                 uint32_t timeout_ms, kv_transfer_done_cb_t cb, void *arg,
                                 kv_transfer_t **out) {
    if (!peer || !src || !out)
        return baton_error(BATON_ERR_INVALID_ARG, "kv_transfer_begin: NULL argument");
    if (src->eng != peer->eng)
        return baton_error(BATON_ERR_INVALID_ARG, "kv_transfer_begin: pool and peer on different engines");
    if (src->desc.n_layers != peer->info.n_layers || src->desc.block_bytes != peer->info.block_bytes)
        return baton_error(BATON_ERR_INVALID_ARG,
                           "kv_transfer_begin: KV geometry differs (local %d layers x %llu "
                           "bytes/block, peer %d x %llu)",
                           src->desc.n_layers, (unsigned long long)src->desc.block_bytes,
                           peer->info.n_layers, (unsigned long long)peer->info.block_bytes);
    baton_status_t pst = kv_transfer_peer_status(peer);
    if (pst != BATON_OK || !peer->ep)
        return baton_error(BATON_ERR_PEER, "kv_transfer_begin: peer has failed (%s)",
                           baton_status_str(pst != BATON_OK ? pst : BATON_ERR_PEER));
    kv_transfer_t *x = calloc(1, sizeof(*x));
    if (!x) return baton_error(BATON_ERR_NO_MEMORY, "kv_transfer: transfer allocation failed");
    x->eng = peer->eng;
    x->peer = peer;
    x->src = src;
    x->state = KV_TRANSFER_STATE_ACTIVE;
    x->status = BATON_OK;
    x->cb = cb;
    x->cb_arg = arg;
    x->deadline_ns = now_ns() + (uint64_t)(timeout_ms ? timeout_ms : KVT_DEFAULT_TIMEOUT_MS) * 1000000ull;
    peer->refs++;
    x->next = x->eng->xfers;
    if (x->eng->xfers) x->eng->xfers->prev = x;
    x->eng->xfers = x;
    *out = x;
    return BATON_OK;
}

static void put_done_cb(void *request, ucs_status_t status, void *user_data) {
    kv_transfer_t *x = user_data;
    x->outstanding--;
    if (status != UCS_OK && x->status == BATON_OK) {
        x->status = BATON_ERR_PEER;
        if (x->state == KV_TRANSFER_STATE_ACTIVE) xfer_fail(x, BATON_ERR_PEER);
    }
    ucp_request_free(request);
}

static void flush_done_cb(void *request, ucs_status_t status, void *user_data) {
    kv_transfer_t *x = user_data;
    x->outstanding--;
    x->flush_done = 1;
    if (status != UCS_OK && x->status == BATON_OK) x->status = BATON_ERR_PEER;
    ucp_request_free(request);
}

static baton_status_t xfer_put(kv_transfer_t *x, void *local, uint64_t bytes, uint64_t remote,
                               ucp_rkey_h rkey, ucp_mem_h memh) {
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_MEMH,
        .cb.send = put_done_cb,
        .user_data = x,
        .memh = memh,
    };
    void *req = ucp_put_nbx(x->peer->ep, local, bytes, remote, rkey, &prm);
    x->n_puts++;
    x->bytes += bytes;
    if (req == NULL) return BATON_OK;
    if (UCS_PTR_IS_ERR(req)) {
        ucs_status_t us = UCS_PTR_STATUS(req);
        xfer_fail(x, BATON_ERR_PEER);
        return ucx_error(BATON_ERR_PEER, "ucp_put_nbx", us);
    }
    x->outstanding++;
    return BATON_OK;
}

baton_status_t kv_transfer_send_layer(kv_transfer_t *xfer, int32_t layer,
                                      const kv_transfer_block_pair_t *pairs, size_t n_pairs) {
    if (!xfer || (!pairs && n_pairs))
        return baton_error(BATON_ERR_INVALID_ARG, "kv_transfer_send_layer: NULL argument");
    kv_transfer_t *x = xfer;
    kv_transfer_peer_t *p = x->peer;
    if (x->state == KV_TRANSFER_STATE_ACTIVE && (p->ep_error || p->status != BATON_OK || !p->ep))
        xfer_fail(x, p->status != BATON_OK ? p->status : BATON_ERR_PEER);
    if (x->state == KV_TRANSFER_STATE_FAILED)
        return baton_error(x->status, "kv_transfer_send_layer: transfer has failed (%s)",
                           baton_status_str(x->status));
    if (x->state != KV_TRANSFER_STATE_ACTIVE)
        return baton_error(BATON_ERR_INVALID_ARG, "kv_transfer_send_layer: transfer already flushed");
    const kv_transfer_pool_desc_t *s = &x->src->desc;
    if (layer < 0 || layer >= s->n_layers)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "kv_transfer_send_layer: layer %d not in [0, %d)",
                           layer, s->n_layers);
    for (size_t i = 0; i < n_pairs; i++) {
        if (pairs[i].src_block < 0 || pairs[i].src_block >= s->n_blocks)
            return baton_error(BATON_ERR_OUT_OF_RANGE,
                               "kv_transfer_send_layer: pair %zu: source block %d not in [0, %d)",
                               i, pairs[i].src_block, s->n_blocks);
        if (pairs[i].dst_block < 0 || pairs[i].dst_block >= p->info.n_blocks)
            return baton_error(BATON_ERR_OUT_OF_RANGE,
                               "kv_transfer_send_layer: pair %zu: destination block %d not in [0, %d)",
                               i, pairs[i].dst_block, p->info.n_blocks);
    }
    const uint64_t bb = s->block_bytes;
    const uint64_t src_layer = (uint64_t)layer * (uint64_t)s->n_blocks;
    const uint64_t dst_layer = (uint64_t)layer * (uint64_t)p->info.n_blocks;
    for (size_t i = 0; i < n_pairs;) {
        size_t run = 1;
        while (i + run < n_pairs && pairs[i + run].src_block == pairs[i].src_block + (int32_t)run &&
               pairs[i + run].dst_block == pairs[i].dst_block + (int32_t)run)
            run++;
        uint64_t src_off = (src_layer + (uint64_t)pairs[i].src_block) * bb;
        uint64_t dst_off = (dst_layer + (uint64_t)pairs[i].dst_block) * bb;
        uint64_t bytes = run * bb;
        baton_status_t st = xfer_put(x, (uint8_t *)s->k_base + src_off, bytes,
                                     p->info.k_addr + dst_off, p->k_rkey, x->src->k_memh);
        if (st == BATON_OK)
            st = xfer_put(x, (uint8_t *)s->v_base + src_off, bytes, p->info.v_addr + dst_off,
                          p->v_rkey, x->src->v_memh);
        if (st != BATON_OK) return st;
        i += run;
    }
    return BATON_OK;
}

baton_status_t kv_transfer_restart_deadline(kv_transfer_t *xfer, uint32_t timeout_ms) {
    if (!xfer || xfer->state != KV_TRANSFER_STATE_ACTIVE)
        return baton_error(BATON_ERR_INVALID_ARG, "kv_transfer_restart_deadline: no active transfer");
    xfer->deadline_ns =
        now_ns() + (uint64_t)(timeout_ms ? timeout_ms : KVT_DEFAULT_TIMEOUT_MS) * 1000000ull;
    return BATON_OK;
}

baton_status_t kv_transfer_flush(kv_transfer_t *xfer) {
    if (!xfer) return baton_error(BATON_ERR_INVALID_ARG, "kv_transfer_flush: NULL transfer");
    kv_transfer_t *x = xfer;
    kv_transfer_peer_t *p = x->peer;
    if (x->state == KV_TRANSFER_STATE_ACTIVE && (p->ep_error || p->status != BATON_OK || !p->ep))
        xfer_fail(x, p->status != BATON_OK ? p->status : BATON_ERR_PEER);
    if (x->state == KV_TRANSFER_STATE_FAILED)
        return baton_error(x->status, "kv_transfer_flush: transfer has failed (%s)",
                           baton_status_str(x->status));
    if (x->state != KV_TRANSFER_STATE_ACTIVE)
        return baton_error(BATON_ERR_INVALID_ARG, "kv_transfer_flush: transfer already flushed");
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = flush_done_cb,
        .user_data = x,
    };
    x->state = KV_TRANSFER_STATE_FLUSHING;
    void *req = ucp_ep_flush_nbx(p->ep, &prm);
    if (req == NULL) {
        x->flush_done = 1;
    } else if (UCS_PTR_IS_ERR(req)) {
        x->flush_done = 1;
        x->status = BATON_ERR_PEER;
        LOG_WARN(KVT_COMP, "ucp_ep_flush_nbx: %s", ucs_status_string(UCS_PTR_STATUS(req)));
    } else {
        x->outstanding++;
    }
    engine_settle(x->eng); /* may run the callback (and free x) */
    return BATON_OK;
}

kv_transfer_state_t kv_transfer_get_state(const kv_transfer_t *xfer) {
    return xfer ? xfer->state : KV_TRANSFER_STATE_FAILED;
}

baton_status_t kv_transfer_status(const kv_transfer_t *xfer) {
    if (!xfer) return BATON_ERR_INVALID_ARG;
    return xfer->state == KV_TRANSFER_STATE_FAILED ? xfer->status : BATON_OK;
}

uint64_t kv_transfer_bytes(const kv_transfer_t *xfer) { return xfer ? xfer->bytes : 0; }
uint64_t kv_transfer_n_puts(const kv_transfer_t *xfer) { return xfer ? xfer->n_puts : 0; }

void kv_transfer_free(kv_transfer_t *xfer) {
    if (!xfer || xfer->abandoned) return;
    xfer->abandoned = 1;
    xfer->cb_pending = 0;
    if (xfer->state == KV_TRANSFER_STATE_ACTIVE || xfer->state == KV_TRANSFER_STATE_FLUSHING) {
        xfer->state = KV_TRANSFER_STATE_FAILED;
        xfer->status = BATON_ERR_CANCELLED;
    }
    if (!xfer->eng->settling) engine_settle(xfer->eng);
}
