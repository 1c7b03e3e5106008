/* Element-wise ops: SwiGLU (Shazeer 2020) out = silu(gate) * up with
 * silu(g) = g / (1 + exp(-g)), and the residual add y = a + b. fp32 [n]
 * (n = rows * width); out may alias gate, y may alias a or b (each element
 * is read before it is written by the same thread). */
#include "kernels/cuda/common.cuh"

__global__ void k_swiglu(const float *gate, const float *up, float *out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

__global__ void k_add(const float *a, const float *b, float *y, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) y[i] = a[i] + b[i];
}

static unsigned act_grid(int64_t n) {
    int64_t g = (n + 255) / 256;
    return (unsigned)(g < 65535 ? g : 65535);
}

baton_status_t cuda_swiglu(cuda_ctx_t *c, const float *d_gate, const float *d_up, float *d_out,
                           int64_t n) {
    if (n <= 0) return BATON_OK;
    k_swiglu<<<act_grid(n), 256, 0, c->stream>>>(d_gate, d_up, d_out, n);
    BATON_CUDA_CHECK_LAUNCH();
    return BATON_OK;
}

baton_status_t cuda_add(cuda_ctx_t *c, const float *d_a, const float *d_b, float *d_y, int64_t n) {
    if (n <= 0) return BATON_OK;
    k_add<<<act_grid(n), 256, 0, c->stream>>>(d_a, d_b, d_y, n);
    BATON_CUDA_CHECK_LAUNCH();
    return BATON_OK;
}
