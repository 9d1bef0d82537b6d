/* MLA attention over the latent cache (coli_attend_latent, kernels/cpu_model_ops.c) on
 * random caches, selections and sizes: every output within rounding of a softmax and
 * weighted sum in double precision, and a decode's split (its blocks in any order, as
 * threads would run them, each block's heads in two calls, then the combine a head at a
 * time) giving the one-walk bits.
 * Prints the loops that ran and a hash of every output's bits, to compare levels. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bits_hash.h"
#include "cpu_model_ops.h"
#include "cpu_ops.h"

static float uniform(void) { return (float)rand() / (float)RAND_MAX * 2.0f - 1.0f; }

int main(void) {
    srand(11);
    double worst = 0.0;
    int cases = 0, past = 0;
    for (int it = 0; it < 400; it++) {
        const int64_t heads = 1 + rand() % 6, rank = 1 + rand() % 40, rope = rand() % 9, width = rank + rope;
        /* now and then past 64 blocks, which the combine takes 64 at a time */
        const int64_t total = it % 40 == 0 ? 12600 + rand() % 400 : 1 + rand() % 300;
        float *lat = malloc((size_t)(total * width) * sizeof(float));
        float *qa = malloc((size_t)(heads * width) * sizeof(float));
        int64_t *keys = malloc((size_t)total * sizeof *keys), count = 0;
        const int every = rand() % 3 == 0; /* a prefill's early query: every key, the rows side by side */
        for (int64_t t = 0; t < total; t++)
            if (every || rand() % 3 == 0 || t == total - 1) keys[count++] = t;
        /* wide scores now and then, so that blocks' maxima differ by much */
        const float spread = it % 4 == 0 ? 8.0f : 1.0f, scaling = 1.0f / sqrtf((float)width);
        for (int64_t i = 0; i < total * width; i++) lat[i] = uniform() * spread;
        for (int64_t i = 0; i < heads * width; i++) qa[i] = uniform();
        const int64_t blocks = (count + COLI_LATENT_BLOCK - 1) / COLI_LATENT_BLOCK;
        float *scratch = malloc((size_t)coli_latent_block_scratch(heads, width) * sizeof(float));
        const size_t part_bytes = (size_t)(blocks * heads * (rank + 2)) * sizeof(float);
        float *parts = malloc(part_bytes), *parts2 = malloc(part_bytes);
        float *ctx = malloc((size_t)(heads * rank) * sizeof(float));
        float *ctx2 = malloc((size_t)(heads * rank) * sizeof(float));
        coli_attend_latent(qa, heads, lat, width, rank, keys, count, scaling, scratch, parts, ctx);
        float *m = parts2, *l = m + blocks * heads, *c = l + blocks * heads;
        const int64_t cut = rand() % (heads + 1); /* each block's heads in two calls, split here */
        for (int64_t b = blocks - 1; b >= 0; b--) {
            const int64_t k0 = b * COLI_LATENT_BLOCK;
            const int64_t nb = count - k0 < COLI_LATENT_BLOCK ? count - k0 : COLI_LATENT_BLOCK;
            const int64_t from[2] = {cut, 0}, to[2] = {heads, cut};
            for (int part = 0; part < 2; part++) {
                const int64_t h0 = from[part], at = b * heads + h0;
                if (to[part] > h0)
                    coli_latent_block(qa + h0 * width, to[part] - h0, lat, width, rank, keys + k0, nb, keys,
                                      b ? COLI_LATENT_BLOCK : 0, scaling, scratch, m + at, l + at, c + at * rank);
            }
        }
        for (int64_t h = 0; h < heads; h++) coli_latent_combine(blocks, heads, h, h + 1, rank, m, l, c, ctx2);
        if (memcmp(ctx, ctx2, (size_t)(heads * rank) * sizeof(float))) {
            printf("MISMATCH: blocks in reverse order, heads %lld rank %lld keys %lld\n", (long long)heads,
                   (long long)rank, (long long)count);
            return 1;
        }
        for (int64_t h = 0; h < heads; h++) {
            double mx = -INFINITY, sum = 0.0, *p = malloc((size_t)count * sizeof(double));
            for (int64_t i = 0; i < count; i++) {
                double d = 0.0;
                for (int64_t k = 0; k < width; k++) d += (double)qa[h * width + k] * lat[keys[i] * width + k];
                p[i] = d * scaling;
                if (p[i] > mx) mx = p[i];
            }
            for (int64_t i = 0; i < count; i++) sum += p[i] = exp(p[i] - mx);
            for (int64_t d = 0; d < rank; d++) {
                double want = 0.0, scale = 0.0;
                for (int64_t i = 0; i < count; i++) {
                    want += p[i] / sum * lat[keys[i] * width + d];
                    scale += p[i] / sum * fabs(lat[keys[i] * width + d]);
                }
                const double err = fabs(ctx[h * rank + d] - want) / (scale > 0 ? scale : 1.0);
                if (!(err < 2e-5)) {
                    printf("OFF: heads %lld rank %lld width %lld keys %lld: ctx[%lld][%lld] = %.9g, want %.9g\n",
                           (long long)heads, (long long)rank, (long long)width, (long long)count, (long long)h,
                           (long long)d, ctx[h * rank + d], want);
                    return 1;
                }
                if (err > worst) worst = err;
            }
            free(p);
        }
        mix(ctx, heads * rank);
        cases += blocks > 1, past += blocks > 64;
        free(lat), free(qa), free(keys), free(scratch), free(parts), free(parts2), free(ctx), free(ctx2);
    }
    printf("%s loops: latent attention on 400 caches (%d of several blocks, %d past 64): worst relative error %.2g, "
           "split bits equal, hash %016llx\n", coli_cpu_loops(), cases, past, worst, (unsigned long long)hash);
    return 0;
}
