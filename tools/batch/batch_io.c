/* OpenAI batch request lines in, result lines out, and the scan of an
 * earlier run's output for resuming (batch.h). JSON through jansson. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "batch.h"
#include "cli.h"
#include "hash.h"

void hkv_batch_item_free(hkv_batch_item *it) {
    free(it->custom_id);
    free(it->prompt);
    for (int k = 0; k < HKV_SCHED_MAX_STOP; k++) free(it->stop_buf[k]);
    hkv_sched_req_clear(&it->req);
    memset(it, 0, sizeof *it);
}


/* A message's content: a string, or an array of {"type":"text","text":...}
 * parts joined. *out malloc'd. */
static int content_text(json_t *c, int i, char **out, hkv_err *err) {
    if (json_is_string(c)) {
        *out = strdup(json_string_value(c));
        return *out ? HKV_OK : hkv_seterr(err, HKV_E_NOMEM, "no memory");
    }
    if (!json_is_array(c))
        return hkv_seterr(err, HKV_E_INVAL, "messages[%d].content: expected a string or an array "
                          "of text parts", i);
    size_t len = 0, k;
    json_t *part;
    json_array_foreach(c, k, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        json_t *t = json_object_get(part, "text");
        if (!type || strcmp(type, "text") || !json_is_string(t))
            return hkv_seterr(err, HKV_E_UNSUPPORTED, "messages[%d].content[%zu]: only text parts "
                              "are supported (type \"%s\")", i, k, type ? type : "?");
        len += strlen(json_string_value(t));
    }
    char *s = malloc(len + 1);
    if (!s) return hkv_seterr(err, HKV_E_NOMEM, "no memory");
    s[0] = 0;
    json_array_foreach(c, k, part) strcat(s, json_string_value(json_object_get(part, "text")));
    *out = s;
    return HKV_OK;
}

static int chat_prompt(json_t *body, const hkv_tokenizer *tok, char **text, hkv_err *err) {
    json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return hkv_seterr(err, HKV_E_INVAL, "body.messages: missing or not a non-empty array");
    size_t n = json_array_size(msgs);
    hkv_chat_msg *m = calloc(n, sizeof *m);
    char **owned = calloc(n, sizeof *owned);
    int rc = m && owned ? HKV_OK : hkv_seterr(err, HKV_E_NOMEM, "no memory");
    for (size_t i = 0; !rc && i < n; i++) {
        json_t *mi = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(mi, "role"));
        if (!role) {
            rc = hkv_seterr(err, HKV_E_INVAL, "messages[%zu].role: missing or not a string", i);
            break;
        }
        if (!strcmp(role, "developer")) role = "system";   /* OpenAI's newer name */
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")) {
            rc = hkv_seterr(err, HKV_E_UNSUPPORTED, "messages[%zu].role \"%s\": system, user or "
                            "assistant", i, role);
            break;
        }
        if ((rc = content_text(json_object_get(mi, "content"), (int)i, &owned[i], err))) break;
        m[i] = (hkv_chat_msg){role, owned[i]};
    }
    if (!rc) rc = hkv_chat_apply(tok, m, (int)n, 1, text, err);
    for (size_t i = 0; owned && i < n; i++) free(owned[i]);
    free(owned);
    free(m);
    return rc;
}

static int tokenize(const hkv_tokenizer *tok, const char *text, hkv_batch_item *it, hkv_err *err) {
    size_t len = strlen(text);
    int64_t cap = (int64_t)len + 16;
    if (!(it->prompt = malloc((size_t)cap * sizeof(int32_t))))
        return hkv_seterr(err, HKV_E_NOMEM, "no memory for the prompt");
    /* special-token text (<|im_start|>) becomes those tokens, as llama.cpp
     * and Hugging Face tokenizers do */
    return hkv_tokenize(tok, text, len, hkv_tokenizer_add_bos(tok), 1, it->prompt, cap,
                        &it->n_prompt, err);
}

/* body.prompt: a string, an array of one string, or an array of token ids. */
static int completion_prompt(json_t *body, const hkv_tokenizer *tok, hkv_batch_item *it,
                             hkv_err *err) {
    json_t *p = json_object_get(body, "prompt");
    if (json_is_string(p)) return tokenize(tok, json_string_value(p), it, err);
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        return tokenize(tok, json_string_value(json_array_get(p, 0)), it, err);
    if (json_is_array(p) && json_array_size(p) > 0 && json_is_integer(json_array_get(p, 0))) {
        size_t n = json_array_size(p), k;
        json_t *v;
        if (!(it->prompt = malloc(n * sizeof(int32_t))))
            return hkv_seterr(err, HKV_E_NOMEM, "no memory for the prompt");
        json_array_foreach(p, k, v) {
            json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
            if (id < 0 || id >= hkv_tokenizer_n_vocab(tok))
                return hkv_seterr(err, HKV_E_INVAL, "body.prompt[%zu]: not a token id of this "
                                  "model (0..%d)", k, hkv_tokenizer_n_vocab(tok) - 1);
            it->prompt[k] = (int32_t)id;
        }
        it->n_prompt = (int64_t)n;
        return HKV_OK;
    }
    if (json_is_array(p) && json_array_size(p) > 1)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "body.prompt: an array of %zu prompts; one "
                          "request line per prompt", json_array_size(p));
    return hkv_seterr(err, HKV_E_INVAL, "body.prompt: missing, or not a string or token ids");
}

/* Fields hetkv cannot honour: an error when set to anything but their
 * no-op value. Unknown fields are ignored. */
static int refuse_unsupported(json_t *body, int streaming, hkv_err *err) {
    json_t *v;
    if ((v = json_object_get(body, "n")) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "body.n: only n = 1 is supported");
    if ((v = json_object_get(body, "best_of")) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "body.best_of: only 1 is supported");
    const char *off_when_true[] = {"stream", "echo", "logprobs"};
    for (size_t i = streaming ? 1 : 0; i < sizeof off_when_true / sizeof *off_when_true; i++)
        if ((v = json_object_get(body, off_when_true[i])) && !json_is_null(v) && !json_is_false(v) &&
            !(json_is_integer(v) && json_integer_value(v) == 0))
            return hkv_seterr(err, HKV_E_UNSUPPORTED, "body.%s: not supported by hetkv",
                              off_when_true[i]);
    const char *zero[] = {"presence_penalty", "frequency_penalty"};
    for (size_t i = 0; i < 2; i++)
        if ((v = json_object_get(body, zero[i])) && !json_is_null(v) &&
            !(json_is_number(v) && json_number_value(v) == 0))
            return hkv_seterr(err, HKV_E_UNSUPPORTED, "body.%s: only 0 is supported", zero[i]);
    const char *empty[] = {"logit_bias", "tools", "functions"};
    for (size_t i = 0; i < 3; i++)
        if ((v = json_object_get(body, empty[i])) && !json_is_null(v) &&
            !((json_is_object(v) && !json_object_size(v)) || (json_is_array(v) && !json_array_size(v))))
            return hkv_seterr(err, HKV_E_UNSUPPORTED, "body.%s: not supported by hetkv", empty[i]);
    if ((v = json_object_get(body, "response_format")) && !json_is_null(v)) {
        const char *t = json_string_value(json_object_get(v, "type"));
        if (!t || strcmp(t, "text"))
            return hkv_seterr(err, HKV_E_UNSUPPORTED, "body.response_format: only {\"type\": \"text\"}");
    }
    if ((v = json_object_get(body, "suffix")) && !json_is_null(v))
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "body.suffix: not supported by hetkv");
    return HKV_OK;
}

/* A number field in [lo, hi], or dflt when absent or null. */
static int num_field(json_t *body, const char *k, double lo, double hi, double dflt, double *out,
                     hkv_err *err) {
    json_t *v = json_object_get(body, k);
    *out = dflt;
    if (!v || json_is_null(v)) return HKV_OK;
    if (!json_is_number(v) || json_number_value(v) < lo || json_number_value(v) > hi)
        return hkv_seterr(err, HKV_E_INVAL, "body.%s: expected a number in [%g, %g]", k, lo, hi);
    *out = json_number_value(v);
    return HKV_OK;
}

static int sampling(json_t *body, const hkv_batch_defaults *d, uint64_t seed, hkv_batch_item *it,
                    hkv_err *err) {
    hkv_sched_req *r = &it->req;
    json_t *v = json_object_get(body, "max_tokens");
    if (!v || json_is_null(v)) v = json_object_get(body, "max_completion_tokens");
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > (1 << 24))
            return hkv_seterr(err, HKV_E_INVAL, "body.max_tokens: expected an integer >= 1");
        r->n_predict = (int)json_integer_value(v);
    } else {   /* the default, cut to the context left after the prompt */
        int64_t room = d->n_ctx - it->n_prompt;
        r->n_predict = room < d->max_tokens ? (int)(room > 1 ? room : 1) : d->max_tokens;
    }
    double temp, top_p;
    int rc;
    if ((rc = num_field(body, "temperature", 0, 2, 1.0, &temp, err)) ||
        (rc = num_field(body, "top_p", 1e-9, 1, 1.0, &top_p, err)))
        return rc;
    long long top_k = 0;
    if ((v = json_object_get(body, "top_k")) && !json_is_null(v)) {   /* vLLM's extension */
        if (!json_is_integer(v) || json_integer_value(v) < -1)
            return hkv_seterr(err, HKV_E_INVAL, "body.top_k: expected an integer >= 0 (-1: off)");
        /* past any vocabulary k keeps every token, as off does; cut to int,
         * 2^32 + 1 would have become 1 (greedy) and 2^63 - 1 became -1 */
        top_k = json_integer_value(v) < 0 || json_integer_value(v) > INT_MAX ? 0 : json_integer_value(v);
    }
    if ((v = json_object_get(body, "seed")) && !json_is_null(v)) {
        if (!json_is_integer(v))
            return hkv_seterr(err, HKV_E_INVAL, "body.seed: expected an integer");
        seed = (uint64_t)json_integer_value(v);
    }
    r->sp = (hkv_sampler_params){(float)temp, (int)top_k, (float)top_p, seed};
    r->stop_at_eog = d->stop_at_eog;
    v = json_object_get(body, "stop");
    if (v && !json_is_null(v)) {
        json_t *one = json_is_string(v) ? v : NULL;
        size_t n = one ? 1 : json_is_array(v) ? json_array_size(v) : 0;
        if ((!one && !json_is_array(v)) || n > HKV_SCHED_MAX_STOP)
            return hkv_seterr(err, HKV_E_INVAL, "body.stop: a string or an array of up to %d "
                              "strings", HKV_SCHED_MAX_STOP);
        for (size_t k = 0; k < n; k++) {
            json_t *sk = one ? one : json_array_get(v, k);
            if (!json_is_string(sk) || !json_string_length(sk))
                return hkv_seterr(err, HKV_E_INVAL, "body.stop[%zu]: not a non-empty string", k);
            if (!(it->stop_buf[k] = strdup(json_string_value(sk))))
                return hkv_seterr(err, HKV_E_NOMEM, "no memory");
            r->stop[r->n_stop++] = it->stop_buf[k];
        }
    }
    return HKV_OK;
}

int hkv_batch_parse_body(json_t *body, int chat, const hkv_tokenizer *tok,
                         const hkv_batch_defaults *d, uint64_t seed, hkv_batch_item *it,
                         hkv_err *err) {
    char *text = NULL;
    int rc;
    it->chat = chat;
    if ((rc = refuse_unsupported(body, d->streaming, err))) goto out;
    if (it->chat) {
        if (!(rc = chat_prompt(body, tok, &text, err))) rc = tokenize(tok, text, it, err);
    } else {
        rc = completion_prompt(body, tok, it, err);
    }
    if (rc) goto out;
    if (it->n_prompt < 1) {
        rc = hkv_seterr(err, HKV_E_INVAL, "the prompt is empty after tokenisation");
        goto out;
    }
    if ((rc = sampling(body, d, seed, it, err))) goto out;
    it->req.prompt = it->prompt;
    it->req.n_prompt = it->n_prompt;
    it->req.user = it;
out:
    free(text);
    return rc;
}

int hkv_batch_parse(const char *line, size_t len, const hkv_tokenizer *tok,
                    const hkv_batch_defaults *d, hkv_batch_item *it, hkv_err *err) {
    json_error_t je;
    json_t *root = json_loadb(line, len, 0, &je);
    if (!root)
        return hkv_seterr(err, HKV_E_INVAL, "invalid JSON at column %d: %s", je.column, je.text);
    int rc = HKV_OK;
    json_t *id = json_object_get(root, "custom_id"), *body = json_object_get(root, "body");
    const char *method = json_string_value(json_object_get(root, "method"));
    const char *url = json_string_value(json_object_get(root, "url"));
    if (!json_is_object(root)) {
        rc = hkv_seterr(err, HKV_E_INVAL, "a request line must be a JSON object");
        goto out;
    }
    if (!json_is_string(id) || !json_string_length(id)) {
        rc = hkv_seterr(err, HKV_E_INVAL, "custom_id: missing or not a non-empty string");
        goto out;
    }
    if (!(it->custom_id = strdup(json_string_value(id)))) {
        rc = hkv_seterr(err, HKV_E_NOMEM, "no memory");
        goto out;
    }
    if (json_object_get(root, "method") && (!method || strcmp(method, "POST"))) {
        rc = hkv_seterr(err, HKV_E_UNSUPPORTED, "method: only POST");
        goto out;
    }
    if (!url) {
        rc = hkv_seterr(err, HKV_E_INVAL, "url: missing (/v1/chat/completions or /v1/completions)");
        goto out;
    }
    if (!strcmp(url, "/v1/chat/completions")) it->chat = 1;
    else if (strcmp(url, "/v1/completions")) {
        rc = hkv_seterr(err, HKV_E_UNSUPPORTED, "url \"%s\": /v1/chat/completions or "
                        "/v1/completions", url);
        goto out;
    }
    if (!json_is_object(body)) {
        rc = hkv_seterr(err, HKV_E_INVAL, "body: missing or not an object");
        goto out;
    }
    rc = hkv_batch_parse_body(body, it->chat, tok, d, hkv_fnv1a_str(HKV_FNV1A_INIT_V0, it->custom_id), it, err);
out:
    json_decref(root);
    return rc;
}

/* {"id", "custom_id", "response": {"status_code", "request_id", "body"},
 * "error": null, "hetkv": ext}; steals body and ext. */
static char *envelope(int64_t line, const char *custom_id, int status, json_t *body, json_t *ext) {
    char rid[48];
    snprintf(rid, sizeof rid, "batch_req_%lld", (long long)line);
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(rid));
    json_object_set_new(o, "custom_id", custom_id ? json_string(custom_id) : json_null());
    json_t *resp = json_object();
    json_object_set_new(resp, "status_code", json_integer(status));
    snprintf(rid, sizeof rid, "req_%lld", (long long)line);
    json_object_set_new(resp, "request_id", json_string(rid));
    json_object_set_new(resp, "body", body);
    json_object_set_new(o, "response", resp);
    json_object_set_new(o, "error", json_null());
    json_object_set_new(ext, "line", json_integer(line));
    json_object_set_new(o, "hetkv", ext);
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_REAL_PRECISION(6));
    json_decref(o);
    return s;
}

/* JSON strings must be UTF-8: a token boundary can cut a character and the
 * model can emit invalid bytes; replace any such byte with U+FFFD. NUL too
 * (a byte token can give it): as \u0000 it makes the line unreadable to
 * jansson without JSON_ALLOW_NUL, hkv_batch_scan_output's resume included. */
json_t *hkv_json_utf8(const char *s, size_t n) {
    json_t *j = hkv_json_text(s, n, 0);
    return j ? j : json_string("");
}

json_t *hkv_batch_completion_body(const hkv_batch_item *it, const char *model) {
    const hkv_sched_req *r = &it->req;
    char id[48];
    snprintf(id, sizeof id, "%s-%lld", it->chat ? "chatcmpl" : "cmpl", (long long)it->line);
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(0));
    json_t *text = hkv_json_utf8(r->text ? r->text : "", r->text_len);
    if (it->chat) {
        json_t *msg = json_object();
        json_object_set_new(msg, "role", json_string("assistant"));
        json_object_set_new(msg, "content", text);
        json_object_set_new(choice, "message", msg);
    } else {
        json_object_set_new(choice, "text", text);
    }
    json_object_set_new(choice, "logprobs", json_null());
    json_object_set_new(choice, "finish_reason",
                        json_string(r->finish == HKV_STOP_LENGTH ? "length" : "stop"));
    json_t *usage = json_object();
    json_object_set_new(usage, "prompt_tokens", json_integer(r->n_prompt));
    json_object_set_new(usage, "completion_tokens", json_integer(r->n_out));
    json_object_set_new(usage, "total_tokens", json_integer(r->n_prompt + r->n_out));
    json_t *body = json_object();
    json_object_set_new(body, "id", json_string(id));
    json_object_set_new(body, "object", json_string(it->chat ? "chat.completion" : "text_completion"));
    json_object_set_new(body, "created", json_integer((json_int_t)time(NULL)));
    json_object_set_new(body, "model", json_string(model));
    json_t *choices = json_array();
    json_array_append_new(choices, choice);
    json_object_set_new(body, "choices", choices);
    json_object_set_new(body, "usage", usage);
    return body;
}

char *hkv_batch_result_line(const hkv_batch_item *it, const hkv_batch_meta *m) {
    const hkv_sched_req *r = &it->req;
    json_t *body = hkv_batch_completion_body(it, m->model);
    json_t *ext = json_object();
    json_object_set_new(ext, "policy", json_string(r->resident ? "full" : m->policy));
    if (m->placed)
        json_object_set_new(ext, "placement", json_string(r->resident ? "device" : "split"));
    json_object_set_new(ext, "queue_s", json_real(r->t_admit - r->t_submit));
    json_object_set_new(ext, "prefill_s", json_real(r->t_prefill));
    json_object_set_new(ext, "ttft_s", json_real(r->t_first));
    json_object_set_new(ext, "decode_s", json_real(r->t_decode));
    json_object_set_new(ext, "stop", json_string(r->finish == HKV_STOP_EOG ? "eog" :
                                                 r->finish == HKV_STOP_STRING ? "stop_string" : "length"));
    json_t *toks = json_array();
    for (int i = 0; i < r->n_out; i++) json_array_append_new(toks, json_integer(r->out[i]));
    json_object_set_new(ext, "tokens", toks);
    return envelope(it->line, it->custom_id, 200, body, ext);
}

json_t *hkv_batch_error_body(int status, const char *msg, const char *code) {
    json_t *e = json_object();
    json_object_set_new(e, "message", hkv_json_utf8(msg, strlen(msg)));
    json_object_set_new(e, "type", json_string(status < 500 ? "invalid_request_error" : "server_error"));
    json_object_set_new(e, "param", json_null());
    json_object_set_new(e, "code", code ? json_string(code) : json_null());
    json_t *body = json_object();
    json_object_set_new(body, "error", e);
    return body;
}

char *hkv_batch_error_line(int64_t line, const char *custom_id, int status, const char *msg,
                           const hkv_batch_meta *m) {
    json_t *body = hkv_batch_error_body(status, msg, NULL);
    json_t *ext = json_object();
    json_object_set_new(ext, "policy", json_string(m->policy));
    return envelope(line, custom_id, status, body, ext);
}

int hkv_batch_scan_output(const char *out_path, int64_t n_lines, char *done, char **ids,
                          int64_t *n_done, int *n_torn, hkv_err *err) {
    *n_done = 0;
    *n_torn = 0;
    FILE *f = fopen(out_path, "rb");
    if (!f) {
        if (errno == ENOENT) return HKV_OK;
        return hkv_seterr(err, HKV_E_IO, "%s: %s", out_path, strerror(errno));
    }
    char *buf = NULL;
    size_t cap = 0;
    ssize_t n;
    off_t good = 0;   /* bytes up to and including the last newline */
    int64_t k = 0;
    int rc = HKV_OK;
    while ((n = getline(&buf, &cap, f)) > 0) {
        k++;
        if (buf[n - 1] != '\n') {   /* torn: the run died mid-write */
            *n_torn = 1;
            break;
        }
        json_error_t je;
        json_t *o = json_loadb(buf, (size_t)n, 0, &je);
        json_t *ext = o ? json_object_get(o, "hetkv") : NULL;
        json_t *ln = ext ? json_object_get(ext, "line") : NULL;
        json_int_t line = json_is_integer(ln) ? json_integer_value(ln) : -1;
        if (line < 1 || line > n_lines) {
            json_decref(o);
            rc = hkv_seterr(err, HKV_E_INVAL, "%s line %lld is not a result of this job's input "
                            "(%s); give another output file", out_path, (long long)k,
                            line < 0 ? "no hetkv.line" : "line number past the input's end");
            break;
        }
        const char *cid = json_string_value(json_object_get(o, "custom_id"));
        if (!done[line]) {
            done[line] = 1;
            ++*n_done;
            ids[line] = cid ? strdup(cid) : NULL;
        }
        json_decref(o);
        good += n;
    }
    free(buf);
    fclose(f);
    if (!rc && *n_torn && truncate(out_path, good) != 0)
        rc = hkv_seterr(err, HKV_E_IO, "%s: cutting the torn last line: %s", out_path, strerror(errno));
    return rc;
}
