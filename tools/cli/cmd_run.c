/* hetkv run: generate a completion (or a chat reply) and report tokens/s. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "generate.h"
#include "kv_tiered.h"

static const char run_usage[] =
    "usage: hetkv run -m MODEL (-p PROMPT | -f FILE) [options]\n"
    "\n"
    "Generate text from a prompt on the CPU path.\n"
    "\n";

typedef struct run_opts {
    const char *model, *prompt, *file, *system;
    long long n_predict, batch, ctx, chunk;
    int chat, json, ignore_eos, no_special;
    hkv_exec_cli x;
    hkv_sampling_cli sp;
    hkv_kv_cli kv;
    hkv_device_cli dev;
} run_opts;

/* run's own options; the groups it shares follow them in parse(). */
static const hkv_opt run_opts_table[] = {
    {.name = "--prompt", .short_name = 'p', .arg = "TEXT", .kind = HKV_OPT_STR,
     .off = offsetof(run_opts, prompt), .help = "prompt text"},
    {.name = "--file", .short_name = 'f', .arg = "PATH", .kind = HKV_OPT_STR,
     .off = offsetof(run_opts, file), .help = "read the prompt from a file"},
    {.name = "--n-predict", .short_name = 'n', .arg = "N", .kind = HKV_OPT_INT,
     .off = offsetof(run_opts, n_predict), .lo = 0, .hi = 1 << 24,
     .help = "tokens to generate (default 128)"},
    {.name = "--chat", .kind = HKV_OPT_FLAG, .off = offsetof(run_opts, chat),
     .help = "wrap the prompt in the model's chat template"},
    {.name = "--system", .arg = "TEXT", .kind = HKV_OPT_STR, .off = offsetof(run_opts, system),
     .help = "system message for --chat (default: the template's)"},
    {.name = "--batch", .short_name = 'b', .arg = "B", .kind = HKV_OPT_INT,
     .off = offsetof(run_opts, batch), .lo = 1, .hi = 4096,
     .help = "generate B completions of the prompt together (seeds S..S+B-1)"},
    {.name = "--ctx", .short_name = 'c', .arg = "N", .kind = HKV_OPT_INT,
     .off = offsetof(run_opts, ctx), .lo = 1, .hi = (double)(1LL << 31),
     .help = "context per sequence (default: prompt + n-predict)"},
    {.name = "--chunk", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(run_opts, chunk),
     .lo = 1, .hi = 65536,
     .help = "prompt tokens per prefill call (default 256; with --device cuda and\n"
             "a context of 16K or more, 2048 where the device has room: a prompt\n"
             "past the device's copy streams its earlier keys once a chunk)"},
    {.name = "--ignore-eos", .kind = HKV_OPT_FLAG, .off = offsetof(run_opts, ignore_eos),
     .help = "do not stop at end-of-generation tokens"},
    {.name = "--no-special", .kind = HKV_OPT_FLAG, .off = offsetof(run_opts, no_special),
     .help = "read special-token text in the prompt (<|im_start|>) as plain\n"
             "text, not as those tokens (default: special tokens, as llama.cpp\n"
             "and Hugging Face tokenizers do)"},
    {.name = "--json", .kind = HKV_OPT_FLAG, .off = offsetof(run_opts, json),
     .help = "print one JSON object instead of streaming text"},
    {0},
};

/* Without --chunk, on the device path at a context of 16K or more: prompt
 * chunks of RUN_LONG_CHUNK rows where the device has room for their
 * workspace (else the default stays). A prompt that outgrows the device's
 * copy of its K/V streams its earlier keys over PCIe once a chunk, so that
 * traffic falls with the chunk (docs/PIPELINE.md, "A prompt's attention on
 * the device"); the headline run's chunk. */
#define RUN_LONG_CHUNK 2048
#define RUN_LONG_CTX 16384
static int long_prompt_chunk(const run_opts *o, hkv_engine_params *ep, hkv_err *err) {
    if (o->chunk || !o->dev.cuda || ep->max_rows >= RUN_LONG_CHUNK) return HKV_OK;
    hkv_model_config cfg;
    int rc = hkv_cli_model_config(o->model, o->dev.synthetic, &cfg, err);
    if (rc) return rc;
    const int64_t ctx = ep->n_ctx ? ep->n_ctx : cfg.ctx_train;
    if (ctx < RUN_LONG_CTX) return HKV_OK;
    const int was = ep->max_rows;
    ep->max_rows = RUN_LONG_CHUNK;
    hkv_err tried;
    hkv_err_clear(&tried);
    if (hkv_device_cli_check(&o->dev, o->model, ep, (int)o->batch, ep->n_ctx, &tried)) {
        ep->max_rows = was;   /* no room: the default chunk, already admitted */
        return HKV_OK;
    }
    fprintf(stderr, "hetkv: --device cuda, context %lld: the prompt goes in chunks of %d rows "
            "(--chunk N sets it)\n", (long long)ctx, RUN_LONG_CHUNK);
    return HKV_OK;
}

/* The prompt's tokens (chat: through the model's template) into *prompt
 * (malloc'd), *n_prompt of them; *chat_text keeps the templated text. */
static int tokenize_prompt(const run_opts *o, const hkv_tokenizer *tok, const char *file_text,
                           size_t file_len, int32_t **prompt, int64_t *n_prompt, char **chat_text,
                           hkv_err *err) {
    const char *text = o->prompt ? o->prompt : file_text;
    size_t text_len = o->prompt ? strlen(o->prompt) : file_len;
    int rc;
    if (o->chat) {
        hkv_chat_msg msgs[2];
        int nm = 0;
        if (o->system) msgs[nm++] = (hkv_chat_msg){"system", o->system};
        msgs[nm++] = (hkv_chat_msg){"user", text};
        if ((rc = hkv_chat_apply(tok, msgs, nm, 1, chat_text, err))) return rc;
        text = *chat_text;
        text_len = strlen(*chat_text);
    }
    const int64_t cap = (int64_t)text_len + 16;
    if (!(*prompt = malloc((size_t)cap * sizeof **prompt)))
        return hkv_seterr(err, HKV_E_NOMEM, "no memory for the prompt");
    if ((rc = hkv_tokenize(tok, text, text_len, hkv_tokenizer_add_bos(tok), o->chat || !o->no_special,
                           *prompt, cap, n_prompt, err)))
        return rc;
    if (*n_prompt == 0) return hkv_seterr(err, HKV_E_INVAL, "the prompt is empty after tokenisation");
    return HKV_OK;
}

/* Without -c the context is what the run needs (prompt + -n + 1): with
 * --device cuda the plan must know it before anything is loaded, or it
 * would plan the model's whole trained context (128K for Llama-3.1) and
 * place the batch for that. So the prompt is tokenised first, by the
 * model's tokenizer alone. */
static int tokenize_early(const run_opts *o, const char *file_text, size_t file_len, int32_t **prompt,
                          int64_t *n_prompt, char **chat_text, hkv_err *err) {
    hkv_tokenizer *tok = NULL;
    int rc = hkv_tokenizer_load_file(&tok, o->model, err);
    if (!rc) rc = tokenize_prompt(o, tok, file_text, file_len, prompt, n_prompt, chat_text, err);
    hkv_tokenizer_free(tok);
    return rc;
}

/* The tables run takes, in the order they are tried and shown. */
static int run_uses(run_opts *o, hkv_opt_use *u) {
    int n = 0;
    u[n++] = (hkv_opt_use){.opts = hkv_model_opts, .base = &o->model};
    u[n++] = (hkv_opt_use){.opts = run_opts_table, .base = o};
    u[n++] = (hkv_opt_use){.opts = hkv_sampling_opts, .base = &o->sp};
    u[n++] = (hkv_opt_use){.opts = hkv_exec_opts, .base = &o->x};
    u[n++] = (hkv_opt_use){.opts = hkv_kv_opts, .base = &o->kv, .title = "KV cache"};
    u[n++] = (hkv_opt_use){.opts = hkv_device_opts, .base = &o->dev, .title = "Device"};
    return n;
}

typedef struct stream_ctx {
    hkv_engine *e;
    int json;
    char **text;      /* per request */
    size_t *len, *cap;
    const sigset_t *stop_set;   /* SIGINT, SIGTERM: blocked, taken between steps */
    int stop_sig;     /* the one taken, or 0 */
    int out_closed;   /* stdout's reader went away (EPIPE: hetkv ignores SIGPIPE) */
} stream_ctx;

/* Nonzero: stop here (a signal, or nobody left to read the stream). */
static int should_stop(stream_ctx *s) {
    if (!s->stop_sig) s->stop_sig = hkv_cli_signal_pending(s->stop_set);
    return s->stop_sig || s->out_closed;
}

static int on_token(void *ud, int req, int32_t tok) {
    stream_ctx *s = ud;
    char piece[256];
    int n = hkv_token_to_piece(s->e->tok, tok, 0, piece, sizeof piece);
    if (n <= 0) return should_stop(s);
    if (req == 0 && !s->json && !s->out_closed &&
        (fwrite(piece, 1, (size_t)n, stdout) != (size_t)n || fflush(stdout) != 0))
        s->out_closed = 1;
    if (s->len[req] + (size_t)n + 1 > s->cap[req]) {
        size_t nc = 2 * (s->cap[req] + (size_t)n + 64);
        char *nb = realloc(s->text[req], nc);
        if (!nb) return should_stop(s);
        s->text[req] = nb;
        s->cap[req] = nc;
    }
    memcpy(s->text[req] + s->len[req], piece, (size_t)n);
    s->len[req] += (size_t)n;
    s->text[req][s->len[req]] = 0;
    return should_stop(s);
}

/* hkv_progress_fn: a signal during a long prompt stops the prefill. */
static int on_prefill(void *ud, int64_t done, int64_t n, double elapsed_s) {
    (void)done, (void)n, (void)elapsed_s;
    return should_stop(ud);
}

static int parse(int argc, char **argv, run_opts *o, hkv_err *err) {
    memset(o, 0, sizeof *o);
    o->n_predict = 128;
    o->batch = 1;
    hkv_exec_cli_init(&o->x);
    hkv_sampling_cli_init(&o->sp);
    hkv_kv_cli_init(&o->kv);
    hkv_device_cli_init(&o->dev);
    hkv_opt_use uses[8];
    int rc = hkv_opts_parse("run", uses, run_uses(o, uses), argc, argv, err);
    if (rc) return rc;
    /* A synthetic model's text would be noise from random weights, and it has
     * no tokenizer to make any: refuse rather than invent one. */
    if (o->dev.synthetic)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "run: --synthetic models have random weights and "
                          "no tokenizer, so there is no text to read or write; use hetkv bench "
                          "--synthetic %s (token ids) or hetkv plan", o->dev.synthetic);
    if (!o->model) return hkv_seterr(err, HKV_E_INVAL, "run: no model (-m MODEL)");
    if (!o->prompt == !o->file)
        return hkv_seterr(err, HKV_E_INVAL, "run: give exactly one of -p PROMPT or -f FILE");
    if (isnan(o->sp.temp)) o->sp.temp = o->chat ? 0.7 : 0.0;
    return HKV_OK;
}

static json_t *tokens_json(const int32_t *t, int64_t n, int *bad) {
    json_t *a = json_array();
    for (int64_t i = 0; i < n; i++) hkv_jpush(a, json_integer(t[i]), bad);
    return a;
}

/* Per tier, the peak bytes: "memory" and "draft_memory". */
static json_t *peaks_json(const size_t *peak, int *bad) {
    json_t *m = json_object();
    for (int t = 0; t < HKV_TIER_COUNT; t++)
        hkv_jset(m, hkv_tier_name(t), json_integer((json_int_t)peak[t]), bad);
    return m;
}

static int print_json(const run_opts *o, hkv_engine *e, const int32_t *prompt, int64_t n_prompt,
                      hkv_gen_request *reqs, stream_ctx *sc, const hkv_gen_stats *st,
                      double t_load, hkv_err *err) {
    int bad = 0;
    json_t *j = json_object();
    hkv_jset(j, "model", hkv_jstr(e->model.cfg.name), &bad);
    hkv_jset(j, "isa", json_string(hkv_isa_name(e->kern.isa)), &bad);
    hkv_jset(j, "threads", json_integer(hkv_threads_count(e->threads)), &bad);
    hkv_jset(j, "batch", json_integer(o->batch), &bad);
    hkv_jset(j, "chunk", json_integer(e->max_rows), &bad);
    /* the policy that ran (what --policy auto picked), and whether the whole KV
     * stayed near: on the device alone with --device cuda */
    hkv_jset(j, "kv", json_string(e->p.kv_plain ? "plain" : "tiered"), &bad);
    if (!e->p.kv_plain) {
        hkv_jset(j, "policy", json_string(e->p.tiered.policy->name), &bad);
        hkv_jset(j, "near_rows", json_integer(e->p.tiered.L_init + e->p.tiered.L_local), &bad);
        hkv_jset(j, "far_kv", json_string(e->p.tiered.far_q8 ? "q8" : "f16"), &bad);
        if (hkv_kv_cli_auto(&o->kv) && o->dev.resident > 0) {   /* per-sequence placement */
            const int dev = o->dev.resident < o->batch ? o->dev.resident : (int)o->batch;
            hkv_jset(j, "placement", json_pack("{s:i, s:i}", "device", dev, "split",
                                               (int)o->batch - dev), &bad);
        }
    }
    hkv_jset(j, "prompt_tokens", tokens_json(prompt, n_prompt, &bad), &bad);
    hkv_jset(j, "tokens", tokens_json(reqs[0].out, reqs[0].n_out, &bad), &bad);
    /* generated bytes: NUL kept as \u0000, as this output always wrote it */
    hkv_jset(j, "text", hkv_json_text(sc->text[0] ? sc->text[0] : "", sc->len[0], 1), &bad);
    hkv_jset(j, "n_prompt", json_integer(n_prompt), &bad);
    hkv_jset(j, "n_generated", json_integer(reqs[0].n_out), &bad);
    hkv_jset(j, "stop", json_string(reqs[0].stop == HKV_STOP_EOG ? "eog" :
                                    reqs[0].stop == HKV_STOP_CANCEL ? "cancelled" : "length"), &bad);
    if (o->batch > 1) {
        json_t *seqs = json_array();
        for (int i = 0; i < o->batch; i++) {
            json_t *q = json_object();
            hkv_jset(q, "tokens", tokens_json(reqs[i].out, reqs[i].n_out, &bad), &bad);
            hkv_jset(q, "text", hkv_json_text(sc->text[i] ? sc->text[i] : "", sc->len[i], 1), &bad);
            hkv_jpush(seqs, q, &bad);
        }
        hkv_jset(j, "sequences", seqs, &bad);
    }
    json_t *t = json_object();
    hkv_jset(t, "load_s", hkv_jnum(t_load, "%.4f"), &bad);
    hkv_jset(t, "prefill_s", hkv_jnum(st->t_prefill, "%.4f"), &bad);
    hkv_jset(t, "prefill_tok_s", hkv_jnum(st->t_prefill > 0 ? st->n_prefill_tokens / st->t_prefill : 0,
                                          "%.2f"), &bad);
    hkv_jset(t, "ttft_s", hkv_jnum(reqs[0].t_first_token, "%.4f"), &bad);
    hkv_jset(t, "decode_s", hkv_jnum(st->t_decode, "%.4f"), &bad);
    hkv_jset(t, "decode_tok_s", hkv_jnum(st->t_decode > 0 ? st->n_decode_tokens / st->t_decode : 0,
                                         "%.2f"), &bad);
    hkv_jset(t, "decode_steps", json_integer(st->decode_steps), &bad);
    hkv_jset(j, "timings", t, &bad);
    hkv_jset(j, "memory", peaks_json(e->mem.peak, &bad), &bad);
    hkv_pinned_account pin;
    hkv_kv_tiered_pinned(&e->kv, &pin);   /* page-locked far bytes: 0 without a CUDA device */
    json_t *p = json_object();
    hkv_jset(p, "bytes", json_integer((json_int_t)pin.bytes), &bad);
    hkv_jset(p, "peak", json_integer((json_int_t)pin.peak), &bad);
    hkv_jset(j, "far_pinned", p, &bad);
    hkv_device_cli_json(j, e, &bad);
    if (e->draft) hkv_jset(j, "draft_memory", peaks_json(e->draft->mem.peak, &bad), &bad);
    return hkv_json_emit(stdout, j, bad, err);
}

static void print_summary(hkv_engine *e, const hkv_gen_stats *st, double t_load) {
    char b[HKV_TIER_COUNT][32];
    for (int t = 0; t < HKV_TIER_COUNT; t++) hkv_fmt_bytes((double)e->mem.peak[t], b[t], sizeof b[t]);
    fprintf(stderr, "\n\nhetkv: %s, %d threads, %s kernels, load %.2f s\n", e->model.cfg.name,
            hkv_threads_count(e->threads), hkv_isa_name(e->kern.isa), t_load);
    /* the tokens prefilled (all the batch's; fewer than asked when stopped) */
    fprintf(stderr, "hetkv: prefill %lld tokens in %.3f s (%.1f tokens/s)\n",
            (long long)st->n_prefill_tokens, st->t_prefill,
            st->t_prefill > 0 ? st->n_prefill_tokens / st->t_prefill : 0);
    fprintf(stderr, "hetkv: decode %lld tokens in %.3f s (%.1f tokens/s, %d steps)\n",
            (long long)st->n_decode_tokens, st->t_decode,
            st->t_decode > 0 ? st->n_decode_tokens / st->t_decode : 0, st->decode_steps);
    hkv_pinned_account pin;
    char pb[32];
    hkv_kv_tiered_pinned(&e->kv, &pin);
    hkv_fmt_bytes((double)pin.peak, pb, sizeof pb);
    fprintf(stderr, "hetkv: memory: weights %s, KV near %s, KV far %s, index %s, workspace %s; "
            "far tier page-locked %s\n", b[HKV_TIER_WEIGHTS], b[HKV_TIER_NEAR], b[HKV_TIER_FAR],
            b[HKV_TIER_INDEX], b[HKV_TIER_WORKSPACE], pb);
    if (e->draft) {   /* the draft engine (speckv, specpc) has its own account */
        for (int t = 0; t < HKV_TIER_COUNT; t++)
            hkv_fmt_bytes((double)e->draft->mem.peak[t], b[t], sizeof b[t]);
        fprintf(stderr, "hetkv: draft %s: weights %s, KV near %s, KV far %s, index %s, workspace %s\n",
                e->draft->model.cfg.name, b[HKV_TIER_WEIGHTS], b[HKV_TIER_NEAR], b[HKV_TIER_FAR],
                b[HKV_TIER_INDEX], b[HKV_TIER_WORKSPACE]);
    }
    hkv_device_cli_summary(stderr, e);
}

int hkv_cmd_run(int argc, char **argv) {
    hkv_err err;
    hkv_err_clear(&err);
    run_opts o;
    int rc = parse(argc, argv, &o, &err);
    if (rc == 1) {
        hkv_opt_use uses[8];
        hkv_opts_help(stdout, run_usage, uses, run_uses(&o, uses));
        return 0;
    }
    if (rc) {
        hkv_err_report(&err, stderr);
        return 2;
    }
    char *file_text = NULL, *chat_text = NULL;
    size_t file_len = 0;
    int32_t *prompt = NULL;
    hkv_engine *e = NULL;
    hkv_gen_request *reqs = NULL;
    stream_ctx sc = {0};
    if (o.file && (rc = hkv_read_file(o.file, &file_text, &file_len, &err))) goto out;

    sigset_t stop_set;   /* before the engine starts threads: they inherit the mask */
    hkv_cli_block_stop_signals(&stop_set);
    sc.stop_set = &stop_set;
    hkv_engine_params ep;
    hkv_engine_params_default(&ep);
    ep.model_path = o.model;
    ep.n_threads = (int)o.x.threads;
    ep.isa = o.x.isa;
    ep.max_seqs = (int)o.batch;
    ep.device_cuda = o.dev.cuda;
    if ((rc = hkv_kv_cli_apply(&o.kv, &ep, &err))) goto out;
    /* --device cuda: device and admission (context: -c, else what the run
     * needs) before loading. */
    if (o.chunk) ep.max_rows = (int)o.chunk;
    int64_t n_prompt = 0;
    ep.n_ctx = o.ctx;
    if (o.dev.cuda && !o.ctx) {
        if ((rc = tokenize_early(&o, file_text, file_len, &prompt, &n_prompt, &chat_text, &err)))
            goto out;
        ep.n_ctx = n_prompt + o.n_predict + 1;
    }
    if ((rc = hkv_device_cli_check_near(&o.dev, o.model, &ep, o.kv.local >= 0,
                                        hkv_kv_cli_auto(&o.kv), (int)o.batch, ep.n_ctx, &err)))
        goto out;
    if ((rc = long_prompt_chunk(&o, &ep, &err))) goto out;
    double t0 = hkv_now();
    if ((rc = hkv_engine_open(&e, &ep, &err)) || (rc = hkv_device_cli_attach(&o.dev, e, &err)))
        goto out;
    double t_load = hkv_now() - t0;
    /* per-sequence placement under auto: the first completions whole on the
     * device (full in resident slots), the rest under the picked policy */
    if (hkv_kv_cli_auto(&o.kv) && o.dev.resident > 0) {
        hkv_policy_args fa;
        hkv_policy_args_init(&hkv_policy_full, &fa);
        for (int i = 0; i < o.dev.resident && i < o.batch; i++)
            if ((rc = hkv_kv_set_policy(&e->kv, i, &hkv_policy_full, &fa, &err))) goto out;
    }
    e->prefill_progress = on_prefill;
    e->prefill_progress_ud = &sc;

    if (!prompt &&
        (rc = tokenize_prompt(&o, e->tok, file_text, file_len, &prompt, &n_prompt, &chat_text, &err)))
        goto out;
    int64_t need = n_prompt + o.n_predict + 1;
    e->p.n_ctx = o.ctx ? o.ctx : need;
    if (o.ctx) hkv_engine_ctx_warn(e);

    reqs = calloc((size_t)o.batch, sizeof *reqs);
    sc.e = e;
    sc.json = o.json;
    sc.text = calloc((size_t)o.batch, sizeof(char *));
    sc.len = calloc((size_t)o.batch, sizeof(size_t));
    sc.cap = calloc((size_t)o.batch, sizeof(size_t));
    if (!reqs || !sc.text || !sc.len || !sc.cap) {
        rc = hkv_seterr(&err, HKV_E_NOMEM, "no memory for %lld requests", o.batch);
        goto out;
    }
    for (int i = 0; i < o.batch; i++) {
        hkv_gen_request *r = &reqs[i];
        r->prompt = prompt;
        r->n_prompt = n_prompt;
        r->n_predict = (int)o.n_predict;
        r->sp = (hkv_sampler_params){(float)o.sp.temp, (int)o.sp.top_k, (float)o.sp.top_p,
                                     (uint64_t)o.sp.seed + (uint64_t)i};
        r->stop_at_eog = !o.ignore_eos;
        r->out = malloc((size_t)(o.n_predict + 1) * sizeof(int32_t));
        if (!r->out) {
            rc = hkv_seterr(&err, HKV_E_NOMEM, "no memory for outputs");
            goto out;
        }
    }
    const char *text = o.prompt ? o.prompt : file_text;   /* a completion echoes its prompt */
    const size_t text_len = o.prompt ? strlen(o.prompt) : file_len;
    if (!o.json && !o.chat && (fwrite(text, 1, text_len, stdout) != text_len || fflush(stdout) != 0))
        sc.out_closed = 1;
    hkv_gen_stats st = {0};
    rc = sc.out_closed ? HKV_OK : hkv_generate(e, reqs, (int)o.batch, on_token, &sc, &st, &err);
    if (sc.stop_sig)
        hkv_err_prefix(&err, "stopped by signal %d (%s)", sc.stop_sig,
                       sc.stop_sig == SIGINT ? "SIGINT" : "SIGTERM");
    else if (sc.out_closed)
        rc = hkv_seterr(&err, HKV_E_IO, "the output was closed (%s) after %d generated tokens",
                        strerror(EPIPE), reqs[0].n_out);
    /* Print what was generated even when a later step failed. */
    if (o.json) {
        hkv_err jerr;   /* a failed step's error stays the one reported */
        hkv_err_clear(&jerr);
        int jrc = print_json(&o, e, prompt, n_prompt, reqs, &sc, &st, t_load, rc ? &jerr : &err);
        if (!rc) rc = jrc;
    }
    else
        print_summary(e, &st, t_load);
out:
    if (rc) hkv_err_report(&err, stderr);
    if (reqs)
        for (int i = 0; i < o.batch; i++) free(reqs[i].out);
    if (sc.text)
        for (int i = 0; i < o.batch; i++) free(sc.text[i]);
    free(sc.text);
    free(sc.len);
    free(sc.cap);
    free(reqs);
    free(prompt);
    free(chat_text);
    free(file_text);
    hkv_engine_close(e);
    return sc.stop_sig ? 128 + sc.stop_sig : rc ? 1 : 0;
}
