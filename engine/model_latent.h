/* The MLA latent cache on the CPU path (model_latent.c). */
#ifndef COLI_MODEL_LATENT_H
#define COLI_MODEL_LATENT_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

/* After model_load, on the CPU path: the expanded caches give way to the latent cache,
 * and kv_b's key rows are kept as floats for the queries' absorption. */
int model_use_latent(model *m, char *err, size_t errlen);

/* Positions t0.. of tokens [0, n): their normalised latents (kvn, [n, kv_lora]) and
 * roped keys (the last qk_rope of each ckv row, [n, kv_lora + qk_rope]) into the cache. */
void model_latent_write(const model *m, layer *ly, const float *kvn, const float *ckv, int64_t n, int64_t t0);

/* Attention for queries q ([n, heads, qk]) over the selected keys (sel: [n, total])
 * into att ([n, heads, v_head]), as the expanded form's up to rounding. qa: room for the
 * absorbed queries, [n, heads, kv_lora + qk_rope] (the forward's: a prefill's are
 * megabytes, fresh ones a layer cost a page fault every 4 KiB). */
int model_latent_attention(model *m, const layer *ly, const float *q, const unsigned char *sel, int64_t n,
                           int64_t t0, int64_t total, float scaling, float *qa, float *att, char *err, size_t errlen);

#endif
