#include "gguf_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_types.h"
#include "gguf.h"

void gw_free(gw *w) {
    free(w->p);
    w->p = NULL;
    w->n = w->cap = 0;
}

void gw_bytes(gw *w, const void *src, size_t n) {
    if (w->n + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->n + n) cap *= 2;
        uint8_t *p = realloc(w->p, cap);
        if (!p) {
            fprintf(stderr, "gguf_writer: out of memory\n");
            abort();
        }
        w->p = p;
        w->cap = cap;
    }
    if (n) memcpy(w->p + w->n, src, n);
    w->n += n;
}

static void le(gw *w, uint64_t v, int n) {
    uint8_t b[8];
    for (int i = 0; i < n; i++) b[i] = (uint8_t)(v >> (8 * i));
    gw_bytes(w, b, (size_t)n);
}

void gw_u8(gw *w, uint8_t v) { le(w, v, 1); }
void gw_u16(gw *w, uint16_t v) { le(w, v, 2); }
void gw_u32(gw *w, uint32_t v) { le(w, v, 4); }
void gw_u64(gw *w, uint64_t v) { le(w, v, 8); }
void gw_f32(gw *w, float v) { uint32_t u; memcpy(&u, &v, 4); le(w, u, 4); }
void gw_f64(gw *w, double v) { uint64_t u; memcpy(&u, &v, 8); le(w, u, 8); }

void gw_str(gw *w, const char *s) {
    size_t n = strlen(s);
    gw_u64(w, n);
    gw_bytes(w, s, n);
}

void gw_pad(gw *w, size_t align) {
    while (w->n % align) gw_u8(w, 0);
}

void gw_put_u32_at(gw *w, size_t at, uint32_t v) {
    for (int i = 0; i < 4; i++) w->p[at + (size_t)i] = (uint8_t)(v >> (8 * i));
}

void gw_put_u64_at(gw *w, size_t at, uint64_t v) {
    for (int i = 0; i < 8; i++) w->p[at + (size_t)i] = (uint8_t)(v >> (8 * i));
}

void gw_header(gw *w, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    gw_bytes(w, "GGUF", 4);
    gw_u32(w, version);
    gw_u64(w, n_tensors);
    gw_u64(w, n_kv);
}

void gw_key(gw *w, const char *key, uint32_t vtype) {
    gw_str(w, key);
    gw_u32(w, vtype);
}

void gw_kv_u32(gw *w, const char *key, uint32_t v) {
    gw_key(w, key, HKV_GGUF_U32);
    gw_u32(w, v);
}

void gw_kv_str(gw *w, const char *key, const char *v) {
    gw_key(w, key, HKV_GGUF_STRING);
    gw_str(w, v);
}

void gw_tensor(gw *w, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
               uint64_t offset) {
    gw_str(w, name);
    gw_u32(w, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) gw_u64(w, ne[d]);
    gw_u32(w, type);
    gw_u64(w, offset);
}

/* The tensors of gw_build_valid (shared with the read test through
 * gw_tensor_byte and the names below). */
static const struct {
    const char *name;
    uint32_t n_dims, type;
    uint64_t ne[4];
} valid_tensors[] = {
    {"token_embd.weight", 2, HKV_GGML_Q8_0, {64, 3, 1, 1}},
    {"blk.0.attn_norm.weight", 1, HKV_GGML_F32, {5, 1, 1, 1}},
    {"blk.0.attn_q.weight", 2, HKV_GGML_Q4_1, {32, 2, 1, 1}},
    {"blk.0.ffn_up.weight", 3, HKV_GGML_F16, {3, 2, 2, 1}},
    {"blk.0.ffn_down.weight", 1, HKV_GGML_Q6_K, {256, 1, 1, 1}},
    {"output.weight", 4, HKV_GGML_BF16, {2, 1, 3, 2}},
};

uint8_t gw_tensor_byte(int t, size_t k) { return (uint8_t)(k * 7u + (size_t)t * 31u + 1u); }

void gw_build_valid(gw *w, uint32_t version, uint32_t alignment) {
    const int nt = (int)(sizeof valid_tensors / sizeof valid_tensors[0]);
    const uint32_t al = alignment ? alignment : 32;
    gw_header(w, version, (uint64_t)nt, alignment ? 18 : 17);
    gw_kv_str(w, "general.architecture", "llama");
    gw_key(w, "t.u8", HKV_GGUF_U8); gw_u8(w, 200);
    gw_key(w, "t.i8", HKV_GGUF_I8); gw_u8(w, (uint8_t)-100);
    gw_key(w, "t.u16", HKV_GGUF_U16); gw_u16(w, 60000);
    gw_key(w, "t.i16", HKV_GGUF_I16); gw_u16(w, (uint16_t)-30000);
    gw_kv_u32(w, "llama.block_count", 30);
    gw_key(w, "t.i32", HKV_GGUF_I32); gw_u32(w, (uint32_t)-2000000000);
    gw_key(w, "t.f32", HKV_GGUF_F32); gw_f32(w, 1e-5f);
    gw_key(w, "t.bool", HKV_GGUF_BOOL); gw_u8(w, 1);
    gw_key(w, "t.u64", HKV_GGUF_U64); gw_u64(w, UINT64_C(1) << 40);
    gw_key(w, "t.i64", HKV_GGUF_I64); gw_u64(w, (uint64_t)INT64_MIN);
    gw_key(w, "t.f64", HKV_GGUF_F64); gw_f64(w, 10000.5);
    gw_kv_str(w, "t.empty_str", "");
    gw_key(w, "tokenizer.ggml.tokens", HKV_GGUF_ARRAY);
    gw_u32(w, HKV_GGUF_STRING); gw_u64(w, 4);
    gw_str(w, "<s>"); gw_str(w, ""); gw_str(w, "hello"); gw_str(w, "\xe2\x96\x81world");
    gw_key(w, "tokenizer.ggml.token_type", HKV_GGUF_ARRAY);
    gw_u32(w, HKV_GGUF_I32); gw_u64(w, 3);
    gw_u32(w, 1); gw_u32(w, (uint32_t)-1); gw_u32(w, 6);
    gw_key(w, "t.empty_arr", HKV_GGUF_ARRAY);
    gw_u32(w, HKV_GGUF_F32); gw_u64(w, 0);
    gw_key(w, "t.f64_arr", HKV_GGUF_ARRAY);
    gw_u32(w, HKV_GGUF_F64); gw_u64(w, 2); gw_f64(w, 0.25); gw_f64(w, -3.0);
    if (alignment) gw_kv_u32(w, "general.alignment", alignment);
    uint64_t off = 0;
    size_t sizes[8];
    for (int t = 0; t < nt; t++) {
        int64_t nel = 1;
        for (int d = 0; d < 4; d++) nel *= (int64_t)valid_tensors[t].ne[d];
        int64_t ne0 = (int64_t)valid_tensors[t].ne[0];
        sizes[t] = hkv_ggml_row_bytes((int)valid_tensors[t].type, ne0) * (size_t)(nel / ne0);
        gw_tensor(w, valid_tensors[t].name, valid_tensors[t].n_dims, valid_tensors[t].ne,
                  valid_tensors[t].type, off);
        off += (sizes[t] + al - 1) / al * al;
    }
    gw_pad(w, al);
    for (int t = 0; t < nt; t++) {
        if (t) gw_pad(w, al);
        for (size_t k = 0; k < sizes[t]; k++) gw_u8(w, gw_tensor_byte(t, k));
    }
}
