/* Chat template families: detection from the Jinja text and rendering into
 * token ids with special tokens only from the scaffolding. The formats are
 * those of the templates shipped with the models (and llama.cpp
 * src/llama-chat.cpp for the same families). */
#define _GNU_SOURCE
#include "common/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define CT_LOG "chat_template"

struct chat_template {
    const tokenizer_t *tok;
    chat_template_family_t family;
    bool fallback;
    char *default_system; /* ChatML only: inserted when messages[0] is not system; may be NULL */
    size_t default_system_len;
};

static bool has(const char *text, size_t len, const char *needle) {
    return text && memmem(text, len, needle, strlen(needle)) != NULL;
}

baton_status_t chat_template_detect(const char *text, size_t len, chat_template_family_t *family,
                                    bool *known) {
    if (!family || !known) return baton_error(BATON_ERR_INVALID_ARG, "chat_template_detect: NULL output");
    chat_template_family_t f = CHAT_TEMPLATE_CHATML;
    bool k = true;
    if (has(text, len, "<|im_start|>")) f = CHAT_TEMPLATE_CHATML;
    else if (has(text, len, "<|start_header_id|>") && has(text, len, "<|end_header_id|>")) f = CHAT_TEMPLATE_LLAMA3;
    else if (has(text, len, "<start_of_turn>")) f = CHAT_TEMPLATE_GEMMA;
    else if (has(text, len, "<|user|>") && has(text, len, "<|end|>")) f = CHAT_TEMPLATE_PHI3;
    else if (has(text, len, "[INST]")) f = CHAT_TEMPLATE_LLAMA2;
    else k = false;
    *family = f;
    *known = k;
    return BATON_OK;
}

const char *chat_template_family_name(chat_template_family_t family) {
    switch (family) {
    case CHAT_TEMPLATE_CHATML: return "chatml";
    case CHAT_TEMPLATE_LLAMA3: return "llama3";
    case CHAT_TEMPLATE_LLAMA2: return "llama2";
    case CHAT_TEMPLATE_GEMMA: return "gemma";
    case CHAT_TEMPLATE_PHI3: return "phi3";
    }
    return "unknown";
}

/* ChatML templates that add a default system turn (SmolLM2, Qwen2.5) write
 * it as a literal '<|im_start|>system\n...<|im_end|>' under a condition on
 * messages[0]['role'] != 'system'. Returns the literal's body or NULL. */
static baton_status_t find_default_system(const char *text, size_t len, char **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    if (!has(text, len, "!= 'system'") && !has(text, len, "!= \"system\"")) return BATON_OK;
    static const char open[] = "<|im_start|>system\n";
    const char *p = memmem(text, len, open, sizeof(open) - 1);
    if (!p) return BATON_OK;
    p += sizeof(open) - 1;
    const char *end = memmem(p, len - (size_t)(p - text), "<|im_end|>", 10);
    if (!end) return BATON_OK;
    size_t n = (size_t)(end - p);
    /* a Jinja expression inside means it is not a literal prompt */
    if (memchr(p, '{', n) || memchr(p, '\'', n) || memchr(p, '"', n)) return BATON_OK;
    char *s = malloc(n + 1);
    if (!s) return baton_error(BATON_ERR_NO_MEMORY, "chat_template: default system prompt");
    memcpy(s, p, n);
    s[n] = 0;
    *out = s;
    *out_len = n;
    return BATON_OK;
}

baton_status_t chat_template_init_text(const char *text, size_t len, const tokenizer_t *tok,
                                       chat_template_t **out) {
    if (!tok || !out) return baton_error(BATON_ERR_INVALID_ARG, "chat_template_init: NULL argument");
    chat_template_t *ct = calloc(1, sizeof(*ct));
    if (!ct) return baton_error(BATON_ERR_NO_MEMORY, "chat_template: alloc");
    ct->tok = tok;
    bool known = false;
    chat_template_detect(text, text ? len : 0, &ct->family, &known);
    ct->fallback = !known;
    if (!text)
        LOG_WARN(CT_LOG, "model has no tokenizer.chat_template; using ChatML");
    else if (!known)
        LOG_WARN(CT_LOG, "unknown chat template (%zu bytes); using ChatML", len);
    if (ct->family == CHAT_TEMPLATE_CHATML && known) {
        baton_status_t s = find_default_system(text, len, &ct->default_system, &ct->default_system_len);
        if (s) {
            free(ct);
            return s;
        }
    }
    *out = ct;
    return BATON_OK;
}

baton_status_t chat_template_init(const gguf_file_t *file, const tokenizer_t *tok,
                                  chat_template_t **out) {
    if (!file) return baton_error(BATON_ERR_INVALID_ARG, "chat_template_init: NULL file");
    gguf_str_t g;
    baton_status_t s = gguf_get_str(file, "tokenizer.chat_template", &g);
    if (s == BATON_ERR_NOT_FOUND) return chat_template_init_text(NULL, 0, tok, out);
    if (s) return s;
    return chat_template_init_text(g.data, g.len, tok, out);
}

void chat_template_free(chat_template_t *ct) {
    if (!ct) return;
    free(ct->default_system);
    free(ct);
}

chat_template_family_t chat_template_family(const chat_template_t *ct) { return ct->family; }
bool chat_template_is_fallback(const chat_template_t *ct) { return ct->fallback; }

/* ---------------------------------------------------------------- builder */

typedef struct builder {
    const tokenizer_t *tok;
    bool want_ids;
    char *text;      /* full rendering (text form) */
    size_t len, cap;
    size_t pending;  /* start in `text` of the plain text not yet encoded */
    int32_t *ids;
    size_t n_ids, cap_ids;
    baton_status_t st; /* first error */
} builder_t;

static void b_append(builder_t *b, const char *p, size_t n) {
    if (b->st) return;
    if (b->len + n + 1 > TOKENIZER_MAX_INPUT_BYTES + 1) {
        b->st = baton_error(BATON_ERR_OUT_OF_RANGE, "chat_template: prompt exceeds %zu bytes",
                            TOKENIZER_MAX_INPUT_BYTES);
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *q = realloc(b->text, cap);
        if (!q) {
            b->st = baton_error(BATON_ERR_NO_MEMORY, "chat_template: %zu bytes", cap);
            return;
        }
        b->text = q;
        b->cap = cap;
    }
    if (n) memcpy(b->text + b->len, p, n);
    b->len += n;
    b->text[b->len] = 0;
}

static void b_push_id(builder_t *b, int32_t id) {
    if (b->st) return;
    if (b->n_ids == b->cap_ids) {
        size_t cap = b->cap_ids ? b->cap_ids * 2 : 64;
        int32_t *q = realloc(b->ids, cap * sizeof(*q));
        if (!q) {
            b->st = baton_error(BATON_ERR_NO_MEMORY, "chat_template: %zu ids", cap);
            return;
        }
        b->ids = q;
        b->cap_ids = cap;
    }
    b->ids[b->n_ids++] = id;
}

/* Encodes the pending plain text as one fragment. */
static void b_flush(builder_t *b) {
    if (b->st || !b->want_ids || b->pending == b->len) return;
    int32_t *ids = NULL;
    size_t n = 0;
    baton_status_t s = tokenizer_encode_alloc(b->tok, b->text + b->pending, b->len - b->pending,
                                              TOKENIZER_ENCODE_NO_USER_DEFINED, &ids, &n);
    if (s) {
        b->st = s;
        return;
    }
    for (size_t i = 0; i < n; i++) b_push_id(b, ids[i]);
    free(ids);
    b->pending = b->len;
}

static void b_text(builder_t *b, const char *p, size_t n) { b_append(b, p, n); }
static void b_str(builder_t *b, const char *s) { b_append(b, s, strlen(s)); }

/* Scaffolding: a special token when the vocabulary has it as one, else text. */
static void b_special(builder_t *b, const char *s) {
    int32_t id = tokenizer_token_id(b->tok, s);
    tokenizer_token_type_t ty = tokenizer_token_type(b->tok, id);
    if (id < 0 || (ty != TOKENIZER_TOKEN_CONTROL && ty != TOKENIZER_TOKEN_USER_DEFINED)) {
        b_str(b, s);
        return;
    }
    b_flush(b);
    b_append(b, s, strlen(s));
    b->pending = b->len;
    b_push_id(b, id);
}

static void b_special_id(builder_t *b, int32_t id) {
    b_flush(b);
    const char *s = tokenizer_token_text(b->tok, id);
    b_append(b, s, strlen(s));
    b->pending = b->len;
    b_push_id(b, id);
}

typedef enum role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT } role_t;

static baton_status_t parse_role(const chat_message_t *m, size_t i, role_t *r) {
    if (!m->role || (!m->content && m->content_len))
        return baton_error(BATON_ERR_INVALID_ARG, "chat_template: message %zu has a NULL role or content", i);
    if (!strcmp(m->role, "system")) *r = ROLE_SYSTEM;
    else if (!strcmp(m->role, "user")) *r = ROLE_USER;
    else if (!strcmp(m->role, "assistant")) *r = ROLE_ASSISTANT;
    else
        return baton_error(BATON_ERR_INVALID_ARG,
                           "chat_template: message %zu has role '%.32s' (system, user, assistant)", i, m->role);
    if (tokenizer_utf8_valid_prefix(m->content, m->content_len) != m->content_len)
        return baton_error(BATON_ERR_INVALID_ARG, "chat_template: message %zu content is not valid UTF-8", i);
    return BATON_OK;
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Python str.strip() of ASCII whitespace (Jinja's |trim). */
static void trimmed(const chat_message_t *m, const char **p, size_t *n) {
    const char *s = m->content;
    size_t l = m->content_len;
    while (l && is_space(*s)) { s++; l--; }
    while (l && is_space(s[l - 1])) l--;
    *p = s;
    *n = l;
}

static void render(const chat_template_t *ct, const chat_message_t *msgs, size_t n, bool gen,
                   builder_t *b) {
    const tokenizer_t *tok = ct->tok;
    for (size_t i = 0; i < n && !b->st; i++) {
        role_t r;
        b->st = parse_role(&msgs[i], i, &r);
    }
    if (b->st) return;
    if (tokenizer_add_bos(tok) && tokenizer_bos(tok) >= 0) b_special_id(b, tokenizer_bos(tok));

    switch (ct->family) {
    case CHAT_TEMPLATE_CHATML:
        for (size_t i = 0; i < n; i++) {
            if (i == 0 && ct->default_system && strcmp(msgs[0].role, "system") != 0) {
                b_special(b, "<|im_start|>");
                b_str(b, "system\n");
                b_text(b, ct->default_system, ct->default_system_len);
                b_special(b, "<|im_end|>");
                b_str(b, "\n");
            }
            b_special(b, "<|im_start|>");
            b_str(b, msgs[i].role);
            b_str(b, "\n");
            b_text(b, msgs[i].content, msgs[i].content_len);
            b_special(b, "<|im_end|>");
            b_str(b, "\n");
        }
        if (gen) {
            b_special(b, "<|im_start|>");
            b_str(b, "assistant\n");
        }
        break;
    case CHAT_TEMPLATE_LLAMA3:
        for (size_t i = 0; i < n; i++) {
            const char *p;
            size_t l;
            trimmed(&msgs[i], &p, &l);
            b_special(b, "<|start_header_id|>");
            b_str(b, msgs[i].role);
            b_special(b, "<|end_header_id|>");
            b_str(b, "\n\n");
            b_text(b, p, l);
            b_special(b, "<|eot_id|>");
        }
        if (gen) {
            b_special(b, "<|start_header_id|>");
            b_str(b, "assistant");
            b_special(b, "<|end_header_id|>");
            b_str(b, "\n\n");
        }
        break;
    case CHAT_TEMPLATE_LLAMA2: {
        /* Llama-2-chat: the system message is folded into the first user
         * turn and the whole turn text is strip()ped, as the template does */
        size_t i = 0;
        const chat_message_t *sys = NULL;
        if (n && !strcmp(msgs[0].role, "system")) sys = &msgs[i++];
        bool first_user = true;
        for (; i < n && !b->st; i++) {
            const char *p;
            size_t l;
            trimmed(&msgs[i], &p, &l);
            if (!strcmp(msgs[i].role, "user")) {
                /* every user turn opens with BOS; the first one is the
                 * BOS added above when the model adds one */
                if ((!first_user || !tokenizer_add_bos(tok)) && tokenizer_bos(tok) >= 0)
                    b_special_id(b, tokenizer_bos(tok));
                b_str(b, "[INST] ");
                if (sys && first_user) {
                    b_str(b, "<<SYS>>\n");
                    b_text(b, sys->content, sys->content_len);
                    b_str(b, "\n<</SYS>>\n\n");
                    /* strip() of the combined text only trims its end */
                    p = msgs[i].content;
                    l = msgs[i].content_len;
                    while (l && is_space(p[l - 1])) l--;
                }
                b_text(b, p, l);
                b_str(b, " [/INST]");
                first_user = false;
            } else if (!strcmp(msgs[i].role, "assistant")) {
                b_str(b, " ");
                b_text(b, p, l);
                b_str(b, " ");
                if (tokenizer_eos(tok) >= 0) b_special_id(b, tokenizer_eos(tok));
            } else {
                b->st = baton_error(BATON_ERR_INVALID_ARG,
                                    "chat_template: llama2 allows a system message only first (message %zu)", i);
            }
        }
        break;
    }
    case CHAT_TEMPLATE_GEMMA: {
        size_t i = 0;
        const chat_message_t *sys = NULL;
        if (n && !strcmp(msgs[0].role, "system")) sys = &msgs[i++];
        bool first_user = true;
        for (; i < n && !b->st; i++) {
            const char *p;
            size_t l;
            trimmed(&msgs[i], &p, &l);
            bool user = !strcmp(msgs[i].role, "user");
            if (!user && strcmp(msgs[i].role, "assistant")) {
                b->st = baton_error(BATON_ERR_INVALID_ARG,
                                    "chat_template: gemma allows a system message only first (message %zu)", i);
                break;
            }
            b_special(b, "<start_of_turn>");
            b_str(b, user ? "user\n" : "model\n");
            if (user && first_user && sys) {
                const char *sp;
                size_t sl;
                trimmed(sys, &sp, &sl);
                b_text(b, sp, sl);
                b_str(b, "\n\n");
            }
            if (user) first_user = false;
            b_text(b, p, l);
            b_special(b, "<end_of_turn>");
            b_str(b, "\n");
        }
        if (gen) {
            b_special(b, "<start_of_turn>");
            b_str(b, "model\n");
        }
        break;
    }
    case CHAT_TEMPLATE_PHI3:
        for (size_t i = 0; i < n; i++) {
            char tag[32];
            snprintf(tag, sizeof(tag), "<|%s|>", msgs[i].role);
            b_special(b, tag);
            b_str(b, "\n");
            b_text(b, msgs[i].content, msgs[i].content_len);
            b_special(b, "<|end|>");
            b_str(b, "\n");
        }
        if (gen) {
            b_special(b, "<|assistant|>");
            b_str(b, "\n");
        } else if (tokenizer_eos(tok) >= 0) {
            b_special_id(b, tokenizer_eos(tok)); /* the Phi-3 template ends a finished chat with EOS */
        }
        break;
    }
    b_flush(b);
}

baton_status_t chat_template_render(const chat_template_t *ct, const chat_message_t *msgs, size_t n,
                                    bool add_generation_prompt, int32_t **ids_out, size_t *n_out) {
    if (!ct || (!msgs && n) || !ids_out || !n_out)
        return baton_error(BATON_ERR_INVALID_ARG, "chat_template_render: NULL argument");
    builder_t b = {.tok = ct->tok, .want_ids = true};
    render(ct, msgs, n, add_generation_prompt, &b);
    free(b.text);
    if (b.st) {
        free(b.ids);
        return b.st;
    }
    *ids_out = b.ids;
    *n_out = b.n_ids;
    return BATON_OK;
}

baton_status_t chat_template_render_text(const chat_template_t *ct, const chat_message_t *msgs,
                                         size_t n, bool add_generation_prompt, char **text_out,
                                         size_t *len_out) {
    if (!ct || (!msgs && n) || !text_out || !len_out)
        return baton_error(BATON_ERR_INVALID_ARG, "chat_template_render_text: NULL argument");
    builder_t b = {.tok = ct->tok, .want_ids = false};
    render(ct, msgs, n, add_generation_prompt, &b);
    free(b.ids);
    if (!b.st && !b.text) {
        b.text = calloc(1, 1);
        if (!b.text) b.st = baton_error(BATON_ERR_NO_MEMORY, "chat_template: alloc");
    }
    if (b.st) {
        free(b.text);
        return b.st;
    }
    *text_out = b.text;
    *len_out = b.len;
    return BATON_OK;
}
