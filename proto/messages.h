/* proto: the control-plane message schema (msgpack), its encoders, its
 * validating decoder and per-(type, status) counters.
 *
 * Wire format. Every message is one msgpack map whose keys are strings. Two
 * keys are always present: "type" (str, e.g. "prefill_request") and "v"
 * (positive int, the schema's major version, PROTO_VERSION). Compatible
 * additions within a major version only add optional keys; a decoder ignores
 * keys it does not know, so an older peer reads a newer minor. A message whose
 * "v" is newer than PROTO_VERSION is refused with BATON_ERR_VERSION.
 *
 * Field conventions (the key of each field is written next to it):
 * - request ids are 128-bit, carried as a 16-byte bin (proto_request_id_t);
 *   the router draws them at random and prints them as 32 hex digits;
 * - worker ids are 1..PROTO_WORKER_ID_MAX bytes of [A-Za-z0-9._:-] (they
 *   double as ZeroMQ identities, which may not start with a 0 byte);
 * - block hashes are XXH3-128 values as a 16-byte bin, big-endian
 *   (high 64 bits first, XXH128_canonicalFromHash order);
 * - times are microseconds: durations `*_us`, instants `*_unix_us` (since the
 *   Unix epoch, 0 = none);
 * - token ids are unsigned ints below proto_limits_t.vocab_size;
 * - enums travel as short strings ("prefill", "stop", "f16", ...);
 * - floats may be sent as float32, float64 or int and must be finite.
 *
 * Ownership. A decoded proto_msg_t owns every array and string it points
 * to; release it with proto_msg_free(). Structs passed to the encoders are
 * only read. */
#ifndef BATON_PROTO_MESSAGES_H
#define BATON_PROTO_MESSAGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "common/status.h"

#define PROTO_VERSION 1           /* major schema version written in "v" */
#define PROTO_WORKER_ID_MAX 63    /* bytes, without the terminating NUL */
#define PROTO_ID_BYTES 16         /* request id and block hash size */
#define PROTO_SHA256_BYTES 32     /* model file hash */
#define PROTO_MAX_TOP_LOGPROBS 20 /* OpenAI's top_logprobs bound */
#define PROTO_MAX_STOP_TOKENS 64  /* stop token ids per request */
#define PROTO_MAX_LOGIT_BIAS 300  /* logit_bias entries per request (OpenAI's bound) */
#define PROTO_MAX_POOL_REGIONS 4096 /* memory regions per pool descriptor */

typedef enum proto_msg_type {
    PROTO_MSG_WORKER_REGISTER = 0, /* "worker_register" */
    PROTO_MSG_WORKER_HEARTBEAT,    /* "worker_heartbeat" */
    PROTO_MSG_PREFILL_REQUEST,     /* "prefill_request" */
    PROTO_MSG_DECODE_REQUEST,      /* "decode_request" */
    PROTO_MSG_KV_DESTINATION,      /* "kv_destination" */
    PROTO_MSG_PREFILL_DONE,        /* "prefill_done" */
    PROTO_MSG_TOKEN_CHUNK,         /* "token_chunk" */
    PROTO_MSG_REQUEST_FINISHED,    /* "request_finished" */
    PROTO_MSG_ABORT,               /* "abort" */
    PROTO_MSG_KV_EVENT,            /* "kv_event" */
    PROTO_MSG_KV_RESYNC,           /* "kv_resync" */
    PROTO_MSG_COUNT,
    PROTO_MSG_UNKNOWN = PROTO_MSG_COUNT, /* stats slot: type absent/unknown */
} proto_msg_type_t;

typedef enum proto_role {
    PROTO_ROLE_PREFILL = 0, /* "prefill" */
    PROTO_ROLE_DECODE,      /* "decode" */
    PROTO_ROLE_BOTH,        /* "both" (colocated worker) */
} proto_role_t;

typedef enum proto_kv_dtype {
    PROTO_KV_DTYPE_F32 = 0, /* "f32" */
    PROTO_KV_DTYPE_F16,     /* "f16" */
    PROTO_KV_DTYPE_BF16,    /* "bf16" */
} proto_kv_dtype_t;

typedef enum proto_finish_reason {
    PROTO_FINISH_NONE = 0, /* "none": still running */
    PROTO_FINISH_STOP,     /* "stop": EOS or a stop token */
    PROTO_FINISH_LENGTH,   /* "length": max_tokens or context reached */
    PROTO_FINISH_ABORT,    /* "abort": aborted by the router/client */
    PROTO_FINISH_ERROR,    /* "error": failed; see status/error */
} proto_finish_reason_t;

typedef struct proto_request_id {
    uint8_t bytes[PROTO_ID_BYTES];
} proto_request_id_t;

typedef struct proto_block_hash {
    uint8_t bytes[PROTO_ID_BYTES]; /* XXH3-128, canonical (big-endian) */
} proto_block_hash_t;

/* Bounds a decoder enforces. Every count is per array in one message. */
typedef struct proto_limits {
    uint32_t vocab_size;    /* token ids must be < vocab_size; must be > 0 */
    uint32_t max_tokens;    /* token ids per list (prompt, chunk) */
    uint32_t max_blocks;    /* block ids / block hashes per list */
    uint32_t max_entries;   /* entries of a TokenChunk */
    uint32_t max_str_bytes; /* any string except worker ids */
    uint32_t max_bin_bytes; /* UCX worker address, packed rkey */
    uint32_t max_msg_bytes; /* whole encoded message */
} proto_limits_t;

/* Fills `out` with the defaults: max_tokens 131072, max_blocks 65536,
 * max_entries 4096, max_str_bytes 4096, max_bin_bytes 65536, max_msg_bytes
 * 16 MiB, and the given vocab_size (from the model's GGUF metadata). */
void proto_limits_default(uint32_t vocab_size, proto_limits_t *out);

/* ---- shared sub-structures ---------------------------------------------- */

/* KV geometry; prefill and decode workers pair only when all fields match. */
typedef struct proto_kv_geometry {
    uint32_t n_layers;      /* "n_layers", 1..1024 */
    uint32_t n_kv_heads;    /* "n_kv_heads", 1..1024 */
    uint32_t head_dim;      /* "head_dim", 1..4096 */
    uint32_t block_size;    /* "block_size", tokens per block, 1..4096 */
    proto_kv_dtype_t dtype; /* "dtype" */
    uint64_t hash_seed_id;  /* "hash_seed_id": public id of the block-hash seed */
} proto_kv_geometry_t;

/* One UCX-registered memory region of a decode worker's KV pool. */
typedef struct proto_pool_region {
    uint64_t base_addr;    /* "base": remote virtual address */
    uint64_t length_bytes; /* "len": region length in bytes, > 0 */
    uint8_t *rkey;         /* "rkey": ucp_rkey_pack() output (bin) */
    uint32_t rkey_len;     /* bytes of rkey, 1..max_bin_bytes */
} proto_pool_region_t;

/* Pool descriptor: regions in the order the KV layout defines (one region
 * for the whole pool, or K and V per layer: [layer0 K, layer0 V, ...]). */
typedef struct proto_pool_desc {
    proto_pool_region_t *regions; /* "regions", 0..PROTO_MAX_POOL_REGIONS */
    uint32_t n_regions;
    uint32_t n_blocks;            /* "n_blocks": blocks per layer pool */
    uint64_t block_bytes;         /* "block_bytes": bytes of one block of one
                                     layer's K (or V), kernels/backend.h */
} proto_pool_desc_t;

/* One OpenAI logit_bias entry: l[token] += bias before sampling. */
typedef struct proto_logit_bias {
    uint32_t token; /* "t", < vocab_size */
    float bias;     /* "b", -100..100 */
} proto_logit_bias_t;

/* Sampling parameters (OpenAI/vLLM names and ranges). */
typedef struct proto_sampling {
    float temperature;        /* "temperature", 0..100 (0 = greedy) */
    float top_p;              /* "top_p", (0, 1] */
    uint32_t top_k;           /* "top_k", 0 (off) .. vocab_size */
    float min_p;              /* "min_p", 0..1 */
    float repetition_penalty; /* "repetition_penalty", (0, 10] */
    float presence_penalty;   /* "presence_penalty", -2..2 */
    float frequency_penalty;  /* "frequency_penalty", -2..2 */
    uint64_t seed;            /* "seed" */
    uint32_t max_tokens;      /* "max_tokens", 1..limits.max_tokens */
    uint32_t *stop_token_ids; /* "stop_token_ids", 0..PROTO_MAX_STOP_TOKENS */
    uint32_t n_stop_token_ids;
    bool logprobs;            /* "logprobs": return the sampled token's logprob */
    uint32_t top_logprobs;    /* "top_logprobs", 0..PROTO_MAX_TOP_LOGPROBS */
    bool ignore_eos;          /* "ignore_eos" */
    proto_logit_bias_t *logit_bias; /* "logit_bias" (optional array of maps, left out when
                                       empty), 0..PROTO_MAX_LOGIT_BIAS entries; a token
                                       listed twice: the decoder keeps both, a sampler
                                       adds both */
    uint32_t n_logit_bias;
} proto_sampling_t;

/* Per-stage timings of one request, microseconds. */
typedef struct proto_timings {
    uint64_t queue_us;        /* "queue_us": waiting for admission/a batch slot */
    uint64_t prefill_us;      /* "prefill_us": prefill compute */
    uint64_t transfer_us;     /* "transfer_us": KV transfer */
    uint64_t transfer_bytes;  /* "transfer_bytes": KV bytes moved */
    uint64_t decode_us;       /* "decode_us": decode steps */
} proto_timings_t;

typedef struct proto_token_logprob {
    uint32_t token;  /* "t", < vocab_size */
    float logprob;   /* "lp", <= 0 */
} proto_token_logprob_t;

/* ---- messages ----------------------------------------------------------- */

/* worker -> router, once per epoch. */
typedef struct proto_worker_register {
    char worker_id[PROTO_WORKER_ID_MAX + 1]; /* "worker_id" */
    proto_role_t role;                       /* "role" */
    uint64_t epoch;                          /* "epoch", > 0: new per restart */
    char *zmq_endpoint;                      /* "zmq_endpoint": advertised, may be "" */
    uint8_t model_sha256[PROTO_SHA256_BYTES];/* "model_sha256" */
    uint32_t vocab_size;                     /* "vocab_size", > 0 */
    proto_kv_geometry_t kv;                  /* "kv" (map) */
    uint8_t *ucx_address;                    /* "ucx_address": ucp_worker_get_address */
    uint32_t ucx_address_len;                /*   bytes, 0 for a worker with no pool */
    proto_pool_desc_t pool;                  /* "pool" (map) */
    char *kv_events_endpoint;                /* "kv_events_endpoint" (optional): the worker's
                                                KV-event PUB endpoint, "" / NULL = none */
    /* optional serving configuration (issue 6 "system_fingerprint"); 0 / ""
       / NULL when absent */
    uint32_t max_batch_tokens;               /* "max_batch_tokens": tokens per prefill step */
    uint32_t max_batch;                      /* "max_batch": sequences per decode step */
    char *cpu_model;                         /* "cpu_model": /proc/cpuinfo "model name" */
    char *backend;                           /* "backend": kernels backend ("cpu", "cuda") */
    char *compute_dtype;                     /* "compute_dtype": weights' dtype (e.g. "q4_1") */
} proto_worker_register_t;

/* worker -> router, periodically. */
typedef struct proto_worker_heartbeat {
    char worker_id[PROTO_WORKER_ID_MAX + 1]; /* "worker_id" */
    proto_role_t role;                       /* "role" */
    uint64_t epoch;                          /* "epoch", > 0 */
    uint64_t timestamp_unix_us;              /* "ts_us" */
    uint64_t queued_prefill_tokens;          /* "queued_prefill_tokens" */
    uint32_t n_running;                      /* "n_running": sequences in the batch */
    uint32_t n_waiting;                      /* "n_waiting": queued requests */
    uint32_t free_blocks;                    /* "free_blocks", <= total_blocks */
    uint32_t total_blocks;                   /* "total_blocks" */
    float batch_occupancy;                   /* "batch_occupancy", 0..1 */
    /* optional metrics (cluster.md "Metrics a worker reports"); 0 when absent */
    uint32_t used_blocks;                    /* "used_blocks": KV blocks referenced */
    uint64_t cache_hit_blocks;               /* "cache_hit_blocks": prefix-cache blocks reused */
    uint64_t cache_lookup_blocks;            /* "cache_lookup_blocks": blocks looked up (hit+miss) */
    uint64_t preemptions;                    /* "preemptions" (decode) */
    uint64_t busy_us;                        /* "busy_us": time spent in steps since start */
    uint64_t steps;                          /* "steps": forward steps since start */
    /* scheduler idle gaps: time from the end of a step to the start of the
       next one while work was pending (optional, 0 when absent) */
    uint64_t idle_gaps;                      /* "idle_gaps": gaps counted since start */
    uint64_t idle_gap_us;                    /* "idle_gap_us": their sum */
    uint64_t idle_gap_max_us;                /* "idle_gap_max_us": the longest */
} proto_worker_heartbeat_t;

/* router -> prefill worker. */
typedef struct proto_prefill_request {
    proto_request_id_t request_id;                   /* "request_id" */
    char decode_worker_id[PROTO_WORKER_ID_MAX + 1];  /* "decode_worker_id" */
    uint64_t decode_epoch;                           /* "decode_epoch" */
    uint32_t *token_ids;                             /* "token_ids", 1..max_tokens */
    uint32_t n_token_ids;
    proto_sampling_t sampling;                       /* "sampling" (map) */
    char *tenant;                                    /* "tenant" */
    uint64_t cache_salt;                             /* "cache_salt", 0 = shared cache */
    uint64_t deadline_unix_us;                       /* "deadline_unix_us", 0 = none */
    char *decode_endpoint;                           /* "decode_endpoint" (optional): the decode
                                                        worker's peer ROUTER endpoint */
} proto_prefill_request_t;

/* router -> decode worker. token_ids is either empty or the whole prompt
 * (n_prompt_tokens entries; used for penalties and stop checks). */
typedef struct proto_decode_request {
    proto_request_id_t request_id;                   /* "request_id" */
    char prefill_worker_id[PROTO_WORKER_ID_MAX + 1]; /* "prefill_worker_id" */
    uint32_t n_prompt_tokens;                        /* "n_prompt_tokens", 1..max_tokens */
    uint32_t n_blocks;                               /* "n_blocks" to reserve, 1..max_blocks */
    uint32_t *token_ids;                             /* "token_ids" */
    uint32_t n_token_ids;
    proto_sampling_t sampling;                       /* "sampling" (map) */
    char *tenant;                                    /* "tenant" */
    uint64_t cache_salt;                             /* "cache_salt" */
    uint64_t deadline_unix_us;                       /* "deadline_unix_us" */
    char *prefill_endpoint;                          /* "prefill_endpoint" (optional): the prefill
                                                        worker's peer ROUTER endpoint */
} proto_decode_request_t;

/* decode worker -> prefill worker: where to write the prompt's KV. The same
 * block ids apply to every layer. Blocks [0, n_skip_blocks) are already held
 * by the decode worker (prefix hit) and must not be written. */
typedef struct proto_kv_destination {
    proto_request_id_t request_id;                  /* "request_id" */
    char decode_worker_id[PROTO_WORKER_ID_MAX + 1]; /* "decode_worker_id" */
    uint64_t decode_epoch;                          /* "decode_epoch", > 0 */
    uint32_t *block_ids;                            /* "block_ids", 1..max_blocks, < 2^31 */
    uint32_t n_block_ids;
    uint32_t n_skip_blocks;                         /* "n_skip_blocks", <= n_block_ids */
    proto_pool_desc_t pool;                         /* "pool" (map; may have 0 regions
                                                       when registration is to be used) */
    uint8_t *ucx_address;                           /* "ucx_address" (optional bin): the decode
                                                       worker's ucp_worker_get_address */
    uint32_t ucx_address_len;                       /*   bytes, 0 when absent */
} proto_kv_destination_t;

/* prefill worker -> decode worker, after the UCX flush completed. */
typedef struct proto_prefill_done {
    proto_request_id_t request_id;                   /* "request_id" */
    char prefill_worker_id[PROTO_WORKER_ID_MAX + 1]; /* "prefill_worker_id" */
    int32_t status;                                  /* "status": baton_status_t, -1000..0 */
    char *error;                                     /* "error": "" when status is 0 */
    uint32_t first_token;                            /* "first_token", < vocab_size */
    float first_logprob;                             /* "first_logprob", <= 0 */
    proto_token_logprob_t *top_logprobs;             /* "top_logprobs" (array of maps) */
    uint32_t n_top_logprobs;                         /*   0..PROTO_MAX_TOP_LOGPROBS */
    uint32_t n_blocks_written;                       /* "n_blocks_written" */
    uint64_t bytes_written;                          /* "bytes_written" */
    uint64_t queue_us;                               /* "queue_us" */
    uint64_t compute_us;                             /* "compute_us" */
    uint64_t transfer_us;                            /* "transfer_us" */
    uint32_t cached_tokens;                          /* "cached_tokens" (optional): prompt
                                                        tokens the prefill worker reused from
                                                        its prefix cache (0 when absent) */
    uint64_t device_us;                              /* "device_us" (optional): the request's
                                                        share of the prefill steps' compute
                                                        time (DESIGN "Observability and cost":
                                                        each step's forward time split over its
                                                        requests in proportion to their tokens) */
} proto_prefill_done_t;

/* One request's new tokens in a TokenChunk. logprobs is empty or one per
 * token; top_logprobs is flat [n_token_ids, top_k] (row-major) or empty. */
typedef struct proto_token_entry {
    proto_request_id_t request_id;       /* "request_id" */
    uint32_t *token_ids;                 /* "token_ids", 0..max_tokens */
    uint32_t n_token_ids;
    float *logprobs;                     /* "logprobs", each <= 0 */
    uint32_t n_logprobs;
    uint32_t top_k;                      /* "top_k", 0..PROTO_MAX_TOP_LOGPROBS */
    proto_token_logprob_t *top_logprobs; /* "top_logprobs" */
    uint32_t n_top_logprobs;
    proto_finish_reason_t finish_reason; /* "finish_reason" */
} proto_token_entry_t;

/* decode worker -> router, once per decode step. */
typedef struct proto_token_chunk {
    char worker_id[PROTO_WORKER_ID_MAX + 1]; /* "worker_id" */
    uint64_t step_id;                        /* "step_id" */
    proto_token_entry_t *entries;            /* "entries", 1..max_entries */
    uint32_t n_entries;
} proto_token_chunk_t;

/* worker -> router when a request leaves the worker. */
typedef struct proto_request_finished {
    proto_request_id_t request_id;           /* "request_id" */
    char worker_id[PROTO_WORKER_ID_MAX + 1]; /* "worker_id" */
    proto_finish_reason_t finish_reason;     /* "finish_reason" (not "none") */
    int32_t status;                          /* "status", -1000..0 */
    char *error;                             /* "error" */
    uint32_t prompt_tokens;                  /* "prompt_tokens" */
    uint32_t completion_tokens;              /* "completion_tokens" */
    uint32_t cached_tokens;                  /* "cached_tokens", <= prompt_tokens */
    proto_timings_t timings;                 /* "timings" (map) */
    uint64_t prefill_device_us;              /* "prefill_device_us" (optional): device time
                                                of the prefill steps (PrefillDone.device_us) */
    uint64_t decode_device_us;               /* "decode_device_us" (optional): the request's
                                                share of the decode steps' compute time */
} proto_request_finished_t;

/* router -> workers: release every block of the request. */
typedef struct proto_abort {
    proto_request_id_t request_id; /* "request_id" */
    char *reason;                  /* "reason" */
} proto_abort_t;

typedef struct proto_kv_stored {
    proto_block_hash_t hash;        /* "h" */
    proto_block_hash_t parent_hash; /* "p": all zero for a first block */
    uint32_t n_tokens;              /* "n": tokens in the block, 1..4096 */
} proto_kv_stored_t;

/* worker -> router (PUB/SUB): blocks entering and leaving a worker's cache.
 * seq grows by one per message within an epoch. A full-set reply (after a
 * KVResync) sets full = true and is split into parts 0..n (full_last on the
 * final one); part 0 tells the receiver to forget the worker's blocks. */
typedef struct proto_kv_event {
    char worker_id[PROTO_WORKER_ID_MAX + 1]; /* "worker_id" */
    uint64_t epoch;                          /* "epoch", > 0 */
    uint64_t seq;                            /* "seq" */
    bool full;                               /* "full" */
    uint32_t full_part;                      /* "full_part" */
    bool full_last;                          /* "full_last" */
    proto_kv_stored_t *stored;               /* "stored" (array of maps) */
    uint32_t n_stored;                       /*   0..max_blocks */
    proto_block_hash_t *removed;             /* "removed" (array of bin16) */
    uint32_t n_removed;                      /*   0..max_blocks */
} proto_kv_event_t;

/* router -> worker: a gap was seen after last_seq; send the full set. */
typedef struct proto_kv_resync {
    char worker_id[PROTO_WORKER_ID_MAX + 1]; /* "worker_id" */
    uint64_t epoch;                          /* "epoch": epoch known to the router */
    uint64_t last_seq;                       /* "last_seq": last seq applied */
} proto_kv_resync_t;

typedef struct proto_msg {
    proto_msg_type_t type;
    union {
        proto_worker_register_t worker_register;
        proto_worker_heartbeat_t worker_heartbeat;
        proto_prefill_request_t prefill_request;
        proto_decode_request_t decode_request;
        proto_kv_destination_t kv_destination;
        proto_prefill_done_t prefill_done;
        proto_token_chunk_t token_chunk;
        proto_request_finished_t request_finished;
        proto_abort_t abort;
        proto_kv_event_t kv_event;
        proto_kv_resync_t kv_resync;
    } u;
} proto_msg_t;

/* Wire name of a message type ("prefill_request"), "unknown" otherwise. */
const char *proto_msg_type_name(proto_msg_type_t type);

/* Appends the msgpack encoding of `msg` to `sbuf` (initialised by the
 * caller with msgpack_sbuffer_init). Strings passed as NULL encode as "".
 * Returns BATON_ERR_INVALID_ARG for an unknown type, an array pointer that
 * is NULL with a non-zero count, or an over-long worker id;
 * BATON_ERR_NO_MEMORY when the buffer cannot grow. On error sbuf may hold a
 * partial message: reset its size to what it was before. */
baton_status_t proto_encode(const proto_msg_t *msg, msgpack_sbuffer *sbuf);

/* Typed wrappers of proto_encode. */
baton_status_t proto_encode_worker_register(const proto_worker_register_t *m, msgpack_sbuffer *sbuf);
baton_status_t proto_encode_worker_heartbeat(const proto_worker_heartbeat_t *m, msgpack_sbuffer *sbuf);
baton_status_t proto_encode_prefill_request(const proto_prefill_request_t *m, msgpack_sbuffer *sbuf);
baton_status_t proto_encode_decode_request(const proto_decode_request_t *m, msgpack_sbuffer *sbuf);
baton_status_t proto_encode_kv_destination(const proto_kv_destination_t *m, msgpack_sbuffer *sbuf);
baton_status_t proto_encode_prefill_done(const proto_prefill_done_t *m, msgpack_sbuffer *sbuf);
baton_status_t proto_encode_token_chunk(const proto_token_chunk_t *m, msgpack_sbuffer *sbuf);
baton_status_t proto_encode_request_finished(const proto_request_finished_t *m, msgpack_sbuffer *sbuf);
baton_status_t proto_encode_abort(const proto_abort_t *m, msgpack_sbuffer *sbuf);
baton_status_t proto_encode_kv_event(const proto_kv_event_t *m, msgpack_sbuffer *sbuf);
baton_status_t proto_encode_kv_resync(const proto_kv_resync_t *m, msgpack_sbuffer *sbuf);

/* Decodes and validates one message occupying exactly buf[0, len).
 * Errors (detail via baton_last_error(), naming the message and key):
 *   BATON_ERR_INVALID_ARG  NULL argument or limits->vocab_size == 0;
 *   BATON_ERR_FORMAT       not one msgpack map, trailing bytes, truncated,
 *                          nesting deeper than 8, missing key, wrong type,
 *                          a fixed-size bin of another size, a worker id
 *                          byte outside [A-Za-z0-9._:-], a NUL in a
 *                          string, non-string map key;
 *   BATON_ERR_UNSUPPORTED  well-formed but unknown "type";
 *   BATON_ERR_VERSION      "v" > PROTO_VERSION;
 *   BATON_ERR_OUT_OF_RANGE a value outside its range (incl. token id >=
 *                          vocab_size), an unknown enum string, a list or
 *                          string (worker id: 1..63 bytes) outside its
 *                          length bounds, a message longer than max_msg_bytes, or
 *                          inconsistent counts (free_blocks > total_blocks);
 *   BATON_ERR_NO_MEMORY.
 * Unknown keys are ignored. A key present twice: the last one wins.
 * On success `out` owns its arrays (proto_msg_free); on failure `out` is
 * untouched and nothing is leaked. */
baton_status_t proto_decode(const void *buf, size_t len, const proto_limits_t *limits,
                            proto_msg_t *out);

/* Writes this host's CPU model (the first "model name" of /proc/cpuinfo,
 * for WorkerRegister.cpu_model) into buf, NUL-terminated and truncated to
 * len bytes; "unknown" when it cannot be read. */
void proto_host_cpu_model(char *buf, size_t len);

/* Releases what a decoded message owns and zeroes it. NULL-safe. Only for
 * messages filled by proto_decode (encoder inputs belong to their caller). */
void proto_msg_free(proto_msg_t *msg);

/* ---- counters ------------------------------------------------------------ */

#define PROTO_STATUS_SLOTS 16 /* index = -status for BATON_OK..BATON_ERR_INTERNAL;
                                 anything else lands in slot 15 */

/* Decode outcomes per (message type, status); type PROTO_MSG_UNKNOWN holds
 * messages whose type could not be read. Not thread-safe: one per thread or
 * event loop, summed by the exporter. */
typedef struct proto_stats {
    uint64_t count[PROTO_MSG_COUNT + 1][PROTO_STATUS_SLOTS];
} proto_stats_t;

/* Adds one to the (type, status) counter. NULL-safe for stats. */
void proto_stats_count(proto_stats_t *stats, proto_msg_type_t type, baton_status_t status);

/* Number of decode outcomes recorded for (type, status). */
uint64_t proto_stats_get(const proto_stats_t *stats, proto_msg_type_t type,
                         baton_status_t status);

/* Total of every error (non-OK) counter. */
uint64_t proto_stats_errors(const proto_stats_t *stats);

/* proto_decode, then counts the outcome in `stats` (may be NULL) under the
 * message's type (PROTO_MSG_UNKNOWN when the type could not be read) and,
 * on failure, logs one warning line naming `peer` (may be NULL), the type
 * and the detail. Same return and ownership as proto_decode. */
baton_status_t proto_decode_counted(const void *buf, size_t len, const proto_limits_t *limits,
                                    proto_stats_t *stats, const char *peer, proto_msg_t *out);

#endif
