/* The far tier's rows to the device (cb_upload_far, cuda_backend_impl.h):
 * a prompt's keys streamed past the device's copy (cuda_prefill_stream.c)
 * and the keys of an index build (cuda_index.c). fp16 rows go straight
 * from the page-locked far tier; an 8-bit tier's rows (--far-kv q8) are
 * made fp16 on the host first, as the host's own kernels read them, so
 * the device computes over the same values, through two page-locked
 * halves: the host makes one block while the other copies, and nothing
 * waits for the stream but the half about to be reused. */

#include "cuda_backend_impl.h"
#include "far_rows.h"

/* Rows made fp16 per block: 1 MiB of K at d 128. */
#define UPLOAD_ROWS 4096

/* The halves, at the first 8-bit copy (the model's head size, b->d). */
static int stage_ready(cuda_be *b, hkv_err *err) {
    cb_far_stage *fs = &b->fs;
    if (fs->half) return HKV_OK;
    const size_t half = (size_t)UPLOAD_ROWS * b->d * 2;   /* K then V */
    int rc;
    if ((!fs->ev[0] && (rc = hkv_gpu_event_create(&fs->ev[0], err))) ||
        (!fs->ev[1] && (rc = hkv_gpu_event_create(&fs->ev[1], err))))
        return rc;   /* (kept for the next try when the staging fails) */
    if ((rc = hkv_pinned_alloc(&fs->buf, &b->e->mem, NULL, HKV_TIER_WORKSPACE, 2 * half * 2, -1,
                               HKV_PIN_REQUIRE, err)))
        return hkv_err_prefix(err, "page-locked staging of 8-bit far rows made fp16");
    fs->half = half;
    return HKV_OK;
}

void cb_far_stage_destroy(cuda_be *b) {
    cb_far_stage *fs = &b->fs;
    hkv_gpu_event_destroy(fs->ev[0]);
    hkv_gpu_event_destroy(fs->ev[1]);
    hkv_pinned_free(&fs->buf, &b->e->mem, NULL);
    fs->half = 0;
    fs->ev[0] = fs->ev[1] = NULL;
}

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
    if ((rc = stage_ready(b, err))) return rc;
    cb_far_stage *fs = &b->fs;
    for (int64_t a = 0; a < n; a += UPLOAD_ROWS) {
        const int64_t m = n - a < UPLOAD_ROWS ? n - a : UPLOAD_ROWS;
        const int i = fs->next;
        fs->next ^= 1;
        if ((rc = hkv_gpu_event_sync(fs->ev[i], err))) return rc;   /* its last copy read it */
        uint16_t *tk = (uint16_t *)fs->buf.p + i * fs->half, *tv = dv ? tk + (size_t)UPLOAD_ROWS * d : NULL;
        hkv_far_gather16(&b->e->kern, far, h, NULL, p0 + a, m, tk, tv);
        if ((rc = hkv_gpu_upload(dk + (size_t)a * d, tk, (size_t)m * d * 2, stream, err)) ||
            (dv && (rc = hkv_gpu_upload(dv + (size_t)a * d, tv, (size_t)m * d * 2, stream, err))) ||
            (rc = hkv_gpu_event_record(fs->ev[i], stream, err)))
            return rc;
    }
    return HKV_OK;
}
