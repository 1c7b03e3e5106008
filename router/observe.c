/* router: stage records, tenant sums, utilisation (see observe.h). */
#include "router/observe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

const char *const observe_stage_names[OBSERVE_N_STAGES] = {"queue", "prefill", "transfer",
                                                           "decode"};

void observe_stages(const observe_times_t *t, double stages_ms[OBSERVE_N_STAGES], double *e2e_ms) {
    uint64_t end = t->end_us > t->arrival_us ? t->end_us : t->arrival_us;
    uint64_t e2e = end - t->arrival_us;
    /* the prefill's end as the router saw it */
    uint64_t anchor;
    if (t->prefill_done_us)
        anchor = t->prefill_done_us < t->arrival_us ? t->arrival_us
                 : t->prefill_done_us > end         ? end
                                                    : t->prefill_done_us;
    else
        anchor = end - (t->decode_us < e2e ? t->decode_us : e2e);
    uint64_t decode = end - anchor;
    uint64_t before = anchor - t->arrival_us;
    uint64_t prefill = t->prefill_us < before ? t->prefill_us : before;
    uint64_t transfer = t->transfer_us < before - prefill ? t->transfer_us : before - prefill;
    uint64_t queue = before - prefill - transfer;
    stages_ms[0] = (double)queue / 1000.0;
    stages_ms[1] = (double)prefill / 1000.0;
    stages_ms[2] = (double)transfer / 1000.0;
    stages_ms[3] = (double)decode / 1000.0;
    *e2e_ms = (double)e2e / 1000.0;
}

static json_t *stage_obj(const double *ms) {
    json_t *o = json_object();
    for (int i = 0; o && i < OBSERVE_N_STAGES; i++)
        json_object_set_new(o, observe_stage_names[i], json_real(ms[i]));
    return o;
}

json_t *observe_record_json(const observe_record_t *r) {
    return json_pack("{s:s, s:I, s:s, s:b, s:s, s:f, s:o, s:o, s:{s:f, s:f}, s:{s:I, s:I, s:I},"
                     " s:I, s:I, s:{s:s, s:s}}",
                     "request_id", r->request_id, "choice", (json_int_t)r->choice, "tenant",
                     r->tenant, "complete", r->complete, "finish_reason", r->finish_reason,
                     "e2e_ms", r->e2e_ms, "stages_ms", stage_obj(r->stages_ms), "worker_ms",
                     stage_obj(r->worker_ms), "device_seconds", "prefill",
                     (double)r->prefill_device_us / 1e6, "decode",
                     (double)r->decode_device_us / 1e6, "prefix_cache", "prompt_tokens",
                     (json_int_t)r->prompt_tokens, "predicted_hit_tokens",
                     (json_int_t)r->predicted_hit_tokens, "cached_tokens",
                     (json_int_t)r->cached_tokens, "completion_tokens",
                     (json_int_t)r->completion_tokens, "transfer_bytes",
                     (json_int_t)r->transfer_bytes, "workers", "prefill", r->prefill_worker,
                     "decode", r->decode_worker);
}

char *observe_record_line(const observe_record_t *rec) {
    json_t *j = observe_record_json(rec);
    if (!j)
        return NULL;
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

baton_status_t observe_ring_init(observe_ring_t *ring, size_t cap) {
    if (!ring || cap == 0)
        return baton_error(BATON_ERR_INVALID_ARG, "observe_ring_init: capacity 0");
    memset(ring, 0, sizeof(*ring));
    ring->items = calloc(cap, sizeof(*ring->items));
    if (!ring->items)
        return baton_error(BATON_ERR_NO_MEMORY, "observe_ring_init: %zu records", cap);
    ring->cap = cap;
    return BATON_OK;
}

void observe_ring_free(observe_ring_t *ring) {
    if (!ring)
        return;
    free(ring->items);
    memset(ring, 0, sizeof(*ring));
}

void observe_ring_push(observe_ring_t *ring, const observe_record_t *rec) {
    if (!ring->items)
        return;
    ring->items[ring->next] = *rec;
    ring->next = (ring->next + 1) % ring->cap;
    if (ring->n < ring->cap)
        ring->n++;
}

observe_record_t *observe_ring_find(observe_ring_t *ring, const char *request_id, uint32_t choice) {
    for (size_t k = 1; k <= ring->n; k++) { /* newest first */
        observe_record_t *r = &ring->items[(ring->next + ring->cap - k) % ring->cap];
        if (r->choice == choice && !strcmp(r->request_id, request_id))
            return r;
    }
    return NULL;
}

void observe_tenant_name(const char *api_key, const char *user, char out[OBSERVE_TENANT_MAX + 1]) {
    if (api_key) {
        snprintf(out, OBSERVE_TENANT_MAX + 1, "key-%012llx",
                 (unsigned long long)(XXH3_64bits(api_key, strlen(api_key)) >> 16));
        return;
    }
    if (!user || !user[0]) {
        snprintf(out, OBSERVE_TENANT_MAX + 1, "default");
        return;
    }
    size_t i = 0;
    for (; user[i] && i < OBSERVE_TENANT_MAX; i++) {
        char c = user[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == ':' || c == '@' || c == '-';
        out[i] = ok ? c : '_';
    }
    out[i] = 0;
}

baton_status_t observe_tenants_add(observe_tenants_t *t, const char *name, uint64_t device_us,
                                   uint64_t prompt_tokens, uint64_t completion_tokens,
                                   uint64_t requests) {
    observe_tenant_t *e = NULL;
    for (size_t i = 0; i < t->n && !e; i++)
        if (!strcmp(t->items[i].name, name))
            e = &t->items[i];
    if (!e && t->n >= OBSERVE_MAX_TENANTS) {
        for (size_t i = 0; i < t->n && !e; i++)
            if (!strcmp(t->items[i].name, "other"))
                e = &t->items[i];
        name = "other";
    }
    if (!e) {
        if (t->n == t->cap) {
            size_t c = t->cap ? t->cap * 2 : 16;
            observe_tenant_t *b = realloc(t->items, c * sizeof(*b));
            if (!b)
                return baton_error(BATON_ERR_NO_MEMORY, "observe_tenants_add: out of memory");
            t->items = b;
            t->cap = c;
        }
        e = &t->items[t->n++];
        memset(e, 0, sizeof(*e));
        snprintf(e->name, sizeof(e->name), "%s", name);
    }
    e->device_us += device_us;
    e->prompt_tokens += prompt_tokens;
    e->completion_tokens += completion_tokens;
    e->requests += requests;
    return BATON_OK;
}

void observe_tenants_free(observe_tenants_t *t) {
    if (!t)
        return;
    free(t->items);
    memset(t, 0, sizeof(*t));
}

void observe_tenants_write(metrics_text_t *out, const observe_tenants_t *t) {
    static const char *const help[4][2] = {
        {"device_seconds", "Device-seconds of the tenant's finished requests (prefill + decode)."},
        {"prompt_tokens", "Prompt tokens of the tenant's finished requests."},
        {"completion_tokens", "Completion tokens of the tenant's finished requests."},
        {"requests", "Requests of the tenant that finished successfully."},
    };
    for (int k = 0; k < 4; k++) {
        metrics_text_printf(out, "# HELP baton_router_tenant_%s_total %s\n", help[k][0], help[k][1]);
        metrics_text_printf(out, "# TYPE baton_router_tenant_%s_total counter\n", help[k][0]);
        for (size_t i = 0; i < t->n; i++) {
            const observe_tenant_t *e = &t->items[i];
            /* tenant names hold only [A-Za-z0-9._:@-]: no label escaping needed */
            if (k == 0)
                metrics_text_printf(out, "baton_router_tenant_device_seconds_total{tenant=\"%s\"} %.6f\n",
                                    e->name, (double)e->device_us / 1e6);
            else
                metrics_text_printf(out, "baton_router_tenant_%s_total{tenant=\"%s\"} %llu\n",
                                    help[k][0], e->name,
                                    (unsigned long long)(k == 1   ? e->prompt_tokens
                                                         : k == 2 ? e->completion_tokens
                                                                  : e->requests));
        }
    }
}

void observe_util_add(observe_util_t *u, uint64_t epoch, uint64_t now_ms, uint64_t busy_us) {
    if (u->epoch != epoch) {
        memset(u, 0, sizeof(*u));
        u->epoch = epoch;
    }
    u->t_ms[u->next] = now_ms;
    u->busy_us[u->next] = busy_us;
    u->next = (u->next + 1) % OBSERVE_UTIL_SAMPLES;
    if (u->n < OBSERVE_UTIL_SAMPLES)
        u->n++;
}

bool observe_util_fraction(const observe_util_t *u, uint64_t now_ms, double *out) {
    if (u->n < 2)
        return false;
    size_t newest = (u->next + OBSERVE_UTIL_SAMPLES - 1) % OBSERVE_UTIL_SAMPLES;
    size_t oldest = newest;
    for (size_t k = 2; k <= u->n; k++) { /* walk back while inside the window */
        size_t i = (u->next + OBSERVE_UTIL_SAMPLES - k) % OBSERVE_UTIL_SAMPLES;
        if (now_ms > u->t_ms[i] && now_ms - u->t_ms[i] > OBSERVE_UTIL_WINDOW_MS)
            break;
        oldest = i;
    }
    if (oldest == newest || u->t_ms[newest] <= u->t_ms[oldest])
        return false;
    double busy = u->busy_us[newest] >= u->busy_us[oldest]
                      ? (double)(u->busy_us[newest] - u->busy_us[oldest])
                      : 0.0;
    double f = busy / ((double)(u->t_ms[newest] - u->t_ms[oldest]) * 1000.0);
    *out = f < 0.0 ? 0.0 : f > 1.0 ? 1.0 : f;
    return true;
}

void observe_fingerprint(const json_t *config, char out[16]) {
    char *s = config ? json_dumps(config, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    uint64_t h = s ? XXH3_64bits(s, strlen(s)) : 0;
    free(s);
    snprintf(out, 16, "fp_%010llx", (unsigned long long)(h >> 24));
}
