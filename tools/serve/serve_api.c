/* hetkv serve, the OpenAI side (serve.h): request bodies through the body
 * parser hetkv batch uses (batch_io.c), response bodies, stream chunks,
 * /v1/models and the Prometheus metrics. JSON through jansson. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

static char *dump(json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    json_decref(o);
    return s;
}

/* The per-request policy extension: "policy": NAME and "policy_args": {KEY:
 * number, ...} (hetkv's --policy-arg keys, over the policy's defaults; the
 * server's own policy named alone keeps the server's arguments). The
 * scheduler admits a policy other than the server's if it prepares no
 * prompt (hkv_sched_req.policy). */
static int parse_policy(const hkv_srv *s, json_t *root, hkv_srv_req *r, hkv_err *err) {
    json_t *pv = json_object_get(root, "policy"), *av = json_object_get(root, "policy_args");
    if ((!pv || json_is_null(pv)) && (!av || json_is_null(av))) return HKV_OK;
    const char *name = pv && !json_is_null(pv) ? json_string_value(pv) : s->policy;
    if (!name) return hkv_seterr(err, HKV_E_INVAL, "policy: expected a policy name (a string)");
    if (!strcmp(name, s->policy) && (!av || json_is_null(av))) return HKV_OK;   /* the server's, as set */
    const hkv_policy_def *def = hkv_policy_find(name);
    if (!def) return hkv_seterr(err, HKV_E_INVAL, "policy: unknown policy \"%s\" (hetkv policies "
                                "lists them)", name);
    hkv_policy_args_init(def, &r->pargs);
    if (av && !json_is_null(av)) {
        if (!json_is_object(av))
            return hkv_seterr(err, HKV_E_INVAL, "policy_args: expected an object of numbers");
        const char *key;
        json_t *val;
        json_object_foreach(av, key, val) {
            char kv[128];
            if (!json_is_number(val))
                return hkv_seterr(err, HKV_E_INVAL, "policy_args.%s: expected a number", key);
            /* the key goes into --policy-arg's KEY=VALUE: one with '=' or one
             * the buffer would cut could read as another key and value */
            if (strchr(key, '=') ||
                snprintf(kv, sizeof kv, "%s=%.17g", key, json_number_value(val)) >= (int)sizeof kv)
                return hkv_seterr(err, HKV_E_INVAL, "policy_args: \"%.64s\" is not a parameter of "
                                  "policy '%s'", key, def->name);
            int rc = hkv_policy_arg_set(def, &r->pargs, kv, err);
            if (rc) return hkv_err_prefix(err, "policy_args");
        }
    }
    r->it.req.policy = def;
    r->it.req.policy_args = &r->pargs;
    return HKV_OK;
}

int hkv_srv_parse(hkv_srv *s, const char *body, size_t len, int chat, hkv_srv_req *r,
                  hkv_err *err) {
    json_error_t je;
    json_t *root = json_loadb(body, len, 0, &je);
    if (!root)
        return hkv_seterr(err, HKV_E_INVAL, "invalid JSON at line %d column %d: %s", je.line,
                          je.column, je.text);
    int rc = HKV_OK;
    json_t *v;
    if (!json_is_object(root)) {
        rc = hkv_seterr(err, HKV_E_INVAL, "the request body must be a JSON object");
        goto out;
    }
    v = json_object_get(root, "stream");
    r->stream = json_is_true(v);
    if (v && !json_is_null(v) && !json_is_boolean(v)) {
        rc = hkv_seterr(err, HKV_E_INVAL, "stream: expected a boolean");
        goto out;
    }
    r->include_usage = json_is_true(json_object_get(json_object_get(root, "stream_options"),
                                                    "include_usage"));
    /* no seed: a fresh one per request, as OpenAI samples */
    uint64_t seed = (uint64_t)r->it.line * 0x9E3779B97F4A7C15ull ^ (uint64_t)time(NULL);
    rc = hkv_batch_parse_body(root, chat, s->e->tok, chat ? &s->dflt_chat : &s->dflt_cmpl, seed,
                              &r->it, err);
    if (!rc) rc = parse_policy(s, root, r, err);
out:
    json_decref(root);
    return rc;
}

char *hkv_srv_completion_json(const hkv_srv *s, const hkv_srv_req *r) {
    return dump(hkv_batch_completion_body(&r->it, s->model_name));
}

char *hkv_srv_error_json(int status, const char *msg, const char *code) {
    return dump(hkv_batch_error_body(status, msg, code));
}

char *hkv_srv_models_json(const hkv_srv *s) {
    return dump(json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:I}]}", "object", "list", "data",
                          "id", s->model_name, "object", "model", "created", (json_int_t)0,
                          "owned_by", "hetkv", "max_model_len", (json_int_t)s->e->p.n_ctx));
}

static const char *finish_reason(const hkv_srv_req *r) {
    return r->it.req.finish == HKV_STOP_LENGTH ? "length" : "stop";
}

static json_t *usage_of(const hkv_srv_req *r) {
    const hkv_sched_req *q = &r->it.req;
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)q->n_prompt,
                     "completion_tokens", (json_int_t)q->n_out, "total_tokens",
                     (json_int_t)(q->n_prompt + q->n_out));
}

char *hkv_srv_sse_chunk(const hkv_srv *s, const hkv_srv_req *r, const char *delta, size_t n,
                        int first, int usage, int done) {
    if (done) return strdup("data: [DONE]\n\n");
    const int chat = r->it.chat;
    char id[48];
    snprintf(id, sizeof id, "%s-%lld", chat ? "chatcmpl" : "cmpl", (long long)r->it.line);
    json_t *o = json_pack("{s:s, s:s, s:I, s:s}", "id", id, "object",
                          chat ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)r->created, "model", s->model_name);
    json_t *choices = json_array();
    if (!usage) {
        json_t *c = json_pack("{s:i, s:n}", "index", 0, "logprobs");
        json_t *text = delta ? hkv_json_utf8(delta, n) : json_string("");
        if (chat) {
            json_t *d = json_object();
            if (first) json_object_set_new(d, "role", json_string("assistant"));
            if (delta || first) json_object_set_new(d, "content", text);
            else json_decref(text);
            json_object_set_new(c, "delta", d);
        } else {
            json_object_set_new(c, "text", text);
        }
        json_object_set_new(c, "finish_reason", delta || first ? json_null()
                                                               : json_string(finish_reason(r)));
        json_array_append_new(choices, c);
    }
    json_object_set_new(o, "choices", choices);
    if (usage) json_object_set_new(o, "usage", usage_of(r));
    char *j = dump(o);
    if (!j) return NULL;
    size_t len = strlen(j);
    char *ev = malloc(len + 9);
    if (ev) snprintf(ev, len + 9, "data: %s\n\n", j);
    free(j);
    return ev;
}

/* Prometheus text exposition format 0.0.4. */
typedef struct text {
    char *b;
    size_t n, cap;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = t->b ? vsnprintf(t->b + t->n, t->cap - t->n, fmt, ap) : -1;
        va_end(ap);
        if (w >= 0 && t->n + (size_t)w < t->cap) {
            t->n += (size_t)w;
            return;
        }
        size_t nc = t->cap * 2 + (w > 0 ? (size_t)w : 0) + 1024;
        char *nb = realloc(t->b, nc);
        if (!nb) return;   /* the text stays short; metrics are best effort */
        t->b = nb;
        t->cap = nc;
    }
}

static void metric(text *t, const char *name, const char *type, const char *help) {
    put(t, "# HELP hetkv_%s %s\n# TYPE hetkv_%s %s\n", name, help, name, type);
}

char *hkv_srv_metrics_text(hkv_srv *s) {
    hkv_srv_metrics m;
    int n_open, stopping;
    pthread_mutex_lock(&s->mu);
    m = s->m;
    n_open = s->n_open;
    stopping = s->stopping;
    pthread_mutex_unlock(&s->mu);
    text t = {0};
    metric(&t, "requests_total", "counter", "HTTP responses sent, by status code.");
    for (int i = 0; i < HKV_SRV_CODES && m.code[i]; i++)
        put(&t, "hetkv_requests_total{code=\"%d\"} %lld\n", m.code[i], m.n_code[i]);
    const struct { const char *name, *type, *help; double v; } one[] = {
        {"requests_cancelled_total", "counter", "Requests whose client went away before the end.",
         (double)m.cancelled},
        {"admission_refused_total", "counter", "Requests refused (503) because the queue was full.",
         (double)m.refused_queue},
        {"requests_in_flight", "gauge", "Requests handed to the engine and not finished.", n_open},
        {"sequences_running", "gauge", "Sequences in the running batch.", m.running},
        {"sequences_queued", "gauge", "Requests waiting for a slot or for KV memory.", m.queued},
        {"prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
         (double)m.prompt_tokens},
        {"generation_tokens_total", "counter", "Tokens generated for finished requests.",
         (double)m.gen_tokens},
        {"steps_total", "counter", "Batched decode steps.", (double)m.steps},
        {"step_seconds_total", "counter",
         "Seconds in prefill and decode forward calls (per step: divide by steps_total).", m.step_s},
        {"kv_reserved_bytes", "gauge", "KV bytes reserved for the running sequences.",
         (double)m.kv_reserved},
        {"prefix_cache_hits_total", "counter", "Requests that started from a kept prompt prefix.",
         (double)m.prefix_hits},
        {"prefix_cache_tokens_total", "counter",
         "Prompt tokens those requests did not prefill (--prefix-cache).", (double)m.prefix_tokens},
        {"prefix_cache_bytes", "gauge", "KV bytes reserved for the kept prompt prefixes.",
         (double)m.prefix_bytes},
        {"prefix_cache_saved_bytes_total", "counter",
         "Far-tier KV bytes shared by reference rather than copied (--prefix-cache).",
         (double)m.prefix_saved},
        {"prefix_cache_index_hits_total", "counter",
         "Requests that took a kept prefix's retrieval index by reference (ctkvr).",
         (double)m.prefix_index_hits},
        {"shutting_down", "gauge", "1 after SIGINT or SIGTERM.", stopping},
    };
    for (size_t i = 0; i < sizeof one / sizeof *one; i++) {
        metric(&t, one[i].name, one[i].type, one[i].help);
        put(&t, "hetkv_%s %.17g\n", one[i].name, one[i].v);   /* exact for counts below 2^53 */
    }
    metric(&t, "memory_bytes", "gauge", "Host memory the engine holds, by tier.");
    for (int k = 0; k < HKV_TIER_COUNT; k++)
        put(&t, "hetkv_memory_bytes{tier=\"%s\"} %llu\n", hkv_tier_name(k),
            (unsigned long long)m.tier_bytes[k]);
    return t.b;
}
