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

void coli_matmul_f32(const float *w, int64_t rows, int64_t cols, const float *x, int64_t s, float *y) {
    for (int64_t t = 0; t < s; t++) {
        const float *xt = x + t * cols;
        for (int64_t r = 0; r < rows; r++) {
            const float *wr = w + r * cols;
            float acc = 0.0f;
            for (int64_t c = 0; c < cols; c++) acc += xt[c] * wr[c];
            y[t * rows + r] = acc;
        }
    }
}

void coli_matmul_q8(const int8_t *q, const float *scale, int64_t rows, int64_t cols, const float *x,
                    int64_t s, float *y) {
    for (int64_t t = 0; t < s; t++) {
        const float *xt = x + t * cols;
        for (int64_t r = 0; r < rows; r++) {
            const int8_t *qr = q + r * cols;
            float acc = 0.0f;
            for (int64_t c = 0; c < cols; c++) acc += xt[c] * (float)qr[c];
            y[t * rows + r] = acc * scale[r];
        }
    }
}

void coli_matmul_q4(const uint8_t *packed, const float *scale, int64_t rows, int64_t cols, int32_t group,
                    const float *x, int64_t s, float *y) {
    int64_t groups = cols / group;
    for (int64_t t = 0; t < s; t++) {
        const float *xt = x + t * cols;
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *pr = packed + r * cols / 2;
            float acc = 0.0f;
            for (int64_t g = 0; g < groups; g++) {
                float part = 0.0f;
                for (int64_t c = g * group; c < (g + 1) * group; c += 2) {
                    uint8_t b = pr[c / 2];
                    part += xt[c] * (float)((int)(b & 0x0F) - 8);
                    part += xt[c + 1] * (float)((int)(b >> 4) - 8);
                }
                acc += part * scale[r * groups + g];
            }
            y[t * rows + r] = acc;
        }
    }
}
