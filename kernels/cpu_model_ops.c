#include "cpu_model_ops.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "cpu_ops.h"

void coli_rmsnorm(const float *x, const float *w, int64_t n, float eps, float *out) {
    float ss = coli_dot_f32(x, x, n) / (float)n;
    float r = 1.0f / sqrtf(ss + eps);
    for (int64_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

void coli_layernorm(float *x, const float *w, const float *b, int64_t n, float eps) {
    float mean = 0.0f, var = 0.0f;
    for (int64_t i = 0; i < n; i++) mean += x[i];
    mean /= (float)n;
    for (int64_t i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= (float)n;
    float r = 1.0f / sqrtf(var + eps);
    for (int64_t i = 0; i < n; i++) x[i] = (x[i] - mean) * r * w[i] + b[i];
}

void coli_rope(float *x, int64_t dim, const float *inv_freq, int64_t pos) {
    float tmp[512];
    int64_t half = dim / 2;
    for (int64_t i = 0; i < half; i++) {
        float f = (float)pos * inv_freq[i], c = cosf(f), s = sinf(f);
        float a = x[2 * i], b = x[2 * i + 1];
        tmp[i] = a * c - b * s;
        tmp[half + i] = b * c + a * s;
    }
    memcpy(x, tmp, (size_t)dim * sizeof(float));
}

float coli_silu(float x) { return x / (1.0f + expf(-x)); }

void coli_route(const float *logits, const float *bias, int64_t experts, int64_t groups, int64_t topk_group,
                int64_t k, int norm, float scaling, int32_t *idx, float *w) {
    const int64_t E = experts, G = groups, per = E / G;
    float score[1024], choice[1024], gscore[1024];
    unsigned char group_on[1024], taken[1024];
    for (int64_t e = 0; e < E; e++) {
        score[e] = 1.0f / (1.0f + expf(-logits[e]));
        choice[e] = score[e] + bias[e];
        taken[e] = 0;
    }
    for (int64_t g = 0; g < G; g++) {
        float a = -INFINITY, b2 = -INFINITY;
        for (int64_t e = g * per; e < (g + 1) * per; e++) {
            if (choice[e] > a) {
                b2 = a;
                a = choice[e];
            } else if (choice[e] > b2) {
                b2 = choice[e];
            }
        }
        gscore[g] = a + b2;
        group_on[g] = 0;
    }
    for (int64_t j = 0; j < topk_group; j++) {
        int64_t best = -1;
        for (int64_t g = 0; g < G; g++)
            if (!group_on[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
        if (best < 0) break;
        group_on[best] = 1;
    }
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++)
            if (group_on[e / per] && !taken[e] && (best < 0 || choice[e] > choice[best])) best = e;
        if (best < 0) best = 0; /* unreachable: the config check keeps k <= experts in the chosen groups */
        taken[best] = 1;
        idx[j] = (int32_t)best;
        w[j] = score[best];
    }
    if (norm) {
        float sum = 0.0f;
        for (int64_t j = 0; j < k; j++) sum += w[j];
        sum += 1e-20f;
        for (int64_t j = 0; j < k; j++) w[j] /= sum;
    }
    for (int64_t j = 0; j < k; j++) w[j] *= scaling;
}

void coli_attend_one(const float *q, const float *k, const float *v, int64_t k_stride, int64_t v_stride,
                     int64_t qk, int64_t vdim, const uint8_t *sel, int64_t last, float scaling, float *p, float *out) {
    float mx = -INFINITY;
    for (int64_t t = 0; t <= last; t++) {
        if (!sel[t]) continue;
        p[t] = coli_dot_f32(q, k + t * k_stride, qk) * scaling;
        if (p[t] > mx) mx = p[t];
    }
    float sum = 0.0f;
    for (int64_t t = 0; t <= last; t++)
        if (sel[t]) {
            p[t] = expf(p[t] - mx);
            sum += p[t];
        }
    memset(out, 0, (size_t)vdim * sizeof(float));
    for (int64_t t = 0; t <= last; t++) {
        if (!sel[t]) continue;
        float wt = p[t] / sum;
        const float *vt = v + t * v_stride;
        for (int64_t d = 0; d < vdim; d++) out[d] += wt * vt[d];
    }
}

/* Selected keys whose rows coli_attend_heads asks the cache for ahead of the one it is
 * at, into L2 (a row is tens of lines: asked into L1 they outrun its misses in flight):
 * a long context's selected keys are scattered over the cache, a few KiB each, and the
 * hardware's prefetch starts again at each. More keys ahead gained nothing. */
#define ATTEND_AHEAD 4

/* A walk over the selected keys that keeps the rows (`floats` each, `stride` apart) of
 * the next ATTEND_AHEAD of them requested: next() before each key. */
typedef struct key_prefetch {
    const uint8_t *sel;
    const float *base;
    int64_t stride, floats, n, at, issued;
} key_prefetch;

static void key_prefetch_next(key_prefetch *kp) {
    for (; kp->at < kp->n && kp->issued < ATTEND_AHEAD; kp->at++) {
        if (!kp->sel[kp->at]) continue;
        const char *row = (const char *)(kp->base + kp->at * kp->stride);
        for (int64_t b = 0; b < kp->floats * (int64_t)sizeof(float); b += 64) __builtin_prefetch(row + b, 0, 2);
        kp->issued++;
    }
    kp->issued--; /* the key about to be read was one of them */
}

void coli_attend_heads(const float *q, const float *k, const float *kr, const float *v, int64_t k_stride,
                       int64_t kr_stride, int64_t v_stride, int64_t heads, int64_t nope, int64_t qk, int64_t vdim,
                       const uint8_t *sel, int64_t last, float scaling, float *p, float *out) {
    const int64_t n = last + 1;
    for (int64_t h = 0; h < heads; h++) memset(out + h * vdim, 0, (size_t)vdim * sizeof(float));
    float d[64]; /* a key's heads' scores, up to 64 side by side */
    key_prefetch kp = {sel, k, k_stride, heads * nope, n, 0, 0}, rp = {sel, kr, kr_stride, qk - nope, n, 0, 0};
    for (int64_t t = 0; t < n; t++) {
        if (!sel[t]) continue;
        key_prefetch_next(&kp);
        key_prefetch_next(&rp);
        for (int64_t h0 = 0; h0 < heads; h0 += 64) {
            const int64_t count = heads - h0 < 64 ? heads - h0 : 64;
            coli_dot_f32_many(q + h0 * qk, qk, k + t * k_stride + h0 * nope, nope, nope, kr + t * kr_stride, count, qk,
                              scaling, d);
            for (int64_t h = 0; h < count; h++) p[(h0 + h) * n + t] = d[h];
        }
    }
    for (int64_t h = 0; h < heads; h++) {
        float *ph = p + h * n, mx = -INFINITY, sum = 0.0f;
        for (int64_t t = 0; t < n; t++)
            if (sel[t] && ph[t] > mx) mx = ph[t];
        for (int64_t t = 0; t < n; t++)
            if (sel[t]) {
                ph[t] = expf(ph[t] - mx);
                sum += ph[t];
            }
        for (int64_t t = 0; t < n; t++) /* each weight as coli_attend_one forms it */
            if (sel[t]) ph[t] = ph[t] / sum;
    }
    key_prefetch vp = {sel, v, v_stride, heads * vdim, n, 0, 0};
    for (int64_t t = 0; t < n; t++) {
        if (!sel[t]) continue;
        key_prefetch_next(&vp);
        for (int64_t h = 0; h < heads; h++) coli_axpy_f32(out + h * vdim, p[h * n + t], v + t * v_stride + h * vdim, vdim);
    }
}

int64_t coli_latent_block_scratch(int64_t heads, int64_t width) {
    return COLI_LATENT_BLOCK * width + heads * COLI_LATENT_BLOCK;
}

void coli_latent_block(const float *qa, int64_t heads, const float *lat, int64_t width, int64_t rank,
                       const int64_t *keys, int64_t nb, const int64_t *next, int64_t next_nb, float scaling,
                       float *scratch, float *m, float *l, float *c) {
    /* the block's rows side by side (a copy unless they already are: a prefill's early
     * queries select every key), so the scores go through the matmul tiles; as each row
     * is copied, the row 4 ahead is asked into L1 and a row of the next block into L2
     * (a long context's selected rows are scattered, each a stream the hardware
     * prefetch starts again; a thread's first block has no block before it to ask for
     * it; the next block's rows asked all at once, before the copy, waited longer) */
    const float *rows = lat + keys[0] * width;
    float *s = scratch + COLI_LATENT_BLOCK * width;
    if (keys[nb - 1] - keys[0] != nb - 1) {
        for (int64_t i = 0; i < nb; i++) {
            for (int64_t b = 0; i + 4 < nb && b < width * (int64_t)sizeof(float); b += 64)
                __builtin_prefetch((const char *)(lat + keys[i + 4] * width) + b, 0, 3);
            memcpy(scratch + i * width, lat + keys[i] * width, (size_t)width * sizeof(float));
            for (int64_t b = 0; i < next_nb && b < width * (int64_t)sizeof(float); b += 64)
                __builtin_prefetch((const char *)(lat + next[i] * width) + b, 0, 2);
        }
        rows = scratch;
    }
    coli_matmul_f32_rows(rows, nb, width, qa, heads, s, 0, nb); /* s[h * nb + i] */
    _Static_assert(COLI_LATENT_BLOCK == 64, "ONES holds a block's ones");
#define ONES8 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f
    static const float ONES[COLI_LATENT_BLOCK] = {ONES8, ONES8, ONES8, ONES8, ONES8, ONES8, ONES8, ONES8};
#undef ONES8
    for (int64_t h = 0; h < heads; h++) {
        float *sh = s + h * nb;
        m[h] = coli_scale_max_f32(sh, nb, scaling);
        coli_exp_f32(sh, nb, m[h]);
        l[h] = coli_dot_f32(sh, ONES, nb); /* the exps' sum in coli_dot_f32's order */
    }
    coli_weighted_sum_f32(s, heads, nb, rows, width, rank, c); /* each (head, value) sums its keys in order */
}

void coli_latent_combine(int64_t blocks, int64_t heads, int64_t h0, int64_t h1, int64_t rank, const float *m,
                         const float *l, const float *c, float *ctx) {
    float e[64], part[1024];
    for (int64_t h = h0; h < h1; h++) {
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t b = 0; b < blocks; b++)
            if (m[b * heads + h] > mx) mx = m[b * heads + h];
        float *out = ctx + h * rank;
        /* 64 blocks at a time (a context of 4,096 keys): each group's weighted parts
         * from zero, the groups added in order */
        for (int64_t b0 = 0; b0 < blocks; b0 += 64) {
            const int64_t nb = blocks - b0 < 64 ? blocks - b0 : 64;
            for (int64_t b = 0; b < nb; b++) e[b] = m[(b0 + b) * heads + h];
            coli_exp_f32(e, nb, mx);
            for (int64_t b = 0; b < nb; b++) sum += e[b] * l[(b0 + b) * heads + h];
            for (int64_t d0 = 0; d0 < rank; d0 += 1024) {
                const int64_t nd = rank - d0 < 1024 ? rank - d0 : 1024;
                float *to = b0 ? part : out + d0;
                coli_weighted_sum_f32(e, 1, nb, c + (b0 * heads + h) * rank + d0, heads * rank, nd, to);
                for (int64_t d = 0; b0 && d < nd; d++) out[d0 + d] += part[d];
            }
        }
        for (int64_t d = 0; d < rank; d++) out[d] /= sum;
    }
}

void coli_attend_latent(const float *qa, int64_t heads, const float *lat, int64_t width, int64_t rank,
                        const int64_t *keys, int64_t count, float scaling, float *scratch, float *parts, float *ctx) {
    const int64_t blocks = (count + COLI_LATENT_BLOCK - 1) / COLI_LATENT_BLOCK;
    float *m = parts, *l = m + blocks * heads, *c = l + blocks * heads;
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t k0 = b * COLI_LATENT_BLOCK, nb = count - k0 < COLI_LATENT_BLOCK ? count - k0 : COLI_LATENT_BLOCK;
        const int64_t next_nb = count - k0 - nb < COLI_LATENT_BLOCK ? count - k0 - nb : COLI_LATENT_BLOCK;
        coli_latent_block(qa, heads, lat, width, rank, keys + k0, nb, keys + k0 + nb, next_nb, scaling, scratch,
                          m + b * heads, l + b * heads, c + b * heads * rank);
    }
    coli_latent_combine(blocks, heads, 0, heads, rank, m, l, c, ctx);
}

/* Keys a pass of coli_index_scores takes: their heads' dots as one matmul through the
 * tiles (the keys its rows, the heads its tokens), each dot coli_dot_f32's operations;
 * the block's dots stay in L1 for the weighted sums. */
#define INDEX_BLOCK 128

void coli_index_scores(const float *iq, const float *iw, float weight_scale, const float *keys, int64_t heads,
                       int64_t dim, int64_t t0, int64_t t1, coli_scored *sc) {
    const float scale = 1.0f / sqrtf((float)dim);
    float d[64 * INDEX_BLOCK], total[INDEX_BLOCK]; /* up to 64 heads' dots a block, head by head */
    for (int64_t b = t0; b < t1; b += INDEX_BLOCK) {
        const int64_t nb = t1 - b < INDEX_BLOCK ? t1 - b : INDEX_BLOCK;
        for (int64_t r = 0; r < nb; r++) total[r] = 0.0f;
        for (int64_t h0 = 0; h0 < heads; h0 += 64) {
            const int64_t count = heads - h0 < 64 ? heads - h0 : 64;
            coli_matmul_f32_rows(keys + b * dim, nb, dim, iq + h0 * dim, count, d, 0, nb);
            for (int64_t h = 0; h < count; h++) /* each key's heads in order */
                coli_add_relu_f32(total, d + h * nb, nb, scale, iw[h0 + h] * weight_scale);
        }
        for (int64_t r = 0; r < nb; r++) sc[b + r].score = total[r], sc[b + r].t = b + r;
    }
}

int coli_scored_before(const coli_scored *x, const coli_scored *y) {
    if (x->score != y->score) return x->score > y->score;
    return x->t < y->t;
}

void coli_select_first(coli_scored *a, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const coli_scored pivot = a[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (i <= hi && coli_scored_before(&a[i], &pivot)) i++;
            while (j >= lo && coli_scored_before(&pivot, &a[j])) j--;
            if (i <= j) {
                const coli_scored tmp = a[i];
                a[i++] = a[j];
                a[j--] = tmp;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

/* A score's place in coli_scored_before's order as an unsigned integer: larger for a
 * higher score, -0 taken as +0 (equal scores, equal keys), as the GPU's selection keys. */
static uint32_t order_key(float f) {
    uint32_t u;
    f = f == 0.0f ? 0.0f : f;
    memcpy(&u, &f, sizeof u);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

void coli_index_select(coli_scored *sc, int64_t valid, int64_t topk, uint8_t *sel) {
    if (valid <= topk) {
        memset(sel, 1, (size_t)valid);
        return;
    }
    memset(sel, 0, (size_t)valid);
    /* the topk-th largest key by radix selection, a byte a pass (the first over every
     * score, the rest over those that share the bytes so far, moved to the front of sc
     * over the others); the scores above it, and of those equal to it the earliest */
    uint32_t prefix = 0, need = (uint32_t)topk;
    int64_t cand = valid;
    for (int shift = 24; shift >= 0; shift -= 8) {
        uint32_t hist[256] = {0};
        for (int64_t i = 0; i < cand; i++) hist[(order_key(sc[i].score) >> shift) & 0xFF]++;
        int bin = 255;
        for (; bin > 0 && hist[bin] < need; bin--) need -= hist[bin];
        prefix |= (uint32_t)bin << shift;
        const uint32_t mask = 0xFFFFFFFFu << shift;
        int64_t kept = 0;
        for (int64_t i = 0; i < cand; i++) { /* without branches: half the keys go each way */
            const uint32_t key = order_key(sc[i].score) & mask;
            sel[sc[i].t] = key > prefix;
            sc[kept] = sc[i];
            kept += key == prefix;
        }
        cand = kept;
    }
    if ((int64_t)need < cand) coli_select_first(sc, cand, need); /* a tie at the cut: by key */
    for (int64_t i = 0; i < (int64_t)need; i++) sel[sc[i].t] = 1;
}

int32_t coli_argmax(const float *row, int64_t n) {
    int64_t b = 0;
    float first = -FLT_MAX;
    for (int64_t i = 0; i < n; i++)
        if (row[i] > first) {
            first = row[i];
            b = i;
        }
    return (int32_t)b;
}
