/* The MLA latent cache on the CPU path (--kv latent): a position keeps its normalised
 * latent and its rope key (kv_lora + qk_rope floats a layer) instead of every head's
 * key and value (heads x (qk_nope + v_head)), and attention runs in the absorbed form:
 * a head's query goes through its kv_b key rows once a token, scores and context stay
 * in the latent space, and the context goes through its kv_b value rows once. A long
 * context's decode reads the cache's selected rows, 7.2 times fewer bytes on the large
 * synthetic model, for about three times the multiply-adds a key. */
#include "model_latent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_model_ops.h"
#include "cpu_ops.h"

int model_use_latent(model *m, char *err, size_t errlen) {
    const model_config *c = &m->c;
    const int64_t W = c->kv_lora + c->qk_rope;
    for (int64_t i = 0; i < c->layers; i++) {
        layer *ly = &m->layers[i];
        if (ly->kv_b.dev) { /* resident in a backend, its host copy is gone */
            snprintf(err, errlen, "the latent cache needs kv_b on the CPU (layer %lld)", (long long)i);
            return 1;
        }
        free(ly->k_cache), free(ly->kr_cache), free(ly->v_cache);
        ly->k_cache = ly->kr_cache = ly->v_cache = NULL;
        ly->lat_cache = malloc((size_t)(m->max_pos * W) * sizeof(float));
        if (!ly->lat_cache) {
            snprintf(err, errlen, "out of memory for a latent cache of %lld positions", (long long)m->max_pos);
            return 1;
        }
    }
    m->latent = 1;
    return 0;
}

void model_latent_write(const model *m, layer *ly, const float *kvn, const float *ckv, int64_t n, int64_t t0) {
    const model_config *c = &m->c;
    const int64_t R = c->kv_lora, W = R + c->qk_rope;
    for (int64_t s = 0; s < n; s++) {
        float *row = ly->lat_cache + (t0 + s) * W;
        memcpy(row, kvn + s * R, (size_t)R * sizeof(float));
        memcpy(row + R, ckv + s * W + R, (size_t)c->qk_rope * sizeof(float));
    }
}

/* Heads [b, e)'s absorbed queries: q_nope through the head's kv_b key rows (each
 * row's weight times its row, rows in order, in kv_b's own format), then its rope
 * query. */
static void absorb(const model *m, const layer *ly, const float *q, float *qa, int64_t b, int64_t e) {
    const model_config *c = &m->c;
    const linear *l = &ly->kv_b;
    const int64_t R = c->kv_lora, W = R + c->qk_rope, NO = c->qk_nope, qk = NO + c->qk_rope;
    for (int64_t h = b; h < e; h++) {
        float *a = qa + h * W;
        const int64_t r0 = h * (NO + c->v_head);
        if (l->format == COLI_FMT_F32) coli_weighted_sum_f32(q + h * qk, 1, NO, l->w + r0 * R, R, R, a);
        else if (l->format == COLI_FMT_Q8) coli_weighted_rows_q8(q + h * qk, NO, l->q8 + r0 * R, l->scale + r0, R, a);
        else coli_weighted_rows_q4(q + h * qk, NO, l->q4 + r0 * R / 2, l->scale + r0 * (R / l->group), l->group, R, a);
        memcpy(a + R, q + h * qk + NO, (size_t)c->qk_rope * sizeof(float));
    }
}

/* A prefill's heads [b, e): every query's absorbed query, the head's kv_b key rows made
 * floats once for all of them (coli_weighted_sum_f32 over those rows gives each query
 * absorb's bits, four queries a pass over the rows) instead of unpacked again for each. */
typedef struct absorb_job {
    const model *m;
    const layer *ly;
    const float *q; /* [n, heads, qk] */
    int64_t n;
    float *qa;      /* [n, heads, kv_lora + qk_rope] */
    int failed;
} absorb_job;

static void absorb_heads(void *ctx, int64_t b, int64_t e) {
    absorb_job *j = ctx;
    const model_config *c = &j->m->c;
    const linear *l = &j->ly->kv_b;
    const int64_t H = c->heads, R = c->kv_lora, W = R + c->qk_rope, NO = c->qk_nope, qk = NO + c->qk_rope, n = j->n;
    float *rows = l->format == COLI_FMT_F32 ? NULL : malloc((size_t)(NO * R) * sizeof(float));
    float *w = malloc((size_t)(n * NO) * sizeof(float)), *out = malloc((size_t)(n * R) * sizeof(float));
    if (!w || !out || (l->format != COLI_FMT_F32 && !rows)) {
        j->failed = 1;
    } else {
        for (int64_t h = b; h < e; h++) {
            const int64_t r0 = h * (NO + c->v_head);
            const float *keys = rows;
            if (l->format == COLI_FMT_F32) keys = l->w + r0 * R;
            else if (l->format == COLI_FMT_Q8) coli_rows_f32_q8(l->q8 + r0 * R, l->scale + r0, NO, R, rows);
            else coli_rows_f32_q4(l->q4 + r0 * R / 2, l->scale + r0 * (R / l->group), l->group, NO, R, rows);
            for (int64_t s = 0; s < n; s++) memcpy(w + s * NO, j->q + (s * H + h) * qk, (size_t)NO * sizeof(float));
            coli_weighted_sum_f32(w, n, NO, keys, R, R, out);
            for (int64_t s = 0; s < n; s++) {
                float *a = j->qa + (s * H + h) * W;
                memcpy(a, out + s * R, (size_t)R * sizeof(float));
                memcpy(a + R, j->q + (s * H + h) * qk + NO, (size_t)c->qk_rope * sizeof(float));
            }
        }
    }
    free(rows), free(w), free(out);
}

/* The keys query s sees, ascending. */
static int64_t keys_of(const unsigned char *sel, int64_t valid, int64_t *keys) {
    int64_t count = 0;
    for (int64_t t = 0; t < valid; t++)
        if (sel[t]) keys[count++] = t;
    return count;
}

typedef struct latent_job {
    const model *m;
    const layer *ly;
    const float *q;           /* [n, heads, qk] */
    const unsigned char *sel; /* [n, total] */
    int64_t n, t0, total;
    float scaling;
    float *ctx;               /* [heads, n, kv_lora] */
    float *qa; /* every query's absorbed query, [n, heads, kv_lora + qk_rope] */
    /* a decode's one query: its keys and blocks' parts */
    const int64_t *keys;
    int64_t count, groups; /* the heads' groups a block is split in (latent_blocks) */
    float *parts;
    int failed;
} latent_job;

static float *scratch_of(const model_config *c) {
    return malloc((size_t)coli_latent_block_scratch(c->heads, c->kv_lora + c->qk_rope) * sizeof(float));
}

/* A decode: items [b, e) of its one query's keys, item k the heads of group k % groups
 * over block k / groups. A head's scores, softmax and weighted latents are its own, so
 * splitting the heads changes no bits; it evens the threads' work where the keys make
 * fewer blocks than twice the threads (a short context's one, or three on two). */
static void latent_blocks(void *ctx, int64_t b, int64_t e) {
    latent_job *j = ctx;
    const model_config *c = &j->m->c;
    const int64_t H = c->heads, R = c->kv_lora, W = R + c->qk_rope, G = j->groups;
    const int64_t blocks = (j->count + COLI_LATENT_BLOCK - 1) / COLI_LATENT_BLOCK;
    float *scratch = scratch_of(c);
    if (!scratch) {
        j->failed = 1;
        return;
    }
    float *m = j->parts, *l = m + blocks * H, *cc = l + blocks * H;
    for (int64_t k = b; k < e; k++) {
        const int64_t blk = k / G, h0 = H * (k % G) / G, h1 = H * (k % G + 1) / G, at = blk * H + h0;
        const int64_t k0 = blk * COLI_LATENT_BLOCK, rest = j->count - k0;
        const int64_t nb = rest < COLI_LATENT_BLOCK ? rest : COLI_LATENT_BLOCK;
        /* the next block this call runs, whose rows its copy asks for */
        const int64_t next_nb = k + 1 < e && (k + 1) / G != blk
                                    ? (rest - nb < COLI_LATENT_BLOCK ? rest - nb : COLI_LATENT_BLOCK) : 0;
        coli_latent_block(j->qa + h0 * W, h1 - h0, j->ly->lat_cache, W, R, j->keys + k0, nb, j->keys + k0 + nb,
                          next_nb, j->scaling, scratch, m + at, l + at, cc + at * R);
    }
    free(scratch);
}

/* A decode's heads [b, e): their absorbed queries (every head's kv_b key rows, read
 * once a token whatever the context). */
static void latent_absorb(void *ctx, int64_t b, int64_t e) {
    latent_job *j = ctx;
    absorb(j->m, j->ly, j->q, j->qa, b, e);
}

/* A decode's heads [b, e): their blocks' parts combined. */
static void latent_combine(void *ctx, int64_t b, int64_t e) {
    latent_job *j = ctx;
    const model_config *c = &j->m->c;
    const int64_t H = c->heads, used = (j->count + COLI_LATENT_BLOCK - 1) / COLI_LATENT_BLOCK;
    coli_latent_combine(used, H, b, e, c->kv_lora, j->parts, j->parts + used * H, j->parts + 2 * used * H, j->ctx);
}

/* A prefill: queries in slots [b, e), each its blocks in turn. */
static void latent_queries(void *ctx, int64_t b, int64_t e) {
    latent_job *j = ctx;
    const model_config *c = &j->m->c;
    const int64_t H = c->heads, R = c->kv_lora, W = R + c->qk_rope;
    const int64_t most_blocks = (j->total + COLI_LATENT_BLOCK - 1) / COLI_LATENT_BLOCK;
    float *scratch = scratch_of(c);
    float *parts = malloc((size_t)(most_blocks * H * (R + 2)) * sizeof(float));
    float *out = malloc((size_t)(H * R) * sizeof(float));
    int64_t *keys = malloc((size_t)j->total * sizeof *keys);
    if (!scratch || !parts || !out || !keys) {
        j->failed = 1;
    } else {
        for (int64_t slot = b; slot < e; slot++) {
            const int64_t s = pool_balanced(slot, j->n);
            const int64_t count = keys_of(j->sel + s * j->total, j->t0 + s + 1, keys);
            coli_attend_latent(j->qa + s * H * W, H, j->ly->lat_cache, W, R, keys, count, j->scaling, scratch, parts,
                               out);
            for (int64_t h = 0; h < H; h++)
                memcpy(j->ctx + (h * j->n + s) * R, out + h * R, (size_t)R * sizeof(float));
        }
    }
    free(scratch), free(parts), free(out), free(keys);
}

/* A head's context through its kv_b value rows, every query of the head at once. */
typedef struct value_job {
    const model *m;
    const layer *ly;
    const float *ctx; /* [heads, n, kv_lora] */
    int64_t n;
    float *y;         /* [heads, n, v_head] */
} value_job;

static void value_heads(void *ctx, int64_t b, int64_t e) {
    const value_job *j = ctx;
    const model_config *c = &j->m->c;
    const linear *l = &j->ly->kv_b;
    const int64_t R = c->kv_lora, V = c->v_head, cols = l->cols;
    for (int64_t h = b; h < e; h++) {
        const int64_t r0 = h * (c->qk_nope + V) + c->qk_nope;
        const float *x = j->ctx + h * j->n * R;
        float *y = j->y + h * j->n * V;
        if (l->format == COLI_FMT_F32) coli_matmul_f32(l->w + r0 * cols, V, cols, x, j->n, y);
        else if (l->format == COLI_FMT_Q8) coli_matmul_q8(l->q8 + r0 * cols, l->scale + r0, V, cols, x, j->n, y);
        else coli_matmul_q4(l->q4 + r0 * cols / 2, l->scale + r0 * (cols / l->group), V, cols, l->group, x, j->n, y);
    }
}

int model_latent_attention(model *m, const layer *ly, const float *q, const unsigned char *sel, int64_t n,
                           int64_t t0, int64_t total, float scaling, float *qa, float *att, char *err, size_t errlen) {
    const model_config *c = &m->c;
    const int64_t H = c->heads, R = c->kv_lora, V = c->v_head;
    float *ctx = malloc((size_t)(H * n * R) * sizeof(float)), *y = malloc((size_t)(H * n * V) * sizeof(float));
    float *parts = NULL;
    int64_t *keys = NULL;
    latent_job j = {m, ly, q, sel, n, t0, total, scaling, ctx, NULL, NULL, 0, 1, NULL, 0};
    int rc = 1;
    if (!ctx || !y) goto done;
    if (n == 1) { /* one query: its key blocks (a short context's heads too) split between the threads */
        const int64_t blocks = (total + COLI_LATENT_BLOCK - 1) / COLI_LATENT_BLOCK;
        parts = malloc((size_t)(blocks * H * (R + 2)) * sizeof(float));
        keys = malloc((size_t)total * sizeof *keys);
        if (!parts || !keys) goto done;
        j.qa = qa, j.keys = keys, j.parts = parts, j.count = keys_of(sel, t0 + 1, keys);
        const int64_t used = (j.count + COLI_LATENT_BLOCK - 1) / COLI_LATENT_BLOCK, threads = pool_threads(m->pool);
        if (used < 2 * threads) j.groups = threads < H ? threads : H;
        pool_run(m->pool, latent_absorb, &j, H);
        pool_run(m->pool, latent_blocks, &j, used * j.groups);
        if (!j.failed && used > 1) pool_run(m->pool, latent_combine, &j, H);
        else if (!j.failed) latent_combine(&j, 0, H);
    } else {
        absorb_job aj = {m, ly, q, n, qa, 0};
        pool_run(m->pool, absorb_heads, &aj, H);
        if (aj.failed) goto done;
        j.qa = qa;
        pool_run(m->pool, latent_queries, &j, n);
    }
    if (j.failed) goto done;
    value_job vj = {m, ly, ctx, n, y};
    if (n * H * V * R < (1 << 16)) value_heads(&vj, 0, H);
    else pool_run(m->pool, value_heads, &vj, H);
    for (int64_t s = 0; s < n; s++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t v = 0; v < V; v++) {
                const float *bias = ly->kv_b.bias; /* a value bias: the weights sum to 1 */
                att[(s * H + h) * V + v] =
                    y[(h * n + s) * V + v] + (bias ? bias[h * (c->qk_nope + V) + c->qk_nope + v] : 0.0f);
            }
    rc = 0;
done:
    if (rc) snprintf(err, errlen, "out of memory in attention");
    free(ctx), free(y), free(parts), free(keys);
    return rc;
}
