/* Hostile GGUF inputs: each case builds a broken file, asserts the error
 * code, that no handle comes back, and that the message names the problem.
 * Buffers are exact-size heap copies so ASan/valgrind catch any read past
 * the end. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ggml_types.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "tcase.h"

/* Open w's bytes; rc and message land in *err. */
static int open_copy(const gw *w, size_t n, hkv_err *err) {
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return HKV_E_NOMEM;
    memcpy(buf, w->p, n);
    hkv_gguf *g = (hkv_gguf *)&g; /* poison: must come back NULL on failure */
    hkv_err_clear(err);
    int rc = hkv_gguf_open_buffer(&g, buf, n, err);
    if (rc == HKV_OK) hkv_gguf_close(g);
    else if (g != NULL) rc = 12345; /* reported as a code mismatch */
    free(buf);
    return rc;
}

/* The open must fail with `code` and the message contain every needle. */
#define EXPECT_FAIL(w, code, ...)                                                       \
    do {                                                                                \
        hkv_err e_;                                                                     \
        int rc_ = open_copy((w), (w)->n, &e_);                                          \
        gw_free(w);                                                                     \
        CHECK(rc_ == (code), "rc %d (%s), want %s; message: %s", rc_,                    \
              hkv_status_name(rc_), #code, e_.msg);                                     \
        const char *nd_[] = {__VA_ARGS__};                                              \
        for (size_t i_ = 0; i_ < sizeof nd_ / sizeof nd_[0]; i_++)                      \
            CHECK(strstr(e_.msg, nd_[i_]), "message lacks \"%s\": %s", nd_[i_], e_.msg); \
    } while (0)

static const uint64_t NE1[4] = {32, 1, 1, 1};

/* One tensor after an empty kv section, with data_bytes of data. */
static void one_tensor(gw *w, const char *name, uint32_t nd, const uint64_t *ne, uint32_t type,
                       uint64_t offset, size_t data_bytes) {
    gw_header(w, 3, 1, 0);
    gw_tensor(w, name, nd, ne, type, offset);
    gw_pad(w, 32);
    for (size_t i = 0; i < data_bytes; i++) gw_u8(w, 0);
}

static int t_truncation_every_prefix(void) {
    for (uint32_t v = 2; v <= 3; v++) {
        gw w = {0};
        gw_build_valid(&w, v, 64);
        hkv_err e;
        CHECK(open_copy(&w, w.n, &e) == HKV_OK, "full file must open: %s", e.msg);
        for (size_t n = 0; n < w.n; n++) {
            int rc = open_copy(&w, n, &e);
            CHECK(rc == HKV_E_FORMAT, "prefix %zu of %zu: rc %d: %s", n, w.n, rc, e.msg);
            CHECK(strstr(e.msg, "truncated") || strstr(e.msg, "past the end") ||
                  strstr(e.msg, "impossible") || strstr(e.msg, "cannot both fit"),
                  "prefix %zu: message does not say why: %s", n, e.msg);
        }
        gw_free(&w);
    }
    return 0;
}

/* Random byte corruption of a valid file (fixed seed): every open either
 * succeeds with all tensors inside the buffer, or fails with a message. */
static int t_random_corruption(void) {
    gw w = {0};
    gw_build_valid(&w, 3, 0);
    uint8_t *buf = malloc(w.n);
    CHECK(buf, "malloc");
    uint64_t x = 0x9e3779b97f4a7c15u; /* xorshift state, local to this case */
    int opened = 0, failed = 0, bad = 0;
    for (int it = 0; it < 4000 && !bad; it++) {
        memcpy(buf, w.p, w.n);
        int flips = 1 + it % 4;
        for (int k = 0; k < flips; k++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            /* mostly the header region, where the structure lives */
            size_t at = (size_t)(x >> 8) % (it % 2 ? w.n : 300);
            buf[at] = (uint8_t)(it % 3 ? x : buf[at] ^ (1u << (x % 8)));
        }
        hkv_gguf *g = NULL;
        hkv_err e;
        hkv_err_clear(&e);
        int rc = hkv_gguf_open_buffer(&g, buf, w.n, &e);
        if (rc == HKV_OK) {
            opened++;
            for (uint64_t t = 0; t < g->n_tensors; t++) {
                const uint8_t *d = g->tensors[t].data;
                bad |= d < buf || d + g->tensors[t].nbytes > buf + w.n;
            }
            hkv_gguf_close(g);
        } else {
            failed++;
            bad |= g != NULL || e.msg[0] == '\0' || (rc != HKV_E_FORMAT && rc != HKV_E_UNSUPPORTED);
            if (bad) fprintf(stderr, "  iteration %d: rc %d: %s\n", it, rc, e.msg);
        }
    }
    free(buf);
    gw_free(&w);
    CHECK(!bad, "a corrupted file gave an inconsistent result");
    CHECK(opened > 0 && failed > 0, "opened %d, failed %d: mutations too weak or too strong", opened, failed);
    return 0;
}

static int t_bad_magic(void) {
    gw w = {0};
    gw_build_valid(&w, 3, 0);
    w.p[3] = 'X';
    EXPECT_FAIL(&w, HKV_E_FORMAT, "not a GGUF file", "47 47 55 58");
    return 0;
}

static int t_version_1(void) {
    gw w = {0};
    gw_build_valid(&w, 1, 0);
    EXPECT_FAIL(&w, HKV_E_UNSUPPORTED, "version 1 is not supported");
    return 0;
}

static int t_version_99(void) {
    gw w = {0};
    gw_build_valid(&w, 99, 0);
    EXPECT_FAIL(&w, HKV_E_UNSUPPORTED, "unsupported GGUF version 99");
    return 0;
}

static int t_version_big_endian(void) {
    gw w = {0};
    gw_build_valid(&w, 0x03000000u, 0);
    EXPECT_FAIL(&w, HKV_E_UNSUPPORTED, "big-endian");
    return 0;
}

static int t_absurd_n_kv(void) {
    gw w = {0};
    gw_build_valid(&w, 3, 0);
    gw_put_u64_at(&w, 16, UINT64_C(1) << 60);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "n_kv = 1152921504606846976 is impossible");
    return 0;
}

static int t_absurd_n_tensors(void) {
    gw w = {0};
    gw_build_valid(&w, 3, 0);
    gw_put_u64_at(&w, 8, UINT64_C(1) << 60);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "n_tensors = 1152921504606846976 is impossible");
    return 0;
}

static int t_counts_together_too_big(void) {
    gw w = {0};
    gw_header(&w, 3, 1, 1);
    gw_kv_u32(&w, "a", 1); /* 17 bytes: enough for either count alone, not both */
    for (int i = 0; i < 20; i++) gw_u8(&w, 0);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "cannot both fit");
    return 0;
}

static int t_key_length_past_end(void) {
    gw w = {0};
    gw_header(&w, 3, 0, 1);
    gw_u64(&w, 1000);
    gw_bytes(&w, "general.name", 12);
    gw_u32(&w, HKV_GGUF_U8);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "key #0", "length 1000", "past the end");
    return 0;
}

static int t_string_value_huge_length(void) {
    gw w = {0};
    gw_header(&w, 3, 0, 1);
    gw_key(&w, "general.name", HKV_GGUF_STRING);
    gw_u64(&w, UINT64_C(1) << 63);
    gw_bytes(&w, "abc", 3);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "key 'general.name'", "length 9223372036854775808", "past the end");
    return 0;
}

static int t_huge_array_count(void) {
    gw w = {0};
    gw_header(&w, 3, 0, 1);
    gw_key(&w, "x.arr", HKV_GGUF_ARRAY);
    gw_u32(&w, HKV_GGUF_U64);
    gw_u64(&w, UINT64_C(1) << 61); /* x 8 bytes would wrap 64 bits */
    gw_u64(&w, 7);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "key 'x.arr'", "array of 2305843009213693952 u64 elements");
    return 0;
}

static int t_huge_string_array_count(void) {
    gw w = {0};
    gw_header(&w, 3, 0, 1);
    gw_key(&w, "tokenizer.ggml.tokens", HKV_GGUF_ARRAY);
    gw_u32(&w, HKV_GGUF_STRING);
    gw_u64(&w, UINT64_MAX);
    gw_str(&w, "a");
    EXPECT_FAIL(&w, HKV_E_FORMAT, "key 'tokenizer.ggml.tokens'", "18446744073709551615 string");
    return 0;
}

static int t_string_in_array_past_end(void) {
    gw w = {0};
    gw_header(&w, 3, 0, 1);
    gw_key(&w, "tokenizer.ggml.tokens", HKV_GGUF_ARRAY);
    gw_u32(&w, HKV_GGUF_STRING);
    gw_u64(&w, 3);
    gw_str(&w, "a");
    gw_u64(&w, 500);
    gw_bytes(&w, "bcdefghijklmnopqrstuvwxyz", 25);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "key 'tokenizer.ggml.tokens'", "string #1 of the array",
                "length 500");
    return 0;
}

static int t_unknown_value_type(void) {
    gw w = {0};
    gw_header(&w, 3, 0, 1);
    gw_key(&w, "llama.rope.scale", 13);
    gw_u32(&w, 0);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "key 'llama.rope.scale' has unknown value type 13");
    return 0;
}

static int t_unknown_array_elem_type(void) {
    gw w = {0};
    gw_header(&w, 3, 0, 1);
    gw_key(&w, "x.arr", HKV_GGUF_ARRAY);
    gw_u32(&w, 4000000000u);
    gw_u64(&w, 1);
    gw_u64(&w, 0);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "key 'x.arr'", "unknown element type 4000000000");
    return 0;
}

/* Arrays of arrays, nested many levels deep: refused at the first level. */
static int t_nested_array_bomb(void) {
    gw w = {0};
    gw_header(&w, 3, 0, 1);
    gw_key(&w, "bomb", HKV_GGUF_ARRAY);
    for (int i = 0; i < 10000; i++) {
        gw_u32(&w, HKV_GGUF_ARRAY);
        gw_u64(&w, 1);
    }
    gw_u32(&w, HKV_GGUF_U8);
    gw_u64(&w, 1);
    gw_u8(&w, 0);
    EXPECT_FAIL(&w, HKV_E_UNSUPPORTED, "key 'bomb'", "arrays of arrays");
    return 0;
}

static int t_n_dims_0(void) {
    gw w = {0};
    one_tensor(&w, "blk.0.attn_q.weight", 0, NE1, HKV_GGML_F32, 0, 128);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "tensor 'blk.0.attn_q.weight' has n_dims = 0");
    return 0;
}

static int t_n_dims_5(void) {
    gw w = {0};
    gw_header(&w, 3, 1, 0);
    gw_str(&w, "t5");
    gw_u32(&w, 5);
    for (int d = 0; d < 5; d++) gw_u64(&w, 1);
    gw_u32(&w, HKV_GGML_F32);
    gw_u64(&w, 0);
    gw_pad(&w, 32);
    gw_u32(&w, 0);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "tensor 't5' has n_dims = 5");
    return 0;
}

static int t_zero_dim(void) {
    gw w = {0};
    const uint64_t ne[2] = {32, 0};
    one_tensor(&w, "blk.0.attn_k.weight", 2, ne, HKV_GGML_F32, 0, 128);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "tensor 'blk.0.attn_k.weight' has ne[1] = 0");
    return 0;
}

static int t_element_count_overflow(void) {
    gw w = {0};
    const uint64_t ne[3] = {UINT64_C(1) << 31, UINT64_C(1) << 31, 4}; /* 2^62 x 4 */
    one_tensor(&w, "big", 3, ne, HKV_GGML_F32, 0, 64);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "tensor 'big'", "element count overflows at ne[2]");
    return 0;
}

static int t_dim_above_int64(void) {
    gw w = {0};
    const uint64_t ne[1] = {UINT64_C(1) << 63};
    one_tensor(&w, "big", 1, ne, HKV_GGML_F32, 0, 64);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "tensor 'big'", "element count overflows at ne[0]");
    return 0;
}

static int t_byte_size_overflow(void) {
    gw w = {0};
    const uint64_t ne[1] = {UINT64_C(1) << 62}; /* count fits int64, bytes (x4) do not */
    one_tensor(&w, "big", 1, ne, HKV_GGML_F32, 0, 64);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "tensor 'big'", "size in bytes overflows");
    return 0;
}

static int t_unknown_tensor_type(void) {
    gw w = {0};
    one_tensor(&w, "blk.0.attn_q.weight", 1, NE1, 77, 0, 128);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "tensor 'blk.0.attn_q.weight' has unknown type 77");
    return 0;
}

static int t_retired_tensor_type(void) {
    gw w = {0};
    one_tensor(&w, "w", 1, NE1, 4 /* was Q4_2 */, 0, 128);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "tensor 'w' has unknown type 4");
    return 0;
}

static int t_ne0_not_block_multiple(void) {
    gw w = {0};
    const uint64_t ne[2] = {48, 2};
    one_tensor(&w, "blk.3.ffn_up.weight", 2, ne, HKV_GGML_Q4_0, 0, 256);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "tensor 'blk.3.ffn_up.weight' (type q4_0)",
                "ne[0] = 48 is not a multiple of the block size 32");
    return 0;
}

static int t_misaligned_offset(void) {
    gw w = {0};
    one_tensor(&w, "w", 1, NE1, HKV_GGML_F32, 4, 256);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "tensor 'w' has offset 4, not a multiple of the alignment 32");
    return 0;
}

static int t_tensor_past_end(void) {
    gw w = {0};
    one_tensor(&w, "output.weight", 1, NE1, HKV_GGML_F32, 32, 100);
    /* header 24 + info 8+13+4+8+4+8 = 69 -> data at 96; ends at 96+32+128 = 256; size 196 */
    EXPECT_FAIL(&w, HKV_E_FORMAT, "tensor 'output.weight'",
                "ends at file offset 256, past the end of the file (size 196)");
    return 0;
}

static int t_tensor_offset_wraps(void) {
    gw w = {0};
    one_tensor(&w, "w", 1, NE1, HKV_GGML_F32, UINT64_MAX - 31, 128);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "tensor 'w'", "beyond 2^64");
    return 0;
}

static int t_overlapping_tensors(void) {
    gw w = {0};
    const uint64_t ne[1] = {64}; /* 256 bytes of f32 */
    gw_header(&w, 3, 2, 0);
    gw_tensor(&w, "a", 1, ne, HKV_GGML_F32, 0);
    gw_tensor(&w, "b", 1, NE1, HKV_GGML_F32, 128); /* inside a */
    gw_pad(&w, 32);
    for (int i = 0; i < 256; i++) gw_u8(&w, 0);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "tensors 'a' and 'b' overlap (offsets 0 and 128)");
    return 0;
}

static int t_duplicate_keys(void) {
    gw w = {0};
    gw_header(&w, 3, 0, 3);
    gw_kv_str(&w, "general.name", "a");
    gw_kv_u32(&w, "llama.block_count", 2);
    gw_kv_str(&w, "general.name", "b");
    EXPECT_FAIL(&w, HKV_E_FORMAT, "duplicate key 'general.name'");
    return 0;
}

static int t_duplicate_tensor_names(void) {
    gw w = {0};
    gw_header(&w, 3, 2, 0);
    gw_tensor(&w, "blk.0.attn_v.weight", 1, NE1, HKV_GGML_F32, 0);
    gw_tensor(&w, "blk.0.attn_v.weight", 1, NE1, HKV_GGML_F32, 128);
    gw_pad(&w, 32);
    for (int i = 0; i < 256; i++) gw_u8(&w, 0);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "duplicate tensor name 'blk.0.attn_v.weight'");
    return 0;
}

static int t_alignment_0(void) {
    gw w = {0};
    gw_header(&w, 3, 0, 1);
    gw_kv_u32(&w, "general.alignment", 0);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "general.alignment = 0 is not a nonzero power of two");
    return 0;
}

static int t_alignment_3(void) {
    gw w = {0};
    gw_header(&w, 3, 0, 1);
    gw_kv_u32(&w, "general.alignment", 3);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "general.alignment = 3 is not a nonzero power of two");
    return 0;
}

static int t_alignment_wrong_type(void) {
    gw w = {0};
    gw_header(&w, 3, 0, 1);
    gw_key(&w, "general.alignment", HKV_GGUF_U64);
    gw_u64(&w, 32);
    EXPECT_FAIL(&w, HKV_E_FORMAT, "general.alignment has type u64, expected u32");
    return 0;
}

static int t_data_section_past_end(void) {
    gw w = {0};
    gw_header(&w, 3, 1, 0);
    gw_tensor(&w, "w", 1, NE1, HKV_GGML_F32, 0); /* file ends right after the info */
    EXPECT_FAIL(&w, HKV_E_FORMAT, "data section would start at offset 64",
                "past the end of the file (size 57)");
    return 0;
}

/* ---- getters on a valid file ------------------------------------------ */

static hkv_gguf *open_valid(gw *w) {
    gw_build_valid(w, 3, 0);
    hkv_gguf *g = NULL;
    hkv_err e;
    if (hkv_gguf_open_buffer(&g, w->p, w->n, &e) != HKV_OK) fprintf(stderr, "  %s\n", e.msg);
    return g;
}

#define EXPECT_GET(call, code, ...)                                                    \
    do {                                                                               \
        hkv_err_clear(&e);                                                             \
        int rc_ = (call);                                                              \
        CHECK(rc_ == (code), "%s: rc %s, want %s (%s)", #call, hkv_status_name(rc_),    \
              #code, e.msg);                                                           \
        const char *nd_[] = {__VA_ARGS__};                                             \
        for (size_t i_ = 0; i_ < sizeof nd_ / sizeof nd_[0]; i_++)                     \
            CHECK(strstr(e.msg, nd_[i_]), "message lacks \"%s\": %s", nd_[i_], e.msg); \
    } while (0)

static int getters(hkv_gguf *g, int missing) {
    hkv_err e;
    int64_t i64;
    uint32_t u32;
    float f;
    int b;
    hkv_str s;
    const hkv_gguf_kv *kv;
    if (missing) {
        EXPECT_GET(hkv_gguf_get_i64(g, "llama.context_length", &i64, &e), HKV_E_NOTFOUND,
                   "'llama.context_length' not found");
        EXPECT_GET(hkv_gguf_get_u32(g, "llama.context_length", &u32, &e), HKV_E_NOTFOUND,
                   "'llama.context_length' not found");
        EXPECT_GET(hkv_gguf_get_f32(g, "x.eps", &f, &e), HKV_E_NOTFOUND, "'x.eps' not found");
        EXPECT_GET(hkv_gguf_get_bool(g, "x.flag", &b, &e), HKV_E_NOTFOUND, "'x.flag'");
        EXPECT_GET(hkv_gguf_get_str(g, "general.name", &s, &e), HKV_E_NOTFOUND, "'general.name'");
        EXPECT_GET(hkv_gguf_get_arr(g, "tokenizer.ggml.merges", HKV_GGUF_STRING, &kv, &e),
                   HKV_E_NOTFOUND, "'tokenizer.ggml.merges' not found");
        EXPECT_GET(hkv_gguf_get_i64(NULL, "a", &i64, &e), HKV_E_INVAL, "NULL");
        EXPECT_GET(hkv_gguf_get_i64(g, NULL, &i64, &e), HKV_E_INVAL, "NULL");
        EXPECT_GET(hkv_gguf_get_i64(g, "a", NULL, &e), HKV_E_INVAL, "NULL");
        return 0;
    }
    EXPECT_GET(hkv_gguf_get_u32(g, "general.architecture", &u32, &e), HKV_E_FORMAT,
               "'general.architecture' has type string, expected an integer");
    EXPECT_GET(hkv_gguf_get_i64(g, "t.f32", &i64, &e), HKV_E_FORMAT, "'t.f32' has type f32");
    EXPECT_GET(hkv_gguf_get_str(g, "llama.block_count", &s, &e), HKV_E_FORMAT,
               "'llama.block_count' has type u32, expected string");
    EXPECT_GET(hkv_gguf_get_bool(g, "t.u8", &b, &e), HKV_E_FORMAT, "'t.u8' has type u8, expected bool");
    EXPECT_GET(hkv_gguf_get_f32(g, "t.i32", &f, &e), HKV_E_FORMAT, "expected f32 or f64");
    EXPECT_GET(hkv_gguf_get_arr(g, "tokenizer.ggml.tokens", HKV_GGUF_I32, &kv, &e), HKV_E_FORMAT,
               "'tokenizer.ggml.tokens' is an array of string, expected an array of i32");
    EXPECT_GET(hkv_gguf_get_arr(g, "llama.block_count", HKV_GGUF_U32, &kv, &e), HKV_E_FORMAT,
               "has type u32, expected an array of u32");
    EXPECT_GET(hkv_gguf_get_u32(g, "tokenizer.ggml.token_type", &u32, &e), HKV_E_FORMAT,
               "is an array of i32, expected an integer");
    /* values that do not fit the requested type */
    EXPECT_GET(hkv_gguf_get_u32(g, "t.i8", &u32, &e), HKV_E_RANGE, "'t.i8' = -100 does not fit in u32");
    EXPECT_GET(hkv_gguf_get_u32(g, "t.u64", &u32, &e), HKV_E_RANGE, "'t.u64' = 1099511627776");
    return 0;
}

static int t_getter_missing_key(void) {
    gw w = {0};
    hkv_gguf *g = open_valid(&w);
    CHECK(g, "valid file must open");
    int bad = getters(g, 1);
    hkv_gguf_close(g);
    gw_free(&w);
    return bad;
}

static int t_getter_wrong_type(void) {
    gw w = {0};
    hkv_gguf *g = open_valid(&w);
    CHECK(g, "valid file must open");
    int bad = getters(g, 0);
    hkv_gguf_close(g);
    gw_free(&w);
    return bad;
}

static int t_getter_out_of_range(void) {
    gw w = {0};
    gw_header(&w, 3, 0, 3);
    gw_key(&w, "big.u64", HKV_GGUF_U64);
    gw_u64(&w, UINT64_C(1) << 63);
    gw_key(&w, "big.f64", HKV_GGUF_F64);
    gw_f64(&w, 1e300);
    gw_key(&w, "neg.i64", HKV_GGUF_I64);
    gw_u64(&w, (uint64_t)-5);
    hkv_gguf *g = NULL;
    hkv_err e;
    CHECK(hkv_gguf_open_buffer(&g, w.p, w.n, &e) == HKV_OK, "%s", e.msg);
    int64_t i64;
    uint32_t u32;
    float f;
    int bad = 1;
    do {
        EXPECT_GET(hkv_gguf_get_i64(g, "big.u64", &i64, &e), HKV_E_RANGE,
                   "'big.u64' = 9223372036854775808 does not fit in int64");
        EXPECT_GET(hkv_gguf_get_f32(g, "big.f64", &f, &e), HKV_E_RANGE, "'big.f64'", "does not fit in f32");
        EXPECT_GET(hkv_gguf_get_u32(g, "neg.i64", &u32, &e), HKV_E_RANGE, "'neg.i64' = -5");
        EXPECT_GET(hkv_gguf_get_i64(g, "neg.i64", &i64, &e), HKV_OK, "");
        CHECK(i64 == -5, "neg.i64 = %lld", (long long)i64);
        bad = 0;
    } while (0);
    hkv_gguf_close(g);
    gw_free(&w);
    return bad;
}

/* ---- files and arguments ----------------------------------------------- */

static int t_open_missing_file(void) {
    hkv_gguf *g = NULL;
    hkv_err e;
    int rc = hkv_gguf_open(&g, "/nonexistent/dir/model.gguf", &e);
    CHECK(rc == HKV_E_IO && g == NULL, "rc %d", rc);
    CHECK(strstr(e.msg, "/nonexistent/dir/model.gguf: cannot open"), "%s", e.msg);
    rc = hkv_gguf_open(&g, "/", &e);
    CHECK(rc == HKV_E_IO && strstr(e.msg, "not a regular file"), "directory: %s", e.msg);
    return 0;
}

static int t_open_empty_and_bad_file(void) {
    const char *dir = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/hkv_gguf_hostile_XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    hkv_gguf *g = NULL;
    hkv_err e;
    int rc = hkv_gguf_open(&g, path, &e);
    int ok_empty = rc == HKV_E_FORMAT && strstr(e.msg, "file is empty") && strstr(e.msg, path);
    /* a file whose tensor runs past the end: the message starts with the path */
    gw w = {0};
    one_tensor(&w, "w", 1, NE1, HKV_GGML_F32, 0, 10);
    int wr = write(fd, w.p, w.n) == (ssize_t)w.n;
    close(fd);
    rc = hkv_gguf_open(&g, path, &e);
    unlink(path);
    gw_free(&w);
    CHECK(ok_empty, "empty file: %s", e.msg);
    CHECK(wr, "write");
    CHECK(rc == HKV_E_FORMAT && g == NULL, "rc %d", rc);
    CHECK(strncmp(e.msg, path, strlen(path)) == 0 && strstr(e.msg, "tensor 'w'"), "%s", e.msg);
    return 0;
}

static int t_null_arguments(void) {
    hkv_err e;
    hkv_gguf *g = NULL;
    CHECK(hkv_gguf_open_buffer(NULL, "GGUF", 4, &e) == HKV_E_INVAL, "NULL out");
    CHECK(hkv_gguf_open_buffer(&g, NULL, 4, &e) == HKV_E_INVAL && g == NULL, "NULL buffer");
    CHECK(hkv_gguf_open_buffer(&g, NULL, 0, &e) == HKV_E_FORMAT && g == NULL, "empty buffer: %s", e.msg);
    CHECK(strstr(e.msg, "truncated"), "%s", e.msg);
    CHECK(hkv_gguf_open(&g, NULL, &e) == HKV_E_INVAL, "NULL path");
    CHECK(hkv_gguf_open_buffer(&g, "GGUF", 4, NULL) == HKV_E_FORMAT, "NULL err is allowed");
    hkv_gguf_close(NULL);
    return 0;
}

static const tcase cases[] = {
    {"truncation_every_prefix", t_truncation_every_prefix},
    {"random_corruption", t_random_corruption},
    {"bad_magic", t_bad_magic},
    {"version_1", t_version_1},
    {"version_99", t_version_99},
    {"version_big_endian", t_version_big_endian},
    {"absurd_n_kv", t_absurd_n_kv},
    {"absurd_n_tensors", t_absurd_n_tensors},
    {"counts_together_too_big", t_counts_together_too_big},
    {"key_length_past_end", t_key_length_past_end},
    {"string_value_huge_length", t_string_value_huge_length},
    {"huge_array_count", t_huge_array_count},
    {"huge_string_array_count", t_huge_string_array_count},
    {"string_in_array_past_end", t_string_in_array_past_end},
    {"unknown_value_type", t_unknown_value_type},
    {"unknown_array_elem_type", t_unknown_array_elem_type},
    {"nested_array_bomb", t_nested_array_bomb},
    {"n_dims_0", t_n_dims_0},
    {"n_dims_5", t_n_dims_5},
    {"zero_dim", t_zero_dim},
    {"element_count_overflow", t_element_count_overflow},
    {"dim_above_int64", t_dim_above_int64},
    {"byte_size_overflow", t_byte_size_overflow},
    {"unknown_tensor_type", t_unknown_tensor_type},
    {"retired_tensor_type", t_retired_tensor_type},
    {"ne0_not_block_multiple", t_ne0_not_block_multiple},
    {"misaligned_offset", t_misaligned_offset},
    {"tensor_past_end", t_tensor_past_end},
    {"tensor_offset_wraps", t_tensor_offset_wraps},
    {"overlapping_tensors", t_overlapping_tensors},
    {"duplicate_keys", t_duplicate_keys},
    {"duplicate_tensor_names", t_duplicate_tensor_names},
    {"alignment_0", t_alignment_0},
    {"alignment_3", t_alignment_3},
    {"alignment_wrong_type", t_alignment_wrong_type},
    {"data_section_past_end", t_data_section_past_end},
    {"getter_missing_key", t_getter_missing_key},
    {"getter_wrong_type", t_getter_wrong_type},
    {"getter_out_of_range", t_getter_out_of_range},
    {"open_missing_file", t_open_missing_file},
    {"open_empty_and_bad_file", t_open_empty_and_bad_file},
    {"null_arguments", t_null_arguments},
};

int main(int argc, char **argv) {
    return tcase_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
}
