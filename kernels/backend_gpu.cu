/* The GPU backend, one source for CUDA (nvcc) and HIP (clang -x hip / hipcc).
 * Correct first: every op is checked against the CPU reference by the host's
 * --selftest. Faster kernels replace these without changing the ABI. */
#define COLI_BUILDING_BACKEND 1
#include "gpu_compat.h"
#include "backend_common.h"

static coli_table g_tensors = {COLI_GPU_TAG, NULL, 0, 0, 0};
static int g_ready = 0;
static float *g_x = NULL, *g_y = NULL;     /* device scratch for activations */
static size_t g_x_cap = 0, g_y_cap = 0;

#define GPU_CHECK(call)                                                                          \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess)                                                                   \
            return coli_fail(COLI_E_RUNTIME, "%s failed: %s", #call, cudaGetErrorString(e_));    \
    } while (0)

#define THREADS 256

/* One block per (output row, token): threads stride over the row, then reduce. */
template <int FORMAT>
__global__ void matmul_kernel(const void *__restrict__ q, const float *__restrict__ scale, int64_t rows,
                              int64_t cols, int32_t group, const float *__restrict__ x, float *__restrict__ y) {
    __shared__ float partial[THREADS];
    const int64_t r = blockIdx.x, t = blockIdx.y;
    const float *xt = x + t * cols;
    float acc = 0.0f;
    if (FORMAT == COLI_FMT_F32) {
        const float *wr = (const float *)q + r * cols;
        for (int64_t c = threadIdx.x; c < cols; c += THREADS) acc += xt[c] * wr[c];
    } else if (FORMAT == COLI_FMT_Q8) {
        const int8_t *wr = (const int8_t *)q + r * cols;
        for (int64_t c = threadIdx.x; c < cols; c += THREADS) acc += xt[c] * (float)wr[c];
    } else {
        const uint8_t *wr = (const uint8_t *)q + r * cols / 2;
        const float *sr = scale + r * (cols / group);
        for (int64_t c = 2 * threadIdx.x; c < cols; c += 2 * THREADS) {
            uint8_t b = wr[c / 2];
            float sc = sr[c / group];
            acc += (xt[c] * (float)((int)(b & 0x0F) - 8) + xt[c + 1] * (float)((int)(b >> 4) - 8)) * sc;
        }
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int step = THREADS / 2; step > 0; step >>= 1) {
        if ((int)threadIdx.x < step) partial[threadIdx.x] += partial[threadIdx.x + step];
        __syncthreads();
    }
    if (threadIdx.x == 0) y[t * rows + r] = FORMAT == COLI_FMT_Q8 ? partial[0] * scale[r] : partial[0];
}

/* The fast path: a team of 32 lanes per output row reads the row in 16-byte
 * pieces (4 f32, 16 int8 or 32 int4 values), T tokens per pass, and reduces with
 * shuffles. It needs rows that are whole 16-byte pieces: cols % 32 == 0. */
#define TEAM 32
#define TEAMS_PER_BLOCK 8

template <int T>
__device__ inline void team_reduce_store(float (&acc)[T], int lane, float *y, int64_t rows, int64_t r, int64_t t0,
                                         int64_t s, float post) {
#pragma unroll
    for (int t = 0; t < T; t++) {
        float v = acc[t];
#pragma unroll
        for (int o = TEAM / 2; o > 0; o >>= 1) v += COLI_SHFL_XOR(v, o);
        if (lane == 0 && t0 + t < s) y[(t0 + t) * rows + r] = v * post;
    }
}

template <int FORMAT, int T>
__global__ void __launch_bounds__(TEAM * TEAMS_PER_BLOCK)
    team_kernel(const void *__restrict__ q, const float *__restrict__ scale, int64_t rows, int64_t cols, int32_t group,
                const float *__restrict__ x, int64_t s, float *__restrict__ y) {
    const int lane = threadIdx.x % TEAM;
    const int64_t r = (int64_t)blockIdx.x * TEAMS_PER_BLOCK + threadIdx.x / TEAM;
    const int64_t t0 = (int64_t)blockIdx.y * T;
    if (r >= rows) return; /* no barrier follows: a whole team leaves together */
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    const int nt = (int)(s - t0 < T ? s - t0 : T);
    if (FORMAT == COLI_FMT_F32) {
        const float4 *w = (const float4 *)((const float *)q + r * cols);
        for (int64_t i = lane; i < cols / 4; i += TEAM) {
            const float4 wv = w[i];
#pragma unroll
            for (int t = 0; t < T; t++) {
                if (t >= nt) break;
                const float4 xv = ((const float4 *)(x + (t0 + t) * cols))[i];
                acc[t] += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
            }
        }
        team_reduce_store<T>(acc, lane, y, rows, r, t0, s, 1.0f);
    } else if (FORMAT == COLI_FMT_Q8) {
        const int4 *w = (const int4 *)((const int8_t *)q + r * cols);
        for (int64_t i = lane; i < cols / 16; i += TEAM) {
            const int4 packed = w[i];
            const int8_t *b = (const int8_t *)&packed;
#pragma unroll
            for (int t = 0; t < T; t++) {
                if (t >= nt) break;
                const float4 *xv = (const float4 *)(x + (t0 + t) * cols + i * 16);
                float part = 0.0f;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const float4 v = xv[k];
                    part += v.x * (float)b[4 * k] + v.y * (float)b[4 * k + 1] + v.z * (float)b[4 * k + 2] +
                            v.w * (float)b[4 * k + 3];
                }
                acc[t] += part;
            }
        }
        team_reduce_store<T>(acc, lane, y, rows, r, t0, s, scale[r]);
    } else {
        const int4 *w = (const int4 *)((const uint8_t *)q + r * cols / 2);
        const float *sr = scale + r * (cols / group);
        for (int64_t i = lane; i < cols / 32; i += TEAM) { /* 32 values per 16 bytes */
            const int4 packed = w[i];
            const uint8_t *b = (const uint8_t *)&packed;
            const int64_t c0 = i * 32;
            const bool one_scale = group % 32 == 0;
            const float s0 = sr[c0 / group];
#pragma unroll
            for (int t = 0; t < T; t++) {
                if (t >= nt) break;
                const float4 *xv = (const float4 *)(x + (t0 + t) * cols + c0);
                float part = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    const float4 v = xv[k];
                    const uint8_t b0 = b[2 * k], b1 = b[2 * k + 1];
                    const float w0 = (float)((int)(b0 & 0x0F) - 8), w1 = (float)((int)(b0 >> 4) - 8);
                    const float w2 = (float)((int)(b1 & 0x0F) - 8), w3 = (float)((int)(b1 >> 4) - 8);
                    if (one_scale) {
                        part += v.x * w0 + v.y * w1 + v.z * w2 + v.w * w3;
                    } else {
                        const int64_t c = c0 + 4 * k;
                        part += (v.x * w0 + v.y * w1) * sr[c / group] + (v.z * w2 + v.w * w3) * sr[(c + 2) / group];
                    }
                }
                acc[t] += one_scale ? part * s0 : part;
            }
        }
        team_reduce_store<T>(acc, lane, y, rows, r, t0, s, 1.0f);
    }
}

/* Decode (S = 1): each team takes ROWS rows, so a piece of x read once serves
 * ROWS pieces of weights (int4 needs 8 bytes of x per weight byte: reading x for
 * every row made L1, not HBM, the limit). */
#define ROWS 4

template <int FORMAT>
__global__ void __launch_bounds__(TEAM * TEAMS_PER_BLOCK)
    decode_kernel(const void *__restrict__ q, const float *__restrict__ scale, int64_t rows, int64_t cols,
                  int32_t group, const float *__restrict__ x, float *__restrict__ y) {
    const int lane = threadIdx.x % TEAM;
    const int64_t r0 = ((int64_t)blockIdx.x * TEAMS_PER_BLOCK + threadIdx.x / TEAM) * ROWS;
    if (r0 >= rows) return;
    const int nr = (int)(rows - r0 < ROWS ? rows - r0 : ROWS);
    float acc[ROWS] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (FORMAT == COLI_FMT_F32) {
        for (int64_t i = lane; i < cols / 4; i += TEAM) {
            const float4 xv = ((const float4 *)x)[i];
#pragma unroll
            for (int k = 0; k < ROWS; k++) {
                if (k >= nr) break;
                const float4 wv = ((const float4 *)((const float *)q + (r0 + k) * cols))[i];
                acc[k] += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
            }
        }
    } else if (FORMAT == COLI_FMT_Q8) {
        for (int64_t i = lane; i < cols / 16; i += TEAM) {
            float xs[16];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float4 v = ((const float4 *)(x + i * 16))[j];
                xs[4 * j] = v.x; xs[4 * j + 1] = v.y; xs[4 * j + 2] = v.z; xs[4 * j + 3] = v.w;
            }
#pragma unroll
            for (int k = 0; k < ROWS; k++) {
                if (k >= nr) break;
                const int4 packed = ((const int4 *)((const int8_t *)q + (r0 + k) * cols))[i];
                const int8_t *b = (const int8_t *)&packed;
                float part = 0.0f;
#pragma unroll
                for (int j = 0; j < 16; j++) part += xs[j] * (float)b[j];
                acc[k] += part;
            }
        }
    } else {
        const bool one_scale = group % 32 == 0;
        for (int64_t i = lane; i < cols / 32; i += TEAM) {
            float xs[32];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float4 v = ((const float4 *)(x + i * 32))[j];
                xs[4 * j] = v.x; xs[4 * j + 1] = v.y; xs[4 * j + 2] = v.z; xs[4 * j + 3] = v.w;
            }
            const int64_t c0 = i * 32;
#pragma unroll
            for (int k = 0; k < ROWS; k++) {
                if (k >= nr) break;
                const int4 packed = ((const int4 *)((const uint8_t *)q + (r0 + k) * cols / 2))[i];
                const uint8_t *b = (const uint8_t *)&packed;
                const float *sr = scale + (r0 + k) * (cols / group);
                float part = 0.0f;
                if (one_scale) {
#pragma unroll
                    for (int j = 0; j < 16; j++)
                        part += xs[2 * j] * (float)((int)(b[j] & 0x0F) - 8) + xs[2 * j + 1] * (float)((int)(b[j] >> 4) - 8);
                    acc[k] += part * sr[c0 / group];
                } else {
#pragma unroll
                    for (int j = 0; j < 16; j++)
                        part += (xs[2 * j] * (float)((int)(b[j] & 0x0F) - 8) +
                                 xs[2 * j + 1] * (float)((int)(b[j] >> 4) - 8)) * sr[(c0 + 2 * j) / group];
                    acc[k] += part;
                }
            }
        }
    }
#pragma unroll
    for (int k = 0; k < ROWS; k++) {
        float v = acc[k];
#pragma unroll
        for (int o = TEAM / 2; o > 0; o >>= 1) v += COLI_SHFL_XOR(v, o);
        if (lane == 0 && k < nr) y[r0 + k] = FORMAT == COLI_FMT_Q8 ? v * scale[r0 + k] : v;
    }
}

/* Runs one matmul on device pointers: the fast kernel when the row fits it, the
 * simple one otherwise. Shared by coli_matmul and the benchmark. */
static cudaError_t launch_matmul(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    static int simple = -1; /* COLI_GPU_SIMPLE=1: the simple kernel only, for comparisons */
    if (simple < 0) simple = getenv("COLI_GPU_SIMPLE") != NULL;
    if (w->cols % 32 == 0 && !simple) {
        dim3 block(TEAM * TEAMS_PER_BLOCK);
        /* S = 1: several rows per team pays where x re-reads dominate (int4 always; int8
         * with many rows); with few rows it leaves the GPU half empty (H200 measurements
         * in bench/RESULTS.md). */
        const bool rows_per_team = w->format == COLI_FMT_Q4 || (w->format == COLI_FMT_Q8 && w->rows >= 8192);
        if (s == 1 && !rows_per_team) {
            dim3 grid((unsigned)((w->rows + TEAMS_PER_BLOCK - 1) / TEAMS_PER_BLOCK), 1);
            switch (w->format) {
            case COLI_FMT_F32: team_kernel<COLI_FMT_F32, 1><<<grid, block, 0, stream>>>(w->q, w->scale, w->rows, w->cols, w->group, dx, s, dy); break;
            default: team_kernel<COLI_FMT_Q8, 1><<<grid, block, 0, stream>>>(w->q, w->scale, w->rows, w->cols, w->group, dx, s, dy);
            }
        } else if (s == 1) {
            const int64_t per_block = (int64_t)TEAMS_PER_BLOCK * ROWS;
            dim3 grid((unsigned)((w->rows + per_block - 1) / per_block), 1);
            switch (w->format) {
            case COLI_FMT_F32: decode_kernel<COLI_FMT_F32><<<grid, block, 0, stream>>>(w->q, w->scale, w->rows, w->cols, w->group, dx, dy); break;
            case COLI_FMT_Q8: decode_kernel<COLI_FMT_Q8><<<grid, block, 0, stream>>>(w->q, w->scale, w->rows, w->cols, w->group, dx, dy); break;
            default: decode_kernel<COLI_FMT_Q4><<<grid, block, 0, stream>>>(w->q, w->scale, w->rows, w->cols, w->group, dx, dy);
            }
        } else {
            dim3 grid((unsigned)((w->rows + TEAMS_PER_BLOCK - 1) / TEAMS_PER_BLOCK), (unsigned)((s + 3) / 4));
            switch (w->format) {
            case COLI_FMT_F32: team_kernel<COLI_FMT_F32, 4><<<grid, block, 0, stream>>>(w->q, w->scale, w->rows, w->cols, w->group, dx, s, dy); break;
            case COLI_FMT_Q8: team_kernel<COLI_FMT_Q8, 4><<<grid, block, 0, stream>>>(w->q, w->scale, w->rows, w->cols, w->group, dx, s, dy); break;
            default: team_kernel<COLI_FMT_Q4, 4><<<grid, block, 0, stream>>>(w->q, w->scale, w->rows, w->cols, w->group, dx, s, dy);
            }
        }
        return cudaGetLastError();
    }
    dim3 grid((unsigned)w->rows, (unsigned)s);
    switch (w->format) {
    case COLI_FMT_F32: matmul_kernel<COLI_FMT_F32><<<grid, THREADS, 0, stream>>>(w->q, w->scale, w->rows, w->cols, w->group, dx, dy); break;
    case COLI_FMT_Q8: matmul_kernel<COLI_FMT_Q8><<<grid, THREADS, 0, stream>>>(w->q, w->scale, w->rows, w->cols, w->group, dx, dy); break;
    default: matmul_kernel<COLI_FMT_Q4><<<grid, THREADS, 0, stream>>>(w->q, w->scale, w->rows, w->cols, w->group, dx, dy);
    }
    return cudaGetLastError();
}

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
    g_ready = 1;
    return COLI_OK;
}

static void release(coli_weight *w) {
    (void)cudaFree(w->q);
    if (w->scale) (void)cudaFree(w->scale);
    free(w);
}

COLI_API coli_status coli_backend_shutdown(void) {
    for (uint32_t i = 0; i < g_tensors.count; i++)
        if (g_tensors.slots[i].live) release(g_tensors.slots[i].w);
    coli_table_reset(&g_tensors);
    if (g_x) (void)cudaFree(g_x);
    if (g_y) (void)cudaFree(g_y);
    g_x = g_y = NULL;
    g_x_cap = g_y_cap = 0;
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
    e = cudaMemcpy(w->q, q, qb, cudaMemcpyHostToDevice);
    if (e == cudaSuccess && sb) e = cudaMemcpy(w->scale, scale, sb, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        release(w);
        return coli_fail(COLI_E_RUNTIME, "upload: copy to device failed: %s", cudaGetErrorString(e));
    }
    w->bytes = qb + sb;
    st = coli_table_add(&g_tensors, w, out);
    if (st) release(w);
    return st;
}

COLI_API coli_status coli_tensor_upload_f32(const float *data, int64_t rows, int64_t cols, coli_tensor *out) {
    return upload(COLI_FMT_F32, data, NULL, rows, cols, 0, out);
}

COLI_API coli_status coli_tensor_upload_q8(const int8_t *q, const float *row_scale, int64_t rows, int64_t cols,
                                           coli_tensor *out) {
    return upload(COLI_FMT_Q8, q, row_scale, rows, cols, 0, out);
}

COLI_API coli_status coli_tensor_upload_q4(const uint8_t *packed, const float *group_scale, int64_t rows,
                                           int64_t cols, int32_t group_size, coli_tensor *out) {
    return upload(COLI_FMT_Q4, packed, group_scale, rows, cols, group_size, out);
}

COLI_API coli_status coli_tensor_free(coli_tensor tensor) {
    coli_weight *w = NULL;
    coli_status st = coli_table_get(&g_tensors, tensor, &w);
    if (st) return st;
    release(w);
    coli_table_remove(&g_tensors, tensor);
    return COLI_OK;
}

COLI_API coli_status coli_tensor_size(coli_tensor tensor, uint64_t *bytes) {
    coli_weight *w = NULL;
    coli_status st;
    if (!bytes) return coli_fail(COLI_E_INVALID, "tensor_size: null bytes");
    st = coli_table_get(&g_tensors, tensor, &w);
    if (st) return st;
    *bytes = w->bytes;
    return COLI_OK;
}

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

COLI_API coli_status coli_matmul(coli_tensor weight, const float *x, int64_t s, int64_t in_features, float *y) {
    coli_weight *w = NULL;
    coli_status st;
    if (!g_ready) return coli_fail(COLI_E_NOT_INIT, "matmul: backend not initialised");
    st = coli_table_get(&g_tensors, weight, &w);
    if (st) return st;
    st = coli_matmul_check(w, x, s, in_features, y);
    if (st) return st;
    if (s > 65535) return coli_fail(COLI_E_SHAPE, "matmul: s = %lld exceeds 65535", (long long)s);
    size_t xb = (size_t)s * (size_t)w->cols * sizeof(float), yb = (size_t)s * (size_t)w->rows * sizeof(float);
    if ((st = grow(&g_x, &g_x_cap, xb)) || (st = grow(&g_y, &g_y_cap, yb))) return st;
    GPU_CHECK(cudaMemcpy(g_x, x, xb, cudaMemcpyHostToDevice));
    GPU_CHECK(launch_matmul(w, g_x, s, g_y, 0));
    GPU_CHECK(cudaMemcpy(y, g_y, yb, cudaMemcpyDeviceToHost));
    return COLI_OK;
}

COLI_API coli_status coli_resident_count(int32_t *count) {
    if (!count) return coli_fail(COLI_E_INVALID, "resident_count: null count");
    *count = g_tensors.live;
    return COLI_OK;
}

COLI_API coli_status coli_backend_set_threads(int32_t threads) {
    if (threads < 1) return coli_fail(COLI_E_INVALID, "set_threads: %d, must be at least 1", (int)threads);
    return COLI_OK; /* the GPU backend does no host-side parallel work */
}
