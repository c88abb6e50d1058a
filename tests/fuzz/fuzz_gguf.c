/* Fuzz target: a GGUF file from untrusted bytes, and everything that reads
 * the handle without running the model: the typed getters on every key,
 * the model config, the whole model load (repacking every weight), the
 * repack of each tensor on its own, and the tokenizer and chat template the
 * file describes.
 *
 * Asserts: no memory error, leak or UB (ASan/UBSan/LSan); every failure is
 * an HKV_E_* code with a message; opening the same bytes as a file (memfd,
 * mmap) gives the same verdict as hkv_gguf_open_buffer; after a successful
 * open every string, array and tensor lies inside the buffer (gguf.h's
 * promise); a config that reads is within the ranges model.h consumers
 * rely on; a loaded tokenizer gives ids inside its vocabulary. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "ggml_types.h"
#include "gguf.h"
#include "model.h"
#include "tokenizer.h"

/* The memfd that carries each input to hkv_gguf_open; made at the first
 * call (libFuzzer's entry points take no context). */
static int input_fd = -1;

static int in_buf(const void *p, uint64_t n, const uint8_t *buf, size_t size) {
    const uint8_t *q = p;
    return n == 0 || (q >= buf && q <= buf + size && n <= (uint64_t)(buf + size - q));
}

static void check_layout(const hkv_gguf *g, const uint8_t *buf, size_t size) {
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const hkv_gguf_kv *kv = &g->kv[i];
        HKV_FUZZ_CHECK(in_buf(kv->key.ptr, kv->key.len, buf, size), "key #%llu outside the buffer",
                       (unsigned long long)i);
        HKV_FUZZ_CHECK(kv->type >= 0 && kv->type < HKV_GGUF_VTYPE_COUNT, "key #%llu type %d",
                       (unsigned long long)i, kv->type);
        if (kv->type == HKV_GGUF_ARRAY && kv->arr_type == HKV_GGUF_STRING)
            for (uint64_t k = 0; k < kv->arr_n; k++)
                HKV_FUZZ_CHECK(in_buf(kv->arr_str[k].ptr, kv->arr_str[k].len, buf, size),
                               "string %llu of key #%llu outside the buffer",
                               (unsigned long long)k, (unsigned long long)i);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const hkv_gguf_tensor *t = &g->tensors[i];
        HKV_FUZZ_CHECK(in_buf(t->name.ptr, t->name.len, buf, size), "tensor #%llu name outside",
                       (unsigned long long)i);
        HKV_FUZZ_CHECK(in_buf(t->data, t->nbytes, buf, size), "tensor #%llu data outside",
                       (unsigned long long)i);
        HKV_FUZZ_CHECK(t->n_dims >= 1 && t->n_dims <= HKV_GGUF_MAX_DIMS, "tensor n_dims %d", t->n_dims);
        HKV_FUZZ_CHECK(hkv_ggml_type_get(t->type).name != NULL, "tensor type %d", t->type);
    }
}

/* Every typed getter on every key whose name is a C string. */
static void read_every_key(const hkv_gguf *g) {
    for (uint64_t i = 0; i < g->n_kv && i < 512; i++) {
        hkv_str k = g->kv[i].key;
        if (k.len > 255 || memchr(k.ptr, 0, (size_t)k.len)) continue;
        char key[256];
        memcpy(key, k.ptr, (size_t)k.len);
        key[k.len] = '\0';
        hkv_err err = {0};
        int64_t i64;
        uint32_t u32;
        float f;
        int b;
        hkv_str s;
        const hkv_gguf_kv *arr;
        int rc = hkv_gguf_get_i64(g, key, &i64, &err);
        hkv_fuzz_check_err(rc, &err, "hkv_gguf_get_i64");
        rc = hkv_gguf_get_u32(g, key, &u32, &err);
        hkv_fuzz_check_err(rc, &err, "hkv_gguf_get_u32");
        rc = hkv_gguf_get_f32(g, key, &f, &err);
        hkv_fuzz_check_err(rc, &err, "hkv_gguf_get_f32");
        rc = hkv_gguf_get_bool(g, key, &b, &err);
        hkv_fuzz_check_err(rc, &err, "hkv_gguf_get_bool");
        rc = hkv_gguf_get_str(g, key, &s, &err);
        hkv_fuzz_check_err(rc, &err, "hkv_gguf_get_str");
        rc = hkv_gguf_get_arr(g, key, g->kv[i].arr_type, &arr, &err);
        hkv_fuzz_check_err(rc, &err, "hkv_gguf_get_arr");
        HKV_FUZZ_CHECK(hkv_gguf_find(g, key) != NULL, "key '%s' not found by name", key);
    }
}

static void check_config(const hkv_model_config *c) {
    HKV_FUZZ_CHECK(c->n_layer >= 1 && c->dim >= 1 && c->n_head >= 1 && c->ffn >= 1,
                   "zero size: layers %d dim %d heads %d ffn %d", c->n_layer, c->dim, c->n_head, c->ffn);
    HKV_FUZZ_CHECK(c->n_head_kv >= 1 && c->n_head % c->n_head_kv == 0, "heads %d / kv %d",
                   c->n_head, c->n_head_kv);
    HKV_FUZZ_CHECK(c->head_dim >= 2 && c->head_dim <= 512 && c->head_dim % 2 == 0, "head_dim %d",
                   c->head_dim);
    HKV_FUZZ_CHECK(c->rope_dim >= 2 && c->rope_dim <= c->head_dim && c->rope_dim % 2 == 0,
                   "rope_dim %d", c->rope_dim);
    HKV_FUZZ_CHECK(c->vocab >= 1 && c->vocab <= (1 << 24), "vocab %d", c->vocab);
    HKV_FUZZ_CHECK(isfinite(c->rope_base) && c->rope_base > 0, "rope_base %g", (double)c->rope_base);
    HKV_FUZZ_CHECK(isfinite(c->rope_scale) && c->rope_scale > 0, "rope_scale %g", (double)c->rope_scale);
    HKV_FUZZ_CHECK(c->norm_eps > 0 && c->norm_eps < 1, "norm_eps %g", (double)c->norm_eps);
    HKV_FUZZ_CHECK(memchr(c->arch_name, 0, sizeof c->arch_name) && memchr(c->name, 0, sizeof c->name),
                   "names not terminated");
}

static void use_tokenizer(const hkv_tokenizer *t) {
    static const char text[] = "Hello, world! <|im_start|>user\n1234 caf\xc3\xa9 \xe4\xb8\xad \xff <tag>";
    int32_t n_vocab = hkv_tokenizer_n_vocab(t);
    HKV_FUZZ_CHECK(n_vocab >= 1, "vocabulary of %d", n_vocab);
    int32_t ids[256];
    int64_t n = 0;
    for (int special = 0; special < 2; special++) {
        hkv_err err = {0};
        int rc = hkv_tokenize(t, text, sizeof text - 1, 1, special, ids, 256, &n, &err);
        hkv_fuzz_check_err(rc, &err, "hkv_tokenize");
        if (rc) continue;
        for (int64_t i = 0; i < n; i++)
            HKV_FUZZ_CHECK(ids[i] >= 0 && ids[i] < n_vocab, "id %d outside the vocabulary of %d",
                           ids[i], n_vocab);
        char out[4096];
        int64_t m = hkv_detokenize(t, ids, n, special, out, sizeof out);
        HKV_FUZZ_CHECK(m >= 0 || m == HKV_E_RANGE, "detokenize of encoded ids: %lld", (long long)m);
    }
    for (int32_t id = 0; id < n_vocab && id < 4096; id++) {
        char piece[512];
        int k = hkv_token_to_piece(t, id, 1, piece, sizeof piece);
        HKV_FUZZ_CHECK(k >= 0 || k == HKV_E_RANGE, "piece of %d: %d", id, k);
        HKV_FUZZ_CHECK(hkv_tokenizer_is_eog(t, id) == 0 || hkv_tokenizer_is_eog(t, id) == 1, "eog");
    }
    hkv_chat_msg msgs[] = {{"system", NULL}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}};
    for (int first = 0; first < 2; first++) {
        char *prompt = NULL;
        hkv_err err = {0};
        int rc = hkv_chat_apply(t, msgs + first, 4 - first, 1, &prompt, &err);
        hkv_fuzz_check_err(rc, &err, "hkv_chat_apply");
        HKV_FUZZ_CHECK(rc != HKV_OK || prompt, "chat prompt NULL on success");
        HKV_FUZZ_CHECK((rc == HKV_E_UNSUPPORTED) == (hkv_chat_template_family(t) == NULL) ||
                           rc == HKV_E_INVAL,
                       "chat_apply %d but family %s", rc, hkv_chat_template_family(t));
        free(prompt);
    }
}

static int open_as_file(const uint8_t *data, size_t size, hkv_gguf **g, hkv_err *err) {
    if (input_fd < 0 && (input_fd = memfd_create("hkv_fuzz_gguf", MFD_CLOEXEC)) < 0) abort();
    if (ftruncate(input_fd, 0) || (size && pwrite(input_fd, data, size, 0) != (ssize_t)size)) abort();
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", input_fd);
    return hkv_gguf_open(g, path, err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hkv_err err = {0}, ferr = {0};
    hkv_gguf *g = NULL, *gf = NULL;
    int rc = hkv_gguf_open_buffer(&g, data, size, &err);
    hkv_fuzz_check_err(rc, &err, "hkv_gguf_open_buffer");
    HKV_FUZZ_CHECK((rc == HKV_OK) == (g != NULL), "handle %p with rc %d", (void *)g, rc);
    int frc = open_as_file(data, size, &gf, &ferr);
    hkv_fuzz_check_err(frc, &ferr, "hkv_gguf_open");
    HKV_FUZZ_CHECK(frc == rc, "the file gives %s (%s), the buffer %s (%s)", hkv_status_name(frc),
                   ferr.msg, hkv_status_name(rc), err.msg);
    if (gf) {
        HKV_FUZZ_CHECK(gf->n_kv == g->n_kv && gf->n_tensors == g->n_tensors, "file and buffer differ");
        hkv_gguf_close(gf);
    }
    if (rc) return 0;
    check_layout(g, data, size);
    read_every_key(g);
    (void)hkv_model_repacked_bytes(g);

    hkv_model_config cfg;
    rc = hkv_model_config_read(g, &cfg, &err);
    hkv_fuzz_check_err(rc, &err, "hkv_model_config_read");
    if (rc == HKV_OK) {
        check_config(&cfg);
        hkv_model m;
        rc = hkv_model_load(&m, g, &err);
        hkv_fuzz_check_err(rc, &err, "hkv_model_load");
        if (rc == HKV_OK) {
            HKV_FUZZ_CHECK(m.layers && m.tok_embd.q && m.out_norm && m.rope_inv_freq, "loaded model has holes");
            hkv_model_free(&m);
        }
    }
    for (uint64_t i = 0; i < g->n_tensors && i < 64; i++) {
        hkv_wmat w;
        int approx;
        rc = hkv_wmat_from_gguf(&w, &g->tensors[i], &approx, &err);
        hkv_fuzz_check_err(rc, &err, "hkv_wmat_from_gguf");
        if (rc == HKV_OK) hkv_wmat_free(&w);
    }

    hkv_tokenizer *t = NULL;
    rc = hkv_tokenizer_load(&t, g, &err);
    hkv_fuzz_check_err(rc, &err, "hkv_tokenizer_load");
    if (rc == HKV_OK) {
        use_tokenizer(t);
        hkv_tokenizer_free(t);
    }
    hkv_gguf_close(g);
    return 0;
}
