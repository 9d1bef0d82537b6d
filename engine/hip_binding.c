#if !defined(_WIN32)
#define _GNU_SOURCE /* dl_iterate_phdr */
#endif
#include "hip_binding.h"
#include "utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)
#include <windows.h>
#include <tlhelp32.h>
#else
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>
#endif


/* ---- pure helpers ------------------------------------------------------- */

static int is_sep(char c, path_style style) { return c == '/' || (style == PATH_STYLE_WINDOWS && c == '\\'); }

dir_form coli_runtime_dir_form(const char *v, path_style style) {
    if (!v) return DIR_UNSET;
    if (!*v) return DIR_EMPTY;
    if (style == PATH_STYLE_POSIX) return v[0] == '/' ? DIR_OK : DIR_RELATIVE;
    int letter = ((v[0] | 0x20) >= 'a' && (v[0] | 0x20) <= 'z');
    if (letter && v[1] == ':') return is_sep(v[2], style) ? DIR_OK : DIR_DRIVE_RELATIVE;
    if (is_sep(v[0], style)) return is_sep(v[1], style) ? DIR_OK : DIR_ROOT_RELATIVE; /* \\server or \\?\ */
    return DIR_RELATIVE;
}

int coli_path_join(const char *dir, const char *name, path_style style, char *out, size_t outlen) {
    size_t n = strlen(dir);
    while (n > 0 && is_sep(dir[n - 1], style)) n--;
    while (*name && is_sep(*name, style)) name++;
    char sep = style == PATH_STYLE_WINDOWS ? '\\' : '/';
    int w = snprintf(out, outlen, "%.*s%c%s", (int)n, dir, sep, name);
    return w < 0 || (size_t)w >= outlen;
}

id_compare coli_file_id_compare(const coli_file_id *a, const coli_file_id *b) {
    if (a->format == FILE_ID_NONE || b->format == FILE_ID_NONE || a->format != b->format) return ID_UNKNOWN;
    return a->volume == b->volume && memcmp(a->id, b->id, sizeof a->id) == 0 ? ID_SAME : ID_DIFFERENT;
}

bind_decision coli_bind_decide(int inventory_ok, int mapped, id_compare single) {
    if (!inventory_ok || mapped < 0) return BIND_REJECT_UNVERIFIABLE;
    if (mapped == 0) return BIND_LOAD;
    if (mapped > 1) return BIND_REJECT_MULTIPLE;
    if (single == ID_SAME) return BIND_REUSE;
    if (single == ID_DIFFERENT) return BIND_REJECT_DIFFERENT;
    return BIND_REJECT_UNVERIFIABLE;
}

const char *coli_bind_decision_name(bind_decision d) {
    static const char *names[] = {"load", "reuse", "reject-different", "reject-multiple", "reject-unverifiable"};
    return names[d];
}

/* ---- platform: Windows ---------------------------------------------------- */

#if defined(_WIN32)

#define STYLE PATH_STYLE_WINDOWS

static wchar_t *widen(const char *s) {
    int n = MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, s, -1, NULL, 0);
    if (n <= 0) return NULL;
    wchar_t *w = malloc((size_t)n * sizeof *w);
    if (w && !MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, s, -1, w, n)) {
        free(w);
        return NULL;
    }
    return w;
}

static char *narrow(const wchar_t *w) {
    int n = WideCharToMultiByte(CP_UTF8, 0, w, -1, NULL, 0, NULL, NULL);
    if (n <= 0) return NULL;
    char *s = malloc((size_t)n);
    if (s && !WideCharToMultiByte(CP_UTF8, 0, w, -1, s, n, NULL, NULL)) {
        free(s);
        return NULL;
    }
    return s;
}

/* An environment variable as UTF-8; *set = 0 when it does not exist. */
static char *read_env(const char *name, int *set) {
    wchar_t *wname = widen(name);
    *set = 0;
    if (!wname) return NULL;
    SetLastError(0);
    DWORD n = GetEnvironmentVariableW(wname, NULL, 0);
    if (n == 0) {
        *set = GetLastError() != ERROR_ENVVAR_NOT_FOUND;
        free(wname);
        return *set ? calloc(1, 1) : NULL;
    }
    wchar_t *buf = malloc((size_t)n * sizeof *buf);
    char *out = NULL;
    if (buf && GetEnvironmentVariableW(wname, buf, n) < n) {
        out = narrow(buf);
        *set = 1;
    }
    free(buf);
    free(wname);
    return out;
}

static int id_from_handle(HANDLE h, file_id_format want, coli_file_id *out) {
    memset(out, 0, sizeof *out);
    if (want != FILE_ID_LEGACY) {
        FILE_ID_INFO info;
        if (GetFileInformationByHandleEx(h, FileIdInfo, &info, sizeof info)) {
            out->format = FILE_ID_EXTENDED;
            out->volume = info.VolumeSerialNumber;
            memcpy(out->id, &info.FileId, sizeof info.FileId);
            return 0;
        }
        if (want == FILE_ID_EXTENDED) return -1;
    }
    BY_HANDLE_FILE_INFORMATION bh;
    if (!GetFileInformationByHandle(h, &bh)) return -1;
    out->format = FILE_ID_LEGACY;
    out->volume = bh.dwVolumeSerialNumber;
    uint64_t index = ((uint64_t)bh.nFileIndexHigh << 32) | bh.nFileIndexLow;
    memcpy(out->id, &index, sizeof index);
    return 0;
}

static int id_from_wide_path(const wchar_t *path, file_id_format want, coli_file_id *out) {
    HANDLE h = CreateFileW(path, 0, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, NULL, OPEN_EXISTING,
                           FILE_FLAG_BACKUP_SEMANTICS, NULL);
    if (h == INVALID_HANDLE_VALUE) return -1;
    int rc = id_from_handle(h, want, out);
    CloseHandle(h);
    return rc;
}

int coli_file_identity(const char *path, file_id_format want, coli_file_id *out) {
    wchar_t *w = widen(path);
    int rc = w ? id_from_wide_path(w, want, out) : -1;
    free(w);
    if (rc) memset(out, 0, sizeof *out);
    return rc;
}

/* GetModuleFileNameW with a growing buffer: no MAX_PATH limit. */
static wchar_t *module_path(HMODULE m) {
    DWORD cap = 512;
    for (;;) {
        wchar_t *buf = malloc(cap * sizeof *buf);
        if (!buf) return NULL;
        DWORD n = GetModuleFileNameW(m, buf, cap);
        if (n == 0) {
            free(buf);
            return NULL;
        }
        if (n < cap) return buf;
        free(buf);
        if (cap >= 32768 * 2) return NULL;
        cap *= 2;
    }
}

int coli_runtime_inventory(const char *name, file_id_format format, coli_mapped_runtime *out, int max) {
    wchar_t *wname = widen(name);
    HANDLE snap = INVALID_HANDLE_VALUE;
    if (!wname) return -1;
    /* ERROR_BAD_LENGTH: the module list changed while it was read; try again */
    for (int attempt = 0; attempt < 16 && snap == INVALID_HANDLE_VALUE; attempt++) {
        snap = CreateToolhelp32Snapshot(TH32CS_SNAPMODULE | TH32CS_SNAPMODULE32, GetCurrentProcessId());
        if (snap == INVALID_HANDLE_VALUE && GetLastError() != ERROR_BAD_LENGTH) break;
    }
    if (snap == INVALID_HANDLE_VALUE) {
        free(wname);
        return -1;
    }
    MODULEENTRY32W me;
    me.dwSize = sizeof me;
    int count = 0, failed = 0;
    if (!Module32FirstW(snap, &me)) failed = GetLastError() != ERROR_NO_MORE_FILES;
    else
        do {
            if (_wcsicmp(me.szModule, wname) != 0) continue;
            if (count < max) {
                coli_mapped_runtime *m = &out[count];
                wchar_t *path = module_path(me.hModule);
                char *text = path ? narrow(path) : NULL;
                if (!path || id_from_wide_path(path, format, &m->id)) memset(&m->id, 0, sizeof m->id);
                snprintf(m->path, sizeof m->path, "%s", text ? text : "(its path cannot be read)");
                free(text);
                free(path);
            }
            count++;
        } while (Module32NextW(snap, &me));
    if (!failed && GetLastError() != ERROR_NO_MORE_FILES) failed = 1;
    CloseHandle(snap);
    free(wname);
    return failed ? -1 : count;
}

/* One more counted reference to the module mapped from `path` (never a second
 * mapping: GetModuleHandleEx finds the module by that exact path). */
static void *reference_mapped(const char *path) {
    wchar_t *w = widen(path);
    HMODULE h = NULL;
    if (w && !GetModuleHandleExW(0, w, &h)) h = NULL;
    free(w);
    return (void *)h;
}

int coli_exe_dir(char *out, size_t outlen) {
    wchar_t *w = module_path(NULL);
    if (!w) return 1;
    wchar_t *slash = wcsrchr(w, L'\\');
    if (slash) *slash = 0;
    char *s = narrow(w);
    free(w);
    if (!s) return 1;
    int rc = snprintf(out, outlen, "%s", s) >= (int)outlen;
    free(s);
    return rc;
}

static void *open_runtime(const char *path) {
    wchar_t *w = widen(path);
    void *h = w ? (void *)LoadLibraryExW(w, NULL, LOAD_WITH_ALTERED_SEARCH_PATH) : NULL;
    free(w);
    return h;
}

static void close_runtime(void *h) { FreeLibrary((HMODULE)h); }

void coli_loader_error(const char *path, char *out, size_t outlen) {
    DWORD code = GetLastError();
    const char *what;
    wchar_t *w = widen(path);
    DWORD attrs = w ? GetFileAttributesW(w) : INVALID_FILE_ATTRIBUTES;
    free(w);
    switch (code) {
    case ERROR_FILE_NOT_FOUND: what = "the file does not exist"; break;
    case ERROR_PATH_NOT_FOUND: what = "its folder does not exist"; break;
    case ERROR_ACCESS_DENIED: what = "access denied"; break;
    case ERROR_MOD_NOT_FOUND:
        what = attrs == INVALID_FILE_ATTRIBUTES ? "the module does not exist"
                                                : "it exists as a file, so a DLL it depends on is missing";
        break;
    case ERROR_PROC_NOT_FOUND: what = "a procedure it imports is missing from a dependency"; break;
    case ERROR_BAD_EXE_FORMAT: what = "it is not a valid Windows image for this machine"; break;
    default: what = "the Windows loader refused it";
    }
    snprintf(out, outlen, "%s (Windows error %lu)", what, (unsigned long)code);
}


#define PREFERRED_ID FILE_ID_NONE

/* ---- platform: POSIX ------------------------------------------------------ */

#else

#define STYLE PATH_STYLE_POSIX

static char *read_env(const char *name, int *set) {
    const char *v = getenv(name);
    *set = v != NULL;
    if (!v) return NULL;
    size_t n = strlen(v) + 1;
    char *c = malloc(n);
    if (c) memcpy(c, v, n);
    return c;
}

int coli_file_identity(const char *path, file_id_format want, coli_file_id *out) {
    struct stat st;
    memset(out, 0, sizeof *out);
    if ((want != FILE_ID_NONE && want != FILE_ID_POSIX) || stat(path, &st) != 0) return -1;
    out->format = FILE_ID_POSIX;
    out->volume = (uint64_t)st.st_dev;
    uint64_t ino = (uint64_t)st.st_ino;
    memcpy(out->id, &ino, sizeof ino);
    return 0;
}

typedef struct inventory_ctx {
    const char *family; /* "libamdhip64.so" for "libamdhip64.so.5" */
    size_t family_len;
    file_id_format format;
    coli_mapped_runtime *out;
    int max, count;
} inventory_ctx;

static int on_object(struct dl_phdr_info *info, size_t size, void *data) {
    inventory_ctx *c = data;
    (void)size;
    const char *path = info->dlpi_name, *base;
    if (!path || !*path) return 0;
    base = strrchr(path, '/');
    base = base ? base + 1 : path;
    /* the soname family: libamdhip64.so, libamdhip64.so.5, libamdhip64.so.5.2.x */
    if (strncmp(base, c->family, c->family_len) != 0 || (base[c->family_len] && base[c->family_len] != '.')) return 0;
    if (c->count < c->max) {
        coli_mapped_runtime *m = &c->out[c->count];
        if (coli_file_identity(path, c->format, &m->id)) memset(&m->id, 0, sizeof m->id);
        snprintf(m->path, sizeof m->path, "%s", path);
    }
    c->count++;
    return 0;
}

int coli_runtime_inventory(const char *name, file_id_format format, coli_mapped_runtime *out, int max) {
    inventory_ctx c;
    memset(&c, 0, sizeof c);
    const char *so = strstr(name, ".so");
    c.family = name;
    c.family_len = so ? (size_t)(so - name) + 3 : strlen(name);
    c.format = format;
    c.out = out;
    c.max = max;
    dl_iterate_phdr(on_object, &c);
    return c.count;
}

/* One more counted reference to the object mapped from `path` (RTLD_NOLOAD: never a
 * second mapping). */
static void *reference_mapped(const char *path) { return dlopen(path, RTLD_NOW | RTLD_NOLOAD); }

int coli_exe_dir(char *out, size_t outlen) {
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return 1;
    buf[n] = 0;
    char *slash = strrchr(buf, '/');
    if (slash) *slash = 0;
    return snprintf(out, outlen, "%s", buf) >= (int)outlen;
}

static const char *last_dl_error = "";

static void *open_runtime(const char *path) {
    /* RTLD_GLOBAL: the backend's DT_NEEDED on the runtime's soname binds to it */
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        const char *e = dlerror();
        last_dl_error = e ? e : "";
    }
    return h;
}

static void close_runtime(void *h) { dlclose(h); }

void coli_loader_error(const char *path, char *out, size_t outlen) {
    struct stat st;
    const char *what = stat(path, &st) != 0 ? "the file does not exist" : "the dynamic loader refused it";
    snprintf(out, outlen, "%s: %s", what, last_dl_error);
}


#define PREFERRED_ID FILE_ID_POSIX

#endif

static int stat_dir(const char *path, int *is_dir) {
    int kind = coli_path_kind(path);
    *is_dir = kind == 1;
    return kind < 0 ? -1 : 0;
}

/* ---- the contract --------------------------------------------------------- */

#define INVENTORY_MAX 8

typedef struct inventory {
    int mapped; /* modules of the runtime's name, or -1: the list could not be read */
    coli_mapped_runtime found[INVENTORY_MAX];
    bind_decision decision;
} inventory;

static void take_inventory(const coli_hip_binding *b, inventory *inv) {
    inv->mapped = coli_runtime_inventory(COLI_HIP_RUNTIME_NAME, b->identity.format, inv->found, INVENTORY_MAX);
    id_compare cmp = inv->mapped == 1 ? coli_file_id_compare(&inv->found[0].id, &b->identity) : ID_UNKNOWN;
    inv->decision = coli_bind_decide(inv->mapped >= 0, inv->mapped, cmp);
}

/* "P1; P2 (one file under two names)": the mapped modules' paths, and whether any two
 * are one physical file. */
static void mapped_paths(const inventory *inv, char *out, size_t outlen) {
    size_t at = 0;
    int same = 0;
    const int shown = inv->mapped < INVENTORY_MAX ? inv->mapped : INVENTORY_MAX;
    out[0] = 0;
    for (int i = 0; i < shown; i++) {
        for (int j = 0; j < i; j++) same |= coli_file_id_compare(&inv->found[i].id, &inv->found[j].id) == ID_SAME;
        int n = snprintf(out + at, outlen - at, "%s%s", i ? "; " : "", inv->found[i].path);
        if (n < 0 || (size_t)n >= outlen - at) return;
        at += (size_t)n;
    }
    if (same) snprintf(out + at, outlen - at, " (one file under %s names)", shown == 2 ? "two" : "several");
}

static int reject(char *err, size_t errlen, const coli_hip_binding *b, const inventory *inv, const char *stage) {
    char paths[2048];
    mapped_paths(inv, paths, sizeof paths);
    const char *decision = coli_bind_decision_name(inv->decision);
    switch (inv->decision) {
    case BIND_REJECT_DIFFERENT:
        snprintf(err, errlen, "[HIP] %s: a different %s is already loaded (%s), not the configured %s [%s]", stage,
                 COLI_HIP_RUNTIME_NAME, paths, b->runtime_path, decision);
        break;
    case BIND_REJECT_MULTIPLE:
        snprintf(err, errlen, "[HIP] %s: %d files named %s are loaded (%s), the configured one is %s [%s]", stage,
                 inv->mapped, COLI_HIP_RUNTIME_NAME, paths, b->runtime_path, decision);
        break;
    default:
        snprintf(err, errlen, "[HIP] %s: cannot establish which %s is loaded (%s), the configured one is %s [%s]",
                 stage, COLI_HIP_RUNTIME_NAME,
                 inv->mapped < 0 ? "the module list could not be read" : "a file identity is unknown", b->runtime_path,
                 decision);
    }
    return 1;
}

/* COLI_HIP_RUNTIME_DIR's text and folder: 0 when it names an existing folder. */
static int check_runtime_dir(const char *dir, int set, char *err, size_t errlen) {
    int is_dir = 0;
    switch (coli_runtime_dir_form(set ? (dir ? dir : "") : NULL, STYLE)) {
    case DIR_UNSET:
        snprintf(err, errlen, "[HIP] " COLI_HIP_RUNTIME_ENV " is not set; set it to the folder holding %s",
                 COLI_HIP_RUNTIME_NAME);
        return 1;
    case DIR_EMPTY: snprintf(err, errlen, "[HIP] " COLI_HIP_RUNTIME_ENV " is set but empty"); return 1;
    case DIR_DRIVE_RELATIVE:
        snprintf(err, errlen, "[HIP] " COLI_HIP_RUNTIME_ENV " '%s' is drive-relative (no separator after the drive)", dir);
        return 1;
    case DIR_ROOT_RELATIVE:
        snprintf(err, errlen, "[HIP] " COLI_HIP_RUNTIME_ENV " '%s' is relative to the current drive's root", dir);
        return 1;
    case DIR_RELATIVE:
        snprintf(err, errlen, "[HIP] " COLI_HIP_RUNTIME_ENV " '%s' is a relative path; give an absolute one", dir);
        return 1;
    case DIR_OK: break;
    }
    if (stat_dir(dir, &is_dir) != 0) {
        snprintf(err, errlen, "[HIP] " COLI_HIP_RUNTIME_ENV " '%s' does not exist", dir);
        return 1;
    }
    if (!is_dir) {
        snprintf(err, errlen, "[HIP] " COLI_HIP_RUNTIME_ENV " '%s' is not a folder", dir);
        return 1;
    }
    return 0;
}

/* The runtime file inside that folder: 0 when it exists and is a file. */
static int find_runtime_file(const char *dir, coli_hip_binding *b, char *err, size_t errlen) {
    int is_dir = 0;
    if (coli_path_join(dir, COLI_HIP_RUNTIME_NAME, STYLE, b->runtime_path, sizeof b->runtime_path)) {
        snprintf(err, errlen, "[HIP] " COLI_HIP_RUNTIME_ENV " is too long");
        return 1;
    }
    if (stat_dir(b->runtime_path, &is_dir) != 0) {
        snprintf(err, errlen, "[HIP] %s has no %s", dir, COLI_HIP_RUNTIME_NAME);
        return 1;
    }
    if (is_dir) {
        snprintf(err, errlen, "[HIP] %s is a folder, not the runtime", b->runtime_path);
        return 1;
    }
    return 0;
}

int coli_hip_bind(coli_hip_binding *b, char *err, size_t errlen) {
    int set = 0;
    memset(b, 0, sizeof *b);
    char *dir = read_env(COLI_HIP_RUNTIME_ENV, &set);
    int bad = check_runtime_dir(dir, set, err, errlen) || find_runtime_file(dir, b, err, errlen);
    free(dir);
    if (bad) return 1;
    if (coli_file_identity(b->runtime_path, PREFERRED_ID, &b->identity)) {
        snprintf(err, errlen, "[HIP] cannot read the file identity of %s", b->runtime_path);
        return 1;
    }
    inventory inv;
    take_inventory(b, &inv);
    if (inv.decision == BIND_REUSE) {
        /* the configured file is the one mapped: this host takes its own reference to it */
        b->reused = 1;
        b->runtime = reference_mapped(inv.found[0].path);
        if (!b->runtime) {
            snprintf(err, errlen, "[HIP] cannot take a reference to the mapped runtime %s", inv.found[0].path);
            return 1;
        }
    } else if (inv.decision != BIND_LOAD) {
        return reject(err, errlen, b, &inv, "before loading");
    } else if (!(b->runtime = open_runtime(b->runtime_path))) {
        char why[600];
        coli_loader_error(b->runtime_path, why, sizeof why);
        snprintf(err, errlen, "[HIP] cannot load the runtime %s: %s", b->runtime_path, why);
        return 1;
    }
    /* the path was checked before it was loaded: prove what actually mapped */
    if (coli_hip_verify(b, b->reused ? "after the runtime was referenced" : "after the runtime loaded", err, errlen)) {
        coli_hip_release(b);
        return 1;
    }
    return 0;
}

int coli_hip_verify(const coli_hip_binding *b, const char *stage, char *err, size_t errlen) {
    inventory inv;
    take_inventory(b, &inv);
    if (inv.decision == BIND_REUSE) return 0; /* exactly one mapped, and it is the configured file */
    if (inv.decision == BIND_LOAD) {
        snprintf(err, errlen, "[HIP] %s: %s is not mapped at all", stage, b->runtime_path);
        return 1;
    }
    return reject(err, errlen, b, &inv, stage);
}

void coli_hip_release(coli_hip_binding *b) {
    if (b->runtime) close_runtime(b->runtime);
    b->runtime = NULL;
}
