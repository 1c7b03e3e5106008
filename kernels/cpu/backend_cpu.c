/* CPU backend: context, memory, weights and the ops table. Everything is
 * host memory; ops run synchronously (synchronize is a no-op). */
#include "kernels/cpu/backend_cpu.h"

#include <cblas.h>
#include <stdlib.h>
#include <unistd.h>

#define CPU_ALIGN 64
#define CPU_MAX_THREADS 1024

static void *cpu_aligned_alloc(size_t bytes) {
    void *p = NULL;
    if (bytes == 0)
        bytes = CPU_ALIGN;
    if (posix_memalign(&p, CPU_ALIGN, bytes) != 0)
        return NULL;
    return p;
}

baton_status_t cpu_scratch_reserve(cpu_ctx_t *c, size_t floats) {
    if (floats <= c->scratch_floats)
        return BATON_OK;
    floats = (floats + 15) & ~(size_t)15; /* keep each slice 64-byte aligned */
    float *s = cpu_aligned_alloc(floats * sizeof(float) * (size_t)c->n_threads);
    if (!s)
        return baton_error(BATON_ERR_NO_MEMORY, "cpu: cannot allocate %zu floats of attention scratch",
                           floats * (size_t)c->n_threads);
    free(c->scratch);
    c->scratch = s;
    c->scratch_floats = floats;
    return BATON_OK;
}

baton_status_t cpu_tiles_reserve(cpu_ctx_t *c, size_t n) {
    if (n <= c->tiles_cap)
        return BATON_OK;
    size_t cap = c->tiles_cap * 2 > n ? c->tiles_cap * 2 : n;
    int32_t *t = realloc(c->tiles, cap * sizeof(int32_t));
    if (!t)
        return baton_error(BATON_ERR_NO_MEMORY, "cpu: cannot allocate %zu attention tiles", cap / 2);
    c->tiles = t;
    c->tiles_cap = cap;
    return BATON_OK;
}

baton_status_t cpu_partial_reserve(cpu_ctx_t *c, size_t floats) {
    if (floats <= c->partial_cap)
        return BATON_OK;
    size_t cap = c->partial_cap * 2 > floats ? c->partial_cap * 2 : floats;
    float *p = cpu_aligned_alloc(cap * sizeof(float));
    if (!p)
        return baton_error(BATON_ERR_NO_MEMORY, "cpu: cannot allocate %zu floats of split-K partials", cap);
    free(c->partial);
    c->partial = p;
    c->partial_cap = cap;
    return BATON_OK;
}

static void cpu_destroy(backend_t *be) {
    cpu_ctx_t *c = cpu_ctx(be);
    if (c) {
        cpu_pool_free(c->pool);
        free(c->scratch);
        free(c->tiles);
        free(c->partial);
        free(c);
    }
    free(be);
}

static void *cpu_alloc(backend_t *be, size_t bytes) {
    void *p = cpu_aligned_alloc(bytes);
    if (!p)
        baton_error(BATON_ERR_NO_MEMORY, "cpu: cannot allocate %zu bytes", bytes);
    return p;
}

static void cpu_free(backend_t *be, void *ptr) { free(ptr); }

static baton_status_t cpu_upload(backend_t *be, void *dst, const void *src_host, size_t bytes) {
    if (bytes && (!dst || !src_host))
        return baton_error(BATON_ERR_INVALID_ARG, "cpu upload: NULL pointer");
    if (bytes)
        memmove(dst, src_host, bytes);
    return BATON_OK;
}

static baton_status_t cpu_download(backend_t *be, void *dst_host, const void *src, size_t bytes) {
    if (bytes && (!dst_host || !src))
        return baton_error(BATON_ERR_INVALID_ARG, "cpu download: NULL pointer");
    if (bytes)
        memmove(dst_host, src, bytes);
    return BATON_OK;
}

static baton_status_t cpu_memset_zero(backend_t *be, void *dst, size_t bytes) {
    if (bytes && !dst)
        return baton_error(BATON_ERR_INVALID_ARG, "cpu memset_zero: NULL pointer");
    if (bytes)
        memset(dst, 0, bytes);
    return BATON_OK;
}

static baton_status_t cpu_synchronize(backend_t *be) { return BATON_OK; }

static baton_status_t cpu_weight_create(backend_t *be, const float *host, int64_t rows,
                                        int64_t cols, backend_weight_t **out) {
    if (!host || !out || rows <= 0 || cols <= 0)
        return baton_error(BATON_ERR_INVALID_ARG, "cpu weight_create: bad argument (rows %lld, cols %lld)",
                           (long long)rows, (long long)cols);
    if ((uint64_t)rows > SIZE_MAX / sizeof(float) / (uint64_t)cols)
        return baton_error(BATON_ERR_INVALID_ARG, "cpu weight_create: %lld x %lld overflows",
                           (long long)rows, (long long)cols);
    backend_weight_t *w = malloc(sizeof(*w));
    if (!w)
        return baton_error(BATON_ERR_NO_MEMORY, "cpu weight_create: out of memory");
    size_t bytes = (size_t)rows * (size_t)cols * sizeof(float);
    w->data = cpu_aligned_alloc(bytes);
    if (!w->data) {
        free(w);
        return baton_error(BATON_ERR_NO_MEMORY, "cpu weight_create: cannot allocate %zu bytes", bytes);
    }
    memcpy(w->data, host, bytes);
    w->rows = rows;
    w->cols = cols;
    *out = w;
    return BATON_OK;
}

static void cpu_weight_free(backend_t *be, backend_weight_t *w) {
    if (!w)
        return;
    free(w->data);
    free(w);
}

static const backend_ops_t cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .memset_zero = cpu_memset_zero,
    .synchronize = cpu_synchronize,
    .weight_create = cpu_weight_create,
    .weight_free = cpu_weight_free,
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .embed = cpu_embed,
    .gather_rows = cpu_gather_rows,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
};

baton_status_t backend_cpu_create(int n_threads, backend_t **out) {
    if (!out)
        return baton_error(BATON_ERR_INVALID_ARG, "backend_cpu_create: out is NULL");
    if (n_threads < 0 || n_threads > CPU_MAX_THREADS)
        return baton_error(BATON_ERR_INVALID_ARG, "backend_cpu_create: n_threads %d outside 0..%d",
                           n_threads, CPU_MAX_THREADS);
    if (n_threads == 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = online < 1 ? 1 : online > CPU_MAX_THREADS ? CPU_MAX_THREADS : (int)online;
    }
    backend_t *be = calloc(1, sizeof(*be));
    cpu_ctx_t *c = calloc(1, sizeof(*c));
    if (!be || !c) {
        free(be);
        free(c);
        return baton_error(BATON_ERR_NO_MEMORY, "backend_cpu_create: out of memory");
    }
    c->n_threads = n_threads;
    baton_status_t st = cpu_pool_init(n_threads, &c->pool);
    if (st != BATON_OK) {
        free(be);
        free(c);
        return st;
    }
    /* OpenBLAS runs its own threads for sgemm; our pool never runs during a
     * BLAS call, so both get the same count and never oversubscribe. The
     * setting is process-wide (the last backend created wins). */
    openblas_set_num_threads(n_threads);
    be->ops = &cpu_ops;
    be->ctx = c;
    be->weight_dtype = BACKEND_DTYPE_F32;
    be->kv_dtype = BACKEND_DTYPE_F32;
    *out = be;
    return BATON_OK;
}
