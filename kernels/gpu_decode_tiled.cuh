/* int4 at S = 1 for wide rows, on sm_90: decode_tiled_kernel. CUDA only.
 *
 * Where a row is too wide for decode_mma_kernel's blocks to hold all of their W
 * (16 rows of 8192 int4 columns with their scales are 80 KB), its sums (x's slice
 * cut into digits once a warp, W's raw bytes on the tensor cores, gpu_decode_mma.cuh)
 * still cost far less than decode_kernel's dp4a. Here each warp streams its items:
 *   - W is stored tile by tile (TILE_LAYOUT, gpu_formats.cuh): an item is a 16-row
 *     tile's 64 bytes of one chunk, 1 KB, and its scales 256 bytes, so a warp's
 *     next G items (its slice of CH chunks, tile by tile) are one bulk copy of W and
 *     one of the scales, counted on the warp's mbarrier for that slot of its ring.
 *     Read where they lie in the mma layout (16 rows a row apart, by tensor maps or
 *     cp.async), the same items came far slower.
 *   - A block has two tiles, one an SM; one copy group of each warp goes out before
 *     the wait for the call before, and the rest only after x's slice has been
 *     asked for, by a bulk copy into the warp's patch: x's 4 bytes a column are a
 *     fifth of a block's bytes at 4096 rows, and behind the whole ring they hold up
 *     the sums.
 *   - At 12288 and 14336 columns the blocks work in clusters of two (P): a cluster
 *     takes four tiles, and each block sums all four over half of every row, so
 *     that it takes in half of x. The two blocks' sums of a row meet in the block
 *     that writes it, through distributed shared memory, in a fixed order. Clusters
 *     of four need 32 at once where 30 fit (two waves); at 8192 columns and below
 *     pairs were slower.
 *   - The warps' sums meet in shared memory in a fixed order (dmma_meet).
 * Which weights are stored so, and which form each width takes, is the dispatch
 * table's (gpu_dispatch.cuh). */
#ifndef COLI_GPU_DECODE_TILED_CUH
#define COLI_GPU_DECODE_TILED_CUH

#include "gpu_decode_bulk.cuh"
#include "gpu_decode_mma.cuh"

#if COLI_HAS_PDL
#define TILED_W 1024 /* an item's W bytes */
#define TILED_S 256  /* and its scales' */

/* A cluster's blocks meet (barrier.cluster): every thread arrives, then waits.
 * Relaxed, the arrival orders nothing; with release, the thread's writes before
 * it are seen by every thread of the cluster after its wait. */
__device__ inline void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
__device__ inline void cluster_arrive_release() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ inline void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

/* v to `at` in the shared memory of the cluster's block `rank` (at: this block's address of the same place) */
__device__ inline void cluster_store(float *at, int rank, float v) {
    uint32_t there;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(there) : "r"((uint32_t)__cvta_generic_to_shared(at)), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(there), "f"(v) : "memory");
}

template <int NW, int CH, int D, int G, int P> struct dtiled_shape {
    /* a cluster of P blocks takes 2 P tiles (32 rows a block, one an SM); block r of
     * it sums every tile over its P-th of the columns, and writes rows 32 r .. of its
     * cluster's from the P blocks' sums (P = 1: two tiles, the whole row) */
    static constexpr int tiles = 2 * P, rows = 32 * P, part_rows = 16 * tiles, chunks = P * NW * CH;
    static constexpr int cols = chunks * 128;
    static constexpr int vpl = CH * 128 / WARP;                                 /* x values a lane cuts */
    static constexpr int groups = tiles * CH / G, ring_groups = D / G;          /* a warp's copy groups; in its ring */
    static constexpr int digit_words = CH * 32 + 4;                             /* as decode_mma_kernel's int4 patch */
    static constexpr size_t slot_group = (size_t)G * (TILED_W + TILED_S);
    static constexpr size_t ring_bytes = (size_t)NW * ring_groups * slot_group;
    /* the slots' mbarriers and x's, rounded so that x's patch after them is 16-byte aligned */
    static constexpr size_t bar_bytes = ((size_t)NW * (ring_groups + 1) * 8 + 15) / 16 * 16;
    static constexpr size_t x_bytes = (size_t)NW * 4 * digit_words * 4;
    static constexpr size_t part_bytes = (size_t)NW * part_rows * 4;
    static constexpr size_t meet_bytes = P > 1 ? (size_t)P * 32 * 4 : 0; /* the P blocks' sums of this block's rows */
    static constexpr size_t shared = ring_bytes + bar_bytes + x_bytes + part_bytes + meet_bytes;
    static_assert(CH % G == 0 && D % G == 0 && ring_groups >= 2 && ring_groups <= groups && vpl % 8 == 0,
                  "whole copy groups of one tile, two at least in flight; lanes cut whole runs of 8 columns");
    static_assert(4 * digit_words * 4 >= vpl * WARP * 4, "x's slice fits the warp's patch it is cut into");
    static_assert(P == 1 || P == 2 || P == 4, "clusters of 1, 2 or 4 blocks");
    /* Block b's warp w: the first of copy group k's G items, where its slice of x
     * starts, and the row its thread j < 32 writes (tests/c/gpu_mma_check.cu checks
     * that these cover every item and row once, each item with its slice of x). */
    __host__ __device__ static int unit(int64_t b, int w) { return (int)(b % P) * NW + w; } /* the warp's CH chunks of a row */
    __host__ __device__ static int64_t item(int64_t b, int w, int k) {
        return (b / P * tiles + k * G / CH) * chunks + unit(b, w) * CH + k * G % CH;
    }
    __host__ __device__ static int x_at(int64_t b, int w) { return unit(b, w) * CH * 128; }
    __host__ __device__ static int64_t out_row(int64_t b, int j) { return b / P * rows + (int)(b % P) * 32 + j; }
};

/* XR: no kernel that may still run writes x (launch_matmul's x_ready): x is asked
 * for first, ahead of the ring, and the wait for the grid before comes only
 * before y is written. */
template <int NW, int CH, int D, int G, int P, int PRE, bool XR>
__global__ void __launch_bounds__(NW * WARP, 1)
    decode_tiled_kernel(const uint8_t *__restrict__ q, const float *__restrict__ scale, int64_t rows,
                        const float *__restrict__ x, float *__restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using shape = dtiled_shape<NW, CH, D, G, P>;
    extern __shared__ __align__(128) uint8_t dtiled_shared[];
    coli_allow_next_grid();
    const int lane = (int)threadIdx.x % WARP, warp = (int)threadIdx.x / WARP, g = lane / 4, t = lane % 4;
    const int rank = (int)blockIdx.x % P;
    uint8_t *ring = dtiled_shared + (size_t)warp * shape::ring_groups * shape::slot_group;
    uint64_t *bar = (uint64_t *)(dtiled_shared + shape::ring_bytes) + warp * (shape::ring_groups + 1), *xbar = bar + shape::ring_groups;
    uint32_t *patch = (uint32_t *)(dtiled_shared + shape::ring_bytes + shape::bar_bytes) + warp * 4 * shape::digit_words;
    if (lane == 0) {
        for (int k = 0; k <= shape::ring_groups; k++) stage_init(&bar[k], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    if constexpr (P > 1) cluster_arrive_relaxed(); /* waited for before the first write to another block */
    auto copy = [&](int k) { /* copy group k: the warp's items G k .. G k + G - 1, of one tile */
        const int slot = k % shape::ring_groups;
        const int64_t item = shape::item(blockIdx.x, warp, k);
        uint8_t *to = ring + slot * shape::slot_group;
        stage_expect(&bar[slot], (uint32_t)shape::slot_group);
        stage_copy(to, q + item * TILED_W, G * TILED_W, &bar[slot]);
        stage_copy(to + G * TILED_W, (const uint8_t *)scale + item * TILED_S, G * TILED_S, &bar[slot]);
    };
    static_assert(PRE >= 0 && PRE <= shape::ring_groups, "copy groups before the wait: at most the ring");
    auto copy_x = [&] { /* the warp's slice of x, into its patch */
        stage_expect(xbar, (uint32_t)(shape::vpl * WARP * 4));
        stage_copy(patch, x + shape::x_at(blockIdx.x, warp), shape::vpl * WARP * 4, xbar);
    };
    if constexpr (XR) {
        if (lane == 0) {
            copy_x();
            for (int k = 0; k < shape::ring_groups; k++) copy(k);
        }
    } else {
        if (lane == 0)
            for (int k = 0; k < PRE; k++) copy(k);
        coli_wait_prior_grid(); /* x is the last call's from here on */
        if (lane == 0) {
            copy_x();
            for (int k = PRE; k < shape::ring_groups; k++) copy(k);
        }
    }
    stage_wait(xbar, 0);
    float v[shape::vpl];
#pragma unroll
    for (int j = 0; j < shape::vpl / 4; j++) {
        const float4 f = ((const float4 *)patch)[lane * (shape::vpl / 4) + j];
        v[4 * j] = f.x, v[4 * j + 1] = f.y, v[4 * j + 2] = f.z, v[4 * j + 3] = f.w;
    }
    __syncwarp(); /* the slice is read before its digits overwrite it */
    const dmma_power e = dmma_slice_power<COLI_FMT_Q4, shape::vpl>(v);
    dmma_put_digits<COLI_FMT_Q4, shape::vpl, shape::digit_words, 4>(v, e, lane, patch);
    __syncwarp();

    float accf[shape::tiles][4] = {};
    const int from[4] = {FLOAT_SUM_BITS, FLOAT_SUM_BITS, FLOAT_SUM_BITS, FLOAT_SUM_BITS};
#pragma unroll
    for (int i = 0; i < shape::tiles; i++)
#pragma unroll 1
        for (int kk = 0; kk < CH / G; kk++) { /* a tile's copy groups: rolled, so that accf stays in registers */
            const int k = i * (CH / G) + kk;
            stage_wait(&bar[k % shape::ring_groups], (uint32_t)(k / shape::ring_groups & 1));
            const uint8_t *slot = ring + k % shape::ring_groups * shape::slot_group;
#pragma unroll
            for (int m = 0; m < G; m++) {
                const int c = kk * G + m;
                uint32_t bq[2][2][2]; /* the chunk's B: pair p, raw bytes' (h = 0) or high nibbles' */
                float base[2][2];     /* 1.5 2^23 and the offsets' share, rows g and g + 8 alike */
                int4 bw[2];
                dmma_b_words(patch + 32 * c, g, t, shape::digit_words, bw);
#pragma unroll
                for (int p = 0; p < 2; p++) {
                    int off[4];
                    dmma_pair_b(bw, p, 0, bq[p][0]), dmma_pair_b(bw, p, 1, bq[p][1]);
                    dmma_offsets(bq[p], off);
                    base[p][0] = dmma_offset_base(off[0]), base[p][1] = dmma_offset_base(off[1]);
                }
                const uint8_t *w_item = slot + m * TILED_W, *s_item = slot + G * TILED_W + m * TILED_S;
                const int4 a0 = *(const int4 *)(w_item + 16 * lane), a1 = *(const int4 *)(w_item + 512 + 16 * lane);
                const float *srow = (const float *)s_item + 4 * g + dmma_pair_group(0, t);
                const float2 s0 = *(const float2 *)srow, s8 = *(const float2 *)(srow + 32);
#pragma unroll
                for (int p = 0; p < 2; p++) { /* groups p and p + 2: lane slot t's half of C is group p + 2 (t / 2) */
                    uint32_t a[4], hi[4];
                    dmma_a<COLI_FMT_Q4>(a0, a1, p, a);
                    dmma_high(a, hi);
                    int d[4];
                    coli_mma_u8s8(d, a, bq[p][0], from);
                    coli_mma_u8s8(d, hi, bq[p][1], d);
                    const float sg = p ? s0.y : s0.x, sg8 = p ? s8.y : s8.x;
#pragma unroll
                    for (int n = 0; n < 4; n++) accf[i][n] = fmaf(dmma_pair_sum(d[n], base[p][n % 2]), n < 2 ? sg : sg8, accf[i][n]);
                }
            }
            if (k + shape::ring_groups < shape::groups) {
                __syncwarp(); /* every lane has read the group's slot */
                if (lane == 0) {
                    asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* those reads before the copy's writes */
                    copy(k + shape::ring_groups);
                }
            }
        }

    float *part = (float *)(dtiled_shared + shape::ring_bytes + shape::bar_bytes + shape::x_bytes);
#pragma unroll
    for (int i = 0; i < shape::tiles; i++) dmma_put_rows<COLI_FMT_Q4>(accf[i], e, t, part, warp * shape::part_rows + 16 * i + g);
    __syncthreads();
    if constexpr (XR) coli_wait_prior_grid(); /* y may be the last call's output, or its x, until here */
    const int j = (int)threadIdx.x;
    const int64_t my_row = shape::out_row(blockIdx.x, j);
    if constexpr (P == 1) {
        if (j < 32 && my_row < rows) y[my_row] = dmma_meet<NW, 32>(part, j) * 0.0625f;
    } else { /* row j's sum over this block's columns, to the block that writes it; then each row's P sums in order */
        float *meet = (float *)(dtiled_shared + shape::ring_bytes + shape::bar_bytes + shape::x_bytes + shape::part_bytes);
        cluster_wait(); /* every block of the cluster has started: its shared memory is there */
        if (j < shape::part_rows) cluster_store(meet + rank * 32 + j % 32, j / 32, dmma_meet<NW, shape::part_rows>(part, j));
        cluster_arrive_release();
        cluster_wait();
        if (j < 32 && my_row < rows) {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < P; k++) s += meet[k * 32 + j];
            y[my_row] = s * 0.0625f;
        }
    }
#else
    (void)q, (void)scale, (void)rows, (void)x, (void)y;
    __trap(); /* launched on sm_90 only (gpu_stores_tile_by_tile) */
#endif
}

template <int NW, int CH, int D, int G, int P, int PRE = 1>
static void launch_decode_tiled(const coli_weight *w, const float *dx, float *dy, bool x_ready, cudaStream_t stream) {
    using shape = dtiled_shape<NW, CH, D, G, P>;
    static_assert(shape::shared <= DMMA_SHARED_MAX, "a block's ring, x's digits and sums fit its shared memory");
    const auto kernel = x_ready ? decode_tiled_kernel<NW, CH, D, G, P, PRE, true> : decode_tiled_kernel<NW, CH, D, G, P, PRE, false>;
    static bool raised[2] = {false, false}; /* each kernel's own */
    launch_wide_blocks(kernel, raised[x_ready], P, dim3((unsigned)(w->rows / shape::rows * P)), NW * WARP, shape::shared, w, dx, dy,
                       stream);
}

#endif

#endif
