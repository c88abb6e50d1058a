/* fp32 FMA peak loop on zmm, AVX-512 build. 16 multiply-adds per
 * instruction. */
#include <immintrin.h>

#include "kernels_impl.h"

double hkv_peak_loop_fma_avx512(long iters)
{
    const __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(1e-7f);
#define PEAK_T __m512
#define PEAK_ZERO _mm512_setzero_ps()
#define PEAK_OP(c, x, y) _mm512_fmadd_ps(x, y, c)
#define PEAK_SUM(c) (double)_mm512_reduce_add_ps(c)
#include "peak_loops.inc"
}
