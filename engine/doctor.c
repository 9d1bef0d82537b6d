#if !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#endif
#include "doctor.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "device_code.h"
#include "doctor_system.h"
#include "imports.h"
#include "json_out.h"
#include "loader.h"
#include "utf8.h"

#ifndef COLI_VERSION
#define COLI_VERSION "0.0.0"
#endif

#if defined(_WIN32)
#define STYLE PATH_STYLE_WINDOWS
#define SYSTEM_PLACE "System32"
#define SYSTEM_LABEL "in System32"
#else
#define STYLE PATH_STYLE_POSIX
#define SYSTEM_PLACE "the system's library folders"
#define SYSTEM_LABEL "in system folders"
#endif

#define API_COUNT 3
#define GPU_MAX 16
#define VERDICT_MAX 32

static const char *const APIS[API_COUNT] = {"ref", "cuda", "hip"};

typedef struct gpu {
    coli_device_info info;
    int integrated; /* -1: the backend cannot say */
    int has_code;   /* -1: unknown (its code is compressed, or in no section the doctor reads) */
} gpu;

typedef struct backend_report {
    const char *api;
    char path[4096];
    int present;
    char hip_import[512]; /* the HIP runtime it imports, "" for none */
    char read_error[700]; /* its import table or device code could not be read */
    coli_device_code code;
    int opened;
    char open_error[4500];
    uint32_t abi;
    char name[32];
    int described; /* runtime_describe answered */
    coli_runtime_info runtime;
    int asked; /* device_count answered */
    int gpus;
    gpu gpu[GPU_MAX];
} backend_report;

typedef struct verdict {
    int problem; /* else a warning */
    const char *code;
    char what[4800];
    char fix[1600];
} verdict;

typedef struct report {
    coli_platform platform;
    char folder[4096];
    backend_report b[API_COUNT];
    int hip_wanted; /* a backend here imports the HIP runtime */
    int planned;    /* the folder and file were right: the plan holds a decision */
    coli_hip_plan plan;
    char plan_error[1500];
    char configured_version[64];
    char mapped_version[8][64];
    coli_system_runtimes system;
    char system_version[COLI_SYSTEM_RUNTIMES_MAX][64];
    int system_same[COLI_SYSTEM_RUNTIMES_MAX]; /* is the configured file itself */
    char refusal[4500];
    int verdicts;
    verdict v[VERDICT_MAX];
} report;

static void add(report *r, int problem, const char *code, const char *fix, const char *fmt, ...) {
    if (r->verdicts == VERDICT_MAX) return;
    verdict *v = &r->v[r->verdicts++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->what, sizeof v->what, fmt, ap);
    va_end(ap);
    v->problem = problem;
    v->code = code;
    snprintf(v->fix, sizeof v->fix, "%s", fix);
}

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
#if defined(_WIN32)
    const char *back = strrchr(path, '\\');
    if (back && (!slash || back > slash)) slash = back;
#endif
    return slash ? slash + 1 : path;
}

/* ---- gathering ---------------------------------------------------------------------- */

/* What the file says before anything maps it: its HIP import and its device code. */
static void inspect_file(report *r, backend_report *b) {
    char err[600];
    if (coli_path_join(r->folder, coli_backend_file(b->api), STYLE, b->path, sizeof b->path)) return;
    b->present = coli_path_kind(b->path) == 0;
    if (!b->present) return;
    if (coli_hip_import(b->path, b->hip_import, sizeof b->hip_import, err, sizeof err) < 0)
        snprintf(b->read_error, sizeof b->read_error, "its import table cannot be read: %s", err);
    else if (strcmp(b->api, "ref") && coli_device_code_read(b->path, &b->code, err, sizeof err))
        snprintf(b->read_error, sizeof b->read_error, "its device code cannot be read: %s", err);
    if (b->hip_import[0]) r->hip_wanted = 1;
}

/* The binding decided, as coli_hip_bind decides it before it loads anything. */
static void plan_hip(report *r) {
    r->planned = coli_hip_plan_bind(&r->plan, r->plan_error, sizeof r->plan_error) == 0;
    coli_system_runtimes_find(&r->system);
    for (int i = 0; i < r->system.count; i++) {
        coli_file_id id;
        (void)coli_file_version(r->system.paths[i], r->system_version[i], sizeof r->system_version[0]);
        r->system_same[i] = r->planned && !coli_file_identity(r->system.paths[i], r->plan.identity.format, &id) &&
                            coli_file_id_compare(&id, &r->plan.identity) == ID_SAME;
    }
    if (!r->planned) return;
    (void)coli_file_version(r->plan.runtime_path, r->configured_version, sizeof r->configured_version);
    for (int i = 0; i < r->plan.mapped.count && i < 8; i++)
        if (r->plan.mapped.items[i].path)
            (void)coli_file_version(r->plan.mapped.items[i].path, r->mapped_version[i], sizeof r->mapped_version[0]);
    if (r->plan.decision != BIND_LOAD && r->plan.decision != BIND_REUSE)
        coli_bind_refusal("before loading", r->plan.runtime_path, &r->plan.identity, r->plan.read, &r->plan.mapped,
                          r->plan.decision, r->refusal, sizeof r->refusal);
}

/* Opens the backend the way a run does (in HIP mode: bind, map, check again) and asks
 * its runtime for its devices; backend_init is never called. */
static void ask_backend(report *r, backend_report *b, int text) {
    if (!b->present || b->read_error[0]) return;
    if (b->hip_import[0] &&
        (!r->planned || (r->plan.decision != BIND_LOAD && r->plan.decision != BIND_REUSE) ||
         strcmp(b->hip_import, COLI_HIP_RUNTIME_NAME)))
        return; /* the decision already says why it would not start */
    coli_backend be;
    if (text && b->hip_import[0]) /* a runtime that crashes as it loads leaves this line behind */
        fprintf(stderr, "coli doctor: binding %s to ask it for its GPUs\n", r->plan.runtime_path);
    if (coli_backend_open(b->path, &be, b->open_error, sizeof b->open_error)) return;
    b->opened = 1;
    b->abi = be.api.abi_version();
    snprintf(b->name, sizeof b->name, "%s", be.name);
    if (strcmp(b->api, "ref")) {
        if (be.api.runtime_describe && be.api.runtime_describe(&b->runtime) == COLI_OK) b->described = 1;
        int32_t n = 0;
        if (be.api.device_count(&n) == COLI_OK) b->asked = 1;
        for (int32_t d = 0; d < n && b->gpus < GPU_MAX; d++) {
            gpu *g = &b->gpu[b->gpus];
            memset(g, 0, sizeof *g);
            if (be.api.device_describe(d, &g->info) != COLI_OK)
                snprintf(g->info.name, sizeof g->info.name, "(cannot be described: %.90s)", be.api.last_error());
            int32_t integrated = -1;
            g->integrated = be.api.device_integrated && be.api.device_integrated(d, &integrated) == COLI_OK
                                ? integrated != 0
                                : -1;
            /* no device-code section (a backend whose code is not in a bundle or fatbin) or only
             * compressed bundles: unknown, not absent */
            g->has_code = b->code.count || (b->code.found && !b->code.compressed)
                              ? coli_device_code_runs_on(&b->code, g->info.arch)
                              : -1;
            b->gpus++;
        }
    }
    coli_backend_close(&be);
}

/* ---- verdicts ------------------------------------------------------------------------ */

static void code_list(const coli_device_code *c, char *out, size_t outlen) {
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < c->count && at < outlen; i++) {
        int n = snprintf(out + at, outlen - at, "%s%s", i ? ", " : "", c->targets[i]);
        if (n < 0) return;
        at += (size_t)n;
    }
    if (!c->count && at < outlen) snprintf(out + at, outlen - at, "%s", c->compressed ? "compressed" : "none");
}

static void judge_hip(report *r) {
    char fix[1600];
    if (!r->planned) {
        char why[1500];
        snprintf(why, sizeof why, "%s", r->plan_error + (strncmp(r->plan_error, "[HIP] ", 6) ? 0 : 6));
        why[strcspn(why, ";")] = 0; /* its advice is the fix below, in full */
        int same = -1;
        for (int i = 0; i < r->system.count && same < 0; i++)
            if (!strcmp(base_name(r->system.paths[i]), COLI_HIP_RUNTIME_NAME)) same = i;
        if (same >= 0)
            snprintf(fix, sizeof fix,
                     "set " COLI_HIP_RUNTIME_ENV " to the absolute path of the folder holding %s: your HIP SDK's, or "
                     "%s for the driver's own (%s)",
                     COLI_HIP_RUNTIME_NAME, r->system.folder, r->system_version[same][0] ? r->system_version[same] : "version unknown");
        else
            snprintf(fix, sizeof fix,
                     "set " COLI_HIP_RUNTIME_ENV " to the absolute path of the folder holding %s (the HIP SDK's or "
                     "ROCm's; install one that ships it if none does)",
                     COLI_HIP_RUNTIME_NAME);
        add(r, 1, "runtime-folder", fix, "%s", why);
        return;
    }
    switch (r->plan.decision) {
    case BIND_LOAD:
    case BIND_REUSE: break;
    case BIND_REJECT_DIFFERENT:
        add(r, 1, "runtime-refused",
            "something in this process loaded another runtime before coli: point " COLI_HIP_RUNTIME_ENV
            " at that one's folder, or stop it being loaded first (a preload, a DLL injected by another program)",
            "%s", r->refusal + 6);
        break;
    case BIND_REJECT_MULTIPLE:
        add(r, 1, "runtime-refused",
            "more than one runtime of that name is in this process: remove the preloads so that only the configured one maps",
            "%s", r->refusal + 6);
        break;
    case BIND_REJECT_UNVERIFIABLE:
        add(r, 1, "runtime-refused",
            "put the runtime on a local drive whose file system gives files an identity (NTFS, ext4), and run coli "
            "there",
            "%s", r->refusal + 6);
        break;
    }
    for (int i = 0; i < r->system.count; i++)
        if (!r->system_same[i] && !strcmp(base_name(r->system.paths[i]), COLI_HIP_RUNTIME_NAME))
            add(r, 0, "system-runtime",
                "nothing to do for coli alone: it loads the configured file by its path; but a program that loads "
                "the runtime by name into coli's process gets " SYSTEM_PLACE "'s, and coli then refuses the GPU tier",
                "%s (%s) is another %s than the configured %s (%s)", r->system.paths[i],
                r->system_version[i][0] ? r->system_version[i] : "version unknown", COLI_HIP_RUNTIME_NAME,
                r->plan.runtime_path, r->configured_version[0] ? r->configured_version : "version unknown");
}

static void judge_gpus(report *r, backend_report *b) {
    char fix[1600], code[1024];
    const char *file = coli_backend_file(b->api);
    if (b->described && b->runtime.driver_too_old) {
        add(r, 1, "old-driver", "update the GPU driver (AMD Software: Adrenalin Edition on Windows, amdgpu on Linux; "
            "NVIDIA's for CUDA) to one at least as new as the runtime",
            "%s's runtime (version %d) says the installed driver (version %d) is older than it needs: %s", file,
            (int)b->runtime.runtime_version, (int)b->runtime.driver_version, b->runtime.device_error);
        return;
    }
    if (b->asked && b->gpus == 0) {
        add(r, 1, "no-gpu",
            "install or update the GPU driver, and check that the GPU is enabled and that this runtime supports it",
            "%s's runtime sees no GPU%s%s%s", file, b->runtime.device_error[0] ? " (" : "", b->runtime.device_error,
            b->runtime.device_error[0] ? ")" : "");
        return;
    }
    code_list(&b->code, code, sizeof code);
    int first_with_code = -1, first_discrete = -1;
    for (int d = 0; d < b->gpus; d++) {
        if (b->gpu[d].has_code != 0 && first_with_code < 0) first_with_code = d;
        if (b->gpu[d].integrated == 0 && b->gpu[d].has_code != 0 && first_discrete < 0) first_discrete = d;
    }
    for (int d = 0; d < b->gpus; d++) {
        const gpu *g = &b->gpu[d];
        if (g->has_code != 0) continue;
        if (first_with_code >= 0)
            snprintf(fix, sizeof fix, "run with --device %d (%s, %s, which it carries code for), or install the "
                     "package built for %s", first_with_code, b->gpu[first_with_code].info.name,
                     b->gpu[first_with_code].info.arch, g->info.arch);
        else
            snprintf(fix, sizeof fix, "install the package built for %s (doit build arch=%.*s)", g->info.arch,
                     (int)strcspn(g->info.arch, ":"), g->info.arch);
        add(r, d == 0 || first_with_code < 0, "arch-not-carried", fix, "GPU %d (%s, %s) has no code in %s, which carries %s",
            d, g->info.name, g->info.arch, file, code);
    }
    if (b->gpus > 1 && b->gpu[0].integrated == 1 && b->gpu[0].has_code != 0 && first_discrete > 0) {
        snprintf(fix, sizeof fix, "run with --device %d to use the discrete GPU", first_discrete);
        add(r, 0, "integrated-first", fix, "GPU 0 is the integrated %s; the discrete %s is GPU %d", b->gpu[0].info.name,
            b->gpu[first_discrete].info.name, first_discrete);
    }
}

static void judge(report *r) {
    int gpu_backends = 0;
    for (int i = 0; i < API_COUNT; i++) {
        backend_report *b = &r->b[i];
        const char *file = coli_backend_file(b->api);
        if (!b->present) continue;
        gpu_backends += strcmp(b->api, "ref") != 0;
        if (b->read_error[0]) {
            add(r, 1, "backend-unreadable", "reinstall the package: the file is damaged or not a backend", "%s: %s",
                b->path, b->read_error);
            continue;
        }
        if (b->hip_import[0] && strcmp(b->hip_import, COLI_HIP_RUNTIME_NAME)) {
            add(r, 1, "runtime-mismatch", "use coli and its backends from one package: they are built against one HIP SDK",
                "%s imports %s, but this coli binds %s", file, b->hip_import, COLI_HIP_RUNTIME_NAME);
            continue;
        }
        if (b->open_error[0]) {
            add(r, 1, "backend-refused", "use coli and its backends from one package, unpacked whole into one folder",
                "%s", b->open_error);
            continue;
        }
        if (b->code.found && b->code.compressed && !b->code.count)
            add(r, 0, "code-compressed", "the build's report (build-info.json, device_code) lists its arches",
                "%s's device code is compressed, so its arches are not checked here", file);
        if (b->opened) judge_gpus(r, b);
    }
    if (r->hip_wanted) judge_hip(r);
    if (!gpu_backends)
        add(r, 1, "no-gpu-backend",
            "put a package with a GPU backend into this folder (a HIP or CUDA package of the same version)",
            "no GPU backend beside coli (%s, %s): only the CPU path can run", coli_backend_file("hip"),
            coli_backend_file("cuda"));
}

/* ---- the report ----------------------------------------------------------------------- */

static const char *decision_text(const report *r) {
    return r->planned ? coli_bind_decision_name(r->plan.decision) : NULL;
}

static void print_text(const report *r, FILE *out) {
    char code[1024];
    fprintf(out, "coli %s, backend ABI %d.%d\n", COLI_VERSION, COLI_ABI_MAJOR, COLI_ABI_MINOR);
    fprintf(out, "platform  %s %s%s%s\n", r->platform.os, r->platform.arch, r->platform.wine[0] ? ", under Wine " : "",
            r->platform.wine);
    fprintf(out, "folder    %s\nbackends\n", r->folder);
    for (int i = 0; i < API_COUNT; i++) {
        const backend_report *b = &r->b[i];
        fprintf(out, "  %-5s %-16s ", b->api, coli_backend_file(b->api));
        if (!b->present) {
            fputs("absent\n", out);
            continue;
        }
        if (b->opened) fprintf(out, "ABI %u.%u (%s)", (unsigned)(b->abi >> 16), (unsigned)(b->abi & 0xFFFF), b->name);
        else fputs(b->open_error[0] ? "refused" : b->read_error[0] ? "unreadable" : "not opened (the binding would refuse)", out);
        if (b->hip_import[0]) fprintf(out, ", imports %s", b->hip_import);
        if (b->code.found) {
            code_list(&b->code, code, sizeof code);
            fprintf(out, ", device code %s", code);
        }
        fputc('\n', out);
    }
    if (r->hip_wanted) {
        fprintf(out, "hip runtime\n  %-22s %s\n", COLI_HIP_RUNTIME_ENV, r->plan.dir_set ? r->plan.dir : "(not set)");
        if (r->planned) {
            fprintf(out, "  %-22s %s (%s)\n", "configured", r->plan.runtime_path,
                    r->configured_version[0] ? r->configured_version : "version unknown");
            fprintf(out, "  %-22s ", "mapped now");
            if (!r->plan.read) fputs("(the module list cannot be read)", out);
            if (r->plan.read && !r->plan.mapped.count) fputs("none", out);
            for (int i = 0; i < r->plan.mapped.count; i++)
                fprintf(out, "%s%s (%s)", i ? "; " : "", r->plan.mapped.items[i].path ? r->plan.mapped.items[i].path : "?",
                        i < 8 && r->mapped_version[i][0] ? r->mapped_version[i] : "version unknown");
            fprintf(out, "\n  %-22s %s\n", "decision", decision_text(r));
        } else {
            fprintf(out, "  %-22s none: %s\n", "decision", r->plan_error);
        }
        fprintf(out, "  %-22s ", SYSTEM_LABEL);
        if (!r->system.count) fputs("none", out);
        for (int i = 0; i < r->system.count; i++)
            fprintf(out, "%s%s (%s)", i ? "; " : "", r->system.paths[i],
                    r->system_version[i][0] ? r->system_version[i] : "version unknown");
        fputc('\n', out);
    }
    for (int i = 0; i < API_COUNT; i++) {
        const backend_report *b = &r->b[i];
        if (!b->opened || !strcmp(b->api, "ref")) continue;
        fprintf(out, "gpus (%s)\n", b->api);
        if (b->described)
            fprintf(out, "  runtime version %d, driver version %d%s%s\n", (int)b->runtime.runtime_version,
                    (int)b->runtime.driver_version, b->runtime.device_error[0] ? "; " : "", b->runtime.device_error);
        if (!b->gpus) fputs("  none\n", out);
        for (int d = 0; d < b->gpus; d++) {
            const gpu *g = &b->gpu[d];
            fprintf(out, "  %d  %s  %s  %s  %.1f GiB  code %s\n", d, g->info.name, g->info.arch,
                    g->integrated < 0 ? "integrated?" : g->integrated ? "integrated" : "discrete",
                    (double)g->info.total_memory / (1024.0 * 1024.0 * 1024.0),
                    g->has_code < 0 ? "unknown" : g->has_code ? "yes" : "no");
        }
    }
    fputs("verdict\n", out);
    int problems = 0;
    for (int i = 0; i < r->verdicts; i++) {
        fprintf(out, "  %s [%s] %s; fix: %s\n", r->v[i].problem ? "problem" : "warning", r->v[i].code, r->v[i].what,
                r->v[i].fix);
        problems += r->v[i].problem;
    }
    if (!problems) fputs("  ok: nothing stands in the GPU tier's way\n", out);
}

static void json_key(FILE *out, const char *key, const char *value, int comma) {
    fprintf(out, "%s", comma ? ", " : "");
    json_string(out, key);
    fputs(": ", out);
    json_string(out, value);
}

static void print_json(const report *r, FILE *out) {
    char abi[16];
    int problems = 0;
    snprintf(abi, sizeof abi, "%d.%d", COLI_ABI_MAJOR, COLI_ABI_MINOR);
    fputs("{", out);
    json_key(out, "version", COLI_VERSION, 0);
    json_key(out, "abi", abi, 1);
    fputs(", \"platform\": {", out);
    json_key(out, "os", r->platform.os, 0);
    json_key(out, "arch", r->platform.arch, 1);
    json_key(out, "wine", r->platform.wine[0] ? r->platform.wine : NULL, 1);
    fputs("}", out);
    json_key(out, "folder", r->folder, 1);
    fputs(", \"backends\": [", out);
    for (int i = 0; i < API_COUNT; i++) {
        const backend_report *b = &r->b[i];
        snprintf(abi, sizeof abi, "%u.%u", (unsigned)(b->abi >> 16), (unsigned)(b->abi & 0xFFFF));
        fprintf(out, "%s{", i ? ", " : "");
        json_key(out, "api", b->api, 0);
        json_key(out, "file", coli_backend_file(b->api), 1);
        fprintf(out, ", \"present\": %s", b->present ? "true" : "false");
        json_key(out, "abi", b->opened ? abi : NULL, 1);
        json_key(out, "name", b->opened ? b->name : NULL, 1);
        json_key(out, "hip_runtime", b->hip_import[0] ? b->hip_import : NULL, 1);
        json_key(out, "error", b->read_error[0] ? b->read_error : b->open_error[0] ? b->open_error : NULL, 1);
        fputs(", \"device_code\": ", out);
        if (!b->code.found) fputs("null", out);
        for (int k = 0; b->code.found && k < b->code.count; k++) {
            fputs(k ? ", " : "[", out);
            json_string(out, b->code.targets[k]);
        }
        if (b->code.found) fputs(b->code.count ? "]" : "[]", out);
        fprintf(out, ", \"compressed_bundles\": %d", b->code.compressed);
        if (b->described)
            fprintf(out, ", \"runtime\": {\"version\": %d, \"driver_version\": %d, \"driver_too_old\": %s, \"error\": ",
                    (int)b->runtime.runtime_version, (int)b->runtime.driver_version,
                    b->runtime.driver_too_old ? "true" : "false");
        if (b->described) {
            json_string(out, b->runtime.device_error[0] ? b->runtime.device_error : NULL);
            fputs("}", out);
        }
        fputs(", \"gpus\": ", out);
        if (!b->asked) fputs("null", out);
        for (int d = 0; b->asked && d < b->gpus; d++) {
            const gpu *g = &b->gpu[d];
            fputs(d ? ", " : "[", out);
            fprintf(out, "{\"index\": %d", d);
            json_key(out, "name", g->info.name, 1);
            json_key(out, "arch", g->info.arch, 1);
            fprintf(out, ", \"total_memory\": %llu, \"integrated\": %s, \"has_code\": %s}",
                    (unsigned long long)g->info.total_memory,
                    g->integrated < 0 ? "null" : g->integrated ? "true" : "false",
                    g->has_code < 0 ? "null" : g->has_code ? "true" : "false");
        }
        if (b->asked) fputs(b->gpus ? "]" : "[]", out);
        fputs("}", out);
    }
    fputs("], \"hip\": ", out);
    if (!r->hip_wanted) fputs("null", out);
    else {
        fputs("{", out);
        json_key(out, "runtime_name", COLI_HIP_RUNTIME_NAME, 0);
        json_key(out, "runtime_dir", r->plan.dir_set ? r->plan.dir : NULL, 1);
        json_key(out, "configured", r->planned ? r->plan.runtime_path : NULL, 1);
        json_key(out, "configured_version", r->configured_version[0] ? r->configured_version : NULL, 1);
        json_key(out, "decision", decision_text(r), 1);
        json_key(out, "error", r->planned ? (r->refusal[0] ? r->refusal : NULL) : r->plan_error, 1);
        fputs(", \"mapped\": [", out);
        for (int i = 0; r->planned && i < r->plan.mapped.count; i++) {
            fputs(i ? ", {" : "{", out);
            json_key(out, "path", r->plan.mapped.items[i].path, 0);
            json_key(out, "version", i < 8 && r->mapped_version[i][0] ? r->mapped_version[i] : NULL, 1);
            fputs("}", out);
        }
        fputs("], \"system\": [", out);
        for (int i = 0; i < r->system.count; i++) {
            fputs(i ? ", {" : "{", out);
            json_key(out, "path", r->system.paths[i], 0);
            json_key(out, "version", r->system_version[i][0] ? r->system_version[i] : NULL, 1);
            fprintf(out, ", \"configured\": %s}", r->system_same[i] ? "true" : "false");
        }
        fputs("]}", out);
    }
    fputs(", \"verdicts\": [", out);
    for (int i = 0; i < r->verdicts; i++) {
        fputs(i ? ", {" : "{", out);
        json_key(out, "level", r->v[i].problem ? "problem" : "warning", 0);
        json_key(out, "code", r->v[i].code, 1);
        json_key(out, "problem", r->v[i].what, 1);
        json_key(out, "fix", r->v[i].fix, 1);
        fputs("}", out);
        problems += r->v[i].problem;
    }
    fprintf(out, "], \"ok\": %s}\n", problems ? "false" : "true");
}

int coli_doctor(int json, FILE *out) {
    report *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, "coli: out of memory for the doctor's report\n");
        return 1;
    }
    coli_platform_read(&r->platform);
    if (coli_exe_dir(r->folder, sizeof r->folder)) snprintf(r->folder, sizeof r->folder, "(unknown)");
    for (int i = 0; i < API_COUNT; i++) {
        r->b[i].api = APIS[i];
        inspect_file(r, &r->b[i]);
    }
    if (r->hip_wanted) plan_hip(r);
    for (int i = 0; i < API_COUNT; i++) ask_backend(r, &r->b[i], !json);
    judge(r);
    if (json) print_json(r, out);
    else print_text(r, out);
    int problems = 0;
    for (int i = 0; i < r->verdicts; i++) problems += r->v[i].problem;
    if (r->planned) coli_runtime_list_free(&r->plan.mapped);
    free(r);
    return problems ? 1 : 0;
}
