/* attn_causal_i16.inc with vpmaddwd + vpaddd at 256 bits: precision FAST's
 * prompt attention on AVX2 (and where AVX-VNNI is switched off). */
#include "kernels_impl.h"
#include "simd_avx2.h"
#define I16_VNNI 0
#define I16_NAME hkv_attn_causal_i16_avx2
#define I16_EXACT hkv_attn_causal_avx2
#include "attn_causal_i16.inc"
