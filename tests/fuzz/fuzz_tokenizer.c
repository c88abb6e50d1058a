/* Fuzz target: the tokenizer on arbitrary bytes (bytes -> ids -> text) and
 * on arbitrary id sequences (ids -> text), under five tokenizers built once
 * (fuzz_common.h): byte-level BPE with each pre-tokenizer, SentencePiece.
 *
 * Asserts, besides ASan/UBSan/LSan:
 *  - the output-capacity protocol of hkv_tokenize: with cap 0 it returns
 *    HKV_E_RANGE and the count needed (HKV_OK when that is 0), and with that
 *    cap HKV_OK and the same count; every id lies in the vocabulary;
 *  - hkv_detokenize: HKV_E_RANGE when the buffer has no room for the NUL,
 *    HKV_E_INVAL exactly when an id is outside the vocabulary; for BPE its
 *    text is the concatenation of hkv_token_to_piece's pieces;
 *  - the round trips tokenizer.h promises: byte-level BPE gives back any
 *    bytes that have tokens (decode(encode(x)) == x, invalid UTF-8 kept byte
 *    for byte), also
 *    with parse_special and render_special together (the BOS text first when
 *    it was added); SentencePiece gives back valid UTF-8 without U+2581 (the
 *    "▁" it writes spaces as) when special tokens are not parsed.
 * With bit 6 of the mode byte the input also brings the vocabulary (as a
 * hostile GGUF would, but without the file format in the way): the
 * tokenizer is built from it for this input alone, and the same protocol
 * and range checks apply (no round trip: such a vocabulary promises none). */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "tokenizer_impl.h"

enum { F_BOS = 1 << 3, F_SPECIAL = 1 << 4, F_IDS = 1 << 5, F_VOCAB = 1 << 6, F_UNK = 1 << 7 };
#define VOCAB_FIELDS 257

/* Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF),
 * written apart from model/unicode.c so that the two check each other. */
static int valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) { k = 2; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { k = 3; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { k = 4; cp = c & 0x07; }
        else return 0;
        if (i + k > n) return 0;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if ((k == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        i += k;
    }
    return 1;
}

static int has_space_mark(const uint8_t *s, size_t n) {
    for (size_t i = 0; i + 3 <= n; i++)
        if (s[i] == 0xE2 && s[i + 1] == 0x96 && s[i + 2] == 0x81) return 1;
    return 0;
}

/* Every byte of s has a token of its own (BPE: its GPT-2 character,
 * SentencePiece: <0xNN>): bytes without one become the unknown token (or
 * nothing), as tokenizer.h says, so no round trip is promised for them.
 * SmolLM2 has none for 0xC0, 0xC1, 0xF1, 0xF2, 0xF5..0xFF and six control
 * bytes. */
static int all_bytes(const hkv_tokenizer *t, const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (t->byte_id[s[i]] < 0) return 0;
    return 1;
}

/* ids -> text with a buffer sized from the pieces; also the RANGE and INVAL
 * promises. Returns the text (malloc'd, *n its length) or NULL when an id
 * was invalid. */
static char *decode(const hkv_tokenizer *t, int spm, const int32_t *ids, int64_t n, int render,
                    size_t *out_n) {
    int32_t nv = hkv_tokenizer_n_vocab(t);
    size_t need = 1, bad = 0;
    char piece[4096];
    for (int64_t i = 0; i < n; i++) {
        int k = hkv_token_to_piece(t, ids[i], render, piece, sizeof piece);
        if (ids[i] < 0 || ids[i] >= nv) {
            HKV_FUZZ_CHECK(k == HKV_E_INVAL, "piece of invalid id %d gave %d", ids[i], k);
            bad++;
            continue;
        }
        HKV_FUZZ_CHECK(k >= 0, "piece of id %d gave %d", ids[i], k);
        need += (size_t)k;
    }
    char *buf = malloc(need);
    if (!buf) abort();
    int64_t m = hkv_detokenize(t, ids, n, render, buf, need);
    if (bad) {
        HKV_FUZZ_CHECK(m == HKV_E_INVAL, "detokenize with %zu invalid ids gave %lld", bad, (long long)m);
        free(buf);
        return NULL;
    }
    HKV_FUZZ_CHECK(m >= 0 && (size_t)m < need && buf[m] == '\0', "detokenize gave %lld (cap %zu)",
                   (long long)m, need);
    if (m > 0) {
        char *small = malloc((size_t)m);
        if (!small) abort();
        int64_t r = hkv_detokenize(t, ids, n, render, small, (size_t)m);
        HKV_FUZZ_CHECK(r == HKV_E_RANGE, "detokenize into %lld bytes (no room for the NUL) gave %lld",
                       (long long)m, (long long)r);
        free(small);
    }
    if (!spm) {   /* byte-level BPE: the text is its pieces side by side */
        size_t o = 0;
        for (int64_t i = 0; i < n; i++) {
            int k = hkv_token_to_piece(t, ids[i], render, piece, sizeof piece);
            HKV_FUZZ_CHECK(o + (size_t)k <= (size_t)m && memcmp(buf + o, piece, (size_t)k) == 0,
                           "detokenize differs from the pieces at token %lld", (long long)i);
            o += (size_t)k;
        }
        HKV_FUZZ_CHECK(o == (size_t)m, "pieces give %zu bytes, detokenize %lld", o, (long long)m);
    }
    *out_n = (size_t)m;
    return buf;
}

/* bytes -> ids through the two-call protocol. */
static int32_t *encode(const hkv_tokenizer *t, const uint8_t *s, size_t n, int bos, int special,
                       int64_t *n_ids) {
    hkv_err err = {0};
    int64_t need = -1;
    int rc = hkv_tokenize(t, (const char *)s, n, bos, special, NULL, 0, &need, &err);
    hkv_fuzz_check_err(rc, &err, "hkv_tokenize (cap 0)");
    HKV_FUZZ_CHECK(need >= 0 && (need == 0 ? rc == HKV_OK : rc == HKV_E_RANGE),
                   "cap 0: rc %d, count %lld", rc, (long long)need);
    int32_t *ids = malloc((size_t)(need ? need : 1) * sizeof *ids);
    if (!ids) abort();
    int64_t got = -1;
    rc = hkv_tokenize(t, (const char *)s, n, bos, special, ids, need, &got, &err);
    hkv_fuzz_check_err(rc, &err, "hkv_tokenize");
    HKV_FUZZ_CHECK(rc == HKV_OK && got == need, "cap %lld: rc %d, count %lld", (long long)need, rc,
                   (long long)got);
    int32_t nv = hkv_tokenizer_n_vocab(t);
    for (int64_t i = 0; i < got; i++)
        HKV_FUZZ_CHECK(ids[i] >= 0 && ids[i] < nv, "id %d at %lld outside the vocabulary of %d",
                       ids[i], (long long)i, nv);
    *n_ids = got;
    return ids;
}

static void text_mode(const hkv_fuzz_toks *ft, int k, int flags, const uint8_t *s, size_t n) {
    const hkv_tokenizer *t = ft->t[k];
    int spm = ft->spm[k], bos = !!(flags & F_BOS), special = !!(flags & F_SPECIAL);
    int64_t n_ids;
    int32_t *ids = encode(t, s, n, bos, special, &n_ids);
    size_t m;
    char *back = decode(t, spm, ids, n_ids, special, &m);
    HKV_FUZZ_CHECK(back != NULL, "encoded ids did not decode");
    /* What the round trip must give: the text, after the BOS text when the
     * BOS was added and special tokens are rendered. */
    char bos_text[512];
    int nb = 0;
    if (bos && special && hkv_tokenizer_bos(t) >= 0)
        nb = hkv_token_to_piece(t, hkv_tokenizer_bos(t), 1, bos_text, sizeof bos_text);
    int promised = (spm ? !special && valid_utf8(s, n) && !has_space_mark(s, n) : 1) && all_bytes(t, s, n);
    if (promised && nb >= 0)
        HKV_FUZZ_CHECK(m == (size_t)nb + n && memcmp(back, bos_text, (size_t)nb) == 0 &&
                           memcmp(back + nb, s, n) == 0,
                       "%s: decode(encode(x)) != x (bos %d, special %d): %zu bytes in, %zu out: "
                       "'%.*s' -> '%.*s'", ft->name[k], bos, special, n, m, (int)(n < 200 ? n : 200),
                       (const char *)s, (int)(m < 200 ? m : 200), back);
    free(back);
    free(ids);
}

static void ids_mode(const hkv_fuzz_toks *ft, int k, int flags, const uint8_t *s, size_t n) {
    const hkv_tokenizer *t = ft->t[k];
    int32_t nv = hkv_tokenizer_n_vocab(t);
    int64_t n_ids = (int64_t)(n / 4);
    int32_t *ids = malloc((size_t)(n_ids ? n_ids : 1) * sizeof *ids);
    if (!ids) abort();
    for (int64_t i = 0; i < n_ids; i++) {   /* mostly valid ids, a few just outside */
        uint32_t raw = (uint32_t)s[4 * i] | (uint32_t)s[4 * i + 1] << 8 | (uint32_t)s[4 * i + 2] << 16 |
                       (uint32_t)s[4 * i + 3] << 24;
        ids[i] = (int32_t)(raw % (uint32_t)(nv + 8)) - 4;
        HKV_FUZZ_CHECK(hkv_tokenizer_is_eog(t, ids[i]) == 0 || (ids[i] >= 0 && ids[i] < nv), "eog of a bad id");
    }
    int render = !!(flags & F_SPECIAL);
    size_t m;
    char *text = decode(t, ft->spm[k], ids, n_ids, render, &m);
    if (text && !ft->spm[k] && all_bytes(t, (const uint8_t *)text, m)) {   /* text -> ids -> text is stable */
        int64_t n2;
        int32_t *ids2 = encode(t, (const uint8_t *)text, m, 0, render, &n2);
        size_t m2;
        char *text2 = decode(t, 0, ids2, n2, render, &m2);
        HKV_FUZZ_CHECK(text2 && m2 == m && memcmp(text, text2, m) == 0,
                       "%s: decoded text does not survive encode+decode", ft->name[k]);
        free(text2);
        free(ids2);
    }
    free(text);
    free(ids);
}

/* Vocabulary mode. Bit 0: SentencePiece (else byte-level BPE), bits 1-2 the
 * BPE pre-tokenizer, bit 5 SentencePiece's add_space_prefix, bit 7 an
 * unknown token (the last). NUL-separated fields: the text, then one per
 * token: a kind byte (>= 0xF0: the field is a merge "left right"; else the
 * token type is kind % 8, where 0 and 7 are undefined types), a score byte
 * and the token's text. */
static void vocab_mode(int flags, const uint8_t *s, size_t n) {
    hkv_fuzz_fields f;
    hkv_fuzz_split(s, n, VOCAB_FIELDS, &f);
    hkv_str toks[VOCAB_FIELDS], merges[VOCAB_FIELDS];
    int32_t types[VOCAB_FIELDS];
    float scores[VOCAB_FIELDS];
    int nt = 0, nm = 0;
    for (int i = 1; i < f.n; i++) {
        const uint8_t *p = (const uint8_t *)f.s[i];
        size_t len = f.len[i];
        if (len >= 1 && p[0] >= 0xF0) {
            merges[nm++] = (hkv_str){f.s[i] + 1, len - 1};
            continue;
        }
        types[nt] = len >= 1 ? p[0] % 8 : HKV_TT_NORMAL;
        scores[nt] = len >= 2 ? (float)(int8_t)p[1] : 0.0f;
        toks[nt++] = len >= 2 ? (hkv_str){f.s[i] + 2, len - 2} : (hkv_str){"", 0};
    }
    int spm = flags & 1;
    hkv_tok_spec sp = {.model = spm ? HKV_TOK_SPM : HKV_TOK_BPE, .pre = (flags >> 1) & 3, .n_vocab = nt,
                       .tokens = toks, .scores = scores, .types = types, .n_merges = nm, .merges = merges,
                       .bos = nt > 0 ? 0 : -1, .eos = nt > 1 ? 1 : -1, .eot = -1, .eom = -1,
                       .unk = (flags & F_UNK) && nt > 0 ? nt - 1 : -1, .pad = -1,
                       .add_bos = 1, .add_space_prefix = spm && (flags & F_IDS)};
    hkv_tokenizer *t = NULL;
    hkv_err err = {0};
    int rc = hkv_tok_build(&t, &sp, &err);
    hkv_fuzz_check_err(rc, &err, "hkv_tok_build");
    if (rc == HKV_OK) {
        int64_t n_ids;
        int32_t *ids = encode(t, (const uint8_t *)f.s[0], f.len[0], !!(flags & F_BOS), !!(flags & F_SPECIAL), &n_ids);
        size_t m;
        free(decode(t, spm, ids, n_ids, !!(flags & F_SPECIAL), &m));
        free(ids);
        hkv_tokenizer_free(t);
    }
    hkv_fuzz_fields_free(&f);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    hkv_fuzz_tokenizers();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const hkv_fuzz_toks *ft = hkv_fuzz_tokenizers();
    int flags = data[0], k = (flags & 7) % ft->n;
    if (flags & F_VOCAB) vocab_mode(flags, data + 1, size - 1);
    else if (flags & F_IDS) ids_mode(ft, k, flags, data + 1, size - 1);
    else text_mode(ft, k, flags, data + 1, size - 1);
    return 0;
}
