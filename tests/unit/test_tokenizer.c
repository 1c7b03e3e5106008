/* Byte-level BPE tokenizer against llama.cpp on the default model
 * (SmolLM2-135M-Instruct): tests/data/tokenizer_smollm2.txt was written by
 * tests/golden/gen_tokenizer_smollm2.py with llama-cpp-python. Checks
 * encode == golden for every case, decode(encode(s)) == s, the streaming
 * detokenizer against the one-shot decode, and bad inputs. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf.h"
#include "common/tokenizer.h"
#include "tests/test_util.h"
#include "tests/unit/test_tokenizer_util.h"

/* g_has_byte[b]: the vocabulary has a token for the single byte b */
static bool g_has_byte[256];

static void find_byte_tokens(const tokenizer_t *tok) {
    for (int32_t id = 0; id < tokenizer_n_vocab(tok); id++) {
        char buf[8];
        size_t n = 0;
        if (tokenizer_token_to_piece(tok, id, 0, buf, sizeof(buf), &n) == BATON_OK && n == 1)
            g_has_byte[(unsigned char)buf[0]] = true;
    }
}

static void test_golden(const tokenizer_t *tok) {
    find_byte_tokens(tok);
    /* SmolLM2 lacks byte tokens for 0x04 0x06 0x13 0x14 0x16 0x1d (llama.cpp
     * cannot encode them either) */
    CHECK(!g_has_byte[0x04] && g_has_byte['a'] && g_has_byte[0xE6]);
    char *data = tt_read_source_file("tests/data/tokenizer_smollm2.txt");
    CHECK(data != NULL);
    if (!data) return;
    size_t n_cases = 0, n_ok = 0;
    char *line = data;
    while (*line) {
        char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        if (len && line[0] != '#') {
            const char *f[3];
            size_t fl[3];
            size_t nf = tt_fields(line, len, f, fl, 3);
            CHECK_EQ_INT(nf, 3);
            if (nf == 3) {
                bool special = f[0][0] == '1';
                size_t text_len, n_want;
                char *text = tt_unhex(f[1], fl[1], &text_len);
                int32_t *want = tt_parse_ids(f[2], fl[2], &n_want);
                int32_t *got = NULL;
                size_t n_got = 0;
                uint32_t flags = special ? TOKENIZER_ENCODE_PARSE_SPECIAL : 0;
                baton_status_t s = tokenizer_encode_alloc(tok, text, text_len, flags, &got, &n_got);
                CHECK_MSG(s == BATON_OK, "case %zu: %s", n_cases, baton_last_error());
                bool same = s == BATON_OK && n_got == n_want &&
                            (n_got == 0 || memcmp(got, want, n_got * sizeof(int32_t)) == 0);
                CHECK_MSG(same, "case %zu (%.*s): ids differ from llama.cpp (%zu vs %zu ids)", n_cases,
                          (int)(text_len > 60 ? 60 : text_len), text, n_got, n_want);
                if (!same && s == BATON_OK) {
                    fprintf(stderr, "  got :");
                    for (size_t i = 0; i < n_got && i < 40; i++) fprintf(stderr, " %d", got[i]);
                    fprintf(stderr, "\n  want:");
                    for (size_t i = 0; i < n_want && i < 40; i++) fprintf(stderr, " %d", want[i]);
                    fprintf(stderr, "\n");
                }
                /* also through the fixed-capacity API */
                if (n_want > 0) {
                    int32_t *buf = malloc(n_want * sizeof(int32_t));
                    size_t n2 = 0;
                    CHECK_OK(tokenizer_encode(tok, text, text_len, flags, buf, n_want, &n2));
                    CHECK_EQ_INT(n2, n_want);
                    free(buf);
                }
                /* round trip: plain text decodes to itself; parsed special
                 * tokens come back with TOKENIZER_DECODE_SPECIAL */
                uint32_t dflags = special ? TOKENIZER_DECODE_SPECIAL : 0;
                char *dec = NULL;
                size_t dl = 0;
                if (s == BATON_OK) {
                    /* bytes without a byte-level token are dropped (as by
                     * llama.cpp); everything else comes back */
                    size_t kl = 0;
                    for (size_t i = 0; i < text_len; i++)
                        if (g_has_byte[(unsigned char)text[i]]) text[kl++] = text[i];
                    CHECK_OK(tokenizer_decode(tok, got, n_got, dflags, &dec, &dl));
                    CHECK_MSG(dec && dl == kl && memcmp(dec, text, dl) == 0,
                              "case %zu: decode(encode(s)) != s", n_cases);
                    char label[64];
                    snprintf(label, sizeof(label), "case %zu", n_cases);
                    t_failures += tt_check_stream(tok, got, n_got, dflags, label);
                }
                if (same) n_ok++;
                free(dec);
                free(got);
                free(want);
                free(text);
                n_cases++;
            }
        }
        line += len + (nl ? 1 : 0);
    }
    fprintf(stderr, "golden: %zu/%zu cases match llama.cpp\n", n_ok, n_cases);
    CHECK(n_cases >= 200);
    free(data);
}

static void test_metadata(const tokenizer_t *tok) {
    /* values of the model file's tokenizer.* keys (read with the gguf
     * Python package) */
    CHECK_EQ_INT(tokenizer_kind(tok), TOKENIZER_KIND_BPE);
    CHECK_EQ_INT(tokenizer_n_vocab(tok), 49152);
    CHECK_EQ_INT(tokenizer_bos(tok), 1);
    CHECK_EQ_INT(tokenizer_eos(tok), 2);
    CHECK_EQ_INT(tokenizer_pad(tok), 2);
    CHECK_EQ_INT(tokenizer_unk(tok), 0);
    CHECK(!tokenizer_add_bos(tok));
    CHECK(strcmp(tokenizer_pre_name(tok), "smollm") == 0);
    CHECK_EQ_INT(tokenizer_token_id(tok, "<|im_start|>"), 1);
    CHECK_EQ_INT(tokenizer_token_id(tok, "<|im_end|>"), 2);
    CHECK_EQ_INT(tokenizer_token_id(tok, "<|endoftext|>"), 0);
    CHECK_EQ_INT(tokenizer_token_id(tok, "no such token text"), -1);
    CHECK(tokenizer_is_eog(tok, 2));  /* <|im_end|> */
    CHECK(tokenizer_is_eog(tok, 0));  /* <|endoftext|> */
    CHECK(!tokenizer_is_eog(tok, 1)); /* <|im_start|> */
    CHECK(!tokenizer_is_eog(tok, 100));
    CHECK(!tokenizer_is_eog(tok, -1));
    CHECK(!tokenizer_is_eog(tok, 49152));
    CHECK_EQ_INT(tokenizer_token_type(tok, 2), TOKENIZER_TOKEN_CONTROL);
    CHECK_EQ_INT(tokenizer_token_type(tok, 100), TOKENIZER_TOKEN_NORMAL);
    CHECK(tokenizer_token_text(tok, -1) == NULL);

    char buf[64];
    size_t n = 99;
    /* control tokens are hidden unless asked for */
    CHECK_OK(tokenizer_token_to_piece(tok, 2, 0, buf, sizeof(buf), &n));
    CHECK_EQ_INT(n, 0);
    CHECK_OK(tokenizer_token_to_piece(tok, 2, TOKENIZER_DECODE_SPECIAL, buf, sizeof(buf), &n));
    CHECK(n == 10 && memcmp(buf, "<|im_end|>", 10) == 0);
    n = 99;
    CHECK_EQ_INT(tokenizer_token_to_piece(tok, 2, TOKENIZER_DECODE_SPECIAL, buf, 3, &n), BATON_ERR_NO_SPACE);
    CHECK_EQ_INT(n, 99); /* untouched on error */
    CHECK_EQ_INT(tokenizer_token_to_piece(tok, 49152, 0, buf, sizeof(buf), &n), BATON_ERR_OUT_OF_RANGE);
    CHECK_EQ_INT(tokenizer_token_to_piece(tok, -5, 0, buf, sizeof(buf), &n), BATON_ERR_OUT_OF_RANGE);
}

/* Id of the byte-level token standing for one byte (GPT-2 bytes_to_unicode). */
static int32_t byte_token(const tokenizer_t *tok, unsigned b) {
    int32_t ids[4];
    size_t n = 0;
    char c = (char)b;
    /* for a single ASCII byte encode gives its byte token */
    if (b < 0x80 && tokenizer_encode(tok, &c, 1, 0, ids, 4, &n) == BATON_OK && n == 1) return ids[0];
    /* otherwise find the token whose piece is exactly that byte */
    for (int32_t id = 0; id < tokenizer_n_vocab(tok); id++) {
        char buf[8];
        size_t pl = 0;
        if (tokenizer_token_to_piece(tok, id, 0, buf, sizeof(buf), &pl) == BATON_OK && pl == 1 &&
            (unsigned char)buf[0] == b)
            return id;
    }
    return -1;
}

static void test_detok_partial(const tokenizer_t *tok) {
    /* "日" = E6 97 A5 fed one byte token at a time */
    int32_t e6 = byte_token(tok, 0xE6), x97 = byte_token(tok, 0x97), xa5 = byte_token(tok, 0xA5);
    int32_t a = byte_token(tok, 'a');
    CHECK(e6 >= 0 && x97 >= 0 && xa5 >= 0 && a >= 0);
    if (e6 < 0 || x97 < 0 || xa5 < 0 || a < 0) return;
    detok_t *d = NULL;
    CHECK_OK(detok_init(tok, 0, &d));
    const char *p;
    size_t n;
    CHECK_OK(detok_push(d, e6, &p, &n));
    CHECK_EQ_INT(n, 0);
    CHECK_OK(detok_push(d, x97, &p, &n));
    CHECK_EQ_INT(n, 0);
    CHECK_OK(detok_push(d, xa5, &p, &n));
    CHECK(n == 3 && memcmp(p, "\xe6\x97\xa5", 3) == 0);
    /* a lone continuation byte can never start a character: U+FFFD at once */
    CHECK_OK(detok_push(d, x97, &p, &n));
    CHECK(n == 3 && memcmp(p, "\xef\xbf\xbd", 3) == 0);
    /* E6 then 'a': the held byte is provably invalid */
    CHECK_OK(detok_push(d, e6, &p, &n));
    CHECK_EQ_INT(n, 0);
    CHECK_OK(detok_push(d, a, &p, &n));
    CHECK(n == 4 && memcmp(p, "\xef\xbf\xbd" "a", 4) == 0);
    /* an incomplete tail becomes U+FFFD only at the flush */
    CHECK_OK(detok_push(d, e6, &p, &n));
    CHECK_OK(detok_push(d, x97, &p, &n));
    CHECK_EQ_INT(n, 0);
    CHECK_EQ_INT(detok_push(d, 1 << 20, &p, &n), BATON_ERR_OUT_OF_RANGE);
    CHECK_OK(detok_flush(d, &p, &n));
    CHECK(n == 3 && memcmp(p, "\xef\xbf\xbd", 3) == 0);
    CHECK_OK(detok_flush(d, &p, &n));
    CHECK_EQ_INT(n, 0);
    detok_free(d);
    detok_free(NULL);

    /* the same ids one-shot */
    int32_t ids[] = {e6, x97, xa5, x97, e6, a, e6, x97};
    char *text;
    size_t tl;
    CHECK_OK(tokenizer_decode(tok, ids, 8, 0, &text, &tl));
    const char want[] = "\xe6\x97\xa5\xef\xbf\xbd\xef\xbf\xbd" "a\xef\xbf\xbd";
    CHECK(tl == sizeof(want) - 1 && memcmp(text, want, tl) == 0);
    free(text);
    t_failures += tt_check_stream(tok, ids, 8, 0, "partial bytes");
    int32_t bad[] = {5, -1};
    CHECK_EQ_INT(tokenizer_decode(tok, bad, 2, 0, &text, &tl), BATON_ERR_OUT_OF_RANGE);
}

static void test_bad_input(const tokenizer_t *tok) {
    int32_t ids[16];
    size_t n = 77;
    /* invalid UTF-8: clear error, outputs untouched */
    const char *bad[] = {"\xff", "ab\xc3", "\xc3\x28", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\xaf",
                         "ok\x80"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK_EQ_INT(tokenizer_encode(tok, bad[i], strlen(bad[i]), 0, ids, 16, &n), BATON_ERR_INVALID_ARG);
        CHECK(strstr(baton_last_error(), "UTF-8") != NULL);
    }
    CHECK_EQ_INT(n, 77);
    /* empty text */
    CHECK_OK(tokenizer_encode(tok, "", 0, 0, ids, 16, &n));
    CHECK_EQ_INT(n, 0);
    CHECK_OK(tokenizer_encode(tok, NULL, 0, TOKENIZER_ENCODE_ADD_SPECIAL, ids, 16, &n));
    CHECK_EQ_INT(n, 0); /* SmolLM2 adds no BOS */
    /* capacity too small */
    n = 77;
    CHECK_EQ_INT(tokenizer_encode(tok, "Hello world again", 17, 0, ids, 1, &n), BATON_ERR_NO_SPACE);
    CHECK_EQ_INT(n, 77);
    CHECK_EQ_INT(tokenizer_encode(tok, "x", 1, 0, NULL, 4, &n), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(tokenizer_encode(NULL, "x", 1, 0, ids, 4, &n), BATON_ERR_INVALID_ARG);
    /* over the input limit: refused before reading the text */
    size_t huge = TOKENIZER_MAX_INPUT_BYTES + 1;
    char *big = malloc(huge);
    CHECK(big != NULL);
    if (big) {
        int32_t *out = NULL;
        CHECK_EQ_INT(tokenizer_encode_alloc(tok, big, huge, 0, &out, &n), BATON_ERR_OUT_OF_RANGE);
        free(big);
    }
    /* a long word (256 KiB without a break) is merged in O(n log n) */
    size_t wl = 256 * 1024;
    char *word = malloc(wl);
    for (size_t i = 0; i < wl; i++) word[i] = "abcdefghij"[i % 10];
    int32_t *out = NULL;
    size_t no = 0;
    CHECK_OK(tokenizer_encode_alloc(tok, word, wl, 0, &out, &no));
    CHECK(no > 0 && no < wl);
    char *dec = NULL;
    size_t dl = 0;
    CHECK_OK(tokenizer_decode(tok, out, no, 0, &dec, &dl));
    CHECK(dl == wl && memcmp(dec, word, wl) == 0);
    free(dec);
    free(out);
    /* 256 KiB of one repeated emoji and of whitespace */
    for (size_t i = 0; i + 4 <= wl; i += 4) memcpy(word + i, "\xf0\x9f\x98\x80", 4);
    CHECK_OK(tokenizer_encode_alloc(tok, word, wl, 0, &out, &no));
    CHECK_OK(tokenizer_decode(tok, out, no, 0, &dec, &dl));
    CHECK(dl == wl && memcmp(dec, word, wl) == 0);
    free(dec);
    free(out);
    memset(word, ' ', wl);
    word[wl - 1] = 'x';
    CHECK_OK(tokenizer_encode_alloc(tok, word, wl, 0, &out, &no));
    CHECK_OK(tokenizer_decode(tok, out, no, 0, &dec, &dl));
    CHECK(dl == wl && memcmp(dec, word, wl) == 0);
    free(dec);
    free(out);
    free(word);
}

static void test_missing_keys(void) {
    /* a GGUF with no tokenizer keys at all */
    tt_gguf_t g = {0};
    tt_kv_str(&g, "general.architecture", "llama");
    size_t size;
    uint8_t *bytes = tt_finish(&g, &size);
    gguf_file_t *f = NULL;
    CHECK_OK(gguf_open_memory(bytes, size, &f));
    tokenizer_t *tok = (tokenizer_t *)0x1;
    if (f) {
        CHECK_EQ_INT(tokenizer_load(f, &tok), BATON_ERR_NOT_FOUND);
        CHECK(strstr(baton_last_error(), "tokenizer.ggml.model") != NULL);
        CHECK(tok == (tokenizer_t *)0x1);
    }
    gguf_close(f);
    free(bytes);

    /* model present, tokens missing */
    tt_gguf_t g2 = {0};
    tt_kv_str(&g2, "tokenizer.ggml.model", "gpt2");
    bytes = tt_finish(&g2, &size);
    f = NULL;
    CHECK_OK(gguf_open_memory(bytes, size, &f));
    if (f) {
        CHECK_EQ_INT(tokenizer_load(f, &tok), BATON_ERR_NOT_FOUND);
        CHECK(strstr(baton_last_error(), "tokenizer.ggml.tokens") != NULL);
    }
    gguf_close(f);
    free(bytes);

    /* gpt2 without merges */
    tt_gguf_t g3 = {0};
    const char *toks[] = {"a", "b", "ab"};
    tt_kv_str(&g3, "tokenizer.ggml.model", "gpt2");
    tt_kv_strs(&g3, "tokenizer.ggml.tokens", toks, 3);
    bytes = tt_finish(&g3, &size);
    f = NULL;
    CHECK_OK(gguf_open_memory(bytes, size, &f));
    if (f) {
        CHECK_EQ_INT(tokenizer_load(f, &tok), BATON_ERR_NOT_FOUND);
        CHECK(strstr(baton_last_error(), "tokenizer.ggml.merges") != NULL);
    }
    gguf_close(f);
    free(bytes);

    /* malformed merge and unsupported model type */
    tt_gguf_t g4 = {0};
    const char *merges[] = {"ab"};
    tt_kv_str(&g4, "tokenizer.ggml.model", "gpt2");
    tt_kv_strs(&g4, "tokenizer.ggml.tokens", toks, 3);
    tt_kv_strs(&g4, "tokenizer.ggml.merges", merges, 1);
    bytes = tt_finish(&g4, &size);
    f = NULL;
    CHECK_OK(gguf_open_memory(bytes, size, &f));
    if (f) {
        CHECK_EQ_INT(tokenizer_load(f, &tok), BATON_ERR_FORMAT);
        CHECK(strstr(baton_last_error(), "merge") != NULL);
    }
    gguf_close(f);
    free(bytes);

    tt_gguf_t g5 = {0};
    tt_kv_str(&g5, "tokenizer.ggml.model", "t5");
    tt_kv_strs(&g5, "tokenizer.ggml.tokens", toks, 3);
    bytes = tt_finish(&g5, &size);
    f = NULL;
    CHECK_OK(gguf_open_memory(bytes, size, &f));
    if (f) {
        CHECK_EQ_INT(tokenizer_load(f, &tok), BATON_ERR_UNSUPPORTED);
        CHECK(strstr(baton_last_error(), "t5") != NULL);
    }
    gguf_close(f);
    free(bytes);
    CHECK_EQ_INT(tokenizer_load(NULL, &tok), BATON_ERR_INVALID_ARG);
    tokenizer_free(NULL);
}

int main(void) {
    const char *path = test_default_model();
    CHECK(path != NULL);
    test_missing_keys();
    if (!path) return TEST_DONE();
    gguf_file_t *f = NULL;
    CHECK_OK(gguf_open(path, &f));
    if (!f) return TEST_DONE();
    tokenizer_t *tok = NULL;
    CHECK_OK(tokenizer_load(f, &tok));
    gguf_close(f); /* the tokenizer keeps its own copy */
    if (!tok) return TEST_DONE();
    test_metadata(tok);
    test_golden(tok);
    test_detok_partial(tok);
    test_bad_input(tok);
    tokenizer_free(tok);
    return TEST_DONE();
}
