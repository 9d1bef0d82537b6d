/* The backend loader: opens a backend library by absolute path, resolves the
 * ABI's function table, and checks the ABI version before anything is called. */
#ifndef COLI_LOADER_H
#define COLI_LOADER_H

#include <stddef.h>

#include "coli_backend_table.h"

typedef struct coli_backend {
    void *handle;           /* dlopen / HMODULE */
    coli_backend_api api;   /* optional entries may be NULL */
    char path[4096];
    char name[32];
} coli_backend;

/* 0 on success; otherwise fills `err` with one line and leaves nothing loaded. */
int coli_backend_open(const char *path, coli_backend *out, char *err, size_t errlen);
void coli_backend_close(coli_backend *b);

#endif
