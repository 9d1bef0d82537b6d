/* A kernel timeline with no profiler: preloaded into a CUDA program
 * (LD_PRELOAD=gpu_trace.so), it asks CUPTI's activity API for every kernel's
 * start and end on the device clock, graph replays included, and writes one line
 * a kernel to $COLI_TRACE_OUT at exit: start end stream graph_id name (ns). The
 * device tool has no Nsight Systems; bench/gpu_timeline.py reads the lines.
 *
 *   cc -O2 -shared -fPIC -I$CUDA/include bench/gpu_trace.c -o gpu_trace.so -L$CUDA/lib64 -lcupti */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

#if CUPTI_API_VERSION >= 130000
typedef CUpti_ActivityKernel10 kernel_record;
#else
typedef CUpti_ActivityKernel9 kernel_record;
#endif

#define BUFFER_BYTES (8u << 20)

static FILE *g_out;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, BUFFER_BYTES);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *record = NULL;
    while (g_out && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
        const kernel_record *k = (const kernel_record *)record;
        fprintf(g_out, "%llu %llu %u %u %s\n", (unsigned long long)k->start, (unsigned long long)k->end, k->streamId,
                k->graphId, k->name ? k->name : "?");
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
        fprintf(stderr, "gpu_trace: %zu kernel records dropped\n", dropped);
    free(buffer);
}

__attribute__((constructor)) static void trace_start(void) {
    const char *path = getenv("COLI_TRACE_OUT");
    if (!path || !(g_out = fopen(path, "w"))) {
        fprintf(stderr, "gpu_trace: set COLI_TRACE_OUT to a writable file\n");
        return;
    }
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "gpu_trace: CUPTI refused the kernel activity\n");
        fclose(g_out);
        g_out = NULL;
    }
}

__attribute__((destructor)) static void trace_end(void) {
    if (!g_out) return;
    cuptiActivityFlushAll(1);
    fclose(g_out);
    g_out = NULL;
}
