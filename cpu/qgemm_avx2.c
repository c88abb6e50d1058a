/* Products on int8 activations (precision FAST) for AVX2 CPUs without
 * AVX512-VNNI (vpmaddubsw + vpmaddwd; the kernel is qgemm_avx2.inc), and
 * the activations' quantiser at 256 bits, which every FAST table uses
 * (AVX-VNNI, AVX512-VNNI, AMX). Reached only through the table. */
#define QG2_VNNI 0
#define QG2_SFX avx2
#include "qgemm_avx2.inc"

/* Per 32-block: d = max|x| / 127, q = x * (127 / max|x|) rounded to
 * nearest even (MXCSR) and clamped to [-127, 127], sa = 128 * sum(q), and
 * sx = sum(x) in the order the AVX-512 quantiser this replaced formed it
 * (x[i] + x[16+i], then halves, quarters, pairs), which kept the FAST
 * outputs' bits when it took over. */
void hkv_quant_act_avx2(const float *x, int64_t i0, int64_t i1, const hkv_qact *a)
{
    const int64_t cols = a->cols, nb = cols / HKV_WBLOCK;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);   /* undo the packs' lane split */
    for (int64_t i = i0; i < i1; i++) {
        const float *xr = x + i * cols;
        int8_t *q = a->q + i * cols;
        float *d = a->d + i * nb, *sx = a->sx + i * nb;
        int32_t *sa = a->sa + i * nb;
        for (int64_t b = 0; b < nb; b++) {
            __m256 v[4];
            for (int j = 0; j < 4; j++) v[j] = _mm256_loadu_ps(xr + b * 32 + 8 * j);
            __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], absmask), _mm256_and_ps(v[1], absmask)),
                                      _mm256_max_ps(_mm256_and_ps(v[2], absmask), _mm256_and_ps(v[3], absmask)));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
            /* below 1e-30 (or NaN) the block quantises to zero, as on AVX-512 */
            const int live = amax >= 1e-30f;
            const __m256 id = _mm256_set1_ps(live ? 127.0f / amax : 0.0f);
            __m256i qi[4], qs = _mm256_setzero_si256();
            for (int j = 0; j < 4; j++) {
                qi[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], id));
                qi[j] = _mm256_max_epi32(_mm256_min_epi32(qi[j], hi), lo);
                qs = _mm256_add_epi32(qs, qi[j]);
            }
            const __m256i pk = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
            _mm256_storeu_si256((__m256i *)(q + b * 32), _mm256_permutevar8x32_epi32(pk, order));
            d[b] = live ? amax / 127.0f : 0.0f;
            const __m256 s8 = _mm256_add_ps(_mm256_add_ps(v[1], v[3]), _mm256_add_ps(v[0], v[2]));
            const __m128 s4 = _mm_add_ps(_mm256_extractf128_ps(s8, 1), _mm256_castps256_ps128(s8));
            const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            sx[b] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
            __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(qs), _mm256_extracti128_si256(qs, 1));
            t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4e));
            t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xb1));
            sa[b] = 128 * _mm_cvtsi128_si32(t4);
        }
    }
}
