#include "cpu_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float max_abs(const float *v, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(v[i]);
        if (a > m) m = a;
    }
    return m;
}

static int clamp_round(float v, int lo, int hi) {
    long r = lroundf(v);
    if (r < lo) return lo;
    if (r > hi) return hi;
    return (int)r;
}

void coli_quantize_q8(const float *w, int64_t rows, int64_t cols, int8_t *q, float *scale) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = w + r * cols;
        float m = max_abs(row, cols);
        float sc = m > 0.0f ? m / 127.0f : 1.0f;
        scale[r] = sc;
        for (int64_t c = 0; c < cols; c++) q[r * cols + c] = (int8_t)clamp_round(row[c] / sc, -127, 127);
    }
}

void coli_quantize_q4(const float *w, int64_t rows, int64_t cols, int32_t group, uint8_t *packed,
                      float *scale) {
    int64_t groups = cols / group;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t g = 0; g < groups; g++) {
            const float *v = w + r * cols + g * group;
            float m = max_abs(v, group);
            float sc = m > 0.0f ? m / 7.0f : 1.0f;
            scale[r * groups + g] = sc;
            for (int32_t i = 0; i < group; i += 2) {
                int lo = clamp_round(v[i] / sc, -8, 7) + 8;
                int hi = clamp_round(v[i + 1] / sc, -8, 7) + 8;
                packed[(r * cols + g * group + i) / 2] = (uint8_t)(lo | (hi << 4));
            }
        }
    }
}

/* Every dot product keeps eight lanes of partial sums (lane k takes elements
 * i + k) and combines them in one fixed order. The AVX2 versions do the same
 * IEEE operations in the same order as the portable ones (no FMA: -std=c11
 * keeps contraction off), so results do not depend on the CPU they ran on. */
#define LANES_SUM(l) (((l)[0] + (l)[4]) + ((l)[1] + (l)[5])) + (((l)[2] + (l)[6]) + ((l)[3] + (l)[7]))

static float dot_f32_portable(const float *a, const float *b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    float sum = LANES_SUM(acc);
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* int8 rows: four sets of eight lanes (set j takes elements i + 8j + k of each 32),
 * so that four sums grow side by side instead of one; the sets are added lane by
 * lane ((0 + 1) + (2 + 3)) before the lanes are, and a last 8-block goes to set 0. */
#define Q8_SETS 4
static float q8_sets_sum(const float (*acc)[8]) {
    float l[8];
    for (int k = 0; k < 8; k++) l[k] = (acc[0][k] + acc[1][k]) + (acc[2][k] + acc[3][k]);
    return LANES_SUM(l);
}

static float dot_q8_portable(const float *x, const int8_t *q, int64_t n) {
    float acc[Q8_SETS][8] = {{0}};
    int64_t i = 0;
    for (; i + 8 * Q8_SETS <= n; i += 8 * Q8_SETS)
        for (int j = 0; j < Q8_SETS; j++)
            for (int k = 0; k < 8; k++) acc[j][k] += x[i + 8 * j + k] * (float)q[i + 8 * j + k];
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[0][k] += x[i + k] * (float)q[i + k];
    float sum = q8_sets_sum((const float(*)[8])acc);
    for (; i < n; i++) sum += x[i] * (float)q[i];
    return sum;
}

/* One group of a q4 row: `group` values from group/2 bytes, low nibble first. */
static float dot_q4_portable(const float *x, const uint8_t *p, int32_t group) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int32_t i = 0;
    for (; i + 8 <= group; i += 8)
        for (int k = 0; k < 4; k++) {
            uint8_t b = p[(i >> 1) + k];
            acc[2 * k] += x[i + 2 * k] * (float)((int)(b & 0x0F) - 8);
            acc[2 * k + 1] += x[i + 2 * k + 1] * (float)((int)(b >> 4) - 8);
        }
    float sum = LANES_SUM(acc);
    for (; i < group; i += 2) {
        uint8_t b = p[i >> 1];
        sum += x[i] * (float)((int)(b & 0x0F) - 8) + x[i + 1] * (float)((int)(b >> 4) - 8);
    }
    return sum;
}

/* A q4 row. Groups of a multiple of 8 values: each group's eight lanes (lane k takes
 * its elements 8i + k), times its scale, added lane by lane into the row's eight,
 * group after group; the row's lanes summed once at the end, so no group waits for a
 * horizontal sum. Other groups: the sum over groups, in order, of each group's dot
 * times its scale. */
static float row_q4_portable(const float *x, const uint8_t *p, const float *scale, int64_t groups, int32_t group) {
    if (group % 8) {
        float acc = 0.0f;
        for (int64_t g = 0; g < groups; g++) acc += dot_q4_portable(x + g * group, p + g * group / 2, group) * scale[g];
        return acc;
    }
    float row[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t g = 0; g < groups; g++) {
        const float *xg = x + g * group;
        const uint8_t *pg = p + g * group / 2;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int32_t i = 0; i < group; i += 8)
            for (int k = 0; k < 4; k++) {
                uint8_t b = pg[(i >> 1) + k];
                acc[2 * k] += xg[i + 2 * k] * (float)((int)(b & 0x0F) - 8);
                acc[2 * k + 1] += xg[i + 2 * k + 1] * (float)((int)(b >> 4) - 8);
            }
        for (int k = 0; k < 8; k++) row[k] += acc[k] * scale[g];
    }
    return LANES_SUM(row);
}

/* Tokens a block of the several-token loops below takes: a row's sums for them fit
 * the 16 vector registers with the weights. */
#define F32_TOKENS 4
#define Q8_TOKENS 2 /* four sets of lanes a token */
#define Q4_TOKENS 4 /* a group's and the row's lanes a token */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1

__attribute__((target("avx2"))) static float dot_f32_avx2(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    float l[8];
    _mm256_storeu_ps(l, acc);
    float sum = LANES_SUM(l);
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

__attribute__((target("avx2"))) static inline __m256 q8_product(const float *x, const int8_t *q) {
    const __m256 w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
    return _mm256_mul_ps(_mm256_loadu_ps(x), w);
}

__attribute__((target("avx2"))) static float dot_q8_avx2(const float *x, const int8_t *q, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, q8_product(x + i, q + i));
        a1 = _mm256_add_ps(a1, q8_product(x + i + 8, q + i + 8));
        a2 = _mm256_add_ps(a2, q8_product(x + i + 16, q + i + 16));
        a3 = _mm256_add_ps(a3, q8_product(x + i + 24, q + i + 24));
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_add_ps(a0, q8_product(x + i, q + i));
    float l[8];
    _mm256_storeu_ps(l, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    float sum = LANES_SUM(l);
    for (; i < n; i++) sum += x[i] * (float)q[i];
    return sum;
}

__attribute__((target("avx2"))) static inline float dot_q4_avx2(const float *x, const uint8_t *p, int32_t group) {
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const __m256 eight = _mm256_set1_ps(8.0f);
    __m256 acc = _mm256_setzero_ps();
    int32_t i = 0;
    for (; i + 16 <= group; i += 16) {
        __m128i b = _mm_loadl_epi64((const __m128i *)(p + (i >> 1)));
        __m128i lo = _mm_and_si128(b, low4), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
        __m128i v = _mm_unpacklo_epi8(lo, hi); /* b0 lo, b0 hi, b1 lo, ... */
        __m256 w0 = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), eight);
        __m256 w1 = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))), eight);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(x + i), w0));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(x + i + 8), w1));
    }
    float l[8];
    _mm256_storeu_ps(l, acc);
    if (i < group) { /* a last group of 8 (or fewer) values: the portable loop's lanes */
        float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (; i + 8 <= group; i += 8)
            for (int k = 0; k < 4; k++) {
                uint8_t c = p[(i >> 1) + k];
                tail[2 * k] = x[i + 2 * k] * (float)((int)(c & 0x0F) - 8);
                tail[2 * k + 1] = x[i + 2 * k + 1] * (float)((int)(c >> 4) - 8);
            }
        for (int k = 0; k < 8; k++) l[k] += tail[k];
    }
    float sum = LANES_SUM(l);
    for (; i < group; i += 2) {
        uint8_t c = p[i >> 1];
        sum += x[i] * (float)((int)(c & 0x0F) - 8) + x[i + 1] * (float)((int)(c >> 4) - 8);
    }
    return sum;
}

/* 8 values from 4 bytes as floats minus 8, in element order: lane k shifts the word to
 * its nibble k (low nibble first) and puts it in the mantissa of 2^23, whose value is then
 * 2^23 + n; less 2^23 + 8 that is n - 8 exactly, the float the portable loop converts.
 * A broadcast and per-lane shifts, no byte shuffles. */
__attribute__((target("avx2"))) static inline __m256 q4_values8(const uint8_t *p) {
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i low4 = _mm256_set1_epi32(0x0F), two23 = _mm256_set1_epi32(0x4B000000);
    int32_t word;
    memcpy(&word, p, sizeof word);
    const __m256i n = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word), shifts), low4);
    return _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(n, two23)), _mm256_set1_ps(8388616.0f));
}

__attribute__((target("avx2"))) static float row_q4_avx2(const float *x, const uint8_t *p, const float *scale,
                                                          int64_t groups, int32_t group) {
    if (group % 8) {
        float acc = 0.0f;
        for (int64_t g = 0; g < groups; g++) acc += dot_q4_avx2(x + g * group, p + g * group / 2, group) * scale[g];
        return acc;
    }
    __m256 row = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const float *xg = x + g * group;
        const uint8_t *pg = p + g * group / 2;
        __m256 acc = _mm256_setzero_ps();
        for (int32_t i = 0; i < group; i += 8) /* lane k takes elements i + k: the portable order */
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(xg + i), q4_values8(pg + (i >> 1))));
        row = _mm256_add_ps(row, _mm256_mul_ps(acc, _mm256_set1_ps(scale[g])));
    }
    float l[8];
    _mm256_storeu_ps(l, row);
    return LANES_SUM(l);
}

/* Several tokens against one weight row (a prefill, teacher forcing): each weight
 * vector loaded and converted once for all of them, each token's sums the very
 * operations, in the very order, of its single-token loop above, so the bits do not
 * depend on how the tokens were blocked. x: the first token's row, the next `stride`
 * floats on; y: one output a token. */
__attribute__((target("avx2"))) static void dot_f32_avx2_tokens(const float *w, const float *x, int64_t stride,
                                                                int64_t n, float *y) {
    __m256 acc[F32_TOKENS];
    #pragma GCC unroll 4
    for (int j = 0; j < F32_TOKENS; j++) acc[j] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 wv = _mm256_loadu_ps(w + i);
        #pragma GCC unroll 4
        for (int j = 0; j < F32_TOKENS; j++)
            acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(_mm256_loadu_ps(x + j * stride + i), wv));
    }
    #pragma GCC unroll 4
    for (int j = 0; j < F32_TOKENS; j++) {
        float l[8];
        _mm256_storeu_ps(l, acc[j]);
        float sum = LANES_SUM(l);
        for (int64_t k = i; k < n; k++) sum += x[j * stride + k] * w[k];
        y[j] = sum;
    }
}

__attribute__((target("avx2"))) static void dot_q8_avx2_tokens(const int8_t *q, const float *x, int64_t stride,
                                                               int64_t n, float *y) {
    __m256 acc[Q8_TOKENS][Q8_SETS];
    #pragma GCC unroll 4
    for (int j = 0; j < Q8_TOKENS; j++)
        #pragma GCC unroll 4
        for (int k = 0; k < Q8_SETS; k++) acc[j][k] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 * Q8_SETS <= n; i += 8 * Q8_SETS)
        #pragma GCC unroll 4
        for (int k = 0; k < Q8_SETS; k++) {
            const __m256 wv = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i + 8 * k))));
            #pragma GCC unroll 4
            for (int j = 0; j < Q8_TOKENS; j++)
                acc[j][k] = _mm256_add_ps(acc[j][k], _mm256_mul_ps(_mm256_loadu_ps(x + j * stride + i + 8 * k), wv));
        }
    for (; i + 8 <= n; i += 8) {
        const __m256 wv = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i))));
        #pragma GCC unroll 4
        for (int j = 0; j < Q8_TOKENS; j++)
            acc[j][0] = _mm256_add_ps(acc[j][0], _mm256_mul_ps(_mm256_loadu_ps(x + j * stride + i), wv));
    }
    #pragma GCC unroll 4
    for (int j = 0; j < Q8_TOKENS; j++) {
        float l[8];
        _mm256_storeu_ps(l, _mm256_add_ps(_mm256_add_ps(acc[j][0], acc[j][1]), _mm256_add_ps(acc[j][2], acc[j][3])));
        float sum = LANES_SUM(l);
        for (int64_t k = i; k < n; k++) sum += x[j * stride + k] * (float)q[k];
        y[j] = sum;
    }
}

__attribute__((target("avx2"))) static void row_q4_avx2_tokens(const float *x, int64_t stride, const uint8_t *p,
                                                               const float *scale, int64_t groups, int32_t group,
                                                               float *y) {
    __m256 row[Q4_TOKENS];
    #pragma GCC unroll 4
    for (int j = 0; j < Q4_TOKENS; j++) row[j] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const float *xg = x + g * group;
        const uint8_t *pg = p + g * group / 2;
        __m256 acc[Q4_TOKENS];
        #pragma GCC unroll 4
        for (int j = 0; j < Q4_TOKENS; j++) acc[j] = _mm256_setzero_ps();
        for (int32_t i = 0; i < group; i += 8) {
            const __m256 wv = q4_values8(pg + (i >> 1));
            #pragma GCC unroll 4
            for (int j = 0; j < Q4_TOKENS; j++)
                acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(_mm256_loadu_ps(xg + j * stride + i), wv));
        }
        const __m256 s = _mm256_set1_ps(scale[g]);
        #pragma GCC unroll 4
        for (int j = 0; j < Q4_TOKENS; j++) row[j] = _mm256_add_ps(row[j], _mm256_mul_ps(acc[j], s));
    }
    #pragma GCC unroll 4
    for (int j = 0; j < Q4_TOKENS; j++) {
        float l[8];
        _mm256_storeu_ps(l, row[j]);
        y[j] = LANES_SUM(l);
    }
}

static int use_avx2(void) {
    static int cached = -1;
    /* COLI_CPU_PORTABLE=1 forces the portable loops (tests prove both agree to the bit) */
    if (cached < 0) cached = __builtin_cpu_supports("avx2") && !getenv("COLI_CPU_PORTABLE") ? 1 : 0;
    return cached;
}
#endif

const char *coli_cpu_loops(void) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) return "avx2";
#endif
    return "portable";
}

float coli_dot_f32(const float *a, const float *b, int64_t n) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) return dot_f32_avx2(a, b, n);
#endif
    return dot_f32_portable(a, b, n);
}

static float dot_q8(const float *x, const int8_t *q, int64_t n) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) return dot_q8_avx2(x, q, n);
#endif
    return dot_q8_portable(x, q, n);
}

static float row_q4(const float *x, const uint8_t *p, const float *scale, int64_t groups, int32_t group) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) return row_q4_avx2(x, p, scale, groups, group);
#endif
    return row_q4_portable(x, p, scale, groups, group);
}

/* Each row against every token: blocks of tokens through the AVX2 loops above, the
 * rest (and every token without AVX2) one at a time; the same bits either way. */
void coli_matmul_f32_rows(const float *w, int64_t rows, int64_t cols, const float *x, int64_t s, float *y,
                          int64_t r0, int64_t r1) {
    float out[F32_TOKENS];
    for (int64_t r = r0; r < r1; r++) {
        int64_t t = 0;
#ifdef HAVE_AVX2_PATH
        for (; use_avx2() && t + F32_TOKENS <= s; t += F32_TOKENS) {
            dot_f32_avx2_tokens(w + r * cols, x + t * cols, cols, cols, out);
            for (int j = 0; j < F32_TOKENS; j++) y[(t + j) * rows + r] = out[j];
        }
#endif
        for (; t < s; t++) y[t * rows + r] = coli_dot_f32(x + t * cols, w + r * cols, cols);
    }
    (void)out;
}

void coli_matmul_q8_rows(const int8_t *q, const float *scale, int64_t rows, int64_t cols, const float *x,
                         int64_t s, float *y, int64_t r0, int64_t r1) {
    float out[Q8_TOKENS];
    for (int64_t r = r0; r < r1; r++) {
        int64_t t = 0;
#ifdef HAVE_AVX2_PATH
        for (; use_avx2() && t + Q8_TOKENS <= s; t += Q8_TOKENS) {
            dot_q8_avx2_tokens(q + r * cols, x + t * cols, cols, cols, out);
            for (int j = 0; j < Q8_TOKENS; j++) y[(t + j) * rows + r] = out[j] * scale[r];
        }
#endif
        for (; t < s; t++) y[t * rows + r] = dot_q8(x + t * cols, q + r * cols, cols) * scale[r];
    }
    (void)out;
}

void coli_matmul_q4_rows(const uint8_t *packed, const float *scale, int64_t rows, int64_t cols, int32_t group,
                         const float *x, int64_t s, float *y, int64_t r0, int64_t r1) {
    int64_t groups = cols / group;
    float out[Q4_TOKENS];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *pr = packed + r * cols / 2;
        int64_t t = 0;
#ifdef HAVE_AVX2_PATH
        for (; use_avx2() && group % 8 == 0 && t + Q4_TOKENS <= s; t += Q4_TOKENS) {
            row_q4_avx2_tokens(x + t * cols, cols, pr, scale + r * groups, groups, group, out);
            for (int j = 0; j < Q4_TOKENS; j++) y[(t + j) * rows + r] = out[j];
        }
#endif
        for (; t < s; t++) y[t * rows + r] = row_q4(x + t * cols, pr, scale + r * groups, groups, group);
    }
    (void)out;
}

void coli_matmul_f32(const float *w, int64_t rows, int64_t cols, const float *x, int64_t s, float *y) {
    coli_matmul_f32_rows(w, rows, cols, x, s, y, 0, rows);
}

void coli_matmul_q8(const int8_t *q, const float *scale, int64_t rows, int64_t cols, const float *x,
                    int64_t s, float *y) {
    coli_matmul_q8_rows(q, scale, rows, cols, x, s, y, 0, rows);
}

void coli_matmul_q4(const uint8_t *packed, const float *scale, int64_t rows, int64_t cols, int32_t group,
                    const float *x, int64_t s, float *y) {
    coli_matmul_q4_rows(packed, scale, rows, cols, group, x, s, y, 0, rows);
}
