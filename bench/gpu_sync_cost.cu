/* What one dependent link costs a decode on the GPU, by kind of link: the question
 * behind "a persistent kernel a layer" (docs/gpu-step.md). Each link hands one value
 * from one step to the next, so every step waits for the one before it:
 *
 *   kernels     a chain of kernels on one stream, each a grid of B blocks, block 0
 *               reading what the kernel before wrote; as captured in a graph
 *   kernels pdl the same, each launched early (programmatic dependent launch, sm_90):
 *               it starts while the one before runs and waits for it inside
 *   barrier     one kernel of B blocks (at most one wave, so all are resident), its
 *               steps separated by a barrier of the whole grid (every block arrives,
 *               then every block goes on): all-to-all, as a layer's matmul outputs are
 *   flag        the same kernel, each step's value published by one block with a
 *               release flag the others acquire: one-to-all
 *
 * A link's cost is the slope: (time of 2N links - time of N links) / N, medians of
 * replays of a graph (bench/gpu_timing.cuh). Each row checks that the last value is
 * the number of links. One JSON line a row.
 *
 *   nvcc -std=c++17 -O3 -arch=sm_90 -Ibench -Ikernels bench/gpu_sync_cost.cu -o /tmp/gpu_sync_cost
 *   /tmp/gpu_sync_cost            # B = the SMs, twice the SMs, 8 */
#include <cuda_runtime.h>

#include <cstdio>

#include "gpu_compat.h"
#include "gpu_timing.cuh"

#define THREADS 256

/* Step i of a chain: block 0 adds one to what step i - 1 wrote. */
template <bool PDL> __global__ void link_kernel(unsigned *v, int i) {
    if constexpr (PDL) { /* as the decode's kernels do (kernels/gpu_compat.h) */
        coli_allow_next_grid();
        coli_wait_prior_grid();
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) v[i + 1] = v[i] + 1;
}

__device__ inline unsigned load_acquire(const unsigned *p) {
    unsigned x;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(x) : "l"(p) : "memory");
    return x;
}
__device__ inline void store_release(unsigned *p, unsigned x) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(x) : "memory");
}

/* Every block of the grid arrives before any goes on: a count and a generation, the
 * last to arrive setting the count back and moving the generation on. */
__device__ inline void grid_barrier(unsigned *count, unsigned *gen, unsigned blocks) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned g = load_acquire(gen);
        __threadfence(); /* this block's writes before its arrival is counted */
        if (atomicAdd(count, 1u) == blocks - 1) {
            *count = 0;
            store_release(gen, g + 1);
        } else {
            while (load_acquire(gen) == g) {
            }
        }
    }
    __syncthreads();
}

/* n steps in one grid: step i's value made by block i % B from step i - 1's. FLAG:
 * its maker publishes it (flag[i + 1] = 1, release) and the others wait for that
 * flag; else every block waits at a barrier of the grid after each step. */
template <bool FLAG> __global__ void steps_kernel(unsigned *v, unsigned *flag, unsigned *count, unsigned *gen, int n) {
    const unsigned blocks = gridDim.x;
    for (int i = 0; i < n; i++) {
        const bool maker = blockIdx.x == (unsigned)i % blocks;
        if (FLAG) {
            if (threadIdx.x == 0) {
                if (i > 0)
                    while (load_acquire(flag + i) == 0u) {
                    }
                if (maker) {
                    v[i + 1] = v[i] + 1;
                    store_release(flag + i + 1, 1u);
                }
            }
            __syncthreads();
        } else {
            if (maker && threadIdx.x == 0) v[i + 1] = v[i] + 1;
            grid_barrier(count, gen, blocks);
        }
    }
}

struct bufs {
    unsigned *v, *flag, *count, *gen;
};

static void reset(const bufs &b, int n, cudaStream_t st) {
    CHECK(cudaMemsetAsync(b.v, 0, (size_t)(n + 1) * sizeof(unsigned), st));
    CHECK(cudaMemsetAsync(b.flag, 0, (size_t)(n + 1) * sizeof(unsigned), st));
    CHECK(cudaMemsetAsync(b.count, 0, sizeof(unsigned), st));
    CHECK(cudaMemsetAsync(b.gen, 0, sizeof(unsigned), st));
}

/* kind 0 kernels, 1 kernels pdl, 2 barrier, 3 flag: n links of B blocks, as one graph
 * (the buffers set back to 0 at its start) replayed; the median replay's us, and
 * whether its last value was n. */
static double links_us(int kind, int blocks, int n, const bufs &b, cudaStream_t st, bool *ok) {
    const double us = graph_median_us(st, 1, 3, 21, [&](int, cudaStream_t s) {
        reset(b, n, s);
        if (kind <= 1) {
            for (int i = 0; i < n; i++) {
                cudaLaunchConfig_t cfg = {};
                cudaLaunchAttribute attr[1];
                cfg.gridDim = dim3((unsigned)blocks), cfg.blockDim = dim3(THREADS), cfg.stream = s;
                attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                attr[0].val.programmaticStreamSerializationAllowed = 1;
                cfg.attrs = attr, cfg.numAttrs = kind == 1 ? 1 : 0;
                if (kind == 1) CHECK(cudaLaunchKernelEx(&cfg, link_kernel<true>, b.v, i));
                else CHECK(cudaLaunchKernelEx(&cfg, link_kernel<false>, b.v, i));
            }
        } else {
            /* every block resident at once (main keeps the grid to one wave; nothing else runs) */
            if (kind == 3) steps_kernel<true><<<blocks, THREADS, 0, s>>>(b.v, b.flag, b.count, b.gen, n);
            else steps_kernel<false><<<blocks, THREADS, 0, s>>>(b.v, b.flag, b.count, b.gen, n);
            CHECK(cudaGetLastError());
        }
    });
    unsigned last = 0;
    CHECK(cudaMemcpy(&last, b.v + n, sizeof last, cudaMemcpyDeviceToHost));
    *ok = last == (unsigned)n;
    return us;
}

int main(void) {
    int dev = 0, sms = 0, major = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, dev));
    const int n = 64, most = 2 * n;
    bufs b;
    CHECK(cudaMalloc(&b.v, (most + 1) * sizeof(unsigned)));
    CHECK(cudaMalloc(&b.flag, (most + 1) * sizeof(unsigned)));
    CHECK(cudaMalloc(&b.count, sizeof(unsigned)));
    CHECK(cudaMalloc(&b.gen, sizeof(unsigned)));
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, steps_kernel<false>, THREADS, 0));
    const char *kinds[] = {"kernels", "kernels pdl", "barrier", "flag"};
    const int grids[] = {sms, 2 * sms, 8};
    for (int blocks : grids)
        for (int kind = 0; kind < 4; kind++) {
            if (kind == 1 && major < 9) continue;
            if (kind >= 2 && blocks > per_sm * sms) continue; /* not one wave: cannot wait on each other */
            bool ok1 = false, ok2 = false;
            const double t1 = links_us(kind, blocks, n, b, st, &ok1), t2 = links_us(kind, blocks, most, b, st, &ok2);
            printf("{\"gpu\": \"%s\", \"kind\": \"%s\", \"blocks\": %d, \"links\": [%d, %d], \"us\": [%.2f, %.2f], "
                   "\"us_a_link\": %.3f, \"ok\": %s}\n",
                   prop.name, kinds[kind], blocks, n, most, t1, t2, (t2 - t1) / (most - n),
                   ok1 && ok2 ? "true" : "false");
        }
    return 0;
}
