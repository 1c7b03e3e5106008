/* Causal prefill attention over a block table with a cached prefix,
 * flash-attention style (Dao et al. 2022): no n x n score buffer.
 *
 * One CTA (4 warps) per (query tile, head). A query tile is up to 32
 * consecutive tokens of one sequence (host-built list: first token, count,
 * sequence). The tile's Q (pre-scaled by 1/sqrt(head_dim)) sits in shared
 * memory; keys/values 0..max_pos of the sequence are streamed through shared
 * memory 32 positions at a time, gathered from the paged bf16 pools through
 * the block table and widened to fp32. Each warp owns 8 queries and keeps for
 * each a running max m, normaliser l and output o (online softmax, Milakov &
 * Gimelshein 2018): per KV tile lane j scores key j, the warp reduces max and
 * sum, rescales o by exp(m_old - m_new) and accumulates p_j * V_j with lane
 * d owning output dims d, d+32, ... A query at position p sees keys 0..p.
 *
 * Shapes: q fp32 [n_tokens, n_heads, head_dim]; out fp32 [n_tokens, n_heads
 * * head_dim]; pools bf16 [n_layers, n_blocks, block_size, n_kv_heads,
 * head_dim]; head_dim <= 256 (any value; dims are guarded). GQA: head h
 * reads KV head h / (n_heads / n_kv_heads). */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define PF_BR CUDA_PREFILL_TILE_Q /* queries per CTA */
#define PF_BC 32                  /* keys per shared-memory tile (= warp size) */
#define PF_WARPS 4
#define PF_QPW (PF_BR / PF_WARPS) /* queries per warp */

template <int DC>
__global__ void __launch_bounds__(PF_WARPS * 32)
    k_attn_prefill(const __nv_bfloat16 *__restrict__ kp, const __nv_bfloat16 *__restrict__ vp,
                   int64_t layer_base, int32_t block_size, int32_t n_kvh, int32_t D,
                   const int32_t *__restrict__ tok_pos, const int32_t *__restrict__ bt,
                   int32_t max_blocks, const int32_t *__restrict__ tiles,
                   const float *__restrict__ q, float *__restrict__ out, int32_t n_heads,
                   int32_t group, float scale) {
    extern __shared__ float sm[];
    float *sq = sm;                      /* [PF_BR][D] */
    float *sk = sq + PF_BR * D;          /* [PF_BC][D + 1] (padded: no bank conflicts) */
    float *sv = sk + PF_BC * (D + 1);    /* [PF_BC][D] */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int32_t first = tiles[3 * blockIdx.x], nq = tiles[3 * blockIdx.x + 1];
    const int32_t seq = tiles[3 * blockIdx.x + 2];
    const int32_t h = blockIdx.y, kvh = h / group;
    const int32_t *btr = bt + (int64_t)seq * max_blocks;

    for (int i = tid; i < PF_BR * D; i += PF_WARPS * 32) {
        int qi = i / D, d = i % D;
        sq[i] = qi < nq ? q[((int64_t)(first + qi) * n_heads + h) * D + d] * scale : 0.0f;
    }
    const int32_t n_keys = tok_pos[first + nq - 1] + 1;

    int32_t qpos[PF_QPW];
    float m[PF_QPW], l[PF_QPW], o[PF_QPW][DC];
#pragma unroll
    for (int qq = 0; qq < PF_QPW; qq++) {
        int qi = warp * PF_QPW + qq;
        qpos[qq] = qi < nq ? tok_pos[first + qi] : -1;
        m[qq] = -INFINITY;
        l[qq] = 0.0f;
#pragma unroll
        for (int c = 0; c < DC; c++) o[qq][c] = 0.0f;
    }

    for (int32_t kt = 0; kt < n_keys; kt += PF_BC) {
        __syncthreads(); /* previous tile fully consumed (and Q loaded) */
        for (int i = tid; i < PF_BC * D; i += PF_WARPS * 32) {
            int j = i / D, d = i % D;
            int32_t pos = kt + j;
            float kf = 0.0f, vf = 0.0f;
            if (pos < n_keys) {
                int64_t blk = btr[pos / block_size];
                int64_t off = layer_base +
                              ((blk * block_size + pos % block_size) * n_kvh + kvh) * D + d;
                kf = bf2f(kp[off]);
                vf = bf2f(vp[off]);
            }
            sk[j * (D + 1) + d] = kf;
            sv[j * D + d] = vf;
        }
        __syncthreads();
#pragma unroll
        for (int qq = 0; qq < PF_QPW; qq++) {
            const int32_t qp = qpos[qq];
            if (qp < kt) continue; /* invalid query or tile fully masked (warp-uniform) */
            const float *qrow = sq + (warp * PF_QPW + qq) * D;
            const float *krow = sk + lane * (D + 1);
            float s = 0.0f;
            for (int d = 0; d < D; d++) s += qrow[d] * krow[d];
            const bool valid = kt + lane <= qp;
            s = valid ? s : -INFINITY;
            const float mnew = fmaxf(m[qq], warp_max(s));
            const float p = valid ? __expf(s - mnew) : 0.0f;
            const float alpha = __expf(m[qq] - mnew);
            l[qq] = l[qq] * alpha + warp_sum(p);
#pragma unroll
            for (int c = 0; c < DC; c++) o[qq][c] *= alpha;
            const int jmax = min(PF_BC, qp - kt + 1);
            for (int j = 0; j < jmax; j++) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
                const float *vrow = sv + j * D;
#pragma unroll
                for (int c = 0; c < DC; c++) {
                    int d = lane + 32 * c;
                    if (d < D) o[qq][c] += pj * vrow[d];
                }
            }
            m[qq] = mnew;
        }
    }
#pragma unroll
    for (int qq = 0; qq < PF_QPW; qq++) {
        if (qpos[qq] < 0) continue;
        const int qi = warp * PF_QPW + qq;
        float *orow = out + ((int64_t)(first + qi) * n_heads + h) * D;
        const float inv = 1.0f / l[qq];
#pragma unroll
        for (int c = 0; c < DC; c++) {
            int d = lane + 32 * c;
            if (d < D) orow[d] = o[qq][c] * inv;
        }
    }
}

template <int DC>
static baton_status_t launch_prefill(cuda_ctx_t *c, const backend_kv_geom_t *g,
                                     const __nv_bfloat16 *kp, const __nv_bfloat16 *vp,
                                     int64_t layer_base, const cuda_attn_meta_t *m,
                                     const int32_t *tiles, int32_t n_tiles, const float *q,
                                     float *out, int32_t n_heads) {
    const int32_t D = g->head_dim;
    size_t smem = sizeof(float) * ((size_t)PF_BR * D + (size_t)PF_BC * (D + 1) + (size_t)PF_BC * D);
    BATON_CUDA_CHECK(cudaFuncSetAttribute(k_attn_prefill<DC>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)n_tiles, (unsigned)n_heads);
    k_attn_prefill<DC><<<grid, PF_WARPS * 32, smem, c->stream>>>(
        kp, vp, layer_base, g->block_size, g->n_kv_heads, D, m->tok_pos, m->block_tables,
        m->max_blocks, tiles, q, out, n_heads, n_heads / g->n_kv_heads, 1.0f / sqrtf((float)D));
    BATON_CUDA_CHECK_LAUNCH();
    return BATON_OK;
}

baton_status_t cuda_attention_prefill(cuda_ctx_t *c, const backend_kv_geom_t *g,
                                      const __nv_bfloat16 *d_k_pool,
                                      const __nv_bfloat16 *d_v_pool, int32_t layer,
                                      const cuda_attn_meta_t *m, const int32_t *d_tiles,
                                      int32_t n_tiles, const float *d_q, float *d_out,
                                      int32_t n_heads) {
    if (n_tiles <= 0) return BATON_OK;
    int64_t layer_base =
        (int64_t)layer * g->n_blocks * g->block_size * g->n_kv_heads * g->head_dim;
    if (g->head_dim <= 64)
        return launch_prefill<2>(c, g, d_k_pool, d_v_pool, layer_base, m, d_tiles, n_tiles, d_q,
                                 d_out, n_heads);
    if (g->head_dim <= 128)
        return launch_prefill<4>(c, g, d_k_pool, d_v_pool, layer_base, m, d_tiles, n_tiles, d_q,
                                 d_out, n_heads);
    if (g->head_dim <= 256)
        return launch_prefill<8>(c, g, d_k_pool, d_v_pool, layer_base, m, d_tiles, n_tiles, d_q,
                                 d_out, n_heads);
    return baton_error(BATON_ERR_UNSUPPORTED, "cuda attention: head_dim %d > 256", g->head_dim);
}
