/* baton-decode as a real process on loopback, with the tiny model
 * (tests/data/tiny_llama.gguf). This test plays the router (a ROUTER the
 * worker's DEALER connects to) and the prefill worker (a ROUTER that gets
 * the worker's KVDestination, and a DEALER with the prefill worker's id
 * that sends PrefillDone to the worker's peer ROUTER), and moves the
 * prompt's KV into the worker's pool over real UCX from its own registered
 * pool.
 *
 * Checks:
 * - WorkerRegister: role, geometry of the model, SHA-256 equal to
 *   `sha256sum` of the file, hash_seed_id = XXH3-64 of the seed's LE bytes,
 *   ucx_address = a kv_transfer_pool_pack descriptor the prefill side
 *   connects with (regions repeat its bases);
 * - a greedy request streamed back in TokenChunks equals an independent
 *   single-sequence loop over the same model (KV computed here, put over
 *   UCX into the blocks of the KVDestination);
 * - a request that can never fit gets RequestFinished{error} at once;
 * - a garbage payload is dropped, the worker keeps serving;
 * - an aborted request releases its blocks (heartbeat used_blocks back to 0);
 * - SIGTERM: exit status 0. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>
#include <zmq.h>

#include "common/kv_pool.h"
#include "common/kv_transfer.h"
#include "common/model.h"
#include "kernels/backend.h"
#include "proto/messages.h"
#include "proto/zmq_channel.h"
#include "tests/test_util.h"

#define WID "dtest-1"
#define PID_PREFILL "ptest-1"
#define MAXM 256

static proto_msg_t g_msgs[MAXM];
static char g_peer[MAXM][64];
static int g_n;

static void keep(void *arg, proto_chan_t *chan, const char *peer, proto_msg_t *msg) {
    if (g_n < MAXM) {
        g_msgs[g_n] = *msg;
        snprintf(g_peer[g_n], 64, "%s", peer);
        g_n++;
        memset(msg, 0, sizeof(*msg));
    }
}

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Pumps both channels until a message of `type` (matching `id` if given)
 * arrives; returns its index or -1 after timeout_ms. Scans from `from`. */
static int wait_msg(proto_chan_t *a, proto_chan_t *b, proto_msg_type_t type, const uint8_t *id,
                    int from, int timeout_ms) {
    uint64_t end = now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        proto_chan_drain(a, keep, NULL, 0, NULL);
        proto_chan_drain(b, keep, NULL, 0, NULL);
        for (int i = from; i < g_n; i++) {
            if (g_msgs[i].type != type) continue;
            if (!id) return i;
            const uint8_t *mid = type == PROTO_MSG_REQUEST_FINISHED ? g_msgs[i].u.request_finished.request_id.bytes
                                 : type == PROTO_MSG_KV_DESTINATION ? g_msgs[i].u.kv_destination.request_id.bytes
                                                                    : NULL;
            if (mid && memcmp(mid, id, 16) == 0) return i;
        }
        if (now_ms() > end) return -1;
        usleep(2000);
    }
}

static void data_path(char *buf, size_t n, const char *name) {
    const char *src = getenv("BATON_SOURCE_DIR");
    snprintf(buf, n, "%s/tests/data/%s", src ? src : ".", name);
}

static int32_t argmax(const float *row, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (row[i] > row[b]) b = i;
    return b;
}

static proto_msg_t decode_request(const uint8_t tag, const uint32_t *prompt, uint32_t n,
                                  uint32_t max_tokens, const char *prefill_ep) {
    proto_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = PROTO_MSG_DECODE_REQUEST;
    proto_decode_request_t *q = &m.u.decode_request;
    q->request_id.bytes[0] = tag;
    q->request_id.bytes[15] = 0x5a;
    snprintf(q->prefill_worker_id, sizeof(q->prefill_worker_id), "%s", PID_PREFILL);
    q->n_prompt_tokens = n;
    q->n_blocks = (n + 15) / 16;
    q->token_ids = (uint32_t *)prompt;
    q->n_token_ids = n;
    q->sampling.temperature = 0;
    q->sampling.top_p = 1;
    q->sampling.repetition_penalty = 1;
    q->sampling.max_tokens = max_tokens;
    q->sampling.ignore_eos = true;
    q->tenant = "t";
    q->prefill_endpoint = (char *)prefill_ep;
    return m;
}

static void xfer_done(kv_transfer_t *x, baton_status_t st, void *arg) { *(int *)arg = st == BATON_OK ? 1 : -1; }

int main(void) {
    char model_path[1024], bin[1024], cmd[1200];
    data_path(model_path, sizeof(model_path), "tiny_llama.gguf");
    const char *bdir = getenv("BATON_BINARY_DIR");
    snprintf(bin, sizeof(bin), "%s/decode_worker/baton-decode", bdir ? bdir : ".");

    /* independent hash of the model file */
    char want_sha[65] = "";
    snprintf(cmd, sizeof(cmd), "sha256sum '%s'", model_path);
    FILE *pf = popen(cmd, "r");
    CHECK(pf && fscanf(pf, "%64s", want_sha) == 1);
    if (pf) pclose(pf);

    void *zctx = zmq_ctx_new();
    proto_chan_opts_t o;
    proto_chan_opts_default(272, &o);
    proto_chan_t *router = NULL, *prefill = NULL;
    CHECK_OK(proto_chan_open(zctx, PROTO_CHAN_ROUTER, "tcp://127.0.0.1:*", NULL, &o, &router));
    CHECK_OK(proto_chan_open(zctx, PROTO_CHAN_ROUTER, "tcp://127.0.0.1:*", NULL, &o, &prefill));
    char rep[128], pep[128];
    CHECK_OK(proto_chan_endpoint(router, rep, sizeof(rep)));
    CHECK_OK(proto_chan_endpoint(prefill, pep, sizeof(pep)));

    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a crashed test */
        execl(bin, bin, "--router", rep, "--model", model_path, "--worker-id", WID, "--threads", "1",
              "--kv-blocks", "12", "--block-size", "16", "--heartbeat-ms", "50", "--hash-seed",
              "0x1234", (char *)NULL);
        _exit(127);
    }
    int ir = wait_msg(router, prefill, PROTO_MSG_WORKER_REGISTER, NULL, 0, 20000);
    CHECK(ir >= 0);
    if (ir < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return TEST_DONE();
    }
    proto_worker_register_t *reg = &g_msgs[ir].u.worker_register;
    CHECK(strcmp(g_peer[ir], WID) == 0);
    CHECK_EQ_INT(reg->role, PROTO_ROLE_DECODE);
    CHECK_EQ_INT(reg->kv.n_layers, 2);
    CHECK_EQ_INT(reg->kv.n_kv_heads, 2);
    CHECK_EQ_INT(reg->kv.head_dim, 16);
    CHECK_EQ_INT(reg->kv.block_size, 16);
    CHECK_EQ_INT(reg->vocab_size, 272);
    uint8_t seed_le[8] = {0x34, 0x12, 0, 0, 0, 0, 0, 0};
    CHECK(reg->kv.hash_seed_id == XXH3_64bits(seed_le, 8));
    char got_sha[65];
    for (int i = 0; i < 32; i++) snprintf(got_sha + 2 * i, 3, "%02x", reg->model_sha256[i]);
    CHECK_MSG(strcmp(got_sha, want_sha) == 0, "sha256 %s vs sha256sum %s", got_sha, want_sha);
    CHECK_EQ_INT(reg->pool.n_regions, 2);
    CHECK_EQ_INT(reg->pool.n_blocks, 12);
    CHECK_EQ_INT(reg->pool.block_bytes, 16 * 2 * 16 * 4);
    CHECK(reg->ucx_address_len > 0);
    CHECK(reg->zmq_endpoint && strncmp(reg->zmq_endpoint, "tcp://127.0.0.1:", 16) == 0);

    /* local "prefill worker": model, pool registered with UCX, peer */
    backend_t *be = NULL;
    model_t *m = NULL;
    kv_pool_t *pool = NULL;
    kv_transfer_engine_t *eng = NULL;
    kv_transfer_pool_t *xp = NULL;
    kv_transfer_peer_t *peer = NULL;
    CHECK_OK(backend_cpu_create(1, &be));
    CHECK_OK(model_load(model_path, be, NULL, &m));
    backend_kv_geom_t g = model_kv_geom(m, 8, 16);
    CHECK_OK(kv_pool_init(be, &g, &pool));
    CHECK_OK(kv_transfer_engine_init(NULL, &eng));
    kv_transfer_pool_desc_t pd = {kv_pool_k_base(pool), kv_pool_v_base(pool), g.n_layers, g.n_blocks,
                                  kv_pool_block_bytes(pool)};
    CHECK_OK(kv_transfer_pool_register(eng, &pd, &xp));
    /* ucx_address is the packed pool descriptor; the regions repeat it */
    kv_transfer_remote_info_t ri;
    CHECK_OK(kv_transfer_descriptor_parse(reg->ucx_address, reg->ucx_address_len, &ri));
    CHECK(reg->pool.n_regions == 2 && reg->pool.regions[0].base_addr == ri.k_addr &&
          reg->pool.regions[1].base_addr == ri.v_addr);
    CHECK(reg->pool.n_regions == 2 && reg->pool.regions[0].length_bytes == 2ull * 12 * 2048);
    CHECK_OK(kv_transfer_peer_connect(eng, reg->ucx_address, reg->ucx_address_len, &peer));

    /* never fits: 12 blocks * 16 = 192 slots > context 96 anyway: use max_tokens */
    uint32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = (uint32_t)(3 + (i * 37 + 11) % 260);
    proto_msg_t big = decode_request(9, prompt, 40, 57, pep); /* 97 > 96 */
    CHECK_OK(proto_chan_send(router, WID, &big));
    int ib = wait_msg(router, prefill, PROTO_MSG_REQUEST_FINISHED, big.u.decode_request.request_id.bytes, 0, 5000);
    CHECK(ib >= 0);
    if (ib >= 0) {
        CHECK_EQ_INT(g_msgs[ib].u.request_finished.finish_reason, PROTO_FINISH_ERROR);
        CHECK_EQ_INT(g_msgs[ib].u.request_finished.status, BATON_ERR_NO_SPACE);
    }
    /* garbage is dropped */
    CHECK_OK(proto_chan_send_raw(router, WID, "\x93\x01\x02", 3));

    /* the real request: 40 prompt tokens, 20 generated */
    const uint32_t N_GEN = 20;
    proto_msg_t dq = decode_request(1, prompt, 40, N_GEN, pep);
    const uint8_t *rid = dq.u.decode_request.request_id.bytes;
    CHECK_OK(proto_chan_send(router, WID, &dq));
    int idst = wait_msg(router, prefill, PROTO_MSG_KV_DESTINATION, rid, 0, 5000);
    CHECK(idst >= 0);
    int32_t ref[64];
    int first_chunk_msg = g_n;
    if (idst >= 0) {
        proto_kv_destination_t *d = &g_msgs[idst].u.kv_destination;
        CHECK(strcmp(g_peer[idst], WID) == 0);
        CHECK_EQ_INT(d->n_block_ids, 3);
        CHECK_EQ_INT(d->pool.n_regions, 2);
        CHECK_EQ_INT(d->ucx_address_len, reg->ucx_address_len);
        /* prefill into local blocks 0..2, then a reference decode in blocks 0..3 */
        model_kv_t kv = {g, kv_pool_k_base(pool), kv_pool_v_base(pool)};
        int32_t bt[4] = {0, 1, 2, 3}, toks[40];
        for (int i = 0; i < 40; i++) toks[i] = (int32_t)prompt[i];
        float *logits = malloc(sizeof(float) * 272);
        model_seq_t ms = {toks, 40, 0, bt, 4, MODEL_LOGITS_LAST};
        model_batch_t b = {&ms, 1};
        CHECK_OK(model_forward(m, &kv, &b, logits));
        ref[0] = argmax(logits, 272);
        float first_lp = 0;
        /* send the prompt's 3 blocks, every layer, before decoding further here */
        int done = 0;
        kv_transfer_t *x = NULL;
        CHECK_OK(kv_transfer_begin(peer, xp, 5000, xfer_done, &done, &x));
        kv_transfer_block_pair_t pairs[3];
        for (int j = 0; j < 3; j++) pairs[j] = (kv_transfer_block_pair_t){j, (int32_t)d->block_ids[j]};
        for (int l = 0; l < g.n_layers; l++) CHECK_OK(kv_transfer_send_layer(x, l, pairs, 3));
        CHECK_OK(kv_transfer_flush(x));
        for (int i = 0; i < 500 && !done; i++) kv_transfer_engine_wait(eng, 10);
        CHECK_EQ_INT(done, 1);
        kv_transfer_free(x);
        /* reference continuation */
        for (uint32_t k = 1; k < N_GEN; k++) {
            model_seq_t s1 = {&ref[k - 1], 1, 40 + (int32_t)k - 1, bt, 4, MODEL_LOGITS_LAST};
            model_batch_t b1 = {&s1, 1};
            CHECK_OK(model_forward(m, &kv, &b1, logits));
            ref[k] = argmax(logits, 272);
        }
        free(logits);
        proto_msg_t pdm;
        memset(&pdm, 0, sizeof(pdm));
        pdm.type = PROTO_MSG_PREFILL_DONE;
        proto_prefill_done_t *p = &pdm.u.prefill_done;
        memcpy(p->request_id.bytes, rid, 16);
        snprintf(p->prefill_worker_id, sizeof(p->prefill_worker_id), "%s", PID_PREFILL);
        p->error = "";
        p->first_token = (uint32_t)ref[0];
        p->first_logprob = first_lp;
        p->n_blocks_written = 3;
        p->bytes_written = 3 * 2 * 2 * 2048;
        p->compute_us = 7;
        /* P -> D over the worker's peer ROUTER: a DEALER with the prefill id */
        proto_chan_t *pd_chan = NULL;
        CHECK_OK(proto_chan_open(zctx, PROTO_CHAN_DEALER, reg->zmq_endpoint, PID_PREFILL, &o, &pd_chan));
        CHECK_OK(proto_chan_send(pd_chan, NULL, &pdm));
        int ifin = wait_msg(router, prefill, PROTO_MSG_REQUEST_FINISHED, rid, first_chunk_msg, 10000);
        CHECK(ifin >= 0);
        int32_t got[64];
        int n_got = 0, n_chunks = 0;
        for (int i = first_chunk_msg; i < g_n; i++) {
            if (g_msgs[i].type != PROTO_MSG_TOKEN_CHUNK) continue;
            n_chunks++;
            proto_token_chunk_t *c = &g_msgs[i].u.token_chunk;
            for (uint32_t e = 0; e < c->n_entries; e++)
                if (memcmp(c->entries[e].request_id.bytes, rid, 16) == 0)
                    for (uint32_t t = 0; t < c->entries[e].n_token_ids && n_got < 64; t++)
                        got[n_got++] = (int32_t)c->entries[e].token_ids[t];
        }
        CHECK_EQ_INT(n_got, N_GEN);
        CHECK_EQ_INT(n_chunks, N_GEN - 1); /* the first token rides with the second */
        CHECK(n_got == (int)N_GEN && memcmp(got, ref, sizeof(int32_t) * N_GEN) == 0);
        if (ifin >= 0) {
            proto_request_finished_t *f = &g_msgs[ifin].u.request_finished;
            CHECK_EQ_INT(f->finish_reason, PROTO_FINISH_LENGTH);
            CHECK_EQ_INT(f->completion_tokens, N_GEN);
            CHECK_EQ_INT(f->prompt_tokens, 40);
            CHECK_EQ_INT(f->timings.prefill_us, 7);
            CHECK_EQ_INT(f->timings.transfer_bytes, 3 * 2 * 2 * 2048);
        }
        proto_chan_free(pd_chan);
    }

    /* abort while waiting for the prefill: blocks come back */
    proto_msg_t aq = decode_request(2, prompt, 20, 10, pep);
    CHECK_OK(proto_chan_send(router, WID, &aq));
    CHECK(wait_msg(router, prefill, PROTO_MSG_KV_DESTINATION, aq.u.decode_request.request_id.bytes, 0, 5000) >= 0);
    proto_msg_t ab;
    memset(&ab, 0, sizeof(ab));
    ab.type = PROTO_MSG_ABORT;
    ab.u.abort.request_id = aq.u.decode_request.request_id;
    ab.u.abort.reason = "client gone";
    CHECK_OK(proto_chan_send(router, WID, &ab));
    int ia = wait_msg(router, prefill, PROTO_MSG_REQUEST_FINISHED, aq.u.decode_request.request_id.bytes, 0, 5000);
    CHECK(ia >= 0);
    if (ia >= 0) CHECK_EQ_INT(g_msgs[ia].u.request_finished.finish_reason, PROTO_FINISH_ABORT);
    int from = g_n, idle = 0;
    for (int tries = 0; tries < 20 && !idle; tries++) {
        int ih = wait_msg(router, prefill, PROTO_MSG_WORKER_HEARTBEAT, NULL, from, 2000);
        if (ih < 0) break;
        from = ih + 1;
        idle = g_msgs[ih].u.worker_heartbeat.used_blocks == 0 &&
               g_msgs[ih].u.worker_heartbeat.free_blocks == 12;
    }
    CHECK(idle);

    /* clean shutdown */
    kill(pid, SIGTERM);
    int status = -1;
    for (int i = 0; i < 500; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid) break;
        usleep(10000);
    }
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "worker exit status %d", status);
    if (!WIFEXITED(status)) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }

    for (int i = 0; i < g_n; i++) proto_msg_free(&g_msgs[i]);
    kv_transfer_peer_free(peer);
    kv_transfer_pool_free(xp);
    kv_transfer_engine_free(eng);
    kv_pool_free(pool);
    model_free(m);
    backend_free(be);
    proto_chan_free(router);
    proto_chan_free(prefill);
    zmq_ctx_term(zctx);
    return TEST_DONE();
}
