/* GGUF reader. The whole file is parsed once at open through a bounds-checked
 * cursor; every count is checked against the bytes left before anything is
 * allocated for it, so a hostile file can make us allocate at most a small
 * multiple of its own size. Tensor data is never copied: tensors point into
 * the mapping (or the caller's buffer). Format: ggml docs/gguf.md. */
#define _GNU_SOURCE
#include "common/gguf.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dequant.h"

#define GGUF_DEFAULT_ALIGNMENT 32

struct gguf_file {
    const uint8_t *base; /* mapping or caller buffer */
    uint64_t size;       /* bytes */
    bool mapped;         /* munmap at close */
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset; /* start of the data section (bytes from base) */
    uint64_t n_kv;
    gguf_kv_t *kvs;            /* [n_kv], file order */
    uint64_t *kv_by_key;       /* [n_kv] indices sorted by key */
    uint64_t n_tensors;
    gguf_tensor_t *tensors;    /* [n_tensors], file order */
    uint64_t *tensor_by_name;  /* [n_tensors] indices sorted by name */
};

/* ---- bounded cursor ---------------------------------------------------- */

typedef struct cursor {
    const uint8_t *base;
    uint64_t size;
    uint64_t off;
} cursor_t;

static uint64_t cur_left(const cursor_t *c) { return c->size - c->off; }

static baton_status_t cur_need(const cursor_t *c, uint64_t n, const char *what) {
    if (n > cur_left(c)) {
        return baton_error(BATON_ERR_FORMAT,
                           "gguf: truncated: %s needs %llu bytes at offset %llu, file size %llu",
                           what, (unsigned long long)n, (unsigned long long)c->off,
                           (unsigned long long)c->size);
    }
    return BATON_OK;
}

static uint64_t rd_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

static baton_status_t cur_u32(cursor_t *c, uint32_t *out, const char *what) {
    baton_status_t st = cur_need(c, 4, what);
    if (st != BATON_OK) return st;
    *out = (uint32_t)rd_le(c->base + c->off, 4);
    c->off += 4;
    return BATON_OK;
}

static baton_status_t cur_u64(cursor_t *c, uint64_t *out, const char *what) {
    baton_status_t st = cur_need(c, 8, what);
    if (st != BATON_OK) return st;
    *out = rd_le(c->base + c->off, 8);
    c->off += 8;
    return BATON_OK;
}

static baton_status_t cur_str(cursor_t *c, gguf_str_t *out, const char *what) {
    uint64_t len;
    baton_status_t st = cur_u64(c, &len, what);
    if (st != BATON_OK) return st;
    if (len > cur_left(c)) {
        return baton_error(BATON_ERR_FORMAT,
                           "gguf: %s: string length %llu at offset %llu exceeds the %llu bytes left",
                           what, (unsigned long long)len, (unsigned long long)(c->off - 8),
                           (unsigned long long)cur_left(c));
    }
    out->data = (const char *)(c->base + c->off);
    out->len = len;
    c->off += len;
    return BATON_OK;
}

/* ---- value types --------------------------------------------------------- */

static const char *value_type_name(uint32_t t) {
    static const char *names[] = {"uint8", "int8",  "uint16", "int16", "uint32",
                                  "int32", "float32", "bool", "string", "array",
                                  "uint64", "int64", "float64"};
    return t < sizeof(names) / sizeof(names[0]) ? names[t] : "unknown";
}

/* Bytes of a fixed-size scalar type; 0 for STRING/ARRAY/unknown. */
static uint64_t scalar_size(uint32_t t) {
    switch (t) {
    case GGUF_VALUE_UINT8: case GGUF_VALUE_INT8: case GGUF_VALUE_BOOL: return 1;
    case GGUF_VALUE_UINT16: case GGUF_VALUE_INT16: return 2;
    case GGUF_VALUE_UINT32: case GGUF_VALUE_INT32: case GGUF_VALUE_FLOAT32: return 4;
    case GGUF_VALUE_UINT64: case GGUF_VALUE_INT64: case GGUF_VALUE_FLOAT64: return 8;
    default: return 0;
    }
}

static bool type_is_unsigned(uint32_t t) {
    return t == GGUF_VALUE_UINT8 || t == GGUF_VALUE_UINT16 || t == GGUF_VALUE_UINT32 ||
           t == GGUF_VALUE_UINT64;
}

static bool type_is_signed(uint32_t t) {
    return t == GGUF_VALUE_INT8 || t == GGUF_VALUE_INT16 || t == GGUF_VALUE_INT32 ||
           t == GGUF_VALUE_INT64;
}

static int64_t sext(uint64_t v, uint64_t size) {
    switch (size) {
    case 1: return (int8_t)v;
    case 2: return (int16_t)v;
    case 4: return (int32_t)v;
    default: return (int64_t)v;
    }
}

static double float_bits(uint64_t v, uint64_t size) {
    if (size == 4) {
        uint32_t b = (uint32_t)v;
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    double d;
    memcpy(&d, &v, 8);
    return d;
}

/* Reads a scalar of type t (already known to be a fixed-size scalar) at p
 * into kv->v. */
static void decode_scalar(uint32_t t, const uint8_t *p, gguf_kv_t *kv) {
    uint64_t sz = scalar_size(t);
    uint64_t raw = rd_le(p, (int)sz);
    if (type_is_signed(t)) {
        kv->v.i64 = sext(raw, sz);
    } else if (t == GGUF_VALUE_FLOAT32 || t == GGUF_VALUE_FLOAT64) {
        kv->v.f64 = float_bits(raw, sz);
    } else {
        kv->v.u64 = raw;
    }
}

#define KEYF(kv) (int)((kv)->key.len > 200 ? 200 : (kv)->key.len), (kv)->key.data

static baton_status_t parse_kv(cursor_t *c, gguf_kv_t *kv) {
    baton_status_t st = cur_str(c, &kv->key, "kv key");
    if (st != BATON_OK) return st;
    uint32_t type;
    if ((st = cur_u32(c, &type, "kv type")) != BATON_OK) return st;
    if (type > GGUF_VALUE_FLOAT64) {
        return baton_error(BATON_ERR_FORMAT, "gguf: key '%.*s': unknown value type %u", KEYF(kv),
                           type);
    }
    kv->type = (gguf_value_type_t)type;
    if (type == GGUF_VALUE_STRING) {
        return cur_str(c, &kv->v.str, "kv string value");
    }
    if (type != GGUF_VALUE_ARRAY) {
        uint64_t sz = scalar_size(type);
        if ((st = cur_need(c, sz, "kv value")) != BATON_OK) return st;
        const uint8_t *p = c->base + c->off;
        if (type == GGUF_VALUE_BOOL && p[0] > 1) {
            return baton_error(BATON_ERR_FORMAT, "gguf: key '%.*s': bool value %u is not 0 or 1",
                               KEYF(kv), p[0]);
        }
        decode_scalar(type, p, kv);
        c->off += sz;
        return BATON_OK;
    }
    uint32_t et;
    uint64_t n;
    if ((st = cur_u32(c, &et, "array element type")) != BATON_OK) return st;
    if ((st = cur_u64(c, &n, "array length")) != BATON_OK) return st;
    if (et == GGUF_VALUE_ARRAY) {
        return baton_error(BATON_ERR_FORMAT, "gguf: key '%.*s': nested arrays are not supported",
                           KEYF(kv));
    }
    if (et > GGUF_VALUE_FLOAT64) {
        return baton_error(BATON_ERR_FORMAT, "gguf: key '%.*s': unknown array element type %u",
                           KEYF(kv), et);
    }
    kv->v.arr.type = (gguf_value_type_t)et;
    kv->v.arr.data = c->base + c->off;
    kv->v.arr.strs = NULL;
    uint64_t min_elem = et == GGUF_VALUE_STRING ? 8 : scalar_size(et);
    if (n > cur_left(c) / min_elem) {
        return baton_error(BATON_ERR_FORMAT,
                           "gguf: key '%.*s': array length %llu of %s exceeds the %llu bytes left",
                           KEYF(kv), (unsigned long long)n, value_type_name(et),
                           (unsigned long long)cur_left(c));
    }
    if (et != GGUF_VALUE_STRING) {
        if (et == GGUF_VALUE_BOOL) {
            for (uint64_t i = 0; i < n; i++) {
                if (c->base[c->off + i] > 1) {
                    return baton_error(BATON_ERR_FORMAT,
                                       "gguf: key '%.*s': bool element %llu is %u, not 0 or 1",
                                       KEYF(kv), (unsigned long long)i, c->base[c->off + i]);
                }
            }
        }
        kv->v.arr.n = n;
        c->off += n * min_elem;
        return BATON_OK;
    }
    gguf_str_t *strs = malloc((n ? n : 1) * sizeof(*strs));
    if (!strs) {
        return baton_error(BATON_ERR_NO_MEMORY, "gguf: key '%.*s': no memory for %llu strings",
                           KEYF(kv), (unsigned long long)n);
    }
    for (uint64_t i = 0; i < n; i++) {
        if ((st = cur_str(c, &strs[i], "array string")) != BATON_OK) {
            free(strs);
            /* Re-issue with the key and element named; keep the cause. */
            char cause[256];
            snprintf(cause, sizeof(cause), "%s", baton_last_error());
            return baton_error(st, "gguf: key '%.*s' element %llu: %s", KEYF(kv),
                               (unsigned long long)i, cause);
        }
    }
    kv->v.arr.n = n;
    kv->v.arr.strs = strs;
    return BATON_OK;
}

/* ---- sorting helpers ----------------------------------------------------- */

static int str_cmp(gguf_str_t a, gguf_str_t b) {
    uint64_t n = a.len < b.len ? a.len : b.len;
    int r = n ? memcmp(a.data, b.data, n) : 0;
    if (r != 0) return r;
    return a.len < b.len ? -1 : a.len > b.len ? 1 : 0;
}

static _Thread_local const gguf_file_t *tls_sort_file;

static int cmp_kv_idx(const void *pa, const void *pb) {
    const gguf_kv_t *k = tls_sort_file->kvs;
    return str_cmp(k[*(const uint64_t *)pa].key, k[*(const uint64_t *)pb].key);
}

static int cmp_tensor_name_idx(const void *pa, const void *pb) {
    const gguf_tensor_t *t = tls_sort_file->tensors;
    return str_cmp(t[*(const uint64_t *)pa].name, t[*(const uint64_t *)pb].name);
}

static int cmp_tensor_off_idx(const void *pa, const void *pb) {
    const gguf_tensor_t *t = tls_sort_file->tensors;
    uint64_t a = t[*(const uint64_t *)pa].offset, b = t[*(const uint64_t *)pb].offset;
    return a < b ? -1 : a > b ? 1 : 0;
}

/* ---- tensors -------------------------------------------------------------- */

#define NAMEF(t) (int)((t)->name.len > 200 ? 200 : (t)->name.len), (t)->name.data

static baton_status_t parse_tensor_info(cursor_t *c, gguf_tensor_t *t) {
    baton_status_t st = cur_str(c, &t->name, "tensor name");
    if (st != BATON_OK) return st;
    if ((st = cur_u32(c, &t->n_dims, "tensor n_dims")) != BATON_OK) return st;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS) {
        return baton_error(BATON_ERR_FORMAT, "gguf: tensor '%.*s': n_dims %u outside 1..%d",
                           NAMEF(t), t->n_dims, GGUF_MAX_DIMS);
    }
    int64_t n_el = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
    }
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        if ((st = cur_u64(c, &ne, "tensor dimension")) != BATON_OK) return st;
        if (ne < 1 || ne > (uint64_t)INT64_MAX) {
            return baton_error(BATON_ERR_FORMAT, "gguf: tensor '%.*s': ne[%u] = %llu is invalid",
                               NAMEF(t), d, (unsigned long long)ne);
        }
        if ((int64_t)ne > INT64_MAX / n_el) {
            return baton_error(BATON_ERR_FORMAT,
                               "gguf: tensor '%.*s': element count overflows at ne[%u] = %llu",
                               NAMEF(t), d, (unsigned long long)ne);
        }
        t->ne[d] = (int64_t)ne;
        n_el *= (int64_t)ne;
    }
    if ((st = cur_u32(c, &t->type, "tensor type")) != BATON_OK) return st;
    if ((st = cur_u64(c, &t->offset, "tensor offset")) != BATON_OK) return st;
    int64_t be = 1, bb = 1;
    if (!ggml_type_geometry(t->type, &be, &bb)) {
        return baton_error(BATON_ERR_UNSUPPORTED, "gguf: tensor '%.*s': unknown tensor type %u",
                           NAMEF(t), t->type);
    }
    if (t->ne[0] % be != 0) {
        return baton_error(BATON_ERR_FORMAT,
                           "gguf: tensor '%.*s': ne[0] = %lld is not a multiple of the %s block "
                           "size %lld",
                           NAMEF(t), (long long)t->ne[0], ggml_type_name(t->type), (long long)be);
    }
    if (t->ne[0] / be > INT64_MAX / bb) {
        return baton_error(BATON_ERR_FORMAT, "gguf: tensor '%.*s': row size overflows", NAMEF(t));
    }
    const int64_t row_bytes = t->ne[0] / be * bb;
    int64_t rows = n_el / t->ne[0];
    if (rows > INT64_MAX / row_bytes) {
        return baton_error(BATON_ERR_FORMAT, "gguf: tensor '%.*s': byte size overflows",
                           NAMEF(t));
    }
    t->n_bytes = (uint64_t)(rows * row_bytes);
    return BATON_OK;
}

/* ---- open ------------------------------------------------------------------ */

static void file_free(gguf_file_t *f) {
    if (!f) return;
    if (f->kvs) {
        for (uint64_t i = 0; i < f->n_kv; i++) {
            if (f->kvs[i].type == GGUF_VALUE_ARRAY) {
                free(f->kvs[i].v.arr.strs);
            }
        }
    }
    free(f->kvs);
    free(f->kv_by_key);
    free(f->tensors);
    free(f->tensor_by_name);
    if (f->mapped && f->base) {
        munmap((void *)f->base, f->size);
    }
    free(f);
}

static baton_status_t parse(gguf_file_t *f) {
    cursor_t c = {.base = f->base, .size = f->size, .off = 0};
    baton_status_t st = cur_need(&c, 4, "magic");
    if (st != BATON_OK) return st;
    if (memcmp(f->base, "GGUF", 4) != 0) {
        return baton_error(BATON_ERR_FORMAT,
                           "gguf: bad magic %02x %02x %02x %02x (expected \"GGUF\")", f->base[0],
                           f->base[1], f->base[2], f->base[3]);
    }
    c.off = 4;
    if ((st = cur_u32(&c, &f->version, "version")) != BATON_OK) return st;
    if (f->version != 2 && f->version != 3) {
        return baton_error(BATON_ERR_VERSION, "gguf: version %u is not supported (2 or 3)",
                           f->version);
    }
    uint64_t n_tensors, n_kv;
    if ((st = cur_u64(&c, &n_tensors, "n_tensors")) != BATON_OK) return st;
    if ((st = cur_u64(&c, &n_kv, "n_kv")) != BATON_OK) return st;
    /* Smallest kv: 8 (key len) + 4 (type) + 1 (u8 value); smallest tensor
     * info: 8 (name len) + 4 (n_dims) + 8 (one ne) + 4 (type) + 8 (offset). */
    if (n_kv > cur_left(&c) / 13) {
        return baton_error(BATON_ERR_FORMAT, "gguf: n_kv %llu cannot fit in the %llu bytes left",
                           (unsigned long long)n_kv, (unsigned long long)cur_left(&c));
    }
    if (n_tensors > cur_left(&c) / 32) {
        return baton_error(BATON_ERR_FORMAT,
                           "gguf: n_tensors %llu cannot fit in the %llu bytes left",
                           (unsigned long long)n_tensors, (unsigned long long)cur_left(&c));
    }
    f->kvs = calloc(n_kv ? n_kv : 1, sizeof(*f->kvs));
    f->kv_by_key = malloc((n_kv ? n_kv : 1) * sizeof(*f->kv_by_key));
    if (!f->kvs || !f->kv_by_key) {
        return baton_error(BATON_ERR_NO_MEMORY, "gguf: no memory for %llu kvs",
                           (unsigned long long)n_kv);
    }
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv_t *kv = &f->kvs[i];
        st = parse_kv(&c, kv);
        f->n_kv = i + 1; /* so file_free releases this kv's strs */
        if (st != BATON_OK) return st;
        if (gguf_str_eq(kv->key, "general.alignment")) {
            if (kv->type != GGUF_VALUE_UINT32) {
                return baton_error(BATON_ERR_FORMAT,
                                   "gguf: key 'general.alignment' has type %s, expected uint32",
                                   value_type_name(kv->type));
            }
            uint64_t a = kv->v.u64;
            if (a == 0 || (a & (a - 1)) != 0) {
                return baton_error(BATON_ERR_FORMAT,
                                   "gguf: key 'general.alignment' = %llu is not a power of two",
                                   (unsigned long long)a);
            }
            f->alignment = (uint32_t)a;
        }
    }
    for (uint64_t i = 0; i < n_kv; i++) f->kv_by_key[i] = i;
    tls_sort_file = f;
    qsort(f->kv_by_key, n_kv, sizeof(uint64_t), cmp_kv_idx);
    for (uint64_t i = 1; i < n_kv; i++) {
        const gguf_kv_t *kv = &f->kvs[f->kv_by_key[i]];
        if (str_cmp(kv->key, f->kvs[f->kv_by_key[i - 1]].key) == 0) {
            return baton_error(BATON_ERR_FORMAT, "gguf: duplicate key '%.*s'", KEYF(kv));
        }
    }

    if (n_tensors > cur_left(&c) / 32) {
        return baton_error(BATON_ERR_FORMAT,
                           "gguf: n_tensors %llu cannot fit in the %llu bytes left after the kvs",
                           (unsigned long long)n_tensors, (unsigned long long)cur_left(&c));
    }
    f->tensors = calloc(n_tensors ? n_tensors : 1, sizeof(*f->tensors));
    f->tensor_by_name = malloc((n_tensors ? n_tensors : 1) * sizeof(*f->tensor_by_name));
    if (!f->tensors || !f->tensor_by_name) {
        return baton_error(BATON_ERR_NO_MEMORY, "gguf: no memory for %llu tensors",
                           (unsigned long long)n_tensors);
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        if ((st = parse_tensor_info(&c, &f->tensors[i])) != BATON_OK) return st;
        const gguf_tensor_t *t = &f->tensors[i];
        if (t->offset % f->alignment != 0) {
            return baton_error(BATON_ERR_FORMAT,
                               "gguf: tensor '%.*s': offset %llu is not a multiple of the "
                               "alignment %u",
                               NAMEF(t), (unsigned long long)t->offset, f->alignment);
        }
    }
    f->n_tensors = n_tensors;

    /* Data section starts at the next multiple of the alignment. */
    uint64_t a = f->alignment;
    uint64_t rem = c.off % a;
    f->data_offset = c.off + (rem ? a - rem : 0); /* c.off <= size < 2^63: no overflow */
    uint64_t data_size = f->data_offset <= f->size ? f->size - f->data_offset : 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor_t *t = &f->tensors[i];
        if (f->data_offset > f->size || t->offset > data_size ||
            t->n_bytes > data_size - t->offset) {
            unsigned long long lo = (unsigned long long)f->data_offset + t->offset;
            unsigned long long hi = lo + t->n_bytes;
            if (t->offset > UINT64_MAX - f->data_offset ||
                t->n_bytes > UINT64_MAX - (f->data_offset + t->offset)) {
                return baton_error(BATON_ERR_FORMAT,
                                   "gguf: tensor '%.*s': offset %llu + %llu bytes overflows",
                                   NAMEF(t), (unsigned long long)t->offset,
                                   (unsigned long long)t->n_bytes);
            }
            return baton_error(BATON_ERR_FORMAT,
                               "gguf: tensor '%.*s': data [%llu, %llu) exceeds file size %llu",
                               NAMEF(t), lo, hi, (unsigned long long)f->size);
        }
        t->data = f->base + f->data_offset + t->offset;
    }

    for (uint64_t i = 0; i < n_tensors; i++) f->tensor_by_name[i] = i;
    qsort(f->tensor_by_name, n_tensors, sizeof(uint64_t), cmp_tensor_name_idx);
    for (uint64_t i = 1; i < n_tensors; i++) {
        const gguf_tensor_t *t = &f->tensors[f->tensor_by_name[i]];
        if (str_cmp(t->name, f->tensors[f->tensor_by_name[i - 1]].name) == 0) {
            return baton_error(BATON_ERR_FORMAT, "gguf: duplicate tensor name '%.*s'", NAMEF(t));
        }
    }
    /* Overlap check over tensors sorted by offset (reuses a scratch array). */
    if (n_tensors > 1) {
        uint64_t *by_off = malloc(n_tensors * sizeof(*by_off));
        if (!by_off) {
            return baton_error(BATON_ERR_NO_MEMORY, "gguf: no memory for the overlap check");
        }
        for (uint64_t i = 0; i < n_tensors; i++) by_off[i] = i;
        qsort(by_off, n_tensors, sizeof(uint64_t), cmp_tensor_off_idx);
        for (uint64_t i = 1; i < n_tensors; i++) {
            const gguf_tensor_t *p = &f->tensors[by_off[i - 1]];
            const gguf_tensor_t *t = &f->tensors[by_off[i]];
            if (p->offset + p->n_bytes > t->offset) {
                baton_status_t e = baton_error(
                    BATON_ERR_FORMAT,
                    "gguf: tensor '%.*s' data [%llu, %llu) overlaps tensor '%.*s' at %llu",
                    NAMEF(p), (unsigned long long)p->offset,
                    (unsigned long long)(p->offset + p->n_bytes), NAMEF(t),
                    (unsigned long long)t->offset);
                free(by_off);
                return e;
            }
        }
        free(by_off);
    }
    tls_sort_file = NULL;
    return BATON_OK;
}

static baton_status_t open_common(const uint8_t *base, uint64_t size, bool mapped,
                                  gguf_file_t **out) {
    gguf_file_t *f = calloc(1, sizeof(*f));
    if (!f) {
        if (mapped) munmap((void *)base, size);
        return baton_error(BATON_ERR_NO_MEMORY, "gguf: no memory");
    }
    f->base = base;
    f->size = size;
    f->mapped = mapped;
    baton_status_t st = parse(f);
    tls_sort_file = NULL;
    if (st != BATON_OK) {
        file_free(f);
        return st;
    }
    *out = f;
    return BATON_OK;
}

baton_status_t gguf_open_memory(const void *data, size_t size, gguf_file_t **out) {
    if (!out || (!data && size > 0)) {
        return baton_error(BATON_ERR_INVALID_ARG, "gguf_open_memory: NULL argument");
    }
    static const uint8_t empty[1];
    return open_common(data ? data : empty, size, false, out);
}

baton_status_t gguf_open(const char *path, gguf_file_t **out) {
    if (!path || !out) {
        return baton_error(BATON_ERR_INVALID_ARG, "gguf_open: NULL argument");
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return baton_error(BATON_ERR_IO, "gguf: cannot open '%s': %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return baton_error(BATON_ERR_IO, "gguf: cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return baton_error(BATON_ERR_IO, "gguf: '%s' is not a regular file", path);
    }
    if (sb.st_size == 0) {
        close(fd);
        return baton_error(BATON_ERR_FORMAT, "gguf: '%s' is empty", path);
    }
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) {
        return baton_error(BATON_ERR_IO, "gguf: cannot mmap '%s': %s", path, strerror(e));
    }
    baton_status_t st = open_common(m, (uint64_t)sb.st_size, true, out);
    if (st != BATON_OK) {
        char cause[400];
        snprintf(cause, sizeof(cause), "%s", baton_last_error());
        return baton_error(st, "%s (in '%s')", cause, path);
    }
    return BATON_OK;
}

void gguf_close(gguf_file_t *file) { file_free(file); }

uint32_t gguf_version(const gguf_file_t *file) { return file->version; }
uint64_t gguf_file_size(const gguf_file_t *file) { return file->size; }
uint32_t gguf_alignment(const gguf_file_t *file) { return file->alignment; }
uint64_t gguf_data_offset(const gguf_file_t *file) { return file->data_offset; }

uint64_t gguf_n_kv(const gguf_file_t *file) { return file->n_kv; }

const gguf_kv_t *gguf_kv_at(const gguf_file_t *file, uint64_t i) {
    return i < file->n_kv ? &file->kvs[i] : NULL;
}

const gguf_kv_t *gguf_find_kv(const gguf_file_t *file, const char *key) {
    if (!file || !key) return NULL;
    gguf_str_t k = {key, strlen(key)};
    uint64_t lo = 0, hi = file->n_kv;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        const gguf_kv_t *kv = &file->kvs[file->kv_by_key[mid]];
        int r = str_cmp(kv->key, k);
        if (r == 0) return kv;
        if (r < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

static baton_status_t find_typed(const gguf_file_t *file, const char *key,
                                 const gguf_kv_t **out) {
    const gguf_kv_t *kv = gguf_find_kv(file, key);
    if (!kv) {
        return baton_error(BATON_ERR_NOT_FOUND, "gguf: key '%s' not found", key ? key : "(null)");
    }
    *out = kv;
    return BATON_OK;
}

static baton_status_t mismatch(const char *key, const gguf_kv_t *kv, const char *want) {
    return baton_error(BATON_ERR_FORMAT, "gguf: key '%s' has type %s, expected %s", key,
                       value_type_name(kv->type), want);
}

/* Integer value of kv as a signed 128-bit-free pair: returns false when not
 * an integer type. *neg is set when the value is negative. */
static bool kv_int(const gguf_kv_t *kv, uint64_t *mag, bool *neg) {
    if (type_is_unsigned(kv->type)) {
        *mag = kv->v.u64;
        *neg = false;
        return true;
    }
    if (type_is_signed(kv->type)) {
        *neg = kv->v.i64 < 0;
        *mag = *neg ? (uint64_t)0 - (uint64_t)kv->v.i64 : (uint64_t)kv->v.i64;
        return true;
    }
    return false;
}

baton_status_t gguf_get_u64(const gguf_file_t *file, const char *key, uint64_t *out) {
    const gguf_kv_t *kv = NULL;
    baton_status_t st = find_typed(file, key, &kv);
    if (st != BATON_OK) return st;
    uint64_t mag;
    bool neg;
    if (!kv_int(kv, &mag, &neg)) return mismatch(key, kv, "an integer");
    if (neg) {
        return baton_error(BATON_ERR_OUT_OF_RANGE, "gguf: key '%s' = %lld is negative", key,
                           (long long)kv->v.i64);
    }
    *out = mag;
    return BATON_OK;
}

baton_status_t gguf_get_u32(const gguf_file_t *file, const char *key, uint32_t *out) {
    uint64_t v;
    baton_status_t st = gguf_get_u64(file, key, &v);
    if (st != BATON_OK) return st;
    if (v > UINT32_MAX) {
        return baton_error(BATON_ERR_OUT_OF_RANGE, "gguf: key '%s' = %llu does not fit in uint32",
                           key, (unsigned long long)v);
    }
    *out = (uint32_t)v;
    return BATON_OK;
}

baton_status_t gguf_get_i64(const gguf_file_t *file, const char *key, int64_t *out) {
    const gguf_kv_t *kv = NULL;
    baton_status_t st = find_typed(file, key, &kv);
    if (st != BATON_OK) return st;
    if (type_is_signed(kv->type)) {
        *out = kv->v.i64;
        return BATON_OK;
    }
    if (!type_is_unsigned(kv->type)) return mismatch(key, kv, "an integer");
    if (kv->v.u64 > (uint64_t)INT64_MAX) {
        return baton_error(BATON_ERR_OUT_OF_RANGE, "gguf: key '%s' = %llu does not fit in int64",
                           key, (unsigned long long)kv->v.u64);
    }
    *out = (int64_t)kv->v.u64;
    return BATON_OK;
}

baton_status_t gguf_get_f32(const gguf_file_t *file, const char *key, float *out) {
    const gguf_kv_t *kv = NULL;
    baton_status_t st = find_typed(file, key, &kv);
    if (st != BATON_OK) return st;
    if (kv->type != GGUF_VALUE_FLOAT32 && kv->type != GGUF_VALUE_FLOAT64) {
        return mismatch(key, kv, "float32 or float64");
    }
    *out = (float)kv->v.f64;
    return BATON_OK;
}

baton_status_t gguf_get_bool(const gguf_file_t *file, const char *key, bool *out) {
    const gguf_kv_t *kv = NULL;
    baton_status_t st = find_typed(file, key, &kv);
    if (st != BATON_OK) return st;
    if (kv->type != GGUF_VALUE_BOOL) return mismatch(key, kv, "bool");
    *out = kv->v.u64 != 0;
    return BATON_OK;
}

baton_status_t gguf_get_str(const gguf_file_t *file, const char *key, gguf_str_t *out) {
    const gguf_kv_t *kv = NULL;
    baton_status_t st = find_typed(file, key, &kv);
    if (st != BATON_OK) return st;
    if (kv->type != GGUF_VALUE_STRING) return mismatch(key, kv, "string");
    *out = kv->v.str;
    return BATON_OK;
}

baton_status_t gguf_get_arr(const gguf_file_t *file, const char *key,
                            gguf_value_type_t elem_type, const gguf_kv_t **out) {
    const gguf_kv_t *kv = NULL;
    baton_status_t st = find_typed(file, key, &kv);
    if (st != BATON_OK) return st;
    if (kv->type != GGUF_VALUE_ARRAY) {
        return baton_error(BATON_ERR_FORMAT, "gguf: key '%s' has type %s, expected array of %s",
                           key, value_type_name(kv->type), value_type_name(elem_type));
    }
    if (kv->v.arr.type != elem_type) {
        return baton_error(BATON_ERR_FORMAT,
                           "gguf: key '%s' is an array of %s, expected array of %s", key,
                           value_type_name(kv->v.arr.type), value_type_name(elem_type));
    }
    *out = kv;
    return BATON_OK;
}

double gguf_arr_f64(const gguf_kv_t *kv, uint64_t i) {
    assert(kv->type == GGUF_VALUE_ARRAY && i < kv->v.arr.n);
    uint32_t t = kv->v.arr.type;
    uint64_t sz = scalar_size(t);
    assert(sz > 0);
    uint64_t raw = rd_le(kv->v.arr.data + i * sz, (int)sz);
    if (t == GGUF_VALUE_FLOAT32 || t == GGUF_VALUE_FLOAT64) return float_bits(raw, sz);
    if (type_is_signed(t)) return (double)sext(raw, sz);
    return (double)raw;
}

int64_t gguf_arr_i64(const gguf_kv_t *kv, uint64_t i) {
    assert(kv->type == GGUF_VALUE_ARRAY && i < kv->v.arr.n);
    uint32_t t = kv->v.arr.type;
    uint64_t sz = scalar_size(t);
    assert(sz > 0);
    uint64_t raw = rd_le(kv->v.arr.data + i * sz, (int)sz);
    if (t == GGUF_VALUE_FLOAT32 || t == GGUF_VALUE_FLOAT64) {
        /* Truncates toward zero; saturates outside int64, NaN gives 0. */
        double d = float_bits(raw, sz);
        if (d != d) return 0;
        if (d >= 9223372036854775808.0) return INT64_MAX;
        if (d < -9223372036854775808.0) return INT64_MIN;
        return (int64_t)d;
    }
    if (type_is_signed(t)) return sext(raw, sz);
    /* uint64 above INT64_MAX saturates. */
    return raw > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)raw;
}

bool gguf_str_eq(gguf_str_t s, const char *cstr) {
    size_t n = strlen(cstr);
    return s.len == n && (n == 0 || memcmp(s.data, cstr, n) == 0);
}

uint64_t gguf_n_tensors(const gguf_file_t *file) { return file->n_tensors; }

const gguf_tensor_t *gguf_tensor_at(const gguf_file_t *file, uint64_t i) {
    return i < file->n_tensors ? &file->tensors[i] : NULL;
}

const gguf_tensor_t *gguf_find_tensor(const gguf_file_t *file, const char *name) {
    if (!file || !name) return NULL;
    gguf_str_t k = {name, strlen(name)};
    uint64_t lo = 0, hi = file->n_tensors;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        const gguf_tensor_t *t = &file->tensors[file->tensor_by_name[mid]];
        int r = str_cmp(t->name, k);
        if (r == 0) return t;
        if (r < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

int64_t gguf_tensor_n_elements(const gguf_tensor_t *t) {
    int64_t n = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) n *= t->ne[d];
    return n;
}

baton_status_t gguf_tensor_to_f32(const gguf_tensor_t *t, float *out) {
    if (!t || !out) {
        return baton_error(BATON_ERR_INVALID_ARG, "gguf_tensor_to_f32: NULL argument");
    }
    if (!dequant_supported(t->type)) {
        return baton_error(BATON_ERR_UNSUPPORTED,
                           "gguf: tensor '%.*s' has type %s (%u); supported: f32, f16, bf16, "
                           "q8_0, q4_0, q4_1, q4_K, q5_K, q6_K",
                           NAMEF(t), ggml_type_name(t->type), t->type);
    }
    /* Row by row keeps n within a row's block multiple (checked at open). */
    const int64_t n_el = gguf_tensor_n_elements(t);
    const int64_t rows = n_el / t->ne[0];
    const int64_t row_bytes = (int64_t)t->n_bytes / rows;
    const uint8_t *src = t->data;
    for (int64_t r = 0; r < rows; r++) {
        baton_status_t st = dequant_row(t->type, src + r * row_bytes, out + r * t->ne[0], t->ne[0]);
        if (st != BATON_OK) return st;
    }
    return BATON_OK;
}
