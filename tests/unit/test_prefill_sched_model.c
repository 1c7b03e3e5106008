/* Prefill scheduler on the default model (SmolLM2-135M-Instruct Q4_1),
 * block size 16: prompts of k*B-1, k*B and k*B+1 tokens sharing a 40-token
 * system prompt give, cold and warm (in alternating order, chunked under a
 * 32-token budget, and all three batched together), exactly the greedy
 * first token of one model_forward over the whole prompt; the radix cache
 * reuses what the shared prefixes predict. */
#include <stdint.h>

#include "common/kv_pool.h"
#include "common/model.h"
#include "common/radix_cache.h"
#include "prefill_worker/prefill_sched.h"
#include "tests/test_util.h"

#define B 16
#define K 4
#define SYS 40

static model_t *g_model;
static backend_t *g_be;

typedef struct got {
    int idn;
    baton_status_t status;
    int32_t token, n_cached;
} got_t;

typedef struct harness {
    kv_pool_t *pool;
    radix_cache_t *cache;
    prefill_sched_t *s;
    got_t got[32];
    int n_got;
} harness_t;

static baton_status_t pool_ref(void *c, int32_t id) { return kv_pool_ref(c, id); }
static baton_status_t pool_unref(void *c, int32_t id) { return kv_pool_unref(c, id); }
static int32_t pool_rc(void *c, int32_t id) { return kv_pool_refcount(c, id); }

static void on_finished(void *arg, const prefill_sched_result_t *res) {
    harness_t *h = arg;
    got_t *g = &h->got[h->n_got++ % 32];
    g->idn = res->request_id[0];
    g->status = res->status;
    g->token = res->status == BATON_OK ? res->sample.token : -1;
    g->n_cached = res->n_cached_tokens;
    if (res->status == BATON_OK) CHECK_OK(prefill_sched_release(h->s, res->request_id));
}

static void h_init(harness_t *h, int32_t budget) {
    memset(h, 0, sizeof(*h));
    backend_kv_geom_t g = model_kv_geom(g_model, 64, B);
    CHECK_OK(kv_pool_init(g_be, &g, &h->pool));
    radix_cache_pool_ops_t ops = {h->pool, pool_ref, pool_unref, pool_rc};
    CHECK_OK(radix_cache_init(&ops, 1, &h->cache));
    prefill_sched_config_t c = prefill_sched_config_default();
    c.max_batch_tokens = budget;
    c.hash_seed = 42;
    prefill_sched_hooks_t hk = {.arg = h, .finished = on_finished};
    CHECK_OK(prefill_sched_init(g_model, h->pool, h->cache, &c, &hk, &h->s));
}

static void h_free(harness_t *h) {
    prefill_sched_free(h->s);
    radix_cache_free(h->cache);
    CHECK_EQ_INT(kv_pool_n_used(h->pool), 0);
    kv_pool_free(h->pool);
}

static void submit(harness_t *h, int idn, const int32_t *t, int32_t n) {
    uint8_t id[16] = {0};
    id[0] = (uint8_t)idn;
    prefill_sched_request_t q = {.request_id = id, .tokens = t, .n_tokens = n,
                                 .sampling = sampling_params_default(), .local = true};
    CHECK_OK(prefill_sched_submit(h->s, &q));
}

static void run_all(harness_t *h) {
    for (int i = 0; i < 1000; i++) {
        int32_t nt = 0;
        CHECK_OK(prefill_sched_step(h->s, &nt));
        if (nt == 0) break;
    }
}

static got_t *find(harness_t *h, int idn) {
    for (int i = h->n_got - 1; i >= 0; i--)
        if (h->got[i].idn == idn) return &h->got[i];
    return NULL;
}

static int32_t reference(const int32_t *t, int32_t n) {
    model_kv_t kv;
    int32_t nb = (n + B - 1) / B;
    CHECK_OK(model_kv_alloc(g_model, nb, B, &kv));
    int32_t bt[16];
    for (int32_t i = 0; i < nb; i++) bt[i] = i;
    model_seq_t q = {.tokens = t, .n_tokens = n, .pos = 0, .block_table = bt, .n_blocks = nb,
                     .logits = MODEL_LOGITS_LAST};
    model_batch_t b = {.seqs = &q, .n_seqs = 1};
    int32_t V = model_hparams(g_model)->n_vocab;
    float *lg = malloc(sizeof(float) * (size_t)V);
    CHECK_OK(model_forward(g_model, &kv, &b, lg));
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++)
        if (lg[i] > lg[best]) best = i;
    free(lg);
    model_kv_free(g_model, &kv);
    return best;
}

int main(void) {
    const char *path = test_default_model();
    if (!path) return 1;
    CHECK_OK(backend_cpu_create(2, &g_be));
    CHECK_OK(model_load(path, g_be, NULL, &g_model));
    if (!g_model) return TEST_DONE();
    const int32_t lens[3] = {K * B - 1, K * B, K * B + 1};
    int32_t p[3][K * B + 1];
    uint32_t x = 12345;
    for (int i = 0; i < 3; i++) {
        for (int32_t j = 0; j < lens[i]; j++) {
            x = x * 1103515245u + 12345u;
            /* the system prompt is the same in all three; the rest differs */
            uint32_t r = j < SYS ? (uint32_t)(j * 7919 + 11) : (x >> 8);
            p[i][j] = (int32_t)(r % 40000u) + 100;
        }
    }
    int32_t ref[3];
    for (int i = 0; i < 3; i++) ref[i] = reference(p[i], lens[i]);

    /* cold: each prompt alone, in one step */
    for (int i = 0; i < 3; i++) {
        harness_t h;
        h_init(&h, 512);
        submit(&h, i, p[i], lens[i]);
        run_all(&h);
        got_t *g = find(&h, i);
        CHECK(g && g->status == BATON_OK && g->n_cached == 0);
        if (g) CHECK_MSG(g->token == ref[i], "cold %d: %d vs %d", i, g->token, ref[i]);
        h_free(&h);
    }
    /* warm: one cache, alternating order, twice each, 32-token chunks */
    harness_t h;
    h_init(&h, 32);
    const int order[6] = {0, 2, 1, 0, 2, 1};
    /* expected cached tokens: the first reuses nothing; later first visits
     * share only the system prompt's full blocks (2 of 16 = 32 tokens); a
     * second visit reuses floor((n-1)/B) blocks */
    const int32_t want_cached[6] = {0, (SYS / B) * B, (SYS / B) * B, (lens[0] - 1) / B * B,
                                    (lens[2] - 1) / B * B, (lens[1] - 1) / B * B};
    for (int o = 0; o < 6; o++) {
        int i = order[o];
        submit(&h, 10 + o, p[i], lens[i]);
        run_all(&h);
        got_t *g = find(&h, 10 + o);
        CHECK(g && g->status == BATON_OK);
        if (!g) continue;
        CHECK_MSG(g->token == ref[i], "warm %d (visit %d): %d vs %d", i, o, g->token, ref[i]);
        CHECK_MSG(g->n_cached == want_cached[o], "visit %d: cached %d, expected %d", o, g->n_cached,
                  want_cached[o]);
    }
    radix_cache_stats_t rs;
    radix_cache_get_stats(h.cache, &rs);
    fprintf(stderr, "warm: %llu hit blocks, %llu miss blocks\n",
            (unsigned long long)rs.hit_blocks, (unsigned long long)rs.miss_blocks);
    /* all three together in mixed steps, against the warm cache */
    for (int i = 0; i < 3; i++) submit(&h, 20 + i, p[i], lens[i]);
    run_all(&h);
    for (int i = 0; i < 3; i++) {
        got_t *g = find(&h, 20 + i);
        CHECK(g && g->status == BATON_OK && g->token == ref[i]);
    }
    h_free(&h);
    model_free(g_model);
    backend_free(g_be);
    return TEST_DONE();
}
