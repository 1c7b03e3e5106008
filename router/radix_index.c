/* Global radix index over chained block hashes (see radix_index.h). */
#include "router/radix_index.h"

#include <stdlib.h>
#include <string.h>

#define NIL UINT32_MAX
#define WORDS (RADIX_INDEX_MAX_WORKERS / 64)

/* One speculative guess on a node: worker and expiry. */
typedef struct ri_spec {
    uint64_t expire_ms;
    uint32_t worker;
} ri_spec_t;

typedef struct ri_node {
    block_hash_t hash;
    block_hash_t parent;       /* valid when has_parent */
    uint64_t holders[WORDS];   /* bit w: confirmed by w's events */
    uint64_t guessed[WORDS];   /* bit w: an unexpired guess for w (never with holders bit) */
    uint64_t last_seen_ms;     /* last store, guess or match hit */
    ri_spec_t *spec;           /* [n_spec] one per guessed worker */
    uint32_t n_spec, cap_spec;
    uint32_t next_free;
    bool has_parent;
    bool used;
} ri_node_t;

/* Min-heap entry: the guess (hash, worker) is due at expire_ms unless the
 * node's record says a later time (extended) or is gone (confirmed). */
typedef struct ri_due {
    uint64_t expire_ms;
    block_hash_t hash;
    uint32_t worker;
} ri_due_t;

typedef struct ri_worker {
    bool known;
    bool has_epoch;
    bool awaiting_resync;
    uint64_t epoch;
    uint64_t last_seq;
    uint64_t last_event_ms;
    bool has_event;
    size_t n_blocks;
    size_t n_speculative;
} ri_worker_t;

struct radix_index {
    block_hash_map_t map; /* hash -> node index */
    ri_node_t *nodes;     /* [cap_nodes] */
    uint32_t cap_nodes;
    uint32_t free_head;
    ri_due_t *heap;       /* [n_heap] min-heap on expire_ms */
    size_t n_heap, cap_heap;
    ri_worker_t workers[RADIX_INDEX_MAX_WORKERS];
    radix_index_stats_t stats;
};

static inline bool bit_get(const uint64_t *b, uint32_t w) { return (b[w >> 6] >> (w & 63)) & 1; }
static inline void bit_set(uint64_t *b, uint32_t w) { b[w >> 6] |= (uint64_t)1 << (w & 63); }
static inline void bit_clear(uint64_t *b, uint32_t w) { b[w >> 6] &= ~((uint64_t)1 << (w & 63)); }

baton_status_t radix_index_init(radix_index_t **out) {
    if (!out) return baton_error(BATON_ERR_INVALID_ARG, "radix_index_init: out is NULL");
    radix_index_t *idx = calloc(1, sizeof(*idx));
    if (!idx) return baton_error(BATON_ERR_NO_MEMORY, "radix index");
    idx->free_head = NIL;
    baton_status_t st = block_hash_map_init(&idx->map, 1024);
    if (st != BATON_OK) {
        free(idx);
        return st;
    }
    *out = idx;
    return BATON_OK;
}

void radix_index_free(radix_index_t *idx) {
    if (!idx) return;
    for (uint32_t i = 0; i < idx->cap_nodes; i++) free(idx->nodes[i].spec);
    free(idx->nodes);
    free(idx->heap);
    block_hash_map_free(&idx->map);
    free(idx);
}

/* ---- nodes ------------------------------------------------------------- */

static ri_node_t *node_find(const radix_index_t *idx, const block_hash_t *h) {
    uint32_t i;
    return block_hash_map_get(&idx->map, h, &i) ? &idx->nodes[i] : NULL;
}

/* Finds or creates the node of `h`; a new node gets `parent` (NULL: block 0).
 * The returned pointer is valid until the next node creation. */
static baton_status_t node_get_or_add(radix_index_t *idx, const block_hash_t *h,
                                      const block_hash_t *parent, uint64_t now_ms,
                                      ri_node_t **out) {
    uint32_t i;
    if (block_hash_map_get(&idx->map, h, &i)) {
        *out = &idx->nodes[i];
        return BATON_OK;
    }
    if (idx->free_head == NIL) {
        uint32_t cap = idx->cap_nodes ? 2 * idx->cap_nodes : 1024;
        if (cap <= idx->cap_nodes || cap >= NIL)
            return baton_error(BATON_ERR_NO_MEMORY, "radix index: node table full");
        ri_node_t *n = realloc(idx->nodes, (size_t)cap * sizeof(*n));
        if (!n) return baton_error(BATON_ERR_NO_MEMORY, "radix index: %u nodes", cap);
        memset(n + idx->cap_nodes, 0, (size_t)(cap - idx->cap_nodes) * sizeof(*n));
        for (uint32_t k = idx->cap_nodes; k < cap; k++) n[k].next_free = k + 1 < cap ? k + 1 : NIL;
        idx->free_head = idx->cap_nodes;
        idx->nodes = n;
        idx->cap_nodes = cap;
    }
    i = idx->free_head;
    baton_status_t st = block_hash_map_put(&idx->map, h, i);
    if (st != BATON_OK) return st;
    idx->free_head = idx->nodes[i].next_free;
    ri_node_t *n = &idx->nodes[i];
    memset(n, 0, sizeof(*n));
    n->hash = *h;
    n->has_parent = parent != NULL;
    if (parent) n->parent = *parent;
    n->last_seen_ms = now_ms;
    n->used = true;
    idx->stats.n_nodes++;
    *out = n;
    return BATON_OK;
}

static bool node_empty(const ri_node_t *n) {
    for (int k = 0; k < WORDS; k++)
        if (n->holders[k] | n->guessed[k]) return false;
    return true;
}

/* Removes the node when nobody holds or guesses it. */
static void node_maybe_remove(radix_index_t *idx, ri_node_t *n) {
    if (!node_empty(n)) return;
    uint32_t i = (uint32_t)(n - idx->nodes);
    block_hash_map_remove(&idx->map, &n->hash, NULL);
    free(n->spec);
    memset(n, 0, sizeof(*n));
    n->next_free = idx->free_head;
    idx->free_head = i;
    idx->stats.n_nodes--;
}

static ri_spec_t *spec_find(ri_node_t *n, uint32_t w) {
    for (uint32_t k = 0; k < n->n_spec; k++)
        if (n->spec[k].worker == w) return &n->spec[k];
    return NULL;
}

/* Drops w's guess on n, if any. */
static bool spec_drop(radix_index_t *idx, ri_node_t *n, uint32_t w) {
    for (uint32_t k = 0; k < n->n_spec; k++) {
        if (n->spec[k].worker != w) continue;
        n->spec[k] = n->spec[--n->n_spec];
        bit_clear(n->guessed, w);
        idx->workers[w].n_speculative--;
        return true;
    }
    return false;
}

/* Marks n as held by w (confirming a guess). */
static void hold(radix_index_t *idx, ri_node_t *n, uint32_t w, uint64_t now_ms) {
    if (spec_drop(idx, n, w)) idx->stats.speculative_confirmed++;
    if (!bit_get(n->holders, w)) {
        bit_set(n->holders, w);
        idx->workers[w].n_blocks++;
    }
    n->last_seen_ms = now_ms;
}

/* Drops every confirmed holding of w; guesses stay unless `guesses`. */
static void purge_worker(radix_index_t *idx, uint32_t w, bool guesses) {
    ri_worker_t *ws = &idx->workers[w];
    if (ws->n_blocks == 0 && (!guesses || ws->n_speculative == 0)) return;
    for (uint32_t i = 0; i < idx->cap_nodes; i++) {
        ri_node_t *n = &idx->nodes[i];
        if (!n->used) continue;
        if (bit_get(n->holders, w)) {
            bit_clear(n->holders, w);
            ws->n_blocks--;
        }
        if (guesses) spec_drop(idx, n, w);
        node_maybe_remove(idx, n);
    }
}

/* ---- expiry heap ------------------------------------------------------- */

static baton_status_t heap_push(radix_index_t *idx, const ri_due_t *d) {
    if (idx->n_heap == idx->cap_heap) {
        size_t cap = idx->cap_heap ? 2 * idx->cap_heap : 256;
        ri_due_t *h = realloc(idx->heap, cap * sizeof(*h));
        if (!h) return baton_error(BATON_ERR_NO_MEMORY, "radix index: expiry heap");
        idx->heap = h;
        idx->cap_heap = cap;
    }
    size_t i = idx->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (idx->heap[p].expire_ms <= d->expire_ms) break;
        idx->heap[i] = idx->heap[p];
        i = p;
    }
    idx->heap[i] = *d;
    return BATON_OK;
}

static void heap_pop(radix_index_t *idx) {
    ri_due_t last = idx->heap[--idx->n_heap];
    size_t i = 0, n = idx->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && idx->heap[c + 1].expire_ms < idx->heap[c].expire_ms) c++;
        if (last.expire_ms <= idx->heap[c].expire_ms) break;
        idx->heap[i] = idx->heap[c];
        i = c;
    }
    if (n > 0) idx->heap[i] = last;
}

void radix_index_expire(radix_index_t *idx, uint64_t now_ms) {
    if (!idx) return;
    while (idx->n_heap > 0 && idx->heap[0].expire_ms <= now_ms) {
        ri_due_t d = idx->heap[0];
        heap_pop(idx);
        ri_node_t *n = node_find(idx, &d.hash);
        if (!n) continue;
        ri_spec_t *s = spec_find(n, d.worker);
        if (!s || s->expire_ms > now_ms) continue; /* confirmed, dropped or extended */
        spec_drop(idx, n, d.worker);
        idx->stats.speculative_expired++;
        node_maybe_remove(idx, n);
    }
}

/* ---- events ------------------------------------------------------------ */

static baton_status_t check_worker(uint32_t w) {
    if (w >= RADIX_INDEX_MAX_WORKERS)
        return baton_error(BATON_ERR_INVALID_ARG, "radix index: worker id %u >= %d", w,
                           RADIX_INDEX_MAX_WORKERS);
    return BATON_OK;
}

/* Purges w's confirmed holdings and waits for its snapshot. */
static void ask_resync(radix_index_t *idx, uint32_t w) {
    purge_worker(idx, w, false);
    idx->workers[w].awaiting_resync = true;
    idx->stats.resyncs_requested++;
}

/* Applies one link of w. Returns BATON_ERR_FORMAT when its parent is not
 * held by w (inconsistent stream). */
static baton_status_t store_link(radix_index_t *idx, uint32_t w, const block_hash_link_t *l,
                                 uint64_t now_ms, bool check_parent) {
    if (check_parent && l->has_parent) {
        ri_node_t *p = node_find(idx, &l->parent);
        if (!p || !bit_get(p->holders, w))
            return baton_error(BATON_ERR_FORMAT, "radix index: worker %u stored a block whose "
                               "parent it does not hold", w);
    }
    ri_node_t *n;
    baton_status_t st =
        node_get_or_add(idx, &l->hash, l->has_parent ? &l->parent : NULL, now_ms, &n);
    if (st != BATON_OK) return st;
    hold(idx, n, w, now_ms);
    return BATON_OK;
}

baton_status_t radix_index_apply_event(radix_index_t *idx, uint32_t worker_id, uint64_t epoch,
                                       uint64_t seq, const block_hash_link_t *stored,
                                       size_t n_stored, const block_hash_t *removed,
                                       size_t n_removed, uint64_t now_ms, bool *resync_out) {
    if (!idx || !resync_out || (n_stored && !stored) || (n_removed && !removed))
        return baton_error(BATON_ERR_INVALID_ARG, "radix_index_apply_event: NULL argument");
    baton_status_t st = check_worker(worker_id);
    if (st != BATON_OK) return st;
    ri_worker_t *ws = &idx->workers[worker_id];
    ws->known = true;
    if (!ws->has_epoch || ws->epoch != epoch) {
        /* First contact or a restarted worker. */
        purge_worker(idx, worker_id, false);
        ws->has_epoch = true;
        ws->epoch = epoch;
        ws->last_seq = 0;
        ws->awaiting_resync = false;
        if (seq != 1) {
            ask_resync(idx, worker_id);
            idx->stats.events_dropped++;
            *resync_out = true;
            return BATON_OK;
        }
    } else if (ws->awaiting_resync) {
        idx->stats.events_dropped++;
        *resync_out = true;
        return BATON_OK;
    } else if (seq <= ws->last_seq) {
        idx->stats.events_dropped++;
        *resync_out = false;
        return BATON_OK;
    } else if (seq != ws->last_seq + 1) {
        ask_resync(idx, worker_id);
        idx->stats.events_dropped++;
        *resync_out = true;
        return BATON_OK;
    }

    for (size_t k = 0; k < n_removed; k++) {
        ri_node_t *n = node_find(idx, &removed[k]);
        if (!n || !bit_get(n->holders, worker_id)) {
            idx->stats.unknown_removals++;
            continue;
        }
        bit_clear(n->holders, worker_id);
        ws->n_blocks--;
        node_maybe_remove(idx, n);
    }
    for (size_t k = 0; k < n_stored; k++) {
        st = store_link(idx, worker_id, &stored[k], now_ms, true);
        if (st == BATON_ERR_FORMAT) {
            ask_resync(idx, worker_id);
            *resync_out = true;
            return BATON_OK;
        }
        if (st != BATON_OK) {
            ask_resync(idx, worker_id);
            return st;
        }
    }
    ws->last_seq = seq;
    ws->last_event_ms = now_ms;
    ws->has_event = true;
    idx->stats.events_applied++;
    *resync_out = false;
    return BATON_OK;
}

baton_status_t radix_index_apply_snapshot(radix_index_t *idx, uint32_t worker_id, uint64_t epoch,
                                          uint64_t seq, const block_hash_link_t *links, size_t n,
                                          uint64_t now_ms, bool *applied_out) {
    if (!idx || (n && !links))
        return baton_error(BATON_ERR_INVALID_ARG, "radix_index_apply_snapshot: NULL argument");
    baton_status_t st = check_worker(worker_id);
    if (st != BATON_OK) return st;
    ri_worker_t *ws = &idx->workers[worker_id];
    ws->known = true;
    if (ws->has_epoch && ws->epoch == epoch && !ws->awaiting_resync && seq <= ws->last_seq) {
        idx->stats.events_dropped++;
        if (applied_out) *applied_out = false;
        return BATON_OK;
    }
    purge_worker(idx, worker_id, false);
    ws->has_epoch = true;
    ws->epoch = epoch;
    for (size_t k = 0; k < n; k++) {
        st = store_link(idx, worker_id, &links[k], now_ms, false);
        if (st != BATON_OK) {
            ask_resync(idx, worker_id);
            return st;
        }
    }
    ws->awaiting_resync = false;
    ws->last_seq = seq;
    ws->last_event_ms = now_ms;
    ws->has_event = true;
    idx->stats.snapshots_applied++;
    if (applied_out) *applied_out = true;
    return BATON_OK;
}

baton_status_t radix_index_match(radix_index_t *idx, const block_hash_t *hashes, size_t n,
                                 uint64_t now_ms, uint32_t *counts_out) {
    if (!idx || !counts_out || (n && !hashes))
        return baton_error(BATON_ERR_INVALID_ARG, "radix_index_match: NULL argument");
    radix_index_expire(idx, now_ms);
    memset(counts_out, 0, RADIX_INDEX_MAX_WORKERS * sizeof(*counts_out));
    uint64_t active[WORDS];
    for (int k = 0; k < WORDS; k++) active[k] = ~(uint64_t)0;
    for (size_t i = 0; i < n; i++) {
        ri_node_t *node = node_find(idx, &hashes[i]);
        if (!node) break;
        uint64_t any = 0;
        for (int k = 0; k < WORDS; k++) {
            active[k] &= node->holders[k] | node->guessed[k];
            any |= active[k];
        }
        if (!any) break;
        node->last_seen_ms = now_ms;
        for (int k = 0; k < WORDS; k++)
            for (uint64_t b = active[k]; b; b &= b - 1)
                counts_out[64 * k + __builtin_ctzll(b)] = (uint32_t)(i + 1);
    }
    return BATON_OK;
}

baton_status_t radix_index_insert_speculative(radix_index_t *idx, uint32_t worker_id,
                                              const block_hash_t *hashes, size_t n,
                                              uint32_t ttl_ms, uint64_t now_ms) {
    if (!idx || (n && !hashes))
        return baton_error(BATON_ERR_INVALID_ARG, "radix_index_insert_speculative: NULL argument");
    baton_status_t st = check_worker(worker_id);
    if (st != BATON_OK) return st;
    idx->workers[worker_id].known = true;
    uint64_t expire = now_ms + ttl_ms;
    for (size_t i = 0; i < n; i++) {
        ri_node_t *node;
        st = node_get_or_add(idx, &hashes[i], i ? &hashes[i - 1] : NULL, now_ms, &node);
        if (st != BATON_OK) return st;
        node->last_seen_ms = now_ms;
        if (bit_get(node->holders, worker_id)) continue;
        ri_spec_t *s = spec_find(node, worker_id);
        if (s && s->expire_ms >= expire) continue;
        ri_due_t due = {expire, hashes[i], worker_id};
        if ((st = heap_push(idx, &due)) != BATON_OK) {
            node_maybe_remove(idx, node);
            return st;
        }
        if (s) {
            s->expire_ms = expire;
            continue;
        }
        if (node->n_spec == node->cap_spec) {
            uint32_t cap = node->cap_spec ? 2 * node->cap_spec : 2;
            ri_spec_t *a = realloc(node->spec, cap * sizeof(*a));
            if (!a) {
                node_maybe_remove(idx, node);
                return baton_error(BATON_ERR_NO_MEMORY, "radix index: guesses");
            }
            node->spec = a;
            node->cap_spec = cap;
        }
        node->spec[node->n_spec++] = (ri_spec_t){expire, worker_id};
        bit_set(node->guessed, worker_id);
        idx->workers[worker_id].n_speculative++;
        idx->stats.speculative_inserted++;
    }
    return BATON_OK;
}

baton_status_t radix_index_remove_worker(radix_index_t *idx, uint32_t worker_id) {
    if (!idx) return baton_error(BATON_ERR_INVALID_ARG, "radix_index_remove_worker: NULL index");
    baton_status_t st = check_worker(worker_id);
    if (st != BATON_OK) return st;
    purge_worker(idx, worker_id, true);
    memset(&idx->workers[worker_id], 0, sizeof(idx->workers[worker_id]));
    return BATON_OK;
}

int64_t radix_index_staleness_ms(const radix_index_t *idx, uint32_t worker_id, uint64_t now_ms) {
    if (!idx || worker_id >= RADIX_INDEX_MAX_WORKERS) return -1;
    const ri_worker_t *ws = &idx->workers[worker_id];
    if (!ws->has_event) return -1;
    return now_ms >= ws->last_event_ms ? (int64_t)(now_ms - ws->last_event_ms) : 0;
}

baton_status_t radix_index_worker_info(const radix_index_t *idx, uint32_t worker_id,
                                       radix_index_worker_info_t *out) {
    if (!idx || !out) return baton_error(BATON_ERR_INVALID_ARG, "radix_index_worker_info: NULL");
    baton_status_t st = check_worker(worker_id);
    if (st != BATON_OK) return st;
    const ri_worker_t *ws = &idx->workers[worker_id];
    out->known = ws->known;
    out->synced = ws->has_epoch && !ws->awaiting_resync;
    out->epoch = ws->epoch;
    out->last_seq = ws->last_seq;
    out->last_event_ms = ws->last_event_ms;
    out->n_blocks = ws->n_blocks;
    out->n_speculative = ws->n_speculative;
    return BATON_OK;
}

void radix_index_get_stats(const radix_index_t *idx, radix_index_stats_t *out) {
    if (!idx || !out) return;
    *out = idx->stats;
}

bool radix_index_holds(const radix_index_t *idx, uint32_t worker_id, const block_hash_t *hash) {
    if (!idx || !hash || worker_id >= RADIX_INDEX_MAX_WORKERS) return false;
    const ri_node_t *n = node_find(idx, hash);
    return n && bit_get(n->holders, worker_id);
}
