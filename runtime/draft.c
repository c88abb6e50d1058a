/* The draft engine (draft.h). */
#include "draft.h"

#include <math.h>
#include <string.h>

#include "policy.h"

/* Same vocabulary: size and every token's text. */
static int check_vocab(const hkv_engine *t, const hkv_engine *d, hkv_err *err) {
    int32_t nt = hkv_tokenizer_n_vocab(t->tok), nd = hkv_tokenizer_n_vocab(d->tok);
    if (nt != nd || t->model.cfg.vocab != d->model.cfg.vocab)
        return hkv_seterr(err, HKV_E_INVAL, "the draft's vocabulary has %d tokens (%d logits), the "
                          "target's %d (%d logits): speculative policies pass token ids between "
                          "them, so they must share the tokenizer", nd, d->model.cfg.vocab, nt,
                          t->model.cfg.vocab);
    char a[512], b[512];
    for (int32_t i = 0; i < nt; i++) {
        int la = hkv_token_to_piece(t->tok, i, 1, a, sizeof a);
        int lb = hkv_token_to_piece(d->tok, i, 1, b, sizeof b);
        if (la != lb || (la > 0 && memcmp(a, b, (size_t)la)))
            return hkv_seterr(err, HKV_E_INVAL, "the draft's token %d is '%.*s', the target's '%.*s': "
                              "the models must share the tokenizer", i, lb > 0 ? lb : 0, b,
                              la > 0 ? la : 0, a);
    }
    return HKV_OK;
}

int hkv_draft_open(hkv_engine *e, hkv_err *err) {
    hkv_engine_params p;
    hkv_engine_params_default(&p);
    p.model_path = e->p.draft_path;
    p.n_threads = e->p.n_threads;
    p.isa = e->p.isa;
    p.max_seqs = 1;
    p.n_ctx = e->p.n_ctx;
    p.max_rows = e->p.max_rows;
    p.tiered.policy = &hkv_policy_full;
    hkv_policy_args_init(p.tiered.policy, &p.tiered.args);
    /* SpecPC scores with the draft's last `window` prompt queries (64 by
     * default; more when the command line's specpc asks). */
    p.tiered.keep_queries = 64;
    const hkv_policy_def *tp = e->p.tiered.policy;
    if (!e->p.kv_plain && tp && tp->prep == HKV_PREP_COMPRESS_DRAFT) {
        double w = hkv_policy_arg(tp, &e->p.tiered.args, "window");
        if (w > 64) p.tiered.keep_queries = (int64_t)w;
    }
    int rc = hkv_engine_open(&e->draft, &p, err);
    if (rc) return hkv_err_prefix(err, "draft model '%s'", e->p.draft_path);
    if ((rc = check_vocab(e, e->draft, err))) {
        hkv_engine_close(e->draft);
        e->draft = NULL;
        return hkv_err_prefix(err, "draft model '%s'", e->p.draft_path);
    }
    return HKV_OK;
}
