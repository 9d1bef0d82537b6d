/* The GPU backend's matmul, y[S,O] = x[S,I] · Wᵀ, for f32, int8 (per-row scale)
 * and int4 (grouped scale) weights; one source for CUDA and HIP. Included by
 * backend_gpu.cu (and by bench/gpu_matmul_bench.cu, which times the variants).
 *
 *   gemv_kernel   S <= 8 (decode): bound by reading W once from memory.
 *   tile_kernel   S > 8 (prefill, teacher forcing): bound by f32 arithmetic.
 *   simple_kernel any shape; rows that are not whole 16-byte pieces, and the
 *                 reference path (COLI_GPU_SIMPLE=1) for comparisons.
 *
 * Measurements behind the choices here: bench/RESULTS.md (H200). */
#ifndef COLI_GPU_MATMUL_CUH
#define COLI_GPU_MATMUL_CUH

#define WARP 32
#define SIMPLE_THREADS 256

/* ---- Exact int8/int4 -> f32 without the conversion unit ------------------------
 * I2F runs at a quarter of the FMA rate on sm_80/sm_90, which capped the first
 * kernels at 38% (int8) and 18% (int4) of copy bandwidth. An integer placed in the
 * low mantissa bits of 2^23 is read as 2^23 + n; one add (or one fma, when the
 * nibble sits higher up) takes the bias off, exactly. */
#define MAGIC 0x4B000000u /* 2^23 as f32 bits */

/* Four int8 of a word (byte k = value k). */
__device__ inline void dequant_q8(uint32_t word, float (&v)[4]) {
    const uint32_t biased = word ^ 0x80808080u; /* n + 128 in 0..255 */
#pragma unroll
    for (int k = 0; k < 4; k++) v[k] = __int_as_float(__byte_perm(biased, MAGIC, 0x7540u | k)) - 8388736.0f;
}

/* Eight int4 of a word: nibble k (value k) holds n + 8. Nibbles 0-3 come from the
 * word and 4-7 from the word >> 16, each masked in place (no shift per nibble):
 * 2^23 + 16^j (n + 8), scaled by 16^-j, less 2^23 / 16^j + 8, is n exactly. */
__device__ inline void dequant_q4(uint32_t word, float (&v)[8]) {
    const uint32_t half[2] = {word, word >> 16};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        v[4 * h + 0] = __int_as_float((half[h] & 0x000Fu) | MAGIC) - 8388616.0f;
        v[4 * h + 1] = fmaf(__int_as_float((half[h] & 0x00F0u) | MAGIC), 0.0625f, -524296.0f);
        v[4 * h + 2] = fmaf(__int_as_float((half[h] & 0x0F00u) | MAGIC), 0.00390625f, -32776.0f);
        v[4 * h + 3] = fmaf(__int_as_float((half[h] & 0xF000u) | MAGIC), 0.000244140625f, -2056.0f);
    }
}

/* Values in one 32-bit word and in one 16-byte piece, per format. */
template <int FORMAT> struct fmt {
    static constexpr int per_word = FORMAT == COLI_FMT_F32 ? 1 : FORMAT == COLI_FMT_Q8 ? 4 : 8;
    static constexpr int per_piece = 4 * per_word;
};

template <int FORMAT> __device__ inline void dequant(uint32_t word, float (&v)[fmt<FORMAT>::per_word]) {
    if constexpr (FORMAT == COLI_FMT_F32) v[0] = __uint_as_float(word);
    else if constexpr (FORMAT == COLI_FMT_Q8) dequant_q8(word, v);
    else dequant_q4(word, v);
}

__device__ inline uint32_t word_of(const int4 &p, int m) {
    return (uint32_t)(m == 0 ? p.x : m == 1 ? p.y : m == 2 ? p.z : p.w);
}

/* ---- S <= 8: a warp owns R rows and T tokens --------------------------------------
 * Each lane keeps U 16-byte pieces of each of its R rows in flight (R*U loads
 * before the first use), so few warps still keep HBM busy; a piece of x, read
 * through L1, serves R rows. Weights stream past the caches. Needs whole pieces
 * (cols % per_piece == 0) and, for int4, one scale per piece (group % 32 == 0). */
template <int FORMAT, int R, int U, int T>
__global__ void __launch_bounds__(256)
    gemv_kernel(const void *__restrict__ q, const float *__restrict__ scale, int64_t rows, int64_t cols,
                int32_t group, const float *__restrict__ x, int64_t s, float *__restrict__ y) {
    constexpr int PW = fmt<FORMAT>::per_word, PP = fmt<FORMAT>::per_piece;
    constexpr int XW = PW < 4 ? 4 : PW; /* x values loaded at once: a float4 at least */
    const int lane = threadIdx.x % WARP;
    const int64_t r0 = ((int64_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP) * R;
    const int64_t t0 = (int64_t)blockIdx.y * T;
    if (r0 >= rows) return; /* no barrier follows: a whole warp leaves together */
    const int nt = (int)(s - t0 < T ? s - t0 : T);
    const int64_t pieces = cols / PP;
    const int4 *w[R];
    const float *sr[R];
#pragma unroll
    for (int k = 0; k < R; k++) { /* rows past the end re-read the last one; their sums are dropped */
        const int64_t row = r0 + k < rows ? r0 + k : rows - 1;
        w[k] = (const int4 *)q + row * pieces;
        sr[k] = FORMAT == COLI_FMT_Q4 ? scale + row * (cols / group) : scale;
    }
    float acc[R][T];
#pragma unroll
    for (int k = 0; k < R; k++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[k][t] = 0.0f;

    for (int64_t base = lane; base < pieces; base += (int64_t)WARP * U) {
        int4 wv[R][U];
        float sc[R][U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t i = base + (int64_t)WARP * u;
#pragma unroll
            for (int k = 0; k < R; k++) {
                wv[k][u] = i < pieces ? COLI_LOAD_STREAM(w[k] + i) : make_int4(0, 0, 0, 0);
                if constexpr (FORMAT == COLI_FMT_Q4) sc[k][u] = i < pieces ? sr[k][i * PP / group] : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t i = base + (int64_t)WARP * u;
            if (i >= pieces) break;
            float part[R][T];
#pragma unroll
            for (int k = 0; k < R; k++)
#pragma unroll
                for (int t = 0; t < T; t++) part[k][t] = 0.0f;
            float xv[T][XW]; /* f32 loads its float4 of x at m = 0 and uses it for all four words */
#pragma unroll
            for (int m = 0; m < 4; m++) {
                float wf[R][PW];
#pragma unroll
                for (int k = 0; k < R; k++) dequant<FORMAT>(word_of(wv[k][u], m), wf[k]);
#pragma unroll
                for (int t = 0; t < T; t++) {
                    if (t >= nt) break;
                    if (PW >= 4 || m == 0) {
                        const float4 *xp = (const float4 *)(x + (t0 + t) * cols + i * PP + (PW >= 4 ? m * PW : 0));
#pragma unroll
                        for (int j = 0; j < XW / 4; j++) {
                            const float4 v = __ldg(xp + j);
                            xv[t][4 * j] = v.x, xv[t][4 * j + 1] = v.y, xv[t][4 * j + 2] = v.z, xv[t][4 * j + 3] = v.w;
                        }
                    }
#pragma unroll
                    for (int k = 0; k < R; k++)
#pragma unroll
                        for (int j = 0; j < PW; j++)
                            part[k][t] = fmaf(wf[k][j], xv[t][(PW >= 4 ? 0 : m) + j], part[k][t]);
                }
            }
#pragma unroll
            for (int k = 0; k < R; k++)
#pragma unroll
                for (int t = 0; t < T; t++) {
                    if constexpr (FORMAT == COLI_FMT_Q4) acc[k][t] = fmaf(part[k][t], sc[k][u], acc[k][t]);
                    else acc[k][t] += part[k][t];
                }
        }
    }
#pragma unroll
    for (int k = 0; k < R; k++)
#pragma unroll
        for (int t = 0; t < T; t++) {
            float v = acc[k][t];
#pragma unroll
            for (int o = WARP / 2; o > 0; o >>= 1) v += COLI_SHFL_XOR(v, o);
            if (lane == 0 && r0 + k < rows && t < nt)
                y[(t0 + t) * rows + r0 + k] = FORMAT == COLI_FMT_Q8 ? v * scale[r0 + k] : v;
        }
}

/* ---- S > 8: register tiles ---------------------------------------------------------
 * A block computes TILE_M rows x TILE_N tokens; each thread a 4 x 4 patch of it.
 * Per step of TILE_K columns the block dequantises its W tile (scales applied, so
 * any int4 group works) and its x tile into shared memory, k-major, then every
 * thread does 16 FMAs for each pair of 16-byte shared loads. Needs cols % TILE_K == 0. */
#define TILE_M 64
#define TILE_N 64
#define TILE_K 32
#define TILE_THREADS 256

template <int FORMAT>
__global__ void __launch_bounds__(TILE_THREADS)
    tile_kernel(const void *__restrict__ q, const float *__restrict__ scale, int64_t rows, int64_t cols,
                int32_t group, const float *__restrict__ x, int64_t s, float *__restrict__ y) {
    constexpr int PW = fmt<FORMAT>::per_word;
    constexpr int WORDS = TILE_M * TILE_K / PW; /* 32-bit words in one W tile */
    __shared__ __align__(16) float ws[TILE_K][TILE_M];
    __shared__ __align__(16) float xs[TILE_K][TILE_N];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16; /* tx: tokens, ty: rows */
    const int64_t m0 = (int64_t)blockIdx.x * TILE_M, n0 = (int64_t)blockIdx.y * TILE_N;
    const int64_t words_per_row = cols / PW;
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < cols; k0 += TILE_K) {
        /* W tile: consecutive threads take consecutive rows, so the transposed
         * stores into ws[k][row] fall in distinct banks. */
        for (int e = tid; e < WORDS; e += TILE_THREADS) {
            const int row = e % TILE_M, wk = e / TILE_M;
            const int64_t gr = m0 + row < rows ? m0 + row : rows - 1;
            const uint32_t word = ((const uint32_t *)q)[gr * words_per_row + k0 / PW + wk];
            float v[PW];
            dequant<FORMAT>(word, v);
#pragma unroll
            for (int j = 0; j < PW; j++) {
                const int kk = wk * PW + j;
                ws[kk][row] = FORMAT == COLI_FMT_Q4 ? v[j] * scale[gr * (cols / group) + (k0 + kk) / group] : v[j];
            }
        }
        for (int e = tid; e < TILE_N * TILE_K / 4; e += TILE_THREADS) {
            const int n = e % TILE_N, k4 = e / TILE_N;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (n0 + n < s) v = __ldg((const float4 *)(x + (n0 + n) * cols + k0) + k4);
            xs[4 * k4][n] = v.x, xs[4 * k4 + 1][n] = v.y, xs[4 * k4 + 2][n] = v.z, xs[4 * k4 + 3][n] = v.w;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < TILE_K; kk++) {
            const float4 a = *(const float4 *)&ws[kk][4 * ty];
            const float4 b = *(const float4 *)&xs[kk][4 * tx];
            const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t r = m0 + 4 * ty + i;
        if (r >= rows) break;
        const float post = FORMAT == COLI_FMT_Q8 ? scale[r] : 1.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t t = n0 + 4 * tx + j;
            if (t < s) y[t * rows + r] = acc[i][j] * post;
        }
    }
}

/* ---- Any shape: one block per (output row, token) ------------------------------- */
template <int FORMAT>
__global__ void simple_kernel(const void *__restrict__ q, const float *__restrict__ scale, int64_t rows,
                              int64_t cols, int32_t group, const float *__restrict__ x, float *__restrict__ y) {
    __shared__ float partial[SIMPLE_THREADS];
    const int64_t r = blockIdx.x, t = blockIdx.y;
    const float *xt = x + t * cols;
    float acc = 0.0f;
    if (FORMAT == COLI_FMT_F32) {
        const float *wr = (const float *)q + r * cols;
        for (int64_t c = threadIdx.x; c < cols; c += SIMPLE_THREADS) acc += xt[c] * wr[c];
    } else if (FORMAT == COLI_FMT_Q8) {
        const int8_t *wr = (const int8_t *)q + r * cols;
        for (int64_t c = threadIdx.x; c < cols; c += SIMPLE_THREADS) acc += xt[c] * (float)wr[c];
    } else {
        const uint8_t *wr = (const uint8_t *)q + r * cols / 2;
        const float *sr = scale + r * (cols / group);
        for (int64_t c = 2 * threadIdx.x; c < cols; c += 2 * SIMPLE_THREADS) {
            uint8_t b = wr[c / 2];
            float sc = sr[c / group];
            acc += (xt[c] * (float)((int)(b & 0x0F) - 8) + xt[c + 1] * (float)((int)(b >> 4) - 8)) * sc;
        }
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int step = SIMPLE_THREADS / 2; step > 0; step >>= 1) {
        if ((int)threadIdx.x < step) partial[threadIdx.x] += partial[threadIdx.x + step];
        __syncthreads();
    }
    if (threadIdx.x == 0) y[t * rows + r] = FORMAT == COLI_FMT_Q8 ? partial[0] * scale[r] : partial[0];
}

/* ---- Launch ------------------------------------------------------------------------ */
#define GEMV_THREADS 256
#define GEMV_MAX_T 8

/* One matmul on device pointers. The kernel variant per format and row count is
 * the fastest of those timed on the H200 (bench/gpu_matmul_bench.cu sweeps them). */
#define LAUNCH_ARGS w->q, w->scale, w->rows, w->cols, w->group, dx, s, dy

template <int FORMAT, int R, int U, int T>
static void launch_gemv(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    const int64_t per_block = (int64_t)(GEMV_THREADS / WARP) * R;
    dim3 grid((unsigned)((w->rows + per_block - 1) / per_block), (unsigned)((s + T - 1) / T));
    gemv_kernel<FORMAT, R, U, T><<<grid, GEMV_THREADS, 0, stream>>>(LAUNCH_ARGS);
}

/* Tokens per pass: the fewest of 1, 2, 4, 8 that cover s. */
template <int FORMAT, int R, int U>
static void launch_gemv_tokens(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    if (s == 1) launch_gemv<FORMAT, R, U, 1>(w, dx, s, dy, stream);
    else if (s == 2) launch_gemv<FORMAT, R, U, 2>(w, dx, s, dy, stream);
    else if (s <= 4) launch_gemv<FORMAT, R, U, 4>(w, dx, s, dy, stream);
    else launch_gemv<FORMAT, R, U, 8>(w, dx, s, dy, stream);
}

template <int FORMAT>
static void launch_tile(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    dim3 grid((unsigned)((w->rows + TILE_M - 1) / TILE_M), (unsigned)((s + TILE_N - 1) / TILE_N));
    tile_kernel<FORMAT><<<grid, TILE_THREADS, 0, stream>>>(LAUNCH_ARGS);
}

template <int FORMAT>
static void launch_simple(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    dim3 grid((unsigned)w->rows, (unsigned)s);
    simple_kernel<FORMAT><<<grid, SIMPLE_THREADS, 0, stream>>>(w->q, w->scale, w->rows, w->cols, w->group, dx, dy);
}

template <int FORMAT>
static void launch_format(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream,
                          bool simple) {
    const bool pieces = w->cols % fmt<FORMAT>::per_piece == 0 && (FORMAT != COLI_FMT_Q4 || w->group % 32 == 0);
    if (simple) {
        launch_simple<FORMAT>(w, dx, s, dy, stream);
    } else if (s > GEMV_MAX_T && w->cols % TILE_K == 0) {
        launch_tile<FORMAT>(w, dx, s, dy, stream);
    } else if (!pieces) {
        launch_simple<FORMAT>(w, dx, s, dy, stream);
    } else if (s > 1) {
        launch_gemv_tokens<FORMAT, 1, 2>(w, dx, s, dy, stream);
    } else if (FORMAT == COLI_FMT_F32) {
        launch_gemv<FORMAT, 2, 2, 1>(w, dx, s, dy, stream);
    } else {
        launch_gemv<FORMAT, 4, 2, 1>(w, dx, s, dy, stream);
    }
}

static cudaError_t launch_matmul(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    static int simple = -1; /* COLI_GPU_SIMPLE=1: the simple kernel only, for comparisons */
    if (simple < 0) simple = getenv("COLI_GPU_SIMPLE") != NULL;
    switch (w->format) {
    case COLI_FMT_F32: launch_format<COLI_FMT_F32>(w, dx, s, dy, stream, simple); break;
    case COLI_FMT_Q8: launch_format<COLI_FMT_Q8>(w, dx, s, dy, stream, simple); break;
    default: launch_format<COLI_FMT_Q4>(w, dx, s, dy, stream, simple);
    }
    return cudaGetLastError();
}

#endif
