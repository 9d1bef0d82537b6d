/* Twenty-third pass: timelines of chained int4 4096 x 4096 calls. Copy the repo's kernels and engine to T and
 * add the stamps there, then build from the repo root:
 *   the pick (decode_mma_kernel T4 R2): python3 2026-12-01-h200-pass23-add_trace.py mma T/kernels/gpu_decode_mma.cuh
 *   decode_paced_kernel (-DPACED): patch -p1 < 2026-12-01-h200-pass23-paced.patch in T, then
 *     python3 2026-12-01-h200-pass23-add_trace.py paced T/kernels/gpu_decode_tiled.cuh
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -IT -Ibuild/gen -IT/engine [-DPACED] \
 *     bench/results/2026-12-01-h200-pass23-trace.cu -o /tmp/t && /tmp/t
 * Prints, per call, min/median/max over blocks of each stamp (us from the end of the call before: its last
 * block's y), as the stamping script names them. */
#include "kernels/backend_gpu.cu"
#include "probe_common.cuh"
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

static void run(const char *name, int blocks, const launch_fn &launch) {
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const cudaGraphExec_t exec = capture_graph(st, probe_calls, launch);
    for (int r = 0; r < 3; r++) CHECK(cudaGraphLaunch(exec, st));
    CHECK(cudaStreamSynchronize(st));
    unsigned zero[160] = {};
    CHECK(cudaMemcpyToSymbol(CALLS, zero, sizeof zero));
    const double us = replay_us(exec, st, probe_calls);
    static unsigned long long tr[160][160][STAMPS];
    CHECK(cudaMemcpyFromSymbol(tr, TRACE, sizeof tr));
    printf("%s: %.2f us a call (blocks %d)\n", name, us, blocks);
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
#ifdef PACED
    std::vector<coli_weight> ws = int4_copies(rows, cols, TILE_LAYOUT, 0x35);
#else
    std::vector<coli_weight> ws = int4_copies(rows, cols, MMA_LAYOUT, 0x35);
#endif
    const int copies = (int)ws.size();
    const probe_io io(rows, cols, 1, cols * 16);
    float *x = io.x, *y = io.y;
    auto w = [&](int i) { return &ws[i % copies]; };
#ifdef PACED
    run("paced W16 C2 H2 K1", 128, [&](int i, cudaStream_t st) { launch_decode_paced<16, 2, 2, 1, 1>(w(i), x, y, st); });
    run("paced W16 C2 H4 K1", 128, [&](int i, cudaStream_t st) { launch_decode_paced<16, 2, 4, 1, 1>(w(i), x, y, st); });
    run("paced W16 C2 H2 K2", 128, [&](int i, cudaStream_t st) { launch_decode_paced<16, 2, 2, 2, 1>(w(i), x, y, st); });
    run("paced W16 C2 H4 K8 (all at once)", 128,
        [&](int i, cudaStream_t st) { launch_decode_paced<16, 2, 4, 8, 1>(w(i), x, y, st); });
#else
    for (const char *name : {"pick (decode_mma_kernel T4 R2)", "pick again"})
        run(name, 64, [&](int i, cudaStream_t st) { (void)launch_matmul(w(i), x, 1, y, st, io.planes); });
#endif
    return 0;
}
