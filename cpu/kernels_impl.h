/* Internal to cpu/: the per-ISA entry points that hkv_cpu_kernels_init puts
 * into the table, shared limits, and exact scalar fp16 conversion.
 * Nothing here is part of the public interface. */
#ifndef HKV_CPU_KERNELS_IMPL_H
#define HKV_CPU_KERNELS_IMPL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* Vector attention handles d % 16 == 0 up to this; other d go to scalar. */
#define HKV_ATTN_MAX_D 256

/* Declares one ISA's set of kernels; the names end in the ISA suffix. */
#define HKV_DECLARE_ISA_KERNELS(sfx)                                                       \
    void hkv_gemv_##sfx(const hkv_wmat *w, const float *x, int n, float *y, int64_t ldy,    \
                        int64_t r0, int64_t r1);                                            \
    void hkv_gemv_fixed_##sfx(const hkv_wmat *w, const float *x, int n, float *y,           \
                              int64_t ldy, int64_t r0, int64_t r1);                         \
    void hkv_dequant_rows_##sfx(const hkv_wmat *w, int64_t r0, int64_t r1, float *dst);     \
    void hkv_attn_dense_##sfx(const float *q, int g, int d, const uint16_t *k,              \
                              const uint16_t *v, int64_t ld, int64_t n, float scale,        \
                              float *out, float *lse);                                      \
    void hkv_attn_sparse_##sfx(const float *q, int g, int d, const uint16_t *k,             \
                               const uint16_t *v, int64_t ld, const int32_t *idx,           \
                               int64_t n, float scale, float *out, float *lse);             \
    void hkv_attn_causal_##sfx(const float *q, int64_t ldq, int nq, int g, int d,           \
                               int64_t p0, const uint16_t *k, const uint16_t *v,            \
                               int64_t ld, float scale, float *out, int64_t ldo,            \
                               float *lse);                                                 \
    void hkv_score_max_##sfx(const float *q, int g, int d, const uint16_t *k, int64_t ld,   \
                             const int32_t *idx, int64_t n, float *s);                      \
    void hkv_score_max_i8_##sfx(const float *q, int g, int d, const int8_t *k, int64_t ld,  \
                                const float *scale, const int32_t *idx, int64_t n,          \
                                float *s);                                                  \
    void hkv_score_max_i4_##sfx(const float *q, int g, int d, const uint8_t *k, int64_t ld, \
                                const float *scale, const int32_t *idx, int64_t n,          \
                                float *s);                                                  \
    void hkv_f16_to_f32_##sfx(const uint16_t *src, float *dst, int64_t n);                  \
    void hkv_f32_to_f16_##sfx(const float *src, uint16_t *dst, int64_t n);                  \
    void hkv_q8_to_f16_##sfx(const int8_t *c, const float *scale, int64_t n, uint16_t *dst); \
    void hkv_attn_q8_##sfx(const float *q, int g, int d, const int8_t *k, const float *ks,   \
                           const int8_t *v, const float *vs, int64_t ld, const int32_t *idx, \
                           int64_t n, float scale, float *out, float *lse);                 \
    void hkv_exp_##sfx(const float *x, float *y, int64_t n);                                \
    double hkv_stream_read_##sfx(const void *buf, size_t bytes);

HKV_DECLARE_ISA_KERNELS(scalar)
#if defined(__x86_64__)
HKV_DECLARE_ISA_KERNELS(avx2)
HKV_DECLARE_ISA_KERNELS(avx512)
#endif

/* The int8-activation kernels (precision FAST), AVX512-VNNI build
 * (qgemm_avx512.c); in the table only where hkv_isa_detect saw VNNI. */
void hkv_qgemm_avx512vnni(const hkv_wmat *w, const hkv_qact *a, int n, float *y, int64_t ldy,
                          int64_t r0, int64_t r1);
/* The same products at 256 bits (qgemm_avx2.inc), bitwise the AVX-512
 * kernel's results: vpmaddubsw (qgemm_avx2.c, with the quantiser every FAST
 * table uses, AVX-512 and AMX included)
 * and AVX-VNNI's vpdpbusd (qgemm_avxvnni.c, built where the compiler has
 * it: HKV_HAVE_AVXVNNI; in the table only where hkv_isa_detect saw it). */
void hkv_quant_act_avx2(const float *x, int64_t i0, int64_t i1, const hkv_qact *a);
void hkv_qgemm_avx2(const hkv_wmat *w, const hkv_qact *a, int n, float *y, int64_t ldy,
                    int64_t r0, int64_t r1);
void hkv_qgemm_avxvnni(const hkv_wmat *w, const hkv_qact *a, int n, float *y, int64_t ldy,
                       int64_t r0, int64_t r1);
/* The same products, 16-token tiles on AMX (qgemm_amx.c; built where the
 * compiler has AMX, HKV_HAVE_AMX): bitwise the VNNI kernel's results. In the
 * table only where hkv_amx_request granted the tile state. */
void hkv_qgemm_avx512amx(const hkv_wmat *w, const hkv_qact *a, int n, float *y, int64_t ldy,
                         int64_t r0, int64_t r1);

/* attn_causal's signature, for the FAST builds below. */
typedef void hkv_attn_causal_fn(const float *q, int64_t ldq, int nq, int g, int d, int64_t p0,
                                const uint16_t *k, const uint16_t *v, int64_t ld, float scale,
                                float *out, int64_t ldo, float *lse);

/* attn_causal in 16-bit fixed point (attn_causal_i16.inc), precision
 * FAST's prompt attention without AMX-BF16: vpmaddwd at 256 bits (AVX2),
 * vpdpwssd at 256 (AVX-VNNI, HKV_HAVE_AVXVNNI) and 512 (AVX512-VNNI); the
 * same bits from all three. Heads of d % (2 x the lane count) != 0 or over
 * 256 and calls of fewer rows than a vector go to the fp32 kernel. */
hkv_attn_causal_fn hkv_attn_causal_i16_avx2, hkv_attn_causal_i16_avxvnni, hkv_attn_causal_i16_avx512vnni;

/* attn_causal on AMX-BF16 tiles (attn_causal_amx.c, built where the compiler
 * has AMX-BF16: HKV_HAVE_AMX_BF16); heads larger than 128 and calls of
 * fewer than 16 query rows go to the AVX-512 fp32 kernel. */
hkv_attn_causal_fn hkv_attn_causal_amxbf16;

/* Peak loops for the compute probe (peak.c): `iters` rounds of 16
 * independent instructions each; return a sum that keeps the work alive.
 * The vnni and bf16 ones exist only on x86_64 and run only where the CPU
 * has the extension. */
double hkv_peak_loop_fma_avx2(long iters);
double hkv_peak_loop_fma_avx512(long iters);
double hkv_peak_loop_vnni(long iters);
double hkv_peak_loop_bf16(long iters);
/* AMX tiles (peak_amx.c, built with HKV_HAVE_AMX_BF16): iters / 16 rounds of
 * 16 tile instructions. */
double hkv_peak_loop_amx_int8(long iters);
double hkv_peak_loop_amx_bf16(long iters);

/* hkv_matmul with an explicit large-n schedule (see matmul.c), for the
 * benchmark that chose the default. */
enum { HKV_MM_SHARED_PANEL = 0, HKV_MM_THREAD_PANEL = 1 };
int hkv_matmul_mode(const hkv_cpu_kernels *t, const hkv_wmat *w, const float *x, int64_t n,
                    float *y, float *ws, int mode);
size_t hkv_matmul_mode_ws_floats(const hkv_wmat *w, int mode);

/* ---- exact IEEE half <-> float, round to nearest even ------------------- */

static inline float hkv_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);          /* inf / nan */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);   /* normal: rebias 15 -> 127 */
    } else if (man == 0) {
        bits = sign;                                       /* +-0 */
    } else {
        /* subnormal half = man * 2^-24, exact in float */
        float f = (float)man * 5.9604644775390625e-8f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t hkv_float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)                                 /* inf, or nan kept quiet */
        return sign | 0x7c00 | (ax > 0x7f800000u ? (0x200 | ((ax >> 13) & 0x3ff)) : 0);
    if (ax >= 0x477ff000u)                                 /* rounds to >= 65520: inf */
        return sign | 0x7c00;
    if (ax < 0x38800000u) {                                /* below 2^-14: subnormal half */
        /* Adding 0.5 (2^-1) makes the FPU round the value to a multiple of
         * 2^-24 with ties to even; the low mantissa bits are then the half. */
        float a;
        memcpy(&a, &ax, 4);
        a += 0.5f;
        uint32_t ab;
        memcpy(&ab, &a, 4);
        return sign | (uint16_t)(ab - 0x3f000000u);
    }
    /* normal: drop 13 mantissa bits with round-to-nearest-even; a carry
     * into the exponent is the correct result */
    uint32_t odd = (ax >> 13) & 1;
    ax += 0xfff + odd;
    return sign | (uint16_t)((ax - 0x38000000u) >> 13);
}

#endif
