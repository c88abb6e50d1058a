/* int8 dot-product peak loop (vpdpbusd zmm); compiled with AVX512-VNNI and
 * called only where hkv_isa_detect found it. 64 multiply-adds per
 * instruction. */
#include <immintrin.h>

#include "kernels_impl.h"

double hkv_peak_loop_vnni(long iters)
{
    const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(-1);
#define PEAK_T __m512i
#define PEAK_ZERO _mm512_setzero_si512()
#define PEAK_OP(c, x, y) _mm512_dpbusd_epi32(c, x, y)
#define PEAK_SUM(c) (double)_mm512_reduce_add_epi32(c)
#include "peak_loops.inc"
}
