/* hetkv eval: options, checks before any work, the runs, the output. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cli_rows.h"
#include "eval.h"
#include "kv_far.h"
#include "kv_tiered.h"
#include "lookahead.h"

static const char eval_usage[] =
    "usage: hetkv eval -m MODEL [options]\n"
    "\n"
    "Measure KV policies against dense attention on real English text.\n"
    "Fidelity: the first CTX-CONT corpus tokens are prefilled once, then every\n"
    "configuration decodes the next CONT tokens teacher-forced; reported: recall\n"
    "of the oracle's top-budget far tokens, attention-output error, KL(full||c) of\n"
    "the next-token distribution, greedy agreement with full, tokens attended.\n"
    "Tasks: passkey, needle, multi-needle and multi-turn retrieval in the chat\n"
    "template, greedy answers, accuracy per configuration.\n"
    "A context CTX counts every position used (prompt, continuation, answers),\n"
    "so CTX may not exceed the model's trained context.\n"
    "\n"
    "Rows (-o): one per (fidelity context or task and context, configuration), the\n"
    "tables then on stderr (docs/BENCH_ROWS.md).\n"
    "\n";

typedef struct eval_opts {
    const char *model, *configs, *corpus, *out, *budgets;
    long long ctx[EVAL_MAX_CTX], task_ctx[EVAL_MAX_CTX];
    int n_ctx, n_task_ctx;
    long long cont, trials, answer_tokens, seed, prefix_chunk;
    int tasks;      /* bit per task */
    int quiet, no_fidelity;
    hkv_exec_cli x;
    hkv_output_cli of;           /* --json, -o: enum HKV_ROWS_*, 0 none */
} eval_opts;

int eval_fork(eval_run *r, int64_t ctx, const hkv_policy_def *def, const hkv_policy_args *args,
              int audit, int64_t audit_k, int64_t *index_bytes, hkv_err *err) {
    hkv_kv *kv = &r->e->kv;
    /* Policy first, on the closed sequence, so the copy builds its index once. */
    kv->ops->seq_close(kv->self, 1);
    r->fork_ctx = ctx;
    const size_t before = r->e->mem.bytes[HKV_TIER_INDEX];
    int rc = hkv_kv_set_policy(kv, 1, def, args, err);
    if (!rc) rc = hkv_kv_tiered_set_audit(kv, audit, audit_k, err);
    /* + room for the lookahead tokens of laq/speckv (eval_fork_prep) */
    if (!rc) rc = kv->ops->seq_open(kv->self, 1, ctx + hkv_lookahead_room(r->e, 1), err);
    /* fastkv's prefill differs (token-selective propagation): its fork is
     * left empty here and prefilled by eval_fork_prep. */
    if (!rc && def->prep != HKV_PREP_TSP) rc = kv->ops->seq_copy(kv->self, 1, 0, err);
    hkv_kv_tiered_audit_reset(kv, 1);
    if (index_bytes) *index_bytes = (int64_t)(r->e->mem.bytes[HKV_TIER_INDEX] - before);
    return rc ? hkv_err_prefix(err, "forking the prompt for '%s'", def->name) : HKV_OK;
}

/* --prefix-chunk: sequence 1 again, as the prefix cache makes it for a
 * policy that shares its index (runtime/scheduler.c): sequence 0's first S
 * tokens (S its last whole chunk), its index built there, the rest
 * prefilled as a later turn. r->staged says whether it was. */
static int stage_index(eval_run *r, const int32_t *prompt, int64_t n, float *logits, hkv_err *err) {
    hkv_kv *kv = &r->e->kv;
    const hkv_kv_ops *ops = kv->ops;
    const int64_t S = (n - 1) / r->prefix_chunk * r->prefix_chunk;
    const hkv_policy_def *d;
    hkv_policy pol;
    r->staged = 0;
    if (S <= 0 || !ops->seq_share || hkv_kv_seq_instance(kv, 1, &d, &pol, err) || !pol.ops->fork)
        return HKV_OK;
    const int64_t cap = r->fork_ctx + hkv_lookahead_room(r->e, 1);   /* as eval_fork's */
    ops->seq_close(kv->self, 1);
    int rc = ops->seq_open(kv->self, 1, cap, err);
    if (!rc) rc = ops->seq_share(kv->self, 1, 0, S, 0, err);
    if (!rc) rc = hkv_kv_prompt_end(kv, 1, err);
    if (!rc) rc = hkv_prefill(r->e, 1, prompt + S, n - S, S, logits, err);
    hkv_kv_tiered_audit_reset(kv, 1);
    r->staged = !rc;
    return rc ? hkv_err_prefix(err, "'%s' index at the last whole chunk (%lld tokens)", d->name,
                               (long long)S)
              : HKV_OK;
}

int eval_fork_prep(eval_run *r, const int32_t *prompt, int64_t n, float *logits, int64_t max_new,
                   int64_t *base, hkv_err *err) {
    const hkv_policy_def *d = NULL;
    if (!hkv_kv_seq_instance(&r->e->kv, 1, &d, NULL, NULL) && d->prep == HKV_PREP_TSP) {
        *base = n;   /* eval_fork left it empty: the policy's own prefill, its logits */
        int rc = hkv_prefill(r->e, 1, prompt, n, 0, logits, err);
        return rc ? hkv_err_prefix(err, "'%s' prefill of the prompt", d->name) : HKV_OK;
    }
    if (r->prefix_chunk > 0) {
        int rc = stage_index(r, prompt, n, logits, err);
        if (rc) return rc;
    }
    return hkv_fork_prep(r->e, 1, prompt, n, logits, max_new, base, err);
}

static int parse_tasks(const char *v, int *mask, hkv_err *err) {
    *mask = 0;
    if (!strcmp(v, "none")) return HKV_OK;
    for (const char *p = v; *p;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        int k = -1;
        for (int i = 0; i < EVAL_N_TASKS; i++)
            if (strlen(eval_task_names[i]) == len && !strncmp(p, eval_task_names[i], len)) k = i;
        if (k < 0)
            return hkv_seterr(err, HKV_E_INVAL, "--tasks: unknown task '%.*s' (passkey, needle, "
                              "multineedle, multiturn, or none)", (int)len, p);
        *mask |= 1 << k;
        p += len + (c ? 1 : 0);
    }
    return HKV_OK;
}

static int parse_tasks_opt(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    return parse_tasks(v, &((eval_opts *)base)->tasks, err);
}

/* eval's own options; the groups it shares follow them in eval_uses(). */
static const hkv_opt eval_opts_table[] = {
    {.name = "--ctx", .arg = "LIST", .kind = HKV_OPT_LIST, .off = offsetof(eval_opts, ctx),
     .n_off = offsetof(eval_opts, n_ctx), .cap = EVAL_MAX_CTX, .lo = 1, .hi = 1 << 24,
     .help = "fidelity contexts (default 2048,4096,8192)"},
    {.name = "--cont", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(eval_opts, cont),
     .lo = 1, .hi = 8192, .help = "teacher-forced tokens per fidelity run (default 256)"},
    {.name = "--no-fidelity", .kind = HKV_OPT_FLAG, .off = offsetof(eval_opts, no_fidelity),
     .help = "skip the fidelity runs"},
    {.name = "--prefix-chunk", .arg = "N", .kind = HKV_OPT_INT,
     .off = offsetof(eval_opts, prefix_chunk), .lo = 0, .hi = 1 << 20,
     .help = "a policy that shares its index over a shared prefix (ctkvr)\n"
             "builds it as the prefix cache does (hetkv batch --prefix-cache,\n"
             "--chunk N): at the prompt's last whole chunk of N tokens, the\n"
             "rest as a later turn; its rows say '@chunk N' (default 0: off)"},
    {.name = "--budgets", .arg = "LIST", .kind = HKV_OPT_STR, .off = offsetof(eval_opts, budgets),
     .help = "e.g. 1%,3%,10%,1024: each config whose policy takes a budget and\n"
             "sets none is run at each (a sweep axis; as hetkv bench)"},
    {.name = "--configs", .arg = "SPEC", .kind = HKV_OPT_STR, .off = offsetof(eval_opts, configs),
     .help = "';'-separated policy:key=val,... (default below); the budget\n"
             "(oracle k, ctkvr rho_p, quest/snapkv/rocketkv/fastkv budget)\n"
             "may be a share of the context, '3%'; fastkv prefills the\n"
             "prompt itself (token-selective propagation) rather than fork;\n"
             "far=q8: over the 8-bit far tier, its own prefill, against full's\n"
             "fp16 reference (fidelity only)"},
    {.name = "--tasks", .arg = "LIST", .kind = HKV_OPT_FN, .fn = parse_tasks_opt,
     .help = "passkey,needle,multineedle,multiturn or none (default all)"},
    {.name = "--task-ctx", .arg = "LIST", .kind = HKV_OPT_LIST, .off = offsetof(eval_opts, task_ctx),
     .n_off = offsetof(eval_opts, n_task_ctx), .cap = EVAL_MAX_CTX, .lo = 1, .hi = 1 << 24,
     .help = "task contexts (default: the --ctx list)"},
    {.name = "--trials", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(eval_opts, trials),
     .lo = 1, .hi = 100, .help = "trials per task and context (default 3)"},
    {.name = "--answer-tokens", .arg = "N", .kind = HKV_OPT_INT,
     .off = offsetof(eval_opts, answer_tokens), .lo = 1, .hi = 64,
     .help = "tokens generated per answer at most (default 16)"},
    {.name = "--seed", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(eval_opts, seed),
     .lo = 0, .hi = (double)(1LL << 62), .help = "needles, depths and haystack offsets (default 1)"},
    {.name = "--corpus", .arg = "LIST", .kind = HKV_OPT_STR, .off = offsetof(eval_opts, corpus),
     .help = "text files or directories, comma-separated"},
    {.name = "--out", .arg = "FILE", .kind = HKV_OPT_STR, .off = offsetof(eval_opts, out),
     .help = "also write the JSON object to FILE; FILE.jsonl: the rows instead,\n"
             "each part of the sweep (fidelity at a context, a task at a\n"
             "context) appended as it ends, and a run that finds rows of the\n"
             "same sweep there skips their parts (resumes it)"},
    {.name = "--quiet", .short_name = 'q', .kind = HKV_OPT_FLAG, .off = offsetof(eval_opts, quiet),
     .help = "no progress lines"},
    {0},
};

static int eval_uses(eval_opts *o, hkv_kv_cli *kc, hkv_opt_use *u) {
    int n = 0;
    u[n++] = (hkv_opt_use){.opts = hkv_model_opts, .base = &o->model};
    u[n++] = (hkv_opt_use){.opts = eval_opts_table, .base = o};
    u[n++] = (hkv_opt_use){.opts = hkv_exec_opts, .base = &o->x};
    u[n++] = (hkv_opt_use){.opts = hkv_output_opts, .base = &o->of};
    /* The policies are --configs': the KV group without the options that
     * choose one cache and policy, refused by name if given. */
    static const char *const single_policy[] = {"--kv", "--policy", "--policy-arg", NULL};
    u[n++] = (hkv_opt_use){.opts = hkv_kv_opts, .base = kc, .title = "KV cache",
                           .omit = single_policy,
                           .omit_why = "eval runs the tiered cache with the policies of --configs; "
                                       "--kv, --policy and --policy-arg do not apply"};
    return n;
}

static int parse_opts(int argc, char **argv, eval_opts *o, hkv_kv_cli *kc, hkv_err *err) {
    memset(o, 0, sizeof *o);
    o->ctx[0] = 2048, o->ctx[1] = 4096, o->ctx[2] = 8192;
    o->n_ctx = 3;
    o->cont = 256, o->trials = 3, o->answer_tokens = 16, o->seed = 1;
    o->tasks = (1 << EVAL_N_TASKS) - 1;
    o->configs = hkv_default_configs;
    hkv_exec_cli_init(&o->x);
    hkv_opt_use uses[8];
    const int n_uses = eval_uses(o, kc, uses);
    int rc = hkv_opts_parse("eval", uses, n_uses, argc, argv, err);
    if (rc == 1) {
        hkv_opts_help(stdout, eval_usage, uses, n_uses);
        printf("\ndefault --configs: %s\n%s\n", hkv_default_configs, eval_corpus_help);
        return 1;   /* help shown: nothing to run */
    }
    if (!rc && o->of.rows_fmt == HKV_ROWS_JSON) o->of.json = 1, o->of.rows_fmt = 0;   /* as bench's -o json */
    if (!rc && o->of.json && o->of.rows_fmt)
        rc = hkv_seterr(err, HKV_E_INVAL, "eval: --json and -o %s both write stdout: give one",
                        o->of.rows_fmt == HKV_ROWS_CSV ? "csv" : o->of.rows_fmt == HKV_ROWS_MD ? "md" : "jsonl");
    if (rc) return rc;
    if (!o->model) return hkv_seterr(err, HKV_E_INVAL, "eval: no model (-m MODEL)");
    if (o->no_fidelity) o->n_ctx = 0;
    if (!o->n_task_ctx && o->tasks) {
        /* The fidelity contexts (or, with --no-fidelity, the default ones):
         * a small model's own retrieval fades with distance, so the shorter
         * contexts are where a policy's losses show against full's. */
        static const long long dflt[] = {2048, 4096, 8192};
        o->n_task_ctx = o->n_ctx ? o->n_ctx : 3;
        for (int i = 0; i < o->n_task_ctx; i++) o->task_ctx[i] = o->n_ctx ? o->ctx[i] : dflt[i];
    }
    if (!o->tasks) o->n_task_ctx = 0;
    if (!o->n_ctx && !o->n_task_ctx) return hkv_seterr(err, HKV_E_INVAL, "eval: nothing to run");
    return HKV_OK;
}

/* Every context and budget checked against the model and the near tier
 * before any prefill. */
static int check_plan(const eval_opts *o, const eval_run *r, int near, int ctx_train, hkv_err *err) {
    for (int pass = 0; pass < 2; pass++) {
        const long long *cs = pass ? o->task_ctx : o->ctx;
        int n = pass ? o->n_task_ctx : o->n_ctx;
        for (int i = 0; i < n; i++) {
            long long L = cs[i];
            if (L > ctx_train)
                return hkv_seterr(err, HKV_E_RANGE, "context %lld exceeds the model's trained context "
                                  "of %d tokens; eval refuses it, since positions past training "
                                  "measure RoPE extrapolation, not the KV policy", L, ctx_train);
            /* Far tier at prompt end: fidelity keeps cont tokens for decode; tasks
             * keep answers and (multi-turn) later questions, bounded as below. */
            long long keep = pass ? (r->answer_tokens + 96LL) * EVAL_MAX_TURNS + 256 : r->cont;
            long long far = L - keep - near;
            if (far < 64)
                return hkv_seterr(err, HKV_E_RANGE, "context %lld is too short: after the sink and "
                                  "local window (%d) and %s (%lld) it leaves %lld far tokens; use a "
                                  "longer context or a smaller --local", L, near,
                                  pass ? "the answers and questions" : "--cont", keep, far);
            for (int c = 0; c < r->n_cfg; c++) {
                hkv_policy_args a;
                int64_t b;
                int rc = hkv_config_resolve(&r->cfg[c], L, far, &a, &b, NULL, 0, err);
                if (rc) return rc;
            }
        }
    }
    return HKV_OK;
}

/* Replace the engine's cache by one that keeps as many prompt queries as the
 * hungriest configuration wants, so every fork copies them and each policy
 * builds its index from the same prefill. */
static int setup_kv(eval_run *r, const eval_opts *o, hkv_err *err) {
    hkv_engine *e = r->e;
    const hkv_model_config *mc = &e->model.cfg;
    hkv_tiered_params tp = e->p.tiered;
    hkv_policy_env env = {.shape = {mc->n_layer, mc->n_head, mc->n_head_kv, mc->head_dim},
                          .L_init = tp.L_init, .L_local = tp.L_local, .kern = &e->kern,
                          .mem = &e->mem, .n_threads = hkv_threads_count(e->threads)};
    int64_t keep = 0;
    for (int pass = 0; pass < 2; pass++) {
        const long long *cs = pass ? o->task_ctx : o->ctx;
        int n = pass ? o->n_task_ctx : o->n_ctx;
        for (int i = 0; i < n; i++)
            for (int c = 0; c < r->n_cfg; c++) {
                hkv_policy_args a;
                int64_t b;
                env.n_ctx = cs[i];
                if (!r->cfg[c].def->queries_wanted) continue;
                int rc = hkv_config_resolve(&r->cfg[c], cs[i], cs[i], &a, &b, NULL, 0, err);
                if (rc) return rc;
                int64_t w = r->cfg[c].def->queries_wanted(&a, &env);
                keep = w > keep ? w : keep;
            }
    }
    tp.keep_queries = keep;
    tp.audit = 1;
    tp.audit_k = 1;
    hkv_kv kv;
    int rc = hkv_kv_tiered_create(&kv, &env.shape, 2, &tp, &e->kern, &e->mem, err);
    if (rc) return rc;
    hkv_engine_set_kv(e, kv);
    e->p.tiered = tp;
    /* far=q8 configurations run on a second cache, the same but for its
     * 8-bit far tier: their prompt is prefilled there (eval_fidelity.c) */
    int q8 = 0;
    for (int c = 0; c < r->n_cfg; c++) q8 |= r->cfg[c].far_q8;
    if (q8 && o->tasks)
        return hkv_seterr(err, HKV_E_INVAL, "far=q8 configurations are measured by fidelity only: "
                          "add --tasks none");
    tp.far_q8 = 1;
    return q8 ? hkv_kv_tiered_create(&r->kv8, &env.shape, 2, &tp, &e->kern, &e->mem, err) : HKV_OK;
}

/* A part's rows to the --out FILE.jsonl (nothing without one). */
static int append_part(eval_resume *rs, const eval_run *r, const char *model, const char *sweep,
                       const eval_fid *fid, int n_fid, const eval_task_result *t, int n_t,
                       hkv_err *err) {
    if (!rs->f) return HKV_OK;
    json_t *rows = eval_rows(r, model, sweep, fid, n_fid, t, n_t);
    int rc = rows ? eval_resume_append(rs, rows, err) : hkv_seterr(err, HKV_E_NOMEM, "no memory for the rows");
    json_decref(rows);
    return rc;
}

int hkv_cmd_eval(int argc, char **argv) {
    hkv_err err;
    hkv_err_clear(&err);
    eval_opts o;
    hkv_kv_cli kc;
    hkv_kv_cli_init(&kc);
    hkv_config cfg[HKV_MAX_CONFIGS + 1];   /* [0]: room for an implicit full reference */
    eval_run r = {0};
    eval_corpus corpus = {0};
    eval_fid *fid = NULL;
    eval_task_result *tasks = NULL;
    int n_fid = 0, n_tasks = 0;
    eval_resume rs = {0};   /* --out FILE.jsonl */
    char sweep[17] = "";
    double t_start = hkv_now();
    int rc = parse_opts(argc, argv, &o, &kc, &err);
    if (rc == 1) return 0;
    if (!rc) rc = hkv_configs_parse(o.configs, cfg + 1, &r.n_cfg, HKV_MAX_CONFIGS - 1, &err);
    if (!rc && o.budgets)
        rc = hkv_configs_cross_budgets(cfg + 1, &r.n_cfg, HKV_MAX_CONFIGS - 1, o.budgets, &err);
    if (rc) {
        hkv_err_report(&err, stderr);
        return 2;
    }
    /* full is the reference of every comparison and the ceiling of every task. */
    r.cfg = cfg + 1;
    int has_full = 0;
    for (int i = 0; i < r.n_cfg; i++) has_full |= r.cfg[i].def == &hkv_policy_full && !r.cfg[i].far_q8;
    if (!has_full) {
        int n = 0;
        hkv_configs_parse("full", cfg, &n, 1, &err);
        r.cfg = cfg;
        r.n_cfg++;
    }
    r.cont = o.cont;
    r.trials = (int)o.trials;
    r.answer_tokens = (int)o.answer_tokens;
    r.prefix_chunk = o.prefix_chunk;
    r.seed = (uint64_t)o.seed;
    hkv_rows_date(r.date, sizeof r.date);
    r.verbose = !o.quiet;
    if ((rc = eval_corpus_check(o.corpus, &err))) goto out;

    hkv_engine_params ep;
    hkv_engine_params_default(&ep);
    ep.model_path = o.model;
    ep.n_threads = (int)o.x.threads;
    ep.isa = o.x.isa;
    ep.max_seqs = 2;
    for (int i = 0; i < o.n_ctx; i++) ep.n_ctx = o.ctx[i] > ep.n_ctx ? o.ctx[i] : ep.n_ctx;
    for (int i = 0; i < o.n_task_ctx; i++) ep.n_ctx = o.task_ctx[i] > ep.n_ctx ? o.task_ctx[i] : ep.n_ctx;
    if ((rc = hkv_kv_cli_apply(&kc, &ep, &err))) goto out;
    for (int c = 0; c < r.n_cfg; c++)   /* speckv and specpc run the draft model */
        if (!ep.draft_path && (r.cfg[c].def->prep == HKV_PREP_LOOKAHEAD_DRAFT ||
                               r.cfg[c].def->prep == HKV_PREP_COMPRESS_DRAFT)) {
            rc = hkv_seterr(&err, HKV_E_INVAL, "configuration '%s' needs --draft MODEL (a GGUF "
                            "model sharing the target's tokenizer; the target itself will do)",
                            r.cfg[c].def->name);
            goto out;
        }
    if ((rc = hkv_engine_open(&r.e, &ep, &err))) goto out;
    const int near = ep.tiered.L_init + ep.tiered.L_local;
    if ((rc = check_plan(&o, &r, near, r.e->model.cfg.ctx_train, &err))) goto out;
    if ((rc = setup_kv(&r, &o, &err))) goto out;
    if ((rc = eval_corpus_load(&corpus, o.corpus, r.e->tok, &err))) goto out;
    r.corpus = &corpus;
    /* Fidelity reads ctx + 1 tokens; a task haystack fewer than ctx, from an
     * offset drawn in what is left, so ask for ctx + 1024. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < (pass ? o.n_task_ctx : o.n_ctx); i++) {
            long long need = pass ? o.task_ctx[i] + 1024 : o.ctx[i] + 1;
            if (corpus.n_tok < need) {
                rc = hkv_seterr(&err, HKV_E_RANGE, "the corpus (%s) has %lld tokens; %s at context "
                                "%lld needs %lld corpus tokens", corpus.sources, (long long)corpus.n_tok,
                                pass ? "the tasks" : "fidelity", pass ? o.task_ctx[i] : o.ctx[i], need);
                goto out;
            }
        }
    r.logits = malloc((size_t)r.e->model.cfg.vocab * sizeof *r.logits);
    fid = calloc((size_t)o.n_ctx + 1, sizeof *fid);
    tasks = calloc((size_t)EVAL_N_TASKS * o.n_task_ctx + 1, sizeof *tasks);
    if (!r.logits || !fid || !tasks) {
        rc = hkv_seterr(&err, HKV_E_NOMEM, "no memory for the results");
        goto out;
    }
    FILE *tab = o.of.json || o.of.rows_fmt ? stderr : stdout;
    /* the sweep's fingerprint: what decides its results (not threads or time) */
    char num[8][32];
    snprintf(num[0], 32, "%lld", o.cont), snprintf(num[1], 32, "%lld", o.trials);
    snprintf(num[2], 32, "%lld", o.answer_tokens), snprintf(num[3], 32, "%lld", o.seed);
    snprintf(num[4], 32, "%d", ep.tiered.L_init), snprintf(num[5], 32, "%d", ep.tiered.L_local);
    snprintf(num[6], 32, "%s", o.budgets ? o.budgets : "");
    snprintf(num[7], 32, "%d", ep.precision);
    const char *parts[] = {o.model, o.configs, corpus.sources, num[0], num[1], num[2], num[3],
                           num[4], num[5], num[6], num[7]};
    eval_sweep_id(sweep, parts, (int)(sizeof parts / sizeof *parts));
    const size_t ol = o.out ? strlen(o.out) : 0;
    if (ol > 6 && !strcmp(o.out + ol - 6, ".jsonl")) {
        if ((rc = eval_resume_open(&rs, o.out, sweep, &err))) goto out;
        if (r.verbose && json_array_size(rs.old))
            fprintf(stderr, "eval: %zu rows of this sweep in %s: their parts are skipped\n",
                    json_array_size(rs.old), o.out);
    }
    if (r.verbose)
        fprintf(stderr, "eval: %s, %d threads, corpus %s (%lld tokens), sink %d + local %d, %d "
                "configurations, keeping %lld prompt queries\n", r.e->model.cfg.name,
                hkv_threads_count(r.e->threads), corpus.sources, (long long)corpus.n_tok,
                ep.tiered.L_init, ep.tiered.L_local, r.n_cfg, (long long)r.e->p.tiered.keep_queries);
    /* progress: each prefill's, and the sweep's (its parts weighted by context) */
    hkv_progress pg, sweep_pg;
    hkv_progress_init(&pg, "prefill", "tokens");
    hkv_progress_init(&sweep_pg, "eval sweep", NULL);   /* parts weighted by their context */
    if (r.verbose) r.e->prefill_progress = hkv_progress_prefill, r.e->prefill_progress_ud = &pg;
    double work = 0, done = 0;
    for (int i = 0; i < o.n_ctx; i++) work += (double)o.ctx[i];
    for (int i = 0; i < o.n_task_ctx; i++)
        for (int k = 0; k < EVAL_N_TASKS; k++) work += (o.tasks & (1 << k)) ? (double)o.task_ctx[i] : 0;
    for (int i = 0; i < o.n_ctx; i++) {
        if (eval_resume_done(&rs, "fidelity", o.ctx[i])) {   /* in the rows file: not this run's work */
            work -= (double)o.ctx[i];
            continue;
        }
        done += (double)o.ctx[i];
        if ((rc = eval_fidelity(&r, o.ctx[i], &fid[n_fid], &err))) goto out;
        eval_print_fidelity(tab, &fid[n_fid]);
        fflush(tab);
        if ((rc = append_part(&rs, &r, o.model, sweep, &fid[n_fid], 1, NULL, 0, &err))) goto out;
        n_fid++;
        if (r.verbose) hkv_progress_update(&sweep_pg, done, work, hkv_now() - t_start);
    }
    for (int i = 0; i < o.n_task_ctx; i++)
        for (int k = 0; k < EVAL_N_TASKS; k++) {
            if (!(o.tasks & (1 << k))) continue;
            if (eval_resume_done(&rs, eval_task_names[k], o.task_ctx[i])) {
                work -= (double)o.task_ctx[i];
                continue;
            }
            done += (double)o.task_ctx[i];
            rc = eval_task(&r, k, o.task_ctx[i], &tasks[n_tasks], &err);
            n_tasks++;
            if (rc) goto out;
            if ((rc = append_part(&rs, &r, o.model, sweep, NULL, 0, &tasks[n_tasks - 1], 1, &err)))
                goto out;
            if (r.verbose) hkv_progress_update(&sweep_pg, done, work, hkv_now() - t_start);
        }
    r.e->prefill_progress = NULL;
    eval_print_tasks(tab, tasks, n_tasks);
    eval_print_memory(tab, &r.e->mem);
    double t_total = hkv_now() - t_start;
    fprintf(tab, "\ntotal %.1f s\n", t_total);
    int jbad = 0;   /* one tree for stdout and --out FILE */
    json_t *ej = o.of.json || (o.out && !rs.f) ? eval_json(&r, o.model, fid, n_fid, tasks, n_tasks,
                                                        t_total, &jbad) : NULL;
    if (o.of.json) rc = hkv_json_emit(stdout, json_incref(ej), jbad, &err);
    if (!rc && o.of.rows_fmt) {   /* a resumed sweep's: the file's rows, then this run's */
        json_t *rows = eval_rows(&r, o.model, sweep, fid, n_fid, tasks, n_tasks);
        json_t *all = rs.old ? json_deep_copy(rs.old) : json_array();
        rc = rows && all && !json_array_extend(all, rows)
                 ? hkv_rows_write(stdout, o.of.rows_fmt, all, &err)
                 : hkv_seterr(&err, HKV_E_NOMEM, "no memory for the rows");
        json_decref(rows);
        json_decref(all);
    }
    if (!rc && o.out && !rs.f) {
        FILE *f = fopen(o.out, "w");
        if (!f) {
            rc = hkv_seterr(&err, HKV_E_IO, "cannot write '%s'", o.out);
        } else {
            rc = hkv_json_emit(f, json_incref(ej), jbad, &err);
            if (fclose(f) && !rc) rc = hkv_seterr(&err, HKV_E_IO, "cannot write '%s'", o.out);
        }
    }
    json_decref(ej);
out:
    if (rc) hkv_err_report(&err, stderr);
    eval_resume_close(&rs);
    for (int i = 0; i < n_tasks; i++) eval_task_result_free(&tasks[i]);
    free(tasks);
    free(fid);
    free(r.logits);
    eval_corpus_free(&corpus);
    if (r.kv8.ops) r.kv8.ops->destroy(r.kv8.self);   /* (before the engine: its memory account) */
    hkv_engine_close(r.e);
    return rc ? 1 : 0;
}
