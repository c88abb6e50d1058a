/* attn_causal_i16.inc with AVX512-VNNI's vpdpwssd at 512 bits: precision
 * FAST's prompt attention on AVX-512 without AMX-BF16; the same bits as the
 * 256-bit builds. */
#include "kernels_impl.h"
#include "simd_avx512.h"
#define I16_VNNI 1
#define I16_NAME hkv_attn_causal_i16_avx512vnni
#define I16_EXACT hkv_attn_causal_avx512
#include "attn_causal_i16.inc"
