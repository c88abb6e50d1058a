/* hetkv eval output: readable tables and one JSON object with everything. */
#include <string.h>

#include "eval.h"

void eval_print_fidelity(FILE *f, const eval_fid *x) {
    fprintf(f, "\nfidelity at context %lld: prompt %lld tokens (prefill %.1f s), then %lld tokens "
            "teacher-forced\n", (long long)x->ctx, (long long)x->n_prompt, x->t_prefill,
            (long long)x->n_cont);
    fprintf(f, "%-36s %7s %9s %10s %9s %6s %6s %16s %9s %7s\n", "config", "recall", "rel.err",
            "KL(full|c)", "KL max", "agree", "NLL", "attended/step", "index", "ms/tok*");
    for (int i = 0; i < x->n_rows; i++) {
        const eval_fid_row *w = &x->rows[i];
        char att[32];
        double ctx_now = (double)x->n_prompt + x->n_cont / 2.0;   /* mean context during decode */
        snprintf(att, sizeof att, "%.0f (%.1f%%)", w->attended, 100 * w->attended / ctx_now);
        char ib[32];
        hkv_fmt_bytes((double)w->index_bytes, ib, sizeof ib);
        fprintf(f, "%-36s %7.3f %9.5f %10.6f %9.5f %6.3f %6.3f %16s %9s %7.1f\n", w->label, w->recall,
                w->rel_err, w->kl, w->kl_max, w->agree, w->nll, att, ib, w->ms_tok);
    }
    fprintf(f, "index: kept prompt queries + the policy's index (INDEX tier) of the forked sequence\n"
               "* decode time with the audit on (it also attends densely and ranks every far token)\n");
}

void eval_print_memory(FILE *f, const hkv_mem_account *m) {
    fprintf(f, "\nmemory peak per tier:");
    for (int t = 0; t < HKV_TIER_COUNT; t++) {
        char b[32];
        hkv_fmt_bytes((double)m->peak[t], b, sizeof b);
        fprintf(f, "%s %s %s", t ? "," : "", hkv_tier_name(t), b);
    }
    fputc('\n', f);
}

static void task_title(const eval_task_result *t, char *buf, size_t cap) {
    snprintf(buf, cap, "%s@%lld", eval_task_names[t->task], (long long)t->ctx);
}

void eval_print_tasks(FILE *f, const eval_task_result *t, int n) {
    if (!n) return;
    fprintf(f, "\ntasks: correct answers / questions (%d trials each; multiturn: 3 questions per trial)\n",
            t[0].n_trials);
    fprintf(f, "%-36s", "config");
    for (int k = 0; k < n; k++) {
        char h[48];
        task_title(&t[k], h, sizeof h);
        fprintf(f, " %17s", h);
    }
    fprintf(f, " %7s\n", "ms/tok");   /* audit off: clean decode time */
    for (int i = 0; i < t[0].n_rows; i++) {
        fprintf(f, "%-36s", t[0].rows[i].label);
        double ts = 0;
        int64_t nd = 0;
        for (int k = 0; k < n; k++) {
            const eval_task_row *w = &t[k].rows[i];
            char c[32];
            snprintf(c, sizeof c, "%d/%d", w->correct, w->total);
            fprintf(f, " %17s", c);
            ts += w->t_decode;
            nd += w->n_decode;
        }
        fprintf(f, " %7.1f\n", nd ? 1e3 * ts / nd : 0.0);
    }
    for (int k = 0; k < n; k++) {
        if (t[k].task != EVAL_MULTITURN) continue;
        char h[48];
        task_title(&t[k], h, sizeof h);
        fprintf(f, "%s per turn:", h);
        for (int i = 0; i < t[k].n_rows; i++) {
            fprintf(f, " [%s:", t[k].rows[i].label);
            for (int j = 0; j < EVAL_MAX_TURNS; j++)
                fprintf(f, " %d/%d", t[k].rows[i].turn_correct[j], t[k].n_trials);
            fputc(']', f);
        }
        fputc('\n', f);
    }
}

/* A double as the printf format fmt wrote it (null when not finite). */
#define NUM(o, k, v, fmt) hkv_jset(o, k, hkv_jnum(v, fmt), bad)
#define INT(o, k, v) hkv_jset(o, k, json_integer((json_int_t)(v)), bad)
#define STR(o, k, v) hkv_jset(o, k, hkv_jstr(v), bad)

static json_t *json_fid(const eval_fid *x, int *bad) {
    json_t *o = json_object(), *cf = json_array();
    INT(o, "ctx", x->ctx);
    INT(o, "prompt_tokens", x->n_prompt);
    INT(o, "cont_tokens", x->n_cont);
    NUM(o, "prefill_s", x->t_prefill, "%.3f");
    for (int i = 0; i < x->n_rows; i++) {
        const eval_fid_row *w = &x->rows[i];
        json_t *c = json_object();
        STR(c, "label", w->label);
        STR(c, "describe", w->describe);
        INT(c, "budget", w->budget);
        NUM(c, "recall", w->recall, "%.6f");
        NUM(c, "rel_err", w->rel_err, "%.6g");
        NUM(c, "kl", w->kl, "%.6g");
        NUM(c, "kl_max", w->kl_max, "%.6g");
        NUM(c, "greedy_agree", w->agree, "%.6f");
        NUM(c, "nll", w->nll, "%.6f");
        NUM(c, "attended_per_step", w->attended, "%.2f");
        NUM(c, "far_tokens", w->far, "%.2f");
        NUM(c, "ms_per_token_audited", w->ms_tok, "%.3f");
        NUM(c, "fork_index_s", w->t_index, "%.3f");
        INT(c, "index_bytes", w->index_bytes);
        hkv_jpush(cf, c, bad);
    }
    hkv_jset(o, "configs", cf, bad);
    return o;
}

static json_t *json_trial(const eval_task_result *t, const eval_trial *tr, int *bad) {
    json_t *o = json_object(), *nd = json_array(), *ask = json_array(), *ans = json_array();
    INT(o, "prompt_tokens", tr->n_prompt);
    INT(o, "haystack_offset", tr->hay_offset);
    INT(o, "haystack_tokens", tr->n_haystack);
    NUM(o, "prefill_s", tr->t_prefill, "%.3f");
    for (int j = 0; j < tr->n_needles; j++) {
        json_t *n = json_object();
        STR(n, "key", tr->key[j]);
        STR(n, "value", tr->value[j]);
        NUM(n, "depth", tr->depth[j], "%.4f");
        hkv_jpush(nd, n, bad);
    }
    hkv_jset(o, "needles", nd, bad);
    for (int j = 0; j < tr->n_turns; j++) hkv_jpush(ask, json_integer(tr->ask[j]), bad);
    hkv_jset(o, "asked", ask, bad);
    for (int i = 0; i < t->n_rows; i++) {   /* [config][turn] */
        json_t *per = json_array();
        for (int j = 0; j < tr->n_turns; j++) {
            json_t *a = json_object();
            hkv_jset(a, "ok", json_boolean(tr->ok[i][j]), bad);
            STR(a, "text", tr->answer[i][j]);
            hkv_jpush(per, a, bad);
        }
        hkv_jpush(ans, per, bad);
    }
    hkv_jset(o, "answers", ans, bad);
    return o;
}

static json_t *json_task(const eval_task_result *t, int *bad) {
    json_t *o = json_object(), *cf = json_array(), *log = json_array();
    hkv_jset(o, "task", json_string(eval_task_names[t->task]), bad);
    INT(o, "ctx", t->ctx);
    INT(o, "trials", t->n_trials);
    for (int i = 0; i < t->n_rows; i++) {
        const eval_task_row *w = &t->rows[i];
        json_t *c = json_object(), *tc = json_array();
        STR(c, "label", w->label);
        INT(c, "budget", w->budget);
        INT(c, "correct", w->correct);
        INT(c, "questions", w->total);
        NUM(c, "accuracy", w->total ? (double)w->correct / w->total : 0, "%.4f");
        for (int j = 0; j < 3; j++) hkv_jpush(tc, json_integer(w->turn_correct[j]), bad);
        hkv_jset(c, "turn_correct", tc, bad);
        INT(c, "decode_tokens", w->n_decode);
        NUM(c, "ms_per_token", w->n_decode ? 1e3 * w->t_decode / w->n_decode : 0.0, "%.3f");
        hkv_jpush(cf, c, bad);
    }
    hkv_jset(o, "configs", cf, bad);
    for (int k = 0; k < t->n_trials; k++) hkv_jpush(log, json_trial(t, &t->trials[k], bad), bad);
    hkv_jset(o, "trial_log", log, bad);
    return o;
}

json_t *eval_json(const eval_run *r, const char *model, const eval_fid *fid, int n_fid,
                  const eval_task_result *tasks, int n_tasks, double t_total, int *bad) {
    const hkv_engine *e = r->e;
    const hkv_model_config *mc = &e->model.cfg;
    json_t *o = json_object();
    STR(o, "model", model);
    STR(o, "model_name", mc->name);
    INT(o, "ctx_train", mc->ctx_train);
    INT(o, "threads", hkv_threads_count(e->threads));
    hkv_jset(o, "isa", json_string(hkv_isa_name(e->kern.isa)), bad);
    INT(o, "sink", e->p.tiered.L_init);
    INT(o, "local", e->p.tiered.L_local);
    INT(o, "cont", r->cont);
    INT(o, "trials", r->trials);
    INT(o, "answer_tokens", r->answer_tokens);
    INT(o, "seed", r->seed);   /* --seed is at most 2^62: a signed integer holds it */
    INT(o, "keep_queries", e->p.tiered.keep_queries);
    json_t *co = json_object();
    STR(co, "sources", r->corpus->sources);
    INT(co, "files", r->corpus->n_files);
    INT(co, "bytes", r->corpus->n_bytes);
    INT(co, "tokens", r->corpus->n_tok);
    hkv_jset(o, "corpus", co, bad);
    json_t *cf = json_array(), *fa = json_array(), *ta = json_array();
    for (int i = 0; i < r->n_cfg; i++) hkv_jpush(cf, hkv_jstr(r->cfg[i].spec), bad);
    hkv_jset(o, "configs", cf, bad);
    for (int i = 0; i < n_fid; i++) hkv_jpush(fa, json_fid(&fid[i], bad), bad);
    hkv_jset(o, "fidelity", fa, bad);
    for (int i = 0; i < n_tasks; i++) hkv_jpush(ta, json_task(&tasks[i], bad), bad);
    hkv_jset(o, "tasks", ta, bad);
    json_t *mem = json_object();
    for (int t = 0; t < HKV_TIER_COUNT; t++) {
        json_t *m = json_object();
        INT(m, "bytes", e->mem.bytes[t]);
        INT(m, "peak", e->mem.peak[t]);
        hkv_jset(mem, hkv_tier_name(t), m, bad);
    }
    hkv_jset(o, "memory", mem, bad);
    NUM(o, "time_s", t_total, "%.2f");
    return o;
}
