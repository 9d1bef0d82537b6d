/* The step planner (kernels/step_plan.h) on random units: every pair of units that
 * conflict is ordered by the plan (same queue, or a chain of waits), on 1 to
 * COLI_MAX_QUEUES queues; one queue never waits; a fan-out of independent units
 * spreads over the queues; and strided spans overlap wherever their bytes do, and
 * exactly so for equal strides over two rows or more. Prints one line per property; exits 1 on the first failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "step_plan.h"

#define MAX_UNITS 160
#define MAX_SPANS 4

static coli_span spans[MAX_UNITS][MAX_SPANS];
static coli_unit units[MAX_UNITS];
static coli_unit_plan plan[MAX_UNITS];
static unsigned char before[MAX_UNITS][MAX_UNITS]; /* before[u][i]: the plan orders i before u */

/* What the plan orders: a queue's units in turn, and each wait with what its unit was after. */
static void close_order(int32_t n) {
    memset(before, 0, sizeof before);
    int32_t last[COLI_MAX_QUEUES];
    for (int q = 0; q < COLI_MAX_QUEUES; q++) last[q] = -1;
    for (int32_t u = 0; u < n; u++) {
        int32_t from[COLI_MAX_QUEUES + 1], k = 0;
        if (last[plan[u].queue] >= 0) from[k++] = last[plan[u].queue];
        for (int q = 0; q < COLI_MAX_QUEUES; q++)
            if (plan[u].wait[q] >= 0) from[k++] = plan[u].wait[q];
        for (int32_t j = 0; j < k; j++) {
            before[u][from[j]] = 1;
            for (int32_t i = 0; i < u; i++) before[u][i] |= before[from[j]][i];
        }
        last[plan[u].queue] = u;
    }
}

static void random_units(int32_t n, int writes_in) {
    for (int32_t u = 0; u < n; u++) {
        units[u].spans = spans[u];
        units[u].n_spans = 1 + rand() % MAX_SPANS;
        for (int32_t s = 0; s < units[u].n_spans; s++) {
            const uintptr_t lo = (uintptr_t)(rand() % 400);
            spans[u][s].lo = lo;
            spans[u][s].hi = lo + 1 + (uintptr_t)(rand() % 24);
            spans[u][s].write = rand() % writes_in == 0;
        }
    }
}

int main(void) {
    srand(11);
    long pairs = 0;
    for (int it = 0; it < 1500; it++) {
        const int32_t n = 1 + rand() % MAX_UNITS, queues = 1 + it % COLI_MAX_QUEUES;
        random_units(n, 2 + it % 3);
        if (coli_plan_queues(units, n, queues, plan)) return printf("out of memory\n"), 1;
        close_order(n);
        for (int32_t u = 0; u < n; u++) {
            if (plan[u].queue < 0 || plan[u].queue >= queues) return printf("unit %d on queue %d of %d\n", u, plan[u].queue, queues), 1;
            for (int q = 0; q < COLI_MAX_QUEUES; q++)
                if (plan[u].wait[q] >= u || (plan[u].wait[q] >= 0 && !plan[plan[u].wait[q]].waited) ||
                    (queues == 1 && plan[u].wait[q] >= 0))
                    return printf("unit %d waits for %d on %d queue(s)\n", u, plan[u].wait[q], queues), 1;
            for (int32_t i = 0; i < u; i++)
                if (coli_units_conflict(&units[i], &units[u])) {
                    pairs++;
                    if (!before[u][i]) return printf("units %d and %d conflict but are not ordered (%d queues)\n", i, u, queues), 1;
                }
        }
    }
    printf("every conflicting pair ordered: %ld pairs\n", pairs);

    long apart = 0;
    for (int it = 0; it < 20000; it++) {
        coli_span xy[2];
        for (int k = 0; k < 2; k++) {
            const uintptr_t stride = it % 4 == 0 && k ? 0 : (uintptr_t)(it % 3 ? 12 : 4 + rand() % 12);
            xy[k].lo = (uintptr_t)(rand() % 60);
            xy[k].hi = xy[k].lo + 1 + (uintptr_t)(rand() % 60);
            xy[k].write = 1;
            xy[k].stride = stride;
            xy[k].width = stride ? 1 + (uintptr_t)rand() % stride : 0;
        }
        int bytes = 0;
        for (uintptr_t b = 0; b < 200 && !bytes; b++) {
            int held = 1;
            for (int k = 0; k < 2; k++)
                held &= b >= xy[k].lo && b < xy[k].hi && (!xy[k].stride || (b - xy[k].lo) % xy[k].stride < xy[k].width);
            bytes = held;
        }
        const int said = coli_spans_overlap(&xy[0], &xy[1]);
        if (bytes && !said) return printf("strided spans share a byte, said apart\n"), 1;
        const uintptr_t lo = xy[0].lo > xy[1].lo ? xy[0].lo : xy[1].lo, hi = xy[0].hi < xy[1].hi ? xy[0].hi : xy[1].hi;
        if (xy[0].stride && xy[0].stride == xy[1].stride && hi >= lo + 2 * xy[0].stride && said != bytes)
            return printf("strided spans of one stride said to overlap, share no byte\n"), 1;
        apart += !said && lo < hi;
    }
    printf("strided spans overlap where their bytes do: %ld told apart within one range\n", apart);

    /* one writer, then four readers of it that write apart, then one that reads all four */
    const int32_t n = 6;
    for (int32_t u = 0; u < n; u++) units[u].spans = spans[u];
    spans[0][0] = (coli_span){0, 100, 1, 0, 0};
    units[0].n_spans = 1;
    for (int32_t u = 1; u <= 4; u++) {
        spans[u][0] = (coli_span){0, 100, 0, 0, 0};
        spans[u][1] = (coli_span){(uintptr_t)(100 * u + 100), (uintptr_t)(100 * u + 200), 1, 0, 0};
        units[u].n_spans = 2;
    }
    spans[5][0] = (coli_span){200, 600, 0, 0, 0};
    units[5].n_spans = 1;
    if (coli_plan_queues(units, n, 4, plan)) return 1;
    int used[COLI_MAX_QUEUES] = {0};
    for (int32_t u = 1; u <= 4; u++) used[plan[u].queue]++;
    for (int q = 0; q < 4; q++)
        if (used[q] != 1) return printf("the fan-out shares queue %d among %d units\n", q, used[q]), 1;
    if (plan[1].queue != plan[0].queue) return printf("the first reader is not chained after the writer\n"), 1;
    close_order(n);
    for (int32_t i = 0; i < 5; i++)
        if (!before[5][i]) return printf("the join is not after unit %d\n", i), 1;
    printf("a fan-out of 4 takes 4 queues and the join waits for all\n");
    return 0;
}
