/* bf16 dot-product peak loop (vdpbf16ps zmm); compiled with AVX512-BF16 and
 * called only where hkv_isa_detect found it. 32 multiply-adds per
 * instruction. */
#include <immintrin.h>

#include "kernels_impl.h"

double hkv_peak_loop_bf16(long iters)
{
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80),   /* 1.0 */
                   b = (__m512bh)_mm512_set1_epi16(0x3400);   /* 2^-23: sums stay finite */
#define PEAK_T __m512
#define PEAK_ZERO _mm512_setzero_ps()
#define PEAK_OP(c, x, y) _mm512_dpbf16_ps(c, x, y)
#define PEAK_SUM(c) (double)_mm512_reduce_add_ps(c)
#include "peak_loops.inc"
}
