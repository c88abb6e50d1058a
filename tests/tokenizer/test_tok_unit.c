/* Unit tests of the tokenizer pieces that need no GGUF file: UTF-8, code
 * point classes, the GPT-2 byte map, the pre-tokenizers, the BPE and
 * SentencePiece merge loops on hand-made vocabularies, special tokens,
 * decoding, chat templates and error paths. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"
#include "unicode.h"

static int failures;
#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            failures++;                                                         \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

static void test_utf8(void) {
    char b[4];
    size_t l;
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp += (cp < 0x3000 ? 1 : 97)) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        int n = hkv_utf8_encode(cp, b);
        uint32_t back = hkv_utf8_decode((const uint8_t *)b, (size_t)n, &l);
        CHECK(back == cp && l == (size_t)n, "U+%04X round trip gave U+%04X (%zu bytes)", cp, back, l);
    }
    static const char *bad[] = {"\x80", "\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xE2\x82"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint32_t cp = hkv_utf8_decode((const uint8_t *)bad[i], strlen(bad[i]), &l);
        CHECK(cp == HKV_UBAD && l == 1, "invalid sequence %zu decoded as U+%04X len %zu", i, cp, l);
    }
}

static void test_classes(void) {
    static const struct { uint32_t cp; int cls; } cases[] = {
        {'a', HKV_UC_LETTER}, {'Z', HKV_UC_LETTER}, {0xE9, HKV_UC_LETTER}, {0x4E2D, HKV_UC_LETTER},
        {0x02B0, HKV_UC_LETTER}, {0x1D400, HKV_UC_LETTER}, {'7', HKV_UC_NUMBER}, {0x0663, HKV_UC_NUMBER},
        {0xBD, HKV_UC_NUMBER}, {0x216B, HKV_UC_NUMBER}, {0xB2, HKV_UC_NUMBER}, {' ', HKV_UC_SPACE},
        {'\t', HKV_UC_SPACE}, {'\r', HKV_UC_SPACE}, {0x85, HKV_UC_SPACE}, {0xA0, HKV_UC_SPACE},
        {0x3000, HKV_UC_SPACE}, {0x2029, HKV_UC_SPACE}, {0x1C, HKV_UC_OTHER}, {0x200B, HKV_UC_OTHER},
        {'!', HKV_UC_OTHER}, {0x1F600, HKV_UC_OTHER}, {0x0301, HKV_UC_OTHER}, {0x10FFFF, HKV_UC_OTHER},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK(hkv_uclass(cases[i].cp) == cases[i].cls, "class of U+%04X is %d, want %d", cases[i].cp,
              hkv_uclass(cases[i].cp), cases[i].cls);
}

static void test_byte_map(void) {
    int seen[512] = {0};
    for (int b = 0; b < 256; b++) {
        uint32_t cp = hkv_byte_to_cp((uint8_t)b);
        CHECK(cp < 512 && !seen[cp], "byte %d maps to U+%04X twice or out of range", b, cp);
        if (cp < 512) seen[cp] = 1;
        CHECK(hkv_cp_to_byte(cp) == b, "byte %d -> U+%04X -> %d", b, cp, hkv_cp_to_byte(cp));
    }
    CHECK(hkv_byte_to_cp(' ') == 0x120 && hkv_byte_to_cp('\n') == 0x10A && hkv_byte_to_cp(0xAD) == 0x143,
          "GPT-2 images of space, newline, soft hyphen");
    CHECK(hkv_cp_to_byte(0x20) == -1 && hkv_cp_to_byte(0x2581) == -1, "non-images map to -1");
}

typedef struct { char out[1024]; size_t n; } joined;

static int join_chunk(void *ctx, const char *s, size_t n) {
    joined *j = ctx;
    if (j->n + n + 2 > sizeof j->out) return 1;
    memcpy(j->out + j->n, s, n);
    j->n += n;
    j->out[j->n++] = '|';
    j->out[j->n] = '\0';
    return 0;
}

static void test_pretokenize(void) {
    /* Expected splits checked against HF tokenizers' Split(Regex) and Digits. */
    static const struct { const char *pre, *in, *want; } cases[] = {
        {"gpt2", "I'm   here, they'LL go!!", "I|'m|  | here|,| they|'|LL| go|!!|"},
        {"llama3", "I'm   here, they'LL go!!", "I|'m|  | here|,| they|'LL| go|!!|"},
        {"gpt2", "x  \n\n  y\t\tz  ", "x|  \n\n | y|\t|\t|z|  |"},
        {"llama3", "x  \n\n  y\t\tz  ", "x|  \n\n| | y|\t|\tz|  |"},
        {"gpt2", "abc12345 678x", "abc|12345| 678|x|"},
        {"smollm", "abc12345 678x", "abc|1|2|3|4|5| |6|7|8|x|"},
        {"llama3", "abc12345 678x", "abc|123|45| |678|x|"},
        {"qwen2", "abc12345 678x", "abc|1|2|3|4|5| |6|7|8|x|"},
        {"smollm", "  lead", " | lead|"},
        {"gpt2", "end  ", "end|  |"},
        {"smollm", "\xC3\xA9\xE4\xB8\xAD \xC2\xBD ok", "\xC3\xA9\xE4\xB8\xAD| |\xC2\xBD| ok|"},
        {"gpt2", "a\r\n\r\nb ...\n", "a|\r\n\r|\n|b| ...|\n|"},
        {"llama3", "a\r\n\r\nb ...\n", "a|\r\n\r\n|b| ...\n|"},
        {"qwen2", "don't DON'T", "don|'t| DON|'T|"},
        {"llama3", "?!abc", "?!|abc|"},
        {"llama3", "'\xC5\xBFx", "'\xC5\xBF|x|"},   /* (?i) folds U+017F to s */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        joined j = {{0}, 0};
        int pre = hkv_tok_pre_from_name(cases[i].pre, strlen(cases[i].pre));
        hkv_pretokenize(pre, cases[i].in, strlen(cases[i].in), join_chunk, &j);
        CHECK(strcmp(j.out, cases[i].want) == 0, "%s split of case %zu: got \"%s\"", cases[i].pre, i, j.out);
    }
    CHECK(hkv_tok_pre_from_name("nope", 4) == -1, "unknown pre-tokenizer name");
}

/* A byte-level vocabulary: the 256 byte images, then merged tokens, then
 * specials. Tokens are given in GPT-2 spelling (Ġ for space). */
static hkv_tokenizer *toy_bpe(const char *tmpl, hkv_err *err) {
    static const char *extra[] = {"he", "ll", "hell", "hello", "\xC4\xA0w", "or", "\xC4\xA0wor", "ld",
                                  "\xC4\xA0world", "<|im_start|>", "<|im_end|>", "<tag>", "<|im"};
    static const char *merges[] = {"h e", "l l", "he ll", "hell o", "\xC4\xA0 w", "o r", "\xC4\xA0w or",
                                   "l d", "\xC4\xA0wor ld", "x y"};
    enum { NB = 256, NE = sizeof extra / sizeof extra[0], NM = sizeof merges / sizeof merges[0] };
    static char bytes[NB][4];
    hkv_str toks[NB + NE], mg[NM];
    int32_t types[NB + NE];
    for (int b = 0; b < NB; b++) {
        int n = hkv_utf8_encode(hkv_byte_to_cp((uint8_t)b), bytes[b]);
        toks[b] = (hkv_str){bytes[b], (uint64_t)n};
        types[b] = HKV_TT_NORMAL;
    }
    for (int i = 0; i < NE; i++) {
        toks[NB + i] = (hkv_str){extra[i], strlen(extra[i])};
        types[NB + i] = HKV_TT_NORMAL;
    }
    types[NB + 9] = types[NB + 10] = types[NB + 12] = HKV_TT_CONTROL;
    types[NB + 11] = HKV_TT_USER;
    for (int i = 0; i < NM; i++) mg[i] = (hkv_str){merges[i], strlen(merges[i])};
    hkv_tok_spec sp = {.model = HKV_TOK_BPE, .pre = HKV_PRE_GPT2, .n_vocab = NB + NE, .tokens = toks,
                       .types = types, .n_merges = NM, .merges = mg, .bos = -1, .eos = NB + 10,
                       .eot = -1, .eom = -1, .unk = -1, .pad = -1,
                       .chat_template = {tmpl, tmpl ? strlen(tmpl) : 0}};
    hkv_tokenizer *t = NULL;
    int rc = hkv_tok_build(&t, &sp, err);
    CHECK(rc == HKV_OK, "toy BPE build: %s", err->msg);
    return t;
}

static int ids_eq(const int32_t *got, int64_t n, const int32_t *want, int64_t nw) {
    if (n != nw) return 0;
    for (int64_t i = 0; i < n; i++)
        if (got[i] != want[i]) return 0;
    return 1;
}

static void test_bpe(void) {
    hkv_err err;
    hkv_err_clear(&err);
    hkv_tokenizer *t = toy_bpe(NULL, &err);
    if (!t) return;
    int32_t ids[64];
    int64_t n;
    int rc = hkv_tokenize(t, "hello world", 11, 0, 0, ids, 64, &n, &err);
    int32_t w1[] = {259, 264};
    CHECK(rc == HKV_OK && ids_eq(ids, n, w1, 2), "hello world: rc %d n %lld", rc, (long long)n);
    /* Specials: control only with parse_special, user-defined always, longest first. */
    const char *s = "<|im_start|>hello<tag><|im";
    rc = hkv_tokenize(t, s, strlen(s), 0, 1, ids, 64, &n, &err);
    int32_t w2[] = {265, 259, 267, 268};
    CHECK(rc == HKV_OK && ids_eq(ids, n, w2, 4), "specials parsed: n %lld", (long long)n);
    rc = hkv_tokenize(t, s, strlen(s), 0, 0, ids, 64, &n, &err);
    CHECK(rc == HKV_OK && n > 4 && ids[0] == hkv_tok_find(t, "<", 1), "specials not parsed: first id %d", ids[0]);
    int found_tag = 0;
    for (int64_t i = 0; i < n; i++) found_tag |= ids[i] == 267;
    CHECK(found_tag, "user-defined <tag> is matched without parse_special");
    /* Capacity: RANGE with the needed count. */
    rc = hkv_tokenize(t, "hello world", 11, 0, 0, ids, 1, &n, &err);
    CHECK(rc == HKV_E_RANGE && n == 2, "short output gives RANGE and the count (rc %d n %lld)", rc, (long long)n);
    /* Decoding, with and without special tokens. */
    char buf[256];
    int32_t d[] = {265, 259, 264, 266};
    int64_t k = hkv_detokenize(t, d, 4, 0, buf, sizeof buf);
    CHECK(k == 11 && strcmp(buf, "hello world") == 0, "decode without specials: \"%s\"", buf);
    k = hkv_detokenize(t, d, 4, 1, buf, sizeof buf);
    CHECK(strcmp(buf, "<|im_start|>hello world<|im_end|>") == 0, "decode with specials: \"%s\"", buf);
    CHECK(hkv_detokenize(t, d, 4, 1, buf, 8) == HKV_E_RANGE, "decode into a short buffer");
    CHECK(hkv_token_to_piece(t, 999, 0, buf, sizeof buf) == HKV_E_INVAL, "piece of a bad id");
    CHECK(hkv_token_to_piece(t, 264, 0, buf, sizeof buf) == 6 && memcmp(buf, " world", 6) == 0, "piece Ġworld");
    /* Every byte string round-trips, invalid UTF-8 included. */
    const char *odd = "\xff\xfe a\x80\tb \xe4\xb8";
    rc = hkv_tokenize(t, odd, strlen(odd), 0, 0, ids, 64, &n, &err);
    k = hkv_detokenize(t, ids, n, 0, buf, sizeof buf);
    CHECK(rc == HKV_OK && k == (int64_t)strlen(odd) && memcmp(buf, odd, (size_t)k) == 0, "invalid UTF-8 round trip");
    /* Random bytes (any UTF-8 validity) round-trip through every pre-tokenizer. */
    uint64_t x = 88172645463325252ULL;
    for (int r = 0; r < 400; r++) {
        char in[48];
        size_t len = (size_t)(r % 48);
        for (size_t i = 0; i < len; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            in[i] = x % 5 == 0 ? " \n\t'0"[(x >> 3) % 5] : (char)(x >> 8);
        }
        t->pre = r % HKV_PRE_COUNT;
        rc = hkv_tokenize(t, in, len, 0, 1, ids, 64, &n, &err);
        k = rc ? -1 : hkv_detokenize(t, ids, n, 1, buf, sizeof buf);
        CHECK(k == (int64_t)len && memcmp(buf, in, len) == 0, "random bytes %d round trip (rc %d)", r, rc);
    }
    t->pre = HKV_PRE_GPT2;
    CHECK(hkv_tokenizer_is_eog(t, 266) && !hkv_tokenizer_is_eog(t, 265) && !hkv_tokenizer_is_eog(t, -1),
          "eog: eos and <|im_end|> only");
    CHECK(hkv_tokenize(NULL, "a", 1, 0, 0, ids, 64, &n, &err) == HKV_E_INVAL, "NULL tokenizer");
    hkv_tokenizer_free(t);
}

/* SentencePiece: pieces with scores; merges pick the best score first. */
static void test_spm(void) {
    static const char *pieces[] = {"<unk>", "<s>", "</s>", "<0x41>", "<0x0A>", "\xE2\x96\x81", "a", "b", "c",
                                   "ab", "bc", "\xE2\x96\x81" "a", "\xE2\x96\x81" "ab", "abc"};
    static const float scores[] = {0, 0, 0, 0, 0, -1, -2, -3, -4, -5, -1.5f, -6, -7, -8};
    static const int32_t types[] = {2, 3, 3, 6, 6, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    enum { N = sizeof pieces / sizeof pieces[0] };
    hkv_str toks[N];
    for (int i = 0; i < N; i++) toks[i] = (hkv_str){pieces[i], strlen(pieces[i])};
    hkv_tok_spec sp = {.model = HKV_TOK_SPM, .n_vocab = N, .tokens = toks, .scores = scores, .types = types,
                       .bos = 1, .eos = 2, .eot = -1, .eom = -1, .unk = 0, .pad = -1, .add_bos = 1,
                       .add_space_prefix = 1};
    hkv_err err;
    hkv_err_clear(&err);
    hkv_tokenizer *t = NULL;
    CHECK(hkv_tok_build(&t, &sp, &err) == HKV_OK, "SPM build: %s", err.msg);
    if (!t) return;
    int32_t ids[64];
    int64_t n;
    /* "▁abc": bc (-1.5) beats ab (-5) and ▁a (-6); then ▁a (-6) beats abc (-8). */
    int rc = hkv_tokenize(t, "abc", 3, 1, 0, ids, 64, &n, &err);
    int32_t w1[] = {1, 11, 10};
    CHECK(rc == HKV_OK && ids_eq(ids, n, w1, 3), "abc: n %lld ids %d %d %d", (long long)n, ids[0], ids[1], ids[2]);
    /* 'A' and newline fall back to bytes; 'Z' has no byte token: one unknown for the run. */
    rc = hkv_tokenize(t, "A\nZZ", 4, 0, 0, ids, 64, &n, &err);
    int32_t w2[] = {5, 3, 4, 0};
    CHECK(rc == HKV_OK && ids_eq(ids, n, w2, 4), "byte fallback: n %lld", (long long)n);
    char buf[64];
    int32_t d[] = {1, 5, 6, 10, 3, 4};
    int64_t k = hkv_detokenize(t, d, 6, 0, buf, sizeof buf);
    CHECK(k == 5 && strcmp(buf, "abcA\n") == 0, "SPM decode strips the prefix space: \"%s\"", buf);
    /* "<s>" in text is a control token only with parse_special; no merge ever forms it. */
    rc = hkv_tokenize(t, "<s>", 3, 0, 1, ids, 64, &n, &err);
    CHECK(rc == HKV_OK && n == 1 && ids[0] == 1, "<s> parsed as BOS");
    hkv_tokenizer_free(t);
}

/* A user-defined piece that ends inside the 3 bytes of "▁" (a hostile
 * vocabulary: "\xE2") leaves the other bytes of each ▁ symbols of their own:
 * more symbols than the text has characters. They overflowed the symbol
 * array into the merge heap, whose entries then overwrote them, and the
 * symbol list could loop forever (found by fuzz_tokenizer). */
static void test_spm_user_splits_space_mark(void) {
    static const char *pieces[] = {"<unk>", "<s>", "\xE2", "\x96\x81", "a", "<0x96>", "<0x81>"};
    static const float scores[] = {0, 0, 0, -1, -2, 0, 0};
    static const int32_t types[] = {2, 3, 4, 1, 1, 6, 6};
    enum { N = sizeof pieces / sizeof pieces[0] };
    hkv_str toks[N];
    for (int i = 0; i < N; i++) toks[i] = (hkv_str){pieces[i], strlen(pieces[i])};
    hkv_tok_spec sp = {.model = HKV_TOK_SPM, .n_vocab = N, .tokens = toks, .scores = scores,
                       .types = types, .bos = 1, .eos = -1, .eot = -1, .eom = -1, .unk = 0, .pad = -1,
                       .add_space_prefix = 1};
    hkv_err err;
    hkv_err_clear(&err);
    hkv_tokenizer *t = NULL;
    CHECK(hkv_tok_build(&t, &sp, &err) == HKV_OK, "build: %s", err.msg);
    if (!t) return;
    char text[200];
    memset(text, ' ', 199);
    text[199] = 'a';
    static int32_t ids[512];
    int64_t n = 0;
    int rc = hkv_tokenize(t, text, 200, 0, 0, ids, 512, &n, &err);
    /* 200 ▁ (the prefix and 199 spaces): each the user piece, then its last
     * two bytes merged; then a */
    int ok = rc == HKV_OK && n == 401 && ids[400] == 4;
    for (int64_t i = 0; ok && i < 400; i++) ok = ids[i] == (i % 2 ? 3 : 2);
    CHECK(ok, "rc %d, %lld ids (want 401: 200 x [2 3], 4)", rc, (long long)n);
    hkv_tokenizer_free(t);
}

static void test_chat(void) {
    hkv_err err;
    hkv_err_clear(&err);
    const char *smol = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                       "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                       "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
                       "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}";
    hkv_tokenizer *t = toy_bpe(smol, &err);
    if (!t) return;
    hkv_chat_msg m[] = {{"user", "Hi"}, {"assistant", "Hello"}};
    char *out = NULL;
    int rc = hkv_chat_apply(t, m, 1, 1, &out, &err);
    CHECK(rc == HKV_OK && strcmp(out, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                                      "trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                                      "<|im_start|>assistant\n") == 0, "SmolLM2 default system: %s", out);
    free(out);
    hkv_chat_msg m2[] = {{"system", "Be brief."}, {"user", "Hi"}};
    rc = hkv_chat_apply(t, m2, 2, 0, &out, &err);
    CHECK(rc == HKV_OK && strcmp(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n") == 0,
          "explicit system: %s", out);
    free(out);
    CHECK(strcmp(hkv_chat_template_family(t), "chatml") == 0, "family chatml");
    hkv_tokenizer_free(t);

    /* Qwen-style: the content after "system\n" is an expression, so no default. */
    t = toy_bpe("{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}", &err);
    rc = hkv_chat_apply(t, m, 2, 0, &out, &err);
    CHECK(rc == HKV_OK && strcmp(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n") == 0,
          "no default system: %s", out);
    free(out);
    hkv_tokenizer_free(t);

    t = toy_bpe("{{ '<|start_header_id|>' + message['role'] }}", &err);
    rc = hkv_chat_apply(t, m, 1, 1, &out, &err);
    CHECK(rc == HKV_OK && strcmp(out, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                                      "<|start_header_id|>assistant<|end_header_id|>\n\n") == 0, "llama3: %s", out);
    free(out);
    hkv_tokenizer_free(t);

    t = toy_bpe("{{ bos_token + '[INST] <<SYS>>\\n' }}", &err);
    hkv_chat_msg m3[] = {{"system", "S"}, {"user", "u1"}, {"assistant", "a1"}, {"user", "u2"}};
    rc = hkv_chat_apply(t, m3, 4, 1, &out, &err);
    CHECK(rc == HKV_OK && strcmp(out, "[INST] <<SYS>>\nS\n<</SYS>>\n\nu1 [/INST] a1 <|im_end|><s>[INST] u2 [/INST]") == 0,
          "llama2: %s", out);
    free(out);
    hkv_tokenizer_free(t);

    t = toy_bpe("{% raise_exception('nope') %}<start_of_turn>", &err);
    rc = hkv_chat_apply(t, m, 1, 1, &out, &err);
    CHECK(rc == HKV_E_UNSUPPORTED && out == NULL && strstr(err.msg, "chat_template"), "unknown family: %s", err.msg);
    CHECK(hkv_chat_template_family(t) == NULL, "unknown family name");
    hkv_tokenizer_free(t);
}

static void test_build_errors(void) {
    hkv_str tok = {"a", 1};
    hkv_tok_spec sp = {.model = HKV_TOK_SPM, .n_vocab = 1, .tokens = &tok, .bos = 5, .eos = -1, .eot = -1,
                       .eom = -1, .unk = -1, .pad = -1};
    hkv_err err;
    hkv_err_clear(&err);
    hkv_tokenizer *t = NULL;
    CHECK(hkv_tok_build(&t, &sp, &err) == HKV_E_FORMAT && t == NULL && strstr(err.msg, "bos"),
          "bos outside the vocabulary: %s", err.msg);
    sp.bos = -1;
    sp.n_vocab = 0;
    CHECK(hkv_tok_build(&t, &sp, &err) == HKV_E_FORMAT, "empty vocabulary");
}

int main(void) {
    test_utf8();
    test_classes();
    test_byte_map();
    test_pretokenize();
    test_bpe();
    test_spm();
    test_spm_user_splits_space_mark();
    test_chat();
    test_build_errors();
    if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
    else printf("tokenizer unit tests passed\n");
    return failures ? 1 : 0;
}
