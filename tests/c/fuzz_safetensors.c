/* Feeds mutated safetensors files to the reader: every one must be either read
 * whole or refused with a message, never crash (run under ASan/UBSan).
 *
 *   fuzz_safetensors SEED_FILE WORK_DIR ITERATIONS [SEED]
 *
 * Mutations work on the header (where the parser and validator live): byte
 * flips, truncation, random digits in numbers, swapped brackets, duplicated
 * spans, a rewritten header-size field, and whole-file truncation. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

static uint64_t state;
static uint64_t rnd(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

static void mutate(uint8_t *buf, size_t *len, size_t header_end) {
    size_t h = header_end > 8 ? header_end : *len;
    int kind = (int)(rnd() % 8);
    size_t at = 8 + (size_t)(rnd() % (h > 8 ? h - 8 : 1));
    static const char tokens[] = "{}[]\",:0123456789-eE.nulltruefalse";
    switch (kind) {
    case 0: buf[at] ^= (uint8_t)(1u << (rnd() % 8)); break;
    case 1: buf[at] = (uint8_t)tokens[rnd() % (sizeof tokens - 1)]; break;
    case 2: buf[at] = (uint8_t)('0' + rnd() % 10); break;
    case 3: { /* the header size field */
        uint64_t n = rnd() % 4 == 0 ? rnd() : (header_end - 8) + (rnd() % 64) - 32;
        for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(n >> (8 * i));
        break;
    }
    case 4: *len = rnd() % (*len + 1); break;
    case 5: { /* copy a span over another */
        size_t src = 8 + (size_t)(rnd() % (h - 8)), n = 1 + rnd() % 16;
        if (src + n <= *len && at + n <= *len) memmove(buf + at, buf + src, n);
        break;
    }
    case 6: buf[at] = (uint8_t)(rnd() & 0xFF); break;
    default: { /* a large number */
        const char *big = "99999999999999999999";
        size_t n = strlen(big);
        if (at + n <= h) memcpy(buf + at, big, n);
    }
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: fuzz_safetensors SEED_FILE WORK_DIR ITERATIONS [SEED]\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", argv[1]);
        return 2;
    }
    fseek(f, 0, SEEK_END);
    size_t size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *orig = malloc(size), *buf = malloc(size);
    if (!orig || !buf || fread(orig, 1, size, f) != size) return 2;
    fclose(f);
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--) hn = (hn << 8) | orig[i];
    size_t header_end = (size_t)(8 + hn);
    long iterations = strtol(argv[3], NULL, 10);
    state = argc > 4 ? strtoull(argv[4], NULL, 10) | 1 : 0x2545F4914F6CDD1DULL;
    char path[4096], err[1024];
    snprintf(path, sizeof path, "%s/fuzz.safetensors", argv[2]);
    long accepted = 0, refused = 0;
    for (long it = 0; it < iterations; it++) {
        size_t len = size;
        memcpy(buf, orig, size);
        int rounds = 1 + (int)(rnd() % 4);
        for (int r = 0; r < rounds; r++) mutate(buf, &len, header_end);
        FILE *o = fopen(path, "wb");
        if (!o || fwrite(buf, 1, len, o) != len) return 2;
        fclose(o);
        st_file sf;
        err[0] = 0;
        if (st_open(path, &sf, err, sizeof err) == 0) {
            /* a file accepted must be fully readable: touch every tensor */
            volatile uint8_t sink = 0;
            for (size_t i = 0; i < sf.count; i++)
                for (size_t b = 0; b < sf.tensors[i].nbytes; b += 64) sink ^= sf.tensors[i].data[b];
            (void)sink;
            st_close(&sf);
            accepted++;
        } else {
            if (!err[0] || strchr(err, '\n')) {
                fprintf(stderr, "iteration %ld: refused without a one-line message\n", it);
                return 1;
            }
            refused++;
        }
    }
    printf("{\"iterations\": %ld, \"accepted\": %ld, \"refused\": %ld}\n", iterations, accepted, refused);
    free(orig);
    free(buf);
    return 0;
}
