/* The latency of one backend matmul call at S = 1, as the engine's decode makes
 * it: x copied in, the kernel, y back, the wait. The kernels alone are timed by
 * gpu_matmul_bench.cu; this times the whole call, which is what a decode step
 * pays 161 times a token on the larger synthetic model (bench/RESULTS.md,
 * fifteenth pass). Linked against the backend library itself:
 *   gcc -std=c11 -O2 -Ibuild/gen tools/call_latency.c -L DIR -l:libcoli_cuda.so -o call_latency
 *   LD_LIBRARY_PATH=DIR ./call_latency [CALLS]
 * One JSON object a line: format, shape, median and 10th/90th percentile
 * microseconds of CALLS calls (the argument, default 400) after CALLS / 8 more
 * that warm up. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "coli_backend.h"

enum { MIN_CALLS = 10, MAX_CALLS = 100000 };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One shape: upload random weights, time the calls, free. Non-zero on failure. */
static int time_shape(int32_t format, int64_t rows, int64_t cols, int calls) {
    const int warm = calls / 8;
    const size_t n = (size_t)(rows * cols);
    int8_t *q = malloc(n);
    float *scale = malloc((n / 32 + (size_t)rows) * sizeof(float)), *x = malloc((size_t)cols * sizeof(float));
    float *y = malloc((size_t)rows * sizeof(float));
    double *t = malloc((size_t)calls * sizeof(double));
    coli_tensor w = 0;
    int rc = 1;
    if (!q || !scale || !x || !y || !t) {
        fprintf(stderr, "call_latency: out of memory for %lldx%lld\n", (long long)rows, (long long)cols);
        goto done;
    }
    srand(1);
    for (size_t i = 0; i < n; i++) q[i] = (int8_t)(rand() % 255 - 127);
    for (size_t i = 0; i < n / 32 + (size_t)rows; i++) scale[i] = 0.01f;
    for (int64_t i = 0; i < cols; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    coli_status st = format == COLI_FMT_Q8 ? coli_tensor_upload_q8(q, scale, rows, cols, &w)
                                           : coli_tensor_upload_q4((const uint8_t *)q, scale, rows, cols, 32, &w);
    if (st != COLI_OK) {
        fprintf(stderr, "call_latency: upload %lldx%lld: %s\n", (long long)rows, (long long)cols, coli_last_error());
        goto done;
    }
    for (int i = 0; i < warm + calls; i++) {
        const double t0 = now();
        if (coli_matmul(w, x, 1, cols, y) != COLI_OK) {
            fprintf(stderr, "call_latency: matmul %lldx%lld: %s\n", (long long)rows, (long long)cols, coli_last_error());
            goto done;
        }
        if (i >= warm) t[i - warm] = (now() - t0) * 1e6;
    }
    qsort(t, (size_t)calls, sizeof *t, by_value);
    printf("{\"format\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"median_us\": %.1f, \"p10_us\": %.1f, \"p90_us\": %.1f}\n",
           format == COLI_FMT_Q8 ? "int8" : "int4", (long long)rows, (long long)cols, t[calls / 2], t[calls / 10],
           t[calls * 9 / 10]);
    rc = 0;
done:
    if (w) coli_tensor_free(w);
    free(q), free(scale), free(x), free(y), free(t);
    return rc;
}

int main(int argc, char **argv) {
    /* the larger synthetic model's dense shapes (q_a, q_b, o_proj, the dense MLP) and its lm_head */
    static const int64_t shapes[][2] = {{512, 2048}, {1536, 512}, {2048, 1024}, {5632, 2048}, {2048, 5632}, {32000, 2048}};
    long calls = 400;
    if (argc > 2) {
        fprintf(stderr, "call_latency: takes at most one argument, CALLS (got %d)\n", argc - 1);
        return 2;
    }
    if (argc == 2) {
        char *end;
        errno = 0;
        calls = strtol(argv[1], &end, 10);
        if (!*argv[1] || *end || errno || calls < MIN_CALLS || calls > MAX_CALLS) {
            fprintf(stderr, "call_latency: CALLS must be a whole number from %d to %d, got '%s'\n", MIN_CALLS,
                    MAX_CALLS, argv[1]);
            return 2;
        }
    }
    if (coli_backend_init(0) != COLI_OK) {
        fprintf(stderr, "call_latency: %s\n", coli_last_error());
        return 1;
    }
    int rc = 0;
    for (int32_t format = COLI_FMT_Q8; format <= COLI_FMT_Q4; format++)
        for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) rc |= time_shape(format, shapes[k][0], shapes[k][1], (int)calls);
    coli_backend_shutdown();
    return rc;
}
