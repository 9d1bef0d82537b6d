/* Checks a loaded backend against the CPU path: every weight format at decode
 * and prefill shapes on fresh random inputs, and every bad-input status. */
#ifndef COLI_SELFTEST_H
#define COLI_SELFTEST_H

#include <stdio.h>

#include "loader.h"

/* Exit codes of `coli --selftest`: 3 means the backend loaded but its device
 * cannot start (no GPU here); 4 means the backend itself could not be loaded. */
enum { SELFTEST_PASSED = 0, SELFTEST_FAILED = 1, SELFTEST_UNAVAILABLE = 3, SELFTEST_LOAD_FAILED = 4 };

int coli_selftest(coli_backend *b, int device, int json, FILE *out);

#endif
