/* The CUDA backend's entry points in a build without CUDA (BATON_CUDA=OFF
 * or no nvcc): every call returns BATON_ERR_UNSUPPORTED with a detail, so
 * `--device cuda` fails with a clear message and the cuda tests skip. */
#include <stddef.h>

#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_sampling.h"

static baton_status_t absent(void) {
    return baton_error(BATON_ERR_UNSUPPORTED, "baton was built without CUDA (BATON_CUDA=OFF "
                       "or nvcc not found)");
}

baton_status_t backend_cuda_create(int device, backend_t **out) { return absent(); }
int backend_cuda_built(void) { return 0; }
int backend_cuda_device_count(void) { return 0; }
baton_status_t backend_cuda_graph_capture_begin(backend_t *be, int32_t batch_size) { return absent(); }
baton_status_t backend_cuda_graph_capture_end(backend_t *be) { return absent(); }
baton_status_t backend_cuda_graph_replay_begin(backend_t *be, int32_t batch_size) { return absent(); }
baton_status_t backend_cuda_graph_replay_end(backend_t *be) { return absent(); }
void backend_cuda_graph_abort(backend_t *be) {}
baton_status_t backend_cuda_weight_random(backend_t *be, int64_t rows, int64_t cols, float scale,
                                          uint64_t seed, backend_weight_t **out) {
    return absent();
}
baton_status_t backend_cuda_weight_download(backend_t *be, const backend_weight_t *w,
                                            float *host) {
    return absent();
}
baton_status_t backend_cuda_measure_gemm(backend_t *be, int32_t m, int32_t n, int32_t k,
                                         int32_t iters, double *tflops) {
    return absent();
}
baton_status_t backend_cuda_measure_copy(backend_t *be, size_t bytes, int32_t iters,
                                         double *gb_per_s) {
    return absent();
}
baton_status_t backend_cuda_describe(backend_t *be, char *buf, size_t len) { return absent(); }
void *backend_cuda_host_alloc(size_t bytes) {
    absent();
    return NULL;
}
void backend_cuda_host_free(void *ptr) {}
int backend_cuda_is_device_ptr(const void *ptr) { return 0; }
baton_status_t backend_cuda_set_prefill_attention(backend_t *be, int tensor_cores) {
    return absent();
}
baton_status_t cuda_sample_greedy(backend_t *be, const float *logits, int32_t n, int32_t vocab,
                                  int32_t *out_ids) {
    return absent();
}
baton_status_t cuda_sample(backend_t *be, const float *logits, int32_t n, int32_t vocab,
                           const float *temperature, const int32_t *top_k, const float *top_p,
                           const float *uniform, int32_t *out_ids) {
    return absent();
}
