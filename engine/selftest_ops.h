/* The selftest of ABI 2's step ops: each op, run alone as a one-op step on
 * random inputs, against its CPU definition (kernels/cpu_model_ops.c), at
 * positions where it matters; and the buffer and step calls' bad inputs. */
#ifndef COLI_SELFTEST_OPS_H
#define COLI_SELFTEST_OPS_H

#include "loader.h"

typedef struct op_check {
    const char *op;
    char what[96];  /* the shape, in words */
    double err;     /* max |y - ref| / max |ref|; for ids and masks, the count that differ */
    int exact;      /* err counts differing ids or mask entries: it must be 0 */
    int status;
    char message[256];
} op_check;

typedef struct bad_case {
    const char *name;
    int expected;
    int got;
    char message[256];
} bad_case;

enum { OP_CHECKS_MAX = 48 };

/* Records one bad-input case: the call's status against the one wanted, and the
 * backend's reason (a case passes only with both right). */
#define SELFTEST_CASE(cases, n, b, label, want, call)                                       \
    do {                                                                                    \
        (cases)[n].name = (label);                                                          \
        (cases)[n].expected = (want);                                                       \
        (cases)[n].got = (call);                                                            \
        snprintf((cases)[n].message, sizeof (cases)[n].message, "%s", (b)->api.last_error()); \
        (n)++;                                                                              \
    } while (0)

/* The selftest's random numbers: uniform in [-1, 1), the same sequence every run. */
float selftest_rnd(void);

/* Runs every op check into checks[0..); returns how many. */
int selftest_ops(coli_backend *b, op_check *checks);

/* The buffer and step calls' bad inputs into cases[0..); returns how many. */
int selftest_step_bad_inputs(coli_backend *b, bad_case *cases);

/* The op check passed: its status is 0 and its error within tolerance (0 for exact ones). */
int op_check_ok(const op_check *c, double tolerance);

#endif
