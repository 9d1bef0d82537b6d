/* What the GPU benchmarks share: a status check, and calls timed as a CUDA graph of
 * launches replayed (the median replay counts). Included by bench/gpu_matmul_bench.cu. */
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CHECK(call)                                                                   \
    do {                                                                              \
        cudaError_t e_ = (call);                                                      \
        if (e_ != cudaSuccess) {                                                      \
            fprintf(stderr, "line %d: %s: %s\n", __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* launch(i, stream) makes call i on the stream it is given */
using launch_fn = std::function<void(int, cudaStream_t)>;

/* The n launches captured from stream st as one graph. */
static cudaGraphExec_t capture_graph(cudaStream_t st, int n, const launch_fn &launch) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < n; i++) launch(i, st);
    CHECK(cudaStreamEndCapture(st, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphDestroy(graph));
    return exec;
}

/* Milliseconds the work queued on st by `work` takes, between two events. */
static double elapsed_ms(cudaStream_t st, const std::function<void()> &work) {
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    CHECK(cudaEventRecord(e0, st));
    work();
    CHECK(cudaEventRecord(e1, st));
    CHECK(cudaEventSynchronize(e1));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms;
}

/* Microseconds per launch in one replay of a graph of n launches. */
static double replay_us(cudaGraphExec_t exec, cudaStream_t st, int n) {
    return elapsed_ms(st, [&] { CHECK(cudaGraphLaunch(exec, st)); }) * 1e3 / n;
}

/* Median microseconds per launch: n launches captured in a graph on st, replayed
 * `warmups` times untimed, then `reps` times. */
static double graph_median_us(cudaStream_t st, int n, int warmups, int reps, const launch_fn &launch) {
    const cudaGraphExec_t exec = capture_graph(st, n, launch);
    for (int r = 0; r < warmups; r++) (void)replay_us(exec, st, n);
    std::vector<double> us;
    for (int r = 0; r < reps; r++) us.push_back(replay_us(exec, st, n));
    CHECK(cudaGetLastError());
    CHECK(cudaGraphExecDestroy(exec));
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
}
