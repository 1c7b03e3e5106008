/* Persistent worker pool: one generation counter wakes the workers for a run,
 * one atomic counter hands out tasks, one pending count says when the run is
 * over. */
#include "kernels/cpu/thread_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

typedef struct cpu_worker {
    cpu_pool_t *pool;
    int id;
    pthread_t thread;
} cpu_worker_t;

struct cpu_pool {
    int n_threads;
    cpu_worker_t *workers;  /* [n_threads - 1] */
    pthread_mutex_t run_lock; /* serializes cpu_pool_run callers */
    pthread_mutex_t lock;
    pthread_cond_t start;
    pthread_cond_t done;
    uint64_t generation;    /* bumped once per run (under lock) */
    int pending;            /* workers not yet finished with this run */
    int stop;
    /* the current run */
    cpu_pool_task_fn fn;
    void *arg;
    int64_t n_tasks;
    _Atomic int64_t next;
};

static void pool_work(cpu_pool_t *p, int worker) {
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= p->n_tasks)
            break;
        p->fn(p->arg, i, worker);
    }
}

static void *pool_main(void *argp) {
    cpu_worker_t *w = argp;
    cpu_pool_t *p = w->pool;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        while (p->generation == seen && !p->stop)
            pthread_cond_wait(&p->start, &p->lock);
        if (p->stop) {
            pthread_mutex_unlock(&p->lock);
            return NULL;
        }
        seen = p->generation;
        pthread_mutex_unlock(&p->lock);

        pool_work(p, w->id);

        pthread_mutex_lock(&p->lock);
        if (--p->pending == 0)
            pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->lock);
    }
}

baton_status_t cpu_pool_init(int n_threads, cpu_pool_t **out) {
    if (!out || n_threads < 1)
        return baton_error(BATON_ERR_INVALID_ARG, "cpu_pool_init: n_threads %d < 1", n_threads);
    cpu_pool_t *p = calloc(1, sizeof(*p));
    if (!p)
        return baton_error(BATON_ERR_NO_MEMORY, "cpu_pool_init: out of memory");
    p->n_threads = n_threads;
    if (n_threads > 1) {
        p->workers = calloc((size_t)n_threads - 1, sizeof(*p->workers));
        if (!p->workers) {
            free(p);
            return baton_error(BATON_ERR_NO_MEMORY, "cpu_pool_init: out of memory");
        }
    }
    pthread_mutex_init(&p->run_lock, NULL);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->next, 0);
    int started = 0;
    for (int i = 0; i < n_threads - 1; i++) {
        p->workers[i].pool = p;
        p->workers[i].id = i + 1;
        if (pthread_create(&p->workers[i].thread, NULL, pool_main, &p->workers[i]) != 0)
            break;
        started++;
    }
    if (started != n_threads - 1) {
        p->n_threads = started + 1;
        cpu_pool_free(p);
        return baton_error(BATON_ERR_INTERNAL, "cpu_pool_init: pthread_create failed after %d of %d threads",
                           started, n_threads - 1);
    }
    *out = p;
    return BATON_OK;
}

void cpu_pool_free(cpu_pool_t *p) {
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->n_threads - 1; i++)
        pthread_join(p->workers[i].thread, NULL);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->start);
    pthread_mutex_destroy(&p->lock);
    pthread_mutex_destroy(&p->run_lock);
    free(p->workers);
    free(p);
}

int cpu_pool_n_threads(const cpu_pool_t *p) { return p ? p->n_threads : 1; }

void cpu_pool_run(cpu_pool_t *p, int64_t n_tasks, cpu_pool_task_fn fn, void *arg) {
    if (n_tasks <= 0)
        return;
    if (n_tasks == 1 || p->n_threads == 1) {
        for (int64_t i = 0; i < n_tasks; i++)
            fn(arg, i, 0);
        return;
    }
    pthread_mutex_lock(&p->run_lock);
    pthread_mutex_lock(&p->lock);
    p->fn = fn;
    p->arg = arg;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    p->pending = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->lock);

    pool_work(p, 0);

    pthread_mutex_lock(&p->lock);
    while (p->pending > 0)
        pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_unlock(&p->run_lock);
}
