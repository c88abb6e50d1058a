/* Shared helpers for the cpu kernel tests: deterministic RNG, fp16 data,
 * NaN poisoning with guard elements after each output, failure counting,
 * and the loop over every ISA level this machine supports. */
#ifndef HKV_TEST_CPU_UTIL_H
#define HKV_TEST_CPU_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

typedef struct test_rng { uint64_t s; } test_rng;

static inline uint64_t rng_next(test_rng *r)
{
    /* splitmix64: good enough, and the same stream on every machine */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* uniform in [lo, hi) */
static inline float rng_uniform(test_rng *r, float lo, float hi)
{
    return lo + (hi - lo) * (float)((rng_next(r) >> 40) * (1.0 / 16777216.0));
}
/* uniform in [lo, hi), never exactly 0 (zeros hide missing terms) */
static inline float rng_nonzero(test_rng *r, float lo, float hi)
{
    float x;
    do x = rng_uniform(r, lo, hi); while (x == 0.0f);
    return x;
}

/* Independent fp16 -> double (exact), not the library's converter. */
/* 2^k for |k| < 1023, built from its bits: the same as ldexp(1, k), without
 * a libm call (this runs in every reference's inner loop, and under the
 * sanitizers libm's scalbn was a fifth of gpu_attn's time). */
static inline double pow2_exact(int k)
{
    uint64_t u = (uint64_t)(1023 + k) << 52;
    double v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static inline double half_to_double(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) v = (double)m * pow2_exact(-24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = (double)(1024 + m) * pow2_exact(e - 25);
    return (h & 0x8000) ? -v : v;
}

/* The nearest fp16 to a value in [-2, 2], ties to even, by search over the
 * monotonic positive codes (the reference for f32 -> f16 tests). */
static inline uint16_t double_to_half_ref(double x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs(x);
    if (isnan(x)) return 0x7e00;
    int lo = 0, hi = 0x7c00;   /* codes 0..0x7c00 (inf) are increasing */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (half_to_double((uint16_t)mid) <= a) lo = mid;
        else hi = mid;
    }
    double dl = a - half_to_double((uint16_t)lo);
    double dh = hi == 0x7c00 ? (a >= 65520.0 ? 0.0 : INFINITY) : half_to_double((uint16_t)hi) - a;
    int pick = dl < dh ? lo : dh < dl ? hi : ((lo & 1) ? hi : lo);
    return sign | (uint16_t)pick;
}

static inline uint16_t rng_half(test_rng *r, float lo, float hi)
{
    uint16_t h;
    do h = double_to_half_ref(rng_uniform(r, lo, hi)); while ((h & 0x7fff) == 0);
    return h;
}

/* A float buffer of n elements followed by HKV_TEST_GUARD guard elements. */
#define HKV_TEST_GUARD 16
static inline float *alloc_poisoned(size_t n)
{
    float *p = malloc((n + HKV_TEST_GUARD) * sizeof *p);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    for (size_t i = 0; i < n + HKV_TEST_GUARD; i++) p[i] = NAN;
    return p;
}
static inline void poison(float *p, size_t n)
{
    for (size_t i = 0; i < n + HKV_TEST_GUARD; i++) p[i] = NAN;
}
/* 1 if the guard elements after n were left untouched (still NaN). */
static inline int guard_intact(const float *p, size_t n)
{
    for (size_t i = n; i < n + HKV_TEST_GUARD; i++)
        if (!isnan(p[i])) return 0;
    return 1;
}

static int test_failures __attribute__((unused));
static int test_checks __attribute__((unused));
#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        test_checks++;                                                           \
        if (!(cond)) {                                                           \
            test_failures++;                                                     \
            if (test_failures <= 30) {                                           \
                fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);            \
                fprintf(stderr, __VA_ARGS__);                                    \
                fputc('\n', stderr);                                             \
            }                                                                    \
        }                                                                        \
    } while (0)

static inline int test_report(const char *name)
{
    printf("%s: %d checks, %d failures\n", name, test_checks, test_failures);
    return test_failures ? 1 : 0;
}

/* for (isa = scalar .. best): fills t for each level; the level is forced,
 * and the table must say so. */
#define FOR_EACH_ISA(t, isa)                                                     \
    for (int isa = HKV_ISA_SCALAR, isa##_best = test_best_isa(); isa <= isa##_best; isa++) \
        if (hkv_cpu_kernels_init(&(t), isa) != isa) {                            \
            CHECK(0, "init(%s) gave another level", hkv_isa_name(isa));          \
        } else

static inline int test_best_isa(void)
{
    hkv_isa_info info;
    hkv_isa_detect(&info);
    return info.best;
}

#endif
