/* One source, two vendors: the CUDA names the backend uses, mapped to HIP when
 * compiled for AMD. Only what backend_gpu.cu calls is here. */
#ifndef COLI_GPU_COMPAT_H
#define COLI_GPU_COMPAT_H

#include <stdint.h>

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) || defined(COLI_USE_HIP)
#include <hip/hip_runtime.h>
#define COLI_GPU_API "hip"
#define COLI_GPU_TAG 0x4849 /* "HI" */
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorNoDevice hipErrorNoDevice
#define cudaErrorInsufficientDriver hipErrorInsufficientDriver
#define cudaGetErrorName hipGetErrorName
#define cudaRuntimeGetVersion hipRuntimeGetVersion
#define cudaDriverGetVersion hipDriverGetVersion
#define cudaGetErrorString hipGetErrorString
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaSetDevice hipSetDevice
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDeviceProp hipDeviceProp_t
#define cudaMemGetInfo hipMemGetInfo
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMemcpy hipMemcpy
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaHostAlloc hipHostMalloc
#define cudaHostAllocMapped hipHostMallocMapped
#define cudaHostGetDevicePointer hipHostGetDevicePointer
#define cudaFreeHost hipHostFree
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaGetDevice hipGetDevice
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaDeviceAttr hipDeviceAttribute_t
#define cudaFuncSetAttribute hipFuncSetAttribute
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor
#define cudaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define cudaGetLastError hipGetLastError
#define COLI_ARCH_NAME(prop, buf, n) snprintf((buf), (n), "%.31s", (prop).gcnArchName)
#define cudaStream_t hipStream_t
#define cudaStreamCreate hipStreamCreate
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamWaitEvent hipStreamWaitEvent
#define cudaStreamDestroy hipStreamDestroy
#define cudaMemset hipMemset
#define cudaGraph_t hipGraph_t
#define cudaGraphExec_t hipGraphExec_t
#define cudaStreamBeginCapture hipStreamBeginCapture
#define cudaStreamCaptureModeRelaxed hipStreamCaptureModeRelaxed
#define cudaStreamEndCapture hipStreamEndCapture
#define cudaGraphInstantiateWithFlags hipGraphInstantiateWithFlags
#define cudaGraphLaunch hipGraphLaunch
#define cudaGraphDestroy hipGraphDestroy
#define cudaGraphExecDestroy hipGraphExecDestroy
#define cudaEvent_t hipEvent_t
#define cudaEventCreate hipEventCreate
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaEventDestroy hipEventDestroy
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventElapsedTime hipEventElapsedTime
/* lanes exchange within 32-lane teams: a 64-wide wavefront holds two teams */
#define COLI_SHFL_XOR(v, o) __shfl_xor((v), (o), 32)
#define COLI_SHFL(v, src) __shfl((v), (src), 32)
#define COLI_LOAD_STREAM(p) (*(p))
#define COLI_LOAD_FRESH(p) (*(p))
#define COLI_LOAD_GRID(p) (*(volatile const float *)(p)) /* device-coherent: past the CU's L1 */
#define COLI_HAS_PDL 0 /* no programmatic dependent launch: kernels run one after another */
/* a warp's lanes meet and see each other's shared-memory writes: a wavefront runs in
 * lockstep, so a fence and a barrier to code motion are enough (ROCm's own __syncwarp) */
#define COLI_SYNC_WARP()                                     \
    do {                                                     \
        __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront"); \
        __builtin_amdgcn_wave_barrier();                     \
        __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront"); \
    } while (0)
#else
#include <cuda_runtime.h>
#define COLI_GPU_API "cuda"
#define COLI_GPU_TAG 0x4355 /* "CU" */
#define COLI_ARCH_NAME(prop, buf, n) snprintf((buf), (n), "sm_%d%d", (prop).major, (prop).minor)
#define COLI_SHFL_XOR(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))
#define COLI_SHFL(v, src) __shfl_sync(0xffffffffu, (v), (src))
/* weights are read once: stream them past the caches that x lives in */
#define COLI_LOAD_STREAM(p) __ldcs(p)
/* What the grid before wrote (x, x's digits), read after coli_wait_prior_grid: a
 * coherent load, never the read-only path (__ldg, ld.global.nc), which assumes
 * data that no one writes while the kernel runs: ptxas may move such loads above
 * the wait, and an early-launched kernel then reads the last call's values. As
 * fast as __ldg on the H200. */
#define COLI_LOAD_FRESH(p) __ldca(p)
/* What another block of this grid wrote (after a fence and a counter): from L2,
 * never from this SM's L1, which may hold the line from an earlier run. */
#define COLI_LOAD_GRID(p) __ldcg(p)
#define COLI_HAS_PDL 1
#define COLI_SYNC_WARP() __syncwarp()
#endif

/* 16-byte copies from global to shared memory that run in the background
 * (cp.async, sm_80 and later: no registers held while they are in flight),
 * committed in groups and waited for until at most N groups are pending;
 * elsewhere plain copies, done at once. */
__device__ inline void coli_copy_async16(void *shared, const void *global) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(shared)),
                 "l"(global)
                 : "memory");
#else
    *(int4 *)shared = *(const int4 *)global;
#endif
}
/* The same, for a caller that keeps shared memory's address (coli_shared_at) and adds
 * its offsets itself: `at` on sm_80 and later, `shared` elsewhere. 4 or 16 bytes. */
__device__ inline uint32_t coli_shared_at(const void *shared) {
#if defined(__CUDA_ARCH__)
    return (uint32_t)__cvta_generic_to_shared(shared);
#else
    (void)shared;
    return 0;
#endif
}
template <int BYTES> __device__ inline void coli_copy_async_at(uint32_t at, void *shared, const void *global) {
    static_assert(BYTES == 4 || BYTES == 16, "cp.async copies 4 or 16 bytes here");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    (void)shared;
    if constexpr (BYTES == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(at), "l"(global) : "memory");
    else asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(at), "l"(global) : "memory");
#else
    (void)at;
    memcpy(shared, global, BYTES);
#endif
}
__device__ inline void coli_copy_commit(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N> __device__ inline void coli_copy_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

/* Programmatic dependent launch (sm_90): a kernel may start while the one before
 * it on the stream runs, once that one allows it; before it reads what that one
 * writes it waits for it. Elsewhere both are nothing (kernels run one after another). */
__device__ inline void coli_allow_next_grid(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ inline void coli_wait_prior_grid(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Asks the 128-byte line at p into this SM's L1 (CUDA); elsewhere nothing. */
__device__ inline void coli_prefetch_l1(const void *p) {
#if defined(__CUDA_ARCH__)
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
#else
    (void)p;
#endif
}

/* The largest of a warp's 32 values: redux.sync on sm_80 and later, lane exchanges elsewhere. */
__device__ inline uint32_t coli_warp_max(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_max_sync(0xFFFFFFFFu, v);
#else
    for (int o = 16; o > 0; o /= 2) {
        const uint32_t u = COLI_SHFL_XOR(v, o);
        v = u > v ? u : v;
    }
    return v;
#endif
}

/* The smallest of a warp's 32 values: the complement of the largest complement. */
__device__ inline uint32_t coli_warp_min(uint32_t v) { return ~coli_warp_max(~v); }

/* Bytes of {b, a} picked by the selector's nibbles (0-3 a's, 4-7 b's): the prmt
 * instruction on NVIDIA GPUs, written out elsewhere. */
__host__ __device__ inline uint32_t coli_byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
    return __byte_perm(a, b, sel);
#else
    const uint64_t both = (uint64_t)b << 32 | a;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= (uint32_t)(both >> 8 * (sel >> 4 * i & 7) & 0xFF) << 8 * i;
    return r;
#endif
}

/* Four int8 products summed into c: the dp4a instruction on NVIDIA GPUs, written
 * out elsewhere (the host, where the layout check runs it, and HIP for now). */
__host__ __device__ inline int coli_dp4a(int a, int b, int c) {
#if defined(__CUDA_ARCH__)
    return __dp4a(a, b, c);
#else
    for (int k = 0; k < 32; k += 8) c += (int)(signed char)(a >> k) * (int)(signed char)(b >> k);
    return c;
#endif
}
#define COLI_DP4A(a, b, c) coli_dp4a((a), (b), (c))
/* The same with a's bytes unsigned, written out (only mma's stand-in takes it). */
__host__ __device__ inline int coli_dp4a_us(uint32_t a, int b, int c) {
    for (int k = 0; k < 32; k += 8) c += (int)(uint8_t)(a >> k) * (int)(signed char)(b >> k);
    return c;
}

/* d += A B for one 16 x 8 x 32 tile of int8, int32 sums, in the tensor cores'
 * fragment layout (g = lane / 4, t = lane % 4; PTX ISA, mma.m16n8k32):
 *   a[0] = A[g][4t..4t+3]  a[1] = A[g+8][4t..]  a[2] = A[g][16+4t..]  a[3] = A[g+8][16+4t..]
 *   b[0] = B[4t..4t+3][g]  b[1] = B[16+4t..][g]
 *   d[0], d[1] = D[g][2t], D[g][2t+1]           d[2], d[3] = D[g+8][2t], D[g+8][2t+1]
 * mma.sync on sm_80 and later; elsewhere (HIP for now) written out with lane
 * exchanges and dot products: the same sums, slowly. */
template <bool UNSIGNED_A> __device__ inline void coli_mma_by_lanes(int (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    const int lane = (int)(threadIdx.x % 32), g = lane / 4, t = lane % 4;
    const auto dot = [](uint32_t x, int y, int c) { return UNSIGNED_A ? coli_dp4a_us(x, y, c) : COLI_DP4A((int)x, y, c); };
    for (int u = 0; u < 4; u++) { /* lane slot u of the row group and of each column's group */
        const int ra = g * 4 + u;
        const uint32_t a0 = COLI_SHFL(a[0], ra), a1 = COLI_SHFL(a[1], ra), a2 = COLI_SHFL(a[2], ra), a3 = COLI_SHFL(a[3], ra);
        for (int j = 0; j < 2; j++) {
            const int rb = (2 * t + j) * 4 + u;
            const int b0 = (int)COLI_SHFL(b[0], rb), b1 = (int)COLI_SHFL(b[1], rb);
            d[j] = dot(a0, b0, dot(a2, b1, d[j]));
            d[2 + j] = dot(a1, b0, dot(a3, b1, d[2 + j]));
        }
    }
}
__device__ inline void coli_mma_s8(int (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    coli_mma_by_lanes<false>(d, a, b);
#endif
}
/* d = A B + c with A's bytes unsigned (u8 x s8): c apart from d, so that a start
 * kept in registers is not copied for every tile. */
__device__ inline void coli_mma_u8s8(int (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const int (&c)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
#else
    for (int k = 0; k < 4; k++) d[k] = c[k];
    coli_mma_by_lanes<true>(d, a, b);
#endif
}

/* Four 8 x 8 matrices of 32-bit words from shared memory, one a register: lane
 * 8j + i gives the address of row i of matrix j (16 bytes), and lane l gets word
 * l % 4 of row l / 4 of each (ldmatrix on sm_75 and later; elsewhere the rows'
 * addresses go round by lane exchanges). */
__device__ inline void coli_ldmatrix_x4(uint32_t (&r)[4], const void *row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((uint32_t)__cvta_generic_to_shared(row))
                 : "memory");
#else
    const int lane = (int)(threadIdx.x % 32);
    const uintptr_t mine = (uintptr_t)row;
    for (int j = 0; j < 4; j++) {
        const uintptr_t at = (uintptr_t)COLI_SHFL((unsigned long long)mine, 8 * j + lane / 4);
        r[j] = *(const uint32_t *)(at + 4 * (lane % 4));
    }
#endif
}

#endif
