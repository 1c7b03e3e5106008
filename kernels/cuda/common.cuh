/* Internal header of the CUDA backend (kernels/cuda/): the CUDA/cuBLAS check
 * macro, the backend context, bf16 helpers and the launchers that each
 * kernel family (one .cu per family, ggml-cuda style) exports to
 * backend_cuda.cu. Not a public header: only kernels/cuda/ includes it.
 *
 * Conventions. Every launcher enqueues work on ctx->stream and returns a
 * baton_status_t; a CUDA or cuBLAS failure becomes BATON_ERR_INTERNAL (or
 * BATON_ERR_NO_MEMORY for allocation failures) with a detail naming the call,
 * file and line (BATON_CUDA_CHECK). Pointers named d_* are device memory,
 * h_* host memory. Activations are fp32, weights and KV are bf16
 * (__nv_bfloat16), accumulation is fp32. */
#ifndef BATON_KERNELS_CUDA_COMMON_CUH
#define BATON_KERNELS_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
}

/* ---- error checking ---------------------------------------------------- */

static inline const char *cuda_result_str(cudaError_t e) { return cudaGetErrorString(e); }
static inline const char *cuda_result_str(cublasStatus_t e) { return cublasGetStatusString(e); }
static inline bool cuda_result_ok(cudaError_t e) { return e == cudaSuccess; }
static inline bool cuda_result_ok(cublasStatus_t e) { return e == CUBLAS_STATUS_SUCCESS; }
static inline baton_status_t cuda_result_status(cudaError_t e) {
    return e == cudaErrorMemoryAllocation ? BATON_ERR_NO_MEMORY : BATON_ERR_INTERNAL;
}
static inline baton_status_t cuda_result_status(cublasStatus_t e) {
    return e == CUBLAS_STATUS_ALLOC_FAILED ? BATON_ERR_NO_MEMORY : BATON_ERR_INTERNAL;
}

/* Records "<call> failed: <reason> (file:line)" and returns the status. */
template <typename R>
static inline baton_status_t cuda_check_fail(R r, const char *call, const char *file, int line) {
    return baton_error(cuda_result_status(r), "%s failed: %s (%s:%d)", call, cuda_result_str(r),
                       file, line);
}

/* The one check macro for CUDA runtime and cuBLAS/cuBLASLt calls: on failure
 * it records call, reason, file and line with baton_error() and returns the
 * status from the enclosing function (which must return baton_status_t). */
#define BATON_CUDA_CHECK(call)                                                   \
    do {                                                                         \
        auto _r = (call);                                                        \
        if (!cuda_result_ok(_r)) return cuda_check_fail(_r, #call, __FILE__, __LINE__); \
    } while (0)

/* Checks the last kernel launch (bad configuration, missing image). */
#define BATON_CUDA_CHECK_LAUNCH() BATON_CUDA_CHECK(cudaGetLastError())

/* ---- context ----------------------------------------------------------- */

enum cuda_mode { CUDA_MODE_EAGER = 0, CUDA_MODE_CAPTURE = 1, CUDA_MODE_REPLAY = 2 };

#define CUDA_GRAPH_SLOTS 16

typedef struct cuda_graph_slot {
    int32_t key;            /* batch size; -1 = empty */
    cudaGraphExec_t exec;
    uint64_t signature;     /* hash of the op sequence and its scalar args */
    size_t meta_bytes;      /* metadata arena bytes used by the captured step */
} cuda_graph_slot_t;

typedef struct cuda_ctx {
    int device;
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *d_cublas_ws;      /* cuBLAS workspace (fixed, so GEMMs are capturable) */
    size_t cublas_ws_bytes;
    cudaDeviceProp prop;

    /* Scratch: bf16 copy of a GEMM input [n, in]; split-K partials of decode
     * attention. Grown in eager mode only (a capture must not allocate). */
    __nv_bfloat16 *d_act_bf16;
    size_t act_bf16_bytes;
    float *d_split_ws;
    size_t split_ws_bytes;

    /* Metadata arenas (token ids, positions, block tables): host metadata is
     * copied into h_meta (pinned) at a bump offset, then to d_meta at the same
     * offset on the stream (async, capturable). Eager mode uses the arena as
     * two halves: when one fills up, an event is recorded on it and the other
     * half is reused after its event completed (stream order protects d_meta).
     * Capture and replay use the arena linearly from offset 0. */
    unsigned char *h_meta;
    unsigned char *d_meta;
    size_t meta_bytes;      /* whole arena; a half is meta_bytes / 2 */
    size_t meta_off;        /* next free byte (absolute offset) */
    int meta_half;          /* eager: half in use (0 or 1) */
    cudaEvent_t half_done[2];
    cudaEvent_t graph_done; /* recorded after a graph launch that reads h_meta */
    int graph_pending;      /* eager must wait graph_done before writing h_meta */
    /* Recent puts: a put of the same host array with the same bytes (every
     * layer's block tables, positions, ...) reuses the staged copy while its
     * generation is current (bumped whenever staged regions may be reused). */
    struct { const void *h; size_t bytes, off; uint64_t gen; } recent[8];
    int recent_next;
    uint64_t meta_gen;

    int prefill_tc;         /* 1: tensor-core prefill attention where supported */
    int mode;
    int32_t graph_key;
    uint64_t signature;
    cudaGraph_t capturing;
    cuda_graph_slot_t graphs[CUDA_GRAPH_SLOTS];
} cuda_ctx_t;

/* Backend weight: bf16 [rows, cols] row-major on the device. */
struct backend_weight {
    __nv_bfloat16 *d;
    int64_t rows;
    int64_t cols;
};

/* The CUDA context of a CUDA backend; INVALID_ARG for any other backend. */
baton_status_t cuda_ctx_of(backend_t *be, cuda_ctx_t **out);

/* Copies `bytes` of host metadata to the device for the current op; *out is
 * the device address (stable for the op's kernels). In replay mode only the
 * pinned copy is refreshed (the captured graph copies it to the device).
 * h == NULL reserves device bytes without a copy (kernel outputs). */
baton_status_t cuda_meta_put(cuda_ctx_t *c, const void *h, size_t bytes, const void **out);

/* Mixes an op id and its scalar arguments into the capture/replay signature. */
void cuda_sig_mix(cuda_ctx_t *c, uint64_t v);

/* True when kernels must be enqueued (eager or capture); false in replay. */
static inline bool cuda_should_launch(const cuda_ctx_t *c) { return c->mode != CUDA_MODE_REPLAY; }

/* Ensures a device scratch buffer of at least `bytes` (eager mode grows it
 * after a stream sync; in capture/replay mode a too-small buffer is an
 * error naming the buffer, because a capture cannot allocate). */
baton_status_t cuda_scratch_ensure(cuda_ctx_t *c, void **buf, size_t *have, size_t bytes,
                                   const char *what);

/* ---- bf16 helpers ------------------------------------------------------ */

__device__ __forceinline__ float bf2f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ __nv_bfloat16 f2bf(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static inline unsigned cuda_div_up(int64_t a, int64_t b) { return (unsigned)((a + b - 1) / b); }

/* ---- launchers (one group per .cu) ------------------------------------ */

/* gemm.cu */
baton_status_t cuda_convert_f32_to_bf16(cuda_ctx_t *c, const float *d_x, __nv_bfloat16 *d_y,
                                        int64_t n);
baton_status_t cuda_convert_bf16_to_f32(cuda_ctx_t *c, const __nv_bfloat16 *d_x, float *d_y,
                                        int64_t n);
/* y[n, out] = x[n, in] * W^T (+ bias[out]); W bf16 [out, in]; cuBLAS bf16
 * inputs, fp32 accumulate and output. */
baton_status_t cuda_gemm(cuda_ctx_t *c, const __nv_bfloat16 *d_w, const __nv_bfloat16 *d_bias,
                         const float *d_x, float *d_y, int32_t n, int64_t in, int64_t out);
/* Fills d_w[n] with bf16 uniform(-scale, scale) from a counter hash of seed. */
baton_status_t cuda_fill_random_bf16(cuda_ctx_t *c, __nv_bfloat16 *d_w, int64_t n, float scale,
                                     uint64_t seed);

/* norm.cu */
baton_status_t cuda_rmsnorm(cuda_ctx_t *c, const float *d_x, const __nv_bfloat16 *d_w, float eps,
                            float *d_y, int32_t n, int32_t d);

/* rope.cu: d_pos [n] int32, d_theta [head_dim/2] fp64 (radians per position) */
baton_status_t cuda_rope(cuda_ctx_t *c, float *d_x, const int32_t *d_pos, int32_t n,
                         int32_t n_heads, int32_t head_dim, const double *d_theta, int neox);

/* act.cu */
baton_status_t cuda_swiglu(cuda_ctx_t *c, const float *d_gate, const float *d_up, float *d_out,
                           int64_t n);
baton_status_t cuda_add(cuda_ctx_t *c, const float *d_a, const float *d_b, float *d_y, int64_t n);

/* embed.cu: d_tok [n] */
baton_status_t cuda_embed(cuda_ctx_t *c, const __nv_bfloat16 *d_table, int64_t cols,
                          const int32_t *d_tok, int32_t n, float *d_out);
baton_status_t cuda_gather_rows(cuda_ctx_t *c, const float *d_x, const int32_t *d_rows,
                                int32_t n, int32_t d, float *d_y);

/* Device copy of one step's attention metadata (see backend_attn_batch_t). */
typedef struct cuda_attn_meta {
    int32_t n_tokens, n_seqs, max_blocks;
    const int32_t *tok_seq, *tok_pos, *seq_n_ctx, *block_tables;
} cuda_attn_meta_t;

/* kv_write.cu: pools bf16 [n_layers, n_blocks, block_size, n_kv_heads, head_dim] */
baton_status_t cuda_kv_write(cuda_ctx_t *c, const backend_kv_geom_t *g, __nv_bfloat16 *d_k_pool,
                             __nv_bfloat16 *d_v_pool, int32_t layer, const cuda_attn_meta_t *m,
                             const float *d_k, const float *d_v);

/* attention_prefill.cu: tiles d_tiles [n_tiles, 3] = (first token, n tokens, seq) */
baton_status_t cuda_attention_prefill(cuda_ctx_t *c, const backend_kv_geom_t *g,
                                      const __nv_bfloat16 *d_k_pool,
                                      const __nv_bfloat16 *d_v_pool, int32_t layer,
                                      const cuda_attn_meta_t *m, const int32_t *d_tiles,
                                      int32_t n_tiles, const float *d_q, float *d_out,
                                      int32_t n_heads);
#define CUDA_PREFILL_TILE_Q 32
/* Tensor-core (WMMA bf16) variant: head_dim 64 or 128, 64-query tiles. */
#define CUDA_PREFILL_TC_TILE_Q 64
int cuda_prefill_tc_supported(const cuda_ctx_t *c, int32_t head_dim);
baton_status_t cuda_attention_prefill_tc(cuda_ctx_t *c, const backend_kv_geom_t *g,
                                         const __nv_bfloat16 *d_k_pool,
                                         const __nv_bfloat16 *d_v_pool, int32_t layer,
                                         const cuda_attn_meta_t *m, const int32_t *d_tiles,
                                         int32_t n_tiles, const float *d_q, float *d_out,
                                         int32_t n_heads);

/* attention_decode.cu: one query per token, keys split in n_splits chunks of
 * chunk positions each. */
baton_status_t cuda_attention_decode(cuda_ctx_t *c, const backend_kv_geom_t *g,
                                     const __nv_bfloat16 *d_k_pool,
                                     const __nv_bfloat16 *d_v_pool, int32_t layer,
                                     const cuda_attn_meta_t *m, const float *d_q, float *d_out,
                                     int32_t n_heads, int32_t n_splits, int32_t chunk);

#endif
