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
 * Per layer, before the host step:
 *   host  : each decode row of a `full` sequence with far tokens takes its
 *           slot (or a free one); rows past the slot's copy, once there are a
 *           chunk of them (all of them at the first step after a prompt
 *           end), go up from the page-locked far tier (cb_upload_far: 8-bit
 *           rows made fp16 on the way); the row's host range starts past the
 *           copy (kp.h_from);
 *   device: the row's resident partial (flash-decoding over a run of rows,
 *           gpu_kernels.h's idx_ld = 0 form: one start per KV head), merged
 *           exactly into the near partial (cuda_attention.c).
 * A slot is freed when its sequence closes or runs another policy; a `full`
 * sequence that finds none free runs on the host (fallbacks no_room). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend_impl.h"
#include "kv_far.h"

int cb_resident_create(cuda_be *b, int n_slots, int64_t rows, int chunk, hkv_err *err) {
    cb_resident *r = &b->rs;
    if (n_slots <= 0) return HKV_OK;
    r->chunk = chunk > 0 ? chunk : HKV_RESIDENT_CHUNK_DEFAULT;
    const size_t S = (size_t)b->max_seqs, NL = (size_t)b->NL, KH = (size_t)b->KH,
                 d = (size_t)b->d, slots = (size_t)n_slots;
    r->cap = rows - b->NR > 0 ? rows - b->NR : 0;
    if (!r->cap) return HKV_OK;   /* every row is near: nothing far to keep */
    if ((int64_t)slots * KH * r->cap >= ((int64_t)1 << 31))
        return hkv_seterr(err, HKV_E_RANGE, "%d resident sequences x %d KV heads x %lld far rows "
                          "exceed the 32-bit row indices of the device", n_slots, b->KH,
                          (long long)r->cap);
    const size_t bytes = NL * slots * KH * (size_t)r->cap * d * 2;
    r->split = hkv_gpu_attn_decode_splits(hkv_gpu_ctx_sm_count(b->ctx), 1, b->H, b->KH, r->cap);
    r->split_ws_bytes = hkv_gpu_attn_decode_ws_bytes(b->max_seqs, b->H, b->d, r->split);
    int rc = HKV_OK;
    if (!(r->slot_seq = malloc(slots * sizeof *r->slot_seq)) ||
        !(r->seq_slot = malloc(S * sizeof *r->seq_slot)) ||
        !(r->epoch = calloc(slots * NL, sizeof *r->epoch)) ||
        !(r->lo = calloc(slots * NL, sizeof *r->lo)) || !(r->hi = calloc(slots * NL, sizeof *r->hi)) ||
        !(r->h_nrows = malloc(S * KH * sizeof *r->h_nrows)) ||
        !(r->h_idx = malloc(S * KH * sizeof *r->h_idx)))
        return hkv_seterr(err, HKV_E_NOMEM, "no host memory for the resident sequences' tables");
    for (size_t i = 0; i < slots; i++) r->slot_seq[i] = -1;
    for (size_t i = 0; i < S; i++) r->seq_slot[i] = -1;
    /* cb_alloc: freed with the backend's other allocations */
    if (!(r->k = cb_alloc(b, HKV_TIER_NEAR, bytes, err)) ||
        !(r->v = cb_alloc(b, HKV_TIER_NEAR, bytes, err)) ||
        !(r->d_nrows = cb_alloc(b, HKV_TIER_WORKSPACE, S * KH * 4, err)) ||
        !(r->d_idx = cb_alloc(b, HKV_TIER_WORKSPACE, S * KH * 4, err)) ||
        !(r->d_o = cb_alloc(b, HKV_TIER_WORKSPACE, S * (size_t)b->qd * 4, err)) ||
        !(r->d_l = cb_alloc(b, HKV_TIER_WORKSPACE, S * b->H * 4, err)) ||
        (r->split_ws_bytes &&
         !(r->split_ws = cb_alloc(b, HKV_TIER_WORKSPACE, r->split_ws_bytes, err))))
        rc = err && err->code ? err->code : HKV_E_NOMEM;
    if (rc) {
        char have[32];
        hkv_fmt_bytes(2.0 * (double)bytes, have, sizeof have);
        return hkv_err_prefix(err, "%d resident sequences of %lld far rows (%s of K and V)",
                              n_slots, (long long)r->cap, have);
    }
    r->n_slots = n_slots;
    return HKV_OK;
}

void cb_resident_destroy(cuda_be *b) {
    cb_resident *r = &b->rs;
    free(r->slot_seq);
    free(r->seq_slot);
    free(r->epoch);
    free(r->lo);
    free(r->hi);
    free(r->h_nrows);
    free(r->h_idx);
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

/* Far positions [from, to) of (slot, layer) up from the far tier: fp16 rows
 * straight from its page-locked memory, 8-bit ones made fp16 on the way
 * (cb_upload_far, as a prompt's streamed keys go). */
static int upload_rows(cuda_be *b, int slot, int layer, const hkv_far_view *fv, int64_t lo,
                       int64_t from, int64_t to, hkv_err *err) {
    cb_resident *r = &b->rs;
    const size_t KH = (size_t)b->KH, d = (size_t)b->d;
    uint16_t *k_l = r->k + (size_t)layer * r->n_slots * KH * r->cap * d,
             *v_l = r->v + (size_t)layer * r->n_slots * KH * r->cap * d;
    int rc;
    for (size_t h = 0; h < KH; h++) {
        const size_t at = (((size_t)slot * KH + h) * r->cap + (size_t)(from - lo)) * d;
        if ((rc = cb_upload_far(b, k_l + at, v_l + at, fv, (int)h, from, to - from, b->st, err)))
            return rc;
    }
    b->stats.bytes_h2d += 2 * KH * (uint64_t)(to - from) * d * 2;
    b->stats.resident_rows_up += to - from;
    return HKV_OK;
}

int cb_resident_step(cuda_be *b, int layer, const hkv_seg *segs, int n_segs, hkv_err *err) {
    cb_resident *r = &b->rs;
    r->n_dec = 0;
    if (!r->n_slots) return HKV_OK;
    hkv_kv *kv = &b->e->kv;
    const int KH = b->KH, NL = b->NL;
    int rc, j = 0, any = 0;
    /* Decode rows in the order cuda_attention.c compacts them. */
    for (int i = 0; i < n_segs; i++) {
        const hkv_seg *sg = &segs[i];
        if ((sg->flags & (HKV_SEG_PROMPT | HKV_SEG_PROMPT_END)) || sg->n > 1) continue;
        int32_t *nr = r->h_nrows + (size_t)j * KH, *ix = r->h_idx + (size_t)j * KH;
        for (int h = 0; h < KH; h++) nr[h] = 0, ix[h] = 0;
        j++;
        if (!cb_far_tokens(b, sg) || hkv_kv_seq_policy(kv, sg->seq, NULL) != &hkv_policy_full ||
            b->kp.h_from[sg->row * KH] >= 0)   /* (a kept set's: not full's) */
            continue;
        hkv_far_view fv;
        if ((rc = hkv_kv_far_view(kv, sg->seq, layer, &fv, err))) return rc;
        /* every slot held, or past what one holds (not within -c): the host attends it */
        const int slot = fv.hi - fv.lo <= r->cap ? take_slot(b, sg->seq) : -1;
        if (slot < 0) {
            cb_fallback(b, HKV_FALLBACK_NO_ROOM);
            continue;
        }
        const size_t m = (size_t)slot * NL + layer;
        const uint64_t ep = hkv_kv_seq_epoch(kv, sg->seq);
        if (r->epoch[m] != ep || r->lo[m] != fv.lo || r->hi[m] > fv.hi) {
            r->epoch[m] = ep, r->lo[m] = r->hi[m] = fv.lo;   /* another sequence's, or rewound */
            b->stats.resident_resyncs++;
        }
        /* all at once when nothing is up yet, then each time a chunk has gathered */
        if (fv.hi - r->hi[m] >= r->chunk || (r->hi[m] == r->lo[m] && fv.hi > fv.lo)) {
            if ((rc = upload_rows(b, slot, layer, &fv, r->lo[m], r->hi[m], fv.hi, err)))
                return hkv_err_prefix(err, "sequence %d, layer %d: far rows to the device",
                                      sg->seq, layer);
            r->hi[m] = fv.hi;
        }
        for (int h = 0; h < KH; h++) {
            nr[h] = (int32_t)(r->hi[m] - r->lo[m]);
            ix[h] = (int32_t)((int64_t)slot * KH * r->cap);   /* row 0 of (slot, KV head 0) */
            b->kp.h_from[sg->row * KH + h] = r->hi[m];
        }
        any++;
    }
    if (!any) return HKV_OK;
    r->n_dec = j;
    b->stats.resident_rows += any;
    if ((rc = cb_stage(b, UP_RNROWS, r->d_nrows, r->h_nrows, (size_t)j * KH * 4, err)) ||
        (rc = cb_stage(b, UP_RIDX, r->d_idx, r->h_idx, (size_t)j * KH * 4, err)))
        return rc;
    return HKV_OK;
}

int cb_resident_attend(cuda_be *b, int layer, int n_dec, float *no, float *nl, hkv_err *err) {
    cb_resident *r = &b->rs;
    if (!r->n_dec) return HKV_OK;
    const size_t lofs = (size_t)layer * r->n_slots * b->KH * r->cap * b->d;
    int split = hkv_gpu_attn_decode_splits(hkv_gpu_ctx_sm_count(b->ctx), n_dec, b->H, b->KH, r->cap);
    if (split > r->split) split = r->split;
    int rc;
    if ((rc = hkv_gpu_attn_decode_split(b->d_q, n_dec, b->H, b->KH, b->d, r->k + lofs, r->v + lofs,
                                        b->d, r->cap * b->d, 0, r->d_nrows, r->d_idx, 0,
                                        1.0f / sqrtf((float)b->d), r->d_o, r->d_l, split,
                                        r->split_ws, r->split_ws_bytes, b->st, err)) ||
        (rc = hkv_gpu_attn_merge(no, nl, r->d_o, r->d_l, (int64_t)n_dec * b->H, b->d, b->st, err)))
        return rc;
    return HKV_OK;
}
