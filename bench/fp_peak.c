/* The arithmetic ceiling of this machine's cores for the CPU path's loops: 256-bit
 * multiply-then-add (what the f32 and int8 loops do: no FMA, so every CPU level gives
 * the portable loops' bits), fused multiply-add (what a BLAS does, for comparison), and
 * VNNI byte dot products (int4's digits), each on 8 independent sums of 8 distinct
 * products held in registers, on every thread at once. A prefill that needs more than this cannot be
 * had whatever its memory traffic (bench/RESULTS.md).
 *
 *     gcc -std=c11 -O2 -pthread bench/fp_peak.c -o /tmp/fp_peak && /tmp/fp_peak --threads 2
 *
 * Prints one JSON object: per mode the median over --repeat runs of all threads'
 * operations a second (GFLOP/s counting a multiply and an add as two; for VNNI, byte
 * multiply-adds). */
#define _POSIX_C_SOURCE 200809L
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STEPS 30000000L /* each of 8 sums a step */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define SUMS(X, ...)                                                                                                 \
    X(0, __VA_ARGS__) X(1, __VA_ARGS__) X(2, __VA_ARGS__) X(3, __VA_ARGS__) X(4, __VA_ARGS__) X(5, __VA_ARGS__)      \
    X(6, __VA_ARGS__) X(7, __VA_ARGS__)
#define DECLARE(i, T, SET) T c##i = SET(i);
#define STEP(i, OP) c##i = OP(c##i, A(i), (i)&1 ? b : b2);
#define FOLD(i, ADD) sum = ADD(sum, c##i);

/* Sum i takes a[i / 2] times b or b2: 8 distinct products a step, which the asm makes
 * opaque to the compiler each step, so that it can neither hoist nor share them. */
#define OPERANDS(T, SET, A, B)                                                                                       \
    T a0 = SET(A), a1 = SET(A + 1), a2 = SET(A + 2), a3 = SET(A + 3), b = SET(B), b2 = SET(B + 1)
#define OPAQUE(R) __asm__("" : R(a0), R(a1), R(a2), R(a3), R(b), R(b2))
#define A(i) ((i) / 2 == 0 ? a0 : (i) / 2 == 1 ? a1 : (i) / 2 == 2 ? a2 : a3)
#define X_REG(v) "+x"(v)
#define V_REG(v) "+v"(v)
#define SET_PS(v) _mm256_set1_ps(1.0f + 1e-7f * (float)(v))
#define SET_EPI8(v) _mm256_set1_epi8((char)(v))

/* A mode's loop: T its vectors, OP(sum, a, b) a step of one sum, ADD and FIRST what
 * folds the sums into one value (kept, so that the loop is not dropped). */
#define PEAK(NAME, TARGET, T, SET, REG, OP, ADD, FIRST)                                                              \
    __attribute__((target(TARGET))) static float NAME(void) {                                                       \
        OPERANDS(T, SET, 1, 10);                                                                                     \
        SUMS(DECLARE, T, SET)                                                                                        \
        for (long s = 0; s < STEPS; s++) {                                                                           \
            OPAQUE(REG);                                                                                             \
            SUMS(STEP, OP)                                                                                           \
        }                                                                                                            \
        T sum = SET(0);                                                                                              \
        SUMS(FOLD, ADD)                                                                                              \
        return FIRST(sum);                                                                                           \
    }
#define MUL_ADD(c, a, b) _mm256_add_ps(c, _mm256_mul_ps(a, b))
#define FUSED(c, a, b) _mm256_fmadd_ps(a, b, c)
#define DPBUSD(c, a, b) _mm256_dpbusd_epi32(c, a, b)
#define FIRST_PS(v) _mm256_cvtss_f32(v)
#define FIRST_EPI32(v) ((float)_mm256_extract_epi32(v, 0))
PEAK(mul_add, "avx2", __m256, SET_PS, X_REG, MUL_ADD, _mm256_add_ps, FIRST_PS)
PEAK(fused, "avx2,fma", __m256, SET_PS, X_REG, FUSED, _mm256_add_ps, FIRST_PS)
PEAK(vnni, "avx2,avx512f,avx512vl,avx512vnni", __m256i, SET_EPI8, V_REG, DPBUSD, _mm256_add_epi32, FIRST_EPI32)

typedef struct mode {
    const char *name;
    float (*run)(void);
    double ops_per_step; /* all 8 sums' operations a step */
} mode;

static const mode MODES[] = {
    {"mul_add_gflops", mul_add, 8 * 8 * 2},
    {"fma_gflops", fused, 8 * 8 * 2},
    {"vnni_giga_byte_macs", vnni, 8 * 32},
};

static void *thread_main(void *arg) {
    const mode *m = arg;
    volatile float sink = m->run();
    (void)sink;
    return NULL;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int threads = 1, repeat = 3;
    for (int i = 1; i < argc; i++) {
        const int known = strcmp(argv[i], "--threads") == 0 || strcmp(argv[i], "--repeat") == 0;
        char *end = NULL;
        const long v = known && i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
        if (!known || i + 1 >= argc || *end || v < 1 || v > (argv[i][2] == 't' ? 256 : 100))
            return fprintf(stderr, "fp_peak: %s %s: want --threads 1..256 --repeat 1..100\n", argv[i],
                           i + 1 < argc ? argv[i + 1] : "(missing)"),
                   2;
        *(argv[i][2] == 't' ? &threads : &repeat) = (int)v;
        i++;
    }
    __builtin_cpu_init();
    printf("{\"threads\": %d", threads);
    for (size_t k = 0; k < sizeof MODES / sizeof MODES[0]; k++) {
        const mode *m = &MODES[k];
        if (m->run == vnni && !(__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl"))) continue;
        if (m->run == fused && !__builtin_cpu_supports("fma")) continue;
        double rates[100];
        for (int r = 0; r < repeat; r++) {
            pthread_t tid[256];
            const double t0 = now();
            for (int t = 0; t < threads; t++)
                if (pthread_create(&tid[t], NULL, thread_main, (void *)m) != 0)
                    return fprintf(stderr, "fp_peak: cannot start thread %d\n", t), 1;
            for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL);
            rates[r] = m->ops_per_step * (double)STEPS * threads / (now() - t0) / 1e9;
        }
        qsort(rates, (size_t)repeat, sizeof rates[0], cmp);
        printf(", \"%s\": %.1f", m->name, rates[repeat / 2]);
    }
    printf("}\n");
    return 0;
}
