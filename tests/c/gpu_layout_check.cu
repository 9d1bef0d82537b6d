/* The GPU backend's weight layout and x planes, checked on the host (nvcc, no GPU
 * needed): the reordering is a permutation of each row's words; every value read
 * back through the layout is the value the ABI's order holds; word m of lane i in a
 * run is where gemv_kernel looks for it; x's int8 digits put v back together, v is
 * x to within half a step; and a weight word's integer dot with the planes is the
 * exact sum of value * v. Exit 0 when all hold. */
#include "gpu_compat.h"
#include "backend_common.h"
#include "gpu_matmul.cuh"

#include <cmath>
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

template <int FORMAT> static void check_values(int64_t rows, int64_t cols, uint32_t seed) {
    const size_t bytes = (size_t)(rows * cols * (FORMAT == COLI_FMT_Q8 ? 8 : 4) / 8);
    std::vector<uint8_t> abi(bytes), stored(bytes);
    for (size_t i = 0; i < bytes; i++) abi[i] = (uint8_t)((seed = seed * 1664525u + 1013904223u) >> 24);
    interleave_rows(abi.data(), stored.data(), rows, (int64_t)(bytes / 4 / (size_t)rows));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            EXPECT(stored_value<FORMAT>(stored.data(), r, cols, 1, c) == stored_value<FORMAT>(abi.data(), r, cols, 0, c),
                   "format %d, %lldx%lld: value (%lld, %lld) moved", FORMAT, (long long)rows, (long long)cols,
                   (long long)r, (long long)c);
}

static uint32_t rng = 12345;
static uint32_t next_u32() { return rng = rng * 1664525u + 1013904223u; }
static float next_x(float scale) { return scale * ((float)(next_u32() >> 8) / 8388608.0f - 1.0f); }

static void check_planes() {
    const float scales[] = {1.0f, 3.0e-3f, 7.5e4f, 1.0e-30f};
    for (int trial = 0; trial < 4000; trial++) {
        float x[8];
        for (int j = 0; j < 8; j++) x[j] = next_x(scales[trial % 4]) * (j == trial % 8 ? 1.0f : (float)(next_u32() % 3));
        if (trial % 97 == 0) x[trial % 8] = 0.0f;
        int d[3][8], sum;
        float e;
        quantize_x8(x, d, e, sum);
        int total = 0;
        for (int j = 0; j < 8; j++) {
            const int v = d[0][j] * 65536 + d[1][j] * 256 + d[2][j];
            total += v;
            EXPECT(std::abs(d[0][j]) <= 65 && d[1][j] >= -128 && d[1][j] <= 127 && d[2][j] >= -128 && d[2][j] <= 127,
                   "digits of %g out of range: %d %d %d", x[j], d[0][j], d[1][j], d[2][j]);
            EXPECT(std::fabs((double)v * e - x[j]) <= 0.5 * e, "x %g came back as %g", x[j], (double)v * e);
        }
        EXPECT(total == sum, "the planes' sum %d is not the sum of v %d", sum, total);
        float4 q8[2], q4[2];
        planes_of8<COLI_FMT_Q8>(x, q8);
        planes_of8<COLI_FMT_Q4>(x, q4);
        const uint32_t w8[2] = {next_u32(), next_u32()}, w4 = next_u32();
        long long want4 = 0;
        for (int j = 0; j < 8; j++) {
            const int v = d[0][j] * 65536 + d[1][j] * 256 + d[2][j];
            want4 += (long long)((int)(w4 >> (4 * j) & 15) - 8) * v;
        }
        EXPECT(word_dot<COLI_FMT_Q4>(w4, q4) == want4, "int4 word %08x: dot %d, want %lld", w4,
               word_dot<COLI_FMT_Q4>(w4, q4), want4);
        for (int h = 0; h < 2; h++) {
            long long want8 = 0;
            for (int j = 0; j < 4; j++) {
                const int v = d[0][4 * h + j] * 65536 + d[1][4 * h + j] * 256 + d[2][4 * h + j];
                want8 += (long long)(signed char)(w8[h] >> (8 * j)) * v;
            }
            EXPECT(word_dot<COLI_FMT_Q8>(w8[h], &q8[h]) == want8, "int8 word %08x: dot %d, want %lld", w8[h],
                   word_dot<COLI_FMT_Q8>(w8[h], &q8[h]), want8);
        }
    }
    float bad[8] = {1.0f, NAN, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int d[3][8], sum;
    float e;
    quantize_x8(bad, d, e, sum);
    EXPECT(std::isnan(e), "a NaN in x must make the sums NaN");
}

int main() {
    check_planes();
    for (int64_t pieces = 1; pieces <= 200; pieces++) {
        const int64_t words = pieces * 4;
        std::vector<int> seen((size_t)words, 0);
        for (int64_t wn = 0; wn < words; wn++) seen[(size_t)interleaved_word(wn, words)]++;
        for (int64_t i = 0; i < words; i++) EXPECT(seen[(size_t)i] == 1, "%lld pieces: word %lld stored %d times",
                                                   (long long)pieces, (long long)i, seen[(size_t)i]);
        for (int64_t start = 0; start < pieces; start += 32) {
            const int64_t nb = pieces - start < 32 ? pieces - start : 32;
            for (int m = 0; m < 4; m++)
                for (int64_t lane = 0; lane < nb; lane++)
                    EXPECT(interleaved_word(start * 4 + m * nb + lane, words) == (start + lane) * 4 + m,
                           "%lld pieces: lane %lld word %d of the run at %lld is misplaced", (long long)pieces,
                           (long long)lane, m, (long long)start);
        }
    }
    check_values<COLI_FMT_Q8>(3, 16 * 45, 1);  /* a run of 32 pieces and one of 13 */
    check_values<COLI_FMT_Q8>(2, 16, 2);       /* one piece */
    check_values<COLI_FMT_Q4>(3, 32 * 70, 3);  /* two runs of 32 and one of 6 */
    check_values<COLI_FMT_Q4>(1, 32 * 32, 4);  /* exactly one run */
    EXPECT(interleaves(COLI_FMT_Q8, 48, 0) && !interleaves(COLI_FMT_Q8, 40, 0), "int8 rows: whole pieces only");
    EXPECT(interleaves(COLI_FMT_Q4, 96, 48) && !interleaves(COLI_FMT_Q4, 96, 6) && !interleaves(COLI_FMT_Q4, 80, 16),
           "int4 rows: whole pieces, groups of whole words");
    EXPECT(!interleaves(COLI_FMT_F32, 128, 0), "f32 rows keep the ABI's order");
    printf("%s\n", failures ? "layout check FAILED" : "layout check passed");
    return failures != 0;
}
