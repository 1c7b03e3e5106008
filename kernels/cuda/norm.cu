/* RMSNorm (Zhang & Sennrich 2019): y[t, i] = x[t, i] / sqrt(mean_i(x^2) + eps)
 * * w[i]. One CTA of 256 threads per row; the sum of squares is reduced in
 * fp32 (warp shuffles, then one value per warp in shared memory) before any
 * element is written, so y may alias x. x, y fp32 [n, d]; w bf16 [d]. */
#include "kernels/cuda/common.cuh"

#define NORM_THREADS 256

__global__ void k_rmsnorm(const float *x, const __nv_bfloat16 *__restrict__ w, float eps,
                          float *y, int32_t d) {
    const float *xr = x + (int64_t)blockIdx.x * d;
    float *yr = y + (int64_t)blockIdx.x * d;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += NORM_THREADS) ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    __shared__ float part[NORM_THREADS / 32];
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    float tot = 0.0f;
#pragma unroll
    for (int i = 0; i < NORM_THREADS / 32; i++) tot += part[i];
    float r = rsqrtf(tot / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += NORM_THREADS) yr[i] = xr[i] * r * bf2f(w[i]);
}

baton_status_t cuda_rmsnorm(cuda_ctx_t *c, const float *d_x, const __nv_bfloat16 *d_w, float eps,
                            float *d_y, int32_t n, int32_t d) {
    if (n <= 0) return BATON_OK;
    k_rmsnorm<<<n, NORM_THREADS, 0, c->stream>>>(d_x, d_w, eps, d_y, d);
    BATON_CUDA_CHECK_LAUNCH();
    return BATON_OK;
}
