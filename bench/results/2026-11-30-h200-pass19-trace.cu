/* Timeline of chained int4 decode_mma_kernel calls (nineteenth pass; the eighteenth pass's with more
 * stamps): copy the repo's bench, kernels and engine to a tree T, add the stamps with
 * python3 2026-11-30-h200-pass19-add_trace.py T/kernels/gpu_decode_mma.cuh, copy this file to
 * T/tmp_exp/trace.cu, then from the repo root
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -Ibuild/gen -Iengine T/tmp_exp/trace.cu -o /tmp/t
 * Prints, per call, the min/median/max over blocks of the stamps (us, from the end of the call
 * before: its last block's y): s0 start, s1 before the wait, s2 past it, s3 x's values in, s4 x's
 * digits in, s5 W in, s6 sums, s7 y. */
#include "../kernels/backend_gpu.cu"
#include <algorithm>
#include <cstdio>
#include <vector>
#define CHECK(c) do { cudaError_t e_ = (c); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1);} } while (0)
__global__ void fillb(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t v = ((uint32_t)i + seed) * 2654435761u; v ^= v >> 15; p[i] = (uint8_t)v; }
}
template <int NW, int CH, int RT, int RR, int MINB = 1, bool BULK = false> void run(const char *name, int64_t rows) {
    cudaStream_t st; CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int64_t cols = 4096; const int copies = 60;
    std::vector<coli_weight> ws(copies);
    for (auto &w : ws) { memset(&w, 0, sizeof w); w.format = COLI_FMT_Q4; w.rows = rows; w.cols = cols; w.group = 32; w.layout = MMA_LAYOUT;
        CHECK(cudaMalloc(&w.q, rows * cols / 2)); CHECK(cudaMalloc((void **)&w.scale, rows * cols / 32 * 4));
        fillb<<<512, 256, 0, st>>>((uint8_t *)w.q, rows * cols / 2, 3); CHECK(cudaMemsetAsync(w.scale, 0, rows * cols / 32 * 4, st)); }
    float *x, *y; CHECK(cudaMalloc((void **)&x, cols * 4)); CHECK(cudaMalloc((void **)&y, rows * 4));
    CHECK(cudaMemsetAsync(x, 0, cols * 4, st));
    cudaGraph_t graph; cudaGraphExec_t exec;
    const int n = 100;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < n; i++) launch_decode_mma<COLI_FMT_Q4, NW, CH, RT, RR, MINB, BULK>(&ws[i % copies], x, y, st);
    CHECK(cudaStreamEndCapture(st, &graph)); CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < 3; r++) CHECK(cudaGraphLaunch(exec, st));
    unsigned zero[160] = {}; CHECK(cudaStreamSynchronize(st));
    CHECK(cudaMemcpyToSymbol(dmma_calls, zero, sizeof zero));
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    cudaEventRecord(e0, st); CHECK(cudaGraphLaunch(exec, st)); cudaEventRecord(e1, st); CHECK(cudaEventSynchronize(e1));
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    static unsigned long long tr[64][160][8]; CHECK(cudaMemcpyFromSymbol(tr, dmma_trace, sizeof tr));
    int blocks = (int)((rows + RT * 16 - 1) / (RT * 16));
    printf("%s rows %lld: %.2f us a call (blocks %d)\n", name, (long long)rows, ms * 1e3 / n, blocks);
    for (int c = 40; c < 46; c++) {
        unsigned long long base = 0; /* the call before's end */
        for (int b = 0; b < blocks; b++) base = std::max(base, tr[c - 1][b][7]);
        std::vector<double> v[8];
        for (int b = 0; b < blocks; b++) for (int k = 0; k < 8; k++) v[k].push_back(((long long)(tr[c][b][k] - base)) * 1e-3);
        printf("call %d:", c);
        for (int k = 0; k < 8; k++) { std::sort(v[k].begin(), v[k].end());
            printf("  s%d %.2f/%.2f/%.2f", k, v[k][0], v[k][v[k].size() / 2], v[k].back()); }
        printf("\n");
    }
    CHECK(cudaStreamSynchronize(st));
}
int main() {
#ifdef BULK_AND_TWO
    run<16, 2, 4, 1>("T4 R1", 4096);
    run<16, 2, 4, 0, 1, true>("bulk T4", 4096);
    run<16, 2, 2, 0, 2, true>("bulk T2 M2", 4096);
    run<16, 2, 2, 1, 2>("T2 R1 M2", 4096);
#else
    run<16, 2, 4, 1>("T4 R1", 4096);
    run<16, 2, 4, 0>("T4 R0", 4096);
    run<16, 2, 4, 2>("T4 R2", 4096);
#endif
    return 0;
}
