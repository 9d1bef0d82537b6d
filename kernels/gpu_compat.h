/* One source, two vendors: the CUDA names the backend uses, mapped to HIP when
 * compiled for AMD. Only what backend_gpu.cu calls is here. */
#ifndef COLI_GPU_COMPAT_H
#define COLI_GPU_COMPAT_H

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) || defined(COLI_USE_HIP)
#include <hip/hip_runtime.h>
#define COLI_GPU_API "hip"
#define COLI_GPU_TAG 0x4849 /* "HI" */
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorNoDevice hipErrorNoDevice
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
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaGetDevice hipGetDevice
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaGetLastError hipGetLastError
#define COLI_ARCH_NAME(prop, buf, n) snprintf((buf), (n), "%.31s", (prop).gcnArchName)
#define cudaStream_t hipStream_t
/* lanes exchange within 32-lane teams: a 64-wide wavefront holds two teams */
#define COLI_SHFL_XOR(v, o) __shfl_xor((v), (o), 32)
#define COLI_LOAD_STREAM(p) (*(p))
#else
#include <cuda_runtime.h>
#define COLI_GPU_API "cuda"
#define COLI_GPU_TAG 0x4355 /* "CU" */
#define COLI_ARCH_NAME(prop, buf, n) snprintf((buf), (n), "sm_%d%d", (prop).major, (prop).minor)
#define COLI_SHFL_XOR(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))
/* weights are read once: stream them past the caches that x lives in */
#define COLI_LOAD_STREAM(p) __ldcs(p)
#endif

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

#endif
