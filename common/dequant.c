/* Dequantization of ggml block formats to fp32; see dequant.h for the
 * layouts. Each routine is a transcription of ggml's dequantize_row_*
 * (ggml/src/ggml-quants.c), written with the same operation order so the
 * results match ggml's reference path bit for bit. */
#include "common/dequant.h"

#include <stdio.h>
#include <string.h>

#include "common/gguf.h"

typedef struct type_info {
    const char *name;
    int64_t block_elems;
    int64_t block_bytes;
} type_info_t;

/* ggml.c type_traits (blck_size, type_size), GGML_TYPE_COUNT = 43; checked
 * against libggml by tests/data/dequant_ggml_types.txt. NULL name = removed. */
static const type_info_t k_types[] = {
    [0] = {"f32", 1, 4},         [1] = {"f16", 1, 2},
    [2] = {"q4_0", 32, 18},      [3] = {"q4_1", 32, 20},
    [6] = {"q5_0", 32, 22},      [7] = {"q5_1", 32, 24},
    [8] = {"q8_0", 32, 34},      [9] = {"q8_1", 32, 36},
    [10] = {"q2_K", 256, 84},    [11] = {"q3_K", 256, 110},
    [12] = {"q4_K", 256, 144},   [13] = {"q5_K", 256, 176},
    [14] = {"q6_K", 256, 210},   [15] = {"q8_K", 256, 292},
    [16] = {"iq2_xxs", 256, 66}, [17] = {"iq2_xs", 256, 74},
    [18] = {"iq3_xxs", 256, 98}, [19] = {"iq1_s", 256, 50},
    [20] = {"iq4_nl", 32, 18},   [21] = {"iq3_s", 256, 110},
    [22] = {"iq2_s", 256, 82},   [23] = {"iq4_xs", 256, 136},
    [24] = {"i8", 1, 1},         [25] = {"i16", 1, 2},
    [26] = {"i32", 1, 4},        [27] = {"i64", 1, 8},
    [28] = {"f64", 1, 8},        [29] = {"iq1_m", 256, 56},
    [30] = {"bf16", 1, 2},       [34] = {"tq1_0", 256, 54},
    [35] = {"tq2_0", 256, 66},   [39] = {"mxfp4", 32, 17},
    [40] = {"nvfp4", 64, 36},    [41] = {"q1_0", 128, 18},
    [42] = {"q2_0", 64, 18},
};
#define N_TYPES (sizeof(k_types) / sizeof(k_types[0]))

bool ggml_type_geometry(uint32_t type, int64_t *block_elems, int64_t *block_bytes) {
    if (type >= N_TYPES || k_types[type].name == NULL) {
        return false;
    }
    *block_elems = k_types[type].block_elems;
    *block_bytes = k_types[type].block_bytes;
    return true;
}

const char *ggml_type_name(uint32_t type) {
    static _Thread_local char buf[32];
    if (type < N_TYPES && k_types[type].name != NULL) {
        return k_types[type].name;
    }
    snprintf(buf, sizeof(buf), "type#%u", type);
    return buf;
}

bool dequant_supported(uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16:
    case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

int64_t dequant_row_bytes(uint32_t type, int64_t n) {
    int64_t be = 1, bb = 1;
    if (!ggml_type_geometry(type, &be, &bb) || n < 0 || n % be != 0) {
        return -1;
    }
    int64_t blocks = n / be;
    if (blocks > INT64_MAX / bb) {
        return -1;
    }
    return blocks * bb;
}

float dequant_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while ((man & 0x400u) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

float dequant_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

static inline float load_f16(const uint8_t *p) {
    return dequant_fp16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

/* ggml-quants.c get_scale_min_k4: the j-th 6-bit scale and min of Q4_K/Q5_K. */
static inline void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

static void row_f16(const uint8_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        y[i] = load_f16(x + 2 * i);
    }
}

static void row_bf16(const uint8_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        y[i] = dequant_bf16_to_f32((uint16_t)(x[2 * i] | (x[2 * i + 1] << 8)));
    }
}

static void row_q8_0(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 34, y += 32) {
        const float d = load_f16(x);
        const int8_t *qs = (const int8_t *)(x + 2);
        for (int j = 0; j < 32; j++) {
            y[j] = qs[j] * d;
        }
    }
}

static void row_q4_0(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 18, y += 32) {
        const float d = load_f16(x);
        const uint8_t *qs = x + 2;
        for (int j = 0; j < 16; j++) {
            const int x0 = (qs[j] & 0x0F) - 8;
            const int x1 = (qs[j] >> 4) - 8;
            y[j] = x0 * d;
            y[j + 16] = x1 * d;
        }
    }
}

static void row_q4_1(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 20, y += 32) {
        const float d = load_f16(x);
        const float m = load_f16(x + 2);
        const uint8_t *qs = x + 4;
        for (int j = 0; j < 16; j++) {
            const int x0 = qs[j] & 0x0F;
            const int x1 = qs[j] >> 4;
            y[j] = x0 * d + m;
            y[j + 16] = x1 * d + m;
        }
    }
}

static void row_q4_k(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 144) {
        const float d = load_f16(x);
        const float min = load_f16(x + 2);
        const uint8_t *scales = x + 4;
        const uint8_t *q = x + 16;
        int is = 0;
        uint8_t sc, m;
        for (int j = 0; j < 256; j += 64) {
            scale_min_k4(is + 0, scales, &sc, &m);
            const float d1 = d * sc;
            const float m1 = min * m;
            scale_min_k4(is + 1, scales, &sc, &m);
            const float d2 = d * sc;
            const float m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
            q += 32;
            is += 2;
        }
    }
}

static void row_q5_k(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 176) {
        const float d = load_f16(x);
        const float min = load_f16(x + 2);
        const uint8_t *scales = x + 4;
        const uint8_t *qh = x + 16;
        const uint8_t *ql = x + 48;
        int is = 0;
        uint8_t sc, m;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0; j < 256; j += 64) {
            scale_min_k4(is + 0, scales, &sc, &m);
            const float d1 = d * sc;
            const float m1 = min * m;
            scale_min_k4(is + 1, scales, &sc, &m);
            const float d2 = d * sc;
            const float m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            ql += 32;
            is += 2;
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

static void row_q6_k(const uint8_t *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += 210) {
        const uint8_t *ql = x;
        const uint8_t *qh = x + 128;
        const int8_t *sc = (const int8_t *)(x + 192);
        const float d = load_f16(x + 208);
        for (int n = 0; n < 256; n += 128) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int8_t q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

baton_status_t dequant_row(uint32_t type, const void *src, float *dst, int64_t n) {
    if (!dequant_supported(type)) {
        return baton_error(BATON_ERR_UNSUPPORTED, "dequant: tensor type %s (%u) is not supported",
                           ggml_type_name(type), type);
    }
    int64_t be = 1, bb = 1;
    ggml_type_geometry(type, &be, &bb);
    if (n < 0 || n % be != 0) {
        return baton_error(BATON_ERR_INVALID_ARG,
                           "dequant: %lld elements is not a multiple of the %s block size %lld",
                           (long long)n, ggml_type_name(type), (long long)be);
    }
    const uint8_t *x = src;
    const int64_t nb = n / be;
    switch (type) {
    case GGML_TYPE_F32: if (n > 0) memcpy(dst, x, (size_t)n * sizeof(float)); break;
    case GGML_TYPE_F16: row_f16(x, dst, n); break;
    case GGML_TYPE_BF16: row_bf16(x, dst, n); break;
    case GGML_TYPE_Q8_0: row_q8_0(x, dst, nb); break;
    case GGML_TYPE_Q4_0: row_q4_0(x, dst, nb); break;
    case GGML_TYPE_Q4_1: row_q4_1(x, dst, nb); break;
    case GGML_TYPE_Q4_K: row_q4_k(x, dst, nb); break;
    case GGML_TYPE_Q5_K: row_q5_k(x, dst, nb); break;
    case GGML_TYPE_Q6_K: row_q6_k(x, dst, nb); break;
    default: return baton_error(BATON_ERR_INTERNAL, "dequant: type %u passed support check", type);
    }
    return BATON_OK;
}
