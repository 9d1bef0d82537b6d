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

/* ---- the inventory's list, and the test builds' fault points ---------------- */

#if defined(COLI_BINDING_FAULTS)
const char *coli_binding_fault;
static int inventories; /* the binding's inventories so far: "name@N" acts from the N-th on */

static int fault(const char *name) {
    const char *f = coli_binding_fault;
    size_t n = strlen(name);
    if (!f || strncmp(f, name, n) != 0 || (f[n] && f[n] != '@')) return 0;
    return f[n] != '@' || inventories >= atoi(f + n + 1);
}
#define COUNT_INVENTORY() (void)++inventories
#else
#define fault(name) 0
#define COUNT_INVENTORY() (void)0
#endif

/* Appends one module: its path (NULL: it could not be read) and identity. -1 when
 * memory runs out, which makes the whole inventory unreadable. */
static int list_add(coli_runtime_list *l, const char *path, const coli_file_id *id) {
    coli_mapped_runtime *grown = fault("alloc") ? NULL : realloc(l->items, ((size_t)l->count + 1) * sizeof *grown);
    if (!grown) return -1;
    l->items = grown;
    char *copy = NULL;
    if (path) {
        size_t n = strlen(path) + 1;
        if (!(copy = malloc(n))) return -1;
        memcpy(copy, path, n);
    }
    grown[l->count].path = copy;
    grown[l->count].id = *id;
    l->count++;
    return 0;
}

void coli_runtime_list_free(coli_runtime_list *l) {
    for (int i = 0; i < l->count; i++) free(l->items[i].path);
    free(l->items);
    l->items = NULL;
    l->count = 0;
}

/* ---- platform: Windows ---------------------------------------------------- */

#if defined(_WIN32)

#define STYLE PATH_STYLE_WINDOWS

/* An environment variable as UTF-8; *set = 0 when it does not exist. */
static char *read_env(const char *name, int *set) {
    wchar_t *wname = coli_widen(name);
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
        out = coli_narrow(buf);
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
        if (!fault("no-file-id-info") && GetFileInformationByHandleEx(h, FileIdInfo, &info, sizeof info)) {
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
    wchar_t *w = coli_widen(path);
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

/* One module of the runtime's name: its path and identity, either of which may be
 * unreadable. -1 only when memory runs out. */
static int add_module(coli_runtime_list *l, HMODULE m, file_id_format format) {
    coli_file_id id;
    wchar_t *path = fault("module-path") ? NULL : module_path(m);
    char *text = path ? coli_narrow(path) : NULL;
    if (!path || fault("module-identity") || id_from_wide_path(path, format, &id)) memset(&id, 0, sizeof id);
    int rc = path && !text ? -1 : list_add(l, text, &id);
    free(text);
    free(path);
    return rc;
}

int coli_runtime_inventory(const char *name, file_id_format format, coli_runtime_list *out) {
    memset(out, 0, sizeof *out);
    wchar_t *wname = coli_widen(name);
    HANDLE snap = INVALID_HANDLE_VALUE;
    if (!wname) return -1;
    /* ERROR_BAD_LENGTH: the module list changed while it was read; try again */
    for (int attempt = 0; attempt < 16 && snap == INVALID_HANDLE_VALUE && !fault("snapshot"); attempt++) {
        snap = CreateToolhelp32Snapshot(TH32CS_SNAPMODULE | TH32CS_SNAPMODULE32, GetCurrentProcessId());
        if (snap == INVALID_HANDLE_VALUE && GetLastError() != ERROR_BAD_LENGTH) break;
    }
    if (snap == INVALID_HANDLE_VALUE) {
        free(wname);
        return -1;
    }
    MODULEENTRY32W me;
    me.dwSize = sizeof me;
    BOOL more = Module32FirstW(snap, &me);
    int failed = !more && GetLastError() != ERROR_NO_MORE_FILES;
    while (more && !failed) {
        if (_wcsicmp(me.szModule, wname) == 0 && add_module(out, me.hModule, format)) failed = 1;
        else if (fault("enumerate")) failed = 1;
        else if (!(more = Module32NextW(snap, &me))) failed = GetLastError() != ERROR_NO_MORE_FILES;
    }
    CloseHandle(snap);
    free(wname);
    return failed ? -1 : 0;
}

/* One more counted reference to the module mapped from `path` (never a second
 * mapping: GetModuleHandleEx finds the module by that exact path). */
static void *reference_mapped(const char *path) {
    wchar_t *w = coli_widen(path);
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
    char *s = coli_narrow(w);
    free(w);
    if (!s) return 1;
    int rc = snprintf(out, outlen, "%s", s) >= (int)outlen;
    free(s);
    return rc;
}

static void *open_runtime(const char *path) {
    wchar_t *w = coli_widen(path);
    void *h = w ? (void *)LoadLibraryExW(w, NULL, LOAD_WITH_ALTERED_SEARCH_PATH) : NULL;
    free(w);
    return h;
}

static void close_runtime(void *h) { FreeLibrary((HMODULE)h); }

void coli_loader_error(const char *path, char *out, size_t outlen) {
    DWORD code = GetLastError();
    const char *what;
    wchar_t *w = coli_widen(path);
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
    coli_runtime_list *out;
    int failed;
} inventory_ctx;

static int on_object(struct dl_phdr_info *info, size_t size, void *data) {
    inventory_ctx *c = data;
    (void)size;
    if (fault("enumerate")) return c->failed = 1;
    const char *path = info->dlpi_name, *base;
    if (!path || !*path) return 0;
    base = strrchr(path, '/');
    base = base ? base + 1 : path;
    /* the soname family: libamdhip64.so, libamdhip64.so.5, libamdhip64.so.5.2.x */
    if (strncmp(base, c->family, c->family_len) != 0 || (base[c->family_len] && base[c->family_len] != '.')) return 0;
    coli_file_id id;
    const char *shown = fault("module-path") ? NULL : path;
    if (!shown || fault("module-identity") || coli_file_identity(path, c->format, &id)) memset(&id, 0, sizeof id);
    if (list_add(c->out, shown, &id)) return c->failed = 1;
    return 0;
}

int coli_runtime_inventory(const char *name, file_id_format format, coli_runtime_list *out) {
    inventory_ctx c;
    memset(out, 0, sizeof *out);
    memset(&c, 0, sizeof c);
    const char *so = strstr(name, ".so");
    c.family = name;
    c.family_len = so ? (size_t)(so - name) + 3 : strlen(name);
    c.format = format;
    c.out = out;
    if (fault("snapshot")) return -1; /* the loader's list has no snapshot to fail: the test's stand-in */
    dl_iterate_phdr(on_object, &c);
    return c.failed ? -1 : 0;
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

bind_decision coli_bind_judge(const coli_file_id *configured, int read, const coli_runtime_list *list) {
    id_compare single = read && list->count == 1 ? coli_file_id_compare(&list->items[0].id, configured) : ID_UNKNOWN;
    bind_decision d = coli_bind_decide(read, read ? list->count : -1, single);
    /* without the configured file's identity nothing loaded by its path could be proved to be it */
    return d == BIND_LOAD && configured->format == FILE_ID_NONE ? BIND_REJECT_UNVERIFIABLE : d;
}

static const char *shown_path(const coli_mapped_runtime *m) {
    return m->path ? m->path : "(a module whose path cannot be read)";
}

/* "P1; P2 (both of them are one file)": every mapped module's path, and whether any
 * two are one physical file. */
static void mapped_paths(const coli_runtime_list *list, char *out, size_t outlen) {
    size_t at = 0;
    int same = 0;
    out[0] = 0;
    for (int i = 0; i < list->count; i++) {
        for (int j = 0; j < i; j++) same |= coli_file_id_compare(&list->items[i].id, &list->items[j].id) == ID_SAME;
        int n = snprintf(out + at, outlen - at, "%s%s", i ? "; " : "", shown_path(&list->items[i]));
        if (n < 0 || (size_t)n >= outlen - at) return;
        at += (size_t)n;
    }
    if (same) snprintf(out + at, outlen - at, " (%s of them are one file)", list->count == 2 ? "both" : "some");
}

/* Why an inventory cannot say which runtime is mapped. */
static void unverifiable_reason(const coli_file_id *configured, int read, const coli_runtime_list *list, char *out,
                                size_t outlen) {
    const coli_mapped_runtime *one = list->count == 1 ? &list->items[0] : NULL;
    if (!read) snprintf(out, outlen, "the module list could not be read");
    else if (configured->format == FILE_ID_NONE) snprintf(out, outlen, "the configured file's identity cannot be read");
    else if (one && !one->path) snprintf(out, outlen, "a mapped module's path cannot be read");
    else if (one && one->id.format == FILE_ID_NONE) snprintf(out, outlen, "the identity of %s cannot be read", one->path);
    else snprintf(out, outlen, "the identity of %s is of another kind than the configured file's", one ? shown_path(one) : "a module");
}

void coli_bind_refusal(const char *stage, const char *configured_path, const coli_file_id *configured, int read,
                       const coli_runtime_list *list, bind_decision decision, char *err, size_t errlen) {
    char paths[3072], why[1200];
    mapped_paths(list, paths, sizeof paths);
    const char *name = coli_bind_decision_name(decision);
    switch (decision) {
    case BIND_LOAD:
    case BIND_REUSE: snprintf(err, errlen, "[HIP] %s: no refusal [%s]", stage, name); break;
    case BIND_REJECT_DIFFERENT:
        snprintf(err, errlen, "[HIP] %s: a different %s is already loaded (%s), not the configured %s [%s]", stage,
                 COLI_HIP_RUNTIME_NAME, paths, configured_path, name);
        break;
    case BIND_REJECT_MULTIPLE:
        snprintf(err, errlen, "[HIP] %s: %d modules named %s are loaded (%s), the configured one is %s [%s]", stage,
                 list->count, COLI_HIP_RUNTIME_NAME, paths, configured_path, name);
        break;
    case BIND_REJECT_UNVERIFIABLE:
        unverifiable_reason(configured, read, list, why, sizeof why);
        snprintf(err, errlen, "[HIP] %s: cannot establish which %s is loaded (%s), the configured one is %s [%s]",
                 stage, COLI_HIP_RUNTIME_NAME, why, configured_path, name);
    }
}

typedef struct inventory {
    int read; /* the module list was read whole */
    coli_runtime_list list;
    bind_decision decision;
} inventory;

static void take_inventory(const coli_hip_binding *b, inventory *inv) {
    COUNT_INVENTORY();
    inv->read = coli_runtime_inventory(COLI_HIP_RUNTIME_NAME, b->identity.format, &inv->list) == 0;
    inv->decision = coli_bind_judge(&b->identity, inv->read, &inv->list);
}

static int reject(char *err, size_t errlen, const coli_hip_binding *b, const inventory *inv, const char *stage) {
    coli_bind_refusal(stage, b->runtime_path, &b->identity, inv->read, &inv->list, inv->decision, err, errlen);
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

int coli_hip_plan_bind(coli_hip_plan *p, char *err, size_t errlen) {
    int set = 0;
    coli_hip_binding b;
    memset(p, 0, sizeof *p);
    memset(&b, 0, sizeof b);
    char *dir = read_env(COLI_HIP_RUNTIME_ENV, &set);
    p->dir_set = set;
    p->form = coli_runtime_dir_form(set ? (dir ? dir : "") : NULL, STYLE);
    snprintf(p->dir, sizeof p->dir, "%s", dir ? dir : "");
    int bad = check_runtime_dir(dir, set, err, errlen) || find_runtime_file(dir, &b, err, errlen);
    free(dir);
    memcpy(p->runtime_path, b.runtime_path, sizeof p->runtime_path);
    if (bad) return 1;
    if (fault("file-identity") || coli_file_identity(b.runtime_path, PREFERRED_ID, &b.identity))
        memset(&b.identity, 0, sizeof b.identity);
    inventory inv;
    take_inventory(&b, &inv);
    p->identity = b.identity;
    p->read = inv.read;
    p->mapped = inv.list;
    p->decision = inv.decision;
    return 0;
}

int coli_hip_bind(coli_hip_binding *b, char *err, size_t errlen) {
    coli_hip_plan p;
    memset(b, 0, sizeof *b);
    if (coli_hip_plan_bind(&p, err, errlen)) return 1;
    memcpy(b->runtime_path, p.runtime_path, sizeof b->runtime_path);
    b->identity = p.identity;
    int rc = 0;
    if (p.decision == BIND_REUSE) {
        /* the configured file is the one mapped: this host takes its own reference to it */
        b->reused = 1;
        if (!(b->runtime = reference_mapped(p.mapped.items[0].path))) {
            snprintf(err, errlen, "[HIP] cannot take a reference to the mapped runtime %s", p.mapped.items[0].path);
            rc = 1;
        }
    } else if (p.decision != BIND_LOAD) {
        coli_bind_refusal("before loading", p.runtime_path, &p.identity, p.read, &p.mapped, p.decision, err, errlen);
        rc = 1;
    } else if (!(b->runtime = open_runtime(b->runtime_path))) {
        char why[600];
        coli_loader_error(b->runtime_path, why, sizeof why);
        snprintf(err, errlen, "[HIP] cannot load the runtime %s: %s", b->runtime_path, why);
        rc = 1;
    }
    coli_runtime_list_free(&p.mapped);
    /* the path was checked before it was loaded: prove what actually mapped */
    if (!rc && coli_hip_verify(b, b->reused ? "after the runtime was referenced" : "after the runtime loaded", err, errlen)) {
        coli_hip_release(b);
        rc = 1;
    }
    return rc;
}

int coli_hip_verify(const coli_hip_binding *b, const char *stage, char *err, size_t errlen) {
    inventory inv;
    take_inventory(b, &inv);
    int rc = 0;
    if (inv.decision == BIND_LOAD) {
        snprintf(err, errlen, "[HIP] %s: %s is not mapped at all", stage, b->runtime_path);
        rc = 1;
    } else if (inv.decision != BIND_REUSE) { /* REUSE: exactly one mapped, and it is the configured file */
        rc = reject(err, errlen, b, &inv, stage);
    }
    coli_runtime_list_free(&inv.list);
    return rc;
}

void coli_hip_release(coli_hip_binding *b) {
    if (b->runtime) close_runtime(b->runtime);
    b->runtime = NULL;
}
