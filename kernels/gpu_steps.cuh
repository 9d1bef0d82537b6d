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

/* A norm's row in registers, NORM_HELD values a thread (i = threadIdx.x + j
 * blockDim.x), where it fits: every load of the row is issued before any store, where
 * a loop of loads and stores through pointers that may alias waits on each load in
 * turn. Each thread adds its values in the loop's order, so the sums are the same. */
#define NORM_HELD 8

/* load() before the kernel waits for the one before it where EARLY: no op of the step
 * writes what it loads (the backend checks the spans, step_plan.h), so the kernel's loads
 * after the wait come from L2 (the row the kernel before wrote), not also from memory (a
 * weight read once a token is out of L2 by the next token); else after the wait. The
 * norms' weights, layernorm's, rope's frequencies; the route's bias goes the same way.
 * A template argument, not a kernel's: with a branch on each side of the wait the
 * decode was slower than with the early loads alone. */
template <bool EARLY, typename Load> __device__ inline void load_then_wait(Load load) {
    if (EARLY) load();
    coli_wait_prior_grid();
    if (!EARLY) load();
}

/* A norm's weights, held as its row is (where the row fits, else 0s). */
__device__ inline void norm_weights_held(const float *w, int64_t n, float (&wv)[NORM_HELD]) {
    const bool held = n <= NORM_HELD * (int64_t)blockDim.x;
#pragma unroll
    for (int j = 0; j < NORM_HELD; j++) {
        const int64_t i = threadIdx.x + j * (int64_t)blockDim.x;
        wv[j] = held && i < n ? w[i] : 0.0f;
    }
}

template <bool EARLY>
__global__ void rmsnorm_kernel(const float *x, const float *w, float *out, int64_t n, int64_t xs, int64_t os,
                               float eps) {
    coli_allow_next_grid();
    float wv[NORM_HELD];
    load_then_wait<EARLY>([&] { norm_weights_held(w, n, wv); });
    __shared__ float red[32];
    const float *xr = x + blockIdx.x * xs;
    float *orow = out + blockIdx.x * os;
    float ss = 0.0f;
    if (n <= NORM_HELD * (int64_t)blockDim.x) {
        float v[NORM_HELD];
#pragma unroll
        for (int j = 0; j < NORM_HELD; j++) {
            const int64_t i = threadIdx.x + j * (int64_t)blockDim.x;
            v[j] = i < n ? xr[i] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < NORM_HELD; j++)
            if (threadIdx.x + j * (int64_t)blockDim.x < n) ss += v[j] * v[j];
        ss = block_sum(ss, red) / (float)n;
        const float r = 1.0f / sqrtf(ss + eps);
#pragma unroll
        for (int j = 0; j < NORM_HELD; j++) {
            const int64_t i = threadIdx.x + j * (int64_t)blockDim.x;
            if (i < n) orow[i] = wv[j] * (v[j] * r);
        }
        return;
    }
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red) / (float)n;
    const float r = 1.0f / sqrtf(ss + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) orow[i] = w[i] * (xr[i] * r);
}

/* add then rmsnorm of the sum, one kernel (a pair the step records after attention
 * and after each MLP): x += y, out = rmsnorm(x); with z, first y += z (the shared
 * expert's output added to the routed ones'), as the ops would in turn. Each thread
 * rereads only what it wrote; the row is held as rmsnorm_kernel holds it. */
template <bool EARLY>
__global__ void add_rmsnorm_kernel(float *x, float *y, const float *z, const float *w, float *out, int64_t n,
                                   int64_t os, float eps) {
    coli_allow_next_grid();
    float wv[NORM_HELD];
    load_then_wait<EARLY>([&] { norm_weights_held(w, n, wv); });
    __shared__ float red[32];
    float *xr = x + blockIdx.x * n, *yr = y + blockIdx.x * n;
    const float *zr = z ? z + blockIdx.x * n : NULL;
    float ss = 0.0f;
    if (n <= NORM_HELD * (int64_t)blockDim.x) {
        float v[NORM_HELD], yv[NORM_HELD], zv[NORM_HELD];
#pragma unroll
        for (int j = 0; j < NORM_HELD; j++) {
            const int64_t i = threadIdx.x + j * (int64_t)blockDim.x;
            v[j] = i < n ? xr[i] : 0.0f;
            yv[j] = i < n ? yr[i] : 0.0f;
            zv[j] = i < n && zr ? zr[i] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < NORM_HELD; j++) {
            const int64_t i = threadIdx.x + j * (int64_t)blockDim.x;
            if (i >= n) continue;
            if (zr) yv[j] += zv[j], yr[i] = yv[j];
            v[j] += yv[j];
            xr[i] = v[j];
            ss += v[j] * v[j];
        }
        ss = block_sum(ss, red) / (float)n;
        const float r = 1.0f / sqrtf(ss + eps);
#pragma unroll
        for (int j = 0; j < NORM_HELD; j++) {
            const int64_t i = threadIdx.x + j * (int64_t)blockDim.x;
            if (i < n) out[blockIdx.x * os + i] = wv[j] * (v[j] * r);
        }
        return;
    }
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float yv = yr[i];
        if (zr) yv += zr[i], yr[i] = yv;
        const float v = xr[i] + yv;
        xr[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, red) / (float)n;
    const float r = 1.0f / sqrtf(ss + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[blockIdx.x * os + i] = w[i] * (xr[i] * r);
}

template <bool EARLY>
__global__ void layernorm_kernel(float *x, const float *w, const float *b, int64_t n, int64_t stride, float eps) {
    coli_allow_next_grid();
    /* a thread's first weight and bias, held */
    const bool mine = threadIdx.x < n;
    float w0 = 0.0f, b0 = 0.0f;
    load_then_wait<EARLY>([&] {
        if (mine) w0 = w[threadIdx.x], b0 = b[threadIdx.x];
    });
    __shared__ float red[32];
    float *xr = x + blockIdx.x * stride;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
    const float mean = block_sum(s, red) / (float)n;
    float v = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v += (xr[i] - mean) * (xr[i] - mean);
    const float r = 1.0f / sqrtf(block_sum(v, red) / (float)n + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        xr[i] = (xr[i] - mean) * r * (i == threadIdx.x ? w0 : w[i]) + (i == threadIdx.x ? b0 : b[i]);
}

/* One block per (row, head): the pairs are read whole before any is written. */
template <bool EARLY>
__global__ void rope_kernel(float *x, const float *inv_freq, const int64_t *pos, int64_t heads, int64_t row_stride,
                            int64_t head_stride, int64_t dim) {
    coli_allow_next_grid();
    const int64_t half = dim / 2;
    /* a thread's first frequency, held */
    float f0 = 0.0f;
    load_then_wait<EARLY>([&] {
        if (threadIdx.x < half) f0 = inv_freq[threadIdx.x];
    });
    __shared__ float v[512];
    const int64_t r = blockIdx.x / (uint32_t)heads, h = blockIdx.x % (uint32_t)heads; /* 32-bit */
    float *p = x + r * row_stride + h * head_stride;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) v[i] = p[i];
    __syncthreads();
    const float at = (float)(*pos + r);
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
        const float f = at * (i == threadIdx.x ? f0 : inv_freq[i]), c = cosf(f), s = sinf(f);
        const float a = v[2 * i], b = v[2 * i + 1];
        p[i] = a * c - b * s;
        p[half + i] = b * c + a * s;
    }
}

__global__ void write_rows_kernel(const float *src, float *dst, const int64_t *pos, int64_t width, int64_t src_stride,
                                  int64_t src_repeat, int64_t dst_stride, int64_t pos_rows) {
    STEP_KERNEL_BEGIN();
    const int64_t r = blockIdx.x;
    float *d = dst + (*pos * pos_rows + r) * dst_stride;
    const float *s = src + blockIdx.x / (uint32_t)src_repeat * src_stride; /* 32-bit: as rope_kernel's */
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

/* The better of (v, i) and the other lanes' pairs, on every lane: the larger value,
 * the lower index among equals; i < 0 is no candidate. The first maximum of a list
 * whose lanes each hold their own first maximum. */
__device__ inline void warp_best(float &v, int &i) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) {
        const float ov = COLI_SHFL_XOR(v, o);
        const int oi = COLI_SHFL_XOR(i, o);
        if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) v = ov, i = oi;
    }
}

#define ARGMAX_THREADS 1024

/* The first maximum of a row (NaN never wins, nothing above -FLT_MAX gives 0): a
 * block a row, four loads in flight a thread, then warp_best twice. */
__global__ void argmax_kernel(const float *logits, int32_t *ids, int vocab) {
    STEP_KERNEL_BEGIN();
    __shared__ float bv[ARGMAX_THREADS / WARP];
    __shared__ int bi[ARGMAX_THREADS / WARP];
    const float *row = logits + (int64_t)blockIdx.x * vocab;
    const int step = (int)blockDim.x;
    float best = -FLT_MAX;
    int at = -1;
    for (int i = (int)threadIdx.x; i < vocab; i += 4 * step) {
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = i + j * step < vocab ? row[i + j * step] : -FLT_MAX;
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (v[j] > best) best = v[j], at = i + j * step;
    }
    warp_best(best, at);
    const int lane = (int)threadIdx.x % WARP, w = (int)threadIdx.x / WARP;
    if (lane == 0) bv[w] = best, bi[w] = at;
    __syncthreads();
    if (w != 0) return;
    const int warps = (int)(blockDim.x + WARP - 1) / WARP;
    best = lane < warps ? bv[lane] : -FLT_MAX;
    at = lane < warps ? bi[lane] : -1;
    warp_best(best, at);
    if (lane == 0) ids[blockIdx.x] = at < 0 ? 0 : at;
}

__global__ void keep_ids_kernel(const int32_t *ids, int32_t *kept, const int64_t *pos, int64_t rows) {
    STEP_KERNEL_BEGIN();
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) kept[*pos + r] = ids[r];
}

/* ---- the router: a warp a row, coli_route's steps ------------------------------ */

/* The two largest of a multiset, merged across the warp: the same two values in any order. */
__device__ inline void warp_top2(float &a, float &b) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) {
        const float oa = COLI_SHFL_XOR(a, o), ob = COLI_SHFL_XOR(b, o);
        const float hi = fmaxf(a, oa), lo = fmaxf(fminf(a, oa), fmaxf(b, ob));
        a = hi, b = lo;
    }
}

/* A route op's operands, for route_kernel and for the decode's experts that route
 * their own row (moe_up_kernel's ROUTED). */
struct route_args {
    const float *logits, *bias;
    int32_t *idx;
    float *w;
    int experts, groups, topk_group, k, norm;
    float scaling;
    bool bias_early; /* as load_then_wait's EARLY: no op of the step writes the bias */
};

/* route_row's scratch, in shared memory. */
struct route_scratch {
    float score[1024], choice[1024], gscore[1024];
    unsigned char group_on[1024], taken[1024];
};

/* A float's order as an unsigned key: larger floats, larger keys. */
__device__ inline uint32_t order_key(float f) {
    const uint32_t u = __float_as_uint(f);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

/* Experts a lane holds on route_row_held's path, at most (route_row picks 2, 4 or 8:
 * every slot costs its instructions whether or not it holds an expert). */
#define ROUTE_HELD 8

/* route_row where the experts are one group, at most ROUTE_HELD a lane, and k at most
 * a warp, with no NaN among the choices: each lane holds its experts' choices as
 * order keys (-0 taken as +0, so equal floats give equal keys), and a pick is the
 * warp's largest key and the lowest expert holding it, two warp reductions where
 * warp_best's exchanges took ten, each waiting on the last; the same picks, the first
 * maximum as coli_route's. False (nothing written) where it does not apply. */
template <int H> __device__ inline bool route_row_held(const route_args &a, int64_t r, int32_t *ri, float *rw, int lane) {
    const int E = a.experts, k = a.k;
    if (a.groups != 1 || a.topk_group < 1 || E > H * WARP || k > WARP) return false;
    const float *lg = a.logits + r * E;
    float score[H];
    uint32_t key[H], nan = 0;
#pragma unroll
    for (int h = 0; h < H; h++) {
        const int e = lane + h * WARP;
        score[h] = 0.0f, key[h] = 0u; /* below every float's key: never picked */
        if (e < E) {
            score[h] = 1.0f / (1.0f + expf(-lg[e]));
            const float c = score[h] + a.bias[e];
            nan |= c != c;
            key[h] = order_key(c == 0.0f ? 0.0f : c);
        }
    }
    if (coli_warp_max(nan)) return false;
    float sum = 0.0f, mine = 0.0f;
    int32_t pick = 0;
    for (int j = 0; j < k; j++) {
        uint32_t lk = 0u, le = 0xFFFFFFFFu; /* this lane's largest key, its lowest expert */
        float ls = 0.0f;
#pragma unroll
        for (int h = 0; h < H; h++)
            if (key[h] > lk) lk = key[h], le = (uint32_t)(lane + h * WARP), ls = score[h];
        const uint32_t top = coli_warp_max(lk), e = coli_warp_min(lk == top ? le : 0xFFFFFFFFu);
        const float se = COLI_SHFL(ls, (int)(e % WARP)); /* its lane's own best is e */
#pragma unroll
        for (int h = 0; h < H; h++)
            if ((uint32_t)(lane + h * WARP) == e) key[h] = 0u;
        if (j == lane) mine = se, pick = (int32_t)e;
        sum += se;
    }
    sum += 1e-20f;
    if (lane < k) ri[lane] = pick, rw[lane] = (a.norm ? mine / sum : mine) * a.scaling;
    return true;
}

/* coli_route's steps for row r on one warp, its picks and weights into ri and rw:
 * route_row_held where it applies, else every pick a warp-wide first maximum
 * (warp_best), so each takes a few shuffles instead of a pass over the experts on one
 * thread. 32-bit indices: a 64-bit
 * division is a long software routine on a GPU. */
__device__ inline void route_row(const route_args &a, int64_t r, int32_t *ri, float *rw, route_scratch &s, int lane) {
    if (a.experts <= 2 * WARP ? route_row_held<2>(a, r, ri, rw, lane)
        : a.experts <= 4 * WARP ? route_row_held<4>(a, r, ri, rw, lane)
                                : route_row_held<ROUTE_HELD>(a, r, ri, rw, lane))
        return;
    const int E = a.experts, G = a.groups, per = E / G, k = a.k;
    const float *lg = a.logits + r * E;
    for (int e = lane; e < E; e += WARP) {
        s.score[e] = 1.0f / (1.0f + expf(-lg[e]));
        s.choice[e] = s.score[e] + a.bias[e];
        s.taken[e] = 0;
    }
    COLI_SYNC_WARP();
    for (int g = 0; g < G; g++) {
        float hi = -INFINITY, lo = -INFINITY;
        for (int e = g * per + lane; e < (g + 1) * per; e += WARP) {
            if (s.choice[e] > hi) lo = hi, hi = s.choice[e];
            else if (s.choice[e] > lo) lo = s.choice[e];
        }
        warp_top2(hi, lo);
        if (lane == 0) s.gscore[g] = hi + lo, s.group_on[g] = 0;
    }
    COLI_SYNC_WARP();
    for (int j = 0; j < a.topk_group; j++) {
        float v = -INFINITY;
        int best = -1;
        for (int g = lane; g < G; g += WARP)
            if (!s.group_on[g] && (best < 0 || s.gscore[g] > v)) v = s.gscore[g], best = g;
        warp_best(v, best);
        if (best < 0) break;
        COLI_SYNC_WARP(); /* every lane has read group_on before it changes */
        if (lane == 0) s.group_on[best] = 1;
        COLI_SYNC_WARP();
    }
    float sum = 0.0f, mine = 0.0f; /* mine: pick `lane`'s score */
    for (int j = 0; j < k; j++) {
        float v = -INFINITY;
        int best = -1;
        for (int e = lane; e < E; e += WARP)
            if (s.group_on[e / per] && !s.taken[e] && (best < 0 || s.choice[e] > v)) v = s.choice[e], best = e;
        warp_best(v, best);
        if (best < 0) best = 0;
        COLI_SYNC_WARP(); /* every lane has read taken before it changes */
        if (lane == 0) s.taken[best] = 1, ri[j] = best;
        if (j == lane) mine = s.score[best];
        sum += s.score[best];
        COLI_SYNC_WARP();
    }
    sum += 1e-20f;
    /* the weights: lane j writes pick j's, held since its pick (and j + 32's, ...) */
    for (int j = lane; j < k; j += WARP) {
        const float sj = j == lane ? mine : s.score[ri[j]];
        rw[j] = (a.norm ? sj / sum : sj) * a.scaling;
    }
}

/* A row a one-warp block. */
__global__ void route_kernel(route_args a) {
    STEP_KERNEL_BEGIN();
    __shared__ route_scratch s;
    const int64_t r = blockIdx.x;
    route_row(a, r, a.idx + r * a.k, a.w + r * a.k, s, (int)threadIdx.x);
}

/* ---- the routed experts -------------------------------------------------------- */

/* An expert's weight as the kernels read it: any layout (stored_value). */
struct dev_weight {
    const void *q;
    const float *scale;
    int64_t rows, cols;
    int32_t group, layout;
};

/* Where an int4 row's words find their scales (groups of a whole number of words,
 * row-major): 32-bit, a shift where the words a group are a power of two, as every
 * group the engine writes; a 64-bit division, here once a word, is a long software
 * routine on a GPU. Only int4 reads it; other formats get a harmless group of a word. */
template <int FORMAT> struct q4_scale_of {
    uint32_t per_row, words, shift; /* groups a row, words a group, log2 of that (32: not a power of two) */
    __device__ q4_scale_of(int64_t cols, int32_t group)
        : per_row((uint32_t)cols / (uint32_t)(FORMAT == COLI_FMT_Q4 ? group : fmt<FORMAT>::per_word)),
          words(FORMAT == COLI_FMT_Q4 ? (uint32_t)group / (uint32_t)fmt<FORMAT>::per_word : 1u), shift(0) {
        while (shift < 31 && (1u << shift) < words) shift++;
        if ((1u << shift) != words) shift = 32;
    }
    __device__ int64_t at(int64_t row, int64_t wn) const {
        const uint32_t w = (uint32_t)wn;
        return row * per_row + (shift < 32 ? w >> shift : w / words);
    }
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
        const q4_scale_of<FORMAT> scales(w.cols, w.group);
        for (int64_t wn = lane; wn < per_row; wn += WARP) {
            float v[PW];
            dequant<FORMAT>(q[w.layout ? mma_word(base + wn) : base + wn], v);
            const float *xs = x + wn * PW;
            float part = 0.0f;
#pragma unroll
            for (int k = 0; k < PW; k++) part += v[k] * xs[k];
            acc += FORMAT == COLI_FMT_Q4 ? part * w.scale[scales.at(row, wn)] : part;
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

/* weight_row_dot as a call, for the rare rows a kernel's held path does not take: its
 * registers then stay out of the held path's count. */
template <int FORMAT>
__device__ __noinline__ float row_dot_apart(const dev_weight &w, int64_t row, const float *x, int lane) {
    return weight_row_dot<FORMAT>(w, row, x, lane);
}

/* Experts whose weights' descriptions a block of moe_up_kernel or moe_down_kernel
 * copies to shared memory while the kernels before it still run (the step never
 * changes them), so an expert's pick waits on no load of its description. */
#define EXPERT_TABLE 128

/* A piece of a row of up to HELD words a lane in registers (HELD 2, 4 or ROW_HELD, the
 * fewest that hold the piece, picked by launch_moe; every slot costs its instructions
 * whether or not it holds a word): weight_row_dot's words path over words [first, end) with
 * every word (and int4 scale) of the lane loaded before any is used, so a decode's
 * expert rows wait for memory once, not once per few words. */
#define ROW_HELD 8
template <int FORMAT> __host__ __device__ inline int64_t piece_words(int64_t cols, int split) {
    return (cols / fmt<FORMAT>::per_word + split - 1) / split;
}

/* Warps a row of moe_up_kernel: each dots its piece of the row's words, so a
 * decode's few rows spread over that many times the warps and each waits on that
 * fraction of the loads (one warp a row left a decode's grid on half the SMs, each
 * warp's loads and sums in series: ncu, latency-bound). Four, or eight (a block's
 * every warp on one row) where four would leave a lane more than two words: each lane
 * then dequantises and sums fewer words in series, but a lane with one word in a slot
 * of two pays for both, so rows of two words a lane at four warps keep four
 * (bench/RESULTS.md). */
template <int FORMAT> __host__ __device__ inline int moe_up_split(int64_t cols) {
    return (piece_words<FORMAT>(cols, 4) + WARP - 1) / WARP > 2 ? 8 : 4;
}
template <int FORMAT, int HELD> __device__ inline bool row_held(const dev_weight &w, int split) {
    constexpr int PW = fmt<FORMAT>::per_word;
    return w.cols % PW == 0 && w.layout != TILE_LAYOUT && (FORMAT != COLI_FMT_Q4 || w.group % PW == 0) &&
           piece_words<FORMAT>(w.cols, split) <= HELD * WARP;
}

template <int FORMAT, int HELD>
__device__ inline void row_words(const dev_weight &w, int64_t row, int64_t first, int64_t end, int lane,
                                 uint32_t (&q)[HELD], float (&sc)[HELD]) {
    constexpr int PW = fmt<FORMAT>::per_word;
    const int64_t base = row * (w.cols / PW);
    const uint32_t *words = (const uint32_t *)w.q;
    const q4_scale_of<FORMAT> scales(w.cols, w.group);
#pragma unroll
    for (int j = 0; j < HELD; j++) {
        const int64_t wn = first + lane + (int64_t)j * WARP;
        q[j] = wn < end ? words[w.layout ? mma_word(base + wn) : base + wn] : 0u;
        sc[j] = FORMAT == COLI_FMT_Q4 && wn < end ? w.scale[scales.at(row, wn)] : 0.0f;
    }
}

/* The piece's dot from the held words, weight_row_dot's products (int8: scaled). */
template <int FORMAT, int HELD>
__device__ inline float row_dot_held(const dev_weight &w, int64_t row, int64_t first, int64_t end, const float *x,
                                     int lane, const uint32_t (&q)[HELD], const float (&sc)[HELD]) {
    constexpr int PW = fmt<FORMAT>::per_word;
    float acc = 0.0f;
    /* a guard, not a break: every word's loads of x may then be issued together */
#pragma unroll
    for (int j = 0; j < HELD; j++) {
        const int64_t wn = first + lane + (int64_t)j * WARP;
        if (wn < end) {
            float v[PW];
            dequant<FORMAT>(q[j], v);
            const float *xs = x + wn * PW;
            float part = 0.0f;
#pragma unroll
            for (int k = 0; k < PW; k++) part += v[k] * xs[k];
            acc += FORMAT == COLI_FMT_Q4 ? part * sc[j] : part;
        }
    }
    acc = warp_sum(acc);
    return FORMAT == COLI_FMT_Q8 ? acc * w.scale[row] : acc;
}

/* gu[pair][i] = silu(gate_e x . ) * (up_e x), pair = (row, j) with e = idx[pair];
 * `split` (moe_up_split) warps an output, their pieces added in piece order. ROUTED: the route
 * op before it is this kernel's too (a decode's few rows): each block's first warp
 * routes the block's row itself, so the experts wait for no kernel between the
 * router's logits and their loads, and the first block of each row writes the
 * row's picks and weights for moe_down_kernel. */
template <int FORMAT, bool ROUTED, int HELD>
__global__ void moe_up_kernel(const dev_weight *ws, const float *x, const int32_t *idx, float *gu, int64_t k,
                              int64_t inter, int64_t hid, int64_t experts, int split, route_args route) {
    __shared__ float parts[2][STEP_THREADS / WARP];
    __shared__ dev_weight table[2 * EXPERT_TABLE]; /* each expert's gate and up, as moe_down_kernel's */
    coli_allow_next_grid();
    const bool tabled = experts <= EXPERT_TABLE;
    if (tabled)
        for (int64_t t = threadIdx.x; t < 2 * experts; t += blockDim.x) table[t] = ws[3 * (t / 2) + t % 2];
    /* the route's bias into L1 before the wait, as load_then_wait's loads; a request,
     * not a load: the wait makes the earlier grids' writes visible to the loads after
     * it, so bias_early spares a wasted request rather than guarding a value */
    if (ROUTED && route.bias_early && threadIdx.x < WARP)
        for (int e = (int)threadIdx.x * 32; e < route.experts; e += WARP * 32) coli_prefetch_l1(route.bias + e);
    coli_wait_prior_grid();
    const int warp = threadIdx.x / WARP, piece = warp % split, lane = threadIdx.x % WARP;
    const int64_t pair = blockIdx.y, i = blockIdx.x * (int64_t)(blockDim.x / WARP / split) + warp / split;
    int32_t e;
    if constexpr (ROUTED) {
        __shared__ route_scratch s;
        __shared__ int32_t picks[16];
        __shared__ float weights[16];
        const int64_t row = blockIdx.y / (uint32_t)k, j = blockIdx.y % (uint32_t)k; /* 32-bit, as attention's */
        /* a pick past the route's (route_then_moe's one more) is in idx already, read beside the route */
        const int32_t fixed = j < route.k ? 0 : idx[pair];
        if (threadIdx.x < WARP) route_row(route, row, picks, weights, s, lane);
        __syncthreads();
        if (blockIdx.x == 0 && j == 0 && (int)threadIdx.x < route.k)
            route.idx[row * k + threadIdx.x] = picks[threadIdx.x], route.w[row * k + threadIdx.x] = weights[threadIdx.x];
        e = j < route.k ? picks[j] : fixed;
    } else {
        (void)route;
        e = idx[pair];
        __syncthreads(); /* the table's writes before its reads */
    }
    const bool on = i < inter && e >= 0 && e < experts;
    float g = 0.0f, u = 0.0f;
    if (on) {
        const float *xr = x + blockIdx.y / (uint32_t)k * hid;
        /* both read before either dot: one wait, not two */
        const dev_weight wg = tabled ? table[2 * e] : ws[3 * e], wu = tabled ? table[2 * e + 1] : ws[3 * e + 1];
        if (row_held<FORMAT, HELD>(wg, split) && row_held<FORMAT, HELD>(wu, split) && wg.cols == wu.cols) {
            const int64_t span = piece_words<FORMAT>(wg.cols, split), first = piece * span, per_row = wg.cols / fmt<FORMAT>::per_word;
            const int64_t end = first + span < per_row ? first + span : per_row;
            uint32_t qg[HELD], qu[HELD];
            float sg[HELD], su[HELD];
            row_words<FORMAT, HELD>(wg, i, first, end, lane, qg, sg);
            row_words<FORMAT, HELD>(wu, i, first, end, lane, qu, su);
            g = row_dot_held<FORMAT, HELD>(wg, i, first, end, xr, lane, qg, sg);
            u = row_dot_held<FORMAT, HELD>(wu, i, first, end, xr, lane, qu, su);
        } else if (piece == 0) { /* rows too long to hold: the first warp takes the whole row */
            g = weight_row_dot<FORMAT>(wg, i, xr, lane), u = weight_row_dot<FORMAT>(wu, i, xr, lane);
        }
    }
    if (lane == 0) parts[0][warp] = g, parts[1][warp] = u;
    __syncthreads();
    if (!on || piece != 0 || lane != 0) return;
    float gs = 0.0f, us = 0.0f;
    for (int q = 0; q < split; q++) gs += parts[0][warp + q], us += parts[1][warp + q];
    gu[pair * inter + i] = dev_silu(gs) * us;
}

/* A row's output: sum over its picks in ascending expert order (ties in pick order)
 * of w * value(pair, e), a pick outside the experts adding 0; the one order both
 * expert paths add in. ri and rw: the row's k picks and weights, first_pair its first
 * pair (row * k). Each step takes the least (expert, pick) past the last one added,
 * k passes over k picks: a sorted copy of the picks would sit in local memory. */
template <typename Value>
__device__ inline float expert_sum_of(const int32_t *ri, const float *rw, int64_t first_pair, int64_t k,
                                      int64_t experts, Value value) {
    float acc = 0.0f;
    int32_t last_e = INT32_MIN;
    int last_j = -1;
    for (int n = 0; n < (int)k; n++) {
        int best = -1;
        int32_t best_e = 0;
        for (int j = 0; j < (int)k; j++) {
            const int32_t e = ri[j];
            const bool past = e > last_e || (e == last_e && j > last_j);
            if (past && (best < 0 || e < best_e)) best = j, best_e = e;
        }
        last_e = best_e, last_j = best;
        acc += (best_e >= 0 && best_e < experts ? value(first_pair + best, best_e) : 0.0f) * rw[best];
    }
    return acc;
}

template <typename Value>
__device__ inline float expert_sum(const int32_t *idx, const float *w, int64_t r, int64_t k, int64_t experts, Value value) {
    return expert_sum_of(idx + r * k, w + r * k, r * k, k, experts, value);
}

/* The down projections of a decode's picks, value by value: vals[pick] of an output. */
struct held_value {
    const float *vals;
    int64_t first_pair;
    __device__ float operator()(int64_t pair, int32_t) const { return vals[pair - first_pair]; }
};

/* (output, pick) dots a warp of moe_down_kernel takes at once: a decode's down rows
 * are its experts' intermediate width, a word a lane, so a warp with one dot waited
 * on memory for a word; with down_items every load of them is in flight together.
 * int4 two: its words hold 8 inputs each, and four items' took more registers than
 * the kernel's bound leaves; int8 two as well: with the up kernel on eight warps a
 * row, two items a warp and twice the warps were the faster (bench/RESULTS.md). */
template <int FORMAT> __host__ __device__ constexpr int down_items() { return FORMAT == COLI_FMT_F32 ? 4 : 2; }

/* Outputs a block of moe_down_kernel takes: its warps share them out down_items
 * (output, pick) dots each, so a row's k dots run side by side. */
template <int FORMAT> __host__ __device__ inline int64_t moe_down_outputs(int64_t k) {
    const int64_t items = STEP_THREADS / WARP * down_items<FORMAT>();
    return k > 0 && k < items ? items / k : 1;
}

/* Whether a down row's words fit a word a lane on moe_down_kernel's held path:
 * weight_row_dot's words path. */
template <int FORMAT> __device__ inline bool down_held(const dev_weight &w) {
    constexpr int PW = fmt<FORMAT>::per_word;
    return w.cols % PW == 0 && w.layout != TILE_LAYOUT && (FORMAT != COLI_FMT_Q4 || w.group % PW == 0) &&
           w.cols / PW <= WARP;
}

/* out[row][d] = expert_sum of the down rows d: a warp down_items (d, pick) dots, each
 * weight_row_dot's sums (a word a lane, every item's loads issued before any is
 * used), then a thread an output adds its picks in that order. Four blocks an SM, so
 * 64 registers a thread at most (HIP reads the number as waves an EU: 1): it is launched
 * early and holds its room while the experts' first kernel runs, and at two blocks
 * an SM (124 registers) that room was every register the SM had, so the shared
 * expert's kernels beside it could not start until the first kernel's blocks left.
 * An item holds no more than its word, scale and inputs (its weight's description is
 * read again from the table where a dot needs it). HALVES 2 (int4 rows of at most 16
 * words, launch_moe): each half of a team dots its own items, so a block takes twice
 * the outputs and the grid (launched early, holding its room) half the blocks.
 * per_block: the outputs a block takes (moe_down_outputs, times HALVES). */
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) || defined(COLI_USE_HIP)
#define DOWN_MIN_BLOCKS 1
#else
#define DOWN_MIN_BLOCKS 4
#endif
/* A half team's sum, lanes [16 h, 16 h + 16): warp_sum's pairs after its first
 * (which, with the other half's lanes 0, adds 0), so the same bits as warp_sum over
 * a dot whose lanes past 16 hold nothing. */
__device__ inline float half_sum(float v) {
#pragma unroll
    for (int o = WARP / 4; o > 0; o >>= 1) v += COLI_SHFL_XOR(v, o);
    return v;
}

template <int FORMAT, int HALVES>
__global__ void __launch_bounds__(STEP_THREADS, DOWN_MIN_BLOCKS) moe_down_kernel(const dev_weight *ws, const float *gu, const int32_t *idx, const float *w, float *out,
                                int64_t k, int64_t inter, int64_t hid, int64_t experts, int per_block) {
    constexpr int PW = fmt<FORMAT>::per_word, ITEMS = down_items<FORMAT>();
    __shared__ float vals[STEP_THREADS / WARP * ITEMS * HALVES];
    __shared__ dev_weight table[EXPERT_TABLE];
    __shared__ int32_t picks[16];
    __shared__ float weights[16];
    coli_allow_next_grid();
    const bool tabled = experts <= EXPERT_TABLE;
    if (tabled)
        for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) table[e] = ws[3 * e + 2];
    coli_wait_prior_grid();
    /* 32-bit: a decode's outputs and items are few */
    const int r = blockIdx.y, kk = (int)k, per = per_block, d0 = blockIdx.x * per, items = per * kk;
    if (threadIdx.x < k) picks[threadIdx.x] = idx[r * k + threadIdx.x], weights[threadIdx.x] = w[r * k + threadIdx.x];
    __syncthreads();
    /* HALVES 2: each half of a team its own items (rows of at most 16 words) */
    const int nw = blockDim.x / WARP, half = HALVES == 2 ? threadIdx.x % WARP / (WARP / 2) : 0;
    const int lane = HALVES == 2 ? threadIdx.x % (WARP / 2) : threadIdx.x % WARP;
    for (int first = threadIdx.x / WARP * ITEMS * HALVES; first < items; first += nw * ITEMS * HALVES) {
        uint32_t q[ITEMS], held = 0u, live = 0u;
        float sc[ITEMS], rs[ITEMS], xv[ITEMS][PW];
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            const int item = first + i * HALVES + half, j = item % kk;
            const int64_t d = d0 + item / kk;
            const int32_t e = item < items ? picks[j] : -1;
            q[i] = 0u, sc[i] = 0.0f, rs[i] = 0.0f;
#pragma unroll
            for (int c = 0; c < PW; c++) xv[i][c] = 0.0f;
            if (item >= items || d >= hid || e < 0 || e >= experts) continue;
            live |= 1u << i;
            const dev_weight &wt = tabled ? table[e] : ws[3 * e + 2];
            if (!down_held<FORMAT>(wt)) continue;
            held |= 1u << i;
            const int64_t per_row = wt.cols / PW, at = d * per_row + lane;
            if (lane >= per_row) continue; /* its word adds nothing: q, scale and inputs 0 */
            q[i] = ((const uint32_t *)wt.q)[wt.layout ? mma_word(at) : at];
            if (FORMAT == COLI_FMT_Q4) sc[i] = wt.scale[q4_scale_of<FORMAT>(wt.cols, wt.group).at(d, lane)];
            if (FORMAT == COLI_FMT_Q8) rs[i] = wt.scale[d];
            const float *xs = gu + ((int64_t)r * k + j) * inter + lane * PW;
#pragma unroll
            for (int c = 0; c < PW; c++) xv[i][c] = xs[c];
        }
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            const int item = first + i * HALVES + half;
            float v = 0.0f;
            if (HALVES == 2 || (held >> i & 1u)) { /* HALVES 2 is launched only where every row is held */
                float wv[PW];
                dequant<FORMAT>(q[i], wv);
                float part = 0.0f;
#pragma unroll
                for (int c = 0; c < PW; c++) part += wv[c] * xv[i][c];
                const float pre = FORMAT == COLI_FMT_Q4 ? part * sc[i] : part;
                const float acc = HALVES == 2 ? half_sum(pre) : warp_sum(pre);
                v = FORMAT == COLI_FMT_Q8 ? acc * rs[i] : acc;
            } else if (live >> i & 1u) {
                const int j = item % kk;
                const int32_t e = picks[j];
                v = row_dot_apart<FORMAT>(tabled ? table[e] : ws[3 * e + 2], d0 + item / kk,
                                           gu + ((int64_t)r * k + j) * inter, lane);
            }
            if (lane == 0 && item < items) vals[item] = v;
        }
    }
    __syncthreads();
    const int64_t d = d0 + threadIdx.x;
    if ((int)threadIdx.x < per && d < hid)
        out[r * hid + d] = expert_sum_of(picks, weights, r * k, k, experts, held_value{vals + threadIdx.x * k, r * k});
}

/* Many rows (a prefill): the pairs grouped by expert, so that a block reads its
 * expert's rows once for up to MOE_TILE pairs routed to it (from L1 after the
 * first) instead of once a pair, and cut into tiles of at most MOE_TILE pairs so
 * that an expert most rows pick is spread over many blocks. Each pair's output is
 * its own and the combine adds a row's in expert order, so the order within a
 * group does not matter. */
#define MOE_TILE 8

/* The most tiles `pairs` pairs over `experts` experts can make. */
static inline int64_t moe_tiles_max(int64_t pairs, int64_t experts) { return pairs / MOE_TILE + experts; }

/* order[]: the pairs (row * k + j) sorted into groups by expert; tiles[3t..3t+2]:
 * tile t's expert and its range of order, for t < *n_tiles. One block. */
__global__ void moe_group_kernel(const int32_t *idx, int32_t *order, int32_t *tiles, int32_t *n_tiles, int pairs,
                                 int experts) {
    STEP_KERNEL_BEGIN();
    __shared__ int32_t next[1025];
    for (int e = threadIdx.x; e <= experts; e += blockDim.x) next[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x)
        if (idx[p] >= 0 && idx[p] < experts) atomicAdd(&next[idx[p] + 1], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int t = 0;
        for (int e = 0; e < experts; e++) {
            for (int s = next[e]; s < next[e] + next[e + 1]; s += MOE_TILE, t++) {
                const int end = next[e] + next[e + 1];
                tiles[3 * t] = e, tiles[3 * t + 1] = s, tiles[3 * t + 2] = s + MOE_TILE < end ? s + MOE_TILE : end;
            }
            next[e + 1] += next[e];
        }
        *n_tiles = t;
    }
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x)
        if (idx[p] >= 0 && idx[p] < experts) order[atomicAdd(&next[idx[p]], 1)] = p;
}

/* Tile blockIdx.y's pairs through its expert, a warp an output row r: the gate and
 * up rows (UP: out = gu[pair], from x's rows) or the down row (out = eo[pair], from gu[pair]). */
template <int FORMAT, bool UP>
__global__ void moe_tile_kernel(const dev_weight *ws, const float *in, const int32_t *order, const int32_t *tiles,
                                const int32_t *n_tiles, float *out, int64_t k, int64_t rows, int64_t cols) {
    STEP_KERNEL_BEGIN();
    const int t = blockIdx.y, lane = threadIdx.x % WARP;
    const int64_t r = blockIdx.x * (int64_t)(blockDim.x / WARP) + threadIdx.x / WARP;
    if (t >= *n_tiles || r >= rows) return;
    const int e = tiles[3 * t];
    for (int s = tiles[3 * t + 1]; s < tiles[3 * t + 2]; s++) {
        const int64_t pair = order[s];
        float v;
        if (UP) {
            const float *xr = in + pair / k * cols;
            v = dev_silu(weight_row_dot<FORMAT>(ws[3 * e], r, xr, lane)) * weight_row_dot<FORMAT>(ws[3 * e + 1], r, xr, lane);
        } else {
            v = weight_row_dot<FORMAT>(ws[3 * e + 2], r, in + pair * cols, lane);
        }
        if (lane == 0) out[pair * rows + r] = v;
    }
}

/* Whether moe_down_rows_kernel reads this down weight: whole words a row, in the ABI's
 * or the mma layout, and a tile's gu rows small enough to stage (MOE_STAGE_BYTES). */
#define MOE_STAGE_BYTES (32 * 1024)
static inline bool moe_rows_path(int32_t format, int64_t cols, int32_t group, int32_t layout) {
    const int per_word = format == COLI_FMT_Q4 ? 8 : format == COLI_FMT_Q8 ? 4 : 1;
    return layout != TILE_LAYOUT && cols % per_word == 0 && (format != COLI_FMT_Q4 || group % per_word == 0) &&
           cols * MOE_TILE * (int64_t)sizeof(float) <= MOE_STAGE_BYTES;
}

/* The grouped path's down projections, a thread an output row over its tile's pairs:
 * the tile's gu rows staged in shared memory (every thread of a warp reads the same
 * value: a broadcast), each weight word read once and used for all of the tile's
 * pairs. The warp-a-row form (moe_tile_kernel) reduces a 128-wide dot a pair across
 * a warp, whose shuffles cost more than its reads. The same sums as weight_row_dot
 * (a word's products, times its group's scale; the row's scale last), in word order. */
template <int FORMAT>
__global__ void moe_down_rows_kernel(const dev_weight *ws, const float *gu, const int32_t *order, const int32_t *tiles,
                                     const int32_t *n_tiles, float *eo, int64_t rows, int64_t cols) {
    STEP_KERNEL_BEGIN();
    extern __shared__ float stage[]; /* [pair of the tile][cols] */
    constexpr int PW = fmt<FORMAT>::per_word;
    const int t = blockIdx.y;
    if (t >= *n_tiles) return;
    const int e = tiles[3 * t], s0 = tiles[3 * t + 1], n = tiles[3 * t + 2] - s0;
    for (int64_t i = threadIdx.x; i < n * cols; i += blockDim.x) stage[i] = gu[(int64_t)order[s0 + i / cols] * cols + i % cols];
    __syncthreads();
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const dev_weight &w = ws[3 * e + 2];
    const int64_t per_row = cols / PW;
    const uint32_t *q = (const uint32_t *)w.q + r * per_row;
    const q4_scale_of<FORMAT> scales(cols, w.group);
    float acc[MOE_TILE];
#pragma unroll
    for (int p = 0; p < MOE_TILE; p++) acc[p] = 0.0f;
    for (int64_t wn = 0; wn < per_row; wn++) {
        float v[PW];
        /* the mma layout keeps a row's words within its 16-word chunks: the map is per row */
        dequant<FORMAT>(q[w.layout ? mma_word(wn) : wn], v);
        const float scale = FORMAT == COLI_FMT_Q4 ? w.scale[scales.at(r, wn)] : 1.0f;
        const float *xs = stage + wn * PW;
#pragma unroll
        for (int p = 0; p < MOE_TILE; p++) {
            if (p >= n) break;
            float part = 0.0f;
#pragma unroll
            for (int k = 0; k < PW; k++) part += v[k] * xs[p * cols + k];
            acc[p] += FORMAT == COLI_FMT_Q4 ? part * scale : part;
        }
    }
    for (int p = 0; p < n; p++) eo[(int64_t)order[s0 + p] * rows + r] = FORMAT == COLI_FMT_Q8 ? acc[p] * w.scale[r] : acc[p];
}

/* eo[pair][d], the grouped path's down projections. */
struct part_row {
    const float *eo;
    int64_t hid, d;
    __device__ float operator()(int64_t pair, int32_t) const { return eo[pair * hid + d]; }
};

/* out[row][d] = expert_sum of the experts' outputs (moe_down_kernel's sum), a thread an output. */
__global__ void moe_combine_kernel(const float *eo, const int32_t *idx, const float *w, float *out, int64_t k,
                                   int64_t hid, int64_t experts) {
    STEP_KERNEL_BEGIN();
    const int64_t r = blockIdx.y, d = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (d >= hid) return;
    out[r * hid + d] = expert_sum(idx, w, r, k, experts, part_row{eo, hid, d});
}

/* ---- the DSA indexer ------------------------------------------------------------ */

/* Whether this block is the last of `blocks` to pass here for `counter` (zero
 * between runs: the last one sets it back). Each block's writes before it are seen by
 * the last one, which reads them with COLI_LOAD_GRID. */
__device__ inline bool last_block(int32_t *counter, int32_t blocks) {
    __shared__ int last;
    __threadfence(); /* each thread's writes, before the count that says they are done */
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1) == blocks - 1;
        if (last) *counter = 0;
    }
    __syncthreads();
    if (last) __threadfence();
    return last != 0;
}

/* Values of the scores each thread of the selection holds in registers (the rest,
 * past SELECT_HELD * blockDim.x keys, are read again each pass). */
#define SELECT_HELD 16

/* The radix selection's bin, in the first warp: the highest bin b whose count with
 * the bins above it reaches need; need then less the bins above b. Lane l sums bins
 * 8l..8l+7, the lanes' sums from the top are scanned, and the lane where they reach
 * need walks its eight: what a walk down from bin 255 finds (the bins matching the
 * prefix hold at least need keys). */
__device__ inline void select_bin(const uint32_t *hist, int shift, uint32_t prefix, uint32_t need,
                                  uint32_t *prefix_out, uint32_t *need_out, uint32_t *equal_out) {
    const int lane = threadIdx.x;
    uint32_t own = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) own += hist[8 * lane + j];
    uint32_t above = own; /* this lane's bins and every higher lane's */
#pragma unroll
    for (int o = 1; o < WARP; o <<= 1) {
        const uint32_t t = COLI_SHFL(above, lane + o < WARP ? lane + o : lane);
        if (lane + o < WARP) above += t;
    }
    uint32_t reach = above >= need; /* the lanes 0..L, L the lane where the sums reach need */
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) reach += COLI_SHFL_XOR(reach, o);
    const int at = reach ? (int)reach - 1 : 0;
    if (lane != at) return;
    uint32_t left = need - (above - own);
    int b = 8 * lane + 7;
    for (; b > 8 * lane && hist[b] < left; b--) left -= hist[b];
    *prefix_out = prefix | ((uint32_t)b << shift);
    *need_out = left;
    *equal_out = hist[b];
}

/* How many of v the threads before this one hold (a block's exclusive scan). */
__device__ inline uint32_t block_before(uint32_t v, uint32_t *warps) {
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    uint32_t incl = v;
#pragma unroll
    for (int o = 1; o < WARP; o <<= 1) {
        const uint32_t t = COLI_SHFL(incl, lane >= o ? lane - o : lane);
        if (lane >= o) incl += t;
    }
    __syncthreads();
    if (lane == WARP - 1) warps[w] = incl;
    __syncthreads();
    uint32_t before = incl - v;
    for (int i = 0; i < w; i++) before += warps[i];
    return before;
}

/* The topk best of a query's `valid` scores into its selection s (ties to the
 * earlier key), and s cleared from valid to total: the topk-th largest key by radix
 * selection (a byte a pass, its held keys in registers), then the keys above it
 * and the earliest of those equal to it. Where every key equal to it is taken (no
 * tie at the cut) each key is decided alone; else each thread takes a stretch of
 * keys in order and counts the equal ones before it. */
__device__ inline void select_topk(const float *sc, uint8_t *s, int64_t valid, int64_t total, uint32_t need) {
    __shared__ uint32_t hist[256], warps[STEP_THREADS / WARP];
    __shared__ uint32_t prefix_s, need_s, equal_s;
    const int64_t held_n = (int64_t)SELECT_HELD * blockDim.x;
    uint32_t held[SELECT_HELD];
#pragma unroll
    for (int k = 0; k < SELECT_HELD; k++) {
        const int64_t u = threadIdx.x + (int64_t)k * blockDim.x;
        held[k] = u < valid ? order_key(COLI_LOAD_GRID(sc + u)) : 0u;
    }
    uint32_t prefix = 0, equal = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        const uint32_t mask = shift == 24 ? 0u : 0xFFFFFFFFu << (shift + 8);
#pragma unroll
        for (int k = 0; k < SELECT_HELD; k++)
            if (threadIdx.x + (int64_t)k * blockDim.x < valid && (held[k] & mask) == prefix)
                atomicAdd(&hist[(held[k] >> shift) & 0xFF], 1u);
        for (int64_t u = held_n + threadIdx.x; u < valid; u += blockDim.x) {
            const uint32_t key = order_key(COLI_LOAD_GRID(sc + u));
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xFF], 1u);
        }
        __syncthreads();
        if (threadIdx.x < WARP) select_bin(hist, shift, prefix, need, &prefix_s, &need_s, &equal_s);
        __syncthreads();
        prefix = prefix_s, need = need_s, equal = equal_s;
    }
    if (need == equal) {
#pragma unroll
        for (int k = 0; k < SELECT_HELD; k++) {
            const int64_t u = threadIdx.x + (int64_t)k * blockDim.x;
            if (u < valid) s[u] = held[k] >= prefix;
        }
        for (int64_t u = held_n + threadIdx.x; u < valid; u += blockDim.x)
            s[u] = order_key(COLI_LOAD_GRID(sc + u)) >= prefix;
    } else {
        const int64_t each = (valid + blockDim.x - 1) / blockDim.x, u0 = threadIdx.x * each;
        uint32_t eq = 0;
        for (int64_t u = u0; u < u0 + each && u < valid; u++) eq += order_key(COLI_LOAD_GRID(sc + u)) == prefix;
        uint32_t before = block_before(eq, warps);
        for (int64_t u = u0; u < u0 + each && u < valid; u++) {
            const uint32_t key = order_key(COLI_LOAD_GRID(sc + u));
            uint8_t on = key > prefix;
            if (key == prefix) on = before++ < need;
            s[u] = on;
        }
    }
    for (int64_t u = valid + threadIdx.x; u < total; u += blockDim.x) s[u] = 0;
}

/* Heads of the indexer a warp scores side by side: their sums are independent, so
 * their loads and lane exchanges overlap. */
#define INDEX_HEADS 4

/* Blocks of the indexer an SM holds at least: its grid is large (a prefill's rows
 * times its keys / 8), and the selection's held scores would otherwise take twice
 * the registers of the scoring and halve the blocks (nvcc -Xptxas -v: 80 registers
 * against 40 this way, 8 bytes spilled). HIP reads the number as waves an EU: 1. */
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) || defined(COLI_USE_HIP)
#define INDEX_MIN_BLOCKS 1
#else
#define INDEX_MIN_BLOCKS 6
#endif

/* The DSA indexer, one kernel: a block per 8 keys of a query (row), a warp a key.
 * A query that sees no more than topk keys selects them all, and its scores are not
 * needed: each block writes its keys' selection and leaves. Else scores[row][t] for
 * keys t <= p + row (the heads' terms added in head order), and the last of the
 * row's blocks to finish (counts[row]) selects the topk best (select_topk). */
__global__ void __launch_bounds__(STEP_THREADS, INDEX_MIN_BLOCKS)
    indexer_kernel(const float *iq, const float *iw, const float *keys, float *scores, uint8_t *sel, int32_t *counts,
                   const int64_t *pos, int64_t heads, int64_t dim, int64_t stride, int64_t topk, int64_t rows,
                   float weight_scale) {
    STEP_KERNEL_BEGIN();
    const int64_t row = blockIdx.y, valid = *pos + row + 1, total = *pos + rows;
    const int64_t per = blockDim.x / WARP, b0 = blockIdx.x * per;
    uint8_t *s = sel + row * stride;
    if (valid <= topk) {
        for (int64_t t = b0 + threadIdx.x; t < b0 + per && t < total; t += blockDim.x) s[t] = t < valid;
        return;
    }
    if (b0 >= valid) return; /* the whole block: past the query's keys, and not counted */
    const int64_t t = b0 + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    float *sc = scores + row * stride;
    if (t < valid) {
        const float scale = 1.0f / sqrtf((float)dim);
        float total_score = 0.0f;
        for (int64_t h0 = 0; h0 < heads; h0 += INDEX_HEADS) {
            float d[INDEX_HEADS];
#pragma unroll
            for (int j = 0; j < INDEX_HEADS; j++) d[j] = 0.0f;
            for (int64_t i = lane; i < dim; i += WARP) {
                const float kv = keys[t * dim + i];
#pragma unroll
                for (int j = 0; j < INDEX_HEADS; j++)
                    if (h0 + j < heads) d[j] += iq[(row * heads + h0 + j) * dim + i] * kv;
            }
#pragma unroll
            for (int j = 0; j < INDEX_HEADS; j++) d[j] = warp_sum(d[j]) * scale;
#pragma unroll
            for (int j = 0; j < INDEX_HEADS; j++)
                if (h0 + j < heads) total_score += (iw[row * heads + h0 + j] * weight_scale) * (d[j] > 0.0f ? d[j] : 0.0f);
        }
        if (lane == 0) sc[t] = total_score;
    }
    if (!last_block(counts + row, (int32_t)((valid + per - 1) / per))) return;
    select_topk(sc, s, valid, total, (uint32_t)topk);
}

/* ---- attention ------------------------------------------------------------------- */

/* Keys a block of attend_part_kernel takes (attend_span): where there are
 * ATTEND_MANY (query, head) pairs or more (a prefill: they fill the GPU),
 * ATTEND_CHUNK; fewer, as a decoded token's, ATTEND_SHORT while the query's keys fit
 * one ATTEND_CHUNK and ATTEND_SPLIT past that, so those few pairs still spread over
 * many blocks and each walks few keys (one block a pair walking all of a short
 * query's keys took most of a decoded token's attention time); doubled where the
 * grid's rows would not hold the spans. A query whose keys fit one span takes them in
 * one block, which writes its output itself. */
#define ATTEND_CHUNK 256
#define ATTEND_SPLIT 64
#define ATTEND_SHORT 32
#define ATTEND_MANY 128

/* The blocks a query of `keys` keys may split into (the grid's y; a part each). */
static inline int64_t attend_chunks(int64_t keys) { return (keys + ATTEND_SPLIT - 1) / ATTEND_SPLIT; }

/* The grid's rows for `pairs` (query, head) pairs of up to `keys` keys: a decode's few
 * pairs ATTEND_DECODE_ROWS (more only where spans of ATTEND_CHUNK need more), their
 * spans growing with the query's keys (attend_span). The grid is recorded once for
 * the step's longest query; a row a span of ATTEND_SPLIT keys gave a long step 64
 * rows, each block launched, waiting for the grid before and holding its room on an
 * SM, most of them leaving at once at a short position. Fewer rows of longer spans
 * decode a long context faster, down to where the blocks are too few to keep enough
 * loads in flight (16 rows of 256 keys: bench/RESULTS.md). */
#define ATTEND_DECODE_ROWS 32
static inline int64_t attend_rows(int64_t pairs, int64_t keys) {
    const int64_t all = attend_chunks(keys), least = (keys + ATTEND_CHUNK - 1) / ATTEND_CHUNK;
    if (pairs >= ATTEND_MANY || all <= ATTEND_DECODE_ROWS) return all;
    return least > ATTEND_DECODE_ROWS ? least : ATTEND_DECODE_ROWS;
}

/* Keys scored at once by a warp of attend_part_kernel: lanes in groups of
 * 32 / ATTEND_KEYS, a key a group, so a warp has that many keys' loads in flight. */
#define ATTEND_KEYS 4

/* Blocks of attend_part_kernel an SM holds at least: a long context's decode has 512
 * of them (16 pairs x 32 rows), one wave at four an SM, two at three (where the warp
 * softmax's registers took it unbounded). HIP reads the number as waves an EU: 1. */
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) || defined(COLI_USE_HIP)
#define ATTEND_MIN_BLOCKS 1
#else
#define ATTEND_MIN_BLOCKS 4
#endif

/* Values of a query's and a key's row a lane of attend_part_kernel holds (rows up to
 * 32 / ATTEND_KEYS * ATTEND_QK_HELD long): a loop over the row waited on memory once
 * per few values. */
#define ATTEND_QK_HELD 16

/* Values of v a thread of attend_part_kernel may hold from the start (v_held). */
#define ATTEND_V_HELD 8

__device__ inline int64_t attend_span(int64_t last) {
    if (gridDim.x >= ATTEND_MANY) return ATTEND_CHUNK;
    uint32_t span = last < ATTEND_CHUNK ? ATTEND_SHORT : ATTEND_SPLIT;
    while (span < ATTEND_CHUNK && (uint32_t)last / span + 1 > gridDim.y) span *= 2;
    return span;
}

/* A block's sum of a[] over its threads in groups of `width` (width <= blockDim.x):
 * thread g * width + d gives its part of column d; the threads below width get the
 * column's total, the groups' parts added in group order. */
__device__ inline float columns_sum(float a, float *acc, int64_t width) {
    const int64_t groups = blockDim.x / (uint32_t)width;
    acc[threadIdx.x] = a;
    __syncthreads();
    float total = 0.0f;
    if (threadIdx.x < width)
        for (int64_t g = 0; g < groups; g++) total += acc[g * width + threadIdx.x];
    return total;
}

/* attend_part_kernel's scores of keys t0..t1 into p[t - t0] (-inf where not selected),
 * a warp ATTEND_KEYS keys at a time. CHOSEN (a long query's): `flags` is the span's
 * selection in shared memory, by t - t0, and only a selected key's row is read; else
 * `flags` is the query's selection, by t, and every key's row is read, so that no load
 * waits on its selection byte's. Two instances, not a flag: a run-time choice let the
 * key's loads wait on the byte in both. */
template <bool CHOSEN>
__device__ inline void attend_scores(const float *qr, const float *k, const uint8_t *flags, float *p, int64_t t0,
                                     int64_t t1, int64_t heads, int64_t h, int64_t qk, float scaling) {
    constexpr int G = WARP / ATTEND_KEYS; /* lanes a key */
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP, sub = lane % G;
    for (int64_t base = t0 + warp * ATTEND_KEYS; base <= t1; base += nw * ATTEND_KEYS) {
        const int64_t t = base + lane / G;
        const bool in = t <= t1, on = in && flags[CHOSEN ? t - t0 : t];
        float d = 0.0f;
        if (CHOSEN ? on : in) {
            const float *kt = k + (t * heads + h) * qk;
            if (qk <= G * ATTEND_QK_HELD) { /* every load of the row in flight at once, then the sum */
                float qv[ATTEND_QK_HELD], kv[ATTEND_QK_HELD];
#pragma unroll
                for (int j = 0; j < ATTEND_QK_HELD; j++) {
                    const int64_t i = sub + j * G;
                    qv[j] = i < qk ? qr[i] : 0.0f, kv[j] = i < qk ? kt[i] : 0.0f;
                }
#pragma unroll
                for (int j = 0; j < ATTEND_QK_HELD; j++)
                    if (sub + j * G < qk) d += qv[j] * kv[j];
            } else {
                for (int64_t i = sub; i < qk; i += G) d += qr[i] * kt[i];
            }
        }
#pragma unroll
        for (int o = G / 2; o > 0; o >>= 1) d += COLI_SHFL_XOR(d, o);
        if (in && sub == 0) p[t - t0] = on ? d * scaling : -INFINITY;
    }
}

/* One block per (row, head, span of keys): the span's selected scores, their max
 * m, sum of exp(score - m) and the exp-weighted v, into part[(pair, chunk)] as
 * [m, sum, v...] (span: attend_span); a span with no selected key has sum 0. The spans past the query
 * leave at once; the last of the others to finish (counts[pair]) combines them:
 * out = sum over spans of w_c v_c / sum over spans of w_c sum_c, w_c = exp(m_c - M)
 * (0 for a span with no selected key), M the largest m of those with one. Where the
 * query's keys fit one span its block writes out itself. */
__global__ void __launch_bounds__(STEP_THREADS, ATTEND_MIN_BLOCKS) attend_part_kernel(const float *q, const float *k, const float *v, const uint8_t *sel, float *part,
                                   int32_t *counts, float *attn, const int64_t *pos, int64_t heads, int64_t qk,
                                   int64_t vdim, int64_t stride, float scaling) {
    coli_allow_next_grid(); /* the wait is below, after the earlier rows are asked for */
    __shared__ float red[32], p[ATTEND_CHUNK], acc[STEP_THREADS];
    /* 32-bit divisions here and below: a 64-bit one is a long software routine on a GPU */
    const int64_t pair = blockIdx.x, row = blockIdx.x / (uint32_t)heads, h = blockIdx.x % (uint32_t)heads;
    const int64_t last = *pos + row;
    const int64_t span = attend_span(last);
    const int64_t t0 = (int64_t)blockIdx.y * span, t1 = t0 + span - 1 < last ? t0 + span - 1 : last;
    if (t0 > last) return; /* a whole block leaves together: no barrier is skipped by some */
    float *pp = part + pair * gridDim.y * (vdim + 2), *out = pp + blockIdx.y * (vdim + 2);
    const float *qr = q + pair * qk;
    const uint8_t *sr = sel + row * stride;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    /* the weighted v below: groups of vdim threads take every groups-th key; where the
     * span's v fits ATTEND_V_HELD values a thread, they are loaded now, beside the keys,
     * so the sum waits for no load after the softmax */
    const int64_t groups = vdim <= (int64_t)blockDim.x ? blockDim.x / (uint32_t)vdim : 0;
    const int64_t g = groups ? threadIdx.x / (uint32_t)vdim : 0, d = groups ? threadIdx.x % (uint32_t)vdim : 0;
    const bool v_held = groups && t1 - t0 < groups * ATTEND_V_HELD;
    /* A short query's span's rows before the step's position were written by earlier
     * steps, and the position by a kernel the graph's first waited for: they are asked
     * into L1 while the kernels before this one end, so the loads after the wait find
     * them near. A long query's keys are many, and not all selected: only the selected
     * keys' rows are read, after the wait (below). */
    const bool long_q = last >= ATTEND_CHUNK;
    if (!long_q) {
        const int64_t end = t1 < *pos ? t1 : *pos - 1, k_lines = (qk * 4 + 127) / 128, v_lines = (vdim * 4 + 127) / 128;
        const uint32_t per = (uint32_t)(k_lines + v_lines);
        const int64_t lines = end >= t0 ? (end - t0 + 1) * per : 0;
        for (int64_t n = threadIdx.x; n < lines; n += blockDim.x) {
            const int64_t t = t0 + (uint32_t)n / per, l = (uint32_t)n % per;
            const float *r = l < k_lines ? k + (t * heads + h) * qk : v + (t * heads + h) * vdim;
            coli_prefetch_l1((const char *)r + (l < k_lines ? l : l - k_lines) * 128);
        }
    }
    coli_wait_prior_grid();
    __shared__ uint8_t chosen[ATTEND_CHUNK]; /* a long query's span's selection, read once */
    if (long_q) {
        for (int64_t t = t0 + threadIdx.x; t <= t1; t += blockDim.x) chosen[t - t0] = sr[t];
        __syncthreads();
    }
    float vh[ATTEND_V_HELD];
#pragma unroll
    for (int j = 0; j < ATTEND_V_HELD; j++) {
        const int64_t t = t0 + g + j * groups;
        vh[j] = v_held && g < groups && t <= t1 ? v[(t * heads + h) * vdim + d] : 0.0f;
    }
    if (long_q) attend_scores<true>(qr, k, chosen, p, t0, t1, heads, h, qk, scaling);
    else attend_scores<false>(qr, k, sr, p, t0, t1, heads, h, qk, scaling);
    __syncthreads();
    /* A span of a warp's keys or fewer (a short decode's): every warp takes the max, the
     * exps and their sum itself, lane l key t0 + l, the same values and sums as the
     * block's reductions (the other warps' parts there are -inf and 0), with no barrier;
     * the weighted v below takes each key's exp from its lane. */
    const bool narrow = t1 - t0 < WARP;
    float mx = -INFINITY, sum = 0.0f, e = 0.0f;
    if (narrow) {
        const bool mine = t0 + lane <= t1;
        const float sc = mine ? p[lane] : -INFINITY;
        mx = warp_max(sc);
        e = mine && mx != -INFINITY ? expf(sc - mx) : 0.0f;
        sum = warp_sum(e);
        if (!v_held) { /* the loop over v below reads the exps from p */
            if (warp == 0 && mine) p[lane] = e;
            __syncthreads();
        }
    } else {
        for (int64_t t = t0 + threadIdx.x; t <= t1; t += blockDim.x) mx = fmaxf(mx, p[t - t0]);
        mx = block_max(mx, red);
        for (int64_t t = t0 + threadIdx.x; t <= t1; t += blockDim.x) {
            const float x = mx == -INFINITY ? 0.0f : expf(p[t - t0] - mx);
            p[t - t0] = x;
            sum += x;
        }
        sum = block_sum(sum, red); /* its barriers also order the writes of p before the reads below */
    }
    /* One span (the query's keys fit one): its v over its sum is the combine's value
     * (exp(m - M) is 1), written at once; else the span's part for the combine. */
    const int64_t spans = (uint32_t)last / (uint32_t)span + 1, chunks = spans < (int64_t)gridDim.y ? spans : gridDim.y;
    float *const one = chunks == 1 ? attn + pair * vdim : NULL;
    /* the weighted v: groups of vdim threads take every groups-th key, then add up */
    if (groups) {
        float a = 0.0f;
        if (v_held) {
#pragma unroll
            for (int j = 0; j < ATTEND_V_HELD; j++) {
                const int64_t at = g + j * groups;
                const float pj = narrow ? COLI_SHFL(e, (int)(at < WARP ? at : 0)) : p[at < ATTEND_CHUNK ? at : 0];
                if (g < groups && t0 + at <= t1) a += pj * vh[j];
            }
        } else if (g < groups) {
#pragma unroll 4
            for (int64_t t = t0 + g; t <= t1; t += groups) {
                const float pt = p[t - t0]; /* 0 for a key not selected: its v is not read */
                if (pt != 0.0f) a += pt * v[(t * heads + h) * vdim + d];
            }
        }
        const float total = columns_sum(a, acc, vdim);
        if (threadIdx.x < vdim) {
            if (one) one[threadIdx.x] = total / sum;
            else out[2 + threadIdx.x] = total;
        }
    } else {
        for (int64_t col = threadIdx.x; col < vdim; col += blockDim.x) {
            float a = 0.0f;
            for (int64_t t = t0; t <= t1; t++) a += p[t - t0] * v[(t * heads + h) * vdim + col];
            if (one) one[col] = a / sum;
            else out[2 + col] = a;
        }
    }
    if (one) return;
    if (threadIdx.x == 0) out[0] = mx, out[1] = sum;
    if (!last_block(counts + pair, (int32_t)chunks)) return;
    if (groups && chunks <= WARP && chunks <= groups * ATTEND_V_HELD) {
        /* The combine where the spans fit a warp: every warp takes M, the weights and
         * their total itself, lane c span c, the same values and sums as the block's
         * reductions below, and each thread's spans' v values load beside the m and
         * sum: one wait on memory, no barrier before the columns' sum. */
        const bool mine = lane < chunks;
        const float *pl = pp + lane * (vdim + 2);
        const float m = mine ? COLI_LOAD_GRID(pl) : 0.0f, s = mine ? COLI_LOAD_GRID(pl + 1) : 0.0f;
        float vc[ATTEND_V_HELD];
#pragma unroll
        for (int j = 0; j < ATTEND_V_HELD; j++) {
            const int64_t c = g + j * groups;
            vc[j] = g < groups && c < chunks ? COLI_LOAD_GRID(pp + c * (vdim + 2) + 2 + d) : 0.0f;
        }
        const float M = warp_max(s > 0.0f ? m : -INFINITY), wl = s > 0.0f ? expf(m - M) : 0.0f;
        const float total = warp_sum(wl * s);
        float a = 0.0f;
#pragma unroll
        for (int j = 0; j < ATTEND_V_HELD; j++) {
            const int64_t c = g + j * groups;
            const float wc = COLI_SHFL(wl, (int)(c < WARP ? c : 0));
            if (g < groups && c < chunks) a += wc * vc[j];
        }
        const float sum_v = columns_sum(a, acc, vdim);
        if (threadIdx.x < vdim) attn[pair * vdim + threadIdx.x] = sum_v / total;
        return;
    }
    /* the combine, its spans over the threads: M, then each span's weight w_c over its m */
    float M = -INFINITY;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x)
        if (COLI_LOAD_GRID(pp + c * (vdim + 2) + 1) > 0.0f) M = fmaxf(M, COLI_LOAD_GRID(pp + c * (vdim + 2)));
    M = block_max(M, red);
    float total = 0.0f;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
        float *pc = pp + c * (vdim + 2);
        const float s = COLI_LOAD_GRID(pc + 1), w = s > 0.0f ? expf(COLI_LOAD_GRID(pc) - M) : 0.0f;
        pc[0] = w;
        total += w * s;
    }
    total = block_sum(total, red); /* its barriers also order the weights' writes before the reads below */
    if (groups) {
        float a = 0.0f;
        if (g < groups)
            for (int64_t c = g; c < chunks; c += groups) {
                const float *pc = pp + c * (vdim + 2);
                a += COLI_LOAD_GRID(pc) * COLI_LOAD_GRID(pc + 2 + d);
            }
        const float sum_v = columns_sum(a, acc, vdim);
        if (threadIdx.x < vdim) attn[pair * vdim + threadIdx.x] = sum_v / total;
    } else {
        for (int64_t col = threadIdx.x; col < vdim; col += blockDim.x) {
            float a = 0.0f;
            for (int64_t c = 0; c < chunks; c++) a += COLI_LOAD_GRID(pp + c * (vdim + 2)) * COLI_LOAD_GRID(pp + c * (vdim + 2) + 2 + col);
            attn[pair * vdim + col] = a / total;
        }
    }
}

#endif
