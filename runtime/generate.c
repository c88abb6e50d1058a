#include "generate.h"

#include <stdlib.h>
#include <string.h>

#include "lookahead.h"
#include "tsp_prefill.h"

int hkv_prefill_chunk(hkv_engine *e, int seq, const int32_t *prompt, int64_t n, int64_t pos0,
                      int64_t done, int64_t chunk, float *last_logits, hkv_err *err) {
    if (done < 0 || chunk < 1 || done + chunk > n || chunk > e->max_rows)
        return hkv_seterr(err, HKV_E_INVAL, "prefill chunk [%lld, %lld) of a %lld-token prompt "
                          "(at most %d rows a call)", (long long)done, (long long)(done + chunk),
                          (long long)n, e->max_rows);
    hkv_seg sg = {.seq = seq, .n = (int32_t)chunk, .pos = pos0 + done, .row = 0,
                  .flags = HKV_SEG_PROMPT | (done + chunk == n ? HKV_SEG_PROMPT_END : 0)};
    int64_t last = chunk - 1;
    int want = last_logits && done + chunk == n;
    return hkv_forward(e, prompt + done, chunk, &sg, 1, &last, want, last_logits, err);
}

int hkv_prefill(hkv_engine *e, int seq, const int32_t *prompt, int64_t n, int64_t pos0,
                float *last_logits, hkv_err *err) {
    /* A propagating policy (fastkv) takes a sequence's first prompt; later
     * turns of the conversation prefill normally. */
    if (pos0 == 0 && hkv_tsp_wanted(e, seq, n))
        return hkv_tsp_prefill(e, seq, prompt, n, last_logits, err);
    const double t0 = e->prefill_progress ? hkv_now() : 0;
    for (int64_t done = 0; done < n;) {
        int64_t chunk = n - done < e->max_rows ? n - done : e->max_rows;
        int rc = hkv_prefill_chunk(e, seq, prompt, n, pos0, done, chunk, last_logits, err);
        if (rc) return rc;
        done += chunk;
        if (e->prefill_progress && e->prefill_progress(e->prefill_progress_ud, done, n, hkv_now() - t0))
            return hkv_seterr(err, HKV_E_CANCELLED, "prefill stopped after %lld of %lld prompt tokens",
                              (long long)done, (long long)n);
    }
    return HKV_OK;
}

int hkv_gen_stop_after(const hkv_engine *e, int stop_at_eog, int32_t tok, int n_out,
                       int n_predict) {
    if (stop_at_eog && hkv_tokenizer_is_eog(e->tok, tok)) return HKV_STOP_EOG;
    return n_out >= n_predict ? HKV_STOP_LENGTH : HKV_STOP_NONE;
}

/* The caller's callback asked to stop: every unfinished request ends as cancelled. */
static int cancelled(hkv_gen_request *reqs, int n_reqs, hkv_err *err) {
    int64_t n = 0;
    for (int i = 0; i < n_reqs; i++) {
        if (reqs[i].stop == HKV_STOP_NONE) reqs[i].stop = HKV_STOP_CANCEL;
        n += reqs[i].n_out;
    }
    return hkv_seterr(err, HKV_E_CANCELLED, "generation stopped after %lld tokens", (long long)n);
}

int hkv_generate(hkv_engine *e, hkv_gen_request *reqs, int n_reqs, hkv_token_cb cb, void *ud,
                 hkv_gen_stats *st, hkv_err *err) {
    memset(st, 0, sizeof *st);
    if (n_reqs < 1 || n_reqs > e->p.max_seqs)
        return hkv_seterr(err, HKV_E_CAPACITY, "batch of %d sequences does not fit: the engine "
                          "was opened for %d", n_reqs, e->p.max_seqs);
    const int V = e->model.cfg.vocab;
    for (int i = 0; i < n_reqs; i++) {
        hkv_gen_request *r = &reqs[i];
        r->n_out = 0;
        r->stop = HKV_STOP_NONE;
        if (r->n_prompt < 1) return hkv_seterr(err, HKV_E_INVAL, "request %d has an empty prompt", i);
        if (r->n_predict < 0 || (r->n_predict > 0 && !r->out))
            return hkv_seterr(err, HKV_E_INVAL, "request %d: bad output buffer", i);
        if (r->n_prompt + r->n_predict > e->p.n_ctx)
            return hkv_seterr(err, HKV_E_CAPACITY, "request %d needs %lld tokens of context "
                              "(prompt %lld + %d to generate); the context is %lld", i,
                              (long long)(r->n_prompt + r->n_predict), (long long)r->n_prompt,
                              r->n_predict, (long long)e->p.n_ctx);
    }
    hkv_sampler *smp = calloc((size_t)n_reqs, sizeof *smp);
    float *logits = malloc((size_t)n_reqs * V * sizeof(float));
    int32_t *toks = malloc((size_t)n_reqs * sizeof(int32_t));
    hkv_seg *segs = malloc((size_t)n_reqs * sizeof(hkv_seg));
    int64_t *lrows = malloc((size_t)n_reqs * sizeof(int64_t));
    int *active = malloc((size_t)n_reqs * sizeof(int));
    /* where each sequence's decode continues: the prompt length, or what a
     * compressing policy (specpc) kept of it */
    int64_t *base = malloc((size_t)n_reqs * sizeof(int64_t));
    int rc = HKV_OK, opened = 0;
    if (!smp || !logits || !toks || !segs || !lrows || !active || !base) {
        rc = hkv_seterr(err, HKV_E_NOMEM, "no memory for a batch of %d", n_reqs);
        goto done;
    }
    for (int i = 0; i < n_reqs; i++)
        if ((rc = hkv_sampler_init(&smp[i], &reqs[i].sp, V, err))) goto done;
    for (; opened < n_reqs; opened++) {
        /* + room for a policy's lookahead tokens (laq, speckv), rewound before decode */
        rc = e->kv.ops->seq_open(e->kv.self, opened,
                                 hkv_prep_prompt_len(e, opened, reqs[opened].n_prompt) +
                                     reqs[opened].n_predict + 1 + hkv_lookahead_room(e, opened),
                                 err);
        if (rc) {
            hkv_err_prefix(err, "admitting sequence %d", opened);
            goto done;
        }
    }

    /* Prefill, one sequence at a time; its last logits give the first token. */
    int n_active = 0;
    for (int i = 0; i < n_reqs; i++) {
        hkv_gen_request *r = &reqs[i];
        double t0 = hkv_now();
        /* the policy's prep (lookahead, draft compression) counts in the TTFT */
        if ((rc = hkv_prefill_prep(e, i, r->prompt, r->n_prompt, logits,
                                   r->n_predict + 1 + hkv_lookahead_room(e, i), r->n_predict,
                                   &base[i], err)))
            goto done;
        st->t_prefill += hkv_now() - t0;
        st->n_prefill_tokens += r->n_prompt;
        if (r->n_predict == 0) {
            r->stop = HKV_STOP_LENGTH;
            continue;
        }
        int32_t t = hkv_sample(&smp[i], logits);
        r->t_first_token = hkv_now() - t0;
        r->out[r->n_out++] = t;
        const int cancel = cb && cb(ud, i, t);
        if (!(r->stop = hkv_gen_stop_after(e, r->stop_at_eog, t, r->n_out, r->n_predict)))
            active[n_active++] = i;
        if (cancel) {
            rc = cancelled(reqs, n_reqs, err);
            goto done;
        }
    }

    /* Decode: every active sequence advances one token per step. */
    double t0 = hkv_now();
    int cancel = 0;
    while (n_active > 0) {
        for (int a = 0; a < n_active; a++) {
            hkv_gen_request *r = &reqs[active[a]];
            toks[a] = r->out[r->n_out - 1];
            segs[a] = (hkv_seg){.seq = active[a], .n = 1,
                                .pos = base[active[a]] + r->n_out - 1, .row = a};
            lrows[a] = a;
        }
        if ((rc = hkv_forward(e, toks, n_active, segs, n_active, lrows, n_active, logits, err)))
            break;
        st->decode_steps++;
        st->n_decode_tokens += n_active;
        int still = 0;
        for (int a = 0; a < n_active; a++) {
            int i = active[a];
            hkv_gen_request *r = &reqs[i];
            int32_t t = hkv_sample(&smp[i], logits + (size_t)a * V);
            r->out[r->n_out++] = t;
            cancel |= cb && cb(ud, i, t);
            if (!(r->stop = hkv_gen_stop_after(e, r->stop_at_eog, t, r->n_out, r->n_predict)))
                active[still++] = i;
        }
        n_active = still;
        if (cancel) {   /* the step's tokens all delivered first */
            rc = cancelled(reqs, n_reqs, err);
            break;
        }
    }
    st->t_decode = hkv_now() - t0;
done:
    for (int i = 0; i < opened; i++) e->kv.ops->seq_close(e->kv.self, i);
    if (smp)
        for (int i = 0; i < n_reqs; i++) hkv_sampler_free(&smp[i]);
    free(smp);
    free(logits);
    free(toks);
    free(segs);
    free(lrows);
    free(active);
    free(base);
    return rc;
}
