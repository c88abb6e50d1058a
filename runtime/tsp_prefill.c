/* Token-selective propagation prefill. Stage 1: the prompt in chunks of
 * max_rows through layers [0, L_TSP], each chunk's output hidden rows saved;
 * the last chunk ends the prompt in those layers, so the policy builds their
 * KV selections and, at L_TSP, the propagated set. Stage 2: the saved rows
 * of the propagated positions (gathered in place, ascending) through layers
 * (L_TSP, n_layer) in chunks, as segments with a pos_list: RoPE at the
 * original positions, K/V written there, causal attention over the
 * propagated positions only (kv_tiered_tsp.c). The last prompt token is
 * always propagated, so its logits come out of stage 2. */
#include "tsp_prefill.h"

#include <string.h>

#include "kv_far.h"

int hkv_tsp_wanted(hkv_engine *e, int seq, int64_t n) {
    const hkv_policy_def *def = NULL;
    hkv_policy pol = {0};
    if (!hkv_kv_has_far(&e->kv) || hkv_kv_seq_instance(&e->kv, seq, &def, &pol, NULL) ||
        def->prep != HKV_PREP_TSP || !pol.ops || !pol.ops->tsp_layer || !pol.ops->tsp_rows)
        return 0;
    if (e->kv.ops->seq_len(e->kv.self, seq) != 0) return 0;   /* later turns: normal prefill */
    int lt = pol.ops->tsp_layer(pol.self, n);
    return lt >= 0 && lt < e->model.cfg.n_layer - 1;
}

int hkv_tsp_prefill(hkv_engine *e, int seq, const int32_t *prompt, int64_t n, float *last_logits,
                    hkv_err *err) {
    const hkv_policy_def *def = NULL;
    hkv_policy pol = {0};
    int rc = hkv_kv_seq_instance(&e->kv, seq, &def, &pol, err);
    if (rc) return hkv_err_prefix(err, "token-selective prefill");
    if (!hkv_tsp_wanted(e, seq, n))
        return hkv_seterr(err, HKV_E_INVAL, "token-selective prefill of sequence %d: needs an empty "
                          "sequence under a propagating policy and a prompt it cuts (policy '%s')",
                          seq, def->name);
    const int NL = e->model.cfg.n_layer, dim = e->model.cfg.dim;
    const int lt = pol.ops->tsp_layer(pol.self, n);
    const size_t hb = (size_t)n * dim * sizeof(float), pb = (size_t)n * sizeof(int64_t),
                 rb = (size_t)n * sizeof(int32_t);
    float *hid = hkv_host_alloc(&e->mem, HKV_TIER_WORKSPACE, hb, err);
    int64_t *pl = hid ? hkv_host_alloc(&e->mem, HKV_TIER_WORKSPACE, pb, err) : NULL;
    int32_t *rows = pl ? hkv_host_alloc(&e->mem, HKV_TIER_WORKSPACE, rb, err) : NULL;
    if (!rows) {
        rc = hkv_err_prefix(err, "token-selective prefill of %lld tokens", (long long)n);
        goto out;
    }
    double t0 = hkv_now(), mm0 = e->stats.matmul, at0 = e->stats.attn;
    /* Stage 1: every token through layers [0, lt]. */
    for (int64_t done = 0; done < n;) {
        int64_t c = n - done < e->max_rows ? n - done : e->max_rows;
        hkv_seg sg = {.seq = seq, .n = (int32_t)c, .pos = done, .row = 0,
                      .flags = HKV_SEG_PROMPT | (done + c == n ? HKV_SEG_PROMPT_END : 0)};
        if ((rc = hkv_forward_embed(e, prompt + done, c, err)) ||
            (rc = hkv_forward_layers(e, 0, lt + 1, c, &sg, 1, err)))
            goto out;
        if ((rc = e->be.ops->read(e->be.self, HKV_ACT_X, 0, c, dim, hid + (size_t)done * dim, err)))
            goto out;
        done += c;
    }
    /* The propagated set, chosen at the TSP layer's prompt end. */
    int64_t m = pol.ops->tsp_rows(pol.self, rows, n);
    if (m < 0) {
        rc = hkv_seterr(err, (int)m, "policy '%s' gave no propagated set", def->name);
        goto out;
    }
    const int64_t Li = e->p.tiered.L_init, Ll = e->p.tiered.L_local;
    int64_t near_seen = 0;
    for (int64_t i = 0; i < m; i++) {
        if (rows[i] < 0 || rows[i] >= n || (i && rows[i] <= rows[i - 1])) {
            rc = hkv_seterr(err, HKV_E_INTERNAL, "policy '%s': propagated row %lld (position %d) is "
                            "out of order or outside the prompt", def->name, (long long)i, rows[i]);
            goto out;
        }
        if (rows[i] < Li || rows[i] >= n - Ll) near_seen++;
    }
    int64_t near_need = (n < Li ? n : Li) + (n - Li < Ll ? (n - Li > 0 ? n - Li : 0) : Ll);
    if (m < 1 || rows[m - 1] != n - 1 || near_seen != near_need) {
        rc = hkv_seterr(err, HKV_E_INTERNAL, "policy '%s': the propagated set (%lld rows) must hold "
                        "the last token and every position of the near tier", def->name, (long long)m);
        goto out;
    }
    /* Gather the propagated hidden rows to the front, in place (rows[i] >= i). */
    for (int64_t i = 0; i < m; i++) {
        pl[i] = rows[i];
        if (rows[i] != i)
            memcpy(hid + (size_t)i * dim, hid + (size_t)rows[i] * dim, (size_t)dim * sizeof(float));
    }
    /* Stage 2: the propagated rows through the later layers. */
    for (int64_t done = 0; done < m;) {
        int64_t c = m - done < e->max_rows ? m - done : e->max_rows;
        int last = done + c == m;
        hkv_seg sg = {.seq = seq, .n = (int32_t)c, .pos = pl[done], .row = 0, .pos_list = pl + done,
                      .flags = HKV_SEG_PROMPT | (last ? HKV_SEG_PROMPT_END : 0)};
        if ((rc = e->be.ops->write(e->be.self, HKV_ACT_X, 0, c, dim, hid + (size_t)done * dim, err)) ||
            (rc = hkv_forward_layers(e, lt + 1, NL, c, &sg, 1, err))) goto out;
        int64_t lr = c - 1;
        if (last && last_logits && (rc = hkv_forward_head(e, &lr, 1, last_logits, err))) goto out;
        done += c;
    }
    e->stats.other += hkv_now() - t0 - (e->stats.matmul - mm0) - (e->stats.attn - at0);
    e->stats.rows += n;
    e->stats.calls++;
out:
    if (rows) hkv_host_free(&e->mem, HKV_TIER_WORKSPACE, rows, rb);
    if (pl) hkv_host_free(&e->mem, HKV_TIER_WORKSPACE, pl, pb);
    if (hid) hkv_host_free(&e->mem, HKV_TIER_WORKSPACE, hid, hb);
    return rc;
}
