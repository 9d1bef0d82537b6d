/* The ABI's tensor entries that read the same in every backend: the uploads by
 * format, free, size and the resident count. A backend includes this once, after
 * its table `g_tensors` and its own `upload` (checks, copies, adds to the table)
 * and `release` (frees a weight and what it holds). */
#ifndef COLI_BACKEND_TENSORS_H
#define COLI_BACKEND_TENSORS_H

COLI_API coli_status coli_tensor_upload_f32(const float *data, int64_t rows, int64_t cols, coli_tensor *out) {
    return upload(COLI_FMT_F32, data, NULL, rows, cols, 0, out);
}

COLI_API coli_status coli_tensor_upload_q8(const int8_t *q, const float *row_scale, int64_t rows, int64_t cols,
                                           coli_tensor *out) {
    return upload(COLI_FMT_Q8, q, row_scale, rows, cols, 0, out);
}

COLI_API coli_status coli_tensor_upload_q4(const uint8_t *packed, const float *group_scale, int64_t rows,
                                           int64_t cols, int32_t group_size, coli_tensor *out) {
    return upload(COLI_FMT_Q4, packed, group_scale, rows, cols, group_size, out);
}

COLI_API coli_status coli_tensor_free(coli_tensor tensor) {
    coli_weight *w = NULL;
    coli_status st = coli_table_get(&g_tensors, tensor, &w);
    if (st) return st;
    if (w->holds)
        return coli_fail(COLI_E_INVALID, "tensor_free: tensor 0x%016llx is used by %d live step(s)",
                         (unsigned long long)tensor, (int)w->holds);
    release(w);
    coli_table_remove(&g_tensors, tensor);
    return COLI_OK;
}

COLI_API coli_status coli_tensor_size(coli_tensor tensor, uint64_t *bytes) {
    coli_weight *w = NULL;
    coli_status st;
    if (!bytes) return coli_fail(COLI_E_INVALID, "tensor_size: null bytes");
    st = coli_table_get(&g_tensors, tensor, &w);
    if (st) return st;
    *bytes = w->bytes;
    return COLI_OK;
}

COLI_API coli_status coli_resident_count(int32_t *count) {
    if (!count) return coli_fail(COLI_E_INVALID, "resident_count: null count");
    *count = g_tensors.live;
    return COLI_OK;
}

#endif
