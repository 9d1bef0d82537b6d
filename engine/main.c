/* coli: the engine's host executable. This first CLI loads a backend and checks
 * it against the CPU path; the model engine builds on the same loader. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader.h"
#include "selftest.h"

#ifndef COLI_VERSION
#define COLI_VERSION "0.0.0"
#endif

static const char USAGE[] =
    "usage: coli --backend PATH --selftest [--json] [--device N]\n"
    "       coli --version\n"
    "  --backend PATH  backend library, by absolute path\n"
    "  --selftest      check every backend op against the CPU path\n"
    "  --json          one JSON object on stdout\n"
    "  --device N      device index (default 0)\n";

static int usage_error(const char *what, const char *arg) {
    fprintf(stderr, "coli: %s%s%s (see coli --help)\n", what, arg ? ": " : "", arg ? arg : "");
    return 2;
}

int main(int argc, char **argv) {
    const char *backend = NULL;
    int selftest = 0, json = 0, device = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(USAGE, stdout);
            return 0;
        } else if (!strcmp(a, "--version")) {
            printf("coli %s (backend ABI %d.%d)\n", COLI_VERSION, COLI_ABI_MAJOR, COLI_ABI_MINOR);
            return 0;
        } else if (!strcmp(a, "--backend")) {
            if (++i >= argc) return usage_error("--backend needs a path", NULL);
            backend = argv[i];
        } else if (!strcmp(a, "--device")) {
            char *end;
            if (++i >= argc) return usage_error("--device needs a number", NULL);
            device = (int)strtol(argv[i], &end, 10);
            if (*end || device < 0) return usage_error("--device must be a non-negative integer", argv[i]);
        } else if (!strcmp(a, "--selftest")) {
            selftest = 1;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else {
            return usage_error("unknown option", a);
        }
    }
    if (!selftest) return usage_error("nothing to do: give --selftest", NULL);
    if (!backend) return usage_error("--selftest needs --backend PATH", NULL);

    coli_backend b;
    char err[1024];
    if (coli_backend_open(backend, &b, err, sizeof err) != 0) {
        if (json) printf("{\"backend\": null, \"available\": false, \"passed\": false}\n");
        fprintf(stderr, "[backend] %s; GPU tier disabled (CPU path remains active)\n", err);
        return SELFTEST_LOAD_FAILED;
    }
    int rc = coli_selftest(&b, device, json, stdout);
    coli_backend_close(&b);
    return rc;
}
