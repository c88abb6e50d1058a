/* hetkv eval's measured points as flat rows (`hetkv eval -o md|csv|json|jsonl`,
 * cli_rows.c writes them): one row per (fidelity context or task and
 * context, configuration), every row with the same keys in the same order
 * (fidelity figures null on task rows and the other way round), each one
 * self-describing as bench's rows are. Field names: docs/BENCH_ROWS.md. */
#include <string.h>

#include "cli_rows.h"
#include "eval.h"
#include "isa.h"
#include "threads.h"

/* The policy's name: the label's first word ("ctkvr rho_p=61 (3%)"). */
static json_t *policy_of(const char *label)
{
    const size_t n = strcspn(label, " ");
    return json_stringn(label, n);
}

static json_t *num(double v, int present) { return present ? json_real(v) : json_null(); }

/* The keys every row starts with. */
static json_t *row_head(const eval_run *r, const char *model, const char *sweep, const char *kind,
                        const char *label, int64_t budget, int64_t ctx, const char *date)
{
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "model", json_string(r->e->model.cfg.name));
    json_object_set_new(o, "model_file", json_string(model ? model : ""));
    json_object_set_new(o, "kind", json_string(kind));
    json_object_set_new(o, "config", json_string(label));
    json_object_set_new(o, "policy", policy_of(label));
    json_object_set_new(o, "budget", budget > 0 ? json_integer(budget) : json_null());
    json_object_set_new(o, "ctx", json_integer(ctx));
    json_object_set_new(o, "threads", json_integer(hkv_threads_count(r->e->threads)));
    json_object_set_new(o, "isa", json_string(hkv_isa_name(r->e->kern.isa)));
    json_object_set_new(o, "device", json_string("cpu"));
    json_object_set_new(o, "commit", json_string(hkv_build_commit()));
    json_object_set_new(o, "date", json_string(date));
    json_object_set_new(o, "sweep", json_string(sweep));
    return o;
}

/* The measures: fidelity's (f, or NULL) then the task's (t, or NULL). */
static void row_tail(json_t *o, const eval_fid_row *f, const eval_task_row *t)
{
    json_object_set_new(o, "recall", num(f ? f->recall : 0, f && f->recall >= 0));
    json_object_set_new(o, "rel_err", num(f ? f->rel_err : 0, f != NULL));
    json_object_set_new(o, "kl", num(f ? f->kl : 0, f != NULL));
    json_object_set_new(o, "kl_max", num(f ? f->kl_max : 0, f != NULL));
    json_object_set_new(o, "agree", num(f ? f->agree : 0, f != NULL));
    json_object_set_new(o, "nll", num(f ? f->nll : 0, f != NULL));
    json_object_set_new(o, "attended", num(f ? f->attended : 0, f != NULL));
    json_object_set_new(o, "far", num(f ? f->far : 0, f != NULL));
    json_object_set_new(o, "index_bytes", f ? json_integer(f->index_bytes) : json_null());
    const double ms = f ? f->ms_tok : t && t->n_decode > 0 ? 1e3 * t->t_decode / t->n_decode : 0;
    json_object_set_new(o, "ms_per_token", num(ms, f || (t && t->n_decode > 0)));
    json_object_set_new(o, "correct", t ? json_integer(t->correct) : json_null());
    json_object_set_new(o, "total", t ? json_integer(t->total) : json_null());
    json_object_set_new(o, "accuracy",
                        num(t && t->total ? (double)t->correct / t->total : 0, t && t->total > 0));
}

json_t *eval_rows(const eval_run *r, const char *model, const char *sweep, const eval_fid *fid,
                  int n_fid, const eval_task_result *tasks, int n_tasks)
{
    const char *date = r->date;
    json_t *rows = json_array();
    for (int i = 0; rows && i < n_fid; i++)
        for (int c = 0; c < fid[i].n_rows; c++) {
            const eval_fid_row *f = &fid[i].rows[c];
            json_t *o = row_head(r, model, sweep, "fidelity", f->label, f->budget, fid[i].ctx, date);
            if (!o) goto fail;
            row_tail(o, f, NULL);
            if (json_array_append_new(rows, o)) goto fail;
        }
    for (int i = 0; rows && i < n_tasks; i++)
        for (int c = 0; c < tasks[i].n_rows; c++) {
            const eval_task_row *t = &tasks[i].rows[c];
            json_t *o = row_head(r, model, sweep, eval_task_names[tasks[i].task], t->label,
                                 t->budget, tasks[i].ctx, date);
            if (!o) goto fail;
            row_tail(o, NULL, t);
            if (json_array_append_new(rows, o)) goto fail;
        }
    return rows;
fail:
    json_decref(rows);
    return NULL;
}
