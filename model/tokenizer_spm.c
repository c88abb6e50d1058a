/* SentencePiece-style BPE (tokenizer.ggml.model "llama"): spaces become "▁",
 * then adjacent pieces merge best score first, as sentencepiece's BPE model
 * does; pieces missing from the vocab fall back to <0xNN> byte tokens. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"
#include "unicode.h"

static const char SPACE_MARK[] = "\xE2\x96\x81";   /* U+2581 ▁ */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

int hkv_spm_prepare(hkv_tokenizer *t, hkv_err *err) {
    (void)err;
    for (int b = 0; b < 256; b++) {
        char name[8];
        static const char hx[] = "0123456789ABCDEF";
        memcpy(name, "<0x", 3);
        name[3] = hx[b >> 4]; name[4] = hx[b & 15]; name[5] = '>';
        t->byte_id[b] = hkv_tok_find(t, name, 6);
    }
    uint32_t o = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *s = t->text + t->text_off[id];
        uint32_t n = t->text_len[id], k = 0;
        int ty = t->types[id];
        /* sentencepiece merges only into normal, user-defined and unused pieces. */
        if (ty == HKV_TT_NORMAL || ty == HKV_TT_USER || ty == HKV_TT_UNUSED) t->flags[id] |= HKV_TF_MERGE;
        t->piece_off[id] = o;
        if (ty == HKV_TT_BYTE && n == 6 && memcmp(s, "<0x", 3) == 0 && hexval(s[3]) >= 0 &&
            hexval(s[4]) >= 0 && s[5] == '>') {
            t->piece[o + k++] = (char)(hexval(s[3]) * 16 + hexval(s[4]));
        } else if (ty == HKV_TT_NORMAL) {
            for (uint32_t i = 0; i < n;) {
                if (i + 3 <= n && memcmp(s + i, SPACE_MARK, 3) == 0) { t->piece[o + k++] = ' '; i += 3; }
                else t->piece[o + k++] = s[i++];
            }
        } else {
            memcpy(t->piece + o, s, n);
            k = n;
        }
        t->piece_len[id] = k;
        o += k;
    }
    return HKV_OK;
}

typedef struct { int32_t prev, next; uint32_t off, len; int frozen; } ssym;
typedef struct { float score; int32_t left, right; uint32_t size; } spair;

/* Best first: higher score, then the leftmost pair (sentencepiece's order). */
static inline int spair_before(spair x, spair y) {
    return x.score > y.score || (x.score == y.score && x.left < y.left);
}

static void sheap_push(spair *h, size_t *n, spair v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!spair_before(v, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static spair sheap_pop(spair *h, size_t *n) {
    spair top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && spair_before(h[c + 1], h[c])) c++;
        if (!spair_before(h[c], v)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
    return top;
}

static void try_pair(const hkv_tokenizer *t, const char *buf, const ssym *sy, int32_t l,
                     spair *h, size_t *nh) {
    int32_t r = l >= 0 ? sy[l].next : -1;
    if (r < 0 || sy[l].frozen || sy[r].frozen) return;
    uint32_t size = sy[l].len + sy[r].len;
    int32_t id = hkv_tok_find(t, buf + sy[l].off, size);
    if (id < 0 || !(t->flags[id] & HKV_TF_MERGE)) return;
    sheap_push(h, nh, (spair){t->scores[id], l, r, size});
}

int hkv_spm_encode(const hkv_tokenizer *t, const char *text, size_t len, int add_prefix,
                   hkv_tok_out *out, hkv_tok_scratch *sc, hkv_err *err) {
    if (len == 0) return HKV_OK;
    if (len > (size_t)INT32_MAX / 8)
        return hkv_seterr(err, HKV_E_RANGE, "tokenize: a text fragment of %zu bytes is too long", len);
    /* Symbols: one per character of the escaped text, ▁ one like the space
     * it replaces, so len + 1 of them. A user-defined piece is one symbol,
     * but one from a hostile vocabulary can end inside a character (a piece
     * "\xE2\x96" leaves the last byte of each ▁ a symbol of its own), so
     * with user pieces the bytes of the escaped text bound the symbols. */
    size_t blen = 3 * len + 3, nsym = t->n_user ? blen : len + 1;
    /* the escaped text, its symbols, and at most 3 heap entries per symbol */
    size_t need = blen + 16 + nsym * sizeof(ssym) + 3 * nsym * sizeof(spair);
    int rc = hkv_tok_scratch_reserve(sc, need, err);
    if (rc) return rc;
    char *buf = sc->buf;
    ssym *sy = (ssym *)((char *)sc->buf + ((blen + 15) & ~(size_t)15));
    spair *h = (spair *)(sy + nsym);

    size_t n = 0;
    if (add_prefix) { memcpy(buf, SPACE_MARK, 3); n = 3; }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(buf + n, SPACE_MARK, 3); n += 3; }
        else buf[n++] = text[i];
    }
    int32_t ns = 0;
    int has_user = t->n_user > 0;
    for (size_t i = 0, l; i < n; i += l, ns++) {
        /* A user-defined piece is one symbol that never merges (sentencepiece
         * matches them in the escaped text before BPE). */
        int frozen = has_user && hkv_tok_user_at(t, buf + i, n - i, &l) >= 0;
        if (!frozen) hkv_utf8_decode((const uint8_t *)buf + i, n - i, &l);
        sy[ns] = (ssym){ns - 1, -1, (uint32_t)i, (uint32_t)l, frozen};
        if (ns > 0) sy[ns - 1].next = ns;
    }
    size_t nh = 0;
    for (int32_t i = 0; i + 1 < ns; i++) try_pair(t, buf, sy, i, h, &nh);
    while (nh > 0) {
        spair p = sheap_pop(h, &nh);
        /* Stale when either side changed since the pair was queued. */
        if (sy[p.left].len == 0 || sy[p.right].len == 0 || sy[p.left].next != p.right ||
            sy[p.left].len + sy[p.right].len != p.size)
            continue;
        sy[p.left].len = p.size;
        sy[p.left].next = sy[p.right].next;
        if (sy[p.right].next >= 0) sy[sy[p.right].next].prev = p.left;
        sy[p.right].len = 0;
        try_pair(t, buf, sy, sy[p.left].prev, h, &nh);
        try_pair(t, buf, sy, p.left, h, &nh);
    }

    int prev_unk = 0;
    for (int32_t i = 0; i >= 0; i = sy[i].next) {
        int32_t id = hkv_tok_find(t, buf + sy[i].off, sy[i].len);
        if (id >= 0 && (t->flags[id] & HKV_TF_MERGE)) { hkv_tok_push(out, id); prev_unk = 0; continue; }
        int have_bytes = 1;
        for (uint32_t k = 0; k < sy[i].len; k++)
            have_bytes &= t->byte_id[(uint8_t)buf[sy[i].off + k]] >= 0;
        if (have_bytes) {
            for (uint32_t k = 0; k < sy[i].len; k++) hkv_tok_push(out, t->byte_id[(uint8_t)buf[sy[i].off + k]]);
            prev_unk = 0;
        } else if (t->unk >= 0 && !prev_unk) {
            /* Without byte fallback, sentencepiece folds a run of unknowns into one. */
            hkv_tok_push(out, t->unk);
            prev_unk = 1;
        }
    }
    return HKV_OK;
}
