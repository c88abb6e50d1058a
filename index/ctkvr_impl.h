/* CTKVR internals shared by ctkvr.c (the policy) and ctkvr_build.c (the
 * prompt-end list build, Algorithm 1 of the paper). Not a public header. */
#ifndef HKV_CTKVR_IMPL_H
#define HKV_CTKVR_IMPL_H

#include <stdint.h>

#include "policy.h"

/* One list build: for every KV head h and centroid i < n, the top rho far
 * positions p in [far->lo, far->hi) by max over h's g query heads j of
 * q_i[h*g + j] . k_h[p] (raw dot products, as the paper's scores before the
 * softmax, which is monotonic per head). */
typedef struct hkv_ctkvr_build {
    const hkv_far_view *far;
    const uint16_t *q;     /* centroid queries, row i at q + i*ldq: [n_head][d] fp16 */
    int64_t ldq, n;        /* row stride (elements), number of centroids */
    int n_head;            /* query heads; g = n_head / far->n_head_kv */
    int64_t rho;           /* list length */
    const int32_t *slot;   /* [n_head_kv][n]: where centroid i's list goes for head h */
    int32_t *ivf;          /* [n_head_kv][n_slots][rho] absolute far positions */
    int32_t *len;          /* [n_head_kv][n_slots] valid entries of each list */
    int64_t n_slots;
    int n_threads;         /* OpenMP threads for the build (<= 0: the default) */
} hkv_ctkvr_build;

/* Fills the n lists of every KV head. Lists hold min(rho, hi - lo) positions
 * in no particular order. Workspace (per thread, a few MB, independent of the
 * far tier's length) is accounted as WORKSPACE in mem. */
int hkv_ctkvr_build_lists(const hkv_cpu_kernels *kern, const hkv_ctkvr_build *b,
                          hkv_mem_account *mem, hkv_err *err);

#endif
