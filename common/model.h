/* Model: load a llama-family GGUF onto a backend and run the forward over a
 * batch that mixes prefill chunks and decode tokens of many sequences.
 *
 * Architectures (key general.architecture):
 *   llama  Llama 2/3, Mistral, SmolLM2, TinyLlama: RMSNorm, GQA attention,
 *          RoPE in ggml's "normal" mode (adjacent pairs (2i, 2i+1); the GGUF
 *          converter permutes attn_q/attn_k rows so that this mode applies),
 *          SwiGLU FFN, tied output when output.weight is absent, llama-3
 *          frequency factors from rope_freqs.weight when present.
 *   qwen2  same plus q/k/v biases, RoPE in NeoX mode (pairs (i, i + d/2)).
 * Both as llama.cpp builds them (src/llama-model.cpp llm_build_llama,
 * llm_build_qwen2; rope modes from llama_model_rope_type).
 *
 * Hyperparameters come from the `<arch>.*` keys: block_count,
 * embedding_length, feed_forward_length, attention.head_count,
 * attention.head_count_kv (default head_count), context_length,
 * attention.layer_norm_rms_epsilon, rope.freq_base (default 10000),
 * rope.dimension_count (must equal head_dim when present),
 * rope.scaling.type / rope.scaling.factor ("none", "linear": freq_scale =
 * 1/factor), or the older rope.scale_linear.
 *
 * Weights are converted with gguf_tensor_to_f32 and handed to the backend
 * (backend_ops.weight_create), which stores them in its weight dtype.
 *
 * Threading: a model_t is used by one thread at a time (the forward owns
 * scratch buffers). */
#ifndef BATON_COMMON_MODEL_H
#define BATON_COMMON_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/gguf.h"
#include "common/status.h"
#include "kernels/backend.h"

typedef enum model_arch {
    MODEL_ARCH_LLAMA = 0,
    MODEL_ARCH_QWEN2 = 1,
} model_arch_t;

typedef struct model_hparams {
    model_arch_t arch;
    int32_t n_vocab;     /* rows of token_embd.weight */
    int32_t n_ctx_train; /* <arch>.context_length: the longest sequence accepted */
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;    /* n_embd / n_head */
    int32_t n_ff;
    float rms_eps;
    float rope_freq_base;
    float rope_freq_scale; /* 1 / linear scaling factor, 1 when none */
    bool rope_neox;        /* qwen2 */
    bool tied_output;      /* output.weight absent: token_embd is the output projection */
    bool has_rope_freqs;   /* rope_freqs.weight present (llama-3 frequency factors) */
} model_hparams_t;

typedef struct model_load_params {
    /* Most tokens one model_forward may carry (sum over sequences); sizes
     * the scratch activations (about max_batch_tokens * (4 n_embd + 2 n_ff)
     * floats of backend memory). Default 512. */
    int32_t max_batch_tokens;
    /* Rows of logits computed per output GEMM (more rows are done in
     * several passes); sizes the logits scratch (rows * n_vocab floats).
     * Default 64. */
    int32_t max_logit_rows;
} model_load_params_t;

model_load_params_t model_load_params_default(void);

typedef struct model model_t;

/* Loads the model in `file` onto `be`. `file` is only read during the call
 * (it may be closed afterwards); `be` must outlive the model. `params` may
 * be NULL (defaults). Errors (detail names the key or tensor and the value):
 * BATON_ERR_UNSUPPORTED (architecture, tensor type, partial rotary, rope
 * scaling type), BATON_ERR_NOT_FOUND (missing key or tensor),
 * BATON_ERR_FORMAT (wrong key type, wrong tensor shape, inconsistent
 * hyperparameters), BATON_ERR_NO_MEMORY, or a backend error. On success
 * *out must be freed with model_free(). */
baton_status_t model_load_gguf(const gguf_file_t *file, backend_t *be,
                               const model_load_params_t *params, model_t **out);

/* gguf_open(path) + model_load_gguf + gguf_close. Same errors, plus
 * gguf_open's (BATON_ERR_IO, BATON_ERR_FORMAT, BATON_ERR_VERSION). */
baton_status_t model_load(const char *path, backend_t *be, const model_load_params_t *params,
                          model_t **out);

/* NULL-safe; frees the backend weights and scratch (not the backend). */
void model_free(model_t *m);

const model_hparams_t *model_hparams(const model_t *m);
backend_t *model_backend(const model_t *m);

/* KV geometry this model needs for a pool of `n_blocks` blocks of
 * `block_size` tokens in the backend's kv dtype. */
backend_kv_geom_t model_kv_geom(const model_t *m, int32_t n_blocks, int32_t block_size);

/* A paged KV cache view: the two pools in backend memory, each laid out as
 * kernels/backend.h says ([n_layers][n_blocks][block_size][n_kv_heads]
 * [head_dim] of geom.dtype). The pools may come from model_kv_alloc or from
 * the worker's KV block manager; the forward only reads/writes the blocks
 * named by the batch's block tables. */
typedef struct model_kv {
    backend_kv_geom_t geom;
    void *k_pool; /* backend memory */
    void *v_pool; /* backend memory */
} model_kv_t;

/* Allocates (zeroed) K and V pools of model_kv_geom(m, n_blocks, block_size)
 * with the model's backend. Free with model_kv_free(). Errors:
 * BATON_ERR_INVALID_ARG (non-positive sizes), BATON_ERR_NO_MEMORY. */
baton_status_t model_kv_alloc(const model_t *m, int32_t n_blocks, int32_t block_size,
                              model_kv_t *out);
/* Frees pools from model_kv_alloc and zeroes *kv. NULL-safe. */
void model_kv_free(const model_t *m, model_kv_t *kv);

/* Which logits a sequence wants from a step. */
typedef enum model_logits {
    MODEL_LOGITS_NONE = 0, /* a prefill chunk that is not the prompt's last */
    MODEL_LOGITS_LAST = 1, /* the step's last token (decode, last prefill chunk) */
    MODEL_LOGITS_ALL = 2,  /* every token of the step (scoring, tests) */
} model_logits_t;

/* One sequence's part of a step. */
typedef struct model_seq {
    const int32_t *tokens;      /* [n_tokens] token ids for this step (host) */
    int32_t n_tokens;           /* >= 1: a prefill chunk, or 1 for decode */
    int32_t pos;                /* position of tokens[0] = tokens already in its KV */
    const int32_t *block_table; /* [n_blocks] physical block ids (host); block j holds
                                   positions j*block_size .. (j+1)*block_size-1 */
    int32_t n_blocks;           /* must cover pos + n_tokens positions */
    model_logits_t logits;
} model_seq_t;

typedef struct model_batch {
    const model_seq_t *seqs; /* [n_seqs] */
    int32_t n_seqs;
} model_batch_t;

/* Number of logit rows `batch` asks for (sum of 1 per LAST and n_tokens per
 * ALL sequence). */
int64_t model_batch_n_logits(const model_batch_t *batch);

/* Runs one step: for every sequence, computes its tokens at positions
 * pos..pos+n_tokens-1 attending to its cached KV (positions < pos, read from
 * its blocks) and to its own earlier tokens in the step, and writes their K/V
 * into its blocks (so the next step starts at pos + n_tokens). Writes the
 * requested logits to host memory `logits_out` [model_batch_n_logits(batch),
 * n_vocab] (row-major, fp32), in sequence order, token order within a
 * sequence. Sequences must use disjoint blocks for positions written in the
 * step (blocks holding only cached positions may be shared).
 *
 * Errors, with nothing written to logits_out and no KV written:
 * BATON_ERR_INVALID_ARG (NULL arguments, empty batch or sequence, token id
 * out of vocabulary, block id outside the pool, KV geometry that does not
 * match the model), BATON_ERR_OUT_OF_RANGE (more than max_batch_tokens
 * tokens, pos + n_tokens beyond n_ctx_train or beyond the sequence's
 * blocks). A backend failure mid-step returns its status; the KV of the
 * step's positions is then undefined (earlier positions are untouched). */
baton_status_t model_forward(model_t *m, const model_kv_t *kv, const model_batch_t *batch,
                             float *logits_out);

/* Called by model_forward_layers after layer `layer` (0..n_layer-1) of a
 * step has finished, with the backend synchronised: that layer's K/V of
 * every position written in the step are in the pools and may be read
 * (e.g. sent to a peer: layer-wise KV streaming). Must not touch the model. */
typedef void (*model_layer_cb_t)(void *arg, int32_t layer);

/* model_forward, calling `layer_cb(cb_arg, l)` (may be NULL) after each
 * layer. Same errors and outputs as model_forward; a failing step calls the
 * hook for the layers finished before the failure only. */
baton_status_t model_forward_layers(model_t *m, const model_kv_t *kv, const model_batch_t *batch,
                                    float *logits_out, model_layer_cb_t layer_cb, void *cb_arg);

#endif
