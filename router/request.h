/* router: one generation request (one choice of an HTTP call) and its state
 * machine, deadlines and stage trace.
 *
 * States (DESIGN.md "Request state machine"), as the router observes them:
 *   queued -> routed -> prefill_done -> decoding -> finished | failed
 * (kv_reserved and prefilling happen inside the workers and are reported by
 * PrefillDone's timings). Every state has a deadline (request_deadlines_t);
 * the server's timer fails a request whose state deadline or overall
 * deadline passed, so no request waits forever on a peer.
 *
 * The stage trace records monotonic microsecond instants (arrival, routed,
 * prefill done, first token, last token, finished) and the workers' stage
 * durations; request_trace_format writes it as one structured log line. */
#ifndef BATON_ROUTER_REQUEST_H
#define BATON_ROUTER_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/block_hash.h"
#include "common/status.h"
#include "proto/messages.h"
#include "router/observe.h"
#include "router/stream.h"

typedef enum request_state {
    REQUEST_QUEUED = 0,
    REQUEST_ROUTED,       /* PrefillRequest + DecodeRequest sent */
    REQUEST_PREFILL_DONE, /* the prefill worker's PrefillDone copy arrived */
    REQUEST_DECODING,     /* tokens are arriving */
    REQUEST_FINISHED,
    REQUEST_FAILED,
} request_state_t;

typedef struct request_deadlines {
    uint64_t routed_ms;   /* routed -> first token or PrefillDone */
    uint64_t prefill_done_ms; /* PrefillDone -> first token */
    uint64_t token_ms;    /* between two tokens while decoding */
    uint64_t total_ms;    /* arrival -> finished */
} request_deadlines_t;

typedef struct request_trace {
    uint64_t arrival_us, routed_us, prefill_done_us, first_token_us, last_token_us, finished_us;
    uint64_t queue_us, prefill_us, transfer_us, transfer_bytes, decode_us; /* workers' */
} request_trace_t;

typedef struct request {
    proto_request_id_t id;
    char id_hex[2 * PROTO_ID_BYTES + 1];
    void *call;            /* the HTTP call this choice belongs to (server-owned) */
    uint32_t index;        /* choice index */
    request_state_t state;
    uint64_t state_deadline_ms, deadline_ms; /* monotonic ms */
    int32_t *prompt;       /* [n_prompt] token ids, owned */
    size_t n_prompt;
    block_hash_t *hashes;  /* [n_hashes] chained hashes of the full blocks, owned */
    size_t n_hashes;
    uint32_t max_tokens;
    /* routing */
    uint32_t prefill_slot, decode_slot;
    char prefill_id[PROTO_WORKER_ID_MAX + 1], decode_id[PROTO_WORKER_ID_MAX + 1];
    uint64_t prefill_epoch, decode_epoch;
    uint32_t predicted_hit_blocks;
    uint64_t load_prefill_tokens; /* added to P's load; removed at PrefillDone/finish */
    uint64_t load_blocks;         /* added to D's reservations; removed at finish */
    bool routed;
    bool load_released;    /* release_load ran */
    /* output */
    stream_t *stream;
    char *text;            /* accumulated text (non-streamed responses), owned */
    size_t text_len, text_cap;
    uint32_t completion_tokens;
    size_t out_bytes;      /* text bytes emitted so far (logprobs text_offset) */
    void *logprobs;        /* json_t*: every token's logprobs (non-streamed), owned */
    void *logprobs_pending; /* json_t*: tokens not yet sent in a chunk (streamed), owned */
    uint32_t cached_tokens;
    const char *finish_reason; /* static string once finished */
    bool worker_finished;  /* RequestFinished arrived */
    bool done;             /* finished or failed as far as the client is concerned */
    int error_http_status; /* for failed requests */
    char error[256];
    request_trace_t trace;
    /* stage record (router/observe.h) */
    char response_id[48];       /* the call's response id ("cmpl-..."), kept after the call */
    char tenant[OBSERVE_TENANT_MAX + 1];
    uint64_t prefill_device_us, decode_device_us; /* workers' device time */
    char *final_text;           /* last delta, held until RequestFinished (owned) */
    size_t final_len;
    uint64_t close_deadline_ms; /* wait for RequestFinished until then (monotonic ms) */
    bool closed;                /* the client got this choice's end and its record */
    bool recorded;              /* record filled and pushed to the ring */
    observe_record_t record;
} request_t;

const char *request_state_name(request_state_t st);

/* Moves r to `st` and sets its state deadline from `d` (terminal states
 * clear it). */
void request_set_state(request_t *r, request_state_t st, uint64_t now_ms,
                       const request_deadlines_t *d);

/* Appends len bytes to r->text. Errors: BATON_ERR_NO_MEMORY. */
baton_status_t request_append_text(request_t *r, const char *text, size_t len);

/* Frees what r owns (prompt, hashes, stream, text) and r itself. NULL-safe. */
void request_free(request_t *r);

/* One structured line (key=value pairs) with the request's id, workers,
 * state, tokens, predicted hit and stage timings (ms) into buf. */
void request_trace_format(const request_t *r, char *buf, size_t buf_len);

/* Set of in-flight requests, looked up by id. */
typedef struct request_table {
    request_t **items;
    size_t n, cap;
} request_table_t;

/* Errors: BATON_ERR_NO_MEMORY. */
baton_status_t request_table_add(request_table_t *t, request_t *r);
request_t *request_table_find(const request_table_t *t, const proto_request_id_t *id);
/* Removes r (no free); false when absent. */
bool request_table_remove(request_table_t *t, const request_t *r);
void request_table_free(request_table_t *t); /* frees the array, not the requests */

#endif
