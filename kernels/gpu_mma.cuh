/* int8 and int4 at S = 2 to 16 on the tensor cores: mma_kernel, and x's digits
 * (mma_prep_kernel) that it and gemm_kernel read. */
#ifndef COLI_GPU_MMA_CUH
#define COLI_GPU_MMA_CUH

#include "gpu_formats.cuh"

/* With more than one token, W meets x on the tensor cores, in int8 mma tiles
 * (m16n8k32, int32 sums): a few instructions per 16 bytes of W, and W read once
 * per 16 tokens (the dp4a kernels take about 21 instructions per int4 word per
 * token).
 *   - x is cut once per call into integers: per chunk of columns (64 for int8,
 *     128 for int4) a power of two E above the chunk's largest |x|, and
 *     v = round(x / E * 2^22), |v| < 2^22, split into int8 digits a 2^16 + b 2^8 + c.
 *     The digits are the mma's columns (a, b, c of a token in columns 0-2, of a
 *     second token in 4-6), so each sum is W times one digit, exact in int32:
 *     |sum| <= 64 * 128 * 128 = 2^20.
 *   - W: a tile is 16 rows; a lane holds 16 bytes of row g and of row g + 8 per
 *     chunk (g = lane / 4): its part of the A operand, for a k order that the
 *     digits are stored in (mma_prep_kernel). int8 rows keep the ABI's order;
 *     int4 rows are stored with each chunk's 4x4 words transposed (mma_word), so
 *     that one mma's 32 columns are one group of 32 and share a scale. An int4
 *     value n + 8 becomes 16 n, an exact signed int8, by an xor and a mask.
 *   - Per chunk (int8) or group (int4) the sums become floats, times E (and the
 *     group's scale), into a float per row and digit; the digits are put together,
 *     a 2^16 + b 2^8 + c, at the end.
 * x's rounding is 2^-23 of its chunk's largest value, below what float32 sums add
 * anyway. A block's 8 warps take a chunk each of every stage of its 16 (RB = 1)
 * or 32 (RB = 2) rows (below) and add their sums in shared memory, in a fixed
 * order. */

/* x (s tokens) -> digits and exponents, a thread per 8 columns; a chunk's threads
 * share its largest value through lane exchanges. */
template <int FORMAT>
__global__ void __launch_bounds__(256) mma_prep_kernel(const float *__restrict__ x, int64_t cols, int64_t s,
                                                       uint32_t *__restrict__ planes, float *__restrict__ ex) {
    constexpr int RUNS = mma_fmt<FORMAT>::cols / 8; /* threads per chunk: 8 or 16, aligned in a warp */
    coli_allow_next_grid(); /* mma_kernel may start loading W now; it waits for this grid before x */
    coli_wait_prior_grid(); /* launched early too (chained calls): x and `planes` are the last call's until here */
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, per_token = cols / 8;
    const bool on = i < s * per_token;
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (on) {
        const float4 lo = COLI_LOAD_FRESH((const float4 *)x + 2 * i), hi = COLI_LOAD_FRESH((const float4 *)x + 2 * i + 1);
        v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
    }
    bool run_bad;
    float m = finite_max8(v, run_bad);
    int bad = run_bad;
#pragma unroll
    for (int o = 1; o < RUNS; o <<= 1) m = fmaxf(m, COLI_SHFL_XOR(m, o)), bad |= COLI_SHFL_XOR(bad, o);
    if (!on) return; /* after the exchanges, which every lane joins */
    const int64_t chunks = cols / mma_fmt<FORMAT>::cols;
    mma_prep_run<FORMAT>(v, m, bad, i / per_token, chunks, i % per_token / RUNS, (int)(i % RUNS), planes, ex);
}

/* One chunk of RB groups of 16 rows (this lane's two rows of each), with int4's scales. */
template <int FORMAT, int RB> struct mma_slot_regs {
    int4 w[RB][2];
    float4 sc[RB][FORMAT == COLI_FMT_Q4 ? 2 : 1];
};

__device__ inline float elem(const float4 &v, int m) { return m == 0 ? v.x : m == 1 ? v.y : m == 2 ? v.z : v.w; }

/* Bytes of one token's digits per chunk, and per stage in shared memory (64 more:
 * the two tokens of a pair then fall in different bank halves). */
template <int FORMAT> struct mma_planes {
    static constexpr int chunk = DIGITS * 4 * 2 * mma_fmt<FORMAT>::steps * 4;
    static constexpr int pitch = MMA_WARPS * chunk + 64;
};

/* Chunk j of a stage into the sums, for TP pairs of tokens (`valid` of them real):
 * sp, se: the stage's digits and E in shared memory. */
template <int FORMAT, int RB, int TP>
__device__ inline void mma_chunk(const mma_slot_regs<FORMAT, RB> &sl, const uint8_t *sp, const float *se, int j,
                                 int64_t valid, int g, int t, float (&acc)[RB][TP][4]) {
    constexpr int STEPS = mma_fmt<FORMAT>::steps;
#pragma unroll
    for (int p = 0; p < TP; p++) {
        /* B: this lane holds digit g % 4 of token 2p + g / 4 (digit 3: none) */
        const int kb = 2 * p + g / 4;
        int4 u[STEPS / 2];
        const bool has = g % 4 < DIGITS && kb < valid;
        const int4 *pu = (const int4 *)(sp + kb * mma_planes<FORMAT>::pitch + j * mma_planes<FORMAT>::chunk +
                                        (g % 4 * 4 + t) * 2 * STEPS * 4);
#pragma unroll
        for (int k = 0; k < STEPS / 2; k++) u[k] = has ? pu[k] : make_int4(0, 0, 0, 0);
        /* C: this lane's columns 2t, 2t + 1 belong to token 2p + t / 2 */
        const float e = se[(2 * p + t / 2) * MMA_WARPS + j];
#pragma unroll
        for (int rb = 0; rb < RB; rb++) {
            if constexpr (FORMAT == COLI_FMT_Q8) {
                int sum[4] = {0, 0, 0, 0};
#pragma unroll
                for (int m = 0; m < STEPS; m++) {
                    uint32_t a[4], b[2];
                    mma_operands<FORMAT>(sl.w[rb][0], sl.w[rb][1], u, m, a, b);
                    coli_mma_s8(sum, a, b);
                }
#pragma unroll
                for (int i = 0; i < 4; i++) acc[rb][p][i] = fmaf((float)sum[i], e, acc[rb][p][i]);
            } else {
#pragma unroll
                for (int m = 0; m < STEPS; m++) { /* tile m: group m of the chunk */
                    uint32_t a[4], b[2];
                    mma_operands<FORMAT>(sl.w[rb][0], sl.w[rb][1], u, m, a, b);
                    int sum[4] = {0, 0, 0, 0};
                    coli_mma_s8(sum, a, b);
                    const float fg = e * elem(sl.sc[rb][0], m), fg8 = e * elem(sl.sc[rb][1], m);
                    acc[rb][p][0] = fmaf((float)sum[0], fg, acc[rb][p][0]);
                    acc[rb][p][1] = fmaf((float)sum[1], fg, acc[rb][p][1]);
                    acc[rb][p][2] = fmaf((float)sum[2], fg8, acc[rb][p][2]);
                    acc[rb][p][3] = fmaf((float)sum[3], fg8, acc[rb][p][3]);
                }
            }
        }
    }
}

/* The block's weights pass through shared memory in stages of MMA_WARPS chunks
 * (512 bytes of each of its 16 RB rows, int4's scales for them, and the chunks'
 * digits and E for its tokens), NS stages in flight, copied in the background
 * (cp.async: no registers held meanwhile). Each copy instruction moves 512 bytes
 * of one row: read straight into the fragments, a warp's loads touched 8 rows for
 * 64 bytes each, and HBM served them at half the rate of long runs. Rows in
 * shared memory are 64 bytes longer than their data, so that the 8 rows a
 * fragment load touches alternate between the two halves of the banks. */
#define MMA_ROW_PITCH (MMA_WARPS * 64 + 64)
#define MMA_SCALE_PITCH (MMA_WARPS * 16 + 16)
/* The least shared memory a block may have among the targets: sm_86/89/120 99 KiB, AMD 64 KiB. */
#define BLOCK_SHARED_MAX ((COLI_HAS_PDL ? 99 : 64) * 1024)
/* Shared memory a block's stages may take: 72 KiB leaves room for 3 blocks on an
 * sm_90 multiprocessor and fits sm_86/sm_89's 99 KiB; HIP's blocks get 64 KiB. */
#define MMA_SHARED_BUDGET (COLI_HAS_PDL ? 72 * 1024 : 64 * 1024)
/* Pairs of tokens a block takes at most: int4's digits take twice int8's room. */
template <int FORMAT> struct mma_pairs {
    static constexpr int max = !COLI_HAS_PDL ? 2 : FORMAT == COLI_FMT_Q4 ? 4 : 8;
};

template <int FORMAT, int RB, int NS, int TP> struct mma_shape {
    static constexpr int rows = 16 * RB;
    static constexpr int w_bytes = rows * MMA_ROW_PITCH;
    static constexpr int s_bytes = FORMAT == COLI_FMT_Q4 ? rows * MMA_SCALE_PITCH : 0;
    static constexpr int p_bytes = 2 * TP * mma_planes<FORMAT>::pitch;
    static constexpr int e_bytes = 2 * TP * MMA_WARPS * 4;
    static constexpr int stage = w_bytes + s_bytes + p_bytes + e_bytes;
    /* stages in flight: NS, fewer when they would pass the budget, 2 at least */
    static constexpr int ns = NS * stage <= MMA_SHARED_BUDGET ? NS : MMA_SHARED_BUDGET / stage > 2 ? MMA_SHARED_BUDGET / stage : 2;
    static constexpr int reduce = MMA_WARPS * RB * 2 * TP * 16 * 4; /* the warps' sums, at the end */
    static constexpr int shared = ns * stage > reduce ? ns * stage : reduce;
};

/* int4's scales of stage st into its slot (4 a chunk: 128 bytes of each row), without committing. */
template <int FORMAT, int RB, int NS, int TP>
__device__ inline void mma_scale_copy(uint8_t *slot, const float *__restrict__ scale, int64_t rows, int64_t row0, int chunks,
                                      int32_t layout, int st) {
    using shape = mma_shape<FORMAT, RB, NS, TP>;
    for (int i = threadIdx.x; i < shape::rows * 8; i += MMA_WARPS * WARP) {
        const int r = i / 8, k = i % 8;
        const int64_t row = row0 + r < rows ? row0 + r : rows - 1, sat = (int64_t)st * MMA_WARPS * 16 + 16 * k;
        if (sat < (int64_t)chunks * 16)
            coli_copy_async16(slot + shape::w_bytes + r * MMA_SCALE_PITCH + 16 * k, scale + q4_s_at(layout, row, sat / 16, chunks));
    }
}

/* Stage st into its slot, without committing: W (warp w copies rows w, w + 8, ...,
 * lane l the 16 bytes at 16 l) and int4's scales, or x's digits and E for the
 * block's tokens (from 2 pair0 on; `valid` of them real). */
template <int FORMAT, int RB, int NS, int TP, bool X>
__device__ inline void mma_stage_copy(uint8_t *shared, const uint8_t *__restrict__ q, const float *__restrict__ scale,
                                      const uint32_t *__restrict__ planes, const float *__restrict__ ex, int64_t rows,
                                      int64_t row0, int64_t tok0, int64_t valid, int chunks, int32_t layout, int st) {
    using shape = mma_shape<FORMAT, RB, NS, TP>;
    uint8_t *slot = shared + (st % shape::ns) * shape::stage;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int64_t row_bytes = (int64_t)chunks * 64;
    if constexpr (!X) {
        const int64_t at = (int64_t)st * MMA_WARPS * 64 + 16 * lane;
        if (FORMAT == COLI_FMT_Q4 && TP > 1 && layout == TILE_LAYOUT) {
            /* a warp's copy: 8 rows of one chunk, 512 bytes of an item side by side (a row's
             * chunks lie 1 KB apart there), a little faster from 4 tokens; 2 tokens (TP = 1)
             * keep the copies row by row, which they run faster. The scales are copied here
             * and below alike: one copy after both gained nothing. */
#pragma unroll
            for (int i = warp; i < shape::rows; i += MMA_WARPS) {
                const int r = i / MMA_WARPS * 8 + lane / 4, k = i % MMA_WARPS;
                const int64_t row = row0 + r < rows ? row0 + r : rows - 1, chunk = (int64_t)st * MMA_WARPS + k;
                if (chunk < chunks)
                    coli_copy_async16(slot + r * MMA_ROW_PITCH + 64 * k + 16 * (lane % 4),
                                      q + q4_w_at(layout, row, chunk, chunks) + 16 * (lane % 4));
            }
            mma_scale_copy<FORMAT, RB, NS, TP>(slot, scale, rows, row0, chunks, layout, st);
            return;
        }
#pragma unroll
        for (int r = warp; r < shape::rows; r += MMA_WARPS) {
            const int64_t row = row0 + r < rows ? row0 + r : rows - 1;
            if (at < row_bytes)
                coli_copy_async16(slot + r * MMA_ROW_PITCH + 16 * lane, q + q4_w_at(layout, row, at / 64, chunks) + at % 64);
        }
        if constexpr (FORMAT == COLI_FMT_Q4) mma_scale_copy<FORMAT, RB, NS, TP>(slot, scale, rows, row0, chunks, layout, st);
    } else {
        constexpr int PIECES = mma_planes<FORMAT>::chunk / 16; /* per chunk and token */
        uint8_t *sp = slot + shape::w_bytes + shape::s_bytes;
        for (int i = threadIdx.x; i < 2 * TP * (MMA_WARPS * PIECES + 2); i += MMA_WARPS * WARP) {
            const int k = i / (MMA_WARPS * PIECES + 2), piece = i % (MMA_WARPS * PIECES + 2);
            if (k >= valid) continue;
            if (piece < MMA_WARPS * PIECES) { /* digits of chunks st * 8 .. st * 8 + 7: side by side */
                if (st * MMA_WARPS + piece / PIECES < chunks)
                    coli_copy_async16(sp + k * mma_planes<FORMAT>::pitch + 16 * piece,
                                      (const uint8_t *)(planes + plane_at<FORMAT>(tok0 + k, chunks, (int64_t)st * MMA_WARPS, 0, 0)) +
                                          16 * piece);
            } else { /* E of those chunks: 32 bytes (padded past the last chunk) */
                const int h = piece - MMA_WARPS * PIECES;
                coli_copy_async16(sp + shape::p_bytes + k * MMA_WARPS * 4 + 16 * h,
                                  ex + ex_at(tok0 + k, chunks, (int64_t)st * MMA_WARPS) + 4 * h);
            }
        }
    }
}

/* Weights: int8 in the ABI's order (cols % 64 == 0), int4 in the mma layout.
 * Block (x, y): rows from 16 RB x, token pairs from TP y; warp w takes chunk w of
 * every stage. */
template <int FORMAT, int RB, int NS, int TP>
__global__ void __launch_bounds__(MMA_WARPS * WARP)
    mma_kernel(const uint8_t *__restrict__ q, const float *__restrict__ scale, int64_t rows, int chunks, int32_t layout,
               const uint32_t *__restrict__ planes, const float *__restrict__ ex, int64_t s, float *__restrict__ y) {
    using shape = mma_shape<FORMAT, RB, NS, TP>;
    extern __shared__ __align__(16) uint8_t shared[];
    coli_allow_next_grid(); /* the next call's kernels may take free room from here on */
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, g = lane / 4, t = lane % 4;
    const int64_t row0 = (int64_t)blockIdx.x * shape::rows, pair0 = (int64_t)blockIdx.y * TP;
    const int64_t tok0 = 2 * pair0, valid = s - tok0 < 2 * TP ? s - tok0 : 2 * TP;
    const int stages = (chunks + MMA_WARPS - 1) / MMA_WARPS;
#define MMA_COPY(X, st) \
    mma_stage_copy<FORMAT, RB, NS, TP, X>(shared, q, scale, planes, ex, rows, row0, tok0, valid, chunks, layout, st)
    /* W's first stages while mma_prep_kernel may still run; x's once it is done.
     * The first group then holds all of those W stages: waiting for it waits a
     * little longer once, and every later count still lines up. */
#pragma unroll
    for (int st = 0; st < shape::ns - 1; st++)
        if (st < stages) MMA_COPY(false, st);
    coli_wait_prior_grid();
#pragma unroll
    for (int st = 0; st < shape::ns - 1; st++) {
        if (st < stages) MMA_COPY(true, st);
        coli_copy_commit(); /* every stage commits, empty or not, so the counts line up */
    }
    float acc[RB][TP][4];
#pragma unroll
    for (int rb = 0; rb < RB; rb++)
#pragma unroll
        for (int p = 0; p < TP; p++) acc[rb][p][0] = acc[rb][p][1] = acc[rb][p][2] = acc[rb][p][3] = 0.0f;
    for (int st = 0; st < stages; st++) {
        coli_copy_wait<shape::ns - 2>(); /* stage st has landed (for this thread's copies) */
        __syncthreads();          /* ... and for everyone's; and slot st - 1 is free */
        const int c = st * MMA_WARPS + warp;
        if (c < chunks) {
            const uint8_t *slot = shared + (st % shape::ns) * shape::stage;
            mma_slot_regs<FORMAT, RB> sl;
#pragma unroll
            for (int rb = 0; rb < RB; rb++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = rb * 16 + g + 8 * h;
                    sl.w[rb][h] = *(const int4 *)(slot + r * MMA_ROW_PITCH + 64 * warp + 16 * t);
                    if constexpr (FORMAT == COLI_FMT_Q4)
                        sl.sc[rb][h] = *(const float4 *)(slot + shape::w_bytes + r * MMA_SCALE_PITCH + 16 * warp);
                }
            const uint8_t *sp = slot + shape::w_bytes + shape::s_bytes;
            mma_chunk<FORMAT, RB, TP>(sl, sp, (const float *)(sp + shape::p_bytes), warp, valid, g, t, acc);
        }
        if (st + shape::ns - 1 < stages) MMA_COPY(false, st + shape::ns - 1), MMA_COPY(true, st + shape::ns - 1);
        coli_copy_commit();
    }
#undef MMA_COPY
    coli_copy_wait<0>();
    __syncthreads(); /* the slots become the warps' sums */
    float(*partial)[RB][2 * TP][16] = (float(*)[RB][2 * TP][16])shared;
    /* columns 2t, 2t + 1 hold digits (a, b) for even t, (c, none) for odd t */
    const float w0 = t % 2 ? 1.0f : 65536.0f, w1 = t % 2 ? 0.0f : 256.0f;
#pragma unroll
    for (int rb = 0; rb < RB; rb++)
#pragma unroll
        for (int p = 0; p < TP; p++) {
            float vg = w0 * acc[rb][p][0] + w1 * acc[rb][p][1], vg8 = w0 * acc[rb][p][2] + w1 * acc[rb][p][3];
            vg += COLI_SHFL_XOR(vg, 1), vg8 += COLI_SHFL_XOR(vg8, 1);
            if (t % 2 == 0) partial[warp][rb][2 * p + t / 2][g] = vg, partial[warp][rb][2 * p + t / 2][g + 8] = vg8;
        }
    __syncthreads();
    for (int i = threadIdx.x; i < RB * 2 * TP * 16; i += MMA_WARPS * WARP) {
        const int r = i % 16, k = i / 16 % (2 * TP), rb = i / 16 / (2 * TP);
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < MMA_WARPS; w++) v += partial[w][rb][k][r];
        const int64_t row = row0 + rb * 16 + r, tok = 2 * pair0 + k;
        if (row < rows && tok < s) y[tok * rows + row] = v * (FORMAT == COLI_FMT_Q8 ? scale[row] : 0.0625f);
    }
}

/* int8 and int4, before mma_kernel or gemm_kernel (`kernel`, taking `bytes` of
 * shared memory; `raised`: its flag for allow_shared): x's digits and E into
 * `planes` (device scratch of s * cols floats; E after every token's digits),
 * launched early where calls chain. Returns the weight's chunks. */
template <int FORMAT, typename Kernel>
static int launch_digits(Kernel kernel, int bytes, bool &raised, const coli_weight *w, const float *dx, int64_t s,
                         float *planes, uint32_t *&digits, float *&ex, cudaStream_t stream) {
    allow_shared(kernel, bytes, raised);
    digits = (uint32_t *)planes;
    ex = (float *)((char *)planes + (size_t)s * DIGITS * (size_t)w->cols);
    const int64_t threads = s * (w->cols / 8);
    launch_early(chain_calls(), mma_prep_kernel<FORMAT>, dim3((unsigned)((threads + 255) / 256)), dim3(256), 0, stream,
                 dx, w->cols, s, digits, ex);
    return (int)(w->cols / mma_fmt<FORMAT>::cols);
}

/* int8 and int4: x's digits into `planes` (device scratch of s * cols floats), then
 * the mma kernel with TP pairs of tokens per block. */
template <int FORMAT, int RB, int NS, int TP>
static void launch_mma_pairs(const coli_weight *w, const float *dx, int64_t s, float *planes, float *dy,
                             cudaStream_t stream) {
    using shape = mma_shape<FORMAT, RB, NS, TP>;
    static_assert(shape::shared <= BLOCK_SHARED_MAX, "an mma block's stages do not fit");
    const auto kernel = mma_kernel<FORMAT, RB, NS, TP>;
    static bool raised = false;
    uint32_t *digits;
    float *ex;
    const int chunks = launch_digits<FORMAT>(kernel, shape::shared, raised, w, dx, s, planes, digits, ex, stream);
    const dim3 grid((unsigned)((w->rows + shape::rows - 1) / shape::rows), (unsigned)((s + 2 * TP - 1) / (2 * TP)));
    launch_early(true, kernel, grid, dim3(MMA_WARPS * WARP), shape::shared, stream, (const uint8_t *)w->q,
                 (const float *)w->scale, (int64_t)w->rows, chunks, w->layout, (const uint32_t *)digits, (const float *)ex,
                 s, dy);
}

/* Pairs of tokens per block: the fewest of 1, 2, 4, 8 that cover s, up to the
 * format's most (more tokens: blocks in y). */
template <int FORMAT, int RB, int NS>
static void launch_mma(const coli_weight *w, const float *dx, int64_t s, float *planes, float *dy, cudaStream_t stream) {
    constexpr int MAX = mma_pairs<FORMAT>::max;
    if (s <= 2) launch_mma_pairs<FORMAT, RB, NS, 1>(w, dx, s, planes, dy, stream);
    else if (s <= 4 || MAX == 2) launch_mma_pairs<FORMAT, RB, NS, 2>(w, dx, s, planes, dy, stream);
    else if (s <= 8 || MAX == 4) launch_mma_pairs<FORMAT, RB, NS, MAX < 4 ? MAX : 4>(w, dx, s, planes, dy, stream);
    else launch_mma_pairs<FORMAT, RB, NS, MAX>(w, dx, s, planes, dy, stream);
}

#endif
