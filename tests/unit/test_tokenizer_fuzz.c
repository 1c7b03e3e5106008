/* libFuzzer target for the tokenizer: arbitrary bytes as (a) a GGUF file
 * given to tokenizer_load, (b) text for encode with and without special
 * parsing on the SentencePiece test vocabulary and, when present, the
 * default model's byte-level BPE vocabulary, (c) token ids for decode and
 * the streaming detokenizer (whose output must equal the one-shot decode).
 * Any crash, leak, sanitizer report or mismatch aborts. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf.h"
#include "common/log.h"
#include "common/tokenizer.h"

static tokenizer_t *g_spm, *g_bpe;

static tokenizer_t *load(const char *path) {
    gguf_file_t *f = NULL;
    tokenizer_t *t = NULL;
    if (gguf_open(path, &f) == BATON_OK) tokenizer_load(f, &t);
    gguf_close(f);
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    log_set_level(LOG_LEVEL_ERROR);
    char path[4096];
    const char *src = getenv("BATON_SOURCE_DIR");
    snprintf(path, sizeof(path), "%s/tests/data/tokenizer_spm_tiny.gguf", src && *src ? src : ".");
    g_spm = load(path);
    if (!g_spm) {
        fprintf(stderr, "cannot load %s\n", path);
        abort();
    }
    /* the default model as tests/test_util.h finds it; optional here */
    const char *m = getenv("BATON_MODEL"), *dir = getenv("BATON_MODEL_DIR");
    if (m && *m) snprintf(path, sizeof(path), "%s", m);
    else if (dir && *dir) snprintf(path, sizeof(path), "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
    else snprintf(path, sizeof(path), "%s/.cache/baton/SmolLM2-135M-Instruct.Q4_1.gguf",
                  getenv("HOME") ? getenv("HOME") : "/root");
    g_bpe = load(path);
    return 0;
}

static void check_stream(const tokenizer_t *t, const int32_t *ids, size_t n, uint32_t flags) {
    char *one = NULL;
    size_t ol = 0;
    if (tokenizer_decode(t, ids, n, flags, &one, &ol) != BATON_OK) abort();
    if (tokenizer_utf8_valid_prefix(one, ol) != ol) abort();
    detok_t *d = NULL;
    if (detok_init(t, flags, &d) != BATON_OK) abort();
    size_t at = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *p;
        size_t pl;
        if ((i < n ? detok_push(d, ids[i], &p, &pl) : detok_flush(d, &p, &pl)) != BATON_OK) abort();
        if (at + pl > ol || memcmp(one + at, p, pl) != 0) abort();
        at += pl;
    }
    if (at != ol) abort();
    detok_free(d);
    free(one);
}

static void run_text(const tokenizer_t *t, const uint8_t *data, size_t size, uint32_t flags) {
    int32_t *ids = NULL;
    size_t n = 0;
    baton_status_t s = tokenizer_encode_alloc(t, (const char *)data, size, flags, &ids, &n);
    if (s == BATON_OK) {
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= tokenizer_n_vocab(t)) abort();
        check_stream(t, ids, n, 0);
        if (!(flags & TOKENIZER_ENCODE_PARSE_SPECIAL) && tokenizer_kind(t) == TOKENIZER_KIND_BPE) {
            /* the raw pieces are the input minus the bytes the vocabulary
             * has no token for (llama.cpp, and so baton, drops those; the
             * decode then shows the broken characters as U+FFFD) */
            size_t at = 0;
            for (size_t i = 0; i < n; i++) {
                char buf[256];
                size_t pl = 0;
                if (tokenizer_token_to_piece(t, ids[i], 0, buf, sizeof(buf), &pl) != BATON_OK) abort();
                while (pl && at < size && (uint8_t)buf[0] != data[at]) at++; /* dropped bytes */
                if (at + pl > size || memcmp(buf, data + at, pl) != 0) abort();
                at += pl;
            }
        }
    } else if (s != BATON_ERR_INVALID_ARG) {
        fprintf(stderr, "encode failed: %s\n", baton_last_error());
        abort(); /* only invalid UTF-8 may be refused at this size */
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    uint8_t mode = data[0] % 4;
    data++;
    size--;
    if (mode == 0) {
        gguf_file_t *f = NULL;
        if (gguf_open_memory(data, size, &f) == BATON_OK) {
            tokenizer_t *t = NULL;
            if (tokenizer_load(f, &t) == BATON_OK) {
                run_text(t, (const uint8_t *)"Hello world 123", 15, TOKENIZER_ENCODE_ADD_SPECIAL);
                tokenizer_free(t);
            }
            gguf_close(f);
        }
    } else if (mode == 1 || mode == 2) {
        uint32_t flags = mode == 2 ? TOKENIZER_ENCODE_PARSE_SPECIAL | TOKENIZER_ENCODE_ADD_SPECIAL : 0;
        run_text(g_spm, data, size, flags);
        if (g_bpe) run_text(g_bpe, data, size, flags);
    } else {
        /* ids from pairs of bytes */
        size_t n = size / 2;
        int32_t *ids = malloc((n + 1) * sizeof(int32_t));
        for (const tokenizer_t *t = g_spm; t; t = (t == g_spm ? g_bpe : NULL)) {
            for (size_t i = 0; i < n; i++)
                ids[i] = (int32_t)((data[2 * i] | (data[2 * i + 1] << 8)) % tokenizer_n_vocab(t));
            check_stream(t, ids, n, 0);
            check_stream(t, ids, n, TOKENIZER_DECODE_SPECIAL | TOKENIZER_DECODE_KEEP_LEADING_SPACE);
        }
        free(ids);
    }
    return 0;
}
