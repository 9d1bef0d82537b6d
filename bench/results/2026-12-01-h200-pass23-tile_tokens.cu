/* Twenty-third pass: int4 stored tile by tile (and, for the last three shapes, in the mma layout) at 2 to 64 tokens, the pick (mma_kernel up to 16, gemm_kernel
 * from 64), us a call (calls chained as the bench chains them: a graph of 100 launches, weights rotating over
 * copies past 512 MiB, median of 7 replays). Built against two trees to compare mma_kernel's copies, T = a
 * copy of the repo's kernels and engine with or without the change:
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -IT -Ibuild/gen -IT/engine \
 *     bench/results/2026-12-01-h200-pass23-tile_tokens.cu -o /tmp/tt && /tmp/tt */
#include "kernels/backend_gpu.cu"
#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>
#define CHECK(c)                                                                      \
    do {                                                                              \
        cudaError_t e_ = (c);                                                         \
        if (e_ != cudaSuccess) {                                                      \
            printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));         \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

__global__ void fill(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t v = ((uint32_t)i + seed) * 2654435761u;
        v ^= v >> 15;
        p[i] = (uint8_t)v;
    }
}

static double time_calls(const std::function<void(int, cudaStream_t)> &launch) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaStream_t cap;
    CHECK(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
    CHECK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 100; i++) launch(i, cap);
    CHECK(cudaStreamEndCapture(cap, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    std::vector<double> v;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    for (int r = 0; r < 9; r++) {
        cudaEventRecord(e0, cap);
        CHECK(cudaGraphLaunch(exec, cap));
        cudaEventRecord(e1, cap);
        CHECK(cudaEventSynchronize(e1));
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (r >= 2) v.push_back(ms * 1e3 / 100);
    }
    std::sort(v.begin(), v.end());
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaStreamDestroy(cap));
    return v[v.size() / 2];
}

int main() {
    CHECK(coli_backend_init(0) == COLI_OK ? cudaSuccess : cudaErrorUnknown);
    const int64_t shapes[][3] = {{2048, 14336, TILE_LAYOUT}, {4096, 14336, TILE_LAYOUT}, {6144, 14336, TILE_LAYOUT},
                                 {8192, 8192, TILE_LAYOUT},   {8192, 12288, TILE_LAYOUT}, {8192, 14336, TILE_LAYOUT},
                                 {4096, 4096, MMA_LAYOUT},    {14336, 4096, MMA_LAYOUT},  {4096, 14336, MMA_LAYOUT}};
    for (const auto &sh : shapes) {
        const int64_t rows = sh[0], cols = sh[1];
        const int32_t layout = (int32_t)sh[2];
        const size_t qb = rows * cols / 2, sb = rows * cols / 32 * 4;
        const int copies = (int)((size_t)(512u << 20) / (qb + sb)) + 2;
        std::vector<coli_weight> ws(copies);
        for (auto &w : ws) {
            memset(&w, 0, sizeof w);
            w.format = COLI_FMT_Q4, w.rows = rows, w.cols = cols, w.group = 32, w.layout = layout;
            CHECK(cudaMalloc(&w.q, qb));
            CHECK(cudaMalloc((void **)&w.scale, sb));
            fill<<<512, 256>>>((uint8_t *)w.q, qb, 3);
            CHECK(cudaMemset(w.scale, 0, sb));
        }
        float *x, *y, *planes;
        CHECK(cudaMalloc((void **)&x, 64 * cols * 4));
        CHECK(cudaMalloc((void **)&y, 64 * rows * 4));
        CHECK(cudaMalloc((void **)&planes, 64 * cols * 4));
        CHECK(cudaMemset(x, 0, 64 * cols * 4));
        printf("%lldx%lld %s", (long long)rows, (long long)cols, layout == TILE_LAYOUT ? "tile" : "mma");
        for (int64_t s : {2, 4, 8, 16, 64}) {
            const double us = time_calls([&](int i, cudaStream_t st) { (void)launch_matmul(&ws[i % copies], x, s, y, st, planes); });
            CHECK(cudaGetLastError());
            printf("  S=%lld %.2f", (long long)s, us);
        }
        printf("\n");
        for (auto &w : ws) cudaFree(w.q), cudaFree(w.scale);
        cudaFree(x), cudaFree(y), cudaFree(planes);
    }
    return 0;
}
