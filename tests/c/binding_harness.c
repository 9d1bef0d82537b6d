/* The loader contract harness: built from the production loader source
 * (engine/loader.c, engine/hip_binding.c) unchanged, it exposes the pure helpers
 * and runs one loader scenario per process.
 *
 *   harness form VALUE|-unset [posix|windows]   -> the dir_form of a value
 *   harness join DIR NAME [posix|windows]       -> the joined path
 *   harness decide OK MAPPED same|different|unknown
 *   harness identity PATH [PATH2]               -> format and whether two paths are one file
 *   harness inventory                           -> the mapped runtimes (after --preload): count, paths
 *   harness widen PATH (Windows)                -> the path as the loader hands it to Windows
 *   --fault F (before the command)              -> one of the binding's fault points (hip_binding.h)
 *   harness refusal CONFIGURED [PATH]...        -> the decision and refusal line for an inventory
 *                                                  of those paths, from values alone (the mapped
 *                                                  modules the loaders here cannot make: two of one file)
 *   harness [--release-preloads] [--preload PATH]... open SPEC
 *                                               -> open a backend as the host does; the runtimes
 *                                                  mapped before, after, (without the preloads'
 *                                                  references) while open, and after close
 *   harness imports PATH                        -> what the file imports, and whether HIP mode
 *   harness [--preload PATH]... rawopen PATH    -> map a library with no contract at all (the OS's
 *                                                  own binding: what the contract guards against)
 *
 * Output is one JSON object on stdout. */
#if !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"
#include "hip_binding.h"
#include "imports.h"
#include "json_out.h"
#include "loader.h"

#if defined(_WIN32)
#include <windows.h>
#else
#include <dlfcn.h>
#endif

static path_style style_arg(int argc, char **argv, int i) {
#if defined(_WIN32)
    path_style dflt = PATH_STYLE_WINDOWS;
#else
    path_style dflt = PATH_STYLE_POSIX;
#endif
    if (i >= argc) return dflt;
    return strcmp(argv[i], "windows") == 0 ? PATH_STYLE_WINDOWS : PATH_STYLE_POSIX;
}

/* Whether the HIP backend a failed open named is still mapped: the loader unmaps
 * it after every refusal. */
static int backend_mapped(const char *spec) {
    char dir[4096], path[8192];
    const char *file = coli_backend_file(spec);
    if (file) {
        if (coli_exe_dir(dir, sizeof dir) || coli_path_join(dir, file,
#if defined(_WIN32)
                                                            PATH_STYLE_WINDOWS,
#else
                                                            PATH_STYLE_POSIX,
#endif
                                                            path, sizeof path))
            return 0;
    } else {
        snprintf(path, sizeof path, "%s", spec);
    }
#if defined(_WIN32)
    wchar_t *wide = coli_widen(path);
    int mapped = wide && GetModuleHandleW(wide) != NULL;
    free(wide);
    return mapped;
#else
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (h) dlclose(h);
    return h != NULL;
#endif
}

static int print_import(const char *name, void *ctx) {
    int *n = ctx;
    if ((*n)++) printf(", ");
    json_string(stdout, name);
    return 0;
}

static const char *FORMS[] = {"ok", "unset", "empty", "relative", "drive-relative", "root-relative"};
static const char *FORMATS[] = {"none", "legacy", "extended", "posix"};

static void *preloads[16];
static int npreloads, release_preloads;

static int preload(const char *path) {
#if defined(_WIN32)
    wchar_t *w = coli_widen(path);
    void *h = w ? (void *)LoadLibraryExW(w, NULL, LOAD_WITH_ALTERED_SEARCH_PATH) : NULL;
    free(w);
#else
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
#endif
    if (h && npreloads < 16) preloads[npreloads++] = h;
    return h != NULL;
}

static void drop_preloads(void) {
    for (int k = 0; k < npreloads; k++)
#if defined(_WIN32)
        FreeLibrary((HMODULE)preloads[k]);
#else
        dlclose(preloads[k]);
#endif
    npreloads = 0;
}

/* What is mapped, as the harness sees it: no fault applies. */
static int mapped_now(void) {
    coli_runtime_list list;
    const char *fault = coli_binding_fault;
    coli_binding_fault = NULL;
    int rc = coli_runtime_inventory(COLI_HIP_RUNTIME_NAME, FILE_ID_NONE, &list);
    coli_binding_fault = fault;
    int n = rc ? -1 : list.count;
    coli_runtime_list_free(&list);
    return n;
}

int main(int argc, char **argv) {
    argv = coli_args_utf8(&argc, argv);
    int i = 1;
    if (i + 1 < argc && strcmp(argv[i], "--fault") == 0) coli_binding_fault = argv[i + 1], i += 2;
    if (i < argc && strcmp(argv[i], "--release-preloads") == 0) release_preloads = 1, i++;
    while (i + 1 < argc && strcmp(argv[i], "--preload") == 0) {
        if (!preload(argv[i + 1])) {
            char why[600];
            coli_loader_error(argv[i + 1], why, sizeof why);
            printf("{\"preload_failed\": ");
            json_string(stdout, argv[i + 1]);
            printf(", \"error\": ");
            json_string(stdout, why);
            printf("}\n");
            return 3;
        }
        i += 2;
    }
    if (i >= argc) return 2;
    const char *cmd = argv[i++];
    if (!strcmp(cmd, "form") && i < argc) {
        const char *v = strcmp(argv[i], "-unset") == 0 ? NULL : argv[i];
        printf("{\"form\": \"%s\"}\n", FORMS[coli_runtime_dir_form(v, style_arg(argc, argv, i + 1))]);
        return 0;
    }
    if (!strcmp(cmd, "join") && i + 1 < argc) {
        char out[70000];
        int rc = coli_path_join(argv[i], argv[i + 1], style_arg(argc, argv, i + 2), out, sizeof out);
        printf("{\"ok\": %s, \"path\": ", rc ? "false" : "true");
        json_string(stdout, rc ? "" : out);
        printf("}\n");
        return 0;
    }
    if (!strcmp(cmd, "decide") && i + 2 < argc) {
        id_compare c = !strcmp(argv[i + 2], "same") ? ID_SAME : !strcmp(argv[i + 2], "different") ? ID_DIFFERENT : ID_UNKNOWN;
        printf("{\"decision\": \"%s\"}\n", coli_bind_decision_name(coli_bind_decide(atoi(argv[i]), atoi(argv[i + 1]), c)));
        return 0;
    }
    if (!strcmp(cmd, "identity") && i < argc) {
        coli_file_id a, b;
        int ra = coli_file_identity(argv[i], FILE_ID_NONE, &a);
        printf("{\"format\": \"%s\"", ra ? "none" : FORMATS[a.format]);
        if (i + 1 < argc) {
            int rb = coli_file_identity(argv[i + 1], ra ? FILE_ID_NONE : a.format, &b);
            id_compare c = ra || rb ? ID_UNKNOWN : coli_file_id_compare(&a, &b);
            printf(", \"compare\": \"%s\"", c == ID_SAME ? "same" : c == ID_DIFFERENT ? "different" : "unknown");
        }
        printf("}\n");
        return 0;
    }
    if (!strcmp(cmd, "classify") && i + 1 < argc) { /* the loader's words for an OS error number */
        char why[600];
#if defined(_WIN32)
        SetLastError((DWORD)strtoul(argv[i], NULL, 10));
#endif
        coli_loader_error(argv[i + 1], why, sizeof why);
        printf("{\"message\": ");
        json_string(stdout, why);
        printf("}\n");
        return 0;
    }
    if (!strcmp(cmd, "formats")) { /* a legacy id and an extended one are never compared */
        coli_file_id a, b;
        memset(&a, 0, sizeof a);
        memset(&b, 0, sizeof b);
        a.format = FILE_ID_LEGACY;
        b.format = FILE_ID_EXTENDED;
        printf("{\"compare\": \"%s\"}\n", coli_file_id_compare(&a, &b) == ID_UNKNOWN ? "unknown" : "compared");
        return 0;
    }
#if defined(_WIN32)
    if (!strcmp(cmd, "widen") && i < argc) {
        wchar_t *w = coli_widen(argv[i]);
        char *back = w ? coli_narrow(w) : NULL;
        printf("{\"wide\": ");
        json_string(stdout, back);
        printf("}\n");
        free(back);
        free(w);
        return 0;
    }
#endif
    if (!strcmp(cmd, "refusal") && i < argc) {
        coli_file_id configured;
        coli_mapped_runtime items[16];
        coli_runtime_list list = {0, items};
        char err[4096];
        if (coli_file_identity(argv[i], FILE_ID_NONE, &configured)) memset(&configured, 0, sizeof configured);
        for (int k = i + 1; k < argc && list.count < 16; k++, list.count++) {
            items[list.count].path = argv[k];
            if (coli_file_identity(argv[k], configured.format, &items[list.count].id))
                memset(&items[list.count].id, 0, sizeof items[list.count].id);
        }
        bind_decision d = coli_bind_judge(&configured, 1, &list);
        coli_bind_refusal("refusal", argv[i], &configured, 1, &list, d, err, sizeof err);
        printf("{\"decision\": \"%s\", \"message\": ", coli_bind_decision_name(d));
        json_string(stdout, err);
        printf("}\n");
        return 0;
    }
    if (!strcmp(cmd, "inventory")) {
        coli_runtime_list list;
        int rc = coli_runtime_inventory(COLI_HIP_RUNTIME_NAME, FILE_ID_NONE, &list);
        printf("{\"mapped\": %d, \"paths\": [", rc ? -1 : list.count);
        for (int k = 0; k < list.count; k++) {
            if (k) printf(", ");
            json_string(stdout, list.items[k].path);
        }
        printf("]}\n");
        coli_runtime_list_free(&list);
        return 0;
    }
    if (!strcmp(cmd, "open") && i < argc) {
        coli_backend b;
        char err[4096];
        const int before = mapped_now();
        int rc = coli_backend_open(argv[i], &b, err, sizeof err);
        printf("{\"ok\": %s, ", rc ? "false" : "true");
        if (rc) {
            printf("\"error\": ");
            json_string(stdout, err);
            printf(", \"backend_mapped_after\": %s", backend_mapped(argv[i]) ? "true" : "false");
            printf(", \"mapped_after\": %d", mapped_now());
        } else {
            printf("\"backend\": ");
            json_string(stdout, b.name);
            printf(", \"runtime\": ");
            json_string(stdout, b.hip ? b.hip->runtime_path : NULL);
            printf(", \"reused\": %s", b.hip && b.hip->reused ? "true" : "false");
            printf(", \"mapped_after\": %d", mapped_now());
            /* the binding's own reference: the preloads' references dropped, the runtime stays
             * mapped while the backend is open, and goes once it is closed */
            if (release_preloads) {
                drop_preloads();
                printf(", \"mapped_held\": %d", mapped_now());
            }
            coli_backend_close(&b);
            printf(", \"mapped_after_close\": %d", mapped_now());
        }
        printf(", \"mapped_before\": %d}\n", before);
        return rc ? 1 : 0;
    }
    if (!strcmp(cmd, "imports") && i < argc) {
        char err[600], runtime[512];
        printf("{\"imports\": [");
        int n = 0;
        int rc = coli_imports_each(argv[i], print_import, &n, err, sizeof err);
        int hip = rc ? -1 : coli_hip_import(argv[i], runtime, sizeof runtime, err, sizeof err);
        printf("], \"read\": %s, \"hip\": ", rc ? "false" : "true");
        json_string(stdout, hip > 0 ? runtime : NULL);
        printf(", \"error\": ");
        json_string(stdout, rc ? err : NULL);
        printf("}\n");
        return rc ? 1 : 0;
    }
    if (!strcmp(cmd, "rawopen") && i < argc) {
        char (*bound)(void) = NULL;
#if defined(_WIN32)
        wchar_t *wide = coli_widen(argv[i]);
        HMODULE h = wide ? LoadLibraryExW(wide, NULL, LOAD_WITH_ALTERED_SEARCH_PATH) : NULL;
        free(wide);
        FARPROC f = h ? GetProcAddress(h, "coli_test_bound_runtime") : NULL;
        memcpy(&bound, &f, sizeof bound);
#else
        void *h = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
        void *f = h ? dlsym(h, "coli_test_bound_runtime") : NULL;
        memcpy(&bound, &f, sizeof bound);
#endif
        printf("{\"ok\": %s, \"bound\": \"%c\"}\n", bound ? "true" : "false", bound ? bound() : '-');
        return bound ? 0 : 1;
    }
    fprintf(stderr, "harness: unknown command\n");
    return 2;
}
