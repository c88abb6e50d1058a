/* GGUF reader (versions 2 and 3): mmap, header, metadata, tensor table.
 *
 * Everything is validated at open: counts against the file size, string and
 * array lengths, value types, tensor dims/types/offsets/alignment, tensors
 * past the end of the file. After a successful open every pointer below is
 * inside the mapping, so readers never bounds-check again. */
#ifndef HKV_GGUF_H
#define HKV_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Value types of GGUF metadata (numbering from the format definition). */
enum hkv_gguf_vtype {
    HKV_GGUF_U8 = 0, HKV_GGUF_I8 = 1, HKV_GGUF_U16 = 2, HKV_GGUF_I16 = 3,
    HKV_GGUF_U32 = 4, HKV_GGUF_I32 = 5, HKV_GGUF_F32 = 6, HKV_GGUF_BOOL = 7,
    HKV_GGUF_STRING = 8, HKV_GGUF_ARRAY = 9, HKV_GGUF_U64 = 10,
    HKV_GGUF_I64 = 11, HKV_GGUF_F64 = 12,
    HKV_GGUF_VTYPE_COUNT
};

/* A string inside the mapping: not NUL-terminated. */
typedef struct hkv_str {
    const char *ptr;
    uint64_t len;
} hkv_str;

/* One metadata pair. Arrays of arrays are refused at open (UNSUPPORTED). */
typedef struct hkv_gguf_kv {
    hkv_str key;
    int type;              /* enum hkv_gguf_vtype */
    int arr_type;          /* element type when type == ARRAY */
    uint64_t arr_n;        /* element count when type == ARRAY */
    const uint8_t *val;    /* scalar value, string (u64 len + bytes) or first array element */
    hkv_str *arr_str;      /* ARRAY of STRING: the elements, pre-indexed at open */
} hkv_gguf_kv;

#define HKV_GGUF_MAX_DIMS 4

typedef struct hkv_gguf_tensor {
    hkv_str name;
    int type;                      /* enum hkv_ggml_type */
    int n_dims;
    int64_t ne[HKV_GGUF_MAX_DIMS]; /* ne[0] is the contiguous (fastest) dim; unused dims are 1 */
    uint64_t offset;               /* from the start of the data section */
    const void *data;              /* inside the mapping */
    size_t nbytes;
} hkv_gguf_tensor;

typedef struct hkv_gguf {
    void *map;                 /* the file mapping (or caller buffer) */
    size_t size;
    int owns_map;              /* 1: munmap at close */
    uint32_t version;
    uint64_t n_kv;
    hkv_gguf_kv *kv;
    uint64_t n_tensors;
    hkv_gguf_tensor *tensors;
    uint64_t alignment;        /* general.alignment or 32 */
    const uint8_t *data;       /* start of the tensor data section; NULL only when
                                  there are no tensors and the file ends before it */
} hkv_gguf;

/* Open and validate a file. On failure *out is NULL and err names the problem. */
int hkv_gguf_open(hkv_gguf **out, const char *path, hkv_err *err);
/* Same over a caller-owned buffer that must outlive the handle (tests, fuzzing). */
int hkv_gguf_open_buffer(hkv_gguf **out, const void *buf, size_t size, hkv_err *err);
void hkv_gguf_close(hkv_gguf *g);

const hkv_gguf_kv *hkv_gguf_find(const hkv_gguf *g, const char *key);
const hkv_gguf_tensor *hkv_gguf_find_tensor(const hkv_gguf *g, const char *name);

/* Typed getters. A missing key gives HKV_E_NOTFOUND, a wrong type
 * HKV_E_FORMAT, an integer that does not fit HKV_E_RANGE; the message names
 * the key. Integer getters accept any integer type whose value fits. */
int hkv_gguf_get_i64(const hkv_gguf *g, const char *key, int64_t *out, hkv_err *err);
int hkv_gguf_get_u32(const hkv_gguf *g, const char *key, uint32_t *out, hkv_err *err);
int hkv_gguf_get_f32(const hkv_gguf *g, const char *key, float *out, hkv_err *err); /* f32 or f64 */
int hkv_gguf_get_bool(const hkv_gguf *g, const char *key, int *out, hkv_err *err);
int hkv_gguf_get_str(const hkv_gguf *g, const char *key, hkv_str *out, hkv_err *err);
/* Arrays: elem_type must match (strings: HKV_GGUF_STRING, elements in kv->arr_str). */
int hkv_gguf_get_arr(const hkv_gguf *g, const char *key, int elem_type,
                     const hkv_gguf_kv **out, hkv_err *err);

/* 1 when s equals the NUL-terminated c. */
int hkv_str_eq(hkv_str s, const char *c);
const char *hkv_gguf_vtype_name(int t);

#endif
