/* Portable attention pieces over fp16 K/V rows: the baseline table and the
 * fallback of the vector tables for head sizes they do not cover.
 * Online softmax with the running max, fp32 accumulation, libm expf. */
#include "kernels_impl.h"
#include "sketch_i4.h"

static float dot_f16(const float *q, const uint16_t *k, int d)
{
    float s = 0.0f;
    for (int c = 0; c < d; c++) s += q[c] * hkv_half_to_float(k[c]);
    return s;
}

/* One head's running state over keys: out (d floats), max m, sum l. */
static void online_add(float *out, float *m, float *l, float s, const uint16_t *v, int d)
{
    if (s > *m) {
        float corr = expf(*m - s);    /* 0 on the first key (m = -inf) */
        *l *= corr;
        for (int c = 0; c < d; c++) out[c] *= corr;
        *m = s;
    }
    float p = expf(s - *m);
    *l += p;
    for (int c = 0; c < d; c++) out[c] += p * hkv_half_to_float(v[c]);
}

static void finish(float *out, float m, float l, int d, float *lse)
{
    if (l > 0.0f) {
        float inv = 1.0f / l;
        for (int c = 0; c < d; c++) out[c] *= inv;
        *lse = m + logf(l);
    } else {
        for (int c = 0; c < d; c++) out[c] = 0.0f;
        *lse = -INFINITY;
    }
}

static void attn_rows(const float *q, int g, int d, const uint16_t *k, const uint16_t *v,
                      int64_t ld, const int32_t *idx, int64_t n, float scale, float *out,
                      float *lse)
{
    for (int h = 0; h < g; h++) {
        float *o = out + (int64_t)h * d;
        float m = -INFINITY, l = 0.0f;
        for (int c = 0; c < d; c++) o[c] = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            int64_t row = idx ? idx[i] : i;
            float s = scale * dot_f16(q + (int64_t)h * d, k + row * ld, d);
            online_add(o, &m, &l, s, v + row * ld, d);
        }
        finish(o, m, l, d, &lse[h]);
    }
}

/* attn_sparse over 8-bit rows: each row as fp16(code x scale) first. */
void hkv_attn_q8_scalar(const float *q, int g, int d, const int8_t *k, const float *ks,
                        const int8_t *v, const float *vs, int64_t ld, const int32_t *idx,
                        int64_t n, float scale, float *out, float *lse)
{
    const int ng = d / HKV_SKETCH_GROUP;
    uint16_t kr[HKV_ATTN_MAX_D], vr[HKV_ATTN_MAX_D];
    for (int h = 0; h < g; h++) {
        float *o = out + (int64_t)h * d;
        float m = -INFINITY, l = 0.0f;
        for (int c = 0; c < d; c++) o[c] = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            const int64_t row = idx ? idx[i] : i;
            for (int c = 0; c < d && c < HKV_ATTN_MAX_D; c++) {
                kr[c] = hkv_float_to_half((float)k[row * ld + c] * ks[row * ng + c / HKV_SKETCH_GROUP]);
                vr[c] = hkv_float_to_half((float)v[row * ld + c] * vs[row * ng + c / HKV_SKETCH_GROUP]);
            }
            online_add(o, &m, &l, scale * dot_f16(q + (int64_t)h * d, kr, d), vr, d);
        }
        finish(o, m, l, d, &lse[h]);
    }
}

void hkv_attn_dense_scalar(const float *q, int g, int d, const uint16_t *k, const uint16_t *v,
                           int64_t ld, int64_t n, float scale, float *out, float *lse)
{
    attn_rows(q, g, d, k, v, ld, NULL, n, scale, out, lse);
}

void hkv_attn_sparse_scalar(const float *q, int g, int d, const uint16_t *k, const uint16_t *v,
                            int64_t ld, const int32_t *idx, int64_t n, float scale, float *out,
                            float *lse)
{
    attn_rows(q, g, d, k, v, ld, idx, n, scale, out, lse);
}

void hkv_attn_causal_scalar(const float *q, int64_t ldq, int nq, int g, int d, int64_t p0,
                            const uint16_t *k, const uint16_t *v, int64_t ld, float scale,
                            float *out, int64_t ldo, float *lse)
{
    for (int t = 0; t < nq; t++)
        attn_rows(q + t * ldq, g, d, k, v, ld, NULL, p0 + t + 1, scale, out + t * ldo,
                  lse + (int64_t)t * g);
}

void hkv_score_max_scalar(const float *q, int g, int d, const uint16_t *k, int64_t ld,
                          const int32_t *idx, int64_t n, float *s)
{
    for (int64_t i = 0; i < n; i++) {
        const uint16_t *row = k + (int64_t)idx[i] * ld;
        float best = -INFINITY;
        for (int h = 0; h < g; h++) {
            float v = dot_f16(q + (int64_t)h * d, row, d);
            if (v > best) best = v;
        }
        s[i] = best;
    }
}

/* score_max over int8 sketch codes. */
static void score_max_q_scalar(const float *q, int g, int d, const int8_t *k, int64_t ld,
                               const float *scale, const int32_t *idx, int64_t n, float *s)
{
    const int ng = d / HKV_SKETCH_GROUP;
    for (int64_t i = 0; i < n; i++) {
        const int8_t *row = k + (int64_t)idx[i] * ld;
        const float *sc = scale + (int64_t)idx[i] * ng;
        float best = -INFINITY;
        for (int h = 0; h < g; h++) {
            float v = 0;
            for (int e = 0; e < d; e++) {
                const int c = row[e];
                v += q[(int64_t)h * d + e] * ((float)c * sc[e / HKV_SKETCH_GROUP]);
            }
            if (v > best) best = v;
        }
        s[i] = best;
    }
}

void hkv_score_max_i8_scalar(const float *q, int g, int d, const int8_t *k, int64_t ld,
                             const float *scale, const int32_t *idx, int64_t n, float *s)
{
    score_max_q_scalar(q, g, d, k, ld, scale, idx, n, s);
}

void hkv_score_max_i4_scalar(const float *q, int g, int d, const uint8_t *k, int64_t ld,
                             const float *scale, const int32_t *idx, int64_t n, float *s)
{
    const int ng = d / HKV_SKETCH_GROUP;
    int8_t qc[HKV_ATTN_MAX_D];
    float qs[HKV_ATTN_MAX_D / HKV_SKETCH_GROUP];
    int32_t qsum[HKV_ATTN_MAX_D / HKV_SKETCH_GROUP];
    for (int h = 0; h < g; h++) {   /* a head at a time; the max over them is exact */
        hkv_sketch_query_q8(q + (int64_t)h * d, d, qc, qs, qsum);
        for (int64_t i = 0; i < n; i++) {
            const float v = hkv_sketch_i4_dot(k + (int64_t)idx[i] * ld, scale + (int64_t)idx[i] * ng,
                                              qc, qs, qsum, d);
            if (h == 0 || v > s[i]) s[i] = v;
        }
    }
}

void hkv_f16_to_f32_scalar(const uint16_t *src, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = hkv_half_to_float(src[i]);
}

void hkv_f32_to_f16_scalar(const float *src, uint16_t *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = hkv_float_to_half(src[i]);
}

void hkv_q8_to_f16_scalar(const int8_t *c, const float *scale, int64_t n, uint16_t *dst)
{
    for (int64_t i = 0; i < n; i++) dst[i] = hkv_float_to_half((float)c[i] * scale[i / HKV_SKETCH_GROUP]);
}

void hkv_exp_scalar(const float *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = expf(x[i]);
}

double hkv_stream_read_scalar(const void *buf, size_t bytes)
{
    /* Four independent sums keep several loads in flight. */
    const uint64_t *p = buf;
    size_t n = bytes / 8;
    uint64_t a = 0, b = 0, c = 0, e = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        a += p[i];
        b += p[i + 1];
        c += p[i + 2];
        e += p[i + 3];
    }
    for (; i < n; i++) a += p[i];
    return (double)(a + b + c + e);
}
