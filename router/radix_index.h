/* The router's global radix index: which worker holds which prefix.
 *
 * DESIGN.md "Global radix index". Keyed by chained block hashes
 * (common/block_hash.h), so, as in the worker's cache
 * (common/radix_cache.h), a hash map of nodes with parent links is a radix
 * tree over blocks. Each node records the workers that hold the block
 * (confirmed by their KV events), the workers the router guessed at routing
 * time (speculative, each with an expiry), its parent hash and when it was
 * last seen. A node disappears as soon as no worker holds it and no guess
 * names it, so memory follows the workers' caches.
 *
 * Event stream per worker (radix_cache_take_events on the worker): batches
 * numbered 1, 2, 3, ... within an epoch (one epoch per worker run; epochs are
 * compared for equality only). The index applies batch seq = last + 1;
 * drops a batch with seq <= last (duplicate or already covered by a
 * snapshot); and on a gap, a new epoch that does not start at seq 1, or an
 * inconsistent batch (a stored block whose parent the worker does not hold),
 * purges the worker's confirmed entries and reports that a resync is needed.
 * Until a snapshot arrives, that worker's batches are dropped and each one
 * reports the resync need again (the caller rate-limits its requests). A new
 * epoch starting at seq 1 is a restarted worker's complete history from an
 * empty cache: its entries are purged and the batch is applied, no resync.
 *
 * Time is passed in by the caller (monotonic milliseconds) so that expiry
 * is testable and the index needs no clock. Not thread-safe: the router's
 * event loop owns it. */
#ifndef BATON_ROUTER_RADIX_INDEX_H
#define BATON_ROUTER_RADIX_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/block_hash.h"
#include "common/status.h"

/* Worker ids are 0 .. RADIX_INDEX_MAX_WORKERS - 1. */
#define RADIX_INDEX_MAX_WORKERS 256

typedef struct radix_index radix_index_t;

typedef struct radix_index_worker_info {
    bool known;             /* any event, snapshot or guess seen since creation/removal */
    bool synced;            /* epoch known and no resync outstanding */
    uint64_t epoch;         /* last epoch seen (valid when synced or awaiting) */
    uint64_t last_seq;      /* last batch or snapshot applied */
    uint64_t last_event_ms; /* when the last batch or snapshot was applied */
    size_t n_blocks;        /* confirmed blocks */
    size_t n_speculative;   /* unexpired, unconfirmed guesses */
} radix_index_worker_info_t;

typedef struct radix_index_stats {
    size_t n_nodes;                /* nodes now */
    uint64_t events_applied;       /* batches applied */
    uint64_t events_dropped;       /* stale batches and batches while awaiting a resync */
    uint64_t resyncs_requested;    /* times a worker was purged and a resync asked for */
    uint64_t snapshots_applied;
    uint64_t unknown_removals;     /* removed hashes the worker was not known to hold */
    uint64_t speculative_inserted; /* (node, worker) guesses created */
    uint64_t speculative_confirmed;/* guesses turned into confirmed holdings by an event */
    uint64_t speculative_expired;  /* guesses that ran out */
} radix_index_stats_t;

/* Creates an empty index. Errors: BATON_ERR_INVALID_ARG, BATON_ERR_NO_MEMORY. */
baton_status_t radix_index_init(radix_index_t **out);

/* Frees the index. NULL-safe. */
void radix_index_free(radix_index_t *idx);

/* Applies one KV-event batch of worker `worker_id`: `removed` (hashes the
 * worker no longer caches), then `stored` (hash + parent, parents before
 * children or already held). A stored block that was a speculative guess for
 * this worker becomes confirmed. *resync_out tells whether the caller must
 * ask the worker for a snapshot (see the file comment for the sequence
 * rules). Errors: BATON_ERR_INVALID_ARG (worker id out of range, NULL with a
 * count > 0, NULL resync_out); BATON_ERR_NO_MEMORY (the worker's confirmed
 * entries are then purged and it awaits a resync, which the next batch
 * reports). */
baton_status_t radix_index_apply_event(radix_index_t *idx, uint32_t worker_id, uint64_t epoch,
                                       uint64_t seq, const block_hash_link_t *stored,
                                       size_t n_stored, const block_hash_t *removed,
                                       size_t n_removed, uint64_t now_ms, bool *resync_out);

/* Replaces worker_id's confirmed entries with a full snapshot (every hash it
 * caches as of batch `seq` of `epoch`) and clears an outstanding resync. A
 * snapshot no newer than the applied state (same epoch, seq <= last, no
 * resync outstanding) is ignored; *applied_out (may be NULL) says which.
 * Speculative guesses are kept (those the snapshot holds become confirmed).
 * Errors: BATON_ERR_INVALID_ARG; BATON_ERR_NO_MEMORY (worker purged, awaiting
 * a resync). */
baton_status_t radix_index_apply_snapshot(radix_index_t *idx, uint32_t worker_id, uint64_t epoch,
                                          uint64_t seq, const block_hash_link_t *links, size_t n,
                                          uint64_t now_ms, bool *applied_out);

/* For each worker w, counts_out[w] = the number of LEADING blocks of
 * hashes[0..n) (the request's chain from block 0) that w holds contiguously,
 * counting confirmed holdings and unexpired guesses. Expires guesses due at
 * now_ms first. counts_out has RADIX_INDEX_MAX_WORKERS entries, all written.
 * Errors: BATON_ERR_INVALID_ARG. */
baton_status_t radix_index_match(radix_index_t *idx, const block_hash_t *hashes, size_t n,
                                 uint64_t now_ms, uint32_t *counts_out);

/* Records the router's routing-time guess that worker_id will hold
 * hashes[0..n) (a chain from block 0) until now_ms + ttl_ms unless a stored
 * event confirms it first. Blocks the worker already holds are skipped; a
 * repeated guess extends the expiry. Errors: BATON_ERR_INVALID_ARG,
 * BATON_ERR_NO_MEMORY (guesses recorded so far stay). */
baton_status_t radix_index_insert_speculative(radix_index_t *idx, uint32_t worker_id,
                                              const block_hash_t *hashes, size_t n,
                                              uint32_t ttl_ms, uint64_t now_ms);

/* Drops every guess due at or before now_ms. */
void radix_index_expire(radix_index_t *idx, uint64_t now_ms);

/* Forgets worker_id entirely (dropped from the worker table): its confirmed
 * entries, guesses, epoch and sequence. Errors: BATON_ERR_INVALID_ARG. */
baton_status_t radix_index_remove_worker(radix_index_t *idx, uint32_t worker_id);

/* Milliseconds since worker_id's last applied batch or snapshot, or -1 when
 * none was applied (unknown worker, or id out of range). */
int64_t radix_index_staleness_ms(const radix_index_t *idx, uint32_t worker_id, uint64_t now_ms);

/* Per-worker state. Errors: BATON_ERR_INVALID_ARG. */
baton_status_t radix_index_worker_info(const radix_index_t *idx, uint32_t worker_id,
                                       radix_index_worker_info_t *out);

/* Counters and the node count. */
void radix_index_get_stats(const radix_index_t *idx, radix_index_stats_t *out);

/* Whether worker_id holds `hash` (confirmed only, not guesses). */
bool radix_index_holds(const radix_index_t *idx, uint32_t worker_id, const block_hash_t *hash);

#endif
