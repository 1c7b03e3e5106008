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
            c = json_pack("{s:I, s:{s:s, s:s%}, s:n, s:s}", "index", (json_int_t)i, "message",
                          "role", "assistant", "content", choices[i].text, choices[i].len,
                          "logprobs", "finish_reason", choices[i].finish_reason);
        else
            c = json_pack("{s:I, s:s%, s:n, s:s}", "index", (json_int_t)i, "text",
                          choices[i].text, choices[i].len, "logprobs", "finish_reason",
                          choices[i].finish_reason);
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
                            bool first, const char *finish_reason, bool include_usage) {
    json_t *c;
    json_t *fr = finish_reason ? json_string(finish_reason) : json_null();
    if (kind == HTTP_API_CHAT) {
        json_t *delta = json_object();
        if (delta && first)
            json_object_set_new(delta, "role", json_string("assistant"));
        if (delta && (len > 0 || first || !finish_reason))
            json_object_set_new(delta, "content", json_stringn(text, len));
        c = json_pack("{s:I, s:o, s:n, s:o}", "index", (json_int_t)index, "delta", delta,
                      "logprobs", "finish_reason", fr);
    } else {
        c = json_pack("{s:I, s:s%, s:n, s:o}", "index", (json_int_t)index, "text", text, len,
                      "logprobs", "finish_reason", fr);
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
