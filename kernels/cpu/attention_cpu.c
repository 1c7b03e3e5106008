/* Paged KV write and causal attention over block tables (CPU, fp32 KV).
 *
 * Pool layout (kernels/backend.h): layer pool [n_blocks, block_size,
 * n_kv_heads, head_dim]; pools of all layers back to back, so (layer, block)
 * starts at backend_kv_block_offset(). Position p of a sequence lives in
 * physical block block_table[p / block_size], slot p % block_size.
 *
 * Attention is one pass with an online softmax (Milakov & Gimelshein 2018,
 * "Online normalizer calculation for softmax"; the FlashAttention
 * recurrence): per query head a running max m, denominator l and
 * accumulator acc; each chunk of keys rescales acc and l by exp(m_old -
 * m_new). A task is (token, KV head, a run of that KV head's query heads),
 * so a GQA group reads each K/V row once. Tasks are handed out last token
 * first: under the causal mask later tokens do the most work. */
#include <math.h>

#include "kernels/cpu/backend_cpu.h"

#define ATTN_CHUNK 64 /* keys scored at once, per head */

/* Validates geometry, layer and batch metadata so that every block-table
 * lookup below is in range. Nothing is written before this passes. */
static baton_status_t kv_validate(const char *op, const backend_kv_geom_t *g, const void *k_pool,
                                  const void *v_pool, int32_t layer, const backend_attn_batch_t *b) {
    if (!g || !b || !k_pool || !v_pool)
        return baton_error(BATON_ERR_INVALID_ARG, "cpu %s: NULL argument", op);
    if (g->n_layers <= 0 || g->n_blocks <= 0 || g->block_size <= 0 || g->n_kv_heads <= 0 ||
        g->head_dim <= 0)
        return baton_error(BATON_ERR_INVALID_ARG,
                           "cpu %s: bad KV geometry (layers %d, blocks %d, block_size %d, kv_heads %d, head_dim %d)",
                           op, g->n_layers, g->n_blocks, g->block_size, g->n_kv_heads, g->head_dim);
    if (g->dtype != BACKEND_DTYPE_F32)
        return baton_error(BATON_ERR_UNSUPPORTED, "cpu %s: KV dtype %s (the CPU backend keeps f32 KV)",
                           op, backend_dtype_name(g->dtype));
    if (layer < 0 || layer >= g->n_layers)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "cpu %s: layer %d outside 0..%d", op, layer,
                           g->n_layers - 1);
    if (b->n_tokens < 0 || b->n_seqs < 0)
        return baton_error(BATON_ERR_INVALID_ARG, "cpu %s: n_tokens %d, n_seqs %d", op, b->n_tokens,
                           b->n_seqs);
    if (b->n_tokens == 0)
        return BATON_OK;
    if (b->n_seqs == 0 || b->max_blocks <= 0 || !b->tok_seq || !b->tok_pos || !b->seq_n_ctx ||
        !b->block_tables)
        return baton_error(BATON_ERR_INVALID_ARG, "cpu %s: batch metadata missing (n_seqs %d, max_blocks %d)",
                           op, b->n_seqs, b->max_blocks);
    const int64_t max_ctx = (int64_t)b->max_blocks * g->block_size;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        int32_t n_ctx = b->seq_n_ctx[s];
        if (n_ctx < 0 || n_ctx > max_ctx)
            return baton_error(BATON_ERR_OUT_OF_RANGE, "cpu %s: seq %d n_ctx %d outside 0..%lld", op, s,
                               n_ctx, (long long)max_ctx);
        const int32_t *bt = b->block_tables + (int64_t)s * b->max_blocks;
        int32_t nb = (n_ctx + g->block_size - 1) / g->block_size;
        for (int32_t i = 0; i < nb; i++)
            if (bt[i] < 0 || bt[i] >= g->n_blocks)
                return baton_error(BATON_ERR_OUT_OF_RANGE,
                                   "cpu %s: seq %d block_table[%d] = %d outside 0..%d", op, s, i, bt[i],
                                   g->n_blocks - 1);
    }
    for (int32_t t = 0; t < b->n_tokens; t++) {
        int32_t s = b->tok_seq[t];
        if (s < 0 || s >= b->n_seqs)
            return baton_error(BATON_ERR_OUT_OF_RANGE, "cpu %s: tok_seq[%d] = %d outside 0..%d", op, t, s,
                               b->n_seqs - 1);
        if (b->tok_pos[t] < 0 || b->tok_pos[t] >= b->seq_n_ctx[s])
            return baton_error(BATON_ERR_OUT_OF_RANGE, "cpu %s: tok_pos[%d] = %d outside seq %d's 0..%d",
                               op, t, b->tok_pos[t], s, b->seq_n_ctx[s] - 1);
    }
    return BATON_OK;
}

baton_status_t cpu_kv_write(backend_t *be, const backend_kv_geom_t *g, void *k_pool, void *v_pool,
                            int32_t layer, const backend_attn_batch_t *b, const float *k,
                            const float *v) {
    baton_status_t st = kv_validate("kv_write", g, k_pool, v_pool, layer, b);
    if (st != BATON_OK)
        return st;
    if (b->n_tokens > 0 && (!k || !v))
        return baton_error(BATON_ERR_INVALID_ARG, "cpu kv_write: k or v is NULL");
    const int64_t row = (int64_t)g->n_kv_heads * g->head_dim; /* floats per token */
    const size_t row_bytes = (size_t)row * sizeof(float);
    for (int32_t t = 0; t < b->n_tokens; t++) {
        int32_t s = b->tok_seq[t], p = b->tok_pos[t];
        int32_t blk = b->block_tables[(int64_t)s * b->max_blocks + p / g->block_size];
        size_t off = backend_kv_block_offset(g, layer, blk) + (size_t)(p % g->block_size) * row_bytes;
        memcpy((char *)k_pool + off, k + t * row, row_bytes);
        memcpy((char *)v_pool + off, v + t * row, row_bytes);
    }
    return BATON_OK;
}

typedef struct {
    const backend_kv_geom_t *g;
    const backend_attn_batch_t *b;
    const float *k_layer, *v_layer; /* layer `layer` of each pool */
    const float *q;
    float *out;
    float *scratch;
    size_t scratch_floats;
    int32_t n_heads, group, heads_per_task, subs_per_kvh;
    float scale;
} attn_args_t;

static void attn_task(void *argp, int64_t task, int worker) {
    const attn_args_t *a = argp;
    const backend_kv_geom_t *g = a->g;
    const backend_attn_batch_t *b = a->b;
    const int32_t hd = g->head_dim, bs = g->block_size, hn = a->heads_per_task;
    const int64_t per_tok = (int64_t)g->n_kv_heads * a->subs_per_kvh;
    const int32_t t = b->n_tokens - 1 - (int32_t)(task / per_tok);
    const int32_t kvh = (int32_t)(task % per_tok) / a->subs_per_kvh;
    const int32_t h0 = kvh * a->group + (int32_t)(task % per_tok) % a->subs_per_kvh * hn;

    float *acc = a->scratch + (size_t)worker * a->scratch_floats; /* [hn, hd] */
    float *sc = acc + (size_t)hn * hd;                             /* [hn, ATTN_CHUNK] */
    float *m = sc + (size_t)hn * ATTN_CHUNK;                       /* [hn] */
    float *l = m + hn;                                             /* [hn] */
    const float *q = a->q + ((int64_t)t * a->n_heads + h0) * hd;   /* [hn, hd] */
    for (int32_t h = 0; h < hn; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
    }
    memset(acc, 0, (size_t)hn * hd * sizeof(float));

    const int64_t row = (int64_t)g->n_kv_heads * hd;     /* floats per slot */
    const int64_t block_elems = (int64_t)bs * row;
    const int32_t *bt = b->block_tables + (int64_t)b->tok_seq[t] * b->max_blocks;
    const int32_t n_kv = b->tok_pos[t] + 1;

    for (int32_t j0 = 0; j0 < n_kv; j0 += bs) {
        const int64_t blk_off = (int64_t)bt[j0 / bs] * block_elems + (int64_t)kvh * hd;
        const float *kb = a->k_layer + blk_off, *vb = a->v_layer + blk_off;
        const int32_t blen = n_kv - j0 < bs ? n_kv - j0 : bs;
        for (int32_t c0 = 0; c0 < blen; c0 += ATTN_CHUNK) {
            const int32_t cn = blen - c0 < ATTN_CHUNK ? blen - c0 : ATTN_CHUNK;
            for (int32_t c = 0; c < cn; c++) {
                const float *kr = kb + (int64_t)(c0 + c) * row;
                for (int32_t h = 0; h < hn; h++)
                    sc[h * ATTN_CHUNK + c] = cpu_vec_dot(q + (int64_t)h * hd, kr, hd) * a->scale;
            }
            for (int32_t h = 0; h < hn; h++) {
                float *s = sc + h * ATTN_CHUNK;
                float mx = m[h];
                for (int32_t c = 0; c < cn; c++)
                    mx = s[c] > mx ? s[c] : mx;
                float corr = expf(m[h] - mx); /* 0 on the first chunk (m = -inf) */
                float sum = 0.0f;
                for (int32_t c = 0; c < cn; c++) {
                    s[c] = expf(s[c] - mx);
                    sum += s[c];
                }
                l[h] = l[h] * corr + sum;
                m[h] = mx;
                if (corr != 1.0f)
                    for (int32_t i = 0; i < hd; i++)
                        acc[(int64_t)h * hd + i] *= corr;
            }
            for (int32_t c = 0; c < cn; c++) {
                const float *vr = vb + (int64_t)(c0 + c) * row;
                for (int32_t h = 0; h < hn; h++)
                    cpu_vec_axpy(acc + (int64_t)h * hd, sc[h * ATTN_CHUNK + c], vr, hd);
            }
        }
    }
    float *o = a->out + ((int64_t)t * a->n_heads + h0) * hd;
    for (int32_t h = 0; h < hn; h++) {
        const float inv = 1.0f / l[h]; /* l >= 1: the max term contributes exp(0) */
        for (int32_t i = 0; i < hd; i++)
            o[(int64_t)h * hd + i] = acc[(int64_t)h * hd + i] * inv;
    }
}

baton_status_t cpu_attention(backend_t *be, const backend_kv_geom_t *g, const void *k_pool,
                             const void *v_pool, int32_t layer, const backend_attn_batch_t *b,
                             const float *q, float *out, int32_t n_heads) {
    baton_status_t st = kv_validate("attention", g, k_pool, v_pool, layer, b);
    if (st != BATON_OK)
        return st;
    if (n_heads <= 0 || n_heads % g->n_kv_heads != 0)
        return baton_error(BATON_ERR_INVALID_ARG, "cpu attention: n_heads %d not a multiple of n_kv_heads %d",
                           n_heads, g->n_kv_heads);
    if (b->n_tokens == 0)
        return BATON_OK;
    if (!q || !out)
        return baton_error(BATON_ERR_INVALID_ARG, "cpu attention: q or out is NULL");
    for (int32_t t = 0; t < b->n_tokens; t++)
        if (b->seq_n_ctx[b->tok_seq[t]] < 1)
            return baton_error(BATON_ERR_OUT_OF_RANGE, "cpu attention: token %d's sequence has no KV", t);
    cpu_ctx_t *c = cpu_ctx(be);
    const int32_t group = n_heads / g->n_kv_heads;
    /* Whole GQA groups per task when that still gives every thread work;
     * otherwise one query head per task. */
    int32_t subs = (int64_t)b->n_tokens * g->n_kv_heads >= 4 * (int64_t)c->n_threads ? 1 : group;
    const int32_t hn = group / subs;
    st = cpu_scratch_reserve(c, (size_t)hn * g->head_dim + (size_t)hn * ATTN_CHUNK + 2 * (size_t)hn);
    if (st != BATON_OK)
        return st;
    const size_t layer_elems = (size_t)g->n_blocks * g->block_size * g->n_kv_heads * g->head_dim;
    attn_args_t a = {
        .g = g,
        .b = b,
        .k_layer = (const float *)k_pool + (size_t)layer * layer_elems,
        .v_layer = (const float *)v_pool + (size_t)layer * layer_elems,
        .q = q,
        .out = out,
        .scratch = c->scratch,
        .scratch_floats = c->scratch_floats,
        .n_heads = n_heads,
        .group = group,
        .heads_per_task = hn,
        .subs_per_kvh = subs,
        .scale = 1.0f / sqrtf((float)g->head_dim),
    };
    cpu_pool_run(c->pool, (int64_t)b->n_tokens * g->n_kv_heads * subs, attn_task, &a);
    return BATON_OK;
}
