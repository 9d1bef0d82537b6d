/* The glm_moe_dsa model as transformers defines it (GlmMoeDsaForCausalLM):
 * MLA attention with the DSA indexer, dense and MoE MLPs, a KV cache. With a
 * backend the whole forward is one step there (model_step.c), or with --offload
 * matmuls only the dense matmuls; on the CPU the routed experts are in the model's
 * format, the router and the indexer's head weights in float32. */
#ifndef COLI_MODEL_H
#define COLI_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "loader.h"
#include "pool.h"
#include "safetensors.h"

typedef enum { QUANT_F32, QUANT_INT8, QUANT_INT4 } quant_mode;

typedef struct model_config {
    int64_t vocab, hidden, intermediate, moe_intermediate, layers, heads;
    int64_t q_lora, kv_lora, qk_nope, qk_rope, v_head;
    int64_t experts, experts_per_tok, shared_experts, n_group, topk_group;
    int64_t index_topk, index_head_dim, index_heads;
    int64_t max_positions; /* max_position_embeddings, 0 where the config has none */
    int norm_topk_prob, tie_embeddings, attention_bias;
    double rms_eps, rope_theta, routed_scaling;
    char *mlp_sparse;     /* per layer: 1 = MoE */
    char *indexer_full;   /* per layer: 1 = runs its indexer, 0 = reuses the previous */
} model_config;

typedef struct linear {
    int64_t rows, cols; /* out, in */
    int format;         /* COLI_FMT_* */
    int32_t group;
    const float *w;     /* f32 weights (owned when `owned`) */
    float *owned;
    int8_t *q8;
    uint8_t *q4;
    float *scale;
    float *bias;        /* optional */
    coli_tensor dev;    /* non-zero: resident in the backend */
} linear;

typedef struct layer {
    float *in_norm, *post_norm, *q_a_norm, *kv_a_norm;
    linear q_a, q_b, kv_a, kv_b, o;
    linear idx_q, idx_k;            /* indexer wq_b, wk (full layers only) */
    float *idx_k_norm_w, *idx_k_norm_b, *idx_weights; /* LayerNorm, weights_proj [index_heads, hidden] */
    linear gate, up, down;          /* dense MLP */
    float *router, *router_bias;    /* [experts, hidden], [experts] */
    float **e_gate, **e_up, **e_down; /* per routed expert, f32 (read only at f32) */
    linear *experts;                /* at int8/int4: [expert][gate, up, down], quantised, on the CPU */
    float **e_owned;                /* converted copies to free (mapped F32 needs none) */
    int64_t n_owned;
    linear sh_gate, sh_up, sh_down; /* shared experts */
    /* the CPU path's caches, a position a row: each head's nope key, the rope key its
     * heads share (kept once), each head's value, the indexer's key; or, with the
     * latent cache (model_latent.c), a position's latent and rope key */
    float *k_cache, *kr_cache, *v_cache, *ik_cache;
    float *lat_cache;
} layer;

/* Where a forward's time goes: every linear (in the backend or on the CPU), the
 * router and routed experts (CPU), attention over the cache, the DSA indexer. The
 * rest (norms, RoPE, residuals, the cache writes, the embedding) is the forward's
 * time less these. */
typedef enum { PHASE_LINEARS, PHASE_ROUTED_EXPERTS, PHASE_ATTENTION, PHASE_INDEXER, PHASE_COUNT } forward_phase;
extern const char *const FORWARD_PHASE_NAMES[PHASE_COUNT];

typedef struct model_step model_step; /* the GPU tier's whole step (model_step.c) */

typedef struct model {
    model_config c;
    st_set st;
    quant_mode quant;
    float *embed;        /* [vocab, hidden] */
    float *embed_owned;  /* embed, when converted from F16/BF16 */
    float *final_norm;
    linear lm_head;
    layer *layers;
    float *inv_freq;     /* [qk_rope / 2] */
    int64_t max_pos, n_pos;
    int latent;          /* the CPU path's cache is MLA's latent (model_latent.c) */
    pool *pool;
    coli_backend *backend; /* NULL: CPU */
    int resident;
    int64_t backend_calls;   /* calls into the backend's matmuls, the matmuls they made, and */
    int64_t backend_matmuls; /* the seconds spent in them (copies and waits included): where */
    double backend_seconds;  /* a GPU tier's time goes */
    double phase_seconds[PHASE_COUNT];
    model_step *step;        /* non-NULL: every forward is one step in the backend */
    uint64_t resident_bytes; /* what the backend holds for the model: tensors, caches, activations */
    int64_t round_trips;     /* host copies to and from the step's buffers */
    uint64_t token_weight_bytes;    /* the step's: weight bytes a decoded token reads */
    uint64_t kv_bytes_per_position; /* the step's KV and indexer caches, all layers (rope key per head) */
    /* called after each layer of a forward on the CPU path, where set: a long prefill's progress */
    void (*layer_done)(void *ctx, int64_t layer, int64_t layers);
    void *layer_ctx;
} model;

/* Loads DIR (config.json + safetensors). On failure `err` names the file and the
 * key or tensor; returns non-zero. `backend` may be NULL. */
int model_load(model *m, const char *dir, quant_mode quant, int threads, coli_backend *backend, int64_t max_pos,
               char *err, size_t errlen);
void model_free(model *m);

/* Runs tokens ids[0..n) at positions n_pos.. and appends them to the cache.
 * logits: [n, vocab]. Returns non-zero with `err` on failure. */
int model_forward(model *m, const int32_t *ids, int64_t n, float *logits, char *err, size_t errlen);
/* The same, giving only the last position's logits ([vocab]): what a decode after a
 * prompt needs; the step then copies one row back instead of n. */
int model_forward_last(model *m, const int32_t *ids, int64_t n, float *logits, char *err, size_t errlen);

/* Runs one token `id` at the next position and gives the argmax of its logits (the
 * first maximum). Through the step only the id goes in and the argmax comes out. */
int model_next(model *m, int32_t id, int32_t *next, char *err, size_t errlen);

/* Called as a decode goes on, with the tokens made so far. */
typedef void (*model_progress)(void *ctx, int64_t tokens);
/* Greedy decoding of `count` tokens after `id`: out[k] is the argmax after out[k - 1]
 * (after id for k = 0), as model_next would give them one by one. Through the step
 * the tokens stay on the device between steps and come back in batches; `done` (may
 * be NULL) is called after each batch, or each token elsewhere. */
int model_generate(model *m, int32_t id, int64_t count, int32_t *out, model_progress done, void *ctx, char *err,
                   size_t errlen);

/* The whole step (model_step.c): after model_load with a backend, uploads what the
 * dense linears do not cover, records the steps and runs the decode step twice at
 * position 0 (so that a backend's first runs are not a decode's). Returns non-zero with err on a
 * failure; 0 with `note` set when the step stays on the CPU (not every linear is
 * resident, or the device has too little free memory: the note gives the bytes). */
int model_step_prepare(model *m, char *note, size_t notelen, char *err, size_t errlen);
void model_step_free(model *m);
int model_step_forward(model *m, const int32_t *ids, int64_t n, float *logits, int last, char *err, size_t errlen);
int model_step_next(model *m, int32_t id, int32_t *next, char *err, size_t errlen);
/* model_generate's batches, where model_step_batches: the backend has keep_ids */
int model_step_generate(model *m, int32_t id, int64_t count, int32_t *out, model_progress done, void *ctx, char *err,
                        size_t errlen);
int model_step_batches(const model *m);
int64_t model_step_ops(const model *m); /* ops in the decode step; 0 without one */

/* What a decoded token reads (model_bytes.c): its weights wherever they are, in
 * their format (the routed experts by the token's k of E), and the caches' bytes per
 * position over all layers: the step's keep the rope key in every head's key
 * (rope_per_head), the CPU path's once a position. */
uint64_t model_weight_bytes(int64_t rows, int64_t cols, int format, int32_t group);
uint64_t model_token_bytes(const model *m);
uint64_t model_kv_bytes_per_position(const model *m, int rope_per_head);

#endif
