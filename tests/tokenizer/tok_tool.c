/* Test driver for the tokenizer: the Python tests run it and compare its
 * output with independent references (HF tokenizers, sentencepiece, jinja2).
 *
 *   tok_tool split PRE FILE            FILE holds texts separated by NUL bytes; for
 *                                      each, one line of its pre-tokens in hex
 *   tok_tool encode GGUF FILE [special] [bos] [multi]   ids, one per line; with
 *                                      multi, FILE holds NUL-separated texts and
 *                                      each gives one line of space-separated ids
 *   tok_tool decode GGUF IDS [special] [multi]   bytes of the ids in file IDS;
 *                                      with multi, one line of hex per line of ids
 *   tok_tool pieces GGUF [special]      hex of every token's piece, one line each
 *   tok_tool chat GGUF ADD_ASSISTANT [ROLE CONTENT]...   rendered prompt
 *   tok_tool info GGUF                 key=value facts
 *   tok_tool bench GGUF FILE REPS      seconds for the best of REPS encodes
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf.h"
#include "tokenizer.h"
#include "tokenizer_impl.h"

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return NULL; }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t k; buf && (k = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += k;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (buf) buf[n] = 0;   /* n < cap: strtol must stop at the end (MALLOC_PERTURB_ fills digits) */
    *len = n;
    return buf;
}

static int print_hex(const char *s, size_t n, int end) {
    for (size_t i = 0; i < n; i++) printf("%02x", (unsigned char)s[i]);
    putchar(end);
    return 0;
}

static int print_chunk(void *ctx, const char *s, size_t n) {
    (void)ctx;
    return print_hex(s, n, ' ');
}

static int has_flag(int argc, char **argv, int from, const char *flag) {
    for (int i = from; i < argc; i++)
        if (strcmp(argv[i], flag) == 0) return 1;
    return 0;
}

static int encode(const hkv_tokenizer *t, const char *text, size_t len, int bos, int special,
                  int32_t **ids, int64_t *n, hkv_err *err) {
    int64_t cap = (int64_t)len + 16;
    *ids = malloc((size_t)cap * sizeof **ids);
    if (!*ids) return HKV_E_NOMEM;
    return hkv_tokenize(t, text, len, bos, special, *ids, cap, n, err);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int run(int argc, char **argv, const hkv_tokenizer *t, hkv_err *err) {
    const char *cmd = argv[1];
    if (strcmp(cmd, "encode") == 0 || strcmp(cmd, "bench") == 0) {
        if (argc < 4) return HKV_E_INVAL;
        size_t len;
        char *text = read_file(argv[3], &len);
        if (!text) return HKV_E_IO;
        int32_t *ids = NULL;
        int64_t n = 0;
        int rc = HKV_OK;
        if (cmd[0] == 'e') {
            int multi = has_flag(argc, argv, 4, "multi");
            for (size_t p = 0; !rc && p <= len;) {
                const char *z = multi ? memchr(text + p, 0, len - p) : NULL;
                size_t e = z ? (size_t)(z - text) : len;
                free(ids);
                rc = encode(t, text + p, e - p, has_flag(argc, argv, 4, "bos"), has_flag(argc, argv, 4, "special"),
                            &ids, &n, err);
                for (int64_t i = 0; !rc && i < n; i++) printf(multi ? (i ? " %d" : "%d") : "%d\n", ids[i]);
                if (multi) putchar('\n');
                p = e + 1;
            }
        } else {
            int reps = argc > 4 ? atoi(argv[4]) : 3;
            double best = 1e30;
            for (int r = 0; r < reps && !rc; r++) {
                free(ids);
                double t0 = now();
                rc = encode(t, text, len, 0, 1, &ids, &n, err);
                double dt = now() - t0;
                if (dt < best) best = dt;
            }
            if (!rc) printf("bytes=%zu tokens=%lld seconds=%.4f\n", len, (long long)n, best);
        }
        free(ids);
        free(text);
        return rc;
    }
    if (strcmp(cmd, "decode") == 0) {
        if (argc < 4) return HKV_E_INVAL;
        size_t len;
        char *text = read_file(argv[3], &len);
        if (!text) return HKV_E_IO;
        int32_t *ids = malloc((len / 2 + 1) * sizeof *ids);
        int multi = has_flag(argc, argv, 4, "multi");
        int64_t k = 0;
        for (char *p = text; p < text + len && k >= 0;) {
            int64_t n = 0;
            char *e = p;
            /* One sequence per line with multi, else the whole file. */
            while (e < text + len && (!multi || *e != '\n')) {
                char *q;
                long v = strtol(e, &q, 10);
                if (q == e) { e++; continue; }
                ids[n++] = (int32_t)v;
                e = q;
            }
            size_t cap = (size_t)n * 64 + 1;
            char *out = malloc(cap);
            k = hkv_detokenize(t, ids, n, has_flag(argc, argv, 4, "special"), out, cap);
            if (k >= 0 && multi) print_hex(out, (size_t)k, '\n');
            else if (k >= 0) fwrite(out, 1, (size_t)k, stdout);
            free(out);
            p = e + 1;
        }
        free(ids); free(text);
        return k < 0 ? hkv_seterr(err, (int)k, "detokenize failed") : HKV_OK;
    }
    if (strcmp(cmd, "pieces") == 0) {
        char buf[4096];
        for (int32_t id = 0; id < hkv_tokenizer_n_vocab(t); id++) {
            int k = hkv_token_to_piece(t, id, has_flag(argc, argv, 3, "special"), buf, sizeof buf);
            if (k < 0) return hkv_seterr(err, k, "token_to_piece(%d) failed", id);
            print_hex(buf, (size_t)k, '\n');
        }
        return HKV_OK;
    }
    if (strcmp(cmd, "chat") == 0) {
        if (argc < 4 || (argc - 4) % 2) return HKV_E_INVAL;
        int n = (argc - 4) / 2;
        hkv_chat_msg *m = calloc((size_t)n + 1, sizeof *m);
        for (int i = 0; i < n; i++) {
            m[i].role = argv[4 + 2 * i];
            /* "\x01" stands for a NULL content (ask for the default system prompt) */
            m[i].content = strcmp(argv[5 + 2 * i], "\x01") == 0 ? NULL : argv[5 + 2 * i];
        }
        char *out = NULL;
        int rc = hkv_chat_apply(t, m, n, atoi(argv[3]), &out, err);
        if (!rc) fputs(out, stdout);
        free(out);
        free(m);
        return rc;
    }
    if (strcmp(cmd, "info") == 0) {
        const char *fam = hkv_chat_template_family(t);
        printf("n_vocab=%d\nbos=%d\neos=%d\nadd_bos=%d\nfamily=%s\neog=", hkv_tokenizer_n_vocab(t),
               hkv_tokenizer_bos(t), hkv_tokenizer_eos(t), hkv_tokenizer_add_bos(t), fam ? fam : "none");
        for (int32_t id = 0, first = 1; id < hkv_tokenizer_n_vocab(t); id++)
            if (hkv_tokenizer_is_eog(t, id)) { printf(first ? "%d" : ",%d", id); first = 0; }
        putchar('\n');
        return HKV_OK;
    }
    return hkv_seterr(err, HKV_E_INVAL, "unknown command %s", cmd);
}

int main(int argc, char **argv) {
    hkv_err err;
    hkv_err_clear(&err);
    if (argc < 3) { fputs("usage: see the comment at the top of tok_tool.c\n", stderr); return 2; }
    if (strcmp(argv[1], "split") == 0) {
        int pre = hkv_tok_pre_from_name(argv[2], strlen(argv[2]));
        size_t len;
        char *text = argc > 3 ? read_file(argv[3], &len) : NULL;
        if (pre < 0 || !text) { fprintf(stderr, "bad pre-tokenizer or file\n"); return 2; }
        for (size_t p = 0; p <= len;) {
            const char *z = memchr(text + p, 0, len - p);
            size_t e = z ? (size_t)(z - text) : len;
            hkv_pretokenize(pre, text + p, e - p, print_chunk, NULL);
            putchar('\n');
            p = e + 1;
        }
        free(text);
        return 0;
    }
    hkv_gguf *g = NULL;
    hkv_tokenizer *t = NULL;
    int rc = hkv_gguf_open(&g, argv[2], &err);
    if (!rc) rc = hkv_tokenizer_load(&t, g, &err);
    if (g) hkv_gguf_close(g);   /* the tokenizer keeps copies of what it needs */
    if (!rc) rc = run(argc, argv, t, &err);
    hkv_tokenizer_free(t);
    if (rc) {
        if (err.code == HKV_OK) hkv_seterr(&err, rc, "%s", hkv_status_text(rc));
        hkv_err_report(&err, stderr);
        fprintf(stderr, "status=%s\n", hkv_status_name(rc));
        return 1;
    }
    return 0;
}
