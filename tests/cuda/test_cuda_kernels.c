/* Every CUDA kernel against the CPU backend (the reference) on random
 * inputs at several shapes, including sizes that are not multiples of the
 * KV block (16), the prefill query tile (32) or the warp (32). Outputs are
 * poisoned (NaN) before each GPU run. Inputs that the GPU stores as bf16
 * (weights, K/V) are rounded to bf16 on the host first, so the CPU sees the
 * same values and the remaining difference is accumulation order and the
 * bf16 rounding of GEMM activations. Skips (77) without CUDA or a GPU. */
#include "tests/cuda/cuda_test_common.h"

static backend_t *gpu, *cpu;

/* ---- matmul ---- */
static void test_matmul(int32_t n, int32_t in, int32_t out, int with_bias) {
    float *w = malloc(sizeof(float) * (size_t)in * out), *bias = malloc(sizeof(float) * out);
    float *x = malloc(sizeof(float) * (size_t)n * in);
    float *yc = malloc(sizeof(float) * (size_t)n * out), *yg = malloc(sizeof(float) * (size_t)n * out);
    t_fill(w, (int64_t)in * out, -0.5f, 0.5f, 1);
    t_fill(bias, out, -1.0f, 1.0f, 1);
    t_fill(x, (int64_t)n * in, -1.0f, 1.0f, 0);
    backend_t *bes[2] = {cpu, gpu};
    float *ys[2] = {yc, yg};
    for (int b = 0; b < 2; b++) {
        backend_t *be = bes[b];
        backend_weight_t *W = NULL, *B = NULL;
        CHECK_OK(be->ops->weight_create(be, w, out, in, &W));
        CHECK_OK(be->ops->weight_create(be, bias, 1, out, &B));
        float *dx = t_alloc_upload(be, x, sizeof(float) * (size_t)n * in);
        float *dy = be->ops->alloc(be, sizeof(float) * (size_t)n * out);
        CHECK(dx && dy && W && B);
        if (dx && dy && W && B) {
            CHECK_OK(t_poison(be, dy, sizeof(float) * (size_t)n * out));
            CHECK_OK(be->ops->matmul(be, W, with_bias ? B : NULL, dx, dy, n));
            CHECK_OK(be->ops->download(be, ys[b], dy, sizeof(float) * (size_t)n * out));
        }
        be->ops->free(be, dx);
        be->ops->free(be, dy);
        be->ops->weight_free(be, W);
        be->ops->weight_free(be, B);
    }
    double e = t_rel_err(yg, yc, (int64_t)n * out);
    /* x is rounded to bf16 (relative 2^-9 per element) before the GEMM */
    CHECK_MSG(e < 1e-2, "matmul n %d in %d out %d bias %d: rel err %g", n, in, out, with_bias, e);
    free(w); free(bias); free(x); free(yc); free(yg);
}

/* ---- one-input element-wise ops, run on both backends ---- */
enum { OP_RMS, OP_SWIGLU, OP_ADD, OP_EMBED, OP_GATHER };

static void run_simple(backend_t *be, int op, int32_t n, int32_t d, const float *a, const float *b,
                       const float *wt, int64_t wt_rows, const int32_t *idx, float *y, int in_place) {
    size_t nb = sizeof(float) * (size_t)n * d;
    int64_t a_rows = op == OP_GATHER ? wt_rows : n;
    float *da = a ? t_alloc_upload(be, a, sizeof(float) * (size_t)a_rows * d) : NULL;
    float *db = b ? t_alloc_upload(be, b, nb) : NULL;
    float *dy = in_place ? da : be->ops->alloc(be, nb);
    backend_weight_t *W = NULL;
    if (wt) CHECK_OK(be->ops->weight_create(be, wt, wt_rows, d, &W));
    CHECK(dy != NULL);
    if (!in_place && dy) CHECK_OK(t_poison(be, dy, nb));
    switch (op) {
    case OP_RMS: CHECK_OK(be->ops->rmsnorm(be, da, W, 1e-5f, dy, n, d)); break;
    case OP_SWIGLU: CHECK_OK(be->ops->swiglu(be, da, db, dy, n, d)); break;
    case OP_ADD: CHECK_OK(be->ops->add(be, da, db, dy, (int64_t)n * d)); break;
    case OP_EMBED: CHECK_OK(be->ops->embed(be, W, idx, n, dy)); break;
    case OP_GATHER: CHECK_OK(be->ops->gather_rows(be, da, idx, n, d, dy)); break;
    }
    CHECK_OK(be->ops->download(be, y, dy, nb));
    if (!in_place) be->ops->free(be, dy);
    be->ops->free(be, da);
    be->ops->free(be, db);
    be->ops->weight_free(be, W);
}

static void test_simple(int op, int32_t n, int32_t d, int in_place, double tol, const char *name) {
    int64_t rows = op == OP_EMBED ? 1000 : op == OP_GATHER ? 3 * n + 1 : 1;
    int64_t a_rows = op == OP_GATHER ? rows : n;
    float *a = malloc(sizeof(float) * (size_t)a_rows * d), *b = malloc(sizeof(float) * (size_t)n * d);
    float *wt = malloc(sizeof(float) * (size_t)rows * d);
    float *yc = malloc(sizeof(float) * (size_t)n * d), *yg = malloc(sizeof(float) * (size_t)n * d);
    int32_t *idx = malloc(sizeof(int32_t) * n);
    t_fill(a, a_rows * d, -3.0f, 3.0f, 0);
    t_fill(b, (int64_t)n * d, -3.0f, 3.0f, 0);
    t_fill(wt, rows * d, -1.0f, 1.0f, 1);
    for (int32_t i = 0; i < n; i++) idx[i] = (int32_t)(t_uniform() * (double)rows);
    int has_w = op == OP_RMS || op == OP_EMBED;
    int uses_b = op == OP_SWIGLU || op == OP_ADD;
    int uses_a = op != OP_EMBED;
    run_simple(cpu, op, n, d, uses_a ? a : NULL, uses_b ? b : NULL, has_w ? wt : NULL,
               has_w ? (op == OP_RMS ? 1 : rows) : rows, idx, yc, in_place);
    run_simple(gpu, op, n, d, uses_a ? a : NULL, uses_b ? b : NULL, has_w ? wt : NULL,
               has_w ? (op == OP_RMS ? 1 : rows) : rows, idx, yg, in_place);
    double e = t_rel_err(yg, yc, (int64_t)n * d);
    CHECK_MSG(e <= tol, "%s n %d d %d in_place %d: rel err %g (tol %g)", name, n, d, in_place, e, tol);
    free(a); free(b); free(wt); free(yc); free(yg); free(idx);
}

/* ---- rope ---- */
static void test_rope(int32_t n, int32_t heads, int32_t hd, int neox, int with_ff) {
    size_t nb = sizeof(float) * (size_t)n * heads * hd;
    float *x = malloc(nb), *yc = malloc(nb), *yg = malloc(nb), ff[512];
    int32_t *pos = malloc(sizeof(int32_t) * n);
    t_fill(x, (int64_t)n * heads * hd, -2.0f, 2.0f, 0);
    for (int32_t i = 0; i < n; i++) pos[i] = (int32_t)(t_uniform() * 9000);
    for (int32_t i = 0; i < hd / 2; i++) ff[i] = 1.0f + 7.0f * (float)t_uniform();
    backend_t *bes[2] = {cpu, gpu};
    float *ys[2] = {yc, yg};
    for (int b = 0; b < 2; b++) {
        float *dx = t_alloc_upload(bes[b], x, nb);
        CHECK(dx != NULL);
        CHECK_OK(bes[b]->ops->rope(bes[b], dx, pos, n, heads, hd, 500000.0f, 0.5f,
                                   with_ff ? ff : NULL, neox));
        CHECK_OK(bes[b]->ops->download(bes[b], ys[b], dx, nb));
        bes[b]->ops->free(bes[b], dx);
    }
    double e = t_rel_err(yg, yc, (int64_t)n * heads * hd);
    CHECK_MSG(e < 1e-5, "rope n %d heads %d hd %d neox %d ff %d: rel err %g", n, heads, hd, neox,
              with_ff, e);
    free(x); free(yc); free(yg); free(pos);
}

/* ---- KV write + attention ---- */
typedef struct step {
    int32_t n_seqs;
    int32_t ctx_before[8]; /* cached prefix length per sequence */
    int32_t n_new[8];      /* tokens of this step per sequence */
} step_t;

static void test_attention(int32_t kvh, int32_t group, int32_t hd, const step_t *st, int tc) {
    backend_kv_geom_t gc = {.n_layers = 2, .n_blocks = 0, .block_size = 16, .n_kv_heads = kvh,
                            .head_dim = hd, .dtype = BACKEND_DTYPE_F32};
    const int32_t layer = 1, n_heads = kvh * group, row = kvh * hd;
    int32_t max_ctx = 0, n_tok = 0, n_pre = 0;
    for (int s = 0; s < st->n_seqs; s++) {
        int32_t c = st->ctx_before[s] + st->n_new[s];
        if (c > max_ctx) max_ctx = c;
        n_tok += st->n_new[s];
        n_pre += st->ctx_before[s];
    }
    const int32_t max_blocks = (max_ctx + 15) / 16 + 1;
    gc.n_blocks = st->n_seqs * max_blocks + 3;
    backend_kv_geom_t gg = gc;
    gg.dtype = BACKEND_DTYPE_BF16;
    /* block tables: a random permutation of the pool */
    int32_t *perm = malloc(sizeof(int32_t) * gc.n_blocks);
    for (int32_t i = 0; i < gc.n_blocks; i++) perm[i] = i;
    for (int32_t i = gc.n_blocks - 1; i > 0; i--) {
        int32_t j = (int32_t)(t_uniform() * (i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t *bt = malloc(sizeof(int32_t) * st->n_seqs * max_blocks);
    for (int32_t i = 0; i < st->n_seqs * max_blocks; i++) bt[i] = perm[i];
    /* two steps: 0 writes the cached prefixes, 1 is the step under test */
    int32_t n_step[2] = {n_pre, n_tok};
    int32_t *tok_seq[2], *tok_pos[2], first[2][8], cnt[2][8], nctx[2][8];
    float *k[2], *v[2];
    for (int p = 0; p < 2; p++) {
        int32_t nt = n_step[p] ? n_step[p] : 1;
        tok_seq[p] = malloc(sizeof(int32_t) * nt);
        tok_pos[p] = malloc(sizeof(int32_t) * nt);
        k[p] = malloc(sizeof(float) * (size_t)nt * row);
        v[p] = malloc(sizeof(float) * (size_t)nt * row);
        t_fill(k[p], (int64_t)nt * row, -1.0f, 1.0f, 1);
        t_fill(v[p], (int64_t)nt * row, -1.0f, 1.0f, 1);
        int32_t t = 0;
        for (int s = 0; s < st->n_seqs; s++) {
            int32_t from = p == 0 ? 0 : st->ctx_before[s];
            int32_t len = p == 0 ? st->ctx_before[s] : st->n_new[s];
            first[p][s] = t;
            cnt[p][s] = len;
            nctx[p][s] = from + len;
            for (int32_t i = 0; i < len; i++, t++) {
                tok_seq[p][t] = s;
                tok_pos[p][t] = from + i;
            }
        }
    }
    size_t q_elems = (size_t)n_tok * n_heads * hd;
    float *q = malloc(sizeof(float) * q_elems);
    t_fill(q, (int64_t)q_elems, -2.0f, 2.0f, 0);
    size_t pool_elems = (size_t)gc.n_layers * gc.n_blocks * gc.block_size * row;
    float *oc = malloc(sizeof(float) * q_elems), *og = malloc(sizeof(float) * q_elems);
    float *kc = malloc(sizeof(float) * pool_elems), *kg = malloc(sizeof(float) * pool_elems);
    float *vc = malloc(sizeof(float) * pool_elems), *vg = malloc(sizeof(float) * pool_elems);
    uint16_t *raw = malloc(sizeof(uint16_t) * pool_elems);

    CHECK_OK(backend_cuda_set_prefill_attention(gpu, tc));
    backend_t *bes[2] = {cpu, gpu};
    for (int b = 0; b < 2; b++) {
        backend_t *be = bes[b];
        const backend_kv_geom_t *g = b ? &gg : &gc;
        size_t pool_bytes = pool_elems * (b ? 2 : 4);
        void *kp = be->ops->alloc(be, pool_bytes), *vp = be->ops->alloc(be, pool_bytes);
        CHECK(kp && vp);
        CHECK_OK(be->ops->memset_zero(be, kp, pool_bytes));
        CHECK_OK(be->ops->memset_zero(be, vp, pool_bytes));
        for (int p = 0; p < 2; p++) {
            if (!n_step[p]) continue;
            backend_attn_batch_t ab = {.n_tokens = n_step[p], .n_seqs = st->n_seqs,
                                       .tok_seq = tok_seq[p], .tok_pos = tok_pos[p],
                                       .seq_first_tok = first[p], .seq_n_tok = cnt[p],
                                       .seq_n_ctx = nctx[p], .block_tables = bt,
                                       .max_blocks = max_blocks};
            float *dk = t_alloc_upload(be, k[p], sizeof(float) * (size_t)n_step[p] * row);
            float *dv = t_alloc_upload(be, v[p], sizeof(float) * (size_t)n_step[p] * row);
            CHECK_OK(be->ops->kv_write(be, g, kp, vp, layer, &ab, dk, dv));
            if (p == 1) {
                float *dq = t_alloc_upload(be, q, sizeof(float) * q_elems);
                float *dout = be->ops->alloc(be, sizeof(float) * q_elems);
                CHECK_OK(t_poison(be, dout, sizeof(float) * q_elems));
                CHECK_OK(be->ops->attention(be, g, kp, vp, layer, &ab, dq, dout, n_heads));
                CHECK_OK(be->ops->download(be, b ? og : oc, dout, sizeof(float) * q_elems));
                be->ops->free(be, dq);
                be->ops->free(be, dout);
            }
            be->ops->free(be, dk);
            be->ops->free(be, dv);
        }
        if (b == 0) {
            CHECK_OK(be->ops->download(be, kc, kp, pool_bytes));
            CHECK_OK(be->ops->download(be, vc, vp, pool_bytes));
        } else {
            CHECK_OK(be->ops->download(be, raw, kp, pool_bytes));
            for (size_t i = 0; i < pool_elems; i++) kg[i] = bf16_bits_to_f32(raw[i]);
            CHECK_OK(be->ops->download(be, raw, vp, pool_bytes));
            for (size_t i = 0; i < pool_elems; i++) vg[i] = bf16_bits_to_f32(raw[i]);
        }
        be->ops->free(be, kp);
        be->ops->free(be, vp);
    }
    /* K/V were bf16 values already: the pools must match exactly */
    size_t kdiff = 0;
    for (size_t i = 0; i < pool_elems; i++) kdiff += kc[i] != kg[i] || vc[i] != vg[i];
    CHECK_MSG(kdiff == 0, "kv_write kvh %d hd %d: %zu pool elements differ", kvh, hd, kdiff);
    /* SIMT kernels: fp32 math on the same K/V; tensor-core prefill rounds
     * q and the softmax weights to bf16 (2^-9 relative each) */
    double e = t_rel_err(og, oc, (int64_t)q_elems), tol = tc ? 1e-2 : 2e-3;
    CHECK_MSG(e < tol, "attention kvh %d group %d hd %d seqs %d tokens %d tc %d: rel err %g", kvh,
              group, hd, st->n_seqs, n_tok, tc, e);
    for (int p = 0; p < 2; p++) {
        free(tok_seq[p]); free(tok_pos[p]); free(k[p]); free(v[p]);
    }
    free(perm); free(bt); free(q); free(oc); free(og); free(kc); free(kg); free(vc); free(vg);
    free(raw);
}

/* ---- bad input: clear errors, nothing launched ---- */
static void test_bad_input(void) {
    float host[64] = {0};
    backend_weight_t *W = NULL;
    CHECK_OK(gpu->ops->weight_create(gpu, host, 4, 16, &W));
    float *d = gpu->ops->alloc(gpu, sizeof(host));
    int32_t tok[2] = {1, 4}; /* 4 >= rows */
    CHECK(gpu->ops->embed(gpu, W, tok, 2, d) == BATON_ERR_INVALID_ARG);
    CHECK(strstr(baton_last_error(), "token 4") != NULL);
    int32_t pos[1] = {0};
    CHECK(gpu->ops->rope(gpu, d, pos, 1, 1, 7, 10000.0f, 1.0f, NULL, 0) == BATON_ERR_INVALID_ARG);
    backend_kv_geom_t g = {.n_layers = 1, .n_blocks = 2, .block_size = 16, .n_kv_heads = 1,
                           .head_dim = 16, .dtype = BACKEND_DTYPE_BF16};
    int32_t ts[1] = {0}, tp[1] = {3}, f[1] = {0}, c[1] = {1}, nc[1] = {4}, bt[1] = {7};
    backend_attn_batch_t ab = {.n_tokens = 1, .n_seqs = 1, .tok_seq = ts, .tok_pos = tp,
                               .seq_first_tok = f, .seq_n_tok = c, .seq_n_ctx = nc,
                               .block_tables = bt, .max_blocks = 1};
    void *pool = gpu->ops->alloc(gpu, backend_kv_block_bytes(&g) * 2);
    CHECK(gpu->ops->kv_write(gpu, &g, pool, pool, 0, &ab, d, d) == BATON_ERR_INVALID_ARG);
    CHECK(strstr(baton_last_error(), "block") != NULL);
    bt[0] = 1;
    CHECK(gpu->ops->attention(gpu, &g, pool, pool, 0, &ab, d, d, 0) == BATON_ERR_INVALID_ARG);
    g.dtype = BACKEND_DTYPE_F32;
    CHECK(gpu->ops->kv_write(gpu, &g, pool, pool, 0, &ab, d, d) == BATON_ERR_INVALID_ARG);
    CHECK(backend_cuda_graph_replay_begin(gpu, 3) == BATON_ERR_NOT_FOUND);
    CHECK(backend_cuda_is_device_ptr(pool) == 1);
    CHECK(backend_cuda_is_device_ptr(host) == 0);
    void *pinned = backend_cuda_host_alloc(4096);
    CHECK(pinned != NULL && backend_cuda_is_device_ptr(pinned) == 0);
    backend_cuda_host_free(pinned);
    CHECK_OK(gpu->ops->synchronize(gpu));
    gpu->ops->free(gpu, pool);
    gpu->ops->free(gpu, d);
    gpu->ops->weight_free(gpu, W);
}

/* ---- CUDA graph: capture a decode step, replay with new metadata ---- */
static void test_graph(void) {
    const int32_t B = 3, d = 64, vocab = 50, bs = 16, mb = 8;
    backend_kv_geom_t g = {.n_layers = 1, .n_blocks = B * mb, .block_size = bs, .n_kv_heads = 2,
                           .head_dim = 32, .dtype = BACKEND_DTYPE_BF16};
    float *table = malloc(sizeof(float) * vocab * d);
    t_fill(table, (int64_t)vocab * d, -1.0f, 1.0f, 1);
    backend_weight_t *E = NULL;
    CHECK_OK(gpu->ops->weight_create(gpu, table, vocab, d, &E));
    size_t pool_bytes = backend_kv_block_bytes(&g) * g.n_blocks;
    void *kp = gpu->ops->alloc(gpu, pool_bytes), *vp = gpu->ops->alloc(gpu, pool_bytes);
    float *x = gpu->ops->alloc(gpu, sizeof(float) * B * d);
    float *out = gpu->ops->alloc(gpu, sizeof(float) * B * 4 * 32);
    CHECK_OK(gpu->ops->memset_zero(gpu, kp, pool_bytes));
    CHECK_OK(gpu->ops->memset_zero(gpu, vp, pool_bytes));
    int32_t bt[3 * 8];
    for (int i = 0; i < B * mb; i++) bt[i] = (i * 7) % (B * mb);
    int32_t ts[3] = {0, 1, 2}, f[3] = {0, 1, 2}, c[3] = {1, 1, 1};
    float eager[3][2][3 * 4 * 32], graph[3 * 4 * 32];
    /* step s: tokens and positions change, shapes do not */
    for (int mode = 0; mode < 2; mode++) {
        CHECK_OK(gpu->ops->memset_zero(gpu, kp, pool_bytes));
        CHECK_OK(gpu->ops->memset_zero(gpu, vp, pool_bytes));
        for (int s = 0; s < 3; s++) {
            int32_t tok[3] = {(s * 3 + 1) % vocab, (s * 5 + 2) % vocab, (s * 11 + 7) % vocab};
            int32_t tp[3] = {s, 20 + s, 100 + s}, nc[3] = {s + 1, 21 + s, 101 + s};
            backend_attn_batch_t ab = {.n_tokens = B, .n_seqs = B, .tok_seq = ts, .tok_pos = tp,
                                       .seq_first_tok = f, .seq_n_tok = c, .seq_n_ctx = nc,
                                       .block_tables = bt, .max_blocks = mb};
            int graphed = mode == 1 && s > 0;
            if (mode == 1 && s == 0) CHECK_OK(backend_cuda_graph_capture_begin(gpu, B));
            if (graphed) CHECK_OK(backend_cuda_graph_replay_begin(gpu, B));
            CHECK_OK(gpu->ops->embed(gpu, E, tok, B, x));
            CHECK_OK(gpu->ops->kv_write(gpu, &g, kp, vp, 0, &ab, x, x + 0));
            CHECK_OK(gpu->ops->attention(gpu, &g, kp, vp, 0, &ab, x, out, 2));
            if (mode == 1 && s == 0) CHECK_OK(backend_cuda_graph_capture_end(gpu));
            if (graphed) CHECK_OK(backend_cuda_graph_replay_end(gpu));
            CHECK_OK(gpu->ops->download(gpu, mode ? graph : eager[s][0], out, sizeof(float) * B * 64));
            if (mode == 1) {
                double e = t_rel_err(graph, eager[s][0], B * 64);
                /* graph mode splits decode keys by block-table capacity, eager
                 * by the current context: equal up to fp32 summation order */
                CHECK_MSG(e < 1e-5, "graph step %d differs from eager: %g", s, e);
            }
        }
    }
    /* a different op sequence must be refused at replay_end */
    CHECK_OK(backend_cuda_graph_replay_begin(gpu, B));
    int32_t tok[3] = {1, 2, 3};
    CHECK_OK(gpu->ops->embed(gpu, E, tok, B, x));
    CHECK(backend_cuda_graph_replay_end(gpu) == BATON_ERR_INVALID_ARG);
    CHECK_OK(gpu->ops->synchronize(gpu));
    /* the first GEMM grows the activation scratch: stored graphs are dropped */
    CHECK_OK(backend_cuda_graph_replay_begin(gpu, B));
    backend_cuda_graph_abort(gpu);
    float *big_x = gpu->ops->alloc(gpu, sizeof(float) * 4096 * d);
    float *big_y = gpu->ops->alloc(gpu, sizeof(float) * 4096 * vocab);
    CHECK_OK(gpu->ops->memset_zero(gpu, big_x, sizeof(float) * 4096 * d));
    CHECK_OK(gpu->ops->matmul(gpu, E, NULL, big_x, big_y, 4096));
    CHECK(backend_cuda_graph_replay_begin(gpu, B) == BATON_ERR_NOT_FOUND);
    CHECK_OK(gpu->ops->synchronize(gpu));
    gpu->ops->free(gpu, big_x);
    gpu->ops->free(gpu, big_y);
    gpu->ops->free(gpu, kp); gpu->ops->free(gpu, vp); gpu->ops->free(gpu, x); gpu->ops->free(gpu, out);
    gpu->ops->weight_free(gpu, E);
    free(table);
}

int main(void) {
    int fail;
    gpu = cuda_test_backend(&fail);
    if (!gpu) return fail ? 1 : CUDA_TEST_SKIP;
    CHECK_OK(backend_cpu_create(2, &cpu));
    if (!cpu) return 1;

    static const int32_t mm[][3] = {{1, 64, 96}, {7, 129, 257}, {33, 576, 1536}, {100, 1000, 333}};
    for (size_t i = 0; i < sizeof(mm) / sizeof(mm[0]); i++)
        for (int b = 0; b < 2; b++) test_matmul(mm[i][0], mm[i][1], mm[i][2], b);

    static const int32_t sh[][2] = {{1, 64}, {5, 576}, {33, 1000}, {3, 4096}};
    for (size_t i = 0; i < sizeof(sh) / sizeof(sh[0]); i++) {
        test_simple(OP_RMS, sh[i][0], sh[i][1], 0, 1e-5, "rmsnorm");
        test_simple(OP_RMS, sh[i][0], sh[i][1], 1, 1e-5, "rmsnorm");
        test_simple(OP_SWIGLU, sh[i][0], sh[i][1], 0, 1e-5, "swiglu");
        test_simple(OP_SWIGLU, sh[i][0], sh[i][1], 1, 1e-5, "swiglu");
        test_simple(OP_ADD, sh[i][0], sh[i][1], 0, 1e-6, "add");
        test_simple(OP_ADD, sh[i][0], sh[i][1], 1, 1e-6, "add");
        test_simple(OP_EMBED, sh[i][0], sh[i][1], 0, 0.0, "embed");
        test_simple(OP_GATHER, sh[i][0], sh[i][1], 0, 0.0, "gather_rows");
    }
    for (int neox = 0; neox < 2; neox++)
        for (int ff = 0; ff < 2; ff++) {
            test_rope(1, 9, 64, neox, ff);
            test_rope(7, 3, 80, neox, ff);
            test_rope(40, 32, 128, neox, ff);
        }

    step_t prefill = {.n_seqs = 2, .ctx_before = {37, 0}, .n_new = {45, 70}};
    step_t prefill1 = {.n_seqs = 1, .ctx_before = {0}, .n_new = {333}};
    step_t decode = {.n_seqs = 5, .ctx_before = {0, 16, 299, 1000, 512}, .n_new = {1, 1, 1, 1, 1}};
    step_t mixed = {.n_seqs = 3, .ctx_before = {100, 7, 0}, .n_new = {1, 33, 2}};
    static const int32_t geo[][3] = {{3, 3, 64}, {2, 4, 128}, {1, 1, 80}, {2, 12, 64}};
    for (int tc = 0; tc < 2; tc++)
        for (size_t i = 0; i < sizeof(geo) / sizeof(geo[0]); i++) {
            test_attention(geo[i][0], geo[i][1], geo[i][2], &prefill, tc);
            test_attention(geo[i][0], geo[i][1], geo[i][2], &prefill1, tc);
            test_attention(geo[i][0], geo[i][1], geo[i][2], &decode, tc);
            test_attention(geo[i][0], geo[i][1], geo[i][2], &mixed, tc);
        }
    CHECK_OK(backend_cuda_set_prefill_attention(gpu, 0));
    test_bad_input();
    test_graph();

    backend_free(cpu);
    backend_free(gpu);
    return TEST_DONE();
}
