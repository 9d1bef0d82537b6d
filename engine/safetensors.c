#if !defined(_WIN32)
#define _DEFAULT_SOURCE /* madvise */
#define _POSIX_C_SOURCE 200809L
#endif
#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "utf8.h"

#if defined(_WIN32)
#include <windows.h>
#else
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

static const struct { const char *name; st_dtype dtype; size_t size; } DTYPES[] = {
    {"F64", ST_F64, 8}, {"F32", ST_F32, 4}, {"F16", ST_F16, 2}, {"BF16", ST_BF16, 2},
    {"I64", ST_I64, 8}, {"I32", ST_I32, 4}, {"I16", ST_I16, 2}, {"I8", ST_I8, 1},
    {"U8", ST_U8, 1},   {"BOOL", ST_BOOL, 1}, {"F8_E4M3", ST_F8_E4M3, 1}, {"F8_E5M2", ST_F8_E5M2, 1},
};
#define NDTYPES (sizeof DTYPES / sizeof DTYPES[0])

const char *st_dtype_name(st_dtype d) {
    for (size_t i = 0; i < NDTYPES; i++)
        if (DTYPES[i].dtype == d) return DTYPES[i].name;
    return "?";
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* ---- mapping --------------------------------------------------------- */

static int map_file(st_file *f, char *err, size_t errlen) {
#if defined(_WIN32)
    wchar_t wide[32768];
    if (!MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, f->path, -1, wide, 32768)) {
        snprintf(err, errlen, "%s: path is not valid UTF-8", f->path);
        return 1;
    }
    HANDLE h = CreateFileW(wide, GENERIC_READ, FILE_SHARE_READ, NULL, OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, NULL);
    if (h == INVALID_HANDLE_VALUE) {
        snprintf(err, errlen, "%s: cannot open (Windows error %lu)", f->path, (unsigned long)GetLastError());
        return 1;
    }
    LARGE_INTEGER size;
    if (!GetFileSizeEx(h, &size)) {
        CloseHandle(h);
        snprintf(err, errlen, "%s: cannot read its size", f->path);
        return 1;
    }
    f->size = (size_t)size.QuadPart;
    if (f->size == 0) {
        CloseHandle(h);
        snprintf(err, errlen, "%s: file is empty", f->path);
        return 1;
    }
    HANDLE m = CreateFileMappingW(h, NULL, PAGE_READONLY, 0, 0, NULL);
    CloseHandle(h);
    if (!m) {
        snprintf(err, errlen, "%s: cannot map (Windows error %lu)", f->path, (unsigned long)GetLastError());
        return 1;
    }
    f->map = MapViewOfFile(m, FILE_MAP_READ, 0, 0, 0);
    if (!f->map) {
        CloseHandle(m);
        snprintf(err, errlen, "%s: cannot map (Windows error %lu)", f->path, (unsigned long)GetLastError());
        return 1;
    }
    f->handle = m;
    return 0;
#else
    int fd = open(f->path, O_RDONLY);
    struct stat st;
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot open: %s", f->path, strerror(errno));
        return 1;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        snprintf(err, errlen, "%s: not a regular file", f->path);
        return 1;
    }
    f->size = (size_t)st.st_size;
    if (f->size == 0) {
        close(fd);
        snprintf(err, errlen, "%s: file is empty", f->path);
        return 1;
    }
    f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        snprintf(err, errlen, "%s: cannot map: %s", f->path, strerror(errno));
        close(fd);
        return 1;
    }
    close(fd);
    return 0;
#endif
}

static void unmap_file(st_file *f) {
    if (!f->map) return;
#if defined(_WIN32)
    UnmapViewOfFile(f->map);
    CloseHandle((HANDLE)f->handle);
#else
    munmap(f->map, f->size);
#endif
    f->map = NULL;
}

/* ---- header ---------------------------------------------------------- */

static int cmp_begin(const void *a, const void *b) {
    const st_tensor *x = a, *y = b;
    return x->data < y->data ? -1 : x->data > y->data;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(st_tensor *const *)a)->name, (*(st_tensor *const *)b)->name);
}

/* The tensor called `name` among `count` sorted by name (a binary search), or NULL. */
static const st_tensor *sorted_find(st_tensor *const *by_name, size_t count, const char *name) {
    size_t lo = 0, hi = count;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        const int c = strcmp(by_name[mid]->name, name);
        if (c == 0) return by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

static const st_tensor *file_find(const st_file *f, const char *name) {
    return sorted_find(f->by_name, f->count, name);
}

static int entry(st_file *f, const char *name, const json_value *v, const uint8_t *base, uint64_t data_size,
                 st_tensor *t, char *err, size_t errlen) {
    const json_value *dtype = json_get(v, "dtype"), *shape = json_get(v, "shape"), *offs = json_get(v, "data_offsets");
    size_t esize = 0;
    memset(t, 0, sizeof *t);
    if (v->type != JSON_OBJECT || !dtype || !shape || !offs) {
        snprintf(err, errlen, "%s: tensor '%s': header entry needs dtype, shape and data_offsets", f->path, name);
        return 1;
    }
    if (dtype->type != JSON_STRING) {
        snprintf(err, errlen, "%s: tensor '%s': dtype is not a string", f->path, name);
        return 1;
    }
    for (size_t i = 0; i < NDTYPES; i++)
        if (strcmp(dtype->string, DTYPES[i].name) == 0) {
            t->dtype = DTYPES[i].dtype;
            esize = DTYPES[i].size;
        }
    if (!esize) {
        snprintf(err, errlen, "%s: tensor '%s': unknown dtype '%s'", f->path, name, dtype->string);
        return 1;
    }
    if (shape->type != JSON_ARRAY || shape->count > ST_MAX_DIMS) {
        snprintf(err, errlen, "%s: tensor '%s': shape must be an array of at most %d sizes", f->path, name, ST_MAX_DIMS);
        return 1;
    }
    uint64_t numel = 1;
    for (size_t i = 0; i < shape->count; i++) {
        const json_value *d = &shape->items[i];
        if (d->type != JSON_NUMBER || !d->is_integer || d->integer < 0 || d->integer > ((int64_t)1 << 40)) {
            snprintf(err, errlen, "%s: tensor '%s': shape[%zu] is not a size", f->path, name, i);
            return 1;
        }
        t->shape[i] = d->integer;
        if (d->integer && numel > (UINT64_MAX / 16) / (uint64_t)d->integer) {
            snprintf(err, errlen, "%s: tensor '%s': shape overflows", f->path, name);
            return 1;
        }
        numel *= (uint64_t)d->integer;
    }
    t->ndim = (int)shape->count;
    t->numel = (int64_t)numel;
    if (offs->type != JSON_ARRAY || offs->count != 2) {
        snprintf(err, errlen, "%s: tensor '%s': data_offsets must be [begin, end]", f->path, name);
        return 1;
    }
    for (int i = 0; i < 2; i++)
        if (offs->items[i].type != JSON_NUMBER || !offs->items[i].is_integer || offs->items[i].integer < 0) {
            snprintf(err, errlen, "%s: tensor '%s': data_offsets are not byte offsets", f->path, name);
            return 1;
        }
    uint64_t begin = (uint64_t)offs->items[0].integer, end = (uint64_t)offs->items[1].integer;
    if (begin > end || end > data_size) {
        snprintf(err, errlen, "%s: tensor '%s': data_offsets [%llu, %llu] outside the data (%llu bytes)", f->path,
                 name, (unsigned long long)begin, (unsigned long long)end, (unsigned long long)data_size);
        return 1;
    }
    if (end - begin != numel * esize) {
        snprintf(err, errlen, "%s: tensor '%s': %llu bytes for %llu %s values (needs %llu)", f->path, name,
                 (unsigned long long)(end - begin), (unsigned long long)numel, dtype->string,
                 (unsigned long long)(numel * esize));
        return 1;
    }
    t->data = base + begin;
    t->nbytes = (size_t)(end - begin);
    t->file = f->path;
    t->name = dup_str(name);
    if (!t->name) {
        snprintf(err, errlen, "out of memory");
        return 1;
    }
    return 0;
}

int st_open(const char *path, st_file *f, char *err, size_t errlen) {
    json_value *hdr = NULL;
    char jerr[256];
    memset(f, 0, sizeof *f);
    f->path = dup_str(path);
    if (!f->path) {
        snprintf(err, errlen, "out of memory");
        return 1;
    }
    if (map_file(f, err, errlen)) goto fail;
    const uint8_t *bytes = f->map;
    if (f->size < 8) {
        snprintf(err, errlen, "%s: truncated: %zu bytes, a safetensors file starts with an 8-byte header size", path,
                 f->size);
        goto fail;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | bytes[i];
    if (n > ST_MAX_HEADER || n > f->size - 8) {
        snprintf(err, errlen, "%s: header claims %llu bytes, the file has %zu after the size field%s", path,
                 (unsigned long long)n, f->size - 8, n > ST_MAX_HEADER ? " (over the 100 MiB limit)" : "");
        goto fail;
    }
    if (json_parse((const char *)bytes + 8, (size_t)n, &hdr, jerr, sizeof jerr)) {
        snprintf(err, errlen, "%s: header is not JSON: %s", path, jerr);
        goto fail;
    }
    if (hdr->type != JSON_OBJECT) {
        snprintf(err, errlen, "%s: header is a JSON %s, not an object", path, json_type_name(hdr->type));
        goto fail;
    }
    f->tensors = calloc(hdr->count ? hdr->count : 1, sizeof *f->tensors);
    if (!f->tensors) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    const uint8_t *base = bytes + 8 + n;
    uint64_t data_size = f->size - 8 - n;
    for (size_t i = 0; i < hdr->count; i++) {
        if (strcmp(hdr->keys[i], "__metadata__") == 0) {
            if (hdr->items[i].type != JSON_OBJECT) {
                snprintf(err, errlen, "%s: __metadata__ is not an object", path);
                goto fail;
            }
            continue;
        }
        if (entry(f, hdr->keys[i], &hdr->items[i], base, data_size, &f->tensors[f->count], err, errlen)) goto fail;
        f->count++;
    }
    /* no two tensors may share a name */
    f->by_name = malloc((f->count ? f->count : 1) * sizeof *f->by_name);
    if (!f->by_name) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < f->count; i++) f->by_name[i] = &f->tensors[i];
    qsort(f->by_name, f->count, sizeof *f->by_name, cmp_name);
    for (size_t i = 1; i < f->count; i++)
        if (strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) == 0) {
            snprintf(err, errlen, "%s: tensor '%s' is listed twice", path, f->by_name[i]->name);
            goto fail;
        }
    /* nor bytes */
    st_tensor *sorted = malloc((f->count ? f->count : 1) * sizeof *sorted);
    if (!sorted) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    memcpy(sorted, f->tensors, f->count * sizeof *sorted);
    qsort(sorted, f->count, sizeof *sorted, cmp_begin);
    for (size_t i = 1; i < f->count; i++)
        if (sorted[i].data < sorted[i - 1].data + sorted[i - 1].nbytes) {
            snprintf(err, errlen, "%s: tensors '%s' and '%s' overlap", path, sorted[i - 1].name, sorted[i].name);
            free(sorted);
            goto fail;
        }
    free(sorted);
    json_free(hdr);
    return 0;
fail:
    json_free(hdr);
    st_close(f);
    return 1;
}

void st_close(st_file *f) {
    for (size_t i = 0; i < f->count; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->by_name);
    unmap_file(f);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* ---- sets of shards -------------------------------------------------- */

static char *join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

/* Every shard's names sorted together into s->by_name, for st_find's one search; non-zero,
 * with a message, where a name is in two of the set's files (which would st_find read?). */
static int set_index(st_set *s, char *err, size_t errlen) {
    size_t n = 0;
    for (size_t i = 0; i < s->nfiles; i++) n += s->files[i].count;
    st_tensor **all = malloc((n ? n : 1) * sizeof *all);
    if (!all) {
        snprintf(err, errlen, "out of memory");
        return 1;
    }
    n = 0;
    for (size_t i = 0; i < s->nfiles; i++)
        for (size_t k = 0; k < s->files[i].count; k++) all[n++] = s->files[i].by_name[k];
    qsort(all, n, sizeof *all, cmp_name);
    for (size_t i = 1; i < n; i++)
        if (strcmp(all[i - 1]->name, all[i]->name) == 0) {
            snprintf(err, errlen, "tensor '%s' is in both %s and %s", all[i]->name, all[i - 1]->file, all[i]->file);
            free(all);
            return 1;
        }
    s->by_name = all;
    s->count = n;
    return 0;
}

/* A weight_map entry: a tensor's name and the shard the index names for it. */
typedef struct map_entry {
    const char *name, *file;
} map_entry;

static int cmp_entry_file(const void *a, const void *b) {
    return strcmp(((const map_entry *)a)->file, ((const map_entry *)b)->file);
}

int st_set_open(const char *dir, st_set *s, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    char *index_path = join(dir, "model.safetensors.index.json");
    size_t len = 0;
    char *text = index_path ? coli_read_file(index_path, &len) : NULL;
    if (!text) {
        char *single = join(dir, "model.safetensors");
        s->files = calloc(1, sizeof *s->files);
        int rc = !single || !s->files || st_open(single, &s->files[0], err, errlen);
        free(single);
        free(index_path);
        if (rc) {
            free(s->files);
            s->files = NULL;
            return 1;
        }
        s->nfiles = 1;
        return 0;
    }
    json_value *idx = NULL;
    map_entry *entries = NULL;
    char jerr[256];
    int rc = 1;
    if (json_parse(text, len, &idx, jerr, sizeof jerr)) {
        snprintf(err, errlen, "%s: not JSON: %s", index_path, jerr);
        goto done;
    }
    const json_value *map = json_get(idx, "weight_map");
    if (!map || map->type != JSON_OBJECT) {
        snprintf(err, errlen, "%s: no weight_map object", index_path);
        goto done;
    }
    if (map->count == 0) { /* no shard to read, nor to name in a message */
        snprintf(err, errlen, "%s: weight_map lists no tensors", index_path);
        goto done;
    }
    s->files = calloc(map->count, sizeof *s->files);
    entries = malloc(map->count * sizeof *entries);
    if (!s->files || !entries) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < map->count; i++) {
        const json_value *file = &map->items[i];
        if (file->type != JSON_STRING || strchr(file->string, '/') || strchr(file->string, '\\') ||
            strstr(file->string, "..")) {
            snprintf(err, errlen, "%s: weight_map['%s'] is not a file name in the model folder", index_path,
                     map->keys[i]);
            goto done;
        }
        entries[i] = (map_entry){map->keys[i], file->string};
    }
    /* the entries grouped by shard, so each shard is opened once and no entry looks
     * through the shards opened before it (a large model has tens of thousands of
     * entries over a hundred or more shards) */
    qsort(entries, map->count, sizeof *entries, cmp_entry_file);
    for (size_t i = 0; i < map->count; i++) {
        if (i == 0 || strcmp(entries[i].file, entries[i - 1].file) != 0) {
            char *path = join(dir, entries[i].file);
            if (!path) {
                snprintf(err, errlen, "out of memory");
                goto done;
            }
            const int failed = st_open(path, &s->files[s->nfiles], err, errlen);
            free(path);
            if (failed) goto done;
            s->nfiles++;
        }
        if (!file_find(&s->files[s->nfiles - 1], entries[i].name)) {
            snprintf(err, errlen, "%s: tensor '%s' is listed for %s, which does not hold it", index_path,
                     entries[i].name, entries[i].file);
            goto done;
        }
    }
    if (set_index(s, err, errlen)) goto done;
    s->index_path = index_path;
    index_path = NULL;
    rc = 0;
done:
    free(entries);
    json_free(idx);
    free(text);
    free(index_path);
    if (rc) st_set_close(s);
    return rc;
}

void st_set_close(st_set *s) {
    for (size_t i = 0; i < s->nfiles; i++) st_close(&s->files[i]);
    free(s->files);
    free(s->by_name);
    free(s->index_path);
    memset(s, 0, sizeof *s);
}

const char *st_set_source(const st_set *s) { return s->index_path ? s->index_path : s->files[0].path; }

const st_tensor *st_find(const st_set *s, const char *name) {
    if (s->nfiles == 1) return file_find(&s->files[0], name);
    return sorted_find(s->by_name, s->count, name);
}

void st_release(const st_tensor *t) {
#if !defined(_WIN32)
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t b = ((uintptr_t)t->data + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    uintptr_t e = ((uintptr_t)t->data + t->nbytes) & ~((uintptr_t)page - 1);
    /* madvise, not posix_madvise: glibc's POSIX_MADV_DONTNEED does nothing. The mapping is
     * read-only and private, so the pages come back from the file if read again. */
    if (page > 0 && e > b) madvise((void *)b, e - b, MADV_DONTNEED);
#else
    (void)t; /* Windows trims the working set of a mapped view by itself */
#endif
}

/* ---- conversion ------------------------------------------------------ */

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
        }
    } else if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

int st_to_f32(const st_tensor *t, float *out, char *err, size_t errlen) {
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case ST_F32: memcpy(out, p, t->nbytes); return 0;
    case ST_F16:
        for (int64_t i = 0; i < t->numel; i++) out[i] = half_to_float((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
        return 0;
    case ST_BF16:
        for (int64_t i = 0; i < t->numel; i++) {
            uint32_t bits = (uint32_t)(p[2 * i] | (p[2 * i + 1] << 8)) << 16;
            memcpy(&out[i], &bits, sizeof bits);
        }
        return 0;
    default:
        snprintf(err, errlen, "%s: tensor '%s' has dtype %s; supported: F32, F16, BF16", t->file, t->name,
                 st_dtype_name(t->dtype));
        return 1;
    }
}
