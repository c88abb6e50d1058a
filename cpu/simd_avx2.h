/* AVX2 + FMA + F16C vector layer for the kernel templates; same contract as
 * simd_avx512.h with 8 float lanes and 16 registers. Include only from files
 * compiled with isa_avx2_args. */
#ifndef HKV_SIMD_AVX2_H
#define HKV_SIMD_AVX2_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define VL 8
#define HKV_SFX(name) name##_avx2
/* Causal microkernel: 3 query vectors a step, 6 a tile (48 rows): 4 keys
 * (or head dims) x 3 vectors are 12 accumulators, enough FMA chains to
 * cover the FMA latency (8 reach 90% of the peak), with 3 query vectors and
 * a broadcast in the 16 registers. */
#define CAUSAL_MV 3
#define CAUSAL_RV 6

typedef __m256 vf;

#define HKV_VINLINE static inline __attribute__((always_inline))

HKV_VINLINE vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
HKV_VINLINE void vf_store(float *p, vf a) { _mm256_storeu_ps(p, a); }
HKV_VINLINE vf vf_set1(float a) { return _mm256_set1_ps(a); }
HKV_VINLINE vf vf_zero(void) { return _mm256_setzero_ps(); }
HKV_VINLINE vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
HKV_VINLINE vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
HKV_VINLINE vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
HKV_VINLINE vf vf_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
HKV_VINLINE vf vf_max(vf a, vf b) { return _mm256_max_ps(a, b); }
HKV_VINLINE vf vf_div(vf a, vf b) { return _mm256_div_ps(a, b); }
HKV_VINLINE vf vf_abs(vf a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
HKV_VINLINE float vf_hsum(vf a)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
HKV_VINLINE float vf_hmax(vf a)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
HKV_VINLINE vf vf_select_gt(vf a, vf b, vf x, vf y)
{
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_GT_OQ));
}

/* [low half of a, low half of b] and [high half of a, high half of b] */
HKV_VINLINE vf vf_low_halves(vf a, vf b) { return _mm256_permute2f128_ps(a, b, 0x20); }
HKV_VINLINE vf vf_high_halves(vf a, vf b) { return _mm256_permute2f128_ps(a, b, 0x31); }

HKV_VINLINE vf vf_load_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
HKV_VINLINE void vf_store_f16(uint16_t *p, vf a)
{
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
}
/* VL int8 values as float (exact) */
/* a rounded to fp16 and back: the value an fp16 row would hold */
HKV_VINLINE vf vf_round_f16(vf a)
{
    return _mm256_cvtph_ps(_mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
}
HKV_VINLINE vf vf_load_i8(const int8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* exp(x): same algorithm, range and error bound as the AVX-512 version;
 * 2^n is built in the exponent field, valid because the clamp keeps n in
 * [-126, 127]. x < -87.33 (including -inf) returns exactly 0. */
HKV_VINLINE vf vf_exp(vf x)
{
    const vf lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.37626f);
    vf keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    vf n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    vf p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

/* The levels of the reduction tree: lanes l and l + 4 of each of the two
 * inputs combine (L1: [a's | b's]), then lanes l and l + 2 (L2), l and l + 1
 * (L3), so every input vector is reduced in the same association wherever
 * it sits in the tree (attn_reg.inc relies on it: its scores equal
 * tile_dot's). */
HKV_VINLINE vf vf_tree_l1(vf a, vf b)
{
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
HKV_VINLINE vf vf_tree_l2(vf a, vf b)
{
    return _mm256_add_ps(_mm256_shuffle_ps(a, b, 0x44), _mm256_shuffle_ps(a, b, 0xEE));
}
HKV_VINLINE vf vf_tree_l3(vf a, vf b)
{
    return _mm256_add_ps(_mm256_shuffle_ps(a, b, 0x88), _mm256_shuffle_ps(a, b, 0xDD));
}

/* out lane j = sum of the lanes of v[j], j < 8 (3-level tree; input order
 * permuted so the output lanes come out in key order). */
HKV_VINLINE vf vf_reduce_vl(const vf *v)
{
    vf ab = vf_tree_l1(v[0], v[4]), cd = vf_tree_l1(v[1], v[5]);
    vf ef = vf_tree_l1(v[2], v[6]), gh = vf_tree_l1(v[3], v[7]);
    return vf_tree_l3(vf_tree_l2(ab, cd), vf_tree_l2(ef, gh));
}

/* ---- weight block decoding (32 weights = 4 vectors) -------------------- */

HKV_VINLINE void q4_decode(const uint8_t *q, vf scale, vf min, vf w[4])
{
    __m128i b = _mm_loadu_si128((const __m128i *)q);
    __m128i lo = _mm_and_si128(b, _mm_set1_epi8(15));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(15));
    w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), scale, min);
    w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))),
                           scale, min);
    w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), scale, min);
    w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))),
                           scale, min);
}

HKV_VINLINE void q8_decode(const int8_t *q, vf scale, vf w[4])
{
    for (int j = 0; j < 4; j++) {
        __m128i b = _mm_loadl_epi64((const __m128i *)(q + 8 * j));
        w[j] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), scale);
    }
}

HKV_VINLINE void f16_to_f32_vl(const uint16_t *src, float *dst)
{
    vf_store(dst, vf_load_f16(src));
}

#endif
