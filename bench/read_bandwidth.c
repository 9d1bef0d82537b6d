/* What this machine's cores can stream from memory: `threads` threads each read
 * their share of a buffer `mib` MiB large (much larger than the caches) as 64-bit
 * words into four sums, `repeat` times; the median pass's GB/s as one JSON line.
 * The limit a decode figure is a share of (bench/engine_speed.py runs it beside the
 * engine, with the engine's threads).
 *
 *   gcc -std=c11 -O2 -march=native -pthread bench/read_bandwidth.c -o read_bandwidth
 *   ./read_bandwidth --threads 2 --mib 1024 --repeat 7 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct part {
    const uint64_t *words;
    size_t count;
    uint64_t sum;
    pthread_barrier_t *start;
} part;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *stream(void *arg) {
    part *p = arg;
    pthread_barrier_wait(p->start);
    uint64_t a = 0, b = 0, c = 0, d = 0;
    size_t i = 0;
    for (; i + 4 <= p->count; i += 4) a += p->words[i], b += p->words[i + 1], c += p->words[i + 2], d += p->words[i + 3];
    for (; i < p->count; i++) a += p->words[i];
    p->sum = a + b + c + d;
    return NULL;
}

static int by_value(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* A whole number in [lo, hi] from `text`, or -1. */
static long whole(const char *text, long lo, long hi) {
    char *end = NULL;
    const long v = text ? strtol(text, &end, 10) : -1;
    return text && *text && end && !*end && v >= lo && v <= hi ? v : -1;
}

int main(int argc, char **argv) {
    long threads = 1, mib = 1024, repeat = 7;
    for (int i = 1; i < argc; i++) {
        const char *name = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        long *out = !strcmp(name, "--threads") ? &threads : !strcmp(name, "--mib") ? &mib
                    : !strcmp(name, "--repeat") ? &repeat : NULL;
        const long hi = out == &threads ? 256 : out == &mib ? 1 << 16 : 101;
        if (!out || (*out = whole(value, 1, hi)) < 0) {
            fprintf(stderr, "read_bandwidth: %s %s: want --threads 1..256, --mib 1..65536, --repeat 1..101\n", name,
                    value ? value : "(no value)");
            return 2;
        }
        i++;
    }
    const size_t words = (size_t)mib * (1u << 20) / sizeof(uint64_t);
    uint64_t *buf = malloc(words * sizeof *buf);
    double *gbps = malloc((size_t)repeat * sizeof *gbps);
    part *parts = calloc((size_t)threads, sizeof *parts);
    pthread_t *ids = calloc((size_t)threads, sizeof *ids);
    if (!buf || !gbps || !parts || !ids) {
        fprintf(stderr, "read_bandwidth: cannot allocate %ld MiB\n", mib);
        return 1;
    }
    for (size_t i = 0; i < words; i++) buf[i] = i * 0x9E3779B97F4A7C15ull; /* every page touched before timing */
    uint64_t check = 0;
    for (long r = 0; r < repeat; r++) {
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
        for (long t = 0; t < threads; t++) {
            const size_t from = words * (size_t)t / (size_t)threads, to = words * (size_t)(t + 1) / (size_t)threads;
            parts[t] = (part){buf + from, to - from, 0, &start};
            if (pthread_create(&ids[t], NULL, stream, &parts[t])) {
                fprintf(stderr, "read_bandwidth: cannot start thread %ld of %ld\n", t + 1, threads);
                return 1;
            }
        }
        pthread_barrier_wait(&start);
        const double t0 = now();
        for (long t = 0; t < threads; t++) pthread_join(ids[t], NULL), check += parts[t].sum;
        gbps[r] = (double)(words * sizeof *buf) / (now() - t0) / 1e9;
        pthread_barrier_destroy(&start);
    }
    qsort(gbps, (size_t)repeat, sizeof *gbps, by_value);
    printf("{\"threads\": %ld, \"bytes\": %zu, \"repeat\": %ld, \"read_GBps\": %.3f, \"min_GBps\": %.3f, "
           "\"max_GBps\": %.3f, \"check\": %llu}\n",
           threads, words * sizeof *buf, repeat, gbps[repeat / 2], gbps[0], gbps[repeat - 1],
           (unsigned long long)(check & 0xFFFF));
    free(buf), free(gbps), free(parts), free(ids);
    return 0;
}
