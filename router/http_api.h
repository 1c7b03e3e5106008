/* router: OpenAI request parsing and validation, OpenAI-style error bodies.
 *
 * Parses the JSON body of POST /v1/chat/completions and /v1/completions
 * (jansson) into http_api_params_t, checking every field's type and range
 * as the OpenAI API reference defines them
 * (https://platform.openai.com/docs/api-reference/chat/create and
 * .../completions/create) plus the vLLM extensions top_k, min_p,
 * repetition_penalty and ignore_eos. A key baton does not know or does not
 * support is refused with a 400 that names it; nothing is silently ignored.
 * Validation that needs the tokenizer or the model (context length, model
 * name) is done by the server after parsing. */
#ifndef BATON_ROUTER_HTTP_API_H
#define BATON_ROUTER_HTTP_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define HTTP_API_MAX_STOP 4       /* OpenAI: up to 4 stop sequences */
#define HTTP_API_MAX_N 16         /* choices per request */
#define HTTP_API_MAX_PROMPTS 64   /* prompts in one completions batch */
#define HTTP_API_MAX_TOP_LOGPROBS 20
#define HTTP_API_MAX_LOGIT_BIAS 300 /* OpenAI: up to 300 logit_bias entries */
#define HTTP_API_MAX_LOGIT_BIAS_ABS 100.0 /* OpenAI: biases in [-100, 100] */

typedef enum http_api_kind {
    HTTP_API_CHAT = 0,        /* /v1/chat/completions */
    HTTP_API_COMPLETIONS = 1, /* /v1/completions */
} http_api_kind_t;

/* An OpenAI-style error: HTTP status and the four fields of "error". */
typedef struct http_api_error {
    int status;          /* 400, 404, 413, 500, 503, 504 */
    char message[512];
    const char *type;    /* "invalid_request_error", "not_found_error", ... */
    char param[64];      /* "" = null */
    const char *code;    /* NULL = null */
} http_api_error_t;

/* One chat message (role and content text, content parts joined). */
typedef struct http_api_message {
    char *role;          /* "system", "user" or "assistant" */
    char *content;       /* UTF-8, NUL-terminated, content_len bytes */
    size_t content_len;
} http_api_message_t;

/* One OpenAI logit_bias entry: the token's logit gets `bias` added. */
typedef struct http_api_logit_bias {
    int32_t token;       /* >= 0; checked against the vocabulary by the server */
    float bias;          /* -100..100 */
} http_api_logit_bias_t;

/* One completions prompt: text or token ids. */
typedef struct http_api_prompt {
    char *text;          /* NULL when the prompt is token ids */
    size_t text_len;
    int32_t *ids;        /* token ids when text is NULL */
    size_t n_ids;
} http_api_prompt_t;

typedef struct http_api_params {
    http_api_kind_t kind;
    char *model;                          /* required */
    http_api_message_t *messages;         /* chat: 1.. messages */
    size_t n_messages;
    http_api_prompt_t *prompts;           /* completions: 1..HTTP_API_MAX_PROMPTS */
    size_t n_prompts;
    int64_t max_tokens;                   /* -1: absent/null (up to the context) */
    float temperature;                    /* 0..2, default 1 */
    float top_p;                          /* (0, 1], default 1 */
    int32_t top_k;                        /* 0 (off) or >= 1; -1 means off too */
    float min_p;                          /* 0..1 */
    float presence_penalty;               /* -2..2 */
    float frequency_penalty;              /* -2..2 */
    float repetition_penalty;             /* (0, 10], default 1 */
    bool has_seed;
    uint64_t seed;
    char *stop[HTTP_API_MAX_STOP];        /* each non-empty UTF-8 */
    size_t stop_len[HTTP_API_MAX_STOP];
    size_t n_stop;
    uint32_t n;                           /* choices, 1..HTTP_API_MAX_N */
    bool logprobs;                        /* return the sampled tokens' logprobs */
    uint32_t top_logprobs;                /* 0..20 alternatives per token */
    bool echo;                            /* completions: prepend the prompt */
    bool ignore_eos;
    http_api_logit_bias_t *logit_bias;    /* "logit_bias": {"<token id>": bias, ...},
                                             0..HTTP_API_MAX_LOGIT_BIAS entries */
    size_t n_logit_bias;
    char *user;                           /* NULL when absent */
    bool stream;
    bool include_usage;                   /* stream_options.include_usage */
} http_api_params_t;

/* Parses `len` bytes of `body` for endpoint `kind`. On success fills *out
 * (release with http_api_params_free) and returns BATON_OK. On a client
 * error returns BATON_ERR_FORMAT (malformed JSON, wrong type),
 * BATON_ERR_OUT_OF_RANGE (value out of range, empty prompt/messages) or
 * BATON_ERR_UNSUPPORTED (a key baton does not support) and fills *err with
 * the HTTP status (400), message and param; *out is then untouched.
 * BATON_ERR_NO_MEMORY gives a 500 in *err. */
baton_status_t http_api_parse(const char *body, size_t len, http_api_kind_t kind,
                              http_api_params_t *out, http_api_error_t *err);

/* Frees what *p owns and zeroes it. NULL-safe. */
void http_api_params_free(http_api_params_t *p);

/* Fills *err: status, type (e.g. "invalid_request_error"), param (NULL =
 * none), code (NULL = none) and a printf-style message. */
void http_api_error_set(http_api_error_t *err, int status, const char *type, const char *param,
                        const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* The OpenAI error body {"error":{"message","type","param","code"}} as a
 * malloc'd NUL-terminated JSON string (free()), or NULL when out of memory. */
char *http_api_error_json(const http_api_error_t *err);

#endif
