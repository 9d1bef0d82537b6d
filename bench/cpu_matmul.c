/* One CPU matmul (kernels/cpu_ops.c) timed on one thread: a rows x cols matrix of
 * random weights in f32, int8 or int4 (groups of 32) against `tokens` tokens, the best
 * of --repeat calls. A matrix larger than the last-level cache streams from memory
 * each call; a smaller one is read from the cache after the first, unless --matrices K
 * gives K copies of it, one call each in turn (a pass), as a decode meets a model's
 * matrices: K copies past the cache's size stream from memory whatever their shape.
 *
 *     gcc -std=c11 -O2 -Ikernels bench/cpu_matmul.c kernels/cpu_ops.c -lm -o /tmp/cpu_matmul
 *     /tmp/cpu_matmul --rows 2048 --cols 2048 --tokens 32 --format int4 [--repeat 200] [--matrices 1]
 *
 * Prints one JSON object: the loops that ran, the best call's microseconds (with K
 * copies, the best pass's over K), its weight bytes a second and its multiply-adds a
 * second. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_ops.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int bad(const char *name, const char *value) {
    fprintf(stderr,
            "cpu_matmul: %s %s: want --rows and --cols 1..65536 (cols a multiple of 32 for int4), --tokens 1..4096, "
            "--format f32|int8|int4, --repeat 1..10000, --matrices 1..65536\n",
            name, value ? value : "(missing)");
    return 2;
}

int main(int argc, char **argv) {
    long rows = 0, cols = 0, tokens = 1, repeat = 200, matrices = 1;
    const char *format = NULL;
    for (int i = 1; i < argc; i += 2) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long *slot = strcmp(argv[i], "--rows") == 0     ? &rows
                     : strcmp(argv[i], "--cols") == 0   ? &cols
                     : strcmp(argv[i], "--tokens") == 0 ? &tokens
                     : strcmp(argv[i], "--repeat") == 0 ? &repeat
                     : strcmp(argv[i], "--matrices") == 0 ? &matrices
                                                        : NULL;
        if (strcmp(argv[i], "--format") == 0 && v) {
            format = v;
            continue;
        }
        char *end = NULL;
        if (!slot || !v) return bad(argv[i], v);
        *slot = strtol(v, &end, 10);
        if (*end) return bad(argv[i], v);
    }
    const int fmt = !format                        ? -1
                    : strcmp(format, "f32") == 0   ? 0
                    : strcmp(format, "int8") == 0  ? 8
                    : strcmp(format, "int4") == 0  ? 4
                                                   : -1;
    char num[32];
    if (rows < 1 || rows > 65536) return snprintf(num, sizeof num, "%ld", rows), bad("--rows", num);
    if (cols < 1 || cols > 65536 || (fmt == 4 && cols % 32))
        return snprintf(num, sizeof num, "%ld", cols), bad("--cols", num);
    if (tokens < 1 || tokens > 4096) return snprintf(num, sizeof num, "%ld", tokens), bad("--tokens", num);
    if (repeat < 1 || repeat > 10000) return snprintf(num, sizeof num, "%ld", repeat), bad("--repeat", num);
    if (matrices < 1 || matrices > 65536) return snprintf(num, sizeof num, "%ld", matrices), bad("--matrices", num);
    if (fmt < 0) return bad("--format", format);
    const size_t n = (size_t)rows * (size_t)cols, K = (size_t)matrices;
    /* a matrix's weights and scales (f32: its floats; int8: a scale a row; int4: one a 32) */
    const size_t wn = fmt == 0 ? n : 0, qn = fmt == 8 ? n : fmt == 4 ? n / 2 : 0;
    const size_t sn = fmt == 8 ? (size_t)rows : fmt == 4 ? n / 32 : 0;
    float *w = malloc((fmt == 0 ? K : 1) * n * sizeof *w), *x = malloc((size_t)(tokens * cols) * sizeof *x);
    float *y = malloc((size_t)(tokens * rows) * sizeof *y), *scale = malloc((K * sn + 1) * sizeof *scale);
    uint8_t *q = qn ? malloc(K * qn) : NULL;
    if (!w || !x || !y || !scale || (qn && !q))
        return fprintf(stderr, "cpu_matmul: no memory for %ld copies of a %ldx%ld matrix\n", matrices, rows, cols), 1;
    srand(1);
    for (size_t i = 0; i < n; i++) w[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (long i = 0; i < tokens * cols; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    if (fmt == 8) coli_quantize_q8(w, rows, cols, (int8_t *)q, scale);
    if (fmt == 4) coli_quantize_q4(w, rows, cols, 32, q, scale);
    for (size_t k = 1; k < K; k++) {
        if (wn) memcpy(w + k * wn, w, wn * sizeof *w);
        if (qn) memcpy(q + k * qn, q, qn), memcpy(scale + k * sn, scale, sn * sizeof *scale);
    }
    double best = 1e30;
    for (long r = 0; r < repeat; r++) {
        const double t0 = now();
        for (size_t k = 0; k < K; k++) {
            if (fmt == 0) coli_matmul_f32(w + k * wn, rows, cols, x, tokens, y);
            else if (fmt == 8) coli_matmul_q8((const int8_t *)q + k * qn, scale + k * sn, rows, cols, x, tokens, y);
            else coli_matmul_q4(q + k * qn, scale + k * sn, rows, cols, 32, x, tokens, y);
        }
        const double t = (now() - t0) / (double)K;
        if (t < best) best = t;
    }
    const double bytes = fmt == 0 ? 4.0 * (double)n : fmt == 8 ? (double)n + 4.0 * rows : (double)n / 2 + (double)n / 8;
    printf("{\"loops\": \"%s\", \"rows\": %ld, \"cols\": %ld, \"tokens\": %ld, \"format\": \"%s\", \"matrices\": %ld, "
           "\"best_us\": %.2f, \"weight_GBps\": %.2f, \"gmacs\": %.2f, \"check\": %g}\n",
           coli_cpu_loops(), rows, cols, tokens, format, matrices, best * 1e6, bytes / best / 1e9,
           (double)n * (double)tokens / best / 1e9, (double)y[0]);
    free(w), free(x), free(y), free(scale), free(q);
    return 0;
}
