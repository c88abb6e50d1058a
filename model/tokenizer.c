/* Tokenizer object: vocabulary, special tokens, the public encode/decode API.
 * Model-specific work is in tokenizer_bpe.c and tokenizer_spm.c; reading the
 * GGUF keys is in hkv_tokenizer_load at the end. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"
#include "hash.h"

int hkv_tok_scratch_reserve(hkv_tok_scratch *s, size_t bytes, hkv_err *err) {
    if (bytes <= s->cap) return HKV_OK;
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < bytes) cap *= 2;
    void *p = realloc(s->buf, cap);
    if (!p) return hkv_seterr(err, HKV_E_NOMEM, "tokenize: no memory for %zu bytes of scratch", cap);
    s->buf = p;
    s->cap = cap;
    return HKV_OK;
}

int32_t hkv_tok_find(const hkv_tokenizer *t, const char *s, size_t n) {
    for (uint64_t h = hkv_fnv1a(HKV_FNV1A_INIT, s, n) & t->hash_mask;; h = (h + 1) & t->hash_mask) {
        int32_t id = t->hash[h];
        if (id < 0) return -1;
        if (t->text_len[id] == n && memcmp(t->text + t->text_off[id], s, n) == 0) return id;
    }
}

void hkv_tokenizer_free(hkv_tokenizer *t) {
    if (!t) return;
    free(t->text); free(t->text_off); free(t->text_len);
    free(t->piece); free(t->piece_off); free(t->piece_len);
    free(t->scores); free(t->types); free(t->flags); free(t->hash);
    free(t->mkeys); free(t->mrank); free(t->merge_a); free(t->merge_b); free(t->merge_out);
    free(t->special); free(t->chat_template);
    free(t);
}

/* Special tokens matched in text: by first byte, then longest first. */
typedef struct { uint8_t first; uint32_t len; int32_t id; } special_key;

static int special_cmp(const void *pa, const void *pb) {
    const special_key *a = pa, *b = pb;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static int build_specials(hkv_tokenizer *t, hkv_err *err) {
    int32_t n = 0;
    special_key *keys = malloc(((size_t)t->n_vocab) * sizeof *keys);
    t->special = malloc(((size_t)t->n_vocab) * sizeof *t->special);
    if (!keys || !t->special) {
        free(keys);
        return hkv_seterr(err, HKV_E_NOMEM, "tokenizer: no memory for special tokens");
    }
    for (int32_t id = 0; id < t->n_vocab; id++) {
        int ty = t->types[id];
        if ((ty == HKV_TT_CONTROL || ty == HKV_TT_USER || ty == HKV_TT_UNKNOWN) && t->text_len[id] > 0) {
            keys[n++] = (special_key){(uint8_t)t->text[t->text_off[id]], t->text_len[id], id};
            t->n_user += ty == HKV_TT_USER;
        }
    }
    qsort(keys, (size_t)n, sizeof *keys, special_cmp);
    int32_t k = 0;
    for (int b = 0; b <= 256; b++) {
        while (k < n && keys[k].first < b) k++;
        t->special_start[b] = k;
    }
    for (int32_t i = 0; i < n; i++) t->special[i] = keys[i].id;
    free(keys);
    return HKV_OK;
}

static int is_eog_name(const char *s, uint32_t n) {
    static const char *names[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
                                  "<|endoftext|>", "<|end_of_text|>", "<end_of_turn>"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i]) == n && memcmp(names[i], s, n) == 0) return 1;
    return 0;
}

int hkv_tok_build(hkv_tokenizer **out, const hkv_tok_spec *sp, hkv_err *err) {
    *out = NULL;
    if (sp->model != HKV_TOK_BPE && sp->model != HKV_TOK_SPM)
        return hkv_seterr(err, HKV_E_INVAL, "tokenizer: unknown model kind %d", sp->model);
    if (sp->n_vocab <= 0 || sp->n_vocab > INT32_MAX / 4)
        return hkv_seterr(err, HKV_E_FORMAT, "tokenizer: vocabulary size %lld is out of range",
                          (long long)sp->n_vocab);
    if (sp->model == HKV_TOK_BPE && (sp->pre < 0 || sp->pre >= HKV_PRE_COUNT))
        return hkv_seterr(err, HKV_E_INVAL, "tokenizer: unknown pre-tokenizer %d", sp->pre);
    const int32_t ids[] = {sp->bos, sp->eos, sp->eot, sp->eom, sp->unk, sp->pad};
    const char *idn[] = {"bos", "eos", "eot", "eom", "unknown", "padding"};
    for (int i = 0; i < 6; i++)
        if (ids[i] < -1 || ids[i] >= sp->n_vocab)
            return hkv_seterr(err, HKV_E_FORMAT, "tokenizer: %s token id %d is outside the vocabulary of %lld",
                              idn[i], ids[i], (long long)sp->n_vocab);
    size_t nv = (size_t)sp->n_vocab, total = 0;
    for (size_t i = 0; i < nv; i++) {
        if (sp->tokens[i].len > UINT32_MAX / 2)
            return hkv_seterr(err, HKV_E_FORMAT, "tokenizer: token %zu is too long", i);
        total += (size_t)sp->tokens[i].len + 1;
        if (total > UINT32_MAX)
            return hkv_seterr(err, HKV_E_FORMAT, "tokenizer: token texts exceed 4 GiB");
    }
    hkv_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return hkv_seterr(err, HKV_E_NOMEM, "tokenizer: out of memory");
    t->model = sp->model;
    t->pre = sp->pre;
    t->n_vocab = (int32_t)nv;
    t->bos = sp->bos; t->eos = sp->eos; t->eot = sp->eot; t->eom = sp->eom;
    t->unk = sp->unk; t->pad = sp->pad;
    t->add_bos = sp->add_bos;
    t->add_space_prefix = sp->add_space_prefix;
    t->ignore_merges = sp->model == HKV_TOK_BPE && sp->pre == HKV_PRE_LLAMA3;
    uint64_t hcap = 16;
    while (hcap < (uint64_t)nv * 2) hcap <<= 1;
    t->hash_mask = hcap - 1;
    t->text = malloc(total);
    t->piece = malloc(total);
    t->text_off = malloc(nv * sizeof(uint32_t));
    t->text_len = malloc(nv * sizeof(uint32_t));
    t->piece_off = malloc(nv * sizeof(uint32_t));
    t->piece_len = malloc(nv * sizeof(uint32_t));
    t->scores = malloc(nv * sizeof(float));
    t->types = malloc(nv);
    t->flags = calloc(nv, 1);
    t->hash = malloc(hcap * sizeof(int32_t));
    if (sp->chat_template.ptr) {
        t->chat_template = malloc(sp->chat_template.len + 1);
        if (t->chat_template) {
            memcpy(t->chat_template, sp->chat_template.ptr, sp->chat_template.len);
            t->chat_template[sp->chat_template.len] = '\0';
        }
    }
    if (!t->text || !t->piece || !t->text_off || !t->text_len || !t->piece_off || !t->piece_len ||
        !t->scores || !t->types || !t->flags || !t->hash || (sp->chat_template.ptr && !t->chat_template)) {
        hkv_tokenizer_free(t);
        return hkv_seterr(err, HKV_E_NOMEM, "tokenizer: no memory for %zu tokens", nv);
    }
    memset(t->hash, 0xFF, hcap * sizeof(int32_t));
    uint32_t o = 0;
    for (size_t i = 0; i < nv; i++) {
        hkv_str s = sp->tokens[i];
        t->text_off[i] = o;
        t->text_len[i] = (uint32_t)s.len;
        if (s.len) memcpy(t->text + o, s.ptr, s.len);
        t->text[o + s.len] = '\0';
        o += (uint32_t)s.len + 1;
        t->scores[i] = sp->scores ? sp->scores[i] : 0.0f;
        t->types[i] = (uint8_t)(sp->types ? sp->types[i] : HKV_TT_NORMAL);
        if (sp->types && (sp->types[i] < HKV_TT_NORMAL || sp->types[i] > HKV_TT_BYTE))
            t->types[i] = HKV_TT_NORMAL;   /* undefined types behave as normal text */
        /* A repeated text keeps its first id, as a dictionary load would. */
        if (hkv_tok_find(t, s.ptr, s.len) >= 0) continue;
        uint64_t h = hkv_fnv1a(HKV_FNV1A_INIT, s.ptr, s.len) & t->hash_mask;
        while (t->hash[h] >= 0) h = (h + 1) & t->hash_mask;
        t->hash[h] = (int32_t)i;
    }
    for (size_t i = 0; i < nv; i++) {
        int ty = t->types[i];
        if ((ty == HKV_TT_CONTROL || ty == HKV_TT_USER) &&
            is_eog_name(t->text + t->text_off[i], t->text_len[i]))
            t->flags[i] |= HKV_TF_EOG;
    }
    if (t->eos >= 0) t->flags[t->eos] |= HKV_TF_EOG;
    if (t->eot >= 0) t->flags[t->eot] |= HKV_TF_EOG;
    if (t->eom >= 0) t->flags[t->eom] |= HKV_TF_EOG;

    int rc = sp->model == HKV_TOK_BPE ? hkv_bpe_prepare(t, sp, err) : hkv_spm_prepare(t, err);
    if (!rc) rc = build_specials(t, err);
    if (rc) { hkv_tokenizer_free(t); return rc; }
    *out = t;
    return HKV_OK;
}

int32_t hkv_tokenizer_n_vocab(const hkv_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t hkv_tokenizer_bos(const hkv_tokenizer *t) { return t ? t->bos : -1; }
int32_t hkv_tokenizer_eos(const hkv_tokenizer *t) { return t ? t->eos : -1; }
int hkv_tokenizer_add_bos(const hkv_tokenizer *t) { return t ? t->add_bos : 0; }

int hkv_tokenizer_is_eog(const hkv_tokenizer *t, int32_t tok) {
    return t && tok >= 0 && tok < t->n_vocab && (t->flags[tok] & HKV_TF_EOG);
}

/* Longest special token starting at text[q] whose type is in mask (bits
 * 1 << HKV_TT_*). */
static int32_t special_at(const hkv_tokenizer *t, const char *text, size_t len, size_t q,
                          unsigned mask, size_t *mlen) {
    uint8_t b = (uint8_t)text[q];
    for (int32_t k = t->special_start[b]; k < t->special_start[b + 1]; k++) {
        int32_t id = t->special[k];
        uint32_t n = t->text_len[id];
        if (!(mask & 1u << t->types[id])) continue;
        if (n <= len - q && memcmp(text + q, t->text + t->text_off[id], n) == 0) {
            *mlen = n;
            return id;
        }
    }
    return -1;
}

int32_t hkv_tok_user_at(const hkv_tokenizer *t, const char *s, size_t n, size_t *mlen) {
    return special_at(t, s, n, 0, 1u << HKV_TT_USER, mlen);
}

int hkv_tokenize(const hkv_tokenizer *t, const char *text, size_t len, int add_bos,
                 int parse_special, int32_t *out, int64_t cap, int64_t *n_out, hkv_err *err) {
    if (n_out) *n_out = 0;
    if (!t || !n_out || (!text && len) || cap < 0 || (!out && cap > 0))
        return hkv_seterr(err, HKV_E_INVAL, "hkv_tokenize: NULL tokenizer, text, output or count");
    hkv_tok_out o = {out, cap, 0};
    hkv_tok_scratch sc = {NULL, 0};
    int rc = HKV_OK, prev_special = 1;
    if (add_bos && t->bos >= 0) hkv_tok_push(&o, t->bos);
    /* Control (and unknown) tokens split the text only with parse_special.
     * User-defined ones always do, as HF added tokens do; under SentencePiece
     * they are matched inside the fragment instead, as sentencepiece does. */
    unsigned mask = parse_special ? 1u << HKV_TT_CONTROL | 1u << HKV_TT_UNKNOWN : 0;
    if (t->model == HKV_TOK_BPE) mask |= 1u << HKV_TT_USER;
    size_t p = 0, q = 0;
    while (p < len && rc == HKV_OK) {
        size_t mlen = 0;
        int32_t sid = -1;
        while (q < len && (!mask || (sid = special_at(t, text, len, q, mask, &mlen)) < 0)) q++;
        if (q > p) {   /* the plain text before the special token (or the end) */
            rc = t->model == HKV_TOK_BPE
                     ? hkv_bpe_encode(t, text + p, q - p, &o, &sc, err)
                     : hkv_spm_encode(t, text + p, q - p, t->add_space_prefix && prev_special, &o, &sc, err);
            prev_special = 0;
        }
        if (sid >= 0) { hkv_tok_push(&o, sid); prev_special = 1; q += mlen; }
        p = q;
    }
    free(sc.buf);
    if (rc) return rc;
    *n_out = o.n;
    if (o.n > cap)
        return hkv_seterr(err, HKV_E_RANGE, "hkv_tokenize: %lld tokens do not fit the output of %lld",
                          (long long)o.n, (long long)cap);
    return HKV_OK;
}

/* Control, unknown and unused tokens are markup: shown only on request. */
static int is_markup(const hkv_tokenizer *t, int32_t tok) {
    int ty = t->types[tok];
    return ty == HKV_TT_CONTROL || ty == HKV_TT_UNKNOWN || ty == HKV_TT_UNUSED;
}

int hkv_token_to_piece(const hkv_tokenizer *t, int32_t tok, int render_special, char *buf, size_t cap) {
    if (!t || tok < 0 || tok >= t->n_vocab || (!buf && cap)) return HKV_E_INVAL;
    if (is_markup(t, tok) && !render_special) return 0;
    uint32_t n = t->piece_len[tok];
    if (n > cap || n > INT32_MAX) return HKV_E_RANGE;
    memcpy(buf, t->piece + t->piece_off[tok], n);
    return (int)n;
}

int64_t hkv_detokenize(const hkv_tokenizer *t, const int32_t *toks, int64_t n, int render_special,
                       char *buf, size_t cap) {
    if (!t || (!toks && n > 0) || n < 0 || !buf || cap == 0) return HKV_E_INVAL;
    /* SentencePiece text starts with the "▁" it was given; drop that space. */
    int strip = t->model == HKV_TOK_SPM && t->add_space_prefix;
    size_t o = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t tok = toks[i];
        if (tok < 0 || tok >= t->n_vocab) return HKV_E_INVAL;
        if (is_markup(t, tok) && !render_special) continue;
        const char *s = t->piece + t->piece_off[tok];
        size_t k = t->piece_len[tok];
        if (strip && k > 0) {
            if (s[0] == ' ' && !is_markup(t, tok) && t->types[tok] != HKV_TT_USER) { s++; k--; }
            strip = 0;
        }
        if (k >= cap - o) return HKV_E_RANGE;
        memcpy(buf + o, s, k);
        o += k;
    }
    buf[o] = '\0';
    return (int64_t)o;
}

/* ---- loading from GGUF ---------------------------------------------------- */

/* Optional token id key: absent or -1/UINT32_MAX (a common "none") give -1. */
static int get_id(const hkv_gguf *g, const char *key, int32_t *id, hkv_err *err) {
    int64_t v;
    *id = -1;
    int rc = hkv_gguf_get_i64(g, key, &v, err);
    if (rc == HKV_E_NOTFOUND) { hkv_err_clear(err); return HKV_OK; }
    if (rc) return rc;
    if (v == -1 || v == (int64_t)UINT32_MAX) return HKV_OK;
    if (v < 0 || v > INT32_MAX) return hkv_seterr(err, HKV_E_FORMAT, "tokenizer: %s = %lld is not a token id", key, (long long)v);
    *id = (int32_t)v;
    return HKV_OK;
}

static int get_flag(const hkv_gguf *g, const char *key, int dflt, int *out, hkv_err *err) {
    *out = dflt;
    int rc = hkv_gguf_get_bool(g, key, out, err);
    if (rc == HKV_E_NOTFOUND) { hkv_err_clear(err); *out = dflt; return HKV_OK; }
    return rc;
}

/* Numeric array of n_vocab elements copied out of the mapping (which may be
 * unaligned); absent gives NULL. */
static int get_vocab_arr(const hkv_gguf *g, const char *key, int type, int64_t n_vocab, void **out,
                         hkv_err *err) {
    const hkv_gguf_kv *kv;
    *out = NULL;
    int rc = hkv_gguf_get_arr(g, key, type, &kv, err);
    if (rc == HKV_E_NOTFOUND) { hkv_err_clear(err); return HKV_OK; }
    if (rc) return rc;
    if ((int64_t)kv->arr_n != n_vocab)
        return hkv_seterr(err, HKV_E_FORMAT, "tokenizer: %s has %llu entries for %lld tokens", key,
                          (unsigned long long)kv->arr_n, (long long)n_vocab);
    *out = malloc((size_t)n_vocab * 4);
    if (!*out) return hkv_seterr(err, HKV_E_NOMEM, "tokenizer: no memory for %s", key);
    memcpy(*out, kv->val, (size_t)n_vocab * 4);
    return HKV_OK;
}

int hkv_tokenizer_load_file(hkv_tokenizer **out, const char *path, hkv_err *err) {
    hkv_gguf *g = NULL;
    int rc = hkv_gguf_open(&g, path, err);
    if (!rc) rc = hkv_tokenizer_load(out, g, err);
    hkv_gguf_close(g);   /* the tokenizer keeps its own copy */
    return rc;
}

int hkv_tokenizer_load(hkv_tokenizer **out, const hkv_gguf *g, hkv_err *err) {
    if (!out || !g) return hkv_seterr(err, HKV_E_INVAL, "hkv_tokenizer_load: NULL argument");
    *out = NULL;
    hkv_tok_spec sp;
    memset(&sp, 0, sizeof sp);
    hkv_str model, pre;
    const hkv_gguf_kv *kv;
    int rc = hkv_gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (rc) return rc;
    if (hkv_str_eq(model, "gpt2")) sp.model = HKV_TOK_BPE;
    else if (hkv_str_eq(model, "llama")) sp.model = HKV_TOK_SPM;
    else return hkv_seterr(err, HKV_E_UNSUPPORTED, "tokenizer: tokenizer.ggml.model \"%.*s\" is not supported "
                           "(supported: gpt2, llama)", (int)(model.len > 64 ? 64 : model.len), model.ptr);
    rc = hkv_gguf_get_arr(g, "tokenizer.ggml.tokens", HKV_GGUF_STRING, &kv, err);
    if (rc) return rc;
    sp.n_vocab = (int64_t)kv->arr_n;
    sp.tokens = kv->arr_str;
    sp.pre = HKV_PRE_GPT2;
    if (sp.model == HKV_TOK_BPE) {
        rc = hkv_gguf_get_str(g, "tokenizer.ggml.pre", &pre, err);
        if (rc == HKV_OK) {
            sp.pre = hkv_tok_pre_from_name(pre.ptr, pre.len);
            if (sp.pre < 0)
                return hkv_seterr(err, HKV_E_UNSUPPORTED, "tokenizer: pre-tokenizer tokenizer.ggml.pre = \"%.*s\" "
                                  "is not supported (supported: gpt2, default, smollm, starcoder, llama3, "
                                  "llama-bpe, qwen2)", (int)(pre.len > 64 ? 64 : pre.len), pre.ptr);
        } else if (rc == HKV_E_NOTFOUND) {
            hkv_err_clear(err);
        } else {
            return rc;
        }
        rc = hkv_gguf_get_arr(g, "tokenizer.ggml.merges", HKV_GGUF_STRING, &kv, err);
        if (rc) return hkv_err_prefix(err, "byte-level BPE needs its merges");
        sp.n_merges = (int64_t)kv->arr_n;
        sp.merges = kv->arr_str;
    }
    if ((rc = get_id(g, "tokenizer.ggml.bos_token_id", &sp.bos, err)) ||
        (rc = get_id(g, "tokenizer.ggml.eos_token_id", &sp.eos, err)) ||
        (rc = get_id(g, "tokenizer.ggml.eot_token_id", &sp.eot, err)) ||
        (rc = get_id(g, "tokenizer.ggml.eom_token_id", &sp.eom, err)) ||
        (rc = get_id(g, "tokenizer.ggml.unknown_token_id", &sp.unk, err)) ||
        (rc = get_id(g, "tokenizer.ggml.padding_token_id", &sp.pad, err)) ||
        (rc = get_flag(g, "tokenizer.ggml.add_bos_token",
                       sp.model == HKV_TOK_SPM || sp.pre == HKV_PRE_LLAMA3, &sp.add_bos, err)) ||
        (rc = get_flag(g, "tokenizer.ggml.add_space_prefix", sp.model == HKV_TOK_SPM, &sp.add_space_prefix, err)))
        return rc;
    hkv_str tmpl;
    rc = hkv_gguf_get_str(g, "tokenizer.chat_template", &tmpl, err);
    if (rc == HKV_OK) sp.chat_template = tmpl;
    else if (rc == HKV_E_NOTFOUND) hkv_err_clear(err);
    else return rc;

    void *scores = NULL, *types = NULL;
    rc = get_vocab_arr(g, "tokenizer.ggml.scores", HKV_GGUF_F32, sp.n_vocab, &scores, err);
    if (!rc) rc = get_vocab_arr(g, "tokenizer.ggml.token_type", HKV_GGUF_I32, sp.n_vocab, &types, err);
    if (!rc) {
        sp.scores = scores;
        sp.types = types;
        rc = hkv_tok_build(out, &sp, err);
    }
    free(scores);
    free(types);
    return rc;
}
