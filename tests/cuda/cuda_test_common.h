/* Shared helpers of the cuda-labelled tests: the skip rule (exit code 77
 * when baton was built without CUDA or no device is present), bf16 rounding
 * on the host, random fills, error metrics and backend buffer helpers. */
#ifndef BATON_TESTS_CUDA_TEST_COMMON_H
#define BATON_TESTS_CUDA_TEST_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "tests/test_util.h"

#define CUDA_TEST_SKIP 77

/* Creates the CUDA backend on device 0, or prints why the test is skipped
 * and returns NULL (the caller exits with CUDA_TEST_SKIP). Any other failure
 * of a build/device that should work is an error: *fail is set. */
static inline backend_t *cuda_test_backend(int *fail) {
    *fail = 0;
    if (!backend_cuda_built()) {
        fprintf(stderr, "SKIP: baton was built without CUDA (BATON_CUDA=OFF or no nvcc)\n");
        return NULL;
    }
    if (backend_cuda_device_count() <= 0) {
        fprintf(stderr, "SKIP: no CUDA device on this machine\n");
        return NULL;
    }
    backend_t *be = NULL;
    baton_status_t st = backend_cuda_create(0, &be);
    if (st == BATON_ERR_UNSUPPORTED) {
        fprintf(stderr, "SKIP: CUDA backend unavailable: %s\n", baton_last_error());
        return NULL;
    }
    if (st != BATON_OK) {
        fprintf(stderr, "FAIL: backend_cuda_create: %s\n", baton_last_error());
        *fail = 1;
        return NULL;
    }
    char desc[256];
    if (backend_cuda_describe(be, desc, sizeof(desc)) == BATON_OK)
        fprintf(stderr, "cuda device: %s\n", desc);
    return be;
}

/* Round to the nearest bf16 (ties to even), returned as fp32. */
static inline float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return f;
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

static inline float bf16_bits_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t t_rng = 0x1234567887654321ull;
static inline double t_uniform(void) { /* xorshift64*, [0, 1) */
    t_rng ^= t_rng >> 12;
    t_rng ^= t_rng << 25;
    t_rng ^= t_rng >> 27;
    return (double)((t_rng * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}
static inline void t_fill(float *x, int64_t n, float lo, float hi, int round_bf16) {
    for (int64_t i = 0; i < n; i++) {
        float v = lo + (hi - lo) * (float)t_uniform();
        x[i] = round_bf16 ? bf16_round(v) : v;
    }
}

/* max |a - ref| / max |ref| (inf when a holds a NaN). */
static inline double t_rel_err(const float *a, const float *ref, int64_t n) {
    double md = 0.0, mr = 1e-12;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        double d = fabs((double)a[i] - ref[i]);
        if (d > md) md = d;
        if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
    }
    return md / mr;
}

static inline void *t_alloc_upload(backend_t *be, const void *host, size_t bytes) {
    void *p = be->ops->alloc(be, bytes);
    if (p && host && be->ops->upload(be, p, host, bytes) != BATON_OK) {
        be->ops->free(be, p);
        return NULL;
    }
    return p;
}

/* Fills backend memory with 0xFF bytes (NaN as fp32 and bf16) so an output
 * element the kernel forgets to write cannot pass. */
static inline int t_poison(backend_t *be, void *p, size_t bytes) {
    unsigned char *h = malloc(bytes ? bytes : 1);
    if (!h) return -1;
    memset(h, 0xff, bytes);
    int rc = be->ops->upload(be, p, h, bytes) == BATON_OK ? 0 : -1;
    free(h);
    return rc;
}

#endif
