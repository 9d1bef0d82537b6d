/* The GPU backend, one source for CUDA (nvcc) and HIP (clang -x hip / hipcc):
 * the ABI's functions, tensor memory and the activations' scratch. The matmul
 * kernels are in the gpu_*.cuh headers, and which one serves a call is
 * gpu_dispatch.cuh's table; the host's --selftest checks every op against
 * the CPU reference. */
#define COLI_BUILDING_BACKEND 1
#include "gpu_compat.h"
#include "backend_common.h"

static coli_table g_tensors = {COLI_GPU_TAG, "tensor", NULL, 0, 0, 0, 0};
static coli_table g_buffers = {COLI_GPU_TAG + 1, "buffer", NULL, 0, 0, 0, 0};
static coli_table g_steps = {COLI_GPU_TAG + 2, "step", NULL, 0, 0, 0, 0};
static int g_ready = 0;
static float *g_x = NULL, *g_y = NULL, *g_planes = NULL; /* device scratch for activations */
static size_t g_x_cap = 0, g_y_cap = 0, g_planes_cap = 0;
static float *g_hx = NULL, *g_hy = NULL; /* page-locked host copies of x and y */
static size_t g_hx_cap = 0, g_hy_cap = 0;


#include "backend_steps.h"
#include "gpu_step_run.cuh"

COLI_API uint32_t coli_abi_version(void) { return COLI_ABI_VERSION; }
COLI_API const char *coli_backend_name(void) { return COLI_GPU_API; }
COLI_API const char *coli_last_error(void) { return coli_error_get(); }

COLI_API coli_status coli_device_count(int32_t *count) {
    int n = 0;
    if (!count) return coli_fail(COLI_E_INVALID, "device_count: null count");
    cudaError_t e = cudaGetDeviceCount(&n);
    *count = e == cudaSuccess ? n : 0; /* a runtime without devices reports an error: that is 0 devices */
    return COLI_OK;
}

COLI_API coli_status coli_backend_init(int32_t device) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return coli_fail(COLI_E_NO_DEVICE, "no %s device: %s", COLI_GPU_API,
                         e != cudaSuccess ? cudaGetErrorString(e) : "the runtime reports 0 devices");
    if (device < 0 || device >= n)
        return coli_fail(COLI_E_NO_DEVICE, "device %d requested, %d present", (int)device, n);
    GPU_CHECK(cudaSetDevice(device));
    if (!g_step_stream) GPU_CHECK(cudaStreamCreate(&g_step_stream)); /* blocking: ordered with the copies */
    g_ready = 1;
    return COLI_OK;
}

static void release(coli_weight *w) {
    (void)cudaFree(w->q);
    if (w->scale) (void)cudaFree(w->scale);
    free(w);
}

COLI_API coli_status coli_backend_shutdown(void) {
    coli_steps_reset();
    profile_print();
    gpu_queues_release();
    if (g_step_stream) (void)cudaStreamDestroy(g_step_stream);
    g_step_stream = NULL;
    for (uint32_t i = 0; i < g_tensors.count; i++)
        if (g_tensors.slots[i].live) release((coli_weight *)g_tensors.slots[i].p);
    coli_table_reset(&g_tensors);
    if (g_x) (void)cudaFree(g_x);
    if (g_y) (void)cudaFree(g_y);
    if (g_planes) (void)cudaFree(g_planes);
    if (g_hx) (void)cudaFreeHost(g_hx);
    if (g_hy) (void)cudaFreeHost(g_hy);
    g_x = g_y = g_planes = g_hx = g_hy = NULL;
    g_x_cap = g_y_cap = g_planes_cap = g_hx_cap = g_hy_cap = 0;
    g_ready = 0;
    return COLI_OK;
}

COLI_API coli_status coli_device_describe(int32_t device, coli_device_info *info) {
    cudaDeviceProp prop;
    if (!info) return coli_fail(COLI_E_INVALID, "device_describe: null info");
    GPU_CHECK(cudaGetDeviceProperties(&prop, device));
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%.127s", prop.name);
    COLI_ARCH_NAME(prop, info->arch, sizeof info->arch);
    info->total_memory = (uint64_t)prop.totalGlobalMem;
    info->compute_units = prop.multiProcessorCount;
    return COLI_OK;
}

/* What `coli doctor` shows of the runtime: asking it for its devices starts it, but selects
 * and allocates nothing, so a runtime that cannot start is described, not failed. */
COLI_API coli_status coli_runtime_describe(coli_runtime_info *info) {
    int runtime = 0, driver = 0, n = 0;
    if (!info) return coli_fail(COLI_E_INVALID, "runtime_describe: null info");
    memset(info, 0, sizeof *info);
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) info->runtime_version = runtime;
    if (cudaDriverGetVersion(&driver) == cudaSuccess) info->driver_version = driver;
    /* with no driver at all the runtime says the same, and gives the driver's version as 0 */
    info->driver_too_old = e == cudaErrorInsufficientDriver && driver > 0;
    info->device_status = (int32_t)e;
    const char *name = cudaGetErrorName(e), *words = cudaGetErrorString(e);
    if (e != cudaSuccess && strcmp(name, words))
        snprintf(info->device_error, sizeof info->device_error, "%s: %s", name, words);
    else if (e != cudaSuccess)
        snprintf(info->device_error, sizeof info->device_error, "%s", name);
    (void)cudaGetLastError(); /* the count's error is reported here, not left for the next call */
    return COLI_OK;
}

COLI_API coli_status coli_device_integrated(int32_t device, int32_t *integrated) {
    cudaDeviceProp prop;
    if (!integrated) return coli_fail(COLI_E_INVALID, "device_integrated: null integrated");
    GPU_CHECK(cudaGetDeviceProperties(&prop, device));
    *integrated = prop.integrated != 0;
    return COLI_OK;
}

COLI_API coli_status coli_memory_info(uint64_t *free_bytes, uint64_t *total_bytes) {
    size_t f = 0, t = 0;
    if (!free_bytes || !total_bytes) return coli_fail(COLI_E_INVALID, "memory_info: null argument");
    if (!g_ready) return coli_fail(COLI_E_NOT_INIT, "memory_info: backend not initialised");
    GPU_CHECK(cudaMemGetInfo(&f, &t));
    *free_bytes = f;
    *total_bytes = t;
    return COLI_OK;
}

static coli_status upload(int32_t format, const void *q, const float *scale, int64_t rows, int64_t cols,
                          int32_t group, coli_tensor *out) {
    coli_weight tmp, *w;
    size_t qb, sb;
    coli_status st;
    cudaError_t e;
    if (!g_ready) return coli_fail(COLI_E_NOT_INIT, "upload: backend not initialised");
    st = coli_weight_check(format, q, scale, rows, cols, group, out, &tmp);
    if (st) return st;
    coli_weight_sizes(&tmp, &qb, &sb);
    w = (coli_weight *)malloc(sizeof *w);
    if (!w) return coli_fail(COLI_E_OUT_OF_MEMORY, "upload: out of host memory");
    *w = tmp;
    e = cudaMalloc(&w->q, qb);
    if (e == cudaSuccess && sb) e = cudaMalloc((void **)&w->scale, sb);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky allocation error */
        if (w->q) (void)cudaFree(w->q);
        free(w);
        return coli_fail(COLI_E_OUT_OF_MEMORY, "upload: cannot allocate %zu device bytes: %s", qb + sb,
                         cudaGetErrorString(e));
    }
    /* int4: the kernels' order (gpu_formats.cuh): tile by tile, scales too, or the mma layout */
    const bool tiled = !simple_only() && gpu_stores_tile_by_tile(format, rows, cols, group);
    const bool reorder = tiled || (!simple_only() && mma_layout(format, cols, group));
    void *order = reorder ? malloc(qb) : NULL;
    float *sorder = tiled ? (float *)malloc(sb) : NULL;
    if ((reorder && !order) || (tiled && !sorder)) {
        free(order);
        release(w);
        return coli_fail(COLI_E_OUT_OF_MEMORY, "upload: out of host memory (%zu bytes to reorder)", qb + (tiled ? sb : 0));
    }
    if (tiled) tile_reorder(q, scale, rows, cols, order, sorder);
    else if (reorder) mma_reorder(q, order, (int64_t)(qb / 4));
    w->layout = tiled ? TILE_LAYOUT : reorder ? MMA_LAYOUT : 0;
    e = cudaMemcpy(w->q, reorder ? order : q, qb, cudaMemcpyHostToDevice);
    if (e == cudaSuccess && sb) e = cudaMemcpy(w->scale, tiled ? sorder : scale, sb, cudaMemcpyHostToDevice);
    free(order);
    free(sorder);
    if (e != cudaSuccess) {
        release(w);
        return coli_fail(COLI_E_RUNTIME, "upload: copy to device failed: %s", cudaGetErrorString(e));
    }
    w->bytes = qb + sb;
    st = coli_table_add(&g_tensors, w, out);
    if (st) release(w);
    return st;
}

#include "backend_tensors.h"

static coli_status grow(float **buf, size_t *cap, size_t need) {
    if (need <= *cap) return COLI_OK;
    if (*buf) (void)cudaFree(*buf);
    *buf = NULL;
    *cap = 0;
    cudaError_t e = cudaMalloc((void **)buf, need);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *buf = NULL;
        return coli_fail(COLI_E_OUT_OF_MEMORY, "matmul: cannot allocate %zu device bytes: %s", need,
                         cudaGetErrorString(e));
    }
    *cap = need;
    return COLI_OK;
}

/* Page-locked host memory for a call's copies of x and y, mapped into the
 * device's address space: the copies are then queued with the kernels and the
 * call waits once, instead of twice on copies the driver stages itself, and a
 * kernel may write y there directly. false (nothing kept) when none can be had:
 * the call then copies from and to the caller's memory directly. */
static bool grow_pinned(float **buf, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    if (*buf) (void)cudaFreeHost(*buf);
    *buf = NULL;
    *cap = 0;
    if (cudaHostAlloc((void **)buf, need, cudaHostAllocMapped) != cudaSuccess) {
        (void)cudaGetLastError();
        *buf = NULL;
        return false;
    }
    *cap = need;
    return true;
}

/* Checked weights that read the same x: x in once, their kernels one after
 * another on the stream (a kernel launched early waits for the one before it
 * before it reads x's digits or writes, gpu_launch.cuh), one wait, each y out. */
static coli_status run_matmuls(coli_weight *const *ws, int32_t count, const float *x, int64_t s, float *const *ys) {
    coli_status st;
    if (s > 65535) return coli_fail(COLI_E_SHAPE, "matmul: s = %lld exceeds 65535", (long long)s);
    const size_t xb = (size_t)s * (size_t)ws[0]->cols * sizeof(float);
    size_t yb = 0;
    bool digits = false; /* x's digits for the int8/int4 kernels */
    for (int32_t i = 0; i < count; i++) {
        yb += (size_t)s * (size_t)ws[i]->rows * sizeof(float);
        digits = digits || ws[i]->format != COLI_FMT_F32;
    }
    if ((st = grow(&g_x, &g_x_cap, xb)) || (st = grow(&g_y, &g_y_cap, yb))) return st;
    if (digits && (st = grow(&g_planes, &g_planes_cap, xb))) return st;
    const bool pinned = grow_pinned(&g_hx, &g_hx_cap, xb) && grow_pinned(&g_hy, &g_hy_cap, yb);
    if (pinned) {
        memcpy(g_hx, x, xb);
        GPU_CHECK(cudaMemcpyAsync(g_x, g_hx, xb, cudaMemcpyHostToDevice, 0));
    } else {
        GPU_CHECK(cudaMemcpy(g_x, x, xb, cudaMemcpyHostToDevice));
    }
    /* One token (a decode step, bound by the call's latency): the kernels write y
     * straight into the page-locked copy, with no copy back to queue and wait for.
     * More tokens keep the copy back: their kernels were not timed writing over PCIe. */
    float *dy = g_y;
    const bool direct = pinned && s == 1 && cudaHostGetDevicePointer((void **)&dy, g_hy, 0) == cudaSuccess;
    if (!direct) {
        (void)cudaGetLastError(); /* a device that cannot map host memory: copy back instead */
        dy = g_y;
    }
    /* x_ready: only the copy above writes g_x, and it has run before the first kernel starts */
    for (int64_t i = 0, at = 0; i < count; at += s * ws[i]->rows, i++)
        GPU_CHECK(launch_matmul(ws[i], g_x, s, dy + at, true, 0, digits ? g_planes : NULL));
    if (pinned) {
        if (!direct) GPU_CHECK(cudaMemcpyAsync(g_hy, g_y, yb, cudaMemcpyDeviceToHost, 0));
        GPU_CHECK(cudaStreamSynchronize(0)); /* reports a kernel's failure, as the copy did */
    }
    for (int64_t i = 0, at = 0; i < count; at += s * ws[i]->rows, i++) {
        const size_t bytes = (size_t)s * (size_t)ws[i]->rows * sizeof(float);
        if (pinned) memcpy(ys[i], g_hy + at, bytes);
        else GPU_CHECK(cudaMemcpy(ys[i], g_y + at, bytes, cudaMemcpyDeviceToHost));
    }
    return COLI_OK;
}

COLI_API coli_status coli_matmul(coli_tensor weight, const float *x, int64_t s, int64_t in_features, float *y) {
    coli_weight *w = NULL;
    const coli_status st = coli_matmul_args(g_ready, &g_tensors, weight, x, s, in_features, y, &w);
    if (st) return st;
    return run_matmuls(&w, 1, x, s, &y);
}

COLI_API coli_status coli_matmul_many(const coli_tensor *weights, int32_t count, const float *x, int64_t s,
                                      int64_t in_features, float *const *ys) {
    coli_weight *ws[COLI_MANY_MAX];
    const coli_status st = coli_many_check(g_ready, &g_tensors, weights, count, x, s, in_features, ys, ws);
    if (st) return st;
    return run_matmuls(ws, count, x, s, ys);
}

COLI_API coli_status coli_backend_set_threads(int32_t threads) {
    if (threads < 1) return coli_fail(COLI_E_INVALID, "set_threads: %d, must be at least 1", (int)threads);
    return COLI_OK; /* the GPU backend does no host-side parallel work */
}

/* ---- buffers and steps (gpu_steps.cuh runs the ops) ---- */

static coli_status mem_alloc(uint64_t bytes, void **out) {
    cudaError_t e = cudaMalloc(out, (size_t)bytes);
    if (e == cudaSuccess) e = cudaMemset(*out, 0, (size_t)bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (*out) (void)cudaFree(*out);
        *out = NULL;
        return coli_fail(COLI_E_OUT_OF_MEMORY, "buffer_alloc: cannot allocate %llu device bytes: %s",
                         (unsigned long long)bytes, cudaGetErrorString(e));
    }
    return COLI_OK;
}

static void mem_free(void *p) { (void)cudaFree(p); }

/* The legacy stream's copies wait for the step stream's work before them (a blocking stream). */
static coli_status mem_write(void *dst, const void *src, uint64_t bytes) {
    GPU_CHECK(cudaMemcpy(dst, src, (size_t)bytes, cudaMemcpyHostToDevice));
    return COLI_OK;
}

static coli_status mem_read(void *dst, const void *src, uint64_t bytes) {
    GPU_CHECK(cudaMemcpy(dst, src, (size_t)bytes, cudaMemcpyDeviceToHost));
    return COLI_OK;
}
