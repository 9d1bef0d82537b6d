/* ABI 2's step ops on the GPU: one kernel (or a few) per op, queued on the
 * backend's step stream; a step's first run launches them one by one, and every
 * later run replays them as one CUDA/HIP graph captured on the second run. The
 * position is a device value set by a one-thread kernel ahead of the ops, so the
 * recorded launches never change. Each op follows its CPU definition
 * (cpu_model_ops.c); reductions run in tree order, so values agree with the CPU
 * path to rounding, not to the bit (the selftest bounds the difference). Here what
 * every op kernel shares and the small ops; the router and the experts are in
 * gpu_experts.cuh, the indexer and attention in gpu_attention.cuh. */
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

/* A float's order as an unsigned key: larger floats, larger keys. */
__device__ inline uint32_t order_key(float f) {
    const uint32_t u = __float_as_uint(f);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
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

#endif
