/* Two-process harness for the KV transfer tests and benchmark.
 *
 * The sender process (test or bench) re-executes its own binary as the
 * receiver ("decode side") with `--kvt-receiver FD N_LAYERS N_BLOCKS
 * BLOCK_BYTES SEED`, FD being its end of a socketpair. The receiver
 * allocates a K and a V pool, fills every block with a sentinel pattern,
 * registers them (kv_transfer_pool_register) and sends the packed
 * descriptor. It then keeps its UCX worker progressing (needed where UCX
 * emulates RMA over active messages, e.g. TCP) until asked to check bytes
 * or to quit.
 *
 * Block contents come from kvt_fill_block(): a splitmix64 stream keyed by
 * (seed, K/V, layer, block), so the receiver regenerates what each source
 * block held without being sent any payload. */
#ifndef BATON_TESTS_KV_TRANSFER_HARNESS_H
#define BATON_TESTS_KV_TRANSFER_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/kv_transfer.h"

/* Seed mixed into the receiver's sentinel pattern. */
#define KVT_SENTINEL_SALT 0x5e9714e15a17ull

/* Fills `bytes` bytes (multiple of 8) of one block deterministically. */
void kvt_fill_block(uint8_t *dst, uint64_t bytes, uint64_t seed, int is_v, int32_t layer,
                    int32_t block);

/* True when BATON_KVT_SHM=1: both sides run without peer error handling
 * and the receiver's pool is allocated by UCX (kv_transfer_pool_alloc), so
 * that UCX can put through shared memory (kv_transfer.h,
 * no_peer_error_handling). */
int kvt_shm_mode(void);

/* Fills every block of a pool with kvt_fill_block(seed, ...). */
void kvt_pool_fill(const kv_transfer_pool_desc_t *pool, uint64_t seed);

/* Allocates a pool of the given shape (page-aligned) filled with
 * kvt_fill_block(seed, ...). Returns 0 on success. */
int kvt_pool_alloc(int32_t n_layers, int32_t n_blocks, uint64_t block_bytes, uint64_t seed,
                   kv_transfer_pool_desc_t *out);
void kvt_pool_release(kv_transfer_pool_desc_t *pool);

/* A running receiver process. */
typedef struct kvt_receiver {
    pid_t pid;
    int sock;       /* sender's end of the socketpair */
    void *desc;     /* its pool descriptor (malloc'd) */
    size_t desc_len;
} kvt_receiver_t;

/* If argv asks for the receiver role, runs it and returns its exit code
 * (>= 0); otherwise returns -1. Call first thing in main(). */
int kvt_receiver_main_if_requested(int argc, char **argv);

/* Starts a receiver (fork + exec of /proc/self/exe) and reads its
 * descriptor. Waits at most 20 s. Returns 0 on success. */
int kvt_receiver_start(int32_t n_layers, int32_t n_blocks, uint64_t block_bytes, uint64_t seed,
                       kvt_receiver_t *out);

/* Asks the receiver to compare its whole pool with what a transfer of
 * `pairs` (the same table for every layer) from a source pool filled with
 * `src_seed` must have produced; blocks not written must still hold the
 * sentinel. Writes the number of wrong bytes to *bad_bytes. Returns 0 when
 * the receiver answered. */
int kvt_receiver_check(kvt_receiver_t *r, uint64_t src_seed, const kv_transfer_block_pair_t *pairs,
                       size_t n_pairs, uint64_t *bad_bytes);

/* Tells the receiver to exit and reaps it; returns its exit status (0 ok). */
int kvt_receiver_stop(kvt_receiver_t *r);

/* SIGKILLs the receiver and reaps it. */
void kvt_receiver_kill(kvt_receiver_t *r);

/* Builds a random block table of n_pairs pairs over source and destination
 * pools of src_blocks / dst_blocks blocks: distinct blocks on each side,
 * grouped in runs of 1..max_run blocks that are contiguous on both sides
 * and placed at unrelated positions (so the table is non-contiguous on
 * both sides, with coalescable runs). Returns 0 on success. */
int kvt_make_table(uint64_t rng_seed, int32_t src_blocks, int32_t dst_blocks, size_t n_pairs,
                   int max_run, kv_transfer_block_pair_t *out);

/* Monotonic clock in seconds. */
double kvt_now_s(void);

#endif
