/* Twenty-third pass: int4 stored tile by tile (and, for the last three shapes, in the mma layout) at 2 to 64 tokens, the pick (mma_kernel up to 16, gemm_kernel
 * from 64), us a call (calls chained as the bench chains them: a graph of 100 launches, weights rotating over
 * copies past 512 MiB, median of 7 replays). Built against two trees to compare mma_kernel's copies, T = a
 * copy of the repo's kernels and engine with or without the change:
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -IT -Ibuild/gen -IT/engine \
 *     bench/results/2026-12-01-h200-pass23-tile_tokens.cu -o /tmp/tt && /tmp/tt */
#include "kernels/backend_gpu.cu"
#include "probe_common.cuh"

int main() {
    CHECK(coli_backend_init(0) == COLI_OK ? cudaSuccess : cudaErrorUnknown);
    const int64_t shapes[][3] = {{2048, 14336, TILE_LAYOUT}, {4096, 14336, TILE_LAYOUT}, {6144, 14336, TILE_LAYOUT},
                                 {8192, 8192, TILE_LAYOUT},   {8192, 12288, TILE_LAYOUT}, {8192, 14336, TILE_LAYOUT},
                                 {4096, 4096, MMA_LAYOUT},    {14336, 4096, MMA_LAYOUT},  {4096, 14336, MMA_LAYOUT}};
    for (const auto &sh : shapes) {
        const int64_t rows = sh[0], cols = sh[1];
        const int32_t layout = (int32_t)sh[2];
        std::vector<coli_weight> ws = int4_copies(rows, cols, layout);
        const int copies = (int)ws.size();
        const probe_io io(rows, cols, 64, 64 * cols * 4);
        float *x = io.x, *y = io.y, *planes = io.planes;
        printf("%lldx%lld %s", (long long)rows, (long long)cols, layout == TILE_LAYOUT ? "tile" : "mma");
        for (int64_t s : {2, 4, 8, 16, 64}) {
            const double us = time_calls([&](int i, cudaStream_t st) { (void)launch_matmul(&ws[i % copies], x, s, y, st, planes); });
            CHECK(cudaGetLastError());
            printf("  S=%lld %.2f", (long long)s, us);
        }
        printf("\n");
        free_copies(ws);
    }
    return 0;
}
