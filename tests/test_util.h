/* Minimal assertion helpers for baton's C tests (ctest runs each binary;
 * a non-zero exit is a failure). */
#ifndef BATON_TESTS_TEST_UTIL_H
#define BATON_TESTS_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_failures = 0;

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__,   \
                    #cond);                                                    \
            t_failures++;                                                      \
        }                                                                      \
    } while (0)

#define CHECK_MSG(cond, ...)                                                   \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__,   \
                    #cond);                                                    \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
            t_failures++;                                                      \
        }                                                                      \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                     \
    do {                                                                       \
        long long _a = (long long)(a), _b = (long long)(b);                    \
        if (_a != _b) {                                                        \
            fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%lld vs %lld)\n",  \
                    __FILE__, __LINE__, #a, #b, _a, _b);                       \
            t_failures++;                                                      \
        }                                                                      \
    } while (0)

#define CHECK_OK(expr)                                                         \
    do {                                                                       \
        int _s = (int)(expr);                                                  \
        if (_s != 0) {                                                         \
            fprintf(stderr, "%s:%d: %s returned %d\n", __FILE__, __LINE__,     \
                    #expr, _s);                                                \
            t_failures++;                                                      \
        }                                                                      \
    } while (0)

/* Returns the process exit code and prints a summary. */
#define TEST_DONE()                                                            \
    (t_failures == 0 ? (fprintf(stderr, "all checks passed\n"), 0)             \
                     : (fprintf(stderr, "%d check(s) failed\n", t_failures), 1))

/* Path of the default model: $BATON_MODEL, else $BATON_MODEL_DIR/<file>,
 * else ~/.cache/baton/<file>. Returns NULL (and the test should fail, not
 * skip) when the file is absent. */
static inline const char *test_default_model(void) {
    static char buf[4096];
    const char *m = getenv("BATON_MODEL");
    if (m && *m) return m;
    const char *dir = getenv("BATON_MODEL_DIR");
    if (dir && *dir) snprintf(buf, sizeof(buf), "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
    else snprintf(buf, sizeof(buf), "%s/.cache/baton/SmolLM2-135M-Instruct.Q4_1.gguf",
                  getenv("HOME") ? getenv("HOME") : "/root");
    FILE *f = fopen(buf, "rb");
    if (!f) {
        fprintf(stderr, "default model not found at %s (run scripts/fetch-model)\n", buf);
        return NULL;
    }
    fclose(f);
    return buf;
}

#endif
