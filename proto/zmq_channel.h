/* proto: ZeroMQ channels carrying proto messages, for event-loop processes.
 *
 * Four kinds of channel, each one ZeroMQ socket:
 * - ROUTER (router process, bind): one per router; peers are workers,
 *   addressed by their worker id, which each DEALER sets as its ZMQ
 *   identity. ZMQ_ROUTER_MANDATORY makes a send to an unknown worker fail
 *   (BATON_ERR_NOT_FOUND) instead of vanishing; ZMQ_ROUTER_HANDOVER lets a
 *   restarted worker (new epoch, same id) take over its identity.
 * - DEALER (worker, connect): identity = worker id, reconnects on its own
 *   (ZMQ_RECONNECT_IVL / _MAX) and detects dead peers with ZMTP heartbeats.
 * - PUB (worker, bind) / SUB (router, connect to every worker's PUB): KV
 *   events. Each message is two frames: topic = worker id, then the payload.
 *   SUB subscribes to every topic. At the high-water mark a PUB drops
 *   messages for that subscriber (ZeroMQ semantics; the send still
 *   succeeds); KV events carry a per-worker seq so the subscriber sees the
 *   gap and asks for a KVResync.
 * Frames on the wire: ROUTER<->DEALER one payload frame (the ROUTER socket
 * adds/strips the identity frame); PUB->SUB [topic][payload]. The payload is
 * one msgpack message (proto/messages.h).
 *
 * Every send is non-blocking (ZMQ_DONTWAIT); queues are bounded by
 * ZMQ_SNDHWM/ZMQ_RCVHWM, linger on close by ZMQ_LINGER and incoming message
 * size by ZMQ_MAXMSGSIZE (the peer is disconnected by ZeroMQ beyond it).
 *
 * Event loop use (libevent, epoll...): watch proto_chan_fd() for reading.
 * That fd is edge-triggered and signals "ZMQ_EVENTS changed", not "a message
 * is here", so on readiness call proto_chan_drain() until it returns
 * BATON_OK (it reads until ZMQ_EVENTS has no ZMQ_POLLIN). Any send on the
 * socket may consume the edge as well: after sending from outside the read
 * callback, call proto_chan_readable() and drain if it is true (or activate
 * the read event by hand).
 *
 * A channel is used by one thread at a time (ZeroMQ sockets are not
 * thread-safe). */
#ifndef BATON_PROTO_ZMQ_CHANNEL_H
#define BATON_PROTO_ZMQ_CHANNEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "proto/messages.h"

typedef enum proto_chan_kind {
    PROTO_CHAN_ROUTER = 0,
    PROTO_CHAN_DEALER,
    PROTO_CHAN_PUB,
    PROTO_CHAN_SUB,
} proto_chan_kind_t;

typedef struct proto_chan_opts {
    int sndhwm;               /* messages queued for sending per peer (default 10000) */
    int rcvhwm;               /* messages queued for receiving per peer (default 10000) */
    int linger_ms;            /* pending sends kept after close (default 500) */
    int reconnect_ivl_ms;     /* first reconnect delay (default 100) */
    int reconnect_ivl_max_ms; /* reconnect back-off cap (default 5000) */
    int heartbeat_ivl_ms;     /* ZMTP ping interval, 0 = off (default 1000) */
    int heartbeat_timeout_ms; /* drop a silent connection after (default 5000) */
    proto_limits_t limits;    /* decode limits; max_msg_bytes also sets ZMQ_MAXMSGSIZE */
} proto_chan_opts_t;

/* Fills `out` with the defaults above and proto_limits_default(vocab_size). */
void proto_chan_opts_default(uint32_t vocab_size, proto_chan_opts_t *out);

typedef struct proto_chan proto_chan_t;

/* Creates a channel of `kind` on ZeroMQ context `zctx` (zmq_ctx_new; must
 * outlive the channel). ROUTER and PUB bind `endpoint`, DEALER and SUB
 * connect to it ("tcp://host:port", "tcp://127.0.0.1:*" for an ephemeral
 * port, "ipc:///path"). `identity` is the worker id of a DEALER (required,
 * 1..PROTO_WORKER_ID_MAX bytes of [A-Za-z0-9._:-]) or the topic of a PUB
 * (required, same rule); ignored for ROUTER and SUB. `opts` is required
 * (proto_chan_opts_default) and is copied; opts->limits.vocab_size must be
 * > 0 (every received message is decoded against it).
 * Errors: BATON_ERR_INVALID_ARG (bad kind, identity, NULL), BATON_ERR_IO
 * (socket, option, bind or connect failed; the detail names zmq_strerror).
 * The channel must be freed with proto_chan_free. */
baton_status_t proto_chan_open(void *zctx, proto_chan_kind_t kind, const char *endpoint,
                               const char *identity, const proto_chan_opts_t *opts,
                               proto_chan_t **out);

/* Closes the socket (pending sends linger at most linger_ms). NULL-safe. */
void proto_chan_free(proto_chan_t *chan);

/* Connects the channel to one more endpoint (a SUB to another worker's PUB,
 * a DEALER to a second router). BATON_ERR_IO on failure. */
baton_status_t proto_chan_connect(proto_chan_t *chan, const char *endpoint);

/* Writes the endpoint actually bound (ZMQ_LAST_ENDPOINT, e.g. the port
 * chosen for "tcp://127.0.0.1:*") into buf (NUL-terminated).
 * BATON_ERR_NO_SPACE when it does not fit, BATON_ERR_IO otherwise. */
baton_status_t proto_chan_endpoint(const proto_chan_t *chan, char *buf, size_t buf_len);

/* The fd to watch for reading (ZMQ_FD); see the event-loop notes above. */
int proto_chan_fd(const proto_chan_t *chan);

/* True when a message can be received now (ZMQ_EVENTS has ZMQ_POLLIN). */
bool proto_chan_readable(proto_chan_t *chan);

/* Encodes `msg` and sends it without blocking. `peer` is the destination
 * worker id on a ROUTER channel and ignored otherwise.
 * Errors: BATON_ERR_BUSY (send high-water mark reached: the peer is slow or
 * unreachable; retry later), BATON_ERR_NOT_FOUND (ROUTER: no such peer
 * connected), BATON_ERR_INVALID_ARG (SUB cannot send, missing peer, encode
 * refused), BATON_ERR_IO (other ZeroMQ error). Nothing is sent on error. */
baton_status_t proto_chan_send(proto_chan_t *chan, const char *peer, const proto_msg_t *msg);

/* As proto_chan_send for an already encoded payload of `len` bytes. */
baton_status_t proto_chan_send_raw(proto_chan_t *chan, const char *peer, const void *payload,
                                   size_t len);

/* Called once per valid message. `peer` is the sender's worker id (ROUTER),
 * the topic (SUB) or "" (DEALER). `msg` is freed after the callback
 * returns; to keep it, copy the struct and memset *msg to 0. */
typedef void (*proto_chan_handler_t)(void *arg, proto_chan_t *chan, const char *peer,
                                     proto_msg_t *msg);

/* Receives and dispatches messages without blocking, at most `max_msgs`
 * (0 = no bound). Invalid messages (bad frames, unknown peer identity, a
 * payload proto_decode refuses) are counted in the channel's stats, logged
 * and dropped; they never stop the drain. Returns BATON_OK when the socket
 * has nothing left to read, BATON_ERR_BUSY when it stopped at max_msgs with
 * more pending (call again: the fd will not signal those), BATON_ERR_IO on a
 * ZeroMQ failure. *n_handled (may be NULL) gets the number of valid
 * messages dispatched. */
baton_status_t proto_chan_drain(proto_chan_t *chan, proto_chan_handler_t handler, void *arg,
                                uint32_t max_msgs, uint32_t *n_handled);

/* Decode counters of this channel (valid and refused messages per type and
 * status; frame errors count as PROTO_MSG_UNKNOWN / BATON_ERR_FORMAT). */
const proto_stats_t *proto_chan_stats(const proto_chan_t *chan);

/* The ZeroMQ socket, for options this API does not cover. */
void *proto_chan_socket(proto_chan_t *chan);

#endif
