/* router: metrics (see metrics.h). */
#include "router/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double metrics_latency_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                         0.5,   1,      2.5,   5,    10,    30,   60,  120};
const size_t metrics_latency_n_bounds =
    sizeof(metrics_latency_bounds) / sizeof(metrics_latency_bounds[0]);

void metrics_hist_init(metrics_hist_t *h, const double *bounds, size_t n_bounds) {
    memset(h, 0, sizeof(*h));
    h->bounds = bounds;
    h->n_bounds = n_bounds > METRICS_HIST_MAX_BUCKETS ? METRICS_HIST_MAX_BUCKETS : n_bounds;
}

void metrics_hist_observe(metrics_hist_t *h, double seconds) {
    size_t i = 0;
    while (i < h->n_bounds && seconds > h->bounds[i])
        i++;
    h->counts[i]++;
    h->sum += seconds;
    h->count++;
}

void metrics_text_printf(metrics_text_t *t, const char *fmt, ...) {
    if (t->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if (t->buf && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t c = t->cap ? t->cap * 2 : 4096;
        while (c < t->len + (size_t)n + 1)
            c *= 2;
        char *b = realloc(t->buf, c);
        if (!b) {
            t->failed = true;
            return;
        }
        t->buf = b;
        t->cap = c;
    }
}

void metrics_text_free(metrics_text_t *t) {
    if (!t)
        return;
    free(t->buf);
    memset(t, 0, sizeof(*t));
}

void metrics_hist_write(metrics_text_t *t, const char *name, const char *help,
                        const char *labels, const metrics_hist_t *h) {
    const char *sep = labels && labels[0] ? "," : "";
    labels = labels ? labels : "";
    if (help) {
        metrics_text_printf(t, "# HELP %s %s\n", name, help);
        metrics_text_printf(t, "# TYPE %s histogram\n", name);
    }
    uint64_t cum = 0;
    for (size_t i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        metrics_text_printf(t, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, h->bounds[i],
                            (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    metrics_text_printf(t, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep,
                        (unsigned long long)cum);
    metrics_text_printf(t, "%s_sum{%s} %.6f\n", name, labels, h->sum);
    metrics_text_printf(t, "%s_count{%s} %llu\n", name, labels, (unsigned long long)h->count);
}

void router_metrics_init(router_metrics_t *m) {
    memset(m, 0, sizeof(*m));
    metrics_hist_t *hs[] = {&m->ttft,    &m->itl,      &m->e2e,   &m->queue,
                            &m->prefill, &m->transfer, &m->decode};
    for (size_t i = 0; i < sizeof(hs) / sizeof(hs[0]); i++)
        metrics_hist_init(hs[i], metrics_latency_bounds, metrics_latency_n_bounds);
}

void router_metrics_write(metrics_text_t *t, const router_metrics_t *m) {
    metrics_hist_write(t, "baton_router_ttft_seconds", "Time to first token at the router.", "",
                       &m->ttft);
    metrics_hist_write(t, "baton_router_inter_token_latency_seconds",
                       "Time between consecutive tokens of one choice.", "", &m->itl);
    metrics_hist_write(t, "baton_router_e2e_seconds", "Request arrival to finish.", "", &m->e2e);
    metrics_hist_write(t, "baton_router_stage_seconds",
                       "Per-stage time reported by the workers.", "stage=\"queue\"", &m->queue);
    metrics_hist_write(t, "baton_router_stage_seconds", NULL, "stage=\"prefill\"", &m->prefill);
    metrics_hist_write(t, "baton_router_stage_seconds", NULL, "stage=\"transfer\"",
                       &m->transfer);
    metrics_hist_write(t, "baton_router_stage_seconds", NULL, "stage=\"decode\"", &m->decode);
    metrics_text_printf(t, "# HELP baton_router_requests_total Finished requests by outcome.\n"
                           "# TYPE baton_router_requests_total counter\n");
    metrics_text_printf(t, "baton_router_requests_total{outcome=\"ok\"} %llu\n",
                        (unsigned long long)m->requests_ok);
    metrics_text_printf(t, "baton_router_requests_total{outcome=\"error\"} %llu\n",
                        (unsigned long long)m->requests_error);
    metrics_text_printf(t, "baton_router_requests_total{outcome=\"aborted\"} %llu\n",
                        (unsigned long long)m->requests_aborted);
    metrics_text_printf(t, "baton_router_requests_total{outcome=\"rejected\"} %llu\n",
                        (unsigned long long)m->requests_rejected);
    metrics_text_printf(t,
                        "# TYPE baton_router_prompt_tokens_total counter\n"
                        "baton_router_prompt_tokens_total %llu\n"
                        "# TYPE baton_router_completion_tokens_total counter\n"
                        "baton_router_completion_tokens_total %llu\n",
                        (unsigned long long)m->prompt_tokens,
                        (unsigned long long)m->completion_tokens);
    metrics_text_printf(
        t,
        "# HELP baton_router_predicted_hit_blocks_total Prompt blocks the index predicted cached "
        "on the chosen prefill worker.\n"
        "# TYPE baton_router_predicted_hit_blocks_total counter\n"
        "baton_router_predicted_hit_blocks_total %llu\n"
        "# TYPE baton_router_prompt_blocks_total counter\n"
        "baton_router_prompt_blocks_total %llu\n"
        "# HELP baton_router_measured_cached_tokens_total Cached prompt tokens reported by the "
        "workers.\n"
        "# TYPE baton_router_measured_cached_tokens_total counter\n"
        "baton_router_measured_cached_tokens_total %llu\n"
        "# TYPE baton_router_measured_prompt_tokens_total counter\n"
        "baton_router_measured_prompt_tokens_total %llu\n"
        "# TYPE baton_router_predicted_hit_rate gauge\n"
        "baton_router_predicted_hit_rate %.6f\n"
        "# TYPE baton_router_measured_hit_rate gauge\n"
        "baton_router_measured_hit_rate %.6f\n"
        "# TYPE baton_router_transfer_bytes_total counter\n"
        "baton_router_transfer_bytes_total %llu\n",
        (unsigned long long)m->predicted_hit_blocks, (unsigned long long)m->prompt_full_blocks,
        (unsigned long long)m->measured_cached_tokens,
        (unsigned long long)m->measured_prompt_tokens,
        m->prompt_full_blocks ? (double)m->predicted_hit_blocks / (double)m->prompt_full_blocks
                              : 0.0,
        m->measured_prompt_tokens
            ? (double)m->measured_cached_tokens / (double)m->measured_prompt_tokens
            : 0.0,
        (unsigned long long)m->transfer_bytes);
}
