#if !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* realpath, dirent's d_name on every libc */
#endif
#include "doctor_system.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hip_binding.h"
#include "imports.h"
#include "utf8.h"

#if defined(_WIN32)
#include <windows.h>

typedef LONG(WINAPI *rtl_get_version)(OSVERSIONINFOW *);
typedef const char *(CDECL *wine_get_version)(void);

void coli_platform_read(coli_platform *out) {
    memset(out, 0, sizeof *out);
    HMODULE ntdll = GetModuleHandleW(L"ntdll.dll");
    OSVERSIONINFOW v = {sizeof v, 0, 0, 0, 0, {0}};
    /* GetVersionEx lies to programs without a manifest; ntdll's own call does not */
    FARPROC f = ntdll ? GetProcAddress(ntdll, "RtlGetVersion") : NULL;
    rtl_get_version get;
    memcpy(&get, &f, sizeof get);
    if (get && get(&v) == 0)
        snprintf(out->os, sizeof out->os, "Windows %lu.%lu.%lu", v.dwMajorVersion, v.dwMinorVersion, v.dwBuildNumber);
    else
        snprintf(out->os, sizeof out->os, "Windows");
    f = ntdll ? GetProcAddress(ntdll, "wine_get_version") : NULL;
    wine_get_version wine;
    memcpy(&wine, &f, sizeof wine);
    if (wine) snprintf(out->wine, sizeof out->wine, "%s", wine());
    SYSTEM_INFO si;
    GetNativeSystemInfo(&si);
    const WORD a = si.wProcessorArchitecture;
    snprintf(out->arch, sizeof out->arch, "%s",
             a == PROCESSOR_ARCHITECTURE_AMD64 ? "x86_64" : a == 12 /* ARM64 */ ? "arm64" : "other");
}

int coli_file_version(const char *path, char *out, size_t outlen) {
    wchar_t *wide = coli_widen(path);
    DWORD ignored = 0, size = wide ? GetFileVersionInfoSizeW(wide, &ignored) : 0;
    void *block = size ? malloc(size) : NULL;
    VS_FIXEDFILEINFO *fixed = NULL;
    UINT len = 0;
    int rc = -1;
    if (block && GetFileVersionInfoW(wide, 0, size, block) && VerQueryValueW(block, L"\\", (void **)&fixed, &len) &&
        fixed && len >= sizeof *fixed) {
        snprintf(out, outlen, "%lu.%lu.%lu.%lu", fixed->dwFileVersionMS >> 16, fixed->dwFileVersionMS & 0xFFFF,
                 fixed->dwFileVersionLS >> 16, fixed->dwFileVersionLS & 0xFFFF);
        rc = 0;
    }
    free(block);
    free(wide);
    return rc;
}

void coli_system_runtimes_find(coli_system_runtimes *out) {
    wchar_t dir[MAX_PATH], pattern[MAX_PATH + 16];
    memset(out, 0, sizeof *out);
    UINT n = GetSystemDirectoryW(dir, MAX_PATH);
    if (!n || n >= MAX_PATH) return;
    char *narrow = coli_narrow(dir);
    if (!narrow) return;
    snprintf(out->folder, sizeof out->folder, "%s", narrow);
    free(narrow);
    _snwprintf(pattern, sizeof pattern / sizeof pattern[0], L"%ls\\amdhip64*.dll", dir);
    pattern[sizeof pattern / sizeof pattern[0] - 1] = 0;
    WIN32_FIND_DATAW fd;
    HANDLE h = FindFirstFileW(pattern, &fd);
    if (h == INVALID_HANDLE_VALUE) return;
    do {
        char *name = coli_narrow(fd.cFileName);
        if (name && coli_is_hip_runtime_name(name) && out->count < COLI_SYSTEM_RUNTIMES_MAX)
            snprintf(out->paths[out->count++], sizeof out->paths[0], "%s\\%s", out->folder, name);
        free(name);
    } while (FindNextFileW(h, &fd));
    FindClose(h);
}

#else
#include <dirent.h>
#include <sys/utsname.h>

void coli_platform_read(coli_platform *out) {
    struct utsname u;
    memset(out, 0, sizeof *out);
    if (uname(&u) == 0) {
        snprintf(out->os, sizeof out->os, "%.40s %.100s", u.sysname, u.release);
        snprintf(out->arch, sizeof out->arch, "%.15s", u.machine);
    } else {
        snprintf(out->os, sizeof out->os, "unknown");
    }
}

int coli_file_version(const char *path, char *out, size_t outlen) {
    char *real = realpath(path, NULL);
    const char *base = real ? strrchr(real, '/') : NULL, *so = base ? strstr(base, ".so.") : NULL;
    int rc = so && so[4] ? 0 : -1;
    if (!rc) snprintf(out, outlen, "%s", so + 4);
    free(real);
    return rc;
}

/* libamdhip64.so.<digits>: the name a backend imports, one per ROCm major. */
static int soname_file(const char *name) {
    if (strncmp(name, "libamdhip64.so.", 15) || !name[15]) return 0;
    for (const char *p = name + 15; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    return 1;
}

void coli_system_runtimes_find(coli_system_runtimes *out) {
    static const char *const FOLDERS[] = {"/opt/rocm/lib", "/opt/rocm/lib64", "/usr/lib/x86_64-linux-gnu",
                                          "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                                          "/lib/x86_64-linux-gnu", "/lib64"};
    coli_file_id seen[COLI_SYSTEM_RUNTIMES_MAX];
    memset(out, 0, sizeof *out);
    for (size_t f = 0; f < sizeof FOLDERS / sizeof FOLDERS[0]; f++) {
        DIR *d = opendir(FOLDERS[f]);
        struct dirent *e;
        while (d && (e = readdir(d)) && out->count < COLI_SYSTEM_RUNTIMES_MAX) {
            char path[1024];
            coli_file_id id;
            if (!soname_file(e->d_name)) continue;
            snprintf(path, sizeof path, "%s/%s", FOLDERS[f], e->d_name);
            if (coli_file_identity(path, FILE_ID_NONE, &id)) continue;
            int dup = 0; /* /lib is often /usr/lib: one file, two paths */
            for (int i = 0; i < out->count; i++) dup |= coli_file_id_compare(&seen[i], &id) == ID_SAME;
            if (dup) continue;
            if (!out->count) snprintf(out->folder, sizeof out->folder, "%s", FOLDERS[f]);
            seen[out->count] = id;
            snprintf(out->paths[out->count++], sizeof out->paths[0], "%s", path);
        }
        if (d) closedir(d);
    }
}
#endif
