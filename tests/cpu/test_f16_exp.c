/* Conversions and exp, for every ISA level:
 *  - f16_to_f32 on all 65536 codes equals the exact value (NaN stays NaN);
 *  - f32_to_f16 gives the nearest half, ties to even, on random values in
 *    [-2, 2], on exact midpoints between neighbouring halves, on subnormal
 *    and overflow boundaries (reference: search over the codes);
 *  - exp: relative error <= 4e-7 against double exp on [-87, 88] (a dense
 *    sweep plus random points), exp(-inf) = 0, exp(-100) = 0 on vector levels
 *    (libm denormal on scalar), exp(0) = 1, and
 *    monotone non-decreasing over the sweep. */
#include "util.h"

#define NRAND 200000

int main(void)
{
    hkv_cpu_kernels t;
    test_rng rng = {42};
    uint16_t *codes = malloc(65536 * 2), *h = malloc(NRAND * 2 + 64);
    float *f = alloc_poisoned(65536), *src = malloc(NRAND * sizeof(float) + 64);
    for (int i = 0; i < 65536; i++) codes[i] = (uint16_t)i;

    /* values to round: random, midpoints, edges */
    int nsrc = 0;
    for (int i = 0; i < NRAND / 2; i++) src[nsrc++] = rng_uniform(&rng, -2.0f, 2.0f);
    for (int i = 0; nsrc < NRAND - 16; i++) {
        uint16_t a = (uint16_t)(rng_next(&rng) % 0x7bff);     /* finite positive */
        float mid = (float)((half_to_double(a) + half_to_double((uint16_t)(a + 1))) / 2);
        src[nsrc++] = (i & 1) ? -mid : mid;
    }
    const float edges[] = {65504.0f, 65519.0f, 65520.0f, 1e9f, 5.9604645e-8f, 2.9802322e-8f,
                           2.9802326e-8f, 6.1035156e-5f, 6.1e-5f, 1e-10f, -0.0f, 0.0f, 1.0f,
                           -65519.99f, 3.0e-8f, 8.9e-8f};
    for (unsigned i = 0; i < sizeof edges / sizeof *edges; i++) src[nsrc++] = edges[i];

    FOR_EACH_ISA(t, isa) {
        poison(f, 65536);
        t.f16_to_f32(codes, f, 65536);
        int bad = 0;
        for (int i = 0; i < 65536; i++) {
            double ref = half_to_double((uint16_t)i);
            if (isnan(ref) ? !isnan(f[i]) : (double)f[i] != ref) bad++;
        }
        CHECK(bad == 0 && guard_intact(f, 65536), "%s f16_to_f32: %d wrong codes", hkv_isa_name(isa), bad);

        memset(h, 0xAB, NRAND * 2 + 64);
        t.f32_to_f16(src, h, nsrc);
        bad = 0;
        int first = -1;
        for (int i = 0; i < nsrc; i++) {
            uint16_t ref = double_to_half_ref(src[i]);
            if (src[i] > 65504.0f * 2) ref = 0x7c00;
            if (h[i] != ref) { bad++; if (first < 0) first = i; }
        }
        CHECK(bad == 0, "%s f32_to_f16: %d wrong (first %.9g -> %04x, want %04x)", hkv_isa_name(isa),
              bad, first >= 0 ? src[first] : 0.0, first >= 0 ? h[first] : 0,
              first >= 0 ? double_to_half_ref(src[first]) : 0);
        CHECK(h[nsrc] == 0xABAB, "%s f32_to_f16 wrote past n", hkv_isa_name(isa));

        /* exp */
        enum { NX = 100003 };
        float *x = malloc(NX * sizeof *x), *y = alloc_poisoned(NX);
        for (int i = 0; i < NX; i++) x[i] = i < 80000 ? -87.0f + 175.0f * i / 80000.0f : rng_uniform(&rng, -87.0f, 88.0f);
        t.exp(x, y, NX);
        double worst = 0;
        int worst_i = 0, mono = 1;
        for (int i = 0; i < NX; i++) {
            double r = exp((double)x[i]), e = fabs(y[i] - r) / r;
            if (!(e <= worst)) { worst = e; worst_i = i; }
            if (i > 0 && i < 80000 && y[i] < y[i - 1]) mono = 0;
        }
        CHECK(worst <= 4e-7 && guard_intact(y, NX), "%s exp: max rel err %.3g at x=%.9g", hkv_isa_name(isa),
              worst, x[worst_i]);
        CHECK(mono, "%s exp not monotone", hkv_isa_name(isa));
        float sx[5] = {-INFINITY, -100.0f, 0.0f, -87.5f, 1.0f}, sy[5];
        t.exp(sx, sy, 5);
        CHECK(sy[0] == 0.0f && sy[1] >= 0.0f && sy[1] < 1e-38f && (isa == HKV_ISA_SCALAR || sy[1] == 0.0f) && sy[2] == 1.0f && sy[3] >= 0.0f && sy[3] < 1.2e-38f &&
                  fabsf(sy[4] - 2.7182817f) < 1e-6f,
              "%s exp specials: %g %g %g %g %g", hkv_isa_name(isa), sy[0], sy[1], sy[2], sy[3], sy[4]);
        free(x);
        free(y);
        printf("%s: exp max rel err %.3g\n", hkv_isa_name(isa), worst);
    }
    free(codes); free(h); free(f); free(src);
    return test_report("test_f16_exp");
}
