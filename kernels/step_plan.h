/* Which ops of a recorded step may run at the same time, for a backend with
 * several queues (the GPU's streams). Each unit (an op, or ops the backend runs
 * as one kernel) is described by the byte spans it reads and writes; two units
 * conflict when a span of one overlaps a span of the other and either writes it.
 * The plan puts every unit on a queue and names the units of other queues it must
 * wait for, so that each unit runs after every earlier unit it conflicts with and
 * is otherwise free to run beside them. A unit goes on the queue whose last unit
 * is its latest dependency when there is one (the GPU then chains the two
 * launches), else on the queue that has waited longest. Plain C, host only. */
#ifndef COLI_STEP_PLAN_H
#define COLI_STEP_PLAN_H

#include <stdint.h>
#include <stdlib.h>

#define COLI_MAX_QUEUES 8

typedef struct coli_span {
    uintptr_t lo, hi; /* bytes [lo, hi) */
    int32_t write;
} coli_span;

typedef struct coli_unit {
    const coli_span *spans;
    int32_t n_spans;
} coli_unit;

typedef struct coli_unit_plan {
    int32_t queue;
    int32_t wait[COLI_MAX_QUEUES]; /* per queue: the unit whose end this one waits for, or -1 */
    int32_t waited;                /* a later unit waits for this one's end */
} coli_unit_plan;

static inline int coli_units_conflict(const coli_unit *a, const coli_unit *b) {
    for (int32_t i = 0; i < a->n_spans; i++)
        for (int32_t j = 0; j < b->n_spans; j++) {
            const coli_span *x = &a->spans[i], *y = &b->spans[j];
            if ((x->write || y->write) && x->lo < y->hi && y->lo < x->hi) return 1;
        }
    return 0;
}

/* Whether no unit of n writes a byte of `s`: what a step never changes (a norm's
 * weights), which a kernel launched before the one before it has ended may then load
 * before it waits for it. */
static inline int coli_span_unwritten(const coli_unit *units, int32_t n, const coli_span *s) {
    const coli_span read = {s->lo, s->hi, 0};
    const coli_unit reader = {&read, 1}; /* conflicts only with a unit that writes there */
    for (int32_t u = 0; u < n; u++)
        if (coli_units_conflict(&units[u], &reader)) return 0;
    return 1;
}

/* Plans n units on `queues` queues (1..COLI_MAX_QUEUES); 1 when out of host memory. */
static inline int coli_plan_queues(const coli_unit *units, int32_t n, int32_t queues, coli_unit_plan *plan) {
    /* after[u][q]: the latest unit of queue q that unit u is known to run after */
    int32_t(*after)[COLI_MAX_QUEUES] = (int32_t(*)[COLI_MAX_QUEUES])malloc((size_t)(n ? n : 1) * sizeof *after);
    int32_t tail[COLI_MAX_QUEUES];
    if (!after) return 1;
    if (queues < 1) queues = 1;
    if (queues > COLI_MAX_QUEUES) queues = COLI_MAX_QUEUES;
    for (int32_t q = 0; q < COLI_MAX_QUEUES; q++) tail[q] = -1;
    for (int32_t u = 0; u < n; u++) {
        int32_t latest[COLI_MAX_QUEUES], found = 0, pick = -1;
        for (int32_t q = 0; q < COLI_MAX_QUEUES; q++) latest[q] = -1;
        for (int32_t i = u - 1; i >= 0 && found < queues; i--) { /* the latest conflicting unit of each queue */
            const int32_t q = plan[i].queue;
            if (latest[q] < 0 && coli_units_conflict(&units[i], &units[u])) latest[q] = i, found++;
        }
        for (int32_t q = 0; q < queues; q++)
            if (latest[q] >= 0 && latest[q] == tail[q] && (pick < 0 || latest[q] > latest[pick])) pick = q;
        if (pick < 0)
            for (int32_t q = 0; q < queues; q++)
                if (pick < 0 || tail[q] < tail[pick]) pick = q;
        coli_unit_plan *p = &plan[u];
        p->queue = pick;
        p->waited = 0;
        for (int32_t q = 0; q < COLI_MAX_QUEUES; q++) {
            p->wait[q] = -1;
            after[u][q] = tail[pick] >= 0 ? after[tail[pick]][q] : -1;
        }
        for (int32_t q = 0; q < queues; q++) {
            if (q == pick || latest[q] <= after[u][q]) continue;
            p->wait[q] = latest[q];
            plan[latest[q]].waited = 1;
            for (int32_t x = 0; x < COLI_MAX_QUEUES; x++)
                if (after[latest[q]][x] > after[u][x]) after[u][x] = after[latest[q]][x];
        }
        after[u][pick] = u;
        tail[pick] = u;
    }
    free(after);
    return 0;
}

#endif
