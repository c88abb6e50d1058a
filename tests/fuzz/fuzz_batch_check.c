/* Checks of parsed batch requests and of the JSON written for them
 * (fuzz_batch_check.h). */
#include "fuzz_batch_check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

json_t *hkv_fuzz_json(const char *s, const char *what) {
    HKV_FUZZ_CHECK(s != NULL, "%s: not written", what);
    json_error_t je;
    json_t *o = json_loads(s, 0, &je);
    HKV_FUZZ_CHECK(o && json_is_object(o), "%s is not a JSON object (%s): %.300s", what,
                   o ? "not an object" : je.text, s);
    return o;
}

/* The sampling fields as the body gives them (absent or null: defaults). */
static void check_fields(const hkv_sched_req *r, json_t *body) {
    json_t *v = json_object_get(body, "max_tokens");
    if (!v || json_is_null(v)) v = json_object_get(body, "max_completion_tokens");
    if (v && !json_is_null(v))
        HKV_FUZZ_CHECK(r->n_predict == json_integer_value(v), "n_predict %d, max_tokens %lld", r->n_predict,
                       (long long)json_integer_value(v));
    if ((v = json_object_get(body, "temperature")) && !json_is_null(v))
        HKV_FUZZ_CHECK(r->sp.temp == (float)json_number_value(v), "temperature %g, body %g", (double)r->sp.temp,
                       json_number_value(v));
    if ((v = json_object_get(body, "top_p")) && !json_is_null(v))
        HKV_FUZZ_CHECK(r->sp.top_p == (float)json_number_value(v), "top_p %g, body %g", (double)r->sp.top_p,
                       json_number_value(v));
    if ((v = json_object_get(body, "top_k")) && !json_is_null(v)) {
        /* k keeps the k most likely; -1, 0 and any k past an int keep all (off) */
        json_int_t k = json_integer_value(v);
        HKV_FUZZ_CHECK(r->sp.top_k == (k >= 1 && k <= INT32_MAX ? k : 0), "top_k %d, body %lld", r->sp.top_k,
                       (long long)k);
    }
    if ((v = json_object_get(body, "seed")) && !json_is_null(v))
        HKV_FUZZ_CHECK(r->sp.seed == (uint64_t)json_integer_value(v), "seed");
}

void hkv_fuzz_check_item(const hkv_batch_item *it, json_t *body, const hkv_tokenizer *tok,
                         const hkv_batch_defaults *d) {
    const hkv_sched_req *r = &it->req;
    int32_t nv = hkv_tokenizer_n_vocab(tok);
    HKV_FUZZ_CHECK(it->prompt && it->n_prompt >= 1, "accepted with an empty prompt");
    HKV_FUZZ_CHECK(r->prompt == it->prompt && r->n_prompt == it->n_prompt && r->user == it,
                   "the scheduler request does not point at the item");
    for (int64_t i = 0; i < it->n_prompt; i++)
        HKV_FUZZ_CHECK(it->prompt[i] >= 0 && it->prompt[i] < nv, "prompt id %d outside the vocabulary",
                       it->prompt[i]);
    HKV_FUZZ_CHECK(r->n_predict >= 1 && r->n_predict <= (1 << 24), "n_predict %d", r->n_predict);
    HKV_FUZZ_CHECK(r->sp.temp >= 0 && r->sp.temp <= 2, "temperature %g", (double)r->sp.temp);
    HKV_FUZZ_CHECK(r->sp.top_p > 0 && r->sp.top_p <= 1, "top_p %g", (double)r->sp.top_p);
    HKV_FUZZ_CHECK(r->sp.top_k >= 0, "top_k %d", r->sp.top_k);
    HKV_FUZZ_CHECK(r->stop_at_eog == d->stop_at_eog, "stop_at_eog");
    HKV_FUZZ_CHECK(r->n_stop >= 0 && r->n_stop <= HKV_SCHED_MAX_STOP, "%d stop strings", r->n_stop);
    for (int k = 0; k < r->n_stop; k++)
        HKV_FUZZ_CHECK(r->stop[k] && r->stop[k][0], "stop string %d empty", k);
    check_fields(r, body);
}

void hkv_fuzz_check_result(hkv_batch_item *it, const hkv_tokenizer *tok) {
    hkv_sched_req *r = &it->req;
    int n = (int)(it->n_prompt < 8 ? it->n_prompt : 8);
    r->out = malloc((size_t)n * sizeof *r->out);
    size_t cap = 4096;
    r->text = malloc(cap);
    if (!r->out || !r->text) abort();
    memcpy(r->out, it->prompt, (size_t)n * sizeof *r->out);
    r->n_out = n;
    int64_t m = hkv_detokenize(tok, r->out, n, 0, r->text, cap);
    r->text_len = m > 0 ? (size_t)m : 0;
    r->text[r->text_len] = '\0';
    r->finish = n % 3;
    hkv_batch_meta meta = {"fuzz-model", "full"};
    char *line = hkv_batch_result_line(it, &meta);
    json_t *o = hkv_fuzz_json(line, "result line");
    const char *cid = json_string_value(json_object_get(o, "custom_id"));
    HKV_FUZZ_CHECK(it->custom_id ? cid && !strcmp(cid, it->custom_id) : json_is_null(json_object_get(o, "custom_id")),
                   "result line custom_id '%s', item '%s'", cid ? cid : "(null)",
                   it->custom_id ? it->custom_id : "(null)");
    json_t *toks = json_object_get(json_object_get(o, "hetkv"), "tokens");
    HKV_FUZZ_CHECK(json_array_size(toks) == (size_t)n, "result line has %zu tokens, want %d",
                   json_array_size(toks), n);
    json_t *usage = json_object_get(json_object_get(json_object_get(o, "response"), "body"), "usage");
    HKV_FUZZ_CHECK(json_integer_value(json_object_get(usage, "prompt_tokens")) == it->n_prompt,
                   "usage.prompt_tokens");
    json_decref(o);
    free(line);
}

void hkv_fuzz_check_error_line(const hkv_batch_item *it, const char *msg) {
    hkv_batch_meta meta = {"fuzz-model", "full"};
    char *line = hkv_batch_error_line(it->line, it->custom_id, 400, msg, &meta);
    json_t *o = hkv_fuzz_json(line, "error line");
    const char *cid = json_string_value(json_object_get(o, "custom_id"));
    HKV_FUZZ_CHECK(it->custom_id ? cid && !strcmp(cid, it->custom_id) : json_is_null(json_object_get(o, "custom_id")),
                   "error line custom_id '%s', item '%s'", cid ? cid : "(null)",
                   it->custom_id ? it->custom_id : "(null)");
    json_t *e = json_object_get(json_object_get(json_object_get(o, "response"), "body"), "error");
    HKV_FUZZ_CHECK(json_is_string(json_object_get(e, "message")), "error line without a message");
    json_decref(o);
    free(line);
}
