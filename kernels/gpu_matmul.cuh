/* The GPU backend's matmul, y[S,O] = x[S,I] · Wᵀ, for f32, int8 (per-row scale)
 * and int4 (grouped scale) weights; one source for CUDA and HIP. Included by
 * backend_gpu.cu (and by bench/gpu_matmul_bench.cu, which times the variants).
 *
 *   decode_kernel int8 and int4, S = 1: bound by reading W from memory. x is cut
 *                 into int8 digits that W meets in exact integer dot products.
 *   decode_bulk_kernel (gpu_decode_bulk.cuh) the same sums for tall weights on
 *                 sm_90, W streamed into shared memory by the copy engine.
 *   mma_kernel    int8 and int4, S = 2 to 16: the same digits on the tensor
 *                 cores, W read once per 16 tokens.
 *   gemm_kernel (gpu_gemm.cuh) int8 and int4, S > 16: the same digits, a block
 *                 128 rows by up to 64 tokens, 8 tokens of one digit a step.
 *   gemv_kernel   f32, S <= 16: bound by reading W, once per 8 tokens.
 *   tile_kernel   f32 (and int8/int4 the above do not take), S > 16: bound by
 *                 f32 arithmetic.
 *   simple_kernel any shape, and the reference path (COLI_GPU_SIMPLE=1) for
 *                 comparisons.
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

/* The sum of v over a warp's lanes, in every lane (the same order in each). */
__device__ inline float warp_sum(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v += COLI_SHFL_XOR(v, o);
    return v;
}

/* Values in one 32-bit word, per format. */
template <int FORMAT> struct fmt {
    static constexpr int per_word = FORMAT == COLI_FMT_F32 ? 1 : FORMAT == COLI_FMT_Q8 ? 4 : 8;
};

template <int FORMAT> __device__ inline void dequant(uint32_t word, float (&v)[fmt<FORMAT>::per_word]) {
    if constexpr (FORMAT == COLI_FMT_F32) v[0] = __uint_as_float(word);
    else if constexpr (FORMAT == COLI_FMT_Q8) dequant_q8(word, v);
    else dequant_q4(word, v);
}

__host__ __device__ inline uint32_t word_of(const int4 &p, int m) {
    return (uint32_t)(m == 0 ? p.x : m == 1 ? p.y : m == 2 ? p.z : p.w);
}

/* Bit casts that the host can run too (the layout check runs these functions there). */
__host__ __device__ inline float as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
__host__ __device__ inline uint32_t as_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---- int8 and int4 on the tensor cores: mma_kernel ---------------------------------
 * With more than one token, W meets x on the tensor cores, in int8 mma tiles
 * (m16n8k32, int32 sums): a few instructions per 16 bytes of W, and W read once
 * per 16 tokens (the dp4a kernels took about 21 instructions per int4 word per
 * token; bench/RESULTS.md).
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
#define MMA_WARPS 8
#define DIGITS 3
#define V_MAX ((1 << 22) - 1) /* |v| <= V_MAX */

template <int FORMAT> struct mma_fmt {
    static constexpr int cols = FORMAT == COLI_FMT_Q8 ? 64 : 128; /* a chunk: 64 bytes of a row */
    static constexpr int steps = cols / 32;                        /* mma tiles per chunk */
};

/* int4 rows for mma_kernel: in each 64-byte chunk (16 words), stored word 4t + j
 * holds the ABI's word 4j + t, so that lane slot t's 16 bytes hold its word of
 * each of the chunk's 4 groups. The map is its own inverse. */
#define MMA_LAYOUT 1
__host__ __device__ inline int64_t mma_word(int64_t wn) {
    return (wn & ~(int64_t)15) | (wn & 3) << 2 | (wn & 15) >> 2;
}

/* Whether a weight is stored in the mma layout: int4 rows of whole chunks in groups of 32. */
static inline bool mma_layout(int32_t format, int64_t cols, int32_t group) {
    return format == COLI_FMT_Q4 && cols % 128 == 0 && group == 32;
}

/* Host side: `words` 32-bit words in the ABI's order -> the mma layout (`src` may
 * be unaligned, as in a mapped file). */
static void mma_reorder(const void *src, void *dst, int64_t words) {
    for (int64_t wn = 0; wn < words; wn++) memcpy((char *)dst + 4 * mma_word(wn), (const char *)src + 4 * wn, 4);
}

/* int4 rows tile by tile (decode_tiled_kernel, gpu_decode_tiled.cuh): the mma
 * layout's 64-byte chunks, each 16-row tile's chunk c an item of 1 KB (its rows
 * side by side), items tile by tile, so that a warp's next items are one
 * contiguous copy; the scales the same, a chunk's 4 of each row, 64 floats an
 * item. Rows whole tiles. */
#define TILE_LAYOUT 2
/* Where row `row`'s chunk `chunk` starts: W (bytes) and its 4 scales (floats), in
 * either int4 layout (mma: rows side by side; tile: items). A row's chunks are a
 * fixed stride apart in both (q4_chunk_stride). */
__host__ __device__ inline int64_t q4_w_at(int32_t layout, int64_t row, int64_t chunk, int64_t chunks) {
    return layout == TILE_LAYOUT ? (row / 16 * chunks + chunk) * 1024 + row % 16 * 64 : (row * chunks + chunk) * 64;
}
__host__ __device__ inline int64_t q4_s_at(int32_t layout, int64_t row, int64_t chunk, int64_t chunks) {
    return layout == TILE_LAYOUT ? (row / 16 * chunks + chunk) * 64 + row % 16 * 4 : (row * chunks + chunk) * 4;
}
__host__ __device__ inline int q4_chunk_stride(int32_t layout) { return layout == TILE_LAYOUT ? 1024 : 64; }

/* Host side: int4 rows (ABI order, whole chunks) and their group-32 scales -> the
 * tile layout. */
static void tile_reorder(const void *src, const float *scale, int64_t rows, int64_t cols, void *dst, float *sdst) {
    const int64_t chunks = cols / 128;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < chunks; c++) {
            char *to = (char *)dst + q4_w_at(TILE_LAYOUT, r, c, chunks);
            const char *from = (const char *)src + (r * chunks + c) * 64;
            for (int j = 0; j < 16; j++) memcpy(to + 4 * mma_word(j), from + 4 * j, 4);
            memcpy(sdst + q4_s_at(TILE_LAYOUT, r, c, chunks), scale + (r * chunks + c) * 4, 16);
        }
}

/* int4 word (nibbles n + 8) -> 4 signed int8 16 n of its even columns (the low
 * nibbles) and of its odd ones: xor 8 makes each nibble n in two's complement. */
__host__ __device__ inline void q4_to_s8(uint32_t w, uint32_t &even, uint32_t &odd) {
    const uint32_t n = w ^ 0x88888888u;
    even = (n << 4) & 0xF0F0F0F0u, odd = n & 0xF0F0F0F0u;
}

__host__ __device__ inline uint32_t pack4(int v0, int v1, int v2, int v3) {
    return (uint32_t)(v0 & 0xFF) | (uint32_t)(v1 & 0xFF) << 8 | (uint32_t)(v2 & 0xFF) << 16 | (uint32_t)(v3 & 0xFF) << 24;
}

/* 2^e as a float, for e in [-126, 127]: built from its bits (no ldexpf). */
__host__ __device__ inline float pow2(int e) { return as_float((uint32_t)(e + 127) << 23); }

/* 1.5 2^23 and its bits. An integer below 2^22 added to it in a float lands in the
 * low bits (run_units cuts x so); an int32 sum started at the bits reads, as a
 * float, 1.5 2^23 plus the sum, exactly while |sum| < 2^22 (float_sum takes the
 * 1.5 2^23 off: the tensor cores' sums need no conversion instruction). */
#define FLOAT_SUM_BITS 0x4B400000
#define FLOAT_SUM_BASE 12582912.0f
__host__ __device__ inline float float_sum(int bits) { return as_float((uint32_t)bits) - FLOAT_SUM_BASE; }

/* The digits of 8 values of a chunk whose largest |x| is below 2^ex. */
__host__ __device__ inline void digits_of8(const float (&x)[8], int ex, int (&d)[DIGITS][8]) {
    const bool near = ex >= -104; /* 2^(22 - ex) is a normal float: one exact multiply */
    for (int j = 0; j < 8; j++) {
        int v = (int)rintf(near ? x[j] * pow2(22 - ex) : ldexpf(x[j], 22 - ex)); /* exact before the rounding */
        v = v > V_MAX ? V_MAX : v < -V_MAX ? -V_MAX : v; /* 2^22 itself: a step of 2^-22 of E */
        const int c = ((v + 128) & 255) - 128, v1 = (v - c) >> 8; /* v - c is a multiple of 256 */
        const int b = ((v1 + 128) & 255) - 128;
        d[0][j] = (v1 - b) >> 8, d[1][j] = b, d[2][j] = c;
    }
}

/* The largest finite |x| of 8 values; `bad` when one is inf or NaN (the sums must
 * then come out NaN, not finite). */
__host__ __device__ inline float finite_max8(const float (&v)[8], bool &bad) {
    float m = 0.0f;
    bad = false;
    for (int j = 0; j < 8; j++) {
        if (fabsf(v[j]) <= 3.40282347e38f) m = fmaxf(m, fabsf(v[j])); /* FLT_MAX: finite */
        else bad = true;
    }
    return m;
}

/* E * 2^-22 for values below 2^ex: NaN when they hold an inf or NaN, 0 when they
 * are below 2^-127 (such values count as 0). */
__host__ __device__ inline float digit_step(int ex, bool bad) {
    return bad ? NAN : ex >= -104 ? pow2(ex - 22) : ldexpf(1.0f, ex - 22);
}

/* Where 8 columns' digits go: the chunk's run q of 8 columns is lane slot t's
 * mma tile m. Its two words are b0, b1 of that tile: int8, the run's first and
 * last 4 columns; int4, its even and its odd columns (as the nibbles lie). */
template <int FORMAT> __host__ __device__ inline void mma_slot(int q, int &t, int &m) {
    if (FORMAT == COLI_FMT_Q8) t = q / 2, m = q % 2; /* lane t loads columns 16t..16t+15 */
    else t = q % 4, m = q / 4;                       /* tile m is group m; lane t has its word t */
}
template <int FORMAT> __host__ __device__ inline void mma_pack(const int (&d)[8], uint32_t &b0, uint32_t &b1) {
    if (FORMAT == COLI_FMT_Q8) b0 = pack4(d[0], d[1], d[2], d[3]), b1 = pack4(d[4], d[5], d[6], d[7]);
    else b0 = pack4(d[0], d[2], d[4], d[6]), b1 = pack4(d[1], d[3], d[5], d[7]);
}

/* Where token tok's E * 2^-22 for chunk c is: a token's are padded to whole
 * stages of chunks, so that a stage's are 32 aligned bytes. */
__host__ __device__ inline int64_t ex_at(int64_t tok, int64_t chunks, int64_t c) {
    return tok * ((chunks + MMA_WARPS - 1) / MMA_WARPS * MMA_WARPS) + c;
}

/* Word index of token tok's digit k for chunk c, lane slot t (then 2 words per tile). */
template <int FORMAT>
__host__ __device__ inline int64_t plane_at(int64_t tok, int64_t chunks, int64_t c, int k, int t) {
    return (((tok * chunks + c) * DIGITS + k) * 4 + t) * 2 * mma_fmt<FORMAT>::steps;
}

/* One run of 8 columns (run q of chunk c of token tok) -> its digits in `planes`
 * and, for the chunk's first run, E * 2^-22 in `ex`: NaN when the chunk holds an
 * inf or NaN (`bad`; the sums must come out NaN, not finite), 0 when its largest
 * |x|, `m`, is below 2^-127 (such chunks count as 0). */
template <int FORMAT>
__host__ __device__ inline void mma_prep_run(const float (&v)[8], float m, bool bad, int64_t tok, int64_t chunks,
                                             int64_t c, int q, uint32_t *planes, float *ex) {
    int t, tile, ex_m = 0, d[DIGITS][8] = {};
    mma_slot<FORMAT>(q, t, tile);
    (void)frexpf(m, &ex_m); /* m < 2^ex_m */
    if (!bad) digits_of8(v, ex_m, d);
    for (int k = 0; k < DIGITS; k++) {
        uint32_t *out = planes + plane_at<FORMAT>(tok, chunks, c, k, t) + 2 * tile;
        mma_pack<FORMAT>(d[k], out[0], out[1]);
    }
    if (q == 0) ex[ex_at(tok, chunks, c)] = digit_step(ex_m, bad);
}

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

/* Tile m's operands: A from the lane's 16 bytes of rows g and g + 8 of a chunk,
 * B from its digit words u of the chunk (2 per tile). */
template <int FORMAT>
__host__ __device__ inline void mma_operands(const int4 &wg, const int4 &wg8, const int4 *u, int m, uint32_t (&a)[4],
                                             uint32_t (&b)[2]) {
    if (FORMAT == COLI_FMT_Q8) {
        a[0] = word_of(wg, 2 * m), a[1] = word_of(wg8, 2 * m), a[2] = word_of(wg, 2 * m + 1), a[3] = word_of(wg8, 2 * m + 1);
    } else {
        q4_to_s8(word_of(wg, m), a[0], a[2]);
        q4_to_s8(word_of(wg8, m), a[1], a[3]);
    }
    b[0] = word_of(u[m / 2], 2 * (m % 2)), b[1] = word_of(u[m / 2], 2 * (m % 2) + 1);
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
             * chunks lie 1 KB apart there): 4 to 16 tokens 1-2% faster (bench/RESULTS.md,
             * twenty-third pass). 2 tokens (TP = 1) keep the copies row by row, their code
             * unchanged (they came out 1-4% slower). The scales are copied here and below
             * alike: with one copy after both, 8 and 16 tokens gained nothing. */
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

/* ---- int8 and int4 at S = 1: decode_kernel ----------------------------------------
 * One token leaves the tensor cores' tiles mostly empty (3 of their 8 columns),
 * and mma_kernel's stages and barriers cost more than they save: at S = 1 a warp
 * owns R rows instead (or KS warps share them, each a KS-th of their runs) and
 * reads them as 16-byte pieces, lane i piece i of each run of 32, through a ring
 * of D runs in flight (as gemv_kernel does for f32). x is cut
 * per run of 8 columns into the same int8 digits (E per 8 columns), stored in the
 * order the lanes read them (decode_unit), so that a warp's x loads are side by
 * side whatever the weights' layout; a weight word meets them in dp4a, exactly:
 * a word's true sum is below 4 * 128 * 2^22 = 2^31 (int8) or 8 * 15 * 2^22 (int4,
 * values n + 8), and int32 arithmetic wraps, so its parts may overflow on the
 * way. A word then costs int8 3 dp4a, 2 multiply-adds, a conversion and an fma;
 * int4 3 masks, 6 dp4a, 2 multiply-adds, a conversion, a multiply and an fma.
 * Per word the kernel reads 16 bytes of digits (int8: a, b, c of 4 columns, E) or
 * 32 (int4: a, b, c of the even and of the odd columns, E, and -8 times the sum of
 * the 8 v, which takes off the values' bias of 8). */

/* Where lane i reads the digits of the ABI's word wn: word m of the piece at
 * `start` + i, in a row of `pieces`, is unit start * 4 + m * nb + i. */
__host__ __device__ inline int64_t decode_unit(int32_t layout, int64_t wn, int64_t pieces) {
    const int64_t sp = layout ? mma_word(wn) : wn, piece = sp / 4, start = piece / WARP * WARP;
    const int64_t nb = pieces - start < WARP ? pieces - start : WARP;
    return start * 4 + sp % 4 * nb + (piece - start);
}

/* Byte k of each of 4 words, packed (k in 0-3). */
__host__ __device__ inline uint32_t bytes_of4(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, uint32_t k) {
    const uint32_t two = k | (k + 4) << 4;
    return coli_byte_perm(coli_byte_perm(w0, w1, two), coli_byte_perm(w2, w3, two), 0x5410);
}

/* x's run of 8 columns -> its units: int8, one a word (a, b, c, E); int4, the two
 * halves of its word's 32 bytes. Every S = 1 call starts here, so digits_of8's work
 * is done leanly (one multiply-add whose bits hold v, the digits as the bytes they
 * are: a third of the instructions, the same units bit for bit; bench/RESULTS.md,
 * ninth and tenth passes); a run below 2^-104 takes digits_of8 itself. */
template <int FORMAT> __host__ __device__ inline void run_units(const float (&v)[8], float4 (&units)[2]) {
    uint32_t top = 0; /* the largest |x|'s bits: an inf or NaN is above every finite value */
    for (int j = 0; j < 8; j++) {
        const uint32_t a = as_bits(v[j]) & 0x7FFFFFFFu;
        top = a > top ? a : top;
    }
    const bool bad = top >= 0x7F800000u;
    int ex = (int)(top >> 23) - 126; /* the run's largest |x| < 2^ex */
    if (top < 0x00800000u) (void)frexpf(as_float(top), &ex); /* 0 or subnormal */
    const float e = digit_step(ex, bad);
    uint32_t p[DIGITS][2] = {}; /* int8: columns 0-3 and 4-7; int4: the even and the odd (as mma_pack lays them) */
    int sum = 0;
    if (!bad && ex >= -104) {
        const float step = pow2(22 - ex);
        /* q = a 2^16 + b 2^8 + c with b and c in [-128, 127]: q + 0x808080 has a + 128,
         * b + 128 and c + 128 as its bytes 2, 1 and 0 (no byte carries into the next),
         * and a digit's byte is its biased byte with the top bit flipped */
        uint32_t u[8];
        for (int j = 0; j < 8; j++) {
            /* x 2^(22 - ex) is exact and below 2^22: added to 1.5 2^23 it rounds to an integer in the low bits */
            int q = (int)as_bits(fmaf(v[j], step, FLOAT_SUM_BASE)) - FLOAT_SUM_BITS;
            q = q > V_MAX ? V_MAX : q < -V_MAX ? -V_MAX : q;
            u[j] = (uint32_t)q + 0x808080u, sum += q;
        }
        for (int k = 0; k < DIGITS; k++) {
            const uint32_t at = 2 - (uint32_t)k;
            if (FORMAT == COLI_FMT_Q8)
                p[k][0] = bytes_of4(u[0], u[1], u[2], u[3], at) ^ 0x80808080u,
                p[k][1] = bytes_of4(u[4], u[5], u[6], u[7], at) ^ 0x80808080u;
            else
                p[k][0] = bytes_of4(u[0], u[2], u[4], u[6], at) ^ 0x80808080u,
                p[k][1] = bytes_of4(u[1], u[3], u[5], u[7], at) ^ 0x80808080u;
        }
    } else if (!bad) {
        int d[DIGITS][8];
        digits_of8(v, ex, d);
        for (int k = 0; k < DIGITS; k++) mma_pack<FORMAT>(d[k], p[k][0], p[k][1]);
        for (int j = 0; j < 8; j++) sum += d[0][j] * 65536 + d[1][j] * 256 + d[2][j];
    }
    if (FORMAT == COLI_FMT_Q8) {
        for (int h = 0; h < 2; h++) units[h] = make_float4(as_float(p[0][h]), as_float(p[1][h]), as_float(p[2][h]), e);
    } else {
        units[0] = make_float4(as_float(p[0][0]), as_float(p[0][1]), as_float(p[1][0]), as_float(p[1][1]));
        units[1] = make_float4(as_float(p[2][0]), as_float(p[2][1]), e, as_float((uint32_t)(-8 * sum)));
    }
}

/* x's run of 8 columns g -> its units (run_units), where decode_kernel's lanes read
 * them: int8 one a word; int4 the two halves of its word's, the second half cols / 8
 * units after the first. */
template <int FORMAT>
__host__ __device__ inline void decode_units(const float (&v)[8], int64_t g, int64_t cols, int32_t layout, float4 *out) {
    float4 u[2];
    run_units<FORMAT>(v, u);
    const int64_t pieces = cols / (FORMAT == COLI_FMT_Q8 ? 16 : 32);
    if (FORMAT == COLI_FMT_Q8) {
        for (int h = 0; h < 2; h++) out[decode_unit(layout, 2 * g + h, pieces)] = u[h];
    } else {
        const int64_t at = decode_unit(layout, g, pieces);
        out[at] = u[0];
        out[cols / 8 + at] = u[1];
    }
}

/* x's run of 8 columns g (read from x) -> its units. */
template <int FORMAT>
__device__ inline void decode_prep_run(const float *__restrict__ x, int64_t g, int64_t cols, int32_t layout,
                                       float4 *out) {
    const float4 lo = COLI_LOAD_FRESH((const float4 *)x + 2 * g), hi = COLI_LOAD_FRESH((const float4 *)x + 2 * g + 1);
    const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    decode_units<FORMAT>(v, g, cols, layout, out);
}

/* x's digits for decode_kernel, a thread per 8 columns (cols % 8 == 0). */
template <int FORMAT>
__global__ void __launch_bounds__(256)
    decode_prep_kernel(const float *__restrict__ x, int64_t cols, int32_t layout, float4 *__restrict__ out) {
    coli_allow_next_grid(); /* decode_kernel may start loading W now; it waits for this grid before x */
    coli_wait_prior_grid(); /* launched early too (chained calls): x and `out` are the last call's until here */
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g < cols / 8) decode_prep_run<FORMAT>(x, g, cols, layout, out);
}

/* One weight word against its units (int4: the word's two halves): the exact
 * integer sum of value * v. */
template <int FORMAT>
__host__ __device__ inline int word_dot(uint32_t word, const float4 (&u)[FORMAT == COLI_FMT_Q8 ? 1 : 2]) {
    if constexpr (FORMAT == COLI_FMT_Q8) {
        const int w = (int)word;
        const int a = COLI_DP4A(w, (int)as_bits(u[0].x), 0), b = COLI_DP4A(w, (int)as_bits(u[0].y), 0);
        const int c = COLI_DP4A(w, (int)as_bits(u[0].z), 0);
        return (int)((uint32_t)a * 65536u + (uint32_t)b * 256u + (uint32_t)c); /* wraps; the true sum fits */
    } else {
        const int lo = (int)(word & 0x0F0F0F0Fu), hi = (int)((word >> 4) & 0x0F0F0F0Fu); /* n + 8, 0..15 */
        const int a = COLI_DP4A(hi, (int)as_bits(u[0].y), COLI_DP4A(lo, (int)as_bits(u[0].x), 0));
        const int b = COLI_DP4A(hi, (int)as_bits(u[0].w), COLI_DP4A(lo, (int)as_bits(u[0].z), 0));
        const int c = COLI_DP4A(hi, (int)as_bits(u[1].y), COLI_DP4A(lo, (int)as_bits(u[1].x), (int)as_bits(u[1].w)));
        return (int)((uint32_t)a * 65536u + (uint32_t)b * 256u + (uint32_t)c);
    }
}

/* One ring slot: a run's piece of each of R rows and, for int4, its 4 words' scales. */
template <int FORMAT, int R> struct decode_slot {
    int4 w[R];
    float4 sc[FORMAT == COLI_FMT_Q4 ? R : 1];
};

/* Load the run at piece `start` (nb pieces wide) into a slot. int4 is in the mma
 * layout: word m of piece p holds a column of group (p / 4) * 4 + m. */
template <int FORMAT, int R>
__device__ inline void decode_load(decode_slot<FORMAT, R> &sl, const int4 *const (&w)[R], const float *const (&sr)[R],
                                   int start, int nb, int lane) {
    const bool on = lane < nb;
#pragma unroll
    for (int k = 0; k < R; k++) {
        sl.w[k] = on ? COLI_LOAD_STREAM(w[k] + start + lane) : make_int4(0, 0, 0, 0);
        if constexpr (FORMAT == COLI_FMT_Q4)
            sl.sc[k] = on ? __ldg((const float4 *)sr[k] + (start + lane) / 4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

/* A loaded run into the sums: xq points at this lane's units of the run (in
 * global memory, or SHARED). */
template <int FORMAT, int R, bool SHARED>
__device__ inline void decode_run(const decode_slot<FORMAT, R> &sl, const float4 *xq, int64_t half, int nb,
                                  float (&acc)[R]) {
#pragma unroll
    for (int m = 0; m < 4; m++) {
        float4 u[FORMAT == COLI_FMT_Q8 ? 1 : 2];
        u[0] = SHARED ? xq[m * nb] : COLI_LOAD_FRESH(xq + m * nb);
        if constexpr (FORMAT == COLI_FMT_Q4) u[1] = SHARED ? xq[half + m * nb] : COLI_LOAD_FRESH(xq + half + m * nb);
#pragma unroll
        for (int k = 0; k < R; k++) {
            const float dot = (float)word_dot<FORMAT>(word_of(sl.w[k], m), u);
            acc[k] = fmaf(dot, FORMAT == COLI_FMT_Q4 ? u[1].z * elem(sl.sc[k], m) : u[0].w, acc[k]);
        }
    }
}

/* Where rows r0 .. r0 + R - 1 start (W and, int4, their scales: one per piece).
 * Rows past the end re-read the last one; their sums are dropped. */
template <int R>
__device__ inline void decode_rows(const int4 *q, const float *scale, int64_t rows, int pieces, int64_t r0,
                                   const int4 *(&w)[R], const float *(&sr)[R]) {
#pragma unroll
    for (int k = 0; k < R; k++) {
        const int64_t row = r0 + k < rows ? r0 + k : rows - 1;
        w[k] = q + row * pieces;
        sr[k] = scale + row * pieces;
    }
}

/* A row's warp sum into y (int8: times the row's scale), by lane 0, if the row is real. */
template <int FORMAT>
__device__ inline void decode_store(float v, int64_t row, int64_t rows, const float *scale, float *y, int lane) {
    if (lane == 0 && row < rows) y[row] = FORMAT == COLI_FMT_Q8 ? v * scale[row] : v;
}

/* The pieces [first, last) that slice `slice` of KS takes of a row's `full` pieces in
 * whole runs of 32: the k-th KS-th of the runs (rounded up), the last slice the rest. */
__host__ __device__ inline void decode_slice(int full, int ks, int slice, int &first, int &last) {
    const int per = (full / WARP + ks - 1) / ks * WARP;
    first = slice * per;
    last = ks == 1 ? full : first + per < full ? first + per : full;
}

/* int8 in the ABI's order (cols % 16 == 0), int4 in the mma layout. x: decode_prep_kernel's
 * units in xq, or (FUSED) x itself, which each block cuts into units in its shared
 * memory (cols * 4 bytes) once W's first runs are on their way: no prep kernel, and
 * no wait for one between two calls. */
template <int FORMAT, int R, int D, bool FUSED = false, int KS = 1>
__global__ void __launch_bounds__(256)
    decode_kernel(const int4 *__restrict__ q, const float *__restrict__ scale, int64_t rows, int pieces,
                  const float4 *__restrict__ xq, const float *__restrict__ x, float *__restrict__ y) {
    extern __shared__ float4 units[]; /* FUSED */
    __shared__ float part[KS > 1 ? 256 / WARP : 1][R]; /* KS > 1: each warp's sums */
    coli_allow_next_grid(); /* the next call's kernels may take free room from here on */
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, slice = warp % KS;
    const int64_t r0 = ((int64_t)blockIdx.x * (blockDim.x / WARP / KS) + warp / KS) * R;
    const bool active = r0 < rows;             /* a whole warp is in or out */
    if (!FUSED && KS == 1 && !active) return; /* no barrier follows */
    const int64_t half = (int64_t)pieces * 4; /* int4: where the units' second halves start */
    const int4 *w[R];
    const float *sr[R];
    decode_rows<R>(q, scale, rows, pieces, r0, w, sr);
    const int full = pieces / WARP * WARP; /* pieces in whole runs of 32 */
    int first, last;
    decode_slice(full, KS, slice, first, last);
    decode_slot<FORMAT, R> ring[D];
#pragma unroll
    for (int d = 0; d < D; d++)
        if (active && first + d * WARP < last) decode_load<FORMAT, R>(ring[d], w, sr, first + d * WARP, WARP, lane);
    coli_wait_prior_grid(); /* W is on its way; x (or its units) is ready from here on */
    if constexpr (FUSED) {
        const int64_t cols = (int64_t)pieces * (FORMAT == COLI_FMT_Q8 ? 16 : 32);
        for (int64_t g = threadIdx.x; g < cols / 8; g += blockDim.x)
            decode_prep_run<FORMAT>(x, g, cols, FORMAT == COLI_FMT_Q4 ? MMA_LAYOUT : 0, units);
        __syncthreads();
        if (!active) return;
    }
    const float4 *xs = FUSED ? units : xq;
    float acc[R];
#pragma unroll
    for (int k = 0; k < R; k++) acc[k] = 0.0f;
    if (active) {
        for (int run = first; run < last; run += D * WARP)
#pragma unroll
            for (int d = 0; d < D; d++) {
                const int start = run + d * WARP;
                if (start >= last) break;
                decode_run<FORMAT, R, FUSED>(ring[d], xs + start * 4 + lane, half, WARP, acc);
                if (start + D * WARP < last) decode_load<FORMAT, R>(ring[d], w, sr, start + D * WARP, WARP, lane);
            }
        const int nb = pieces - full; /* a row's last, narrower run */
        if (nb > 0 && slice == KS - 1) {
            decode_load<FORMAT, R>(ring[0], w, sr, full, nb, lane);
            if (lane < nb) decode_run<FORMAT, R, FUSED>(ring[0], xs + full * 4 + lane, half, nb, acc);
        }
    }
#pragma unroll
    for (int k = 0; k < R; k++) {
        float v = warp_sum(acc[k]);
        if constexpr (KS > 1) { /* the slices' sums meet in shared memory, in a fixed order */
            if (lane == 0) part[warp][k] = v;
            __syncthreads();
            if (slice != 0) continue;
            v = 0.0f;
#pragma unroll
            for (int j = 0; j < KS; j++) v += part[warp + j][k];
        }
        decode_store<FORMAT>(v, r0 + k, rows, scale, y, lane);
    }
}

/* decode_kernel's warps, when a weight has more groups of R rows than the GPU holds
 * warps at once, each take one group and end: a warp's loads all go out at its
 * start, and while it does its arithmetic no loads of its own are in flight. Here
 * a warp takes `per` consecutive groups instead, and its ring runs on from one
 * group's runs into the next one's, so its loads stay in flight across the
 * groups. The launch sizes `per` so that the warps fit the GPU at once; where
 * that is one group a warp, decode_kernel is taken instead (it holds 4 runs in
 * flight in the same registers). x: decode_prep_kernel's units; rows whole runs
 * of 32 pieces. */
template <int FORMAT, int R, int D>
__global__ void __launch_bounds__(256)
    decode_walk_kernel(const int4 *__restrict__ q, const float *__restrict__ scale, int64_t rows, int pieces,
                       const float4 *__restrict__ xq, float *__restrict__ y, int per) {
    coli_allow_next_grid(); /* the next call's kernels may take free room from here on */
    const int lane = threadIdx.x % WARP;
    const int64_t groups = (rows + R - 1) / R;
    const int64_t g0 = ((int64_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP) * per;
    if (g0 >= groups) return; /* no barrier follows */
    const int runs = pieces / WARP, half = pieces * 4;
    const int64_t items = ((g0 + per < groups ? g0 + per : groups) - g0) * runs; /* (group, run) pairs */
    const int4 *w[R];
    const float *sr[R];
    auto point = [&](int64_t g) { decode_rows<R>(q, scale, rows, pieces, g * R, w, sr); };
    int64_t lg = g0; /* the next load: run lr of group lg */
    int lr = 0;
    auto load_next = [&](decode_slot<FORMAT, R> &sl) {
        decode_load<FORMAT, R>(sl, w, sr, lr * WARP, WARP, lane);
        if (++lr == runs) lr = 0, point(++lg);
    };
    point(lg);
    decode_slot<FORMAT, R> ring[D];
#pragma unroll
    for (int d = 0; d < D; d++)
        if (d < items) load_next(ring[d]);
    coli_wait_prior_grid(); /* W is on its way; x's units are ready from here on */
    float acc[R];
#pragma unroll
    for (int k = 0; k < R; k++) acc[k] = 0.0f;
    int64_t cg = g0; /* the next sums: run cr of group cg */
    int cr = 0;
    for (int64_t i = 0; i < items; i += D)
#pragma unroll
        for (int d = 0; d < D; d++) {
            if (i + d >= items) break;
            decode_run<FORMAT, R, false>(ring[d], xq + cr * WARP * 4 + lane, half, WARP, acc);
            if (i + d + D < items) load_next(ring[d]);
            if (++cr < runs) continue;
#pragma unroll
            for (int k = 0; k < R; k++) { /* group cg is done */
                decode_store<FORMAT>(warp_sum(acc[k]), cg * R + k, rows, scale, y, lane);
                acc[k] = 0.0f;
            }
            cr = 0, cg++;
        }
}

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
    if constexpr (XPRE) xr = i < pieces ? __ldg(x + i) : zero;
}

/* One run's pieces into the sums: a piece's four products as two pairs, then one add. */
template <int R, int T, int XM>
__device__ inline void gemv_run(const float4 (&wv)[R], const float4 &xr, const float4 *const (&xt)[T], int nt,
                                int pieces, int i, float (&acc)[R][T]) {
    if (i >= pieces) return; /* only in a row's last run */
#pragma unroll
    for (int t = 0; t < T; t++) {
        if (t >= nt) break;
        const float4 x = XM == X_RING ? xr : __ldg(xt[t] + i);
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
    if (r0 >= rows) return; /* no barrier follows: a whole warp leaves together */
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
#pragma unroll
    for (int d = 0; d < D; d++) gemv_load<R, XM == X_RING>(w, xt[0], pieces, d * WARP + lane, ring[d], ring_x[d]);
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

/* ---- Any shape, either layout: one block per (output row, token) -------------------- */
template <int FORMAT>
__host__ __device__ inline float stored_value(const void *q, int64_t row, int64_t cols, int32_t layout, int64_t c) {
    if constexpr (FORMAT == COLI_FMT_F32) {
        return ((const float *)q)[row * cols + c];
    } else {
        constexpr int PW = fmt<FORMAT>::per_word, BITS = FORMAT == COLI_FMT_Q8 ? 8 : 4;
        if (FORMAT == COLI_FMT_Q4 && layout == TILE_LAYOUT) {
            const int64_t wn = c / PW;
            const uint8_t b = ((const uint8_t *)q)[q4_w_at(layout, row, wn / 16, cols / 128) + mma_word(wn % 16) * 4 + c % PW / 2];
            return (float)((int)(c % 2 ? b >> 4 : b & 0x0F) - 8);
        }
        const uint8_t *r = (const uint8_t *)q + row * cols * BITS / 8;
        const int64_t at = layout ? mma_word(c / PW) * 4 + c % PW * BITS / 8 : c * BITS / 8;
        if (FORMAT == COLI_FMT_Q8) return (float)(int8_t)r[at];
        return (float)((int)(c % 2 ? r[at] >> 4 : r[at] & 0x0F) - 8);
    }
}

/* int4's scale of row `row`, column c (groups of `group`; the tile layout's are 32). */
__host__ __device__ inline float stored_scale(const float *scale, int64_t row, int64_t cols, int32_t group, int32_t layout,
                                              int64_t c) {
    return layout == TILE_LAYOUT ? scale[q4_s_at(layout, row, c / 128, cols / 128) + c % 128 / 32]
                                 : scale[row * (cols / group) + c / group];
}

template <int FORMAT>
__global__ void simple_kernel(const void *__restrict__ q, const float *__restrict__ scale, int64_t rows,
                              int64_t cols, int32_t group, int32_t layout, const float *__restrict__ x,
                              float *__restrict__ y) {
    __shared__ float partial[SIMPLE_THREADS];
    const int64_t r = blockIdx.x, t = blockIdx.y;
    const float *xt = x + t * cols;
    float acc = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += SIMPLE_THREADS) {
        const float v = xt[c] * stored_value<FORMAT>(q, r, cols, layout, c);
        acc += FORMAT == COLI_FMT_Q4 ? v * stored_scale(scale, r, cols, group, layout, c) : v;
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

/* f32, S <= 16: a warp per R rows, a grid row per T tokens. */
template <int R, int D, int T, int XM = T == 1 ? X_RING : X_AT_USE>
static void launch_gemv(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    const int64_t per_block = (int64_t)(GEMV_THREADS / WARP) * R;
    const dim3 grid((unsigned)((w->rows + per_block - 1) / per_block), (unsigned)((s + T - 1) / T));
    gemv_kernel<R, D, T, XM><<<grid, GEMV_THREADS, 0, stream>>>((const float *)w->q, w->rows, w->cols, dx, s, dy);
}

/* Tokens per pass: the fewest of 1, 2, 4, 8 that cover s. */
template <int R, int D>
static void launch_gemv_tokens(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    if (s == 1) launch_gemv<R, D, 1>(w, dx, s, dy, stream);
    else if (s == 2) launch_gemv<R, D, 2>(w, dx, s, dy, stream);
    else if (s <= 4) launch_gemv<R, D, 4>(w, dx, s, dy, stream);
    else launch_gemv<R, D, 8>(w, dx, s, dy, stream);
}

/* An attribute of the current device, read once into *cache (a race writes the same value). */
static int device_attribute(int *cache, cudaDeviceAttr attr) {
    if (*cache < 0) {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&v, attr, dev) == cudaSuccess) *cache = v;
        else (void)cudaGetLastError(), *cache = 0;
    }
    return *cache;
}

static int sm_count(void) {
    static int n = -1;
    const int v = device_attribute(&n, cudaDevAttrMultiProcessorCount);
    return v > 0 ? v : 1;
}

#if COLI_HAS_PDL
static int cc_major(void) {
    static int n = -1;
    return device_attribute(&n, cudaDevAttrComputeCapabilityMajor);
}
#endif

/* Consecutive calls overlap (sm_90): every int8/int4 kernel allows the next
 * grid to launch as soon as it starts, and every kernel launched early waits for
 * the grid before it (coli_wait_prior_grid) before it reads x or writes what the
 * last call reads; only W, which no kernel writes, is read before that, and x too
 * where the caller says no kernel writes it (launch_matmul's x_ready: the S = 1
 * kernels then wait only before they write y). So the next call's W loads fill
 * the room the last one's final blocks leave, as a decode step's matmuls follow
 * one another. COLI_GPU_CHAIN=0 launches each call's first kernel after the last
 * call has ended, as before (for comparisons). */
static int g_chain = -1;
static bool chain_calls(void) {
    if (g_chain < 0) {
        const char *v = getenv("COLI_GPU_CHAIN");
        g_chain = !(v && strcmp(v, "0") == 0);
    }
    return g_chain != 0;
}

#if COLI_HAS_PDL
/* A kernel whose blocks take most of an SM's shared memory: past the default 48 KiB
 * and with the carveout at its largest, once per kernel (`raised`: its own flag). */
template <typename Kernel> static void allow_sm_shared(Kernel kernel, int bytes, bool &raised) {
    if (!raised)
        raised = cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess &&
                 cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      cudaSharedmemCarveoutMaxShared) == cudaSuccess;
}
#endif

/* Launches a kernel that, when `early` (and on sm_90), may start while the one
 * before it runs: it waits for that one before it reads its output
 * (coli_wait_prior_grid). Otherwise plainly. `cluster` > 1 (sm_90 only): the
 * blocks in clusters of that many, early or not. */
template <typename... Params, typename... Args>
static void launch_clustered(bool early, unsigned cluster, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared,
                             cudaStream_t stream, Args... args) {
#if COLI_HAS_PDL
    if ((early || cluster > 1) && cc_major() >= 9) {
        cudaLaunchConfig_t config = {};
        cudaLaunchAttribute attr[2];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = early;
        attr[1].id = cudaLaunchAttributeClusterDimension;
        attr[1].val.clusterDim.x = cluster, attr[1].val.clusterDim.y = 1, attr[1].val.clusterDim.z = 1;
        config.gridDim = grid, config.blockDim = block, config.dynamicSmemBytes = shared, config.stream = stream;
        config.attrs = attr, config.numAttrs = cluster > 1 ? 2 : 1;
        (void)cudaLaunchKernelEx(&config, kernel, ((Params)args)...);
        return;
    }
#else
    (void)early, (void)cluster;
#endif
    kernel<<<grid, block, shared, stream>>>(((Params)args)...);
}

template <typename... Params, typename... Args>
static void launch_early(bool early, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared,
                         cudaStream_t stream, Args... args) {
    launch_clustered(early, 1, kernel, grid, block, shared, stream, args...);
}

#if COLI_HAS_PDL
/* A decode kernel over one weight's rows (q, scale, rows, x, y) whose blocks take
 * `shared` bytes, most of an SM's (allow_sm_shared; `raised`: the kernel's own
 * flag), launched early, in clusters of `cluster` blocks. */
template <typename Kernel>
static void launch_wide_blocks(Kernel kernel, bool &raised, unsigned cluster, dim3 grid, int threads, size_t shared,
                               const coli_weight *w, const float *dx, float *dy, cudaStream_t stream) {
    allow_sm_shared(kernel, (int)shared, raised);
    launch_clustered(chain_calls(), cluster, kernel, grid, dim3((unsigned)threads), shared, stream, (const uint8_t *)w->q,
                     (const float *)w->scale, (int64_t)w->rows, dx, dy);
}
#endif

template <int FORMAT> static int decode_pieces(const coli_weight *w) {
    return (int)(w->cols / (FORMAT == COLI_FMT_Q8 ? 16 : 32));
}

/* decode_kernel's blocks: 8 warps, KS of them to each group of R rows. */
static dim3 decode_grid(const coli_weight *w, int r, int ks) {
    const int64_t per_block = (int64_t)(GEMV_THREADS / WARP / ks) * r;
    return dim3((unsigned)((w->rows + per_block - 1) / per_block));
}

/* x's units for decode_kernel and decode_walk_kernel into `planes` (cols floats). */
template <int FORMAT> static void launch_decode_prep(const coli_weight *w, const float *dx, float *planes, cudaStream_t stream) {
    const int64_t runs = w->cols / 8;
    launch_early(chain_calls(), decode_prep_kernel<FORMAT>, dim3((unsigned)((runs + 255) / 256)), dim3(256), 0, stream,
                 dx, w->cols, w->layout, (float4 *)planes);
}

/* int8 and int4, S = 1: x's units, then decode_kernel (KS warps to a group of R rows). */
template <int FORMAT, int R, int D, int KS = 1>
static void launch_decode(const coli_weight *w, const float *dx, float *planes, float *dy, cudaStream_t stream) {
    launch_decode_prep<FORMAT>(w, dx, planes, stream);
    launch_early(true, decode_kernel<FORMAT, R, D, false, KS>, decode_grid(w, R, KS), dim3(GEMV_THREADS), 0, stream, (const int4 *)w->q,
                 (const float *)w->scale, (int64_t)w->rows, decode_pieces<FORMAT>(w), (const float4 *)planes,
                 (const float *)nullptr, dy);
}

/* The groups of R rows each of decode_walk_kernel's warps takes: an equal share,
 * with as many warps as the GPU holds at once. */
template <int FORMAT, int R, int D> static int decode_walk_per(const coli_weight *w) {
    static int blocks_per_sm = 0; /* per instantiation: the kernel's registers decide it */
    if (!blocks_per_sm &&
        (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, decode_walk_kernel<FORMAT, R, D>, GEMV_THREADS, 0) !=
             cudaSuccess ||
         blocks_per_sm < 1))
        blocks_per_sm = 1;
    const int64_t groups = (w->rows + R - 1) / R, at_once = (int64_t)sm_count() * blocks_per_sm * (GEMV_THREADS / WARP);
    return (int)((groups + at_once - 1) / at_once);
}

/* The same with decode_walk_kernel (decode_pieces % 32 == 0), `per` groups a warp
 * (decode_walk_per). */
template <int FORMAT, int R, int D>
static void launch_decode_walk(const coli_weight *w, const float *dx, float *planes, float *dy, cudaStream_t stream,
                               int per) {
    const int64_t warps = ((w->rows + R - 1) / R + per - 1) / per, per_block = GEMV_THREADS / WARP;
    launch_decode_prep<FORMAT>(w, dx, planes, stream);
    launch_early(true, decode_walk_kernel<FORMAT, R, D>, dim3((unsigned)((warps + per_block - 1) / per_block)),
                 dim3(GEMV_THREADS), 0, stream, (const int4 *)w->q, (const float *)w->scale, (int64_t)w->rows,
                 decode_pieces<FORMAT>(w), (const float4 *)planes, dy, per);
}

/* The same with x cut into units by each block (decode_kernel's FUSED), for rows
 * whose units fit the default 48 KiB of shared memory (cols <= 12288). */
#define FUSED_MAX_COLS (48 * 1024 / 4)
template <int FORMAT, int R, int D>
static void launch_decode_fused(const coli_weight *w, const float *dx, float *dy, cudaStream_t stream) {
    const size_t shared = (size_t)w->cols * 4;
    launch_early(chain_calls(), decode_kernel<FORMAT, R, D, true>, decode_grid(w, R, 1), dim3(GEMV_THREADS), shared, stream,
                 (const int4 *)w->q, (const float *)w->scale, (int64_t)w->rows, decode_pieces<FORMAT>(w),
                 (const float4 *)nullptr, dx, dy);
}

#include "gpu_decode_bulk.cuh"
#include "gpu_decode_mma.cuh"
#include "gpu_decode_tiled.cuh"

/* Past the default 48 KiB of dynamic shared memory, once per kernel (`raised`: that kernel's own flag). */
template <typename Kernel> static void allow_shared(Kernel kernel, int bytes, bool &raised) {
    if (bytes > 48 * 1024 && !raised)
        raised = cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess;
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

#include "gpu_gemm.cuh"

template <int FORMAT, int BM>
static void launch_tile(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    dim3 grid((unsigned)((w->rows + BM - 1) / BM), (unsigned)((s + TILE_N - 1) / TILE_N));
    tile_kernel<FORMAT, BM><<<grid, TILE_THREADS, 0, stream>>>(w->q, w->scale, w->rows, w->cols, w->group, w->layout,
                                                              dx, s, dy);
}

template <int FORMAT>
static void launch_simple(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    dim3 grid((unsigned)w->rows, (unsigned)s);
    simple_kernel<FORMAT><<<grid, SIMPLE_THREADS, 0, stream>>>(w->q, w->scale, w->rows, w->cols, w->group, w->layout,
                                                               dx, dy);
}


#endif
