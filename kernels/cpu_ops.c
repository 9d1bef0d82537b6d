#include "cpu_ops.h"

#include <float.h>
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

/* lroundf (halves away from zero), clamped to [lo, hi]. Below 2^23 inline: the
 * truncation and v's distance from it are exact there, and the quantisers round every
 * weight (a call each was most of a large model's load); lroundf itself elsewhere. */
static inline int clamp_round(float v, int lo, int hi) {
    long r;
    if (fabsf(v) < 8388608.0f) { /* the step away from zero as a number, not a branch: it is a coin toss */
        const float t = (float)(int32_t)v, away = (float)(fabsf(v - t) >= 0.5f);
        r = (long)(t + copysignf(away, v));
    } else {
        r = lroundf(v);
    }
    if (r < lo) return lo;
    if (r > hi) return hi;
    return (int)r;
}

static void quantize_q8_portable(const float *w, int64_t rows, int64_t cols, int8_t *q, float *scale) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = w + r * cols;
        float m = max_abs(row, cols);
        float sc = m > 0.0f ? m / 127.0f : 1.0f;
        scale[r] = sc;
        for (int64_t c = 0; c < cols; c++) q[r * cols + c] = (int8_t)clamp_round(row[c] / sc, -127, 127);
    }
}

static void quantize_q4_portable(const float *w, int64_t rows, int64_t cols, int32_t group, uint8_t *packed,
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
#define LANES_SUM(l) ((((l)[0] + (l)[4]) + ((l)[1] + (l)[5])) + (((l)[2] + (l)[6]) + ((l)[3] + (l)[7])))

/* a . B, B the nb values at b then the n - nb at c: eight lanes of 8-blocks, LANES_SUM,
 * then the tail. */
static float dot_f32_split_portable(const float *a, const float *b, int64_t nb, const float *c, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * (i + k < nb ? b[i + k] : c[i + k - nb]);
    float sum = LANES_SUM(acc);
    for (; i < n; i++) sum += a[i] * (i < nb ? b[i] : c[i - nb]);
    return sum;
}

static float dot_f32_portable(const float *a, const float *b, int64_t n) {
    return dot_f32_split_portable(a, b, n, NULL, n);
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

/* ---- int4 rows against x as integers --------------------------------------------
 * Groups of a multiple of 32 values, up to Q4D_GROUP_MAX: each token's x is taken as
 * integers v = rint(x * 2^(22 - e)), e the least with every |x| of the token below
 * 2^e (so |v| <= 2^22), and a group's products with its stored values n - 8 are
 * summed exactly, as integers, in 8 lanes: in each 32 of the group, lane k < 4 takes
 * elements 8k, 8k + 2, 8k + 4 and 8k + 6, lane k >= 4 the odd elements after
 * 8(k - 4). A lane's sum is at most group / 8 * 4 * 8 * 2^22 <= 2^30, an int32. Each
 * lane's sum as a float, times the group's scale, is added to the row's lane, group
 * after group; the row's lanes are summed once (LANES_SUM), times 2^(e - 22). An inf
 * or NaN in x gives NaN. This is the GPU kernels' arithmetic in kind (x as integers
 * below 2^22 and a power of two, exact integer dot products), and lets the vector
 * loops multiply bytes: v is three int8 digits, v = 65536 a + 256 b + c. */
#define Q4D_GROUP_MAX 256
static int q4d_fits(int32_t group) { return group % 32 == 0 && group <= Q4D_GROUP_MAX; }

/* A token's scaling: x * m1 * m2 is x * 2^(22 - e), exactly (two factors where one
 * would not be a normal float); step = 2^(e - 22), NaN where x holds an inf or NaN
 * (then every v is 0). */
typedef struct q4d_scale {
    float m1, m2, step;
} q4d_scale;

static q4d_scale q4d_scale_from(float max, int bad) {
    q4d_scale sc = {1.0f, 1.0f, 0.0f};
    if (bad) sc.step = NAN;
    if (bad || max == 0.0f) return sc;
    int e;
    (void)frexpf(max, &e);
    const int k = 22 - e;
    if (k > 126) sc.m1 = ldexpf(1.0f, k - 126), sc.m2 = ldexpf(1.0f, 126);
    else sc.m1 = ldexpf(1.0f, k);
    sc.step = ldexpf(1.0f, e - 22);
    return sc;
}

static q4d_scale q4d_scale_of(const float *x, int64_t n) {
    float max = 0.0f;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        if (!(a <= FLT_MAX)) bad = 1;
        else if (a > max) max = a;
    }
    return q4d_scale_from(max, bad);
}

static int32_t q4d_value(float x, q4d_scale sc) {
    return sc.step == sc.step ? (int32_t)rintf(x * sc.m1 * sc.m2) : 0;
}

static float row_q4d_portable(const float *x, const uint8_t *p, const float *scale, int64_t groups, int32_t group,
                              q4d_scale sc) {
    float row[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t g = 0; g < groups; g++) {
        int64_t lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t e = g * group; e < (g + 1) * group; e += 2) {
            const uint8_t b = p[e / 2];
            const int k = (int)(e % 32) / 8; /* byte e / 2 of its 32's 16: lanes k and 4 + k */
            lane[k] += (int64_t)((int)(b & 0x0F) - 8) * q4d_value(x[e], sc);
            lane[4 + k] += (int64_t)((int)(b >> 4) - 8) * q4d_value(x[e + 1], sc);
        }
        for (int k = 0; k < 8; k++) row[k] += (float)lane[k] * scale[g];
    }
    return LANES_SUM(row) * sc.step;
}

/* Tokens a block of the several-token loops below takes: a row's sums for them fit
 * the 16 vector registers with the weights. */
#define F32_TOKENS 4
#define Q8_TOKENS 2 /* four sets of lanes a token */
#define Q4_TOKENS 4 /* a group's and the row's lanes a token */
/* Tokens of a sweep over a thread's rows: 64 tokens of a 2048-wide x are 512 KiB, half
 * a Zen 4 core's L2. */
#define TOKEN_BLOCK 64
#define Q8_SLICE 256 /* an int8 tile's values a sweep: 4 tokens' x 4 KiB */

/* exp(x) as coli_exp_f32 defines it (Cephes' expf: x = k ln 2 + r, |r| <= ln 2 / 2, a
 * degree-7 polynomial in r times 2^k); below EXP_LO it is 0, above EXP_HI exp(EXP_HI). */
#define EXP_HI 88.0f
#define EXP_LO -87.3365447505531f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_C1 0.693359375f
#define EXP_C2 -2.12194440e-4f
#define EXP_P0 1.9875691500E-4f
#define EXP_P1 1.3981999507E-3f
#define EXP_P2 8.3334519073E-3f
#define EXP_P3 4.1665795894E-2f
#define EXP_P4 1.6666665459E-1f
#define EXP_P5 5.0000001201E-1f

static float exp_f32_one(float t) {
    const int under = t < EXP_LO;
    float y = t < EXP_HI ? t : EXP_HI; /* a NaN becomes EXP_HI, as the vector min does */
    y = y > EXP_LO ? y : EXP_LO;
    const float k = floorf(y * EXP_LOG2E + 0.5f), r = y - k * EXP_C1 - k * EXP_C2;
    float p = EXP_P0;
    p = p * r + EXP_P1;
    p = p * r + EXP_P2;
    p = p * r + EXP_P3;
    p = p * r + EXP_P4;
    p = p * r + EXP_P5;
    p = p * (r * r) + r + 1.0f;
    union { uint32_t u; float f; } e = {.u = (uint32_t)((int32_t)k + 127) << 23};
    return under ? 0.0f : p * e.f;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1

/* Bytes ahead of a row's loads that the one-token loops ask the cache for: a thread
 * streaming int4 or int8 rows from memory is short of what the memory gives it with
 * the hardware's prefetch alone (bench/RESULTS.md: int4 on Zen 4, and int8 on an Intel
 * Xeon, whose int8 rows came at half a thread's read rate without it). */
#ifndef STREAM_AHEAD
#define STREAM_AHEAD 1024
#endif
#ifndef Q8_STREAM_AHEAD
#define Q8_STREAM_AHEAD 2048
#endif
/* A tile of rows streams several rows side by side, a row's length apart, and the
 * hardware's prefetch alone does not keep such streams coming from memory (figures in
 * bench/RESULTS.md). So the f32 and int8 tiles' first sweep of a block of tokens over a
 * tile of rows asks for the next tile's rows as it reads its own (the later sweeps
 * find their rows in the cache), into L2, which holds a float32 tile's rows where L1
 * does not. Rows shorter than NEXT_ROWS_MIN bytes make a tile a few lines in a row, one
 * stream the hardware follows by itself, so there the fetch is only cost. int4's
 * tiles, 4 KiB of rows, fit L1 and ask on every sweep into it (Q4D_TILE). */
#define NEXT_ROWS_FETCH(ptr) _mm_prefetch((const char *)(ptr), _MM_HINT_T1)
#define NEXT_ROWS_MIN 512

/* LANES_SUM of a vector's lanes, the same adds in the same order, without a trip
 * through memory: (l0 + l4, l1 + l5, l2 + l6, l3 + l7) lane by lane, then the pairs'
 * sums (hadd), then theirs. */
__attribute__((target("avx2"))) static inline float lanes_sum(__m256 v) {
    const __m128 u = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 w = _mm_hadd_ps(u, u);
    return _mm_cvtss_f32(_mm_hadd_ps(w, w));
}

__attribute__((target("avx2"), always_inline)) static inline float dot_f32_avx2_inline(const float *a, const float *b,
                                                                                      int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    float sum = lanes_sum(acc);
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

__attribute__((target("avx2"))) static float dot_f32_avx2(const float *a, const float *b, int64_t n) {
    return dot_f32_avx2_inline(a, b, n);
}

/* dot_f32_avx2_inline(a, the nb values at b then the n - nb at c, n): each 8 of the
 * second vector loaded from where its values are (through a copy where 8 straddle
 * b's end), the same operations in the same order. Attention's keys only: the f32
 * rows' decode loop keeps the plain one, without a test a step. */
__attribute__((target("avx2"), always_inline)) static inline float dot_f32_split_avx2_inline(const float *a,
                                                                                            const float *b, int64_t nb,
                                                                                            const float *c, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 bv;
        if (i + 8 <= nb) bv = _mm256_loadu_ps(b + i);
        else if (i >= nb) bv = _mm256_loadu_ps(c + (i - nb));
        else {
            float t[8];
            for (int k = 0; k < 8; k++) t[k] = i + k < nb ? b[i + k] : c[i + k - nb];
            bv = _mm256_loadu_ps(t);
        }
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(a + i), bv));
    }
    float sum = lanes_sum(acc);
    for (; i < n; i++) sum += a[i] * (i < nb ? b[i] : c[i - nb]);
    return sum;
}

/* coli_dot_f32_many's loop: the dots inlined, so the short ones of attention (a
 * head's query against a key) overlap instead of waiting on one call each. */
__attribute__((target("avx2"))) static void dot_f32_avx2_many(const float *a, int64_t a_stride, const float *b,
                                                               int64_t b_stride, int64_t nb, const float *c,
                                                               int64_t count, int64_t n, float scale, float *out) {
    for (int64_t i = 0; i < count; i++)
        out[i] = dot_f32_split_avx2_inline(a + i * a_stride, b + i * b_stride, nb, c, n) * scale;
}

/* o += w v, a product and a sum a value, 8 at a time. */
__attribute__((target("avx2"))) static void axpy_f32_avx2(float *o, float w, const float *v, int64_t n) {
    const __m256 wv = _mm256_set1_ps(w);
    int64_t d = 0;
    for (; d + 8 <= n; d += 8)
        _mm256_storeu_ps(o + d, _mm256_add_ps(_mm256_loadu_ps(o + d), _mm256_mul_ps(wv, _mm256_loadu_ps(v + d))));
    for (; d < n; d++) o[d] += w * v[d];
}

/* coli_weighted_sum_f32 for NH (1 to 4) rows of weights and n outputs of each (row h's
 * at c + h * c_stride): 16 (then 8) in registers over every row of v, each a product
 * then a sum a row, from zero. */
__attribute__((target("avx2"), always_inline)) static inline void wsum_avx2_heads(const float *w, int64_t rows,
                                                                                 const float *v, int64_t stride,
                                                                                 int64_t n, float *c, int64_t c_stride,
                                                                                 const int NH) {
    int64_t d = 0;
    for (; d + 16 <= n; d += 16) {
        __m256 a[4][2];
        _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++) a[h][0] = a[h][1] = _mm256_setzero_ps();
        for (int64_t i = 0; i < rows; i++) {
            const __m256 v0 = _mm256_loadu_ps(v + i * stride + d), v1 = _mm256_loadu_ps(v + i * stride + d + 8);
            _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++) {
                const __m256 b = _mm256_broadcast_ss(w + h * rows + i);
                a[h][0] = _mm256_add_ps(a[h][0], _mm256_mul_ps(b, v0));
                a[h][1] = _mm256_add_ps(a[h][1], _mm256_mul_ps(b, v1));
            }
        }
        _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++) {
            _mm256_storeu_ps(c + h * c_stride + d, a[h][0]);
            _mm256_storeu_ps(c + h * c_stride + d + 8, a[h][1]);
        }
    }
    for (; d + 8 <= n; d += 8) {
        __m256 a[4];
        _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++) a[h] = _mm256_setzero_ps();
        for (int64_t i = 0; i < rows; i++) {
            const __m256 v0 = _mm256_loadu_ps(v + i * stride + d);
            _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++)
                a[h] = _mm256_add_ps(a[h], _mm256_mul_ps(_mm256_broadcast_ss(w + h * rows + i), v0));
        }
        _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++) _mm256_storeu_ps(c + h * c_stride + d, a[h]);
    }
    for (; d < n; d++)
        _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++) {
            float acc = 0.0f;
            for (int64_t i = 0; i < rows; i++) acc += w[h * rows + i] * v[i * stride + d];
            c[h * c_stride + d] = acc;
        }
}

__attribute__((target("avx2"))) static void weighted_sum_f32_avx2(const float *w, int64_t heads, int64_t rows,
                                                                   const float *v, int64_t stride, int64_t n,
                                                                   float *c) {
    /* 32 outputs at a time for every group of heads, so that the rows' slice (a block of
     * 64 latents: 8 KiB) is read from L1 by each group rather than the rows from L2 */
    for (int64_t d = 0; d < n; d += 32) {
        const int64_t nd = n - d < 32 ? n - d : 32;
        int64_t h = 0;
        for (; h + 4 <= heads; h += 4) wsum_avx2_heads(w + h * rows, rows, v + d, stride, nd, c + h * n + d, n, 4);
        if (heads - h == 3) wsum_avx2_heads(w + h * rows, rows, v + d, stride, nd, c + h * n + d, n, 3);
        if (heads - h == 2) wsum_avx2_heads(w + h * rows, rows, v + d, stride, nd, c + h * n + d, n, 2);
        if (heads - h == 1) wsum_avx2_heads(w + h * rows, rows, v + d, stride, nd, c + h * n + d, n, 1);
    }
}

/* coli_exp_f32's steps on 8 values: the same operations, so the same bits. */
__attribute__((target("avx2"))) static void exp_f32_avx2(float *x, int64_t n, float sub) {
    const __m256 s = _mm256_set1_ps(sub), hi = _mm256_set1_ps(EXP_HI), lo = _mm256_set1_ps(EXP_LO);
    const __m256 log2e = _mm256_set1_ps(EXP_LOG2E), half = _mm256_set1_ps(0.5f);
    const __m256 c1 = _mm256_set1_ps(EXP_C1), c2 = _mm256_set1_ps(EXP_C2), one = _mm256_set1_ps(1.0f);
    const __m256 p0 = _mm256_set1_ps(EXP_P0), p1 = _mm256_set1_ps(EXP_P1), p2 = _mm256_set1_ps(EXP_P2),
                 p3 = _mm256_set1_ps(EXP_P3), p4 = _mm256_set1_ps(EXP_P4), p5 = _mm256_set1_ps(EXP_P5);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 t = _mm256_sub_ps(_mm256_loadu_ps(x + i), s);
        const __m256 under = _mm256_cmp_ps(t, lo, _CMP_LT_OQ);
        const __m256 y = _mm256_max_ps(_mm256_min_ps(t, hi), lo);
        const __m256 k = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(y, log2e), half));
        const __m256 r = _mm256_sub_ps(_mm256_sub_ps(y, _mm256_mul_ps(k, c1)), _mm256_mul_ps(k, c2));
        __m256 p = p0;
        p = _mm256_add_ps(_mm256_mul_ps(p, r), p1);
        p = _mm256_add_ps(_mm256_mul_ps(p, r), p2);
        p = _mm256_add_ps(_mm256_mul_ps(p, r), p3);
        p = _mm256_add_ps(_mm256_mul_ps(p, r), p4);
        p = _mm256_add_ps(_mm256_mul_ps(p, r), p5);
        p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), one);
        const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
        _mm256_storeu_ps(x + i, _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e))));
    }
    for (; i < n; i++) x[i] = exp_f32_one(x[i] - sub);
}

/* coli_scale_max_f32 8 at a time: the products as the scalar loop makes them, the
 * largest by max_ps(x, kept), which keeps the kept value where x is a NaN or where
 * both are zeros, as the scalar `x > kept` test does (the sign of a zero maximum may
 * differ, which no later use of it tells apart). */
__attribute__((target("avx2"))) static float scale_max_f32_avx2(float *x, int64_t n, float scale) {
    const __m256 sv = _mm256_set1_ps(scale);
    __m256 mv = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), sv);
        _mm256_storeu_ps(x + i, v);
        mv = _mm256_max_ps(v, mv);
    }
    float lanes[8], mx = -INFINITY;
    _mm256_storeu_ps(lanes, mv);
    for (int k = 0; k < 8; k++)
        if (lanes[k] > mx) mx = lanes[k];
    for (; i < n; i++) {
        x[i] *= scale;
        if (x[i] > mx) mx = x[i];
    }
    return mx;
}

/* coli_add_relu_f32 8 at a time: the clamp as a compare and a mask (v > 0 keeps v;
 * a NaN or a zero gives +0, as the scalar form does). */
__attribute__((target("avx2"))) static void add_relu_f32_avx2(float *total, const float *d, int64_t n, float scale,
                                                               float w) {
    const __m256 sv = _mm256_set1_ps(scale), wv = _mm256_set1_ps(w), zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(d + i), sv);
        const __m256 r = _mm256_and_ps(v, _mm256_cmp_ps(v, zero, _CMP_GT_OQ));
        _mm256_storeu_ps(total + i, _mm256_add_ps(_mm256_loadu_ps(total + i), _mm256_mul_ps(wv, r)));
    }
    for (; i < n; i++) {
        const float v = d[i] * scale;
        total[i] += w * (v > 0.0f ? v : 0.0f);
    }
}

__attribute__((target("avx2"))) static inline __m256 q8_product(const float *x, const int8_t *q) {
    const __m256 w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
    return _mm256_mul_ps(_mm256_loadu_ps(x), w);
}

#define Q8_STEP32(i)                                                                                                 \
    do {                                                                                                             \
        a0 = _mm256_add_ps(a0, q8_product(x + (i), q + (i)));                                                        \
        a1 = _mm256_add_ps(a1, q8_product(x + (i) + 8, q + (i) + 8));                                                \
        a2 = _mm256_add_ps(a2, q8_product(x + (i) + 16, q + (i) + 16));                                              \
        a3 = _mm256_add_ps(a3, q8_product(x + (i) + 24, q + (i) + 24));                                              \
    } while (0)

/* `ahead` (a constant once inlined): each line's step first asks for the line that
 * many bytes on, past the row's end into the rows after it. */
__attribute__((target("avx2"), always_inline)) static inline float dot_q8_avx2_inline(const float *x, const int8_t *q,
                                                                                     int64_t n, int ahead) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; ahead && i + 64 <= n; i += 64) {
        _mm_prefetch((const char *)(q + i + ahead), _MM_HINT_T0);
        Q8_STEP32(i);
        Q8_STEP32(i + 32);
    }
    for (; i + 32 <= n; i += 32) Q8_STEP32(i);
    for (; i + 8 <= n; i += 8) a0 = _mm256_add_ps(a0, q8_product(x + i, q + i));
    float sum = lanes_sum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) sum += x[i] * (float)q[i];
    return sum;
}

__attribute__((target("avx2"))) static float dot_q8_avx2(const float *x, const int8_t *q, int64_t n) {
    return dot_q8_avx2_inline(x, q, n, 0);
}

/* Rows [r0, r1) against one token in one call, the row's loop inlined: a short row
 * (a decode's expert down projection) pays no call of its own. */
__attribute__((target("avx2"))) static void rows_q8_avx2(const int8_t *q, const float *scale, int64_t rows,
                                                         int64_t cols, const float *x, float *y, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) y[r] = dot_q8_avx2_inline(x, q + r * cols, cols, Q8_STREAM_AHEAD) * scale[r];
    (void)rows;
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
    return lanes_sum(row);
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
        float sum = lanes_sum(acc[j]);
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
        float sum = lanes_sum(_mm256_add_ps(_mm256_add_ps(acc[j][0], acc[j][1]), _mm256_add_ps(acc[j][2], acc[j][3])));
        for (int64_t k = i; k < n; k++) sum += x[j * stride + k] * (float)q[k];
        y[j] = sum;
    }
}

/* TILE_ROWS rows against F32_TOKENS tokens: their sums side by side, each (row,
 * token)'s the operations of its single-token loop in its order, so the same bits.
 * Each row's vector is loaded once for the four tokens and each token's once for the
 * rows: one row a block has five loads and four sums a step, too few to keep the
 * adders busy, and a prefill waits on them (bench/RESULTS.md). Four rows' sums need
 * the 32 registers of AVX-512 (on 256-bit vectors, the same operations); AVX2's 16
 * hold two rows'. REG: the asm constraint that keeps a token's x in a register, one
 * load a token rather than one a product. */
#define F32_TILE(NAME, TARGET, TILE_ROWS, REG)                                                                       \
    __attribute__((target(TARGET), always_inline)) static inline void NAME##_nt(                                     \
        const float *w, int64_t cols, const float *x, int64_t stride, int64_t n, float (*y)[F32_TOKENS],             \
        const int NT, const float *next) {                                                                           \
        __m256 acc[TILE_ROWS][F32_TOKENS];                                                                           \
        _Pragma("GCC unroll 4") for (int r = 0; r < TILE_ROWS; r++)                                                  \
            _Pragma("GCC unroll 4") for (int j = 0; j < NT; j++) acc[r][j] = _mm256_setzero_ps();                    \
        int64_t i = 0;                                                                                               \
        for (; i + 8 <= n; i += 8) {                                                                                 \
            __m256 wv[TILE_ROWS];                                                                                    \
            _Pragma("GCC unroll 4") for (int r = 0; r < TILE_ROWS; r++) wv[r] = _mm256_loadu_ps(w + r * cols + i);   \
            if (next && i % 16 == 0) /* a line of each */                                                            \
                _Pragma("GCC unroll 4") for (int r = 0; r < TILE_ROWS; r++) NEXT_ROWS_FETCH(next + r * cols + i);    \
            _Pragma("GCC unroll 4") for (int j = 0; j < NT; j++) {                                                   \
                __m256 xv = _mm256_loadu_ps(x + j * stride + i);                                                     \
                __asm__("" : REG(xv));                                                                               \
                _Pragma("GCC unroll 4") for (int r = 0; r < TILE_ROWS; r++)                                          \
                    acc[r][j] = _mm256_add_ps(acc[r][j], _mm256_mul_ps(xv, wv[r]));                                  \
            }                                                                                                        \
        }                                                                                                            \
        for (int r = 0; r < TILE_ROWS; r++)                                                                          \
            for (int j = 0; j < NT; j++) {                                                                           \
                float sum = lanes_sum(acc[r][j]);                                                                    \
                for (int64_t k = i; k < n; k++) sum += x[j * stride + k] * w[r * cols + k];                          \
                y[r][j] = sum;                                                                                       \
            }                                                                                                        \
    }                                                                                                                \
    TILE_OF_NT(NAME, TARGET, float)

/* F32_TILE for int8 rows: a step's eight lanes go to one of four sets (the
 * single-token loop's order), and the sets are independent sums, so each is summed on
 * its own, one set's (row, token) sums in the registers at a time: four sets would not
 * fit them. Q8_SLICE values at a time, every set over them before the next, so that
 * the sets' sweeps find the slice's x and weights in L1. Like the f32 tile it also takes
 * 1-3 tokens (a routed expert's few), the sets moved in and out sum by sum (Q8_TILE_MOVE). */
__attribute__((target("avx2"))) static inline __m256 q8_values8(const int8_t *q) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}

/* coli_weighted_rows_q8 and _q4, 32 (then 8) outputs in registers over every row:
 * each weight made a float as its format defines it, times the row's weight, added. */
__attribute__((target("avx2"))) static void weighted_rows_q8_avx2(const float *w, int64_t rows, const int8_t *q,
                                                                   const float *scale, int64_t n, float *c) {
    int64_t d = 0;
    for (; d + 32 <= n; d += 32) {
        __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int64_t i = 0; i < rows; i++) {
            const __m256 sv = _mm256_broadcast_ss(scale + i), wv = _mm256_broadcast_ss(w + i);
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
                a[k] = _mm256_add_ps(a[k], _mm256_mul_ps(wv, _mm256_mul_ps(q8_values8(q + i * n + d + 8 * k), sv)));
        }
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) _mm256_storeu_ps(c + d + 8 * k, a[k]);
    }
    for (; d + 8 <= n; d += 8) {
        __m256 a = _mm256_setzero_ps();
        for (int64_t i = 0; i < rows; i++) {
            const __m256 v = _mm256_mul_ps(q8_values8(q + i * n + d), _mm256_broadcast_ss(scale + i));
            a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_broadcast_ss(w + i), v));
        }
        _mm256_storeu_ps(c + d, a);
    }
    for (; d < n; d++) {
        float acc = 0.0f;
        for (int64_t i = 0; i < rows; i++) acc += w[i] * ((float)q[i * n + d] * scale[i]);
        c[d] = acc;
    }
}

/* The int4 form where a group and a row's nibbles come in whole eights (group and n
 * multiples of 8): eight outputs share a scale, and their nibbles are four bytes. */
__attribute__((target("avx2"))) static void weighted_rows_q4_avx2(const float *w, int64_t rows, const uint8_t *packed,
                                                                   const float *scale, int32_t group, int64_t n,
                                                                   float *c) {
    const int64_t groups = n / group;
    int64_t d = 0;
    for (; d + 32 <= n; d += 32) {
        __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int64_t i = 0; i < rows; i++) {
            const __m256 wv = _mm256_broadcast_ss(w + i);
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                const __m256 sv = _mm256_broadcast_ss(scale + i * groups + (d + 8 * k) / group);
                const __m256 v = q4_values8(packed + (i * n + d + 8 * k) / 2);
                a[k] = _mm256_add_ps(a[k], _mm256_mul_ps(wv, _mm256_mul_ps(v, sv)));
            }
        }
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) _mm256_storeu_ps(c + d + 8 * k, a[k]);
    }
    for (; d < n; d += 8) {
        __m256 a = _mm256_setzero_ps();
        for (int64_t i = 0; i < rows; i++) {
            const __m256 sv = _mm256_broadcast_ss(scale + i * groups + d / group);
            a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_broadcast_ss(w + i),
                                               _mm256_mul_ps(q4_values8(packed + (i * n + d) / 2), sv)));
        }
        _mm256_storeu_ps(c + d, a);
    }
}

#define Q8_TILE(NAME, TARGET, TILE_ROWS, REG)                                                                        \
    __attribute__((target(TARGET), always_inline)) static inline void NAME##_nt(                                     \
        const int8_t *q, int64_t cols, const float *x, int64_t stride, int64_t n, float (*y)[F32_TOKENS],            \
        const int NT, const int8_t *next) {                                                                          \
        __m256 sets[Q8_SETS][TILE_ROWS][F32_TOKENS], acc[TILE_ROWS][F32_TOKENS];                                     \
        for (int k = 0; k < Q8_SETS; k++)                                                                            \
            for (int r = 0; r < TILE_ROWS; r++)                                                                      \
                for (int j = 0; j < NT; j++) sets[k][r][j] = _mm256_setzero_ps();                                    \
        const int64_t full = n / (8 * Q8_SETS) * (8 * Q8_SETS);                                                      \
        for (int64_t c0 = 0; c0 < full; c0 += Q8_SLICE) {                                                            \
            const int64_t c1 = full - c0 < Q8_SLICE ? full : c0 + Q8_SLICE;                                          \
            for (int r = 0; next && r < TILE_ROWS; r++) /* the slice's lines of each */                              \
                for (int64_t b = c0; b < c1; b += 64) NEXT_ROWS_FETCH(next + r * cols + b);                          \
            for (int k = 0; k < Q8_SETS; k++) {                                                                      \
                Q8_TILE_MOVE(TILE_ROWS, acc, sets[k]);                                                               \
                for (int64_t i = c0 + 8 * k; i < c1; i += 8 * Q8_SETS) Q8_TILE_STEP(TILE_ROWS, REG, i);              \
                Q8_TILE_MOVE(TILE_ROWS, sets[k], acc);                                                               \
            }                                                                                                        \
        }                                                                                                            \
        Q8_TILE_MOVE(TILE_ROWS, acc, sets[0]); /* set 0 then takes the last 8-blocks */                              \
        for (int64_t i = full; i + 8 <= n; i += 8) Q8_TILE_STEP(TILE_ROWS, REG, i);                                  \
        Q8_TILE_MOVE(TILE_ROWS, sets[0], acc);                                                                       \
        for (int r = 0; r < TILE_ROWS; r++)                                                                          \
            for (int j = 0; j < NT; j++) {                                                                           \
                float sum = lanes_sum(_mm256_add_ps(_mm256_add_ps(sets[0][r][j], sets[1][r][j]),                     \
                                                    _mm256_add_ps(sets[2][r][j], sets[3][r][j])));                   \
                for (int64_t i = n / 8 * 8; i < n; i++) sum += x[j * stride + i] * (float)q[r * cols + i];           \
                y[r][j] = sum;                                                                                       \
            }                                                                                                        \
    }                                                                                                                \
    TILE_OF_NT(NAME, TARGET, int8_t)
/* a tile's NT sums a row from one array to the other, element by element: the NT = 3
 * tile's arrays, a column short of full, otherwise stay in memory */
#define Q8_TILE_MOVE(TILE_ROWS, to, from)                                                                            \
    _Pragma("GCC unroll 4") for (int r = 0; r < TILE_ROWS; r++)                                                      \
        _Pragma("GCC unroll 4") for (int j = 0; j < NT; j++)(to)[r][j] = (from)[r][j]
#define Q8_TILE_STEP(TILE_ROWS, REG, i)                                                                              \
    do {                                                                                                             \
        __m256 wv[TILE_ROWS];                                                                                        \
        _Pragma("GCC unroll 4") for (int r = 0; r < TILE_ROWS; r++) wv[r] = q8_values8(q + r * cols + (i));          \
        _Pragma("GCC unroll 4") for (int j = 0; j < NT; j++) {                                                       \
            __m256 xv = _mm256_loadu_ps(x + j * stride + (i));                                                       \
            __asm__("" : REG(xv));                                                                                   \
            _Pragma("GCC unroll 4") for (int r = 0; r < TILE_ROWS; r++)                                              \
                acc[r][j] = _mm256_add_ps(acc[r][j], _mm256_mul_ps(xv, wv[r]));                                      \
        }                                                                                                            \
    } while (0)
/* A tile's function for 1 to F32_TOKENS tokens, each count its own unrolled loop. */
#define TILE_OF_NT(NAME, TARGET, T)                                                                                  \
    __attribute__((target(TARGET))) static void NAME(const void *w, int64_t cols, const float *x, int64_t stride,    \
                                                     int64_t n, int nt, float (*y)[F32_TOKENS], const void *next) {  \
        switch (nt) {                                                                                                \
        case 1: NAME##_nt((const T *)w, cols, x, stride, n, y, 1, next); break;                                      \
        case 2: NAME##_nt((const T *)w, cols, x, stride, n, y, 2, next); break;                                      \
        case 3: NAME##_nt((const T *)w, cols, x, stride, n, y, 3, next); break;                                      \
        default: NAME##_nt((const T *)w, cols, x, stride, n, y, F32_TOKENS, next);                                   \
        }                                                                                                            \
    }

#define IN_YMM(v) "+x"(v)
#define IN_ANY(v) "+v"(v)
#define AVX512_TARGET "avx2,avx512f,avx512vl"
F32_TILE(f32_tile2, "avx2", 2, IN_YMM)
F32_TILE(f32_tile4, AVX512_TARGET, 4, IN_ANY)
Q8_TILE(q8_tile2, "avx2", 2, IN_YMM)
Q8_TILE(q8_tile4, AVX512_TARGET, 4, IN_ANY)

/* A row against F32_TOKENS tokens, and one token, through the one-row loops above,
 * their weights as rows_tiled_avx2 passes them. */
__attribute__((target("avx2"))) static void f32_tokens4(const void *w, const float *x, int64_t stride, int64_t n,
                                                        float *y) {
    dot_f32_avx2_tokens(w, x, stride, n, y);
}
__attribute__((target("avx2"))) static float f32_one(const float *x, const void *w, int64_t n) {
    return dot_f32_avx2(x, w, n);
}
__attribute__((target("avx2"))) static void q8_tokens4(const void *w, const float *x, int64_t stride, int64_t n,
                                                       float *y) {
    for (int j = 0; j < F32_TOKENS; j += Q8_TOKENS) dot_q8_avx2_tokens(w, x + j * stride, stride, n, y + j);
}
__attribute__((target("avx2"))) static float q8_one(const float *x, const void *w, int64_t n) {
    return dot_q8_avx2(x, w, n);
}

/* Rows [r0, r1) against s >= 2 tokens, f32 or int8: TOKEN_BLOCK tokens a sweep over
 * the rows, so that their x stays in the core's cache while the rows go by; `rows`
 * rows and up to F32_TOKENS tokens a tile, the last rows one by one (four tokens
 * through the one-row loop, the rest one by one); y times the row's scale where there
 * is one. A block's first tile over a tile of rows asks for the next tile's rows
 * (`next`, NULL for none: NEXT_ROWS_FETCH). */
typedef struct tiles {
    void (*tile)(const void *w, int64_t cols, const float *x, int64_t stride, int64_t n, int nt,
                 float (*y)[F32_TOKENS], const void *next);
    int rows;    /* a tile's, at most 4 */
    void (*tokens4)(const void *w, const float *x, int64_t stride, int64_t n, float *y);
    float (*one)(const float *x, const void *w, int64_t n);
    size_t width; /* bytes a weight */
} tiles;

static const tiles F32_TILES[2] = {{f32_tile2, 2, f32_tokens4, f32_one, sizeof(float)},
                                   {f32_tile4, 4, f32_tokens4, f32_one, sizeof(float)}};
static const tiles Q8_TILES[2] = {{q8_tile2, 2, q8_tokens4, q8_one, sizeof(int8_t)},
                                  {q8_tile4, 4, q8_tokens4, q8_one, sizeof(int8_t)}};

__attribute__((target("avx2"))) static void rows_tiled_avx2(const tiles *tl, const void *w, const float *scale,
                                                            int64_t rows, int64_t cols, const float *x, int64_t s,
                                                            float *y, int64_t r0, int64_t r1) {
    float out[4][F32_TOKENS];
    const size_t row_bytes = (size_t)cols * tl->width;
    const int fetch = row_bytes >= NEXT_ROWS_MIN;
    for (int64_t t0 = 0; t0 < s; t0 += TOKEN_BLOCK) {
        const int64_t t1 = s - t0 < TOKEN_BLOCK ? s : t0 + TOKEN_BLOCK;
        for (int64_t r = r0; r < r1;) {
            const int n_rows = r1 - r >= tl->rows ? tl->rows : 1;
            const char *wr = (const char *)w + (size_t)r * row_bytes;
            for (int64_t t = t0; t < t1;) {
                const int nt = t1 - t < F32_TOKENS ? (int)(t1 - t) : F32_TOKENS;
                if (n_rows > 1)
                    tl->tile(wr, cols, x + t * cols, cols, cols, nt, out,
                             fetch && t == t0 && r + n_rows + tl->rows <= r1 ? wr + n_rows * row_bytes : NULL);
                else if (nt == F32_TOKENS) tl->tokens4(wr, x + t * cols, cols, cols, out[0]);
                else
                    for (int j = 0; j < nt; j++) out[0][j] = tl->one(x + (t + j) * cols, wr, cols);
                for (int q = 0; q < n_rows; q++)
                    for (int j = 0; j < nt; j++)
                        y[(t + j) * rows + r + q] = scale ? out[q][j] * scale[r + q] : out[q][j];
                t += nt;
            }
            r += n_rows;
        }
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
        y[j] = lanes_sum(row[j]);
    }
}

/* x of s tokens as the vector loops take it (the digits' comment): per token, per 32
 * of its values, three planes of 32 int8 digits (a, b, c) in the order the weights'
 * bytes unpack to (the 16 low nibbles, then the 16 high: elements 0, 2, .., 30, then
 * 1, 3, .., 31), and per group 8 in32 lanes of 8 times the lane's sum of v (the
 * stored values' bias of 8, taken off once a group). */
typedef struct q4d_x {
    int8_t *digits;  /* [s][cols / 32][3][32] */
    int32_t *bias;   /* [s][groups][8] */
    q4d_scale *sc;   /* [s] */
} q4d_x;

/* The largest |x[i]|, NaNs passed over as max_abs passes them (the quantisers take it
 * for their scale); where `bad`, also whether an inf or a NaN is there (x's digits take
 * that instead of the max). */
__attribute__((target("avx2"))) static float abs_max_avx2(const float *x, int64_t n, int *bad) {
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
    __m256 m = _mm256_setzero_ps(), wrong = m;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i));
        wrong = _mm256_or_ps(wrong, _mm256_cmp_ps(a, big, _CMP_NLE_UQ)); /* inf or NaN */
        m = _mm256_max_ps(a, m);                                         /* a NaN: m */
    }
    float l[8], max = 0.0f;
    _mm256_storeu_ps(l, m);
    int any_wrong = _mm256_movemask_ps(wrong) != 0;
    for (int k = 0; k < 8; k++) max = l[k] > max ? l[k] : max;
    for (; i < n; i++) {
        const float a = fabsf(x[i]);
        any_wrong |= !(a <= FLT_MAX);
        if (a > max) max = a;
    }
    if (bad) *bad = any_wrong;
    return max;
}

/* One token's digits and bias lanes (cols % group == 0, q4d_fits(group)). v + 0x808080
 * holds the digits plus 128 as its bytes 0-2 (c, b, a), |v| <= 2^22 keeping each in
 * its byte; a shuffle gathers a byte of each value, evens first. */
__attribute__((target("avx2"))) static void q4d_prepare_avx2(const float *x, int64_t cols, int32_t group,
                                                              int8_t *digits, int32_t *bias, q4d_scale *out) {
    int bad = 0;
    const float max = abs_max_avx2(x, cols, &bad);
    const q4d_scale sc = q4d_scale_from(max, bad);
    *out = sc;
    const __m256 m1 = _mm256_set1_ps(bad ? 0.0f : sc.m1), m2 = _mm256_set1_ps(sc.m2);
    const __m256i off = _mm256_set1_epi32(0x808080), flip = _mm256_set1_epi8((char)0x80);
    /* per 128-bit half of 4 values: byte 0 of each, then byte 1, then byte 2 (c, b, a) */
    const __m256i gather = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const int64_t per_group = group / 32;
    for (int64_t blk = 0; blk < cols / 32; blk++) {
        const float *xb = x + blk * 32;
        /* evens and odds of the 32 values, 8 at a time, in element order */
        __m256 v8[4];
        for (int h = 0; h < 2; h++) {
            const __m256 a = _mm256_loadu_ps(xb + 16 * h), b = _mm256_loadu_ps(xb + 16 * h + 8);
            /* a: 0..7, b: 8..15 -> evens 0,2,4,6 | 8,10,12,14 after the lane fix */
            const __m256 ev = _mm256_shuffle_ps(a, b, 0x88), od = _mm256_shuffle_ps(a, b, 0xDD);
            v8[h] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ev), 0xD8));
            v8[2 + h] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(od), 0xD8));
        }
        /* v8[0], v8[1]: elements 0, 2, .., 30; v8[2], v8[3]: 1, 3, .., 31 */
        __m256i bytes[4];
        int32_t *lanes = bias + (blk / per_group) * 8;
        if (blk % per_group == 0) memset(lanes, 0, 8 * sizeof *lanes);
        for (int q = 0; q < 4; q++) {
            __m256 f = _mm256_mul_ps(_mm256_mul_ps(v8[q], m1), m2);
            if (bad) f = _mm256_setzero_ps();
            const __m256i v = _mm256_cvtps_epi32(f);
            /* v's lanes q*8 .. q*8+7 of the block's order: its bias lanes 2q, 2q + 1 */
            const __m128i sum4 = _mm_hadd_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            const __m128i sum2 = _mm_hadd_epi32(sum4, sum4); /* [lo4, hi4, lo4, hi4] */
            lanes[2 * q] += 8 * _mm_cvtsi128_si32(sum2);
            lanes[2 * q + 1] += 8 * _mm_extract_epi32(sum2, 1);
            bytes[q] = _mm256_shuffle_epi8(_mm256_xor_si256(_mm256_add_epi32(v, off), flip), gather);
        }
        /* bytes[q]: per half, 4 values' c, b and a as dwords 0-2; gathered to c, b, a
         * of its 8 values as qwords 0-2, then each plane's qwords of bytes[0..3] in order */
        const __m256i pairs = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (int q = 0; q < 4; q++) bytes[q] = _mm256_permutevar8x32_epi32(bytes[q], pairs);
        const __m256i lo01 = _mm256_unpacklo_epi64(bytes[0], bytes[1]), lo23 = _mm256_unpacklo_epi64(bytes[2], bytes[3]);
        const __m256i hi01 = _mm256_unpackhi_epi64(bytes[0], bytes[1]), hi23 = _mm256_unpackhi_epi64(bytes[2], bytes[3]);
        __m256i *d = (__m256i *)(digits + blk * 96);
        _mm256_storeu_si256(d, _mm256_permute2x128_si256(lo01, lo23, 0x31));     /* a */
        _mm256_storeu_si256(d + 1, _mm256_permute2x128_si256(hi01, hi23, 0x20)); /* b */
        _mm256_storeu_si256(d + 2, _mm256_permute2x128_si256(lo01, lo23, 0x20)); /* c */
    }
}

/* Every token's digits, or 0 where there is no memory for them. */
static int q4d_prepare(q4d_x *xd, const float *x, int64_t s, int64_t cols, int32_t group) {
    const int64_t groups = cols / group;
    xd->digits = malloc((size_t)(s * cols * 3));
    xd->bias = malloc((size_t)(s * groups * 8) * sizeof *xd->bias);
    xd->sc = malloc((size_t)s * sizeof *xd->sc);
    if (!xd->digits || !xd->bias || !xd->sc) {
        free(xd->digits), free(xd->bias), free(xd->sc);
        return 0;
    }
    for (int64_t t = 0; t < s; t++)
        q4d_prepare_avx2(x + t * cols, cols, group, xd->digits + t * cols * 3, xd->bias + t * groups * 8, xd->sc + t);
    return 1;
}

static void q4d_release(q4d_x *xd) { free(xd->digits), free(xd->bias), free(xd->sc); }

/* A row against N tokens of xd from t0 (N a constant where it is inlined): the
 * weights' 16 bytes of each 32 unpacked once, their products with each token's three
 * digit planes summed by DOT (u8 x s8, four a lane, into int32 lanes), the planes'
 * sums put together as (256 a + b) 256 + c, each plane's DOT adding into the sum
 * before it shifted (exact: int32 wraps, and the true sum fits), less the bias
 * lanes, then the group's float lanes. */
#define Q4D_ROW(NAME, TARGET, DOT, UNPACK)                                                                           \
    __attribute__((target(TARGET), always_inline)) static inline void NAME##_n(                                      \
        const uint8_t *p, const float *scale, int64_t groups, const q4d_x *xd, int64_t cols,                         \
        int64_t t0, const int N, const int64_t per_group, float *out) {                                              \
        const __m256i zero = _mm256_setzero_si256(), ones = _mm256_set1_epi16(1);                                    \
        __m256 row[Q4_TOKENS];                                                                                       \
        _Pragma("GCC unroll 4")                                                                                      \
        for (int j = 0; j < N; j++) row[j] = _mm256_setzero_ps();                                                    \
        for (int64_t g = 0; g < groups; g++) {                                                                       \
            __m256i t[Q4_TOKENS];                                                                                    \
            _Pragma("GCC unroll 4")                                                                                  \
            for (int j = 0; j < N; j++) t[j] = zero;                                                                 \
            for (int64_t blk = g * per_group; blk < (g + 1) * per_group; blk++) {                                    \
                _mm_prefetch((const char *)(p + blk * 16 + STREAM_AHEAD), _MM_HINT_T0);                              \
                const __m256i w = UNPACK(p + blk * 16);                                                              \
                _Pragma("GCC unroll 4")                                                                              \
                for (int j = 0; j < N; j++) {                                                                        \
                    const int8_t *d = xd->digits + (t0 + j) * cols * 3 + blk * 96;                                   \
                    const __m256i a = DOT(zero, w, _mm256_loadu_si256((const __m256i *)d), ones);                    \
                    const __m256i ab = DOT(_mm256_slli_epi32(a, 8), w, _mm256_loadu_si256((const __m256i *)(d + 32)), \
                                           ones);                                                                    \
                    t[j] = _mm256_add_epi32(t[j], DOT(_mm256_slli_epi32(ab, 8), w,                                   \
                                                      _mm256_loadu_si256((const __m256i *)(d + 64)), ones));         \
                }                                                                                                    \
            }                                                                                                        \
            const __m256 sg = _mm256_set1_ps(scale[g]);                                                              \
            _Pragma("GCC unroll 4")                                                                                  \
            for (int j = 0; j < N; j++) {                                                                            \
                const __m256i lanes = _mm256_loadu_si256((const __m256i *)(xd->bias + ((t0 + j) * groups + g) * 8)); \
                row[j] = _mm256_add_ps(row[j], _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(t[j], lanes)), sg)); \
            }                                                                                                        \
        }                                                                                                            \
        _Pragma("GCC unroll 4")                                                                                      \
        for (int j = 0; j < N; j++) {                                                                                \
            out[j] = lanes_sum(row[j]) * xd->sc[t0 + j].step;                                                      \
        }                                                                                                            \
    }                                                                                                                \
    __attribute__((target(TARGET), always_inline)) static inline void NAME##_rows_pg(                               \
        const uint8_t *packed, const float *scale, int64_t rows, int64_t cols, int64_t groups, const q4d_x *xd,       \
        int64_t s, float *y, int64_t r0, int64_t r1, const int64_t pg) {                                             \
        float out[Q4_TOKENS];                                                                                        \
        for (int64_t r = r0; r < r1; r++) {                                                                          \
            const uint8_t *pr = packed + r * cols / 2;                                                               \
            int64_t t = 0;                                                                                           \
            for (; t + Q4_TOKENS <= s; t += Q4_TOKENS) {                                                             \
                NAME##_n(pr, scale + r * groups, groups, xd, cols, t, Q4_TOKENS, pg, out);                           \
                for (int j = 0; j < Q4_TOKENS; j++) y[(t + j) * rows + r] = out[j];                                  \
            }                                                                                                        \
            for (; t < s; t++) {                                                                                     \
                NAME##_n(pr, scale + r * groups, groups, xd, cols, t, 1, pg, out);                                   \
                y[t * rows + r] = out[0];                                                                            \
            }                                                                                                        \
        }                                                                                                            \
    }                                                                                                                \
    /* Rows [r0, r1) against every token, Q4_TOKENS at a time and the rest one by one: one                          \
     * call for the rows, so a short row (a decode's expert down projection) pays no call. */                       \
    __attribute__((target(TARGET))) static void NAME(const uint8_t *packed, const float *scale, int64_t rows,        \
                                                     int64_t cols, int32_t group, const q4d_x *xd, int64_t s,        \
                                                     float *y, int64_t r0, int64_t r1) {                             \
        const int64_t groups = cols / group, pg = group / 32; /* groups of 32 (the usual): no loop over 32s */        \
        if (pg == 1) NAME##_rows_pg(packed, scale, rows, cols, groups, xd, s, y, r0, r1, 1);                         \
        else NAME##_rows_pg(packed, scale, rows, cols, groups, xd, s, y, r0, r1, pg);                                \
    }

#define DOT_AVX2(acc, w, d, ones) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, d), ones))
#define DOT_VNNI(acc, w, d, ones) ((void)(ones), _mm256_dpbusd_epi32(acc, w, d))
/* A 32's 16 bytes as its 32 stored values, the low nibbles then the high: the 16 bytes
 * in both halves, then a shift of the upper half and a mask; or, with GFNI, one affine
 * map a byte (its matrix a 64-bit lane: the low nibble in the lower half, the high in
 * the upper), the same values in one operation of the dozen a 32 takes. */
#define VNNI_TARGET AVX512_TARGET ",avx512vnni"
#define GFNI_TARGET VNNI_TARGET ",gfni"
#define BYTES16_TWICE(q) _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(q)))
#define UNPACK_SHIFT(q)                                                                                              \
    _mm256_and_si256(_mm256_srlv_epi32(BYTES16_TWICE(q), _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),                 \
                     _mm256_set1_epi8(0x0F))
#define NIBBLE_LOW 0x0102040800000000LL  /* result bit i <- byte bit i, i < 4 */
#define NIBBLE_HIGH 0x1020408000000000LL /* result bit i <- byte bit i + 4, i < 4 */
#define UNPACK_GFNI(q)                                                                                               \
    _mm256_gf2p8affine_epi64_epi8(BYTES16_TWICE(q),                                                                  \
                                  _mm256_setr_epi64x(NIBBLE_LOW, NIBBLE_LOW, NIBBLE_HIGH, NIBBLE_HIGH), 0)
Q4D_ROW(row_q4d_avx2, "avx2", DOT_AVX2, UNPACK_SHIFT)
Q4D_ROW(row_q4d_vnni, VNNI_TARGET, DOT_VNNI, UNPACK_SHIFT)
Q4D_ROW(row_q4d_gfni, GFNI_TARGET, DOT_VNNI, UNPACK_GFNI)

/* Groups of 32 (the engine's), TILE_ROWS rows against Q4_TOKENS tokens of xd from t0:
 * each row's unpacked weights used for the four tokens and each token's digits and
 * bias lanes for the rows, each (row, token) the operations of NAME##_n in its order.
 * Four rows need AVX-512's 32 registers; two, on AVX2's 16, gain nothing over one
 * (bench/RESULTS.md), so AVX2 keeps NAME##_n. Each row asks for the same bytes of the
 * row TILE_ROWS below (the next tile's, NEXT_ROWS_FETCH): a fixed distance ahead of
 * its own loads would land in this tile's other rows, which it reads anyway. */
#define Q4D_TILE(NAME, TARGET, DOT, UNPACK, TILE_ROWS)                                                               \
    __attribute__((target(TARGET), always_inline)) static inline void NAME##_nt(                                     \
        const uint8_t *p, const float *scale, int64_t cols, int64_t groups, const q4d_x *xd, int64_t t0,             \
        float (*out)[Q4_TOKENS], const int NT) {                                                                     \
        const __m256i zero = _mm256_setzero_si256(), ones = _mm256_set1_epi16(1);                                    \
        __m256 row[TILE_ROWS][Q4_TOKENS];                                                                            \
        _Pragma("GCC unroll 4") for (int r = 0; r < TILE_ROWS; r++)                                                  \
            _Pragma("GCC unroll 4") for (int j = 0; j < NT; j++) row[r][j] = _mm256_setzero_ps();                    \
        for (int64_t g = 0; g < groups; g++) {                                                                       \
            __m256i w[TILE_ROWS];                                                                                    \
            __m256 sg[TILE_ROWS];                                                                                    \
            _Pragma("GCC unroll 4") for (int r = 0; r < TILE_ROWS; r++) {                                            \
                const uint8_t *pr = p + r * cols / 2 + g * 16;                                                       \
                _mm_prefetch((const char *)(pr + TILE_ROWS * cols / 2), _MM_HINT_T0);                                \
                w[r] = UNPACK(pr);                                                                                   \
                sg[r] = _mm256_set1_ps(scale[r * groups + g]);                                                       \
            }                                                                                                        \
            _Pragma("GCC unroll 4") for (int j = 0; j < NT; j++) {                                                   \
                const int8_t *d = xd->digits + (t0 + j) * cols * 3 + g * 96;                                         \
                const __m256i da = _mm256_loadu_si256((const __m256i *)d);                                           \
                const __m256i db = _mm256_loadu_si256((const __m256i *)(d + 32));                                    \
                const __m256i dc = _mm256_loadu_si256((const __m256i *)(d + 64));                                    \
                const __m256i lanes = _mm256_loadu_si256((const __m256i *)(xd->bias + ((t0 + j) * groups + g) * 8)); \
                _Pragma("GCC unroll 4") for (int r = 0; r < TILE_ROWS; r++) {                                        \
                    const __m256i a = DOT(zero, w[r], da, ones);                                                     \
                    const __m256i ab = DOT(_mm256_slli_epi32(a, 8), w[r], db, ones);                                 \
                    const __m256i t = DOT(_mm256_slli_epi32(ab, 8), w[r], dc, ones);                                 \
                    row[r][j] = _mm256_add_ps(row[r][j],                                                             \
                                              _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(t, lanes)), sg[r])); \
                }                                                                                                    \
            }                                                                                                        \
        }                                                                                                            \
        for (int r = 0; r < TILE_ROWS; r++)                                                                          \
            for (int j = 0; j < NT; j++) out[r][j] = lanes_sum(row[r][j]) * xd->sc[t0 + j].step;                     \
    }                                                                                                                \
    __attribute__((target(TARGET))) static void NAME(const uint8_t *p, const float *scale, int64_t cols,             \
                                                     int64_t groups, const q4d_x *xd, int64_t t0, int nt,            \
                                                     float (*out)[Q4_TOKENS]) {                                      \
        switch (nt) {                                                                                                \
        case 1: NAME##_nt(p, scale, cols, groups, xd, t0, out, 1); break;                                            \
        case 2: NAME##_nt(p, scale, cols, groups, xd, t0, out, 2); break;                                            \
        case 3: NAME##_nt(p, scale, cols, groups, xd, t0, out, 3); break;                                            \
        default: NAME##_nt(p, scale, cols, groups, xd, t0, out, Q4_TOKENS);                                          \
        }                                                                                                            \
    }
Q4D_TILE(q4d_tile_vnni, VNNI_TARGET, DOT_VNNI, UNPACK_SHIFT, 4)
Q4D_TILE(q4d_tile_gfni, GFNI_TARGET, DOT_VNNI, UNPACK_GFNI, 4)

/* Rows [r0, r1) of groups of 32 against s >= 2 tokens on VNNI: TOKEN_BLOCK tokens a
 * sweep over the rows, tiles of four rows and up to four tokens, the last rows through
 * the row loop (ROW##_n). */
#define Q4D_TILED(NAME, TARGET, TILE, ROW)                                                                           \
    __attribute__((target(TARGET))) static void NAME(const uint8_t *packed, const float *scale, int64_t rows,        \
                                                     int64_t cols, const q4d_x *xd, int64_t s, float *y, int64_t r0, \
                                                     int64_t r1) {                                                   \
        const int64_t groups = cols / 32;                                                                            \
        float out[4][Q4_TOKENS];                                                                                     \
        for (int64_t t0 = 0; t0 < s; t0 += TOKEN_BLOCK) {                                                            \
            const int64_t t1 = s - t0 < TOKEN_BLOCK ? s : t0 + TOKEN_BLOCK;                                          \
            for (int64_t r = r0; r < r1;) {                                                                          \
                const int n_rows = r1 - r >= 4 ? 4 : 1;                                                              \
                const uint8_t *pr = packed + r * cols / 2;                                                           \
                for (int64_t t = t0; t < t1;) {                                                                      \
                    const int nt = t1 - t < Q4_TOKENS ? (int)(t1 - t) : Q4_TOKENS;                                   \
                    const float *sr = scale + r * groups;                                                            \
                    if (n_rows > 1) TILE(pr, sr, cols, groups, xd, t, nt, out);                                      \
                    else if (nt == Q4_TOKENS) ROW##_n(pr, sr, groups, xd, cols, t, Q4_TOKENS, 1, out[0]);            \
                    else                                                                                             \
                        for (int j = 0; j < nt; j++) ROW##_n(pr, sr, groups, xd, cols, t + j, 1, 1, out[0] + j);     \
                    for (int q = 0; q < n_rows; q++)                                                                 \
                        for (int j = 0; j < nt; j++) y[(t + j) * rows + r + q] = out[q][j];                          \
                    t += nt;                                                                                         \
                }                                                                                                    \
                r += n_rows;                                                                                         \
            }                                                                                                        \
        }                                                                                                            \
    }
Q4D_TILED(rows_q4d_tiled_vnni, VNNI_TARGET, q4d_tile_vnni, row_q4d_vnni)
Q4D_TILED(rows_q4d_tiled_gfni, GFNI_TARGET, q4d_tile_gfni, row_q4d_gfni)

/* The loops this CPU runs: 3 AVX-512 VNNI with GFNI (int4's nibbles unpacked by an
 * affine map), 2 AVX-512 VNNI (its byte products and 32 registers; AVX2 elsewhere), 1
 * AVX2, 0 portable. COLI_CPU_PORTABLE=1 forces 0, COLI_CPU_LOOPS=avx2 or avx512vnni
 * caps the level at 1 or 2 (tests compare every level's bits). */
static int cpu_level(void) {
    static int cached = -1;
    if (cached < 0) {
        const char *cap = getenv("COLI_CPU_LOOPS");
        const int most = getenv("COLI_CPU_PORTABLE")                  ? 0
                         : cap && strcmp(cap, "avx2") == 0       ? 1
                         : cap && strcmp(cap, "avx512vnni") == 0 ? 2
                                                                 : 3;
        const int has = !__builtin_cpu_supports("avx2")                                                   ? 0
                        : !(__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl")) ? 1
                        : !__builtin_cpu_supports("gfni")                                                 ? 2
                                                                                                          : 3;
        cached = has < most ? has : most;
    }
    return cached;
}
static int use_avx2(void) { return cpu_level() >= 1; }
/* The quantisers' loops 8 values at a time: max_abs's result (abs_max_avx2) and
 * clamp_round's very operations (a division, the truncation, the step away from zero),
 * so the same bytes; a block holding a value at or past 2^23 (or a NaN) goes value by
 * value, as clamp_round does. A large model's load was mostly their divisions. */
/* clamp_round(v[k] / sc, lo, hi) into out[k] for 8 values, or 0 where one of them is
 * at or past 2^23 or a NaN (the caller rounds those 8 one at a time). */
__attribute__((target("avx2"))) static int round8_avx2(const float *v, float sc, float lo, float hi, int32_t *out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 x = _mm256_div_ps(_mm256_loadu_ps(v), _mm256_set1_ps(sc));
    if (_mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, x), _mm256_set1_ps(8388608.0f), _CMP_NLT_UQ)))
        return 0;
    const __m256 t = _mm256_round_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 away = _mm256_and_ps(
        _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(x, t)), _mm256_set1_ps(0.5f), _CMP_GE_OQ),
        _mm256_set1_ps(1.0f));
    const __m256 r = _mm256_add_ps(t, _mm256_or_ps(away, _mm256_and_ps(x, sign))); /* t + copysignf(away, x) */
    const __m256 c = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(lo)), _mm256_set1_ps(hi));
    _mm256_storeu_si256((__m256i *)out, _mm256_cvttps_epi32(c));
    return 1;
}

__attribute__((target("avx2"))) static void quantize_q8_avx2(const float *w, int64_t rows, int64_t cols, int8_t *q,
                                                              float *scale) {
    int32_t v8[8];
    for (int64_t r = 0; r < rows; r++) {
        const float *row = w + r * cols;
        const float m = abs_max_avx2(row, cols, NULL), sc = m > 0.0f ? m / 127.0f : 1.0f;
        int8_t *qr = q + r * cols;
        scale[r] = sc;
        int64_t c = 0;
        for (; c + 8 <= cols; c += 8) {
            if (round8_avx2(row + c, sc, -127.0f, 127.0f, v8))
                for (int k = 0; k < 8; k++) qr[c + k] = (int8_t)v8[k];
            else
                for (int k = 0; k < 8; k++) qr[c + k] = (int8_t)clamp_round(row[c + k] / sc, -127, 127);
        }
        for (; c < cols; c++) qr[c] = (int8_t)clamp_round(row[c] / sc, -127, 127);
    }
}

/* Groups of a multiple of 8 values (the engine's 32). */
__attribute__((target("avx2"))) static void quantize_q4_avx2(const float *w, int64_t rows, int64_t cols,
                                                              int32_t group, uint8_t *packed, float *scale) {
    const int64_t groups = cols / group;
    int32_t v8[8];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < groups; g++) {
            const float *v = w + r * cols + g * group;
            const float m = abs_max_avx2(v, group, NULL), sc = m > 0.0f ? m / 7.0f : 1.0f;
            uint8_t *p = packed + (r * cols + g * group) / 2;
            scale[r * groups + g] = sc;
            for (int32_t i = 0; i < group; i += 8) {
                if (!round8_avx2(v + i, sc, -8.0f, 7.0f, v8))
                    for (int k = 0; k < 8; k++) v8[k] = clamp_round(v[i + k] / sc, -8, 7);
                for (int k = 0; k < 8; k += 2) p[(i + k) / 2] = (uint8_t)((v8[k] + 8) | ((v8[k + 1] + 8) << 4));
            }
        }
}
#endif

void coli_quantize_q8(const float *w, int64_t rows, int64_t cols, int8_t *q, float *scale) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) {
        quantize_q8_avx2(w, rows, cols, q, scale);
        return;
    }
#endif
    quantize_q8_portable(w, rows, cols, q, scale);
}

void coli_quantize_q4(const float *w, int64_t rows, int64_t cols, int32_t group, uint8_t *packed, float *scale) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2() && group % 8 == 0) {
        quantize_q4_avx2(w, rows, cols, group, packed, scale);
        return;
    }
#endif
    quantize_q4_portable(w, rows, cols, group, packed, scale);
}


const char *coli_cpu_loops(void) {
#ifdef HAVE_AVX2_PATH
    if (cpu_level() == 3) return "avx512vnni+gfni";
    if (cpu_level() == 2) return "avx512vnni";
    if (cpu_level() == 1) return "avx2";
#endif
    return "portable";
}

/* x made ready once for int4 rows: its digits, for every call on it to share. */
struct coli_q4_x {
#ifdef HAVE_AVX2_PATH
    q4d_x xd;
#endif
    int64_t s, cols;
    int32_t group;
};

coli_q4_x *coli_q4_x_make(const float *x, int64_t s, int64_t cols, int32_t group) {
#ifdef HAVE_AVX2_PATH
    if (!q4d_fits(group) || !use_avx2()) return NULL;
    coli_q4_x *p = malloc(sizeof *p);
    if (!p || !q4d_prepare(&p->xd, x, s, cols, group)) {
        free(p);
        return NULL;
    }
    p->s = s, p->cols = cols, p->group = group;
    return p;
#else
    (void)x, (void)s, (void)cols, (void)group;
    return NULL;
#endif
}

void coli_q4_x_free(coli_q4_x *x) {
#ifdef HAVE_AVX2_PATH
    if (x) q4d_release(&x->xd);
#endif
    free(x);
}

/* The vector loops on prepared digits: blocks of Q4_TOKENS tokens, then one at a time,
 * a row's tokens before the next row. */
void coli_matmul_q4_rows_x(const uint8_t *packed, const float *scale, int64_t rows, const coli_q4_x *x, float *y,
                           int64_t r0, int64_t r1) {
#ifdef HAVE_AVX2_PATH
    const int64_t cols = x->cols, s = x->s;
    const int32_t group = x->group;
    const int tiled = group == 32 && s >= 2;
    if (cpu_level() == 3 && tiled) rows_q4d_tiled_gfni(packed, scale, rows, cols, &x->xd, s, y, r0, r1);
    else if (cpu_level() == 3) row_q4d_gfni(packed, scale, rows, cols, group, &x->xd, s, y, r0, r1);
    else if (cpu_level() == 2 && tiled) rows_q4d_tiled_vnni(packed, scale, rows, cols, &x->xd, s, y, r0, r1);
    else if (cpu_level() == 2) row_q4d_vnni(packed, scale, rows, cols, group, &x->xd, s, y, r0, r1);
    else row_q4d_avx2(packed, scale, rows, cols, group, &x->xd, s, y, r0, r1);
#else
    (void)packed, (void)scale, (void)rows, (void)x, (void)y, (void)r0, (void)r1;
#endif
}

/* int4 rows of groups that q4d_fits: the vector loops on x's digits made here, else
 * the portable loop; the same bits. */
static void q4d_rows(const uint8_t *packed, const float *scale, int64_t rows, int64_t cols, int32_t group,
                     const float *x, int64_t s, float *y, int64_t r0, int64_t r1) {
    coli_q4_x *xd = coli_q4_x_make(x, s, cols, group);
    if (xd) {
        coli_matmul_q4_rows_x(packed, scale, rows, xd, y, r0, r1);
        coli_q4_x_free(xd);
        return;
    }
    const int64_t groups = cols / group;
    for (int64_t t = 0; t < s; t++) {
        const q4d_scale sc = q4d_scale_of(x + t * cols, cols);
        for (int64_t r = r0; r < r1; r++)
            y[t * rows + r] = row_q4d_portable(x + t * cols, packed + r * cols / 2, scale + r * groups, groups, group, sc);
    }
}

float coli_dot_f32(const float *a, const float *b, int64_t n) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) return dot_f32_avx2(a, b, n);
#endif
    return dot_f32_portable(a, b, n);
}

void coli_dot_f32_many(const float *a, int64_t a_stride, const float *b, int64_t b_stride, int64_t nb,
                       const float *c, int64_t count, int64_t n, float scale, float *out) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) {
        dot_f32_avx2_many(a, a_stride, b, b_stride, nb, c, count, n, scale, out);
        return;
    }
#endif
    for (int64_t i = 0; i < count; i++)
        out[i] = dot_f32_split_portable(a + i * a_stride, b + i * b_stride, nb, c, n) * scale;
}

void coli_axpy_f32(float *o, float w, const float *v, int64_t n) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) {
        axpy_f32_avx2(o, w, v, n);
        return;
    }
#endif
    for (int64_t d = 0; d < n; d++) o[d] += w * v[d];
}

void coli_add_relu_f32(float *total, const float *d, int64_t n, float scale, float w) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) {
        add_relu_f32_avx2(total, d, n, scale, w);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        const float v = d[i] * scale;
        total[i] += w * (v > 0.0f ? v : 0.0f);
    }
}

void coli_weighted_sum_f32(const float *w, int64_t heads, int64_t rows, const float *v, int64_t stride, int64_t n,
                           float *c) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) {
        weighted_sum_f32_avx2(w, heads, rows, v, stride, n, c);
        return;
    }
#endif
    for (int64_t h = 0; h < heads; h++)
        for (int64_t d = 0; d < n; d++) {
            float acc = 0.0f;
            for (int64_t i = 0; i < rows; i++) acc += w[h * rows + i] * v[i * stride + d];
            c[h * n + d] = acc;
        }
}

void coli_weighted_rows_q8(const float *w, int64_t rows, const int8_t *q, const float *scale, int64_t n, float *c) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) {
        weighted_rows_q8_avx2(w, rows, q, scale, n, c);
        return;
    }
#endif
    for (int64_t d = 0; d < n; d++) {
        float acc = 0.0f;
        for (int64_t i = 0; i < rows; i++) acc += w[i] * ((float)q[i * n + d] * scale[i]);
        c[d] = acc;
    }
}

/* Element e of int4 values packed two a byte, the low nibble first: its value less the bias of 8. */
static inline int q4_at(const uint8_t *packed, int64_t e) { return (int)((packed[e / 2] >> (e % 2 * 4)) & 0x0F) - 8; }

void coli_weighted_rows_q4(const float *w, int64_t rows, const uint8_t *packed, const float *scale, int32_t group,
                           int64_t n, float *c) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2() && group % 8 == 0 && n % 8 == 0) {
        weighted_rows_q4_avx2(w, rows, packed, scale, group, n, c);
        return;
    }
#endif
    const int64_t groups = n / group;
    for (int64_t d = 0; d < n; d++) {
        float acc = 0.0f;
        for (int64_t i = 0; i < rows; i++) {
            acc += w[i] * ((float)q4_at(packed, i * n + d) * scale[i * groups + d / group]);
        }
        c[d] = acc;
    }
}

void coli_rows_f32_q8(const int8_t *q, const float *scale, int64_t rows, int64_t n, float *out) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t d = 0; d < n; d++) out[i * n + d] = (float)q[i * n + d] * scale[i];
}

#ifdef HAVE_AVX2_PATH
/* 32 values a step: the 16 bytes' low and high nibbles interleaved back to element order. */
__attribute__((target("avx2"))) static void rows_f32_q4_avx2(const uint8_t *packed, const float *scale, int32_t group,
                                                             int64_t rows, int64_t n, float *out) {
    const int64_t groups = n / group;
    const __m128i low = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t g = 0; g < groups; g++) {
            const __m256 sc = _mm256_set1_ps(scale[i * groups + g]);
            for (int64_t e = i * n + g * group; e < i * n + (g + 1) * group; e += 32) {
                const __m128i b = _mm_loadu_si128((const __m128i *)(packed + e / 2));
                const __m128i lo = _mm_and_si128(b, low), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low);
                const __m128i v[2] = {_mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), eight),
                                      _mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), eight)};
                for (int k = 0; k < 2; k++) {
                    const __m256 a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v[k]));
                    const __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v[k], 8)));
                    _mm256_storeu_ps(out + e + 16 * k, _mm256_mul_ps(a, sc));
                    _mm256_storeu_ps(out + e + 16 * k + 8, _mm256_mul_ps(c, sc));
                }
            }
        }
}
#endif

void coli_rows_f32_q4(const uint8_t *packed, const float *scale, int32_t group, int64_t rows, int64_t n, float *out) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2() && group % 32 == 0) {
        rows_f32_q4_avx2(packed, scale, group, rows, n, out);
        return;
    }
#endif
    const int64_t groups = n / group;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t g = 0; g < groups; g++) {
            const float sc = scale[i * groups + g];
            const int64_t e0 = i * n + g * group;
            for (int64_t e = e0; e < e0 + group; e++) out[e] = (float)q4_at(packed, e) * sc;
        }
}

float coli_scale_max_f32(float *x, int64_t n, float scale) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) return scale_max_f32_avx2(x, n, scale);
#endif
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        x[i] *= scale;
        if (x[i] > mx) mx = x[i];
    }
    return mx;
}

void coli_exp_f32(float *x, int64_t n, float sub) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) {
        exp_f32_avx2(x, n, sub);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) x[i] = exp_f32_one(x[i] - sub);
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

/* Each row against every token: several tokens through the tiles above, a single
 * token (and every token without AVX2) one row at a time; the same bits either way. A
 * single token's rows stay one at a time: several rows side by side are several
 * streams from memory, which it serves slower than one, and a decode reads each
 * weight once (bench/RESULTS.md). */
void coli_matmul_f32_rows(const float *w, int64_t rows, int64_t cols, const float *x, int64_t s, float *y,
                          int64_t r0, int64_t r1) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2() && s >= 2) {
        rows_tiled_avx2(&F32_TILES[cpu_level() >= 2], w, NULL, rows, cols, x, s, y, r0, r1);
        return;
    }
#endif
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t = 0; t < s; t++) y[t * rows + r] = coli_dot_f32(x + t * cols, w + r * cols, cols);
}

void coli_matmul_q8_rows(const int8_t *q, const float *scale, int64_t rows, int64_t cols, const float *x,
                         int64_t s, float *y, int64_t r0, int64_t r1) {
#ifdef HAVE_AVX2_PATH
    if (s == 1 && use_avx2()) {
        rows_q8_avx2(q, scale, rows, cols, x, y, r0, r1);
        return;
    }
    if (use_avx2() && s >= 2) {
        rows_tiled_avx2(&Q8_TILES[cpu_level() >= 2], q, scale, rows, cols, x, s, y, r0, r1);
        return;
    }
#endif
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t = 0; t < s; t++) y[t * rows + r] = dot_q8(x + t * cols, q + r * cols, cols) * scale[r];
}

void coli_matmul_q4_rows(const uint8_t *packed, const float *scale, int64_t rows, int64_t cols, int32_t group,
                         const float *x, int64_t s, float *y, int64_t r0, int64_t r1) {
    if (q4d_fits(group)) {
        q4d_rows(packed, scale, rows, cols, group, x, s, y, r0, r1);
        return;
    }
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
