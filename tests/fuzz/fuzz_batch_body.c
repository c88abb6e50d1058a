/* Fuzz target: an OpenAI request body (the JSON of one batch line's "body",
 * or of an HTTP request to hetkv serve) through hkv_batch_parse_body
 * (tools/batch/batch_io.c) and, in builds with hetkv serve, hkv_srv_parse
 * (tools/serve/serve_api.c: the same parser behind serve's own checks of stream,
 * stream_options and the per-request policy and policy_args), then the
 * response bodies and stream chunks serve writes for it. The tokenizer is
 * the byte-level BPE of fuzz_common.h or, for one input length in four, the
 * SentencePiece one.
 *
 * Asserts, besides ASan/UBSan/LSan: every refusal has a message and an
 * error body that is valid JSON; an accepted body gives a prompt of ids in
 * the vocabulary and sampling fields inside their ranges; hkv_srv_parse
 * accepts only bodies hkv_batch_parse_body accepts, and a per-request
 * policy it accepts has arguments hkv_policy_args_check accepts; the
 * completion body and every "data: ..." chunk are valid JSON. */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "fuzz_batch_check.h"
#include "fuzz_common.h"
#include "policy.h"
#ifdef HKV_FUZZ_SERVE
#include "serve.h"
#endif

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    hkv_fuzz_tokenizers();
    return 0;
}

#ifdef HKV_FUZZ_SERVE
/* "data: {...}\n\n" */
static void check_sse(char *s, const char *what) {
    HKV_FUZZ_CHECK(s && !strncmp(s, "data: ", 6) && strlen(s) >= 8 && !strcmp(s + strlen(s) - 2, "\n\n"),
                   "%s: not one event: %.200s", what, s ? s : "(null)");
    s[strlen(s) - 2] = '\0';
    json_decref(hkv_fuzz_json(s + 6, what));
    free(s);
}

static int serve_parse(const uint8_t *data, size_t size, int chat, const hkv_tokenizer *tok) {
    /* hkv_srv_parse reads the tokenizer and n_ctx from the engine and
     * nothing else: an engine that holds only those. */
    hkv_engine *e = calloc(1, sizeof *e);
    if (!e) abort();
    e->tok = (hkv_tokenizer *)tok;
    e->p.n_ctx = 2048;
    hkv_srv s;
    memset(&s, 0, sizeof s);
    s.e = e;
    s.model_name = "fuzz-model";
    s.policy = "full";
    s.dflt_chat = (hkv_batch_defaults){2048, 2048, 1, 1};
    s.dflt_cmpl = s.dflt_chat;
    hkv_srv_req r;
    memset(&r, 0, sizeof r);
    r.it.line = 3;
    hkv_err err = {0};
    int rc = hkv_srv_parse(&s, (const char *)data, size, chat, &r, &err);
    hkv_fuzz_check_err(rc, &err, "hkv_srv_parse");
    if (rc == HKV_OK) {
        json_t *root = json_loadb((const char *)data, size, 0, NULL);
        hkv_fuzz_check_item(&r.it, root, tok, &s.dflt_chat);
        if (r.it.req.policy) {
            HKV_FUZZ_CHECK(r.it.req.policy_args == &r.pargs, "policy arguments elsewhere");
            rc = hkv_policy_args_check(r.it.req.policy, &r.pargs, &err);
            HKV_FUZZ_CHECK(rc == HKV_OK, "accepted policy_args fail the check: %s", err.msg);
            /* every key given is a parameter of the policy, by its exact name */
            json_t *av = json_object_get(root, "policy_args");
            const char *key;
            json_t *val;
            json_object_foreach(av, key, val) {
                int found = 0;
                for (int i = 0; i < r.it.req.policy->n_params; i++)
                    found |= !strcmp(r.it.req.policy->params[i].key, key);
                HKV_FUZZ_CHECK(found, "policy_args key '%.80s' accepted for %s", key, r.it.req.policy->name);
            }
        }
        json_decref(root);
        hkv_fuzz_check_result(&r.it, tok);
        char *body = hkv_srv_completion_json(&s, &r);
        json_decref(hkv_fuzz_json(body, "completion body"));
        free(body);
        check_sse(hkv_srv_sse_chunk(&s, &r, NULL, 0, 1, 0, 0), "first chunk");
        check_sse(hkv_srv_sse_chunk(&s, &r, r.it.req.text, r.it.req.text_len, 0, 0, 0), "delta chunk");
        check_sse(hkv_srv_sse_chunk(&s, &r, NULL, 0, 0, 0, 0), "last chunk");
        check_sse(hkv_srv_sse_chunk(&s, &r, NULL, 0, 0, 1, 0), "usage chunk");
        char *done = hkv_srv_sse_chunk(&s, &r, NULL, 0, 0, 0, 1);
        HKV_FUZZ_CHECK(done && !strcmp(done, "data: [DONE]\n\n"), "done chunk");
        free(done);
    } else {
        char *body = hkv_srv_error_json(400, err.msg, NULL);
        json_decref(hkv_fuzz_json(body, "error body"));
        free(body);
    }
    hkv_batch_item_free(&r.it);
    free(e);
    return rc;
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const hkv_fuzz_toks *ft = hkv_fuzz_tokenizers();
    const hkv_tokenizer *tok = ft->t[size % 4 == 3 ? 4 : 0];
    json_t *body = json_loadb((const char *)data, size, 0, NULL);
    int chat = json_object_get(body, "messages") != NULL;
    int rc = HKV_E_INVAL;
    if (json_is_object(body)) {
        hkv_batch_defaults d = {2048, 2048, 1, 1};   /* serve's: streaming allowed */
        hkv_batch_item it;
        memset(&it, 0, sizeof it);
        hkv_err err = {0};
        rc = hkv_batch_parse_body(body, chat, tok, &d, 42, &it, &err);
        hkv_fuzz_check_err(rc, &err, "hkv_batch_parse_body");
        if (rc == HKV_OK) {
            hkv_fuzz_check_item(&it, body, tok, &d);
            HKV_FUZZ_CHECK(it.chat == chat, "chat %d, asked %d", it.chat, chat);
        } else {
            char *line = NULL;
            json_t *eb = hkv_batch_error_body(400, err.msg, "invalid_value");
            line = json_dumps(eb, JSON_COMPACT);
            json_decref(hkv_fuzz_json(line, "error body"));
            free(line);
            json_decref(eb);
        }
        hkv_batch_item_free(&it);
    }
    json_decref(body);
#ifdef HKV_FUZZ_SERVE
    int src = serve_parse(data, size, chat, tok);
    HKV_FUZZ_CHECK(src != HKV_OK || rc == HKV_OK, "hkv_srv_parse accepts a body the body parser refuses");
#else
    (void)rc;
#endif
    return 0;
}
