/* A kept set per (layer, KV head), chosen by window scores: the selection
 * machinery laq and speckv share (snapkv's shape, with a sum or max
 * reduction and a re-selection that may bring back what an earlier
 * selection dropped). Private to index/. */
#ifndef HKV_KEEPSET_H
#define HKV_KEEPSET_H

#include "window_scores.h"

typedef struct hkv_keepset {
    const hkv_cpu_kernels *kern;
    hkv_mem_account *mem;
    int L, KH, H, d, n_threads;
    int64_t budget, lo;
    int32_t *kept;        /* [L][KH][budget] ascending positions < sel_hi[l] */
    int64_t *n_kept;      /* [L][KH] */
    int64_t *sel_hi;      /* [L] far tier end at the selection: later far tokens are always selected */
    int *done;            /* [L] a selection exists */
    int64_t *scored;      /* [L] far tokens scored by the last selection */
    uint64_t version;     /* moves at every selection (of any layer) */
    size_t kept_b, n_kept_b, sel_hi_b, done_b, scored_b;
} hkv_keepset;

/* budget: far tokens per KV head (clamped to n_ctx). who names the policy in errors. */
int hkv_keepset_init(hkv_keepset *k, const hkv_policy_env *env, int64_t budget, const char *who,
                     hkv_err *err);
void hkv_keepset_free(hkv_keepset *k);

/* Check a far view against the shape. */
int hkv_keepset_check(const hkv_keepset *k, int layer, const hkv_far_view *far, const char *who,
                      hkv_err *err);

/* (Re)select layer's kept sets from scratch over far [lo, hi): window
 * scores of the rows of qv (sum or max over rows and group heads), max
 * pooling with `kernel` (-inf padding, i.e. clipped), the top budget per KV
 * head, far positions >= force_from first. A far tier within the budget is
 * kept whole; with no queries the most recent far tokens are kept. */
int hkv_keepset_select(hkv_keepset *k, int layer, const hkv_far_view *far,
                       const hkv_query_view *qv, int reduce_max, int kernel, int64_t force_from,
                       hkv_err *err);

/* The kept set of (layer, kvh) inside far, then every far token past the
 * selection. Returns the count. */
int64_t hkv_keepset_pick(const hkv_keepset *k, int layer, int kvh, const hkv_far_view *far,
                         int32_t *out);
/* The layer's kept sets for a device that holds their rows (policy.h's
 * device_takes and kept_set ops): none before the layer's first selection. */
int hkv_keepset_takes(const hkv_keepset *k, int layer);
int hkv_keepset_kept(const hkv_keepset *k, int layer, hkv_kept_set *out);
int64_t hkv_keepset_max_select(const hkv_keepset *k, int64_t n_far);
/* Layers selected, mean kept and scored far tokens per KV head. */
void hkv_keepset_stats(const hkv_keepset *k, int *layers, double *kept, double *scored);

#endif
