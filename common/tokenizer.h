/* Tokenizer built from GGUF metadata, and an incremental (streaming)
 * detokenizer.
 *
 * Two vocabulary types (key `tokenizer.ggml.model`):
 *  - "gpt2": byte-level BPE (GPT-2, Llama 3, SmolLM2). Text is split by the
 *    pre-tokenizer regexes chosen by `tokenizer.ggml.pre` (evaluated by PCRE2
 *    with PCRE2_UTF|PCRE2_UCP, JIT-compiled when available), each piece's
 *    bytes are mapped to printable code points (GPT-2 `bytes_to_unicode`),
 *    then merged by rank (`tokenizer.ggml.merges`, lowest rank first, ties
 *    leftmost) with a priority queue: O(n log n) per word. A byte whose
 *    one-byte token is missing from the vocabulary is dropped, as llama.cpp
 *    does (SmolLM2 has none for 0x04, 0x06, 0x13, 0x14, 0x16, 0x1d and
 *    bytes that never occur in UTF-8).
 *  - "llama": SentencePiece-style BPE (Llama 2, TinyLlama, Mistral). Spaces
 *    become U+2581, a dummy space is prepended to each text fragment that
 *    starts the input or follows a special token (when
 *    `tokenizer.ggml.add_space_prefix` is true, the default), adjacent
 *    symbols are merged by piece score (highest first, ties leftmost), and
 *    characters missing from the vocabulary fall back to <0xXX> byte tokens.
 * Both follow llama.cpp's llama-vocab.cpp (llm_tokenizer_bpe_session,
 * llm_tokenizer_spm_session, tokenizer_st_partition).
 *
 * A tokenizer_t is immutable after tokenizer_load() and may be used from
 * several threads at once. Token ids are int32_t in [0, n_vocab). */
#ifndef BATON_COMMON_TOKENIZER_H
#define BATON_COMMON_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/gguf.h"
#include "common/status.h"

typedef struct tokenizer tokenizer_t;

typedef enum tokenizer_kind {
    TOKENIZER_KIND_BPE = 1, /* "gpt2": byte-level BPE */
    TOKENIZER_KIND_SPM = 2, /* "llama": SentencePiece-style BPE */
} tokenizer_kind_t;

/* Token types as stored in `tokenizer.ggml.token_type` (llama.cpp
 * llama_token_type). */
typedef enum tokenizer_token_type {
    TOKENIZER_TOKEN_UNDEFINED = 0,
    TOKENIZER_TOKEN_NORMAL = 1,
    TOKENIZER_TOKEN_UNKNOWN = 2,
    TOKENIZER_TOKEN_CONTROL = 3,
    TOKENIZER_TOKEN_USER_DEFINED = 4,
    TOKENIZER_TOKEN_UNUSED = 5,
    TOKENIZER_TOKEN_BYTE = 6,
} tokenizer_token_type_t;

/* Flags for tokenizer_encode*. */
enum tokenizer_encode_flags {
    /* Prepend BOS when the model says so (`tokenizer.ggml.add_bos_token`,
     * default true for "llama", false for "gpt2") and append EOS when
     * `tokenizer.ggml.add_eos_token` is true. */
    TOKENIZER_ENCODE_ADD_SPECIAL = 1u << 0,
    /* Recognise the text of control tokens (e.g. "<|im_end|>") in the input
     * and emit their ids. Off by default: user text stays plain text.
     * User-defined tokens (type 4) are always recognised, as in llama.cpp. */
    TOKENIZER_ENCODE_PARSE_SPECIAL = 1u << 1,
    /* Do not recognise user-defined tokens either: the text is encoded as
     * pure text (chat templates encode message content this way, since some
     * models, e.g. Gemma, store turn markers as user-defined tokens). */
    TOKENIZER_ENCODE_NO_USER_DEFINED = 1u << 2,
};

/* Flags for tokenizer_decode / detok_init. */
enum tokenizer_decode_flags {
    /* Render control tokens as their text ("<|im_end|>"); by default they
     * produce no bytes. */
    TOKENIZER_DECODE_SPECIAL = 1u << 0,
    /* SentencePiece: keep the leading space that the dummy prefix produces
     * (by default one leading space of the whole output is removed when the
     * model adds a space prefix). No effect for "gpt2". */
    TOKENIZER_DECODE_KEEP_LEADING_SPACE = 1u << 1,
};

/* Largest input accepted by tokenizer_encode (bytes): far beyond any
 * context window, and it bounds the merge work space (about 70 bytes per
 * input byte for a single word without any break, the worst case). */
#define TOKENIZER_MAX_INPUT_BYTES ((size_t)4 << 20)

/* Builds a tokenizer from the tokenizer.* keys of an open GGUF file. Reads:
 * tokenizer.ggml.model (required), tokens (required), token_type, scores
 * (required for "llama"), merges (required for "gpt2"), pre, bos/eos/eot/
 * eom/unknown/padding_token_id, add_bos_token, add_eos_token,
 * add_space_prefix. Everything needed is copied: `file` may be closed
 * afterwards. On success *out must be freed with tokenizer_free().
 * Errors: BATON_ERR_NOT_FOUND (detail names the missing key),
 * BATON_ERR_FORMAT (wrong type, inconsistent lengths, id out of range,
 * malformed merge, bad regex), BATON_ERR_UNSUPPORTED (unknown model type),
 * BATON_ERR_NO_MEMORY. An unknown `tokenizer.ggml.pre` logs a warning and
 * uses the GPT-2 pre-tokenizer. */
baton_status_t tokenizer_load(const gguf_file_t *file, tokenizer_t **out);

/* NULL-safe. */
void tokenizer_free(tokenizer_t *tok);

/* Encodes `len` bytes of UTF-8 `text` (need not be NUL-terminated) into
 * token ids written to ids[0..cap). On success *n_out is the number of ids.
 * Errors (nothing written to *n_out): BATON_ERR_INVALID_ARG (NULL args,
 * invalid UTF-8: the detail gives the byte offset), BATON_ERR_OUT_OF_RANGE
 * (len > TOKENIZER_MAX_INPUT_BYTES), BATON_ERR_NO_SPACE (cap too small; the
 * detail gives the count needed), BATON_ERR_NO_MEMORY, BATON_ERR_INTERNAL
 * (regex engine failure). Empty text gives zero ids (plus BOS/EOS when
 * TOKENIZER_ENCODE_ADD_SPECIAL asks for them). */
baton_status_t tokenizer_encode(const tokenizer_t *tok, const char *text, size_t len,
                                uint32_t flags, int32_t *ids, size_t cap, size_t *n_out);

/* Same as tokenizer_encode but allocates the id array: on success *ids_out
 * (free()) holds *n_out ids (*ids_out may be NULL when *n_out is 0). */
baton_status_t tokenizer_encode_alloc(const tokenizer_t *tok, const char *text, size_t len,
                                      uint32_t flags, int32_t **ids_out, size_t *n_out);

/* The bytes token `id` stands for: byte-level BPE pieces mapped back to
 * bytes, SentencePiece U+2581 turned into spaces and <0xXX> into the byte,
 * control tokens empty unless TOKENIZER_DECODE_SPECIAL. A piece may be an
 * incomplete UTF-8 sequence. Writes at most `cap` bytes to buf (no NUL) and
 * sets *n_out to the piece length. Errors: BATON_ERR_OUT_OF_RANGE (bad id),
 * BATON_ERR_NO_SPACE (cap too small; detail gives the size). */
baton_status_t tokenizer_token_to_piece(const tokenizer_t *tok, int32_t id, uint32_t flags,
                                        char *buf, size_t cap, size_t *n_out);

/* One-shot decode of n ids into a malloc'd NUL-terminated string *text_out
 * (free()) of *len_out bytes. The result is always valid UTF-8: each invalid
 * or truncated byte sequence in the concatenated pieces becomes U+FFFD
 * (one per maximal invalid subpart, Unicode 15 §3.9 "U+FFFD substitution of
 * maximal subparts"), exactly as the detok_t stream produces it. Errors:
 * BATON_ERR_OUT_OF_RANGE (bad id; detail gives its index), NO_MEMORY. */
baton_status_t tokenizer_decode(const tokenizer_t *tok, const int32_t *ids, size_t n,
                                uint32_t flags, char **text_out, size_t *len_out);

tokenizer_kind_t tokenizer_kind(const tokenizer_t *tok);
int32_t tokenizer_n_vocab(const tokenizer_t *tok);
/* Special ids, -1 when the model has none. */
int32_t tokenizer_bos(const tokenizer_t *tok);
int32_t tokenizer_eos(const tokenizer_t *tok);
int32_t tokenizer_eot(const tokenizer_t *tok); /* end of turn; -1 if none */
int32_t tokenizer_pad(const tokenizer_t *tok);
int32_t tokenizer_unk(const tokenizer_t *tok);
bool tokenizer_add_bos(const tokenizer_t *tok);
bool tokenizer_add_eos(const tokenizer_t *tok);
/* Name of the pre-tokenizer in use ("smollm", "gpt2", "llama-bpe", "spm"). */
const char *tokenizer_pre_name(const tokenizer_t *tok);

/* True when generating `id` ends the generation: eos, eot, eom, and the
 * control tokens "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
 * "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>" when present (the
 * list of llama.cpp's special_eog_ids). */
bool tokenizer_is_eog(const tokenizer_t *tok, int32_t id);

/* Stored text of token `id` (byte-level or U+2581 form, NUL-terminated,
 * owned by the tokenizer), or NULL for an id out of range. */
const char *tokenizer_token_text(const tokenizer_t *tok, int32_t id);
tokenizer_token_type_t tokenizer_token_type(const tokenizer_t *tok, int32_t id);

/* Id of the token whose stored text is exactly `text` (e.g.
 * "<|im_start|>"), or -1. */
int32_t tokenizer_token_id(const tokenizer_t *tok, const char *text);

/* ---- incremental detokenizer ----
 * Feed ids one at a time; each call returns only complete UTF-8 characters
 * (an incomplete trailing sequence is held until the next piece or the
 * flush; a sequence that is provably invalid becomes U+FFFD at once). The
 * concatenation of every detok_push output and the detok_flush output equals
 * tokenizer_decode() of the same ids with the same flags, byte for byte. */
typedef struct detok detok_t;

/* `tok` must outlive the detokenizer. Free with detok_free(). */
baton_status_t detok_init(const tokenizer_t *tok, uint32_t decode_flags, detok_t **out);
void detok_free(detok_t *d); /* NULL-safe */

/* Adds token `id`. On success *text and *len give the newly complete text
 * (possibly empty), valid until the next call on `d`. Errors:
 * BATON_ERR_OUT_OF_RANGE (bad id; state unchanged), NO_MEMORY. */
baton_status_t detok_push(detok_t *d, int32_t id, const char **text, size_t *len);

/* Ends the stream: returns what was held (an incomplete sequence becomes
 * U+FFFD) and resets `d` for a new stream. */
baton_status_t detok_flush(detok_t *d, const char **text, size_t *len);

/* Shared UTF-8 helper: length of the longest prefix of buf[0..len) made of
 * whole valid UTF-8 characters. */
size_t tokenizer_utf8_valid_prefix(const char *buf, size_t len);

#endif
