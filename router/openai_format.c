/* router: OpenAI response shapes (see openai_format.h). */
#include "router/openai_format.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void openai_format_id(http_api_kind_t kind, const uint8_t id_bytes[16], char out[48]) {
    int n = snprintf(out, 48, "%s", kind == HTTP_API_CHAT ? "chatcmpl-" : "cmpl-");
    for (int i = 0; i < 16; i++)
        n += snprintf(out + n, 48 - (size_t)n, "%02x", id_bytes[i]);
}

json_t *openai_format_usage(const openai_format_usage_t *u) {
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)u->prompt_tokens,
                     "completion_tokens", (json_int_t)u->completion_tokens, "total_tokens",
                     (json_int_t)u->prompt_tokens + (json_int_t)u->completion_tokens,
                     "prompt_tokens_details", "cached_tokens", (json_int_t)u->cached_tokens);
}

static const char *object_name(http_api_kind_t kind, bool chunk) {
    if (kind == HTTP_API_CHAT)
        return chunk ? "chat.completion.chunk" : "chat.completion";
    return "text_completion";
}

json_t *openai_format_response(http_api_kind_t kind, const char *id, int64_t created,
                               const char *model, const openai_format_choice_t *choices,
                               size_t n_choices, const openai_format_usage_t *usage) {
    json_t *arr = json_array();
    if (!arr)
        return NULL;
    for (size_t i = 0; i < n_choices; i++) {
        json_t *c;
        if (kind == HTTP_API_CHAT)
            c = json_pack("{s:I, s:{s:s, s:s%}, s:O?, s:s}", "index", (json_int_t)i, "message",
                          "role", "assistant", "content", choices[i].text, choices[i].len,
                          "logprobs", choices[i].logprobs, "finish_reason",
                          choices[i].finish_reason);
        else
            c = json_pack("{s:I, s:s%, s:O?, s:s}", "index", (json_int_t)i, "text",
                          choices[i].text, choices[i].len, "logprobs", choices[i].logprobs,
                          "finish_reason", choices[i].finish_reason);
        if (!c || json_array_append_new(arr, c) != 0) {
            json_decref(arr);
            return NULL;
        }
    }
    json_t *u = openai_format_usage(usage);
    if (!u) {
        json_decref(arr);
        return NULL;
    }
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o, s:n}", "id", id, "object",
                     object_name(kind, false), "created", (json_int_t)created, "model", model,
                     "choices", arr, "usage", u, "system_fingerprint");
}

json_t *openai_format_chunk(http_api_kind_t kind, const char *id, int64_t created,
                            const char *model, uint32_t index, const char *text, size_t len,
                            bool first, const char *finish_reason, bool include_usage,
                            json_t *logprobs) {
    json_t *c;
    json_t *fr = finish_reason ? json_string(finish_reason) : json_null();
    if (kind == HTTP_API_CHAT) {
        json_t *delta = json_object();
        if (delta && first)
            json_object_set_new(delta, "role", json_string("assistant"));
        if (delta && (len > 0 || first || !finish_reason))
            json_object_set_new(delta, "content", json_stringn(text, len));
        c = json_pack("{s:I, s:o, s:O?, s:o}", "index", (json_int_t)index, "delta", delta,
                      "logprobs", logprobs, "finish_reason", fr);
    } else {
        c = json_pack("{s:I, s:s%, s:O?, s:o}", "index", (json_int_t)index, "text", text, len,
                      "logprobs", logprobs, "finish_reason", fr);
    }
    if (!c)
        return NULL;
    json_t *obj = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:n}", "id", id, "object",
                            object_name(kind, true), "created", (json_int_t)created, "model",
                            model, "choices", c, "system_fingerprint");
    if (obj && include_usage)
        json_object_set_new(obj, "usage", json_null());
    return obj;
}

json_t *openai_format_usage_chunk(http_api_kind_t kind, const char *id, int64_t created,
                                  const char *model, const openai_format_usage_t *usage) {
    json_t *u = openai_format_usage(usage);
    if (!u)
        return NULL;
    return json_pack("{s:s, s:s, s:I, s:s, s:[], s:o, s:n}", "id", id, "object",
                     object_name(kind, true), "created", (json_int_t)created, "model", model,
                     "choices", "usage", u, "system_fingerprint");
}

char *openai_format_sse(const json_t *obj, size_t *len_out) {
    char *body = json_dumps(obj, JSON_COMPACT);
    if (!body)
        return NULL;
    size_t n = strlen(body);
    char *out = malloc(n + 9);
    if (out) {
        memcpy(out, "data: ", 6);
        memcpy(out + 6, body, n);
        memcpy(out + 6 + n, "\n\n", 3);
        *len_out = n + 8;
    }
    free(body);
    return out;
}

json_t *openai_format_logprobs_new(http_api_kind_t kind) {
    if (kind == HTTP_API_CHAT)
        return json_pack("{s:[]}", "content");
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs",
                     "text_offset");
}

/* The token's bytes as a JSON string (incomplete/invalid UTF-8 parts become
 * U+FFFD) and, when bytes_out is not NULL, as an array of byte values. */
static baton_status_t token_json(const tokenizer_t *tok, int32_t id, json_t **str_out,
                                 json_t **bytes_out) {
    char piece[256];
    size_t n = 0;
    baton_status_t st = tokenizer_token_to_piece(tok, id, TOKENIZER_DECODE_SPECIAL, piece,
                                                 sizeof(piece), &n);
    if (st != BATON_OK)
        return st;
    char clean[4 * sizeof(piece)];
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = tokenizer_utf8_valid_prefix(piece + i, n - i);
        memcpy(clean + o, piece + i, k);
        o += k;
        i += k;
        if (i < n) {
            memcpy(clean + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    *str_out = json_stringn(clean, o);
    if (bytes_out) {
        *bytes_out = json_array();
        for (size_t i = 0; *bytes_out && i < n; i++)
            json_array_append_new(*bytes_out, json_integer((uint8_t)piece[i]));
    }
    if (!*str_out || (bytes_out && !*bytes_out)) {
        json_decref(*str_out);
        if (bytes_out)
            json_decref(*bytes_out);
        return baton_error(BATON_ERR_NO_MEMORY, "logprobs: out of memory");
    }
    return BATON_OK;
}

baton_status_t openai_format_logprobs_add(json_t *lp, http_api_kind_t kind,
                                          const tokenizer_t *tok, int32_t id, float logprob,
                                          const int32_t *top_ids, const float *top_lps,
                                          size_t n_top, size_t text_offset) {
    json_t *s, *b;
    baton_status_t st = token_json(tok, id, &s, kind == HTTP_API_CHAT ? &b : NULL);
    if (st != BATON_OK)
        return st;
    if (kind == HTTP_API_CHAT) {
        json_t *tops = json_array();
        for (size_t i = 0; tops && i < n_top; i++) {
            json_t *ts, *tb;
            if (token_json(tok, top_ids[i], &ts, &tb) != BATON_OK)
                continue;
            json_array_append_new(tops, json_pack("{s:o, s:f, s:o}", "token", ts, "logprob",
                                                  (double)top_lps[i], "bytes", tb));
        }
        json_t *e = json_pack("{s:o, s:f, s:o, s:o}", "token", s, "logprob", (double)logprob,
                              "bytes", b, "top_logprobs", tops ? tops : json_array());
        if (!e || json_array_append_new(json_object_get(lp, "content"), e) != 0)
            return baton_error(BATON_ERR_NO_MEMORY, "logprobs: out of memory");
        return BATON_OK;
    }
    json_t *tops = json_object();
    for (size_t i = 0; tops && i < n_top; i++) {
        json_t *ts;
        if (token_json(tok, top_ids[i], &ts, NULL) != BATON_OK)
            continue;
        json_object_set_new(tops, json_string_value(ts), json_real(top_lps[i]));
        json_decref(ts);
    }
    if (json_array_append_new(json_object_get(lp, "tokens"), s) != 0 ||
        json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(logprob)) != 0 ||
        json_array_append_new(json_object_get(lp, "top_logprobs"),
                              n_top ? tops : (json_decref(tops), json_null())) != 0 ||
        json_array_append_new(json_object_get(lp, "text_offset"),
                              json_integer((json_int_t)text_offset)) != 0)
        return baton_error(BATON_ERR_NO_MEMORY, "logprobs: out of memory");
    return BATON_OK;
}
