/* attn_causal against the float64 reference (query i at position p0+i sees
 * keys 0..p0+i), every ISA level. Shapes cross the query-tile and key-tile
 * boundaries and cover the per-token path for tiny blocks, head splitting
 * (g = 70 > one tile of query rows), odd g and d = 48 (scalar fallback).
 * q and out use token strides larger than g*d; the padding between tokens
 * must stay untouched. Per (token, head): max|out - ref| <= 1e-4 * max|ref|,
 * |lse - ref| <= 1e-4 * max(1, |ref|). */
#include "ref.h"
#include "util.h"

static void check_causal(const hkv_cpu_kernels *t, int nq, int64_t p0, int g, int d, test_rng *rng)
{
    int64_t ld = d + 8, nk = p0 + nq;
    int64_t ldq = (int64_t)g * d + 5, ldo = (int64_t)g * d + 3;
    uint16_t *k = malloc(nk * ld * 2), *v = malloc(nk * ld * 2);
    for (int64_t i = 0; i < nk * ld; i++) {
        k[i] = rng_half(rng, -1, 1);
        v[i] = rng_half(rng, -1, 1);
    }
    float *q = malloc(nq * ldq * sizeof *q);
    for (int64_t i = 0; i < nq * ldq; i++) q[i] = rng_nonzero(rng, -2, 2);
    float *out = alloc_poisoned(nq * ldo), *lse = alloc_poisoned((size_t)nq * g);
    float scale = 1.0f / sqrtf((float)d);
    t->attn_causal(q, ldq, nq, g, d, p0, k, v, ld, scale, out, ldo, lse);

    double *rout = malloc((size_t)g * d * sizeof *rout), *rlse = malloc(g * sizeof *rlse);
    double worst = 0, worst_l = 0;
    int bad = 0, stray = 0;
    for (int ti = 0; ti < nq; ti++) {
        ref_attn(q + ti * ldq, g, d, k, v, ld, NULL, p0 + ti + 1, scale, rout, rlse);
        for (int h = 0; h < g; h++) {
            double rmax = 0, emax = 0;
            for (int c = 0; c < d; c++) rmax = fmax(rmax, fabs(rout[h * d + c]));
            for (int c = 0; c < d; c++) {
                float o = out[ti * ldo + h * d + c];
                if (isnan(o)) bad++;
                else emax = fmax(emax, fabs(o - rout[h * d + c]));
            }
            worst = fmax(worst, emax / rmax);
            float l = lse[(int64_t)ti * g + h];
            worst_l = fmax(worst_l, isnan(l) ? 1 : fabs(l - rlse[h]) / fmax(1.0, fabs(rlse[h])));
        }
        for (int64_t c = (int64_t)g * d; c < ldo; c++) stray += !isnan(out[ti * ldo + c]);
    }
    CHECK(bad == 0 && stray == 0 && worst <= 1e-4 && worst_l <= 1e-4 && guard_intact(out, nq * ldo) &&
              guard_intact(lse, (size_t)nq * g),
          "%s causal nq=%d p0=%lld g=%d d=%d: out err %.3g lse err %.3g, %d NaN, %d stray",
          hkv_isa_name(t->isa), nq, (long long)p0, g, d, worst, worst_l, bad, stray);
    free(k); free(v); free(q); free(out); free(lse); free(rout); free(rlse);
}

int main(void)
{
    hkv_cpu_kernels t;
    test_rng rng = {3};
    const struct { int nq; int64_t p0; int g, d; } cases[] = {
        {1, 0, 1, 64},  {1, 40, 4, 128}, {5, 3, 3, 64},    {7, 0, 8, 128},  {70, 0, 4, 128},
        {129, 100, 1, 64}, {40, 37, 8, 128}, {33, 0, 3, 128}, {100, 0, 1, 128}, {3, 5, 70, 64},
        {21, 300, 3, 64}, {64, 31, 2, 64}, {9, 2, 5, 48},  {17, 1, 4, 80},
    };
    FOR_EACH_ISA(t, isa) {
        for (unsigned i = 0; i < sizeof cases / sizeof *cases; i++)
            check_causal(&t, cases[i].nq, cases[i].p0, cases[i].g, cases[i].d, &rng);
        if (isa == isa_best) check_causal(&t, 600, 0, 4, 128, &rng);   /* many tiles */
    }
    return test_report("test_causal");
}
