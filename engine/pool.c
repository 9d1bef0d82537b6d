#include "pool.h"

#include "clock.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* Workers spin this many polls for the next job before sleeping: a decode step
 * issues hundreds of small jobs, and a futex wake-up per job costs more than
 * the job. */
#define SPIN_POLLS 200000

/* The threads' shares of a job follow their measured speeds (rows a microsecond, an
 * average over jobs long enough to time): two threads given equal halves end apart
 * when one of them runs slower (a busier core), and the other then waits. What the
 * speeds do not foresee (a job's own jitter, a thread that starts late) the thread
 * done first takes over: a share's last rows go a piece a call, from its far end. */
#define MAX_SHARED 256
#define TIMED_US 20.0 /* jobs whose slowest share took less are not timed */
#define RATE_KEEP 0.9 /* an average's weight against the latest job */
#define RATE_LEAST 0.2 /* a job's speeds, relative to their mean, bounded */
#define RATE_MOST 5.0

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
    int64_t cut[MAX_SHARED + 1]; /* thread i's share starts as [cut[i], cut[i + 1]) */
    /* rows a call after a share's first, and a taking's: a share's rows are most of
     * them taken in one call, as a thread reads its rows in one stream and a call of
     * int4 rows makes x's digits where it is not given them */
    int64_t piece;
    /* thread i's rows not yet taken, [low, high) as low | high << 32: its owner takes
     * from the low end, a thread done with its own from the high end */
    _Alignas(64) atomic_uint_fast64_t left[MAX_SHARED];
    double took[MAX_SHARED];  /* microseconds thread i spent on rows */
    int64_t ran[MAX_SHARED];  /* rows thread i ran */
    double rate[MAX_SHARED];  /* thread i's speed, relative */
};

static uint64_t span_of(int64_t low, int64_t high) { return (uint64_t)low | (uint64_t)high << 32; }

/* Rows of the job for thread i, from the low end of its own share (most of it in one
 * call, then pieces, so that a thread that ends first can take the rest), else from
 * the high end of the share with the most rows left; 0 when none is left. */
static int take(pool *p, int i, int64_t *b, int64_t *e) {
    atomic_uint_fast64_t *own = &p->left[i];
    for (uint64_t w = atomic_load_explicit(own, memory_order_relaxed);;) {
        const int64_t low = (int64_t)(w & 0xffffffffu), high = (int64_t)(w >> 32);
        if (low >= high) break;
        const int64_t rest = high - low, count = rest > 4 * p->piece ? rest - 4 * p->piece : p->piece;
        const int64_t end = low + (count < rest ? count : rest);
        if (atomic_compare_exchange_weak_explicit(own, &w, span_of(end, high), memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *b = low, *e = end;
            return 1;
        }
    }
    for (;;) {
        int victim = -1;
        int64_t most = 0;
        for (int k = 0; k <= p->n; k++) {
            const uint64_t w = atomic_load_explicit(&p->left[k], memory_order_relaxed);
            const int64_t rest = (int64_t)(w >> 32) - (int64_t)(w & 0xffffffffu);
            if (rest > most) most = rest, victim = k;
        }
        if (victim < 0) return 0;
        uint64_t w = atomic_load_explicit(&p->left[victim], memory_order_relaxed);
        const int64_t low = (int64_t)(w & 0xffffffffu), high = (int64_t)(w >> 32);
        if (low >= high) continue;
        const int64_t start = high - p->piece > low ? high - p->piece : low;
        if (atomic_compare_exchange_strong_explicit(&p->left[victim], &w, span_of(low, start), memory_order_relaxed,
                                                    memory_order_relaxed)) {
            *b = start, *e = high;
            return 1;
        }
    }
}

/* Thread i's rows run until none is left, and timed. */
static void run_share(pool *p, int i) {
    int64_t b, e, rows = 0;
    const double t0 = coli_now();
    while (take(p, i, &b, &e)) p->fn(p->ctx, b, e), rows += e - b;
    p->took[i] = (coli_now() - t0) * 1e6;
    p->ran[i] = rows;
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
        run_share(p, w->index + 1);
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
    if (threads > MAX_SHARED) threads = MAX_SHARED;
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
    for (int i = 0; i < MAX_SHARED; i++) p->rate[i] = 1.0;
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

void pool_forget(pool *p) {
    for (int i = 0; p && i < MAX_SHARED; i++) p->rate[i] = 1.0;
}

/* The rows' cuts by the threads' rates; every thread gets at least one row where
 * there are enough. */
static void cut_rows(pool *p, int64_t n) {
    const int parts = p->n + 1;
    double sum = 0.0, run = 0.0;
    for (int i = 0; i < parts; i++) sum += p->rate[i];
    p->cut[0] = 0;
    for (int i = 0; i < parts; i++) {
        run += p->rate[i];
        int64_t c = i + 1 == parts ? n : (int64_t)((double)n * run / sum + 0.5);
        const int64_t least = p->cut[i] + (n >= parts), most = n - (n >= parts ? parts - 1 - i : 0);
        p->cut[i + 1] = c < least ? least : c > most ? most : c;
    }
}

/* Each thread's rows a microsecond in this job, into its average rate, where every
 * share had rows and the job was long enough to time. */
static void learn_rates(pool *p) {
    const int parts = p->n + 1;
    double speed[MAX_SHARED], mean = 0.0, slowest = 0.0;
    for (int i = 0; i < parts; i++) {
        const int64_t rows = p->ran[i];
        if (rows <= 0 || p->took[i] <= 0.0) return;
        if (p->took[i] > slowest) slowest = p->took[i];
        speed[i] = (double)rows / p->took[i];
        mean += speed[i] / parts;
    }
    if (slowest < TIMED_US) return;
    for (int i = 0; i < parts; i++) { /* one odd job (a thread descheduled) moves a rate a bounded step */
        const double rel = speed[i] / mean, bounded = rel < RATE_LEAST ? RATE_LEAST : rel > RATE_MOST ? RATE_MOST : rel;
        p->rate[i] = RATE_KEEP * p->rate[i] + (1.0 - RATE_KEEP) * bounded;
    }
}

void pool_run(pool *p, pool_fn fn, void *ctx, int64_t n) {
    /* a share is two 32-bit halves of one word: no job has 2^32 rows (rows, heads, tokens) */
    if (!p || p->n == 0 || n < 2 || (uint64_t)n > UINT32_MAX) {
        if (n > 0) fn(ctx, 0, n);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    cut_rows(p, n);
    const int64_t piece = n / (16 * (p->n + 1));
    p->piece = piece > 0 ? piece : 1;
    for (int i = 0; i <= p->n; i++)
        atomic_store_explicit(&p->left[i], span_of(p->cut[i], p->cut[i + 1]), memory_order_relaxed);
    atomic_store(&p->pending, p->n);
    /* the release publishes fn, ctx, the piece and the shares to the workers' acquire */
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->mu);
    }
    run_share(p, 0);
    for (long i = 0; i < SPIN_POLLS && atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++) {
    }
    if (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
    /* the workers' acq_rel decrements published their times */
    learn_rates(p);
}
