/* bench_cuda: CUDA backend benchmark on a random model with Llama-3-8B
 * shapes (32 layers, hidden 4096, 32 heads, 8 KV heads, head_dim 128, FFN
 * 14336, vocab 128256; bf16 weights filled on the device, bf16 KV with
 * 16-token blocks), run through the backend ops exactly as the forward calls
 * them.
 *
 * Prints, in one run: the cuBLAS bf16 GEMM rate (8192^3, bf16 in, fp32
 * accumulate/out: the backend's GEMM configuration) and the device-to-device
 * copy rate; prefill of one prompt (tokens/s, achieved TFLOP/s and its
 * fraction of the measured GEMM rate); decode step time at each batch size
 * with every sequence at the given context (eager and CUDA-graph replay), and
 * the memory-bandwidth floor (weights + KV read once, at the measured copy
 * rate) as a fraction of the measured step time.
 *
 *   bench_cuda [--layers N] [--prompt N] [--ctx N] [--batches 1,16,64]
 *              [--steps N] [--small]
 * --small uses a 4-layer, hidden-1024 model (a smoke run). Exit 77 when no
 * GPU is present. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_sampling.h"

typedef struct cfg {
    int layers, hidden, heads, kv_heads, head_dim, ffn, vocab;
    int prompt, ctx, steps, n_batches, batches[8];
} cfg_t;

typedef struct layer_w {
    backend_weight_t *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *wg, *wu, *wd;
} layer_w_t;

typedef struct model {
    cfg_t c;
    backend_t *be;
    backend_weight_t *emb, *out_norm, *out;
    layer_w_t *l;
    backend_kv_geom_t geom;
    void *k_pool, *v_pool;
    /* activations for up to max_tok tokens */
    int max_tok;
    float *x, *h, *q, *k, *v, *att, *o, *g, *u, *last, *logits;
} model_t;

#define TRY(expr)                                                                  \
    do {                                                                           \
        baton_status_t _s = (expr);                                                \
        if (_s != BATON_OK) {                                                      \
            fprintf(stderr, "bench_cuda: %s failed: %s\n", #expr, baton_last_error()); \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t seed_ctr = 1;
static backend_weight_t *rnd(backend_t *be, int64_t rows, int64_t cols, float scale) {
    backend_weight_t *w;
    TRY(backend_cuda_weight_random(be, rows, cols, scale, seed_ctr++ * 0x9E3779B97F4A7C15ull, &w));
    return w;
}

static void *dalloc(backend_t *be, size_t bytes) {
    void *p = be->ops->alloc(be, bytes);
    if (!p) {
        fprintf(stderr, "bench_cuda: alloc %zu: %s\n", bytes, baton_last_error());
        exit(1);
    }
    return p;
}

static void model_init(model_t *m, backend_t *be, const cfg_t *c, int max_tok, int n_blocks) {
    memset(m, 0, sizeof(*m));
    m->c = *c;
    m->be = be;
    int H = c->hidden, KV = c->kv_heads * c->head_dim;
    m->emb = rnd(be, c->vocab, H, 1.0f);
    m->out_norm = rnd(be, 1, H, 1.0f);
    m->out = rnd(be, c->vocab, H, 1.0f / sqrtf((float)H));
    m->l = calloc(c->layers, sizeof(layer_w_t));
    for (int i = 0; i < c->layers; i++) {
        layer_w_t *l = &m->l[i];
        float sh = 1.0f / sqrtf((float)H), sf = 1.0f / sqrtf((float)c->ffn);
        l->attn_norm = rnd(be, 1, H, 1.0f);
        l->wq = rnd(be, H, H, sh);
        l->wk = rnd(be, KV, H, sh);
        l->wv = rnd(be, KV, H, sh);
        l->wo = rnd(be, H, H, sh);
        l->ffn_norm = rnd(be, 1, H, 1.0f);
        l->wg = rnd(be, c->ffn, H, sh);
        l->wu = rnd(be, c->ffn, H, sh);
        l->wd = rnd(be, H, c->ffn, sf);
    }
    m->geom = (backend_kv_geom_t){.n_layers = c->layers, .n_blocks = n_blocks, .block_size = 16,
                                  .n_kv_heads = c->kv_heads, .head_dim = c->head_dim,
                                  .dtype = BACKEND_DTYPE_BF16};
    size_t pool = backend_kv_block_bytes(&m->geom) * (size_t)n_blocks * c->layers;
    m->k_pool = dalloc(be, pool);
    m->v_pool = dalloc(be, pool);
    TRY(be->ops->memset_zero(be, m->k_pool, pool));
    TRY(be->ops->memset_zero(be, m->v_pool, pool));
    m->max_tok = max_tok;
    size_t f = sizeof(float);
    m->x = dalloc(be, f * max_tok * H);
    m->h = dalloc(be, f * max_tok * H);
    m->q = dalloc(be, f * max_tok * H);
    m->k = dalloc(be, f * max_tok * KV);
    m->v = dalloc(be, f * max_tok * KV);
    m->att = dalloc(be, f * max_tok * H);
    m->o = dalloc(be, f * max_tok * H);
    m->g = dalloc(be, f * max_tok * c->ffn);
    m->u = dalloc(be, f * max_tok * c->ffn);
    m->last = dalloc(be, f * 64 * H);
    m->logits = dalloc(be, f * 64 * (size_t)c->vocab);
    TRY(be->ops->synchronize(be));
}

/* One forward step over batch b (tokens host ids); logits of each
 * sequence's last token land in m->logits [n_seqs, vocab]. */
static void forward(model_t *m, const int32_t *tokens, const backend_attn_batch_t *b,
                    const int32_t *last_rows) {
    backend_t *be = m->be;
    const backend_ops_t *op = be->ops;
    const cfg_t *c = &m->c;
    int n = b->n_tokens, H = c->hidden;
    TRY(op->embed(be, m->emb, tokens, n, m->x));
    for (int i = 0; i < c->layers; i++) {
        layer_w_t *l = &m->l[i];
        TRY(op->rmsnorm(be, m->x, l->attn_norm, 1e-5f, m->h, n, H));
        TRY(op->matmul(be, l->wq, NULL, m->h, m->q, n));
        TRY(op->matmul(be, l->wk, NULL, m->h, m->k, n));
        TRY(op->matmul(be, l->wv, NULL, m->h, m->v, n));
        TRY(op->rope(be, m->q, b->tok_pos, n, c->heads, c->head_dim, 500000.0f, 1.0f, NULL, 0));
        TRY(op->rope(be, m->k, b->tok_pos, n, c->kv_heads, c->head_dim, 500000.0f, 1.0f, NULL, 0));
        TRY(op->kv_write(be, &m->geom, m->k_pool, m->v_pool, i, b, m->k, m->v));
        TRY(op->attention(be, &m->geom, m->k_pool, m->v_pool, i, b, m->q, m->att, c->heads));
        TRY(op->matmul(be, l->wo, NULL, m->att, m->o, n));
        TRY(op->add(be, m->x, m->o, m->x, (int64_t)n * H));
        TRY(op->rmsnorm(be, m->x, l->ffn_norm, 1e-5f, m->h, n, H));
        TRY(op->matmul(be, l->wg, NULL, m->h, m->g, n));
        TRY(op->matmul(be, l->wu, NULL, m->h, m->u, n));
        TRY(op->swiglu(be, m->g, m->u, m->g, n, c->ffn));
        TRY(op->matmul(be, l->wd, NULL, m->g, m->o, n));
        TRY(op->add(be, m->x, m->o, m->x, (int64_t)n * H));
    }
    TRY(op->gather_rows(be, m->x, last_rows, b->n_seqs, H, m->last));
    TRY(op->rmsnorm(be, m->last, m->out_norm, 1e-5f, m->last, b->n_seqs, H));
    TRY(op->matmul(be, m->out, NULL, m->last, m->logits, b->n_seqs));
}

static double layer_params(const cfg_t *c) {
    double H = c->hidden, KV = (double)c->kv_heads * c->head_dim;
    return H * H * 2 + 2 * KV * H + 3 * H * c->ffn;
}

static void parse(int argc, char **argv, cfg_t *c) {
    *c = (cfg_t){.layers = 32, .hidden = 4096, .heads = 32, .kv_heads = 8, .head_dim = 128,
                 .ffn = 14336, .vocab = 128256, .prompt = 2048, .ctx = 2048, .steps = 10,
                 .n_batches = 3, .batches = {1, 16, 64}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--small")) {
            c->layers = 4; c->hidden = 1024; c->heads = 8; c->kv_heads = 2; c->ffn = 3584;
            c->vocab = 32000;
        } else if (v && !strcmp(a, "--layers")) { c->layers = atoi(v); i++; }
        else if (v && !strcmp(a, "--prompt")) { c->prompt = atoi(v); i++; }
        else if (v && !strcmp(a, "--ctx")) { c->ctx = atoi(v); i++; }
        else if (v && !strcmp(a, "--steps")) { c->steps = atoi(v); i++; }
        else if (v && !strcmp(a, "--batches")) {
            c->n_batches = 0;
            for (char *s = argv[++i]; *s && c->n_batches < 8;) {
                int x = (int)strtol(s, &s, 10);
                if (x < 1 || x > 64) { fprintf(stderr, "bench_cuda: batch %d outside 1..64\n", x); exit(2); }
                c->batches[c->n_batches++] = x;
                if (*s == ',') s++;
                else if (*s) { fprintf(stderr, "bench_cuda: bad --batches\n"); exit(2); }
            }
        } else {
            fprintf(stderr, "usage: bench_cuda [--small] [--layers N] [--prompt N] [--ctx N] "
                            "[--batches 1,16,64] [--steps N]\n");
            exit(2);
        }
    }
    if (c->layers < 1 || c->prompt < 1 || c->ctx < 1 || c->steps < 1) {
        fprintf(stderr, "bench_cuda: sizes must be >= 1\n");
        exit(2);
    }
}

int main(int argc, char **argv) {
    cfg_t c;
    parse(argc, argv, &c);
    if (backend_cuda_device_count() <= 0) {
        fprintf(stderr, "bench_cuda: SKIP: no CUDA device\n");
        return 77;
    }
    backend_t *be;
    TRY(backend_cuda_create(0, &be));
    char desc[256];
    TRY(backend_cuda_describe(be, desc, sizeof(desc)));
    printf("device: %s\n", desc);
    printf("model: %d layers, hidden %d, heads %d/%d kv, head_dim %d, ffn %d, vocab %d, bf16 "
           "weights and KV (block 16)\n", c.layers, c.hidden, c.heads, c.kv_heads, c.head_dim,
           c.ffn, c.vocab);

    double peak, bw;
    TRY(backend_cuda_measure_gemm(be, 8192, 8192, 8192, 20, &peak));
    TRY(backend_cuda_measure_copy(be, (size_t)1 << 30, 20, &bw));
    printf("cublas bf16 GEMM 8192^3 (fp32 accumulate): %.1f TFLOP/s\n", peak);
    printf("device-to-device copy (read + write): %.0f GB/s\n", bw);

    int maxb = 1;
    for (int i = 0; i < c.n_batches; i++) if (c.batches[i] > maxb) maxb = c.batches[i];
    int blocks_per_seq = (c.ctx > c.prompt ? c.ctx : c.prompt) / 16 + 2;
    int n_blocks = maxb * blocks_per_seq;
    int max_tok = c.prompt > maxb ? c.prompt : maxb;
    model_t m;
    double t0 = now_s();
    model_init(&m, be, &c, max_tok, n_blocks);
    printf("init: %.1f s (weights %.2f GB, KV pool %.2f GB)\n", now_s() - t0,
           (layer_params(&c) * c.layers + 2.0 * c.vocab * c.hidden) * 2 / 1e9,
           2.0 * backend_kv_block_bytes(&m.geom) * n_blocks * c.layers / 1e9);

    int32_t *bt = malloc(sizeof(int32_t) * n_blocks);
    for (int i = 0; i < n_blocks; i++) bt[i] = i;

    /* ---- prefill: one sequence of c.prompt tokens ---- */
    {
        int T = c.prompt;
        int32_t *tok = malloc(sizeof(int32_t) * T), *seq = calloc(T, sizeof(int32_t));
        int32_t *pos = malloc(sizeof(int32_t) * T);
        for (int i = 0; i < T; i++) { tok[i] = (i * 7919) % c.vocab; pos[i] = i; }
        int32_t first = 0, cnt = T, nctx = T, last = T - 1, id;
        backend_attn_batch_t b = {.n_tokens = T, .n_seqs = 1, .tok_seq = seq, .tok_pos = pos,
                                  .seq_first_tok = &first, .seq_n_tok = &cnt, .seq_n_ctx = &nctx,
                                  .block_tables = bt, .max_blocks = blocks_per_seq};
        double flops = 2.0 * T * layer_params(&c) * c.layers + 2.0 * c.vocab * c.hidden +
                       4.0 * c.layers * c.heads * c.head_dim * ((double)T * (T + 1) / 2);
        for (int tc = 0; tc < 2; tc++) {
            TRY(backend_cuda_set_prefill_attention(be, tc));
            forward(&m, tok, &b, &last); /* warm-up: sizes scratch, loads kernels */
            TRY(cuda_sample_greedy(be, m.logits, 1, c.vocab, &id));
            const int reps = 3;
            t0 = now_s();
            for (int r = 0; r < reps; r++) {
                forward(&m, tok, &b, &last);
                TRY(cuda_sample_greedy(be, m.logits, 1, c.vocab, &id));
            }
            double dt = (now_s() - t0) / reps;
            printf("prefill %d tokens (%s attention): %.1f ms, %.0f tokens/s, %.1f TFLOP/s = %.2f "
                   "of cuBLAS GEMM rate\n", T, tc ? "tensor-core" : "SIMT", dt * 1e3, T / dt,
                   flops / dt / 1e12, flops / dt / 1e12 / peak);
        }
        TRY(backend_cuda_set_prefill_attention(be, 0));
        free(tok); free(seq); free(pos);
    }

    /* ---- decode: batch B, each sequence at context c.ctx ---- */
    double wbytes = (layer_params(&c) * c.layers + (double)c.vocab * c.hidden) * 2.0;
    for (int bi = 0; bi < c.n_batches; bi++) {
        int B = c.batches[bi];
        int32_t tok[64], seq[64], pos[64], first[64], cnt[64], nctx[64], last[64], ids[64];
        int32_t *bts = malloc(sizeof(int32_t) * B * blocks_per_seq);
        for (int s = 0; s < B; s++) {
            tok[s] = (s * 31 + 5) % c.vocab; seq[s] = s; pos[s] = c.ctx - 1; first[s] = s;
            cnt[s] = 1; nctx[s] = c.ctx; last[s] = s;
            for (int j = 0; j < blocks_per_seq; j++) bts[s * blocks_per_seq + j] = s * blocks_per_seq + j;
        }
        backend_attn_batch_t b = {.n_tokens = B, .n_seqs = B, .tok_seq = seq, .tok_pos = pos,
                                  .seq_first_tok = first, .seq_n_tok = cnt, .seq_n_ctx = nctx,
                                  .block_tables = bts, .max_blocks = blocks_per_seq};
        for (int w = 0; w < 2; w++) {
            forward(&m, tok, &b, last);
            TRY(cuda_sample_greedy(be, m.logits, B, c.vocab, ids));
        }
        t0 = now_s();
        for (int r = 0; r < c.steps; r++) {
            forward(&m, tok, &b, last);
            TRY(cuda_sample_greedy(be, m.logits, B, c.vocab, ids));
        }
        double eager = (now_s() - t0) / c.steps;
        /* CUDA graph: capture one step, then replay */
        TRY(backend_cuda_graph_capture_begin(be, B));
        forward(&m, tok, &b, last);
        TRY(backend_cuda_graph_capture_end(be));
        TRY(cuda_sample_greedy(be, m.logits, B, c.vocab, ids));
        t0 = now_s();
        for (int r = 0; r < c.steps; r++) {
            TRY(backend_cuda_graph_replay_begin(be, B));
            forward(&m, tok, &b, last);
            TRY(backend_cuda_graph_replay_end(be));
            TRY(cuda_sample_greedy(be, m.logits, B, c.vocab, ids));
        }
        double graph = (now_s() - t0) / c.steps;
        double kvbytes = (double)B * c.ctx * c.layers * 2.0 * c.kv_heads * c.head_dim * 2.0;
        double floor_s = (wbytes + kvbytes) / (bw * 1e9);
        double best = graph < eager ? graph : eager;
        printf("decode batch %2d ctx %d: eager %.2f ms, graph %.2f ms; floor %.2f ms "
               "(%.2f GB weights + %.2f GB KV at %.0f GB/s) = %.2f of floor\n",
               B, c.ctx, eager * 1e3, graph * 1e3, floor_s * 1e3, wbytes / 1e9, kvbytes / 1e9, bw,
               floor_s / best);
        free(bts);
    }
    free(bt);
    backend_free(be);
    return 0;
}
