#if !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#endif
#include "loader.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#if defined(_WIN32)
#include <windows.h>
#else
#include <dlfcn.h>
#endif

static int is_absolute(const char *p) {
#if defined(_WIN32)
    return (((p[0] | 0x20) >= 'a' && (p[0] | 0x20) <= 'z') && p[1] == ':' && (p[2] == '\\' || p[2] == '/')) ||
           (p[0] == '\\' && p[1] == '\\');
#else
    return p[0] == '/';
#endif
}

/* A function, not an inline comparison: with minor 0 the test is constant. */
static int abi_compatible(uint32_t version, uint32_t major, uint32_t minor) {
    return (version >> 16) == major && (version & 0xFFFF) >= minor;
}

static void *open_library(const char *path, char *err, size_t errlen) {
#if defined(_WIN32)
    wchar_t wide[32768];
    if (!MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path, -1, wide, 32768)) {
        snprintf(err, errlen, "backend path is not valid UTF-8: %s", path);
        return NULL;
    }
    HMODULE h = LoadLibraryExW(wide, NULL, LOAD_WITH_ALTERED_SEARCH_PATH);
    if (!h) snprintf(err, errlen, "cannot load %s (Windows error %lu)", path, (unsigned long)GetLastError());
    return (void *)h;
#else
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) snprintf(err, errlen, "cannot load %s: %s", path, dlerror());
    return h;
#endif
}

static void *find_symbol(void *h, const char *name) {
#if defined(_WIN32)
    return (void *)GetProcAddress((HMODULE)h, name);
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

int coli_backend_open(const char *path, coli_backend *out, char *err, size_t errlen) {
    struct stat st;
    memset(out, 0, sizeof *out);
    if (!path || !*path) {
        snprintf(err, errlen, "no backend path given");
        return 1;
    }
    if (!is_absolute(path)) {
        snprintf(err, errlen, "backend path must be absolute, got '%s'", path);
        return 1;
    }
    if (strlen(path) >= sizeof out->path) {
        snprintf(err, errlen, "backend path is longer than %zu bytes", sizeof out->path - 1);
        return 1;
    }
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "backend %s does not exist", path);
        return 1;
    }
    if (!S_ISREG(st.st_mode)) {
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
    if (!abi_compatible(v, COLI_ABI_MAJOR, COLI_ABI_MINOR)) {
        snprintf(err, errlen, "backend %s has ABI %u.%u, this host needs %u.%u or a later minor", path,
                 (unsigned)(v >> 16), (unsigned)(v & 0xFFFF), (unsigned)COLI_ABI_MAJOR, (unsigned)COLI_ABI_MINOR);
        close_library(h);
        return 1;
    }
    out->handle = h;
    snprintf(out->path, sizeof out->path, "%s", path);
    snprintf(out->name, sizeof out->name, "%s", out->api.backend_name());
    return 0;
}

void coli_backend_close(coli_backend *b) {
    if (b->handle) {
        b->api.backend_shutdown();
        close_library(b->handle);
    }
    memset(b, 0, sizeof *b);
}
