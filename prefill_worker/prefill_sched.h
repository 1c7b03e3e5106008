/* Prefill scheduler: chunked prefill of many requests over one model, with
 * a radix prefix cache and layer-wise KV hand-off (DESIGN.md steps 3-4,
 * issue 4 "Prefill worker").
 *
 * One prefill_sched_t drives one model_t over one kv_pool_t and one
 * radix_cache_t (all borrowed: created by the process, which may share the
 * pool with a decode scheduler in the colocated role). It knows nothing of
 * ZeroMQ or UCX: it calls the hooks below, and the process (prefill_worker.c)
 * or the colocated worker turns them into UCX puts and control messages.
 *
 * Request life cycle:
 *   submit -> QUEUED -> (radix match at its first chunk) RUNNING -> chunks ->
 *   after the last chunk: first token sampled, full blocks inserted in the
 *   radix cache ->
 *     destination known (or local): every remaining layer of every block is
 *       sent, hooks.finished(status OK) -> DONE, still holding its blocks
 *       until prefill_sched_release (the puts read them until the flush) or
 *       prefill_sched_detach (colocated: hand the blocks to the decoder);
 *     destination unknown: WAIT_DEST, blocks held, for at most
 *       kv_destination_timeout_ms, then hooks.finished(BATON_ERR_TIMEOUT).
 *   Any failure (forward, send_layer, bad destination, timeout): the request's
 *   blocks are released and hooks.finished(error) is called; the request is
 *   then gone. prefill_sched_abort releases a request in any state, calls no
 *   hook.
 *
 * Step (prefill_sched_step): a token budget (max_batch_tokens) is filled
 * FCFS: the oldest unfinished request's next chunk first, then the next
 * request's, until the budget or max_seqs_per_step is reached. Each chunk is
 * min(remaining prompt, budget left) tokens. Before a request's first chunk
 * its chain block hashes (common/block_hash.h, seed hash_seed, salt
 * {hi 0, lo cache_salt}, zero salt when cache_salt is 0) are matched in the
 * radix cache; at most floor((n_tokens - 1) / block_size) blocks are
 * reused so the last prompt token is always recomputed (its logits give the
 * first token). Blocks for the chunk come from the pool; when short, the
 * radix cache evicts LRU unreferenced blocks; if still short, the request
 * (and every younger one) waits for a later step. (Younger requests only get
 * budget left over by older ones' final chunks, so they never hold blocks an
 * older running request waits for.)
 *
 * Layer-wise transfer: for a request whose destination is known, after each
 * layer of a step the blocks that became final in that step are passed to
 * hooks.send_layer (full blocks after a middle chunk; every remaining block,
 * the partial last one included, after the final chunk). Blocks already final
 * when the destination arrives (cached prefix, earlier chunks) are sent from
 * prefill_sched_set_destination. Blocks [0, n_skip_blocks) are never sent.
 *
 * Threads: one thread owns a scheduler (it runs the model). Hooks run on that
 * thread; send_layer runs inside the forward and must not call the
 * scheduler; finished may call prefill_sched_release / _detach for any DONE
 * request (e.g. transfers of other requests completing inside a flush) and
 * prefill_sched_abort for its own request, and nothing else of the
 * scheduler. */
#ifndef BATON_PREFILL_WORKER_PREFILL_SCHED_H
#define BATON_PREFILL_WORKER_PREFILL_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/kv_pool.h"
#include "common/kv_transfer.h"
#include "common/model.h"
#include "common/radix_cache.h"
#include "common/sampling.h"
#include "common/status.h"

#define PREFILL_SCHED_ID_BYTES 16 /* request id size (proto_request_id_t) */

typedef struct prefill_sched prefill_sched_t;

typedef struct prefill_sched_config {
    int32_t max_batch_tokens;           /* token budget of one step (default 512); must not
                                           exceed the model's max_batch_tokens */
    int32_t max_seqs_per_step;          /* sequences in one step (default 64) */
    uint64_t hash_seed;                 /* block-hash cluster secret (--hash-seed) */
    uint32_t kv_destination_timeout_ms; /* WAIT_DEST bound (default 10000) */
} prefill_sched_config_t;

/* What the scheduler reports when a request leaves computing. */
typedef struct prefill_sched_result {
    const uint8_t *request_id;   /* [PREFILL_SCHED_ID_BYTES] */
    void *user;                  /* the submit's user pointer */
    baton_status_t status;       /* BATON_OK or the failure */
    const char *error;           /* "" on success, else a one-line reason */
    sampling_result_t sample;    /* first token, its logprob and top-n (status OK) */
    int32_t n_prompt_tokens;
    int32_t n_cached_tokens;     /* prompt tokens reused from the radix cache */
    int32_t n_blocks;            /* blocks of the prompt: ceil(n_prompt_tokens / block_size) */
    int32_t n_blocks_sent;       /* blocks handed to send_layer (all layers), i.e.
                                    n_blocks - n_skip_blocks on success; 0 for local */
    uint64_t queue_us;           /* submit -> first chunk */
    uint64_t compute_us;         /* first chunk start -> last chunk end */
    uint64_t wait_dest_us;       /* last chunk end -> destination known (0 when it was) */
    uint64_t device_us;          /* device time: the request's share of each step's forward
                                    time, split in proportion to its tokens in the step */
} prefill_sched_result_t;

typedef struct prefill_sched_hooks {
    void *arg;
    /* Layer `layer` of pairs[i].src_block (local pool) is final for the
     * request and goes to pairs[i].dst_block of its destination; dest_user
     * is the pointer given to prefill_sched_set_destination. Returning an
     * error fails the request (after the step). May be NULL when no request
     * ever gets a destination (colocated). */
    baton_status_t (*send_layer)(void *arg, void *dest_user, int32_t layer,
                                 const kv_transfer_block_pair_t *pairs, size_t n_pairs);
    /* A request finished computing (status OK: DONE, blocks still held) or
     * failed (blocks already released, request gone). `res` and its
     * pointers are valid during the call only. Required. */
    void (*finished)(void *arg, const prefill_sched_result_t *res);
} prefill_sched_hooks_t;

/* A request to submit; everything is copied. */
typedef struct prefill_sched_request {
    const uint8_t *request_id;   /* [PREFILL_SCHED_ID_BYTES] */
    const int32_t *tokens;       /* [n_tokens] prompt token ids (< n_vocab) */
    int32_t n_tokens;            /* 1..model n_ctx_train */
    sampling_params_t sampling;  /* first-token sampling (seeded stream per request) */
    uint64_t cache_salt;         /* 0 = shared cache */
    bool local;                  /* colocated: no destination, finish as soon as computed */
    void *user;                  /* handed back in prefill_sched_result_t */
} prefill_sched_request_t;

/* Load figures for heartbeats and metrics. */
typedef struct prefill_sched_stats {
    uint64_t queued_prefill_tokens; /* prompt tokens not yet computed (QUEUED + RUNNING) */
    uint32_t n_waiting;             /* QUEUED requests */
    uint32_t n_running;             /* RUNNING requests (mid-prompt chunks) */
    uint32_t n_wait_dest;           /* computed, waiting for KVDestination */
    uint32_t n_done;                /* DONE, blocks held until release/detach */
    uint32_t n_early_dest;          /* destinations stored before their request */
    uint64_t steps;                 /* forward steps run */
    uint64_t busy_us;               /* time spent inside steps */
    uint64_t step_tokens;           /* tokens computed, all steps */
    uint64_t idle_gaps;             /* steps that started after a gap with prompt tokens left */
    uint64_t idle_gap_us;           /* sum of those gaps (last step end -> next step start) */
    uint64_t idle_gap_max_us;       /* longest such gap */
    uint64_t finished_ok, failed;   /* requests by outcome */
} prefill_sched_stats_t;

/* Defaults listed above (hash_seed 0). */
prefill_sched_config_t prefill_sched_config_default(void);

/* Creates a scheduler. `model`, `pool` and `cache` are borrowed and must
 * outlive it; the pool's geometry must be the model's (model_kv_geom);
 * `cache` must map blocks of `pool`. `hooks` is copied (finished required).
 * Errors: BATON_ERR_INVALID_ARG (NULL, config out of range, geometry
 * mismatch), BATON_ERR_NO_MEMORY. Free with prefill_sched_free. */
baton_status_t prefill_sched_init(model_t *model, kv_pool_t *pool, radix_cache_t *cache,
                                  const prefill_sched_config_t *config,
                                  const prefill_sched_hooks_t *hooks, prefill_sched_t **out);

/* Releases every request's blocks (no hooks) and frees the scheduler.
 * NULL-safe. */
void prefill_sched_free(prefill_sched_t *s);

/* Queues a request. A destination that arrived earlier for this id is
 * attached now. Errors (nothing queued): BATON_ERR_INVALID_ARG (NULL, a
 * request id already present), BATON_ERR_OUT_OF_RANGE (n_tokens < 1 or
 * beyond the model's context, a token id outside the vocabulary; sampling
 * parameters out of range), BATON_ERR_NO_SPACE (the prompt needs more blocks
 * than the whole pool: it could never run), BATON_ERR_NO_MEMORY. */
baton_status_t prefill_sched_submit(prefill_sched_t *s, const prefill_sched_request_t *req);

/* The decode side's blocks for a request: dst_blocks[j] receives prompt
 * block j (every layer), j in [n_skip_blocks, n_dst_blocks). `dest_user` is
 * passed to send_layer. Blocks already final are sent at once (send_layer
 * from this call); a request already computed finishes here (finished hook).
 * An unknown id (the destination overtook the request) is stored and
 * applied at submit; it expires after kv_destination_timeout_ms.
 * Errors: BATON_ERR_INVALID_ARG (NULL, n_skip_blocks > n_dst_blocks, a
 * second destination for the request), BATON_ERR_OUT_OF_RANGE (n_dst_blocks
 * differs from the prompt's block count; the request is failed: released and
 * finished with this status), BATON_ERR_NO_SPACE (too many early
 * destinations stored), BATON_ERR_NO_MEMORY. A send_layer error fails the
 * request (finished hook) and is returned. */
baton_status_t prefill_sched_set_destination(prefill_sched_t *s, const uint8_t *request_id,
                                             const int32_t *dst_blocks, int32_t n_dst_blocks,
                                             int32_t n_skip_blocks, void *dest_user);

/* Runs one forward step if any request has prompt left and blocks can be
 * had, and expires WAIT_DEST requests and early destinations past their
 * bound. *n_tokens_out (may be NULL) gets the tokens computed (0: nothing to
 * run now; block in the event loop). Errors: BATON_ERR_INVALID_ARG (NULL).
 * A forward failure fails that step's requests (finished hook) and is not
 * returned. */
baton_status_t prefill_sched_step(prefill_sched_t *s, int32_t *n_tokens_out);

/* True when a step would compute something now (requests with prompt left). */
bool prefill_sched_has_work(const prefill_sched_t *s);

/* Microseconds until the earliest WAIT_DEST / early-destination deadline
 * (for the event loop's timer), or -1 when there is none. */
int64_t prefill_sched_next_deadline_us(const prefill_sched_t *s);

/* Drops a DONE request: releases its blocks (the radix cache keeps its own
 * references on the full ones). BATON_ERR_NOT_FOUND for an unknown id,
 * BATON_ERR_INVALID_ARG when the request is not DONE. */
baton_status_t prefill_sched_release(prefill_sched_t *s, const uint8_t *request_id);

/* Colocated hand-off: moves a DONE request's block table (its block
 * references, n_tokens = prompt length) to *out (which must be empty) and
 * drops the request. The caller releases it with kv_block_table_release.
 * Errors as prefill_sched_release. */
baton_status_t prefill_sched_detach(prefill_sched_t *s, const uint8_t *request_id,
                                    kv_block_table_t *out);

/* Abort: releases every reference of the request in any state (and an early
 * destination stored for it) without calling hooks. *was_active (may be
 * NULL) is true when the request was queued/running/waiting/done here.
 * BATON_ERR_NOT_FOUND when nothing was known under the id. */
baton_status_t prefill_sched_abort(prefill_sched_t *s, const uint8_t *request_id,
                                   bool *was_active);

/* Current counters. */
void prefill_sched_get_stats(const prefill_sched_t *s, prefill_sched_stats_t *out);

/* Block size of the scheduler's pool (tokens). */
int32_t prefill_sched_block_size(const prefill_sched_t *s);

#endif
