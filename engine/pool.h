/* A fixed pool of worker threads that splits a range of rows among them. The
 * split never changes what a row computes, so results do not depend on --threads. */
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

#endif
