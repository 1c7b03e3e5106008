/* router: per-request stage records, per-tenant sums, per-worker
 * utilisation and the serving configuration (issue 6 "Also in the product",
 * DESIGN.md "Observability and cost").
 *
 * Stage record. For every finished request the router keeps
 *   {request_id, choice, complete, e2e_ms,
 *    stages_ms {queue, prefill, transfer, decode},
 *    worker_ms {queue, prefill, transfer, decode}   (the workers' own figures),
 *    device_seconds {prefill, decode},
 *    prefix_cache {prompt_tokens, predicted_hit_tokens, cached_tokens}, ...}
 * and attaches it as the `baton` object of the final response / last SSE
 * chunk; observe_ring_t keeps the most recent ones for GET /v1/requests/{id}.
 *
 * Stage decomposition (observe_stages), all on the router's monotonic clock
 * except the two worker-measured durations:
 *   e2e      = router arrival -> last byte written to the client;
 *   decode   = the prefill's end as the router saw it -> last byte, where the
 *              prefill's end is the arrival of the prefill worker's
 *              PrefillDone copy (disaggregated) or, when there is none
 *              (colocated), last byte minus the worker's decode_us;
 *   transfer = the prefill worker's transfer_us (KV transfer after the last
 *              layer's compute: the non-overlapped part);
 *   prefill  = the prefill worker's compute_us (first chunk start -> last
 *              chunk end);
 *   queue    = the remainder before the prefill's end: router arrival ->
 *              prefill start, i.e. HTTP parsing, tokenization, routing, the
 *              decode worker's reservation, the prefill worker's queue and
 *              the control-plane messages in between.
 * Worker durations are clamped to the time the router observed, so the four
 * stages add up to e2e_ms exactly (up to float rounding).
 *
 * Device-seconds: the workers split each forward step's compute time over
 * the step's requests in proportion to their tokens and report each
 * request's sum (PrefillDone.device_us, RequestFinished.prefill_device_us /
 * decode_device_us); the record carries them as seconds.
 *
 * Not thread-safe: owned by the router's event loop. */
#ifndef BATON_ROUTER_OBSERVE_H
#define BATON_ROUTER_OBSERVE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "router/metrics.h"

#define OBSERVE_N_STAGES 4          /* queue, prefill, transfer, decode */
#define OBSERVE_TENANT_MAX 63       /* bytes of a tenant label value */
#define OBSERVE_MAX_TENANTS 1024    /* distinct tenants; more go to "other" */
#define OBSERVE_UTIL_WINDOW_MS 60000 /* utilisation window */
#define OBSERVE_UTIL_SAMPLES 256    /* heartbeats kept per worker (500 ms apart) */

/* Stage names in record order: "queue", "prefill", "transfer", "decode". */
extern const char *const observe_stage_names[OBSERVE_N_STAGES];

/* Inputs of the stage decomposition, microseconds. Instants are the
 * router's monotonic clock (0 = did not happen); durations are the
 * workers'. */
typedef struct observe_times {
    uint64_t arrival_us;      /* the HTTP request arrived */
    uint64_t prefill_done_us; /* the PrefillDone copy arrived (0 = none) */
    uint64_t end_us;          /* the last byte was written (>= arrival_us) */
    uint64_t prefill_us;      /* worker: prefill compute */
    uint64_t transfer_us;     /* worker: non-overlapped KV transfer */
    uint64_t decode_us;       /* worker: PrefillDone -> finish (used without PrefillDone) */
} observe_times_t;

/* Splits arrival -> end into stages_ms[queue, prefill, transfer, decode]
 * as described above; *e2e_ms = (end - arrival) / 1000. The stages are
 * >= 0 and sum to *e2e_ms. */
void observe_stages(const observe_times_t *t, double stages_ms[OBSERVE_N_STAGES], double *e2e_ms);

/* One finished (or failed) request. */
typedef struct observe_record {
    char request_id[48];             /* the response id: "cmpl-..." / "chatcmpl-..." */
    uint32_t choice;                 /* choice index within the response */
    char tenant[OBSERVE_TENANT_MAX + 1];
    bool complete;                   /* finished OK and the worker's RequestFinished arrived */
    char finish_reason[16];          /* "stop", "length", "abort", "error" */
    double e2e_ms;
    double stages_ms[OBSERVE_N_STAGES];
    double worker_ms[OBSERVE_N_STAGES]; /* workers' queue (both sides), prefill, transfer, decode */
    uint64_t prefill_device_us, decode_device_us;
    uint32_t prompt_tokens, completion_tokens;
    uint32_t predicted_hit_tokens;   /* the router's radix index prediction */
    uint32_t cached_tokens;          /* measured by the prefill worker */
    uint64_t transfer_bytes;
    char prefill_worker[64], decode_worker[64];
} observe_record_t;

/* The record as JSON (new reference; NULL when out of memory): the keys of
 * the header comment, device_seconds in seconds, times in milliseconds. */
json_t *observe_record_json(const observe_record_t *rec);

/* One JSON line (compact, no newline) for the log; malloc'd, NULL when out
 * of memory. */
char *observe_record_line(const observe_record_t *rec);

/* Bounded ring of the most recent records. */
typedef struct observe_ring {
    observe_record_t *items; /* [cap] */
    size_t cap, n, next;     /* next = slot the next push overwrites */
} observe_ring_t;

/* Errors: BATON_ERR_INVALID_ARG (cap 0), BATON_ERR_NO_MEMORY. */
baton_status_t observe_ring_init(observe_ring_t *ring, size_t cap);
void observe_ring_free(observe_ring_t *ring); /* NULL-safe */
/* Copies rec in, evicting the oldest record when full. */
void observe_ring_push(observe_ring_t *ring, const observe_record_t *rec);
/* The newest record with this request id and choice, or NULL. The pointer
 * is valid until the next push. */
observe_record_t *observe_ring_find(observe_ring_t *ring, const char *request_id, uint32_t choice);

/* Per-tenant sums. */
typedef struct observe_tenant {
    char name[OBSERVE_TENANT_MAX + 1];
    uint64_t device_us, prompt_tokens, completion_tokens, requests;
} observe_tenant_t;

typedef struct observe_tenants {
    observe_tenant_t *items;
    size_t n, cap;
} observe_tenants_t;

/* Writes the tenant label of a request into out: the authenticated API key
 * as "key-" + 12 hex digits of its XXH3-64 (a key is a secret and never
 * appears in metrics) when api_key is non-NULL, else the `user` field with
 * every byte outside [A-Za-z0-9._:@-] replaced by '_' and cut to
 * OBSERVE_TENANT_MAX bytes, else "default". */
void observe_tenant_name(const char *api_key, const char *user, char out[OBSERVE_TENANT_MAX + 1]);

/* Adds to the sums of `name` (created on first use; beyond
 * OBSERVE_MAX_TENANTS distinct names the sums go to "other"). Errors:
 * BATON_ERR_NO_MEMORY (nothing added). */
baton_status_t observe_tenants_add(observe_tenants_t *t, const char *name, uint64_t device_us,
                                   uint64_t prompt_tokens, uint64_t completion_tokens,
                                   uint64_t requests);
void observe_tenants_free(observe_tenants_t *t); /* NULL-safe */
/* Prometheus text: baton_router_tenant_{device_seconds,prompt_tokens,
 * completion_tokens,requests}_total{tenant="..."}. */
void observe_tenants_write(metrics_text_t *out, const observe_tenants_t *t);

/* Busy fraction of one worker over the last OBSERVE_UTIL_WINDOW_MS, from
 * its heartbeats' cumulative busy_us. */
typedef struct observe_util {
    uint64_t epoch;
    uint64_t t_ms[OBSERVE_UTIL_SAMPLES];    /* router monotonic ms at receipt */
    uint64_t busy_us[OBSERVE_UTIL_SAMPLES]; /* worker's cumulative busy time */
    size_t n, next;
} observe_util_t;

/* Records one heartbeat; a new epoch (restart) forgets the old samples. */
void observe_util_add(observe_util_t *u, uint64_t epoch, uint64_t now_ms, uint64_t busy_us);
/* Busy fraction in [0, 1] between the oldest sample within the window and
 * the newest; false when fewer than two samples span it. */
bool observe_util_fraction(const observe_util_t *u, uint64_t now_ms, double *out);

/* system_fingerprint of a serving configuration: "fp_" + the first 10 hex
 * digits of XXH3-64 of its compact JSON with sorted keys, into out (14
 * bytes with the NUL). The same configuration gives the same fingerprint. */
void observe_fingerprint(const json_t *config, char out[16]);

#endif
