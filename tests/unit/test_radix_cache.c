/* Worker radix prefix cache against a strict counting pool (refcounts may
 * never go negative, a free block may not be referenced): match/insert/evict
 * with refcount checks, LRU order, leaf-first eviction, events, snapshot,
 * and a randomized run checked against a replay of the event stream. */
#include <stdint.h>

#include "common/block_hash.h"
#include "common/radix_cache.h"
#include "tests/test_util.h"

/* ---- strict counting pool ---------------------------------------------- */

#define POOL_N 512
typedef struct fake_pool {
    int32_t count[POOL_N];
    int violations; /* ref of a free block, unref below zero, bad id */
} fake_pool_t;

static baton_status_t fp_ref(void *ctx, int32_t id) {
    fake_pool_t *p = ctx;
    if (id < 0 || id >= POOL_N || p->count[id] <= 0) {
        p->violations++;
        return baton_error(BATON_ERR_INVALID_ARG, "fake pool: ref of free block %d", id);
    }
    p->count[id]++;
    return BATON_OK;
}
static baton_status_t fp_unref(void *ctx, int32_t id) {
    fake_pool_t *p = ctx;
    if (id < 0 || id >= POOL_N || p->count[id] <= 0) {
        p->violations++;
        return baton_error(BATON_ERR_INVALID_ARG, "fake pool: unref of free block %d", id);
    }
    p->count[id]--;
    return BATON_OK;
}
static int32_t fp_refcount(void *ctx, int32_t id) {
    fake_pool_t *p = ctx;
    return id < 0 || id >= POOL_N ? -1 : p->count[id];
}
static int32_t fp_alloc(fake_pool_t *p) {
    for (int32_t i = 0; i < POOL_N; i++)
        if (p->count[i] == 0) {
            p->count[i] = 1;
            return i;
        }
    return -1;
}
static int fp_n_used(const fake_pool_t *p) {
    int n = 0;
    for (int i = 0; i < POOL_N; i++) n += p->count[i] > 0;
    return n;
}

static radix_cache_t *make_cache(fake_pool_t *p, uint64_t epoch) {
    radix_cache_pool_ops_t ops = {p, fp_ref, fp_unref, fp_refcount};
    radix_cache_t *c = NULL;
    CHECK_OK(radix_cache_init(&ops, epoch, &c));
    return c;
}

/* Chain hashes of `n_blocks` blocks of 4 tokens: block i = {base+i, ...}
 * after a common part of `shared` blocks. */
static void chain(int shared, int n_blocks, int32_t variant, block_hash_t *out) {
    int32_t toks[4 * 64];
    for (int b = 0; b < n_blocks; b++)
        for (int t = 0; t < 4; t++) toks[4 * b + t] = b < shared ? 1000 + 4 * b + t : variant * 7919 + 4 * b + t;
    size_t n;
    block_hash_chain(toks, 4 * (size_t)n_blocks, 4, 77, NULL, out, 64, &n);
}

static bool in_links(const block_hash_link_t *l, size_t n, const block_hash_t *h, size_t *pos) {
    for (size_t i = 0; i < n; i++)
        if (block_hash_eq(&l[i].hash, h)) {
            if (pos) *pos = i;
            return true;
        }
    return false;
}

static void test_match_insert(void) {
    fake_pool_t pool = {0};
    radix_cache_t *c = make_cache(&pool, 5);
    block_hash_t a[4], b[4];
    chain(2, 4, 1, a); /* A0 A1 A2 A3 */
    chain(2, 4, 2, b); /* A0 A1 B2 B3 */
    CHECK(block_hash_eq(&a[1], &b[1]) && !block_hash_eq(&a[2], &b[2]));

    int32_t ids[4], got[4];
    size_t m = 99, ins = 99;
    CHECK_OK(radix_cache_match(c, a, 4, got, &m));
    CHECK_EQ_INT(m, 0);
    for (int i = 0; i < 4; i++) ids[i] = fp_alloc(&pool);
    CHECK_OK(radix_cache_insert(c, a, ids, 4, &ins));
    CHECK_EQ_INT(ins, 4);
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(pool.count[ids[i]], 2); /* sequence + cache */
    for (int i = 0; i < 4; i++) CHECK_OK(fp_unref(&pool, ids[i]));   /* sequence ends */
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(pool.count[ids[i]], 1);

    /* Full hit: same ids, a reference each for the caller. */
    CHECK_OK(radix_cache_match(c, a, 4, got, &m));
    CHECK_EQ_INT(m, 4);
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(got[i], ids[i]);
        CHECK_EQ_INT(pool.count[ids[i]], 2);
        fp_unref(&pool, got[i]);
    }
    /* Divergence at block 2: two blocks matched. */
    CHECK_OK(radix_cache_match(c, b, 4, got, &m));
    CHECK_EQ_INT(m, 2);
    CHECK_EQ_INT(got[0], ids[0]);
    CHECK_EQ_INT(got[1], ids[1]);
    /* Prefill of B's two missing blocks, then insert the whole chain: only
     * B2, B3 are new; A0, A1 keep their blocks and the caller's are not referenced. */
    int32_t bids[4] = {got[0], got[1], fp_alloc(&pool), fp_alloc(&pool)};
    CHECK_OK(radix_cache_insert(c, b, bids, 4, &ins));
    CHECK_EQ_INT(ins, 2);
    CHECK_EQ_INT(pool.count[bids[0]], 2); /* cache + this sequence's match */
    CHECK_EQ_INT(pool.count[bids[2]], 2);
    for (int i = 0; i < 4; i++) fp_unref(&pool, bids[i]);
    CHECK_EQ_INT(radix_cache_size(c), 6);

    /* Inserting A again with other block ids changes nothing. */
    int32_t other[4];
    for (int i = 0; i < 4; i++) other[i] = fp_alloc(&pool);
    CHECK_OK(radix_cache_insert(c, a, other, 4, &ins));
    CHECK_EQ_INT(ins, 0);
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(pool.count[other[i]], 1);
        fp_unref(&pool, other[i]);
    }

    radix_cache_stats_t s;
    radix_cache_get_stats(c, &s);
    CHECK_EQ_INT(s.lookups, 3);
    CHECK_EQ_INT(s.hit_blocks, 6);
    CHECK_EQ_INT(s.miss_blocks, 6);
    CHECK_EQ_INT(s.inserted_blocks, 6);
    CHECK_EQ_INT(s.n_cached, 6);

    /* Errors leave outputs untouched. */
    m = 1234;
    CHECK_EQ_INT(radix_cache_match(c, NULL, 2, got, &m), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(m, 1234);
    int32_t bad[2] = {ids[0], -3};
    CHECK_EQ_INT(radix_cache_insert(c, a, bad, 2, NULL), BATON_ERR_INVALID_ARG);
    /* Not a chain from block 0: a[1] is cached under parent a[0], not b[3]. */
    block_hash_t wrong[2] = {b[3], a[1]};
    int32_t wid[2] = {fp_alloc(&pool), fp_alloc(&pool)};
    ins = 4321;
    CHECK_EQ_INT(radix_cache_insert(c, wrong, wid, 2, &ins), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(ins, 4321);
    /* b[3] as block 0 is cached already (under parent b[2]): rejected at once. */
    CHECK_EQ_INT(radix_cache_size(c), 6);
    CHECK_EQ_INT(pool.count[wid[0]], 1);
    fp_unref(&pool, wid[0]);
    fp_unref(&pool, wid[1]);

    /* Free drops exactly the cache's references. */
    radix_cache_free(c);
    CHECK_EQ_INT(fp_n_used(&pool), 0);
    CHECK_EQ_INT(pool.violations, 0);
    radix_cache_free(NULL);
}

static void test_evict_lru_leaf_first(void) {
    fake_pool_t pool = {0};
    radix_cache_t *c = make_cache(&pool, 1);
    block_hash_t a[4], b[4], x[3];
    chain(2, 4, 1, a);
    chain(2, 4, 2, b);
    chain(0, 3, 9, x);
    int32_t ia[4], ib[4], ix[3], got[4];
    size_t m, ev;
    for (int i = 0; i < 4; i++) ia[i] = fp_alloc(&pool);
    CHECK_OK(radix_cache_insert(c, a, ia, 4, NULL));
    for (int i = 0; i < 4; i++) fp_unref(&pool, ia[i]);
    CHECK_OK(radix_cache_match(c, b, 4, got, &m));
    CHECK_EQ_INT(m, 2);
    ib[0] = ia[0], ib[1] = ia[1], ib[2] = fp_alloc(&pool), ib[3] = fp_alloc(&pool);
    CHECK_OK(radix_cache_insert(c, b, ib, 4, NULL));
    for (int i = 0; i < 4; i++) fp_unref(&pool, ib[i]);
    for (int i = 0; i < 3; i++) ix[i] = fp_alloc(&pool);
    CHECK_OK(radix_cache_insert(c, x, ix, 3, NULL));
    /* X stays referenced by its running sequence: pinned. */
    /* Recency now (old -> new): A3 A2 | B3 B2 A1 A0 | X2 X1 X0.
     * Touch A again: A is the most recent chain, B the least. */
    CHECK_OK(radix_cache_match(c, a, 4, got, &m));
    for (size_t i = 0; i < m; i++) fp_unref(&pool, got[i]);

    CHECK_OK(radix_cache_evict(c, 1, &ev));
    CHECK_EQ_INT(ev, 1);
    CHECK_EQ_INT(pool.count[ib[3]], 0); /* B3: least recent leaf */
    CHECK_OK(radix_cache_evict(c, 1, &ev));
    CHECK_EQ_INT(pool.count[ib[2]], 0); /* then B2, now a leaf */
    /* A1 and A0 have a cached child: next is A's leaf A3, then A2, A1, A0.
     * X is pinned throughout. */
    CHECK_OK(radix_cache_evict(c, 2, &ev));
    CHECK_EQ_INT(ev, 2);
    CHECK_EQ_INT(pool.count[ia[3]], 0);
    CHECK_EQ_INT(pool.count[ia[2]], 0);
    CHECK_EQ_INT(pool.count[ia[1]], 1);
    CHECK_OK(radix_cache_evict(c, 100, &ev));
    CHECK_EQ_INT(ev, 2);
    CHECK_EQ_INT(pool.count[ia[0]], 0);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(pool.count[ix[i]], 2);
    CHECK_EQ_INT(radix_cache_size(c), 3);

    /* Leaf first: with X2 pinned by a sequence but X0, X1 held by the cache
     * alone, X0 and X1 still may not go (they have a cached child). */
    fp_unref(&pool, ix[0]);
    fp_unref(&pool, ix[1]);
    CHECK_OK(radix_cache_evict(c, 100, &ev));
    CHECK_EQ_INT(ev, 0);
    CHECK_EQ_INT(radix_cache_size(c), 3);
    fp_unref(&pool, ix[2]); /* the sequence ends: now the whole chain can go, leaf first */
    CHECK_OK(radix_cache_evict(c, 1, &ev));
    CHECK_EQ_INT(ev, 1);
    CHECK_EQ_INT(pool.count[ix[2]], 0);
    CHECK_EQ_INT(pool.count[ix[0]], 1);
    CHECK_OK(radix_cache_evict(c, 5, &ev));
    CHECK_EQ_INT(ev, 2);
    CHECK_EQ_INT(radix_cache_size(c), 0);
    CHECK_EQ_INT(fp_n_used(&pool), 0);
    radix_cache_stats_t s;
    radix_cache_get_stats(c, &s);
    CHECK_EQ_INT(s.evicted_blocks, 9);
    radix_cache_free(c);
    CHECK_EQ_INT(pool.violations, 0);
}

static void test_events_snapshot(void) {
    fake_pool_t pool = {0};
    radix_cache_t *c = make_cache(&pool, 0xABCD);
    radix_cache_events_t ev;
    radix_cache_snapshot_t snap;
    block_hash_t a[4], b[4];
    chain(2, 4, 1, a);
    chain(2, 4, 2, b);

    CHECK_OK(radix_cache_take_events(c, &ev));
    CHECK_EQ_INT(ev.seq, 0);
    CHECK_EQ_INT(ev.n_stored + ev.n_removed, 0);
    radix_cache_events_free(&ev);
    CHECK_OK(radix_cache_snapshot(c, &snap));
    CHECK_EQ_INT(snap.n, 0);
    CHECK_EQ_INT(snap.seq, 0);
    radix_cache_snapshot_free(&snap);

    int32_t ia[4], ib[4], got[4];
    size_t m, n_ev;
    for (int i = 0; i < 4; i++) ia[i] = fp_alloc(&pool);
    CHECK_OK(radix_cache_insert(c, a, ia, 4, NULL));
    for (int i = 0; i < 4; i++) fp_unref(&pool, ia[i]);
    CHECK_EQ_INT(radix_cache_snapshot(c, &snap), BATON_ERR_BUSY);
    CHECK_OK(radix_cache_take_events(c, &ev));
    CHECK_EQ_INT(ev.epoch, 0xABCD);
    CHECK_EQ_INT(ev.seq, 1);
    CHECK_EQ_INT(ev.n_stored, 4);
    CHECK_EQ_INT(ev.n_removed, 0);
    for (size_t i = 0; i < ev.n_stored && i < 4; i++) {
        CHECK(block_hash_eq(&ev.stored[i].hash, &a[i]));
        CHECK_EQ_INT(ev.stored[i].has_parent, i > 0);
        if (i > 0) CHECK(block_hash_eq(&ev.stored[i].parent, &a[i - 1]));
    }
    radix_cache_events_free(&ev);
    CHECK(ev.stored == NULL && ev.n_stored == 0);

    /* Insert B (B2, B3 new), evict B3, then A3: B3 was stored and removed
     * inside this window, so the batch holds stored {B2} and removed {A3}
     * (A3 was published in batch 1). */
    CHECK_OK(radix_cache_match(c, b, 4, got, &m));
    ib[0] = got[0], ib[1] = got[1], ib[2] = fp_alloc(&pool), ib[3] = fp_alloc(&pool);
    CHECK_OK(radix_cache_insert(c, b, ib, 4, NULL));
    for (int i = 0; i < 4; i++) fp_unref(&pool, ib[i]);
    CHECK_OK(radix_cache_match(c, a, 4, got, &m)); /* A most recent */
    for (size_t i = 0; i < m; i++) fp_unref(&pool, got[i]);
    CHECK_OK(radix_cache_evict(c, 1, &n_ev)); /* B3 */
    CHECK_EQ_INT(pool.count[ib[3]], 0);
    /* Pin B2 by a sequence so the next eviction takes A3. */
    CHECK_OK(fp_ref(&pool, ib[2]));
    CHECK_OK(radix_cache_evict(c, 1, &n_ev));
    CHECK_EQ_INT(pool.count[ia[3]], 0);
    fp_unref(&pool, ib[2]);
    CHECK_OK(radix_cache_take_events(c, &ev));
    CHECK_EQ_INT(ev.seq, 2);
    CHECK_EQ_INT(ev.n_stored, 1);
    CHECK_EQ_INT(ev.n_removed, 1);
    if (ev.n_stored == 1) {
        CHECK(block_hash_eq(&ev.stored[0].hash, &b[2]));
        CHECK(ev.stored[0].has_parent && block_hash_eq(&ev.stored[0].parent, &b[1]));
    }
    if (ev.n_removed == 1) CHECK(block_hash_eq(&ev.removed[0], &a[3]));
    radix_cache_events_free(&ev);

    /* Removed and stored again inside one window: no net change, no seq. */
    CHECK_OK(radix_cache_match(c, a, 3, got, &m)); /* touch A0..A2: B2 is LRU leaf */
    for (size_t i = 0; i < m; i++) fp_unref(&pool, got[i]);
    CHECK_OK(radix_cache_evict(c, 1, &n_ev));
    CHECK_EQ_INT(pool.count[ib[2]], 0);
    int32_t again = fp_alloc(&pool);
    int32_t ib2[3] = {ia[0], ia[1], again};
    CHECK_OK(radix_cache_insert(c, b, ib2, 3, NULL));
    fp_unref(&pool, again);
    CHECK_OK(radix_cache_take_events(c, &ev));
    CHECK_EQ_INT(ev.n_stored + ev.n_removed, 0);
    CHECK_EQ_INT(ev.seq, 2);
    radix_cache_events_free(&ev);

    /* Snapshot = the published state: A0 A1 A2 B2, parents first. */
    CHECK_OK(radix_cache_snapshot(c, &snap));
    CHECK_EQ_INT(snap.epoch, 0xABCD);
    CHECK_EQ_INT(snap.seq, 2);
    CHECK_EQ_INT(snap.n, 4);
    block_hash_t want[4] = {a[0], a[1], a[2], b[2]};
    for (int i = 0; i < 4; i++) CHECK(in_links(snap.links, snap.n, &want[i], NULL));
    for (size_t i = 0; i < snap.n; i++) {
        size_t pos;
        if (snap.links[i].has_parent)
            CHECK_MSG(in_links(snap.links, snap.n, &snap.links[i].parent, &pos) && pos < i,
                      "snapshot link %zu before its parent", i);
    }
    radix_cache_snapshot_free(&snap);
    radix_cache_snapshot_free(NULL);
    radix_cache_events_free(NULL);
    radix_cache_free(c);
    CHECK_EQ_INT(fp_n_used(&pool), 0);
    CHECK_EQ_INT(pool.violations, 0);
}

/* ---- randomized --------------------------------------------------------- */

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

/* The receiver's model: a set of hashes with parents, fed by the batches. */
typedef struct model {
    block_hash_link_t *l;
    size_t n, cap;
    uint64_t seq;
} model_t;

static void model_apply(model_t *mo, const radix_cache_events_t *ev) {
    for (size_t k = 0; k < ev->n_removed; k++) {
        size_t pos;
        CHECK(in_links(mo->l, mo->n, &ev->removed[k], &pos));
        if (in_links(mo->l, mo->n, &ev->removed[k], &pos)) mo->l[pos] = mo->l[--mo->n];
    }
    for (size_t k = 0; k < ev->n_stored; k++) {
        CHECK(!in_links(mo->l, mo->n, &ev->stored[k].hash, NULL));
        if (ev->stored[k].has_parent)
            CHECK_MSG(in_links(mo->l, mo->n, &ev->stored[k].parent, NULL),
                      "stored block before its parent");
        if (mo->n == mo->cap) {
            mo->cap = mo->cap ? 2 * mo->cap : 64;
            mo->l = realloc(mo->l, mo->cap * sizeof(*mo->l));
        }
        mo->l[mo->n++] = ev->stored[k];
    }
}

static void test_randomized(void) {
    fake_pool_t pool = {0};
    radix_cache_t *c = make_cache(&pool, 3);
    model_t mo = {0};
    enum { OPS = 4000, MAXB = 12 };
    /* Outstanding sequences: their block ids (one reference each). */
    int32_t live[8][MAXB];
    int n_live_blocks[8] = {0};
    uint64_t last_seq = 0;
    for (int op = 0; op < OPS && t_failures < 10; op++) {
        int slot = (int)(rnd() % 8);
        uint64_t r = rnd() % 10;
        if (r < 5) {
            /* A request: tokens from a small tree of prefixes. */
            for (int i = 0; i < n_live_blocks[slot]; i++) fp_unref(&pool, live[slot][i]);
            n_live_blocks[slot] = 0;
            int nb = 1 + (int)(rnd() % MAXB);
            int32_t toks[4 * MAXB];
            for (int b = 0; b < nb; b++)
                for (int t = 0; t < 4; t++) toks[4 * b + t] = (int32_t)(rnd() % (b < 3 ? 2 : 3));
            block_hash_t h[MAXB];
            size_t nh;
            CHECK_OK(block_hash_chain(toks, 4 * (size_t)nb, 4, 1, NULL, h, MAXB, &nh));
            int32_t ids[MAXB];
            size_t m;
            CHECK_OK(radix_cache_match(c, h, nh, ids, &m));
            bool ok = true;
            for (size_t i = m; i < nh; i++) {
                ids[i] = fp_alloc(&pool);
                if (ids[i] < 0) {
                    size_t ev;
                    CHECK_OK(radix_cache_evict(c, nh - i, &ev));
                    ids[i] = fp_alloc(&pool);
                }
                if (ids[i] < 0) { /* pool full of pinned blocks: give up */
                    for (size_t j = 0; j < i; j++) fp_unref(&pool, ids[j]);
                    ok = false;
                    break;
                }
            }
            if (!ok) continue;
            CHECK_OK(radix_cache_insert(c, h, ids, nh, NULL));
            for (size_t i = 0; i < nh; i++) live[slot][i] = ids[i];
            n_live_blocks[slot] = (int)nh;
        } else if (r < 7) {
            for (int i = 0; i < n_live_blocks[slot]; i++) fp_unref(&pool, live[slot][i]);
            n_live_blocks[slot] = 0;
        } else if (r < 9) {
            size_t ev;
            CHECK_OK(radix_cache_evict(c, 1 + rnd() % 6, &ev));
        } else {
            radix_cache_events_t ev;
            CHECK_OK(radix_cache_take_events(c, &ev));
            if (ev.n_stored + ev.n_removed > 0) {
                CHECK_EQ_INT(ev.seq, last_seq + 1);
                last_seq = ev.seq;
                model_apply(&mo, &ev);
            } else {
                CHECK_EQ_INT(ev.seq, last_seq);
            }
            radix_cache_events_free(&ev);
            radix_cache_snapshot_t snap;
            CHECK_OK(radix_cache_snapshot(c, &snap));
            CHECK_EQ_INT(snap.n, mo.n);
            CHECK_EQ_INT(snap.seq, last_seq);
            for (size_t i = 0; i < snap.n; i++) {
                size_t pos;
                CHECK(in_links(mo.l, mo.n, &snap.links[i].hash, NULL));
                if (snap.links[i].has_parent)
                    CHECK(in_links(snap.links, snap.n, &snap.links[i].parent, &pos) && pos < i);
            }
            radix_cache_snapshot_free(&snap);
        }
        /* Refcounts: every used block is held by the cache and/or sequences. */
        int32_t expect[POOL_N] = {0};
        for (int s = 0; s < 8; s++)
            for (int i = 0; i < n_live_blocks[s]; i++) expect[live[s][i]]++;
        int cache_only = 0, used = 0;
        for (int i = 0; i < POOL_N; i++) {
            CHECK(pool.count[i] >= expect[i] && pool.count[i] <= expect[i] + 1);
            cache_only += pool.count[i] == expect[i] + 1;
            used += pool.count[i] > 0;
        }
        CHECK_EQ_INT(cache_only, radix_cache_size(c));
        (void)used;
    }
    for (int s = 0; s < 8; s++)
        for (int i = 0; i < n_live_blocks[s]; i++) fp_unref(&pool, live[s][i]);
    radix_cache_stats_t st;
    radix_cache_get_stats(c, &st);
    fprintf(stderr, "randomized: %llu lookups, hit %llu / miss %llu blocks, %llu evicted, %zu cached\n",
            (unsigned long long)st.lookups, (unsigned long long)st.hit_blocks,
            (unsigned long long)st.miss_blocks, (unsigned long long)st.evicted_blocks, st.n_cached);
    CHECK(st.hit_blocks > 0 && st.evicted_blocks > 0);
    size_t ev;
    CHECK_OK(radix_cache_evict(c, SIZE_MAX, &ev));
    CHECK_EQ_INT(radix_cache_size(c), 0);
    CHECK_EQ_INT(fp_n_used(&pool), 0);
    radix_cache_free(c);
    free(mo.l);
    CHECK_EQ_INT(pool.violations, 0);
}

int main(void) {
    test_match_insert();
    test_evict_lru_leaf_first();
    test_events_snapshot();
    test_randomized();
    return TEST_DONE();
}
