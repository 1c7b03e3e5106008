/* Paged KV write and causal attention over block tables (CPU, fp32 KV).
 *
 * Pool layout (kernels/backend.h): layer pool [n_blocks, block_size,
 * n_kv_heads, head_dim]; pools of all layers back to back, so (layer, block)
 * starts at backend_kv_block_offset(). Position p of a sequence lives in
 * physical block block_table[p / block_size], slot p % block_size.
 *
 * Attention is one pass with an online softmax (Milakov & Gimelshein 2018,
 * "Online normalizer calculation for softmax"; the FlashAttention
 * recurrence): per (query token, head) row a running max m, denominator l
 * and accumulator acc; each chunk of keys rescales acc and l by exp(m_old -
 * m_new). A task is (a tile of up to ATTN_TILE consecutive tokens of one
 * sequence, one KV head, a run of that KV head's query heads), so every
 * K/V row read serves all the tile's tokens and the GQA group's heads.
 * Tiles are handed out last first: under the causal mask later tokens do
 * the most work.
 *
 * Batch invariance. A row's keys are always cut into segments of a fixed
 * number of keys (ATTN_SEG_KEYS rounded up to whole blocks, absolute
 * positions 0, seg, 2 seg, ...); each segment runs its own online softmax
 * into a partial (acc, m, l) and the partials are merged in segment order
 * (split-K, as in flash-decoding). Segments, chunks and the merge depend
 * only on the row's own context length and the KV geometry, so a token's
 * output is bit-identical alone or in any batch and at any thread count.
 * What the batch and the thread count decide is only who computes the
 * segments: when there are too few (tile, head) units to feed every thread
 * (a decode step of a few long sequences), a unit's segments are spread
 * over several tasks whose partials a merge pass combines; otherwise one
 * task computes and merges all of a unit's segments in its scratch. */
#include <math.h>

#include "kernels/cpu/backend_cpu.h"

#define ATTN_CHUNK 64          /* keys scored at once, per row */
#define ATTN_TILE 16           /* query tokens of one sequence per task */
#define ATTN_MAX_GROUP_ROWS 64 /* query heads per KV head handled */
#define ATTN_SEG_KEYS 256      /* keys per softmax segment (rounded up to whole blocks) */

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
    const int32_t *tiles; /* [n_tiles, 2]: first token, token count */
    int32_t n_tiles;
    int32_t n_heads, group, heads_per_task, subs_per_kvh;
    float scale;
    /* Segments: seg_keys keys each (a multiple of block_size); the longest
     * row of the batch has max_segs. A segment's partial is [rows, hd] acc,
     * then [rows] m, [rows] l: seg_stride floats. With n_splits > 1 task
     * (unit, split) computes segments split * segs_per_split .. + segs_per_split
     * - 1 into `partial` and attn_merge_task merges them; with n_splits == 1
     * a task computes all of its unit's segments in its scratch and merges. */
    int32_t seg_keys, max_segs, n_splits, segs_per_split;
    float *partial;    /* [units, max_segs, seg_stride] */
    size_t seg_stride; /* floats per (unit, segment) */
} attn_args_t;

/* Scores of 4 query rows against one key: out[r] = q_r . k (4-wide
 * partial sums; k is loaded once for the 4 rows). */
static inline void dot4(const float *q0, const float *q1, const float *q2, const float *q3,
                        const float *k, int32_t n, float out[4]) {
    int32_t i = 0;
    cpu_v4 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (; i + 4 <= n; i += 4) {
        cpu_v4 kv = cpu_v4_load(k + i);
        s0 += cpu_v4_load(q0 + i) * kv;
        s1 += cpu_v4_load(q1 + i) * kv;
        s2 += cpu_v4_load(q2 + i) * kv;
        s3 += cpu_v4_load(q3 + i) * kv;
    }
    float r0 = (s0[0] + s0[1]) + (s0[2] + s0[3]), r1 = (s1[0] + s1[1]) + (s1[2] + s1[3]);
    float r2 = (s2[0] + s2[1]) + (s2[2] + s2[3]), r3 = (s3[0] + s3[1]) + (s3[2] + s3[3]);
    for (; i < n; i++) {
        r0 += q0[i] * k[i];
        r1 += q1[i] * k[i];
        r2 += q2[i] * k[i];
        r3 += q3[i] * k[i];
    }
    out[0] = r0, out[1] = r1, out[2] = r2, out[3] = r3;
}

/* One query row's score, in exactly dot4's per-row order (so a row's score
 * does not depend on how many rows share its task). */
static inline float dot1(const float *q0, const float *k, int32_t n) {
    int32_t i = 0;
    cpu_v4 s0 = {0};
    for (; i + 4 <= n; i += 4) {
        cpu_v4 kv = cpu_v4_load(k + i);
        s0 += cpu_v4_load(q0 + i) * kv;
    }
    float r0 = (s0[0] + s0[1]) + (s0[2] + s0[3]);
    for (; i < n; i++)
        r0 += q0[i] * k[i];
    return r0;
}

/* One query row against 4 keys: out[c] = q . k_c, each in exactly dot1's
 * order (4 independent accumulation chains instead of 1). */
static inline void dot1x4(const float *q, const float *k0, const float *k1, const float *k2,
                          const float *k3, int32_t n, float out[4]) {
    int32_t i = 0;
    cpu_v4 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (; i + 4 <= n; i += 4) {
        cpu_v4 qv = cpu_v4_load(q + i);
        s0 += qv * cpu_v4_load(k0 + i);
        s1 += qv * cpu_v4_load(k1 + i);
        s2 += qv * cpu_v4_load(k2 + i);
        s3 += qv * cpu_v4_load(k3 + i);
    }
    float r0 = (s0[0] + s0[1]) + (s0[2] + s0[3]), r1 = (s1[0] + s1[1]) + (s1[2] + s1[3]);
    float r2 = (s2[0] + s2[1]) + (s2[2] + s2[3]), r3 = (s3[0] + s3[1]) + (s3[2] + s3[3]);
    for (; i < n; i++) {
        r0 += q[i] * k0[i];
        r1 += q[i] * k1[i];
        r2 += q[i] * k2[i];
        r3 += q[i] * k3[i];
    }
    out[0] = r0, out[1] = r1, out[2] = r2, out[3] = r3;
}

/* Merges `n_segs` segment partials at `base` (seg_stride apart) of a task's
 * `rows` rows into out: with M = max_s m_s, out = sum_s exp(m_s - M) acc_s /
 * sum_s exp(m_s - M) l_s, segments in order. A segment none of whose keys a
 * row sees has m_s = -inf and is skipped (so trailing empty segments change
 * nothing). */
static void attn_merge_rows(const attn_args_t *a, const float *base, int32_t n_segs, int32_t t0,
                            int32_t h0, int32_t rows) {
    const int32_t hd = a->g->head_dim, hn = a->heads_per_task;
    for (int32_t r = 0; r < rows; r++) {
        float mx = -INFINITY;
        for (int32_t s = 0; s < n_segs; s++) {
            const float ms = base[(size_t)s * a->seg_stride + (size_t)rows * hd + r];
            mx = ms > mx ? ms : mx;
        }
        const int32_t i = r / hn, h = r % hn;
        float *o = a->out + ((int64_t)(t0 + i) * a->n_heads + h0 + h) * hd;
        memset(o, 0, (size_t)hd * sizeof(float));
        float den = 0.0f;
        for (int32_t s = 0; s < n_segs; s++) {
            const float *p = base + (size_t)s * a->seg_stride;
            const float ms = p[(size_t)rows * hd + r], ls = p[(size_t)rows * hd + rows + r];
            if (ms == -INFINITY)
                continue;
            const float w = expf(ms - mx);
            den += w * ls;
            cpu_vec_axpy(o, w, p + (size_t)r * hd, hd);
        }
        const float inv = 1.0f / den; /* the segment holding the max has w = 1, l >= 1 */
        for (int32_t d = 0; d < hd; d++)
            o[d] *= inv;
    }
}

/* One task: a tile of up to ATTN_TILE consecutive tokens of one sequence x
 * one KV head x `hn` of its query heads, and a range of key segments. Row r
 * = i * hn + h is query token i of the tile, head h0 + h; it sees keys
 * 0..tok_pos + 1 - 1. Keys are walked block by block in chunks of
 * ATTN_CHUNK; each K/V row is read once for all rows of the tile. */
static void attn_task(void *argp, int64_t task, int worker) {
    const attn_args_t *a = argp;
    const backend_kv_geom_t *g = a->g;
    const backend_attn_batch_t *b = a->b;
    const int32_t hd = g->head_dim, bs = g->block_size, hn = a->heads_per_task;
    const int64_t unit = task / a->n_splits;
    const int32_t split = (int32_t)(task % a->n_splits);
    const int64_t per_tile = (int64_t)g->n_kv_heads * a->subs_per_kvh;
    const int32_t tile = a->n_tiles - 1 - (int32_t)(unit / per_tile); /* last (heaviest) first */
    const int32_t kvh = (int32_t)(unit % per_tile) / a->subs_per_kvh;
    const int32_t h0 = kvh * a->group + (int32_t)(unit % per_tile) % a->subs_per_kvh * hn;
    const int32_t t0 = a->tiles[2 * tile], nq = a->tiles[2 * tile + 1];
    const int32_t rows = nq * hn;

    float *ws = a->scratch + (size_t)worker * a->scratch_floats;
    float *sc = ws; /* [rows, ATTN_CHUNK] scores */
    const float *qr[ATTN_TILE * ATTN_MAX_GROUP_ROWS];
    int32_t nkv[ATTN_TILE * ATTN_MAX_GROUP_ROWS]; /* keys visible to each row */
    int32_t n_kv = 0;                             /* keys any row sees */
    for (int32_t i = 0; i < nq; i++) {
        const int32_t visible = b->tok_pos[t0 + i] + 1;
        n_kv = visible > n_kv ? visible : n_kv;
        for (int32_t h = 0; h < hn; h++) {
            qr[i * hn + h] = a->q + ((int64_t)(t0 + i) * a->n_heads + h0 + h) * hd;
            nkv[i * hn + h] = visible;
        }
    }
    /* segments [seg_lo, seg_hi) of this task, partials at `base` */
    int32_t seg_lo, seg_hi;
    float *base;
    if (a->n_splits > 1) {
        seg_lo = split * a->segs_per_split;
        seg_hi = seg_lo + a->segs_per_split < a->max_segs ? seg_lo + a->segs_per_split : a->max_segs;
        base = a->partial + (size_t)unit * a->max_segs * a->seg_stride;
    } else {
        seg_lo = 0;
        seg_hi = (n_kv + a->seg_keys - 1) / a->seg_keys;
        base = ws + (size_t)rows * ATTN_CHUNK;
    }

    const int64_t row = (int64_t)g->n_kv_heads * hd; /* floats per slot */
    const int64_t block_elems = (int64_t)bs * row;
    const int32_t *bt = b->block_tables + (int64_t)b->tok_seq[t0] * b->max_blocks;

    for (int32_t seg = seg_lo; seg < seg_hi; seg++) {
        float *acc = base + (size_t)seg * a->seg_stride; /* [rows, hd] */
        float *m = acc + (size_t)rows * hd, *l = m + rows; /* [rows] each */
        for (int32_t r = 0; r < rows; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
        }
        memset(acc, 0, (size_t)rows * hd * sizeof(float));
        /* this segment's keys: [key_lo, key_hi), key_lo a multiple of block_size */
        const int32_t key_lo = seg * a->seg_keys;
        const int32_t key_hi = (int64_t)key_lo + a->seg_keys < n_kv ? key_lo + a->seg_keys : n_kv;
        for (int32_t j0 = key_lo; j0 < key_hi; j0 += bs) {
            const int64_t blk_off = (int64_t)bt[j0 / bs] * block_elems + (int64_t)kvh * hd;
            const float *kb = a->k_layer + blk_off, *vb = a->v_layer + blk_off;
            const int32_t blen = key_hi - j0 < bs ? key_hi - j0 : bs;
            for (int32_t c0 = 0; c0 < blen; c0 += ATTN_CHUNK) {
                const int32_t cn = blen - c0 < ATTN_CHUNK ? blen - c0 : ATTN_CHUNK;
                const int32_t jc = j0 + c0; /* absolute position of the chunk's first key */
                /* scores; rows that see no key of this chunk are skipped.
                 * Groups of 4 rows share each key load (dot4); the other
                 * rows take 4 keys at a time (dot1x4); both give a row's
                 * score in dot1's order. */
                const int32_t rows4 = rows & ~3;
                for (int32_t c = 0; c < cn; c++) {
                    const float *kr = kb + (int64_t)(c0 + c) * row;
                    for (int32_t r = 0; r < rows4; r += 4) {
                        float d[4];
                        dot4(qr[r], qr[r + 1], qr[r + 2], qr[r + 3], kr, hd, d);
                        for (int32_t u = 0; u < 4; u++)
                            sc[(r + u) * ATTN_CHUNK + c] =
                                jc + c < nkv[r + u] ? d[u] * a->scale : -INFINITY;
                    }
                }
                for (int32_t r = rows4; r < rows; r++) {
                    int32_t c = 0;
                    for (; c + 4 <= cn; c += 4) {
                        const float *kr = kb + (int64_t)(c0 + c) * row;
                        float d[4];
                        dot1x4(qr[r], kr, kr + row, kr + 2 * row, kr + 3 * row, hd, d);
                        for (int32_t u = 0; u < 4; u++)
                            sc[r * ATTN_CHUNK + c + u] =
                                jc + c + u < nkv[r] ? d[u] * a->scale : -INFINITY;
                    }
                    for (; c < cn; c++)
                        sc[r * ATTN_CHUNK + c] = jc + c < nkv[r]
                                                     ? dot1(qr[r], kb + (int64_t)(c0 + c) * row, hd) * a->scale
                                                     : -INFINITY;
                }
                /* online softmax update */
                for (int32_t r = 0; r < rows; r++) {
                    if (nkv[r] <= jc)
                        continue;
                    float *s = sc + r * ATTN_CHUNK;
                    float mx = m[r];
                    for (int32_t c = 0; c < cn; c++)
                        mx = s[c] > mx ? s[c] : mx;
                    const float corr = expf(m[r] - mx); /* 0 on the first chunk (m = -inf) */
                    float sum = 0.0f;
                    for (int32_t c = 0; c < cn; c++) {
                        s[c] = expf(s[c] - mx); /* masked: exp(-inf) = 0 */
                        sum += s[c];
                    }
                    l[r] = l[r] * corr + sum;
                    m[r] = mx;
                    if (corr != 1.0f)
                        for (int32_t i = 0; i < hd; i++)
                            acc[(int64_t)r * hd + i] *= corr;
                }
                /* acc += p V */
                for (int32_t c = 0; c < cn; c++) {
                    const float *vr = vb + (int64_t)(c0 + c) * row;
                    for (int32_t r = 0; r < rows; r++)
                        if (jc + c < nkv[r])
                            cpu_vec_axpy(acc + (int64_t)r * hd, sc[r * ATTN_CHUNK + c], vr, hd);
                }
            }
        }
    }
    if (a->n_splits == 1)
        attn_merge_rows(a, base, seg_hi, t0, h0, rows);
}

/* Merges one unit's segment partials after split tasks computed them. */
static void attn_merge_task(void *argp, int64_t unit, int worker) {
    const attn_args_t *a = argp;
    const int32_t hn = a->heads_per_task;
    const int64_t per_tile = (int64_t)a->g->n_kv_heads * a->subs_per_kvh;
    const int32_t tile = a->n_tiles - 1 - (int32_t)(unit / per_tile);
    const int32_t kvh = (int32_t)(unit % per_tile) / a->subs_per_kvh;
    const int32_t h0 = kvh * a->group + (int32_t)(unit % per_tile) % a->subs_per_kvh * hn;
    const int32_t t0 = a->tiles[2 * tile], nq = a->tiles[2 * tile + 1];
    attn_merge_rows(a, a->partial + (size_t)unit * a->max_segs * a->seg_stride, a->max_segs, t0, h0,
                    nq * hn);
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
    if (!q || !out || !b->seq_first_tok || !b->seq_n_tok)
        return baton_error(BATON_ERR_INVALID_ARG, "cpu attention: q, out or sequence ranges NULL");
    /* Each sequence's tokens are seq_first_tok[s] .. + seq_n_tok[s] - 1, all
     * tagged s, and the ranges cover the batch: every token is computed
     * exactly once. */
    int64_t covered = 0;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        const int32_t f = b->seq_first_tok[s], n = b->seq_n_tok[s];
        if (n < 0 || f < 0 || (int64_t)f + n > b->n_tokens)
            return baton_error(BATON_ERR_OUT_OF_RANGE, "cpu attention: seq %d tokens %d..+%d outside the batch",
                               s, f, n);
        for (int32_t t = f; t < f + n; t++)
            if (b->tok_seq[t] != s)
                return baton_error(BATON_ERR_INVALID_ARG, "cpu attention: token %d in seq %d's range has tok_seq %d",
                                   t, s, b->tok_seq[t]);
        covered += n;
    }
    if (covered != b->n_tokens)
        return baton_error(BATON_ERR_INVALID_ARG, "cpu attention: sequence ranges cover %lld of %d tokens",
                           (long long)covered, b->n_tokens);
    const int32_t group = n_heads / g->n_kv_heads;
    if (group > ATTN_MAX_GROUP_ROWS)
        return baton_error(BATON_ERR_UNSUPPORTED, "cpu attention: %d query heads per KV head > %d", group,
                           ATTN_MAX_GROUP_ROWS);
    cpu_ctx_t *c = cpu_ctx(be);
    /* Tiles of up to ATTN_TILE tokens of one sequence. */
    int64_t n_tiles = 0;
    for (int32_t s = 0; s < b->n_seqs; s++)
        n_tiles += (b->seq_n_tok[s] + ATTN_TILE - 1) / ATTN_TILE;
    st = cpu_tiles_reserve(c, (size_t)n_tiles * 2);
    if (st != BATON_OK)
        return st;
    int32_t *tiles = c->tiles, nt = 0;
    for (int32_t s = 0; s < b->n_seqs; s++)
        for (int32_t i = 0; i < b->seq_n_tok[s]; i += ATTN_TILE) {
            tiles[2 * nt] = b->seq_first_tok[s] + i;
            tiles[2 * nt + 1] = b->seq_n_tok[s] - i < ATTN_TILE ? b->seq_n_tok[s] - i : ATTN_TILE;
            nt++;
        }
    /* Whole GQA groups per task when that still gives every thread work;
     * otherwise one query head per task. */
    const int32_t subs = (int64_t)nt * g->n_kv_heads >= 4 * (int64_t)c->n_threads ? 1 : group;
    const int32_t hn = group / subs;
    const size_t rows = (size_t)ATTN_TILE * hn;
    /* Segments: fixed by the geometry (ATTN_SEG_KEYS rounded up to whole
     * blocks), never by the batch or the thread count. */
    const int32_t seg_blocks = (ATTN_SEG_KEYS + g->block_size - 1) / g->block_size;
    const int32_t seg_keys = seg_blocks * g->block_size;
    int32_t max_ctx = 0;
    for (int32_t t = 0; t < b->n_tokens; t++)
        max_ctx = b->tok_pos[t] + 1 > max_ctx ? b->tok_pos[t] + 1 : max_ctx;
    const int32_t max_segs = (int32_t)(((int64_t)max_ctx + seg_keys - 1) / seg_keys);
    const size_t seg_stride = rows * g->head_dim + 2 * rows;
    /* Parallel split (who computes the segments, not how): when the units
     * cannot keep the threads busy, a unit's segments are spread over up to
     * `want` tasks and merged in a second pass. */
    const int64_t units = (int64_t)nt * g->n_kv_heads * subs;
    int32_t n_splits = 1, segs_per_split = max_segs;
    if (c->n_threads > 1 && units < 2 * (int64_t)c->n_threads && max_segs > 1) {
        int64_t want = (2 * (int64_t)c->n_threads + units - 1) / units;
        if (want > max_segs)
            want = max_segs;
        segs_per_split = (int32_t)((max_segs + want - 1) / want);
        n_splits = (max_segs + segs_per_split - 1) / segs_per_split;
    }
    if (n_splits > 1) {
        st = cpu_partial_reserve(c, (size_t)units * max_segs * seg_stride);
        if (st == BATON_OK)
            st = cpu_scratch_reserve(c, rows * ATTN_CHUNK);
    } else {
        st = cpu_scratch_reserve(c, rows * ATTN_CHUNK + (size_t)max_segs * seg_stride);
    }
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
        .tiles = tiles,
        .n_tiles = nt,
        .n_heads = n_heads,
        .group = group,
        .heads_per_task = hn,
        .subs_per_kvh = subs,
        .scale = 1.0f / sqrtf((float)g->head_dim),
        .seg_keys = seg_keys,
        .max_segs = max_segs,
        .n_splits = n_splits,
        .segs_per_split = segs_per_split,
        .partial = c->partial,
        .seg_stride = seg_stride,
    };
    cpu_pool_run(c->pool, units * n_splits, attn_task, &a);
    if (n_splits > 1)
        cpu_pool_run(c->pool, units, attn_merge_task, &a);
    return BATON_OK;
}
