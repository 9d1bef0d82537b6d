/* The forward pass, following transformers' GlmMoeDsaForCausalLM step by step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "cpu_model_ops.h"
#include "cpu_ops.h"
#include "model.h"
#include "model_latent.h"

/* ---- matmuls ------------------------------------------------------------ */

/* Below this many multiply-adds a matmul runs on the calling thread: handing
 * it to the pool costs more than it saves. */
#define PARALLEL_MIN_MACS (1 << 16)

/* Below this many values of x in all, a job's int4 digits are made on the calling
 * thread: handing them to the pool costs more than it saves. */
#define PARALLEL_MIN_DIGITS (1 << 14)

/* Matmuls as one pool job: a segment is one matrix against its tokens, and the job's
 * rows are the segments' rows end to end, so the threads split them however they fall
 * and the matmuls wait for the pool once, not once each (the linears that read one x;
 * a layer's routed experts, gate and up of every expert a token picked, then every
 * down). Each (row, token) is the same matmul row as alone. */
typedef struct mm_seg {
    const linear *l;  /* quantised, or NULL: f32 `w` */
    const float *w;
    int64_t rows, cols, s;
    const float *x;
    float *y;
    /* int4: x's digits made once for every call on the segment's rows (a thread takes
     * its rows in several) and shared with the segments after it that read the same x;
     * NULL: each call makes its own */
    coli_q4_x *xq;
    int owns_xq;
} mm_seg;

static void seg_rows(const mm_seg *sg, int64_t b, int64_t e) {
    const linear *l = sg->l;
    if (!l) coli_matmul_f32_rows(sg->w, sg->rows, sg->cols, sg->x, sg->s, sg->y, b, e);
    else if (l->format == COLI_FMT_F32) coli_matmul_f32_rows(l->w, l->rows, l->cols, sg->x, sg->s, sg->y, b, e);
    else if (l->format == COLI_FMT_Q8)
        coli_matmul_q8_rows(l->q8, l->scale, l->rows, l->cols, sg->x, sg->s, sg->y, b, e);
    else if (sg->xq) coli_matmul_q4_rows_x(l->q4, l->scale, l->rows, sg->xq, sg->y, b, e);
    else coli_matmul_q4_rows(l->q4, l->scale, l->rows, l->cols, l->group, sg->x, sg->s, sg->y, b, e);
}

typedef struct segs_job {
    mm_seg *segs;
    int count;
} segs_job;

static void segs_rows(void *ctx, int64_t b, int64_t e) {
    const segs_job *j = ctx;
    int64_t first = 0; /* the job's row where segment i starts */
    for (int i = 0; i < j->count && first < e; first += j->segs[i].rows, i++) {
        const mm_seg *sg = &j->segs[i];
        const int64_t lo = b > first ? b - first : 0, hi = e - first < sg->rows ? e - first : sg->rows;
        if (lo < hi) seg_rows(sg, lo, hi);
    }
}

/* The digits of segments [b, e) that own theirs. */
static void digits_items(void *ctx, int64_t b, int64_t e) {
    const segs_job *j = ctx;
    for (int64_t i = b; i < e; i++) {
        mm_seg *sg = &j->segs[i];
        if (sg->owns_xq) sg->xq = coli_q4_x_make(sg->x, sg->s, sg->cols, sg->l->group);
    }
}

/* The int4 segments' digits: a segment that reads the x of the one before it (the
 * linears that read one x; an expert's gate and up, and a decode's experts, which all
 * read the token's row of h) shares its digits, the others make their own. */
static void segs_digits(model *m, segs_job *j) {
    int64_t values = 0;
    for (int i = 0; i < j->count; i++) {
        mm_seg *sg = &j->segs[i], *before = i ? sg - 1 : NULL;
        sg->xq = NULL, sg->owns_xq = 0;
        if (!sg->l || sg->l->format != COLI_FMT_Q4) continue;
        const int shares = before && before->l && before->l->format == COLI_FMT_Q4 && before->x == sg->x &&
                           before->s == sg->s && before->cols == sg->cols && before->l->group == sg->l->group;
        if (!shares) sg->owns_xq = 1, values += sg->s * sg->cols;
    }
    if (values >= PARALLEL_MIN_DIGITS && j->count > 1) pool_run(m->pool, digits_items, j, j->count);
    else digits_items(j, 0, j->count);
    for (int i = 1; i < j->count; i++) {
        mm_seg *sg = &j->segs[i];
        if (!sg->owns_xq && sg->l && sg->l->format == COLI_FMT_Q4) sg->xq = sg[-1].xq;
    }
}

static void segs_run(model *m, mm_seg *segs, int count) {
    segs_job j = {segs, count};
    int64_t rows = 0, macs = 0;
    for (int i = 0; i < count; i++) rows += segs[i].rows, macs += segs[i].rows * segs[i].cols * segs[i].s;
    if (macs < PARALLEL_MIN_MACS) { /* one call a segment on this thread: each makes its own digits */
        segs_rows(&j, 0, rows);
        return;
    }
    segs_digits(m, &j);
    pool_run(m->pool, segs_rows, &j, rows);
    for (int i = 0; i < count; i++)
        if (segs[i].owns_xq) coli_q4_x_free(segs[i].xq);
}

static void matmul_f32(model *m, const float *w, int64_t rows, int64_t cols, const float *x, int64_t s, float *y) {
    mm_seg sg = {NULL, w, rows, cols, s, x, y, NULL, 0};
    segs_run(m, &sg, 1);
}

static void add_bias(const linear *l, int64_t s, float *y) {
    if (l->bias)
        for (int64_t t = 0; t < s; t++)
            for (int64_t r = 0; r < l->rows; r++) y[t * l->rows + r] += l->bias[r];
}

/* A backend call that began at `t0` and made `count` matmuls, the first of them
 * l's: counted, and on failure named in err. Non-zero on failure. */
static int backend_done(model *m, double t0, int count, const linear *l, coli_status st, char *err, size_t errlen) {
    m->backend_seconds += coli_now() - t0;
    m->backend_calls++, m->backend_matmuls += count;
    if (st == COLI_OK) return 0;
    snprintf(err, errlen, "backend %s: matmul %lldx%lld%s failed (status %d): %s", m->backend->name,
             (long long)l->rows, (long long)l->cols, count > 1 ? " and the others that read its x" : "", (int)st,
             m->backend->api.last_error());
    return 1;
}

const char *const FORWARD_PHASE_NAMES[PHASE_COUNT] = {"linears", "routed_experts", "attention", "indexer"};

static int linear_once(model *m, const linear *l, const float *x, int64_t s, float *y, char *err, size_t errlen) {
    if (l->dev) {
        const double t0 = coli_now();
        if (backend_done(m, t0, 1, l, m->backend->api.matmul(l->dev, x, s, l->cols, y), err, errlen)) return 1;
    } else {
        mm_seg sg = {l, NULL, l->rows, l->cols, s, x, y, NULL, 0};
        segs_run(m, &sg, 1);
    }
    add_bias(l, s, y);
    return 0;
}

static int linear_fwd(model *m, const linear *l, const float *x, int64_t s, float *y, char *err, size_t errlen) {
    const double t0 = coli_now();
    int rc = linear_once(m, l, x, s, y, err, errlen);
    m->phase_seconds[PHASE_LINEARS] += coli_now() - t0;
    return rc;
}

/* Linears that read the same x (at most MANY_MAX): on the CPU one pool job (segs_run);
 * in the backend one round trip (coli_matmul_many, ABI 1.1) where it has it and holds
 * all of them, else one call each. At S = 1 a call's round trip costs several times its
 * kernels' time, so the layer's 10 become 6. */
#define MANY_MAX 3
static int linears_fwd(model *m, const linear *const *ls, int count, const float *x, int64_t s, float *const *ys,
                       char *err, size_t errlen) {
    int local = count <= MANY_MAX;
    for (int i = 0; local && i < count; i++) local = !ls[i]->dev;
    if (local) {
        const double t0 = coli_now();
        mm_seg segs[MANY_MAX];
        for (int i = 0; i < count; i++) segs[i] = (mm_seg){ls[i], NULL, ls[i]->rows, ls[i]->cols, s, x, ys[i], NULL, 0};
        segs_run(m, segs, count);
        for (int i = 0; i < count; i++) add_bias(ls[i], s, ys[i]);
        m->phase_seconds[PHASE_LINEARS] += coli_now() - t0;
        return 0;
    }
    int together = count > 1 && count <= MANY_MAX && m->backend && m->backend->api.matmul_many;
    for (int i = 0; together && i < count; i++) together = ls[i]->dev && ls[i]->cols == ls[0]->cols;
    if (!together) {
        for (int i = 0; i < count; i++)
            if (linear_fwd(m, ls[i], x, s, ys[i], err, errlen)) return 1;
        return 0;
    }
    coli_tensor ts[MANY_MAX];
    for (int i = 0; i < count; i++) ts[i] = ls[i]->dev;
    const double t0 = coli_now();
    int rc = backend_done(m, t0, count, ls[0], m->backend->api.matmul_many(ts, count, x, s, ls[0]->cols, ys), err,
                          errlen);
    for (int i = 0; !rc && i < count; i++) add_bias(ls[i], s, ys[i]);
    m->phase_seconds[PHASE_LINEARS] += coli_now() - t0;
    return rc;
}

/* ---- attention ---------------------------------------------------------- */

/* A prefill's queries go to the threads through pool_balanced: a later query sees more
 * keys (in order, the first thread's half of a 4,000-token prefill held a third of
 * attention's). Each query's results are the same whichever thread runs it. */

typedef struct attn_job {
    const model *m;
    const layer *ly;
    const float *q;          /* [n, heads, qk] */
    const unsigned char *sel; /* [n, total]: key t is attended by query s */
    int64_t n, t0, total;
    float scaling;
    float *out;              /* [n, heads, v] */
    int failed;
} attn_job;

static void attn_items(void *ctx, int64_t b, int64_t e) {
    attn_job *j = ctx;
    const model_config *c = &j->m->c;
    const int64_t qk = c->qk_nope + c->qk_rope, H = c->heads, V = c->v_head;
    /* the range's heads query by query, each query's run of heads in one walk of its keys */
    const int64_t most = e - b < H ? e - b : H;
    float *p = malloc((size_t)(most * j->total) * sizeof(float));
    if (!p) {
        j->failed = 1;
        return;
    }
    for (int64_t it = b; it < e;) {
        const int64_t s = pool_balanced(it / H, j->n), h = it % H, run = (e - it < H - h ? e - it : H - h);
        coli_attend_heads(j->q + (s * H + h) * qk, j->ly->k_cache + h * c->qk_nope, j->ly->kr_cache,
                          j->ly->v_cache + h * V, H * c->qk_nope, c->qk_rope, H * V, run, c->qk_nope, qk, V,
                          j->sel + s * j->total, j->t0 + s, j->scaling, p, j->out + (s * H + h) * V);
        it += run;
    }
    free(p);
}

/* DSA: per query, the index_topk keys with the highest indexer score, or every
 * key it may see when there are no more than that. */
typedef struct idx_job {
    const model *m;
    const layer *ly;
    const float *iq;  /* [n, index_heads, index_dim] */
    const float *iw;  /* [n, index_heads], times weight_scale where used */
    float weight_scale;
    int64_t n, t0, total;
    unsigned char *sel;
    int failed;
    int keys_parallel; /* few queries: each query's keys are scored on all threads */
} idx_job;

/* Query s's score of keys [b, e). */
static void score_keys_of(const idx_job *j, int64_t s, coli_scored *sc, int64_t b, int64_t e) {
    const model_config *c = &j->m->c;
    const int64_t D = c->index_head_dim, IH = c->index_heads;
    coli_index_scores(j->iq + s * IH * D, j->iw + s * IH, j->weight_scale, j->ly->ik_cache, IH, D, b, e, sc);
}

typedef struct key_job {
    const idx_job *j;
    int64_t s;
    coli_scored *sc;
} key_job;

static void score_keys(void *ctx, int64_t b, int64_t e) {
    const key_job *k = ctx;
    score_keys_of(k->j, k->s, k->sc, b, e);
}

static void idx_items(void *ctx, int64_t b, int64_t e) {
    idx_job *j = ctx;
    const model_config *c = &j->m->c;
    coli_scored *sc = malloc((size_t)j->total * sizeof *sc);
    if (!sc) {
        j->failed = 1;
        return;
    }
    for (int64_t slot = b; slot < e; slot++) {
        const int64_t s = pool_balanced(slot, j->n), valid = j->t0 + s + 1;
        unsigned char *sel = j->sel + s * j->total;
        memset(sel, 0, (size_t)j->total);
        if (valid > c->index_topk) {
            key_job kj = {j, s, sc};
            if (j->keys_parallel) pool_run(j->m->pool, score_keys, &kj, valid);
            else score_keys_of(j, s, sc, 0, valid);
        }
        coli_index_select(sc, valid, c->index_topk, sel);
    }
    free(sc);
}

/* ---- the forward pass ---------------------------------------------------- */

#define TRY(call) do { if (call) goto fail; } while (0)

static int mlp(model *m, const linear *gate, const linear *up, const linear *down, const float *x, int64_t n,
               float *g, float *u, float *out, char *err, size_t errlen) {
    const linear *gu[] = {gate, up};
    float *const gu_out[] = {g, u};
    TRY(linears_fwd(m, gu, 2, x, n, gu_out, err, errlen));
    for (int64_t i = 0; i < n * gate->rows; i++) g[i] = coli_silu(g[i]) * u[i];
    TRY(linear_fwd(m, down, g, n, out, err, errlen));
    return 0;
fail:
    return 1;
}

/* A forward's routed-expert buffers, for n tokens: made once for all its layers, since
 * a prefill's are megabytes, and fresh ones a layer cost a page fault every 4 KiB. */
typedef struct moe_bufs {
    int32_t *idx;
    int64_t *members, *first;
    float *w, *logits, *xin, *eg, *eu, *eo, *wt;
    mm_seg *segs;
} moe_bufs;

static void moe_bufs_free(moe_bufs *b) {
    free(b->idx); free(b->members); free(b->first); free(b->w); free(b->logits); free(b->xin); free(b->eg);
    free(b->eu); free(b->eo); free(b->wt); free(b->segs);
}

/* Non-zero, with nothing held, where there is no memory for them. */
static int moe_bufs_alloc(const model_config *c, int64_t n, moe_bufs *b) {
    const int64_t H = c->hidden, I = c->moe_intermediate, E = c->experts, P = n * c->experts_per_tok;
    b->idx = malloc((size_t)P * sizeof *b->idx);
    b->members = malloc((size_t)P * sizeof *b->members), b->first = malloc((size_t)(E + 1) * sizeof *b->first);
    b->w = malloc((size_t)P * sizeof *b->w), b->logits = malloc((size_t)(n * E) * sizeof *b->logits);
    b->xin = malloc((size_t)(P * H) * sizeof *b->xin), b->eg = malloc((size_t)(P * I) * sizeof *b->eg);
    b->eu = malloc((size_t)(P * I) * sizeof *b->eu), b->eo = malloc((size_t)(P * H) * sizeof *b->eo);
    b->wt = malloc((size_t)P * sizeof *b->wt);
    b->segs = malloc((size_t)(2 * E) * sizeof *b->segs);
    if (b->idx && b->members && b->first && b->w && b->logits && b->xin && b->eg && b->eu && b->eo && b->wt && b->segs)
        return 0;
    moe_bufs_free(b);
    *b = (moe_bufs){0};
    return 1;
}

static int moe(model *m, const layer *ly, const float *h, int64_t n, moe_bufs *b, float *g, float *u, float *out,
               float *shared, char *err, size_t errlen) {
    const model_config *c = &m->c;
    const int64_t H = c->hidden, I = c->moe_intermediate, K = c->experts_per_tok, E = c->experts;
    int32_t *idx = b->idx;
    int64_t *members = b->members, *first = b->first;
    float *w = b->w, *logits = b->logits, *xin = b->xin, *eg = b->eg, *eu = b->eu, *eo = b->eo, *wt = b->wt;
    mm_seg *segs = b->segs;
    int rc = 1;
    TRY(mlp(m, &ly->sh_gate, &ly->sh_up, &ly->sh_down, h, n, g, u, shared, err, errlen));
    const double t0 = coli_now();
    matmul_f32(m, ly->router, E, H, h, n, logits);
    for (int64_t s = 0; s < n; s++)
        coli_route(logits + s * E, ly->router_bias, E, c->n_group, c->topk_group, K, c->norm_topk_prob,
                   (float)c->routed_scaling, idx + s * K, w + s * K);
    /* each expert's tokens, expert after expert, tokens in order (as transformers adds them) */
    int64_t cnt = 0;
    for (int64_t e = 0; e < E; e++) {
        first[e] = cnt;
        for (int64_t s = 0; s < n; s++)
            for (int64_t k = 0; k < K; k++)
                if (idx[s * K + k] == e) {
                    members[cnt] = s;
                    wt[cnt] = w[s * K + k];
                    cnt++;
                }
    }
    first[E] = cnt;
    int count = 0;
    for (int64_t e = 0; e < E; e++) { /* gate and up, quantised like the dense weights or f32 */
        const int64_t at = first[e], tokens = first[e + 1] - at;
        if (!tokens) continue;
        const linear *ex = ly->experts ? &ly->experts[3 * e] : NULL;
        /* an expert of one token reads that token's row of h, so the experts one token
         * picked share its int4 digits; one of several reads its tokens' rows gathered */
        for (int64_t r = at; tokens > 1 && r < at + tokens; r++)
            memcpy(xin + r * H, h + members[r] * H, (size_t)H * sizeof *xin);
        const float *ex_x = tokens == 1 ? h + members[at] * H : xin + at * H;
        segs[count++] = (mm_seg){ex, ex ? NULL : ly->e_gate[e], I, H, tokens, ex_x, eg + at * I, NULL, 0};
        segs[count++] = (mm_seg){ex ? ex + 1 : NULL, ex ? NULL : ly->e_up[e], I, H, tokens, ex_x, eu + at * I, NULL, 0};
    }
    segs_run(m, segs, count);
    for (int64_t i = 0; i < cnt * I; i++) eg[i] = coli_silu(eg[i]) * eu[i];
    count = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t at = first[e], tokens = first[e + 1] - at;
        if (!tokens) continue;
        const linear *ex = ly->experts ? &ly->experts[3 * e] : NULL;
        segs[count++] =
            (mm_seg){ex ? ex + 2 : NULL, ex ? NULL : ly->e_down[e], H, I, tokens, eg + at * I, eo + at * H, NULL, 0};
    }
    segs_run(m, segs, count);
    memset(out, 0, (size_t)(n * H) * sizeof *out);
    for (int64_t r = 0; r < cnt; r++) /* expert by expert, in the order gathered */
        for (int64_t d = 0; d < H; d++) out[members[r] * H + d] += eo[r * H + d] * wt[r];
    m->phase_seconds[PHASE_ROUTED_EXPERTS] += coli_now() - t0;
    for (int64_t i = 0; i < n * H; i++) out[i] += shared[i];
    rc = 0;
fail:
    return rc;
}

/* model_forward and model_forward_last: `last` keeps only the last position's logits. */
static int forward(model *m, const int32_t *ids, int64_t n, float *logits, int last, char *err, size_t errlen) {
    const model_config *c = &m->c;
    const int64_t H = c->hidden, qk = c->qk_nope + c->qk_rope, NH = c->heads, V = c->v_head;
    const int64_t t0 = m->n_pos, total = t0 + n, ID = c->index_head_dim, IH = c->index_heads;
    const int64_t inter = c->intermediate > c->moe_intermediate * c->shared_experts
                              ? c->intermediate : c->moe_intermediate * c->shared_experts;
    int rc = 1;
    if (n <= 0 || total > m->max_pos) {
        snprintf(err, errlen, "%lld positions do not fit the cache of %lld", (long long)total, (long long)m->max_pos);
        return 1;
    }
    for (int64_t s = 0; s < n; s++)
        if (ids[s] < 0 || ids[s] >= c->vocab) {
            snprintf(err, errlen, "token id %d at position %lld is outside the vocabulary (0..%lld)", ids[s],
                     (long long)(t0 + s), (long long)(c->vocab - 1));
            return 1;
        }
    if (m->step) return model_step_forward(m, ids, n, logits, last, err, errlen);
    float *x = malloc((size_t)(n * H) * sizeof(float)), *h = malloc((size_t)(n * H) * sizeof(float));
    float *qa = malloc((size_t)(n * c->q_lora) * sizeof(float)), *qr = malloc((size_t)(n * c->q_lora) * sizeof(float));
    float *q = malloc((size_t)(n * NH * qk) * sizeof(float));
    float *ckv = malloc((size_t)(n * (c->kv_lora + c->qk_rope)) * sizeof(float));
    float *kvn = malloc((size_t)(n * c->kv_lora) * sizeof(float));
    /* the expanded form's keys and values; the latent form's absorbed queries */
    float *kv = malloc((size_t)(n * NH * (m->latent ? c->kv_lora + c->qk_rope : c->qk_nope + V)) * sizeof(float));
    float *att = malloc((size_t)(n * NH * V) * sizeof(float)), *o = malloc((size_t)(n * H) * sizeof(float));
    float *iq = malloc((size_t)(n * IH * ID) * sizeof(float)), *ik = malloc((size_t)(n * ID) * sizeof(float));
    float *iw = malloc((size_t)(n * IH) * sizeof(float));
    float *g = malloc((size_t)(n * inter) * sizeof(float)), *u = malloc((size_t)(n * inter) * sizeof(float));
    float *sh = malloc((size_t)(n * H) * sizeof(float));
    unsigned char *sel = malloc((size_t)(n * total));
    moe_bufs mb = {0};
    int sparse = 0;
    for (int64_t l = 0; l < c->layers; l++) sparse |= c->mlp_sparse[l];
    if (!x || !h || !qa || !qr || !q || !ckv || !kvn || !kv || !att || !o || !iq || !ik || !iw || !g || !u || !sh ||
        !sel || (sparse && moe_bufs_alloc(c, n, &mb))) {
        snprintf(err, errlen, "out of memory for %lld tokens", (long long)n);
        goto done;
    }
    for (int64_t s = 0; s < n; s++) memcpy(x + s * H, m->embed + (int64_t)ids[s] * H, (size_t)H * sizeof(float));
    const float scaling = 1.0f / sqrtf((float)qk);
    for (int64_t l = 0; l < c->layers; l++) {
        layer *ly = &m->layers[l];
        for (int64_t s = 0; s < n; s++) coli_rmsnorm(x + s * H, ly->in_norm, H, (float)c->rms_eps, h + s * H);
        /* MLA: queries through the q LoRA, keys and values from the compressed latent.
         * The linears that read h, then those that read qr, go as one backend call each
         * (the indexer's wk and wq_b only in a layer that runs its indexer). */
        const int full = c->indexer_full[l];
        const linear *from_h[] = {&ly->q_a, &ly->kv_a, &ly->idx_k}, *from_qr[] = {&ly->q_b, &ly->idx_q};
        float *const h_out[] = {qa, ckv, ik}, *const qr_out[] = {q, iq};
        TRY(linears_fwd(m, from_h, full ? 3 : 2, h, n, h_out, err, errlen));
        for (int64_t s = 0; s < n; s++) coli_rmsnorm(qa + s * c->q_lora, ly->q_a_norm, c->q_lora, 1e-6f, qr + s * c->q_lora);
        TRY(linears_fwd(m, from_qr, full ? 2 : 1, qr, n, qr_out, err, errlen));
        const int64_t kvw = c->kv_lora + c->qk_rope;
        for (int64_t s = 0; s < n; s++) {
            coli_rmsnorm(ckv + s * kvw, ly->kv_a_norm, c->kv_lora, 1e-6f, kvn + s * c->kv_lora);
            coli_rope(ckv + s * kvw + c->kv_lora, c->qk_rope, m->inv_freq, t0 + s);
            for (int64_t hh = 0; hh < NH; hh++) coli_rope(q + (s * NH + hh) * qk + c->qk_nope, c->qk_rope, m->inv_freq, t0 + s);
        }
        if (m->latent) model_latent_write(m, ly, kvn, ckv, n, t0);
        else TRY(linear_fwd(m, &ly->kv_b, kvn, n, kv, err, errlen));
        for (int64_t s = 0; !m->latent && s < n; s++) {
            int64_t p = t0 + s;
            memcpy(ly->kr_cache + p * c->qk_rope, ckv + s * kvw + c->kv_lora, (size_t)c->qk_rope * sizeof(float));
            for (int64_t hh = 0; hh < NH; hh++) {
                const float *src = kv + (s * NH + hh) * (c->qk_nope + V);
                memcpy(ly->k_cache + (p * NH + hh) * c->qk_nope, src, (size_t)c->qk_nope * sizeof(float));
                memcpy(ly->v_cache + (p * NH + hh) * V, src + c->qk_nope, (size_t)V * sizeof(float));
            }
        }
        double t_phase = coli_now();
        if (full) {
            matmul_f32(m, ly->idx_weights, IH, H, h, n, iw);
            for (int64_t s = 0; s < n; s++) {
                coli_layernorm(ik + s * ID, ly->idx_k_norm_w, ly->idx_k_norm_b, ID, 1e-6f);
                coli_rope(ik + s * ID, c->qk_rope, m->inv_freq, t0 + s);
                memcpy(ly->ik_cache + (t0 + s) * ID, ik + s * ID, (size_t)ID * sizeof(float));
                for (int64_t hh = 0; hh < IH; hh++) coli_rope(iq + (s * IH + hh) * ID, c->qk_rope, m->inv_freq, t0 + s);
            }
            idx_job ij = {m, ly, iq, iw, 1.0f / sqrtf((float)IH), n, t0, total, sel, 0, 0};
            /* a decoded token is one query: its keys are what splits across threads */
            if (n * total * IH * ID < PARALLEL_MIN_MACS) idx_items(&ij, 0, n);
            else if (n < pool_threads(m->pool)) ij.keys_parallel = 1, idx_items(&ij, 0, n);
            else pool_run(m->pool, idx_items, &ij, n);
            if (ij.failed) {
                snprintf(err, errlen, "out of memory in the indexer");
                goto done;
            }
        } /* a "shared" layer keeps the selection of the last full layer */
        m->phase_seconds[PHASE_INDEXER] += coli_now() - t_phase;
        t_phase = coli_now();
        attn_job aj = {m, ly, q, sel, n, t0, total, scaling, att, 0};
        if (m->latent) TRY(model_latent_attention(m, ly, q, sel, n, t0, total, scaling, kv, att, err, errlen));
        else if (n * NH * total * (qk + V) < PARALLEL_MIN_MACS) attn_items(&aj, 0, n * NH);
        else pool_run(m->pool, attn_items, &aj, n * NH);
        if (aj.failed) {
            snprintf(err, errlen, "out of memory in attention");
            goto done;
        }
        m->phase_seconds[PHASE_ATTENTION] += coli_now() - t_phase;
        TRY(linear_fwd(m, &ly->o, att, n, o, err, errlen));
        for (int64_t i = 0; i < n * H; i++) x[i] += o[i];
        for (int64_t s = 0; s < n; s++) coli_rmsnorm(x + s * H, ly->post_norm, H, (float)c->rms_eps, h + s * H);
        if (c->mlp_sparse[l]) TRY(moe(m, ly, h, n, &mb, g, u, o, sh, err, errlen));
        else TRY(mlp(m, &ly->gate, &ly->up, &ly->down, h, n, g, u, o, err, errlen));
        for (int64_t i = 0; i < n * H; i++) x[i] += o[i];
        if (m->layer_done) m->layer_done(m->layer_ctx, l + 1, c->layers);
    }
    for (int64_t s = last ? n - 1 : 0; s < n; s++) coli_rmsnorm(x + s * H, m->final_norm, H, (float)c->rms_eps, h + s * H);
    TRY(linear_fwd(m, &m->lm_head, last ? h + (n - 1) * H : h, last ? 1 : n, logits, err, errlen));
    m->n_pos = total;
    rc = 0;
done:
fail:
    free(x); free(h); free(qa); free(qr); free(q); free(ckv); free(kvn); free(kv); free(att); free(o);
    free(iq); free(ik); free(iw); free(g); free(u); free(sh); free(sel);
    moe_bufs_free(&mb);
    return rc;
}

int model_forward(model *m, const int32_t *ids, int64_t n, float *logits, char *err, size_t errlen) {
    return forward(m, ids, n, logits, 0, err, errlen);
}

int model_forward_last(model *m, const int32_t *ids, int64_t n, float *logits, char *err, size_t errlen) {
    return forward(m, ids, n, logits, 1, err, errlen);
}

/* Whether `count` tokens after `id` fit: the id in the vocabulary, the positions in the cache. */
static int step_fits(const model *m, int32_t id, int64_t count, char *err, size_t errlen) {
    if (id < 0 || id >= m->c.vocab)
        snprintf(err, errlen, "token %d at position %lld is outside the vocabulary (0..%lld)", id, (long long)m->n_pos,
                 (long long)(m->c.vocab - 1));
    else if (count > m->max_pos - m->n_pos)
        snprintf(err, errlen, "%lld tokens from position %lld reach past the cache of %lld positions", (long long)count,
                 (long long)m->n_pos, (long long)m->max_pos);
    else
        return 1;
    return 0;
}

int model_next(model *m, int32_t id, int32_t *next, char *err, size_t errlen) {
    if (m->step) return step_fits(m, id, 1, err, errlen) ? model_step_next(m, id, next, err, errlen) : 1;
    float *logits = malloc((size_t)m->c.vocab * sizeof *logits);
    if (!logits) {
        snprintf(err, errlen, "out of memory for the logits");
        return 1;
    }
    int rc = model_forward(m, &id, 1, logits, err, errlen);
    if (!rc) *next = coli_argmax(logits, m->c.vocab);
    free(logits);
    return rc;
}

int model_generate(model *m, int32_t id, int64_t count, int32_t *out, model_progress done, void *ctx, char *err,
                   size_t errlen) {
    if (model_step_batches(m))
        return step_fits(m, id, count, err, errlen) ? model_step_generate(m, id, count, out, done, ctx, err, errlen) : 1;
    for (int64_t k = 0; k < count; k++) { /* a token a call: the CPU path, or a backend older than keep_ids */
        if (model_next(m, k ? out[k - 1] : id, &out[k], err, errlen)) return 1;
        if (done) done(ctx, k + 1);
    }
    return 0;
}
