/* Paged KV block manager: one worker's K and V pools and their blocks.
 *
 * Memory. Two regions, K and V, each allocated once through the backend
 * (->alloc: host RAM on CPU, device memory on CUDA) and zeroed, in the
 * layout of kernels/backend.h: [n_layers][n_blocks][block_size][n_kv_heads]
 * [head_dim] elements of geom.dtype. Block b of layer l starts at
 * backend_kv_block_offset(geom, l, b) and is kv_pool_block_bytes() long and
 * contiguous: the unit the transfer module registers with UCX and sends,
 * block by block, layer by layer. A block id names the same slot range in
 * every layer.
 *
 * Blocks. A free list plus a reference count per block id (0..n_blocks-1).
 * kv_pool_alloc hands out blocks with count 1; kv_pool_ref adds a holder (a
 * second sequence sharing a cached prefix, the radix cache);
 * kv_pool_unref drops one and returns the block to the free list at 0. Every
 * call either succeeds completely or changes nothing.
 *
 * Threads. The pool's counters are guarded by a mutex (any thread may
 * alloc/ref/unref). A kv_block_table_t belongs to one sequence and is not
 * locked. */
#ifndef BATON_COMMON_KV_POOL_H
#define BATON_COMMON_KV_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/backend.h"

/* Tokens per block when the geometry says 0 (DESIGN.md "KV cache"). */
#define KV_POOL_DEFAULT_BLOCK_SIZE 16

typedef struct kv_pool kv_pool_t;

/* Creates a pool on backend `be` (borrowed: it must outlive the pool) with
 * geometry `geom` (copied): n_layers, n_blocks (per layer), n_kv_heads,
 * head_dim > 0; block_size > 0 tokens, or 0 for KV_POOL_DEFAULT_BLOCK_SIZE;
 * dtype must be be->kv_dtype. All blocks start free, memory zeroed.
 * Errors: BATON_ERR_INVALID_ARG (bad geometry, dtype mismatch, byte size
 * overflow), BATON_ERR_NO_MEMORY. Free with kv_pool_free. */
baton_status_t kv_pool_init(backend_t *be, const backend_kv_geom_t *geom, kv_pool_t **out);

/* Frees both regions and the pool (outstanding references are dropped with
 * it; the caller must not use any block id afterwards). NULL-safe. */
void kv_pool_free(kv_pool_t *pool);

/* The pool's geometry (block_size resolved). Valid until kv_pool_free. */
const backend_kv_geom_t *kv_pool_geom(const kv_pool_t *pool);

/* Base of the K / V region (backend memory, all layers). */
void *kv_pool_k_base(const kv_pool_t *pool);
void *kv_pool_v_base(const kv_pool_t *pool);

/* Bytes of each region: n_layers * n_blocks * kv_pool_block_bytes(). */
size_t kv_pool_bytes(const kv_pool_t *pool);

/* Bytes of one block of one layer: block_size * n_kv_heads * head_dim *
 * dtype size. */
size_t kv_pool_block_bytes(const kv_pool_t *pool);

/* Allocates `n` free blocks (n >= 0), each with reference count 1, and
 * writes their ids to ids[0..n-1]. All or nothing: BATON_ERR_NO_SPACE when
 * fewer than n are free (nothing allocated, ids untouched);
 * BATON_ERR_INVALID_ARG for n < 0 or ids NULL with n > 0. */
baton_status_t kv_pool_alloc(kv_pool_t *pool, int32_t n, int32_t *ids);

/* Adds one reference to a live block. BATON_ERR_INVALID_ARG when `id` is
 * out of range or the block is free (nothing changes). */
baton_status_t kv_pool_ref(kv_pool_t *pool, int32_t id);

/* Drops one reference; at 0 the block returns to the free list.
 * BATON_ERR_INVALID_ARG when `id` is out of range or already free (a double
 * free: nothing changes). */
baton_status_t kv_pool_unref(kv_pool_t *pool, int32_t id);

/* Reference count of block `id` (0 = free), or -1 when id is out of range. */
int32_t kv_pool_refcount(const kv_pool_t *pool, int32_t id);

/* Blocks on the free list / blocks with a count > 0 (sum = n_blocks). */
int32_t kv_pool_n_free(const kv_pool_t *pool);
int32_t kv_pool_n_used(const kv_pool_t *pool);

/* A sequence's block table: physical block ids in position order, so token
 * position p lives in blocks[p / block_size], slot p % block_size. The
 * table holds one reference on each of its blocks. Zero-initialise it
 * (or kv_block_table_init) before use; release with kv_block_table_release. */
typedef struct kv_block_table {
    int32_t *blocks;   /* [capacity] host array, first n_blocks valid */
    int32_t n_blocks;  /* blocks held */
    int32_t capacity;  /* allocated entries of `blocks` */
    int32_t n_tokens;  /* token slots claimed, <= n_blocks * block_size */
} kv_block_table_t;

/* Empties `t` without touching any pool (for a fresh table). */
void kv_block_table_init(kv_block_table_t *t);

/* Grows `t` to hold `n_tokens` tokens, allocating ceil(n_tokens /
 * block_size) - n_blocks new blocks from `pool`; a table never shrinks
 * (n_tokens below the current count only keeps the larger one). All or
 * nothing: BATON_ERR_NO_SPACE (pool exhausted) or BATON_ERR_NO_MEMORY
 * leaves `t` and the pool unchanged. BATON_ERR_INVALID_ARG for n_tokens < 0. */
baton_status_t kv_block_table_reserve(kv_block_table_t *t, kv_pool_t *pool, int32_t n_tokens);

/* Appends `n` live blocks that another holder owns (a cached prefix from
 * the radix cache or another sequence), taking one reference on each; the
 * table then claims n * block_size more tokens. The table's claimed tokens
 * must fill its blocks exactly (n_tokens == n_blocks * block_size), since a
 * shared block must start at a block boundary. All or nothing:
 * BATON_ERR_INVALID_ARG (a free or out-of-range id, a partly filled last
 * block), BATON_ERR_NO_MEMORY. */
baton_status_t kv_block_table_append_shared(kv_block_table_t *t, kv_pool_t *pool,
                                            const int32_t *ids, int32_t n);

/* Drops the table's reference on each of its blocks (a block no one else
 * holds goes back to the free list), frees the array and leaves `t` empty
 * (as after kv_block_table_init). NULL-safe. */
void kv_block_table_release(kv_block_table_t *t, kv_pool_t *pool);

#endif
