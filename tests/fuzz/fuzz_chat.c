/* Fuzz target: chat template rendering (model/chat_template.c) with
 * arbitrary roles and contents, under the four built-in families, no
 * template at all, and an arbitrary tokenizer.chat_template text (which
 * decides the family and, for ChatML, holds the default system prompt that
 * chatml_default_system parses out of it).
 *
 * Asserts, besides ASan/UBSan/LSan: hkv_chat_apply fails with
 * HKV_E_UNSUPPORTED exactly when hkv_chat_template_family is NULL; ChatML
 * and Llama 3 never fail otherwise; [INST] templates fail with HKV_E_INVAL
 * exactly when a system message is not first or a role is not system, user
 * or assistant; every message appears in order in ChatML's
 * "<|im_start|>ROLE\nCONTENT<|im_end|>\n" form; Llama 3's prompt equals the
 * one built here from the messages; with add_assistant the prompt ends
 * with the assistant turn's opening; [INST] prompts start with "[INST] "
 * when the first turn is the user's. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "tokenizer_impl.h"

enum { F_ASSISTANT = 1 << 3, F_NULL_SYSTEM = 1 << 4 };
#define MAX_FIELDS 65

static const char *const builtin[] = {
    NULL,   /* no template: ChatML */
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}",
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}",
    "{{ bos_token + '[INST] <<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' }}",
    "{{ bos_token + '[INST] ' + message['content'] + ' [/INST]' }}",
};

/* A small vocabulary holding the texts the templates print. */
static hkv_tokenizer *tokenizer_with(const char *tmpl, size_t len) {
    static const char *const texts[] = {"<s>", "</s>", "<|im_start|>", "<|im_end|>",
                                        "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                                        "a", "b", "ab"};
    enum { N = sizeof texts / sizeof texts[0] };
    hkv_str toks[N];
    int32_t types[N];
    for (int i = 0; i < N; i++) {
        toks[i] = (hkv_str){texts[i], strlen(texts[i])};
        types[i] = i < 7 ? HKV_TT_CONTROL : HKV_TT_NORMAL;
    }
    hkv_tok_spec sp = {.model = HKV_TOK_BPE, .pre = HKV_PRE_GPT2, .n_vocab = N, .tokens = toks,
                       .types = types, .bos = 0, .eos = 1, .eot = 6, .eom = -1, .unk = -1, .pad = -1,
                       .chat_template = {tmpl, len}};
    hkv_tokenizer *t = NULL;
    hkv_err err;
    if (hkv_tok_build(&t, &sp, &err)) abort();
    return t;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static void append(char **b, size_t *n, const char *s, size_t k) {
    char *p = realloc(*b, *n + k + 1);
    if (!p) abort();
    memcpy(p + *n, s, k);
    *n += k;
    p[*n] = '\0';
    *b = p;
}

static void append_s(char **b, size_t *n, const char *s) { append(b, n, s, strlen(s)); }

static int ends_with(const char *s, const char *tail) {
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && memcmp(s + a - b, tail, b) == 0;
}

static void check_chatml(const char *out, const hkv_chat_msg *m, int n, int add_assistant) {
    const char *at = out;
    for (int i = 0; i < n; i++) {
        if (!m[i].content) continue;
        char *want = NULL;
        size_t k = 0;
        append_s(&want, &k, "<|im_start|>");
        append_s(&want, &k, m[i].role);
        append_s(&want, &k, "\n");
        append_s(&want, &k, m[i].content);
        append_s(&want, &k, "<|im_end|>\n");
        const char *p = strstr(at, want);
        HKV_FUZZ_CHECK(p != NULL, "ChatML: message %d (%s) missing or out of order", i, m[i].role);
        at = p + k;
        free(want);
    }
    if (add_assistant) HKV_FUZZ_CHECK(ends_with(out, "<|im_start|>assistant\n"), "ChatML: no assistant opening");
}

static void check_llama3(const char *out, const hkv_chat_msg *m, int n, int add_assistant) {
    char *want = NULL;
    size_t k = 0;
    append_s(&want, &k, "");
    for (int i = 0; i < n; i++) {
        if (!m[i].content) continue;
        const char *c = m[i].content;
        size_t len = strlen(c);
        while (len && is_ws(c[len - 1])) len--;
        while (len && is_ws(*c)) { c++; len--; }
        append_s(&want, &k, "<|start_header_id|>");
        append_s(&want, &k, m[i].role);
        append_s(&want, &k, "<|end_header_id|>\n\n");
        append(&want, &k, c, len);
        append_s(&want, &k, "<|eot_id|>");
    }
    if (add_assistant) append_s(&want, &k, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    HKV_FUZZ_CHECK(strcmp(out, want) == 0, "Llama 3 prompt differs:\n%s\n---- want\n%s", out, want);
    free(want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int flags = data[0], which = flags & 7;
    hkv_fuzz_fields f;
    hkv_fuzz_split(data + 1, size - 1, MAX_FIELDS, &f);
    int first = 0;
    hkv_tokenizer *t;
    if (which >= 5) {
        t = tokenizer_with(f.s[0], f.len[0]);
        first = 1;
    } else {
        t = tokenizer_with(builtin[which], builtin[which] ? strlen(builtin[which]) : 0);
    }
    int n = (f.n - first) / 2;
    hkv_chat_msg *m = calloc((size_t)n + 1, sizeof *m);
    if (!m) abort();
    int inst_bad = 0;
    for (int i = 0; i < n; i++) {
        const char *role = f.s[first + 2 * i], *content = f.s[first + 2 * i + 1];
        int sys = strcmp(role, "system") == 0;
        if (sys && !*content && (flags & F_NULL_SYSTEM)) content = NULL;   /* "the default, please" */
        m[i] = (hkv_chat_msg){role, content};
        if ((sys && i != 0) || (!sys && strcmp(role, "user") && strcmp(role, "assistant"))) inst_bad = 1;
    }
    int add_assistant = !!(flags & F_ASSISTANT);
    const char *fam = hkv_chat_template_family(t);
    char *out = NULL;
    hkv_err err = {0};
    int rc = hkv_chat_apply(t, m, n, add_assistant, &out, &err);
    hkv_fuzz_check_err(rc, &err, "hkv_chat_apply");
    HKV_FUZZ_CHECK((rc == HKV_OK) == (out != NULL), "rc %d with output %p", rc, (void *)out);
    HKV_FUZZ_CHECK((rc == HKV_E_UNSUPPORTED) == (fam == NULL), "rc %s, family %s", hkv_status_name(rc),
                   fam ? fam : "none");
    if (fam && (!strcmp(fam, "chatml") || !strcmp(fam, "llama3")))
        HKV_FUZZ_CHECK(rc == HKV_OK, "%s failed: %s", fam, err.msg);
    if (fam && (!strcmp(fam, "llama2") || !strcmp(fam, "mistral")))
        HKV_FUZZ_CHECK((rc == HKV_E_INVAL) == inst_bad, "%s: rc %s, bad roles %d", fam,
                       hkv_status_name(rc), inst_bad);
    if (rc == HKV_OK) {
        if (!strcmp(fam, "chatml")) check_chatml(out, m, n, add_assistant);
        else if (!strcmp(fam, "llama3")) check_llama3(out, m, n, add_assistant);
        else if (n > 0 && !strcmp(m[0].role, "user"))
            HKV_FUZZ_CHECK(strncmp(out, "[INST] ", 7) == 0, "%s prompt starts '%.20s'", fam, out);
    }
    free(out);
    free(m);
    hkv_tokenizer_free(t);
    hkv_fuzz_fields_free(&f);
    return 0;
}
