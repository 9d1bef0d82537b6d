/* The backend's matmul kernels timed on device pointers, against the device's
 * copy bandwidth. Weights rotate over copies larger than L2, so every launch
 * reads HBM. Built and run by bench/gpu_bench.sh on a CUDA machine.
 *
 *   gpu_matmul_bench  -> one JSON line per measurement on stdout */
#include "../kernels/backend_gpu.cu"

#include <cstdio>
#include <vector>

#define CHECK(call)                                                                   \
    do {                                                                              \
        cudaError_t e_ = (call);                                                      \
        if (e_ != cudaSuccess) {                                                      \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));               \
            return 1;                                                                 \
        }                                                                             \
    } while (0)

__global__ void fill(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t v = (uint32_t)i * 2654435761u ^ seed;
        p[i] = (uint8_t)(v >> 13);
    }
}

__global__ void fill_scale(float *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = 0.01f + 0.001f * (float)(i % 7);
}

static int copy_bandwidth(double *gbps) {
    size_t n = (size_t)2 << 30;
    void *a, *b;
    CHECK(cudaMalloc(&a, n));
    CHECK(cudaMalloc(&b, n));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    CHECK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    cudaEventRecord(e0);
    for (int i = 0; i < 10; i++) cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    CHECK(cudaEventSynchronize(e1));
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    *gbps = 2.0 * (double)n * 10 / (ms * 1e-3) / 1e9; /* bytes read + written */
    cudaFree(a);
    cudaFree(b);
    return 0;
}

int main() {
    double copy;
    if (copy_bandwidth(&copy)) return 1;
    printf("{\"copy_gbps\": %.1f}\n", copy);
    const int64_t shapes[][2] = {{4096, 4096}, {4096, 14336}, {14336, 4096}};
    const int formats[] = {COLI_FMT_F32, COLI_FMT_Q8, COLI_FMT_Q4};
    const char *names[] = {"f32", "int8", "int4"};
    for (const auto &sh : shapes)
        for (int fi = 0; fi < 3; fi++)
            for (int64_t s : {1, 8, 64}) {
                coli_weight w;
                memset(&w, 0, sizeof w);
                w.format = formats[fi];
                w.rows = sh[0];
                w.cols = sh[1];
                w.group = w.format == COLI_FMT_Q4 ? 32 : 0;
                size_t qb, sb;
                coli_weight_sizes(&w, &qb, &sb);
                int copies = (int)((512u << 20) / qb) + 2; /* rotate over > 512 MiB: far beyond L2 */
                std::vector<coli_weight> ws(copies, w);
                for (auto &c : ws) {
                    CHECK(cudaMalloc(&c.q, qb));
                    fill<<<1024, 256>>>((uint8_t *)c.q, qb, 7);
                    if (sb) {
                        CHECK(cudaMalloc((void **)&c.scale, sb));
                        fill_scale<<<256, 256>>>(c.scale, sb / 4);
                    }
                    if (w.format == COLI_FMT_F32) fill_scale<<<1024, 256>>>((float *)c.q, qb / 4);
                }
                float *x, *y;
                CHECK(cudaMalloc((void **)&x, (size_t)s * w.cols * 4));
                CHECK(cudaMalloc((void **)&y, (size_t)s * w.rows * 4));
                fill_scale<<<256, 256>>>(x, (size_t)s * w.cols);
                for (int i = 0; i < copies; i++) CHECK(launch_matmul(&ws[i], x, s, y, 0)); /* warm-up */
                CHECK(cudaDeviceSynchronize());
                cudaEvent_t e0, e1;
                cudaEventCreate(&e0);
                cudaEventCreate(&e1);
                int iters = 200;
                cudaEventRecord(e0);
                for (int i = 0; i < iters; i++) launch_matmul(&ws[i % copies], x, s, y, 0);
                cudaEventRecord(e1);
                CHECK(cudaEventSynchronize(e1));
                CHECK(cudaGetLastError());
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                double us = ms * 1e3 / iters;
                double bytes = (double)(qb + sb) + (double)s * (w.cols + w.rows) * 4;
                printf("{\"rows\": %lld, \"cols\": %lld, \"s\": %lld, \"format\": \"%s\", \"us\": %.2f, "
                       "\"gbps\": %.1f, \"of_copy\": %.3f}\n",
                       (long long)w.rows, (long long)w.cols, (long long)s, names[fi], us, bytes / (us * 1e-6) / 1e9,
                       bytes / (us * 1e-6) / 1e9 / copy);
                for (auto &c : ws) {
                    cudaFree(c.q);
                    if (c.scale) cudaFree(c.scale);
                }
                cudaFree(x);
                cudaFree(y);
            }
    return 0;
}
