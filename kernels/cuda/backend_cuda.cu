/* The CUDA backend: kernels/backend.h's ops table on one device and one
 * stream, plus the extras of kernels/cuda/backend_cuda.h (CUDA graphs for
 * decode steps, random weights, GEMM/bandwidth measurement, pinned memory).
 *
 * Weights are bf16 on the device (converted from the fp32 host tensor the
 * loader dequantised from GGUF); the KV pool is bf16 in the CPU pool's block
 * layout; activations are fp32 and every GEMM converts its input to a bf16
 * scratch copy (gemm.cu). Host metadata (token ids, positions, block tables)
 * is validated on the host, then staged through a pinned arena
 * (cuda_meta_put). Every op is asynchronous on the backend's stream except
 * upload/download/weight_create, which return when the host buffer may be
 * reused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/common.cuh"

#define META_HALF_INIT ((size_t)4 << 20)
#define CUBLAS_WS_BYTES ((size_t)32 << 20)
#define WEIGHT_STAGE_FLOATS ((int64_t)4 << 20)

enum {
    OP_MATMUL = 1, OP_RMSNORM, OP_ROPE, OP_SWIGLU, OP_ADD, OP_EMBED, OP_GATHER, OP_KV_WRITE,
    OP_ATTENTION, OP_MEMSET
};

/* defined at the end of the file (C++ has no tentative definitions) */
extern const backend_ops_t cuda_backend_ops;

/* ---- context helpers ---------------------------------------------------- */

baton_status_t cuda_ctx_of(backend_t *be, cuda_ctx_t **out) {
    if (!be || be->ops != &cuda_backend_ops)
        return baton_error(BATON_ERR_INVALID_ARG, "not a CUDA backend");
    *out = (cuda_ctx_t *)be->ctx;
    return BATON_OK;
}

void cuda_sig_mix(cuda_ctx_t *c, uint64_t v) {
    if (c->mode == CUDA_MODE_EAGER) return;
    uint64_t h = c->signature ^ (v + 0x9E3779B97F4A7C15ull + (c->signature << 6) + (c->signature >> 2));
    c->signature = h * 0x100000001B3ull;
}

static void sig_ptr(cuda_ctx_t *c, const void *p) { cuda_sig_mix(c, (uint64_t)(uintptr_t)p); }

/* Drops every captured graph: they address the metadata arena and scratch
 * buffers, which are about to be reallocated. */
static void graphs_invalidate(cuda_ctx_t *c) {
    for (int i = 0; i < CUDA_GRAPH_SLOTS; i++) {
        if (c->graphs[i].exec) cudaGraphExecDestroy(c->graphs[i].exec);
        c->graphs[i].exec = NULL;
        c->graphs[i].key = -1;
    }
}

static baton_status_t meta_grow(cuda_ctx_t *c, size_t bytes) {
    BATON_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    graphs_invalidate(c);
    cudaFreeHost(c->h_meta);
    cudaFree(c->d_meta);
    c->h_meta = NULL;
    c->d_meta = NULL;
    c->meta_bytes = 0;
    BATON_CUDA_CHECK(cudaMallocHost((void **)&c->h_meta, bytes));
    BATON_CUDA_CHECK(cudaMalloc((void **)&c->d_meta, bytes));
    c->meta_bytes = bytes;
    c->meta_off = 0;
    c->meta_half = 0;
    c->meta_gen++;
    return BATON_OK;
}

baton_status_t cuda_meta_put(cuda_ctx_t *c, const void *h, size_t bytes, const void **out) {
    size_t need = (bytes + 15) & ~(size_t)15;
    if (c->mode == CUDA_MODE_EAGER && c->graph_pending) {
        BATON_CUDA_CHECK(cudaEventSynchronize(c->graph_done));
        c->graph_pending = 0;
        c->meta_half = 0;
        c->meta_off = 0;
        c->meta_gen++;
    }
    if (h) { /* same host array, same bytes, still staged: reuse */
        for (int i = 0; i < 8; i++) {
            if (c->recent[i].h == h && c->recent[i].bytes == bytes &&
                c->recent[i].gen == c->meta_gen &&
                memcmp(c->h_meta + c->recent[i].off, h, bytes) == 0) {
                cuda_sig_mix(c, 0x5EEDull ^ c->recent[i].off);
                *out = c->d_meta + c->recent[i].off;
                return BATON_OK;
            }
        }
    }
    if (c->mode == CUDA_MODE_EAGER) {
        size_t half = c->meta_bytes / 2;
        if (need > half) {
            size_t nb = c->meta_bytes;
            while (need > nb / 2) nb *= 2;
            baton_status_t st = meta_grow(c, nb);
            if (st != BATON_OK) return st;
            half = nb / 2;
        }
        size_t end = (size_t)(c->meta_half + 1) * half;
        if (c->meta_off + need > end) { /* switch halves */
            BATON_CUDA_CHECK(cudaEventRecord(c->half_done[c->meta_half], c->stream));
            c->meta_half ^= 1;
            BATON_CUDA_CHECK(cudaEventSynchronize(c->half_done[c->meta_half]));
            c->meta_off = (size_t)c->meta_half * half;
            c->meta_gen++;
        }
    } else if (c->meta_off + need > c->meta_bytes) {
        return baton_error(BATON_ERR_NO_SPACE,
                           "cuda graph: step metadata exceeds the %zu-byte arena (run a larger "
                           "eager step first)", c->meta_bytes);
    }
    size_t off = c->meta_off;
    c->meta_off += need;
    cuda_sig_mix(c, (uint64_t)bytes);
    if (h) {
        c->recent[c->recent_next].h = h;
        c->recent[c->recent_next].bytes = bytes;
        c->recent[c->recent_next].off = off;
        c->recent[c->recent_next].gen = c->meta_gen;
        c->recent_next = (c->recent_next + 1) % 8;
        memcpy(c->h_meta + off, h, bytes);
        if (c->mode != CUDA_MODE_REPLAY)
            BATON_CUDA_CHECK(cudaMemcpyAsync(c->d_meta + off, c->h_meta + off, bytes,
                                             cudaMemcpyHostToDevice, c->stream));
    }
    *out = c->d_meta + off;
    return BATON_OK;
}

baton_status_t cuda_scratch_ensure(cuda_ctx_t *c, void **buf, size_t *have, size_t bytes,
                                   const char *what) {
    if (bytes <= *have) return BATON_OK;
    if (c->mode != CUDA_MODE_EAGER)
        return baton_error(BATON_ERR_INVALID_ARG,
                           "cuda graph: %s needs %zu bytes, has %zu (run one eager step of this "
                           "size before capturing)", what, bytes, *have);
    BATON_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    graphs_invalidate(c);
    cudaFree(*buf);
    *buf = NULL;
    *have = 0;
    size_t nb = bytes + bytes / 4;
    BATON_CUDA_CHECK(cudaMalloc(buf, nb));
    *have = nb;
    return BATON_OK;
}

/* ---- memory ops ---------------------------------------------------------- */

static void cuda_destroy(backend_t *be) {
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    if (!c) return;
    cudaSetDevice(c->device);
    if (c->mode == CUDA_MODE_CAPTURE) {
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(c->stream, &g);
        if (g) cudaGraphDestroy(g);
    }
    if (c->stream) cudaStreamSynchronize(c->stream);
    for (int i = 0; i < CUDA_GRAPH_SLOTS; i++)
        if (c->graphs[i].exec) cudaGraphExecDestroy(c->graphs[i].exec);
    if (c->cublas) cublasDestroy(c->cublas);
    cudaFree(c->d_cublas_ws);
    cudaFree(c->d_act_bf16);
    cudaFree(c->d_split_ws);
    cudaFreeHost(c->h_meta);
    cudaFree(c->d_meta);
    for (int i = 0; i < 2; i++)
        if (c->half_done[i]) cudaEventDestroy(c->half_done[i]);
    if (c->graph_done) cudaEventDestroy(c->graph_done);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
    be->ctx = NULL;
}

static baton_status_t require_eager(cuda_ctx_t *c, const char *what) {
    if (c->mode != CUDA_MODE_EAGER)
        return baton_error(BATON_ERR_INVALID_ARG, "cuda: %s is not allowed during graph "
                           "capture/replay", what);
    return BATON_OK;
}

static void *cuda_alloc(backend_t *be, size_t bytes) {
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    if (require_eager(c, "alloc") != BATON_OK) return NULL;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        baton_error(BATON_ERR_NO_MEMORY, "cudaMalloc(%zu) failed: %s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void cuda_free_mem(backend_t *be, void *ptr) {
    if (!ptr) return;
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    cudaStreamSynchronize(c->stream);
    cudaFree(ptr);
}

static baton_status_t cuda_upload(backend_t *be, void *dst, const void *src, size_t bytes) {
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    baton_status_t st = require_eager(c, "upload");
    if (st != BATON_OK) return st;
    if (!bytes) return BATON_OK;
    if (!dst || !src) return baton_error(BATON_ERR_INVALID_ARG, "cuda upload: NULL pointer");
    BATON_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
    BATON_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return BATON_OK;
}

static baton_status_t cuda_download(backend_t *be, void *dst, const void *src, size_t bytes) {
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    baton_status_t st = require_eager(c, "download");
    if (st != BATON_OK) return st;
    if (!bytes) return BATON_OK;
    if (!dst || !src) return baton_error(BATON_ERR_INVALID_ARG, "cuda download: NULL pointer");
    BATON_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    BATON_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return BATON_OK;
}

static baton_status_t cuda_memset_zero(backend_t *be, void *dst, size_t bytes) {
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    if (!bytes) return BATON_OK;
    if (!dst) return baton_error(BATON_ERR_INVALID_ARG, "cuda memset_zero: NULL pointer");
    cuda_sig_mix(c, OP_MEMSET);
    sig_ptr(c, dst);
    cuda_sig_mix(c, bytes);
    if (cuda_should_launch(c)) BATON_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, c->stream));
    return BATON_OK;
}

static baton_status_t cuda_synchronize(backend_t *be) {
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    baton_status_t st = require_eager(c, "synchronize");
    if (st != BATON_OK) return st;
    BATON_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return BATON_OK;
}

/* ---- weights ------------------------------------------------------------- */

static baton_status_t weight_alloc(cuda_ctx_t *c, int64_t rows, int64_t cols, backend_weight_t **out) {
    baton_status_t st = require_eager(c, "weight_create");
    if (st != BATON_OK) return st;
    if (rows <= 0 || cols <= 0)
        return baton_error(BATON_ERR_INVALID_ARG, "cuda weight: bad shape [%lld, %lld]",
                           (long long)rows, (long long)cols);
    backend_weight_t *w = (backend_weight_t *)calloc(1, sizeof(*w));
    if (!w) return baton_error(BATON_ERR_NO_MEMORY, "cuda weight: descriptor");
    cudaError_t e = cudaMalloc((void **)&w->d, (size_t)rows * cols * sizeof(__nv_bfloat16));
    if (e != cudaSuccess) {
        free(w);
        return baton_error(BATON_ERR_NO_MEMORY, "cudaMalloc weight [%lld, %lld] bf16 failed: %s",
                           (long long)rows, (long long)cols, cudaGetErrorString(e));
    }
    w->rows = rows;
    w->cols = cols;
    *out = w;
    return BATON_OK;
}

static void cuda_weight_free(backend_t *be, backend_weight_t *w) {
    if (!w) return;
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    cudaStreamSynchronize(c->stream);
    cudaFree(w->d);
    free(w);
}

static baton_status_t weight_fill_from_host(cuda_ctx_t *c, backend_weight_t *w, const float *host) {
    int64_t n = w->rows * w->cols;
    int64_t chunk = n < WEIGHT_STAGE_FLOATS ? n : WEIGHT_STAGE_FLOATS;
    float *stage = NULL;
    BATON_CUDA_CHECK(cudaMalloc((void **)&stage, (size_t)chunk * sizeof(float)));
    baton_status_t st = BATON_OK;
    for (int64_t off = 0; off < n && st == BATON_OK; off += chunk) {
        int64_t len = n - off < chunk ? n - off : chunk;
        cudaError_t e = cudaMemcpyAsync(stage, host + off, (size_t)len * sizeof(float),
                                        cudaMemcpyHostToDevice, c->stream);
        if (e != cudaSuccess) st = cuda_check_fail(e, "cudaMemcpyAsync(weight)", __FILE__, __LINE__);
        else st = cuda_convert_f32_to_bf16(c, stage, w->d + off, len);
    }
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (st == BATON_OK && e != cudaSuccess)
        st = cuda_check_fail(e, "cudaStreamSynchronize", __FILE__, __LINE__);
    cudaFree(stage);
    return st;
}

static baton_status_t cuda_weight_create(backend_t *be, const float *host, int64_t rows,
                                         int64_t cols, backend_weight_t **out) {
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    if (!host || !out) return baton_error(BATON_ERR_INVALID_ARG, "cuda weight_create: NULL");
    backend_weight_t *w;
    baton_status_t st = weight_alloc(c, rows, cols, &w);
    if (st != BATON_OK) return st;
    st = weight_fill_from_host(c, w, host);
    if (st != BATON_OK) {
        cuda_weight_free(be, w);
        return st;
    }
    *out = w;
    return BATON_OK;
}

/* ---- ops ------------------------------------------------------------------ */

#define NEED(cond, ...) \
    do { if (!(cond)) return baton_error(BATON_ERR_INVALID_ARG, __VA_ARGS__); } while (0)

static baton_status_t cuda_matmul(backend_t *be, const backend_weight_t *w,
                                  const backend_weight_t *bias, const float *x, float *y,
                                  int32_t n) {
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    NEED(w && x && y && n >= 0, "cuda matmul: NULL argument or n %d", n);
    NEED(!bias || (bias->rows * bias->cols == w->rows), "cuda matmul: bias has %lld elements, "
         "weight has %lld rows", bias ? (long long)(bias->rows * bias->cols) : 0LL, (long long)w->rows);
    cuda_sig_mix(c, OP_MATMUL); sig_ptr(c, w); sig_ptr(c, bias); sig_ptr(c, x); sig_ptr(c, y);
    cuda_sig_mix(c, (uint64_t)n);
    if (!cuda_should_launch(c)) return BATON_OK;
    return cuda_gemm(c, w->d, bias ? bias->d : NULL, x, y, n, w->cols, w->rows);
}

static baton_status_t cuda_rmsnorm_op(backend_t *be, const float *x, const backend_weight_t *w,
                                      float eps, float *y, int32_t n, int32_t d) {
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    NEED(x && w && y && n >= 0 && d > 0, "cuda rmsnorm: NULL argument or n %d d %d", n, d);
    NEED(w->rows * w->cols == d, "cuda rmsnorm: weight has %lld elements, d = %d",
         (long long)(w->rows * w->cols), d);
    cuda_sig_mix(c, OP_RMSNORM); sig_ptr(c, x); sig_ptr(c, w); sig_ptr(c, y);
    cuda_sig_mix(c, (uint64_t)n); cuda_sig_mix(c, (uint64_t)d);
    uint32_t eb; memcpy(&eb, &eps, 4); cuda_sig_mix(c, eb);
    if (!cuda_should_launch(c)) return BATON_OK;
    return cuda_rmsnorm(c, x, w->d, eps, y, n, d);
}

static baton_status_t cuda_rope_op(backend_t *be, float *x, const int32_t *pos, int32_t n,
                                   int32_t n_heads, int32_t head_dim, float freq_base,
                                   float freq_scale, const float *freq_factors, int neox) {
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    NEED(x && pos && n >= 0 && n_heads > 0 && head_dim > 0 && head_dim % 2 == 0 &&
         head_dim <= 1024, "cuda rope: bad argument (n %d heads %d head_dim %d)", n, n_heads,
         head_dim);
    NEED(freq_base > 0.0f && freq_scale > 0.0f && isfinite(freq_base) && isfinite(freq_scale),
         "cuda rope: freq_base %g, freq_scale %g must be > 0", (double)freq_base,
         (double)freq_scale);
    const int32_t half = head_dim / 2;
    double theta[512];
    for (int32_t i = 0; i < half; i++) {
        NEED(!freq_factors || freq_factors[i] > 0.0f, "cuda rope: freq_factors[%d] = %g must be "
             "> 0", i, freq_factors ? (double)freq_factors[i] : 0.0);
        theta[i] = (double)freq_scale * pow((double)freq_base, -2.0 * i / (double)head_dim);
        if (freq_factors) theta[i] /= (double)freq_factors[i];
    }
    cuda_sig_mix(c, OP_ROPE); sig_ptr(c, x);
    cuda_sig_mix(c, (uint64_t)n); cuda_sig_mix(c, (uint64_t)n_heads); cuda_sig_mix(c, (uint64_t)head_dim);
    cuda_sig_mix(c, (uint64_t)neox);
    if (n == 0) return BATON_OK;
    const void *d_pos, *d_theta;
    baton_status_t st = cuda_meta_put(c, pos, (size_t)n * sizeof(int32_t), &d_pos);
    if (st == BATON_OK) st = cuda_meta_put(c, theta, (size_t)half * sizeof(double), &d_theta);
    if (st != BATON_OK || !cuda_should_launch(c)) return st;
    return cuda_rope(c, x, (const int32_t *)d_pos, n, n_heads, head_dim, (const double *)d_theta,
                     neox);
}

static baton_status_t cuda_swiglu_op(backend_t *be, const float *gate, const float *up,
                                     float *out, int32_t n, int32_t f) {
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    NEED(gate && up && out && n >= 0 && f >= 0, "cuda swiglu: bad argument");
    cuda_sig_mix(c, OP_SWIGLU); sig_ptr(c, gate); sig_ptr(c, up); sig_ptr(c, out);
    cuda_sig_mix(c, (uint64_t)n); cuda_sig_mix(c, (uint64_t)f);
    if (!cuda_should_launch(c)) return BATON_OK;
    return cuda_swiglu(c, gate, up, out, (int64_t)n * f);
}

static baton_status_t cuda_add_op(backend_t *be, const float *a, const float *b, float *y,
                                  int64_t n) {
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    NEED(a && b && y && n >= 0, "cuda add: bad argument");
    cuda_sig_mix(c, OP_ADD); sig_ptr(c, a); sig_ptr(c, b); sig_ptr(c, y); cuda_sig_mix(c, (uint64_t)n);
    if (!cuda_should_launch(c)) return BATON_OK;
    return cuda_add(c, a, b, y, n);
}

static baton_status_t cuda_embed_op(backend_t *be, const backend_weight_t *table,
                                    const int32_t *tokens, int32_t n, float *out) {
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    NEED(table && tokens && out && n >= 0, "cuda embed: bad argument");
    for (int32_t i = 0; i < n; i++)
        NEED(tokens[i] >= 0 && tokens[i] < table->rows, "cuda embed: token %d at %d outside "
             "0..%lld", tokens[i], i, (long long)table->rows - 1);
    cuda_sig_mix(c, OP_EMBED); sig_ptr(c, table); sig_ptr(c, out); cuda_sig_mix(c, (uint64_t)n);
    if (n == 0) return BATON_OK;
    const void *d_tok;
    baton_status_t st = cuda_meta_put(c, tokens, (size_t)n * sizeof(int32_t), &d_tok);
    if (st != BATON_OK || !cuda_should_launch(c)) return st;
    return cuda_embed(c, table->d, table->cols, (const int32_t *)d_tok, n, out);
}

static baton_status_t cuda_gather_rows_op(backend_t *be, const float *x, const int32_t *rows,
                                          int32_t n, int32_t d, float *y) {
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    NEED(x && rows && y && n >= 0 && d > 0, "cuda gather_rows: bad argument");
    for (int32_t i = 0; i < n; i++)
        NEED(rows[i] >= 0, "cuda gather_rows: row %d at %d is negative", rows[i], i);
    cuda_sig_mix(c, OP_GATHER); sig_ptr(c, x); sig_ptr(c, y);
    cuda_sig_mix(c, (uint64_t)n); cuda_sig_mix(c, (uint64_t)d);
    if (n == 0) return BATON_OK;
    const void *d_rows;
    baton_status_t st = cuda_meta_put(c, rows, (size_t)n * sizeof(int32_t), &d_rows);
    if (st != BATON_OK || !cuda_should_launch(c)) return st;
    return cuda_gather_rows(c, x, (const int32_t *)d_rows, n, d, y);
}

/* Validates geometry and batch metadata against the pool; fills *max_tok
 * (largest seq_n_tok) and *max_ctx (largest tok_pos + 1). */
static baton_status_t check_batch(const backend_kv_geom_t *g, int32_t layer,
                                  const backend_attn_batch_t *b, int32_t *max_tok,
                                  int32_t *max_ctx) {
    NEED(g && b, "cuda attention: NULL geometry or batch");
    NEED(g->dtype == BACKEND_DTYPE_BF16, "cuda KV pool must be bf16 (got dtype %d)", (int)g->dtype);
    NEED(g->n_layers > 0 && g->n_blocks > 0 && g->block_size > 0 && g->n_kv_heads > 0 &&
         g->head_dim > 0 && g->head_dim <= 256,
         "cuda KV geometry: layers %d blocks %d block_size %d kv_heads %d head_dim %d (<= 256)",
         g->n_layers, g->n_blocks, g->block_size, g->n_kv_heads, g->head_dim);
    NEED(layer >= 0 && layer < g->n_layers, "cuda KV: layer %d outside 0..%d", layer, g->n_layers - 1);
    NEED(b->n_tokens >= 0 && b->n_seqs >= 0 && b->max_blocks > 0, "cuda batch: n_tokens %d "
         "n_seqs %d max_blocks %d", b->n_tokens, b->n_seqs, b->max_blocks);
    NEED(b->n_tokens == 0 || (b->tok_seq && b->tok_pos && b->seq_first_tok && b->seq_n_tok &&
                              b->block_tables), "cuda batch: NULL metadata array");
    int32_t mt = 0, mc = 0;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        int32_t f = b->seq_first_tok[s], k = b->seq_n_tok[s];
        NEED(k >= 0 && f >= 0 && (int64_t)f + k <= b->n_tokens,
             "cuda batch: sequence %d tokens [%d, +%d) outside %d", s, f, k, b->n_tokens);
        if (k == 0) continue;
        int32_t last = -1;
        for (int32_t t = f; t < f + k; t++) {
            NEED(b->tok_seq[t] == s, "cuda batch: token %d belongs to %d, not %d", t, b->tok_seq[t], s);
            NEED(b->tok_pos[t] > last, "cuda batch: positions of sequence %d not increasing", s);
            last = b->tok_pos[t];
        }
        int32_t nb = last / g->block_size + 1;
        NEED(nb <= b->max_blocks, "cuda batch: sequence %d position %d needs %d blocks > %d",
             s, last, nb, b->max_blocks);
        for (int32_t i = 0; i < nb; i++) {
            int32_t blk = b->block_tables[(int64_t)s * b->max_blocks + i];
            NEED(blk >= 0 && blk < g->n_blocks, "cuda batch: sequence %d block %d is %d, pool "
                 "has %d", s, i, blk, g->n_blocks);
        }
        if (k > mt) mt = k;
        if (last + 1 > mc) mc = last + 1;
    }
    for (int32_t t = 0; t < b->n_tokens; t++)
        NEED(b->tok_seq[t] >= 0 && b->tok_seq[t] < b->n_seqs, "cuda batch: token %d sequence %d", t, b->tok_seq[t]);
    *max_tok = mt;
    *max_ctx = mc;
    return BATON_OK;
}

static baton_status_t put_meta(cuda_ctx_t *c, const backend_attn_batch_t *b, cuda_attn_meta_t *m) {
    const void *p;
    m->n_tokens = b->n_tokens;
    m->n_seqs = b->n_seqs;
    m->max_blocks = b->max_blocks;
    baton_status_t st = cuda_meta_put(c, b->tok_seq, (size_t)b->n_tokens * 4, &p);
    if (st != BATON_OK) return st;
    m->tok_seq = (const int32_t *)p;
    st = cuda_meta_put(c, b->tok_pos, (size_t)b->n_tokens * 4, &p);
    if (st != BATON_OK) return st;
    m->tok_pos = (const int32_t *)p;
    m->seq_n_ctx = NULL;
    st = cuda_meta_put(c, b->block_tables, (size_t)b->n_seqs * b->max_blocks * 4, &p);
    if (st != BATON_OK) return st;
    m->block_tables = (const int32_t *)p;
    return BATON_OK;
}

static baton_status_t cuda_kv_write_op(backend_t *be, const backend_kv_geom_t *g, void *k_pool,
                                       void *v_pool, int32_t layer, const backend_attn_batch_t *b,
                                       const float *k, const float *v) {
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    int32_t mt, mc;
    baton_status_t st = check_batch(g, layer, b, &mt, &mc);
    if (st != BATON_OK) return st;
    NEED(k_pool && v_pool && (b->n_tokens == 0 || (k && v)), "cuda kv_write: NULL pointer");
    cuda_sig_mix(c, OP_KV_WRITE); sig_ptr(c, k_pool); sig_ptr(c, v_pool); sig_ptr(c, k); sig_ptr(c, v);
    cuda_sig_mix(c, (uint64_t)layer); cuda_sig_mix(c, (uint64_t)b->n_tokens);
    cuda_sig_mix(c, (uint64_t)b->n_seqs); cuda_sig_mix(c, (uint64_t)b->max_blocks);
    if (b->n_tokens == 0) return BATON_OK;
    cuda_attn_meta_t m;
    st = put_meta(c, b, &m);
    if (st != BATON_OK || !cuda_should_launch(c)) return st;
    return cuda_kv_write(c, g, (__nv_bfloat16 *)k_pool, (__nv_bfloat16 *)v_pool, layer, &m, k, v);
}

/* Splits of decode attention over `ctx` keys: about 2 CTAs per SM, at
 * least 128 keys per split, at most 64 splits. *chunk = keys per split. */
static int32_t decode_splits(const cuda_ctx_t *c, int32_t n_tokens, int32_t n_kv_heads,
                             int32_t n_heads, int32_t ctx, int32_t *chunk) {
    int32_t group = n_heads / n_kv_heads;
    int64_t base = (int64_t)n_tokens * n_kv_heads * ((group + 7) / 8);
    int64_t want = (2 * (int64_t)c->prop.multiProcessorCount + base - 1) / base;
    int64_t most = (ctx + 127) / 128;
    int32_t splits = (int32_t)(want < most ? want : most);
    if (splits > 64) splits = 64;
    if (splits < 1) splits = 1;
    *chunk = (ctx + splits - 1) / splits;
    return splits;
}

static baton_status_t cuda_attention_op(backend_t *be, const backend_kv_geom_t *g,
                                        const void *k_pool, const void *v_pool, int32_t layer,
                                        const backend_attn_batch_t *b, const float *q, float *out,
                                        int32_t n_heads) {
    cuda_ctx_t *c = (cuda_ctx_t *)be->ctx;
    int32_t mt, mc;
    baton_status_t st = check_batch(g, layer, b, &mt, &mc);
    if (st != BATON_OK) return st;
    NEED(k_pool && v_pool && (b->n_tokens == 0 || (q && out)), "cuda attention: NULL pointer");
    NEED(n_heads > 0 && n_heads % g->n_kv_heads == 0, "cuda attention: %d heads not a multiple "
         "of %d KV heads", n_heads, g->n_kv_heads);
    for (int32_t t = 0; t < b->n_tokens; t++) {
        int32_t s = b->tok_seq[t];
        NEED(t >= b->seq_first_tok[s] && t < b->seq_first_tok[s] + b->seq_n_tok[s],
             "cuda attention: token %d outside its sequence %d's range", t, s);
    }
    const bool decode = mt <= 1;
    cuda_sig_mix(c, OP_ATTENTION); sig_ptr(c, k_pool); sig_ptr(c, v_pool); sig_ptr(c, q); sig_ptr(c, out);
    cuda_sig_mix(c, (uint64_t)layer); cuda_sig_mix(c, (uint64_t)n_heads);
    cuda_sig_mix(c, (uint64_t)b->n_tokens); cuda_sig_mix(c, (uint64_t)b->n_seqs);
    cuda_sig_mix(c, (uint64_t)b->max_blocks); cuda_sig_mix(c, decode);
    if (b->n_tokens == 0) return BATON_OK;
    cuda_attn_meta_t m;
    st = put_meta(c, b, &m);
    if (st != BATON_OK) return st;
    if (decode) {
        /* Graph mode splits by the block-table capacity (fixed per graph);
         * eager mode by the current context, but sizes the workspace for
         * the capacity too so that a later capture does not need to grow it. */
        const int32_t cap = b->max_blocks * g->block_size;
        int32_t chunk, splits = decode_splits(c, b->n_tokens, g->n_kv_heads, n_heads,
                                              c->mode == CUDA_MODE_EAGER ? mc : cap, &chunk);
        if (c->mode == CUDA_MODE_EAGER) {
            int32_t cap_chunk, cap_splits = decode_splits(c, b->n_tokens, g->n_kv_heads, n_heads, cap,
                                                          &cap_chunk);
            int32_t most = cap_splits > splits ? cap_splits : splits;
            if (most > 1) {
                size_t need = (size_t)b->n_tokens * n_heads * most * (g->head_dim + 2) * sizeof(float);
                st = cuda_scratch_ensure(c, (void **)&c->d_split_ws, &c->split_ws_bytes, need,
                                         "decode attention split workspace");
                if (st != BATON_OK) return st;
            }
        }
        cuda_sig_mix(c, (uint64_t)splits); cuda_sig_mix(c, (uint64_t)chunk);
        if (!cuda_should_launch(c)) return BATON_OK;
        return cuda_attention_decode(c, g, (const __nv_bfloat16 *)k_pool,
                                     (const __nv_bfloat16 *)v_pool, layer, &m, q, out, n_heads,
                                     splits, chunk);
    }
    const int tc = c->prefill_tc && cuda_prefill_tc_supported(c, g->head_dim);
    const int32_t tq = tc ? CUDA_PREFILL_TC_TILE_Q : CUDA_PREFILL_TILE_Q;
    cuda_sig_mix(c, (uint64_t)tq);
    int32_t n_tiles = 0;
    for (int32_t s = 0; s < b->n_seqs; s++)
        n_tiles += (b->seq_n_tok[s] + tq - 1) / tq;
    int32_t *tiles = (int32_t *)malloc((size_t)n_tiles * 3 * sizeof(int32_t) + 1);
    if (!tiles) return baton_error(BATON_ERR_NO_MEMORY, "cuda attention: %d tiles", n_tiles);
    int32_t i = 0;
    for (int32_t s = 0; s < b->n_seqs; s++)
        for (int32_t f = 0; f < b->seq_n_tok[s]; f += tq) {
            int32_t rest = b->seq_n_tok[s] - f;
            tiles[3 * i] = b->seq_first_tok[s] + f;
            tiles[3 * i + 1] = rest < tq ? rest : tq;
            tiles[3 * i + 2] = s;
            i++;
        }
    const void *d_tiles;
    cuda_sig_mix(c, (uint64_t)n_tiles);
    st = cuda_meta_put(c, tiles, (size_t)n_tiles * 3 * sizeof(int32_t), &d_tiles);
    free(tiles);
    if (st != BATON_OK || !cuda_should_launch(c)) return st;
    if (tc)
        return cuda_attention_prefill_tc(c, g, (const __nv_bfloat16 *)k_pool,
                                         (const __nv_bfloat16 *)v_pool, layer, &m,
                                         (const int32_t *)d_tiles, n_tiles, q, out, n_heads);
    return cuda_attention_prefill(c, g, (const __nv_bfloat16 *)k_pool,
                                  (const __nv_bfloat16 *)v_pool, layer, &m,
                                  (const int32_t *)d_tiles, n_tiles, q, out, n_heads);
}

const backend_ops_t cuda_backend_ops = {
    /* .name = */ "cuda",
    /* .destroy = */ cuda_destroy,
    /* .alloc = */ cuda_alloc,
    /* .free = */ cuda_free_mem,
    /* .upload = */ cuda_upload,
    /* .download = */ cuda_download,
    /* .memset_zero = */ cuda_memset_zero,
    /* .synchronize = */ cuda_synchronize,
    /* .weight_create = */ cuda_weight_create,
    /* .weight_free = */ cuda_weight_free,
    /* .matmul = */ cuda_matmul,
    /* .rmsnorm = */ cuda_rmsnorm_op,
    /* .rope = */ cuda_rope_op,
    /* .swiglu = */ cuda_swiglu_op,
    /* .add = */ cuda_add_op,
    /* .embed = */ cuda_embed_op,
    /* .gather_rows = */ cuda_gather_rows_op,
    /* .kv_write = */ cuda_kv_write_op,
    /* .attention = */ cuda_attention_op,
};

/* ---- construction ------------------------------------------------------- */

static baton_status_t ctx_init(cuda_ctx_t *c, int device) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0)
        return baton_error(BATON_ERR_UNSUPPORTED, "no CUDA device (%s)",
                           e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    if (device < 0 || device >= count)
        return baton_error(BATON_ERR_INVALID_ARG, "CUDA device %d outside 0..%d", device, count - 1);
    c->device = device;
    BATON_CUDA_CHECK(cudaSetDevice(device));
    BATON_CUDA_CHECK(cudaGetDeviceProperties(&c->prop, device));
    if (c->prop.major < 8)
        return baton_error(BATON_ERR_UNSUPPORTED, "CUDA device %d (%s) is sm_%d%d; baton needs "
                           "sm_80 or newer (bf16)", device, c->prop.name, c->prop.major, c->prop.minor);
    BATON_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    BATON_CUDA_CHECK(cublasCreate(&c->cublas));
    BATON_CUDA_CHECK(cublasSetStream(c->cublas, c->stream));
    BATON_CUDA_CHECK(cudaMalloc(&c->d_cublas_ws, CUBLAS_WS_BYTES));
    c->cublas_ws_bytes = CUBLAS_WS_BYTES;
    BATON_CUDA_CHECK(cublasSetWorkspace(c->cublas, c->d_cublas_ws, c->cublas_ws_bytes));
    for (int i = 0; i < 2; i++)
        BATON_CUDA_CHECK(cudaEventCreateWithFlags(&c->half_done[i], cudaEventDisableTiming));
    BATON_CUDA_CHECK(cudaEventCreateWithFlags(&c->graph_done, cudaEventDisableTiming));
    baton_status_t st = meta_grow(c, 2 * META_HALF_INIT);
    if (st != BATON_OK) return st;
    for (int i = 0; i < CUDA_GRAPH_SLOTS; i++) c->graphs[i].key = -1;
    const char *pk = getenv("BATON_CUDA_PREFILL_ATTN");
    c->prefill_tc = pk && strcmp(pk, "tc") == 0;
    return BATON_OK;
}

extern "C" baton_status_t backend_cuda_create(int device, backend_t **out) {
    if (!out) return baton_error(BATON_ERR_INVALID_ARG, "backend_cuda_create: out is NULL");
    backend_t *be = (backend_t *)calloc(1, sizeof(*be));
    cuda_ctx_t *c = (cuda_ctx_t *)calloc(1, sizeof(*c));
    if (!be || !c) {
        free(be);
        free(c);
        return baton_error(BATON_ERR_NO_MEMORY, "backend_cuda_create");
    }
    be->ops = &cuda_backend_ops;
    be->ctx = c;
    be->weight_dtype = BACKEND_DTYPE_BF16;
    be->kv_dtype = BACKEND_DTYPE_BF16;
    baton_status_t st = ctx_init(c, device);
    if (st != BATON_OK) {
        char keep[512];
        snprintf(keep, sizeof(keep), "%s", baton_last_error());
        cuda_destroy(be);
        free(be);
        return baton_error(st, "%s", keep);
    }
    *out = be;
    return BATON_OK;
}

/* ---- extras (backend_cuda.h) --------------------------------------------- */

extern "C" int backend_cuda_built(void) { return 1; }

extern "C" int backend_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    return n;
}

extern "C" baton_status_t backend_cuda_graph_capture_begin(backend_t *be, int32_t batch_size) {
    cuda_ctx_t *c;
    baton_status_t st = cuda_ctx_of(be, &c);
    if (st != BATON_OK) return st;
    NEED(batch_size >= 1, "cuda graph: batch size %d", batch_size);
    NEED(c->mode == CUDA_MODE_EAGER, "cuda graph: a capture or replay is already in progress");
    BATON_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    BATON_CUDA_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    c->mode = CUDA_MODE_CAPTURE;
    c->graph_key = batch_size;
    c->signature = 0;
    c->meta_off = 0;
    c->meta_gen++;
    return BATON_OK;
}

static cuda_graph_slot_t *graph_find(cuda_ctx_t *c, int32_t key) {
    for (int i = 0; i < CUDA_GRAPH_SLOTS; i++)
        if (c->graphs[i].key == key) return &c->graphs[i];
    return NULL;
}

static baton_status_t graph_launch(cuda_ctx_t *c, cudaGraphExec_t exec) {
    BATON_CUDA_CHECK(cudaGraphLaunch(exec, c->stream));
    BATON_CUDA_CHECK(cudaEventRecord(c->graph_done, c->stream));
    c->graph_pending = 1;
    return BATON_OK;
}

extern "C" baton_status_t backend_cuda_graph_capture_end(backend_t *be) {
    cuda_ctx_t *c;
    baton_status_t st = cuda_ctx_of(be, &c);
    if (st != BATON_OK) return st;
    NEED(c->mode == CUDA_MODE_CAPTURE, "cuda graph: no capture in progress");
    cudaGraph_t graph = NULL;
    c->mode = CUDA_MODE_EAGER;
    c->graph_pending = 1; /* h_meta holds the captured step: keep eager ops off it */
    BATON_CUDA_CHECK(cudaStreamEndCapture(c->stream, &graph));
    cudaGraphExec_t exec = NULL;
    cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) return cuda_check_fail(e, "cudaGraphInstantiate", __FILE__, __LINE__);
    cuda_graph_slot_t *slot = graph_find(c, c->graph_key);
    if (!slot) slot = graph_find(c, -1);
    if (!slot) { /* evict the first slot (oldest insertion) */
        cudaGraphExecDestroy(c->graphs[0].exec);
        memmove(&c->graphs[0], &c->graphs[1], sizeof(c->graphs[0]) * (CUDA_GRAPH_SLOTS - 1));
        slot = &c->graphs[CUDA_GRAPH_SLOTS - 1];
        slot->exec = NULL;
    }
    if (slot->exec) cudaGraphExecDestroy(slot->exec);
    slot->key = c->graph_key;
    slot->exec = exec;
    slot->signature = c->signature;
    slot->meta_bytes = c->meta_off;
    return graph_launch(c, exec);
}

extern "C" baton_status_t backend_cuda_graph_replay_begin(backend_t *be, int32_t batch_size) {
    cuda_ctx_t *c;
    baton_status_t st = cuda_ctx_of(be, &c);
    if (st != BATON_OK) return st;
    NEED(c->mode == CUDA_MODE_EAGER, "cuda graph: a capture or replay is already in progress");
    if (!graph_find(c, batch_size))
        return baton_error(BATON_ERR_NOT_FOUND, "cuda graph: none captured for batch size %d",
                           batch_size);
    BATON_CUDA_CHECK(cudaStreamSynchronize(c->stream)); /* h_meta free to rewrite */
    c->graph_pending = 0;
    c->mode = CUDA_MODE_REPLAY;
    c->graph_key = batch_size;
    c->signature = 0;
    c->meta_off = 0;
    c->meta_gen++;
    return BATON_OK;
}

extern "C" baton_status_t backend_cuda_graph_replay_end(backend_t *be) {
    cuda_ctx_t *c;
    baton_status_t st = cuda_ctx_of(be, &c);
    if (st != BATON_OK) return st;
    NEED(c->mode == CUDA_MODE_REPLAY, "cuda graph: no replay in progress");
    c->mode = CUDA_MODE_EAGER;
    c->graph_pending = 1;
    cuda_graph_slot_t *slot = graph_find(c, c->graph_key);
    if (!slot) return baton_error(BATON_ERR_NOT_FOUND, "cuda graph: batch size %d", c->graph_key);
    if (slot->signature != c->signature || slot->meta_bytes != c->meta_off)
        return baton_error(BATON_ERR_INVALID_ARG, "cuda graph: replayed step for batch size %d "
                           "differs from the captured one (ops, shapes or buffers)", c->graph_key);
    return graph_launch(c, slot->exec);
}

extern "C" void backend_cuda_graph_abort(backend_t *be) {
    cuda_ctx_t *c;
    if (cuda_ctx_of(be, &c) != BATON_OK) return;
    if (c->mode == CUDA_MODE_CAPTURE) {
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(c->stream, &g);
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
    }
    c->mode = CUDA_MODE_EAGER;
    c->graph_pending = 1;
    cudaEventRecord(c->graph_done, c->stream);
}

extern "C" baton_status_t backend_cuda_set_prefill_attention(backend_t *be, int tensor_cores) {
    cuda_ctx_t *c;
    baton_status_t st = cuda_ctx_of(be, &c);
    if (st != BATON_OK) return st;
    NEED(c->mode == CUDA_MODE_EAGER, "cuda: prefill kernel choice during graph capture/replay");
    c->prefill_tc = tensor_cores != 0;
    return BATON_OK;
}

extern "C" baton_status_t backend_cuda_weight_random(backend_t *be, int64_t rows, int64_t cols,
                                                     float scale, uint64_t seed,
                                                     backend_weight_t **out) {
    cuda_ctx_t *c;
    baton_status_t st = cuda_ctx_of(be, &c);
    if (st != BATON_OK) return st;
    NEED(out, "backend_cuda_weight_random: out is NULL");
    backend_weight_t *w;
    st = weight_alloc(c, rows, cols, &w);
    if (st != BATON_OK) return st;
    st = cuda_fill_random_bf16(c, w->d, rows * cols, scale, seed);
    if (st != BATON_OK) {
        cuda_weight_free(be, w);
        return st;
    }
    *out = w;
    return BATON_OK;
}

extern "C" baton_status_t backend_cuda_weight_download(backend_t *be, const backend_weight_t *w,
                                                       float *host) {
    cuda_ctx_t *c;
    baton_status_t st = cuda_ctx_of(be, &c);
    if (st != BATON_OK) return st;
    NEED(w && host, "backend_cuda_weight_download: NULL");
    st = require_eager(c, "weight_download");
    if (st != BATON_OK) return st;
    size_t n = (size_t)(w->rows * w->cols);
    float *d = NULL;
    BATON_CUDA_CHECK(cudaMalloc((void **)&d, n * sizeof(float)));
    st = cuda_convert_bf16_to_f32(c, w->d, d, (int64_t)n);
    cudaError_t e = cudaSuccess;
    if (st == BATON_OK) e = cudaMemcpyAsync(host, d, n * sizeof(float), cudaMemcpyDeviceToHost, c->stream);
    if (st == BATON_OK && e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    cudaFree(d);
    if (st == BATON_OK && e != cudaSuccess) st = cuda_check_fail(e, "weight download", __FILE__, __LINE__);
    return st;
}

extern "C" baton_status_t backend_cuda_measure_gemm(backend_t *be, int32_t m, int32_t n,
                                                    int32_t k, int32_t iters, double *tflops) {
    cuda_ctx_t *c;
    baton_status_t st = cuda_ctx_of(be, &c);
    if (st != BATON_OK) return st;
    NEED(m > 0 && n > 0 && k > 0 && iters > 0 && tflops, "measure_gemm: bad argument");
    __nv_bfloat16 *a = NULL, *b = NULL;
    float *y = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = 0.0f;
    const float alpha = 1.0f, beta = 0.0f;
    st = BATON_OK;
#define TRY(call) do { auto _r = (call); if (!cuda_result_ok(_r)) { st = cuda_check_fail(_r, #call, __FILE__, __LINE__); goto done; } } while (0)
    TRY(cudaMalloc((void **)&a, (size_t)m * k * 2));
    TRY(cudaMalloc((void **)&b, (size_t)k * n * 2));
    TRY(cudaMalloc((void **)&y, (size_t)m * n * 4));
    if ((st = cuda_fill_random_bf16(c, a, (int64_t)m * k, 1.0f, 1)) != BATON_OK) goto done;
    if ((st = cuda_fill_random_bf16(c, b, (int64_t)k * n, 1.0f, 2)) != BATON_OK) goto done;
    TRY(cudaEventCreate(&e0));
    TRY(cudaEventCreate(&e1));
    for (int i = 0; i <= iters; i++) {
        if (i == 1) TRY(cudaEventRecord(e0, c->stream));
        TRY(cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, a, CUDA_R_16BF, k,
                         b, CUDA_R_16BF, k, &beta, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT));
    }
    TRY(cudaEventRecord(e1, c->stream));
    TRY(cudaEventSynchronize(e1));
    TRY(cudaEventElapsedTime(&ms, e0, e1));
    *tflops = 2.0 * m * n * (double)k * iters / (ms * 1e-3) / 1e12;
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaStreamSynchronize(c->stream);
    cudaFree(a);
    cudaFree(b);
    cudaFree(y);
    return st;
}

extern "C" baton_status_t backend_cuda_measure_copy(backend_t *be, size_t bytes, int32_t iters,
                                                    double *gb_per_s) {
    cuda_ctx_t *c;
    baton_status_t st = cuda_ctx_of(be, &c);
    if (st != BATON_OK) return st;
    NEED(bytes > 0 && iters > 0 && gb_per_s, "measure_copy: bad argument");
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = 0.0f;
    st = BATON_OK;
    TRY(cudaMalloc(&a, bytes));
    TRY(cudaMalloc(&b, bytes));
    TRY(cudaMemsetAsync(a, 1, bytes, c->stream));
    TRY(cudaEventCreate(&e0));
    TRY(cudaEventCreate(&e1));
    for (int i = 0; i <= iters; i++) {
        if (i == 1) TRY(cudaEventRecord(e0, c->stream));
        TRY(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, c->stream));
    }
    TRY(cudaEventRecord(e1, c->stream));
    TRY(cudaEventSynchronize(e1));
    TRY(cudaEventElapsedTime(&ms, e0, e1));
    *gb_per_s = 2.0 * (double)bytes * iters / (ms * 1e-3) / 1e9;
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaStreamSynchronize(c->stream);
    cudaFree(a);
    cudaFree(b);
    return st;
#undef TRY
}

extern "C" baton_status_t backend_cuda_describe(backend_t *be, char *buf, size_t len) {
    cuda_ctx_t *c;
    baton_status_t st = cuda_ctx_of(be, &c);
    if (st != BATON_OK) return st;
    NEED(buf && len > 0, "backend_cuda_describe: no buffer");
    snprintf(buf, len, "%s, sm_%d%d, %d SMs, %zu MiB", c->prop.name, c->prop.major, c->prop.minor,
             c->prop.multiProcessorCount, c->prop.totalGlobalMem >> 20);
    return BATON_OK;
}

extern "C" int backend_cuda_is_device_ptr(const void *ptr) {
    if (!ptr) return 0;
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

extern "C" void *backend_cuda_host_alloc(size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        baton_error(BATON_ERR_NO_MEMORY, "cudaMallocHost(%zu) failed: %s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

extern "C" void backend_cuda_host_free(void *ptr) {
    if (ptr) cudaFreeHost(ptr);
}
