/* Private to kv_tiered*.c: the per-sequence state of the tiered cache. */
#ifndef HKV_KV_TIERED_IMPL_H
#define HKV_KV_TIERED_IMPL_H

#include "far_rows.h"
#include "kv_cow.h"
#include "kv_prefix.h"
#include "kv_score_team.h"
#include "kv_tiered.h"

/* Rows a layer step stores without an OpenMP team (a decode batch's). */
#define HKV_TIERED_SERIAL_ROWS 64

/* The positions a layer holds after a token-selective prefill (fastkv):
 * rows[0..n) ascending, all < end; positions >= end are all present. */
typedef struct tsp_list {
    int32_t *rows;
    int64_t n, end;
    size_t bytes;
} tsp_list;

typedef struct tseq {
    int open;
    int q8;                   /* its far tier is 8-bit (set at seq_open from q8_next) */
    int q8_next;              /* the format the slot's next seq_open gives: -1 the cache's
                                 (p.far_q8), 0 fp16, 1 8-bit (kept across close) */
    int64_t cap, len;
    int64_t stride;           /* far rows per (layer, KV head) run: cap rounded to pages */
    hkv_kv_prefix *pre;       /* NULL, or the shared prefix mapped over far rows [0, pre_rows) */
    int64_t pre_rows;
    int prompt_done;          /* a prompt end has been processed (policy index exists) */
    int *prompt_open;         /* [n_layer]: a prompt is being fed to this layer */
    int64_t *far_hi;          /* [n_layer]: far tier is positions [L_init, far_hi) */
    int64_t *fed;             /* [n_layer]: end of the rows an open prompt has written (a
                                 staged prefill feeds layers at different times) */
    tsp_list *tsp;            /* [n_layer] or NULL: present positions after a token-selective
                                 prefill (kv_tiered_tsp.c) */
    uint16_t *near_k, *near_v;    /* [n_layer][KH][NR][d]: sinks then ring slots */
    uint16_t *far_k, *far_v;      /* [n_layer][KH][cap][d], position-indexed */
    hkv_pinned far_kb, far_vb;    /* their allocations (page-locked with pin_far and a device) */
    uint16_t *qh;             /* [n_layer][q_keep][H d]: ring of recent queries, slot p % q_keep */
    hkv_pinned qh_b;          /* its pages (a mapping of its own: qh_cow can be mapped over it) */
    hkv_kv_cow *qh_cow;       /* NULL, or the ring's bytes shared copy-on-write with forks */
    size_t qh_cut;            /* INDEX bytes taken off for the ring's shared pages */
    int qh_dirty;             /* written since qh_cow was mapped (a new share makes a new one) */
    int64_t q_keep;
    const uint16_t **kptr, **vptr;  /* [n_layer][KH]: far row bases for far views (fp16) */
    const int8_t **k8ptr, **v8ptr;  /* [n_layer][KH]: the same, 8-bit far tier: codes */
    const float **ksptr, **vsptr;   /* and scales */
    size_t near_bytes, far_bytes, qh_bytes;
    const hkv_policy_def *def;
    hkv_policy_args args;
    hkv_policy pol;
    hkv_tiered_audit audit;
    uint64_t epoch;           /* changes when the stored tokens change other than by appending
                                 (open, close, copy into, rewind) or the policy is
                                 replaced: kv_far.h, seq_epoch */
} tseq;

typedef struct tiered {
    hkv_kv_shape s;
    hkv_tiered_params p;
    int NR;                   /* near rows = L_init + L_local */
    int max_seqs;
    const hkv_cpu_kernels *kern;
    hkv_mem_account *mem;
    hkv_pinned_account pin;   /* page-locked far-tier bytes (pin_far with a CUDA device) */
    tseq *seqs;
    uint64_t epoch;           /* the last epoch handed out */
    hkv_far_accel accel;      /* offered to prefill_end when accel.top_lists is set */
    /* Per-thread scratch of layer_step, grown on demand (WORKSPACE tier). */
    float *scratch;
    size_t scratch_bytes;
    /* The split decode step's per-item state (kv_tiered_attn.c), grown on
     * demand (WORKSPACE tier). */
    float *split;
    size_t split_bytes;
    /* The step's scoring spread over its threads (kv_score_team.h), made
     * for the thread count of the first wide step (again if it changes). */
    hkv_score_team team;
    /* Bytes the decode steps read from the cache and the policies' indices
     * (hkv_kv_tiered_bytes_read), added with atomics by the step's threads. */
    uint64_t bytes_read;
} tiered;

static inline uint16_t *near_rows(const tiered *t, const tseq *q, uint16_t *base, int layer,
                                  int h) {
    (void)q;   /* near rows do not depend on the sequence's capacity */
    return base + (((size_t)layer * t->s.n_head_kv + h) * t->NR) * t->s.head_dim;
}
static inline uint16_t *far_rows(const tiered *t, const tseq *q, uint16_t *base, int layer,
                                 int h) {
    return base + (((size_t)layer * t->s.n_head_kv + h) * q->stride) * t->s.head_dim;
}
/* The 8-bit far tier (q->q8): a buffer holds the codes of every (layer,
 * KV head) run, [n_layer][KH][stride][d] int8, then their scales,
 * [n_layer][KH][stride][d / HKV_Q8_GROUP] fp32. */
static inline int8_t *far_codes(const tiered *t, const tseq *q, void *base, int layer, int h) {
    return (int8_t *)base + ((size_t)layer * t->s.n_head_kv + h) * q->stride * t->s.head_dim;
}
static inline float *far_scales(const tiered *t, const tseq *q, void *base, int layer, int h) {
    const size_t runs = (size_t)t->s.n_layer * t->s.n_head_kv, ng = t->s.head_dim / HKV_Q8_GROUP;
    return (float *)((int8_t *)base + runs * q->stride * t->s.head_dim) +
           ((size_t)layer * t->s.n_head_kv + h) * q->stride * ng;
}
/* Store K/V row x (d floats) at position p of (q, layer, h) in the far
 * tier's format. */
static inline void far_store(const tiered *t, const tseq *q, void *base, int layer, int h,
                             int64_t p, const float *x) {
    const int d = t->s.head_dim;
    if (q->q8)
        hkv_q8_quantize(x, d, far_codes(t, q, base, layer, h) + p * d,
                        far_scales(t, q, base, layer, h) + p * (d / HKV_Q8_GROUP));
    else
        t->kern->f32_to_f16(x, (uint16_t *)base + (((size_t)layer * t->s.n_head_kv + h) * q->stride + p) * d, d);
}
static inline int64_t ring_slot(const tiered *t, int64_t pos) {
    return t->p.L_init + (pos - t->p.L_init) % t->p.L_local;
}

void tiered_far_view(const tiered *t, const tseq *q, int layer, hkv_far_view *v);
/* 1 when each sequence's far tier is on its own node and its far work is
 * claimed there first (kv_tiered_params.h, HKV_FAR_NUMA_SPREAD). */
int tiered_far_spread(const tiered *t);
/* Give up q's mapping of its shared prefix (kv_prefix.h): with keep, q gets
 * its own copy of those rows (before it writes below them); without (it is
 * closing), the mapping goes with its far rows. */
int tiered_prefix_unmap(tiered *t, tseq *q, int keep, hkv_err *err);
/* q lets go of the copy-on-write buffer its kept queries map (the
 * mapping stays until seq_free unmaps the ring or another is mapped over
 * it) and its ring is accounted whole again. */
void tiered_queries_unshare(tiered *t, tseq *q);
/* seq_copy and seq_share (kv.h), in kv_tiered_fork.c. */
int tiered_seq_copy(void *self, int dst, int src, hkv_err *err);
int tiered_seq_share(void *self, int dst, int src, int64_t n, unsigned flags, hkv_err *err);
/* q's policy built from scratch; if a prompt has ended, its index too. */
int tiered_policy_rebuild(tiered *t, tseq *q, hkv_err *err);
/* As tiered_policy_rebuild; with src (q's tokens are src's, its prompt
 * ended at its length), the index from src's where the policy can
 * (index/policy.h, fork): held by reference, or with copy copied into q's
 * own; else built from q's rows. */
int tiered_policy_make(tiered *t, tseq *q, const tseq *src, int copy, hkv_err *err);
/* The near tier of (q, layer) from the far rows, as of `end` tokens: the
 * sinks and the ring's positions. */
void tiered_near_from_far(tiered *t, tseq *q, int layer, int64_t end);
int tiered_prompt_end(tiered *t, tseq *q, int layer, int64_t end, hkv_err *err);
/* Rewind (kv_tiered_lookahead.c): drop positions >= n. */
int tiered_seq_rewind(void *self, int seq, int64_t n, hkv_err *err);
/* Token-selective prefill (kv_tiered_tsp.c). */
int tiered_tsp_note(tiered *t, tseq *q, int layer, const hkv_seg *sg, hkv_err *err);
void tiered_tsp_free(tiered *t, tseq *q);
/* A rewind to n drops the listed positions >= n. */
void tiered_tsp_rewind(tiered *t, tseq *q, int64_t n);
int tiered_tsp_copy(tiered *t, tseq *d, const tseq *s, hkv_err *err);
/* The present positions <= p_last of (q, layer) into idx (ascending); count. */
int64_t tiered_tsp_rows_upto(const tsp_list *tl, int64_t p_last, int32_t *idx);
/* Position of row i of a segment. */
static inline int64_t seg_pos(const hkv_seg *sg, int64_t i) {
    return sg->pos_list ? sg->pos_list[i] : sg->pos + i;
}
/* Audit of one decode row (kv_tiered_audit.c): the policy's partial o_pol
 * against near + every far row, and its recall of the top-k; rows, top,
 * mark hold the far range's size, work HKV_TOPK_SCRATCH of it; o2, l2: room
 * for a partial; tile: fp16 tiles of HKV_TIERED_PIECE K and V rows (an
 * 8-bit far tier, else NULL). */
void tiered_audit_row(tiered *t, tseq *q, int layer, int kvh, const float *qv, const float *o_pol,
                      const float *o_near, const float *lse_near, const int32_t *sel, int64_t n_sel,
                      const hkv_far_view *fv, float *tmp_o, float *tmp_l, float *scores,
                      int32_t *rows, int32_t *top, int32_t *work, int32_t *mark, float *o2,
                      float *l2, uint16_t *tile);
/* A decode row's far attention is computed in pieces of this many rows
 * (kv_tiered_attn.c, FAR_PIECE). */
#define HKV_TIERED_PIECE 512
/* An attention item: one KV head of a segment, a tile of its queries. */
typedef struct tiered_item { int seg, kvh, q0, nq; } tiered_item;
/* A prompt segment (several rows, or flagged): causal attention. */
int tiered_is_prompt(const hkv_seg *sg);
/* A decode row attends every position in place, from its far rows (which
 * hold them all, kv_tiered.c): `full` on the host path. The far-only step
 * (the device attends the near tier) and the audit keep the near/far split. */
int tiered_dense_in_place(const tiered *t, const tseq *q, const float *lse_out);
/* Pieces of a row's range [0, pos] that lie in its shared prefix, computed
 * once for every row on the prefix (tiered_cascade_run). */
int64_t tiered_shared_pieces(const tseq *q, int64_t pos);
/* The rows' partials over their shared pieces (kv_tiered_cascade.c): item w
 * starts from slot of[w] (-1: from the empty partial). */
typedef struct tiered_cascade {
    int *of;          /* item -> member slot, or -1 */
    float *o, *l;     /* [slot][g][d], [slot][g] */
    int n;
} tiered_cascade;
int tiered_cascade_run(tiered *t, int layer, const hkv_seg *segs, const tiered_item *items,
                       int n_items, const float *qkv, int64_t ld_qkv, float scale, tiered_cascade *c,
                       hkv_err *err);
void tiered_cascade_free(tiered_cascade *c);
/* Attention of all segments (after their K/V are in place). With lse_out
 * (far-only mode, hkv_kv_ops.layer_step_far) decode rows get only the far
 * partial and every row's lse goes to lse_out[row * n_head + head]. */
int tiered_attend(tiered *t, int layer, const hkv_seg *segs, int n_segs, const float *qkv,
                  int64_t ld_qkv, float *out, int64_t ld_out, float *lse_out,
                  const hkv_recall_rows *rec, hkv_err *err);

/* Entries of the far tier's table (kv_far.h, hkv_kv_far_ops) defined in
 * kv_tiered_lookahead.c and kv_tiered_tsp.c. */
int tiered_lookahead_end(void *self, int seq, int64_t end, hkv_err *err);
int tiered_prompt_view(void *self, int seq, int layer, hkv_far_view *far, hkv_query_view *qv,
                       uint16_t *qbuf, int64_t qbuf_rows, hkv_err *err);
const hkv_policy_def *tiered_seq_policy(const void *self, int seq, hkv_policy_args *args);
int tiered_seq_instance(void *self, int seq, const hkv_policy_def **def, hkv_policy *pol,
                        hkv_err *err);

#endif
