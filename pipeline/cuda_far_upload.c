/* The far tier's rows to the device (cb_upload_far, cuda_backend_impl.h):
 * a prompt's keys streamed past the device's copy (cuda_prefill_stream.c)
 * and the keys of an index build (cuda_index.c). fp16 rows go straight
 * from the page-locked far tier; an 8-bit tier's rows (--far-kv q8) are
 * made fp16 on the host first, as the host's own kernels read them, so
 * the device computes over the same values. */
#include <stdlib.h>

#include "cuda_backend_impl.h"
#include "far_rows.h"

/* Rows made fp16 per copy: 1 MiB of K at d 128. */
#define UPLOAD_ROWS 4096

int cb_upload_far(cuda_be *b, uint16_t *dk, uint16_t *dv, const hkv_far_view *far, int h,
                  int64_t p0, int64_t n, void *stream, hkv_err *err) {
    const int d = far->head_dim;
    int rc = HKV_OK;
    if (n <= 0) return HKV_OK;
    if (!hkv_far_q8(far)) {
        const size_t bytes = (size_t)n * d * 2;
        if ((rc = hkv_gpu_upload(dk, far->k[h] + p0 * far->ld, bytes, stream, err))) return rc;
        return dv ? hkv_gpu_upload(dv, far->v[h] + p0 * far->ld, bytes, stream, err) : HKV_OK;
    }
    const int64_t rows = n < UPLOAD_ROWS ? n : UPLOAD_ROWS;
    uint16_t *tk = malloc((size_t)rows * d * 2 * (dv ? 2 : 1));
    if (!tk)
        return hkv_seterr(err, HKV_E_NOMEM, "no host memory to make %lld 8-bit far rows fp16 "
                          "for the device", (long long)rows);
    uint16_t *tv = dv ? tk + (size_t)rows * d : NULL;
    for (int64_t a = 0; !rc && a < n; a += rows) {
        const int64_t m = n - a < rows ? n - a : rows;
        hkv_far_gather16(&b->e->kern, far, h, NULL, p0 + a, m, tk, tv);
        rc = hkv_gpu_upload(dk + (size_t)a * d, tk, (size_t)m * d * 2, stream, err);
        if (!rc && dv) rc = hkv_gpu_upload(dv + (size_t)a * d, tv, (size_t)m * d * 2, stream, err);
    }
    /* CUDA may still read a pageable source after an asynchronous copy
     * returns: the buffer goes once the stream has run the copies */
    int rs = hkv_gpu_sync(stream, rc ? NULL : err);
    free(tk);
    return rc ? rc : rs;
}
