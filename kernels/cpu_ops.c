#include "cpu_ops.h"

#include <math.h>

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

float coli_dot_f32(const float *a, const float *b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

static float dot_q8(const float *x, const int8_t *q, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += x[i + k] * (float)q[i + k];
    float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++) sum += x[i] * (float)q[i];
    return sum;
}

/* One group of a q4 row: `group` values from group/2 bytes. */
static float dot_q4(const float *x, const uint8_t *p, int32_t group) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int32_t i = 0;
    for (; i + 8 <= group; i += 8)
        for (int k = 0; k < 4; k++) {
            uint8_t b = p[(i >> 1) + k];
            acc[2 * k] += x[i + 2 * k] * (float)((int)(b & 0x0F) - 8);
            acc[2 * k + 1] += x[i + 2 * k + 1] * (float)((int)(b >> 4) - 8);
        }
    float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < group; i += 2) {
        uint8_t b = p[i >> 1];
        sum += x[i] * (float)((int)(b & 0x0F) - 8) + x[i + 1] * (float)((int)(b >> 4) - 8);
    }
    return sum;
}

void coli_matmul_f32_rows(const float *w, int64_t rows, int64_t cols, const float *x, int64_t s, float *y,
                          int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t = 0; t < s; t++) y[t * rows + r] = coli_dot_f32(x + t * cols, w + r * cols, cols);
}

void coli_matmul_q8_rows(const int8_t *q, const float *scale, int64_t rows, int64_t cols, const float *x,
                         int64_t s, float *y, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t = 0; t < s; t++) y[t * rows + r] = dot_q8(x + t * cols, q + r * cols, cols) * scale[r];
}

void coli_matmul_q4_rows(const uint8_t *packed, const float *scale, int64_t rows, int64_t cols, int32_t group,
                         const float *x, int64_t s, float *y, int64_t r0, int64_t r1) {
    int64_t groups = cols / group;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *pr = packed + r * cols / 2;
        for (int64_t t = 0; t < s; t++) {
            const float *xt = x + t * cols;
            float acc = 0.0f;
            for (int64_t g = 0; g < groups; g++)
                acc += dot_q4(xt + g * group, pr + g * group / 2, group) * scale[r * groups + g];
            y[t * rows + r] = acc;
        }
    }
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
