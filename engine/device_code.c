#include "device_code.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "imports.h"

static const char BUNDLE_MAGIC[] = "__CLANG_OFFLOAD_BUNDLE__"; /* 24 bytes, no NUL in the file */
#define BUNDLE_MAGIC_LEN 24
#define FATBIN_MAGIC 0xBA55ED50u
#define FATBIN_PTX 1
#define FATBIN_ELF 2
#define FATBIN_ARCH_SPECIFIC 0x100000u
#define FATBIN_FAMILY_SPECIFIC 0x200000u

static uint64_t get(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void add(coli_device_code *out, const char *target) {
    for (int i = 0; i < out->count; i++)
        if (!strcmp(out->targets[i], target)) return;
    if (out->count < COLI_CODE_MAX) snprintf(out->targets[out->count++], sizeof out->targets[0], "%s", target);
}

static const uint8_t *find(const uint8_t *p, const uint8_t *end, const void *what, size_t n) {
    for (; p + n <= end; p++)
        if (*p == *(const uint8_t *)what && !memcmp(p, what, n)) return p;
    return NULL;
}

/* Every bundle in a section (one per translation unit, aligned): the amdgcn triples'
 * target ids (hipv4-amdgcn-amd-amdhsa--gfx90a:xnack- gives gfx90a:xnack-). */
static const char *bundles(const uint8_t *data, size_t size, coli_device_code *out) {
    const uint8_t *end = data + size, *p = data;
    for (;;) {
        const uint8_t *plain = find(p, end, BUNDLE_MAGIC, BUNDLE_MAGIC_LEN), *packed = find(p, end, "CCOB", 4);
        if (packed && (!plain || packed < plain)) { /* its triples are inside the compressed stream */
            out->compressed++;
            p = packed + 4;
            continue;
        }
        if (!plain) return NULL;
        p = plain + BUNDLE_MAGIC_LEN;
        if (end - p < 8) return "an offload bundle's header is cut off";
        const uint64_t count = get(p, 8);
        if (count > 4096) return "an offload bundle claims more than 4096 entries";
        p += 8;
        uint64_t past = 0; /* the end of its furthest code object, from its magic */
        for (uint64_t i = 0; i < count; i++) {
            if (end - p < 24) return "an offload bundle's entry is cut off";
            const uint64_t off = get(p, 8), bytes = get(p + 8, 8), len = get(p + 16, 8);
            if (off <= (uint64_t)(end - plain) && bytes <= (uint64_t)(end - plain) - off && off + bytes > past)
                past = off + bytes;
            p += 24;
            if (len > 1024 || (uint64_t)(end - p) < len) return "an offload bundle's triple is cut off";
            char triple[1025];
            memcpy(triple, p, (size_t)len);
            triple[len] = 0;
            p += len;
            const char *id = strstr(triple, "--");
            if (strstr(triple, "amdgcn") && id) add(out, id + 2);
        }
        if (plain + past > p) p = plain + past; /* never a magic inside a code object */
    }
}

static const char *fatbins(const uint8_t *data, size_t size, coli_device_code *out) {
    size_t pos = 0;
    while (pos + 16 <= size) {
        if (get(data + pos, 4) != FATBIN_MAGIC) { /* fatbins are aligned: padding between them */
            pos += 8;
            continue;
        }
        const uint64_t hsize = get(data + pos + 6, 2), fsize = get(data + pos + 8, 8);
        if (hsize > size - pos || fsize > size - pos - hsize) return "a fatbin is cut off";
        size_t p = pos + (size_t)hsize;
        const size_t end = p + (size_t)fsize;
        while (p + 32 <= end) {
            const uint64_t kind = get(data + p, 2), ehsize = get(data + p + 4, 4), payload = get(data + p + 8, 8);
            const uint64_t arch = get(data + p + 28, 4), flags = ehsize >= 48 ? get(data + p + 40, 8) : 0;
            if (ehsize < 32 || ehsize > end - p) return "a fatbin entry's header is malformed";
            const char *suffix = flags & FATBIN_ARCH_SPECIFIC ? "a" : flags & FATBIN_FAMILY_SPECIFIC ? "f" : "";
            char target[48];
            snprintf(target, sizeof target, "%s_%u%s", kind == FATBIN_PTX ? "compute" : "sm", (unsigned)arch, suffix);
            if (kind == FATBIN_PTX || kind == FATBIN_ELF) add(out, target);
            if (payload > end - p - ehsize) return "a fatbin entry is cut off";
            p += (size_t)(ehsize + payload);
        }
        pos = end;
    }
    return NULL;
}

int coli_device_code_read(const char *path, coli_device_code *out, char *err, size_t errlen) {
    static const char *const SECTIONS[][2] = {{".hip_fatbin", ".hip_fat"}, {".nv_fatbin", ".nv_fatb"}};
    memset(out, 0, sizeof *out);
    for (int s = 0; s < 2; s++) {
        uint8_t *data;
        size_t size;
        const int rc = coli_image_section(path, SECTIONS[s][0], SECTIONS[s][1], &data, &size, err, errlen);
        if (rc < 0) return -1;
        if (rc == 0) continue;
        out->found = 1;
        const char *why = s == 0 ? bundles(data, size, out) : fatbins(data, size, out);
        free(data);
        if (why) {
            snprintf(err, errlen, "%s", why);
            return -1;
        }
    }
    return 0;
}

/* gfx90a:sramecc+:xnack- -> the processor (gfx90a) and whether `feature` (xnack) is
 * given on (1), off (0) or not at all (-1). */
static int feature(const char *id, const char *name) {
    const size_t n = strlen(name);
    for (const char *p = strchr(id, ':'); p; p = strchr(p + 1, ':'))
        if (!strncmp(p + 1, name, n) && (p[1 + n] == '+' || p[1 + n] == '-')) return p[1 + n] == '+';
    return -1;
}

static int same_processor(const char *a, const char *b) {
    const size_t na = strcspn(a, ":"), nb = strcspn(b, ":");
    return na == nb && !strncmp(a, b, na);
}

/* sm_90 -> 90, compute_90a -> 90 with its suffix 'a'; -1 for anything else. */
static int cuda_arch(const char *s, const char *prefix, char *suffix) {
    const size_t n = strlen(prefix);
    char *end;
    if (strncmp(s, prefix, n) || s[n] < '0' || s[n] > '9') return -1;
    const long v = strtol(s + n, &end, 10);
    *suffix = *end;
    return (int)v;
}

/* CUDA's rules: machine code runs on its arch and the later ones of its major; PTX is
 * compiled as it loads for its arch and every later one; an arch-specific build (90a)
 * runs on that arch alone, a family-specific one (100f) on its major from its arch on. */
static int cuda_runs(const char *target, int device) {
    char suffix;
    int arch = cuda_arch(target, "sm_", &suffix), same_major = 1;
    if (arch < 0) {
        arch = cuda_arch(target, "compute_", &suffix);
        same_major = 0;
    }
    if (arch < 0 || device < arch) return 0;
    if (suffix == 'a') return device == arch;
    return !(same_major || suffix == 'f') || device / 10 == arch / 10;
}

int coli_device_code_runs_on(const coli_device_code *code, const char *arch) {
    static const char *const FEATURES[] = {"xnack", "sramecc"};
    char suffix;
    const int sm = cuda_arch(arch, "sm_", &suffix);
    for (int i = 0; i < code->count; i++) {
        const char *t = code->targets[i];
        if (sm >= 0) {
            if (cuda_runs(t, sm)) return 1;
        } else if (!strncmp(t, "gfx", 3) && same_processor(t, arch)) {
            int fits = 1;
            for (size_t f = 0; f < sizeof FEATURES / sizeof FEATURES[0]; f++) {
                const int want = feature(t, FEATURES[f]), have = feature(arch, FEATURES[f]);
                if (want >= 0 && have >= 0 && want != have) fits = 0;
            }
            if (fits) return 1;
        }
    }
    return 0;
}
