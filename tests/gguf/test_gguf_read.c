/* Valid GGUF files built in memory (v2 and v3, every value type, string
 * arrays, six tensors of several types, default and custom alignments) read
 * back through hkv_gguf_open_buffer and, from a temp file, hkv_gguf_open.
 * Also the ggml type table, row sizes and scalar conversions at known points. */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "ggml_types.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "tcase.h"

static const struct {
    const char *name;
    int type, n_dims;
    int64_t ne[4];
} want_t[] = {
    {"token_embd.weight", HKV_GGML_Q8_0, 2, {64, 3, 1, 1}},
    {"blk.0.attn_norm.weight", HKV_GGML_F32, 1, {5, 1, 1, 1}},
    {"blk.0.attn_q.weight", HKV_GGML_Q4_1, 2, {32, 2, 1, 1}},
    {"blk.0.ffn_up.weight", HKV_GGML_F16, 3, {3, 2, 2, 1}},
    {"blk.0.ffn_down.weight", HKV_GGML_Q6_K, 1, {256, 1, 1, 1}},
    {"output.weight", HKV_GGML_BF16, 4, {2, 1, 3, 2}},
};

/* Everything gw_build_valid wrote, checked through the public API. */
static int check_valid(const hkv_gguf *g, uint32_t version, uint32_t alignment) {
    hkv_err err;
    hkv_err_clear(&err);
    CHECK(g->version == version, "version %u", g->version);
    CHECK(g->n_kv == (alignment ? 18u : 17u), "n_kv %llu", (unsigned long long)g->n_kv);
    CHECK(g->n_tensors == 6, "n_tensors %llu", (unsigned long long)g->n_tensors);
    CHECK(g->alignment == (alignment ? alignment : 32u), "alignment %llu",
          (unsigned long long)g->alignment);

    hkv_str s;
    CHECK(hkv_gguf_get_str(g, "general.architecture", &s, &err) == HKV_OK, "%s", err.msg);
    CHECK(hkv_str_eq(s, "llama"), "arch '%.*s'", (int)s.len, s.ptr);
    CHECK(hkv_gguf_get_str(g, "t.empty_str", &s, &err) == HKV_OK && s.len == 0, "%s", err.msg);

    uint32_t u32;
    int64_t i64;
    CHECK(hkv_gguf_get_u32(g, "llama.block_count", &u32, &err) == HKV_OK && u32 == 30, "%s", err.msg);
    CHECK(hkv_gguf_get_i64(g, "llama.block_count", &i64, &err) == HKV_OK && i64 == 30, "%s", err.msg);
    CHECK(hkv_gguf_get_u32(g, "t.u8", &u32, &err) == HKV_OK && u32 == 200, "u8 %u", u32);
    CHECK(hkv_gguf_get_i64(g, "t.i8", &i64, &err) == HKV_OK && i64 == -100, "i8 %lld", (long long)i64);
    CHECK(hkv_gguf_get_u32(g, "t.u16", &u32, &err) == HKV_OK && u32 == 60000, "u16 %u", u32);
    CHECK(hkv_gguf_get_i64(g, "t.i16", &i64, &err) == HKV_OK && i64 == -30000, "i16");
    CHECK(hkv_gguf_get_i64(g, "t.i32", &i64, &err) == HKV_OK && i64 == -2000000000, "i32");
    CHECK(hkv_gguf_get_i64(g, "t.u64", &i64, &err) == HKV_OK && i64 == (INT64_C(1) << 40), "u64");
    CHECK(hkv_gguf_get_i64(g, "t.i64", &i64, &err) == HKV_OK && i64 == INT64_MIN, "i64");
    float f;
    CHECK(hkv_gguf_get_f32(g, "t.f32", &f, &err) == HKV_OK && f == 1e-5f, "f32 %g", f);
    CHECK(hkv_gguf_get_f32(g, "t.f64", &f, &err) == HKV_OK && f == 10000.5f, "f64 %g", f);
    int b = 0;
    CHECK(hkv_gguf_get_bool(g, "t.bool", &b, &err) == HKV_OK && b == 1, "bool");

    const hkv_gguf_kv *kv;
    CHECK(hkv_gguf_get_arr(g, "tokenizer.ggml.tokens", HKV_GGUF_STRING, &kv, &err) == HKV_OK,
          "%s", err.msg);
    CHECK(kv->arr_n == 4 && kv->arr_str, "tokens n %llu", (unsigned long long)kv->arr_n);
    CHECK(hkv_str_eq(kv->arr_str[0], "<s>") && kv->arr_str[1].len == 0 &&
          hkv_str_eq(kv->arr_str[2], "hello") && hkv_str_eq(kv->arr_str[3], "\xe2\x96\x81world"),
          "token strings");
    CHECK(hkv_gguf_get_arr(g, "tokenizer.ggml.token_type", HKV_GGUF_I32, &kv, &err) == HKV_OK,
          "%s", err.msg);
    CHECK(kv->arr_n == 3 && kv->val[4] == 0xff && kv->val[8] == 6, "token_type values");
    CHECK(hkv_gguf_get_arr(g, "t.empty_arr", HKV_GGUF_F32, &kv, &err) == HKV_OK && kv->arr_n == 0,
          "empty array");
    CHECK(hkv_gguf_get_arr(g, "t.f64_arr", HKV_GGUF_F64, &kv, &err) == HKV_OK && kv->arr_n == 2,
          "f64 array");
    double d1;
    memcpy(&d1, kv->val + 8, 8); /* little-endian host, as the test machines are */
    CHECK(d1 == -3.0, "f64_arr[1] %g", d1);
    CHECK(hkv_gguf_find(g, "no.such.key") == NULL, "find missing key");

    const uint8_t *base = g->map;
    for (int t = 0; t < 6; t++) {
        const hkv_gguf_tensor *ti = hkv_gguf_find_tensor(g, want_t[t].name);
        CHECK(ti, "tensor %s not found", want_t[t].name);
        CHECK(ti->type == want_t[t].type && ti->n_dims == want_t[t].n_dims, "%s type/n_dims",
              want_t[t].name);
        for (int d = 0; d < 4; d++) CHECK(ti->ne[d] == want_t[t].ne[d], "%s ne[%d]", want_t[t].name, d);
        CHECK(ti->offset % g->alignment == 0, "%s offset %llu", want_t[t].name,
              (unsigned long long)ti->offset);
        CHECK((const uint8_t *)ti->data == g->data + ti->offset, "%s data pointer", want_t[t].name);
        CHECK((size_t)(g->data - base) % g->alignment == 0, "data section alignment");
        int64_t nel = ti->ne[0] * ti->ne[1] * ti->ne[2] * ti->ne[3];
        size_t want_bytes = hkv_ggml_row_bytes(ti->type, ti->ne[0]) * (size_t)(nel / ti->ne[0]);
        CHECK(ti->nbytes == want_bytes, "%s nbytes %zu", want_t[t].name, ti->nbytes);
        CHECK((const uint8_t *)ti->data + ti->nbytes <= base + g->size, "%s inside", want_t[t].name);
        for (size_t k = 0; k < ti->nbytes; k++)
            CHECK(((const uint8_t *)ti->data)[k] == gw_tensor_byte(t, k), "%s byte %zu", want_t[t].name, k);
    }
    CHECK(hkv_gguf_find_tensor(g, "missing.weight") == NULL, "find missing tensor");
    return 0;
}

static const uint32_t aligns[] = {0, 1, 8, 64, 256};

static int t_valid_buffer(void) {
    for (uint32_t v = 2; v <= 3; v++) {
        for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
            gw w = {0};
            gw_build_valid(&w, v, aligns[a]);
            /* exact-size copy so sanitizers see any read past the end */
            uint8_t *buf = malloc(w.n);
            CHECK(buf, "malloc");
            memcpy(buf, w.p, w.n);
            hkv_gguf *g = NULL;
            hkv_err err;
            int rc = hkv_gguf_open_buffer(&g, buf, w.n, &err);
            CHECK(rc == HKV_OK, "v%u align %u: %s", v, aligns[a], err.msg);
            int bad = check_valid(g, v, aligns[a]);
            hkv_gguf_close(g);
            free(buf);
            gw_free(&w);
            CHECK(!bad, "v%u align %u", v, aligns[a]);
        }
    }
    return 0;
}

static int t_valid_file(void) {
    for (uint32_t v = 2; v <= 3; v++) {
        gw w = {0};
        gw_build_valid(&w, v, v == 3 ? 64 : 0);
        const char *dir = getenv("TMPDIR");
        char path[512];
        snprintf(path, sizeof path, "%s/hkv_gguf_read_XXXXXX", dir && *dir ? dir : "/tmp");
        int fd = mkstemp(path);
        CHECK(fd >= 0, "mkstemp %s", path);
        CHECK(write(fd, w.p, w.n) == (ssize_t)w.n, "write");
        close(fd);
        hkv_gguf *g = NULL;
        hkv_err err;
        int rc = hkv_gguf_open(&g, path, &err);
        unlink(path);
        CHECK(rc == HKV_OK, "%s", err.msg);
        CHECK(g->owns_map == 1 && g->size == w.n, "mapping");
        int bad = check_valid(g, v, v == 3 ? 64 : 0);
        hkv_gguf_close(g);
        gw_free(&w);
        CHECK(!bad, "file v%u", v);
    }
    return 0;
}

/* A file with no tensors and no data section at all is valid. */
static int t_no_tensors(void) {
    gw w = {0};
    gw_header(&w, 3, 0, 1);
    gw_kv_u32(&w, "a", 1);
    hkv_gguf *g = NULL;
    hkv_err err;
    int rc = hkv_gguf_open_buffer(&g, w.p, w.n, &err);
    CHECK(rc == HKV_OK, "%s", err.msg);
    CHECK(g->n_tensors == 0 && g->n_kv == 1, "counts");
    hkv_gguf_close(g);
    gw_free(&w);
    hkv_gguf_close(NULL);
    return 0;
}

static int t_type_table(void) {
    static const struct { int t; const char *name; int bs, ts, dq; } want[] = {
        {HKV_GGML_F32, "f32", 1, 4, 1},      {HKV_GGML_F16, "f16", 1, 2, 1},
        {HKV_GGML_Q4_0, "q4_0", 32, 18, 1},  {HKV_GGML_Q4_1, "q4_1", 32, 20, 1},
        {HKV_GGML_Q5_0, "q5_0", 32, 22, 1},  {HKV_GGML_Q5_1, "q5_1", 32, 24, 1},
        {HKV_GGML_Q8_0, "q8_0", 32, 34, 1},  {HKV_GGML_Q8_1, "q8_1", 32, 36, 0},
        {HKV_GGML_Q2_K, "q2_K", 256, 84, 1}, {HKV_GGML_Q3_K, "q3_K", 256, 110, 1},
        {HKV_GGML_Q4_K, "q4_K", 256, 144, 1}, {HKV_GGML_Q5_K, "q5_K", 256, 176, 1},
        {HKV_GGML_Q6_K, "q6_K", 256, 210, 1}, {HKV_GGML_Q8_K, "q8_K", 256, 292, 1},
        {HKV_GGML_I8, "i8", 1, 1, 0},         {HKV_GGML_I16, "i16", 1, 2, 0},
        {HKV_GGML_I32, "i32", 1, 4, 0},       {HKV_GGML_I64, "i64", 1, 8, 0},
        {HKV_GGML_F64, "f64", 1, 8, 0},       {HKV_GGML_BF16, "bf16", 1, 2, 1},
        {HKV_GGML_IQ2_XXS, "iq2_xxs", 256, 66, 0}, {HKV_GGML_IQ4_NL, "iq4_nl", 32, 18, 0},
        {HKV_GGML_IQ4_XS, "iq4_xs", 256, 136, 0},  {HKV_GGML_IQ1_M, "iq1_m", 256, 56, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        hkv_ggml_type_info ti = hkv_ggml_type_get(want[i].t);
        CHECK(ti.name && strcmp(ti.name, want[i].name) == 0, "type %d name", want[i].t);
        CHECK(ti.block_size == want[i].bs && ti.type_size == want[i].ts &&
              ti.can_dequant == want[i].dq, "type %s geometry", want[i].name);
    }
    static const int unknown[] = {-1, 4, 5, 31, 32, 33, 63, 64, 1000};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++)
        CHECK(hkv_ggml_type_get(unknown[i]).name == NULL, "type %d should be unknown", unknown[i]);
    CHECK(hkv_ggml_row_bytes(HKV_GGML_Q4_0, 64) == 36, "q4_0 row");
    CHECK(hkv_ggml_row_bytes(HKV_GGML_Q6_K, 512) == 420, "q6_K row");
    CHECK(hkv_ggml_row_bytes(HKV_GGML_Q4_0, 33) == 0, "not a block multiple");
    CHECK(hkv_ggml_row_bytes(HKV_GGML_F32, -4) == 0, "negative");
    CHECK(hkv_ggml_row_bytes(77, 32) == 0, "unknown type");
    CHECK(hkv_ggml_row_bytes(HKV_GGML_F64, INT64_MAX) == 0, "overflow");
    float out[256];
    CHECK(hkv_ggml_dequant_row(HKV_GGML_IQ4_NL, out, out, 32) == HKV_E_UNSUPPORTED, "iq4_nl");
    CHECK(hkv_ggml_dequant_row(77, out, out, 32) == HKV_E_UNSUPPORTED, "unknown");
    CHECK(hkv_ggml_dequant_row(HKV_GGML_Q4_0, out, out, 31) == HKV_E_INVAL, "n not a block multiple");
    CHECK(hkv_ggml_dequant_row(HKV_GGML_Q4_0, out, out, -32) == HKV_E_INVAL, "n < 0");
    CHECK(hkv_ggml_dequant_row(HKV_GGML_Q4_0, NULL, out, 32) == HKV_E_INVAL, "NULL src");
    CHECK(hkv_ggml_dequant_row(HKV_GGML_Q4_0, NULL, NULL, 0) == HKV_OK, "n = 0");
    return 0;
}

static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float fl(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Known points; the exhaustive and random comparison is in the dequant test. */
static int t_half_conversions(void) {
    CHECK(hkv_fp16_to_f32(0x3c00) == 1.0f, "1.0");
    CHECK(hkv_fp16_to_f32(0x7bff) == 65504.0f, "max half");
    CHECK(hkv_fp16_to_f32(0x0001) == 0x1p-24f, "smallest subnormal");
    CHECK(hkv_fp16_to_f32(0x03ff) == 1023 * 0x1p-24f, "largest subnormal");
    CHECK(bits(hkv_fp16_to_f32(0x8000)) == 0x80000000u, "-0");
    CHECK(isinf(hkv_fp16_to_f32(0xfc00)) && hkv_fp16_to_f32(0xfc00) < 0, "-inf");
    CHECK(bits(hkv_fp16_to_f32(0x7d01)) == 0x7fa02000u, "sNaN payload kept");
    static const struct { uint32_t in; uint16_t out; } h[] = {
        {0x3f800000u, 0x3c00}, {0x477fe000u, 0x7bff}, /* 65504 */
        {0x477fefffu, 0x7bff}, {0x477ff000u, 0x7c00}, /* 65520 ties to even: inf */
        {0x7f800000u, 0x7c00}, {0xff800000u, 0xfc00}, {0x7f7fffffu, 0x7c00},
        {0x33000000u, 0x0000}, /* 2^-25 ties to even: 0 */
        {0x33000001u, 0x0001}, {0x33c00000u, 0x0002}, /* 1.5 * 2^-24 ties to 2 */
        {0x34200000u, 0x0002}, /* 2.5 * 2^-24 ties to 2 */
        {0x387fe000u, 0x0400}, /* 1023.5 * 2^-24 rounds up into the first normal */
        {0x38800000u, 0x0400}, {0x80000000u, 0x8000}, {0xb3000001u, 0x8001},
        {0x3f801000u, 0x3c00}, {0x3f803000u, 0x3c02}, /* mantissa ties to even */
        {0x3f802001u, 0x3c01}, {0x7fc00000u, 0x7e00}, {0xffc00001u, 0xfe00},
        {0x7f800001u, 0x7e00}, /* sNaN becomes quiet, stays NaN */
    };
    for (size_t i = 0; i < sizeof h / sizeof h[0]; i++)
        CHECK(hkv_f32_to_fp16(fl(h[i].in)) == h[i].out, "f32 0x%08x -> 0x%04x, want 0x%04x",
              h[i].in, hkv_f32_to_fp16(fl(h[i].in)), h[i].out);
    static const struct { uint32_t in; uint16_t out; } bf[] = {
        {0x3f800000u, 0x3f80}, {0x3f808000u, 0x3f80}, {0x3f818000u, 0x3f82},
        {0x3f808001u, 0x3f81}, {0x7f7fffffu, 0x7f80}, {0xff800000u, 0xff80},
        {0x7f800001u, 0x7fc0}, {0x00000001u, 0x0000}, {0x80018000u, 0x8002},
    };
    for (size_t i = 0; i < sizeof bf / sizeof bf[0]; i++)
        CHECK(hkv_f32_to_bf16(fl(bf[i].in)) == bf[i].out, "f32 0x%08x -> bf16 0x%04x, want 0x%04x",
              bf[i].in, hkv_f32_to_bf16(fl(bf[i].in)), bf[i].out);
    CHECK(bits(hkv_bf16_to_f32(0xc049)) == 0xc0490000u, "bf16 -> f32");
    /* every half survives a round trip through f32 (NaNs come back quiet) */
    for (uint32_t x = 0; x < 0x10000u; x++) {
        uint16_t back = hkv_f32_to_fp16(hkv_fp16_to_f32((uint16_t)x));
        int nan = (x & 0x7c00u) == 0x7c00u && (x & 0x3ffu);
        CHECK(nan ? back == (x | 0x200u) : back == x, "round trip 0x%04x -> 0x%04x", x, back);
    }
    return 0;
}

static const tcase cases[] = {
    {"valid_buffer_v2_v3_alignments", t_valid_buffer},
    {"valid_file_mmap", t_valid_file},
    {"no_tensors", t_no_tensors},
    {"ggml_type_table", t_type_table},
    {"half_bf16_known_points", t_half_conversions},
};

int main(int argc, char **argv) {
    return tcase_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
}
