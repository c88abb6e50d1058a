/* Chat templates: the family is recognised from marker strings in
 * tokenizer.chat_template and rendered by fixed code, not by a Jinja engine.
 * The one template-specific value taken from the text is ChatML's default
 * system prompt (SmolLM2, Qwen2.5), read from the string literal the template
 * prints when the conversation has no system message. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"

enum { FAM_CHATML, FAM_LLAMA3, FAM_LLAMA2, FAM_MISTRAL };

static int family_of(const char *tmpl) {
    if (!tmpl || strstr(tmpl, "<|im_start|>")) return FAM_CHATML;   /* no template: ChatML */
    if (strstr(tmpl, "<|start_header_id|>")) return FAM_LLAMA3;
    if (strstr(tmpl, "[INST]")) return strstr(tmpl, "<<SYS>>") ? FAM_LLAMA2 : FAM_MISTRAL;
    return -1;
}

const char *hkv_chat_template_family(const hkv_tokenizer *t) {
    static const char *names[] = {"chatml", "llama3", "llama2", "mistral"};
    int f = t ? family_of(t->chat_template) : -1;
    return f < 0 ? NULL : names[f];
}

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Jinja's |trim and Python's strip(): drop leading and trailing whitespace. */
static void put_trimmed(sbuf *b, const char *s) {
    size_t n = strlen(s);
    while (n && is_ws(s[n - 1])) n--;
    while (n && is_ws(*s)) { s++; n--; }
    put(b, s, n);
}

static void put_rtrimmed(sbuf *b, const char *s) {
    size_t n = strlen(s);
    while (n && is_ws(s[n - 1])) n--;
    put(b, s, n);
}

/* The text of ChatML's default system message, or NULL: the characters
 * after "<|im_start|>system" and a newline up to "<|im_end|>", when they are
 * plain literal text (a quoted Jinja string with its escapes, or raw template
 * text). Where the content is an expression (messages[0]['content']) the
 * literal ends first and that occurrence is skipped. */
static char *chatml_default_system(const char *tmpl, int *oom) {
    static const char head[] = "<|im_start|>system", tail[] = "<|im_end|>";
    *oom = 0;
    for (const char *p = tmpl ? strstr(tmpl, head) : NULL; p; p = strstr(p + 1, head)) {
        const char *q = p + sizeof head - 1;
        if (*q == '\n') q++;
        else if (q[0] == '\\' && q[1] == 'n') q += 2;
        else continue;
        char quote = p > tmpl && (p[-1] == '\'' || p[-1] == '"') ? p[-1] : 0;
        sbuf b = {0};
        int ok = 0;
        for (const char *r = q; *r; r++) {
            if (strncmp(r, tail, sizeof tail - 1) == 0) { ok = 1; break; }
            if (quote && *r == quote) break;
            if (!quote && *r == '{' && (r[1] == '{' || r[1] == '%')) break;
            if (quote && *r == '\\' && r[1]) {
                r++;
                char c = *r == 'n' ? '\n' : *r == 't' ? '\t' : *r == 'r' ? '\r' : *r;
                put(&b, &c, 1);
                continue;
            }
            put(&b, r, 1);
        }
        if (b.oom) { *oom = 1; free(b.p); return NULL; }
        if (ok && b.n > 0) return b.p;
        free(b.p);
    }
    return NULL;
}

static const char *tok_text(const hkv_tokenizer *t, int32_t id, const char *dflt) {
    return id >= 0 ? t->text + t->text_off[id] : dflt;
}

static int is_role(const hkv_chat_msg *m, const char *r) { return strcmp(m->role, r) == 0; }

/* Llama 2: "<s>[INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST] answer </s>", with
 * the BOS text opening every user turn after the first (the first BOS is the
 * tokenizer's). Mistral: "[INST] user [/INST]answer</s>", the system text
 * prepended to the first user message. */
static int render_inst(const hkv_tokenizer *t, int fam, const hkv_chat_msg *msgs, int n, sbuf *b,
                       hkv_err *err) {
    const char *sys = NULL, *bos = tok_text(t, t->bos, "<s>"), *eos = tok_text(t, t->eos, "</s>");
    int first_user = 1;
    for (int i = 0; i < n; i++) {
        const hkv_chat_msg *m = &msgs[i];
        if (is_role(m, "system")) {
            if (i != 0) return hkv_seterr(err, HKV_E_INVAL, "chat: [INST] templates take a system message only first");
            sys = m->content;
        } else if (is_role(m, "user") && fam == FAM_LLAMA2) {
            if (!first_user) puts_(b, bos);
            puts_(b, "[INST] ");
            /* The template strips the joined "<<SYS>>...user" text, so only the
             * user text's end; an empty system message still gets its block. */
            if (sys && first_user) {
                puts_(b, "<<SYS>>\n"); puts_(b, sys); puts_(b, "\n<</SYS>>\n\n");
                put_rtrimmed(b, m->content);
            } else {
                put_trimmed(b, m->content);
            }
            puts_(b, " [/INST]");
            first_user = 0;
        } else if (is_role(m, "user")) {
            puts_(b, "[INST] ");
            if (sys && *sys && first_user) { puts_(b, sys); puts_(b, "\n\n"); }
            puts_(b, m->content);
            puts_(b, " [/INST]");
            first_user = 0;
        } else if (is_role(m, "assistant")) {
            if (fam == FAM_LLAMA2) { puts_(b, " "); put_trimmed(b, m->content); puts_(b, " "); }
            else puts_(b, m->content);
            puts_(b, eos);
        } else {
            return hkv_seterr(err, HKV_E_INVAL, "chat: role \"%s\" is not one of system, user, assistant "
                              "for [INST] templates", m->role);
        }
    }
    return HKV_OK;
}

int hkv_chat_apply(const hkv_tokenizer *t, const hkv_chat_msg *msgs, int n_msgs, int add_assistant,
                   char **out, hkv_err *err) {
    if (out) *out = NULL;
    if (!t || !out || n_msgs < 0 || (!msgs && n_msgs > 0))
        return hkv_seterr(err, HKV_E_INVAL, "hkv_chat_apply: NULL tokenizer, messages or output");
    for (int i = 0; i < n_msgs; i++)
        if (!msgs[i].role || (!msgs[i].content && strcmp(msgs[i].role, "system") != 0))
            return hkv_seterr(err, HKV_E_INVAL, "chat: message %d has no %s", i,
                              msgs[i].role ? "content" : "role");
    int fam = family_of(t->chat_template);
    if (fam < 0)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "chat: the model's tokenizer.chat_template is not a "
                          "recognised family (ChatML <|im_start|>, Llama 3 <|start_header_id|>, "
                          "Llama 2/Mistral [INST]); it begins \"%.80s\"", t->chat_template);
    sbuf b = {0};
    int rc = HKV_OK, oom = 0;
    put(&b, "", 0);
    if (fam == FAM_CHATML) {
        char *dflt = chatml_default_system(t->chat_template, &oom);
        for (int i = 0; i < n_msgs; i++) {
            const char *content = msgs[i].content;
            if (i == 0 && !is_role(&msgs[0], "system") && dflt) {
                puts_(&b, "<|im_start|>system\n"); puts_(&b, dflt); puts_(&b, "<|im_end|>\n");
            }
            if (!content && !(content = dflt)) continue;   /* system: NULL asks for the default */
            puts_(&b, "<|im_start|>"); puts_(&b, msgs[i].role); puts_(&b, "\n");
            puts_(&b, content); puts_(&b, "<|im_end|>\n");
        }
        if (add_assistant) puts_(&b, "<|im_start|>assistant\n");
        free(dflt);
    } else if (fam == FAM_LLAMA3) {
        for (int i = 0; i < n_msgs; i++) {
            if (!msgs[i].content) continue;   /* no default system prompt here */
            puts_(&b, "<|start_header_id|>"); puts_(&b, msgs[i].role); puts_(&b, "<|end_header_id|>\n\n");
            put_trimmed(&b, msgs[i].content); puts_(&b, "<|eot_id|>");
        }
        if (add_assistant) puts_(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    } else {
        rc = render_inst(t, fam, msgs, n_msgs, &b, err);
    }
    if (!rc && (b.oom || oom)) rc = hkv_seterr(err, HKV_E_NOMEM, "chat: out of memory rendering the prompt");
    if (rc) { free(b.p); return rc; }
    *out = b.p;
    return HKV_OK;
}
