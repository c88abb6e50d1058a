/* GEMV and dequantisation, AVX2 build of gemv_simd.inc. */
#include "simd_avx2.h"
#include "gemv_simd.inc"
