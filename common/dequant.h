/* ggml tensor types: block geometry and dequantization to fp32.
 *
 * Block formats follow ggml (ggml/src/ggml-common.h, dequantize_row_* in
 * ggml/src/ggml-quants.c). All multi-byte fields are little-endian; a source
 * pointer needs no particular alignment (fields are read with memcpy).
 *
 *   type  elems/block bytes/block layout
 *   F32       1          4       float
 *   F16       1          2       IEEE half
 *   BF16      1          2       upper 16 bits of a float
 *   Q8_0     32         34       half d; int8 qs[32]           y = d*q
 *   Q4_0     32         18       half d; u8 qs[16]             y = d*(q-8)
 *   Q4_1     32         20       half d, m; u8 qs[16]          y = d*q + m
 *   Q4_K    256        144       half d, dmin; u8 scales[12] (8 packed 6-bit
 *                                scale/min pairs); u8 qs[128]  y = d*sc*q - dmin*m
 *   Q5_K    256        176       as Q4_K plus u8 qh[32] (5th bit) before qs
 *   Q6_K    256        210       u8 ql[128], qh[64]; int8 scales[16]; half d
 *                                y = d*scale*(q-32)
 * In Q4_0/Q4_1 element j of a block is the low nibble of qs[j] and element
 * j+16 its high nibble. */
#ifndef BATON_COMMON_DEQUANT_H
#define BATON_COMMON_DEQUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Elements per block and bytes per block of ggml type `type` (ggml.c
 * type_traits). Returns false for type numbers ggml does not define (or
 * has removed); the outputs are then untouched. */
bool ggml_type_geometry(uint32_t type, int64_t *block_elems, int64_t *block_bytes);

/* True when dequant_row() converts `type` (F32, F16, BF16, Q8_0, Q4_0,
 * Q4_1, Q4_K, Q5_K, Q6_K). */
bool dequant_supported(uint32_t type);

/* Bytes occupied by `n` elements of `type`; -1 when the type is unknown, n
 * is negative or not a multiple of the block size, or the size overflows. */
int64_t dequant_row_bytes(uint32_t type, int64_t n);

/* Converts `n` consecutive elements of `type` at `src` to fp32 in `dst`.
 * `n` must be a multiple of the type's block size; src holds
 * dequant_row_bytes(type, n) bytes. Errors: BATON_ERR_UNSUPPORTED for a
 * type outside dequant_supported() (detail names the type),
 * BATON_ERR_INVALID_ARG for a bad n. */
baton_status_t dequant_row(uint32_t type, const void *src, float *dst, int64_t n);

/* IEEE half / bfloat16 bit patterns to float (exact, subnormals, inf, NaN). */
float dequant_fp16_to_f32(uint16_t h);
float dequant_bf16_to_f32(uint16_t h);

#endif
