/* Lookahead and draft compression around a prefill (lookahead.h). */
#include "lookahead.h"

#include <stdlib.h>
#include <string.h>

#include "draft.h"
#include "generate.h"
#include "kv_far.h"
#include "sampler.h"
#include "specpc.h"

static hkv_policy_env env_of(const hkv_engine *e) {
    const hkv_model_config *c = &e->model.cfg;
    hkv_policy_env env = {.shape = {c->n_layer, c->n_head, c->n_head_kv, c->head_dim},
                          .n_ctx = e->p.n_ctx, .L_init = e->p.tiered.L_init,
                          .L_local = e->p.tiered.L_local, .kern = &e->kern, .mem = (hkv_mem_account *)&e->mem};
    return env;
}

/* laq: t0 = argmax of the prefill logits, then greedy steps of the target
 * itself under the policy's stage-1 selection; *cnt tokens fed. */
static int look_target(hkv_engine *e, int seq, int64_t n, const float *last_logits, int64_t L,
                       int64_t *cnt, hkv_err *err) {
    const int V = e->model.cfg.vocab;
    float *lg = hkv_host_alloc(&e->mem, HKV_TIER_WORKSPACE, (size_t)V * sizeof(float), err);
    if (!lg) return hkv_err_prefix(err, "lookahead logits");
    int32_t tok = hkv_argmax(last_logits, V);
    int rc = HKV_OK;
    for (*cnt = 0; *cnt < L;) {
        hkv_seg sg = {.seq = seq, .n = 1, .pos = n + *cnt, .row = 0, .flags = 0};
        int64_t lr = 0;
        int want = *cnt + 1 < L;
        if ((rc = hkv_forward(e, &tok, 1, &sg, 1, &lr, want, lg, err))) break;
        ++*cnt;
        if (!want || hkv_tokenizer_is_eog(e->tok, tok)) break;
        tok = hkv_argmax(lg, V);
    }
    hkv_host_free(&e->mem, HKV_TIER_WORKSPACE, lg, (size_t)V * sizeof(float));
    return rc;
}

/* speckv: the draft prefills the prompt and answers greedily (up to L
 * tokens, its EOG included); the target reads the answer as one prompt
 * segment past the prompt, without a prompt end (no policy index is built
 * for it). *cnt tokens read. */
static int look_draft(hkv_engine *e, int seq, const int32_t *prompt, int64_t n, int64_t L,
                      int64_t *cnt, hkv_err *err) {
    hkv_engine *d = e->draft;
    const int V = d->model.cfg.vocab;
    *cnt = 0;
    size_t lb = (size_t)V * sizeof(float), tb = (size_t)L * sizeof(int32_t);
    float *lg = hkv_host_alloc(&d->mem, HKV_TIER_WORKSPACE, lb, err);
    int32_t *ans = lg ? hkv_host_alloc(&d->mem, HKV_TIER_WORKSPACE, tb, err) : NULL;
    int rc = lg && ans ? HKV_OK : HKV_E_NOMEM;
    if (rc) goto out;
    if ((rc = d->kv.ops->seq_open(d->kv.self, 0, n + L + 1, err))) goto out;
    rc = hkv_prefill(d, 0, prompt, n, 0, lg, err);
    int64_t m = 0;
    while (!rc) {
        ans[m] = hkv_argmax(lg, V);
        if (++m >= L || hkv_tokenizer_is_eog(d->tok, ans[m - 1])) break;
        hkv_seg sg = {.seq = 0, .n = 1, .pos = n + m - 1, .row = 0, .flags = 0};
        int64_t lr = 0;
        rc = hkv_forward(d, &ans[m - 1], 1, &sg, 1, &lr, 1, lg, err);
    }
    d->kv.ops->seq_close(d->kv.self, 0);
    if (rc) {
        hkv_err_prefix(err, "draft model");
        goto out;
    }
    for (int64_t done = 0; done < m && !rc;) {
        int64_t c = m - done < e->max_rows ? m - done : e->max_rows;
        hkv_seg sg = {.seq = seq, .n = (int32_t)c, .pos = n + done, .row = 0, .flags = HKV_SEG_PROMPT};
        rc = hkv_forward(e, ans + done, c, &sg, 1, NULL, 0, NULL, err);
        done += c;
    }
    if (!rc) *cnt = m;
out:
    if (ans) hkv_host_free(&d->mem, HKV_TIER_WORKSPACE, ans, tb);
    if (lg) hkv_host_free(&d->mem, HKV_TIER_WORKSPACE, lg, lb);
    return rc;
}

int64_t hkv_prep_prompt_len_of(const hkv_policy_def *def, const hkv_policy_args *args, int64_t n) {
    if (!def || def->prep != HKV_PREP_COMPRESS_DRAFT) return n;
    double C = hkv_policy_arg(def, args, "C");
    return C >= 1 && C < (double)n ? (int64_t)C : n;
}

int64_t hkv_prep_prompt_len(const hkv_engine *e, int seq, int64_t n) {
    hkv_policy_args args;
    const hkv_policy_def *def = hkv_kv_seq_policy(&e->kv, seq, &args);
    return hkv_prep_prompt_len_of(def, &args, n);
}

int64_t hkv_lookahead_room_of(const hkv_engine *e, const hkv_policy_def *def,
                              const hkv_policy_args *args) {
    if (!def || !def->lookahead_len ||
        (def->prep != HKV_PREP_LOOKAHEAD_TARGET && def->prep != HKV_PREP_LOOKAHEAD_DRAFT))
        return 0;
    hkv_policy_env env = env_of(e);
    int64_t L = def->lookahead_len(args, &env);
    return L > 0 ? L : 0;
}

int64_t hkv_lookahead_room(const hkv_engine *e, int seq) {
    hkv_policy_args args;
    const hkv_policy_def *def = hkv_kv_seq_policy(&e->kv, seq, &args);
    return hkv_lookahead_room_of(e, def, &args);
}

int hkv_lookahead(hkv_engine *e, int seq, const int32_t *prompt, int64_t n,
                  const float *last_logits, int64_t room, int64_t max_new, int64_t *n_look,
                  hkv_err *err) {
    if (n_look) *n_look = 0;
    hkv_policy_args args;
    const hkv_policy_def *def = hkv_kv_seq_policy(&e->kv, seq, &args);
    if (!def || (def->prep != HKV_PREP_LOOKAHEAD_TARGET && def->prep != HKV_PREP_LOOKAHEAD_DRAFT))
        return HKV_OK;
    const int draft = def->prep == HKV_PREP_LOOKAHEAD_DRAFT;
    if (draft && !e->draft)
        return hkv_seterr(err, HKV_E_INVAL, "%s needs --draft MODEL (a GGUF model with the target's "
                          "tokenizer; the target itself will do)", def->name);
    if (!last_logits)
        return hkv_seterr(err, HKV_E_INVAL, "%s lookahead: no prefill logits", def->name);
    hkv_policy_env env = env_of(e);
    int64_t L = def->lookahead_len ? def->lookahead_len(&args, &env) : 0;
    if (draft && max_new > 0 && L > max_new) L = max_new;   /* "all": to the output cap */
    if (L > room) L = room;
    if (L < 1) return HKV_OK;   /* no room: the prompt-end selection stays */
    int64_t cnt = 0;
    int rc = draft ? look_draft(e, seq, prompt, n, L, &cnt, err)
                   : look_target(e, seq, n, last_logits, L, &cnt, err);
    int rc2 = e->kv.ops->seq_rewind(e->kv.self, seq, n, err);
    if (!rc) rc = rc2;
    if (!rc && cnt > 0) rc = hkv_kv_lookahead_end(&e->kv, seq, n + cnt, err);
    if (rc) return hkv_err_prefix(err, "%s lookahead of sequence %d", def->name, seq);
    if (n_look) *n_look = cnt;
    return HKV_OK;
}

int hkv_fork_prep(hkv_engine *e, int seq, const int32_t *prompt, int64_t n, float *logits,
                  int64_t max_new, int64_t *base, hkv_err *err) {
    hkv_policy_args a;
    const hkv_policy_def *d = hkv_kv_seq_policy(&e->kv, seq, &a);
    *base = n;
    if (!d || (d->prep != HKV_PREP_LOOKAHEAD_TARGET && d->prep != HKV_PREP_LOOKAHEAD_DRAFT &&
               d->prep != HKV_PREP_COMPRESS_DRAFT))
        return HKV_OK;
    int rc;
    if (d->prep == HKV_PREP_COMPRESS_DRAFT) {   /* the fork holds the uncompressed prompt */
        rc = e->kv.ops->seq_rewind(e->kv.self, seq, 0, err);
        if (!rc) rc = hkv_prefill_prep(e, seq, prompt, n, logits, 0, max_new, base, err);
    } else {
        rc = hkv_lookahead(e, seq, prompt, n, logits, hkv_lookahead_room(e, seq), max_new, NULL, err);
    }
    return rc ? hkv_err_prefix(err, "'%s' on a forked prompt", d->name) : HKV_OK;
}

int hkv_prefill_prep(hkv_engine *e, int seq, const int32_t *prompt, int64_t n, float *last_logits,
                     int64_t room, int64_t max_new, int64_t *n_stored, hkv_err *err) {
    *n_stored = 0;
    hkv_policy_args args;
    const hkv_policy_def *def = hkv_kv_seq_policy(&e->kv, seq, &args);
    int rc;
    if (def && def->prep == HKV_PREP_COMPRESS_DRAFT) {
        const size_t kb = (size_t)n * sizeof(int32_t);
        int32_t *keep = hkv_host_alloc(&e->mem, HKV_TIER_WORKSPACE, kb, err);
        if (!keep) return hkv_err_prefix(err, "specpc: kept positions of %lld prompt tokens", (long long)n);
        int64_t c = 0;
        rc = hkv_specpc_compress(e, def, &args, prompt, n, keep, &c, err);
        for (int64_t i = 0; !rc && i < c; i++) keep[i] = prompt[keep[i]];
        if (!rc) rc = hkv_prefill(e, seq, keep, c, 0, last_logits, err);
        hkv_host_free(&e->mem, HKV_TIER_WORKSPACE, keep, kb);
        if (!rc) *n_stored = c;
        return rc;
    }
    if ((rc = hkv_prefill(e, seq, prompt, n, 0, last_logits, err))) return rc;
    *n_stored = n;
    return hkv_lookahead(e, seq, prompt, n, last_logits, room, max_new, NULL, err);
}
