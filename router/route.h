/* router: routing policy: which prefill worker P and decode worker D serve a
 * request.
 *
 * cache_aware (default; DESIGN.md "Global radix index", the SGLang
 * cache-aware router's idea): for each prefill-capable worker w,
 *   score(w) = matched_blocks(w) * block_size - load(w)
 * where matched_blocks comes from the global radix index and load(w) is the
 * uncached prompt tokens already routed to w and not yet prefilled. Balance
 * guard: if the best-scoring worker's load exceeds
 * balance_abs_tokens + balance_rel * (lowest load), the least-loaded worker
 * is chosen instead, so one hot prefix cannot pile every request on one
 * worker. round_robin cycles over prefill workers; least_loaded takes the
 * lowest load. In every policy D is the compatible decode worker with the
 * most free KV blocks (last heartbeat minus blocks routed since), ties to
 * the smaller running batch; a colocated worker is its own D. */
#ifndef BATON_ROUTER_ROUTE_H
#define BATON_ROUTER_ROUTE_H

#include <stdint.h>

#include "common/status.h"
#include "router/worker_table.h"

typedef enum route_policy {
    ROUTE_CACHE_AWARE = 0,
    ROUTE_ROUND_ROBIN = 1,
    ROUTE_LEAST_LOADED = 2,
} route_policy_t;

typedef struct route_config {
    route_policy_t policy;
    uint64_t balance_abs_tokens; /* default 4096 */
    double balance_rel;          /* default 2.0 */
} route_config_t;

typedef struct route_state {
    route_config_t cfg;
    uint64_t rr_next; /* round-robin cursor */
    uint64_t balance_overrides; /* times the guard overrode the prefix choice */
} route_state_t;

typedef struct route_choice {
    uint32_t prefill_slot;
    uint32_t decode_slot;
    uint32_t predicted_hit_blocks; /* index match of the chosen P */
} route_choice_t;

/* Parses "cache_aware", "round_robin", "least_loaded". BATON_ERR_INVALID_ARG
 * otherwise. */
baton_status_t route_policy_parse(const char *name, route_policy_t *out);
const char *route_policy_name(route_policy_t p);

void route_state_init(route_state_t *rs, const route_config_t *cfg);

/* Picks P and D. match_blocks[slot] is radix_index_match's leading-block
 * count per worker slot (RADIX_INDEX_MAX_WORKERS entries). n_blocks_needed
 * is the decode reservation of the request (blocks). Errors:
 * BATON_ERR_BUSY (no compatible pair now; detail says why). */
baton_status_t route_pick(route_state_t *rs, const worker_table_t *t, const uint32_t *match_blocks,
                          uint32_t n_blocks_needed, route_choice_t *out);

#endif
