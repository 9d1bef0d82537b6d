#if !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#endif
#include "utf8.h"

#include <stdlib.h>

#if defined(_WIN32)
#include <windows.h>
#include <shellapi.h>

static wchar_t *widen(const char *s) {
    int n = MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, s, -1, NULL, 0);
    wchar_t *w = n > 0 ? malloc((size_t)n * sizeof *w) : NULL;
    if (w && !MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, s, -1, w, n)) {
        free(w);
        return NULL;
    }
    return w;
}

char **coli_args_utf8(int *argc, char **argv) {
    int n = 0;
    wchar_t **w = CommandLineToArgvW(GetCommandLineW(), &n);
    if (!w) return argv;
    char **out = calloc((size_t)n + 1, sizeof *out);
    for (int i = 0; out && i < n; i++) {
        int len = WideCharToMultiByte(CP_UTF8, 0, w[i], -1, NULL, 0, NULL, NULL);
        out[i] = len > 0 ? malloc((size_t)len) : NULL;
        if (!out[i] || !WideCharToMultiByte(CP_UTF8, 0, w[i], -1, out[i], len, NULL, NULL)) {
            LocalFree(w);
            return argv;
        }
    }
    LocalFree(w);
    if (!out) return argv;
    *argc = n;
    return out;
}

FILE *coli_fopen(const char *path, const char *mode) {
    wchar_t *wp = widen(path), *wm = widen(mode);
    FILE *f = wp && wm ? _wfopen(wp, wm) : NULL;
    free(wp);
    free(wm);
    return f;
}

int coli_path_kind(const char *path) {
    wchar_t *w = widen(path);
    DWORD a = w ? GetFileAttributesW(w) : INVALID_FILE_ATTRIBUTES;
    free(w);
    if (a == INVALID_FILE_ATTRIBUTES) return -1;
    return (a & FILE_ATTRIBUTE_DIRECTORY) ? 1 : 0;
}
#else
#include <sys/stat.h>

char **coli_args_utf8(int *argc, char **argv) {
    (void)argc;
    return argv;
}

FILE *coli_fopen(const char *path, const char *mode) { return fopen(path, mode); }

int coli_path_kind(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    return S_ISDIR(st.st_mode) ? 1 : 0;
}
#endif

char *coli_read_file(const char *path, size_t *len) {
    FILE *f = coli_fopen(path, "rb");
    size_t cap = 4096, n = 0;
    char *buf = f ? malloc(cap) : NULL;
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *nb = cap < (64u << 20) ? realloc(buf, cap * 2) : NULL;
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    if (f) fclose(f);
    if (buf && len) *len = n;
    return buf;
}
