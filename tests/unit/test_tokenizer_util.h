/* Helpers shared by the tokenizer and chat template tests: golden-file
 * parsing (hex strings, id lists), UTF-8 checks, streaming comparison and a
 * tiny in-memory GGUF writer. */
#ifndef BATON_TESTS_TEST_TOKENIZER_UTIL_H
#define BATON_TESTS_TEST_TOKENIZER_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer.h"
#include "tests/test_util.h"

/* Reads a whole file under $BATON_SOURCE_DIR (or the current directory)
 * into a NUL-terminated buffer; NULL on failure. */
static inline char *tt_read_source_file(const char *rel) {
    char path[4096];
    const char *src = getenv("BATON_SOURCE_DIR");
    snprintf(path, sizeof(path), "%s/%s", src && *src ? src : ".", rel);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf) buf[n] = 0;
    fclose(f);
    return buf;
}

/* Decodes lowercase/uppercase hex of `n` chars into a malloc'd buffer. */
static inline char *tt_unhex(const char *hex, size_t n, size_t *out_len) {
    char *out = malloc(n / 2 + 1);
    for (size_t i = 0; i + 1 < n; i += 2) {
        char b[3] = {hex[i], hex[i + 1], 0};
        out[i / 2] = (char)strtol(b, NULL, 16);
    }
    out[n / 2] = 0;
    *out_len = n / 2;
    return out;
}

/* Parses space-separated ids of `s[0..n)` into a malloc'd array. */
static inline int32_t *tt_parse_ids(const char *s, size_t n, size_t *count) {
    int32_t *ids = malloc((n / 2 + 1) * sizeof(int32_t));
    size_t k = 0;
    size_t i = 0;
    while (i < n) {
        while (i < n && s[i] == ' ') i++;
        if (i >= n) break;
        ids[k++] = (int32_t)strtol(s + i, NULL, 10);
        while (i < n && s[i] != ' ') i++;
    }
    *count = k;
    return ids;
}

/* Splits `line` at tabs into at most max fields (pointer + length). */
static inline size_t tt_fields(const char *line, size_t len, const char **f, size_t *fl, size_t max) {
    size_t k = 0, start = 0;
    for (size_t i = 0; i <= len && k < max; i++) {
        if (i == len || line[i] == '\t') {
            f[k] = line + start;
            fl[k] = i - start;
            k++;
            start = i + 1;
        }
    }
    return k;
}

/* Streams ids through a detok_t; checks that every piece is complete valid
 * UTF-8 and that the joined stream equals the one-shot decode. Returns the
 * number of failed checks. */
static inline int tt_check_stream(const tokenizer_t *tok, const int32_t *ids, size_t n, uint32_t flags,
                           const char *label) {
    int fails = 0;
    char *one = NULL;
    size_t one_len = 0;
    if (tokenizer_decode(tok, ids, n, flags, &one, &one_len) != BATON_OK) {
        fprintf(stderr, "%s: decode failed: %s\n", label, baton_last_error());
        return 1;
    }
    detok_t *d = NULL;
    if (detok_init(tok, flags, &d) != BATON_OK) {
        free(one);
        return 1;
    }
    char *joined = malloc(one_len * 2 + 64);
    size_t jl = 0, jcap = one_len * 2 + 64;
    for (size_t i = 0; i <= n; i++) {
        const char *p;
        size_t pl;
        baton_status_t s = i < n ? detok_push(d, ids[i], &p, &pl) : detok_flush(d, &p, &pl);
        if (s != BATON_OK) {
            fprintf(stderr, "%s: detok failed at %zu: %s\n", label, i, baton_last_error());
            fails++;
            break;
        }
        if (tokenizer_utf8_valid_prefix(p, pl) != pl) {
            fprintf(stderr, "%s: detok piece %zu is not complete UTF-8\n", label, i);
            fails++;
        }
        if (jl + pl > jcap) {
            jcap = (jl + pl) * 2;
            joined = realloc(joined, jcap);
        }
        memcpy(joined + jl, p, pl);
        jl += pl;
    }
    if (jl != one_len || memcmp(joined, one, jl) != 0) {
        fprintf(stderr, "%s: streamed text (%zu bytes) != one-shot decode (%zu bytes)\n", label, jl, one_len);
        fails++;
    }
    free(joined);
    free(one);
    detok_free(d);
    return fails;
}

/* ---- minimal GGUF v3 writer (gguf.md) for bad-input tests ---- */
typedef struct tt_gguf {
    uint8_t *b;
    size_t n, cap;
    uint64_t n_kv;
} tt_gguf_t;

static inline void tt_put(tt_gguf_t *g, const void *p, size_t n) {
    if (g->n + n > g->cap) {
        g->cap = (g->n + n) * 2 + 64;
        g->b = realloc(g->b, g->cap);
    }
    memcpy(g->b + g->n, p, n);
    g->n += n;
}
static inline void tt_u32(tt_gguf_t *g, uint32_t v) { tt_put(g, &v, 4); }
static inline void tt_u64(tt_gguf_t *g, uint64_t v) { tt_put(g, &v, 8); }
static inline void tt_str(tt_gguf_t *g, const char *s) {
    tt_u64(g, strlen(s));
    tt_put(g, s, strlen(s));
}
static inline void tt_kv_str(tt_gguf_t *g, const char *key, const char *val) {
    tt_str(g, key);
    tt_u32(g, 8); /* STRING */
    tt_str(g, val);
    g->n_kv++;
}
static inline void tt_kv_strs(tt_gguf_t *g, const char *key, const char *const *vals, size_t n) {
    tt_str(g, key);
    tt_u32(g, 9); /* ARRAY */
    tt_u32(g, 8); /* of STRING */
    tt_u64(g, n);
    for (size_t i = 0; i < n; i++) tt_str(g, vals[i]);
    g->n_kv++;
}
static inline void tt_kv_i32s(tt_gguf_t *g, const char *key, const int32_t *vals, size_t n) {
    tt_str(g, key);
    tt_u32(g, 9); /* ARRAY */
    tt_u32(g, 5); /* of INT32 */
    tt_u64(g, n);
    tt_put(g, vals, n * 4);
    g->n_kv++;
}
static inline void tt_kv_f32s(tt_gguf_t *g, const char *key, const float *vals, size_t n) {
    tt_str(g, key);
    tt_u32(g, 9); /* ARRAY */
    tt_u32(g, 6); /* of FLOAT32 */
    tt_u64(g, n);
    tt_put(g, vals, n * 4);
    g->n_kv++;
}
/* Body (kvs) is built first; tt_finish prepends the header. */
static inline uint8_t *tt_finish(tt_gguf_t *g, size_t *size) {
    tt_gguf_t out = {0};
    tt_put(&out, "GGUF", 4);
    tt_u32(&out, 3);
    tt_u64(&out, 0);
    tt_u64(&out, g->n_kv);
    tt_put(&out, g->b, g->n);
    free(g->b);
    *size = out.n;
    return out.b;
}

#endif
