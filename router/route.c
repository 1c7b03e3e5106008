/* router: routing policy (see route.h). */
#include "router/route.h"

#include <stdio.h>
#include <string.h>

baton_status_t route_policy_parse(const char *name, route_policy_t *out) {
    if (!strcmp(name, "cache_aware"))
        *out = ROUTE_CACHE_AWARE;
    else if (!strcmp(name, "round_robin"))
        *out = ROUTE_ROUND_ROBIN;
    else if (!strcmp(name, "least_loaded"))
        *out = ROUTE_LEAST_LOADED;
    else
        return baton_error(BATON_ERR_INVALID_ARG,
                           "unknown policy '%s' (cache_aware, round_robin, least_loaded)", name);
    return BATON_OK;
}

const char *route_policy_name(route_policy_t p) {
    switch (p) {
    case ROUTE_CACHE_AWARE: return "cache_aware";
    case ROUTE_ROUND_ROBIN: return "round_robin";
    case ROUTE_LEAST_LOADED: return "least_loaded";
    }
    return "unknown";
}

void route_state_init(route_state_t *rs, const route_config_t *cfg) {
    memset(rs, 0, sizeof(*rs));
    rs->cfg = *cfg;
}

static uint64_t prefill_load(const worker_entry_t *w) { return w->inflight_prefill_tokens; }

/* Free blocks of a decode worker as the router sees them now. */
static int64_t decode_free(const worker_entry_t *w) {
    int64_t free_blocks = w->has_heartbeat ? (int64_t)w->hb.free_blocks : 0;
    return free_blocks - (int64_t)w->inflight_blocks;
}

/* Best decode worker paired with P, or -1. */
static int pick_decode(const worker_table_t *t, const worker_entry_t *p, char *why,
                       size_t why_len) {
    if (p->role == PROTO_ROLE_BOTH)
        return (int)p->slot;
    int best = -1;
    int64_t best_free = 0;
    uint32_t best_run = 0;
    for (uint32_t j = 0; j < WORKER_TABLE_MAX; j++) {
        const worker_entry_t *d = &t->w[j];
        if (!d->used || d->role != PROTO_ROLE_DECODE || !worker_table_can_pair(p, d, why, why_len))
            continue;
        int64_t f = decode_free(d);
        uint32_t run = (d->has_heartbeat ? d->hb.n_running : 0) + d->inflight;
        if (best < 0 || f > best_free || (f == best_free && run < best_run)) {
            best = (int)j;
            best_free = f;
            best_run = run;
        }
    }
    return best;
}

baton_status_t route_pick(route_state_t *rs, const worker_table_t *t, const uint32_t *match_blocks,
                          uint32_t n_blocks_needed, route_choice_t *out) {
    (void)n_blocks_needed;
    int cand[WORKER_TABLE_MAX], dec[WORKER_TABLE_MAX];
    size_t n = 0;
    char why[256] = "no prefill worker registered";
    for (uint32_t i = 0; i < WORKER_TABLE_MAX; i++) {
        const worker_entry_t *p = &t->w[i];
        if (!p->used || p->role == PROTO_ROLE_DECODE)
            continue;
        int d = pick_decode(t, p, why, sizeof(why));
        if (d < 0) {
            if (!strcmp(why, "no prefill worker registered"))
                snprintf(why, sizeof(why), "no decode worker registered");
            continue;
        }
        cand[n] = (int)i;
        dec[n] = d;
        n++;
    }
    if (n == 0)
        return baton_error(BATON_ERR_BUSY, "no prefill/decode pair available: %s", why);
    size_t pick = 0;
    uint64_t min_load = UINT64_MAX;
    size_t min_i = 0;
    for (size_t k = 0; k < n; k++) {
        uint64_t l = prefill_load(&t->w[cand[k]]);
        if (l < min_load) {
            min_load = l;
            min_i = k;
        }
    }
    switch (rs->cfg.policy) {
    case ROUTE_ROUND_ROBIN:
        pick = (size_t)(rs->rr_next++ % n);
        break;
    case ROUTE_LEAST_LOADED:
        pick = min_i;
        break;
    case ROUTE_CACHE_AWARE: {
        int64_t best = INT64_MIN;
        uint32_t bs = t->block_size;
        size_t start = (size_t)(rs->rr_next++ % n); /* equal scores rotate */
        for (size_t j = 0; j < n; j++) {
            size_t k = (start + j) % n;
            const worker_entry_t *w = &t->w[cand[k]];
            int64_t score = (int64_t)match_blocks[cand[k]] * bs - (int64_t)prefill_load(w);
            /* ties: fewer in flight, then round robin order */
            if (score > best ||
                (score == best && w->inflight < t->w[cand[pick]].inflight)) {
                best = score;
                pick = k;
            }
        }
        uint64_t l = prefill_load(&t->w[cand[pick]]);
        if (pick != min_i &&
            l > rs->cfg.balance_abs_tokens + (uint64_t)(rs->cfg.balance_rel * (double)min_load)) {
            pick = min_i;
            rs->balance_overrides++;
        }
        break;
    }
    }
    out->prefill_slot = (uint32_t)cand[pick];
    out->decode_slot = (uint32_t)dec[pick];
    out->predicted_hit_blocks = match_blocks[cand[pick]];
    return BATON_OK;
}
