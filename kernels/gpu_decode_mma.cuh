/* int8 and int4 at S = 1 on the tensor cores: decode_mma_kernel. CUDA only (the
 * table takes it on sm_90, for its early launches).
 *
 * The dp4a kernels take x a digit at a time, and each run of 8 columns has its own
 * power of two, so every word's sum becomes a float by itself (7 instructions per
 * 4 int8 weights); after the wait for the call before, that work and cutting x
 * into units keep them well short of the copy bandwidth at 4096 columns. Here:
 *   - A warp owns a slice of CH chunks (64 bytes of a row each) of every row of
 *     the block, and x gets one power of two per slice: v = x 2^(30 - ex), |v| <
 *     2^30, cut into four int8 digits that are an mma's columns 0-3. int8's sums
 *     stay exact in int32 over the slice (|sum| <= 512 * 128 * 128 = 2^23) and
 *     become floats once, at the end: an mma a 512 weights and nothing else.
 *     int4's are a group's of 32 each: two groups share a C, their digits in
 *     B's columns 0-3 and 4-7 (dmma_b_at), and become floats, times each
 *     group's scale, after the pair: 4 float instructions an mma. The nibbles are not unpacked: A of the pair's first mma is the raw
 *     bytes as unsigned int8 (16 o' + e' of a byte's odd and even value, each
 *     n + 8), of its second their high nibbles (one instruction a word, not
 *     three), against B's digits of 16 e and o - 16 e (dmma_run_words), with v
 *     below 2^26 so that those are four digits too; the offsets' share, itself
 *     two mma of B, comes off the sums' start (the bits of 1.5 2^23), or with
 *     few pairs a warp as they become floats. Rounding x
 *     costs 2^-31 (int4 2^-27) of the slice's largest |x|, beside a float32
 *     sum's 2^-24 of its largest term.
 *   - Each warp cuts its own slice of x (8 or 16 values a lane, the slice's
 *     largest |x| by one warp reduction) and swaps the digits through its own
 *     patch of shared memory: no barrier of the block before the sums.
 *   - W: a tile is 16 rows; lane (g, t) holds 16 bytes of rows g and g + 8 at
 *     byte 16t of each chunk, which are A of two int8 mma tiles (int4: of two
 *     pairs of groups, as the mma layout lies) for a k order that the digits follow.
 *     RR tiles of a block are loaded into registers (dmma_shape::in_registers),
 *     the rest (and int4's scales) copied into shared memory, each lane the
 *     bytes it reads itself (scales: then the warp meets), all before the wait.
 *   - A row's sums meet across a warp's lanes (int4: two exchanges) and across the
 *     warps, at the end, in shared memory in a fixed order.
 * A block holds all of its W while it waits. The table's launches leave part of
 * the SMs free, where the next call's blocks start at once and load their W while
 * this call computes (that beat two blocks an SM, MINB 2, which the bench still
 * compares). */
#ifndef COLI_GPU_DECODE_MMA_CUH
#define COLI_GPU_DECODE_MMA_CUH

#include "gpu_formats.cuh"

#if COLI_HAS_PDL
#define DMMA_BITS 30    /* int8: |v| < 2^30, four digits, the top one in [-64, 64] */
#define DMMA_Q4_BITS 26 /* int4: |v| < 2^26, so that 16 v and v - 16 v' (dmma_run_words) are four digits too */
#define DMMA_SHARED_MAX (227 * 1024) /* a block's shared memory on sm_90 */

/* A chunk is 64 bytes of a row: 64 int8 columns or 128 int4 ones (4 groups). */
template <int FORMAT, int NW, int CH, int RT, int RR> struct dmma_shape {
    static constexpr int chunk_cols = FORMAT == COLI_FMT_Q8 ? 64 : 128;
    static constexpr int cols = NW * CH * chunk_cols;
    static constexpr int row_bytes = NW * CH * 64;
    static constexpr int rows = RT * 16;
    static constexpr int vpl = CH * chunk_cols / WARP; /* x values a lane cuts */
    /* a digit's words in a warp's patch (int8: 4 columns a word; int4: a run of 8
     * columns' even and odd ones, lane slot t's 4 groups side by side), padded so
     * that a quarter warp's reads of digits g and g + 1 fall in other banks */
    static constexpr int digit_words = FORMAT == COLI_FMT_Q8 ? CH * 16 + 16 : CH * 32 + 4;
    static constexpr size_t w_bytes = (size_t)(RT - RR) * 16 * row_bytes;
    static constexpr size_t s_bytes = FORMAT == COLI_FMT_Q8 ? 0 : (size_t)RT * NW * 16 * CH * 4 * 4; /* int4 scales */
    static constexpr int digit_rows = FORMAT == COLI_FMT_Q8 ? 4 : 5; /* int4: and a row of zeros */
    static constexpr size_t x_bytes = (size_t)NW * digit_rows * digit_words * 4;
    static constexpr size_t part_bytes = (size_t)NW * rows * 4;
    static constexpr size_t shared = w_bytes + s_bytes + x_bytes + part_bytes;
    static constexpr size_t x_in_bytes = (size_t)NW * vpl * WARP * 4; /* XR: x's slices as copied in, after the rest */
    static_assert(RR >= 0 && RR <= RT && vpl % 8 == 0, "whole tiles; lanes cut whole runs of 8 columns");
    /* Which tiles are held in registers: the first RR, but int8's second of two,
     * asked for after the copies and summed after them, so that the register loads
     * land while the shared-memory tiles are summed (the last of three or four was
     * slower, and int4 gained nothing). A tile's place among those in registers is
     * i - first_reg, among those in shared memory i - first_shared. */
    static constexpr bool reg_last = FORMAT == COLI_FMT_Q8 && RT == 2 && RR == 1;
    static constexpr int first_reg = reg_last ? RT - RR : 0, first_shared = reg_last ? 0 : RR;
    __host__ __device__ static constexpr bool in_registers(int i) { return i >= first_reg && i < first_reg + RR; }
    __host__ __device__ static constexpr int reg_tile(int i) { return in_registers(i) ? i - first_reg : 0; }
};

/* The slice's power of two from its largest |x|'s bits: v = x pre step is x
 * 2^(30 - ex), in two exact steps when 2^(30 - ex) is past a float's exponents;
 * back() takes a sum of v's digits back (an inf or NaN in the slice: NaN). */
struct dmma_power {
    float pre, step, up, drop;
    __host__ __device__ float back(float p) const { return p * up * drop; }
};
__host__ __device__ inline dmma_power dmma_power_of(uint32_t top, int bits) {
    int ex = (int)(top >> 23) - 126; /* the largest |x| < 2^ex */
    if (top < 0x00800000u) (void)frexpf(as_float(top), &ex); /* 0 or subnormal */
    const int lift = ex < -90 ? 64 : 0;
    dmma_power e;
    e.pre = pow2(lift), e.step = pow2(bits - ex - lift);
    e.up = top >= 0x7F800000u ? NAN : pow2(ex - bits + lift), e.drop = pow2(-lift);
    return e;
}
template <int FORMAT> __host__ __device__ inline dmma_power dmma_power_of(uint32_t top) {
    return dmma_power_of(top, FORMAT == COLI_FMT_Q8 ? DMMA_BITS : DMMA_Q4_BITS);
}

__host__ __device__ inline int dmma_round(float v) {
#if defined(__CUDA_ARCH__)
    return __float2int_rn(v);
#else
    return (int)rintf(v); /* to nearest, ties to even, as __float2int_rn */
#endif
}

/* A run of 8 columns -> digit d's two words: int8, columns 0-3 and 4-7; int4, of
 * each byte's even and odd column (its low and high nibble) 16 e and o - 16 e,
 * which A's raw bytes (16 o' + e') and high nibbles (16 o') turn into 16 (o o' +
 * e e') in two mma (dmma_a). v + 0x808080 holds digits 0-2 plus 128 as its bytes
 * 0-2 and digit 3 as byte 3 (|v| < 2^31 - 2^24: no byte carries into the next), so
 * v = d0 + 2^8 d1 + 2^16 d2 + 2^24 d3 exactly. */
template <int FORMAT>
__host__ __device__ inline void dmma_run_words(const float *v, const dmma_power &e, uint32_t (&words)[4][2]) {
    uint32_t u[8];
    if constexpr (FORMAT == COLI_FMT_Q8) {
        for (int j = 0; j < 8; j++) u[j] = (uint32_t)dmma_round(v[j] * e.pre * e.step) + 0x00808080u;
    } else {
        for (int j = 0; j < 8; j += 2) {
            const int ev = dmma_round(v[j] * e.pre * e.step), od = dmma_round(v[j + 1] * e.pre * e.step);
            u[j] = (uint32_t)(16 * ev) + 0x00808080u, u[j + 1] = (uint32_t)(od - 16 * ev) + 0x00808080u;
        }
    }
    for (int d = 0; d < 4; d++) {
        const uint32_t flip = d < 3 ? 0x80808080u : 0u;
        if (FORMAT == COLI_FMT_Q8)
            words[d][0] = bytes_of4(u[0], u[1], u[2], u[3], (uint32_t)d) ^ flip,
            words[d][1] = bytes_of4(u[4], u[5], u[6], u[7], (uint32_t)d) ^ flip;
        else
            words[d][0] = bytes_of4(u[0], u[2], u[4], u[6], (uint32_t)d) ^ flip,
            words[d][1] = bytes_of4(u[1], u[3], u[5], u[7], (uint32_t)d) ^ flip;
    }
}

/* Where run R (8 columns) of a warp's slice puts its words in a digit's row of the
 * patch: lane slot t reads its chunk's words side by side, int8 4 (B of two mma
 * tiles), int4 8 (B of a tile for each of its 4 groups). */
template <int FORMAT> __host__ __device__ inline int dmma_word(int run) {
    if constexpr (FORMAT == COLI_FMT_Q8) return 2 * run; /* columns 8R..8R+3, then 8R+4.. */
    else return run / 16 * 32 + run % 4 * 8 + run % 16 / 4 * 2; /* chunk, lane slot t, group: even, then odd */
}

/* The patch: a row of words for each digit, at dmma_word (int4: then a row of
 * zeros there). Lane slot g gives B's column g, and the patch word of its first B
 * word of mma tile m of chunk 0 is: int8, digit g & 3's (lanes g >= 4 give zeros
 * for the unused columns 4-7); int4, whose tiles m and m + 2 add into one C (a
 * group's sums in each half of its columns), digit g's for tiles 0 and 1 and digit
 * g - 4's for tiles 2 and 3, the zeros where a lane's column is the other half's. */
template <int FORMAT> __host__ __device__ inline int dmma_b_at(int g, int t, int m, int digit_words) {
    const int row = FORMAT == COLI_FMT_Q8 ? g & 3 : (g < 4) == (m < 2) ? g & 3 : 4;
    return row * digit_words + (FORMAT == COLI_FMT_Q8 ? 4 : 8) * t + 2 * m;
}

/* int4: a lane's B words of a chunk (bw, as dmma_b_at gives them from a patch
 * with its row of zeros) from a patch of the 4 digits' rows alone: lane slot g
 * reads its digit's 4 words of tiles 0 and 1 (g < 4) or 2 and 3 (g >= 4), the
 * other half is zeros. One load instead of two, and no zeros in shared memory
 * (decode_tiled_kernel). */
__host__ __device__ inline void dmma_b_words(const uint32_t *patch, int g, int t, int digit_words, int4 (&bw)[2]) {
    const int4 mine = *(const int4 *)(patch + (g & 3) * digit_words + 8 * t + (g < 4 ? 0 : 4)), zero = make_int4(0, 0, 0, 0);
    bw[0] = g < 4 ? mine : zero, bw[1] = g < 4 ? zero : mine;
}

/* int4: B of the pair p and p + 2 of groups, from a lane's words of tiles 0 and 1
 * (bw[0]) and of 2 and 3 (bw[1]): the 16 e words (h = 0) or the o - 16 e ones (h =
 * 1) of group p (its columns 0-3) and of group p + 2 (4-7). */
__host__ __device__ inline void dmma_pair_b(const int4 (&bw)[2], int p, int h, uint32_t (&b)[2]) {
    b[0] = word_of(bw[0], 2 * p + h), b[1] = word_of(bw[1], 2 * p + h);
}

/* int4: the group of chunk whose sums lane slot t holds after the pair of mma
 * tiles p and p + 2 (its half of C's columns). */
__host__ __device__ inline int dmma_pair_group(int p, int t) { return p + 2 * (t / 2); }

/* A of mma tile m of a chunk from a lane's 16 bytes of rows g (a0) and g + 8 (a1):
 * int8, words 2m and 2m + 1 (columns 16t + 8m ..); int4, of the pair m and m + 2
 * of groups, word m and m + 2 (group m's word t in the mma layout), the raw bytes
 * as unsigned int8: 16 (n' + 8) + n + 8 of a byte's odd value n' and even n. Its
 * high nibbles (dmma_high, 16 (n' + 8)) are A of the pair's second mma. */
template <int FORMAT>
__host__ __device__ inline void dmma_a(const int4 &a0, const int4 &a1, int m, uint32_t (&a)[4]) {
    if constexpr (FORMAT == COLI_FMT_Q8)
        a[0] = word_of(a0, 2 * m), a[1] = word_of(a1, 2 * m), a[2] = word_of(a0, 2 * m + 1), a[3] = word_of(a1, 2 * m + 1);
    else a[0] = word_of(a0, m), a[1] = word_of(a1, m), a[2] = word_of(a0, m + 2), a[3] = word_of(a1, m + 2);
}
__host__ __device__ inline void dmma_high(const uint32_t (&a)[4], uint32_t (&h)[4]) {
    for (int k = 0; k < 4; k++) h[k] = a[k] & 0xF0F0F0F0u;
}
/* The nibbles' offsets, 8 in each: A of 136 (raw bytes) and 128 (high nibbles).
 * A pair's sums start at the bits of 1.5 2^23 and hold the offsets' share k too
 * (|sum| and |k| < 16 * 264 * 128 < 2^20); taking 1.5 2^23 + k away, both exact
 * floats, leaves the sum exactly. */
#define DMMA_RAW_OFFSET 0x88888888u
#define DMMA_HIGH_OFFSET 0x80808080u
__host__ __device__ inline float dmma_offset_base(int k) { return FLOAT_SUM_BASE + (float)k; }
__host__ __device__ inline float dmma_pair_sum(int bits, float base) { return as_float((uint32_t)bits) - base; }
/* int4: the offsets' share of a pair's sums, B (bq: its raw bytes' and high nibbles'
 * words) times the constant A of each of its two mma, into k. */
__device__ inline void dmma_offsets(const uint32_t (&bq)[2][2], int (&k)[4]) {
    const uint32_t raw[4] = {DMMA_RAW_OFFSET, DMMA_RAW_OFFSET, DMMA_RAW_OFFSET, DMMA_RAW_OFFSET};
    const uint32_t high[4] = {DMMA_HIGH_OFFSET, DMMA_HIGH_OFFSET, DMMA_HIGH_OFFSET, DMMA_HIGH_OFFSET};
    const int zero[4] = {0, 0, 0, 0};
    coli_mma_u8s8(k, raw, bq[0], zero);
    coli_mma_u8s8(k, high, bq[1], k);
}

/* A lane's two digit sums of a row put together: slot 0 holds digits 0 and 1,
 * slot 1 digits 2 and 3, slots 2 and 3 the mma's unused columns (int8). A lane's
 * slot is t, or for int4, whose columns 4-7 hold a second group's digits, t & 1
 * (dmma_slot). */
__host__ __device__ inline float dmma_digits(float lo, float hi, int slot) {
    const float w0 = slot == 0 ? 1.0f : slot == 1 ? 65536.0f : 0.0f;
    const float w1 = slot == 0 ? 256.0f : slot == 1 ? 16777216.0f : 0.0f;
    return fmaf(hi, w1, lo * w0);
}
template <int FORMAT> __host__ __device__ inline int dmma_slot(int t) { return FORMAT == COLI_FMT_Q8 ? t : t & 1; }

/* The power of two of a warp's slice of x, each lane's VPL values in v (v = x
 * 2^(30 - ex), int4 2^(26 - ex), of its largest |x| < 2^ex). */
template <int FORMAT, int VPL> __device__ inline dmma_power dmma_slice_power(const float (&v)[VPL]) {
    uint32_t top = 0;
#pragma unroll
    for (int j = 0; j < VPL; j++) top = max(top, as_bits(v[j]) & 0x7FFFFFFFu);
    return dmma_power_of<FORMAT>(coli_warp_max(top));
}

/* A warp's slice of x: a lane's VPL values from column k0 into v. */
template <int VPL> __device__ inline void dmma_slice(const float *x, int k0, int lane, float (&v)[VPL]) {
#pragma unroll
    for (int j = 0; j < VPL / 4; j++) {
        const float4 f = COLI_LOAD_FRESH((const float4 *)(x + k0 + VPL * lane) + j);
        v[4 * j] = f.x, v[4 * j + 1] = f.y, v[4 * j + 2] = f.z, v[4 * j + 3] = f.w;
    }
}

/* A lane's runs of the slice as digits into the warp's patch: a row of words a
 * digit, at dmma_word (and, with 5 rows, a row of zeros there for dmma_b_at). The
 * caller meets the warp (__syncwarp) before reading the patch. */
template <int FORMAT, int VPL, int DIGIT_WORDS, int DIGIT_ROWS>
__device__ inline void dmma_put_digits(const float (&v)[VPL], const dmma_power &e, int lane, uint32_t *patch) {
#pragma unroll
    for (int r = 0; r < VPL / 8; r++) {
        uint32_t words[4][2];
        dmma_run_words<FORMAT>(v + 8 * r, e, words);
        const int at = dmma_word<FORMAT>(lane * (VPL / 8) + r);
#pragma unroll
        for (int d = 0; d < 4; d++) *(uint2 *)(patch + d * DIGIT_WORDS + at) = make_uint2(words[d][0], words[d][1]);
        if constexpr (DIGIT_ROWS == 5) *(uint2 *)(patch + 4 * DIGIT_WORDS + at) = make_uint2(0u, 0u);
    }
}

/* A tile's sums in a lane (f: C's four, as floats) into the block's shared
 * `part`: the warp's rows g and g + 8 (at `at` and at + 8), met across the
 * lanes of a row and taken back by the slice's power of two. */
template <int FORMAT> __device__ inline void dmma_put_rows(const float (&f)[4], const dmma_power &e, int t, float *part, int at) {
    float p0 = dmma_digits(f[0], f[1], dmma_slot<FORMAT>(t)), p8 = dmma_digits(f[2], f[3], dmma_slot<FORMAT>(t));
    p0 += COLI_SHFL_XOR(p0, 1), p8 += COLI_SHFL_XOR(p8, 1);
    if constexpr (FORMAT == COLI_FMT_Q4) p0 += COLI_SHFL_XOR(p0, 2), p8 += COLI_SHFL_XOR(p8, 2); /* both groups */
    if (t == 0) part[at] = e.back(p0), part[at + 8] = e.back(p8);
}

/* Row r's sum over the NW warps' slices, in a fixed order. */
template <int NW, int ROWS> __device__ inline float dmma_meet(const float *part, unsigned r) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < NW; k++) s += part[k * ROWS + r];
    return s;
}

/* XR: a lane's values of x's slice as copied in (a room of their own, so that no
 * other lane writes where this lane's copies land) */
template <typename shape> __device__ inline float *dmma_x_in(uint8_t *shared, int warp, int lane) {
    return (float *)(shared + shape::shared) + (warp * WARP + lane) * shape::vpl;
}

/* XR: no kernel that may still run writes x (launch_matmul's x_ready): x is asked
 * for first, ahead of W in the SM's queue, by cp.async into shared memory (loaded
 * into registers, ptxas cut it into digits before it asked for W, to free them),
 * and the wait for the grid before comes only before y is written. */
template <int FORMAT, int NW, int CH, int RT, int RR, int MINB, bool XR>
__global__ void __launch_bounds__(NW * WARP, MINB)
    decode_mma_kernel(const uint8_t *__restrict__ q, const float *__restrict__ scale, int64_t rows,
                      const float *__restrict__ x, float *__restrict__ y) {
    using shape = dmma_shape<FORMAT, NW, CH, RT, RR>;
    extern __shared__ __align__(16) uint8_t dmma_shared[];
    coli_allow_next_grid();
    const int lane = (int)threadIdx.x % WARP, warp = (int)threadIdx.x / WARP, g = lane / 4, t = lane % 4;
    if constexpr (XR) { /* the warp's slice of x, a copy group of its own, the first */
        float *x_in = dmma_x_in<shape>(dmma_shared, warp, lane);
        const float *xs = x + warp * CH * shape::chunk_cols + shape::vpl * lane;
#pragma unroll
        for (int j = 0; j < shape::vpl / 4; j++) coli_copy_async16(x_in + 4 * j, xs + 4 * j);
        coli_copy_commit();
    }
    /* the block's rows: an equal share (at most shape::rows) */
    const int64_t row0 = rows * blockIdx.x / gridDim.x, row_end = rows * (blockIdx.x + 1) / gridDim.x;
    const int kb = warp * CH * 64; /* the warp's slice: bytes kb.. of each row */
    float *sc = (float *)(dmma_shared + shape::w_bytes); /* int4: [tile][warp][row][group of the slice] */
    if constexpr (FORMAT == COLI_FMT_Q4) { /* a lane copies 16 bytes of scales; the 4 lanes of a row group read them */
        const int64_t groups = shape::cols / 32;
#pragma unroll
        for (int i = 0; i < RT; i++)
            for (int p = lane; p < 16 * CH; p += WARP) {
                const int64_t r = row0 + 16 * i + p / CH;
                coli_copy_async16(sc + ((i * NW + warp) * 16 + p / CH) * 4 * CH + 4 * (p % CH),
                                  scale + (r < row_end ? r : row_end - 1) * groups + warp * CH * 4 + 4 * (p % CH));
            }
        coli_copy_commit();
    }
    /* W: rows past the block's re-read its last one (their sums are dropped) */
    int4 wr[RR > 0 ? RR : 1][CH][2];
#pragma unroll
    for (int i = 0; i < RT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t r = row0 + 16 * i + g + 8 * h;
            const uint8_t *src = q + (r < row_end ? r : row_end - 1) * shape::row_bytes + kb + 16 * t;
#pragma unroll
            for (int c = 0; c < CH; c++) {
                if (shape::in_registers(i)) wr[shape::reg_tile(i)][c][h] = COLI_LOAD_STREAM((const int4 *)(src + 64 * c));
                else coli_copy_async16(dmma_shared + ((((i - shape::first_shared) * NW + warp) * CH + c) * 2 + h) * 512 + lane * 16,
                                       src + 64 * c);
            }
        }
    coli_copy_commit();
    if constexpr (XR) __syncthreads(); /* else ptxas moves the loads into registers past the x step below */
    const int64_t my_row = row0 + (int64_t)threadIdx.x;
    const float row_scale = FORMAT == COLI_FMT_Q8 && my_row < row_end ? scale[my_row] : 0.0625f; /* int4: 16 n */
    float v[shape::vpl]; /* x's slice */
    if constexpr (XR) {
        coli_copy_wait<FORMAT == COLI_FMT_Q4 ? 2 : 1>(); /* this lane's x (the scales and W may still be on their way) */
        const float *x_in = dmma_x_in<shape>(dmma_shared, warp, lane);
#pragma unroll
        for (int j = 0; j < shape::vpl / 4; j++) {
            const float4 f = *(const float4 *)(x_in + 4 * j);
            v[4 * j] = f.x, v[4 * j + 1] = f.y, v[4 * j + 2] = f.z, v[4 * j + 3] = f.w;
        }
    } else {
        coli_wait_prior_grid(); /* x is the last call's from here on */
        dmma_slice(x, warp * CH * shape::chunk_cols, lane, v);
    }

    /* x's slice, cut into digits in the warp's patch (dmma_slice_power says with what power of two) */
    const dmma_power e = dmma_slice_power<FORMAT, shape::vpl>(v);
    uint32_t *patch = (uint32_t *)(dmma_shared + shape::w_bytes + shape::s_bytes) + warp * shape::digit_rows * shape::digit_words;
    dmma_put_digits<FORMAT, shape::vpl, shape::digit_words, shape::digit_rows>(v, e, lane, patch);
    if constexpr (FORMAT == COLI_FMT_Q4) coli_copy_wait<1>(); /* this lane's scales (W's copies may still run) */
    __syncwarp(); /* the warp's digits (and scales) are in */

    /* int8: int32 sums over the slice; int4: each pair of groups', times their scales, in floats */
    int acc[RT][4] = {};
    float accf[RT][4] = {};
    const int from[4] = {FLOAT_SUM_BITS, FLOAT_SUM_BITS, FLOAT_SUM_BITS, FLOAT_SUM_BITS}; /* int4 */
    const uint32_t *b_lo = patch + dmma_b_at<FORMAT>(g, t, 0, shape::digit_words); /* B of tiles 0 and 1 */
    const uint32_t *b_hi = patch + dmma_b_at<FORMAT>(g, t, 2, shape::digit_words); /* int4: of tiles 2 and 3 */
    constexpr int chunk_words = 8 * mma_fmt<FORMAT>::steps;
    /* int4: every chunk's B words once, as whole vectors (read again for each tile, nvcc's
     * output for these kernels varied from build to build), each pair's B in registers
     * side by side (else every tile moves them), and A's offsets times B: with a few
     * pairs a warp (LATE) taken away as the sums become floats (dmma_offset_base), so
     * that their mma are off the way to the first tile; else taken from the sums' start
     * (fewer registers in the tiles) */
    constexpr bool LATE = RT * CH <= 4;
    uint32_t bq[FORMAT == COLI_FMT_Q4 ? CH : 1][2][2][2];
    float base[FORMAT == COLI_FMT_Q4 && LATE ? CH : 1][2][2];
    int start[FORMAT == COLI_FMT_Q4 && !LATE ? CH : 1][2][4];
    if constexpr (FORMAT == COLI_FMT_Q4) {
#pragma unroll
        for (int c = 0; c < CH; c++) {
            const int4 bv[2] = {*(const int4 *)(b_lo + chunk_words * c), *(const int4 *)(b_hi + chunk_words * c)};
#pragma unroll
            for (int p = 0; p < 2; p++) {
                int k[4];
                dmma_pair_b(bv, p, 0, bq[c][p][0]), dmma_pair_b(bv, p, 1, bq[c][p][1]);
                dmma_offsets(bq[c][p], k);
                if constexpr (LATE) /* rows g + 8: the same */
                    base[c][p][0] = dmma_offset_base(k[0]), base[c][p][1] = dmma_offset_base(k[1]);
                else
#pragma unroll
                    for (int j = 0; j < 4; j++) start[c][p][j] = FLOAT_SUM_BITS - k[j];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RT; i++) {
        if (i == shape::first_shared) coli_copy_wait<0>(); /* this lane's copies are in */
#pragma unroll
        for (int c = 0; c < CH; c++) {
            int4 a0, a1;
            if (shape::in_registers(i)) {
                a0 = wr[shape::reg_tile(i)][c][0], a1 = wr[shape::reg_tile(i)][c][1];
            } else {
                const uint8_t *slot = dmma_shared + (((i - shape::first_shared) * NW + warp) * CH + c) * 2 * 512 + lane * 16;
                a0 = *(const int4 *)slot, a1 = *(const int4 *)(slot + 512);
            }
            if constexpr (FORMAT == COLI_FMT_Q8) { /* this lane's B words of the chunk's tiles */
                uint32_t bw[4];
                *(uint4 *)bw = *(const uint4 *)(b_lo + chunk_words * c);
#pragma unroll
                for (int k = 0; k < 4; k++) bw[k] = g < 4 ? bw[k] : 0u; /* columns 4-7 unused */
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    uint32_t a[4];
                    dmma_a<FORMAT>(a0, a1, m, a);
                    const uint32_t b[2] = {bw[2 * m], bw[2 * m + 1]};
                    coli_mma_s8(acc[i], a, b);
                }
            } else { /* lane slot t's half of C is group p + 2 (t / 2) of the pair; its scales, rows g and g + 8: */
                /* group p's scale at + p */
                const float *srow = sc + ((i * NW + warp) * 16 + g) * 4 * CH + 4 * c + dmma_pair_group(0, t);
                const float2 s0 = *(const float2 *)srow, s8 = *(const float2 *)(srow + 8 * 4 * CH);
#pragma unroll
                for (int p = 0; p < 2; p++) { /* groups p and p + 2: sums from 1.5 2^23 */
                    uint32_t a[4], high[4];
                    dmma_a<FORMAT>(a0, a1, p, a);
                    dmma_high(a, high);
                    int d[4];
                    if constexpr (LATE) coli_mma_u8s8(d, a, bq[c][p][0], from);
                    else coli_mma_u8s8(d, a, bq[c][p][0], start[LATE ? 0 : c][p]);
                    coli_mma_u8s8(d, high, bq[c][p][1], d);
                    const float sg = p ? s0.y : s0.x, sg8 = p ? s8.y : s8.x;
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        const float sum = LATE ? dmma_pair_sum(d[k], base[LATE ? c : 0][p][k % 2]) : float_sum(d[k]);
                        accf[i][k] = fmaf(sum, k < 2 ? sg : sg8, accf[i][k]);
                    }
                }
            }
        }
    }

    float *part = (float *)(dmma_shared + shape::w_bytes + shape::s_bytes + shape::x_bytes);
#pragma unroll
    for (int i = 0; i < RT; i++) {
        float f[4];
#pragma unroll
        for (int k = 0; k < 4; k++) f[k] = FORMAT == COLI_FMT_Q8 ? (float)acc[i][k] : accf[i][k];
        dmma_put_rows<FORMAT>(f, e, t, part, warp * shape::rows + 16 * i + g);
    }
    __syncthreads();
    if constexpr (XR) coli_wait_prior_grid(); /* y may be the last call's output, or its x, until here */
    if (my_row < row_end) y[my_row] = dmma_meet<NW, shape::rows>(part, threadIdx.x) * row_scale;
}

/* Whether decode_mma_kernel can take a weight (at a width its shape has): int8, or
 * int4 in the mma layout, on sm_90. */
static inline bool decode_mma_laid(const coli_weight *w) {
    return (w->format == COLI_FMT_Q8 || (w->format == COLI_FMT_Q4 && w->layout == MMA_LAYOUT)) && cc_major() >= 9;
}

template <int FORMAT, int NW, int CH, int RT, int RR, int MINB, bool XR>
static void launch_decode_mma(const coli_weight *w, const float *dx, float *dy, cudaStream_t stream) {
    using shape = dmma_shape<FORMAT, NW, CH, RT, RR>;
    constexpr size_t shared = shape::shared + (XR ? shape::x_in_bytes : 0);
    static_assert(shared <= DMMA_SHARED_MAX, "a block's W, x's digits and sums fit its shared memory");
    static bool raised = false;
    launch_wide_blocks(decode_mma_kernel<FORMAT, NW, CH, RT, RR, MINB, XR>, raised, 1,
                       dim3((unsigned)((w->rows + shape::rows - 1) / shape::rows)), NW * WARP, shared, w, dx, dy, stream);
}

#endif

#endif
