/* How the safetensors reader scales with a model's tensor count: writes a file of N
 * one-float tensors named as a large MoE model names its experts, then times opening it
 * (the header parsed and validated) and finding every tensor by name, as a model's load
 * does. Prints one JSON line a size.
 *
 *   gcc -std=c11 -O2 -Iengine bench/safetensors_lookup.c engine/safetensors.c engine/json.c \
 *       engine/utf8.c -o /tmp/st_lookup && /tmp/st_lookup /tmp/st_lookup.safetensors 10000 80000 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "safetensors.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void tensor_name(char *out, size_t len, long i) {
    static const char *const parts[] = {"gate_proj", "up_proj", "down_proj"};
    snprintf(out, len, "model.layers.%ld.mlp.experts.%ld.%s.weight", i / 768, i / 3 % 256, parts[i % 3]);
}

/* The file of n tensors; 0 on success. */
static int write_model(const char *path, long n) {
    size_t cap = (size_t)n * 128 + 64, len = 0;
    char *hdr = malloc(cap), name[96];
    if (!hdr) return 1;
    len += (size_t)snprintf(hdr + len, cap - len, "{");
    for (long i = 0; i < n; i++) {
        tensor_name(name, sizeof name, i);
        len += (size_t)snprintf(hdr + len, cap - len, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[%ld,%ld]}",
                                i ? "," : "", name, 4 * i, 4 * i + 4);
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    FILE *f = fopen(path, "wb");
    int rc = !f;
    if (f) {
        uint8_t size[8];
        for (int i = 0; i < 8; i++) size[i] = (uint8_t)((uint64_t)len >> (8 * i));
        const float zero = 0.0f;
        rc = fwrite(size, 1, 8, f) != 8 || fwrite(hdr, 1, len, f) != len;
        for (long i = 0; i < n && !rc; i++) rc = fwrite(&zero, sizeof zero, 1, f) != 1;
        rc |= fclose(f) != 0;
    }
    free(hdr);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "safetensors_lookup: want FILE N... (each N a tensor count in 1..1000000)\n");
        return 2;
    }
    for (int a = 2; a < argc; a++) {
        char *end = NULL;
        const long n = strtol(argv[a], &end, 10);
        if (end == argv[a] || *end || n < 1 || n > 1000000) {
            fprintf(stderr, "safetensors_lookup: N '%s' is not a tensor count in 1..1000000\n", argv[a]);
            return 2;
        }
    }
    for (int a = 2; a < argc; a++) {
        const long n = strtol(argv[a], NULL, 10);
        char err[512], name[96];
        if (write_model(argv[1], n)) {
            fprintf(stderr, "safetensors_lookup: cannot write %ld tensors to %s\n", n, argv[1]);
            return 1;
        }
        st_file file;
        double t0 = now();
        if (st_open(argv[1], &file, err, sizeof err)) {
            fprintf(stderr, "safetensors_lookup: %s\n", err);
            return 1;
        }
        const double opened = now() - t0;
        st_set set = {.files = &file, .nfiles = 1};
        t0 = now();
        long found = 0;
        for (long i = 0; i < n; i++) {
            tensor_name(name, sizeof name, i);
            found += st_find(&set, name) != NULL;
        }
        const double finding = now() - t0;
        st_close(&file);
        printf("{\"tensors\": %ld, \"open_seconds\": %.4f, \"find_all_seconds\": %.4f, \"found\": %ld}\n", n, opened,
               finding, found);
        if (found != n) return 1;
    }
    remove(argv[1]);
    return 0;
}
