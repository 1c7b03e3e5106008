/* GEMM through cuBLAS (bf16 inputs, fp32 accumulate, fp32 output) and the
 * fp32 <-> bf16 conversions it needs.
 *
 * The backend's activations are fp32 (kernels/backend.h); a projection
 * converts its input x [n, in] to a bf16 scratch copy and calls
 * cublasGemmEx with CUBLAS_COMPUTE_32F, writing fp32 y [n, out]. Weights are
 * bf16 [out, in] row-major, which cuBLAS (column-major) sees as an in x out
 * matrix, so y^T = W x^T is GEMM(op(A) = A^T, op(B) = B): m = out, n = n,
 * k = in. bf16 rounding is round-to-nearest-even (__float2bfloat16_rn). */
#include "kernels/cuda/common.cuh"

__global__ void k_f32_to_bf16(const float *__restrict__ x, __nv_bfloat16 *__restrict__ y,
                              int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) y[i] = f2bf(x[i]);
}

__global__ void k_bf16_to_f32(const __nv_bfloat16 *__restrict__ x, float *__restrict__ y,
                              int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) y[i] = bf2f(x[i]);
}

/* y[t, o] += bias[o] */
__global__ void k_add_bias(float *__restrict__ y, const __nv_bfloat16 *__restrict__ bias,
                           int64_t n_rows, int64_t out) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n_rows * out; i += stride) y[i] += bf2f(bias[i % out]);
}

/* splitmix64 of (seed, index) -> uniform in (-scale, scale), bf16. */
__global__ void k_fill_random(__nv_bfloat16 *__restrict__ w, int64_t n, float scale,
                              uint64_t seed) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        uint64_t z = seed + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        float u = (float)(z >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
        w[i] = f2bf((2.0f * u - 1.0f) * scale);
    }
}

static unsigned grid_for(int64_t n) {
    int64_t g = (n + 255) / 256;
    return (unsigned)(g < 65535 ? (g > 0 ? g : 1) : 65535);
}

baton_status_t cuda_convert_f32_to_bf16(cuda_ctx_t *c, const float *d_x, __nv_bfloat16 *d_y,
                                        int64_t n) {
    if (n <= 0) return BATON_OK;
    k_f32_to_bf16<<<grid_for(n), 256, 0, c->stream>>>(d_x, d_y, n);
    BATON_CUDA_CHECK_LAUNCH();
    return BATON_OK;
}

baton_status_t cuda_convert_bf16_to_f32(cuda_ctx_t *c, const __nv_bfloat16 *d_x, float *d_y,
                                        int64_t n) {
    if (n <= 0) return BATON_OK;
    k_bf16_to_f32<<<grid_for(n), 256, 0, c->stream>>>(d_x, d_y, n);
    BATON_CUDA_CHECK_LAUNCH();
    return BATON_OK;
}

baton_status_t cuda_fill_random_bf16(cuda_ctx_t *c, __nv_bfloat16 *d_w, int64_t n, float scale,
                                     uint64_t seed) {
    if (n <= 0) return BATON_OK;
    k_fill_random<<<grid_for(n), 256, 0, c->stream>>>(d_w, n, scale, seed);
    BATON_CUDA_CHECK_LAUNCH();
    return BATON_OK;
}

baton_status_t cuda_gemm(cuda_ctx_t *c, const __nv_bfloat16 *d_w, const __nv_bfloat16 *d_bias,
                         const float *d_x, float *d_y, int32_t n, int64_t in, int64_t out) {
    if (n <= 0) return BATON_OK;
    if (in > INT32_MAX || out > INT32_MAX)
        return baton_error(BATON_ERR_UNSUPPORTED, "cuda matmul: dims %lld x %lld exceed int32",
                           (long long)out, (long long)in);
    baton_status_t st = cuda_scratch_ensure(c, (void **)&c->d_act_bf16, &c->act_bf16_bytes,
                                            (size_t)n * in * sizeof(__nv_bfloat16),
                                            "GEMM input bf16 scratch");
    if (st != BATON_OK) return st;
    st = cuda_convert_f32_to_bf16(c, d_x, c->d_act_bf16, (int64_t)n * in);
    if (st != BATON_OK) return st;
    const float alpha = 1.0f, beta = 0.0f;
    BATON_CUDA_CHECK(cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)out, n, (int)in,
                                  &alpha, d_w, CUDA_R_16BF, (int)in, c->d_act_bf16, CUDA_R_16BF,
                                  (int)in, &beta, d_y, CUDA_R_32F, (int)out, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
    if (d_bias) {
        k_add_bias<<<grid_for((int64_t)n * out), 256, 0, c->stream>>>(d_y, d_bias, n, out);
        BATON_CUDA_CHECK_LAUNCH();
    }
    return BATON_OK;
}
