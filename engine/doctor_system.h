/* What `coli doctor` asks of the system itself: the platform it runs on, a file's
 * version, and the HIP runtimes the system holds outside any package (Windows:
 * System32, where the driver puts its own; Linux: the loader's standard folders). */
#ifndef COLI_DOCTOR_SYSTEM_H
#define COLI_DOCTOR_SYSTEM_H

#include <stddef.h>

typedef struct coli_platform {
    char os[160];   /* "Windows 10.0.19045", "Linux 6.1.0-28-amd64" */
    char arch[16];  /* x86_64, arm64 */
    char wine[32];  /* the Wine version when run under Wine; "" otherwise */
} coli_platform;

void coli_platform_read(coli_platform *out);

/* The file's version: Windows, its version resource (6.4.43482.0); elsewhere, what the
 * real file's name says past ".so." (libamdhip64.so.5 -> libamdhip64.so.5.2.21153 gives
 * 5.2.21153). 0 with it, -1 when the file says none. */
int coli_file_version(const char *path, char *out, size_t outlen);

#define COLI_SYSTEM_RUNTIMES_MAX 16

typedef struct coli_system_runtimes {
    int count;
    char folder[1024];                       /* where the first was found (Windows: System32) */
    char paths[COLI_SYSTEM_RUNTIMES_MAX][1024]; /* each physical file once */
} coli_system_runtimes;

/* The HIP runtimes of any version the system holds: System32's amdhip64*.dll, or
 * libamdhip64.so.<major> in /opt/rocm/lib and the loader's standard folders. */
void coli_system_runtimes_find(coli_system_runtimes *out);

#endif
