/* Whole sequences on the device: a `full` sequence given one of the
 * backend's resident slots (hkv_cuda_params.resident_seqs: --gpu-resident,
 * and the per-sequence placement of --policy auto) keeps every far row on
 * the device as well as in the far tier, so its decode attention runs there
 * whole; the host attends only the far rows not yet uploaded, fewer than a
 * chunk (hkv_cuda_params.resident_chunk). The far tier stays the copy of
 * record (a rewind, a copy, a later turn read it), so the device's rows are
 * a mirror: current while the sequence's epoch holds (kv_far.h, seq_epoch),
 * grown as rows leave the near ring, uploaded again under a new epoch.
 *
 * Shared prefixes (issue 39): sequences that map one prefix by reference
 * (kv/kv_prefix.h; hkv_far_view.shared_id, never reused) read its rows from
 * one prefix slot (hkv_cuda_params.resident_prefixes), uploaded once, and
 * keep only their own rows past it in their slot: 64 questions over one
 * document hold the document once and 64 answers' rows, so slots can be
 * sized for the answers (resident_rows). A prefix slot is taken by the
 * first sequence on it and given up when no slot's sequence reads it. The
 * step's rows on one prefix attend it as a cascade (FlashInfer's name): one
 * call of the prompt attention's kernel (attn_prefill_keys, tensor cores)
 * with those rows as its queries and the prefix's rows as every query's
 * keys, so each K/V tile is read once for the whole group, not once a row.
 *
 * Per layer, before the host step:
 *   host  : each decode row of a `full` sequence with far tokens takes its
 *           slot (or a free one) and its prefix's slot; rows past either
 *           copy, once there are a chunk of them (all of them at the first
 *           step after a prompt end), go up from the page-locked far tier
 *           (cb_upload_far: 8-bit rows made fp16 on the way); the row's host
 *           range starts past the copy (kp.h_from);
 *   device: the row's own partial (flash-decoding over a run of rows,
 *           gpu_kernels.h's idx_ld = 0 form: one start per KV head) and its
 *           group's cascade partial, merged exactly into the near partial
 *           (cuda_attention.c).
 * A slot is freed when its sequence closes or runs another policy; a `full`
 * sequence that finds none free, or whose rows outgrow one, runs on the
 * host (fallbacks no_room). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend_impl.h"
#include "kv_far.h"

int cb_resident_create(cuda_be *b, const hkv_cuda_params *p, int64_t rows, hkv_err *err) {
    cb_resident *r = &b->rs;
    const int n_slots = p->resident_seqs;
    if (n_slots <= 0) return HKV_OK;
    r->chunk = p->resident_chunk > 0 ? p->resident_chunk : HKV_RESIDENT_CHUNK_DEFAULT;
    const size_t S = (size_t)b->max_seqs, NL = (size_t)b->NL, KH = (size_t)b->KH,
                 d = (size_t)b->d, slots = (size_t)n_slots,
                 pre = (size_t)(p->resident_prefixes > 0 ? p->resident_prefixes : 0);
    r->pcap = rows - b->NR > 0 ? rows - b->NR : 0;
    r->cap = p->resident_rows > 0 && p->resident_rows < r->pcap ? p->resident_rows : r->pcap;
    if (!r->cap) return HKV_OK;   /* every row is near: nothing far to keep */
    if (pre && (b->d % 32 || b->d > 256))   /* (b->pp_ok is set later) */
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "--gpu-resident-prefixes: a prefix's cascade runs "
                          "on the device's prompt attention, which takes head sizes that are "
                          "multiples of 32 up to 256, not %d", b->d);
    if ((int64_t)slots * KH * r->cap >= ((int64_t)1 << 31) ||
        (int64_t)pre * KH * r->pcap >= ((int64_t)1 << 31))
        return hkv_seterr(err, HKV_E_RANGE, "%d resident sequences (%lld far rows) and %d prefixes "
                          "(%lld) x %d KV heads exceed the 32-bit row indices of the device",
                          n_slots, (long long)r->cap, (int)pre, (long long)r->pcap, b->KH);
    const size_t bytes = NL * slots * KH * (size_t)r->cap * d * 2,
                 pbytes = NL * pre * KH * (size_t)r->pcap * d * 2;
    r->split = hkv_gpu_attn_decode_splits(hkv_gpu_ctx_sm_count(b->ctx), 1, b->H, b->KH, r->cap);
    r->split_ws_bytes = hkv_gpu_attn_decode_ws_bytes(b->max_seqs, b->H, b->d, r->split);
    int rc = HKV_OK;
    if (!(r->slot_seq = malloc(slots * sizeof *r->slot_seq)) ||
        !(r->seq_slot = malloc(S * sizeof *r->seq_slot)) ||
        !(r->epoch = calloc(slots * NL, sizeof *r->epoch)) ||
        !(r->lo = calloc(slots * NL, sizeof *r->lo)) || !(r->hi = calloc(slots * NL, sizeof *r->hi)) ||
        !(r->pslot = malloc(slots * NL * sizeof *r->pslot)) ||
        (pre && !(r->pre_id = calloc(pre, sizeof *r->pre_id))) ||
        (pre && !(r->pre_hi = calloc(pre * NL, sizeof *r->pre_hi))) ||
        !(r->h_nrows = malloc(S * KH * sizeof *r->h_nrows)) ||
        !(r->h_idx = malloc(S * KH * sizeof *r->h_idx)) ||
        !(r->row_ps = malloc(S * sizeof *r->row_ps)) ||
        !(r->row_nk = malloc(S * sizeof *r->row_nk)) ||
        !(r->h_grow = malloc(S * sizeof *r->h_grow)) || !(r->grp = malloc(S * sizeof *r->grp)))
        return hkv_seterr(err, HKV_E_NOMEM, "no host memory for the resident sequences' tables");
    for (size_t i = 0; i < slots; i++) r->slot_seq[i] = -1;
    for (size_t i = 0; i < S; i++) r->seq_slot[i] = -1;
    for (size_t i = 0; i < slots * NL; i++) r->pslot[i] = -1;
    /* cb_alloc: freed with the backend's other allocations */
    if (!(r->k = cb_alloc(b, HKV_TIER_NEAR, bytes, err)) ||
        !(r->v = cb_alloc(b, HKV_TIER_NEAR, bytes, err)) ||
        (pre && !(r->pk = cb_alloc(b, HKV_TIER_NEAR, pbytes, err))) ||
        (pre && !(r->pv = cb_alloc(b, HKV_TIER_NEAR, pbytes, err))) ||
        !(r->d_nrows = cb_alloc(b, HKV_TIER_WORKSPACE, S * KH * 4, err)) ||
        !(r->d_idx = cb_alloc(b, HKV_TIER_WORKSPACE, S * KH * 4, err)) ||
        (pre && !(r->d_grow = cb_alloc(b, HKV_TIER_WORKSPACE, S * 4, err))) ||
        (pre && !(r->d_cq = cb_alloc(b, HKV_TIER_WORKSPACE, S * (size_t)b->qd * 4, err))) ||
        (pre && !(r->d_co = cb_alloc(b, HKV_TIER_WORKSPACE, S * (size_t)b->qd * 4, err))) ||
        (pre && !(r->d_cl = cb_alloc(b, HKV_TIER_WORKSPACE, S * b->H * 4, err))) ||
        !(r->d_o = cb_alloc(b, HKV_TIER_WORKSPACE, S * (size_t)b->qd * 4, err)) ||
        !(r->d_l = cb_alloc(b, HKV_TIER_WORKSPACE, S * b->H * 4, err)) ||
        (r->split_ws_bytes &&
         !(r->split_ws = cb_alloc(b, HKV_TIER_WORKSPACE, r->split_ws_bytes, err))))
        rc = err && err->code ? err->code : HKV_E_NOMEM;
    if (rc) {
        char have[32], phave[32];
        hkv_fmt_bytes(2.0 * (double)bytes, have, sizeof have);
        hkv_fmt_bytes(2.0 * (double)pbytes, phave, sizeof phave);
        return hkv_err_prefix(err, "%d resident sequences of %lld far rows (%s of K and V) and %d "
                              "prefixes of %lld (%s)", n_slots, (long long)r->cap, have, (int)pre,
                              (long long)r->pcap, phave);
    }
    r->n_slots = n_slots;
    r->n_pre = (int)pre;
    return HKV_OK;
}

void cb_resident_destroy(cuda_be *b) {
    cb_resident *r = &b->rs;
    free(r->slot_seq);
    free(r->seq_slot);
    free(r->epoch);
    free(r->lo);
    free(r->hi);
    free(r->pslot);
    free(r->pre_id);
    free(r->pre_hi);
    free(r->h_nrows);
    free(r->h_idx);
    free(r->row_ps);
    free(r->row_nk);
    free(r->h_grow);
    free(r->grp);
    memset(r, 0, sizeof *r);
}

/* Slots whose sequence closed or now runs another policy, freed. */
static void release_stale(cuda_be *b) {
    cb_resident *r = &b->rs;
    hkv_kv *kv = &b->e->kv;
    for (int i = 0; i < r->n_slots; i++) {
        const int s = r->slot_seq[i];
        if (s < 0) continue;
        if (kv->ops->seq_len(kv->self, s) > 0 && hkv_kv_seq_policy(kv, s, NULL) == &hkv_policy_full)
            continue;
        r->slot_seq[i] = -1;
        r->seq_slot[s] = -1;
    }
}

/* Sequence s's slot, a free one taken, or -1. */
static int take_slot(cuda_be *b, int s) {
    cb_resident *r = &b->rs;
    if (r->seq_slot[s] >= 0) return r->seq_slot[s];
    for (int pass = 0; pass < 2; pass++) {
        if (pass) release_stale(b);
        for (int i = 0; i < r->n_slots; i++) {
            if (r->slot_seq[i] >= 0) continue;
            r->slot_seq[i] = s;
            r->seq_slot[s] = i;
            for (int l = 0; l < b->NL; l++) r->epoch[(size_t)i * b->NL + l] = 0;
            return i;
        }
    }
    return -1;
}

/* The prefix slot holding prefix `id`, a free one taken, or one no held
 * slot reads given up and taken; -1 when every one is read. */
static int take_prefix(cuda_be *b, uint64_t id) {
    cb_resident *r = &b->rs;
    for (int i = 0; i < r->n_pre; i++)
        if (r->pre_id[i] == id) return i;
    for (int pass = 0; pass < 2; pass++) {
        if (pass) {
            release_stale(b);
            for (int i = 0; i < r->n_pre; i++) {
                int read = 0;
                for (int s = 0; s < r->n_slots && !read; s++)
                    for (int l = 0; l < b->NL && r->slot_seq[s] >= 0 && !read; l++)
                        read = r->pslot[(size_t)s * b->NL + l] == i;
                if (!read) r->pre_id[i] = 0;
            }
        }
        for (int i = 0; i < r->n_pre; i++) {
            if (r->pre_id[i]) continue;
            r->pre_id[i] = id;
            for (int l = 0; l < b->NL; l++) r->pre_hi[(size_t)i * b->NL + l] = 0;
            return i;
        }
    }
    return -1;
}

/* Far positions [from, to) of a slot's layer up from the far tier, row
 * `from - lo` on: fp16 rows straight from its page-locked memory, 8-bit
 * ones made fp16 on the way (cb_upload_far, as a prompt's streamed keys
 * go). The slot's K/V at k_s, v_s: [KH][cap][d]. */
static int upload_rows(cuda_be *b, uint16_t *k_s, uint16_t *v_s, int64_t cap, const hkv_far_view *fv,
                       int64_t lo, int64_t from, int64_t to, hkv_err *err) {
    const size_t KH = (size_t)b->KH, d = (size_t)b->d;
    int rc;
    for (size_t h = 0; h < KH; h++) {
        const size_t at = (h * (size_t)cap + (size_t)(from - lo)) * d;
        if ((rc = cb_upload_far(b, k_s + at, v_s + at, fv, (int)h, from, to - from, b->st, err)))
            return rc;
    }
    b->stats.bytes_h2d += 2 * KH * (uint64_t)(to - from) * d * 2;
    return HKV_OK;
}

/* Slot `slot`'s (or prefix slot's) K and V of `layer`. */
static uint16_t *slot_rows(const cuda_be *b, uint16_t *arena, int n, int64_t cap, int layer, int slot) {
    return arena + (((size_t)layer * n + (size_t)slot) * b->KH) * (size_t)cap * b->d;
}

/* A row's prefix part: positions [view lo, min(shared_hi, hi)) in prefix
 * slot ps, uploaded first where they are not yet; its row count. */
static int prefix_part(cuda_be *b, int ps, int layer, const hkv_far_view *fv, int64_t *nk,
                       hkv_err *err) {
    cb_resident *r = &b->rs;
    const size_t pm = (size_t)ps * b->NL + layer;
    const int64_t end = fv->shared_hi < fv->hi ? fv->shared_hi : fv->hi;
    if (r->pre_hi[pm] < fv->lo) r->pre_hi[pm] = fv->lo;
    if (end > r->pre_hi[pm]) {
        int rc = upload_rows(b, slot_rows(b, r->pk, r->n_pre, r->pcap, layer, ps),
                             slot_rows(b, r->pv, r->n_pre, r->pcap, layer, ps), r->pcap, fv, fv->lo,
                             r->pre_hi[pm], end, err);
        if (rc) return rc;
        b->stats.resident_prefix_up += end - r->pre_hi[pm];
        r->pre_hi[pm] = end;
    }
    *nk = end - fv->lo;
    return HKV_OK;
}

/* The step's rows with a prefix part in groups of one (prefix slot, rows),
 * each group's rows listed together in h_grow. */
static void cascade_groups(cb_resident *r, int n_rows) {
    r->n_grp = 0;
    for (int j = 0; j < n_rows; j++) {
        if (r->row_ps[j] < 0) continue;
        int g = 0;
        while (g < r->n_grp && (r->grp[g].ps != r->row_ps[j] || r->grp[g].nk != r->row_nk[j])) g++;
        if (g == r->n_grp) r->grp[r->n_grp++] = (struct cb_cascade_group){r->row_ps[j], 0, 0, r->row_nk[j]};
        r->grp[g].n++;
    }
    for (int g = 0, at = 0; g < r->n_grp; at += r->grp[g++].n) r->grp[g].start = at, r->grp[g].n = 0;
    for (int j = 0; j < n_rows; j++) {
        if (r->row_ps[j] < 0) continue;
        int g = 0;
        while (r->grp[g].ps != r->row_ps[j] || r->grp[g].nk != r->row_nk[j]) g++;
        r->h_grow[r->grp[g].start + r->grp[g].n++] = j;
    }
}

int cb_resident_step(cuda_be *b, int layer, const hkv_seg *segs, int n_segs, hkv_err *err) {
    cb_resident *r = &b->rs;
    r->n_dec = r->n_pdec = r->n_grp = 0;
    if (!r->n_slots) return HKV_OK;
    hkv_kv *kv = &b->e->kv;
    const int KH = b->KH, NL = b->NL;
    int rc, j = 0, any = 0, anyp = 0;
    /* Decode rows in the order cuda_attention.c compacts them. */
    for (int i = 0; i < n_segs; i++) {
        const hkv_seg *sg = &segs[i];
        if ((sg->flags & (HKV_SEG_PROMPT | HKV_SEG_PROMPT_END)) || sg->n > 1) continue;
        int32_t *nr = r->h_nrows + (size_t)j * KH, *ix = r->h_idx + (size_t)j * KH;
        for (int h = 0; h < KH; h++) nr[h] = ix[h] = 0;
        r->row_ps[j] = -1;
        const int jr = j++;
        if (!cb_far_tokens(b, sg) || hkv_kv_seq_policy(kv, sg->seq, NULL) != &hkv_policy_full ||
            b->kp.h_from[sg->row * KH] >= 0)   /* (a kept set's: not full's) */
            continue;
        hkv_far_view fv;
        if ((rc = hkv_kv_far_view(kv, sg->seq, layer, &fv, err))) return rc;
        /* a shared prefix from its prefix slot where one is free; own rows
         * from base on */
        const int ps = r->n_pre && fv.shared_id && fv.shared_hi > fv.lo ? take_prefix(b, fv.shared_id) : -1;
        const int64_t base = ps >= 0 ? fv.shared_hi : fv.lo, top = fv.hi > base ? fv.hi : base;
        /* every slot held, or past what one holds: the host attends it */
        const int slot = top - base <= r->cap ? take_slot(b, sg->seq) : -1;
        if (slot < 0) {
            cb_fallback(b, HKV_FALLBACK_NO_ROOM);
            continue;
        }
        const size_t m = (size_t)slot * NL + layer;
        const uint64_t ep = hkv_kv_seq_epoch(kv, sg->seq);
        if (r->epoch[m] != ep || r->lo[m] != base || r->pslot[m] != ps || r->hi[m] > top) {
            /* another sequence's, rewound, or its prefix now read elsewhere */
            r->epoch[m] = ep, r->lo[m] = r->hi[m] = base, r->pslot[m] = ps;
            b->stats.resident_resyncs++;
        }
        if (ps >= 0) {
            if ((rc = prefix_part(b, ps, layer, &fv, &r->row_nk[jr], err)))
                return hkv_err_prefix(err, "sequence %d, layer %d: its shared prefix to the device",
                                      sg->seq, layer);
            r->row_ps[jr] = r->row_nk[jr] > 0 ? ps : -1;
            anyp += r->row_nk[jr] > 0;
        }
        /* all at once when nothing is up yet, then each time a chunk has gathered */
        if (top - r->hi[m] >= r->chunk || (r->hi[m] == r->lo[m] && top > base)) {
            if ((rc = upload_rows(b, slot_rows(b, r->k, r->n_slots, r->cap, layer, slot),
                                  slot_rows(b, r->v, r->n_slots, r->cap, layer, slot), r->cap, &fv,
                                  r->lo[m], r->hi[m], top, err)))
                return hkv_err_prefix(err, "sequence %d, layer %d: far rows to the device",
                                      sg->seq, layer);
            b->stats.resident_rows_up += top - r->hi[m];
            r->hi[m] = top;
        }
        /* the host attends past both copies: [hi, view hi), empty when the
         * prefix reaches past the view */
        const int64_t from = r->hi[m] < fv.hi ? r->hi[m] : fv.hi;
        for (int h = 0; h < KH; h++) {
            nr[h] = (int32_t)(r->hi[m] - r->lo[m]);
            ix[h] = (int32_t)((int64_t)slot * KH * r->cap);   /* row 0 of (slot, KV head 0) */
            b->kp.h_from[sg->row * KH + h] = from;
        }
        any++;
    }
    if (!any) return HKV_OK;
    r->n_dec = j;
    r->n_pdec = anyp;
    b->stats.resident_rows += any;
    b->stats.resident_prefix_rows += anyp;
    if (anyp) cascade_groups(r, j);
    b->stats.resident_prefix_groups += r->n_grp;
    if ((rc = cb_stage(b, UP_RNROWS, r->d_nrows, r->h_nrows, (size_t)j * KH * 4, err)) ||
        (rc = cb_stage(b, UP_RIDX, r->d_idx, r->h_idx, (size_t)j * KH * 4, err)) ||
        (anyp && (rc = cb_stage(b, UP_CROWS, r->d_grow, r->h_grow, (size_t)anyp * 4, err))))
        return rc;
    return HKV_OK;
}

/* The step's cascades: each group's queries gathered, its prefix attended
 * by every one of them in one pass (p0 = nk: no causal bound), the group's
 * partials scattered to their rows, the others left empty, and all merged. */
static int attend_prefixes(cuda_be *b, int layer, int n_dec, float *no, float *nl, hkv_err *err) {
    cb_resident *r = &b->rs;
    const int64_t qd = b->qd;
    const uint16_t *pk = slot_rows(b, r->pk, r->n_pre, r->pcap, layer, 0),
                   *pv = slot_rows(b, r->pv, r->n_pre, r->pcap, layer, 0);
    int rc;
    if ((rc = hkv_gpu_copy_rows(r->d_cq, qd, NULL, b->d_q, qd, r->d_grow, r->n_pdec, qd, b->st, err)))
        return rc;
    for (int g = 0; g < r->n_grp; g++) {
        const struct cb_cascade_group *gr = &r->grp[g];
        const size_t at = (size_t)gr->ps * b->KH * r->pcap * b->d;
        if ((rc = hkv_gpu_attn_prefill_keys(r->d_cq + gr->start * qd, qd, gr->n, b->H, b->KH, b->d,
                                            gr->nk, gr->nk, pk + at, pv + at, b->d, r->pcap * b->d,
                                            1.0f / sqrtf((float)b->d), r->d_co + gr->start * qd, qd,
                                            r->d_cl + (size_t)gr->start * b->H, b->st, err)))
            return rc;
    }
    if ((rc = hkv_gpu_partial_clear(r->d_o, qd, r->d_l, n_dec, b->H, b->d, b->st, err)) ||
        (rc = hkv_gpu_copy_rows(r->d_o, qd, r->d_grow, r->d_co, qd, NULL, r->n_pdec, qd, b->st, err)) ||
        (rc = hkv_gpu_copy_rows(r->d_l, b->H, r->d_grow, r->d_cl, b->H, NULL, r->n_pdec, b->H, b->st,
                                err)) ||
        (rc = hkv_gpu_attn_merge(no, nl, r->d_o, r->d_l, (int64_t)n_dec * b->H, b->d, b->st, err)))
        return rc;
    return HKV_OK;
}

int cb_resident_attend(cuda_be *b, int layer, int n_dec, float *no, float *nl, hkv_err *err) {
    cb_resident *r = &b->rs;
    if (!r->n_dec) return HKV_OK;
    const int64_t lofs = (int64_t)layer * r->n_slots * b->KH * r->cap * b->d;
    int split = hkv_gpu_attn_decode_splits(hkv_gpu_ctx_sm_count(b->ctx), n_dec, b->H, b->KH, r->cap);
    if (split > r->split) split = r->split;
    int rc;
    if ((rc = hkv_gpu_attn_decode_split(b->d_q, n_dec, b->H, b->KH, b->d, r->k + lofs, r->v + lofs,
                                        b->d, r->cap * b->d, 0, r->d_nrows, r->d_idx, 0,
                                        1.0f / sqrtf((float)b->d), r->d_o, r->d_l, split,
                                        r->split_ws, r->split_ws_bytes, b->st, err)) ||
        (rc = hkv_gpu_attn_merge(no, nl, r->d_o, r->d_l, (int64_t)n_dec * b->H, b->d, b->st, err)))
        return rc;
    return r->n_pdec ? attend_prefixes(b, layer, n_dec, no, nl, err) : HKV_OK;
}
