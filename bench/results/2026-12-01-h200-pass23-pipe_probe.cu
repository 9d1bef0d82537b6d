/* Twenty-third pass (bench/RESULTS.md): which plan of loads could take int4 4096 x 4096 at S = 1 past 80%
 * of copy? decode_mma_kernel (3.28 us, 75%) puts a block of 64 rows (160 KB with the scales) on half the
 * SMs, all of it asked for before the wait, so that the next call's blocks load on the other half. Here the
 * sums are taken away: a producer lane brings a block's rows (W, then their scales, as decode_mma_kernel's
 * mma layout lies: both contiguous) by bulk copies of `piece` rows, each on its own mbarrier, and the
 * consumer warps wait for the call before, read all of x (16 KB, every consumer thread its share, all in
 * flight), XOR every word of W that came, optionally spin `spin` ns for the sums, and write the block's
 * rows of y. Plans: blocks a call (64: half the SMs, one each; 128-132: two an SM, so that the next call's
 * block shares the SM), copies in flight at most (`k`), copies before x is in (`pre`; the rest after),
 * a delay before the first copy (`delay` ns). Calls chained as the bench chains them (a graph of 100
 * launches, PDL, weights rotating over copies past 512 MiB), against the pick in the same binary. From the
 * repo root, after `doit codegen`:
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -Ibuild/gen -Iengine \
 *     bench/results/2026-12-01-h200-pass23-pipe_probe.cu -o /tmp/p && /tmp/p */
#include "../../kernels/backend_gpu.cu"
#include "probe_common.cuh"

struct pipe_plan {
    int piece, k, pre, delay, spin, rows_max;
};

__device__ inline uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

#define PIPE_ROW_W 2048 /* 4096 int4 columns */
#define PIPE_ROW_S 512  /* their 128 scales */
#define PIPE_BARS 1024  /* room for 64 pieces' mbarriers and `go` */

template <int NW>
__global__ void __launch_bounds__((NW + 1) * WARP, 1)
    pipe_probe(const uint8_t *__restrict__ q, const float *__restrict__ scale, int64_t rows, pipe_plan plan,
               const float *__restrict__ x, int64_t cols, float *__restrict__ y) {
    extern __shared__ __align__(128) uint8_t sh[];
    uint64_t *full = (uint64_t *)sh, *go = full + 64;
    uint8_t *wsh = sh + PIPE_BARS, *ssh = wsh + (size_t)plan.rows_max * PIPE_ROW_W;
    coli_allow_next_grid();
    const uint64_t t0 = now_ns();
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int64_t r0 = rows * blockIdx.x / gridDim.x, r1 = rows * (blockIdx.x + 1) / gridDim.x;
    const int n_rows = (int)(r1 - r0), pieces = (n_rows + plan.piece - 1) / plan.piece;
    if (threadIdx.x == 0) {
        for (int p = 0; p < pieces; p++) stage_init(&full[p], 1);
        stage_init(go, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == NW) {
        if (lane == 0) {
            while (now_ns() - t0 < (uint64_t)plan.delay) __nanosleep(64);
            for (int p = 0; p < pieces; p++) {
                if (p == plan.pre) stage_wait(go, 0);
                if (p >= plan.k) stage_wait(&full[p - plan.k], 0);
                const int n = min(plan.piece, n_rows - p * plan.piece);
                const int64_t row = r0 + (int64_t)p * plan.piece;
                stage_expect(&full[p], (uint32_t)(n * (PIPE_ROW_W + PIPE_ROW_S)));
                stage_copy(wsh + (size_t)p * plan.piece * PIPE_ROW_W, q + row * PIPE_ROW_W, (uint32_t)(n * PIPE_ROW_W), &full[p]);
                stage_copy(ssh + (size_t)p * plan.piece * PIPE_ROW_S, (const uint8_t *)scale + row * PIPE_ROW_S,
                           (uint32_t)(n * PIPE_ROW_S), &full[p]);
            }
        }
        return;
    }
    coli_wait_prior_grid();
    float xs = 0.0f;
    {
        constexpr int U = 4;
        const int64_t n4 = cols / 4;
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
    asm volatile("bar.sync 1, %0;" ::"r"(NW * WARP) : "memory");
    if (threadIdx.x == 0) stage_arrive(go);
    uint32_t acc = 0;
    for (int p = 0; p < pieces; p++) {
        stage_wait(&full[p], 0);
        const int n = min(plan.piece, n_rows - p * plan.piece);
        const uint8_t *w = wsh + (size_t)p * plan.piece * PIPE_ROW_W, *s = ssh + (size_t)p * plan.piece * PIPE_ROW_S;
        for (int o = threadIdx.x * 16; o < n * PIPE_ROW_W; o += NW * WARP * 16) acc ^= *(const uint32_t *)(w + o);
        for (int o = threadIdx.x * 16; o < n * PIPE_ROW_S; o += NW * WARP * 16) acc ^= *(const uint32_t *)(s + o);
    }
    if (plan.spin) {
        const uint64_t s0 = now_ns();
        while (now_ns() - s0 < (uint64_t)plan.spin) acc = acc * 1664525u + 1013904223u;
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 16);
    if (lane == 0)
        for (int i = warp; i < n_rows; i += NW) y[r0 + i] = (float)(acc & 0xFF) + xs;
}

struct pipe_case {
    const char *name;
    int blocks, piece, k, pre, delay, spin;
    size_t shared_min; /* to hold a block alone on its SM */
};

template <int NW>
static void probe(const pipe_case &c, std::vector<coli_weight> &ws, const float *x, float *y, double copy_gbps) {
    const coli_weight &w = ws[0];
    pipe_plan plan;
    plan.piece = c.piece, plan.k = c.k, plan.pre = c.pre, plan.delay = c.delay, plan.spin = c.spin;
    plan.rows_max = (int)((w.rows + c.blocks - 1) / c.blocks);
    const size_t shared = std::max(c.shared_min, (size_t)PIPE_BARS + (size_t)plan.rows_max * (PIPE_ROW_W + PIPE_ROW_S));
    auto k = pipe_probe<NW>;
    CHECK(cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, (NW + 1) * WARP, shared));
    const int copies = (int)ws.size();
    const double us = time_calls([&](int i, cudaStream_t st) {
        launch_early(true, k, dim3((unsigned)c.blocks), dim3((unsigned)((NW + 1) * WARP)), shared, st,
                     (const uint8_t *)ws[i % copies].q, (const float *)ws[i % copies].scale, (int64_t)w.rows, plan, x,
                     (int64_t)w.cols, y);
    });
    CHECK(cudaGetLastError());
    const double bytes = (double)w.rows * (PIPE_ROW_W + PIPE_ROW_S);
    printf("probe %-22s W%d blocks %3d (%d an SM, %3zu KB) piece %2d k %2d pre %2d delay %4d spin %3d: %.2f us, %.0f GB/s (%.0f%%)\n",
           c.name, NW, c.blocks, per_sm, shared / 1024, c.piece, c.k, c.pre, c.delay, c.spin, us, bytes / us * 1e-3,
           100 * bytes / us * 1e-3 / copy_gbps);
}

int main(int argc, char **argv) {
    const double copy_gbps = argc > 1 ? atof(argv[1]) : 4278.0;
    CHECK(coli_backend_init(0) == COLI_OK ? cudaSuccess : cudaErrorUnknown);
    const int64_t rows = 4096, cols = 4096;
    const size_t qb = rows * cols / 2, sb = rows * cols / 32 * 4;
    std::vector<coli_weight> ws = int4_copies(rows, cols, MMA_LAYOUT);
    const int copies = (int)ws.size();
    const probe_io io(rows, cols, 1, cols * 16);
    float *x = io.x, *y = io.y, *planes = io.planes;
    for (int rep = 0; rep < 2; rep++) {
        const double pick = time_calls([&](int i, cudaStream_t st) { (void)launch_matmul(&ws[i % copies], x, 1, y, st, planes); });
        printf("pick: %.2f us, %.0f GB/s (%.0f%%)\n", pick, (double)(qb + sb) / pick * 1e-3, 100 * (double)(qb + sb) / pick * 1e-3 / copy_gbps);
        const pipe_case cases[] = {
            {"two 128", 128, 16, 64, 64, 0, 0, 0},
            {"two 128 piece8 k1", 128, 8, 1, 64, 0, 0, 0},
            {"two 132 piece8 k1", 132, 8, 1, 64, 0, 0, 0},
            {"two 128 piece4 k1", 128, 4, 1, 64, 0, 0, 0},
            {"two 128 piece6 k1", 128, 6, 1, 64, 0, 0, 0},
            {"two 128 piece10 k1", 128, 10, 1, 64, 0, 0, 0},
            {"two 128 piece12 k1", 128, 12, 1, 64, 0, 0, 0},
            {"two 128 piece16 k1", 128, 16, 1, 64, 0, 0, 0},
            {"two 128 piece6 k2", 128, 6, 2, 64, 0, 0, 0},
            {"two 128 piece8 k1 spin200", 128, 8, 1, 64, 0, 200, 0},
            {"two 128 piece8 k1 spin400", 128, 8, 1, 64, 0, 400, 0},
            {"two 132 piece8 k1 spin300", 132, 8, 1, 64, 0, 300, 0},
            {"two 128 piece8 k1 pre2", 128, 8, 1, 2, 0, 0, 0},
            {"two 128 piece8 k1 pre3", 128, 8, 1, 3, 0, 0, 0},
            {"halves piece8 k1", 64, 8, 1, 64, 0, 0, 0},
            {"halves piece8 k2", 64, 8, 2, 64, 0, 0, 0},
            {"halves piece8 k4", 64, 8, 4, 64, 0, 0, 0},
            {"halves piece4 k4", 64, 4, 4, 64, 0, 0, 0},
            {"halves piece16 k1", 64, 16, 1, 64, 0, 0, 0},
            {"halves piece16 k2", 64, 16, 2, 64, 0, 0, 0},
        };
        for (const pipe_case &c : cases) probe<16>(c, ws, x, y, copy_gbps);
        probe<8>(cases[1], ws, x, y, copy_gbps);
        probe<8>(cases[2], ws, x, y, copy_gbps);
    }
    free_copies(ws);
    return 0;
}
