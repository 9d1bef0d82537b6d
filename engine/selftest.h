/* Checks a loaded backend against the CPU path: every weight format at decode
 * and prefill shapes on fresh random inputs, and every bad-input status. */
#ifndef COLI_SELFTEST_H
#define COLI_SELFTEST_H

#include <stdio.h>

#include "loader.h"

/* Exit codes of `coli --selftest`: 3 means the backend loaded but its device
 * cannot start (no GPU here); 4 means the backend itself could not be loaded. */
enum { SELFTEST_PASSED = 0, SELFTEST_FAILED = 1, SELFTEST_UNAVAILABLE = 3, SELFTEST_LOAD_FAILED = 4 };

/* Which shapes it checks: the core set reaches every path of the CPU ops and the
 * reference backend; the gpu set adds the large shapes that pick each GPU kernel. */
typedef enum { SELFTEST_CORE_SHAPES, SELFTEST_GPU_SHAPES } selftest_shapes;

const char *selftest_shapes_name(selftest_shapes set);
int coli_selftest(coli_backend *b, int device, selftest_shapes set, int json, FILE *out);

#endif
