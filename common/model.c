/* Model load and the forward over a mixed prefill/decode batch (model.h).
 *
 * The forward is written once against kernels/backend.h: every activation
 * lives in backend memory, and only the per-step metadata (token ids,
 * positions, block tables) and the final logits cross to the host. Scratch
 * activations are allocated once at load for max_batch_tokens. */
#include "common/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

typedef struct model_layer {
    backend_weight_t *attn_norm; /* [1, n_embd] */
    backend_weight_t *wq;        /* [n_head*head_dim, n_embd] */
    backend_weight_t *wk;        /* [n_head_kv*head_dim, n_embd] */
    backend_weight_t *wv;        /* [n_head_kv*head_dim, n_embd] */
    backend_weight_t *bq, *bk, *bv; /* [1, out] qwen2 only, else NULL */
    backend_weight_t *wo;        /* [n_embd, n_head*head_dim] */
    backend_weight_t *ffn_norm;  /* [1, n_embd] */
    backend_weight_t *w_gate;    /* [n_ff, n_embd] */
    backend_weight_t *w_up;      /* [n_ff, n_embd] */
    backend_weight_t *w_down;    /* [n_embd, n_ff] */
} model_layer_t;

struct model {
    model_hparams_t hp;
    model_load_params_t lp;
    backend_t *be;
    backend_weight_t *tok_embd;    /* [n_vocab, n_embd] */
    backend_weight_t *output_norm; /* [1, n_embd] */
    backend_weight_t *output;      /* [n_vocab, n_embd]; == tok_embd when tied */
    float *rope_freqs;             /* host [head_dim/2] or NULL */
    model_layer_t *layers;         /* [n_layer] */

    /* backend scratch, T = max_batch_tokens, R = max_logit_rows */
    float *x;      /* [T, n_embd] residual stream */
    float *h;      /* [T, n_embd] normed input of a block */
    float *q;      /* [T, n_head*head_dim] */
    float *k;      /* [T, n_head_kv*head_dim] */
    float *v;      /* [T, n_head_kv*head_dim] */
    float *att;    /* [T, n_head*head_dim] attention output */
    float *proj;   /* [T, n_embd] projection output */
    float *gate;   /* [T, n_ff] */
    float *up;     /* [T, n_ff] */
    float *sel;    /* [R, n_embd] rows that need logits */
    float *logits; /* [R, n_vocab] */

    /* host metadata scratch */
    int32_t *tokens;     /* [T] */
    int32_t *tok_seq;    /* [T] */
    int32_t *tok_pos;    /* [T] */
    int32_t *seq_first;  /* [T] (n_seqs <= T) */
    int32_t *seq_n_tok;  /* [T] */
    int32_t *seq_n_ctx;  /* [T] */
    int32_t *out_rows;   /* [T] token rows whose logits are wanted */
    int32_t *block_tables; /* [T, bt_stride] */
    int64_t bt_cap;      /* int32 entries allocated in block_tables */
};

model_load_params_t model_load_params_default(void) {
    model_load_params_t p = {.max_batch_tokens = 512, .max_logit_rows = 64};
    return p;
}

const model_hparams_t *model_hparams(const model_t *m) { return &m->hp; }
backend_t *model_backend(const model_t *m) { return m->be; }

/* ---------------------------------------------------------------- load */

static baton_status_t get_u32_key(const gguf_file_t *f, const char *arch, const char *suffix,
                                  bool required, uint32_t dflt, uint32_t *out) {
    char key[160];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    baton_status_t st = gguf_get_u32(f, key, out);
    if (st == BATON_ERR_NOT_FOUND) {
        if (required) return baton_error(BATON_ERR_NOT_FOUND, "model: missing key %s", key);
        *out = dflt;
        return BATON_OK;
    }
    if (st != BATON_OK)
        return baton_error(st, "model: key %s: %s", key, baton_last_error());
    return BATON_OK;
}

static baton_status_t get_f32_key(const gguf_file_t *f, const char *arch, const char *suffix,
                                  bool required, float dflt, float *out) {
    char key[160];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    baton_status_t st = gguf_get_f32(f, key, out);
    if (st == BATON_ERR_NOT_FOUND) {
        if (required) return baton_error(BATON_ERR_NOT_FOUND, "model: missing key %s", key);
        *out = dflt;
        return BATON_OK;
    }
    if (st != BATON_OK)
        return baton_error(st, "model: key %s: %s", key, baton_last_error());
    if (!isfinite(*out))
        return baton_error(BATON_ERR_FORMAT, "model: key %s is not finite", key);
    return BATON_OK;
}

static baton_status_t read_hparams(const gguf_file_t *f, model_hparams_t *hp) {
    gguf_str_t arch_s;
    baton_status_t st = gguf_get_str(f, "general.architecture", &arch_s);
    if (st == BATON_ERR_NOT_FOUND)
        return baton_error(BATON_ERR_NOT_FOUND, "model: missing key general.architecture");
    if (st != BATON_OK) return st;
    const char *arch;
    if (gguf_str_eq(arch_s, "llama")) {
        hp->arch = MODEL_ARCH_LLAMA;
        arch = "llama";
    } else if (gguf_str_eq(arch_s, "qwen2")) {
        hp->arch = MODEL_ARCH_QWEN2;
        arch = "qwen2";
    } else {
        return baton_error(BATON_ERR_UNSUPPORTED,
                           "model: architecture '%.*s' is not supported (llama, qwen2)",
                           (int)(arch_s.len > 64 ? 64 : arch_s.len), arch_s.data);
    }
    uint32_t n_layer, n_embd, n_ff, n_head, n_head_kv, n_ctx, n_rot;
    if ((st = get_u32_key(f, arch, "block_count", true, 0, &n_layer)) ||
        (st = get_u32_key(f, arch, "embedding_length", true, 0, &n_embd)) ||
        (st = get_u32_key(f, arch, "feed_forward_length", true, 0, &n_ff)) ||
        (st = get_u32_key(f, arch, "attention.head_count", true, 0, &n_head)) ||
        (st = get_u32_key(f, arch, "attention.head_count_kv", false, n_head, &n_head_kv)) ||
        (st = get_u32_key(f, arch, "context_length", true, 0, &n_ctx)))
        return st;
    const uint32_t lim = 1u << 20;
#define HP_RANGE(v, name)                                                                   \
    if ((v) == 0 || (v) > lim)                                                              \
        return baton_error(BATON_ERR_FORMAT, "model: %s.%s = %u is out of range (1..%u)",    \
                           arch, name, (unsigned)(v), lim);
    HP_RANGE(n_layer, "block_count");
    HP_RANGE(n_embd, "embedding_length");
    HP_RANGE(n_ff, "feed_forward_length");
    HP_RANGE(n_head, "attention.head_count");
    HP_RANGE(n_head_kv, "attention.head_count_kv");
    HP_RANGE(n_ctx, "context_length");
#undef HP_RANGE
    if (n_embd % n_head != 0 || (n_embd / n_head) % 2 != 0)
        return baton_error(BATON_ERR_FORMAT,
                           "model: %s.embedding_length %u is not an even multiple of head_count %u",
                           arch, n_embd, n_head);
    if (n_head % n_head_kv != 0)
        return baton_error(BATON_ERR_FORMAT,
                           "model: %s.attention.head_count %u is not a multiple of head_count_kv %u",
                           arch, n_head, n_head_kv);
    uint32_t head_dim = n_embd / n_head;
    if ((st = get_u32_key(f, arch, "rope.dimension_count", false, head_dim, &n_rot))) return st;
    if (n_rot != head_dim)
        return baton_error(BATON_ERR_UNSUPPORTED,
                           "model: %s.rope.dimension_count %u != head_dim %u (partial rotary)",
                           arch, n_rot, head_dim);
    float eps, base, scale = 1.0f;
    if ((st = get_f32_key(f, arch, "attention.layer_norm_rms_epsilon", true, 0, &eps)) ||
        (st = get_f32_key(f, arch, "rope.freq_base", false, 10000.0f, &base)))
        return st;
    if (!(eps > 0.0f && eps < 1.0f))
        return baton_error(BATON_ERR_FORMAT,
                           "model: %s.attention.layer_norm_rms_epsilon %g out of range (0, 1)",
                           arch, (double)eps);
    if (!(base > 0.0f))
        return baton_error(BATON_ERR_FORMAT, "model: %s.rope.freq_base %g must be > 0", arch,
                           (double)base);
    char key[160];
    snprintf(key, sizeof(key), "%s.rope.scaling.type", arch);
    gguf_str_t stype;
    st = gguf_get_str(f, key, &stype);
    if (st == BATON_OK) {
        if (gguf_str_eq(stype, "linear")) {
            float factor;
            if ((st = get_f32_key(f, arch, "rope.scaling.factor", true, 0, &factor))) return st;
            if (!(factor > 0.0f))
                return baton_error(BATON_ERR_FORMAT, "model: %s.rope.scaling.factor %g must be > 0",
                                   arch, (double)factor);
            scale = 1.0f / factor;
        } else if (!gguf_str_eq(stype, "none")) {
            return baton_error(BATON_ERR_UNSUPPORTED,
                               "model: %s = '%.*s' is not supported (none, linear)", key,
                               (int)(stype.len > 32 ? 32 : stype.len), stype.data);
        }
    } else if (st != BATON_ERR_NOT_FOUND) {
        return baton_error(st, "model: key %s: %s", key, baton_last_error());
    } else {
        float lin;
        if ((st = get_f32_key(f, arch, "rope.scale_linear", false, 0.0f, &lin))) return st;
        if (lin < 0.0f)
            return baton_error(BATON_ERR_FORMAT, "model: %s.rope.scale_linear %g must be > 0",
                               arch, (double)lin);
        if (lin > 0.0f) scale = 1.0f / lin;
    }
    hp->n_layer = (int32_t)n_layer;
    hp->n_embd = (int32_t)n_embd;
    hp->n_ff = (int32_t)n_ff;
    hp->n_head = (int32_t)n_head;
    hp->n_head_kv = (int32_t)n_head_kv;
    hp->head_dim = (int32_t)head_dim;
    hp->n_ctx_train = (int32_t)n_ctx;
    hp->rms_eps = eps;
    hp->rope_freq_base = base;
    hp->rope_freq_scale = scale;
    hp->rope_neox = hp->arch == MODEL_ARCH_QWEN2;
    return BATON_OK;
}

/* Finds `name` and checks its shape is [rows, cols] (ne[0] = cols); rows = 1
 * means a vector of cols. Returns NULL with a detail when absent/wrong. */
static baton_status_t find_tensor(const gguf_file_t *f, const char *name, int64_t rows,
                                  int64_t cols, bool required, const gguf_tensor_t **out) {
    const gguf_tensor_t *t = gguf_find_tensor(f, name);
    if (!t) {
        if (!required) {
            *out = NULL;
            return BATON_OK;
        }
        return baton_error(BATON_ERR_NOT_FOUND, "model: missing tensor %s", name);
    }
    bool ok;
    if (rows == 1)
        ok = t->ne[0] == cols && t->ne[1] == 1 && t->ne[2] == 1 && t->ne[3] == 1;
    else
        ok = t->n_dims == 2 && t->ne[0] == cols && t->ne[1] == rows;
    if (!ok)
        return baton_error(BATON_ERR_FORMAT,
                           "model: tensor %s has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                           name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                           (long long)t->ne[3], (long long)cols, (long long)rows);
    *out = t;
    return BATON_OK;
}

/* Converts one tensor to fp32 (host scratch) and creates the backend weight. */
static baton_status_t upload_tensor(model_t *m, const gguf_tensor_t *t, int64_t rows,
                                    int64_t cols, float *host, backend_weight_t **out) {
    char name[128];
    snprintf(name, sizeof(name), "%.*s", (int)(t->name.len > 120 ? 120 : t->name.len), t->name.data);
    baton_status_t st = gguf_tensor_to_f32(t, host);
    if (st != BATON_OK) {
        if (st == BATON_ERR_UNSUPPORTED)
            return baton_error(st, "model: tensor %s has type %s, which baton does not convert "
                               "(supported: f32, f16, bf16, q8_0, q4_0, q4_1, q4_k, q5_k, q6_k)",
                               name, ggml_type_name(t->type));
        return baton_error(st, "model: tensor %s: %s", name, baton_last_error());
    }
    for (int64_t i = 0; i < rows * cols; i++)
        if (!isfinite(host[i]))
            return baton_error(BATON_ERR_FORMAT, "model: tensor %s has a non-finite value at %lld",
                               name, (long long)i);
    st = m->be->ops->weight_create(m->be, host, rows, cols, out);
    if (st != BATON_OK) return baton_error(st, "model: tensor %s: %s", name, baton_last_error());
    return BATON_OK;
}

typedef struct tensor_plan {
    const char *fmt; /* name, with %d for the layer */
    int64_t rows, cols;
    bool optional;
    size_t field; /* offset in model_layer_t, or (size_t)-1 for model-level */
} tensor_plan_t;

static baton_status_t load_weights(model_t *m, const gguf_file_t *f) {
    model_hparams_t *hp = &m->hp;
    const gguf_tensor_t *emb;
    baton_status_t st;
    const gguf_tensor_t *e0 = gguf_find_tensor(f, "token_embd.weight");
    if (!e0) return baton_error(BATON_ERR_NOT_FOUND, "model: missing tensor token_embd.weight");
    if (e0->n_dims != 2 || e0->ne[0] != hp->n_embd || e0->ne[1] < 1 || e0->ne[1] > (1 << 24))
        return baton_error(BATON_ERR_FORMAT,
                           "model: tensor token_embd.weight has shape [%lld, %lld], expected [%d, n_vocab]",
                           (long long)e0->ne[0], (long long)e0->ne[1], hp->n_embd);
    hp->n_vocab = (int32_t)e0->ne[1];
    const char *arch = hp->arch == MODEL_ARCH_QWEN2 ? "qwen2" : "llama";
    char key[160];
    snprintf(key, sizeof(key), "%s.vocab_size", arch);
    uint32_t vs;
    st = gguf_get_u32(f, key, &vs);
    if (st == BATON_OK && (int64_t)vs != hp->n_vocab)
        return baton_error(BATON_ERR_FORMAT, "model: %s = %u but token_embd.weight has %d rows",
                           key, vs, hp->n_vocab);
    if ((st = find_tensor(f, "token_embd.weight", hp->n_vocab, hp->n_embd, true, &emb))) return st;

    const int64_t E = hp->n_embd, F = hp->n_ff, D = hp->head_dim;
    const int64_t QD = (int64_t)hp->n_head * D, KD = (int64_t)hp->n_head_kv * D;
    const bool bias = hp->arch == MODEL_ARCH_QWEN2;
    const tensor_plan_t plan[] = {
        {"blk.%d.attn_norm.weight", 1, E, false, offsetof(model_layer_t, attn_norm)},
        {"blk.%d.attn_q.weight", QD, E, false, offsetof(model_layer_t, wq)},
        {"blk.%d.attn_k.weight", KD, E, false, offsetof(model_layer_t, wk)},
        {"blk.%d.attn_v.weight", KD, E, false, offsetof(model_layer_t, wv)},
        {"blk.%d.attn_q.bias", 1, QD, !bias, offsetof(model_layer_t, bq)},
        {"blk.%d.attn_k.bias", 1, KD, !bias, offsetof(model_layer_t, bk)},
        {"blk.%d.attn_v.bias", 1, KD, !bias, offsetof(model_layer_t, bv)},
        {"blk.%d.attn_output.weight", E, QD, false, offsetof(model_layer_t, wo)},
        {"blk.%d.ffn_norm.weight", 1, E, false, offsetof(model_layer_t, ffn_norm)},
        {"blk.%d.ffn_gate.weight", F, E, false, offsetof(model_layer_t, w_gate)},
        {"blk.%d.ffn_up.weight", F, E, false, offsetof(model_layer_t, w_up)},
        {"blk.%d.ffn_down.weight", E, F, false, offsetof(model_layer_t, w_down)},
    };
    const size_t n_plan = sizeof(plan) / sizeof(plan[0]);

    /* Validate every tensor's presence and shape before converting anything. */
    const gguf_tensor_t *out_t, *onorm, *rfreq;
    if ((st = find_tensor(f, "output_norm.weight", 1, E, true, &onorm)) ||
        (st = find_tensor(f, "output.weight", hp->n_vocab, E, false, &out_t)) ||
        (st = find_tensor(f, "rope_freqs.weight", 1, D / 2, false, &rfreq)))
        return st;
    int64_t max_elems = (int64_t)hp->n_vocab * E;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        for (size_t i = 0; i < n_plan; i++) {
            char name[96];
            snprintf(name, sizeof(name), plan[i].fmt, l);
            const gguf_tensor_t *t;
            if ((st = find_tensor(f, name, plan[i].rows, plan[i].cols, !plan[i].optional, &t)))
                return st;
            if (plan[i].rows * plan[i].cols > max_elems) max_elems = plan[i].rows * plan[i].cols;
        }
    }
    hp->tied_output = out_t == NULL;
    hp->has_rope_freqs = rfreq != NULL;

    float *host = malloc(sizeof(float) * (size_t)max_elems);
    if (!host) return baton_error(BATON_ERR_NO_MEMORY, "model: %lld floats of conversion buffer",
                                  (long long)max_elems);
    if ((st = upload_tensor(m, emb, hp->n_vocab, E, host, &m->tok_embd))) goto done;
    if ((st = upload_tensor(m, onorm, 1, E, host, &m->output_norm))) goto done;
    if (out_t) {
        if ((st = upload_tensor(m, out_t, hp->n_vocab, E, host, &m->output))) goto done;
    } else {
        m->output = m->tok_embd;
    }
    if (rfreq) {
        m->rope_freqs = malloc(sizeof(float) * (size_t)(D / 2));
        if (!m->rope_freqs) {
            st = baton_error(BATON_ERR_NO_MEMORY, "model: rope_freqs");
            goto done;
        }
        if ((st = gguf_tensor_to_f32(rfreq, m->rope_freqs))) goto done;
        for (int64_t i = 0; i < D / 2; i++)
            if (!(m->rope_freqs[i] > 0.0f) || !isfinite(m->rope_freqs[i])) {
                st = baton_error(BATON_ERR_FORMAT, "model: rope_freqs.weight[%lld] = %g must be > 0",
                                 (long long)i, (double)m->rope_freqs[i]);
                goto done;
            }
    }
    for (int32_t l = 0; l < hp->n_layer; l++) {
        for (size_t i = 0; i < n_plan; i++) {
            char name[96];
            snprintf(name, sizeof(name), plan[i].fmt, l);
            const gguf_tensor_t *t = gguf_find_tensor(f, name);
            if (!t) continue; /* optional and absent (validated above) */
            backend_weight_t **slot = (backend_weight_t **)((char *)&m->layers[l] + plan[i].field);
            if ((st = upload_tensor(m, t, plan[i].rows, plan[i].cols, host, slot))) goto done;
        }
    }
    st = BATON_OK;
done:
    free(host);
    return st;
}

static baton_status_t alloc_scratch(model_t *m) {
    const model_hparams_t *hp = &m->hp;
    backend_t *be = m->be;
    const size_t T = (size_t)m->lp.max_batch_tokens, R = (size_t)m->lp.max_logit_rows;
    const size_t QD = (size_t)hp->n_head * hp->head_dim, KD = (size_t)hp->n_head_kv * hp->head_dim;
    struct {
        float **p;
        size_t n;
    } bufs[] = {
        {&m->x, T * hp->n_embd},   {&m->h, T * hp->n_embd},   {&m->q, T * QD},
        {&m->k, T * KD},           {&m->v, T * KD},           {&m->att, T * QD},
        {&m->proj, T * hp->n_embd}, {&m->gate, T * hp->n_ff}, {&m->up, T * hp->n_ff},
        {&m->sel, R * hp->n_embd}, {&m->logits, R * hp->n_vocab},
    };
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        *bufs[i].p = be->ops->alloc(be, bufs[i].n * sizeof(float));
        if (!*bufs[i].p)
            return baton_error(BATON_ERR_NO_MEMORY, "model: scratch of %zu floats: %s", bufs[i].n,
                               baton_last_error());
    }
    int32_t **hb[] = {&m->tokens, &m->tok_seq, &m->tok_pos, &m->seq_first,
                      &m->seq_n_tok, &m->seq_n_ctx, &m->out_rows};
    for (size_t i = 0; i < sizeof(hb) / sizeof(hb[0]); i++) {
        *hb[i] = malloc(sizeof(int32_t) * T);
        if (!*hb[i]) return baton_error(BATON_ERR_NO_MEMORY, "model: host scratch");
    }
    return BATON_OK;
}

baton_status_t model_load_gguf(const gguf_file_t *file, backend_t *be,
                               const model_load_params_t *params, model_t **out) {
    if (!file || !be || !out) return baton_error(BATON_ERR_INVALID_ARG, "model_load: NULL argument");
    model_load_params_t lp = params ? *params : model_load_params_default();
    if (lp.max_batch_tokens < 1 || lp.max_batch_tokens > (1 << 20) || lp.max_logit_rows < 1 ||
        lp.max_logit_rows > (1 << 16))
        return baton_error(BATON_ERR_INVALID_ARG, "model_load: max_batch_tokens %d / max_logit_rows %d",
                           lp.max_batch_tokens, lp.max_logit_rows);
    model_t *m = calloc(1, sizeof(*m));
    if (!m) return baton_error(BATON_ERR_NO_MEMORY, "model_load");
    m->be = be;
    m->lp = lp;
    baton_status_t st = read_hparams(file, &m->hp);
    if (st != BATON_OK) goto fail;
    m->layers = calloc((size_t)m->hp.n_layer, sizeof(model_layer_t));
    if (!m->layers) {
        st = baton_error(BATON_ERR_NO_MEMORY, "model_load: %d layers", m->hp.n_layer);
        goto fail;
    }
    if ((st = load_weights(m, file)) != BATON_OK) goto fail;
    if ((st = alloc_scratch(m)) != BATON_OK) goto fail;
    *out = m;
    return BATON_OK;
fail:
    model_free(m);
    return st;
}

baton_status_t model_load(const char *path, backend_t *be, const model_load_params_t *params,
                          model_t **out) {
    if (!path) return baton_error(BATON_ERR_INVALID_ARG, "model_load: NULL path");
    gguf_file_t *f = NULL;
    baton_status_t st = gguf_open(path, &f);
    if (st != BATON_OK) return st;
    st = model_load_gguf(f, be, params, out);
    gguf_close(f);
    return st;
}

void model_free(model_t *m) {
    if (!m) return;
    backend_t *be = m->be;
    if (m->layers) {
        for (int32_t l = 0; l < m->hp.n_layer; l++) {
            model_layer_t *L = &m->layers[l];
            backend_weight_t *ws[] = {L->attn_norm, L->wq, L->wk, L->wv, L->bq, L->bk, L->bv,
                                      L->wo, L->ffn_norm, L->w_gate, L->w_up, L->w_down};
            for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++) be->ops->weight_free(be, ws[i]);
        }
        free(m->layers);
    }
    if (m->output != m->tok_embd) be->ops->weight_free(be, m->output);
    be->ops->weight_free(be, m->tok_embd);
    be->ops->weight_free(be, m->output_norm);
    float *bufs[] = {m->x, m->h, m->q, m->k, m->v, m->att, m->proj, m->gate, m->up, m->sel, m->logits};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) be->ops->free(be, bufs[i]);
    free(m->rope_freqs);
    free(m->tokens);
    free(m->tok_seq);
    free(m->tok_pos);
    free(m->seq_first);
    free(m->seq_n_tok);
    free(m->seq_n_ctx);
    free(m->out_rows);
    free(m->block_tables);
    free(m);
}

/* ------------------------------------------------------------------ KV */

backend_kv_geom_t model_kv_geom(const model_t *m, int32_t n_blocks, int32_t block_size) {
    backend_kv_geom_t g = {
        .n_layers = m->hp.n_layer,
        .n_blocks = n_blocks,
        .block_size = block_size,
        .n_kv_heads = m->hp.n_head_kv,
        .head_dim = m->hp.head_dim,
        .dtype = m->be->kv_dtype,
    };
    return g;
}

baton_status_t model_kv_alloc(const model_t *m, int32_t n_blocks, int32_t block_size,
                              model_kv_t *out) {
    if (!m || !out || n_blocks <= 0 || block_size <= 0)
        return baton_error(BATON_ERR_INVALID_ARG, "model_kv_alloc: %d blocks of %d tokens",
                           n_blocks, block_size);
    backend_kv_geom_t g = model_kv_geom(m, n_blocks, block_size);
    size_t bytes = backend_kv_block_bytes(&g) * (size_t)n_blocks * (size_t)g.n_layers;
    backend_t *be = m->be;
    void *k = be->ops->alloc(be, bytes);
    void *v = k ? be->ops->alloc(be, bytes) : NULL;
    if (!k || !v) {
        be->ops->free(be, k);
        return baton_error(BATON_ERR_NO_MEMORY, "model_kv_alloc: 2 x %zu bytes", bytes);
    }
    baton_status_t st = be->ops->memset_zero(be, k, bytes);
    if (st == BATON_OK) st = be->ops->memset_zero(be, v, bytes);
    if (st != BATON_OK) {
        be->ops->free(be, k);
        be->ops->free(be, v);
        return st;
    }
    out->geom = g;
    out->k_pool = k;
    out->v_pool = v;
    return BATON_OK;
}

void model_kv_free(const model_t *m, model_kv_t *kv) {
    if (!m || !kv) return;
    m->be->ops->free(m->be, kv->k_pool);
    m->be->ops->free(m->be, kv->v_pool);
    memset(kv, 0, sizeof(*kv));
}

/* ------------------------------------------------------------- forward */

int64_t model_batch_n_logits(const model_batch_t *batch) {
    if (!batch || !batch->seqs) return 0;
    int64_t n = 0;
    for (int32_t i = 0; i < batch->n_seqs; i++) {
        if (batch->seqs[i].logits == MODEL_LOGITS_LAST) n += 1;
        else if (batch->seqs[i].logits == MODEL_LOGITS_ALL) n += batch->seqs[i].n_tokens;
    }
    return n;
}

static baton_status_t check_batch(const model_t *m, const model_kv_t *kv, const model_batch_t *b,
                                  int32_t *n_tokens_out, int32_t *max_blocks_out) {
    const model_hparams_t *hp = &m->hp;
    const backend_kv_geom_t *g = &kv->geom;
    if (g->n_layers != hp->n_layer || g->n_kv_heads != hp->n_head_kv || g->head_dim != hp->head_dim ||
        g->dtype != m->be->kv_dtype || g->block_size <= 0 || g->n_blocks <= 0 || !kv->k_pool ||
        !kv->v_pool)
        return baton_error(BATON_ERR_INVALID_ARG,
                           "model_forward: KV geometry (%d layers, %d kv heads, head_dim %d, %s) "
                           "does not match the model (%d, %d, %d, %s)",
                           g->n_layers, g->n_kv_heads, g->head_dim, backend_dtype_name(g->dtype),
                           hp->n_layer, hp->n_head_kv, hp->head_dim,
                           backend_dtype_name(m->be->kv_dtype));
    if (!b->seqs || b->n_seqs <= 0)
        return baton_error(BATON_ERR_INVALID_ARG, "model_forward: empty batch");
    int64_t total = 0;
    int32_t max_blocks = 1;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        const model_seq_t *q = &b->seqs[s];
        if (q->n_tokens <= 0 || !q->tokens)
            return baton_error(BATON_ERR_INVALID_ARG, "model_forward: sequence %d has no tokens", s);
        if (q->logits < MODEL_LOGITS_NONE || q->logits > MODEL_LOGITS_ALL)
            return baton_error(BATON_ERR_INVALID_ARG, "model_forward: sequence %d: logits mode %d",
                               s, (int)q->logits);
        total += q->n_tokens;
        if (total > m->lp.max_batch_tokens)
            return baton_error(BATON_ERR_OUT_OF_RANGE,
                               "model_forward: batch has more than max_batch_tokens = %d tokens",
                               m->lp.max_batch_tokens);
        if (q->pos < 0 || (int64_t)q->pos + q->n_tokens > hp->n_ctx_train)
            return baton_error(BATON_ERR_OUT_OF_RANGE,
                               "model_forward: sequence %d reaches position %lld, beyond the "
                               "context length %d",
                               s, (long long)q->pos + q->n_tokens, hp->n_ctx_train);
        int64_t need = ((int64_t)q->pos + q->n_tokens + g->block_size - 1) / g->block_size;
        if (q->n_blocks < need || !q->block_table)
            return baton_error(BATON_ERR_OUT_OF_RANGE,
                               "model_forward: sequence %d needs %lld blocks for %lld positions, "
                               "its block table has %d",
                               s, (long long)need, (long long)q->pos + q->n_tokens, q->n_blocks);
        for (int64_t j = 0; j < need; j++)
            if (q->block_table[j] < 0 || q->block_table[j] >= g->n_blocks)
                return baton_error(BATON_ERR_INVALID_ARG,
                                   "model_forward: sequence %d block %lld is %d, outside the pool "
                                   "of %d blocks",
                                   s, (long long)j, q->block_table[j], g->n_blocks);
        for (int32_t t = 0; t < q->n_tokens; t++)
            if (q->tokens[t] < 0 || q->tokens[t] >= hp->n_vocab)
                return baton_error(BATON_ERR_INVALID_ARG,
                                   "model_forward: sequence %d token %d is %d, outside the "
                                   "vocabulary of %d",
                                   s, t, q->tokens[t], hp->n_vocab);
        if (need > max_blocks) max_blocks = (int32_t)need;
    }
    *n_tokens_out = (int32_t)total;
    *max_blocks_out = max_blocks;
    return BATON_OK;
}

#define TRY(expr)                                                                          \
    do {                                                                                   \
        baton_status_t _st = (expr);                                                       \
        if (_st != BATON_OK) return _st;                                                   \
    } while (0)

baton_status_t model_forward(model_t *m, const model_kv_t *kv, const model_batch_t *batch,
                             float *logits_out) {
    return model_forward_layers(m, kv, batch, logits_out, NULL, NULL);
}

baton_status_t model_forward_layers(model_t *m, const model_kv_t *kv, const model_batch_t *batch,
                                    float *logits_out, model_layer_cb_t layer_cb, void *cb_arg) {
    if (!m || !kv || !batch)
        return baton_error(BATON_ERR_INVALID_ARG, "model_forward: NULL argument");
    int32_t n, max_blocks;
    TRY(check_batch(m, kv, batch, &n, &max_blocks));
    const int64_t n_out = model_batch_n_logits(batch);
    if (n_out > 0 && !logits_out)
        return baton_error(BATON_ERR_INVALID_ARG, "model_forward: NULL logits_out for %lld rows",
                           (long long)n_out);

    /* host metadata */
    const int32_t n_seqs = batch->n_seqs;
    int64_t bt_need = (int64_t)n_seqs * max_blocks;
    if (bt_need > m->bt_cap) {
        int32_t *bt = realloc(m->block_tables, sizeof(int32_t) * (size_t)bt_need);
        if (!bt) return baton_error(BATON_ERR_NO_MEMORY, "model_forward: block tables");
        m->block_tables = bt;
        m->bt_cap = bt_need;
    }
    int32_t t = 0, r = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        const model_seq_t *q = &batch->seqs[s];
        m->seq_first[s] = t;
        m->seq_n_tok[s] = q->n_tokens;
        m->seq_n_ctx[s] = q->pos + q->n_tokens;
        int32_t need = (q->pos + q->n_tokens + kv->geom.block_size - 1) / kv->geom.block_size;
        memcpy(m->block_tables + (size_t)s * max_blocks, q->block_table, sizeof(int32_t) * (size_t)need);
        for (int32_t j = need; j < max_blocks; j++) m->block_tables[(size_t)s * max_blocks + j] = -1;
        for (int32_t i = 0; i < q->n_tokens; i++, t++) {
            m->tokens[t] = q->tokens[i];
            m->tok_seq[t] = s;
            m->tok_pos[t] = q->pos + i;
            if (q->logits == MODEL_LOGITS_ALL || (q->logits == MODEL_LOGITS_LAST && i == q->n_tokens - 1))
                m->out_rows[r++] = t;
        }
    }
    backend_attn_batch_t ab = {
        .n_tokens = n,
        .n_seqs = n_seqs,
        .tok_seq = m->tok_seq,
        .tok_pos = m->tok_pos,
        .seq_first_tok = m->seq_first,
        .seq_n_tok = m->seq_n_tok,
        .seq_n_ctx = m->seq_n_ctx,
        .block_tables = m->block_tables,
        .max_blocks = max_blocks,
    };

    const model_hparams_t *hp = &m->hp;
    backend_t *be = m->be;
    const backend_ops_t *op = be->ops;
    const int32_t E = hp->n_embd;

    TRY(op->embed(be, m->tok_embd, m->tokens, n, m->x));
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const model_layer_t *L = &m->layers[l];
        TRY(op->rmsnorm(be, m->x, L->attn_norm, hp->rms_eps, m->h, n, E));
        TRY(op->matmul(be, L->wq, L->bq, m->h, m->q, n));
        TRY(op->matmul(be, L->wk, L->bk, m->h, m->k, n));
        TRY(op->matmul(be, L->wv, L->bv, m->h, m->v, n));
        TRY(op->rope(be, m->q, m->tok_pos, n, hp->n_head, hp->head_dim, hp->rope_freq_base,
                     hp->rope_freq_scale, m->rope_freqs, hp->rope_neox));
        TRY(op->rope(be, m->k, m->tok_pos, n, hp->n_head_kv, hp->head_dim, hp->rope_freq_base,
                     hp->rope_freq_scale, m->rope_freqs, hp->rope_neox));
        TRY(op->kv_write(be, &kv->geom, kv->k_pool, kv->v_pool, l, &ab, m->k, m->v));
        TRY(op->attention(be, &kv->geom, kv->k_pool, kv->v_pool, l, &ab, m->q, m->att, hp->n_head));
        TRY(op->matmul(be, L->wo, NULL, m->att, m->proj, n));
        TRY(op->add(be, m->x, m->proj, m->x, (int64_t)n * E));
        TRY(op->rmsnorm(be, m->x, L->ffn_norm, hp->rms_eps, m->h, n, E));
        TRY(op->matmul(be, L->w_gate, NULL, m->h, m->gate, n));
        TRY(op->matmul(be, L->w_up, NULL, m->h, m->up, n));
        TRY(op->swiglu(be, m->gate, m->up, m->gate, n, hp->n_ff));
        TRY(op->matmul(be, L->w_down, NULL, m->gate, m->proj, n));
        TRY(op->add(be, m->x, m->proj, m->x, (int64_t)n * E));
        if (layer_cb) {
            TRY(op->synchronize(be)); /* layer l's K/V are in the pools */
            layer_cb(cb_arg, l);
        }
    }
    /* logits of the wanted rows, max_logit_rows at a time */
    for (int32_t done = 0; done < r; done += m->lp.max_logit_rows) {
        int32_t rows = r - done < m->lp.max_logit_rows ? r - done : m->lp.max_logit_rows;
        TRY(op->gather_rows(be, m->x, m->out_rows + done, rows, E, m->sel));
        TRY(op->rmsnorm(be, m->sel, m->output_norm, hp->rms_eps, m->sel, rows, E));
        TRY(op->matmul(be, m->output, NULL, m->sel, m->logits, rows));
        TRY(op->download(be, logits_out + (size_t)done * hp->n_vocab, m->logits,
                         sizeof(float) * (size_t)rows * hp->n_vocab));
    }
    TRY(op->synchronize(be));
    return BATON_OK;
}
