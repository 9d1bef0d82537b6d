#if !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#endif
#include "loader.h"
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
    int n = MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path, -1, NULL, 0);
    wchar_t *wide = n > 0 ? malloc((size_t)n * sizeof *wide) : NULL;
    if (!wide || !MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path, -1, wide, n)) {
        free(wide);
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

static int is_hip(const char *spec, const char *path) {
    const char *base = path + strlen(path);
    while (base > path && base[-1] != '/' && base[-1] != '\\') base--;
    const char *hip = coli_backend_file("hip");
#if defined(_WIN32)
    return !strcmp(spec, "hip") || !_stricmp(base, hip);
#else
    return !strcmp(spec, "hip") || !strcmp(base, hip);
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

static int open_resolved(const char *path, coli_backend *out, char *err, size_t errlen) {
    int kind = coli_path_kind(path);
    if (kind < 0) {
        snprintf(err, errlen, "backend %s does not exist", path);
        return 1;
    }
    if (kind != 0) {
        snprintf(err, errlen, "backend %s is not a regular file", path);
        return 1;
    }
    void *h = open_library(path, err, errlen);
    if (!h) return 1;
    for (size_t i = 0; i < COLI_SYMBOL_COUNT; i++) {
        void *sym = find_symbol(h, COLI_SYMBOLS[i].name);
        if (!sym && COLI_SYMBOLS[i].mandatory) {
            snprintf(err, errlen, "backend %s lacks the mandatory symbol %s", path, COLI_SYMBOLS[i].name);
            close_library(h);
            return 1;
        }
        /* Object and function pointers share a representation on every platform we load on. */
        memcpy((char *)&out->api + COLI_SYMBOLS[i].offset, &sym, sizeof sym);
    }
    uint32_t v = out->api.abi_version();
    if (!abi_compatible(v, COLI_ABI_MAJOR, needed_minor())) {
        snprintf(err, errlen, "backend %s has ABI %u.%u, this host needs %u.%u or a later minor", path,
                 (unsigned)(v >> 16), (unsigned)(v & 0xFFFF), (unsigned)COLI_ABI_MAJOR, (unsigned)needed_minor());
        close_library(h);
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

int coli_backend_open(const char *spec, coli_backend *out, char *err, size_t errlen) {
    char path[4096], why[1500];
    memset(out, 0, sizeof *out);
    if (!spec || !*spec) {
        snprintf(err, errlen, "[backend] no backend given");
        return 1;
    }
    if (resolve(spec, path, sizeof path, why, sizeof why)) {
        snprintf(err, errlen, "[backend] %s", why);
        return 1;
    }
    if (!is_hip(spec, path)) { /* CUDA and reference backends: COLI_HIP_RUNTIME_DIR plays no part */
        if (open_resolved(path, out, why, sizeof why)) {
            snprintf(err, errlen, "[backend] %s", why);
            return 1;
        }
        return 0;
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
    if (open_resolved(path, out, why, sizeof why)) {
        snprintf(err, errlen, "[HIP] %s", why);
        coli_hip_release(hip);
        free(hip);
        return 1;
    }
    /* the backend's own imports could have pulled in another runtime */
    if (coli_hip_verify(hip, "after the backend loaded", err, errlen)) {
        close_library(out->handle);
        memset(out, 0, sizeof *out);
        coli_hip_release(hip);
        free(hip);
        return 1;
    }
    out->hip = hip;
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
