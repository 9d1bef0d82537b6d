/* The GPU backend's interleaved weight layout, checked on the host (nvcc, no
 * GPU needed): the reordering is a permutation of each row's words; every value
 * read back through the layout is the value the ABI's order holds; and word m of
 * lane i in a run is where gemv_kernel looks for it. Exit 0 when all hold. */
#include "gpu_compat.h"
#include "backend_common.h"
#include "gpu_matmul.cuh"

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

int main() {
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
