/* ABI 2's step ops on the GPU: one kernel (or a few) per op, queued on the
 * backend's step stream; a step's first run launches them one by one, and every
 * later run replays them as one CUDA/HIP graph captured on the second run. The
 * position is a device value set by a one-thread kernel ahead of the ops, so the
 * recorded launches never change. Each op follows its CPU definition
 * (cpu_model_ops.c); reductions run in tree order, so values agree with the CPU
 * path to rounding, not to the bit (the selftest bounds the difference). */
#ifndef COLI_GPU_STEPS_CUH
#define COLI_GPU_STEPS_CUH

#include <float.h>

#include "backend_step_types.h"
#include "gpu_dispatch.cuh"

#define STEP_THREADS 256

/* Every step kernel may be launched while the one before it runs (sm_90; see
 * gpu_launch.cuh): it lets the next one launch and waits for the one before before
 * it touches memory, so the launches overlap and nothing else does. */
#define STEP_KERNEL_BEGIN()      \
    do {                         \
        coli_allow_next_grid();  \
        coli_wait_prior_grid();  \
    } while (0)

/* ---- block reductions ------------------------------------------------------- */

__device__ inline float block_sum(float v, float *shared) {
    v = warp_sum(v);
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = (blockDim.x + WARP - 1) / WARP;
    __syncthreads(); /* shared may still be read by a previous reduction */
    if (lane == 0) shared[w] = v;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < nw; i++) t += shared[i];
    return t;
}

__device__ inline float warp_max(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v = fmaxf(v, COLI_SHFL_XOR(v, o));
    return v;
}

__device__ inline float block_max(float v, float *shared) {
    v = warp_max(v);
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = (blockDim.x + WARP - 1) / WARP;
    __syncthreads();
    if (lane == 0) shared[w] = v;
    __syncthreads();
    float t = -INFINITY;
    for (int i = 0; i < nw; i++) t = fmaxf(t, shared[i]);
    return t;
}

/* ---- the small ops ---------------------------------------------------------- */

__global__ void set_position_kernel(int64_t *pos, int64_t value) { *pos = value; }

__global__ void embed_kernel(const float *table, const int32_t *ids, float *out, int64_t width, int64_t vocab) {
    STEP_KERNEL_BEGIN();
    const int64_t r = blockIdx.x;
    const int32_t id = ids[r];
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
        out[r * width + i] = id >= 0 && id < vocab ? table[(int64_t)id * width + i] : 0.0f;
}

__global__ void rmsnorm_kernel(const float *x, const float *w, float *out, int64_t n, int64_t xs, int64_t os,
                               float eps) {
    STEP_KERNEL_BEGIN();
    __shared__ float red[32];
    const float *xr = x + blockIdx.x * xs;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red) / (float)n;
    const float r = 1.0f / sqrtf(ss + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[blockIdx.x * os + i] = w[i] * (xr[i] * r);
}

/* add then rmsnorm of the sum, one kernel (a pair the step records after attention
 * and after each MLP): x += y, out = rmsnorm(x). Each thread rereads only what it wrote. */
__global__ void add_rmsnorm_kernel(float *x, const float *y, const float *w, float *out, int64_t n, int64_t os,
                                   float eps) {
    STEP_KERNEL_BEGIN();
    __shared__ float red[32];
    float *xr = x + blockIdx.x * n;
    const float *yr = y + blockIdx.x * n;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = xr[i] + yr[i];
        xr[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, red) / (float)n;
    const float r = 1.0f / sqrtf(ss + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[blockIdx.x * os + i] = w[i] * (xr[i] * r);
}

__global__ void layernorm_kernel(float *x, const float *w, const float *b, int64_t n, int64_t stride, float eps) {
    STEP_KERNEL_BEGIN();
    __shared__ float red[32];
    float *xr = x + blockIdx.x * stride;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
    const float mean = block_sum(s, red) / (float)n;
    float v = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v += (xr[i] - mean) * (xr[i] - mean);
    const float r = 1.0f / sqrtf(block_sum(v, red) / (float)n + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) xr[i] = (xr[i] - mean) * r * w[i] + b[i];
}

/* One block per (row, head): the pairs are read whole before any is written. */
__global__ void rope_kernel(float *x, const float *inv_freq, const int64_t *pos, int64_t heads, int64_t row_stride,
                            int64_t head_stride, int64_t dim) {
    STEP_KERNEL_BEGIN();
    __shared__ float v[512];
    const int64_t r = blockIdx.x / heads, h = blockIdx.x % heads, half = dim / 2;
    float *p = x + r * row_stride + h * head_stride;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) v[i] = p[i];
    __syncthreads();
    const float at = (float)(*pos + r);
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
        const float f = at * inv_freq[i], c = cosf(f), s = sinf(f), a = v[2 * i], b = v[2 * i + 1];
        p[i] = a * c - b * s;
        p[half + i] = b * c + a * s;
    }
}

__global__ void write_rows_kernel(const float *src, float *dst, const int64_t *pos, int64_t width, int64_t src_stride,
                                  int64_t src_repeat, int64_t dst_stride, int64_t pos_rows) {
    STEP_KERNEL_BEGIN();
    const int64_t r = blockIdx.x;
    float *d = dst + (*pos * pos_rows + r) * dst_stride;
    const float *s = src + r / src_repeat * src_stride;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) d[i] = s[i];
}

__global__ void add_kernel(float *x, const float *y, int64_t count) {
    STEP_KERNEL_BEGIN();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

__device__ inline float dev_silu(float x) { return x / (1.0f + expf(-x)); }

__global__ void silu_mul_kernel(float *g, const float *u, int64_t count) {
    STEP_KERNEL_BEGIN();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
        g[i] = dev_silu(g[i]) * u[i];
}

__global__ void bias_kernel(float *y, const float *bias, int64_t rows, int64_t count) {
    STEP_KERNEL_BEGIN();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += bias[i % rows];
}

/* The first maximum of a row: each thread's first best, then the lowest index among equals. */
__global__ void argmax_kernel(const float *logits, int32_t *ids, int64_t vocab) {
    STEP_KERNEL_BEGIN();
    __shared__ float bv[STEP_THREADS];
    __shared__ int64_t bi[STEP_THREADS];
    const float *row = logits + blockIdx.x * vocab;
    float best = -FLT_MAX;
    int64_t at = -1;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x)
        if (row[i] > best) best = row[i], at = i;
    bv[threadIdx.x] = best;
    bi[threadIdx.x] = at;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            const float ov = bv[threadIdx.x + s];
            const int64_t oi = bi[threadIdx.x + s];
            if (oi >= 0 && (bi[threadIdx.x] < 0 || ov > bv[threadIdx.x] || (ov == bv[threadIdx.x] && oi < bi[threadIdx.x])))
                bv[threadIdx.x] = ov, bi[threadIdx.x] = oi;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) ids[blockIdx.x] = (int32_t)(bi[0] < 0 ? 0 : bi[0]);
}

/* ---- the router: a block a row, coli_route's steps --------------------------- */

/* The scores and choices (and each group's two best) on all threads, then the
 * picks, which only compare, on one. */
__global__ void route_kernel(const float *logits, const float *bias, int32_t *idx, float *w, int64_t experts,
                             int64_t groups, int64_t topk_group, int64_t k, int64_t norm, float scaling) {
    STEP_KERNEL_BEGIN();
    __shared__ float score[1024], choice[1024], gscore[1024];
    __shared__ unsigned char group_on[1024], taken[1024];
    /* 32-bit indices (at most 1024 experts): a 64-bit division is a long software routine on a GPU */
    const int E = (int)experts, G = (int)groups, per = E / G, TG = (int)topk_group, K = (int)k;
    const float *lg = logits + blockIdx.x * experts;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        score[e] = 1.0f / (1.0f + expf(-lg[e]));
        choice[e] = score[e] + bias[e];
        taken[e] = 0;
    }
    __syncthreads();
    for (int g = threadIdx.x; g < G; g += blockDim.x) {
        float a = -INFINITY, b2 = -INFINITY;
        for (int e = g * per; e < (g + 1) * per; e++) {
            if (choice[e] > a) b2 = a, a = choice[e];
            else if (choice[e] > b2) b2 = choice[e];
        }
        gscore[g] = a + b2;
        group_on[g] = 0;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int j = 0; j < TG; j++) {
        int best = -1;
        for (int g = 0; g < G; g++)
            if (!group_on[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
        if (best < 0) break;
        group_on[best] = 1;
    }
    for (int e = 0; e < E; e++) taken[e] = !group_on[e / per]; /* an expert of a group not chosen is never picked */
    int32_t *ri = idx + blockIdx.x * k;
    float *rw = w + blockIdx.x * k, sum = 0.0f;
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || choice[e] > choice[best])) best = e;
        if (best < 0) best = 0;
        taken[best] = 1;
        ri[j] = best;
        rw[j] = score[best];
        sum += score[best];
    }
    sum += 1e-20f;
    for (int j = 0; j < K; j++) rw[j] = (norm ? rw[j] / sum : rw[j]) * scaling;
}

/* ---- the routed experts -------------------------------------------------------- */

/* An expert's weight as the kernels read it: any layout (stored_value). */
struct dev_weight {
    const void *q;
    const float *scale;
    int64_t rows, cols;
    int32_t group, layout;
};

/* A row of an expert's weight dotted with x, on a warp: whole 32-bit words a lane
 * (4 int8 or 8 int4 values, dequantised exactly as the matmul kernels do), in the
 * ABI's order or the mma layout's; value by value (stored_value) otherwise. */
template <int FORMAT> __device__ inline float weight_row_dot(const dev_weight &w, int64_t row, const float *x, int lane) {
    constexpr int PW = fmt<FORMAT>::per_word;
    float acc = 0.0f;
    const bool words = w.cols % PW == 0 && w.layout != TILE_LAYOUT && (FORMAT != COLI_FMT_Q4 || w.group % PW == 0);
    if (words) {
        const int64_t per_row = w.cols / PW, base = row * per_row;
        const uint32_t *q = (const uint32_t *)w.q;
        for (int64_t wn = lane; wn < per_row; wn += WARP) {
            float v[PW];
            dequant<FORMAT>(q[w.layout ? mma_word(base + wn) : base + wn], v);
            const float *xs = x + wn * PW;
            float part = 0.0f;
#pragma unroll
            for (int k = 0; k < PW; k++) part += v[k] * xs[k];
            acc += FORMAT == COLI_FMT_Q4 ? part * w.scale[row * (w.cols / w.group) + wn * PW / w.group] : part;
        }
    } else {
        for (int64_t c = lane; c < w.cols; c += WARP) {
            const float v = x[c] * stored_value<FORMAT>(w.q, row, w.cols, w.layout, c);
            acc += FORMAT == COLI_FMT_Q4 ? v * stored_scale(w.scale, row, w.cols, w.group, w.layout, c) : v;
        }
    }
    acc = warp_sum(acc);
    return FORMAT == COLI_FMT_Q8 ? acc * w.scale[row] : acc;
}

/* gu[pair][i] = silu(gate_e x . ) * (up_e x), pair = (row, j) with e = idx[pair]; a warp an output. */
template <int FORMAT>
__global__ void moe_up_kernel(const dev_weight *ws, const float *x, const int32_t *idx, float *gu, int64_t k,
                              int64_t inter, int64_t hid, int64_t experts) {
    STEP_KERNEL_BEGIN();
    const int64_t pair = blockIdx.y, i = blockIdx.x * (int64_t)(blockDim.x / WARP) + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    const int32_t e = idx[pair];
    if (i >= inter || e < 0 || e >= experts) return;
    const float *xr = x + pair / k * hid;
    const float g = weight_row_dot<FORMAT>(ws[3 * e], i, xr, lane), u = weight_row_dot<FORMAT>(ws[3 * e + 1], i, xr, lane);
    if (lane == 0) gu[pair * inter + i] = dev_silu(g) * u;
}

template <int FORMAT>
__global__ void moe_down_kernel(const dev_weight *ws, const float *gu, const int32_t *idx, float *eo, int64_t inter,
                                int64_t hid, int64_t experts) {
    STEP_KERNEL_BEGIN();
    const int64_t pair = blockIdx.y, d = blockIdx.x * (int64_t)(blockDim.x / WARP) + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    const int32_t e = idx[pair];
    if (d >= hid) return;
    const float v = e >= 0 && e < experts ? weight_row_dot<FORMAT>(ws[3 * e + 2], d, gu + pair * inter, lane) : 0.0f;
    if (lane == 0) eo[pair * hid + d] = v;
}

/* out[row] = the experts' outputs times their weights, added in ascending expert order. */
__global__ void moe_combine_kernel(const float *eo, const int32_t *idx, const float *w, float *out, int64_t k,
                                   int64_t hid) {
    STEP_KERNEL_BEGIN();
    const int64_t r = blockIdx.y, d = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (d >= hid) return;
    int order[16];
    for (int64_t j = 0; j < k; j++) order[j] = (int)j;
    for (int64_t a = 1; a < k; a++) /* insertion sort by expert */
        for (int64_t b = a; b > 0 && idx[r * k + order[b]] < idx[r * k + order[b - 1]]; b--) {
            const int t = order[b];
            order[b] = order[b - 1];
            order[b - 1] = t;
        }
    float acc = 0.0f;
    for (int64_t j = 0; j < k; j++) acc += eo[(r * k + order[j]) * hid + d] * w[r * k + order[j]];
    out[r * hid + d] = acc;
}

/* ---- the DSA indexer ------------------------------------------------------------ */

/* scores[row][t] for keys t <= p + row: a warp a key. */
__global__ void index_scores_kernel(const float *iq, const float *iw, const float *keys, float *scores,
                                    const int64_t *pos, int64_t heads, int64_t dim, int64_t stride, float weight_scale) {
    STEP_KERNEL_BEGIN();
    const int64_t row = blockIdx.y, t = blockIdx.x * (int64_t)(blockDim.x / WARP) + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    if (t > *pos + row) return;
    const float scale = 1.0f / sqrtf((float)dim);
    float total = 0.0f;
    for (int64_t h = 0; h < heads; h++) {
        const float *q = iq + (row * heads + h) * dim;
        float d = 0.0f;
        for (int64_t i = lane; i < dim; i += WARP) d += q[i] * keys[t * dim + i];
        d = warp_sum(d) * scale;
        total += (iw[row * heads + h] * weight_scale) * (d > 0.0f ? d : 0.0f);
    }
    if (lane == 0) scores[row * stride + t] = total;
}

/* A float's order as an unsigned key: larger floats, larger keys. */
__device__ inline uint32_t order_key(float f) {
    const uint32_t u = __float_as_uint(f);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

/* One block a query: every key when there are no more than topk, else the topk
 * best (ties to the earlier key): the topk-th largest key by radix selection, the
 * keys above it, and the earliest of those equal to it. */
__global__ void index_select_kernel(const float *scores, uint8_t *sel, const int64_t *pos, int64_t stride, int64_t topk,
                                    int64_t rows) {
    STEP_KERNEL_BEGIN();
    __shared__ uint32_t hist[256];
    __shared__ uint32_t prefix_s, need_s;
    __shared__ int64_t counts[STEP_THREADS];
    const int64_t row = blockIdx.x, valid = *pos + row + 1, total = *pos + rows;
    uint8_t *s = sel + row * stride;
    const float *sc = scores + row * stride;
    if (valid <= topk) {
        for (int64_t t = threadIdx.x; t < total; t += blockDim.x) s[t] = t < valid;
        return;
    }
    uint32_t prefix = 0, need = (uint32_t)topk; /* need: how many of those matching prefix are still wanted */
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        const uint32_t mask = shift == 24 ? 0u : 0xFFFFFFFFu << (shift + 8);
        for (int64_t t = threadIdx.x; t < valid; t += blockDim.x) {
            const uint32_t k = order_key(sc[t]);
            if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 0xFF], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            uint32_t left = need;
            int b = 255;
            for (; b > 0 && hist[b] < left; b--) left -= hist[b];
            prefix_s = prefix | ((uint32_t)b << shift);
            need_s = left;
        }
        __syncthreads();
        prefix = prefix_s;
        need = need_s;
    }
    /* prefix: the topk-th key; need: how many keys equal to it are taken (the earliest) */
    const int64_t per = (valid + blockDim.x - 1) / blockDim.x, b0 = threadIdx.x * per;
    int64_t eq = 0;
    for (int64_t t = b0; t < b0 + per && t < valid; t++) eq += order_key(sc[t]) == prefix;
    counts[threadIdx.x] = eq;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int i = 1; i < (int)blockDim.x; i++) counts[i] += counts[i - 1];
    __syncthreads();
    int64_t before = threadIdx.x ? counts[threadIdx.x - 1] : 0;
    for (int64_t t = b0; t < b0 + per && t < valid; t++) {
        const uint32_t k = order_key(sc[t]);
        uint8_t on = k > prefix;
        if (k == prefix) on = before++ < (int64_t)need;
        s[t] = on;
    }
    for (int64_t t = valid + threadIdx.x; t < total; t += blockDim.x) s[t] = 0;
}

/* ---- attention ------------------------------------------------------------------- */

/* Keys a block of attend_part_kernel takes: a query's keys split over blocks, so a
 * decoded token's few (query, head) pairs still fill the GPU at long contexts. */
#define ATTEND_CHUNK 256

/* One block per (row, head, chunk of keys): the chunk's selected scores, their max
 * m, sum of exp(score - m) and the exp-weighted v, into part[(pair, chunk)] as
 * [m, sum, v...]; a chunk with no selected key (or past the query) has sum 0. */
__global__ void attend_part_kernel(const float *q, const float *k, const float *v, const uint8_t *sel, float *part,
                                   const int64_t *pos, int64_t heads, int64_t qk, int64_t vdim, int64_t stride,
                                   float scaling) {
    STEP_KERNEL_BEGIN();
    __shared__ float red[32], p[ATTEND_CHUNK], acc[STEP_THREADS];
    const int64_t pair = blockIdx.x, row = pair / heads, h = pair % heads, last = *pos + row;
    const int64_t t0 = (int64_t)blockIdx.y * ATTEND_CHUNK, t1 = t0 + ATTEND_CHUNK - 1 < last ? t0 + ATTEND_CHUNK - 1 : last;
    float *out = part + (pair * gridDim.y + blockIdx.y) * (vdim + 2);
    if (t0 > last) { /* a whole block leaves together: no barrier is skipped by some */
        if (threadIdx.x == 0) out[0] = -INFINITY, out[1] = 0.0f;
        return;
    }
    const float *qr = q + pair * qk;
    const uint8_t *sr = sel + row * stride;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    for (int64_t t = t0 + warp; t <= t1; t += nw) {
        float d = 0.0f;
        if (sr[t]) {
            const float *kt = k + (t * heads + h) * qk;
            for (int64_t i = lane; i < qk; i += WARP) d += qr[i] * kt[i];
            d = warp_sum(d) * scaling;
        }
        if (lane == 0) p[t - t0] = sr[t] ? d : -INFINITY;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int64_t t = t0 + threadIdx.x; t <= t1; t += blockDim.x) mx = fmaxf(mx, p[t - t0]);
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (int64_t t = t0 + threadIdx.x; t <= t1; t += blockDim.x) {
        const float e = mx == -INFINITY ? 0.0f : expf(p[t - t0] - mx);
        p[t - t0] = e;
        sum += e;
    }
    sum = block_sum(sum, red); /* its barriers also order the writes of p before the reads below */
    /* the weighted v: groups of vdim threads take every groups-th key, then add up */
    if (vdim <= (int64_t)blockDim.x) {
        const int64_t groups = blockDim.x / vdim, g = threadIdx.x / vdim, d = threadIdx.x % vdim;
        float a = 0.0f;
        if (g < groups)
            for (int64_t t = t0 + g; t <= t1; t += groups) a += p[t - t0] * v[(t * heads + h) * vdim + d];
        acc[threadIdx.x] = a;
        __syncthreads();
        if (threadIdx.x < vdim) {
            float total = 0.0f;
            for (int64_t gg = 0; gg < groups; gg++) total += acc[gg * vdim + threadIdx.x];
            out[2 + threadIdx.x] = total;
        }
    } else {
        for (int64_t d = threadIdx.x; d < vdim; d += blockDim.x) {
            float a = 0.0f;
            for (int64_t t = t0; t <= t1; t++) a += p[t - t0] * v[(t * heads + h) * vdim + d];
            out[2 + d] = a;
        }
    }
    if (threadIdx.x == 0) out[0] = mx, out[1] = sum;
}

/* out[pair] = sum over chunks of exp(m_c - M) * v_c / sum over chunks of exp(m_c - M) * sum_c. */
__global__ void attend_combine_kernel(const float *part, float *out, int64_t chunks, int64_t vdim) {
    STEP_KERNEL_BEGIN();
    const int64_t pair = blockIdx.x;
    const float *pp = part + pair * chunks * (vdim + 2);
    float M = -INFINITY;
    for (int64_t c = 0; c < chunks; c++)
        if (pp[c * (vdim + 2) + 1] > 0.0f) M = fmaxf(M, pp[c * (vdim + 2)]);
    float total = 0.0f;
    for (int64_t c = 0; c < chunks; c++) {
        const float s = pp[c * (vdim + 2) + 1];
        if (s > 0.0f) total += expf(pp[c * (vdim + 2)] - M) * s;
    }
    for (int64_t d = threadIdx.x; d < vdim; d += blockDim.x) {
        float a = 0.0f;
        for (int64_t c = 0; c < chunks; c++)
            if (pp[c * (vdim + 2) + 1] > 0.0f) a += expf(pp[c * (vdim + 2)] - M) * pp[c * (vdim + 2) + 2 + d];
        out[pair * vdim + d] = a / total;
    }
}

/* ---- a step on the device ------------------------------------------------------------ */

/* What a step keeps besides its ops: scratch sized for its largest op, the expert
 * tables of its moe ops, and its graph once captured. */
struct gpu_rec {
    int64_t *pos;
    float *planes, *scores, *moe_gu, *moe_eo;
    dev_weight **tables; /* per op: the moe op's experts, else NULL */
    int32_t n_tables;
    int runs;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

static cudaStream_t g_step_stream = NULL;

static unsigned blocks_for(int64_t count) {
    const int64_t b = (count + STEP_THREADS - 1) / STEP_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 4096 ? 4096 : b);
}

static cudaError_t step_malloc(void **p, size_t bytes) {
    *p = NULL;
    if (!bytes) return cudaSuccess;
    return cudaMalloc(p, bytes);
}

/* Scratch and tables for every op of r, sized from the ops themselves. */
static coli_status gpu_rec_make(coli_rec *r, gpu_rec **out) {
    gpu_rec *g = (gpu_rec *)calloc(1, sizeof *g);
    if (!g) return coli_fail(COLI_E_OUT_OF_MEMORY, "step_run: out of host memory");
    *out = g;
    r->impl = g;
    g->tables = (dev_weight **)calloc((size_t)r->count, sizeof *g->tables);
    if (!g->tables) return coli_fail(COLI_E_OUT_OF_MEMORY, "step_run: out of host memory");
    g->n_tables = r->count;
    size_t planes = 0, scores = 0, gu = 0, eo = 0;
    for (int32_t k = 0; k < r->count; k++) {
        const coli_rec_op *o = &r->ops[k];
        const int64_t *i = o->op.i;
        if (o->op.kind == COLI_OP_MOE && i[1] > 16)
            return coli_fail(COLI_E_SHAPE, "step_run: moe: k = %lld; this backend takes up to 16 experts a row",
                             (long long)i[1]);
        if (o->op.kind == COLI_OP_MATMUL && o->w[0]->format != COLI_FMT_F32) {
            const size_t b = (size_t)(i[0] * o->w[0]->cols) * sizeof(float);
            planes = b > planes ? b : planes;
        } else if (o->op.kind == COLI_OP_INDEXER || o->op.kind == COLI_OP_ATTEND) {
            /* the indexer's scores [rows, sel_stride]; attention's parts [rows * heads, chunks, vdim + 2] */
            const int64_t chunks = (i[4] + ATTEND_CHUNK - 1) / ATTEND_CHUNK;
            const size_t b = (size_t)(o->op.kind == COLI_OP_ATTEND ? i[0] * i[1] * chunks * (i[3] + 2) : i[0] * i[4]) *
                             sizeof(float);
            scores = b > scores ? b : scores;
        } else if (o->op.kind == COLI_OP_MOE) {
            const size_t pairs = (size_t)(i[0] * i[1]);
            const size_t a = pairs * (size_t)o->w[0]->rows * sizeof(float), b = pairs * (size_t)o->w[0]->cols * sizeof(float);
            gu = a > gu ? a : gu;
            eo = b > eo ? b : eo;
            const int32_t n = o->op.n_tensors;
            dev_weight *host = (dev_weight *)malloc((size_t)n * sizeof *host);
            if (!host) return coli_fail(COLI_E_OUT_OF_MEMORY, "step_run: out of host memory");
            for (int32_t t = 0; t < n; t++) {
                const coli_weight *w = o->w[t];
                if (w->format != o->w[0]->format) {
                    free(host);
                    return coli_fail(COLI_E_INVALID, "step_run: moe: expert tensors in more than one format");
                }
                host[t] = dev_weight{w->q, w->scale, w->rows, w->cols, w->group, w->layout};
            }
            cudaError_t e = cudaMalloc((void **)&g->tables[k], (size_t)n * sizeof *host);
            if (e == cudaSuccess) e = cudaMemcpy(g->tables[k], host, (size_t)n * sizeof *host, cudaMemcpyHostToDevice);
            free(host);
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                return coli_fail(COLI_E_OUT_OF_MEMORY, "step_run: moe table: %s", cudaGetErrorString(e));
            }
        }
    }
    cudaError_t e = step_malloc((void **)&g->pos, sizeof(int64_t));
    if (e == cudaSuccess) e = step_malloc((void **)&g->planes, planes);
    if (e == cudaSuccess) e = step_malloc((void **)&g->scores, scores);
    if (e == cudaSuccess) e = step_malloc((void **)&g->moe_gu, gu);
    if (e == cudaSuccess) e = step_malloc((void **)&g->moe_eo, eo);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return coli_fail(COLI_E_OUT_OF_MEMORY, "step_run: cannot allocate the step's scratch (%zu bytes): %s",
                         planes + scores + gu + eo, cudaGetErrorString(e));
    }
    return COLI_OK;
}

static void rec_release(coli_rec *r) {
    gpu_rec *g = (gpu_rec *)r->impl;
    if (!g) return;
    if (g_step_stream) (void)cudaStreamSynchronize(g_step_stream);
    if (g->exec) (void)cudaGraphExecDestroy(g->exec);
    if (g->graph) (void)cudaGraphDestroy(g->graph);
    for (int32_t k = 0; g->tables && k < g->n_tables; k++)
        if (g->tables[k]) (void)cudaFree(g->tables[k]);
    free(g->tables);
    void *scratch[] = {g->pos, g->planes, g->scores, g->moe_gu, g->moe_eo};
    for (void *p : scratch)
        if (p) (void)cudaFree(p);
    free(g);
    r->impl = NULL;
}

template <int FORMAT>
static void launch_moe(const coli_rec_op *o, const gpu_rec *g, const dev_weight *table, cudaStream_t st) {
    const coli_moe_operands a = coli_unpack_moe(&o->op, o->p);
    const int64_t inter = o->w[0]->rows, hid = o->w[0]->cols, experts = a.n_tensors / 3, pairs = a.rows * a.k;
    const int per = STEP_THREADS / WARP;
    launch_early(chain_calls(), moe_up_kernel<FORMAT>, dim3((unsigned)((inter + per - 1) / per), (unsigned)pairs),
        dim3(STEP_THREADS), 0, st, table, a.x, a.idx, g->moe_gu, a.k, inter, hid, experts);
    launch_early(chain_calls(), moe_down_kernel<FORMAT>, dim3((unsigned)((hid + per - 1) / per), (unsigned)pairs),
        dim3(STEP_THREADS), 0, st, table, g->moe_gu, a.idx, g->moe_eo, inter, hid, experts);
    launch_early(chain_calls(), moe_combine_kernel, dim3(blocks_for(hid), (unsigned)a.rows), dim3(STEP_THREADS), 0,
        st, g->moe_eo, a.idx, a.w, a.out, a.k, hid);
}

/* Queues one op; the launch's error, if any, is read once after the step. */
static void launch_op(const coli_rec_op *o, int32_t at, const gpu_rec *g, cudaStream_t st) {
    void *const *p = o->p;
    const int64_t *pos = g->pos;
    switch (o->op.kind) {
    case COLI_OP_EMBED: {
        const coli_embed_operands a = coli_unpack_embed(&o->op, p);
        launch_early(chain_calls(), embed_kernel, dim3((unsigned)a.rows), dim3(STEP_THREADS), 0, st, a.table, a.ids,
            a.out, a.width, a.vocab);
        break;
    }
    case COLI_OP_RMSNORM: {
        const coli_rmsnorm_operands a = coli_unpack_rmsnorm(&o->op, p);
        launch_early(chain_calls(), rmsnorm_kernel, dim3((unsigned)a.rows), dim3(STEP_THREADS), 0, st, a.x, a.w,
            a.out, a.n, a.x_stride, a.out_stride, a.eps);
        break;
    }
    case COLI_OP_LAYERNORM: {
        const coli_layernorm_operands a = coli_unpack_layernorm(&o->op, p);
        launch_early(chain_calls(), layernorm_kernel, dim3((unsigned)a.rows), dim3(STEP_THREADS), 0, st, a.x, a.w,
            a.b, a.n, a.stride, a.eps);
        break;
    }
    case COLI_OP_ROPE: {
        const coli_rope_operands a = coli_unpack_rope(&o->op, p);
        launch_early(chain_calls(), rope_kernel, dim3((unsigned)(a.rows * a.heads)), dim3(64), 0, st, a.x, a.inv_freq,
            pos, a.heads, a.row_stride, a.head_stride, a.dim);
        break;
    }
    case COLI_OP_MATMUL: {
        const coli_matmul_operands a = coli_unpack_matmul(&o->op, p);
        const coli_weight *w = o->w[0];
        (void)launch_matmul(w, a.x, a.s, a.y, false, st, w->format == COLI_FMT_F32 ? NULL : g->planes);
        if (a.bias) launch_early(chain_calls(), bias_kernel,
            dim3(blocks_for(a.s * w->rows)), dim3(STEP_THREADS), 0, st, a.y, a.bias, w->rows, a.s * w->rows);
        break;
    }
    case COLI_OP_WRITE_ROWS: {
        const coli_write_rows_operands a = coli_unpack_write_rows(&o->op, p);
        launch_early(chain_calls(), write_rows_kernel, dim3((unsigned)a.rows), dim3(128), 0, st, a.src, a.dst, pos,
            a.width, a.src_stride, a.src_repeat, a.dst_stride, a.pos_rows);
        break;
    }
    case COLI_OP_ADD: {
        const coli_add_operands a = coli_unpack_add(&o->op, p);
        launch_early(chain_calls(), add_kernel, dim3(blocks_for(a.count)), dim3(STEP_THREADS), 0, st, a.x, a.y,
            a.count);
        break;
    }
    case COLI_OP_SILU_MUL: {
        const coli_silu_mul_operands a = coli_unpack_silu_mul(&o->op, p);
        launch_early(chain_calls(), silu_mul_kernel, dim3(blocks_for(a.count)), dim3(STEP_THREADS), 0, st, a.g, a.u,
            a.count);
        break;
    }
    case COLI_OP_INDEXER: {
        const coli_indexer_operands a = coli_unpack_indexer(&o->op, p);
        const int per = STEP_THREADS / WARP;
        /* keys up to the largest position the step allows for its last row */
        const int64_t keys = a.sel_stride;
        launch_early(chain_calls(), index_scores_kernel, dim3((unsigned)((keys + per - 1) / per), (unsigned)a.rows),
            dim3(STEP_THREADS), 0, st, a.iq, a.iw, a.keys,
            g->scores, pos, a.heads, a.dim, a.sel_stride, a.weight_scale);
        launch_early(chain_calls(), index_select_kernel, dim3((unsigned)a.rows), dim3(STEP_THREADS), 0, st,
            g->scores, a.sel, pos, a.sel_stride, a.topk, a.rows);
        break;
    }
    case COLI_OP_ATTEND: {
        const coli_attend_operands a = coli_unpack_attend(&o->op, p);
        const int64_t chunks = (a.sel_stride + ATTEND_CHUNK - 1) / ATTEND_CHUNK, pairs = a.rows * a.heads;
        launch_early(chain_calls(), attend_part_kernel, dim3((unsigned)pairs, (unsigned)chunks), dim3(STEP_THREADS), 0,
            st, a.q, a.k, a.v, a.sel, g->scores, pos, a.heads, a.qk, a.vdim, a.sel_stride, a.scaling);
        launch_early(chain_calls(), attend_combine_kernel, dim3((unsigned)pairs), dim3(128), 0, st, g->scores, a.out,
            chunks, a.vdim);
        break;
    }
    case COLI_OP_ROUTE: {
        const coli_route_operands a = coli_unpack_route(&o->op, p);
        launch_early(chain_calls(), route_kernel, dim3((unsigned)a.rows), dim3(64), 0, st, a.logits, a.bias, a.idx, a.w,
            a.experts, a.groups, a.topk_group, a.k, a.norm, a.scaling);
        break;
    }
    case COLI_OP_MOE: {
        const dev_weight *table = g->tables[at];
        if (o->w[0]->format == COLI_FMT_F32) launch_moe<COLI_FMT_F32>(o, g, table, st);
        else if (o->w[0]->format == COLI_FMT_Q8) launch_moe<COLI_FMT_Q8>(o, g, table, st);
        else launch_moe<COLI_FMT_Q4>(o, g, table, st);
        break;
    }
    default: {
        const coli_argmax_operands a = coli_unpack_argmax(&o->op, p);
        launch_early(chain_calls(), argmax_kernel, dim3((unsigned)a.rows), dim3(STEP_THREADS), 0, st, a.logits, a.ids,
            a.vocab);
    }
    }
}

/* COLI_GPU_FUSE=0 launches every op on its own (for comparisons). */
static bool fuse_ops(void) {
    static int on = -1;
    return env_switch("COLI_GPU_FUSE", &on);
}

/* An add whose sum the next op rmsnorms, row by row: one kernel for both. */
static bool launch_add_rmsnorm(const coli_rec_op *add, const coli_rec_op *norm, cudaStream_t st) {
    if (add->op.kind != COLI_OP_ADD || norm->op.kind != COLI_OP_RMSNORM) return false;
    const coli_add_operands a = coli_unpack_add(&add->op, add->p);
    const coli_rmsnorm_operands n = coli_unpack_rmsnorm(&norm->op, norm->p);
    if (n.x != a.x || n.x_stride != n.n || n.rows * n.n != a.count) return false;
    launch_early(chain_calls(), add_rmsnorm_kernel, dim3((unsigned)n.rows), dim3(STEP_THREADS), 0, st, a.x, a.y, n.w,
        n.out, n.n, n.out_stride, n.eps);
    return true;
}

static void launch_ops(const coli_rec *r, const gpu_rec *g, cudaStream_t st) {
    for (int32_t k = 0; k < r->count; k++) {
        if (fuse_ops() && k + 1 < r->count && launch_add_rmsnorm(&r->ops[k], &r->ops[k + 1], st)) {
            k++;
            continue;
        }
        launch_op(&r->ops[k], k, g, st);
    }
}

/* COLI_GPU_GRAPHS=0 launches every run's ops one by one (for comparisons). */
static bool use_graphs(void) {
    static int on = -1;
    return env_switch("COLI_GPU_GRAPHS", &on);
}

/* COLI_GPU_PROFILE=1: every run launches its ops one by one, each between two
 * events, and the time per op kind (matmuls by format) is printed to stderr when
 * the backend shuts down: where a step's GPU time goes, with no profiler. */
enum { PROFILE_KINDS = 16 + 3 };
static double g_profile_ms[PROFILE_KINDS];
static int64_t g_profile_calls[PROFILE_KINDS];
static bool profiling(void) {
    static int on = -1;
    if (on < 0) on = getenv("COLI_GPU_PROFILE") != NULL;
    return on != 0;
}

static int profile_slot(const coli_rec_op *o) {
    return o->op.kind == COLI_OP_MATMUL ? 16 + o->w[0]->format : o->op.kind;
}

static coli_status profile_run(const coli_rec *r, const gpu_rec *g, cudaStream_t s) {
    cudaEvent_t ev[2];
    GPU_CHECK(cudaEventCreate(&ev[0]));
    GPU_CHECK(cudaEventCreate(&ev[1]));
    for (int32_t k = 0; k < r->count; k++) {
        float ms = 0.0f;
        GPU_CHECK(cudaEventRecord(ev[0], s));
        launch_op(&r->ops[k], k, g, s);
        GPU_CHECK(cudaEventRecord(ev[1], s));
        GPU_CHECK(cudaEventSynchronize(ev[1]));
        GPU_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
        g_profile_ms[profile_slot(&r->ops[k])] += ms;
        g_profile_calls[profile_slot(&r->ops[k])]++;
    }
    (void)cudaEventDestroy(ev[0]);
    (void)cudaEventDestroy(ev[1]);
    return COLI_OK;
}

static void profile_print(void) {
    static const char *const fmts[] = {"matmul f32", "matmul int8", "matmul int4"};
    double total = 0.0;
    for (int k = 0; k < PROFILE_KINDS; k++) total += g_profile_ms[k];
    if (!profiling() || total <= 0.0) return;
    fprintf(stderr, "GPU step ops (COLI_GPU_PROFILE): %.3f ms in all\n", total);
    for (int k = 0; k < PROFILE_KINDS; k++) {
        if (!g_profile_calls[k]) continue;
        const coli_op_info *info = k < 16 ? coli_op_info_of(k) : NULL;
        fprintf(stderr, "  %-12s %8lld calls %10.3f ms %8.2f us each %5.1f%%\n", k >= 16 ? fmts[k - 16] : info->name,
                (long long)g_profile_calls[k], g_profile_ms[k], 1e3 * g_profile_ms[k] / (double)g_profile_calls[k],
                100.0 * g_profile_ms[k] / total);
    }
}

static coli_status rec_run(coli_rec *r, int64_t position) {
    gpu_rec *g = (gpu_rec *)r->impl;
    coli_status st;
    if (!g && (st = gpu_rec_make(r, &g))) return st;
    cudaStream_t s = g_step_stream;
    set_position_kernel<<<1, 1, 0, s>>>(g->pos, position);
    if (profiling()) return profile_run(r, g, s);
    /* the first run launches directly (kernel attributes are set on first use, outside
     * any capture); the second captures the ops, and that and every later run replay them */
    if (g->runs++ == 0 || !use_graphs()) {
        launch_ops(r, g, s);
    } else {
        if (!g->exec) {
            GPU_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
            launch_ops(r, g, s);
            const cudaError_t launch = cudaGetLastError();
            const cudaError_t end = cudaStreamEndCapture(s, &g->graph);
            if (launch != cudaSuccess || end != cudaSuccess)
                return coli_fail(COLI_E_RUNTIME, "step_run: capturing the step failed: %s",
                                 cudaGetErrorString(launch != cudaSuccess ? launch : end));
            GPU_CHECK(cudaGraphInstantiateWithFlags(&g->exec, g->graph, 0));
        }
        GPU_CHECK(cudaGraphLaunch(g->exec, s));
    }
    GPU_CHECK(cudaGetLastError());
    return COLI_OK;
}

#endif
