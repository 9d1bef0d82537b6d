/* What every backend shares: the thread's last error, checked tensor handles,
 * and the argument checks of the upload and matmul calls. Header-only so the C
 * reference backend and the CUDA/HIP source include the same code. */
#ifndef COLI_BACKEND_COMMON_H
#define COLI_BACKEND_COMMON_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coli_backend.h"

#ifdef __cplusplus
#define COLI_TLS thread_local
#else
#define COLI_TLS _Thread_local
#endif

static COLI_TLS char coli_error_text[512];

#if defined(__MINGW32__)
__attribute__((format(gnu_printf, 2, 3))) /* MinGW with __USE_MINGW_ANSI_STDIO */
#elif defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static coli_status coli_fail(coli_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(coli_error_text, sizeof coli_error_text, fmt, ap);
    va_end(ap);
    return status;
}

static const char *coli_error_get(void) { return coli_error_text; }

/* A weight as every backend stores it; `q` and `scale` point into the backend's
 * memory. `layout` is how `q` is ordered there: 0 is the ABI's row-major order; a
 * backend may keep its own (the GPU backend's int4 rows for its mma kernels, or
 * tile by tile with the scales too, gpu_formats.cuh). */
typedef struct coli_weight {
    int32_t format;
    int64_t rows, cols;
    int32_t group;
    int32_t layout;
    int32_t holds; /* steps that use it: it is not freed while any does */
    void *q;
    float *scale;
    uint64_t bytes;
} coli_weight;

/* Handles: tag (16 bits) | generation (16) | slot (32). A freed slot bumps its
 * generation, so a stale handle fails the check instead of reaching freed memory.
 * A backend keeps one table for each kind of handle (tensors, buffers, steps),
 * each with its own tag, so a handle of one kind is never taken for another. */
typedef struct coli_slot {
    uint16_t gen;
    int live;
    void *p;
} coli_slot;

typedef struct coli_table {
    uint16_t tag;
    const char *what; /* "tensor", "buffer", "step": for the messages */
    coli_slot *slots;
    uint32_t count, cap;
    int32_t live;
    /* every slot below it is live: an add takes the lowest free slot without walking
     * the live ones, which made a load of n tensors n^2 / 2 steps */
    uint32_t first_free;
} coli_table;

static coli_status coli_table_add(coli_table *t, void *p, uint64_t *out) {
    uint32_t i = t->first_free;
    while (i < t->count && t->slots[i].live) i++;
    if (i == t->count) {
        if (t->count == t->cap) {
            uint32_t cap = t->cap ? t->cap * 2 : 64;
            coli_slot *s = (coli_slot *)realloc(t->slots, cap * sizeof *s);
            if (!s) return coli_fail(COLI_E_OUT_OF_MEMORY, "cannot grow the %s table to %u slots", t->what, cap);
            t->slots = s;
            t->cap = cap;
        }
        t->slots[t->count].gen = 1;
        t->count++;
    }
    t->slots[i].live = 1;
    t->slots[i].p = p;
    t->live++;
    t->first_free = i + 1;
    *out = ((uint64_t)t->tag << 48) | ((uint64_t)t->slots[i].gen << 32) | i;
    return COLI_OK;
}

static coli_status coli_table_find(const coli_table *t, uint64_t h, void **out) {
    uint16_t tag = (uint16_t)(h >> 48), gen = (uint16_t)(h >> 32);
    uint32_t i = (uint32_t)h;
    if (h == 0) return coli_fail(COLI_E_BAD_TENSOR, "%s handle is 0 (never a valid %s)", t->what, t->what);
    if (tag != t->tag)
        return coli_fail(COLI_E_BAD_TENSOR, "%s handle 0x%016llx belongs to another backend or is not a %s", t->what,
                         (unsigned long long)h, t->what);
    if (i >= t->count || !t->slots[i].live || t->slots[i].gen != gen)
        return coli_fail(COLI_E_BAD_TENSOR, "%s handle 0x%016llx is unknown or already freed", t->what,
                         (unsigned long long)h);
    *out = t->slots[i].p;
    return COLI_OK;
}

static coli_status coli_table_get(const coli_table *t, coli_tensor h, coli_weight **out) {
    void *p = NULL;
    const coli_status st = coli_table_find(t, h, &p);
    if (!st) *out = (coli_weight *)p;
    return st;
}

static void coli_table_remove(coli_table *t, uint64_t h) {
    uint32_t i = (uint32_t)h;
    t->slots[i].live = 0;
    t->slots[i].p = NULL;
    t->slots[i].gen = (uint16_t)(t->slots[i].gen + 1 ? t->slots[i].gen + 1 : 1);
    t->live--;
    if (i < t->first_free) t->first_free = i;
}

static void coli_table_reset(coli_table *t) {
    free(t->slots);
    t->slots = NULL;
    t->count = t->cap = 0;
    t->live = 0;
    t->first_free = 0;
}

/* Shape and pointer checks shared by every backend; fills everything but q/scale. */
static coli_status coli_weight_check(int32_t format, const void *q, const float *scale, int64_t rows,
                                     int64_t cols, int32_t group, coli_tensor *out, coli_weight *w) {
    memset(w, 0, sizeof *w);
    if (!q || !out || (format != COLI_FMT_F32 && !scale))
        return coli_fail(COLI_E_INVALID, "upload: null pointer argument");
    if (rows <= 0 || cols <= 0 || rows > (1LL << 31) || cols > (1LL << 31))
        return coli_fail(COLI_E_SHAPE, "upload: shape %lld x %lld is not within 1..2^31",
                         (long long)rows, (long long)cols);
    if (rows * cols > (1LL << 48)) /* the byte counts below must not wrap */
        return coli_fail(COLI_E_SHAPE, "upload: shape %lld x %lld has more than 2^48 values",
                         (long long)rows, (long long)cols);
    if (format == COLI_FMT_Q4 && (group <= 0 || group % 2 || cols % group))
        return coli_fail(COLI_E_SHAPE, "upload_q4: group_size %d must be even and divide cols %lld",
                         (int)group, (long long)cols);
    w->format = format;
    w->rows = rows;
    w->cols = cols;
    w->group = format == COLI_FMT_Q4 ? group : 0;
    return COLI_OK;
}

/* Bytes of quantised data and of scales for a checked weight. */
static void coli_weight_sizes(const coli_weight *w, size_t *q_bytes, size_t *scale_bytes) {
    size_t n = (size_t)w->rows * (size_t)w->cols;
    switch (w->format) {
    case COLI_FMT_F32: *q_bytes = n * sizeof(float); *scale_bytes = 0; break;
    case COLI_FMT_Q8: *q_bytes = n; *scale_bytes = (size_t)w->rows * sizeof(float); break;
    default: *q_bytes = n / 2; *scale_bytes = (size_t)w->rows * (size_t)(w->cols / w->group) * sizeof(float);
    }
}

static coli_status coli_matmul_check(const coli_weight *w, const float *x, int64_t s, int64_t in_features,
                                     const float *y) {
    if (!x || !y) return coli_fail(COLI_E_INVALID, "matmul: null x or y");
    if (s <= 0) return coli_fail(COLI_E_SHAPE, "matmul: s = %lld, must be positive", (long long)s);
    if (in_features != w->cols)
        return coli_fail(COLI_E_SHAPE, "matmul: x has %lld features, the weight has %lld columns",
                         (long long)in_features, (long long)w->cols);
    return COLI_OK;
}

/* coli_matmul's arguments (`ready`: the backend is initialised): its weight
 * resolved into *out, then checked. */
static coli_status coli_matmul_args(int ready, const coli_table *t, coli_tensor weight, const float *x, int64_t s,
                                    int64_t in_features, const float *y, coli_weight **out) {
    if (!ready) return coli_fail(COLI_E_NOT_INIT, "matmul: backend not initialised");
    coli_status st = coli_table_get(t, weight, out);
    return st ? st : coli_matmul_check(*out, x, s, in_features, y);
}

/* coli_matmul_many's arguments, every one checked before any y is written: its
 * weights resolved into `out` (count of them). A failure names the weight. */
#define COLI_MANY_MAX 16 /* tensors a call, as abi.toml's doc says */
static coli_status coli_many_check(int ready, const coli_table *t, const coli_tensor *weights, int32_t count,
                                   const float *x, int64_t s, int64_t in_features, float *const *ys, coli_weight **out) {
    if (!ready) return coli_fail(COLI_E_NOT_INIT, "matmul_many: backend not initialised");
    if (!weights || !ys) return coli_fail(COLI_E_INVALID, "matmul_many: null weights or ys");
    if (count < 1 || count > COLI_MANY_MAX)
        return coli_fail(COLI_E_INVALID, "matmul_many: count %d, must be 1 to %d", (int)count, COLI_MANY_MAX);
    for (int32_t i = 0; i < count; i++) {
        const coli_status st = coli_matmul_args(1, t, weights[i], x, s, in_features, ys[i], &out[i]);
        if (st) {
            char why[sizeof coli_error_text];
            memcpy(why, coli_error_text, sizeof why);
            return coli_fail(st, "matmul_many: weight %d of %d: %s", (int)i, (int)count, why);
        }
    }
    return COLI_OK;
}

#endif
