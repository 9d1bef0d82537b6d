/* What a decoded token reads, wherever the weights are: every dense linear in its
 * format, the embedding row, the norms, the routers, the indexer's heads and the
 * token's share of the routed experts (k of E, as stored); and what the caches add
 * per position (either cache form). A decode figure divided by the bandwidth over these is its share of
 * the limit (bench/engine_speed.py on the CPU, bench/gpu_step.sh on the GPU). */
#include "model.h"

uint64_t model_weight_bytes(int64_t rows, int64_t cols, int format, int32_t group) {
    const uint64_t n = (uint64_t)rows * (uint64_t)cols;
    if (format == COLI_FMT_F32) return n * 4;
    if (format == COLI_FMT_Q8) return n + (uint64_t)rows * 4;
    return n / 2 + (uint64_t)rows * (uint64_t)(cols / group) * 4;
}

static uint64_t linear_bytes(const linear *l) {
    if (!l->rows) return 0;
    return model_weight_bytes(l->rows, l->cols, l->format, l->group) + (l->bias ? (uint64_t)l->rows * 4 : 0);
}

uint64_t model_token_bytes(const model *m) {
    const model_config *c = &m->c;
    uint64_t total = (uint64_t)(2 * c->hidden) * 4 + linear_bytes(&m->lm_head); /* embedding row, final norm */
    for (int64_t l = 0; l < c->layers; l++) {
        const layer *ly = &m->layers[l];
        total += (uint64_t)(2 * c->hidden + c->q_lora + c->kv_lora) * 4;
        const linear *attn[] = {&ly->q_a, &ly->q_b, &ly->kv_a, &ly->kv_b, &ly->o};
        for (size_t k = 0; k < sizeof attn / sizeof attn[0]; k++) total += linear_bytes(attn[k]);
        if (c->indexer_full[l])
            total += linear_bytes(&ly->idx_q) + linear_bytes(&ly->idx_k) +
                     (uint64_t)(c->index_heads * c->hidden + 2 * c->index_head_dim) * 4;
        if (!c->mlp_sparse[l]) {
            total += linear_bytes(&ly->gate) + linear_bytes(&ly->up) + linear_bytes(&ly->down);
            continue;
        }
        total += (uint64_t)(c->experts * c->hidden + c->experts) * 4; /* the router, f32 */
        total += linear_bytes(&ly->sh_gate) + linear_bytes(&ly->sh_up) + linear_bytes(&ly->sh_down);
        uint64_t experts = 0;
        for (int64_t k = 0; k < 3 * c->experts; k++)
            experts += ly->experts ? linear_bytes(&ly->experts[k]) : (uint64_t)(c->hidden * c->moe_intermediate) * 4;
        total += experts / (uint64_t)c->experts * (uint64_t)c->experts_per_tok;
    }
    return total;
}

uint64_t model_kv_bytes_per_position(const model *m, int rope_per_head) {
    const model_config *c = &m->c;
    uint64_t total = 0;
    for (int64_t l = 0; l < c->layers; l++)
        total += (uint64_t)((m->latent ? c->kv_lora : c->heads * (c->qk_nope + c->v_head)) +
                            (rope_per_head ? c->heads : 1) * c->qk_rope + (c->indexer_full[l] ? c->index_head_dim : 0)) *
                 sizeof(float);
    return total;
}
