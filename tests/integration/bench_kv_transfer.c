/* KV transfer benchmark (driven by scripts/bench-kv-transfer).
 *
 *   bench_kv_transfer GEOM TOKENS [ITERS]
 *
 * GEOM: smollm2   (30 layers, 3 KV heads, head_dim 64, fp32, block 16:
 *                  12 KiB per block per K or V)
 *       llama3-8b (32 layers, 8 KV heads, head_dim 128, 16-bit, block 16:
 *                  32 KiB per block per K or V)
 * Starts a receiver process (the harness), then ITERS times (default 5)
 * moves the KV of one TOKENS-token prompt layer by layer (kv_transfer_send_
 * layer per layer, then flush; timed from the first put to the flush
 * callback) with a random non-contiguous block table of runs of 1..8
 * blocks, checks every byte of the receiver's pool at the end, and prints
 * one line:
 *   geom=.. tokens=.. blocks=.. bytes=.. puts=.. avg_put_bytes=..
 *   block_bytes=.. ms_median=.. ms_best=.. gbps_median=.. gbps_best=.. bad_bytes=..
 * (GB/s = 1e9 bytes/s, K and V payload counted). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv_transfer.h"
#include "common/status.h"
#include "tests/integration/kv_transfer_harness.h"

static void on_done(kv_transfer_t *x, baton_status_t st, void *arg) {
    int *d = arg;
    *d = st == BATON_OK ? 1 : -1;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int rc = kvt_receiver_main_if_requested(argc, argv);
    if (rc >= 0) return rc;
    signal(SIGPIPE, SIG_IGN);
    if (argc < 3) {
        fprintf(stderr, "usage: %s smollm2|llama3-8b TOKENS [ITERS]\n", argv[0]);
        return 2;
    }
    int32_t n_layers;
    uint64_t block_bytes;
    if (!strcmp(argv[1], "smollm2")) {
        n_layers = 30;
        block_bytes = 16ull * 3 * 64 * 4;
    } else if (!strcmp(argv[1], "llama3-8b")) {
        n_layers = 32;
        block_bytes = 16ull * 8 * 128 * 2;
    } else {
        fprintf(stderr, "unknown geometry %s\n", argv[1]);
        return 2;
    }
    int tokens = atoi(argv[2]);
    int iters = argc > 3 ? atoi(argv[3]) : 5;
    if (tokens < 16 || iters < 1 || iters > 1000) {
        fprintf(stderr, "bad TOKENS or ITERS\n");
        return 2;
    }
    size_t n_pairs = (size_t)(tokens + 15) / 16;
    int32_t pool_blocks = (int32_t)(n_pairs + n_pairs / 8 + 8);

    kv_transfer_pool_desc_t pd;
    if (kvt_pool_alloc(n_layers, pool_blocks, block_bytes, 11, &pd)) {
        fprintf(stderr, "pool allocation failed\n");
        return 1;
    }
    kv_transfer_engine_t *eng = NULL;
    kv_transfer_pool_t *src = NULL;
    kv_transfer_peer_t *peer = NULL;
    kvt_receiver_t r = {0};
    kv_transfer_block_pair_t *table = malloc(n_pairs * sizeof(*table));
    double *ms = calloc((size_t)iters, sizeof(double));
    rc = 1;
    if (!table || !ms) goto out;
    kv_transfer_engine_config_t cfg = {.no_peer_error_handling = kvt_shm_mode()};
    if (kv_transfer_engine_init(&cfg, &eng) || kv_transfer_pool_register(eng, &pd, &src)) {
        fprintf(stderr, "%s\n", baton_last_error());
        goto out;
    }
    if (kvt_receiver_start(n_layers, pool_blocks, block_bytes, 22, &r)) {
        fprintf(stderr, "receiver did not start\n");
        goto out;
    }
    if (kv_transfer_peer_connect(eng, r.desc, r.desc_len, &peer)) {
        fprintf(stderr, "%s\n", baton_last_error());
        goto out;
    }
    uint64_t bytes = 0, puts = 0;
    /* One block table for every iteration, so that the receiver's final
     * check covers every block. */
    kvt_make_table(1000, pool_blocks, pool_blocks, n_pairs, 8, table);
    for (int it = 0; it < iters + 1; it++) { /* iteration 0 warms up */
        int done = 0;
        kv_transfer_t *x = NULL;
        if (kv_transfer_begin(peer, src, 60000, on_done, &done, &x)) {
            fprintf(stderr, "%s\n", baton_last_error());
            goto out;
        }
        double t0 = kvt_now_s();
        for (int32_t l = 0; l < n_layers; l++) {
            if (kv_transfer_send_layer(x, l, table, n_pairs)) {
                fprintf(stderr, "%s\n", baton_last_error());
                kv_transfer_free(x);
                goto out;
            }
            kv_transfer_engine_progress(eng);
        }
        kv_transfer_flush(x);
        while (!done) kv_transfer_engine_wait(eng, 100);
        double t1 = kvt_now_s();
        bytes = kv_transfer_bytes(x);
        puts = kv_transfer_n_puts(x);
        kv_transfer_free(x);
        if (done < 0) {
            fprintf(stderr, "transfer failed\n");
            goto out;
        }
        if (it > 0) ms[it - 1] = (t1 - t0) * 1e3;
    }
    uint64_t bad = UINT64_MAX;
    if (kvt_receiver_check(&r, 11, table, n_pairs, &bad)) goto out;
    qsort(ms, (size_t)iters, sizeof(double), cmp_double);
    double med = ms[iters / 2], best = ms[0];
    printf("geom=%s tokens=%d blocks=%zu bytes=%llu puts=%llu avg_put_bytes=%llu block_bytes=%llu "
           "ms_median=%.3f ms_best=%.3f gbps_median=%.3f gbps_best=%.3f bad_bytes=%llu\n",
           argv[1], tokens, n_pairs, (unsigned long long)bytes, (unsigned long long)puts,
           (unsigned long long)(bytes / (puts ? puts : 1)), (unsigned long long)block_bytes, med,
           best, bytes / (med * 1e6), bytes / (best * 1e6), (unsigned long long)bad);
    rc = bad == 0 ? 0 : 1;
out:
    kv_transfer_peer_free(peer);
    if (r.pid > 0) kvt_receiver_stop(&r);
    kv_transfer_pool_free(src);
    kv_transfer_engine_free(eng);
    kvt_pool_release(&pd);
    free(table);
    free(ms);
    return rc;
}
