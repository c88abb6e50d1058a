/* Float64 reference kernels; see ref.h. Deliberately naive. */
#include "ref.h"

#include <math.h>

#include "util.h"

double ref_weight(const hkv_wmat *w, int64_t r, int64_t c)
{
    int64_t cols = w->cols, nb = cols / HKV_WBLOCK;
    switch (w->type) {
    case HKV_W_F32: return ((const float *)w->q)[r * cols + c];
    case HKV_W_F16: return half_to_double(((const uint16_t *)w->q)[r * cols + c]);
    case HKV_W_Q8: {
        double s = half_to_double(w->scale[r * nb + c / HKV_WBLOCK]);
        return s * ((const int8_t *)w->q)[r * cols + c];
    }
    case HKV_W_Q4: {
        int64_t b = r * nb + c / HKV_WBLOCK, j = c % HKV_WBLOCK;
        uint8_t byte = ((const uint8_t *)w->q)[b * 16 + (j & 15)];
        int q = j < 16 ? (byte & 15) : (byte >> 4);
        return half_to_double(w->scale[b]) * q + half_to_double(w->min[b]);
    }
    }
    return NAN;
}

void ref_gemv(const hkv_wmat *w, const float *x, int n, double *y, double *mag)
{
    for (int64_t r = 0; r < w->rows; r++)
        for (int i = 0; i < n; i++) {
            double s = 0, a = 0;
            for (int64_t c = 0; c < w->cols; c++) {
                double t = ref_weight(w, r, c) * x[(int64_t)i * w->cols + c];
                s += t;
                a += fabs(t);
            }
            y[(int64_t)i * w->rows + r] = s;
            mag[(int64_t)i * w->rows + r] = a;
        }
}

static double dot_ref(const float *q, const uint16_t *k, int d)
{
    double s = 0;
    for (int c = 0; c < d; c++) s += (double)q[c] * half_to_double(k[c]);
    return s;
}

void ref_attn(const float *q, int g, int d, const uint16_t *k, const uint16_t *v, int64_t ld,
              const int32_t *idx, int64_t n, double scale, double *out, double *lse)
{
    double *s = malloc((size_t)(n > 0 ? n : 1) * sizeof *s);
    for (int h = 0; h < g; h++) {
        double m = -INFINITY;
        for (int64_t i = 0; i < n; i++) {
            int64_t row = idx ? idx[i] : i;
            s[i] = scale * dot_ref(q + (int64_t)h * d, k + row * ld, d);
            if (s[i] > m) m = s[i];
        }
        double l = 0;
        for (int c = 0; c < d; c++) out[(int64_t)h * d + c] = 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t row = idx ? idx[i] : i;
            double p = exp(s[i] - m);
            l += p;
            for (int c = 0; c < d; c++) out[(int64_t)h * d + c] += p * half_to_double(v[row * ld + c]);
        }
        if (n > 0) {
            for (int c = 0; c < d; c++) out[(int64_t)h * d + c] /= l;
            lse[h] = m + log(l);
        } else {
            lse[h] = -INFINITY;
        }
    }
    free(s);
}

void ref_score_max(const float *q, int g, int d, const uint16_t *k, int64_t ld,
                   const int32_t *idx, int64_t n, double *s, double *mag)
{
    for (int64_t i = 0; i < n; i++) {
        const uint16_t *row = k + (int64_t)idx[i] * ld;
        double best = -INFINITY, bm = 0;
        for (int h = 0; h < g; h++) {
            double t = dot_ref(q + (int64_t)h * d, row, d), a = 0;
            for (int c = 0; c < d; c++) a += fabs((double)q[(int64_t)h * d + c] * half_to_double(row[c]));
            if (t > best) best = t;
            if (a > bm) bm = a;
        }
        s[i] = best;
        mag[i] = bm;
    }
}
