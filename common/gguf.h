/* GGUF v3 reader: memory-mapped, validated, read-only.
 *
 * Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
 * (header magic "GGUF", version 3, n_tensors, n_kv, then key/value pairs,
 * tensor infos, padding to general.alignment, tensor data).
 *
 * gguf_open() maps the file and validates every count, string length, array
 * length, tensor dimension, type, offset, size and alignment against the file
 * size before anything is returned; on any failure it returns
 * BATON_ERR_FORMAT / BATON_ERR_UNSUPPORTED / BATON_ERR_IO with a detail
 * (baton_last_error()) that names the key or tensor and the bad value.
 * Nothing points outside the mapping afterwards.
 *
 * All strings returned (gguf_str_t) point into the mapping and are NOT
 * NUL-terminated; they live until gguf_close(). */
#ifndef BATON_COMMON_GGUF_H
#define BATON_COMMON_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Metadata value types (gguf.md "gguf_metadata_value_type"). */
typedef enum gguf_value_type {
    GGUF_VALUE_UINT8 = 0,
    GGUF_VALUE_INT8 = 1,
    GGUF_VALUE_UINT16 = 2,
    GGUF_VALUE_INT16 = 3,
    GGUF_VALUE_UINT32 = 4,
    GGUF_VALUE_INT32 = 5,
    GGUF_VALUE_FLOAT32 = 6,
    GGUF_VALUE_BOOL = 7,
    GGUF_VALUE_STRING = 8,
    GGUF_VALUE_ARRAY = 9,
    GGUF_VALUE_UINT64 = 10,
    GGUF_VALUE_INT64 = 11,
    GGUF_VALUE_FLOAT64 = 12,
} gguf_value_type_t;

/* Tensor element types (ggml.h "enum ggml_type" numbering). Only the ones
 * baton converts are named; any other value is rejected by gguf_tensor_to_f32
 * with BATON_ERR_UNSUPPORTED naming the tensor and type number. */
typedef enum ggml_type {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_Q8_K = 15,
    GGML_TYPE_BF16 = 30,
} ggml_type_t;

#define GGUF_MAX_DIMS 4

typedef struct gguf_str {
    const char *data; /* into the mapping, not NUL-terminated */
    uint64_t len;     /* bytes */
} gguf_str_t;

typedef struct gguf_kv {
    gguf_str_t key;
    gguf_value_type_t type;
    union {
        uint64_t u64; /* UINT8..UINT64 and BOOL, zero-extended */
        int64_t i64;  /* INT8..INT64, sign-extended */
        double f64;   /* FLOAT32, FLOAT64 */
        gguf_str_t str;
        struct {
            gguf_value_type_t type; /* element type (never ARRAY: nested arrays are rejected) */
            uint64_t n;             /* element count */
            const uint8_t *data;    /* first element in the mapping (little-endian) */
            gguf_str_t *strs;       /* STRING arrays only: n decoded strings (owned by the file) */
        } arr;
    } v;
} gguf_kv_t;

typedef struct gguf_tensor {
    gguf_str_t name;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* elements per dim, ne[0] fastest; unused dims = 1 */
    uint32_t type;             /* ggml_type_t value as stored (may be unsupported) */
    uint64_t offset;           /* bytes from the start of the data section */
    uint64_t n_bytes;          /* bytes of data for this type and shape */
    const void *data;          /* into the mapping */
} gguf_tensor_t;

typedef struct gguf_file gguf_file_t;

/* Maps and validates `path`. On success *out owns the mapping; free with
 * gguf_close(). Errors: BATON_ERR_IO (open/stat/mmap), BATON_ERR_FORMAT
 * (bad magic, truncated, absurd counts, out-of-range or overlapping or
 * misaligned tensors), BATON_ERR_VERSION (version != 3; v2 is accepted too). */
baton_status_t gguf_open(const char *path, gguf_file_t **out);

/* Same validation over a caller-owned buffer (fuzzing, tests). `data` must
 * outlive the returned file; nothing is copied. */
baton_status_t gguf_open_memory(const void *data, size_t size, gguf_file_t **out);

/* Unmaps and frees. NULL-safe. */
void gguf_close(gguf_file_t *file);

uint32_t gguf_version(const gguf_file_t *file);
uint64_t gguf_file_size(const gguf_file_t *file);      /* bytes */
uint32_t gguf_alignment(const gguf_file_t *file);      /* general.alignment or 32 */
/* Bytes from the start of the file to the data section (tensor offsets are
 * relative to it); a multiple of gguf_alignment(). */
uint64_t gguf_data_offset(const gguf_file_t *file);

uint64_t gguf_n_kv(const gguf_file_t *file);
const gguf_kv_t *gguf_kv_at(const gguf_file_t *file, uint64_t i);
/* Key lookup; NULL when absent. */
const gguf_kv_t *gguf_find_kv(const gguf_file_t *file, const char *key);

/* Typed getters. Integers of any GGUF integer type are accepted when the
 * value fits; floats accept FLOAT32/FLOAT64. Return BATON_ERR_NOT_FOUND when
 * the key is absent, BATON_ERR_FORMAT (detail names the key and its actual
 * type) on a type mismatch, BATON_ERR_OUT_OF_RANGE when it does not fit. */
baton_status_t gguf_get_u32(const gguf_file_t *file, const char *key, uint32_t *out);
baton_status_t gguf_get_u64(const gguf_file_t *file, const char *key, uint64_t *out);
baton_status_t gguf_get_i64(const gguf_file_t *file, const char *key, int64_t *out);
baton_status_t gguf_get_f32(const gguf_file_t *file, const char *key, float *out);
baton_status_t gguf_get_bool(const gguf_file_t *file, const char *key, bool *out);
baton_status_t gguf_get_str(const gguf_file_t *file, const char *key, gguf_str_t *out);
/* Array of `elem_type`; *out points at the kv (use v.arr). */
baton_status_t gguf_get_arr(const gguf_file_t *file, const char *key,
                            gguf_value_type_t elem_type, const gguf_kv_t **out);

/* Reads element i of a numeric (or bool) array as double / int64 (no
 * bounds check beyond an assert: callers loop below arr.n). gguf_arr_i64
 * truncates floats toward zero and saturates values outside int64 (NaN
 * gives 0). */
double gguf_arr_f64(const gguf_kv_t *kv, uint64_t i);
int64_t gguf_arr_i64(const gguf_kv_t *kv, uint64_t i);

/* Compares a gguf string with a C string. */
bool gguf_str_eq(gguf_str_t s, const char *cstr);

uint64_t gguf_n_tensors(const gguf_file_t *file);
const gguf_tensor_t *gguf_tensor_at(const gguf_file_t *file, uint64_t i);
/* Tensor lookup by name; NULL when absent. */
const gguf_tensor_t *gguf_find_tensor(const gguf_file_t *file, const char *name);

/* Number of elements (product of ne). */
int64_t gguf_tensor_n_elements(const gguf_tensor_t *t);

/* Converts the whole tensor to fp32 into `out` (n_elements floats, ne[0]
 * fastest). Types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K.
 * Errors: BATON_ERR_UNSUPPORTED naming tensor and type. */
baton_status_t gguf_tensor_to_f32(const gguf_tensor_t *t, float *out);

/* Name of a ggml type number ("q4_1"), or "type#N" style text for unknown
 * ones written to a static per-thread buffer. */
const char *ggml_type_name(uint32_t type);

#endif
