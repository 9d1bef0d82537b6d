/* Twenty-third pass: how fast does one SM take int8 products at decode_mma_kernel's shape? 16 warps a
 * block, a block an SM (132), each warp ILP independent chains of `mma.sync.m16n8k32.s32.u8.s8` (the
 * kernels' form), against `wgmma.mma_async.m64n8k32.s32.u8.s8` with A from registers (a warpgroup's four
 * warps, 16 rows each, one B of 8 columns in shared memory). Prints the SM's clocks per 16 x 8 x 32 product.
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a bench/results/2026-12-01-h200-pass23-tensor_probe.cu -o /tmp/tp && /tmp/tp */
#include <cstdio>
#include <cstdint>

template <int ILP> __global__ void __launch_bounds__(512, 1) mma_probe(int iters, int *out, long long *clk) {
    uint32_t a[4] = {threadIdx.x, threadIdx.x * 3u, threadIdx.x * 5u, threadIdx.x * 7u}, b[2] = {threadIdx.x * 11u, 13u};
    int d[ILP][4] = {};
    __syncthreads();
    const long long t0 = clock64();
    for (int i = 0; i < iters; i++)
#pragma unroll
        for (int j = 0; j < ILP; j++)
            asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                         : "+r"(d[j][0]), "+r"(d[j][1]), "+r"(d[j][2]), "+r"(d[j][3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    __syncthreads();
    const long long t1 = clock64();
    int s = 0;
    for (int j = 0; j < ILP; j++) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (threadIdx.x == 0) clk[blockIdx.x] = t1 - t0;
}

__device__ inline uint64_t desc_of(const void *p, uint32_t lbo, uint32_t sbo) {
    const uint64_t addr = (uint32_t)__cvta_generic_to_shared(p);
    return ((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) | ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32);
}

template <int ILP> __global__ void __launch_bounds__(512, 1) wgmma_probe(int iters, int *out, long long *clk) {
    __shared__ __align__(128) uint8_t bsh[4][256];
    for (int i = threadIdx.x; i < 1024; i += blockDim.x) (&bsh[0][0])[i] = (uint8_t)(i * 7);
    __syncthreads();
    uint32_t a[4] = {threadIdx.x, threadIdx.x * 3u, threadIdx.x * 5u, threadIdx.x * 7u};
    const uint64_t bd = desc_of(bsh[threadIdx.x / 128], 128, 256);
    int d[ILP][4] = {};
    const long long t0 = clock64();
    for (int i = 0; i < iters; i++) {
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int j = 0; j < ILP; j++)
            asm volatile("wgmma.mma_async.sync.aligned.m64n8k32.s32.u8.s8 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, 1;"
                         : "+r"(d[j][0]), "+r"(d[j][1]), "+r"(d[j][2]), "+r"(d[j][3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bd));
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    }
    __syncthreads();
    const long long t1 = clock64();
    int s = 0;
    for (int j = 0; j < ILP; j++) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (threadIdx.x == 0) clk[blockIdx.x] = t1 - t0;
}

template <typename K> static void run(const char *name, K kernel, int ilp, int per_warp_products) {
    int *out;
    long long *clk, h[132];
    cudaMalloc(&out, 132 * 512 * 4), cudaMalloc(&clk, 132 * 8);
    const int iters = 256;
    kernel<<<132, 512>>>(iters, out, clk);
    kernel<<<132, 512>>>(iters, out, clk);
    cudaError_t e = cudaDeviceSynchronize();
    cudaMemcpy(h, clk, sizeof h, cudaMemcpyDeviceToHost);
    long long m = 0;
    for (long long c : h) m = c > m ? c : m;
    /* 16 x 8 x 32 products a block: 16 warps x iters x ILP x per_warp_products */
    const double n = 16.0 * iters * ilp * per_warp_products;
    printf("%-28s ILP %d: %s, %.2f clocks a block per m16n8k32 (%lld clocks)\n", name, ilp, cudaGetErrorString(e), (double)m / n, m);
    cudaFree(out), cudaFree(clk);
}

int main() {
    run("mma.sync m16n8k32 u8.s8", mma_probe<1>, 1, 1);
    run("mma.sync m16n8k32 u8.s8", mma_probe<2>, 2, 1);
    run("mma.sync m16n8k32 u8.s8", mma_probe<4>, 4, 1);
    run("mma.sync m16n8k32 u8.s8", mma_probe<8>, 8, 1);
    run("wgmma m64n8k32 u8.s8 A regs", wgmma_probe<1>, 1, 1);
    run("wgmma m64n8k32 u8.s8 A regs", wgmma_probe<2>, 2, 1);
    run("wgmma m64n8k32 u8.s8 A regs", wgmma_probe<4>, 4, 1);
    run("wgmma m64n8k32 u8.s8 A regs", wgmma_probe<8>, 8, 1);
    return 0;
}
