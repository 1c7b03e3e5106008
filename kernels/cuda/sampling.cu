/* Logits sampling on the device: greedy argmax and temperature / top-k /
 * top-p sampling (semantics in kernels/cuda/cuda_sampling.h).
 *
 * One CTA of 1024 threads per row; nothing is sorted. Logits map to
 * order-preserving uint32 keys, and the top-k cut (the k-th largest key) and
 * the top-p cut (the largest key whose upper tail holds top_p of the mass)
 * are found by radix select: 32 rounds, each setting one bit of the
 * threshold and checking a block-wide count (top-k) or a block-wide sum of
 * exp((x - max) / T) (top-p). The draw scans the kept ids in index order: each
 * thread owns a contiguous range, a block exclusive scan of the range masses
 * locates the range holding u * Z and its thread walks it. */
#include <math.h>
#include <string.h>

#include "kernels/cuda/common.cuh"

extern "C" {
#include "kernels/cuda/cuda_sampling.h"
}

#define SMP_THREADS 1024

typedef struct sample_param {
    float temperature;
    int32_t top_k;
    float top_p;
    float uniform;
} sample_param_t;

__device__ __forceinline__ uint32_t f2key(float f) {
    uint32_t u = __float_as_uint(f);
    if (f != f) return 0; /* NaN sorts lowest */
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Block-wide sum (all threads get the result). `red` holds 32 floats. */
__device__ float block_sum(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = lane < (int)(blockDim.x >> 5) ? red[lane] : 0.0f;
    return warp_sum(t);
}

__device__ uint32_t block_max_u32(uint32_t v, uint32_t *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    uint32_t t = lane < (int)(blockDim.x >> 5) ? red[lane] : 0u;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t = max(t, __shfl_xor_sync(0xffffffffu, t, o));
    return t;
}

/* argmax with lowest index on ties */
__global__ void __launch_bounds__(SMP_THREADS)
    k_greedy(const float *__restrict__ logits, int32_t vocab, int32_t *__restrict__ out) {
    const float *x = logits + (int64_t)blockIdx.x * vocab;
    uint32_t best = 0;
    int32_t bi = INT32_MAX;
    for (int32_t i = threadIdx.x; i < vocab; i += SMP_THREADS) {
        uint32_t k = f2key(x[i]);
        if (k > best || (k == best && i < bi)) { best = k; bi = i; }
    }
    __shared__ uint32_t rk[32];
    __shared__ int32_t ri[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        uint32_t ok = __shfl_xor_sync(0xffffffffu, best, o);
        int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ok > best || (ok == best && oi < bi)) { best = ok; bi = oi; }
    }
    if (lane == 0) { rk[warp] = best; ri[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        best = rk[lane];
        bi = ri[lane];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            uint32_t ok = __shfl_xor_sync(0xffffffffu, best, o);
            int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ok > best || (ok == best && oi < bi)) { best = ok; bi = oi; }
        }
        if (lane == 0) out[blockIdx.x] = bi == INT32_MAX ? 0 : bi;
    }
}

__global__ void __launch_bounds__(SMP_THREADS)
    k_sample(const float *__restrict__ logits, int32_t vocab,
             const sample_param_t *__restrict__ params, int32_t *__restrict__ out) {
    __shared__ float red[32];
    __shared__ uint32_t redu[32];
    __shared__ float scan[SMP_THREADS];
    __shared__ int32_t pick;
    const float *x = logits + (int64_t)blockIdx.x * vocab;
    const sample_param_t p = params[blockIdx.x];
    const float inv_t = 1.0f / p.temperature;

    /* max key -> max logit */
    uint32_t mk = 0;
    for (int32_t i = threadIdx.x; i < vocab; i += SMP_THREADS) mk = max(mk, f2key(x[i]));
    mk = block_max_u32(mk, redu);
    const float xmax = __uint_as_float((mk & 0x80000000u) ? (mk & 0x7fffffffu) : ~mk);

    /* top-k cut: largest key T with count(key >= T) >= k */
    uint32_t tk = 0;
    if (p.top_k > 0 && p.top_k < vocab) {
        for (int bit = 31; bit >= 0; bit--) {
            const uint32_t cand = tk | (1u << bit);
            float cnt = 0.0f;
            for (int32_t i = threadIdx.x; i < vocab; i += SMP_THREADS) cnt += f2key(x[i]) >= cand;
            if (block_sum(cnt, red) >= (float)p.top_k) tk = cand;
        }
    }
    /* top-p cut among survivors: largest key T >= tk whose tail mass >= top_p * Z */
    uint32_t tcut = tk;
    if (p.top_p < 1.0f) {
        float z = 0.0f;
        for (int32_t i = threadIdx.x; i < vocab; i += SMP_THREADS)
            if (f2key(x[i]) >= tk) z += __expf((x[i] - xmax) * inv_t);
        z = block_sum(z, red);
        const float need = p.top_p * z;
        uint32_t tp = 0;
        for (int bit = 31; bit >= 0; bit--) {
            const uint32_t cand = tp | (1u << bit);
            const uint32_t thr = max(cand, tk);
            float s = 0.0f;
            for (int32_t i = threadIdx.x; i < vocab; i += SMP_THREADS)
                if (f2key(x[i]) >= thr) s += __expf((x[i] - xmax) * inv_t);
            if (block_sum(s, red) >= need) tp = cand;
        }
        tcut = max(tk, tp);
    }

    /* draw: contiguous ranges per thread, exclusive scan of their masses */
    const int32_t per = (vocab + SMP_THREADS - 1) / SMP_THREADS;
    const int32_t lo = min(vocab, (int32_t)threadIdx.x * per), hi = min(vocab, lo + per);
    float own = 0.0f;
    int32_t last_kept = -1;
    for (int32_t i = lo; i < hi; i++)
        if (f2key(x[i]) >= tcut) { own += __expf((x[i] - xmax) * inv_t); last_kept = i; }
    scan[threadIdx.x] = own;
    if (threadIdx.x == 0) pick = -1;
    __syncthreads();
    for (int off = 1; off < SMP_THREADS; off <<= 1) { /* Hillis-Steele inclusive scan */
        float v = threadIdx.x >= (unsigned)off ? scan[threadIdx.x - off] : 0.0f;
        __syncthreads();
        scan[threadIdx.x] += v;
        __syncthreads();
    }
    const float total = scan[SMP_THREADS - 1];
    const float target = p.uniform * total;
    /* the ranges [scan[i-1], scan[i]) tile [0, total) exactly */
    const float excl = threadIdx.x ? scan[threadIdx.x - 1] : 0.0f;
    if (own > 0.0f && target >= excl && target < scan[threadIdx.x]) {
        float acc = excl;
        int32_t chosen = last_kept;
        for (int32_t i = lo; i < hi; i++) {
            if (f2key(x[i]) < tcut) continue;
            acc += __expf((x[i] - xmax) * inv_t);
            if (target < acc) { chosen = i; break; }
        }
        pick = chosen;
    }
    __syncthreads();
    /* rounding put target past the last range: take the highest kept id */
    if (pick < 0) {
        uint32_t lk = block_max_u32(last_kept < 0 ? 0u : (uint32_t)last_kept + 1u, redu);
        if (threadIdx.x == 0) pick = lk > 0 ? (int32_t)lk - 1 : 0;
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = pick;
}

static baton_status_t sample_common(backend_t *be, const float *logits, int32_t n, int32_t vocab,
                                    cuda_ctx_t **cc) {
    baton_status_t st = cuda_ctx_of(be, cc);
    if (st != BATON_OK) return st;
    if (!logits || n <= 0 || vocab <= 0)
        return baton_error(BATON_ERR_INVALID_ARG, "cuda sampling: logits %p n %d vocab %d",
                           (const void *)logits, n, vocab);
    if ((*cc)->mode != CUDA_MODE_EAGER)
        return baton_error(BATON_ERR_INVALID_ARG, "cuda sampling inside a graph capture/replay");
    return BATON_OK;
}

static baton_status_t fetch_ids(cuda_ctx_t *c, const int32_t *d_ids, int32_t n, int32_t *out) {
    BATON_CUDA_CHECK(cudaMemcpyAsync(out, d_ids, (size_t)n * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, c->stream));
    BATON_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return BATON_OK;
}

extern "C" baton_status_t cuda_sample_greedy(backend_t *be, const float *logits, int32_t n,
                                             int32_t vocab, int32_t *out_ids) {
    cuda_ctx_t *c;
    baton_status_t st = sample_common(be, logits, n, vocab, &c);
    if (st != BATON_OK) return st;
    if (!out_ids) return baton_error(BATON_ERR_INVALID_ARG, "cuda_sample_greedy: out_ids NULL");
    const void *d_ids;
    st = cuda_meta_put(c, NULL, (size_t)n * sizeof(int32_t), &d_ids);
    if (st != BATON_OK) return st;
    k_greedy<<<n, SMP_THREADS, 0, c->stream>>>(logits, vocab, (int32_t *)d_ids);
    BATON_CUDA_CHECK_LAUNCH();
    return fetch_ids(c, (const int32_t *)d_ids, n, out_ids);
}

extern "C" baton_status_t cuda_sample(backend_t *be, const float *logits, int32_t n,
                                      int32_t vocab, const float *temperature,
                                      const int32_t *top_k, const float *top_p,
                                      const float *uniform, int32_t *out_ids) {
    cuda_ctx_t *c;
    baton_status_t st = sample_common(be, logits, n, vocab, &c);
    if (st != BATON_OK) return st;
    if (!temperature || !top_k || !top_p || !uniform || !out_ids)
        return baton_error(BATON_ERR_INVALID_ARG, "cuda_sample: NULL parameter array");
    int all_greedy = 1;
    for (int32_t i = 0; i < n; i++) {
        if (!(top_p[i] > 0.0f) || !(uniform[i] >= 0.0f && uniform[i] < 1.0f) ||
            !isfinite(temperature[i]))
            return baton_error(BATON_ERR_INVALID_ARG,
                               "cuda_sample: row %d: temperature %g top_p %g uniform %g", i,
                               (double)temperature[i], (double)top_p[i], (double)uniform[i]);
        if (temperature[i] > 0.0f) all_greedy = 0;
    }
    const void *d_ids;
    st = cuda_meta_put(c, NULL, (size_t)n * sizeof(int32_t), &d_ids);
    if (st != BATON_OK) return st;
    if (all_greedy) {
        k_greedy<<<n, SMP_THREADS, 0, c->stream>>>(logits, vocab, (int32_t *)d_ids);
        BATON_CUDA_CHECK_LAUNCH();
        return fetch_ids(c, (const int32_t *)d_ids, n, out_ids);
    }
    sample_param_t *hp = (sample_param_t *)malloc((size_t)n * sizeof(*hp));
    if (!hp) return baton_error(BATON_ERR_NO_MEMORY, "cuda_sample: %d params", n);
    for (int32_t i = 0; i < n; i++) {
        /* greedy rows inside a sampled batch: sampled with top_k = 1 here,
         * then replaced by k_greedy's argmax below */
        hp[i].temperature = temperature[i] > 0.0f ? temperature[i] : 1.0f;
        hp[i].top_k = temperature[i] > 0.0f ? top_k[i] : 1;
        hp[i].top_p = temperature[i] > 0.0f ? top_p[i] : 1.0f;
        hp[i].uniform = uniform[i];
    }
    const void *d_params;
    st = cuda_meta_put(c, hp, (size_t)n * sizeof(*hp), &d_params);
    free(hp);
    if (st != BATON_OK) return st;
    k_sample<<<n, SMP_THREADS, 0, c->stream>>>(logits, vocab, (const sample_param_t *)d_params,
                                               (int32_t *)d_ids);
    BATON_CUDA_CHECK_LAUNCH();
    int any_greedy = 0;
    for (int32_t i = 0; i < n; i++) any_greedy |= !(temperature[i] > 0.0f);
    if (!any_greedy) return fetch_ids(c, (const int32_t *)d_ids, n, out_ids);
    /* greedy rows of a mixed batch: argmax with the lowest index on ties */
    const void *d_greedy;
    st = cuda_meta_put(c, NULL, (size_t)n * sizeof(int32_t), &d_greedy);
    if (st != BATON_OK) return st;
    k_greedy<<<n, SMP_THREADS, 0, c->stream>>>(logits, vocab, (int32_t *)d_greedy);
    BATON_CUDA_CHECK_LAUNCH();
    int32_t *g = (int32_t *)malloc((size_t)n * sizeof(int32_t));
    if (!g) return baton_error(BATON_ERR_NO_MEMORY, "cuda_sample: %d ids", n);
    st = fetch_ids(c, (const int32_t *)d_greedy, n, g);
    if (st == BATON_OK) st = fetch_ids(c, (const int32_t *)d_ids, n, out_ids);
    if (st == BATON_OK)
        for (int32_t i = 0; i < n; i++)
            if (!(temperature[i] > 0.0f)) out_ids[i] = g[i];
    free(g);
    return st;
}
