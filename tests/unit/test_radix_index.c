/* Router global radix index: match counts for workers with overlapping
 * prefixes, sequence gaps and new epochs (purge + resync), stale batches,
 * speculative guesses (expiry, extension, confirmation), worker removal,
 * staleness, and a randomized run in which real worker radix caches feed the
 * index (some batches lost, workers restarted) checked against a plain
 * per-worker set model. */
#include <stdint.h>

#include "common/block_hash.h"
#include "common/radix_cache.h"
#include "router/radix_index.h"
#include "tests/test_util.h"

#define W RADIX_INDEX_MAX_WORKERS

static void chain(int shared, int n_blocks, int32_t variant, block_hash_t *out) {
    int32_t toks[4 * 64];
    for (int b = 0; b < n_blocks; b++)
        for (int t = 0; t < 4; t++)
            toks[4 * b + t] = b < shared ? 1000 + 4 * b + t : variant * 7919 + 4 * b + t;
    size_t n;
    block_hash_chain(toks, 4 * (size_t)n_blocks, 4, 5, NULL, out, 64, &n);
}

/* links[i] = hashes[i] with parent hashes[i-1]. */
static void links_of(const block_hash_t *h, size_t n, block_hash_link_t *out) {
    for (size_t i = 0; i < n; i++) {
        out[i].hash = h[i];
        out[i].has_parent = i > 0;
        out[i].parent = i > 0 ? h[i - 1] : (block_hash_t){0, 0};
    }
}

static size_t n_nodes(radix_index_t *idx) {
    radix_index_stats_t s;
    radix_index_get_stats(idx, &s);
    return s.n_nodes;
}

static void test_match_counts(void) {
    radix_index_t *idx = NULL;
    CHECK_OK(radix_index_init(&idx));
    block_hash_t a[8], b[8];
    block_hash_link_t la[8], lb[8];
    chain(3, 8, 1, a);
    chain(3, 8, 2, b);
    links_of(a, 8, la);
    links_of(b, 8, lb);
    bool rs = true;
    CHECK_OK(radix_index_apply_event(idx, 0, 11, 1, la, 8, NULL, 0, 100, &rs));
    CHECK(!rs);
    CHECK_OK(radix_index_apply_event(idx, 1, 12, 1, la, 4, NULL, 0, 100, &rs));
    CHECK(!rs);
    CHECK_OK(radix_index_apply_event(idx, 2, 13, 1, lb, 6, NULL, 0, 100, &rs));
    CHECK_OK(radix_index_apply_event(idx, 255, 14, 1, la, 2, NULL, 0, 100, &rs));
    /* Worker 3 holds A0 and A2 but not A1 (only a snapshot can say that). */
    block_hash_link_t odd[2] = {la[0], la[2]};
    bool applied = false;
    CHECK_OK(radix_index_apply_snapshot(idx, 3, 15, 4, odd, 2, 100, &applied));
    CHECK(applied);
    CHECK_EQ_INT(n_nodes(idx), 8 + 3);

    uint32_t cnt[W];
    CHECK_OK(radix_index_match(idx, a, 8, 200, cnt));
    CHECK_EQ_INT(cnt[0], 8);
    CHECK_EQ_INT(cnt[1], 4);
    CHECK_EQ_INT(cnt[2], 3);
    CHECK_EQ_INT(cnt[3], 1);
    CHECK_EQ_INT(cnt[255], 2);
    int others = 0;
    for (int w = 4; w < 255; w++) others += cnt[w] != 0;
    CHECK_EQ_INT(others, 0);
    CHECK_OK(radix_index_match(idx, b, 8, 200, cnt));
    CHECK_EQ_INT(cnt[0], 3);
    CHECK_EQ_INT(cnt[1], 3);
    CHECK_EQ_INT(cnt[2], 6);
    CHECK_EQ_INT(cnt[255], 2);
    /* The index is keyed by hash alone: a query list starting at a[1] counts
     * from there (real queries always start at block 0). */
    CHECK_OK(radix_index_match(idx, a + 1, 7, 200, cnt));
    CHECK_EQ_INT(cnt[0], 7);
    CHECK_EQ_INT(cnt[1], 3);
    CHECK_OK(radix_index_match(idx, a, 0, 200, cnt));
    CHECK_EQ_INT(cnt[0], 0);

    /* Removal event: worker 0 drops A7, A6. */
    block_hash_t rm[2] = {a[7], a[6]};
    CHECK_OK(radix_index_apply_event(idx, 0, 11, 2, NULL, 0, rm, 2, 300, &rs));
    CHECK(!rs);
    CHECK_OK(radix_index_match(idx, a, 8, 300, cnt));
    CHECK_EQ_INT(cnt[0], 6);
    CHECK_EQ_INT(n_nodes(idx), 6 + 3); /* A6, A7 had no other holder */
    CHECK(radix_index_holds(idx, 0, &a[5]) && !radix_index_holds(idx, 0, &a[6]));

    radix_index_worker_info_t wi;
    CHECK_OK(radix_index_worker_info(idx, 0, &wi));
    CHECK(wi.known && wi.synced);
    CHECK_EQ_INT(wi.epoch, 11);
    CHECK_EQ_INT(wi.last_seq, 2);
    CHECK_EQ_INT(wi.n_blocks, 6);
    CHECK_EQ_INT(radix_index_staleness_ms(idx, 0, 1300), 1000);
    CHECK_EQ_INT(radix_index_staleness_ms(idx, 2, 1300), 1200);
    CHECK_EQ_INT(radix_index_staleness_ms(idx, 9, 1300), -1);
    CHECK_EQ_INT(radix_index_staleness_ms(idx, 256, 1300), -1);

    /* Bad input. */
    CHECK_EQ_INT(radix_index_apply_event(idx, 256, 1, 1, la, 1, NULL, 0, 0, &rs),
                 BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(radix_index_apply_event(idx, 0, 11, 3, NULL, 2, NULL, 0, 0, &rs),
                 BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(radix_index_match(idx, NULL, 3, 0, cnt), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(radix_index_insert_speculative(idx, 300, a, 2, 10, 0), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(radix_index_remove_worker(idx, 256), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(radix_index_worker_info(idx, 256, &wi), BATON_ERR_INVALID_ARG);

    /* Removing every worker leaves no node behind. */
    int ws[] = {0, 1, 2, 3, 255};
    for (int i = 0; i < 5; i++) CHECK_OK(radix_index_remove_worker(idx, ws[i]));
    CHECK_EQ_INT(n_nodes(idx), 0);
    CHECK_OK(radix_index_worker_info(idx, 0, &wi));
    CHECK(!wi.known && wi.n_blocks == 0);
    CHECK_EQ_INT(radix_index_staleness_ms(idx, 0, 5000), -1);
    radix_index_free(idx);
    radix_index_free(NULL);
}

static void test_gap_epoch(void) {
    radix_index_t *idx = NULL;
    CHECK_OK(radix_index_init(&idx));
    block_hash_t a[6];
    block_hash_link_t la[6];
    chain(0, 6, 3, a);
    links_of(a, 6, la);
    uint32_t cnt[W];
    bool rs = false;

    /* First contact must start at seq 1, else the worker's history is unknown. */
    CHECK_OK(radix_index_apply_event(idx, 7, 100, 5, la, 2, NULL, 0, 10, &rs));
    CHECK(rs);
    CHECK_EQ_INT(n_nodes(idx), 0);
    radix_index_worker_info_t wi;
    CHECK_OK(radix_index_worker_info(idx, 7, &wi));
    CHECK(wi.known && !wi.synced);
    /* While awaiting the snapshot, batches are dropped and the need repeats. */
    rs = false;
    CHECK_OK(radix_index_apply_event(idx, 7, 100, 6, la + 2, 1, NULL, 0, 11, &rs));
    CHECK(rs);
    CHECK_EQ_INT(n_nodes(idx), 0);
    /* The snapshot (state as of batch 6) repairs it. */
    bool applied = false;
    CHECK_OK(radix_index_apply_snapshot(idx, 7, 100, 6, la, 3, 12, &applied));
    CHECK(applied);
    CHECK_OK(radix_index_worker_info(idx, 7, &wi));
    CHECK(wi.synced && wi.last_seq == 6 && wi.n_blocks == 3);
    /* An older snapshot is ignored; so is a duplicate batch. */
    CHECK_OK(radix_index_apply_snapshot(idx, 7, 100, 5, la, 1, 13, &applied));
    CHECK(!applied);
    CHECK_OK(radix_index_apply_event(idx, 7, 100, 6, NULL, 0, a, 3, 13, &rs));
    CHECK(!rs);
    CHECK_OK(radix_index_match(idx, a, 6, 13, cnt));
    CHECK_EQ_INT(cnt[7], 3);
    /* In order: applied. */
    CHECK_OK(radix_index_apply_event(idx, 7, 100, 7, la + 3, 1, NULL, 0, 14, &rs));
    CHECK(!rs);
    CHECK_OK(radix_index_match(idx, a, 6, 14, cnt));
    CHECK_EQ_INT(cnt[7], 4);

    /* Another worker shares the nodes; a purge of 7 must keep them for 8. */
    CHECK_OK(radix_index_apply_event(idx, 8, 200, 1, la, 2, NULL, 0, 14, &rs));
    CHECK(!rs);
    /* Gap (8 -> 10): purge 7 and ask for a resync. */
    CHECK_OK(radix_index_apply_event(idx, 7, 100, 10, la + 4, 1, NULL, 0, 15, &rs));
    CHECK(rs);
    CHECK_OK(radix_index_match(idx, a, 6, 15, cnt));
    CHECK_EQ_INT(cnt[7], 0);
    CHECK_EQ_INT(cnt[8], 2);
    CHECK_EQ_INT(n_nodes(idx), 2);
    radix_index_stats_t st;
    radix_index_get_stats(idx, &st);
    CHECK_EQ_INT(st.resyncs_requested, 2);

    /* Snapshot back, then the worker restarts: a new epoch starting at seq 1
     * is a complete history from empty: purge and apply, no resync. */
    CHECK_OK(radix_index_apply_snapshot(idx, 7, 100, 10, la, 5, 16, &applied));
    CHECK(applied);
    CHECK_OK(radix_index_match(idx, a, 6, 16, cnt));
    CHECK_EQ_INT(cnt[7], 5);
    CHECK_OK(radix_index_apply_event(idx, 7, 101, 1, la, 1, NULL, 0, 17, &rs));
    CHECK(!rs);
    CHECK_OK(radix_index_match(idx, a, 6, 17, cnt));
    CHECK_EQ_INT(cnt[7], 1);
    /* A new epoch seen mid-stream (its first batches lost): purge + resync. */
    CHECK_OK(radix_index_apply_event(idx, 7, 102, 3, la + 1, 1, NULL, 0, 18, &rs));
    CHECK(rs);
    CHECK_OK(radix_index_match(idx, a, 6, 18, cnt));
    CHECK_EQ_INT(cnt[7], 0);
    CHECK_OK(radix_index_worker_info(idx, 7, &wi));
    CHECK(!wi.synced && wi.epoch == 102 && wi.n_blocks == 0);
    CHECK_OK(radix_index_apply_snapshot(idx, 7, 102, 3, la, 2, 19, &applied));
    CHECK(applied);

    /* An inconsistent batch (stored block whose parent the worker does not
     * hold) also purges and asks for a resync. */
    CHECK_OK(radix_index_apply_event(idx, 7, 102, 4, la + 3, 1, NULL, 0, 20, &rs));
    CHECK(rs);
    CHECK_OK(radix_index_worker_info(idx, 7, &wi));
    CHECK(!wi.synced && wi.n_blocks == 0);
    /* Removing a hash the worker does not hold is counted, not fatal. */
    CHECK_OK(radix_index_apply_event(idx, 8, 200, 2, NULL, 0, &a[5], 1, 21, &rs));
    CHECK(!rs);
    radix_index_get_stats(idx, &st);
    CHECK_EQ_INT(st.unknown_removals, 1);
    radix_index_free(idx);
}

static void test_speculative(void) {
    radix_index_t *idx = NULL;
    CHECK_OK(radix_index_init(&idx));
    block_hash_t a[4];
    block_hash_link_t la[4];
    chain(0, 4, 4, a);
    links_of(a, 4, la);
    uint32_t cnt[W];
    bool rs;

    CHECK_OK(radix_index_insert_speculative(idx, 5, a, 4, 100, 1000));
    CHECK_EQ_INT(n_nodes(idx), 4);
    CHECK_OK(radix_index_match(idx, a, 4, 1050, cnt));
    CHECK_EQ_INT(cnt[5], 4);
    CHECK(!radix_index_holds(idx, 5, &a[0])); /* a guess is not a holding */
    radix_index_worker_info_t wi;
    CHECK_OK(radix_index_worker_info(idx, 5, &wi));
    CHECK_EQ_INT(wi.n_speculative, 4);
    CHECK_EQ_INT(radix_index_staleness_ms(idx, 5, 1050), -1); /* no event yet */
    /* Expired at now >= 1100: gone, and the nodes with it. */
    CHECK_OK(radix_index_match(idx, a, 4, 1100, cnt));
    CHECK_EQ_INT(cnt[5], 0);
    CHECK_EQ_INT(n_nodes(idx), 0);
    CHECK_OK(radix_index_worker_info(idx, 5, &wi));
    CHECK_EQ_INT(wi.n_speculative, 0);

    /* Extension: a second guess before expiry keeps it alive. */
    CHECK_OK(radix_index_insert_speculative(idx, 5, a, 2, 100, 2000));
    CHECK_OK(radix_index_insert_speculative(idx, 5, a, 2, 100, 2080));
    CHECK_OK(radix_index_match(idx, a, 4, 2150, cnt));
    CHECK_EQ_INT(cnt[5], 2);
    radix_index_expire(idx, 2180);
    CHECK_OK(radix_index_match(idx, a, 4, 2180, cnt));
    CHECK_EQ_INT(cnt[5], 0);
    /* A shorter later guess does not cut an existing one. */
    CHECK_OK(radix_index_insert_speculative(idx, 5, a, 1, 500, 2200));
    CHECK_OK(radix_index_insert_speculative(idx, 5, a, 1, 10, 2210));
    CHECK_OK(radix_index_match(idx, a, 4, 2600, cnt));
    CHECK_EQ_INT(cnt[5], 1);
    radix_index_expire(idx, 2700);
    CHECK_EQ_INT(n_nodes(idx), 0);

    /* Confirmation: guess 4 blocks for worker 6, its event stores 2 of them;
     * after the guess expires the 2 confirmed blocks remain. */
    CHECK_OK(radix_index_insert_speculative(idx, 6, a, 4, 100, 3000));
    CHECK_OK(radix_index_apply_event(idx, 6, 1, 1, la, 2, NULL, 0, 3020, &rs));
    CHECK(!rs);
    CHECK(radix_index_holds(idx, 6, &a[1]));
    CHECK_OK(radix_index_worker_info(idx, 6, &wi));
    CHECK_EQ_INT(wi.n_speculative, 2);
    CHECK_EQ_INT(wi.n_blocks, 2);
    CHECK_OK(radix_index_match(idx, a, 4, 3050, cnt));
    CHECK_EQ_INT(cnt[6], 4);
    CHECK_OK(radix_index_match(idx, a, 4, 5000, cnt));
    CHECK_EQ_INT(cnt[6], 2);
    CHECK_EQ_INT(n_nodes(idx), 2);
    /* Guessing what is already held changes nothing. */
    CHECK_OK(radix_index_insert_speculative(idx, 6, a, 2, 100, 5000));
    CHECK_OK(radix_index_worker_info(idx, 6, &wi));
    CHECK_EQ_INT(wi.n_speculative, 0);
    /* Guesses survive a resync purge; remove_worker drops them too. */
    block_hash_t c[4];
    chain(0, 4, 5, c);
    CHECK_OK(radix_index_insert_speculative(idx, 6, c, 4, 1000, 5000));
    CHECK_OK(radix_index_apply_event(idx, 6, 1, 9, NULL, 0, NULL, 0, 5001, &rs));
    CHECK(rs);
    CHECK_OK(radix_index_match(idx, c, 4, 5002, cnt));
    CHECK_EQ_INT(cnt[6], 4);
    CHECK_OK(radix_index_match(idx, a, 4, 5002, cnt));
    CHECK_EQ_INT(cnt[6], 0); /* the confirmed blocks went with the purge */
    CHECK_OK(radix_index_worker_info(idx, 6, &wi));
    CHECK_EQ_INT(wi.n_blocks, 0);
    CHECK_EQ_INT(wi.n_speculative, 4);
    CHECK_OK(radix_index_remove_worker(idx, 6));
    CHECK_OK(radix_index_match(idx, c, 4, 5003, cnt));
    CHECK_EQ_INT(cnt[6], 0);
    CHECK_EQ_INT(n_nodes(idx), 0);
    radix_index_stats_t st;
    radix_index_get_stats(idx, &st);
    CHECK_EQ_INT(st.speculative_confirmed, 2);
    radix_index_expire(idx, 100000); /* stale heap entries are skipped */
    CHECK_EQ_INT(n_nodes(idx), 0);
    radix_index_free(idx);
}

/* ---- randomized: worker caches -> events -> index vs per-worker sets ---- */

#define POOL_N 96
typedef struct fpool {
    int32_t count[POOL_N];
    int violations;
} fpool_t;
static baton_status_t fp_ref(void *c, int32_t id) {
    fpool_t *p = c;
    if (id < 0 || id >= POOL_N || p->count[id] <= 0) return p->violations++, BATON_ERR_INVALID_ARG;
    p->count[id]++;
    return BATON_OK;
}
static baton_status_t fp_unref(void *c, int32_t id) {
    fpool_t *p = c;
    if (id < 0 || id >= POOL_N || p->count[id] <= 0) return p->violations++, BATON_ERR_INVALID_ARG;
    p->count[id]--;
    return BATON_OK;
}
static int32_t fp_refcount(void *c, int32_t id) {
    fpool_t *p = c;
    return id < 0 || id >= POOL_N ? -1 : p->count[id];
}
static int32_t fp_alloc(fpool_t *p) {
    for (int32_t i = 0; i < POOL_N; i++)
        if (!p->count[i]) return p->count[i] = 1, i;
    return -1;
}

typedef struct hset {
    block_hash_t *h;
    size_t n, cap;
} hset_t;
static long hset_find(const hset_t *s, const block_hash_t *h) {
    for (size_t i = 0; i < s->n; i++)
        if (block_hash_eq(&s->h[i], h)) return (long)i;
    return -1;
}
static void hset_add(hset_t *s, const block_hash_t *h) {
    if (hset_find(s, h) >= 0) return;
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 32;
        s->h = realloc(s->h, s->cap * sizeof(*s->h));
    }
    s->h[s->n++] = *h;
}
static void hset_del(hset_t *s, const block_hash_t *h) {
    long i = hset_find(s, h);
    if (i >= 0) s->h[i] = s->h[--s->n];
}

typedef struct guess {
    block_hash_t h;
    uint64_t expire;
} guess_t;

typedef struct sim_worker {
    uint32_t id;
    fpool_t pool;
    radix_cache_t *cache;
    uint64_t epoch;
    /* model of the index's view */
    hset_t held;
    uint64_t delivered_seq; /* last batch the index applied (0: none) */
    bool awaiting;
    guess_t *g;
    size_t n_g, cap_g;
} sim_worker_t;

static uint64_t rs_ = 0x1234567887654321ull;
static uint64_t rnd(void) {
    rs_ ^= rs_ << 13;
    rs_ ^= rs_ >> 7;
    rs_ ^= rs_ << 17;
    return rs_;
}

static size_t random_chain(block_hash_t *h, size_t max) {
    int nb = 1 + (int)(rnd() % max);
    int32_t toks[4 * 16];
    for (int b = 0; b < nb; b++)
        for (int t = 0; t < 4; t++) toks[4 * b + t] = (int32_t)(rnd() % (b < 2 ? 2 : 3));
    size_t n;
    block_hash_chain(toks, 4 * (size_t)nb, 4, 9, NULL, h, 16, &n);
    return n;
}

static void sim_start(sim_worker_t *w, uint64_t epoch) {
    radix_cache_pool_ops_t ops = {&w->pool, fp_ref, fp_unref, fp_refcount};
    w->epoch = epoch;
    CHECK_OK(radix_cache_init(&ops, epoch, &w->cache));
}

static void guess_drop(sim_worker_t *w, const block_hash_t *h) {
    for (size_t i = 0; i < w->n_g; i++)
        if (block_hash_eq(&w->g[i].h, h)) {
            w->g[i] = w->g[--w->n_g];
            return;
        }
}

static void model_counts(sim_worker_t *ws, int n_ws, const block_hash_t *h, size_t n,
                         uint64_t now, uint32_t *cnt) {
    memset(cnt, 0, W * sizeof(*cnt));
    for (int k = 0; k < n_ws; k++) {
        sim_worker_t *w = &ws[k];
        uint32_t c = 0;
        for (size_t i = 0; i < n; i++) {
            bool has = hset_find(&w->held, &h[i]) >= 0;
            for (size_t j = 0; !has && j < w->n_g; j++)
                has = block_hash_eq(&w->g[j].h, &h[i]) && w->g[j].expire > now;
            if (!has) break;
            c++;
        }
        cnt[w->id] = c;
    }
}

static void test_randomized(void) {
    enum { NW = 5, OPS = 6000 };
    static const uint32_t ids[NW] = {0, 1, 63, 64, 255};
    sim_worker_t ws[NW];
    memset(ws, 0, sizeof(ws));
    radix_index_t *idx = NULL;
    CHECK_OK(radix_index_init(&idx));
    for (int k = 0; k < NW; k++) {
        ws[k].id = ids[k];
        sim_start(&ws[k], 1000 + k);
    }
    uint64_t now = 0, next_epoch = 5000;
    int n_lost = 0, n_resync = 0, n_restart = 0, n_queries = 0, n_nonzero = 0;
    for (int op = 0; op < OPS && t_failures < 10; op++) {
        now += rnd() % 20;
        sim_worker_t *w = &ws[rnd() % NW];
        uint64_t r = rnd() % 100;
        if (r < 35) { /* a request prefilled on w */
            block_hash_t h[16];
            int32_t bid[16];
            size_t n = random_chain(h, 16), m;
            CHECK_OK(radix_cache_match(w->cache, h, n, bid, &m));
            size_t got = m;
            for (; got < n; got++) {
                if ((bid[got] = fp_alloc(&w->pool)) >= 0) continue;
                size_t ev;
                CHECK_OK(radix_cache_evict(w->cache, n - got, &ev));
                if ((bid[got] = fp_alloc(&w->pool)) < 0) break;
            }
            CHECK_OK(radix_cache_insert(w->cache, h, bid, got, NULL));
            for (size_t i = 0; i < got; i++) fp_unref(&w->pool, bid[i]);
        } else if (r < 45) {
            size_t ev;
            CHECK_OK(radix_cache_evict(w->cache, 1 + rnd() % 8, &ev));
        } else if (r < 70) { /* publish a batch; 8% are lost */
            radix_cache_events_t ev;
            CHECK_OK(radix_cache_take_events(w->cache, &ev));
            if (ev.n_stored + ev.n_removed > 0) {
                if (rnd() % 100 < 8) {
                    n_lost++;
                } else {
                    bool rs = false;
                    CHECK_OK(radix_index_apply_event(idx, w->id, ev.epoch, ev.seq, ev.stored,
                                                     ev.n_stored, ev.removed, ev.n_removed, now,
                                                     &rs));
                    bool new_epoch = w->delivered_seq == 0 || ev.seq <= w->delivered_seq;
                    bool expect_rs = w->awaiting || (new_epoch ? ev.seq != 1
                                                               : ev.seq != w->delivered_seq + 1);
                    CHECK_EQ_INT(rs, expect_rs);
                    if (expect_rs) {
                        w->held.n = 0;
                        w->awaiting = true;
                    } else {
                        if (new_epoch) w->held.n = 0;
                        for (size_t i = 0; i < ev.n_removed; i++) hset_del(&w->held, &ev.removed[i]);
                        for (size_t i = 0; i < ev.n_stored; i++) {
                            hset_add(&w->held, &ev.stored[i].hash);
                            guess_drop(w, &ev.stored[i].hash);
                        }
                        w->delivered_seq = ev.seq;
                    }
                    if (rs) { /* the worker answers the resync request */
                        radix_cache_snapshot_t snap;
                        bool applied = false;
                        CHECK_OK(radix_cache_snapshot(w->cache, &snap));
                        CHECK_OK(radix_index_apply_snapshot(idx, w->id, snap.epoch, snap.seq,
                                                            snap.links, snap.n, now, &applied));
                        CHECK(applied);
                        for (size_t i = 0; i < snap.n; i++) {
                            hset_add(&w->held, &snap.links[i].hash);
                            guess_drop(w, &snap.links[i].hash);
                        }
                        w->delivered_seq = snap.seq;
                        w->awaiting = false;
                        radix_cache_snapshot_free(&snap);
                        n_resync++;
                    }
                }
            }
            radix_cache_events_free(&ev);
        } else if (r < 80) { /* routing-time guess */
            block_hash_t h[16];
            size_t n = random_chain(h, 16);
            uint32_t ttl = 20 + (uint32_t)(rnd() % 200);
            CHECK_OK(radix_index_insert_speculative(idx, w->id, h, n, ttl, now));
            for (size_t i = 0; i < n; i++) {
                if (hset_find(&w->held, &h[i]) >= 0) continue;
                bool found = false;
                for (size_t j = 0; j < w->n_g; j++)
                    if (block_hash_eq(&w->g[j].h, &h[i])) {
                        if (w->g[j].expire < now + ttl) w->g[j].expire = now + ttl;
                        found = true;
                    }
                if (!found) {
                    if (w->n_g == w->cap_g) {
                        w->cap_g = w->cap_g ? 2 * w->cap_g : 32;
                        w->g = realloc(w->g, w->cap_g * sizeof(*w->g));
                    }
                    w->g[w->n_g++] = (guess_t){h[i], now + ttl};
                }
            }
        } else if (r < 97) { /* query */
            block_hash_t h[16];
            size_t n = random_chain(h, 16);
            uint32_t got[W], want[W];
            CHECK_OK(radix_index_match(idx, h, n, now, got));
            model_counts(ws, NW, h, n, now, want);
            for (int k = 0; k < W; k++) {
                CHECK_MSG(got[k] == want[k], "op %d worker %d: index %u model %u", op, k, got[k],
                          want[k]);
                n_nonzero += got[k] != 0;
            }
            n_queries++;
        } else if (r < 99) { /* the worker restarts: new epoch, empty cache */
            radix_cache_free(w->cache);
            for (int i = 0; i < POOL_N; i++) CHECK_EQ_INT(w->pool.count[i], 0);
            sim_start(w, next_epoch++);
            n_restart++;
            /* the index learns of it from the next batch (seq 1 of the new
             * epoch), or through a resync if that one is lost */
            w->delivered_seq = 0;
        } else { /* dropped from the worker table */
            CHECK_OK(radix_index_remove_worker(idx, w->id));
            w->held.n = 0;
            w->n_g = 0;
            w->awaiting = false;
            /* the worker keeps running; its next batch has seq > 1 -> resync */
            w->delivered_seq = 0;
        }
        /* per-worker block counts agree with the model */
        for (int k = 0; k < NW; k++) {
            radix_index_worker_info_t wi;
            CHECK_OK(radix_index_worker_info(idx, ws[k].id, &wi));
            CHECK_EQ_INT(wi.n_blocks, ws[k].held.n);
        }
    }
    fprintf(stderr, "randomized: %d queries (%d non-zero worker counts), %d batches lost, "
            "%d resyncs, %d restarts\n", n_queries, n_nonzero, n_lost, n_resync, n_restart);
    CHECK(n_lost > 0 && n_resync > 0 && n_restart > 0 && n_nonzero > 0);
    /* Memory follows the workers: removing all leaves no node. */
    for (int k = 0; k < NW; k++) {
        CHECK_OK(radix_index_remove_worker(idx, ws[k].id));
        radix_cache_free(ws[k].cache);
        CHECK_EQ_INT(ws[k].pool.violations, 0);
        free(ws[k].held.h);
        free(ws[k].g);
    }
    CHECK_EQ_INT(n_nodes(idx), 0);
    radix_index_free(idx);
}

int main(void) {
    test_match_counts();
    test_gap_epoch();
    test_speculative();
    test_randomized();
    return TEST_DONE();
}
