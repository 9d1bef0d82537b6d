/* The device code inside a GPU backend's file, read without mapping it: the
 * target of every code object in its HIP offload bundles (.hip_fatbin, or the
 * PE's .hip_fat) and of every entry in its CUDA fatbins (.nv_fatbin), and
 * whether a device of a given arch finds code there. */
#ifndef COLI_DEVICE_CODE_H
#define COLI_DEVICE_CODE_H

#include <stddef.h>

#define COLI_CODE_MAX 64

typedef struct coli_device_code {
    int count;
    char targets[COLI_CODE_MAX][48]; /* gfx1151, gfx90a:xnack-, sm_90 (machine code), compute_90 (PTX) */
    int compressed;                  /* bundles packed by --offload-compress: their targets are not listed */
    int found;                       /* the file has a device-code section */
} coli_device_code;

/* 0 with the targets (each once, in the file's order); -1 with a reason in `err`
 * when the file or its device code cannot be read. */
int coli_device_code_read(const char *path, coli_device_code *out, char *err, size_t errlen);

/* Whether the code runs on a device that reports `arch` (gfx90a:sramecc+:xnack-, sm_89):
 * a HIP code object of the same processor whose features the device does not contradict
 * (one built without a feature runs either way), CUDA machine code of the same arch, or
 * PTX of an arch at most the device's. */
int coli_device_code_runs_on(const coli_device_code *code, const char *arch);

#endif
