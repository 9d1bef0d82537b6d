/* The CPU reference backend: the whole ABI on the host, with the same
 * arithmetic as the engine's CPU path. It proves the loader and the ABI on any
 * machine, and is the yardstick the GPU backends are checked against. */
#define COLI_BUILDING_BACKEND 1
#include "backend_common.h"
#include "cpu_ops.h"

#define REF_TAG 0x5246 /* "RF" */

static coli_table g_tensors = {REF_TAG, NULL, 0, 0, 0};
static int g_ready;
static int32_t g_threads = 1;

COLI_API uint32_t coli_abi_version(void) { return COLI_ABI_VERSION; }
COLI_API const char *coli_backend_name(void) { return "ref"; }
COLI_API const char *coli_last_error(void) { return coli_error_get(); }

COLI_API coli_status coli_backend_init(int32_t device) {
    if (device != 0) return coli_fail(COLI_E_NO_DEVICE, "ref backend has one device (0), asked for %d", (int)device);
    g_ready = 1;
    return COLI_OK;
}

static void release(coli_weight *w) {
    free(w->q);
    free(w->scale);
    free(w);
}

COLI_API coli_status coli_backend_shutdown(void) {
    for (uint32_t i = 0; i < g_tensors.count; i++)
        if (g_tensors.slots[i].live) release(g_tensors.slots[i].w);
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

COLI_API coli_status coli_memory_info(uint64_t *free_bytes, uint64_t *total_bytes) {
    if (!free_bytes || !total_bytes) return coli_fail(COLI_E_INVALID, "memory_info: null argument");
    *free_bytes = *total_bytes = 0; /* host memory: not tracked */
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
    w = (coli_weight *)malloc(sizeof *w);
    if (!w) return coli_fail(COLI_E_OUT_OF_MEMORY, "upload: out of host memory");
    *w = tmp;
    w->q = malloc(qb);
    w->scale = sb ? (float *)malloc(sb) : NULL;
    if (!w->q || (sb && !w->scale)) {
        release(w);
        return coli_fail(COLI_E_OUT_OF_MEMORY, "upload: cannot allocate %zu bytes", qb + sb);
    }
    memcpy(w->q, q, qb);
    if (sb) memcpy(w->scale, scale, sb);
    w->bytes = qb + sb;
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
