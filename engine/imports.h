/* What a library file says of itself, read from the file before anything maps it:
 * what it imports (ELF's DT_NEEDED entries, PE's import and delay-import
 * descriptors) and the bytes of a section by name (its device code). The loader
 * decides HIP mode from this (a backend that imports the HIP runtime goes
 * through the runtime binding, whatever its file is called or however it was
 * named on the command line). */
#ifndef COLI_IMPORTS_H
#define COLI_IMPORTS_H

#include <stddef.h>
#include <stdint.h>

/* Calls `each(name, ctx)` for every library `path` imports (PE: normal and
 * delay-load), in the file's order; stops early when `each` returns nonzero.
 * 0 when the table was read whole; -1 with a reason in `err` when the file is
 * not an ELF64 or PE32+ image or its tables cannot be read. */
int coli_imports_each(const char *path, int (*each)(const char *name, void *ctx), void *ctx, char *err, size_t errlen);

/* The bytes of the section named `elf_name` (an ELF file) or `pe_name` (a PE image):
 * 1 with them in a malloc'd *data, 0 when the file has no such section, -1 with a
 * reason in `err` when it is no image or its tables are malformed. */
int coli_image_section(const char *path, const char *elf_name, const char *pe_name, uint8_t **data, size_t *size,
                       char *err, size_t errlen);

/* Whether `name` is the HIP runtime (any of its versions): libamdhip64.so[.N...]
 * or amdhip64[_N].dll (case-insensitively). */
int coli_is_hip_runtime_name(const char *name);

/* The HIP runtime `path` imports, into `out`: 1 when it imports one, 0 when none,
 * -1 (reason in `err`) when its import table cannot be read. */
int coli_hip_import(const char *path, char *out, size_t outlen, char *err, size_t errlen);

#endif
