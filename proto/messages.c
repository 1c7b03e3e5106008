/* proto/messages.c: table-driven msgpack codec for the control plane.
 *
 * Each message (and each nested map) is described once by a schema: a list
 * of fields with their key, kind, place in the C struct, range and length
 * limit. The encoder, the validating decoder and the free walk that table,
 * so a field cannot be encoded one way and checked another. Cross-field
 * rules (counts that must agree) live in one check function per message.
 *
 * Decoding never trusts a size: a structural pre-scan walks the raw bytes
 * first and refuses any container whose declared element count exceeds the
 * bytes left (msgpack-c's unpacker would otherwise allocate count *
 * sizeof(msgpack_object) up front), nesting deeper than PROTO_MAX_DEPTH,
 * truncation and trailing bytes. Only then does msgpack_unpack_next build the
 * object tree in a zone, which the field decoders read. */
#include "proto/messages.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define PROTO_MAX_DEPTH 8

_Static_assert(sizeof(proto_role_t) == sizeof(int), "enums are stored as int");
_Static_assert(sizeof(proto_finish_reason_t) == sizeof(int), "enums are stored as int");
_Static_assert(sizeof(proto_kv_dtype_t) == sizeof(int), "enums are stored as int");

/* ---- schema description ------------------------------------------------- */

typedef enum field_kind {
    F_U32,    /* uint32_t, [lo, hi] */
    F_U64,    /* uint64_t, [lo, hi] */
    F_I32,    /* int32_t, [ilo, ihi] */
    F_BOOL,   /* bool */
    F_F32,    /* float, finite, [flo, fhi] (flo exclusive when lo_open) */
    F_ENUM,   /* int, wire string from names[] */
    F_WID,    /* char[PROTO_WORKER_ID_MAX + 1] */
    F_FIXBIN, /* uint8_t[fix] */
    F_STR,    /* char * (owned), length <= limit */
    F_BIN,    /* uint8_t * + uint32_t count, length in [min_n, limit] */
    F_U32S,   /* uint32_t * + count; elements in [lo, hi] (tokens: < vocab) */
    F_F32S,   /* float * + count; elements in [flo, fhi] */
    F_HASHES, /* proto_block_hash_t * + count */
    F_MAP,    /* nested struct inline, schema sub */
    F_MAPS,   /* array of nested structs: pointer + count */
} field_kind_t;

typedef enum field_limit {
    LIM_CONST = 0, /* use max_n */
    LIM_TOKENS,
    LIM_BLOCKS,
    LIM_ENTRIES,
    LIM_STR,
    LIM_BIN,
} field_limit_t;

struct schema;

typedef struct field {
    const char *key;
    field_kind_t kind;
    size_t off;   /* value, or array pointer */
    size_t off_n; /* uint32_t count of an array / bin */
    bool optional;
    bool omit_empty; /* encoder leaves the key out when the value is 0 / NULL / "" / empty
                        (optional additions: older peers' bytes stay identical) */
    bool vocab;   /* F_U32S / F_U32: each value < limits->vocab_size */
    bool lo_open; /* F_F32: lower bound exclusive */
    uint64_t lo, hi;
    int64_t ilo, ihi;
    double flo, fhi;
    field_limit_t lim;
    uint32_t max_n; /* LIM_CONST bound, and F_FIXBIN size */
    uint32_t min_n;
    const char *const *names; /* F_ENUM */
    uint32_t n_names;
    const struct schema *sub;
} field_t;

typedef struct schema {
    const char *name;
    size_t size; /* of the C struct */
    const field_t *fields;
    size_t n_fields;
    /* Cross-field rules after every field decoded; NULL when none. */
    baton_status_t (*check)(const void *obj, const proto_limits_t *limits);
} schema_t;

#define NF(a) (sizeof(a) / sizeof((a)[0]))
#define OFF(T, m) offsetof(T, m)
#define U32(T, m, k, l, h) {.key = k, .kind = F_U32, .off = OFF(T, m), .lo = (l), .hi = (h)}
#define U64(T, m, k, l, h) {.key = k, .kind = F_U64, .off = OFF(T, m), .lo = (l), .hi = (h)}
#define U64ANY(T, m, k) U64(T, m, k, 0, UINT64_MAX)
#define I32(T, m, k, l, h) {.key = k, .kind = F_I32, .off = OFF(T, m), .ilo = (l), .ihi = (h)}
#define BOOL(T, m, k) {.key = k, .kind = F_BOOL, .off = OFF(T, m)}
#define F32(T, m, k, l, h, open) \
    {.key = k, .kind = F_F32, .off = OFF(T, m), .flo = (l), .fhi = (h), .lo_open = (open)}
#define ENUM(T, m, k, tbl) \
    {.key = k, .kind = F_ENUM, .off = OFF(T, m), .names = tbl, .n_names = NF(tbl)}
#define WID(T, m, k) {.key = k, .kind = F_WID, .off = OFF(T, m)}
#define FIXBIN(T, m, k, n) {.key = k, .kind = F_FIXBIN, .off = OFF(T, m), .max_n = (n)}
#define STR(T, m, k) {.key = k, .kind = F_STR, .off = OFF(T, m), .lim = LIM_STR}
#define BIN(T, m, k, mn) \
    {.key = k, .kind = F_BIN, .off = OFF(T, m), .off_n = OFF(T, n_##m), .lim = LIM_BIN, .min_n = (mn)}
#define TOKENS(T, m, k, l, mn, mx)                                                        \
    {.key = k, .kind = F_U32S, .off = OFF(T, m), .off_n = OFF(T, n_##m), .vocab = true,   \
     .lo = 0, .hi = UINT32_MAX, .lim = (l), .min_n = (mn), .max_n = (mx)}
#define MAP(T, m, k, s) {.key = k, .kind = F_MAP, .off = OFF(T, m), .sub = &(s)}
#define MAPS(T, m, k, s, l, mn, mx)                                                       \
    {.key = k, .kind = F_MAPS, .off = OFF(T, m), .off_n = OFF(T, n_##m), .sub = &(s),     \
     .lim = (l), .min_n = (mn), .max_n = (mx)}

static const char *const role_names[] = {"prefill", "decode", "both"};
static const char *const dtype_names[] = {"f32", "f16", "bf16"};
static const char *const finish_names[] = {"none", "stop", "length", "abort", "error"};

/* Bin fields whose count member is not named n_<member>. */
#define BINX(T, m, mn, k, minlen) \
    {.key = k, .kind = F_BIN, .off = OFF(T, m), .off_n = OFF(T, mn), .lim = LIM_BIN, .min_n = (minlen)}

/* -- nested maps -- */

static const field_t kv_geometry_fields[] = {
    U32(proto_kv_geometry_t, n_layers, "n_layers", 1, 1024),
    U32(proto_kv_geometry_t, n_kv_heads, "n_kv_heads", 1, 1024),
    U32(proto_kv_geometry_t, head_dim, "head_dim", 1, 4096),
    U32(proto_kv_geometry_t, block_size, "block_size", 1, 4096),
    ENUM(proto_kv_geometry_t, dtype, "dtype", dtype_names),
    U64ANY(proto_kv_geometry_t, hash_seed_id, "hash_seed_id"),
};
static const schema_t kv_geometry_schema = {"kv", sizeof(proto_kv_geometry_t), kv_geometry_fields,
                                            NF(kv_geometry_fields), NULL};

static const field_t pool_region_fields[] = {
    U64ANY(proto_pool_region_t, base_addr, "base"),
    U64(proto_pool_region_t, length_bytes, "len", 1, UINT64_MAX),
    BINX(proto_pool_region_t, rkey, rkey_len, "rkey", 1),
};
static const schema_t pool_region_schema = {"pool region", sizeof(proto_pool_region_t),
                                            pool_region_fields, NF(pool_region_fields), NULL};

static const field_t pool_desc_fields[] = {
    MAPS(proto_pool_desc_t, regions, "regions", pool_region_schema, LIM_CONST, 0,
         PROTO_MAX_POOL_REGIONS),
    U32(proto_pool_desc_t, n_blocks, "n_blocks", 0, INT32_MAX),
    U64ANY(proto_pool_desc_t, block_bytes, "block_bytes"),
};
static const schema_t pool_desc_schema = {"pool", sizeof(proto_pool_desc_t), pool_desc_fields,
                                          NF(pool_desc_fields), NULL};

static const field_t logit_bias_fields[] = {
    {.key = "t", .kind = F_U32, .off = OFF(proto_logit_bias_t, token), .vocab = true,
     .lo = 0, .hi = UINT32_MAX},
    F32(proto_logit_bias_t, bias, "b", -100.0, 100.0, false),
};
static const schema_t logit_bias_schema = {"logit bias", sizeof(proto_logit_bias_t),
                                           logit_bias_fields, NF(logit_bias_fields), NULL};

static baton_status_t sampling_check(const void *obj, const proto_limits_t *limits) {
    const proto_sampling_t *s = obj;
    if (s->top_k > limits->vocab_size)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "sampling: top_k %u > vocab size %u", s->top_k,
                           limits->vocab_size);
    if (s->max_tokens > limits->max_tokens)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "sampling: max_tokens %u > limit %u",
                           s->max_tokens, limits->max_tokens);
    return BATON_OK;
}

static const field_t sampling_fields[] = {
    F32(proto_sampling_t, temperature, "temperature", 0.0, 100.0, false),
    F32(proto_sampling_t, top_p, "top_p", 0.0, 1.0, true),
    U32(proto_sampling_t, top_k, "top_k", 0, UINT32_MAX),
    F32(proto_sampling_t, min_p, "min_p", 0.0, 1.0, false),
    F32(proto_sampling_t, repetition_penalty, "repetition_penalty", 0.0, 10.0, true),
    F32(proto_sampling_t, presence_penalty, "presence_penalty", -2.0, 2.0, false),
    F32(proto_sampling_t, frequency_penalty, "frequency_penalty", -2.0, 2.0, false),
    U64ANY(proto_sampling_t, seed, "seed"),
    U32(proto_sampling_t, max_tokens, "max_tokens", 1, UINT32_MAX),
    TOKENS(proto_sampling_t, stop_token_ids, "stop_token_ids", LIM_CONST, 0, PROTO_MAX_STOP_TOKENS),
    BOOL(proto_sampling_t, logprobs, "logprobs"),
    U32(proto_sampling_t, top_logprobs, "top_logprobs", 0, PROTO_MAX_TOP_LOGPROBS),
    BOOL(proto_sampling_t, ignore_eos, "ignore_eos"),
    {.key = "logit_bias", .kind = F_MAPS, .off = OFF(proto_sampling_t, logit_bias),
     .off_n = OFF(proto_sampling_t, n_logit_bias), .optional = true, .omit_empty = true,
     .sub = &logit_bias_schema, .lim = LIM_CONST, .max_n = PROTO_MAX_LOGIT_BIAS},
};
static const schema_t sampling_schema = {"sampling", sizeof(proto_sampling_t), sampling_fields,
                                         NF(sampling_fields), sampling_check};

static const field_t timings_fields[] = {
    U64ANY(proto_timings_t, queue_us, "queue_us"),
    U64ANY(proto_timings_t, prefill_us, "prefill_us"),
    U64ANY(proto_timings_t, transfer_us, "transfer_us"),
    U64ANY(proto_timings_t, transfer_bytes, "transfer_bytes"),
    U64ANY(proto_timings_t, decode_us, "decode_us"),
};
static const schema_t timings_schema = {"timings", sizeof(proto_timings_t), timings_fields,
                                        NF(timings_fields), NULL};

static const field_t token_logprob_fields[] = {
    {.key = "t", .kind = F_U32, .off = OFF(proto_token_logprob_t, token), .vocab = true,
     .lo = 0, .hi = UINT32_MAX},
    F32(proto_token_logprob_t, logprob, "lp", -INFINITY, 0.0, false),
};
static const schema_t token_logprob_schema = {"top logprob", sizeof(proto_token_logprob_t),
                                              token_logprob_fields, NF(token_logprob_fields), NULL};

static baton_status_t token_entry_check(const void *obj, const proto_limits_t *limits) {
    const proto_token_entry_t *e = obj;
    if (e->n_logprobs != 0 && e->n_logprobs != e->n_token_ids)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "token entry: %u logprobs for %u tokens",
                           e->n_logprobs, e->n_token_ids);
    uint64_t want = (uint64_t)e->n_token_ids * e->top_k;
    if (e->n_top_logprobs != 0 && e->n_top_logprobs != want)
        return baton_error(BATON_ERR_OUT_OF_RANGE,
                           "token entry: %u top logprobs, expected %u tokens x top_k %u",
                           e->n_top_logprobs, e->n_token_ids, e->top_k);
    return BATON_OK;
}

static const field_t token_entry_fields[] = {
    FIXBIN(proto_token_entry_t, request_id, "request_id", PROTO_ID_BYTES),
    TOKENS(proto_token_entry_t, token_ids, "token_ids", LIM_TOKENS, 0, 0),
    {.key = "logprobs", .kind = F_F32S, .off = OFF(proto_token_entry_t, logprobs),
     .off_n = OFF(proto_token_entry_t, n_logprobs), .optional = true, .flo = -INFINITY,
     .fhi = 0.0, .lim = LIM_TOKENS},
    {.key = "top_k", .kind = F_U32, .off = OFF(proto_token_entry_t, top_k), .optional = true,
     .lo = 0, .hi = PROTO_MAX_TOP_LOGPROBS},
    {.key = "top_logprobs", .kind = F_MAPS, .off = OFF(proto_token_entry_t, top_logprobs),
     .off_n = OFF(proto_token_entry_t, n_top_logprobs), .optional = true,
     .sub = &token_logprob_schema, .lim = LIM_CONST,
     .max_n = 0 /* set from limits: tokens * top_k, checked in token_entry_check */},
    ENUM(proto_token_entry_t, finish_reason, "finish_reason", finish_names),
};
static const schema_t token_entry_schema = {"token entry", sizeof(proto_token_entry_t),
                                            token_entry_fields, NF(token_entry_fields),
                                            token_entry_check};

static const field_t kv_stored_fields[] = {
    FIXBIN(proto_kv_stored_t, hash, "h", PROTO_ID_BYTES),
    {.key = "p", .kind = F_FIXBIN, .off = OFF(proto_kv_stored_t, parent_hash), .optional = true,
     .max_n = PROTO_ID_BYTES},
    U32(proto_kv_stored_t, n_tokens, "n", 1, 4096),
};
static const schema_t kv_stored_schema = {"stored block", sizeof(proto_kv_stored_t),
                                          kv_stored_fields, NF(kv_stored_fields), NULL};

/* -- messages -- */

static const field_t worker_register_fields[] = {
    WID(proto_worker_register_t, worker_id, "worker_id"),
    ENUM(proto_worker_register_t, role, "role", role_names),
    U64(proto_worker_register_t, epoch, "epoch", 1, UINT64_MAX),
    STR(proto_worker_register_t, zmq_endpoint, "zmq_endpoint"),
    FIXBIN(proto_worker_register_t, model_sha256, "model_sha256", PROTO_SHA256_BYTES),
    U32(proto_worker_register_t, vocab_size, "vocab_size", 1, UINT32_MAX),
    MAP(proto_worker_register_t, kv, "kv", kv_geometry_schema),
    BINX(proto_worker_register_t, ucx_address, ucx_address_len, "ucx_address", 0),
    MAP(proto_worker_register_t, pool, "pool", pool_desc_schema),
    {.key = "kv_events_endpoint", .kind = F_STR,
     .off = OFF(proto_worker_register_t, kv_events_endpoint), .optional = true, .omit_empty = true, .lim = LIM_STR},
    {.key = "max_batch_tokens", .kind = F_U32, .off = OFF(proto_worker_register_t, max_batch_tokens), .optional = true,
     .omit_empty = true, .lo = 0, .hi = UINT32_MAX},
    {.key = "max_batch", .kind = F_U32, .off = OFF(proto_worker_register_t, max_batch), .optional = true,
     .omit_empty = true, .lo = 0, .hi = UINT32_MAX},
    {.key = "cpu_model", .kind = F_STR, .off = OFF(proto_worker_register_t, cpu_model), .optional = true,
     .omit_empty = true, .lim = LIM_STR},
    {.key = "backend", .kind = F_STR, .off = OFF(proto_worker_register_t, backend), .optional = true,
     .omit_empty = true, .lim = LIM_STR},
    {.key = "compute_dtype", .kind = F_STR, .off = OFF(proto_worker_register_t, compute_dtype), .optional = true,
     .omit_empty = true, .lim = LIM_STR},
};

static baton_status_t heartbeat_check(const void *obj, const proto_limits_t *limits) {
    const proto_worker_heartbeat_t *h = obj;
    if (h->free_blocks > h->total_blocks)
        return baton_error(BATON_ERR_OUT_OF_RANGE,
                           "worker_heartbeat: free_blocks %u > total_blocks %u", h->free_blocks,
                           h->total_blocks);
    return BATON_OK;
}

static const field_t worker_heartbeat_fields[] = {
    WID(proto_worker_heartbeat_t, worker_id, "worker_id"),
    ENUM(proto_worker_heartbeat_t, role, "role", role_names),
    U64(proto_worker_heartbeat_t, epoch, "epoch", 1, UINT64_MAX),
    U64ANY(proto_worker_heartbeat_t, timestamp_unix_us, "ts_us"),
    U64ANY(proto_worker_heartbeat_t, queued_prefill_tokens, "queued_prefill_tokens"),
    U32(proto_worker_heartbeat_t, n_running, "n_running", 0, UINT32_MAX),
    U32(proto_worker_heartbeat_t, n_waiting, "n_waiting", 0, UINT32_MAX),
    U32(proto_worker_heartbeat_t, free_blocks, "free_blocks", 0, UINT32_MAX),
    U32(proto_worker_heartbeat_t, total_blocks, "total_blocks", 0, UINT32_MAX),
    F32(proto_worker_heartbeat_t, batch_occupancy, "batch_occupancy", 0.0, 1.0, false),
    {.key = "used_blocks", .kind = F_U32, .off = OFF(proto_worker_heartbeat_t, used_blocks),
     .optional = true, .omit_empty = true, .lo = 0, .hi = UINT32_MAX},
    {.key = "cache_hit_blocks", .kind = F_U64,
     .off = OFF(proto_worker_heartbeat_t, cache_hit_blocks), .optional = true, .omit_empty = true, .lo = 0,
     .hi = UINT64_MAX},
    {.key = "cache_lookup_blocks", .kind = F_U64,
     .off = OFF(proto_worker_heartbeat_t, cache_lookup_blocks), .optional = true, .omit_empty = true, .lo = 0,
     .hi = UINT64_MAX},
    {.key = "preemptions", .kind = F_U64, .off = OFF(proto_worker_heartbeat_t, preemptions),
     .optional = true, .omit_empty = true, .lo = 0, .hi = UINT64_MAX},
    {.key = "busy_us", .kind = F_U64, .off = OFF(proto_worker_heartbeat_t, busy_us),
     .optional = true, .omit_empty = true, .lo = 0, .hi = UINT64_MAX},
    {.key = "steps", .kind = F_U64, .off = OFF(proto_worker_heartbeat_t, steps),
     .optional = true, .omit_empty = true, .lo = 0, .hi = UINT64_MAX},
    {.key = "idle_gaps", .kind = F_U64, .off = OFF(proto_worker_heartbeat_t, idle_gaps), .optional = true,
     .omit_empty = true, .lo = 0, .hi = UINT64_MAX},
    {.key = "idle_gap_us", .kind = F_U64, .off = OFF(proto_worker_heartbeat_t, idle_gap_us), .optional = true,
     .omit_empty = true, .lo = 0, .hi = UINT64_MAX},
    {.key = "idle_gap_max_us", .kind = F_U64, .off = OFF(proto_worker_heartbeat_t, idle_gap_max_us), .optional = true,
     .omit_empty = true, .lo = 0, .hi = UINT64_MAX},
};

static const field_t prefill_request_fields[] = {
    FIXBIN(proto_prefill_request_t, request_id, "request_id", PROTO_ID_BYTES),
    WID(proto_prefill_request_t, decode_worker_id, "decode_worker_id"),
    U64ANY(proto_prefill_request_t, decode_epoch, "decode_epoch"),
    TOKENS(proto_prefill_request_t, token_ids, "token_ids", LIM_TOKENS, 1, 0),
    MAP(proto_prefill_request_t, sampling, "sampling", sampling_schema),
    STR(proto_prefill_request_t, tenant, "tenant"),
    U64ANY(proto_prefill_request_t, cache_salt, "cache_salt"),
    U64ANY(proto_prefill_request_t, deadline_unix_us, "deadline_unix_us"),
    {.key = "decode_endpoint", .kind = F_STR, .off = OFF(proto_prefill_request_t, decode_endpoint),
     .optional = true, .omit_empty = true, .lim = LIM_STR},
};

static baton_status_t decode_request_check(const void *obj, const proto_limits_t *limits) {
    const proto_decode_request_t *d = obj;
    if (d->n_prompt_tokens > limits->max_tokens)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "decode_request: n_prompt_tokens %u > limit %u",
                           d->n_prompt_tokens, limits->max_tokens);
    if (d->n_blocks > limits->max_blocks)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "decode_request: n_blocks %u > limit %u",
                           d->n_blocks, limits->max_blocks);
    if (d->n_token_ids != 0 && d->n_token_ids != d->n_prompt_tokens)
        return baton_error(BATON_ERR_OUT_OF_RANGE,
                           "decode_request: %u token ids for n_prompt_tokens %u", d->n_token_ids,
                           d->n_prompt_tokens);
    return BATON_OK;
}

static const field_t decode_request_fields[] = {
    FIXBIN(proto_decode_request_t, request_id, "request_id", PROTO_ID_BYTES),
    WID(proto_decode_request_t, prefill_worker_id, "prefill_worker_id"),
    U32(proto_decode_request_t, n_prompt_tokens, "n_prompt_tokens", 1, UINT32_MAX),
    U32(proto_decode_request_t, n_blocks, "n_blocks", 1, UINT32_MAX),
    TOKENS(proto_decode_request_t, token_ids, "token_ids", LIM_TOKENS, 0, 0),
    MAP(proto_decode_request_t, sampling, "sampling", sampling_schema),
    STR(proto_decode_request_t, tenant, "tenant"),
    U64ANY(proto_decode_request_t, cache_salt, "cache_salt"),
    U64ANY(proto_decode_request_t, deadline_unix_us, "deadline_unix_us"),
    {.key = "prefill_endpoint", .kind = F_STR,
     .off = OFF(proto_decode_request_t, prefill_endpoint), .optional = true, .omit_empty = true, .lim = LIM_STR},
};

static baton_status_t kv_destination_check(const void *obj, const proto_limits_t *limits) {
    const proto_kv_destination_t *k = obj;
    if (k->n_skip_blocks > k->n_block_ids)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "kv_destination: n_skip_blocks %u > %u blocks",
                           k->n_skip_blocks, k->n_block_ids);
    return BATON_OK;
}

static const field_t kv_destination_fields[] = {
    FIXBIN(proto_kv_destination_t, request_id, "request_id", PROTO_ID_BYTES),
    WID(proto_kv_destination_t, decode_worker_id, "decode_worker_id"),
    U64(proto_kv_destination_t, decode_epoch, "decode_epoch", 1, UINT64_MAX),
    {.key = "block_ids", .kind = F_U32S, .off = OFF(proto_kv_destination_t, block_ids),
     .off_n = OFF(proto_kv_destination_t, n_block_ids), .lo = 0, .hi = INT32_MAX,
     .lim = LIM_BLOCKS, .min_n = 1},
    U32(proto_kv_destination_t, n_skip_blocks, "n_skip_blocks", 0, UINT32_MAX),
    MAP(proto_kv_destination_t, pool, "pool", pool_desc_schema),
    {.key = "ucx_address", .kind = F_BIN, .off = OFF(proto_kv_destination_t, ucx_address),
     .off_n = OFF(proto_kv_destination_t, ucx_address_len), .optional = true, .omit_empty = true, .lim = LIM_BIN},
};

static const field_t prefill_done_fields[] = {
    FIXBIN(proto_prefill_done_t, request_id, "request_id", PROTO_ID_BYTES),
    WID(proto_prefill_done_t, prefill_worker_id, "prefill_worker_id"),
    I32(proto_prefill_done_t, status, "status", -1000, 0),
    {.key = "error", .kind = F_STR, .off = OFF(proto_prefill_done_t, error), .optional = true,
     .lim = LIM_STR},
    {.key = "first_token", .kind = F_U32, .off = OFF(proto_prefill_done_t, first_token),
     .vocab = true, .lo = 0, .hi = UINT32_MAX},
    F32(proto_prefill_done_t, first_logprob, "first_logprob", -INFINITY, 0.0, false),
    {.key = "top_logprobs", .kind = F_MAPS, .off = OFF(proto_prefill_done_t, top_logprobs),
     .off_n = OFF(proto_prefill_done_t, n_top_logprobs), .optional = true,
     .sub = &token_logprob_schema, .lim = LIM_CONST, .max_n = PROTO_MAX_TOP_LOGPROBS},
    U32(proto_prefill_done_t, n_blocks_written, "n_blocks_written", 0, UINT32_MAX),
    U64ANY(proto_prefill_done_t, bytes_written, "bytes_written"),
    U64ANY(proto_prefill_done_t, queue_us, "queue_us"),
    U64ANY(proto_prefill_done_t, compute_us, "compute_us"),
    U64ANY(proto_prefill_done_t, transfer_us, "transfer_us"),
    {.key = "cached_tokens", .kind = F_U32, .off = OFF(proto_prefill_done_t, cached_tokens),
     .optional = true, .omit_empty = true, .lo = 0, .hi = UINT32_MAX},
    {.key = "device_us", .kind = F_U64, .off = OFF(proto_prefill_done_t, device_us), .optional = true,
     .omit_empty = true, .lo = 0, .hi = UINT64_MAX},
};

static const field_t token_chunk_fields[] = {
    WID(proto_token_chunk_t, worker_id, "worker_id"),
    U64ANY(proto_token_chunk_t, step_id, "step_id"),
    MAPS(proto_token_chunk_t, entries, "entries", token_entry_schema, LIM_ENTRIES, 1, 0),
};

static baton_status_t request_finished_check(const void *obj, const proto_limits_t *limits) {
    const proto_request_finished_t *r = obj;
    if (r->finish_reason == PROTO_FINISH_NONE)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "request_finished: finish_reason is none");
    if (r->cached_tokens > r->prompt_tokens)
        return baton_error(BATON_ERR_OUT_OF_RANGE,
                           "request_finished: cached_tokens %u > prompt_tokens %u",
                           r->cached_tokens, r->prompt_tokens);
    return BATON_OK;
}

static const field_t request_finished_fields[] = {
    FIXBIN(proto_request_finished_t, request_id, "request_id", PROTO_ID_BYTES),
    WID(proto_request_finished_t, worker_id, "worker_id"),
    ENUM(proto_request_finished_t, finish_reason, "finish_reason", finish_names),
    I32(proto_request_finished_t, status, "status", -1000, 0),
    {.key = "error", .kind = F_STR, .off = OFF(proto_request_finished_t, error),
     .optional = true, .lim = LIM_STR},
    U32(proto_request_finished_t, prompt_tokens, "prompt_tokens", 0, UINT32_MAX),
    U32(proto_request_finished_t, completion_tokens, "completion_tokens", 0, UINT32_MAX),
    U32(proto_request_finished_t, cached_tokens, "cached_tokens", 0, UINT32_MAX),
    MAP(proto_request_finished_t, timings, "timings", timings_schema),
    {.key = "prefill_device_us", .kind = F_U64, .off = OFF(proto_request_finished_t, prefill_device_us), .optional = true,
     .omit_empty = true, .lo = 0, .hi = UINT64_MAX},
    {.key = "decode_device_us", .kind = F_U64, .off = OFF(proto_request_finished_t, decode_device_us), .optional = true,
     .omit_empty = true, .lo = 0, .hi = UINT64_MAX},
};

static const field_t abort_fields[] = {
    FIXBIN(proto_abort_t, request_id, "request_id", PROTO_ID_BYTES),
    STR(proto_abort_t, reason, "reason"),
};

static const field_t kv_event_fields[] = {
    WID(proto_kv_event_t, worker_id, "worker_id"),
    U64(proto_kv_event_t, epoch, "epoch", 1, UINT64_MAX),
    U64ANY(proto_kv_event_t, seq, "seq"),
    BOOL(proto_kv_event_t, full, "full"),
    U32(proto_kv_event_t, full_part, "full_part", 0, UINT32_MAX),
    BOOL(proto_kv_event_t, full_last, "full_last"),
    MAPS(proto_kv_event_t, stored, "stored", kv_stored_schema, LIM_BLOCKS, 0, 0),
    {.key = "removed", .kind = F_HASHES, .off = OFF(proto_kv_event_t, removed),
     .off_n = OFF(proto_kv_event_t, n_removed), .lim = LIM_BLOCKS},
};

static const field_t kv_resync_fields[] = {
    WID(proto_kv_resync_t, worker_id, "worker_id"),
    U64ANY(proto_kv_resync_t, epoch, "epoch"),
    U64ANY(proto_kv_resync_t, last_seq, "last_seq"),
};

#define MSG_SCHEMA(name, T, fields, check) {name, sizeof(T), fields, NF(fields), check}

static const schema_t msg_schemas[PROTO_MSG_COUNT] = {
    [PROTO_MSG_WORKER_REGISTER] = MSG_SCHEMA("worker_register", proto_worker_register_t,
                                             worker_register_fields, NULL),
    [PROTO_MSG_WORKER_HEARTBEAT] = MSG_SCHEMA("worker_heartbeat", proto_worker_heartbeat_t,
                                              worker_heartbeat_fields, heartbeat_check),
    [PROTO_MSG_PREFILL_REQUEST] = MSG_SCHEMA("prefill_request", proto_prefill_request_t,
                                             prefill_request_fields, NULL),
    [PROTO_MSG_DECODE_REQUEST] = MSG_SCHEMA("decode_request", proto_decode_request_t,
                                            decode_request_fields, decode_request_check),
    [PROTO_MSG_KV_DESTINATION] = MSG_SCHEMA("kv_destination", proto_kv_destination_t,
                                            kv_destination_fields, kv_destination_check),
    [PROTO_MSG_PREFILL_DONE] = MSG_SCHEMA("prefill_done", proto_prefill_done_t,
                                          prefill_done_fields, NULL),
    [PROTO_MSG_TOKEN_CHUNK] = MSG_SCHEMA("token_chunk", proto_token_chunk_t, token_chunk_fields,
                                         NULL),
    [PROTO_MSG_REQUEST_FINISHED] = MSG_SCHEMA("request_finished", proto_request_finished_t,
                                              request_finished_fields, request_finished_check),
    [PROTO_MSG_ABORT] = MSG_SCHEMA("abort", proto_abort_t, abort_fields, NULL),
    [PROTO_MSG_KV_EVENT] = MSG_SCHEMA("kv_event", proto_kv_event_t, kv_event_fields, NULL),
    [PROTO_MSG_KV_RESYNC] = MSG_SCHEMA("kv_resync", proto_kv_resync_t, kv_resync_fields, NULL),
};

const char *proto_msg_type_name(proto_msg_type_t type) {
    if ((unsigned)type < PROTO_MSG_COUNT) return msg_schemas[type].name;
    return "unknown";
}

void proto_limits_default(uint32_t vocab_size, proto_limits_t *out) {
    if (!out) return;
    proto_limits_t l = {
        .vocab_size = vocab_size,
        .max_tokens = 131072,
        .max_blocks = 65536,
        .max_entries = 4096,
        .max_str_bytes = 4096,
        .max_bin_bytes = 65536,
        .max_msg_bytes = 16u << 20,
    };
    *out = l;
}

/* ---- encoding ----------------------------------------------------------- */

static void *at(const void *base, size_t off) { return (char *)base + off; }

static uint32_t count_at(const void *base, size_t off) {
    uint32_t n;
    memcpy(&n, at(base, off), sizeof(n));
    return n;
}

static void *ptr_at(const void *base, size_t off) {
    void *p;
    memcpy(&p, at(base, off), sizeof(p));
    return p;
}

static baton_status_t pk_err(int rc) {
    return rc == 0 ? BATON_OK : baton_error(BATON_ERR_NO_MEMORY, "proto: sbuffer grow failed");
}

static int pack_key(msgpack_packer *pk, const char *key) {
    return msgpack_pack_str_with_body(pk, key, strlen(key));
}

static baton_status_t encode_map(msgpack_packer *pk, const schema_t *s, const void *obj);

static baton_status_t encode_field(msgpack_packer *pk, const field_t *f, const void *obj) {
    const void *p = at(obj, f->off);
    int rc = 0;
    switch (f->kind) {
    case F_U32: rc = msgpack_pack_uint32(pk, *(const uint32_t *)p); break;
    case F_U64: rc = msgpack_pack_uint64(pk, *(const uint64_t *)p); break;
    case F_I32: rc = msgpack_pack_int32(pk, *(const int32_t *)p); break;
    case F_BOOL: rc = *(const bool *)p ? msgpack_pack_true(pk) : msgpack_pack_false(pk); break;
    case F_F32: rc = msgpack_pack_float(pk, *(const float *)p); break;
    case F_ENUM: {
        int v = *(const int *)p;
        if (v < 0 || (uint32_t)v >= f->n_names)
            return baton_error(BATON_ERR_INVALID_ARG, "proto encode: %s = %d is not a valid value",
                               f->key, v);
        rc = pack_key(pk, f->names[v]);
        break;
    }
    case F_WID: {
        size_t n = strnlen(p, PROTO_WORKER_ID_MAX + 1);
        if (n > PROTO_WORKER_ID_MAX)
            return baton_error(BATON_ERR_INVALID_ARG, "proto encode: %s is not terminated", f->key);
        rc = msgpack_pack_str_with_body(pk, p, n);
        break;
    }
    case F_FIXBIN: rc = msgpack_pack_bin_with_body(pk, p, f->max_n); break;
    case F_STR: {
        const char *str = ptr_at(obj, f->off);
        if (!str) str = "";
        rc = msgpack_pack_str_with_body(pk, str, strlen(str));
        break;
    }
    case F_BIN:
    case F_U32S:
    case F_F32S:
    case F_HASHES:
    case F_MAPS: {
        const void *arr = ptr_at(obj, f->off);
        uint32_t n = count_at(obj, f->off_n);
        if (n && !arr)
            return baton_error(BATON_ERR_INVALID_ARG, "proto encode: %s is NULL with %u entries",
                               f->key, n);
        if (f->kind == F_BIN) {
            rc = msgpack_pack_bin_with_body(pk, arr ? arr : "", n);
            break;
        }
        if ((rc = msgpack_pack_array(pk, n))) break;
        for (uint32_t i = 0; i < n && rc == 0; i++) {
            if (f->kind == F_U32S) rc = msgpack_pack_uint32(pk, ((const uint32_t *)arr)[i]);
            else if (f->kind == F_F32S) rc = msgpack_pack_float(pk, ((const float *)arr)[i]);
            else if (f->kind == F_HASHES)
                rc = msgpack_pack_bin_with_body(pk, ((const proto_block_hash_t *)arr)[i].bytes,
                                                PROTO_ID_BYTES);
            else {
                baton_status_t st =
                    encode_map(pk, f->sub, (const char *)arr + (size_t)i * f->sub->size);
                if (st) return st;
            }
        }
        break;
    }
    case F_MAP: return encode_map(pk, f->sub, p);
    }
    return pk_err(rc);
}

static bool field_omitted(const field_t *f, const void *obj) {
    if (!f->omit_empty) return false;
    switch (f->kind) {
    case F_U32: return *(const uint32_t *)at(obj, f->off) == 0;
    case F_U64: return *(const uint64_t *)at(obj, f->off) == 0;
    case F_STR: {
        const char *str = ptr_at(obj, f->off);
        return !str || !*str;
    }
    case F_BIN:
    case F_MAPS: return count_at(obj, f->off_n) == 0;
    default: return false;
    }
}

static uint32_t n_encoded_fields(const schema_t *s, const void *obj) {
    uint32_t n = 0;
    for (size_t i = 0; i < s->n_fields; i++) n += !field_omitted(&s->fields[i], obj);
    return n;
}

static baton_status_t encode_fields(msgpack_packer *pk, const schema_t *s, const void *obj) {
    for (size_t i = 0; i < s->n_fields; i++) {
        if (field_omitted(&s->fields[i], obj)) continue;
        baton_status_t st = pk_err(pack_key(pk, s->fields[i].key));
        if (st) return st;
        if ((st = encode_field(pk, &s->fields[i], obj))) return st;
    }
    return BATON_OK;
}

static baton_status_t encode_map(msgpack_packer *pk, const schema_t *s, const void *obj) {
    baton_status_t st = pk_err(msgpack_pack_map(pk, n_encoded_fields(s, obj)));
    return st ? st : encode_fields(pk, s, obj);
}

baton_status_t proto_encode(const proto_msg_t *msg, msgpack_sbuffer *sbuf) {
    if (!msg || !sbuf) return baton_error(BATON_ERR_INVALID_ARG, "proto_encode: NULL argument");
    if ((unsigned)msg->type >= PROTO_MSG_COUNT)
        return baton_error(BATON_ERR_INVALID_ARG, "proto_encode: unknown type %d", msg->type);
    const schema_t *s = &msg_schemas[msg->type];
    msgpack_packer pk;
    msgpack_packer_init(&pk, sbuf, msgpack_sbuffer_write);
    baton_status_t st = pk_err(msgpack_pack_map(&pk, n_encoded_fields(s, &msg->u) + 2));
    if (!st) st = pk_err(pack_key(&pk, "type"));
    if (!st) st = pk_err(pack_key(&pk, s->name));
    if (!st) st = pk_err(pack_key(&pk, "v"));
    if (!st) st = pk_err(msgpack_pack_uint32(&pk, PROTO_VERSION));
    if (!st) st = encode_fields(&pk, s, &msg->u);
    return st;
}

#define TYPED_ENCODER(fn, T, TYPE, member)                                   \
    baton_status_t fn(const T *m, msgpack_sbuffer *sbuf) {                   \
        if (!m) return baton_error(BATON_ERR_INVALID_ARG, #fn ": NULL message"); \
        proto_msg_t msg;                                                     \
        memset(&msg, 0, sizeof(msg));                                        \
        msg.type = TYPE;                                                     \
        msg.u.member = *m;                                                   \
        return proto_encode(&msg, sbuf);                                     \
    }

TYPED_ENCODER(proto_encode_worker_register, proto_worker_register_t, PROTO_MSG_WORKER_REGISTER,
              worker_register)
TYPED_ENCODER(proto_encode_worker_heartbeat, proto_worker_heartbeat_t,
              PROTO_MSG_WORKER_HEARTBEAT, worker_heartbeat)
TYPED_ENCODER(proto_encode_prefill_request, proto_prefill_request_t, PROTO_MSG_PREFILL_REQUEST,
              prefill_request)
TYPED_ENCODER(proto_encode_decode_request, proto_decode_request_t, PROTO_MSG_DECODE_REQUEST,
              decode_request)
TYPED_ENCODER(proto_encode_kv_destination, proto_kv_destination_t, PROTO_MSG_KV_DESTINATION,
              kv_destination)
TYPED_ENCODER(proto_encode_prefill_done, proto_prefill_done_t, PROTO_MSG_PREFILL_DONE,
              prefill_done)
TYPED_ENCODER(proto_encode_token_chunk, proto_token_chunk_t, PROTO_MSG_TOKEN_CHUNK, token_chunk)
TYPED_ENCODER(proto_encode_request_finished, proto_request_finished_t,
              PROTO_MSG_REQUEST_FINISHED, request_finished)
TYPED_ENCODER(proto_encode_abort, proto_abort_t, PROTO_MSG_ABORT, abort)
TYPED_ENCODER(proto_encode_kv_event, proto_kv_event_t, PROTO_MSG_KV_EVENT, kv_event)
TYPED_ENCODER(proto_encode_kv_resync, proto_kv_resync_t, PROTO_MSG_KV_RESYNC, kv_resync)

/* ---- free --------------------------------------------------------------- */

static void free_fields(const schema_t *s, void *obj) {
    for (size_t i = 0; i < s->n_fields; i++) {
        const field_t *f = &s->fields[i];
        switch (f->kind) {
        case F_STR:
        case F_BIN:
        case F_U32S:
        case F_F32S:
        case F_HASHES: free(ptr_at(obj, f->off)); break;
        case F_MAP: free_fields(f->sub, at(obj, f->off)); break;
        case F_MAPS: {
            char *arr = ptr_at(obj, f->off);
            uint32_t n = count_at(obj, f->off_n);
            for (uint32_t j = 0; arr && j < n; j++) free_fields(f->sub, arr + (size_t)j * f->sub->size);
            free(arr);
            break;
        }
        default: break;
        }
    }
}

void proto_msg_free(proto_msg_t *msg) {
    if (!msg) return;
    if ((unsigned)msg->type < PROTO_MSG_COUNT) free_fields(&msg_schemas[msg->type], &msg->u);
    memset(msg, 0, sizeof(*msg));
}

/* ---- structural pre-scan ------------------------------------------------ */

typedef struct scan {
    const uint8_t *p;
    size_t len, pos;
} scan_t;

static bool scan_need(scan_t *s, size_t n) { return s->len - s->pos >= n; }

static uint64_t scan_be(scan_t *s, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v = (v << 8) | s->p[s->pos + i];
    s->pos += n;
    return v;
}

/* Skips one msgpack object at s->pos, refusing truncation, the reserved byte
 * 0xc1, nesting beyond PROTO_MAX_DEPTH and element counts larger than the
 * bytes left. */
static baton_status_t scan_object(scan_t *s, int depth) {
    if (depth > PROTO_MAX_DEPTH)
        return baton_error(BATON_ERR_FORMAT, "proto: nesting deeper than %d", PROTO_MAX_DEPTH);
    if (!scan_need(s, 1)) return baton_error(BATON_ERR_FORMAT, "proto: truncated message");
    uint8_t b = s->p[s->pos++];
    uint64_t skip = 0, items = 0;
    size_t lenbytes = 0;
    bool container = false, map = false;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) return BATON_OK;
    if ((b & 0xf0) == 0x80) { items = b & 0x0f; container = map = true; }
    else if ((b & 0xf0) == 0x90) { items = b & 0x0f; container = true; }
    else if ((b & 0xe0) == 0xa0) skip = b & 0x1f;
    else {
        switch (b) {
        case 0xc4: case 0xd9: lenbytes = 1; break;                       /* bin8, str8 */
        case 0xc5: case 0xda: lenbytes = 2; break;                       /* bin16, str16 */
        case 0xc6: case 0xdb: lenbytes = 4; break;                       /* bin32, str32 */
        case 0xc7: lenbytes = 1; skip = 1; break;                        /* ext8 (+type) */
        case 0xc8: lenbytes = 2; skip = 1; break;
        case 0xc9: lenbytes = 4; skip = 1; break;
        case 0xca: skip = 4; break;                                      /* float32 */
        case 0xcb: skip = 8; break;                                      /* float64 */
        case 0xcc: case 0xd0: skip = 1; break;
        case 0xcd: case 0xd1: skip = 2; break;
        case 0xce: case 0xd2: skip = 4; break;
        case 0xcf: case 0xd3: skip = 8; break;
        case 0xd4: skip = 2; break;                                      /* fixext: type + data */
        case 0xd5: skip = 3; break;
        case 0xd6: skip = 5; break;
        case 0xd7: skip = 9; break;
        case 0xd8: skip = 17; break;
        case 0xdc: case 0xde: lenbytes = 2; container = true; map = b == 0xde; break;
        case 0xdd: case 0xdf: lenbytes = 4; container = true; map = b == 0xdf; break;
        default: return baton_error(BATON_ERR_FORMAT, "proto: invalid msgpack byte 0x%02x", b);
        }
        if (lenbytes) {
            if (!scan_need(s, lenbytes))
                return baton_error(BATON_ERR_FORMAT, "proto: truncated message");
            uint64_t n = scan_be(s, lenbytes);
            if (container) items = n;
            else skip += n;
        }
    }
    if (!container) {
        if (!scan_need(s, skip)) return baton_error(BATON_ERR_FORMAT, "proto: truncated message");
        s->pos += skip;
        return BATON_OK;
    }
    uint64_t n_objects = map ? items * 2 : items;
    if (n_objects > s->len - s->pos)
        return baton_error(BATON_ERR_FORMAT, "proto: container of %llu entries in %zu bytes",
                           (unsigned long long)items, s->len - s->pos);
    for (uint64_t i = 0; i < n_objects; i++) {
        baton_status_t st = scan_object(s, depth + 1);
        if (st) return st;
    }
    return BATON_OK;
}

/* ---- decoding ----------------------------------------------------------- */

typedef struct dec {
    const proto_limits_t *limits;
    const char *msg; /* message name for details */
} dec_t;

static bool key_is(const msgpack_object *k, const char *key) {
    size_t n = strlen(key);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && memcmp(k->via.str.ptr, key, n) == 0;
}

/* Last value of `key` in map `m`, NULL when absent. */
static const msgpack_object *map_get(const msgpack_object *m, const char *key) {
    const msgpack_object *v = NULL;
    for (uint32_t i = 0; i < m->via.map.size; i++)
        if (key_is(&m->via.map.ptr[i].key, key)) v = &m->via.map.ptr[i].val;
    return v;
}

static baton_status_t check_keys(const dec_t *d, const msgpack_object *m) {
    for (uint32_t i = 0; i < m->via.map.size; i++)
        if (m->via.map.ptr[i].key.type != MSGPACK_OBJECT_STR)
            return baton_error(BATON_ERR_FORMAT, "%s: map key %u is not a string", d->msg, i);
    return BATON_OK;
}

static uint32_t field_limit(const dec_t *d, const field_t *f) {
    switch (f->lim) {
    case LIM_TOKENS: return d->limits->max_tokens;
    case LIM_BLOCKS: return d->limits->max_blocks;
    case LIM_ENTRIES: return d->limits->max_entries;
    case LIM_STR: return d->limits->max_str_bytes;
    case LIM_BIN: return d->limits->max_bin_bytes;
    case LIM_CONST: break;
    }
    return f->max_n ? f->max_n : UINT32_MAX;
}

#define WRONG_TYPE(d, f, what) \
    baton_error(BATON_ERR_FORMAT, "%s: %s is not %s", (d)->msg, (f)->key, what)

/* Reads an integer object as a signed 128-bit-safe pair: negative flag and
 * magnitude. */
static baton_status_t get_uint(const dec_t *d, const field_t *f, const msgpack_object *o,
                               uint64_t lo, uint64_t hi, bool vocab, uint64_t *out) {
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "%s: %s = %lld is negative", d->msg, f->key,
                           (long long)o->via.i64);
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return WRONG_TYPE(d, f, "an unsigned integer");
    uint64_t v = o->via.u64;
    if (v < lo || v > hi)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "%s: %s = %llu outside [%llu, %llu]", d->msg,
                           f->key, (unsigned long long)v, (unsigned long long)lo,
                           (unsigned long long)hi);
    if (vocab && v >= d->limits->vocab_size)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "%s: %s token id %llu >= vocab size %u", d->msg,
                           f->key, (unsigned long long)v, d->limits->vocab_size);
    *out = v;
    return BATON_OK;
}

static baton_status_t get_float(const dec_t *d, const field_t *f, const msgpack_object *o,
                                float *out) {
    double v;
    switch (o->type) {
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: v = o->via.f64; break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER: v = (double)o->via.u64; break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: v = (double)o->via.i64; break;
    default: return WRONG_TYPE(d, f, "a number");
    }
    float fv = (float)v;
    if (!isfinite(fv) || fv < f->flo || fv > f->fhi || (f->lo_open && fv == f->flo))
        return baton_error(BATON_ERR_OUT_OF_RANGE, "%s: %s = %g outside %c%g, %g]", d->msg, f->key,
                           v, f->lo_open ? '(' : '[', f->flo, f->fhi);
    *out = fv;
    return BATON_OK;
}

static baton_status_t decode_map(const dec_t *d, const schema_t *s, const msgpack_object *m,
                                 void *obj);

static baton_status_t check_count(const dec_t *d, const field_t *f, uint32_t n) {
    uint32_t lim = field_limit(d, f);
    if (n > lim)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "%s: %s has %u entries, limit %u", d->msg,
                           f->key, n, lim);
    if (n < f->min_n)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "%s: %s has %u entries, at least %u needed",
                           d->msg, f->key, n, f->min_n);
    return BATON_OK;
}

/* Decodes one field value `o` into obj. On failure nothing is left
 * allocated for this field. */
static baton_status_t decode_field(const dec_t *d, const field_t *f, const msgpack_object *o,
                                   void *obj) {
    void *p = at(obj, f->off);
    baton_status_t st;
    switch (f->kind) {
    case F_U32: {
        uint64_t v;
        if ((st = get_uint(d, f, o, f->lo, f->hi, f->vocab, &v))) return st;
        *(uint32_t *)p = (uint32_t)v;
        return BATON_OK;
    }
    case F_U64: return get_uint(d, f, o, f->lo, f->hi, false, (uint64_t *)p);
    case F_I32: {
        int64_t v;
        if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            v = o->via.u64 > INT64_MAX ? INT64_MAX : (int64_t)o->via.u64;
        else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) v = o->via.i64;
        else return WRONG_TYPE(d, f, "an integer");
        if (v < f->ilo || v > f->ihi)
            return baton_error(BATON_ERR_OUT_OF_RANGE, "%s: %s = %lld outside [%lld, %lld]",
                               d->msg, f->key, (long long)v, (long long)f->ilo, (long long)f->ihi);
        *(int32_t *)p = (int32_t)v;
        return BATON_OK;
    }
    case F_BOOL:
        if (o->type != MSGPACK_OBJECT_BOOLEAN) return WRONG_TYPE(d, f, "a boolean");
        *(bool *)p = o->via.boolean;
        return BATON_OK;
    case F_F32: return get_float(d, f, o, (float *)p);
    case F_ENUM:
        if (o->type != MSGPACK_OBJECT_STR) return WRONG_TYPE(d, f, "a string");
        for (uint32_t i = 0; i < f->n_names; i++) {
            if (key_is(o, f->names[i])) {
                *(int *)p = (int)i;
                return BATON_OK;
            }
        }
        return baton_error(BATON_ERR_OUT_OF_RANGE, "%s: %s = \"%.*s\" is not a known value",
                           d->msg, f->key, (int)(o->via.str.size > 32 ? 32 : o->via.str.size),
                           o->via.str.ptr);
    case F_WID: {
        if (o->type != MSGPACK_OBJECT_STR) return WRONG_TYPE(d, f, "a string");
        uint32_t n = o->via.str.size;
        if (n == 0 || n > PROTO_WORKER_ID_MAX)
            return baton_error(BATON_ERR_OUT_OF_RANGE, "%s: %s has %u bytes, want 1..%d", d->msg,
                               f->key, n, PROTO_WORKER_ID_MAX);
        for (uint32_t i = 0; i < n; i++) {
            char c = o->via.str.ptr[i];
            bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == ':' || c == '-';
            if (!ok)
                return baton_error(BATON_ERR_FORMAT, "%s: %s has byte 0x%02x outside [A-Za-z0-9._:-]",
                                   d->msg, f->key, (uint8_t)c);
        }
        memcpy(p, o->via.str.ptr, n);
        ((char *)p)[n] = '\0';
        return BATON_OK;
    }
    case F_FIXBIN:
        if (o->type != MSGPACK_OBJECT_BIN || o->via.bin.size != f->max_n)
            return baton_error(BATON_ERR_FORMAT, "%s: %s is not a %u-byte bin", d->msg, f->key,
                               f->max_n);
        memcpy(p, o->via.bin.ptr, f->max_n);
        return BATON_OK;
    case F_STR: {
        if (o->type != MSGPACK_OBJECT_STR) return WRONG_TYPE(d, f, "a string");
        uint32_t n = o->via.str.size;
        if ((st = check_count(d, f, n))) return st;
        if (memchr(o->via.str.ptr, 0, n))
            return baton_error(BATON_ERR_FORMAT, "%s: %s contains a NUL byte", d->msg, f->key);
        char *str = malloc((size_t)n + 1);
        if (!str) return baton_error(BATON_ERR_NO_MEMORY, "%s: %s", d->msg, f->key);
        memcpy(str, o->via.str.ptr, n);
        str[n] = '\0';
        memcpy(p, &str, sizeof(str));
        return BATON_OK;
    }
    case F_BIN: {
        if (o->type != MSGPACK_OBJECT_BIN) return WRONG_TYPE(d, f, "a bin");
        uint32_t n = o->via.bin.size;
        if ((st = check_count(d, f, n))) return st;
        uint8_t *b = malloc(n ? n : 1);
        if (!b) return baton_error(BATON_ERR_NO_MEMORY, "%s: %s", d->msg, f->key);
        if (n) memcpy(b, o->via.bin.ptr, n);
        memcpy(p, &b, sizeof(b));
        memcpy(at(obj, f->off_n), &n, sizeof(n));
        return BATON_OK;
    }
    case F_U32S:
    case F_F32S:
    case F_HASHES:
    case F_MAPS: {
        if (o->type != MSGPACK_OBJECT_ARRAY) return WRONG_TYPE(d, f, "an array");
        uint32_t n = o->via.array.size;
        if ((st = check_count(d, f, n))) return st;
        size_t elem = f->kind == F_U32S   ? sizeof(uint32_t)
                      : f->kind == F_F32S ? sizeof(float)
                      : f->kind == F_HASHES ? sizeof(proto_block_hash_t)
                                            : f->sub->size;
        char *arr = calloc(n ? n : 1, elem);
        if (!arr) return baton_error(BATON_ERR_NO_MEMORY, "%s: %s (%u entries)", d->msg, f->key, n);
        st = BATON_OK;
        uint32_t done = 0;
        for (; done < n && !st; done++) {
            const msgpack_object *e = &o->via.array.ptr[done];
            char *dst = arr + (size_t)done * elem;
            if (f->kind == F_U32S) {
                uint64_t v;
                st = get_uint(d, f, e, f->lo, f->hi, f->vocab, &v);
                if (!st) *(uint32_t *)dst = (uint32_t)v;
            } else if (f->kind == F_F32S) {
                st = get_float(d, f, e, (float *)dst);
            } else if (f->kind == F_HASHES) {
                if (e->type != MSGPACK_OBJECT_BIN || e->via.bin.size != PROTO_ID_BYTES)
                    st = baton_error(BATON_ERR_FORMAT, "%s: %s[%u] is not a %d-byte bin", d->msg,
                                     f->key, done, PROTO_ID_BYTES);
                else memcpy(dst, e->via.bin.ptr, PROTO_ID_BYTES);
            } else {
                st = decode_map(d, f->sub, e, dst);
            }
        }
        if (st) {
            /* decode_map cleans up the element that failed; free the ones before. */
            if (f->kind == F_MAPS)
                for (uint32_t j = 0; j + 1 < done; j++) free_fields(f->sub, arr + (size_t)j * elem);
            free(arr);
            return st;
        }
        memcpy(p, &arr, sizeof(arr));
        memcpy(at(obj, f->off_n), &n, sizeof(n));
        return BATON_OK;
    }
    case F_MAP: return decode_map(d, f->sub, o, p);
    }
    return baton_error(BATON_ERR_INTERNAL, "%s: %s has an unknown field kind", d->msg, f->key);
}

/* Fills a zeroed `obj` from map `m`. On failure obj owns nothing. */
static baton_status_t decode_fields(const dec_t *d, const schema_t *s, const msgpack_object *m,
                                    void *obj) {
    baton_status_t st = BATON_OK;
    for (size_t i = 0; i < s->n_fields && !st; i++) {
        const field_t *f = &s->fields[i];
        const msgpack_object *v = map_get(m, f->key);
        if (v) {
            st = decode_field(d, f, v, obj);
        } else if (!f->optional) {
            st = baton_error(BATON_ERR_FORMAT, "%s: missing %s", d->msg, f->key);
        } else if (f->kind == F_STR) {
            char *empty = calloc(1, 1);
            if (!empty) st = baton_error(BATON_ERR_NO_MEMORY, "%s: %s", d->msg, f->key);
            else memcpy(at(obj, f->off), &empty, sizeof(empty));
        }
    }
    if (!st && s->check) st = s->check(obj, d->limits);
    if (st) {
        /* Unset pointers are NULL (obj was zeroed). Zero again so that a
         * parent's cleanup does not see the freed pointers. */
        free_fields(s, obj);
        memset(obj, 0, s->size);
    }
    return st;
}

static baton_status_t decode_map(const dec_t *d, const schema_t *s, const msgpack_object *m,
                                 void *obj) {
    if (m->type != MSGPACK_OBJECT_MAP)
        return baton_error(BATON_ERR_FORMAT, "%s: %s is not a map", d->msg, s->name);
    baton_status_t st = check_keys(d, m);
    if (st) return st;
    memset(obj, 0, s->size);
    return decode_fields(d, s, m, obj);
}

/* Decodes into *out; *type_out gets the message type as soon as it is known
 * (PROTO_MSG_UNKNOWN before). */
static baton_status_t decode_impl(const void *buf, size_t len, const proto_limits_t *limits,
                                  proto_msg_t *out, proto_msg_type_t *type_out) {
    *type_out = PROTO_MSG_UNKNOWN;
    if (!buf || !limits || !out)
        return baton_error(BATON_ERR_INVALID_ARG, "proto_decode: NULL argument");
    if (limits->vocab_size == 0)
        return baton_error(BATON_ERR_INVALID_ARG, "proto_decode: limits.vocab_size is 0");
    if (len > limits->max_msg_bytes)
        return baton_error(BATON_ERR_OUT_OF_RANGE, "proto: message of %zu bytes > limit %u", len,
                           limits->max_msg_bytes);
    if (len == 0) return baton_error(BATON_ERR_FORMAT, "proto: empty message");
    scan_t sc = {buf, len, 0};
    baton_status_t st = scan_object(&sc, 0);
    if (st) return st;
    if (sc.pos != len)
        return baton_error(BATON_ERR_FORMAT, "proto: %zu trailing bytes after the message",
                           len - sc.pos);

    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    msgpack_unpack_return rc = msgpack_unpack_next(&up, buf, len, &off);
    if (rc == MSGPACK_UNPACK_NOMEM_ERROR) {
        st = baton_error(BATON_ERR_NO_MEMORY, "proto: unpacking %zu bytes", len);
        goto out_unpacked;
    }
    if (rc != MSGPACK_UNPACK_SUCCESS || off != len) {
        st = baton_error(BATON_ERR_FORMAT, "proto: msgpack parse error (%d)", (int)rc);
        goto out_unpacked;
    }
    const msgpack_object *root = &up.data;
    dec_t d = {limits, "proto"};
    if (root->type != MSGPACK_OBJECT_MAP) {
        st = baton_error(BATON_ERR_FORMAT, "proto: message is not a map");
        goto out_unpacked;
    }
    if ((st = check_keys(&d, root))) goto out_unpacked;

    const msgpack_object *t = map_get(root, "type");
    proto_msg_type_t type = PROTO_MSG_UNKNOWN;
    if (!t || t->type != MSGPACK_OBJECT_STR) {
        st = baton_error(BATON_ERR_FORMAT, "proto: %s \"type\"", t ? "non-string" : "missing");
        goto out_unpacked;
    }
    for (int i = 0; i < PROTO_MSG_COUNT; i++)
        if (key_is(t, msg_schemas[i].name)) type = (proto_msg_type_t)i;
    *type_out = type;

    const msgpack_object *v = map_get(root, "v");
    if (!v || (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER &&
               v->type != MSGPACK_OBJECT_NEGATIVE_INTEGER)) {
        st = baton_error(BATON_ERR_FORMAT, "proto: %s \"v\"", v ? "non-integer" : "missing");
        goto out_unpacked;
    }
    if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER || v->via.u64 == 0) {
        st = baton_error(BATON_ERR_OUT_OF_RANGE, "proto: \"v\" must be >= 1");
        goto out_unpacked;
    }
    if (v->via.u64 > PROTO_VERSION) {
        st = baton_error(BATON_ERR_VERSION, "proto: schema version %llu is newer than %d",
                         (unsigned long long)v->via.u64, PROTO_VERSION);
        goto out_unpacked;
    }
    if (type == PROTO_MSG_UNKNOWN) {
        st = baton_error(BATON_ERR_UNSUPPORTED, "proto: unknown message type \"%.*s\"",
                         (int)(t->via.str.size > 32 ? 32 : t->via.str.size), t->via.str.ptr);
        goto out_unpacked;
    }

    proto_msg_t msg;
    memset(&msg, 0, sizeof(msg));
    msg.type = type;
    d.msg = msg_schemas[type].name;
    st = decode_fields(&d, &msg_schemas[type], root, &msg.u);
    if (!st) *out = msg;

out_unpacked:
    msgpack_unpacked_destroy(&up);
    return st;
}

baton_status_t proto_decode(const void *buf, size_t len, const proto_limits_t *limits,
                            proto_msg_t *out) {
    proto_msg_type_t type;
    return decode_impl(buf, len, limits, out, &type);
}

/* ---- counters ----------------------------------------------------------- */

static int status_slot(baton_status_t status) {
    int s = -(int)status;
    return s >= 0 && s < PROTO_STATUS_SLOTS - 1 ? s : PROTO_STATUS_SLOTS - 1;
}

void proto_stats_count(proto_stats_t *stats, proto_msg_type_t type, baton_status_t status) {
    if (!stats) return;
    if ((unsigned)type > PROTO_MSG_COUNT) type = PROTO_MSG_UNKNOWN;
    stats->count[type][status_slot(status)]++;
}

uint64_t proto_stats_get(const proto_stats_t *stats, proto_msg_type_t type,
                         baton_status_t status) {
    if (!stats || (unsigned)type > PROTO_MSG_COUNT) return 0;
    return stats->count[type][status_slot(status)];
}

uint64_t proto_stats_errors(const proto_stats_t *stats) {
    uint64_t n = 0;
    if (!stats) return 0;
    for (int t = 0; t <= PROTO_MSG_COUNT; t++)
        for (int s = 1; s < PROTO_STATUS_SLOTS; s++) n += stats->count[t][s];
    return n;
}

baton_status_t proto_decode_counted(const void *buf, size_t len, const proto_limits_t *limits,
                                    proto_stats_t *stats, const char *peer, proto_msg_t *out) {
    proto_msg_type_t type;
    baton_status_t st = decode_impl(buf, len, limits, out, &type);
    proto_stats_count(stats, type, st);
    if (st)
        LOG_WARN("proto", "dropped %s message of %zu bytes from %s: %s (%s)",
                 proto_msg_type_name(type), len, peer ? peer : "?", baton_status_str(st),
                 baton_last_error());
    return st;
}

void proto_host_cpu_model(char *buf, size_t len) {
    if (!buf || len == 0) return;
    snprintf(buf, len, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *v = strchr(line, ':');
        if (!v) continue;
        v++;
        while (*v == ' ' || *v == '\t') v++;
        size_t n = strcspn(v, "\r\n");
        if (n == 0) continue;
        snprintf(buf, len, "%.*s", (int)n, v);
        break;
    }
    fclose(f);
}
