/* What the one-off probes under bench/results (twenty-first pass on) share: a status check, random bytes,
 * int4 weights in enough copies that chained calls stream from HBM (past 512 MiB, as the bench rotates
 * them), and calls timed as the bench chains them (a graph of 100 launches, median of 7 replays after 2).
 * Include it after kernels/backend_gpu.cu (it uses coli_weight). */
#pragma once
#include "../gpu_timing.cuh" /* CHECK, launch_fn, capture_graph, replay_us, graph_median_us */
#include <cstring>

__global__ void fill_bytes(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t v = ((uint32_t)i + seed) * 2654435761u;
        v ^= v >> 15;
        p[i] = (uint8_t)v;
    }
}

static const int probe_calls = 100; /* launches in a graph */

/* us a call, the median of 7 replays after 2 to warm up, on a stream of its own. */
static double time_calls(const launch_fn &launch) {
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const double us = graph_median_us(st, probe_calls, 2, 7, launch);
    CHECK(cudaStreamDestroy(st));
    return us;
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
    probe_io(const probe_io &) = delete; /* it owns the buffers */
    probe_io &operator=(const probe_io &) = delete;
};

static void free_copies(std::vector<coli_weight> &ws) {
    for (auto &w : ws) cudaFree(w.q), cudaFree(w.scale);
}
