/* ABI 2's buffers and steps as every backend shares them: the handle tables, the
 * checks of every op when it is added (handles, operand counts, every extent that
 * does not depend on the position) and when a step runs (the extents that do),
 * and the holds that keep a buffer or tensor alive while a step uses it.
 *
 * A backend includes this once, after defining its tables (g_tensors, g_buffers,
 * g_steps) and `g_ready`, and defines these hooks (declared here):
 *   mem_alloc(bytes, &p)  zeroed memory of the backend's kind
 *   mem_free(p)
 *   mem_write(dst, src, bytes), mem_read(dst, src, bytes)   the read waits for the runs before it
 *   rec_end(rec)               prepare an ended step to run (its scratch, its plan)
 *   rec_run(rec, position)     queue a checked step's ops
 *   rec_release(rec)           free what the backend keeps for a step (waiting for its runs) */
#ifndef COLI_BACKEND_STEPS_H
#define COLI_BACKEND_STEPS_H

#include "backend_step_types.h"

/* The backend's hooks (see the top of this file). */
static coli_status mem_alloc(uint64_t bytes, void **out);
static void mem_free(void *p);
static coli_status mem_write(void *dst, const void *src, uint64_t bytes);
static coli_status mem_read(void *dst, const void *src, uint64_t bytes);
static coli_status rec_end(coli_rec *r);
static coli_status rec_run(coli_rec *r, int64_t position);
static void rec_release(coli_rec *r);

/* What op `o` reaches in each operand, in elements: a[k] + b[k] * position; and
 * the largest position its own rules allow. Checks the integer operands. */
static coli_status coli_op_reach(const coli_op *o, coli_weight *const *w, int64_t *a, int64_t *b, int64_t *limit) {
    const int64_t *i = o->i;
    const coli_op_info *info = coli_op_info_of(o->kind);
    for (int k = 0; k < 8; k++) a[k] = b[k] = 0;
    *limit = COLI_NO_LIMIT;
    for (int k = 0; k < info->ints; k++)
        if (i[k] < 0 || i[k] > (1LL << 40))
            return coli_fail(COLI_E_SHAPE, "step_add: %s: %s = %lld is outside 0..2^40", info->name, info->int_names[k],
                             (long long)i[k]);
#define NEED(cond, ...) \
    if (!(cond)) return coli_fail(COLI_E_SHAPE, __VA_ARGS__)
    switch (o->kind) {
    case COLI_OP_EMBED:
        NEED(i[0] >= 1 && i[1] >= 1 && i[2] >= 1, "step_add: embed: rows, width and vocab must be at least 1");
        a[0] = i[2] * i[1], a[1] = i[0], a[2] = i[0] * i[1];
        break;
    case COLI_OP_RMSNORM:
        NEED(i[0] >= 1 && i[1] >= 1 && i[2] >= i[1] && i[3] >= i[1],
             "step_add: rmsnorm: rows and n at least 1, strides at least n");
        a[0] = (i[0] - 1) * i[2] + i[1], a[1] = i[1], a[2] = (i[0] - 1) * i[3] + i[1];
        break;
    case COLI_OP_LAYERNORM:
        NEED(i[0] >= 1 && i[1] >= 1 && i[2] >= i[1], "step_add: layernorm: rows and n at least 1, stride at least n");
        a[0] = (i[0] - 1) * i[2] + i[1], a[1] = a[2] = i[1];
        break;
    case COLI_OP_ROPE:
        NEED(i[0] >= 1 && i[1] >= 1 && i[4] >= 2 && i[4] <= 512 && i[4] % 2 == 0,
             "step_add: rope: rows and heads at least 1, dim even in 2..512 (dim = %lld)", (long long)i[4]);
        a[0] = (i[0] - 1) * i[2] + (i[1] - 1) * i[3] + i[4], a[1] = i[4] / 2;
        break;
    case COLI_OP_MATMUL:
        NEED(i[0] >= 1 && i[0] <= 65535, "step_add: matmul: s = %lld, must be 1..65535", (long long)i[0]);
        a[0] = i[0] * w[0]->cols, a[1] = i[0] * w[0]->rows, a[2] = w[0]->rows;
        break;
    case COLI_OP_WRITE_ROWS:
        NEED(i[0] >= 1 && i[1] >= 1 && i[3] >= 1, "step_add: write_rows: rows, width and src_repeat at least 1");
        a[0] = (i[0] - 1) / i[3] * i[2] + i[1];
        a[1] = (i[0] - 1) * i[4] + i[1], b[1] = i[5] * i[4];
        break;
    case COLI_OP_ADD:
    case COLI_OP_SILU_MUL:
        NEED(i[0] >= 1, "step_add: %s: count must be at least 1", info->name);
        a[0] = a[1] = i[0];
        break;
    case COLI_OP_INDEXER:
        NEED(i[0] >= 1 && i[1] >= 1 && i[2] >= 1 && i[3] >= 1 && i[4] >= i[0],
             "step_add: indexer: rows, heads, dim and topk at least 1, sel_stride at least rows");
        a[0] = i[0] * i[1] * i[2], a[1] = i[0] * i[1], a[2] = i[0] * i[2], b[2] = i[2], a[3] = i[0] * i[4];
        *limit = i[4] - i[0];
        break;
    case COLI_OP_ATTEND:
        NEED(i[0] >= 1 && i[1] >= 1 && i[2] >= 1 && i[3] >= 1 && i[4] >= i[0],
             "step_add: attend: rows, heads, qk and vdim at least 1, sel_stride at least rows");
        a[0] = i[0] * i[1] * i[2], a[1] = i[0] * i[1] * i[2], b[1] = i[1] * i[2];
        a[2] = i[0] * i[1] * i[3], b[2] = i[1] * i[3], a[3] = i[0] * i[4], a[4] = i[0] * i[1] * i[3];
        *limit = i[4] - i[0];
        break;
    case COLI_OP_ROUTE:
        NEED(i[0] >= 1 && i[1] >= 1 && i[1] <= 1024 && i[2] >= 1 && i[1] % i[2] == 0 && i[3] >= 1 && i[3] <= i[2] &&
                 i[4] >= 1 && i[4] <= i[3] * (i[1] / i[2]) && i[5] <= 1,
             "step_add: route: experts 1..1024 in groups that divide them, 1 <= topk_group <= groups, "
             "1 <= k <= the experts of topk_group groups, norm 0 or 1");
        a[0] = i[0] * i[1], a[1] = i[1], a[2] = a[3] = i[0] * i[4];
        break;
    case COLI_OP_MOE: {
        NEED(o->n_tensors >= 3 && o->n_tensors % 3 == 0, "step_add: moe: %d tensors, must be 3 per expert",
             (int)o->n_tensors);
        const int64_t inter = w[0]->rows, hid = w[0]->cols;
        for (int32_t e = 0; e < o->n_tensors; e += 3)
            NEED(w[e]->rows == inter && w[e]->cols == hid && w[e + 1]->rows == inter && w[e + 1]->cols == hid &&
                     w[e + 2]->rows == hid && w[e + 2]->cols == inter,
                 "step_add: moe: expert %d's shapes differ from expert 0's (gate and up %lld x %lld, down the reverse)",
                 (int)(e / 3), (long long)inter, (long long)hid);
        NEED(i[0] >= 1 && i[1] >= 1 && i[1] <= o->n_tensors / 3, "step_add: moe: rows at least 1, 1 <= k <= experts");
        a[0] = a[3] = i[0] * hid, a[1] = a[2] = i[0] * i[1];
        break;
    }
    case COLI_OP_KEEP_IDS:
        NEED(i[0] >= 1, "step_add: keep_ids: rows must be at least 1");
        a[0] = a[1] = i[0], b[1] = 1;
        break;
    default: /* COLI_OP_ARGMAX */
        NEED(i[0] >= 1 && i[1] >= 1, "step_add: argmax: rows and vocab must be at least 1");
        a[0] = i[0] * i[1], a[1] = i[0];
    }
#undef NEED
    return COLI_OK;
}

static void coli_rec_op_drop(coli_rec_op *r) {
    for (int k = 0; k < 8; k++)
        if (r->buf[k]) r->buf[k]->holds--;
    for (int32_t t = 0; r->w && t < r->op.n_tensors; t++)
        if (r->w[t]) r->w[t]->holds--;
    free(r->w);
    free(r->tensors);
}

/* Resolves and checks op into r, taking holds only once everything is checked. */
static coli_status coli_rec_op_make(const coli_op *op, coli_rec_op *r) {
    const coli_op_info *info = coli_op_info_of(op->kind);
    coli_status st;
    memset(r, 0, sizeof *r);
    if (!info) return coli_fail(COLI_E_INVALID, "step_add: unknown op kind %d", (int)op->kind);
    r->op = *op;
    const int32_t nt = info->tensors == 0 ? 0 : op->n_tensors;
    if (info->tensors == 0 && (op->n_tensors || op->tensors))
        return coli_fail(COLI_E_INVALID, "step_add: %s takes no tensors", info->name);
    if (info->tensors == 1 && op->n_tensors != 1)
        return coli_fail(COLI_E_INVALID, "step_add: %s takes one tensor, got %d", info->name, (int)op->n_tensors);
    if (nt && !op->tensors) return coli_fail(COLI_E_INVALID, "step_add: %s: null tensors", info->name);
    if (nt) {
        r->tensors = (coli_tensor *)malloc((size_t)nt * sizeof *r->tensors);
        r->w = (coli_weight **)calloc((size_t)nt, sizeof *r->w);
        if (!r->tensors || !r->w) {
            free(r->tensors);
            free(r->w);
            return coli_fail(COLI_E_OUT_OF_MEMORY, "step_add: out of host memory");
        }
        memcpy(r->tensors, op->tensors, (size_t)nt * sizeof *r->tensors);
        r->op.tensors = r->tensors;
        for (int32_t t = 0; t < nt; t++)
            if ((st = coli_table_get(&g_tensors, r->tensors[t], &r->w[t]))) {
                char why[sizeof coli_error_text];
                memcpy(why, coli_error_text, sizeof why);
                free(r->tensors);
                free(r->w);
                return coli_fail(st, "step_add: %s: tensor %d: %s", info->name, (int)t, why);
            }
    }
    int64_t a[8], b[8], limit;
    if ((st = coli_op_reach(op, r->w, a, b, &limit))) {
        free(r->tensors);
        free(r->w);
        return st;
    }
    r->max_pos = limit;
    for (int k = 0; k < info->refs; k++) {
        const coli_ref ref = op->ref[k];
        void *p = NULL;
        if (!ref.buffer && info->optional[k]) continue;
        st = coli_table_find(&g_buffers, ref.buffer, &p);
        if (!st && ref.offset % (uint64_t)info->elem[k])
            st = coli_fail(COLI_E_INVALID, "offset %llu is not a multiple of the element's %d bytes",
                           (unsigned long long)ref.offset, (int)info->elem[k]);
        coli_buf *buf = (coli_buf *)p;
        const uint64_t need = (uint64_t)a[k] * (uint64_t)info->elem[k];
        if (!st && (ref.offset > buf->bytes || need > buf->bytes - ref.offset))
            st = coli_fail(COLI_E_SHAPE, "needs %llu bytes from offset %llu, the buffer has %llu",
                           (unsigned long long)need, (unsigned long long)ref.offset, (unsigned long long)buf->bytes);
        if (st) {
            char why[sizeof coli_error_text];
            memcpy(why, coli_error_text, sizeof why);
            free(r->tensors);
            free(r->w);
            return coli_fail(st, "step_add: %s: operand %s: %s", info->name, info->ref_names[k], why);
        }
        if (b[k]) { /* the largest position whose reach still fits */
            const int64_t room = (int64_t)((buf->bytes - ref.offset) / (uint64_t)info->elem[k]) - a[k];
            if (room / b[k] < r->max_pos) r->max_pos = room / b[k];
        }
        r->buf[k] = buf;
        r->p[k] = (char *)buf->base + ref.offset;
    }
    for (int k = 0; k < info->refs; k++) /* max_pos is finite where b[k] is not 0: the loop above bounds it */
        if (r->buf[k]) r->reach[k] = (uint64_t)(a[k] + b[k] * r->max_pos) * (uint64_t)info->elem[k];
    for (int k = 0; k < 8; k++)
        if (r->buf[k]) r->buf[k]->holds++;
    for (int32_t t = 0; t < nt; t++) r->w[t]->holds++;
    return COLI_OK;
}

COLI_API coli_status coli_buffer_alloc(uint64_t bytes, coli_buffer *out) {
    coli_status st;
    if (!g_ready) return coli_fail(COLI_E_NOT_INIT, "buffer_alloc: backend not initialised");
    if (!out) return coli_fail(COLI_E_INVALID, "buffer_alloc: null out");
    if (bytes < 1 || bytes > (1ULL << 48))
        return coli_fail(COLI_E_SHAPE, "buffer_alloc: %llu bytes, must be 1..2^48", (unsigned long long)bytes);
    coli_buf *b = (coli_buf *)calloc(1, sizeof *b);
    if (!b) return coli_fail(COLI_E_OUT_OF_MEMORY, "buffer_alloc: out of host memory");
    if ((st = mem_alloc(bytes, &b->base))) {
        free(b);
        return st;
    }
    b->bytes = bytes;
    if ((st = coli_table_add(&g_buffers, b, out))) {
        mem_free(b->base);
        free(b);
    }
    return st;
}

COLI_API coli_status coli_buffer_free(coli_buffer buffer) {
    void *p = NULL;
    coli_status st = coli_table_find(&g_buffers, buffer, &p);
    if (st) return st;
    coli_buf *b = (coli_buf *)p;
    if (b->holds)
        return coli_fail(COLI_E_INVALID, "buffer_free: buffer 0x%016llx is used by %d live step(s)",
                         (unsigned long long)buffer, (int)b->holds);
    mem_free(b->base);
    free(b);
    coli_table_remove(&g_buffers, buffer);
    return COLI_OK;
}

/* The buffer of a host copy, with [offset, offset + bytes) inside it. */
static coli_status coli_copy_target(const char *what, coli_buffer buffer, uint64_t offset, const void *data,
                                    uint64_t bytes, coli_buf **out) {
    void *p = NULL;
    if (!g_ready) return coli_fail(COLI_E_NOT_INIT, "%s: backend not initialised", what);
    if (!data && bytes) return coli_fail(COLI_E_INVALID, "%s: null data", what);
    coli_status st = coli_table_find(&g_buffers, buffer, &p);
    if (st) return st;
    *out = (coli_buf *)p;
    if (offset > (*out)->bytes || bytes > (*out)->bytes - offset)
        return coli_fail(COLI_E_SHAPE, "%s: bytes [%llu, %llu) are outside the buffer's %llu", what,
                         (unsigned long long)offset, (unsigned long long)(offset + bytes),
                         (unsigned long long)(*out)->bytes);
    return COLI_OK;
}

COLI_API coli_status coli_buffer_write(coli_buffer buffer, uint64_t offset, const void *data, uint64_t bytes) {
    coli_buf *b = NULL;
    coli_status st = coli_copy_target("buffer_write", buffer, offset, data, bytes, &b);
    return st ? st : bytes ? mem_write((char *)b->base + offset, data, bytes) : COLI_OK;
}

COLI_API coli_status coli_buffer_read(coli_buffer buffer, uint64_t offset, void *data, uint64_t bytes) {
    coli_buf *b = NULL;
    coli_status st = coli_copy_target("buffer_read", buffer, offset, data, bytes, &b);
    return st ? st : bytes ? mem_read(data, (char *)b->base + offset, bytes) : COLI_OK;
}

static coli_status coli_rec_find(const char *what, coli_step step, coli_rec **out) {
    void *p = NULL;
    if (!g_ready) return coli_fail(COLI_E_NOT_INIT, "%s: backend not initialised", what);
    coli_status st = coli_table_find(&g_steps, step, &p);
    if (!st) *out = (coli_rec *)p;
    return st;
}

COLI_API coli_status coli_step_begin(coli_step *out) {
    if (!g_ready) return coli_fail(COLI_E_NOT_INIT, "step_begin: backend not initialised");
    if (!out) return coli_fail(COLI_E_INVALID, "step_begin: null out");
    coli_rec *r = (coli_rec *)calloc(1, sizeof *r);
    if (!r) return coli_fail(COLI_E_OUT_OF_MEMORY, "step_begin: out of host memory");
    r->max_pos = COLI_NO_LIMIT;
    coli_status st = coli_table_add(&g_steps, r, out);
    if (st) free(r);
    return st;
}

COLI_API coli_status coli_step_add(coli_step step, const coli_op *op) {
    coli_rec *r = NULL;
    coli_status st = coli_rec_find("step_add", step, &r);
    if (st) return st;
    if (!op) return coli_fail(COLI_E_INVALID, "step_add: null op");
    if (r->ended) return coli_fail(COLI_E_INVALID, "step_add: the step has ended; ops go in before step_end");
    if (r->count == r->cap) {
        const int32_t cap = r->cap ? r->cap * 2 : 64;
        coli_rec_op *ops = (coli_rec_op *)realloc(r->ops, (size_t)cap * sizeof *ops);
        if (!ops) return coli_fail(COLI_E_OUT_OF_MEMORY, "step_add: out of host memory");
        r->ops = ops;
        r->cap = cap;
    }
    if ((st = coli_rec_op_make(op, &r->ops[r->count]))) return st;
    if (r->ops[r->count].max_pos < r->max_pos) r->max_pos = r->ops[r->count].max_pos;
    r->count++;
    return COLI_OK;
}

COLI_API coli_status coli_step_end(coli_step step) {
    coli_rec *r = NULL;
    coli_status st = coli_rec_find("step_end", step, &r);
    if (st) return st;
    if (r->ended) return coli_fail(COLI_E_INVALID, "step_end: the step has already ended");
    if (!r->count) return coli_fail(COLI_E_INVALID, "step_end: the step has no ops");
    if ((st = rec_end(r))) return st;
    r->ended = 1;
    return COLI_OK;
}

COLI_API coli_status coli_step_run(coli_step step, int64_t position) {
    coli_rec *r = NULL;
    coli_status st = coli_rec_find("step_run", step, &r);
    if (st) return st;
    if (!r->ended) return coli_fail(COLI_E_INVALID, "step_run: the step is still being recorded (step_end first)");
    if (position < 0 || position > r->max_pos)
        return coli_fail(COLI_E_SHAPE, "step_run: position %lld; this step's buffers hold positions 0..%lld",
                         (long long)position, (long long)r->max_pos);
    return rec_run(r, position);
}

static void coli_rec_destroy(coli_rec *r) {
    rec_release(r);
    for (int32_t k = 0; k < r->count; k++) coli_rec_op_drop(&r->ops[k]);
    free(r->ops);
    free(r);
}

COLI_API coli_status coli_step_free(coli_step step) {
    coli_rec *r = NULL;
    coli_status st = coli_rec_find("step_free", step, &r);
    if (st) return st;
    coli_rec_destroy(r);
    coli_table_remove(&g_steps, step);
    return COLI_OK;
}

/* At shutdown: every step, then every buffer (a backend frees its tensors after). */
static void coli_steps_reset(void) {
    for (uint32_t i = 0; i < g_steps.count; i++)
        if (g_steps.slots[i].live) coli_rec_destroy((coli_rec *)g_steps.slots[i].p);
    coli_table_reset(&g_steps);
    for (uint32_t i = 0; i < g_buffers.count; i++)
        if (g_buffers.slots[i].live) {
            coli_buf *b = (coli_buf *)g_buffers.slots[i].p;
            mem_free(b->base);
            free(b);
        }
    coli_table_reset(&g_buffers);
}

#endif
