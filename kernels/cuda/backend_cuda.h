/* CUDA backend extras beyond kernels/backend.h (C API; the backend itself is
 * created with backend_cuda_create()). Every function here returns
 * BATON_ERR_UNSUPPORTED when baton was built without CUDA
 * (kernels/cuda/backend_cuda_absent.c) and BATON_ERR_INVALID_ARG when `be`
 * is not a CUDA backend.
 *
 * CUDA graphs for decode steps. A decode step's kernels depend only on the
 * batch size once the block-table width (max_blocks) is fixed, so the forward
 * can capture one step per common batch size and replay it:
 *
 *   1. run one eager step of batch size B (sizes every scratch buffer);
 *   2. backend_cuda_graph_capture_begin(be, B); run the step's ops exactly as
 *      in eager mode; backend_cuda_graph_capture_end(be) -> graph stored
 *      under key B (outputs of the captured step are produced as usual);
 *   3. each later step of size B: backend_cuda_graph_replay_begin(be, B);
 *      call the same ops in the same order with the new host metadata (token
 *      ids, positions, block tables): they only stage that metadata into the
 *      pinned arena the graph copies from, and launch nothing;
 *      backend_cuda_graph_replay_end(be) checks that the op sequence and
 *      every scalar argument matched the capture and launches the graph.
 *
 * A mismatch (other shapes, other pointers, a different op order) returns
 * BATON_ERR_INVALID_ARG from replay_end and launches nothing. Attention in a
 * captured step splits keys by the block-table capacity (max_blocks *
 * block_size) rather than the current context, so one graph serves every
 * context length up to that capacity. Graphs address the backend's scratch
 * buffers: an eager step larger than any before (which grows them) drops
 * every stored graph, and replay_begin then returns NOT_FOUND, so the
 * forward captures again. */
#ifndef BATON_KERNELS_CUDA_BACKEND_CUDA_H
#define BATON_KERNELS_CUDA_BACKEND_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/backend.h"

/* 1 when this build contains the CUDA backend, 0 otherwise. */
int backend_cuda_built(void);

/* Number of CUDA devices visible (0 when none or no driver). Never fails. */
int backend_cuda_device_count(void);

/* Starts capturing the ops of one step under `batch_size` (>= 1). Errors:
 * INVALID_ARG (already capturing/replaying), INTERNAL (CUDA failure). */
baton_status_t backend_cuda_graph_capture_begin(backend_t *be, int32_t batch_size);
/* Ends the capture and instantiates the graph (replacing an older one with
 * the same key; at most 16 keys, the oldest is evicted). */
baton_status_t backend_cuda_graph_capture_end(backend_t *be);
/* Starts a replay of the graph stored under `batch_size`. NOT_FOUND when
 * none was captured. */
baton_status_t backend_cuda_graph_replay_begin(backend_t *be, int32_t batch_size);
/* Verifies the staged op sequence against the capture and launches it. */
baton_status_t backend_cuda_graph_replay_end(backend_t *be);
/* Abandons a capture or replay in progress (after an op failed). */
void backend_cuda_graph_abort(backend_t *be);

/* Chooses the prefill attention kernel (steps where some sequence has more
 * than one token): 0 = SIMT flash kernel (fp32 math, any head_dim <= 256;
 * the default), 1 = tensor-core flash kernel (bf16 WMMA, fp32 accumulate;
 * head_dim 64 or 128, else the SIMT kernel is used). The environment
 * variable BATON_CUDA_PREFILL_ATTN=tc selects 1 at backend creation.
 * Decode steps always use the split-K decode kernel. */
baton_status_t backend_cuda_set_prefill_attention(backend_t *be, int tensor_cores);

/* Creates a bf16 weight [rows, cols] filled on the device with uniform
 * values in (-scale, scale) from `seed` (benchmarks, random models: no host
 * copy). Free with be->ops->weight_free. */
baton_status_t backend_cuda_weight_random(backend_t *be, int64_t rows, int64_t cols, float scale,
                                          uint64_t seed, backend_weight_t **out);

/* Downloads a weight as fp32 host data [rows * cols] (tests). */
baton_status_t backend_cuda_weight_download(backend_t *be, const backend_weight_t *w,
                                            float *host);

/* Measures cuBLAS bf16 GEMM (bf16 inputs, fp32 accumulate and output, the
 * type combination the backend's matmul uses) on m x n x k, `iters` timed
 * runs after one warm-up; *tflops = 2mnk * iters / time / 1e12. */
baton_status_t backend_cuda_measure_gemm(backend_t *be, int32_t m, int32_t n, int32_t k,
                                         int32_t iters, double *tflops);

/* Measures device-to-device cudaMemcpyAsync of `bytes`; *gb_per_s counts
 * bytes read + bytes written (2 * bytes per copy) / time / 1e9, the rate a
 * memory-bound kernel can reach. */
baton_status_t backend_cuda_measure_copy(backend_t *be, size_t bytes, int32_t iters,
                                         double *gb_per_s);

/* Writes "<device name>, sm_XY, N SMs, M MiB" into buf. */
baton_status_t backend_cuda_describe(backend_t *be, char *buf, size_t len);

/* 1 when `ptr` is CUDA device memory (cudaPointerGetAttributes: a KV pool
 * from ->alloc of the CUDA backend), 0 otherwise (host, pinned host, NULL,
 * or no CUDA). The KV transfer uses it to register the pool with UCX as
 * UCS_MEMORY_TYPE_CUDA, or to stage through pinned host buffers when its UCX
 * lacks CUDA support. */
int backend_cuda_is_device_ptr(const void *ptr);

/* Pinned (page-locked) host memory, for staging KV blocks when the transport
 * cannot read device memory. NULL on failure (detail set). Free with
 * backend_cuda_host_free (NULL-safe). */
void *backend_cuda_host_alloc(size_t bytes);
void backend_cuda_host_free(void *ptr);

#endif
