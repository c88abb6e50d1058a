/* fp32 FMA peak loop on ymm, AVX2 build. 8 multiply-adds per instruction. */
#include <immintrin.h>

#include "kernels_impl.h"

static double hsum8(__m256 v)
{
    float t[8];
    _mm256_storeu_ps(t, v);
    return (double)t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

double hkv_peak_loop_fma_avx2(long iters)
{
    const __m256 a = _mm256_set1_ps(1.0f), b = _mm256_set1_ps(1e-7f);
#define PEAK_T __m256
#define PEAK_ZERO _mm256_setzero_ps()
#define PEAK_OP(c, x, y) _mm256_fmadd_ps(x, y, c)
#define PEAK_SUM(c) hsum8(c)
#include "peak_loops.inc"
}
