/* engine/pool.c under ASan/UBSan: every row of a job runs exactly once, for every
 * count of rows and threads, and the threads' shares follow their speeds: with the
 * calling thread made ten times slower a row, its share falls well below an even one,
 * and the rows are still each run once; pool_forget puts the shares back to even. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "clock.h"
#include "pool.h"

#define MAX_ROWS 200

typedef struct job {
    atomic_int runs[MAX_ROWS];
    pthread_t caller;
    double caller_us, worker_us; /* busy time a row on each side */
    atomic_long caller_rows;
} job;

static double now_us(void) { return coli_now() * 1e6; }

static void rows(void *ctx, int64_t b, int64_t e) {
    job *j = ctx;
    const int caller = pthread_equal(pthread_self(), j->caller);
    const double per = caller ? j->caller_us : j->worker_us, end = now_us() + per * (double)(e - b);
    while (per > 0 && now_us() < end) {
    }
    if (caller) atomic_fetch_add(&j->caller_rows, e - b);
    for (int64_t r = b; r < e; r++) atomic_fetch_add(&j->runs[r], 1);
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
    j.caller_us = 10.0, j.worker_us = 1.0;
    long last = 0;
    for (int k = 0; k < 200; k++) {
        reset(&j);
        pool_run(p, rows, &j, 64);
        if (each_once(&j, 64, "skewed")) return 1;
        last = atomic_load(&j.caller_rows);
    }
    for (int64_t n = 0; n <= 70; n++) { /* the learnt cuts on short jobs too */
        reset(&j);
        pool_run(p, rows, &j, n);
        if (each_once(&j, n, "skewed, short")) return 1;
    }
    pool_forget(p); /* even halves again, until jobs teach otherwise */
    reset(&j);
    pool_run(p, rows, &j, 64);
    const long forgotten = atomic_load(&j.caller_rows);
    pool_destroy(p);
    if (forgotten != 32) {
        printf("FAIL after pool_forget the caller ran %ld of 64 rows, not 32\n", forgotten);
        return 1;
    }
    if (last > 64 * 35 / 100) {
        printf("FAIL the slow caller still ran %ld of 64 rows\n", last);
        return 1;
    }
    printf("a caller ten times slower a row ends with %ld of 64 rows, 32 once forgotten\n", last);
    return 0;
}
