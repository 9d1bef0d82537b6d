#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* Workers spin this many polls for the next job before sleeping: a decode step
 * issues hundreds of small jobs, and a futex wake-up per job costs more than
 * the job. */
#define SPIN_POLLS 200000

/* A job's items go out in about this many chunks a thread, each thread taking the next
 * chunk when it is done with its last: a thread slowed by the machine (a shared host's
 * other guests) takes fewer, where equal halves had the other thread waiting for it. */
#define CHUNKS_PER_THREAD 4

struct pool {
    int n; /* workers; the caller is one more */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    atomic_uint_fast64_t generation;
    atomic_int pending;
    atomic_int sleepers;
    atomic_int stop;
    pool_fn fn;
    void *ctx;
    int64_t total, chunk;
    atomic_int_fast64_t next; /* the first item no thread has taken */
};

/* Chunks of the job until none is left. */
static void take_chunks(pool *p) {
    for (;;) {
        const int64_t b = atomic_fetch_add_explicit(&p->next, p->chunk, memory_order_relaxed);
        if (b >= p->total) return;
        p->fn(p->ctx, b, b + p->chunk < p->total ? b + p->chunk : p->total);
    }
}

static void *worker(void *arg) {
    pool *p = arg;
    uint_fast64_t seen = 0;
    for (;;) {
        uint_fast64_t gen = seen;
        for (long i = 0; i < SPIN_POLLS && gen == seen && !atomic_load(&p->stop); i++)
            gen = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (gen == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (!atomic_load(&p->stop) && (gen = atomic_load(&p->generation)) == seen)
                pthread_cond_wait(&p->go, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) break;
        seen = gen;
        take_chunks(p);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

pool *pool_create(int threads) {
    if (threads <= 1) return NULL;
    pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->threads = calloc((size_t)threads - 1, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->next, 0);
    for (int i = 0; i < threads - 1 && pthread_create(&p->threads[i], NULL, worker, p) == 0; i++) p->n++;
    return p;
}

void pool_destroy(pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}

int pool_threads(const pool *p) { return p ? p->n + 1 : 1; }

void pool_run(pool *p, pool_fn fn, void *ctx, int64_t n) {
    if (!p || p->n == 0 || n < 2) {
        if (n > 0) fn(ctx, 0, n);
        return;
    }
    const int64_t chunks = (int64_t)(p->n + 1) * CHUNKS_PER_THREAD;
    p->fn = fn;
    p->ctx = ctx;
    p->total = n;
    p->chunk = (n + chunks - 1) / chunks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store(&p->pending, p->n);
    /* the release publishes fn, ctx, total, chunk and next to the workers' acquire */
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->mu);
    }
    take_chunks(p);
    for (long i = 0; i < SPIN_POLLS && atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++) {
    }
    if (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
