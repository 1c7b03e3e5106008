/* KV write into paged blocks: token t of sequence s at position p goes to
 * physical block block_tables[s, p / block_size], slot p % block_size, of
 * layer `layer`. Pools are bf16 [n_layers, n_blocks, block_size, n_kv_heads,
 * head_dim] (one layer's block contiguous, the CPU pool's layout), k and v
 * fp32 [n_tokens, n_kv_heads * head_dim]. One thread per element; block ids
 * are validated on the host before launch. */
#include "kernels/cuda/common.cuh"

__global__ void k_kv_write(__nv_bfloat16 *__restrict__ kp, __nv_bfloat16 *__restrict__ vp,
                           int64_t layer_base, int32_t block_size, int32_t row,
                           const int32_t *__restrict__ tok_seq, const int32_t *__restrict__ tok_pos,
                           const int32_t *__restrict__ bt, int32_t max_blocks,
                           const float *__restrict__ k, const float *__restrict__ v,
                           int32_t n_tokens) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)n_tokens * row) return;
    int32_t t = (int32_t)(idx / row);
    int32_t e = (int32_t)(idx % row);
    int32_t p = tok_pos[t];
    int32_t blk = bt[(int64_t)tok_seq[t] * max_blocks + p / block_size];
    int64_t dst = layer_base + ((int64_t)blk * block_size + p % block_size) * row + e;
    kp[dst] = f2bf(k[idx]);
    vp[dst] = f2bf(v[idx]);
}

baton_status_t cuda_kv_write(cuda_ctx_t *c, const backend_kv_geom_t *g, __nv_bfloat16 *d_k_pool,
                             __nv_bfloat16 *d_v_pool, int32_t layer, const cuda_attn_meta_t *m,
                             const float *d_k, const float *d_v) {
    int32_t row = g->n_kv_heads * g->head_dim;
    int64_t total = (int64_t)m->n_tokens * row;
    if (total <= 0) return BATON_OK;
    int64_t layer_base = (int64_t)layer * g->n_blocks * g->block_size * row;
    k_kv_write<<<cuda_div_up(total, 256), 256, 0, c->stream>>>(
        d_k_pool, d_v_pool, layer_base, g->block_size, row, m->tok_seq, m->tok_pos,
        m->block_tables, m->max_blocks, d_k, d_v, m->n_tokens);
    BATON_CUDA_CHECK_LAUNCH();
    return BATON_OK;
}
