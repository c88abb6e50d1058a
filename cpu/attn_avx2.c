/* Attention pieces, AVX2 build of attn_simd.inc and attn_causal_simd.inc. */
#include "simd_avx2.h"
#include "attn_simd.inc"
#include "attn_causal_simd.inc"
