/* GEMV and dequantisation, AVX-512 build of gemv_simd.inc. */
#include "simd_avx512.h"
#include "gemv_simd.inc"
