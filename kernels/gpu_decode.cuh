/* int8 and int4 at S = 1 on any GPU: decode_kernel and decode_walk_kernel, with
 * x cut into units by a prep kernel or by every block (FUSED). */
#ifndef COLI_GPU_DECODE_CUH
#define COLI_GPU_DECODE_CUH

#include "gpu_formats.cuh"

/* ---- int8 and int4 at S = 1: decode_kernel ----------------------------------------
 * One token leaves the tensor cores' tiles mostly empty (3 of their 8 columns),
 * and mma_kernel's stages and barriers cost more than they save: at S = 1 a warp
 * owns R rows instead (or KS warps share them, each a KS-th of their runs) and
 * reads them as 16-byte pieces, lane i piece i of each run of 32, through a ring
 * of D runs in flight (as gemv_kernel does for f32). x is cut
 * per run of 8 columns into the same int8 digits (E per 8 columns), stored in the
 * order the lanes read them (decode_unit), so that a warp's x loads are side by
 * side whatever the weights' layout; a weight word meets them in dp4a, exactly:
 * a word's true sum is below 4 * 128 * 2^22 = 2^31 (int8) or 8 * 15 * 2^22 (int4,
 * values n + 8), and int32 arithmetic wraps, so its parts may overflow on the
 * way. A word then costs int8 3 dp4a, 2 multiply-adds, a conversion and an fma;
 * int4 3 masks, 6 dp4a, 2 multiply-adds, a conversion, a multiply and an fma.
 * Per word the kernel reads 16 bytes of digits (int8: a, b, c of 4 columns, E) or
 * 32 (int4: a, b, c of the even and of the odd columns, E, and -8 times the sum of
 * the 8 v, which takes off the values' bias of 8). */

/* Where lane i reads the digits of the ABI's word wn: word m of the piece at
 * `start` + i, in a row of `pieces`, is unit start * 4 + m * nb + i. */
__host__ __device__ inline int64_t decode_unit(int32_t layout, int64_t wn, int64_t pieces) {
    const int64_t sp = layout ? mma_word(wn) : wn, piece = sp / 4, start = piece / WARP * WARP;
    const int64_t nb = pieces - start < WARP ? pieces - start : WARP;
    return start * 4 + sp % 4 * nb + (piece - start);
}

/* x's run of 8 columns -> its units: int8, one a word (a, b, c, E); int4, the two
 * halves of its word's 32 bytes. Every S = 1 call starts here, so digits_of8's work
 * is done leanly (one multiply-add whose bits hold v, the digits as the bytes they
 * are: a third of the instructions, the same units bit for bit); a run below
 * 2^-104 takes digits_of8 itself. */
template <int FORMAT> __host__ __device__ inline void run_units(const float (&v)[8], float4 (&units)[2]) {
    uint32_t top = 0; /* the largest |x|'s bits: an inf or NaN is above every finite value */
    for (int j = 0; j < 8; j++) {
        const uint32_t a = as_bits(v[j]) & 0x7FFFFFFFu;
        top = a > top ? a : top;
    }
    const bool bad = top >= 0x7F800000u;
    int ex = (int)(top >> 23) - 126; /* the run's largest |x| < 2^ex */
    if (top < 0x00800000u) (void)frexpf(as_float(top), &ex); /* 0 or subnormal */
    const float e = digit_step(ex, bad);
    uint32_t p[DIGITS][2] = {}; /* int8: columns 0-3 and 4-7; int4: the even and the odd (as mma_pack lays them) */
    int sum = 0;
    if (!bad && ex >= -104) {
        const float step = pow2(22 - ex);
        /* q = a 2^16 + b 2^8 + c with b and c in [-128, 127]: q + 0x808080 has a + 128,
         * b + 128 and c + 128 as its bytes 2, 1 and 0 (no byte carries into the next),
         * and a digit's byte is its biased byte with the top bit flipped */
        uint32_t u[8];
        for (int j = 0; j < 8; j++) {
            /* x 2^(22 - ex) is exact and below 2^22: added to 1.5 2^23 it rounds to an integer in the low bits */
            int q = (int)as_bits(fmaf(v[j], step, FLOAT_SUM_BASE)) - FLOAT_SUM_BITS;
            q = q > V_MAX ? V_MAX : q < -V_MAX ? -V_MAX : q;
            u[j] = (uint32_t)q + 0x808080u, sum += q;
        }
        for (int k = 0; k < DIGITS; k++) {
            const uint32_t at = 2 - (uint32_t)k;
            if (FORMAT == COLI_FMT_Q8)
                p[k][0] = bytes_of4(u[0], u[1], u[2], u[3], at) ^ 0x80808080u,
                p[k][1] = bytes_of4(u[4], u[5], u[6], u[7], at) ^ 0x80808080u;
            else
                p[k][0] = bytes_of4(u[0], u[2], u[4], u[6], at) ^ 0x80808080u,
                p[k][1] = bytes_of4(u[1], u[3], u[5], u[7], at) ^ 0x80808080u;
        }
    } else if (!bad) {
        int d[DIGITS][8];
        digits_of8(v, ex, d);
        for (int k = 0; k < DIGITS; k++) mma_pack<FORMAT>(d[k], p[k][0], p[k][1]);
        for (int j = 0; j < 8; j++) sum += d[0][j] * 65536 + d[1][j] * 256 + d[2][j];
    }
    if (FORMAT == COLI_FMT_Q8) {
        for (int h = 0; h < 2; h++) units[h] = make_float4(as_float(p[0][h]), as_float(p[1][h]), as_float(p[2][h]), e);
    } else {
        units[0] = make_float4(as_float(p[0][0]), as_float(p[0][1]), as_float(p[1][0]), as_float(p[1][1]));
        units[1] = make_float4(as_float(p[2][0]), as_float(p[2][1]), e, as_float((uint32_t)(-8 * sum)));
    }
}

/* x's run of 8 columns g -> its units (run_units), where decode_kernel's lanes read
 * them: int8 one a word; int4 the two halves of its word's, the second half cols / 8
 * units after the first. */
template <int FORMAT>
__host__ __device__ inline void decode_units(const float (&v)[8], int64_t g, int64_t cols, int32_t layout, float4 *out) {
    float4 u[2];
    run_units<FORMAT>(v, u);
    const int64_t pieces = cols / (FORMAT == COLI_FMT_Q8 ? 16 : 32);
    if (FORMAT == COLI_FMT_Q8) {
        for (int h = 0; h < 2; h++) out[decode_unit(layout, 2 * g + h, pieces)] = u[h];
    } else {
        const int64_t at = decode_unit(layout, g, pieces);
        out[at] = u[0];
        out[cols / 8 + at] = u[1];
    }
}

/* x's run of 8 columns g (read from x) -> its units. */
template <int FORMAT>
__device__ inline void decode_prep_run(const float *__restrict__ x, int64_t g, int64_t cols, int32_t layout,
                                       float4 *out) {
    const float4 lo = COLI_LOAD_FRESH((const float4 *)x + 2 * g), hi = COLI_LOAD_FRESH((const float4 *)x + 2 * g + 1);
    const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    decode_units<FORMAT>(v, g, cols, layout, out);
}

/* x's digits for decode_kernel, a thread per 8 columns (cols % 8 == 0). */
template <int FORMAT>
__global__ void __launch_bounds__(256)
    decode_prep_kernel(const float *__restrict__ x, int64_t cols, int32_t layout, float4 *__restrict__ out) {
    coli_allow_next_grid(); /* decode_kernel may start loading W now; it waits for this grid before x */
    coli_wait_prior_grid(); /* launched early too (chained calls): x and `out` are the last call's until here */
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g < cols / 8) decode_prep_run<FORMAT>(x, g, cols, layout, out);
}

/* One weight word against its units (int4: the word's two halves): the exact
 * integer sum of value * v. */
template <int FORMAT>
__host__ __device__ inline int word_dot(uint32_t word, const float4 (&u)[FORMAT == COLI_FMT_Q8 ? 1 : 2]) {
    if constexpr (FORMAT == COLI_FMT_Q8) {
        const int w = (int)word;
        const int a = COLI_DP4A(w, (int)as_bits(u[0].x), 0), b = COLI_DP4A(w, (int)as_bits(u[0].y), 0);
        const int c = COLI_DP4A(w, (int)as_bits(u[0].z), 0);
        return (int)((uint32_t)a * 65536u + (uint32_t)b * 256u + (uint32_t)c); /* wraps; the true sum fits */
    } else {
        const int lo = (int)(word & 0x0F0F0F0Fu), hi = (int)((word >> 4) & 0x0F0F0F0Fu); /* n + 8, 0..15 */
        const int a = COLI_DP4A(hi, (int)as_bits(u[0].y), COLI_DP4A(lo, (int)as_bits(u[0].x), 0));
        const int b = COLI_DP4A(hi, (int)as_bits(u[0].w), COLI_DP4A(lo, (int)as_bits(u[0].z), 0));
        const int c = COLI_DP4A(hi, (int)as_bits(u[1].y), COLI_DP4A(lo, (int)as_bits(u[1].x), (int)as_bits(u[1].w)));
        return (int)((uint32_t)a * 65536u + (uint32_t)b * 256u + (uint32_t)c);
    }
}

/* One ring slot: a run's piece of each of R rows and, for int4, its 4 words' scales. */
template <int FORMAT, int R> struct decode_slot {
    int4 w[R];
    float4 sc[FORMAT == COLI_FMT_Q4 ? R : 1];
};

/* Load the run at piece `start` (nb pieces wide) into a slot. int4 is in the mma
 * layout: word m of piece p holds a column of group (p / 4) * 4 + m. */
template <int FORMAT, int R>
__device__ inline void decode_load(decode_slot<FORMAT, R> &sl, const int4 *const (&w)[R], const float *const (&sr)[R],
                                   int start, int nb, int lane) {
    const bool on = lane < nb;
#pragma unroll
    for (int k = 0; k < R; k++) {
        sl.w[k] = on ? COLI_LOAD_STREAM(w[k] + start + lane) : make_int4(0, 0, 0, 0);
        if constexpr (FORMAT == COLI_FMT_Q4)
            sl.sc[k] = on ? __ldg((const float4 *)sr[k] + (start + lane) / 4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

/* A loaded run into the sums: xq points at this lane's units of the run (in
 * global memory, or SHARED). */
template <int FORMAT, int R, bool SHARED>
__device__ inline void decode_run(const decode_slot<FORMAT, R> &sl, const float4 *xq, int64_t half, int nb,
                                  float (&acc)[R]) {
#pragma unroll
    for (int m = 0; m < 4; m++) {
        float4 u[FORMAT == COLI_FMT_Q8 ? 1 : 2];
        u[0] = SHARED ? xq[m * nb] : COLI_LOAD_FRESH(xq + m * nb);
        if constexpr (FORMAT == COLI_FMT_Q4) u[1] = SHARED ? xq[half + m * nb] : COLI_LOAD_FRESH(xq + half + m * nb);
#pragma unroll
        for (int k = 0; k < R; k++) {
            const float dot = (float)word_dot<FORMAT>(word_of(sl.w[k], m), u);
            acc[k] = fmaf(dot, FORMAT == COLI_FMT_Q4 ? u[1].z * elem(sl.sc[k], m) : u[0].w, acc[k]);
        }
    }
}

/* Where rows r0 .. r0 + R - 1 start (W and, int4, their scales: one per piece).
 * Rows past the end re-read the last one; their sums are dropped. */
template <int R>
__device__ inline void decode_rows(const int4 *q, const float *scale, int64_t rows, int pieces, int64_t r0,
                                   const int4 *(&w)[R], const float *(&sr)[R]) {
#pragma unroll
    for (int k = 0; k < R; k++) {
        const int64_t row = r0 + k < rows ? r0 + k : rows - 1;
        w[k] = q + row * pieces;
        sr[k] = scale + row * pieces;
    }
}

/* A row's warp sum into y (int8: times the row's scale), by lane 0, if the row is real. */
template <int FORMAT>
__device__ inline void decode_store(float v, int64_t row, int64_t rows, const float *scale, float *y, int lane) {
    if (lane == 0 && row < rows) y[row] = FORMAT == COLI_FMT_Q8 ? v * scale[row] : v;
}

/* The pieces [first, last) that slice `slice` of KS takes of a row's `full` pieces in
 * whole runs of 32: the k-th KS-th of the runs (rounded up), the last slice the rest. */
__host__ __device__ inline void decode_slice(int full, int ks, int slice, int &first, int &last) {
    const int per = (full / WARP + ks - 1) / ks * WARP;
    first = slice * per;
    last = ks == 1 ? full : first + per < full ? first + per : full;
}

/* int8 in the ABI's order (cols % 16 == 0), int4 in the mma layout. x: decode_prep_kernel's
 * units in xq, or (FUSED) x itself, which each block cuts into units in its shared
 * memory (cols * 4 bytes) once W's first runs are on their way: no prep kernel, and
 * no wait for one between two calls. */
template <int FORMAT, int R, int D, bool FUSED = false, int KS = 1>
__global__ void __launch_bounds__(256)
    decode_kernel(const int4 *__restrict__ q, const float *__restrict__ scale, int64_t rows, int pieces,
                  const float4 *__restrict__ xq, const float *__restrict__ x, float *__restrict__ y) {
    extern __shared__ float4 units[]; /* FUSED */
    __shared__ float part[KS > 1 ? 256 / WARP : 1][R]; /* KS > 1: each warp's sums */
    coli_allow_next_grid(); /* the next call's kernels may take free room from here on */
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, slice = warp % KS;
    const int64_t r0 = ((int64_t)blockIdx.x * (blockDim.x / WARP / KS) + warp / KS) * R;
    const bool active = r0 < rows;             /* a whole warp is in or out */
    if (!FUSED && KS == 1 && !active) return; /* no barrier follows */
    const int64_t half = (int64_t)pieces * 4; /* int4: where the units' second halves start */
    const int4 *w[R];
    const float *sr[R];
    decode_rows<R>(q, scale, rows, pieces, r0, w, sr);
    const int full = pieces / WARP * WARP; /* pieces in whole runs of 32 */
    int first, last;
    decode_slice(full, KS, slice, first, last);
    decode_slot<FORMAT, R> ring[D];
#pragma unroll
    for (int d = 0; d < D; d++)
        if (active && first + d * WARP < last) decode_load<FORMAT, R>(ring[d], w, sr, first + d * WARP, WARP, lane);
    coli_wait_prior_grid(); /* W is on its way; x (or its units) is ready from here on */
    if constexpr (FUSED) {
        const int64_t cols = (int64_t)pieces * (FORMAT == COLI_FMT_Q8 ? 16 : 32);
        for (int64_t g = threadIdx.x; g < cols / 8; g += blockDim.x)
            decode_prep_run<FORMAT>(x, g, cols, FORMAT == COLI_FMT_Q4 ? MMA_LAYOUT : 0, units);
        __syncthreads();
        if (!active) return;
    }
    const float4 *xs = FUSED ? units : xq;
    float acc[R];
#pragma unroll
    for (int k = 0; k < R; k++) acc[k] = 0.0f;
    if (active) {
        for (int run = first; run < last; run += D * WARP)
#pragma unroll
            for (int d = 0; d < D; d++) {
                const int start = run + d * WARP;
                if (start >= last) break;
                decode_run<FORMAT, R, FUSED>(ring[d], xs + start * 4 + lane, half, WARP, acc);
                if (start + D * WARP < last) decode_load<FORMAT, R>(ring[d], w, sr, start + D * WARP, WARP, lane);
            }
        const int nb = pieces - full; /* a row's last, narrower run */
        if (nb > 0 && slice == KS - 1) {
            decode_load<FORMAT, R>(ring[0], w, sr, full, nb, lane);
            if (lane < nb) decode_run<FORMAT, R, FUSED>(ring[0], xs + full * 4 + lane, half, nb, acc);
        }
    }
#pragma unroll
    for (int k = 0; k < R; k++) {
        float v = warp_sum(acc[k]);
        if constexpr (KS > 1) { /* the slices' sums meet in shared memory, in a fixed order */
            if (lane == 0) part[warp][k] = v;
            __syncthreads();
            if (slice != 0) continue;
            v = 0.0f;
#pragma unroll
            for (int j = 0; j < KS; j++) v += part[warp + j][k];
        }
        decode_store<FORMAT>(v, r0 + k, rows, scale, y, lane);
    }
}

/* decode_kernel's warps, when a weight has more groups of R rows than the GPU holds
 * warps at once, each take one group and end: a warp's loads all go out at its
 * start, and while it does its arithmetic no loads of its own are in flight. Here
 * a warp takes `per` consecutive groups instead, and its ring runs on from one
 * group's runs into the next one's, so its loads stay in flight across the
 * groups. The launch sizes `per` so that the warps fit the GPU at once; where
 * that is one group a warp, decode_kernel is taken instead (it holds 4 runs in
 * flight in the same registers). x: decode_prep_kernel's units; rows whole runs
 * of 32 pieces. */
template <int FORMAT, int R, int D>
__global__ void __launch_bounds__(256)
    decode_walk_kernel(const int4 *__restrict__ q, const float *__restrict__ scale, int64_t rows, int pieces,
                       const float4 *__restrict__ xq, float *__restrict__ y, int per) {
    coli_allow_next_grid(); /* the next call's kernels may take free room from here on */
    const int lane = threadIdx.x % WARP;
    const int64_t groups = (rows + R - 1) / R;
    const int64_t g0 = ((int64_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP) * per;
    if (g0 >= groups) return; /* no barrier follows */
    const int runs = pieces / WARP, half = pieces * 4;
    const int64_t items = ((g0 + per < groups ? g0 + per : groups) - g0) * runs; /* (group, run) pairs */
    const int4 *w[R];
    const float *sr[R];
    auto point = [&](int64_t g) { decode_rows<R>(q, scale, rows, pieces, g * R, w, sr); };
    int64_t lg = g0; /* the next load: run lr of group lg */
    int lr = 0;
    auto load_next = [&](decode_slot<FORMAT, R> &sl) {
        decode_load<FORMAT, R>(sl, w, sr, lr * WARP, WARP, lane);
        if (++lr == runs) lr = 0, point(++lg);
    };
    point(lg);
    decode_slot<FORMAT, R> ring[D];
#pragma unroll
    for (int d = 0; d < D; d++)
        if (d < items) load_next(ring[d]);
    coli_wait_prior_grid(); /* W is on its way; x's units are ready from here on */
    float acc[R];
#pragma unroll
    for (int k = 0; k < R; k++) acc[k] = 0.0f;
    int64_t cg = g0; /* the next sums: run cr of group cg */
    int cr = 0;
    for (int64_t i = 0; i < items; i += D)
#pragma unroll
        for (int d = 0; d < D; d++) {
            if (i + d >= items) break;
            decode_run<FORMAT, R, false>(ring[d], xq + cr * WARP * 4 + lane, half, WARP, acc);
            if (i + d + D < items) load_next(ring[d]);
            if (++cr < runs) continue;
#pragma unroll
            for (int k = 0; k < R; k++) { /* group cg is done */
                decode_store<FORMAT>(warp_sum(acc[k]), cg * R + k, rows, scale, y, lane);
                acc[k] = 0.0f;
            }
            cr = 0, cg++;
        }
}

template <int FORMAT> static int decode_pieces(const coli_weight *w) {
    return (int)(w->cols / (FORMAT == COLI_FMT_Q8 ? 16 : 32));
}

/* decode_kernel's blocks: 8 warps, KS of them to each group of R rows. */
static dim3 decode_grid(const coli_weight *w, int r, int ks) {
    const int64_t per_block = (int64_t)(GEMV_THREADS / WARP / ks) * r;
    return dim3((unsigned)((w->rows + per_block - 1) / per_block));
}

/* x's units for decode_kernel and decode_walk_kernel into `planes` (cols floats). */
template <int FORMAT> static void launch_decode_prep(const coli_weight *w, const float *dx, float *planes, cudaStream_t stream) {
    const int64_t runs = w->cols / 8;
    launch_early(chain_calls(), decode_prep_kernel<FORMAT>, dim3((unsigned)((runs + 255) / 256)), dim3(256), 0, stream,
                 dx, w->cols, w->layout, (float4 *)planes);
}

/* int8 and int4, S = 1: x's units, then decode_kernel (KS warps to a group of R rows). */
template <int FORMAT, int R, int D, int KS = 1>
static void launch_decode(const coli_weight *w, const float *dx, float *planes, float *dy, cudaStream_t stream) {
    launch_decode_prep<FORMAT>(w, dx, planes, stream);
    launch_early(true, decode_kernel<FORMAT, R, D, false, KS>, decode_grid(w, R, KS), dim3(GEMV_THREADS), 0, stream, (const int4 *)w->q,
                 (const float *)w->scale, (int64_t)w->rows, decode_pieces<FORMAT>(w), (const float4 *)planes,
                 (const float *)nullptr, dy);
}

/* The groups of R rows each of decode_walk_kernel's warps takes: an equal share,
 * with as many warps as the GPU holds at once. */
template <int FORMAT, int R, int D> static int decode_walk_per(const coli_weight *w) {
    static int blocks_per_sm = 0; /* per instantiation: the kernel's registers decide it */
    if (!blocks_per_sm &&
        (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, decode_walk_kernel<FORMAT, R, D>, GEMV_THREADS, 0) !=
             cudaSuccess ||
         blocks_per_sm < 1))
        blocks_per_sm = 1;
    const int64_t groups = (w->rows + R - 1) / R, at_once = (int64_t)sm_count() * blocks_per_sm * (GEMV_THREADS / WARP);
    return (int)((groups + at_once - 1) / at_once);
}

/* The same with decode_walk_kernel (decode_pieces % 32 == 0), `per` groups a warp
 * (decode_walk_per). */
template <int FORMAT, int R, int D>
static void launch_decode_walk(const coli_weight *w, const float *dx, float *planes, float *dy, cudaStream_t stream,
                               int per) {
    const int64_t warps = ((w->rows + R - 1) / R + per - 1) / per, per_block = GEMV_THREADS / WARP;
    launch_decode_prep<FORMAT>(w, dx, planes, stream);
    launch_early(true, decode_walk_kernel<FORMAT, R, D>, dim3((unsigned)((warps + per_block - 1) / per_block)),
                 dim3(GEMV_THREADS), 0, stream, (const int4 *)w->q, (const float *)w->scale, (int64_t)w->rows,
                 decode_pieces<FORMAT>(w), (const float4 *)planes, dy, per);
}

/* The same with x cut into units by each block (decode_kernel's FUSED), for rows
 * whose units fit the default 48 KiB of shared memory (cols <= 12288). */
#define FUSED_MAX_COLS (48 * 1024 / 4)
template <int FORMAT, int R, int D>
static void launch_decode_fused(const coli_weight *w, const float *dx, float *dy, cudaStream_t stream) {
    const size_t shared = (size_t)w->cols * 4;
    launch_early(chain_calls(), decode_kernel<FORMAT, R, D, true>, decode_grid(w, R, 1), dim3(GEMV_THREADS), shared, stream,
                 (const int4 *)w->q, (const float *)w->scale, (int64_t)w->rows, decode_pieces<FORMAT>(w),
                 (const float4 *)nullptr, dx, dy);
}

#endif
