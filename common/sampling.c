/* Token sampling (see sampling.h for the pipeline and its sources).
 *
 * Cost per call: O(n_vocab) for the transforms and the greedy path;
 * truncation sorts only the candidates that can matter (top-k through a
 * k-element heap; otherwise the tokens within log(n_vocab) + 30 nats of the
 * maximum, whose complement holds < e^-30 of the mass and is kept, unsorted,
 * only when top-p asks for more than the head). */
#include "common/sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PCG_MULT 6364136223846793005ULL
#define PCG_DEFAULT_STREAM 0xda3e39cb94b95bdbULL

void sampling_rng_seed(sampling_rng_t *rng, uint64_t initstate, uint64_t initseq) {
    rng->state = 0;
    rng->inc = (initseq << 1u) | 1u;
    sampling_rng_next(rng);
    rng->state += initstate;
    sampling_rng_next(rng);
}

uint32_t sampling_rng_next(sampling_rng_t *rng) {
    uint64_t old = rng->state;
    rng->state = old * PCG_MULT + rng->inc;
    uint32_t xorshifted = (uint32_t)(((old >> 18u) ^ old) >> 27u);
    uint32_t rot = (uint32_t)(old >> 59u);
    return (xorshifted >> rot) | (xorshifted << ((-rot) & 31));
}

double sampling_rng_uniform(sampling_rng_t *rng) {
    return sampling_rng_next(rng) * (1.0 / 4294967296.0);
}

typedef struct cand {
    float v;
    int32_t id;
} cand_t;

struct sampler {
    sampling_params_t p;
    int32_t n_vocab;
    sampling_logit_bias_t *bias; /* [p.n_logit_bias] */
    int32_t stop_ids[SAMPLING_MAX_STOP_IDS];
    int32_t *hist; /* accepted tokens [n_hist] */
    int64_t n_hist, cap_hist;
    sampling_rng_t rng;
    float *work;     /* [n_vocab] processed logits */
    int32_t *count;  /* [n_vocab] scratch, all zero between calls */
    cand_t *cands;   /* [n_vocab] */
};

sampling_params_t sampling_params_default(void) {
    sampling_params_t p;
    memset(&p, 0, sizeof(p));
    p.temperature = 0.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repetition_penalty = 1.0f;
    p.penalty_last_n = 64;
    return p;
}

baton_status_t sampler_init(const sampling_params_t *params, int32_t n_vocab,
                            sampler_t **out) {
    if (!params || !out)
        return baton_error(BATON_ERR_INVALID_ARG, "sampler_init: NULL argument");
    const sampling_params_t *p = params;
    if (n_vocab <= 0)
        return baton_error(BATON_ERR_INVALID_ARG, "sampler_init: n_vocab %d", n_vocab);
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return baton_error(BATON_ERR_OUT_OF_RANGE, "temperature %g must be >= 0",
                           (double)p->temperature);
    if (p->top_k < 0)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "top_k %d must be >= 0", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return baton_error(BATON_ERR_OUT_OF_RANGE, "top_p %g must be in (0, 1]",
                           (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return baton_error(BATON_ERR_OUT_OF_RANGE, "min_p %g must be in [0, 1]",
                           (double)p->min_p);
    if (!(p->repetition_penalty > 0.0f) || !isfinite(p->repetition_penalty))
        return baton_error(BATON_ERR_OUT_OF_RANGE, "repetition_penalty %g must be > 0",
                           (double)p->repetition_penalty);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return baton_error(BATON_ERR_OUT_OF_RANGE, "presence/frequency penalty not finite");
    if (p->penalty_last_n < 0)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "penalty_last_n %d must be >= 0",
                           p->penalty_last_n);
    if (p->n_logprobs < 0 || p->n_logprobs > SAMPLING_MAX_LOGPROBS)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "logprobs %d must be in 0..%d",
                           p->n_logprobs, SAMPLING_MAX_LOGPROBS);
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
        return baton_error(BATON_ERR_INVALID_ARG, "logit_bias: %d entries", p->n_logit_bias);
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias[i].token < 0 || p->logit_bias[i].token >= n_vocab)
            return baton_error(BATON_ERR_OUT_OF_RANGE, "logit_bias token %d outside vocabulary of %d",
                               p->logit_bias[i].token, n_vocab);
        if (!isfinite(p->logit_bias[i].bias))
            return baton_error(BATON_ERR_OUT_OF_RANGE, "logit_bias for token %d is not finite",
                               p->logit_bias[i].token);
    }
    if (p->n_stop_ids < 0 || p->n_stop_ids > SAMPLING_MAX_STOP_IDS ||
        (p->n_stop_ids > 0 && !p->stop_ids))
        return baton_error(BATON_ERR_OUT_OF_RANGE, "stop ids: %d (at most %d)", p->n_stop_ids,
                           SAMPLING_MAX_STOP_IDS);
    for (int32_t i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0 || p->stop_ids[i] >= n_vocab)
            return baton_error(BATON_ERR_OUT_OF_RANGE, "stop id %d outside vocabulary of %d",
                               p->stop_ids[i], n_vocab);

    sampler_t *s = calloc(1, sizeof(*s));
    if (!s) return baton_error(BATON_ERR_NO_MEMORY, "sampler_init");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->work = malloc(sizeof(float) * (size_t)n_vocab);
    s->count = calloc((size_t)n_vocab, sizeof(int32_t));
    s->cands = malloc(sizeof(cand_t) * (size_t)n_vocab);
    if (p->n_logit_bias > 0) s->bias = malloc(sizeof(*s->bias) * (size_t)p->n_logit_bias);
    if (!s->work || !s->count || !s->cands || (p->n_logit_bias > 0 && !s->bias)) {
        sampler_free(s);
        return baton_error(BATON_ERR_NO_MEMORY, "sampler_init: %d-token vocabulary", n_vocab);
    }
    if (p->n_logit_bias > 0)
        memcpy(s->bias, p->logit_bias, sizeof(*s->bias) * (size_t)p->n_logit_bias);
    s->p.logit_bias = s->bias;
    if (p->n_stop_ids > 0) memcpy(s->stop_ids, p->stop_ids, sizeof(int32_t) * (size_t)p->n_stop_ids);
    s->p.stop_ids = s->stop_ids;
    sampling_rng_seed(&s->rng, p->seed, PCG_DEFAULT_STREAM);
    *out = s;
    return BATON_OK;
}

void sampler_free(sampler_t *s) {
    if (!s) return;
    free(s->work);
    free(s->count);
    free(s->cands);
    free(s->bias);
    free(s->hist);
    free(s);
}

baton_status_t sampler_accept(sampler_t *s, int32_t token) {
    if (!s) return baton_error(BATON_ERR_INVALID_ARG, "sampler_accept: NULL sampler");
    if (token < 0 || token >= s->n_vocab)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "sampler_accept: token %d outside vocabulary of %d",
                           token, s->n_vocab);
    if (s->n_hist == s->cap_hist) {
        int64_t cap = s->cap_hist ? s->cap_hist * 2 : 256;
        int32_t *h = realloc(s->hist, sizeof(int32_t) * (size_t)cap);
        if (!h) return baton_error(BATON_ERR_NO_MEMORY, "sampler_accept");
        s->hist = h;
        s->cap_hist = cap;
    }
    s->hist[s->n_hist++] = token;
    return BATON_OK;
}

int64_t sampler_n_accepted(const sampler_t *s) { return s ? s->n_hist : 0; }

/* a ranks before b: larger value, then smaller id. */
static inline int cand_before(cand_t a, cand_t b) {
    return a.v > b.v || (a.v == b.v && a.id < b.id);
}

static int cand_cmp(const void *pa, const void *pb) {
    cand_t a = *(const cand_t *)pa, b = *(const cand_t *)pb;
    if (cand_before(a, b)) return -1;
    if (cand_before(b, a)) return 1;
    return 0;
}

static int cand_cmp_id(const void *pa, const void *pb) {
    int32_t a = ((const cand_t *)pa)->id, b = ((const cand_t *)pb)->id;
    return (a > b) - (a < b);
}

/* Min-heap (by rank: root is the worst kept) sift-down. */
static void heap_down(cand_t *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && cand_before(h[w], h[l])) w = l;
        if (r < n && cand_before(h[w], h[r])) w = r;
        if (w == i) return;
        cand_t t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Writes the k best of v[0..n) (scaled by `scale`) into out[0..k), best first. */
static int32_t select_top(const float *v, int32_t n, float scale, int32_t k, cand_t *out) {
    if (k > n) k = n;
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        cand_t c = {v[i] * scale, i};
        if (m < k) {
            /* sift up in a min-heap by rank */
            int32_t j = m++;
            out[j] = c;
            while (j > 0) {
                int32_t pj = (j - 1) / 2;
                if (cand_before(out[pj], out[j])) {
                    cand_t t = out[pj];
                    out[pj] = out[j];
                    out[j] = t;
                    j = pj;
                } else {
                    break;
                }
            }
        } else if (cand_before(c, out[0])) {
            out[0] = c;
            heap_down(out, k, 0);
        }
    }
    qsort(out, (size_t)m, sizeof(cand_t), cand_cmp);
    return m;
}

static void apply_penalties(sampler_t *s) {
    const sampling_params_t *p = &s->p;
    int use_rep = p->repetition_penalty != 1.0f;
    int use_pf = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    if ((!use_rep && !use_pf) || s->n_hist == 0) return;
    int64_t from = 0;
    if (p->penalty_last_n > 0 && s->n_hist > p->penalty_last_n) from = s->n_hist - p->penalty_last_n;
    for (int64_t i = from; i < s->n_hist; i++) s->count[s->hist[i]]++;
    for (int64_t i = from; i < s->n_hist; i++) {
        int32_t t = s->hist[i];
        int32_t c = s->count[t];
        if (c == 0) continue; /* already applied */
        float l = s->work[t];
        if (use_rep) l = l > 0.0f ? l / p->repetition_penalty : l * p->repetition_penalty;
        l -= (float)c * p->frequency_penalty + p->presence_penalty;
        s->work[t] = l;
        s->count[t] = 0;
    }
}

baton_status_t sampler_sample(sampler_t *s, const float *logits, sampling_result_t *out) {
    if (!s || !logits || !out)
        return baton_error(BATON_ERR_INVALID_ARG, "sampler_sample: NULL argument");
    const sampling_params_t *p = &s->p;
    const int32_t nv = s->n_vocab;
    float *w = s->work;
    memcpy(w, logits, sizeof(float) * (size_t)nv);
    for (int32_t i = 0; i < p->n_logit_bias; i++) w[s->bias[i].token] += s->bias[i].bias;
    apply_penalties(s);

    /* max and log-sum-exp of the processed row at the reporting temperature */
    const float t_eff = p->temperature > 0.0f ? p->temperature : 1.0f;
    const float inv_t = 1.0f / t_eff;
    int32_t arg = -1;
    float mx = -INFINITY;
    for (int32_t i = 0; i < nv; i++) {
        float v = w[i];
        if (isnan(v)) v = w[i] = -INFINITY;
        if (v > mx) {
            mx = v;
            arg = i;
        }
    }
    if (arg < 0 || !isfinite(mx))
        return baton_error(BATON_ERR_INVALID_ARG, "sampler_sample: no finite logit in the row");
    const double ms = (double)mx * inv_t;
    double sum = 0.0;
    for (int32_t i = 0; i < nv; i++) sum += exp((double)w[i] * inv_t - ms);
    const double lse = ms + log(sum);

    int32_t token = arg;
    const bool truncate = (p->top_k > 0 && p->top_k < nv) || p->top_p < 1.0f || p->min_p > 0.0f;
    if (p->temperature > 0.0f && !truncate) {
        /* inverse CDF in token-id order: a logit perturbation of size e moves
         * every boundary by O(e), so batched and single runs agree */
        double z = 0.0;
        for (int32_t i = 0; i < nv; i++) z += exp((double)w[i] * inv_t - ms);
        double u = sampling_rng_uniform(&s->rng) * z, cum = 0.0;
        for (int32_t i = 0; i < nv; i++) {
            double e = exp((double)w[i] * inv_t - ms);
            if (e > 0.0) token = i; /* last token with mass, if rounding leaves u >= cum */
            cum += e;
            if (u < cum) break;
        }
    } else if (p->temperature > 0.0f) {
        cand_t *c = s->cands;
        int32_t n_head, n_all;
        int sorted_all;
        if (p->top_k > 0 && p->top_k < nv) {
            n_head = select_top(w, nv, inv_t, p->top_k, c);
            n_all = n_head;
            sorted_all = 1;
        } else {
            /* head: within log(nv) + 30 nats of the max, sorted; tail after it, in id order */
            const double thr = ms - (log((double)nv) + 30.0);
            n_head = 0;
            for (int32_t i = 0; i < nv; i++)
                if ((double)w[i] * inv_t >= thr) c[n_head++] = (cand_t){w[i] * inv_t, i};
            n_all = n_head;
            for (int32_t i = 0; i < nv; i++) {
                double v = (double)w[i] * inv_t;
                if (v < thr && v > -INFINITY) c[n_all++] = (cand_t){(float)v, i};
            }
            qsort(c, (size_t)n_head, sizeof(cand_t), cand_cmp);
            sorted_all = n_all == n_head;
        }
        int32_t n_keep = n_all;
        if (p->top_p < 1.0f) {
            double z = 0.0;
            for (int32_t i = 0; i < n_all; i++) z += exp((double)c[i].v - ms);
            double cum = 0.0;
            int32_t i;
            for (i = 0; i < n_head; i++) {
                cum += exp((double)c[i].v - ms) / z;
                if (cum >= p->top_p) break;
            }
            if (i < n_head) n_keep = i + 1;
            else n_keep = sorted_all ? n_head : n_all;
        }
        if (p->min_p > 0.0f) {
            const double floor_v = ms + log((double)p->min_p);
            int32_t k = 0;
            for (int32_t i = 0; i < n_keep; i++)
                if ((double)c[i].v >= floor_v) c[k++] = c[i];
            n_keep = k; /* the max always survives: min_p <= 1 */
        }
        /* the kept set is decided in rank order; the draw walks it in id
         * order (see the untruncated branch) */
        qsort(c, (size_t)n_keep, sizeof(cand_t), cand_cmp_id);
        double z = 0.0;
        for (int32_t i = 0; i < n_keep; i++) z += exp((double)c[i].v - ms);
        double u = sampling_rng_uniform(&s->rng) * z;
        double cum = 0.0;
        token = c[n_keep - 1].id;
        for (int32_t i = 0; i < n_keep; i++) {
            cum += exp((double)c[i].v - ms);
            if (u < cum) {
                token = c[i].id;
                break;
            }
        }
    }

    out->token = token;
    out->logprob = (float)((double)w[token] * inv_t - lse);
    out->is_stop = false;
    for (int32_t i = 0; i < p->n_stop_ids; i++)
        if (s->stop_ids[i] == token) out->is_stop = true;
    out->n_top = 0;
    if (p->n_logprobs > 0) {
        cand_t top[SAMPLING_MAX_LOGPROBS];
        int32_t n = select_top(w, nv, inv_t, p->n_logprobs, top);
        for (int32_t i = 0; i < n; i++) {
            out->top[i].token = top[i].id;
            out->top[i].logprob = (float)((double)w[top[i].id] * inv_t - lse);
        }
        out->n_top = n;
    }
    return BATON_OK;
}
