// How fast can one SM pull a block's W into shared memory? decode_mma_kernel loads
// 160 KB a block before the wait (int4 4096 x 4096, 4 tiles); pass 18's timeline put
// that at about 35 GB/s an SM with cp.async. This probe launches B blocks of 512
// threads (one an SM), each loading PER bytes of its own span, and stamps every
// block's start and end (globaltimer). Modes:
//   0 cp.async 16 B a thread (.cg), as decode_mma_kernel does
//   1 a quarter into registers (__ldcs), the rest cp.async (decode_mma's T4 R1 mix)
//   2 bulk copies of 2 KB (one a row), issued by one thread on one mbarrier
//   3 bulk copies of 32 KB, one thread
//   4 bulk copies of 2 KB issued by the 32 lanes of warp 0
//   5 cp.async as decode_mma_kernel lays W out: rows of 2048 bytes, warp w 128 bytes of
//     each, an instruction 8 rows x 64 bytes (lane g, t: row g, byte 16t of a chunk)
//   6 the same bytes, an instruction 4 rows x 128 bytes (run 13)
// nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 load_probe.cu -o load_probe
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#define CK(x)                                                                                        \
    do {                                                                                             \
        cudaError_t e_ = (x);                                                                        \
        if (e_ != cudaSuccess) {                                                                     \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));               \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

__device__ inline uint64_t gtime() {
    uint64_t t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
__device__ inline uint32_t saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

template <int MODE> __global__ void __launch_bounds__(512, 1) probe(const uint8_t *src, size_t per, uint64_t *stamps, int *sink) {
    extern __shared__ __align__(128) uint8_t sh[];
    __shared__ __align__(8) uint64_t bar;
    const uint8_t *s = src + per * blockIdx.x;
    uint64_t t0 = 0;
    if (threadIdx.x == 0) t0 = gtime();
    int4 regs[4];
    if (MODE == 5 || MODE == 6) { /* per 16 rows: each warp 16 x 128 bytes */
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        for (size_t tile = 0; tile < per / (16 * 2048); tile++)
            for (int j = 0; j < 4; j++) {
                const int row = MODE == 5 ? 8 * (j / 2) + lane / 4 : 4 * j + lane / 8;
                const int at = MODE == 5 ? 64 * (j % 2) + 16 * (lane % 4) : 16 * (lane % 8);
                const size_t o = (tile * 16 + row) * 2048 + 128 * warp + at;
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(saddr(sh + o)), "l"(s + o) : "memory");
            }
        asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
        __syncthreads();
    } else if (MODE <= 1) {
        size_t from = 0;
        if (MODE == 1) {
            for (int k = 0; k < 4; k++) regs[k] = __ldcs((const int4 *)(s + (size_t)(k * 512 + threadIdx.x) * 16));
            from = 4 * 512 * 16;
        }
        for (size_t o = from + threadIdx.x * 16; o < per; o += 512 * 16)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(saddr(sh + o)), "l"(s + o) : "memory");
        asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
        __syncthreads();
    } else {
        if (threadIdx.x == 0) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&bar)) : "memory");
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        __syncthreads();
        const uint32_t piece = MODE == 3 ? 32768 : 2048;
        if (threadIdx.x == 0)
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(&bar)), "r"((uint32_t)per) : "memory");
        __syncwarp();
        const int issuers = MODE == 4 ? 32 : 1;
        if ((int)threadIdx.x < issuers)
            for (size_t o = threadIdx.x * piece; o < per; o += (size_t)issuers * piece) {
                const uint32_t n = (uint32_t)(per - o < piece ? per - o : piece);
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                                 saddr(sh + o)),
                             "l"(s + o), "r"(n), "r"(saddr(&bar))
                             : "memory");
            }
        asm volatile("{\n\t.reg .pred p;\nW_%=:\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n\t@!p bra W_%=;\n}" ::"r"(
                         saddr(&bar))
                     : "memory");
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        stamps[2 * blockIdx.x] = t0, stamps[2 * blockIdx.x + 1] = gtime();
        int acc = sh[per - 1];
        if (MODE == 1) acc += regs[0].x + regs[3].w;
        if (acc == 12345) *sink = acc;
    }
}

template <int MODE> static void run(const uint8_t *buf, size_t span, int blocks, size_t per, uint64_t *dstamps, int *sink) {
    auto k = probe<MODE>;
    CK(cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)per));
    std::vector<double> med, mx, spans, bw;
    std::vector<uint64_t> st(2 * blocks);
    const int reps = 30;
    for (int r = 0; r < reps; r++) {
        const size_t off = (size_t)r * per * blocks % (span - per * blocks); /* never the same bytes twice in L2 */
        k<<<blocks, 512, per>>>(buf + off / 256 * 256, per, dstamps, sink);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(st.data(), dstamps, st.size() * 8, cudaMemcpyDeviceToHost));
        std::vector<double> d(blocks);
        uint64_t lo = ~0ull, hi = 0;
        for (int b = 0; b < blocks; b++) d[b] = (double)(st[2 * b + 1] - st[2 * b]), lo = std::min(lo, st[2 * b]), hi = std::max(hi, st[2 * b + 1]);
        std::sort(d.begin(), d.end());
        if (r < 3) continue; /* warm-up */
        med.push_back(d[blocks / 2]), mx.push_back(d[blocks - 1]), spans.push_back((double)(hi - lo));
        bw.push_back((double)per * blocks / (double)(hi - lo));
    }
    auto m = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
    printf("mode %d blocks %3d per %6zu KB: block median %6.2f us, max %6.2f us, span %6.2f us, %7.1f GB/s total, %6.1f GB/s an SM (median block)\n",
           MODE, blocks, per / 1024, m(med) / 1e3, m(mx) / 1e3, m(spans) / 1e3, m(bw), (double)per / m(med));
}

int main() {
    const size_t span = (size_t)2 << 30;
    uint8_t *buf;
    uint64_t *dstamps;
    int *sink;
    CK(cudaMalloc(&buf, span));
    CK(cudaMemset(buf, 1, span));
    CK(cudaMalloc(&dstamps, 2 * 1024 * 8));
    CK(cudaMalloc(&sink, 4));
    const size_t pers[] = {160 * 1024, 80 * 1024};
    const int blockses[] = {64, 132};
    for (size_t per : pers)
        for (int blocks : blockses) {
            run<0>(buf, span, blocks, per, dstamps, sink);
            run<1>(buf, span, blocks, per, dstamps, sink);
            run<2>(buf, span, blocks, per, dstamps, sink);
            run<3>(buf, span, blocks, per, dstamps, sink);
            run<4>(buf, span, blocks, per, dstamps, sink);
            run<5>(buf, span, blocks, per, dstamps, sink);
            run<6>(buf, span, blocks, per, dstamps, sink);
        }
    return 0;
}
