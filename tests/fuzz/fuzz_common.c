/* Shared pieces of the fuzz harnesses (fuzz_common.h). */
#include "fuzz_common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "tokenizer_impl.h"

#ifndef HKV_FUZZ_DATA
#error "HKV_FUZZ_DATA (the folder of tok_bpe.gguf and tok_spm.gguf) must be defined"
#endif

void hkv_fuzz_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "\n%s:%d: check failed: %s\n  ", file, line, cond);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

void hkv_fuzz_check_err(int rc, const hkv_err *err, const char *what) {
    if (rc == HKV_OK) return;
    HKV_FUZZ_CHECK(rc < 0 && rc >= HKV_E_INTERNAL, "%s: return code %d is not an HKV_E_*", what, rc);
    HKV_FUZZ_CHECK(err->code != HKV_OK && err->msg[0], "%s failed (%s) without a message", what,
                   hkv_status_name(rc));
}

void hkv_fuzz_split(const uint8_t *data, size_t size, int max, hkv_fuzz_fields *f) {
    f->n = 0;
    f->s = calloc((size_t)max, sizeof *f->s);
    f->len = calloc((size_t)max, sizeof *f->len);
    if (!f->s || !f->len) abort();
    size_t p = 0;
    while (f->n < max && p <= size) {
        const uint8_t *z = p < size ? memchr(data + p, 0, size - p) : NULL;
        size_t e = z ? (size_t)(z - data) : size;
        char *s = malloc(e - p + 1);
        if (!s) abort();
        memcpy(s, data + p, e - p);
        s[e - p] = '\0';
        f->s[f->n] = s;
        f->len[f->n++] = e - p;
        if (!z) break;
        p = e + 1;
    }
}

void hkv_fuzz_fields_free(hkv_fuzz_fields *f) {
    for (int i = 0; i < f->n; i++) free(f->s[i]);
    free(f->s);
    free(f->len);
    memset(f, 0, sizeof *f);
}

uint8_t *hkv_fuzz_read_file(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) { perror(path); exit(2); }
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf || (n > 0 && fread(buf, 1, (size_t)n, fp) != (size_t)n)) { perror(path); exit(2); }
    fclose(fp);
    *len = (size_t)n;
    return buf;
}

static int32_t opt_id(const hkv_gguf *g, const char *key) {
    int64_t v;
    return hkv_gguf_get_i64(g, key, &v, NULL) == HKV_OK && v >= 0 && v < INT32_MAX ? (int32_t)v : -1;
}

/* The byte-level BPE of g again under another pre-tokenizer: the spec
 * hkv_tokenizer_load would fill, with pre replaced. */
static hkv_tokenizer *bpe_with_pre(const hkv_gguf *g, int pre) {
    const hkv_gguf_kv *toks, *merges, *types;
    hkv_err err;
    if (hkv_gguf_get_arr(g, "tokenizer.ggml.tokens", HKV_GGUF_STRING, &toks, &err) ||
        hkv_gguf_get_arr(g, "tokenizer.ggml.merges", HKV_GGUF_STRING, &merges, &err) ||
        hkv_gguf_get_arr(g, "tokenizer.ggml.token_type", HKV_GGUF_I32, &types, &err)) {
        hkv_err_report(&err, stderr);
        exit(2);
    }
    int32_t *ty = malloc(toks->arr_n * sizeof *ty);
    if (!ty) abort();
    memcpy(ty, types->val, toks->arr_n * sizeof *ty);   /* unaligned in the file */
    hkv_str tmpl = {0};
    hkv_gguf_get_str(g, "tokenizer.chat_template", &tmpl, NULL);
    hkv_tok_spec sp = {
        .model = HKV_TOK_BPE, .pre = pre, .n_vocab = (int64_t)toks->arr_n, .tokens = toks->arr_str,
        .types = ty, .n_merges = (int64_t)merges->arr_n, .merges = merges->arr_str,
        .bos = opt_id(g, "tokenizer.ggml.bos_token_id"), .eos = opt_id(g, "tokenizer.ggml.eos_token_id"),
        .eot = -1, .eom = -1, .unk = opt_id(g, "tokenizer.ggml.unknown_token_id"), .pad = -1,
        .chat_template = tmpl,
    };
    hkv_tokenizer *t = NULL;
    if (hkv_tok_build(&t, &sp, &err)) {
        hkv_err_report(&err, stderr);
        exit(2);
    }
    free(ty);
    return t;
}

static hkv_tokenizer *load(const char *path, hkv_gguf **keep) {
    hkv_err err;
    hkv_gguf *g = NULL;
    hkv_tokenizer *t = NULL;
    if (hkv_gguf_open(&g, path, &err) || hkv_tokenizer_load(&t, g, &err)) {
        hkv_err_report(&err, stderr);
        exit(2);
    }
    *keep = g;
    return t;
}

/* libFuzzer's entry points take no context: the tokenizers are the one
 * process-wide state of a harness, built at its first call and read-only. */
const hkv_fuzz_toks *hkv_fuzz_tokenizers(void) {
    static hkv_fuzz_toks ft;
    if (ft.n) return &ft;
    const char *bpe = getenv("HKV_FUZZ_TOKENIZER");
    if (!bpe || !*bpe) bpe = HKV_FUZZ_DATA "/tok_bpe.gguf";
    hkv_gguf *g = NULL;
    ft.t[0] = load(bpe, &g);
    ft.name[0] = "bpe (as the file says)";
    static const int pres[] = {HKV_PRE_GPT2, HKV_PRE_LLAMA3, HKV_PRE_QWEN2};
    static const char *names[] = {"bpe gpt2", "bpe llama3", "bpe qwen2"};
    for (int i = 0; i < 3; i++) {
        ft.t[1 + i] = bpe_with_pre(g, pres[i]);
        ft.name[1 + i] = names[i];
    }
    hkv_gguf_close(g);
    ft.t[4] = load(HKV_FUZZ_DATA "/tok_spm.gguf", &g);
    hkv_gguf_close(g);
    ft.name[4] = "spm";
    ft.spm[4] = 1;
    ft.n = HKV_FUZZ_NTOK;
    fprintf(stderr, "fuzz: tokenizers from %s (vocab %d) and tok_spm.gguf (vocab %d)\n", bpe,
            hkv_tokenizer_n_vocab(ft.t[0]), hkv_tokenizer_n_vocab(ft.t[4]));
    return &ft;
}
