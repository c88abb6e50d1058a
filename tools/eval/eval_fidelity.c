/* Fidelity: how far each configuration's decode drifts from dense attention
 * on real text.
 *
 * The prompt (the corpus's first ctx - cont tokens) is prefilled once into
 * sequence 0. Each configuration forks it into sequence 1, builds its index
 * from the kept prompt queries, and decodes the next `cont` corpus tokens
 * teacher-forced, so every configuration sees the same inputs and the
 * per-step outputs are comparable position by position. `full` runs first
 * and its next-token distributions are the reference for KL and greedy
 * agreement. The cache's audit adds, per step, layer and KV head, the
 * recall of the oracle's top-budget far tokens and the relative error of
 * the attention output against dense attention over everything. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"
#include "kv_tiered.h"

/* Natural-log softmax of x into lp; returns nothing, sums in double. */
static void log_softmax(const float *x, int n, float *lp) {
    float m = x[0];
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)x[i] - m);
    const double ls = m + log(s);
    for (int i = 0; i < n; i++) lp[i] = (float)((double)x[i] - ls);
}

static double kl_div(const float *ref, const float *lp, int n) {
    double kl = 0;
    for (int i = 0; i < n; i++) {
        double p = exp((double)ref[i]);
        if (p > 0) kl += p * ((double)ref[i] - lp[i]);
    }
    return kl > 0 ? kl : 0;   /* rounding can leave -1e-9 */
}

/* The reference first: full over the fp16 far tier (far=q8 rows are
 * measured against it, full:far=q8 among them). */
static int is_ref_cfg(const hkv_config *c) { return c->def == &hkv_policy_full && !c->far_q8; }

static int full_first(const eval_run *r, int *order) {
    int k = 0;
    for (int i = 0; i < r->n_cfg; i++)
        if (is_ref_cfg(&r->cfg[i])) order[k++] = i;
    if (!k) return -1;
    for (int i = 0; i < r->n_cfg; i++)
        if (!is_ref_cfg(&r->cfg[i])) order[k++] = i;
    return 0;
}

/* The engine's cache swapped with the 8-bit one (r->kv8) or back; the first
 * time, the prompt prefilled into the 8-bit cache's sequence 0 (its prompt
 * attention reads the 8-bit rows, as a run with --far-kv q8 does) and its
 * logits into first8. *first then holds the logits of the cache in use. */
static int swap_far(eval_run *r, int64_t ctx, int64_t Lp, float *first, float *first8, int *ready,
                    int *on, hkv_err *err) {
    hkv_engine *e = r->e;
    const size_t vb = (size_t)e->model.cfg.vocab * sizeof *first;
    hkv_kv t = e->kv;
    e->kv = r->kv8, r->kv8 = t;
    *on = !*on;
    float tmp;
    for (size_t i = 0; i < vb / sizeof tmp; i++) tmp = first[i], first[i] = first8[i], first8[i] = tmp;
    if (*ready || !*on) return HKV_OK;
    *ready = 1;
    const hkv_kv_ops *ops = e->kv.ops;
    ops->seq_close(e->kv.self, 1);
    ops->seq_close(e->kv.self, 0);
    int rc = ops->seq_open(e->kv.self, 0, ctx, err);
    if (r->verbose) fprintf(stderr, "eval: fidelity at %lld: prefill %lld tokens over the 8-bit far "
                            "tier...\n", (long long)ctx, (long long)Lp);
    return rc ? rc : hkv_prefill(e, 0, r->corpus->tok, Lp, 0, first, err);
}

int eval_fidelity(eval_run *r, int64_t ctx, eval_fid *out, hkv_err *err) {
    hkv_engine *e = r->e;
    const hkv_model_config *mc = &e->model.cfg;
    const hkv_kv_ops *ops = e->kv.ops;
    const int V = mc->vocab, g = mc->n_head / mc->n_head_kv;
    const int near = e->p.tiered.L_init + e->p.tiered.L_local;
    const int64_t T = r->cont, Lp = ctx - T;
    memset(out, 0, sizeof *out);
    out->ctx = ctx;
    out->n_prompt = Lp;
    out->n_cont = T;
    if (r->corpus->n_tok < ctx + 1)
        return hkv_seterr(err, HKV_E_RANGE, "fidelity at context %lld needs %lld corpus tokens; the "
                          "corpus has %lld", (long long)ctx, (long long)ctx + 1,
                          (long long)r->corpus->n_tok);
    int order[HKV_MAX_CONFIGS];
    if (full_first(r, order))
        return hkv_seterr(err, HKV_E_INVAL, "fidelity needs the 'full' configuration as reference");
    const int32_t *tok = r->corpus->tok;
    float *ref = malloc((size_t)T * V * sizeof *ref), *lp = malloc((size_t)V * sizeof *lp);
    float *first = malloc((size_t)V * sizeof *first);   /* the prompt's prefill logits */
    float *first8 = calloc((size_t)V, sizeof *first8);  /* the same over the 8-bit far tier */
    int rc = HKV_OK, q8_on = 0, q8_ready = 0;
    if (!ref || !lp || !first || !first8) {
        rc = hkv_seterr(err, HKV_E_NOMEM, "no memory for %lld x %d reference log-probabilities",
                        (long long)T, V);
        goto out;
    }
    ops->seq_close(e->kv.self, 1);
    ops->seq_close(e->kv.self, 0);
    if ((rc = ops->seq_open(e->kv.self, 0, ctx, err))) goto out;
    if (r->verbose) fprintf(stderr, "eval: fidelity at %lld: prefill %lld tokens...\n", (long long)ctx, (long long)Lp);
    double t0 = hkv_now();
    if ((rc = hkv_prefill(e, 0, tok, Lp, 0, first, err))) goto out;
    out->t_prefill = hkv_now() - t0;
    for (int oi = 0; oi < r->n_cfg; oi++) {
        const int ci = order[oi];
        const hkv_config *c = &r->cfg[ci];
        const int is_ref = oi == 0;
        if (c->far_q8 != q8_on && (rc = swap_far(r, ctx, Lp, first, first8, &q8_ready, &q8_on, err)))
            goto out;
        eval_fid_row *row = &out->rows[ci];
        hkv_policy_args args;
        if ((rc = hkv_config_resolve(c, ctx, Lp - near, &args, &row->budget, row->label,
                                      sizeof row->label, err)))
            goto out;
        /* A policy without a budget is measured against the default share. */
        int64_t audit_k = row->budget ? row->budget : (int64_t)fmax(1, llround(0.03 * ctx));
        double ti = hkv_now();
        if ((rc = eval_fork(r, ctx, c->def, &args, 1, audit_k, &row->index_bytes, err))) goto out;
        int64_t base = Lp;   /* where the fork continues (specpc: its compressed length) */
        memcpy(r->logits, first, (size_t)V * sizeof *first);
        if ((rc = eval_fork_prep(r, tok, Lp, r->logits, 0, &base, err))) goto out;
        if (r->staged) {
            size_t o = strlen(row->label);
            snprintf(row->label + o, sizeof row->label - o, " @chunk %lld", (long long)r->prefix_chunk);
        }
        hkv_kv_tiered_audit_reset(&e->kv, 1);   /* lookahead steps are not decode */
        row->t_index = hkv_now() - ti;
        double t_dec = 0, kl = 0, kl_max = 0, nll = 0;
        int64_t agree = 0;
        for (int64_t s = 0; s < T; s++) {
            hkv_seg sg = {.seq = 1, .n = 1, .pos = base + s, .row = 0, .flags = 0};
            int64_t lr = 0;
            double a = hkv_now();
            if ((rc = hkv_forward(e, &tok[Lp + s], 1, &sg, 1, &lr, 1, r->logits, err))) goto out;
            t_dec += hkv_now() - a;
            float *dst = is_ref ? ref + (size_t)s * V : lp;
            log_softmax(r->logits, V, dst);
            nll -= dst[tok[Lp + s + 1]];
            if (!is_ref) {
                double k = kl_div(ref + (size_t)s * V, lp, V);
                kl += k;
                kl_max = k > kl_max ? k : kl_max;
                agree += hkv_argmax(ref + (size_t)s * V, V) == hkv_argmax(lp, V);
            } else {
                agree++;
            }
        }
        /* After decode, so the line carries the policy's decode statistics. */
        hkv_kv_tiered_describe(&e->kv, 1, row->describe, sizeof row->describe);
        hkv_tiered_audit au;
        hkv_kv_tiered_audit_get(&e->kv, 1, &au);
        double samples = au.n / g;
        row->recall = au.n_recall > 0 ? au.recall_sum / au.n_recall : 1;
        row->rel_err = au.n > 0 ? au.rel_err_sum / au.n : 0;
        row->far = samples > 0 ? au.far_sum / samples : 0;
        row->attended = (samples > 0 ? au.selected_sum / samples : 0) + near;
        row->kl = kl / T;
        row->kl_max = kl_max;
        row->agree = (double)agree / T;
        row->nll = nll / T;
        row->ms_tok = 1e3 * t_dec / T;
        if (r->verbose)
            fprintf(stderr, "eval:   %-34s recall %.3f  KL %.5f  agree %.3f  (%.1f ms/token)\n",
                    row->label, row->recall, row->kl, row->agree, row->ms_tok);
    }
    out->n_rows = r->n_cfg;
out:
    if (q8_on) {   /* back to the fp16 cache */
        hkv_kv t = e->kv;
        e->kv = r->kv8, r->kv8 = t;
    }
    ops->seq_close(e->kv.self, 1);
    ops->seq_close(e->kv.self, 0);
    if (r->kv8.ops) {
        ops->seq_close(r->kv8.self, 1);
        ops->seq_close(r->kv8.self, 0);
    }
    free(ref);
    free(lp);
    free(first);
    free(first8);
    return rc ? hkv_err_prefix(err, "fidelity at context %lld", (long long)ctx) : HKV_OK;
}
