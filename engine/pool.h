/* A fixed pool of worker threads that splits a range of rows among them: each starts
 * on a contiguous share by its measured speed, and one done with its own takes the
 * rest of a slower one's from its end. The split never changes what a row computes,
 * so results depend neither on --threads nor on who ran which rows. A job's function
 * may be called several times a thread, on any ranges that cover the job once. */
#ifndef COLI_POOL_H
#define COLI_POOL_H

#include <stdint.h>

typedef void (*pool_fn)(void *ctx, int64_t begin, int64_t end);

typedef struct pool pool;

/* NULL when threads <= 1 or on failure: pool_run then runs inline. */
pool *pool_create(int threads);
void pool_destroy(pool *p);
void pool_run(pool *p, pool_fn fn, void *ctx, int64_t n);
int pool_threads(const pool *p);
/* The threads' speeds forgotten (even shares again): after work unlike what follows. */
void pool_forget(pool *p);

/* The item in slot i of n, slots taken in the order 0, n - 1, 1, n - 2, ...: each thread
 * starts on a contiguous range of slots, so where later items cost more (a prefill's later
 * queries see more keys) this pairs a cheap item with a dear one and the ranges carry
 * even work. */
static inline int64_t pool_balanced(int64_t i, int64_t n) { return i % 2 ? n - 1 - i / 2 : i / 2; }

#endif
