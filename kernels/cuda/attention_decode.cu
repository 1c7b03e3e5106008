/* Paged decode attention for a batch (one query per token), split along the
 * sequence for long contexts (flash-decoding).
 *
 * One CTA (4 warps) per (token, KV head, group of <= 8 query heads sharing
 * that KV head, split). The CTA covers keys [split * chunk, min(pos + 1,
 * (split + 1) * chunk)) of the token's sequence; warp w takes every 4th key,
 * the whole warp reads one key/value row at a time (lane d holds dims d,
 * d+32, ...; U rows are loaded ahead so that loads overlap)
 * and scores it against every query head of the group, so each bf16 K/V row
 * is read from memory once per KV head (GQA reuse). Each warp keeps an online
 * softmax state per head; the 4 warps merge in shared memory. With one split
 * the CTA writes the normalised output; otherwise it writes (m, l, o[D]) to
 * a workspace [n_tokens, n_heads, n_splits, D + 2] and k_decode_combine
 * merges the splits: O = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M).
 *
 * Shapes as attention_prefill.cu; head_dim <= 256. */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define DC_WARPS 4
#define DC_GMAX 8

template <int DC>
__global__ void __launch_bounds__(DC_WARPS * 32)
    k_attn_decode(const __nv_bfloat16 *__restrict__ kp, const __nv_bfloat16 *__restrict__ vp,
                  int64_t layer_base, int32_t block_size, int32_t n_kvh, int32_t D,
                  const int32_t *__restrict__ tok_seq, const int32_t *__restrict__ tok_pos,
                  const int32_t *__restrict__ bt, int32_t max_blocks,
                  const float *__restrict__ q, float *__restrict__ out, float *__restrict__ ws,
                  int32_t n_heads, int32_t group, int32_t hgroups, float scale,
                  int32_t n_splits, int32_t chunk) {
    extern __shared__ float sm[]; /* m [W][G], l [W][G], o [W][G][D] */
    float *s_m = sm;
    float *s_l = s_m + DC_WARPS * DC_GMAX;
    float *s_o = s_l + DC_WARPS * DC_GMAX;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int32_t t = blockIdx.x;
    const int32_t kvh = blockIdx.y / hgroups, hg = blockIdx.y % hgroups;
    const int32_t split = blockIdx.z;
    const int32_t h0 = kvh * group + hg * DC_GMAX;
    const int32_t G = min(DC_GMAX, group - hg * DC_GMAX);
    const int32_t n_keys = tok_pos[t] + 1;
    const int32_t k_begin = split * chunk;
    const int32_t k_end = min(n_keys, k_begin + chunk);
    const int32_t *btr = bt + (int64_t)tok_seq[t] * max_blocks;

    float qv[DC_GMAX][DC], o[DC_GMAX][DC], m[DC_GMAX], l[DC_GMAX];
#pragma unroll
    for (int g = 0; g < DC_GMAX; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int c = 0; c < DC; c++) {
            int d = lane + 32 * c;
            qv[g][c] = (g < G && d < D) ? q[((int64_t)t * n_heads + h0 + g) * D + d] * scale : 0.0f;
            o[g][c] = 0.0f;
        }
    }

    /* Warp w takes runs of U consecutive keys (w*U, w*U + 4U, ...); all U
     * block-table lookups, then all U K/V rows are loaded before any math,
     * so each warp keeps U independent loads in flight. */
    constexpr int U = DC <= 4 ? 4 : 2;
    for (int32_t k0 = k_begin + warp * U; k0 < k_end; k0 += DC_WARPS * U) {
        int64_t base[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int32_t key = min(k0 + u, k_end - 1); /* clamped: masked below */
            const int64_t blk = btr[key / block_size];
            base[u] = layer_base + ((blk * block_size + key % block_size) * n_kvh + kvh) * D;
        }
        float kf[U][DC], vf[U][DC];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int c = 0; c < DC; c++) {
                const int d = lane + 32 * c;
                kf[u][c] = d < D ? bf2f(kp[base[u] + d]) : 0.0f;
                vf[u][c] = d < D ? bf2f(vp[base[u] + d]) : 0.0f;
            }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (k0 + u >= k_end) break; /* warp-uniform */
#pragma unroll
            for (int g = 0; g < DC_GMAX; g++) {
                if (g >= G) break;
                float s = 0.0f;
#pragma unroll
                for (int c = 0; c < DC; c++) s += qv[g][c] * kf[u][c];
                s = warp_sum(s);
                const float mnew = fmaxf(m[g], s);
                const float alpha = __expf(m[g] - mnew);
                const float p = __expf(s - mnew);
                l[g] = l[g] * alpha + p;
#pragma unroll
                for (int c = 0; c < DC; c++) o[g][c] = o[g][c] * alpha + p * vf[u][c];
                m[g] = mnew;
            }
        }
    }

#pragma unroll
    for (int g = 0; g < DC_GMAX; g++) {
        if (lane == 0) {
            s_m[warp * DC_GMAX + g] = m[g];
            s_l[warp * DC_GMAX + g] = l[g];
        }
#pragma unroll
        for (int c = 0; c < DC; c++) {
            int d = lane + 32 * c;
            if (d < D) s_o[((size_t)warp * DC_GMAX + g) * D + d] = o[g][c];
        }
    }
    __syncthreads();

    for (int i = threadIdx.x; i < G * D; i += DC_WARPS * 32) {
        const int g = i / D, d = i % D;
        float M = -INFINITY;
        for (int w = 0; w < DC_WARPS; w++) M = fmaxf(M, s_m[w * DC_GMAX + g]);
        float L = 0.0f, O = 0.0f;
        if (M != -INFINITY) {
            for (int w = 0; w < DC_WARPS; w++) {
                float e = __expf(s_m[w * DC_GMAX + g] - M);
                L += s_l[w * DC_GMAX + g] * e;
                O += s_o[((size_t)w * DC_GMAX + g) * D + d] * e;
            }
        }
        const int64_t th = (int64_t)t * n_heads + h0 + g;
        if (n_splits == 1) {
            out[th * D + d] = O / L;
        } else {
            float *wr = ws + (th * n_splits + split) * (int64_t)(D + 2);
            if (d == 0) {
                wr[0] = M;
                wr[1] = L;
            }
            wr[2 + d] = O;
        }
    }
}

/* One CTA per (token, head); thread d merges dim d over the splits. */
__global__ void k_decode_combine(const float *__restrict__ ws, float *__restrict__ out, int32_t D,
                                 int32_t n_splits) {
    const int64_t th = blockIdx.x;
    const float *w = ws + th * n_splits * (int64_t)(D + 2);
    float M = -INFINITY;
    for (int s = 0; s < n_splits; s++) M = fmaxf(M, w[s * (D + 2)]);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float L = 0.0f, O = 0.0f;
        for (int s = 0; s < n_splits; s++) {
            const float ms = w[s * (D + 2)];
            if (ms == -INFINITY) continue;
            const float e = __expf(ms - M);
            L += w[s * (D + 2) + 1] * e;
            O += w[s * (D + 2) + 2 + d] * e;
        }
        out[th * D + d] = O / L;
    }
}

template <int DC>
static baton_status_t launch_decode(cuda_ctx_t *c, const backend_kv_geom_t *g,
                                    const __nv_bfloat16 *kp, const __nv_bfloat16 *vp,
                                    int64_t layer_base, const cuda_attn_meta_t *m, const float *q,
                                    float *out, int32_t n_heads, int32_t n_splits, int32_t chunk) {
    const int32_t D = g->head_dim, group = n_heads / g->n_kv_heads;
    const int32_t hgroups = (group + DC_GMAX - 1) / DC_GMAX;
    size_t smem = sizeof(float) * (2 * DC_WARPS * DC_GMAX + (size_t)DC_WARPS * DC_GMAX * D);
    BATON_CUDA_CHECK(cudaFuncSetAttribute(k_attn_decode<DC>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)m->n_tokens, (unsigned)(g->n_kv_heads * hgroups), (unsigned)n_splits);
    k_attn_decode<DC><<<grid, DC_WARPS * 32, smem, c->stream>>>(
        kp, vp, layer_base, g->block_size, g->n_kv_heads, D, m->tok_seq, m->tok_pos,
        m->block_tables, m->max_blocks, q, out, c->d_split_ws, n_heads, group, hgroups,
        1.0f / sqrtf((float)D), n_splits, chunk);
    BATON_CUDA_CHECK_LAUNCH();
    if (n_splits > 1) {
        k_decode_combine<<<(unsigned)(m->n_tokens * n_heads), D < 256 ? 128 : 256, 0,
                           c->stream>>>(c->d_split_ws, out, D, n_splits);
        BATON_CUDA_CHECK_LAUNCH();
    }
    return BATON_OK;
}

baton_status_t cuda_attention_decode(cuda_ctx_t *c, const backend_kv_geom_t *g,
                                     const __nv_bfloat16 *d_k_pool,
                                     const __nv_bfloat16 *d_v_pool, int32_t layer,
                                     const cuda_attn_meta_t *m, const float *d_q, float *d_out,
                                     int32_t n_heads, int32_t n_splits, int32_t chunk) {
    if (m->n_tokens <= 0) return BATON_OK;
    if (n_splits > 1) {
        size_t need = (size_t)m->n_tokens * n_heads * n_splits * (g->head_dim + 2) * sizeof(float);
        baton_status_t st = cuda_scratch_ensure(c, (void **)&c->d_split_ws, &c->split_ws_bytes,
                                                need, "decode attention split workspace");
        if (st != BATON_OK) return st;
    }
    int64_t layer_base =
        (int64_t)layer * g->n_blocks * g->block_size * g->n_kv_heads * g->head_dim;
    if (g->head_dim <= 64)
        return launch_decode<2>(c, g, d_k_pool, d_v_pool, layer_base, m, d_q, d_out, n_heads,
                                n_splits, chunk);
    if (g->head_dim <= 128)
        return launch_decode<4>(c, g, d_k_pool, d_v_pool, layer_base, m, d_q, d_out, n_heads,
                                n_splits, chunk);
    if (g->head_dim <= 256)
        return launch_decode<8>(c, g, d_k_pool, d_v_pool, layer_base, m, d_q, d_out, n_heads,
                                n_splits, chunk);
    return baton_error(BATON_ERR_UNSUPPORTED, "cuda attention: head_dim %d > 256", g->head_dim);
}
