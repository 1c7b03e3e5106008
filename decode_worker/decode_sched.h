/* Decode scheduler: continuous batching of many sequences over one model
 * and one paged KV pool (DESIGN.md steps 2 and 4, issue 4 "Decode worker").
 *
 * One decode_sched_t drives one model_t over one kv_pool_t (both borrowed;
 * the colocated worker may share the pool with a prefill scheduler). It
 * knows nothing of ZeroMQ or UCX: it calls the hooks below and the process
 * (decode_worker.c) or the colocated worker turns them into KVDestination,
 * TokenChunk and RequestFinished messages.
 *
 * Request life cycle (decode_sched_state_t):
 *   submit --never fits--> refused at once (BATON_ERR_NO_SPACE, nothing kept)
 *   submit --> QUEUED (FIFO, no blocks) --blocks free--> RESERVED
 *   RESERVED: ceil(n_prompt / B) prompt blocks + a growth watermark of
 *     min(watermark_blocks, blocks it can ever use beyond the prompt) are
 *     held, all or nothing; hooks.reserved hands the prompt blocks to the
 *     caller (-> KVDestination). Bounded by prefill_timeout_ms from the
 *     reservation: then released and finished with BATON_ERR_TIMEOUT.
 *   decode_sched_prefill_done: status OK and n_blocks_written == prompt
 *     blocks -> READY (joins the batch at the next step, max_batch allowing);
 *     otherwise released and finished with the error.
 *   RUNNING: one token per step. Stops (finish reason): an end-of-generation
 *     id from config.eog_ids unless ignore_eos, a stop id of the request
 *     (STOP); max_tokens generated or prompt + generated == max_context
 *     (LENGTH). The first token (from the prefill) counts as generated
 *     token 1 and is streamed in the sequence's first chunk entry.
 *   PREEMPTED: when a running sequence crosses a block boundary and the pool
 *     is empty, the NEWEST running sequence (latest to join) loses every
 *     block (counted in stats.preemptions); it keeps its tokens and sampler.
 *     Before it runs again (oldest preempted first, ahead of QUEUED
 *     reservations) its prompt + generated tokens except the last are
 *     recomputed with model_forward (chunks of max_recompute_tokens, no
 *     logits), then it decodes on from its last token: the KV is the same, so
 *     is the greedy continuation. A request submitted without its prompt
 *     tokens cannot be recomputed: preempting it fails it
 *     (BATON_ERR_NO_SPACE).
 *   decode_sched_abort: any state; blocks released at once, finished with
 *     DECODE_SCHED_FINISH_ABORT.
 *
 * Step (decode_sched_step): expire prefill timeouts; resume preempted
 * sequences; reserve for QUEUED ones; join READY ones; grow block tables
 * (preempting if needed); ONE model_forward over every running sequence
 * (one token each, MODEL_LOGITS_LAST); sample each with its own sampler
 * (common/sampling.h: own seed stream, penalties over prompt + generated
 * tokens, logprobs); hooks.token_chunk once with every sequence of the step;
 * then hooks.finished for each sequence that ended, whose blocks are
 * released.
 *
 * Sampler continuity: the prefill side drew the first token with a sampler
 * seeded like ours; so that the request's stream is the one a single
 * sampler would produce, the decode sampler accepts the prompt (when given)
 * and the first token and, when temperature > 0, consumes the one uniform
 * draw the first token used (common/sampling.h draws exactly one per
 * sample).
 *
 * Threads: one thread owns a scheduler (it runs the model). Hooks run on
 * that thread, from submit/prefill_done/abort/step (reserved may fire from
 * any of them, as blocks free up), and must not call the scheduler. */
#ifndef BATON_DECODE_WORKER_DECODE_SCHED_H
#define BATON_DECODE_WORKER_DECODE_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/kv_pool.h"
#include "common/model.h"
#include "common/sampling.h"
#include "common/status.h"

#define DECODE_SCHED_ID_BYTES 16 /* request id size (proto_request_id_t) */
#define DECODE_SCHED_MAX_EOG 64  /* end-of-generation ids in the config */

typedef struct decode_sched decode_sched_t;

typedef enum decode_sched_finish {
    DECODE_SCHED_FINISH_NONE = 0,   /* still running */
    DECODE_SCHED_FINISH_STOP = 1,   /* EOS/EOT or a stop token id */
    DECODE_SCHED_FINISH_LENGTH = 2, /* max_tokens or the context limit */
    DECODE_SCHED_FINISH_ABORT = 3,  /* decode_sched_abort */
    DECODE_SCHED_FINISH_ERROR = 4,  /* failed; see status/error */
} decode_sched_finish_t;

typedef enum decode_sched_state {
    DECODE_SCHED_STATE_QUEUED = 0,    /* waiting for blocks */
    DECODE_SCHED_STATE_RESERVED = 1,  /* blocks held, waiting for PrefillDone */
    DECODE_SCHED_STATE_READY = 2,     /* prefill done, joins at the next step */
    DECODE_SCHED_STATE_RUNNING = 3,   /* in the batch */
    DECODE_SCHED_STATE_PREEMPTED = 4, /* blocks taken back, recompute pending */
} decode_sched_state_t;

typedef struct decode_sched_config {
    int32_t max_batch;            /* running sequences per step (default 64) */
    int32_t watermark_blocks;     /* growth blocks reserved with the prompt, per
                                     sequence (default 1: the first B generated
                                     tokens never wait for the pool) */
    uint32_t prefill_timeout_ms;  /* RESERVED -> PrefillDone bound (default 30000) */
    int32_t max_context;          /* longest sequence (prompt + generated);
                                     0 = the model's n_ctx_train (default) */
    int32_t max_recompute_tokens; /* tokens per recompute forward (default 512);
                                     must not exceed the model's max_batch_tokens */
    const int32_t *eog_ids;       /* [n_eog_ids] end-of-generation ids (copied),
                                     e.g. every id tokenizer_is_eog accepts */
    int32_t n_eog_ids;            /* 0..DECODE_SCHED_MAX_EOG */
} decode_sched_config_t;

/* Defaults listed above, no eog ids. */
decode_sched_config_t decode_sched_config_default(void);

/* A DecodeRequest; everything is copied at submit. */
typedef struct decode_sched_request {
    const uint8_t *request_id;     /* [DECODE_SCHED_ID_BYTES] */
    int32_t n_prompt_tokens;       /* >= 1 */
    const int32_t *prompt_tokens;  /* [n_prompt_tokens] or NULL: then penalties see
                                      only generated tokens and preemption fails it */
    sampling_params_t sampling;    /* own seed, penalties, n_logprobs, stop ids */
    int32_t max_tokens;            /* >= 1, counts the first token */
    bool ignore_eos;               /* do not stop at config.eog_ids */
    bool logprobs;                 /* report each token's logprob */
    void *user;                    /* handed back in every hook */
} decode_sched_request_t;

/* PrefillDone as the scheduler needs it. */
typedef struct decode_sched_prefill {
    baton_status_t status;         /* BATON_OK or the prefill's failure */
    const char *error;             /* reason when status != OK (may be NULL) */
    int32_t first_token;           /* < n_vocab */
    float first_logprob;
    const sampling_logprob_t *top; /* [n_top] first token's alternatives */
    int32_t n_top;                 /* 0..SAMPLING_MAX_LOGPROBS */
    int32_t n_blocks_written;      /* must equal the reserved prompt blocks */
    uint64_t queue_us, compute_us, transfer_us; /* prefill side, reported back */
    uint64_t transfer_bytes;
    int32_t cached_tokens;         /* prompt tokens the prefill worker took from its
                                      radix cache (reported back in usage) */
    uint64_t device_us;            /* the prefill side's device time (PrefillDone.device_us) */
} decode_sched_prefill_t;

/* One request's new tokens in a step (one TokenChunk entry). */
typedef struct decode_sched_entry {
    const uint8_t *request_id;     /* [DECODE_SCHED_ID_BYTES] */
    void *user;
    const int32_t *tokens;         /* [n_tokens] new tokens, 1 or 2 (the first
                                      token rides with the first step's) */
    int32_t n_tokens;
    const float *logprobs;         /* [n_tokens] when the request asked, else NULL */
    const sampling_logprob_t *top; /* [n_tokens * top_k] row-major, or NULL */
    int32_t top_k;                 /* the request's n_logprobs (0: none) */
    decode_sched_finish_t finish;  /* NONE or why this was the last entry */
} decode_sched_entry_t;

/* A request leaving the scheduler. */
typedef struct decode_sched_result {
    const uint8_t *request_id;     /* [DECODE_SCHED_ID_BYTES] */
    void *user;
    decode_sched_finish_t finish;  /* never NONE */
    baton_status_t status;         /* BATON_OK unless finish is ERROR */
    const char *error;             /* "" unless ERROR */
    int32_t n_prompt_tokens;
    int32_t n_generated;           /* completion tokens, first one included */
    uint64_t queue_us;             /* submit -> blocks reserved (decode side) */
    decode_sched_prefill_t prefill;/* as received (error/top pointers NULL); zero
                                      when no PrefillDone came */
    uint64_t decode_us;            /* PrefillDone -> finish */
    uint64_t device_us;            /* device time: the request's share of each decode
                                      step's forward time (one token each, equal shares)
                                      plus its own recomputes after preemption */
} decode_sched_result_t;

typedef struct decode_sched_hooks {
    void *arg;
    /* Blocks were reserved: prompt block j goes to block_ids[j] (every
     * layer), j < n_blocks = ceil(n_prompt_tokens / B). Optional (NULL:
     * colocated callers read the table with decode_sched_block_table). */
    void (*reserved)(void *arg, const uint8_t *request_id, void *user,
                     const int32_t *block_ids, int32_t n_blocks);
    /* One step's tokens, [n] entries in batch order; valid during the call.
     * Required. */
    void (*token_chunk)(void *arg, uint64_t step_id, const decode_sched_entry_t *entries,
                        int32_t n);
    /* A request left (blocks already released). Valid during the call.
     * Required. */
    void (*finished)(void *arg, const decode_sched_result_t *res);
    /* Called after every layer of every forward the scheduler runs. Optional.
     * The decode worker progresses its UCX worker here: over transports
     * without hardware RDMA (TCP) an incoming put needs the target to
     * progress, and a whole forward step between progress calls would stall
     * the prefill workers' KV transfers. Must not call into the scheduler. */
    void (*layer_done)(void *arg);
} decode_sched_hooks_t;

/* Load figures for heartbeats and metrics. */
typedef struct decode_sched_stats {
    uint32_t n_queued;          /* QUEUED (heartbeat n_waiting) */
    uint32_t n_reserved;        /* RESERVED, waiting for PrefillDone */
    uint32_t n_ready;           /* READY */
    uint32_t n_running;         /* RUNNING */
    uint32_t n_preempted;       /* PREEMPTED now */
    uint64_t preemptions;       /* total preemptions */
    uint64_t recomputed_tokens; /* tokens recomputed after preemption */
    uint64_t steps;             /* decode steps run */
    uint64_t busy_us;           /* time inside steps */
    uint64_t tokens_generated;  /* tokens sampled by steps */
    uint64_t idle_gaps;         /* steps that started after a gap with sequences running */
    uint64_t idle_gap_us;       /* sum of those gaps (last step end -> next step start) */
    uint64_t idle_gap_max_us;   /* longest such gap */
    float batch_occupancy;      /* last step's sequences / max_batch */
    uint64_t finished_ok, failed, aborted, refused;
} decode_sched_stats_t;

/* Creates a scheduler. `model` and `pool` are borrowed and must outlive it;
 * the pool's geometry must equal model_kv_geom(model, n_blocks, B).
 * `hooks` is copied (token_chunk and finished required). Errors:
 * BATON_ERR_INVALID_ARG (NULL, config out of range, geometry mismatch),
 * BATON_ERR_NO_MEMORY. Free with decode_sched_free. */
baton_status_t decode_sched_init(model_t *model, kv_pool_t *pool,
                                 const decode_sched_config_t *config,
                                 const decode_sched_hooks_t *hooks, decode_sched_t **out);

/* Releases every request's blocks (no hooks) and frees. NULL-safe. */
void decode_sched_free(decode_sched_t *s);

/* Takes a DecodeRequest: reserves at once when the queue is empty and
 * blocks are free (hooks.reserved fires before this returns), else queues
 * it. Errors (nothing kept, no hook called): BATON_ERR_INVALID_ARG (NULL,
 * duplicate request id, max_tokens < 1), BATON_ERR_OUT_OF_RANGE (a prompt
 * token outside the vocabulary, n_prompt_tokens < 1, sampling parameters),
 * BATON_ERR_NO_SPACE (can never fit: n_prompt + max_tokens > max_context,
 * or the KV positions it may write, n_prompt + max_tokens - 1, need more
 * blocks than the pool has), BATON_ERR_NO_MEMORY. The caller reports a
 * refusal to the router (RequestFinished error). */
baton_status_t decode_sched_submit(decode_sched_t *s, const decode_sched_request_t *req);

/* PrefillDone for a RESERVED request. Status OK with n_blocks_written equal
 * to the prompt blocks: READY. Otherwise the request is released and
 * finished (ERROR with the prefill's status, or BATON_ERR_OUT_OF_RANGE for a
 * block-count mismatch) and BATON_OK is returned (the input was handled).
 * The first token's stop conditions are checked here (it may end the
 * request at its first step). Errors, nothing changed:
 * BATON_ERR_NOT_FOUND (unknown id, e.g. aborted earlier),
 * BATON_ERR_INVALID_ARG (NULL, request not RESERVED: a duplicate
 * PrefillDone), BATON_ERR_OUT_OF_RANGE (first token outside the vocabulary;
 * the request is failed as well). */
baton_status_t decode_sched_prefill_done(decode_sched_t *s, const uint8_t *request_id,
                                         const decode_sched_prefill_t *done);

/* Colocated hand-off (no reservation, no transfer): takes a request whose
 * prompt KV is already in `table` (blocks of this scheduler's pool, e.g.
 * from prefill_sched_detach; its references are MOVED in and *table is
 * left empty on success) together with its prefill result, and makes it
 * READY. n_blocks_written is ignored; the table must cover the prompt.
 * Errors (table untouched): those of decode_sched_submit, plus
 * BATON_ERR_INVALID_ARG when the table holds fewer than ceil(n_prompt / B)
 * blocks or `done` is not OK. */
baton_status_t decode_sched_adopt(decode_sched_t *s, const decode_sched_request_t *req,
                                  kv_block_table_t *table, const decode_sched_prefill_t *done);

/* Aborts a request in any state: blocks released now, hooks.finished with
 * FINISH_ABORT. BATON_ERR_NOT_FOUND when the id is unknown. */
baton_status_t decode_sched_abort(decode_sched_t *s, const uint8_t *request_id);

/* Runs one step (see top). *n_seqs_out (may be NULL) gets the sequences
 * that emitted tokens (0: nothing ran; the event loop may sleep until the
 * next input or decode_sched_next_deadline_us). A forward failure fails
 * every sequence of the step (finished ERROR) and is returned after the
 * hooks ran; a sampling failure fails only its sequence. BATON_ERR_INVALID_ARG
 * for NULL. */
baton_status_t decode_sched_step(decode_sched_t *s, int32_t *n_seqs_out);

/* True when a step would do something now: RUNNING sequences, READY ones
 * with a batch slot, the oldest PREEMPTED one when the free blocks and a
 * slot can take it, or (no preempted one waiting) the QUEUED head when the
 * free blocks cover its reservation. */
bool decode_sched_has_work(const decode_sched_t *s);

/* Microseconds until the earliest prefill timeout (0 when passed), -1 when
 * no request is RESERVED. */
int64_t decode_sched_next_deadline_us(const decode_sched_t *s);

/* State of a request; BATON_ERR_NOT_FOUND when unknown. */
baton_status_t decode_sched_get_state(const decode_sched_t *s, const uint8_t *request_id,
                                      decode_sched_state_t *out);

/* The request's block table (borrowed, valid until the next call into the
 * scheduler): for the colocated worker, which writes the prompt's KV into
 * these blocks itself. BATON_ERR_NOT_FOUND when unknown. */
baton_status_t decode_sched_block_table(const decode_sched_t *s, const uint8_t *request_id,
                                        const kv_block_table_t **out);

void decode_sched_get_stats(const decode_sched_t *s, decode_sched_stats_t *out);

/* Block size (tokens) of the scheduler's pool. */
int32_t decode_sched_block_size(const decode_sched_t *s);

#endif
