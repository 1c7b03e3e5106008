/* Token sampling: logit transforms, a per-request RNG stream, log-probs.
 *
 * One sampler_t per request. It owns the request's RNG (PCG32, O'Neill
 * 2014, pcg-random.org "pcg32" XSH-RR 64/32) seeded from the request's seed,
 * so a seeded request draws the same numbers whether it runs alone or inside
 * any batch: the stream advances only when this request samples.
 *
 * Pipeline applied to one row of logits [n_vocab] (the order of llama.cpp's
 * default sampler chain, common/sampling.cpp):
 *   1. logit bias:      l[t] += bias[t]                       (OpenAI logit_bias)
 *   2. repetition:      for t seen in the last `penalty_last_n` accepted
 *                       tokens: l[t] = l[t] > 0 ? l[t] / r : l[t] * r
 *                       (Keskar et al. 2019, CTRL; llama.cpp penalties)
 *   3. presence/freq:   l[t] -= c[t] * frequency + (c[t] > 0) * presence,
 *                       c[t] = count of t in the same window
 *                       (OpenAI API reference, "frequency and presence penalties")
 *   4. temperature == 0: greedy, argmax of the row after 1-3 (lowest id on ties).
 *      otherwise        l[t] /= temperature, then truncation:
 *   5. top-k:           keep the k largest (k = 0: off)
 *   6. top-p:           keep the smallest prefix of the sorted distribution
 *                       whose probability mass reaches p (Holtzman et al. 2019)
 *   7. min-p:           keep t with p[t] >= min_p * max_t p[t] (Nguyen et al. 2024)
 *   8. draw from the renormalised kept set with one uniform number u of the
 *      request's stream, by inverse CDF over the kept tokens in token-id
 *      order (not rank order: in rank order two near-equal logits that swap
 *      under fp32 noise would swap their whole CDF segments, so a request
 *      could sample differently alone and batched).
 *
 * Log-probabilities reported (OpenAI `logprobs`): the log-softmax of the row
 * after steps 1-3 and the temperature (temperature 0 counts as 1), before the
 * truncation of 5-7, so every token has a finite value. */
#ifndef BATON_COMMON_SAMPLING_H
#define BATON_COMMON_SAMPLING_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

#define SAMPLING_MAX_LOGPROBS 20 /* OpenAI's top_logprobs limit */
#define SAMPLING_MAX_STOP_IDS 16

typedef struct sampling_logit_bias {
    int32_t token;
    float bias; /* added to the logit; OpenAI allows -100..100 */
} sampling_logit_bias_t;

typedef struct sampling_params {
    float temperature;        /* 0 = greedy; must be >= 0 */
    int32_t top_k;            /* 0 = off */
    float top_p;              /* 1 = off; in (0, 1] */
    float min_p;              /* 0 = off; in [0, 1] */
    float repetition_penalty; /* 1 = off; > 0 */
    float presence_penalty;   /* 0 = off; OpenAI range -2..2 */
    float frequency_penalty;  /* 0 = off; OpenAI range -2..2 */
    int32_t penalty_last_n;   /* window of accepted tokens for 2-3; 0 = all */
    uint64_t seed;            /* RNG stream seed */
    int32_t n_logprobs;       /* top-n alternatives to report, 0..SAMPLING_MAX_LOGPROBS */
    const sampling_logit_bias_t *logit_bias; /* [n_logit_bias], copied at init */
    int32_t n_logit_bias;
    const int32_t *stop_ids;  /* [n_stop_ids] token ids that end the request, copied */
    int32_t n_stop_ids;       /* 0..SAMPLING_MAX_STOP_IDS */
} sampling_params_t;

/* The neutral parameters: greedy, every transform off, penalty_last_n 64,
 * seed 0. */
sampling_params_t sampling_params_default(void);

typedef struct sampling_logprob {
    int32_t token;
    float logprob; /* natural log */
} sampling_logprob_t;

typedef struct sampling_result {
    int32_t token;     /* the chosen token */
    float logprob;     /* its log-probability (see top of file) */
    bool is_stop;      /* token is one of params.stop_ids */
    int32_t n_top;     /* entries in top[] (= params.n_logprobs) */
    sampling_logprob_t top[SAMPLING_MAX_LOGPROBS]; /* most likely first, ties by id */
} sampling_result_t;

/* PCG32 (pcg-c-basic "pcg32_random_r": XSH-RR output, 64-bit LCG state).
 * Exposed so tests can check it against the reference generator. */
typedef struct sampling_rng {
    uint64_t state;
    uint64_t inc; /* stream selector, always odd */
} sampling_rng_t;

/* pcg32_srandom_r(rng, initstate, initseq). */
void sampling_rng_seed(sampling_rng_t *rng, uint64_t initstate, uint64_t initseq);
/* Next 32 uniformly distributed bits. */
uint32_t sampling_rng_next(sampling_rng_t *rng);
/* Uniform double in [0, 1) from one 32-bit draw. */
double sampling_rng_uniform(sampling_rng_t *rng);

typedef struct sampler sampler_t;

/* Validates `params` against `n_vocab` (every range above; bias and stop ids
 * < n_vocab) and creates a sampler. Errors: BATON_ERR_INVALID_ARG /
 * BATON_ERR_OUT_OF_RANGE naming the parameter, BATON_ERR_NO_MEMORY. Free with
 * sampler_free. */
baton_status_t sampler_init(const sampling_params_t *params, int32_t n_vocab,
                            sampler_t **out);

/* NULL-safe. */
void sampler_free(sampler_t *s);

/* Appends a token to the history the penalties look at. The caller chooses
 * what counts: baton's engines accept the prompt tokens and every generated
 * token (llama.cpp behaviour). Errors: BATON_ERR_OUT_OF_RANGE for an id
 * outside the vocabulary, BATON_ERR_NO_MEMORY. */
baton_status_t sampler_accept(sampler_t *s, int32_t token);

/* Samples one token from `logits` [n_vocab] (host, not modified) and fills
 * *out. Does NOT accept the token (call sampler_accept). Errors:
 * BATON_ERR_INVALID_ARG for NULL arguments or a row with no finite logit. */
baton_status_t sampler_sample(sampler_t *s, const float *logits, sampling_result_t *out);

/* Tokens accepted so far. */
int64_t sampler_n_accepted(const sampler_t *s);

#endif
