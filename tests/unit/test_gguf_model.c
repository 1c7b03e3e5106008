/* The GGUF reader on the real default model, against values the `gguf`
 * Python package reports (tests/golden/gen_dequant.py wrote
 * tests/data/dequant_model_meta.txt and dequant_model.bin). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dequant.h"
#include "common/gguf.h"
#include "tests/test_util.h"

static char *data_path(const char *name) {
    static char buf[4096];
    const char *src = getenv("BATON_SOURCE_DIR");
    snprintf(buf, sizeof(buf), "%s/tests/data/%s", src ? src : ".", name);
    return buf;
}

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

/* Decodes lowercase hex into a malloc'd buffer; *len gets the byte count. */
static char *unhex(const char *hex, size_t *len) {
    size_t n = strlen(hex) / 2;
    char *out = malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (char)v;
    }
    out[n] = 0;
    *len = n;
    return out;
}

static bool str_is(gguf_str_t s, const char *data, size_t len) {
    return s.len == len && memcmp(s.data, data, len) == 0;
}

static int check_meta(gguf_file_t *f) {
    FILE *m = fopen(data_path("dequant_model_meta.txt"), "r");
    CHECK_MSG(m != NULL, "cannot open %s", data_path("dequant_model_meta.txt"));
    if (!m) return 0;
    static char line[1 << 16];
    int n_lines = 0, n_tensor_lines = 0;
    while (fgets(line, sizeof(line), m)) {
        line[strcspn(line, "\n")] = 0;
        char kind[32], key[256], val[1 << 15];
        unsigned long long a, b;
        n_lines++;
        if (sscanf(line, "%31s", kind) != 1) continue;
        bool is_str = strcmp(kind, "str") == 0;
        if (sscanf(line, "version %llu", &a) == 1) {
            CHECK_EQ_INT(gguf_version(f), a);
        } else if (sscanf(line, "n_tensors %llu", &a) == 1) {
            CHECK_EQ_INT(gguf_n_tensors(f), a);
        } else if (sscanf(line, "n_kv %llu", &a) == 1) {
            CHECK_EQ_INT(gguf_n_kv(f), a);
        } else if (sscanf(line, "alignment %llu", &a) == 1) {
            CHECK_EQ_INT(gguf_alignment(f), a);
        } else if (sscanf(line, "data_offset %llu", &a) == 1) {
            CHECK_EQ_INT(gguf_data_offset(f), a);
        } else if (sscanf(line, "u32 %255s %llu", key, &a) == 2) {
            uint32_t v = 0;
            CHECK_OK(gguf_get_u32(f, key, &v));
            CHECK_MSG(v == a, "%s: %u vs %llu", key, v, a);
            uint64_t v64 = 0;
            CHECK_OK(gguf_get_u64(f, key, &v64));
            CHECK_EQ_INT(v64, a);
        } else if (sscanf(line, "f32 %255s %llx", key, &a) == 2) {
            float v = 0;
            CHECK_OK(gguf_get_f32(f, key, &v));
            uint32_t bits;
            memcpy(&bits, &v, 4);
            CHECK_MSG(bits == a, "%s: %08x vs %08llx", key, bits, a);
        } else if (sscanf(line, "bool %255s %llu", key, &a) == 2) {
            bool v = !a;
            CHECK_OK(gguf_get_bool(f, key, &v));
            CHECK_EQ_INT(v, a);
        } else if (is_str && sscanf(line, "str %255s %32767s", key, val) == 2) {
            size_t len;
            char *want = unhex(val, &len);
            gguf_str_t s = {0};
            CHECK_OK(gguf_get_str(f, key, &s));
            CHECK_MSG(str_is(s, want, len), "%s differs", key);
            free(want);
        } else if (sscanf(line, "strarr %255s %llu %llu %32767s", key, &a, &b, val) == 4) {
            const gguf_kv_t *kv = NULL;
            CHECK_OK(gguf_get_arr(f, key, GGUF_VALUE_STRING, &kv));
            if (kv) {
                CHECK_EQ_INT(kv->v.arr.n, a);
                size_t len;
                char *want = unhex(val, &len);
                CHECK_MSG(b < kv->v.arr.n && str_is(kv->v.arr.strs[b], want, len),
                          "%s[%llu] differs", key, b);
                free(want);
            }
        } else if (sscanf(line, "i32arr %255s %llu %llu %32767s", key, &a, &b, val) == 4) {
            const gguf_kv_t *kv = NULL;
            CHECK_OK(gguf_get_arr(f, key, GGUF_VALUE_INT32, &kv));
            if (kv) {
                CHECK_EQ_INT(kv->v.arr.n, a);
                CHECK_EQ_INT(gguf_arr_i64(kv, b), atoll(val));
                CHECK(gguf_arr_f64(kv, b) == (double)atoll(val));
            }
        } else if (strcmp(kind, "tensor") == 0) {
            char name[256];
            unsigned type, n_dims;
            long long ne[4];
            unsigned long long off, nbytes;
            int got = sscanf(line, "tensor %255s %u %u %lld %lld %lld %lld %llu %llu", name,
                             &type, &n_dims, &ne[0], &ne[1], &ne[2], &ne[3], &off, &nbytes);
            CHECK_EQ_INT(got, 9);
            const gguf_tensor_t *t = gguf_find_tensor(f, name);
            CHECK_MSG(t != NULL, "tensor %s not found", name);
            if (!t) continue;
            CHECK_EQ_INT(gguf_tensor_at(f, (uint64_t)n_tensor_lines), (intptr_t)t);
            CHECK_EQ_INT(t->type, type);
            CHECK_EQ_INT(t->n_dims, n_dims);
            for (int d = 0; d < 4; d++) CHECK_EQ_INT(t->ne[d], ne[d]);
            CHECK_EQ_INT(t->offset, off);
            CHECK_EQ_INT(t->n_bytes, nbytes);
            CHECK(t->data == (const uint8_t *)gguf_tensor_at(f, 0)->data - gguf_tensor_at(f, 0)->offset + off);
            n_tensor_lines++;
        } else {
            CHECK_MSG(0, "unparsed golden line: %.80s", line);
        }
    }
    fclose(m);
    CHECK_EQ_INT(n_tensor_lines, gguf_n_tensors(f));
    return n_lines;
}

/* Relative tolerance 1e-6 (exact for float types). */
static int compare(const float *got, const float *want, int64_t n, uint32_t type,
                   const char *what) {
    bool exact = type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float g = got[i], w = want[i];
        bool ok = exact ? memcmp(&g, &w, 4) == 0 : fabsf(g - w) <= 1e-6f * fabsf(w);
        if (!ok && bad++ < 5) {
            fprintf(stderr, "%s [%lld]: got %.9g want %.9g\n", what, (long long)i, g, w);
        }
    }
    CHECK_MSG(bad == 0, "%s: %d of %lld values differ", what, bad, (long long)n);
    return bad;
}

static int check_slices(gguf_file_t *f) {
    size_t size;
    uint8_t *buf = read_all(data_path("dequant_model.bin"), &size);
    CHECK_MSG(buf != NULL, "cannot read dequant_model.bin");
    if (!buf) return 0;
    CHECK(size >= 8 && memcmp(buf, "BDQM", 4) == 0);
    uint32_t count;
    memcpy(&count, buf + 4, 4);
    size_t p = 8;
    int types_seen[64] = {0};
    for (uint32_t r = 0; r < count; r++) {
        uint32_t name_len, type, row0, n_rows, row_elems;
        memcpy(&name_len, buf + p, 4);
        char name[256];
        snprintf(name, sizeof(name), "%.*s", (int)name_len, (const char *)buf + p + 4);
        p += 4 + name_len;
        memcpy(&type, buf + p, 4);
        memcpy(&row0, buf + p + 4, 4);
        memcpy(&n_rows, buf + p + 8, 4);
        memcpy(&row_elems, buf + p + 12, 4);
        p += 16;
        const float *want = (const float *)(buf + p); /* 4-aligned? copy to be safe */
        int64_t n = (int64_t)n_rows * row_elems;
        float *w = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
        memcpy(w, want, (size_t)n * 4);
        p += (size_t)n * 4;
        CHECK(p <= size);
        const gguf_tensor_t *t = gguf_find_tensor(f, name);
        CHECK_MSG(t != NULL, "%s not found", name);
        if (t) {
            CHECK_EQ_INT(t->type, type);
            CHECK_EQ_INT(t->ne[0], row_elems);
            if (type < 64) types_seen[type] = 1;
            int64_t rb = dequant_row_bytes(t->type, t->ne[0]);
            CHECK_OK(dequant_row(t->type, (const uint8_t *)t->data + (int64_t)row0 * rb, got, n));
            char what[300];
            snprintf(what, sizeof(what), "%s rows %u+%u", name, row0, n_rows);
            compare(got, w, n, type, what);
            /* The whole-tensor path gives the same rows. */
            int64_t all = gguf_tensor_n_elements(t);
            float *full = malloc((size_t)all * 4);
            CHECK_OK(gguf_tensor_to_f32(t, full));
            CHECK(memcmp(full + (int64_t)row0 * row_elems, got, (size_t)n * 4) == 0);
            free(full);
        }
        free(w);
        free(got);
    }
    CHECK_EQ_INT(p, size);
    /* The default model holds F32, Q4_1 and Q8_0 tensors. */
    CHECK(types_seen[GGML_TYPE_F32] && types_seen[GGML_TYPE_Q4_1] && types_seen[GGML_TYPE_Q8_0]);
    free(buf);
    return (int)count;
}

int main(void) {
    const char *path = test_default_model();
    CHECK(path != NULL);
    if (!path) return TEST_DONE();
    gguf_file_t *f = NULL;
    baton_status_t st = gguf_open(path, &f);
    CHECK_MSG(st == BATON_OK, "gguf_open: %s", baton_last_error());
    if (st != BATON_OK) return TEST_DONE();
    CHECK_EQ_INT(gguf_file_size(f), 98362432);
    int n = check_meta(f);
    CHECK(n > 280);
    int s = check_slices(f);
    CHECK(s >= 6);

    /* Getter errors name the key and type. */
    uint32_t u;
    CHECK_EQ_INT(gguf_get_u32(f, "no.such.key", &u), BATON_ERR_NOT_FOUND);
    CHECK(strstr(baton_last_error(), "no.such.key") != NULL);
    CHECK_EQ_INT(gguf_get_u32(f, "general.architecture", &u), BATON_ERR_FORMAT);
    CHECK(strstr(baton_last_error(), "general.architecture") &&
          strstr(baton_last_error(), "string"));
    const gguf_kv_t *kv;
    CHECK_EQ_INT(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VALUE_INT32, &kv),
                 BATON_ERR_FORMAT);
    float fl;
    CHECK_EQ_INT(gguf_get_f32(f, "llama.block_count", &fl), BATON_ERR_FORMAT);
    CHECK(gguf_find_tensor(f, "blk.30.attn_q.weight") == NULL);
    CHECK(gguf_find_kv(f, "general.alignmen") == NULL);
    fprintf(stderr, "meta lines %d, slices %d\n", n, s);
    gguf_close(f);
    return TEST_DONE();
}
