/* DSA's indexer and attention on the GPU: the indexer's scores and its top-k
 * selection (a radix selection by the last of a query's blocks), and attention over a
 * query's selected keys in spans that the last span's block combines. */
#ifndef COLI_GPU_ATTENTION_CUH
#define COLI_GPU_ATTENTION_CUH

#include "gpu_steps.cuh"

/* ---- the DSA indexer ------------------------------------------------------------ */

/* Whether this block is the last of `blocks` to pass here for `counter` (zero
 * between runs: the last one sets it back). Each block's writes before it are seen by
 * the last one, which reads them with COLI_LOAD_GRID. */
__device__ inline bool last_block(int32_t *counter, int32_t blocks) {
    __shared__ int last;
    __threadfence(); /* each thread's writes, before the count that says they are done */
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1) == blocks - 1;
        if (last) *counter = 0;
    }
    __syncthreads();
    if (last) __threadfence();
    return last != 0;
}

/* Values of the scores each thread of the selection holds in registers (the rest,
 * past SELECT_HELD * blockDim.x keys, are read again each pass). */
#define SELECT_HELD 16

/* The radix selection's bin, in the first warp: the highest bin b whose count with
 * the bins above it reaches need; need then less the bins above b. Lane l sums bins
 * 8l..8l+7, the lanes' sums from the top are scanned, and the lane where they reach
 * need walks its eight: what a walk down from bin 255 finds (the bins matching the
 * prefix hold at least need keys). */
__device__ inline void select_bin(const uint32_t *hist, int shift, uint32_t prefix, uint32_t need,
                                  uint32_t *prefix_out, uint32_t *need_out, uint32_t *equal_out) {
    const int lane = threadIdx.x;
    uint32_t own = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) own += hist[8 * lane + j];
    uint32_t above = own; /* this lane's bins and every higher lane's */
#pragma unroll
    for (int o = 1; o < WARP; o <<= 1) {
        const uint32_t t = COLI_SHFL(above, lane + o < WARP ? lane + o : lane);
        if (lane + o < WARP) above += t;
    }
    uint32_t reach = above >= need; /* the lanes 0..L, L the lane where the sums reach need */
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) reach += COLI_SHFL_XOR(reach, o);
    const int at = reach ? (int)reach - 1 : 0;
    if (lane != at) return;
    uint32_t left = need - (above - own);
    int b = 8 * lane + 7;
    for (; b > 8 * lane && hist[b] < left; b--) left -= hist[b];
    *prefix_out = prefix | ((uint32_t)b << shift);
    *need_out = left;
    *equal_out = hist[b];
}

/* How many of v the threads before this one hold (a block's exclusive scan). */
__device__ inline uint32_t block_before(uint32_t v, uint32_t *warps) {
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    uint32_t incl = v;
#pragma unroll
    for (int o = 1; o < WARP; o <<= 1) {
        const uint32_t t = COLI_SHFL(incl, lane >= o ? lane - o : lane);
        if (lane >= o) incl += t;
    }
    __syncthreads();
    if (lane == WARP - 1) warps[w] = incl;
    __syncthreads();
    uint32_t before = incl - v;
    for (int i = 0; i < w; i++) before += warps[i];
    return before;
}

/* The topk best of a query's `valid` scores into its selection s (ties to the
 * earlier key), and s cleared from valid to total: the topk-th largest key by radix
 * selection (a byte a pass, its held keys in registers), then the keys above it
 * and the earliest of those equal to it. Where every key equal to it is taken (no
 * tie at the cut) each key is decided alone; else each thread takes a stretch of
 * keys in order and counts the equal ones before it. */
__device__ inline void select_topk(const float *sc, uint8_t *s, int64_t valid, int64_t total, uint32_t need) {
    __shared__ uint32_t hist[256], warps[STEP_THREADS / WARP];
    __shared__ uint32_t prefix_s, need_s, equal_s;
    const int64_t held_n = (int64_t)SELECT_HELD * blockDim.x;
    uint32_t held[SELECT_HELD];
#pragma unroll
    for (int k = 0; k < SELECT_HELD; k++) {
        const int64_t u = threadIdx.x + (int64_t)k * blockDim.x;
        held[k] = u < valid ? order_key(COLI_LOAD_GRID(sc + u)) : 0u;
    }
    uint32_t prefix = 0, equal = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        const uint32_t mask = shift == 24 ? 0u : 0xFFFFFFFFu << (shift + 8);
#pragma unroll
        for (int k = 0; k < SELECT_HELD; k++)
            if (threadIdx.x + (int64_t)k * blockDim.x < valid && (held[k] & mask) == prefix)
                atomicAdd(&hist[(held[k] >> shift) & 0xFF], 1u);
        for (int64_t u = held_n + threadIdx.x; u < valid; u += blockDim.x) {
            const uint32_t key = order_key(COLI_LOAD_GRID(sc + u));
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xFF], 1u);
        }
        __syncthreads();
        if (threadIdx.x < WARP) select_bin(hist, shift, prefix, need, &prefix_s, &need_s, &equal_s);
        __syncthreads();
        prefix = prefix_s, need = need_s, equal = equal_s;
    }
    if (need == equal) {
#pragma unroll
        for (int k = 0; k < SELECT_HELD; k++) {
            const int64_t u = threadIdx.x + (int64_t)k * blockDim.x;
            if (u < valid) s[u] = held[k] >= prefix;
        }
        for (int64_t u = held_n + threadIdx.x; u < valid; u += blockDim.x)
            s[u] = order_key(COLI_LOAD_GRID(sc + u)) >= prefix;
    } else {
        const int64_t each = (valid + blockDim.x - 1) / blockDim.x, u0 = threadIdx.x * each;
        uint32_t eq = 0;
        for (int64_t u = u0; u < u0 + each && u < valid; u++) eq += order_key(COLI_LOAD_GRID(sc + u)) == prefix;
        uint32_t before = block_before(eq, warps);
        for (int64_t u = u0; u < u0 + each && u < valid; u++) {
            const uint32_t key = order_key(COLI_LOAD_GRID(sc + u));
            uint8_t on = key > prefix;
            if (key == prefix) on = before++ < need;
            s[u] = on;
        }
    }
    for (int64_t u = valid + threadIdx.x; u < total; u += blockDim.x) s[u] = 0;
}

/* Heads of the indexer a warp scores side by side: their sums are independent, so
 * their loads and lane exchanges overlap. */
#define INDEX_HEADS 4

/* Blocks of the indexer an SM holds at least: its grid is large (a prefill's rows
 * times its keys / 8), and the selection's held scores would otherwise take twice
 * the registers of the scoring and halve the blocks (nvcc -Xptxas -v: 80 registers
 * against 40 this way, 8 bytes spilled). HIP reads the number as waves an EU: 1. */
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) || defined(COLI_USE_HIP)
#define INDEX_MIN_BLOCKS 1
#else
#define INDEX_MIN_BLOCKS 6
#endif

/* The DSA indexer, one kernel: a block per 8 keys of a query (row), a warp a key.
 * A query that sees no more than topk keys selects them all, and its scores are not
 * needed: each block writes its keys' selection and leaves. Else scores[row][t] for
 * keys t <= p + row (the heads' terms added in head order), and the last of the
 * row's blocks to finish (counts[row]) selects the topk best (select_topk). */
__global__ void __launch_bounds__(STEP_THREADS, INDEX_MIN_BLOCKS)
    indexer_kernel(const float *iq, const float *iw, const float *keys, float *scores, uint8_t *sel, int32_t *counts,
                   const int64_t *pos, int64_t heads, int64_t dim, int64_t stride, int64_t topk, int64_t rows,
                   float weight_scale) {
    STEP_KERNEL_BEGIN();
    const int64_t row = blockIdx.y, valid = *pos + row + 1, total = *pos + rows;
    const int64_t per = blockDim.x / WARP, b0 = blockIdx.x * per;
    uint8_t *s = sel + row * stride;
    if (valid <= topk) {
        for (int64_t t = b0 + threadIdx.x; t < b0 + per && t < total; t += blockDim.x) s[t] = t < valid;
        return;
    }
    if (b0 >= valid) return; /* the whole block: past the query's keys, and not counted */
    const int64_t t = b0 + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    float *sc = scores + row * stride;
    if (t < valid) {
        const float scale = 1.0f / sqrtf((float)dim);
        float total_score = 0.0f;
        for (int64_t h0 = 0; h0 < heads; h0 += INDEX_HEADS) {
            float d[INDEX_HEADS];
#pragma unroll
            for (int j = 0; j < INDEX_HEADS; j++) d[j] = 0.0f;
            for (int64_t i = lane; i < dim; i += WARP) {
                const float kv = keys[t * dim + i];
#pragma unroll
                for (int j = 0; j < INDEX_HEADS; j++)
                    if (h0 + j < heads) d[j] += iq[(row * heads + h0 + j) * dim + i] * kv;
            }
#pragma unroll
            for (int j = 0; j < INDEX_HEADS; j++) d[j] = warp_sum(d[j]) * scale;
#pragma unroll
            for (int j = 0; j < INDEX_HEADS; j++)
                if (h0 + j < heads) total_score += (iw[row * heads + h0 + j] * weight_scale) * (d[j] > 0.0f ? d[j] : 0.0f);
        }
        if (lane == 0) sc[t] = total_score;
    }
    if (!last_block(counts + row, (int32_t)((valid + per - 1) / per))) return;
    select_topk(sc, s, valid, total, (uint32_t)topk);
}

/* A prefill's indexer: its rows are many and their keys mostly the same, and
 * indexer_kernel's warp a (row, key) read the key's row once a query and its query's
 * heads once a key. indexer_tile_kernel's block takes INDEX_TILE_Q rows' queries, held
 * in shared memory, over a chunk of STEP_THREADS keys, a thread a key: its key's row
 * held in registers, every (row, head) dot a sum in the thread (in i order, where
 * indexer_kernel's is a warp's tree: rounding apart). Then index_select_kernel, a block
 * a row, takes each row's topk as indexer_kernel's last block does. Two kernels where
 * a decode's one: a prefill's rows' selections in parallel rather than each in the last
 * of its row's blocks. Heads and dim as held (INDEX_TILE_HEADS, INDEX_TILE_DIM, their
 * product INDEX_TILE_HD), dim a multiple of 4 (the queries read four values a load). */
#define INDEX_TILE_Q 16
#define INDEX_TILE_DIM 64
#define INDEX_TILE_HEADS 32
#define INDEX_TILE_HD 512

/* Whether an indexer run takes indexer_tile_kernel: a prefill's rows, heads that fit. */
static inline bool indexer_tiled(int64_t rows, int64_t heads, int64_t dim) {
    return rows >= INDEX_TILE_Q && dim <= INDEX_TILE_DIM && dim % 4 == 0 && heads <= INDEX_TILE_HEADS &&
           heads * dim <= INDEX_TILE_HD;
}

/* Grid: (row tiles, key chunks of STEP_THREADS); STEP_THREADS threads. scores[row][t]
 * for keys t <= p + row of each row that sees more than topk keys (the others select
 * every key, and their scores are not needed). */
__global__ void __launch_bounds__(STEP_THREADS) indexer_tile_kernel(const float *iq, const float *iw, const float *keys,
                                                                     float *scores, const int64_t *pos, int64_t heads,
                                                                     int64_t dim, int64_t stride, int64_t topk,
                                                                     int64_t rows, float weight_scale) {
    STEP_KERNEL_BEGIN();
    __shared__ float4 qs[INDEX_TILE_Q][INDEX_TILE_HD / 4];
    __shared__ float ws[INDEX_TILE_Q][INDEX_TILE_HEADS];
    const int64_t r0 = (int64_t)blockIdx.x * INDEX_TILE_Q, p0 = *pos;
    const int nq = (int)(rows - r0 < INDEX_TILE_Q ? rows - r0 : INDEX_TILE_Q);
    const int64_t t0 = (int64_t)blockIdx.y * blockDim.x, t = t0 + threadIdx.x;
    /* whole blocks leave together: past the last row's keys, or every row selecting all */
    if (t0 >= p0 + r0 + nq || p0 + r0 + nq <= topk) return;
    const int hd = (int)(heads * dim);
    float *qf = &qs[0][0].x;
    for (int i = threadIdx.x; i < nq * INDEX_TILE_HD; i += blockDim.x) {
        const int qi = i / INDEX_TILE_HD, x = i % INDEX_TILE_HD;
        if (x < hd) qf[i] = iq[(r0 + qi) * hd + x];
    }
    for (int i = threadIdx.x; i < nq * INDEX_TILE_HEADS; i += blockDim.x) {
        const int qi = i / INDEX_TILE_HEADS, h = i % INDEX_TILE_HEADS;
        if (h < heads) ws[qi][h] = iw[(r0 + qi) * heads + h] * weight_scale;
    }
    float kr[INDEX_TILE_DIM];
    const bool key = t < p0 + r0 + nq;
#pragma unroll
    for (int i = 0; i < INDEX_TILE_DIM; i++) kr[i] = key && i < dim ? keys[t * dim + i] : 0.0f;
    __syncthreads();
    if (!key) return;
    const float scale = 1.0f / sqrtf((float)dim);
    const int d4 = (int)dim / 4;
    for (int qi = 0; qi < nq; qi++) {
        const int64_t valid = p0 + r0 + qi + 1;
        if (valid <= topk || t >= valid) continue; /* the same for every thread of a warp but at its edge */
        float total = 0.0f;
        for (int h = 0; h < heads; h++) {
            const float4 *qh = qs[qi] + h * d4;
            float d = 0.0f;
#pragma unroll
            for (int j = 0; j < INDEX_TILE_DIM / 4; j++) {
                if (j >= d4) break;
                const float4 qv = qh[j];
                d += qv.x * kr[4 * j], d += qv.y * kr[4 * j + 1], d += qv.z * kr[4 * j + 2], d += qv.w * kr[4 * j + 3];
            }
            d *= scale;
            total += ws[qi][h] * (d > 0.0f ? d : 0.0f);
        }
        scores[(r0 + qi) * stride + t] = total;
    }
}

/* A block a row: its selection after indexer_tile_kernel (every key where the row
 * sees at most topk, else select_topk), and cleared to the step's last key. */
__global__ void __launch_bounds__(STEP_THREADS) index_select_kernel(const float *scores, uint8_t *sel,
                                                                     const int64_t *pos, int64_t stride, int64_t topk,
                                                                     int64_t rows) {
    STEP_KERNEL_BEGIN();
    const int64_t row = blockIdx.x, valid = *pos + row + 1, total = *pos + rows;
    uint8_t *s = sel + row * stride;
    if (valid <= topk) {
        for (int64_t t = threadIdx.x; t < total; t += blockDim.x) s[t] = t < valid;
        return;
    }
    select_topk(scores + row * stride, s, valid, total, (uint32_t)topk);
}

/* ---- attention ------------------------------------------------------------------- */

/* Keys a block of attend_part_kernel takes (attend_span): where there are
 * ATTEND_MANY (query, head) pairs or more (a prefill: they fill the GPU; most take
 * attend_tile_kernel, below), ATTEND_CHUNK; fewer, as a decoded token's, ATTEND_SHORT while the query's keys fit
 * one ATTEND_CHUNK and ATTEND_SPLIT past that, so those few pairs still spread over
 * many blocks and each walks few keys (one block a pair walking all of a short
 * query's keys took most of a decoded token's attention time); doubled where the
 * grid's rows would not hold the spans. A query whose keys fit one span takes them in
 * one block, which writes its output itself. */
#define ATTEND_CHUNK 256
#define ATTEND_SPLIT 64
#define ATTEND_SHORT 32
#define ATTEND_MANY 128

/* The blocks a query of `keys` keys may split into (the grid's y; a part each). */
static inline int64_t attend_chunks(int64_t keys) { return (keys + ATTEND_SPLIT - 1) / ATTEND_SPLIT; }

/* The grid's rows for `pairs` (query, head) pairs of up to `keys` keys: a decode's few
 * pairs ATTEND_DECODE_ROWS (more only where spans of ATTEND_CHUNK need more), their
 * spans growing with the query's keys (attend_span). The grid is recorded once for
 * the step's longest query; a row a span of ATTEND_SPLIT keys gave a long step 64
 * rows, each block launched, waiting for the grid before and holding its room on an
 * SM, most of them leaving at once at a short position. Fewer rows of longer spans
 * decode a long context faster, down to where the blocks are too few to keep enough
 * loads in flight (16 rows of 256 keys: bench/RESULTS.md). */
#define ATTEND_DECODE_ROWS 32
static inline int64_t attend_rows(int64_t pairs, int64_t keys) {
    const int64_t all = attend_chunks(keys), least = (keys + ATTEND_CHUNK - 1) / ATTEND_CHUNK;
    if (pairs >= ATTEND_MANY || all <= ATTEND_DECODE_ROWS) return all;
    return least > ATTEND_DECODE_ROWS ? least : ATTEND_DECODE_ROWS;
}

/* Keys scored at once by a warp of attend_part_kernel: lanes in groups of
 * 32 / ATTEND_KEYS, a key a group, so a warp has that many keys' loads in flight. */
#define ATTEND_KEYS 4

/* Blocks of attend_part_kernel an SM holds at least: a long context's decode has 512
 * of them (16 pairs x 32 rows), one wave at four an SM, two at three (where the warp
 * softmax's registers took it unbounded). HIP reads the number as waves an EU: 1. */
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) || defined(COLI_USE_HIP)
#define ATTEND_MIN_BLOCKS 1
#else
#define ATTEND_MIN_BLOCKS 4
#endif

/* Values of a query's and a key's row a lane of attend_part_kernel holds (rows up to
 * 32 / ATTEND_KEYS * ATTEND_QK_HELD long): a loop over the row waited on memory once
 * per few values. */
#define ATTEND_QK_HELD 16

/* Values of v a thread of attend_part_kernel may hold from the start (v_held). */
#define ATTEND_V_HELD 8

__device__ inline int64_t attend_span(int64_t last) {
    if (gridDim.x >= ATTEND_MANY) return ATTEND_CHUNK;
    uint32_t span = last < ATTEND_CHUNK ? ATTEND_SHORT : ATTEND_SPLIT;
    while (span < ATTEND_CHUNK && (uint32_t)last / span + 1 > gridDim.y) span *= 2;
    return span;
}

/* A block's sum of a[] over its threads in groups of `width` (width <= blockDim.x):
 * thread g * width + d gives its part of column d; the threads below width get the
 * column's total, the groups' parts added in group order. */
__device__ inline float columns_sum(float a, float *acc, int64_t width) {
    const int64_t groups = blockDim.x / (uint32_t)width;
    acc[threadIdx.x] = a;
    __syncthreads();
    float total = 0.0f;
    if (threadIdx.x < width)
        for (int64_t g = 0; g < groups; g++) total += acc[g * width + threadIdx.x];
    return total;
}

/* attend_part_kernel's scores of keys t0..t1 into p[t - t0] (-inf where not selected),
 * a warp ATTEND_KEYS keys at a time. CHOSEN (a long query's): `flags` is the span's
 * selection in shared memory, by t - t0, and only a selected key's row is read; else
 * `flags` is the query's selection, by t, and every key's row is read, so that no load
 * waits on its selection byte's. Two instances, not a flag: a run-time choice let the
 * key's loads wait on the byte in both. */
template <bool CHOSEN>
__device__ inline void attend_scores(const float *qr, const float *k, const uint8_t *flags, float *p, int64_t t0,
                                     int64_t t1, int64_t heads, int64_t h, int64_t qk, float scaling) {
    constexpr int G = WARP / ATTEND_KEYS; /* lanes a key */
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP, sub = lane % G;
    for (int64_t base = t0 + warp * ATTEND_KEYS; base <= t1; base += nw * ATTEND_KEYS) {
        const int64_t t = base + lane / G;
        const bool in = t <= t1, on = in && flags[CHOSEN ? t - t0 : t];
        float d = 0.0f;
        if (CHOSEN ? on : in) {
            const float *kt = k + (t * heads + h) * qk;
            if (qk <= G * ATTEND_QK_HELD) { /* every load of the row in flight at once, then the sum */
                float qv[ATTEND_QK_HELD], kv[ATTEND_QK_HELD];
#pragma unroll
                for (int j = 0; j < ATTEND_QK_HELD; j++) {
                    const int64_t i = sub + j * G;
                    qv[j] = i < qk ? qr[i] : 0.0f, kv[j] = i < qk ? kt[i] : 0.0f;
                }
#pragma unroll
                for (int j = 0; j < ATTEND_QK_HELD; j++)
                    if (sub + j * G < qk) d += qv[j] * kv[j];
            } else {
                for (int64_t i = sub; i < qk; i += G) d += qr[i] * kt[i];
            }
        }
#pragma unroll
        for (int o = G / 2; o > 0; o >>= 1) d += COLI_SHFL_XOR(d, o);
        if (in && sub == 0) p[t - t0] = on ? d * scaling : -INFINITY;
    }
}

/* One block per (row, head, span of keys): the span's selected scores, their max
 * m, sum of exp(score - m) and the exp-weighted v, into part[(pair, chunk)] as
 * [m, sum, v...] (span: attend_span); a span with no selected key has sum 0. The spans past the query
 * leave at once; the last of the others to finish (counts[pair]) combines them:
 * out = sum over spans of w_c v_c / sum over spans of w_c sum_c, w_c = exp(m_c - M)
 * (0 for a span with no selected key), M the largest m of those with one. Where the
 * query's keys fit one span its block writes out itself. */
__global__ void __launch_bounds__(STEP_THREADS, ATTEND_MIN_BLOCKS) attend_part_kernel(const float *q, const float *k, const float *v, const uint8_t *sel, float *part,
                                   int32_t *counts, float *attn, const int64_t *pos, int64_t heads, int64_t qk,
                                   int64_t vdim, int64_t stride, float scaling) {
    coli_allow_next_grid(); /* the wait is below, after the earlier rows are asked for */
    __shared__ float red[32], p[ATTEND_CHUNK], acc[STEP_THREADS];
    /* 32-bit divisions here and below: a 64-bit one is a long software routine on a GPU */
    const int64_t pair = blockIdx.x, row = blockIdx.x / (uint32_t)heads, h = blockIdx.x % (uint32_t)heads;
    const int64_t last = *pos + row;
    const int64_t span = attend_span(last);
    const int64_t t0 = (int64_t)blockIdx.y * span, t1 = t0 + span - 1 < last ? t0 + span - 1 : last;
    if (t0 > last) return; /* a whole block leaves together: no barrier is skipped by some */
    float *pp = part + pair * gridDim.y * (vdim + 2), *out = pp + blockIdx.y * (vdim + 2);
    const float *qr = q + pair * qk;
    const uint8_t *sr = sel + row * stride;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    /* the weighted v below: groups of vdim threads take every groups-th key; where the
     * span's v fits ATTEND_V_HELD values a thread, they are loaded now, beside the keys,
     * so the sum waits for no load after the softmax */
    const int64_t groups = vdim <= (int64_t)blockDim.x ? blockDim.x / (uint32_t)vdim : 0;
    const int64_t g = groups ? threadIdx.x / (uint32_t)vdim : 0, d = groups ? threadIdx.x % (uint32_t)vdim : 0;
    const bool v_held = groups && t1 - t0 < groups * ATTEND_V_HELD;
    /* A short query's span's rows before the step's position were written by earlier
     * steps, and the position by a kernel the graph's first waited for: they are asked
     * into L1 while the kernels before this one end, so the loads after the wait find
     * them near. A long query's keys are many, and not all selected: only the selected
     * keys' rows are read, after the wait (below). */
    const bool long_q = last >= ATTEND_CHUNK;
    if (!long_q) {
        const int64_t end = t1 < *pos ? t1 : *pos - 1, k_lines = (qk * 4 + 127) / 128, v_lines = (vdim * 4 + 127) / 128;
        const uint32_t per = (uint32_t)(k_lines + v_lines);
        const int64_t lines = end >= t0 ? (end - t0 + 1) * per : 0;
        for (int64_t n = threadIdx.x; n < lines; n += blockDim.x) {
            const int64_t t = t0 + (uint32_t)n / per, l = (uint32_t)n % per;
            const float *r = l < k_lines ? k + (t * heads + h) * qk : v + (t * heads + h) * vdim;
            coli_prefetch_l1((const char *)r + (l < k_lines ? l : l - k_lines) * 128);
        }
    }
    coli_wait_prior_grid();
    __shared__ uint8_t chosen[ATTEND_CHUNK]; /* a long query's span's selection, read once */
    if (long_q) {
        for (int64_t t = t0 + threadIdx.x; t <= t1; t += blockDim.x) chosen[t - t0] = sr[t];
        __syncthreads();
    }
    float vh[ATTEND_V_HELD];
#pragma unroll
    for (int j = 0; j < ATTEND_V_HELD; j++) {
        const int64_t t = t0 + g + j * groups;
        vh[j] = v_held && g < groups && t <= t1 ? v[(t * heads + h) * vdim + d] : 0.0f;
    }
    if (long_q) attend_scores<true>(qr, k, chosen, p, t0, t1, heads, h, qk, scaling);
    else attend_scores<false>(qr, k, sr, p, t0, t1, heads, h, qk, scaling);
    __syncthreads();
    /* A span of a warp's keys or fewer (a short decode's): every warp takes the max, the
     * exps and their sum itself, lane l key t0 + l, the same values and sums as the
     * block's reductions (the other warps' parts there are -inf and 0), with no barrier;
     * the weighted v below takes each key's exp from its lane. */
    const bool narrow = t1 - t0 < WARP;
    float mx = -INFINITY, sum = 0.0f, e = 0.0f;
    if (narrow) {
        const bool mine = t0 + lane <= t1;
        const float sc = mine ? p[lane] : -INFINITY;
        mx = warp_max(sc);
        e = mine && mx != -INFINITY ? expf(sc - mx) : 0.0f;
        sum = warp_sum(e);
        if (!v_held) { /* the loop over v below reads the exps from p */
            if (warp == 0 && mine) p[lane] = e;
            __syncthreads();
        }
    } else {
        for (int64_t t = t0 + threadIdx.x; t <= t1; t += blockDim.x) mx = fmaxf(mx, p[t - t0]);
        mx = block_max(mx, red);
        for (int64_t t = t0 + threadIdx.x; t <= t1; t += blockDim.x) {
            const float x = mx == -INFINITY ? 0.0f : expf(p[t - t0] - mx);
            p[t - t0] = x;
            sum += x;
        }
        sum = block_sum(sum, red); /* its barriers also order the writes of p before the reads below */
    }
    /* One span (the query's keys fit one): its v over its sum is the combine's value
     * (exp(m - M) is 1), written at once; else the span's part for the combine. */
    const int64_t spans = (uint32_t)last / (uint32_t)span + 1, chunks = spans < (int64_t)gridDim.y ? spans : gridDim.y;
    float *const one = chunks == 1 ? attn + pair * vdim : NULL;
    /* the weighted v: groups of vdim threads take every groups-th key, then add up */
    if (groups) {
        float a = 0.0f;
        if (v_held) {
#pragma unroll
            for (int j = 0; j < ATTEND_V_HELD; j++) {
                const int64_t at = g + j * groups;
                const float pj = narrow ? COLI_SHFL(e, (int)(at < WARP ? at : 0)) : p[at < ATTEND_CHUNK ? at : 0];
                if (g < groups && t0 + at <= t1) a += pj * vh[j];
            }
        } else if (g < groups) {
#pragma unroll 4
            for (int64_t t = t0 + g; t <= t1; t += groups) {
                const float pt = p[t - t0]; /* 0 for a key not selected: its v is not read */
                if (pt != 0.0f) a += pt * v[(t * heads + h) * vdim + d];
            }
        }
        const float total = columns_sum(a, acc, vdim);
        if (threadIdx.x < vdim) {
            if (one) one[threadIdx.x] = total / sum;
            else out[2 + threadIdx.x] = total;
        }
    } else {
        for (int64_t col = threadIdx.x; col < vdim; col += blockDim.x) {
            float a = 0.0f;
            for (int64_t t = t0; t <= t1; t++) a += p[t - t0] * v[(t * heads + h) * vdim + col];
            if (one) one[col] = a / sum;
            else out[2 + col] = a;
        }
    }
    if (one) return;
    if (threadIdx.x == 0) out[0] = mx, out[1] = sum;
    if (!last_block(counts + pair, (int32_t)chunks)) return;
    if (groups && chunks <= WARP && chunks <= groups * ATTEND_V_HELD) {
        /* The combine where the spans fit a warp: every warp takes M, the weights and
         * their total itself, lane c span c, the same values and sums as the block's
         * reductions below, and each thread's spans' v values load beside the m and
         * sum: one wait on memory, no barrier before the columns' sum. */
        const bool mine = lane < chunks;
        const float *pl = pp + lane * (vdim + 2);
        const float m = mine ? COLI_LOAD_GRID(pl) : 0.0f, s = mine ? COLI_LOAD_GRID(pl + 1) : 0.0f;
        float vc[ATTEND_V_HELD];
#pragma unroll
        for (int j = 0; j < ATTEND_V_HELD; j++) {
            const int64_t c = g + j * groups;
            vc[j] = g < groups && c < chunks ? COLI_LOAD_GRID(pp + c * (vdim + 2) + 2 + d) : 0.0f;
        }
        const float M = warp_max(s > 0.0f ? m : -INFINITY), wl = s > 0.0f ? expf(m - M) : 0.0f;
        const float total = warp_sum(wl * s);
        float a = 0.0f;
#pragma unroll
        for (int j = 0; j < ATTEND_V_HELD; j++) {
            const int64_t c = g + j * groups;
            const float wc = COLI_SHFL(wl, (int)(c < WARP ? c : 0));
            if (g < groups && c < chunks) a += wc * vc[j];
        }
        const float sum_v = columns_sum(a, acc, vdim);
        if (threadIdx.x < vdim) attn[pair * vdim + threadIdx.x] = sum_v / total;
        return;
    }
    /* the combine, its spans over the threads: M, then each span's weight w_c over its m */
    float M = -INFINITY;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x)
        if (COLI_LOAD_GRID(pp + c * (vdim + 2) + 1) > 0.0f) M = fmaxf(M, COLI_LOAD_GRID(pp + c * (vdim + 2)));
    M = block_max(M, red);
    float total = 0.0f;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
        float *pc = pp + c * (vdim + 2);
        const float s = COLI_LOAD_GRID(pc + 1), w = s > 0.0f ? expf(COLI_LOAD_GRID(pc) - M) : 0.0f;
        pc[0] = w;
        total += w * s;
    }
    total = block_sum(total, red); /* its barriers also order the weights' writes before the reads below */
    if (groups) {
        float a = 0.0f;
        if (g < groups)
            for (int64_t c = g; c < chunks; c += groups) {
                const float *pc = pp + c * (vdim + 2);
                a += COLI_LOAD_GRID(pc) * COLI_LOAD_GRID(pc + 2 + d);
            }
        const float sum_v = columns_sum(a, acc, vdim);
        if (threadIdx.x < vdim) attn[pair * vdim + threadIdx.x] = sum_v / total;
    } else {
        for (int64_t col = threadIdx.x; col < vdim; col += blockDim.x) {
            float a = 0.0f;
            for (int64_t c = 0; c < chunks; c++) a += COLI_LOAD_GRID(pp + c * (vdim + 2)) * COLI_LOAD_GRID(pp + c * (vdim + 2) + 2 + col);
            attn[pair * vdim + col] = a / total;
        }
    }
}

/* ---- a prefill's attention: queries side by side --------------------------------- */

/* A prefill's (query, head) pairs are many and their queries' keys mostly the same:
 * attend_part_kernel's block a pair reads each key's row once a query, so a prefill step
 * of 256 queries read each head's cache 256 times over, and attention took most of a
 * 4,000-token prefill (bench/RESULTS.md, "A prefill's attention"). attend_tile_kernel's block takes ATTEND_TILE_Q queries of a head over an
 * ATTEND_CHUNK of keys, ATTEND_TILE_K keys at a time staged in shared memory for all of
 * them, each query's softmax carried across the tiles (its max, its sum, its weighted v
 * rescaled by exp(old max - new max)); its parts are attend_part_kernel's, and the last
 * block of a query's chunks combines them as attend_part_kernel's does, in span order.
 * Rows up to ATTEND_TILE_DIM values (qk and vdim; qk a multiple of 4, as the scores
 * read the queries four values a load), else attend_part_kernel. */
#define ATTEND_TILE_Q 16
#define ATTEND_TILE_K WARP /* a tile's softmax: a warp a query, a lane a key */
#define ATTEND_TILE_DIM 128

/* A thread of attend_tile_kernel's place in a tile: warp w takes rows w, w + nw, ... (keys
 * or queries) and lane l columns l, l + WARP, ... of each, so no index is divided and a
 * warp's loads of a row are one run of memory. ATTEND_TILE_ROWS rows a warp of a key
 * tile (and of the queries' outputs: ATTEND_TILE_QROWS), ATTEND_TILE_COLS columns. */
#define ATTEND_TILE_WARPS (STEP_THREADS / WARP)
#define ATTEND_TILE_ROWS (ATTEND_TILE_K / ATTEND_TILE_WARPS)
#define ATTEND_TILE_QROWS (ATTEND_TILE_Q / ATTEND_TILE_WARPS)
#define ATTEND_TILE_COLS (ATTEND_TILE_DIM / WARP)

/* Blocks of attend_tile_kernel an SM holds at least: its shared memory leaves room for
 * five, and at its unbounded 101 registers two fit. HIP reads the number as waves an EU: 1. */
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) || defined(COLI_USE_HIP)
#define ATTEND_TILE_MIN_BLOCKS 1
#else
#define ATTEND_TILE_MIN_BLOCKS 3
#endif

/* Whether a run's attention takes attend_tile_kernel: a prefill's many pairs, rows that fit. */
static inline bool attend_tiled(int64_t pairs, int64_t qk, int64_t vdim) {
    return pairs >= ATTEND_MANY && qk <= ATTEND_TILE_DIM && qk % 4 == 0 && vdim <= ATTEND_TILE_DIM;
}

/* Grid: (query tiles x heads, key chunks of ATTEND_CHUNK); STEP_THREADS threads. */
__global__ void __launch_bounds__(STEP_THREADS, ATTEND_TILE_MIN_BLOCKS) attend_tile_kernel(const float *q, const float *k, const float *v,
                                                                   const uint8_t *sel, float *part, int32_t *counts,
                                                                   float *attn, const int64_t *pos, int64_t rows,
                                                                   int64_t heads, int64_t qk, int64_t vdim,
                                                                   int64_t stride, float scaling) {
    STEP_KERNEL_BEGIN();
    __shared__ float ks[ATTEND_TILE_K][ATTEND_TILE_DIM + 1]; /* + 1: a warp's keys in distinct banks */
    __shared__ float vs[ATTEND_TILE_K][ATTEND_TILE_DIM];
    __shared__ __align__(16) float qs[ATTEND_TILE_Q][ATTEND_TILE_DIM];
    __shared__ float ps[ATTEND_TILE_Q][ATTEND_TILE_K], mq[ATTEND_TILE_Q], sq[ATTEND_TILE_Q], scale_q[ATTEND_TILE_Q];
    __shared__ uint8_t on[ATTEND_TILE_Q][ATTEND_TILE_K];
    __shared__ float red[32];
    __shared__ int done[ATTEND_TILE_Q];
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    /* 32-bit: a 64-bit division is a long software routine on a GPU */
    const int64_t h = blockIdx.x % (uint32_t)heads, r0 = (int64_t)(blockIdx.x / (uint32_t)heads) * ATTEND_TILE_Q;
    const int64_t nq = rows - r0 < ATTEND_TILE_Q ? rows - r0 : ATTEND_TILE_Q, p0 = *pos;
    const int64_t c = blockIdx.y, first = c * ATTEND_CHUNK, last_all = p0 + r0 + nq - 1;
    if (first > last_all) return; /* a whole block leaves together */
    const int64_t end = first + ATTEND_CHUNK - 1 < last_all ? first + ATTEND_CHUNK - 1 : last_all;
#pragma unroll
    for (int a = 0; a < ATTEND_TILE_QROWS; a++)
#pragma unroll
        for (int b = 0; b < ATTEND_TILE_COLS; b++) {
            const int qi = warp + a * ATTEND_TILE_WARPS, x = lane + b * WARP;
            qs[qi][x] = qi < nq && x < qk ? q[((r0 + qi) * heads + h) * qk + x] : 0.0f;
        }
    if (threadIdx.x < ATTEND_TILE_Q) mq[threadIdx.x] = -INFINITY, sq[threadIdx.x] = 0.0f;
    float acc[ATTEND_TILE_QROWS][ATTEND_TILE_COLS];
#pragma unroll
    for (int a = 0; a < ATTEND_TILE_QROWS; a++)
#pragma unroll
        for (int b = 0; b < ATTEND_TILE_COLS; b++) acc[a][b] = 0.0f;
    for (int64_t t0 = first; t0 <= end; t0 += ATTEND_TILE_K) {
        const int nk = (int)(end - t0 + 1 < ATTEND_TILE_K ? end - t0 + 1 : ATTEND_TILE_K);
        float kl[ATTEND_TILE_ROWS][ATTEND_TILE_COLS], vl[ATTEND_TILE_ROWS][ATTEND_TILE_COLS];
#pragma unroll
        for (int a = 0; a < ATTEND_TILE_ROWS; a++) { /* every load of the tile, then the stores */
            const int ki = warp + a * ATTEND_TILE_WARPS;
            const float *kr = k + ((t0 + ki) * heads + h) * qk, *vr = v + ((t0 + ki) * heads + h) * vdim;
#pragma unroll
            for (int b = 0; b < ATTEND_TILE_COLS; b++) {
                const int x = lane + b * WARP;
                kl[a][b] = ki < nk && x < qk ? kr[x] : 0.0f;
                vl[a][b] = ki < nk && x < vdim ? vr[x] : 0.0f;
            }
        }
        /* the selection: a warp a query's row, a lane a key */
        uint8_t sl[ATTEND_TILE_QROWS];
#pragma unroll
        for (int a = 0; a < ATTEND_TILE_QROWS; a++) {
            const int qi = warp + a * ATTEND_TILE_WARPS;
            const int64_t t = t0 + lane;
            sl[a] = qi < nq && lane < nk && t <= p0 + r0 + qi ? sel[(r0 + qi) * stride + t] : 0;
        }
        __syncthreads(); /* the tile before is read: its keys, values and exps */
#pragma unroll
        for (int a = 0; a < ATTEND_TILE_ROWS; a++)
#pragma unroll
            for (int b = 0; b < ATTEND_TILE_COLS; b++) {
                ks[warp + a * ATTEND_TILE_WARPS][lane + b * WARP] = kl[a][b];
                vs[warp + a * ATTEND_TILE_WARPS][lane + b * WARP] = vl[a][b];
            }
#pragma unroll
        for (int a = 0; a < ATTEND_TILE_QROWS; a++) on[warp + a * ATTEND_TILE_WARPS][lane] = sl[a];
        __syncthreads();
        /* the scores and each query's softmax carried over: a warp its queries, a lane a
         * key, whose values are read once for the warp's queries and theirs four at a time */
        float dq[ATTEND_TILE_QROWS];
#pragma unroll
        for (int a = 0; a < ATTEND_TILE_QROWS; a++) dq[a] = 0.0f;
        for (int x = 0; x < qk; x += 4) {
            const float k0 = ks[lane][x], k1 = ks[lane][x + 1], k2 = ks[lane][x + 2], k3 = ks[lane][x + 3];
#pragma unroll
            for (int a = 0; a < ATTEND_TILE_QROWS; a++) {
                const float4 qv = *(const float4 *)&qs[warp + a * ATTEND_TILE_WARPS][x];
                dq[a] += qv.x * k0, dq[a] += qv.y * k1, dq[a] += qv.z * k2, dq[a] += qv.w * k3;
            }
        }
#pragma unroll
        for (int a = 0; a < ATTEND_TILE_QROWS; a++) {
            const int qi = warp + a * ATTEND_TILE_WARPS;
            const float d = dq[a];
            const float sc = on[qi][lane] ? d * scaling : -INFINITY, mo = mq[qi], mn = fmaxf(mo, warp_max(sc));
            const float e = sc == -INFINITY ? 0.0f : expf(sc - mn), al = mo == -INFINITY ? 0.0f : expf(mo - mn);
            const float se = warp_sum(e);
            ps[qi][lane] = e;
            COLI_SYNC_WARP(); /* every lane has read mq before it changes */
            if (lane == 0) mq[qi] = mn, sq[qi] = sq[qi] * al + se, scale_q[qi] = al;
        }
        __syncthreads();
#pragma unroll
        for (int a = 0; a < ATTEND_TILE_QROWS; a++) {
            const int qi = warp + a * ATTEND_TILE_WARPS;
#pragma unroll
            for (int b = 0; b < ATTEND_TILE_COLS; b++) {
                const int d = lane + b * WARP;
                float s = acc[a][b] * scale_q[qi];
                for (int ki = 0; ki < nk; ki++) s += ps[qi][ki] * vs[ki][d];
                acc[a][b] = s;
            }
        }
    }
    /* each query's part of this chunk, or its output where its keys fit one chunk */
    const int64_t parts = gridDim.y;
#pragma unroll
    for (int a = 0; a < ATTEND_TILE_QROWS; a++) {
        const int qi = warp + a * ATTEND_TILE_WARPS;
        const int64_t last = p0 + r0 + qi, pair = (r0 + qi) * heads + h;
        if (qi >= nq || first > last) continue;
        float *out = part + (pair * parts + c) * (vdim + 2);
#pragma unroll
        for (int b = 0; b < ATTEND_TILE_COLS; b++) {
            const int d = lane + b * WARP;
            if (d >= vdim) continue;
            if (last < ATTEND_CHUNK) attn[pair * vdim + d] = acc[a][b] / sq[qi];
            else out[2 + d] = acc[a][b];
        }
        if (lane == 0 && last >= ATTEND_CHUNK) out[0] = mq[qi], out[1] = sq[qi];
    }
    /* the last block of each query's chunks combines its parts (last_block's steps, a
     * counter a query) */
    __threadfence();
    __syncthreads();
    if (threadIdx.x < ATTEND_TILE_Q) {
        const int qi = threadIdx.x;
        int last_one = 0;
        const int64_t last = p0 + r0 + qi;
        if (qi < nq && first <= last && last >= ATTEND_CHUNK) {
            const int64_t pair = (r0 + qi) * heads + h, spans = last / ATTEND_CHUNK + 1;
            last_one = atomicAdd(counts + pair, 1) == (int32_t)(spans < parts ? spans : parts) - 1;
            if (last_one) counts[pair] = 0;
        }
        done[qi] = last_one;
    }
    __syncthreads();
    for (int qi = 0; qi < nq; qi++) {
        if (!done[qi]) continue;
        __threadfence();
        const int64_t last = p0 + r0 + qi, pair = (r0 + qi) * heads + h, spans_all = last / ATTEND_CHUNK + 1;
        const int64_t spans = spans_all < parts ? spans_all : parts;
        const float *pp = part + pair * parts * (vdim + 2);
        float M = -INFINITY;
        for (int64_t s = threadIdx.x; s < spans; s += blockDim.x)
            if (COLI_LOAD_GRID(pp + s * (vdim + 2) + 1) > 0.0f) M = fmaxf(M, COLI_LOAD_GRID(pp + s * (vdim + 2)));
        M = block_max(M, red); /* its barriers also keep the last query's red apart */
        for (int64_t d = threadIdx.x; d < vdim; d += blockDim.x) {
            float a = 0.0f, total = 0.0f;
            for (int64_t s = 0; s < spans; s++) {
                const float *span = pp + s * (vdim + 2);
                const float sum = COLI_LOAD_GRID(span + 1), w = sum > 0.0f ? expf(COLI_LOAD_GRID(span) - M) : 0.0f;
                total += w * sum, a += w * COLI_LOAD_GRID(span + 2 + d);
            }
            attn[pair * vdim + d] = a / total;
        }
    }
}

#endif
