/* What the one-off probes under bench/results (twenty-first pass on) share: a status check, random bytes,
 * int4 weights in enough copies that chained calls stream from HBM (past 512 MiB, as the bench rotates
 * them), and calls timed as the bench chains them (a graph of 100 launches, median of 7 replays after 2).
 * Include it after kernels/backend_gpu.cu (it uses coli_weight). */
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#define CHECK(c)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (c);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));                     \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

__global__ void fill_bytes(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t v = ((uint32_t)i + seed) * 2654435761u;
        v ^= v >> 15;
        p[i] = (uint8_t)v;
    }
}

using launch_fn = std::function<void(int, cudaStream_t)>;
static const int probe_calls = 100; /* launches in a graph */

/* The n launches of `launch` (call i on stream st) captured from st as one graph. */
static cudaGraphExec_t capture_calls(const launch_fn &launch, cudaStream_t st) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < probe_calls; i++) launch(i, st);
    CHECK(cudaStreamEndCapture(st, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphDestroy(graph));
    return exec;
}

/* us a call in one replay of the graph. */
static double replay_us(cudaGraphExec_t exec, cudaStream_t st) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    cudaEventRecord(e0, st);
    CHECK(cudaGraphLaunch(exec, st));
    cudaEventRecord(e1, st);
    CHECK(cudaEventSynchronize(e1));
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return ms * 1e3 / probe_calls;
}

/* us a call, the median of 7 replays after 2 to warm up. */
static double time_calls(const launch_fn &launch) {
    cudaStream_t cap;
    CHECK(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
    const cudaGraphExec_t exec = capture_calls(launch, cap);
    std::vector<double> v;
    for (int r = 0; r < 9; r++) {
        const double us = replay_us(exec, cap);
        if (r >= 2) v.push_back(us);
    }
    std::sort(v.begin(), v.end());
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaStreamDestroy(cap));
    return v[v.size() / 2];
}

/* Copies of a rows x cols int4 weight (groups of 32, scales 0), past 512 MiB in all: random bytes, or
 * every byte `byte` when it is 0-255. */
static std::vector<coli_weight> int4_copies(int64_t rows, int64_t cols, int32_t layout, int byte = -1) {
    const size_t qb = rows * cols / 2, sb = rows * cols / 32 * 4;
    std::vector<coli_weight> ws((size_t)(512u << 20) / (qb + sb) + 2);
    for (auto &w : ws) {
        memset(&w, 0, sizeof w);
        w.format = COLI_FMT_Q4, w.rows = rows, w.cols = cols, w.group = 32, w.layout = layout;
        CHECK(cudaMalloc(&w.q, qb));
        CHECK(cudaMalloc((void **)&w.scale, sb));
        if (byte < 0)
            fill_bytes<<<512, 256>>>((uint8_t *)w.q, qb, 3);
        else
            CHECK(cudaMemset(w.q, byte, qb));
        CHECK(cudaMemset(w.scale, 0, sb));
    }
    return ws;
}

/* A call's activations (zero), outputs and the planes launch_matmul may use, for up to `tokens` tokens. */
struct probe_io {
    float *x, *y, *planes;
    probe_io(int64_t rows, int64_t cols, int64_t tokens, size_t planes_bytes) {
        CHECK(cudaMalloc((void **)&x, tokens * cols * 4));
        CHECK(cudaMalloc((void **)&y, tokens * rows * 4));
        CHECK(cudaMalloc((void **)&planes, planes_bytes));
        CHECK(cudaMemset(x, 0, tokens * cols * 4));
    }
    ~probe_io() { cudaFree(x), cudaFree(y), cudaFree(planes); }
};

static void free_copies(std::vector<coli_weight> &ws) {
    for (auto &w : ws) cudaFree(w.q), cudaFree(w.scale);
}
