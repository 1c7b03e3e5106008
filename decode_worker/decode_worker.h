/* The decode worker process (baton-decode): wires decode_sched to the
 * control plane (ZeroMQ + msgpack, proto/) and the KV data plane (UCX,
 * common/kv_transfer.h) in one libevent loop (cluster.md).
 *
 * Sockets: a DEALER to the router (identity = worker id) carrying
 * WorkerRegister (at start and every register_every heartbeats, so that a
 * restarted router learns the worker again), WorkerHeartbeat, TokenChunk and
 * RequestFinished, and receiving DecodeRequest and Abort; a ROUTER bound at
 * peer_bind receiving PrefillDone from prefill workers; one cached DEALER
 * per prefill endpoint (from DecodeRequest.prefill_endpoint) carrying
 * KVDestination.
 *
 * KV pool: allocated once (kv_pool on the backend) and registered once with
 * UCX (kv_transfer_pool_register). Its descriptor travels in WorkerRegister
 * and in every KVDestination as: ucx_address = the whole
 * kv_transfer_pool_pack() descriptor (it holds the UCX worker address, the
 * region bases, both packed rkeys and a checksum; a prefill worker passes
 * it unchanged to kv_transfer_peer_connect); pool.regions = [K region,
 * V region] (base, n_layers * n_blocks * block_bytes bytes, packed rkey),
 * pool.n_blocks and pool.block_bytes repeat it for schema readers.
 *
 * Loop: while sequences run, steps run back to back with the sockets
 * drained between steps; otherwise the loop sleeps on the socket fds, the
 * UCX event fd, the heartbeat timer and the earliest prefill timeout.
 * SIGTERM / SIGINT end the loop; everything is freed. */
#ifndef BATON_DECODE_WORKER_DECODE_WORKER_H
#define BATON_DECODE_WORKER_DECODE_WORKER_H

#include <stdint.h>

#include "common/status.h"

typedef struct decode_worker_config {
    const char *router;          /* --router tcp://HOST:PORT (required) */
    const char *worker_id;       /* --worker-id (NULL: decode-<hostname>-<pid>) */
    const char *peer_bind;       /* --peer-bind (default tcp://127.0.0.1:*) */
    const char *peer_advertise;  /* --peer-advertise (NULL: the bound endpoint) */
    const char *model;           /* --model FILE (required) */
    const char *backend;         /* --backend cpu|cuda (default cpu) */
    int threads;                 /* --threads (0 = all CPUs) */
    int32_t block_size;          /* --block-size (default 16) */
    int32_t kv_blocks;           /* --kv-blocks (default 1024) */
    uint64_t hash_seed;          /* --hash-seed (default 0) */
    int32_t max_batch;           /* --max-batch (default 64) */
    int32_t watermark_blocks;    /* --watermark-blocks (default 1) */
    uint32_t prefill_timeout_ms; /* --prefill-timeout-ms (default 30000) */
    uint32_t heartbeat_ms;       /* --heartbeat-ms (default 500) */
    int32_t max_context;         /* --max-context (0 = the model's) */
} decode_worker_config_t;

/* The defaults above (router and model NULL). */
decode_worker_config_t decode_worker_config_default(void);

/* Loads the model, allocates and registers the KV pool, opens the sockets,
 * registers with the router and runs the event loop until SIGTERM/SIGINT.
 * Returns BATON_OK after a clean shutdown, or the error that prevented
 * start-up (detail in baton_last_error()). */
baton_status_t decode_worker_run(const decode_worker_config_t *cfg);

#endif
