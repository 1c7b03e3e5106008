/* Radix prefix cache over chained block hashes (see radix_cache.h). */
#include "common/radix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define NIL UINT32_MAX

typedef struct rc_entry {
    block_hash_t hash;
    block_hash_t parent;   /* valid when has_parent */
    int32_t block_id;      /* physical block in the pool, referenced by the cache */
    uint32_t n_children;   /* cached entries whose parent is this one */
    uint32_t prev, next;   /* LRU list: prev toward the head (most recent) */
    bool has_parent;
    bool used;
} rc_entry_t;

/* A hash touched since the last batch and whether it was cached before its
 * first touch (first op REMOVED <=> it was cached). */
typedef struct rc_pending {
    block_hash_t hash;
    bool was_cached;
} rc_pending_t;

struct radix_cache {
    radix_cache_pool_ops_t ops;
    uint64_t epoch;
    uint64_t seq;          /* last batch taken */
    block_hash_map_t map;  /* hash -> entry index */
    rc_entry_t *entries;   /* [cap_entries] */
    uint32_t cap_entries;
    uint32_t free_head;    /* free list through .next */
    uint32_t lru_head, lru_tail;
    size_t n_cached;
    rc_pending_t *pending; /* [n_pending] in first-touch order */
    size_t n_pending, cap_pending;
    block_hash_map_t pending_map; /* hash -> pending index */
    radix_cache_stats_t stats;
};

baton_status_t radix_cache_init(const radix_cache_pool_ops_t *ops, uint64_t epoch,
                                radix_cache_t **out) {
    if (!ops || !ops->ref || !ops->unref || !ops->refcount || !out)
        return baton_error(BATON_ERR_INVALID_ARG, "radix_cache_init: missing pool ops or out");
    radix_cache_t *c = calloc(1, sizeof(*c));
    if (!c) return baton_error(BATON_ERR_NO_MEMORY, "radix cache");
    c->ops = *ops;
    c->epoch = epoch;
    c->free_head = c->lru_head = c->lru_tail = NIL;
    if (block_hash_map_init(&c->map, 64) != BATON_OK ||
        block_hash_map_init(&c->pending_map, 64) != BATON_OK) {
        block_hash_map_free(&c->map);
        free(c);
        return baton_error(BATON_ERR_NO_MEMORY, "radix cache maps");
    }
    *out = c;
    return BATON_OK;
}

void radix_cache_free(radix_cache_t *cache) {
    if (!cache) return;
    for (uint32_t i = 0; i < cache->cap_entries; i++) {
        if (!cache->entries[i].used) continue;
        baton_status_t st = cache->ops.unref(cache->ops.ctx, cache->entries[i].block_id);
        if (st != BATON_OK)
            LOG_WARN("radix_cache", "free: unref of block %d failed: %s",
                     cache->entries[i].block_id, baton_last_error());
    }
    block_hash_map_free(&cache->map);
    block_hash_map_free(&cache->pending_map);
    free(cache->entries);
    free(cache->pending);
    free(cache);
}

/* ---- LRU list ---------------------------------------------------------- */

static void lru_unlink(radix_cache_t *c, uint32_t i) {
    rc_entry_t *e = &c->entries[i];
    if (e->prev != NIL) c->entries[e->prev].next = e->next;
    else c->lru_head = e->next;
    if (e->next != NIL) c->entries[e->next].prev = e->prev;
    else c->lru_tail = e->prev;
    e->prev = e->next = NIL;
}

static void lru_push_head(radix_cache_t *c, uint32_t i) {
    rc_entry_t *e = &c->entries[i];
    e->prev = NIL;
    e->next = c->lru_head;
    if (c->lru_head != NIL) c->entries[c->lru_head].prev = i;
    c->lru_head = i;
    if (c->lru_tail == NIL) c->lru_tail = i;
}

static void lru_touch(radix_cache_t *c, uint32_t i) {
    if (c->lru_head == i) return;
    lru_unlink(c, i);
    lru_push_head(c, i);
}

/* ---- event log --------------------------------------------------------- */

/* Records the first touch of `hash` since the last batch. */
static baton_status_t log_touch(radix_cache_t *c, const block_hash_t *hash, bool was_cached) {
    if (block_hash_map_get(&c->pending_map, hash, NULL)) return BATON_OK;
    if (c->n_pending == c->cap_pending) {
        size_t cap = c->cap_pending ? 2 * c->cap_pending : 64;
        rc_pending_t *p = realloc(c->pending, cap * sizeof(*p));
        if (!p) return baton_error(BATON_ERR_NO_MEMORY, "radix cache event log");
        c->pending = p;
        c->cap_pending = cap;
    }
    baton_status_t st = block_hash_map_put(&c->pending_map, hash, (uint32_t)c->n_pending);
    if (st != BATON_OK) return st;
    c->pending[c->n_pending].hash = *hash;
    c->pending[c->n_pending].was_cached = was_cached;
    c->n_pending++;
    return BATON_OK;
}

/* ---- entries ----------------------------------------------------------- */

static baton_status_t entry_alloc(radix_cache_t *c, uint32_t *out) {
    if (c->free_head == NIL) {
        uint32_t cap = c->cap_entries ? 2 * c->cap_entries : 64;
        if (cap <= c->cap_entries || cap >= NIL)
            return baton_error(BATON_ERR_NO_MEMORY, "radix cache: entry table full");
        rc_entry_t *e = realloc(c->entries, (size_t)cap * sizeof(*e));
        if (!e) return baton_error(BATON_ERR_NO_MEMORY, "radix cache: %u entries", cap);
        for (uint32_t i = c->cap_entries; i < cap; i++) {
            memset(&e[i], 0, sizeof(e[i]));
            e[i].next = i + 1 < cap ? i + 1 : c->free_head;
        }
        c->free_head = c->cap_entries;
        c->entries = e;
        c->cap_entries = cap;
    }
    *out = c->free_head;
    c->free_head = c->entries[*out].next;
    return BATON_OK;
}

static void entry_release(radix_cache_t *c, uint32_t i) {
    memset(&c->entries[i], 0, sizeof(c->entries[i]));
    c->entries[i].next = c->free_head;
    c->free_head = i;
}

baton_status_t radix_cache_match(radix_cache_t *cache, const block_hash_t *hashes, size_t n,
                                 int32_t *block_ids_out, size_t *n_matched) {
    if (!cache || !n_matched || (n > 0 && (!hashes || !block_ids_out)))
        return baton_error(BATON_ERR_INVALID_ARG, "radix_cache_match: NULL argument");
    size_t m = 0;
    uint32_t idx;
    while (m < n && block_hash_map_get(&cache->map, &hashes[m], &idx)) {
        baton_status_t st = cache->ops.ref(cache->ops.ctx, cache->entries[idx].block_id);
        if (st != BATON_OK) {
            for (size_t j = 0; j < m; j++) cache->ops.unref(cache->ops.ctx, block_ids_out[j]);
            return st;
        }
        block_ids_out[m++] = cache->entries[idx].block_id;
    }
    /* Touch from the deepest matched block back to block 0 so that ancestors
     * stay more recent than their descendants. */
    for (size_t j = m; j-- > 0;) {
        block_hash_map_get(&cache->map, &hashes[j], &idx);
        lru_touch(cache, idx);
    }
    cache->stats.lookups++;
    cache->stats.hit_blocks += m;
    cache->stats.miss_blocks += n - m;
    *n_matched = m;
    return BATON_OK;
}

baton_status_t radix_cache_insert(radix_cache_t *cache, const block_hash_t *hashes,
                                  const int32_t *block_ids, size_t n, size_t *n_inserted) {
    if (!cache || (n > 0 && (!hashes || !block_ids)))
        return baton_error(BATON_ERR_INVALID_ARG, "radix_cache_insert: NULL argument");
    for (size_t i = 0; i < n; i++)
        if (block_ids[i] < 0)
            return baton_error(BATON_ERR_INVALID_ARG, "radix_cache_insert: block_ids[%zu] = %d",
                               i, block_ids[i]);
    baton_status_t st = BATON_OK;
    size_t done = 0, added = 0;
    for (; done < n; done++) {
        const block_hash_t *h = &hashes[done];
        uint32_t idx;
        if (block_hash_map_get(&cache->map, h, &idx)) {
            const rc_entry_t *e = &cache->entries[idx];
            bool ok = done == 0 ? !e->has_parent
                                : e->has_parent && block_hash_eq(&e->parent, &hashes[done - 1]);
            if (!ok) {
                st = baton_error(BATON_ERR_INVALID_ARG,
                                 "radix_cache_insert: hashes[%zu] is cached under another parent "
                                 "(hashes must chain from block 0)", done);
                break;
            }
            continue;
        }
        if (done > 0 && block_hash_eq(h, &hashes[done - 1])) {
            st = baton_error(BATON_ERR_INVALID_ARG, "radix_cache_insert: hashes[%zu] repeats", done);
            break;
        }
        /* Everything that can fail comes before the reference is taken. A
         * logged touch that is then undone has no net effect at take time. */
        if ((st = entry_alloc(cache, &idx)) != BATON_OK) break;
        if ((st = log_touch(cache, h, false)) != BATON_OK) {
            entry_release(cache, idx);
            break;
        }
        if ((st = block_hash_map_put(&cache->map, h, idx)) != BATON_OK) {
            entry_release(cache, idx);
            break;
        }
        if ((st = cache->ops.ref(cache->ops.ctx, block_ids[done])) != BATON_OK) {
            block_hash_map_remove(&cache->map, h, NULL);
            entry_release(cache, idx);
            break;
        }
        rc_entry_t *e = &cache->entries[idx];
        e->hash = *h;
        e->block_id = block_ids[done];
        e->n_children = 0;
        e->used = true;
        e->has_parent = done > 0;
        if (done > 0) {
            uint32_t pidx;
            e->parent = hashes[done - 1];
            block_hash_map_get(&cache->map, &hashes[done - 1], &pidx);
            cache->entries[pidx].n_children++;
        }
        lru_push_head(cache, idx);
        cache->n_cached++;
        added++;
    }
    for (size_t j = done; j-- > 0;) {
        uint32_t idx;
        block_hash_map_get(&cache->map, &hashes[j], &idx);
        lru_touch(cache, idx);
    }
    cache->stats.inserted_blocks += added;
    if (st == BATON_OK && n_inserted) *n_inserted = added;
    return st;
}

baton_status_t radix_cache_evict(radix_cache_t *cache, size_t n_blocks_needed,
                                 size_t *n_evicted) {
    if (!cache || !n_evicted)
        return baton_error(BATON_ERR_INVALID_ARG, "radix_cache_evict: NULL argument");
    size_t freed = 0;
    baton_status_t st = BATON_OK;
    uint32_t i = cache->lru_tail;
    while (i != NIL && freed < n_blocks_needed) {
        uint32_t toward_head = cache->entries[i].prev;
        rc_entry_t *e = &cache->entries[i];
        if (e->n_children == 0) {
            int32_t rc = cache->ops.refcount(cache->ops.ctx, e->block_id);
            if (rc < 1) {
                LOG_WARN("radix_cache", "cached block %d has refcount %d (expected >= 1)",
                         e->block_id, rc);
            } else if (rc == 1) {
                if ((st = log_touch(cache, &e->hash, true)) != BATON_OK) break;
                if ((st = cache->ops.unref(cache->ops.ctx, e->block_id)) != BATON_OK) break;
                if (e->has_parent) {
                    uint32_t pidx;
                    if (block_hash_map_get(&cache->map, &e->parent, &pidx))
                        cache->entries[pidx].n_children--;
                }
                block_hash_map_remove(&cache->map, &e->hash, NULL);
                lru_unlink(cache, i);
                entry_release(cache, i);
                cache->n_cached--;
                freed++;
            }
        }
        i = toward_head;
    }
    cache->stats.evicted_blocks += freed;
    if (st != BATON_OK) return st;
    *n_evicted = freed;
    return BATON_OK;
}

baton_status_t radix_cache_take_events(radix_cache_t *cache, radix_cache_events_t *out) {
    if (!cache || !out)
        return baton_error(BATON_ERR_INVALID_ARG, "radix_cache_take_events: NULL argument");
    size_t n_st = 0, n_rm = 0;
    for (size_t k = 0; k < cache->n_pending; k++) {
        bool now = block_hash_map_get(&cache->map, &cache->pending[k].hash, NULL);
        if (now && !cache->pending[k].was_cached) n_st++;
        else if (!now && cache->pending[k].was_cached) n_rm++;
    }
    radix_cache_events_t ev = {.epoch = cache->epoch, .seq = cache->seq};
    if (n_st + n_rm > 0) {
        ev.stored = n_st ? malloc(n_st * sizeof(*ev.stored)) : NULL;
        ev.removed = n_rm ? malloc(n_rm * sizeof(*ev.removed)) : NULL;
        if ((n_st && !ev.stored) || (n_rm && !ev.removed)) {
            free(ev.stored);
            free(ev.removed);
            return baton_error(BATON_ERR_NO_MEMORY, "radix cache events");
        }
        for (size_t k = 0; k < cache->n_pending; k++) {
            uint32_t idx;
            bool now = block_hash_map_get(&cache->map, &cache->pending[k].hash, &idx);
            if (now && !cache->pending[k].was_cached) {
                const rc_entry_t *e = &cache->entries[idx];
                ev.stored[ev.n_stored].hash = e->hash;
                ev.stored[ev.n_stored].parent = e->has_parent ? e->parent : (block_hash_t){0, 0};
                ev.stored[ev.n_stored].has_parent = e->has_parent;
                ev.n_stored++;
            } else if (!now && cache->pending[k].was_cached) {
                ev.removed[ev.n_removed++] = cache->pending[k].hash;
            }
        }
        ev.seq = ++cache->seq;
    }
    cache->n_pending = 0;
    block_hash_map_clear(&cache->pending_map);
    *out = ev;
    return BATON_OK;
}

void radix_cache_events_free(radix_cache_events_t *ev) {
    if (!ev) return;
    free(ev->stored);
    free(ev->removed);
    memset(ev, 0, sizeof(*ev));
}

baton_status_t radix_cache_snapshot(radix_cache_t *cache, radix_cache_snapshot_t *out) {
    if (!cache || !out)
        return baton_error(BATON_ERR_INVALID_ARG, "radix_cache_snapshot: NULL argument");
    if (cache->n_pending > 0)
        return baton_error(BATON_ERR_BUSY,
                           "radix_cache_snapshot: %zu pending changes; take the events first",
                           cache->n_pending);
    radix_cache_snapshot_t s = {.epoch = cache->epoch, .seq = cache->seq};
    if (cache->n_cached > 0) {
        s.links = malloc(cache->n_cached * sizeof(*s.links));
        if (!s.links) return baton_error(BATON_ERR_NO_MEMORY, "radix cache snapshot");
    }
    /* Head to tail: ancestors are more recent than descendants (file
     * comment of radix_cache.h), so parents come first. */
    for (uint32_t i = cache->lru_head; i != NIL; i = cache->entries[i].next) {
        const rc_entry_t *e = &cache->entries[i];
        s.links[s.n].hash = e->hash;
        s.links[s.n].parent = e->has_parent ? e->parent : (block_hash_t){0, 0};
        s.links[s.n].has_parent = e->has_parent;
        s.n++;
    }
    *out = s;
    return BATON_OK;
}

void radix_cache_snapshot_free(radix_cache_snapshot_t *snap) {
    if (!snap) return;
    free(snap->links);
    memset(snap, 0, sizeof(*snap));
}

void radix_cache_get_stats(const radix_cache_t *cache, radix_cache_stats_t *out) {
    if (!cache || !out) return;
    *out = cache->stats;
    out->n_cached = cache->n_cached;
    out->n_pending_events = cache->n_pending;
}

size_t radix_cache_size(const radix_cache_t *cache) { return cache ? cache->n_cached : 0; }
