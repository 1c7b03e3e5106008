/* Paged KV block manager: pool memory and layout, alloc/ref/unref, all-or-
 * nothing exhaustion, double free, block tables with shared prefixes, and a
 * randomized alloc/ref/unref run checked against a plain model of the
 * reference counts (no leaks: n_free returns to n_blocks). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv_pool.h"
#include "tests/test_util.h"

static uint64_t rng_state = 0x243F6A8885A308D3ull;

static uint32_t rng_int(uint32_t n) {
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return (uint32_t)(x % n);
}

static kv_pool_t *make_pool(backend_t *be, int32_t n_blocks, int32_t block_size) {
    backend_kv_geom_t g = {.n_layers = 3, .n_blocks = n_blocks, .block_size = block_size,
                           .n_kv_heads = 2, .head_dim = 8, .dtype = be->kv_dtype};
    kv_pool_t *p = NULL;
    CHECK_OK(kv_pool_init(be, &g, &p));
    return p;
}

static void test_init_layout(backend_t *be) {
    kv_pool_t *p = make_pool(be, 10, 0);
    if (!p)
        return;
    const backend_kv_geom_t *g = kv_pool_geom(p);
    CHECK_EQ_INT(g->block_size, KV_POOL_DEFAULT_BLOCK_SIZE);
    /* 16 tokens * 2 heads * 8 dims * 4 bytes */
    CHECK_EQ_INT(kv_pool_block_bytes(p), 16 * 2 * 8 * 4);
    CHECK_EQ_INT(kv_pool_bytes(p), 3 * 10 * 16 * 2 * 8 * 4);
    CHECK(kv_pool_k_base(p) && kv_pool_v_base(p) && kv_pool_k_base(p) != kv_pool_v_base(p));
    CHECK_EQ_INT(backend_kv_block_offset(g, 2, 9) + kv_pool_block_bytes(p), kv_pool_bytes(p));
    const unsigned char *k = kv_pool_k_base(p), *v = kv_pool_v_base(p);
    size_t nonzero = 0;
    for (size_t i = 0; i < kv_pool_bytes(p); i++)
        nonzero += k[i] != 0 || v[i] != 0;
    CHECK_EQ_INT(nonzero, 0);
    CHECK_EQ_INT(kv_pool_n_free(p), 10);
    CHECK_EQ_INT(kv_pool_n_used(p), 0);
    kv_pool_free(p);
    kv_pool_free(NULL);

    backend_kv_geom_t bad = {.n_layers = 1, .n_blocks = 0, .block_size = 16, .n_kv_heads = 1,
                             .head_dim = 8, .dtype = be->kv_dtype};
    kv_pool_t *q = (kv_pool_t *)&bad; /* must stay untouched on failure */
    CHECK_EQ_INT(kv_pool_init(be, &bad, &q), BATON_ERR_INVALID_ARG);
    CHECK(q == (kv_pool_t *)&bad);
    bad.n_blocks = 4;
    bad.dtype = BACKEND_DTYPE_BF16; /* the CPU backend keeps f32 KV */
    CHECK_EQ_INT(kv_pool_init(be, &bad, &q), BATON_ERR_INVALID_ARG);
    bad.dtype = be->kv_dtype;
    bad.n_blocks = INT32_MAX, bad.n_layers = INT32_MAX, bad.head_dim = INT32_MAX;
    CHECK_EQ_INT(kv_pool_init(be, &bad, &q), BATON_ERR_INVALID_ARG); /* size overflow */
    CHECK_EQ_INT(kv_pool_init(NULL, &bad, &q), BATON_ERR_INVALID_ARG);
}

static void test_alloc_ref(backend_t *be) {
    kv_pool_t *p = make_pool(be, 8, 16);
    if (!p)
        return;
    int32_t ids[8], sentinel[8];
    CHECK_OK(kv_pool_alloc(p, 3, ids));
    CHECK(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);
    for (int i = 0; i < 3; i++)
        CHECK_EQ_INT(kv_pool_refcount(p, ids[i]), 1);
    CHECK_EQ_INT(kv_pool_n_free(p), 5);
    CHECK_EQ_INT(kv_pool_n_used(p), 3);

    /* exhaustion: all or nothing */
    for (int i = 0; i < 8; i++)
        sentinel[i] = -7;
    int32_t more[8];
    memcpy(more, sentinel, sizeof(more));
    CHECK_EQ_INT(kv_pool_alloc(p, 6, more), BATON_ERR_NO_SPACE);
    CHECK(memcmp(more, sentinel, sizeof(more)) == 0);
    CHECK_EQ_INT(kv_pool_n_free(p), 5);
    CHECK_OK(kv_pool_alloc(p, 0, more));
    CHECK_OK(kv_pool_alloc(p, 5, more));
    CHECK_EQ_INT(kv_pool_n_free(p), 0);
    CHECK_EQ_INT(kv_pool_alloc(p, 1, more + 5), BATON_ERR_NO_SPACE);
    CHECK_EQ_INT(kv_pool_alloc(p, -1, more), BATON_ERR_INVALID_ARG);

    /* sharing */
    CHECK_OK(kv_pool_ref(p, ids[0]));
    CHECK_EQ_INT(kv_pool_refcount(p, ids[0]), 2);
    CHECK_OK(kv_pool_unref(p, ids[0]));
    CHECK_EQ_INT(kv_pool_n_free(p), 0);
    CHECK_OK(kv_pool_unref(p, ids[0]));
    CHECK_EQ_INT(kv_pool_refcount(p, ids[0]), 0);
    CHECK_EQ_INT(kv_pool_n_free(p), 1);

    /* double free, ref of a free block, bad ids: refused, nothing changes */
    CHECK_EQ_INT(kv_pool_unref(p, ids[0]), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(kv_pool_ref(p, ids[0]), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(kv_pool_unref(p, -1), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(kv_pool_unref(p, 8), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(kv_pool_ref(p, 8), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(kv_pool_refcount(p, 8), -1);
    CHECK_EQ_INT(kv_pool_refcount(p, -1), -1);
    CHECK_EQ_INT(kv_pool_n_free(p), 1);
    CHECK_EQ_INT(kv_pool_refcount(p, ids[0]), 0);

    /* the freed block is the one handed out next */
    int32_t again;
    CHECK_OK(kv_pool_alloc(p, 1, &again));
    CHECK_EQ_INT(again, ids[0]);
    CHECK_OK(kv_pool_unref(p, again));
    CHECK_OK(kv_pool_unref(p, ids[1]));
    CHECK_OK(kv_pool_unref(p, ids[2]));
    for (int i = 0; i < 5; i++)
        CHECK_OK(kv_pool_unref(p, more[i]));
    CHECK_EQ_INT(kv_pool_n_free(p), 8);
    kv_pool_free(p);
}

static void test_block_table(backend_t *be) {
    kv_pool_t *p = make_pool(be, 6, 16);
    if (!p)
        return;
    kv_block_table_t a, b;
    kv_block_table_init(&a);
    kv_block_table_init(&b);
    CHECK_OK(kv_block_table_reserve(&a, p, 1));
    CHECK_EQ_INT(a.n_blocks, 1);
    CHECK_EQ_INT(a.n_tokens, 1);
    CHECK_OK(kv_block_table_reserve(&a, p, 16));
    CHECK_EQ_INT(a.n_blocks, 1);
    CHECK_OK(kv_block_table_reserve(&a, p, 17));
    CHECK_EQ_INT(a.n_blocks, 2);
    CHECK_OK(kv_block_table_reserve(&a, p, 5)); /* never shrinks */
    CHECK_EQ_INT(a.n_blocks, 2);
    CHECK_EQ_INT(a.n_tokens, 17);
    CHECK_EQ_INT(kv_pool_n_free(p), 4);
    CHECK_EQ_INT(kv_block_table_reserve(&a, p, -1), BATON_ERR_INVALID_ARG);

    /* a shared block cannot follow a partly filled one */
    CHECK_EQ_INT(kv_block_table_append_shared(&a, p, a.blocks, 1), BATON_ERR_INVALID_ARG);
    CHECK_OK(kv_block_table_reserve(&a, p, 32));
    CHECK_EQ_INT(a.n_blocks, 2);

    /* b shares a's two blocks as its cached prefix, then grows by itself */
    CHECK_OK(kv_block_table_append_shared(&b, p, a.blocks, 2));
    CHECK_EQ_INT(b.n_tokens, 32);
    CHECK_EQ_INT(kv_pool_refcount(p, a.blocks[0]), 2);
    CHECK_EQ_INT(kv_pool_refcount(p, a.blocks[1]), 2);
    CHECK_OK(kv_block_table_reserve(&b, p, 40));
    CHECK_EQ_INT(b.n_blocks, 3);
    CHECK_EQ_INT(b.blocks[0], a.blocks[0]);
    CHECK_EQ_INT(kv_pool_n_free(p), 3);

    /* exhaustion leaves the table and the pool as they were */
    kv_block_table_t before = b;
    CHECK_EQ_INT(kv_block_table_reserve(&b, p, 40 + 16 * 4), BATON_ERR_NO_SPACE);
    CHECK_EQ_INT(b.n_blocks, before.n_blocks);
    CHECK_EQ_INT(b.n_tokens, before.n_tokens);
    CHECK_EQ_INT(kv_pool_n_free(p), 3);

    /* sharing a free or bad id is refused without taking any reference */
    int32_t free_id = -1;
    for (int32_t i = 0; i < 6; i++)
        if (kv_pool_refcount(p, i) == 0)
            free_id = i;
    kv_block_table_t c;
    kv_block_table_init(&c);
    int32_t mixed[3] = {a.blocks[0], free_id, a.blocks[1]};
    CHECK_EQ_INT(kv_block_table_append_shared(&c, p, mixed, 3), BATON_ERR_INVALID_ARG);
    mixed[1] = 99;
    CHECK_EQ_INT(kv_block_table_append_shared(&c, p, mixed, 3), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(c.n_blocks, 0);
    CHECK_EQ_INT(kv_pool_refcount(p, a.blocks[0]), 2);
    kv_block_table_release(&c, p);

    /* releasing a keeps the blocks b still holds */
    int32_t shared0 = a.blocks[0];
    kv_block_table_release(&a, p);
    CHECK(a.blocks == NULL && a.n_blocks == 0 && a.n_tokens == 0);
    CHECK_EQ_INT(kv_pool_refcount(p, shared0), 1);
    CHECK_EQ_INT(kv_pool_n_free(p), 3);
    kv_block_table_release(&b, p);
    CHECK_EQ_INT(kv_pool_n_free(p), 6);
    kv_block_table_release(NULL, p);
    kv_pool_free(p);
}

/* Random alloc / ref / unref / table operations against a model. */
static void test_random(backend_t *be) {
    enum { NB = 97, NT = 12 };
    kv_pool_t *p = make_pool(be, NB, 5);
    if (!p)
        return;
    int32_t model[NB] = {0};
    /* loose references held by the test (like a radix cache) */
    int32_t held[4096];
    int n_held = 0;
    kv_block_table_t tabs[NT];
    for (int i = 0; i < NT; i++)
        kv_block_table_init(&tabs[i]);
    int n_exhausted = 0, n_shared = 0, n_released = 0;
    for (int step = 0; step < 20000; step++) {
        int op = (int)rng_int(7);
        if (op == 0) { /* alloc */
            int32_t n = (int32_t)rng_int(9), ids[8];
            int32_t free_before = kv_pool_n_free(p);
            baton_status_t st = kv_pool_alloc(p, n, ids);
            if (n > free_before) {
                CHECK_EQ_INT(st, BATON_ERR_NO_SPACE);
                n_exhausted++;
            } else {
                CHECK_OK(st);
                for (int i = 0; i < n; i++) {
                    CHECK_EQ_INT(model[ids[i]], 0);
                    model[ids[i]] = 1;
                    if (n_held < 4096)
                        held[n_held++] = ids[i];
                    else {
                        CHECK_OK(kv_pool_unref(p, ids[i]));
                        model[ids[i]]--;
                    }
                }
            }
        } else if (op == 1 && n_held > 0) { /* drop a loose reference */
            int i = (int)rng_int(n_held);
            CHECK_OK(kv_pool_unref(p, held[i]));
            model[held[i]]--;
            held[i] = held[--n_held];
        } else if (op == 2 && n_held > 0 && n_held < 4096) { /* ref a live block */
            int32_t id = held[rng_int(n_held)];
            CHECK_OK(kv_pool_ref(p, id));
            model[id]++;
            held[n_held++] = id;
        } else if (op == 3) { /* unref/ref of a random id: must match the model */
            int32_t id = (int32_t)rng_int(NB + 4) - 2;
            if (id < 0 || id >= NB || model[id] == 0) {
                CHECK_EQ_INT(kv_pool_unref(p, id), BATON_ERR_INVALID_ARG);
                CHECK_EQ_INT(kv_pool_ref(p, id), BATON_ERR_INVALID_ARG);
            }
        } else if (op == 4) { /* grow a table */
            kv_block_table_t *t = &tabs[rng_int(NT)];
            int32_t want = t->n_tokens + (int32_t)rng_int(23);
            int32_t nb_before = t->n_blocks, free_before = kv_pool_n_free(p);
            int32_t need = (want + 4) / 5 - nb_before;
            baton_status_t st = kv_block_table_reserve(t, p, want);
            if (need > free_before) {
                CHECK_EQ_INT(st, BATON_ERR_NO_SPACE);
                CHECK_EQ_INT(t->n_blocks, nb_before);
            } else {
                CHECK_OK(st);
                for (int32_t i = nb_before; i < t->n_blocks; i++) {
                    CHECK_EQ_INT(model[t->blocks[i]], 0);
                    model[t->blocks[i]] = 1;
                }
            }
        } else if (op == 5) { /* a fresh table shares a prefix of another */
            kv_block_table_t *src = &tabs[rng_int(NT)], *dst = &tabs[rng_int(NT)];
            if (src != dst && dst->n_blocks == 0 && src->n_blocks > 0) {
                int32_t n = 1 + (int32_t)rng_int(src->n_blocks);
                CHECK_OK(kv_block_table_append_shared(dst, p, src->blocks, n));
                for (int32_t i = 0; i < n; i++)
                    model[src->blocks[i]]++;
                n_shared++;
            }
        } else if (op == 6) { /* release a table */
            kv_block_table_t *t = &tabs[rng_int(NT)];
            for (int32_t i = 0; i < t->n_blocks; i++)
                model[t->blocks[i]]--;
            n_released += t->n_blocks > 0;
            kv_block_table_release(t, p);
        }
        if (step % 97 == 0) {
            int32_t used = 0;
            for (int32_t i = 0; i < NB; i++) {
                CHECK_EQ_INT(kv_pool_refcount(p, i), model[i]);
                used += model[i] > 0;
            }
            CHECK_EQ_INT(kv_pool_n_used(p), used);
            CHECK_EQ_INT(kv_pool_n_free(p), NB - used);
        }
        if (t_failures > 20)
            break;
    }
    /* the run covered exhaustion, sharing and release */
    CHECK_MSG(n_exhausted > 10 && n_shared > 10 && n_released > 10, "exhausted %d shared %d released %d",
              n_exhausted, n_shared, n_released);
    for (int i = 0; i < n_held; i++)
        CHECK_OK(kv_pool_unref(p, held[i]));
    for (int i = 0; i < NT; i++)
        kv_block_table_release(&tabs[i], p);
    CHECK_EQ_INT(kv_pool_n_free(p), NB);
    CHECK_EQ_INT(kv_pool_n_used(p), 0);
    /* the free list is intact: every block can be handed out once */
    int32_t all[NB], seen[NB] = {0};
    CHECK_OK(kv_pool_alloc(p, NB, all));
    for (int i = 0; i < NB; i++)
        if (all[i] >= 0 && all[i] < NB)
            seen[all[i]]++;
    for (int i = 0; i < NB; i++)
        CHECK_EQ_INT(seen[i], 1);
    kv_pool_free(p);
}

static float frand(void) { return (float)rng_int(1u << 24) / (float)(1u << 23) - 1.0f; }

/* Writes `n` tokens of one sequence (positions p0..p0+n-1, K/V rows taken
 * from K/V at those positions) into layer `layer` through the backend, then
 * runs attention for them with query q; out gets [n, n_heads, head_dim]. */
static void step(backend_t *be, kv_pool_t *p, kv_block_table_t *t, int layer, int p0, int n,
                 const float *K, const float *V, const float *q, int n_heads, float *out) {
    const backend_kv_geom_t *g = kv_pool_geom(p);
    const int row = g->n_kv_heads * g->head_dim;
    int32_t seq[64], pos[64], first = 0, ntok = n, nctx = p0 + n;
    for (int i = 0; i < n; i++)
        seq[i] = 0, pos[i] = p0 + i;
    backend_attn_batch_t b = {.n_tokens = n, .n_seqs = 1, .tok_seq = seq, .tok_pos = pos,
                              .seq_first_tok = &first, .seq_n_tok = &ntok, .seq_n_ctx = &nctx,
                              .block_tables = t->blocks, .max_blocks = t->n_blocks};
    CHECK_OK(be->ops->kv_write(be, g, kv_pool_k_base(p), kv_pool_v_base(p), layer, &b,
                               K + (size_t)p0 * row, V + (size_t)p0 * row));
    CHECK_OK(be->ops->attention(be, g, kv_pool_k_base(p), kv_pool_v_base(p), layer, &b, q, out,
                                n_heads));
}

/* Max relative error of attention output vs a double softmax over K/V. */
static double attn_err(const kv_pool_t *p, int p0, int n, const float *K, const float *V,
                       const float *q, int n_heads, const float *out) {
    const backend_kv_geom_t *g = kv_pool_geom(p);
    const int hd = g->head_dim, row = g->n_kv_heads * hd, group = n_heads / g->n_kv_heads;
    double maxd = 0, maxr = 0, w[256];
    for (int i = 0; i < n; i++)
        for (int h = 0; h < n_heads; h++) {
            const float *qh = q + ((size_t)i * n_heads + h) * hd;
            const int kvh = h / group, nk = p0 + i + 1;
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < nk; j++) {
                double d = 0;
                for (int e = 0; e < hd; e++)
                    d += (double)qh[e] * K[(size_t)j * row + kvh * hd + e];
                w[j] = d / sqrt((double)hd);
                mx = w[j] > mx ? w[j] : mx;
            }
            for (int j = 0; j < nk; j++)
                sum += (w[j] = exp(w[j] - mx));
            for (int e = 0; e < hd; e++) {
                double o = 0;
                for (int j = 0; j < nk; j++)
                    o += w[j] * V[(size_t)j * row + kvh * hd + e];
                o /= sum;
                double d = fabs(o - out[((size_t)i * n_heads + h) * hd + e]);
                maxd = d > maxd ? d : maxd;
                maxr = fabs(o) > maxr ? fabs(o) : maxr;
            }
        }
    return maxd / maxr;
}

/* Two sequences share a cached prefix: B appends A's first two (full)
 * blocks, grows by its own blocks and writes its own tokens after the
 * prefix. B's attention sees A's prefix K/V plus its own; A's blocks are not
 * touched by B's writes. */
static void test_shared_prefix_attention(void) {
    backend_t *be = NULL;
    CHECK_OK(backend_cpu_create(2, &be));
    if (!be)
        return;
    backend_kv_geom_t geom = {.n_layers = 2, .n_blocks = 12, .block_size = 16, .n_kv_heads = 2,
                              .head_dim = 32, .dtype = be->kv_dtype};
    kv_pool_t *p = NULL;
    CHECK_OK(kv_pool_init(be, &geom, &p));
    if (!p) {
        backend_free(be);
        return;
    }
    enum { NA = 40, NB = 50, PREFIX = 32, HEADS = 6, ROW = 2 * 32 };
    float *KA = malloc(sizeof(float) * NA * ROW), *VA = malloc(sizeof(float) * NA * ROW);
    float *KB = malloc(sizeof(float) * NB * ROW), *VB = malloc(sizeof(float) * NB * ROW);
    float *q = malloc(sizeof(float) * NB * HEADS * 32), *out = malloc(sizeof(float) * NB * HEADS * 32);
    for (int i = 0; i < NA * ROW; i++)
        KA[i] = frand(), VA[i] = frand();
    for (int i = 0; i < NB * ROW; i++) /* B's prefix is A's; the rest its own */
        KB[i] = i < PREFIX * ROW ? KA[i] : frand(), VB[i] = i < PREFIX * ROW ? VA[i] : frand();
    for (int i = 0; i < NB * HEADS * 32; i++)
        q[i] = frand();

    kv_block_table_t a, b;
    kv_block_table_init(&a);
    kv_block_table_init(&b);
    CHECK_OK(kv_block_table_reserve(&a, p, NA));
    /* A: prompt in two chunks (the second attends to the first through the pool) */
    step(be, p, &a, 1, 0, 25, KA, VA, q, HEADS, out);
    CHECK(attn_err(p, 0, 25, KA, VA, q, HEADS, out) < 1e-5);
    step(be, p, &a, 1, 25, NA - 25, KA, VA, q, HEADS, out);
    CHECK(attn_err(p, 25, NA - 25, KA, VA, q, HEADS, out) < 1e-5);

    size_t bb = kv_pool_block_bytes(p);
    unsigned char *snap = malloc(2 * bb);
    memcpy(snap, (char *)kv_pool_k_base(p) + backend_kv_block_offset(&geom, 1, a.blocks[0]), bb);
    memcpy(snap + bb, (char *)kv_pool_k_base(p) + backend_kv_block_offset(&geom, 1, a.blocks[1]), bb);

    CHECK_OK(kv_block_table_append_shared(&b, p, a.blocks, PREFIX / 16));
    CHECK_OK(kv_block_table_reserve(&b, p, NB));
    CHECK_EQ_INT(b.n_blocks, 4);
    CHECK_EQ_INT(kv_pool_refcount(p, a.blocks[0]), 2);
    /* B writes only positions >= PREFIX, in its own blocks */
    step(be, p, &b, 1, PREFIX, NB - PREFIX, KB, VB, q, HEADS, out);
    CHECK(attn_err(p, PREFIX, NB - PREFIX, KB, VB, q, HEADS, out) < 1e-5);
    CHECK(memcmp(snap, (char *)kv_pool_k_base(p) + backend_kv_block_offset(&geom, 1, a.blocks[0]), bb) == 0);
    CHECK(memcmp(snap + bb, (char *)kv_pool_k_base(p) + backend_kv_block_offset(&geom, 1, a.blocks[1]), bb) == 0);
    /* A's third block (its tokens 32..39) is not B's third block */
    CHECK(a.blocks[2] != b.blocks[2]);

    kv_block_table_release(&a, p);
    kv_block_table_release(&b, p);
    CHECK_EQ_INT(kv_pool_n_free(p), geom.n_blocks);
    free(KA), free(VA), free(KB), free(VB), free(q), free(out), free(snap);
    kv_pool_free(p);
    backend_free(be);
}

int main(void) {
    test_shared_prefix_attention();
    backend_t *be = NULL;
    CHECK_OK(backend_cpu_create(1, &be));
    if (!be)
        return TEST_DONE();
    test_init_layout(be);
    test_alloc_ref(be);
    test_block_table(be);
    test_random(be);
    backend_free(be);
    return TEST_DONE();
}
