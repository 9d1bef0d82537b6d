/* int8 and int4 for many tokens (prefill, teacher forcing): gemm_kernel. It reads
 * the same digits of x
 * (mma_prep_kernel) and the same weights (int8 in the ABI's order, int4 in the
 * mma layout).
 *
 * mma_kernel gives a block 16 or 32 rows and at most 16 tokens (int4: 8), and a
 * tile of the tensor cores 2 tokens of 3 digits (and an unused fourth). So every
 * 16 tokens read W again, and at S = 256 the sums take several times as long as
 * cuBLAS's f16 matmul. Here a block takes a
 * tile of GEMM_ROWS rows and up to 64 tokens, each of its warps a tile of MT x 16
 * rows and NT x 8 tokens, and a tensor-core tile (m16n8k32) 8 tokens of one digit:
 *   - A stage is one chunk (int8 64 columns, int4 128): 64 bytes of each row,
 *     int4's 4 scales of each row, each token's 3 digits of the chunk and its E,
 *     copied in the background (cp.async) NS stages ahead.
 *   - A lane reads 16 bytes of a row and 16 (int8) or 32 (int4) bytes of a token's
 *     digit: the columns of its two k-steps (int8) or its word of each of the 4
 *     groups (int4), the order in which mma_prep_kernel wrote them. Rows side by
 *     side take different halves of the banks; int4's digits of odd tokens swap
 *     their 16-byte halves in shared memory for the same reason.
 *   - A digit's sums over a chunk (int4: a group) stay in int32 and below 2^22
 *     (64 x 128 x 128), so they start at the bits of 1.5 * 2^23 and come out as
 *     that float plus the sum: no conversion instruction (a quarter of the rate).
 *     They meet as a 2^16 + b 2^8 + c in float, times E (and int4's scale).
 * Output tiles are a warp's own, so there is no reduction across warps. Blocks
 * go through the tokens first, so the blocks reading one tile of rows run
 * together and W comes from HBM once. */
#ifndef COLI_GPU_GEMM_CUH
#define COLI_GPU_GEMM_CUH

#include "gpu_mma.cuh"

/* Shared memory a gemm block's stages may take (within BLOCK_SHARED_MAX), and the
 * most stages in flight: more did not help. */
#define GEMM_SHARED_BUDGET (COLI_HAS_PDL ? 96 * 1024 : 64 * 1024)
#define GEMM_MAX_STAGES 4

template <int FORMAT, int WM, int WN, int MT, int NT> struct gemm_shape {
    static constexpr int threads = WM * WN * WARP;
    static constexpr int rows = WM * MT * 16, tokens = WN * NT * 8;
    static constexpr int unit = mma_planes<FORMAT>::chunk / DIGITS; /* bytes of a token's digit per chunk */
    static constexpr int w_bytes = rows * 64;
    static constexpr int s_bytes = FORMAT == COLI_FMT_Q4 ? rows * 16 : 0;
    static constexpr int d_bytes = DIGITS * tokens * unit;
    static constexpr int stage = w_bytes + s_bytes + d_bytes + tokens * 4;
    static constexpr int fit = GEMM_SHARED_BUDGET / stage;
    static constexpr int ns = fit < 2 ? 2 : fit > GEMM_MAX_STAGES ? GEMM_MAX_STAGES : fit; /* stages in flight */
    static constexpr int shared = ns * stage;
};

/* Where 16-byte unit u of row r lies among its row's 4 (64-byte rows, W and
 * int8's digits): rows 2i and 2i + 1 turn it by i, so that the 8 rows an ldmatrix
 * reads at once fall in 8 different bank groups. */
__host__ __device__ inline int gemm_unit(int r, int u) { return u ^ (r >> 1 & 3); }

/* Each thread's share of a stage's copies, worked out once: chunk c's bytes lie
 * at a fixed step from chunk 0's (W and int4's scales: 64 and 16 bytes a row; the
 * digits: a token's 3 digits; E: a float). Tokens past s copy nothing: their
 * sums are never stored. */
template <int FORMAT, int WM, int WN, int MT, int NT> struct gemm_copier {
    using shape = gemm_shape<FORMAT, WM, WN, MT, NT>;
    static constexpr int UNITS = shape::unit / 16, PER = DIGITS * UNITS; /* 16-byte pieces per digit, per token */
    static constexpr int WC = (shape::rows * 4 + shape::threads - 1) / shape::threads;
    static constexpr int DC = (shape::tokens * PER + shape::threads - 1) / shape::threads;
    const uint8_t *w[WC], *d[DC];
    const float *sc, *e;
    int wat[WC], dat[DC];
    int w_stride, s_stride; /* a row's chunks apart: W (bytes) and int4's scales (floats) */

    __device__ gemm_copier(const uint8_t *__restrict__ q, const float *__restrict__ scale, const uint8_t *__restrict__ planes,
                           const float *__restrict__ ex, int64_t rows, int64_t row0, int64_t tok0, int64_t s, int chunks,
                           int32_t layout)
        : w_stride(q4_chunk_stride(layout)), s_stride(q4_chunk_stride(layout) / 16) {
        const int tid = threadIdx.x;
#pragma unroll
        for (int j = 0; j < WC; j++) {
            const int i = tid + j * shape::threads, r = i / 4, u = i % 4;
            const int64_t row = row0 + r < rows ? row0 + r : rows - 1;
            w[j] = i < shape::rows * 4 ? q + q4_w_at(layout, row, 0, chunks) + 16 * u : nullptr;
            wat[j] = r * 64 + 16 * gemm_unit(r, u);
        }
        const int64_t srow = row0 + tid < rows ? row0 + tid : rows - 1;
        sc = FORMAT == COLI_FMT_Q4 && tid < shape::rows ? scale + q4_s_at(layout, srow, 0, chunks) : nullptr;
#pragma unroll
        for (int j = 0; j < DC; j++) {
            const int i = tid + j * shape::threads, k = i / PER, p = i % PER, dg = p / UNITS, u = p % UNITS;
            const bool on = i < shape::tokens * PER && tok0 + k < s;
            d[j] = on ? planes + (size_t)plane_at<FORMAT>(tok0 + k, chunks, 0, 0, 0) * 4 + 16 * p : nullptr;
            dat[j] = shape::w_bytes + shape::s_bytes + (dg * shape::tokens + k) * shape::unit +
                     16 * (FORMAT == COLI_FMT_Q4 ? u ^ (k & 1) : gemm_unit(k, u));
        }
        e = tid < shape::tokens && tok0 + tid < s ? ex + ex_at(tok0 + tid, chunks, 0) : nullptr;
    }
    /* W's rows and int4's scales of chunk c into the stage at `slot` (`at`: its shared-memory address) */
    __device__ void weights(uint8_t *slot, uint32_t at, int c) const {
#pragma unroll
        for (int j = 0; j < WC; j++)
            if (w[j]) coli_copy_async_at<16>(at + wat[j], slot + wat[j], w[j] + (int64_t)c * w_stride);
        if (sc) {
            const int o = shape::w_bytes + 16 * threadIdx.x;
            coli_copy_async_at<16>(at + o, slot + o, sc + (int64_t)c * s_stride);
        }
    }
    /* x's digits and E of chunk c */
    __device__ void x(uint8_t *slot, uint32_t at, int c) const {
#pragma unroll
        for (int j = 0; j < DC; j++)
            if (d[j]) coli_copy_async_at<16>(at + dat[j], slot + dat[j], d[j] + (int64_t)c * mma_planes<FORMAT>::chunk);
        if (e) {
            const int o = shape::w_bytes + shape::s_bytes + shape::d_bytes + 4 * threadIdx.x;
            coli_copy_async_at<4>(at + o, slot + o, e + c);
        }
    }
};

/* A digit's three sums, each 1.5 * 2^23 plus its sum as int32 bits, as
 * a 2^16 + b 2^8 + c + 1.5 * 2^23: the last is left in (c's sum needs no subtraction
 * of its own) and taken off in bulk, once per output (int8) or chunk (int4). The
 * steps take the 1.5 * 2^23 off a and b exactly and then round twice, each time by
 * at most 2^-24 of the parts' size (a 2^16, b 2^8, c and 1.5 * 2^23), as a float sum
 * of those parts would (tests/c/gpu_mma_check.cu). */
__host__ __device__ inline float gemm_combine(int a, int b, int c) {
    return fmaf(float_sum(a), 65536.0f, fmaf(float_sum(b), 256.0f, as_float((uint32_t)c)));
}

/* Block (x, y): tokens from tokens * x, rows from rows * y; warp w the tile
 * (w % WM, w / WM) of the block's. */
template <int FORMAT, int WM, int WN, int MT, int NT>
__global__ void __launch_bounds__(WM * WN * WARP)
    gemm_kernel(const uint8_t *__restrict__ q, const float *__restrict__ scale, int64_t rows, int chunks, int32_t layout,
                const uint8_t *__restrict__ planes, const float *__restrict__ ex, int64_t s, float *__restrict__ y) {
    using shape = gemm_shape<FORMAT, WM, WN, MT, NT>;
    extern __shared__ __align__(16) uint8_t shared[];
    coli_allow_next_grid(); /* the next call's kernels may take free room from here on */
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, g = lane / 4, t = lane % 4;
    const int wr = warp % WM * MT * 16, wt = warp / WM * NT * 8; /* the warp's first row and token in the block */
    const int64_t tok0 = (int64_t)blockIdx.x * shape::tokens, row0 = (int64_t)blockIdx.y * shape::rows;
    const gemm_copier<FORMAT, WM, WN, MT, NT> copy(q, scale, planes, ex, rows, row0, tok0, s, chunks, layout);
    /* W's first stages while mma_prep_kernel may still run; x's once it is done */
    const uint32_t at = coli_shared_at(shared);
    for (int c = 0; c < shape::ns - 1; c++)
        if (c < chunks) copy.weights(shared + c * shape::stage, at + c * shape::stage, c);
    coli_wait_prior_grid();
    for (int c = 0; c < shape::ns - 1; c++) {
        if (c < chunks) copy.x(shared + c * shape::stage, at + c * shape::stage, c);
        coli_copy_commit(); /* every stage commits, empty or not, so the counts line up */
    }
    float acc[MT][NT][4] = {};
    float2 esum[NT] = {}; /* int8: E summed over the chunks, for the 1.5 * 2^23 each chunk's sums carry */
    for (int c = 0; c < chunks; c++) {
        coli_copy_wait<shape::ns - 2>(); /* chunk c has landed (for this thread's copies) */
        __syncthreads();                 /* ... and for everyone's; and chunk c - 1's slot is free */
        if (const int n = c + shape::ns - 1; n < chunks) {
            const int o = n % shape::ns * shape::stage;
            copy.weights(shared + o, at + o, n), copy.x(shared + o, at + o, n);
        }
        coli_copy_commit();
        const uint8_t *slot = shared + c % shape::ns * shape::stage;
        const uint8_t *sd = slot + shape::w_bytes + shape::s_bytes;
        /* A: this lane's 16 bytes of rows g and g + 8 of each of the warp's row tiles */
        constexpr int STEPS = FORMAT == COLI_FMT_Q8 ? 2 : 4; /* k-steps of a chunk */
        constexpr int KG = FORMAT == COLI_FMT_Q8 ? 2 : 1;    /* k-steps a sum spans: int8 the chunk, int4 a group */
        uint32_t a[MT][STEPS][4];
        float4 sc[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            if constexpr (FORMAT == COLI_FMT_Q8) {
                /* ldmatrix: matrix j rows g + 8 (j % 2), unit 2 m + j / 2: the fragment as it stands */
                const int r = wr + mt * 16 + lane % 8 + 8 * (lane / 8 % 2);
#pragma unroll
                for (int m = 0; m < 2; m++) coli_ldmatrix_x4(a[mt][m], slot + r * 64 + 16 * gemm_unit(r, 2 * m + lane / 16));
            } else {
                const int r = wr + mt * 16 + g;
                const int4 lo = *(const int4 *)(slot + r * 64 + 16 * gemm_unit(r, t));
                const int4 hi = *(const int4 *)(slot + (r + 8) * 64 + 16 * gemm_unit(r + 8, t));
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    q4_to_s8(word_of(lo, m), a[mt][m][0], a[mt][m][2]);
                    q4_to_s8(word_of(hi, m), a[mt][m][1], a[mt][m][3]);
                }
                sc[mt][0] = *(const float4 *)(slot + shape::w_bytes + 16 * r);
                sc[mt][1] = *(const float4 *)(slot + shape::w_bytes + 16 * (r + 8));
            }
        }
        /* B: this lane's bytes of token g's digits in each of the warp's token tiles;
         * C's E: its tokens 2t, 2t + 1 */
        uint32_t u[NT][DIGITS][4]; /* int8: k-steps 0 and 1 (b0, b1 each); int4: groups 0-3's words t, as pairs */
        uint32_t u2[NT][DIGITS][4]; /* int4: groups 2-3 (unused for int8) */
        float2 e[NT];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int d = 0; d < DIGITS; d++) {
                if constexpr (FORMAT == COLI_FMT_Q8) {
                    /* ldmatrix: matrix j tokens 0-7, unit j */
                    const int k = wt + nt * 8 + lane % 8;
                    coli_ldmatrix_x4(u[nt][d], sd + (d * shape::tokens + k) * shape::unit + 16 * gemm_unit(k, lane / 8));
                } else {
                    const int k = wt + nt * 8 + g;
                    const uint8_t *row = sd + (d * shape::tokens + k) * shape::unit;
                    const int4 lo = *(const int4 *)(row + 16 * ((2 * t) ^ (k & 1)));
                    const int4 hi = *(const int4 *)(row + 16 * ((2 * t + 1) ^ (k & 1)));
                    u[nt][d][0] = lo.x, u[nt][d][1] = lo.y, u[nt][d][2] = lo.z, u[nt][d][3] = lo.w;
                    u2[nt][d][0] = hi.x, u2[nt][d][1] = hi.y, u2[nt][d][2] = hi.z, u2[nt][d][3] = hi.w;
                }
            }
            e[nt] = *(const float2 *)(sd + shape::d_bytes + 4 * (wt + nt * 8 + 2 * t));
        }
        /* The sums go by units, a tile (int4: a tile's group) each: unit j's tensor-core
         * steps are issued before unit j - 1's sums are put together, so that the
         * one's arithmetic fills the other's wait. */
        constexpr int NG = STEPS / KG, UNITS = MT * NT * NG;
        float part[MT][NT][4];
        if constexpr (FORMAT == COLI_FMT_Q4) /* the groups' sums come with 1.5 * 2^23 each: taken off here */
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const float off = -FLOAT_SUM_BASE * (sc[mt][h].x + sc[mt][h].y + sc[mt][h].z + sc[mt][h].w);
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) part[mt][nt][2 * h] = part[mt][nt][2 * h + 1] = off;
                }
        int sum[2][DIGITS][4];
#pragma unroll
        for (int j = 0; j <= UNITS; j++) {
            if (j < UNITS) {
                const int grp = j % NG, mt = j / NG % MT, nt = j / NG / MT;
#pragma unroll
                for (int d = 0; d < DIGITS; d++) sum[j % 2][d][0] = sum[j % 2][d][1] = sum[j % 2][d][2] = sum[j % 2][d][3] = FLOAT_SUM_BITS;
#pragma unroll
                for (int m = grp * KG; m < grp * KG + KG; m++)
#pragma unroll
                    for (int d = 0; d < DIGITS; d++) {
                        const uint32_t(&w4)[4] = FORMAT == COLI_FMT_Q4 && m >= 2 ? u2[nt][d] : u[nt][d];
                        const uint32_t b[2] = {w4[2 * (m % 2)], w4[2 * (m % 2) + 1]};
                        coli_mma_s8(sum[j % 2][d], a[mt][m], b);
                    }
            }
            if (j > 0) {
                const int p = j - 1, grp = p % NG, mt = p / NG % MT, nt = p / NG / MT;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int(&sp)[DIGITS][4] = sum[p % 2];
                    const float v = gemm_combine(sp[0][i], sp[1][i], sp[2][i]);
                    if constexpr (FORMAT == COLI_FMT_Q8) acc[mt][nt][i] = fmaf(v, i % 2 ? e[nt].y : e[nt].x, acc[mt][nt][i]);
                    else part[mt][nt][i] = fmaf(v, elem(sc[mt][i / 2], grp), part[mt][nt][i]);
                }
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            if constexpr (FORMAT == COLI_FMT_Q4)
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) acc[mt][nt][i] = fmaf(part[mt][nt][i], i % 2 ? e[nt].y : e[nt].x, acc[mt][nt][i]);
            else
                esum[nt].x += e[nt].x, esum[nt].y += e[nt].y;
        }
    }
    coli_copy_wait<0>(); /* no copy may land after the block has gone */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int64_t row = row0 + wr + mt * 16 + g + 8 * (i / 2), tok = tok0 + wt + nt * 8 + 2 * t + i % 2;
                if (row < rows && tok < s) {
                    const float v = FORMAT == COLI_FMT_Q8 ? fmaf(-FLOAT_SUM_BASE, i % 2 ? esum[nt].y : esum[nt].x, acc[mt][nt][i]) : acc[mt][nt][i];
                    y[tok * rows + row] = v * (FORMAT == COLI_FMT_Q8 ? scale[row] : 0.0625f);
                }
            }
}

/* x's digits into `planes`, then gemm_kernel: blocks through the tokens first. */
template <int FORMAT, int WM, int WN, int MT, int NT>
static void launch_gemm(const coli_weight *w, const float *dx, int64_t s, float *planes, float *dy, cudaStream_t stream) {
    using shape = gemm_shape<FORMAT, WM, WN, MT, NT>;
    static_assert(shape::shared <= BLOCK_SHARED_MAX, "a gemm block's stages do not fit");
    const auto kernel = gemm_kernel<FORMAT, WM, WN, MT, NT>;
    static bool raised = false;
    uint32_t *digits;
    float *ex;
    const int chunks = launch_digits<FORMAT>(kernel, shape::shared, raised, w, dx, s, planes, digits, ex, stream);
    const dim3 grid((unsigned)((s + shape::tokens - 1) / shape::tokens), (unsigned)((w->rows + shape::rows - 1) / shape::rows));
    launch_early(true, kernel, grid, dim3(shape::threads), shape::shared, stream, (const uint8_t *)w->q,
                 (const float *)w->scale, (int64_t)w->rows, chunks, w->layout, (const uint8_t *)digits, (const float *)ex, s,
                 dy);
}

#endif
