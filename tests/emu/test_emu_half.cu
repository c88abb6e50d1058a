/* fp16 and bf16 of the CUDA emulator, run inside kernels, against the CUDA
 * Math API (cuda_fp16.h / cuda_bf16.h) and the PTX ISA ("cvt" rounding
 * modifiers .rn/.rz/.rm/.rp, IEEE 754 binary16):
 *  - __float2half_rn/_rz/_rd/_ru (and __float2half): exhaustive around every
 *    half value (the value, its float neighbours, the midpoint to the next
 *    half and the midpoint's neighbours), a stride through all 2^32 float bit
 *    patterns, random floats, and edge cases: ties to even, subnormals,
 *    overflow to inf or to the largest finite value by mode, NaN, -0;
 *  - __half2float for all 65536 halves, and every finite half round-tripping
 *    through float in all four modes;
 *  - __float2bfloat16_rn/_rz, __bfloat162float (all 65536 codes);
 *  - __hadd/__hsub/__hmul ("in round-to-nearest-even mode") and __hfma ("rounding
 *    the result once"), on random operands, constructed ties, and __hfma
 *    cases found by search where rounding fmaf's float result to half again
 *    (double rounding) differs from the single rounding; inf/NaN rules;
 *  - __hmax/__hmin ("if either input is NaN, the other input is returned; if
 *    both are NaNs, canonical NaN; if both are 0.0, +0.0 > -0.0"); __half2
 *    lanes; the __half(double) constructor (__double2half: one rounding).
 * The references are the test's own: an exact binary search over a table of
 * the IEEE values built from the format's definition, integer arithmetic
 * (__int128) for the operations, and, where the CPU has it, the F16C
 * instruction (f16_ref.c), which must agree with the table reference. */
#include <math.h>
#include <stdint.h>

#include <vector>

#include "emu_test.h"

extern "C" {
int emu_ref_have_f16c(void);
uint16_t emu_ref_f16c(float f, int mode);
float emu_ref_f16c_to_float(uint16_t h);
}

enum { RN, RZ, RD, RU };
static const char *mode_names[4] = {"rn", "rz", "rd", "ru"};

/* ---- references ---- */

/* binary16 from its definition: 1 sign, 5 exponent (bias 15), 10 fraction */
static double half_val(uint16_t h)
{
    const int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp((double)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp((double)(1024 + m), e - 25);
    return (h & 0x8000) ? -v : v;
}
/* bfloat16: 1 sign, 8 exponent (bias 127), 7 fraction */
static double bf16_val(uint16_t b)
{
    const int e = (b >> 7) & 255, m = b & 127;
    double v = e == 0 ? ldexp((double)m, -133) : e == 255 ? (m ? NAN : INFINITY) : ldexp((double)(128 + m), e - 134);
    return (b & 0x8000) ? -v : v;
}
static bool is_nan16(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
static bool is_nan_bf(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f); }

static std::vector<double> hv, bv;   /* positive codes' values, increasing; the last is +inf */

/* Round x to the format whose positive values are tab[0..inf_code] (tab[inf_code]
 * = inf), by the IEEE definition: the two neighbours lo <= |x| < hi; toward
 * zero lo, away hi, nearest the closer, a tie the even code; past the largest
 * finite value the next value is 2^emax+1 (what inf stands for when rounding). */
static uint16_t ref_round(const std::vector<double> &tab, double inf_as, double x, int mode)
{
    const uint16_t inf_code = (uint16_t)(tab.size() - 1);
    if (isnan(x)) return 0xffff;   /* callers check NaN-ness only */
    const uint16_t sign = signbit(x) ? 0x8000 : 0;
    const double a = fabs(x);
    if (isinf(a)) return sign | inf_code;
    int lo = 0, hi = inf_code;   /* tab[lo] <= a < tab[hi] */
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (tab[mid] <= a) lo = mid;
        else hi = mid;
    }
    if (tab[lo] == a) return sign | (uint16_t)lo;
    bool up;   /* in magnitude */
    switch (mode) {
    case RZ: up = false; break;
    case RD: up = sign != 0; break;
    case RU: up = sign == 0; break;
    default: {
        const double vh = hi == inf_code ? inf_as : tab[hi];
        const double m = (tab[lo] + vh) / 2;   /* exact: one bit more than the format */
        up = a > m || (a == m && (lo & 1));
    }
    }
    return sign | (uint16_t)(up ? hi : lo);
}
static uint16_t ref_f2h(double x, int mode) { return ref_round(hv, 65536.0, x, mode); }
static uint16_t ref_f2bf(double x, int mode) { return ref_round(bv, ldexp(1.0, 128), x, mode); }

/* ---- exact half arithmetic: finite halves are integers times 2^-24 ---- */
typedef __int128 i128;
typedef unsigned __int128 u128;
static int64_t half_units(uint16_t h)
{
    const int e = (h >> 10) & 31, m = h & 1023;
    const int64_t v = e ? (int64_t)(1024 + m) << (e - 1) : m;
    return (h & 0x8000) ? -v : v;
}
static int bitlen(u128 x)
{
    int n = 0;
    while (x) x >>= 1, n++;
    return n;
}
/* X * 2^uexp rounded once to nearest even half; zero_neg: the sign of an exact zero */
static uint16_t round_units(i128 X, int uexp, bool zero_neg)
{
    if (X == 0) return zero_neg ? 0x8000 : 0;
    const bool neg = X < 0;
    const uint16_t sign = neg ? 0x8000 : 0;
    const u128 M = neg ? (u128)(-X) : (u128)X;
    int e = bitlen(M) - 1 + uexp;   /* floor(log2 |value|) */
    if (e < -14) e = -14;           /* subnormals: the quantum of the lowest binade */
    const int q = e - 10;           /* result = k * 2^q */
    const int sh = q - uexp;
    u128 k;
    if (sh <= 0) k = M << -sh;
    else {
        k = M >> sh;
        const u128 rem = M & (((u128)1 << sh) - 1), half = (u128)1 << (sh - 1);
        if (rem > half || (rem == half && (k & 1))) k++;
    }
    if (k == 0) return sign;
    if (bitlen(k) - 1 + q >= 16) return sign | 0x7c00;   /* rounded past 65504: inf */
    const uint64_t K = (uint64_t)k << (q + 24);           /* units of 2^-24 */
    if (K < 1024) return sign | (uint16_t)K;
    const int p = 63 - __builtin_clzll(K);
    return sign | (uint16_t)(((p - 9) << 10) | ((K >> (p - 10)) & 0x3ff));
}
static uint16_t ref_hadd(uint16_t a, uint16_t b)
{
    return round_units((i128)half_units(a) + half_units(b), -24, (a & 0x8000) && (b & 0x8000));
}
static uint16_t ref_hmul(uint16_t a, uint16_t b)
{
    return round_units((i128)half_units(a) * half_units(b), -48, ((a ^ b) & 0x8000) != 0);
}
static uint16_t ref_hfma(uint16_t a, uint16_t b, uint16_t c)
{
    const i128 p = (i128)half_units(a) * half_units(b);
    const bool pneg = ((a ^ b) & 0x8000) != 0, cneg = (c & 0x8000) != 0;
    const i128 X = p + (i128)half_units(c) * ((i128)1 << 24);   /* a multiply: c may be negative */
    /* an exact zero: -0 only when both addends are zeros of negative sign */
    return round_units(X, -48, p == 0 && half_units(c) == 0 && pneg && cneg);
}
static bool finite16(uint16_t h) { return (h & 0x7c00) != 0x7c00; }

/* ---- kernels: every conversion and operation runs on the device ---- */

static __global__ void k_f2h(const float *x, uint16_t *o, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        o[5 * i + 0] = __half_as_ushort(__float2half_rn(x[i]));
        o[5 * i + 1] = __half_as_ushort(__float2half_rz(x[i]));
        o[5 * i + 2] = __half_as_ushort(__float2half_rd(x[i]));
        o[5 * i + 3] = __half_as_ushort(__float2half_ru(x[i]));
        o[5 * i + 4] = __half_as_ushort(__float2half(x[i]));
    }
}
static __global__ void k_h2f(const uint16_t *h, float *f, uint16_t *rt, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float v = __half2float(__ushort_as_half(h[i]));
        f[i] = v;
        rt[4 * i + 0] = __half_as_ushort(__float2half_rn(v));
        rt[4 * i + 1] = __half_as_ushort(__float2half_rz(v));
        rt[4 * i + 2] = __half_as_ushort(__float2half_rd(v));
        rt[4 * i + 3] = __half_as_ushort(__float2half_ru(v));
    }
}
static __global__ void k_f2bf(const float *x, uint16_t *o, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        o[3 * i + 0] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
        o[3 * i + 1] = __bfloat16_as_ushort(__float2bfloat16_rz(x[i]));
        o[3 * i + 2] = __bfloat16_as_ushort(__float2bfloat16(x[i]));
    }
}
static __global__ void k_bf2f(const uint16_t *b, float *f, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        f[i] = __bfloat162float(__ushort_as_bfloat16(b[i]));
}
static __global__ void k_arith(const uint16_t *a, const uint16_t *b, const uint16_t *c, uint16_t *o, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const __half x = __ushort_as_half(a[i]), y = __ushort_as_half(b[i]), z = __ushort_as_half(c[i]);
        o[4 * i + 0] = __half_as_ushort(__hadd(x, y));
        o[4 * i + 1] = __half_as_ushort(__hsub(x, y));
        o[4 * i + 2] = __half_as_ushort(__hmul(x, y));
        o[4 * i + 3] = __half_as_ushort(__hfma(x, y, z));
    }
}
static __global__ void k_minmax(const uint16_t *a, const uint16_t *b, uint16_t *o, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        o[2 * i] = __half_as_ushort(__hmax(__ushort_as_half(a[i]), __ushort_as_half(b[i])));
        o[2 * i + 1] = __half_as_ushort(__hmin(__ushort_as_half(a[i]), __ushort_as_half(b[i])));
    }
}
static __global__ void k_half2(const float *x, float *o)
{
    const __half2 p = __floats2half2_rn(x[0], x[1]), q = __float2half2_rn(x[2]);
    const __half2 s = __hadd2(p, q), m = __hmul2(p, q), f = __hfma2(p, q, p);
    const float2 pf = __half22float2(p);
    o[0] = __low2float(p), o[1] = __high2float(p), o[2] = __low2float(q), o[3] = __high2float(q);
    o[4] = __low2float(s), o[5] = __high2float(s), o[6] = __low2float(m), o[7] = __high2float(m);
    o[8] = __low2float(f), o[9] = __high2float(f), o[10] = pf.x, o[11] = pf.y;
    const __half2 r = __float22half2_rn(make_float2(x[0], x[1]));
    o[12] = __half2float(__low2half(r)), o[13] = __half2float(__high2half(r));
}
static __global__ void k_from_double(const double *d, uint16_t *o, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const __half h = __half(d[i]);
        o[i] = __half_as_ushort(h);
    }
}

template <class T>
static T *to_dev(const std::vector<T> &v)
{
    T *d = nullptr;
    CUDA_OK(cudaMalloc((void **)&d, v.size() * sizeof(T)));
    CUDA_OK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
template <class T>
static std::vector<T> from_dev(const T *d, size_t n)
{
    std::vector<T> v(n);
    CUDA_OK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}
static void launched(void)
{
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
}

static uint64_t rs = 0x243f6a8885a308d3ull;
static uint64_t rnd(void)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return rs;
}
static float fbits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t bitsf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static std::vector<float> test_floats(void)
{
    std::vector<float> x;
    /* edges */
    const float edges[] = {0.0f, 1.0f, 65504.0f, 65519.99609375f, 65520.0f, 65536.0f, 1e10f, 3.4028235e38f,
                           ldexpf(1, -24), ldexpf(1, -25), ldexpf(3, -26), ldexpf(1, -14), ldexpf(1023, -24),
                           ldexpf(2047, -25), 1.0f + ldexpf(1, -11), 1.0f + ldexpf(3, -11), 2048.0f + 1.0f,
                           ldexpf(1, -149), ldexpf(1, -126), 0.1f, 1.0f / 3.0f, INFINITY, NAN};
    for (float e : edges) x.push_back(e), x.push_back(-e);
    x.push_back(fbits(0x7fc00001u));   /* NaN payloads, both signs */
    x.push_back(fbits(0xff800001u));
    /* around every half value */
    for (int c = 0; c < 0x7c00; c++) {
        const float v = (float)hv[c];
        const float mid = c + 1 < 0x7c00 ? (float)((hv[c] + hv[c + 1]) / 2) : 65520.0f;
        const float cand[] = {v, nextafterf(v, INFINITY), nextafterf(v, 0.0f), mid, nextafterf(mid, INFINITY),
                              nextafterf(mid, 0.0f)};
        for (float f : cand) x.push_back(f), x.push_back(-f);
    }
    /* a stride through every float bit pattern */
    for (uint64_t u = 7; u < (1ull << 32); u += 2039) x.push_back(fbits((uint32_t)u));
    /* random magnitudes across and around the half range */
    for (int i = 0; i < 300000; i++) {
        const uint64_t r = rnd();
        x.push_back((r & 1 ? -1.0f : 1.0f) * ldexpf(1.0f + (float)((r >> 8) & 0xffffff) / 16777216.0f,
                                                   (int)((r >> 40) % 48) - 30));
    }
    return x;
}

static void test_f2h(const std::vector<float> &x, bool f16c)
{
    const int n = (int)x.size();
    float *dx = to_dev(x);
    uint16_t *dout;
    CUDA_OK(cudaMalloc((void **)&dout, (size_t)n * 5 * sizeof(uint16_t)));
    HKV_LAUNCH(k_f2h, 256, 256, 0, 0)(dx, dout, n);
    launched();
    const std::vector<uint16_t> o = from_dev(dout, (size_t)n * 5);
    int bad[5] = {0, 0, 0, 0, 0}, ref_disagree = 0, nan_in = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(x[i])) {
            nan_in++;
            for (int m = 0; m < 5; m++)
                if (!is_nan16(o[5 * i + m]) && bad[m]++ < 3)
                    CHECK(0, "__float2half_%s(NaN 0x%08x) = 0x%04x, not a NaN", m < 4 ? mode_names[m] : "(plain)",
                          bitsf(x[i]), o[5 * i + m]);
            continue;
        }
        for (int m = 0; m < 4; m++) {
            const uint16_t want = ref_f2h((double)x[i], m);
            if (f16c && emu_ref_f16c(x[i], m) != want && ref_disagree++ < 3)
                CHECK(0, "test reference: %s(%a) table 0x%04x, F16C 0x%04x", mode_names[m], x[i], want,
                      emu_ref_f16c(x[i], m));
            if (o[5 * i + m] != want && bad[m]++ < 3)
                CHECK(0, "__float2half_%s(%a = 0x%08x) = 0x%04x, want 0x%04x", mode_names[m], x[i], bitsf(x[i]),
                      o[5 * i + m], want);
        }
        if (o[5 * i + 4] != o[5 * i] && bad[4]++ < 3)
            CHECK(0, "__float2half(%a) = 0x%04x differs from __float2half_rn 0x%04x", x[i], o[5 * i + 4], o[5 * i]);
    }
    for (int m = 0; m < 5; m++)
        CHECK(bad[m] == 0, "__float2half_%s: %d of %d floats wrong", m < 4 ? mode_names[m] : "(plain)", bad[m], n);
    CHECK(ref_disagree == 0, "the table reference and F16C disagree on %d conversions", ref_disagree);
    CHECK(nan_in > 1000, "only %d NaN inputs in the sweep", nan_in);
    printf("float -> half: %d floats x 4 modes%s\n", n, f16c ? " (reference cross-checked with F16C)" : "");
    /* named edge cases, spelled out (also covered above) */
    struct edge {
        float x;
        uint16_t rn, rz, rd, ru;
    } const E[] = {
        {0.0f, 0x0000, 0x0000, 0x0000, 0x0000},
        {-0.0f, 0x8000, 0x8000, 0x8000, 0x8000},
        {1.0f + ldexpf(1, -11), 0x3c00, 0x3c00, 0x3c00, 0x3c01},       /* tie: to even (down) */
        {1.0f + ldexpf(3, -11), 0x3c02, 0x3c01, 0x3c01, 0x3c02},       /* tie: to even (up) */
        {-(1.0f + ldexpf(1, -11)), 0xbc00, 0xbc00, 0xbc01, 0xbc00},
        {ldexpf(1, -25), 0x0000, 0x0000, 0x0000, 0x0001},              /* half the smallest subnormal: tie to 0 */
        {ldexpf(3, -26), 0x0001, 0x0000, 0x0000, 0x0001},
        {-ldexpf(1, -25), 0x8000, 0x8000, 0x8001, 0x8000},
        {ldexpf(1023, -24), 0x03ff, 0x03ff, 0x03ff, 0x03ff},           /* largest subnormal */
        {ldexpf(2047, -25), 0x0400, 0x03ff, 0x03ff, 0x0400},           /* tie between it and 2^-14 */
        {65504.0f, 0x7bff, 0x7bff, 0x7bff, 0x7bff},
        {65519.99609375f, 0x7bff, 0x7bff, 0x7bff, 0x7c00},
        {65520.0f, 0x7c00, 0x7bff, 0x7bff, 0x7c00},                    /* overflow: inf to nearest, max toward 0 */
        {-65520.0f, 0xfc00, 0xfbff, 0xfc00, 0xfbff},
        {3.4028235e38f, 0x7c00, 0x7bff, 0x7bff, 0x7c00},
        {INFINITY, 0x7c00, 0x7c00, 0x7c00, 0x7c00},
        {-INFINITY, 0xfc00, 0xfc00, 0xfc00, 0xfc00},
        {ldexpf(1, -149), 0x0000, 0x0000, 0x0000, 0x0001},
        {-ldexpf(1, -149), 0x8000, 0x8000, 0x8001, 0x8000},
    };
    const int ne = sizeof E / sizeof E[0];
    std::vector<float> ex(ne);
    for (int i = 0; i < ne; i++) ex[i] = E[i].x;
    float *dex = to_dev(ex);
    HKV_LAUNCH(k_f2h, 1, 32, 0, 0)(dex, dout, ne);
    launched();
    const std::vector<uint16_t> eo = from_dev(dout, (size_t)ne * 5);
    for (int i = 0; i < ne; i++) {
        const uint16_t w[4] = {E[i].rn, E[i].rz, E[i].rd, E[i].ru};
        for (int m = 0; m < 4; m++) {
            CHECK(eo[5 * i + m] == w[m], "edge: __float2half_%s(%a) = 0x%04x, want 0x%04x", mode_names[m], E[i].x,
                  eo[5 * i + m], w[m]);
            CHECK(ref_f2h(E[i].x, m) == w[m], "edge: the test reference gives 0x%04x for %s(%a), want 0x%04x",
                  ref_f2h(E[i].x, m), mode_names[m], E[i].x, w[m]);
        }
    }
    cudaFree(dex);
    cudaFree(dx);
    cudaFree(dout);
}

static void test_h2f(bool f16c)
{
    std::vector<uint16_t> h(65536);
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    uint16_t *dh = to_dev(h), *drt;
    float *df;
    CUDA_OK(cudaMalloc((void **)&df, 65536 * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&drt, 65536 * 4 * sizeof(uint16_t)));
    HKV_LAUNCH(k_h2f, 64, 256, 0, 0)(dh, df, drt, 65536);
    launched();
    const std::vector<float> f = from_dev(df, 65536);
    const std::vector<uint16_t> rt = from_dev(drt, 65536 * 4);
    int bad = 0, bad_rt = 0, ref_disagree = 0;
    for (int i = 0; i < 65536; i++) {
        const double want = half_val((uint16_t)i);
        if (isnan(want)) {
            if (!isnan(f[i]) && bad++ < 3) CHECK(0, "__half2float(0x%04x) = %a, not a NaN", i, f[i]);
            for (int m = 0; m < 4; m++)
                if (!is_nan16(rt[4 * i + m]) && bad_rt++ < 3) CHECK(0, "NaN 0x%04x round trip gives 0x%04x", i, rt[4 * i + m]);
            continue;
        }
        if (((double)f[i] != want || signbit(f[i]) != signbit(want)) && bad++ < 3)
            CHECK(0, "__half2float(0x%04x) = %a, want %a", i, f[i], want);
        if (f16c && (double)emu_ref_f16c_to_float((uint16_t)i) != want) ref_disagree++;
        for (int m = 0; m < 4; m++)
            if (rt[4 * i + m] != i && bad_rt++ < 3)
                CHECK(0, "half 0x%04x -> float -> half (%s) gives 0x%04x", i, mode_names[m], rt[4 * i + m]);
    }
    CHECK(bad == 0, "__half2float wrong for %d of 65536 halves", bad);
    CHECK(bad_rt == 0, "%d round trips half -> float -> half changed the value", bad_rt);
    CHECK(ref_disagree == 0, "test reference: F16C decodes %d halves differently", ref_disagree);
    cudaFree(dh);
    cudaFree(df);
    cudaFree(drt);
}

static void test_bf16(const std::vector<float> &x)
{
    const int n = (int)x.size();
    float *dx = to_dev(x);
    uint16_t *dout;
    CUDA_OK(cudaMalloc((void **)&dout, (size_t)n * 3 * sizeof(uint16_t)));
    HKV_LAUNCH(k_f2bf, 256, 256, 0, 0)(dx, dout, n);
    launched();
    std::vector<uint16_t> o = from_dev(dout, (size_t)n * 3);
    int bad[3] = {0, 0, 0};
    for (int i = 0; i < n; i++) {
        if (isnan(x[i])) {
            for (int m = 0; m < 3; m++)
                if (!is_nan_bf(o[3 * i + m]) && bad[m]++ < 3)
                    CHECK(0, "__float2bfloat16 (%d) of NaN 0x%08x = 0x%04x, not a NaN", m, bitsf(x[i]), o[3 * i + m]);
            continue;
        }
        const uint16_t wrn = ref_f2bf(x[i], RN), wrz = ref_f2bf(x[i], RZ);
        if (o[3 * i] != wrn && bad[0]++ < 3) CHECK(0, "__float2bfloat16_rn(%a) = 0x%04x, want 0x%04x", x[i], o[3 * i], wrn);
        if (o[3 * i + 1] != wrz && bad[1]++ < 3)
            CHECK(0, "__float2bfloat16_rz(%a) = 0x%04x, want 0x%04x", x[i], o[3 * i + 1], wrz);
        if (o[3 * i + 2] != wrn && bad[2]++ < 3)
            CHECK(0, "__float2bfloat16(%a) = 0x%04x, want 0x%04x", x[i], o[3 * i + 2], wrn);
    }
    CHECK(bad[0] == 0 && bad[1] == 0 && bad[2] == 0, "float -> bf16: %d (rn) %d (rz) %d (plain) of %d wrong", bad[0],
          bad[1], bad[2], n);
    /* named cases: a tie to even each way, overflow, the top of the range */
    CHECK(ref_f2bf(fbits(0x3f808000u), RN) == 0x3f80 && ref_f2bf(fbits(0x3f818000u), RN) == 0x3f82 &&
              ref_f2bf(3.4028235e38f, RN) == 0x7f80 && ref_f2bf(3.4028235e38f, RZ) == 0x7f7f,
          "test reference: bf16 named cases");
    cudaFree(dx);
    cudaFree(dout);
    /* bf16 -> float for every code */
    std::vector<uint16_t> b(65536);
    for (int i = 0; i < 65536; i++) b[i] = (uint16_t)i;
    uint16_t *db = to_dev(b);
    float *df;
    CUDA_OK(cudaMalloc((void **)&df, 65536 * sizeof(float)));
    HKV_LAUNCH(k_bf2f, 64, 256, 0, 0)(db, df, 65536);
    launched();
    const std::vector<float> f = from_dev(df, 65536);
    int bd = 0;
    for (int i = 0; i < 65536; i++) {
        const double want = bf16_val((uint16_t)i);
        const bool ok = isnan(want) ? isnan(f[i]) : ((double)f[i] == want && signbit(f[i]) == signbit(want));
        if (!ok && bd++ < 3) CHECK(0, "__bfloat162float(0x%04x) = %a, want %a", i, f[i], want);
    }
    CHECK(bd == 0, "__bfloat162float wrong for %d codes", bd);
    cudaFree(db);
    cudaFree(df);
}

static uint16_t rnd_finite_half(void)
{
    uint16_t h;
    do h = (uint16_t)rnd(); while (!finite16(h));
    return h;
}
static uint16_t make_half(int neg, int A, int ea)   /* A * 2^ea, A in [1024, 2047], normal */
{
    return ref_f2h(ldexp((neg ? -1.0 : 1.0) * A, ea), RN);
}

static void test_arith(void)
{
    std::vector<uint16_t> a, b, c;
    /* random finite operands */
    for (int i = 0; i < 300000; i++) a.push_back(rnd_finite_half()), b.push_back(rnd_finite_half()), c.push_back(rnd_finite_half());
    /* operands of similar size (cancellation, no overflow) */
    for (int i = 0; i < 100000; i++) {
        const uint16_t x = rnd_finite_half();
        a.push_back(x), b.push_back((uint16_t)((x ^ (rnd() & 0x8000)) + (int)(rnd() % 64) - 32) & 0xffff);
        if (!finite16(b.back())) b.back() = x;
        c.push_back(rnd_finite_half());
    }
    /* sums exactly at a midpoint and one representable step either side:
     * x + y with y = +-(U/2 +- 2^-24 steps), U the quantum at x */
    int ties_add = 0;
    for (int i = 0; i < 60000; i++) {
        const uint16_t x = (uint16_t)(rnd() % 0x7800) | (uint16_t)(rnd() & 0x8000);
        const int e = (x >> 10) & 31;
        const double U = ldexp(1.0, (e ? e : 1) - 25);
        const double dy = (rnd() & 1 ? 1 : -1) * U / 2 * (1.0 + ldexp((double)((int)(rnd() % 3) - 1), -10));
        const uint16_t y = ref_f2h(dy, RN);
        a.push_back(x), b.push_back(y), c.push_back(rnd_finite_half());
    }
    /* __hfma cases where fmaf(a, b, c) rounded to half again differs from one
     * rounding: c + a*b = a midpoint of c's binade + a tiny part that the float
     * result drops. a*b = A*B*2^(ea+eb) with A*B = 2^21 + d, |d| < 256, d != 0 */
    const size_t fma_from = a.size();
    int found = 0, tried = 0;
    while (found < 3000 && tried < 200000) {
        tried++;
        const int A = 1024 + (int)(rnd() % 1024);
        const int B = (int)((2097152.0 / A) + 0.5);
        if (B < 1024 || B > 2047) continue;
        const int64_t d = (int64_t)A * B - 2097152;
        if (d == 0 || d >= 256 || d <= -256) continue;
        const uint16_t ch = (uint16_t)(0x3c00 + rnd() % (0x6800 - 0x3c00));   /* c in [1, 2048) */
        const int ce = (ch >> 10) & 31;
        const int ulog = ce - 25;                   /* c's quantum 2^ulog */
        const int s = ulog - 22;                    /* A*B*2^s ~ U/2 */
        const int ea = s / 2, eb = s - ea;
        const uint16_t ah = make_half((int)(rnd() & 1), A, ea), bh = make_half(0, B, eb);
        const uint16_t chs = (uint16_t)(ch | (rnd() & 0x8000));
        const float ff = fmaf((float)half_val(ah), (float)half_val(bh), (float)half_val(chs));
        const uint16_t twice = ref_f2h(ff, RN), once = ref_hfma(ah, bh, chs);
        if (twice != once) {
            a.push_back(ah), b.push_back(bh), c.push_back(chs);
            found++;
        }
    }
    CHECK(found >= 1000, "the search found only %d fma double-rounding cases in %d tries", found, tried);
    printf("__hfma: %d cases where rounding fmaf's float result again differs from one rounding (%d tries)\n", found,
           tried);
    /* one worked example, spelled out: 145*2^-12 * 113*2^-13 = 2^-11 + 2^-25; + 1.0 */
    {
        const uint16_t x = ref_f2h(ldexp(145, -12), RN), y = ref_f2h(ldexp(113, -13), RN), z = 0x3c00;
        CHECK(ref_hfma(x, y, z) == 0x3c01 && ref_f2h(fmaf((float)half_val(x), (float)half_val(y), 1.0f), RN) == 0x3c00,
              "test reference: the worked double-rounding example");
        a.push_back(x), b.push_back(y), c.push_back(z);
    }
    const int n = (int)a.size();
    uint16_t *da = to_dev(a), *db = to_dev(b), *dc = to_dev(c), *dout;
    CUDA_OK(cudaMalloc((void **)&dout, (size_t)n * 4 * sizeof(uint16_t)));
    HKV_LAUNCH(k_arith, 256, 256, 0, 0)(da, db, dc, dout, n);
    launched();
    const std::vector<uint16_t> o = from_dev(dout, (size_t)n * 4);
    int bad[4] = {0, 0, 0, 0}, bad_fma_dr = 0, ties_mul = 0;
    static const char *names[4] = {"__hadd", "__hsub", "__hmul", "__hfma"};
    for (int i = 0; i < n; i++) {
        const uint16_t w[4] = {ref_hadd(a[i], b[i]), ref_hadd(a[i], (uint16_t)(b[i] ^ 0x8000)), ref_hmul(a[i], b[i]),
                               ref_hfma(a[i], b[i], c[i])};
        {
            /* count exact ties in the products and sums (coverage) */
            const i128 p = (i128)half_units(a[i]) * half_units(b[i]);
            const double pd = (double)p * ldexp(1.0, -48);
            const uint16_t lo = ref_f2h(pd, RZ);
            const double next = half_val((uint16_t)(lo + 1));
            if (p != 0 && finite16((uint16_t)(lo + 1)) && pd == (half_val(lo) + next) / 2 && fabs(pd) < 65504) ties_mul++;
            const double s = half_val(a[i]) + half_val(b[i]);
            const uint16_t slo = ref_f2h(s, RZ);
            if (finite16((uint16_t)(slo + 1)) && s != half_val(slo) && s == (half_val(slo) + half_val((uint16_t)(slo + 1))) / 2)
                ties_add++;
        }
        for (int k = 0; k < 4; k++)
            if (o[4 * i + k] != w[k]) {
                if ((size_t)i >= fma_from && k == 3) bad_fma_dr++;
                if (bad[k]++ < 3)
                    CHECK(0, "%s(0x%04x, 0x%04x%s) = 0x%04x, want 0x%04x", names[k], a[i], b[i],
                          k == 3 ? ", c" : "", o[4 * i + k], w[k]);
            }
    }
    for (int k = 0; k < 4; k++) CHECK(bad[k] == 0, "%s: %d of %d wrong", names[k], bad[k], n);
    CHECK(bad_fma_dr == 0, "__hfma rounded twice in %d of the %d searched cases", bad_fma_dr, found);
    CHECK(ties_add > 1000 && ties_mul > 20, "coverage: only %d exact sum ties and %d product ties", ties_add, ties_mul);
    printf("half arithmetic: %d operand sets, %d exact sum ties, %d exact product ties\n", n, ties_add, ties_mul);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    cudaFree(dout);

    /* inf / NaN / overflow, by IEEE 754 */
    struct sp {
        uint16_t a, b, c;
        int op;   /* 0 add, 1 sub, 2 mul, 3 fma */
        uint16_t want;   /* 0xffff: a NaN */
    } const S[] = {
        {0x7c00, 0xfc00, 0, 0, 0xffff}, {0x7c00, 0x3c00, 0, 0, 0x7c00}, {0x7e00, 0x3c00, 0, 0, 0xffff},
        {0x7c00, 0x7c00, 0, 1, 0xffff}, {0x7c00, 0x0000, 0, 2, 0xffff}, {0xfc00, 0x4000, 0, 2, 0xfc00},
        {0x7c00, 0x0000, 0x3c00, 3, 0xffff}, {0x3c00, 0x3c00, 0xfc00, 3, 0xfc00}, {0x7c00, 0x3c00, 0xfc00, 3, 0xffff},
        {0x7bff, 0x7bff, 0, 0, 0x7c00}, {0x7bff, 0x4c00, 0, 0, 0x7c00} /* 65504 + 16 = 65520: tie -> inf */,
        {0x7bff, 0x4800, 0, 0, 0x7bff} /* 65504 + 8 */, {0x7bff, 0x4000, 0, 2, 0x7c00},
        {0x8000, 0x8000, 0, 0, 0x8000} /* -0 + -0 */, {0x3c00, 0xbc00, 0, 0, 0x0000} /* 1 + -1 = +0 */,
        {0x8000, 0x3c00, 0, 2, 0x8000} /* -0 * 1 */, {0x0001, 0x0001, 0x8000, 3, 0x0000} /* 2^-48 - 0 -> +0 */,
        {0x8001, 0x0001, 0x8000, 3, 0x8000} /* -2^-48 + -0 -> -0 (underflow keeps the sign) */,
    };
    const int ns = sizeof S / sizeof S[0];
    std::vector<uint16_t> sa(ns), sb(ns), sc(ns);
    for (int i = 0; i < ns; i++) sa[i] = S[i].a, sb[i] = S[i].b, sc[i] = S[i].c;
    da = to_dev(sa), db = to_dev(sb), dc = to_dev(sc);
    CUDA_OK(cudaMalloc((void **)&dout, (size_t)ns * 4 * sizeof(uint16_t)));
    HKV_LAUNCH(k_arith, 1, 32, 0, 0)(da, db, dc, dout, ns);
    launched();
    const std::vector<uint16_t> so = from_dev(dout, (size_t)ns * 4);
    for (int i = 0; i < ns; i++) {
        const uint16_t got = so[4 * i + S[i].op];
        const bool ok = S[i].want == 0xffff ? is_nan16(got) : got == S[i].want;
        CHECK(ok, "special case %d: %s(0x%04x, 0x%04x, 0x%04x) = 0x%04x, want %s0x%04x", i, names[S[i].op], S[i].a,
              S[i].b, S[i].c, got, S[i].want == 0xffff ? "a NaN, not " : "", S[i].want);
    }
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    cudaFree(dout);
}

static void test_minmax_half2_double(void)
{
    /* __hmax / __hmin (cuda_fp16.h) */
    struct mm {
        uint16_t a, b, max, min;   /* canonical NaN is 0x7fff */
    } const M[] = {
        {0x3c00, 0x4000, 0x4000, 0x3c00}, {0xc000, 0x3c00, 0x3c00, 0xc000},
        {0x7c00, 0xfc00, 0x7c00, 0xfc00}, {0x7e00, 0x4200, 0x4200, 0x4200},
        {0x4200, 0x7e00, 0x4200, 0x4200}, {0xfe01, 0xc200, 0xc200, 0xc200},
        /* +0.0 > -0.0 */
        {0x8000, 0x0000, 0x0000, 0x8000},
        {0x0000, 0x8000, 0x0000, 0x8000},
        /* both NaN: canonical NaN */
        {0x7e00, 0x7d00, 0x7fff, 0x7fff},
    };
    const int nm = sizeof M / sizeof M[0];
    std::vector<uint16_t> a(nm), b(nm);
    for (int i = 0; i < nm; i++) a[i] = M[i].a, b[i] = M[i].b;
    uint16_t *da = to_dev(a), *db = to_dev(b), *dout;
    CUDA_OK(cudaMalloc((void **)&dout, nm * 2 * sizeof(uint16_t)));
    HKV_LAUNCH(k_minmax, 1, 32, 0, 0)(da, db, dout, nm);
    launched();
    const std::vector<uint16_t> o = from_dev(dout, (size_t)nm * 2);
    for (int i = 0; i < nm; i++) {
        CHECK(o[2 * i] == M[i].max, "__hmax(0x%04x, 0x%04x) = 0x%04x, want 0x%04x", M[i].a, M[i].b,
              o[2 * i], M[i].max);
        CHECK(o[2 * i + 1] == M[i].min, "__hmin(0x%04x, 0x%04x) = 0x%04x, want 0x%04x", M[i].a, M[i].b,
              o[2 * i + 1], M[i].min);
    }
    cudaFree(da);
    cudaFree(db);
    cudaFree(dout);

    /* __half2: lanes are independent halves, low = first */
    const std::vector<float> x = {1.5f, -2.25f, 0.5f};
    float *dx = to_dev(x), *df;
    CUDA_OK(cudaMalloc((void **)&df, 14 * sizeof(float)));
    HKV_LAUNCH(k_half2, 1, 1, 0, 0)(dx, df);
    launched();
    const std::vector<float> f = from_dev(df, 14);
    const float want[14] = {1.5f, -2.25f, 0.5f, 0.5f, 2.0f, -1.75f, 0.75f, -1.125f, 2.25f, -3.375f, 1.5f, -2.25f, 1.5f, -2.25f};
    for (int i = 0; i < 14; i++) CHECK(f[i] == want[i], "__half2 check %d: %g, want %g", i, f[i], want[i]);
    cudaFree(dx);
    cudaFree(df);

    /* __half(double): __double2half, one rounding from double (no detour
     * through float, which would round twice) */
    std::vector<double> d = {1.0 + ldexp(1, -11) + ldexp(1, -40), 1.0 + ldexp(1, -11) - ldexp(1, -40),
                             ldexp(1, -25) + ldexp(1, -60), 65520.0 - ldexp(1, -30), 0.1, -3.0 + ldexp(1, -12) + ldexp(1, -45)};
    for (int i = 0; i < 2000; i++) {   /* midpoints of random halves, nudged by less than a float can hold */
        const uint16_t h = (uint16_t)(rnd() % 0x7bff);
        const double m = (half_val(h) + half_val((uint16_t)(h + 1))) / 2;
        d.push_back(m * (1.0 + ((rnd() & 1) ? 1 : -1) * ldexp(1.0, -40)));
    }
    const int nd = (int)d.size();
    double *dd = to_dev(d);
    uint16_t *dh;
    CUDA_OK(cudaMalloc((void **)&dh, nd * sizeof(uint16_t)));
    HKV_LAUNCH(k_from_double, 8, 256, 0, 0)(dd, dh, nd);
    launched();
    const std::vector<uint16_t> h = from_dev(dh, nd);
    int bad = 0, first = -1;
    for (int i = 0; i < nd; i++)
        if (h[i] != ref_f2h(d[i], RN) && !bad++) first = i;
    CHECK(bad == 0,
                        "__half(double): %d of %d wrong, e.g. __half(%.20g) = 0x%04x, want 0x%04x (gpu/emu/emu_half.h, "
                        "__half::__half(double) goes through float)", bad, nd, first < 0 ? 0.0 : d[first],
                        first < 0 ? 0 : h[first], first < 0 ? 0 : ref_f2h(d[first], RN));
    cudaFree(dd);
    cudaFree(dh);
}

int main(void)
{
    for (int c = 0; c <= 0x7c00; c++) hv.push_back(half_val((uint16_t)c));
    for (int c = 0; c <= 0x7f80; c++) bv.push_back(bf16_val((uint16_t)c));
    const bool f16c = emu_ref_have_f16c() != 0;
    if (!f16c) printf("no F16C on this CPU: the table reference alone\n");
    const std::vector<float> x = test_floats();
    test_f2h(x, f16c);
    test_h2f(f16c);
    test_bf16(x);
    test_arith();
    test_minmax_half2_double();
    return test_report("emu_half");
}
