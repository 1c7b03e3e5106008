/* router: the worker table: registration, heartbeats, expiry, pairing.
 *
 * One slot per live worker (slot index = its id in the global radix index,
 * 0 .. RADIX_INDEX_MAX_WORKERS - 1). A WorkerRegister creates or replaces
 * the slot of its worker id (a new epoch means a restarted worker: the
 * caller purges its index entries and fails its requests); heartbeats
 * refresh it; worker_table_expire drops workers silent for longer than the
 * timeout. A prefill worker and a decode worker form a pair only when their
 * KV geometry (n_layers, n_kv_heads, head_dim, block_size, dtype,
 * hash_seed_id) and model_sha256 are equal (cluster.md "Geometry and
 * pairing"). Not thread-safe: owned by the router's event loop. */
#ifndef BATON_ROUTER_WORKER_TABLE_H
#define BATON_ROUTER_WORKER_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "proto/messages.h"
#include "router/radix_index.h"

#define WORKER_TABLE_MAX RADIX_INDEX_MAX_WORKERS

typedef struct worker_entry {
    bool used;
    uint32_t slot;                          /* index in the table and the radix index */
    char id[PROTO_WORKER_ID_MAX + 1];
    proto_role_t role;
    uint64_t epoch;
    char zmq_endpoint[256];                 /* peer endpoint (worker-to-worker) */
    char kv_events_endpoint[256];           /* KV-event PUB, "" = none */
    uint8_t model_sha256[PROTO_SHA256_BYTES];
    uint32_t vocab_size;
    proto_kv_geometry_t kv;
    /* serving configuration from WorkerRegister (optional fields; 0 / "") */
    uint32_t max_batch_tokens, max_batch;
    char cpu_model[128];
    char backend[16];
    char compute_dtype[16];
    uint64_t registered_ms, last_seen_ms;   /* monotonic ms */
    bool has_heartbeat;
    proto_worker_heartbeat_t hb;            /* last heartbeat */
    /* router-side load, updated as requests are routed and finish */
    uint32_t inflight;                      /* requests routed here, not finished */
    uint64_t inflight_prefill_tokens;       /* uncached prompt tokens not yet prefilled */
    uint64_t inflight_blocks;               /* decode blocks reserved by routed requests */
    uint64_t routed_total;
    uint64_t last_resync_ms;                /* rate limit of KVResync requests */
} worker_entry_t;

typedef struct worker_table {
    worker_entry_t w[WORKER_TABLE_MAX];
    uint32_t block_size;      /* the router's --block-size */
    uint64_t hash_seed_id;    /* XXH3-64 of the router's --hash-seed */
    uint32_t vocab_size;      /* the router's tokenizer vocabulary */
} worker_table_t;

/* Public id of a block-hash seed: XXH3-64 (seed 0) of the seed's 8
 * little-endian bytes (cluster.md: WorkerRegister.kv.hash_seed_id). */
uint64_t worker_table_seed_id(uint64_t hash_seed);

/* Empties the table and sets what every worker must agree with. */
void worker_table_init(worker_table_t *t, uint32_t block_size, uint64_t hash_seed,
                       uint32_t vocab_size);

/* Registers (or re-registers) a worker. *slot_out receives its slot and
 * *new_epoch_out whether an entry of the same id with another epoch was
 * replaced (or false for a first registration). A re-registration with the
 * same epoch refreshes the entry. Errors (entry untouched; detail names the
 * field): BATON_ERR_UNSUPPORTED (block_size, hash_seed_id or vocab_size
 * differ from the router's), BATON_ERR_NO_SPACE (table full). */
baton_status_t worker_table_register(worker_table_t *t, const proto_worker_register_t *reg,
                                     const char *kv_events_endpoint, uint64_t now_ms,
                                     uint32_t *slot_out, bool *new_epoch_out);

/* The entry of worker `id`, or NULL. */
worker_entry_t *worker_table_find(worker_table_t *t, const char *id);

/* Applies a heartbeat (epoch must match the registered one). Errors:
 * BATON_ERR_NOT_FOUND (unknown worker or stale epoch: the worker should
 * register again). */
baton_status_t worker_table_heartbeat(worker_table_t *t, const proto_worker_heartbeat_t *hb,
                                      uint64_t now_ms);

/* Removes slot `slot` (NULL-safe on an unused slot). */
void worker_table_remove(worker_table_t *t, uint32_t slot);

/* Finds a worker silent for more than timeout_ms; returns its slot or -1.
 * The caller removes it (after failing its requests) and calls again. */
int worker_table_next_expired(const worker_table_t *t, uint64_t now_ms, uint64_t timeout_ms);

/* True when prefill-capable `p` and decode-capable `d` may be paired: equal
 * geometry and model hash, and for a colocated ("both") worker p == d.
 * Otherwise false, with the differing field named in why (may be NULL). */
bool worker_table_can_pair(const worker_entry_t *p, const worker_entry_t *d, char *why,
                           size_t why_len);

/* True when at least one prefill and one decode worker are paired (or a
 * colocated worker exists). Otherwise false and a reason in why. */
bool worker_table_ready(const worker_table_t *t, char *why, size_t why_len);

/* "prefill", "decode", "both". */
const char *worker_table_role_name(proto_role_t role);

#endif
