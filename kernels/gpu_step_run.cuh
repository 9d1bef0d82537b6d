/* A recorded step on the GPU: the scratch its ops need, the units it launches (an
 * op, or an add and the rmsnorm of its sum as one kernel), which units may run side
 * by side on the backend's streams (step_plan.h), and the graph a step's second
 * run captures and every later run replays. The position is a device value set by
 * a one-thread kernel ahead of the ops, so the recorded launches never change. */
#ifndef COLI_GPU_STEP_RUN_CUH
#define COLI_GPU_STEP_RUN_CUH

#include "backend_step_types.h"
#include "gpu_steps.cuh"
#include "gpu_experts.cuh"
#include "gpu_attention.cuh"
#include "step_plan.h"

/* Matmul scratch (x split into digit planes) comes in this many slots, handed out
 * in turn, so that matmuls on different streams do not share one. */
#define PLANE_SLOTS 4

/* What a step launches as one: ops [first, first + len), one op, an add (or two)
 * and the rmsnorm of the sum (add_rmsnorm_kernel), or a route and the moe that
 * takes its picks (moe_up_kernel routing its own rows). */
enum { UNIT_OP, UNIT_ADD_RMSNORM, UNIT_ROUTE_MOE };
struct gpu_unit {
    int32_t first, len, kind;
};

/* What a step keeps besides its ops: scratch sized for its largest op, the expert
 * tables of its moe ops, its units and their plan, and its graph once captured. */
struct gpu_rec {
    int64_t *pos;
    float *planes, *scores, *moe_gu, *moe_eo;
    int32_t *moe_order, *moe_tiles; /* moe_grouped's (moe_group_kernel); moe_tiles[0] is the count */
    int32_t *counts;      /* the indexer's and attention's blocks done, a row or pair (last_block) */
    size_t plane_floats;  /* a slot's */
    int32_t *plane_slot;  /* per op: its slot of planes, -1 for none */
    dev_weight **tables;  /* per op: the moe op's experts, else NULL */
    uint8_t *fixed;       /* per op: bit i where its ref i reads a buffer no op of the step writes */
    int32_t n_ops;
    gpu_unit *units;
    coli_unit_plan *plan;
    int32_t n_units, queues;
    cudaEvent_t *done;    /* per unit: its end, where a later unit waits for it */
    cudaEvent_t start, ends[COLI_MAX_QUEUES];
    int runs;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

static cudaStream_t g_step_stream = NULL;
static cudaStream_t g_side_streams[COLI_MAX_QUEUES]; /* [0] unused: queue 0 is g_step_stream */

static cudaStream_t queue_stream(int32_t q) { return q == 0 ? g_step_stream : g_side_streams[q]; }

static void gpu_queues_release(void) {
    for (cudaStream_t &s : g_side_streams)
        if (s) (void)cudaStreamDestroy(s), s = NULL;
}

static unsigned blocks_for(int64_t count) {
    const int64_t b = (count + STEP_THREADS - 1) / STEP_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 4096 ? 4096 : b);
}

static cudaError_t step_malloc(void **p, size_t bytes) {
    *p = NULL;
    if (!bytes) return cudaSuccess;
    return cudaMalloc(p, bytes);
}

/* COLI_GPU_FUSE=0 launches every op on its own (for comparisons). */
static bool fuse_ops(void) {
    static int on = -1;
    return env_switch("COLI_GPU_FUSE", &on);
}

/* The ops from k that add_rmsnorm_kernel takes as one: add, rmsnorm of its sum (2),
 * or add(a, b), add(x, a), rmsnorm of x (3); else 1. */
static int32_t add_rmsnorm_length(const coli_rec *r, int32_t k) {
    if (k + 1 >= r->count || r->ops[k].op.kind != COLI_OP_ADD) return 1;
    const coli_add_operands first = coli_unpack_add(&r->ops[k].op, r->ops[k].p);
    int32_t len = 2;
    coli_add_operands sum = first;
    if (r->ops[k + 1].op.kind == COLI_OP_ADD && k + 2 < r->count) {
        const coli_add_operands second = coli_unpack_add(&r->ops[k + 1].op, r->ops[k + 1].p);
        if (second.y != first.x || second.count != first.count || second.x == first.x) return 1;
        sum = second, len = 3;
    }
    const coli_rec_op *norm = &r->ops[k + len - 1];
    if (norm->op.kind != COLI_OP_RMSNORM) return 1;
    const coli_rmsnorm_operands n = coli_unpack_rmsnorm(&norm->op, norm->p);
    return n.x == sum.x && n.x_stride == n.n && n.rows * n.n == sum.count ? len : 1;
}

/* A moe op whose pairs are at least its experts (on average one each) groups them
 * by expert into tiles (moe_group_kernel; a grid's tiles fit its 65535 rows);
 * fewer, as in a decode, go pair by pair. */
static bool moe_grouped(int64_t rows, int64_t k, int64_t experts) {
    return rows * k >= experts && experts <= 1024 && moe_tiles_max(rows * k, experts) <= 65535;
}

/* Whether op k is a route whose picks and weights the next op, a moe going pair by
 * pair, takes whole: the two as one unit (route_row's scratch holds 1024 experts).
 * Also where a one-row moe takes one pick more than the route makes, of an expert
 * past the routed ones, its pick and weight already in the buffers past the route's
 * (a decode's shared expert, engine/model_step.c). */
static bool route_then_moe(const coli_rec *r, int32_t k) {
    if (k + 1 >= r->count || r->ops[k].op.kind != COLI_OP_ROUTE || r->ops[k + 1].op.kind != COLI_OP_MOE) return false;
    const coli_route_operands a = coli_unpack_route(&r->ops[k].op, r->ops[k].p);
    const coli_moe_operands m = coli_unpack_moe(&r->ops[k + 1].op, r->ops[k + 1].p);
    const int64_t experts = m.n_tensors / 3;
    const bool same = m.k == a.k && a.experts == experts;
    const bool one_more = m.rows == 1 && m.k == a.k + 1 && experts == a.experts + 1;
    return m.idx == a.idx && m.w == a.w && m.rows == a.rows && (same || one_more) && a.experts <= 1024 &&
           !moe_grouped(m.rows, m.k, experts);
}

/* The unit that starts at op k (COLI_GPU_FUSE=0: every op its own). */
static gpu_unit unit_at(const coli_rec *r, int32_t k) {
    if (!fuse_ops()) return gpu_unit{k, 1, UNIT_OP};
    if (route_then_moe(r, k)) return gpu_unit{k, 2, UNIT_ROUTE_MOE};
    const int32_t len = add_rmsnorm_length(r, k);
    return gpu_unit{k, len, len > 1 ? UNIT_ADD_RMSNORM : UNIT_OP};
}

static coli_span span_of(const void *p, uint64_t bytes, int32_t write) {
    const coli_span s = {(uintptr_t)p, (uintptr_t)p + bytes, write};
    return s;
}

/* What op k reads and writes: its operands, as far as they reach, and its scratch. */
static int32_t op_spans(const coli_rec *r, const gpu_rec *g, int32_t k, coli_span *out) {
    const coli_rec_op *o = &r->ops[k];
    const coli_op_info *info = coli_op_info_of(o->op.kind);
    int32_t n = 0;
    for (int32_t i = 0; i < info->refs; i++)
        if (o->buf[i]) out[n++] = span_of(o->p[i], o->reach[i], info->out[i]);
    const size_t plane_bytes = g->plane_floats * sizeof(float);
    if (g->plane_slot[k] >= 0) out[n++] = span_of(g->planes + g->plane_floats * g->plane_slot[k], plane_bytes, 1);
    if (o->op.kind == COLI_OP_INDEXER || o->op.kind == COLI_OP_ATTEND) out[n++] = span_of(g->scores, 1, 1);
    if (o->op.kind == COLI_OP_MOE) out[n++] = span_of(g->moe_gu, 1, 1);
    return n;
}

/* COLI_GPU_STREAMS: how many streams a step's units may spread over (1..8, 8 unless
 * set, the most, which decoded fastest on the H200: bench/RESULTS.md; 1 is one
 * chain of launches). */
static coli_status step_queues(int32_t *out) {
    static int32_t n = 0;
    if (!n) {
        const char *v = getenv("COLI_GPU_STREAMS");
        char *end = NULL;
        const long q = v && *v ? strtol(v, &end, 10) : COLI_MAX_QUEUES;
        if ((v && *v && *end) || q < 1 || q > COLI_MAX_QUEUES)
            return coli_fail(COLI_E_INVALID, "COLI_GPU_STREAMS is '%s': it must be a whole number from 1 to %d", v,
                             COLI_MAX_QUEUES);
        n = (int32_t)q;
    }
    *out = n;
    return COLI_OK;
}

/* Units and their plan over the streams, and the events the plan waits on. */
static coli_status gpu_rec_plan(const coli_rec *r, gpu_rec *g) {
    coli_status st = step_queues(&g->queues);
    if (st) return st;
    g->units = (gpu_unit *)calloc((size_t)r->count, sizeof *g->units);
    coli_span *spans = (coli_span *)malloc((size_t)r->count * 10 * sizeof *spans);
    coli_unit *units = (coli_unit *)malloc((size_t)r->count * sizeof *units);
    g->plan = (coli_unit_plan *)calloc((size_t)r->count, sizeof *g->plan);
    int planned = g->units && spans && units && g->plan;
    int32_t used = 0;
    for (int32_t k = 0; planned && k < r->count;) {
        gpu_unit *u = &g->units[g->n_units];
        *u = unit_at(r, k);
        units[g->n_units].spans = spans + used;
        for (int32_t j = 0; j < u->len; j++) used += op_spans(r, g, k + j, spans + used);
        units[g->n_units].n_spans = (int32_t)(spans + used - units[g->n_units].spans);
        g->n_units++;
        k += u->len;
    }
    planned = planned && !coli_plan_queues(units, g->n_units, g->queues, g->plan);
    /* what the step never writes, which a kernel may load before its wait (step_plan.h) */
    for (int32_t k = 0; planned && k < r->count; k++) {
        const coli_rec_op *o = &r->ops[k];
        const coli_op_info *info = coli_op_info_of(o->op.kind);
        for (int32_t i = 0; i < info->refs && i < 8; i++) {
            const coli_span s = span_of(o->p[i], o->reach[i], 0);
            if (o->buf[i] && !info->out[i] && coli_span_unwritten(units, g->n_units, &s))
                g->fixed[k] |= (uint8_t)(1u << i);
        }
    }
    free(spans);
    free(units);
    if (!planned) return coli_fail(COLI_E_OUT_OF_MEMORY, "step_end: out of host memory");
    g->done = (cudaEvent_t *)calloc(g->n_units > 0 ? (size_t)g->n_units : 1, sizeof *g->done);
    if (!g->done) return coli_fail(COLI_E_OUT_OF_MEMORY, "step_end: out of host memory");
    for (int32_t u = 0; u < g->n_units; u++)
        if (g->plan[u].waited) GPU_CHECK(cudaEventCreateWithFlags(&g->done[u], cudaEventDisableTiming));
    GPU_CHECK(cudaEventCreateWithFlags(&g->start, cudaEventDisableTiming));
    for (int32_t q = 1; q < g->queues; q++) {
        GPU_CHECK(cudaEventCreateWithFlags(&g->ends[q], cudaEventDisableTiming));
        if (!g_side_streams[q]) GPU_CHECK(cudaStreamCreateWithFlags(&g_side_streams[q], cudaStreamNonBlocking));
    }
    return COLI_OK;
}

/* Scratch and tables for every op of r, sized from the ops themselves, then the plan. */
static coli_status gpu_rec_make(coli_rec *r, gpu_rec **out) {
    gpu_rec *g = (gpu_rec *)calloc(1, sizeof *g);
    if (!g) return coli_fail(COLI_E_OUT_OF_MEMORY, "step_end: out of host memory");
    *out = g;
    r->impl = g;
    g->tables = (dev_weight **)calloc((size_t)r->count, sizeof *g->tables);
    g->plane_slot = (int32_t *)malloc((size_t)r->count * sizeof *g->plane_slot);
    g->fixed = (uint8_t *)calloc((size_t)r->count, sizeof *g->fixed);
    if (!g->tables || !g->plane_slot || !g->fixed) return coli_fail(COLI_E_OUT_OF_MEMORY, "step_end: out of host memory");
    g->n_ops = r->count;
    size_t planes = 0, scores = 0, gu = 0, eo = 0, tiles = 0, orders = 0, counts = 0;
    int32_t matmuls = 0;
    for (int32_t k = 0; k < r->count; k++) {
        const coli_rec_op *o = &r->ops[k];
        const int64_t *i = o->op.i;
        g->plane_slot[k] = -1;
        if (o->op.kind == COLI_OP_MOE && i[1] > 16)
            return coli_fail(COLI_E_SHAPE, "step_end: moe: k = %lld; this backend takes up to 16 experts a row",
                             (long long)i[1]);
        if (o->op.kind == COLI_OP_MATMUL && o->w[0]->format != COLI_FMT_F32) {
            const size_t b = (size_t)(i[0] * o->w[0]->cols);
            planes = b > planes ? b : planes;
            g->plane_slot[k] = matmuls++ % PLANE_SLOTS;
        } else if (o->op.kind == COLI_OP_INDEXER || o->op.kind == COLI_OP_ATTEND) {
            /* the indexer's scores [rows, sel_stride]; attention's parts [rows * heads, chunks, vdim + 2] */
            const int64_t chunks = attend_chunks(i[4]);
            const size_t b = (size_t)(o->op.kind == COLI_OP_ATTEND ? i[0] * i[1] * chunks * (i[3] + 2) : i[0] * i[4]) *
                             sizeof(float);
            scores = b > scores ? b : scores;
            const size_t c = (size_t)(o->op.kind == COLI_OP_ATTEND ? i[0] * i[1] : i[0]);
            counts = c > counts ? c : counts;
        } else if (o->op.kind == COLI_OP_MOE) {
            const size_t pairs = (size_t)(i[0] * i[1]), a = pairs * (size_t)o->w[0]->rows * sizeof(float);
            gu = a > gu ? a : gu;
            const int32_t n = o->op.n_tensors;
            if (moe_grouped(i[0], i[1], n / 3)) {
                const size_t b = pairs * (size_t)o->w[0]->cols * sizeof(float);
                eo = b > eo ? b : eo;
                const size_t t = 1 + 3 * (size_t)moe_tiles_max((int64_t)pairs, n / 3);
                tiles = t > tiles ? t : tiles;
                orders = pairs > orders ? pairs : orders;
            }
            dev_weight *host = (dev_weight *)malloc((size_t)n * sizeof *host);
            if (!host) return coli_fail(COLI_E_OUT_OF_MEMORY, "step_end: out of host memory");
            for (int32_t t = 0; t < n; t++) {
                const coli_weight *w = o->w[t];
                if (w->format != o->w[0]->format) {
                    free(host);
                    return coli_fail(COLI_E_INVALID, "step_end: moe: expert tensors in more than one format");
                }
                host[t] = dev_weight{w->q, w->scale, w->rows, w->cols, w->group, w->layout};
            }
            cudaError_t e = cudaMalloc((void **)&g->tables[k], (size_t)n * sizeof *host);
            if (e == cudaSuccess) e = cudaMemcpy(g->tables[k], host, (size_t)n * sizeof *host, cudaMemcpyHostToDevice);
            free(host);
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                return coli_fail(COLI_E_OUT_OF_MEMORY, "step_end: moe table: %s", cudaGetErrorString(e));
            }
        }
    }
    g->plane_floats = planes;
    const int32_t slots = matmuls < PLANE_SLOTS ? matmuls : PLANE_SLOTS;
    cudaError_t e = step_malloc((void **)&g->pos, sizeof(int64_t));
    if (e == cudaSuccess) e = step_malloc((void **)&g->planes, planes * (size_t)slots * sizeof(float));
    if (e == cudaSuccess) e = step_malloc((void **)&g->scores, scores);
    if (e == cudaSuccess) e = step_malloc((void **)&g->moe_gu, gu);
    if (e == cudaSuccess) e = step_malloc((void **)&g->moe_eo, eo);
    if (e == cudaSuccess) e = step_malloc((void **)&g->moe_tiles, tiles * sizeof(int32_t));
    if (e == cudaSuccess) e = step_malloc((void **)&g->moe_order, orders * sizeof(int32_t));
    if (e == cudaSuccess) e = step_malloc((void **)&g->counts, counts * sizeof(int32_t));
    if (e == cudaSuccess && counts) e = cudaMemset(g->counts, 0, counts * sizeof(int32_t));
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return coli_fail(COLI_E_OUT_OF_MEMORY, "step_end: cannot allocate the step's scratch (%zu bytes): %s",
                         planes * (size_t)slots * sizeof(float) + scores + gu + eo + (tiles + orders + counts) * 4,
                         cudaGetErrorString(e));
    }
    return gpu_rec_plan(r, g);
}

static void rec_release(coli_rec *r) {
    gpu_rec *g = (gpu_rec *)r->impl;
    if (!g) return;
    if (g_step_stream) (void)cudaStreamSynchronize(g_step_stream);
    if (g->exec) (void)cudaGraphExecDestroy(g->exec);
    if (g->graph) (void)cudaGraphDestroy(g->graph);
    for (int32_t k = 0; g->tables && k < g->n_ops; k++)
        if (g->tables[k]) (void)cudaFree(g->tables[k]);
    for (int32_t u = 0; g->done && u < g->n_units; u++)
        if (g->done[u]) (void)cudaEventDestroy(g->done[u]);
    if (g->start) (void)cudaEventDestroy(g->start);
    for (cudaEvent_t e : g->ends)
        if (e) (void)cudaEventDestroy(e);
    free(g->tables);
    free(g->plane_slot);
    free(g->fixed);
    free(g->units);
    free(g->plan);
    free(g->done);
    void *scratch[] = {g->pos, g->planes, g->scores, g->moe_gu, g->moe_eo, g->moe_tiles, g->moe_order, g->counts};
    for (void *p : scratch)
        if (p) (void)cudaFree(p);
    free(g);
    r->impl = NULL;
}

/* The route op's operands as its kernels take them. */
static route_args route_args_of(const coli_rec_op *o, bool bias_early) {
    const coli_route_operands a = coli_unpack_route(&o->op, o->p);
    return route_args{a.logits, a.bias, a.idx, a.w, (int)a.experts, (int)a.groups, (int)a.topk_group, (int)a.k,
                      (int)a.norm, a.scaling, bias_early};
}

/* Whether ref i of op k reads what the step never writes (gpu_rec's fixed). */
static bool fixed_ref(const gpu_rec *g, int32_t k, int i) { return g->fixed[k] >> i & 1u; }

/* A decode's moe_up_kernel, HELD words a lane of a row's piece; routed where the
 * route op before it is its too. */
template <int FORMAT, int HELD>
static void moe_up_launch(bool routed, dim3 grid, cudaStream_t st, const dev_weight *table, const coli_moe_operands &a,
                          const gpu_rec *g, int64_t inter, int64_t hid, int64_t experts, int split,
                          const route_args &ra) {
    if (routed)
        launch_early(chain_calls(), moe_up_kernel<FORMAT, true, HELD>, grid, dim3(STEP_THREADS), 0, st, table, a.x,
                     a.idx, g->moe_gu, a.k, inter, hid, experts, split, ra);
    else
        launch_early(chain_calls(), moe_up_kernel<FORMAT, false, HELD>, grid, dim3(STEP_THREADS), 0, st, table, a.x,
                     a.idx, g->moe_gu, a.k, inter, hid, experts, split, ra);
}

/* `route`: the route op before it, where the two are one unit (UNIT_ROUTE_MOE), else NULL;
 * bias_early: the step never writes its bias (gpu_rec's fixed). */
template <int FORMAT>
static void launch_moe(const coli_rec_op *o, const gpu_rec *g, const dev_weight *table, const coli_rec_op *route,
                       bool bias_early, cudaStream_t st) {
    const coli_moe_operands a = coli_unpack_moe(&o->op, o->p);
    const int64_t inter = o->w[0]->rows, hid = o->w[0]->cols, experts = a.n_tensors / 3, pairs = a.rows * a.k;
    const int per = STEP_THREADS / WARP;
    const unsigned up_blocks = (unsigned)((inter + per - 1) / per), down_blocks = (unsigned)((hid + per - 1) / per);
    if (moe_grouped(a.rows, a.k, experts)) {
        const unsigned tiles = (unsigned)moe_tiles_max(pairs, experts);
        int32_t *count = g->moe_tiles, *list = g->moe_tiles + 1;
        launch_early(chain_calls(), moe_group_kernel, dim3(1), dim3(1024), 0, st, a.idx, g->moe_order, list, count,
            (int)pairs, (int)experts);
        launch_early(chain_calls(), moe_tile_kernel<FORMAT, true>, dim3(up_blocks, tiles), dim3(STEP_THREADS), 0, st,
            table, a.x, g->moe_order, list, count, g->moe_gu, a.k, inter, hid);
        const coli_weight *down = o->w[2];
        if (moe_rows_path(FORMAT, inter, down->group, down->layout))
            launch_early(chain_calls(), moe_down_rows_kernel<FORMAT>, dim3(blocks_for(hid), tiles), dim3(STEP_THREADS),
                (size_t)(MOE_TILE * inter) * sizeof(float), st, table, g->moe_gu, g->moe_order, list, count, g->moe_eo,
                hid, inter);
        else
            launch_early(chain_calls(), moe_tile_kernel<FORMAT, false>, dim3(down_blocks, tiles), dim3(STEP_THREADS),
                0, st, table, g->moe_gu, g->moe_order, list, count, g->moe_eo, a.k, hid, inter);
        launch_early(chain_calls(), moe_combine_kernel, dim3(blocks_for(hid), (unsigned)a.rows), dim3(STEP_THREADS), 0,
            st, g->moe_eo, a.idx, a.w, a.out, a.k, hid, experts);
        return;
    }
    const int split = moe_up_split<FORMAT>(hid);
    const unsigned rows_a_block = (unsigned)(per / split), decode_up_blocks = (unsigned)((inter + rows_a_block - 1) / rows_a_block);
    const dim3 up_grid(decode_up_blocks, (unsigned)pairs);
    const route_args ra = route ? route_args_of(route, bias_early) : route_args{};
    const int64_t held = (piece_words<FORMAT>(hid, split) + WARP - 1) / WARP; /* words a lane of a piece */
    if (held <= 2) moe_up_launch<FORMAT, 2>(route, up_grid, st, table, a, g, inter, hid, experts, split, ra);
    else if (held <= 4) moe_up_launch<FORMAT, 4>(route, up_grid, st, table, a, g, inter, hid, experts, split, ra);
    else moe_up_launch<FORMAT, ROW_HELD>(route, up_grid, st, table, a, g, inter, hid, experts, split, ra);
    /* int4 rows of at most 16 words, every expert's down on the held path: each half of
     * a team takes an item (half its lanes had no word to load), so half the blocks */
    if constexpr (FORMAT == COLI_FMT_Q4) {
        bool halves = inter % 8 == 0 && inter / 8 <= WARP / 2;
        for (int64_t e = 0; halves && e < experts; e++) {
            const coli_weight *dw = o->w[3 * e + 2];
            halves = dw->layout != TILE_LAYOUT && dw->group % 8 == 0 && dw->cols == inter;
        }
        if (halves) {
            const int per2 = 2 * (int)moe_down_outputs<FORMAT>(a.k);
            launch_early(chain_calls(), moe_down_kernel<FORMAT, 2>, dim3((unsigned)((hid + per2 - 1) / per2), (unsigned)a.rows),
                         dim3(STEP_THREADS), 0, st, table, g->moe_gu, a.idx, a.w, a.out, a.k, inter, hid, experts, per2);
            return;
        }
    }
    const int outs = (int)moe_down_outputs<FORMAT>(a.k);
    launch_early(chain_calls(), moe_down_kernel<FORMAT, 1>, dim3((unsigned)((hid + outs - 1) / outs), (unsigned)a.rows),
                 dim3(STEP_THREADS), 0, st, table, g->moe_gu, a.idx, a.w, a.out, a.k, inter, hid, experts, outs);
}

/* The moe op at `at` (`route`: as launch_moe's). */
static void launch_moe_op(const coli_rec_op *o, int32_t at, const gpu_rec *g, const coli_rec_op *route, cudaStream_t st) {
    const dev_weight *table = g->tables[at];
    const bool early = route && fixed_ref(g, at - 1, 1); /* the route is the op before: route_then_moe */
    if (o->w[0]->format == COLI_FMT_F32) launch_moe<COLI_FMT_F32>(o, g, table, route, early, st);
    else if (o->w[0]->format == COLI_FMT_Q8) launch_moe<COLI_FMT_Q8>(o, g, table, route, early, st);
    else launch_moe<COLI_FMT_Q4>(o, g, table, route, early, st);
}

/* Queues one op; the launch's error, if any, is read once after the step. */
static void launch_op(const coli_rec_op *o, int32_t at, const gpu_rec *g, cudaStream_t st) {
    void *const *p = o->p;
    const int64_t *pos = g->pos;
    switch (o->op.kind) {
    case COLI_OP_EMBED: {
        const coli_embed_operands a = coli_unpack_embed(&o->op, p);
        launch_early(chain_calls(), embed_kernel, dim3((unsigned)a.rows), dim3(STEP_THREADS), 0, st, a.table, a.ids,
            a.out, a.width, a.vocab);
        break;
    }
    case COLI_OP_RMSNORM: {
        const coli_rmsnorm_operands a = coli_unpack_rmsnorm(&o->op, p);
        launch_early(chain_calls(), fixed_ref(g, at, 1) ? rmsnorm_kernel<true> : rmsnorm_kernel<false>,
            dim3((unsigned)a.rows), dim3(STEP_THREADS), 0, st, a.x, a.w, a.out, a.n, a.x_stride, a.out_stride, a.eps);
        break;
    }
    case COLI_OP_LAYERNORM: {
        const coli_layernorm_operands a = coli_unpack_layernorm(&o->op, p);
        const bool early = fixed_ref(g, at, 1) && fixed_ref(g, at, 2);
        launch_early(chain_calls(), early ? layernorm_kernel<true> : layernorm_kernel<false>, dim3((unsigned)a.rows),
            dim3(STEP_THREADS), 0, st, a.x, a.w, a.b, a.n, a.stride, a.eps);
        break;
    }
    case COLI_OP_ROPE: {
        const coli_rope_operands a = coli_unpack_rope(&o->op, p);
        launch_early(chain_calls(), fixed_ref(g, at, 1) ? rope_kernel<true> : rope_kernel<false>,
            dim3((unsigned)(a.rows * a.heads)), dim3(64), 0, st, a.x, a.inv_freq, pos, a.heads, a.row_stride,
            a.head_stride, a.dim);
        break;
    }
    case COLI_OP_MATMUL: {
        const coli_matmul_operands a = coli_unpack_matmul(&o->op, p);
        const coli_weight *w = o->w[0];
        (void)launch_matmul(w, a.x, a.s, a.y, false, st,
                            g->plane_slot[at] < 0 ? NULL : g->planes + g->plane_floats * g->plane_slot[at]);
        if (a.bias) launch_early(chain_calls(), bias_kernel,
            dim3(blocks_for(a.s * w->rows)), dim3(STEP_THREADS), 0, st, a.y, a.bias, w->rows, a.s * w->rows);
        break;
    }
    case COLI_OP_WRITE_ROWS: {
        const coli_write_rows_operands a = coli_unpack_write_rows(&o->op, p);
        launch_early(chain_calls(), write_rows_kernel, dim3((unsigned)a.rows), dim3(128), 0, st, a.src, a.dst, pos,
            a.width, a.src_stride, a.src_repeat, a.dst_stride, a.pos_rows);
        break;
    }
    case COLI_OP_ADD: {
        const coli_add_operands a = coli_unpack_add(&o->op, p);
        launch_early(chain_calls(), add_kernel, dim3(blocks_for(a.count)), dim3(STEP_THREADS), 0, st, a.x, a.y,
            a.count);
        break;
    }
    case COLI_OP_SILU_MUL: {
        const coli_silu_mul_operands a = coli_unpack_silu_mul(&o->op, p);
        launch_early(chain_calls(), silu_mul_kernel, dim3(blocks_for(a.count)), dim3(STEP_THREADS), 0, st, a.g, a.u,
            a.count);
        break;
    }
    case COLI_OP_INDEXER: {
        const coli_indexer_operands a = coli_unpack_indexer(&o->op, p);
        /* keys up to the largest position the step allows for its last row */
        const int64_t keys = a.sel_stride;
        if (indexer_tiled(a.rows, a.heads, a.dim)) {
            const int64_t tiles = (a.rows + INDEX_TILE_Q - 1) / INDEX_TILE_Q;
            launch_early(chain_calls(), indexer_tile_kernel,
                dim3((unsigned)tiles, (unsigned)((keys + STEP_THREADS - 1) / STEP_THREADS)), dim3(STEP_THREADS), 0, st,
                a.iq, a.iw, a.keys, g->scores, pos, a.heads, a.dim, a.sel_stride, a.topk, a.rows, a.weight_scale);
            launch_early(chain_calls(), index_select_kernel, dim3((unsigned)a.rows), dim3(STEP_THREADS), 0, st,
                g->scores, a.sel, pos, a.sel_stride, a.topk, a.rows);
            break;
        }
        const int per = STEP_THREADS / WARP;
        launch_early(chain_calls(), indexer_kernel, dim3((unsigned)((keys + per - 1) / per), (unsigned)a.rows),
            dim3(STEP_THREADS), 0, st, a.iq, a.iw, a.keys, g->scores, a.sel, g->counts, pos, a.heads, a.dim,
            a.sel_stride, a.topk, a.rows, a.weight_scale);
        break;
    }
    case COLI_OP_ATTEND: {
        const coli_attend_operands a = coli_unpack_attend(&o->op, p);
        const int64_t pairs = a.rows * a.heads;
        if (attend_tiled(pairs, a.qk, a.vdim)) {
            const int64_t tiles = (a.rows + ATTEND_TILE_Q - 1) / ATTEND_TILE_Q;
            launch_early(chain_calls(), attend_tile_kernel,
                dim3((unsigned)(tiles * a.heads), (unsigned)((a.sel_stride + ATTEND_CHUNK - 1) / ATTEND_CHUNK)),
                dim3(STEP_THREADS), 0, st, a.q, a.k, a.v, a.sel, g->scores, g->counts, a.out, pos, a.rows, a.heads,
                a.qk, a.vdim, a.sel_stride, a.scaling);
            break;
        }
        const int64_t chunks = attend_rows(pairs, a.sel_stride);
        launch_early(chain_calls(), attend_part_kernel, dim3((unsigned)pairs, (unsigned)chunks), dim3(STEP_THREADS), 0,
            st, a.q, a.k, a.v, a.sel, g->scores, g->counts, a.out, pos, a.heads, a.qk, a.vdim, a.sel_stride, a.scaling);
        break;
    }
    case COLI_OP_ROUTE: {
        const coli_route_operands a = coli_unpack_route(&o->op, p);
        launch_early(chain_calls(), route_kernel, dim3((unsigned)a.rows), dim3(WARP), 0, st, route_args_of(o, false));
        break;
    }
    case COLI_OP_MOE: launch_moe_op(o, at, g, NULL, st); break;
    case COLI_OP_KEEP_IDS: {
        const coli_keep_ids_operands a = coli_unpack_keep_ids(&o->op, p);
        launch_early(chain_calls(), keep_ids_kernel, dim3(blocks_for(a.rows)), dim3(STEP_THREADS), 0, st, a.ids, a.kept,
            pos, a.rows);
        break;
    }
    default: {
        const coli_argmax_operands a = coli_unpack_argmax(&o->op, p);
        launch_early(chain_calls(), argmax_kernel, dim3((unsigned)a.rows), dim3(ARGMAX_THREADS), 0, st, a.logits,
            a.ids, (int)a.vocab);
    }
    }
}

/* A UNIT_ADD_RMSNORM unit (2 or 3 ops) as one add_rmsnorm_kernel. */
static void launch_add_rmsnorm(const coli_rec *r, const gpu_rec *g, const gpu_unit *u, cudaStream_t st) {
    const coli_rec_op *first = &r->ops[u->first], *norm = &r->ops[u->first + u->len - 1];
    const coli_add_operands a = coli_unpack_add(&first->op, first->p);
    const coli_rmsnorm_operands n = coli_unpack_rmsnorm(&norm->op, norm->p);
    float *x = a.x, *y = (float *)a.y;
    const float *z = NULL;
    if (u->len == 3) x = coli_unpack_add(&r->ops[u->first + 1].op, r->ops[u->first + 1].p).x, y = a.x, z = a.y;
    launch_early(chain_calls(),
        fixed_ref(g, u->first + u->len - 1, 1) ? add_rmsnorm_kernel<true> : add_rmsnorm_kernel<false>,
        dim3((unsigned)n.rows), dim3(STEP_THREADS), 0, st, x, y, z, n.w, n.out, n.n, n.out_stride, n.eps);
}

/* COLI_GPU_OMIT=kind,... leaves ops out of every run, to measure what each kind adds to
 * a step: the op names COLI_GPU_PROFILE prints (matmuls by format, "matmul-int8"), and
 * add_rmsnorm for the fused units. COLI_GPU_OMIT_AS=empty launches a one-block empty
 * kernel in each one's place instead, so the difference between the two is the work
 * beyond a launch. The results are wrong while it is set: bench/gpu_decode_parts.sh. */
/* An op's kind for COLI_GPU_PROFILE and COLI_GPU_OMIT: matmuls by format after the ops. */
enum { PROFILE_KINDS = 16 + 3, OMIT_FUSED = PROFILE_KINDS, OMIT_SLOTS = PROFILE_KINDS + 1 };
static int profile_slot(const coli_rec_op *o) {
    return o->op.kind == COLI_OP_MATMUL ? 16 + o->w[0]->format : o->op.kind;
}

__global__ void omitted_kernel(void) {}
static const char *omit_name(int slot) {
    static const char *const fmts[] = {"matmul-f32", "matmul-int8", "matmul-int4"};
    if (slot == OMIT_FUSED) return "add_rmsnorm";
    if (slot >= 16) return fmts[slot - 16];
    const coli_op_info *info = coli_op_info_of(slot);
    return info ? info->name : NULL;
}
static uint32_t omitted_slots(void) {
    static int64_t mask = -1;
    if (mask < 0) {
        const char *v = getenv("COLI_GPU_OMIT");
        mask = 0;
        for (int k = 0; v && k < OMIT_SLOTS; k++) {
            const char *name = omit_name(k);
            const size_t len = name ? strlen(name) : 0;
            for (const char *at = v; name && (at = strstr(at, name)) != NULL; at += len)
                if ((at == v || at[-1] == ',') && (at[len] == ',' || at[len] == 0)) mask |= (int64_t)1 << k;
        }
    }
    return (uint32_t)mask;
}
static bool omit(int slot, cudaStream_t st) {
    if (!(omitted_slots() >> slot & 1)) return false;
    static int empty = -1;
    if (empty < 0) {
        const char *v = getenv("COLI_GPU_OMIT_AS");
        empty = v && strcmp(v, "empty") == 0;
    }
    if (empty) omitted_kernel<<<1, WARP, 0, st>>>();
    return true;
}

/* Every unit on its planned stream, after the units of other streams it waits for;
 * the side streams start after what the step stream queued before, and it waits
 * for all of them at the end, so a run is ordered like one stream's work. */
static coli_status launch_ops(const coli_rec *r, const gpu_rec *g) {
    cudaStream_t s0 = g_step_stream;
    if (g->queues > 1) GPU_CHECK(cudaEventRecord(g->start, s0));
    for (int32_t q = 1; q < g->queues; q++) GPU_CHECK(cudaStreamWaitEvent(queue_stream(q), g->start, 0));
    for (int32_t u = 0; u < g->n_units; u++) {
        const coli_unit_plan *pl = &g->plan[u];
        const gpu_unit *unit = &g->units[u];
        cudaStream_t st = queue_stream(pl->queue);
        for (int32_t q = 0; q < g->queues; q++)
            if (pl->wait[q] >= 0) GPU_CHECK(cudaStreamWaitEvent(st, g->done[pl->wait[q]], 0));
        const coli_rec_op *first = &r->ops[unit->first];
        const int slot = unit->kind == UNIT_ADD_RMSNORM ? (int)OMIT_FUSED
                         : unit->kind == UNIT_ROUTE_MOE ? (int)COLI_OP_MOE
                                                         : profile_slot(first);
        if (!omit(slot, st)) {
            if (unit->kind == UNIT_OP) launch_op(first, unit->first, g, st);
            else if (unit->kind == UNIT_ROUTE_MOE) launch_moe_op(first + 1, unit->first + 1, g, first, st);
            else launch_add_rmsnorm(r, g, unit, st);
        }
        if (pl->waited) GPU_CHECK(cudaEventRecord(g->done[u], st));
    }
    for (int32_t q = 1; q < g->queues; q++) {
        GPU_CHECK(cudaEventRecord(g->ends[q], queue_stream(q)));
        GPU_CHECK(cudaStreamWaitEvent(s0, g->ends[q], 0));
    }
    return COLI_OK;
}

/* The captured graph made executable. Captured, every dependency between kernels is
 * already programmatic where the later one was launched early (it waits inside for the
 * grids before it, coli_wait_prior_grid), across streams too: an H200 run that counted
 * the graph's edges found all 788 of a decode's so, and none left to convert. Only on
 * one stream does the later kernel launch before the earlier ends (bench/RESULTS.md). */
static coli_status instantiate_step(gpu_rec *g) {
    GPU_CHECK(cudaGraphInstantiateWithFlags(&g->exec, g->graph, 0));
    return COLI_OK;
}

/* COLI_GPU_GRAPHS=0 launches every run's ops one by one (for comparisons). */
static bool use_graphs(void) {
    static int on = -1;
    return env_switch("COLI_GPU_GRAPHS", &on);
}

/* COLI_GPU_PROFILE=1: every run launches its ops one by one, each between two
 * events, and the time per op kind (matmuls by format) is printed to stderr when
 * the backend shuts down: where a step's GPU time goes, with no profiler. */
static double g_profile_ms[PROFILE_KINDS];
static int64_t g_profile_calls[PROFILE_KINDS];
static bool profiling(void) {
    static int on = -1;
    if (on < 0) on = getenv("COLI_GPU_PROFILE") != NULL;
    return on != 0;
}

static coli_status profile_run(const coli_rec *r, const gpu_rec *g, cudaStream_t s) {
    cudaEvent_t ev[2];
    GPU_CHECK(cudaEventCreate(&ev[0]));
    GPU_CHECK(cudaEventCreate(&ev[1]));
    for (int32_t k = 0; k < r->count; k++) {
        float ms = 0.0f;
        GPU_CHECK(cudaEventRecord(ev[0], s));
        launch_op(&r->ops[k], k, g, s);
        GPU_CHECK(cudaEventRecord(ev[1], s));
        GPU_CHECK(cudaEventSynchronize(ev[1]));
        GPU_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
        g_profile_ms[profile_slot(&r->ops[k])] += ms;
        g_profile_calls[profile_slot(&r->ops[k])]++;
    }
    (void)cudaEventDestroy(ev[0]);
    (void)cudaEventDestroy(ev[1]);
    return COLI_OK;
}

static void profile_print(void) {
    static const char *const fmts[] = {"matmul f32", "matmul int8", "matmul int4"};
    double total = 0.0;
    for (int k = 0; k < PROFILE_KINDS; k++) total += g_profile_ms[k];
    if (!profiling() || total <= 0.0) return;
    fprintf(stderr, "GPU step ops (COLI_GPU_PROFILE): %.3f ms in all\n", total);
    for (int k = 0; k < PROFILE_KINDS; k++) {
        if (!g_profile_calls[k]) continue;
        const coli_op_info *info = k < 16 ? coli_op_info_of(k) : NULL;
        fprintf(stderr, "  %-12s %8lld calls %10.3f ms %8.2f us each %5.1f%%\n", k >= 16 ? fmts[k - 16] : info->name,
                (long long)g_profile_calls[k], g_profile_ms[k], 1e3 * g_profile_ms[k] / (double)g_profile_calls[k],
                100.0 * g_profile_ms[k] / total);
    }
}

/* A step is made ready when it ends, so its first run only launches: scratch and
 * expert tables allocated, units planned, events and streams created. */
static coli_status rec_end(coli_rec *r) {
    gpu_rec *g = NULL;
    const coli_status st = gpu_rec_make(r, &g);
    if (st) rec_release(r);
    return st;
}

static coli_status rec_run(coli_rec *r, int64_t position) {
    gpu_rec *g = (gpu_rec *)r->impl;
    coli_status st;
    cudaStream_t s = g_step_stream;
    set_position_kernel<<<1, 1, 0, s>>>(g->pos, position);
    if (profiling()) return profile_run(r, g, s);
    /* the first run launches directly (kernel attributes are set on first use, outside
     * any capture); the second captures the ops, and that and every later run replay them */
    if (g->runs++ == 0 || !use_graphs()) {
        if ((st = launch_ops(r, g))) return st;
    } else {
        if (!g->exec) {
            GPU_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
            const coli_status queued = launch_ops(r, g);
            const cudaError_t launch = cudaGetLastError();
            const cudaError_t end = cudaStreamEndCapture(s, &g->graph);
            if (queued) return queued;
            if (launch != cudaSuccess || end != cudaSuccess)
                return coli_fail(COLI_E_RUNTIME, "step_run: capturing the step failed: %s",
                                 cudaGetErrorString(launch != cudaSuccess ? launch : end));
            if ((st = instantiate_step(g))) return st;
        }
        GPU_CHECK(cudaGraphLaunch(g->exec, s));
    }
    GPU_CHECK(cudaGetLastError());
    return COLI_OK;
}

#endif
