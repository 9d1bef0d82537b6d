/* The model's ops besides the matmuls, one definition each: the engine's CPU
 * path runs them (with its threads around them) and the reference backend runs
 * them as ABI 2's step ops, so a step through the reference backend gives the
 * CPU path's logits to the bit. The GPU backend implements the same arithmetic. */
#ifndef COLI_CPU_MODEL_OPS_H
#define COLI_CPU_MODEL_OPS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[i] = w[i] * (x[i] / sqrt(mean(x^2) + eps)). */
void coli_rmsnorm(const float *x, const float *w, int64_t n, float eps, float *out);

/* x = (x - mean) / sqrt(var + eps) * w + b, in place. */
void coli_layernorm(float *x, const float *w, const float *b, int64_t n, float eps);

/* transformers' apply_rotary_pos_emb_interleave on dim values (dim even, at most
 * 512): pairs (x0, x1), (x2, x3) ... rotated by pos * inv_freq[i] and written
 * de-interleaved: [x_even * cos - x_odd * sin, x_odd * cos + x_even * sin]. */
void coli_rope(float *x, int64_t dim, const float *inv_freq, int64_t pos);

float coli_silu(float x);

/* transformers' GlmMoeDsaTopkRouter for one token: sigmoid scores, a bias for the
 * choice only, top topk_group groups by the sum of their two best, top k experts
 * (ties: the lower expert); weights normalised when `norm`, then times scaling.
 * experts at most 1024. */
void coli_route(const float *logits, const float *bias, int64_t experts, int64_t groups, int64_t topk_group,
                int64_t k, int norm, float scaling, int32_t *idx, float *w);

/* One query and head over keys t <= last with sel[t]: softmax of q . k_t * scaling,
 * out = the weighted sum of v_t. Key t's k is at k + t * k_stride, its v at
 * v + t * v_stride. p: scratch of last + 1 floats. */
void coli_attend_one(const float *q, const float *k, const float *v, int64_t k_stride, int64_t v_stride,
                     int64_t qk, int64_t vdim, const uint8_t *sel, int64_t last, float scaling, float *p, float *out);

/* coli_attend_one for `heads` consecutive heads of one query at once, over a cache
 * that keeps the part of a key its heads share once: key t of head h is the nope
 * floats at k + t * k_stride + h * nope, then the qk - nope at kr + t * kr_stride (MLA's
 * rope key, one for every head); its value at v + t * v_stride + h * vdim; q and out
 * at head 0, head h's at + h * qk and + h * vdim. The walk reads each key's heads in
 * one stretch instead of `heads` strided passes. Each head's sums are
 * coli_attend_one's over the joined key, in its order: the same bits. p: scratch of
 * heads * (last + 1). */
void coli_attend_heads(const float *q, const float *k, const float *kr, const float *v, int64_t k_stride,
                       int64_t kr_stride, int64_t v_stride, int64_t heads, int64_t nope, int64_t qk, int64_t vdim,
                       const uint8_t *sel, int64_t last, float scaling, float *p, float *out);

/* MLA attention over the latent cache (DeepSeek's absorbed form). A position's row
 * is `width` floats: the rank floats of its normalised latent, then its rope key. A
 * head's absorbed query qa (width floats: q_nope through the head's kv_b key rows,
 * then its rope query) scores a key as coli_dot_f32(qa, row) * scaling, which is
 * q . k of the expanded form up to rounding; its context is the softmax-weighted sum
 * of the keys' latents (rank floats), which the caller takes through the head's
 * kv_b value rows. The keys (`count` positions, ascending) go in blocks of
 * COLI_LATENT_BLOCK: each block's scores, their maximum m, their exps' sum l and
 * its weighted latents c (coli_latent_block; exp is coli_exp_f32, the weighted sum
 * coli_weighted_sum_f32); then the blocks in order
 * (coli_latent_combine). The block split is fixed by the keys alone, so the result
 * does not depend on how blocks are spread over threads. */
#define COLI_LATENT_BLOCK 64

/* Floats of scratch coli_latent_block needs. */
int64_t coli_latent_block_scratch(int64_t heads, int64_t width);

/* One block: keys[0..nb) (nb <= COLI_LATENT_BLOCK) of a cache whose row t is at
 * lat + t * width; qa: heads rows of width floats. Writes m[h], l[h] and
 * c[h * rank + d]. Where the block's keys are apart, the rows of next[0..next_nb),
 * the block the caller runs next, are asked for meanwhile (next_nb may be 0). */
void coli_latent_block(const float *qa, int64_t heads, const float *lat, int64_t width, int64_t rank,
                       const int64_t *keys, int64_t nb, const int64_t *next, int64_t next_nb, float scaling,
                       float *scratch, float *m, float *l, float *c);

/* The blocks' parts (block b's at m + b heads, l + b heads, c + b heads rank) in
 * order, for heads [h0, h1): ctx[h * rank + d] = sum_b e_b c_b[h, d] / sum_b e_b l_b[h], e_b = exp(m_b - max m)
 * (the weighted parts by coli_weighted_sum_f32, 64 blocks at a time). */
void coli_latent_combine(int64_t blocks, int64_t heads, int64_t h0, int64_t h1, int64_t rank, const float *m,
                         const float *l, const float *c, float *ctx);

/* Every block of one query in turn, then the combine: the same bits as blocks run on
 * threads. parts: blocks * heads * (rank + 2) floats. */
void coli_attend_latent(const float *qa, int64_t heads, const float *lat, int64_t width, int64_t rank,
                        const int64_t *keys, int64_t count, float scaling, float *scratch, float *parts, float *ctx);

/* The DSA indexer. A key's score for one query: sum over heads h of
 * (iw[h] * weight_scale) * relu(iq[h] . key / sqrt(dim)). */
typedef struct coli_scored {
    float score;
    int64_t t;
} coli_scored;

/* Scores of keys [t0, t1) (key t at keys + t * dim) into sc[t]; the same
 * arithmetic however the keys are split. */
void coli_index_scores(const float *iq, const float *iw, float weight_scale, const float *keys, int64_t heads,
                       int64_t dim, int64_t t0, int64_t t1, coli_scored *sc);

/* The order of the selection: higher score first, ties to the earlier key (total). */
int coli_scored_before(const coli_scored *x, const coli_scored *y);

/* Moves the first k of a[0..n) in coli_scored_before's order into a[0..k), in no
 * particular order: the set a full sort's first k would be, linear on average. */
void coli_select_first(coli_scored *a, int64_t n, int64_t k);

/* One query's selection: sel[0..valid) = 1 when valid <= topk, else 1 for the
 * topk best of sc[0..valid) in coli_scored_before's order (a NaN above +inf, as
 * the GPU's selection takes it) and 0 for the rest; sc is overwritten. */
void coli_index_select(coli_scored *sc, int64_t valid, int64_t topk, uint8_t *sel);

/* The first index of the largest value (NaN never wins; 0 when none beats -FLT_MAX). */
int32_t coli_argmax(const float *row, int64_t n);

#ifdef __cplusplus
}
#endif

#endif
