/* Radix prefix cache of one worker: block hash -> physical KV block id.
 *
 * Structure. Block hashes are chained (common/block_hash.h): the hash of
 * block i names the whole token prefix up to the end of block i. So a hash
 * map keyed by block hash, each entry keeping its parent's hash, IS a radix
 * tree over blocks: an edge is "block i+1 extends block i", and looking up
 * hashes[0], hashes[1], ... in order walks the tree from the root. We store
 * it that way (open-addressing map + entry array) instead of as a pointer
 * tree: lookups are O(1) per block and no token comparisons are needed.
 *
 * References. The cache holds one reference on every block it maps, taken
 * through radix_cache_pool_ops_t (the worker's KV pool: common/kv_pool.h
 * kv_pool_ref / kv_pool_unref / refcount). A block whose refcount is 1 is held
 * by the cache alone and may be evicted; one that a running request also
 * references is pinned.
 *
 * Eviction. LRU over entries that are leaves of the tree (no cached child)
 * and unreferenced. Every match/insert touches the whole matched/inserted
 * prefix from its last block back to block 0, so an ancestor is always at
 * least as recent as its descendants and the LRU walk meets leaves first;
 * the walk still checks the child count, so a block with cached children is
 * never evicted before them.
 *
 * KV events (DESIGN.md "Global radix index"). Every store and removal is
 * logged. radix_cache_take_events() drains the log as one batch with the
 * cache's epoch and the next sequence number (1, 2, 3, ...; an empty batch
 * consumes none) holding the NET change since the previous batch: a hash
 * stored then removed inside one batch appears in neither list, so the
 * stored and removed lists are disjoint and may be applied in any order.
 * Within `stored`, a parent comes before its children (or was already
 * published). radix_cache_snapshot() lists every cached hash as of the last
 * batch, for a KVResync answer.
 *
 * Not thread-safe: one worker thread owns a cache. */
#ifndef BATON_COMMON_RADIX_CACHE_H
#define BATON_COMMON_RADIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "common/block_hash.h"
#include "common/status.h"

/* The KV pool operations the cache needs, with the pool as `ctx`. Kept as
 * function pointers so the cache does not depend on one pool type.
 *   ref(ctx, block):      takes one more reference on a live block;
 *                         an error (bad id, free block) is returned as is.
 *   unref(ctx, block):    drops one reference; the pool frees the block when
 *                         the count reaches 0.
 *   refcount(ctx, block): the block's current reference count (>= 0), or a
 *                         negative value for an invalid id. */
typedef struct radix_cache_pool_ops {
    void *ctx;
    baton_status_t (*ref)(void *ctx, int32_t block_id);
    baton_status_t (*unref)(void *ctx, int32_t block_id);
    int32_t (*refcount)(void *ctx, int32_t block_id);
} radix_cache_pool_ops_t;

typedef struct radix_cache radix_cache_t;

/* Counters since creation. Worker-measured hit rate =
 * hit_blocks / (hit_blocks + miss_blocks). */
typedef struct radix_cache_stats {
    uint64_t lookups;        /* radix_cache_match calls */
    uint64_t hit_blocks;     /* blocks returned by matches */
    uint64_t miss_blocks;    /* blocks asked for but not matched */
    uint64_t inserted_blocks;/* new entries stored */
    uint64_t evicted_blocks; /* entries removed by eviction */
    size_t n_cached;         /* entries now */
    size_t n_pending_events; /* hashes touched since the last batch */
} radix_cache_stats_t;

/* One batch of KV events (the payload of a KVEvent message). Arrays are
 * owned by the batch; free with radix_cache_events_free. */
typedef struct radix_cache_events {
    uint64_t epoch;             /* the cache's epoch (per worker start) */
    uint64_t seq;               /* this batch's sequence number, from 1 */
    block_hash_link_t *stored;  /* [n_stored] newly cached, parents first */
    size_t n_stored;
    block_hash_t *removed;      /* [n_removed] no longer cached */
    size_t n_removed;
} radix_cache_events_t;

/* Every cached hash (the payload of a KVResync answer); free with
 * radix_cache_snapshot_free. */
typedef struct radix_cache_snapshot {
    uint64_t epoch;
    uint64_t seq;               /* the state equals that after batch `seq` (0: none yet) */
    block_hash_link_t *links;   /* [n] parents before children */
    size_t n;
} radix_cache_snapshot_t;

/* Creates an empty cache over the pool in `ops` (copied; ref, unref and
 * refcount must be non-NULL). `epoch` identifies this worker run (e.g. its
 * start time in ns or a random number) and is copied into every batch.
 * Errors: BATON_ERR_INVALID_ARG, BATON_ERR_NO_MEMORY. */
baton_status_t radix_cache_init(const radix_cache_pool_ops_t *ops, uint64_t epoch,
                                radix_cache_t **out);

/* Drops the cache's reference on every block it holds and frees it.
 * NULL-safe. */
void radix_cache_free(radix_cache_t *cache);

/* Longest cached prefix of hashes[0..n): writes the block ids of the first
 * *n_matched blocks to block_ids_out[0..] (room for n) and takes ONE
 * REFERENCE ON EACH for the caller, who releases them with the pool's unref.
 * Counts one lookup, *n_matched hit blocks and n - *n_matched miss blocks,
 * and marks the matched blocks most recently used.
 * Errors: BATON_ERR_INVALID_ARG (NULL with n > 0); a ref failure from the
 * pool (references taken so far are dropped again; outputs untouched). */
baton_status_t radix_cache_match(radix_cache_t *cache, const block_hash_t *hashes, size_t n,
                                 int32_t *block_ids_out, size_t *n_matched);

/* Stores the full blocks of one sequence after prefill: hashes[i] is the
 * chain hash of block i (from block 0) and block_ids[i] the pool block that
 * holds its KV. For every hash not yet cached the cache takes its own
 * reference on the block; hashes already cached keep their existing block
 * (the caller's block is not referenced). The caller's references are never
 * consumed. All n blocks become most recently used. *n_inserted (may be NULL)
 * gets the number of new entries.
 * Errors: BATON_ERR_INVALID_ARG (NULL with n > 0, negative block id, or a
 * cached hashes[i] whose parent is not hashes[i-1]: not a chain from block
 * 0), BATON_ERR_NO_MEMORY, or the pool's ref error. On error the entries
 * stored before the failing block stay cached (the tree stays consistent). */
baton_status_t radix_cache_insert(radix_cache_t *cache, const block_hash_t *hashes,
                                  const int32_t *block_ids, size_t n, size_t *n_inserted);

/* Evicts up to n_blocks_needed least-recently-used leaf entries whose block
 * is referenced by the cache alone (refcount 1), dropping the cache's
 * reference so the pool frees them. *n_evicted gets how many were freed;
 * fewer than asked (even 0) is not an error: the rest is pinned.
 * O(entries walked). Errors: BATON_ERR_INVALID_ARG; the pool's unref error. */
baton_status_t radix_cache_evict(radix_cache_t *cache, size_t n_blocks_needed,
                                 size_t *n_evicted);

/* Drains the event log into *out (see the file comment). When nothing
 * changed, *out has empty lists and seq equal to the last batch's (do not
 * publish it). Errors: BATON_ERR_INVALID_ARG, BATON_ERR_NO_MEMORY (the log is
 * kept). */
baton_status_t radix_cache_take_events(radix_cache_t *cache, radix_cache_events_t *out);

/* Frees a batch's arrays and zeroes it. NULL-safe. */
void radix_cache_events_free(radix_cache_events_t *ev);

/* Lists every cached hash with its parent, as of the last batch.
 * Errors: BATON_ERR_BUSY when changes are pending (take and publish the
 * events first, so that the snapshot's seq names a published state),
 * BATON_ERR_INVALID_ARG, BATON_ERR_NO_MEMORY. */
baton_status_t radix_cache_snapshot(radix_cache_t *cache, radix_cache_snapshot_t *out);

/* Frees a snapshot's array and zeroes it. NULL-safe. */
void radix_cache_snapshot_free(radix_cache_snapshot_t *snap);

/* Current counters. */
void radix_cache_get_stats(const radix_cache_t *cache, radix_cache_stats_t *out);

/* Number of cached entries. */
size_t radix_cache_size(const radix_cache_t *cache);

#endif
