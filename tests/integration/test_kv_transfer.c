/* Two-process KV transfer tests (issue 3): a real receiver process (decode
 * side) registers its pool; this process (prefill side) puts a 2,000-token
 * prompt's KV of the default model's geometry layer by layer with
 * non-contiguous block tables on both sides, flushes, and the receiver
 * compares every byte of its pool (written blocks and untouched ones).
 *
 *   test_kv_transfer bytes TLS   transfer + byte check
 *   test_kv_transfer kill TLS    receiver SIGKILLed mid-transfer: failure
 *                                within 5 s, then a fresh receiver works
 *   test_kv_transfer stall TLS   receiver SIGSTOPped: the transfer deadline
 *                                (1.5 s) fails it, nothing hangs
 *   test_kv_transfer bytes-shm TLS  as bytes, through shared memory: no
 *                                peer error handling, receiver pool
 *                                allocated by UCX (kv_transfer_pool_alloc)
 * TLS is a UCX_TLS value, or "default" to let UCX choose. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv_transfer.h"
#include "common/status.h"
#include "tests/integration/kv_transfer_harness.h"
#include "tests/test_util.h"

/* SmolLM2-135M (GGUF metadata of the default model): 30 layers, 3 KV heads,
 * head_dim 64; fp32 KV on the CPU backend, block of 16 tokens. */
#define N_LAYERS 30
#define BLOCK_BYTES (16u * 3u * 64u * 4u)
#define PROMPT_TOKENS 2000
#define N_PAIRS (PROMPT_TOKENS / 16) /* 125 blocks */
#define SRC_BLOCKS 160
#define DST_BLOCKS 176
#define SRC_SEED 0x1234abcdull
#define DST_SEED 0x777000111ull

typedef struct done_rec {
    int calls;
    baton_status_t status;
    double at;
} done_rec_t;

static void on_done(kv_transfer_t *x, baton_status_t st, void *arg) {
    done_rec_t *d = arg;
    d->calls++;
    d->status = st;
    d->at = kvt_now_s();
}

static int wait_done(kv_transfer_engine_t *eng, done_rec_t *d, double limit_s) {
    double end = kvt_now_s() + limit_s;
    while (d->calls == 0 && kvt_now_s() < end) kv_transfer_engine_wait(eng, 100);
    return d->calls;
}

/* Number of ucp_put_nbx calls per layer and per K/V region: maximal runs
 * where source and destination both advance by one (the issue's
 * coalescing rule). */
static size_t count_runs(const kv_transfer_block_pair_t *p, size_t n) {
    size_t runs = n ? 1 : 0;
    for (size_t i = 1; i < n; i++)
        if (p[i].src_block != p[i - 1].src_block + 1 || p[i].dst_block != p[i - 1].dst_block + 1)
            runs++;
    return runs;
}

/* One full transfer to `r` and the receiver's byte check. `written` holds
 * the pairs of earlier transfers to the same receiver (n_written of them,
 * room for N_PAIRS more); this transfer's pairs are appended, later pairs
 * overriding earlier ones for the same destination block. */
static void full_transfer(kv_transfer_engine_t *eng, kv_transfer_pool_t *src, kvt_receiver_t *r,
                          uint64_t table_seed, kv_transfer_block_pair_t *written,
                          size_t *n_written) {
    kv_transfer_peer_t *peer = NULL;
    CHECK_OK(kv_transfer_peer_connect(eng, r->desc, r->desc_len, &peer));
    if (!peer) return;
    CHECK_EQ_INT(kv_transfer_peer_info(peer)->n_blocks, DST_BLOCKS);
    CHECK_EQ_INT(kv_transfer_peer_info(peer)->n_layers, N_LAYERS);

    kv_transfer_block_pair_t table[N_PAIRS];
    CHECK_OK(kvt_make_table(table_seed, SRC_BLOCKS, DST_BLOCKS, N_PAIRS, 6, table));
    size_t runs = count_runs(table, N_PAIRS);
    CHECK_MSG(runs > 10 && runs < N_PAIRS, "table should be non-contiguous with runs (%zu)", runs);

    done_rec_t done = {0};
    kv_transfer_t *x = NULL;
    CHECK_OK(kv_transfer_begin(peer, src, 20000, on_done, &done, &x));
    if (!x) {
        kv_transfer_peer_free(peer);
        return;
    }
    double t0 = kvt_now_s();
    for (int32_t l = 0; l < N_LAYERS; l++) {
        CHECK_OK(kv_transfer_send_layer(x, l, table, N_PAIRS));
        CHECK_OK(kv_transfer_engine_progress(eng)); /* as an event loop between layers */
    }
    CHECK_EQ_INT(done.calls, 0);
    CHECK_OK(kv_transfer_flush(x));
    CHECK_EQ_INT(wait_done(eng, &done, 20.0), 1);
    double t1 = kvt_now_s();
    CHECK_EQ_INT(done.status, BATON_OK);
    CHECK_EQ_INT(kv_transfer_get_state(x), KV_TRANSFER_STATE_DONE);
    CHECK_EQ_INT(kv_transfer_bytes(x), 2ull * N_LAYERS * N_PAIRS * BLOCK_BYTES);
    CHECK_EQ_INT(kv_transfer_n_puts(x), 2ull * N_LAYERS * runs);
    /* A finished transfer accepts nothing more. */
    CHECK_EQ_INT(kv_transfer_send_layer(x, 0, table, 1), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(kv_transfer_flush(x), BATON_ERR_INVALID_ARG);
    fprintf(stderr, "transfer: %.1f MB in %.3f s, %llu puts for %d block copies\n",
            kv_transfer_bytes(x) / 1e6, t1 - t0, (unsigned long long)kv_transfer_n_puts(x),
            2 * N_LAYERS * N_PAIRS);
    kv_transfer_free(x);

    memcpy(written + *n_written, table, sizeof(table));
    *n_written += N_PAIRS;
    uint64_t bad = UINT64_MAX;
    CHECK_OK(kvt_receiver_check(r, SRC_SEED, written, *n_written, &bad));
    CHECK_MSG(bad == 0, "receiver found %llu wrong bytes", (unsigned long long)bad);
    kv_transfer_peer_free(peer);
}

static void test_bytes(void) {
    kv_transfer_pool_desc_t pd;
    CHECK_OK(kvt_pool_alloc(N_LAYERS, SRC_BLOCKS, BLOCK_BYTES, SRC_SEED, &pd));
    kv_transfer_engine_t *eng = NULL;
    kv_transfer_pool_t *src = NULL;
    kv_transfer_engine_config_t cfg = {.no_peer_error_handling = kvt_shm_mode()};
    CHECK_OK(kv_transfer_engine_init(&cfg, &eng));
    CHECK_OK(kv_transfer_pool_register(eng, &pd, &src));
    kvt_receiver_t r;
    CHECK_OK(kvt_receiver_start(N_LAYERS, DST_BLOCKS, BLOCK_BYTES, DST_SEED, &r));
    if (eng && src && r.pid > 0) {
        kv_transfer_block_pair_t written[2 * N_PAIRS];
        size_t n_written = 0;
        full_transfer(eng, src, &r, 42, written, &n_written);
        /* A second request to the same receiver with another table
         * (overwrites some blocks of the first). */
        full_transfer(eng, src, &r, 43, written, &n_written);
        CHECK_EQ_INT(kvt_receiver_stop(&r), 0);
    }
    kv_transfer_pool_free(src);
    kv_transfer_engine_free(eng);
    kvt_pool_release(&pd);
}

static void test_kill(void) {
    kv_transfer_pool_desc_t pd;
    CHECK_OK(kvt_pool_alloc(N_LAYERS, SRC_BLOCKS, BLOCK_BYTES, SRC_SEED, &pd));
    kv_transfer_engine_t *eng = NULL;
    kv_transfer_pool_t *src = NULL;
    CHECK_OK(kv_transfer_engine_init(NULL, &eng));
    CHECK_OK(kv_transfer_pool_register(eng, &pd, &src));
    kvt_receiver_t r;
    CHECK_OK(kvt_receiver_start(N_LAYERS, DST_BLOCKS, BLOCK_BYTES, DST_SEED, &r));
    kv_transfer_peer_t *peer = NULL;
    CHECK_OK(kv_transfer_peer_connect(eng, r.desc, r.desc_len, &peer));
    if (!peer) return;
    kv_transfer_block_pair_t table[N_PAIRS];
    CHECK_OK(kvt_make_table(7, SRC_BLOCKS, DST_BLOCKS, N_PAIRS, 6, table));

    done_rec_t done = {0};
    kv_transfer_t *x = NULL;
    /* Deadline well past 5 s: the failure must come from peer detection. */
    CHECK_OK(kv_transfer_begin(peer, src, 30000, on_done, &done, &x));
    for (int32_t l = 0; l < N_LAYERS / 2; l++) {
        CHECK_OK(kv_transfer_send_layer(x, l, table, N_PAIRS));
        CHECK_OK(kv_transfer_engine_progress(eng));
    }
    kvt_receiver_kill(&r);
    double t_kill = kvt_now_s();
    baton_status_t st = BATON_OK;
    for (int32_t l = N_LAYERS / 2; l < N_LAYERS && st == BATON_OK; l++) {
        st = kv_transfer_send_layer(x, l, table, N_PAIRS);
        kv_transfer_engine_progress(eng);
    }
    if (st == BATON_OK) st = kv_transfer_flush(x);
    CHECK_MSG(st == BATON_OK || st == BATON_ERR_PEER, "send/flush after kill: %d (%s)", st,
              baton_last_error());
    CHECK_EQ_INT(wait_done(eng, &done, 10.0), 1);
    double waited = done.calls ? done.at - t_kill : kvt_now_s() - t_kill;
    fprintf(stderr, "kill: failure reported after %.3f s (status %s)\n", waited,
            baton_status_str(done.status));
    CHECK_EQ_INT(done.status, BATON_ERR_PEER);
    CHECK_MSG(waited < 5.0, "failure took %.3f s", waited);
    CHECK_EQ_INT(kv_transfer_get_state(x), KV_TRANSFER_STATE_FAILED);
    CHECK_EQ_INT(kv_transfer_status(x), BATON_ERR_PEER);
    CHECK_EQ_INT(kv_transfer_peer_status(peer), BATON_ERR_PEER);
    /* A failed peer refuses new transfers. */
    kv_transfer_t *y = NULL;
    CHECK_EQ_INT(kv_transfer_begin(peer, src, 0, NULL, NULL, &y), BATON_ERR_PEER);
    CHECK(y == NULL);
    kv_transfer_free(x);
    kv_transfer_peer_free(peer);
    /* Exactly one callback. */
    for (int i = 0; i < 3; i++) kv_transfer_engine_wait(eng, 10);
    CHECK_EQ_INT(done.calls, 1);

    /* A fresh receiver works on the same engine. */
    kvt_receiver_t r2;
    CHECK_OK(kvt_receiver_start(N_LAYERS, DST_BLOCKS, BLOCK_BYTES, DST_SEED, &r2));
    if (r2.pid > 0) {
        kv_transfer_block_pair_t written[N_PAIRS];
        size_t n_written = 0;
        full_transfer(eng, src, &r2, 99, written, &n_written);
        CHECK_EQ_INT(kvt_receiver_stop(&r2), 0);
    }
    kv_transfer_pool_free(src);
    kv_transfer_engine_free(eng);
    kvt_pool_release(&pd);
}

/* A receiver that stops responding (SIGSTOP: its sockets stay open, so no
 * transport error comes) must not hang the sender: the transfer's own
 * deadline fails it with BATON_ERR_TIMEOUT and closes the endpoint. */
static void test_stall(void) {
    kv_transfer_pool_desc_t pd;
    CHECK_OK(kvt_pool_alloc(N_LAYERS, SRC_BLOCKS, BLOCK_BYTES, SRC_SEED, &pd));
    kv_transfer_engine_t *eng = NULL;
    kv_transfer_pool_t *src = NULL;
    CHECK_OK(kv_transfer_engine_init(NULL, &eng));
    CHECK_OK(kv_transfer_pool_register(eng, &pd, &src));
    kvt_receiver_t r;
    CHECK_OK(kvt_receiver_start(N_LAYERS, DST_BLOCKS, BLOCK_BYTES, DST_SEED, &r));
    kv_transfer_peer_t *peer = NULL;
    CHECK_OK(kv_transfer_peer_connect(eng, r.desc, r.desc_len, &peer));
    if (!peer) return;
    kv_transfer_block_pair_t table[N_PAIRS];
    CHECK_OK(kvt_make_table(5, SRC_BLOCKS, DST_BLOCKS, N_PAIRS, 6, table));
    kill(r.pid, SIGSTOP);
    done_rec_t done = {0};
    kv_transfer_t *x = NULL;
    double t0 = kvt_now_s();
    CHECK_OK(kv_transfer_begin(peer, src, 1500, on_done, &done, &x));
    baton_status_t st = BATON_OK;
    for (int32_t l = 0; l < N_LAYERS && st == BATON_OK; l++) {
        st = kv_transfer_send_layer(x, l, table, N_PAIRS);
        kv_transfer_engine_progress(eng);
    }
    if (st == BATON_OK) st = kv_transfer_flush(x);
    CHECK_EQ_INT(wait_done(eng, &done, 10.0), 1);
    double waited = (done.calls ? done.at : kvt_now_s()) - t0;
    fprintf(stderr, "stall: transfer ended after %.3f s (status %s)\n", waited,
            baton_status_str(done.status));
    CHECK_MSG(done.status == BATON_ERR_TIMEOUT || done.status == BATON_ERR_PEER,
              "status %d", done.status);
    CHECK_MSG(waited >= 1.4 || done.status == BATON_ERR_PEER, "ended before its deadline");
    CHECK_MSG(waited < 5.0, "took %.3f s", waited);
    CHECK(kv_transfer_peer_status(peer) != BATON_OK);
    kv_transfer_free(x);
    kv_transfer_peer_free(peer);
    kvt_receiver_kill(&r);
    kv_transfer_pool_free(src);
    kv_transfer_engine_free(eng);
    kvt_pool_release(&pd);
}

int main(int argc, char **argv) {
    int rc = kvt_receiver_main_if_requested(argc, argv);
    if (rc >= 0) return rc;
    if (argc != 3 || (strcmp(argv[1], "bytes") && strcmp(argv[1], "kill") &&
                      strcmp(argv[1], "bytes-shm") && strcmp(argv[1], "stall"))) {
        fprintf(stderr, "usage: %s bytes|bytes-shm|kill|stall TLS|default\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if (strcmp(argv[2], "default") != 0) setenv("UCX_TLS", argv[2], 1);
    fprintf(stderr, "scenario %s, UCX_TLS=%s\n", argv[1], getenv("UCX_TLS") ? getenv("UCX_TLS") : "(unset)");
    if (!strcmp(argv[1], "bytes-shm")) {
        /* Shared-memory puts: no peer error handling, UCX-allocated pool. */
        setenv("BATON_KVT_SHM", "1", 1);
        test_bytes();
    } else if (!strcmp(argv[1], "bytes")) test_bytes();
    else if (!strcmp(argv[1], "stall")) test_stall();
    else test_kill();
    return TEST_DONE();
}
