/* Any format past 16 tokens where the tensor cores do not take it: tile_kernel. */
#ifndef COLI_GPU_TILE_CUH
#define COLI_GPU_TILE_CUH

#include "gpu_formats.cuh"

/* ---- S > 16: register tiles -----------------------------------------------------------
 * A block computes BM rows x TILE_N tokens, each thread a (BM / 16) x 4 patch.
 * Per step of TILE_K columns the block's W tile (f32 as 16-byte pieces, int8 and
 * int4 as 32-bit words, int4's found through its layout) and x tile are loaded into
 * registers one step ahead, so the loads overlap the arithmetic of the step
 * before; they are then dequantised (scales applied, so any int4 group works)
 * into shared memory, k-major, and every thread does its FMAs for each pair of
 * shared loads. Needs cols % TILE_K == 0. */
#define TILE_N 64
#define TILE_K 64
#define TILE_THREADS 256

template <int FORMAT, int BM> struct tile_shape {
    static constexpr int units = FORMAT == COLI_FMT_F32 ? BM * TILE_K / 4 : BM * TILE_K / fmt<FORMAT>::per_word;
    static constexpr int per_unit = FORMAT == COLI_FMT_F32 ? 4 : fmt<FORMAT>::per_word; /* values per load */
    static constexpr int w_loads = (units + TILE_THREADS - 1) / TILE_THREADS;
    static constexpr int x_loads = TILE_N * TILE_K / 4 / TILE_THREADS; /* float4 of x per thread */
};

/* One step's W units (with their int4 scale, when a word has one) and x into registers. */
template <int FORMAT, int BM>
__device__ inline void tile_fetch(const void *__restrict__ q, const float *__restrict__ scale, int32_t group,
                                  int32_t layout, const float *__restrict__ x, int64_t rows, int64_t cols, int64_t s,
                                  int64_t m0, int64_t n0, int64_t k0, int4 (&wr)[tile_shape<FORMAT, BM>::w_loads],
                                  float (&wsc)[tile_shape<FORMAT, BM>::w_loads],
                                  float4 (&xr)[tile_shape<FORMAT, BM>::x_loads]) {
    using shape = tile_shape<FORMAT, BM>;
    constexpr int PU = shape::per_unit;
    const int64_t units_per_row = cols / PU;
#pragma unroll
    for (int j = 0; j < shape::w_loads; j++) {
        const int e = threadIdx.x + j * TILE_THREADS, row = e % BM, p = e / BM;
        const int64_t gr = m0 + row < rows ? m0 + row : rows - 1, un = k0 / PU + p;
        if (e >= shape::units) break;
        if constexpr (FORMAT == COLI_FMT_F32) {
            wr[j] = ((const int4 *)q)[gr * units_per_row + un];
        } else {
            const int64_t at = layout ? mma_word(un) : un;
            wr[j].x = (int)((const uint32_t *)q)[gr * units_per_row + at];
            if (FORMAT == COLI_FMT_Q4 && group % PU == 0) wsc[j] = scale[gr * (cols / group) + un * PU / group];
        }
    }
#pragma unroll
    for (int j = 0; j < shape::x_loads; j++) {
        const int e = threadIdx.x + j * TILE_THREADS, n = e % TILE_N, k4 = e / TILE_N;
        xr[j] = n0 + n < s ? __ldg((const float4 *)(x + (n0 + n) * cols + k0) + k4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

template <int FORMAT, int BM>
__global__ void __launch_bounds__(TILE_THREADS)
    tile_kernel(const void *__restrict__ q, const float *__restrict__ scale, int64_t rows, int64_t cols,
                int32_t group, int32_t layout, const float *__restrict__ x, int64_t s, float *__restrict__ y) {
    using shape = tile_shape<FORMAT, BM>;
    constexpr int PW = fmt<FORMAT>::per_word, PU = shape::per_unit, TM = BM / 16;
    __shared__ __align__(16) float ws[TILE_K][BM];
    __shared__ __align__(16) float xs[TILE_K][TILE_N];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16; /* tx: tokens, ty: rows */
    const int64_t m0 = (int64_t)blockIdx.x * BM, n0 = (int64_t)blockIdx.y * TILE_N;
    const bool word_scale = group % PU == 0; /* int4: one scale per word */
    float acc[TM][4] = {};
    int4 wr[shape::w_loads];
    float wsc[shape::w_loads];
    float4 xr[shape::x_loads];
    tile_fetch<FORMAT, BM>(q, scale, group, layout, x, rows, cols, s, m0, n0, 0, wr, wsc, xr);
    for (int64_t k0 = 0; k0 < cols; k0 += TILE_K) {
        /* registers -> shared: consecutive threads hold consecutive rows (tokens),
         * so the transposed stores fall in distinct banks */
#pragma unroll
        for (int j = 0; j < shape::w_loads; j++) {
            const int e = tid + j * TILE_THREADS, row = e % BM, p = e / BM;
            if (e >= shape::units) break;
            const int64_t gr = m0 + row < rows ? m0 + row : rows - 1;
#pragma unroll
            for (int m = 0; m < (FORMAT == COLI_FMT_F32 ? 4 : 1); m++) {
                float v[PW];
                dequant<FORMAT>(word_of(wr[j], m), v);
#pragma unroll
                for (int i = 0; i < PW; i++) {
                    const int kk = p * PU + m * PW + i;
                    if constexpr (FORMAT != COLI_FMT_Q4) ws[kk][row] = v[i];
                    else ws[kk][row] = v[i] * (word_scale ? wsc[j] : scale[gr * (cols / group) + (k0 + kk) / group]);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < shape::x_loads; j++) {
            const int e = tid + j * TILE_THREADS, n = e % TILE_N, k4 = e / TILE_N;
            xs[4 * k4][n] = xr[j].x, xs[4 * k4 + 1][n] = xr[j].y, xs[4 * k4 + 2][n] = xr[j].z, xs[4 * k4 + 3][n] = xr[j].w;
        }
        __syncthreads();
        if (k0 + TILE_K < cols)
            tile_fetch<FORMAT, BM>(q, scale, group, layout, x, rows, cols, s, m0, n0, k0 + TILE_K, wr, wsc, xr);
#pragma unroll 16
        for (int kk = 0; kk < TILE_K; kk++) {
            float av[TM];
            if constexpr (TM == 4) {
                const float4 a = *(const float4 *)&ws[kk][TM * ty];
                av[0] = a.x, av[1] = a.y, av[2] = a.z, av[3] = a.w;
            } else {
                const float2 a = *(const float2 *)&ws[kk][TM * ty];
                av[0] = a.x, av[1] = a.y;
            }
            const float4 b = *(const float4 *)&xs[kk][4 * tx];
            const float bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; i++) {
        const int64_t r = m0 + TM * ty + i;
        if (r >= rows) break;
        const float post = FORMAT == COLI_FMT_Q8 ? scale[r] : 1.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t t = n0 + 4 * tx + j;
            if (t < s) y[t * rows + r] = acc[i][j] * post;
        }
    }
}

template <int FORMAT, int BM>
static void launch_tile(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    dim3 grid((unsigned)((w->rows + BM - 1) / BM), (unsigned)((s + TILE_N - 1) / TILE_N));
    tile_kernel<FORMAT, BM><<<grid, TILE_THREADS, 0, stream>>>(w->q, w->scale, w->rows, w->cols, w->group, w->layout,
                                                              dx, s, dy);
}

#endif
