/* proto/zmq_channel.c: ZeroMQ sockets for proto messages (see the header for
 * the frame layout and the edge-triggered ZMQ_FD contract). */
#include "proto/zmq_channel.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "common/log.h"

struct proto_chan {
    void *sock;
    proto_chan_kind_t kind;
    char identity[PROTO_WORKER_ID_MAX + 1]; /* DEALER identity / PUB topic */
    proto_chan_opts_t opts;
    proto_stats_t stats;
};

void proto_chan_opts_default(uint32_t vocab_size, proto_chan_opts_t *out) {
    if (!out) return;
    memset(out, 0, sizeof(*out));
    out->sndhwm = 10000;
    out->rcvhwm = 10000;
    out->linger_ms = 500;
    out->reconnect_ivl_ms = 100;
    out->reconnect_ivl_max_ms = 5000;
    out->heartbeat_ivl_ms = 1000;
    out->heartbeat_timeout_ms = 5000;
    proto_limits_default(vocab_size, &out->limits);
}

static bool valid_id(const char *id) {
    size_t n = id ? strlen(id) : 0;
    if (n == 0 || n > PROTO_WORKER_ID_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '-'))
            return false;
    }
    return true;
}

static baton_status_t zerr(const char *what) {
    return baton_error(BATON_ERR_IO, "zmq %s: %s", what, zmq_strerror(zmq_errno()));
}

static baton_status_t set_int(void *sock, int opt, int v, const char *name) {
    if (zmq_setsockopt(sock, opt, &v, sizeof(v)) != 0) return zerr(name);
    return BATON_OK;
}

baton_status_t proto_chan_open(void *zctx, proto_chan_kind_t kind, const char *endpoint,
                               const char *identity, const proto_chan_opts_t *opts,
                               proto_chan_t **out) {
    static const int zkind[] = {ZMQ_ROUTER, ZMQ_DEALER, ZMQ_PUB, ZMQ_SUB};
    if (!zctx || !endpoint || !opts || !out)
        return baton_error(BATON_ERR_INVALID_ARG, "proto_chan_open: NULL argument");
    if ((unsigned)kind > PROTO_CHAN_SUB)
        return baton_error(BATON_ERR_INVALID_ARG, "proto_chan_open: bad kind %d", kind);
    bool needs_id = kind == PROTO_CHAN_DEALER || kind == PROTO_CHAN_PUB;
    if (needs_id && !valid_id(identity))
        return baton_error(BATON_ERR_INVALID_ARG,
                           "proto_chan_open: identity must be 1..%d bytes of [A-Za-z0-9._:-]",
                           PROTO_WORKER_ID_MAX);
    if (opts->limits.vocab_size == 0)
        return baton_error(BATON_ERR_INVALID_ARG, "proto_chan_open: limits.vocab_size is 0");

    proto_chan_t *c = calloc(1, sizeof(*c));
    if (!c) return baton_error(BATON_ERR_NO_MEMORY, "proto_chan_open");
    c->kind = kind;
    c->opts = *opts;
    if (needs_id) snprintf(c->identity, sizeof(c->identity), "%s", identity);
    c->sock = zmq_socket(zctx, zkind[kind]);
    baton_status_t st = BATON_OK;
    if (!c->sock) {
        st = zerr("socket");
        goto err_chan;
    }
    int64_t maxmsg = (int64_t)opts->limits.max_msg_bytes;
    if ((st = set_int(c->sock, ZMQ_SNDHWM, opts->sndhwm, "ZMQ_SNDHWM")) ||
        (st = set_int(c->sock, ZMQ_RCVHWM, opts->rcvhwm, "ZMQ_RCVHWM")) ||
        (st = set_int(c->sock, ZMQ_LINGER, opts->linger_ms, "ZMQ_LINGER")) ||
        (st = set_int(c->sock, ZMQ_RECONNECT_IVL, opts->reconnect_ivl_ms, "ZMQ_RECONNECT_IVL")) ||
        (st = set_int(c->sock, ZMQ_RECONNECT_IVL_MAX, opts->reconnect_ivl_max_ms,
                      "ZMQ_RECONNECT_IVL_MAX")))
        goto err_sock;
    if (zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg)) != 0) {
        st = zerr("ZMQ_MAXMSGSIZE");
        goto err_sock;
    }
    if (opts->heartbeat_ivl_ms > 0 &&
        ((st = set_int(c->sock, ZMQ_HEARTBEAT_IVL, opts->heartbeat_ivl_ms, "ZMQ_HEARTBEAT_IVL")) ||
         (st = set_int(c->sock, ZMQ_HEARTBEAT_TIMEOUT, opts->heartbeat_timeout_ms,
                       "ZMQ_HEARTBEAT_TIMEOUT"))))
        goto err_sock;
    switch (kind) {
    case PROTO_CHAN_ROUTER:
        if ((st = set_int(c->sock, ZMQ_ROUTER_MANDATORY, 1, "ZMQ_ROUTER_MANDATORY")) ||
            (st = set_int(c->sock, ZMQ_ROUTER_HANDOVER, 1, "ZMQ_ROUTER_HANDOVER")))
            goto err_sock;
        break;
    case PROTO_CHAN_DEALER:
        if (zmq_setsockopt(c->sock, ZMQ_ROUTING_ID, identity, strlen(identity)) != 0) {
            st = zerr("ZMQ_ROUTING_ID");
            goto err_sock;
        }
        break;
    case PROTO_CHAN_SUB:
        if (zmq_setsockopt(c->sock, ZMQ_SUBSCRIBE, "", 0) != 0) {
            st = zerr("ZMQ_SUBSCRIBE");
            goto err_sock;
        }
        break;
    case PROTO_CHAN_PUB: break;
    }
    bool bind = kind == PROTO_CHAN_ROUTER || kind == PROTO_CHAN_PUB;
    if ((bind ? zmq_bind(c->sock, endpoint) : zmq_connect(c->sock, endpoint)) != 0) {
        st = baton_error(BATON_ERR_IO, "zmq %s %s: %s", bind ? "bind" : "connect", endpoint,
                         zmq_strerror(zmq_errno()));
        goto err_sock;
    }
    *out = c;
    return BATON_OK;

err_sock:
    zmq_setsockopt(c->sock, ZMQ_LINGER, &(int){0}, sizeof(int));
    zmq_close(c->sock);
err_chan:
    free(c);
    return st;
}

void proto_chan_free(proto_chan_t *chan) {
    if (!chan) return;
    zmq_close(chan->sock);
    free(chan);
}

baton_status_t proto_chan_connect(proto_chan_t *chan, const char *endpoint) {
    if (!chan || !endpoint) return baton_error(BATON_ERR_INVALID_ARG, "proto_chan_connect: NULL");
    if (zmq_connect(chan->sock, endpoint) != 0)
        return baton_error(BATON_ERR_IO, "zmq connect %s: %s", endpoint, zmq_strerror(zmq_errno()));
    return BATON_OK;
}

baton_status_t proto_chan_endpoint(const proto_chan_t *chan, char *buf, size_t buf_len) {
    if (!chan || !buf || buf_len == 0)
        return baton_error(BATON_ERR_INVALID_ARG, "proto_chan_endpoint: bad argument");
    char tmp[1024];
    size_t n = sizeof(tmp);
    if (zmq_getsockopt(chan->sock, ZMQ_LAST_ENDPOINT, tmp, &n) != 0) return zerr("ZMQ_LAST_ENDPOINT");
    size_t len = strnlen(tmp, n);
    if (len + 1 > buf_len)
        return baton_error(BATON_ERR_NO_SPACE, "proto_chan_endpoint: %zu bytes needed", len + 1);
    memcpy(buf, tmp, len);
    buf[len] = '\0';
    return BATON_OK;
}

int proto_chan_fd(const proto_chan_t *chan) {
    int fd = -1;
    size_t n = sizeof(fd);
    if (!chan || zmq_getsockopt(chan->sock, ZMQ_FD, &fd, &n) != 0) return -1;
    return fd;
}

bool proto_chan_readable(proto_chan_t *chan) {
    int ev = 0;
    size_t n = sizeof(ev);
    if (!chan || zmq_getsockopt(chan->sock, ZMQ_EVENTS, &ev, &n) != 0) return false;
    return (ev & ZMQ_POLLIN) != 0;
}

const proto_stats_t *proto_chan_stats(const proto_chan_t *chan) {
    return chan ? &chan->stats : NULL;
}

void *proto_chan_socket(proto_chan_t *chan) { return chan ? chan->sock : NULL; }

static baton_status_t send_err(const char *what, const char *peer) {
    int e = zmq_errno();
    if (e == EAGAIN)
        return baton_error(BATON_ERR_BUSY, "zmq send %s: queue full or not connected", what);
    if (e == EHOSTUNREACH)
        return baton_error(BATON_ERR_NOT_FOUND, "zmq send: peer %s is not connected",
                           peer ? peer : "?");
    return baton_error(BATON_ERR_IO, "zmq send %s: %s", what, zmq_strerror(e));
}

baton_status_t proto_chan_send_raw(proto_chan_t *chan, const char *peer, const void *payload,
                                   size_t len) {
    if (!chan || (!payload && len))
        return baton_error(BATON_ERR_INVALID_ARG, "proto_chan_send: NULL argument");
    const char *head = NULL;
    switch (chan->kind) {
    case PROTO_CHAN_SUB:
        return baton_error(BATON_ERR_INVALID_ARG, "proto_chan_send: a SUB channel cannot send");
    case PROTO_CHAN_ROUTER:
        if (!valid_id(peer))
            return baton_error(BATON_ERR_INVALID_ARG, "proto_chan_send: bad peer worker id");
        head = peer;
        break;
    case PROTO_CHAN_PUB: head = chan->identity; break;
    case PROTO_CHAN_DEALER: break;
    }
    /* A multipart message is atomic: with ROUTER_MANDATORY an unknown peer
     * fails on the first frame, and a full HWM refuses the first frame, so
     * no partial message is queued. */
    if (head && zmq_send(chan->sock, head, strlen(head), ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0)
        return send_err("header", peer);
    if (zmq_send(chan->sock, payload ? payload : "", len, ZMQ_DONTWAIT) < 0)
        return send_err("payload", peer);
    return BATON_OK;
}

baton_status_t proto_chan_send(proto_chan_t *chan, const char *peer, const proto_msg_t *msg) {
    if (!chan || !msg) return baton_error(BATON_ERR_INVALID_ARG, "proto_chan_send: NULL argument");
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    baton_status_t st = proto_encode(msg, &sb);
    if (!st) st = proto_chan_send_raw(chan, peer, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return st;
}

/* Receives every remaining frame of the current message and drops it. */
static void discard_rest(void *sock) {
    int more = 1;
    size_t n = sizeof(more);
    while (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &n) == 0 && more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        int rc = zmq_msg_recv(&m, sock, ZMQ_DONTWAIT);
        zmq_msg_close(&m);
        if (rc < 0) break;
    }
}

static bool has_more(void *sock) {
    int more = 0;
    size_t n = sizeof(more);
    return zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &n) == 0 && more;
}

/* Receives one whole message. Returns 1 when a message was handled or
 * dropped, 0 when nothing was pending, <0 (status) on a socket error. */
static int recv_one(proto_chan_t *c, proto_chan_handler_t handler, void *arg, uint32_t *n_ok) {
    char peer[256] = "";
    bool has_head = c->kind == PROTO_CHAN_ROUTER || c->kind == PROTO_CHAN_SUB;
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, c->sock, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        if (zmq_errno() == EAGAIN) return 0;
        if (zmq_errno() == EINTR) return 0;
        return zerr("recv");
    }
    bool bad_frames = false;
    if (has_head) {
        size_t n = zmq_msg_size(&m);
        if (n >= sizeof(peer)) n = sizeof(peer) - 1;
        memcpy(peer, zmq_msg_data(&m), n);
        peer[n] = '\0';
        bool ok_id = n == zmq_msg_size(&m) && valid_id(peer);
        if (!ok_id || !has_more(c->sock)) bad_frames = true;
        zmq_msg_close(&m);
        zmq_msg_init(&m);
        if (!bad_frames && zmq_msg_recv(&m, c->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return zerr("recv payload");
        }
        if (!ok_id) snprintf(peer, sizeof(peer), "(invalid identity)");
    }
    if (!bad_frames && has_more(c->sock)) bad_frames = true;
    if (bad_frames) {
        discard_rest(c->sock);
        zmq_msg_close(&m);
        proto_stats_count(&c->stats, PROTO_MSG_UNKNOWN, BATON_ERR_FORMAT);
        LOG_WARN("proto", "dropped a message from %s: unexpected frames or peer identity", peer);
        return 1;
    }
    proto_msg_t msg;
    baton_status_t st = proto_decode_counted(zmq_msg_data(&m), zmq_msg_size(&m), &c->opts.limits,
                                             &c->stats, has_head ? peer : "dealer peer", &msg);
    zmq_msg_close(&m);
    if (st == BATON_OK) {
        (*n_ok)++;
        if (handler) handler(arg, c, peer, &msg);
        proto_msg_free(&msg);
    }
    return 1;
}

baton_status_t proto_chan_drain(proto_chan_t *chan, proto_chan_handler_t handler, void *arg,
                                uint32_t max_msgs, uint32_t *n_handled) {
    if (!chan) return baton_error(BATON_ERR_INVALID_ARG, "proto_chan_drain: NULL channel");
    if (chan->kind == PROTO_CHAN_PUB)
        return baton_error(BATON_ERR_INVALID_ARG, "proto_chan_drain: a PUB channel cannot receive");
    uint32_t n_ok = 0, n_seen = 0;
    baton_status_t st = BATON_OK;
    for (;;) {
        if (max_msgs && n_seen >= max_msgs) {
            st = proto_chan_readable(chan) ? BATON_ERR_BUSY : BATON_OK;
            if (st) baton_error(st, "proto_chan_drain: stopped after %u messages", n_seen);
            break;
        }
        int rc = recv_one(chan, handler, arg, &n_ok);
        if (rc < 0) {
            st = (baton_status_t)rc;
            break;
        }
        if (rc == 0) {
            /* EAGAIN: ZMQ_EVENTS was refreshed by the failed recv; loop once
             * more only if a message slipped in meanwhile. */
            if (!proto_chan_readable(chan)) break;
            continue;
        }
        n_seen++;
    }
    if (n_handled) *n_handled = n_ok;
    return st;
}
