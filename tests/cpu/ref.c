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

void ref_make_wmat(ref_wmat *m, int type, int64_t rows, int64_t cols, test_rng *rng)
{
    memset(m, 0, sizeof *m);
    int64_t n = rows * cols, nb = n / HKV_WBLOCK;
    size_t qbytes = type == HKV_W_F32 ? n * 4 : type == HKV_W_F16 ? n * 2 : type == HKV_W_Q8 ? n : n / 2;
    m->q = aligned_alloc(64, (qbytes + 63) / 64 * 64);
    if (type == HKV_W_F32)
        for (int64_t i = 0; i < n; i++) ((float *)m->q)[i] = rng_nonzero(rng, -1, 1);
    else if (type == HKV_W_F16)
        for (int64_t i = 0; i < n; i++) ((uint16_t *)m->q)[i] = rng_half(rng, -1, 1);
    else if (type == HKV_W_Q8)
        for (int64_t i = 0; i < n; i++) ((int8_t *)m->q)[i] = (int8_t)((int)(rng_next(rng) % 255) - 127);
    else
        for (int64_t i = 0; i < n / 2; i++) ((uint8_t *)m->q)[i] = (uint8_t)rng_next(rng);
    if (type == HKV_W_Q8 || type == HKV_W_Q4) {
        m->scale = malloc(nb * 2 + 2);
        for (int64_t b = 0; b < nb; b++) m->scale[b] = rng_half(rng, 0.001f, 0.02f);
    }
    if (type == HKV_W_Q4) {
        m->min = malloc(nb * 2 + 2);
        for (int64_t b = 0; b < nb; b++) m->min[b] = rng_half(rng, -0.16f, -0.01f);
    }
    m->w = (hkv_wmat){type, rows, cols, m->q, m->scale, m->min, 0};
}

void ref_free_wmat(ref_wmat *m) { free(m->q); free(m->scale); free(m->min); }

double ref_worst_err(const float *y, const double *ref, const double *mag, int64_t count, int *nan)
{
    double w = 0;
    *nan = 0;
    for (int64_t i = 0; i < count; i++) {
        if (isnan(y[i])) { (*nan)++; continue; }
        double e = fabs(y[i] - ref[i]) / (mag[i] > 0 ? mag[i] : 1);
        if (e > w) w = e;
    }
    return w;
}

void ref_quant_row(const float *x, int64_t cols, int8_t *q, float *d, double *sx, int32_t *sq)
{
    for (int64_t b = 0; b < cols / HKV_WBLOCK; b++) {
        const float *xb = x + b * HKV_WBLOCK;
        float amax = 0;
        double s = 0;
        for (int j = 0; j < HKV_WBLOCK; j++) {
            amax = fmaxf(amax, fabsf(xb[j]));
            s += xb[j];
        }
        int live = amax >= 1e-30f;
        float id = live ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int j = 0; j < HKV_WBLOCK; j++) {
            float v = rintf(xb[j] * id);
            int qi = v > 127 ? 127 : v < -127 ? -127 : (int)v;
            q[b * HKV_WBLOCK + j] = (int8_t)qi;
            sum += qi;
        }
        d[b] = live ? amax / 127.0f : 0.0f;
        sx[b] = s;
        sq[b] = sum;
    }
}

/* The integer of weight (r, c) and its block's scale (Q4: nibble, Q8: int8). */
static int weight_int(const hkv_wmat *w, int64_t r, int64_t c)
{
    int64_t nb = w->cols / HKV_WBLOCK;
    if (w->type == HKV_W_Q8) return ((const int8_t *)w->q)[r * w->cols + c];
    int64_t b = r * nb + c / HKV_WBLOCK, j = c % HKV_WBLOCK;
    uint8_t byte = ((const uint8_t *)w->q)[b * 16 + (j & 15)];
    return j < 16 ? (byte & 15) : (byte >> 4);
}

void ref_qgemm(const hkv_wmat *w, const hkv_qact *a, int n, double *y, double *mag, double *qerr)
{
    const int64_t nb = w->cols / HKV_WBLOCK;
    for (int i = 0; i < n; i++)
        for (int64_t r = 0; r < w->rows; r++) {
            double s = 0, m = 0, e = 0;
            for (int64_t b = 0; b < nb; b++) {
                double sw = half_to_double(w->scale[r * nb + b]), dx = a->d[i * a->nbp + b];
                double mn = w->type == HKV_W_Q4 ? half_to_double(w->min[r * nb + b]) : 0;
                int64_t isum = 0;
                double wabs = 0;
                for (int j = 0; j < HKV_WBLOCK; j++) {
                    int64_t c = b * HKV_WBLOCK + j;
                    int qw = weight_int(w, r, c), qa = hkv_qact_at(a, i, c);
                    isum += (int64_t)qw * qa;
                    m += fabs(sw * qw * dx * qa);
                    wabs += fabs(sw * qw);
                }
                s += sw * dx * (double)isum;
                if (w->type == HKV_W_Q4) {
                    double t = mn * a->sx[i * a->nbp + b];
                    s += t;
                    m += fabs(t);
                }
                e += dx / 2 * wabs;
            }
            y[(int64_t)i * w->rows + r] = s;
            if (mag) mag[(int64_t)i * w->rows + r] = m;
            if (qerr) qerr[(int64_t)i * w->rows + r] = e;
        }
}
