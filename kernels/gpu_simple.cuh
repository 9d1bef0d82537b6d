/* Any shape, format and layout: simple_kernel, the table's last row and the
 * reference the bench checks every variant against. */
#ifndef COLI_GPU_SIMPLE_CUH
#define COLI_GPU_SIMPLE_CUH

#include "gpu_formats.cuh"

#define SIMPLE_THREADS 256

/* One block per (output row, token). */
template <int FORMAT>
__global__ void simple_kernel(const void *__restrict__ q, const float *__restrict__ scale, int64_t rows,
                              int64_t cols, int32_t group, int32_t layout, const float *__restrict__ x,
                              float *__restrict__ y) {
    __shared__ float partial[SIMPLE_THREADS];
    const int64_t r = blockIdx.x, t = blockIdx.y;
    const float *xt = x + t * cols;
    float acc = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += SIMPLE_THREADS) {
        const float v = xt[c] * stored_value<FORMAT>(q, r, cols, layout, c);
        acc += FORMAT == COLI_FMT_Q4 ? v * stored_scale(scale, r, cols, group, layout, c) : v;
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int step = SIMPLE_THREADS / 2; step > 0; step >>= 1) {
        if ((int)threadIdx.x < step) partial[threadIdx.x] += partial[threadIdx.x + step];
        __syncthreads();
    }
    if (threadIdx.x == 0) y[t * rows + r] = FORMAT == COLI_FMT_Q8 ? partial[0] * scale[r] : partial[0];
}

template <int FORMAT>
static void launch_simple(const coli_weight *w, const float *dx, int64_t s, float *dy, cudaStream_t stream) {
    dim3 grid((unsigned)w->rows, (unsigned)s);
    simple_kernel<FORMAT><<<grid, SIMPLE_THREADS, 0, stream>>>(w->q, w->scale, w->rows, w->cols, w->group, w->layout,
                                                               dx, dy);
}

#endif
