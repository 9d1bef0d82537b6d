#include "selftest.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"
#include "json_out.h"
#include "selftest_ops.h"

#define TOLERANCE 2e-4 /* max |y - ref| / max |ref|: float sums in a different order */
typedef struct shape { int64_t rows, cols, s; int32_t group; } shape;

/* The core set reaches every path of the CPU ops and the reference backend, and
 * the GPU backends' simple and general kernels: one token and several (up to 100,
 * past every token block), rows and tokens that do not fill a block, row lengths
 * that are not a multiple of 8 (the dot products' tails: 30 and 66), int4 groups
 * of 6, 8, 22 (a 16, then a pair tail), 32, 48 and 64 (16s with and without a last
 * 8), and long rows (8192). Small enough for a sanitizer build at -O1. */
static const shape CORE_SHAPES[] = {
    {64, 128, 1, 32},  {130, 544, 1, 32}, {20, 8192, 1, 32}, {8200, 64, 1, 32},  {96, 256, 7, 32},
    {33, 160, 4, 32},  {48, 128, 13, 32}, {130, 512, 33, 64}, {70, 192, 40, 48}, {64, 96, 2, 48},
    {40, 72, 3, 8},    {36, 1152, 1, 32}, {300, 640, 2, 32}, {70, 256, 20, 32},  {200, 384, 100, 32},
    {100, 128, 24, 32}, {9, 30, 2, 6},    {17, 66, 3, 22},
};

/* --shapes gpu adds the shapes that pick each GPU kernel and reach its edges (the
 * picks are gpu_dispatch.cuh's table): int4 decode with more groups of rows than a
 * GPU's warps at once (16401 x 1024); decode streamed by the copy engine (sm_90), a
 * block an SM (8200 x 3072; 12300 x 2048: 8 rows a stage; 8200 x 2048 int8: half its
 * stages before the wait) and two (4100 x 2048; 8200 x 2048 int4; 6150 x 2048: not a
 * whole turn of the groups), the blocks' last stages short; decode on the tensor
 * cores (sm_90) at every row width and block shape the table picks (2048, 3072,
 * 4096 and 8192 columns, 600 to 14000 rows, past half the SMs' rows and in two
 * waves), the blocks' last tiles short; gemm_kernel's block sizes once the blocks
 * fill an H200's 132 multiprocessors (8500 x 256, 40 tokens); int4 stored tile by
 * tile (2048-8192 rows of 12288 and 14336 columns, 4096-8192 of 8192), in clusters
 * of two blocks and alone (4128 rows), in two waves (8192 x 8192), and those
 * weights in mma_kernel (3 tokens) and gemm_kernel (17). Large: for the GPU check
 * (bench/gpu_check.sh) and the validation of a GPU backend, not for every test. */
static const shape GPU_SHAPES[] = {
    {16401, 1024, 1, 32}, {8200, 3072, 1, 32},  {4100, 2048, 1, 32},  {8200, 2048, 1, 32},  {6150, 2048, 1, 32},
    {12300, 2048, 1, 32}, {8500, 256, 40, 32},  {1000, 4096, 1, 32},  {4000, 4096, 1, 32},  {2000, 4096, 1, 32},
    {3000, 3072, 1, 32},  {600, 2048, 1, 32},   {1200, 8192, 1, 32},  {5000, 4096, 1, 32},  {6000, 4096, 1, 32},
    {4000, 3072, 1, 32},  {2000, 8192, 1, 32},  {4096, 8192, 1, 32},  {4096, 12288, 1, 32}, {4096, 14336, 1, 32},
    {4096, 8192, 3, 32},  {4096, 8192, 17, 32}, {4128, 12288, 1, 32}, {4128, 14336, 1, 32}, {2048, 14336, 1, 32},
    {2048, 12288, 3, 32}, {6144, 12288, 1, 32}, {8192, 8192, 1, 32},  {2000, 2048, 1, 32},  {10000, 4096, 1, 32},
    {14000, 4096, 1, 32},
};
enum {
    NCORE = (int)(sizeof CORE_SHAPES / sizeof CORE_SHAPES[0]),
    NGPU = (int)(sizeof GPU_SHAPES / sizeof GPU_SHAPES[0]),
};
static const char *FORMAT_NAMES[] = {"f32", "int8", "int4"};

typedef struct check {
    int format; /* -1: matmul_many over the MANY weights */
    shape sh;
    double err;
    int status;
    char message[256];
} check;

/* coli_matmul_many's check: weights of three formats and kernels (the int8 one
 * streamed by the copy engine on sm_90) that read one x, for one token (y written
 * straight to host memory on the GPU) and for three (copied back). */
enum { MANY = 3 };
static const int MANY_FORMATS[MANY] = {COLI_FMT_Q8, COLI_FMT_Q4, COLI_FMT_F32};
static const int64_t MANY_ROWS[MANY] = {4100, 520, 70}, MANY_COLS = 2048, MANY_S[] = {1, 3};

/* A random weight in `format` uploaded as *t, and the CPU path's y for x in ref
 * (s x sh.rows); the backend's status. */
static int upload_with_ref(coli_backend *b, int format, shape sh, const float *x, float *ref, coli_tensor *t) {
    size_t n = (size_t)(sh.rows * sh.cols);
    float *w = malloc(n * sizeof *w), *scale = malloc((size_t)sh.rows * (size_t)(sh.cols / sh.group + 1) * sizeof *scale);
    int8_t *q8 = malloc(n);
    uint8_t *q4 = malloc(n / 2);
    int status = -1;
    *t = 0;
    if (w && scale && q8 && q4) {
        for (size_t i = 0; i < n; i++) w[i] = selftest_rnd();
        if (format == COLI_FMT_F32) {
            coli_matmul_f32(w, sh.rows, sh.cols, x, sh.s, ref);
            status = b->api.tensor_upload_f32(w, sh.rows, sh.cols, t);
        } else if (format == COLI_FMT_Q8) {
            coli_quantize_q8(w, sh.rows, sh.cols, q8, scale);
            coli_matmul_q8(q8, scale, sh.rows, sh.cols, x, sh.s, ref);
            status = b->api.tensor_upload_q8(q8, scale, sh.rows, sh.cols, t);
        } else {
            coli_quantize_q4(w, sh.rows, sh.cols, sh.group, q4, scale);
            coli_matmul_q4(q4, scale, sh.rows, sh.cols, sh.group, x, sh.s, ref);
            status = b->api.tensor_upload_q4(q4, scale, sh.rows, sh.cols, sh.group, t);
        }
    }
    free(w); free(scale); free(q8); free(q4);
    return status;
}

/* max |y - ref| / max |ref| over n values; NaN (a value never written) propagates. */
static double rel_err(const float *y, const float *ref, int64_t n) {
    double maxref = 0.0, maxdiff = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)y[i] - (double)ref[i]);
        if (!(d <= maxdiff)) maxdiff = d;
        if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
    }
    return maxdiff / (maxref > 1e-12 ? maxref : 1e-12);
}

/* count weights (formats[i], rows[i] x sh.cols) against the CPU path on one random
 * x: one matmul call, or one matmul_many call for more; c->err the worst of them. */
static void run_check(coli_backend *b, const int *formats, const int64_t *rows, int count, shape sh, check *c) {
    float *x = malloc((size_t)(sh.s * sh.cols) * sizeof *x), *ys[MANY] = {0}, *refs[MANY] = {0};
    coli_tensor ts[MANY] = {0};
    int ok = x != NULL;
    memset(c, 0, sizeof *c);
    c->format = count > 1 ? -1 : formats[0];
    c->sh = sh;
    c->err = INFINITY;
    for (int i = 0; i < count; i++) {
        ys[i] = malloc((size_t)(sh.s * rows[i]) * sizeof(float));
        refs[i] = malloc((size_t)(sh.s * rows[i]) * sizeof(float));
        ok = ok && ys[i] && refs[i];
    }
    if (!ok) {
        c->status = -1;
        snprintf(c->message, sizeof c->message, "out of host memory");
        goto done;
    }
    for (int64_t i = 0; i < sh.s * sh.cols; i++) x[i] = selftest_rnd();
    for (int i = 0; i < count && c->status == COLI_OK; i++) {
        shape one = {rows[i], sh.cols, sh.s, sh.group};
        for (int64_t k = 0; k < sh.s * rows[i]; k++) ys[i][k] = NAN; /* poison: an unwritten output fails */
        c->status = upload_with_ref(b, formats[i], one, x, refs[i], &ts[i]);
    }
    if (c->status == COLI_OK)
        c->status = count > 1 ? b->api.matmul_many(ts, count, x, sh.s, sh.cols, ys)
                              : b->api.matmul(ts[0], x, sh.s, sh.cols, ys[0]);
    if (c->status != COLI_OK) {
        snprintf(c->message, sizeof c->message, "%s", c->status < 0 ? "out of host memory" : b->api.last_error());
        goto done;
    }
    c->err = 0.0;
    for (int i = 0; i < count; i++) {
        const double e = rel_err(ys[i], refs[i], sh.s * rows[i]);
        if (!(e <= c->err)) c->err = e;
    }
done:
    for (int i = 0; i < count; i++) {
        if (ts[i]) b->api.tensor_free(ts[i]);
        free(ys[i]);
        free(refs[i]);
    }
    free(x);
}

/* Each bad input must give its status and a reason, never a crash. */
static int run_bad_inputs(coli_backend *b, bad_case *cases) {
    float w[64], x[64], y[8];
    uint8_t q4[32];
    coli_tensor t = 0, freed = 0;
    int n = 0;
    for (int i = 0; i < 64; i++) w[i] = x[i] = 0.5f;
    memset(q4, 0x88, sizeof q4);
    b->api.tensor_upload_f32(w, 8, 8, &freed);
    b->api.tensor_free(freed);
#define BAD(label, want, call) SELFTEST_CASE(cases, n, b, label, want, call)
    BAD("matmul on a freed tensor", COLI_E_BAD_TENSOR, b->api.matmul(freed, x, 1, 8, y));
    BAD("matmul on a foreign tensor", COLI_E_BAD_TENSOR, b->api.matmul(0x7A7A000100000000ULL, x, 1, 8, y));
    BAD("matmul on tensor 0", COLI_E_BAD_TENSOR, b->api.matmul(0, x, 1, 8, y));
    BAD("free twice", COLI_E_BAD_TENSOR, b->api.tensor_free(freed));
    BAD("q4 group not dividing cols", COLI_E_SHAPE, b->api.tensor_upload_q4(q4, w, 2, 24, 16, &t));
    BAD("negative shape", COLI_E_SHAPE, b->api.tensor_upload_f32(w, -1, 8, &t));
    BAD("null data", COLI_E_INVALID, b->api.tensor_upload_f32(NULL, 8, 8, &t));
    /* 512 TiB: no allocation can succeed, so the data pointer is never read */
    BAD("out of memory", COLI_E_OUT_OF_MEMORY, b->api.tensor_upload_f32(w, 1LL << 31, 1LL << 16, &t));
    BAD("too many values", COLI_E_SHAPE, b->api.tensor_upload_f32(w, 1LL << 31, 1LL << 31, &t));
    coli_tensor wide = 0;
    if (b->api.tensor_upload_f32(w, 8, 8, &t) == COLI_OK) {
        BAD("mismatched in_features", COLI_E_SHAPE, b->api.matmul(t, x, 1, 4, y));
        BAD("zero tokens", COLI_E_SHAPE, b->api.matmul(t, x, 0, 8, y));
        if (b->api.matmul_many && b->api.tensor_upload_f32(w, 4, 16, &wide) == COLI_OK) {
            /* every argument is checked before any y is written: the first weight's y,
             * whose own arguments are good, must stay as it was when a later one fails */
            float first[8], second[8];
            for (int i = 0; i < 8; i++) first[i] = second[i] = 7.0f;
            float *const ys[] = {first, second, first};
            const coli_tensor with_freed[] = {t, freed}, mixed[] = {t, wide}, three[] = {t, t, t};
            BAD("matmul_many with a freed tensor", COLI_E_BAD_TENSOR, b->api.matmul_many(with_freed, 2, x, 1, 8, ys));
            BAD("matmul_many of mixed widths", COLI_E_SHAPE, b->api.matmul_many(mixed, 2, x, 1, 8, ys));
            for (int i = 0; i < 8; i++)
                if (first[i] != 7.0f) cases[n - 1].got = cases[n - 2].got = -1; /* written, then failed */
            BAD("matmul_many of no tensors", COLI_E_INVALID, b->api.matmul_many(three, 0, x, 1, 8, ys));
            BAD("matmul_many with null ys", COLI_E_INVALID, b->api.matmul_many(three, 3, x, 1, 8, NULL));
            b->api.tensor_free(wide);
        }
        b->api.tensor_free(t);
    }
#undef BAD
    return n;
}

const char *selftest_shapes_name(selftest_shapes set) { return set == SELFTEST_GPU_SHAPES ? "gpu" : "core"; }

static void print_unavailable(coli_backend *b, const char *reason, int json, FILE *out) {
    if (json) {
        fputs("{\"backend\": ", out);
        json_string(out, b->name);
        fputs(", \"available\": false, \"reason\": ", out);
        json_string(out, reason);
        fputs(", \"passed\": false}\n", out);
    }
    fprintf(stderr, "[%s] %s; GPU tier disabled (CPU path remains active)\n", b->name, reason);
}

int coli_selftest(coli_backend *b, int device, selftest_shapes set, int json, FILE *out) {
    enum { NMANY = (int)(sizeof MANY_S / sizeof MANY_S[0]) };
    check checks[3 * (NCORE + NGPU) + NMANY];
    bad_case bad[48];
    op_check ops[OP_CHECKS_MAX];
    coli_device_info info;
    char reason[600];
    int passed = 1, resident_after = -1;
    if (b->api.backend_init(device) != COLI_OK) {
        snprintf(reason, sizeof reason, "backend init failed: %s", b->api.last_error());
        print_unavailable(b, reason, json, out);
        return SELFTEST_UNAVAILABLE;
    }
    if (b->api.device_describe(device, &info) != COLI_OK) {
        snprintf(reason, sizeof reason, "device_describe failed: %s", b->api.last_error());
        print_unavailable(b, reason, json, out);
        return SELFTEST_UNAVAILABLE;
    }
    if (b->api.backend_set_threads) b->api.backend_set_threads(1);
    int ncheck = 0;
    const int nshape = set == SELFTEST_GPU_SHAPES ? NCORE + NGPU : NCORE;
    for (int f = 0; f < 3; f++)
        for (int s = 0; s < nshape; s++) {
            const shape *sh = s < NCORE ? &CORE_SHAPES[s] : &GPU_SHAPES[s - NCORE];
            run_check(b, &f, &sh->rows, 1, *sh, &checks[ncheck++]);
        }
    if (b->api.matmul_many) /* ABI 1.1: a backend of 1.0 leaves it out, and the host makes its calls one by one */
        for (int s = 0; s < NMANY; s++) {
            shape sh = {0, MANY_COLS, MANY_S[s], 32};
            run_check(b, MANY_FORMATS, MANY_ROWS, MANY, sh, &checks[ncheck++]);
        }
    for (int k = 0; k < ncheck; k++)
        if (checks[k].status != COLI_OK || !(checks[k].err <= TOLERANCE)) passed = 0;
    const int nops = selftest_ops(b, ops);
    for (int k = 0; k < nops; k++)
        if (!op_check_ok(&ops[k], TOLERANCE)) passed = 0;
    int nbad = run_bad_inputs(b, bad);
    nbad += selftest_step_bad_inputs(b, bad + nbad);
    for (int i = 0; i < nbad; i++)
        if (bad[i].got != bad[i].expected || !bad[i].message[0]) passed = 0;
    b->api.resident_count(&resident_after);
    if (resident_after != 0) passed = 0;

    if (json) {
        fputs("{\"backend\": ", out);
        json_string(out, b->name);
        fputs(", \"available\": true, \"device\": {\"name\": ", out);
        json_string(out, info.name);
        fputs(", \"arch\": ", out);
        json_string(out, info.arch);
        fprintf(out, "}, \"abi\": \"%u.%u\", \"shapes\": \"%s\", \"tolerance\": %g, \"checks\": [",
                (unsigned)COLI_ABI_MAJOR, (unsigned)COLI_ABI_MINOR, selftest_shapes_name(set), TOLERANCE);
        for (int k = 0; k < ncheck; k++) {
            check *c = &checks[k];
            if (c->format < 0) {
                fprintf(out, "%s{\"op\": \"matmul_many\", \"formats\": [", k ? ", " : "");
                for (int i = 0; i < MANY; i++) fprintf(out, "%s\"%s\"", i ? ", " : "", FORMAT_NAMES[MANY_FORMATS[i]]);
                fputs("], \"rows\": [", out);
                for (int i = 0; i < MANY; i++) fprintf(out, "%s%lld", i ? ", " : "", (long long)MANY_ROWS[i]);
                fprintf(out, "], \"cols\": %lld, \"s\": %lld, ", (long long)c->sh.cols, (long long)c->sh.s);
            } else {
                fprintf(out, "%s{\"op\": \"matmul\", \"format\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"s\": %lld, ",
                        k ? ", " : "", FORMAT_NAMES[c->format], (long long)c->sh.rows, (long long)c->sh.cols,
                        (long long)c->sh.s);
            }
            if (isfinite(c->err)) fprintf(out, "\"max_rel_err\": %.3g, ", c->err);
            else fputs("\"max_rel_err\": null, ", out);
            fprintf(out, "\"status\": %d, \"message\": ", c->status);
            json_string(out, c->message);
            fprintf(out, ", \"ok\": %s}", c->status == COLI_OK && c->err <= TOLERANCE ? "true" : "false");
        }
        fputs("], \"op_checks\": [", out);
        for (int k = 0; k < nops; k++) {
            fprintf(out, "%s{\"op\": \"%s\", \"what\": ", k ? ", " : "", ops[k].op);
            json_string(out, ops[k].what);
            if (isfinite(ops[k].err)) fprintf(out, ", \"%s\": %.3g", ops[k].exact ? "differ" : "max_rel_err", ops[k].err);
            else fprintf(out, ", \"max_rel_err\": null");
            fprintf(out, ", \"status\": %d, \"message\": ", ops[k].status);
            json_string(out, ops[k].message);
            fprintf(out, ", \"ok\": %s}", op_check_ok(&ops[k], TOLERANCE) ? "true" : "false");
        }
        fputs("], \"bad_input\": [", out);
        for (int i = 0; i < nbad; i++) {
            fprintf(out, "%s{\"case\": ", i ? ", " : "");
            json_string(out, bad[i].name);
            fprintf(out, ", \"expected\": %d, \"status\": %d, \"message\": ", bad[i].expected, bad[i].got);
            json_string(out, bad[i].message);
            fprintf(out, ", \"ok\": %s}", bad[i].got == bad[i].expected && bad[i].message[0] ? "true" : "false");
        }
        fprintf(out, "], \"resident_after_free\": %d, \"passed\": %s}\n", resident_after, passed ? "true" : "false");
    } else {
        fprintf(out, "backend %s on %s (%s), %s shapes\n", b->name, info.name, info.arch, selftest_shapes_name(set));
        for (int k = 0; k < ncheck; k++) {
            check *c = &checks[k];
            if (c->format < 0)
                fprintf(out, "  matmul_many %s %lld, %s %lld, %s %lld x %lld s=%-3lld  err %.2e  %s%s%s\n",
                        FORMAT_NAMES[MANY_FORMATS[0]], (long long)MANY_ROWS[0], FORMAT_NAMES[MANY_FORMATS[1]],
                        (long long)MANY_ROWS[1], FORMAT_NAMES[MANY_FORMATS[2]], (long long)MANY_ROWS[2],
                        (long long)c->sh.cols, (long long)c->sh.s, c->err,
                        c->status == COLI_OK && c->err <= TOLERANCE ? "ok" : "FAIL", c->message[0] ? ": " : "",
                        c->message);
            else
                fprintf(out, "  matmul %-4s %4lldx%-4lld s=%-3lld  err %.2e  %s%s%s\n", FORMAT_NAMES[c->format],
                        (long long)c->sh.rows, (long long)c->sh.cols, (long long)c->sh.s, c->err,
                        c->status == COLI_OK && c->err <= TOLERANCE ? "ok" : "FAIL", c->message[0] ? ": " : "",
                        c->message);
        }
        for (int k = 0; k < nops; k++)
            fprintf(out, "  op %-16s %-62s %s %.2e  %s%s%s\n", ops[k].op, ops[k].what, ops[k].exact ? "differ" : "err",
                    ops[k].err, op_check_ok(&ops[k], TOLERANCE) ? "ok" : "FAIL", ops[k].message[0] ? ": " : "",
                    ops[k].message);
        for (int i = 0; i < nbad; i++)
            fprintf(out, "  bad input: %-40s status %d (want %d)  %s\n", bad[i].name, bad[i].got, bad[i].expected,
                    bad[i].got == bad[i].expected && bad[i].message[0] ? "ok" : "FAIL");
        fprintf(out, "%s\n", passed ? "selftest passed" : "selftest FAILED");
    }
    return passed ? SELFTEST_PASSED : SELFTEST_FAILED;
}
