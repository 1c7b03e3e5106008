/* Chat templates: render a conversation into prompt token ids.
 *
 * The family is recognised from the Jinja text in the GGUF key
 * `tokenizer.chat_template` (substring checks in the spirit of llama.cpp
 * llm_chat_detect_template); the Jinja itself is not executed. Families:
 *   CHATML  "<|im_start|>{role}\n{content}<|im_end|>\n", generation prompt
 *           "<|im_start|>assistant\n" (SmolLM2, Qwen2). A default system
 *           prompt that the template inserts when the first message is not a
 *           system message (SmolLM2: "You are a helpful AI assistant named
 *           SmolLM, trained by Hugging Face") is taken from the template text.
 *   LLAMA3  "<|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|>",
 *           prompt "<|start_header_id|>assistant<|end_header_id|>\n\n".
 *   LLAMA2  Llama-2-chat: "<s>[INST] {<<SYS>>\n{system}\n<</SYS>>\n\n}{user} [/INST]",
 *           assistant " {content} </s>"; every user turn opens with BOS (also
 *           chosen for Mistral [INST] templates, whose spacing differs slightly).
 *   GEMMA   "<start_of_turn>{user|model}\n{content}<end_of_turn>\n", the system
 *           message prepended to the first user message followed by "\n\n";
 *           prompt "<start_of_turn>model\n".
 *   PHI3    "<|{role}|>\n{content}<|end|>\n", prompt "<|assistant|>\n" (without
 *           a generation prompt the template ends with EOS).
 * An unknown or missing template is logged and rendered as CHATML; callers
 * see this through chat_template_is_fallback().
 *
 * Only the scaffolding produces special tokens: a scaffolding string that is
 * a control/user-defined token of the vocabulary becomes that token id, and
 * every run of text between two special tokens (role names, newlines and the
 * message content together) is encoded as plain text, so content such as
 * "<|im_end|>\n<|im_start|>system" can never inject control or user-defined
 * tokens (TOKENIZER_ENCODE_NO_USER_DEFINED). BOS is
 * prepended when the model's add_bos flag is set. */
#ifndef BATON_COMMON_CHAT_TEMPLATE_H
#define BATON_COMMON_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/gguf.h"
#include "common/status.h"
#include "common/tokenizer.h"

typedef enum chat_template_family {
    CHAT_TEMPLATE_CHATML = 0,
    CHAT_TEMPLATE_LLAMA3 = 1,
    CHAT_TEMPLATE_LLAMA2 = 2,
    CHAT_TEMPLATE_GEMMA = 3,
    CHAT_TEMPLATE_PHI3 = 4,
} chat_template_family_t;

/* One message. `role` is a NUL-terminated "system", "user" or "assistant";
 * `content` is content_len bytes of UTF-8 (need not be NUL-terminated). */
typedef struct chat_message {
    const char *role;
    const char *content;
    size_t content_len;
} chat_message_t;

typedef struct chat_template chat_template_t;

/* Family of a template text. *known is false (and *family CHATML) when no
 * family matched. Never fails on any text; errors only for NULL outputs. */
baton_status_t chat_template_detect(const char *text, size_t len, chat_template_family_t *family,
                                    bool *known);

/* Reads `tokenizer.chat_template` from `file` (absent: fallback to ChatML,
 * logged) and binds the template to `tok`, which must outlive it. The
 * template text is copied. Free with chat_template_free(). Errors:
 * BATON_ERR_INVALID_ARG, BATON_ERR_FORMAT (key of the wrong type),
 * BATON_ERR_NO_MEMORY. */
baton_status_t chat_template_init(const gguf_file_t *file, const tokenizer_t *tok,
                                  chat_template_t **out);

/* Same from a template text (NULL: fallback). */
baton_status_t chat_template_init_text(const char *text, size_t len, const tokenizer_t *tok,
                                       chat_template_t **out);

void chat_template_free(chat_template_t *ct); /* NULL-safe */

chat_template_family_t chat_template_family(const chat_template_t *ct);
/* True when the template was not recognised and ChatML is used instead. */
bool chat_template_is_fallback(const chat_template_t *ct);
/* "chatml", "llama3", "llama2", "gemma", "phi3". */
const char *chat_template_family_name(chat_template_family_t family);

/* Renders msgs[0..n) (+ the assistant generation prompt when
 * add_generation_prompt) into token ids. On success *ids_out (free()) holds
 * *n_out ids. Errors: BATON_ERR_INVALID_ARG (NULL, unknown role, a role
 * order the family cannot express, invalid UTF-8 content),
 * BATON_ERR_OUT_OF_RANGE (prompt over TOKENIZER_MAX_INPUT_BYTES),
 * BATON_ERR_NO_MEMORY. */
baton_status_t chat_template_render(const chat_template_t *ct, const chat_message_t *msgs, size_t n,
                                    bool add_generation_prompt, int32_t **ids_out, size_t *n_out);

/* The same rendering as text (special tokens spelled out, BOS included as its
 * token text when added): what the Jinja template would print. *text_out is
 * malloc'd and NUL-terminated, *len_out bytes. */
baton_status_t chat_template_render_text(const chat_template_t *ct, const chat_message_t *msgs,
                                         size_t n, bool add_generation_prompt, char **text_out,
                                         size_t *len_out);

#endif
