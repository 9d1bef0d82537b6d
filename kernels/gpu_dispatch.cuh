/* Which kernel, in which launch shape, serves a matmul call: one table, read top
 * to bottom, the first row whose conditions hold taking the call; the last row
 * (the simple kernel) takes any call. Included by backend_gpu.cu and by
 * bench/gpu_matmul_bench.cu, which prints each shape's pick (its row's name)
 * beside the fastest variant it timed.
 *
 * The kernels, by header:
 *   gpu_decode.cuh      int8 and int4, S = 1, any GPU: x cut into int8 digits
 *                       that W meets in exact integer dot products (dp4a)
 *   gpu_decode_bulk.cuh the same sums for tall weights on sm_90, W streamed into
 *                       shared memory by the copy engine
 *   gpu_decode_mma.cuh  S = 1 on the tensor cores, sm_90
 *   gpu_decode_tiled.cuh int4 S = 1 of wide rows stored tile by tile, sm_90
 *   gpu_mma.cuh         int8 and int4, S = 2 to 16, on the tensor cores
 *   gpu_gemm.cuh        int8 and int4 past 16 tokens, on the tensor cores
 *   gpu_gemv.cuh        f32 up to 16 tokens: a read of W once per 8 tokens; one token
 *                       of few rows with all of W loaded before the wait
 *   gpu_tile.cuh        past 16 tokens what the tensor cores do not take
 *   gpu_simple.cuh      any call; the reference the bench checks against
 *
 * A row names the kernel and its launch shape (template arguments: the names are
 * the bench's variant names), the formats it serves, and when it applies: the
 * weight's layout (int4 in the ABI's order, in the mma layout, or tile by tile),
 * tokens, columns, rows, rows per SM (ceil(rows / SMs): how full a call leaves
 * the GPU), rows x columns, whether the call may read x before it waits for the
 * call before (x_ready), the device (sm_90 for the kernels that use its copy
 * engine, clusters and early launches), whether the caller gave scratch for x's
 * digits, and whether blocks of a size would leave SMs idle. The cut-offs were
 * measured on the H200 (132 SMs; bench/RESULTS.md says why each kernel and cut-off
 * exists); a GPU with other SMs takes the same rows-per-SM cut-offs.
 *
 * COLI_GPU_SIMPLE=1 sends every call to the last row, for comparisons. */
#ifndef COLI_GPU_DISPATCH_CUH
#define COLI_GPU_DISPATCH_CUH

#include <stdint.h>

#include "gpu_decode_tiled.cuh"
#include "gpu_gemm.cuh"
#include "gpu_gemv.cuh"
#include "gpu_simple.cuh"
#include "gpu_tile.cuh"

/* One kernel in one launch shape. `planes`: device scratch of s x cols floats for
 * x's digits, or NULL. */
typedef void (*gpu_launcher)(const coli_weight *w, const float *dx, int64_t s, float *planes, float *dy, bool x_ready,
                             cudaStream_t stream);

/* ---- Each kernel's launch as a gpu_launcher ------------------------------------------- */
template <int FORMAT>
static void run_simple(const coli_weight *w, const float *dx, int64_t s, float *, float *dy, bool, cudaStream_t stream) {
    launch_simple<FORMAT>(w, dx, s, dy, stream);
}
template <int R, int D, int T>
static void run_gemv(const coli_weight *w, const float *dx, int64_t s, float *, float *dy, bool, cudaStream_t stream) {
    launch_gemv<R, D, T>(w, dx, s, dy, stream);
}
static void run_gemv_held(const coli_weight *w, const float *dx, int64_t, float *, float *dy, bool, cudaStream_t stream) {
    launch_gemv_held(w, dx, dy, stream);
}
template <int R, int D>
static void run_gemv_tokens(const coli_weight *w, const float *dx, int64_t s, float *, float *dy, bool, cudaStream_t stream) {
    launch_gemv_tokens<R, D>(w, dx, s, dy, stream);
}
template <int FORMAT, int BM>
static void run_tile(const coli_weight *w, const float *dx, int64_t s, float *, float *dy, bool, cudaStream_t stream) {
    launch_tile<FORMAT, BM>(w, dx, s, dy, stream);
}
template <int FORMAT, int R, int D, int KS>
static void run_decode(const coli_weight *w, const float *dx, int64_t, float *planes, float *dy, bool, cudaStream_t stream) {
    launch_decode<FORMAT, R, D, KS>(w, dx, planes, dy, stream);
}
template <int FORMAT, int R, int D>
static void run_fused(const coli_weight *w, const float *dx, int64_t, float *, float *dy, bool, cudaStream_t stream) {
    launch_decode_fused<FORMAT, R, D>(w, dx, dy, stream);
}
template <int FORMAT, int R, int D>
static void run_walk(const coli_weight *w, const float *dx, int64_t, float *planes, float *dy, bool, cudaStream_t stream) {
    launch_decode_walk<FORMAT, R, D>(w, dx, planes, dy, stream, decode_walk_per<FORMAT, R, D>(w));
}
/* decode_walk_kernel helps where a weight has more groups of rows than the GPU holds warps at once */
template <int FORMAT, int R, int D> static bool walk_helps(const coli_weight *w) { return decode_walk_per<FORMAT, R, D>(w) > 1; }
template <int FORMAT, int RB, int NS>
static void run_mma(const coli_weight *w, const float *dx, int64_t s, float *planes, float *dy, bool, cudaStream_t stream) {
    launch_mma<FORMAT, RB, NS>(w, dx, s, planes, dy, stream);
}
template <int FORMAT, int WM, int WN, int MT, int NT>
static void run_gemm(const coli_weight *w, const float *dx, int64_t s, float *planes, float *dy, bool, cudaStream_t stream) {
    launch_gemm<FORMAT, WM, WN, MT, NT>(w, dx, s, planes, dy, stream);
}
#if COLI_HAS_PDL
/* READY: the calls its row takes (1 x_ready, 0 waiting, -1 either); only those forms are
 * compiled, each a kernel of its own (S1_MMA ties the row's condition to it) */
template <int FORMAT, int NW, int CH, int RT, int RR, int READY>
static void run_decode_mma(const coli_weight *w, const float *dx, int64_t, float *, float *dy, bool x_ready,
                           cudaStream_t stream) {
    if constexpr (READY != 0) {
        if (x_ready) return launch_decode_mma<FORMAT, NW, CH, RT, RR, 1, true>(w, dx, dy, stream);
    }
    if constexpr (READY != 1) launch_decode_mma<FORMAT, NW, CH, RT, RR, 1, false>(w, dx, dy, stream);
}
template <int FORMAT, bulk_blocks BLOCKS>
static void run_bulk(const coli_weight *w, const float *dx, int64_t, float *, float *dy, bool x_ready, cudaStream_t stream) {
    launch_decode_bulk<FORMAT>(w, dx, dy, x_ready, stream, BLOCKS);
}
template <int NW, int CH, int D, int G, int P>
static void run_tiled(const coli_weight *w, const float *dx, int64_t, float *, float *dy, bool x_ready, cudaStream_t stream) {
    launch_decode_tiled<NW, CH, D, G, P>(w, dx, dy, x_ready, stream);
}
#endif

/* ---- The rows --------------------------------------------------------------------------- */
enum { LAID_ABI = 1, LAID_MMA = 2, LAID_TILE = 4 }; /* the weight's layout: w->layout 0, MMA_LAYOUT, TILE_LAYOUT */
#define GPU_ANY_SIZE INT64_MAX

struct gpu_rule {
    const char *name;
    gpu_launcher f32, q8, q4; /* the formats it serves (NULL: not that one) */
    int layouts = LAID_ABI | LAID_MMA | LAID_TILE;
    int64_t s_lo = 1, s_hi = GPU_ANY_SIZE;
    int64_t cols_lo = 1, cols_hi = GPU_ANY_SIZE, cols_of = 1; /* columns in [lo, hi], a multiple of cols_of */
    int64_t rows_lo = 1, rows_of = 1;                          /* at least rows_lo rows, a multiple of rows_of */
    int64_t per_sm_hi = GPU_ANY_SIZE;                          /* rows per SM, at most */
    int64_t elems_hi = GPU_ANY_SIZE;                           /* rows x columns, at most */
    int x_ready = -1;                                          /* 1: x_ready calls only; 0: waiting calls only */
    bool sm90 = false, digits = false;                         /* needs sm_90; needs scratch for x's digits */
    int64_t under_rows = 0, under_tokens = 0; /* while blocks of these rows x tokens are fewer than the SMs */
    bool (*also)(const coli_weight *) = nullptr;              /* a condition the kernel computes */

    constexpr gpu_rule(const char *n, gpu_launcher a, gpu_launcher b, gpu_launcher c) : name(n), f32(a), q8(b), q4(c) {}
    constexpr gpu_rule laid(int l) const { gpu_rule r = *this; r.layouts = l; return r; }
    constexpr gpu_rule tokens(int64_t lo, int64_t hi) const { gpu_rule r = *this; r.s_lo = lo, r.s_hi = hi; return r; }
    constexpr gpu_rule cols(int64_t lo, int64_t hi, int64_t of = 1) const {
        gpu_rule r = *this; r.cols_lo = lo, r.cols_hi = hi, r.cols_of = of; return r;
    }
    constexpr gpu_rule width(int64_t c) const { return cols(c, c); }
    constexpr gpu_rule rows(int64_t lo, int64_t of = 1) const { gpu_rule r = *this; r.rows_lo = lo, r.rows_of = of; return r; }
    constexpr gpu_rule per_sm(int64_t hi) const { gpu_rule r = *this; r.per_sm_hi = hi; return r; }
    constexpr gpu_rule elems(int64_t hi) const { gpu_rule r = *this; r.elems_hi = hi; return r; }
    constexpr gpu_rule ready(int x) const { gpu_rule r = *this; r.x_ready = x; return r; } /* -1: either */
    constexpr gpu_rule on_sm90() const { gpu_rule r = *this; r.sm90 = true; return r; }
    constexpr gpu_rule with_digits() const { gpu_rule r = *this; r.digits = true; return r; }
    constexpr gpu_rule under(int64_t rows_a_block, int64_t tokens_a_block) const {
        gpu_rule r = *this; r.under_rows = rows_a_block, r.under_tokens = tokens_a_block; return r;
    }
    constexpr gpu_rule when(bool (*f)(const coli_weight *)) const { gpu_rule r = *this; r.also = f; return r; }
    gpu_launcher launcher(int32_t format) const { return format == COLI_FMT_F32 ? f32 : format == COLI_FMT_Q8 ? q8 : q4; }
};

/* The formats' short names in the rows. */
#define F32 COLI_FMT_F32
#define Q8 COLI_FMT_Q8
#define Q4 COLI_FMT_Q4
#define INT8(name, f) gpu_rule(name, nullptr, f, nullptr)
#define INT4(name, f) gpu_rule(name, nullptr, nullptr, f)
/* int8 rows for decode_kernel and the tensor cores: whole 16-byte pieces; int4 in the mma layout */
#define S1_INT8(name, f) INT8(name, f).tokens(1, 1).cols(16, GPU_ANY_SIZE, 16).with_digits() /* widths below: multiples of 16 */
#define S1_INT4(name, f) INT4(name, f).tokens(1, 1).laid(LAID_MMA).with_digits()
/* decode_mma_kernel's rows, named by their template arguments, for the calls READY names */
#define S1_Q8 S1_INT8
#define S1_Q4 S1_INT4
#define S1_MMA(F, NW, CH, RT, RR, READY)                                                                            \
    S1_##F("decode mma W" #NW " C" #CH " T" #RT " R" #RR " M1", (run_decode_mma<F, NW, CH, RT, RR, READY>)).ready(READY)

static const gpu_rule GPU_RULES[] = {
#if COLI_HAS_PDL
    /* int4 stored tile by tile, S = 1: decode_tiled_kernel; at 12288 and 14336 columns clusters of
     * two blocks, each half of every row, where the rows are whole clusters */
    INT4("decode tiled W16 C4 D4 G2 P1 pre1", (run_tiled<16, 4, 4, 2, 1>)).laid(LAID_TILE).tokens(1, 1).width(8192).on_sm90().with_digits(),
    INT4("decode tiled W12 C4 D12 G4 P2 pre1", (run_tiled<12, 4, 12, 4, 2>)).laid(LAID_TILE).tokens(1, 1).width(12288).rows(1, 64).on_sm90().with_digits(),
    INT4("decode tiled W12 C8 D8 G2 P1 pre1", (run_tiled<12, 8, 8, 2, 1>)).laid(LAID_TILE).tokens(1, 1).width(12288).on_sm90().with_digits(),
    INT4("decode tiled W14 C4 D6 G2 P2 pre1", (run_tiled<14, 4, 6, 2, 2>)).laid(LAID_TILE).tokens(1, 1).width(14336).rows(1, 64).on_sm90().with_digits(),
    INT4("decode tiled W14 C8 D8 G2 P1 pre1", (run_tiled<14, 8, 8, 2, 1>)).laid(LAID_TILE).tokens(1, 1).width(14336).on_sm90().with_digits(),

    /* S = 1 on the tensor cores, decode_mma_kernel, where its blocks leave room: 8192 columns,
     * either kind of call */
    S1_MMA(Q8, 16, 8, 2, 1, -1).width(8192).per_sm(8).on_sm90(),
    S1_MMA(Q8, 16, 8, 1, 0, -1).width(8192).per_sm(12).on_sm90(),
    S1_MMA(Q4, 16, 4, 1, 0, -1).width(8192).per_sm(12).on_sm90(),
    S1_MMA(Q4, 16, 4, 2, 1, -1).width(8192).per_sm(16).on_sm90(),
    /* x_ready: blocks of about a third of the SMs a call, so that three calls load at once */
    S1_MMA(Q8, 8, 4, 2, 2, 1).width(2048).per_sm(8).on_sm90(),
    S1_MMA(Q8, 8, 4, 3, 1, 1).width(2048).per_sm(24).on_sm90(),
    S1_MMA(Q8, 12, 4, 4, 1, 1).width(3072).per_sm(40).on_sm90(),
    S1_MMA(Q4, 12, 2, 5, 1, 1).width(3072).per_sm(32).on_sm90(),
    S1_MMA(Q8, 16, 4, 3, 1, 1).width(4096).per_sm(48).on_sm90(),
    S1_MMA(Q4, 16, 2, 6, 2, 1).width(4096).per_sm(48).on_sm90(),
    /* waiting calls: blocks over about half the SMs (16 rows an SM a tile of 16 rows), so the next
     * call's blocks start at once on the other half; int8 half a block's W in registers (all of it
     * where the blocks are a quarter of the SMs or fewer), int4 one tile up to 3, then half */
    S1_MMA(Q8, 8, 4, 2, 2, 0).width(2048).per_sm(8).on_sm90(),
    S1_MMA(Q8, 8, 4, 2, 1, 0).width(2048).per_sm(16).on_sm90(),
    S1_MMA(Q8, 8, 4, 3, 1, 0).width(2048).per_sm(24).on_sm90(),
    S1_MMA(Q8, 12, 4, 2, 2, 0).width(3072).per_sm(8).on_sm90(),
    S1_MMA(Q8, 12, 4, 2, 1, 0).width(3072).per_sm(16).on_sm90(),
    S1_MMA(Q8, 12, 4, 3, 1, 0).width(3072).per_sm(24).on_sm90(),
    S1_MMA(Q8, 12, 4, 4, 2, 0).width(3072).per_sm(48).on_sm90(),
    S1_MMA(Q4, 12, 2, 2, 1, 0).width(3072).per_sm(16).on_sm90(),
    S1_MMA(Q4, 12, 2, 3, 1, 0).width(3072).per_sm(24).on_sm90(),
    S1_MMA(Q4, 12, 2, 4, 1, 0).width(3072).per_sm(32).on_sm90(),
    S1_MMA(Q8, 16, 4, 2, 2, 0).width(4096).per_sm(8).on_sm90(),
    S1_MMA(Q8, 16, 4, 2, 1, 0).width(4096).per_sm(16).on_sm90(),
    S1_MMA(Q8, 16, 4, 3, 1, 0).width(4096).per_sm(24).on_sm90(),
    S1_MMA(Q8, 16, 4, 4, 2, 0).width(4096).per_sm(48).on_sm90(),
    S1_MMA(Q4, 16, 2, 2, 1, 0).width(4096).per_sm(16).on_sm90(),
    S1_MMA(Q4, 16, 2, 3, 1, 0).width(4096).per_sm(24).on_sm90(),
    S1_MMA(Q4, 16, 2, 4, 2, 0).width(4096).per_sm(32).on_sm90(),
    S1_MMA(Q4, 16, 2, 5, 2, 0).width(4096).per_sm(40).on_sm90(),
    S1_MMA(Q4, 16, 2, 6, 3, 0).width(4096).per_sm(48).on_sm90(),

    /* S = 1, tall weights of 2048-4096 columns: decode_bulk_kernel, W streamed by the copy engine;
     * x_ready: int4 two blocks an SM, int8 two where a block's stages do not fit half an SM up to
     * 3072 columns and 128 rows an SM, else one; waiting calls two where the stages fit */
    S1_INT4("decode bulk two", (run_bulk<Q4, BULK_TWO>)).cols(2048, 4096, 1024).rows(4096).ready(true).on_sm90(),
    S1_INT8("decode bulk two unless fit", (run_bulk<Q8, BULK_TWO_UNLESS_FIT>)).cols(2048, 3072, 1024).rows(4096).per_sm(128).ready(true).on_sm90(),
    S1_INT8("decode bulk one", (run_bulk<Q8, BULK_ONE>)).cols(2048, 4096, 1024).rows(4096).ready(true).on_sm90(),
    S1_INT8("decode bulk two if fit", (run_bulk<Q8, BULK_TWO_IF_FIT>)).cols(2048, 4096, 1024).rows(4096).ready(false).on_sm90(),
    S1_INT4("decode bulk two if fit", (run_bulk<Q4, BULK_TWO_IF_FIT>)).cols(2048, 4096, 1024).rows(4096).ready(false).on_sm90(),
#endif

    /* S = 1 anywhere: decode_kernel; up to 4096 x 4096 with x cut by every block (FUSED: the prep
     * kernel's launch and the wait for it cost more there), where x's units fit 48 KiB */
    S1_INT8("decode fused R2 D4", (run_fused<Q8, 2, 4>)).cols(16, FUSED_MAX_COLS, 16).elems((int64_t)1 << 24),
    S1_INT4("decode fused R2 D3", (run_fused<Q4, 2, 3>)).cols(1, FUSED_MAX_COLS).elems((int64_t)1 << 24),
    S1_INT8("decode R4 D1 KS2", (run_decode<Q8, 4, 1, 2>)).rows(8192),
    S1_INT8("decode R2 D2 KS2", (run_decode<Q8, 2, 2, 2>)),
    S1_INT4("decode walk R2 D3", (run_walk<Q4, 2, 3>)).cols(1, GPU_ANY_SIZE, 1024).when(walk_helps<Q4, 2, 3>),
    S1_INT4("decode R2 D4", (run_decode<Q4, 2, 4, 1>)),

    /* S > 16: gemm_kernel on the tensor cores. int8: blocks of 128 rows x 32 tokens while blocks of
     * 64 x 64 would leave SMs idle, else 64 x 64; int4: 128 x 32 while those leave SMs idle, else
     * 128 x 64 */
    INT8("gemm 4x2 warps 2x2", (run_gemm<Q8, 4, 2, 2, 2>)).tokens(17, GPU_ANY_SIZE).cols(64, GPU_ANY_SIZE, 64).laid(LAID_ABI).with_digits().under(64, 64),
    INT8("gemm 2x4 warps 2x2", (run_gemm<Q8, 2, 4, 2, 2>)).tokens(17, GPU_ANY_SIZE).cols(64, GPU_ANY_SIZE, 64).laid(LAID_ABI).with_digits(),
    INT4("gemm 4x2 warps 2x2", (run_gemm<Q4, 4, 2, 2, 2>)).tokens(17, GPU_ANY_SIZE).laid(LAID_MMA | LAID_TILE).with_digits().under(128, 32),
#if COLI_HAS_PDL
    INT4("gemm 4x2 warps 2x4", (run_gemm<Q4, 4, 2, 2, 4>)).tokens(17, GPU_ANY_SIZE).laid(LAID_MMA | LAID_TILE).with_digits(),
#else /* two stages of 128 x 64 overfill AMD's 64 KiB */
    INT4("gemm 4x2 warps 2x2", (run_gemm<Q4, 4, 2, 2, 2>)).tokens(17, GPU_ANY_SIZE).laid(LAID_MMA | LAID_TILE).with_digits(),
#endif
    /* S = 2 to 16: mma_kernel, 32 rows a block for int8 past 8 tokens and int4 from 5 */
    INT8("mma RB2 NS4", (run_mma<Q8, 2, 4>)).tokens(9, 16).cols(64, GPU_ANY_SIZE, 64).laid(LAID_ABI).with_digits(),
    INT8("mma RB1 NS4", (run_mma<Q8, 1, 4>)).tokens(1, 16).cols(64, GPU_ANY_SIZE, 64).laid(LAID_ABI).with_digits(),
#if COLI_HAS_PDL
    INT4("mma RB2 NS4", (run_mma<Q4, 2, 4>)).tokens(5, 16).laid(LAID_MMA | LAID_TILE).with_digits(),
#else /* int4's 32 rows overfill AMD's 64 KiB */
    INT4("mma RB1 NS4", (run_mma<Q4, 1, 4>)).tokens(5, 16).laid(LAID_MMA | LAID_TILE).with_digits(),
#endif
    INT4("mma RB1 NS4", (run_mma<Q4, 1, 4>)).tokens(1, 16).laid(LAID_MMA | LAID_TILE).with_digits(),

    /* S > 16, what the tensor cores do not take: register tiles, half-height while full ones would
     * leave SMs idle */
    gpu_rule("tile BM32", run_tile<F32, 32>, run_tile<Q8, 32>, run_tile<Q4, 32>)
        .tokens(17, GPU_ANY_SIZE).cols(TILE_K, GPU_ANY_SIZE, TILE_K).laid(LAID_ABI | LAID_MMA).under(64, TILE_N),
    gpu_rule("tile BM64", run_tile<F32, 64>, run_tile<Q8, 64>, run_tile<Q4, 64>)
        .tokens(17, GPU_ANY_SIZE).cols(TILE_K, GPU_ANY_SIZE, TILE_K).laid(LAID_ABI | LAID_MMA),
    /* f32, S = 1, up to 4096 columns and 2^21 values: all of W in registers before the wait */
    gpu_rule("gemv held", run_gemv_held, nullptr, nullptr).tokens(1, 1).cols(4, GEMV_HELD_COLS, 4).elems((int64_t)1 << 21),
    /* f32: a warp owns 2 rows, bound by reading W once per pass of up to 8 tokens */
    gpu_rule("gemv R2 D4 T1", (run_gemv<2, 4, 1>), nullptr, nullptr).tokens(1, 1).cols(4, GPU_ANY_SIZE, 4),
    gpu_rule("gemv R2 D2", (run_gemv_tokens<2, 2>), nullptr, nullptr).cols(4, GPU_ANY_SIZE, 4),

    /* any call */
    gpu_rule("simple", run_simple<F32>, run_simple<Q8>, run_simple<Q4>),
};
#undef F32
#undef Q8
#undef Q4
#undef INT8
#undef INT4
#undef S1_INT8
#undef S1_INT4
#undef S1_Q8
#undef S1_Q4
#undef S1_MMA

enum { GPU_NRULES = (int)(sizeof GPU_RULES / sizeof GPU_RULES[0]) };

static bool gpu_sm90(void) {
#if COLI_HAS_PDL
    return cc_major() >= 9;
#else
    return false;
#endif
}

/* COLI_GPU_SIMPLE=1: the simple kernel only, and weights in the ABI's order, for comparisons. */
static bool simple_only(void) {
    static int simple = -1;
    if (simple < 0) simple = getenv("COLI_GPU_SIMPLE") != NULL;
    return simple != 0;
}

static bool gpu_rule_takes(const gpu_rule &r, const coli_weight *w, int64_t s, bool x_ready, bool digits, int64_t sms) {
    const int laid = w->layout == TILE_LAYOUT ? LAID_TILE : w->layout == MMA_LAYOUT ? LAID_MMA : LAID_ABI;
    const int64_t per_sm = (w->rows + sms - 1) / sms;
    if (!r.launcher(w->format) || !(r.layouts & laid) || s < r.s_lo || s > r.s_hi) return false;
    if (w->cols < r.cols_lo || w->cols > r.cols_hi || w->cols % r.cols_of || w->rows < r.rows_lo || w->rows % r.rows_of)
        return false;
    if (per_sm > r.per_sm_hi || w->rows > r.elems_hi / w->cols) return false;
    if ((r.x_ready >= 0 && r.x_ready != (int)x_ready) || (r.sm90 && !gpu_sm90()) || (r.digits && !digits)) return false;
    if (r.under_rows &&
        (w->rows + r.under_rows - 1) / r.under_rows * ((s + r.under_tokens - 1) / r.under_tokens) >= sms)
        return false;
    return !r.also || r.also(w);
}

/* The row that serves a call: the first that takes it (the last takes any). */
static const gpu_rule &gpu_pick(const coli_weight *w, int64_t s, bool x_ready, bool digits) {
    if (simple_only()) return GPU_RULES[GPU_NRULES - 1];
    const int64_t sms = sm_count();
    for (const gpu_rule &r : GPU_RULES)
        if (gpu_rule_takes(r, w, s, x_ready, digits, sms)) return r;
    return GPU_RULES[GPU_NRULES - 1];
}

/* One matmul on device pointers; `planes` (device scratch of s * cols floats, or
 * NULL) lets int8 and int4 go through the tensor cores. `x_ready`: no kernel
 * queued before this call that may still run writes dx (as when the caller's own
 * copy put it there): the S = 1 kernels on sm_90 then read x before they wait for
 * the kernel before them, and wait only before they write y. */
static cudaError_t launch_matmul(const coli_weight *w, const float *dx, int64_t s, float *dy, bool x_ready,
                                 cudaStream_t stream, float *planes) {
    gpu_pick(w, s, x_ready, planes != NULL).launcher(w->format)(w, dx, s, planes, dy, x_ready, stream);
    return cudaGetLastError();
}

/* Where int4 is stored tile by tile (TILE_LAYOUT) for decode_tiled_kernel, decided at
 * upload: sm_90, groups of 32, rows of whole blocks (32), at each width from the rows
 * where the layout beat the mma layout up to 8192 (mma_kernel and gemm_kernel read it
 * too, for more tokens). COLI_GPU_TILE=0 keeps the mma layout. */
struct gpu_tiled_width {
    int64_t cols, rows_lo;
};
static const gpu_tiled_width GPU_TILED_WIDTHS[] = {{8192, 4096}, {12288, 2048}, {14336, 2048}};
#define GPU_TILED_ROWS_HI 8192

static bool gpu_stores_tile_by_tile(int32_t format, int64_t rows, int64_t cols, int32_t group) {
    static int off = -1;
    if (off < 0) {
        const char *v = getenv("COLI_GPU_TILE");
        off = v && strcmp(v, "0") == 0;
    }
    if (off || format != COLI_FMT_Q4 || group != 32 || rows % 32 || rows > GPU_TILED_ROWS_HI || !gpu_sm90()) return false;
    for (const gpu_tiled_width &t : GPU_TILED_WIDTHS)
        if (cols == t.cols && rows >= t.rows_lo) return true;
    return false;
}

#endif
