#if !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#endif
#include "loader.h"
#include "imports.h"
#include "utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)
#include <windows.h>
#define STYLE PATH_STYLE_WINDOWS
#else
#include <dlfcn.h>
#define STYLE PATH_STYLE_POSIX
#endif

static const char *const APIS[] = {"ref", "cuda", "hip"};

const char *coli_backend_file(const char *api) {
#if defined(_WIN32)
    static const char *const files[] = {"coli_ref.dll", "coli_cuda.dll", "coli_hip.dll"};
#else
    static const char *const files[] = {"libcoli_ref.so", "libcoli_cuda.so", "libcoli_hip.so"};
#endif
    for (size_t i = 0; i < sizeof APIS / sizeof APIS[0]; i++)
        if (!strcmp(api, APIS[i])) return files[i];
    return NULL;
}

/* The oldest minor this host runs: the newest that introduced a mandatory function.
 * An optional function a backend's minor predates is left out (NULL), so a host
 * runs any backend of its major from that minor on (abi.toml's rule). */
static uint32_t needed_minor(void) {
    uint32_t need = 0;
    for (size_t i = 0; i < COLI_SYMBOL_COUNT; i++)
        if (COLI_SYMBOLS[i].mandatory && (uint32_t)COLI_SYMBOLS[i].since_minor > need)
            need = (uint32_t)COLI_SYMBOLS[i].since_minor;
    return need;
}

/* A function, not an inline comparison: with minor 0 the test is constant. */
static int abi_compatible(uint32_t version, uint32_t major, uint32_t minor) {
    return (version >> 16) == major && (version & 0xFFFF) >= minor;
}

static void *open_library(const char *path, char *err, size_t errlen) {
#if defined(_WIN32)
    wchar_t *wide = coli_widen(path);
    if (!wide) {
        snprintf(err, errlen, "backend path is not valid UTF-8: %s", path);
        return NULL;
    }
    /* absolute path; its own folder first for its dependencies; never a bare name */
    HMODULE h = LoadLibraryExW(wide, NULL, LOAD_WITH_ALTERED_SEARCH_PATH);
    free(wide);
    if (!h) {
        char why[600];
        coli_loader_error(path, why, sizeof why);
        snprintf(err, errlen, "cannot load %s: %s", path, why);
    }
    return (void *)h;
#else
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) snprintf(err, errlen, "cannot load %s: %s", path, dlerror());
    return h;
#endif
}

static void *find_symbol(void *h, const char *name) {
#if defined(_WIN32)
    FARPROC f = GetProcAddress((HMODULE)h, name);
    void *p;
    memcpy(&p, &f, sizeof p); /* function and object pointers share a representation on Windows x64 */
    return p;
#else
    return dlsym(h, name);
#endif
}

static void close_library(void *h) {
#if defined(_WIN32)
    FreeLibrary((HMODULE)h);
#else
    dlclose(h);
#endif
}

/* Whether two runtime file names are one: Windows compares them without case. */
static int same_runtime_name(const char *a, const char *b) {
#if defined(_WIN32)
    return !_stricmp(a, b);
#else
    return !strcmp(a, b);
#endif
}

static int resolve(const char *spec, char *path, size_t pathlen, char *err, size_t errlen) {
    const char *file = coli_backend_file(spec);
    if (file) {
        char dir[4096];
        if (coli_exe_dir(dir, sizeof dir) || coli_path_join(dir, file, STYLE, path, pathlen)) {
            snprintf(err, errlen, "cannot find the executable's own folder to load %s from", file);
            return 1;
        }
        return 0;
    }
    if (coli_runtime_dir_form(spec, STYLE) != DIR_OK) {
        snprintf(err, errlen, "backend must be ref, cuda, hip or an absolute path, got '%s'", spec);
        return 1;
    }
    if (snprintf(path, pathlen, "%s", spec) >= (int)pathlen) {
        snprintf(err, errlen, "backend path is longer than %zu bytes", pathlen - 1);
        return 1;
    }
    return 0;
}

/* Maps the backend at `path` (a regular file) without resolving or calling anything in it. */
static void *map_backend(const char *path, char *err, size_t errlen) {
    int kind = coli_path_kind(path);
    if (kind < 0) {
        snprintf(err, errlen, "backend %s does not exist", path);
        return NULL;
    }
    if (kind != 0) {
        snprintf(err, errlen, "backend %s is not a regular file", path);
        return NULL;
    }
    return open_library(path, err, errlen);
}

/* The mapped backend's functions, its ABI checked: the first of its code to run. */
static int resolve_backend(void *h, const char *path, coli_backend *out, char *err, size_t errlen) {
    for (size_t i = 0; i < COLI_SYMBOL_COUNT; i++) {
        void *sym = find_symbol(h, COLI_SYMBOLS[i].name);
        if (!sym && COLI_SYMBOLS[i].mandatory) {
            snprintf(err, errlen, "backend %s lacks the mandatory symbol %s", path, COLI_SYMBOLS[i].name);
            return 1;
        }
        /* Object and function pointers share a representation on every platform we load on. */
        memcpy((char *)&out->api + COLI_SYMBOLS[i].offset, &sym, sizeof sym);
    }
    uint32_t v = out->api.abi_version();
    if (!abi_compatible(v, COLI_ABI_MAJOR, needed_minor())) {
        snprintf(err, errlen, "backend %s has ABI %u.%u, this host needs %u.%u or a later minor", path,
                 (unsigned)(v >> 16), (unsigned)(v & 0xFFFF), (unsigned)COLI_ABI_MAJOR, (unsigned)needed_minor());
        return 1;
    }
    for (size_t i = 0; i < COLI_SYMBOL_COUNT; i++) /* what a backend of an older minor exports by chance is not its ABI */
        if (!COLI_SYMBOLS[i].mandatory && (uint32_t)COLI_SYMBOLS[i].since_minor > (v & 0xFFFF))
            memset((char *)&out->api + COLI_SYMBOLS[i].offset, 0, sizeof(void *));
    out->handle = h;
    snprintf(out->path, sizeof out->path, "%s", path);
    snprintf(out->name, sizeof out->name, "%s", out->api.backend_name());
    return 0;
}

/* HIP mode: the backend at `path` imports the HIP runtime `runtime`. */
static int open_hip(const char *path, const char *runtime, coli_backend *out, char *err, size_t errlen) {
    char why[1500];
    if (!same_runtime_name(runtime, COLI_HIP_RUNTIME_NAME)) {
        snprintf(err, errlen,
                 "[HIP] backend %s imports %s, but this host binds %s (built against another HIP SDK); "
                 "use the host and backend of one package",
                 path, runtime, COLI_HIP_RUNTIME_NAME);
        return 1;
    }
    coli_hip_binding *hip = calloc(1, sizeof *hip);
    if (!hip) {
        snprintf(err, errlen, "[HIP] out of memory");
        return 1;
    }
    if (coli_hip_bind(hip, err, errlen)) {
        free(hip);
        return 1;
    }
    void *h = map_backend(path, why, sizeof why);
    if (!h) {
        snprintf(err, errlen, "[HIP] %s", why);
    } else if (coli_hip_verify(hip, "after the backend mapped", err, errlen)) {
        /* its own imports pulled in another runtime: refused before any of its code runs */
    } else if (resolve_backend(h, path, out, why, sizeof why)) {
        snprintf(err, errlen, "[HIP] %s", why);
    } else {
        out->hip = hip;
        return 0;
    }
    if (h) close_library(h);
    memset(out, 0, sizeof *out);
    coli_hip_release(hip);
    free(hip);
    return 1;
}

/* The order is the seed's: read what the backend imports (its file, nothing mapped
 * yet); in HIP mode bind the runtime; map the backend; check the mapped runtimes
 * again; and only then resolve the backend's functions and call the first of them.
 * After any refusal the backend is unmapped, none of its code has run, and the
 * runtime reference this host took is given back. */
int coli_backend_open(const char *spec, coli_backend *out, char *err, size_t errlen) {
    char path[4096], why[1500], runtime[512];
    memset(out, 0, sizeof *out);
    if (!spec || !*spec) {
        snprintf(err, errlen, "[backend] no backend given");
        return 1;
    }
    if (resolve(spec, path, sizeof path, why, sizeof why)) {
        snprintf(err, errlen, "[backend] %s", why);
        return 1;
    }
    if (coli_path_kind(path) == 0) {
        /* HIP mode is what the backend imports, not its name or how it was given */
        int hip_mode = coli_hip_import(path, runtime, sizeof runtime, why, sizeof why);
        if (hip_mode < 0) {
            snprintf(err, errlen, "[backend] cannot load %s: %s", path, why);
            return 1;
        }
        if (hip_mode) return open_hip(path, runtime, out, err, errlen);
    }
    void *h = map_backend(path, why, sizeof why);
    if (!h || resolve_backend(h, path, out, why, sizeof why)) {
        if (h) close_library(h);
        memset(out, 0, sizeof *out);
        snprintf(err, errlen, "[backend] %s", why);
        return 1;
    }
    return 0;
}

void coli_backend_close(coli_backend *b) {
    if (b->handle) {
        b->api.backend_shutdown();
        close_library(b->handle);
    }
    if (b->hip) { /* reverse order: the backend, then the runtime it bound to */
        coli_hip_release(b->hip);
        free(b->hip);
    }
    memset(b, 0, sizeof *b);
}
