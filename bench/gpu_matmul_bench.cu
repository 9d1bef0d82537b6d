/* The backend's matmul kernels timed on device pointers, against the device's
 * copy bandwidth. Built and run by bench/gpu_bench.sh on a CUDA machine.
 *
 * COLI_BENCH_S1=1 times S = 1 only; COLI_BENCH_ONLY=name,... only the variants
 * whose names contain one of these; COLI_BENCH_SHAPES=RxC,... these shapes
 * instead of the three decode shapes (tools/bench_env.h says what each allows; a wrong
 * value stops the run with exit status 2); `gpu_matmul_bench profile` runs each
 * S = 1 matmul once, untimed, for a profiler. COLI_BENCH_TILE=1 stores int4 tile by
 * tile at every width it can (rows of whole 32s, groups of 32, sm_90) and times
 * only the decode tiled variants there, the pick included where it takes them.
 *
 * Method (METHOD.md of the device tool): weights rotate over copies larger than
 * L2, so every launch reads HBM; 100 launches are captured in a CUDA graph and
 * the graph replayed 7 times, so launch gaps stay out; the median replay counts.
 * Inputs are fresh hashed values (signed), never zeros. Every variant's output is
 * compared with the simple kernel's on the same inputs before it is timed.
 *
 *   gpu_matmul_bench  -> one JSON line per measurement on stdout */
#include "../kernels/backend_gpu.cu"
#include "bench_env.h"
#include "gpu_timing.cuh"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

__global__ void fill_bytes(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (uint8_t)(((uint32_t)i * 2654435761u ^ seed) >> 13);
}

/* signed values in [-amp, amp) */
__global__ void fill_floats(float *p, size_t n, uint32_t seed, float amp, float base) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t v = ((uint32_t)i + seed) * 2654435761u;
        v ^= v >> 15;
        v *= 2246822519u;
        v ^= v >> 13;
        p[i] = base + amp * ((float)(v >> 8) / 8388608.0f - 1.0f);
    }
}

static cudaStream_t g_stream;

/* Median microseconds per launch: `n` launches on g_stream captured in a graph, replayed. */
static double time_graph(const std::function<void(int)> &launch, int n = 100, int reps = 7) {
    return graph_median_us(g_stream, n, 1, reps, [&](int i, cudaStream_t) { launch(i); });
}

/* The ceiling, as the issue defines it: bytes read plus written per second by
 * large device-to-device copies (2 GiB, cudaMemcpyAsync back to back). */
static double memcpy_gbps() {
    const size_t n = (size_t)2 << 30;
    void *a, *b;
    CHECK(cudaMalloc(&a, n));
    CHECK(cudaMalloc(&b, n));
    fill_bytes<<<1024, 256, 0, g_stream>>>((uint8_t *)a, n, 3);
    CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, g_stream));
    const double ms = elapsed_ms(g_stream, [&] {
        for (int i = 0; i < 10; i++) CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, g_stream));
    });
    cudaFree(a);
    cudaFree(b);
    return 2.0 * (double)n * 10 / (ms * 1e-3) / 1e9;
}

/* Copies of `bytes` filled with bytes, enough to rotate over more than L2 holds. */
static std::vector<int4 *> rotating_buffers(size_t bytes) {
    std::vector<int4 *> bufs((size_t)((512u << 20) / bytes) + 2);
    for (int4 *&b : bufs) {
        CHECK(cudaMalloc((void **)&b, bytes));
        fill_bytes<<<1024, 256, 0, g_stream>>>((uint8_t *)b, bytes, 3);
    }
    return bufs;
}

/* 16-byte copies, four in flight per thread */
__global__ void copy_kernel(const int4 *__restrict__ src, int4 *__restrict__ dst, size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const int4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
        dst[i] = a, dst[i + stride] = b, dst[i + 2 * stride] = c, dst[i + 3 * stride] = d;
    }
    for (; i < n; i += stride) dst[i] = src[i];
}

/* A fairer ceiling for one matmul: a copy kernel moving the same bytes, timed
 * the same way (graph replays over rotating buffers), so launch and ramp-up
 * costs are in both. Bytes read plus written per second. */
static double copy_kernel_gbps(size_t bytes) {
    const size_t n = bytes / 16;
    std::vector<int4 *> src = rotating_buffers(n * 16), dst = rotating_buffers(n * 16);
    const int copies = (int)src.size();
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const double us = time_graph([&](int i) {
        copy_kernel<<<sms * 8, 256, 0, g_stream>>>(src[i % copies], dst[i % copies], n);
    });
    for (int i = 0; i < copies; i++) cudaFree(src[i]), cudaFree(dst[i]);
    return 2.0 * (double)(n * 16) / (us * 1e-6) / 1e9;
}

/* 16-byte reads, four in flight per thread, folded into one word a thread that
 * is written only if it comes out to a value it never does: bytes read once.
 * CHAINED: as the matmuls are on sm_90, the next launch may start at once, and
 * the write waits for the launch before (so calls overlap as far as they can). */
template <bool CHAINED = false>
__global__ void read_kernel(const int4 *__restrict__ src, size_t n, int *__restrict__ sink) {
    if (CHAINED) coli_allow_next_grid();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    int acc = 0;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const int4 a = __ldcs(src + i), b = __ldcs(src + i + stride), c = __ldcs(src + i + 2 * stride),
                   d = __ldcs(src + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) acc ^= src[i].x ^ src[i].y ^ src[i].z ^ src[i].w;
    if (CHAINED) coli_wait_prior_grid();
    if (acc == 0x7fffffff) *sink = acc;
}

/* The ceiling for a kernel that reads these bytes once: read_kernel over the same
 * bytes, timed the same way, `blocks` blocks of 256 an SM. Bytes read per second. */
template <bool CHAINED = false>
static double read_kernel_gbps(size_t bytes, int blocks = 8) {
    const size_t n = bytes / 16;
    std::vector<int4 *> src = rotating_buffers(n * 16);
    const int copies = (int)src.size();
    int *sink;
    CHECK(cudaMalloc((void **)&sink, 4));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const double us = time_graph([&](int i) {
        launch_early(CHAINED, read_kernel<CHAINED>, dim3((unsigned)(sms * blocks)), dim3(256), 0, g_stream,
                     (const int4 *)src[i % copies], n, sink);
    });
    for (int i = 0; i < copies; i++) cudaFree(src[i]);
    cudaFree(sink);
    return (double)(n * 16) / (us * 1e-6) / 1e9;
}

typedef void (*launcher_fn)(const coli_weight *, const float *, int64_t, float *, cudaStream_t);

struct variant {
    const char *name;
    int64_t s;
    launcher_fn f32, q8, q4;
    int64_t cols = 0, rows_of = 1; /* the only width it takes (0: any), rows a multiple of rows_of */
};

static float *g_bench_planes; /* x's digits for the mma variants: s * cols floats */
/* Whether the calls timed may read x before they wait for the call before: they may
 * where no kernel writes x, as in the timed loops (each call's x is the same, as
 * the backend's calls' x is its own copy's); the chained checks pass false. */
static bool g_x_ready = true;

template <int FORMAT, int RB, int NS>
static void mma_variant(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    launch_mma<FORMAT, RB, NS>(w, dx, s, g_bench_planes, dy, stream);
}

template <int FORMAT, int R, int D, int KS = 1>
static void decode_variant(const coli_weight *w, const float *dx, int64_t, float *dy, cudaStream_t stream) {
    launch_decode<FORMAT, R, D, KS>(w, dx, g_bench_planes, dy, stream);
}

template <int FORMAT, int R, int D>
static void fused_variant(const coli_weight *w, const float *dx, int64_t, float *dy, cudaStream_t stream) {
    if (w->cols <= FUSED_MAX_COLS) launch_decode_fused<FORMAT, R, D>(w, dx, dy, stream);
    else launch_decode<FORMAT, R, D>(w, dx, g_bench_planes, dy, stream);
}

/* The kernels the backend picks, each call's first kernel launched after the
 * last call has ended (COLI_GPU_CHAIN=0): a call alone, as before chaining. */
static void unchained(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    const int chain = g_chain;
    g_chain = 0;
    (void)launch_matmul(w, dx, s, dy, g_x_ready, stream, g_bench_planes);
    g_chain = chain;
}

/* The kernels the backend picks, each waiting for the call before before it reads
 * x, as in a chain where each call's x is the last one's y. */
static void waiting(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    (void)launch_matmul(w, dx, s, dy, false, stream, g_bench_planes);
}

template <int R, int D, int T>
static void gemv_variant(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    launch_gemv<R, D, T>(w, dx, s, dy, stream);
}

#define GEMV(R, D, T) {"gemv R" #R " D" #D " T" #T, T, gemv_variant<R, D, T>, nullptr, nullptr}
#define MMA(RB, NS, S) {"mma RB" #RB " NS" #NS, S, nullptr, mma_variant<COLI_FMT_Q8, RB, NS>, \
                        mma_variant<COLI_FMT_Q4, RB, NS>}
#define DECODE(R, D) {"decode R" #R " D" #D, 1, nullptr, decode_variant<COLI_FMT_Q8, R, D>, \
                      decode_variant<COLI_FMT_Q4, R, D>}
#define DECODE_KS(R, D, KS) {"decode R" #R " D" #D " KS" #KS, 1, nullptr, decode_variant<COLI_FMT_Q8, R, D, KS>, \
                             decode_variant<COLI_FMT_Q4, R, D, KS>}
#define FUSED(R, D) {"decode fused R" #R " D" #D, 1, nullptr, fused_variant<COLI_FMT_Q8, R, D>, \
                     fused_variant<COLI_FMT_Q4, R, D>}
template <int FORMAT, int R, int D>
static void walk_variant(const coli_weight *w, const float *dx, int64_t, float *dy, cudaStream_t stream) {
    if (decode_pieces<FORMAT>(w) % WARP == 0) launch_decode_walk<FORMAT, R, D>(w, dx, g_bench_planes, dy, stream, decode_walk_per<FORMAT, R, D>(w));
    else launch_decode<FORMAT, R, D>(w, dx, g_bench_planes, dy, stream);
}
#define WALK(R, D) {"decode walk R" #R " D" #D, 1, nullptr, walk_variant<COLI_FMT_Q8, R, D>, walk_variant<COLI_FMT_Q4, R, D>}
/* the bulk kernel's widths, at the rows the table gives it (at least 4096) */
static bool bulk_times(const coli_weight *w) { return decode_bulk_laid(w) && w->cols >= 2048 && w->rows >= 4096; }
template <int FORMAT, bulk_blocks BLOCKS>
static void bulk_variant(const coli_weight *w, const float *dx, int64_t, float *dy, cudaStream_t stream) {
    if (bulk_times(w)) launch_decode_bulk<FORMAT>(w, dx, dy, g_x_ready, stream, BLOCKS);
    else launch_decode<FORMAT, 2, 4>(w, dx, g_bench_planes, dy, stream);
}
#define BULK(NAME, B) {"decode bulk" NAME, 1, nullptr, bulk_variant<COLI_FMT_Q8, B>, bulk_variant<COLI_FMT_Q4, B>}
template <int FORMAT, int WM, int WN, int MT, int NT>
static void gemm_variant(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    launch_gemm<FORMAT, WM, WN, MT, NT>(w, dx, s, g_bench_planes, dy, stream);
}
#define GEMM(WM, WN, MT, NT, S) {"gemm " #WM "x" #WN " warps " #MT "x" #NT, S, nullptr, \
                                 gemm_variant<COLI_FMT_Q8, WM, WN, MT, NT>, gemm_variant<COLI_FMT_Q4, WM, WN, MT, NT>}
template <int FORMAT, int NW, int CH, int RT, int RR, int MINB>
static void dmma_variant(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    if (decode_mma_laid(w) && w->cols == dmma_shape<FORMAT, NW, CH, RT, RR>::cols) {
        if (g_x_ready) launch_decode_mma<FORMAT, NW, CH, RT, RR, MINB, true>(w, dx, dy, stream);
        else launch_decode_mma<FORMAT, NW, CH, RT, RR, MINB, false>(w, dx, dy, stream);
    } else {
        (void)launch_matmul(w, dx, s, dy, g_x_ready, stream, g_bench_planes);
    }
}
/* int8 takes NW * CH * 64 columns (CH >= 4: a lane cuts whole runs of 8), int4 twice as many */
template <int FORMAT, int NW, int CH, int RT, int RR, int MINB> constexpr launcher_fn dmma_fn() {
    if constexpr (FORMAT == COLI_FMT_Q8 && CH < 4) return nullptr;
    else if constexpr (dmma_shape<FORMAT, NW, CH, RT, RR>::shared + dmma_shape<FORMAT, NW, CH, RT, RR>::x_in_bytes > DMMA_SHARED_MAX)
        return nullptr; /* no such block (with x's room: its x_ready form) */
    else return dmma_variant<FORMAT, NW, CH, RT, RR, MINB>;
}
#define DMMA(NW, CH, RT, RR, MINB) {"decode mma W" #NW " C" #CH " T" #RT " R" #RR " M" #MINB, 1, nullptr, \
                                    dmma_fn<COLI_FMT_Q8, NW, CH, RT, RR, MINB>(), dmma_fn<COLI_FMT_Q4, NW, CH, RT, RR, MINB>()}
#define TILE(BM, S) {"tile BM" #BM, S, launch_tile<COLI_FMT_F32, BM>, launch_tile<COLI_FMT_Q8, BM>, \
                     launch_tile<COLI_FMT_Q4, BM>}
/* decode_tiled_kernel in one form: int4 stored tile by tile, its own width only */
template <int NW, int CH, int D, int G, int P, int PRE>
static void tiled_variant(const coli_weight *w, const float *dx, int64_t, float *dy, cudaStream_t stream) {
    launch_decode_tiled<NW, CH, D, G, P, PRE>(w, dx, dy, g_x_ready, stream);
    static bool told = false; /* once (after the launch has raised its shared memory): how many clusters fit at once */
    if (!told && P > 1) {
        told = true;
        cudaLaunchConfig_t config = {};
        cudaLaunchAttribute attr;
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = P, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
        config.gridDim = dim3((unsigned)(w->rows / 32)), config.blockDim = dim3(NW * WARP);
        config.dynamicSmemBytes = dtiled_shape<NW, CH, D, G, P>::shared, config.attrs = &attr, config.numAttrs = 1;
        int n = -1;
        CHECK(cudaOccupancyMaxActiveClusters(&n, (const void *)decode_tiled_kernel<NW, CH, D, G, P, PRE, true>, &config));
        printf("{\"kernel\": \"decode tiled W%d C%d D%d G%d P%d pre%d\", \"clusters_at_once\": %d, \"clusters\": %lld}\n", NW, CH,
               D, G, P, PRE, n, (long long)(w->rows / (32 * P)));
    }
}
#define TILED(NW, CH, D, G, P, PRE) {"decode tiled W" #NW " C" #CH " D" #D " G" #G " P" #P " pre" #PRE, 1, nullptr, nullptr, \
                                     tiled_variant<NW, CH, D, G, P, PRE>, dtiled_shape<NW, CH, D, G, P>::cols, dtiled_shape<NW, CH, D, G, P>::rows}
static const variant VARIANTS[] = {
    GEMV(1, 2, 1), GEMV(2, 2, 1), GEMV(2, 4, 1), GEMV(4, 2, 1),
    {"auto unchained", 1, unchained, unchained, unchained},
    {"auto waiting", 1, waiting, waiting, waiting},
    DECODE(1, 4), DECODE(2, 3), DECODE(2, 4), DECODE(4, 1), DECODE(4, 2),
    FUSED(2, 3), FUSED(2, 4), FUSED(4, 2),
    DECODE_KS(2, 3, 2), DECODE_KS(2, 4, 2), DECODE_KS(2, 2, 2), DECODE_KS(4, 1, 2), DECODE_KS(4, 2, 2), DECODE_KS(4, 2, 4),
    DECODE_KS(3, 2, 2), WALK(2, 3), WALK(2, 4), WALK(2, 2),
    BULK(" one", BULK_ONE), BULK(" two", BULK_TWO),
    GEMV(2, 2, 8), MMA(1, 4, 8), MMA(2, 4, 8), MMA(1, 4, 16), MMA(2, 4, 16), MMA(1, 4, 64), MMA(2, 4, 64),
    MMA(1, 4, 256), MMA(2, 4, 256),
    TILE(32, 64), TILE(64, 64),
    GEMM(2, 4, 2, 2, 32), GEMM(4, 2, 2, 2, 32), GEMM(2, 4, 2, 2, 64), GEMM(4, 2, 2, 2, 64), GEMM(4, 2, 2, 4, 64),
    GEMM(2, 4, 2, 2, 256), GEMM(4, 2, 2, 2, 256), GEMM(4, 2, 2, 4, 256),
    DMMA(16, 4, 2, 1, 2), DMMA(16, 4, 2, 0, 1), DMMA(16, 4, 2, 1, 1), DMMA(16, 4, 2, 2, 1), DMMA(16, 4, 3, 0, 1),
    DMMA(16, 4, 3, 1, 1), DMMA(16, 4, 3, 2, 1), DMMA(16, 4, 4, 2, 1), DMMA(8, 4, 2, 0, 1), DMMA(8, 4, 3, 1, 1),
    DMMA(8, 4, 4, 2, 1), DMMA(12, 4, 2, 0, 1), DMMA(12, 4, 3, 1, 1), DMMA(12, 4, 4, 2, 1), DMMA(16, 2, 2, 0, 1),
    DMMA(12, 2, 2, 0, 1), DMMA(12, 2, 3, 0, 1), DMMA(16, 8, 1, 0, 1), DMMA(16, 4, 1, 0, 1),
    DMMA(16, 2, 2, 1, 1), DMMA(16, 2, 3, 1, 1), DMMA(16, 2, 4, 1, 1), DMMA(16, 2, 4, 2, 1), DMMA(16, 2, 5, 2, 1),
    DMMA(16, 2, 5, 3, 1), DMMA(16, 2, 6, 3, 1), DMMA(12, 2, 3, 1, 1), DMMA(12, 2, 4, 1, 1), DMMA(12, 2, 5, 2, 1),
    DMMA(12, 2, 4, 2, 1), DMMA(16, 2, 4, 0, 1), DMMA(16, 2, 5, 1, 1), DMMA(16, 2, 3, 0, 1), DMMA(16, 2, 6, 2, 1),
    DMMA(16, 4, 4, 1, 1), DMMA(12, 2, 5, 1, 1), DMMA(12, 4, 4, 1, 1),
    /* decode_tiled_kernel (int4 tile by tile): each width's pick, the blocks alone, and the forms the
     * twenty-second pass measured next best; 4096 columns with COLI_BENCH_TILE=1 only */
    TILED(14, 4, 6, 2, 2, 1), TILED(14, 8, 8, 2, 1, 1), TILED(14, 4, 10, 2, 2, 2), TILED(7, 4, 16, 2, 4, 1),
    TILED(12, 4, 12, 4, 2, 1), TILED(12, 8, 8, 2, 1, 1), TILED(12, 4, 8, 2, 2, 2),
    TILED(16, 4, 4, 2, 1, 1), TILED(16, 4, 6, 2, 1, 1), TILED(16, 2, 4, 2, 2, 1),
    TILED(16, 2, 4, 2, 1, 1), TILED(8, 2, 4, 2, 2, 1), TILED(4, 2, 8, 2, 4, 1),
};

/* COLI_BENCH_ONLY=a,b: only the variants whose names contain one of these */
static bool chosen(const char *name) {
    const char *only = getenv("COLI_BENCH_ONLY");
    if (!only || !*only) return true;
    for (const std::string &item : bench_split(only))
        if (!item.empty() && strstr(name, item.c_str())) return true;
    return false;
}

static launcher_fn pick(const variant &v, int format) {
    return format == COLI_FMT_F32 ? v.f32 : format == COLI_FMT_Q8 ? v.q8 : v.q4;
}

static void launch_simple_any(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    switch (w->format) {
    case COLI_FMT_F32: launch_simple<COLI_FMT_F32>(w, dx, s, dy, stream); break;
    case COLI_FMT_Q8: launch_simple<COLI_FMT_Q8>(w, dx, s, dy, stream); break;
    default: launch_simple<COLI_FMT_Q4>(w, dx, s, dy, stream);
    }
}

/* The floor of a chained S = 1 call: launched as decode_bulk_kernel is (a block an
 * SM, as many threads, its shared memory), it waits for the call before, reads x,
 * meets at a barrier and writes its rows of y, and does nothing else. */
__global__ void chain_floor_kernel(const float *__restrict__ x, int64_t cols, float *__restrict__ y, int64_t rows) {
    extern __shared__ float floor_shared[];
    coli_allow_next_grid();
    coli_wait_prior_grid();
    float4 v[8]; /* independent loads, one trip to L2 (x of up to 8 x 4 x blockDim columns) */
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const int64_t c = threadIdx.x + (int64_t)k * blockDim.x;
        v[k] = c < cols / 4 ? COLI_LOAD_FRESH((const float4 *)x + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++) sum += v[k].x + v[k].y + v[k].z + v[k].w;
    floor_shared[threadIdx.x] = sum;
    __syncthreads();
    const int64_t r0 = rows * blockIdx.x / gridDim.x, r1 = rows * (blockIdx.x + 1) / gridDim.x;
    for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) y[r] = floor_shared[(r - r0) % blockDim.x];
}

static double chain_floor_us(int64_t rows, int64_t cols) {
    float *x, *y;
    CHECK(cudaMalloc((void **)&x, (size_t)cols * 4));
    CHECK(cudaMalloc((void **)&y, (size_t)rows * 4));
    CHECK(cudaMemset(x, 0, (size_t)cols * 4));
    const size_t shared = BULK_RING + 16 * 1024;
    CHECK(cudaFuncSetAttribute((const void *)chain_floor_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    const double us = time_graph([&](int) {
        launch_early(true, chain_floor_kernel, dim3((unsigned)sm_count()), dim3(BULK_MAX_THREADS),
                     shared, g_stream, (const float *)x, cols, y, rows);
    });
    cudaFree(x);
    cudaFree(y);
    return us;
}

/* max |a - b| / max |b| over n values; NaN if any value of a is not finite */
static double rel_err(const float *da, const float *db, size_t n) {
    std::vector<float> a(n), b(n);
    CHECK(cudaMemcpy(a.data(), da, n * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(b.data(), db, n * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!std::isfinite(a[i])) return NAN;
        num = std::max(num, (double)std::fabs(a[i] - b[i]));
        den = std::max(den, (double)std::fabs(b[i]));
    }
    return num / den;
}

int main(int argc, char **argv) {
    /* `profile`: each S = 1 matmul once, untimed, for a profiler (ncu -k regex:decode) */
    const bool profile = argc > 1 && strcmp(argv[1], "profile") == 0;
    /* the settings, checked before the GPU is touched; an empty one counts as unset */
    std::vector<bench_shape> shapes = {{4096, 4096}, {4096, 14336}, {14336, 4096}};
    std::vector<std::string> variant_names;
    for (const variant &v : VARIANTS) variant_names.push_back(v.name);
    std::string err = argc > 2 || (argc == 2 && !profile) ? std::string("unknown argument '") + argv[argc - 1] +
                                                               "' (allowed: none, or `profile`)"
                                                         : "";
    if (const char *e = getenv("COLI_BENCH_SHAPES"); err.empty() && e && *e) err = bench_parse_shapes(e, shapes);
    if (const char *e = getenv("COLI_BENCH_ONLY"); err.empty() && e && *e) err = bench_check_only(e, variant_names);
    if (const char *e = getenv("COLI_BENCH_S1"); err.empty() && e && *e) err = bench_check_s1(e);
    if (const char *e = getenv("COLI_BENCH_TILE"); err.empty() && e && *e) err = bench_check_tile(e);
    if (!err.empty()) {
        fprintf(stderr, "gpu_matmul_bench: %s\n", err.c_str());
        return 2;
    }
    CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    const double copy = profile ? 1.0 : memcpy_gbps();
    if (!profile)
        printf("{\"copy_gbps\": %.1f, \"copy_kernel_1gib_gbps\": %.1f}\n", copy, copy_kernel_gbps((size_t)1 << 30));
    const int formats[] = {COLI_FMT_F32, COLI_FMT_Q8, COLI_FMT_Q4};
    const char *names[] = {"f32", "int8", "int4"};
    /* COLI_BENCH_S1=1: decode (S = 1) only, for a quick sweep of its variants */
    const bool s1_only = getenv("COLI_BENCH_S1") && strcmp(getenv("COLI_BENCH_S1"), "1") == 0;
    const bool tile_all = getenv("COLI_BENCH_TILE") && strcmp(getenv("COLI_BENCH_TILE"), "1") == 0;
    const std::vector<int64_t> sizes = s1_only ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 2, 4, 8, 16, 64, 256};
    int failures = 0;
    for (const auto &sh : shapes)
        for (int fi = 0; fi < 3; fi++) {
            coli_weight w;
            memset(&w, 0, sizeof w);
            w.format = formats[fi];
            w.rows = sh[0];
            w.cols = sh[1];
            w.group = w.format == COLI_FMT_Q4 ? 32 : 0;
            /* random data: any order is valid; the tile layout where the backend would choose it */
            const bool tile_forced = tile_all && w.format == COLI_FMT_Q4 && w.rows % 32 == 0 && cc_major() >= 9 &&
                                     !gpu_stores_tile_by_tile(w.format, w.rows, w.cols, w.group); /* the pick would not */
            w.layout = tile_forced || gpu_stores_tile_by_tile(w.format, w.rows, w.cols, w.group) ? TILE_LAYOUT
                       : mma_layout(w.format, w.cols, w.group)             ? MMA_LAYOUT
                                                                           : 0;
            size_t qb, sb;
            coli_weight_sizes(&w, &qb, &sb);
            const double same_copy = profile ? 1.0 : copy_kernel_gbps(qb + sb);
            const double same_read = profile ? 1.0 : read_kernel_gbps(qb + sb);
            if (!profile) { /* the same read, calls overlapping as the matmuls' do: a ceiling for chained calls */
                printf("{\"rows\": %lld, \"cols\": %lld, \"format\": \"%s\", \"read_gbps\": %.1f", (long long)w.rows,
                       (long long)w.cols, names[fi], same_read);
                for (int blocks : {8, 4, 2, 1})
                    printf(", \"read_chained_%d_gbps\": %.1f", blocks, read_kernel_gbps<true>(qb + sb, blocks));
                if (fi == 0 && cc_major() >= 9) printf(", \"chain_floor_us\": %.2f", chain_floor_us(w.rows, w.cols));
                printf("}\n");
            }
            int copies = (int)((size_t)(512u << 20) / qb) + 2; /* rotate over > 512 MiB: far beyond L2 */
            std::vector<coli_weight> ws(copies, w);
            for (int c = 0; c < copies; c++) {
                CHECK(cudaMalloc(&ws[c].q, qb));
                if (w.format == COLI_FMT_F32) fill_floats<<<1024, 256, 0, g_stream>>>((float *)ws[c].q, qb / 4, c, 1.0f, 0.0f);
                else fill_bytes<<<1024, 256, 0, g_stream>>>((uint8_t *)ws[c].q, qb, 7 + c);
                if (sb) {
                    CHECK(cudaMalloc((void **)&ws[c].scale, sb));
                    fill_floats<<<256, 256, 0, g_stream>>>(ws[c].scale, sb / 4, 11 + c, 0.005f, 0.01f);
                }
            }
            const int64_t smax = 256;
            float *x, *y, *ref, *planes;
            CHECK(cudaMalloc((void **)&planes, (size_t)smax * w.cols * 4));
            g_bench_planes = planes;
            CHECK(cudaMalloc((void **)&x, (size_t)smax * w.cols * 4));
            CHECK(cudaMalloc((void **)&y, (size_t)smax * w.rows * 4));
            CHECK(cudaMalloc((void **)&ref, (size_t)smax * w.rows * 4));
            fill_floats<<<1024, 256, 0, g_stream>>>(x, (size_t)smax * w.cols, 5 + fi, 1.0f, 0.0f);
            CHECK(cudaStreamSynchronize(g_stream));
            auto report = [&](const char *kernel, int64_t s, launcher_fn f) {
                /* correctness on copy 0, output poisoned first, then the timing */
                launch_simple_any(&ws[0], x, s, ref, g_stream);
                CHECK(cudaMemsetAsync(y, 0xFF, (size_t)s * w.rows * 4, g_stream)); /* NaN */
                if (f) f(&ws[0], x, s, y, g_stream);
                else CHECK(launch_matmul(&ws[0], x, s, y, g_x_ready, g_stream, planes));
                CHECK(cudaStreamSynchronize(g_stream));
                const double err = rel_err(y, ref, (size_t)s * w.rows);
                const bool ok = err <= 2e-5;
                failures += !ok;
                if (profile) return;
                double us = time_graph([&](int i) {
                    if (f) f(&ws[i % copies], x, s, y, g_stream);
                    else launch_matmul(&ws[i % copies], x, s, y, g_x_ready, g_stream, planes);
                });
                const double bytes = (double)(qb + sb) + (double)s * (w.cols + w.rows) * 4;
                const double gbps = bytes / (us * 1e-6) / 1e9;
                printf("{\"rows\": %lld, \"cols\": %lld, \"s\": %lld, \"format\": \"%s\", \"kernel\": \"%s\", "
                       "\"pick\": \"%s\", \"us\": %.2f, \"gbps\": %.1f, \"of_copy\": %.3f, \"of_same_size_copy\": %.3f, "
                       "\"of_same_size_read\": %.3f, \"tflops\": %.2f, \"rel_err\": %.2e, \"ok\": %s}\n",
                       (long long)w.rows, (long long)w.cols, (long long)s, names[fi], kernel,
                       f ? "" : gpu_pick(&ws[0], s, g_x_ready, true).name, us, gbps, gbps / copy,
                       gbps / same_copy, gbps / same_read, 2.0 * s * w.rows * w.cols / (us * 1e-6) / 1e12, err, ok ? "true" : "false");
                fflush(stdout);
            };
            /* chained calls, each one's x the last one's y (square shapes): the early
             * launches must wait for it; against the simple kernel's chain */
            if (w.rows == w.cols && !profile && !tile_forced)
                for (int64_t s : {(int64_t)1, (int64_t)8, (int64_t)64}) {
                    float *buf[2][2] = {{x, y}, {ref, planes}};
                    float *scratch;
                    CHECK(cudaMalloc((void **)&scratch, (size_t)s * w.cols * 4));
                    /* the kernels picked, and (int8, int4) the decode kernel with its own prep, (int4)
                     * the walking one and (int8, int4, sm_90, up to 4096 columns) the bulk one and, at 4096 columns, the
                     * tensor-core one in a form the pick does not take there */
                    const int paths = s > 1 || w.format == COLI_FMT_F32 || w.layout == TILE_LAYOUT ? 1 : 5;
                    for (int path = 0; path < paths; path++) {
                        if (path == 2 && w.format == COLI_FMT_Q8) continue; /* no walking kernel for int8 */
                        if (path == 4 && !(decode_mma_laid(&w) && w.cols == 4096)) continue; /* 4096 columns only */
                        if (path == 3 && !(cc_major() >= 9 && w.cols % BULK_COLS_PER_WARP == 0 &&
                                           w.cols <= BULK_MAX_WARPS * BULK_COLS_PER_WARP))
                            continue; /* the bulk kernel's widths (8192 x 8192 failed its launch) */
                        for (int simple = 1; simple >= 0; simple--) { /* the simple chain first: the other overwrites x */
                            float *a = buf[simple][0], *b = buf[simple][1];
                            if (simple) CHECK(cudaMemcpyAsync(a, x, (size_t)s * w.cols * 4, cudaMemcpyDeviceToDevice, g_stream));
                            for (int step = 0; step < 8; step++) {
                                const coli_weight *ww = &ws[step % copies];
                                if (simple) launch_simple_any(ww, a, s, b, g_stream);
                                else if (path == 0) CHECK(launch_matmul(ww, a, s, b, false, g_stream, scratch));
                                else if (path == 4 && w.format == COLI_FMT_Q8) launch_decode_mma<COLI_FMT_Q8, 16, 4, 3, 1, 1, false>(ww, a, b, g_stream);
                                else if (path == 4) launch_decode_mma<COLI_FMT_Q4, 16, 2, 3, 1, 1, false>(ww, a, b, g_stream);
                                else if (path == 3 && w.format == COLI_FMT_Q8) launch_decode_bulk<COLI_FMT_Q8>(ww, a, b, false, g_stream, BULK_TWO_IF_FIT);
                                else if (path == 3) launch_decode_bulk<COLI_FMT_Q4>(ww, a, b, false, g_stream, BULK_TWO_IF_FIT);
                                else if (w.format == COLI_FMT_Q8) launch_decode<COLI_FMT_Q8, 2, 2, 2>(ww, a, scratch, b, g_stream);
                                else if (path == 1) launch_decode<COLI_FMT_Q4, 2, 4>(ww, a, scratch, b, g_stream);
                                else launch_decode_walk<COLI_FMT_Q4, 2, 3>(ww, a, scratch, b, g_stream, decode_walk_per<COLI_FMT_Q4, 2, 3>(ww));
                                std::swap(a, b);
                            }
                            buf[simple][0] = a;
                        }
                        CHECK(cudaStreamSynchronize(g_stream));
                        CHECK(cudaGetLastError());
                        const double err = rel_err(buf[0][0], buf[1][0], (size_t)s * w.rows);
                        const bool ok = err <= 1e-4;
                        failures += !ok;
                        printf("{\"rows\": %lld, \"cols\": %lld, \"s\": %lld, \"format\": \"%s\", \"check\": \"8 chained calls%s\", "
                               "\"rel_err\": %.2e, \"ok\": %s}\n",
                               (long long)w.rows, (long long)w.cols, (long long)s, names[fi],
                               path == 0   ? ""
                               : path == 1 ? ", decode with its prep"
                               : path == 2 ? ", decode walk with its prep"
                               : path == 3 ? ", decode bulk"
                                           : ", decode mma",
                               err, ok ? "true" : "false");
                        fill_floats<<<1024, 256, 0, g_stream>>>(x, (size_t)smax * w.cols, 5 + fi, 1.0f, 0.0f); /* x again */
                        buf[0][0] = x, buf[0][1] = y, buf[1][0] = ref, buf[1][1] = planes;
                    }
                    cudaFree(scratch);
                }
            /* calls one after another reading one x (x_ready: each reads it before it waits for
             * the one before) and writing one y: y ends as the last call's */
            if (!profile && !tile_forced) {
                launch_simple_any(&ws[7 % copies], x, 1, ref, g_stream);
                CHECK(cudaMemsetAsync(y, 0xFF, (size_t)w.rows * 4, g_stream)); /* NaN */
                for (int step = 0; step < 8; step++) CHECK(launch_matmul(&ws[step % copies], x, 1, y, true, g_stream, planes));
                CHECK(cudaStreamSynchronize(g_stream));
                const double err = rel_err(y, ref, (size_t)w.rows);
                const bool ok = err <= 2e-5;
                failures += !ok;
                printf("{\"rows\": %lld, \"cols\": %lld, \"s\": 1, \"format\": \"%s\", \"check\": \"8 calls, one x read first, one y\", "
                       "\"rel_err\": %.2e, \"ok\": %s}\n",
                       (long long)w.rows, (long long)w.cols, names[fi], err, ok ? "true" : "false");
            }
            for (int64_t s : sizes)
                if ((!profile || s == 1) && !tile_forced) report("auto", s, nullptr);
            for (const variant &v : VARIANTS) {
                /* the tiled variants read the tile layout, at their own width; the rest (the pick's
                 * "auto" aside) the mma layout, and with COLI_BENCH_TILE=1 they are not timed */
                const bool tiled = strncmp(v.name, "decode tiled", 12) == 0;
                const bool reads = tiled ? w.layout == TILE_LAYOUT && w.cols == v.cols && w.rows % v.rows_of == 0
                                         : w.layout != TILE_LAYOUT || strncmp(v.name, "auto", 4) == 0;
                if (pick(v, w.format) && (!s1_only || v.s == 1) && (!profile || v.s == 1) && chosen(v.name) && reads &&
                    (!tile_all || tiled))
                    report(v.name, v.s, pick(v, w.format));
            }
            for (auto &c : ws) {
                cudaFree(c.q);
                if (c.scale) cudaFree(c.scale);
            }
            cudaFree(x);
            cudaFree(y);
            cudaFree(ref);
            cudaFree(planes);
        }
    fprintf(stderr, "%d variant(s) disagreed with the simple kernel\n", failures);
    return failures ? 1 : 0;
}
