/* Sampling on the device (CUDA backend): greedy argmax and temperature /
 * top-k / top-p sampling over fp32 logits that live in backend memory, so
 * only token ids cross to the host. kernels/backend.h has no sampling op yet;
 * these functions take the CUDA backend handle.
 *
 * Semantics (the usual llama.cpp / vLLM order): logits / temperature ->
 * keep the top_k highest logits (top_k <= 0: all; ties at the k-th value are
 * all kept) -> softmax over the survivors -> keep the smallest set of the
 * highest-probability survivors whose mass reaches top_p (top_p >= 1: all;
 * ties at the cut are all kept) -> draw one id with probability proportional
 * to exp((logit - max) / temperature) among the kept ids. temperature <= 0
 * means greedy. The draw uses `uniform[i]` in [0, 1) supplied by the caller
 * (its own RNG), so runs are reproducible. Greedy picks the lowest index among
 * equal maxima. */
#ifndef BATON_KERNELS_CUDA_SAMPLING_H
#define BATON_KERNELS_CUDA_SAMPLING_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/backend.h"

/* out_ids[i] (host) = argmax_j logits[i, j] for i < n; logits [n, vocab]
 * fp32 in backend memory. Synchronous. Errors: INVALID_ARG, UNSUPPORTED
 * (no CUDA), INTERNAL (CUDA failure). */
baton_status_t cuda_sample_greedy(backend_t *be, const float *logits, int32_t n, int32_t vocab,
                                  int32_t *out_ids);

/* Samples one id per row as described above. temperature, top_k, top_p and
 * uniform are host arrays [n] (one setting per sequence). Synchronous.
 * Errors: INVALID_ARG (bad sizes, top_p <= 0, uniform outside [0,1)),
 * UNSUPPORTED, INTERNAL. */
baton_status_t cuda_sample(backend_t *be, const float *logits, int32_t n, int32_t vocab,
                           const float *temperature, const int32_t *top_k, const float *top_p,
                           const float *uniform, int32_t *out_ids);

#endif
