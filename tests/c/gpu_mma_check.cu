/* The GPU backend's int8/int4 path, checked on the host (nvcc, no GPU needed):
 * the int4 mma layout is a permutation of each chunk's words and its own inverse,
 * and every value read back through it is the ABI's; x's digits put v back
 * together, |v| < 2^22, within half a step of x; q4_to_s8 makes 16 n of every
 * nibble; and the sums of one block as the mma kernel forms them (its prep, its
 * loads and operands, and the tensor cores' fragment layout as the PTX ISA gives
 * it, written out here) are the exact integer sums of W times each digit, a group
 * of 32 per int4 tile, and put together they are the dot product; so are the sums
 * of rows read the way decode_kernel reads them; KS warps sharing rows take each
 * whole run once; an inf or NaN in x makes its sums NaN; and gemm_kernel's turned
 * units and its sums put together hold (check_gemm_pieces); and decode_mma_kernel's
 * slice of x, its operands and its sums put together make the dot product
 * (check_decode_mma); and the tile layout holds the same values where
 * decode_tiled_kernel, mma_kernel and gemm_kernel read them (check_tile_layout),
 * and decode_tiled_kernel's blocks, alone or in clusters, take every item and
 * write every row once (check_tiled_cover).
 * Exit 0 when all hold. */
#include "gpu_decode_tiled.cuh"
#include "gpu_gemm.cuh"

#include <cmath>
#include <cstring>
#include <cstdio>
#include <vector>

static int failures = 0;
#define EXPECT(cond, ...)                         \
    do {                                          \
        if (!(cond) && failures++ < 10) {         \
            fprintf(stderr, __VA_ARGS__);         \
            fputc('\n', stderr);                  \
        }                                         \
    } while (0)

static uint32_t rng = 12345;
static uint32_t next_u32() { return rng = rng * 1664525u + 1013904223u; }
static float next_x(float scale) { return scale * ((float)(next_u32() >> 8) / 8388608.0f - 1.0f); }

/* The m16n8k32 int8 mma over a warp's fragments (g = lane / 4, t = lane % 4);
 * A's bytes signed, or unsigned (mma's u8.s8). */
static void reference_mma(const uint32_t (&a)[32][4], const uint32_t (&b)[32][2], int (&d)[32][4], bool unsigned_a = false) {
    int A[16][32], B[32][8];
    const auto byte = [unsigned_a](uint32_t w, int i) { return unsigned_a ? (int)(uint8_t)(w >> 8 * i) : (int)(signed char)(w >> 8 * i); };
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, t = lane % 4;
        for (int i = 0; i < 4; i++) {
            A[g][4 * t + i] = byte(a[lane][0], i), A[g + 8][4 * t + i] = byte(a[lane][1], i);
            A[g][16 + 4 * t + i] = byte(a[lane][2], i), A[g + 8][16 + 4 * t + i] = byte(a[lane][3], i);
            B[4 * t + i][g] = (signed char)(b[lane][0] >> 8 * i), B[16 + 4 * t + i][g] = (signed char)(b[lane][1] >> 8 * i);
        }
    }
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, t = lane % 4;
        for (int i = 0; i < 4; i++) {
            const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
            int sum = 0;
            for (int k = 0; k < 32; k++) sum += A[row][k] * B[k][col];
            d[lane][i] = sum;
        }
    }
}

static void check_digits() {
    const float scales[] = {1.0f, 3.0e-3f, 7.5e4f, 1.0e-30f};
    for (int trial = 0; trial < 4000; trial++) {
        float x[8];
        for (int j = 0; j < 8; j++) x[j] = next_x(scales[trial % 4]) * (j == trial % 8 ? 1.0f : (float)(next_u32() % 3));
        if (trial % 97 == 0) x[trial % 8] = 0.0f;
        float m = 0.0f;
        for (float v : x) m = fmaxf(m, fabsf(v));
        int ex = 0, d[DIGITS][8];
        (void)frexpf(m, &ex);
        digits_of8(x, ex, d);
        const double e = ldexp(1.0, ex - 22);
        for (int j = 0; j < 8; j++) {
            const int v = d[0][j] * 65536 + d[1][j] * 256 + d[2][j];
            EXPECT(std::abs(v) <= V_MAX && std::abs(d[0][j]) <= 64 && d[1][j] >= -128 && d[1][j] <= 127 &&
                       d[2][j] >= -128 && d[2][j] <= 127,
                   "digits of %g out of range: %d %d %d", x[j], d[0][j], d[1][j], d[2][j]);
            EXPECT(std::fabs(v * e - x[j]) <= 0.5 * e, "x %g came back as %g", x[j], v * e);
        }
    }
    float top[8];
    for (float &v : top) v = -nextafterf(1.0f, 0.0f); /* just under E = 1: rounds to 2^22 */
    int d[DIGITS][8];
    digits_of8(top, 0, d);
    EXPECT(d[0][0] * 65536 + d[1][0] * 256 + d[2][0] == -V_MAX, "v must stay off 2^22");
    for (int n = -8; n < 8; n++) { /* every nibble, at every place of a word */
        for (int place = 0; place < 8; place++) {
            const uint32_t w = (0x88888888u & ~(15u << 4 * place)) | (uint32_t)(n + 8) << 4 * place;
            uint32_t even, odd;
            q4_to_s8(w, even, odd);
            const uint32_t half = place % 2 ? odd : even;
            const int got = (signed char)(half >> 8 * (place / 2));
            EXPECT(got == 16 * n, "nibble %d at %d: %d, want %d", n, place, got, 16 * n);
        }
    }
}

static void check_layout() {
    for (int64_t wn = 0; wn < 64; wn++)
        EXPECT(mma_word(mma_word(wn)) == wn && mma_word(wn) / 16 == wn / 16, "word %lld leaves its chunk", (long long)wn);
    const int64_t rows = 3, cols = 256, bytes = rows * cols / 2;
    std::vector<uint8_t> abi((size_t)bytes), stored((size_t)bytes);
    for (uint8_t &b : abi) b = (uint8_t)(next_u32() >> 24);
    mma_reorder(abi.data(), stored.data(), bytes / 4);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            EXPECT(stored_value<COLI_FMT_Q4>(stored.data(), r, cols, MMA_LAYOUT, c) ==
                       stored_value<COLI_FMT_Q4>(abi.data(), r, cols, 0, c),
                   "int4 value (%lld, %lld) moved", (long long)r, (long long)c);
    EXPECT(mma_layout(COLI_FMT_Q4, 256, 32) && !mma_layout(COLI_FMT_Q4, 192, 32) && !mma_layout(COLI_FMT_Q4, 256, 64) &&
               !mma_layout(COLI_FMT_Q8, 256, 0),
           "the mma layout: int4 rows of whole chunks, groups of 32");
}

/* The tile layout (decode_tiled_kernel): every value and scale read back through
 * it is the ABI's; a row's chunks lie q4_chunk_stride apart in both int4 layouts,
 * as mma_kernel and gemm_kernel step through them; and an item's bytes are, where
 * decode_tiled_kernel's lane (g, t) reads them (16 lane, 512 + 16 lane; scales 4 g
 * and 4 g + 32 floats in), the mma layout's bytes of rows g and g + 8 of its tile,
 * 16 t into the chunk, that decode_mma_kernel's lane reads. */
static void check_tile_layout() {
    const int64_t rows = 48, cols = 384, chunks = cols / 128, bytes = rows * cols / 2;
    std::vector<uint8_t> abi((size_t)bytes), mma((size_t)bytes), tiled((size_t)bytes);
    std::vector<float> scale((size_t)(rows * cols / 32)), tiled_scale(scale.size());
    for (uint8_t &b : abi) b = (uint8_t)(next_u32() >> 24);
    for (float &v : scale) v = (float)(next_u32() % 1000);
    mma_reorder(abi.data(), mma.data(), bytes / 4);
    tile_reorder(abi.data(), scale.data(), rows, cols, tiled.data(), tiled_scale.data());
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            EXPECT(stored_value<COLI_FMT_Q4>(tiled.data(), r, cols, TILE_LAYOUT, c) ==
                       stored_value<COLI_FMT_Q4>(abi.data(), r, cols, 0, c),
                   "tile layout: int4 value (%lld, %lld) moved", (long long)r, (long long)c);
            EXPECT(stored_scale(tiled_scale.data(), r, cols, 32, TILE_LAYOUT, c) == stored_scale(scale.data(), r, cols, 32, 0, c),
                   "tile layout: the scale of (%lld, %lld) moved", (long long)r, (long long)c);
        }
    for (int32_t layout : {MMA_LAYOUT, TILE_LAYOUT})
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < chunks; c++)
                EXPECT(q4_w_at(layout, r, c, chunks) == q4_w_at(layout, r, 0, chunks) + c * q4_chunk_stride(layout) &&
                           q4_s_at(layout, r, c, chunks) == q4_s_at(layout, r, 0, chunks) + c * q4_chunk_stride(layout) / 16,
                       "layout %d: row %lld's chunks are not a stride apart", (int)layout, (long long)r);
    for (int64_t tile = 0; tile < rows / 16; tile++)
        for (int64_t c = 0; c < chunks; c++) {
            const int64_t item = tile * chunks + c;
            for (int lane = 0; lane < 32; lane++) {
                const int g = lane / 4, t = lane % 4;
                for (int h = 0; h < 2; h++) {
                    const int64_t row = tile * 16 + g + 8 * h;
                    EXPECT(memcmp(&tiled[(size_t)(item * 1024 + 512 * h + 16 * lane)], &mma[(size_t)((row * chunks + c) * 64 + 16 * t)], 16) == 0,
                           "tile layout: item (%lld, %lld), lane %d, rows %s", (long long)tile, (long long)c, lane, h ? "8-15" : "0-7");
                    for (int k = 0; k < 4; k++)
                        EXPECT(tiled_scale[(size_t)(item * 64 + 4 * g + 32 * h + k)] == scale[(size_t)(row * cols / 32 + 4 * c + k)],
                               "tile layout: item (%lld, %lld), scale %d of row %lld", (long long)tile, (long long)c, k, (long long)row);
                }
            }
        }
}

/* decode_tiled_kernel's blocks, P to a cluster, at `rows` rows of the form's width
 * (dtiled_shape): every item (a 16-row tile's chunk) is copied by one warp alone,
 * as the tile its copy group sums into, with the slice of x of the chunk's columns
 * where the sums take that chunk, in a block of the cluster that holds the tile;
 * and every row is written once, by the block its cluster's sums meet in. */
template <int NW, int CH, int D, int G, int P> static void check_tiled_cover(int64_t rows) {
    using shape = dtiled_shape<NW, CH, D, G, P>;
    const int64_t chunks = shape::chunks, tiles = rows / 16, blocks = rows / shape::rows * P;
    std::vector<int> copied((size_t)(tiles * chunks)), written((size_t)rows);
    for (int64_t b = 0; b < blocks; b++) {
        for (int w = 0; w < NW; w++)
            for (int k = 0; k < shape::groups; k++)
                for (int m = 0; m < G; m++) {
                    const int64_t item = shape::item(b, w, k) + m, tile = item / chunks, chunk = item % chunks;
                    const int c = k % (CH / G) * G + m; /* the chunk of the warp's slice the sums take */
                    if (item < 0 || item >= tiles * chunks) {
                        EXPECT(false, "tiled P%d: block %lld warp %d group %d: item %lld past the weight", P, (long long)b, w, k,
                               (long long)item);
                        continue;
                    }
                    copied[(size_t)item]++;
                    EXPECT(tile == b / P * shape::tiles + k / (CH / G) && chunk * 128 == shape::x_at(b, w) + 128 * c,
                           "tiled P%d: block %lld warp %d group %d: item (%lld, %lld) is not its tile's or its x's", P,
                           (long long)b, w, k, (long long)tile, (long long)chunk);
                }
        for (int j = 0; j < 32; j++) {
            const int64_t row = shape::out_row(b, j);
            if (row >= 0 && row < rows) written[(size_t)row]++;
        }
    }
    for (int64_t b = 0; b < blocks; b += P) /* row j of a cluster's sums meets in block j / 32, as thread j % 32 */
        for (int j = 0; j < shape::part_rows; j++)
            EXPECT(shape::out_row(b + j / 32, j % 32) == (b / P * shape::tiles + j / 16) * 16 + j % 16,
                   "tiled P%d: cluster %lld's row %d meets where another row is written", P, (long long)(b / P), j);
    for (size_t i = 0; i < copied.size(); i++)
        EXPECT(copied[i] == 1, "tiled P%d: item %zu copied %d times", P, i, copied[i]);
    for (size_t r = 0; r < written.size(); r++)
        EXPECT(written[r] == 1, "tiled P%d: row %zu written %d times", P, r, written[r]);
}

/* One block of 16 rows and a pair of tokens, as mma_kernel forms it. */
template <int FORMAT> static void check_block(int chunks) {
    constexpr int CC = mma_fmt<FORMAT>::cols, STEPS = mma_fmt<FORMAT>::steps, BITS = FORMAT == COLI_FMT_Q8 ? 8 : 4;
    const int rows = 16, cols = chunks * CC, s = 2, row_bytes = cols * BITS / 8;
    std::vector<uint8_t> abi((size_t)rows * row_bytes), stored(abi.size());
    for (uint8_t &b : abi) b = (uint8_t)(next_u32() >> 24);
    if (FORMAT == COLI_FMT_Q4) mma_reorder(abi.data(), stored.data(), (int64_t)abi.size() / 4);
    else stored = abi;
    std::vector<float> x((size_t)s * cols), scale((size_t)rows * cols / 32);
    for (size_t i = 0; i < x.size(); i++) x[i] = next_x(i / CC % 2 ? 1e-3f : 5.0f); /* chunks of different sizes */
    for (float &v : scale) v = 0.01f + 0.001f * (float)(next_u32() % 100);
    /* the prep, and each column's digits read straight from its run */
    std::vector<uint32_t> planes((size_t)s * cols);
    std::vector<float> ex((size_t)ex_at(s, chunks, 0));
    std::vector<int> digit((size_t)s * cols * DIGITS);
    for (int tok = 0; tok < s; tok++)
        for (int c = 0; c < chunks; c++) {
            float m = 0.0f;
            for (int j = 0; j < CC; j++) m = fmaxf(m, fabsf(x[(size_t)tok * cols + c * CC + j]));
            int ex_m = 0;
            (void)frexpf(m, &ex_m);
            for (int q = 0; q < CC / 8; q++) {
                float v[8];
                int d[DIGITS][8];
                for (int j = 0; j < 8; j++) v[j] = x[(size_t)tok * cols + c * CC + 8 * q + j];
                mma_prep_run<FORMAT>(v, m, false, tok, chunks, c, q, planes.data(), ex.data());
                digits_of8(v, ex_m, d);
                for (int k = 0; k < DIGITS; k++)
                    for (int j = 0; j < 8; j++) digit[((size_t)tok * cols + c * CC + 8 * q + j) * DIGITS + k] = d[k][j];
            }
        }
    auto w_value = [&](int row, int col) { /* the ABI's value (int4: 16 n, as the tiles hold it) */
        return FORMAT == COLI_FMT_Q8 ? (int)(signed char)abi[(size_t)row * row_bytes + col]
                                     : 16 * ((abi[(size_t)row * row_bytes + col / 2] >> 4 * (col % 2) & 15) - 8);
    };
    double acc[16][8] = {};
    for (int c = 0; c < chunks; c++) {
        int chunk_sum[32][4] = {};
        for (int m = 0; m < STEPS; m++) {
            uint32_t a[32][4], b[32][2];
            for (int lane = 0; lane < 32; lane++) {
                const int g = lane / 4, t = lane % 4, tok_b = g / 4, dig = g % 4;
                int4 wg, wg8, u[STEPS / 2];
                memcpy(&wg, &stored[(size_t)g * row_bytes + c * 64 + 16 * t], 16);
                memcpy(&wg8, &stored[(size_t)(g + 8) * row_bytes + c * 64 + 16 * t], 16);
                if (dig < DIGITS) memcpy(u, &planes[(size_t)plane_at<FORMAT>(tok_b, chunks, c, dig, t)], sizeof u);
                else memset(u, 0, sizeof u);
                mma_operands<FORMAT>(wg, wg8, u, m, a[lane], b[lane]);
            }
            int d[32][4];
            reference_mma(a, b, d);
            for (int lane = 0; lane < 32; lane++)
                for (int i = 0; i < 4; i++) {
                    const int row = lane / 4 + 8 * (i / 2), n = 2 * (lane % 4) + i % 2, tok = n / 4, k = n % 4;
                    chunk_sum[lane][i] += d[lane][i];
                    if (FORMAT == COLI_FMT_Q4) { /* a tile is one group of 32: check it, then weigh it */
                        long long want = 0;
                        for (int col = c * CC + 32 * m; k < DIGITS && col < c * CC + 32 * (m + 1); col++)
                            want += (long long)w_value(row, col) * digit[((size_t)tok * cols + col) * DIGITS + k];
                        EXPECT(d[lane][i] == want, "int4 chunk %d tile %d, row %d digit %d of token %d: %d, want %lld",
                               c, m, row, k, tok, d[lane][i], want);
                        acc[row][n] += (double)d[lane][i] * ex[(size_t)ex_at(tok, chunks, c)] *
                                       scale[(size_t)row * (cols / 32) + c * 4 + m];
                    }
                }
        }
        if (FORMAT == COLI_FMT_Q8) /* the chunk's tiles together: W times each digit over its 64 columns */
            for (int lane = 0; lane < 32; lane++)
                for (int i = 0; i < 4; i++) {
                    const int row = lane / 4 + 8 * (i / 2), n = 2 * (lane % 4) + i % 2, tok = n / 4, k = n % 4;
                    long long want = 0;
                    for (int col = c * CC; k < DIGITS && col < (c + 1) * CC; col++)
                        want += (long long)w_value(row, col) * digit[((size_t)tok * cols + col) * DIGITS + k];
                    EXPECT(chunk_sum[lane][i] == want, "int8 chunk %d, row %d digit %d of token %d: %d, want %lld", c,
                           row, k, tok, chunk_sum[lane][i], want);
                    acc[row][n] += (double)chunk_sum[lane][i] * ex[(size_t)ex_at(tok, chunks, c)];
                }
    }
    for (int row = 0; row < 16; row++)
        for (int tok = 0; tok < s; tok++) {
            double got = 65536.0 * acc[row][4 * tok] + 256.0 * acc[row][4 * tok + 1] + acc[row][4 * tok + 2], want = 0.0;
            got *= FORMAT == COLI_FMT_Q8 ? 1.0 : 1.0 / 16;
            double size = 0.0;
            for (int col = 0; col < cols; col++) {
                const double w = FORMAT == COLI_FMT_Q8 ? w_value(row, col) : w_value(row, col) / 16.0 * scale[(size_t)row * (cols / 32) + col / 32];
                want += w * x[(size_t)tok * cols + col], size += fabs(w * x[(size_t)tok * cols + col]);
            }
            EXPECT(fabs(got - want) <= 1e-6 * size, "format %d, row %d token %d: %.9g, want %.9g", FORMAT, row, tok, got,
                   want);
        }
}

/* decode_units as first written (finite_max8, frexpf, digits_of8 per value): the
 * lean form in the kernels must give the same units, bit for bit. */
template <int FORMAT> static void reference_units(const float (&v)[8], int64_t g, int64_t cols, int32_t layout, float4 *out) {
    bool bad;
    int ex = 0, d[DIGITS][8] = {};
    (void)frexpf(finite_max8(v, bad), &ex);
    if (!bad) digits_of8(v, ex, d);
    const float e = digit_step(ex, bad);
    const int64_t pieces = cols / (FORMAT == COLI_FMT_Q8 ? 16 : 32);
    uint32_t p[DIGITS][2];
    for (int k = 0; k < DIGITS; k++) mma_pack<FORMAT>(d[k], p[k][0], p[k][1]);
    if (FORMAT == COLI_FMT_Q8) {
        for (int h = 0; h < 2; h++)
            out[decode_unit(layout, 2 * g + h, pieces)] = make_float4(as_float(p[0][h]), as_float(p[1][h]), as_float(p[2][h]), e);
    } else {
        int sum = 0;
        for (int j = 0; j < 8; j++) sum += d[0][j] * 65536 + d[1][j] * 256 + d[2][j];
        const int64_t u = decode_unit(layout, g, pieces);
        out[u] = make_float4(as_float(p[0][0]), as_float(p[0][1]), as_float(p[1][0]), as_float(p[1][1]));
        out[cols / 8 + u] = make_float4(as_float(p[2][0]), as_float(p[2][1]), e, as_float((uint32_t)(-8 * sum)));
    }
}

/* Runs of every kind: wide and narrow ranges, zeros, values that round up to 2^22
 * (then held at V_MAX), exact powers of two, runs below 2^-104 (digits_of8's own
 * path) and subnormal ones, and an inf or NaN among finite values. */
template <int FORMAT> static void check_units_exact() {
    const float scales[] = {1.0f, 3.0e-3f, 7.5e4f, 1.0e-30f, 3.0e-33f, 1.0e-39f, 2.0e38f, 0.0f};
    const int64_t cols = FORMAT == COLI_FMT_Q8 ? 16 : 32;
    const int32_t layout = FORMAT == COLI_FMT_Q4 ? MMA_LAYOUT : 0;
    for (int trial = 0; trial < 20000; trial++) {
        float x[8];
        for (int j = 0; j < 8; j++) x[j] = next_x(scales[trial % 8]) * (float)(next_u32() % 4);
        if (trial % 5 == 1) x[trial % 8] = -nextafterf(ldexpf(1.0f, (int)(next_u32() % 40) - 20), 0.0f);
        if (trial % 7 == 2) x[(trial + 3) % 8] = ldexpf(1.0f, (int)(next_u32() % 60) - 30);
        if (trial % 11 == 3) x[trial % 8] = trial % 2 ? INFINITY : NAN;
        if (trial % 13 == 4) x[trial % 8] = -INFINITY;
        float4 got[4], want[4];
        memset(got, 0x5A, sizeof got), memset(want, 0x5A, sizeof want);
        decode_units<FORMAT>(x, 0, cols, layout, got);
        reference_units<FORMAT>(x, 0, cols, layout, want);
        EXPECT(memcmp(got, want, sizeof got) == 0, "format %d, trial %d: units differ from the reference (x[0] %g)",
               FORMAT, trial, x[0]);
    }
}

/* Rows through decode_kernel's reads: each lane's pieces, run by run (the last
 * one narrower), against the digits where decode_unit put them. extreme: every
 * value at its most negative and every x just below its E, where a word's sum
 * comes nearest to int32's end. */
template <int FORMAT> static void check_decode(int cols, bool extreme = false) {
    constexpr int BITS = FORMAT == COLI_FMT_Q8 ? 8 : 4;
    const int rows = 3, row_bytes = cols * BITS / 8, pieces = cols / (FORMAT == COLI_FMT_Q8 ? 16 : 32);
    const int32_t layout = FORMAT == COLI_FMT_Q4 ? MMA_LAYOUT : 0;
    std::vector<uint8_t> abi((size_t)rows * row_bytes), stored(abi.size());
    for (uint8_t &b : abi) b = extreme ? (FORMAT == COLI_FMT_Q8 ? 0x80 : 0x00) : (uint8_t)(next_u32() >> 24);
    if (FORMAT == COLI_FMT_Q4) mma_reorder(abi.data(), stored.data(), (int64_t)abi.size() / 4);
    else stored = abi;
    std::vector<float> x((size_t)cols), scale((size_t)rows * (FORMAT == COLI_FMT_Q8 ? 1 : cols / 32));
    for (size_t i = 0; i < x.size(); i++) x[i] = extreme ? -nextafterf(1.0f, 0.0f) : next_x(i / 8 % 3 ? 1.0f : 1e-4f);
    for (float &v : scale) v = 0.01f + 0.001f * (float)(next_u32() % 100);
    std::vector<int> seen((size_t)pieces * 4, 0);
    for (int64_t wn = 0; wn < pieces * 4; wn++) seen[(size_t)decode_unit(layout, wn, pieces)]++;
    for (int v : seen) EXPECT(v == 1, "format %d, %d columns: decode_unit is not a permutation", FORMAT, cols);
    std::vector<float4> units((size_t)cols / 4);
    for (int g = 0; g < cols / 8; g++) {
        float v[8];
        for (int j = 0; j < 8; j++) v[j] = x[(size_t)8 * g + j];
        decode_units<FORMAT>(v, g, cols, layout, units.data());
    }
    for (int row = 0; row < rows; row++) {
        double got = 0.0, want = 0.0, size = 0.0;
        for (int start = 0; start < pieces; start += 32) {
            const int nb = pieces - start < 32 ? pieces - start : 32;
            for (int lane = 0; lane < nb; lane++) {
                int4 piece;
                memcpy(&piece, &stored[(size_t)row * row_bytes + 16 * (start + lane)], 16);
                for (int m = 0; m < 4; m++) {
                    const size_t at = (size_t)start * 4 + m * nb + lane;
                    float4 u[FORMAT == COLI_FMT_Q8 ? 1 : 2];
                    u[0] = units[at];
                    if (FORMAT == COLI_FMT_Q4) u[1] = units[(size_t)cols / 8 + at];
                    const int dot = word_dot<FORMAT>(word_of(piece, m), u);
                    got += FORMAT == COLI_FMT_Q8 ? (double)dot * u[0].w
                                                 : (double)dot * u[FORMAT == COLI_FMT_Q8 ? 0 : 1].z *
                                                       scale[(size_t)row * (cols / 32) + (start + lane) / 4 * 4 + m];
                }
            }
        }
        if (FORMAT == COLI_FMT_Q8) got *= scale[(size_t)row];
        for (int col = 0; col < cols; col++) {
            const int n = FORMAT == COLI_FMT_Q8 ? (signed char)abi[(size_t)row * row_bytes + col]
                                                : (abi[(size_t)row * row_bytes + col / 2] >> 4 * (col % 2) & 15) - 8;
            const double w = n * (double)scale[(size_t)row * (FORMAT == COLI_FMT_Q8 ? 1 : cols / 32) +
                                              (FORMAT == COLI_FMT_Q8 ? 0 : col / 32)];
            want += w * x[(size_t)col], size += fabs(w * x[(size_t)col]);
        }
        EXPECT(fabs(got - want) <= 1e-6 * size, "decode, format %d, %d columns, row %d: %.9g, want %.9g", FORMAT, cols,
               row, got, want);
    }
}

/* KS warps sharing rows (decode_slice): their pieces are whole runs of 32, in
 * order, each taken once, all of the row's whole runs taken. */
static void check_slices() {
    for (int runs = 0; runs <= 50; runs++)
        for (int ks : {1, 2, 3, 4, 8}) {
            int next = 0;
            for (int slice = 0; slice < ks; slice++) {
                int first, last;
                decode_slice(runs * WARP, ks, slice, first, last);
                if (first >= last) continue; /* nothing for this slice */
                EXPECT(first == next && first % WARP == 0 && last % WARP == 0,
                       "decode_slice: %d runs, %d slices, slice %d takes [%d, %d) after %d", runs, ks, slice, first, last,
                       next);
                next = last;
            }
            EXPECT(next == runs * WARP, "decode_slice: %d runs, %d slices: %d pieces taken", runs, ks, next);
        }
}

/* An inf or NaN in x makes its chunk's (mma) or run's (decode) E NaN, so the sums come out NaN. */
static void check_not_finite() {
    const float bad[8] = {1.0f, NAN, 0.0f, 2.0f, 0.0f, 0.0f, 0.0f, INFINITY};
    std::vector<uint32_t> planes(1024);
    std::vector<float> ex(16);
    mma_prep_run<COLI_FMT_Q8>(bad, 2.0f, true, 0, 1, 0, 0, planes.data(), ex.data());
    EXPECT(std::isnan(ex[0]), "mma: a chunk holding NaN or inf must have a NaN E");
    float4 units[8] = {};
    decode_units<COLI_FMT_Q8>(bad, 0, 16, 0, units);
    EXPECT(std::isnan(units[0].w) && std::isnan(units[1].w), "decode: a run holding NaN or inf must have a NaN E");
    decode_units<COLI_FMT_Q4>(bad, 0, 32, MMA_LAYOUT, units);
    EXPECT(std::isnan(units[decode_unit(MMA_LAYOUT, 0, 1) + 4].z), "decode: int4's E must be NaN too");
}

/* gemm_kernel's pieces: a 64-byte row's units turned by gemm_unit are still its 4
 * units, and the 8 rows an ldmatrix reads at one unit (rows 8i..8i+7, or the same
 * rows of digits) lie in 8 different 16-byte bank groups; and a digit's three sums,
 * each 1.5 * 2^23 plus the sum as int32 bits (the tensor cores' start), come back
 * as a 2^16 + b 2^8 + c + 1.5 * 2^23 to within two roundings of the parts' size
 * (2^-23 of |a| 2^16 + |b| 2^8 + |c| + 1.5 * 2^23, as a float sum of them would be),
 * at the extremes of |sum| < 2^22 and at random. */
static void check_gemm_pieces() {
    for (int r = 0; r < 64; r++) {
        int seen = 0;
        for (int u = 0; u < 4; u++) seen |= 1 << gemm_unit(r, u);
        EXPECT(seen == 15, "gemm_unit: row %d's units are not a permutation of 0-3", r);
    }
    for (int r0 = 0; r0 < 64; r0 += 8)
        for (int u = 0; u < 4; u++) {
            int groups = 0;
            for (int r = r0; r < r0 + 8; r++) groups |= 1 << ((4 * r + gemm_unit(r, u)) % 8);
            EXPECT(groups == 255, "gemm_unit: rows %d-%d at unit %d share a bank group", r0, r0 + 7, u);
        }
    const int edge[] = {0, 1, -1, (1 << 22) - 1, -((1 << 22) - 1), 12345, -777};
    for (int n = 0; n < 400; n++) {
        int d[3];
        for (int k = 0; k < 3; k++)
            d[k] = n < 343 ? edge[n / (k == 0 ? 49 : k == 1 ? 7 : 1) % 7] : (int)(next_u32() % ((1u << 23) - 1)) - ((1 << 22) - 1);
        const double want = 65536.0 * d[0] + 256.0 * d[1] + d[2] + (double)FLOAT_SUM_BASE;
        const double got = gemm_combine(FLOAT_SUM_BITS + d[0], FLOAT_SUM_BITS + d[1], FLOAT_SUM_BITS + d[2]);
        const double parts = 65536.0 * abs(d[0]) + 256.0 * abs(d[1]) + abs(d[2]) + (double)FLOAT_SUM_BASE;
        EXPECT(fabs(got - want) <= ldexp(parts, -23), "gemm_combine(%d, %d, %d) = %.1f, want %.1f", d[0], d[1], d[2], got,
               want);
    }
}

/* One warp's slice of 16 rows as decode_mma_kernel forms it: x cut with the
 * slice's power of two into the digits' patch (dmma_run_words at dmma_word, and
 * the row of zeros), each lane's A from its 16 bytes of rows g and g + 8 of a
 * chunk (dmma_a, int4 also dmma_high) and B from the patch (dmma_b_at; int4 a
 * pair's by dmma_pair_b, or with `four_rows` by dmma_b_words from a patch
 * without the zeros, as decode_tiled_kernel reads it), the tiles' sums (int4: a pair of groups', from 1.5
 * 2^23 less the nibbles' offsets times B, or from 1.5 2^23 and back to floats
 * less both (`late`), each half times its group's scale) put together as the
 * kernel does: the dot product, within what x's rounding (2^-31, int4 2^-27, of
 * the slice's largest |x|) and float sums allow. */
template <int FORMAT>
static void check_decode_mma(int chunks, float amp = 1.0f, bool extremes = false, bool late = false, bool four_rows = false) {
    constexpr int CC = mma_fmt<FORMAT>::cols, STEPS = mma_fmt<FORMAT>::steps, WORDS = 2 * STEPS;
    const int rows = 16, cols = chunks * CC, row_bytes = chunks * 64, digit_words = chunks * 4 * WORDS;
    std::vector<uint8_t> abi((size_t)rows * row_bytes), stored(abi.size());
    for (uint8_t &b : abi) b = (uint8_t)(next_u32() >> 24);
    if (FORMAT == COLI_FMT_Q4) mma_reorder(abi.data(), stored.data(), (int64_t)abi.size() / 4);
    else stored = abi;
    std::vector<float> x((size_t)cols), scale((size_t)rows * cols / 32);
    for (int k = 0; k < cols; k++)
        x[(size_t)k] = extremes ? (k % 2 ? -amp : amp) /* v at its largest, odd and even columns apart: o - 16 e */
                                : k % 37 == 0 ? 0.0f : next_x(amp * (k / CC % 3 == 0 ? 20.0f : k / CC % 3 == 1 ? 1e-3f : 1.0f));
    for (float &v : scale) v = 0.01f + 0.001f * (float)(next_u32() % 100);
    uint32_t top = 0;
    for (float v : x) top = std::max(top, as_bits(v) & 0x7FFFFFFFu);
    const dmma_power e = dmma_power_of<FORMAT>(top);
    std::vector<uint32_t> patch((size_t)5 * digit_words, 0xDEADBEEFu); /* what the kernel leaves unwritten (int8: row 4) */
    for (int run = 0; run < cols / 8; run++) {
        uint32_t words[4][2];
        dmma_run_words<FORMAT>(&x[(size_t)run * 8], e, words);
        for (int h = 0; h < 2; h++) {
            for (int d = 0; d < 4; d++) patch[(size_t)d * digit_words + dmma_word<FORMAT>(run) + h] = words[d][h];
            if (FORMAT == COLI_FMT_Q4 && !four_rows) patch[(size_t)4 * digit_words + dmma_word<FORMAT>(run) + h] = 0u;
        }
    }
    /* the kernel's order: int8 tile by tile into one C; int4 the pair p and p + 2
     * of groups into a C (its raw bytes, then its high nibbles), lane slot t's half
     * of it group p + 2 (t / 2) */
    int acc[32][4] = {};
    float accf[32][4] = {};
    for (int c = 0; c < chunks; c++)
        for (int p = 0; p < (FORMAT == COLI_FMT_Q8 ? STEPS : 2); p++) {
            int d[32][4] = {}, off[32][4] = {}; /* int4: and the offsets' share, from mma of A's offsets */
            for (int m = p; m < (FORMAT == COLI_FMT_Q8 ? STEPS : 2 * STEPS); m += STEPS) { /* int4: two mma */
                uint32_t a[32][4], b[32][2], offset[32][4];
                for (int lane = 0; lane < 32; lane++) {
                    const int g = lane / 4, t = lane % 4;
                    int4 a0, a1;
                    memcpy(&a0, &stored[(size_t)g * row_bytes + 64 * c + 16 * t], 16);
                    memcpy(&a1, &stored[(size_t)(g + 8) * row_bytes + 64 * c + 16 * t], 16);
                    dmma_a<FORMAT>(a0, a1, p, a[lane]);
                    if constexpr (FORMAT == COLI_FMT_Q8) {
                        for (int h = 0; h < 2; h++)
                            b[lane][h] = g >= 4 ? 0u : patch[(size_t)dmma_b_at<FORMAT>(g, t, m, digit_words) + c * 4 * WORDS + h];
                    } else {
                        int4 bw[2]; /* the kernel's B words of tiles 0 and 1, and of 2 and 3 */
                        if (four_rows) /* decode_tiled_kernel's: no row of zeros */
                            dmma_b_words(&patch[(size_t)c * 4 * WORDS], g, t, digit_words, bw);
                        else
                            for (int half = 0; half < 2; half++)
                                memcpy(&bw[half], &patch[(size_t)dmma_b_at<FORMAT>(g, t, 2 * half, digit_words) + c * 4 * WORDS], 16);
                        const int second = m >= STEPS;
                        dmma_pair_b(bw, p, second, b[lane]);
                        if (second) dmma_high(a[lane], a[lane]);
                        for (int k = 0; k < 4; k++) offset[lane][k] = second ? DMMA_HIGH_OFFSET : DMMA_RAW_OFFSET;
                    }
                }
                int dm[32][4], dk[32][4] = {};
                reference_mma(a, b, dm, FORMAT == COLI_FMT_Q4);
                if (FORMAT == COLI_FMT_Q4) reference_mma(offset, b, dk, true);
                for (int lane = 0; lane < 32; lane++)
                    for (int k = 0; k < 4; k++) d[lane][k] += dm[lane][k], off[lane][k] += dk[lane][k];
            }
            for (int lane = 0; lane < 32; lane++)
                for (int k = 0; k < 4; k++) {
                    const int row = lane / 4 + 8 * (k / 2), group = c * 4 + dmma_pair_group(p, lane % 4);
                    if (FORMAT == COLI_FMT_Q8) acc[lane][k] += d[lane][k];
                    else accf[lane][k] = fmaf(late ? dmma_pair_sum(FLOAT_SUM_BITS + d[lane][k], dmma_offset_base(off[lane][k]))
                                                   : float_sum(FLOAT_SUM_BITS - off[lane][k] + d[lane][k]),
                                              scale[(size_t)row * cols / 32 + group], accf[lane][k]);
                }
        }
    float p[32][2];
    for (int lane = 0; lane < 32; lane++)
        for (int h = 0; h < 2; h++) {
            const float lo = FORMAT == COLI_FMT_Q8 ? (float)acc[lane][2 * h] : accf[lane][2 * h];
            const float hi = FORMAT == COLI_FMT_Q8 ? (float)acc[lane][2 * h + 1] : accf[lane][2 * h + 1];
            p[lane][h] = dmma_digits(lo, hi, dmma_slot<FORMAT>(lane % 4));
        }
    for (int r = 0; r < rows; r++) {
        const int lane = 4 * (r % 8), h = r / 8;
        const float sum = p[lane][h] + p[lane + 1][h] + (p[lane + 2][h] + p[lane + 3][h]); /* the kernel's two exchanges */
        const double got = (double)e.back(sum) * (FORMAT == COLI_FMT_Q8 ? 1.0 : 0.0625);
        double want = 0.0, size = 0.0, wsum = 0.0;
        for (int k = 0; k < cols; k++) {
            const double w = (double)stored_value<FORMAT>(abi.data(), r, cols, 0, k) *
                             (FORMAT == COLI_FMT_Q8 ? 1.0 : (double)scale[(size_t)r * cols / 32 + k / 32]);
            want += w * x[(size_t)k], size += fabs(w * x[(size_t)k]), wsum += fabs(w);
        }
        const double bound = ldexp(wsum * (double)as_float(top), FORMAT == COLI_FMT_Q8 ? -31 : -27) + ldexp(size, -20);
        EXPECT(fabs(got - want) <= bound, "decode_mma %s, %d chunks, x of %g, row %d: %.9g, want %.9g (bound %.3g)",
               FORMAT == COLI_FMT_Q8 ? "int8" : "int4", chunks, (double)amp, r, got, want, bound);
    }
    EXPECT(std::isnan(dmma_power_of<FORMAT>(0x7F800000u).back(1.0f)) && dmma_power_of<FORMAT>(0).back(0.0f) == 0.0f,
           "decode_mma: an inf in the slice makes its sums NaN; a zero slice's are 0");
}

int main() {
    check_digits();
    check_units_exact<COLI_FMT_Q8>();
    check_units_exact<COLI_FMT_Q4>();
    check_not_finite();
    check_slices();
    check_layout();
    check_tile_layout();
    check_tiled_cover<16, 4, 4, 2, 1>(4096); /* the pick's forms (launch_decode_tiled_pick) */
    check_tiled_cover<12, 4, 12, 4, 2>(4096);
    check_tiled_cover<12, 8, 8, 2, 1>(4128);
    check_tiled_cover<14, 4, 6, 2, 2>(4096);
    check_tiled_cover<14, 8, 8, 2, 1>(4128);
    check_tiled_cover<14, 4, 6, 2, 2>(2048); /* the rows tile_layout_fits takes beside 4096 */
    check_tiled_cover<12, 4, 12, 4, 2>(6144);
    check_tiled_cover<16, 4, 4, 2, 1>(8192);
    check_tiled_cover<7, 4, 16, 2, 4>(4096); /* clusters of 4 (measured, not picked) */
    check_block<COLI_FMT_Q8>(3);
    check_block<COLI_FMT_Q4>(3);
    check_decode<COLI_FMT_Q8>(16 * 45);  /* a run of 32 pieces and one of 13 */
    check_decode<COLI_FMT_Q8>(16);       /* one piece */
    check_decode<COLI_FMT_Q4>(128 * 17); /* two runs of 32 pieces and one of 4 */
    check_decode<COLI_FMT_Q8>(16 * 4, true);
    check_decode<COLI_FMT_Q4>(128, true);
    check_gemm_pieces();
    check_decode_mma<COLI_FMT_Q8>(4);
    check_decode_mma<COLI_FMT_Q8>(8);
    check_decode_mma<COLI_FMT_Q4>(2);
    check_decode_mma<COLI_FMT_Q4>(4);
    check_decode_mma<COLI_FMT_Q8>(4, 1e-38f); /* past 2^-90: v in two steps; some x subnormal */
    check_decode_mma<COLI_FMT_Q4>(2, 1e-38f);
    check_decode_mma<COLI_FMT_Q8>(4, 1e32f);  /* a large power of two (the sums stay finite) */
    check_decode_mma<COLI_FMT_Q8>(4, nextafterf(2.0f, 0.0f), true); /* every v just below 2^30 (int4 2^26) */
    check_decode_mma<COLI_FMT_Q4>(2, nextafterf(2.0f, 0.0f), true);
    check_decode_mma<COLI_FMT_Q4>(2, 1.0f, false, true); /* the offsets taken away late */
    check_decode_mma<COLI_FMT_Q4>(2, nextafterf(2.0f, 0.0f), true, true);
    check_decode_mma<COLI_FMT_Q4>(8, 1.0f, false, true, true); /* B from the 4 digits' rows alone (decode_tiled_kernel) */
    check_decode_mma<COLI_FMT_Q4>(8, nextafterf(2.0f, 0.0f), true, true, true);
    printf("%s\n", failures ? "mma path check FAILED" : "mma path check passed");
    return failures != 0;
}
