/* Reading config.json and the weights into a model. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"
#include "json.h"
#include "model.h"
#include "utf8.h"

#define Q4_GROUP 32

typedef struct loader_ctx {
    model *m;
    char *err;
    size_t errlen;
    const char *config_path;
} loader_ctx;

/* ---- config.json ------------------------------------------------------ */

static int cfg_int(loader_ctx *L, const json_value *cfg, const char *key, int required, int64_t dflt, int64_t min,
                   int64_t *out) {
    const json_value *v = json_get(cfg, key);
    if (!v || v->type == JSON_NULL) {
        if (required) {
            snprintf(L->err, L->errlen, "%s: key '%s' is missing", L->config_path, key);
            return 1;
        }
        *out = dflt;
        return 0;
    }
    if (v->type != JSON_NUMBER || !v->is_integer) {
        snprintf(L->err, L->errlen, "%s: key '%s' must be an integer, got %s", L->config_path, key,
                 v->type == JSON_NUMBER ? "a fraction" : json_type_name(v->type));
        return 1;
    }
    if (v->integer < min || v->integer > ((int64_t)1 << 31)) {
        snprintf(L->err, L->errlen, "%s: key '%s' is %lld, must be in %lld..2^31", L->config_path, key,
                 (long long)v->integer, (long long)min);
        return 1;
    }
    *out = v->integer;
    return 0;
}

static int cfg_num(loader_ctx *L, const json_value *obj, const char *key, double dflt, double *out) {
    const json_value *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL) {
        *out = dflt;
        return 0;
    }
    if (v->type != JSON_NUMBER) {
        snprintf(L->err, L->errlen, "%s: key '%s' must be a number, got %s", L->config_path, key,
                 json_type_name(v->type));
        return 1;
    }
    *out = v->number;
    return 0;
}

/* cfg_num of a value that must be finite and above 0 (a norm's epsilon, RoPE's base, a
 * scale): a negative epsilon or base gives NaN at every position, not an error. */
static int cfg_positive(loader_ctx *L, const json_value *obj, const char *key, double dflt, double *out) {
    if (cfg_num(L, obj, key, dflt, out)) return 1;
    if (!(*out > 0.0) || !isfinite(*out)) {
        snprintf(L->err, L->errlen, "%s: key '%s' is %g, must be a finite number above 0", L->config_path, key, *out);
        return 1;
    }
    return 0;
}

static int cfg_bool(loader_ctx *L, const json_value *cfg, const char *key, int dflt, int *out) {
    const json_value *v = json_get(cfg, key);
    if (!v || v->type == JSON_NULL) {
        *out = dflt;
        return 0;
    }
    if (v->type != JSON_BOOL) {
        snprintf(L->err, L->errlen, "%s: key '%s' must be true or false, got %s", L->config_path, key,
                 json_type_name(v->type));
        return 1;
    }
    *out = v->boolean;
    return 0;
}

/* The config key whose value the router cannot pick by, with why, or NULL. */
static const char *route_fault(const model_config *c, char *why, size_t n) {
    const long long E = (long long)c->experts, G = (long long)c->n_group, T = (long long)c->topk_group;
    const long long K = (long long)c->experts_per_tok;
    if (E > 1024) {
        snprintf(why, n, "is %lld, at most 1024", E);
        return "n_routed_experts";
    }
    if (E % G || E / G < 2) {
        snprintf(why, n, "%lld must split into n_group %lld groups of 2 or more", E, G);
        return "n_routed_experts";
    }
    if (T > G) {
        snprintf(why, n, "%lld is more than n_group %lld", T, G);
        return "topk_group";
    }
    if (K > T * (E / G)) {
        snprintf(why, n, "%lld is more than the %lld experts of topk_group %lld", K, T * (E / G), T);
        return "num_experts_per_tok";
    }
    return NULL;
}

/* A per-layer list of two words; absent: filled by `dflt(i)`. */
static int cfg_pattern(loader_ctx *L, const json_value *cfg, const char *key, const char *one, const char *zero,
                       int64_t layers, char *out, int64_t first_dense) {
    const json_value *v = json_get(cfg, key);
    if (!v || v->type == JSON_NULL) {
        for (int64_t i = 0; i < layers; i++) out[i] = first_dense >= 0 ? (char)(i >= first_dense) : 1;
        return 0;
    }
    if (v->type != JSON_ARRAY || (int64_t)v->count != layers) {
        snprintf(L->err, L->errlen, "%s: key '%s' must be a list of %lld strings", L->config_path, key,
                 (long long)layers);
        return 1;
    }
    for (int64_t i = 0; i < layers; i++) {
        const json_value *e = &v->items[i];
        if (e->type == JSON_STRING && strcmp(e->string, one) == 0) out[i] = 1;
        else if (e->type == JSON_STRING && strcmp(e->string, zero) == 0) out[i] = 0;
        else {
            snprintf(L->err, L->errlen, "%s: %s[%lld] must be \"%s\" or \"%s\"", L->config_path, key, (long long)i,
                     one, zero);
            return 1;
        }
    }
    return 0;
}

static int parse_config(loader_ctx *L, const json_value *cfg) {
    model_config *c = &L->m->c;
    const json_value *mt = json_get(cfg, "model_type");
    if (cfg->type != JSON_OBJECT) {
        snprintf(L->err, L->errlen, "%s: not a JSON object", L->config_path);
        return 1;
    }
    if (!mt || mt->type != JSON_STRING || strcmp(mt->string, "glm_moe_dsa") != 0) {
        snprintf(L->err, L->errlen, "%s: model_type %s%s%s is not supported (supported: glm_moe_dsa)", L->config_path,
                 mt && mt->type == JSON_STRING ? "'" : "", mt && mt->type == JSON_STRING ? mt->string : "missing",
                 mt && mt->type == JSON_STRING ? "'" : "");
        return 1;
    }
    const json_value *act = json_get(cfg, "hidden_act");
    if (act && !(act->type == JSON_STRING && strcmp(act->string, "silu") == 0)) {
        snprintf(L->err, L->errlen, "%s: hidden_act must be \"silu\"", L->config_path);
        return 1;
    }
    int64_t first_dense, kv_heads;
    if (cfg_int(L, cfg, "vocab_size", 1, 0, 1, &c->vocab) || cfg_int(L, cfg, "hidden_size", 1, 0, 1, &c->hidden) ||
        cfg_int(L, cfg, "intermediate_size", 1, 0, 1, &c->intermediate) ||
        cfg_int(L, cfg, "moe_intermediate_size", 1, 0, 1, &c->moe_intermediate) ||
        cfg_int(L, cfg, "num_hidden_layers", 1, 0, 1, &c->layers) ||
        cfg_int(L, cfg, "num_attention_heads", 1, 0, 1, &c->heads) ||
        cfg_int(L, cfg, "num_key_value_heads", 0, c->heads, 1, &kv_heads) ||
        cfg_int(L, cfg, "q_lora_rank", 1, 0, 1, &c->q_lora) || cfg_int(L, cfg, "kv_lora_rank", 1, 0, 1, &c->kv_lora) ||
        cfg_int(L, cfg, "qk_nope_head_dim", 1, 0, 1, &c->qk_nope) ||
        cfg_int(L, cfg, "qk_rope_head_dim", 1, 0, 2, &c->qk_rope) ||
        cfg_int(L, cfg, "v_head_dim", 1, 0, 1, &c->v_head) ||
        cfg_int(L, cfg, "n_routed_experts", 1, 0, 1, &c->experts) ||
        cfg_int(L, cfg, "num_experts_per_tok", 1, 0, 1, &c->experts_per_tok) ||
        cfg_int(L, cfg, "n_shared_experts", 0, 1, 0, &c->shared_experts) ||
        cfg_int(L, cfg, "n_group", 0, 1, 1, &c->n_group) || cfg_int(L, cfg, "topk_group", 0, 1, 1, &c->topk_group) ||
        cfg_int(L, cfg, "index_topk", 1, 0, 1, &c->index_topk) ||
        cfg_int(L, cfg, "index_head_dim", 1, 0, 1, &c->index_head_dim) ||
        cfg_int(L, cfg, "index_n_heads", 1, 0, 1, &c->index_heads) ||
        cfg_int(L, cfg, "first_k_dense_replace", 0, 3, 0, &first_dense) ||
        cfg_int(L, cfg, "max_position_embeddings", 0, 0, 0, &c->max_positions) ||
        cfg_bool(L, cfg, "norm_topk_prob", 1, &c->norm_topk_prob) ||
        cfg_bool(L, cfg, "tie_word_embeddings", 0, &c->tie_embeddings) ||
        cfg_bool(L, cfg, "attention_bias", 0, &c->attention_bias) ||
        cfg_positive(L, cfg, "rms_norm_eps", 1e-5, &c->rms_eps) ||
        cfg_positive(L, cfg, "routed_scaling_factor", 2.5, &c->routed_scaling))
        return 1;
    if (kv_heads != c->heads) {
        snprintf(L->err, L->errlen, "%s: num_key_value_heads %lld must equal num_attention_heads %lld (MLA)",
                 L->config_path, (long long)kv_heads, (long long)c->heads);
        return 1;
    }
    if (c->qk_rope % 2 || c->index_head_dim < c->qk_rope || c->qk_rope > 512) {
        snprintf(L->err, L->errlen, "%s: qk_rope_head_dim must be even, at most 512 and at most index_head_dim",
                 L->config_path);
        return 1;
    }
    char why[160];
    const char *bad = route_fault(c, why, sizeof why);
    if (bad) {
        snprintf(L->err, L->errlen, "%s: %s %s", L->config_path, bad, why);
        return 1;
    }
    /* RoPE as transformers reads it: the older rope_scaling first where it is set (null
     * or an empty object is not: Python's `rope_scaling or rope_parameters`; its type then
     * named "type" or "rope_type"), else rope_parameters; rope_theta from there, else the
     * top level's. A scaling this engine does not compute (yarn, linear, ...) is refused,
     * not run with the default frequencies. */
    const char *rope_key = "rope_scaling";
    const json_value *rope = json_get(cfg, rope_key);
    if (!rope || rope->type == JSON_NULL || (rope->type == JSON_OBJECT && rope->count == 0))
        rope_key = "rope_parameters", rope = json_get(cfg, rope_key);
    if (rope && rope->type != JSON_NULL && rope->type != JSON_OBJECT) {
        snprintf(L->err, L->errlen, "%s: %s must be an object", L->config_path, rope_key);
        return 1;
    }
    if (cfg_positive(L, cfg, "rope_theta", 10000.0, &c->rope_theta)) return 1;
    if (rope && rope->type == JSON_OBJECT) {
        const char *type_key = json_get(rope, "rope_type") ? "rope_type" : "type";
        const json_value *type = json_get(rope, type_key);
        if (type && type->type != JSON_NULL && !(type->type == JSON_STRING && strcmp(type->string, "default") == 0)) {
            snprintf(L->err, L->errlen, "%s: %s.%s %s is not supported (supported: default)", L->config_path,
                     rope_key, type_key, type->type == JSON_STRING ? type->string : "of the wrong type");
            return 1;
        }
        if (cfg_positive(L, rope, "rope_theta", c->rope_theta, &c->rope_theta)) return 1;
    }
    c->mlp_sparse = malloc((size_t)c->layers);
    c->indexer_full = malloc((size_t)c->layers);
    if (!c->mlp_sparse || !c->indexer_full) {
        snprintf(L->err, L->errlen, "out of memory");
        return 1;
    }
    if (cfg_pattern(L, cfg, "mlp_layer_types", "sparse", "dense", c->layers, c->mlp_sparse, first_dense) ||
        cfg_pattern(L, cfg, "indexer_types", "full", "shared", c->layers, c->indexer_full, -1))
        return 1;
    if (!c->indexer_full[0]) {
        snprintf(L->err, L->errlen, "%s: indexer_types[0] is \"shared\" but no earlier layer has an indexer",
                 L->config_path);
        return 1;
    }
    return 0;
}

/* ---- tensors ---------------------------------------------------------- */

static const st_tensor *need(loader_ctx *L, const char *name, int64_t d0, int64_t d1) {
    const st_tensor *t = st_find(&L->m->st, name);
    if (!t) {
        snprintf(L->err, L->errlen, "%s: tensor '%s' is missing", st_set_source(&L->m->st), name);
        return NULL;
    }
    int ndim = d1 ? 2 : 1;
    if (t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1)) {
        char got[96] = "", want[64];
        for (int i = 0; i < t->ndim; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        if (ndim == 2) snprintf(want, sizeof want, "%lld, %lld", (long long)d0, (long long)d1);
        else snprintf(want, sizeof want, "%lld", (long long)d0);
        snprintf(L->err, L->errlen, "%s: tensor '%s' has shape [%s], the config needs [%s]", t->file, name, got, want);
        return NULL;
    }
    if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16) {
        snprintf(L->err, L->errlen, "%s: tensor '%s' has dtype %s; supported: F32, F16, BF16", t->file, name,
                 st_dtype_name(t->dtype));
        return NULL;
    }
    return t;
}

/* float32 copy (or the mapped bytes themselves when already aligned F32). */
static const float *as_f32(loader_ctx *L, const st_tensor *t, float **owned) {
    *owned = NULL;
    if (t->dtype == ST_F32 && ((uintptr_t)t->data % sizeof(float)) == 0) return (const float *)t->data;
    *owned = malloc((size_t)t->numel * sizeof(float));
    if (!*owned) {
        snprintf(L->err, L->errlen, "out of memory for tensor '%s'", t->name);
        return NULL;
    }
    if (st_to_f32(t, *owned, L->err, L->errlen)) {
        free(*owned);
        *owned = NULL;
        return NULL;
    }
    return *owned;
}

static float *vec(loader_ctx *L, const char *name, int64_t n) {
    const st_tensor *t = need(L, name, n, 0);
    float *owned = NULL;
    if (!t) return NULL;
    const float *p = as_f32(L, t, &owned);
    if (!p) return NULL;
    if (!owned) {
        owned = malloc((size_t)n * sizeof(float));
        if (!owned) {
            snprintf(L->err, L->errlen, "out of memory");
            return NULL;
        }
        memcpy(owned, p, (size_t)n * sizeof(float));
    }
    st_release(t);
    return owned;
}

/* A float32 matrix kept as it is (router, indexer head weights, routed experts):
 * with copy = 0 mapped F32 data is used in place, and *converted says whether the
 * result is a new allocation. */
static float *mat_f32_ex(loader_ctx *L, const char *name, int64_t rows, int64_t cols, int copy, int *converted);

static float *mat_f32(loader_ctx *L, const char *name, int64_t rows, int64_t cols, int copy) {
    int converted;
    return mat_f32_ex(L, name, rows, cols, copy, &converted);
}

static float *mat_f32_ex(loader_ctx *L, const char *name, int64_t rows, int64_t cols, int copy, int *converted) {
    const st_tensor *t = need(L, name, rows, cols);
    float *owned = NULL;
    if (!t) return NULL;
    const float *p = as_f32(L, t, &owned);
    if (!p) return NULL;
    *converted = owned != NULL;
    if (owned || !copy) return owned ? owned : (float *)(uintptr_t)p;
    *converted = 1;
    owned = malloc((size_t)(rows * cols) * sizeof(float));
    if (!owned) {
        snprintf(L->err, L->errlen, "out of memory");
        return NULL;
    }
    memcpy(owned, p, (size_t)(rows * cols) * sizeof(float));
    return owned;
}

static int32_t q4_group(int64_t cols) {
    for (int32_t g = Q4_GROUP; g >= 2; g /= 2)
        if (cols % g == 0) return g;
    return 0;
}

/* Upload to the backend; on success the host copy is released. */
static void offload(loader_ctx *L, linear *l) {
    coli_backend *b = L->m->backend;
    coli_status st;
    if (!b) return;
    if (l->format == COLI_FMT_F32) st = b->api.tensor_upload_f32(l->w, l->rows, l->cols, &l->dev);
    else if (l->format == COLI_FMT_Q8) st = b->api.tensor_upload_q8(l->q8, l->scale, l->rows, l->cols, &l->dev);
    else st = b->api.tensor_upload_q4(l->q4, l->scale, l->rows, l->cols, l->group, &l->dev);
    if (st != COLI_OK) {
        l->dev = 0; /* this tensor stays on the CPU */
        return;
    }
    L->m->resident++;
    uint64_t bytes = 0;
    if (b->api.tensor_size(l->dev, &bytes) == COLI_OK) L->m->resident_bytes += bytes;
    free(l->owned);
    free(l->q8);
    free(l->q4);
    free(l->scale);
    l->owned = NULL;
    l->q8 = NULL;
    l->q4 = NULL;
    l->scale = NULL;
    l->w = NULL;
}

/* Rows [b, e) of l quantised from w (each row alone, so the pool's threads may split them). */
typedef struct quantise_job {
    linear *l;
    const float *w;
} quantise_job;

static void quantise_rows(void *ctx, int64_t b, int64_t e) {
    const quantise_job *j = ctx;
    const linear *l = j->l;
    const int64_t cols = l->cols;
    if (l->format == COLI_FMT_Q8) coli_quantize_q8(j->w + b * cols, e - b, cols, l->q8 + b * cols, l->scale + b);
    else
        coli_quantize_q4(j->w + b * cols, e - b, cols, l->group, l->q4 + b * cols / 2,
                         l->scale + b * (cols / l->group));
}

/* l as rows x cols weights w in the model's format: w itself at f32 (owned: the
 * copy to free with it, or NULL when w is mapped), else quantised from w, which is
 * then released (`t`, when w is a mapped tensor's). Nothing is offloaded here. */
static int weights_in_format(loader_ctx *L, linear *l, const char *name, const float *w, float *owned,
                             const st_tensor *t, int64_t rows, int64_t cols) {
    l->rows = rows;
    l->cols = cols;
    quant_mode q = L->m->quant;
    if (q == QUANT_INT4 && !q4_group(cols)) q = QUANT_INT8; /* an odd width cannot hold int4 pairs */
    if (q == QUANT_F32) {
        l->format = COLI_FMT_F32;
        l->w = w;
        l->owned = owned;
        return 0;
    }
    if (q == QUANT_INT8) {
        l->format = COLI_FMT_Q8;
        l->q8 = malloc((size_t)(rows * cols));
        l->scale = malloc((size_t)rows * sizeof(float));
    } else {
        l->format = COLI_FMT_Q4;
        l->group = q4_group(cols);
        l->q4 = malloc((size_t)(rows * cols / 2));
        l->scale = malloc((size_t)(rows * (cols / l->group)) * sizeof(float));
    }
    if (l->scale && (l->q8 || l->q4)) {
        quantise_job j = {l, w};
        pool_run(L->m->pool, quantise_rows, &j, rows);
    }
    free(owned);
    if (t) st_release(t);
    if (!l->scale || (!l->q8 && !l->q4)) {
        snprintf(L->err, L->errlen, "out of memory quantising '%s'", name);
        return 1;
    }
    return 0;
}

static int dense(loader_ctx *L, linear *l, const char *name, int64_t rows, int64_t cols, const char *bias) {
    const st_tensor *t = need(L, name, rows, cols);
    memset(l, 0, sizeof *l);
    if (!t) return 1;
    float *owned = NULL;
    const float *w = as_f32(L, t, &owned);
    if (!w || weights_in_format(L, l, name, w, owned, t, rows, cols)) return 1;
    if (bias) {
        l->bias = vec(L, bias, rows);
        if (!l->bias) return 1;
    }
    offload(L, l);
    return 0;
}

static int expert_slots(loader_ctx *L, layer *ly) {
    ly->experts = calloc((size_t)(3 * L->m->c.experts), sizeof *ly->experts);
    if (!ly->experts) snprintf(L->err, L->errlen, "out of memory");
    return ly->experts == NULL;
}

static int load_layer(loader_ctx *L, int64_t i) {
    model *m = L->m;
    const model_config *c = &m->c;
    layer *ly = &m->layers[i];
    char p[64], n[400], b[400];
    const int64_t qk = c->qk_nope + c->qk_rope;
    snprintf(p, sizeof p, "model.layers.%lld.", (long long)i);
#define NAME(suffix) (snprintf(n, sizeof n, "%s%s", p, suffix), n)
#define BIAS(suffix) (c->attention_bias ? (snprintf(b, sizeof b, "%s%s", p, suffix), b) : NULL)
    if (!(ly->in_norm = vec(L, NAME("input_layernorm.weight"), c->hidden))) return 1;
    if (!(ly->post_norm = vec(L, NAME("post_attention_layernorm.weight"), c->hidden))) return 1;
    if (!(ly->q_a_norm = vec(L, NAME("self_attn.q_a_layernorm.weight"), c->q_lora))) return 1;
    if (!(ly->kv_a_norm = vec(L, NAME("self_attn.kv_a_layernorm.weight"), c->kv_lora))) return 1;
    if (dense(L, &ly->q_a, NAME("self_attn.q_a_proj.weight"), c->q_lora, c->hidden, BIAS("self_attn.q_a_proj.bias")) ||
        dense(L, &ly->q_b, NAME("self_attn.q_b_proj.weight"), c->heads * qk, c->q_lora, NULL) ||
        dense(L, &ly->kv_a, NAME("self_attn.kv_a_proj_with_mqa.weight"), c->kv_lora + c->qk_rope, c->hidden,
              BIAS("self_attn.kv_a_proj_with_mqa.bias")) ||
        dense(L, &ly->kv_b, NAME("self_attn.kv_b_proj.weight"), c->heads * (c->qk_nope + c->v_head), c->kv_lora, NULL) ||
        dense(L, &ly->o, NAME("self_attn.o_proj.weight"), c->hidden, c->heads * c->v_head, BIAS("self_attn.o_proj.bias")))
        return 1;
    if (c->indexer_full[i]) {
        if (dense(L, &ly->idx_q, NAME("self_attn.indexer.wq_b.weight"), c->index_heads * c->index_head_dim, c->q_lora,
                  NULL) ||
            dense(L, &ly->idx_k, NAME("self_attn.indexer.wk.weight"), c->index_head_dim, c->hidden, NULL))
            return 1;
        if (!(ly->idx_k_norm_w = vec(L, NAME("self_attn.indexer.k_norm.weight"), c->index_head_dim))) return 1;
        if (!(ly->idx_k_norm_b = vec(L, NAME("self_attn.indexer.k_norm.bias"), c->index_head_dim))) return 1;
        if (!(ly->idx_weights = mat_f32(L, NAME("self_attn.indexer.weights_proj.weight"), c->index_heads, c->hidden, 1)))
            return 1;
    }
    if (!c->mlp_sparse[i]) {
        return dense(L, &ly->gate, NAME("mlp.gate_proj.weight"), c->intermediate, c->hidden, NULL) ||
               dense(L, &ly->up, NAME("mlp.up_proj.weight"), c->intermediate, c->hidden, NULL) ||
               dense(L, &ly->down, NAME("mlp.down_proj.weight"), c->hidden, c->intermediate, NULL);
    }
    const int64_t I = c->moe_intermediate, S = c->moe_intermediate * c->shared_experts;
    if (!(ly->router = mat_f32(L, NAME("mlp.gate.weight"), c->experts, c->hidden, 1))) return 1;
    if (!(ly->router_bias = vec(L, NAME("mlp.gate.e_score_correction_bias"), c->experts))) return 1;
    ly->e_gate = calloc((size_t)c->experts, sizeof(float *));
    ly->e_up = calloc((size_t)c->experts, sizeof(float *));
    ly->e_down = calloc((size_t)c->experts, sizeof(float *));
    ly->e_owned = calloc((size_t)c->experts * 3, sizeof(float *));
    if (!ly->e_gate || !ly->e_up || !ly->e_down || !ly->e_owned) {
        snprintf(L->err, L->errlen, "out of memory");
        return 1;
    }
    char e[128];
    snprintf(e, sizeof e, "%smlp.experts.0.gate_proj.weight", p);
    /* at int8/int4 the routed experts are quantised like the dense weights as they load, and
     * their float32 pages given back: the CPU reads 4 or 8 times fewer bytes for them */
    const int quantised = m->quant != QUANT_F32;
    if (quantised && expert_slots(L, ly)) return 1;
    if (st_find(&m->st, e)) {
        static const char *parts[] = {"gate_proj", "up_proj", "down_proj"};
        for (int64_t j = 0; j < c->experts; j++)
            for (int k = 0; k < 3; k++) {
                const int64_t rows = k == 2 ? c->hidden : I, cols = k == 2 ? I : c->hidden;
                snprintf(e, sizeof e, "mlp.experts.%lld.%s.weight", (long long)j, parts[k]);
                if (quantised) {
                    const st_tensor *t = need(L, NAME(e), rows, cols);
                    float *owned = NULL;
                    const float *w = t ? as_f32(L, t, &owned) : NULL;
                    if (!w || weights_in_format(L, &ly->experts[3 * j + k], n, w, owned, t, rows, cols)) return 1;
                    continue;
                }
                int converted = 0;
                float *w = mat_f32_ex(L, NAME(e), rows, cols, 0, &converted);
                if (!w) return 1;
                if (converted) ly->e_owned[ly->n_owned++] = w;
                (k == 0 ? ly->e_gate : k == 1 ? ly->e_up : ly->e_down)[j] = w;
            }
    } else {
        /* transformers' in-memory layout: gate_up_proj [E, 2I, H], down_proj [E, H, I] */
        const st_tensor *gu = st_find(&m->st, NAME("mlp.experts.gate_up_proj"));
        const st_tensor *dn = st_find(&m->st, (snprintf(b, sizeof b, "%smlp.experts.down_proj", p), b));
        if (!gu || !dn || gu->ndim != 3 || dn->ndim != 3 || gu->shape[0] != c->experts || gu->shape[1] != 2 * I ||
            gu->shape[2] != c->hidden || dn->shape[0] != c->experts || dn->shape[1] != c->hidden || dn->shape[2] != I) {
            snprintf(L->err, L->errlen, "%s: tensor '%smlp.experts.0.gate_proj.weight' is missing (nor are fused "
                     "experts of shape [%lld, %lld, %lld] there)", st_set_source(&m->st), p, (long long)c->experts,
                     (long long)(2 * I), (long long)c->hidden);
            return 1;
        }
        float *gu_owned, *dn_owned;
        const float *gup = as_f32(L, gu, &gu_owned), *dnp = as_f32(L, dn, &dn_owned);
        if (gu_owned) ly->e_owned[ly->n_owned++] = gu_owned;
        if (dn_owned) ly->e_owned[ly->n_owned++] = dn_owned;
        if (!gup || !dnp) return 1;
        for (int64_t j = 0; j < c->experts; j++) {
            ly->e_gate[j] = (float *)(uintptr_t)(gup + j * 2 * I * c->hidden);
            ly->e_up[j] = (float *)(uintptr_t)(gup + j * 2 * I * c->hidden + I * c->hidden);
            ly->e_down[j] = (float *)(uintptr_t)(dnp + j * c->hidden * I);
            for (int k = 0; quantised && k < 3; k++) {
                const float *w = (k == 0 ? ly->e_gate : k == 1 ? ly->e_up : ly->e_down)[j];
                snprintf(e, sizeof e, "%smlp.experts.%lld.%d", p, (long long)j, k);
                if (weights_in_format(L, &ly->experts[3 * j + k], e, w, NULL, NULL, k == 2 ? c->hidden : I,
                                      k == 2 ? I : c->hidden))
                    return 1;
            }
        }
        if (quantised) { /* the fused float32 tensors are no longer read */
            for (int64_t k = 0; k < ly->n_owned; k++) free(ly->e_owned[k]);
            ly->n_owned = 0;
            if (!gu_owned) st_release(gu);
            if (!dn_owned) st_release(dn);
        }
    }
    return dense(L, &ly->sh_gate, NAME("mlp.shared_experts.gate_proj.weight"), S, c->hidden, NULL) ||
           dense(L, &ly->sh_up, NAME("mlp.shared_experts.up_proj.weight"), S, c->hidden, NULL) ||
           dense(L, &ly->sh_down, NAME("mlp.shared_experts.down_proj.weight"), c->hidden, S, NULL);
#undef NAME
#undef BIAS
}

int model_load(model *m, const char *dir, quant_mode quant, int threads, coli_backend *backend, int64_t max_pos,
               char *err, size_t errlen) {
    char path[4200], jerr[256];
    loader_ctx L = {m, err, errlen, path};
    json_value *cfg = NULL;
    size_t len = 0;
    memset(m, 0, sizeof *m);
    m->quant = quant;
    m->backend = backend;
    m->max_pos = max_pos;
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = coli_read_file(path, &len);
    if (!text) {
        const int e = errno, kind = coli_path_kind(dir);
        if (kind < 0) snprintf(err, errlen, "%s: no such model folder", dir);
        else if (kind == 0)
            snprintf(err, errlen, "%s: a file, not a model folder (config.json and its safetensors)", dir);
        else snprintf(err, errlen, "%s: cannot read: %s", path, strerror(e));
        return 1;
    }
    int rc = json_parse(text, len, &cfg, jerr, sizeof jerr);
    free(text);
    if (rc) {
        snprintf(err, errlen, "%s: %s", path, jerr);
        return 1;
    }
    rc = parse_config(&L, cfg);
    json_free(cfg);
    if (rc) return 1;
    if (st_set_open(dir, &m->st, err, errlen)) return 1;
    const model_config *c = &m->c;
    m->layers = calloc((size_t)c->layers, sizeof *m->layers);
    m->inv_freq = malloc((size_t)(c->qk_rope / 2) * sizeof(float));
    if (!m->layers || !m->inv_freq) {
        snprintf(err, errlen, "out of memory");
        return 1;
    }
    /* as transformers computes it, in float32 */
    for (int64_t i = 0; i < c->qk_rope / 2; i++)
        m->inv_freq[i] = 1.0f / powf((float)c->rope_theta, (float)(2 * i) / (float)c->qk_rope);
    m->pool = pool_create(threads); /* the weights are quantised on it too */
    int converted = 0;
    if (!(m->embed = mat_f32_ex(&L, "model.embed_tokens.weight", c->vocab, c->hidden, 0, &converted))) return 1;
    if (converted) m->embed_owned = m->embed;
    if (!(m->final_norm = vec(&L, "model.norm.weight", c->hidden))) return 1;
    const char *head = c->tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    if (dense(&L, &m->lm_head, head, c->vocab, c->hidden, NULL)) return 1;
    for (int64_t i = 0; i < c->layers; i++)
        if (load_layer(&L, i)) return 1;
    for (int64_t i = 0; i < c->layers; i++) {
        layer *ly = &m->layers[i];
        ly->k_cache = malloc((size_t)(max_pos * c->heads * c->qk_nope) * sizeof(float));
        ly->kr_cache = malloc((size_t)(max_pos * c->qk_rope) * sizeof(float));
        ly->v_cache = malloc((size_t)(max_pos * c->heads * c->v_head) * sizeof(float));
        ly->ik_cache = malloc((size_t)(max_pos * c->index_head_dim) * sizeof(float));
        if (!ly->k_cache || !ly->kr_cache || !ly->v_cache || !ly->ik_cache) {
            snprintf(err, errlen, "out of memory for a KV cache of %lld positions", (long long)max_pos);
            return 1;
        }
    }
    if (backend && backend->api.backend_set_threads) backend->api.backend_set_threads(threads);
    pool_forget(m->pool); /* quantising pages in as they fault says little of a thread's speed later */
    return 0;
}

static void linear_free(model *m, linear *l) {
    if (l->dev && m->backend) m->backend->api.tensor_free(l->dev);
    free(l->owned);
    free(l->q8);
    free(l->q4);
    free(l->scale);
    free(l->bias);
}

void model_free(model *m) {
    const model_config *c = &m->c;
    model_step_free(m);
    if (m->layers) {
        for (int64_t i = 0; i < c->layers; i++) {
            layer *ly = &m->layers[i];
            linear *ls[] = {&ly->q_a, &ly->q_b, &ly->kv_a, &ly->kv_b, &ly->o, &ly->idx_q, &ly->idx_k,
                            &ly->gate, &ly->up, &ly->down, &ly->sh_gate, &ly->sh_up, &ly->sh_down};
            for (size_t k = 0; k < sizeof ls / sizeof ls[0]; k++) linear_free(m, ls[k]);
            free(ly->in_norm); free(ly->post_norm); free(ly->q_a_norm); free(ly->kv_a_norm);
            free(ly->idx_k_norm_w); free(ly->idx_k_norm_b); free(ly->idx_weights);
            free(ly->router); free(ly->router_bias);
            for (int64_t k = 0; ly->experts && k < 3 * c->experts; k++) linear_free(m, &ly->experts[k]);
            free(ly->experts);
            for (int64_t k = 0; k < ly->n_owned; k++) free(ly->e_owned[k]);
            free(ly->e_owned);
            free(ly->e_gate); free(ly->e_up); free(ly->e_down);
            free(ly->k_cache); free(ly->kr_cache); free(ly->v_cache); free(ly->ik_cache);
            free(ly->lat_cache);
        }
        free(m->layers);
    }
    linear_free(m, &m->lm_head);
    free(m->embed_owned);
    free(m->final_norm);
    free(m->inv_freq);
    free(c->mlp_sparse);
    free(c->indexer_full);
    pool_destroy(m->pool);
    st_set_close(&m->st);
    memset(m, 0, sizeof *m);
}
