/* router: the baton-router process glue (see server.h).
 *
 * One HTTP call (call_t) owns one or more requests (request_t, one per
 * choice: n x prompts). Each request is routed to a prefill worker P and a
 * decode worker D independently; tokens arrive in TokenChunks from D, go
 * through the request's stream (detokenizer + stop strings) and are written
 * as SSE chunks or accumulated for the final body. A request stays in the
 * request table after its client is answered until its RequestFinished
 * arrives (or a linger deadline), so its stage trace is complete when it is
 * logged. */
#define _GNU_SOURCE
#include "router/server.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <zmq.h>

#include "common/chat_template.h"
#include "common/gguf.h"
#include "common/log.h"
#include "common/tokenizer.h"
#include "proto/zmq_channel.h"
#include "router/http_api.h"
#include "router/metrics.h"
#include "router/observe.h"
#include "router/openai_format.h"
#include "router/radix_index.h"
#include "router/request.h"
#include "router/worker_table.h"

#define COMP "router"
#define SPECULATIVE_TTL_MS 10000
#define LINGER_MS 5000
#define FINISH_WAIT_MS 2000  /* last token -> RequestFinished wait before answering anyway */
#define RECORD_RING 10000    /* stage records kept for GET /v1/requests/{id} */
#ifndef BATON_VERSION
#define BATON_VERSION "unknown"
#endif
#define RESYNC_INTERVAL_MS 1000
#define MAX_SUB_ENDPOINTS WORKER_TABLE_MAX

typedef struct call call_t;

typedef struct snapshot_buf {
    block_hash_link_t *links;
    size_t n, cap;
    uint64_t epoch;
    bool active;
} snapshot_buf_t;

struct router_server {
    router_config_t cfg;
    struct event_base *base;
    struct evhttp *http;
    int http_port;
    tokenizer_t *tok;
    chat_template_t *chat;
    uint32_t n_ctx;
    char model_name[256];
    int64_t started_unix;
    void *zctx;
    proto_chan_t *control;
    proto_chan_t *sub;
    struct event *control_ev, *sub_ev, *tick_ev;
    char *sub_endpoints[MAX_SUB_ENDPOINTS];
    size_t n_sub_endpoints;
    worker_table_t workers;
    snapshot_buf_t snapshots[WORKER_TABLE_MAX];
    radix_index_t *index;
    route_state_t route;
    request_table_t requests;
    router_metrics_t metrics;
    char **api_keys;
    size_t n_api_keys;
    /* issue 6: records, tenants, utilisation, serving configuration */
    observe_ring_t records;
    observe_tenants_t tenants;
    observe_util_t util[WORKER_TABLE_MAX];
    json_t *serving_config; /* without the fingerprint */
    char fingerprint[16];
};

struct call {
    router_server_t *srv;
    struct evhttp_request *req;
    struct evhttp_connection *conn;
    http_api_params_t params;
    char id[48];
    char fingerprint[16]; /* system_fingerprint at arrival */
    int64_t created;
    request_t **choices;
    size_t n_choices, n_done;
    bool stream_started;
    bool answered;
    char **echo_text; /* completions echo: per choice prompt text (owned) */
    size_t *echo_len;
};

/* ---- time ---- */

static uint64_t mono_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}
static uint64_t mono_ms(void) { return mono_us() / 1000u; }
static uint64_t unix_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void router_config_default(router_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->http_bind = "127.0.0.1:8000";
    cfg->control_bind = "tcp://127.0.0.1:5600";
    cfg->route.policy = ROUTE_CACHE_AWARE;
    cfg->route.balance_abs_tokens = 4096;
    cfg->route.balance_rel = 2.0;
    cfg->block_size = 16;
    cfg->hash_seed = 0;
    cfg->max_body_bytes = 4u << 20;
    cfg->request_timeout_ms = 600000;
    cfg->first_token_timeout_ms = 120000;
    cfg->token_timeout_ms = 30000;
    cfg->worker_timeout_ms = 10000;
    cfg->http_timeout_s = 60;
}

/* ---- HTTP helpers ---- */

static void send_json(struct evhttp_request *req, int status, const char *body) {
    struct evbuffer *buf = evbuffer_new();
    if (buf)
        evbuffer_add(buf, body, strlen(body));
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evhttp_send_reply(req, status, status == 200 ? "OK" : "Error", buf);
    if (buf)
        evbuffer_free(buf);
}

static void send_json_obj(struct evhttp_request *req, int status, json_t *obj) {
    char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    if (!s) {
        send_json(req, 500, "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                            "\"param\":null,\"code\":null}}");
        json_decref(obj);
        return;
    }
    send_json(req, status, s);
    free(s);
    json_decref(obj);
}

static void send_error(struct evhttp_request *req, const http_api_error_t *err) {
    char *s = http_api_error_json(err);
    send_json(req, err->status, s ? s : "{\"error\":{\"message\":\"out of memory\"}}");
    free(s);
}

static void send_error_msg(struct evhttp_request *req, int status, const char *type,
                           const char *param, const char *code, const char *msg) {
    http_api_error_t err;
    http_api_error_set(&err, status, type, param, code, "%s", msg);
    send_error(req, &err);
}

/* ---- worker messaging ---- */

static void control_activate(router_server_t *srv) {
    /* a send may consume the fd's edge: look again (zmq_channel.h) */
    if (proto_chan_readable(srv->control))
        event_active(srv->control_ev, EV_READ, 0);
}

static void send_abort(router_server_t *srv, request_t *r, const char *reason) {
    if (!r->routed)
        return;
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = PROTO_MSG_ABORT;
    m.u.abort.request_id = r->id;
    m.u.abort.reason = (char *)reason;
    baton_status_t st = proto_chan_send(srv->control, r->decode_id, &m);
    if (st != BATON_OK)
        LOG_WARN(COMP, "abort %s to %s: %s", r->id_hex, r->decode_id, baton_last_error());
    if (strcmp(r->prefill_id, r->decode_id) != 0) {
        st = proto_chan_send(srv->control, r->prefill_id, &m);
        if (st != BATON_OK)
            LOG_WARN(COMP, "abort %s to %s: %s", r->id_hex, r->prefill_id, baton_last_error());
    }
    control_activate(srv);
}

/* Takes the request's contribution off its workers' router-side load. */
static void release_prefill_load(router_server_t *srv, request_t *r) {
    worker_entry_t *p = &srv->workers.w[r->prefill_slot];
    if (r->load_prefill_tokens && p->used && p->epoch == r->prefill_epoch) {
        p->inflight_prefill_tokens -= r->load_prefill_tokens < p->inflight_prefill_tokens
                                          ? r->load_prefill_tokens
                                          : p->inflight_prefill_tokens;
    }
    r->load_prefill_tokens = 0;
}

static void release_load(router_server_t *srv, request_t *r) {
    if (!r->routed || r->load_released)
        return;
    r->load_released = true;
    release_prefill_load(srv, r);
    worker_entry_t *d = &srv->workers.w[r->decode_slot];
    if (r->load_blocks && d->used && d->epoch == r->decode_epoch)
        d->inflight_blocks -= r->load_blocks < d->inflight_blocks ? r->load_blocks
                                                                  : d->inflight_blocks;
    r->load_blocks = 0;
    worker_entry_t *ws[2] = {&srv->workers.w[r->prefill_slot], d};
    uint64_t ep[2] = {r->prefill_epoch, r->decode_epoch};
    for (int i = 0; i < (ws[0] == ws[1] ? 1 : 2); i++)
        if (ws[i]->used && ws[i]->epoch == ep[i] && ws[i]->inflight > 0)
            ws[i]->inflight--;
}

/* ---- call lifecycle ---- */

static void request_retire(router_server_t *srv, request_t *r);

/* Frees the call. Its choices stay in the request table until their
 * RequestFinished (or the linger deadline); those already reported by their
 * worker are retired now. */
static void call_free(call_t *c) {
    if (!c)
        return;
    for (size_t i = 0; i < c->n_choices; i++) {
        request_t *r = c->choices[i];
        if (r) {
            r->call = NULL;
            if (r->done && r->worker_finished && request_table_find(&c->srv->requests, &r->id) == r)
                request_retire(c->srv, r);
        }
        if (c->echo_text)
            free(c->echo_text[i]);
    }
    free(c->echo_text);
    free(c->echo_len);
    free(c->choices);
    http_api_params_free(&c->params);
    free(c);
}

static void on_conn_close(struct evhttp_connection *conn, void *arg);

/* Detaches the call from its HTTP connection (no more close callbacks). */
static void call_detach(call_t *c) {
    if (c->conn) {
        evhttp_connection_set_closecb(c->conn, NULL, NULL);
        struct bufferevent *bev = evhttp_connection_get_bufferevent(c->conn);
        struct timeval t = {c->srv->cfg.http_timeout_s, 0};
        if (bev)
            bufferevent_set_timeouts(bev, &t, &t);
    }
    c->conn = NULL;
}

static void stream_write(call_t *c, const char *data, size_t len) {
    struct evbuffer *buf = evbuffer_new();
    if (!buf)
        return;
    evbuffer_add(buf, data, len);
    evhttp_send_reply_chunk(c->req, buf);
    evbuffer_free(buf);
}

static void stream_start(call_t *c) {
    if (c->stream_started)
        return;
    struct evkeyvalq *h = evhttp_request_get_output_headers(c->req);
    evhttp_add_header(h, "Content-Type", "text/event-stream");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    evhttp_send_reply_start(c->req, 200, "OK");
    c->stream_started = true;
}

/* Sets the response's system_fingerprint on obj (a response or chunk). */
static json_t *with_fp(const call_t *c, json_t *obj) {
    if (obj)
        json_object_set_new(obj, "system_fingerprint", json_string(c->fingerprint));
    return obj;
}

/* The `baton` object of a call: the single choice's record, or for n > 1
 * {"request_id", "choices": [records]}. New reference or NULL. */
static json_t *call_baton(const call_t *c) {
    if (c->n_choices == 1)
        return observe_record_json(&c->choices[0]->record);
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < c->n_choices; i++)
        json_array_append_new(arr, observe_record_json(&c->choices[i]->record));
    return json_pack("{s:s, s:o}", "request_id", c->id, "choices", arr);
}

static void stream_write_obj(call_t *c, json_t *obj) {
    with_fp(c, obj);
    size_t n = 0;
    char *s = obj ? openai_format_sse(obj, &n) : NULL;
    if (s)
        stream_write(c, s, n);
    free(s);
    json_decref(obj);
}

static void usage_of_call(const call_t *c, openai_format_usage_t *u) {
    memset(u, 0, sizeof(*u));
    for (size_t i = 0; i < c->n_choices; i++) {
        const request_t *r = c->choices[i];
        if (!r)
            continue;
        /* prompt tokens count once per prompt (OpenAI: n choices share it) */
        if (r->index % c->params.n == 0) {
            u->prompt_tokens += (uint32_t)r->n_prompt;
            u->cached_tokens += r->cached_tokens;
        }
        u->completion_tokens += r->completion_tokens;
    }
}

/* All choices are done: write the final body or end the stream. */
static void call_complete(call_t *c) {
    router_server_t *srv = c->srv;
    openai_format_usage_t u;
    usage_of_call(c, &u);
    if (c->params.stream) {
        stream_start(c);
        if (c->params.include_usage) {
            json_t *uc = openai_format_usage_chunk(c->params.kind, c->id, c->created,
                                                   srv->model_name, &u);
            if (uc)
                json_object_set_new(uc, "baton", call_baton(c));
            stream_write_obj(c, uc);
        }
        stream_write(c, "data: [DONE]\n\n", 14);
        evhttp_send_reply_end(c->req);
    } else {
        openai_format_choice_t *ch = calloc(c->n_choices, sizeof(*ch));
        char **joined = calloc(c->n_choices, sizeof(*joined));
        if (!ch || !joined) {
            send_error_msg(c->req, 500, "server_error", NULL, NULL, "out of memory");
        } else {
            for (size_t i = 0; i < c->n_choices; i++) {
                request_t *r = c->choices[i];
                const char *text = r->text ? r->text : "";
                size_t len = r->text_len;
                if (c->echo_text && c->echo_text[i]) {
                    joined[i] = malloc(c->echo_len[i] + len + 1);
                    if (joined[i]) {
                        memcpy(joined[i], c->echo_text[i], c->echo_len[i]);
                        memcpy(joined[i] + c->echo_len[i], text, len);
                        joined[i][c->echo_len[i] + len] = 0;
                        text = joined[i];
                        len += c->echo_len[i];
                    }
                }
                ch[i].text = text;
                ch[i].len = len;
                ch[i].finish_reason = r->finish_reason ? r->finish_reason : "stop";
                ch[i].logprobs = c->params.logprobs ? (json_t *)r->logprobs : NULL;
            }
            json_t *resp = with_fp(c, openai_format_response(c->params.kind, c->id, c->created,
                                                             srv->model_name, ch, c->n_choices, &u));
            if (resp)
                json_object_set_new(resp, "baton", call_baton(c));
            send_json_obj(c->req, 200, resp);
        }
        if (joined)
            for (size_t i = 0; i < c->n_choices; i++)
                free(joined[i]);
        free(joined);
        free(ch);
    }
    c->answered = true;
    call_detach(c);
    call_free(c);
}

/* Fails the whole call: an error body if nothing was streamed yet,
 * otherwise an error event and the end of the stream. Every other choice
 * still running is aborted on its workers. */
static void call_fail(call_t *c, const http_api_error_t *err) {
    router_server_t *srv = c->srv;
    for (size_t i = 0; i < c->n_choices; i++) {
        request_t *r = c->choices[i];
        if (r && !r->done) {
            r->done = true;
            request_set_state(r, REQUEST_FAILED, mono_ms(), &(request_deadlines_t){0});
            snprintf(r->error, sizeof(r->error), "%s", err->message);
            r->trace.finished_us = mono_us();
            send_abort(srv, r, "failed");
            release_load(srv, r);
            srv->metrics.requests_error++;
        }
    }
    if (c->stream_started) {
        char *s = http_api_error_json(err);
        if (s) {
            stream_write(c, "data: ", 6);
            stream_write(c, s, strlen(s));
            stream_write(c, "\n\n", 2);
        }
        free(s);
        stream_write(c, "data: [DONE]\n\n", 14);
        evhttp_send_reply_end(c->req);
    } else {
        send_error(c->req, err);
    }
    c->answered = true;
    call_detach(c);
    call_free(c);
}

static void on_conn_close(struct evhttp_connection *conn, void *arg) {
    call_t *c = arg;
    router_server_t *srv = c->srv;
    LOG_INFO(COMP, "client of %s disconnected: aborting %zu choice(s)", c->id, c->n_choices);
    for (size_t i = 0; i < c->n_choices; i++) {
        request_t *r = c->choices[i];
        if (r && !r->done) {
            r->done = true;
            request_set_state(r, REQUEST_FAILED, mono_ms(), &(request_deadlines_t){0});
            snprintf(r->error, sizeof(r->error), "client disconnected");
            r->finish_reason = "abort";
            r->trace.finished_us = mono_us();
            send_abort(srv, r, "client disconnected");
            release_load(srv, r);
            srv->metrics.requests_aborted++;
        }
    }
    c->conn = NULL;
    /* the request was detached from the connection by libevent; answering
     * it now frees it (evhttp_send_reply on a request without connection) */
    if (c->stream_started)
        evhttp_send_reply_end(c->req);
    else
        evhttp_send_reply(c->req, 499, "Client Closed Request", NULL);
    c->answered = true;
    call_free(c);
    (void)conn;
}

/* ---- one choice finishing ---- */

static void observe_finished(router_server_t *srv, request_t *r) {
    router_metrics_t *m = &srv->metrics;
    if (r->trace.first_token_us)
        metrics_hist_observe(&m->ttft, (double)(r->trace.first_token_us - r->trace.arrival_us) / 1e6);
    metrics_hist_observe(&m->e2e, (double)(r->trace.finished_us - r->trace.arrival_us) / 1e6);
    m->prompt_tokens += r->n_prompt;
    m->completion_tokens += r->completion_tokens;
    m->predicted_hit_blocks += r->predicted_hit_blocks;
    m->prompt_full_blocks += r->n_hashes;
}

static void choice_emit(call_t *c, request_t *r, const char *text, size_t len, bool first,
                        const char *finish_reason, json_t *baton) {
    if (!c)
        return;
    if (c->params.stream) {
        if (len == 0 && !first && !finish_reason)
            return;
        stream_start(c);
        if (first && c->echo_text && c->echo_text[r->index] && c->echo_len[r->index])
            stream_write_obj(c, openai_format_chunk(c->params.kind, c->id, c->created,
                                                    c->srv->model_name, r->index,
                                                    c->echo_text[r->index],
                                                    c->echo_len[r->index], false, NULL,
                                                    c->params.include_usage, NULL));
        if (c->params.kind == HTTP_API_COMPLETIONS && first && len == 0 && !finish_reason)
            return;
        json_t *ch = openai_format_chunk(c->params.kind, c->id, c->created, c->srv->model_name,
                                         r->index, text, len, first, finish_reason,
                                         c->params.include_usage, r->logprobs_pending);
        if (ch && baton)
            json_object_set(ch, "baton", baton);
        stream_write_obj(c, ch);
        json_decref(r->logprobs_pending);
        r->logprobs_pending = NULL;
    } else if (len > 0 && request_append_text(r, text, len) != BATON_OK) {
        LOG_ERROR(COMP, "%s: %s", r->id_hex, baton_last_error());
    }
    r->out_bytes += len;
}

/* Fills r->record as of end_us (the last byte to the client). */
static void record_fill(router_server_t *srv, request_t *r, uint64_t end_us) {
    observe_record_t *rec = &r->record;
    memset(rec, 0, sizeof(*rec));
    snprintf(rec->request_id, sizeof(rec->request_id), "%s", r->response_id);
    rec->choice = r->index;
    snprintf(rec->tenant, sizeof(rec->tenant), "%s", r->tenant[0] ? r->tenant : "default");
    rec->complete = r->state == REQUEST_FINISHED && r->worker_finished;
    snprintf(rec->finish_reason, sizeof(rec->finish_reason), "%s",
             r->finish_reason ? r->finish_reason : r->state == REQUEST_FAILED ? "error" : "none");
    observe_times_t t = {
        .arrival_us = r->trace.arrival_us,
        .prefill_done_us = r->trace.prefill_done_us,
        .end_us = end_us,
        .prefill_us = r->trace.prefill_us,
        .transfer_us = r->trace.transfer_us,
        .decode_us = r->trace.decode_us,
    };
    observe_stages(&t, rec->stages_ms, &rec->e2e_ms);
    rec->worker_ms[0] = (double)r->trace.queue_us / 1000.0;
    rec->worker_ms[1] = (double)r->trace.prefill_us / 1000.0;
    rec->worker_ms[2] = (double)r->trace.transfer_us / 1000.0;
    rec->worker_ms[3] = (double)r->trace.decode_us / 1000.0;
    rec->prefill_device_us = r->prefill_device_us;
    rec->decode_device_us = r->decode_device_us;
    rec->prompt_tokens = (uint32_t)r->n_prompt;
    rec->completion_tokens = r->completion_tokens;
    rec->predicted_hit_tokens = r->predicted_hit_blocks * srv->cfg.block_size;
    rec->cached_tokens = r->cached_tokens;
    rec->transfer_bytes = r->trace.transfer_bytes;
    snprintf(rec->prefill_worker, sizeof(rec->prefill_worker), "%s", r->prefill_id);
    snprintf(rec->decode_worker, sizeof(rec->decode_worker), "%s", r->decode_id);
}

/* A finished choice's record is final: stage histograms, tenant sums, ring. */
static void record_publish(router_server_t *srv, request_t *r) {
    const observe_record_t *rec = &r->record;
    router_metrics_t *m = &srv->metrics;
    metrics_hist_t *h[OBSERVE_N_STAGES] = {&m->queue, &m->prefill, &m->transfer, &m->decode};
    for (int i = 0; i < OBSERVE_N_STAGES; i++)
        metrics_hist_observe(h[i], rec->stages_ms[i] / 1000.0);
    if (observe_tenants_add(&srv->tenants, rec->tenant,
                            rec->prefill_device_us + rec->decode_device_us, rec->prompt_tokens,
                            rec->completion_tokens, 1) != BATON_OK)
        LOG_WARN(COMP, "tenant sums: %s", baton_last_error());
    observe_ring_push(&srv->records, rec);
    r->recorded = true;
}

/* Answers a finished choice once its worker's RequestFinished arrived (its
 * cached tokens and device time are then known) or FINISH_WAIT_MS passed:
 * the record is filled as of now (the last byte), the last delta goes out
 * with it (streams without usage), and the call completes when this was its
 * last choice. May free the call and r. */
static void choice_try_close(router_server_t *srv, request_t *r) {
    call_t *c = r->call;
    if (!c || r->closed || !r->done || r->state != REQUEST_FINISHED)
        return;
    if (!r->worker_finished && mono_ms() < r->close_deadline_ms)
        return;
    r->closed = true;
    uint64_t end = mono_us();
    r->trace.finished_us = end;
    record_fill(srv, r, end);
    observe_finished(srv, r);
    record_publish(srv, r);
    json_t *baton = c->params.stream && !c->params.include_usage ? observe_record_json(&r->record)
                                                                 : NULL;
    choice_emit(c, r, r->final_text ? r->final_text : "", r->final_len, r->completion_tokens == 0,
                r->finish_reason, baton);
    json_decref(baton);
    if (++c->n_done == c->n_choices)
        call_complete(c);
}

static void choice_finish(router_server_t *srv, request_t *r, const char *reason) {
    if (r->done)
        return;
    const char *text = "";
    size_t len = 0;
    if (stream_finish(r->stream, &text, &len) != BATON_OK)
        len = 0;
    if (len > 0) { /* held until the choice closes */
        r->final_text = malloc(len);
        if (r->final_text) {
            memcpy(r->final_text, text, len);
            r->final_len = len;
        } else {
            LOG_ERROR(COMP, "%s: out of memory for the last %zu bytes of text", r->id_hex, len);
        }
    }
    r->finish_reason = reason;
    r->done = true;
    r->trace.finished_us = mono_us();
    r->close_deadline_ms = mono_ms() + FINISH_WAIT_MS;
    request_set_state(r, REQUEST_FINISHED, mono_ms(), &(request_deadlines_t){0});
    release_load(srv, r);
    srv->metrics.requests_ok++;
    if (r->call)
        choice_try_close(srv, r);
}

static void choice_fail(router_server_t *srv, request_t *r, int http_status, const char *code,
                        const char *msg) {
    if (r->done)
        return;
    call_t *c = r->call;
    if (c) {
        http_api_error_t err;
        http_api_error_set(&err, http_status, http_status < 500 ? "invalid_request_error"
                                                                : "server_error",
                           NULL, code, "%s", msg);
        call_fail(c, &err); /* marks r failed, aborts, frees the call */
    } else {
        r->done = true;
        request_set_state(r, REQUEST_FAILED, mono_ms(), &(request_deadlines_t){0});
        snprintf(r->error, sizeof(r->error), "%s", msg);
        r->trace.finished_us = mono_us();
        send_abort(srv, r, "failed");
        release_load(srv, r);
        srv->metrics.requests_error++;
    }
}

/* Logs the request's trace line and frees it; r->call must be NULL (the
 * call no longer needs it). */
static void request_retire(router_server_t *srv, request_t *r) {
    if (!r->recorded) { /* failed, aborted, or its client left before the end */
        record_fill(srv, r, r->trace.finished_us ? r->trace.finished_us : mono_us());
        observe_ring_push(&srv->records, &r->record);
        r->recorded = true;
    }
    char line[1024];
    request_trace_format(r, line, sizeof(line));
    LOG_DEBUG(COMP, "%s", line);
    char *rec = observe_record_line(&r->record);
    LOG_INFO(COMP, "request_record %s", rec ? rec : "(out of memory)");
    free(rec);
    request_table_remove(&srv->requests, r);
    request_free(r);
}

/* ---- serving configuration (issue 6) ---- */

static void hex_of(const uint8_t *b, size_t n, char *out) {
    for (size_t i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static const char *kv_dtype_name(proto_kv_dtype_t d) {
    return d == PROTO_KV_DTYPE_F16 ? "f16" : d == PROTO_KV_DTYPE_BF16 ? "bf16" : "f32";
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Rebuilds srv->serving_config and srv->fingerprint from the router's
 * options and the registered workers. Workers appear as their distinct
 * configurations with a count (ids and epochs are left out, so a restart
 * keeps the fingerprint), sorted. */
static void serving_config_refresh(router_server_t *srv) {
    char *dumps[WORKER_TABLE_MAX];
    size_t n = 0;
    for (uint32_t i = 0; i < WORKER_TABLE_MAX; i++) {
        const worker_entry_t *w = &srv->workers.w[i];
        if (!w->used)
            continue;
        char sha[2 * PROTO_SHA256_BYTES + 1];
        hex_of(w->model_sha256, PROTO_SHA256_BYTES, sha);
        json_t *o = json_pack(
            "{s:s, s:s, s:s?, s:s?, s:s, s:{s:I, s:I, s:I, s:I}, s:I, s:I, s:s?, s:n}", "role",
            worker_table_role_name(w->role), "model_sha256", sha, "backend",
            w->backend[0] ? w->backend : NULL, "compute_dtype",
            w->compute_dtype[0] ? w->compute_dtype : NULL, "kv_dtype", kv_dtype_name(w->kv.dtype),
            "kv", "n_layers", (json_int_t)w->kv.n_layers, "n_kv_heads", (json_int_t)w->kv.n_kv_heads,
            "head_dim", (json_int_t)w->kv.head_dim, "block_size", (json_int_t)w->kv.block_size,
            "max_batch_tokens", (json_int_t)w->max_batch_tokens, "max_batch",
            (json_int_t)w->max_batch, "cpu_model", w->cpu_model[0] ? w->cpu_model : NULL,
            "gpu_model");
        char *d = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        json_decref(o);
        if (d)
            dumps[n++] = d;
    }
    qsort(dumps, n, sizeof(dumps[0]), cmp_str);
    json_t *workers = json_array();
    for (size_t i = 0; i < n;) {
        size_t k = i;
        while (k < n && !strcmp(dumps[k], dumps[i]))
            k++;
        json_t *o = json_loads(dumps[i], 0, NULL);
        if (o && workers) {
            json_object_set_new(o, "count", json_integer((json_int_t)(k - i)));
            json_array_append_new(workers, o);
        } else {
            json_decref(o);
        }
        i = k;
    }
    for (size_t i = 0; i < n; i++)
        free(dumps[i]);
    char seed_id[17];
    snprintf(seed_id, sizeof(seed_id), "%016llx",
             (unsigned long long)worker_table_seed_id(srv->cfg.hash_seed));
    const char *mf = srv->cfg.model_path ? srv->cfg.model_path : "";
    const char *slash = strrchr(mf, '/');
    /* sampling defaults: what http_api_parse fills in when a field is absent */
    json_t *cfg = json_pack(
        "{s:s, s:s, s:s, s:I, s:s, s:I, s:s, s:{s:f, s:f, s:I, s:f, s:f, s:f, s:f, s:s, s:I},"
        " s:{s:I, s:I, s:I, s:I}, s:o?}",
        "version", BATON_VERSION, "model", srv->model_name, "model_file",
        slash ? slash + 1 : mf, "n_ctx", (json_int_t)srv->n_ctx,
        "policy", route_policy_name(srv->cfg.route.policy), "block_size",
        (json_int_t)srv->cfg.block_size, "hash_seed_id", seed_id,
        "sampling_defaults", "temperature", 1.0, "top_p", 1.0, "top_k", (json_int_t)0, "min_p",
        0.0, "repetition_penalty", 1.0, "presence_penalty", 0.0, "frequency_penalty", 0.0,
        "max_tokens", "context left", "n", (json_int_t)1, "timeouts_ms", "request",
        (json_int_t)srv->cfg.request_timeout_ms, "first_token",
        (json_int_t)srv->cfg.first_token_timeout_ms, "token", (json_int_t)srv->cfg.token_timeout_ms,
        "worker", (json_int_t)srv->cfg.worker_timeout_ms, "workers", workers);
    if (!cfg) {
        LOG_ERROR(COMP, "serving config: out of memory (fingerprint kept)");
        return;
    }
    json_decref(srv->serving_config);
    srv->serving_config = cfg;
    observe_fingerprint(cfg, srv->fingerprint);
}

/* ---- control messages from workers ---- */

static request_deadlines_t deadlines_of(const router_server_t *srv) {
    request_deadlines_t d = {
        .routed_ms = srv->cfg.first_token_timeout_ms,
        .prefill_done_ms = srv->cfg.first_token_timeout_ms,
        .token_ms = srv->cfg.token_timeout_ms,
        .total_ms = srv->cfg.request_timeout_ms,
    };
    return d;
}

static void fail_requests_of_worker(router_server_t *srv, uint32_t slot, uint64_t epoch,
                                    const char *why) {
    for (size_t i = 0; i < srv->requests.n;) {
        request_t *r = srv->requests.items[i];
        bool hit = r->routed && !r->done &&
                   ((r->prefill_slot == slot && r->prefill_epoch == epoch) ||
                    (r->decode_slot == slot && r->decode_epoch == epoch));
        size_t n_before = srv->requests.n;
        if (hit)
            choice_fail(srv, r, 502, "worker_lost", why);
        if (srv->requests.n == n_before)
            i++;
    }
}

static void sub_connect(router_server_t *srv, const char *endpoint) {
    if (!endpoint || !endpoint[0])
        return;
    for (size_t i = 0; i < srv->n_sub_endpoints; i++)
        if (!strcmp(srv->sub_endpoints[i], endpoint))
            return;
    if (srv->n_sub_endpoints == MAX_SUB_ENDPOINTS)
        return;
    if (proto_chan_connect(srv->sub, endpoint) != BATON_OK) {
        LOG_ERROR(COMP, "cannot subscribe to KV events at %s: %s", endpoint, baton_last_error());
        return;
    }
    srv->sub_endpoints[srv->n_sub_endpoints++] = strdup(endpoint);
    LOG_INFO(COMP, "subscribed to KV events at %s", endpoint);
}

static void on_register(router_server_t *srv, const proto_worker_register_t *reg) {
    uint32_t slot;
    bool new_epoch;
    worker_entry_t *old = worker_table_find(&srv->workers, reg->worker_id);
    uint64_t old_epoch = old ? old->epoch : 0;
    baton_status_t st = worker_table_register(&srv->workers, reg, reg->kv_events_endpoint,
                                              mono_ms(), &slot, &new_epoch);
    if (st != BATON_OK) {
        LOG_ERROR(COMP, "refused registration: %s", baton_last_error());
        return;
    }
    if (new_epoch) {
        LOG_WARN(COMP, "worker %s restarted (epoch %llu -> %llu)", reg->worker_id,
                 (unsigned long long)old_epoch, (unsigned long long)reg->epoch);
        fail_requests_of_worker(srv, slot, old_epoch, "worker restarted");
        radix_index_remove_worker(srv->index, slot);
        srv->snapshots[slot].n = 0;
        srv->snapshots[slot].active = false;
    }
    LOG_INFO(COMP, "worker %s registered: role %s epoch %llu peer %s kv-events %s", reg->worker_id,
             worker_table_role_name(reg->role), (unsigned long long)reg->epoch,
             reg->zmq_endpoint ? reg->zmq_endpoint : "", reg->kv_events_endpoint ? reg->kv_events_endpoint : "");
    sub_connect(srv, reg->kv_events_endpoint);
    serving_config_refresh(srv);
    char why[256];
    for (uint32_t j = 0; j < WORKER_TABLE_MAX; j++) {
        worker_entry_t *o = &srv->workers.w[j];
        worker_entry_t *me = &srv->workers.w[slot];
        if (!o->used || j == slot)
            continue;
        if (me->role == PROTO_ROLE_PREFILL && o->role == PROTO_ROLE_DECODE &&
            !worker_table_can_pair(me, o, why, sizeof(why)))
            LOG_ERROR(COMP, "will not pair: %s", why);
        if (me->role == PROTO_ROLE_DECODE && o->role == PROTO_ROLE_PREFILL &&
            !worker_table_can_pair(o, me, why, sizeof(why)))
            LOG_ERROR(COMP, "will not pair: %s", why);
    }
}

static void on_prefill_done(router_server_t *srv, const proto_prefill_done_t *pd) {
    request_t *r = request_table_find(&srv->requests, &pd->request_id);
    if (!r)
        return;
    r->trace.prefill_done_us = mono_us();
    r->trace.queue_us = pd->queue_us;
    r->trace.prefill_us = pd->compute_us;
    r->trace.transfer_us = pd->transfer_us;
    r->trace.transfer_bytes = pd->bytes_written;
    r->prefill_device_us = pd->device_us;
    release_prefill_load(srv, r);
    if (r->done)
        return;
    if (pd->status != 0) {
        char msg[256];
        snprintf(msg, sizeof(msg), "prefill failed on %s: %s", pd->prefill_worker_id,
                 pd->error ? pd->error : "");
        choice_fail(srv, r, 502, "prefill_failed", msg);
        return;
    }
    if (r->state == REQUEST_ROUTED) {
        request_deadlines_t d = deadlines_of(srv);
        request_set_state(r, REQUEST_PREFILL_DONE, mono_ms(), &d);
    }
}

static void on_token_entry(router_server_t *srv, const proto_token_entry_t *e) {
    request_t *r = request_table_find(&srv->requests, &e->request_id);
    if (!r || r->done)
        return;
    request_deadlines_t d = deadlines_of(srv);
    uint64_t now = mono_us();
    for (uint32_t i = 0; i < e->n_token_ids && !r->done; i++) {
        bool first = r->completion_tokens == 0;
        if (first) {
            r->trace.first_token_us = now;
            request_set_state(r, REQUEST_DECODING, now / 1000, &d);
        } else {
            metrics_hist_observe(&srv->metrics.itl, (double)(now - r->trace.last_token_us) / 1e6);
            r->state_deadline_ms = now / 1000 + d.token_ms;
        }
        r->trace.last_token_us = now;
        r->completion_tokens++;
        call_t *c = r->call;
        if (c && c->params.logprobs) {
            json_t **dst = (json_t **)(c->params.stream ? &r->logprobs_pending : &r->logprobs);
            if (!*dst)
                *dst = openai_format_logprobs_new(c->params.kind);
            int32_t top_ids[PROTO_MAX_TOP_LOGPROBS];
            float top_lps[PROTO_MAX_TOP_LOGPROBS];
            size_t n_top = 0;
            if (e->top_k && e->n_top_logprobs == e->n_token_ids * e->top_k)
                for (; n_top < e->top_k && n_top < c->params.top_logprobs; n_top++) {
                    top_ids[n_top] = (int32_t)e->top_logprobs[i * e->top_k + n_top].token;
                    top_lps[n_top] = e->top_logprobs[i * e->top_k + n_top].logprob;
                }
            if (*dst)
                openai_format_logprobs_add(*dst, c->params.kind, srv->tok,
                                           (int32_t)e->token_ids[i],
                                           e->n_logprobs ? e->logprobs[i] : 0.0f, top_ids, top_lps,
                                           n_top, r->out_bytes);
        }
        const char *text;
        size_t len;
        bool stopped = false;
        baton_status_t st = stream_push(r->stream, (int32_t)e->token_ids[i], &text, &len, &stopped);
        if (st != BATON_OK) {
            choice_fail(srv, r, 502, "bad_token", baton_last_error());
            return;
        }
        choice_emit(r->call, r, text, len, first, NULL, NULL);
        if (stopped) {
            send_abort(srv, r, "stop string");
            choice_finish(srv, r, "stop");
            return;
        }
    }
    switch (e->finish_reason) {
    case PROTO_FINISH_NONE: break;
    case PROTO_FINISH_STOP: choice_finish(srv, r, "stop"); break;
    case PROTO_FINISH_LENGTH: choice_finish(srv, r, "length"); break;
    case PROTO_FINISH_ABORT: choice_fail(srv, r, 502, "aborted", "the decode worker aborted the request"); break;
    case PROTO_FINISH_ERROR: choice_fail(srv, r, 502, "decode_failed", "the decode worker failed the request"); break;
    }
}

static void on_request_finished(router_server_t *srv, const proto_request_finished_t *f) {
    request_t *r = request_table_find(&srv->requests, &f->request_id);
    if (!r)
        return;
    r->cached_tokens = f->cached_tokens;
    r->trace.decode_us = f->timings.decode_us;
    if (f->timings.queue_us)
        r->trace.queue_us = f->timings.queue_us;
    if (f->timings.prefill_us)
        r->trace.prefill_us = f->timings.prefill_us;
    if (f->timings.transfer_us)
        r->trace.transfer_us = f->timings.transfer_us;
    if (f->timings.transfer_bytes)
        r->trace.transfer_bytes = f->timings.transfer_bytes;
    if (f->prefill_device_us)
        r->prefill_device_us = f->prefill_device_us;
    r->decode_device_us = f->decode_device_us;
    bool ok_report = f->finish_reason == PROTO_FINISH_STOP || f->finish_reason == PROTO_FINISH_LENGTH;
    bool ok = r->done ? r->state == REQUEST_FINISHED : ok_report;
    router_metrics_t *m = &srv->metrics;
    if (ok) {
        m->measured_cached_tokens += f->cached_tokens;
        m->measured_prompt_tokens += f->prompt_tokens;
        m->transfer_bytes += r->trace.transfer_bytes;
    }
    r->worker_finished = true;
    if (r->closed) {
        /* answered after FINISH_WAIT_MS without it: complete the published record */
        observe_record_t *rec = observe_ring_find(&srv->records, r->response_id, r->index);
        uint64_t dev = r->prefill_device_us + r->decode_device_us;
        if (rec) {
            rec->prefill_device_us = r->prefill_device_us;
            rec->decode_device_us = r->decode_device_us;
            rec->cached_tokens = r->cached_tokens;
        }
        r->record.prefill_device_us = r->prefill_device_us;
        r->record.decode_device_us = r->decode_device_us;
        r->record.cached_tokens = r->cached_tokens;
        if (dev && observe_tenants_add(&srv->tenants, r->record.tenant, dev, 0, 0, 0) != BATON_OK)
            LOG_WARN(COMP, "tenant sums: %s", baton_last_error());
        if (!r->call)
            request_retire(srv, r);
        return;
    }
    if (!r->done) { /* r->call is set: a choice is only done without a call */
        if (ok_report) {
            choice_finish(srv, r, f->finish_reason == PROTO_FINISH_STOP ? "stop" : "length");
        } else {
            char msg[300];
            snprintf(msg, sizeof(msg), "request failed on %s: %s", f->worker_id,
                     f->error && f->error[0] ? f->error : baton_status_str(f->status));
            bool cannot_fit = f->status == BATON_ERR_NO_SPACE;
            bool had_call = r->call != NULL;
            choice_fail(srv, r, cannot_fit ? 400 : 502, cannot_fit ? "kv_capacity" : "worker_error",
                        msg);
            if (!had_call)
                request_retire(srv, r);
        }
        return; /* finishing/failing may have answered the call and retired r */
    }
    if (r->call) {
        choice_try_close(srv, r); /* may free the call and r; else call_free retires r */
        return;
    }
    request_retire(srv, r);
}

static void on_control_msg(void *arg, proto_chan_t *chan, const char *peer, proto_msg_t *msg) {
    router_server_t *srv = arg;
    (void)chan;
    switch (msg->type) {
    case PROTO_MSG_WORKER_REGISTER:
        if (strcmp(peer, msg->u.worker_register.worker_id) != 0) {
            LOG_WARN(COMP, "register from identity %s names %s: ignored", peer,
                     msg->u.worker_register.worker_id);
            return;
        }
        on_register(srv, &msg->u.worker_register);
        break;
    case PROTO_MSG_WORKER_HEARTBEAT: {
        const proto_worker_heartbeat_t *hb = &msg->u.worker_heartbeat;
        uint64_t now = mono_ms();
        if (worker_table_heartbeat(&srv->workers, hb, now) != BATON_OK) {
            LOG_DEBUG(COMP, "%s", baton_last_error());
            break;
        }
        worker_entry_t *w = worker_table_find(&srv->workers, hb->worker_id);
        if (w)
            observe_util_add(&srv->util[w->slot], hb->epoch, now, hb->busy_us);
        break;
    }
    case PROTO_MSG_PREFILL_DONE: on_prefill_done(srv, &msg->u.prefill_done); break;
    case PROTO_MSG_TOKEN_CHUNK:
        for (uint32_t i = 0; i < msg->u.token_chunk.n_entries; i++)
            on_token_entry(srv, &msg->u.token_chunk.entries[i]);
        break;
    case PROTO_MSG_REQUEST_FINISHED: on_request_finished(srv, &msg->u.request_finished); break;
    default:
        LOG_WARN(COMP, "unexpected %s from %s", proto_msg_type_name(msg->type), peer);
        break;
    }
}

static void on_control_readable(evutil_socket_t fd, short what, void *arg) {
    router_server_t *srv = arg;
    (void)fd;
    (void)what;
    if (proto_chan_drain(srv->control, on_control_msg, srv, 256, NULL) == BATON_ERR_BUSY)
        event_active(srv->control_ev, EV_READ, 0);
}

/* ---- KV events ---- */

static void send_resync(router_server_t *srv, worker_entry_t *w) {
    uint64_t now = mono_ms();
    if (now < w->last_resync_ms + RESYNC_INTERVAL_MS)
        return;
    w->last_resync_ms = now;
    radix_index_worker_info_t info;
    radix_index_worker_info(srv->index, w->slot, &info);
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = PROTO_MSG_KV_RESYNC;
    snprintf(m.u.kv_resync.worker_id, sizeof(m.u.kv_resync.worker_id), "%s", w->id);
    m.u.kv_resync.epoch = info.epoch ? info.epoch : w->epoch;
    m.u.kv_resync.last_seq = info.last_seq;
    if (proto_chan_send(srv->control, w->id, &m) != BATON_OK)
        LOG_WARN(COMP, "kv_resync to %s: %s", w->id, baton_last_error());
    else
        LOG_INFO(COMP, "asked %s for a KV resync after seq %llu", w->id,
                 (unsigned long long)info.last_seq);
    control_activate(srv);
}

static block_hash_link_t link_of(const proto_kv_stored_t *s) {
    block_hash_link_t l;
    static const uint8_t zero[PROTO_ID_BYTES] = {0};
    l.hash = block_hash_from_bytes(s->hash.bytes);
    l.has_parent = memcmp(s->parent_hash.bytes, zero, PROTO_ID_BYTES) != 0;
    l.parent = block_hash_from_bytes(s->parent_hash.bytes);
    return l;
}

static void on_kv_event(router_server_t *srv, const proto_kv_event_t *ev) {
    worker_entry_t *w = worker_table_find(&srv->workers, ev->worker_id);
    if (!w || w->epoch != ev->epoch)
        return; /* not registered (yet) or an old run */
    uint64_t now = mono_ms();
    if (ev->full) {
        snapshot_buf_t *sb = &srv->snapshots[w->slot];
        if (ev->full_part == 0) {
            sb->n = 0;
            sb->epoch = ev->epoch;
            sb->active = true;
        }
        if (!sb->active || sb->epoch != ev->epoch)
            return;
        if (sb->n + ev->n_stored > sb->cap) {
            size_t c = sb->cap ? sb->cap : 256;
            while (c < sb->n + ev->n_stored)
                c *= 2;
            block_hash_link_t *b = realloc(sb->links, c * sizeof(*b));
            if (!b) {
                sb->active = false;
                return;
            }
            sb->links = b;
            sb->cap = c;
        }
        for (uint32_t i = 0; i < ev->n_stored; i++)
            sb->links[sb->n++] = link_of(&ev->stored[i]);
        if (ev->full_last) {
            bool applied = false;
            radix_index_apply_snapshot(srv->index, w->slot, ev->epoch, ev->seq, sb->links, sb->n,
                                       now, &applied);
            LOG_INFO(COMP, "KV snapshot of %s: %zu blocks at seq %llu (%s)", w->id, sb->n,
                     (unsigned long long)ev->seq, applied ? "applied" : "stale");
            sb->active = false;
            sb->n = 0;
        }
        return;
    }
    block_hash_link_t stack_links[64];
    block_hash_link_t *links = ev->n_stored <= 64 ? stack_links
                                                  : malloc(ev->n_stored * sizeof(*links));
    block_hash_t stack_rm[64];
    block_hash_t *rm = ev->n_removed <= 64 ? stack_rm : malloc(ev->n_removed * sizeof(*rm));
    if (links && rm) {
        for (uint32_t i = 0; i < ev->n_stored; i++)
            links[i] = link_of(&ev->stored[i]);
        for (uint32_t i = 0; i < ev->n_removed; i++)
            rm[i] = block_hash_from_bytes(ev->removed[i].bytes);
        bool resync = false;
        baton_status_t st = radix_index_apply_event(srv->index, w->slot, ev->epoch, ev->seq, links,
                                                    ev->n_stored, rm, ev->n_removed, now, &resync);
        if (st != BATON_OK)
            LOG_WARN(COMP, "kv event of %s: %s", w->id, baton_last_error());
        if (resync)
            send_resync(srv, w);
    }
    if (links != stack_links)
        free(links);
    if (rm != stack_rm)
        free(rm);
}

static void on_sub_msg(void *arg, proto_chan_t *chan, const char *peer, proto_msg_t *msg) {
    (void)chan;
    (void)peer;
    if (msg->type == PROTO_MSG_KV_EVENT)
        on_kv_event(arg, &msg->u.kv_event);
}

static void on_sub_readable(evutil_socket_t fd, short what, void *arg) {
    router_server_t *srv = arg;
    (void)fd;
    (void)what;
    if (proto_chan_drain(srv->sub, on_sub_msg, srv, 256, NULL) == BATON_ERR_BUSY)
        event_active(srv->sub_ev, EV_READ, 0);
}

/* ---- periodic: deadlines, worker expiry, lingering requests ---- */

static void on_tick(evutil_socket_t fd, short what, void *arg) {
    router_server_t *srv = arg;
    (void)fd;
    (void)what;
    uint64_t now = mono_ms();
    int slot;
    while ((slot = worker_table_next_expired(&srv->workers, now, srv->cfg.worker_timeout_ms)) >= 0) {
        worker_entry_t *w = &srv->workers.w[slot];
        char why[160];
        snprintf(why, sizeof(why), "worker %s stopped heartbeating", w->id);
        LOG_WARN(COMP, "%s: removed", why);
        fail_requests_of_worker(srv, (uint32_t)slot, w->epoch, why);
        radix_index_remove_worker(srv->index, (uint32_t)slot);
        worker_table_remove(&srv->workers, (uint32_t)slot);
        srv->snapshots[slot].n = 0;
        srv->snapshots[slot].active = false;
        serving_config_refresh(srv);
    }
    radix_index_expire(srv->index, now);
    for (size_t i = 0; i < srv->requests.n;) {
        request_t *r = srv->requests.items[i];
        size_t n_before = srv->requests.n;
        if (!r->done && ((r->state_deadline_ms && now > r->state_deadline_ms) ||
                         now > r->deadline_ms)) {
            char msg[128];
            snprintf(msg, sizeof(msg), "request timed out in state %s",
                     request_state_name(r->state));
            choice_fail(srv, r, 504, "timeout", msg);
        } else if (r->done && !r->call && now > r->trace.finished_us / 1000 + LINGER_MS) {
            request_retire(srv, r);
        } else if (r->done && r->call && !r->closed && r->state == REQUEST_FINISHED &&
                   now >= r->close_deadline_ms) {
            LOG_WARN(COMP, "%s: no RequestFinished within %d ms of the last token: answering "
                           "without the worker's usage and device time", r->id_hex, FINISH_WAIT_MS);
            choice_try_close(srv, r); /* may free the call and several requests */
        }
        if (srv->requests.n == n_before)
            i++;
    }
}

/* ---- generation endpoints ---- */

static bool tokens_in_vocab(const router_server_t *srv, const int32_t *ids, size_t n,
                            http_api_error_t *err) {
    int32_t nv = tokenizer_n_vocab(srv->tok);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= nv) {
            http_api_error_set(err, 400, "invalid_request_error", "prompt", NULL,
                               "token id %d at position %zu is outside the vocabulary [0, %d)",
                               ids[i], i, nv);
            return false;
        }
    return true;
}

/* `bias` has room for PROTO_MAX_LOGIT_BIAS entries; s->logit_bias points
 * into it (the parser capped the count at HTTP_API_MAX_LOGIT_BIAS). */
static void fill_sampling(const http_api_params_t *p, const router_server_t *srv, uint32_t index,
                          uint32_t max_tokens, uint32_t *stop_ids, uint32_t n_stop_ids,
                          proto_logit_bias_t *bias, proto_sampling_t *s) {
    memset(s, 0, sizeof(*s));
    s->temperature = p->temperature;
    s->top_p = p->top_p;
    s->top_k = p->top_k > 0 ? (uint32_t)p->top_k : 0;
    if (s->top_k > (uint32_t)tokenizer_n_vocab(srv->tok))
        s->top_k = (uint32_t)tokenizer_n_vocab(srv->tok);
    s->min_p = p->min_p;
    s->repetition_penalty = p->repetition_penalty;
    s->presence_penalty = p->presence_penalty;
    s->frequency_penalty = p->frequency_penalty;
    if (p->has_seed) {
        s->seed = p->seed + index;
    } else if (getrandom(&s->seed, sizeof(s->seed), 0) != (ssize_t)sizeof(s->seed)) {
        s->seed = mono_us() ^ ((uint64_t)index << 32);
    }
    s->max_tokens = max_tokens;
    s->stop_token_ids = stop_ids;
    s->n_stop_token_ids = n_stop_ids;
    s->logprobs = p->logprobs;
    s->top_logprobs = p->top_logprobs;
    s->ignore_eos = p->ignore_eos;
    for (size_t i = 0; i < p->n_logit_bias && i < PROTO_MAX_LOGIT_BIAS; i++) {
        bias[i].token = (uint32_t)p->logit_bias[i].token;
        bias[i].bias = p->logit_bias[i].bias;
        s->n_logit_bias = (uint32_t)(i + 1);
    }
    s->logit_bias = s->n_logit_bias ? bias : NULL;
}

/* Routes and sends one request to its workers. */
static baton_status_t request_dispatch(router_server_t *srv, call_t *c, request_t *r) {
    uint32_t match[RADIX_INDEX_MAX_WORKERS];
    uint64_t now = mono_ms();
    baton_status_t st = radix_index_match(srv->index, r->hashes, r->n_hashes, now, match);
    if (st != BATON_OK)
        return st;
    uint32_t bs = srv->cfg.block_size;
    uint32_t n_blocks = (uint32_t)((r->n_prompt + bs - 1) / bs);
    route_choice_t pick;
    if ((st = route_pick(&srv->route, &srv->workers, match, n_blocks, &pick)) != BATON_OK)
        return st;
    worker_entry_t *P = &srv->workers.w[pick.prefill_slot];
    worker_entry_t *D = &srv->workers.w[pick.decode_slot];
    uint32_t stop_ids[4];
    uint32_t n_stop_ids = 0;
    int32_t cand[2] = {tokenizer_eos(srv->tok), tokenizer_eot(srv->tok)};
    for (int i = 0; i < 2; i++)
        if (cand[i] >= 0 && (n_stop_ids == 0 || stop_ids[0] != (uint32_t)cand[i]))
            stop_ids[n_stop_ids++] = (uint32_t)cand[i];
    if (c->params.ignore_eos)
        n_stop_ids = 0;
    proto_sampling_t sampling;
    proto_logit_bias_t bias[PROTO_MAX_LOGIT_BIAS];
    _Static_assert(HTTP_API_MAX_LOGIT_BIAS <= PROTO_MAX_LOGIT_BIAS, "logit_bias bounds");
    fill_sampling(&c->params, srv, r->index, r->max_tokens, stop_ids, n_stop_ids, bias,
                  &sampling);
    uint64_t deadline = unix_us() + srv->cfg.request_timeout_ms * 1000u;
    uint32_t *ids = (uint32_t *)r->prompt; /* token ids are non-negative int32 */

    proto_msg_t dm;
    memset(&dm, 0, sizeof(dm));
    dm.type = PROTO_MSG_DECODE_REQUEST;
    proto_decode_request_t *d = &dm.u.decode_request;
    d->request_id = r->id;
    snprintf(d->prefill_worker_id, sizeof(d->prefill_worker_id), "%s", P->id);
    d->n_prompt_tokens = (uint32_t)r->n_prompt;
    d->n_blocks = n_blocks;
    d->token_ids = ids;
    d->n_token_ids = (uint32_t)r->n_prompt;
    d->sampling = sampling;
    d->tenant = c->params.user ? c->params.user : "";
    d->deadline_unix_us = deadline;
    d->prefill_endpoint = P->zmq_endpoint;

    proto_msg_t pm;
    memset(&pm, 0, sizeof(pm));
    pm.type = PROTO_MSG_PREFILL_REQUEST;
    proto_prefill_request_t *p = &pm.u.prefill_request;
    p->request_id = r->id;
    snprintf(p->decode_worker_id, sizeof(p->decode_worker_id), "%s", D->id);
    p->decode_epoch = D->epoch;
    p->token_ids = ids;
    p->n_token_ids = (uint32_t)r->n_prompt;
    p->sampling = sampling;
    p->tenant = d->tenant;
    p->deadline_unix_us = deadline;
    p->decode_endpoint = D->zmq_endpoint;

    if ((st = proto_chan_send(srv->control, D->id, &dm)) != BATON_OK)
        return baton_error(st, "cannot reach decode worker %s: %s", D->id, baton_last_error());
    if ((st = proto_chan_send(srv->control, P->id, &pm)) != BATON_OK) {
        proto_msg_t am;
        memset(&am, 0, sizeof(am));
        am.type = PROTO_MSG_ABORT;
        am.u.abort.request_id = r->id;
        am.u.abort.reason = "prefill worker unreachable";
        proto_chan_send(srv->control, D->id, &am);
        control_activate(srv);
        return baton_error(st, "cannot reach prefill worker %s: %s", P->id, baton_last_error());
    }
    control_activate(srv);
    r->routed = true;
    r->prefill_slot = P->slot;
    r->decode_slot = D->slot;
    snprintf(r->prefill_id, sizeof(r->prefill_id), "%s", P->id);
    snprintf(r->decode_id, sizeof(r->decode_id), "%s", D->id);
    r->prefill_epoch = P->epoch;
    r->decode_epoch = D->epoch;
    r->predicted_hit_blocks = pick.predicted_hit_blocks;
    uint64_t cached_tokens = (uint64_t)pick.predicted_hit_blocks * bs;
    r->load_prefill_tokens = r->n_prompt > cached_tokens ? r->n_prompt - cached_tokens : 1;
    r->load_blocks = n_blocks;
    P->inflight_prefill_tokens += r->load_prefill_tokens;
    D->inflight_blocks += n_blocks;
    P->inflight++;
    if (D != P)
        D->inflight++;
    P->routed_total++;
    if (D != P)
        D->routed_total++;
    r->trace.routed_us = mono_us();
    request_deadlines_t dl = deadlines_of(srv);
    request_set_state(r, REQUEST_ROUTED, now, &dl);
    if (r->n_hashes)
        radix_index_insert_speculative(srv->index, P->slot, r->hashes, r->n_hashes,
                                       SPECULATIVE_TTL_MS, now);
    LOG_DEBUG(COMP, "%s -> prefill %s (predicted hit %u/%zu blocks), decode %s", r->id_hex, P->id,
              pick.predicted_hit_blocks, r->n_hashes, D->id);
    return BATON_OK;
}

static bool check_auth(router_server_t *srv, struct evhttp_request *req) {
    if (srv->n_api_keys == 0)
        return true;
    const char *h = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    if (h && !strncmp(h, "Bearer ", 7))
        for (size_t i = 0; i < srv->n_api_keys; i++)
            if (!strcmp(h + 7, srv->api_keys[i]))
                return true;
    send_error_msg(req, 401, "invalid_request_error", NULL, "invalid_api_key",
                   "missing or invalid API key (Authorization: Bearer <key>)");
    return false;
}

/* Reads the body; false (answered 413) when it is over the limit. */
static bool read_body(router_server_t *srv, struct evhttp_request *req, char **out, size_t *len) {
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t n = evbuffer_get_length(in);
    if (n > srv->cfg.max_body_bytes) {
        char msg[160];
        snprintf(msg, sizeof(msg), "request body of %zu bytes is over the limit of %zu bytes", n,
                 srv->cfg.max_body_bytes);
        send_error_msg(req, 413, "invalid_request_error", NULL, "request_too_large", msg);
        return false;
    }
    char *b = malloc(n + 1);
    if (!b) {
        send_error_msg(req, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    evbuffer_copyout(in, b, n);
    b[n] = 0;
    *out = b;
    *len = n;
    return true;
}

/* Tokenizes prompt i of the call into ids (malloc'd). */
static bool tokenize_prompt(router_server_t *srv, const http_api_params_t *p, size_t i,
                            int32_t **ids, size_t *n, http_api_error_t *err) {
    baton_status_t st;
    if (p->kind == HTTP_API_CHAT) {
        chat_message_t *msgs = calloc(p->n_messages, sizeof(*msgs));
        if (!msgs) {
            http_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
            return false;
        }
        for (size_t k = 0; k < p->n_messages; k++) {
            msgs[k].role = p->messages[k].role;
            msgs[k].content = p->messages[k].content;
            msgs[k].content_len = p->messages[k].content_len;
        }
        st = chat_template_render(srv->chat, msgs, p->n_messages, true, ids, n);
        free(msgs);
        if (st != BATON_OK) {
            http_api_error_set(err, 400, "invalid_request_error", "messages", NULL, "%s",
                               baton_last_error());
            return false;
        }
        return true;
    }
    const http_api_prompt_t *pr = &p->prompts[i];
    if (pr->text) {
        st = tokenizer_encode_alloc(srv->tok, pr->text, pr->text_len, TOKENIZER_ENCODE_ADD_SPECIAL,
                                    ids, n);
        if (st != BATON_OK) {
            http_api_error_set(err, 400, "invalid_request_error", "prompt", NULL, "%s",
                               baton_last_error());
            return false;
        }
        return true;
    }
    if (!tokens_in_vocab(srv, pr->ids, pr->n_ids, err))
        return false;
    *ids = malloc(pr->n_ids * sizeof(int32_t));
    if (!*ids) {
        http_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    memcpy(*ids, pr->ids, pr->n_ids * sizeof(int32_t));
    *n = pr->n_ids;
    return true;
}

static void handle_generate(router_server_t *srv, struct evhttp_request *req, http_api_kind_t kind) {
    uint64_t arrival = mono_us();
    if (!check_auth(srv, req))
        return;
    char *body;
    size_t len;
    if (!read_body(srv, req, &body, &len)) {
        srv->metrics.requests_rejected++;
        return;
    }
    http_api_error_t err;
    memset(&err, 0, sizeof(err));
    call_t *c = calloc(1, sizeof(*c));
    if (!c) {
        free(body);
        send_error_msg(req, 500, "server_error", NULL, NULL, "out of memory");
        return;
    }
    c->srv = srv;
    c->req = req;
    c->created = (int64_t)time(NULL);
    baton_status_t st = http_api_parse(body, len, kind, &c->params, &err);
    free(body);
    if (st != BATON_OK)
        goto reject;
    http_api_params_t *p = &c->params;
    if (strcmp(p->model, srv->model_name) != 0) {
        http_api_error_set(&err, 404, "invalid_request_error", "model", "model_not_found",
                           "The model '%s' does not exist; this server serves '%s'", p->model,
                           srv->model_name);
        goto reject;
    }
    for (size_t i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].token >= tokenizer_n_vocab(srv->tok)) {
            http_api_error_set(&err, 400, "invalid_request_error", "logit_bias", NULL,
                               "'logit_bias' token id %d is outside the vocabulary [0, %d)",
                               p->logit_bias[i].token, tokenizer_n_vocab(srv->tok));
            goto reject;
        }
    size_t n_prompts = kind == HTTP_API_CHAT ? 1 : p->n_prompts;
    c->n_choices = n_prompts * p->n;
    c->choices = calloc(c->n_choices, sizeof(*c->choices));
    if (p->echo) {
        c->echo_text = calloc(c->n_choices, sizeof(*c->echo_text));
        c->echo_len = calloc(c->n_choices, sizeof(*c->echo_len));
    }
    if (!c->choices || (p->echo && (!c->echo_text || !c->echo_len))) {
        http_api_error_set(&err, 500, "server_error", NULL, NULL, "out of memory");
        goto reject;
    }
    char why[256];
    for (size_t pi = 0; pi < n_prompts; pi++) {
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if (!tokenize_prompt(srv, p, pi, &ids, &n_ids, &err))
            goto reject;
        const char *param = kind == HTTP_API_CHAT ? "messages" : "prompt";
        if (n_ids == 0) {
            free(ids);
            http_api_error_set(&err, 400, "invalid_request_error", param, NULL,
                               "the prompt is empty after tokenization");
            goto reject;
        }
        int64_t max_tokens = p->max_tokens;
        if (max_tokens < 0)
            max_tokens = (int64_t)srv->n_ctx - (int64_t)n_ids;
        if ((int64_t)n_ids + (max_tokens > 0 ? max_tokens : 1) > (int64_t)srv->n_ctx ||
            max_tokens < 1) {
            free(ids);
            http_api_error_set(&err, 400, "invalid_request_error", param,
                               "context_length_exceeded",
                               "This model's maximum context length is %u tokens. However, you "
                               "requested %lld tokens (%zu in the %s, %lld in the completion).",
                               srv->n_ctx, (long long)n_ids + (max_tokens > 0 ? max_tokens : 0),
                               n_ids, param, (long long)(max_tokens > 0 ? max_tokens : 0));
            goto reject;
        }
        for (uint32_t k = 0; k < p->n; k++) {
            size_t ci = pi * p->n + k;
            request_t *r = calloc(1, sizeof(*r));
            if (!r) {
                free(ids);
                http_api_error_set(&err, 500, "server_error", NULL, NULL, "out of memory");
                goto reject;
            }
            c->choices[ci] = r;
            r->call = c;
            r->index = (uint32_t)ci;
            r->trace.arrival_us = arrival;
            r->deadline_ms = arrival / 1000 + srv->cfg.request_timeout_ms;
            r->max_tokens = (uint32_t)max_tokens;
            r->prompt = malloc(n_ids * sizeof(int32_t));
            size_t n_full = n_ids / srv->cfg.block_size;
            r->hashes = malloc((n_full ? n_full : 1) * sizeof(block_hash_t));
            if (!r->prompt || !r->hashes) {
                free(ids);
                http_api_error_set(&err, 500, "server_error", NULL, NULL, "out of memory");
                goto reject;
            }
            memcpy(r->prompt, ids, n_ids * sizeof(int32_t));
            r->n_prompt = n_ids;
            block_hash_chain(r->prompt, n_ids, srv->cfg.block_size, srv->cfg.hash_seed, NULL,
                             r->hashes, n_full, &r->n_hashes);
            if (stream_init(srv->tok, p->stop, p->stop_len, p->n_stop, &r->stream) != BATON_OK ||
                getrandom(r->id.bytes, PROTO_ID_BYTES, 0) != PROTO_ID_BYTES) {
                free(ids);
                http_api_error_set(&err, 500, "server_error", NULL, NULL, "%s", baton_last_error());
                goto reject;
            }
            for (int b = 0; b < PROTO_ID_BYTES; b++)
                snprintf(r->id_hex + 2 * b, 3, "%02x", r->id.bytes[b]);
            if (p->echo) {
                const http_api_prompt_t *pr = &p->prompts[pi];
                if (pr->text) {
                    c->echo_text[ci] = strndup(pr->text, pr->text_len);
                    c->echo_len[ci] = pr->text_len;
                } else {
                    size_t el = 0;
                    if (tokenizer_decode(srv->tok, ids, n_ids, 0, &c->echo_text[ci], &el) == BATON_OK)
                        c->echo_len[ci] = el;
                }
            }
        }
        free(ids);
    }
    if (!worker_table_ready(&srv->workers, why, sizeof(why))) {
        http_api_error_set(&err, 503, "server_error", NULL, "no_workers",
                           "no worker pair is ready: %s", why);
        goto reject;
    }
    openai_format_id(kind, c->choices[0]->id.bytes, c->id);
    memcpy(c->fingerprint, srv->fingerprint, sizeof(c->fingerprint));
    {
        char tenant[OBSERVE_TENANT_MAX + 1];
        const char *key = NULL;
        if (srv->n_api_keys > 0) { /* check_auth accepted the bearer key */
            const char *h = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
            key = h && !strncmp(h, "Bearer ", 7) ? h + 7 : NULL;
        }
        observe_tenant_name(key, p->user, tenant);
        for (size_t i = 0; i < c->n_choices; i++) {
            memcpy(c->choices[i]->response_id, c->id, sizeof(c->id));
            memcpy(c->choices[i]->tenant, tenant, sizeof(tenant));
        }
    }
    for (size_t i = 0; i < c->n_choices; i++) {
        if (request_table_add(&srv->requests, c->choices[i]) != BATON_OK) {
            for (size_t k = 0; k < i; k++)
                request_table_remove(&srv->requests, c->choices[k]);
            http_api_error_set(&err, 500, "server_error", NULL, NULL, "out of memory");
            goto reject;
        }
    }
    for (size_t i = 0; i < c->n_choices; i++) {
        request_t *r = c->choices[i];
        st = request_dispatch(srv, c, r);
        if (st != BATON_OK) {
            http_api_error_set(&err, 503, "server_error", NULL, "no_workers", "%s",
                               baton_last_error());
            goto reject_dispatched;
        }
    }
    c->conn = evhttp_request_get_connection(req);
    if (c->conn) {
        evhttp_connection_set_closecb(c->conn, on_conn_close, c);
        /* evhttp stops reading once a request is parsed; read again so that
         * a client closing before the reply (EOF) is noticed and aborted */
        struct bufferevent *bev = evhttp_connection_get_bufferevent(c->conn);
        if (bev) {
            /* no read timeout while the reply is being generated (it may
             * take longer than --http-timeout-s); writes keep theirs so a
             * client that stops reading a stream is still cut off.
             * call_detach restores both for the idle keep-alive wait. */
            struct timeval wt = {srv->cfg.http_timeout_s, 0};
            bufferevent_set_timeouts(bev, NULL, &wt);
            bufferevent_enable(bev, EV_READ);
        }
    }
    return;

reject_dispatched:
    /* choices already in the table: fail them through the call */
    srv->metrics.requests_rejected++;
    call_fail(c, &err);
    return;
reject:
    srv->metrics.requests_rejected++;
    send_error(req, &err);
    for (size_t i = 0; i < c->n_choices; i++)
        request_free(c->choices ? c->choices[i] : NULL);
    if (c->choices)
        memset(c->choices, 0, c->n_choices * sizeof(*c->choices));
    call_free(c);
}

/* ---- other endpoints ---- */

static void handle_models(router_server_t *srv, struct evhttp_request *req) {
    if (!check_auth(srv, req))
        return;
    send_json_obj(req, 200,
                  json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:I}]}", "object", "list", "data", "id",
                            srv->model_name, "object", "model", "created",
                            (json_int_t)srv->started_unix, "owned_by", "baton", "max_model_len",
                            (json_int_t)srv->n_ctx));
}

static void handle_health(router_server_t *srv, struct evhttp_request *req) {
    char why[256] = "";
    bool ready = worker_table_ready(&srv->workers, why, sizeof(why));
    send_json_obj(req, ready ? 200 : 503,
                  ready ? json_pack("{s:s}", "status", "ok")
                        : json_pack("{s:s, s:s}", "status", "not ready", "reason", why));
}

static void handle_tokenize(router_server_t *srv, struct evhttp_request *req, bool detok) {
    char *body;
    size_t len;
    if (!read_body(srv, req, &body, &len))
        return;
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    free(body);
    if (!json_is_object(root)) {
        json_decref(root);
        send_error_msg(req, 400, "invalid_request_error", NULL, "invalid_json",
                       "the body must be a JSON object");
        return;
    }
    http_api_error_t err;
    if (detok) {
        json_t *toks = json_object_get(root, "tokens");
        size_t n = json_array_size(toks);
        int32_t *ids = malloc((n ? n : 1) * sizeof(int32_t));
        bool ok = json_is_array(toks) && ids;
        for (size_t i = 0; ok && i < n; i++) {
            json_t *t = json_array_get(toks, i);
            ok = json_is_integer(t) && json_integer_value(t) >= 0 &&
                 json_integer_value(t) < tokenizer_n_vocab(srv->tok);
            if (ok)
                ids[i] = (int32_t)json_integer_value(t);
        }
        char *text = NULL;
        size_t tl = 0;
        if (ok && tokenizer_decode(srv->tok, ids, n, 0, &text, &tl) == BATON_OK) {
            send_json_obj(req, 200, json_pack("{s:s%}", "prompt", text, tl));
        } else {
            send_error_msg(req, 400, "invalid_request_error", "tokens", NULL,
                           "'tokens' must be an array of token ids within the vocabulary");
        }
        free(text);
        free(ids);
        json_decref(root);
        return;
    }
    http_api_params_t p;
    memset(&p, 0, sizeof(p));
    json_t *prompt = json_object_get(root, "prompt");
    json_t *messages = json_object_get(root, "messages");
    json_t *add = json_object_get(root, "add_special_tokens");
    int32_t *ids = NULL;
    size_t n = 0;
    bool ok = false;
    if (json_is_string(prompt)) {
        uint32_t flags = (add == NULL || json_is_true(add)) ? TOKENIZER_ENCODE_ADD_SPECIAL : 0;
        ok = tokenizer_encode_alloc(srv->tok, json_string_value(prompt), json_string_length(prompt),
                                    flags, &ids, &n) == BATON_OK;
        if (!ok)
            http_api_error_set(&err, 400, "invalid_request_error", "prompt", NULL, "%s",
                               baton_last_error());
    } else if (messages) {
        /* reuse the chat parser for the messages array */
        json_t *wrap = json_pack("{s:s, s:O}", "model", srv->model_name, "messages", messages);
        char *s = wrap ? json_dumps(wrap, JSON_COMPACT) : NULL;
        json_decref(wrap);
        if (s && http_api_parse(s, strlen(s), HTTP_API_CHAT, &p, &err) == BATON_OK)
            ok = tokenize_prompt(srv, &p, 0, &ids, &n, &err);
        free(s);
    } else {
        http_api_error_set(&err, 400, "invalid_request_error", "prompt", NULL,
                           "'prompt' (string) or 'messages' is required");
    }
    if (ok) {
        json_t *arr = json_array();
        for (size_t i = 0; arr && i < n; i++)
            json_array_append_new(arr, json_integer(ids[i]));
        send_json_obj(req, 200, json_pack("{s:o, s:I, s:I}", "tokens", arr, "count",
                                          (json_int_t)n, "max_model_len", (json_int_t)srv->n_ctx));
    } else {
        send_error(req, &err);
    }
    free(ids);
    http_api_params_free(&p);
    json_decref(root);
}

static void handle_metrics(router_server_t *srv, struct evhttp_request *req) {
    metrics_text_t t;
    memset(&t, 0, sizeof(t));
    router_metrics_write(&t, &srv->metrics);
    uint64_t now = mono_ms();
    metrics_text_printf(&t, "# TYPE baton_router_inflight_requests gauge\n"
                            "baton_router_inflight_requests %zu\n",
                        srv->requests.n);
    radix_index_stats_t is;
    radix_index_get_stats(srv->index, &is);
    metrics_text_printf(
        &t,
        "# TYPE baton_router_index_nodes gauge\nbaton_router_index_nodes %zu\n"
        "# TYPE baton_router_index_events_applied_total counter\n"
        "baton_router_index_events_applied_total %llu\n"
        "# TYPE baton_router_index_events_dropped_total counter\n"
        "baton_router_index_events_dropped_total %llu\n"
        "# TYPE baton_router_index_resyncs_total counter\n"
        "baton_router_index_resyncs_total %llu\n"
        "# TYPE baton_router_balance_overrides_total counter\n"
        "baton_router_balance_overrides_total %llu\n",
        is.n_nodes, (unsigned long long)is.events_applied, (unsigned long long)is.events_dropped,
        (unsigned long long)is.resyncs_requested, (unsigned long long)srv->route.balance_overrides);
    metrics_text_printf(&t, "# HELP baton_worker_up Registered workers (1 per worker).\n"
                            "# TYPE baton_worker_up gauge\n");
    for (uint32_t i = 0; i < WORKER_TABLE_MAX; i++) {
        const worker_entry_t *w = &srv->workers.w[i];
        if (!w->used)
            continue;
        const proto_worker_heartbeat_t *hb = &w->hb;
        char lab[160];
        snprintf(lab, sizeof(lab), "worker=\"%s\",role=\"%s\"", w->id,
                 worker_table_role_name(w->role));
        radix_index_worker_info_t info;
        radix_index_worker_info(srv->index, i, &info);
        int64_t stale = radix_index_staleness_ms(srv->index, i, now);
        metrics_text_printf(
            &t,
            "baton_worker_up{%s} 1\n"
            "baton_worker_free_blocks{%s} %u\n"
            "baton_worker_total_blocks{%s} %u\n"
            "baton_worker_used_blocks{%s} %u\n"
            "baton_worker_running{%s} %u\n"
            "baton_worker_waiting{%s} %u\n"
            "baton_worker_queued_prefill_tokens{%s} %llu\n"
            "baton_worker_batch_occupancy{%s} %.4f\n"
            "baton_worker_heartbeat_age_seconds{%s} %.3f\n"
            "baton_worker_cache_hit_blocks_total{%s} %llu\n"
            "baton_worker_cache_lookup_blocks_total{%s} %llu\n"
            "baton_worker_preemptions_total{%s} %llu\n"
            "baton_worker_steps_total{%s} %llu\n"
            "baton_worker_busy_seconds_total{%s} %.6f\n"
            "baton_router_worker_inflight{%s} %u\n"
            "baton_router_worker_routed_total{%s} %llu\n"
            "baton_router_worker_inflight_prefill_tokens{%s} %llu\n"
            "baton_router_index_blocks{%s} %zu\n"
            "baton_router_index_speculative_blocks{%s} %zu\n"
            "baton_router_index_staleness_seconds{%s} %.3f\n",
            lab, lab, hb->free_blocks, lab, hb->total_blocks, lab, hb->used_blocks, lab,
            hb->n_running, lab, hb->n_waiting, lab, (unsigned long long)hb->queued_prefill_tokens,
            lab, hb->batch_occupancy, lab, (double)(now - w->last_seen_ms) / 1000.0, lab,
            (unsigned long long)hb->cache_hit_blocks, lab,
            (unsigned long long)hb->cache_lookup_blocks, lab, (unsigned long long)hb->preemptions,
            lab, (unsigned long long)hb->steps, lab, (double)hb->busy_us / 1e6, lab, w->inflight,
            lab, (unsigned long long)w->routed_total, lab,
            (unsigned long long)w->inflight_prefill_tokens, lab, info.n_blocks, lab,
            info.n_speculative, lab, stale < 0 ? -1.0 : (double)stale / 1000.0);
    }
    uint64_t hit = 0, lookup = 0;
    for (uint32_t i = 0; i < WORKER_TABLE_MAX; i++)
        if (srv->workers.w[i].used && srv->workers.w[i].role != PROTO_ROLE_DECODE) {
            hit += srv->workers.w[i].hb.cache_hit_blocks;
            lookup += srv->workers.w[i].hb.cache_lookup_blocks;
        }
    metrics_text_printf(&t,
                        "# HELP baton_router_worker_measured_hit_rate Prefix-cache hit blocks / "
                        "looked-up blocks summed over the prefill workers' heartbeats.\n"
                        "# TYPE baton_router_worker_measured_hit_rate gauge\n"
                        "baton_router_worker_measured_hit_rate %.6f\n",
                        lookup ? (double)hit / (double)lookup : 0.0);
    observe_tenants_write(&t, &srv->tenants);
    metrics_text_printf(&t,
                        "# HELP baton_worker_utilization Busy fraction of the worker's steps over "
                        "the last minute (heartbeats' busy_us deltas).\n"
                        "# TYPE baton_worker_utilization gauge\n");
    for (uint32_t i = 0; i < WORKER_TABLE_MAX; i++) {
        const worker_entry_t *w = &srv->workers.w[i];
        double f;
        if (w->used && observe_util_fraction(&srv->util[i], now, &f))
            metrics_text_printf(&t, "baton_worker_utilization{worker=\"%s\",role=\"%s\"} %.4f\n",
                                w->id, worker_table_role_name(w->role), f);
    }
    metrics_text_printf(&t,
                        "# HELP baton_worker_idle_gap_seconds Scheduler idle gaps: end of a step "
                        "-> start of the next while work was pending (sum, count, max).\n"
                        "# TYPE baton_worker_idle_gap_seconds summary\n");
    for (uint32_t i = 0; i < WORKER_TABLE_MAX; i++) {
        const worker_entry_t *w = &srv->workers.w[i];
        if (!w->used)
            continue;
        metrics_text_printf(&t,
                            "baton_worker_idle_gap_seconds_sum{worker=\"%s\",role=\"%s\"} %.6f\n"
                            "baton_worker_idle_gap_seconds_count{worker=\"%s\",role=\"%s\"} %llu\n",
                            w->id, worker_table_role_name(w->role), (double)w->hb.idle_gap_us / 1e6,
                            w->id, worker_table_role_name(w->role),
                            (unsigned long long)w->hb.idle_gaps);
    }
    metrics_text_printf(&t, "# TYPE baton_worker_idle_gap_max_seconds gauge\n");
    for (uint32_t i = 0; i < WORKER_TABLE_MAX; i++) {
        const worker_entry_t *w = &srv->workers.w[i];
        if (w->used)
            metrics_text_printf(&t, "baton_worker_idle_gap_max_seconds{worker=\"%s\",role=\"%s\"} %.6f\n",
                                w->id, worker_table_role_name(w->role),
                                (double)w->hb.idle_gap_max_us / 1e6);
    }
    const proto_stats_t *ps = proto_chan_stats(srv->control);
    metrics_text_printf(&t, "# TYPE baton_router_proto_errors_total counter\n"
                            "baton_router_proto_errors_total %llu\n",
                        (unsigned long long)(proto_stats_errors(ps) +
                                             (srv->sub ? proto_stats_errors(proto_chan_stats(srv->sub)) : 0)));
    if (t.failed) {
        metrics_text_free(&t);
        send_error_msg(req, 500, "server_error", NULL, NULL, "out of memory");
        return;
    }
    struct evbuffer *buf = evbuffer_new();
    if (buf)
        evbuffer_add(buf, t.buf, t.len);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; version=0.0.4");
    evhttp_send_reply(req, 200, "OK", buf);
    if (buf)
        evbuffer_free(buf);
    metrics_text_free(&t);
}

/* GET /v1/requests/{id}: the stage record of a recent request (choice 0, or
 * ?choice=N), from the ring of the last RECORD_RING records. */
static void handle_request_record(router_server_t *srv, struct evhttp_request *req, const char *id) {
    if (!check_auth(srv, req))
        return;
    uint32_t choice = 0;
    const struct evhttp_uri *u = evhttp_request_get_evhttp_uri(req);
    const char *q = u ? evhttp_uri_get_query(u) : NULL;
    if (q && !strncmp(q, "choice=", 7)) {
        char *end;
        unsigned long v = strtoul(q + 7, &end, 10);
        if (*end || end == q + 7 || v > UINT32_MAX) {
            send_error_msg(req, 400, "invalid_request_error", "choice", NULL,
                           "choice must be a non-negative integer");
            return;
        }
        choice = (uint32_t)v;
    }
    observe_record_t *rec = strlen(id) < 48 ? observe_ring_find(&srv->records, id, choice) : NULL;
    if (!rec) {
        char msg[160];
        snprintf(msg, sizeof(msg), "no record of request '%.60s' (choice %u): unknown, still "
                                   "running, or older than the last %d requests",
                 id, choice, RECORD_RING);
        send_error_msg(req, 404, "invalid_request_error", NULL, "not_found", msg);
        return;
    }
    send_json_obj(req, 200, observe_record_json(rec));
}

/* GET /v1/serving_config: the configuration the fingerprint is made of. */
static void handle_serving_config(router_server_t *srv, struct evhttp_request *req) {
    if (!check_auth(srv, req))
        return;
    json_t *o = srv->serving_config ? json_deep_copy(srv->serving_config) : json_object();
    if (o)
        json_object_set_new(o, "system_fingerprint", json_string(srv->fingerprint));
    send_json_obj(req, 200, o);
}

static void on_http(struct evhttp_request *req, void *arg) {
    router_server_t *srv = arg;
    const char *uri = evhttp_request_get_uri(req);
    const struct evhttp_uri *parsed = evhttp_request_get_evhttp_uri(req);
    const char *path = parsed ? evhttp_uri_get_path(parsed) : NULL;
    if (!path)
        path = uri ? uri : "";
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    bool get = cmd == EVHTTP_REQ_GET, post = cmd == EVHTTP_REQ_POST;
    if (!strcmp(path, "/v1/chat/completions") && post)
        handle_generate(srv, req, HTTP_API_CHAT);
    else if (!strcmp(path, "/v1/completions") && post)
        handle_generate(srv, req, HTTP_API_COMPLETIONS);
    else if (!strcmp(path, "/v1/models") && get)
        handle_models(srv, req);
    else if (!strcmp(path, "/health") && get)
        handle_health(srv, req);
    else if (!strcmp(path, "/metrics") && get)
        handle_metrics(srv, req);
    else if (!strncmp(path, "/v1/requests/", 13) && get)
        handle_request_record(srv, req, path + 13);
    else if (!strcmp(path, "/v1/serving_config") && get)
        handle_serving_config(srv, req);
    else if (!strcmp(path, "/tokenize") && post)
        handle_tokenize(srv, req, false);
    else if (!strcmp(path, "/detokenize") && post)
        handle_tokenize(srv, req, true);
    else if (!strcmp(path, "/v1/chat/completions") || !strcmp(path, "/v1/completions") ||
             !strcmp(path, "/v1/models") || !strcmp(path, "/health") ||
             !strcmp(path, "/metrics") || !strcmp(path, "/tokenize") ||
             !strcmp(path, "/detokenize") || !strcmp(path, "/v1/serving_config") ||
             !strncmp(path, "/v1/requests/", 13))
        send_error_msg(req, 405, "invalid_request_error", NULL, "method_not_allowed",
                       "method not allowed on this path");
    else {
        char msg[300];
        snprintf(msg, sizeof(msg), "no such endpoint: %.200s", path);
        send_error_msg(req, 404, "invalid_request_error", NULL, "not_found", msg);
    }
}

/* ---- init / free ---- */

static baton_status_t load_model(router_server_t *srv) {
    gguf_file_t *f = NULL;
    baton_status_t st = gguf_open(srv->cfg.model_path, &f);
    if (st != BATON_OK)
        return st;
    if ((st = tokenizer_load(f, &srv->tok)) != BATON_OK)
        goto out;
    if ((st = chat_template_init(f, srv->tok, &srv->chat)) != BATON_OK)
        goto out;
    gguf_str_t arch;
    char key[160];
    srv->n_ctx = 2048;
    if (gguf_get_str(f, "general.architecture", &arch) == BATON_OK) {
        snprintf(key, sizeof(key), "%.*s.context_length", (int)arch.len, arch.data);
        uint32_t n_ctx;
        if (gguf_get_u32(f, key, &n_ctx) == BATON_OK && n_ctx > 0)
            srv->n_ctx = n_ctx;
    }
    if (srv->cfg.served_model_name) {
        snprintf(srv->model_name, sizeof(srv->model_name), "%s", srv->cfg.served_model_name);
    } else {
        gguf_str_t name;
        if (gguf_get_str(f, "general.name", &name) == BATON_OK && name.len > 0) {
            snprintf(srv->model_name, sizeof(srv->model_name), "%.*s", (int)name.len, name.data);
        } else {
            const char *base = strrchr(srv->cfg.model_path, '/');
            base = base ? base + 1 : srv->cfg.model_path;
            snprintf(srv->model_name, sizeof(srv->model_name), "%s", base);
            char *dot = strstr(srv->model_name, ".gguf");
            if (dot)
                *dot = 0;
        }
    }
out:
    gguf_close(f);
    return st;
}

static baton_status_t parse_api_keys(router_server_t *srv) {
    const char *s = srv->cfg.api_keys;
    if (!s || !*s)
        return BATON_OK;
    size_t n = 1;
    for (const char *q = s; *q; q++)
        n += *q == ',';
    srv->api_keys = calloc(n, sizeof(char *));
    if (!srv->api_keys)
        return baton_error(BATON_ERR_NO_MEMORY, "out of memory");
    const char *start = s;
    for (;;) {
        const char *end = strchr(start, ',');
        size_t len = end ? (size_t)(end - start) : strlen(start);
        if (len > 0) {
            srv->api_keys[srv->n_api_keys] = strndup(start, len);
            if (!srv->api_keys[srv->n_api_keys])
                return baton_error(BATON_ERR_NO_MEMORY, "out of memory");
            srv->n_api_keys++;
        }
        if (!end)
            break;
        start = end + 1;
    }
    return BATON_OK;
}

baton_status_t router_server_init(const router_config_t *cfg, struct event_base *base,
                                  router_server_t **out) {
    if (!cfg || !base || !out || !cfg->model_path || cfg->block_size == 0)
        return baton_error(BATON_ERR_INVALID_ARG, "router_server_init: bad argument");
    router_server_t *srv = calloc(1, sizeof(*srv));
    if (!srv)
        return baton_error(BATON_ERR_NO_MEMORY, "out of memory");
    srv->cfg = *cfg;
    srv->base = base;
    srv->started_unix = (int64_t)time(NULL);
    baton_status_t st;
    if ((st = load_model(srv)) != BATON_OK || (st = parse_api_keys(srv)) != BATON_OK)
        goto fail;
    worker_table_init(&srv->workers, cfg->block_size, cfg->hash_seed,
                      (uint32_t)tokenizer_n_vocab(srv->tok));
    route_state_init(&srv->route, &cfg->route);
    router_metrics_init(&srv->metrics);
    if ((st = observe_ring_init(&srv->records, RECORD_RING)) != BATON_OK)
        goto fail;
    serving_config_refresh(srv);
    if ((st = radix_index_init(&srv->index)) != BATON_OK)
        goto fail;
    srv->zctx = zmq_ctx_new();
    if (!srv->zctx) {
        st = baton_error(BATON_ERR_IO, "zmq_ctx_new: %s", zmq_strerror(errno));
        goto fail;
    }
    proto_chan_opts_t opts;
    proto_chan_opts_default((uint32_t)tokenizer_n_vocab(srv->tok), &opts);
    if ((st = proto_chan_open(srv->zctx, PROTO_CHAN_ROUTER, cfg->control_bind, NULL, &opts,
                              &srv->control)) != BATON_OK)
        goto fail;
    /* the SUB socket starts unconnected; worker registrations add endpoints */
    if ((st = proto_chan_open(srv->zctx, PROTO_CHAN_SUB, "inproc://baton-router-none", NULL, &opts,
                              &srv->sub)) != BATON_OK)
        goto fail;
    srv->control_ev = event_new(base, proto_chan_fd(srv->control), EV_READ | EV_PERSIST,
                                on_control_readable, srv);
    srv->sub_ev = event_new(base, proto_chan_fd(srv->sub), EV_READ | EV_PERSIST, on_sub_readable,
                            srv);
    srv->tick_ev = event_new(base, -1, EV_PERSIST, on_tick, srv);
    if (!srv->control_ev || !srv->sub_ev || !srv->tick_ev) {
        st = baton_error(BATON_ERR_NO_MEMORY, "event_new failed");
        goto fail;
    }
    struct timeval tick = {0, 100000};
    event_add(srv->control_ev, NULL);
    event_add(srv->sub_ev, NULL);
    event_add(srv->tick_ev, &tick);
    event_active(srv->control_ev, EV_READ, 0);

    srv->http = evhttp_new(base);
    if (!srv->http) {
        st = baton_error(BATON_ERR_NO_MEMORY, "evhttp_new failed");
        goto fail;
    }
    /* bodies up to the limit reach the handler, which answers an OpenAI 413
     * for those over it; far larger ones are cut by libevent itself */
    evhttp_set_max_body_size(srv->http, (ev_ssize_t)(cfg->max_body_bytes * 2 + 65536));
    evhttp_set_timeout(srv->http, cfg->http_timeout_s);
    evhttp_set_allowed_methods(srv->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                              EVHTTP_REQ_DELETE | EVHTTP_REQ_HEAD);
    evhttp_set_gencb(srv->http, on_http, srv);
    char host[256];
    snprintf(host, sizeof(host), "%s", cfg->http_bind);
    char *colon = strrchr(host, ':');
    if (!colon) {
        st = baton_error(BATON_ERR_INVALID_ARG, "--http-bind %s: expected HOST:PORT", cfg->http_bind);
        goto fail;
    }
    *colon = 0;
    int port = atoi(colon + 1);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(srv->http, host, (uint16_t)port);
    if (!bs) {
        st = baton_error(BATON_ERR_IO, "cannot bind HTTP to %s: %s", cfg->http_bind, strerror(errno));
        goto fail;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET)
            srv->http_port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        else if (ss.ss_family == AF_INET6)
            srv->http_port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    char ctl[256] = "";
    proto_chan_endpoint(srv->control, ctl, sizeof(ctl));
    LOG_INFO(COMP, "serving '%s' (context %u) on http://%s:%d, control %s, policy %s, block size %u",
             srv->model_name, srv->n_ctx, host, srv->http_port, ctl,
             route_policy_name(cfg->route.policy), cfg->block_size);
    *out = srv;
    return BATON_OK;
fail:
    router_server_free(srv);
    return st;
}

int router_server_http_port(const router_server_t *srv) { return srv ? srv->http_port : -1; }

void router_server_free(router_server_t *srv) {
    if (!srv)
        return;
    /* answer and abort everything in flight */
    for (;;) { /* answer every open call (frees it, detaching its choices) */
        call_t *c = NULL;
        for (size_t i = 0; i < srv->requests.n && !c; i++)
            c = srv->requests.items[i]->call;
        if (!c)
            break;
        http_api_error_t err;
        http_api_error_set(&err, 503, "server_error", NULL, "shutting_down",
                           "the router is shutting down");
        call_fail(c, &err);
    }
    while (srv->requests.n > 0) {
        request_t *r = srv->requests.items[0];
        if (!r->done) {
            send_abort(srv, r, "router shutting down");
            r->done = true;
        }
        request_table_remove(&srv->requests, r);
        request_free(r);
    }
    request_table_free(&srv->requests);
    if (srv->http)
        evhttp_free(srv->http);
    if (srv->control_ev)
        event_free(srv->control_ev);
    if (srv->sub_ev)
        event_free(srv->sub_ev);
    if (srv->tick_ev)
        event_free(srv->tick_ev);
    proto_chan_free(srv->control);
    proto_chan_free(srv->sub);
    if (srv->zctx)
        zmq_ctx_term(srv->zctx);
    for (size_t i = 0; i < srv->n_sub_endpoints; i++)
        free(srv->sub_endpoints[i]);
    for (size_t i = 0; i < WORKER_TABLE_MAX; i++)
        free(srv->snapshots[i].links);
    for (size_t i = 0; i < srv->n_api_keys; i++)
        free(srv->api_keys[i]);
    free(srv->api_keys);
    radix_index_free(srv->index);
    observe_ring_free(&srv->records);
    observe_tenants_free(&srv->tenants);
    json_decref(srv->serving_config);
    chat_template_free(srv->chat);
    tokenizer_free(srv->tok);
    free(srv);
}
