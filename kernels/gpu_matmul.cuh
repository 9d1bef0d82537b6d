/* The GPU backend's matmul, y[S,O] = x[S,I] · Wᵀ, for f32, int8 (per-row scale)
 * and int4 (grouped scale) weights; one source for CUDA and HIP. Included by
 * backend_gpu.cu (and by bench/gpu_matmul_bench.cu, which times the variants).
 *
 *   gemv_kernel   S <= 16 (decode): bound by reading W from memory, once per
 *                 8 tokens. At S = 1 int8 and int4 weights meet x as int8
 *                 planes (prep_x_kernel) in integer dot products.
 *   tile_kernel   S > 16 (prefill, teacher forcing): bound by f32 arithmetic.
 *   simple_kernel any shape; rows that are not whole 16-byte pieces, and the
 *                 reference path (COLI_GPU_SIMPLE=1) for comparisons.
 *
 * Measurements behind the choices here: bench/RESULTS.md (H200). */
#ifndef COLI_GPU_MATMUL_CUH
#define COLI_GPU_MATMUL_CUH

#define WARP 32
#define SIMPLE_THREADS 256

/* ---- Exact int8/int4 -> f32 without the conversion unit ------------------------
 * I2F runs at a quarter of the FMA rate on sm_80/sm_90, which capped the first
 * kernels at 38% (int8) and 18% (int4) of copy bandwidth. An integer placed in the
 * low mantissa bits of 2^23 is read as 2^23 + n; one add (or one fma, when the
 * nibble sits higher up) takes the bias off, exactly. */
#define MAGIC 0x4B000000u /* 2^23 as f32 bits */

/* Four int8 of a word (byte k = value k). */
__device__ inline void dequant_q8(uint32_t word, float (&v)[4]) {
    const uint32_t biased = word ^ 0x80808080u; /* n + 128 in 0..255 */
#pragma unroll
    for (int k = 0; k < 4; k++) v[k] = __int_as_float(__byte_perm(biased, MAGIC, 0x7540u | k)) - 8388736.0f;
}

/* Eight int4 of a word: nibble k (value k) holds n + 8. Nibbles 0-3 come from the
 * word and 4-7 from the word >> 16, each masked in place (no shift per nibble):
 * 2^23 + 16^j (n + 8), scaled by 16^-j, less 2^23 / 16^j + 8, is n exactly. */
__device__ inline void dequant_q4(uint32_t word, float (&v)[8]) {
    const uint32_t half[2] = {word, word >> 16};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        v[4 * h + 0] = __int_as_float((half[h] & 0x000Fu) | MAGIC) - 8388616.0f;
        v[4 * h + 1] = fmaf(__int_as_float((half[h] & 0x00F0u) | MAGIC), 0.0625f, -524296.0f);
        v[4 * h + 2] = fmaf(__int_as_float((half[h] & 0x0F00u) | MAGIC), 0.00390625f, -32776.0f);
        v[4 * h + 3] = fmaf(__int_as_float((half[h] & 0xF000u) | MAGIC), 0.000244140625f, -2056.0f);
    }
}

/* Values in one 32-bit word and in one 16-byte piece, per format; and the 16-byte
 * units of x (float32, or the planes) that an int8 or int4 word meets. */
template <int FORMAT> struct fmt {
    static constexpr int per_word = FORMAT == COLI_FMT_F32 ? 1 : FORMAT == COLI_FMT_Q8 ? 4 : 8;
    static constexpr int per_piece = 4 * per_word;
    static constexpr int x_units = per_word < 4 ? 1 : per_word / 4;
};

template <int FORMAT> __device__ inline void dequant(uint32_t word, float (&v)[fmt<FORMAT>::per_word]) {
    if constexpr (FORMAT == COLI_FMT_F32) v[0] = __uint_as_float(word);
    else if constexpr (FORMAT == COLI_FMT_Q8) dequant_q8(word, v);
    else dequant_q4(word, v);
}

__device__ inline uint32_t word_of(const int4 &p, int m) {
    return (uint32_t)(m == 0 ? p.x : m == 1 ? p.y : m == 2 ? p.z : p.w);
}

/* ---- The interleaved layout of int8 and int4 rows --------------------------------
 * A warp reads a row as 16-byte pieces, lane i taking piece i of each run of 32.
 * In the ABI's order piece i holds columns [i * per_piece, ...), so the lanes'
 * x values lie per_piece floats apart and every x load touched 32 cache lines:
 * L1, not HBM, was the limit (ncu on the H200: L1 79% busy, DRAM 32%). On upload
 * the backend reorders each run of 32 pieces (nb < 32 in a row's last run) so
 * that word m of lane i holds the per_word columns starting at
 *     run start + (m * nb + i) * per_word,
 * i.e. a run's words, read in ABI order, are a [4][nb] array stored as [nb][4].
 * Then lane i's x values for word m sit next to lane i+1's: loads coalesce.
 * Words keep their bytes (and nibble order), so this is a permutation of 32-bit
 * words. f32 rows keep the ABI order: a piece's x is one float4 already. */
#define RUN_WORDS 128 /* 32 pieces of 4 words */

/* The stored word index of the ABI's word `wn` in a row of `words` words. */
__host__ __device__ inline int64_t interleaved_word(int64_t wn, int64_t words) {
    const int64_t run = wn / RUN_WORDS * RUN_WORDS, p = wn - run;
    const int64_t nb = words - run < RUN_WORDS ? (words - run) / 4 : 32;
    return run + p % nb * 4 + p / nb;
}

/* Whether a weight is stored interleaved: int8 and int4 rows of whole pieces
 * whose int4 groups hold whole words (one scale per word). */
static inline bool interleaves(int32_t format, int64_t cols, int32_t group) {
    if (format == COLI_FMT_Q8) return cols % 16 == 0;
    return format == COLI_FMT_Q4 && cols % 32 == 0 && group % 8 == 0;
}

/* Host side: the ABI's rows -> interleaved rows of `words` 32-bit words each
 * (`dst` as large as `src`; `src` may be unaligned, as in a mapped file). */
static void interleave_rows(const void *src, void *dst, int64_t rows, int64_t words) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t wn = 0; wn < words; wn++)
            memcpy((char *)dst + 4 * (r * words + interleaved_word(wn, words)), (const char *)src + 4 * (r * words + wn), 4);
}

/* ---- One token's x as three int8 planes (int8 and int4 weights at S = 1) -------------
 * Turning weights into floats costs more instructions per value than the memory
 * system leaves time for (int4 above all). Instead x, shared by every row, is cut
 * once per call into integers: each run of 8 columns gets a power of two E above
 * its largest |x|, and v = round(x / E * 2^22), |v| <= 2^22, is split into int8
 * digits a * 2^16 + b * 2^8 + c. A weight word then takes three (int8) or six
 * (int4) dp4a and one conversion, and the sums stay exact in int32: for int8 a word
 * sums at most 4 * 127 * 65 * 2^16 + 4 * 127 * 128 * 2^8 + 4 * 127 * 128 < 2^31,
 * for int4 8 * 15 * 65 * 2^16 + ... < 2^30. x's rounding is 2^-23 of its run's
 * largest value, about what float32 sums add anyway.
 * Per word the kernels read 16 bytes (int8: a, b, c, E * 2^-22 for its 4 columns)
 * or 32 (int4: a, b, c for the even and the odd columns, E * 2^-22, and the sum of
 * the 8 v, for the -8 bias), the bytes of the float32 x they replace. */
/* Bit casts that the host can run too (the layout check runs these functions there). */
__host__ __device__ inline float as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
__host__ __device__ inline uint32_t as_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

__host__ __device__ inline uint32_t pack4(int v0, int v1, int v2, int v3) {
    return (uint32_t)(v0 & 0xFF) | (uint32_t)(v1 & 0xFF) << 8 | (uint32_t)(v2 & 0xFF) << 16 | (uint32_t)(v3 & 0xFF) << 24;
}

/* Eight values -> their digits (d[0] a, d[1] b, d[2] c), E * 2^-22 and the sum of v. */
__host__ __device__ inline void quantize_x8(const float (&x)[8], int (&d)[3][8], float &e, int &sum) {
    float m = 0.0f;
    bool finite = true;
    for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(x[j])), finite = finite && fabsf(x[j]) <= 3.4e38f;
    int ex = 0;
    if (!finite) { /* inf or NaN: the sums must come out NaN, not finite */
        for (int j = 0; j < 8; j++) d[0][j] = d[1][j] = d[2][j] = 0;
        e = NAN, sum = 0;
        return;
    }
    (void)frexpf(m, &ex); /* m < 2^ex */
    sum = 0;
    for (int j = 0; j < 8; j++) {
        const int v = (int)rintf(ldexpf(x[j], 22 - ex)); /* x * 2^(22 - ex), exact before the rounding */
        const int c = ((v + 128) & 255) - 128, v1 = (v - c) >> 8; /* v - c is a multiple of 256 */
        const int b = ((v1 + 128) & 255) - 128;
        d[0][j] = (v1 - b) >> 8, d[1][j] = b, d[2][j] = c;
        sum += v;
    }
    e = ldexpf(1.0f, ex - 22); /* 0 when the run's largest |x| is below 2^-127: such runs count as 0 */
}

/* Eight columns of x -> their planes, as the weight words read them: int8, two
 * 16-byte units (a, b, c, e) for columns 0-3 and 4-7; int4, one 32-byte word
 * (a, b, c for the even columns, which sit in the low nibbles, and the odd; e; sum). */
template <int FORMAT> __host__ __device__ inline void planes_of8(const float (&x)[8], float4 (&out)[2]) {
    int d[3][8], sum;
    float e;
    quantize_x8(x, d, e, sum);
    if (FORMAT == COLI_FMT_Q8) {
        for (int h = 0; h < 2; h++) {
            const int o = 4 * h;
            out[h] = make_float4(as_float(pack4(d[0][o], d[0][o + 1], d[0][o + 2], d[0][o + 3])),
                                 as_float(pack4(d[1][o], d[1][o + 1], d[1][o + 2], d[1][o + 3])),
                                 as_float(pack4(d[2][o], d[2][o + 1], d[2][o + 2], d[2][o + 3])), e);
        }
    } else {
        uint32_t p[3][2];
        for (int k = 0; k < 3; k++)
            for (int odd = 0; odd < 2; odd++) p[k][odd] = pack4(d[k][odd], d[k][2 + odd], d[k][4 + odd], d[k][6 + odd]);
        out[0] = make_float4(as_float(p[0][0]), as_float(p[0][1]), as_float(p[1][0]),
                             as_float(p[1][1]));
        out[1] = make_float4(as_float(p[2][0]), as_float(p[2][1]), e, as_float((uint32_t)sum));
    }
}

/* The planes of x (cols % 8 == 0), one thread per 8 columns. */
template <int FORMAT>
__global__ void __launch_bounds__(256) prep_x_kernel(const float *__restrict__ x, int64_t cols, float4 *__restrict__ out) {
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= cols / 8) return;
    const float4 lo = __ldg((const float4 *)x + 2 * g), hi = __ldg((const float4 *)x + 2 * g + 1);
    const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    float4 units[2];
    planes_of8<FORMAT>(v, units);
    out[2 * g] = units[0], out[2 * g + 1] = units[1];
}

/* One weight word against its x planes: the exact integer sum of value * v. */
template <int FORMAT> __host__ __device__ inline int word_dot(uint32_t word, const float4 *u) {
    if constexpr (FORMAT == COLI_FMT_Q8) {
        const int w = (int)word;
        const int a = COLI_DP4A(w, (int)as_bits(u[0].x), 0), b = COLI_DP4A(w, (int)as_bits(u[0].y), 0);
        const int c = COLI_DP4A(w, (int)as_bits(u[0].z), 0);
        return a * 65536 + b * 256 + c;
    } else {
        const int lo = (int)(word & 0x0F0F0F0Fu), hi = (int)((word >> 4) & 0x0F0F0F0Fu); /* n + 8, 0..15 */
        const int a = COLI_DP4A(hi, (int)as_bits(u[0].y), COLI_DP4A(lo, (int)as_bits(u[0].x), 0));
        const int b = COLI_DP4A(hi, (int)as_bits(u[0].w), COLI_DP4A(lo, (int)as_bits(u[0].z), 0));
        const int c = COLI_DP4A(hi, (int)as_bits(u[1].y), COLI_DP4A(lo, (int)as_bits(u[1].x), 0));
        return a * 65536 + b * 256 + c - 8 * (int)as_bits(u[1].w);
    }
}

/* ---- S <= 16: a warp owns R rows and T tokens ----------------------------------------
 * Lane i takes piece i of each run of 32 pieces of its R rows. The pieces come
 * through a ring of D register slots, each refilled as soon as it is used, so D
 * runs of loads are in flight while the warp works: HBM's latency under load is
 * thousands of cycles and a run's arithmetic a few hundred, and the grid gives
 * an SM too few warps to cover that otherwise (ncu on the H200: warps stalled
 * on loads 80% of the time with one run ahead). A word's x values, read through
 * L1, serve R rows. Weights stream past the caches. Needs whole pieces: f32 in
 * the ABI's order (cols % 4 == 0), int8 and int4 interleaved. Indices within a
 * row are 32-bit (a row has fewer than 2^31 pieces): 64-bit index arithmetic,
 * and above all a 64-bit division per int4 scale, cost more than the work. */
/* x values per lane per run: a float4 per word (int8), two (int4), one per piece (f32) */
template <int FORMAT> struct run_x {
    static constexpr int loads = FORMAT == COLI_FMT_F32 ? 1 : fmt<FORMAT>::per_piece / 4;
};

/* One run's pieces of R rows (and, for one token, its x) into a ring slot. */
template <int FORMAT, int R, bool XPRE>
__device__ inline void gemv_load(const int4 *const (&w)[R], const float *const (&sr)[R], int32_t group, int gshift,
                                 const float4 *x, int pieces, int start, int lane, int4 (&wv)[R], float (&sc)[R][4],
                                 float4 (&xr)[run_x<FORMAT>::loads]) {
    constexpr int XU = fmt<FORMAT>::x_units;
    const int i = start + lane, nb = pieces - start < WARP ? pieces - start : WARP;
#pragma unroll
    for (int k = 0; k < R; k++) {
        wv[k] = i < pieces ? COLI_LOAD_STREAM(w[k] + i) : make_int4(0, 0, 0, 0);
        if constexpr (FORMAT == COLI_FMT_Q4)
#pragma unroll
            for (int m = 0; m < 4; m++) { /* word m holds the 8 columns from (start * 4 + m * nb + lane) * 8 */
                const int c = (start * 4 + m * nb + lane) * 8;
                sc[k][m] = i < pieces ? sr[k][gshift >= 0 ? c >> gshift : c / group] : 0.0f;
            }
    }
    if constexpr (XPRE)
#pragma unroll
        for (int j = 0; j < run_x<FORMAT>::loads; j++) {
            const int at = FORMAT == COLI_FMT_F32 ? i : (start * 4 + j / XU * nb + lane) * XU + j % XU;
            xr[j] = i < pieces ? __ldg(x + at) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
}

/* Where a warp finds x: loaded at use (any T) or carried in the ring (T = 1).
 * (Staging x once per block in shared memory instead was timed too: no faster.) */
enum { X_AT_USE = 0, X_RING = 1 };

/* One run's pieces (at `start`) into the sums. Each row's sum runs as CH
 * independent chains: one chain of dependent FMAs left the warps waiting on
 * their own results (ncu: a few warps per scheduler, each issuing every 4-6 cycles). */
template <int FORMAT, int R, int T, int XM>
__device__ inline void gemv_run(const int4 (&wv)[R], const float (&sc)[R][4], const float4 (&xr)[run_x<FORMAT>::loads],
                                const float4 *const (&xt)[T], int nt, int pieces, int start, int lane,
                                float (&acc)[R][T]) {
    constexpr int PW = fmt<FORMAT>::per_word;
    constexpr int XW = PW < 4 ? 4 : PW; /* x values loaded at once: a float4 at least */
    constexpr int CH = FORMAT == COLI_FMT_Q4 ? 2 : 4; /* int4 closes its chains every word, for the scale */
    const int i = start + lane;
    if (i >= pieces) return; /* only in a row's last run */
    const int nb = pieces - start < WARP ? pieces - start : WARP;
    float part[R][T][CH];
#pragma unroll
    for (int k = 0; k < R; k++)
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int c = 0; c < CH; c++) part[k][t][c] = 0.0f;
    float xv[T][XW]; /* f32 loads its float4 of x at m = 0 and uses it for all four words */
#pragma unroll
    for (int m = 0; m < 4; m++) {
        float wf[R][PW];
#pragma unroll
        for (int k = 0; k < R; k++) dequant<FORMAT>(word_of(wv[k], m), wf[k]);
#pragma unroll
        for (int t = 0; t < T; t++) {
            if (t >= nt) break;
            if (FORMAT == COLI_FMT_F32 ? m == 0 : true) {
                const float4 *xp = FORMAT == COLI_FMT_F32 ? xt[t] + i : xt[t] + (start * 4 + m * nb + lane) * fmt<FORMAT>::x_units;
#pragma unroll
                for (int j = 0; j < XW / 4; j++) {
                    const float4 v = XM == X_RING ? xr[FORMAT == COLI_FMT_F32 ? 0 : m * fmt<FORMAT>::x_units + j] : __ldg(xp + j);
                    xv[t][4 * j] = v.x, xv[t][4 * j + 1] = v.y, xv[t][4 * j + 2] = v.z, xv[t][4 * j + 3] = v.w;
                }
            }
#pragma unroll
            for (int k = 0; k < R; k++)
#pragma unroll
                for (int j = 0; j < PW; j++) {
                    float &p = part[k][t][(m * PW + j) % CH];
                    p = fmaf(wf[k][j], xv[t][(FORMAT == COLI_FMT_F32 ? m : 0) + j], p);
                }
        }
        if constexpr (FORMAT == COLI_FMT_Q4) /* a scale per word */
#pragma unroll
            for (int k = 0; k < R; k++)
#pragma unroll
                for (int t = 0; t < T; t++) {
                    acc[k][t] = fmaf(part[k][t][0] + part[k][t][1], sc[k][m], acc[k][t]);
                    part[k][t][0] = part[k][t][1] = 0.0f;
                }
    }
    if constexpr (FORMAT != COLI_FMT_Q4)
#pragma unroll
        for (int k = 0; k < R; k++)
#pragma unroll
            for (int t = 0; t < T; t++) acc[k][t] += (part[k][t][0] + part[k][t][1]) + (part[k][t][2] + part[k][t][3]);
}

/* One run through the planes of x (T = 1, int8 or int4): per word and row, the
 * integer dot product, then one conversion and one fma. */
template <int FORMAT, int R, int XM>
__device__ inline void gemv_run_planes(const int4 (&wv)[R], const float (&sc)[R][4],
                                       const float4 (&xr)[run_x<FORMAT>::loads], const float4 *xq, int pieces,
                                       int start, int lane, float (&acc)[R][1]) {
    constexpr int UW = fmt<FORMAT>::x_units; /* 16-byte units of planes per word */
    const int i = start + lane;
    if (i >= pieces) return; /* only in a row's last run */
    const int nb = pieces - start < WARP ? pieces - start : WARP;
#pragma unroll
    for (int m = 0; m < 4; m++) {
        float4 u[UW];
#pragma unroll
        for (int j = 0; j < UW; j++) u[j] = XM == X_RING ? xr[m * UW + j] : __ldg(xq + (start * 4 + m * nb + lane) * UW + j);
        const float e = UW == 1 ? u[0].w : u[UW - 1].z;
#pragma unroll
        for (int k = 0; k < R; k++) {
            const float dot = (float)word_dot<FORMAT>(word_of(wv[k], m), u);
            acc[k][0] = fmaf(dot, FORMAT == COLI_FMT_Q4 ? e * sc[k][m] : e, acc[k][0]);
        }
    }
}

/* QX: x is the planes of prep_x_kernel (T = 1, int8 and int4), else float32. */
template <int FORMAT, int R, int D, int T, int XM, bool QX>
__global__ void __launch_bounds__(256)
    gemv_kernel(const void *__restrict__ q, const float *__restrict__ scale, int64_t rows, int64_t cols,
                int32_t group, const float *__restrict__ x, int64_t s, float *__restrict__ y) {
    constexpr int PP = fmt<FORMAT>::per_piece;
    const int lane = threadIdx.x % WARP;
    const int64_t r0 = ((int64_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP) * R;
    const int64_t t0 = (int64_t)blockIdx.y * T;
    if (r0 >= rows) return; /* no barrier follows: a whole warp leaves together */
    const int nt = (int)(s - t0 < T ? s - t0 : T);
    const int pieces = (int)(cols / PP);
    const int gshift = FORMAT == COLI_FMT_Q4 && (group & (group - 1)) == 0 ? __ffs(group) - 1 : -1;
    const int4 *w[R];
    const float *sr[R];
    const float4 *xt[T];
#pragma unroll
    for (int k = 0; k < R; k++) { /* rows past the end re-read the last one; their sums are dropped */
        const int64_t row = r0 + k < rows ? r0 + k : rows - 1;
        w[k] = (const int4 *)q + row * pieces;
        sr[k] = FORMAT == COLI_FMT_Q4 ? scale + row * (cols / group) : scale;
    }
#pragma unroll
    for (int t = 0; t < T; t++) xt[t] = (const float4 *)(x + (t0 + (t < nt ? t : 0)) * cols);
    float acc[R][T];
#pragma unroll
    for (int k = 0; k < R; k++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[k][t] = 0.0f;

    constexpr bool XPRE = XM == X_RING;
    int4 ring[D][R];
    float ring_sc[D][R][4];
    float4 ring_x[D][run_x<FORMAT>::loads];
#pragma unroll
    for (int d = 0; d < D; d++)
        gemv_load<FORMAT, R, XPRE>(w, sr, group, gshift, xt[0], pieces, d * WARP, lane, ring[d], ring_sc[d], ring_x[d]);
    for (int run = 0; run < pieces; run += D * WARP) {
#pragma unroll
        for (int d = 0; d < D; d++) {
            if constexpr (QX)
                gemv_run_planes<FORMAT, R, XM>(ring[d], ring_sc[d], ring_x[d], xt[0], pieces, run + d * WARP, lane, acc);
            else
                gemv_run<FORMAT, R, T, XM>(ring[d], ring_sc[d], ring_x[d], xt, nt, pieces, run + d * WARP, lane, acc);
            gemv_load<FORMAT, R, XPRE>(w, sr, group, gshift, xt[0], pieces, run + (d + D) * WARP, lane, ring[d],
                                       ring_sc[d], ring_x[d]);
        }
    }
#pragma unroll
    for (int k = 0; k < R; k++)
#pragma unroll
        for (int t = 0; t < T; t++) {
            float v = acc[k][t];
#pragma unroll
            for (int o = WARP / 2; o > 0; o >>= 1) v += COLI_SHFL_XOR(v, o);
            if (lane == 0 && r0 + k < rows && t < nt)
                y[(t0 + t) * rows + r0 + k] = FORMAT == COLI_FMT_Q8 ? v * scale[r0 + k] : v;
        }
}

/* ---- S > 16: register tiles -----------------------------------------------------------
 * A block computes BM rows x TILE_N tokens, each thread a (BM / 16) x 4 patch.
 * Per step of TILE_K columns the block's W tile (f32 as 16-byte pieces, int8 and
 * int4 as 32-bit words, found through the layout) and x tile are loaded into
 * registers one step ahead, so the loads overlap the arithmetic of the step
 * before; they are then dequantised (scales applied, so any int4 group works)
 * into shared memory, k-major, and every thread does its FMAs for each pair of
 * shared loads. Needs cols % TILE_K == 0. */
#define TILE_N 64
#define TILE_K 64
#define TILE_THREADS 256

template <int FORMAT, int BM> struct tile_shape {
    static constexpr int units = FORMAT == COLI_FMT_F32 ? BM * TILE_K / 4 : BM * TILE_K / fmt<FORMAT>::per_word;
    static constexpr int per_unit = FORMAT == COLI_FMT_F32 ? 4 : fmt<FORMAT>::per_word; /* values per load */
    static constexpr int w_loads = (units + TILE_THREADS - 1) / TILE_THREADS;
    static constexpr int x_loads = TILE_N * TILE_K / 4 / TILE_THREADS; /* float4 of x per thread */
};

/* One step's W units (with their int4 scale, when a word has one) and x into registers. */
template <int FORMAT, int BM>
__device__ inline void tile_fetch(const void *__restrict__ q, const float *__restrict__ scale, int32_t group,
                                  int32_t layout, const float *__restrict__ x, int64_t rows, int64_t cols, int64_t s,
                                  int64_t m0, int64_t n0, int64_t k0, int4 (&wr)[tile_shape<FORMAT, BM>::w_loads],
                                  float (&wsc)[tile_shape<FORMAT, BM>::w_loads],
                                  float4 (&xr)[tile_shape<FORMAT, BM>::x_loads]) {
    using shape = tile_shape<FORMAT, BM>;
    constexpr int PU = shape::per_unit;
    const int64_t units_per_row = cols / PU;
#pragma unroll
    for (int j = 0; j < shape::w_loads; j++) {
        const int e = threadIdx.x + j * TILE_THREADS, row = e % BM, p = e / BM;
        const int64_t gr = m0 + row < rows ? m0 + row : rows - 1, un = k0 / PU + p;
        if (e >= shape::units) break;
        if constexpr (FORMAT == COLI_FMT_F32) {
            wr[j] = ((const int4 *)q)[gr * units_per_row + un];
        } else {
            const int64_t at = layout ? interleaved_word(un, units_per_row) : un;
            wr[j].x = (int)((const uint32_t *)q)[gr * units_per_row + at];
            if (FORMAT == COLI_FMT_Q4 && group % PU == 0) wsc[j] = scale[gr * (cols / group) + un * PU / group];
        }
    }
#pragma unroll
    for (int j = 0; j < shape::x_loads; j++) {
        const int e = threadIdx.x + j * TILE_THREADS, n = e % TILE_N, k4 = e / TILE_N;
        xr[j] = n0 + n < s ? __ldg((const float4 *)(x + (n0 + n) * cols + k0) + k4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

template <int FORMAT, int BM>
__global__ void __launch_bounds__(TILE_THREADS)
    tile_kernel(const void *__restrict__ q, const float *__restrict__ scale, int64_t rows, int64_t cols,
                int32_t group, int32_t layout, const float *__restrict__ x, int64_t s, float *__restrict__ y) {
    using shape = tile_shape<FORMAT, BM>;
    constexpr int PW = fmt<FORMAT>::per_word, PU = shape::per_unit, TM = BM / 16;
    __shared__ __align__(16) float ws[TILE_K][BM];
    __shared__ __align__(16) float xs[TILE_K][TILE_N];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16; /* tx: tokens, ty: rows */
    const int64_t m0 = (int64_t)blockIdx.x * BM, n0 = (int64_t)blockIdx.y * TILE_N;
    const bool word_scale = group % PU == 0; /* int4: one scale per word */
    float acc[TM][4] = {};
    int4 wr[shape::w_loads];
    float wsc[shape::w_loads];
    float4 xr[shape::x_loads];
    tile_fetch<FORMAT, BM>(q, scale, group, layout, x, rows, cols, s, m0, n0, 0, wr, wsc, xr);
    for (int64_t k0 = 0; k0 < cols; k0 += TILE_K) {
        /* registers -> shared: consecutive threads hold consecutive rows (tokens),
         * so the transposed stores fall in distinct banks */
#pragma unroll
        for (int j = 0; j < shape::w_loads; j++) {
            const int e = tid + j * TILE_THREADS, row = e % BM, p = e / BM;
            if (e >= shape::units) break;
            const int64_t gr = m0 + row < rows ? m0 + row : rows - 1;
#pragma unroll
            for (int m = 0; m < (FORMAT == COLI_FMT_F32 ? 4 : 1); m++) {
                float v[PW];
                dequant<FORMAT>(word_of(wr[j], m), v);
#pragma unroll
                for (int i = 0; i < PW; i++) {
                    const int kk = p * PU + m * PW + i;
                    if constexpr (FORMAT != COLI_FMT_Q4) ws[kk][row] = v[i];
                    else ws[kk][row] = v[i] * (word_scale ? wsc[j] : scale[gr * (cols / group) + (k0 + kk) / group]);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < shape::x_loads; j++) {
            const int e = tid + j * TILE_THREADS, n = e % TILE_N, k4 = e / TILE_N;
            xs[4 * k4][n] = xr[j].x, xs[4 * k4 + 1][n] = xr[j].y, xs[4 * k4 + 2][n] = xr[j].z, xs[4 * k4 + 3][n] = xr[j].w;
        }
        __syncthreads();
        if (k0 + TILE_K < cols)
            tile_fetch<FORMAT, BM>(q, scale, group, layout, x, rows, cols, s, m0, n0, k0 + TILE_K, wr, wsc, xr);
#pragma unroll 16
        for (int kk = 0; kk < TILE_K; kk++) {
            float av[TM];
            if constexpr (TM == 4) {
                const float4 a = *(const float4 *)&ws[kk][TM * ty];
                av[0] = a.x, av[1] = a.y, av[2] = a.z, av[3] = a.w;
            } else {
                const float2 a = *(const float2 *)&ws[kk][TM * ty];
                av[0] = a.x, av[1] = a.y;
            }
            const float4 b = *(const float4 *)&xs[kk][4 * tx];
            const float bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; i++) {
        const int64_t r = m0 + TM * ty + i;
        if (r >= rows) break;
        const float post = FORMAT == COLI_FMT_Q8 ? scale[r] : 1.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t t = n0 + 4 * tx + j;
            if (t < s) y[t * rows + r] = acc[i][j] * post;
        }
    }
}

/* ---- Any shape, either layout: one block per (output row, token) -------------------- */
template <int FORMAT>
__host__ __device__ inline float stored_value(const void *q, int64_t row, int64_t cols, int32_t layout, int64_t c) {
    if constexpr (FORMAT == COLI_FMT_F32) {
        return ((const float *)q)[row * cols + c];
    } else {
        constexpr int PW = fmt<FORMAT>::per_word, BITS = FORMAT == COLI_FMT_Q8 ? 8 : 4;
        const uint8_t *r = (const uint8_t *)q + row * cols * BITS / 8;
        const int64_t at = layout ? interleaved_word(c / PW, cols / PW) * 4 + c % PW * BITS / 8 : c * BITS / 8;
        if (FORMAT == COLI_FMT_Q8) return (float)(int8_t)r[at];
        return (float)((int)(c % 2 ? r[at] >> 4 : r[at] & 0x0F) - 8);
    }
}

template <int FORMAT>
__global__ void simple_kernel(const void *__restrict__ q, const float *__restrict__ scale, int64_t rows,
                              int64_t cols, int32_t group, int32_t layout, const float *__restrict__ x,
                              float *__restrict__ y) {
    __shared__ float partial[SIMPLE_THREADS];
    const int64_t r = blockIdx.x, t = blockIdx.y;
    const float *xt = x + t * cols;
    float acc = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += SIMPLE_THREADS) {
        const float v = xt[c] * stored_value<FORMAT>(q, r, cols, layout, c);
        acc += FORMAT == COLI_FMT_Q4 ? v * scale[r * (cols / group) + c / group] : v;
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int step = SIMPLE_THREADS / 2; step > 0; step >>= 1) {
        if ((int)threadIdx.x < step) partial[threadIdx.x] += partial[threadIdx.x + step];
        __syncthreads();
    }
    if (threadIdx.x == 0) y[t * rows + r] = FORMAT == COLI_FMT_Q8 ? partial[0] * scale[r] : partial[0];
}

/* ---- Launch ------------------------------------------------------------------------ */
#define GEMV_THREADS 256

/* One matmul on device pointers. The kernel variant per format and row count is
 * the fastest of those timed on the H200 (bench/gpu_matmul_bench.cu sweeps them). */
#define LAUNCH_ARGS w->q, w->scale, w->rows, w->cols, w->group, dx, s, dy

/* A warp per R rows, a grid row per T tokens. */
static dim3 gemv_grid(const coli_weight *w, int R, int64_t s, int T) {
    const int64_t per_block = (int64_t)(GEMV_THREADS / WARP) * R;
    return dim3((unsigned)((w->rows + per_block - 1) / per_block), (unsigned)((s + T - 1) / T));
}

template <int FORMAT, int R, int D, int T, int XM = T == 1 ? X_RING : X_AT_USE>
static void launch_gemv(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    const dim3 grid = gemv_grid(w, R, s, T);
    gemv_kernel<FORMAT, R, D, T, XM, false><<<grid, GEMV_THREADS, 0, stream>>>(LAUNCH_ARGS);
}

/* S = 1 through the planes of x: `planes` is device scratch of cols floats. */
template <int FORMAT, int R, int D, int XM = X_RING>
static void launch_gemv_planes(const coli_weight *w, const float *dx, float *planes, float *dy, cudaStream_t stream) {
    const int64_t groups = w->cols / 8;
    prep_x_kernel<FORMAT><<<(unsigned)((groups + 255) / 256), 256, 0, stream>>>(dx, w->cols, (float4 *)planes);
    const dim3 grid = gemv_grid(w, R, 1, 1);
    gemv_kernel<FORMAT, R, D, 1, XM, true><<<grid, GEMV_THREADS, 0, stream>>>(w->q, w->scale, w->rows, w->cols, w->group,
                                                                             planes, 1, dy);
}

/* Tokens per pass: the fewest of 1, 2, 4, 8 that cover s. */
template <int FORMAT, int R, int D>
static void launch_gemv_tokens(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    if (s == 1) launch_gemv<FORMAT, R, D, 1>(w, dx, s, dy, stream);
    else if (s == 2) launch_gemv<FORMAT, R, D, 2>(w, dx, s, dy, stream);
    else if (s <= 4) launch_gemv<FORMAT, R, D, 4>(w, dx, s, dy, stream);
    else launch_gemv<FORMAT, R, D, 8>(w, dx, s, dy, stream);
}

template <int FORMAT, int BM>
static void launch_tile(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    dim3 grid((unsigned)((w->rows + BM - 1) / BM), (unsigned)((s + TILE_N - 1) / TILE_N));
    tile_kernel<FORMAT, BM><<<grid, TILE_THREADS, 0, stream>>>(w->q, w->scale, w->rows, w->cols, w->group, w->layout,
                                                              dx, s, dy);
}

template <int FORMAT>
static void launch_simple(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    dim3 grid((unsigned)w->rows, (unsigned)s);
    simple_kernel<FORMAT><<<grid, SIMPLE_THREADS, 0, stream>>>(w->q, w->scale, w->rows, w->cols, w->group, w->layout,
                                                               dx, dy);
}

/* Multiprocessors of the current device, read once (a race here writes the same value). */
static int sm_count(void) {
    static int n = 0;
    if (n <= 0) {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess)
            n = v > 0 ? v : 1;
        else
            (void)cudaGetLastError();
    }
    return n > 0 ? n : 1;
}

/* Which kernel and shape each call takes: the fastest of the variants
 * bench/gpu_matmul_bench.cu sweeps, on the H200 (bench/RESULTS.md):
 *   S = 1      f32: float32 x, 2 rows per warp, a ring of 4 runs. int8 and int4:
 *              the planes of x (integer dot products) with 2 rows per warp and a
 *              ring of 4 (int8) or 2 (int4) runs, or 4 (int8) and 2 (int4) rows
 *              with one run when rows fill the GPU; small int8 weights do as well
 *              without the planes' extra launch. Without scratch for the planes
 *              the float32 path serves every format.
 *   S <= 16    2 rows per warp, a ring of 2 runs, up to 8 tokens per pass.
 *   S > 16     tiles; half-height ones when full ones would not give every
 *              multiprocessor a block. */
#define GEMV_MAX_S 16

/* COLI_GPU_SIMPLE=1: the simple kernel only, and weights in the ABI's order, for comparisons. */
static bool simple_only(void) {
    static int simple = -1;
    if (simple < 0) simple = getenv("COLI_GPU_SIMPLE") != NULL;
    return simple != 0;
}

template <int FORMAT>
static void launch_format(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream,
                          bool simple, float *planes) {
    const bool pieces = FORMAT == COLI_FMT_F32 ? w->cols % 4 == 0 : w->layout != 0;
    if (simple) {
        launch_simple<FORMAT>(w, dx, s, dy, stream);
    } else if (s > GEMV_MAX_S && w->cols % TILE_K == 0) {
        if ((w->rows + 63) / 64 * ((s + TILE_N - 1) / TILE_N) < sm_count()) launch_tile<FORMAT, 32>(w, dx, s, dy, stream);
        else launch_tile<FORMAT, 64>(w, dx, s, dy, stream);
    } else if (!pieces) {
        launch_simple<FORMAT>(w, dx, s, dy, stream);
    } else if (s > 1) {
        launch_gemv_tokens<FORMAT, 2, 2>(w, dx, s, dy, stream);
    } else if (FORMAT == COLI_FMT_F32 || !planes || (FORMAT == COLI_FMT_Q8 && w->rows < 8192 && w->cols < 8192)) {
        launch_gemv<FORMAT, 2, 4, 1>(w, dx, s, dy, stream);
    } else if constexpr (FORMAT == COLI_FMT_Q8) {
        if (w->rows >= 8192) launch_gemv_planes<FORMAT, 4, 1>(w, dx, planes, dy, stream);
        else launch_gemv_planes<FORMAT, 2, 4>(w, dx, planes, dy, stream);
    } else if constexpr (FORMAT == COLI_FMT_Q4) {
        if (w->rows >= 8192) launch_gemv_planes<FORMAT, 2, 1>(w, dx, planes, dy, stream);
        else launch_gemv_planes<FORMAT, 2, 2>(w, dx, planes, dy, stream);
    }
}

/* One matmul on device pointers; `planes` (device, cols floats, or NULL) lets
 * int8 and int4 decode go through the planes of x. */
static cudaError_t launch_matmul(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream,
                                 float *planes) {
    const bool simple = simple_only();
    switch (w->format) {
    case COLI_FMT_F32: launch_format<COLI_FMT_F32>(w, dx, s, dy, stream, simple, planes); break;
    case COLI_FMT_Q8: launch_format<COLI_FMT_Q8>(w, dx, s, dy, stream, simple, planes); break;
    default: launch_format<COLI_FMT_Q4>(w, dx, s, dy, stream, simple, planes);
    }
    return cudaGetLastError();
}

#endif
