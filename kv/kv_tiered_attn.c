/* Attention in the tiered cache.
 *   prompt segments: causal attention over the far rows (which hold every
 *     token while a prompt is fed), in query tiles, as the plain cache does;
 *   decode rows: dense attention over the near tier, sparse attention over
 *     the far positions the policy selects, and the exact merge of the two;
 *     under `full` (on the host path, no audit), dense attention over every
 *     position from the far rows in place, in pieces from position 0, the
 *     pieces of a prefix that several rows share by reference computed once
 *     for all of them (cascade attention, below).
 * Audit mode also computes dense attention over the whole far tier and the
 * oracle's top-k, and accumulates the policy's error and recall. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kv_tiered_impl.h"

#define QTILE 32
/* A decode row's far attention is computed in pieces of this many selected
 * rows, merged in order into the near partial. Fixed, so the arithmetic is
 * the same whether one thread runs the pieces in turn or several run them
 * side by side (a batch of one on many threads): a row's result never depends
 * on the batch or the thread count. 512: a 1K context's far tier is two
 * pieces, so a batch of one with 3 KV heads keeps 2 threads busy (one piece
 * per thread and head would leave one idle a third of the time). The pieces
 * of a shared prefix may come from the cascade (kv_tiered_cascade.c). */
#define FAR_PIECE HKV_TIERED_PIECE

typedef tiered_item item;

/* A decode item's far work, kept from selection to the merge when the step
 * is split across threads by pieces; the near rows are a piece of their own
 * then (n_near > 0), so that no thread waits on another's near attention. */
typedef struct far_work {
    const uint16_t *k, *v;   /* this KV head's far rows */
    const int8_t *k8, *v8;   /* or, 8-bit far tier (k8 != NULL), its codes and scales */
    const float *ks, *vs;
    int64_t ld, p0, n_sel;   /* sel == NULL: rows p0 .. p0 + n_sel - 1 */
    const int32_t *sel;
    const uint16_t *nk, *nv;   /* the near rows (ld d) */
    int64_t n_near;
    int64_t a0;              /* selected rows before a0: in the slot's partial already (the
                                cascade's shared pieces) */
} far_work;

/* fp16 tiles for an 8-bit far tier's rows, per thread, K then V (V right
 * after the n rows of K a call makes): at least a piece and a prompt tile's
 * rows past its last whole piece; a prompt's whole prefix where it is at
 * most p.q8_prompt_whole rows (need.q8_rows). */
#define Q8_TILE_ROWS (FAR_PIECE + QTILE)
/* The default of p.q8_prompt_whole: 4 MiB of tiles a thread at d 128. */
#define Q8_PROMPT_WHOLE 8192

/* Attention over pieces [a, b) of a decode item's far selection. */
static void far_piece(const hkv_cpu_kernels *kn, const float *qv, int g, int d, const far_work *f,
                      int64_t a, int64_t b, float scale, float *o, float *l) {
    if (f->k8) {   /* the codes straight into the kernel's tiles */
        const int64_t at = f->sel ? 0 : f->p0 + a, ng = d / HKV_Q8_GROUP;
        kn->attn_q8(qv, g, d, f->k8 + at * f->ld, f->ks + at * ng, f->v8 + at * f->ld,
                    f->vs + at * ng, f->ld, f->sel ? f->sel + a : NULL, b - a, scale, o, l);
        return;
    }
    if (f->sel)
        kn->attn_sparse(qv, g, d, f->k, f->v, f->ld, f->sel + a, b - a, scale, o, l);
    else
        kn->attn_dense(qv, g, d, f->k + (f->p0 + a) * f->ld, f->v + (f->p0 + a) * f->ld, f->ld, b - a,
                       scale, o, l);
}

static int64_t n_pieces(int64_t n_sel) { return (n_sel + FAR_PIECE - 1) / FAR_PIECE; }

typedef struct need {
    int64_t max_sel, pol_f, pol_i, far;   /* over the batch's decode rows */
    int64_t tsp_idx;     /* prompt rows over a layer's present positions (kv_tiered_tsp.c) */
    int q8;              /* a sequence with an 8-bit far tier: the threads' fp16 tiles */
    int64_t q8_rows;     /* rows of those tiles (Q8_TILE_ROWS, or a whole prompt prefix) */
} need;

int tiered_is_prompt(const hkv_seg *sg) {
    return (sg->flags & (HKV_SEG_PROMPT | HKV_SEG_PROMPT_END)) || sg->n > 1;
}

int tiered_dense_in_place(const tiered *t, const tseq *q, const float *lse_out) {
    return q->def == &hkv_policy_full && !lse_out && !t->p.audit && !q->tsp && !q->q8;
}

int64_t tiered_shared_pieces(const tseq *q, int64_t pos) {
    int64_t n = (q->pre_rows < pos + 1 ? q->pre_rows : pos + 1) / HKV_TIERED_PIECE;
    return q->pre ? n : 0;
}

/* Per-thread scratch layout, in floats (int32 parts share the buffer). */
static size_t per_thread_floats(const tiered *t, const need *nd) {
    const int g = t->s.n_head / t->s.n_head_kv, d = t->s.head_dim;
    size_t f = 2 * (size_t)QTILE * g * d + QTILE * (size_t)g;   /* q tile, out tile, lse */
    f += 5 * (size_t)g * d + 5 * (size_t)g;                      /* partials */
    f += (size_t)nd->max_sel + (size_t)nd->pol_f + (size_t)nd->pol_i + (size_t)nd->tsp_idx;
    if (t->p.audit) f += 4 * (size_t)nd->far + HKV_TOPK_SCRATCH(nd->far); /* scores, 3 int arrays, topk's */
    if (nd->q8) f += (size_t)nd->q8_rows * d + 16;   /* K and V fp16 tiles (2 halves a float) */
    return (f + 15) & ~(size_t)15;
}

static int ensure_scratch(tiered *t, size_t bytes, hkv_err *err) {
    if (bytes <= t->scratch_bytes) return HKV_OK;
    hkv_host_free(t->mem, HKV_TIER_WORKSPACE, t->scratch, t->scratch_bytes);
    t->scratch_bytes = 0;
    t->scratch = hkv_host_alloc(t->mem, HKV_TIER_WORKSPACE, bytes, err);
    if (!t->scratch) return HKV_E_NOMEM;
    t->scratch_bytes = bytes;
    return HKV_OK;
}


/* A layer's attention step, shared by the threads of its one parallel
 * region: the items, then (split) the decode rows' pieces. */
typedef struct layer_step {
    tiered *t;
    int layer, KH, g, d, split;
    float scale;
    need nd;
    const hkv_seg *segs;
    const hkv_recall_rows *rec;
    const float *qkv;
    int64_t ld_qkv, ld_out;
    float *out, *lse_out;
    const item *items;
    int n_items, n_dec;
    const int *dec_of;
    int *pending, *ready;
    far_work *fw;
    int64_t P1;                        /* pieces a decode slot: near, then far */
    float *sq, *so, *sl, *po, *pl;     /* queries, partials, pieces' partials */
    int32_t *ssel;                     /* the slots' selections */
    int next_item, fail;               /* shared: the next item to claim; a failed selection */
    int items_done;                    /* shared: items finished (their selections made) */
    hkv_score_team *team;              /* NULL: each selection scores alone */
    int64_t next_piece;
    const int *casc_of;                /* item -> its cascade partial, or -1 (NULL: none) */
    const float *casc_o, *casc_l;      /* the partials over the rows' shared pieces */
    size_t per;                        /* floats of a thread's scratch */
} layer_step;

/* A thread's fp16 tiles for an 8-bit far tier: the last floats of its
 * scratch (per_thread_floats). */
static uint16_t *q8_tile(const layer_step *st, float *base) {
    return st->nd.q8 ? (uint16_t *)(base + st->per - ((size_t)st->nd.q8_rows * st->d + 16)) : NULL;
}

/* Rows of a prompt that an 8-bit tile takes whole (p.q8_prompt_whole). */
static int64_t q8_whole(const tiered *t) {
    return t->p.q8_prompt_whole > 0 ? t->p.q8_prompt_whole : Q8_PROMPT_WHOLE;
}

/* A prompt tile's causal attention over an 8-bit far tier, from fp16
 * tiles: a prefix of at most q8_whole rows whole, in the causal kernel the
 * fp16 tier uses; a longer one from its last whole piece on causally, then
 * each whole piece before (every query sees all of it) merged in order.
 * Which path depends on the positions alone, never on the tile's thread. */
static void prompt_q8(const tiered *t, const tseq *q, int layer, int kvh, const float *qb, int nq,
                      int64_t p0, float scale, float *ob, float *lb, float *o2, float *l2,
                      uint16_t *tile) {
    const hkv_cpu_kernels *kn = t->kern;
    const int g = t->s.n_head / t->s.n_head_kv, d = t->s.head_dim;
    const int64_t B = p0 + nq <= q8_whole(t) ? 0 : p0 / FAR_PIECE * FAR_PIECE;
    uint16_t *tk = tile, *tv = tile + (size_t)(p0 + nq - B) * d;
    hkv_far_view fv;
    tiered_far_view(t, q, layer, &fv);
    hkv_far_gather16(kn, &fv, kvh, NULL, B, p0 + nq - B, tk, tv);
    hkv_attn_causal_for(kn)(qb, (int64_t)g * d, nq, g, d, p0 - B, tk, tv, d, scale, ob,
                            (int64_t)g * d, lb);
    tv = tile + (size_t)FAR_PIECE * d;
    for (int64_t a = 0; a < B; a += FAR_PIECE) {
        hkv_far_gather16(kn, &fv, kvh, NULL, a, FAR_PIECE, tk, tv);
        for (int r = 0; r < nq; r++) {
            kn->attn_dense(qb + (size_t)r * g * d, g, d, tk, tv, d, FAR_PIECE, scale, o2, l2);
            hkv_attn_merge(ob + (size_t)r * g * d, lb + (size_t)r * g, o2, l2, g, d);
        }
    }
}


/* One attention item: a prompt tile's causal attention, or a decode row's
 * near and far attention and its merge; with split, the decode row's
 * selection and the pieces it leaves for run_pieces. base: the thread's
 * scratch. */
static void attend_item(layer_step *st, int w, float *base, int tid) {
    tiered *t = st->t;
    const int layer = st->layer, KH = st->KH, g = st->g, d = st->d, split = st->split;
    const float scale = st->scale;
    const hkv_cpu_kernels *kn = t->kern;
    const need nd = st->nd;
    const hkv_seg *segs = st->segs;
    const hkv_recall_rows *rec = st->rec;
    const float *qkv = st->qkv;
    const int64_t ld_qkv = st->ld_qkv, ld_out = st->ld_out;
    float *out = st->out, *lse_out = st->lse_out;
    const item *items = st->items;
    const int *dec_of = st->dec_of;
    int *pending = st->pending;
    far_work *fw = st->fw;
    float *sq = st->sq, *so = st->so, *sl = st->sl;
    int32_t *ssel = st->ssel;
    float *qb = base, *ob = qb + (size_t)QTILE * g * d, *lb = ob + (size_t)QTILE * g * d;
    float *o2 = lb + (size_t)QTILE * g, *l2 = o2 + (size_t)g * d;      /* far partial */
    float *o_near = l2 + g, *l_near = o_near + (size_t)g * d;            /* audit: near copy */
    float *ta = l_near + g, *tl = ta + 2 * (size_t)g * d;                /* audit: dense ref */
    int32_t *sel = (int32_t *)(tl + 2 * (size_t)g);
    hkv_policy_scratch ps = {.f = (float *)(sel + nd.max_sel), .nf = nd.pol_f,
                             .i = (int32_t *)((float *)(sel + nd.max_sel) + nd.pol_f), .ni = nd.pol_i,
                             .par = st->team ? hkv_score_team_par(st->team, tid) : NULL};
    float *au = (float *)(ps.i + nd.pol_i);
    int32_t *tidx = (int32_t *)(au + (t->p.audit ? 4 * (size_t)nd.far + HKV_TOPK_SCRATCH(nd.far) : 0));
    const item *I = &items[w];
    const hkv_seg *sg = &segs[I->seg];
    tseq *q = &t->seqs[sg->seq];
    for (int r = 0; r < I->nq; r++)
        memcpy(qb + (size_t)r * g * d, qkv + (sg->row + I->q0 + r) * ld_qkv + (size_t)I->kvh * g * d,
               (size_t)g * d * sizeof(float));
    const tsp_list *tsl = q->tsp && q->tsp[layer].rows ? &q->tsp[layer] : NULL;
    if (tiered_is_prompt(sg) && tsl) {
        /* After a token-selective prefill: causal over the present
         * positions only; each query sees a prefix of the tile's list. */
        int64_t n_idx = tiered_tsp_rows_upto(tsl, seg_pos(sg, I->q0 + I->nq - 1), tidx), c = 0;
        for (int r = 0; r < I->nq; r++) {
            int64_t p = seg_pos(sg, I->q0 + r);
            while (c < n_idx && tidx[c] <= p) c++;
            kn->attn_sparse(qb + (size_t)r * g * d, g, d, far_rows(t, q, q->far_k, layer, I->kvh),
                            far_rows(t, q, q->far_v, layer, I->kvh), d, tidx, c, scale,
                            ob + (size_t)r * g * d, lb + (size_t)r * g);
        }
    } else if (tiered_is_prompt(sg) && q->q8) {
        prompt_q8(t, q, layer, I->kvh, qb, I->nq, sg->pos + I->q0, scale, ob, lb, o2, l2,
                  q8_tile(st, base));
    } else if (tiered_is_prompt(sg)) {
        hkv_attn_causal_for(kn)(qb, (int64_t)g * d, I->nq, g, d, sg->pos + I->q0,
                        far_rows(t, q, q->far_k, layer, I->kvh), far_rows(t, q, q->far_v, layer, I->kvh),
                        d, scale, ob, (int64_t)g * d, lb);
    } else if (tiered_dense_in_place(t, q, lse_out)) {
        /* [0, pos] in place, pieces merged in order from the empty partial:
         * the same arithmetic whether a piece comes from the cascade, from
         * this thread or (split) from another */
        const int c = st->casc_of ? st->casc_of[w] : -1;
        far_work f = {.k = far_rows(t, q, q->far_k, layer, I->kvh),
                      .v = far_rows(t, q, q->far_v, layer, I->kvh), .ld = d, .n_sel = sg->pos + 1};
        int64_t a0 = 0;
        if (c >= 0) {
            memcpy(ob, st->casc_o + (size_t)c * g * d, (size_t)g * d * sizeof(float));
            memcpy(lb, st->casc_l + (size_t)c * g, (size_t)g * sizeof(float));
            a0 = tiered_shared_pieces(q, sg->pos) * FAR_PIECE;
        } else {
            memset(ob, 0, (size_t)g * d * sizeof(float));
            for (int j = 0; j < g; j++) lb[j] = -INFINITY;
        }
        __atomic_fetch_add(&t->bytes_read, (uint64_t)(f.n_sel - a0) * d * 4, __ATOMIC_RELAXED);
        if (split) {
            const int k = dec_of[w];
            f.a0 = a0;
            fw[k] = f;
            pending[k] = (int)n_pieces(f.n_sel - a0);   /* >= 1: pos is past the shared rows */
            memcpy(sq + (size_t)k * g * d, qb, (size_t)g * d * sizeof(float));
            memcpy(so + (size_t)k * g * d, ob, (size_t)g * d * sizeof(float));
            memcpy(sl + (size_t)k * g, lb, (size_t)g * sizeof(float));
            return;
        }
        for (int64_t a = a0; a < f.n_sel; a += FAR_PIECE) {
            far_piece(kn, qb, g, d, &f, a, a + FAR_PIECE < f.n_sel ? a + FAR_PIECE : f.n_sel, scale,
                      o2, l2);
            hkv_attn_merge(ob, lb, o2, l2, g, d);
        }
    } else {
        int64_t n_near = sg->pos + 1 < t->NR ? sg->pos + 1 : t->NR;
        if (lse_out || split) {   /* far only, or near as a piece: the empty partial */
            memset(ob, 0, (size_t)g * d * sizeof(float));
            for (int j = 0; j < g; j++) lb[j] = -INFINITY;
        }
        if (split) {
            far_work *f = &fw[dec_of[w]];
            *f = (far_work){0};
            if (!lse_out) {
                f->nk = near_rows(t, q, q->near_k, layer, I->kvh);
                f->nv = near_rows(t, q, q->near_v, layer, I->kvh);
                f->n_near = n_near;
                __atomic_fetch_add(&t->bytes_read, (uint64_t)n_near * d * 4, __ATOMIC_RELAXED);
            }
        } else if (!lse_out) {
            kn->attn_dense(qb, g, d, near_rows(t, q, q->near_k, layer, I->kvh),
                           near_rows(t, q, q->near_v, layer, I->kvh), d, n_near, scale, ob, lb);
            __atomic_fetch_add(&t->bytes_read, (uint64_t)n_near * d * 4, __ATOMIC_RELAXED);
        }
        hkv_far_view fv;
        tiered_far_view(t, q, layer, &fv);
        if (t->p.audit) {
            memcpy(o_near, ob, (size_t)g * d * sizeof(float));
            memcpy(l_near, lb, (size_t)g * sizeof(float));
        }
        int64_t n_sel = 0;
        if (fv.hi > fv.lo) {
            const int64_t at = sg->row * KH + I->kvh;
            int64_t range_from = -1;   /* >= 0: sel is [range_from, hi) */
            if (rec && rec->far_from && rec->far_from[at] >= 0) {
                /* the kept set is the caller's: the tokens past it only */
                range_from = rec->far_from[at] > fv.lo ? rec->far_from[at] : fv.lo;
                n_sel = 0;
                for (int64_t p = range_from; p < fv.hi; p++) sel[n_sel++] = (int32_t)p;
            } else if (rec && rec->sel_n && rec->sel_n[at] >= 0) {
                /* selected by the caller: in range, or the step fails */
                const int32_t *ps = rec->sel + at * rec->sel_ld;
                n_sel = rec->sel_n[at] <= nd.max_sel ? rec->sel_n[at] : HKV_E_RANGE;
                for (int64_t i = 0; n_sel > 0 && i < n_sel; i++) {
                    if (ps[i] < fv.lo || ps[i] >= fv.hi) {
                        n_sel = HKV_E_RANGE;
                        break;
                    }
                    sel[i] = ps[i];
                }
            } else if (rec && rec->n && rec->n[at] >= 0 && q->pol.ops->select_recalled) {
                const hkv_recalled r = {rec->slot + at * rec->ld, rec->score + at * rec->ld,
                                        rec->n[at]};
                ps.bytes = 0;
                n_sel = q->pol.ops->select_recalled(q->pol.self, layer, I->kvh, qb, &fv, &r,
                                                    sel, &ps);
            } else {
                ps.bytes = 0;
                n_sel = q->pol.ops->select(q->pol.self, layer, I->kvh, qb, &fv, sel, &ps);
            }
            if (n_sel < 0) {
__atomic_store_n(&st->fail, (int)n_sel, __ATOMIC_RELAXED);
                return;
            }
            /* K and V of each row attended (2 d fp16 each, or the 8-bit tier's
             * codes and scales), and the selection's reads */
            __atomic_fetch_add(&t->bytes_read, (uint64_t)n_sel * 2 * hkv_far_view_row_bytes(&fv) +
                               ps.bytes, __ATOMIC_RELAXED);
            ps.bytes = 0;
            /* select returns unique positions in [lo, hi): as many as the range
             * means the whole range, read contiguously rather than gathered;
             * so is the range past a kept set the caller attends. */
            const int64_t p0 = n_sel == fv.hi - fv.lo ? fv.lo : range_from;
            const int contiguous = n_sel == fv.hi - fv.lo || range_from >= 0;
            far_work f = {.ld = fv.ld, .p0 = p0, .n_sel = n_sel, .sel = contiguous ? NULL : sel};
            if (hkv_far_q8(&fv)) {
                f.k8 = fv.k8[I->kvh], f.v8 = fv.v8[I->kvh];
                f.ks = fv.ks[I->kvh], f.vs = fv.vs[I->kvh];
            } else {
                f.k = fv.k[I->kvh], f.v = fv.v[I->kvh];
            }
            if (split) {   /* the pieces run after every selection is made */
                const int k = dec_of[w];
                if (f.sel) {
                    memcpy(ssel + (size_t)k * nd.max_sel, sel, (size_t)n_sel * sizeof *sel);
                    f.sel = ssel + (size_t)k * nd.max_sel;
                }
                f.nk = fw[k].nk, f.nv = fw[k].nv, f.n_near = fw[k].n_near;
                fw[k] = f;
            } else {
                for (int64_t a = 0; a < n_sel; a += FAR_PIECE) {
                    far_piece(kn, qb, g, d, &f, a, a + FAR_PIECE < n_sel ? a + FAR_PIECE : n_sel,
                              scale, o2, l2);
                    hkv_attn_merge(ob, lb, o2, l2, g, d);
                }
            }
        }
        if (split) {   /* the query and the empty partial, for the pieces and the merge */
            const int k = dec_of[w];
            pending[k] = (fw[k].n_near > 0) + (int)n_pieces(fw[k].n_sel);
            if (pending[k]) {   /* (none: a far-only row with nothing far, written below) */
                memcpy(sq + (size_t)k * g * d, qb, (size_t)g * d * sizeof(float));
                memcpy(so + (size_t)k * g * d, ob, (size_t)g * d * sizeof(float));
                memcpy(sl + (size_t)k * g, lb, (size_t)g * sizeof(float));
                return;
            }
        }
        if (t->p.audit) {
            int64_t nf = nd.far;
            int32_t *ai = (int32_t *)(au + nf);
            tiered_audit_row(t, q, layer, I->kvh, qb, ob, o_near, l_near, sel, n_sel, &fv, ta, tl, au,
                             ai, ai + nf, ai + 3 * nf, ai + 2 * nf,   /* work last: topk's */
                             o2, l2, q8_tile(st, base));
        }
    }
    for (int r = 0; r < I->nq; r++)
        memcpy(out + (sg->row + I->q0 + r) * ld_out + (size_t)I->kvh * g * d, ob + (size_t)r * g * d,
               (size_t)g * d * sizeof(float));
    if (lse_out)
        for (int r = 0; r < I->nq; r++)
            memcpy(lse_out + (sg->row + I->q0 + r) * t->s.n_head + (size_t)I->kvh * g,
                   lb + (size_t)r * g, (size_t)g * sizeof(float));
}

/* The split step's pieces, near and far, as their rows' selections finish:
 * a thread with no selection left to make starts on the pieces of the rows
 * already selected instead of waiting at a barrier for the last selection.
 * The thread that finishes a slot's last piece merges them in order (near,
 * far 0, 1, ...): the same arithmetic whichever thread runs which piece. */
static void run_pieces(layer_step *st) {
    const int g = st->g, d = st->d;
    const size_t gd = (size_t)g * d;
    const int64_t P1 = st->P1, np = (int64_t)st->n_dec * P1;
    const hkv_cpu_kernels *kn = st->t->kern;
    for (int64_t u; (u = __atomic_fetch_add(&st->next_piece, 1, __ATOMIC_RELAXED)) < np;) {
        const int k = (int)(u / P1);
        const int64_t j = u % P1;
        unsigned spins = 0;
        while (!__atomic_load_n(&st->ready[k], __ATOMIC_ACQUIRE))   /* the selection's scoring */
            if (!st->team || !hkv_score_team_help(st->team)) hkv_spin_wait(&spins);
        if (__atomic_load_n(&st->fail, __ATOMIC_RELAXED)) continue;   /* the step fails whole */
        const far_work *f = &st->fw[k];
        const float *qv = st->sq + k * gd;
        if (j == 0) {
            if (!f->n_near) continue;
            kn->attn_dense(qv, g, d, f->nk, f->nv, d, f->n_near, st->scale, st->po + u * gd,
                           st->pl + u * g);
        } else {
            const int64_t a = f->a0 + (j - 1) * FAR_PIECE, n = f->n_sel;
            if (a >= n) continue;
            far_piece(kn, qv, g, d, f, a, a + FAR_PIECE < n ? a + FAR_PIECE : n, st->scale,
                      st->po + u * gd, st->pl + u * g);
        }
        if (__atomic_sub_fetch(&st->pending[k], 1, __ATOMIC_ACQ_REL)) continue;
        float *ob = st->so + (size_t)k * gd, *lb = st->sl + (size_t)k * g;
        if (f->n_near) hkv_attn_merge(ob, lb, st->po + k * P1 * gd, st->pl + k * P1 * g, g, d);
        for (int64_t i = 0; i < n_pieces(f->n_sel - f->a0); i++) {
            const int64_t v = (int64_t)k * P1 + 1 + i;
            hkv_attn_merge(ob, lb, st->po + v * gd, st->pl + v * g, g, d);
        }
    }
}

int tiered_attend(tiered *t, int layer, const hkv_seg *segs, int n_segs, const float *qkv,
                  int64_t ld_qkv, float *out, int64_t ld_out, float *lse_out,
                  const hkv_recall_rows *rec, hkv_err *err) {
    const int KH = t->s.n_head_kv, d = t->s.head_dim, g = t->s.n_head / KH;
    const float scale = 1.0f / sqrtf((float)d);
    need nd = {0};
    int n_items = 0;
    for (int i = 0; i < n_segs; i++) {
        const hkv_seg *sg = &segs[i];
        if (sg->flags & HKV_SEG_STORE_ONLY) {   /* the caller attends: the empty partial */
            for (int64_t r = sg->row; r < sg->row + sg->n; r++) {
                memset(out + r * ld_out, 0, (size_t)t->s.n_head * d * sizeof(float));
                for (int h = 0; h < t->s.n_head; h++) lse_out[r * t->s.n_head + h] = -INFINITY;
            }
            continue;
        }
        nd.q8 |= t->seqs[sg->seq].q8;
        if (nd.q8_rows < Q8_TILE_ROWS) nd.q8_rows = Q8_TILE_ROWS;
        if (tiered_is_prompt(sg) && t->seqs[sg->seq].q8) {   /* a whole prefix's tiles */
            const int64_t end = seg_pos(sg, sg->n - 1) + 1;
            if (end <= q8_whole(t) && end > nd.q8_rows) nd.q8_rows = end;
        }
        if (tiered_is_prompt(sg)) {
            n_items += KH * ((sg->n + QTILE - 1) / QTILE);
            const tseq *q = &t->seqs[sg->seq];
            if (q->tsp && q->tsp[layer].rows) {
                int64_t last = seg_pos(sg, sg->n - 1) + 1;
                if (last > nd.tsp_idx) nd.tsp_idx = last;
            }
            continue;
        }
        n_items += KH;
        tseq *q = &t->seqs[sg->seq];
        if (tiered_dense_in_place(t, q, lse_out)) {
            if (sg->pos + 1 > nd.far) nd.far = sg->pos + 1;
            continue;
        }
        hkv_far_view fv;
        tiered_far_view(t, q, layer, &fv);
        int64_t n_far = fv.hi - fv.lo, ms = q->pol.ops->max_select(q->pol.self, n_far), pf = 0, pi = 0;
        q->pol.ops->scratch_need(q->pol.self, n_far, &pf, &pi);
        if (ms > nd.max_sel) nd.max_sel = ms;
        if (pf > nd.pol_f) nd.pol_f = pf;
        if (pi > nd.pol_i) nd.pol_i = pi;
        if (n_far > nd.far) nd.far = n_far;
    }
    item *items = malloc((size_t)n_items * sizeof *items);
    if (!items) return hkv_seterr(err, HKV_E_NOMEM, "no memory for %d attention items", n_items);
    /* With the far tiers spread over NUMA nodes the items go grouped by their
     * sequence's node, node k's [node_next[k], node_hi[k]), each node's
     * workers claiming its own first (base/numa_map.h); which thread attends
     * an item never changes its result. */
    const int n_nodes = tiered_far_spread(t) ? t->p.numa->n : 1;
    int node_hi[HKV_NUMA_MAX_NODES], node_next[HKV_NUMA_MAX_NODES];
    int it = 0;
    for (int k = 0; k < n_nodes; k++) {
        node_next[k] = it;
        for (int i = 0; i < n_segs; i++)
            for (int h = 0; h < KH && !(segs[i].flags & HKV_SEG_STORE_ONLY); h++) {
                if (n_nodes > 1 && hkv_numa_seq_node(t->p.numa, segs[i].seq) != k) break;
                if (!tiered_is_prompt(&segs[i])) {
                    items[it++] = (item){i, h, 0, 1};
                    continue;
                }
                for (int q0 = 0; q0 < segs[i].n; q0 += QTILE)
                    items[it++] = (item){i, h, q0, segs[i].n - q0 < QTILE ? segs[i].n - q0 : QTILE};
            }
        node_hi[k] = it;
    }
    const int nth = omp_get_max_threads();
    const size_t per = per_thread_floats(t, &nd);
    int rc = ensure_scratch(t, (size_t)nth * per * sizeof(float), err);
    if (rc) {
        free(items);
        return rc;
    }
    /* Few decode rows x KV heads for the threads (a batch of one: 8 KV heads
     * on 16 threads, or 3 on 2, which leaves one thread idle half the time):
     * the selections are made side by side as usual, then the far pieces of
     * all of them are spread over the threads and merged in order. */
    int n_dec = 0;
    for (int w = 0; w < n_items; w++) n_dec += !tiered_is_prompt(&segs[items[w].seg]);
    /* a selection is at most max_sel rows, or the whole far range */
    const int64_t max_pieces = n_pieces(nd.max_sel > nd.far ? nd.max_sel : nd.far);
    const int split = n_dec > 0 && n_dec < 4 * nth && max_pieces > 1 && !t->p.audit;
    int *dec_of = NULL;      /* item -> its decode slot (split) */
    int *pending = NULL;     /* decode slot -> its pieces not yet computed */
    int *ready = NULL;       /* decode slot -> selected, its pieces may run */
    far_work *fw = NULL;
    const int64_t P1 = max_pieces + 1;   /* a decode slot's pieces: near, then far */
    float *sq = NULL, *so = NULL, *sl = NULL, *po = NULL, *pl = NULL;
    int32_t *ssel = NULL;
    if (split) {
        const size_t gd = (size_t)g * d, np = (size_t)n_dec * P1;
        const size_t fl = (size_t)n_dec * (2 * gd + g) + np * (gd + g) + (size_t)n_dec * nd.max_sel;
        if (t->split_bytes < fl * sizeof(float)) {
            hkv_host_free(t->mem, HKV_TIER_WORKSPACE, t->split, t->split_bytes);
            t->split_bytes = 0;
            if (!(t->split = hkv_host_alloc(t->mem, HKV_TIER_WORKSPACE, fl * sizeof(float), err))) {
                free(items);
                return HKV_E_NOMEM;
            }
            t->split_bytes = fl * sizeof(float);
        }
        dec_of = calloc((size_t)n_items + 2 * (size_t)n_dec, sizeof *dec_of);
        fw = calloc((size_t)n_dec, sizeof *fw);
        if (!dec_of || !fw) {
            free(dec_of), free(fw), free(items);
            return hkv_seterr(err, HKV_E_NOMEM, "no memory for %d split attention items", n_dec);
        }
        for (int w = 0, k = 0; w < n_items; w++) dec_of[w] = tiered_is_prompt(&segs[items[w].seg]) ? -1 : k++;
        pending = dec_of + n_items, ready = pending + n_dec;
        sq = t->split, so = sq + n_dec * gd, sl = so + n_dec * gd, po = sl + (size_t)n_dec * g;
        pl = po + np * gd, ssel = (int32_t *)(pl + np * g);
    }    /* A far-only step over empty far ranges (every row's keys near: the CUDA
     * pipeline's deferred host steps) writes empty partials: too little for
     * a team's wake-up. */
    int wide = !lse_out || nd.far > 0 || t->p.audit;
    for (int i = 0; i < n_segs && !wide; i++) wide = tiered_is_prompt(&segs[i]);
    /* With several threads, a selection's scoring is spread over those that
     * have no selection of their own left (kv_score_team.h). */
    const int shared = wide && nth > 1 && n_dec > 0 && !t->p.score_alone;
    if (shared && t->team.n != nth) {
        hkv_score_team_free(&t->team);
        if ((rc = hkv_score_team_init(&t->team, t->kern, nth, err))) {
            free(dec_of), free(fw), free(items);
            return rc;
        }
    }
    tiered_cascade casc = {0};
    if (!lse_out && (rc = tiered_cascade_run(t, layer, segs, items, n_items, qkv, ld_qkv, scale, &casc, err))) {
        free(dec_of), free(fw), free(items);
        return rc;
    }
    layer_step st = {.t = t, .layer = layer, .KH = KH, .g = g, .d = d, .split = split,
                     .scale = scale, .nd = nd, .segs = segs, .rec = rec, .qkv = qkv,
                     .ld_qkv = ld_qkv, .ld_out = ld_out, .out = out, .lse_out = lse_out,
                     .items = items, .n_items = n_items, .n_dec = n_dec, .dec_of = dec_of,
                     .pending = pending, .ready = ready, .fw = fw, .P1 = P1, .sq = sq, .so = so,
                     .sl = sl, .po = po, .pl = pl, .ssel = ssel,
                     .team = shared ? &t->team : NULL, .casc_of = casc.n ? casc.of : NULL,
                     .casc_o = casc.o, .casc_l = casc.l, .per = per};
    /* Items are claimed in order, one at a time (a prompt tile or a decode
     * row's KV head); with split, each thread then goes on to the pieces. */
#pragma omp parallel if (wide)
    {
        const int tid = omp_get_thread_num();
        float *base = t->scratch + (size_t)tid * per;
        const int node = hkv_numa_worker_node(t->p.numa, tid);
        for (int w; (w = n_nodes > 1 ? hkv_numa_claim(node_hi, node_next, n_nodes, node)
                                 : __atomic_fetch_add(&st.next_item, 1, __ATOMIC_RELAXED)) >= 0 &&
                    w < n_items;) {
            attend_item(&st, w, base, tid);
            if (split && dec_of[w] >= 0) __atomic_store_n(&ready[dec_of[w]], 1, __ATOMIC_RELEASE);
            __atomic_fetch_add(&st.items_done, 1, __ATOMIC_RELEASE);
        }
        if (split) run_pieces(&st);
        /* the last selections' scoring, rather than idling at the barrier */
        unsigned spins = 0;
        while (st.team && __atomic_load_n(&st.items_done, __ATOMIC_ACQUIRE) < n_items)
            if (!hkv_score_team_help(st.team)) hkv_spin_wait(&spins);
    }
    const int fail = st.fail;
    if (split && !fail) {
        /* the merged slots to their rows (a few KB: no team) */
        const size_t gd = (size_t)g * d;
        for (int w = 0; w < n_items; w++) {
            const int k = dec_of[w];
            if (k < 0 || !((fw[k].n_near > 0) + n_pieces(fw[k].n_sel - fw[k].a0))) continue;
            const hkv_seg *sg = &segs[items[w].seg];
            const int kvh = items[w].kvh;
            memcpy(out + sg->row * ld_out + (size_t)kvh * gd, so + (size_t)k * gd, gd * sizeof(float));
            if (lse_out)
                memcpy(lse_out + sg->row * t->s.n_head + (size_t)kvh * g, sl + (size_t)k * g,
                       (size_t)g * sizeof(float));
        }
    }
    tiered_cascade_free(&casc);
    free(dec_of);
    free(fw);
    free(items);
    if (fail) return hkv_seterr(err, fail, "layer %d: the policy's selection failed (%s)", layer,
                                hkv_status_text(fail));
    return HKV_OK;
}
