/* A running FNV-1a hash of float outputs' bits, printed by a check so that two runs
 * (two SIMD levels, say) can be compared bit for bit. */
#ifndef COLI_TESTS_BITS_HASH_H
#define COLI_TESTS_BITS_HASH_H

#include <stdint.h>
#include <string.h>

static uint64_t hash = 1469598103934665603ull;

static void mix(const float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &v[i], sizeof b);
        hash = (hash ^ b) * 1099511628211ull;
    }
}

#endif
