/* The router and the routed experts on the GPU: a route op's picks (a warp a row,
 * coli_route's steps), a decode's experts as an up kernel that may route its own row
 * and a down kernel that adds the picks in expert order, and a prefill's experts
 * grouped by expert in tiles. */
#ifndef COLI_GPU_EXPERTS_CUH
#define COLI_GPU_EXPERTS_CUH

#include "gpu_steps.cuh"

/* ---- the router: a warp a row, coli_route's steps ------------------------------ */

/* The two largest of a multiset, merged across the warp: the same two values in any order. */
__device__ inline void warp_top2(float &a, float &b) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) {
        const float oa = COLI_SHFL_XOR(a, o), ob = COLI_SHFL_XOR(b, o);
        const float hi = fmaxf(a, oa), lo = fmaxf(fminf(a, oa), fmaxf(b, ob));
        a = hi, b = lo;
    }
}

/* A route op's operands, for route_kernel and for the decode's experts that route
 * their own row (moe_up_kernel's ROUTED). */
struct route_args {
    const float *logits, *bias;
    int32_t *idx;
    float *w;
    int experts, groups, topk_group, k, norm;
    float scaling;
    bool bias_early; /* as load_then_wait's EARLY: no op of the step writes the bias */
};

/* route_row's scratch, in shared memory. */
struct route_scratch {
    float score[1024], choice[1024], gscore[1024];
    unsigned char group_on[1024], taken[1024];
};

/* Experts a lane holds on route_row_held's path, at most (route_row picks 2, 4 or 8:
 * every slot costs its instructions whether or not it holds an expert). */
#define ROUTE_HELD 8

/* route_row where the experts are one group, at most ROUTE_HELD a lane, and k at most
 * a warp, with no NaN among the choices: each lane holds its experts' choices as
 * order keys (-0 taken as +0, so equal floats give equal keys), and a pick is the
 * warp's largest key and the lowest expert holding it, two warp reductions where
 * warp_best's exchanges took ten, each waiting on the last; the same picks, the first
 * maximum as coli_route's. False (nothing written) where it does not apply. */
template <int H> __device__ inline bool route_row_held(const route_args &a, int64_t r, int32_t *ri, float *rw, int lane) {
    const int E = a.experts, k = a.k;
    if (a.groups != 1 || a.topk_group < 1 || E > H * WARP || k > WARP) return false;
    const float *lg = a.logits + r * E;
    float score[H];
    uint32_t key[H], nan = 0;
#pragma unroll
    for (int h = 0; h < H; h++) {
        const int e = lane + h * WARP;
        score[h] = 0.0f, key[h] = 0u; /* below every float's key: never picked */
        if (e < E) {
            score[h] = 1.0f / (1.0f + expf(-lg[e]));
            const float c = score[h] + a.bias[e];
            nan |= c != c;
            key[h] = order_key(c == 0.0f ? 0.0f : c);
        }
    }
    if (coli_warp_max(nan)) return false;
    float sum = 0.0f, mine = 0.0f;
    int32_t pick = 0;
    for (int j = 0; j < k; j++) {
        uint32_t lk = 0u, le = 0xFFFFFFFFu; /* this lane's largest key, its lowest expert */
        float ls = 0.0f;
#pragma unroll
        for (int h = 0; h < H; h++)
            if (key[h] > lk) lk = key[h], le = (uint32_t)(lane + h * WARP), ls = score[h];
        const uint32_t top = coli_warp_max(lk), e = coli_warp_min(lk == top ? le : 0xFFFFFFFFu);
        const float se = COLI_SHFL(ls, (int)(e % WARP)); /* its lane's own best is e */
#pragma unroll
        for (int h = 0; h < H; h++)
            if ((uint32_t)(lane + h * WARP) == e) key[h] = 0u;
        if (j == lane) mine = se, pick = (int32_t)e;
        sum += se;
    }
    sum += 1e-20f;
    if (lane < k) ri[lane] = pick, rw[lane] = (a.norm ? mine / sum : mine) * a.scaling;
    return true;
}

/* coli_route's steps for row r on one warp, its picks and weights into ri and rw:
 * route_row_held where it applies, else every pick a warp-wide first maximum
 * (warp_best), so each takes a few shuffles instead of a pass over the experts on one
 * thread. 32-bit indices: a 64-bit
 * division is a long software routine on a GPU. */
__device__ inline void route_row(const route_args &a, int64_t r, int32_t *ri, float *rw, route_scratch &s, int lane) {
    if (a.experts <= 2 * WARP ? route_row_held<2>(a, r, ri, rw, lane)
        : a.experts <= 4 * WARP ? route_row_held<4>(a, r, ri, rw, lane)
                                : route_row_held<ROUTE_HELD>(a, r, ri, rw, lane))
        return;
    const int E = a.experts, G = a.groups, per = E / G, k = a.k;
    const float *lg = a.logits + r * E;
    for (int e = lane; e < E; e += WARP) {
        s.score[e] = 1.0f / (1.0f + expf(-lg[e]));
        s.choice[e] = s.score[e] + a.bias[e];
        s.taken[e] = 0;
    }
    COLI_SYNC_WARP();
    for (int g = 0; g < G; g++) {
        float hi = -INFINITY, lo = -INFINITY;
        for (int e = g * per + lane; e < (g + 1) * per; e += WARP) {
            if (s.choice[e] > hi) lo = hi, hi = s.choice[e];
            else if (s.choice[e] > lo) lo = s.choice[e];
        }
        warp_top2(hi, lo);
        if (lane == 0) s.gscore[g] = hi + lo, s.group_on[g] = 0;
    }
    COLI_SYNC_WARP();
    for (int j = 0; j < a.topk_group; j++) {
        float v = -INFINITY;
        int best = -1;
        for (int g = lane; g < G; g += WARP)
            if (!s.group_on[g] && (best < 0 || s.gscore[g] > v)) v = s.gscore[g], best = g;
        warp_best(v, best);
        if (best < 0) break;
        COLI_SYNC_WARP(); /* every lane has read group_on before it changes */
        if (lane == 0) s.group_on[best] = 1;
        COLI_SYNC_WARP();
    }
    float sum = 0.0f, mine = 0.0f; /* mine: pick `lane`'s score */
    for (int j = 0; j < k; j++) {
        float v = -INFINITY;
        int best = -1;
        for (int e = lane; e < E; e += WARP)
            if (s.group_on[e / per] && !s.taken[e] && (best < 0 || s.choice[e] > v)) v = s.choice[e], best = e;
        warp_best(v, best);
        if (best < 0) best = 0;
        COLI_SYNC_WARP(); /* every lane has read taken before it changes */
        if (lane == 0) s.taken[best] = 1, ri[j] = best;
        if (j == lane) mine = s.score[best];
        sum += s.score[best];
        COLI_SYNC_WARP();
    }
    sum += 1e-20f;
    /* the weights: lane j writes pick j's, held since its pick (and j + 32's, ...) */
    for (int j = lane; j < k; j += WARP) {
        const float sj = j == lane ? mine : s.score[ri[j]];
        rw[j] = (a.norm ? sj / sum : sj) * a.scaling;
    }
}

/* A row a one-warp block. */
__global__ void route_kernel(route_args a) {
    STEP_KERNEL_BEGIN();
    __shared__ route_scratch s;
    const int64_t r = blockIdx.x;
    route_row(a, r, a.idx + r * a.k, a.w + r * a.k, s, (int)threadIdx.x);
}

/* ---- the routed experts -------------------------------------------------------- */

/* An expert's weight as the kernels read it: any layout (stored_value). */
struct dev_weight {
    const void *q;
    const float *scale;
    int64_t rows, cols;
    int32_t group, layout;
};

/* Where an int4 row's words find their scales (groups of a whole number of words,
 * row-major): 32-bit, a shift where the words a group are a power of two, as every
 * group the engine writes; a 64-bit division, here once a word, is a long software
 * routine on a GPU. Only int4 reads it; other formats get a harmless group of a word. */
template <int FORMAT> struct q4_scale_of {
    uint32_t per_row, words, shift; /* groups a row, words a group, log2 of that (32: not a power of two) */
    __device__ q4_scale_of(int64_t cols, int32_t group)
        : per_row((uint32_t)cols / (uint32_t)(FORMAT == COLI_FMT_Q4 ? group : fmt<FORMAT>::per_word)),
          words(FORMAT == COLI_FMT_Q4 ? (uint32_t)group / (uint32_t)fmt<FORMAT>::per_word : 1u), shift(0) {
        while (shift < 31 && (1u << shift) < words) shift++;
        if ((1u << shift) != words) shift = 32;
    }
    __device__ int64_t at(int64_t row, int64_t wn) const {
        const uint32_t w = (uint32_t)wn;
        return row * per_row + (shift < 32 ? w >> shift : w / words);
    }
};

/* A row of an expert's weight dotted with x, on a warp: whole 32-bit words a lane
 * (4 int8 or 8 int4 values, dequantised exactly as the matmul kernels do), in the
 * ABI's order or the mma layout's; value by value (stored_value) otherwise. */
template <int FORMAT> __device__ inline float weight_row_dot(const dev_weight &w, int64_t row, const float *x, int lane) {
    constexpr int PW = fmt<FORMAT>::per_word;
    float acc = 0.0f;
    const bool words = w.cols % PW == 0 && w.layout != TILE_LAYOUT && (FORMAT != COLI_FMT_Q4 || w.group % PW == 0);
    if (words) {
        const int64_t per_row = w.cols / PW, base = row * per_row;
        const uint32_t *q = (const uint32_t *)w.q;
        const q4_scale_of<FORMAT> scales(w.cols, w.group);
        for (int64_t wn = lane; wn < per_row; wn += WARP) {
            float v[PW];
            dequant<FORMAT>(q[w.layout ? mma_word(base + wn) : base + wn], v);
            const float *xs = x + wn * PW;
            float part = 0.0f;
#pragma unroll
            for (int k = 0; k < PW; k++) part += v[k] * xs[k];
            acc += FORMAT == COLI_FMT_Q4 ? part * w.scale[scales.at(row, wn)] : part;
        }
    } else {
        for (int64_t c = lane; c < w.cols; c += WARP) {
            const float v = x[c] * stored_value<FORMAT>(w.q, row, w.cols, w.layout, c);
            acc += FORMAT == COLI_FMT_Q4 ? v * stored_scale(w.scale, row, w.cols, w.group, w.layout, c) : v;
        }
    }
    acc = warp_sum(acc);
    return FORMAT == COLI_FMT_Q8 ? acc * w.scale[row] : acc;
}

/* weight_row_dot as a call, for the rare rows a kernel's held path does not take: its
 * registers then stay out of the held path's count. */
template <int FORMAT>
__device__ __noinline__ float row_dot_apart(const dev_weight &w, int64_t row, const float *x, int lane) {
    return weight_row_dot<FORMAT>(w, row, x, lane);
}

/* Experts whose weights' descriptions a block of moe_up_kernel or moe_down_kernel
 * copies to shared memory while the kernels before it still run (the step never
 * changes them), so an expert's pick waits on no load of its description. */
#define EXPERT_TABLE 128

/* A piece of a row of up to HELD words a lane in registers (HELD 2, 4 or ROW_HELD, the
 * fewest that hold the piece, picked by launch_moe; every slot costs its instructions
 * whether or not it holds a word): weight_row_dot's words path over words [first, end) with
 * every word (and int4 scale) of the lane loaded before any is used, so a decode's
 * expert rows wait for memory once, not once per few words. */
#define ROW_HELD 8
template <int FORMAT> __host__ __device__ inline int64_t piece_words(int64_t cols, int split) {
    return (cols / fmt<FORMAT>::per_word + split - 1) / split;
}

/* Warps a row of moe_up_kernel: each dots its piece of the row's words, so a
 * decode's few rows spread over that many times the warps and each waits on that
 * fraction of the loads (one warp a row left a decode's grid on half the SMs, each
 * warp's loads and sums in series: ncu, latency-bound). Four, or eight (a block's
 * every warp on one row) where four would leave a lane more than two words: each lane
 * then dequantises and sums fewer words in series, but a lane with one word in a slot
 * of two pays for both, so rows of two words a lane at four warps keep four
 * (bench/RESULTS.md). */
template <int FORMAT> __host__ __device__ inline int moe_up_split(int64_t cols) {
    return (piece_words<FORMAT>(cols, 4) + WARP - 1) / WARP > 2 ? 8 : 4;
}
template <int FORMAT, int HELD> __device__ inline bool row_held(const dev_weight &w, int split) {
    constexpr int PW = fmt<FORMAT>::per_word;
    return w.cols % PW == 0 && w.layout != TILE_LAYOUT && (FORMAT != COLI_FMT_Q4 || w.group % PW == 0) &&
           piece_words<FORMAT>(w.cols, split) <= HELD * WARP;
}

template <int FORMAT, int HELD>
__device__ inline void row_words(const dev_weight &w, int64_t row, int64_t first, int64_t end, int lane,
                                 uint32_t (&q)[HELD], float (&sc)[HELD]) {
    constexpr int PW = fmt<FORMAT>::per_word;
    const int64_t base = row * (w.cols / PW);
    const uint32_t *words = (const uint32_t *)w.q;
    const q4_scale_of<FORMAT> scales(w.cols, w.group);
#pragma unroll
    for (int j = 0; j < HELD; j++) {
        const int64_t wn = first + lane + (int64_t)j * WARP;
        q[j] = wn < end ? words[w.layout ? mma_word(base + wn) : base + wn] : 0u;
        sc[j] = FORMAT == COLI_FMT_Q4 && wn < end ? w.scale[scales.at(row, wn)] : 0.0f;
    }
}

/* The piece's dot from the held words, weight_row_dot's products (int8: scaled). */
template <int FORMAT, int HELD>
__device__ inline float row_dot_held(const dev_weight &w, int64_t row, int64_t first, int64_t end, const float *x,
                                     int lane, const uint32_t (&q)[HELD], const float (&sc)[HELD]) {
    constexpr int PW = fmt<FORMAT>::per_word;
    float acc = 0.0f;
    /* a guard, not a break: every word's loads of x may then be issued together */
#pragma unroll
    for (int j = 0; j < HELD; j++) {
        const int64_t wn = first + lane + (int64_t)j * WARP;
        if (wn < end) {
            float v[PW];
            dequant<FORMAT>(q[j], v);
            const float *xs = x + wn * PW;
            float part = 0.0f;
#pragma unroll
            for (int k = 0; k < PW; k++) part += v[k] * xs[k];
            acc += FORMAT == COLI_FMT_Q4 ? part * sc[j] : part;
        }
    }
    acc = warp_sum(acc);
    return FORMAT == COLI_FMT_Q8 ? acc * w.scale[row] : acc;
}

/* gu[pair][i] = silu(gate_e x . ) * (up_e x), pair = (row, j) with e = idx[pair];
 * `split` (moe_up_split) warps an output, their pieces added in piece order. ROUTED: the route
 * op before it is this kernel's too (a decode's few rows): each block's first warp
 * routes the block's row itself, so the experts wait for no kernel between the
 * router's logits and their loads, and the first block of each row writes the
 * row's picks and weights for moe_down_kernel. */
template <int FORMAT, bool ROUTED, int HELD>
__global__ void moe_up_kernel(const dev_weight *ws, const float *x, const int32_t *idx, float *gu, int64_t k,
                              int64_t inter, int64_t hid, int64_t experts, int split, route_args route) {
    __shared__ float parts[2][STEP_THREADS / WARP];
    __shared__ dev_weight table[2 * EXPERT_TABLE]; /* each expert's gate and up, as moe_down_kernel's */
    coli_allow_next_grid();
    const bool tabled = experts <= EXPERT_TABLE;
    if (tabled)
        for (int64_t t = threadIdx.x; t < 2 * experts; t += blockDim.x) table[t] = ws[3 * (t / 2) + t % 2];
    /* the route's bias into L1 before the wait, as load_then_wait's loads; a request,
     * not a load: the wait makes the earlier grids' writes visible to the loads after
     * it, so bias_early spares a wasted request rather than guarding a value */
    if (ROUTED && route.bias_early && threadIdx.x < WARP)
        for (int e = (int)threadIdx.x * 32; e < route.experts; e += WARP * 32) coli_prefetch_l1(route.bias + e);
    coli_wait_prior_grid();
    const int warp = threadIdx.x / WARP, piece = warp % split, lane = threadIdx.x % WARP;
    const int64_t pair = blockIdx.y, i = blockIdx.x * (int64_t)(blockDim.x / WARP / split) + warp / split;
    int32_t e;
    if constexpr (ROUTED) {
        __shared__ route_scratch s;
        __shared__ int32_t picks[16];
        __shared__ float weights[16];
        const int64_t row = blockIdx.y / (uint32_t)k, j = blockIdx.y % (uint32_t)k; /* 32-bit, as attention's */
        /* a pick past the route's (route_then_moe's one more) is in idx already, read beside the route */
        const int32_t fixed = j < route.k ? 0 : idx[pair];
        if (threadIdx.x < WARP) route_row(route, row, picks, weights, s, lane);
        __syncthreads();
        if (blockIdx.x == 0 && j == 0 && (int)threadIdx.x < route.k)
            route.idx[row * k + threadIdx.x] = picks[threadIdx.x], route.w[row * k + threadIdx.x] = weights[threadIdx.x];
        e = j < route.k ? picks[j] : fixed;
    } else {
        (void)route;
        e = idx[pair];
        __syncthreads(); /* the table's writes before its reads */
    }
    const bool on = i < inter && e >= 0 && e < experts;
    float g = 0.0f, u = 0.0f;
    if (on) {
        const float *xr = x + blockIdx.y / (uint32_t)k * hid;
        /* both read before either dot: one wait, not two */
        const dev_weight wg = tabled ? table[2 * e] : ws[3 * e], wu = tabled ? table[2 * e + 1] : ws[3 * e + 1];
        if (row_held<FORMAT, HELD>(wg, split) && row_held<FORMAT, HELD>(wu, split) && wg.cols == wu.cols) {
            const int64_t span = piece_words<FORMAT>(wg.cols, split), first = piece * span, per_row = wg.cols / fmt<FORMAT>::per_word;
            const int64_t end = first + span < per_row ? first + span : per_row;
            uint32_t qg[HELD], qu[HELD];
            float sg[HELD], su[HELD];
            row_words<FORMAT, HELD>(wg, i, first, end, lane, qg, sg);
            row_words<FORMAT, HELD>(wu, i, first, end, lane, qu, su);
            g = row_dot_held<FORMAT, HELD>(wg, i, first, end, xr, lane, qg, sg);
            u = row_dot_held<FORMAT, HELD>(wu, i, first, end, xr, lane, qu, su);
        } else if (piece == 0) { /* rows too long to hold: the first warp takes the whole row */
            g = weight_row_dot<FORMAT>(wg, i, xr, lane), u = weight_row_dot<FORMAT>(wu, i, xr, lane);
        }
    }
    if (lane == 0) parts[0][warp] = g, parts[1][warp] = u;
    __syncthreads();
    if (!on || piece != 0 || lane != 0) return;
    float gs = 0.0f, us = 0.0f;
    for (int q = 0; q < split; q++) gs += parts[0][warp + q], us += parts[1][warp + q];
    gu[pair * inter + i] = dev_silu(gs) * us;
}

/* A row's output: sum over its picks in ascending expert order (ties in pick order)
 * of w * value(pair, e), a pick outside the experts adding 0; the one order both
 * expert paths add in. ri and rw: the row's k picks and weights, first_pair its first
 * pair (row * k). Each step takes the least (expert, pick) past the last one added,
 * k passes over k picks: a sorted copy of the picks would sit in local memory. */
template <typename Value>
__device__ inline float expert_sum_of(const int32_t *ri, const float *rw, int64_t first_pair, int64_t k,
                                      int64_t experts, Value value) {
    float acc = 0.0f;
    int32_t last_e = INT32_MIN;
    int last_j = -1;
    for (int n = 0; n < (int)k; n++) {
        int best = -1;
        int32_t best_e = 0;
        for (int j = 0; j < (int)k; j++) {
            const int32_t e = ri[j];
            const bool past = e > last_e || (e == last_e && j > last_j);
            if (past && (best < 0 || e < best_e)) best = j, best_e = e;
        }
        last_e = best_e, last_j = best;
        acc += (best_e >= 0 && best_e < experts ? value(first_pair + best, best_e) : 0.0f) * rw[best];
    }
    return acc;
}

template <typename Value>
__device__ inline float expert_sum(const int32_t *idx, const float *w, int64_t r, int64_t k, int64_t experts, Value value) {
    return expert_sum_of(idx + r * k, w + r * k, r * k, k, experts, value);
}

/* The down projections of a decode's picks, value by value: vals[pick] of an output. */
struct held_value {
    const float *vals;
    int64_t first_pair;
    __device__ float operator()(int64_t pair, int32_t) const { return vals[pair - first_pair]; }
};

/* (output, pick) dots a warp of moe_down_kernel takes at once: a decode's down rows
 * are its experts' intermediate width, a word a lane, so a warp with one dot waited
 * on memory for a word; with down_items every load of them is in flight together.
 * int4 two: its words hold 8 inputs each, and four items' took more registers than
 * the kernel's bound leaves; int8 two as well: with the up kernel on eight warps a
 * row, two items a warp and twice the warps were the faster (bench/RESULTS.md). */
template <int FORMAT> __host__ __device__ constexpr int down_items() { return FORMAT == COLI_FMT_F32 ? 4 : 2; }

/* Outputs a block of moe_down_kernel takes: its warps share them out down_items
 * (output, pick) dots each, so a row's k dots run side by side. */
template <int FORMAT> __host__ __device__ inline int64_t moe_down_outputs(int64_t k) {
    const int64_t items = STEP_THREADS / WARP * down_items<FORMAT>();
    return k > 0 && k < items ? items / k : 1;
}

/* Whether a down row's words fit a word a lane on moe_down_kernel's held path:
 * weight_row_dot's words path. */
template <int FORMAT> __device__ inline bool down_held(const dev_weight &w) {
    constexpr int PW = fmt<FORMAT>::per_word;
    return w.cols % PW == 0 && w.layout != TILE_LAYOUT && (FORMAT != COLI_FMT_Q4 || w.group % PW == 0) &&
           w.cols / PW <= WARP;
}

/* out[row][d] = expert_sum of the down rows d: a warp down_items (d, pick) dots, each
 * weight_row_dot's sums (a word a lane, every item's loads issued before any is
 * used), then a thread an output adds its picks in that order. Four blocks an SM, so
 * 64 registers a thread at most (HIP reads the number as waves an EU: 1): it is launched
 * early and holds its room while the experts' first kernel runs, and at two blocks
 * an SM (124 registers) that room was every register the SM had, so the shared
 * expert's kernels beside it could not start until the first kernel's blocks left.
 * An item holds no more than its word, scale and inputs (its weight's description is
 * read again from the table where a dot needs it). HALVES 2 (int4 rows of at most 16
 * words, launch_moe): each half of a team dots its own items, so a block takes twice
 * the outputs and the grid (launched early, holding its room) half the blocks.
 * per_block: the outputs a block takes (moe_down_outputs, times HALVES). */
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) || defined(COLI_USE_HIP)
#define DOWN_MIN_BLOCKS 1
#else
#define DOWN_MIN_BLOCKS 4
#endif
/* A half team's sum, lanes [16 h, 16 h + 16): warp_sum's pairs after its first
 * (which, with the other half's lanes 0, adds 0), so the same bits as warp_sum over
 * a dot whose lanes past 16 hold nothing. */
__device__ inline float half_sum(float v) {
#pragma unroll
    for (int o = WARP / 4; o > 0; o >>= 1) v += COLI_SHFL_XOR(v, o);
    return v;
}

template <int FORMAT, int HALVES>
__global__ void __launch_bounds__(STEP_THREADS, DOWN_MIN_BLOCKS) moe_down_kernel(const dev_weight *ws, const float *gu, const int32_t *idx, const float *w, float *out,
                                int64_t k, int64_t inter, int64_t hid, int64_t experts, int per_block) {
    constexpr int PW = fmt<FORMAT>::per_word, ITEMS = down_items<FORMAT>();
    __shared__ float vals[STEP_THREADS / WARP * ITEMS * HALVES];
    __shared__ dev_weight table[EXPERT_TABLE];
    __shared__ int32_t picks[16];
    __shared__ float weights[16];
    coli_allow_next_grid();
    const bool tabled = experts <= EXPERT_TABLE;
    if (tabled)
        for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) table[e] = ws[3 * e + 2];
    coli_wait_prior_grid();
    /* 32-bit: a decode's outputs and items are few */
    const int r = blockIdx.y, kk = (int)k, per = per_block, d0 = blockIdx.x * per, items = per * kk;
    if (threadIdx.x < k) picks[threadIdx.x] = idx[r * k + threadIdx.x], weights[threadIdx.x] = w[r * k + threadIdx.x];
    __syncthreads();
    /* HALVES 2: each half of a team its own items (rows of at most 16 words) */
    const int nw = blockDim.x / WARP, half = HALVES == 2 ? threadIdx.x % WARP / (WARP / 2) : 0;
    const int lane = HALVES == 2 ? threadIdx.x % (WARP / 2) : threadIdx.x % WARP;
    for (int first = threadIdx.x / WARP * ITEMS * HALVES; first < items; first += nw * ITEMS * HALVES) {
        uint32_t q[ITEMS], held = 0u, live = 0u;
        float sc[ITEMS], rs[ITEMS], xv[ITEMS][PW];
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            const int item = first + i * HALVES + half, j = item % kk;
            const int64_t d = d0 + item / kk;
            const int32_t e = item < items ? picks[j] : -1;
            q[i] = 0u, sc[i] = 0.0f, rs[i] = 0.0f;
#pragma unroll
            for (int c = 0; c < PW; c++) xv[i][c] = 0.0f;
            if (item >= items || d >= hid || e < 0 || e >= experts) continue;
            live |= 1u << i;
            const dev_weight &wt = tabled ? table[e] : ws[3 * e + 2];
            if (!down_held<FORMAT>(wt)) continue;
            held |= 1u << i;
            const int64_t per_row = wt.cols / PW, at = d * per_row + lane;
            if (lane >= per_row) continue; /* its word adds nothing: q, scale and inputs 0 */
            q[i] = ((const uint32_t *)wt.q)[wt.layout ? mma_word(at) : at];
            if (FORMAT == COLI_FMT_Q4) sc[i] = wt.scale[q4_scale_of<FORMAT>(wt.cols, wt.group).at(d, lane)];
            if (FORMAT == COLI_FMT_Q8) rs[i] = wt.scale[d];
            const float *xs = gu + ((int64_t)r * k + j) * inter + lane * PW;
#pragma unroll
            for (int c = 0; c < PW; c++) xv[i][c] = xs[c];
        }
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            const int item = first + i * HALVES + half;
            float v = 0.0f;
            if (HALVES == 2 || (held >> i & 1u)) { /* HALVES 2 is launched only where every row is held */
                float wv[PW];
                dequant<FORMAT>(q[i], wv);
                float part = 0.0f;
#pragma unroll
                for (int c = 0; c < PW; c++) part += wv[c] * xv[i][c];
                const float pre = FORMAT == COLI_FMT_Q4 ? part * sc[i] : part;
                const float acc = HALVES == 2 ? half_sum(pre) : warp_sum(pre);
                v = FORMAT == COLI_FMT_Q8 ? acc * rs[i] : acc;
            } else if (live >> i & 1u) {
                const int j = item % kk;
                const int32_t e = picks[j];
                v = row_dot_apart<FORMAT>(tabled ? table[e] : ws[3 * e + 2], d0 + item / kk,
                                           gu + ((int64_t)r * k + j) * inter, lane);
            }
            if (lane == 0 && item < items) vals[item] = v;
        }
    }
    __syncthreads();
    const int64_t d = d0 + threadIdx.x;
    if ((int)threadIdx.x < per && d < hid)
        out[r * hid + d] = expert_sum_of(picks, weights, r * k, k, experts, held_value{vals + threadIdx.x * k, r * k});
}

/* Many rows (a prefill): the pairs grouped by expert, so that a block reads its
 * expert's rows once for up to MOE_TILE pairs routed to it (from L1 after the
 * first) instead of once a pair, and cut into tiles of at most MOE_TILE pairs so
 * that an expert most rows pick is spread over many blocks. Each pair's output is
 * its own and the combine adds a row's in expert order, so the order within a
 * group does not matter. */
#define MOE_TILE 8

/* The most tiles `pairs` pairs over `experts` experts can make. */
static inline int64_t moe_tiles_max(int64_t pairs, int64_t experts) { return pairs / MOE_TILE + experts; }

/* order[]: the pairs (row * k + j) sorted into groups by expert; tiles[3t..3t+2]:
 * tile t's expert and its range of order, for t < *n_tiles. One block. */
__global__ void moe_group_kernel(const int32_t *idx, int32_t *order, int32_t *tiles, int32_t *n_tiles, int pairs,
                                 int experts) {
    STEP_KERNEL_BEGIN();
    __shared__ int32_t next[1025];
    for (int e = threadIdx.x; e <= experts; e += blockDim.x) next[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x)
        if (idx[p] >= 0 && idx[p] < experts) atomicAdd(&next[idx[p] + 1], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int t = 0;
        for (int e = 0; e < experts; e++) {
            for (int s = next[e]; s < next[e] + next[e + 1]; s += MOE_TILE, t++) {
                const int end = next[e] + next[e + 1];
                tiles[3 * t] = e, tiles[3 * t + 1] = s, tiles[3 * t + 2] = s + MOE_TILE < end ? s + MOE_TILE : end;
            }
            next[e + 1] += next[e];
        }
        *n_tiles = t;
    }
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x)
        if (idx[p] >= 0 && idx[p] < experts) order[atomicAdd(&next[idx[p]], 1)] = p;
}

/* Tile blockIdx.y's pairs through its expert, a warp an output row r: the gate and
 * up rows (UP: out = gu[pair], from x's rows) or the down row (out = eo[pair], from gu[pair]). */
template <int FORMAT, bool UP>
__global__ void moe_tile_kernel(const dev_weight *ws, const float *in, const int32_t *order, const int32_t *tiles,
                                const int32_t *n_tiles, float *out, int64_t k, int64_t rows, int64_t cols) {
    STEP_KERNEL_BEGIN();
    const int t = blockIdx.y, lane = threadIdx.x % WARP;
    const int64_t r = blockIdx.x * (int64_t)(blockDim.x / WARP) + threadIdx.x / WARP;
    if (t >= *n_tiles || r >= rows) return;
    const int e = tiles[3 * t];
    for (int s = tiles[3 * t + 1]; s < tiles[3 * t + 2]; s++) {
        const int64_t pair = order[s];
        float v;
        if (UP) {
            const float *xr = in + pair / k * cols;
            v = dev_silu(weight_row_dot<FORMAT>(ws[3 * e], r, xr, lane)) * weight_row_dot<FORMAT>(ws[3 * e + 1], r, xr, lane);
        } else {
            v = weight_row_dot<FORMAT>(ws[3 * e + 2], r, in + pair * cols, lane);
        }
        if (lane == 0) out[pair * rows + r] = v;
    }
}

/* Whether moe_down_rows_kernel reads this down weight: whole words a row, in the ABI's
 * or the mma layout, and a tile's gu rows small enough to stage (MOE_STAGE_BYTES). */
#define MOE_STAGE_BYTES (32 * 1024)
static inline bool moe_rows_path(int32_t format, int64_t cols, int32_t group, int32_t layout) {
    const int per_word = format == COLI_FMT_Q4 ? 8 : format == COLI_FMT_Q8 ? 4 : 1;
    return layout != TILE_LAYOUT && cols % per_word == 0 && (format != COLI_FMT_Q4 || group % per_word == 0) &&
           cols * MOE_TILE * (int64_t)sizeof(float) <= MOE_STAGE_BYTES;
}

/* The grouped path's down projections, a thread an output row over its tile's pairs:
 * the tile's gu rows staged in shared memory (every thread of a warp reads the same
 * value: a broadcast), each weight word read once and used for all of the tile's
 * pairs. The warp-a-row form (moe_tile_kernel) reduces a 128-wide dot a pair across
 * a warp, whose shuffles cost more than its reads. The same sums as weight_row_dot
 * (a word's products, times its group's scale; the row's scale last), in word order. */
template <int FORMAT>
__global__ void moe_down_rows_kernel(const dev_weight *ws, const float *gu, const int32_t *order, const int32_t *tiles,
                                     const int32_t *n_tiles, float *eo, int64_t rows, int64_t cols) {
    STEP_KERNEL_BEGIN();
    extern __shared__ float stage[]; /* [pair of the tile][cols] */
    constexpr int PW = fmt<FORMAT>::per_word;
    const int t = blockIdx.y;
    if (t >= *n_tiles) return;
    const int e = tiles[3 * t], s0 = tiles[3 * t + 1], n = tiles[3 * t + 2] - s0;
    for (int64_t i = threadIdx.x; i < n * cols; i += blockDim.x) stage[i] = gu[(int64_t)order[s0 + i / cols] * cols + i % cols];
    __syncthreads();
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const dev_weight &w = ws[3 * e + 2];
    const int64_t per_row = cols / PW;
    const uint32_t *q = (const uint32_t *)w.q + r * per_row;
    const q4_scale_of<FORMAT> scales(cols, w.group);
    float acc[MOE_TILE];
#pragma unroll
    for (int p = 0; p < MOE_TILE; p++) acc[p] = 0.0f;
    for (int64_t wn = 0; wn < per_row; wn++) {
        float v[PW];
        /* the mma layout keeps a row's words within its 16-word chunks: the map is per row */
        dequant<FORMAT>(q[w.layout ? mma_word(wn) : wn], v);
        const float scale = FORMAT == COLI_FMT_Q4 ? w.scale[scales.at(r, wn)] : 1.0f;
        const float *xs = stage + wn * PW;
#pragma unroll
        for (int p = 0; p < MOE_TILE; p++) {
            if (p >= n) break;
            float part = 0.0f;
#pragma unroll
            for (int k = 0; k < PW; k++) part += v[k] * xs[p * cols + k];
            acc[p] += FORMAT == COLI_FMT_Q4 ? part * scale : part;
        }
    }
    for (int p = 0; p < n; p++) eo[(int64_t)order[s0 + p] * rows + r] = FORMAT == COLI_FMT_Q8 ? acc[p] * w.scale[r] : acc[p];
}

/* eo[pair][d], the grouped path's down projections. */
struct part_row {
    const float *eo;
    int64_t hid, d;
    __device__ float operator()(int64_t pair, int32_t) const { return eo[pair * hid + d]; }
};

/* out[row][d] = expert_sum of the experts' outputs (moe_down_kernel's sum), a thread an output. */
__global__ void moe_combine_kernel(const float *eo, const int32_t *idx, const float *w, float *out, int64_t k,
                                   int64_t hid, int64_t experts) {
    STEP_KERNEL_BEGIN();
    const int64_t r = blockIdx.y, d = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (d >= hid) return;
    out[r * hid + d] = expert_sum(idx, w, r, k, experts, part_row{eo, hid, d});
}

#endif
