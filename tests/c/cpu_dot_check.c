/* The CPU matmuls (kernels/cpu_ops.c) on random inputs of odd sizes: tails, one row,
 * one column, groups of 2 to 128, 1 to 9 rows, 1 to 9 tokens and now and then 65 to
 * 73 (past a pass's 64); int4 against x as integers with x scaled by 2^-110, an inf
 * or NaN, zeros; attention over several heads at once, the rope key kept once
 * (coli_attend_heads), against one head at a time over joined keys (coli_attend_one),
 * and the indexer's scores against one dot at a time, bit for bit; the weighted sums
 * (over f32, int8 and int4 rows) and exp of latent attention. Prints the loops
 * that ran and a hash of every output's bits, so that two runs (the vector loops, and
 * COLI_CPU_PORTABLE=1) can be compared bit for bit; each output is also checked
 * against a double-precision sum. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bits_hash.h"
#include "cpu_model_ops.h"
#include "cpu_ops.h"

static float rnd(void) { return (float)rand() / (float)RAND_MAX * 2.0f - 1.0f; }

/* |got - want| within a few float roundings of the sum of |terms| */
static int close(float got, double want, double magnitude) {
    return fabs((double)got - want) <= 1e-5 * magnitude + 1e-30;
}

int main(void) {
    static const int32_t GROUPS[] = {2, 6, 8, 10, 16, 24, 32, 64, 128};
    srand(11);
    int checked = 0, shared = 0;
    for (int it = 0; it < 3000; it++) {
        const int32_t group = GROUPS[rand() % (int)(sizeof GROUPS / sizeof GROUPS[0])];
        /* tiles of rows and of tokens and their rest */
        const int64_t rows = 1 + rand() % 9, s = it % 40 == 7 ? 65 + rand() % 9 : 1 + rand() % 9;
        const int64_t cols = it % 3 == 0 ? group * (1 + rand() % 8) : it % 3 == 1 ? 1 + rand() % 300 : 1;
        const int q4 = cols % group == 0;
        float *w = malloc(sizeof(float) * (size_t)(rows * cols)), *x = malloc(sizeof(float) * (size_t)(s * cols));
        float *y = malloc(sizeof(float) * (size_t)(s * rows)), *sc = malloc(sizeof(float) * (size_t)(rows * cols + rows));
        int8_t *q = malloc((size_t)(rows * cols));
        uint8_t *p = malloc((size_t)(rows * cols / 2 + 1));
        if (!w || !x || !y || !sc || !q || !p) return fprintf(stderr, "out of memory\n"), 2;
        for (int64_t i = 0; i < rows * cols; i++) w[i] = rnd();
        for (int64_t i = 0; i < s * cols; i++) x[i] = rnd() * 3.0f;
        for (int fmt = 0; fmt < 3; fmt++) {
            if (fmt == 2 && !q4) continue;
            if (fmt == 0) coli_matmul_f32(w, rows, cols, x, s, y);
            if (fmt == 1) coli_quantize_q8(w, rows, cols, q, sc), coli_matmul_q8(q, sc, rows, cols, x, s, y);
            if (fmt == 2) coli_quantize_q4(w, rows, cols, group, p, sc), coli_matmul_q4(p, sc, rows, cols, group, x, s, y);
            mix(y, s * rows);
            for (int64_t t = 0; t < s; t++)
                for (int64_t r = 0; r < rows; r++) {
                    double want = 0.0, mag = 0.0;
                    for (int64_t c = 0; c < cols; c++) {
                        double v = fmt == 0   ? w[r * cols + c]
                                   : fmt == 1 ? (double)q[r * cols + c] * sc[r]
                                              : ((int)((p[(r * cols + c) / 2] >> ((c % 2) * 4)) & 0x0F) - 8) *
                                                    (double)sc[r * (cols / group) + c / group];
                        want += v * x[t * cols + c];
                        mag += fabs(v * x[t * cols + c]);
                    }
                    if (!close(y[t * rows + r], want, mag)) {
                        printf("MISMATCH format %d rows %lld cols %lld group %d: %.9g, not %.9g\n", fmt, (long long)rows,
                               (long long)cols, (int)group, y[t * rows + r], want);
                        return 1;
                    }
                    checked++;
                }
        }
        free(w), free(x), free(y), free(sc), free(q), free(p);
    }
    /* int4 groups taken against x as integers (q4d): x times a power of two gives the
     * outputs times it, exactly, down to x below 2^-105 (its two-factor scaling); an inf
     * in a token makes its outputs NaN and leaves the others; zeros give zeros */
    for (int it = 0; it < 300; it++) {
        static const int32_t DIGIT_GROUPS[] = {32, 64, 128, 256};
        const int32_t group = DIGIT_GROUPS[rand() % 4];
        const int64_t rows = 1 + rand() % 5, s = 1 + rand() % 6, cols = group * (1 + rand() % 3);
        float *w = malloc(sizeof(float) * (size_t)(rows * cols)), *x = malloc(sizeof(float) * (size_t)(s * cols));
        float *y = malloc(sizeof(float) * (size_t)(s * rows)), *y2 = malloc(sizeof(float) * (size_t)(s * rows));
        float *sc = malloc(sizeof(float) * (size_t)(rows * cols / group));
        uint8_t *p = malloc((size_t)(rows * cols / 2));
        if (!w || !x || !y || !y2 || !sc || !p) return fprintf(stderr, "out of memory\n"), 2;
        for (int64_t i = 0; i < rows * cols; i++) w[i] = rnd();
        for (int64_t i = 0; i < s * cols; i++) x[i] = rnd() * 3.0f;
        coli_quantize_q4(w, rows, cols, group, p, sc);
        coli_matmul_q4(p, sc, rows, cols, group, x, s, y);
        /* x's digits made once, the rows in two calls on them: the same bits */
        coli_q4_x *xq = coli_q4_x_make(x, s, cols, group);
        const int64_t cut = rand() % (rows + 1); /* drawn at every level: the same inputs after it */
        if (xq) {
            coli_matmul_q4_rows_x(p, sc, rows, xq, y2, 0, cut);
            coli_matmul_q4_rows_x(p, sc, rows, xq, y2, cut, rows);
            coli_q4_x_free(xq);
            for (int64_t i = 0; i < s * rows; i++)
                if (y2[i] != y[i]) return printf("MISMATCH int4 on digits made once: %.9g, not %.9g\n", y2[i], y[i]), 1;
            shared++;
        }
        for (int64_t i = 0; i < s * cols; i++) x[i] = ldexpf(x[i], -110);
        coli_matmul_q4(p, sc, rows, cols, group, x, s, y2);
        for (int64_t i = 0; i < s * rows; i++)
            if (ldexpf(y2[i], 110) != y[i]) return printf("MISMATCH int4 x 2^-110: %.9g, not %.9g\n", y2[i], y[i]), 1;
        for (int64_t i = 0; i < s * cols; i++) x[i] = i < cols ? 0.0f : ldexpf(x[i], 110);
        x[rand() % cols] = it % 2 ? INFINITY : NAN;
        if (s > 1) x[cols] = 0.0f; /* a zero in token 1 changes nothing but its own sums */
        coli_matmul_q4(p, sc, rows, cols, group, x, s, y2);
        for (int64_t r = 0; r < rows; r++)
            if (!isnan(y2[r])) return printf("MISMATCH int4 with an inf or NaN in x: %.9g\n", y2[r]), 1;
        for (int64_t i = 0; i < s * cols; i++) x[i] = 0.0f;
        coli_matmul_q4(p, sc, rows, cols, group, x, s, y2);
        for (int64_t i = 0; i < s * rows; i++)
            if (y2[i] != 0.0f) return printf("MISMATCH int4 of zeros: %.9g\n", y2[i]), 1;
        mix(y, s * rows);
        free(w), free(x), free(y), free(y2), free(sc), free(p);
    }
    /* attention over a cache that keeps the heads' shared rope key once (coli_attend_heads)
     * against one head at a time over keys joined per head (coli_attend_one), bit for
     * bit: the split anywhere in a key, on an 8 or not (MLA's 64 + 32, odd ones) */
    for (int it = 0; it < 500; it++) {
        const int64_t heads = 1 + rand() % 7, qk = 1 + rand() % (it % 4 ? 40 : 100), vd = 1 + rand() % 33;
        const int64_t nope = it % 3 ? (qk * 2 / 3) / 8 * 8 : rand() % (qk + 1), rope = qk - nope;
        const int64_t last = rand() % 300, n = last + 1;
        float *q = malloc(sizeof(float) * (size_t)(heads * qk)), *k = malloc(sizeof(float) * (size_t)(n * heads * qk));
        float *kn = malloc(sizeof(float) * (size_t)(n * heads * nope + 1));
        float *kr = malloc(sizeof(float) * (size_t)(n * rope + 1));
        float *v = malloc(sizeof(float) * (size_t)(n * heads * vd)), *p = malloc(sizeof(float) * (size_t)(heads * n));
        float *one = malloc(sizeof(float) * (size_t)(heads * vd)), *all = malloc(sizeof(float) * (size_t)(heads * vd));
        uint8_t *sel = malloc((size_t)n);
        if (!q || !k || !kn || !kr || !v || !p || !one || !all || !sel) return fprintf(stderr, "out of memory\n"), 2;
        for (int64_t i = 0; i < heads * qk; i++) q[i] = rnd();
        for (int64_t i = 0; i < n * heads * nope; i++) kn[i] = rnd();
        for (int64_t i = 0; i < n * rope; i++) kr[i] = rnd();
        for (int64_t t = 0; t < n; t++)
            for (int64_t h = 0; h < heads; h++)
                for (int64_t d = 0; d < qk; d++)
                    k[(t * heads + h) * qk + d] = d < nope ? kn[(t * heads + h) * nope + d] : kr[t * rope + d - nope];
        for (int64_t i = 0; i < n * heads * vd; i++) v[i] = rnd();
        for (int64_t t = 0; t < n; t++) sel[t] = t == last || rand() % 3 != 0;
        for (int64_t h = 0; h < heads; h++)
            coli_attend_one(q + h * qk, k + h * qk, v + h * vd, heads * qk, heads * vd, qk, vd, sel, last, 0.125f, p,
                            one + h * vd);
        coli_attend_heads(q, kn, kr, v, heads * nope, rope, heads * vd, heads, nope, qk, vd, sel, last, 0.125f, p, all);
        if (memcmp(one, all, sizeof(float) * (size_t)(heads * vd))) {
            printf("MISMATCH attention heads %lld qk %lld (nope %lld) v %lld keys %lld\n", (long long)heads,
                   (long long)qk, (long long)nope, (long long)vd, (long long)n);
            return 1;
        }
        mix(all, heads * vd);
        free(q), free(k), free(kn), free(kr), free(v), free(p), free(one), free(all), free(sel);
    }
    /* the indexer's scores (its heads' queries against blocks of keys as one matmul)
     * against each key's heads one dot at a time, bit for bit: past a block of keys and
     * past 64 heads, and with zeros, NaNs and infs among the keys */
    for (int it = 0; it < 200; it++) {
        const int64_t heads = 1 + rand() % 70, dim = 1 + rand() % 80, n = 1 + rand() % 300, t0 = rand() % n;
        float *iq = malloc(sizeof(float) * (size_t)(heads * dim)), *keys = malloc(sizeof(float) * (size_t)(n * dim));
        float *iw = malloc(sizeof(float) * (size_t)heads), *got = malloc(sizeof(float) * (size_t)n);
        coli_scored *sc = malloc(sizeof *sc * (size_t)n);
        if (!iq || !keys || !iw || !got || !sc) return fprintf(stderr, "out of memory\n"), 2;
        for (int64_t i = 0; i < heads * dim; i++) iq[i] = rnd();
        for (int64_t i = 0; i < n * dim; i++) keys[i] = rnd();
        for (int64_t h = 0; h < heads; h++) iw[h] = rnd();
        if (it % 4 == 0) { /* a key of zeros, a NaN and an inf: the clamp's edges */
            for (int64_t i = 0; i < dim; i++) keys[(n - 1) * dim + i] = it % 8 ? 0.0f : -0.0f;
            keys[rand() % (n * dim)] = NAN;
            keys[rand() % (n * dim)] = it % 8 ? INFINITY : -INFINITY;
        }
        coli_index_scores(iq, iw, 0.75f, keys, heads, dim, t0, n, sc);
        const float scale = 1.0f / sqrtf((float)dim);
        for (int64_t t = t0; t < n; t++) {
            float want = 0.0f;
            for (int64_t h = 0; h < heads; h++) {
                const float d = coli_dot_f32(iq + h * dim, keys + t * dim, dim) * scale;
                want += (iw[h] * 0.75f) * (d > 0.0f ? d : 0.0f);
            }
            if (sc[t].t != t || memcmp(&sc[t].score, &want, sizeof want)) {
                printf("MISMATCH indexer scores heads %lld dim %lld key %lld: %.9g, not %.9g\n", (long long)heads,
                       (long long)dim, (long long)t, sc[t].score, want);
                return 1;
            }
            got[t] = sc[t].score;
        }
        mix(got + t0, n - t0);
        free(iq), free(keys), free(iw), free(got), free(sc);
    }
    /* the weighted sum (a block of keys' latents weighted per head): 1 to 9 heads, 1 to
     * 70 rows, outputs of odd widths, against double-precision sums */
    for (int it = 0; it < 300; it++) {
        const int64_t heads = 1 + rand() % 9, rows = 1 + rand() % 70, n = 1 + rand() % 45, stride = n + rand() % 5;
        float *w = malloc((size_t)(heads * rows) * sizeof(float)), *v = malloc((size_t)(rows * stride) * sizeof(float));
        float *c = malloc((size_t)(heads * n) * sizeof(float));
        for (int64_t i = 0; i < heads * rows; i++) w[i] = rnd();
        for (int64_t i = 0; i < rows * stride; i++) v[i] = rnd();
        coli_weighted_sum_f32(w, heads, rows, v, stride, n, c);
        for (int64_t h = 0; h < heads; h++)
            for (int64_t d = 0; d < n; d++) {
                double want = 0.0, mag = 0.0;
                for (int64_t i = 0; i < rows; i++) {
                    want += (double)w[h * rows + i] * v[i * stride + d];
                    mag += fabs((double)w[h * rows + i] * v[i * stride + d]);
                }
                if (!close(c[h * n + d], want, mag)) {
                    printf("OFF weighted sum heads %lld rows %lld n %lld: %.9g, want %.9g\n", (long long)heads,
                           (long long)rows, (long long)n, c[h * n + d], want);
                    return 1;
                }
                checked++;
            }
        /* a head alone: the bits it has among the others (a prefill's absorption takes every
         * query as a head, a decode's one query alone) */
        float *one = malloc((size_t)n * sizeof(float));
        for (int64_t h = 0; h < heads; h++) {
            coli_weighted_sum_f32(w + h * rows, 1, rows, v, stride, n, one);
            if (memcmp(one, c + h * n, (size_t)n * sizeof(float))) {
                printf("MISMATCH weighted sum head %lld alone, of %lld\n", (long long)h, (long long)heads);
                return 1;
            }
        }
        free(one);
        mix(c, heads * n);
        free(w), free(v), free(c);
    }
    /* the rows made floats (int8, int4) as the formats define them, and the weighted sum
     * over int8 and int4 rows: the f32 weighted sum's bits over those floats; int4 groups
     * of 2 to 32, some not a multiple of 8 */
    for (int it = 0; it < 300; it++) {
        static const int32_t QG[] = {2, 4, 6, 8, 16, 24, 32};
        const int32_t group = QG[rand() % 7];
        const int64_t rows = 1 + rand() % 70, n = group * (1 + rand() % 6) * (group % 2 ? 2 : 1);
        float *w = malloc((size_t)rows * sizeof(float)), *x = malloc((size_t)(rows * n) * sizeof(float));
        float *deq = malloc((size_t)(rows * n) * sizeof(float)), *want = malloc((size_t)n * sizeof(float));
        float *made = malloc((size_t)(rows * n) * sizeof(float));
        float *got = malloc((size_t)n * sizeof(float)), *sc = malloc((size_t)(rows * n) * sizeof(float));
        int8_t *q8 = malloc((size_t)(rows * n));
        uint8_t *q4 = malloc((size_t)(rows * n / 2));
        for (int64_t i = 0; i < rows; i++) w[i] = rnd();
        for (int64_t i = 0; i < rows * n; i++) x[i] = rnd() * (i % 7 == 0 ? 40.0f : 1.0f);
        coli_quantize_q8(x, rows, n, q8, sc);
        for (int64_t i = 0; i < rows * n; i++) deq[i] = (float)q8[i] * sc[i / n];
        coli_rows_f32_q8(q8, sc, rows, n, made);
        if (memcmp(deq, made, (size_t)(rows * n) * sizeof(float))) {
            printf("MISMATCH int8 rows made floats: rows %lld n %lld\n", (long long)rows, (long long)n);
            return 1;
        }
        coli_weighted_sum_f32(w, 1, rows, deq, n, n, want);
        coli_weighted_rows_q8(w, rows, q8, sc, n, got);
        if (memcmp(want, got, (size_t)n * sizeof(float))) {
            printf("MISMATCH weighted rows int8: rows %lld n %lld\n", (long long)rows, (long long)n);
            return 1;
        }
        mix(got, n);
        coli_quantize_q4(x, rows, n, group, q4, sc);
        for (int64_t i = 0; i < rows * n; i++)
            deq[i] = (float)((int)((q4[i / 2] >> (i % 2 * 4)) & 0x0F) - 8) *
                     sc[(i / n) * (n / group) + (i % n) / group];
        coli_rows_f32_q4(q4, sc, group, rows, n, made);
        if (memcmp(deq, made, (size_t)(rows * n) * sizeof(float))) {
            printf("MISMATCH int4 rows made floats: rows %lld n %lld group %d\n", (long long)rows, (long long)n, group);
            return 1;
        }
        coli_weighted_sum_f32(w, 1, rows, deq, n, n, want);
        coli_weighted_rows_q4(w, rows, q4, sc, group, n, got);
        if (memcmp(want, got, (size_t)n * sizeof(float))) {
            printf("MISMATCH weighted rows int4: rows %lld n %lld group %d\n", (long long)rows, (long long)n, group);
            return 1;
        }
        mix(got, n);
        checked += 2 * (int)n;
        free(w), free(x), free(deq), free(made), free(want), free(got), free(sc), free(q8), free(q4);
    }
    /* exp: within 3 ulp of libm's double exp over [-90, 1], 0 below -87.34, odd lengths */
    for (int it = 0; it < 200; it++) {
        const int64_t n = 1 + rand() % 41;
        float x[41], y[41];
        const float sub = rnd();
        for (int64_t i = 0; i < n; i++) x[i] = y[i] = (float)(rand() % 9 == 0 ? -88.0 - rnd() : 45.5 * (rnd() - 1.0));
        coli_exp_f32(y, n, sub);
        for (int64_t i = 0; i < n; i++) {
            const float t = x[i] - sub;
            const double want = t < -87.3365447505531 ? 0.0 : exp((double)t);
            if (fabs(y[i] - want) > 3.0 * 1.1920929e-7 * want) {
                printf("OFF exp(%.9g) = %.9g, want %.9g\n", t, y[i], want);
                return 1;
            }
            checked++;
        }
        mix(y, n);
    }
    /* the quantisers round as lroundf does (halves away from zero), then clamp: rows whose
     * largest value makes the scale exactly 1, holding halves, values just below them,
     * and a random rest */
    for (int it = 0; it < 200; it++) {
        static const float EDGES[] = {0.5f, -0.5f, 1.5f, -1.5f, 2.5f, -2.5f, 0.49999997f, -0.49999997f, 6.5f,
                                      -6.5f, -7.5f, 3.4999998f, 126.5f, -126.5f, 125.50001f, 0.0f, -0.0f};
        const int64_t cols = 64;
        float w[64], sc[2];
        int8_t q[64];
        uint8_t packed[32];
        for (int fmt = 0; fmt < 2; fmt++) {
            const float top = fmt == 0 ? 127.0f : 7.0f;
            for (int64_t c = 0; c < cols; c++) {
                const float e = EDGES[(size_t)(c + it) % (sizeof EDGES / sizeof EDGES[0])];
                w[c] = c % 3 == 0 ? rnd() * top : fmaxf(-top, fminf(top, e));
            }
            w[it % 32] = it % 2 ? top : -top; /* each group's largest: the scale is 1 */
            w[32 + it % 32] = top;
            if (fmt == 0) coli_quantize_q8(w, 1, cols, q, sc);
            else coli_quantize_q4(w, 1, cols, 32, packed, sc);
            for (int64_t c = 0; c < cols; c++) {
                long want = lroundf(w[c]);
                want = want < (fmt == 0 ? -127 : -8) ? (fmt == 0 ? -127 : -8) : want > (long)top ? (long)top : want;
                const long got = fmt == 0 ? q[c] : (long)((packed[c / 2] >> (c % 2 * 4)) & 0x0F) - 8;
                if (got != want) {
                    printf("MISMATCH quantising %.9g (format %d): %ld, not %ld\n", w[c], fmt, got, want);
                    return 1;
                }
            }
        }
    }
    printf("%s loops, %d outputs within the double-precision sums, hash %016llx; %d int4 matmuls on digits made once\n",
           coli_cpu_loops(), checked, (unsigned long long)hash, shared);
    return 0;
}
