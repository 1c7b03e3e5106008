/* Tokenizer from GGUF metadata: byte-level BPE ("gpt2") and SentencePiece
 * style BPE ("llama"), plus the streaming detokenizer.
 *
 * The algorithms follow llama.cpp src/llama-vocab.cpp so that token ids
 * match llama.cpp token for token:
 *  - special-token partition: tokenizer_st_partition (tokens sorted by text
 *    length, longest first; each splits every raw fragment);
 *  - BPE: llm_tokenizer_bpe_session (regex pre-split, GPT-2 byte encoding,
 *    bigram priority queue by merge rank, ties leftmost);
 *  - SPM: llm_tokenizer_spm_session (U+2581 for spaces, bigram queue by
 *    piece score, ties leftmost, byte fallback <0xXX>).
 * Pre-tokenizer regexes are the ones llama.cpp and the HF tokenizer.json
 * files use, run by PCRE2. */
#define _GNU_SOURCE
#include "common/tokenizer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/log.h"

#define TOK_LOG "tokenizer"
#define TOK_MAX_REGEX 3

/* ---------------------------------------------------------------- hashmap */

/* Open-addressing map from byte strings (not owned) to int32 values. */
typedef struct strmap_entry {
    const char *key;
    uint32_t len;
    int32_t value;
} strmap_entry_t;

typedef struct strmap {
    strmap_entry_t *slots;
    size_t mask; /* capacity - 1, capacity a power of two */
} strmap_t;

static baton_status_t strmap_init(strmap_t *m, size_t n) {
    size_t cap = 16;
    while (cap < n * 2 + 1) cap <<= 1;
    m->slots = calloc(cap, sizeof(*m->slots));
    if (!m->slots) return baton_error(BATON_ERR_NO_MEMORY, "tokenizer: hash table of %zu", cap);
    m->mask = cap - 1;
    return BATON_OK;
}

static void strmap_free(strmap_t *m) {
    free(m->slots);
    m->slots = NULL;
}

/* Inserts unless present; returns false when the key already existed. */
static bool strmap_put(strmap_t *m, const char *key, size_t len, int32_t value) {
    size_t i = (size_t)XXH3_64bits(key, len) & m->mask;
    for (;;) {
        strmap_entry_t *e = &m->slots[i];
        if (!e->key) {
            e->key = key;
            e->len = (uint32_t)len;
            e->value = value;
            return true;
        }
        if (e->len == len && memcmp(e->key, key, len) == 0) return false;
        i = (i + 1) & m->mask;
    }
}

static int32_t strmap_get(const strmap_t *m, const char *key, size_t len) {
    size_t i = (size_t)XXH3_64bits(key, len) & m->mask;
    for (;;) {
        const strmap_entry_t *e = &m->slots[i];
        if (!e->key) return -1;
        if (e->len == len && memcmp(e->key, key, len) == 0) return e->value;
        i = (i + 1) & m->mask;
    }
}

/* ---------------------------------------------------------------- struct */

struct tokenizer {
    tokenizer_kind_t kind;
    int32_t n_vocab;
    char *arena;          /* all token texts, NUL-separated */
    const char **text;    /* [n_vocab] stored token text */
    uint32_t *text_len;   /* [n_vocab] bytes */
    float *score;         /* [n_vocab] SPM piece scores (0 when absent) */
    uint8_t *type;        /* [n_vocab] tokenizer_token_type_t */
    uint8_t *eog;         /* [n_vocab] 1 when end-of-generation */
    char *piece_arena;    /* decoded pieces, concatenated */
    size_t *piece_off;    /* [n_vocab + 1] offsets of each decoded piece */
    strmap_t vocab;       /* text -> id */
    strmap_t merges;      /* "left right" -> rank (BPE only) */
    char *merge_arena;
    int32_t *special;     /* ids of control/user-defined/unknown tokens, longest first */
    size_t n_special;
    int32_t bos, eos, eot, eom, unk, pad;
    bool add_bos, add_eos, add_space_prefix, ignore_merges;
    int32_t byte_token[256]; /* SPM: id of <0xXX>, -1 if absent */
    const char *pre_name;
    pcre2_code *re[TOK_MAX_REGEX];
    size_t n_re;
};

/* GPT-2 bytes_to_unicode(): printable bytes map to themselves, the other 68
 * bytes to U+0100.. in order (openai/gpt-2 encoder.py). */
static uint16_t g_byte_to_cp[256];
static int16_t g_cp_to_byte[512];

static void byte_tables_fill(void) {
    int n = 0;
    for (int i = 0; i < 512; i++) g_cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        g_byte_to_cp[b] = printable ? (uint16_t)b : (uint16_t)(256 + n++);
        g_cp_to_byte[g_byte_to_cp[b]] = (int16_t)b;
    }
}

static void byte_tables_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, byte_tables_fill);
}

/* ---------------------------------------------------------------- utf-8 */

/* Length of a valid UTF-8 sequence starting at s[0..len), 0 when invalid. */
static size_t utf8_seq_len(const unsigned char *s, size_t len) {
    unsigned char b = s[0];
    if (b < 0x80) return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) n = 2;
    else if (b == 0xE0) { n = 3; lo = 0xA0; }
    else if (b == 0xED) { n = 3; hi = 0x9F; }
    else if (b >= 0xE1 && b <= 0xEF) n = 3;
    else if (b == 0xF0) { n = 4; lo = 0x90; }
    else if (b == 0xF4) { n = 4; hi = 0x8F; }
    else if (b >= 0xF1 && b <= 0xF3) n = 4;
    else return 0;
    if (len < n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return n;
}

size_t tokenizer_utf8_valid_prefix(const char *buf, size_t len) {
    const unsigned char *s = (const unsigned char *)buf;
    size_t i = 0;
    while (i < len) {
        size_t n = utf8_seq_len(s + i, len - i);
        if (!n) break;
        i += n;
    }
    return i;
}

static size_t utf8_put(char *out, uint32_t cp) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes one code point of valid UTF-8. */
static uint32_t utf8_get(const unsigned char *s, size_t n) {
    if (n == 1) return s[0];
    if (n == 2) return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    if (n == 3) return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
           ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

/* Growable byte buffer. */
typedef struct bytebuf {
    char *data;
    size_t len, cap;
} bytebuf_t;

static baton_status_t bytebuf_reserve(bytebuf_t *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return BATON_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) return baton_error(BATON_ERR_NO_MEMORY, "tokenizer: buffer of %zu bytes", cap);
    b->data = p;
    b->cap = cap;
    return BATON_OK;
}

static baton_status_t bytebuf_append(bytebuf_t *b, const void *p, size_t n) {
    baton_status_t s = bytebuf_reserve(b, n);
    if (s) return s;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return BATON_OK;
}

/* Copies whole characters of in[0..len) to out, each maximal invalid
 * subpart (Unicode §3.9, D93b) replaced by U+FFFD. When !final an
 * incomplete but so-far valid sequence at the end is left unconsumed.
 * Returns the bytes consumed through *consumed. */
static baton_status_t utf8_sanitize(const char *in, size_t len, bool final, bytebuf_t *out,
                                    size_t *consumed) {
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    const unsigned char *s = (const unsigned char *)in;
    size_t i = 0;
    baton_status_t st = BATON_OK;
    while (i < len) {
        unsigned char b = s[i];
        if (b < 0x80) {
            size_t j = i;
            while (j < len && s[j] < 0x80) j++;
            if ((st = bytebuf_append(out, s + i, j - i))) return st;
            i = j;
            continue;
        }
        size_t n;
        unsigned char lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF) n = 2;
        else if (b == 0xE0) { n = 3; lo = 0xA0; }
        else if (b == 0xED) { n = 3; hi = 0x9F; }
        else if (b >= 0xE1 && b <= 0xEF) n = 3;
        else if (b == 0xF0) { n = 4; lo = 0x90; }
        else if (b == 0xF4) { n = 4; hi = 0x8F; }
        else if (b >= 0xF1 && b <= 0xF3) n = 4;
        else {
            if ((st = bytebuf_append(out, fffd, 3))) return st;
            i++;
            continue;
        }
        size_t j = 1;
        bool bad = false, partial = false;
        for (; j < n; j++) {
            if (i + j >= len) { partial = true; break; }
            unsigned char c = s[i + j];
            unsigned char l = j == 1 ? lo : 0x80, h = j == 1 ? hi : 0xBF;
            if (c < l || c > h) { bad = true; break; }
        }
        if (partial && !final) break;
        if (bad || partial) {
            if ((st = bytebuf_append(out, fffd, 3))) return st;
            i += j;
            continue;
        }
        if ((st = bytebuf_append(out, s + i, n))) return st;
        i += n;
    }
    *consumed = i;
    return BATON_OK;
}

/* ---------------------------------------------------------------- regexes */

/* llama.cpp llama-vocab.cpp (llm_tokenizer_bpe) regex_exprs. */
static const char RE_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char RE_DIGIT[] = "\\p{N}";
static const char RE_LLAMA3[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_QWEN2[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static baton_status_t regex_add(tokenizer_t *t, const char *pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof(msg));
        return baton_error(BATON_ERR_INTERNAL, "tokenizer: pre-tokenizer regex at %zu: %s",
                           (size_t)off, (const char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter */
    t->re[t->n_re++] = re;
    return BATON_OK;
}

static baton_status_t pre_setup(tokenizer_t *t, const char *pre) {
    baton_status_t s = BATON_OK;
    if (t->kind == TOKENIZER_KIND_SPM) {
        t->pre_name = "spm";
        return BATON_OK;
    }
    if (!strcmp(pre, "smollm") || !strcmp(pre, "starcoder") || !strcmp(pre, "refact") ||
        !strcmp(pre, "command-r") || !strcmp(pre, "codeshell") || !strcmp(pre, "exaone") ||
        !strcmp(pre, "minerva")) {
        t->pre_name = "smollm";
        if ((s = regex_add(t, RE_DIGIT))) return s;
        return regex_add(t, RE_GPT2);
    }
    if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3") || !strcmp(pre, "llama-v3")) {
        t->pre_name = "llama-bpe";
        t->ignore_merges = true;
        return regex_add(t, RE_LLAMA3);
    }
    if (!strcmp(pre, "smaug-bpe") || !strcmp(pre, "dbrx")) {
        t->pre_name = "llama-bpe";
        return regex_add(t, RE_LLAMA3);
    }
    if (!strcmp(pre, "qwen2")) {
        t->pre_name = "qwen2";
        return regex_add(t, RE_QWEN2);
    }
    if (strcmp(pre, "gpt2") && strcmp(pre, "gpt-2"))
        LOG_WARN(TOK_LOG, "unknown pre-tokenizer '%s'; using the GPT-2 pre-tokenizer", pre);
    t->pre_name = "gpt2";
    return regex_add(t, RE_GPT2);
}

/* ---------------------------------------------------------------- loading */

static baton_status_t get_opt_id(const gguf_file_t *f, const char *key, int32_t n_vocab,
                                 int32_t *id) {
    uint32_t v = 0;
    baton_status_t s = gguf_get_u32(f, key, &v);
    if (s == BATON_ERR_NOT_FOUND) return BATON_OK; /* keep default */
    if (s) return s;
    if ((int64_t)v >= n_vocab) {
        /* llama.cpp accepts -1 written as uint32 max for "none" */
        if (v == UINT32_MAX) { *id = -1; return BATON_OK; }
        return baton_error(BATON_ERR_FORMAT, "tokenizer: %s = %u is outside the vocabulary (%d)",
                           key, v, n_vocab);
    }
    *id = (int32_t)v;
    return BATON_OK;
}

static void get_opt_bool(const gguf_file_t *f, const char *key, bool *out) {
    bool v;
    if (gguf_get_bool(f, key, &v) == BATON_OK) *out = v;
}

static int cmp_special_len(const void *a, const void *b, void *ctx) {
    const tokenizer_t *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (t->text_len[x] != t->text_len[y]) return t->text_len[x] > t->text_len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Decoded bytes of token i for the piece cache (control tokens: their text;
 * the decode path decides whether to show it). */
static baton_status_t piece_of(const tokenizer_t *t, int32_t i, bytebuf_t *out) {
    const char *txt = t->text[i];
    size_t n = t->text_len[i];
    uint8_t ty = t->type[i];
    if (ty == TOKENIZER_TOKEN_CONTROL || ty == TOKENIZER_TOKEN_USER_DEFINED ||
        ty == TOKENIZER_TOKEN_UNKNOWN || ty == TOKENIZER_TOKEN_UNUSED) {
        if (t->kind == TOKENIZER_KIND_SPM && ty == TOKENIZER_TOKEN_UNKNOWN)
            return bytebuf_append(out, "\xe2\x96\x85", 3); /* llama.cpp renders <unk> as U+2585 */
        return bytebuf_append(out, txt, n);
    }
    if (t->kind == TOKENIZER_KIND_SPM) {
        if (ty == TOKENIZER_TOKEN_BYTE && n == 6 && !memcmp(txt, "<0x", 3) && txt[5] == '>') {
            char hex[3] = {txt[3], txt[4], 0};
            char *end;
            long v = strtol(hex, &end, 16);
            if (*end == 0) {
                char c = (char)v;
                return bytebuf_append(out, &c, 1);
            }
        }
        for (size_t k = 0; k < n;) {
            if (k + 3 <= n && !memcmp(txt + k, "\xe2\x96\x81", 3)) {
                baton_status_t s = bytebuf_append(out, " ", 1);
                if (s) return s;
                k += 3;
            } else {
                baton_status_t s = bytebuf_append(out, txt + k, 1);
                if (s) return s;
                k++;
            }
        }
        return BATON_OK;
    }
    /* byte-level BPE: each code point stands for one byte */
    const unsigned char *s = (const unsigned char *)txt;
    for (size_t k = 0; k < n;) {
        size_t l = utf8_seq_len(s + k, n - k);
        if (!l) l = 1;
        uint32_t cp = l ? utf8_get(s + k, l) : s[k];
        baton_status_t st;
        if (cp < 512 && g_cp_to_byte[cp] >= 0) {
            char c = (char)g_cp_to_byte[cp];
            st = bytebuf_append(out, &c, 1);
        } else {
            st = bytebuf_append(out, s + k, l); /* not a byte-level char: keep as is */
        }
        if (st) return st;
        k += l;
    }
    return BATON_OK;
}

/* Names of end-of-generation control tokens (llama.cpp special_eog_ids). */
static const char *const EOG_NAMES[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|eom_id|>", "<EOT>", "<|end_of_text|>", "<end_of_utterance>",
};

baton_status_t tokenizer_load(const gguf_file_t *file, tokenizer_t **out) {
    if (!file || !out) return baton_error(BATON_ERR_INVALID_ARG, "tokenizer_load: NULL argument");
    byte_tables_init();
    baton_status_t s;
    gguf_str_t model;
    if ((s = gguf_get_str(file, "tokenizer.ggml.model", &model))) {
        if (s == BATON_ERR_NOT_FOUND)
            return baton_error(s, "tokenizer: GGUF has no 'tokenizer.ggml.model' key");
        return s;
    }
    tokenizer_kind_t kind;
    if (gguf_str_eq(model, "gpt2")) kind = TOKENIZER_KIND_BPE;
    else if (gguf_str_eq(model, "llama")) kind = TOKENIZER_KIND_SPM;
    else
        return baton_error(BATON_ERR_UNSUPPORTED,
                           "tokenizer: tokenizer.ggml.model '%.*s' is not supported (gpt2, llama)",
                           (int)(model.len > 64 ? 64 : model.len), model.data);

    const gguf_kv_t *tokens;
    if ((s = gguf_get_arr(file, "tokenizer.ggml.tokens", GGUF_VALUE_STRING, &tokens))) {
        if (s == BATON_ERR_NOT_FOUND)
            return baton_error(s, "tokenizer: GGUF has no 'tokenizer.ggml.tokens' key");
        return s;
    }
    uint64_t nv = tokens->v.arr.n;
    if (nv == 0 || nv > (1u << 24))
        return baton_error(BATON_ERR_FORMAT, "tokenizer: tokenizer.ggml.tokens has %llu entries",
                           (unsigned long long)nv);

    tokenizer_t *t = calloc(1, sizeof(*t));
    if (!t) return baton_error(BATON_ERR_NO_MEMORY, "tokenizer: alloc");
    t->kind = kind;
    t->n_vocab = (int32_t)nv;
    bytebuf_t pieces = {0};

    size_t total = 0;
    for (uint64_t i = 0; i < nv; i++) total += tokens->v.arr.strs[i].len + 1;
    t->arena = malloc(total);
    t->text = calloc(nv, sizeof(*t->text));
    t->text_len = calloc(nv, sizeof(*t->text_len));
    t->score = calloc(nv, sizeof(*t->score));
    t->type = calloc(nv, 1);
    t->eog = calloc(nv, 1);
    t->piece_off = calloc(nv + 1, sizeof(*t->piece_off));
    t->special = calloc(nv, sizeof(*t->special));
    if (!t->arena || !t->text || !t->text_len || !t->score || !t->type || !t->eog ||
        !t->piece_off || !t->special) {
        s = baton_error(BATON_ERR_NO_MEMORY, "tokenizer: vocabulary of %llu", (unsigned long long)nv);
        goto fail;
    }
    if ((s = strmap_init(&t->vocab, nv))) goto fail;
    {
        char *p = t->arena;
        for (uint64_t i = 0; i < nv; i++) {
            gguf_str_t g = tokens->v.arr.strs[i];
            if (g.len > 4096) {
                s = baton_error(BATON_ERR_FORMAT, "tokenizer: token %llu is %llu bytes long",
                                (unsigned long long)i, (unsigned long long)g.len);
                goto fail;
            }
            memcpy(p, g.data, g.len);
            p[g.len] = '\0';
            t->text[i] = p;
            t->text_len[i] = (uint32_t)g.len;
            /* duplicates: the first id wins, like llama.cpp's token_to_id */
            strmap_put(&t->vocab, p, g.len, (int32_t)i);
            p += g.len + 1;
        }
    }

    /* token types */
    {
        const gguf_kv_t *kv = gguf_find_kv(file, "tokenizer.ggml.token_type");
        for (uint64_t i = 0; i < nv; i++) t->type[i] = TOKENIZER_TOKEN_NORMAL;
        if (kv) {
            if (kv->type != GGUF_VALUE_ARRAY || kv->v.arr.n != nv ||
                kv->v.arr.type == GGUF_VALUE_STRING || kv->v.arr.type == GGUF_VALUE_FLOAT32 ||
                kv->v.arr.type == GGUF_VALUE_FLOAT64) {
                s = baton_error(BATON_ERR_FORMAT,
                                "tokenizer: tokenizer.ggml.token_type must be an integer array of %llu",
                                (unsigned long long)nv);
                goto fail;
            }
            for (uint64_t i = 0; i < nv; i++) {
                int64_t ty = gguf_arr_i64(kv, i);
                t->type[i] = (ty >= 0 && ty <= 6) ? (uint8_t)ty : TOKENIZER_TOKEN_NORMAL;
            }
        }
    }
    /* scores */
    {
        const gguf_kv_t *kv = gguf_find_kv(file, "tokenizer.ggml.scores");
        if (kv) {
            if (kv->type != GGUF_VALUE_ARRAY || kv->v.arr.n != nv ||
                (kv->v.arr.type != GGUF_VALUE_FLOAT32 && kv->v.arr.type != GGUF_VALUE_FLOAT64)) {
                s = baton_error(BATON_ERR_FORMAT,
                                "tokenizer: tokenizer.ggml.scores must be a float array of %llu",
                                (unsigned long long)nv);
                goto fail;
            }
            for (uint64_t i = 0; i < nv; i++) t->score[i] = (float)gguf_arr_f64(kv, i);
        } else if (kind == TOKENIZER_KIND_SPM) {
            s = baton_error(BATON_ERR_NOT_FOUND,
                            "tokenizer: GGUF has no 'tokenizer.ggml.scores' key (needed by the llama tokenizer)");
            goto fail;
        }
    }
    /* merges */
    if (kind == TOKENIZER_KIND_BPE) {
        const gguf_kv_t *kv;
        if ((s = gguf_get_arr(file, "tokenizer.ggml.merges", GGUF_VALUE_STRING, &kv))) {
            if (s == BATON_ERR_NOT_FOUND)
                s = baton_error(s, "tokenizer: GGUF has no 'tokenizer.ggml.merges' key (needed by the gpt2 tokenizer)");
            goto fail;
        }
        uint64_t nm = kv->v.arr.n;
        size_t mt = 0;
        for (uint64_t i = 0; i < nm; i++) mt += kv->v.arr.strs[i].len + 1;
        t->merge_arena = malloc(mt + 1);
        if (!t->merge_arena) { s = baton_error(BATON_ERR_NO_MEMORY, "tokenizer: merges"); goto fail; }
        if ((s = strmap_init(&t->merges, nm))) goto fail;
        char *p = t->merge_arena;
        for (uint64_t i = 0; i < nm; i++) {
            gguf_str_t g = kv->v.arr.strs[i];
            const char *sp = g.len > 1 ? memchr(g.data + 1, ' ', g.len - 1) : NULL;
            if (!sp || (uint64_t)(sp - g.data) + 1 >= g.len) {
                s = baton_error(BATON_ERR_FORMAT, "tokenizer: merge %llu ('%.*s') is not 'left right'",
                                (unsigned long long)i, (int)(g.len > 64 ? 64 : g.len), g.data);
                goto fail;
            }
            memcpy(p, g.data, g.len);
            p[g.len] = '\0';
            strmap_put(&t->merges, p, g.len, (int32_t)i);
            p += g.len + 1;
        }
    }

    /* special ids and flags; defaults as llama.cpp llama_vocab::load */
    if (kind == TOKENIZER_KIND_SPM) {
        t->bos = 1; t->eos = 2; t->unk = 0; t->eot = -1; t->eom = -1; t->pad = -1;
        t->add_bos = true; t->add_eos = false; t->add_space_prefix = true;
    } else {
        t->bos = -1; t->eos = -1; t->unk = -1; t->eot = -1; t->eom = -1; t->pad = -1;
        t->add_bos = false; t->add_eos = false; t->add_space_prefix = false;
    }
    if (t->bos >= t->n_vocab) t->bos = -1;
    if (t->eos >= t->n_vocab) t->eos = -1;
    if (t->unk >= t->n_vocab) t->unk = -1;
    if ((s = get_opt_id(file, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos))) goto fail;
    if ((s = get_opt_id(file, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos))) goto fail;
    if ((s = get_opt_id(file, "tokenizer.ggml.eot_token_id", t->n_vocab, &t->eot))) goto fail;
    if ((s = get_opt_id(file, "tokenizer.ggml.eom_token_id", t->n_vocab, &t->eom))) goto fail;
    if ((s = get_opt_id(file, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk))) goto fail;
    if ((s = get_opt_id(file, "tokenizer.ggml.padding_token_id", t->n_vocab, &t->pad))) goto fail;
    get_opt_bool(file, "tokenizer.ggml.add_bos_token", &t->add_bos);
    get_opt_bool(file, "tokenizer.ggml.add_eos_token", &t->add_eos);
    get_opt_bool(file, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix);
    if (t->add_bos && t->bos < 0) t->add_bos = false;
    if (t->add_eos && t->eos < 0) t->add_eos = false;

    /* end of generation */
    for (size_t k = 0; k < sizeof(EOG_NAMES) / sizeof(EOG_NAMES[0]); k++) {
        int32_t id = strmap_get(&t->vocab, EOG_NAMES[k], strlen(EOG_NAMES[k]));
        if (id < 0) continue;
        if (t->type[id] != TOKENIZER_TOKEN_CONTROL && t->type[id] != TOKENIZER_TOKEN_USER_DEFINED)
            continue; /* a plain-text piece of that spelling is not a stop */
        if (t->eot < 0 && k < 4) t->eot = id;
        t->eog[id] = 1;
    }
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    if (t->eom >= 0) t->eog[t->eom] = 1;

    /* special tokens for partitioning, longest text first */
    for (int32_t i = 0; i < t->n_vocab; i++) {
        uint8_t ty = t->type[i];
        if ((ty == TOKENIZER_TOKEN_CONTROL || ty == TOKENIZER_TOKEN_USER_DEFINED ||
             ty == TOKENIZER_TOKEN_UNKNOWN) && t->text_len[i] > 0)
            t->special[t->n_special++] = i;
    }
    qsort_r(t->special, t->n_special, sizeof(int32_t), cmp_special_len, t);

    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", b);
        t->byte_token[b] = kind == TOKENIZER_KIND_SPM ? strmap_get(&t->vocab, name, 6) : -1;
    }

    /* pre-tokenizer */
    {
        char pre[64] = "gpt2";
        gguf_str_t g;
        if (gguf_get_str(file, "tokenizer.ggml.pre", &g) == BATON_OK) {
            size_t n = g.len < sizeof(pre) - 1 ? g.len : sizeof(pre) - 1;
            memcpy(pre, g.data, n);
            pre[n] = 0;
        } else if (kind == TOKENIZER_KIND_BPE) {
            LOG_WARN(TOK_LOG, "no tokenizer.ggml.pre key; using the GPT-2 pre-tokenizer");
        }
        if ((s = pre_setup(t, pre))) goto fail;
    }

    /* piece cache */
    for (int32_t i = 0; i < t->n_vocab; i++) {
        t->piece_off[i] = pieces.len;
        if ((s = piece_of(t, i, &pieces))) goto fail;
    }
    t->piece_off[t->n_vocab] = pieces.len;
    t->piece_arena = pieces.data;
    pieces.data = NULL;

    LOG_DEBUG(TOK_LOG, "loaded %s tokenizer: %d tokens, pre=%s, bos=%d eos=%d eot=%d",
              kind == TOKENIZER_KIND_BPE ? "gpt2" : "llama", t->n_vocab, t->pre_name, t->bos,
              t->eos, t->eot);
    *out = t;
    return BATON_OK;

fail:
    free(pieces.data);
    tokenizer_free(t);
    return s;
}

void tokenizer_free(tokenizer_t *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
    strmap_free(&t->vocab);
    strmap_free(&t->merges);
    free(t->merge_arena);
    free(t->arena);
    free(t->text);
    free(t->text_len);
    free(t->score);
    free(t->type);
    free(t->eog);
    free(t->piece_arena);
    free(t->piece_off);
    free(t->special);
    free(t);
}

/* ---------------------------------------------------------------- accessors */

tokenizer_kind_t tokenizer_kind(const tokenizer_t *t) { return t->kind; }
int32_t tokenizer_n_vocab(const tokenizer_t *t) { return t->n_vocab; }
int32_t tokenizer_bos(const tokenizer_t *t) { return t->bos; }
int32_t tokenizer_eos(const tokenizer_t *t) { return t->eos; }
int32_t tokenizer_eot(const tokenizer_t *t) { return t->eot; }
int32_t tokenizer_pad(const tokenizer_t *t) { return t->pad; }
int32_t tokenizer_unk(const tokenizer_t *t) { return t->unk; }
bool tokenizer_add_bos(const tokenizer_t *t) { return t->add_bos; }
bool tokenizer_add_eos(const tokenizer_t *t) { return t->add_eos; }
const char *tokenizer_pre_name(const tokenizer_t *t) { return t->pre_name; }

bool tokenizer_is_eog(const tokenizer_t *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

const char *tokenizer_token_text(const tokenizer_t *t, int32_t id) {
    return (id >= 0 && id < t->n_vocab) ? t->text[id] : NULL;
}

tokenizer_token_type_t tokenizer_token_type(const tokenizer_t *t, int32_t id) {
    return (id >= 0 && id < t->n_vocab) ? (tokenizer_token_type_t)t->type[id]
                                        : TOKENIZER_TOKEN_UNDEFINED;
}

int32_t tokenizer_token_id(const tokenizer_t *t, const char *text) {
    if (!t || !text) return -1;
    return strmap_get(&t->vocab, text, strlen(text));
}

/* ---------------------------------------------------------------- output */

typedef struct idvec {
    int32_t *ids;
    size_t n, cap;
} idvec_t;

static baton_status_t idvec_push(idvec_t *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->ids, cap * sizeof(*p));
        if (!p) return baton_error(BATON_ERR_NO_MEMORY, "tokenizer: %zu ids", cap);
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return BATON_OK;
}

/* ---------------------------------------------------------------- BPE core */

typedef struct sym {
    int32_t prev, next;
    uint32_t off, n; /* bytes in the word buffer; n == 0 once merged away */
} sym_t;

typedef struct bigram {
    double key;      /* lower pops first: BPE rank, or -score for SPM */
    int32_t left, right;
    uint32_t size;   /* bytes of left+right when queued */
} bigram_t;

typedef struct heap {
    bigram_t *a;
    size_t n, cap;
} heap_t;

static bool bigram_before(const bigram_t *x, const bigram_t *y) {
    if (x->key != y->key) return x->key < y->key;
    return x->left < y->left;
}

static baton_status_t heap_push(heap_t *h, bigram_t b) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        bigram_t *p = realloc(h->a, cap * sizeof(*p));
        if (!p) return baton_error(BATON_ERR_NO_MEMORY, "tokenizer: bigram queue of %zu", cap);
        h->a = p;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bigram_before(&b, &h->a[parent])) break;
        h->a[i] = h->a[parent];
        i = parent;
    }
    h->a[i] = b;
    return BATON_OK;
}

static bigram_t heap_pop(heap_t *h) {
    bigram_t top = h->a[0];
    bigram_t last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && bigram_before(&h->a[c + 1], &h->a[c])) c++;
        if (!bigram_before(&h->a[c], &last)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n) h->a[i] = last;
    return top;
}

/* Scratch state reused across words of one encode call. */
typedef struct work {
    bytebuf_t word;   /* current word (byte-level encoded for BPE, U+2581 for SPM) */
    bytebuf_t key;    /* "left right" lookups */
    sym_t *syms;
    size_t n_syms, cap_syms;
    heap_t heap;
} work_t;

static void work_free(work_t *w) {
    free(w->word.data);
    free(w->key.data);
    free(w->syms);
    free(w->heap.a);
}

static baton_status_t split_symbols(work_t *w) {
    size_t n = w->word.len;
    if (n > w->cap_syms) {
        sym_t *p = realloc(w->syms, n * sizeof(*p));
        if (!p) return baton_error(BATON_ERR_NO_MEMORY, "tokenizer: %zu symbols", n);
        w->syms = p;
        w->cap_syms = n;
    }
    const unsigned char *s = (const unsigned char *)w->word.data;
    size_t k = 0, off = 0;
    while (off < n) {
        size_t l = utf8_seq_len(s + off, n - off);
        if (!l) l = 1;
        w->syms[k].off = (uint32_t)off;
        w->syms[k].n = (uint32_t)l;
        w->syms[k].prev = (int32_t)k - 1;
        off += l;
        w->syms[k].next = off == n ? -1 : (int32_t)k + 1;
        k++;
    }
    w->n_syms = k;
    w->heap.n = 0;
    return BATON_OK;
}

/* Queues the bigram (left, right) when the merge exists. */
static baton_status_t add_bigram(const tokenizer_t *t, work_t *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return BATON_OK;
    const sym_t *l = &w->syms[left], *r = &w->syms[right];
    const char *base = w->word.data;
    bigram_t b = {.left = left, .right = right, .size = l->n + r->n};
    if (t->kind == TOKENIZER_KIND_BPE) {
        w->key.len = 0;
        baton_status_t s;
        if ((s = bytebuf_append(&w->key, base + l->off, l->n))) return s;
        if ((s = bytebuf_append(&w->key, " ", 1))) return s;
        if ((s = bytebuf_append(&w->key, base + r->off, r->n))) return s;
        int32_t rank = strmap_get(&t->merges, w->key.data, w->key.len);
        if (rank < 0) return BATON_OK;
        b.key = rank;
    } else {
        /* symbols are contiguous in the word buffer */
        int32_t id = strmap_get(&t->vocab, base + l->off, l->n + r->n);
        if (id < 0) return BATON_OK;
        b.key = -(double)t->score[id];
    }
    return heap_push(&w->heap, b);
}

/* Runs the merge loop over w->syms. */
static baton_status_t merge_word(const tokenizer_t *t, work_t *w) {
    baton_status_t s;
    for (size_t i = 1; i < w->n_syms; i++)
        if ((s = add_bigram(t, w, (int32_t)i - 1, (int32_t)i))) return s;
    while (w->heap.n) {
        bigram_t b = heap_pop(&w->heap);
        sym_t *l = &w->syms[b.left], *r = &w->syms[b.right];
        if (l->n == 0 || r->n == 0 || l->next != b.right || l->n + r->n != b.size)
            continue; /* stale: one side changed since it was queued */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w->syms[r->next].prev = b.left;
        if ((s = add_bigram(t, w, l->prev, b.left))) return s;
        if ((s = add_bigram(t, w, b.left, l->next))) return s;
    }
    return BATON_OK;
}

/* Byte-level BPE of one pre-tokenized word (raw bytes). */
static baton_status_t bpe_word(const tokenizer_t *t, work_t *w, const char *p, size_t n,
                               idvec_t *out) {
    baton_status_t s;
    w->word.len = 0;
    if ((s = bytebuf_reserve(&w->word, n * 2))) return s;
    for (size_t i = 0; i < n; i++) {
        char enc[4];
        size_t l = utf8_put(enc, g_byte_to_cp[(unsigned char)p[i]]);
        memcpy(w->word.data + w->word.len, enc, l);
        w->word.len += l;
    }
    w->word.data[w->word.len] = 0;
    if (t->ignore_merges) {
        int32_t id = strmap_get(&t->vocab, w->word.data, w->word.len);
        if (id >= 0) return idvec_push(out, id);
    }
    if ((s = split_symbols(w))) return s;
    if ((s = merge_word(t, w))) return s;
    for (int32_t i = w->n_syms ? 0 : -1; i >= 0; i = w->syms[i].next) {
        const sym_t *y = &w->syms[i];
        int32_t id = strmap_get(&t->vocab, w->word.data + y->off, y->n);
        if (id >= 0) {
            if ((s = idvec_push(out, id))) return s;
            continue;
        }
        /* not in the vocabulary: llama.cpp looks up each byte of the
         * encoded symbol as a one-byte token and drops what it cannot find
         * (e.g. SmolLM2 has no token for the byte 0x04) */
        const char *q = w->word.data + y->off;
        for (uint32_t k = 0; k < y->n; k++) {
            int32_t bid = strmap_get(&t->vocab, q + k, 1);
            if (bid >= 0 && (s = idvec_push(out, bid))) return s;
        }
    }
    return BATON_OK;
}

/* SentencePiece-style BPE of one text fragment (raw bytes, spaces already
 * escaped to U+2581 in w->word). */
static baton_status_t spm_resegment(const tokenizer_t *t, const char *p, size_t n, idvec_t *out) {
    int32_t id = strmap_get(&t->vocab, p, n);
    if (id >= 0) return idvec_push(out, id);
    for (size_t i = 0; i < n; i++) {
        int32_t bid = t->byte_token[(unsigned char)p[i]];
        if (bid < 0) {
            /* no byte fallback: one <unk> per character */
            size_t l = utf8_seq_len((const unsigned char *)p + i, n - i);
            if (l > 1) i += l - 1;
            bid = t->unk;
        }
        if (bid >= 0) {
            baton_status_t s = idvec_push(out, bid);
            if (s) return s;
        }
    }
    return BATON_OK;
}

static baton_status_t spm_fragment(const tokenizer_t *t, work_t *w, const char *p, size_t n,
                                   bool prefix_space, idvec_t *out) {
    baton_status_t s;
    w->word.len = 0;
    if ((s = bytebuf_reserve(&w->word, n * 3 + 3))) return s;
    if (prefix_space) {
        memcpy(w->word.data, "\xe2\x96\x81", 3);
        w->word.len = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (p[i] == ' ') {
            memcpy(w->word.data + w->word.len, "\xe2\x96\x81", 3);
            w->word.len += 3;
        } else {
            w->word.data[w->word.len++] = p[i];
        }
    }
    w->word.data[w->word.len] = 0;
    if (w->word.len == 0) return BATON_OK;
    if ((s = split_symbols(w))) return s;
    if ((s = merge_word(t, w))) return s;
    for (int32_t i = 0; i >= 0; i = w->syms[i].next) {
        const sym_t *y = &w->syms[i];
        if ((s = spm_resegment(t, w->word.data + y->off, y->n, out))) return s;
    }
    return BATON_OK;
}

/* ---------------------------------------------------------------- encode */

typedef struct frag {
    int32_t id; /* -1: raw text */
    size_t off, len;
} frag_t;

typedef struct fragvec {
    frag_t *a;
    size_t n, cap;
} fragvec_t;

static baton_status_t frag_push(fragvec_t *v, frag_t f) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        frag_t *p = realloc(v->a, cap * sizeof(*p));
        if (!p) return baton_error(BATON_ERR_NO_MEMORY, "tokenizer: %zu fragments", cap);
        v->a = p;
        v->cap = cap;
    }
    v->a[v->n++] = f;
    return BATON_OK;
}

/* llama.cpp tokenizer_st_partition: each special token (longest first)
 * splits every raw fragment at each of its occurrences. */
static baton_status_t partition_special(const tokenizer_t *t, const char *text, size_t len,
                                        bool parse_special, bool user_defined, fragvec_t *frags) {
    baton_status_t s = BATON_OK;
    fragvec_t tmp = {0};
    frags->n = 0;
    if (len == 0) return BATON_OK;
    if ((s = frag_push(frags, (frag_t){-1, 0, len}))) return s;
    for (size_t k = 0; k < t->n_special; k++) {
        int32_t sid = t->special[k];
        uint8_t ty = t->type[sid];
        if (!parse_special && (ty == TOKENIZER_TOKEN_CONTROL || ty == TOKENIZER_TOKEN_UNKNOWN))
            continue;
        if (!user_defined && ty == TOKENIZER_TOKEN_USER_DEFINED) continue;
        const char *st = t->text[sid];
        size_t sl = t->text_len[sid];
        bool any = false;
        for (size_t i = 0; i < frags->n && !any; i++)
            if (frags->a[i].id < 0 && frags->a[i].len >= sl &&
                memmem(text + frags->a[i].off, frags->a[i].len, st, sl))
                any = true;
        if (!any) continue;
        tmp.n = 0;
        for (size_t i = 0; i < frags->n; i++) {
            frag_t f = frags->a[i];
            if (f.id >= 0) {
                if ((s = frag_push(&tmp, f))) goto out;
                continue;
            }
            size_t off = f.off, end = f.off + f.len;
            while (off < end) {
                const char *m = end - off >= sl ? memmem(text + off, end - off, st, sl) : NULL;
                if (!m) {
                    if ((s = frag_push(&tmp, (frag_t){-1, off, end - off}))) goto out;
                    break;
                }
                size_t mo = (size_t)(m - text);
                if (mo > off && (s = frag_push(&tmp, (frag_t){-1, off, mo - off}))) goto out;
                if ((s = frag_push(&tmp, (frag_t){sid, mo, sl}))) goto out;
                off = mo + sl;
            }
        }
        fragvec_t sw = *frags;
        *frags = tmp;
        tmp = sw;
    }
out:
    free(tmp.a);
    return s;
}

/* Applies the pre-tokenizer regexes in turn; each splits every span into
 * its matches and the unmatched gaps (llama.cpp unicode_regex_split). */
static baton_status_t pre_split(const tokenizer_t *t, const char *text, size_t off, size_t len,
                                fragvec_t *spans, fragvec_t *tmp, pcre2_match_data *md) {
    baton_status_t s;
    spans->n = 0;
    if ((s = frag_push(spans, (frag_t){-1, off, len}))) return s;
    for (size_t r = 0; r < t->n_re; r++) {
        tmp->n = 0;
        for (size_t i = 0; i < spans->n; i++) {
            const char *sub = text + spans->a[i].off;
            size_t sublen = spans->a[i].len, pos = 0, gap = 0;
            while (pos < sublen) {
                int rc = pcre2_match(t->re[r], (PCRE2_SPTR)sub, sublen, pos, PCRE2_NO_UTF_CHECK, md,
                                     NULL);
                if (rc == PCRE2_ERROR_NOMATCH) break;
                if (rc < 0) {
                    PCRE2_UCHAR msg[256];
                    pcre2_get_error_message(rc, msg, sizeof(msg));
                    return baton_error(BATON_ERR_INTERNAL, "tokenizer: pre-tokenizer regex: %s",
                                       (const char *)msg);
                }
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
                size_t ms = ov[0], me = ov[1];
                if (me == ms) { /* empty match: step one character */
                    size_t l = utf8_seq_len((const unsigned char *)sub + me, sublen - me);
                    pos = me + (l ? l : 1);
                    continue;
                }
                if (ms > gap && (s = frag_push(tmp, (frag_t){-1, spans->a[i].off + gap, ms - gap})))
                    return s;
                if ((s = frag_push(tmp, (frag_t){-1, spans->a[i].off + ms, me - ms}))) return s;
                gap = pos = me;
            }
            if (gap < sublen &&
                (s = frag_push(tmp, (frag_t){-1, spans->a[i].off + gap, sublen - gap})))
                return s;
        }
        fragvec_t sw = *spans;
        *spans = *tmp;
        *tmp = sw;
    }
    return BATON_OK;
}

static baton_status_t encode_vec(const tokenizer_t *t, const char *text, size_t len,
                                 uint32_t flags, idvec_t *out) {
    if (!t || (!text && len)) return baton_error(BATON_ERR_INVALID_ARG, "tokenizer_encode: NULL argument");
    if (len > TOKENIZER_MAX_INPUT_BYTES)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "tokenizer: input of %zu bytes exceeds the %zu byte limit",
                           len, TOKENIZER_MAX_INPUT_BYTES);
    size_t valid = tokenizer_utf8_valid_prefix(text, len);
    if (valid != len)
        return baton_error(BATON_ERR_INVALID_ARG, "tokenizer: input is not valid UTF-8 at byte %zu (0x%02x)",
                           valid, (unsigned)(unsigned char)text[valid]);

    baton_status_t s = BATON_OK;
    fragvec_t frags = {0}, spans = {0}, tmp = {0};
    work_t w = {0};
    pcre2_match_data *md = NULL;
    bool add_special = (flags & TOKENIZER_ENCODE_ADD_SPECIAL) != 0;

    if (t->n_re) {
        md = pcre2_match_data_create_from_pattern(t->re[0], NULL);
        for (size_t r = 1; md && r < t->n_re; r++) {
            /* one match data large enough for every pattern */
            pcre2_match_data *m2 = pcre2_match_data_create_from_pattern(t->re[r], NULL);
            if (!m2) { pcre2_match_data_free(md); md = NULL; break; }
            if (pcre2_get_ovector_count(m2) > pcre2_get_ovector_count(md)) {
                pcre2_match_data_free(md);
                md = m2;
            } else {
                pcre2_match_data_free(m2);
            }
        }
        if (!md) return baton_error(BATON_ERR_NO_MEMORY, "tokenizer: regex match data");
    }
    if ((s = partition_special(t, text, len, (flags & TOKENIZER_ENCODE_PARSE_SPECIAL) != 0,
                               !(flags & TOKENIZER_ENCODE_NO_USER_DEFINED), &frags)))
        goto out;
    if (add_special && t->add_bos && (s = idvec_push(out, t->bos))) goto out;
    bool prev_special = true;
    for (size_t i = 0; i < frags.n; i++) {
        frag_t f = frags.a[i];
        if (f.id >= 0) {
            if ((s = idvec_push(out, f.id))) goto out;
            prev_special = true;
            continue;
        }
        if (t->kind == TOKENIZER_KIND_SPM) {
            if ((s = spm_fragment(t, &w, text + f.off, f.len, t->add_space_prefix && prev_special, out)))
                goto out;
        } else {
            if ((s = pre_split(t, text, f.off, f.len, &spans, &tmp, md))) goto out;
            for (size_t k = 0; k < spans.n; k++)
                if ((s = bpe_word(t, &w, text + spans.a[k].off, spans.a[k].len, out))) goto out;
        }
        prev_special = false;
    }
    if (add_special && t->add_eos && (s = idvec_push(out, t->eos))) goto out;
out:
    pcre2_match_data_free(md);
    free(frags.a);
    free(spans.a);
    free(tmp.a);
    work_free(&w);
    return s;
}

baton_status_t tokenizer_encode_alloc(const tokenizer_t *t, const char *text, size_t len,
                                      uint32_t flags, int32_t **ids_out, size_t *n_out) {
    if (!ids_out || !n_out) return baton_error(BATON_ERR_INVALID_ARG, "tokenizer_encode_alloc: NULL output");
    idvec_t v = {0};
    baton_status_t s = encode_vec(t, text, len, flags, &v);
    if (s) {
        free(v.ids);
        return s;
    }
    *ids_out = v.ids;
    *n_out = v.n;
    return BATON_OK;
}

baton_status_t tokenizer_encode(const tokenizer_t *t, const char *text, size_t len, uint32_t flags,
                                int32_t *ids, size_t cap, size_t *n_out) {
    if (!n_out || (!ids && cap)) return baton_error(BATON_ERR_INVALID_ARG, "tokenizer_encode: NULL output");
    idvec_t v = {0};
    baton_status_t s = encode_vec(t, text, len, flags, &v);
    if (s) {
        free(v.ids);
        return s;
    }
    if (v.n > cap) {
        free(v.ids);
        return baton_error(BATON_ERR_NO_SPACE, "tokenizer: %zu ids do not fit in %zu", v.n, cap);
    }
    if (v.n) memcpy(ids, v.ids, v.n * sizeof(*ids));
    free(v.ids);
    *n_out = v.n;
    return BATON_OK;
}

/* ---------------------------------------------------------------- decode */

/* Piece of `id` under decode flags, pointing into the piece cache. */
static void piece_view(const tokenizer_t *t, int32_t id, uint32_t flags, const char **p, size_t *n) {
    uint8_t ty = t->type[id];
    bool hidden = (ty == TOKENIZER_TOKEN_CONTROL || ty == TOKENIZER_TOKEN_UNKNOWN ||
                   ty == TOKENIZER_TOKEN_UNUSED) && !(flags & TOKENIZER_DECODE_SPECIAL);
    *p = t->piece_arena + t->piece_off[id];
    *n = hidden ? 0 : t->piece_off[id + 1] - t->piece_off[id];
}

baton_status_t tokenizer_token_to_piece(const tokenizer_t *t, int32_t id, uint32_t flags,
                                        char *buf, size_t cap, size_t *n_out) {
    if (!t || !n_out || (!buf && cap)) return baton_error(BATON_ERR_INVALID_ARG, "tokenizer_token_to_piece: NULL argument");
    if (id < 0 || id >= t->n_vocab)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "tokenizer: token id %d outside [0, %d)", id, t->n_vocab);
    const char *p;
    size_t n;
    piece_view(t, id, flags, &p, &n);
    if (n > cap) return baton_error(BATON_ERR_NO_SPACE, "tokenizer: piece of token %d needs %zu bytes", id, n);
    if (n) memcpy(buf, p, n);
    *n_out = n;
    return BATON_OK;
}

static bool strips_space(const tokenizer_t *t, uint32_t flags) {
    return t->kind == TOKENIZER_KIND_SPM && t->add_space_prefix &&
           !(flags & TOKENIZER_DECODE_KEEP_LEADING_SPACE);
}

baton_status_t tokenizer_decode(const tokenizer_t *t, const int32_t *ids, size_t n, uint32_t flags,
                                char **text_out, size_t *len_out) {
    if (!t || (!ids && n) || !text_out || !len_out)
        return baton_error(BATON_ERR_INVALID_ARG, "tokenizer_decode: NULL argument");
    bytebuf_t raw = {0}, res = {0};
    baton_status_t s = BATON_OK;
    bool strip = strips_space(t, flags);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab) {
            s = baton_error(BATON_ERR_OUT_OF_RANGE, "tokenizer: id %d at index %zu outside [0, %d)",
                            ids[i], i, t->n_vocab);
            goto fail;
        }
        const char *p;
        size_t pn;
        piece_view(t, ids[i], flags, &p, &pn);
        if (strip && pn) {
            if (p[0] == ' ') { p++; pn--; }
            strip = false;
        }
        if ((s = bytebuf_append(&raw, p, pn))) goto fail;
    }
    size_t used = 0;
    if ((s = bytebuf_reserve(&res, raw.len))) goto fail;
    if ((s = utf8_sanitize(raw.data ? raw.data : "", raw.len, true, &res, &used))) goto fail;
    free(raw.data);
    *text_out = res.data;
    *len_out = res.len;
    return BATON_OK;
fail:
    free(raw.data);
    free(res.data);
    return s;
}

/* ---------------------------------------------------------------- detok */

struct detok {
    const tokenizer_t *tok;
    uint32_t flags;
    bool strip_pending;
    char held[4];   /* incomplete trailing UTF-8 sequence (at most 3 bytes) */
    size_t n_held;
    bytebuf_t raw;  /* held + new piece */
    bytebuf_t out;  /* returned text */
};

baton_status_t detok_init(const tokenizer_t *tok, uint32_t flags, detok_t **out) {
    if (!tok || !out) return baton_error(BATON_ERR_INVALID_ARG, "detok_init: NULL argument");
    detok_t *d = calloc(1, sizeof(*d));
    if (!d) return baton_error(BATON_ERR_NO_MEMORY, "detok: alloc");
    d->tok = tok;
    d->flags = flags;
    d->strip_pending = strips_space(tok, flags);
    *out = d;
    return BATON_OK;
}

void detok_free(detok_t *d) {
    if (!d) return;
    free(d->raw.data);
    free(d->out.data);
    free(d);
}

baton_status_t detok_push(detok_t *d, int32_t id, const char **text, size_t *len) {
    if (!d || !text || !len) return baton_error(BATON_ERR_INVALID_ARG, "detok_push: NULL argument");
    const tokenizer_t *t = d->tok;
    if (id < 0 || id >= t->n_vocab)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "detok: token id %d outside [0, %d)", id, t->n_vocab);
    const char *p;
    size_t pn;
    piece_view(t, id, d->flags, &p, &pn);
    bool strip = d->strip_pending;
    if (strip && pn) {
        if (p[0] == ' ') { p++; pn--; }
        strip = false;
    }
    baton_status_t s;
    d->raw.len = 0;
    d->out.len = 0;
    if ((s = bytebuf_append(&d->raw, d->held, d->n_held))) return s;
    if ((s = bytebuf_append(&d->raw, p, pn))) return s;
    if ((s = bytebuf_reserve(&d->out, d->raw.len))) return s;
    size_t used = 0;
    if ((s = utf8_sanitize(d->raw.data, d->raw.len, false, &d->out, &used))) return s;
    d->n_held = d->raw.len - used; /* < 4: only a valid incomplete prefix is held */
    memcpy(d->held, d->raw.data + used, d->n_held);
    d->strip_pending = strip;
    *text = d->out.data ? d->out.data : "";
    *len = d->out.len;
    return BATON_OK;
}

baton_status_t detok_flush(detok_t *d, const char **text, size_t *len) {
    if (!d || !text || !len) return baton_error(BATON_ERR_INVALID_ARG, "detok_flush: NULL argument");
    baton_status_t s;
    d->out.len = 0;
    if ((s = bytebuf_reserve(&d->out, d->n_held * 3))) return s;
    size_t used = 0;
    if ((s = utf8_sanitize(d->held, d->n_held, true, &d->out, &used))) return s;
    d->n_held = 0;
    d->strip_pending = strips_space(d->tok, d->flags);
    *text = d->out.data ? d->out.data : "";
    *len = d->out.len;
    return BATON_OK;
}
