/* Paged KV block manager: free list (a stack of ids) plus per-block
 * reference counts, under one mutex; block tables on top. */
#include "common/kv_pool.h"

#include "common/log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct kv_pool {
    backend_t *be;           /* borrowed */
    backend_kv_geom_t geom;
    void *k_base, *v_base;   /* backend memory, `bytes` each */
    size_t bytes;
    size_t block_bytes;
    pthread_mutex_t lock;    /* guards everything below */
    int32_t *refcnt;         /* [n_blocks] */
    int32_t *free_ids;       /* [n_blocks] stack; top = free_ids[n_free - 1] */
    int32_t n_free;
};

baton_status_t kv_pool_init(backend_t *be, const backend_kv_geom_t *geom, kv_pool_t **out) {
    if (!be || !geom || !out)
        return baton_error(BATON_ERR_INVALID_ARG, "kv_pool_init: NULL argument");
    backend_kv_geom_t g = *geom;
    if (g.block_size == 0)
        g.block_size = KV_POOL_DEFAULT_BLOCK_SIZE;
    if (g.n_layers <= 0 || g.n_blocks <= 0 || g.block_size <= 0 || g.n_kv_heads <= 0 ||
        g.head_dim <= 0)
        return baton_error(BATON_ERR_INVALID_ARG,
                           "kv_pool_init: bad geometry (layers %d, blocks %d, block_size %d, kv_heads %d, head_dim %d)",
                           g.n_layers, g.n_blocks, g.block_size, g.n_kv_heads, g.head_dim);
    if (g.dtype != be->kv_dtype)
        return baton_error(BATON_ERR_INVALID_ARG, "kv_pool_init: KV dtype %s but backend %s keeps %s",
                           backend_dtype_name(g.dtype), be->ops->name, backend_dtype_name(be->kv_dtype));
    /* bytes = layers * blocks * block_size * kv_heads * head_dim * dtype, checked */
    const uint64_t factors[] = {(uint64_t)g.n_layers, (uint64_t)g.n_blocks, (uint64_t)g.block_size,
                                (uint64_t)g.n_kv_heads, (uint64_t)g.head_dim,
                                (uint64_t)backend_dtype_size(g.dtype)};
    uint64_t bytes = 1;
    for (size_t i = 0; i < sizeof(factors) / sizeof(factors[0]); i++) {
        if (factors[i] == 0 || bytes > (uint64_t)SIZE_MAX / factors[i])
            return baton_error(BATON_ERR_INVALID_ARG, "kv_pool_init: pool size overflows size_t");
        bytes *= factors[i];
    }
    kv_pool_t *p = calloc(1, sizeof(*p));
    if (!p)
        return baton_error(BATON_ERR_NO_MEMORY, "kv_pool_init: out of memory");
    p->be = be;
    p->geom = g;
    p->bytes = (size_t)bytes;
    p->block_bytes = backend_kv_block_bytes(&g);
    p->refcnt = calloc((size_t)g.n_blocks, sizeof(int32_t));
    p->free_ids = malloc((size_t)g.n_blocks * sizeof(int32_t));
    if (!p->refcnt || !p->free_ids) {
        kv_pool_free(p);
        return baton_error(BATON_ERR_NO_MEMORY, "kv_pool_init: out of memory for %d blocks", g.n_blocks);
    }
    pthread_mutex_init(&p->lock, NULL);
    p->k_base = be->ops->alloc(be, p->bytes);
    p->v_base = p->k_base ? be->ops->alloc(be, p->bytes) : NULL;
    if (!p->k_base || !p->v_base) {
        kv_pool_free(p);
        return baton_error(BATON_ERR_NO_MEMORY, "kv_pool_init: cannot allocate 2 x %zu bytes of KV",
                           (size_t)bytes);
    }
    baton_status_t st = be->ops->memset_zero(be, p->k_base, p->bytes);
    if (st == BATON_OK)
        st = be->ops->memset_zero(be, p->v_base, p->bytes);
    if (st != BATON_OK) {
        kv_pool_free(p);
        return st;
    }
    /* Stack in reverse so that the first allocations get ids 0, 1, 2, ... */
    for (int32_t i = 0; i < g.n_blocks; i++)
        p->free_ids[i] = g.n_blocks - 1 - i;
    p->n_free = g.n_blocks;
    *out = p;
    return BATON_OK;
}

void kv_pool_free(kv_pool_t *p) {
    if (!p)
        return;
    if (p->k_base)
        p->be->ops->free(p->be, p->k_base);
    if (p->v_base)
        p->be->ops->free(p->be, p->v_base);
    if (p->refcnt && p->free_ids)
        pthread_mutex_destroy(&p->lock);
    free(p->refcnt);
    free(p->free_ids);
    free(p);
}

const backend_kv_geom_t *kv_pool_geom(const kv_pool_t *p) { return &p->geom; }
void *kv_pool_k_base(const kv_pool_t *p) { return p->k_base; }
void *kv_pool_v_base(const kv_pool_t *p) { return p->v_base; }
size_t kv_pool_bytes(const kv_pool_t *p) { return p->bytes; }
size_t kv_pool_block_bytes(const kv_pool_t *p) { return p->block_bytes; }

static pthread_mutex_t *pool_lock(const kv_pool_t *p) { return (pthread_mutex_t *)&p->lock; }

/* Caller holds the lock. */
static baton_status_t pool_alloc_locked(kv_pool_t *p, int32_t n, int32_t *ids) {
    if (n > p->n_free)
        return baton_error(BATON_ERR_NO_SPACE, "kv_pool: %d blocks asked, %d of %d free", n, p->n_free,
                           p->geom.n_blocks);
    for (int32_t i = 0; i < n; i++) {
        int32_t id = p->free_ids[--p->n_free];
        p->refcnt[id] = 1;
        ids[i] = id;
    }
    return BATON_OK;
}

static baton_status_t pool_check_live_locked(const kv_pool_t *p, int32_t id, const char *op) {
    if (id < 0 || id >= p->geom.n_blocks)
        return baton_error(BATON_ERR_INVALID_ARG, "kv_pool_%s: block id %d outside 0..%d", op, id,
                           p->geom.n_blocks - 1);
    if (p->refcnt[id] <= 0)
        return baton_error(BATON_ERR_INVALID_ARG, "kv_pool_%s: block %d is free", op, id);
    return BATON_OK;
}

/* Caller holds the lock and has checked that `id` is live. */
static void pool_unref_locked(kv_pool_t *p, int32_t id) {
    if (--p->refcnt[id] == 0)
        p->free_ids[p->n_free++] = id;
}

baton_status_t kv_pool_alloc(kv_pool_t *p, int32_t n, int32_t *ids) {
    if (!p || n < 0 || (n > 0 && !ids))
        return baton_error(BATON_ERR_INVALID_ARG, "kv_pool_alloc: bad argument (n %d)", n);
    pthread_mutex_lock(&p->lock);
    baton_status_t st = pool_alloc_locked(p, n, ids);
    pthread_mutex_unlock(&p->lock);
    return st;
}

baton_status_t kv_pool_ref(kv_pool_t *p, int32_t id) {
    if (!p)
        return baton_error(BATON_ERR_INVALID_ARG, "kv_pool_ref: pool is NULL");
    pthread_mutex_lock(&p->lock);
    baton_status_t st = pool_check_live_locked(p, id, "ref");
    if (st == BATON_OK)
        p->refcnt[id]++;
    pthread_mutex_unlock(&p->lock);
    return st;
}

baton_status_t kv_pool_unref(kv_pool_t *p, int32_t id) {
    if (!p)
        return baton_error(BATON_ERR_INVALID_ARG, "kv_pool_unref: pool is NULL");
    pthread_mutex_lock(&p->lock);
    baton_status_t st = pool_check_live_locked(p, id, "unref");
    if (st == BATON_OK)
        pool_unref_locked(p, id);
    pthread_mutex_unlock(&p->lock);
    return st;
}

int32_t kv_pool_refcount(const kv_pool_t *p, int32_t id) {
    if (!p || id < 0 || id >= p->geom.n_blocks)
        return -1;
    pthread_mutex_lock(pool_lock(p));
    int32_t c = p->refcnt[id];
    pthread_mutex_unlock(pool_lock(p));
    return c;
}

int32_t kv_pool_n_free(const kv_pool_t *p) {
    if (!p)
        return 0;
    pthread_mutex_lock(pool_lock(p));
    int32_t n = p->n_free;
    pthread_mutex_unlock(pool_lock(p));
    return n;
}

int32_t kv_pool_n_used(const kv_pool_t *p) {
    if (!p)
        return 0;
    return p->geom.n_blocks - kv_pool_n_free(p);
}

/* ---------------- block tables ---------------- */

void kv_block_table_init(kv_block_table_t *t) {
    if (t)
        memset(t, 0, sizeof(*t));
}

/* Makes room for `need` entries in t->blocks. */
static baton_status_t table_grow(kv_block_table_t *t, int64_t need) {
    if (need <= t->capacity)
        return BATON_OK;
    if (need > INT32_MAX)
        return baton_error(BATON_ERR_INVALID_ARG, "kv_block_table: %lld blocks", (long long)need);
    int64_t cap = t->capacity ? (int64_t)t->capacity * 2 : 8;
    if (cap < need)
        cap = need;
    if (cap > INT32_MAX)
        cap = INT32_MAX;
    int32_t *b = realloc(t->blocks, (size_t)cap * sizeof(int32_t));
    if (!b)
        return baton_error(BATON_ERR_NO_MEMORY, "kv_block_table: out of memory for %lld blocks",
                           (long long)cap);
    t->blocks = b;
    t->capacity = (int32_t)cap;
    return BATON_OK;
}

baton_status_t kv_block_table_reserve(kv_block_table_t *t, kv_pool_t *p, int32_t n_tokens) {
    if (!t || !p || n_tokens < 0)
        return baton_error(BATON_ERR_INVALID_ARG, "kv_block_table_reserve: bad argument (n_tokens %d)",
                           n_tokens);
    if (n_tokens <= t->n_tokens)
        return BATON_OK;
    const int64_t bs = p->geom.block_size;
    const int64_t need = ((int64_t)n_tokens + bs - 1) / bs;
    if (need > t->n_blocks) {
        baton_status_t st = table_grow(t, need);
        if (st != BATON_OK)
            return st;
        st = kv_pool_alloc(p, (int32_t)(need - t->n_blocks), t->blocks + t->n_blocks);
        if (st != BATON_OK)
            return st;
        t->n_blocks = (int32_t)need;
    }
    t->n_tokens = n_tokens;
    return BATON_OK;
}

baton_status_t kv_block_table_append_shared(kv_block_table_t *t, kv_pool_t *p, const int32_t *ids,
                                            int32_t n) {
    if (!t || !p || n < 0 || (n > 0 && !ids))
        return baton_error(BATON_ERR_INVALID_ARG, "kv_block_table_append_shared: bad argument (n %d)", n);
    const int64_t bs = p->geom.block_size;
    if ((int64_t)t->n_tokens != (int64_t)t->n_blocks * bs)
        return baton_error(BATON_ERR_INVALID_ARG,
                           "kv_block_table_append_shared: table claims %d tokens in %d blocks of %lld (last block partly filled)",
                           t->n_tokens, t->n_blocks, (long long)bs);
    if ((int64_t)t->n_tokens + (int64_t)n * bs > INT32_MAX)
        return baton_error(BATON_ERR_INVALID_ARG, "kv_block_table_append_shared: token count overflows");
    baton_status_t st = table_grow(t, (int64_t)t->n_blocks + n);
    if (st != BATON_OK)
        return st;
    pthread_mutex_lock(&p->lock);
    for (int32_t i = 0; i < n; i++) {
        st = pool_check_live_locked(p, ids[i], "ref");
        if (st != BATON_OK) {
            pthread_mutex_unlock(&p->lock);
            return st;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        p->refcnt[ids[i]]++;
        t->blocks[t->n_blocks++] = ids[i];
    }
    pthread_mutex_unlock(&p->lock);
    t->n_tokens += (int32_t)(n * bs);
    return BATON_OK;
}

void kv_block_table_release(kv_block_table_t *t, kv_pool_t *p) {
    if (!t)
        return;
    if (p && t->n_blocks > 0) {
        pthread_mutex_lock(&p->lock);
        for (int32_t i = 0; i < t->n_blocks; i++) {
            /* A table only holds live ids it took a reference on; a
             * failure here means a caller unref'd a table's block. */
            if (pool_check_live_locked(p, t->blocks[i], "unref") == BATON_OK)
                pool_unref_locked(p, t->blocks[i]);
            else
                LOG_WARN("kv_pool", "block table released block %d that was already free",
                         t->blocks[i]);
        }
        pthread_mutex_unlock(&p->lock);
    }
    free(t->blocks);
    memset(t, 0, sizeof(*t));
}
