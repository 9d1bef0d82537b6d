/* The CPU reference backend: the whole ABI on the host, with the same
 * arithmetic as the engine's CPU path. It proves the loader and the ABI on any
 * machine, and is the yardstick the GPU backends are checked against. */
#define COLI_BUILDING_BACKEND 1
#include "backend_common.h"
#include "cpu_model_ops.h"
#include "cpu_ops.h"

#define REF_TAG 0x5246 /* "RF" */

static coli_table g_tensors = {REF_TAG, "tensor", NULL, 0, 0, 0, 0};
static coli_table g_buffers = {REF_TAG + 1, "buffer", NULL, 0, 0, 0, 0};
static coli_table g_steps = {REF_TAG + 2, "step", NULL, 0, 0, 0, 0};
static int g_ready;
static int32_t g_threads = 1;

/* COLI_REF_DEVICE_MEMORY=N: the reference backend acts as a device of N bytes
 * (memory_info reports them, and an allocation past them fails as on a GPU), so
 * the host's out-of-device-memory paths run on any machine. Unset: host memory,
 * not tracked. */
static uint64_t g_used;
static uint64_t device_limit(void) {
    static int read = 0;
    static uint64_t limit = 0;
    if (!read) {
        const char *v = getenv("COLI_REF_DEVICE_MEMORY");
        limit = v ? strtoull(v, NULL, 10) : 0;
        read = 1;
    }
    return limit;
}

static coli_status take_bytes(const char *what, uint64_t n) {
    const uint64_t limit = device_limit();
    if (limit && n > limit - g_used)
        return coli_fail(COLI_E_OUT_OF_MEMORY, "%s: %llu bytes do not fit: %llu of COLI_REF_DEVICE_MEMORY's %llu are free",
                         what, (unsigned long long)n, (unsigned long long)(limit - g_used), (unsigned long long)limit);
    g_used += n;
    return COLI_OK;
}

COLI_API uint32_t coli_abi_version(void) { return COLI_ABI_VERSION; }
COLI_API const char *coli_backend_name(void) { return "ref"; }
COLI_API const char *coli_last_error(void) { return coli_error_get(); }

COLI_API coli_status coli_backend_init(int32_t device) {
    if (device != 0) return coli_fail(COLI_E_NO_DEVICE, "ref backend has one device (0), asked for %d", (int)device);
    g_ready = 1;
    return COLI_OK;
}

static void release(coli_weight *w) {
    g_used -= w->bytes;
    free(w->q);
    free(w->scale);
    free(w);
}

#include "backend_steps.h"

COLI_API coli_status coli_backend_shutdown(void) {
    coli_steps_reset();
    for (uint32_t i = 0; i < g_tensors.count; i++)
        if (g_tensors.slots[i].live) release((coli_weight *)g_tensors.slots[i].p);
    coli_table_reset(&g_tensors);
    g_ready = 0;
    return COLI_OK;
}

COLI_API coli_status coli_device_count(int32_t *count) {
    if (!count) return coli_fail(COLI_E_INVALID, "device_count: null count");
    *count = 1;
    return COLI_OK;
}

COLI_API coli_status coli_device_describe(int32_t device, coli_device_info *info) {
    if (!info) return coli_fail(COLI_E_INVALID, "device_describe: null info");
    if (device != 0) return coli_fail(COLI_E_INVALID, "device_describe: no device %d", (int)device);
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "CPU reference");
    snprintf(info->arch, sizeof info->arch, "cpu");
    info->compute_units = g_threads;
    return COLI_OK;
}

/* The CPU has no runtime of its own to report: versions 0, its one device always there. */
COLI_API coli_status coli_runtime_describe(coli_runtime_info *info) {
    if (!info) return coli_fail(COLI_E_INVALID, "runtime_describe: null info");
    memset(info, 0, sizeof *info);
    return COLI_OK;
}

COLI_API coli_status coli_device_integrated(int32_t device, int32_t *integrated) {
    if (!integrated) return coli_fail(COLI_E_INVALID, "device_integrated: null integrated");
    if (device != 0) return coli_fail(COLI_E_INVALID, "device_integrated: no device %d", (int)device);
    *integrated = 1;
    return COLI_OK;
}

COLI_API coli_status coli_memory_info(uint64_t *free_bytes, uint64_t *total_bytes) {
    if (!free_bytes || !total_bytes) return coli_fail(COLI_E_INVALID, "memory_info: null argument");
    *total_bytes = device_limit(); /* 0: host memory, not tracked */
    *free_bytes = *total_bytes ? *total_bytes - g_used : 0;
    return COLI_OK;
}

static coli_status upload(int32_t format, const void *q, const float *scale, int64_t rows, int64_t cols,
                          int32_t group, coli_tensor *out) {
    coli_weight tmp, *w;
    size_t qb, sb;
    coli_status st;
    if (!g_ready) return coli_fail(COLI_E_NOT_INIT, "upload: backend not initialised");
    st = coli_weight_check(format, q, scale, rows, cols, group, out, &tmp);
    if (st) return st;
    coli_weight_sizes(&tmp, &qb, &sb);
    if ((st = take_bytes("upload", qb + sb))) return st;
    w = (coli_weight *)malloc(sizeof *w);
    if (!w) {
        g_used -= qb + sb;
        return coli_fail(COLI_E_OUT_OF_MEMORY, "upload: out of host memory");
    }
    *w = tmp;
    w->bytes = qb + sb;
    w->q = malloc(qb);
    w->scale = sb ? (float *)malloc(sb) : NULL;
    if (!w->q || (sb && !w->scale)) {
        release(w);
        return coli_fail(COLI_E_OUT_OF_MEMORY, "upload: cannot allocate %zu bytes", qb + sb);
    }
    memcpy(w->q, q, qb);
    if (sb) memcpy(w->scale, scale, sb);
    st = coli_table_add(&g_tensors, w, out);
    if (st) release(w);
    return st;
}

#include "backend_tensors.h"

static void run_matmul(const coli_weight *w, const float *x, int64_t s, float *y) {
    switch (w->format) {
    case COLI_FMT_F32: coli_matmul_f32((const float *)w->q, w->rows, w->cols, x, s, y); break;
    case COLI_FMT_Q8: coli_matmul_q8((const int8_t *)w->q, w->scale, w->rows, w->cols, x, s, y); break;
    default: coli_matmul_q4((const uint8_t *)w->q, w->scale, w->rows, w->cols, w->group, x, s, y);
    }
}

COLI_API coli_status coli_matmul(coli_tensor weight, const float *x, int64_t s, int64_t in_features, float *y) {
    coli_weight *w = NULL;
    const coli_status st = coli_matmul_args(g_ready, &g_tensors, weight, x, s, in_features, y, &w);
    if (st) return st;
    run_matmul(w, x, s, y);
    return COLI_OK;
}

COLI_API coli_status coli_matmul_many(const coli_tensor *weights, int32_t count, const float *x, int64_t s,
                                      int64_t in_features, float *const *ys) {
    coli_weight *ws[COLI_MANY_MAX];
    const coli_status st = coli_many_check(g_ready, &g_tensors, weights, count, x, s, in_features, ys, ws);
    if (st) return st;
    for (int32_t i = 0; i < count; i++) run_matmul(ws[i], x, s, ys[i]);
    return COLI_OK;
}

COLI_API coli_status coli_backend_set_threads(int32_t threads) {
    if (threads < 1) return coli_fail(COLI_E_INVALID, "set_threads: %d, must be at least 1", (int)threads);
    g_threads = threads;
    return COLI_OK;
}

/* ---- steps: the ops run here, one after another, when the step runs ---- */

/* A buffer's size sits in the 16 bytes before it, for the device memory's count. */
static coli_status mem_alloc(uint64_t bytes, void **out) {
    coli_status st = take_bytes("buffer_alloc", bytes);
    if (st) return st;
    uint64_t *p = (uint64_t *)calloc(1, (size_t)bytes + 16);
    if (!p) {
        g_used -= bytes;
        return coli_fail(COLI_E_OUT_OF_MEMORY, "buffer_alloc: cannot allocate %llu bytes", (unsigned long long)bytes);
    }
    p[0] = bytes;
    *out = p + 2;
    return COLI_OK;
}

static void mem_free(void *p) {
    uint64_t *base = (uint64_t *)p - 2;
    g_used -= base[0];
    free(base);
}

static coli_status mem_write(void *dst, const void *src, uint64_t bytes) {
    memcpy(dst, src, (size_t)bytes);
    return COLI_OK;
}

static coli_status mem_read(void *dst, const void *src, uint64_t bytes) {
    memcpy(dst, src, (size_t)bytes);
    return COLI_OK;
}

static coli_status rec_end(coli_rec *r) {
    (void)r;
    return COLI_OK;
}

static void rec_release(coli_rec *r) { (void)r; }

static void matmul_bias(const coli_weight *w, const float *x, int64_t s, float *y, const float *bias) {
    run_matmul(w, x, s, y);
    if (bias)
        for (int64_t t = 0; t < s; t++)
            for (int64_t r = 0; r < w->rows; r++) y[t * w->rows + r] += bias[r];
}

/* The routed experts of each row, in ascending expert order, as the engine adds them. */
static coli_status run_moe(const coli_rec_op *r) {
    const coli_moe_operands a = coli_unpack_moe(&r->op, r->p);
    const int64_t inter = r->w[0]->rows, hid = r->w[0]->cols, experts = a.n_tensors / 3;
    float *g = (float *)malloc((size_t)(2 * inter + hid) * sizeof(float)), *u = g + inter, *eo = u + inter;
    if (!g) return coli_fail(COLI_E_OUT_OF_MEMORY, "step_run: moe: out of host memory");
    for (int64_t row = 0; row < a.rows; row++) {
        const int32_t *idx = a.idx + row * a.k;
        float *out = a.out + row * hid;
        const float *x = a.x + row * hid;
        memset(out, 0, (size_t)hid * sizeof(float));
        for (int64_t e = 0; e < experts; e++)
            for (int64_t j = 0; j < a.k; j++) {
                if (idx[j] != e) continue;
                run_matmul(r->w[3 * e], x, 1, g);
                run_matmul(r->w[3 * e + 1], x, 1, u);
                for (int64_t i = 0; i < inter; i++) g[i] = coli_silu(g[i]) * u[i];
                run_matmul(r->w[3 * e + 2], g, 1, eo);
                for (int64_t d = 0; d < hid; d++) out[d] += eo[d] * a.w[row * a.k + j];
            }
        for (int64_t j = 0; j < a.k; j++)
            if (idx[j] < 0 || idx[j] >= experts) {
                free(g);
                return coli_fail(COLI_E_INVALID, "step_run: moe: row %lld routes to expert %d of %lld",
                                 (long long)row, (int)idx[j], (long long)experts);
            }
    }
    free(g);
    return COLI_OK;
}

static coli_status run_indexer(const coli_rec_op *r, int64_t pos) {
    const coli_indexer_operands a = coli_unpack_indexer(&r->op, r->p);
    coli_scored *sc = (coli_scored *)malloc((size_t)(pos + a.rows) * sizeof *sc);
    if (!sc) return coli_fail(COLI_E_OUT_OF_MEMORY, "step_run: indexer: out of host memory");
    for (int64_t row = 0; row < a.rows; row++) {
        const int64_t valid = pos + row + 1;
        uint8_t *sel = a.sel + row * a.sel_stride;
        memset(sel, 0, (size_t)(pos + a.rows));
        if (valid > a.topk)
            coli_index_scores(a.iq + row * a.heads * a.dim, a.iw + row * a.heads, a.weight_scale, a.keys, a.heads,
                              a.dim, 0, valid, sc);
        coli_index_select(sc, valid, a.topk, sel);
    }
    free(sc);
    return COLI_OK;
}

static coli_status run_attend(const coli_rec_op *r, int64_t pos) {
    const coli_attend_operands a = coli_unpack_attend(&r->op, r->p);
    float *p = (float *)malloc((size_t)(pos + a.rows) * sizeof *p);
    if (!p) return coli_fail(COLI_E_OUT_OF_MEMORY, "step_run: attend: out of host memory");
    for (int64_t row = 0; row < a.rows; row++)
        for (int64_t h = 0; h < a.heads; h++)
            coli_attend_one(a.q + (row * a.heads + h) * a.qk, a.k + h * a.qk, a.v + h * a.vdim, a.heads * a.qk,
                            a.heads * a.vdim, a.qk, a.vdim, a.sel + row * a.sel_stride, pos + row, a.scaling, p,
                            a.out + (row * a.heads + h) * a.vdim);
    free(p);
    return COLI_OK;
}

static coli_status run_op(const coli_rec_op *r, int64_t pos) {
    void *const *p = r->p;
    switch (r->op.kind) {
    case COLI_OP_EMBED: {
        const coli_embed_operands a = coli_unpack_embed(&r->op, p);
        for (int64_t row = 0; row < a.rows; row++) {
            const int32_t id = a.ids[row];
            if (id < 0 || id >= a.vocab) memset(a.out + row * a.width, 0, (size_t)a.width * sizeof(float));
            else memcpy(a.out + row * a.width, a.table + (int64_t)id * a.width, (size_t)a.width * sizeof(float));
        }
        return COLI_OK;
    }
    case COLI_OP_RMSNORM: {
        const coli_rmsnorm_operands a = coli_unpack_rmsnorm(&r->op, p);
        for (int64_t row = 0; row < a.rows; row++)
            coli_rmsnorm(a.x + row * a.x_stride, a.w, a.n, a.eps, a.out + row * a.out_stride);
        return COLI_OK;
    }
    case COLI_OP_LAYERNORM: {
        const coli_layernorm_operands a = coli_unpack_layernorm(&r->op, p);
        for (int64_t row = 0; row < a.rows; row++) coli_layernorm(a.x + row * a.stride, a.w, a.b, a.n, a.eps);
        return COLI_OK;
    }
    case COLI_OP_ROPE: {
        const coli_rope_operands a = coli_unpack_rope(&r->op, p);
        for (int64_t row = 0; row < a.rows; row++)
            for (int64_t h = 0; h < a.heads; h++)
                coli_rope(a.x + row * a.row_stride + h * a.head_stride, a.dim, a.inv_freq, pos + row);
        return COLI_OK;
    }
    case COLI_OP_MATMUL: {
        const coli_matmul_operands a = coli_unpack_matmul(&r->op, p);
        matmul_bias(r->w[0], a.x, a.s, a.y, a.bias);
        return COLI_OK;
    }
    case COLI_OP_WRITE_ROWS: {
        const coli_write_rows_operands a = coli_unpack_write_rows(&r->op, p);
        for (int64_t row = 0; row < a.rows; row++)
            memcpy(a.dst + (pos * a.pos_rows + row) * a.dst_stride, a.src + row / a.src_repeat * a.src_stride,
                   (size_t)a.width * sizeof(float));
        return COLI_OK;
    }
    case COLI_OP_ADD: {
        const coli_add_operands a = coli_unpack_add(&r->op, p);
        for (int64_t i = 0; i < a.count; i++) a.x[i] += a.y[i];
        return COLI_OK;
    }
    case COLI_OP_SILU_MUL: {
        const coli_silu_mul_operands a = coli_unpack_silu_mul(&r->op, p);
        for (int64_t i = 0; i < a.count; i++) a.g[i] = coli_silu(a.g[i]) * a.u[i];
        return COLI_OK;
    }
    case COLI_OP_INDEXER: return run_indexer(r, pos);
    case COLI_OP_ATTEND: return run_attend(r, pos);
    case COLI_OP_ROUTE: {
        const coli_route_operands a = coli_unpack_route(&r->op, p);
        for (int64_t row = 0; row < a.rows; row++)
            coli_route(a.logits + row * a.experts, a.bias, a.experts, a.groups, a.topk_group, a.k, (int)a.norm,
                       a.scaling, a.idx + row * a.k, a.w + row * a.k);
        return COLI_OK;
    }
    case COLI_OP_MOE: return run_moe(r);
    case COLI_OP_KEEP_IDS: {
        const coli_keep_ids_operands a = coli_unpack_keep_ids(&r->op, p);
        memmove(a.kept + pos, a.ids, (size_t)a.rows * sizeof *a.ids);
        return COLI_OK;
    }
    default: {
        const coli_argmax_operands a = coli_unpack_argmax(&r->op, p);
        for (int64_t row = 0; row < a.rows; row++) a.ids[row] = coli_argmax(a.logits + row * a.vocab, a.vocab);
        return COLI_OK;
    }
    }
}

static coli_status rec_run(coli_rec *r, int64_t pos) {
    for (int32_t k = 0; k < r->count; k++) {
        const coli_status st = run_op(&r->ops[k], pos);
        if (st) return st;
    }
    return COLI_OK;
}
