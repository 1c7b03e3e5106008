/* router: metrics aggregation and the Prometheus text exposition format
 * (https://prometheus.io/docs/instrumenting/exposition_formats/).
 *
 * Histograms have fixed upper bounds in seconds (cumulative `_bucket{le}`
 * lines, `_sum`, `_count`); counters end in `_total`. The text buffer grows
 * as needed; on allocation failure it marks itself failed and the caller
 * answers 500. Not thread-safe. */
#ifndef BATON_ROUTER_METRICS_H
#define BATON_ROUTER_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define METRICS_HIST_MAX_BUCKETS 20

typedef struct metrics_hist {
    const double *bounds;                        /* upper bounds, ascending, seconds */
    size_t n_bounds;
    uint64_t counts[METRICS_HIST_MAX_BUCKETS + 1]; /* per bucket (not cumulative); last = +Inf */
    double sum;
    uint64_t count;
} metrics_hist_t;

/* Latency bounds (seconds) used by the router's histograms. */
extern const double metrics_latency_bounds[];
extern const size_t metrics_latency_n_bounds;

void metrics_hist_init(metrics_hist_t *h, const double *bounds, size_t n_bounds);
void metrics_hist_observe(metrics_hist_t *h, double seconds);

/* Growing text buffer. */
typedef struct metrics_text {
    char *buf;
    size_t len, cap;
    bool failed; /* an allocation failed; content incomplete */
} metrics_text_t;

void metrics_text_printf(metrics_text_t *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void metrics_text_free(metrics_text_t *t);

/* Writes "# HELP", "# TYPE name histogram" (when help != NULL) and the
 * buckets of h with extra labels (e.g. `stage="prefill"`, or "" for none). */
void metrics_hist_write(metrics_text_t *t, const char *name, const char *help,
                        const char *labels, const metrics_hist_t *h);

/* Request-level aggregates kept by the router. */
typedef struct router_metrics {
    metrics_hist_t ttft;      /* request arrival -> first token at the router */
    metrics_hist_t itl;       /* between consecutive tokens of one choice */
    metrics_hist_t e2e;       /* arrival -> finish */
    metrics_hist_t queue;     /* stage: worker queue (from PrefillDone/RequestFinished) */
    metrics_hist_t prefill;   /* stage: prefill compute */
    metrics_hist_t transfer;  /* stage: KV transfer */
    metrics_hist_t decode;    /* stage: decode */
    uint64_t requests_ok, requests_error, requests_aborted, requests_rejected;
    uint64_t prompt_tokens, completion_tokens;
    uint64_t predicted_hit_blocks, prompt_full_blocks; /* router's index prediction */
    uint64_t measured_cached_tokens, measured_prompt_tokens; /* workers' RequestFinished */
    uint64_t transfer_bytes;
} router_metrics_t;

void router_metrics_init(router_metrics_t *m);

/* Writes every aggregate of m as Prometheus text. */
void router_metrics_write(metrics_text_t *t, const router_metrics_t *m);

#endif
