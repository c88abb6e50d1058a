/* The 8-bit far tier's rows (far_rows.h). */
#include "far_rows.h"
#include "q8_group.h"

#include <math.h>
#include <string.h>

void hkv_q8_quantize(const float *x, int d, int8_t *codes, float *scale)
{
    hkv_q8_group_quantize(x, d, codes, scale);
}

void hkv_q4_quantize(const float *x, int d, uint8_t *codes, float *scale)
{
    for (int g0 = 0; g0 < d; g0 += HKV_SKETCH_GROUP) {
        float amax = 0;
        for (int e = 0; e < HKV_SKETCH_GROUP; e++) amax = fmaxf(amax, fabsf(x[g0 + e]));
        const float sc = amax / 7.0f, inv = amax > 0 ? 7.0f / amax : 0.0f;
        scale[g0 / HKV_SKETCH_GROUP] = sc;
        for (int e = 0; e < HKV_SKETCH_GROUP; e += 2) {
            int lo = (int)lrintf(x[g0 + e] * inv), hi = (int)lrintf(x[g0 + e + 1] * inv);
            lo = lo < -7 ? -7 : lo > 7 ? 7 : lo;
            hi = hi < -7 ? -7 : hi > 7 ? 7 : hi;
            codes[(g0 + e) / 2] = (uint8_t)((lo + 8) | (hi + 8) << 4);
        }
    }
}

void hkv_far_gather16(const hkv_cpu_kernels *kn, const hkv_far_view *f, int h, const int32_t *idx,
                      int64_t p0, int64_t n, uint16_t *k, uint16_t *v)
{
    const int d = f->head_dim, ng = d / HKV_Q8_GROUP;
    if (!idx && f->ld == d && n > 0) {   /* consecutive rows: one run of codes and scales */
        if (f->k8) {
            if (k) kn->q8_to_f16(f->k8[h] + p0 * d, f->ks[h] + p0 * ng, n * d, k);
            if (v) kn->q8_to_f16(f->v8[h] + p0 * d, f->vs[h] + p0 * ng, n * d, v);
        } else {
            if (k) memcpy(k, f->k[h] + p0 * d, (size_t)(n * d) * 2);
            if (v) memcpy(v, f->v[h] + p0 * d, (size_t)(n * d) * 2);
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        const int64_t p = idx ? idx[i] : p0 + i;
        if (f->k8) {
            if (k) kn->q8_to_f16(f->k8[h] + p * f->ld, f->ks[h] + p * ng, d, k + i * d);
            if (v) kn->q8_to_f16(f->v8[h] + p * f->ld, f->vs[h] + p * ng, d, v + i * d);
        } else {
            if (k) memcpy(k + i * d, f->k[h] + p * f->ld, (size_t)d * 2);
            if (v) memcpy(v + i * d, f->v[h] + p * f->ld, (size_t)d * 2);
        }
    }
}
