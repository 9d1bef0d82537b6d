/* coli: the engine's command line. Other tools call it exactly like this:
 *   coli --model DIR --ids 5,17,42 --teacher-force --json
 *   coli --model DIR --ids 5,17,42 --generate N --json
 *   coli --backend PATH --selftest [--shapes core|gpu] [--json]
 *   coli doctor [--json] */
#if !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#endif
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)
#include <windows.h>
#else
#include <unistd.h>
#endif

#include "clock.h"
#include "doctor.h"
#include "utf8.h"
#include "json_out.h"
#include "loader.h"
#include "model.h"
#include "model_latent.h"
#include "progress.h"
#include "selftest.h"

#ifndef COLI_VERSION
#define COLI_VERSION "0.0.0"
#endif

enum { EXIT_OK = 0, EXIT_RUNTIME = 1, EXIT_USAGE = 2 };

static const char USAGE[] =
    "usage: coli --model DIR --ids 5,17,42 (--teacher-force | --generate N) [options]\n"
    "       coli --backend PATH --selftest [--shapes core|gpu] [--json] [--device N]\n"
    "       coli doctor [--json]   why the GPU tier would or would not run here\n"
    "       coli --version\n"
    "options:\n"
    "  --model DIR        config.json + model.safetensors (or shards with model.safetensors.index.json)\n"
    "  --ids LIST         comma-separated token ids\n"
    "  --teacher-force    the argmax at every input position\n"
    "  --generate N       N greedy tokens after the ids\n"
    "  --quant MODE       f32 (default), int8 or int4 weights (dense matmuls and routed experts)\n"
    "  --backend B        run the model in backend B: ref, cuda or hip (from this program's folder),\n"
    "                     an absolute path, or none (CPU). hip binds the runtime in COLI_HIP_RUNTIME_DIR\n"
    "  --kv FORM          the KV cache: latent (the CPU path's default: MLA's latent and rope key a\n"
    "                     position, attention in the absorbed form) or expanded (each head's key and\n"
    "                     value; the only form, and the default, where --backend names a backend)\n"
    "  --offload WHAT     with a backend: step (default; the whole forward, every weight resident)\n"
    "                     or matmuls (only the dense matmuls, one call each; the rest on the CPU)\n"
    "  --threads N        CPU threads (default: the CPUs available, at most 16)\n"
    "  --device N         backend device index (default 0)\n"
    "  --json             one JSON object on stdout\n"
    "  --selftest         check every backend op against the CPU path\n"
    "  --shapes SET       the selftest's shapes: core (default; every CPU-op path) or gpu (core and\n"
    "                     the large shapes that pick each GPU kernel)\n";

static int usage_error(const char *what, const char *arg) {
    fprintf(stderr, "coli: %s%s%s (see coli --help)\n", what, arg ? ": " : "", arg ? arg : "");
    return EXIT_USAGE;
}

static int cpu_count(void) {
#if defined(_WIN32)
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    int n = (int)si.dwNumberOfProcessors;
#else
    int n = (int)sysconf(_SC_NPROCESSORS_ONLN);
#endif
    return n < 1 ? 1 : n > 16 ? 16 : n;
}

static int parse_count(const char *s, long max, long *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < 0 || v > max) return 1;
    *out = v;
    return 0;
}

/* "5,17,42" -> ids; one line on error. */
static int parse_ids(const char *s, int32_t **ids, int64_t *n) {
    size_t count = 1;
    for (const char *p = s; *p; p++) count += *p == ',';
    *ids = malloc(count * sizeof **ids);
    *n = 0;
    if (!*ids) return usage_error("out of memory", NULL);
    const char *p = s;
    for (size_t i = 0; i < count; i++) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',') || v < 0 || v > 0x7FFFFFFF) {
            char what[96];
            snprintf(what, sizeof what, "--ids: item %zu is not a token id (non-negative integer)", i + 1);
            return usage_error(what, s);
        }
        (*ids)[(*n)++] = (int32_t)v;
        p = end + 1;
    }
    return 0;
}

static void argmax2(const float *row, int64_t n, int32_t *best, float *margin) {
    int64_t b = 0;
    float first = -FLT_MAX, second = -FLT_MAX;
    for (int64_t i = 0; i < n; i++) {
        if (row[i] > first) {
            second = first;
            first = row[i];
            b = i;
        } else if (row[i] > second) {
            second = row[i];
        }
    }
    *best = (int32_t)b; /* the first maximum, as torch.argmax */
    *margin = first - second;
}

static void print_ints(FILE *f, const int32_t *v, int64_t n) {
    fputc('[', f);
    for (int64_t i = 0; i < n; i++) fprintf(f, "%s%d", i ? ", " : "", v[i]);
    fputc(']', f);
}

typedef struct prefill_progress {
    progress *line;
    int64_t positions;
} prefill_progress;

static void prefill_layer_done(void *ctx, int64_t layer, int64_t layers) {
    const prefill_progress *pp = ctx;
    progress_show(pp->line, "coli: prefill of %lld positions: layer %lld of %lld", (long long)pp->positions,
                  (long long)layer, (long long)layers);
}

typedef struct decode_progress {
    progress *line;
    int64_t tokens; /* in all, the first (the prefill's) included */
    double start;
} decode_progress;

static void decode_tokens_done(void *ctx, int64_t done) {
    const decode_progress *dp = ctx;
    const double spent = coli_now() - dp->start;
    progress_show(dp->line, "coli: decode: %lld of %lld tokens, %.1f tokens/s", (long long)(done + 1),
                  (long long)dp->tokens, (double)done / (spent > 0 ? spent : 1e-9));
}

/* `, "key": {"linears": s, ..., "other": s}`: where `total` seconds of forwards went. */
static void print_phases(FILE *f, const char *key, const double *phase, double total) {
    double rest = total;
    fprintf(f, ", \"%s\": {", key);
    for (int i = 0; i < PHASE_COUNT; i++) {
        fprintf(f, "\"%s\": %.6f, ", FORWARD_PHASE_NAMES[i], phase[i]);
        rest -= phase[i];
    }
    fprintf(f, "\"other\": %.6f}", rest > 0 ? rest : 0.0);
}

int main(int argc, char **argv) {
    argv = coli_args_utf8(&argc, argv);
    if (argc > 1 && !strcmp(argv[1], "doctor")) {
        if (argc > 3 || (argc == 3 && strcmp(argv[2], "--json")))
            return usage_error("doctor takes only --json", argc > 2 ? argv[2] : NULL);
        return coli_doctor(argc == 3, stdout);
    }
    const char *backend_path = NULL, *model_dir = NULL, *ids_arg = NULL;
    int selftest = 0, json = 0, device = 0, teacher = 0, threads = cpu_count(), whole_step = 1, latent = -1;
    long generate = -1, v;
    quant_mode quant = QUANT_F32;
    selftest_shapes shapes = SELFTEST_CORE_SHAPES;
    int shapes_given = 0;
    const char *quant_name = "f32";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(USAGE, stdout);
            return EXIT_OK;
        } else if (!strcmp(a, "--version")) {
            printf("coli %s (backend ABI %d.%d)\n", COLI_VERSION, COLI_ABI_MAJOR, COLI_ABI_MINOR);
            return EXIT_OK;
        } else if (!strcmp(a, "--selftest")) {
            selftest = 1;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--teacher-force")) {
            teacher = 1;
        } else if (!strcmp(a, "--backend") || !strcmp(a, "--model") || !strcmp(a, "--ids") ||
                   !strcmp(a, "--device") || !strcmp(a, "--threads") || !strcmp(a, "--generate") ||
                   !strcmp(a, "--quant") || !strcmp(a, "--shapes") || !strcmp(a, "--offload") ||
                   !strcmp(a, "--kv")) {
            if (!val) return usage_error("option needs a value", a);
            i++;
            if (!strcmp(a, "--backend")) backend_path = strcmp(val, "none") ? val : NULL;
            else if (!strcmp(a, "--model")) model_dir = val;
            else if (!strcmp(a, "--ids")) ids_arg = val;
            else if (!strcmp(a, "--kv")) {
                if (!strcmp(val, "latent")) latent = 1;
                else if (!strcmp(val, "expanded")) latent = 0;
                else return usage_error("--kv must be expanded or latent", val);
            } else if (!strcmp(a, "--offload")) {
                if (!strcmp(val, "step")) whole_step = 1;
                else if (!strcmp(val, "matmuls")) whole_step = 0;
                else return usage_error("--offload must be step or matmuls", val);
            }
            else if (!strcmp(a, "--device")) {
                if (parse_count(val, 1024, &v)) return usage_error("--device must be an integer in 0..1024", val);
                device = (int)v;
            } else if (!strcmp(a, "--threads")) {
                if (parse_count(val, 256, &v) || v < 1) return usage_error("--threads must be an integer in 1..256", val);
                threads = (int)v;
            } else if (!strcmp(a, "--shapes")) {
                if (!strcmp(val, "core")) shapes = SELFTEST_CORE_SHAPES;
                else if (!strcmp(val, "gpu")) shapes = SELFTEST_GPU_SHAPES;
                else return usage_error("--shapes must be core or gpu", val);
                shapes_given = 1;
            } else if (!strcmp(a, "--generate")) {
                if (parse_count(val, 1 << 20, &generate)) return usage_error("--generate must be a count", val);
            } else {
                if (!strcmp(val, "f32")) quant = QUANT_F32;
                else if (!strcmp(val, "int8")) quant = QUANT_INT8;
                else if (!strcmp(val, "int4")) quant = QUANT_INT4;
                else return usage_error("--quant must be f32, int8 or int4", val);
                quant_name = val;
            }
        } else {
            return usage_error("unknown option", a);
        }
    }

    coli_backend b;
    char err[4096]; /* a refusal names every mapped runtime, each path possibly past MAX_PATH */
    int have_backend = 0;
    char backend_error[sizeof err + 200] = "";
    if (shapes_given && !selftest) return usage_error("--shapes applies to --selftest only", NULL);
    if (selftest) {
        if (!backend_path) return usage_error("--selftest needs --backend PATH", NULL);
        if (coli_backend_open(backend_path, &b, err, sizeof err) != 0) {
            if (json) printf("{\"backend\": null, \"available\": false, \"passed\": false}\n");
            fprintf(stderr, "%s; GPU tier disabled (CPU path remains active)\n", err);
            return SELFTEST_LOAD_FAILED;
        }
        int rc = coli_selftest(&b, device, shapes, json, stdout);
        coli_backend_close(&b);
        return rc;
    }
    if (!model_dir && !ids_arg && !teacher && generate < 0) return usage_error("nothing to do: give --model and --ids, or --selftest", NULL);
    if (!model_dir) return usage_error("--model DIR is required", NULL);
    if (!ids_arg) return usage_error("--ids is required", NULL);
    if (teacher == (generate >= 0)) return usage_error("give exactly one of --teacher-force and --generate N", NULL);
    if (latent == 1 && backend_path)
        return usage_error("--kv latent runs on the CPU path only (a backend's step keeps the expanded cache)",
                           backend_path);
    /* The latent cache holds 7.2 times fewer bytes a position, so a long context's decode
     * reads that much less, and at a short one its absorption reads the kv_b rows the
     * expanded form's kv_b matmul would. A named backend keeps the expanded cache even
     * where it fails to load and the CPU path runs instead: a run's numbers then do not
     * depend on whether the GPU tier started. */
    if (latent < 0) latent = !backend_path;

    int32_t *ids = NULL;
    int64_t n = 0;
    if (parse_ids(ids_arg, &ids, &n)) {
        free(ids);
        return EXIT_USAGE;
    }

    if (backend_path) {
        if (coli_backend_open(backend_path, &b, err, sizeof err) != 0) {
            snprintf(backend_error, sizeof backend_error, "%s", err);
        } else if (b.api.backend_init(device) != COLI_OK) {
            snprintf(backend_error, sizeof backend_error, "[%s] backend init failed: %s", b.name, b.api.last_error());
            coli_backend_close(&b);
        } else {
            have_backend = 1;
        }
        if (!have_backend) fprintf(stderr, "%s; GPU tier disabled (CPU path remains active)\n", backend_error);
    }
    char device_name[160] = "cpu";
    if (have_backend) {
        coli_device_info info;
        if (b.api.device_describe(device, &info) == COLI_OK) snprintf(device_name, sizeof device_name, "%s", info.name);
    }

    model m;
    double t_load = coli_now();
    int64_t max_pos = n + (generate > 0 ? generate : 0);
    if (model_load(&m, model_dir, quant, threads, have_backend ? &b : NULL, max_pos, err, sizeof err)) {
        fprintf(stderr, "coli: %s\n", err);
        model_free(&m);
        if (have_backend) coli_backend_close(&b);
        free(ids);
        return EXIT_USAGE;
    }
    /* transformers runs past it too (RoPE is defined at every position), so a warning */
    if (m.c.max_positions && max_pos > m.c.max_positions)
        fprintf(stderr, "coli: warning: %lld positions run past the model's max_position_embeddings (%lld)\n",
                (long long)max_pos, (long long)m.c.max_positions);
    if (latent && model_use_latent(&m, err, sizeof err)) {
        fprintf(stderr, "coli: %s\n", err);
        model_free(&m);
        free(ids);
        return EXIT_RUNTIME;
    }
    char note[sizeof err + 200] = "";
    /* a step that cannot be set up (a failed upload or allocation) is undone whole: the run
     * goes on with the dense matmuls in the backend, every other weight still on the host */
    if (have_backend && whole_step && model_step_prepare(&m, note, sizeof note, err, sizeof err))
        snprintf(note, sizeof note, "the whole step could not be set up (%s): the step stays on the CPU, its dense "
                 "matmuls in %s", err, b.name);
    if (note[0]) fprintf(stderr, "coli: %s\n", note);
    t_load = coli_now() - t_load;
    const char *tier = m.step ? "step" : have_backend ? "matmuls" : "cpu";
    int rc = EXIT_OK;
    float *logits = malloc((size_t)((teacher ? n : 1) * m.c.vocab) * sizeof(float)); /* a decode needs the last */
    int32_t *pred = malloc((size_t)(n + (generate > 0 ? generate : 0) + 1) * sizeof *pred);
    float *margin = malloc((size_t)(n + 1) * sizeof *margin);
    double t_first = 0.0, t_rest = 0.0, prefill_phases[PHASE_COUNT] = {0};
    if (!logits || !pred || !margin) {
        fprintf(stderr, "coli: out of memory for %lld positions\n", (long long)n);
        rc = EXIT_RUNTIME;
        goto out;
    }
    for (int64_t s = 0; s < n; s++)
        if (ids[s] >= m.c.vocab) {
            fprintf(stderr, "coli: --ids: token %d at position %lld is outside the vocabulary of %s (0..%lld)\n",
                    ids[s], (long long)s, model_dir, (long long)(m.c.vocab - 1));
            rc = EXIT_USAGE;
            goto out;
        }
    progress line;
    progress_start(&line);
    prefill_progress pp = {&line, n};
    m.layer_done = prefill_layer_done, m.layer_ctx = &pp;
    t_first = coli_now();
    const int failed = teacher ? model_forward(&m, ids, n, logits, err, sizeof err)
                               : model_forward_last(&m, ids, n, logits, err, sizeof err);
    t_first = coli_now() - t_first;
    m.layer_done = NULL;
    if (failed) {
        progress_clear(&line);
        fprintf(stderr, "coli: %s\n", err);
        rc = EXIT_RUNTIME;
        goto out;
    }
    if (teacher) {
        for (int64_t s = 0; s < n; s++) argmax2(logits + s * m.c.vocab, m.c.vocab, &pred[s], &margin[s]);
    } else if (generate > 0) {
        float last;
        argmax2(logits, m.c.vocab, &pred[0], &last);
        m.backend_calls = m.backend_matmuls = 0, m.backend_seconds = 0.0; /* from here on: the decode's */
        memcpy(prefill_phases, m.phase_seconds, sizeof prefill_phases);
        memset(m.phase_seconds, 0, sizeof m.phase_seconds);
        m.round_trips = 0;
        t_rest = coli_now();
        decode_progress dp = {&line, generate, t_rest};
        if (model_generate(&m, pred[0], generate - 1, pred + 1, decode_tokens_done, &dp, err, sizeof err)) {
            progress_clear(&line);
            fprintf(stderr, "coli: %s\n", err);
            rc = EXIT_RUNTIME;
            goto out;
        }
        t_rest = coli_now() - t_rest;
    }
    progress_clear(&line);
    if (json) {
        fputs("{", stdout);
        if (teacher) {
            fputs("\"tf_pred\": ", stdout);
            print_ints(stdout, pred, n);
            fputs(", \"top2_margin\": [", stdout);
            for (int64_t s = 0; s < n; s++) printf("%s%.6g", s ? ", " : "", margin[s]);
            printf("], \"seconds\": %.6f, \"tokens_per_second\": %.3f", t_first, (double)n / (t_first > 0 ? t_first : 1e-9));
            print_phases(stdout, "phase_seconds", m.phase_seconds, t_first);
        } else {
            fputs("\"generated\": ", stdout);
            print_ints(stdout, pred, generate);
            printf(", \"prefill_seconds\": %.6f, \"decode_seconds\": %.6f, \"decode_tokens_per_second\": %s", t_first,
                   t_rest, generate > 1 ? "" : "null");
            if (generate > 1) printf("%.3f", (double)(generate - 1) / (t_rest > 0 ? t_rest : 1e-9));
            print_phases(stdout, "prefill_phase_seconds", generate > 0 ? prefill_phases : m.phase_seconds, t_first);
            print_phases(stdout, "decode_phase_seconds", generate > 0 ? m.phase_seconds : prefill_phases, t_rest);
        }
        /* teacher forcing: the forward's; generation: the decode's (after the first token) */
        printf(", \"backend_calls\": %lld, \"backend_matmuls\": %lld, \"backend_seconds\": %.6f",
               (long long)m.backend_calls, (long long)m.backend_matmuls, m.backend_seconds);
        fputs(", \"backend\": ", stdout);
        json_string(stdout, have_backend ? b.name : NULL);
        if (backend_path && !have_backend) {
            fputs(", \"backend_error\": ", stdout);
            json_string(stdout, backend_error);
        }
        printf(", \"tier\": \"%s\", \"step_ops\": %lld, \"resident_bytes\": %llu, \"round_trips\": %lld", tier,
               (long long)model_step_ops(&m), (unsigned long long)m.resident_bytes, (long long)m.round_trips);
        if (!teacher && generate > 1) printf(", \"decode_round_trips\": %lld", (long long)m.round_trips);
        /* what a decoded token reads: the step's resident sizes, else the weights where they are */
        printf(", \"token_weight_bytes\": %llu, \"kv_bytes_per_position\": %llu",
               (unsigned long long)(m.step ? m.token_weight_bytes : model_token_bytes(&m)),
               (unsigned long long)(m.step ? m.kv_bytes_per_position : model_kv_bytes_per_position(&m, 0)));
        printf(", \"kv_cache\": \"%s\", \"resident_tensors\": %d, \"device\": ", m.latent ? "latent" : "expanded",
               m.resident);
        json_string(stdout, device_name);
        printf(", \"quant\": \"%s\", \"threads\": %d, \"positions\": %lld, \"load_seconds\": %.6f}\n", quant_name,
               pool_threads(m.pool), (long long)n, t_load);
    } else {
        const char *kv = m.latent ? "latent" : "expanded";
        if (teacher)
            printf("teacher forcing %lld positions on %s (%s, %s cache): ", (long long)n, device_name, quant_name, kv);
        else printf("generated %ld tokens on %s (%s, %s cache): ", generate, device_name, quant_name, kv);
        print_ints(stdout, pred, teacher ? n : generate);
        if (teacher) printf("\n%.1f tokens/s", (double)n / (t_first > 0 ? t_first : 1e-9));
        else printf("\nprefill of %lld positions in %.2f s", (long long)n, t_first);
        if (!teacher && generate > 1) {
            printf(", decode %.1f tokens/s", (double)(generate - 1) / (t_rest > 0 ? t_rest : 1e-9));
            if (m.step) printf(", %lld ops a token in one step", (long long)model_step_ops(&m));
            else if (m.backend_calls)
                printf(", %.0f%% of it in %lld backend calls (%lld matmuls)",
                       100.0 * m.backend_seconds / (t_rest > 0 ? t_rest : 1e-9), (long long)m.backend_calls,
                       (long long)m.backend_matmuls);
        }
        if (have_backend) printf(", %d tensors resident in %s\n", m.resident, b.name);
        else printf(", %d threads\n", pool_threads(m.pool));
    }
out:
    free(logits);
    free(pred);
    free(margin);
    model_free(&m);
    if (have_backend) coli_backend_close(&b);
    free(ids);
    return rc;
}
