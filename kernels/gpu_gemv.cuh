/* f32 at up to 16 tokens: gemv_kernel; one token of a few rows: gemv_held_kernel. */
#ifndef COLI_GPU_GEMV_CUH
#define COLI_GPU_GEMV_CUH

#include "gpu_formats.cuh"

/* ---- f32, S <= 16: a warp owns R rows and T tokens -----------------------------------
 * Lane i takes 16-byte piece i of each run of 32 pieces of its R rows. The pieces
 * come through a ring of D register slots, each refilled as soon as it is used,
 * so D runs of loads are in flight while the warp works: HBM's latency under load
 * is thousands of cycles and the grid gives an SM too few warps to cover that
 * otherwise (ncu on the H200: warps stalled on loads 80% of the time with one run
 * ahead). x is read through L1 and serves R rows; W streams past the caches.
 * Needs cols % 4 == 0. Indices within a row are 32-bit (a row has fewer than 2^31
 * pieces): 64-bit index arithmetic cost more than the work. */
/* Where a warp finds x: loaded at use (any T) or carried in the ring (T = 1). */
enum { X_AT_USE = 0, X_RING = 1 };

/* One run's pieces of R rows (and, XPRE, its x) into a ring slot; i = this lane's piece. */
template <int R, bool XPRE>
__device__ inline void gemv_load(const float4 *const (&w)[R], const float4 *x, int pieces, int i, float4 (&wv)[R],
                                 float4 &xr) {
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int k = 0; k < R; k++) wv[k] = i < pieces ? COLI_LOAD_STREAM(w[k] + i) : zero;
    if constexpr (XPRE) xr = i < pieces ? COLI_LOAD_FRESH(x + i) : zero;
}

/* One run's pieces into the sums: a piece's four products as two pairs, then one add. */
template <int R, int T, int XM>
__device__ inline void gemv_run(const float4 (&wv)[R], const float4 &xr, const float4 *const (&xt)[T], int nt,
                                int pieces, int i, float (&acc)[R][T]) {
    if (i >= pieces) return; /* only in a row's last run */
#pragma unroll
    for (int t = 0; t < T; t++) {
        if (t >= nt) break;
        const float4 x = XM == X_RING ? xr : COLI_LOAD_FRESH(xt[t] + i);
#pragma unroll
        for (int k = 0; k < R; k++)
            acc[k][t] += (wv[k].x * x.x + wv[k].y * x.y) + (wv[k].z * x.z + wv[k].w * x.w);
    }
}

template <int R, int D, int T, int XM>
__global__ void __launch_bounds__(256)
    gemv_kernel(const float *__restrict__ q, int64_t rows, int64_t cols, const float *__restrict__ x, int64_t s,
                float *__restrict__ y) {
    const int lane = threadIdx.x % WARP;
    const int64_t r0 = ((int64_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP) * R;
    const int64_t t0 = (int64_t)blockIdx.y * T;
    if (r0 >= rows) return; /* no barrier follows: a whole warp leaves together, and writes nothing */
    const int nt = (int)(s - t0 < T ? s - t0 : T);
    const int pieces = (int)(cols / 4);
    const float4 *w[R], *xt[T];
#pragma unroll
    for (int k = 0; k < R; k++) /* rows past the end re-read the last one; their sums are dropped */
        w[k] = (const float4 *)q + (r0 + k < rows ? r0 + k : rows - 1) * pieces;
#pragma unroll
    for (int t = 0; t < T; t++) xt[t] = (const float4 *)(x + (t0 + (t < nt ? t : 0)) * cols);
    float acc[R][T];
#pragma unroll
    for (int k = 0; k < R; k++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[k][t] = 0.0f;
    float4 ring[D][R], ring_x[D];
    /* launched early (launch_gemv): the ring's first W, which no kernel writes, is loaded
     * while the grid before runs; x, after it has ended */
    coli_allow_next_grid();
#pragma unroll
    for (int d = 0; d < D; d++) gemv_load<R, false>(w, xt[0], pieces, d * WARP + lane, ring[d], ring_x[d]);
    coli_wait_prior_grid();
    if constexpr (XM == X_RING) {
#pragma unroll
        for (int d = 0; d < D; d++) {
            const int i = d * WARP + lane;
            ring_x[d] = i < pieces ? COLI_LOAD_FRESH(xt[0] + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
    for (int run = 0; run < pieces; run += D * WARP) {
#pragma unroll
        for (int d = 0; d < D; d++) {
            gemv_run<R, T, XM>(ring[d], ring_x[d], xt, nt, pieces, run + d * WARP + lane, acc);
            gemv_load<R, XM == X_RING>(w, xt[0], pieces, run + (d + D) * WARP + lane, ring[d], ring_x[d]);
        }
    }
#pragma unroll
    for (int k = 0; k < R; k++)
#pragma unroll
        for (int t = 0; t < T; t++) {
            const float v = warp_sum(acc[k][t]);
            if (lane == 0 && r0 + k < rows && t < nt) y[(t0 + t) * rows + r0 + k] = v;
        }
}

/* ---- f32, S = 1, few rows: the whole of W in registers before the wait ---------------
 * A row in GEMV_PIECES pieces, a warp each, lane i holding 16-byte pieces i, i + 32, ...
 * of its piece (GEMV_HELD at most): every load of W is issued while the grid before
 * still runs, so after the wait a call costs one read of x (from L2) and the sums.
 * The ring kernel above, for a router's 64 rows, spread them over 4 blocks whose
 * warps each waited on HBM four times in a row after the wait. The pieces' sums are
 * added in piece order. Needs cols % 4 == 0 and cols <= GEMV_HELD_COLS. */
#define GEMV_PIECES 8
#define GEMV_HELD 4
#define GEMV_HELD_COLS (GEMV_PIECES * WARP * GEMV_HELD * 4)
__global__ void __launch_bounds__(GEMV_THREADS)
    gemv_held_kernel(const float *__restrict__ q, int64_t rows, int64_t cols, const float *__restrict__ x,
                     float *__restrict__ y) {
    __shared__ float part[GEMV_THREADS / WARP];
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, piece = warp % GEMV_PIECES;
    const int64_t row = (int64_t)blockIdx.x * (GEMV_THREADS / WARP / GEMV_PIECES) + warp / GEMV_PIECES;
    const int pieces = (int)(cols / 4), span = (pieces + GEMV_PIECES - 1) / GEMV_PIECES, first = piece * span;
    const int end = first + span < pieces ? first + span : pieces;
    const float4 *w = (const float4 *)q + (row < rows ? row : 0) * pieces, *xv = (const float4 *)x;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 wv[GEMV_HELD];
    coli_allow_next_grid();
#pragma unroll
    for (int j = 0; j < GEMV_HELD; j++) {
        const int i = first + lane + j * WARP;
        wv[j] = row < rows && i < end ? COLI_LOAD_STREAM(w + i) : zero;
    }
    coli_wait_prior_grid();
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < GEMV_HELD; j++) {
        const int i = first + lane + j * WARP;
        if (i < end) {
            const float4 xr = COLI_LOAD_FRESH(xv + i);
            acc += (wv[j].x * xr.x + wv[j].y * xr.y) + (wv[j].z * xr.z + wv[j].w * xr.w);
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) part[warp] = acc;
    __syncthreads();
    if (piece || lane || row >= rows) return;
    float total = 0.0f;
    for (int p = 0; p < GEMV_PIECES; p++) total += part[warp + p];
    y[row] = total;
}

static void launch_gemv_held(const coli_weight *w, const float *dx, float *dy, cudaStream_t stream) {
    constexpr int64_t per_block = GEMV_THREADS / WARP / GEMV_PIECES;
    launch_early(chain_calls(), gemv_held_kernel, dim3((unsigned)((w->rows + per_block - 1) / per_block)),
                 dim3(GEMV_THREADS), 0, stream, (const float *)w->q, (int64_t)w->rows, (int64_t)w->cols, dx, dy);
}

/* f32, S <= 16: a warp per R rows, a grid row per T tokens. */
template <int R, int D, int T, int XM = T == 1 ? X_RING : X_AT_USE>
static void launch_gemv(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    const int64_t per_block = (int64_t)(GEMV_THREADS / WARP) * R;
    const dim3 grid((unsigned)((w->rows + per_block - 1) / per_block), (unsigned)((s + T - 1) / T));
    launch_early(chain_calls(), gemv_kernel<R, D, T, XM>, grid, dim3(GEMV_THREADS), 0, stream, (const float *)w->q,
                 w->rows, w->cols, dx, s, dy);
}

/* Tokens per pass: the fewest of 1, 2, 4, 8 that cover s. */
template <int R, int D>
static void launch_gemv_tokens(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    if (s == 1) launch_gemv<R, D, 1>(w, dx, s, dy, stream);
    else if (s == 2) launch_gemv<R, D, 2>(w, dx, s, dy, stream);
    else if (s <= 4) launch_gemv<R, D, 4>(w, dx, s, dy, stream);
    else launch_gemv<R, D, 8>(w, dx, s, dy, stream);
}

#endif
