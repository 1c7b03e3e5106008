/* Backend-independent parts of kernels/backend.h: dtype helpers, creation by
 * name, and backend_free. */
#include "kernels/backend.h"

#include <string.h>

size_t backend_dtype_size(backend_dtype_t dtype) {
    switch (dtype) {
    case BACKEND_DTYPE_F32: return 4;
    case BACKEND_DTYPE_BF16: return 2;
    case BACKEND_DTYPE_F16: return 2;
    }
    return 0;
}

const char *backend_dtype_name(backend_dtype_t dtype) {
    switch (dtype) {
    case BACKEND_DTYPE_F32: return "f32";
    case BACKEND_DTYPE_BF16: return "bf16";
    case BACKEND_DTYPE_F16: return "f16";
    }
    return "unknown";
}

#ifndef BATON_HAVE_CUDA
/* Built without the CUDA backend (kernels/CMakeLists.txt defines
 * BATON_HAVE_CUDA when the target baton_kernels_cuda exists). */
baton_status_t backend_cuda_create(int device, backend_t **out) {
    (void)device;
    (void)out;
    return baton_error(BATON_ERR_UNSUPPORTED, "backend: baton was built without CUDA");
}
#endif

baton_status_t backend_create(const char *name, int n_threads, backend_t **out) {
    if (!name || !out)
        return baton_error(BATON_ERR_INVALID_ARG, "backend_create: NULL argument");
    if (strcmp(name, "cpu") == 0)
        return backend_cpu_create(n_threads, out);
    if (strcmp(name, "cuda") == 0)
        return backend_cuda_create(0, out);
    return baton_error(BATON_ERR_INVALID_ARG, "backend_create: unknown backend '%s' (cpu, cuda)",
                       name);
}

void backend_free(backend_t *be) {
    if (!be)
        return;
    if (be->ops && be->ops->destroy)
        be->ops->destroy(be);
}
