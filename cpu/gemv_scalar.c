/* Portable GEMV and row dequantisation over the repacked weight formats.
 * Baseline code for CPUs without AVX2 and the fallback every vector path
 * must agree with. One 32-wide block is decoded to float and reused across
 * the n activation rows, as in the vector versions. */
#include "kernels_impl.h"

/* Decode weights [c0, c0+len) of row r into w (len <= 32, inside one block
 * for Q8/Q4). */
static void decode_span(const hkv_wmat *m, int64_t r, int64_t c0, int len, float *w)
{
    int64_t cols = m->cols;
    switch (m->type) {
    case HKV_W_F32: {
        const float *p = (const float *)m->q + r * cols + c0;
        for (int j = 0; j < len; j++) w[j] = p[j];
        break;
    }
    case HKV_W_F16: {
        const uint16_t *p = (const uint16_t *)m->q + r * cols + c0;
        for (int j = 0; j < len; j++) w[j] = hkv_half_to_float(p[j]);
        break;
    }
    case HKV_W_Q8: {
        const int8_t *p = (const int8_t *)m->q + r * cols + c0;
        float s = hkv_half_to_float(m->scale[r * (cols / HKV_WBLOCK) + c0 / HKV_WBLOCK]);
        for (int j = 0; j < len; j++) w[j] = s * (float)p[j];
        break;
    }
    case HKV_W_Q4: {
        int64_t b = r * (cols / HKV_WBLOCK) + c0 / HKV_WBLOCK;
        const uint8_t *p = (const uint8_t *)m->q + b * (HKV_WBLOCK / 2);
        float s = hkv_half_to_float(m->scale[b]);
        float mn = hkv_half_to_float(m->min[b]);
        for (int j = 0; j < 16; j++) {
            w[j] = s * (float)(p[j] & 15) + mn;
            w[j + 16] = s * (float)(p[j] >> 4) + mn;
        }
        break;
    }
    default:
        for (int j = 0; j < len; j++) w[j] = NAN;
    }
}

void hkv_gemv_scalar(const hkv_wmat *m, const float *x, int n, float *y, int64_t ldy,
                     int64_t r0, int64_t r1)
{
    int64_t cols = m->cols;
    float w[HKV_WBLOCK];
    for (int64_t r = r0; r < r1; r++) {
        float acc[HKV_GEMV_MAX_N] = {0};
        for (int64_t c0 = 0; c0 < cols; c0 += HKV_WBLOCK) {
            int len = cols - c0 < HKV_WBLOCK ? (int)(cols - c0) : HKV_WBLOCK;
            decode_span(m, r, c0, len, w);
            for (int i = 0; i < n; i++) {
                const float *xi = x + (int64_t)i * cols + c0;
                float s = 0.0f;
                for (int j = 0; j < len; j++) s += w[j] * xi[j];
                acc[i] += s;
            }
        }
        for (int i = 0; i < n; i++) y[(int64_t)i * ldy + r] = acc[i];
    }
}

/* The scalar sum of a row is already independent of n (one accumulator per
 * activation row, blocks in order); groups of HKV_GEMV_MAX_N for larger n. */
void hkv_gemv_fixed_scalar(const hkv_wmat *m, const float *x, int n, float *y, int64_t ldy,
                           int64_t r0, int64_t r1)
{
    for (int i0 = 0; i0 < n; i0 += HKV_GEMV_MAX_N) {
        int ni = n - i0 < HKV_GEMV_MAX_N ? n - i0 : HKV_GEMV_MAX_N;
        hkv_gemv_scalar(m, x + (int64_t)i0 * m->cols, ni, y + (int64_t)i0 * ldy, ldy, r0, r1);
    }
}

void hkv_dequant_rows_scalar(const hkv_wmat *m, int64_t r0, int64_t r1, float *dst)
{
    int64_t cols = m->cols;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c0 = 0; c0 < cols; c0 += HKV_WBLOCK) {
            int len = cols - c0 < HKV_WBLOCK ? (int)(cols - c0) : HKV_WBLOCK;
            decode_span(m, r, c0, len, dst + (r - r0) * cols + c0);
        }
}
