/* The ggml tensor types that GGUF files carry: block geometry and
 * dequantisation to float, written from the format's definition. */
#ifndef HKV_GGML_TYPES_H
#define HKV_GGML_TYPES_H

#include <stddef.h>
#include <stdint.h>

enum hkv_ggml_type {
    HKV_GGML_F32 = 0, HKV_GGML_F16 = 1, HKV_GGML_Q4_0 = 2, HKV_GGML_Q4_1 = 3,
    HKV_GGML_Q5_0 = 6, HKV_GGML_Q5_1 = 7, HKV_GGML_Q8_0 = 8, HKV_GGML_Q8_1 = 9,
    HKV_GGML_Q2_K = 10, HKV_GGML_Q3_K = 11, HKV_GGML_Q4_K = 12,
    HKV_GGML_Q5_K = 13, HKV_GGML_Q6_K = 14, HKV_GGML_Q8_K = 15,
    /* known for their size only (can_dequant = 0) */
    HKV_GGML_IQ2_XXS = 16, HKV_GGML_IQ2_XS = 17, HKV_GGML_IQ3_XXS = 18,
    HKV_GGML_IQ1_S = 19, HKV_GGML_IQ4_NL = 20, HKV_GGML_IQ3_S = 21,
    HKV_GGML_IQ2_S = 22, HKV_GGML_IQ4_XS = 23, HKV_GGML_IQ1_M = 29,
    HKV_GGML_TQ1_0 = 34, HKV_GGML_TQ2_0 = 35, HKV_GGML_MXFP4 = 39,
    HKV_GGML_I8 = 24, HKV_GGML_I16 = 25, HKV_GGML_I32 = 26, HKV_GGML_I64 = 27,
    HKV_GGML_F64 = 28, HKV_GGML_BF16 = 30,
    HKV_GGML_TYPE_LIMIT = 64
};

typedef struct hkv_ggml_type_info {
    const char *name;      /* "q4_1"; NULL for an unknown type */
    int block_size;        /* elements per block */
    int type_size;         /* bytes per block */
    int can_dequant;       /* 1 if hkv_ggml_dequant_row supports it */
} hkv_ggml_type_info;

/* Info for a type id; name == NULL when the id is not a known type. */
hkv_ggml_type_info hkv_ggml_type_get(int type);

/* Bytes of a row of n elements; 0 when n is negative, not a multiple of the
 * block size, the type is unknown or the size does not fit in size_t. */
size_t hkv_ggml_row_bytes(int type, int64_t n);

/* Dequantise n elements (a multiple of the block size) from src to dst.
 * src needs no alignment. Returns HKV_OK, HKV_E_UNSUPPORTED (unknown type or
 * can_dequant == 0) or HKV_E_INVAL (n < 0, not a multiple of the block
 * size, NULL pointers with n > 0). */
int hkv_ggml_dequant_row(int type, const void *src, float *dst, int64_t n);

/* IEEE half / bfloat16 conversions (scalar, exact, round-to-nearest-even).
 * To f32: exact for every input, subnormals, inf and NaN payloads included.
 * From f32: a NaN stays NaN (made quiet, sign and top payload bits kept), a
 * value past the largest finite one rounds to inf, subnormals are rounded. */
float hkv_fp16_to_f32(uint16_t h);
uint16_t hkv_f32_to_fp16(float f);
float hkv_bf16_to_f32(uint16_t h);
uint16_t hkv_f32_to_bf16(float f);

#endif
