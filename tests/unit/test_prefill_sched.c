/* Prefill scheduler on the tiny random llama (tests/data/tiny_llama.gguf,
 * 2 layers, vocab 272, context 96) with block size 4.
 *
 * Reference: the first token of every prompt is the greedy argmax of the
 * last-position logits of ONE model_forward over the whole prompt in a fresh
 * pool (no scheduler, no cache, no chunks). The scheduler must give the same
 * token whatever its chunking, batching with other requests or prefix reuse.
 * Hit counts are checked against the longest common prefix computed here
 * from the token lists. */
#include <stdint.h>
#include <unistd.h>

#include "common/kv_pool.h"
#include "common/model.h"
#include "common/radix_cache.h"
#include "prefill_worker/prefill_sched.h"
#include "tests/test_util.h"

#define B 4
#define POOL_BLOCKS 96
#define MAX_RES 64

static model_t *g_model;
static backend_t *g_be;

static const char *data_path(const char *name) {
    static char buf[4096];
    const char *src = getenv("BATON_SOURCE_DIR");
    snprintf(buf, sizeof(buf), "%s/tests/data/%s", src ? src : ".", name);
    return buf;
}

/* ---- harness ------------------------------------------------------------ */

typedef struct got {
    uint8_t id[16];
    baton_status_t status;
    int32_t token;
    float logprob;
    int32_t n_cached;
    int32_t n_blocks_sent;
} got_t;

typedef struct remote {
    /* a fake decode pool: [n_layers][POOL_BLOCKS] blocks of block_bytes, K and V */
    uint8_t *k, *v;
    int32_t sends[2][POOL_BLOCKS]; /* [layer][dst block] times written */
    baton_status_t fail_with;      /* send_layer returns this when set */
} remote_t;

typedef struct harness {
    kv_pool_t *pool;
    radix_cache_t *cache;
    prefill_sched_t *s;
    got_t got[MAX_RES];
    int n_got;
    bool release_on_finish;
    remote_t remote;
    size_t block_bytes;
} harness_t;

static baton_status_t pool_ref(void *c, int32_t id) { return kv_pool_ref(c, id); }
static baton_status_t pool_unref(void *c, int32_t id) { return kv_pool_unref(c, id); }
static int32_t pool_rc(void *c, int32_t id) { return kv_pool_refcount(c, id); }

static void on_finished(void *arg, const prefill_sched_result_t *res) {
    harness_t *h = arg;
    if (h->n_got < MAX_RES) {
        got_t *g = &h->got[h->n_got++];
        memcpy(g->id, res->request_id, 16);
        g->status = res->status;
        g->token = res->status == BATON_OK ? res->sample.token : -1;
        g->logprob = res->sample.logprob;
        g->n_cached = res->n_cached_tokens;
        g->n_blocks_sent = res->n_blocks_sent;
    }
    if (res->status == BATON_OK && h->release_on_finish)
        CHECK_OK(prefill_sched_release(h->s, res->request_id));
}

/* Copies the sent blocks of one layer out of the local pool, as a put would. */
static baton_status_t on_send(void *arg, void *dest_user, int32_t layer,
                              const kv_transfer_block_pair_t *pairs, size_t n) {
    harness_t *h = arg;
    CHECK(dest_user == (void *)h);
    if (h->remote.fail_with != BATON_OK) return h->remote.fail_with;
    const backend_kv_geom_t *g = kv_pool_geom(h->pool);
    for (size_t i = 0; i < n; i++) {
        size_t src = backend_kv_block_offset(g, layer, pairs[i].src_block);
        size_t dst = ((size_t)layer * POOL_BLOCKS + (size_t)pairs[i].dst_block) * h->block_bytes;
        memcpy(h->remote.k + dst, (uint8_t *)kv_pool_k_base(h->pool) + src, h->block_bytes);
        memcpy(h->remote.v + dst, (uint8_t *)kv_pool_v_base(h->pool) + src, h->block_bytes);
        h->remote.sends[layer][pairs[i].dst_block]++;
    }
    return BATON_OK;
}

static void h_init(harness_t *h, int32_t max_batch_tokens, uint32_t dest_timeout_ms) {
    memset(h, 0, sizeof(*h));
    backend_kv_geom_t g = model_kv_geom(g_model, POOL_BLOCKS, B);
    CHECK_OK(kv_pool_init(g_be, &g, &h->pool));
    radix_cache_pool_ops_t ops = {h->pool, pool_ref, pool_unref, pool_rc};
    CHECK_OK(radix_cache_init(&ops, 1, &h->cache));
    prefill_sched_config_t c = prefill_sched_config_default();
    c.max_batch_tokens = max_batch_tokens;
    c.hash_seed = 0x1234;
    c.kv_destination_timeout_ms = dest_timeout_ms;
    prefill_sched_hooks_t hooks = {.arg = h, .send_layer = on_send, .finished = on_finished};
    CHECK_OK(prefill_sched_init(g_model, h->pool, h->cache, &c, &hooks, &h->s));
    h->release_on_finish = true;
    h->block_bytes = kv_pool_block_bytes(h->pool);
    size_t rb = (size_t)g.n_layers * POOL_BLOCKS * h->block_bytes;
    h->remote.k = calloc(1, rb);
    h->remote.v = calloc(1, rb);
}

static void h_free(harness_t *h) {
    prefill_sched_free(h->s);
    radix_cache_free(h->cache);
    CHECK_EQ_INT(kv_pool_n_used(h->pool), 0);
    kv_pool_free(h->pool);
    free(h->remote.k);
    free(h->remote.v);
}

static void make_id(uint8_t id[16], int n) {
    memset(id, 0, 16);
    id[0] = (uint8_t)n;
    id[1] = (uint8_t)(n >> 8);
    id[15] = 0xab;
}

static baton_status_t submit(harness_t *h, int idn, const int32_t *toks, int32_t n, bool local) {
    uint8_t id[16];
    make_id(id, idn);
    prefill_sched_request_t q = {
        .request_id = id, .tokens = toks, .n_tokens = n,
        .sampling = sampling_params_default(), .local = local, .user = h,
    };
    return prefill_sched_submit(h->s, &q);
}

/* Steps until nothing runs; returns the number of steps. */
static int run_all(harness_t *h) {
    int steps = 0;
    for (int i = 0; i < 1000; i++) {
        int32_t nt = 0;
        CHECK_OK(prefill_sched_step(h->s, &nt));
        if (nt == 0) break;
        steps++;
    }
    return steps;
}

static got_t *find_got(harness_t *h, int idn) {
    uint8_t id[16];
    make_id(id, idn);
    for (int i = h->n_got - 1; i >= 0; i--)
        if (memcmp(h->got[i].id, id, 16) == 0) return &h->got[i];
    return NULL;
}

/* Reference: one forward over the whole prompt in a fresh pool, argmax. */
static int32_t ref_first_token(const int32_t *toks, int32_t n) {
    model_kv_t kv;
    int32_t nb = (n + B - 1) / B;
    CHECK_OK(model_kv_alloc(g_model, nb, B, &kv));
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)nb);
    for (int32_t i = 0; i < nb; i++) bt[i] = nb - 1 - i; /* any physical order */
    model_seq_t q = {.tokens = toks, .n_tokens = n, .pos = 0, .block_table = bt,
                     .n_blocks = nb, .logits = MODEL_LOGITS_LAST};
    model_batch_t b = {.seqs = &q, .n_seqs = 1};
    int32_t V = model_hparams(g_model)->n_vocab;
    float *lg = malloc(sizeof(float) * (size_t)V);
    CHECK_OK(model_forward(g_model, &kv, &b, lg));
    int32_t best = 0;
    for (int32_t t = 1; t < V; t++)
        if (lg[t] > lg[best]) best = t;
    free(lg);
    free(bt);
    model_kv_free(g_model, &kv);
    return best;
}

static void fill_prompt(int32_t *toks, int32_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 12345u;
    for (int32_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        toks[i] = (int32_t)((x >> 8) % 270u) + 1;
    }
}

/* ---- tests -------------------------------------------------------------- */

/* Chunk boundaries never change the first token: budgets 1, 3, 5, 16, 512. */
static void test_chunking(void) {
    const int32_t lens[] = {1, 3, 4, 5, 17, 40, 95};
    const int32_t budgets[] = {512, 16, 5, 3, 1};
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        int32_t toks[96];
        fill_prompt(toks, lens[li], (uint32_t)li + 1);
        int32_t ref = ref_first_token(toks, lens[li]);
        float lp0 = 0;
        for (size_t bi = 0; bi < sizeof(budgets) / sizeof(budgets[0]); bi++) {
            harness_t h;
            h_init(&h, budgets[bi], 10000);
            CHECK_OK(submit(&h, 1, toks, lens[li], true));
            int steps = run_all(&h);
            CHECK_EQ_INT(steps, (lens[li] + budgets[bi] - 1) / budgets[bi]);
            got_t *g = find_got(&h, 1);
            CHECK(g != NULL);
            if (g) {
                CHECK_EQ_INT(g->status, BATON_OK);
                CHECK_MSG(g->token == ref, "len %d budget %d: token %d, one-shot %d", lens[li],
                          budgets[bi], g->token, ref);
                if (bi == 0) lp0 = g->logprob;
                CHECK_MSG(fabsf(g->logprob - lp0) < 1e-4f, "logprob %f vs %f", g->logprob, lp0);
                CHECK(g->logprob <= 0);
            }
            h_free(&h);
        }
    }
}

/* Several requests share one step under the budget, FCFS. */
static void test_budget_mixing(void) {
    harness_t h;
    h_init(&h, 16, 10000);
    int32_t p[3][10];
    int32_t ref[3];
    for (int i = 0; i < 3; i++) {
        fill_prompt(p[i], 10, 100 + i);
        ref[i] = ref_first_token(p[i], 10);
        CHECK_OK(submit(&h, i, p[i], 10, true));
    }
    prefill_sched_stats_t st;
    prefill_sched_get_stats(h.s, &st);
    CHECK_EQ_INT(st.queued_prefill_tokens, 30);
    CHECK_EQ_INT(st.n_waiting, 3);
    int32_t nt = 0;
    /* step 1: request 0 whole (10) + request 1's first 6 */
    CHECK_OK(prefill_sched_step(h.s, &nt));
    CHECK_EQ_INT(nt, 16);
    CHECK_EQ_INT(h.n_got, 1);
    prefill_sched_get_stats(h.s, &st);
    CHECK_EQ_INT(st.n_running, 1);
    CHECK_EQ_INT(st.n_waiting, 1);
    CHECK_EQ_INT(st.queued_prefill_tokens, 14);
    /* step 2: request 1's last 4 + request 2 whole */
    CHECK_OK(prefill_sched_step(h.s, &nt));
    CHECK_EQ_INT(nt, 14);
    CHECK_EQ_INT(h.n_got, 3);
    CHECK_OK(prefill_sched_step(h.s, &nt));
    CHECK_EQ_INT(nt, 0);
    for (int i = 0; i < 3; i++) {
        got_t *g = find_got(&h, i);
        CHECK(g && g->status == BATON_OK && g->token == ref[i]);
    }
    prefill_sched_get_stats(h.s, &st);
    CHECK_EQ_INT(st.steps, 2);
    CHECK_EQ_INT(st.step_tokens, 30);
    CHECK_EQ_INT(st.finished_ok, 3);
    h_free(&h);
}

static int32_t lcp(const int32_t *a, int32_t na, const int32_t *b, int32_t nb) {
    int32_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

/* Prompts of k*B-1, k*B, k*B+1 tokens sharing a 22-token system prompt:
 * same first token cold and warm; cached tokens as the prefixes predict. */
static void test_radix_hits(void) {
    const int32_t k = 8;
    const int32_t lens[3] = {k * B - 1, k * B, k * B + 1};
    int32_t p[3][40];
    int32_t ref[3];
    for (int i = 0; i < 3; i++) {
        fill_prompt(p[i], lens[i], 7); /* same seed: the first 22 tokens are shared */
        int32_t tail[40];
        fill_prompt(tail, 40, 50 + i);
        for (int32_t j = 22; j < lens[i]; j++) p[i][j] = tail[j];
        ref[i] = ref_first_token(p[i], lens[i]);
    }
    /* cold: each alone in a fresh cache */
    for (int i = 0; i < 3; i++) {
        harness_t h;
        h_init(&h, 512, 10000);
        CHECK_OK(submit(&h, i, p[i], lens[i], true));
        run_all(&h);
        got_t *g = find_got(&h, i);
        CHECK(g && g->status == BATON_OK && g->token == ref[i] && g->n_cached == 0);
        h_free(&h);
    }
    /* warm: one cache, alternating order, each prompt twice */
    harness_t h;
    h_init(&h, 7, 10000); /* small budget: chunks start at odd offsets after a hit */
    const int order[6] = {0, 2, 1, 0, 2, 1};
    bool seen[3] = {false, false, false};
    uint64_t exp_hit = 0, exp_lookups = 0;
    for (int o = 0; o < 6; o++) {
        int i = order[o];
        /* expected reuse: longest prefix shared with an earlier prompt, in full
         * blocks, at most floor((n-1)/B) blocks */
        int32_t best = 0;
        for (int j = 0; j < 3; j++) {
            if (!seen[j]) continue;
            int32_t c = lcp(p[i], lens[i], p[j], lens[j]);
            int32_t full_j = lens[j] / B * B; /* only full blocks are cached */
            if (c > full_j) c = full_j;
            if (c > best) best = c;
        }
        int32_t blocks = best / B;
        if (blocks > (lens[i] - 1) / B) blocks = (lens[i] - 1) / B;
        exp_hit += (uint64_t)blocks;
        if ((lens[i] - 1) / B > 0) exp_lookups++;
        CHECK_OK(submit(&h, 10 + o, p[i], lens[i], true));
        run_all(&h);
        got_t *g = find_got(&h, 10 + o);
        CHECK(g != NULL);
        if (g) {
            CHECK_EQ_INT(g->status, BATON_OK);
            CHECK_MSG(g->token == ref[i], "warm prompt %d (order %d): token %d vs %d", i, o,
                      g->token, ref[i]);
            CHECK_MSG(g->n_cached == blocks * B, "prompt %d order %d: cached %d, expected %d", i, o,
                      g->n_cached, blocks * B);
        }
        seen[i] = true;
    }
    /* the second round of each prompt reuses everything but its last token's block */
    CHECK_EQ_INT(find_got(&h, 13)->n_cached, (lens[0] - 1) / B * B); /* 31 tokens: 28 */
    CHECK_EQ_INT(find_got(&h, 15)->n_cached, (lens[1] - 1) / B * B); /* 32 tokens: 28 */
    CHECK_EQ_INT(find_got(&h, 14)->n_cached, (lens[2] - 1) / B * B); /* 33 tokens: 32 */
    radix_cache_stats_t rs;
    radix_cache_get_stats(h.cache, &rs);
    CHECK_EQ_INT(rs.hit_blocks, exp_hit);
    CHECK_EQ_INT(rs.lookups, exp_lookups);
    /* idle: only the cache holds blocks */
    CHECK_EQ_INT(kv_pool_n_used(h.pool), (int64_t)radix_cache_size(h.cache));
    h_free(&h);
}

/* Abort in every state returns the pool to its idle value. */
static void test_abort(void) {
    harness_t h;
    h_init(&h, 8, 10000);
    int32_t p[3][30];
    for (int i = 0; i < 3; i++) fill_prompt(p[i], 30, 200 + i);
    /* warm the cache with prompt 0 so later requests hold shared blocks */
    CHECK_OK(submit(&h, 0, p[0], 30, true));
    run_all(&h);
    int32_t idle = kv_pool_n_used(h.pool);
    CHECK_EQ_INT(idle, (int64_t)radix_cache_size(h.cache));
    CHECK(idle > 0);
    h.release_on_finish = false;
    /* one step of 8 tokens: 1 and 3 hit 28 cached tokens and compute 2
     * each, 2 computes 4 of 30, 4 gets nothing */
    CHECK_OK(submit(&h, 1, p[0], 30, false)); /* then waits for its destination */
    CHECK_OK(submit(&h, 3, p[0], 30, true));  /* then done, not released */
    CHECK_OK(submit(&h, 2, p[2], 30, false)); /* then running mid-prompt */
    CHECK_OK(submit(&h, 4, p[1], 30, false)); /* still queued */
    int32_t nt;
    CHECK_OK(prefill_sched_step(h.s, &nt));
    CHECK_EQ_INT(nt, 8);
    prefill_sched_stats_t st;
    prefill_sched_get_stats(h.s, &st);
    /* 1 waits for its destination, 2 runs, 3 is done, 4 is queued or running */
    CHECK_EQ_INT(st.n_wait_dest, 1);
    CHECK_EQ_INT(st.n_done, 1);
    CHECK_EQ_INT(st.n_running, 1);
    CHECK_EQ_INT(st.n_waiting, 1);
    CHECK(kv_pool_n_used(h.pool) > (int32_t)radix_cache_size(h.cache));
    bool active = false;
    uint8_t id[16];
    for (int i = 1; i <= 4; i++) {
        make_id(id, i);
        CHECK_OK(prefill_sched_abort(h.s, id, &active));
        CHECK(active);
    }
    make_id(id, 99);
    CHECK_EQ_INT(prefill_sched_abort(h.s, id, &active), BATON_ERR_NOT_FOUND);
    /* idle again: only the cache's references remain (request 2's partial
     * prompt was never cached) */
    CHECK_EQ_INT(kv_pool_n_used(h.pool), (int64_t)radix_cache_size(h.cache));
    prefill_sched_get_stats(h.s, &st);
    CHECK_EQ_INT(st.n_waiting + st.n_running + st.n_wait_dest + st.n_done, 0);
    CHECK_EQ_INT(st.queued_prefill_tokens, 0);
    h_free(&h);
}

/* KVDestination that never comes: fails with TIMEOUT and releases. An early
 * destination for an unknown request expires too. */
static void test_dest_timeout(void) {
    harness_t h;
    h_init(&h, 512, 50);
    int32_t p[21];
    fill_prompt(p, 21, 300);
    int32_t idle = kv_pool_n_used(h.pool);
    CHECK_OK(submit(&h, 1, p, 21, false));
    int32_t nt;
    CHECK_OK(prefill_sched_step(h.s, &nt));
    CHECK_EQ_INT(nt, 21);
    CHECK_EQ_INT(h.n_got, 0);
    prefill_sched_stats_t st;
    prefill_sched_get_stats(h.s, &st);
    CHECK_EQ_INT(st.n_wait_dest, 1);
    CHECK(prefill_sched_next_deadline_us(h.s) >= 0);
    uint8_t id[16];
    make_id(id, 77);
    int32_t dst[6] = {0, 1, 2, 3, 4, 5};
    CHECK_OK(prefill_sched_set_destination(h.s, id, dst, 6, 0, &h)); /* early, never claimed */
    usleep(80 * 1000);
    CHECK_OK(prefill_sched_step(h.s, &nt));
    CHECK_EQ_INT(h.n_got, 1);
    CHECK_EQ_INT(h.got[0].status, BATON_ERR_TIMEOUT);
    prefill_sched_get_stats(h.s, &st);
    CHECK_EQ_INT(st.n_wait_dest, 0);
    CHECK_EQ_INT(st.n_early_dest, 0);
    CHECK_EQ_INT(st.failed, 1);
    CHECK_EQ_INT(prefill_sched_next_deadline_us(h.s), -1);
    /* only the cache's blocks remain (the prompt's 5 full blocks) */
    CHECK_EQ_INT(kv_pool_n_used(h.pool), idle + 5);
    CHECK_EQ_INT(radix_cache_size(h.cache), 5);
    h_free(&h);
}

/* Checks that every (layer, dst block) in [skip, n) was written exactly once
 * and holds the final K/V of the matching local block. */
static void check_remote(harness_t *h, const kv_block_table_t *t, const int32_t *dst, int32_t n,
                         int32_t skip) {
    const backend_kv_geom_t *g = kv_pool_geom(h->pool);
    for (int32_t l = 0; l < g->n_layers; l++) {
        for (int32_t j = 0; j < n; j++) {
            int32_t want = j < skip ? 0 : 1;
            CHECK_MSG(h->remote.sends[l][dst[j]] == want, "layer %d block %d sent %d times", l, j,
                      h->remote.sends[l][dst[j]]);
            if (j < skip) continue;
            size_t src = backend_kv_block_offset(g, l, t->blocks[j]);
            size_t off = ((size_t)l * POOL_BLOCKS + (size_t)dst[j]) * h->block_bytes;
            CHECK(memcmp(h->remote.k + off, (uint8_t *)kv_pool_k_base(h->pool) + src,
                         h->block_bytes) == 0);
            CHECK(memcmp(h->remote.v + off, (uint8_t *)kv_pool_v_base(h->pool) + src,
                         h->block_bytes) == 0);
        }
    }
}

/* Layer-wise sends: destination before the request, mid-prompt, after the
 * prompt; with a cached prefix and skipped blocks. Each block of each layer
 * goes once, with its final contents. */
static void test_transfer(void) {
    int32_t p[30];
    fill_prompt(p, 30, 400); /* 8 blocks, the last one partial (2 tokens) */
    int32_t ref = ref_first_token(p, 30);
    int32_t dst[8] = {40, 41, 42, 50, 51, 60, 3, 9};
    for (int when = 0; when < 3; when++) {
        harness_t h;
        h_init(&h, 9, 10000);
        h.release_on_finish = false;
        if (when == 2) { /* warm the cache: the request then starts with 7 cached blocks */
            CHECK_OK(submit(&h, 100, p, 30, true));
            run_all(&h);
            CHECK_OK(prefill_sched_release(h.s, h.got[0].id));
        }
        int32_t skip = when == 1 ? 2 : 0;
        uint8_t id[16];
        make_id(id, 1);
        if (when == 0) CHECK_OK(prefill_sched_set_destination(h.s, id, dst, 8, skip, &h));
        CHECK_OK(submit(&h, 1, p, 30, false));
        int32_t nt;
        CHECK_OK(prefill_sched_step(h.s, &nt));
        if (when == 1) {
            CHECK_EQ_INT(nt, 9);
            CHECK_OK(prefill_sched_set_destination(h.s, id, dst, 8, skip, &h));
            /* the 2 full blocks computed so far were skipped: nothing yet */
            CHECK_EQ_INT(h.remote.sends[0][dst[2]], 0);
        }
        run_all(&h);
        if (when == 2) {
            CHECK_EQ_INT(find_got(&h, 1), NULL);
            CHECK_OK(prefill_sched_set_destination(h.s, id, dst, 8, skip, &h));
        }
        got_t *g = find_got(&h, 1);
        CHECK(g != NULL);
        if (!g) {
            h_free(&h);
            continue;
        }
        CHECK_EQ_INT(g->status, BATON_OK);
        CHECK_EQ_INT(g->token, ref);
        CHECK_EQ_INT(g->n_blocks_sent, 8 - skip);
        CHECK_EQ_INT(g->n_cached, when == 2 ? 28 : 0);
        kv_block_table_t t;
        kv_block_table_init(&t);
        CHECK_OK(prefill_sched_detach(h.s, id, &t));
        CHECK_EQ_INT(t.n_blocks, 8);
        CHECK_EQ_INT(t.n_tokens, 30);
        check_remote(&h, &t, dst, 8, skip);
        kv_block_table_release(&t, h.pool);
        h_free(&h);
    }
    /* wrong block count: the request fails, blocks released */
    harness_t h;
    h_init(&h, 512, 10000);
    uint8_t id[16];
    make_id(id, 1);
    CHECK_OK(submit(&h, 1, p, 30, false));
    CHECK_EQ_INT(prefill_sched_set_destination(h.s, id, dst, 7, 0, &h), BATON_ERR_OUT_OF_RANGE);
    CHECK_EQ_INT(h.n_got, 1);
    CHECK_EQ_INT(h.got[0].status, BATON_ERR_OUT_OF_RANGE);
    /* a send failure (peer gone) fails the request after the step */
    CHECK_OK(submit(&h, 2, p, 30, false));
    make_id(id, 2);
    CHECK_OK(prefill_sched_set_destination(h.s, id, dst, 8, 0, &h));
    h.remote.fail_with = BATON_ERR_PEER;
    run_all(&h);
    CHECK_EQ_INT(h.n_got, 2);
    CHECK_EQ_INT(h.got[1].status, BATON_ERR_PEER);
    CHECK_EQ_INT(kv_pool_n_used(h.pool), (int64_t)radix_cache_size(h.cache));
    h_free(&h);
}

/* Bad input: clear errors, nothing queued. */
static void test_bad_input(void) {
    harness_t h;
    h_init(&h, 512, 10000);
    int32_t p[100];
    fill_prompt(p, 100, 9);
    CHECK_EQ_INT(submit(&h, 1, p, 0, true), BATON_ERR_OUT_OF_RANGE);
    CHECK_EQ_INT(submit(&h, 1, p, 97, true), BATON_ERR_OUT_OF_RANGE); /* context 96 */
    p[3] = 272;
    CHECK_EQ_INT(submit(&h, 1, p, 10, true), BATON_ERR_OUT_OF_RANGE);
    p[3] = 5;
    CHECK_OK(submit(&h, 1, p, 10, true));
    CHECK_EQ_INT(submit(&h, 1, p, 10, true), BATON_ERR_INVALID_ARG); /* duplicate id */
    uint8_t id[16];
    make_id(id, 1);
    int32_t dst[3] = {0, 1, 2};
    CHECK_EQ_INT(prefill_sched_set_destination(h.s, id, dst, 3, 4, &h), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(prefill_sched_release(h.s, id), BATON_ERR_INVALID_ARG); /* not done */
    run_all(&h);
    CHECK_EQ_INT(prefill_sched_release(h.s, id), BATON_ERR_NOT_FOUND); /* released by the hook */
    prefill_sched_request_t q = {.request_id = id, .tokens = p, .n_tokens = 10,
                                 .sampling = sampling_params_default()};
    q.sampling.top_p = 2.0f;
    CHECK(prefill_sched_submit(h.s, &q) != BATON_OK);
    h_free(&h);
}

/* A pool of 12 blocks for three 10-block prompts: the radix cache gives
 * finished prompts' blocks back (LRU eviction) and every request finishes
 * with its reference token. */
static void test_tight_pool(void) {
    harness_t h;
    memset(&h, 0, sizeof(h));
    backend_kv_geom_t g = model_kv_geom(g_model, 12, B);
    CHECK_OK(kv_pool_init(g_be, &g, &h.pool));
    radix_cache_pool_ops_t ops = {h.pool, pool_ref, pool_unref, pool_rc};
    CHECK_OK(radix_cache_init(&ops, 1, &h.cache));
    prefill_sched_config_t c = prefill_sched_config_default();
    c.max_batch_tokens = 12;
    prefill_sched_hooks_t hooks = {.arg = &h, .finished = on_finished};
    CHECK_OK(prefill_sched_init(g_model, h.pool, h.cache, &c, &hooks, &h.s));
    h.release_on_finish = true;
    int32_t p[3][40];
    int32_t ref[3];
    for (int i = 0; i < 3; i++) {
        fill_prompt(p[i], 40, 500 + i); /* 10 blocks each, pool of 12 */
        ref[i] = ref_first_token(p[i], 40);
        CHECK_OK(submit(&h, i, p[i], 40, true));
    }
    run_all(&h);
    for (int i = 0; i < 3; i++) {
        got_t *gg = find_got(&h, i);
        CHECK(gg && gg->status == BATON_OK && gg->token == ref[i]);
    }
    radix_cache_stats_t rs;
    radix_cache_get_stats(h.cache, &rs);
    CHECK(rs.evicted_blocks >= 18);
    prefill_sched_free(h.s);
    radix_cache_free(h.cache);
    CHECK_EQ_INT(kv_pool_n_used(h.pool), 0);
    kv_pool_free(h.pool);
}

int main(void) {
    CHECK_OK(backend_cpu_create(2, &g_be));
    CHECK_OK(model_load(data_path("tiny_llama.gguf"), g_be, NULL, &g_model));
    if (!g_model) return TEST_DONE();
    test_chunking();
    test_budget_mixing();
    test_radix_hits();
    test_abort();
    test_dest_timeout();
    test_transfer();
    test_bad_input();
    test_tight_pool();
    model_free(g_model);
    backend_free(g_be);
    return TEST_DONE();
}
