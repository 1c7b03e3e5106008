/* GGUF reader on files built here byte by byte (gguf.md layout): a valid
 * file whose every value is read back, every prefix of it, and one file per
 * kind of damage, each of which must give the right status and a detail
 * naming the problem, with no crash and no leak (run under ASan). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dequant.h"
#include "common/gguf.h"
#include "tests/test_util.h"

/* ---- a tiny GGUF writer ------------------------------------------------- */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf_t;

static void b_bytes(buf_t *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void b_u8(buf_t *b, uint8_t v) { b_bytes(b, &v, 1); }
static void b_u16(buf_t *b, uint16_t v) { b_bytes(b, &v, 2); }
static void b_u32(buf_t *b, uint32_t v) { b_bytes(b, &v, 4); }
static void b_u64(buf_t *b, uint64_t v) { b_bytes(b, &v, 8); }
static void b_f32(buf_t *b, float v) { b_bytes(b, &v, 4); }
static void b_f64(buf_t *b, double v) { b_bytes(b, &v, 8); }
static void b_str(buf_t *b, const char *s) {
    b_u64(b, strlen(s));
    b_bytes(b, s, strlen(s));
}
static void b_zeros(buf_t *b, size_t n) {
    for (size_t i = 0; i < n; i++) b_u8(b, 0);
}
static void b_pad(buf_t *b, size_t align) {
    while (b->n % align) b_u8(b, 0);
}
static void b_header(buf_t *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b_bytes(b, "GGUF", 4);
    b_u32(b, version);
    b_u64(b, n_tensors);
    b_u64(b, n_kv);
}
static void b_kv_u32(buf_t *b, const char *key, uint32_t v) {
    b_str(b, key);
    b_u32(b, GGUF_VALUE_UINT32);
    b_u32(b, v);
}
static void b_tensor(buf_t *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                     uint32_t type, uint64_t offset) {
    b_str(b, name);
    b_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) b_u64(b, ne[d]);
    b_u32(b, type);
    b_u64(b, offset);
}

/* Tensor list of the builder. */
typedef struct tspec {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[5];
    uint32_t type;
    uint64_t offset;
} tspec_t;

/* A file with `n_kv_extra` u32 kvs after the standard ones, the given
 * alignment kv (0: none) and tensors; data section of `data_bytes` bytes
 * filled with a pattern. */
static void build(buf_t *b, uint32_t version, uint32_t alignment, const tspec_t *ts, int n_t,
                  uint64_t data_bytes) {
    b->n = 0;
    b_header(b, version, (uint64_t)n_t, alignment ? 2 : 1);
    b_kv_u32(b, "test.value", 7);
    if (alignment) b_kv_u32(b, "general.alignment", alignment);
    for (int i = 0; i < n_t; i++) {
        b_tensor(b, ts[i].name, ts[i].n_dims, ts[i].ne, ts[i].type, ts[i].offset);
    }
    b_pad(b, alignment ? alignment : 32);
    for (uint64_t i = 0; i < data_bytes; i++) b_u8(b, (uint8_t)(i * 7 + 3));
}

/* ---- expectations -------------------------------------------------------- */

static int expect_fail_(const void *data, size_t size, baton_status_t want, const char *needle,
                        const char *what, int line) {
    gguf_file_t *sentinel = (gguf_file_t *)(uintptr_t)0x1234;
    gguf_file_t *f = sentinel;
    baton_clear_error();
    baton_status_t st = gguf_open_memory(data, size, &f);
    int fails = t_failures;
    CHECK_MSG(st == want, "line %d %s: status %d, want %d (%s)", line, what, st, want,
              baton_last_error());
    CHECK_MSG((want == BATON_OK) == (f != sentinel), "line %d %s: output %s", line, what,
              want == BATON_OK ? "not written on success" : "written on failure");
    CHECK_MSG(needle == NULL || strstr(baton_last_error(), needle) != NULL,
              "line %d %s: detail '%s' lacks '%s'", line, what, baton_last_error(), needle);
    if (st == BATON_OK && f != sentinel) gguf_close(f);
    return t_failures == fails;
}
#define EXPECT_FAIL(d, n, st, needle, what) expect_fail_(d, n, st, needle, what, __LINE__)

/* ---- the valid file ------------------------------------------------------ */

/* Every value type as a kv, arrays of several element types, four tensors
 * of different types; the last tensor ends exactly at end of file. */
static void build_valid(buf_t *b, uint32_t version) {
    b->n = 0;
    b_header(b, version, 4, 20);
    b_str(b, "k.u8"); b_u32(b, GGUF_VALUE_UINT8); b_u8(b, 200);
    b_str(b, "k.i8"); b_u32(b, GGUF_VALUE_INT8); b_u8(b, (uint8_t)-100);
    b_str(b, "k.u16"); b_u32(b, GGUF_VALUE_UINT16); b_u16(b, 60000);
    b_str(b, "k.i16"); b_u32(b, GGUF_VALUE_INT16); b_u16(b, (uint16_t)-30000);
    b_kv_u32(b, "k.u32", 4000000000u);
    b_str(b, "k.i32"); b_u32(b, GGUF_VALUE_INT32); b_u32(b, (uint32_t)-2000000000);
    b_str(b, "k.f32"); b_u32(b, GGUF_VALUE_FLOAT32); b_f32(b, 0.15625f);
    b_str(b, "k.bool"); b_u32(b, GGUF_VALUE_BOOL); b_u8(b, 1);
    b_str(b, "k.str"); b_u32(b, GGUF_VALUE_STRING); b_str(b, "hello");
    b_str(b, "k.u64"); b_u32(b, GGUF_VALUE_UINT64); b_u64(b, UINT64_MAX);
    b_str(b, "k.i64"); b_u32(b, GGUF_VALUE_INT64); b_u64(b, (uint64_t)INT64_MIN);
    b_str(b, "k.f64"); b_u32(b, GGUF_VALUE_FLOAT64); b_f64(b, -1e300);
    b_str(b, "k.emptystr"); b_u32(b, GGUF_VALUE_STRING); b_str(b, "");
    b_str(b, "a.i32"); b_u32(b, GGUF_VALUE_ARRAY); b_u32(b, GGUF_VALUE_INT32); b_u64(b, 3);
    b_u32(b, 1); b_u32(b, (uint32_t)-2); b_u32(b, 3);
    b_str(b, "a.f32"); b_u32(b, GGUF_VALUE_ARRAY); b_u32(b, GGUF_VALUE_FLOAT32); b_u64(b, 2);
    b_f32(b, 0.5f); b_f32(b, -8.0f);
    b_str(b, "a.str"); b_u32(b, GGUF_VALUE_ARRAY); b_u32(b, GGUF_VALUE_STRING); b_u64(b, 3);
    b_str(b, "x"); b_str(b, ""); b_str(b, "yz");
    b_str(b, "a.u8"); b_u32(b, GGUF_VALUE_ARRAY); b_u32(b, GGUF_VALUE_UINT8); b_u64(b, 1);
    b_u8(b, 255);
    b_str(b, "a.bool"); b_u32(b, GGUF_VALUE_ARRAY); b_u32(b, GGUF_VALUE_BOOL); b_u64(b, 2);
    b_u8(b, 0); b_u8(b, 1);
    b_str(b, "a.empty"); b_u32(b, GGUF_VALUE_ARRAY); b_u32(b, GGUF_VALUE_INT64); b_u64(b, 0);
    b_kv_u32(b, "general.alignment", 64);
    uint64_t ne_a[] = {4, 2}, ne_b[] = {32, 2}, ne_c[] = {8}, ne_d[] = {32, 1, 1, 1};
    b_tensor(b, "a", 2, ne_a, GGML_TYPE_F32, 0);     /* 32 bytes */
    b_tensor(b, "b", 2, ne_b, GGML_TYPE_Q4_1, 64);   /* 40 bytes */
    b_tensor(b, "c", 1, ne_c, GGML_TYPE_F16, 128);   /* 16 bytes */
    b_tensor(b, "d", 4, ne_d, GGML_TYPE_Q5_0, 192);  /* 22 bytes, not convertible */
    b_pad(b, 64);
    size_t data0 = b->n;
    b_zeros(b, 192 + 22);
    float fa[8] = {1, 2, 3, 4, -1, -2, -3, -4.5f};
    memcpy(b->p + data0, fa, sizeof(fa));
    /* Q4_1 blocks: d = 1.0 (0x3c00), m = -8.0 (0xc800), qs[j] = j | (15-j)<<4 */
    for (int blk = 0; blk < 2; blk++) {
        uint8_t *q = b->p + data0 + 64 + 20 * blk;
        q[0] = 0x00; q[1] = 0x3c; q[2] = 0x00; q[3] = 0xc8;
        for (int j = 0; j < 16; j++) q[4 + j] = (uint8_t)(j | ((15 - j) << 4));
    }
    uint16_t hc[8] = {0x3c00, 0xc000, 0x3800, 0x0000, 0x7bff, 0x0001, 0x3555, 0x8000};
    memcpy(b->p + data0 + 128, hc, sizeof(hc));
}

static void check_valid(void) {
    buf_t b = {0};
    build_valid(&b, 3);
    gguf_file_t *f = NULL;
    baton_status_t st = gguf_open_memory(b.p, b.n, &f);
    CHECK_MSG(st == BATON_OK, "valid file: %s", baton_last_error());
    if (st != BATON_OK) {
        free(b.p);
        return;
    }
    CHECK_EQ_INT(gguf_version(f), 3);
    CHECK_EQ_INT(gguf_alignment(f), 64);
    CHECK_EQ_INT(gguf_data_offset(f) % 64, 0);
    CHECK_EQ_INT(gguf_file_size(f), b.n);
    CHECK_EQ_INT(gguf_n_kv(f), 20);
    CHECK_EQ_INT(gguf_n_tensors(f), 4);
    CHECK(gguf_str_eq(gguf_kv_at(f, 0)->key, "k.u8"));
    CHECK(gguf_kv_at(f, 20) == NULL);
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f32;
    bool bl;
    gguf_str_t s;
    CHECK_OK(gguf_get_u32(f, "k.u8", &u32)); CHECK_EQ_INT(u32, 200);
    CHECK_OK(gguf_get_i64(f, "k.i8", &i64)); CHECK_EQ_INT(i64, -100);
    CHECK_EQ_INT(gguf_get_u32(f, "k.i8", &u32), BATON_ERR_OUT_OF_RANGE);
    CHECK(strstr(baton_last_error(), "k.i8") != NULL);
    CHECK_OK(gguf_get_u32(f, "k.u16", &u32)); CHECK_EQ_INT(u32, 60000);
    CHECK_OK(gguf_get_i64(f, "k.i16", &i64)); CHECK_EQ_INT(i64, -30000);
    CHECK_OK(gguf_get_u32(f, "k.u32", &u32)); CHECK_EQ_INT(u32, 4000000000u);
    CHECK_OK(gguf_get_i64(f, "k.i32", &i64)); CHECK_EQ_INT(i64, -2000000000);
    CHECK_OK(gguf_get_f32(f, "k.f32", &f32)); CHECK(f32 == 0.15625f);
    CHECK_OK(gguf_get_bool(f, "k.bool", &bl)); CHECK(bl);
    CHECK_OK(gguf_get_str(f, "k.str", &s)); CHECK(gguf_str_eq(s, "hello"));
    CHECK_OK(gguf_get_str(f, "k.emptystr", &s)); CHECK(gguf_str_eq(s, ""));
    CHECK_OK(gguf_get_u64(f, "k.u64", &u64)); CHECK(u64 == UINT64_MAX);
    CHECK_EQ_INT(gguf_get_u32(f, "k.u64", &u32), BATON_ERR_OUT_OF_RANGE);
    CHECK_EQ_INT(gguf_get_i64(f, "k.u64", &i64), BATON_ERR_OUT_OF_RANGE);
    CHECK_OK(gguf_get_i64(f, "k.i64", &i64)); CHECK(i64 == INT64_MIN);
    CHECK_EQ_INT(gguf_get_u64(f, "k.i64", &u64), BATON_ERR_OUT_OF_RANGE);
    CHECK_OK(gguf_get_f32(f, "k.f64", &f32)); CHECK(isinf(f32) && f32 < 0);
    CHECK(gguf_find_kv(f, "k.f64")->v.f64 == -1e300);
    CHECK_EQ_INT(gguf_get_bool(f, "k.u8", &bl), BATON_ERR_FORMAT);
    CHECK_EQ_INT(gguf_get_u32(f, "k.bool", &u32), BATON_ERR_FORMAT);
    CHECK(strstr(baton_last_error(), "bool") != NULL);
    CHECK_EQ_INT(gguf_get_str(f, "a.str", &s), BATON_ERR_FORMAT);
    const gguf_kv_t *kv;
    CHECK_OK(gguf_get_arr(f, "a.i32", GGUF_VALUE_INT32, &kv));
    CHECK_EQ_INT(kv->v.arr.n, 3);
    CHECK_EQ_INT(gguf_arr_i64(kv, 1), -2);
    CHECK(gguf_arr_f64(kv, 2) == 3.0);
    CHECK_OK(gguf_get_arr(f, "a.f32", GGUF_VALUE_FLOAT32, &kv));
    CHECK(gguf_arr_f64(kv, 0) == 0.5 && gguf_arr_f64(kv, 1) == -8.0);
    CHECK_OK(gguf_get_arr(f, "a.str", GGUF_VALUE_STRING, &kv));
    CHECK_EQ_INT(kv->v.arr.n, 3);
    CHECK(gguf_str_eq(kv->v.arr.strs[0], "x") && gguf_str_eq(kv->v.arr.strs[1], "") &&
          gguf_str_eq(kv->v.arr.strs[2], "yz"));
    CHECK_OK(gguf_get_arr(f, "a.u8", GGUF_VALUE_UINT8, &kv));
    CHECK_EQ_INT(gguf_arr_i64(kv, 0), 255);
    CHECK_OK(gguf_get_arr(f, "a.bool", GGUF_VALUE_BOOL, &kv));
    CHECK_EQ_INT(gguf_arr_i64(kv, 1), 1);
    CHECK_OK(gguf_get_arr(f, "a.empty", GGUF_VALUE_INT64, &kv));
    CHECK_EQ_INT(kv->v.arr.n, 0);
    CHECK_EQ_INT(gguf_get_arr(f, "a.i32", GGUF_VALUE_UINT32, &kv), BATON_ERR_FORMAT);
    CHECK(strstr(baton_last_error(), "int32") && strstr(baton_last_error(), "a.i32"));
    CHECK_EQ_INT(gguf_get_arr(f, "k.u8", GGUF_VALUE_UINT8, &kv), BATON_ERR_FORMAT);
    CHECK_EQ_INT(gguf_get_arr(f, "nope", GGUF_VALUE_UINT8, &kv), BATON_ERR_NOT_FOUND);

    const gguf_tensor_t *ta = gguf_find_tensor(f, "a"), *tb = gguf_find_tensor(f, "b"),
                        *tc = gguf_find_tensor(f, "c"), *td = gguf_find_tensor(f, "d");
    CHECK(ta && tb && tc && td && gguf_find_tensor(f, "e") == NULL);
    if (ta && tb && tc && td) {
        CHECK(ta == gguf_tensor_at(f, 0) && td == gguf_tensor_at(f, 3));
        CHECK(gguf_tensor_at(f, 4) == NULL);
        CHECK_EQ_INT(ta->n_bytes, 32);
        CHECK_EQ_INT(tb->n_bytes, 40);
        CHECK_EQ_INT(tc->n_bytes, 16);
        CHECK_EQ_INT(td->n_bytes, 22);
        CHECK_EQ_INT(tb->ne[2], 1);
        CHECK_EQ_INT(gguf_tensor_n_elements(tb), 64);
        CHECK((const uint8_t *)td->data + td->n_bytes == b.p + b.n);
        float out[64];
        CHECK_OK(gguf_tensor_to_f32(ta, out));
        CHECK(out[0] == 1 && out[3] == 4 && out[7] == -4.5f);
        CHECK_OK(gguf_tensor_to_f32(tb, out));
        /* y = d*q + m with q = j (low nibbles) and 15-j (high nibbles) */
        for (int blk = 0; blk < 2; blk++) {
            for (int j = 0; j < 16; j++) {
                CHECK(out[32 * blk + j] == (float)j - 8.0f);
                CHECK(out[32 * blk + 16 + j] == (float)(15 - j) - 8.0f);
            }
        }
        CHECK_OK(gguf_tensor_to_f32(tc, out));
        CHECK(out[0] == 1.0f && out[1] == -2.0f && out[2] == 0.5f && out[4] == 65504.0f &&
              out[5] == 5.9604644775390625e-08f && out[6] == 0.333251953125f);
        CHECK_EQ_INT(gguf_tensor_to_f32(td, out), BATON_ERR_UNSUPPORTED);
        CHECK(strstr(baton_last_error(), "'d'") && strstr(baton_last_error(), "q5_0"));
    }
    gguf_close(f);

    /* Version 2 has the same layout. */
    build_valid(&b, 2);
    f = NULL;
    CHECK_OK(gguf_open_memory(b.p, b.n, &f));
    if (f) CHECK_EQ_INT(gguf_version(f), 2);
    gguf_close(f);

    /* Every proper prefix is rejected as malformed. */
    build_valid(&b, 3);
    int prefix_fail = 0;
    for (size_t n = 0; n < b.n; n++) {
        uint8_t *copy = malloc(n ? n : 1); /* exact size, so ASan sees any over-read */
        memcpy(copy, b.p, n);
        gguf_file_t *g = (gguf_file_t *)(uintptr_t)0x1;
        baton_status_t st2 = gguf_open_memory(n ? copy : NULL, n, &g);
        if (st2 != BATON_ERR_FORMAT || g != (gguf_file_t *)(uintptr_t)0x1 ||
            (strstr(baton_last_error(), "truncated") == NULL &&
             strstr(baton_last_error(), "exceeds") == NULL &&
             strstr(baton_last_error(), "cannot fit") == NULL)) {
            if (prefix_fail++ < 5) {
                fprintf(stderr, "prefix %zu: status %d: %s\n", n, st2, baton_last_error());
            }
        }
        free(copy);
    }
    CHECK_EQ_INT(prefix_fail, 0);
    fprintf(stderr, "valid file of %zu bytes: all %zu prefixes rejected\n", b.n, b.n);
    free(b.p);
}

/* ---- damaged files ------------------------------------------------------- */

static void check_bad(void) {
    buf_t b = {0};
    const uint64_t ne32[] = {32};
    tspec_t one[] = {{"t0", 1, {32}, GGML_TYPE_F32, 0}};

    build(&b, 3, 0, one, 1, 128);
    EXPECT_FAIL(b.p, b.n, BATON_OK, NULL, "baseline");

    b.p[3] = 'X';
    EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "magic", "bad magic");

    build(&b, 1, 0, one, 1, 128);
    EXPECT_FAIL(b.p, b.n, BATON_ERR_VERSION, "version 1", "version 1");
    build(&b, 99, 0, one, 1, 128);
    EXPECT_FAIL(b.p, b.n, BATON_ERR_VERSION, "version 99", "version 99");

    /* Absurd counts. */
    b.n = 0;
    b_header(&b, 3, 0, UINT64_C(1) << 60);
    b_kv_u32(&b, "x", 1);
    EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "n_kv", "absurd n_kv");
    b.n = 0;
    b_header(&b, 3, UINT64_MAX, 0);
    b_zeros(&b, 64);
    EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "n_tensors", "absurd n_tensors");
    /* n_tensors plausible before the kvs, not after them. */
    b.n = 0;
    b_header(&b, 3, 2, 1);
    b_str(&b, "pad"); b_u32(&b, GGUF_VALUE_ARRAY); b_u32(&b, GGUF_VALUE_UINT8); b_u64(&b, 40);
    b_zeros(&b, 40);
    b_tensor(&b, "t", 1, ne32, GGML_TYPE_F32, 0);
    EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "n_tensors", "n_tensors vs bytes after kvs");

    /* Absurd string length: key, value, array element. */
    b.n = 0;
    b_header(&b, 3, 0, 1);
    b_u64(&b, UINT64_C(1) << 62);
    b_zeros(&b, 16);
    EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "string length", "absurd key length");
    b.n = 0;
    b_header(&b, 3, 0, 1);
    b_str(&b, "s"); b_u32(&b, GGUF_VALUE_STRING); b_u64(&b, UINT64_MAX);
    b_zeros(&b, 16);
    EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "string length", "absurd value length");
    b.n = 0;
    b_header(&b, 3, 0, 1);
    b_str(&b, "tok"); b_u32(&b, GGUF_VALUE_ARRAY); b_u32(&b, GGUF_VALUE_STRING); b_u64(&b, 2);
    b_str(&b, "a"); b_u64(&b, 1000); b_zeros(&b, 8);
    EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "'tok' element 1", "absurd element length");

    /* Absurd array length. */
    b.n = 0;
    b_header(&b, 3, 0, 1);
    b_str(&b, "arr"); b_u32(&b, GGUF_VALUE_ARRAY); b_u32(&b, GGUF_VALUE_UINT32);
    b_u64(&b, UINT64_C(1) << 62);
    b_zeros(&b, 64);
    EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "array length", "absurd array length");
    b.n = 0;
    b_header(&b, 3, 0, 1);
    b_str(&b, "arr"); b_u32(&b, GGUF_VALUE_ARRAY); b_u32(&b, GGUF_VALUE_STRING);
    b_u64(&b, UINT64_MAX / 2);
    b_zeros(&b, 64);
    EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "array length", "absurd string array length");

    /* Nested array, unknown value types, bad bools. */
    b.n = 0;
    b_header(&b, 3, 0, 1);
    b_str(&b, "nest"); b_u32(&b, GGUF_VALUE_ARRAY); b_u32(&b, GGUF_VALUE_ARRAY); b_u64(&b, 1);
    b_u32(&b, GGUF_VALUE_UINT8); b_u64(&b, 1); b_u8(&b, 0);
    EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "nested", "nested array");
    b.n = 0;
    b_header(&b, 3, 0, 1);
    b_str(&b, "weird"); b_u32(&b, 13); b_u64(&b, 0);
    EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "unknown value type 13", "value type 13");
    b.n = 0;
    b_header(&b, 3, 0, 1);
    b_str(&b, "weird"); b_u32(&b, GGUF_VALUE_ARRAY); b_u32(&b, 77); b_u64(&b, 0);
    EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "element type 77", "array element type 77");
    b.n = 0;
    b_header(&b, 3, 0, 1);
    b_str(&b, "flag"); b_u32(&b, GGUF_VALUE_BOOL); b_u8(&b, 2);
    EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "'flag'", "bool 2");

    /* Duplicate key. */
    b.n = 0;
    b_header(&b, 3, 0, 3);
    b_kv_u32(&b, "a", 1);
    b_kv_u32(&b, "b", 1);
    b_kv_u32(&b, "a", 2);
    EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "duplicate key 'a'", "duplicate key");

    /* general.alignment: not a power of two, zero, wrong type; a good one. */
    build(&b, 3, 48, one, 1, 128);
    EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "power of two", "alignment 48");
    b.n = 0;
    b_header(&b, 3, 0, 1);
    b_kv_u32(&b, "general.alignment", 0);
    EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "power of two", "alignment 0");
    b.n = 0;
    b_header(&b, 3, 0, 1);
    b_str(&b, "general.alignment"); b_u32(&b, GGUF_VALUE_STRING); b_str(&b, "32");
    EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "general.alignment", "alignment string");
    {
        tspec_t t2[] = {{"t0", 1, {32}, GGML_TYPE_F32, 0}, {"t1", 1, {4}, GGML_TYPE_F32, 256}};
        build(&b, 3, 256, t2, 2, 272);
        EXPECT_FAIL(b.p, b.n, BATON_OK, NULL, "alignment 256");
        t2[1].offset = 128;
        build(&b, 3, 256, t2, 2, 272);
        EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "alignment 256", "misaligned for 256");
    }

    /* Tensor infos. */
    {
        tspec_t t = {"bad.dims", 0, {32}, GGML_TYPE_F32, 0};
        build(&b, 3, 0, &t, 1, 128);
        EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "n_dims 0", "n_dims 0");
        EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "'bad.dims'", "n_dims 0 names tensor");
        t.n_dims = 5;
        t.ne[1] = t.ne[2] = t.ne[3] = t.ne[4] = 1;
        build(&b, 3, 0, &t, 1, 128);
        EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "n_dims 5", "n_dims 5");
        tspec_t z = {"zero", 2, {32, 0}, GGML_TYPE_F32, 0};
        build(&b, 3, 0, &z, 1, 128);
        EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "ne[1] = 0", "ne 0");
        tspec_t o = {"huge", 3, {UINT64_C(1) << 31, UINT64_C(1) << 31, UINT64_C(1) << 2},
                     GGML_TYPE_F32, 0};
        build(&b, 3, 0, &o, 1, 128);
        EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "overflows", "ne product overflow");
        tspec_t o2 = {"huge2", 1, {UINT64_C(1) << 63}, GGML_TYPE_F32, 0};
        build(&b, 3, 0, &o2, 1, 128);
        EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "'huge2'", "ne >= 2^63");
        tspec_t o3 = {"huge3", 2, {UINT64_C(1) << 40, UINT64_C(1) << 21}, GGML_TYPE_F32, 0};
        build(&b, 3, 0, &o3, 1, 128);
        EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "overflows", "byte size overflow");
        tspec_t u = {"blk.0.attn_q.weight", 1, {32}, 99, 0};
        build(&b, 3, 0, &u, 1, 128);
        EXPECT_FAIL(b.p, b.n, BATON_ERR_UNSUPPORTED, "'blk.0.attn_q.weight': unknown tensor type 99",
                    "unknown type");
        tspec_t blk = {"q", 1, {16}, GGML_TYPE_Q4_1, 0};
        build(&b, 3, 0, &blk, 1, 128);
        EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "block size", "ne[0] not a block multiple");
        tspec_t mis = {"mis", 1, {32}, GGML_TYPE_F32, 4};
        build(&b, 3, 0, &mis, 1, 256);
        EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "'mis': offset 4 is not a multiple", "misaligned");
        tspec_t far = {"far", 1, {32}, GGML_TYPE_F32, 1024};
        build(&b, 3, 0, &far, 1, 256);
        EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "'far': data [", "out of range");
        EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "exceeds file size", "out of range detail");
        tspec_t wrap = {"wrap", 1, {64}, GGML_TYPE_F32, UINT64_MAX - 31};
        build(&b, 3, 0, &wrap, 1, 256);
        EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "'wrap'", "offset wraps");
        tspec_t edge = {"edge", 1, {32}, GGML_TYPE_F32, 0};
        build(&b, 3, 0, &edge, 1, 127);
        EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "'edge': data [", "one byte short");
    }
    {
        tspec_t ov[] = {{"first", 1, {64}, GGML_TYPE_F32, 0},  /* [0, 256) */
                        {"second", 1, {8}, GGML_TYPE_F32, 224}};
        build(&b, 3, 0, ov, 2, 512);
        EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "overlaps", "overlap");
        EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "'first'", "overlap names tensors");
        tspec_t same[] = {{"x", 1, {8}, GGML_TYPE_F32, 0}, {"y", 1, {8}, GGML_TYPE_F32, 0}};
        build(&b, 3, 0, same, 2, 512);
        EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "overlaps", "same offset");
        tspec_t dup[] = {{"w", 1, {8}, GGML_TYPE_F32, 0}, {"w", 1, {8}, GGML_TYPE_F32, 32}};
        build(&b, 3, 0, dup, 2, 512);
        EXPECT_FAIL(b.p, b.n, BATON_ERR_FORMAT, "duplicate tensor name 'w'", "duplicate name");
        tspec_t adj[] = {{"lo", 1, {8}, GGML_TYPE_F32, 32}, {"hi", 1, {8}, GGML_TYPE_F32, 0}};
        build(&b, 3, 0, adj, 2, 64);
        EXPECT_FAIL(b.p, b.n, BATON_OK, NULL, "adjacent tensors out of order");
    }
    /* No tensors and no data section at all. */
    b.n = 0;
    b_header(&b, 3, 0, 0);
    EXPECT_FAIL(b.p, b.n, BATON_OK, NULL, "header only");
    EXPECT_FAIL(NULL, 0, BATON_ERR_FORMAT, "truncated", "empty buffer");
    gguf_file_t *f = NULL;
    CHECK_EQ_INT(gguf_open_memory(b.p, b.n, NULL), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(gguf_open_memory(NULL, 5, &f), BATON_ERR_INVALID_ARG);
    gguf_close(NULL);
    free(b.p);
}

/* Regression (found by fuzz_gguf): gguf_arr_i64 on float elements outside
 * int64 was an undefined cast; it now saturates, NaN gives 0. */
static void check_arr_i64_saturates(void) {
    buf_t b = {0};
    b_header(&b, 3, 0, 2);
    b_str(&b, "f"); b_u32(&b, GGUF_VALUE_ARRAY); b_u32(&b, GGUF_VALUE_FLOAT32); b_u64(&b, 5);
    b_f32(&b, 1.0e34f); b_f32(&b, -1.0e34f); b_f32(&b, NAN); b_f32(&b, -2.75f);
    b_f32(&b, 9.2233720e18f); /* 2^63 as a float */
    b_str(&b, "u"); b_u32(&b, GGUF_VALUE_ARRAY); b_u32(&b, GGUF_VALUE_UINT64); b_u64(&b, 1);
    b_u64(&b, UINT64_MAX);
    gguf_file_t *f = NULL;
    CHECK_OK(gguf_open_memory(b.p, b.n, &f));
    const gguf_kv_t *kv;
    if (f && gguf_get_arr(f, "f", GGUF_VALUE_FLOAT32, &kv) == BATON_OK) {
        CHECK(gguf_arr_i64(kv, 0) == INT64_MAX);
        CHECK(gguf_arr_i64(kv, 1) == INT64_MIN);
        CHECK(gguf_arr_i64(kv, 2) == 0);
        CHECK(gguf_arr_i64(kv, 3) == -2);
        CHECK(gguf_arr_i64(kv, 4) == INT64_MAX);
        CHECK(isnan(gguf_arr_f64(kv, 2)));
    }
    if (f && gguf_get_arr(f, "u", GGUF_VALUE_UINT64, &kv) == BATON_OK) {
        CHECK(gguf_arr_i64(kv, 0) == INT64_MAX);
        CHECK(gguf_arr_f64(kv, 0) == 18446744073709551615.0);
    }
    gguf_close(f);
    free(b.p);
}

static void check_paths(void) {
    gguf_file_t *f = (gguf_file_t *)(uintptr_t)0x1;
    CHECK_EQ_INT(gguf_open("/nonexistent/dir/model.gguf", &f), BATON_ERR_IO);
    CHECK(strstr(baton_last_error(), "/nonexistent/dir/model.gguf") != NULL);
    CHECK_EQ_INT(gguf_open("/tmp", &f), BATON_ERR_IO);
    CHECK(strstr(baton_last_error(), "not a regular file") != NULL);
    CHECK(f == (gguf_file_t *)(uintptr_t)0x1);

    char path[] = "/tmp/baton_test_gguf_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    CHECK_EQ_INT(gguf_open(path, &f), BATON_ERR_FORMAT); /* empty */
    CHECK(strstr(baton_last_error(), "empty") != NULL);
    buf_t b = {0};
    build_valid(&b, 3);
    CHECK(write(fd, b.p, b.n) == (ssize_t)b.n);
    f = NULL;
    CHECK_OK(gguf_open(path, &f));
    if (f) {
        CHECK_EQ_INT(gguf_n_tensors(f), 4);
        CHECK_EQ_INT(gguf_file_size(f), b.n);
        gguf_close(f);
    }
    CHECK(ftruncate(fd, (off_t)b.n - 1) == 0);
    CHECK_EQ_INT(gguf_open(path, &f), BATON_ERR_FORMAT);
    CHECK(strstr(baton_last_error(), "exceeds file size") && strstr(baton_last_error(), path));
    close(fd);
    unlink(path);
    free(b.p);
}

int main(void) {
    check_valid();
    check_bad();
    check_arr_i64_saturates();
    check_paths();
    return TEST_DONE();
}
