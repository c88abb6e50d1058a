/* Test helper: write GGUF files (valid or deliberately broken) into memory.
 *
 * A growable little-endian byte buffer plus helpers for the GGUF fields.
 * Allocation failure aborts the test (test code only, never library code). */
#ifndef HKV_TEST_GGUF_WRITER_H
#define HKV_TEST_GGUF_WRITER_H

#include <stddef.h>
#include <stdint.h>

typedef struct gw {
    uint8_t *p;
    size_t n, cap;
} gw;

void gw_free(gw *w);
void gw_bytes(gw *w, const void *src, size_t n);
void gw_u8(gw *w, uint8_t v);
void gw_u16(gw *w, uint16_t v);
void gw_u32(gw *w, uint32_t v);
void gw_u64(gw *w, uint64_t v);
void gw_f32(gw *w, float v);
void gw_f64(gw *w, double v);
void gw_str(gw *w, const char *s);               /* u64 length + bytes */
void gw_pad(gw *w, size_t align);               /* zero bytes up to a multiple of align */
/* Overwrite 4 or 8 bytes at an earlier position (patch counts, offsets). */
void gw_put_u32_at(gw *w, size_t at, uint32_t v);
void gw_put_u64_at(gw *w, size_t at, uint64_t v);

void gw_header(gw *w, uint32_t version, uint64_t n_tensors, uint64_t n_kv);
/* Key and value type; the caller writes the value. */
void gw_key(gw *w, const char *key, uint32_t vtype);
void gw_kv_u32(gw *w, const char *key, uint32_t v);
void gw_kv_str(gw *w, const char *key, const char *v);
/* Tensor info with up to 4 dims. */
void gw_tensor(gw *w, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
               uint64_t offset);

/* A valid file exercising every value type, string arrays and six tensors of
 * several types (data filled by fill_tensor_byte). alignment 0 means no
 * general.alignment key (default 32). The last tensor ends at end of file. */
void gw_build_valid(gw *w, uint32_t version, uint32_t alignment);
/* Byte k of tensor t's data in gw_build_valid files. */
uint8_t gw_tensor_byte(int t, size_t k);

#endif
