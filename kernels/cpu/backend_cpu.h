/* Internal header of the CPU backend (fp32 weights, activations and KV;
 * OpenBLAS GEMM; a persistent thread pool for everything else). Only files
 * in kernels/cpu/ include it; the public entry point is backend_cpu_create()
 * in kernels/backend.h. */
#ifndef BATON_KERNELS_CPU_BACKEND_CPU_H
#define BATON_KERNELS_CPU_BACKEND_CPU_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

/* A CPU weight: fp32 [rows, cols] row-major, 64-byte aligned, owned. */
struct backend_weight {
    float *data;
    int64_t rows;
    int64_t cols;
};

typedef struct cpu_ctx {
    cpu_pool_t *pool;
    int n_threads;
    /* Attention scratch: n_threads slices of scratch_floats floats each,
     * grown (on the calling thread, before a parallel run) when a call
     * needs more. */
    float *scratch;
    size_t scratch_floats;
    /* Attention tile list (int32 pairs), grown like scratch. */
    int32_t *tiles;
    size_t tiles_cap;
    /* Split-K partial results of attention, grown like scratch. */
    float *partial;
    size_t partial_cap;
} cpu_ctx_t;

static inline cpu_ctx_t *cpu_ctx(backend_t *be) { return (cpu_ctx_t *)be->ctx; }

/* Ensures each worker has at least `floats` floats of attention scratch.
 * BATON_ERR_NO_MEMORY on failure (old scratch kept). */
baton_status_t cpu_scratch_reserve(cpu_ctx_t *c, size_t floats);

/* Ensures c->tiles holds at least `n` int32 (calling thread only). */
baton_status_t cpu_tiles_reserve(cpu_ctx_t *c, size_t n);

/* Ensures c->partial holds at least `floats` floats (calling thread only). */
baton_status_t cpu_partial_reserve(cpu_ctx_t *c, size_t floats);

/* --- ops (ops_cpu.c) --- */
baton_status_t cpu_matmul(backend_t *be, const backend_weight_t *w, const backend_weight_t *bias,
                          const float *x, float *y, int32_t n);
baton_status_t cpu_rmsnorm(backend_t *be, const float *x, const backend_weight_t *w, float eps,
                           float *y, int32_t n, int32_t d);
baton_status_t cpu_rope(backend_t *be, float *x, const int32_t *pos, int32_t n, int32_t n_heads,
                        int32_t head_dim, float freq_base, float freq_scale,
                        const float *freq_factors, int neox);
baton_status_t cpu_swiglu(backend_t *be, const float *gate, const float *up, float *out,
                          int32_t n, int32_t f);
baton_status_t cpu_add(backend_t *be, const float *a, const float *b, float *y, int64_t n);
baton_status_t cpu_embed(backend_t *be, const backend_weight_t *table, const int32_t *tokens,
                         int32_t n, float *out);
baton_status_t cpu_gather_rows(backend_t *be, const float *x, const int32_t *rows, int32_t n,
                               int32_t d, float *y);

/* --- paged KV (attention_cpu.c) --- */
baton_status_t cpu_kv_write(backend_t *be, const backend_kv_geom_t *geom, void *k_pool,
                            void *v_pool, int32_t layer, const backend_attn_batch_t *b,
                            const float *k, const float *v);
baton_status_t cpu_attention(backend_t *be, const backend_kv_geom_t *geom, const void *k_pool,
                             const void *v_pool, int32_t layer, const backend_attn_batch_t *b,
                             const float *q, float *out, int32_t n_heads);

/* --- small vector helpers (4-wide GCC/clang vector extension, which every
 * x86-64 and arm64 target has; wider SIMD comes from BATON_NATIVE) --- */
typedef float cpu_v4 __attribute__((vector_size(16)));

static inline cpu_v4 cpu_v4_load(const float *p) {
    cpu_v4 v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static inline void cpu_v4_store(float *p, cpu_v4 v) { memcpy(p, &v, sizeof(v)); }

/* sum_i a[i] * b[i] over n floats (four 4-wide partial sums). */
static inline float cpu_vec_dot(const float *a, const float *b, int32_t n) {
    int32_t i = 0;
    float s = 0.0f;
    if (n >= 16) {
        cpu_v4 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        for (; i + 16 <= n; i += 16) {
            s0 += cpu_v4_load(a + i) * cpu_v4_load(b + i);
            s1 += cpu_v4_load(a + i + 4) * cpu_v4_load(b + i + 4);
            s2 += cpu_v4_load(a + i + 8) * cpu_v4_load(b + i + 8);
            s3 += cpu_v4_load(a + i + 12) * cpu_v4_load(b + i + 12);
        }
        cpu_v4 t = (s0 + s1) + (s2 + s3);
        s = (t[0] + t[1]) + (t[2] + t[3]);
    }
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* y[i] += a * x[i] over n floats. */
static inline void cpu_vec_axpy(float *y, float a, const float *x, int32_t n) {
    int32_t i = 0;
    cpu_v4 va = {a, a, a, a};
    for (; i + 4 <= n; i += 4)
        cpu_v4_store(y + i, cpu_v4_load(y + i) + va * cpu_v4_load(x + i));
    for (; i < n; i++)
        y[i] += a * x[i];
}

#endif
