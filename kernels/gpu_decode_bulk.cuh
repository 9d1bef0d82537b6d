/* int8 and int4 at S = 1 on sm_90, for tall weights: decode_bulk_kernel. CUDA only.
 *
 * decode_kernel keeps its loads in flight in registers, a ring of runs per warp,
 * and the ring's depth competes with the arithmetic for them. Here the copy engine
 * streams W into shared memory instead:
 *   - A block owns a span of whole rows, which lie side by side in memory, so a
 *     stage of BULK_ROWS (or BULK_TWO_ROWS) rows is one bulk copy for W and one
 *     for int4's scales (cp.async.bulk, counted in bytes on the stage's
 *     mbarrier), issued by one producer lane into a ring of stages as deep as
 *     shared memory allows. Loads in flight hold no registers.
 *   - Consumer warps split a row's columns, 1024 each (int4: one 16-byte piece a
 *     lane and row; int8: two), and hold their lanes' units of x in registers. They
 *     cut x into units themselves, together, into shared memory (no prep kernel, so
 *     a call waits for the call before and for nothing else). BULK_GROUPS groups of
 *     them take turns at the stages (group g stages g, g + 4, ...), so that a
 *     scheduler has several warps at work.
 *   - A stage's rows meet across a warp's lanes in one reduce-scatter and across
 *     the warps, at the end, in shared memory in a fixed order.
 * With a block an SM only some stages are copied before the wait for the call
 * before: a full ring copied early fills the memory system ahead of that call's
 * last loads and delays its end. Half of a block's stages, at most BULK_PRE, go
 * early; the rest as the consumers pass the wait or, where half went early, once
 * they have cut x into units, so that x's loads do not queue behind them. Two
 * blocks an SM copy every stage early: the next call's block, resident beside this
 * one, loads while this one computes.
 * Rows of more than 4096 columns keep the other kernels: 4 warps a row leave no
 * room for the groups. */
#ifndef COLI_GPU_DECODE_BULK_CUH
#define COLI_GPU_DECODE_BULK_CUH

#include "gpu_decode.cuh"

#if COLI_HAS_PDL
#define BULK_COLS_PER_WARP 1024 /* 32 columns a lane */
#define BULK_MAX_WARPS 4        /* warps a row at most (4096 columns) */
#define BULK_ROWS 4             /* rows a stage */
#define BULK_TWO_ROWS 8         /* rows a stage with two blocks an SM, or 2-3 warps a row */
#define BULK_GROUPS 4           /* groups of consumer warps */
#define BULK_PRE 8              /* stages copied before the wait, at most (a block an SM) */
#define BULK_RING (200 * 1024)  /* shared memory for the stages */
#define BULK_MAX_THREADS ((BULK_MAX_WARPS * BULK_GROUPS + 1) * WARP)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800 /* 1024 threads an SM or fewer: two blocks cannot fit */
#define BULK_MIN_BLOCKS(n) 1
#else
#define BULK_MIN_BLOCKS(n) (n)
#endif

__device__ inline uint32_t shared_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* The stage barriers (mbarrier), and the copy engine's bulk copy into a stage (sm_90). */
__device__ inline void stage_init(uint64_t *bar, int count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_addr(bar)), "r"(count) : "memory");
#endif
}
__device__ inline void stage_expect(uint64_t *bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_addr(bar)), "r"(bytes) : "memory");
#endif
}
__device__ inline void stage_arrive(uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_addr(bar)) : "memory");
#endif
}
__device__ inline void stage_wait(uint64_t *bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{\n\t.reg .pred done;\n"
                 "WAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
                 "@!done bra WAIT_%=;\n}" ::"r"(shared_addr(bar)),
                 "r"(parity)
                 : "memory");
#endif
}
__device__ inline void stage_copy(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     shared_addr(dst)),
                 "l"(src), "r"(bytes), "r"(shared_addr(bar))
                 : "memory");
#endif
}

/* A launch's shape, and where its block's shared memory holds what: the barriers
 * (full and empty per stage, then `go`: the consumers are past the wait), each
 * warp's sums of the block's rows, x's units, then the stages (128-byte aligned). */
struct bulk_plan {
    int64_t cols, row_w, row_s; /* a row's columns, and bytes of its W and of its scales */
    int nw, ns, rows_max, t;    /* consumer warps a row (a group), stages, a block's rows at most, rows a stage */
    int pre, late;              /* a block an SM: stages copied before the wait; 1: the rest once x is in units */
    __host__ __device__ size_t part_at() const { return (size_t)(2 * ns + 1) * 8; }
    __host__ __device__ size_t units_at() const { return (part_at() + (size_t)rows_max * nw * 4 + 127) / 128 * 128; }
    __host__ __device__ size_t stage_at() const { return (units_at() + (size_t)cols * 4 + 127) / 128 * 128; }
    __host__ __device__ size_t stage_bytes() const { return (size_t)t * (size_t)(row_w + row_s); }
    __host__ __device__ size_t shared() const { return stage_at() + (size_t)ns * stage_bytes(); }
};

/* v[0..T-1] of every lane -> the warp's sum of row bulk_row<T>(lane) in v[0]: each
 * round a lane keeps half of its rows and takes its partner's half of them. */
template <int T> __device__ inline int bulk_row(int lane) {
    int r = 0;
#pragma unroll
    for (int h = T / 2, o = WARP / 2; h >= 1; h /= 2, o /= 2) r += lane & o ? h : 0;
    return r;
}
template <int T> __device__ inline void bulk_reduce(float (&v)[T], int lane) {
#pragma unroll
    for (int h = T / 2, o = WARP / 2; h >= 1; h /= 2, o /= 2) {
        const bool up = lane & o;
#pragma unroll
        for (int i = 0; i < h; i++) {
            const float keep = up ? v[h + i] : v[i], send = up ? v[i] : v[h + i];
            v[i] = keep + COLI_SHFL_XOR(send, o);
        }
    }
#pragma unroll
    for (int o = WARP / 2 / T; o >= 1; o /= 2) v[0] += COLI_SHFL_XOR(v[0], o);
}

/* XR: no kernel that may still run writes x (launch_matmul's x_ready): x is cut at
 * once, and the wait for the grid before comes only before y is written. */
template <int FORMAT, int MINB, int T, bool XR>
__global__ void __launch_bounds__(BULK_MAX_THREADS, BULK_MIN_BLOCKS(MINB))
    decode_bulk_kernel(const uint8_t *__restrict__ q, const float *__restrict__ scale, int64_t rows, bulk_plan plan,
                       const float *__restrict__ x, float *__restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int P = FORMAT == COLI_FMT_Q8 ? 2 : 1; /* 16-byte pieces a lane and row */
    extern __shared__ __align__(128) uint8_t bulk_shared[];
    uint64_t *full = (uint64_t *)bulk_shared, *empty = full + plan.ns, *go = empty + plan.ns;
    float *part = (float *)(bulk_shared + plan.part_at());
    uint8_t *stages = bulk_shared + plan.stage_at();
    coli_allow_next_grid(); /* the next call's kernels may take free room from here on */
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, consumers = plan.nw * BULK_GROUPS;
    const int64_t r0 = rows * blockIdx.x / gridDim.x, r1 = rows * (blockIdx.x + 1) / gridDim.x;
    const int n_rows = (int)(r1 - r0), n_stages = (n_rows + T - 1) / T;
    const size_t stage_bytes = plan.stage_bytes();
    if (threadIdx.x == 0) {
        for (int b = 0; b < plan.ns; b++) stage_init(&full[b], 1), stage_init(&empty[b], plan.nw * WARP);
        stage_init(go, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == consumers) { /* the producer: W and scales, which no kernel writes */
        if (lane == 0)
            for (int s = 0; s < n_stages; s++) {
                const int b = s % plan.ns, k = s / plan.ns, n = min(T, n_rows - s * T);
                if (MINB == 1 && s == plan.pre) stage_wait(go, 0); /* two blocks an SM: every stage early */
                if (k > 0) stage_wait(&empty[b], (k - 1) & 1);
                uint8_t *st = stages + (size_t)b * stage_bytes;
                const int64_t row = r0 + (int64_t)s * T;
                stage_expect(&full[b], (uint32_t)(n * (plan.row_w + plan.row_s)));
                stage_copy(st, q + row * plan.row_w, (uint32_t)(n * plan.row_w), &full[b]);
                if (plan.row_s)
                    stage_copy(st + T * plan.row_w, (const uint8_t *)scale + row * plan.row_s, (uint32_t)(n * plan.row_s),
                               &full[b]);
            }
        return;
    }
    const int g = warp / plan.nw, w = warp % plan.nw;
    /* int8's row scales, which no kernel writes, read before the wait: read after
     * the sums, they hold up the call's end */
    const float row_scale = FORMAT == COLI_FMT_Q8 && threadIdx.x < n_rows ? scale[r0 + threadIdx.x] : 1.0f;
    if constexpr (!XR) coli_wait_prior_grid(); /* x is the last call's output until here */
    const bool late = MINB == 1 && (XR || plan.late); /* XR: x's loads ahead of the stages past the first */
    if (threadIdx.x == 0 && !late) stage_arrive(go);
    /* x cut into units in shared memory, a run of 8 columns a consumer thread, where
     * decode_kernel's lanes would read them (decode_unit); then each lane takes its own:
     * int4 its piece's 4 words, int8 its 2 pieces' 4 words each */
    float4 *units = (float4 *)(bulk_shared + plan.units_at());
    for (int64_t r = threadIdx.x; r < plan.cols / 8; r += consumers * WARP)
        decode_prep_run<FORMAT>(x, r, plan.cols, FORMAT == COLI_FMT_Q4 ? MMA_LAYOUT : 0, units);
    asm volatile("bar.sync 2, %0;" ::"r"(consumers * WARP) : "memory"); /* the consumers only */
    if (threadIdx.x == 0 && late) stage_arrive(go);
    float4 u[4 * P][FORMAT == COLI_FMT_Q8 ? 1 : 2];
#pragma unroll
    for (int m = 0; m < 4 * P; m++) {
        const int64_t at = ((int64_t)(w * P + m / 4) * WARP) * 4 + m % 4 * WARP + lane;
        u[m][0] = units[at];
        if constexpr (FORMAT == COLI_FMT_Q4) u[m][1] = units[plan.cols / 8 + at];
    }
    for (int s = g; s < n_stages; s += BULK_GROUPS) {
        const int b = s % plan.ns, n = min(T, n_rows - s * T);
        stage_wait(&full[b], (s / plan.ns) & 1);
        const uint8_t *st = stages + (size_t)b * stage_bytes;
        /* every row of the stage, a short last stage's missing ones too (their sums
         * are dropped): no branch between the rows, so their loads go out together */
        int4 piece[T][P];
        float4 sc[T];
#pragma unroll
        for (int r = 0; r < T; r++) {
#pragma unroll
            for (int h = 0; h < P; h++) piece[r][h] = *(const int4 *)(st + r * plan.row_w + ((w * P + h) * WARP + lane) * 16);
            if constexpr (FORMAT == COLI_FMT_Q4)
                sc[r] = *(const float4 *)(st + T * plan.row_w + r * plan.row_s + (w * WARP + lane) / 4 * 16);
        }
        float acc[T];
#pragma unroll
        for (int r = 0; r < T; r++) {
            acc[r] = 0.0f;
#pragma unroll
            for (int h = 0; h < P; h++)
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    const uint32_t word = word_of(piece[r][h], m);
                    if constexpr (FORMAT == COLI_FMT_Q8)
                        acc[r] = fmaf((float)word_dot<FORMAT>(word, u[4 * h + m]), u[4 * h + m][0].w, acc[r]);
                    else
                        acc[r] = fmaf((float)word_dot<FORMAT>(word, u[m]), u[m][1].z * elem(sc[r], m), acc[r]);
                }
        }
        /* the stage's reads are done: the producer may refill it. Every lane arrives with
         * its own reads, so that each lane's release orders them before the refill (one
         * lane for the warp, after __syncwarp, left racecheck reporting the refills
         * racing the other lanes' reads) */
        stage_arrive(&empty[b]);
        bulk_reduce<T>(acc, lane);
        const int r = bulk_row<T>(lane);
        if ((lane & (WARP / T - 1)) == 0 && r < n) part[(s * T + r) * plan.nw + w] = acc[0];
    }
    asm volatile("bar.sync 1, %0;" ::"r"(consumers * WARP) : "memory"); /* the consumers only */
    if constexpr (XR) coli_wait_prior_grid(); /* y may be the last call's output, or its x, until here */
    for (int i = threadIdx.x; i < n_rows; i += consumers * WARP) {
        float v = 0.0f;
        for (int k = 0; k < plan.nw; k++) v += part[i * plan.nw + k];
        y[r0 + i] = FORMAT == COLI_FMT_Q8 ? v * (i == (int)threadIdx.x ? row_scale : scale[r0 + i]) : v;
    }
#else
    (void)q, (void)scale, (void)rows, (void)plan, (void)x, (void)y;
    __trap(); /* launched on sm_90 and later only (the dispatch table) */
#endif
}

/* Whether decode_bulk_kernel can take a weight: sm_90; rows of whole warps' columns,
 * at most 4 warps' (so that 4 groups fit a block); int8, or int4 in the mma layout. */
static inline bool decode_bulk_laid(const coli_weight *w) {
    const bool fits = w->cols % BULK_COLS_PER_WARP == 0 && w->cols <= BULK_MAX_WARPS * BULK_COLS_PER_WARP;
    return fits && (w->format == COLI_FMT_Q8 || w->layout == MMA_LAYOUT) && cc_major() >= 9;
}

/* Shared memory a block may have when two share an SM. */
static size_t bulk_two_shared(void) {
    static int per_sm = -1, reserved = -1;
    const int sm = device_attribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor);
    const int held = device_attribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock);
    return sm / 2 > held ? (size_t)(sm / 2 - held) : 0;
}

template <int FORMAT> static bulk_plan bulk_plan_for(const coli_weight *w, int t, size_t ring) {
    bulk_plan plan;
    plan.cols = w->cols;
    plan.row_w = FORMAT == COLI_FMT_Q8 ? w->cols : w->cols / 2;
    plan.row_s = FORMAT == COLI_FMT_Q8 ? 0 : w->cols / 32 * 4;
    plan.nw = (int)(w->cols / BULK_COLS_PER_WARP);
    plan.rows_max = (int)((w->rows + sm_count() - 1) / sm_count());
    plan.t = t;
    const int stages = (plan.rows_max + t - 1) / t, turn = BULK_GROUPS, fit = (int)(ring / plan.stage_bytes());
    /* a slot that is filled more than once must stay one group's (a whole number of
     * turns): a group that shared it could pass its wait on the phase before the one
     * it wants. One round needs no such rounding. */
    plan.ns = stages <= fit ? stages : std::max(turn, fit / turn * turn);
    plan.pre = std::min(BULK_PRE, stages / 2), plan.late = 2 * plan.pre >= stages; /* a block an SM (MINB 1) */
    return plan;
}

template <int FORMAT, int MINB, int T>
static void launch_bulk_plan(const bulk_plan &plan, const coli_weight *w, const float *dx, float *dy, bool x_ready,
                             cudaStream_t stream) {
    const auto kernel = x_ready ? decode_bulk_kernel<FORMAT, MINB, T, true> : decode_bulk_kernel<FORMAT, MINB, T, false>;
    static bool raised[2] = {false, false}; /* each kernel's own */
    allow_sm_shared(kernel, BULK_RING + 24 * 1024, raised[x_ready]);
    launch_early(chain_calls(), kernel, dim3((unsigned)sm_count()), dim3((unsigned)((plan.nw * BULK_GROUPS + 1) * WARP)),
                 plan.shared(), stream, (const uint8_t *)w->q, (const float *)w->scale, (int64_t)w->rows, plan, dx, dy);
}

/* How many of decode_bulk_kernel's blocks share an SM (the dispatch table's choice):
 * one (the whole ring), two, two only where a block's stages all fit half an SM
 * (then the next call's block becomes resident beside this one and copies its
 * stages while this one runs), or two only where they do not (where they fit, one
 * block with the whole ring reaches its last stages sooner). */
enum bulk_blocks { BULK_ONE, BULK_TWO, BULK_TWO_IF_FIT, BULK_TWO_UNLESS_FIT };

/* decode_bulk_kernel with `blocks` a block an SM or two. Two blocks an SM take 8 rows a
 * stage and copy every stage early; where their stages do not fit half an SM they
 * refill a ring of half an SM. A block alone takes 8 rows a stage where a row has 2
 * warps (2048 columns; int4: or 3) and that gives each group at least 3 stages: a stage
 * then holds as much work for each warp as 4 rows do at 4096 columns, with twice the
 * independent sums in flight and half the barrier round trips for the bytes; with
 * fewer stages a group, or more warps a row, 4 rows a stage. */
template <int FORMAT>
static void launch_decode_bulk(const coli_weight *w, const float *dx, float *dy, bool x_ready, cudaStream_t stream,
                               bulk_blocks blocks) {
    bulk_plan two = bulk_plan_for<FORMAT>(w, BULK_TWO_ROWS, BULK_RING); /* every stage, if the ring holds them */
    const bool fits = two.shared() <= bulk_two_shared() && (int64_t)two.ns * two.t >= two.rows_max &&
                      two.ns <= 2 * BULK_GROUPS;
    const bool pair = blocks == BULK_TWO || (blocks == BULK_TWO_IF_FIT && fits) || (blocks == BULK_TWO_UNLESS_FIT && !fits);
    /* two, not fitting: as many stages as half an SM holds, but at least a turn of the
     * groups (a slot must stay one group's), so where a turn does not fit (int8 at 4096
     * columns: 4 stages, 145 KB) the block takes a whole SM */
    if (pair && !fits)
        two = bulk_plan_for<FORMAT>(w, BULK_TWO_ROWS, bulk_two_shared() - std::min(bulk_two_shared(), two.stage_at()));
    if (pair)
        launch_bulk_plan<FORMAT, 2, BULK_TWO_ROWS>(two, w, dx, dy, x_ready, stream);
    else if ((two.nw == 2 || (FORMAT == COLI_FMT_Q4 && two.nw == 3)) &&
             (two.rows_max + BULK_TWO_ROWS - 1) / BULK_TWO_ROWS >= 3 * BULK_GROUPS)
        launch_bulk_plan<FORMAT, 1, BULK_TWO_ROWS>(two, w, dx, dy, x_ready, stream); /* 8 rows, the whole ring */
    else
        launch_bulk_plan<FORMAT, 1, BULK_ROWS>(bulk_plan_for<FORMAT>(w, BULK_ROWS, BULK_RING), w, dx, dy, x_ready, stream);
}
#endif

#endif
