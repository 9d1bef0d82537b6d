/* The DSA indexer's top-k selection (coli_select_first and coli_index_select's radix
 * selection, kernels/cpu_model_ops.c) against a full sort's first k, on random arrays
 * with many ties. */
#include <stdio.h>
#include <stdlib.h>

#include "cpu_model_ops.h"

static int by_order(const void *a, const void *b) {
    return coli_scored_before(a, b) ? -1 : coli_scored_before(b, a) ? 1 : 0;
}

int main(void) {
    srand(7);
    for (int it = 0; it < 20000; it++) {
        int64_t n = 1 + rand() % 300, k = 1 + rand() % n;
        coli_scored a[300], b[300];
        for (int64_t i = 0; i < n; i++) {
            a[i].score = (float)(rand() % (1 + it % 7));
            a[i].t = i;
            b[i] = a[i];
        }
        coli_select_first(a, n, k);
        qsort(b, (size_t)n, sizeof *b, by_order);
        unsigned char in[300] = {0};
        for (int64_t i = 0; i < k; i++) in[a[i].t] = 1;
        for (int64_t i = 0; i < k; i++)
            if (!in[b[i].t]) {
                printf("MISMATCH n=%lld k=%lld\n", (long long)n, (long long)k);
                return 1;
            }
        /* the indexer's selection (radix, then the tie at the cut by key): the same set,
         * here with scores of every sign and magnitude now and then, zeros of both signs */
        coli_scored c[300];
        for (int64_t i = 0; i < n; i++) {
            c[i].score = it % 3 ? a[i].score : (float)(rand() % 5 - 2) * (it % 2 ? 1e-30f : 3e7f);
            c[i].t = i;
            if (c[i].score == 0.0f && rand() % 2) c[i].score = -0.0f;
            b[i] = c[i];
        }
        qsort(b, (size_t)n, sizeof *b, by_order);
        unsigned char sel[300];
        coli_index_select(c, n, k, sel);
        for (int64_t i = 0; i < n; i++)
            if (sel[b[i].t] != (i < k)) {
                printf("MISMATCH coli_index_select n=%lld k=%lld\n", (long long)n, (long long)k);
                return 1;
            }
    }
    puts("coli_select_first and coli_index_select == qsort prefix on 20000 arrays");
    return 0;
}
