/* KV data plane: one-sided UCX puts of KV blocks from a prefill worker's
 * pool into a decode worker's registered pool (DESIGN.md, "KV cache" and
 * step 3-4 of the data flow).
 *
 * Objects (all owned by one thread, the one running the process's event
 * loop; the UCX worker is created in UCS_THREAD_MODE_SINGLE):
 *
 *   kv_transfer_engine_t  a UCP context + worker (one per process). Its event
 *                         fd goes into the event loop; kv_transfer_engine_progress
 *                         drives every callback below.
 *   kv_transfer_pool_t    a KV pool (K and V regions) registered once with
 *                         ucp_mem_map. On the decode side its descriptor
 *                         (worker address, base addresses, geometry, packed
 *                         rkeys) travels to prefill workers over the control
 *                         plane; on the prefill side it is the put source.
 *   kv_transfer_peer_t    the prefill side's endpoint to one decode pool
 *                         (created from that descriptor; error handling mode
 *                         PEER), with the unpacked rkeys. Cache one per peer.
 *   kv_transfer_t         one request's transfer to one peer: puts issued
 *                         layer by layer, then a flush; its completion
 *                         callback fires once, after remote completion of
 *                         every put (state DONE) or on failure (FAILED).
 *
 * Pool layout (kernels/backend.h): K and V are separate regions of identical
 * shape; region = [n_layers][n_blocks][block_bytes] bytes, so (layer, block)
 * lives at base + (layer * n_blocks + block) * block_bytes and one block of
 * one layer is contiguous. Two pools are compatible when n_layers and
 * block_bytes match (n_blocks may differ). The module never knows the model:
 * block_bytes = block_size * n_kv_heads * head_dim * dtype size.
 *
 * Transports are whatever UCX selects (shared memory / CMA, TCP, RDMA verbs);
 * UCX_TLS in the environment restricts them. No code path assumes one.
 *
 * Failure: a peer that dies or disconnects fails every transfer to it with
 * BATON_ERR_PEER (UCP endpoint error handler), a transfer that outlives its
 * deadline fails with BATON_ERR_TIMEOUT and its endpoint is closed (FORCE).
 * Outstanding UCX requests are released in both cases; nothing waits on a
 * dead peer. */
#ifndef BATON_COMMON_KV_TRANSFER_H
#define BATON_COMMON_KV_TRANSFER_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct kv_transfer_engine kv_transfer_engine_t;
typedef struct kv_transfer_pool kv_transfer_pool_t;
typedef struct kv_transfer_peer kv_transfer_peer_t;
typedef struct kv_transfer kv_transfer_t;

typedef struct kv_transfer_engine_config {
    /* UCX keepalive interval (ms) used to notice a dead peer that sends no
     * error by itself. 0 = UCX's default (20 s in UCX 1.13): a short interval
     * makes a peer busy in a long forward step look dead. Ignored when
     * UCX_KEEPALIVE_INTERVAL is set in the environment. */
    uint32_t keepalive_ms;
    /* 0 (default): endpoints use UCP_ERR_HANDLING_MODE_PEER, so a dead or
     * disconnected peer fails its transfers with BATON_ERR_PEER. UCX 1.13
     * then selects only transports with peer-failure support (TCP, RDMA),
     * never shared memory. 1: no peer error handling, which lets UCX put
     * through shared memory (posix/sysv) into a pool made with
     * kv_transfer_pool_alloc on the same host. A dead peer is then not
     * reported by UCX: puts into its shared segment may still "succeed", and
     * only a stalled transfer fails, at its deadline (BATON_ERR_TIMEOUT);
     * the control plane (heartbeats) must notice the loss. Both sides of a
     * connection should use the same setting. */
    int no_peer_error_handling;
} kv_transfer_engine_config_t;

/* Creates a UCP context (features RMA + WAKEUP) and one worker with an event
 * fd. `config` may be NULL (defaults). Errors: BATON_ERR_IO when UCX cannot
 * start (detail holds UCX's status string). Free with kv_transfer_engine_free. */
baton_status_t kv_transfer_engine_init(const kv_transfer_engine_config_t *config,
                                       kv_transfer_engine_t **out);

/* Destroys the engine. Every pool, peer and transfer made from it must have
 * been freed first (transfers still in flight are failed with
 * BATON_ERR_CANCELLED and their callbacks run). Waits at most ~1 s for
 * endpoint closes to finish. NULL-safe. */
void kv_transfer_engine_free(kv_transfer_engine_t *eng);

/* The worker's event fd (ucp_worker_get_efd): poll it for POLLIN, then call
 * kv_transfer_engine_progress. Owned by the engine; do not close it. */
int kv_transfer_engine_event_fd(const kv_transfer_engine_t *eng);

/* Runs UCX progress until ucp_worker_arm succeeds (the standard
 * progress/arm loop that makes the event fd safe to sleep on), fails
 * transfers whose deadline passed, handles peer failures and runs
 * completion callbacks. Call it whenever the fd is readable and at least
 * every ~100 ms while transfers are in flight (deadlines are checked here).
 * Returns BATON_OK or BATON_ERR_IO when the worker cannot be armed. */
baton_status_t kv_transfer_engine_progress(kv_transfer_engine_t *eng);

/* Waits in poll() on the event fd for at most min(timeout_ms, 100) ms
 * (100 when timeout_ms < 0), then progresses once; callers loop on their
 * own condition. For tests and simple blocking callers; an event loop uses
 * event_fd + progress instead. Returns progress's status, or BATON_ERR_IO
 * when poll fails. */
baton_status_t kv_transfer_engine_wait(kv_transfer_engine_t *eng, int timeout_ms);

/* One KV pool in host memory (owned by the caller, e.g. common/kv_pool).
 * k_base and v_base each point to n_layers * n_blocks * block_bytes bytes. */
typedef struct kv_transfer_pool_desc {
    void *k_base;
    void *v_base;
    int32_t n_layers;
    int32_t n_blocks;   /* blocks per layer */
    uint64_t block_bytes; /* bytes of one block of one layer */
} kv_transfer_pool_desc_t;

/* Registers both regions with ucp_mem_map (no copy, no allocation of pool
 * memory) and packs their rkeys. The caller keeps the memory alive and in
 * place until kv_transfer_pool_free. Errors: BATON_ERR_INVALID_ARG (NULL
 * base, non-positive sizes, byte size overflow), BATON_ERR_IO (UCX). */
baton_status_t kv_transfer_pool_register(kv_transfer_engine_t *eng,
                                         const kv_transfer_pool_desc_t *desc,
                                         kv_transfer_pool_t **out);

/* Like kv_transfer_pool_register, but UCX allocates the two regions
 * (ucp_mem_map with UCP_MEM_MAP_ALLOCATE; shared memory where UCX can, so
 * that same-host peers can put through shared memory). Contents are
 * undefined. Read the region pointers with kv_transfer_pool_get_desc; they
 * are freed by kv_transfer_pool_free. Errors: as kv_transfer_pool_register. */
baton_status_t kv_transfer_pool_alloc(kv_transfer_engine_t *eng, int32_t n_layers,
                                      int32_t n_blocks, uint64_t block_bytes,
                                      kv_transfer_pool_t **out);

/* The pool's regions and geometry (valid until kv_transfer_pool_free). */
const kv_transfer_pool_desc_t *kv_transfer_pool_get_desc(const kv_transfer_pool_t *pool);

/* Unmaps the regions (and frees them if kv_transfer_pool_alloc made them). Peers' rkeys for this pool become invalid: only free a
 * pool once no prefill worker will write into it. NULL-safe. */
void kv_transfer_pool_free(kv_transfer_pool_t *pool);

/* The pool's descriptor for the control plane (decode side), a byte string
 * in the format below; *out_buf is malloc'd and freed by the caller with
 * free(). Format v1, all integers little-endian:
 *   "BKVT" u16 version=1 u16 0 | u32 n_layers u32 n_blocks u64 block_bytes |
 *   u64 k_addr u64 v_addr | u32 worker_addr_len u32 k_rkey_len u32 v_rkey_len |
 *   u32 checksum | worker address bytes | K rkey bytes | V rkey bytes.
 * checksum = low 32 bits of XXH3-64 of the whole descriptor with the
 * checksum field zeroed (catches corruption before UCX parses the opaque
 * address and rkey bytes, which UCX does not validate).
 * Errors: BATON_ERR_NO_MEMORY. */
baton_status_t kv_transfer_pool_pack(const kv_transfer_pool_t *pool, void **out_buf,
                                     size_t *out_len);

/* Decoded fixed fields of a descriptor (no UCX objects). */
typedef struct kv_transfer_remote_info {
    int32_t n_layers;
    int32_t n_blocks;
    uint64_t block_bytes;
    uint64_t k_addr, v_addr;  /* remote virtual addresses of the regions */
} kv_transfer_remote_info_t;

/* Validates a descriptor's framing (magic, version, lengths that add up
 * exactly, sizes in range, checksum) without touching UCX. Errors: BATON_ERR_FORMAT,
 * BATON_ERR_VERSION (newer major version). */
baton_status_t kv_transfer_descriptor_parse(const void *buf, size_t len,
                                            kv_transfer_remote_info_t *out);

/* Prefill side: validates `desc` (as above), creates an endpoint to the
 * remote worker (UCP_ERR_HANDLING_MODE_PEER, error handler installed) and
 * unpacks both rkeys. Errors: BATON_ERR_FORMAT / BATON_ERR_VERSION (bad
 * descriptor), BATON_ERR_PEER (UCX could not create the endpoint or unpack
 * the rkeys). Free with kv_transfer_peer_free. */
baton_status_t kv_transfer_peer_connect(kv_transfer_engine_t *eng, const void *desc,
                                        size_t desc_len, kv_transfer_peer_t **out);

/* Geometry of the peer's pool. */
const kv_transfer_remote_info_t *kv_transfer_peer_info(const kv_transfer_peer_t *peer);

/* BATON_OK while the endpoint is healthy, else the error that broke it
 * (BATON_ERR_PEER, BATON_ERR_TIMEOUT). A failed peer stays failed: free it
 * and connect again. */
baton_status_t kv_transfer_peer_status(const kv_transfer_peer_t *peer);

/* Releases the caller's reference: transfers still in flight on it are
 * failed with BATON_ERR_CANCELLED (callbacks run), the rkeys are destroyed
 * and the endpoint closed at once (flush mode if healthy with nothing
 * outstanding, FORCE otherwise; the close completes during later progress).
 * The peer's memory lives until its last transfer handle is freed.
 * NULL-safe. */
void kv_transfer_peer_free(kv_transfer_peer_t *peer);

typedef enum kv_transfer_state {
    KV_TRANSFER_STATE_ACTIVE = 0,   /* accepting kv_transfer_send_layer */
    KV_TRANSFER_STATE_FLUSHING = 1, /* flush issued, waiting for remote completion */
    KV_TRANSFER_STATE_DONE = 2,     /* every put remotely complete */
    KV_TRANSFER_STATE_FAILED = 3,   /* see kv_transfer_status */
} kv_transfer_state_t;

/* Called once when the transfer becomes DONE or FAILED (`status` BATON_OK or
 * the error), from kv_transfer_engine_progress, kv_transfer_flush or
 * kv_transfer_peer_free. The callback may call kv_transfer_free(xfer). */
typedef void (*kv_transfer_done_cb_t)(kv_transfer_t *xfer, baton_status_t status, void *arg);

/* One block move of one layer: source block id in the local pool,
 * destination block id in the peer's pool. */
typedef struct kv_transfer_block_pair {
    int32_t src_block;
    int32_t dst_block;
} kv_transfer_block_pair_t;

/* Starts a transfer from `src` (a registered local pool, compatible with the
 * peer's: same n_layers and block_bytes) to `peer`. `timeout_ms` bounds the
 * whole transfer (0 = 30000); `cb` may be NULL. Errors:
 * BATON_ERR_INVALID_ARG (incompatible geometry), BATON_ERR_PEER (peer already
 * failed), BATON_ERR_NO_MEMORY. Free with kv_transfer_free. */
baton_status_t kv_transfer_begin(kv_transfer_peer_t *peer, const kv_transfer_pool_t *src,
                                 uint32_t timeout_ms, kv_transfer_done_cb_t cb, void *arg,
                                 kv_transfer_t **out);

/* Issues the puts of one layer: for K and for V, every maximal run of pairs
 * whose src and dst blocks both increase by one becomes a single ucp_put_nbx
 * of run_length * block_bytes (pairs are taken in the given order). Every
 * pair is range-checked before anything is issued. Can be called any number
 * of times per layer and in any layer order while ACTIVE. Errors:
 * BATON_ERR_OUT_OF_RANGE (layer or block id out of range; nothing issued),
 * BATON_ERR_INVALID_ARG (not ACTIVE), BATON_ERR_PEER / BATON_ERR_TIMEOUT
 * (the transfer has failed; it stays FAILED). */
baton_status_t kv_transfer_send_layer(kv_transfer_t *xfer, int32_t layer,
                                      const kv_transfer_block_pair_t *pairs, size_t n_pairs);

/* Sets the transfer's deadline to now + timeout_ms (0 = the engine default,
 * 30 s). A prefill worker begins a transfer when the KVDestination arrives,
 * which can be long before its request leaves the prefill queue; it restarts
 * the deadline at the first put, so queueing does not eat transfer time.
 * Errors: BATON_ERR_INVALID_ARG (NULL or not ACTIVE). */
baton_status_t kv_transfer_restart_deadline(kv_transfer_t *xfer, uint32_t timeout_ms);

/* Ends the transfer: ucp_ep_flush_nbx on the endpoint, so that when the
 * callback reports BATON_OK every put is complete at the remote side and a
 * "done" control message may be sent. If the flush completes at once the
 * callback runs before this returns. Errors: BATON_ERR_INVALID_ARG (not
 * ACTIVE), the transfer's failure status when it has already failed. */
baton_status_t kv_transfer_flush(kv_transfer_t *xfer);

kv_transfer_state_t kv_transfer_get_state(const kv_transfer_t *xfer);
/* BATON_OK unless FAILED. */
baton_status_t kv_transfer_status(const kv_transfer_t *xfer);
/* Payload bytes issued so far (K and V) and ucp_put_nbx calls made. */
uint64_t kv_transfer_bytes(const kv_transfer_t *xfer);
uint64_t kv_transfer_n_puts(const kv_transfer_t *xfer);

/* Frees the handle. A transfer still in flight is abandoned (its callback is
 * not called; puts already issued may still land); the memory that UCX
 * requests still outstanding refer to is released when they complete, so
 * this never blocks. NULL-safe. */
void kv_transfer_free(kv_transfer_t *xfer);

#endif
