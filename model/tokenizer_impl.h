/* Private to tokenizer*.c and chat_template.c: the tokenizer object, the
 * builder behind hkv_tokenizer_load, and the model-specific encoders. */
#ifndef HKV_TOKENIZER_IMPL_H
#define HKV_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

enum hkv_tok_model { HKV_TOK_BPE = 1, HKV_TOK_SPM = 2 };

/* Pre-tokenizer of the byte-level BPE model (tokenizer.ggml.pre). */
enum hkv_tok_pre {
    HKV_PRE_GPT2 = 0,   /* 's|'t|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    HKV_PRE_SMOLLM,     /* every \p{N} alone, then GPT-2 on the rest */
    HKV_PRE_LLAMA3,     /* (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|... */
    HKV_PRE_QWEN2,      /* as LLAMA3 with \p{N} one at a time */
    HKV_PRE_COUNT
};

/* token_type values of tokenizer.ggml.token_type */
enum hkv_tok_type {
    HKV_TT_NORMAL = 1, HKV_TT_UNKNOWN = 2, HKV_TT_CONTROL = 3,
    HKV_TT_USER = 4, HKV_TT_UNUSED = 5, HKV_TT_BYTE = 6,
};

/* Everything the tokenizer needs, as plain arrays: hkv_tokenizer_load fills
 * it from GGUF keys; unit tests fill it by hand. */
typedef struct hkv_tok_spec {
    int model;                  /* enum hkv_tok_model */
    int pre;                    /* enum hkv_tok_pre (BPE only) */
    int64_t n_vocab;
    const hkv_str *tokens;      /* n_vocab token texts */
    const float *scores;        /* n_vocab, or NULL (SPM: all 0) */
    const int32_t *types;       /* n_vocab, or NULL (all NORMAL) */
    int64_t n_merges;
    const hkv_str *merges;      /* BPE: "left right", rank = index */
    int32_t bos, eos, eot, eom, unk, pad;   /* -1 when absent */
    int add_bos;
    int add_space_prefix;       /* SPM: prepend "▁" to text */
    hkv_str chat_template;      /* ptr NULL when absent */
} hkv_tok_spec;

int hkv_tok_build(hkv_tokenizer **out, const hkv_tok_spec *spec, hkv_err *err);
/* Name -> enum hkv_tok_pre; -1 when unknown. */
int hkv_tok_pre_from_name(const char *name, size_t len);

/* Per-token flags in hkv_tokenizer.flags */
#define HKV_TF_EOG 1u      /* generation stops here */
#define HKV_TF_MERGE 2u    /* SPM: a piece merges may produce (normal, user, unused) */

struct hkv_tokenizer {
    int model, pre;
    int32_t n_vocab;
    char *text;                 /* token texts, each NUL-terminated */
    uint32_t *text_off, *text_len;
    char *piece;                /* decoded bytes of normal/user/byte tokens */
    uint32_t *piece_off, *piece_len;
    float *scores;
    uint8_t *types, *flags;
    int32_t *hash;              /* open addressing, text -> id, -1 empty */
    uint64_t hash_mask;
    /* BPE merges: pair (a, b) -> rank; merge_a/b/out indexed by rank. */
    uint64_t *mkeys;            /* a << 32 | b, UINT64_MAX empty */
    uint32_t *mrank;
    uint64_t mmask;
    int32_t *merge_a, *merge_b, *merge_out;
    int64_t n_merges;
    int ignore_merges;          /* whole word in vocab wins (Llama 3) */
    int32_t byte_id[256];       /* BPE: GPT-2 char of the byte; SPM: <0xNN>; -1 */
    /* Special tokens matched in text, longest first, bucketed by first byte. */
    int32_t *special;
    int32_t special_start[257];
    int32_t n_user;             /* user-defined tokens (type 4) among them */
    int32_t bos, eos, eot, eom, unk, pad;
    int add_bos, add_space_prefix;
    char *chat_template;        /* NUL-terminated copy or NULL */
};

/* Id of the token with this exact text, or -1. */
int32_t hkv_tok_find(const hkv_tokenizer *t, const char *s, size_t n);

/* User-defined token at s[0..n) (longest), or -1; *mlen its length. */
int32_t hkv_tok_user_at(const hkv_tokenizer *t, const char *s, size_t n, size_t *mlen);

/* Output list with a capacity; counts past the end so callers learn the size. */
typedef struct hkv_tok_out {
    int32_t *ids;
    int64_t cap, n;
} hkv_tok_out;

static inline void hkv_tok_push(hkv_tok_out *o, int32_t id) {
    if (o->n < o->cap) o->ids[o->n] = id;
    o->n++;
}

/* Scratch reused across fragments of one call (no state in the tokenizer,
 * so one tokenizer serves many threads). */
typedef struct hkv_tok_scratch {
    void *buf;
    size_t cap;
} hkv_tok_scratch;
int hkv_tok_scratch_reserve(hkv_tok_scratch *s, size_t bytes, hkv_err *err);

/* Pre-tokenizer: calls fn for each pre-token of text[0..len). A non-zero
 * return from fn stops the walk and is returned. */
typedef int (*hkv_chunk_fn)(void *ctx, const char *s, size_t n);
int hkv_pretokenize(int pre, const char *text, size_t len, hkv_chunk_fn fn, void *ctx);

/* Encode one fragment of plain text (no special tokens inside). */
int hkv_bpe_encode(const hkv_tokenizer *t, const char *text, size_t len,
                   hkv_tok_out *out, hkv_tok_scratch *sc, hkv_err *err);
int hkv_spm_encode(const hkv_tokenizer *t, const char *text, size_t len, int add_prefix,
                   hkv_tok_out *out, hkv_tok_scratch *sc, hkv_err *err);

/* Model-specific setup at build: merges map (BPE), decoded pieces. */
int hkv_bpe_prepare(hkv_tokenizer *t, const hkv_tok_spec *spec, hkv_err *err);
int hkv_spm_prepare(hkv_tokenizer *t, hkv_err *err);

#endif
