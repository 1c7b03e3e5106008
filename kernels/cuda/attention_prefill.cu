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

/* ---- tensor-core variant (bf16 WMMA, head_dim 64 or 128) ----------------
 *
 * Same algorithm on 64-query x 64-key tiles with the two products on tensor
 * cores (nvcuda::wmma 16x16x16, bf16 inputs, fp32 accumulate): warp w owns
 * query rows 16w..16w+15. Per KV tile: S = Q K^T into shared memory (fp32),
 * online softmax per row (two lanes per row), P rounded to bf16, PV = P V
 * into shared memory, then O = O * alpha + PV (O lives in shared memory
 * because WMMA accumulator elements have no defined row mapping). Q is
 * rounded to bf16 after scaling, so results differ from the SIMT kernel by
 * bf16 rounding (~2^-9 relative). Shared memory: about 143 KiB at
 * head_dim 128 (sm_80: 163 KiB, sm_90: 227 KiB). */
#include <mma.h>

#define TC_BR 64
#define TC_BC 64
#define TC_WARPS 4

template <int D>
struct tc_layout {
    static constexpr int LDQ = D + 8;  /* bf16 row stride of Q, K, V */
    static constexpr int LDS = TC_BC + 4; /* fp32 row stride of S */
    static constexpr int LDP = TC_BC + 8; /* bf16 row stride of P */
    static constexpr int LDO = D + 4;  /* fp32 row stride of O and PV */
    static constexpr size_t Q = 0;
    static constexpr size_t K = Q + sizeof(__nv_bfloat16) * TC_BR * LDQ;
    static constexpr size_t V = K + sizeof(__nv_bfloat16) * TC_BC * LDQ;
    static constexpr size_t S = V + sizeof(__nv_bfloat16) * TC_BC * LDQ;
    static constexpr size_t P = S + sizeof(float) * TC_BR * LDS;
    static constexpr size_t O = P + sizeof(__nv_bfloat16) * TC_BR * LDP;
    static constexpr size_t PV = O + sizeof(float) * TC_BR * LDO;
    static constexpr size_t ROW = PV + sizeof(float) * TC_BR * LDO; /* m, l, alpha [TC_BR] each */
    static constexpr size_t BYTES = ROW + sizeof(float) * 3 * TC_BR;
};

template <int D>
__global__ void __launch_bounds__(TC_WARPS * 32)
    k_attn_prefill_tc(const __nv_bfloat16 *__restrict__ kp, const __nv_bfloat16 *__restrict__ vp,
                      int64_t layer_base, int32_t block_size, int32_t n_kvh,
                      const int32_t *__restrict__ tok_pos, const int32_t *__restrict__ bt,
                      int32_t max_blocks, const int32_t *__restrict__ tiles,
                      const float *__restrict__ q, float *__restrict__ out, int32_t n_heads,
                      int32_t group, float scale) {
    using namespace nvcuda;
    typedef tc_layout<D> L;
    extern __shared__ __align__(128) unsigned char smem[];
    __nv_bfloat16 *sQ = (__nv_bfloat16 *)(smem + L::Q);
    __nv_bfloat16 *sK = (__nv_bfloat16 *)(smem + L::K);
    __nv_bfloat16 *sV = (__nv_bfloat16 *)(smem + L::V);
    float *sS = (float *)(smem + L::S);
    __nv_bfloat16 *sP = (__nv_bfloat16 *)(smem + L::P);
    float *sO = (float *)(smem + L::O);
    float *sPV = (float *)(smem + L::PV);
    float *sM = (float *)(smem + L::ROW), *sL = sM + TC_BR, *sA = sL + TC_BR;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int32_t first = tiles[3 * blockIdx.x], nq = tiles[3 * blockIdx.x + 1];
    const int32_t seq = tiles[3 * blockIdx.x + 2];
    const int32_t h = blockIdx.y, kvh = h / group;
    const int32_t *btr = bt + (int64_t)seq * max_blocks;
    const int r0 = warp * 16;

    for (int i = tid; i < TC_BR * D; i += TC_WARPS * 32) {
        const int r = i / D, d = i % D;
        const float x = r < nq ? q[((int64_t)(first + r) * n_heads + h) * D + d] * scale : 0.0f;
        sQ[r * L::LDQ + d] = f2bf(x);
        sO[r * L::LDO + d] = 0.0f;
    }
    for (int i = tid; i < TC_BR; i += TC_WARPS * 32) {
        sM[i] = -INFINITY;
        sL[i] = 0.0f;
    }
    const int32_t n_keys = tok_pos[first + nq - 1] + 1;
    /* highest position among this warp's rows (-1: no rows) */
    const int32_t warp_last = r0 < nq ? tok_pos[first + min(nq, r0 + 16) - 1] : -1;
    /* two lanes per row: row lane/2, columns (lane&1)*32 .. +31 */
    const int my_row = r0 + (lane >> 1), my_half = lane & 1;
    const int32_t my_pos = my_row < nq ? tok_pos[first + my_row] : -1;

    for (int32_t kt = 0; kt < n_keys; kt += TC_BC) {
        __syncthreads(); /* previous K/V tile consumed; Q/O initialised */
        constexpr int VEC = D / 8; /* 16-byte vectors per row */
        for (int i = tid; i < TC_BC * VEC; i += TC_WARPS * 32) {
            const int j = i / VEC, c = i % VEC;
            const int32_t pos = kt + j;
            uint4 kv4 = make_uint4(0, 0, 0, 0), vv4 = make_uint4(0, 0, 0, 0);
            if (pos < n_keys) {
                const int64_t blk = btr[pos / block_size];
                const int64_t off =
                    layer_base + ((blk * block_size + pos % block_size) * n_kvh + kvh) * D;
                kv4 = ((const uint4 *)(kp + off))[c];
                vv4 = ((const uint4 *)(vp + off))[c];
            }
            ((uint4 *)(sK + j * L::LDQ))[c] = kv4;
            ((uint4 *)(sV + j * L::LDQ))[c] = vv4;
        }
        __syncthreads();
        if (warp_last < kt) continue; /* no rows, or all masked in this tile (warp-uniform) */

        /* S = Q K^T for this warp's 16 rows x 64 keys */
        float *wS = sS + r0 * L::LDS;
        for (int nb = 0; nb < TC_BC / 16; nb++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int k = 0; k < D / 16; k++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
                wmma::load_matrix_sync(a, sQ + r0 * L::LDQ + k * 16, L::LDQ);
                wmma::load_matrix_sync(b, sK + nb * 16 * L::LDQ + k * 16, L::LDQ);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(wS + nb * 16, acc, L::LDS, wmma::mem_row_major);
        }
        __syncwarp();

        /* online softmax, two lanes per row */
        {
            const float *srow = wS + (lane >> 1) * L::LDS + my_half * 32;
            float mx = -INFINITY;
            for (int j = 0; j < 32; j++) {
                const int32_t key = kt + my_half * 32 + j;
                if (key <= my_pos) mx = fmaxf(mx, srow[j]);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            const float m_old = sM[my_row];
            const float m_new = fmaxf(m_old, mx);
            __nv_bfloat16 *prow = sP + my_row * L::LDP + my_half * 32;
            float sum = 0.0f;
            for (int j = 0; j < 32; j++) {
                const int32_t key = kt + my_half * 32 + j;
                const float p = (key <= my_pos) ? __expf(srow[j] - m_new) : 0.0f;
                prow[j] = f2bf(p);
                sum += p;
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            const float alpha = m_new == -INFINITY ? 1.0f : __expf(m_old - m_new);
            __syncwarp();
            if (my_half == 0) {
                sA[my_row] = alpha;
                sM[my_row] = m_new;
                sL[my_row] = sL[my_row] * alpha + sum;
            }
        }
        __syncwarp();

        /* PV = P V, then O = O * alpha + PV */
        float *wPV = sPV + r0 * L::LDO;
        for (int db = 0; db < D / 16; db++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int k = 0; k < TC_BC / 16; k++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
                wmma::load_matrix_sync(a, sP + r0 * L::LDP + k * 16, L::LDP);
                wmma::load_matrix_sync(b, sV + k * 16 * L::LDQ + db * 16, L::LDQ);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(wPV + db * 16, acc, L::LDO, wmma::mem_row_major);
        }
        __syncwarp();
        for (int i = lane; i < 16 * D; i += 32) {
            const int r = i / D, d = i % D;
            float *o = sO + (r0 + r) * L::LDO + d;
            *o = *o * sA[r0 + r] + wPV[r * L::LDO + d];
        }
        __syncwarp();
    }
    __syncthreads();
    for (int i = tid; i < TC_BR * D; i += TC_WARPS * 32) {
        const int r = i / D, d = i % D;
        if (r < nq)
            out[((int64_t)(first + r) * n_heads + h) * D + d] = sO[r * L::LDO + d] / sL[r];
    }
}

template <int D>
static baton_status_t launch_prefill_tc(cuda_ctx_t *c, const backend_kv_geom_t *g,
                                        const __nv_bfloat16 *kp, const __nv_bfloat16 *vp,
                                        int64_t layer_base, const cuda_attn_meta_t *m,
                                        const int32_t *tiles, int32_t n_tiles, const float *q,
                                        float *out, int32_t n_heads) {
    const size_t smem = tc_layout<D>::BYTES;
    BATON_CUDA_CHECK(cudaFuncSetAttribute(k_attn_prefill_tc<D>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)n_tiles, (unsigned)n_heads);
    k_attn_prefill_tc<D><<<grid, TC_WARPS * 32, smem, c->stream>>>(
        kp, vp, layer_base, g->block_size, g->n_kv_heads, m->tok_pos, m->block_tables,
        m->max_blocks, tiles, q, out, n_heads, n_heads / g->n_kv_heads, 1.0f / sqrtf((float)D));
    BATON_CUDA_CHECK_LAUNCH();
    return BATON_OK;
}

int cuda_prefill_tc_supported(const cuda_ctx_t *c, int32_t head_dim) {
    if (head_dim != 64 && head_dim != 128) return 0;
    size_t need = head_dim == 64 ? tc_layout<64>::BYTES : tc_layout<128>::BYTES;
    return c->prop.sharedMemPerBlockOptin >= need;
}

baton_status_t cuda_attention_prefill_tc(cuda_ctx_t *c, const backend_kv_geom_t *g,
                                         const __nv_bfloat16 *d_k_pool,
                                         const __nv_bfloat16 *d_v_pool, int32_t layer,
                                         const cuda_attn_meta_t *m, const int32_t *d_tiles,
                                         int32_t n_tiles, const float *d_q, float *d_out,
                                         int32_t n_heads) {
    if (n_tiles <= 0) return BATON_OK;
    int64_t layer_base =
        (int64_t)layer * g->n_blocks * g->block_size * g->n_kv_heads * g->head_dim;
    if (g->head_dim == 64)
        return launch_prefill_tc<64>(c, g, d_k_pool, d_v_pool, layer_base, m, d_tiles, n_tiles,
                                     d_q, d_out, n_heads);
    if (g->head_dim == 128)
        return launch_prefill_tc<128>(c, g, d_k_pool, d_v_pool, layer_base, m, d_tiles, n_tiles,
                                      d_q, d_out, n_heads);
    return baton_error(BATON_ERR_UNSUPPORTED, "cuda tensor-core attention: head_dim %d (64, 128)",
                       g->head_dim);
}
