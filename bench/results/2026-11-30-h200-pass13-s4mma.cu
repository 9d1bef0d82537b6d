// s4 / s8 mma on sm_90: fragment layout check against the CPU, and throughput.
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)

__device__ inline void mma_s4_k32(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s4.s4.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]) : "r"(a0), "r"(a1), "r"(b0));
}
__device__ inline void mma_s4_k64(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ inline void mma_s8_k32(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// layout check: A 16x32 s4 from a[m][k], B 32x8 from b[k][n], per the PTX ISA fragment tables
__global__ void check_k32(const int8_t *A, const int8_t *B, int *C) {
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    uint32_t a0 = 0, a1 = 0, b0 = 0;
    for (int i = 0; i < 8; i++) {
        a0 |= (uint32_t)(A[g * 32 + t * 8 + i] & 15) << (4 * i);
        a1 |= (uint32_t)(A[(g + 8) * 32 + t * 8 + i] & 15) << (4 * i);
        b0 |= (uint32_t)(B[(t * 8 + i) * 8 + g] & 15) << (4 * i);
    }
    int d[4] = {0, 0, 0, 0};
    mma_s4_k32(d, a0, a1, b0);
    C[g * 8 + 2 * t] = d[0], C[g * 8 + 2 * t + 1] = d[1], C[(g + 8) * 8 + 2 * t] = d[2], C[(g + 8) * 8 + 2 * t + 1] = d[3];
}

template <int KIND>
__global__ void tput(int iters, int *out) {
    const int lane = threadIdx.x;
    uint32_t a[4] = {lane * 0x11111111u, lane * 0x01010101u, 0x12345678u ^ lane, 0x9abcdef0u ^ lane}, b[2] = {0x13579bdfu ^ lane, lane};
    int d[8][4] = {};
    for (int it = 0; it < iters; it++) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (KIND == 0) mma_s4_k32(d[j], a[0], a[1], b[0]);
            else if (KIND == 1) mma_s4_k64(d[j], a[0], a[1], a[2], a[3], b[0], b[1]);
            else mma_s8_k32(d[j], a[0], a[1], a[2], a[3], b[0], b[1]);
        }
    }
    int s = 0;
    for (int j = 0; j < 8; j++) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
    if (s == 0x7fffffff) out[0] = s;
}

int main() {
    std::vector<int8_t> A(16 * 32), B(32 * 8);
    srand(1);
    for (auto &v : A) v = (int8_t)(rand() % 16 - 8);
    for (auto &v : B) v = (int8_t)(rand() % 16 - 8);
    int8_t *dA, *dB; int *dC;
    CK(cudaMalloc(&dA, A.size())); CK(cudaMalloc(&dB, B.size())); CK(cudaMalloc(&dC, 16 * 8 * 4));
    CK(cudaMemcpy(dA, A.data(), A.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, B.data(), B.size(), cudaMemcpyHostToDevice));
    check_k32<<<1, 32>>>(dA, dB, dC);
    CK(cudaDeviceSynchronize());
    std::vector<int> C(128);
    CK(cudaMemcpy(C.data(), dC, 512, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int m = 0; m < 16; m++) for (int n = 0; n < 8; n++) {
        int s = 0; for (int k = 0; k < 32; k++) s += A[m * 32 + k] * B[k * 8 + n];
        if (s != C[m * 8 + n]) bad++;
    }
    printf("s4 m16n8k32 layout check: %d of 128 wrong\n", bad);
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const char *names[] = {"s4 m16n8k32", "s4 m16n8k64", "s8 m16n8k32"};
    for (int kind = 0; kind < 3; kind++)
        for (int warps = 4; warps <= 16; warps *= 2) {
            const int iters = 4096;
            cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
            auto go = [&]() { if (kind == 0) tput<0><<<sms, warps * 32>>>(iters, dC); else if (kind == 1) tput<1><<<sms, warps * 32>>>(iters, dC); else tput<2><<<sms, warps * 32>>>(iters, dC); };
            go(); CK(cudaDeviceSynchronize());
            cudaEventRecord(e0); go(); cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
            float ms; cudaEventElapsedTime(&ms, e0, e1);
            const double per_sm_us = (double)warps * iters * 8 / (ms * 1e3);
            printf("%s warps/SM %2d: %.0f mma per us per SM (%.2f cycles each at 1.98 GHz)\n", names[kind], warps, per_sm_us, 1980.0 / per_sm_us);
        }
    return 0;
}
