/* backend_common.h's handle table under ASan/UBSan, against a model of what it
 * promises: an add takes the lowest free slot (a freed slot is reused before the
 * table grows), a handle carries its slot's generation, so a freed or stale handle
 * is refused while the slot's new handle is found, and a reset forgets every slot.
 * Random adds and removes, then 100,000 adds in a row (a wide MoE's tensor count),
 * the load whose slot search went over every live slot. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend_common.h"

#define SLOTS 64
#define MANY 100000

static int failures = 0;

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                                \
            printf(__VA_ARGS__);                                                                                       \
            printf("\n");                                                                                              \
            failures++;                                                                                                \
        }                                                                                                              \
    } while (0)

/* the model: which slots are live, and the handle each was last given */
static int live[SLOTS];
static uint64_t given[SLOTS];

static uint32_t lowest_free(void) {
    uint32_t i = 0;
    while (i < SLOTS && live[i]) i++;
    return i;
}

int main(void) {
    coli_table t = {0x7A7A, "tensor", NULL, 0, 0, 0, 0};
    int values[SLOTS];
    uint64_t stale[4 * SLOTS];
    int nstale = 0;
    srand(7);
    for (int step = 0; step < 20000; step++) {
        const uint32_t i = (uint32_t)(rand() % SLOTS);
        if (!live[i] && lowest_free() < SLOTS) { /* add: it must land in the lowest free slot */
            const uint32_t want = lowest_free();
            uint64_t h = 0;
            CHECK(coli_table_add(&t, &values[want], &h) == COLI_OK, "add at step %d", step);
            CHECK((uint32_t)h == want, "step %d: add took slot %u, the lowest free is %u", step, (uint32_t)h, want);
            live[want] = 1, given[want] = h;
        } else if (live[i]) { /* remove, keeping a few stale handles to try later */
            coli_table_remove(&t, given[i]);
            live[i] = 0;
            if (nstale < 4 * SLOTS) stale[nstale++] = given[i];
        }
        for (uint32_t k = 0; k < SLOTS && step % 97 == 0; k++) {
            void *p = NULL;
            if (live[k]) {
                CHECK(coli_table_find(&t, given[k], &p) == COLI_OK && p == &values[k], "slot %u lost", k);
            }
        }
        int count = 0;
        for (uint32_t k = 0; k < SLOTS; k++) count += live[k];
        CHECK(t.live == count, "step %d: %d live, the model %d", step, (int)t.live, count);
    }
    int refused = 0;
    for (int s = 0; s < nstale; s++) {
        void *p = NULL;
        const uint32_t k = (uint32_t)stale[s];
        if (live[k] && given[k] == stale[s]) continue; /* a handle given again after 65,535 reuses: none here */
        refused += coli_table_find(&t, stale[s], &p) == COLI_E_BAD_TENSOR;
    }
    CHECK(refused == nstale, "%d of %d stale handles refused", refused, nstale);
    printf("random adds and removes: the lowest free slot each time, %d stale handles refused\n", refused);

    coli_table_reset(&t);
    CHECK(t.count == 0 && t.live == 0 && t.first_free == 0, "reset left %u slots", t.count);
    int one = 0;
    for (uint32_t k = 0; k < MANY; k++) {
        uint64_t h = 0;
        if (coli_table_add(&t, &one, &h) != COLI_OK || (uint32_t)h != k) {
            CHECK(0, "add %u of %d took slot %u", k, MANY, (uint32_t)h);
            break;
        }
        if (k == MANY / 2) coli_table_remove(&t, h), coli_table_add(&t, &one, &h); /* freed and taken again */
    }
    CHECK(t.live == MANY, "%d live of %d", (int)t.live, MANY);
    printf("%d adds in a row: slots 0 to %d\n", MANY, MANY - 1);
    coli_table_reset(&t);
    if (failures) printf("%d failures\n", failures);
    return failures != 0;
}
