/* RocketKV's stage 2 on the device (index/policy.h, cand_table): per step
 * and KV head the Hybrid Sparse Attention estimate over the candidate list
 * (the top `dims` coordinates of |q|, page bounds, a tempered softmax per
 * head) picks k of the list's entries. On the host that estimate was 30 ms
 * of a 35 ms Llama-3-8B batch-1 step at 8K (docs/GPU_MEASURED.md, the H100
 * run): the lists and their bounds are what the device keeps a copy of,
 * and the host attends only the positions it picked.
 *
 * Per layer, before the host step (and before this step's append
 * overwrites the ring slot the leaving token sits in):
 *   host  : for each decode row whose policy has lists and whose near
 *           mirror is current, upload the lists, their lengths and bounds
 *           whole when the version or the sequence's epoch moved (a prompt
 *           end, a regrown block);
 *   device: push the token leaving the near ring onto every list, its key
 *           folded into the last page (gpu/rocketkv_hsa.cu's push: what the
 *           host's on_far_append does in this step's host part), then the
 *           estimate's top k per KV head into the step's selections
 *           (cuda_pages.c's output, down with the QKV rows).
 * The lists grow by one entry a step, so the arena keeps room for 1024 more
 * (as the memory plan counts them), every copy uploaded again when it grows. A row whose
 * near mirror is not current, or whose policy's lists do not follow the far
 * tier (rerank > 1, a list that could not grow) selects on the host. */
#include <stdlib.h>
#include <string.h>

#include "cuda_backend_impl.h"
#include "kv_far.h"

int cb_rocket_create(cuda_be *b, hkv_err *err) {
    cb_rocket *r = &b->rk;
    const size_t S = (size_t)b->max_seqs;
    if (!(r->ver = calloc(S * b->NL, sizeof *r->ver)) ||
        !(r->epoch = calloc(S * b->NL, sizeof *r->epoch)) ||
        !(r->h_n = malloc((size_t)b->KH * sizeof *r->h_n)))
        return hkv_seterr(err, HKV_E_NOMEM, "no host memory for the candidate lists' tables");
    return HKV_OK;
}

static void free_arena(cuda_be *b) {
    cb_rocket *r = &b->rk;
    hkv_gpu_free_async(b->ctx, HKV_TIER_INDEX, r->cand, r->cand_bytes, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_INDEX, r->n, r->n_bytes, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_INDEX, r->bnd, r->bnd_bytes, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, r->ws, r->ws_bytes, b->st);
    r->cand = r->n = NULL, r->bnd = NULL, r->ws = NULL;
    r->cap = r->pcap = 0, r->cand_bytes = r->n_bytes = r->bnd_bytes = r->ws_bytes = 0;
}

void cb_rocket_destroy(cuda_be *b) {
    cb_rocket *r = &b->rk;
    if (r->cap) free_arena(b);
    free(r->ver);
    free(r->epoch);
    free(r->h_n);
}

/* 1 when segment sg is a decode row whose policy has lists for layer (into
 * *t), 0 when not (with count, a fallback counted), < 0 an error. */
static int decode_lists(cuda_be *b, const hkv_seg *sg, int layer, int count, hkv_cand_table *t,
                        hkv_err *err) {
    if ((sg->flags & (HKV_SEG_PROMPT | HKV_SEG_PROMPT_END)) || sg->n > 1) return 0;
    hkv_policy pol;
    int rc = hkv_kv_seq_instance(&b->e->kv, sg->seq, NULL, &pol, err);
    if (rc) return rc;
    if (!pol.ops->cand_table) return 0;
    if (b->d > 256 || b->H / b->KH > 64) {   /* the estimate kernel's shapes */
        if (count && cb_far_tokens(b, sg)) cb_fallback(b, HKV_FALLBACK_SHAPE);
        return 0;
    }
    if (!cb_policy_takes(b, sg, layer, &pol, count)) return 0;
    if ((rc = pol.ops->cand_table(pol.self, layer, t)))
        return hkv_seterr(err, rc, "sequence %d, layer %d: the policy's candidate lists", sg->seq,
                          layer);
    return 1;
}

int64_t cb_rocket_sel_need(cuda_be *b, int layer, const hkv_seg *segs, int n_segs) {
    int64_t need = 0;
    for (int i = 0; i < n_segs; i++) {   /* (the step's one count of a fallback) */
        hkv_cand_table t;
        hkv_err e;
        if (decode_lists(b, &segs[i], layer, 1, &t, &e) == 1 && t.k > need) need = t.k;
    }
    return need;
}

/* Room for cap entries per list with pages of at least `page`. */
static int ensure_arena(cuda_be *b, int64_t cap, int64_t page, int g, hkv_err *err) {
    cb_rocket *r = &b->rk;
    if (cap <= r->cap && cap / page + 1 <= r->pcap) return HKV_OK;
    /* room for 1024 more far tokens, as the memory plan counts (gpu_plan.c) */
    const int64_t ncap = (cap > r->cap ? cap : r->cap) + 1024;
    int64_t pcap = ncap / page + 1;
    if (pcap < r->pcap) pcap = r->pcap;   /* (a row with a smaller page may have needed more) */
    int rc = HKV_OK;
    if (r->cap) {   /* the other micro-batch's selection reads the old arena first */
        if ((rc = cb_settle_halves(b, err)) || (rc = hkv_gpu_sync(b->st, err))) return rc;
        free_arena(b);
    }
    memset(r->ver, 0, (size_t)b->max_seqs * b->NL * sizeof *r->ver);
    const size_t lists = (size_t)b->max_seqs * b->NL * b->KH;
    r->cap = ncap, r->pcap = pcap;   /* free_arena frees with these sizes */
    r->cand_bytes = lists * (size_t)ncap * 4;
    r->n_bytes = lists * 4;
    r->bnd_bytes = lists * 2 * (size_t)b->d * (size_t)pcap * 2;
    r->ws_bytes = hkv_gpu_rocketkv_hsa_ws_bytes(b->KH, g, ncap, 1);   /* page 1: the most pages */
    if (!(r->cand = hkv_gpu_alloc_async(b->ctx, HKV_TIER_INDEX, r->cand_bytes, b->st, err)) ||
        !(r->n = hkv_gpu_alloc_async(b->ctx, HKV_TIER_INDEX, r->n_bytes, b->st, err)) ||
        !(r->bnd = hkv_gpu_alloc_async(b->ctx, HKV_TIER_INDEX, r->bnd_bytes, b->st, err)) ||
        !(r->ws = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, r->ws_bytes, b->st, err))) {
        rc = err && err->code ? err->code : HKV_E_NOMEM;
        free_arena(b);
        hkv_err_prefix(err, "device candidate lists of %lld entries for %d sequences x %d layers",
                       (long long)ncap, b->max_seqs, b->NL);
        return rc;
    }
    return HKV_OK;
}

/* (sequence, layer) m's lists, lengths and bounds, whole, from the policy's. */
static int upload_lists(cuda_be *b, size_t m, const hkv_cand_table *t, hkv_err *err) {
    cb_rocket *r = &b->rk;
    const int KH = b->KH, d = b->d;
    int64_t nmax = 0;
    int rc;
    for (int h = 0; h < KH; h++) {
        r->h_n[h] = (int32_t)t->n[h];
        if (t->n[h] > nmax) nmax = t->n[h];
    }
    const int64_t np = (nmax + t->page - 1) / t->page;
    if ((rc = hkv_gpu_upload_2d(r->cand + m * KH * r->cap, (size_t)r->cap * 4, t->cand,
                                (size_t)t->cap * 4, (size_t)nmax * 4, (size_t)KH, b->st, err)) ||
        (rc = cb_stage(b, -1, r->n + m * KH, r->h_n, (size_t)KH * 4, err)) ||
        (rc = hkv_gpu_upload_2d(r->bnd + m * KH * 2 * d * r->pcap, (size_t)r->pcap * 2, t->bnd,
                                (size_t)t->pcap * 2, (size_t)np * 2, (size_t)KH * 2 * d, b->st, err)))
        return rc;
    b->stats.bytes_h2d += (size_t)KH * (nmax * 4 + 4 + 2 * d * np * 2);
    return HKV_OK;
}

int cb_rocket_step(cuda_be *b, int layer, const hkv_seg *segs, int n_segs, hkv_err *err) {
    cb_rocket *r = &b->rk;
    cb_pages *g = &b->pg;
    hkv_kv *kv = &b->e->kv;
    const int NL = b->NL, KH = b->KH, d = b->d, NR = b->NR, grp = b->H / b->KH;
    const int64_t Li = b->Li, Ll = b->Ll;
    int rc;
    /* The arena first: every list of the step with room for this step's push. */
    int64_t need = 0, page = 0;
    for (int i = 0; i < n_segs; i++) {
        hkv_cand_table t;
        if ((rc = decode_lists(b, &segs[i], layer, 0, &t, err)) <= 0) {
            if (rc) return rc;
            continue;
        }
        for (int h = 0; h < KH; h++)
            if (t.n[h] + 1 > need) need = t.n[h] + 1;
        if (!page || t.page < page) page = t.page;
    }
    if (!need) return HKV_OK;
    if ((rc = ensure_arena(b, need, page, grp, err))) return rc;
    for (int i = 0; i < n_segs; i++) {
        const hkv_seg *sg = &segs[i];
        hkv_cand_table t;
        if ((rc = decode_lists(b, sg, layer, 0, &t, err)) <= 0) {
            if (rc) return rc;
            continue;
        }
        const size_t m = (size_t)sg->seq * NL + layer;
        const uint64_t ep = hkv_kv_seq_epoch(kv, sg->seq);
        const int64_t p = sg->pos, pf = p - Ll;
        const int push = p >= Li + Ll;   /* the token this step pushes out of the ring */
        if (b->m_len[m] != p || b->m_epoch[m] != ep || (push && t.list_hi != pf)) {
            r->ver[m] = 0;   /* no current ring to push from, or lists behind the far tier */
            if (cb_far_tokens(b, sg)) cb_fallback(b, HKV_FALLBACK_NO_DEVICE_COPY);
            continue;
        }
        if (r->ver[m] != t.version || r->epoch[m] != ep) {
            if ((rc = upload_lists(b, m, &t, err)))
                return hkv_err_prefix(err, "sequence %d, layer %d: candidate lists to the device",
                                      sg->seq, layer);
            r->ver[m] = t.version, r->epoch[m] = ep;
            b->stats.page_resyncs++;
        }
        int32_t *cand = r->cand + m * KH * r->cap, *nc = r->n + m * KH;
        uint16_t *bnd = r->bnd + m * KH * 2 * d * r->pcap;
        if (push) {
            const int64_t slot = Li + (p - Li) % Ll;
            const uint16_t *row = b->near_k + (m * KH * NR + (size_t)slot) * d;
            if ((rc = hkv_gpu_rocketkv_push(cand, r->cap, nc, KH, d, t.page, r->pcap, bnd, row,
                                            (int64_t)NR * d, pf, b->st, err)))
                return rc;
        }
        const int64_t row = sg->row;
        if ((rc = hkv_gpu_rocketkv_hsa(bnd, r->pcap, cand, r->cap, nc, KH, grp, d, t.page, t.dims,
                                       t.k, b->act[HKV_ACT_QKV] + row * b->qkv_w,
                                       g->d_sel + (size_t)row * KH * g->sel_ld, g->sel_ld,
                                       g->d_n + (size_t)row * KH, r->ws, r->ws_bytes, b->st, err)))
            return hkv_err_prefix(err, "sequence %d, layer %d: rocketkv stage 2", sg->seq, layer);
        for (int h = 0; h < KH; h++) g->has[row * KH + h] = 1;
        g->n_rows++;   /* (counted in device_selects with quest's at the download) */
    }
    return HKV_OK;
}
