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

/* ---- test matrices and error measures shared by the GEMV/GEMM tests ---- */

struct test_rng;
/* A random matrix in a repacked format: F32/F16 in [-1, 1], Q8 integers in
 * [-127, 127], Q4 any nibble, scales in [0.001, 0.02], Q4 mins in
 * [-0.16, -0.01]; the buffers it owns. */
typedef struct { hkv_wmat w; void *q; uint16_t *scale, *min; } ref_wmat;
void ref_make_wmat(ref_wmat *m, int type, int64_t rows, int64_t cols, struct test_rng *rng);
void ref_free_wmat(ref_wmat *m);

/* Worst of |y - ref| / mag over count outputs; NaNs counted apart. */
double ref_worst_err(const float *y, const double *ref, const double *mag, int64_t count, int *nan);

/* ---- int8 activations (precision fast) ---------------------------------- */

/* Row i of x (cols) quantised as cpu/kernels.h's hkv_qact documents, by
 * plain scalar code: q[cols] in natural element order, d[nb] scales,
 * sx[nb] float64 block sums of x, sq[nb] integer block sums of q. */
void ref_quant_row(const float *x, int64_t cols, int8_t *q, float *d, double *sx, int32_t *sq);

/* The product the fast path computes, in float64 from the kernel's own
 * quantised activations a (n rows): y[i][r] = sum_b sw dx sum_j qw_j qa_j
 * (+ Q4: min sx); wq[i][r] = sum_j |W[r][j] (x~[i][j])| over the weights'
 * full values and the dequantised activations, and qerr[i][r] = the
 * rigorous bound on |this - the fp32-activation product|: sum over blocks
 * of (dx / 2) sum_j |scale q_j|. Any of mag, qerr may be NULL. */
void ref_qgemm(const hkv_wmat *w, const hkv_qact *a, int n, double *y, double *mag, double *qerr);

#endif
