/* The records of ABI 2's buffers and steps, as every backend keeps them
 * (backend_steps.h fills and checks them; a backend's own step code reads them). */
#ifndef COLI_BACKEND_STEP_TYPES_H
#define COLI_BACKEND_STEP_TYPES_H

#include "backend_common.h"
#include "coli_ops.h"

typedef struct coli_buf {
    void *base;
    uint64_t bytes;
    int32_t holds; /* steps that use it */
} coli_buf;

/* An op as recorded: its operands resolved and held. */
typedef struct coli_rec_op {
    coli_op op;          /* op.tensors points at `tensors` */
    coli_tensor *tensors;
    coli_weight **w;     /* the tensors, resolved */
    coli_buf *buf[8];    /* NULL for an absent optional operand */
    void *p[8];          /* where each operand starts */
    uint64_t reach[8];   /* the bytes from p[k] the op may touch, at its largest position */
    int64_t max_pos;     /* the largest position every extent fits at */
} coli_rec_op;

typedef struct coli_rec {
    int ended;
    int32_t count, cap;
    coli_rec_op *ops;
    int64_t max_pos;
    void *impl; /* the backend's own: a captured graph */
} coli_rec;

#define COLI_NO_LIMIT INT64_MAX

#endif
