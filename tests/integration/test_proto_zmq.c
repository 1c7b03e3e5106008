/* proto ZeroMQ channels over real sockets, driven by a libevent loop:
 * - ROUTER + two DEALERs with worker-id identities, over tcp (ephemeral
 *   port) and ipc: registration, router replies addressed by identity,
 *   malformed payloads counted and dropped without stopping the receiver;
 * - a send to an unknown worker fails with BATON_ERR_NOT_FOUND;
 * - a DEALER reconnects to a ROUTER restarted on the same endpoint;
 * - PUB/SUB of KV events in order;
 * - the send high-water mark bounds the queue (BATON_ERR_BUSY);
 * - drain with a message budget returns BUSY and resumes. */
#include <event2/event.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "proto/zmq_channel.h"
#include "tests/test_util.h"

#define VOCAB 1000

static proto_chan_opts_t opts;

typedef struct side {
    proto_chan_t *chan;
    struct event *ev;
    const char *name;
    int n_register, n_heartbeat, n_resync, n_abort, n_events;
    uint64_t last_seq;
    bool seq_ok;
    char last_peer[64];
} side_t;

typedef struct world {
    struct event_base *base;
    side_t router, dealer[2], sub;
    int phase;
} world_t;

static world_t *W;

static void handle(void *arg, proto_chan_t *chan, const char *peer, proto_msg_t *msg) {
    side_t *s = arg;
    snprintf(s->last_peer, sizeof(s->last_peer), "%s", peer);
    switch (msg->type) {
    case PROTO_MSG_WORKER_REGISTER: {
        s->n_register++;
        CHECK(strcmp(peer, msg->u.worker_register.worker_id) == 0);
        /* Reply by identity from inside the drain. */
        proto_msg_t r = {.type = PROTO_MSG_KV_RESYNC};
        snprintf(r.u.kv_resync.worker_id, sizeof(r.u.kv_resync.worker_id), "%s", peer);
        r.u.kv_resync.epoch = msg->u.worker_register.epoch;
        r.u.kv_resync.last_seq = 41;
        CHECK_OK(proto_chan_send(chan, peer, &r));
        break;
    }
    case PROTO_MSG_WORKER_HEARTBEAT: s->n_heartbeat++; break;
    case PROTO_MSG_KV_RESYNC:
        s->n_resync++;
        CHECK_EQ_INT(msg->u.kv_resync.last_seq, 41);
        CHECK(strcmp(msg->u.kv_resync.worker_id, s->name) == 0);
        break;
    case PROTO_MSG_ABORT: s->n_abort++; break;
    case PROTO_MSG_KV_EVENT:
        if (s->n_events > 0 && msg->u.kv_event.seq != s->last_seq + 1) s->seq_ok = false;
        s->last_seq = msg->u.kv_event.seq;
        s->n_events++;
        break;
    default: CHECK_MSG(0, "unexpected message %d", msg->type);
    }
}

/* Edge-triggered ZMQ_FD: drain until nothing is left; on BUSY (budget hit)
 * re-activate the event so the loop comes back. */
static void on_readable(evutil_socket_t fd, short what, void *arg) {
    side_t *s = arg;
    uint32_t n = 0;
    baton_status_t st = proto_chan_drain(s->chan, handle, s, 4, &n);
    if (st == BATON_ERR_BUSY) event_active(s->ev, EV_READ, 0);
    else CHECK_OK(st);
}

static void watch(side_t *s, struct event_base *base) {
    s->ev = event_new(base, proto_chan_fd(s->chan), EV_READ | EV_PERSIST, on_readable, s);
    CHECK(s->ev != NULL);
    event_add(s->ev, NULL);
    /* A send done before the watch may already have consumed the edge. */
    if (proto_chan_readable(s->chan)) event_active(s->ev, EV_READ, 0);
}

static void unwatch(side_t *s) {
    if (s->ev) event_free(s->ev);
    s->ev = NULL;
}

/* Runs the loop until cond() holds or timeout_ms passes. */
static bool run_until(struct event_base *base, bool (*cond)(void), int timeout_ms) {
    for (int waited = 0; waited < timeout_ms; waited += 5) {
        if (cond()) return true;
        struct timeval tv = {0, 5000};
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
    }
    return cond();
}

static proto_msg_t make_register(const char *id, proto_role_t role) {
    static uint8_t rkey[24] = {1, 2, 3};
    static proto_pool_region_t region = {0x7f0000000000ull, 1 << 20, rkey, sizeof(rkey)};
    proto_msg_t m = {.type = PROTO_MSG_WORKER_REGISTER};
    proto_worker_register_t *r = &m.u.worker_register;
    snprintf(r->worker_id, sizeof(r->worker_id), "%s", id);
    r->role = role;
    r->epoch = 7;
    r->zmq_endpoint = "tcp://127.0.0.1:0";
    r->vocab_size = VOCAB;
    r->kv = (proto_kv_geometry_t){30, 3, 64, 16, PROTO_KV_DTYPE_F32, 1};
    r->pool = (proto_pool_desc_t){&region, 1, 128, 16 * 3 * 64 * 4};
    return m;
}

static proto_msg_t make_heartbeat(const char *id) {
    proto_msg_t m = {.type = PROTO_MSG_WORKER_HEARTBEAT};
    snprintf(m.u.worker_heartbeat.worker_id, sizeof(m.u.worker_heartbeat.worker_id), "%s", id);
    m.u.worker_heartbeat.epoch = 7;
    m.u.worker_heartbeat.total_blocks = 128;
    m.u.worker_heartbeat.free_blocks = 100;
    m.u.worker_heartbeat.batch_occupancy = 0.25f;
    return m;
}

static bool cond_registered(void) {
    return W->router.n_register == 2 && W->dealer[0].n_resync == 1 && W->dealer[1].n_resync == 1;
}
static bool cond_heartbeats(void) { return W->router.n_heartbeat >= 3; }
static bool cond_reconnected(void) { return W->router.n_heartbeat >= 1; }

static void test_router_dealer(void *zctx, const char *bind_ep) {
    world_t w;
    memset(&w, 0, sizeof(w));
    W = &w;
    w.base = event_base_new();
    w.router.name = "router";
    CHECK_OK(proto_chan_open(zctx, PROTO_CHAN_ROUTER, bind_ep, NULL, &opts, &w.router.chan));
    char ep[256];
    CHECK_OK(proto_chan_endpoint(w.router.chan, ep, sizeof(ep)));
    fprintf(stderr, "router bound at %s\n", ep);
    const char *ids[2] = {"prefill-0", "decode-0"};
    for (int i = 0; i < 2; i++) {
        w.dealer[i].name = ids[i];
        CHECK_OK(proto_chan_open(zctx, PROTO_CHAN_DEALER, ep, ids[i], &opts, &w.dealer[i].chan));
    }
    watch(&w.router, w.base);
    watch(&w.dealer[0], w.base);
    watch(&w.dealer[1], w.base);

    for (int i = 0; i < 2; i++) {
        proto_msg_t reg = make_register(ids[i], i ? PROTO_ROLE_DECODE : PROTO_ROLE_PREFILL);
        CHECK_OK(proto_chan_send(w.dealer[i].chan, NULL, &reg));
        if (proto_chan_readable(w.dealer[i].chan)) event_active(w.dealer[i].ev, EV_READ, 0);
    }
    CHECK_MSG(run_until(w.base, cond_registered, 10000), "registration: router saw %d, resyncs %d/%d",
              w.router.n_register, w.dealer[0].n_resync, w.dealer[1].n_resync);

    /* Malformed payloads: garbage, a truncated message, an unknown type and
     * a newer version; then a valid heartbeat still gets through. */
    proto_msg_t hb = make_heartbeat("decode-0");
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    CHECK_OK(proto_encode(&hb, &sb));
    CHECK_OK(proto_chan_send_raw(w.dealer[1].chan, NULL, "\x81\x01\x02", 3));
    CHECK_OK(proto_chan_send_raw(w.dealer[1].chan, NULL, sb.data, sb.size - 2));
    CHECK_OK(proto_chan_send_raw(w.dealer[1].chan, NULL, "\x82\xa4type\xa3zzz\xa1v\x01", 13));
    CHECK_OK(proto_chan_send_raw(w.dealer[1].chan, NULL, "\x82\xa4type\xa5" "abort\xa1v\x09", 15));
    for (int i = 0; i < 3; i++) CHECK_OK(proto_chan_send(w.dealer[1].chan, NULL, &hb));
    msgpack_sbuffer_destroy(&sb);
    CHECK_MSG(run_until(w.base, cond_heartbeats, 10000), "heartbeats: %d", w.router.n_heartbeat);
    const proto_stats_t *st = proto_chan_stats(w.router.chan);
    CHECK_EQ_INT(proto_stats_get(st, PROTO_MSG_UNKNOWN, BATON_ERR_FORMAT), 2);
    CHECK_EQ_INT(proto_stats_get(st, PROTO_MSG_UNKNOWN, BATON_ERR_UNSUPPORTED), 1);
    CHECK_EQ_INT(proto_stats_get(st, PROTO_MSG_ABORT, BATON_ERR_VERSION), 1);
    CHECK_EQ_INT(proto_stats_get(st, PROTO_MSG_WORKER_HEARTBEAT, BATON_OK), 3);
    CHECK_EQ_INT(proto_stats_get(st, PROTO_MSG_WORKER_REGISTER, BATON_OK), 2);
    CHECK_EQ_INT(proto_stats_errors(st), 4);
    CHECK(strcmp(w.router.last_peer, "decode-0") == 0);

    /* Unknown peer; SUB-only and bad-peer arguments. */
    proto_msg_t ab = {.type = PROTO_MSG_ABORT};
    ab.u.abort.reason = "client gone";
    CHECK_EQ_INT(proto_chan_send(w.router.chan, "no-such-worker", &ab), BATON_ERR_NOT_FOUND);
    CHECK_EQ_INT(proto_chan_send(w.router.chan, "bad id", &ab), BATON_ERR_INVALID_ARG);

    /* Restart the router on the same endpoint: the dealer reconnects on its
     * own and its heartbeats (sent periodically, as a worker does; one in
     * flight on the dying connection may be lost) reach the new router. */
    if (strncmp(ep, "tcp://", 6) == 0) {
        unwatch(&w.router);
        proto_chan_free(w.router.chan);
        w.router.chan = NULL;
        memset(&w.router, 0, sizeof(w.router));
        CHECK_OK(proto_chan_send(w.dealer[0].chan, NULL, &hb));
        usleep(50 * 1000);
        CHECK_OK(proto_chan_open(zctx, PROTO_CHAN_ROUTER, ep, NULL, &opts, &w.router.chan));
        watch(&w.router, w.base);
        bool ok = false;
        for (int i = 0; i < 500 && !ok; i++) {
            baton_status_t st = proto_chan_send(w.dealer[0].chan, NULL, &hb);
            CHECK(st == BATON_OK || st == BATON_ERR_BUSY);
            ok = run_until(w.base, cond_reconnected, 20);
        }
        CHECK_MSG(ok, "no heartbeat after reconnect");
        fprintf(stderr, "reconnect: %d heartbeat(s) at the restarted router\n",
                w.router.n_heartbeat);
    }

    for (int i = 0; i < 2; i++) {
        unwatch(&w.dealer[i]);
        proto_chan_free(w.dealer[i].chan);
    }
    unwatch(&w.router);
    proto_chan_free(w.router.chan);
    event_base_free(w.base);
}

static bool cond_first_event(void) { return W->sub.n_events > 0; }
static int pub_target;
static bool cond_all_events(void) { return W->sub.n_events >= pub_target; }

static void test_pub_sub(void *zctx, const char *bind_ep) {
    world_t w;
    memset(&w, 0, sizeof(w));
    W = &w;
    w.base = event_base_new();
    proto_chan_t *pub = NULL;
    CHECK_OK(proto_chan_open(zctx, PROTO_CHAN_PUB, bind_ep, "prefill-0", &opts, &pub));
    char ep[256];
    CHECK_OK(proto_chan_endpoint(pub, ep, sizeof(ep)));
    w.sub.seq_ok = true;
    CHECK_OK(proto_chan_open(zctx, PROTO_CHAN_SUB, ep, NULL, &opts, &w.sub.chan));
    watch(&w.sub, w.base);
    CHECK_EQ_INT(proto_chan_send(w.sub.chan, NULL, &(proto_msg_t){.type = PROTO_MSG_ABORT}),
                 BATON_ERR_INVALID_ARG);

    proto_block_hash_t removed[2] = {{{1}}, {{2}}};
    proto_kv_stored_t stored[1] = {{{{9}}, {{0}}, 16}};
    proto_msg_t ev = {.type = PROTO_MSG_KV_EVENT};
    snprintf(ev.u.kv_event.worker_id, sizeof(ev.u.kv_event.worker_id), "prefill-0");
    ev.u.kv_event.epoch = 3;
    ev.u.kv_event.stored = stored;
    ev.u.kv_event.n_stored = 1;
    ev.u.kv_event.removed = removed;
    ev.u.kv_event.n_removed = 2;
    /* Slow joiner: publish until the subscription is in place. */
    uint64_t seq = 0;
    for (int i = 0; i < 400 && !w.sub.n_events; i++) {
        ev.u.kv_event.seq = seq++;
        CHECK_OK(proto_chan_send(pub, NULL, &ev));
        run_until(w.base, cond_first_event, 5);
    }
    CHECK(w.sub.n_events > 0);
    int before = w.sub.n_events;
    for (int i = 0; i < 200; i++) {
        ev.u.kv_event.seq = seq++;
        CHECK_OK(proto_chan_send(pub, NULL, &ev));
    }
    pub_target = before + 200;
    CHECK_MSG(run_until(w.base, cond_all_events, 10000), "sub got %d of %d", w.sub.n_events,
              pub_target);
    CHECK(w.sub.seq_ok);
    CHECK_EQ_INT(w.sub.last_seq, seq - 1);
    CHECK(strcmp(w.sub.last_peer, "prefill-0") == 0);
    fprintf(stderr, "pub/sub over %s: %d events in order\n", ep, w.sub.n_events);
    unwatch(&w.sub);
    proto_chan_free(w.sub.chan);
    proto_chan_free(pub);
    event_base_free(w.base);
}

static void test_hwm_and_budget(void *zctx) {
    /* A dealer whose peer never answers: the queue is bounded by SNDHWM. */
    proto_chan_opts_t o = opts;
    o.sndhwm = 8;
    proto_chan_t *d = NULL;
    CHECK_OK(proto_chan_open(zctx, PROTO_CHAN_DEALER, "tcp://127.0.0.1:1", "lonely-0", &o, &d));
    proto_msg_t hb = make_heartbeat("lonely-0");
    int sent = 0;
    baton_status_t st = BATON_OK;
    while (sent < 10000 && (st = proto_chan_send(d, NULL, &hb)) == BATON_OK) sent++;
    CHECK_EQ_INT(st, BATON_ERR_BUSY);
    CHECK_MSG(sent <= 64, "sent %d messages with SNDHWM 8", sent);
    fprintf(stderr, "hwm: %d messages queued before BATON_ERR_BUSY\n", sent);
    proto_chan_free(d);

    /* Drain budget: 10 messages, budget 3 -> BUSY until all are read. */
    proto_chan_t *r = NULL, *d2 = NULL;
    CHECK_OK(proto_chan_open(zctx, PROTO_CHAN_ROUTER, "tcp://127.0.0.1:*", NULL, &opts, &r));
    char ep[256];
    CHECK_OK(proto_chan_endpoint(r, ep, sizeof(ep)));
    CHECK_OK(proto_chan_open(zctx, PROTO_CHAN_DEALER, ep, "worker-9", &opts, &d2));
    proto_msg_t hb9 = make_heartbeat("worker-9");
    for (int i = 0; i < 10; i++) CHECK_OK(proto_chan_send(d2, NULL, &hb9));
    side_t s;
    memset(&s, 0, sizeof(s));
    uint32_t total = 0, n = 0;
    int busy = 0;
    for (int tries = 0; tries < 2000 && total < 10; tries++) {
        zmq_pollitem_t pi = {proto_chan_socket(r), 0, ZMQ_POLLIN, 0};
        zmq_poll(&pi, 1, 10);
        st = proto_chan_drain(r, handle, &s, 3, &n);
        CHECK(n <= 3);
        busy += st == BATON_ERR_BUSY;
        total += n;
    }
    CHECK_EQ_INT(total, 10);
    CHECK_EQ_INT(s.n_heartbeat, 10);
    CHECK(busy >= 1);
    proto_chan_free(d2);
    proto_chan_free(r);

    /* Bad arguments to open. */
    proto_chan_t *x = NULL;
    CHECK_EQ_INT(proto_chan_open(zctx, PROTO_CHAN_DEALER, ep, "has space", &opts, &x),
                 BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(proto_chan_open(zctx, PROTO_CHAN_DEALER, ep, NULL, &opts, &x),
                 BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(proto_chan_open(zctx, PROTO_CHAN_ROUTER, "nonsense://x", NULL, &opts, &x),
                 BATON_ERR_IO);
    CHECK(x == NULL);
    proto_chan_free(NULL);
}

int main(void) {
    proto_chan_opts_default(VOCAB, &opts);
    void *zctx = zmq_ctx_new();
    CHECK(zctx != NULL);
    char ipc[128];
    test_router_dealer(zctx, "tcp://127.0.0.1:*");
    snprintf(ipc, sizeof(ipc), "ipc:///tmp/baton-proto-test-%d.ipc", (int)getpid());
    test_router_dealer(zctx, ipc);
    unlink(ipc + strlen("ipc://"));
    test_pub_sub(zctx, "tcp://127.0.0.1:*");
    snprintf(ipc, sizeof(ipc), "ipc:///tmp/baton-proto-test-pub-%d.ipc", (int)getpid());
    test_pub_sub(zctx, ipc);
    unlink(ipc + strlen("ipc://"));
    test_hwm_and_budget(zctx);
    zmq_ctx_term(zctx);
    return TEST_DONE();
}
