/* libFuzzer target: gguf_open_memory on arbitrary bytes, then every accessor
 * over what it accepted (all kvs, array elements, strings, typed getters,
 * tensor lookups) and conversion of the small tensors. Any crash, ASan/UBSan
 * report or leak is a bug. Seeds: tests/fuzz/corpus_gguf/ (made by
 * tests/golden/gen_dequant_fuzz_seeds.py with the gguf Python writer). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/dequant.h"
#include "common/gguf.h"

static volatile double g_sink;

static void walk(const gguf_file_t *f) {
    double acc = 0;
    char key[256];
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv_t *kv = gguf_kv_at(f, i);
        size_t kl = kv->key.len < sizeof(key) - 1 ? (size_t)kv->key.len : sizeof(key) - 1;
        memcpy(key, kv->key.data, kl);
        key[kl] = 0;
        const gguf_kv_t *found = gguf_find_kv(f, key);
        if (kl == kv->key.len && memchr(key, 0, kl) == NULL && found != kv) abort();
        uint32_t u32;
        uint64_t u64;
        int64_t i64;
        float f32;
        bool b;
        gguf_str_t s;
        const gguf_kv_t *arr;
        acc += gguf_get_u32(f, key, &u32) + gguf_get_u64(f, key, &u64) +
               gguf_get_i64(f, key, &i64) + gguf_get_f32(f, key, &f32) +
               gguf_get_bool(f, key, &b) + gguf_get_str(f, key, &s);
        if (kv->type == GGUF_VALUE_STRING && kv->v.str.len) {
            acc += (unsigned char)kv->v.str.data[kv->v.str.len - 1];
        }
        if (kv->type != GGUF_VALUE_ARRAY) continue;
        if (gguf_get_arr(f, key, kv->v.arr.type, &arr) == BATON_OK && found == kv && arr != kv) {
            abort();
        }
        for (uint64_t j = 0; j < kv->v.arr.n; j++) {
            if (kv->v.arr.type == GGUF_VALUE_STRING) {
                gguf_str_t e = kv->v.arr.strs[j];
                if (e.len) acc += (unsigned char)e.data[0] + (unsigned char)e.data[e.len - 1];
            } else {
                acc += gguf_arr_f64(kv, j) + (double)gguf_arr_i64(kv, j);
            }
        }
    }
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(f, i);
        size_t nl = t->name.len < sizeof(key) - 1 ? (size_t)t->name.len : sizeof(key) - 1;
        memcpy(key, t->name.data, nl);
        key[nl] = 0;
        const gguf_tensor_t *found = gguf_find_tensor(f, key);
        if (nl == t->name.len && memchr(key, 0, nl) == NULL && found != t) abort();
        int64_t n = gguf_tensor_n_elements(t);
        if (t->n_bytes) {
            acc += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->n_bytes - 1];
        }
        if (n > (1 << 16)) continue;
        float *out = malloc((size_t)n * sizeof(float));
        if (!out) continue;
        if (gguf_tensor_to_f32(t, out) == BATON_OK) {
            for (int64_t j = 0; j < n; j++) acc += out[j];
        }
        free(out);
    }
    g_sink = acc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file_t *f = NULL;
    if (gguf_open_memory(data, size, &f) == BATON_OK) {
        walk(f);
        gguf_close(f);
    }
    return 0;
}
