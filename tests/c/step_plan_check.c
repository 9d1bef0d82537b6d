/* The step planner (kernels/step_plan.h) on random units: every pair of units that
 * conflict is ordered by the plan (same queue, or a chain of waits), on 1 to 8
 * queues; one queue never waits; and a fan-out of independent units spreads over
 * the queues. Prints one line per property; exits 1 on the first failure. */
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

    /* what no unit writes, against a map of the bytes written */
    long unwritten = 0, written = 0;
    for (int it = 0; it < 500; it++) {
        const int32_t n = 1 + rand() % MAX_UNITS;
        random_units(n, 2 + it % 6);
        unsigned char hit[430] = {0};
        for (int32_t u = 0; u < n; u++)
            for (int32_t s = 0; s < units[u].n_spans; s++)
                if (spans[u][s].write) memset(hit + spans[u][s].lo, 1, spans[u][s].hi - spans[u][s].lo);
        for (int k = 0; k < 20; k++) {
            const uintptr_t lo = (uintptr_t)(rand() % 420);
            const coli_span probe = {lo, lo + 1 + (uintptr_t)(rand() % 8), 0};
            int any = 0;
            for (uintptr_t b = probe.lo; b < probe.hi; b++) any |= hit[b];
            if (coli_span_unwritten(units, n, &probe) == any)
                return printf("bytes [%lu, %lu) %s written, the planner says otherwise\n", (unsigned long)probe.lo,
                              (unsigned long)probe.hi, any ? "are" : "are not"), 1;
            any ? written++ : unwritten++;
        }
    }
    printf("unwritten spans found: %ld unwritten, %ld written\n", unwritten, written);

    /* one writer, then four readers of it that write apart, then one that reads all four */
    const int32_t n = 6;
    for (int32_t u = 0; u < n; u++) units[u].spans = spans[u];
    spans[0][0] = (coli_span){0, 100, 1};
    units[0].n_spans = 1;
    for (int32_t u = 1; u <= 4; u++) {
        spans[u][0] = (coli_span){0, 100, 0};
        spans[u][1] = (coli_span){(uintptr_t)(100 * u + 100), (uintptr_t)(100 * u + 200), 1};
        units[u].n_spans = 2;
    }
    spans[5][0] = (coli_span){200, 600, 0};
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
