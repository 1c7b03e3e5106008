/* The one compute interface the model forward is written against.
 *
 * A backend is a table of function pointers (ggml-backend style) plus an
 * opaque context. The forward (common/model.c) never knows which backend it
 * runs on; kernels never know the model or the wire (DESIGN.md, layout).
 *
 * Memory. Every tensor argument is a pointer into backend memory obtained
 * from ->alloc (host RAM on the CPU backend, device memory on CUDA). Small
 * metadata arrays (token ids, positions, block tables) are HOST pointers;
 * a backend that needs them on the device copies them itself.
 *
 * Dtypes. Activations are fp32 everywhere. Weights are stored in the
 * backend's weight dtype (CPU: fp32, CUDA: bf16) behind backend_weight_t.
 * The KV pool holds `kv_dtype` elements (CPU: fp32, CUDA: bf16).
 *
 * Layouts. Activations are row-major [n_tokens, width]. A weight matrix is
 * [out_dim, in_dim] row-major (GGUF/ggml order: ne[0] = in_dim fastest), so
 * a projection computes y[t, o] = sum_i x[t, i] * W[o, i].
 * KV pool of one layer: [n_blocks, block_size, n_kv_heads, head_dim]; one
 * block of one layer is one contiguous range of
 * block_size * n_kv_heads * head_dim elements (it is what UCX sends).
 *
 * Errors. Ops return BATON_OK or a negative status with a detail
 * (baton_last_error()); a CUDA failure reports call, file and line. Ops may
 * run asynchronously; ->synchronize waits for all of them. */
#ifndef BATON_KERNELS_BACKEND_H
#define BATON_KERNELS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef enum backend_dtype {
    BACKEND_DTYPE_F32 = 0,
    BACKEND_DTYPE_BF16 = 1,
    BACKEND_DTYPE_F16 = 2,
} backend_dtype_t;

/* Bytes per element of a dtype. */
size_t backend_dtype_size(backend_dtype_t dtype);
const char *backend_dtype_name(backend_dtype_t dtype);

typedef struct backend backend_t;
typedef struct backend_weight backend_weight_t; /* opaque, backend-owned */

/* One forward step's attention metadata (all HOST memory, owned by caller,
 * valid for the duration of the call).
 *
 * A step holds n_tokens tokens from n_seqs sequences, each sequence's tokens
 * contiguous and in position order (a prefill chunk, or one decode token).
 * Token t belongs to sequence tok_seq[t] at absolute position tok_pos[t];
 * its K/V is written to slot tok_pos[t] of that sequence's block table, and
 * its query attends causally to positions 0..tok_pos[t] of the same
 * sequence (cached prefix + this step's earlier tokens + itself). */
typedef struct backend_attn_batch {
    int32_t n_tokens;
    int32_t n_seqs;
    const int32_t *tok_seq;      /* [n_tokens] sequence index in 0..n_seqs-1 */
    const int32_t *tok_pos;      /* [n_tokens] absolute position */
    const int32_t *seq_first_tok;/* [n_seqs] index of the sequence's first token in this step */
    const int32_t *seq_n_tok;    /* [n_seqs] tokens of this sequence in this step */
    const int32_t *seq_n_ctx;    /* [n_seqs] KV length after this step = last tok_pos + 1 */
    const int32_t *block_tables; /* [n_seqs, max_blocks] physical block ids, row-major */
    int32_t max_blocks;          /* row stride of block_tables */
} backend_attn_batch_t;

/* Geometry of the paged KV pool (same on every layer). */
typedef struct backend_kv_geom {
    int32_t n_layers;
    int32_t n_blocks;    /* blocks per layer pool */
    int32_t block_size;  /* tokens per block */
    int32_t n_kv_heads;
    int32_t head_dim;
    backend_dtype_t dtype;
} backend_kv_geom_t;

typedef struct backend_ops {
    const char *name; /* "cpu", "cuda" */
    /* Frees the backend's context (called by backend_free). */
    void (*destroy)(backend_t *be);

    /* --- memory --- */
    /* Backend memory for activations or KV; NULL on failure (detail set). */
    void *(*alloc)(backend_t *be, size_t bytes);
    void (*free)(backend_t *be, void *ptr); /* NULL-safe */
    /* Copies between host and backend memory (bytes). */
    baton_status_t (*upload)(backend_t *be, void *dst, const void *src_host, size_t bytes);
    baton_status_t (*download)(backend_t *be, void *dst_host, const void *src, size_t bytes);
    baton_status_t (*memset_zero)(backend_t *be, void *dst, size_t bytes);
    baton_status_t (*synchronize)(backend_t *be);

    /* Converts a host fp32 tensor [rows, cols] (row-major) into a backend
     * weight (the backend's weight dtype). The caller keeps `host`. A vector
     * (norm weight, bias) is rows = 1. */
    baton_status_t (*weight_create)(backend_t *be, const float *host, int64_t rows,
                                    int64_t cols, backend_weight_t **out);
    void (*weight_free)(backend_t *be, backend_weight_t *w); /* NULL-safe */

    /* --- ops --- */
    /* y[n, out] = x[n, in] * W^T, W [out, in]. If `bias` is not NULL (a
     * [1, out] weight) it is added. y must not alias x.
     * Batch invariance (CPU): for n <= 64 (decode-sized steps) each row
     * y[t, :] is bit-identical whatever n, the other rows and the thread
     * count are (fixed reduction order along `in`); larger n goes to
     * OpenBLAS sgemm and carries no such guarantee. */
    baton_status_t (*matmul)(backend_t *be, const backend_weight_t *w,
                             const backend_weight_t *bias, const float *x, float *y,
                             int32_t n);
    /* y[n, d] = x / sqrt(mean(x^2) + eps) * w ; w is a [1, d] weight. y may alias x.
     * (Zhang & Sennrich 2019, RMSNorm.) */
    baton_status_t (*rmsnorm)(backend_t *be, const float *x, const backend_weight_t *w,
                              float eps, float *y, int32_t n, int32_t d);
    /* In-place rotary embedding on x[n, n_heads, head_dim] at positions
     * pos[n] (host). NeoX/llama convention as in ggml's rope "normal" mode
     * for llama: pairs (2i, 2i+1) rotated by angle pos * theta_i with
     * theta_i = freq_scale * base^(-2i/head_dim) (Su et al. 2021, RoFormer;
     * ggml_rope mode 0). `freq_factors` (host, [head_dim/2] or NULL) divides
     * theta_i as in llama-3 rope scaling. `neox` selects the NeoX layout
     * (pairs (i, i + head_dim/2)) used by qwen2. */
    baton_status_t (*rope)(backend_t *be, float *x, const int32_t *pos, int32_t n,
                           int32_t n_heads, int32_t head_dim, float freq_base,
                           float freq_scale, const float *freq_factors, int neox);
    /* out[n, f] = silu(gate) * up (Shazeer 2020, GLU variants). out may alias gate. */
    baton_status_t (*swiglu)(backend_t *be, const float *gate, const float *up, float *out,
                             int32_t n, int32_t f);
    /* y[n, d] = a + b (residual). y may alias a or b. */
    baton_status_t (*add)(backend_t *be, const float *a, const float *b, float *y, int64_t n);
    /* out[n, d] = table row tokens[t] (host ids, each < table rows). */
    baton_status_t (*embed)(backend_t *be, const backend_weight_t *table, const int32_t *tokens,
                            int32_t n, float *out);
    /* Copies rows rows[i] of x[*, d] into y[i, d] (host row indices). */
    baton_status_t (*gather_rows)(backend_t *be, const float *x, const int32_t *rows,
                                  int32_t n, int32_t d, float *y);

    /* Writes this step's k, v [n_tokens, n_kv_heads * head_dim] (fp32) into
     * layer `layer` of the pools (kv_dtype) at each token's slot. */
    baton_status_t (*kv_write)(backend_t *be, const backend_kv_geom_t *geom, void *k_pool,
                               void *v_pool, int32_t layer, const backend_attn_batch_t *b,
                               const float *k, const float *v);
    /* Causal attention for every token of the batch over its sequence's
     * blocks (cached prefix and this step's tokens, already written by
     * kv_write): q [n_tokens, n_heads, head_dim] -> out [n_tokens, n_heads *
     * head_dim], scale = 1/sqrt(head_dim), GQA: head h reads KV head
     * h / (n_heads / n_kv_heads).
     * Batch invariance (CPU): a token's output depends only on its own
     * query, its sequence's KV and the geometry, so it is bit-identical in
     * any batch and at any thread count. */
    baton_status_t (*attention)(backend_t *be, const backend_kv_geom_t *geom,
                                const void *k_pool, const void *v_pool, int32_t layer,
                                const backend_attn_batch_t *b, const float *q, float *out,
                                int32_t n_heads);
} backend_ops_t;

struct backend {
    const backend_ops_t *ops;
    void *ctx;                  /* backend-private */
    backend_dtype_t weight_dtype;
    backend_dtype_t kv_dtype;
};

/* Byte offset of (layer, block) in a pool laid out as above. */
static inline size_t backend_kv_block_offset(const backend_kv_geom_t *g, int32_t layer,
                                             int32_t block) {
    size_t block_elems = (size_t)g->block_size * g->n_kv_heads * g->head_dim;
    return ((size_t)layer * g->n_blocks + block) * block_elems * backend_dtype_size(g->dtype);
}

/* Bytes of one block of one layer. */
static inline size_t backend_kv_block_bytes(const backend_kv_geom_t *g) {
    return (size_t)g->block_size * g->n_kv_heads * g->head_dim * backend_dtype_size(g->dtype);
}

/* Creates the CPU backend (fp32 weights and KV, OpenBLAS GEMM, `n_threads`
 * worker threads; 0 = number of online CPUs). Free with backend_free.
 * Ops run synchronously and in parallel inside (a persistent pthread pool;
 * OpenBLAS gets the same thread count, process-wide, and never runs at the
 * same time as the pool). One thread at a time may call the ops of one CPU
 * backend (they share its scratch); use one backend per calling thread. */
baton_status_t backend_cpu_create(int n_threads, backend_t **out);

/* Creates the CUDA backend on `device` (bf16 weights and KV). Returns
 * BATON_ERR_UNSUPPORTED when baton was built without CUDA or no GPU is
 * present. Build hook: the real definition lives in the target
 * baton_kernels_cuda (kernels/cuda/CMakeLists.txt); when that target exists,
 * kernels/CMakeLists.txt compiles backend.c with BATON_HAVE_CUDA=1 and links
 * it, otherwise backend.c defines this function returning UNSUPPORTED. */
baton_status_t backend_cuda_create(int device, backend_t **out);

/* Creates a backend by name ("cpu", "cuda"). */
baton_status_t backend_create(const char *name, int n_threads, backend_t **out);

/* Frees a backend from any of the constructors (ops->destroy frees the
 * context and the backend_t itself). Memory from ->alloc and weights must
 * be freed before. NULL-safe. */
void backend_free(backend_t *be);

#endif
