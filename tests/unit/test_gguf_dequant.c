/* Dequantization of every supported ggml type against gguf.quants.dequantize
 * (the `gguf` Python package) on generated blocks: random quant bytes with
 * sane fp16 scales, written by tests/golden/gen_dequant.py into
 * tests/data/dequant_blocks.bin. Exact for F32/F16/BF16, 1e-6 relative for
 * the block formats. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dequant.h"
#include "common/gguf.h"
#include "tests/test_util.h"

static void *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return buf;
}

static uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void check_golden_blocks(void) {
    char path[4096];
    const char *src = getenv("BATON_SOURCE_DIR");
    snprintf(path, sizeof(path), "%s/tests/data/dequant_blocks.bin", src ? src : ".");
    size_t size;
    uint8_t *buf = read_all(path, &size);
    CHECK_MSG(buf != NULL, "cannot read %s", path);
    if (!buf) return;
    CHECK(size >= 8 && memcmp(buf, "BDQB", 4) == 0);
    uint32_t count = rd32(buf + 4);
    size_t p = 8;
    bool seen[64] = {0};
    for (uint32_t r = 0; r < count && p + 12 <= size; r++) {
        uint32_t type = rd32(buf + p), n = rd32(buf + p + 4), nb = rd32(buf + p + 8);
        p += 12;
        CHECK(p + nb + 4ull * n <= size);
        if (p + nb + 4ull * n > size) break;
        CHECK_EQ_INT(dequant_row_bytes(type, n), nb);
        /* Source at an odd address: the row functions must not assume alignment. */
        uint8_t *raw = malloc(nb + 1);
        memcpy(raw + 1, buf + p, nb);
        float *want = malloc(4ull * n), *got = malloc(4ull * n);
        memcpy(want, buf + p + nb, 4ull * n);
        p += nb + 4ull * n;
        CHECK_MSG(dequant_supported(type), "type %u", type);
        CHECK_OK(dequant_row(type, raw + 1, got, n));
        bool exact = type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16;
        int bad = 0;
        float max_rel = 0;
        for (uint32_t i = 0; i < n; i++) {
            bool ok = exact ? memcmp(&got[i], &want[i], 4) == 0
                            : fabsf(got[i] - want[i]) <= 1e-6f * fabsf(want[i]);
            if (want[i] != 0) {
                float rel = fabsf(got[i] - want[i]) / fabsf(want[i]);
                if (rel > max_rel) max_rel = rel;
            }
            if (!ok && bad++ < 5) {
                fprintf(stderr, "%s[%u]: got %.9g want %.9g\n", ggml_type_name(type), i, got[i],
                        want[i]);
            }
        }
        CHECK_MSG(bad == 0, "%s: %d of %u values differ", ggml_type_name(type), bad, n);
        fprintf(stderr, "%-5s %4u values, max relative difference %g\n", ggml_type_name(type), n,
                max_rel);
        if (type < 64) seen[type] = true;
        free(raw);
        free(want);
        free(got);
    }
    CHECK_EQ_INT(p, size);
    const uint32_t all[] = {GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16,
                            GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
                            GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        CHECK_MSG(seen[all[i]], "no golden record for %s", ggml_type_name(all[i]));
    }
    free(buf);
}

/* IEEE 754 binary16 values from the standard's encoding. */
static void check_fp16_specials(void) {
    CHECK(dequant_fp16_to_f32(0x3c00) == 1.0f);
    CHECK(dequant_fp16_to_f32(0xc000) == -2.0f);
    CHECK(dequant_fp16_to_f32(0x7bff) == 65504.0f);
    CHECK(dequant_fp16_to_f32(0x0400) == 6.103515625e-05f);      /* smallest normal */
    CHECK(dequant_fp16_to_f32(0x0001) == 5.9604644775390625e-08f); /* smallest subnormal */
    CHECK(dequant_fp16_to_f32(0x03ff) == 6.097555160522461e-05f);  /* largest subnormal */
    CHECK(dequant_fp16_to_f32(0x3555) == 0.333251953125f);
    float nz = dequant_fp16_to_f32(0x8000);
    CHECK(nz == 0.0f && signbit(nz));
    CHECK(isinf(dequant_fp16_to_f32(0x7c00)) && dequant_fp16_to_f32(0x7c00) > 0);
    CHECK(isinf(dequant_fp16_to_f32(0xfc00)) && dequant_fp16_to_f32(0xfc00) < 0);
    CHECK(isnan(dequant_fp16_to_f32(0x7e00)));
    CHECK(dequant_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(dequant_bf16_to_f32(0xc049) == -3.140625f);
}

static void check_errors(void) {
    float out[64];
    uint8_t src[64 * 4] = {0};
    /* Known to ggml but not converted by baton. */
    baton_status_t st = dequant_row(GGML_TYPE_Q5_0, src, out, 32);
    CHECK_EQ_INT(st, BATON_ERR_UNSUPPORTED);
    CHECK(strstr(baton_last_error(), "q5_0") != NULL);
    st = dequant_row(99, src, out, 32);
    CHECK_EQ_INT(st, BATON_ERR_UNSUPPORTED);
    CHECK(strstr(baton_last_error(), "99") != NULL);
    CHECK_EQ_INT(dequant_row(GGML_TYPE_Q4_1, src, out, 31), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(dequant_row(GGML_TYPE_Q4_K, src, out, 32), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(dequant_row(GGML_TYPE_F32, src, out, -1), BATON_ERR_INVALID_ARG);
    CHECK_OK(dequant_row(GGML_TYPE_F32, src, out, 0));
    /* Geometry from ggml.c type_traits. */
    CHECK_EQ_INT(dequant_row_bytes(GGML_TYPE_Q4_1, 64), 40);
    CHECK_EQ_INT(dequant_row_bytes(GGML_TYPE_Q6_K, 512), 420);
    CHECK_EQ_INT(dequant_row_bytes(GGML_TYPE_Q5_K, 256), 176);
    CHECK_EQ_INT(dequant_row_bytes(GGML_TYPE_Q4_K, 256), 144);
    CHECK_EQ_INT(dequant_row_bytes(GGML_TYPE_Q8_0, 32), 34);
    CHECK_EQ_INT(dequant_row_bytes(GGML_TYPE_BF16, 3), 6);
    CHECK_EQ_INT(dequant_row_bytes(GGML_TYPE_Q4_0, 33), -1);
    CHECK_EQ_INT(dequant_row_bytes(4, 32), -1); /* removed Q4_2 */
    CHECK_EQ_INT(dequant_row_bytes(GGML_TYPE_F32, INT64_MAX), -1);
    CHECK(strcmp(ggml_type_name(GGML_TYPE_Q6_K), "q6_K") == 0);
    CHECK(strcmp(ggml_type_name(1234), "type#1234") == 0);
    CHECK(!dequant_supported(GGML_TYPE_Q8_K));
}

/* The type table against ggml's own ggml_type_name / ggml_blck_size /
 * ggml_type_size (tests/golden/gen_dequant_ggml.py). */
static void check_ggml_types(void) {
    char path[4096];
    const char *src = getenv("BATON_SOURCE_DIR");
    snprintf(path, sizeof(path), "%s/tests/data/dequant_ggml_types.txt", src ? src : ".");
    FILE *f = fopen(path, "r");
    CHECK_MSG(f != NULL, "cannot open %s", path);
    if (!f) return;
    unsigned type;
    char name[64];
    long long be, bb;
    unsigned n = 0;
    while (fscanf(f, "%u %63s %lld %lld", &type, name, &be, &bb) == 4) {
        CHECK_EQ_INT(type, n);
        int64_t e = -1, b = -1;
        bool known = ggml_type_geometry(type, &e, &b);
        if (strcmp(name, "-") == 0) {
            CHECK_MSG(!known, "type %u is removed in ggml", type);
            CHECK(e == -1 && b == -1);
        } else {
            CHECK_MSG(known && e == be && b == bb, "type %u (%s): %lld/%lld vs ggml %lld/%lld",
                      type, name, (long long)e, (long long)b, be, bb);
            CHECK_MSG(strcmp(ggml_type_name(type), name) == 0, "type %u: %s vs %s", type,
                      ggml_type_name(type), name);
        }
        n++;
    }
    fclose(f);
    CHECK_EQ_INT(n, 43);
    int64_t e, b;
    CHECK(!ggml_type_geometry(n, &e, &b)); /* GGML_TYPE_COUNT */
}

int main(void) {
    check_ggml_types();
    check_golden_blocks();
    check_fp16_specials();
    check_errors();
    return TEST_DONE();
}
