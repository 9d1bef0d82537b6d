#if !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#endif
#include "utf8.h"

#include <stdlib.h>

#if defined(_WIN32)
#include <string.h>
#include <windows.h>
#include <shellapi.h>

static wchar_t *widen_exact(const char *s) {
    int n = MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, s, -1, NULL, 0);
    wchar_t *w = n > 0 ? malloc((size_t)n * sizeof *w) : NULL;
    if (w && !MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, s, -1, w, n)) {
        free(w);
        return NULL;
    }
    return w;
}

static int is_wsep(wchar_t c) { return c == L'\\' || c == L'/'; }

wchar_t *coli_widen(const char *s) {
    wchar_t *w = widen_exact(s);
    size_t n = w ? wcslen(w) : 0;
    int drive = n >= 3 && w[1] == L':' && is_wsep(w[2]);
    int unc = n >= 3 && is_wsep(w[0]) && is_wsep(w[1]) && w[2] != L'?' && w[2] != L'.';
    if (n < MAX_PATH || !(drive || unc)) return w;
    /* the \\?\ form is taken literally: no "/" and no ".." are resolved in it */
    DWORD full = GetFullPathNameW(w, 0, NULL, NULL);
    wchar_t *abs = full ? malloc((size_t)(full + 8) * sizeof *abs) : NULL;
    if (!abs) {
        free(w);
        return NULL;
    }
    const wchar_t *prefix = unc ? L"\\\\?\\UNC" : L"\\\\?\\";
    size_t skip = unc ? 1 : 0; /* \\server\share -> \\?\UNC\server\share */
    size_t plen = wcslen(prefix);
    wmemcpy(abs, prefix, plen);
    DWORD got = GetFullPathNameW(w, full, abs + plen, NULL);
    free(w);
    if (!got || got >= full) {
        free(abs);
        return NULL;
    }
    if (skip) memmove(abs + plen, abs + plen + skip, (got - skip + 1) * sizeof *abs);
    return abs;
}

char *coli_narrow(const wchar_t *w) {
    int n = WideCharToMultiByte(CP_UTF8, 0, w, -1, NULL, 0, NULL, NULL);
    char *s = n > 0 ? malloc((size_t)n) : NULL;
    if (s && !WideCharToMultiByte(CP_UTF8, 0, w, -1, s, n, NULL, NULL)) {
        free(s);
        return NULL;
    }
    return s;
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
    wchar_t *wp = coli_widen(path), *wm = coli_widen(mode);
    FILE *f = wp && wm ? _wfopen(wp, wm) : NULL;
    free(wp);
    free(wm);
    return f;
}

int coli_path_kind(const char *path) {
    wchar_t *w = coli_widen(path);
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
