/* router: request state machine and trace (see request.h). */
#include "router/request.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *request_state_name(request_state_t st) {
    switch (st) {
    case REQUEST_QUEUED: return "queued";
    case REQUEST_ROUTED: return "routed";
    case REQUEST_PREFILL_DONE: return "prefill_done";
    case REQUEST_DECODING: return "decoding";
    case REQUEST_FINISHED: return "finished";
    case REQUEST_FAILED: return "failed";
    }
    return "unknown";
}

void request_set_state(request_t *r, request_state_t st, uint64_t now_ms,
                       const request_deadlines_t *d) {
    r->state = st;
    switch (st) {
    case REQUEST_QUEUED: r->state_deadline_ms = now_ms + d->routed_ms; break;
    case REQUEST_ROUTED: r->state_deadline_ms = now_ms + d->routed_ms; break;
    case REQUEST_PREFILL_DONE: r->state_deadline_ms = now_ms + d->prefill_done_ms; break;
    case REQUEST_DECODING: r->state_deadline_ms = now_ms + d->token_ms; break;
    case REQUEST_FINISHED:
    case REQUEST_FAILED: r->state_deadline_ms = 0; break;
    }
}

baton_status_t request_append_text(request_t *r, const char *text, size_t len) {
    if (r->text_len + len + 1 > r->text_cap) {
        size_t c = r->text_cap ? r->text_cap : 256;
        while (c < r->text_len + len + 1)
            c *= 2;
        char *b = realloc(r->text, c);
        if (!b)
            return baton_error(BATON_ERR_NO_MEMORY, "request: out of memory for text");
        r->text = b;
        r->text_cap = c;
    }
    memcpy(r->text + r->text_len, text, len);
    r->text_len += len;
    r->text[r->text_len] = 0;
    return BATON_OK;
}

void request_free(request_t *r) {
    if (!r)
        return;
    free(r->prompt);
    free(r->hashes);
    stream_free(r->stream);
    json_decref(r->logprobs);
    json_decref(r->logprobs_pending);
    free(r->text);
    free(r->final_text);
    free(r);
}

static double ms_between(uint64_t a_us, uint64_t b_us) {
    return (a_us && b_us && b_us >= a_us) ? (double)(b_us - a_us) / 1000.0 : -1.0;
}

void request_trace_format(const request_t *r, char *buf, size_t buf_len) {
    const request_trace_t *t = &r->trace;
    snprintf(buf, buf_len,
             "request id=%s choice=%u state=%s finish=%s prefill=%s decode=%s prompt_tokens=%zu "
             "completion_tokens=%u cached_tokens=%u predicted_hit_blocks=%u prompt_blocks=%zu "
             "routed_ms=%.3f prefill_done_ms=%.3f ttft_ms=%.3f e2e_ms=%.3f queue_ms=%.3f "
             "prefill_ms=%.3f transfer_ms=%.3f transfer_bytes=%llu decode_ms=%.3f error=\"%s\"",
             r->id_hex, r->index, request_state_name(r->state),
             r->finish_reason ? r->finish_reason : "none", r->prefill_id[0] ? r->prefill_id : "-",
             r->decode_id[0] ? r->decode_id : "-", r->n_prompt, r->completion_tokens,
             r->cached_tokens, r->predicted_hit_blocks, r->n_hashes,
             ms_between(t->arrival_us, t->routed_us), ms_between(t->arrival_us, t->prefill_done_us),
             ms_between(t->arrival_us, t->first_token_us), ms_between(t->arrival_us, t->finished_us),
             (double)t->queue_us / 1000.0, (double)t->prefill_us / 1000.0,
             (double)t->transfer_us / 1000.0, (unsigned long long)t->transfer_bytes,
             (double)t->decode_us / 1000.0, r->error);
}

baton_status_t request_table_add(request_table_t *t, request_t *r) {
    if (t->n == t->cap) {
        size_t c = t->cap ? t->cap * 2 : 64;
        request_t **b = realloc(t->items, c * sizeof(*b));
        if (!b)
            return baton_error(BATON_ERR_NO_MEMORY, "request table: out of memory");
        t->items = b;
        t->cap = c;
    }
    t->items[t->n++] = r;
    return BATON_OK;
}

request_t *request_table_find(const request_table_t *t, const proto_request_id_t *id) {
    for (size_t i = 0; i < t->n; i++)
        if (memcmp(t->items[i]->id.bytes, id->bytes, PROTO_ID_BYTES) == 0)
            return t->items[i];
    return NULL;
}

bool request_table_remove(request_table_t *t, const request_t *r) {
    for (size_t i = 0; i < t->n; i++)
        if (t->items[i] == r) {
            t->items[i] = t->items[--t->n];
            return true;
        }
    return false;
}

void request_table_free(request_table_t *t) {
    if (!t)
        return;
    free(t->items);
    memset(t, 0, sizeof(*t));
}
