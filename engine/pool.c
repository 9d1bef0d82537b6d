#include "pool.h"

#include <pthread.h>
#include <stdlib.h>

struct pool {
    int n;                 /* workers, the caller is one more */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t generation;
    int pending, stop;
    pool_fn fn;
    void *ctx;
    int64_t total;
};

static void slice(int64_t n, int parts, int i, int64_t *b, int64_t *e) {
    *b = n * i / parts;
    *e = n * (i + 1) / parts;
}

typedef struct { pool *p; int index; } worker_arg;

static void *worker(void *arg) {
    worker_arg *w = arg;
    pool *p = w->p;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->go, &p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            free(w);
            return NULL;
        }
        seen = p->generation;
        pool_fn fn = p->fn;
        void *ctx = p->ctx;
        int64_t total = p->total, b, e;
        pthread_mutex_unlock(&p->mu);
        slice(total, p->n + 1, w->index + 1, &b, &e);
        if (b < e) fn(ctx, b, e);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
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
    p->stop = 1;
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
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->total = n;
    p->pending = p->n;
    p->generation++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    slice(n, p->n + 1, 0, &b, &e);
    if (b < e) fn(ctx, b, e);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
