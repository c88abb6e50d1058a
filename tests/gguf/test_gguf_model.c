/* The real SmolLM2-135M-Instruct Q4_1 file through hkv_gguf_open (mmap).
 *
 * usage: test_gguf_model MODEL [DIR]
 * Exit 77 (meson's skip) when MODEL is absent. Checks the facts of that file;
 * with DIR (written by model_ref.py from gguf-py) also every tensor's type,
 * dims and absolute offset and a few dequantised rows, bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ggml_types.h"
#include "gguf.h"
#include "tcase.h"

static int check_facts(const hkv_gguf *g) {
    hkv_err e;
    hkv_str s;
    uint32_t u;
    CHECK(g->version == 3, "version %u", g->version);
    CHECK(g->n_tensors == 272, "n_tensors %llu", (unsigned long long)g->n_tensors);
    CHECK(hkv_gguf_get_str(g, "general.architecture", &s, &e) == HKV_OK, "%s", e.msg);
    CHECK(hkv_str_eq(s, "llama"), "architecture '%.*s'", (int)s.len, s.ptr);
    CHECK(hkv_gguf_get_u32(g, "llama.block_count", &u, &e) == HKV_OK && u == 30, "block_count");
    const hkv_gguf_tensor *t = hkv_gguf_find_tensor(g, "token_embd.weight");
    CHECK(t, "token_embd.weight missing");
    CHECK(t->type == HKV_GGML_Q8_0, "token_embd type %d", t->type);
    CHECK(t->n_dims == 2 && t->ne[0] == 576 && t->ne[1] == 49152, "token_embd ne [%lld, %lld]",
          (long long)t->ne[0], (long long)t->ne[1]);
    CHECK(t->nbytes == (size_t)49152 * 18 * 34, "token_embd nbytes %zu", t->nbytes);
    const hkv_gguf_kv *kv;
    CHECK(hkv_gguf_get_arr(g, "tokenizer.ggml.tokens", HKV_GGUF_STRING, &kv, &e) == HKV_OK,
          "%s", e.msg);
    CHECK(kv->arr_n == 49152, "vocab %llu", (unsigned long long)kv->arr_n);
    return 0;
}

static int check_table(const hkv_gguf *g, const char *dir) {
    char path[1024], name[256];
    snprintf(path, sizeof path, "%s/meta.txt", dir);
    FILE *f = fopen(path, "r");
    CHECK(f, "open %s", path);
    unsigned long long n_kv = 0;
    int got = fscanf(f, "n_kv %llu", &n_kv);
    fclose(f);
    CHECK(got == 1 && n_kv == g->n_kv, "n_kv %llu, gguf-py %llu", (unsigned long long)g->n_kv, n_kv);
    snprintf(path, sizeof path, "%s/tensors.txt", dir);
    f = fopen(path, "r");
    CHECK(f, "open %s", path);
    int type, nd, rows = 0, bad = 0;
    long long ne[4];
    unsigned long long off;
    while (fscanf(f, "%255s %d %d %lld %lld %lld %lld %llu", name, &type, &nd, &ne[0], &ne[1],
                  &ne[2], &ne[3], &off) == 8) {
        rows++;
        const hkv_gguf_tensor *t = hkv_gguf_find_tensor(g, name);
        int ok = t && t->type == type && t->n_dims == nd && t->ne[0] == ne[0] &&
                 t->ne[1] == ne[1] && t->ne[2] == ne[2] && t->ne[3] == ne[3] &&
                 (const uint8_t *)t->data - (const uint8_t *)g->map == (ptrdiff_t)off;
        if (!ok && bad++ < 5) fprintf(stderr, "  tensor %s differs from gguf-py\n", name);
    }
    fclose(f);
    CHECK(!bad && rows == 272, "%d tensors differ, %d listed", bad, rows);
    return 0;
}

static int check_rows(const hkv_gguf *g, const char *dir) {
    char path[1024], name[256];
    snprintf(path, sizeof path, "%s/rows.bin", dir);
    FILE *fb = fopen(path, "rb");
    snprintf(path, sizeof path, "%s/rows.txt", dir);
    FILE *ft = fopen(path, "r");
    int fail = !fb || !ft, n_rows = 0;
    long long row, n, at;
    float *want = NULL, *got = NULL;
    while (!fail && fscanf(ft, "%255s %lld %lld %lld", name, &row, &n, &at) == 4) {
        const hkv_gguf_tensor *t = hkv_gguf_find_tensor(g, name);
        if (!t || n != t->ne[0] || row < 0 || row >= t->ne[1] * t->ne[2] * t->ne[3]) {
            fprintf(stderr, "  row %s[%lld]: bad reference entry\n", name, row);
            fail = 1;
            break;
        }
        want = realloc(want, (size_t)n * sizeof *want);
        got = realloc(got, (size_t)n * sizeof *got);
        if (!want || !got || fseek(fb, (long)at, SEEK_SET) ||
            fread(want, sizeof *want, (size_t)n, fb) != (size_t)n) {
            fail = 1;
            break;
        }
        size_t rb = hkv_ggml_row_bytes(t->type, t->ne[0]);
        int rc = hkv_ggml_dequant_row(t->type, (const uint8_t *)t->data + (size_t)row * rb, got, n);
        if (rc != HKV_OK || memcmp(got, want, (size_t)n * sizeof *got) != 0) {
            fprintf(stderr, "  row %s[%lld] differs from gguf-py (rc %d)\n", name, row, rc);
            fail = 1;
        }
        n_rows++;
    }
    if (fb) fclose(fb);
    if (ft) fclose(ft);
    free(want);
    free(got);
    CHECK(!fail && n_rows > 0, "dequantised rows (%d compared)", n_rows);
    printf("ok   %d rows dequantised bit-identical to gguf-py\n", n_rows);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s MODEL [DIR]\n", argv[0]);
        return 2;
    }
    if (access(argv[1], F_OK) != 0) {
        printf("SKIP: %s is absent\n", argv[1]);
        return 77;
    }
    hkv_gguf *g = NULL;
    hkv_err e;
    if (hkv_gguf_open(&g, argv[1], &e) != HKV_OK) {
        hkv_err_report(&e, stderr);
        return 1;
    }
    int fail = check_facts(g);
    printf("%s model facts (v3, 272 tensors, llama, 30 blocks, token_embd q8_0 576x49152)\n",
           fail ? "FAIL" : "ok  ");
    if (argc == 3) {
        int t = check_table(g, argv[2]);
        printf("%s tensor table matches gguf-py\n", t ? "FAIL" : "ok  ");
        fail |= t | check_rows(g, argv[2]);
    }
    hkv_gguf_close(g);
    return fail ? 1 : 0;
}
