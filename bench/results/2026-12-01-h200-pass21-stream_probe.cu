/* Twenty-first pass (bench/RESULTS.md): how fast do whole rows stream through decode_bulk_kernel's ring when
 * the consumers do no sums? int4 4096 x 14336 and 14336 x 4096 hold the same bytes (36.7 MB with the scales);
 * decode_bulk_kernel takes the second in 10.3 us while every kernel for the first took 12.1 or more. The
 * probe keeps decode_bulk_kernel's producer (one lane, 1-d bulk copies of T whole rows of W and of their
 * scales into a ring of stages, half of them, at most 8, before the wait) and replaces the consumers.
 * This is the form of run 2: NW consumer warps, each taking its slice (row_w / NW bytes) of every row of
 * every stage, as warps that hold x's digits for a slice of the columns must. MODE: 0 no x; 1 x read by
 * every consumer thread (its loads all in flight at once), the ring's rest released once x is in
 * (decode_bulk_kernel's `late`); 2 the same, the rest released at the wait; 3 x brought by one bulk copy of
 * the producer after its own wait, beside the ring. (Run 1 used an earlier form: G single-warp groups that
 * each owned every G-th stage and read 16 bytes a lane of each of its rows; its x step was one unbatched
 * loop of 128 threads.) Calls chained as the bench chains them (a graph of 100 launches, weights rotating
 * over copies past 512 MiB, PDL), against the committed pick in the same binary. From the repo root, after
 * `doit codegen`:
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -Ibuild/gen -Iengine \
 *     bench/results/2026-12-01-h200-pass21-stream_probe.cu -o /tmp/p && /tmp/p */
#include "../../kernels/backend_gpu.cu"
#include "probe_common.cuh"

struct probe_plan {
    int64_t cols, row_w, row_s;
    int ns, t, pre;
    size_t x_at, stage_at;
};

/* NW consumer warps, each taking its slice (row_w / NW bytes) of every row of every
 * stage, as warps that hold x's digits for a slice of the columns must. MODE: 0 no x;
 * 1 x read by every consumer thread (all its loads in flight at once), the ring's
 * rest released once x is in (decode_bulk_kernel's `late`); 2 the same, the rest
 * released at the wait; 3 x brought by one bulk copy of the producer after its own
 * wait, beside the ring, the rest released at once. */
template <int NW, int MODE>
__global__ void __launch_bounds__((NW + 1) * WARP, 1)
    stream_probe(const uint8_t *__restrict__ q, const float *__restrict__ scale, int64_t rows, probe_plan plan,
                 const float *__restrict__ x, float *__restrict__ y) {
    extern __shared__ __align__(128) uint8_t sh[];
    uint64_t *full = (uint64_t *)sh, *empty = full + plan.ns, *go = empty + plan.ns, *xbar = go + 1;
    uint8_t *stages = sh + plan.stage_at;
    const float *xs_sh = (const float *)(sh + plan.x_at);
    coli_allow_next_grid();
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int64_t r0 = rows * blockIdx.x / gridDim.x, r1 = rows * (blockIdx.x + 1) / gridDim.x;
    const int n_rows = (int)(r1 - r0), T = plan.t, n_stages = (n_rows + T - 1) / T;
    const size_t stage_bytes = (size_t)T * (plan.row_w + plan.row_s);
    if (threadIdx.x == 0) {
        for (int b = 0; b < plan.ns; b++) stage_init(&full[b], 1), stage_init(&empty[b], NW);
        stage_init(go, 1), stage_init(xbar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == NW) {
        if (lane == 0)
            for (int s = 0; s < n_stages; s++) {
                const int b = s % plan.ns, k = s / plan.ns, n = min(T, n_rows - s * T);
                if (s == plan.pre) {
                    if (MODE == 3) {
                        coli_wait_prior_grid();
                        stage_expect(xbar, (uint32_t)(plan.cols * 4));
                        stage_copy(sh + plan.x_at, x, (uint32_t)(plan.cols * 4), xbar);
                    } else {
                        stage_wait(go, 0);
                    }
                }
                if (k > 0) stage_wait(&empty[b], (k - 1) & 1);
                uint8_t *st = stages + (size_t)b * stage_bytes;
                const int64_t row = r0 + (int64_t)s * T;
                stage_expect(&full[b], (uint32_t)(n * (plan.row_w + plan.row_s)));
                stage_copy(st, q + row * plan.row_w, (uint32_t)(n * plan.row_w), &full[b]);
                stage_copy(st + T * plan.row_w, (const uint8_t *)scale + row * plan.row_s, (uint32_t)(n * plan.row_s), &full[b]);
            }
        return;
    }
    float xs = 0.0f;
    if (MODE == 3) {
        stage_wait(xbar, 0);
        for (int64_t i = threadIdx.x; i < plan.cols; i += NW * WARP) xs += xs_sh[i];
    } else {
        coli_wait_prior_grid();
        if (MODE == 2 && threadIdx.x == 0) stage_arrive(go);
        if (MODE == 1 || MODE == 2) {
            constexpr int U = 8;
            const int64_t n4 = plan.cols / 4;
            for (int64_t i0 = threadIdx.x; i0 < n4; i0 += U * NW * WARP) {
                float4 v[U];
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int64_t i = i0 + (int64_t)u * NW * WARP;
                    v[u] = i < n4 ? COLI_LOAD_FRESH((const float4 *)x + i) : make_float4(0, 0, 0, 0);
                }
#pragma unroll
                for (int u = 0; u < U; u++) xs += v[u].x + v[u].y + v[u].z + v[u].w;
            }
        }
        asm volatile("bar.sync 2, %0;" ::"r"(NW * WARP) : "memory");
        if (MODE != 2 && threadIdx.x == 0) stage_arrive(go);
    }
    uint32_t acc = 0;
    const int64_t slice = plan.row_w / NW;
    for (int s = 0; s < n_stages; s++) {
        const int b = s % plan.ns;
        stage_wait(&full[b], (s / plan.ns) & 1);
        const uint8_t *st = stages + (size_t)b * stage_bytes;
        for (int r = 0; r < T; r++)
            for (int64_t o = lane * 16; o < slice; o += WARP * 16) acc ^= *(const uint32_t *)(st + r * plan.row_w + warp * slice + o);
        __syncwarp();
        if (lane == 0) stage_arrive(&empty[b]);
    }
    if (lane == 0)
        for (int i = warp; i < n_rows; i += NW) y[r0 + i] = (float)(acc & 0xFF) + xs;
}

template <int NW, int MODE> static void probe(const char *shape, std::vector<coli_weight> &ws, int t, const float *x, float *y) {
    const coli_weight &w = ws[0];
    probe_plan plan;
    plan.cols = w.cols, plan.row_w = w.cols / 2, plan.row_s = w.cols / 32 * 4, plan.t = t;
    const int rows_max = (int)((w.rows + sm_count() - 1) / sm_count()), stages = (rows_max + t - 1) / t;
    const size_t stage_bytes = (size_t)t * (plan.row_w + plan.row_s), ring = 200 * 1024 - (MODE == 3 ? plan.cols * 4 : 0);
    const int fit = (int)(ring / stage_bytes);
    plan.ns = std::min(stages, fit);
    plan.pre = std::min(8, stages / 2);
    const size_t bars = ((size_t)(2 * plan.ns + 2) * 8 + 127) / 128 * 128; /* full, empty, go, x's */
    plan.x_at = bars, plan.stage_at = MODE == 3 ? (bars + plan.cols * 4 + 127) / 128 * 128 : bars;
    const size_t shared = plan.stage_at + plan.ns * stage_bytes;
    auto k = stream_probe<NW, MODE>;
    CHECK(cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    const int copies = (int)ws.size();
    const double us = time_calls([&](int i, cudaStream_t st) {
        launch_early(true, k, dim3((unsigned)sm_count()), dim3((unsigned)((NW + 1) * WARP)), shared, st,
                     (const uint8_t *)ws[i % copies].q, (const float *)ws[i % copies].scale, (int64_t)w.rows, plan, x, y);
    });
    CHECK(cudaGetLastError());
    const double bytes = (double)w.rows * (plan.row_w + plan.row_s);
    printf("%s probe T%d W%d mode %d: stages %d ring %d (%zu KB): %.2f us, %.0f GB/s\n", shape, t, NW, MODE, stages, plan.ns,
           shared / 1024, us, bytes / us * 1e-3);
}

static void shape_run(int64_t rows, int64_t cols) {
    char shape[32];
    snprintf(shape, sizeof shape, "%lldx%lld", (long long)rows, (long long)cols);
    const size_t qb = rows * cols / 2, sb = rows * cols / 32 * 4;
    std::vector<coli_weight> ws = int4_copies(rows, cols, MMA_LAYOUT);
    const int copies = (int)ws.size();
    const probe_io io(rows, cols, 1, cols * 16);
    float *x = io.x, *y = io.y, *planes = io.planes;
    const double pick = time_calls([&](int i, cudaStream_t st) { (void)launch_matmul(&ws[i % copies], x, 1, y, st, planes); });
    printf("%s pick: %.2f us, %.0f GB/s\n", shape, pick, (double)(qb + sb) / pick * 1e-3);
    for (int t : {2, 4, 8}) {
        if (cols == 14336) {
            probe<14, 0>(shape, ws, t, x, y), probe<14, 1>(shape, ws, t, x, y);
            probe<14, 2>(shape, ws, t, x, y), probe<14, 3>(shape, ws, t, x, y);
            probe<7, 2>(shape, ws, t, x, y), probe<7, 3>(shape, ws, t, x, y);
        } else {
            probe<16, 0>(shape, ws, t, x, y), probe<16, 1>(shape, ws, t, x, y);
            probe<16, 2>(shape, ws, t, x, y), probe<16, 3>(shape, ws, t, x, y);
            probe<8, 2>(shape, ws, t, x, y), probe<4, 2>(shape, ws, t, x, y);
        }
    }
    free_copies(ws);
}

int main() {
    CHECK(coli_backend_init(0) == COLI_OK ? cudaSuccess : cudaErrorUnknown);
    shape_run(4096, 14336);
    shape_run(14336, 4096);
    shape_run(4096, 4096);
    shape_run(28672, 2048);
    return 0;
}
