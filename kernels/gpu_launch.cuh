/* How the GPU kernels are launched: the warp, the device's attributes (read once),
 * calls that overlap on sm_90 (early launches, clusters) and shared memory past
 * the default 48 KiB. Every kernel header includes it. */
#ifndef COLI_GPU_LAUNCH_CUH
#define COLI_GPU_LAUNCH_CUH

#include "gpu_compat.h"
#include "backend_common.h"

#include <string.h>

/* A runtime call whose failure is the ABI call's: COLI_E_RUNTIME, naming the call. */
#define GPU_CHECK(call)                                                                          \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess)                                                                   \
            return coli_fail(COLI_E_RUNTIME, "%s failed: %s", #call, cudaGetErrorString(e_));    \
    } while (0)

#define WARP 32
#define GEMV_THREADS 256 /* a block of 8 warps, each owning rows (decode_kernel, gemv_kernel) */

/* An attribute of the current device, read once into *cache (a race writes the same value). */
static int device_attribute(int *cache, cudaDeviceAttr attr) {
    if (*cache < 0) {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&v, attr, dev) == cudaSuccess) *cache = v;
        else (void)cudaGetLastError(), *cache = 0;
    }
    return *cache;
}

static int sm_count(void) {
    static int n = -1;
    const int v = device_attribute(&n, cudaDevAttrMultiProcessorCount);
    return v > 0 ? v : 1;
}

#if COLI_HAS_PDL
static int cc_major(void) {
    static int n = -1;
    return device_attribute(&n, cudaDevAttrComputeCapabilityMajor);
}
#endif

/* Consecutive calls overlap (sm_90): every int8/int4 kernel allows the next
 * grid to launch as soon as it starts, and every kernel launched early waits for
 * the grid before it (coli_wait_prior_grid) before it reads x or writes what the
 * last call reads; only W, which no kernel writes, is read before that, and x too
 * where the caller says no kernel writes it (launch_matmul's x_ready: the S = 1
 * kernels then wait only before they write y). So the next call's W loads fill
 * the room the last one's final blocks leave, as a decode step's matmuls follow
 * one another. COLI_GPU_CHAIN=0 launches each call's first kernel after the last
 * call has ended (for comparisons). */
static int g_chain = -1;

/* A switch that is on unless the variable `name` is "0", read once into *cache. */
static bool env_switch(const char *name, int *cache) {
    if (*cache < 0) {
        const char *v = getenv(name);
        *cache = !(v && strcmp(v, "0") == 0);
    }
    return *cache != 0;
}

static bool chain_calls(void) { return env_switch("COLI_GPU_CHAIN", &g_chain); }

#if COLI_HAS_PDL
/* A kernel whose blocks take most of an SM's shared memory: past the default 48 KiB
 * and with the carveout at its largest, once per kernel (`raised`: its own flag). */
template <typename Kernel> static void allow_sm_shared(Kernel kernel, int bytes, bool &raised) {
    if (!raised)
        raised = cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess &&
                 cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      cudaSharedmemCarveoutMaxShared) == cudaSuccess;
}
#endif

/* Launches a kernel that, when `early` (and on sm_90), may start while the one
 * before it runs: it waits for that one before it reads its output
 * (coli_wait_prior_grid). Otherwise plainly. `cluster` > 1 (sm_90 only): the
 * blocks in clusters of that many, early or not. */
template <typename... Params, typename... Args>
static void launch_clustered(bool early, unsigned cluster, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared,
                             cudaStream_t stream, Args... args) {
#if COLI_HAS_PDL
    if ((early || cluster > 1) && cc_major() >= 9) {
        cudaLaunchConfig_t config = {};
        cudaLaunchAttribute attr[2];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = early;
        attr[1].id = cudaLaunchAttributeClusterDimension;
        attr[1].val.clusterDim.x = cluster, attr[1].val.clusterDim.y = 1, attr[1].val.clusterDim.z = 1;
        config.gridDim = grid, config.blockDim = block, config.dynamicSmemBytes = shared, config.stream = stream;
        config.attrs = attr, config.numAttrs = cluster > 1 ? 2 : 1;
        (void)cudaLaunchKernelEx(&config, kernel, ((Params)args)...);
        return;
    }
#else
    (void)early, (void)cluster;
#endif
    kernel<<<grid, block, shared, stream>>>(((Params)args)...);
}

template <typename... Params, typename... Args>
static void launch_early(bool early, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared,
                         cudaStream_t stream, Args... args) {
    launch_clustered(early, 1, kernel, grid, block, shared, stream, args...);
}

#if COLI_HAS_PDL
/* A decode kernel over one weight's rows (q, scale, rows, x, y) whose blocks take
 * `shared` bytes, most of an SM's (allow_sm_shared; `raised`: the kernel's own
 * flag), launched early, in clusters of `cluster` blocks. */
template <typename Kernel>
static void launch_wide_blocks(Kernel kernel, bool &raised, unsigned cluster, dim3 grid, int threads, size_t shared,
                               const coli_weight *w, const float *dx, float *dy, cudaStream_t stream) {
    allow_sm_shared(kernel, (int)shared, raised);
    launch_clustered(chain_calls(), cluster, kernel, grid, dim3((unsigned)threads), shared, stream, (const uint8_t *)w->q,
                     (const float *)w->scale, (int64_t)w->rows, dx, dy);
}
#endif

/* Past the default 48 KiB of dynamic shared memory, once per kernel (`raised`: that kernel's own flag). */
template <typename Kernel> static void allow_shared(Kernel kernel, int bytes, bool &raised) {
    if (bytes > 48 * 1024 && !raised)
        raised = cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess;
}

#endif
