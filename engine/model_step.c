/* The GPU tier's whole step (ABI 2): every weight, the caches and the
 * activations resident in the backend, and each forward one recorded step of
 * ops, in the order model_forward runs them on the CPU. A decoded token is then
 * one write (its id), one step run and one read (the argmax): two host copies. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

/* Tokens a prefill step takes at once: its activations and the attention's
 * selection mask ([tokens, max_pos] bytes) are sized for this many. */
#define STEP_CHUNK 256
/* Decode steps queued before the host reads their tokens: the device waits once a batch
 * for the host's read and next launch, and a progress line moves once a batch. */
#define GENERATE_BATCH 32

typedef struct layer_dev {
    coli_ref in_norm, post_norm, q_a_norm, kv_a_norm, idx_k_norm_w, idx_k_norm_b, router_bias;
    coli_ref bias_q_a, bias_kv_a, bias_o;
    coli_ref k_cache, v_cache, ik_cache;
    coli_tensor router, idx_weights;
    coli_tensor *experts; /* [expert][gate, up, down], the shared expert's after them where shared_pick */
    int shared_pick;      /* a decode takes the shared expert as one more pick of the moe op */
} layer_dev;

/* Where each activation lives in the arena, in bytes. */
typedef struct arena_map {
    uint64_t x, h, qa, qr, q, ckv, kvn, kv, att, o, iq, ik, iw, g, u, sh, rlog, ridx, rw, pidx, pw, sel, logits, ids, kept;
    uint64_t bytes;
} arena_map;

struct model_step {
    coli_backend_api *api;
    coli_buffer *buffers;
    int32_t n_buffers, cap_buffers;
    coli_tensor *tensors; /* uploaded here (experts, router, indexer heads) */
    int32_t n_tensors, cap_tensors;
    layer_dev *layers;
    coli_ref embed, final_norm, inv_freq;
    coli_buffer arena;
    arena_map a;
    int64_t chunk;
    coli_step decode, prefill;     /* recorded for 1 and for `chunk` tokens */
    int keeps;                     /* the decode step keeps its ids by position (keep_ids) */
    int64_t ops_per_token;         /* ops in the decode step */
    uint64_t added_bytes;          /* what the step added to the model's resident counts */
    int32_t added_tensors;
};

static coli_ref at(coli_buffer b, uint64_t offset) {
    coli_ref r = {b, offset};
    return r;
}

static coli_ref none(void) { return at(0, 0); }

static coli_ref act(const model_step *s, uint64_t offset, int64_t floats_in) {
    return at(s->arena, offset + (uint64_t)floats_in * sizeof(float));
}

static int fail(model *m, const char *what, char *err, size_t errlen) {
    snprintf(err, errlen, "backend %s: %s: %s", m->backend->name, what, m->backend->api.last_error());
    return 1;
}

/* Appends handle h to a growing list (buffers and tensors are both 64-bit handles). */
static int keep(uint64_t **list, int32_t *n, int32_t *cap, uint64_t h) {
    if (*n == *cap) {
        const int32_t grown = *cap ? 2 * *cap : 64;
        uint64_t *l = realloc(*list, (size_t)grown * sizeof *l);
        if (!l) return 1;
        *list = l;
        *cap = grown;
    }
    (*list)[(*n)++] = h;
    return 0;
}

/* A buffer of `bytes`, filled from `data` when given (else zeroed). */
static int buffer_of(model *m, const void *data, uint64_t bytes, coli_ref *out, char *err, size_t errlen) {
    model_step *s = m->step;
    coli_buffer b = 0;
    if (s->api->buffer_alloc(bytes, &b)) return fail(m, "buffer_alloc", err, errlen);
    if (keep(&s->buffers, &s->n_buffers, &s->cap_buffers, b)) {
        s->api->buffer_free(b);
        snprintf(err, errlen, "out of memory");
        return 1;
    }
    m->resident_bytes += bytes;
    s->added_bytes += bytes;
    if (data && s->api->buffer_write(b, 0, data, bytes)) return fail(m, "buffer_write", err, errlen);
    m->round_trips++;
    *out = at(b, 0);
    return 0;
}

static int floats_of(model *m, const float *v, int64_t n, coli_ref *out, char *err, size_t errlen) {
    if (!v) {
        *out = none();
        return 0;
    }
    return buffer_of(m, v, (uint64_t)n * sizeof(float), out, err, errlen);
}

static int upload(model *m, const linear *l, const float *f32, int64_t rows, int64_t cols, coli_tensor *out,
                  uint64_t *read, char *err, size_t errlen) {
    model_step *s = m->step;
    coli_status st;
    if (f32) st = s->api->tensor_upload_f32(f32, rows, cols, out);
    else if (l->format == COLI_FMT_F32) st = s->api->tensor_upload_f32(l->w, l->rows, l->cols, out);
    else if (l->format == COLI_FMT_Q8) st = s->api->tensor_upload_q8(l->q8, l->scale, l->rows, l->cols, out);
    else st = s->api->tensor_upload_q4(l->q4, l->scale, l->rows, l->cols, l->group, out);
    if (st) return fail(m, "tensor upload", err, errlen);
    if (keep(&s->tensors, &s->n_tensors, &s->cap_tensors, *out)) {
        snprintf(err, errlen, "out of memory");
        return 1;
    }
    uint64_t bytes = 0;
    if (!s->api->tensor_size(*out, &bytes)) m->resident_bytes += bytes, s->added_bytes += bytes;
    *read += bytes;
    m->resident++;
    s->added_tensors++;
    return 0;
}

/* ---- what the step needs, before anything is uploaded ---------------------- */

static void plan_arena(const model *m, int64_t n, arena_map *a) {
    const model_config *c = &m->c;
    const int64_t qk = c->qk_nope + c->qk_rope, NH = c->heads;
    const int64_t inter = c->intermediate > c->moe_intermediate * c->shared_experts
                              ? c->intermediate : c->moe_intermediate * c->shared_experts;
    uint64_t off = 0;
#define CARVE(field, bytes) (a->field = off, off += ((uint64_t)(bytes) + 255) / 256 * 256)
    CARVE(x, n * c->hidden * 4);
    CARVE(h, n * c->hidden * 4);
    CARVE(qa, n * c->q_lora * 4);
    CARVE(qr, n * c->q_lora * 4);
    CARVE(q, n * NH * qk * 4);
    CARVE(ckv, n * (c->kv_lora + c->qk_rope) * 4);
    CARVE(kvn, n * c->kv_lora * 4);
    CARVE(kv, n * NH * (c->qk_nope + c->v_head) * 4);
    CARVE(att, n * NH * c->v_head * 4);
    CARVE(o, n * c->hidden * 4);
    CARVE(iq, n * c->index_heads * c->index_head_dim * 4);
    CARVE(ik, n * c->index_head_dim * 4);
    CARVE(iw, n * c->index_heads * 4);
    CARVE(g, n * inter * 4);
    CARVE(u, n * inter * 4);
    CARVE(sh, n * c->hidden * 4);
    CARVE(rlog, n * c->experts * 4);
    CARVE(ridx, n * c->experts_per_tok * 4);
    CARVE(rw, n * c->experts_per_tok * 4);
    /* a decode's picks and weights where it takes the shared expert as one more pick:
     * the route's, then that one's (set once: nothing else writes here) */
    CARVE(pidx, (c->experts_per_tok + 1) * 4);
    CARVE(pw, (c->experts_per_tok + 1) * 4);
    CARVE(sel, n * m->max_pos);
    CARVE(logits, n * c->vocab * 4);
    CARVE(ids, n * 4);
    CARVE(kept, m->max_pos * 4);
#undef CARVE
    a->bytes = off;
}

/* Device bytes the step adds to the dense linears model_load made resident. */
static uint64_t step_bytes(const model *m, int64_t chunk) {
    const model_config *c = &m->c;
    const int64_t qk = c->qk_nope + c->qk_rope;
    arena_map a;
    plan_arena(m, chunk, &a);
    uint64_t total = a.bytes + (uint64_t)(c->vocab * c->hidden + 2 * c->hidden) * 4;
    for (int64_t l = 0; l < c->layers; l++) {
        const layer *ly = &m->layers[l];
        total += (uint64_t)(2 * c->hidden + c->q_lora + c->kv_lora) * 4;
        if (c->attention_bias) total += (uint64_t)(c->q_lora + c->kv_lora + c->qk_rope + c->hidden) * 4;
        total += (uint64_t)(m->max_pos * c->heads * (qk + c->v_head)) * 4;
        if (c->indexer_full[l])
            total += (uint64_t)(m->max_pos * c->index_head_dim + 2 * c->index_head_dim + c->index_heads * c->hidden) * 4;
        if (!c->mlp_sparse[l]) continue;
        total += (uint64_t)(c->experts * c->hidden + c->experts) * 4;
        for (int64_t k = 0; k < 3 * c->experts; k++) {
            const int64_t rows = k % 3 == 2 ? c->hidden : c->moe_intermediate, cols = c->hidden * c->moe_intermediate / rows;
            const linear *ex = ly->experts ? &ly->experts[k] : NULL;
            total += model_weight_bytes(rows, cols, ex ? ex->format : COLI_FMT_F32, ex ? ex->group : 0);
        }
    }
    return total;
}

/* ---- recording: model_forward's order, op for op ------------------------------ */

typedef struct recorder {
    model *m;
    coli_step step;
    int64_t ops;
    int failed;
    char *err;
    size_t errlen;
} recorder;

static void add(recorder *r, coli_op op) {
    if (r->failed) return;
    if (r->m->step->api->step_add(r->step, &op)) {
        r->failed = 1;
        fail(r->m, "step_add", r->err, r->errlen);
    }
    r->ops++;
}

static void mm(recorder *r, const linear *l, coli_ref bias, coli_ref x, coli_ref y, int64_t n) {
    add(r, coli_op_matmul(x, y, bias, n, &l->dev));
}

static int record(model *m, int64_t n, coli_step *out, int64_t *ops, char *err, size_t errlen) {
    model_step *s = m->step;
    const model_config *c = &m->c;
    const arena_map *a = &s->a;
    const int64_t H = c->hidden, qk = c->qk_nope + c->qk_rope, NH = c->heads, V = c->v_head;
    const int64_t kvw = c->kv_lora + c->qk_rope, ID = c->index_head_dim, IH = c->index_heads;
    const float eps = (float)c->rms_eps;
    recorder r = {m, 0, 0, 0, err, errlen};
    if (s->api->step_begin(&r.step)) return fail(m, "step_begin", err, errlen);
#define A(field) act(s, a->field, 0)
#define AT(field, floats) act(s, a->field, floats)
    add(&r, coli_op_embed(s->embed, A(ids), A(x), n, H, c->vocab));
    for (int64_t l = 0; l < c->layers; l++) {
        const layer *ly = &m->layers[l];
        const layer_dev *d = &s->layers[l];
        const int full = c->indexer_full[l];
        add(&r, coli_op_rmsnorm(A(x), d->in_norm, A(h), n, H, H, H, eps));
        /* The norm's readers in this order: the first continues the norm's stream, and
         * q_a first decoded fastest of the orders measured (bench/RESULTS.md) */
        mm(&r, &ly->q_a, d->bias_q_a, A(h), A(qa), n);
        mm(&r, &ly->kv_a, d->bias_kv_a, A(h), A(ckv), n);
        if (full) mm(&r, &ly->idx_k, none(), A(h), A(ik), n);
        add(&r, coli_op_rmsnorm(A(qa), d->q_a_norm, A(qr), n, c->q_lora, c->q_lora, c->q_lora, 1e-6f));
        /* idx_q before q_b: traced, the indexer's chain ended last of attention's inputs,
         * and this order decoded faster (bench/RESULTS.md) */
        if (full) mm(&r, &ly->idx_q, none(), A(qr), A(iq), n);
        mm(&r, &ly->q_b, none(), A(qr), A(q), n);
        add(&r, coli_op_rmsnorm(A(ckv), d->kv_a_norm, A(kvn), n, c->kv_lora, kvw, c->kv_lora, 1e-6f));
        add(&r, coli_op_rope(AT(ckv, c->kv_lora), s->inv_freq, n, 1, kvw, 0, c->qk_rope));
        add(&r, coli_op_rope(AT(q, c->qk_nope), s->inv_freq, n, NH, NH * qk, qk, c->qk_rope));
        mm(&r, &ly->kv_b, none(), A(kvn), A(kv), n);
        add(&r, coli_op_write_rows(A(kv), d->k_cache, n * NH, c->qk_nope, c->qk_nope + V, 1, qk, NH));
        add(&r, coli_op_write_rows(AT(ckv, c->kv_lora), at(d->k_cache.buffer, (uint64_t)c->qk_nope * 4), n * NH,
                                   c->qk_rope, kvw, NH, qk, NH));
        add(&r, coli_op_write_rows(AT(kv, c->qk_nope), d->v_cache, n * NH, V, c->qk_nope + V, 1, V, NH));
        if (full) {
            add(&r, coli_op_matmul(A(h), A(iw), none(), n, &d->idx_weights));
            add(&r, coli_op_layernorm(A(ik), d->idx_k_norm_w, d->idx_k_norm_b, n, ID, ID, 1e-6f));
            add(&r, coli_op_rope(A(ik), s->inv_freq, n, 1, ID, 0, c->qk_rope));
            add(&r, coli_op_write_rows(A(ik), d->ik_cache, n, ID, ID, 1, ID, 1));
            add(&r, coli_op_rope(A(iq), s->inv_freq, n, IH, IH * ID, ID, c->qk_rope));
            add(&r, coli_op_indexer(A(iq), A(iw), d->ik_cache, A(sel), n, IH, ID, c->index_topk, m->max_pos,
                                    1.0f / sqrtf((float)IH)));
        }
        add(&r, coli_op_attend(A(q), d->k_cache, d->v_cache, A(sel), A(att), n, NH, qk, V, m->max_pos,
                               1.0f / sqrtf((float)qk)));
        mm(&r, &ly->o, d->bias_o, A(att), A(o), n);
        add(&r, coli_op_add(A(x), A(o), n * H));
        add(&r, coli_op_rmsnorm(A(x), d->post_norm, A(h), n, H, H, H, eps));
        if (c->mlp_sparse[l]) {
            /* The router first and the route and experts last (model_forward runs the shared
             * expert, then those; each reads h alone and they write apart, so the sums are the
             * same): router, experts and the add after them are the layer's longest chain, and
             * a backend that spreads a step over streams chains an op to the one recorded
             * last before it that it depends on, so the chain starts at the norm and ends at
             * the add, the shared expert beside it. Where `fold` (a decode, shared_pick) the
             * shared expert is instead a pick of the moe op past the routed ones, of weight 1
             * (its pick and weight set once past the route's, in pidx and pw): added after
             * them, as the add would add it, with no join between streams before the add (a
             * backend that spreads a step over streams launches the add only when the shared
             * expert's branch has ended) and no kernels of its own beside the experts'
             * (bench/RESULTS.md, "The shared expert as a fifth pick"). */
            const int fold = n == 1 && d->shared_pick;
            const int64_t S = c->moe_intermediate * c->shared_experts, K = c->experts_per_tok;
            const coli_ref picks = fold ? A(pidx) : A(ridx), weights = fold ? A(pw) : A(rw);
            add(&r, coli_op_matmul(A(h), A(rlog), none(), n, &d->router));
            if (!fold) {
                mm(&r, &ly->sh_gate, none(), A(h), A(g), n);
                mm(&r, &ly->sh_up, none(), A(h), A(u), n);
                add(&r, coli_op_silu_mul(A(g), A(u), n * S));
                mm(&r, &ly->sh_down, none(), A(g), A(sh), n);
            }
            add(&r, coli_op_route(A(rlog), d->router_bias, picks, weights, n, c->experts, c->n_group, c->topk_group,
                                  K, c->norm_topk_prob, (float)c->routed_scaling));
            add(&r, coli_op_moe(A(h), picks, weights, A(o), n, K + fold, d->experts,
                                (int32_t)(3 * (c->experts + fold))));
            if (!fold) add(&r, coli_op_add(A(o), A(sh), n * H));
        } else {
            mm(&r, &ly->gate, none(), A(h), A(g), n);
            mm(&r, &ly->up, none(), A(h), A(u), n);
            add(&r, coli_op_silu_mul(A(g), A(u), n * c->intermediate));
            mm(&r, &ly->down, none(), A(g), A(o), n);
        }
        add(&r, coli_op_add(A(x), A(o), n * H));
    }
    add(&r, coli_op_rmsnorm(A(x), s->final_norm, A(h), n, H, H, H, eps));
    mm(&r, &m->lm_head, none(), A(h), A(logits), n);
    if (n == 1) { /* a decode: its token is the next one's id, and is kept where the host can read many at once */
        add(&r, coli_op_argmax(A(logits), A(ids), n, c->vocab));
        if (s->keeps) add(&r, coli_op_keep_ids(A(ids), A(kept), n));
    } /* a prefill gives back its logits, of which the host takes what it needs */
#undef A
#undef AT
    if (!r.failed && s->api->step_end(r.step)) r.failed = 1, fail(m, "step_end", err, errlen);
    if (r.failed) {
        s->api->step_free(r.step);
        return 1;
    }
    *out = r.step;
    *ops = r.ops;
    return 0;
}

/* ---- setting up ------------------------------------------------------------- */

static int every_linear_resident(const model *m) {
    const model_config *c = &m->c;
    if (!m->lm_head.dev) return 0;
    for (int64_t l = 0; l < c->layers; l++) {
        const layer *ly = &m->layers[l];
        const linear *need[] = {&ly->q_a, &ly->q_b, &ly->kv_a, &ly->kv_b, &ly->o};
        for (size_t k = 0; k < sizeof need / sizeof need[0]; k++)
            if (!need[k]->dev) return 0;
        if (c->indexer_full[l] && (!ly->idx_q.dev || !ly->idx_k.dev)) return 0;
        if (c->mlp_sparse[l] ? !ly->sh_gate.dev || !ly->sh_up.dev || !ly->sh_down.dev
                             : !ly->gate.dev || !ly->up.dev || !ly->down.dev)
            return 0;
    }
    return 1;
}

static int upload_layer(model *m, int64_t l, char *err, size_t errlen) {
    const model_config *c = &m->c;
    const layer *ly = &m->layers[l];
    layer_dev *d = &m->step->layers[l];
    const int64_t qk = c->qk_nope + c->qk_rope, ID = c->index_head_dim;
    if (floats_of(m, ly->in_norm, c->hidden, &d->in_norm, err, errlen) ||
        floats_of(m, ly->post_norm, c->hidden, &d->post_norm, err, errlen) ||
        floats_of(m, ly->q_a_norm, c->q_lora, &d->q_a_norm, err, errlen) ||
        floats_of(m, ly->kv_a_norm, c->kv_lora, &d->kv_a_norm, err, errlen) ||
        floats_of(m, ly->q_a.bias, ly->q_a.rows, &d->bias_q_a, err, errlen) ||
        floats_of(m, ly->kv_a.bias, ly->kv_a.rows, &d->bias_kv_a, err, errlen) ||
        floats_of(m, ly->o.bias, ly->o.rows, &d->bias_o, err, errlen) ||
        buffer_of(m, NULL, (uint64_t)(m->max_pos * c->heads * qk) * 4, &d->k_cache, err, errlen) ||
        buffer_of(m, NULL, (uint64_t)(m->max_pos * c->heads * c->v_head) * 4, &d->v_cache, err, errlen))
        return 1;
    if (c->indexer_full[l] &&
        (floats_of(m, ly->idx_k_norm_w, ID, &d->idx_k_norm_w, err, errlen) ||
         floats_of(m, ly->idx_k_norm_b, ID, &d->idx_k_norm_b, err, errlen) ||
         buffer_of(m, NULL, (uint64_t)(m->max_pos * ID) * 4, &d->ik_cache, err, errlen) ||
         upload(m, NULL, ly->idx_weights, c->index_heads, c->hidden, &d->idx_weights, &m->token_weight_bytes, err,
                errlen)))
        return 1;
    if (!c->mlp_sparse[l]) return 0;
    if (floats_of(m, ly->router_bias, c->experts, &d->router_bias, err, errlen) ||
        upload(m, NULL, ly->router, c->experts, c->hidden, &d->router, &m->token_weight_bytes, err, errlen))
        return 1;
    /* The shared expert as one more expert where it has a routed expert's shape and format,
     * at int4: at int8 the GPU's experts' kernels, their grids a fifth larger, no longer fit
     * one wave, and the decode was slower (f32's grids are int8's); bench/RESULTS.md. */
    const int format = ly->experts ? ly->experts[0].format : COLI_FMT_F32;
    d->shared_pick = c->shared_experts == 1 && format == COLI_FMT_Q4 && ly->sh_gate.format == format &&
                     ly->sh_up.format == format && ly->sh_down.format == format;
    d->experts = calloc((size_t)(3 * (c->experts + 1)), sizeof *d->experts);
    if (!d->experts) {
        snprintf(err, errlen, "out of memory");
        return 1;
    }
    uint64_t experts = 0;
    for (int64_t e = 0; e < c->experts; e++)
        for (int k = 0; k < 3; k++) {
            const int64_t rows = k == 2 ? c->hidden : c->moe_intermediate, cols = k == 2 ? c->moe_intermediate : c->hidden;
            const float *f32 = ly->experts ? NULL : (k == 0 ? ly->e_gate : k == 1 ? ly->e_up : ly->e_down)[e];
            const linear *ex = ly->experts ? &ly->experts[3 * e + k] : NULL;
            if (upload(m, ex, f32, rows, cols, &d->experts[3 * e + k], &experts, err, errlen)) return 1;
        }
    m->token_weight_bytes += experts / (uint64_t)c->experts * (uint64_t)c->experts_per_tok; /* a token's k experts */
    const int64_t E = c->experts; /* handles only: the dense linears are the model's to free */
    d->experts[3 * E] = ly->sh_gate.dev, d->experts[3 * E + 1] = ly->sh_up.dev, d->experts[3 * E + 2] = ly->sh_down.dev;
    return 0;
}

void model_step_free(model *m) {
    model_step *s = m->step;
    if (!s) return;
    if (s->decode) s->api->step_free(s->decode);
    if (s->prefill) s->api->step_free(s->prefill);
    for (int32_t i = 0; i < s->n_tensors; i++) s->api->tensor_free(s->tensors[i]);
    for (int32_t i = 0; i < s->n_buffers; i++) s->api->buffer_free(s->buffers[i]);
    m->resident_bytes -= s->added_bytes;
    m->resident -= s->added_tensors;
    for (int64_t l = 0; s->layers && l < m->c.layers; l++) free(s->layers[l].experts);
    free(s->layers);
    free(s->buffers);
    free(s->tensors);
    free(s);
    m->step = NULL;
}

int model_step_prepare(model *m, char *note, size_t notelen, char *err, size_t errlen) {
    const model_config *c = &m->c;
    coli_backend *b = m->backend;
    note[0] = '\0';
    if (!every_linear_resident(m)) {
        snprintf(note, notelen, "not every dense matmul is resident in %s: the step stays on the CPU, its matmuls in "
                 "the backend", b->name);
        return 0;
    }
    const int64_t chunk = m->max_pos < STEP_CHUNK ? m->max_pos : STEP_CHUNK;
    const uint64_t need = step_bytes(m, chunk);
    uint64_t free_b = 0, total_b = 0;
    if (b->api.memory_info(&free_b, &total_b) == COLI_OK && total_b && need > free_b) {
        snprintf(note, notelen, "the whole step needs %llu more bytes on the device, %llu are free: the step stays on "
                 "the CPU, its dense matmuls in %s", (unsigned long long)need, (unsigned long long)free_b, b->name);
        return 0;
    }
    /* what a decoded token reads: every dense linear (resident already), its embedding row, and what
     * upload_layer adds (the routers, indexer heads and the token's share of the experts) */
    m->token_weight_bytes = m->resident_bytes + (uint64_t)c->hidden * sizeof(float);
    m->kv_bytes_per_position = model_kv_bytes_per_position(m, 1);
    model_step *s = calloc(1, sizeof *s);
    if (!s || !(s->layers = calloc((size_t)c->layers, sizeof *s->layers))) {
        free(s);
        snprintf(err, errlen, "out of memory");
        return 1;
    }
    s->api = &b->api;
    s->chunk = chunk;
    s->keeps = (int)(b->api.abi_version() & 0xFFFF) >= COLI_OP_KEEP_IDS_SINCE_MINOR;
    m->step = s;
    if (floats_of(m, m->embed, c->vocab * c->hidden, &s->embed, err, errlen) ||
        floats_of(m, m->final_norm, c->hidden, &s->final_norm, err, errlen) ||
        floats_of(m, m->inv_freq, c->qk_rope / 2, &s->inv_freq, err, errlen))
        goto fail;
    for (int64_t l = 0; l < c->layers; l++)
        if (upload_layer(m, l, err, errlen)) goto fail;
    plan_arena(m, chunk, &s->a);
    coli_ref arena;
    if (buffer_of(m, NULL, s->a.bytes, &arena, err, errlen)) goto fail;
    s->arena = arena.buffer;
    { /* the shared expert's pick and weight past the route's, for every layer's decode */
        const int32_t shared = (int32_t)c->experts;
        const float one = 1.0f;
        const uint64_t K = (uint64_t)c->experts_per_tok;
        if (s->api->buffer_write(s->arena, s->a.pidx + K * 4, &shared, 4) ||
            s->api->buffer_write(s->arena, s->a.pw + K * 4, &one, 4)) {
            fail(m, "buffer_write", err, errlen);
            goto fail;
        }
    }
    if (record(m, 1, &s->decode, &s->ops_per_token, err, errlen)) goto fail;
    int64_t ops = 0;
    if (chunk > 1 && record(m, chunk, &s->prefill, &ops, err, errlen)) goto fail;
    /* The decode step run twice before any prompt, so that a backend's first runs (the GPU
     * backend launches its kernels on the first and captures them as a graph on the
     * second) fall into the load and not into a decode: what they write at position 0
     * the prompt overwrites before anything reads it. */
    int32_t warm;
    for (int k = 0; k < 2; k++)
        if (s->api->step_run(s->decode, 0)) goto failed_run;
    if (s->api->buffer_read(s->arena, s->a.ids, &warm, sizeof warm)) goto failed_run;
    for (int64_t l = 0; l < c->layers; l++) { /* the caches live in the backend now */
        layer *ly = &m->layers[l];
        free(ly->k_cache), free(ly->kr_cache), free(ly->v_cache), free(ly->ik_cache);
        ly->k_cache = ly->kr_cache = ly->v_cache = ly->ik_cache = NULL;
    }
    m->round_trips = 0;
    return 0;
failed_run:
    fail(m, "warming the decode step", err, errlen);
fail:
    model_step_free(m);
    return 1;
}

/* ---- running ---------------------------------------------------------------- */

static int run(model *m, coli_step step, const int32_t *ids, int64_t n, char *err, size_t errlen) {
    model_step *s = m->step;
    if (s->api->buffer_write(s->arena, s->a.ids, ids, (uint64_t)n * sizeof *ids))
        return fail(m, "buffer_write", err, errlen);
    m->round_trips++;
    if (s->api->step_run(step, m->n_pos)) return fail(m, "step_run", err, errlen);
    return 0;
}

/* last: only the last position's logits, into logits[0..vocab): the chunks before the
 * last give none back. */
int model_step_forward(model *m, const int32_t *ids, int64_t n, float *logits, int last, char *err, size_t errlen) {
    model_step *s = m->step;
    const int64_t V = m->c.vocab;
    for (int64_t done = 0; done < n;) {
        const int64_t k = n - done >= s->chunk ? s->chunk : n - done;
        coli_step step = k == 1 ? s->decode : k == s->chunk ? s->prefill : 0;
        int64_t ops;
        if (!step && record(m, k, &step, &ops, err, errlen)) return 1;
        int rc = run(m, step, ids + done, k, err, errlen);
        const uint64_t from = last ? s->a.logits + (uint64_t)((k - 1) * V) * sizeof(float) : s->a.logits;
        const uint64_t rows = last ? (done + k == n) : (uint64_t)k;
        if (!rc && rows && s->api->buffer_read(s->arena, from, last ? logits : logits + done * V, rows * (uint64_t)V * sizeof(float)))
            rc = fail(m, "buffer_read", err, errlen);
        m->round_trips += rows > 0;
        if (step != s->decode && step != s->prefill) s->api->step_free(step);
        if (rc) return 1;
        m->n_pos += k;
        done += k;
    }
    return 0;
}

int model_step_next(model *m, int32_t id, int32_t *next, char *err, size_t errlen) {
    model_step *s = m->step;
    if (run(m, s->decode, &id, 1, err, errlen)) return 1;
    m->round_trips++;
    if (s->api->buffer_read(s->arena, s->a.ids, next, sizeof *next)) return fail(m, "buffer_read", err, errlen);
    m->n_pos++;
    return 0;
}

int model_step_generate(model *m, int32_t id, int64_t count, int32_t *out, model_progress done, void *ctx, char *err,
                        size_t errlen) {
    model_step *s = m->step;
    /* Each decode feeds its token to the next on the device; the host queues a batch
     * of steps, then reads the batch's tokens in one copy, which waits for them. */
    if (s->api->buffer_write(s->arena, s->a.ids, &id, sizeof id)) return fail(m, "buffer_write", err, errlen);
    m->round_trips++;
    for (int64_t k = 0; k < count;) {
        const int64_t batch = count - k < GENERATE_BATCH ? count - k : GENERATE_BATCH, first = m->n_pos;
        for (int64_t j = 0; j < batch; j++)
            if (s->api->step_run(s->decode, first + j)) return fail(m, "step_run", err, errlen);
        m->n_pos += batch;
        m->round_trips++;
        const uint64_t from = s->a.kept + (uint64_t)first * sizeof *out;
        if (s->api->buffer_read(s->arena, from, out + k, (uint64_t)batch * sizeof *out))
            return fail(m, "buffer_read", err, errlen);
        k += batch;
        if (done) done(ctx, k);
    }
    return 0;
}

int64_t model_step_ops(const model *m) { return m->step ? m->step->ops_per_token : 0; }

int model_step_batches(const model *m) { return m->step && m->step->keeps; }
