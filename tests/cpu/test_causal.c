/* attn_causal against the float64 reference (query i at position p0+i sees
 * keys 0..p0+i), every ISA level. Shapes cross the query-tile and key-tile
 * boundaries and cover the per-token path for tiny blocks, head splitting
 * (g = 70 > one tile of query rows), odd g and d = 48 (scalar fallback).
 * q and out use token strides larger than g*d; the padding between tokens
 * must stay untouched. Per (token, head): max|out - ref| <= 1e-4 * max|ref|,
 * |lse - ref| <= 1e-4 * max(1, |ref|).
 *
 * attn_causal_fast, every build this machine runs (precision FAST's prompt
 * attention): the same cases within the build's bound, and every token's
 * result bit-identical whether its call starts at token 0 or mid-way (the
 * rows sharing a tile must not change a row's arithmetic).
 *   - 16-bit fixed point (attn_causal_i16.inc; AVX2's vpmaddwd, AVX-VNNI's
 *     and AVX512-VNNI's vpdpwssd): 2e-3 (Q and K in 12-bit codes, V in 13,
 *     P in 14; measured up to 6e-4), and the same bits from every build;
 *   - AMX-BF16 (attn_causal_amx.c): 2e-2 (Q, K, V and P rounded to 8 bits
 *     of mantissa; measured up to 8e-3).
 * Each table's attn_causal_fast must be the build its CPU calls for. */
#include "kernels_impl.h"
#include "ref.h"
#include "util.h"

typedef void (*causal_fn)(const float *q, int64_t ldq, int nq, int g, int d, int64_t p0,
                          const uint16_t *k, const uint16_t *v, int64_t ld, float scale, float *out,
                          int64_t ldo, float *lse);

/* Random fp16 K and V of nk rows (stride ld) and queries of nq tokens
 * (stride ldq). */
static void random_kvq(int64_t nk, int64_t ld, int nq, int64_t ldq, test_rng *rng, uint16_t **k,
                       uint16_t **v, float **q)
{
    *k = malloc(nk * ld * 2), *v = malloc(nk * ld * 2);
    for (int64_t i = 0; i < nk * ld; i++) {
        (*k)[i] = rng_half(rng, -1, 1);
        (*v)[i] = rng_half(rng, -1, 1);
    }
    *q = malloc(nq * ldq * sizeof **q);
    for (int64_t i = 0; i < nq * ldq; i++) (*q)[i] = rng_nonzero(rng, -2, 2);
}

static void check_causal_fn(causal_fn fn, double tol, const char *name,
                            int nq, int64_t p0, int g, int d, test_rng *rng)
{
    int64_t ld = d + 8, nk = p0 + nq;
    int64_t ldq = (int64_t)g * d + 5, ldo = (int64_t)g * d + 3;
    uint16_t *k, *v;
    float *q;
    random_kvq(nk, ld, nq, ldq, rng, &k, &v, &q);
    float *out = alloc_poisoned(nq * ldo), *lse = alloc_poisoned((size_t)nq * g);
    float scale = 1.0f / sqrtf((float)d);
    fn(q, ldq, nq, g, d, p0, k, v, ld, scale, out, ldo, lse);

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
    CHECK(bad == 0 && stray == 0 && worst <= tol && worst_l <= tol && guard_intact(out, nq * ldo) &&
              guard_intact(lse, (size_t)nq * g),
          "%s causal nq=%d p0=%lld g=%d d=%d: out err %.3g lse err %.3g, %d NaN, %d stray",
          name, nq, (long long)p0, g, d, worst, worst_l, bad, stray);
    if (getenv("HKV_TEST_VERBOSE"))
        printf("%s causal nq=%d p0=%lld g=%d d=%d: out err %.3g lse err %.3g\n", name, nq,
               (long long)p0, g, d, worst, worst_l);
    free(k); free(v); free(q); free(out); free(lse); free(rout); free(rlse);
}

static void check_causal(const hkv_cpu_kernels *t, int nq, int64_t p0, int g, int d, test_rng *rng)
{
    check_causal_fn(t->attn_causal, 1e-4, hkv_isa_name(t->isa), nq, p0, g, d, rng);
}

/* Random K, V (d wide, packed) and queries for nq tokens at p0, and two
 * sets of outputs to be compared bit for bit. */
typedef struct {
    int64_t ldq;
    int nq, g, d;
    uint16_t *k, *v;
    float *q, *o[2], *l[2];
} out_pair;

static void pair_make(out_pair *p, int nq, int64_t p0, int g, int d, test_rng *rng)
{
    p->ldq = (int64_t)g * d, p->nq = nq, p->g = g, p->d = d;
    random_kvq(p0 + nq, d, nq, p->ldq, rng, &p->k, &p->v, &p->q);
    for (int i = 0; i < 2; i++) {
        p->o[i] = calloc(nq * p->ldq, sizeof *p->o[i]);
        p->l[i] = calloc((size_t)nq * g, sizeof *p->l[i]);
    }
}

static int pair_same(const out_pair *p)
{
    return memcmp(p->o[0], p->o[1], p->nq * p->ldq * sizeof(float)) == 0 &&
           memcmp(p->l[0], p->l[1], (size_t)p->nq * p->g * sizeof(float)) == 0;
}

static void pair_free(out_pair *p)
{
    free(p->k), free(p->v), free(p->q);
    for (int i = 0; i < 2; i++) free(p->o[i]), free(p->l[i]);
}

/* Tokens [0, nq) in one call, then as calls of [0, cut) and [cut, nq): the
 * same bits for every token (both calls large enough for the tile path;
 * below a quarter tile of rows the fp32 kernel takes the decode kernel). */
static void check_split_invariant(causal_fn fn, const char *name, int nq, int cut, int g, int d,
                                  test_rng *rng)
{
    out_pair p;
    pair_make(&p, nq, 0, g, d, rng);
    const int64_t ldq = p.ldq;
    const float scale = 1.0f / sqrtf((float)d);
    fn(p.q, ldq, nq, g, d, 0, p.k, p.v, d, scale, p.o[0], ldq, p.l[0]);
    fn(p.q, ldq, cut, g, d, 0, p.k, p.v, d, scale, p.o[1], ldq, p.l[1]);
    fn(p.q + cut * ldq, ldq, nq - cut, g, d, cut, p.k, p.v, d, scale, p.o[1] + cut * ldq, ldq,
       p.l[1] + (size_t)cut * g);
    CHECK(pair_same(&p), "%s causal nq=%d cut=%d g=%d d=%d: a token's result depends on where its call starts",
          name, nq, cut, g, d);
    pair_free(&p);
}

/* The same calls through two builds: the same bits. */
static void check_same_bits(causal_fn a, const char *na, causal_fn b, const char *nb, int nq,
                            int64_t p0, int g, int d, test_rng *rng)
{
    out_pair p;
    pair_make(&p, nq, p0, g, d, rng);
    const float scale = 1.0f / sqrtf((float)d);
    a(p.q, p.ldq, nq, g, d, p0, p.k, p.v, d, scale, p.o[0], p.ldq, p.l[0]);
    b(p.q, p.ldq, nq, g, d, p0, p.k, p.v, d, scale, p.o[1], p.ldq, p.l[1]);
    CHECK(pair_same(&p), "causal nq=%d p0=%lld g=%d d=%d: %s and %s differ", nq, (long long)p0, g, d, na, nb);
    pair_free(&p);
}

typedef struct {
    causal_fn fn;
    const char *name;
    double tol;
} fast_build;

static const struct { int nq; int64_t p0; int g, d; } cases[] = {
    {1, 0, 1, 64},  {1, 40, 4, 128}, {5, 3, 3, 64},    {7, 0, 8, 128},  {70, 0, 4, 128},
    {129, 100, 1, 64}, {40, 37, 8, 128}, {33, 0, 3, 128}, {100, 0, 1, 128}, {3, 5, 70, 64},
    {21, 300, 3, 64}, {64, 31, 2, 64}, {9, 2, 5, 48},  {17, 1, 4, 80},
};

static void check_fast_build(const fast_build *b, test_rng *rng)
{
    for (unsigned i = 0; i < sizeof cases / sizeof *cases; i++)
        check_causal_fn(b->fn, b->tol, b->name, cases[i].nq, cases[i].p0, cases[i].g, cases[i].d, rng);
    check_causal_fn(b->fn, b->tol, b->name, 600, 0, 3, 64, rng);
    check_causal_fn(b->fn, b->tol, b->name, 300, 500, 4, 128, rng);
    check_causal_fn(b->fn, b->tol, b->name, 40, 20, 2, 256, rng);
    check_split_invariant(b->fn, b->name, 200, 77, 3, 64, rng);
    check_split_invariant(b->fn, b->name, 150, 33, 4, 128, rng);
    check_split_invariant(b->fn, b->name, 90, 41, 70, 64, rng);
}

int main(void)
{
    hkv_cpu_kernels t;
    test_rng rng = {3};
    FOR_EACH_ISA(t, isa) {
        for (unsigned i = 0; i < sizeof cases / sizeof *cases; i++)
            check_causal(&t, cases[i].nq, cases[i].p0, cases[i].g, cases[i].d, &rng);
        if (isa == isa_best) check_causal(&t, 600, 0, 4, 128, &rng);   /* many tiles */
        /* fp32: tiles of query rows that start and end mid-token (g = 3, 5) */
        check_split_invariant(t.attn_causal, hkv_isa_name(t.isa), 200, 77, 3, 64, &rng);
        check_split_invariant(t.attn_causal, hkv_isa_name(t.isa), 150, 33, 5, 128, &rng);
        check_split_invariant(t.attn_causal, hkv_isa_name(t.isa), 90, 41, 70, 64, &rng);
    }

    /* FAST: every build this CPU runs, and which one each table holds */
    fast_build fb[4];
    int nfb = 0, n16 = 0, amx = 0;
    hkv_isa_info info;
    hkv_isa_detect(&info);
    CHECK(hkv_cpu_kernels_init(&t, HKV_ISA_SCALAR) == HKV_ISA_SCALAR && !t.attn_causal_fast,
          "the scalar table has a FAST prompt attention");
#if defined(__x86_64__)
    if (info.best >= HKV_ISA_AVX2) {
        fb[nfb++] = (fast_build){hkv_attn_causal_i16_avx2, "avx2-i16", 2e-3};
        hkv_cpu_kernels_init(&t, HKV_ISA_AVX2 | HKV_ISA_NO_AVXVNNI);
        CHECK(t.attn_causal_fast == hkv_attn_causal_i16_avx2, "avx2-novnni: not the vpmaddwd build");
        hkv_cpu_kernels_init(&t, HKV_ISA_AVX2);
        CHECK(t.attn_causal_fast == (t.avxvnni ? hkv_attn_causal_i16_avxvnni : hkv_attn_causal_i16_avx2),
              "avx2: the prompt attention's build is not the products'");
#if defined(HKV_HAVE_AVXVNNI)
        if (t.avxvnni) fb[nfb++] = (fast_build){hkv_attn_causal_i16_avxvnni, "avx-vnni-i16", 2e-3};
#endif
    }
    n16 = nfb;
    if (info.best >= HKV_ISA_AVX512 && info.avx512_vnni) {
        fb[nfb++] = (fast_build){hkv_attn_causal_i16_avx512vnni, "avx512-vnni-i16", 2e-3};
        n16 = nfb;
        hkv_cpu_kernels_init(&t, HKV_ISA_AVX512);
#if defined(HKV_HAVE_AMX_BF16)
        if (t.attn_causal_fast == hkv_attn_causal_amxbf16) {
            fb[nfb++] = (fast_build){hkv_attn_causal_amxbf16, "amx-bf16", 2e-2};
            amx = 1;
        } else
#endif
            CHECK(t.attn_causal_fast == hkv_attn_causal_i16_avx512vnni,
                  "avx512: neither AMX-BF16 nor the AVX512-VNNI build");
    }
#endif
    for (int i = 0; i < nfb; i++) check_fast_build(&fb[i], &rng);
    for (int i = 1; i < n16; i++) {
        check_same_bits(fb[0].fn, fb[0].name, fb[i].fn, fb[i].name, 150, 37, 3, 64, &rng);
        check_same_bits(fb[0].fn, fb[0].name, fb[i].fn, fb[i].name, 90, 300, 4, 128, &rng);
        check_same_bits(fb[0].fn, fb[0].name, fb[i].fn, fb[i].name, 20, 5, 70, 64, &rng);
    }
    printf("FAST prompt attention builds checked: %d, compared bit for bit: %d\n", nfb, n16);
    /* collected by tools/scripts/test_summary.py */
    if (!amx) printf("untested ISA: amx_bf16: attn_causal_fast (cpu/attn_causal_amx.c)\n");
    if (nfb == 0 || !info.avx512_vnni)
        printf("untested ISA: avx512_vnni: attn_causal_fast (cpu/attn_causal_i16_avx512.c)\n");
    if (!info.avx_vnni)
        printf("untested ISA: avx_vnni: attn_causal_fast (cpu/attn_causal_i16_avxvnni.c)\n");
    return test_report("test_causal");
}
