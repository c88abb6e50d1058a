/* Reading the far tier's rows in either format (hkv_far_view, policy.h):
 * fp16 in place, or the 8-bit tier's codes and scales (--far-kv q8).
 *
 * A q8 element's value is fp16(code x scale): what q8_to_f16 gives, so the
 * fp16 kernels (attention, the policies' page bounds, the device's uploads)
 * all see the same numbers; only score_max_i8, which scores the codes
 * directly, skips that rounding (a ranking, never an attention weight). */
#ifndef HKV_FAR_ROWS_H
#define HKV_FAR_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "policy.h"

/* Codes per scale of the 8-bit far tier: the int8 sketches' group. */
#define HKV_Q8_GROUP HKV_SKETCH_GROUP
/* The head sizes it takes (a row on the stack): d <= this, a multiple of the group. */
#define HKV_Q8_MAX_D 256

/* Bytes of one K or V row of d in the far tier's format: 8-bit, d codes and
 * d / 32 fp32 scales; fp16, 2 d. */
static inline size_t hkv_far_row_bytes(int d, int q8) {
    return q8 ? (size_t)d + (size_t)d / HKV_Q8_GROUP * 4 : (size_t)d * 2;
}

static inline int hkv_far_q8(const hkv_far_view *f) { return f->k8 != NULL; }

/* Bytes of one far key's ctkvr sketch (sketch=1..3, index/ctkvr_sketch.c):
 * its codes, int8 or 4-bit (0 without a sketch), and with them an fp32
 * scale per HKV_SKETCH_GROUP. */
static inline size_t hkv_sketch_code_bytes(int sketch, int d) {
    return sketch <= 0 ? 0 : sketch == 3 ? (size_t)d / 2 : (size_t)d;
}
static inline size_t hkv_sketch_row_bytes(int sketch, int d) {
    return sketch <= 0 ? 0 : hkv_sketch_code_bytes(sketch, d) + (size_t)d / HKV_SKETCH_GROUP * 4;
}

/* x[0..d) to int8 codes and one scale per HKV_Q8_GROUP (absmax / 127,
 * round to nearest); d a multiple of HKV_Q8_GROUP. */
void hkv_q8_quantize(const float *x, int d, int8_t *codes, float *scale);
/* x[0..d) to ctkvr's 4-bit key sketch (index/ctkvr_sketch.c): d / 2 bytes,
 * element 2c the low nibble of byte c, code round(x * 7 / absmax) + 8 in
 * 1..15, one scale absmax / 7 per HKV_SKETCH_GROUP; what score_max_i4 reads. */
void hkv_q4_quantize(const float *x, int d, uint8_t *codes, float *scale);

/* Key row p of KV head h as fp16: the row in place, or tmp
 * (room for d) filled from the codes. */
static inline const uint16_t *hkv_far_k16(const hkv_cpu_kernels *kn, const hkv_far_view *f, int h,
                                          int64_t p, uint16_t *tmp)
{
    const int d = f->head_dim, ng = d / HKV_Q8_GROUP;
    if (!f->k8) return f->k[h] + p * f->ld;
    kn->q8_to_f16(f->k8[h] + p * f->ld, f->ks[h] + p * ng, d, tmp);
    return tmp;
}
/* Key row p of KV head h as fp32 (d floats). */
static inline void hkv_far_k32(const hkv_cpu_kernels *kn, const hkv_far_view *f, int h, int64_t p,
                               uint16_t *tmp, float *x)
{
    kn->f16_to_f32(hkv_far_k16(kn, f, h, p, tmp), x, f->head_dim);
}

/* K and V rows of KV head h as fp16 tiles [n][d]: positions idx[0..n), or
 * p0 .. p0 + n - 1 when idx is NULL. With want_k / want_v 0 that side is
 * skipped (its tile may be NULL). */
void hkv_far_gather16(const hkv_cpu_kernels *kn, const hkv_far_view *f, int h, const int32_t *idx,
                      int64_t p0, int64_t n, uint16_t *k, uint16_t *v);

/* select's rerank: s[i] = max over the g heads of q_h . k[rows[i]], on the
 * fp16 keys or on the 8-bit codes (score_max_i8), spread over the step's
 * threads where ws->par offers it. */
static inline void hkv_far_score_max(const hkv_policy_scratch *ws, const hkv_cpu_kernels *kn,
                                     const float *q, int g, const hkv_far_view *f, int h,
                                     const int32_t *rows, int64_t n, float *s)
{
    if (f->k8)
        hkv_policy_score_max_i8(ws, kn, q, g, f->head_dim, f->k8[h], f->ld, f->ks[h], rows, n, s);
    else
        hkv_policy_score_max(ws, kn, q, g, f->head_dim, f->k[h], f->ld, rows, n, s);
}

/* Bytes one far row's key (or value) occupies, as the bench counts them. */
static inline size_t hkv_far_view_row_bytes(const hkv_far_view *f)
{
    return hkv_far_row_bytes(f->head_dim, hkv_far_q8(f));
}

#endif
