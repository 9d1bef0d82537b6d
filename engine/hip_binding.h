/* The HIP runtime binding contract: the host binds exactly the runtime that
 * COLI_HIP_RUNTIME_DIR names, or refuses the GPU tier. Identity is the physical
 * file (volume + file id, or st_dev + st_ino), never path text.
 *
 * The pure helpers (path rules, join, identity comparison, the decision) are
 * separate from the system calls so they can be tested on their own. */
#ifndef COLI_HIP_BINDING_H
#define COLI_HIP_BINDING_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define COLI_HIP_RUNTIME_NAME_DEFAULT "amdhip64_7.dll"
#else
#define COLI_HIP_RUNTIME_NAME_DEFAULT "libamdhip64.so.5"
#endif
#ifndef COLI_HIP_RUNTIME_NAME
#define COLI_HIP_RUNTIME_NAME COLI_HIP_RUNTIME_NAME_DEFAULT
#endif

#define COLI_HIP_RUNTIME_ENV "COLI_HIP_RUNTIME_DIR"

/* ---- pure helpers ------------------------------------------------------- */

typedef enum { PATH_STYLE_POSIX, PATH_STYLE_WINDOWS } path_style;

typedef enum {
    DIR_OK,
    DIR_UNSET,
    DIR_EMPTY,
    DIR_RELATIVE,
    DIR_DRIVE_RELATIVE, /* C:runtime */
    DIR_ROOT_RELATIVE,  /* \runtime */
} dir_form;

/* Classifies a COLI_HIP_RUNTIME_DIR value by its text alone (NULL: unset). */
dir_form coli_runtime_dir_form(const char *value, path_style style);

/* dir + sep + name with exactly one separator between them; 0 on success. */
int coli_path_join(const char *dir, const char *name, path_style style, char *out, size_t outlen);

typedef enum { FILE_ID_NONE, FILE_ID_LEGACY, FILE_ID_EXTENDED, FILE_ID_POSIX } file_id_format;

/* LEGACY: volume serial (32 bits) + file index (64); EXTENDED: FILE_ID_INFO's
 * volume serial (64) + 128-bit id; POSIX: st_dev + st_ino. */
typedef struct coli_file_id {
    file_id_format format;
    uint64_t volume;
    uint8_t id[16];
} coli_file_id;

typedef enum { ID_SAME, ID_DIFFERENT, ID_UNKNOWN } id_compare;

/* Two identities of different formats are never compared: ID_UNKNOWN. */
id_compare coli_file_id_compare(const coli_file_id *a, const coli_file_id *b);

typedef enum {
    BIND_LOAD,               /* none mapped: load the configured file by its exact path */
    BIND_REUSE,              /* the configured file is the one mapped */
    BIND_REJECT_DIFFERENT,   /* another file of that name is mapped */
    BIND_REJECT_MULTIPLE,    /* more than one is mapped */
    BIND_REJECT_UNVERIFIABLE /* the inventory or an identity could not be established */
} bind_decision;

/* inventory_ok: the enumeration completed (a failed one is never "none loaded");
 * mapped: the modules mapped under the runtime's name, each counted; single: how the one
 * mapped file compares with the configured one (ignored unless mapped == 1). */
bind_decision coli_bind_decide(int inventory_ok, int mapped, id_compare single);
const char *coli_bind_decision_name(bind_decision d);

/* ---- the contract --------------------------------------------------------- */

typedef struct coli_hip_binding {
    void *runtime;           /* this host's own counted reference to the runtime, loaded or reused */
    char runtime_path[4096]; /* the configured file */
    coli_file_id identity;
    int reused;
} coli_hip_binding;

/* Validates COLI_HIP_RUNTIME_DIR, inventories the mapped runtimes, decides, and
 * loads or reuses the configured runtime, taking one counted reference to it either
 * way; verifies it after it maps. 0 on
 * success; otherwise `err` holds one line starting "[HIP] " (the caller adds
 * that the GPU tier is off) and nothing stays acquired. */
int coli_hip_bind(coli_hip_binding *b, char *err, size_t errlen);

/* Re-checks, after the backend mapped, that exactly the configured runtime is mapped. */
int coli_hip_verify(const coli_hip_binding *b, const char *stage, char *err, size_t errlen);

void coli_hip_release(coli_hip_binding *b);

/* ---- platform pieces, exposed for the contract tests ----------------------- */

/* 0 with the file's identity; -1 when it cannot be established. `want` is the
 * format to produce (FILE_ID_NONE: the best available). */
int coli_file_identity(const char *path, file_id_format want, coli_file_id *out);

/* One module the inventory found: its file's identity (FILE_ID_NONE when it cannot
 * be read) and the path it was mapped from (UTF-8, for messages; NULL when it cannot
 * be read). */
typedef struct coli_mapped_runtime {
    coli_file_id id;
    char *path;
} coli_mapped_runtime;

typedef struct coli_runtime_list {
    int count;
    coli_mapped_runtime *items;
} coli_runtime_list;

/* The modules mapped in this process whose name is `name` (Windows: case-
 * insensitive module name; POSIX: the soname family, libfoo.so*), each counted:
 * two modules of one physical file are two, as the seed counts them. 0 with the
 * list (identities in `format`), or -1 when the module list could not be read
 * whole (the snapshot, the enumeration or an allocation failed): never a partial
 * list. Free the list with coli_runtime_list_free either way. */
int coli_runtime_inventory(const char *name, file_id_format format, coli_runtime_list *out);
void coli_runtime_list_free(coli_runtime_list *list);

/* The decision for an inventory (read: it was read whole) against the configured
 * file's identity: coli_bind_decide on the count and the one module's identity, and
 * reject-unverifiable where none is mapped but the configured file's identity is
 * unknown (what it loads could not be proved to be it). */
bind_decision coli_bind_judge(const coli_file_id *configured, int read, const coli_runtime_list *list);

/* The one-line refusal for a decision, from values alone: the stage, the configured
 * file, every mapped module's path (and whether two are one file), the decision. */
void coli_bind_refusal(const char *stage, const char *configured_path, const coli_file_id *configured, int read,
                       const coli_runtime_list *list, bind_decision decision, char *err, size_t errlen);

/* What coli_hip_bind would do, decided and not done: COLI_HIP_RUNTIME_DIR and its file
 * checked, the configured file's identity read and the mapped runtimes inventoried, as
 * the bind does before it loads anything (`coli doctor` shows it). */
typedef struct coli_hip_plan {
    char dir[4096];          /* COLI_HIP_RUNTIME_DIR as UTF-8 ("" when unset) */
    int dir_set;
    dir_form form;
    char runtime_path[4096]; /* the configured file ("" when the folder was refused) */
    coli_file_id identity;   /* FILE_ID_NONE when it cannot be read */
    int read;                /* the module list was read whole */
    coli_runtime_list mapped;
    bind_decision decision;
} coli_hip_plan;

/* 0 with the plan (free p->mapped with coli_runtime_list_free); 1 with the line in
 * `err` when the folder or the file in it is wrong: then only the folder's fields are
 * set and nothing was inventoried. */
int coli_hip_plan_bind(coli_hip_plan *p, char *err, size_t errlen);

#if defined(COLI_BINDING_FAULTS)
/* Test builds only (the contract harness): makes one system call of the binding
 * fail as the OS can. "snapshot", "enumerate", "alloc", "module-path" and
 * "module-identity" act on the inventory, from its N-th run on with "@N" (1: before
 * loading, 2: after the runtime loaded, 3: after the backend mapped);
 * "file-identity" on the configured file's identity; "no-file-id-info" makes
 * FILE_ID_INFO unavailable (Windows), so both sides fall back to the legacy id. */
extern const char *coli_binding_fault;
#endif

/* The directory of the running executable, without a trailing separator. */
int coli_exe_dir(char *out, size_t outlen);

/* The OS loader's error for the last failed load, classified: "missing file",
 * "missing dependency", ... with its number, into out. */
void coli_loader_error(const char *path, char *out, size_t outlen);

#endif
