/* The prefill worker process (baton-prefill): wires prefill_sched to the
 * control plane (ZeroMQ + msgpack, proto/) and the KV data plane (UCX,
 * common/kv_transfer.h) in one libevent loop (cluster.md, DESIGN.md steps
 * 3-4).
 *
 * Sockets: a DEALER to the router (identity = worker id) carrying
 * WorkerRegister (at start and every few heartbeats, so a restarted router
 * learns the worker again), WorkerHeartbeat (every heartbeat_ms) and a copy
 * of each PrefillDone, and receiving PrefillRequest, Abort and KVResync; a
 * ROUTER bound at peer_bind receiving KVDestination from decode workers; one
 * cached DEALER per decode endpoint (PrefillRequest.decode_endpoint)
 * carrying PrefillDone; a PUB bound at kv_events_bind publishing KVEvents
 * (topic = worker id; a KVResync is answered there with the full set, in
 * parts).
 *
 * KV transfer: the local pool is registered once with UCX; a KVDestination
 * carries the decode pool either as ucx_address = the whole
 * kv_transfer_pool_pack descriptor (what decode_worker.h sends), or as
 * ucx_address = the bare UCX worker address plus pool.regions [K, V] +
 * n_blocks + block_bytes (rebuilt into a descriptor here); an endpoint per
 * decode run (worker id, epoch) is cached, and one
 * kv_transfer_t per request carries the layer-wise puts the scheduler asks
 * for; after the last chunk and the first token, the endpoint is flushed and
 * only then PrefillDone goes to the decode worker (and a copy to the router).
 * A peer failure fails the request with BATON_ERR_PEER (PrefillDone to the
 * router, and to the decode worker if it is reachable) and the worker keeps
 * serving.
 *
 * Loop: while prompts are left, scheduler steps run back to back with the
 * sockets drained (non-blocking) and UCX progressed between steps;
 * otherwise the loop sleeps on the socket fds, the UCX event fd, the
 * heartbeat timer and the scheduler's earliest deadline. SIGTERM / SIGINT
 * end the loop; everything is freed. */
#ifndef BATON_PREFILL_WORKER_PREFILL_WORKER_H
#define BATON_PREFILL_WORKER_PREFILL_WORKER_H

#include <stdint.h>

#include "common/status.h"

typedef struct prefill_worker_config {
    const char *router;             /* --router tcp://HOST:PORT (required) */
    const char *worker_id;          /* --worker-id (NULL: prefill-<hostname>-<pid>) */
    const char *peer_bind;          /* --peer-bind (default tcp://127.0.0.1:*) */
    const char *peer_advertise;     /* --peer-advertise (NULL: the bound endpoint) */
    const char *kv_events_bind;     /* --kv-events-bind (default tcp://127.0.0.1:*) */
    const char *kv_events_advertise;/* --kv-events-advertise (NULL: the bound endpoint) */
    const char *model;              /* --model FILE (required) */
    const char *backend;            /* --backend cpu|cuda (default cpu) */
    int threads;                    /* --threads (0 = all CPUs) */
    int32_t block_size;             /* --block-size (default 16) */
    int32_t kv_blocks;              /* --kv-blocks (default 1024) */
    uint64_t hash_seed;             /* --hash-seed (default 0) */
    int32_t max_batch_tokens;       /* --max-batch-tokens (default 512) */
    uint32_t kv_destination_timeout_ms; /* --kv-destination-timeout-ms (default 10000) */
    uint32_t transfer_timeout_ms;   /* --transfer-timeout-ms: bound of one request's UCX
                                       transfer, puts to flush (default 30000) */
    uint32_t heartbeat_ms;          /* --heartbeat-ms (default 500) */
} prefill_worker_config_t;

/* The defaults above (router and model NULL). */
prefill_worker_config_t prefill_worker_config_default(void);

/* Loads the model, allocates and registers the KV pool, opens the sockets,
 * registers with the router and runs the event loop until SIGTERM/SIGINT.
 * Returns BATON_OK after a clean shutdown, or the error that prevented
 * start-up (detail in baton_last_error()). */
baton_status_t prefill_worker_run(const prefill_worker_config_t *cfg);

#endif
