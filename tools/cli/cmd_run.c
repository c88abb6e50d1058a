/* hetkv run: generate a completion (or a chat reply) and report tokens/s. */
#include <errno.h>
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
    "\n"
    "  -m, --model PATH      GGUF model file\n"
    "  -p, --prompt TEXT     prompt text\n"
    "  -f, --file PATH       read the prompt from a file\n"
    "  -n, --n-predict N     tokens to generate (default 128)\n"
    "      --chat            wrap the prompt in the model's chat template\n"
    "      --system TEXT     system message for --chat (default: the template's)\n"
    "      --temp T          temperature, 0 = greedy (default 0.7 with --chat, else 0)\n"
    "      --top-k K         keep the K most likely tokens (default 40, 0 = off)\n"
    "      --top-p P         nucleus sampling (default 0.95, 1 = off)\n"
    "      --seed S          sampling seed (default 42)\n"
    "  -b, --batch B         generate B completions of the prompt together (seeds S..S+B-1)\n"
    "  -c, --ctx N           context per sequence (default: prompt + n-predict)\n"
    "  -t, --threads N       CPU threads (default: one per core)\n"
    "      --isa NAME        force kernels: scalar, avx2, avx512 (default: best)\n"
    "      --ignore-eos      do not stop at end-of-generation tokens\n"
    "      --no-special      read special-token text in the prompt (<|im_start|>) as plain\n"
    "                        text, not as those tokens (default: special tokens, as llama.cpp\n"
    "                        and Hugging Face tokenizers do)\n"
    "      --json            print one JSON object instead of streaming text\n"
    "  -h, --help            this help\n"
    "\nKV cache:\n";

typedef struct run_opts {
    const char *model, *prompt, *file, *system;
    long long n_predict, batch, ctx, threads, top_k, seed;
    double temp, top_p;
    int chat, json, ignore_eos, isa, temp_set, no_special;
    hkv_kv_cli kv;
    hkv_device_cli dev;
} run_opts;

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
    o->top_k = 40;
    o->top_p = 0.95;
    o->seed = 42;
    o->isa = -1;
    hkv_kv_cli_init(&o->kv);
    hkv_device_cli_init(&o->dev);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int rc = hkv_kv_cli_parse(&o->kv, argc, argv, &i, err);
        if (rc < 0) return rc;
        if (rc == 1) continue;
        if ((rc = hkv_device_cli_parse(&o->dev, argc, argv, &i, err)) < 0) return rc;
        if (rc == 1) continue;
#define VAL() do { if ((rc = hkv_arg_value(argc, argv, &i, &v, err))) return rc; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return 1;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VAL(); o->model = v; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { VAL(); o->prompt = v; }
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) { VAL(); o->file = v; }
        else if (!strcmp(a, "--system")) { VAL(); o->system = v; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) { VAL(); rc = hkv_arg_int(a, v, 0, 1 << 24, &o->n_predict, err); }
        else if (!strcmp(a, "-b") || !strcmp(a, "--batch")) { VAL(); rc = hkv_arg_int(a, v, 1, 4096, &o->batch, err); }
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) { VAL(); rc = hkv_arg_int(a, v, 1, 1LL << 31, &o->ctx, err); }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { VAL(); rc = hkv_arg_int(a, v, 1, 4096, &o->threads, err); }
        else if (!strcmp(a, "--top-k")) { VAL(); rc = hkv_arg_int(a, v, 0, 1 << 24, &o->top_k, err); }
        else if (!strcmp(a, "--seed")) { VAL(); rc = hkv_arg_int(a, v, 0, 1LL << 62, &o->seed, err); }
        else if (!strcmp(a, "--temp")) { VAL(); rc = hkv_arg_float(a, v, 0, 100, &o->temp, err); o->temp_set = 1; }
        else if (!strcmp(a, "--top-p")) { VAL(); rc = hkv_arg_float(a, v, 1e-6, 1, &o->top_p, err); }
        else if (!strcmp(a, "--isa")) {
            VAL();
            if ((o->isa = hkv_isa_parse(v)) < 0)
                return hkv_seterr(err, HKV_E_INVAL, "--isa: unknown '%s' (scalar, avx2, avx512)", v);
        }
        else if (!strcmp(a, "--chat")) o->chat = 1;
        else if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--ignore-eos")) o->ignore_eos = 1;
        else if (!strcmp(a, "--no-special")) o->no_special = 1;
        else return hkv_seterr(err, HKV_E_INVAL, "run: unknown option '%s' (see hetkv run --help)", a);
        if (rc) return rc;
#undef VAL
    }
    /* A synthetic model's text would be noise from random weights, and it has
     * no tokenizer to make any: refuse rather than invent one. */
    if (o->dev.synthetic)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "run: --synthetic models have random weights and "
                          "no tokenizer, so there is no text to read or write; use hetkv bench "
                          "--synthetic %s (token ids) or hetkv plan", o->dev.synthetic);
    if (!o->model) return hkv_seterr(err, HKV_E_INVAL, "run: no model (-m MODEL)");
    if (!o->prompt == !o->file)
        return hkv_seterr(err, HKV_E_INVAL, "run: give exactly one of -p PROMPT or -f FILE");
    if (!o->temp_set) o->temp = o->chat ? 0.7 : 0.0;
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
        fputs(run_usage, stdout);
        fputs(hkv_kv_cli_help, stdout);
        fputs("\nDevice:\n", stdout);
        fputs(hkv_device_cli_help, stdout);
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
    ep.n_threads = (int)o.threads;
    ep.isa = o.isa;
    ep.max_seqs = (int)o.batch;
    ep.device_cuda = o.dev.cuda;
    if ((rc = hkv_kv_cli_apply(&o.kv, &ep, &err))) goto out;
    /* --device cuda: device and admission (context: -c, else the model's) before loading. */
    if ((rc = hkv_device_cli_check_near(&o.dev, o.model, &ep, o.kv.local >= 0, (int)o.batch, o.ctx,
                                        &err)))
        goto out;
    double t0 = hkv_now();
    if ((rc = hkv_engine_open(&e, &ep, &err)) || (rc = hkv_device_cli_attach(&o.dev, e, &err)))
        goto out;
    double t_load = hkv_now() - t0;
    e->prefill_progress = on_prefill;
    e->prefill_progress_ud = &sc;

    const char *text = o.prompt ? o.prompt : file_text;
    size_t text_len = o.prompt ? strlen(o.prompt) : file_len;
    if (o.chat) {
        hkv_chat_msg msgs[2];
        int nm = 0;
        if (o.system) msgs[nm++] = (hkv_chat_msg){"system", o.system};
        msgs[nm++] = (hkv_chat_msg){"user", text};
        if ((rc = hkv_chat_apply(e->tok, msgs, nm, 1, &chat_text, &err))) goto out;
        text = chat_text;
        text_len = strlen(chat_text);
    }
    int64_t n_prompt = 0, cap = (int64_t)text_len + 16;
    prompt = malloc((size_t)cap * sizeof *prompt);
    if (!prompt) {
        rc = hkv_seterr(&err, HKV_E_NOMEM, "no memory for the prompt");
        goto out;
    }
    if ((rc = hkv_tokenize(e->tok, text, text_len, hkv_tokenizer_add_bos(e->tok),
                           o.chat || !o.no_special, prompt,
                           cap, &n_prompt, &err)))
        goto out;
    if (n_prompt == 0) {
        rc = hkv_seterr(&err, HKV_E_INVAL, "the prompt is empty after tokenisation");
        goto out;
    }
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
        r->sp = (hkv_sampler_params){(float)o.temp, (int)o.top_k, (float)o.top_p,
                                     (uint64_t)o.seed + (uint64_t)i};
        r->stop_at_eog = !o.ignore_eos;
        r->out = malloc((size_t)(o.n_predict + 1) * sizeof(int32_t));
        if (!r->out) {
            rc = hkv_seterr(&err, HKV_E_NOMEM, "no memory for outputs");
            goto out;
        }
    }
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
