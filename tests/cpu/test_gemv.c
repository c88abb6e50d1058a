/* GEMV, dequantisation and hkv_matmul against the float64 reference, for
 * every weight format and every ISA level:
 *  - gemv with n = 1..8 activation rows on shapes with odd row counts and,
 *    for F32/F16, column counts that are not a multiple of 32; a row range
 *    [r0, r1) inside the matrix must leave every other output untouched;
 *    error per output <= 1e-5 * sum_c |W x| (scale-aware relative error);
 *  - dequant_rows equals the reference weights (<= 1e-6 relative);
 *  - hkv_matmul for n <= 8 (threaded gemv) and n > 8 (oneDNN panels, both
 *    schedules), error <= 2e-5 * sum_c |W x|; guards after y stay NaN. */
#include "kernels_impl.h"
#include "ref.h"
#include "util.h"

static const char *type_name[] = {"f32", "f16", "q8", "q4"};

static void test_gemv_shape(const hkv_cpu_kernels *t, int type, int64_t rows, int64_t cols, test_rng *rng)
{
    ref_wmat m;
    ref_make_wmat(&m, type, rows, cols, rng);
    float *x = malloc(HKV_GEMV_MAX_N * cols * sizeof *x);
    for (int64_t i = 0; i < HKV_GEMV_MAX_N * cols; i++) x[i] = rng_nonzero(rng, -1, 1);
    double *ref = malloc(HKV_GEMV_MAX_N * rows * sizeof *ref), *mag = malloc(HKV_GEMV_MAX_N * rows * sizeof *mag);
    ref_gemv(&m.w, x, HKV_GEMV_MAX_N, ref, mag);
    /* ref rows are [n][rows] for n = 8; row i of x is the same for any n */
    float *y = alloc_poisoned(HKV_GEMV_MAX_N * rows);
    for (int n = 1; n <= HKV_GEMV_MAX_N; n++) {
        poison(y, HKV_GEMV_MAX_N * rows);
        t->gemv(&m.w, x, n, y, rows, 0, rows);
        int nan;
        double e = ref_worst_err(y, ref, mag, n * rows, &nan);
        CHECK(nan == 0 && e <= 1e-5 && isnan(y[n * rows]), "%s gemv %s %lldx%lld n=%d: err %.3g, %d NaN",
              hkv_isa_name(t->isa), type_name[type], (long long)rows, (long long)cols, n, e, nan);
    }
    /* a row range writes only its rows */
    if (rows >= 3) {
        int64_t r0 = 1, r1 = rows - 1;
        poison(y, HKV_GEMV_MAX_N * rows);
        t->gemv(&m.w, x, 3, y, rows, r0, r1);
        int stray = 0, bad = 0;
        for (int i = 0; i < 3; i++)
            for (int64_t r = 0; r < rows; r++) {
                float v = y[i * rows + r];
                if (r < r0 || r >= r1) stray += !isnan(v);
                else bad += isnan(v) || fabs(v - ref[i * rows + r]) > 1e-5 * mag[i * rows + r];
            }
        CHECK(stray == 0 && bad == 0, "%s gemv %s range: %d stray, %d bad", hkv_isa_name(t->isa),
              type_name[type], stray, bad);
    }
    /* dequant_rows */
    int64_t dr0 = rows > 2 ? 1 : 0, dr1 = rows;
    float *dq = alloc_poisoned((dr1 - dr0) * cols);
    t->dequant_rows(&m.w, dr0, dr1, dq);
    int bad = 0;
    for (int64_t r = dr0; r < dr1; r++)
        for (int64_t c = 0; c < cols; c++) {
            double rv = ref_weight(&m.w, r, c), v = dq[(r - dr0) * cols + c];
            bad += !(fabs(v - rv) <= 1e-6 * fabs(rv) + 1e-9);
        }
    CHECK(bad == 0 && guard_intact(dq, (dr1 - dr0) * cols), "%s dequant %s: %d wrong", hkv_isa_name(t->isa),
          type_name[type], bad);
    free(dq);
    free(y); free(ref); free(mag); free(x);
    ref_free_wmat(&m);
}

static void test_matmul_shape(const hkv_cpu_kernels *t, int type, int64_t rows, int64_t cols, int64_t n,
                              test_rng *rng)
{
    ref_wmat m;
    ref_make_wmat(&m, type, rows, cols, rng);
    float *x = malloc(n * cols * sizeof *x);
    for (int64_t i = 0; i < n * cols; i++) x[i] = rng_nonzero(rng, -1, 1);
    double *ref = malloc(n * rows * sizeof *ref), *mag = malloc(n * rows * sizeof *mag);
    ref_gemv(&m.w, x, (int)n, ref, mag);
    float *y = alloc_poisoned(n * rows);
    for (int mode = HKV_MM_SHARED_PANEL; mode <= HKV_MM_THREAD_PANEL; mode++) {
        size_t wsn = hkv_matmul_mode_ws_floats(&m.w, mode);
        float *ws = wsn ? malloc(wsn * sizeof *ws) : NULL;
        poison(y, n * rows);
        int rc = mode == HKV_MM_SHARED_PANEL && wsn == hkv_matmul_ws_floats(&m.w)
                     ? hkv_matmul(t, &m.w, x, n, y, ws)
                     : hkv_matmul_mode(t, &m.w, x, n, y, ws, mode);
        int nan;
        double e = ref_worst_err(y, ref, mag, n * rows, &nan);
        CHECK(rc == 0 && nan == 0 && e <= 2e-5 && guard_intact(y, n * rows),
              "%s matmul %s mode %d %lldx%lld n=%lld: rc %d err %.3g, %d NaN", hkv_isa_name(t->isa),
              type_name[type], mode, (long long)rows, (long long)cols, (long long)n, rc, e, nan);
        free(ws);
        if (n <= HKV_GEMV_MAX_N) break;   /* schedules only differ for large n */
    }
    free(y); free(ref); free(mag); free(x);
    ref_free_wmat(&m);
}

/* Batch invariance: with batch_invariant set, hkv_matmul's row i is
 * bitwise the same whether it runs alone or among n rows (n = 2..20, over
 * the 8-row GEMV groups and where sgemm would otherwise run), and
 * gemv_fixed agrees with the reference like gemv does. */
static void test_invariant(const hkv_cpu_kernels *t0, int type, int64_t rows, int64_t cols,
                           test_rng *rng)
{
    hkv_cpu_kernels t = *t0;
    t.batch_invariant = 1;
    ref_wmat m;
    ref_make_wmat(&m, type, rows, cols, rng);
    enum { NMAX = 20 };
    float *x = malloc(sizeof(float) * NMAX * cols), *y = malloc(sizeof(float) * NMAX * rows);
    float *y1 = malloc(sizeof(float) * NMAX * rows);
    for (int64_t i = 0; i < NMAX * cols; i++) x[i] = rng_uniform(rng, -1, 1);
    for (int i = 0; i < NMAX; i++)
        hkv_matmul(&t, &m.w, x + (int64_t)i * cols, 1, y1 + (int64_t)i * rows, NULL);
    int diff = 0;
    for (int n = 2; n <= NMAX; n++) {
        hkv_matmul(&t, &m.w, x, n, y, NULL);
        for (int64_t k = 0; k < n * rows; k++) diff += memcmp(&y[k], &y1[k], sizeof(float)) != 0;
    }
    CHECK(diff == 0, "%s batch-invariant matmul %s %lldx%lld: %d outputs differ from the row alone",
          hkv_isa_name(t.isa), type_name[type], (long long)rows, (long long)cols, diff);
    double *ref = malloc(sizeof(double) * NMAX * rows), *mag = malloc(sizeof(double) * NMAX * rows);
    ref_gemv(&m.w, x, NMAX, ref, mag);
    int nan;
    double e = ref_worst_err(y1, ref, mag, (int64_t)NMAX * rows, &nan);
    CHECK(nan == 0 && e <= 1e-5, "%s gemv_fixed %s: err %.3g", hkv_isa_name(t.isa), type_name[type], e);
    free(ref);
    free(mag);
    free(x);
    free(y);
    free(y1);
    ref_free_wmat(&m);
}

int main(void)
{
    hkv_cpu_kernels t;
    test_rng rng = {7};
    FOR_EACH_ISA(t, isa) {
        for (int type = HKV_W_F32; type <= HKV_W_Q4; type++) {
            int quant = type >= HKV_W_Q8;
            test_gemv_shape(&t, type, 1, 32, &rng);
            test_gemv_shape(&t, type, 37, 576, &rng);
            test_gemv_shape(&t, type, 5, 4096, &rng);
            test_gemv_shape(&t, type, 19, quant ? 96 : 77, &rng);     /* cols % 32 != 0 for F32/F16 */
            test_gemv_shape(&t, type, 3, quant ? 544 : 13, &rng);      /* fewer cols than one block */
            test_matmul_shape(&t, type, 131, 576, 5, &rng);
            test_matmul_shape(&t, type, 70, 320, 37, &rng);
            if (isa == isa_best) test_matmul_shape(&t, type, 200, 1536, 129, &rng);
            test_invariant(&t, type, 67, 576, &rng);
            test_invariant(&t, type, 9, 4096, &rng);
        }
        /* bad arguments are refused, not crashed on */
        ref_wmat m;
        ref_make_wmat(&m, HKV_W_Q4, 4, 64, &rng);
        float x[64 * 9] = {0}, y[4 * 9];
        CHECK(hkv_matmul(&t, &m.w, x, 9, y, NULL) != 0, "matmul without ws accepted");
        m.w.cols = 48;
        CHECK(hkv_matmul(&t, &m.w, x, 1, y, NULL) != 0, "Q4 with cols not a multiple of 32 accepted");
        ref_free_wmat(&m);
    }
    return test_report("test_gemv");
}
