/* CTKVR internals shared by ctkvr.c (parameters, select, DCU, lifetime) and
 * ctkvr_build.c (prompt end: Algorithm 1 of the paper). Not a public header. */
#ifndef HKV_CTKVR_IMPL_H
#define HKV_CTKVR_IMPL_H

#include <math.h>
#include <stdint.h>

#include "policy.h"

#define HKV_CTKVR_MAX_D 256   /* head sizes the sketches take (a row on the stack) */

typedef struct ct_conf {
    int64_t C, Cp, rho, rho_p, tail;
    int dcu, sketch;
    float dcu_cos;
} ct_conf;

/* Per (layer, KV head); written only by that pair's select or prefill_end. */
typedef struct ct_head {
    int32_t head, count;    /* FIFO of centroid slots: oldest slot, slots in use */
    int32_t dcu_new;        /* slots select pushed since the last prompt end */
    int32_t dirty;          /* slot select rewrote since recall_table last looked (-1: none,
                               -2: more than one) */
    int64_t steps, cand, raw, uniq, tail;   /* statistics for describe */
    int64_t reranks, surv;  /* sketch: reranks and the candidates they read exact keys of */
    int64_t sk_hi;          /* sketch: far positions below this have their int8 row */
} ct_head;

/* The index of every layer (centroids, lists, their lengths, DCU marks),
 * made at creation. A fork (ctkvr_fork: a sequence that starts
 * with another's prompt) holds it by reference; while more than one
 * instance does, none writes it: each writes the slots it changes into rows
 * of its own (ct_own) and reads the shared rows for the others. */
typedef struct ct_store {
    int refs;               /* instances holding it (changed only between steps) */
    hkv_mem_account *mem;
    uint16_t *cent;
    int32_t *ivf, *len;
    uint8_t *dyn;
    size_t cent_b, ivf_b, len_b, dyn_b;
} ct_store;

/* The slots of one (layer, KV head) an instance holds itself because its
 * store is shared: row r of each array is the slot with map[slot] == r. */
typedef struct ct_own {
    int32_t *map;           /* [C] slot -> own row, -1: the store's; NULL: no own rows */
    uint16_t *cent;         /* [cap][g][d] */
    int32_t *ivf;           /* [cap][rho] */
    int32_t *len;           /* [cap] */
    uint8_t *dyn;           /* [cap] */
    int32_t n, cap;
    size_t map_b, rows_b;
} ct_own;

typedef struct ct_layer {
    uint16_t *cent;         /* [C][n_head][d] fp16, L2-normalised (in the store) */
    int32_t *ivf;           /* [n_head_kv][C][rho] absolute far positions */
    int32_t *len;           /* [n_head_kv][C] valid entries per list */
    uint8_t *dyn;           /* [n_head_kv][C] 1: the slot was made by DCU */
    ct_head *kv;            /* [n_head_kv] */
    int64_t indexed_hi;     /* far positions >= this are the unindexed tail */
    int64_t q_end;          /* position after the last prompt query seen */
    uint64_t version;       /* moves when cent changes other than by a dirty slot */
    int built;
    /* The layer's table as this instance reads it, for a device's mirror
     * (recall_table) when the store is shared or it has own rows: the
     * store's rows with its own rows over them, [C][n_head][d] fp16. Made
     * at the first such call, kept current from then on. */
    uint16_t *mirror;
    uint64_t mirror_ver;    /* the version it was last made whole at */
} ct_layer;

typedef struct ctkvr {
    const hkv_cpu_kernels *kern;
    hkv_mem_account *mem;
    int L, H, KH, g, d, n_threads;
    ct_conf c;
    ct_layer *lay;          /* [n_layer] */
    ct_head *heads;         /* [n_layer][n_head_kv] */
    ct_store *st;           /* its own from creation, or a fork's source's */
    ct_own *own;            /* [n_layer][n_head_kv] */
    /* sketch=1..3: every far key as codes (int8, or 4-bit pairs a byte:
     * hkv_sketch_code_bytes a row) and a scale per 32 values,
     * [n_layer][n_head_kv][cap][row bytes] and [n_layer][n_head_kv][cap][d / 32] */
    int8_t *skc;
    float *sks;
    int far_q8;             /* the far rows the sketches are made from are 8-bit */
    int64_t cap;
    size_t lay_b, heads_b, own_b, skc_b, sks_b;
} ctkvr;

/* A slot's rows, to write: the instance's own, or the store's in place. */
typedef struct ct_slot {
    uint16_t *cent;         /* [g][d] */
    int32_t *ivf, *len;
    uint8_t *dyn;
} ct_slot;

static inline const ct_own *hkv_ctkvr_own(const ctkvr *s, int layer, int kvh)
{
    return &s->own[(size_t)layer * s->KH + (size_t)kvh];
}
/* Own row of slot sl of (layer, kvh), or -1 when it reads the store's. */
static inline int32_t hkv_ctkvr_own_row(const ctkvr *s, int layer, int kvh, int64_t sl)
{
    const ct_own *o = hkv_ctkvr_own(s, layer, kvh);
    return o->map ? o->map[sl] : -1;
}
/* Centroid of slot sl for KV head kvh's g query heads ([g][d], contiguous). */
static inline const uint16_t *hkv_ctkvr_cent(const ctkvr *s, int layer, int kvh, int64_t sl)
{
    const int32_t r = hkv_ctkvr_own_row(s, layer, kvh, sl);
    if (r >= 0) return hkv_ctkvr_own(s, layer, kvh)->cent + (size_t)r * s->g * s->d;
    return s->lay[layer].cent + ((size_t)sl * s->H + (size_t)kvh * s->g) * s->d;
}
static inline const int32_t *hkv_ctkvr_list(const ctkvr *s, int layer, int kvh, int64_t sl,
                                            int32_t *len)
{
    const int32_t r = hkv_ctkvr_own_row(s, layer, kvh, sl);
    const ct_own *o = hkv_ctkvr_own(s, layer, kvh);
    const ct_layer *ly = &s->lay[layer];
    *len = r >= 0 ? o->len[r] : ly->len[(size_t)kvh * s->c.C + sl];
    return r >= 0 ? o->ivf + (size_t)r * s->c.rho : ly->ivf + ((size_t)kvh * s->c.C + sl) * s->c.rho;
}
static inline int hkv_ctkvr_dyn(const ctkvr *s, int layer, int kvh, int64_t sl)
{
    const int32_t r = hkv_ctkvr_own_row(s, layer, kvh, sl);
    return r >= 0 ? hkv_ctkvr_own(s, layer, kvh)->dyn[r] : s->lay[layer].dyn[(size_t)kvh * s->c.C + sl];
}
/* 1 when (layer, kvh) may not write the store in place. */
static inline int hkv_ctkvr_shared(const ctkvr *s) { return s->st->refs > 1; }

/* Slot sl of (layer, kvh) to write (ctkvr.c): its own row, made (and the
 * store's content copied into it) when the store is shared; HKV_E_NOMEM
 * when one cannot be had. May run concurrently for different (layer, kvh). */
int hkv_ctkvr_slot_w(ctkvr *s, int layer, int kvh, int64_t sl, ct_slot *w);


static inline int64_t hkv_min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t hkv_max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Next slot of a KV head's FIFO: an unused one while there are, else the oldest. */
static inline int32_t hkv_ctkvr_fifo_push(ct_head *hd, int64_t C)
{
    int32_t s;
    if (hd->count < C) {
        s = (int32_t)((hd->head + hd->count) % C);
        hd->count++;
    } else {
        s = hd->head;
        hd->head = (int32_t)((hd->head + 1) % C);
    }
    return s;
}

/* Unit-norm fp16 copy of a query head (zeros for a zero vector). */
static inline void hkv_ctkvr_store_unit(const hkv_cpu_kernels *kern, float *x, int d, uint16_t *dst)
{
    double ss = 0;
    for (int i = 0; i < d; i++) ss += (double)x[i] * x[i];
    float r = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
    for (int i = 0; i < d; i++) x[i] *= r;
    kern->f32_to_f16(x, dst, d);
}

/* The sketches (ctkvr_sketch.c). The rows of every KV head of a layer up
 * to far->hi, in parallel over heads; */
void hkv_ctkvr_sketch_layer(ctkvr *s, int layer, const hkv_far_view *far);
/* bytes of one row's codes; */
/* select's rerank of cand[0..n) on them (see ctkvr_sketch.c); with n_dcu,
 * the DCU's list into surv where made on the way (the top rho by the
 * sketch's score, a set of indices into cand), *n_dcu of them. */
int64_t hkv_ctkvr_rerank_sketch(ctkvr *s, int layer, int kvh, const float *q,
                                const hkv_far_view *far, const int32_t *cand, int64_t n, float *a,
                                float *lb, float *ub, int32_t *surv, int32_t *sp, int32_t *pick,
                                int32_t *tsc, uint32_t *bits, int32_t *out, int64_t *n_dcu,
                                hkv_policy_scratch *ws);

/* The policy's prefill_end (ctkvr_build.c). */
int hkv_ctkvr_prefill_end(void *self, int layer, const hkv_far_view *far,
                          const hkv_query_view *qv, hkv_err *err);

/* One list build: for every KV head h and centroid i < n, the top rho far
 * positions p in [far->lo, far->hi) by max over h's g query heads j of
 * q_i[h*g + j] . k_h[p]. Raw dot products: the paper takes the group max of
 * per-head softmax scores, which shifts each head by its own log-sum-exp;
 * raw scores are what the rerank's score_max compares, so index and rerank
 * rank keys alike. */
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
