/* The policy interface: what a KV policy sees and decides.
 *
 * A policy instance serves one sequence of the tiered KV cache
 * (kv/kv_tiered.c), so sequences in one batch may run different
 * policies side by side. The cache owns the bytes: the near tier (sinks +
 * local ring) and the far tier (host memory, indexed by position). The
 * policy owns its index (accounted in the INDEX tier) and decides:
 *   selection kind : every decode step, which far tokens each KV head attends to;
 *   eviction kind  : at prompt end, which far tokens are kept at all (its
 *                    select then returns the kept set plus newer tokens);
 *   prefill kind   : how the prompt is processed (hooks added with those policies).
 * Policies call kernels only through cpu/kernels.h. */
#ifndef HKV_POLICY_H
#define HKV_POLICY_H

#include <stdint.h>

#include "host_mem.h"
#include "kernels.h"
#include "kv_shape.h"
#include "status.h"

enum hkv_policy_kind { HKV_POLICY_SELECTION = 0, HKV_POLICY_EVICTION = 1, HKV_POLICY_PREFILL = 2 };

/* A typed parameter with its default and range. A default of NAN means
 * "derived from the context when the sequence opens" (see each policy). */
typedef struct hkv_param_def {
    const char *key;
    double dflt;
    double lo, hi;
    int is_int;
    const char *help;
} hkv_param_def;

#define HKV_POLICY_MAX_PARAMS 16

/* Parameter values in the order of the policy's param table; NAN = unset. */
typedef struct hkv_policy_args {
    double v[HKV_POLICY_MAX_PARAMS];
} hkv_policy_args;

/* The far tier of one (sequence, layer), positions [lo, hi). K and V rows of
 * KV head h, position p, are at k[h] + p*ld and v[h] + p*ld (fp16, d each):
 * position-indexed, so a selected position is directly a row index for the
 * kernels (attn_sparse, score_max take int32 row indices).
 * An 8-bit far tier (hkv_tiered_params.far_q8, --far-kv q8) has k == v ==
 * NULL and its rows in k8/v8 instead: d int8 codes a row (stride ld), each
 * group of HKV_SKETCH_GROUP codes times its scale, ks[h][p * d / 32 + j]
 * (the ctkvr sketch's format, so score_max_i8 scores it). index/far_rows.h
 * reads either format. */
struct hkv_far_accel;

typedef struct hkv_far_view {
    int n_head_kv, head_dim;
    int64_t lo, hi;
    const uint16_t *const *k;
    const uint16_t *const *v;
    int64_t ld;
    const int8_t *const *k8, *const *v8;   /* 8-bit far tier: codes (else NULL) */
    const float *const *ks, *const *vs;    /* and their scales */
    /* After a token-selective prefill (prep HKV_PREP_TSP) the layers past the
     * TSP layer hold K/V only for the propagated positions: rows != NULL
     * lists them (ascending, every one < rows_end) and positions below
     * rows_end that are not listed hold no data. Positions >= rows_end are
     * all present. rows == NULL: every position is present. Only policies of
     * prep HKV_PREP_TSP are given such a sequence (set_policy refuses others).
     * At prefill_end, rows [0, qv->pos0 + qv->n) of k/v hold every present
     * prompt position, sinks and local window included (the cache copies
     * them to the near tier, it does not move them). */
    const int32_t *rows;
    int64_t n_rows, rows_end;
    /* At prefill_end only, may be NULL: a device holding these keys that
     * offers the heavy part of an index build (pipeline/). */
    const struct hkv_far_accel *accel;
    /* Positions [0, shared_hi) are a prefix shared by reference
     * (kv/kv_prefix.h): byte for byte the same rows in every sequence whose
     * view has the same shared_id, for as long as that id is seen (ids are
     * never reused). 0, 0: none. A device may keep one copy of them for all
     * those sequences (pipeline/cuda_resident.c). */
    uint64_t shared_id;
    int64_t shared_hi;
} hkv_far_view;

/* Why work a device offers to take ran on the host instead: the answer of
 * the capability queries below (HKV_FALLBACK_NONE: the device takes it),
 * and the index of the device's fallback counters (pipeline/cuda_backend.h,
 * the timeline's "fallbacks"). A device's refusal is never an error code. */
enum hkv_fallback {
    HKV_FALLBACK_NONE = 0,
    HKV_FALLBACK_SHAPE,            /* heads, head size, group, strides or slots the kernel
                                      does not take */
    HKV_FALLBACK_ABSENT_ROWS,      /* a far view with absent positions (after a
                                      token-selective prefill) */
    HKV_FALLBACK_PARTIAL_REBUILD,  /* an index rebuild of some slots only (a later turn) */
    HKV_FALLBACK_NO_ROOM,          /* no device memory for the work now (a runtime answer:
                                      the capability query said yes) */
    HKV_FALLBACK_BEFORE_SELECTION, /* the policy has no device table for the layer yet (no
                                      prompt end yet; quest: no far token yet) */
    HKV_FALLBACK_CONFIG,           /* the policy's parameters have no device part (rocketkv
                                      rerank > 1) */
    HKV_FALLBACK_POLICY_OOM,       /* the policy's own table could not grow (rocketkv) */
    HKV_FALLBACK_NO_DEVICE_COPY,   /* the device's copy of the near ring is not current (the
                                      first decode step after a prompt end, a rewind) or its
                                      lists are behind the far tier */
    HKV_FALLBACK_SHARED_INDEX,     /* the policy's index is shared with other sequences (a
                                      shared prefix, host path only) */
    HKV_FALLBACK_COUNT
};
/* "shape", "absent_rows", ... (NULL for NONE and past the end). */
const char *hkv_fallback_name(int reason);

/* A device that offers a policy's prompt-end work (pipeline/cuda_index.c).
 * Each op has a capability query, asked once per unit of work (a (sequence,
 * layer) build or scoring): HKV_FALLBACK_NONE when the device takes it,
 * else the reason, which the device counts as that unit's fallback and the
 * caller then does the work on the host. After a yes the op itself returns
 * HKV_OK with *fallback = HKV_FALLBACK_NONE (done on the device) or
 * HKV_FALLBACK_NO_ROOM (nothing written, counted: the host does it), and an
 * error code only for a real failure.
 *
 * top_lists: for n query rows (q fp16 [n][n_head][d], row stride ldq) and
 * each KV head h, the rho positions p of [far->lo, far->hi) with the
 * largest max over h's g query heads of q . k_h[p] (raw dot products, ties
 * to the lower position; all of them when there are at most rho), in no
 * particular order, into ivf + (h*n_slots + slot[h*n + i])*rho, their count
 * into len[h*n_slots + slot]. */
struct hkv_ws_job;
typedef struct hkv_far_accel {
    int (*takes_top_lists)(const struct hkv_far_accel *a, int layer, const hkv_far_view *far,
                           int64_t n, int n_head, int64_t rho, const int32_t *slot,
                           int64_t n_slots);
    int (*top_lists)(const struct hkv_far_accel *a, int layer, const hkv_far_view *far,
                     const uint16_t *q, int64_t ldq, int64_t n, int n_head, int64_t rho,
                     const int32_t *slot, int32_t *ivf, int32_t *len, int64_t n_slots,
                     int *fallback, hkv_err *err);
    /* index/window_scores.h's hkv_ws_window_scores of job (its far view the
     * one this accel came with) on the device: the eviction policies'
     * prompt end. */
    int (*takes_window_scores)(const struct hkv_far_accel *a, const struct hkv_ws_job *job);
    int (*window_scores)(const struct hkv_far_accel *a, const struct hkv_ws_job *job,
                         int *fallback, hkv_err *err);
    void *ud;
    int seq;
} hkv_far_accel;

/* The last queries of the prompt, as the cache kept them for policies that
 * build an index at prompt end: n rows at positions pos0 .. pos0+n-1, each
 * [n_head][d] fp16, row i at q + i*ld. */
typedef struct hkv_query_view {
    int64_t n, pos0;
    const uint16_t *q;
    int64_t ld;
} hkv_query_view;

/* What an instance is created with. */
typedef struct hkv_policy_env {
    hkv_kv_shape shape;
    int64_t n_ctx;               /* the sequence's context capacity */
    int L_init, L_local;         /* near tier sizes */
    const hkv_cpu_kernels *kern;
    hkv_mem_account *mem;
    int n_threads;               /* OpenMP workers that may call select concurrently */
    int far_q8;                  /* the far tier is 8-bit (hkv_far_view's k8/v8) */
} hkv_policy_env;

/* The kernels' score_max and score_max_i8 spread over the threads of a step
 * (kv/kv_tiered_attn.c): the same s[i] as the kernel's call, bit for bit (a
 * row's score does not depend on where it sits in a call, tests/cpu/
 * test_attn.c), computed in pieces by the threads that have no selection of
 * their own left, so one KV head's rerank is not one thread's. */
typedef struct hkv_score_par {
    void (*score_max)(const struct hkv_score_par *p, const float *q, int g, int d,
                      const uint16_t *k, int64_t ld, const int32_t *idx, int64_t n, float *s);
    void (*score_max_i8)(const struct hkv_score_par *p, const float *q, int g, int d,
                         const int8_t *k, int64_t ld, const float *scale, const int32_t *idx,
                         int64_t n, float *s);
    void (*score_max_i4)(const struct hkv_score_par *p, const float *q, int g, int d,
                         const uint8_t *k, int64_t ld, const float *scale, const int32_t *idx,
                         int64_t n, float *s);
    void *ctx;
} hkv_score_par;

/* Per-call scratch the cache gives select (one per thread). */
typedef struct hkv_policy_scratch {
    float *f;           /* floats */
    int32_t *i;         /* int32s */
    int64_t nf, ni;     /* capacities, as asked by scratch_need */
    uint64_t bytes;     /* select adds the bytes it read besides the rows it returns (its
                         * index, the keys it scored); the caller zeroes it and counts the
                         * returned rows itself (hkv_kv_tiered_bytes_read) */
    const hkv_score_par *par;   /* NULL: score with the kernels directly */
} hkv_policy_scratch;

/* select's scoring of many rows: through ws->par where the cache offers it. */
static inline void hkv_policy_score_max(const hkv_policy_scratch *ws, const hkv_cpu_kernels *kn,
                                        const float *q, int g, int d, const uint16_t *k,
                                        int64_t ld, const int32_t *idx, int64_t n, float *s)
{
    if (ws->par)
        ws->par->score_max(ws->par, q, g, d, k, ld, idx, n, s);
    else
        kn->score_max(q, g, d, k, ld, idx, n, s);
}

static inline void hkv_policy_score_max_i8(const hkv_policy_scratch *ws,
                                           const hkv_cpu_kernels *kn, const float *q, int g,
                                           int d, const int8_t *k, int64_t ld,
                                           const float *scale, const int32_t *idx, int64_t n,
                                           float *s)
{
    if (ws->par)
        ws->par->score_max_i8(ws->par, q, g, d, k, ld, scale, idx, n, s);
    else
        kn->score_max_i8(q, g, d, k, ld, scale, idx, n, s);
}

static inline void hkv_policy_score_max_i4(const hkv_policy_scratch *ws,
                                           const hkv_cpu_kernels *kn, const float *q, int g,
                                           int d, const uint8_t *k, int64_t ld,
                                           const float *scale, const int32_t *idx, int64_t n,
                                           float *s)
{
    if (ws->par)
        ws->par->score_max_i4(ws->par, q, g, d, k, ld, scale, idx, n, s);
    else
        kn->score_max_i4(q, g, d, k, ld, scale, idx, n, s);
}

/* A selection policy's device part (the CPU-GPU pipeline, pipeline/): the
 * recall step of select, run on the device over a table the pipeline keeps
 * a mirror of. Per layer the policy owns a table of unit rows, fp16
 * [C][n_head][d] (KV head h's part of a row: the g heads h*g ..), kept as a
 * FIFO per KV head. Recall for a step's query heads: the cosine with each
 * valid row, max over the group, the top k (ties to the older slot). */
typedef struct hkv_recall_table {
    const uint16_t *rows;   /* [C][n_head][d] fp16 */
    int64_t C;              /* slots */
    int64_t k;              /* slots recalled per step and KV head */
    uint64_t version;       /* moves whenever rows changed other than by the
                               `dirty` slots the last call reports */
} hkv_recall_table;

/* The device's recall for one (layer, KV head) of a decode step: n slots and
 * their cosines, best first. */
typedef struct hkv_recalled {
    const int32_t *slot;
    const float *score;
    int64_t n;
} hkv_recalled;

/* An eviction policy's kept set for one layer, for a device that keeps
 * those K/V rows itself (pipeline/cuda_keep.c): select for KV head h returns
 * the positions pos[h*ld .. h*ld + n[h]) that lie in the far view
 * (ascending), then every far position >= from, and nothing else. version
 * moves whenever the layer's kept sets change (a device copy of the rows is
 * current while the version and the cache's sequence epoch hold). */
typedef struct hkv_kept_set {
    const int32_t *pos;     /* [n_head_kv][ld] */
    const int64_t *n;       /* [n_head_kv] */
    int64_t ld;
    int64_t from;
    uint64_t version;
} hkv_kept_set;

/* A selection policy's page bounds for a device that selects itself
 * (pipeline/cuda_pages.c; quest). Per layer fp16 [n_head_kv][np_cap][2d]:
 * page i of KV head h is [max | min], element-wise over the keys of far
 * positions [lo + i*P, lo + (i+1)*P) below hi. As each far token arrives
 * the policy folds it into its page (a page starting at it afresh); a device
 * copy does the same from its own copy of the token, so it moves with the
 * policy's and only a version change (a prompt end) uploads it again.
 * select for KV head h returns the positions of the K pages with the best
 * bound max over the group of sum_e max(q_e*max_e, q_e*min_e) (ties to the
 * lower page), ascending; all of [lo, hi) when hi - lo <= K*P. */
typedef struct hkv_page_table {
    const uint16_t *bounds;   /* [n_head_kv][np_cap][2d] fp16 */
    int64_t np_cap, P, K;
    int64_t lo, hi;           /* far positions [lo, hi) are in the pages */
    uint64_t version;
} hkv_page_table;

/* A two-stage policy's candidate lists for a device that runs stage 2
 * itself (pipeline/cuda_rocket.c; rocketkv with rerank = 1). Per layer and
 * KV head an ascending list of far positions cand[h*cap ..][0..n[h]) and its
 * page bounds bnd [n_head_kv][2d][pcap] fp16 (rows 0..d-1 the max of each
 * page of `page` entries, d..2d-1 the min). As each far token arrives the
 * policy appends it to every list and folds its key into the last page (a
 * page starting at it afresh); a device copy does the same from its own
 * copy of the token, so only a version change (a prompt end, a regrown
 * block) uploads it again. select for KV head h returns the entries of the
 * k best estimates as gpu/rocketkv_hsa.cu computes them (the whole list
 * when it has at most k entries). */
typedef struct hkv_cand_table {
    const int32_t *cand;      /* [n_head_kv][cap] */
    const int64_t *n;         /* [n_head_kv] */
    const uint16_t *bnd;      /* [n_head_kv][2d][pcap] */
    int64_t cap, pcap, page, dims, k;
    int64_t list_hi;          /* far positions >= list_hi are not listed yet */
    uint64_t version;
} hkv_cand_table;

typedef struct hkv_policy_ops {
    /* Prompt end for one layer: the far tier is [lo, hi) and the last
     * queries are in qv (n may be less than asked for a short prompt).
     * Called once per prompt (each turn of a multi-turn conversation). */
    int (*prefill_end)(void *self, int layer, const hkv_far_view *far, const hkv_query_view *qv,
                       hkv_err *err);
    /* During decode, position far->hi - 1 has just entered the far tier. */
    void (*on_far_append)(void *self, int layer, const hkv_far_view *far);
    /* Decode: choose far positions for KV head kvh; q holds its g query
     * heads [g][d] (after RoPE). Writes positions in [far->lo, far->hi) to
     * out (room for max_select) and returns their count (< 0: an HKV_E_*). 
     * May be called concurrently for different (layer, kvh). */
    int64_t (*select)(void *self, int layer, int kvh, const float *q, const hkv_far_view *far,
                      int32_t *out, hkv_policy_scratch *ws);
    /* Upper bound on what select returns with a far tier of n tokens. */
    int64_t (*max_select)(void *self, int64_t n_far);
    /* Scratch select needs for a far tier of n tokens. */
    void (*scratch_need)(void *self, int64_t n_far, int64_t *nf, int64_t *ni);
    /* After a lookahead (prep HKV_PREP_LOOKAHEAD_*; NULL otherwise): the
     * sequence has been rewound to its prompt end, far is [lo, hi) of the
     * prompt again, and qv holds the kept queries up to the last lookahead
     * token: the last prompt queries, then those of the lookahead tokens
     * (positions n .. n+L-1, past every far key). Re-selects from scratch. */
    int (*lookahead_end)(void *self, int layer, const hkv_far_view *far, const hkv_query_view *qv,
                         hkv_err *err);
    /* Token-selective propagation (prep HKV_PREP_TSP; NULL otherwise),
     * runtime/tsp_prefill.c. tsp_layer: for a first prompt of n tokens, the
     * last layer that processes every prompt token, or -1 to prefill
     * normally (nothing would be dropped). tsp_rows: after that layer's
     * prefill_end, the ascending prompt positions whose hidden states go on
     * to the later layers; they include every position the near tier will
     * hold (the L_init sinks, the last L_local) and the observation window.
     * Returns their count (<= cap) or a negative HKV_E_*. */
    int (*tsp_layer)(void *self, int64_t n_prompt);
    int64_t (*tsp_rows)(void *self, int32_t *out, int64_t cap);
    /* The device part (NULL for a policy without one). A policy has at most
     * one of recall_table, kept_set, page_table, cand_table, and the
     * pipeline asks device_takes (its capability query) before reading it:
     * HKV_FALLBACK_NONE when the layer's table can be read now, else why the
     * host selects instead (enum hkv_fallback; the pipeline counts it).
     * device_takes NULL: always. The table ops are not concurrent with
     * select; asked against device_takes' answer they return HKV_E_INVAL.
     * recall_table: the layer's table, its FIFO per KV head into fifo (int32
     * [n_head_kv][2]: oldest slot, slots in use) and, into dirty[n_head_kv],
     * the slot each KV head's select rewrote since the last call (-1: none; a
     * second slot rewritten before the call moves the version instead); the
     * call clears them. select_recalled: select given the device's recall
     * for that KV head, the same result as select. */
    int (*device_takes)(void *self, int layer);
    int (*recall_table)(void *self, int layer, hkv_recall_table *t, int32_t *fifo, int32_t *dirty);
    int64_t (*select_recalled)(void *self, int layer, int kvh, const float *q,
                               const hkv_far_view *far, const hkv_recalled *r, int32_t *out,
                               hkv_policy_scratch *ws);
    /* An eviction policy's kept set (hkv_kept_set); until the layer has one
     * select returns the whole far tier. */
    int (*kept_set)(void *self, int layer, hkv_kept_set *out);
    /* A selection policy's page bounds (hkv_page_table). */
    int (*page_table)(void *self, int layer, hkv_page_table *out);
    /* A two-stage policy's candidate lists (hkv_cand_table). */
    int (*cand_table)(void *self, int layer, hkv_cand_table *out);
    /* Start this instance (just created with the same definition and
     * arguments, before any prompt end) from src's index as of src's first
     * n tokens, where src's prompt ended with nothing decoded since: held by
     * reference where it can, so its bytes count once (a sequence on a
     * shared prefix, kv.h seq_share), or with copy, copied into the
     * instance's own memory (seq_copy: an independent sequence, the index a
     * build from the same rows makes, without the build's time). NULL, or
     * HKV_E_UNSUPPORTED: the caller builds the index from the rows instead.
     * ctkvr only. */
    int (*fork)(void *self, const void *src, int64_t n, int copy, hkv_err *err);
    /* Statistics line for reports (may be NULL). */
    void (*describe)(void *self, char *buf, size_t cap);
    void (*destroy)(void *self);
} hkv_policy_ops;

typedef struct hkv_policy {
    const hkv_policy_ops *ops;
    void *self;
} hkv_policy;

/* What generation does around a policy's prompt (runtime/generate.c). */
enum hkv_policy_prep {
    HKV_PREP_NONE = 0,             /* prefill, then decode */
    HKV_PREP_LOOKAHEAD_TARGET,     /* after prefill: lookahead greedy steps by the target
                                      itself, rewind, lookahead_end (laq) */
    HKV_PREP_LOOKAHEAD_DRAFT,      /* after prefill: the draft model answers, the target
                                      reads that answer, rewind, lookahead_end (speckv) */
    HKV_PREP_TSP,                  /* token-selective propagation inside prefill (fastkv) */
    HKV_PREP_COMPRESS_DRAFT,       /* the draft compresses the prompt before prefill (specpc) */
};

typedef struct hkv_policy_def {
    const char *name;
    int kind;                      /* enum hkv_policy_kind */
    int prep;                      /* enum hkv_policy_prep */
    const char *summary;
    const hkv_param_def *params;
    int n_params;
    /* How many last prompt queries prefill_end wants (0: none). */
    int64_t (*queries_wanted)(const hkv_policy_args *a, const hkv_policy_env *env);
    int (*create)(hkv_policy *out, const hkv_policy_args *a, const hkv_policy_env *env,
                  hkv_err *err);
    /* Lookahead tokens wanted (prep HKV_PREP_LOOKAHEAD_*; may be NULL). */
    int64_t (*lookahead_len)(const hkv_policy_args *a, const hkv_policy_env *env);
} hkv_policy_def;

/* ---- the registry -------------------------------------------------------- */

const hkv_policy_def *hkv_policy_find(const char *name);
/* All registered policies, NULL-terminated. */
const hkv_policy_def *const *hkv_policy_list(void);

/* Parse "KEY=VALUE" into args (checks key and range, names both on error). */
int hkv_policy_args_init(const hkv_policy_def *d, hkv_policy_args *a);
int hkv_policy_arg_set(const hkv_policy_def *d, hkv_policy_args *a, const char *kv, hkv_err *err);
/* Every set value of a within its parameter's range (and an integer where
 * asked): what each policy's create checks, since args may be filled
 * directly rather than through hkv_policy_arg_set. */
int hkv_policy_args_check(const hkv_policy_def *d, const hkv_policy_args *a, hkv_err *err);
/* Value of parameter `key`: the one set, else the default (NAN if derived). */
double hkv_policy_arg(const hkv_policy_def *d, const hkv_policy_args *a, const char *key);
/* Every selection policy's far-token budget when none is given (ctkvr's
 * rho', quest's, snapkv's, rocketkv's, ...): about 3% of the context,
 * rounded to a multiple of 32, clamped to [32, 1024] (CTKVR's ~4% dynamic
 * budget and its 512/1024; the RocketKV and SnapKV papers sweep 256..4096). */
int64_t hkv_policy_default_budget(int64_t n_ctx);

/* Policies (index/): */
extern const hkv_policy_def hkv_policy_full;
extern const hkv_policy_def hkv_policy_oracle;
extern const hkv_policy_def hkv_policy_ctkvr;
extern const hkv_policy_def hkv_policy_quest;
extern const hkv_policy_def hkv_policy_snapkv;
extern const hkv_policy_def hkv_policy_rocketkv;
extern const hkv_policy_def hkv_policy_laq;      /* prep LOOKAHEAD_TARGET */
extern const hkv_policy_def hkv_policy_speckv;   /* prep LOOKAHEAD_DRAFT (--draft MODEL) */
extern const hkv_policy_def hkv_policy_specpc;   /* prep COMPRESS_DRAFT (--draft MODEL) */
extern const hkv_policy_def hkv_policy_fastkv;

#endif
