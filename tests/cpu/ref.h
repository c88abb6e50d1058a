/* Float64 references for the cpu kernels: plain loops over the same
 * inputs (fp16 values taken exactly), used only as test oracles. */
#ifndef HKV_TEST_CPU_REF_H
#define HKV_TEST_CPU_REF_H

#include <stdint.h>

#include "kernels.h"

/* W[r][c] as a double, decoded from the repacked format. */
double ref_weight(const hkv_wmat *w, int64_t r, int64_t c);

/* y[i][r] = sum_c W[r][c] x[i][c] and mag[i][r] = sum_c |W[r][c] x[i][c]|
 * for rows [0, w->rows); y and mag are [n][rows]. */
void ref_gemv(const hkv_wmat *w, const float *x, int n, double *y, double *mag);

/* Attention of g heads over rows idx[0..n) (or 0..n when idx is NULL):
 * out[g][d], lse[g]; n == 0 gives out 0 and lse -inf. */
void ref_attn(const float *q, int g, int d, const uint16_t *k, const uint16_t *v, int64_t ld,
              const int32_t *idx, int64_t n, double scale, double *out, double *lse);

/* s[i] = max_h q_h . k[idx[i]]; mag[i] = max_h sum_c |q_hc k_c| */
void ref_score_max(const float *q, int g, int d, const uint16_t *k, int64_t ld,
                   const int32_t *idx, int64_t n, double *s, double *mag);

#endif
