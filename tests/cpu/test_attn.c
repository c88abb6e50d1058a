/* Decode attention pieces against the float64 reference, every ISA level,
 * d in {64, 128} plus d = 48 and 80 (vector fallback / odd vector counts),
 * g in 1..8 (each its own register-kernel instance on AVX-512) and 40 (more
 * than one head pass), n across the 256-row chunks, on random fp16 K/V with a row
 * stride larger than d:
 *  - attn_dense over n in {0, 1, 7, 16, 33, 256, 257, 1000, 3000}: per head
 *    max|out - ref| <= 1e-4 * max|ref| and |lse - ref| <= 1e-4 * max(1, |ref|);
 *    n == 0 gives out exactly 0 and lse -inf;
 *  - the same with sharp logits (scale 1, large q) so the running max
 *    changes often and exp sees a wide range;
 *  - attn_sparse over random idx (with repeats) into a 5000-row cache;
 *  - score_max over random idx: |s - ref| <= 1e-5 * max_h sum_c |q_hc k_c|.
 *  Outputs are NaN-poisoned with guard elements that must stay NaN. */
#include "ref.h"
#include "util.h"

#define CACHE_ROWS 5000

static void check_attn(const hkv_cpu_kernels *t, const char *what, const float *q, int g, int d,
                       const uint16_t *k, const uint16_t *v, int64_t ld, const int32_t *idx,
                       int64_t n, float scale)
{
    float *out = alloc_poisoned((size_t)g * d), *lse = alloc_poisoned(g);
    double *rout = malloc((size_t)g * d * sizeof *rout), *rlse = malloc(g * sizeof *rlse);
    if (idx) t->attn_sparse(q, g, d, k, v, ld, idx, n, scale, out, lse);
    else t->attn_dense(q, g, d, k, v, ld, n, scale, out, lse);
    ref_attn(q, g, d, k, v, ld, idx, n, scale, rout, rlse);
    int bad = 0;
    double worst = 0, worst_l = 0;
    for (int h = 0; h < g; h++) {
        double rmax = 0, emax = 0;
        for (int c = 0; c < d; c++) rmax = fmax(rmax, fabs(rout[h * d + c]));
        for (int c = 0; c < d; c++) {
            float o = out[h * d + c];
            if (isnan(o)) { bad++; continue; }
            if (n == 0) bad += o != 0.0f;
            emax = fmax(emax, fabs(o - rout[h * d + c]));
        }
        double rel = n ? emax / rmax : 0, el;
        if (n == 0) el = (lse[h] == -INFINITY) ? 0 : 1;
        else el = fabs(lse[h] - rlse[h]) / fmax(1.0, fabs(rlse[h]));
        worst = fmax(worst, rel);
        worst_l = fmax(worst_l, isnan(lse[h]) ? 1 : el);
    }
    CHECK(bad == 0 && worst <= 1e-4 && worst_l <= 1e-4 && guard_intact(out, (size_t)g * d) &&
              guard_intact(lse, g),
          "%s %s g=%d d=%d n=%lld scale=%g: out err %.3g lse err %.3g, %d bad", hkv_isa_name(t->isa),
          what, g, d, (long long)n, scale, worst, worst_l, bad);
    free(out); free(lse); free(rout); free(rlse);
}

/* A row's score does not depend on where it sits in a call (cpu/kernels.h):
 * the scores of idx[0..n) computed in pieces starting at odd offsets equal
 * the whole call's bit for bit, so the tiered cache may spread one rerank's
 * rows over threads (kv/kv_tiered_attn.c). whole == NULL: score_max_i8. */
static int pieces_equal(const hkv_cpu_kernels *t, const float *q, int g, int d, const void *k,
                        int64_t ld, const float *scale, const int32_t *idx, int64_t n,
                        const float *whole)
{
    float *s = alloc_poisoned(n);
    for (int64_t a = 0, step = 5; a < n; a += step, step = step * 3 % 97 + 1) {
        const int64_t m = a + step < n ? step : n - a;
        if (scale)
            t->score_max_i8(q, g, d, k, ld, scale, idx + a, m, s + a);
        else
            t->score_max(q, g, d, k, ld, idx + a, m, s + a);
    }
    const int same = memcmp(s, whole, (size_t)n * sizeof *s) == 0;
    free(s);
    return same;
}

static void check_score(const hkv_cpu_kernels *t, const float *q, int g, int d, const uint16_t *k,
                        int64_t ld, const int32_t *idx, int64_t n)
{
    float *s = alloc_poisoned(n);
    double *rs = malloc((n + 1) * sizeof *rs), *mag = malloc((n + 1) * sizeof *mag);
    t->score_max(q, g, d, k, ld, idx, n, s);
    ref_score_max(q, g, d, k, ld, idx, n, rs, mag);
    int bad = 0;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(s[i])) { bad++; continue; }
        worst = fmax(worst, fabs(s[i] - rs[i]) / mag[i]);
    }
    CHECK(bad == 0 && worst <= 1e-5 && guard_intact(s, n), "%s score_max g=%d d=%d n=%lld: err %.3g, %d NaN",
          hkv_isa_name(t->isa), g, d, (long long)n, worst, bad);
    CHECK(pieces_equal(t, q, g, d, k, ld, NULL, idx, n, s), "%s score_max g=%d d=%d n=%lld: in "
          "pieces, the same scores bit for bit", hkv_isa_name(t->isa), g, d, (long long)n);
    free(s); free(rs); free(mag);
}

/* score_max_i8 against double sums of q . (code times its group's scale):
 * |s - ref| <= 1e-5 * max_h sum_c |q_hc k~_c| (fp32 sums, as score_max's). */
static void check_score_i8(const hkv_cpu_kernels *t, const float *q, int g, int d,
                           const int8_t *k, int64_t ld, const float *scale, const int32_t *idx,
                           int64_t n)
{
    float *s = alloc_poisoned(n);
    int bad = 0;
    double worst = 0;
    t->score_max_i8(q, g, d, k, ld, scale, idx, n, s);
    const int ng = d / HKV_SKETCH_GROUP;
    for (int64_t i = 0; i < n; i++) {
        const int8_t *row = k + (int64_t)idx[i] * ld;
        const float *sc = scale + (int64_t)idx[i] * ng;
        double best = -INFINITY, mag = 0;
        for (int h = 0; h < g; h++) {
            double v = 0, m = 0;
            for (int c = 0; c < d; c++) {
                const double kc = (double)row[c] * sc[c / HKV_SKETCH_GROUP];
                v += (double)q[h * d + c] * kc;
                m += fabs((double)q[h * d + c] * kc);
            }
            best = fmax(best, v), mag = fmax(mag, m);
        }
        const double ref = best, tol = 1e-5 * mag + 1e-30;
        if (isnan(s[i])) bad++;
        else worst = fmax(worst, fabs(s[i] - ref) / tol);
    }
    CHECK(bad == 0 && worst <= 1 && guard_intact(s, n), "%s score_max_i8 g=%d d=%d n=%lld: err %.3g "
          "of the bound, %d NaN", hkv_isa_name(t->isa), g, d, (long long)n, worst, bad);
    CHECK(pieces_equal(t, q, g, d, k, ld, scale, idx, n, s), "%s score_max_i8 g=%d d=%d n=%lld: in "
          "pieces, the same scores bit for bit", hkv_isa_name(t->isa), g, d, (long long)n);
    free(s);
}

int main(void)
{
    hkv_cpu_kernels t;
    test_rng rng = {11};
    const int ds[] = {64, 128, 48, 80};
    const int gs[] = {1, 2, 3, 4, 5, 6, 7, 8, 40};
    const int64_t ns[] = {0, 1, 7, 16, 33, 256, 257, 1000, 3000};
    for (unsigned di = 0; di < sizeof ds / sizeof *ds; di++) {
        int d = ds[di];
        int64_t ld = d + 24;   /* rows padded: the kernels must honour ld */
        uint16_t *k = malloc(CACHE_ROWS * ld * 2), *v = malloc(CACHE_ROWS * ld * 2);
        for (int64_t i = 0; i < CACHE_ROWS * ld; i++) {
            k[i] = rng_half(&rng, -1, 1);
            v[i] = rng_half(&rng, -1, 1);
        }
        int32_t *idx = malloc(3000 * sizeof *idx);
        for (int i = 0; i < 3000; i++) idx[i] = (int32_t)(rng_next(&rng) % CACHE_ROWS);
        float *q = malloc(40 * d * sizeof *q), *qsharp = malloc(40 * d * sizeof *q);
        for (int i = 0; i < 40 * d; i++) {
            q[i] = rng_nonzero(&rng, -1, 1);
            qsharp[i] = q[i] * 6.0f;
        }
        int8_t *k8 = malloc(CACHE_ROWS * ld);
        float *sc8 = malloc(CACHE_ROWS * (d / HKV_SKETCH_GROUP + 1) * sizeof *sc8);
        for (int64_t i = 0; i < CACHE_ROWS * ld; i++) k8[i] = (int8_t)((int)(rng_next(&rng) % 255) - 127);
        for (int64_t i = 0; i < CACHE_ROWS * (d / HKV_SKETCH_GROUP + 1); i++)
            sc8[i] = (float)(rng_next(&rng) % 1000 + 1) * 1e-4f;
        FOR_EACH_ISA(t, isa) {
            for (unsigned gi = 0; gi < sizeof gs / sizeof *gs; gi++) {
                int g = gs[gi];
                if (g == 40 && d != 64) continue;
                for (unsigned ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                    int64_t n = ns[ni];
                    if (di >= 2 && n > 1000) continue;   /* odd d: fewer, smaller cases */
                    if (g == 40 && n > 33) continue;
                    float scale = 1.0f / sqrtf((float)d);
                    check_attn(&t, "dense", q, g, d, k, v, ld, NULL, n, scale);
                    check_attn(&t, "sparse", q, g, d, k, v, ld, idx, n, scale);
                    if (n >= 7 && n <= 1000) check_attn(&t, "sparse-sharp", qsharp, g, d, k, v, ld, idx, n, 1.0f);
                    check_score(&t, q, g, d, k, ld, idx, n);
                    if (d % HKV_SKETCH_GROUP == 0) check_score_i8(&t, q, g, d, k8, ld, sc8, idx, n);
                }
            }
        }
        free(k); free(v); free(idx); free(q); free(qsharp); free(k8); free(sc8);
    }
    return test_report("test_attn");
}
