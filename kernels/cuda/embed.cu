/* Embedding gather: out[t, :] = table[tok[t], :] (bf16 table [rows, cols] ->
 * fp32 out [n, cols]), and the fp32 row gather y[i, :] = x[rows[i], :]
 * (selecting the last token of each sequence before the LM head). Token ids
 * and row indices are device copies, bounds-checked on the host. One CTA per
 * output row. */
#include "kernels/cuda/common.cuh"

__global__ void k_embed(const __nv_bfloat16 *__restrict__ table, int64_t cols,
                        const int32_t *__restrict__ tok, float *__restrict__ out) {
    const __nv_bfloat16 *src = table + (int64_t)tok[blockIdx.x] * cols;
    float *dst = out + (int64_t)blockIdx.x * cols;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) dst[i] = bf2f(src[i]);
}

__global__ void k_gather_rows(const float *__restrict__ x, const int32_t *__restrict__ rows,
                              int32_t d, float *__restrict__ y) {
    const float *src = x + (int64_t)rows[blockIdx.x] * d;
    float *dst = y + (int64_t)blockIdx.x * d;
    for (int32_t i = threadIdx.x; i < d; i += blockDim.x) dst[i] = src[i];
}

baton_status_t cuda_embed(cuda_ctx_t *c, const __nv_bfloat16 *d_table, int64_t cols,
                          const int32_t *d_tok, int32_t n, float *d_out) {
    if (n <= 0) return BATON_OK;
    k_embed<<<n, 256, 0, c->stream>>>(d_table, cols, d_tok, d_out);
    BATON_CUDA_CHECK_LAUNCH();
    return BATON_OK;
}

baton_status_t cuda_gather_rows(cuda_ctx_t *c, const float *d_x, const int32_t *d_rows,
                                int32_t n, int32_t d, float *d_y) {
    if (n <= 0) return BATON_OK;
    k_gather_rows<<<n, 256, 0, c->stream>>>(d_x, d_rows, d, d_y);
    BATON_CUDA_CHECK_LAUNCH();
    return BATON_OK;
}
