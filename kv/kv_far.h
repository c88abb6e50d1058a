/* The far tier and its policies as code outside the cache sees them.
 *
 * kv.h is what the forward pass needs of a KV cache. A cache with a near
 * tier (sinks + a local ring) and a far tier chosen from by a per-sequence
 * policy also offers this table, through hkv_kv_ops.far (NULL: no far
 * tier, the plain cache). Its users:
 *   - the device pipeline (pipeline/), which mirrors the near window and
 *     parts of the far tier on the device and runs the device part of a
 *     policy's selection (what a policy exposes to the device is its ops
 *     in index/policy.h: kept_set, page_table, recall_table, cand_table);
 *   - the scheduler and the prompt preps (runtime/), which give sequences
 *     their policies and read the far tier of a prompt just fed.
 * So neither needs the concrete cache (kv_tiered.h, created by the engine).
 * The hkv_kv_* functions below call the table and give every cache without
 * one the same answer (HKV_E_INVAL, as the tiered cache's functions did for
 * another cache, or 0 or NULL). */
#ifndef HKV_KV_FAR_H
#define HKV_KV_FAR_H

#include <stdint.h>

#include "kv.h"
#include "policy.h"
#include "status.h"

/* The near tier's layout: rows = L_init + L_local, sinks first, then the
 * ring, position p >= L_init in slot L_init + (p - L_init) % L_local. A
 * mirror needs it to append a decode token where the cache would. */
typedef struct hkv_near_window {
    int L_init, L_local;
} hkv_near_window;

typedef struct hkv_kv_far_ops {
    /* -- What a device mirrors (pipeline/cuda_attention.c, cuda_keep.c,
     *    cuda_prefill_stream.c, ...). */
    /* The near window's layout (its rows: L_init + L_local). */
    void (*near_window)(const void *self, hkv_near_window *w);
    /* The near tier of (seq, layer): K and V [n_head_kv][rows][d] fp16. After
     * a prompt has ended, a token at position p attends rows
     * [0, min(p + 1, rows)). The device uploads it whole when its mirror is
     * not current (seq_epoch). */
    int (*near)(void *self, int seq, int layer, const uint16_t **k, const uint16_t **v,
                int *rows, hkv_err *err);
    /* The far tier of (seq, layer) as its policy sees it (index/policy.h):
     * the device copies rows from it (a policy's kept set, a prompt's keys
     * streamed to the device attention). */
    int (*far)(void *self, int seq, int layer, hkv_far_view *far, hkv_err *err);
    /* A number that changes whenever seq's stored tokens change other than
     * by appending through layer_step (open, close, a copy into it, a
     * rewind) or its policy is replaced: a device mirror of its near tier or
     * its policy's index is current only while the epoch it saw holds. */
    uint64_t (*seq_epoch)(const void *self, int seq);

    /* -- The sequences' policies. */
    /* The policy a sequence runs (or will run when opened) and its arguments
     * (args may be NULL); NULL when seq is out of range. The scheduler sizes
     * a request's memory with it, lookahead asks for its prep. */
    const hkv_policy_def *(*seq_policy)(const void *self, int seq, hkv_policy_args *args);
    /* Give one sequence another policy (a request's own, the scheduler); if
     * its prompt has ended, the new policy builds its index now from the far
     * tier and the kept queries. */
    int (*set_policy)(void *self, int seq, const hkv_policy_def *d, const hkv_policy_args *a,
                      hkv_err *err);
    /* The policy definition and instance serving an open sequence: the
     * device calls the instance's device ops; the token-selective prefill
     * asks it which rows propagate. */
    int (*seq_instance)(void *self, int seq, const hkv_policy_def **def, hkv_policy *pol,
                        hkv_err *err);
    /* Offer a device's index builds to every prompt end from now on (NULL:
     * stop); the cache fills in the sequence (pipeline/cuda_index.c). */
    void (*set_accel)(void *self, const hkv_far_accel *a);
    /* Lookahead (runtime/lookahead.c): after seq_rewind to the prompt end n,
     * call the sequence's policy's lookahead_end for every layer with the
     * far tier of the prompt and the kept queries of positions up to end
     * (> n: the lookahead tokens' queries stay in the query ring). */
    int (*lookahead_end)(void *self, int seq, int64_t end, hkv_err *err);
    /* Right after a prompt was fed to seq (nothing decoded since): layer's
     * K/V rows of every position [0, len) (lo = 0: sinks and ring included,
     * the far rows hold the whole prompt) and the last kept queries, copied
     * into qbuf (room for qbuf_rows rows of n_head*d fp16). Draft
     * compression (runtime/specpc.c) scores the prompt with them. */
    int (*prompt_view)(void *self, int seq, int layer, hkv_far_view *far, hkv_query_view *qv,
                       uint16_t *qbuf, int64_t qbuf_rows, hkv_err *err);
    /* End seq's prompt at its length, as a segment flagged
     * HKV_SEG_PROMPT_END ending there would: the near tier is made and the
     * policy builds its index over what seq holds; a later segment opens a
     * new turn. The prefix cache does this at a kept prefix's end for
     * policies that share their index, so that the requests starting from
     * it take the index by reference (runtime/scheduler.c, kv.h seq_share). */
    int (*prompt_end)(void *self, int seq, hkv_err *err);

    /* -- The far tier's format (index/far_rows.h). */
    /* 1 when seq's far rows are 8-bit (--far-kv q8), 0 when fp16 (and for a
     * slot out of range or closed: the format its next open gives). */
    int (*seq_far_q8)(const void *self, int seq);
    /* The format slot seq takes at its next seq_open: 0 fp16, 1 8-bit, -1
     * the cache's default; refused while it is open. seq_copy between
     * formats converts the rows (bench: configurations of either format
     * forked from one prefill). */
    int (*set_far_q8)(void *self, int seq, int q8, hkv_err *err);
} hkv_kv_far_ops;

static inline const hkv_kv_far_ops *hkv_kv_far(const hkv_kv *kv) {
    return kv && kv->ops ? kv->ops->far : NULL;
}
/* 1 when kv has a far tier with policies (the device pipeline and the
 * policies need one). */
static inline int hkv_kv_has_far(const hkv_kv *kv) { return hkv_kv_far(kv) != NULL; }

static inline int hkv_kv_no_far(hkv_err *err) {
    return hkv_seterr(err, HKV_E_INVAL, "the KV cache has no far tier (policies need the tiered "
                      "KV cache)");
}

/* The near window; {0, 0} without a far tier. */
static inline hkv_near_window hkv_kv_near_window(const hkv_kv *kv) {
    hkv_near_window w = {0, 0};
    if (hkv_kv_has_far(kv)) hkv_kv_far(kv)->near_window(kv->self, &w);
    return w;
}
static inline int hkv_kv_near(hkv_kv *kv, int seq, int layer, const uint16_t **k,
                              const uint16_t **v, int *rows, hkv_err *err) {
    return hkv_kv_has_far(kv) ? hkv_kv_far(kv)->near(kv->self, seq, layer, k, v, rows, err)
                              : hkv_kv_no_far(err);
}
static inline int hkv_kv_far_view(hkv_kv *kv, int seq, int layer, hkv_far_view *far,
                                  hkv_err *err) {
    return hkv_kv_has_far(kv) ? hkv_kv_far(kv)->far(kv->self, seq, layer, far, err)
                              : hkv_kv_no_far(err);
}
/* 0 without a far tier. */
static inline uint64_t hkv_kv_seq_epoch(const hkv_kv *kv, int seq) {
    return hkv_kv_has_far(kv) ? hkv_kv_far(kv)->seq_epoch(kv->self, seq) : 0;
}
/* NULL without a far tier. */
static inline const hkv_policy_def *hkv_kv_seq_policy(const hkv_kv *kv, int seq,
                                                      hkv_policy_args *args) {
    return hkv_kv_has_far(kv) ? hkv_kv_far(kv)->seq_policy(kv->self, seq, args) : NULL;
}
static inline int hkv_kv_set_policy(hkv_kv *kv, int seq, const hkv_policy_def *d,
                                    const hkv_policy_args *a, hkv_err *err) {
    return hkv_kv_has_far(kv) ? hkv_kv_far(kv)->set_policy(kv->self, seq, d, a, err)
                              : hkv_kv_no_far(err);
}
static inline int hkv_kv_seq_instance(hkv_kv *kv, int seq, const hkv_policy_def **def,
                                      hkv_policy *pol, hkv_err *err) {
    return hkv_kv_has_far(kv) ? hkv_kv_far(kv)->seq_instance(kv->self, seq, def, pol, err)
                              : hkv_kv_no_far(err);
}
/* Nothing without a far tier. */
static inline void hkv_kv_set_far_accel(hkv_kv *kv, const hkv_far_accel *a) {
    if (hkv_kv_has_far(kv)) hkv_kv_far(kv)->set_accel(kv->self, a);
}
static inline int hkv_kv_lookahead_end(hkv_kv *kv, int seq, int64_t end, hkv_err *err) {
    return hkv_kv_has_far(kv) ? hkv_kv_far(kv)->lookahead_end(kv->self, seq, end, err)
                              : hkv_kv_no_far(err);
}
static inline int hkv_kv_prompt_view(hkv_kv *kv, int seq, int layer, hkv_far_view *far,
                                     hkv_query_view *qv, uint16_t *qbuf, int64_t qbuf_rows,
                                     hkv_err *err) {
    return hkv_kv_has_far(kv) ? hkv_kv_far(kv)->prompt_view(kv->self, seq, layer, far, qv, qbuf,
                                                            qbuf_rows, err)
                              : hkv_kv_no_far(err);
}

/* 0 without a far tier. */
static inline int hkv_kv_seq_far_q8(const hkv_kv *kv, int seq) {
    return hkv_kv_has_far(kv) ? hkv_kv_far(kv)->seq_far_q8(kv->self, seq) : 0;
}
static inline int hkv_kv_set_far_q8(hkv_kv *kv, int seq, int q8, hkv_err *err) {
    return hkv_kv_has_far(kv) ? hkv_kv_far(kv)->set_far_q8(kv->self, seq, q8, err)
                              : hkv_kv_no_far(err);
}

static inline int hkv_kv_prompt_end(hkv_kv *kv, int seq, hkv_err *err) {
    return hkv_kv_has_far(kv) ? hkv_kv_far(kv)->prompt_end(kv->self, seq, err) : hkv_kv_no_far(err);
}

#endif
