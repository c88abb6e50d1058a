/* Byte-level BPE (tokenizer.ggml.model "gpt2"): the pre-tokenizer patterns as
 * hand-written matchers over code points, the merges table, and the merge
 * loop (a heap of candidate pairs over a linked list of symbols). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"
#include "unicode.h"

/* ---- pre-tokenizer ------------------------------------------------------ */

static inline int cls_at(const uint8_t *s, size_t n, size_t i, size_t *len) {
    if (s[i] < 0x80) { *len = 1; return hkv_uclass(s[i]); }
    uint32_t cp = hkv_utf8_decode(s + i, n - i, len);
    return cp == HKV_UBAD ? HKV_UC_OTHER : hkv_uclass(cp);
}

/* End of the run of code points of class cls starting at i. */
static size_t run_of(const uint8_t *s, size_t n, size_t i, int cls) {
    size_t l;
    while (i < n && cls_at(s, n, i, &l) == cls) i += l;
    return i;
}

/* 's 't 're 've 'm 'll 'd at s[i]: its byte length, or 0. icase follows
 * Oniguruma's (?i), whose Unicode case folding also maps U+017F (ſ) to s. */
static size_t contraction(const uint8_t *s, size_t n, size_t i, int icase) {
    if (s[i] != '\'' || i + 1 >= n) return 0;
    uint8_t a = s[i + 1], b = i + 2 < n ? s[i + 2] : 0;
    if (icase) {
        if (a == 0xC5 && b == 0xBF) return 3;
        if (a >= 'A' && a <= 'Z') a = (uint8_t)(a + 32);
        if (b >= 'A' && b <= 'Z') b = (uint8_t)(b + 32);
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* Whitespace run from i (s[i] is whitespace). Sets *last to the start of its
 * last code point and *nl to one past its last \r or \n (0 if none). */
static size_t space_run(const uint8_t *s, size_t n, size_t i, size_t *last, size_t *nl) {
    size_t l;
    *last = i;
    *nl = 0;
    while (i < n && cls_at(s, n, i, &l) == HKV_UC_SPACE) {
        if (s[i] == '\r' || s[i] == '\n') *nl = i + 1;
        *last = i;
        i += l;
    }
    return i;
}

/* \s+(?!\S)|\s+ at i: a run followed by text gives its last code point to
 * the next pre-token (" world"); a run at the end stays whole. */
static size_t space_tail(size_t i, size_t w, size_t last, size_t n) {
    if (w == n || last == i) return w;
    return last;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t match_gpt2(const uint8_t *s, size_t n, size_t i) {
    size_t l, m = contraction(s, n, i, 0);
    if (m) return i + m;
    int k = cls_at(s, n, i, &l);
    if (s[i] == ' ' && i + 1 < n) {
        size_t l1;
        int k1 = cls_at(s, n, i + 1, &l1);
        if (k1 != HKV_UC_SPACE) return run_of(s, n, i + 1, k1);
    }
    if (k != HKV_UC_SPACE) return run_of(s, n, i, k);
    size_t last, nl, w = space_run(s, n, i, &last, &nl);
    return space_tail(i, w, last, n);
}

/* Llama 3 (max_digits 3) and Qwen2 (1):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
 * | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t match_llama3(const uint8_t *s, size_t n, size_t i, int max_digits) {
    size_t l, l1, m = contraction(s, n, i, 1);
    if (m) return i + m;
    int k = cls_at(s, n, i, &l);
    if (k == HKV_UC_LETTER) return run_of(s, n, i, HKV_UC_LETTER);
    int k1 = i + l < n ? cls_at(s, n, i + l, &l1) : -1;
    if (k != HKV_UC_NUMBER && s[i] != '\r' && s[i] != '\n' && k1 == HKV_UC_LETTER)
        return run_of(s, n, i + l, HKV_UC_LETTER);
    if (k == HKV_UC_NUMBER) {
        size_t j = i + l;
        for (int d = 1; d < max_digits && j < n && cls_at(s, n, j, &l1) == HKV_UC_NUMBER; d++)
            j += l1;
        return j;
    }
    size_t j = i;
    if (s[i] == ' ' && k1 == HKV_UC_OTHER) { j = i + 1; k = HKV_UC_OTHER; }
    if (k == HKV_UC_OTHER) {
        j = run_of(s, n, j, HKV_UC_OTHER);
        while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
        return j;
    }
    size_t last, nl, w = space_run(s, n, i, &last, &nl);
    if (nl) return nl;   /* \s*[\r\n]+ backtracks to the run's last newline */
    return space_tail(i, w, last, n);
}

static int split_with(int pre, const uint8_t *s, size_t n, hkv_chunk_fn fn, void *ctx) {
    size_t i = 0;
    while (i < n) {
        size_t e = pre == HKV_PRE_GPT2   ? match_gpt2(s, n, i)
                 : pre == HKV_PRE_LLAMA3 ? match_llama3(s, n, i, 3)
                                         : match_llama3(s, n, i, 1);
        int rc = fn(ctx, (const char *)s + i, e - i);
        if (rc) return rc;
        i = e;
    }
    return 0;
}

int hkv_pretokenize(int pre, const char *text, size_t len, hkv_chunk_fn fn, void *ctx) {
    const uint8_t *s = (const uint8_t *)text;
    if (pre != HKV_PRE_SMOLLM) return split_with(pre, s, len, fn, ctx);
    /* SmolLM/StarCoder: each number code point is its own pre-token; the text
     * between them is split by the GPT-2 pattern as if it stood alone. */
    size_t seg = 0, i = 0, l;
    while (i < len) {
        if (cls_at(s, len, i, &l) == HKV_UC_NUMBER) {
            int rc = split_with(HKV_PRE_GPT2, s + seg, i - seg, fn, ctx);
            if (!rc) rc = fn(ctx, text + i, l);
            if (rc) return rc;
            seg = i + l;
        }
        i += l;
    }
    return split_with(HKV_PRE_GPT2, s + seg, len - seg, fn, ctx);
}

int hkv_tok_pre_from_name(const char *name, size_t len) {
    static const struct { const char *name; int pre; } names[] = {
        {"gpt2", HKV_PRE_GPT2}, {"gpt-2", HKV_PRE_GPT2}, {"default", HKV_PRE_GPT2},
        {"smollm", HKV_PRE_SMOLLM}, {"starcoder", HKV_PRE_SMOLLM},
        {"llama3", HKV_PRE_LLAMA3}, {"llama-bpe", HKV_PRE_LLAMA3}, {"llama-v3", HKV_PRE_LLAMA3},
        {"qwen2", HKV_PRE_QWEN2},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i].name) == len && memcmp(names[i].name, name, len) == 0)
            return names[i].pre;
    return -1;
}

/* ---- merges ------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33;
    return x;
}

static int64_t merge_rank(const hkv_tokenizer *t, int32_t a, int32_t b) {
    if (a < 0 || b < 0 || !t->mkeys) return -1;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t h = mix64(key) & t->mmask;; h = (h + 1) & t->mmask) {
        if (t->mkeys[h] == key) return t->mrank[h];
        if (t->mkeys[h] == UINT64_MAX) return -1;
    }
}

/* Byte-decode a token text: each code point that is the image of a byte
 * becomes that byte; any other code point is kept as UTF-8. */
static uint32_t bpe_decode_text(const char *src, size_t n, char *dst) {
    size_t i = 0, o = 0, l;
    while (i < n) {
        uint32_t cp = hkv_utf8_decode((const uint8_t *)src + i, n - i, &l);
        int b = cp == HKV_UBAD ? -1 : hkv_cp_to_byte(cp);
        if (b >= 0) dst[o++] = (char)b;
        else { memcpy(dst + o, src + i, l); o += l; }
        i += l;
    }
    return (uint32_t)o;
}

int hkv_bpe_prepare(hkv_tokenizer *t, const hkv_tok_spec *spec, hkv_err *err) {
    for (int b = 0; b < 256; b++) {
        char u[4];
        int n = hkv_utf8_encode(hkv_byte_to_cp((uint8_t)b), u);
        t->byte_id[b] = hkv_tok_find(t, u, (size_t)n);
    }
    uint32_t o = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *s = t->text + t->text_off[id];
        t->piece_off[id] = o;
        if (t->types[id] == HKV_TT_NORMAL || t->types[id] == HKV_TT_BYTE) {
            t->piece_len[id] = bpe_decode_text(s, t->text_len[id], t->piece + o);
        } else {   /* control, user-defined, unknown: their text as written */
            memcpy(t->piece + o, s, t->text_len[id]);
            t->piece_len[id] = t->text_len[id];
        }
        o += t->piece_len[id];
    }

    int64_t nm = spec->n_merges;
    t->n_merges = nm;
    if (nm <= 0) return HKV_OK;
    if (nm > INT32_MAX) return hkv_seterr(err, HKV_E_RANGE, "tokenizer: %lld merges is too many", (long long)nm);
    uint64_t cap = 16;
    while (cap < (uint64_t)nm * 2) cap <<= 1;
    t->mmask = cap - 1;
    t->mkeys = malloc(cap * sizeof *t->mkeys);
    t->mrank = malloc(cap * sizeof *t->mrank);
    t->merge_a = malloc((size_t)nm * sizeof(int32_t));
    t->merge_b = malloc((size_t)nm * sizeof(int32_t));
    t->merge_out = malloc((size_t)nm * sizeof(int32_t));
    char *cat = malloc(4096);
    if (!t->mkeys || !t->mrank || !t->merge_a || !t->merge_b || !t->merge_out || !cat) {
        free(cat);
        return hkv_seterr(err, HKV_E_NOMEM, "tokenizer: no memory for %lld merges", (long long)nm);
    }
    memset(t->mkeys, 0xFF, cap * sizeof *t->mkeys);
    for (int64_t r = 0; r < nm; r++) {
        hkv_str m = spec->merges[r];
        int32_t a = -1, b = -1, c = -1;
        /* "left right": the separator is the space whose both sides are tokens
         * (byte-level tokens never hold a raw space, so normally the first). */
        for (uint64_t k = 0; k < m.len && c < 0; k++) {
            if (m.ptr[k] != ' ' || m.len - 1 > 4096) continue;
            a = hkv_tok_find(t, m.ptr, k);
            b = hkv_tok_find(t, m.ptr + k + 1, m.len - k - 1);
            if (a < 0 || b < 0) continue;
            memcpy(cat, m.ptr, k);
            memcpy(cat + k, m.ptr + k + 1, m.len - k - 1);
            c = hkv_tok_find(t, cat, m.len - 1);
        }
        t->merge_a[r] = t->merge_b[r] = t->merge_out[r] = -1;
        /* A merge whose parts or result are not tokens can never apply. */
        if (c < 0 || merge_rank(t, a, b) >= 0) continue;
        t->merge_a[r] = a; t->merge_b[r] = b; t->merge_out[r] = c;
        uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
        uint64_t h = mix64(key) & t->mmask;
        while (t->mkeys[h] != UINT64_MAX) h = (h + 1) & t->mmask;
        t->mkeys[h] = key;
        t->mrank[h] = (uint32_t)r;
    }
    free(cat);
    return HKV_OK;
}

/* ---- merge loop ----------------------------------------------------------- */

typedef struct { int32_t id, prev, next; } bsym;
typedef struct { uint32_t rank; int32_t pos; } bpair;

static inline int pair_less(bpair x, bpair y) {
    return x.rank < y.rank || (x.rank == y.rank && x.pos < y.pos);
}

static void heap_push(bpair *h, size_t *n, bpair v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!pair_less(v, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static bpair heap_pop(bpair *h, size_t *n) {
    bpair top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && pair_less(h[c + 1], h[c])) c++;
        if (!pair_less(h[c], v)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
    return top;
}

typedef struct bpe_ctx {
    const hkv_tokenizer *t;
    hkv_tok_out *out;
    hkv_tok_scratch *sc;
    hkv_err *err;
} bpe_ctx;

static void try_pair(const hkv_tokenizer *t, const bsym *sy, int32_t pos, bpair *h, size_t *nh) {
    int32_t nx = sy[pos].next;
    if (nx < 0) return;
    int64_t r = merge_rank(t, sy[pos].id, sy[nx].id);
    if (r >= 0) heap_push(h, nh, (bpair){(uint32_t)r, pos});
}

static void push_sym(const hkv_tokenizer *t, hkv_tok_out *o, int32_t id) {
    if (id >= 0) hkv_tok_push(o, id);
    else if (t->unk >= 0) hkv_tok_push(o, t->unk);   /* byte missing from the vocab */
}

static int bpe_chunk(void *vctx, const char *s, size_t n) {
    bpe_ctx *c = vctx;
    const hkv_tokenizer *t = c->t;
    const uint8_t *u = (const uint8_t *)s;
    if (n == 1) { push_sym(t, c->out, t->byte_id[u[0]]); return 0; }
    if (n > INT32_MAX / 4)
        return hkv_seterr(c->err, HKV_E_RANGE, "tokenize: a pre-token of %zu bytes is too long", n);
    size_t need = n * sizeof(bsym) + 3 * n * sizeof(bpair) + 2 * n;
    int rc = hkv_tok_scratch_reserve(c->sc, need, c->err);
    if (rc) return rc;
    bsym *sy = c->sc->buf;
    bpair *h = (bpair *)(sy + n);
    if (t->ignore_merges) {   /* the whole pre-token is a token: take it as is */
        char *m = (char *)(h + 3 * n);
        size_t mo = 0;
        for (size_t i = 0; i < n; i++) mo += (size_t)hkv_utf8_encode(hkv_byte_to_cp(u[i]), m + mo);
        int32_t id = hkv_tok_find(t, m, mo);
        if (id >= 0) { hkv_tok_push(c->out, id); return 0; }
    }
    for (size_t i = 0; i < n; i++)
        sy[i] = (bsym){t->byte_id[u[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
    size_t nh = 0;
    for (size_t i = 0; i + 1 < n; i++) try_pair(t, sy, (int32_t)i, h, &nh);
    while (nh > 0) {
        bpair p = heap_pop(h, &nh);
        int32_t a = p.pos, b = sy[a].next;
        /* Stale entries (a side already merged into something else) are skipped. */
        if (b < 0 || sy[a].id != t->merge_a[p.rank] || sy[b].id != t->merge_b[p.rank]) continue;
        sy[a].id = t->merge_out[p.rank];
        sy[a].next = sy[b].next;
        if (sy[b].next >= 0) sy[sy[b].next].prev = a;
        sy[b].id = -1;
        if (sy[a].prev >= 0) try_pair(t, sy, sy[a].prev, h, &nh);
        try_pair(t, sy, a, h, &nh);
    }
    for (int32_t i = 0; i >= 0; i = sy[i].next) push_sym(t, c->out, sy[i].id);
    return 0;
}

int hkv_bpe_encode(const hkv_tokenizer *t, const char *text, size_t len,
                   hkv_tok_out *out, hkv_tok_scratch *sc, hkv_err *err) {
    bpe_ctx c = {t, out, sc, err};
    return hkv_pretokenize(t->pre, text, len, bpe_chunk, &c);
}
