/* A persistent pthread pool for the CPU backend's parallel sections.
 *
 * cpu_pool_run() hands task indices 0..n_tasks-1 to the workers and the
 * calling thread through one atomic counter (dynamic scheduling, so uneven
 * tasks such as causal attention rows balance themselves) and returns when
 * every task has run. Workers sleep on a condition variable between runs; no
 * thread is created per call. Runs on one pool are serialized by a mutex.
 *
 * OpenBLAS has its own threads; the CPU backend never calls BLAS from inside
 * a pool task, so the two pools never run at the same time. */
#ifndef BATON_KERNELS_CPU_THREAD_POOL_H
#define BATON_KERNELS_CPU_THREAD_POOL_H

#include <stdint.h>

#include "common/status.h"

typedef struct cpu_pool cpu_pool_t;

/* Task body: `task` in 0..n_tasks-1, `worker` in 0..n_threads-1 (0 is the
 * calling thread); a worker runs one task at a time, so per-worker scratch
 * indexed by `worker` needs no locking. */
typedef void (*cpu_pool_task_fn)(void *arg, int64_t task, int worker);

/* Creates a pool of `n_threads` threads in all: the caller of cpu_pool_run
 * plus n_threads - 1 workers (n_threads >= 1). Free with cpu_pool_free.
 * Errors: BATON_ERR_INVALID_ARG, BATON_ERR_NO_MEMORY, BATON_ERR_INTERNAL
 * (pthread_create failed; nothing is left running). */
baton_status_t cpu_pool_init(int n_threads, cpu_pool_t **out);

/* Stops and joins the workers and frees the pool. NULL-safe. */
void cpu_pool_free(cpu_pool_t *pool);

/* Threads in the pool, the caller included. */
int cpu_pool_n_threads(const cpu_pool_t *pool);

/* Runs fn(arg, i, worker) for every i in 0..n_tasks-1 and returns when all
 * are done. n_tasks <= 1 or a 1-thread pool runs inline on the caller. Must
 * not be called from inside a task of the same pool (it would wait on
 * itself). */
void cpu_pool_run(cpu_pool_t *pool, int64_t n_tasks, cpu_pool_task_fn fn, void *arg);

#endif
