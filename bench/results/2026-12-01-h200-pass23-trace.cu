/* Twenty-third pass: timelines of chained int4 4096 x 4096 calls. Copy the repo's kernels and engine to T and
 * add the stamps there, then build from the repo root:
 *   the pick (decode_mma_kernel T4 R2): python3 2026-12-01-h200-pass23-add_trace_mma.py T/kernels/gpu_decode_mma.cuh
 *   decode_paced_kernel (-DPACED): patch -p1 < 2026-12-01-h200-pass23-paced.patch in T, then
 *     python3 2026-12-01-h200-pass23-add_trace.py T/kernels/gpu_decode_tiled.cuh
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -IT -Ibuild/gen -IT/engine [-DPACED] \
 *     bench/results/2026-12-01-h200-pass23-trace.cu -o /tmp/t && /tmp/t
 * Prints, per call, min/median/max over blocks of each stamp (us from the end of the call before: its last
 * block's y), as the stamping script names them. */
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
#ifdef PACED
#define TRACE dpaced_trace
#define CALLS dpaced_calls
#define STAMPS 8
#define LAST 6 /* y */
#else
#define TRACE dmma_trace
#define CALLS dmma_calls
#define STAMPS 10
#define LAST 8
#endif

static void run(const char *name, int blocks, const std::function<void(int, cudaStream_t)> &launch) {
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int n = 100;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < n; i++) launch(i, st);
    CHECK(cudaStreamEndCapture(st, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < 3; r++) CHECK(cudaGraphLaunch(exec, st));
    CHECK(cudaStreamSynchronize(st));
    unsigned zero[160] = {};
    CHECK(cudaMemcpyToSymbol(CALLS, zero, sizeof zero));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    cudaEventRecord(e0, st);
    CHECK(cudaGraphLaunch(exec, st));
    cudaEventRecord(e1, st);
    CHECK(cudaEventSynchronize(e1));
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    static unsigned long long tr[160][160][STAMPS];
    CHECK(cudaMemcpyFromSymbol(tr, TRACE, sizeof tr));
    printf("%s: %.2f us a call (blocks %d)\n", name, ms * 1e3 / n, blocks);
    for (int c = 40; c < 46; c++) {
        unsigned long long base = 0;
        for (int b = 0; b < blocks; b++) base = std::max(base, tr[c - 1][b][LAST]);
        std::vector<double> v[STAMPS];
        for (int b = 0; b < blocks; b++)
            for (int k = 0; k < STAMPS; k++) v[k].push_back((double)(long long)(tr[c][b][k] - base) * 1e-3);
        printf("call %d:", c);
        for (int k = 0; k < STAMPS; k++) {
            std::sort(v[k].begin(), v[k].end());
            printf("  s%d %.2f/%.2f/%.2f", k, v[k][0], v[k][v[k].size() / 2], v[k].back());
        }
        printf("\n");
    }
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaStreamDestroy(st));
}

int main() {
    CHECK(coli_backend_init(0) == COLI_OK ? cudaSuccess : cudaErrorUnknown);
    const int64_t rows = 4096, cols = 4096;
    const size_t qb = rows * cols / 2, sb = rows * cols / 32 * 4;
    const int copies = (int)((size_t)(512u << 20) / (qb + sb)) + 2;
    std::vector<coli_weight> ws(copies);
    for (auto &w : ws) {
        memset(&w, 0, sizeof w);
        w.format = COLI_FMT_Q4, w.rows = rows, w.cols = cols, w.group = 32;
#ifdef PACED
        w.layout = TILE_LAYOUT;
#else
        w.layout = MMA_LAYOUT;
#endif
        CHECK(cudaMalloc(&w.q, qb));
        CHECK(cudaMalloc((void **)&w.scale, sb));
        CHECK(cudaMemset(w.q, 0x35, qb));
        CHECK(cudaMemset(w.scale, 0, sb));
    }
    float *x, *y, *planes;
    CHECK(cudaMalloc((void **)&planes, cols * 16));
    CHECK(cudaMalloc((void **)&x, cols * 4));
    CHECK(cudaMalloc((void **)&y, rows * 4));
    CHECK(cudaMemset(x, 0, cols * 4));
    auto w = [&](int i) { return &ws[i % copies]; };
#ifdef PACED
    run("paced W16 C2 H2 K1", 128, [&](int i, cudaStream_t st) { launch_decode_paced<16, 2, 2, 1, 1>(w(i), x, y, st); });
    run("paced W16 C2 H4 K1", 128, [&](int i, cudaStream_t st) { launch_decode_paced<16, 2, 4, 1, 1>(w(i), x, y, st); });
    run("paced W16 C2 H2 K2", 128, [&](int i, cudaStream_t st) { launch_decode_paced<16, 2, 2, 2, 1>(w(i), x, y, st); });
    run("paced W16 C2 H4 K8 (all at once)", 128,
        [&](int i, cudaStream_t st) { launch_decode_paced<16, 2, 4, 8, 1>(w(i), x, y, st); });
#else
    for (const char *name : {"pick (decode_mma_kernel T4 R2)", "pick again"})
        run(name, 64, [&](int i, cudaStream_t st) { (void)launch_matmul(w(i), x, 1, y, st, planes); });
#endif
    return 0;
}
