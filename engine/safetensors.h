/* safetensors: the file is mapped, and every header entry is validated (dtype,
 * shape, offsets inside the file, no overlap) before any tensor is used. */
#ifndef COLI_SAFETENSORS_H
#define COLI_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u << 20) /* a larger header is refused as absurd */

typedef enum { ST_F64, ST_F32, ST_F16, ST_BF16, ST_I64, ST_I32, ST_I16, ST_I8, ST_U8, ST_BOOL, ST_F8_E4M3, ST_F8_E5M2 } st_dtype;

typedef struct st_tensor {
    char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    const uint8_t *data; /* inside the mapping */
    size_t nbytes;
    const char *file;    /* the owning file's path */
} st_tensor;

typedef struct st_file {
    char *path;
    void *map;
    size_t size;
    void *handle; /* platform mapping handle */
    st_tensor *tensors;
    size_t count;
    st_tensor **by_name; /* the tensors sorted by name: a model of tens of thousands of tensors is
                            looked up name by name, and a scan a name would be quadratic */
} st_file;

/* A model's tensors across one file or the shards named by model.safetensors.index.json. */
typedef struct st_set {
    st_file *files;
    size_t nfiles;
    st_tensor **by_name; /* every shard's tensors sorted by name, where there are shards */
    size_t count;
    char *index_path;    /* model.safetensors.index.json, where there are shards */
} st_set;

int st_open(const char *path, st_file *out, char *err, size_t errlen);
void st_close(st_file *f);

/* Opens DIR/model.safetensors, or every shard listed in DIR/model.safetensors.index.json
 * (refused where a tensor the index lists is not in its shard, or a name is in two shards). */
int st_set_open(const char *dir, st_set *out, char *err, size_t errlen);
void st_set_close(st_set *s);
const st_tensor *st_find(const st_set *s, const char *name);
/* Where the set's names come from, for a message: the one file, or the shards' index. */
const char *st_set_source(const st_set *s);

const char *st_dtype_name(st_dtype d);

/* Tells the OS the tensor's mapped bytes are no longer needed (they were copied
 * or quantised), so they leave the resident set. A hint: never fails. */
void st_release(const st_tensor *t);

/* Converts a F32, F16 or BF16 tensor to float32; 0 on success. */
int st_to_f32(const st_tensor *t, float *out, char *err, size_t errlen);

#endif
