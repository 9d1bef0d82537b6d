/* engine/pool.c under ASan/UBSan: every row of a job runs exactly once, for every
 * count of rows and threads; a thread done with its share takes the rest of a slower
 * one's; and the shares the threads start from follow their speeds: with the calling
 * thread made ten times slower a row, its first call gets well below an even share,
 * and the rows are still each run once; pool_forget puts the shares back to even. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "clock.h"
#include "pool.h"

#define MAX_ROWS 200
#define LEARNT 21 /* jobs whose median is taken */

typedef struct job {
    atomic_int runs[MAX_ROWS];
    pthread_t caller;
    double caller_us, worker_us; /* busy time a row on each side */
    atomic_long caller_rows;
    atomic_long caller_first; /* rows in the caller's first call of the job */
    int wait_worker;          /* the caller's rows start once a worker's have (at most 2 s) */
    atomic_int worker_seen;
} job;

static double now_us(void) { return coli_now() * 1e6; }

static void rows(void *ctx, int64_t b, int64_t e) {
    job *j = ctx;
    const int caller = pthread_equal(pthread_self(), j->caller);
    if (!caller) atomic_store(&j->worker_seen, 1);
    const double until = now_us() + 2e6;
    while (caller && j->wait_worker && !atomic_load(&j->worker_seen) && now_us() < until) {
    }
    const double per = caller ? j->caller_us : j->worker_us, end = now_us() + per * (double)(e - b);
    while (per > 0 && now_us() < end) {
    }
    if (caller) {
        long none = 0;
        atomic_compare_exchange_strong(&j->caller_first, &none, (long)(e - b));
        atomic_fetch_add(&j->caller_rows, e - b);
    }
    for (int64_t r = b; r < e; r++) atomic_fetch_add(&j->runs[r], 1);
}

static int by_value(const void *a, const void *b) {
    const long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

static int each_once(const job *j, int64_t n, const char *what) {
    for (int64_t r = 0; r < MAX_ROWS; r++) {
        const int want = r < n, got = atomic_load(&j->runs[r]);
        if (got != want) {
            printf("FAIL %s: row %lld of %lld ran %d times\n", what, (long long)r, (long long)n, got);
            return 1;
        }
    }
    return 0;
}

static void reset(job *j) {
    for (int r = 0; r < MAX_ROWS; r++) atomic_store(&j->runs[r], 0);
    atomic_store(&j->caller_rows, 0);
    atomic_store(&j->caller_first, 0);
    atomic_store(&j->worker_seen, 0);
}

int main(void) {
    static job j;
    j.caller = pthread_self();
    for (int threads = 1; threads <= 4; threads++) {
        pool *p = pool_create(threads);
        for (int64_t n = 0; n <= 70; n++) {
            reset(&j);
            pool_run(p, rows, &j, n);
            if (each_once(&j, n, "even")) return 1;
        }
        pool_destroy(p);
    }
    puts("every row once, 0 to 70 rows on 1 to 4 threads");

    pool *p = pool_create(2);
    j.caller_us = 4000.0, j.worker_us = 1.0; /* the caller's first call lasts 96 ms: room for a late worker */
    /* even shares, the caller slow and started after the worker (however late the
     * worker's thread starts): the worker takes what is left of the caller's share */
    reset(&j);
    j.wait_worker = 1;
    pool_run(p, rows, &j, 64);
    j.wait_worker = 0;
    if (each_once(&j, 64, "taken")) return 1;
    const long even_first = atomic_load(&j.caller_first), even_rows = atomic_load(&j.caller_rows);
    j.caller_us = 40.0, j.worker_us = 4.0; /* rows long beside a busy machine's scheduling */
    /* the caller's first call over the last jobs, their median: a thread descheduled
     * by a busy machine makes any one job's odd */
    long firsts[LEARNT] = {0}, last = 0;
    for (int k = 0; k < 200; k++) {
        reset(&j);
        pool_run(p, rows, &j, 64);
        if (each_once(&j, 64, "skewed")) return 1;
        firsts[k % LEARNT] = atomic_load(&j.caller_first), last = atomic_load(&j.caller_rows);
    }
    qsort(firsts, LEARNT, sizeof firsts[0], by_value);
    const long first = firsts[LEARNT / 2];
    for (int64_t n = 0; n <= 70; n++) { /* the learnt cuts on short jobs too */
        reset(&j);
        pool_run(p, rows, &j, n);
        if (each_once(&j, n, "skewed, short")) return 1;
    }
    /* even shares again, until jobs teach otherwise; the worker slow, so that it takes
     * none of the caller's rows before the caller's first call, unless the caller is
     * descheduled at its start: the largest of a few tries */
    j.caller_us = 1.0, j.worker_us = 100.0;
    long forgotten = 0;
    for (int k = 0; k < 5; k++) {
        pool_forget(p);
        reset(&j);
        pool_run(p, rows, &j, 64);
        if (each_once(&j, 64, "forgotten")) return 1;
        const long f = atomic_load(&j.caller_first);
        forgotten = f > forgotten ? f : forgotten;
    }
    pool_destroy(p);
    if (even_rows >= 32) {
        printf("FAIL the slow caller's share was not taken from: it ran %ld of 64 rows\n", even_rows);
        return 1;
    }
    /* a share's first call is most of it: more than a quarter of 64 rows where even */
    if (even_first <= 16 || forgotten != even_first || first >= even_first / 2) {
        printf("FAIL the caller's first call: %ld rows where even, %ld once learnt, %ld once forgotten\n", even_first,
               first, forgotten);
        return 1;
    }
    printf("a slow caller: %ld of 64 rows from an even share (its first call %ld); ten times slower, its first "
           "call %ld once its speed is learnt (%ld rows), %ld once forgotten\n",
           even_rows, even_first, first, last, forgotten);
    return 0;
}
