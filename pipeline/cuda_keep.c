/* Eviction policies' kept rows on the device (index/policy.h, kept_set):
 * snapkv, fastkv, laq and speckv attend, every decode step, the K/V rows
 * they kept at prompt end plus the far tokens that arrived since. The kept
 * rows are what every step reads and they never change until the policy
 * selects again, so the device keeps a copy of them beside the near tier
 * (the memory plan counts them there, plan/gpu_plan.c) and attends them
 * with the near tier; the host attends only the tokens past the kept set
 * (hkv_recall_rows.far_from), a few per step.
 *
 * Per layer, before the host step:
 *   host  : for each decode row whose policy has a kept set, compare its
 *           version and the sequence's epoch with the copy's; when they
 *           moved (a prompt end, a re-selection, a rewind), gather the kept
 *           rows from the far tier into page-locked staging and upload them;
 *   device: the kept partial of each decode row (flash-decoding over its
 *           rows), merged exactly into the near partial (cuda_attention.c).
 * The arena [sequence][layer][KV head][cap][d] fp16 is grown, stream-
 * ordered, to the largest kept set seen; a growth uploads every copy again. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend_impl.h"
#include "far_rows.h"
#include "kv_far.h"

int cb_keep_create(cuda_be *b, hkv_err *err) {
    cb_keep *k = &b->kp;
    const size_t S = (size_t)b->max_seqs, R = (size_t)b->max_rows;
    if (!(k->ver = calloc(S * b->NL, sizeof *k->ver)) ||
        !(k->epoch = calloc(S * b->NL, sizeof *k->epoch)) ||
        !(k->n = calloc(S * b->NL * b->KH, sizeof *k->n)) ||
        !(k->h_nrows = malloc(S * b->KH * sizeof *k->h_nrows)) ||
        !(k->h_from = malloc(R * b->KH * sizeof *k->h_from)))
        return hkv_seterr(err, HKV_E_NOMEM, "no host memory for the kept rows' tables");
    return hkv_gpu_event_create(&k->stage_ev, err);
}

static void free_arena(cuda_be *b) {
    cb_keep *k = &b->kp;
    const size_t S = (size_t)b->max_seqs;
    hkv_gpu_free_async(b->ctx, HKV_TIER_NEAR, k->k, k->bytes, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_NEAR, k->v, k->bytes, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, k->d_idx, S * b->KH * (size_t)k->cap * 4, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, k->d_nrows, S * b->KH * 4, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, k->d_o, S * (size_t)b->qd * 4, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, k->d_l, S * b->H * 4, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, k->split_ws, k->split_ws_bytes, b->st);
    hkv_pinned_free(&k->h_stage, &b->e->mem, NULL);
    free(k->h_idx);
    k->k = k->v = NULL, k->d_idx = k->d_nrows = k->h_idx = NULL, k->d_o = k->d_l = NULL;
    k->split_ws = NULL;
    k->cap = 0, k->bytes = 0, k->split_ws_bytes = 0, k->split = 0;
}

void cb_keep_destroy(cuda_be *b) {
    cb_keep *k = &b->kp;
    if (k->cap) free_arena(b);
    hkv_gpu_event_destroy(k->stage_ev);
    free(k->ver);
    free(k->epoch);
    free(k->n);
    free(k->h_nrows);
    free(k->h_from);
}

/* Room for cap rows per (sequence, layer, KV head). */
static int ensure_arena(cuda_be *b, int64_t cap, hkv_err *err) {
    cb_keep *k = &b->kp;
    if (cap <= k->cap) return HKV_OK;
    const size_t S = (size_t)b->max_seqs, KH = (size_t)b->KH;
    if ((int64_t)S * b->NL * b->KH * cap >= ((int64_t)1 << 31))
        return hkv_seterr(err, HKV_E_RANGE, "kept sets of %lld rows for %d sequences x %d layers x "
                          "%d KV heads exceed the 32-bit row indices of the device", (long long)cap,
                          b->max_seqs, b->NL, b->KH);
    int rc = HKV_OK;
    if (k->cap) {   /* the device may still read the old arena; the staging too */
        if ((rc = hkv_gpu_sync(b->st, err))) return rc;
        free_arena(b);
    }
    memset(k->ver, 0, S * b->NL * sizeof *k->ver);
    k->bytes = S * b->NL * KH * (size_t)cap * b->d * 2;
    k->split = hkv_gpu_attn_decode_splits(hkv_gpu_ctx_sm_count(b->ctx), 1, b->H, b->KH, cap);
    k->split_ws_bytes = hkv_gpu_attn_decode_ws_bytes(b->max_seqs, b->H, b->d, k->split);
    k->cap = cap;   /* free_arena frees what was allocated with these sizes */
    if (!(k->k = hkv_gpu_alloc_async(b->ctx, HKV_TIER_NEAR, k->bytes, b->st, err)) ||
        !(k->v = hkv_gpu_alloc_async(b->ctx, HKV_TIER_NEAR, k->bytes, b->st, err)) ||
        !(k->d_idx = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, S * KH * (size_t)cap * 4, b->st,
                                         err)) ||
        !(k->d_nrows = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, S * KH * 4, b->st, err)) ||
        !(k->d_o = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, S * (size_t)b->qd * 4, b->st,
                                       err)) ||
        !(k->d_l = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, S * b->H * 4, b->st, err)) ||
        (k->split_ws_bytes &&
         !(k->split_ws = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, k->split_ws_bytes, b->st,
                                             err))) ||
        (rc = hkv_pinned_alloc(&k->h_stage, &b->e->mem, NULL, HKV_TIER_WORKSPACE,
                               2 * KH * (size_t)cap * b->d * 2, -1, HKV_PIN_REQUIRE, err)))
        rc = err && err->code ? err->code : HKV_E_NOMEM;
    else if (!(k->h_idx = malloc(S * KH * (size_t)cap * sizeof *k->h_idx)))
        rc = hkv_seterr(err, HKV_E_NOMEM, "no host memory for the kept row lists");
    if (rc) {
        free_arena(b);
        hkv_err_prefix(err, "device copy of kept sets of %lld rows for %d sequences x %d layers",
                       (long long)cap, b->max_seqs, b->NL);
        return rc;
    }
    return HKV_OK;
}

/* Gather (sequence s, layer)'s kept rows from the far tier and upload them. */
static int upload_set(cuda_be *b, int s, int layer, const hkv_kept_set *ks, hkv_err *err) {
    cb_keep *k = &b->kp;
    const int KH = b->KH, d = b->d;
    hkv_far_view fv;
    int rc = hkv_kv_far_view(&b->e->kv, s, layer, &fv, err);
    if (rc) return rc;
    /* The staging's last copy must have read it. */
    if ((rc = hkv_gpu_event_sync(k->stage_ev, err))) return rc;
    uint16_t *sk = k->h_stage.p, *sv = sk + (size_t)KH * k->cap * d;
    int32_t *cnt = k->n + ((size_t)s * b->NL + layer) * KH;
    for (int h = 0; h < KH; h++) {
        int32_t c = 0;
        for (int64_t i = 0; i < ks->n[h]; i++) {
            const int64_t p = ks->pos[(int64_t)h * ks->ld + i];
            if (p < fv.lo || p >= fv.hi) continue;   /* what select would skip */
            const size_t at = ((size_t)h * k->cap + c) * d;
            hkv_far_gather16(&b->e->kern, &fv, h, NULL, p, 1, sk + at, sv + at);
            c++;
        }
        cnt[h] = c;
    }
    const size_t bytes = (size_t)KH * k->cap * d * 2,
                 off = ((size_t)s * b->NL + layer) * KH * k->cap * d;
    if ((rc = hkv_gpu_upload(k->k + off, sk, bytes, b->st, err)) ||
        (rc = hkv_gpu_upload(k->v + off, sv, bytes, b->st, err)) ||
        (rc = hkv_gpu_event_record(k->stage_ev, b->st, err)))
        return rc;
    b->stats.bytes_h2d += 2 * bytes;
    b->stats.keep_resyncs++;
    return HKV_OK;
}

/* 1 when decode segment sg's policy has a kept set for layer (into *ks), 0
 * when not (with count, a fallback counted), < 0 an error. */
static int seq_kept(cuda_be *b, const hkv_seg *sg, int layer, int count, hkv_kept_set *ks,
                    hkv_err *err) {
    hkv_policy pol;
    int rc = hkv_kv_seq_instance(&b->e->kv, sg->seq, NULL, &pol, err);
    if (rc) return rc;
    if (!pol.ops->kept_set || !cb_policy_takes(b, sg, layer, &pol, count)) return 0;
    if ((rc = pol.ops->kept_set(pol.self, layer, ks)))
        return hkv_seterr(err, rc, "sequence %d, layer %d: the policy's kept set", sg->seq, layer);
    return 1;
}

int cb_keep_step(cuda_be *b, int layer, const hkv_seg *segs, int n_segs, int64_t r0, int64_t n,
                 hkv_err *err) {
    cb_keep *k = &b->kp;
    hkv_kv *kv = &b->e->kv;
    const int KH = b->KH, NL = b->NL;
    int rc;
    k->n_dec = 0;
    for (int64_t i = r0 * KH; i < (r0 + n) * KH; i++) k->h_from[i] = -1;
    /* The step's kept sets, the arena grown once before any is copied. */
    int64_t need = 0;
    for (int i = 0; i < n_segs; i++) {
        const hkv_seg *sg = &segs[i];
        if ((sg->flags & (HKV_SEG_PROMPT | HKV_SEG_PROMPT_END)) || sg->n > 1) continue;
        hkv_kept_set ks;
        if ((rc = seq_kept(b, sg, layer, 1, &ks, err)) <= 0) {   /* (the step's one count) */
            if (rc) return rc;
            continue;
        }
        for (int h = 0; h < KH; h++)
            if (ks.n[h] > need) need = ks.n[h];
    }
    if (need && (rc = ensure_arena(b, need, err))) return rc;
    /* Decode rows in the order cuda_attention.c compacts them. */
    int j = 0, any = 0;
    for (int i = 0; i < n_segs; i++) {
        const hkv_seg *sg = &segs[i];
        if ((sg->flags & (HKV_SEG_PROMPT | HKV_SEG_PROMPT_END)) || sg->n > 1) continue;
        int32_t *nr = k->h_nrows + (size_t)j * KH;
        for (int h = 0; h < KH; h++) nr[h] = 0;
        hkv_kept_set ks;
        if (need && (rc = seq_kept(b, sg, layer, 0, &ks, err)) < 0) return rc;
        if (need && rc == 1) {
            const size_t m = (size_t)sg->seq * NL + layer;
            const uint64_t ep = hkv_kv_seq_epoch(kv, sg->seq);
            if (k->ver[m] != ks.version || k->epoch[m] != ep) {
                if ((rc = upload_set(b, sg->seq, layer, &ks, err)))
                    return hkv_err_prefix(err, "sequence %d, layer %d: kept rows to the device",
                                          sg->seq, layer);
                k->ver[m] = ks.version, k->epoch[m] = ep;
            }
            const int32_t *cnt = k->n + m * KH;
            for (int h = 0; h < KH; h++) {
                nr[h] = cnt[h];
                int32_t *ix = k->h_idx + ((size_t)j * KH + h) * k->cap;
                const int64_t base = (int64_t)sg->seq * NL * KH * k->cap;
                for (int32_t r = 0; r < cnt[h]; r++) ix[r] = (int32_t)(base + r);
                k->h_from[sg->row * KH + h] = ks.from;
            }
            any++;
        }
        j++;
    }
    if (!any) return HKV_OK;
    k->n_dec = j;
    b->stats.keep_rows += any;   /* the rows with a kept set, not the whole batch */
    if ((rc = cb_stage(b, UP_KNROWS, k->d_nrows, k->h_nrows, (size_t)j * KH * 4, err)) ||
        (rc = cb_stage(b, UP_KIDX, k->d_idx, k->h_idx, (size_t)j * KH * k->cap * 4, err)))
        return rc;
    return HKV_OK;
}

int cb_keep_attend(cuda_be *b, int layer, int n_dec, float *no, float *nl, hkv_err *err) {
    cb_keep *k = &b->kp;
    if (!k->n_dec) return HKV_OK;
    const size_t lofs = (size_t)layer * b->KH * k->cap * b->d;
    int split = hkv_gpu_attn_decode_splits(hkv_gpu_ctx_sm_count(b->ctx), n_dec, b->H, b->KH, k->cap);
    if (split > k->split) split = k->split;
    int rc;
    if ((rc = hkv_gpu_attn_decode_split(b->d_q, n_dec, b->H, b->KH, b->d, k->k + lofs, k->v + lofs,
                                        b->d, (int64_t)k->cap * b->d, 0, k->d_nrows, k->d_idx,
                                        k->cap, 1.0f / sqrtf((float)b->d), k->d_o, k->d_l, split,
                                        k->split_ws, k->split_ws_bytes, b->st, err)) ||
        (rc = hkv_gpu_attn_merge(no, nl, k->d_o, k->d_l, (int64_t)n_dec * b->H, b->d,
                                 b->st, err)))
        return rc;
    return HKV_OK;
}
