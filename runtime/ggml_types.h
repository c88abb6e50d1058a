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

/* Bytes of a row of n elements; 0 when n is not a multiple of the block size
 * or the type is unknown. */
size_t hkv_ggml_row_bytes(int type, int64_t n);

/* Dequantise n elements (a multiple of the block size) from src to dst.
 * Returns HKV_OK or HKV_E_UNSUPPORTED / HKV_E_INVAL. */
int hkv_ggml_dequant_row(int type, const void *src, float *dst, int64_t n);

/* IEEE half / bfloat16 conversions (scalar, exact, round-to-nearest-even). */
float hkv_fp16_to_f32(uint16_t h);
uint16_t hkv_f32_to_fp16(float f);
float hkv_bf16_to_f32(uint16_t h);

#endif
