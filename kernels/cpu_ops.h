/* CPU matmul and quantisation: the one definition of every weight format.
 * The engine's CPU path and the reference backend both use these, and the GPU
 * kernels implement the same arithmetic, so every path dequantises alike. */
#ifndef COLI_CPU_OPS_H
#define COLI_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* int8: q in [-127, 127], w = q * scale[row], scale = max|w| / 127. */
void coli_quantize_q8(const float *w, int64_t rows, int64_t cols, int8_t *q, float *scale);

/* int4: groups of `group` values along a row, two per byte, low nibble first;
 * w = (nibble - 8) * scale[row * (cols / group) + g], scale = max|w| / 7. */
void coli_quantize_q4(const float *w, int64_t rows, int64_t cols, int32_t group, uint8_t *packed,
                      float *scale);

/* y[s, rows] = x[s, cols] . W^T for each format, over output rows [r0, r1).
 * A row's result does not depend on how rows are split between threads, nor on
 * how many tokens a call takes. int4 groups of 32 to 256 values take each token's x
 * as integers below 2^22 and a power of two, and sum a group's products exactly
 * (cpu_ops.c, "int4 rows against x as integers"); other groups, and f32 and int8,
 * sum float products in a fixed order. */
void coli_matmul_f32_rows(const float *w, int64_t rows, int64_t cols, const float *x, int64_t s, float *y,
                          int64_t r0, int64_t r1);
void coli_matmul_q8_rows(const int8_t *q, const float *scale, int64_t rows, int64_t cols, const float *x,
                         int64_t s, float *y, int64_t r0, int64_t r1);
void coli_matmul_q4_rows(const uint8_t *packed, const float *scale, int64_t rows, int64_t cols, int32_t group,
                         const float *x, int64_t s, float *y, int64_t r0, int64_t r1);

/* x of s tokens made ready for int4 rows once (the digits of the exact sums), for
 * every call on it to share however the rows are split: NULL where the group or the
 * CPU has no such loops, or there is no memory, and then coli_matmul_q4_rows takes x
 * itself. coli_matmul_q4_rows_x gives coli_matmul_q4_rows's bits. */
typedef struct coli_q4_x coli_q4_x;
coli_q4_x *coli_q4_x_make(const float *x, int64_t s, int64_t cols, int32_t group);
void coli_q4_x_free(coli_q4_x *x);
void coli_matmul_q4_rows_x(const uint8_t *packed, const float *scale, int64_t rows, const coli_q4_x *x, float *y,
                           int64_t r0, int64_t r1);

/* The same over every row. */
void coli_matmul_f32(const float *w, int64_t rows, int64_t cols, const float *x, int64_t s, float *y);
void coli_matmul_q8(const int8_t *q, const float *scale, int64_t rows, int64_t cols, const float *x,
                    int64_t s, float *y);
void coli_matmul_q4(const uint8_t *packed, const float *scale, int64_t rows, int64_t cols, int32_t group,
                    const float *x, int64_t s, float *y);

/* a . b with eight partial sums (a fixed order, vectorisable). */
float coli_dot_f32(const float *a, const float *b, int64_t n);
/* out[i] = coli_dot_f32(a + i a_stride, B_i, n) * scale, i < count, where B_i is the nb
 * values at b + i b_stride then the n - nb at c (a key's own part, then a part its
 * heads share): the same bits as the dot of a copy joined in memory. */
void coli_dot_f32_many(const float *a, int64_t a_stride, const float *b, int64_t b_stride, int64_t nb,
                       const float *c, int64_t count, int64_t n, float scale, float *out);
/* o[d] += w * v[d], d < n: a product, then a sum, each value. */
void coli_axpy_f32(float *o, float w, const float *v, int64_t n);
/* c[h * n + d] = sum over i < rows, in order, of w[h * rows + i] * v[i * stride + d], a
 * product then a sum each, from zero (coli_axpy_f32 row after row into zeros). */
void coli_weighted_sum_f32(const float *w, int64_t heads, int64_t rows, const float *v, int64_t stride, int64_t n,
                           float *c);
/* coli_weighted_sum_f32 of one output row over quantised rows: c[d] = sum over i < rows,
 * in order, of w[i] * W[i, d], W[i, d] the weight as its format defines it (int8 q times
 * its row's scale; int4 (nibble - 8) times its group's scale, n even), a product then a
 * sum, from zero: the bits of coli_weighted_sum_f32 over the rows made floats. */
void coli_weighted_rows_q8(const float *w, int64_t rows, const int8_t *q, const float *scale, int64_t n, float *c);
void coli_weighted_rows_q4(const float *w, int64_t rows, const uint8_t *packed, const float *scale, int32_t group,
                           int64_t n, float *c);
/* The rows made floats, W[i, d] as above (rows x n, n even for int4): where many weight
 * vectors go through the same rows, coli_weighted_sum_f32 over these gives each the
 * bits of the weighted rows. */
void coli_rows_f32_q8(const int8_t *q, const float *scale, int64_t rows, int64_t n, float *out);
void coli_rows_f32_q4(const uint8_t *packed, const float *scale, int32_t group, int64_t rows, int64_t n, float *out);
/* x[i] *= scale, and the largest of them (NaNs skipped; -inf for none). */
float coli_scale_max_f32(float *x, int64_t n, float scale);
/* x[i] = exp(x[i] - sub): Cephes' expf (a degree-7 polynomial after taking out k ln 2,
 * within 2 ulp of exp), 0 below -87.34; its own definition, not libm's expf. */
void coli_exp_f32(float *x, int64_t n, float sub);
/* total[i] += w * relu(d[i] * scale), i < n (relu: v > 0 ? v : 0, a NaN giving 0): a
 * product, the clamp, a product, then a sum, each value. */
void coli_add_relu_f32(float *total, const float *d, int64_t n, float scale, float w);

/* The loops chosen at run time: "avx512vnni+gfni" (int4's nibbles unpacked by GFNI's
 * affine map), "avx512vnni" (AVX2, and int4's byte products by VNNI), "avx2", or
 * "portable" (no AVX2, or COLI_CPU_PORTABLE=1); COLI_CPU_LOOPS=avx512vnni or avx2
 * stops at that level. Every level gives the same bits. */
const char *coli_cpu_loops(void);

#ifdef __cplusplus
}
#endif

#endif
