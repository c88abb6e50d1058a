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

static void js(FILE *f, const char *s) { hkv_json_str(f, s, strlen(s)); }

static void json_fid(FILE *f, const eval_fid *x) {
    fprintf(f, "{\"ctx\":%lld,\"prompt_tokens\":%lld,\"cont_tokens\":%lld,\"prefill_s\":%.3f,\"configs\":[",
            (long long)x->ctx, (long long)x->n_prompt, (long long)x->n_cont, x->t_prefill);
    for (int i = 0; i < x->n_rows; i++) {
        const eval_fid_row *w = &x->rows[i];
        fprintf(f, "%s{\"label\":", i ? "," : "");
        js(f, w->label);
        fprintf(f, ",\"describe\":");
        js(f, w->describe);
        fprintf(f, ",\"budget\":%lld,\"recall\":%.6f,\"rel_err\":%.6g,\"kl\":%.6g,\"kl_max\":%.6g,"
                "\"greedy_agree\":%.6f,\"nll\":%.6f,\"attended_per_step\":%.2f,\"far_tokens\":%.2f,"
                "\"ms_per_token_audited\":%.3f,\"fork_index_s\":%.3f,\"index_bytes\":%lld}",
                (long long)w->budget, w->recall, w->rel_err, w->kl, w->kl_max, w->agree, w->nll,
                w->attended, w->far, w->ms_tok, w->t_index, (long long)w->index_bytes);
    }
    fprintf(f, "]}");
}

static void json_task(FILE *f, const eval_task_result *t) {
    fprintf(f, "{\"task\":\"%s\",\"ctx\":%lld,\"trials\":%d,\"configs\":[", eval_task_names[t->task],
            (long long)t->ctx, t->n_trials);
    for (int i = 0; i < t->n_rows; i++) {
        const eval_task_row *w = &t->rows[i];
        fprintf(f, "%s{\"label\":", i ? "," : "");
        js(f, w->label);
        fprintf(f, ",\"budget\":%lld,\"correct\":%d,\"questions\":%d,\"accuracy\":%.4f,"
                "\"turn_correct\":[%d,%d,%d],\"decode_tokens\":%lld,\"ms_per_token\":%.3f}",
                (long long)w->budget, w->correct, w->total, w->total ? (double)w->correct / w->total : 0,
                w->turn_correct[0], w->turn_correct[1], w->turn_correct[2], (long long)w->n_decode,
                w->n_decode ? 1e3 * w->t_decode / w->n_decode : 0.0);
    }
    fprintf(f, "],\"trial_log\":[");
    for (int k = 0; k < t->n_trials; k++) {
        const eval_trial *tr = &t->trials[k];
        fprintf(f, "%s{\"prompt_tokens\":%lld,\"haystack_offset\":%lld,\"haystack_tokens\":%lld,"
                "\"prefill_s\":%.3f,\"needles\":[", k ? "," : "", (long long)tr->n_prompt,
                (long long)tr->hay_offset, (long long)tr->n_haystack, tr->t_prefill);
        for (int j = 0; j < tr->n_needles; j++) {
            fprintf(f, "%s{\"key\":", j ? "," : "");
            js(f, tr->key[j]);
            fprintf(f, ",\"value\":\"%s\",\"depth\":%.4f}", tr->value[j], tr->depth[j]);
        }
        fprintf(f, "],\"asked\":[");
        for (int j = 0; j < tr->n_turns; j++) fprintf(f, "%s%d", j ? "," : "", tr->ask[j]);
        fprintf(f, "],\"answers\":[");
        for (int i = 0; i < t->n_rows; i++) {
            fprintf(f, "%s[", i ? "," : "");
            for (int j = 0; j < tr->n_turns; j++) {
                fprintf(f, "%s{\"ok\":%s,\"text\":", j ? "," : "", tr->ok[i][j] ? "true" : "false");
                js(f, tr->answer[i][j]);
                fputc('}', f);
            }
            fputc(']', f);
        }
        fprintf(f, "]}");
    }
    fprintf(f, "]}");
}

void eval_json(FILE *f, const eval_run *r, const char *model, const eval_fid *fid, int n_fid,
               const eval_task_result *tasks, int n_tasks, double t_total) {
    const hkv_engine *e = r->e;
    const hkv_model_config *mc = &e->model.cfg;
    fprintf(f, "{\"model\":");
    js(f, model);
    fprintf(f, ",\"model_name\":");
    js(f, mc->name);
    fprintf(f, ",\"ctx_train\":%d,\"threads\":%d,\"isa\":\"%s\",\"sink\":%d,\"local\":%d,"
            "\"cont\":%lld,\"trials\":%d,\"answer_tokens\":%d,\"seed\":%llu,\"keep_queries\":%lld,",
            mc->ctx_train, hkv_threads_count(e->threads), hkv_isa_name(e->kern.isa),
            e->p.tiered.L_init, e->p.tiered.L_local, (long long)r->cont, r->trials, r->answer_tokens,
            (unsigned long long)r->seed, (long long)e->p.tiered.keep_queries);
    fprintf(f, "\"corpus\":{\"sources\":");
    js(f, r->corpus->sources);
    fprintf(f, ",\"files\":%d,\"bytes\":%zu,\"tokens\":%lld},\"configs\":[", r->corpus->n_files,
            r->corpus->n_bytes, (long long)r->corpus->n_tok);
    for (int i = 0; i < r->n_cfg; i++) {
        fprintf(f, "%s", i ? "," : "");
        js(f, r->cfg[i].spec);
    }
    fprintf(f, "],\"fidelity\":[");
    for (int i = 0; i < n_fid; i++) {
        fprintf(f, "%s", i ? "," : "");
        json_fid(f, &fid[i]);
    }
    fprintf(f, "],\"tasks\":[");
    for (int i = 0; i < n_tasks; i++) {
        fprintf(f, "%s", i ? "," : "");
        json_task(f, &tasks[i]);
    }
    fprintf(f, "],\"memory\":{");
    for (int t = 0; t < HKV_TIER_COUNT; t++)
        fprintf(f, "%s\"%s\":{\"bytes\":%zu,\"peak\":%zu}", t ? "," : "", hkv_tier_name(t),
                e->mem.bytes[t], e->mem.peak[t]);
    fprintf(f, "},\"time_s\":%.2f}\n", t_total);
}
