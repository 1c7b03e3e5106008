/* router: OpenAI request parsing and validation (see http_api.h). */
#include "router/http_api.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void http_api_error_set(http_api_error_t *err, int status, const char *type, const char *param,
                        const char *code, const char *fmt, ...) {
    va_list ap;
    if (!err)
        return;
    err->status = status;
    err->type = type ? type : "invalid_request_error";
    snprintf(err->param, sizeof(err->param), "%s", param ? param : "");
    err->code = code;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
}

char *http_api_error_json(const http_api_error_t *err) {
    json_t *root = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", err->message, "type",
                             err->type ? err->type : "invalid_request_error", "param",
                             err->param[0] ? json_string(err->param) : json_null(), "code",
                             err->code ? json_string(err->code) : json_null());
    if (!root)
        return NULL;
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

void http_api_params_free(http_api_params_t *p) {
    if (!p)
        return;
    free(p->model);
    for (size_t i = 0; i < p->n_messages; i++) {
        free(p->messages[i].role);
        free(p->messages[i].content);
    }
    free(p->messages);
    for (size_t i = 0; i < p->n_prompts; i++) {
        free(p->prompts[i].text);
        free(p->prompts[i].ids);
    }
    free(p->prompts);
    for (size_t i = 0; i < p->n_stop; i++)
        free(p->stop[i]);
    free(p->logit_bias);
    free(p->user);
    memset(p, 0, sizeof(*p));
}

/* ---- field helpers: each returns false after filling err ---- */

#define BAD(param, ...)                                                                        \
    do {                                                                                       \
        http_api_error_set(err, 400, "invalid_request_error", param, NULL, __VA_ARGS__);      \
        return false;                                                                          \
    } while (0)

static bool get_number(json_t *v, const char *name, double lo, double hi, bool lo_open,
                       double *out, http_api_error_t *err) {
    if (!json_is_number(v))
        BAD(name, "'%s' must be a number", name);
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi || (lo_open && d == lo))
        BAD(name, "'%s' is %g; it must be in %s%g, %g]", name, d, lo_open ? "(" : "[", lo, hi);
    *out = d;
    return true;
}

static bool get_int(json_t *v, const char *name, int64_t lo, int64_t hi, int64_t *out,
                    http_api_error_t *err) {
    if (!json_is_integer(v))
        BAD(name, "'%s' must be an integer", name);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        BAD(name, "'%s' is %lld; it must be in [%lld, %lld]", name, (long long)x, (long long)lo,
            (long long)hi);
    *out = x;
    return true;
}

static bool get_bool(json_t *v, const char *name, bool *out, http_api_error_t *err) {
    if (!json_is_boolean(v))
        BAD(name, "'%s' must be a boolean", name);
    *out = json_is_true(v);
    return true;
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

static bool oom(http_api_error_t *err) {
    http_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
    return false;
}

/* Chat content: a string, or an array of {"type":"text","text":...} parts. */
static bool parse_content(json_t *c, size_t idx, http_api_message_t *m, http_api_error_t *err) {
    char param[64];
    snprintf(param, sizeof(param), "messages[%zu].content", idx);
    if (json_is_string(c)) {
        m->content = dup_n(json_string_value(c), json_string_length(c));
        m->content_len = json_string_length(c);
        return m->content ? true : oom(err);
    }
    if (!json_is_array(c))
        BAD(param, "'%s' must be a string or an array of text parts", param);
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(c, i, part) {
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type))
            BAD(param, "'%s[%zu]' must be an object with a 'type'", param, i);
        if (strcmp(json_string_value(type), "text") != 0)
            BAD(param, "content part type '%s' is not supported (only 'text')",
                json_string_value(type));
        if (!json_is_string(text))
            BAD(param, "'%s[%zu].text' must be a string", param, i);
        total += json_string_length(text);
    }
    m->content = malloc(total + 1);
    if (!m->content)
        return oom(err);
    size_t off = 0;
    json_array_foreach(c, i, part) {
        json_t *text = json_object_get(part, "text");
        memcpy(m->content + off, json_string_value(text), json_string_length(text));
        off += json_string_length(text);
    }
    m->content[off] = 0;
    m->content_len = off;
    return true;
}

static bool parse_messages(json_t *v, http_api_params_t *p, http_api_error_t *err) {
    if (!json_is_array(v))
        BAD("messages", "'messages' must be an array");
    size_t n = json_array_size(v);
    if (n == 0)
        BAD("messages", "'messages' must contain at least one message");
    p->messages = calloc(n, sizeof(*p->messages));
    if (!p->messages)
        return oom(err);
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(v, i);
        char param[64];
        snprintf(param, sizeof(param), "messages[%zu]", i);
        if (!json_is_object(m))
            BAD(param, "'%s' must be an object", param);
        const char *key;
        json_t *val;
        json_object_foreach(m, key, val) {
            if (strcmp(key, "role") && strcmp(key, "content") && strcmp(key, "name"))
                BAD(param, "'%s.%s' is not supported", param, key);
        }
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role))
            BAD(param, "'%s.role' must be a string", param);
        const char *r = json_string_value(role);
        if (!strcmp(r, "developer"))
            r = "system"; /* OpenAI's newer name for the system role */
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant"))
            BAD(param, "role '%s' is not supported (system, user, assistant)", r);
        p->messages[i].role = strdup(r);
        p->n_messages = i + 1;
        if (!p->messages[i].role)
            return oom(err);
        json_t *content = json_object_get(m, "content");
        if (!content || json_is_null(content))
            BAD(param, "'%s.content' is required", param);
        if (!parse_content(content, i, &p->messages[i], err))
            return false;
    }
    return true;
}

static bool parse_id_list(json_t *v, const char *param, http_api_prompt_t *pr,
                          http_api_error_t *err) {
    size_t n = json_array_size(v);
    if (n == 0)
        BAD(param, "'%s' must not be empty", param);
    pr->ids = malloc(n * sizeof(int32_t));
    if (!pr->ids)
        return oom(err);
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(v, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
            BAD(param, "'%s' token ids must be non-negative integers", param);
        pr->ids[i] = (int32_t)json_integer_value(t);
    }
    pr->n_ids = n;
    return true;
}

static bool parse_prompt(json_t *v, http_api_params_t *p, http_api_error_t *err) {
    if (json_is_string(v)) {
        if (json_string_length(v) == 0)
            BAD("prompt", "'prompt' must not be empty");
        p->prompts = calloc(1, sizeof(*p->prompts));
        if (!p->prompts)
            return oom(err);
        p->n_prompts = 1;
        p->prompts[0].text = dup_n(json_string_value(v), json_string_length(v));
        p->prompts[0].text_len = json_string_length(v);
        return p->prompts[0].text ? true : oom(err);
    }
    if (!json_is_array(v))
        BAD("prompt", "'prompt' must be a string, an array of strings or token ids");
    size_t n = json_array_size(v);
    if (n == 0)
        BAD("prompt", "'prompt' must not be empty");
    json_t *first = json_array_get(v, 0);
    if (json_is_integer(first)) { /* one prompt of token ids */
        p->prompts = calloc(1, sizeof(*p->prompts));
        if (!p->prompts)
            return oom(err);
        p->n_prompts = 1;
        return parse_id_list(v, "prompt", &p->prompts[0], err);
    }
    if (n > HTTP_API_MAX_PROMPTS)
        BAD("prompt", "at most %d prompts per request", HTTP_API_MAX_PROMPTS);
    p->prompts = calloc(n, sizeof(*p->prompts));
    if (!p->prompts)
        return oom(err);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(v, i);
        p->n_prompts = i + 1;
        if (json_is_string(e)) {
            if (json_string_length(e) == 0)
                BAD("prompt", "'prompt[%zu]' must not be empty", i);
            p->prompts[i].text = dup_n(json_string_value(e), json_string_length(e));
            p->prompts[i].text_len = json_string_length(e);
            if (!p->prompts[i].text)
                return oom(err);
        } else if (json_is_array(e)) {
            if (!parse_id_list(e, "prompt", &p->prompts[i], err))
                return false;
        } else {
            BAD("prompt", "'prompt[%zu]' must be a string or an array of token ids", i);
        }
    }
    return true;
}

static bool parse_stop(json_t *v, http_api_params_t *p, http_api_error_t *err) {
    json_t *one[1] = {v};
    json_t **items = one;
    size_t n = 1;
    json_t *arr[HTTP_API_MAX_STOP];
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > HTTP_API_MAX_STOP)
            BAD("stop", "'stop' has %zu sequences; at most %d are allowed", n, HTTP_API_MAX_STOP);
        for (size_t i = 0; i < n; i++)
            arr[i] = json_array_get(v, i);
        items = arr;
    }
    for (size_t i = 0; i < n; i++) {
        if (!json_is_string(items[i]))
            BAD("stop", "'stop' must be a string or an array of strings");
        if (json_string_length(items[i]) == 0)
            BAD("stop", "'stop' sequences must not be empty");
        p->stop[i] = dup_n(json_string_value(items[i]), json_string_length(items[i]));
        p->stop_len[i] = json_string_length(items[i]);
        p->n_stop = i + 1;
        if (!p->stop[i])
            return oom(err);
    }
    return true;
}

/* OpenAI logit_bias: an object mapping token ids, written as decimal
 * strings, to numbers in [-100, 100]; at most 300 entries. The vocabulary
 * bound is checked by the server, which holds the tokenizer. */
static bool parse_logit_bias(json_t *v, http_api_params_t *p, http_api_error_t *err) {
    if (!json_is_object(v))
        BAD("logit_bias", "'logit_bias' must be an object mapping token ids to biases");
    size_t n = json_object_size(v);
    if (n > HTTP_API_MAX_LOGIT_BIAS)
        BAD("logit_bias", "'logit_bias' has %zu entries; at most %d are allowed", n,
            HTTP_API_MAX_LOGIT_BIAS);
    if (n == 0)
        return true;
    p->logit_bias = calloc(n, sizeof(*p->logit_bias));
    if (!p->logit_bias)
        return oom(err);
    const char *key;
    json_t *b;
    json_object_foreach(v, key, b) {
        size_t len = strlen(key);
        bool digits = len > 0 && len <= 10 && (len == 1 || key[0] != '0'); /* one spelling per id */
        for (size_t i = 0; digits && i < len; i++)
            digits = key[i] >= '0' && key[i] <= '9';
        long long id = digits ? strtoll(key, NULL, 10) : -1;
        if (!digits || id > INT32_MAX)
            BAD("logit_bias", "'logit_bias' key '%.40s' is not a token id (a non-negative integer)",
                key);
        if (!json_is_number(b))
            BAD("logit_bias", "'logit_bias' value for token %lld must be a number", id);
        double d = json_number_value(b);
        if (!isfinite(d) || d < -HTTP_API_MAX_LOGIT_BIAS_ABS || d > HTTP_API_MAX_LOGIT_BIAS_ABS)
            BAD("logit_bias", "'logit_bias' value %g for token %lld is outside [-100, 100]", d, id);
        p->logit_bias[p->n_logit_bias].token = (int32_t)id;
        p->logit_bias[p->n_logit_bias].bias = (float)d;
        p->n_logit_bias++;
    }
    return true;
}

/* Keys refused with a named 400 because baton does not implement them. */
static const char *const unsupported_keys[] = {
    "tools", "tool_choice", "functions", "function_call", "response_format", "suffix",
    "best_of", "parallel_tool_calls", "audio", "modalities", "prediction", "service_tier",
    "reasoning_effort", "web_search_options", "metadata", "store", NULL};

static bool parse_fields(json_t *root, http_api_params_t *p, http_api_error_t *err) {
    http_api_kind_t kind = p->kind;
    const char *key;
    json_t *v;
    double d;
    int64_t x;
    json_object_foreach(root, key, v) {
        if (json_is_null(v))
            continue; /* null is "absent" everywhere in the OpenAI API */
        if (!strcmp(key, "model")) {
            if (!json_is_string(v))
                BAD("model", "'model' must be a string");
            p->model = dup_n(json_string_value(v), json_string_length(v));
            if (!p->model)
                return oom(err);
        } else if (!strcmp(key, "messages") && kind == HTTP_API_CHAT) {
            if (!parse_messages(v, p, err))
                return false;
        } else if (!strcmp(key, "prompt") && kind == HTTP_API_COMPLETIONS) {
            if (!parse_prompt(v, p, err))
                return false;
        } else if (!strcmp(key, "max_tokens") ||
                   (!strcmp(key, "max_completion_tokens") && kind == HTTP_API_CHAT)) {
            if (!get_int(v, key, 1, INT32_MAX, &x, err))
                return false;
            p->max_tokens = x;
        } else if (!strcmp(key, "temperature")) {
            if (!get_number(v, key, 0, 2, false, &d, err))
                return false;
            p->temperature = (float)d;
        } else if (!strcmp(key, "top_p")) {
            if (!get_number(v, key, 0, 1, true, &d, err))
                return false;
            p->top_p = (float)d;
        } else if (!strcmp(key, "top_k")) {
            if (!get_int(v, key, -1, 1000000, &x, err))
                return false;
            p->top_k = (int32_t)x;
        } else if (!strcmp(key, "min_p")) {
            if (!get_number(v, key, 0, 1, false, &d, err))
                return false;
            p->min_p = (float)d;
        } else if (!strcmp(key, "presence_penalty")) {
            if (!get_number(v, key, -2, 2, false, &d, err))
                return false;
            p->presence_penalty = (float)d;
        } else if (!strcmp(key, "frequency_penalty")) {
            if (!get_number(v, key, -2, 2, false, &d, err))
                return false;
            p->frequency_penalty = (float)d;
        } else if (!strcmp(key, "repetition_penalty")) {
            if (!get_number(v, key, 0, 10, true, &d, err))
                return false;
            p->repetition_penalty = (float)d;
        } else if (!strcmp(key, "seed")) {
            if (!json_is_integer(v))
                BAD("seed", "'seed' must be an integer");
            p->has_seed = true;
            p->seed = (uint64_t)json_integer_value(v);
        } else if (!strcmp(key, "stop")) {
            if (!parse_stop(v, p, err))
                return false;
        } else if (!strcmp(key, "n")) {
            if (!get_int(v, key, 1, HTTP_API_MAX_N, &x, err))
                return false;
            p->n = (uint32_t)x;
        } else if (!strcmp(key, "logprobs")) {
            if (kind == HTTP_API_CHAT) {
                if (!get_bool(v, key, &p->logprobs, err))
                    return false;
            } else { /* completions: an integer count of alternatives, 0..5 */
                if (!get_int(v, key, 0, 5, &x, err))
                    return false;
                p->logprobs = true;
                p->top_logprobs = (uint32_t)x;
            }
        } else if (!strcmp(key, "top_logprobs") && kind == HTTP_API_CHAT) {
            if (!get_int(v, key, 0, HTTP_API_MAX_TOP_LOGPROBS, &x, err))
                return false;
            p->top_logprobs = (uint32_t)x;
        } else if (!strcmp(key, "echo") && kind == HTTP_API_COMPLETIONS) {
            if (!get_bool(v, key, &p->echo, err))
                return false;
        } else if (!strcmp(key, "logit_bias")) {
            if (!parse_logit_bias(v, p, err))
                return false;
        } else if (!strcmp(key, "ignore_eos")) {
            if (!get_bool(v, key, &p->ignore_eos, err))
                return false;
        } else if (!strcmp(key, "user")) {
            if (!json_is_string(v))
                BAD("user", "'user' must be a string");
            p->user = dup_n(json_string_value(v), json_string_length(v));
            if (!p->user)
                return oom(err);
        } else if (!strcmp(key, "stream")) {
            if (!get_bool(v, key, &p->stream, err))
                return false;
        } else if (!strcmp(key, "stream_options")) {
            if (!json_is_object(v))
                BAD("stream_options", "'stream_options' must be an object");
            const char *k2;
            json_t *v2;
            json_object_foreach(v, k2, v2) {
                if (strcmp(k2, "include_usage") != 0)
                    BAD("stream_options", "'stream_options.%s' is not supported", k2);
                if (!json_is_null(v2) && !get_bool(v2, "stream_options.include_usage",
                                                   &p->include_usage, err))
                    return false;
            }
        } else {
            bool known_unsupported = false;
            for (size_t i = 0; unsupported_keys[i]; i++)
                known_unsupported |= !strcmp(key, unsupported_keys[i]);
            http_api_error_set(err, 400, "invalid_request_error", key, "unsupported_parameter",
                               "'%s' is %s baton's %s endpoint", key,
                               known_unsupported ? "not supported by" : "not a parameter of",
                               kind == HTTP_API_CHAT ? "/v1/chat/completions"
                                                     : "/v1/completions");
            return false;
        }
    }
    if (!p->model)
        BAD("model", "'model' is required");
    if (kind == HTTP_API_CHAT && p->n_messages == 0)
        BAD("messages", "'messages' is required");
    if (kind == HTTP_API_COMPLETIONS && p->n_prompts == 0)
        BAD("prompt", "'prompt' is required");
    if (p->top_logprobs > 0 && kind == HTTP_API_CHAT && !p->logprobs)
        BAD("top_logprobs", "'top_logprobs' requires 'logprobs': true");
    if (p->include_usage && !p->stream)
        BAD("stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (p->n * p->n_prompts > HTTP_API_MAX_N * HTTP_API_MAX_PROMPTS)
        BAD("n", "too many choices");
    return true;
}

baton_status_t http_api_parse(const char *body, size_t len, http_api_kind_t kind,
                              http_api_params_t *out, http_api_error_t *err) {
    if (!body || !out || !err)
        return baton_error(BATON_ERR_INVALID_ARG, "http_api_parse: NULL argument");
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        http_api_error_set(err, 400, "invalid_request_error", NULL, "invalid_json",
                           "malformed JSON body: %s (line %d, column %d)", jerr.text, jerr.line,
                           jerr.column);
        return BATON_ERR_FORMAT;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        http_api_error_set(err, 400, "invalid_request_error", NULL, "invalid_json",
                           "the request body must be a JSON object");
        return BATON_ERR_FORMAT;
    }
    http_api_params_t p;
    memset(&p, 0, sizeof(p));
    p.kind = kind;
    p.max_tokens = -1;
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    p.n = 1;
    bool ok = parse_fields(root, &p, err);
    json_decref(root);
    if (!ok) {
        http_api_params_free(&p);
        if (err->status == 500)
            return BATON_ERR_NO_MEMORY;
        return !strcmp(err->code ? err->code : "", "unsupported_parameter")
                   ? BATON_ERR_UNSUPPORTED
                   : BATON_ERR_OUT_OF_RANGE;
    }
    *out = p;
    return BATON_OK;
}
