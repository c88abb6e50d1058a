/* attn_causal_i16.inc with AVX-VNNI's vpdpwssd at 256 bits: the same bits
 * as the AVX2 build, one instruction where that one takes two. */
#include "kernels_impl.h"
#include "simd_avx2.h"
#define I16_VNNI 1
#define I16_NAME hkv_attn_causal_i16_avxvnni
#define I16_EXACT hkv_attn_causal_avx2
#include "attn_causal_i16.inc"
