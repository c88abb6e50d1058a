/* AVX-512 (F/BW/VL/DQ + F16C) vector layer for the kernel templates
 * (gemv_simd.inc, attn_simd.inc, attn_causal_simd.inc). Include only from
 * files compiled with isa_avx512_args. VL is the float lane count. */
#ifndef HKV_SIMD_AVX512_H
#define HKV_SIMD_AVX512_H

#include <immintrin.h>
#include <stdint.h>

#define VL 16
#define HKV_SFX(name) name##_avx512
/* Causal microkernel shape: query rows per tile are VL * CAUSAL_MV. */
#define CAUSAL_MV 4

typedef __m512 vf;

#define HKV_VINLINE static inline __attribute__((always_inline))

HKV_VINLINE vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
HKV_VINLINE void vf_store(float *p, vf a) { _mm512_storeu_ps(p, a); }
HKV_VINLINE vf vf_set1(float a) { return _mm512_set1_ps(a); }
HKV_VINLINE vf vf_zero(void) { return _mm512_setzero_ps(); }
HKV_VINLINE vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
HKV_VINLINE vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
HKV_VINLINE vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
HKV_VINLINE vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
HKV_VINLINE vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
HKV_VINLINE vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
HKV_VINLINE vf vf_abs(vf a) { return _mm512_abs_ps(a); }
HKV_VINLINE float vf_hsum(vf a) { return _mm512_reduce_add_ps(a); }
HKV_VINLINE float vf_hmax(vf a) { return _mm512_reduce_max_ps(a); }
/* (a > b) ? x : y per lane */
HKV_VINLINE vf vf_select_gt(vf a, vf b, vf x, vf y)
{
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_GT_OQ), y, x);
}

/* [low half of a, low half of b] and [high half of a, high half of b] */
HKV_VINLINE vf vf_low_halves(vf a, vf b) { return _mm512_shuffle_f32x4(a, b, 0x44); }
HKV_VINLINE vf vf_high_halves(vf a, vf b) { return _mm512_shuffle_f32x4(a, b, 0xEE); }

HKV_VINLINE vf vf_load_f16(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
HKV_VINLINE void vf_store_f16(uint16_t *p, vf a)
{
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
}
/* VL int8 values as float (exact) */
/* a rounded to fp16 and back: the value an fp16 row would hold */
HKV_VINLINE vf vf_round_f16(vf a)
{
    return _mm512_cvtph_ps(_mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
}
HKV_VINLINE vf vf_load_i8(const int8_t *p)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* exp(x) with Cephes' degree-6 polynomial on [-ln2/2, ln2/2] after a
 * round-to-nearest range reduction (two-part ln2). Relative error within
 * about 2 ulp of expf for x in [-87.33, 88.37]; inputs are clamped to that
 * range first, and x < -87.33 (including -inf) returns exactly 0, so a
 * masked logit never contributes. Tested against expf in tests/cpu. */
HKV_VINLINE vf vf_exp(vf x)
{
    const vf lo = _mm512_set1_ps(-87.33654f), hi = _mm512_set1_ps(88.37626f);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    vf n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    vf p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_scalef_ps((__mmask16)~under, p, n);
}

/* The levels of the reduction tree: each combines (op: add or max) lanes l
 * and l + 8 (L1), l + 4 (L2), l + 2 (L3), l + 1 (L4) of each of its two
 * inputs, so every input vector is reduced in the same association whatever
 * its position in the tree (attn_reg.inc relies on it: its scores
 * equal tile_dot's; attn_causal_amx.c: a row's sum does not depend on the
 * rows beside it). vf_tree_l1..l4 add, vf_maxtree_l1..l4 take maxima. */
#define HKV_TREE_LEVELS(pfx, op)                                                               \
    HKV_VINLINE vf pfx##_l1(vf a, vf b)                                                        \
    {                                                                                          \
        return op(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));         \
    }                                                                                          \
    HKV_VINLINE vf pfx##_l2(vf a, vf b)                                                        \
    {                                                                                          \
        return op(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));         \
    }                                                                                          \
    HKV_VINLINE vf pfx##_l3(vf a, vf b)                                                        \
    {                                                                                          \
        return op(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));               \
    }                                                                                          \
    HKV_VINLINE vf pfx##_l4(vf a, vf b)                                                        \
    {                                                                                          \
        return op(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));               \
    }

/* out lane j = the reduction of the lanes of v[j], j < 16: a 4-level tree
 * (45 ops for 16 reductions instead of 16 separate ones). The input order
 * is permuted so that the tree's output lanes come out in key order. */
#define HKV_TREE_REDUCE(name, pfx)                                                             \
    HKV_VINLINE vf name(const vf *v)                                                           \
    {                                                                                          \
        vf ab = pfx##_l1(v[0], v[4]), cd = pfx##_l1(v[8], v[12]);                              \
        vf ef = pfx##_l1(v[1], v[5]), gh = pfx##_l1(v[9], v[13]);                              \
        vf ij = pfx##_l1(v[2], v[6]), kl = pfx##_l1(v[10], v[14]);                             \
        vf mn = pfx##_l1(v[3], v[7]), op = pfx##_l1(v[11], v[15]);                             \
        vf a_d = pfx##_l2(ab, cd), e_h = pfx##_l2(ef, gh), i_l = pfx##_l2(ij, kl),             \
           m_p = pfx##_l2(mn, op);                                                             \
        return pfx##_l4(pfx##_l3(a_d, e_h), pfx##_l3(i_l, m_p));                               \
    }

HKV_TREE_LEVELS(vf_tree, _mm512_add_ps)
HKV_TREE_LEVELS(vf_maxtree, _mm512_max_ps)
HKV_TREE_REDUCE(vf_reduce_vl, vf_tree)         /* sums */
HKV_TREE_REDUCE(vf_reduce_max_vl, vf_maxtree)  /* maxima */

/* ---- weight block decoding (32 weights = 2 vectors) -------------------- */

/* Q4 block: byte j holds element j (low nibble) and j+16 (high nibble).
 * The 16 possible weights scale*q + min are one vector (a single FMA on
 * 0..15); vpermps then picks each weight by nibble, using only the low 4
 * bits of each index lane, so the low nibbles need no mask and no int->float
 * conversion is needed at all. Exactly the value of fma(q, scale, min). */
HKV_VINLINE void q4_decode(const uint8_t *q, vf scale, vf min, vf w[2])
{
    const vf iota = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    vf table = _mm512_fmadd_ps(iota, scale, min);
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
    w[0] = _mm512_permutexvar_ps(b, table);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table);
}

HKV_VINLINE void q8_decode(const int8_t *q, vf scale, vf w[2])
{
    __m512i a = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q));
    __m512i b = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)));
    w[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(a), scale);
    w[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(b), scale);
}

/* VL fp16 values to float, stored (for converting scale rows). */
HKV_VINLINE void f16_to_f32_vl(const uint16_t *src, float *dst)
{
    vf_store(dst, vf_load_f16(src));
}

#endif
