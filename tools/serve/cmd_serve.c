/* hetkv serve: options, the engine, the engine thread that owns the
 * scheduler, and the server's lifecycle (serve.h, docs/SERVE.md). */
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv_far.h"
#include "serve.h"

static const char serve_usage[] =
    "usage: hetkv serve -m MODEL [options]\n"
    "\n"
    "An OpenAI-compatible HTTP server: POST /v1/completions, POST /v1/chat/completions\n"
    "(stream: server-sent events), GET /v1/models, GET /health, GET /metrics (Prometheus).\n"
    "Requests join the running batch at the next step (continuous batching, the scheduler\n"
    "of hetkv batch); SIGINT or SIGTERM stop it cleanly (docs/SERVE.md).\n"
    "\n";

static int parse_max_body(void *base, const char *opt, const char *v, hkv_err *err) {
    uint64_t b = 0;
    int rc = hkv_arg_size(opt, v, &b, err);
    if (!rc && (b < 1024 || b > (1u << 30)))
        rc = hkv_seterr(err, HKV_E_RANGE, "--max-body: %s is not in 1K..1G", v);
    ((hkv_srv_opts *)base)->max_body = (long long)b;
    return rc;
}

/* serve's own options; the groups it shares follow them in serve_uses(). */
static const hkv_opt serve_opts_table[] = {
    {.name = "--host", .arg = "ADDR", .kind = HKV_OPT_STR, .off = offsetof(hkv_srv_opts, host),
     .help = "address to listen on (default 127.0.0.1; another address\n"
             "without --api-key is warned about)"},
    {.name = "--port", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(hkv_srv_opts, port),
     .lo = 0, .hi = 65535, .help = "TCP port (default 8080; 0: any free port, printed at start)"},
    {.name = "--api-key", .arg = "KEY", .kind = HKV_OPT_STR, .off = offsetof(hkv_srv_opts, api_key),
     .help = "require Authorization: Bearer KEY (all but /health)"},
    {.name = "--max-queue", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(hkv_srv_opts, max_queue),
     .lo = 0, .hi = 65536, .help = "requests waiting beyond those; more get 503 (default 64)"},
    {.name = "--max-body", .arg = "SIZE", .kind = HKV_OPT_FN, .fn = parse_max_body,
     .help = "largest request body (default 1M); past it: 413"},
    {.name = "--drain", .arg = "SECONDS", .kind = HKV_OPT_FLOAT, .off = offsetof(hkv_srv_opts, drain_s),
     .lo = 0, .hi = 86400,
     .help = "after SIGINT/SIGTERM, how long running requests may finish\n"
             "before they are cut (default 10; a second signal cuts at once)"},
    {.name = "--quiet", .short_name = 'q', .kind = HKV_OPT_FLAG, .off = offsetof(hkv_srv_opts, quiet),
     .help = "no start and stop lines on stderr"},
    {0},
};

static int serve_uses(hkv_srv_opts *o, hkv_opt_use *u) {
    int n = 0;
    u[n++] = (hkv_opt_use){.opts = hkv_model_opts, .base = &o->model};
    u[n++] = (hkv_opt_use){.opts = serve_opts_table, .base = o};
    u[n++] = (hkv_opt_use){.opts = hkv_sched_opts, .base = &o->sc};
    u[n++] = (hkv_opt_use){.opts = hkv_exec_opts, .base = &o->x};
    u[n++] = (hkv_opt_use){.opts = hkv_kv_opts, .base = &o->kv,
                           .title = "KV cache (one policy for every request)"};
    u[n++] = (hkv_opt_use){.opts = hkv_device_opts, .base = &o->dev, .title = "Device"};
    return n;
}

static int parse(int argc, char **argv, hkv_srv_opts *o, hkv_err *err) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->max_queue = 64;
    o->max_body = 1 << 20;
    o->drain_s = 10;
    hkv_sched_cli_init(&o->sc);
    hkv_exec_cli_init(&o->x);
    hkv_kv_cli_init(&o->kv);
    hkv_device_cli_init(&o->dev);
    hkv_opt_use uses[8];
    int rc = hkv_opts_parse("serve", uses, serve_uses(o, uses), argc, argv, err);
    if (rc) return rc;
    if (o->dev.synthetic)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "serve: --synthetic models have no tokenizer");
    if (!o->model) return hkv_seterr(err, HKV_E_INVAL, "serve: no model (-m MODEL)");
    return HKV_OK;
}

/* The engine thread's list of submitted requests; only it reads this. */
typedef struct engine_loop {
    hkv_srv *s;
    hkv_sched *sch;
    hkv_srv_req *active;
} engine_loop;

void hkv_srv_count(hkv_srv *s, int status) {
    int i = 0;
    while (i < HKV_SRV_CODES - 1 && s->m.code[i] && s->m.code[i] != status) i++;
    s->m.code[i] = status;   /* the last entry absorbs statuses past the table */
    s->m.n_code[i]++;
}

void hkv_srv_enqueue(hkv_srv *s, hkv_srv_req *r) {
    r->eng_gone = 0;
    r->next = NULL;
    if (s->in_tail) s->in_tail->next = r;
    else s->in_head = r;
    s->in_tail = r;
    s->n_open++;
    pthread_cond_signal(&s->engine_cv);
}

void hkv_srv_release(hkv_srv *s, hkv_srv_req *r, int engine_side) {
    if (engine_side) r->eng_gone = 1;
    else r->conn_gone = 1;
    if (!r->eng_gone || !r->conn_gone) return;
    hkv_batch_item_free(&r->it);
    free(r->out);
    pthread_cond_destroy(&r->cv);
    free(r);
    s->n_live--;
    pthread_cond_broadcast(&s->engine_cv);   /* the shutdown waits for the last answers */
}

/* Text of q that later tokens cannot take back: not a tail that may begin
 * a stop string, not a UTF-8 character cut by a token boundary (judged as
 * hkv_json_utf8 judges it, so the streamed pieces equal the whole text). */
static size_t settled(const hkv_sched_req *q) {
    size_t L = q->text_len, hold = 0;
    for (int k = 0; k < q->n_stop; k++) {
        size_t m = strlen(q->stop[k]);
        for (size_t h = m - 1 < L ? m - 1 : L; h > hold; h--)
            if (!memcmp(q->text + L - h, q->stop[k], h)) {
                hold = h;
                break;
            }
    }
    L -= hold;
    for (size_t j = L > 3 ? L - 3 : 0; j < L; j++) {
        unsigned char c = (unsigned char)q->text[j];
        size_t n = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
        if (j + n > L) return j;
    }
    return L;
}

/* Copy r's settled text (all of it when final) for its connection (mu held). */
static void publish(hkv_srv_req *r, int final) {
    const hkv_sched_req *q = &r->it.req;
    size_t L = final ? q->text_len : settled(q);
    if (L <= r->out_len || r->conn_gone) return;
    if (L + 1 > r->out_cap) {
        char *nb = realloc(r->out, 2 * L + 64);
        if (!nb) return;   /* the next step tries again; the end sends the rest */
        r->out = nb;
        r->out_cap = 2 * L + 64;
    }
    memcpy(r->out + r->out_len, q->text + r->out_len, L - r->out_len);
    r->out_len = L;
    pthread_cond_broadcast(&r->cv);
}

/* The engine is done with r (mu held): status 200, or an error for its client. */
static void end_req(hkv_srv *s, hkv_srv_req *r, int status, const char *msg) {
    r->done = 1;
    r->http_status = status;
    if (status != 200 && msg) hkv_seterr(&r->err, r->err.code ? r->err.code : HKV_E_INTERNAL, "%s", msg);
    s->n_open--;
    pthread_cond_broadcast(&r->cv);
    hkv_srv_release(s, r, 1);
}

static int http_status_of(int code) {
    return code == HKV_E_NOMEM || code == HKV_E_INTERNAL || code == HKV_E_IO || code == HKV_E_DEVICE
               ? 500 : 400;
}

static void on_done(void *ud, hkv_sched_req *q) {
    engine_loop *L = ud;
    hkv_srv *s = L->s;
    hkv_srv_req *r = q->user ? (hkv_srv_req *)((char *)q->user - offsetof(hkv_srv_req, it)) : NULL;
    for (hkv_srv_req **pp = &L->active; *pp; pp = &(*pp)->enext)
        if (*pp == r) {
            *pp = r->enext;
            break;
        }
    pthread_mutex_lock(&s->mu);
    if (!q->status) {
        publish(r, 1);
        s->m.prompt_tokens += q->n_prompt;
        s->m.gen_tokens += q->n_out;
        end_req(s, r, 200, NULL);
    } else {
        r->err = q->err;
        end_req(s, r, http_status_of(q->status), q->err.msg);
    }
    pthread_mutex_unlock(&s->mu);
}

static void wait_engine(hkv_srv *s, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&s->engine_cv, &s->mu, &ts);
}

/* The scheduler's gauges for /metrics (mu held). */
static void gauges(engine_loop *L) {
    hkv_srv *s = L->s;
    hkv_sched_stats st;
    hkv_sched_get_stats(L->sch, &st);
    uint64_t kv = 0;
    for (hkv_srv_req *r = L->active; r; r = r->enext)
        if (r->it.req.t_admit > 0) kv += r->it.req.kv_bytes;
    s->m.running = hkv_sched_running(L->sch);
    s->m.queued = hkv_sched_pending(L->sch) - s->m.running;
    s->m.steps = st.steps;
    s->m.step_s = st.t_prefill + st.t_decode;
    s->m.kv_reserved = kv;
    s->m.prefix_hits = st.prefix_hits;
    s->m.prefix_tokens = st.prefix_tokens;
    s->m.prefix_bytes = st.prefix_bytes;
    s->m.prefix_saved = st.prefix_saved_bytes;
    s->m.prefix_index_hits = st.prefix_index_hits;
    for (int k = 0; k < HKV_TIER_COUNT; k++) s->m.tier_bytes[k] = s->e->mem.bytes[k];
}

static const char cut_msg[] = "the server shut down before the request finished";

/* The engine thread: submissions, cancellations and steps until a signal
 * and the drain are over. SIGINT/SIGTERM are blocked in every thread and
 * taken here between steps (as hetkv batch does): no flag, no handler. */
static int engine_run(engine_loop *L, const sigset_t *sigs, hkv_err *err) {
    hkv_srv *s = L->s;
    double deadline = 0;
    int rc = HKV_OK;
    for (;;) {
        const int sig = hkv_cli_signal_pending(sigs);
        pthread_mutex_lock(&s->mu);
        if (sig > 0) {
            if (!s->stopping && !s->o->quiet)
                fprintf(stderr, "hetkv serve: signal %d: no new requests; %d in flight get %.0f s "
                        "(a second signal cuts them now)\n", sig, s->n_open, s->o->drain_s);
            deadline = s->stopping ? 0 : hkv_now() + s->o->drain_s;
            s->stopping = 1;
            hkv_srv_http_quiesce(s);
        }
        const int cut = s->stopping && hkv_now() >= deadline;
        for (hkv_srv_req **pp = &L->active; *pp;) {   /* clients gone, or the drain over */
            hkv_srv_req *r = *pp;
            if (!r->cancel && !cut) {
                pp = &r->enext;
                continue;
            }
            hkv_sched_cancel(L->sch, &r->it.req);
            *pp = r->enext;
            end_req(s, r, 503, cut_msg);
        }
        hkv_srv_req *in = s->in_head;
        s->in_head = s->in_tail = NULL;
        while (in) {
            hkv_srv_req *r = in;
            in = r->next;
            if (r->cancel || cut) {
                end_req(s, r, 503, cut_msg);
                continue;
            }
            hkv_err serr;
            hkv_err_clear(&serr);
            const int src = hkv_sched_submit(L->sch, &r->it.req, &serr);
            if (src) {
                r->err = serr;
                end_req(s, r, http_status_of(src), serr.msg);
            } else {
                r->enext = L->active;
                L->active = r;
            }
        }
        gauges(L);
        if (!hkv_sched_pending(L->sch)) {
            const int quit = s->stopping;
            if (!quit) wait_engine(s, 100);
            pthread_mutex_unlock(&s->mu);
            if (quit) break;
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        if ((rc = hkv_sched_step(L->sch, err))) break;
        pthread_mutex_lock(&s->mu);
        for (hkv_srv_req *r = L->active; r; r = r->enext) publish(r, 0);
        gauges(L);
        pthread_mutex_unlock(&s->mu);
    }
    /* after a failed step (the scheduler is then unusable) whatever is still
     * open ends here; after a signal nothing is left */
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    while (L->active) {
        hkv_srv_req *r = L->active;
        L->active = r->enext;
        end_req(s, r, 500, rc ? err->msg : cut_msg);
    }
    for (hkv_srv_req *r = s->in_head, *nx; r; r = nx) {
        nx = r->next;
        end_req(s, r, 503, cut_msg);
    }
    s->in_head = s->in_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static const char *policy_name(const hkv_engine *e) {
    if (!hkv_kv_has_far(&e->kv)) return "plain";
    hkv_policy_args args;
    const hkv_policy_def *def = hkv_kv_seq_policy(&e->kv, 0, &args);
    return def ? def->name : "full";
}

int hkv_cmd_serve(int argc, char **argv) {
    hkv_err err;
    hkv_err_clear(&err);
    hkv_srv_opts o;
    int rc = parse(argc, argv, &o, &err);
    if (rc == 1) {
        hkv_opt_use uses[8];
        hkv_opts_help(stdout, serve_usage, uses, serve_uses(&o, uses));
        return 0;
    }
    if (rc) {
        hkv_err_report(&err, stderr);
        return 2;
    }
    /* blocked before any thread starts (OpenMP, oneDNN, libmicrohttpd), so
     * every thread inherits the mask and only the engine thread takes them */
    sigset_t sigs;
    hkv_cli_block_stop_signals(&sigs);
    hkv_srv s = {.o = &o, .listen_fd = -1};
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.engine_cv, NULL);
    engine_loop L = {.s = &s};
    hkv_engine_params ep;
    if ((rc = hkv_sched_cli_engine_params(&ep, o.model, &o.x, &o.sc, &o.kv, &o.dev, &err))) goto out;
    const int placed = hkv_kv_cli_auto(&o.kv) && o.dev.resident > 0;
    if ((rc = hkv_engine_open(&s.e, &ep, &err)) || (rc = hkv_device_cli_attach(&o.dev, s.e, &err)))
        goto out;
    s.model_name = s.e->model.cfg.name[0] ? s.e->model.cfg.name : o.model;
    s.policy = policy_name(s.e);
    /* max_tokens left out: the rest of the context, as vLLM and llama.cpp do */
    s.dflt_chat = (hkv_batch_defaults){(int)s.e->p.n_ctx, s.e->p.n_ctx, 1, 1};
    s.dflt_cmpl = s.dflt_chat;
    hkv_sched_params sp;
    hkv_sched_params_default(&sp);
    sp.max_batch = (int)o.sc.max_batch;
    sp.prefix_slots = (int)o.sc.prefix_cache;
    sp.chunk = o.sc.chunk;
    sp.resident = placed ? o.dev.resident : 0;   /* per-sequence placement (auto) */
    sp.resident_rows = placed ? hkv_device_cli_slot_rows(&o.dev) : 0;
    sp.resident_wait = placed && !o.dev.split_overflow;
    if (o.sc.mem) {
        sp.mem_budget = o.sc.mem;
    } else {
        size_t fr = hkv_host_mem_free();
        sp.mem_budget = fr ? (uint64_t)(fr - fr / 10) : 0;
    }
    sp.on_done = on_done;
    sp.ud = &L;
    if ((rc = hkv_sched_create(&L.sch, s.e, &sp, &err))) goto out;
    int port = 0;
    if ((rc = hkv_srv_http_start(&s, &port, &err))) goto out;
    if (!o.quiet) {
        char mem[32];
        hkv_fmt_bytes((double)sp.mem_budget, mem, sizeof mem);
        fprintf(stderr, "hetkv serve: listening on http://%s%s%s:%d (model %s, policy %s, context "
                "%lld, max-batch %lld, max-queue %lld, KV budget %s)\n",
                strchr(o.host, ':') ? "[" : "", o.host, strchr(o.host, ':') ? "]" : "", port,
                s.model_name, s.policy, (long long)s.e->p.n_ctx, o.sc.max_batch, o.max_queue, mem);
        fflush(stderr);
    }
    rc = engine_run(&L, &sigs, &err);
    /* every request is done; their answers (a 503 for those cut) go out
     * before the connections close, unless a client takes more than 5 s */
    pthread_mutex_lock(&s.mu);
    for (double t_end = hkv_now() + 5; s.n_live > 0 && hkv_now() < t_end;) wait_engine(&s, 100);
    pthread_mutex_unlock(&s.mu);
    hkv_srv_http_stop(&s);
    if (!o.quiet && !rc) {
        pthread_mutex_lock(&s.mu);
        fprintf(stderr, "hetkv serve: stopped: %lld prompt and %lld generated tokens, %lld "
                "requests cancelled by their client\n", s.m.prompt_tokens, s.m.gen_tokens,
                s.m.cancelled);
        pthread_mutex_unlock(&s.mu);
    }
out:
    if (rc) hkv_err_report(&err, stderr);
    hkv_srv_http_stop(&s);
    hkv_sched_free(L.sch);
    hkv_engine_close(s.e);
    pthread_cond_destroy(&s.engine_cv);
    pthread_mutex_destroy(&s.mu);
    return rc ? 1 : 0;
}
