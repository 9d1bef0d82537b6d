#include "selftest_ops.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_model_ops.h"
#include "cpu_ops.h"

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
float selftest_rnd(void) { /* xorshift64*, uniform in [-1, 1) */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (float)((rng * 0x2545F4914F6CDD1DULL) >> 40) / (float)(1 << 23) - 1.0f;
}

static void fill(float *v, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) v[i] = selftest_rnd() * scale;
}

/* One check in progress: the buffers it made, freed at the end whatever happened. */
typedef struct ctx {
    coli_backend *b;
    op_check *c;
    coli_buffer bufs[8];
    coli_tensor tensors[24];
    int nbuf, ntensor;
} ctx;

static int failed(ctx *x, int status) {
    if (status && !x->c->status) {
        x->c->status = status;
        snprintf(x->c->message, sizeof x->c->message, "%s", x->b->api.last_error());
    }
    return x->c->status != 0;
}

/* A buffer holding `bytes` of data (zeros when data is NULL). */
static coli_ref put(ctx *x, const void *data, size_t bytes) {
    coli_ref r = {0, 0};
    if (x->c->status || x->nbuf == 8) return r;
    if (failed(x, x->b->api.buffer_alloc(bytes, &r.buffer))) return r;
    x->bufs[x->nbuf++] = r.buffer;
    if (data) failed(x, x->b->api.buffer_write(r.buffer, 0, data, bytes));
    return r;
}

static void get(ctx *x, coli_ref r, void *out, size_t bytes) {
    if (!x->c->status) failed(x, x->b->api.buffer_read(r.buffer, r.offset, out, bytes));
}

/* ops[0..n) as one step, run `times` times at `pos` (twice: the GPU's second run is its
 * graph). Where `fresh` is given, its first `bytes` are set to all ones (NaN, -1, 255)
 * before each run after the first, so that each run must write all of them again: a
 * replay that skips a write (a last block's count left unreset) would otherwise leave
 * the first run's right answer in place. */
static void run_ops_fresh(ctx *x, const coli_op *ops, int n, int64_t pos, int times, const coli_ref *fresh,
                          size_t bytes) {
    coli_step s = 0;
    unsigned char *ones = fresh ? malloc(bytes ? bytes : 1) : NULL;
    if (fresh && !ones) {
        x->c->status = -1;
        snprintf(x->c->message, sizeof x->c->message, "out of host memory");
        return;
    }
    if (ones) memset(ones, 0xFF, bytes);
    if (!x->c->status && !failed(x, x->b->api.step_begin(&s))) {
        for (int k = 0; k < n && !x->c->status; k++) failed(x, x->b->api.step_add(s, &ops[k]));
        if (!x->c->status && !failed(x, x->b->api.step_end(s)))
            for (int t = 0; t < times && !x->c->status; t++) {
                if (t > 0 && ones && failed(x, x->b->api.buffer_write(fresh->buffer, fresh->offset, ones, bytes))) break;
                failed(x, x->b->api.step_run(s, pos));
            }
        x->b->api.step_free(s);
    }
    free(ones);
}

static void run_ops(ctx *x, const coli_op *ops, int n, int64_t pos, int times) {
    run_ops_fresh(x, ops, n, pos, times, NULL, 0);
}

/* The op alone as a step. */
static void run_op(ctx *x, coli_op op, int64_t pos, int times) { run_ops(x, &op, 1, pos, times); }

static void finish(ctx *x) {
    for (int i = 0; i < x->nbuf; i++) x->b->api.buffer_free(x->bufs[i]);
    for (int i = 0; i < x->ntensor; i++) x->b->api.tensor_free(x->tensors[i]);
}

static double rel_err(const float *y, const float *ref, int64_t n) {
    double maxref = 0.0, maxdiff = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)y[i] - (double)ref[i]);
        if (!(d <= maxdiff)) maxdiff = d; /* NaN propagates */
        if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
    }
    return maxdiff / (maxref > 1e-12 ? maxref : 1e-12);
}

static int64_t differ_i32(const int32_t *a, const int32_t *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += a[i] != b[i];
    return d;
}

static int64_t differ_u8(const uint8_t *a, const uint8_t *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += a[i] != b[i];
    return d;
}

/* Scratch for a check's host arrays, freed with it. */
typedef struct arena {
    void *p[16];
    int n;
} arena;

static void *take(arena *a, size_t bytes) {
    void *p = a->n < 16 ? calloc(1, bytes ? bytes : 1) : NULL;
    if (p) a->p[a->n++] = p;
    return p;
}

static void drop(arena *a) {
    for (int i = 0; i < a->n; i++) free(a->p[i]);
}

/* The next check's slot, cleared; past OP_CHECKS_MAX the last slot again, failing with
 * a message, so that a check added without raising the bound fails the selftest
 * instead of writing past the caller's array. */
static op_check *next_check(op_check *checks, int *n, const char *name) {
    const int full = *n >= OP_CHECKS_MAX;
    op_check *c = &checks[full ? OP_CHECKS_MAX - 1 : (*n)++];
    memset(c, 0, sizeof *c);
    c->op = name;
    if (full) {
        c->status = -1;
        snprintf(c->message, sizeof c->message, "more op checks than OP_CHECKS_MAX (%d)", OP_CHECKS_MAX);
    }
    return c;
}

#define F(n) ((float *)take(&A, (size_t)(n) * sizeof(float)))
#define BEGIN(name, ...)                                                     \
    op_check *c = next_check(checks, &n, name);                              \
    snprintf(c->what, sizeof c->what, __VA_ARGS__);                          \
    ctx X = {b, c, {0}, {0}, 0, 0};                                          \
    arena A = {{0}, 0}
#define END()                                                                \
    finish(&X);                                                              \
    drop(&A)

/* Values of the long add in the checks of weights a step writes, the weights its last
 * ones. The GPU backend runs an add of this many as 4,096 blocks of 256 threads, each
 * thread taking every 2^20-th value, so its last block's last pass writes the last
 * values, while the kernels after it have started (launched early once every block has
 * started): a kernel that loaded the weights then would read them before the add. */
#define WRITTEN_SPAN ((int64_t)9 << 20)

static void check_norms(coli_backend *b, op_check *checks, int *pn) {
    int n = *pn;
    {
        BEGIN("rmsnorm", "3 rows of 130, strides 140 and 135");
        float *xv = F(3 * 140), *w = F(130), *ref = F(3 * 135), *got = F(3 * 135);
        fill(xv, 3 * 140, 2.0f), fill(w, 130, 1.0f);
        for (int r = 0; r < 3; r++) coli_rmsnorm(xv + r * 140, w, 130, 1e-6f, ref + r * 135);
        coli_ref xr = put(&X, xv, 3 * 140 * 4), wr = put(&X, w, 130 * 4), o = put(&X, NULL, 3 * 135 * 4);
        run_op(&X, coli_op_rmsnorm(xr, wr, o, 3, 130, 140, 135, 1e-6f), 0, 1);
        get(&X, o, got, 3 * 135 * 4);
        c->err = rel_err(got, ref, 3 * 135);
        END();
    }
    {
        BEGIN("add, rmsnorm", "x += y, then 3 rows of 96 of x normalised (a pair a backend may fuse)");
        float *xv = F(3 * 96), *y = F(3 * 96), *w = F(96), *ref = F(2 * 3 * 96), *got = F(2 * 3 * 96);
        fill(xv, 3 * 96, 1.0f), fill(y, 3 * 96, 1.0f), fill(w, 96, 1.0f);
        for (int i = 0; i < 3 * 96; i++) ref[i] = xv[i] + y[i];
        for (int r = 0; r < 3; r++) coli_rmsnorm(ref + r * 96, w, 96, 1e-5f, ref + 3 * 96 + r * 96);
        coli_ref xr = put(&X, xv, 3 * 96 * 4), yr = put(&X, y, 3 * 96 * 4), wr = put(&X, w, 96 * 4);
        coli_ref o = put(&X, NULL, 3 * 96 * 4);
        const coli_op ops[] = {coli_op_add(xr, yr, 3 * 96), coli_op_rmsnorm(xr, wr, o, 3, 96, 96, 96, 1e-5f)};
        run_ops(&X, ops, 2, 0, 2);
        get(&X, xr, got, 3 * 96 * 4);
        get(&X, o, got + 3 * 96, 3 * 96 * 4);
        /* two runs added y twice: the second sum is what the norm saw */
        for (int i = 0; i < 3 * 96; i++) ref[i] += y[i];
        for (int r = 0; r < 3; r++) coli_rmsnorm(ref + r * 96, w, 96, 1e-5f, ref + 3 * 96 + r * 96);
        c->err = rel_err(got, ref, 2 * 3 * 96);
        END();
    }
    {
        BEGIN("layernorm", "2 rows of 64, stride 70, in place");
        float *xv = F(140), *w = F(64), *bv = F(64), *ref = F(140), *got = F(140);
        fill(xv, 140, 3.0f), fill(w, 64, 1.0f), fill(bv, 64, 1.0f);
        memcpy(ref, xv, 140 * 4);
        for (int r = 0; r < 2; r++) coli_layernorm(ref + r * 70, w, bv, 64, 1e-6f);
        coli_ref xr = put(&X, xv, 140 * 4), wr = put(&X, w, 64 * 4), br = put(&X, bv, 64 * 4);
        run_op(&X, coli_op_layernorm(xr, wr, br, 2, 64, 70, 1e-6f), 0, 2);
        /* twice: the second normalises the first's output, as the CPU does below */
        for (int r = 0; r < 2; r++) coli_layernorm(ref + r * 70, w, bv, 64, 1e-6f);
        get(&X, xr, got, 140 * 4);
        c->err = rel_err(got, ref, 140);
        END();
    }
    {
        /* a backend may load what no op of a step writes before the op before it has ended
         * (the GPU's norm weights and rope frequencies): here one add of WRITTEN_SPAN values
         * writes them all first, as its last values */
        BEGIN("add, rmsnorm, layernorm, rope", "3 rows of 32, the weights the last values of a long add before them");
        const int64_t rows = 3, cols = 32, half = 8, all_n = WRITTEN_SPAN, at_n = all_n - 3 * cols - half;
        float *xv = F(rows * cols), *y = F(rows * cols), *ref = F(rows * cols), *xs = F(rows * cols);
        float *got = F(rows * cols), *all = F(all_n), *dall = F(all_n); /* the weights from at_n on, and what the add adds */
        if (!all || !dall) {
            c->status = -1;
            snprintf(c->message, sizeof c->message, "out of host memory");
        } else {
            float *w = all + at_n, *lw = w + cols, *lb = lw + cols, *inv = lb + cols;
            fill(xv, rows * cols, 1.0f), fill(y, rows * cols, 1.0f), fill(w, 3 * cols, 1.0f);
            fill(dall + at_n, 3 * cols, 0.5f), fill(inv, half, 0.5f), fill(dall + at_n + 3 * cols, half, 0.1f);
            const size_t rb = (size_t)(rows * cols) * 4;
            coli_ref xr = put(&X, xv, rb), yr = put(&X, y, rb), o = put(&X, NULL, rb);
            coli_ref ar = put(&X, all, (size_t)all_n * 4), dr = put(&X, dall, (size_t)all_n * 4);
            const uint64_t at = (uint64_t)at_n * 4;
            const coli_ref wr = {ar.buffer, at}, lwr = {ar.buffer, at + (uint64_t)cols * 4};
            const coli_ref lbr = {ar.buffer, at + (uint64_t)(2 * cols) * 4}, ir = {ar.buffer, at + (uint64_t)(3 * cols) * 4};
            const coli_op ops[] = {coli_op_add(ar, dr, all_n), coli_op_add(xr, yr, rows * cols),
                                   coli_op_rmsnorm(xr, wr, o, rows, cols, cols, cols, 1e-5f),
                                   coli_op_layernorm(o, lwr, lbr, rows, cols, cols, 1e-5f),
                                   coli_op_rope(o, ir, rows, 2, cols, 16, 16)};
            run_ops(&X, ops, (int)(sizeof ops / sizeof ops[0]), 7, 2);
            memcpy(xs, xv, rb);
            for (int t = 0; t < 2; t++) { /* the CPU's ops in turn, each run */
                for (int64_t i = at_n; i < all_n; i++) all[i] += dall[i];
                for (int64_t i = 0; i < rows * cols; i++) xs[i] += y[i];
                for (int64_t r = 0; r < rows; r++) {
                    coli_rmsnorm(xs + r * cols, w, cols, 1e-5f, ref + r * cols);
                    coli_layernorm(ref + r * cols, lw, lb, cols, 1e-5f);
                    for (int64_t h = 0; h < 2; h++) coli_rope(ref + r * cols + h * 16, 16, inv, 7 + r);
                }
            }
            get(&X, o, got, rb);
            c->err = rel_err(got, ref, rows * cols);
        }
        END();
    }
    *pn = n;
}

static void check_rows(coli_backend *b, op_check *checks, int *pn) {
    int n = *pn;
    {
        BEGIN("embed", "5 ids of a 50 x 24 table, two outside it");
        float *table = F(50 * 24), *ref = F(5 * 24), *got = F(5 * 24);
        const int32_t ids[5] = {3, 49, -1, 0, 50};
        fill(table, 50 * 24, 1.0f);
        for (int r = 0; r < 5; r++)
            if (ids[r] >= 0 && ids[r] < 50) memcpy(ref + r * 24, table + ids[r] * 24, 24 * 4);
        coli_ref t = put(&X, table, 50 * 24 * 4), i = put(&X, ids, sizeof ids), o = put(&X, NULL, 5 * 24 * 4);
        run_op(&X, coli_op_embed(t, i, o, 5, 24, 50), 0, 1);
        get(&X, o, got, 5 * 24 * 4);
        c->err = rel_err(got, ref, 5 * 24);
        END();
    }
    for (int at = 0; at < 2; at++) {
        const int64_t pos = at ? 1000 : 5, rows = 3, heads = 4, hs = 20, rs = 4 * 20 + 3, dim = 16;
        BEGIN("rope", "3 rows of 4 heads, dim 16 at offset 2, position %lld", (long long)pos);
        float *xv = F(rows * rs), *inv = F(dim / 2), *ref = F(rows * rs), *got = F(rows * rs);
        fill(xv, rows * rs, 1.0f);
        for (int64_t i = 0; i < dim / 2; i++) inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)dim);
        memcpy(ref, xv, (size_t)(rows * rs) * 4);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t h = 0; h < heads; h++) coli_rope(ref + r * rs + h * hs + 2, dim, inv, pos + r);
        coli_ref xr = put(&X, xv, (size_t)(rows * rs) * 4), ir = put(&X, inv, (size_t)dim / 2 * 4);
        coli_ref x2 = {xr.buffer, 2 * 4};
        run_op(&X, coli_op_rope(x2, ir, rows, heads, rs, hs, dim), pos, 1);
        get(&X, xr, got, (size_t)(rows * rs) * 4);
        c->err = rel_err(got, ref, rows * rs);
        END();
    }
    {
        BEGIN("write_rows", "6 rows of 5 into a cache at position 4, each source row twice");
        const int64_t rows = 6, width = 5, ss = 7, rep = 2, ds = 9, pr = 3, pos = 4, cap = (pos * pr + rows) * ds;
        float *src = F(3 * ss), *ref = F(cap), *got = F(cap);
        fill(src, 3 * ss, 1.0f);
        for (int64_t r = 0; r < rows; r++) memcpy(ref + (pos * pr + r) * ds, src + r / rep * ss, (size_t)width * 4);
        coli_ref s = put(&X, src, 3 * ss * 4), d = put(&X, NULL, (size_t)cap * 4);
        run_op(&X, coli_op_write_rows(s, d, rows, width, ss, rep, ds, pr), pos, 1);
        get(&X, d, got, (size_t)cap * 4);
        c->err = rel_err(got, ref, cap);
        END();
    }
    {
        BEGIN("add, silu_mul", "1000 values");
        float *xv = F(1000), *y = F(1000), *ref = F(1000), *got = F(1000);
        fill(xv, 1000, 4.0f), fill(y, 1000, 4.0f);
        for (int i = 0; i < 1000; i++) ref[i] = coli_silu(xv[i] + y[i]) * y[i];
        coli_ref xr = put(&X, xv, 4000), yr = put(&X, y, 4000);
        const coli_op ops[] = {coli_op_add(xr, yr, 1000), coli_op_silu_mul(xr, yr, 1000)};
        run_ops(&X, ops, 2, 0, 1);
        get(&X, xr, got, 4000);
        c->err = rel_err(got, ref, 1000);
        END();
    }
    {
        /* rows longer than a GPU block's threads, so that a tie also falls to one thread
         * (1024 threads: 17, 1041 and 4113 are one thread's) */
        enum { V = 9000 };
        BEGIN("argmax", "4 rows of 9000: ties (also within a thread's stride), NaN, all -inf");
        float *lg = F(4 * V);
        int32_t ref[4], got[4] = {-5, -5, -5, -5};
        fill(lg, 4 * V, 1.0f);
        lg[V + 17] = lg[V + 1041] = lg[V + 4113] = lg[V + 900] = 5.0f; /* a tie: the first */
        lg[2 * V + 3] = NAN, lg[2 * V + 500] = 7.0f;                    /* NaN never wins */
        for (int i = 3 * V; i < 4 * V; i++) lg[i] = -INFINITY;
        for (int r = 0; r < 4; r++) ref[r] = coli_argmax(lg + r * V, V);
        coli_ref l = put(&X, lg, 4 * V * sizeof *lg), o = put(&X, NULL, sizeof got);
        run_op(&X, coli_op_argmax(l, o, 4, V), 0, 1);
        get(&X, o, got, sizeof got);
        c->exact = 1;
        c->err = (double)differ_i32(got, ref, 4);
        END();
    }
    if ((b->api.abi_version() & 0xFFFF) >= COLI_OP_KEEP_IDS_SINCE_MINOR) {
        BEGIN("keep_ids", "3 rows at positions 2, 6, 11, new ids each run (a graph from the 2nd)");
        enum { ROWS = 3, CAP = 16 };
        const int64_t at[] = {2, 6, 11};
        int32_t ref[CAP] = {0}, got[CAP];
        coli_ref ids = put(&X, NULL, ROWS * 4), kept = put(&X, NULL, CAP * 4);
        coli_step s = 0;
        const coli_op op = coli_op_keep_ids(ids, kept, ROWS);
        if (!c->status && !failed(&X, b->api.step_begin(&s)) && !failed(&X, b->api.step_add(s, &op)) &&
            !failed(&X, b->api.step_end(s)))
            for (int t = 0; t < 3 && !c->status; t++) {
                int32_t v[ROWS];
                for (int r = 0; r < ROWS; r++) v[r] = ref[at[t] + r] = 100 * (t + 1) + r;
                if (!failed(&X, b->api.buffer_write(ids.buffer, 0, v, sizeof v))) failed(&X, b->api.step_run(s, at[t]));
            }
        if (s) b->api.step_free(s);
        get(&X, kept, got, sizeof got);
        c->exact = 1;
        c->err = (double)differ_i32(got, ref, CAP);
        END();
    }
    *pn = n;
}

static void check_attention(coli_backend *b, op_check *checks, int *pn) {
    int n = *pn;
    /* past 4,096 keys a GPU's selection holds only some in registers; with few distinct
     * keys (at 3, 5) their scores tie at the cut, and the earliest of the equal are taken;
     * a GPU takes many queries side by side (at 4, 5), some of them (at 4) seeing no more
     * than the top 50 */
    for (int at = 0; at < 6; at++) {
        static const int64_t at_pos[] = {10, 100, 4500, 4500, 40, 4500}, at_rows[] = {3, 3, 3, 3, 40, 20};
        const int64_t pos = at_pos[at], rows = at_rows[at], heads = at == 1 || at == 4 ? 10 : 4, dim = 32, topk = 50;
        const int64_t keys = pos + rows, stride = pos + 68;
        BEGIN("indexer", "%lld queries of %lld heads, dim 32, top 50 of %lld keys%s", (long long)rows, (long long)heads,
              (long long)keys, at == 3 || at == 5 ? ", 10 distinct" : "");
        float *iq = F(rows * heads * dim), *iw = F(rows * heads), *kv = F(keys * dim);
        uint8_t *ref = take(&A, (size_t)(rows * stride)), *got = take(&A, (size_t)(rows * stride));
        coli_scored *sc = take(&A, (size_t)keys * sizeof *sc);
        if (!sc || !ref || !got) {
            c->status = -1;
            snprintf(c->message, sizeof c->message, "out of host memory");
        } else {
            fill(iq, rows * heads * dim, 1.0f), fill(iw, rows * heads, 1.0f), fill(kv, keys * dim, 1.0f);
            if (at == 3 || at == 5)
                for (int64_t t = 10; t < keys; t++) memcpy(kv + t * dim, kv + (t % 10) * dim, (size_t)dim * sizeof *kv);
            for (int64_t r = 0; r < rows; r++) {
                const int64_t valid = pos + r + 1;
                if (valid > topk) coli_index_scores(iq + r * heads * dim, iw + r * heads, 0.5f, kv, heads, dim, 0, valid, sc);
                coli_index_select(sc, valid, topk, ref + r * stride);
            }
            coli_ref q = put(&X, iq, (size_t)(rows * heads * dim) * 4), w = put(&X, iw, (size_t)(rows * heads) * 4);
            coli_ref k = put(&X, kv, (size_t)(keys * dim) * 4), s = put(&X, NULL, (size_t)(rows * stride));
            const coli_op op = coli_op_indexer(q, w, k, s, rows, heads, dim, topk, stride, 0.5f);
            run_ops_fresh(&X, &op, 1, pos, 2, &s, (size_t)(rows * stride));
            get(&X, s, got, (size_t)(rows * stride));
            c->exact = 1;
            c->err = 0;
            for (int64_t r = 0; r < rows; r++) c->err += (double)differ_u8(got + r * stride, ref + r * stride, keys);
        }
        END();
    }
    /* a GPU splits a query's keys finer where there are few (query, head) pairs (at 1, 3, 4), coarser where
     * the selection's stride leaves few spans (at 4); where they are many (at 2, 5) it takes queries side by
     * side, their keys in chunks, some queries' keys within one chunk and others' past it (at 5) */
    static const int64_t attend_cases[][3] = {{0, 2, 360},   {300, 2, 360}, {300, 50, 360},
                                              {100, 1, 360}, {100, 1, 101}, {230, 50, 360}};
    for (int at = 0; at < 6; at++) {
        const int64_t pos = attend_cases[at][0], rows = attend_cases[at][1], stride = attend_cases[at][2];
        const int64_t heads = 3, qk = 40, vd = 24;
        const int64_t keys = pos + rows;
        BEGIN("attend", "%lld queries of 3 heads (qk 40, v 24) over %lld keys, half selected", (long long)rows,
              (long long)keys);
        float *q = F(rows * heads * qk), *k = F(keys * heads * qk), *v = F(keys * heads * vd);
        float *ref = F(rows * heads * vd), *got = F(rows * heads * vd), *p = F(keys);
        uint8_t *sel = take(&A, (size_t)(rows * stride));
        if (!sel || !p) {
            c->status = -1;
            snprintf(c->message, sizeof c->message, "out of host memory");
        } else {
            fill(q, rows * heads * qk, 1.0f), fill(k, keys * heads * qk, 1.0f), fill(v, keys * heads * vd, 1.0f);
            for (int64_t r = 0; r < rows; r++)
                for (int64_t t = 0; t <= pos + r; t++) sel[r * stride + t] = t == pos + r || selftest_rnd() > 0.0f;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t h = 0; h < heads; h++)
                    coli_attend_one(q + (r * heads + h) * qk, k + h * qk, v + h * vd, heads * qk, heads * vd, qk, vd,
                                    sel + r * stride, pos + r, 0.15f, p, ref + (r * heads + h) * vd);
            coli_ref qr = put(&X, q, (size_t)(rows * heads * qk) * 4), kr = put(&X, k, (size_t)(keys * heads * qk) * 4);
            coli_ref vr = put(&X, v, (size_t)(keys * heads * vd) * 4), sr = put(&X, sel, (size_t)(rows * stride));
            coli_ref o = put(&X, NULL, (size_t)(rows * heads * vd) * 4);
            const coli_op op = coli_op_attend(qr, kr, vr, sr, o, rows, heads, qk, vd, stride, 0.15f);
            run_ops_fresh(&X, &op, 1, pos, 2, &o, (size_t)(rows * heads * vd) * 4);
            get(&X, o, got, (size_t)(rows * heads * vd) * 4);
            c->err = rel_err(got, ref, rows * heads * vd);
        }
        END();
    }
    *pn = n;
}

/* A route op's case: logits and bias in, the CPU's picks and weights (ri, rw) and the
 * backend's (gi, gw) out, rows * k each. */
typedef struct route_case {
    const float *lg, *bias;
    int64_t rows, experts, groups, topk_group, k;
    int32_t *ri;
    float *rw;
    int32_t *gi;
    float *gw;
} route_case;

/* The route op against coli_route, row by row: the picks exactly, the weights to 1e-5. */
static void route_against_cpu(ctx *x, route_case t) {
    const int64_t E = t.experts, K = t.k, n = t.rows * K;
    for (int64_t r = 0; r < t.rows; r++)
        coli_route(t.lg + r * E, t.bias, E, t.groups, t.topk_group, K, 1, 2.5f, t.ri + r * K, t.rw + r * K);
    coli_ref l = put(x, t.lg, (size_t)(t.rows * E) * 4), br = put(x, t.bias, (size_t)E * 4);
    coli_ref io = put(x, NULL, (size_t)n * 4), wo = put(x, NULL, (size_t)n * 4);
    run_op(x, coli_op_route(l, br, io, wo, t.rows, E, t.groups, t.topk_group, K, 1, 2.5f), 0, 1);
    get(x, io, t.gi, (size_t)n * 4);
    get(x, wo, t.gw, (size_t)n * 4);
    x->c->exact = 1;
    x->c->err = (double)differ_i32(t.gi, t.ri, n) + (rel_err(t.gw, t.rw, n) > 1e-5);
}

static void check_experts(coli_backend *b, op_check *checks, int *pn) {
    int n = *pn;
    {
        const int64_t rows = 5, E = 64, K = 6;
        BEGIN("route", "5 rows, 64 experts in 8 groups, top 4 groups, 6 experts");
        float *lg = F(rows * E), *bias = F(E), *rw = F(rows * K), *gw = F(rows * K);
        int32_t ri[5 * 6], gi[5 * 6];
        fill(lg, rows * E, 3.0f), fill(bias, E, 0.5f);
        route_against_cpu(&X, (route_case){lg, bias, rows, E, 8, 4, K, ri, rw, gi, gw});
        END();
    }
    {
        /* one group, as the GPU's held route takes it (ROUTE_HELD), 100 experts (a warp's
         * lanes not all holding the same number), and ties: a row's best logit and bias
         * copied to three later experts (32 and 64 on: the same lane of a warp; 45 on:
         * another), so the first of four equal choices must win, then the next */
        const int64_t rows = 5, E = 100, K = 8;
        BEGIN("route", "5 rows, 100 experts in one group, 8 picks, four-way ties for the first");
        float *lg = F(rows * E), *bias = F(E), *rw = F(rows * K), *gw = F(rows * K);
        int32_t ri[5 * 8], gi[5 * 8];
        fill(lg, rows * E, 3.0f), fill(bias, E, 0.5f);
        for (int64_t r = 0; r < rows; r++) {
            float *row = lg + r * E;
            const int64_t best = 10 + 2 * r; /* a row's own: the copies' biases are shared */
            row[best] += 8.0f, bias[best] = 1.0f; /* above every other choice */
            for (int64_t on = 32; on <= 64; on += on == 32 ? 13 : 19)
                row[best + on] = row[best], bias[best + on] = bias[best];
        }
        route_against_cpu(&X, (route_case){lg, bias, rows, E, 1, 1, K, ri, rw, gi, gw});
        END();
    }
    static const char *names[] = {"f32", "int8", "int4"};
    /* int4 in groups of 32 with rows of 256 (gate, up) and 128 (down), which the GPU keeps
     * in its mma layout, its down rows (16 words) a half team's each in a decode; 3 rows of 2
     * reach the GPU's experts grouped (experts 1 and 4 with
     * more than one row), 1 row not; `routed`: a route op before it gives the picks and weights, as in a
     * decode's step (the GPU routes inside the experts' first kernel then), and 2: the route over all
     * but the last expert and the moe one pick more, the last expert's of weight 1, already in the
     * buffers (a decode's shared expert, engine/model_step.c); rows of 264 (f32) and
     * 1032 (int8) take the GPU's up kernel on eight warps a row, its last piece short */
    static const struct { int fmt; int64_t inter, hid, rows; int32_t group; int routed; } variants[] = {
        {0, 24, 40, 3, 8, 0},     {1, 24, 40, 3, 8, 0},  {2, 24, 40, 3, 8, 0},      {2, 128, 256, 3, 32, 0},
        {1, 24, 40, 1, 8, 0},     {2, 128, 256, 1, 32, 0}, {1, 24, 40, 1, 8, 1}, {2, 128, 256, 1, 32, 1},
        {0, 16, 264, 1, 8, 1},    {1, 16, 1032, 1, 8, 0}, {0, 24, 40, 1, 8, 2},  {1, 16, 1032, 1, 8, 2},
        {2, 128, 256, 1, 32, 2}};
    for (int vi = 0; vi < (int)(sizeof variants / sizeof variants[0]); vi++) {
        const int fmt = variants[vi].fmt;
        const int32_t G = variants[vi].group;
        const int routed = variants[vi].routed;
        /* K the moe's picks, KR the route's (one fewer where the last expert is a fixed pick) */
        const int64_t E = 6, I = variants[vi].inter, H = variants[vi].hid, rows = variants[vi].rows;
        const int64_t K = routed == 2 ? 3 : 2, KR = routed == 2 ? 2 : K, ER = routed == 2 ? E - 1 : E;
        BEGIN("moe", "%s, 6 experts (%lld x %lld, groups of %d), %lld row(s) of %lld%s", names[fmt], (long long)I,
              (long long)H, (int)G, (long long)rows, (long long)K,
              routed == 2 ? ", routed over 5, a fixed sixth" : routed ? ", routed first, bias written" : "");
        float *xv = F(rows * H), *w = F(rows * K), *ref = F(rows * H), *got = F(rows * H);
        float *g = F(I), *u = F(I), *eo = F(H), *wf = F(3 * E * I * H), *sc = F(3 * E * (I * H / G + H));
        /* routed 1: the bias as uploaded, the last values of WRITTEN_SPAN, and what the step adds to them each run */
        const int64_t lead = routed == 1 ? WRITTEN_SPAN - ER : 0;
        float *bias_all = F(lead + ER), *dbias_all = F(lead + ER);
        int8_t *q8 = take(&A, (size_t)(3 * E * I * H));
        uint8_t *q4 = take(&A, (size_t)(3 * E * I * H / 2));
        int32_t idx[6] = {4, 1, 0, 1, 1, 4}, gi[6];
        float lg[6 * 3], bias[6];
        if (!q8 || !q4 || !sc || !bias_all || !dbias_all) {
            c->status = -1;
            snprintf(c->message, sizeof c->message, "out of host memory");
            END();
            continue;
        }
        float *bias0 = bias_all + lead, *dbias = dbias_all + lead;
        fill(xv, rows * H, 1.0f), fill(w, rows * K, 1.0f), fill(wf, 3 * E * I * H, 0.3f);
        if (routed) {
            fill(lg, rows * ER, 3.0f), fill(bias0, ER, 0.5f), fill(dbias, ER, 0.5f);
            for (int64_t e = 0; e < ER; e++) /* routed 1: the route reads it after the second run's add */
                bias[e] = routed == 1 ? (bias0[e] + dbias[e]) + dbias[e] : bias0[e];
            for (int64_t r = 0; r < rows; r++) {
                coli_route(lg + r * ER, bias, ER, 1, 1, KR, 1, 2.5f, idx + r * K, w + r * K);
                if (KR < K) idx[r * K + KR] = (int32_t)(E - 1), w[r * K + KR] = 1.0f;
            }
        }
        const float *we[18];
        int8_t *q8e[18];
        uint8_t *q4e[18];
        float *se[18];
        for (int64_t t = 0; t < 3 * E && !c->status; t++) { /* tensor t: expert t / 3, part t % 3 */
            const int64_t r = t % 3 == 2 ? H : I, cl = I * H / r;
            we[t] = wf + t * I * H, q8e[t] = q8 + t * I * H, q4e[t] = q4 + t * I * H / 2, se[t] = sc + t * (I * H / G + H);
            coli_status st;
            if (fmt == 0) st = b->api.tensor_upload_f32(we[t], r, cl, &X.tensors[X.ntensor]);
            else if (fmt == 1) {
                coli_quantize_q8(we[t], r, cl, q8e[t], se[t]);
                st = b->api.tensor_upload_q8(q8e[t], se[t], r, cl, &X.tensors[X.ntensor]);
            } else {
                coli_quantize_q4(we[t], r, cl, G, q4e[t], se[t]);
                st = b->api.tensor_upload_q4(q4e[t], se[t], r, cl, G, &X.tensors[X.ntensor]);
            }
            if (!failed(&X, st)) X.ntensor++;
        }
        for (int64_t r = 0; r < rows && !c->status; r++)
            for (int64_t e = 0; e < E; e++)
                for (int64_t j = 0; j < K; j++) {
                    if (idx[r * K + j] != e) continue;
                    for (int part = 0; part < 3; part++) {
                        const int64_t t = 3 * e + part, rr = part == 2 ? H : I, cl = I * H / rr;
                        const float *in = part == 2 ? g : xv + r * H;
                        float *out = part == 0 ? g : part == 1 ? u : eo;
                        if (fmt == 0) coli_matmul_f32(we[t], rr, cl, in, 1, out);
                        else if (fmt == 1) coli_matmul_q8(q8e[t], se[t], rr, cl, in, 1, out);
                        else coli_matmul_q4(q4e[t], se[t], rr, cl, G, in, 1, out);
                        if (part == 1)
                            for (int64_t i = 0; i < I; i++) g[i] = coli_silu(g[i]) * u[i];
                    }
                    for (int64_t d = 0; d < H; d++) ref[r * H + d] += eo[d] * w[r * K + j];
                }
        /* routed: the route writes the picks and weights (a fixed pick's are there before) */
        int32_t fixed_i[6] = {0};
        float fixed_w[6] = {0};
        if (KR < K) fixed_i[KR] = (int32_t)(E - 1), fixed_w[KR] = 1.0f;
        coli_ref xr = put(&X, xv, (size_t)(rows * H) * 4), ir = put(&X, routed ? fixed_i : idx, (size_t)(rows * K) * 4);
        coli_ref wr = put(&X, routed ? fixed_w : w, (size_t)(rows * K) * 4), o = put(&X, NULL, (size_t)(rows * H) * 4);
        const coli_op moe = coli_op_moe(xr, ir, wr, o, rows, K, X.tensors, (int32_t)(3 * E));
        if (routed) {
            /* routed 1: a long add ends at the bias, before the route reads it */
            coli_ref l = put(&X, lg, (size_t)(rows * ER) * 4);
            coli_ref ba = put(&X, bias_all, (size_t)(lead + ER) * 4), dr = put(&X, dbias_all, (size_t)(lead + ER) * 4);
            const coli_ref br = {ba.buffer, (uint64_t)lead * 4};
            const coli_op ops[3] = {coli_op_add(ba, dr, lead + ER),
                                    coli_op_route(l, br, ir, wr, rows, ER, 1, 1, KR, 1, 2.5f), moe};
            run_ops(&X, ops + (routed == 1 ? 0 : 1), routed == 1 ? 3 : 2, 0, 2);
        } else {
            run_op(&X, moe, 0, 2);
        }
        get(&X, o, got, (size_t)(rows * H) * 4);
        c->err = rel_err(got, ref, rows * H);
        if (routed) { /* the picks the experts' kernel wrote for the rest of the step */
            get(&X, ir, gi, (size_t)(rows * K) * 4);
            if (differ_i32(gi, idx, rows * K)) c->err = 1.0;
        }
        END();
    }
    {
        BEGIN("matmul", "int8 40 x 48 with a bias, 3 tokens");
        float *wv = F(40 * 48), *sc = F(40), *bias = F(40), *xv = F(3 * 48), *ref = F(3 * 40), *got = F(3 * 40);
        int8_t *q = take(&A, 40 * 48);
        fill(wv, 40 * 48, 1.0f), fill(bias, 40, 1.0f), fill(xv, 3 * 48, 1.0f);
        coli_quantize_q8(wv, 40, 48, q, sc);
        coli_matmul_q8(q, sc, 40, 48, xv, 3, ref);
        for (int t = 0; t < 3; t++)
            for (int r = 0; r < 40; r++) ref[t * 40 + r] += bias[r];
        if (!failed(&X, b->api.tensor_upload_q8(q, sc, 40, 48, &X.tensors[0]))) X.ntensor = 1;
        coli_ref xr = put(&X, xv, 3 * 48 * 4), br = put(&X, bias, 40 * 4), o = put(&X, NULL, 3 * 40 * 4);
        run_op(&X, coli_op_matmul(xr, o, br, 3, &X.tensors[0]), 0, 2);
        get(&X, o, got, 3 * 40 * 4);
        c->err = rel_err(got, ref, 3 * 40);
        END();
    }
    *pn = n;
}

int selftest_ops(coli_backend *b, op_check *checks) {
    int n = 0;
    check_norms(b, checks, &n);
    check_rows(b, checks, &n);
    check_attention(b, checks, &n);
    check_experts(b, checks, &n);
    return n;
}

int op_check_ok(const op_check *c, double tolerance) {
    return c->status == 0 && (c->exact ? c->err == 0.0 : c->err <= tolerance);
}

int selftest_step_bad_inputs(coli_backend *b, bad_case *cases) {
    int n = 0;
    coli_buffer small = 0, big = 0, freed = 0;
    coli_step s = 0, ended = 0;
    coli_tensor t = 0;
    float w[64] = {0}, out[4];
    b->api.buffer_alloc(64, &small);
    b->api.buffer_alloc(4096, &big);
    b->api.buffer_alloc(16, &freed);
    b->api.buffer_free(freed);
    b->api.tensor_upload_f32(w, 8, 8, &t);
#define BAD(label, want, call) SELFTEST_CASE(cases, n, b, label, want, call)
    /* a call the cases rely on: reported as a failed case (status 0 wanted) only if it fails */
#define MUST(call)                                                       \
    do {                                                                 \
        const int got_ = (call);                                         \
        if (got_ != COLI_OK) SELFTEST_CASE(cases, n, b, #call, COLI_OK, got_); \
    } while (0)
    const coli_ref sm = {small, 0}, bg = {big, 0}, gone = {freed, 0}, odd = {big, 2};
    BAD("buffer of 0 bytes", COLI_E_SHAPE, b->api.buffer_alloc(0, &freed));
    BAD("buffer write past its end", COLI_E_SHAPE, b->api.buffer_write(small, 60, w, 8));
    BAD("buffer read of a freed buffer", COLI_E_BAD_TENSOR, b->api.buffer_read(freed, 0, out, 4));
    BAD("buffer handle given as a tensor", COLI_E_BAD_TENSOR, b->api.tensor_free(small));
    MUST(b->api.step_begin(&s));
    const coli_op unknown = {99, 0, {{0, 0}}, {0}, {0}, NULL};
    BAD("op of an unknown kind", COLI_E_INVALID, b->api.step_add(s, &unknown));
    const coli_op too_far = coli_op_add(sm, bg, 100);
    BAD("op reaching past its buffer", COLI_E_SHAPE, b->api.step_add(s, &too_far));
    const coli_op on_freed = coli_op_add(gone, bg, 1);
    BAD("op on a freed buffer", COLI_E_BAD_TENSOR, b->api.step_add(s, &on_freed));
    const coli_op misaligned = coli_op_add(odd, bg, 1);
    BAD("op at a misaligned offset", COLI_E_INVALID, b->api.step_add(s, &misaligned));
    BAD("run before the step ends", COLI_E_INVALID, b->api.step_run(s, 0));
    /* a cache of 4096 bytes holds rows of 8 floats at positions 0..127 */
    const coli_op cache = coli_op_write_rows(sm, bg, 1, 8, 8, 1, 8, 1);
    const coli_op mm = coli_op_matmul(sm, bg, (coli_ref){0, 0}, 1, &t);
    MUST(b->api.step_add(s, &cache));
    MUST(b->api.step_end(s));
    BAD("run past the cache's last position", COLI_E_SHAPE, b->api.step_run(s, 128));
    MUST(b->api.step_run(s, 127));
    BAD("op added after the end", COLI_E_INVALID, b->api.step_add(s, &cache));
    BAD("buffer freed while a step uses it", COLI_E_INVALID, b->api.buffer_free(big));
    MUST(b->api.step_begin(&ended));
    MUST(b->api.step_add(ended, &mm));
    BAD("tensor freed while a step uses it", COLI_E_INVALID, b->api.tensor_free(t));
    MUST(b->api.step_free(ended));
    BAD("step freed twice", COLI_E_BAD_TENSOR, b->api.step_free(ended));
#undef BAD
#undef MUST
    b->api.step_free(s);
    b->api.tensor_free(t);
    b->api.buffer_free(small);
    b->api.buffer_free(big);
    return n;
}
