/* The backend loader: opens a backend library by absolute path, resolves the
 * ABI's function table, and checks the ABI version before anything is called.
 * A backend named by API (ref, cuda, hip) is loaded from the executable's own
 * folder; in HIP mode the runtime is bound first (hip_binding.h). */
#ifndef COLI_LOADER_H
#define COLI_LOADER_H

#include <stddef.h>

#include "coli_backend_table.h"
#include "hip_binding.h"

typedef struct coli_backend {
    void *handle;           /* dlopen / HMODULE */
    coli_backend_api api;   /* optional entries may be NULL */
    char path[4096];
    char name[32];
    coli_hip_binding *hip;  /* HIP mode: the bound runtime, released after the backend */
} coli_backend;

/* The file name of each API's backend on this platform: coli_hip.dll, libcoli_hip.so. */
const char *coli_backend_file(const char *api);

/* 0 on success; otherwise `err` holds one line ("[HIP] ..." or "[backend] ...")
 * and nothing stays loaded. `spec` is ref, cuda or hip (from the executable's
 * folder), or an absolute path. */
int coli_backend_open(const char *spec, coli_backend *out, char *err, size_t errlen);
void coli_backend_close(coli_backend *b);

#endif
