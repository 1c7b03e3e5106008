/* Single-process tests of common/kv_transfer: descriptor framing and its
 * rejection of malformed input, argument checks, run coalescing, and
 * transfers between two engines (two UCX workers) of this process, including
 * transfers abandoned or cancelled in flight. The two-process tests are in
 * tests/integration/test_kv_transfer.c. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/kv_transfer.h"
#include "common/status.h"
#include "tests/test_util.h"

#define NL 3
#define NB_SRC 8
#define NB_DST 12
#define BB 256

static void fill(uint8_t *p, size_t n, uint32_t seed) {
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = (uint8_t)(s >> 24);
    }
}

typedef struct {
    int calls;
    baton_status_t st;
    int free_in_cb;
} rec_t;

static void on_done(kv_transfer_t *x, baton_status_t st, void *arg) {
    rec_t *r = arg;
    r->calls++;
    r->st = st;
    if (r->free_in_cb) kv_transfer_free(x);
}

/* The decode-side engine owning the destination pool; progressed together
 * with the sender's (UCX may emulate RMA with active messages, which the
 * target must progress). */
static kv_transfer_engine_t *recv_eng;

static void pump(kv_transfer_engine_t *eng) {
    kv_transfer_engine_wait(eng, 5);
    kv_transfer_engine_progress(recv_eng);
}

static void wait_calls(kv_transfer_engine_t *eng, rec_t *r) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < 4000 && r->calls == 0; i++) pump(eng);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double d = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
    if (d > 0.5) fprintf(stderr, "slow completion: %.3f s (calls %d)\n", d, r->calls);
}

static uint8_t k_src[NL * NB_SRC * BB], v_src[NL * NB_SRC * BB];
static uint8_t k_dst[NL * NB_DST * BB], v_dst[NL * NB_DST * BB];

static void test_descriptor(kv_transfer_engine_t *eng, kv_transfer_pool_t *dst) {
    void *buf = NULL;
    size_t len = 0;
    CHECK_OK(kv_transfer_pool_pack(dst, &buf, &len));
    kv_transfer_remote_info_t info;
    CHECK_OK(kv_transfer_descriptor_parse(buf, len, &info));
    CHECK_EQ_INT(info.n_layers, NL);
    CHECK_EQ_INT(info.n_blocks, NB_DST);
    CHECK_EQ_INT(info.block_bytes, BB);
    CHECK(info.k_addr == (uint64_t)(uintptr_t)k_dst);
    CHECK(info.v_addr == (uint64_t)(uintptr_t)v_dst);
    CHECK(memcmp(buf, "BKVT", 4) == 0);

    /* Every truncation and one extra byte are format errors. */
    uint8_t *m = malloc(len + 1);
    memcpy(m, buf, len);
    m[len] = 0;
    int ok = 1;
    for (size_t l = 0; l < len; l++)
        if (kv_transfer_descriptor_parse(m, l, &info) != BATON_ERR_FORMAT) ok = 0;
    CHECK_MSG(ok, "a truncated descriptor was accepted");
    CHECK_EQ_INT(kv_transfer_descriptor_parse(m, len + 1, &info), BATON_ERR_FORMAT);
    CHECK_EQ_INT(kv_transfer_descriptor_parse(NULL, len, &info), BATON_ERR_FORMAT);
    /* Bad magic, newer version, zero layers, huge rkey length. */
    m[0] = 'X';
    CHECK_EQ_INT(kv_transfer_descriptor_parse(m, len, &info), BATON_ERR_FORMAT);
    m[0] = 'B';
    m[4] = 2;
    CHECK_EQ_INT(kv_transfer_descriptor_parse(m, len, &info), BATON_ERR_VERSION);
    m[4] = 1;
    memset(m + 8, 0, 4);
    CHECK_EQ_INT(kv_transfer_descriptor_parse(m, len, &info), BATON_ERR_FORMAT);
    memcpy(m, buf, len);
    memset(m + 44, 0xff, 4);
    CHECK_EQ_INT(kv_transfer_descriptor_parse(m, len, &info), BATON_ERR_FORMAT);
    /* A flipped bit in the opaque UCX part (worker address, rkeys) is
     * caught by the checksum before UCX reads it. */
    memcpy(m, buf, len);
    m[len - 1] ^= 0x10;
    CHECK_EQ_INT(kv_transfer_descriptor_parse(m, len, &info), BATON_ERR_FORMAT);
    m[len - 1] ^= 0x10;
    m[60] ^= 0x01;
    CHECK_EQ_INT(kv_transfer_descriptor_parse(m, len, &info), BATON_ERR_FORMAT);
    /* connect refuses the same garbage without creating anything. */
    kv_transfer_peer_t *peer = NULL;
    CHECK_EQ_INT(kv_transfer_peer_connect(eng, m, len, &peer), BATON_ERR_FORMAT);
    CHECK(peer == NULL);
    CHECK_EQ_INT(kv_transfer_peer_connect(eng, m, 10, &peer), BATON_ERR_FORMAT);
    free(m);
    free(buf);
}

static void test_loopback(kv_transfer_engine_t *eng, kv_transfer_pool_t *src,
                          kv_transfer_pool_t *dst) {
    void *desc = NULL;
    size_t desc_len = 0;
    CHECK_OK(kv_transfer_pool_pack(dst, &desc, &desc_len));
    kv_transfer_peer_t *peer = NULL;
    CHECK_OK(kv_transfer_peer_connect(eng, desc, desc_len, &peer));
    free(desc);
    if (!peer) return;
    CHECK_EQ_INT(kv_transfer_peer_status(peer), BATON_OK);

    /* Runs: 0-2 -> 5-7 (one put), 4 -> 9, 3 -> 2, 6 -> 10, 7 -> 0:
     * 6,7 are consecutive in src but 10,0 are not in dst: 5 runs. */
    const kv_transfer_block_pair_t pairs[] = {{0, 5}, {1, 6}, {2, 7}, {4, 9}, {3, 2}, {6, 10}, {7, 0}};
    const size_t n = sizeof(pairs) / sizeof(pairs[0]);
    rec_t rec = {0};
    kv_transfer_t *x = NULL;
    CHECK_OK(kv_transfer_begin(peer, src, 5000, on_done, &rec, &x));
    if (!x) return;
    /* Range checks issue nothing. */
    const kv_transfer_block_pair_t bad_src[] = {{0, 1}, {NB_SRC, 2}};
    const kv_transfer_block_pair_t bad_dst[] = {{0, 1}, {1, NB_DST}};
    const kv_transfer_block_pair_t neg[] = {{-1, 1}};
    CHECK_EQ_INT(kv_transfer_send_layer(x, NL, pairs, n), BATON_ERR_OUT_OF_RANGE);
    CHECK_EQ_INT(kv_transfer_send_layer(x, -1, pairs, n), BATON_ERR_OUT_OF_RANGE);
    CHECK_EQ_INT(kv_transfer_send_layer(x, 0, bad_src, 2), BATON_ERR_OUT_OF_RANGE);
    CHECK_EQ_INT(kv_transfer_send_layer(x, 0, bad_dst, 2), BATON_ERR_OUT_OF_RANGE);
    CHECK_EQ_INT(kv_transfer_send_layer(x, 0, neg, 1), BATON_ERR_OUT_OF_RANGE);
    CHECK_EQ_INT(kv_transfer_n_puts(x), 0);
    CHECK_EQ_INT(kv_transfer_get_state(x), KV_TRANSFER_STATE_ACTIVE);

    /* Layers out of order, as a chunked prefill might finish them. */
    const int32_t order[NL] = {2, 0, 1};
    for (int i = 0; i < NL; i++) CHECK_OK(kv_transfer_send_layer(x, order[i], pairs, n));
    CHECK_EQ_INT(kv_transfer_n_puts(x), 2 * NL * 5);
    CHECK_EQ_INT(kv_transfer_bytes(x), 2ull * NL * n * BB);
    CHECK_OK(kv_transfer_flush(x));
    wait_calls(eng, &rec);
    CHECK_EQ_INT(rec.calls, 1);
    CHECK_EQ_INT(rec.st, BATON_OK);
    CHECK_EQ_INT(kv_transfer_get_state(x), KV_TRANSFER_STATE_DONE);
    kv_transfer_free(x);

    /* Expected pool, computed block by block from the table. */
    static uint8_t k_want[sizeof(k_dst)], v_want[sizeof(v_dst)];
    fill(k_want, sizeof(k_want), 3);
    fill(v_want, sizeof(v_want), 4);
    for (int l = 0; l < NL; l++)
        for (size_t i = 0; i < n; i++) {
            memcpy(k_want + ((size_t)l * NB_DST + pairs[i].dst_block) * BB,
                   k_src + ((size_t)l * NB_SRC + pairs[i].src_block) * BB, BB);
            memcpy(v_want + ((size_t)l * NB_DST + pairs[i].dst_block) * BB,
                   v_src + ((size_t)l * NB_SRC + pairs[i].src_block) * BB, BB);
        }
    CHECK(memcmp(k_dst, k_want, sizeof(k_dst)) == 0);
    CHECK(memcmp(v_dst, v_want, sizeof(v_dst)) == 0);

    /* A transfer freed from its own callback. */
    rec_t rec2 = {.free_in_cb = 1};
    CHECK_OK(kv_transfer_begin(peer, src, 5000, on_done, &rec2, &x));
    CHECK_OK(kv_transfer_send_layer(x, 1, pairs, 1));
    CHECK_OK(kv_transfer_flush(x));
    wait_calls(eng, &rec2);
    CHECK_EQ_INT(rec2.calls, 1);
    CHECK_EQ_INT(rec2.st, BATON_OK);

    /* A transfer abandoned before flush: no callback, nothing leaks. */
    rec_t rec3 = {0};
    CHECK_OK(kv_transfer_begin(peer, src, 5000, on_done, &rec3, &x));
    CHECK_OK(kv_transfer_send_layer(x, 0, pairs, n));
    kv_transfer_free(x);
    for (int i = 0; i < 5; i++) pump(eng);
    CHECK_EQ_INT(rec3.calls, 0);

    /* Empty transfer: flush alone completes. */
    rec_t rec4 = {0};
    CHECK_OK(kv_transfer_begin(peer, src, 5000, on_done, &rec4, &x));
    CHECK_OK(kv_transfer_send_layer(x, 0, pairs, 0));
    CHECK_OK(kv_transfer_flush(x));
    wait_calls(eng, &rec4);
    CHECK_EQ_INT(rec4.st, BATON_OK);
    kv_transfer_free(x);

    /* Freeing the peer cancels its active transfers (callback runs). */
    rec_t rec5 = {0};
    CHECK_OK(kv_transfer_begin(peer, src, 5000, on_done, &rec5, &x));
    CHECK_OK(kv_transfer_send_layer(x, 2, pairs, n));
    kv_transfer_peer_free(peer);
    CHECK_EQ_INT(rec5.calls, 1);
    CHECK_EQ_INT(rec5.st, BATON_ERR_CANCELLED);
    CHECK_EQ_INT(kv_transfer_get_state(x), KV_TRANSFER_STATE_FAILED);
    CHECK_EQ_INT(kv_transfer_send_layer(x, 0, pairs, n), BATON_ERR_CANCELLED);
    CHECK_EQ_INT(kv_transfer_flush(x), BATON_ERR_CANCELLED);
    kv_transfer_free(x);
}

static void test_args(kv_transfer_engine_t *eng, kv_transfer_pool_t *src) {
    kv_transfer_pool_t *p = NULL;
    kv_transfer_pool_desc_t d = {.k_base = k_src, .v_base = v_src, .n_layers = NL,
                                 .n_blocks = NB_SRC, .block_bytes = BB};
    d.n_layers = 0;
    CHECK_EQ_INT(kv_transfer_pool_register(eng, &d, &p), BATON_ERR_INVALID_ARG);
    d.n_layers = NL;
    d.v_base = NULL;
    CHECK_EQ_INT(kv_transfer_pool_register(eng, &d, &p), BATON_ERR_INVALID_ARG);
    d.v_base = v_src;
    d.block_bytes = UINT64_MAX / 2;
    CHECK_EQ_INT(kv_transfer_pool_register(eng, &d, &p), BATON_ERR_INVALID_ARG);
    CHECK(p == NULL);

    /* Geometry mismatch: a pool of other block_bytes cannot feed the peer. */
    kv_transfer_pool_desc_t od = {.k_base = k_dst, .v_base = v_dst, .n_layers = NL,
                                  .n_blocks = NB_DST / 2, .block_bytes = BB * 2};
    kv_transfer_pool_t *other = NULL;
    CHECK_OK(kv_transfer_pool_register(recv_eng, &od, &other));
    void *desc = NULL;
    size_t len = 0;
    CHECK_OK(kv_transfer_pool_pack(other, &desc, &len));
    kv_transfer_peer_t *peer = NULL;
    CHECK_OK(kv_transfer_peer_connect(eng, desc, len, &peer));
    kv_transfer_t *x = NULL;
    CHECK_EQ_INT(kv_transfer_begin(peer, src, 0, NULL, NULL, &x), BATON_ERR_INVALID_ARG);
    CHECK(x == NULL);
    kv_transfer_peer_free(peer);
    kv_transfer_pool_free(other);
    free(desc);

    /* NULL-safe frees. */
    kv_transfer_free(NULL);
    kv_transfer_peer_free(NULL);
    kv_transfer_pool_free(NULL);
    kv_transfer_engine_free(NULL);
}

int main(void) {
    fill(k_src, sizeof(k_src), 1);
    fill(v_src, sizeof(v_src), 2);
    fill(k_dst, sizeof(k_dst), 3);
    fill(v_dst, sizeof(v_dst), 4);
    kv_transfer_engine_t *eng = NULL;
    CHECK_OK(kv_transfer_engine_init(NULL, &eng));
    CHECK_OK(kv_transfer_engine_init(NULL, &recv_eng));
    if (!eng || !recv_eng) return TEST_DONE();
    CHECK(kv_transfer_engine_event_fd(eng) >= 0);
    kv_transfer_pool_desc_t sd = {.k_base = k_src, .v_base = v_src, .n_layers = NL,
                                  .n_blocks = NB_SRC, .block_bytes = BB};
    kv_transfer_pool_desc_t dd = {.k_base = k_dst, .v_base = v_dst, .n_layers = NL,
                                  .n_blocks = NB_DST, .block_bytes = BB};
    kv_transfer_pool_t *src = NULL, *dst = NULL;
    CHECK_OK(kv_transfer_pool_register(eng, &sd, &src));
    CHECK_OK(kv_transfer_pool_register(recv_eng, &dd, &dst));
    if (src && dst) {
        test_descriptor(eng, dst);
        test_loopback(eng, src, dst);
        test_args(eng, src);
    }
    for (int i = 0; i < 5; i++) pump(eng); /* let endpoint closes finish */
    kv_transfer_pool_free(src);
    kv_transfer_pool_free(dst);
    kv_transfer_engine_free(eng);
    kv_transfer_engine_free(recv_eng);
    return TEST_DONE();
}
