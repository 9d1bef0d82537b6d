#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* Workers spin this many polls for the next job before sleeping: a decode step
 * issues hundreds of small jobs, and a futex wake-up per job costs more than
 * the job. */
#define SPIN_POLLS 200000

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
    int64_t total;
};

static void slice(int64_t n, int parts, int i, int64_t *b, int64_t *e) {
    *b = n * i / parts;
    *e = n * (i + 1) / parts;
}

typedef struct {
    pool *p;
    int index;
} worker_arg;

static void *worker(void *arg) {
    worker_arg *w = arg;
    pool *p = w->p;
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
        int64_t b, e;
        slice(p->total, p->n + 1, w->index + 1, &b, &e);
        if (b < e) p->fn(p->ctx, b, e);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    free(w);
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
    for (int i = 0; i < threads - 1; i++) {
        worker_arg *w = malloc(sizeof *w);
        if (!w) break;
        w->p = p;
        w->index = i;
        if (pthread_create(&p->threads[i], NULL, worker, w) != 0) {
            free(w);
            break;
        }
        p->n++;
    }
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
    int64_t b, e;
    p->fn = fn;
    p->ctx = ctx;
    p->total = n;
    atomic_store(&p->pending, p->n);
    /* the release publishes fn, ctx and total to the workers' acquire */
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->mu);
    }
    slice(n, p->n + 1, 0, &b, &e);
    if (b < e) fn(ctx, b, e);
    for (long i = 0; i < SPIN_POLLS && atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++) {
    }
    if (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
