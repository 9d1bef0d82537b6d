/* The DSA indexer's top-k selection (select_first, static in engine/model_forward.c)
 * against a full sort's first k, on random arrays with many ties. */
#include "model_forward.c"
#include <stdio.h>
int main(void) {
    srand(7);
    for (int it = 0; it < 20000; it++) {
        int64_t n = 1 + rand() % 300, k = 1 + rand() % n;
        scored a[300], b[300];
        for (int64_t i = 0; i < n; i++) { a[i].score = (float)(rand() % (1 + it % 7)); a[i].t = i; b[i] = a[i]; }
        select_first(a, n, k);
        qsort(b, (size_t)n, sizeof *b, by_score_desc);
        unsigned char in[300] = {0};
        for (int64_t i = 0; i < k; i++) in[a[i].t] = 1;
        for (int64_t i = 0; i < k; i++) if (!in[b[i].t]) { printf("MISMATCH n=%lld k=%lld\n", (long long)n, (long long)k); return 1; }
    }
    puts("select_first == qsort prefix on 20000 arrays");
    return 0;
}
