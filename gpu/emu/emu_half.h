/* fp16 and bf16 for the CUDA emulator (cuda_fp16.h, cuda_bf16.h subset).
 * Conversions are done on the bits, so every rounding mode rounds exactly as
 * the hardware's cvt.rn/rz/rd/ru.f16.f32 does (PTX ISA, "cvt"), subnormals,
 * infinities and NaN included; half arithmetic is computed exactly in double
 * and rounded once to nearest even, as a GPU's single-rounding f16 ops. */
#ifndef HKV_EMU_HALF_H
#define HKV_EMU_HALF_H

#include <stdint.h>
#include <math.h>
#include <string.h>

namespace hkv_emu {

enum round_mode { RN, RZ, RD, RU };

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* float -> IEEE binary16 bits under a rounding mode. */
static inline uint16_t f32_to_f16(float f, round_mode rm)
{
    const uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000u;
    const uint32_t ax = u & 0x7fffffffu;
    if (ax > 0x7f800000u) return 0x7fffu;   /* NaN: the canonical NaN, as cvt.f16.f32 gives */
    if (ax == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
    const bool neg = sign != 0;
    /* the exact magnitude as m * 2^(e - 150) with a 24-bit significand */
    int e = (int)(ax >> 23);
    uint32_t m = ax & 0x7fffffu;
    if (e) m |= 0x800000u; else e = 1;
    /* target: half exponent eh = e - 127 + 15; significand bits kept: 11
     * for normals; shift so that the result is m >> shift */
    int eh = e - 112;
    int shift = 13;
    if (eh < 1) { shift += 1 - eh; eh = 1; }
    uint32_t q, rem, half_ulp;
    if (shift > 31) { q = 0; rem = m; half_ulp = 0; }
    else { q = m >> shift; rem = m & ((1u << shift) - 1); half_ulp = 1u << (shift - 1); }
    bool up = false;
    if (rem) {
        switch (rm) {
        case RN: up = shift > 31 ? false : (rem > half_ulp || (rem == half_ulp && (q & 1))); break;
        case RZ: up = false; break;
        case RD: up = neg; break;
        case RU: up = !neg; break;
        }
    }
    q += up;
    /* q is the significand with the implicit bit at 10 (normal) or not (subnormal) */
    uint32_t h;
    if (q >= 0x800u) { q >>= 1; eh++; }   /* rounding carried into a new binade */
    if (q < 0x400u) h = q;                /* subnormal (eh was clamped to 1) */
    else h = ((uint32_t)eh << 10) | (q & 0x3ffu);
    if (eh >= 31 || h >= 0x7c00u) {
        /* overflow: RN/away-from-zero directions give inf, toward zero the max */
        bool to_inf = rm == RN || (rm == RU && !neg) || (rm == RD && neg);
        h = to_inf ? 0x7c00u : 0x7bffu;
    }
    return (uint16_t)(sign | h);
}

static inline float f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0));
    if (e == 0) {
        if (!m) return bits_f32(sign);
        float v = (float)m * (1.0f / 16777216.0f);   /* m * 2^-24, exact */
        return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

/* bf16: the top half of a float, rounded. */
static inline uint16_t f32_to_bf16(float f, round_mode rm)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;   /* the canonical NaN */
    const uint32_t rem = u & 0xffffu, neg = u >> 31;
    uint32_t q = u >> 16;
    bool up = false;
    if (rem) {
        switch (rm) {
        case RN: up = rem > 0x8000u || (rem == 0x8000u && (q & 1)); break;
        case RZ: up = false; break;
        case RD: up = neg; break;
        case RU: up = !neg; break;
        }
    }
    return (uint16_t)(q + up);
}
static inline float bf16_to_f32(uint16_t b) { return bits_f32((uint32_t)b << 16); }

/* double -> half with one rounding: first to float rounding to odd (toward
 * zero, then the last bit set when inexact), which keeps enough information
 * for the second rounding to be correct since float has 13 more bits. */
static inline uint16_t f64_to_f16_rn(double d)
{
    float f = (float)d;
    if ((double)f != d) {
        if (fabs((double)f) > fabs(d)) f = nextafterf(f, 0.0f);
        f = bits_f32(f32_bits(f) | 1u);
    }
    return f32_to_f16(f, RN);
}

}  // namespace hkv_emu

struct __half {
    unsigned short __x;
    __half() = default;
    __half(float f) : __x(hkv_emu::f32_to_f16(f, hkv_emu::RN)) {}
    __half(double f) : __x(hkv_emu::f64_to_f16_rn(f)) {}   /* one rounding, as __double2half */
    operator float() const { return hkv_emu::f16_to_f32(__x); }
};
struct alignas(4) __half2 {
    __half x, y;
};
typedef __half half;
typedef __half2 half2;

struct __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(hkv_emu::f32_to_bf16(f, hkv_emu::RN)) {}
    operator float() const { return hkv_emu::bf16_to_f32(__x); }
};
struct alignas(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

static inline __half hkv_emu_mkhalf(uint16_t b) { __half h; h.__x = b; return h; }
static inline __nv_bfloat16 hkv_emu_mkbf16(uint16_t b) { __nv_bfloat16 h; h.__x = b; return h; }

static inline float __half2float(__half h) { return hkv_emu::f16_to_f32(h.__x); }
static inline __half __float2half(float f) { return hkv_emu_mkhalf(hkv_emu::f32_to_f16(f, hkv_emu::RN)); }
static inline __half __float2half_rn(float f) { return __float2half(f); }
static inline __half __double2half(double d) { return hkv_emu_mkhalf(hkv_emu::f64_to_f16_rn(d)); }
static inline __half __float2half_rz(float f) { return hkv_emu_mkhalf(hkv_emu::f32_to_f16(f, hkv_emu::RZ)); }
static inline __half __float2half_rd(float f) { return hkv_emu_mkhalf(hkv_emu::f32_to_f16(f, hkv_emu::RD)); }
static inline __half __float2half_ru(float f) { return hkv_emu_mkhalf(hkv_emu::f32_to_f16(f, hkv_emu::RU)); }
static inline __half __ushort_as_half(unsigned short b) { return hkv_emu_mkhalf(b); }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline __half __short_as_half(short b) { return hkv_emu_mkhalf((uint16_t)b); }
static inline short __half_as_short(__half h) { return (short)h.__x; }

static inline float __low2float(__half2 h) { return __half2float(h.x); }
static inline float __high2float(__half2 h) { return __half2float(h.y); }
static inline __half __low2half(__half2 h) { return h.x; }
static inline __half __high2half(__half2 h) { return h.y; }
struct float2;
static inline __half2 __halves2half2(__half a, __half b) { __half2 r; r.x = a; r.y = b; return r; }
static inline __half2 __floats2half2_rn(float a, float b)
{
    return __halves2half2(__float2half_rn(a), __float2half_rn(b));
}
static inline __half2 __float2half2_rn(float a) { return __floats2half2_rn(a, a); }

/* Half arithmetic: exact in double, one rounding (PTX add/mul/fma.rn.f16). */
static inline __half hkv_emu_h(double d) { return hkv_emu_mkhalf(hkv_emu::f64_to_f16_rn(d)); }
static inline __half __hadd(__half a, __half b) { return hkv_emu_h((double)__half2float(a) + __half2float(b)); }
static inline __half __hsub(__half a, __half b) { return hkv_emu_h((double)__half2float(a) - __half2float(b)); }
static inline __half __hmul(__half a, __half b) { return hkv_emu_h((double)__half2float(a) * __half2float(b)); }
static inline __half __hfma(__half a, __half b, __half c)
{
    return hkv_emu_h((double)__half2float(a) * __half2float(b) + __half2float(c));
}
static inline __half __hneg(__half a) { return hkv_emu_mkhalf((uint16_t)(a.__x ^ 0x8000u)); }
static inline bool __hisnan(__half a) { return (a.__x & 0x7fffu) > 0x7c00u; }
/* cuda_fp16.h: a NaN input gives the other; two NaNs the canonical NaN;
 * +0 is greater than -0. */
static inline __half __hmax(__half a, __half b)
{
    if (__hisnan(a) && __hisnan(b)) return hkv_emu_mkhalf(0x7fffu);
    if (__hisnan(a)) return b;
    if (__hisnan(b)) return a;
    const float x = __half2float(a), y = __half2float(b);
    if (x == y) return (a.__x & 0x8000u) ? b : a;
    return x > y ? a : b;
}
static inline __half __hmin(__half a, __half b)
{
    if (__hisnan(a) && __hisnan(b)) return hkv_emu_mkhalf(0x7fffu);
    if (__hisnan(a)) return b;
    if (__hisnan(b)) return a;
    const float x = __half2float(a), y = __half2float(b);
    if (x == y) return (a.__x & 0x8000u) ? a : b;
    return x < y ? a : b;
}
static inline bool __hlt(__half a, __half b) { return __half2float(a) < __half2float(b); }
static inline bool __hgt(__half a, __half b) { return __half2float(a) > __half2float(b); }
static inline bool __heq(__half a, __half b) { return __half2float(a) == __half2float(b); }
static inline __half2 __hadd2(__half2 a, __half2 b) { return __halves2half2(__hadd(a.x, b.x), __hadd(a.y, b.y)); }
static inline __half2 __hmul2(__half2 a, __half2 b) { return __halves2half2(__hmul(a.x, b.x), __hmul(a.y, b.y)); }
static inline __half2 __hfma2(__half2 a, __half2 b, __half2 c)
{
    return __halves2half2(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y));
}

static inline float __bfloat162float(__nv_bfloat16 b) { return hkv_emu::bf16_to_f32(b.__x); }
static inline __nv_bfloat16 __float2bfloat16(float f) { return hkv_emu_mkbf16(hkv_emu::f32_to_bf16(f, hkv_emu::RN)); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
static inline __nv_bfloat16 __float2bfloat16_rz(float f) { return hkv_emu_mkbf16(hkv_emu::f32_to_bf16(f, hkv_emu::RZ)); }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) { return hkv_emu_mkbf16(b); }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }

#endif
