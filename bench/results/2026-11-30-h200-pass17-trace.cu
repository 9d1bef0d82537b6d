/* Timeline of chained decode_mma_kernel calls (seventeenth pass, runs 2-3): apply
 * 2026-11-30-h200-pass17-experiments.patch on e48070c, then from the repo root
 * nvcc -O3 -std=c++17 -DDMMA_TRACE -gencode arch=compute_90,code=sm_90 -Ibuild/gen -Ikernels -Iengine
 *   bench/results/2026-11-30-h200-pass17-trace.cu -o /tmp/t && /tmp/t
 * Prints, per call, the min/median/max over blocks of globaltimer stamps (us): s0 start, s1 past the
 * wait, s2 x in, s3 digits in the patch, s4 sums done, s5 y written. */
#include "../../kernels/backend_gpu.cu"
#include <algorithm>
#include <cstdio>
#include <vector>
#define CHECK(c) do { cudaError_t e_ = (c); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1);} } while (0)
__global__ void fillb(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t v = ((uint32_t)i + seed) * 2654435761u; v ^= v >> 15; p[i] = (uint8_t)v; }
}
template <int NW, int CH, int RT, int RR, int MINB, bool LATE, bool BAL> void run(const char *name, int64_t rows) {
    cudaStream_t st; CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int64_t cols = 4096; const int copies = 40;
    std::vector<coli_weight> ws(copies);
    for (auto &w : ws) { memset(&w, 0, sizeof w); w.format = COLI_FMT_Q8; w.rows = rows; w.cols = cols;
        CHECK(cudaMalloc(&w.q, rows * cols)); CHECK(cudaMalloc((void **)&w.scale, rows * 4));
        fillb<<<512, 256, 0, st>>>((uint8_t *)w.q, rows * cols, 3); CHECK(cudaMemsetAsync(w.scale, 0, rows * 4, st)); }
    float *x, *y; CHECK(cudaMalloc((void **)&x, cols * 4)); CHECK(cudaMalloc((void **)&y, rows * 4));
    CHECK(cudaMemsetAsync(x, 0, cols * 4, st));
    cudaGraph_t graph; cudaGraphExec_t exec;
    const int n = 100;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < n; i++) launch_decode_mma<COLI_FMT_Q8, NW, CH, RT, RR, MINB, LATE, BAL>(&ws[i % copies], x, y, st);
    CHECK(cudaStreamEndCapture(st, &graph)); CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < 3; r++) CHECK(cudaGraphLaunch(exec, st));
    unsigned zero[160] = {}; CHECK(cudaStreamSynchronize(st));
    CHECK(cudaMemcpyToSymbol(dmma_calls, zero, sizeof zero));
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    cudaEventRecord(e0, st); CHECK(cudaGraphLaunch(exec, st)); cudaEventRecord(e1, st); CHECK(cudaEventSynchronize(e1));
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    static unsigned long long tr[64][160][6]; CHECK(cudaMemcpyFromSymbol(tr, dmma_trace, sizeof tr));
    int blocks = (int)((rows + RT * 16 - 1) / (RT * 16)); if (BAL) blocks = (blocks + 131) / 132 * 132;
    printf("%s rows %lld: %.2f us a call\n", name, (long long)rows, ms * 1e3 / n);
    /* calls 40..47 (call index per block = its 40th start), times relative to call 40's first start */
    unsigned long long base = ~0ull;
    for (int b = 0; b < blocks; b++) base = std::min(base, tr[40][b][0]);
    for (int c = 40; c < 48; c++) {
        std::vector<double> v[6];
        for (int b = 0; b < blocks; b++) for (int k = 0; k < 6; k++) v[k].push_back((tr[c][b][k] - base) * 1e-3);
        printf("call %d:", c);
        for (int k = 0; k < 6; k++) { std::sort(v[k].begin(), v[k].end());
            printf("  s%d %.2f/%.2f/%.2f", k, v[k][0], v[k][v[k].size() / 2], v[k].back()); }
        printf("\n");
    }
}
int main() {
    run<16, 4, 2, 1, 2, false, true>("W16 C4 T2 R1 M2 B1", 4096);
    run<16, 4, 2, 1, 2, true, true>("W16 C4 T2 R1 M2 L1 B1", 4096);
    run<16, 4, 2, 0, 1, true, true>("W16 C4 T2 R0 M1 L1 B1", 4096);
    return 0;
}
