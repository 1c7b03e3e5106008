/* The worker radix cache on a real paged KV pool (common/kv_pool.h, CPU
 * backend): prefill -> insert -> reuse through block tables -> eviction when
 * the pool runs out, with the pool's own free counts and reference counts as
 * the check, and every block back on the free list at the end. */
#include <stdint.h>

#include "common/block_hash.h"
#include "common/kv_pool.h"
#include "common/radix_cache.h"
#include "tests/test_util.h"

/* Adapters from kv_pool to the cache's pool ops. */
static baton_status_t pool_ref(void *ctx, int32_t id) { return kv_pool_ref(ctx, id); }
static baton_status_t pool_unref(void *ctx, int32_t id) { return kv_pool_unref(ctx, id); }
static int32_t pool_refcount(void *ctx, int32_t id) { return kv_pool_refcount(ctx, id); }

enum { BS = 4, NBLK = 12 };

static size_t hashes_of(const int32_t *toks, size_t n, block_hash_t *out) {
    size_t nh = 0;
    CHECK_OK(block_hash_chain(toks, n, BS, 0x5EED, NULL, out, 16, &nh));
    return nh;
}

int main(void) {
    backend_t *be = NULL;
    CHECK_OK(backend_cpu_create(1, &be));
    if (!be) return TEST_DONE();
    backend_kv_geom_t g = {.n_layers = 2, .n_blocks = NBLK, .block_size = BS, .n_kv_heads = 1,
                           .head_dim = 4, .dtype = be->kv_dtype};
    kv_pool_t *pool = NULL;
    CHECK_OK(kv_pool_init(be, &g, &pool));
    if (!pool) {
        backend_free(be);
        return TEST_DONE();
    }
    radix_cache_pool_ops_t ops = {pool, pool_ref, pool_unref, pool_refcount};
    radix_cache_t *c = NULL;
    CHECK_OK(radix_cache_init(&ops, 42, &c));

    int32_t s1[22], s2[20], s3[32];
    for (int i = 0; i < 22; i++) s1[i] = 100 + i;
    for (int i = 0; i < 20; i++) s2[i] = i < 12 ? s1[i] : 500 + i; /* shares 3 blocks */
    for (int i = 0; i < 32; i++) s3[i] = 900 + i;
    block_hash_t h1[16], h2[16], h3[16];
    size_t n1 = hashes_of(s1, 22, h1), n2 = hashes_of(s2, 20, h2), n3 = hashes_of(s3, 32, h3);
    CHECK_EQ_INT(n1, 5);
    CHECK_EQ_INT(n2, 5);
    CHECK_EQ_INT(n3, 8);

    /* Sequence 1: no prefix cached; prefill 22 tokens = 6 blocks (last partial). */
    int32_t ids[16];
    size_t m = 0, ins = 0;
    CHECK_OK(radix_cache_match(c, h1, n1, ids, &m));
    CHECK_EQ_INT(m, 0);
    kv_block_table_t t1;
    kv_block_table_init(&t1);
    CHECK_OK(kv_block_table_reserve(&t1, pool, 22));
    CHECK_EQ_INT(t1.n_blocks, 6);
    CHECK_OK(radix_cache_insert(c, h1, t1.blocks, n1, &ins)); /* full blocks only */
    CHECK_EQ_INT(ins, 5);
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(kv_pool_refcount(pool, t1.blocks[i]), 2);
    CHECK_EQ_INT(kv_pool_refcount(pool, t1.blocks[5]), 1);
    int32_t s1_blocks[6];
    memcpy(s1_blocks, t1.blocks, sizeof(s1_blocks));
    kv_block_table_release(&t1, pool);
    CHECK_EQ_INT(kv_pool_n_free(pool), NBLK - 5); /* the cache keeps the 5 full blocks */
    CHECK_EQ_INT(kv_pool_refcount(pool, s1_blocks[5]), 0);

    /* Sequence 2 reuses 3 cached blocks through its block table. */
    CHECK_OK(radix_cache_match(c, h2, n2, ids, &m));
    CHECK_EQ_INT(m, 3);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(ids[i], s1_blocks[i]);
    kv_block_table_t t2;
    kv_block_table_init(&t2);
    CHECK_OK(kv_block_table_append_shared(&t2, pool, ids, (int32_t)m));
    for (size_t i = 0; i < m; i++) CHECK_OK(kv_pool_unref(pool, ids[i])); /* the table holds its own */
    CHECK_EQ_INT(kv_pool_refcount(pool, s1_blocks[0]), 2);
    CHECK_OK(kv_block_table_reserve(&t2, pool, 20));
    CHECK_EQ_INT(t2.n_blocks, 5);
    CHECK_OK(radix_cache_insert(c, h2, t2.blocks, n2, &ins));
    CHECK_EQ_INT(ins, 2);
    int32_t s2_blocks[5];
    memcpy(s2_blocks, t2.blocks, sizeof(s2_blocks));
    kv_block_table_release(&t2, pool);
    CHECK_EQ_INT(radix_cache_size(c), 7);
    CHECK_EQ_INT(kv_pool_n_free(pool), NBLK - 7);

    /* Sequence 3 needs 8 fresh blocks: the pool has 5 free, so the worker
     * evicts 3: the least recent leaves S1[4], S1[3], then S2[4]. */
    kv_block_table_t t3;
    kv_block_table_init(&t3);
    CHECK_EQ_INT(kv_block_table_reserve(&t3, pool, 32), BATON_ERR_NO_SPACE);
    size_t ev = 0;
    CHECK_OK(radix_cache_evict(c, 8 - (size_t)kv_pool_n_free(pool), &ev));
    CHECK_EQ_INT(ev, 3);
    CHECK_EQ_INT(kv_pool_refcount(pool, s1_blocks[4]), 0);
    CHECK_EQ_INT(kv_pool_refcount(pool, s1_blocks[3]), 0);
    CHECK_EQ_INT(kv_pool_refcount(pool, s2_blocks[4]), 0);
    CHECK_EQ_INT(kv_pool_refcount(pool, s2_blocks[3]), 1);
    CHECK_OK(kv_block_table_reserve(&t3, pool, 32));
    CHECK_EQ_INT(kv_pool_n_free(pool), 0);
    /* While sequence 3 runs nothing of it is cached and nothing else is
     * evictable beyond the unpinned cache entries. */
    CHECK_OK(radix_cache_insert(c, h3, t3.blocks, n3, &ins));
    CHECK_EQ_INT(ins, 8);
    CHECK_OK(radix_cache_evict(c, 100, &ev)); /* frees the 4 unpinned S1/S2 blocks only */
    CHECK_EQ_INT(ev, 4);
    CHECK_EQ_INT(kv_pool_n_free(pool), 4);
    CHECK_OK(radix_cache_match(c, h1, n1, ids, &m));
    CHECK_EQ_INT(m, 0);
    kv_block_table_release(&t3, pool);

    /* The cached prefix of sequence 3 is reusable after it ends. */
    CHECK_OK(radix_cache_match(c, h3, 8, ids, &m));
    CHECK_EQ_INT(m, 8);
    for (size_t i = 0; i < m; i++) CHECK_OK(kv_pool_unref(pool, ids[i]));

    radix_cache_events_t evs;
    CHECK_OK(radix_cache_take_events(c, &evs));
    CHECK_EQ_INT(evs.seq, 1);
    CHECK_EQ_INT(evs.n_stored, 8); /* net: only sequence 3's blocks remain */
    CHECK_EQ_INT(evs.n_removed, 0);
    radix_cache_events_free(&evs);

    radix_cache_free(c); /* drops the cache's references */
    CHECK_EQ_INT(kv_pool_n_free(pool), NBLK);
    kv_pool_free(pool);
    backend_free(be);
    return TEST_DONE();
}
