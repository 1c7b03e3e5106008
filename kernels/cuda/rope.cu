/* Rotary position embedding (Su et al. 2021, RoFormer), in place on
 * x fp32 [n, n_heads, head_dim], as ggml_rope (ext_factor 0):
 *   theta_i = freq_scale * base^(-2i/head_dim) / freq_factors[i]
 *   angle   = pos * theta_i
 * normal mode rotates pairs (2i, 2i+1); NeoX mode (qwen2) pairs
 * (i, i + head_dim/2). theta is computed on the host in double (like the CPU
 * backend) and the angle is formed in double on the device: in fp32,
 * pos * theta loses about pos * 2^-24 rad. One thread per (token, head,
 * pair); pos int32 [n] and theta fp64 [head_dim/2] are device copies. */
#include "kernels/cuda/common.cuh"

__global__ void k_rope(float *x, const int32_t *__restrict__ pos, int32_t n, int32_t n_heads,
                       int32_t head_dim, const double *__restrict__ theta, int neox) {
    int32_t half = head_dim / 2;
    int64_t total = (int64_t)n * n_heads * half;
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    int32_t i = (int32_t)(idx % half);
    int64_t th = idx / half; /* token * n_heads + head */
    int32_t t = (int32_t)(th / n_heads);
    double s, co;
    sincos((double)pos[t] * theta[i], &s, &co);
    float *row = x + th * head_dim;
    int32_t a = neox ? i : 2 * i;
    int32_t b = neox ? i + half : 2 * i + 1;
    float x0 = row[a], x1 = row[b];
    row[a] = (float)(x0 * co - x1 * s);
    row[b] = (float)(x0 * s + x1 * co);
}

baton_status_t cuda_rope(cuda_ctx_t *c, float *d_x, const int32_t *d_pos, int32_t n,
                         int32_t n_heads, int32_t head_dim, const double *d_theta, int neox) {
    int64_t total = (int64_t)n * n_heads * (head_dim / 2);
    if (total <= 0) return BATON_OK;
    k_rope<<<cuda_div_up(total, 256), 256, 0, c->stream>>>(d_x, d_pos, n, n_heads, head_dim,
                                                          d_theta, neox);
    BATON_CUDA_CHECK_LAUNCH();
    return BATON_OK;
}
