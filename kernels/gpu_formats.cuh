/* What every matmul kernel shares: int8 and int4 weights as exact floats, the
 * int4 layouts (mma: each chunk's words transposed; tile by tile), and x cut into
 * int8 digits for the tensor cores, as host-and-device functions (the layout
 * check in tests/c runs them on the host). */
#ifndef COLI_GPU_FORMATS_CUH
#define COLI_GPU_FORMATS_CUH

#include "gpu_launch.cuh"

#include <math.h>
#include <stdint.h>

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

/* Byte k of each of 4 words, packed (k in 0-3). */
__host__ __device__ inline uint32_t bytes_of4(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, uint32_t k) {
    const uint32_t two = k | (k + 4) << 4;
    return coli_byte_perm(coli_byte_perm(w0, w1, two), coli_byte_perm(w2, w3, two), 0x5410);
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

/* A stored weight's value at (row, column c), in any format and layout. */
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

#endif
