#include "imports.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

/* Every read is bounded by the file: a table that points outside it is an error,
 * never a read past the end. */
typedef struct image {
    FILE *f;
    long size;
} image;

static int read_at(const image *im, uint64_t off, void *buf, size_t n) {
    if (off > (uint64_t)im->size || n > (uint64_t)im->size - off) return -1;
    if (fseek(im->f, (long)off, SEEK_SET) != 0) return -1;
    return fread(buf, 1, n, im->f) == n ? 0 : -1;
}

static uint16_t u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t u32(const uint8_t *p) { return (uint32_t)u16(p) | (uint32_t)u16(p + 2) << 16; }
static uint64_t u64(const uint8_t *p) { return (uint64_t)u32(p) | (uint64_t)u32(p + 4) << 32; }

/* A NUL-terminated name at `off`, at most `cap` bytes (truncated names are refused). */
static int read_name(const image *im, uint64_t off, char *out, size_t cap) {
    size_t n = 0;
    if (off >= (uint64_t)im->size || fseek(im->f, (long)off, SEEK_SET) != 0) return -1;
    for (;;) {
        int c = fgetc(im->f);
        if (c == EOF || n + 1 >= cap) return -1;
        out[n++] = (char)c;
        if (c == 0) return 0;
    }
}

/* ---- ELF64, little-endian: DT_NEEDED ------------------------------------------------ */

#define ELF_MAX_PHDRS 256
#define ELF_MAX_DYN 4096

static int elf_imports(const image *im, const uint8_t *eh, int (*each)(const char *, void *), void *ctx,
                       const char **why) {
    if (eh[4] != 2 || eh[5] != 1) return *why = "not a 64-bit little-endian ELF file", -1;
    const uint64_t phoff = u64(eh + 32);
    const uint16_t phentsize = u16(eh + 54), phnum = u16(eh + 56);
    if (phentsize < 56 || phnum > ELF_MAX_PHDRS) return *why = "its program headers are malformed", -1;
    uint64_t loads[ELF_MAX_PHDRS][3]; /* vaddr, offset, filesz of each PT_LOAD */
    int nloads = 0;
    uint64_t dyn_off = 0, dyn_size = 0;
    for (uint16_t i = 0; i < phnum; i++) {
        uint8_t ph[56];
        if (read_at(im, phoff + (uint64_t)i * phentsize, ph, sizeof ph)) return *why = "its program headers are cut off", -1;
        const uint32_t type = u32(ph);
        if (type == 1) { /* PT_LOAD */
            loads[nloads][0] = u64(ph + 16), loads[nloads][1] = u64(ph + 8), loads[nloads][2] = u64(ph + 32);
            nloads++;
        } else if (type == 2) { /* PT_DYNAMIC */
            dyn_off = u64(ph + 8), dyn_size = u64(ph + 32);
        }
    }
    if (!dyn_size) return 0; /* no dynamic section: it imports nothing */
    uint64_t needed[ELF_MAX_DYN], strtab = 0, strsz = 0;
    int nneeded = 0;
    for (uint64_t at = 0; at + 16 <= dyn_size && at / 16 < ELF_MAX_DYN; at += 16) {
        uint8_t d[16];
        if (read_at(im, dyn_off + at, d, sizeof d)) return *why = "its dynamic section is cut off", -1;
        const uint64_t tag = u64(d), val = u64(d + 8);
        if (tag == 0) break; /* DT_NULL */
        if (tag == 1 && nneeded < ELF_MAX_DYN) needed[nneeded++] = val;
        else if (tag == 5) strtab = val; /* DT_STRTAB, an address */
        else if (tag == 10) strsz = val; /* DT_STRSZ */
    }
    if (!nneeded) return 0;
    uint64_t str_off = UINT64_MAX;
    for (int i = 0; i < nloads; i++)
        if (strtab >= loads[i][0] && strtab - loads[i][0] < loads[i][2]) str_off = strtab - loads[i][0] + loads[i][1];
    if (str_off == UINT64_MAX) return *why = "its string table lies outside its loaded segments", -1;
    for (int i = 0; i < nneeded; i++) {
        char name[512];
        if (needed[i] >= strsz || read_name(im, str_off + needed[i], name, sizeof name))
            return *why = "a DT_NEEDED name lies outside its string table", -1;
        if (each(name, ctx)) return 0;
    }
    return 0;
}

/* ---- PE32+: import and delay-import descriptors ---------------------------------------- */

#define PE_MAX_SECTIONS 96
#define PE_MAX_DESCRIPTORS 4096

typedef struct pe_sections {
    uint32_t va[PE_MAX_SECTIONS], vsize[PE_MAX_SECTIONS], raw[PE_MAX_SECTIONS], rawsize[PE_MAX_SECTIONS];
    char name[PE_MAX_SECTIONS][9];
    int n;
} pe_sections;

static uint64_t rva_to_offset(const pe_sections *s, uint32_t rva) {
    for (int i = 0; i < s->n; i++) {
        const uint32_t span = s->vsize[i] > s->rawsize[i] ? s->vsize[i] : s->rawsize[i];
        if (rva >= s->va[i] && rva - s->va[i] < span && rva - s->va[i] < s->rawsize[i])
            return (uint64_t)s->raw[i] + (rva - s->va[i]);
    }
    return UINT64_MAX;
}

/* Each descriptor's name: `stride` bytes a descriptor, its name's RVA at `name_at`;
 * delay-load descriptors of the old form hold virtual addresses (attributes bit 0 clear). */
static int pe_descriptors(const image *im, const pe_sections *s, uint32_t rva, uint32_t size, int delay, uint64_t base,
                          int (*each)(const char *, void *), void *ctx, int *stop, const char **why) {
    const uint32_t stride = delay ? 32 : 20, name_at = delay ? 4 : 12;
    const uint64_t off = rva_to_offset(s, rva);
    if (off == UINT64_MAX) return *why = "its import table lies outside its sections", -1;
    for (uint32_t i = 0; i < PE_MAX_DESCRIPTORS && (uint64_t)(i + 1) * stride <= (size ? size : UINT32_MAX); i++) {
        uint8_t d[32];
        if (read_at(im, off + (uint64_t)i * stride, d, stride)) return *why = "its import table is cut off", -1;
        int zero = 1;
        for (uint32_t k = 0; k < stride; k++) zero = zero && d[k] == 0;
        if (zero) return 0;
        uint64_t name_rva = u32(d + name_at);
        if (delay && !(u32(d) & 1)) name_rva -= base; /* a virtual address, not an RVA */
        char name[512];
        const uint64_t name_off = name_rva <= UINT32_MAX ? rva_to_offset(s, (uint32_t)name_rva) : UINT64_MAX;
        if (name_off == UINT64_MAX || read_name(im, name_off, name, sizeof name))
            return *why = "an imported library's name lies outside its sections", -1;
        if (each(name, ctx)) return *stop = 1, 0;
    }
    return 0;
}

/* The optional header (into opt, 240 bytes; its size in *opt_size) and the section table. */
static int pe_headers(const image *im, const uint8_t *mz, uint8_t *opt, uint16_t *opt_size, pe_sections *s,
                      const char **why) {
    const uint32_t pe = u32(mz + 0x3C);
    uint8_t coff[24];
    if (read_at(im, pe, coff, sizeof coff) || memcmp(coff, "PE\0\0", 4)) return *why = "not a PE image", -1;
    const uint16_t nsections = u16(coff + 6);
    *opt_size = u16(coff + 20);
    if (*opt_size < 112 || *opt_size > 240 || read_at(im, pe + 24, opt, *opt_size))
        return *why = "its optional header is malformed", -1;
    if (u16(opt) != 0x20B) return *why = "not a PE32+ (64-bit) image", -1;
    s->n = 0;
    if (nsections > PE_MAX_SECTIONS) return *why = "it has too many sections", -1;
    for (uint16_t i = 0; i < nsections; i++) {
        uint8_t sh[40];
        if (read_at(im, (uint64_t)pe + 24 + *opt_size + (uint64_t)i * 40, sh, sizeof sh))
            return *why = "its section table is cut off", -1;
        s->vsize[s->n] = u32(sh + 8), s->va[s->n] = u32(sh + 12), s->rawsize[s->n] = u32(sh + 16);
        s->raw[s->n] = u32(sh + 20);
        memcpy(s->name[s->n], sh, 8);
        s->name[s->n][8] = 0;
        s->n++;
    }
    return 0;
}

static int pe_imports(const image *im, const uint8_t *mz, int (*each)(const char *, void *), void *ctx,
                      const char **why) {
    uint8_t opt[240];
    uint16_t opt_size;
    pe_sections s;
    if (pe_headers(im, mz, opt, &opt_size, &s, why)) return -1;
    const uint64_t base = u64(opt + 24);
    const uint32_t ndirs = u32(opt + 108);
    int stop = 0;
    for (int delay = 0; delay < 2 && !stop; delay++) {
        const uint32_t dir = delay ? 13 : 1; /* IMAGE_DIRECTORY_ENTRY_DELAY_IMPORT, _IMPORT */
        if (dir >= ndirs || 112 + dir * 8 + 8 > opt_size) continue;
        const uint32_t rva = u32(opt + 112 + dir * 8), size = u32(opt + 116 + dir * 8);
        if (rva && pe_descriptors(im, &s, rva, size, delay, base, each, ctx, &stop, why)) return -1;
    }
    return 0;
}

/* ---- sections by name ----------------------------------------------------------------- */

#define SECTION_MAX_BYTES ((uint64_t)1 << 31)

/* The section's place in the file: 1 found, 0 absent, -1 malformed. */
static int elf_section(const image *im, const uint8_t *eh, const char *want, uint64_t *off, uint64_t *size,
                       const char **why) {
    if (eh[4] != 2 || eh[5] != 1) return *why = "not a 64-bit little-endian ELF file", -1;
    const uint64_t shoff = u64(eh + 40);
    const uint16_t shentsize = u16(eh + 58), shnum = u16(eh + 60), shstrndx = u16(eh + 62);
    if (!shoff || !shnum) return 0; /* stripped of its section table: nothing to find */
    if (shentsize < 64 || shstrndx >= shnum) return *why = "its section headers are malformed", -1;
    uint8_t sh[64];
    if (read_at(im, shoff + (uint64_t)shstrndx * shentsize, sh, sizeof sh))
        return *why = "its section headers are cut off", -1;
    const uint64_t names = u64(sh + 24), names_size = u64(sh + 32);
    for (uint16_t i = 0; i < shnum; i++) {
        char name[64];
        if (read_at(im, shoff + (uint64_t)i * shentsize, sh, sizeof sh))
            return *why = "its section headers are cut off", -1;
        if (u32(sh) >= names_size || read_name(im, names + u32(sh), name, sizeof name)) continue; /* not ours */
        if (strcmp(name, want) || u32(sh + 4) == 8 /* SHT_NOBITS */) continue;
        *off = u64(sh + 24), *size = u64(sh + 32);
        return 1;
    }
    return 0;
}

static int pe_section(const image *im, const uint8_t *mz, const char *want, uint64_t *off, uint64_t *size,
                      const char **why) {
    uint8_t opt[240];
    uint16_t opt_size;
    pe_sections s;
    if (pe_headers(im, mz, opt, &opt_size, &s, why)) return -1;
    for (int i = 0; i < s.n; i++)
        if (!strcmp(s.name[i], want)) {
            /* the raw size is rounded up to the file alignment; the virtual size is the data's */
            *off = s.raw[i];
            *size = s.vsize[i] && s.vsize[i] < s.rawsize[i] ? s.vsize[i] : s.rawsize[i];
            return 1;
        }
    return 0;
}

/* The file opened with its size and first 64 bytes; -1 with `why` when it is no image. */
static int open_image(const char *path, image *im, uint8_t head[64], const char **why) {
    im->f = coli_fopen(path, "rb");
    im->size = 0;
    if (!im->f) return *why = "cannot open it", -1;
    if (fseek(im->f, 0, SEEK_END) == 0) im->size = ftell(im->f);
    if (im->size < 64 || read_at(im, 0, head, 64)) return *why = "too short for an ELF or PE image", -1;
    if (memcmp(head, "\177ELF", 4) && !(head[0] == 'M' && head[1] == 'Z'))
        return *why = "neither an ELF shared object nor a PE image", -1;
    return 0;
}

int coli_image_section(const char *path, const char *elf_name, const char *pe_name, uint8_t **data, size_t *size,
                       char *err, size_t errlen) {
    image im;
    uint8_t head[64];
    const char *why = NULL;
    uint64_t off = 0, n = 0;
    int rc = -1;
    *data = NULL, *size = 0;
    if (!open_image(path, &im, head, &why)) {
        rc = head[0] == 'M' ? pe_section(&im, head, pe_name, &off, &n, &why)
                            : elf_section(&im, head, elf_name, &off, &n, &why);
        if (rc == 1 && n > SECTION_MAX_BYTES) rc = -1, why = "its device-code section is larger than 2 GiB";
        if (rc == 1 && !(*data = malloc(n ? (size_t)n : 1))) rc = -1, why = "out of memory for its section";
        if (rc == 1 && read_at(&im, off, *data, (size_t)n)) rc = -1, why = "its section lies past the file's end";
        if (rc == 1) *size = (size_t)n;
    }
    if (im.f) fclose(im.f);
    if (rc < 0) {
        free(*data);
        *data = NULL;
        snprintf(err, errlen, "%s", why ? why : "its sections cannot be read");
    }
    return rc;
}

int coli_imports_each(const char *path, int (*each)(const char *name, void *ctx), void *ctx, char *err, size_t errlen) {
    image im;
    uint8_t head[64];
    const char *why = NULL;
    int rc = -1;
    if (open_image(path, &im, head, &why) == 0)
        rc = head[0] == 'M' ? pe_imports(&im, head, each, ctx, &why) : elf_imports(&im, head, each, ctx, &why);
    else if (!im.f)
        why = "cannot open it to read its import table";
    if (im.f) fclose(im.f);
    if (rc) snprintf(err, errlen, "%s", why ? why : "its import table cannot be read");
    return rc;
}

int coli_is_hip_runtime_name(const char *name) {
    /* the family in two pieces: the host's binary holds one whole runtime name, the one it
     * binds (COLI_HIP_RUNTIME_NAME), which verify reads there */
    if (!strncmp(name, "libamdhip64", 11) && !strncmp(name + 11, ".so", 3)) return name[14] == 0 || name[14] == '.';
    char low[64];
    size_t n = strlen(name);
    if (n >= sizeof low) return 0;
    for (size_t i = 0; i <= n; i++) low[i] = (char)tolower((unsigned char)name[i]);
    if (strncmp(low, "amdhip64", 8) || n < 12 || strcmp(low + n - 4, ".dll")) return 0;
    /* amdhip64.dll or amdhip64_<digits>.dll */
    if (n == 12) return 1;
    if (low[8] != '_' || n == 13) return 0;
    for (size_t i = 9; i < n - 4; i++)
        if (!isdigit((unsigned char)low[i])) return 0;
    return 1;
}

typedef struct hip_found {
    char *out;
    size_t outlen;
    int found;
} hip_found;

static int note_hip(const char *name, void *ctx) {
    hip_found *h = ctx;
    if (!coli_is_hip_runtime_name(name)) return 0;
    snprintf(h->out, h->outlen, "%s", name);
    h->found = 1;
    return 1;
}

int coli_hip_import(const char *path, char *out, size_t outlen, char *err, size_t errlen) {
    hip_found h = {out, outlen, 0};
    if (outlen) out[0] = 0;
    if (coli_imports_each(path, note_hip, &h, err, errlen)) return -1;
    return h.found;
}
