/* router: OpenAI response bodies and SSE chunks (jansson).
 *
 * Shapes follow the OpenAI API reference: chat.completion /
 * chat.completion.chunk (choices[].message|delta, finish_reason, logprobs)
 * and text_completion (choices[].text), `usage` {prompt_tokens,
 * completion_tokens, total_tokens, prompt_tokens_details.cached_tokens},
 * ids "chatcmpl-<hex>" / "cmpl-<hex>", `created` in Unix seconds. SSE
 * events are "data: <json>\n\n", the stream ends with "data: [DONE]\n\n". */
#ifndef BATON_ROUTER_OPENAI_FORMAT_H
#define BATON_ROUTER_OPENAI_FORMAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/tokenizer.h"
#include "router/http_api.h"

typedef struct openai_format_usage {
    uint32_t prompt_tokens;
    uint32_t completion_tokens;
    uint32_t cached_tokens;
} openai_format_usage_t;

/* One finished choice of a non-streamed response. */
typedef struct openai_format_choice {
    const char *text;          /* valid UTF-8 */
    size_t len;
    const char *finish_reason; /* "stop", "length", ... */
    json_t *logprobs;          /* borrowed; NULL = null (see openai_format_logprobs_new) */
} openai_format_choice_t;

/* An empty logprobs object of the endpoint's shape: chat {"content": []},
 * completions {"tokens": [], "token_logprobs": [], "top_logprobs": [],
 * "text_offset": []}. NULL when out of memory. */
json_t *openai_format_logprobs_new(http_api_kind_t kind);

/* Appends one generated token to a logprobs object: its text (the token's
 * bytes; for chat also "bytes" as integers, since a token may be part of
 * a character: the "token" string then has U+FFFD for the incomplete
 * bytes), its logprob and top alternatives (top[0..n_top), ids with
 * logprobs). text_offset (completions) is the byte offset of the token's
 * text in the choice's output. Errors: BATON_ERR_NO_MEMORY,
 * BATON_ERR_OUT_OF_RANGE (bad token id). */
baton_status_t openai_format_logprobs_add(json_t *lp, http_api_kind_t kind,
                                          const tokenizer_t *tok, int32_t id, float logprob,
                                          const int32_t *top_ids, const float *top_lps,
                                          size_t n_top, size_t text_offset);

/* Writes the response id: "chatcmpl-" (chat) or "cmpl-" then 32 hex digits of
 * the 16 id bytes, NUL-terminated, into out (48 bytes). */
void openai_format_id(http_api_kind_t kind, const uint8_t id_bytes[16], char out[48]);

/* The usage object. NULL when out of memory (as for every builder). */
json_t *openai_format_usage(const openai_format_usage_t *u);

/* The whole non-streamed response (new reference). */
json_t *openai_format_response(http_api_kind_t kind, const char *id, int64_t created,
                               const char *model, const openai_format_choice_t *choices,
                               size_t n_choices, const openai_format_usage_t *usage);

/* One streamed chunk for choice `index`: delta text (chat: `delta.content`,
 * plus `delta.role` "assistant" when first is true; completions: `text`),
 * finish_reason NULL for null. When include_usage, the chunk carries
 * "usage": null as OpenAI sends on every chunk but the last. `logprobs`
 * (the tokens of this chunk, openai_format_logprobs_new shape) is borrowed;
 * NULL = null. */
json_t *openai_format_chunk(http_api_kind_t kind, const char *id, int64_t created,
                            const char *model, uint32_t index, const char *text, size_t len,
                            bool first, const char *finish_reason, bool include_usage,
                            json_t *logprobs);

/* The final usage chunk of stream_options.include_usage: "choices": []. */
json_t *openai_format_usage_chunk(http_api_kind_t kind, const char *id, int64_t created,
                                  const char *model, const openai_format_usage_t *usage);

/* "data: <compact json>\n\n" as a malloc'd string (free()), *len_out bytes;
 * NULL when out of memory. Does not take the reference. */
char *openai_format_sse(const json_t *obj, size_t *len_out);

#endif
