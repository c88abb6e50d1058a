/* The eval corpus: real English text from Debian packages, not generated
 * filler, so attention patterns (and what a sparse policy misses) are those
 * of natural language.
 *
 * Default: Isaac Newton's Opticks (public domain; the Project Gutenberg text
 * Go ships as compression test data), from the Debian package
 * golang-1.19-src, about 570 KB of continuous prose (~130K tokens), enough
 * for many disjoint 8K haystacks. --corpus takes files and directories
 * instead, e.g. /usr/share/common-licenses, which every Debian system has. */
#include <dirent.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "eval.h"

const char eval_corpus_help[] =
    "the default corpus is Isaac Newton's Opticks from the Debian package golang-1.19-src "
    "(apt-get install golang-1.19-src); or pass --corpus FILE|DIR[,...], for example "
    "--corpus /usr/share/common-licenses";

#define DEFAULT_GLOB "/usr/share/go-*/src/testdata/Isaac.Newton-Opticks.txt"
#define MAX_FILES 256

typedef struct file_list {
    char *path[MAX_FILES];
    int n;
} file_list;

static void files_free(file_list *f) {
    for (int i = 0; i < f->n; i++) free(f->path[i]);
    f->n = 0;
}

static int add_file(file_list *f, const char *p, hkv_err *err) {
    if (f->n >= MAX_FILES) return hkv_seterr(err, HKV_E_RANGE, "corpus: more than %d files", MAX_FILES);
    if (!(f->path[f->n] = strdup(p))) return hkv_seterr(err, HKV_E_NOMEM, "corpus: no memory");
    f->n++;
    return HKV_OK;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A directory contributes its regular files in name order; symbolic links
 * are skipped because license directories alias the same text (GPL ->
 * GPL-3), and a haystack that repeats itself is easier than real text. */
static int add_dir(file_list *f, const char *dir, hkv_err *err) {
    DIR *d = opendir(dir);
    if (!d) return hkv_seterr(err, HKV_E_IO, "corpus: cannot read directory '%s'", dir);
    int first = f->n, rc = HKV_OK;
    struct dirent *de;
    char p[4096 + 256 + 2];
    while ((de = readdir(d)) && !rc) {
        if (de->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%.4096s/%.256s", dir, de->d_name);
        struct stat st;
        if (lstat(p, &st) || !S_ISREG(st.st_mode)) continue;
        rc = add_file(f, p, err);
    }
    closedir(d);
    if (!rc && f->n == first)
        rc = hkv_seterr(err, HKV_E_NOTFOUND, "corpus: directory '%s' has no regular files", dir);
    if (!rc) qsort(f->path + first, (size_t)(f->n - first), sizeof f->path[0], cmp_str);
    return rc;
}

static int collect(file_list *f, const char *paths, hkv_err *err) {
    f->n = 0;
    if (!paths) {
        glob_t g;
        if (glob(DEFAULT_GLOB, 0, NULL, &g) || g.gl_pathc == 0) {
            return hkv_seterr(err, HKV_E_NOTFOUND, "no corpus: %s is missing; %s", DEFAULT_GLOB,
                              eval_corpus_help);
        }
        int rc = add_file(f, g.gl_pathv[g.gl_pathc - 1], err);   /* the newest Go */
        globfree(&g);
        return rc;
    }
    for (const char *p = paths; *p;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        char one[4096];
        if (!len || len >= sizeof one) return hkv_seterr(err, HKV_E_INVAL, "--corpus: bad list '%s'", paths);
        memcpy(one, p, len);
        one[len] = 0;
        p += len + (c ? 1 : 0);
        struct stat st;
        if (stat(one, &st))
            return hkv_seterr(err, HKV_E_NOTFOUND, "--corpus: '%s' does not exist; %s", one,
                              eval_corpus_help);
        int rc = S_ISDIR(st.st_mode) ? add_dir(f, one, err) : add_file(f, one, err);
        if (rc) return rc;
    }
    return HKV_OK;
}

int eval_corpus_check(const char *paths, hkv_err *err) {
    file_list f;
    int rc = collect(&f, paths, err);
    files_free(&f);
    return rc;
}

/* Light normalisation: drop CR and the underscores Gutenberg uses for
 * italics, join the lines of a paragraph with one space, keep paragraph
 * breaks as one blank line, and squeeze runs of spaces and tabs. Appends
 * to out (room for len + 2 bytes). */
static size_t normalise(const char *in, size_t len, char *out, size_t o) {
    int nl = 0, sp = 0;
    size_t start = o;
    for (size_t i = 0; i < len; i++) {
        char ch = in[i];
        if (ch == '\r' || ch == '_') continue;
        if (ch == '\n') {
            nl++;
            continue;
        }
        if (ch == ' ' || ch == '\t' || ch == '\f' || ch == '\v') {
            sp = 1;
            continue;
        }
        if (o > start) {
            if (nl >= 2) {
                out[o++] = '\n';
                out[o++] = '\n';
            } else if (nl == 1 || sp) {
                out[o++] = ' ';
            }
        }
        nl = sp = 0;
        out[o++] = ch;
    }
    return o;
}

/* A needle may follow token i when i ends a sentence and i+1 starts a word. */
static void mark_sentences(eval_corpus *c, const hkv_tokenizer *t) {
    char cur[64], nxt[64];
    int lc = c->n_tok ? hkv_token_to_piece(t, c->tok[0], 0, cur, sizeof cur) : 0;
    for (int64_t i = 0; i + 1 < c->n_tok; i++) {
        int ln = hkv_token_to_piece(t, c->tok[i + 1], 0, nxt, sizeof nxt);
        char last = lc > 0 ? cur[lc - 1] : 0;
        c->sent_end[i] = (last == '.' || last == '?' || last == '!') && ln > 0 &&
                         (nxt[0] == ' ' || nxt[0] == '\n');
        memcpy(cur, nxt, ln > 0 ? (size_t)ln : 0);
        lc = ln;
    }
}

int eval_corpus_load(eval_corpus *c, const char *paths, const hkv_tokenizer *t, hkv_err *err) {
    memset(c, 0, sizeof *c);
    file_list f;
    int rc = collect(&f, paths, err);
    char *text = NULL;
    size_t n = 0, cap = 0;
    for (int i = 0; !rc && i < f.n; i++) {
        char *raw = NULL;
        size_t len = 0;
        if ((rc = hkv_read_file(f.path[i], &raw, &len, err))) break;
        if (n + len + 4 > cap) {
            cap = (n + len + 4) * 2;
            char *nt = realloc(text, cap);
            if (!nt) {
                free(raw);
                rc = hkv_seterr(err, HKV_E_NOMEM, "corpus: no memory for %zu bytes", cap);
                break;
            }
            text = nt;
        }
        if (n) {
            text[n++] = '\n';   /* files are separate paragraphs */
            text[n++] = '\n';
        }
        n = normalise(raw, len, text, n);
        free(raw);
        size_t sl = strlen(c->sources);
        snprintf(c->sources + sl, sizeof c->sources - sl, "%s%s", sl ? "," : "", f.path[i]);
        c->n_files++;
    }
    files_free(&f);
    if (!rc && n < 1024)
        rc = hkv_seterr(err, HKV_E_INVAL, "corpus: only %zu bytes of text in '%s'", n, c->sources);
    if (!rc) {
        c->n_bytes = n;
        int64_t got = 0;
        /* Byte-level BPE never has more tokens than bytes (+ BOS). */
        c->tok = malloc((n + 16) * sizeof *c->tok);
        if (!c->tok) rc = hkv_seterr(err, HKV_E_NOMEM, "corpus: no memory for %zu tokens", n);
        else rc = hkv_tokenize(t, text, n, 0, 0, c->tok, (int64_t)n + 16, &got, err);
        if (rc == HKV_E_RANGE) {   /* a tokenizer that does make more: size it exactly */
            int32_t *nt = realloc(c->tok, (size_t)got * sizeof *nt);
            rc = nt ? hkv_tokenize(t, text, n, 0, 0, nt, got, &got, err)
                    : hkv_seterr(err, HKV_E_NOMEM, "corpus: no memory for %lld tokens", (long long)got);
            if (nt) c->tok = nt;
        }
        c->n_tok = got;
    }
    free(text);
    if (!rc && !(c->sent_end = calloc((size_t)c->n_tok + 1, 1)))
        rc = hkv_seterr(err, HKV_E_NOMEM, "corpus: no memory");
    if (rc) {
        eval_corpus_free(c);
        return hkv_err_prefix(err, "loading the corpus");
    }
    mark_sentences(c, t);
    return HKV_OK;
}

void eval_corpus_free(eval_corpus *c) {
    free(c->tok);
    free(c->sent_end);
    c->tok = NULL;
    c->sent_end = NULL;
    c->n_tok = 0;
}
