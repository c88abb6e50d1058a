/* Private to pipeline/cuda_*.c: the CUDA backend's state. */
#ifndef HKV_CUDA_BACKEND_IMPL_H
#define HKV_CUDA_BACKEND_IMPL_H

#include "cuda_backend.h"
#include "engine.h"
#include "gpu_forward.h"
#include "gpu_kernels.h"
#include "pinned.h"
#include "policy.h"

typedef struct dlayer {
    hkv_gpu_qmat qkv[3], wo, ffn_in[2], down;
    int n_qkv, n_ffn_in;
    float *attn_norm, *ffn_norm, *bqkv;   /* fp32 (bqkv may be NULL) */
} dlayer;

/* Small host -> device arrays go through a ring of page-locked slots, each
 * reused only after the copy that read it has completed (its event). */
#define STAGE_SLOTS 8

/* Device arrays refreshed from host per call: the last content uploaded is
 * kept so that layers of one call do not upload it again. */
enum { UP_TOK, UP_POS, UP_LROWS, UP_DST, UP_ROWS, UP_NROWS, UP_IDX, UP_KNROWS, UP_KIDX, UP_RNROWS,
       UP_RIDX, UP_CROWS, UP_COUNT };

/* The device's mirror of the policies' recall tables (cuda_recall.c). */
typedef struct cb_recall {
    int64_t C, k;                 /* arena: slots per table, entries per (row, KV head); 0: none */
    uint16_t *rows;               /* device [max_seqs][NL][C][H][d] fp16 */
    int32_t *fifo;                /* device [max_seqs][NL][KH][2] */
    size_t rows_bytes, fifo_bytes, ws_bytes, up_bytes;
    void *ws;
    int32_t *d_slot, *d_n;        /* [max_rows][KH][k], [max_rows][KH] */
    float *d_score;
    void *d_up;                   /* device copy of one layer's update region */
    hkv_pinned h_up;              /* [NL] update regions (offsets, FIFOs, descriptors, rows) */
    void **up_ev;                 /* [NL]: that region's copy done */
    hkv_pinned h_out;             /* slot, score, n of the last step */
    uint64_t *ver, *epoch;        /* [max_seqs][NL]: table version and sequence epoch mirrored */
    char *has;                    /* [max_rows]: recalled this step */
    hkv_recall_table *tab;        /* [max_seqs]: this step's tables */
    int32_t *dirty;               /* [max_seqs][KH] */
    int *seg;                     /* [max_seqs]: their segments */
    int n_desc;
    hkv_recall_rows rr;
} cb_recall;

/* The device's copy of eviction policies' kept rows (cuda_keep.c). */
typedef struct cb_keep {
    int64_t cap;                  /* rows per (sequence, layer, KV head); 0: no arena */
    uint16_t *k, *v;              /* device [max_seqs][NL][KH][cap][d] fp16 */
    size_t bytes;                 /* of each of k, v */
    uint64_t *ver, *epoch;        /* [max_seqs][NL]: kept-set version and epoch copied (0: none) */
    int32_t *n;                   /* [max_seqs][NL][KH]: rows copied */
    hkv_pinned h_stage;           /* one (sequence, layer)'s rows on their way up, K then V */
    void *stage_ev;               /* its last copy done */
    int32_t *h_nrows, *h_idx;     /* the step's compact decode rows: [max_seqs][KH], [..][cap] */
    int32_t *d_nrows, *d_idx;
    float *d_o, *d_l;             /* their kept partials [max_seqs][H][d], [max_seqs][H] */
    int split;                    /* flash-decoding splits the workspace holds */
    void *split_ws;
    size_t split_ws_bytes;
    int64_t *h_from;              /* [max_rows][KH]: the host's far range start (-1: select) */
    int n_dec;                    /* decode rows this step (0: no kept set on the device) */
} cb_keep;

/* The staging of 8-bit far rows made fp16 on their way up (cuda_far_upload.c):
 * allocated at the first such copy (the format is each sequence's). */
typedef struct cb_far_stage {
    hkv_pinned buf;               /* two halves, each K then V [rows][d] fp16 */
    size_t half;                  /* uint16_t per half */
    void *ev[2];                  /* each half's last copy done */
    int next;
} cb_far_stage;

/* Whole sequences on the device (cuda_resident.c): `full` sequences given
 * a slot keep every far row there too; a prefix they share by reference
 * (hkv_far_view.shared_id) is kept once, in a prefix slot. */
typedef struct cb_resident {
    int n_slots;                  /* 0: none */
    int64_t cap;                  /* far rows per (slot, layer, KV head) */
    int64_t pcap;                 /* far rows per (prefix slot, layer, KV head): a whole context */
    int chunk;                    /* rows a copy lags by at most, copied up together */
    uint16_t *k, *v;              /* device [NL][n_slots][KH][cap][d] fp16 */
    int *slot_seq;                /* [n_slots]: the sequence holding it, -1: free */
    int *seq_slot;                /* [max_seqs]: its slot, -1: none */
    uint64_t *epoch;              /* [n_slots][NL]: the sequence's epoch its rows are of */
    int64_t *lo, *hi;             /* [n_slots][NL]: far positions [lo, hi) in the slot (lo: the
                                     view's lo, or the end of the prefix read from pslot) */
    int *pslot;                   /* [n_slots][NL]: prefix slot of positions below lo, -1: none */
    int n_pre;                    /* prefix slots (0: prefixes are each sequence's own rows) */
    uint16_t *pk, *pv;            /* device [NL][n_pre][KH][pcap][d] fp16 */
    uint64_t *pre_id;             /* [n_pre]: the prefix's id, 0: free */
    int64_t *pre_hi;              /* [n_pre][NL]: its positions [view lo, pre_hi) on the device */
    int32_t *h_nrows, *h_idx;     /* the step's compact decode rows [max_seqs][KH]: rows, start */
    int32_t *d_nrows, *d_idx;
    /* The step's prefix parts as a cascade: the rows reading one prefix
     * slot's first nk rows, a group, attend them in one pass. */
    int *row_ps;                  /* [max_seqs] per compact decode row: its prefix slot, -1 */
    int64_t *row_nk;              /* [max_seqs]: its prefix rows */
    int32_t *h_grow, *d_grow;     /* [max_seqs]: the rows of each group, group after group */
    struct cb_cascade_group { int ps, start, n; int64_t nk; } *grp;   /* [max_seqs] */
    int n_grp;
    float *d_cq, *d_co, *d_cl;    /* the groups' queries and partials, [max_seqs][H][d], [.][H] */
    float *d_o, *d_l;             /* their partials [max_seqs][H][d], [max_seqs][H] */
    int split;
    void *split_ws;
    size_t split_ws_bytes;
    int n_dec;                    /* decode rows this step (0: none resident) */
    int n_pdec;                   /* of them, rows with a prefix part */
} cb_resident;

/* The device's copy of page-bounds policies' tables (cuda_pages.c). */
typedef struct cb_pages {
    int64_t np_cap, sel_ld;       /* pages per (sequence, layer, KV head); positions per (row,
                                     KV head); 0: no arena */
    uint16_t *bounds;             /* device [max_seqs][NL][KH][np_cap][2d] fp16 */
    size_t bytes, ws_bytes;
    void *ws;
    uint64_t *ver, *epoch;        /* [max_seqs][NL]: table version and epoch copied (0: none) */
    int32_t *d_sel, *d_n;         /* [max_rows][KH][sel_ld], [max_rows][KH] */
    hkv_pinned h_out;             /* their host copy */
    char *has;                    /* [max_rows][KH]: selected on the device this step */
    int n_rows;                   /* decode rows selected on the device this step */
} cb_pages;

/* The device's copy of two-stage policies' candidate lists (cuda_rocket.c). */
typedef struct cb_rocket {
    int64_t cap, pcap;            /* entries and page columns per (sequence, layer, KV head);
                                     0: no arena */
    int32_t *cand, *n;            /* device [max_seqs][NL][KH][cap], [max_seqs][NL][KH] */
    uint16_t *bnd;                /* device [max_seqs][NL][KH][2d][pcap] fp16 */
    size_t cand_bytes, n_bytes, bnd_bytes, ws_bytes;
    void *ws;                     /* one row's estimate */
    uint64_t *ver, *epoch;        /* [max_seqs][NL]: lists' version and epoch copied (0: none) */
    int32_t *h_n;                 /* [KH]: a resync's list lengths */
} cb_rocket;

/* A sequence's copy of its prompt's K/V while the prompt is fed (cuda_prefill.c). */
typedef struct cb_prompt {
    uint16_t *k, *v;              /* device [NL][KH][cap][d] fp16 */
    int64_t cap;                  /* tokens of room (0: none allocated) */
    size_t bytes;                 /* of each of k, v */
    uint64_t epoch;               /* the sequence's epoch when the prompt started */
    int off;                      /* 1: the host attends the rest of this prompt */
    int stream;                   /* 1: the copy no longer grows; the keys past it stream from
                                     the far tier (cuda_prefill_stream.c) */
    int64_t res;                  /* tokens the copy holds while streaming (every layer) */
    int step_layer;               /* the layer of the last step that saw this prompt, and */
    int64_t step_end;             /* tokens the copy holds after it (-1: not appended) */
} cb_prompt;

/* A prompt's earlier keys streamed from the far tier through the device
 * when its copy does not fit (cuda_prefill_stream.c): two staging blocks
 * (one filled on the copy stream while the compute stream attends the
 * other), the chunk's own K/V, one block's partial to merge. Allocated
 * when a prompt first streams, released when none does. */
typedef struct cb_pstream {
    void *cst;                    /* the copy stream */
    uint16_t *k[2], *v[2];        /* staging [KH][blk][d] fp16 */
    uint16_t *ck, *cv;            /* the chunk's own K/V [KH][max_rows][d] */
    float *po, *pl;               /* a block's partial [max_rows][qd], [max_rows][H] */
    int64_t blk;                  /* keys per staging block; 0: nothing allocated */
    int64_t keys, blk_want;       /* hkv_cuda_params.prompt_keys, prompt_block */
    size_t stage_bytes, chunk_bytes;
    void *copied[2], *used[2];    /* block t's copy done; its attention done (t free) */
    int turn;                     /* the staging block the next copy fills */
    int active;                   /* prompts streaming */
    int queued;                   /* copies queued since the copy stream was last waited for */
} cb_pstream;

/* The most page-locked memory h_qkv takes to keep every layer's QKV rows of
 * a decode batch for the deferred host steps; a larger batch keeps as many
 * layers as fit and runs the rest in step (cuda_attention.c). */
#define HKV_DEFER_PINNED_MAX ((size_t)64 << 20)

/* Device time of the products and of whole forward calls, from events on
 * the compute stream, harvested in order as they complete (no host sync;
 * cuda_backend.c). Products: a FIFO ring of (start, end) pairs, one per
 * matmul op. Calls: two (start, end) pairs used in turn; a call's start is
 * recorded at its embedding, its end re-recorded after the last layer's
 * residual and after the head's product, and the pair is closed (to be
 * harvested) when the next call starts or the stats are read. */
typedef struct cb_timer {
    void **ev;                    /* [cap][2] */
    unsigned char *kind;          /* [cap]: enum hkv_dev_op of each pair */
    int cap, tail, n;             /* pairs recorded, oldest first */
    void *call_ev[2][2];
    int call_state[2];            /* 0 free, 1 open, 2 closed (to harvest) */
    int call_cur;                 /* the open pair, -1: none */
    int call_has_end;             /* the open pair's end has been recorded */
    int last_down;                /* the last product was the last layer's down projection */
    double host_t0;               /* profile: host clock at the open op's begin */
    int host_op;                  /* and its kind */
} cb_timer;

/* One micro-batch's attention step between its begin and its end
 * (cuda_attention.c): half 0 is also the whole batch's. */
typedef struct cb_half {
    int open;                     /* begun, its host part not yet run */
    int pp;                       /* a micro-batch of ping-pong (not the whole batch) */
    int layer, n_segs, n_dec, n_slow, merge, dev_prompt;
    int64_t r0, n;                /* its rows in the batch */
    const hkv_seg *segs;          /* the caller's, valid until the end */
    float *hq;                    /* its QKV rows on the host (at their rows in the batch) */
    void **ev;                    /* its 4 timeline events */
    int *ev_pending;
    /* the device parts' results its host part reads (swapped with the modules') */
    int n_desc, kp_n_dec, rs_n_dec, pg_rows;
    hkv_recall_rows rr;
} cb_half;

/* Decode steps recorded once per batch shape and replayed whole
 * (cuda_graph.c). The step's inputs (UP_TOK .. UP_IDX) go up from h_in at
 * fixed offsets: a replay writes them there and launches. */
#define CB_GRAPHS 8
typedef struct cb_graph_slot {
    hkv_gpu_graph *g;             /* NULL: free */
    int64_t n;                    /* its batch rows */
    int inv;                      /* recorded with batch-invariant products */
    uint64_t used;                /* the clock at its last launch (LRU) */
    size_t in_len[UP_COUNT];      /* bytes of each input it uploads (0: none) */
} cb_graph_slot;

typedef struct cb_graph {
    int off;                      /* hkv_cuda_params.graphs_off */
    int capturing;                /* a step is being recorded (its ops queue into the capture) */
    int64_t cap_n;
    int cap_inv;
    cb_graph_slot slot[CB_GRAPHS];
    uint64_t clock;
    hkv_pinned h_in;              /* the inputs' page-locked copies, at in_off */
    size_t in_off[UP_COUNT], in_cap[UP_COUNT];
    size_t in_len[UP_COUNT];      /* staged in the open capture */
    void *in_ev;                  /* the last launch has read h_in */
    hkv_pipeline_stats stats0;    /* the stats as the recording began (a dropped one restores them) */
} cb_graph;

typedef struct cuda_be {
    hkv_engine *e;
    hkv_gpu_ctx *ctx;
    void *st;                       /* the compute stream */
    int NL, H, KH, d, NR, max_rows, max_seqs;
    int Li, Ll;                     /* the near window (kv_far.h): sinks, ring; NR = Li + Ll */
    int gemm;                       /* hkv_cuda_params.gemm */
    int profile;                    /* hkv_cuda_params.profile */
    int lockstep;                   /* hkv_cuda_params.lockstep: never defer a host step */
    double spin_us;                 /* hkv_cuda_params.wait_spin_us resolved: 0 sleeps at once */
    int team_spin;                  /* hkv_cuda_params.team_spin: the team waits with the host */
    size_t offload_mem;           /* hkv_cuda_params.offload_mem (0: no cap) */
    int64_t qd, qkv_w;
    /* weights */
    hkv_gpu_qmat tok, out;
    int out_is_tok;                 /* tied output: one copy */
    float *out_norm, *inv_freq;
    float *d_rope_cs;   /* the step's RoPE cos/sin table [rows][rot] */
    dlayer *L;
    /* activations [max_rows][width] and the product workspace */
    float *act[HKV_ACT_COUNT];
    int64_t act_w[HKV_ACT_COUNT];
    size_t act_n[HKV_ACT_COUNT];   /* floats allocated (TMP: see alloc_buffers) */
    void *ws;
    size_t ws_bytes;
    /* per-call index arrays (device) */
    int32_t *d_tok, *d_lrows, *d_rows, *d_nrows, *d_idx;
    int64_t *d_pos, *d_dst;
    /* attention partials: near lse [max_rows][H], far out/lse from the
     * host, the compact decode set's q / out [max_seqs][qd], lse [max_seqs][H] */
    float *d_lse, *d_fo, *d_fl, *d_q, *d_no, *d_nl;
    /* flash-decoding of the near tier: key-range splits, their partials */
    int near_split;
    void *d_split_ws;
    size_t split_ws_bytes;
    /* the near tier mirror [max_seqs][NL][KH][NR][d] fp16, and what it holds */
    uint16_t *near_k, *near_v;
    uint64_t *m_epoch;              /* [max_seqs][NL] */
    int64_t *m_len;                 /* [max_seqs][NL]: tokens mirrored, -1: not current */
    /* page-locked host buffers: QKV down, far partials up, staging ring */
    hkv_pinned h_qkv, h_fo, h_fl, h_stage;
    int64_t qkv_rows;             /* rows of h_qkv (deferred steps: below) */
    size_t slot_bytes;
    int slot_next;
    void *slot_ev[STAGE_SLOTS];
    void *up_cache[UP_COUNT];       /* host copies of what each array last received */
    size_t up_len[UP_COUNT], up_cap[UP_COUNT];
    /* timeline events per micro-batch and layer: QKV downloaded, near start,
     * near end, far arrives */
    void **ev;                      /* [2][NL][4] */
    int *ev_pending;                /* [2][NL]: events recorded, not yet harvested */
    cb_half half[2];                /* micro-batch ping-pong's two halves (0: also the whole batch) */
    int cur_half;                   /* the half whose op runs */
    int64_t r0;                     /* the layer ops' first row (backend op row_base) */
    /* host scratch of one attention step */
    int32_t *h_rows, *h_nrows, *h_idx;   /* [max_seqs], [max_seqs][KH], [max_seqs][KH]: each
                                            (row, KV head)'s near run starts at h_idx */
    int64_t *h_dst;                       /* [max_rows] */
    int32_t *h_slow;                      /* [max_seqs] */
    cb_recall rc;
    cb_keep kp;
    cb_resident rs;
    cb_pages pg;
    cb_rocket rk;
    cb_prompt *pp;                /* [max_seqs] */
    int64_t *pp_len;              /* [max_seqs][NL]: tokens in the copy per layer */
    hkv_seg *pp_segs;             /* the step's segments as the host gets them */
    char *pp_dev;                 /* [segment]: attended on the device this step */
    int pp_ok;                    /* the head size suits the device attention */
    int64_t *h_pdst, *d_pdst;     /* [max_rows]: append offsets into a copy */
    cb_pstream ps;
    cb_far_stage fs;
    /* Host steps deferred (cuda_attention.c): layers of the current call
     * whose far partial is empty for every row, so that the device went on
     * without it; their QKV rows wait in h_qkv at [layer * n][qkv_w]
     * (h_qkv holds qkv_rows rows: every layer's of a decode batch of up to
     * max_seqs rows, where that stays within HKV_DEFER_PINNED_MAX). */
    int *df_layer;                /* [NL], in layer order; [df_done, df_count) still to run */
    int df_done, df_count, df_nsegs;
    int64_t df_n;
    hkv_seg *df_segs;             /* [max_seqs]: the call's segments */
    cb_graph gr;
    hkv_pipeline_stats stats;
    cb_timer tm;
    /* device allocations, freed in reverse at destroy */
    struct dalloc { void *p; size_t bytes; int tier; } *allocs;
    int n_allocs, cap_allocs;
} cuda_be;

/* Count one unit of offered work the host does instead (reason: enum
 * hkv_fallback; NONE counts nothing); returns reason. */
static inline int cb_fallback(cuda_be *b, int reason) {
    if (reason > HKV_FALLBACK_NONE && reason < HKV_FALLBACK_COUNT) b->stats.fallbacks[reason]++;
    return reason;
}

/* The capability query of decode segment sg's policy (policy.h,
 * device_takes) for layer: 1 when its device part's table may be read now,
 * 0 when not, < 0 an error. With count, a no is counted as a fallback when
 * the host then has far tokens to select from (sg's far tier not empty). */
int cb_policy_takes(cuda_be *b, const hkv_seg *sg, int layer, const hkv_policy *pol, int count);
/* 1 when decode segment sg leaves far tokens for the host this step. */
static inline int cb_far_tokens(const cuda_be *b, const hkv_seg *sg) {
    return sg->pos >= b->Li + b->Ll;
}

/* Device memory accounted in the backend's list (freed at destroy). */
void *cb_alloc(cuda_be *b, int tier, size_t bytes, hkv_err *err);
/* Upload host bytes through the staging ring (asynchronous); `id` (UP_*, or
 * -1) skips the copy when the array already holds exactly these bytes. */
int cb_stage(cuda_be *b, int id, void *dev, const void *src, size_t bytes, hkv_err *err);
/* K rows p0 .. p0 + n - 1 of KV head h of a far view to dk (and V to dv,
 * unless NULL), [n][d] fp16, on stream, asynchronously: fp16 rows straight
 * from the page-locked far tier; an 8-bit tier's rows made fp16 a block at
 * a time (index/far_rows.h) into two page-locked halves that alternate
 * (cb_far_stage), so the host makes the next block while the last one
 * copies. */
int cb_upload_far(cuda_be *b, uint16_t *dk, uint16_t *dv, const hkv_far_view *far, int h,
                  int64_t p0, int64_t n, void *stream, hkv_err *err);
void cb_far_stage_destroy(cuda_be *b);
/* Harvest the timeline events of completed layers (after a stream sync). */
void cb_harvest(cuda_be *b);
/* Remember that array `id` (UP_*) now holds src's bytes (cb_stage's cache). */
void cb_up_remember(cuda_be *b, int id, const void *src, size_t bytes);
/* A forward call's device time: its start recorded before its first op,
 * its end after its last layer (cuda_backend.c). */
int cb_call_start(cuda_be *b, hkv_err *err);
int cb_call_end(cuda_be *b, hkv_err *err);

/* The attention step's host side (cuda_attention.c), shared with the
 * replayed graph: cb_layer_settle harvests the last call's timeline events
 * of micro-batch hi's layer before they are recorded again;
 * cb_decode_rows fills h_dst, h_rows, h_nrows, h_idx for the segments'
 * decode rows (rows r0 .. r0 + n of the batch) and counts them (n_slow: the
 * sequences whose mirror of `layer` is not current, in h_slow);
 * cb_defer_note is the host's record of a layer step deferred (the device
 * went on; the host step waits in the list for cb_flush). */
int cb_layer_settle(cuda_be *b, int hi, int layer, hkv_err *err);
int cb_decode_rows(cuda_be *b, int layer, const hkv_seg *segs, int n_segs, int64_t r0, int64_t n,
                   int *n_dec, int *n_slow, hkv_err *err);
void cb_defer_note(cuda_be *b, int layer, const hkv_seg *segs, int n_segs, int64_t n);

/* The replayed decode step (cuda_graph.c): create/destroy with the backend;
 * cb_graph_step, the backend op step_graph; cb_graph_stage, cb_stage while
 * a step is recorded; cb_graph_end, at the recorded step's flush: the graph
 * launched (ok) or the capture dropped and the step's host state undone. */
int cb_graph_create(cuda_be *b, int off, hkv_err *err);
void cb_graph_destroy(cuda_be *b);
int cb_graph_step(void *self, const int32_t *tokens, const int64_t *pos, const hkv_seg *segs,
                  int n_segs, int64_t n, int *mode, hkv_err *err);
int cb_graph_stage(cuda_be *b, int id, void *dev, const void *src, size_t bytes, hkv_err *err);
int cb_graph_end(cuda_be *b, int ok, hkv_err *err);

/* The device recall (cuda_recall.c): create/destroy with the backend;
 * cb_recall_step, before the layer's QKV rows go down, brings the tables of
 * the step's decode rows up to date and queues the recall and its download;
 * cb_recall_result, after that download, gives layer_step_far's argument
 * (NULL: no row recalled on the device). */
int cb_recall_create(cuda_be *b, hkv_err *err);
void cb_recall_destroy(cuda_be *b);
int cb_recall_step(cuda_be *b, int layer, const hkv_seg *segs, int n_segs, int64_t r0, int64_t n,
                   hkv_err *err);
const hkv_recall_rows *cb_recall_result(cuda_be *b, int64_t r0, int64_t n);

/* Eviction policies' kept rows on the device (cuda_keep.c). cb_keep_step,
 * before the layer's host step, brings the copies of the step's decode rows
 * up to date and stages their row lists (kp.h_from: the host's part);
 * cb_keep_attend queues their kept partials and merges them into the near
 * partials of the n_dec compact decode rows (no [n_dec][H d], nl [n_dec][H]:
 * d_no and d_nl, or the attention output's rows themselves). */
int cb_keep_create(cuda_be *b, hkv_err *err);
void cb_keep_destroy(cuda_be *b);
int cb_keep_step(cuda_be *b, int layer, const hkv_seg *segs, int n_segs, int64_t r0, int64_t n,
                 hkv_err *err);
int cb_keep_attend(cuda_be *b, int layer, int n_dec, float *no, float *nl, hkv_err *err);

/* Whole `full` sequences on the device (cuda_resident.c). cb_resident_step,
 * after cb_keep_step, gives each decode row of a `full` sequence a slot
 * where one is free, brings its rows up to date and sets kp.h_from past
 * them (the host attends the rest); cb_resident_attend queues their partials
 * and merges them into the near partial. */
int cb_resident_create(cuda_be *b, const hkv_cuda_params *p, int64_t rows, hkv_err *err);
void cb_resident_destroy(cuda_be *b);
int cb_resident_step(cuda_be *b, int layer, const hkv_seg *segs, int n_segs, hkv_err *err);
int cb_resident_attend(cuda_be *b, int layer, int n_dec, float *no, float *nl, hkv_err *err);

/* Far selections on the device (cuda_pages.c: quest's pages; cuda_rocket.c:
 * rocketkv's lists). cb_select_step, after the layer's QKV and before its
 * near-tier append, brings the copies up to date, folds the tokens leaving
 * the ring and queues the selections and their download; cb_pages_result,
 * after that download, fills rec's sel fields. */
int cb_pages_create(cuda_be *b, hkv_err *err);
void cb_pages_destroy(cuda_be *b);
int cb_select_step(cuda_be *b, int layer, const hkv_seg *segs, int n_segs, int64_t r0, int64_t n,
                   hkv_err *err);
void cb_pages_result(cuda_be *b, int64_t r0, int64_t n, hkv_recall_rows *rec);

/* Two-stage policies' stage 2 on the device (cuda_rocket.c), run by
 * cb_select_step into its output: cb_rocket_sel_need, the positions a row
 * of the step selects at most (0: no row has lists); cb_rocket_step, the
 * lists brought up to date, this step's far token pushed, the selections
 * queued. */
int cb_rocket_create(cuda_be *b, hkv_err *err);
void cb_rocket_destroy(cuda_be *b);
int64_t cb_rocket_sel_need(cuda_be *b, int layer, const hkv_seg *segs, int n_segs);
int cb_rocket_step(cuda_be *b, int layer, const hkv_seg *segs, int n_segs, hkv_err *err);

/* Prompt attention on the device (cuda_prefill.c). cb_prefill_plan: which
 * prompt segments of the step the device attends (b->pp_segs gets the
 * segments with HKV_SEG_STORE_ONLY on those, for the host); returns 1 if
 * any. cb_prefill_attend queues their K/V append and attention;
 * cb_prefill_done records them after the host step and frees a finished
 * prompt's copy. */
int cb_prefill_create(cuda_be *b, const hkv_cuda_params *cp, hkv_err *err);
void cb_prefill_destroy(cuda_be *b);
int cb_prefill_plan(cuda_be *b, int layer, const hkv_seg *segs, int n_segs);
int cb_prefill_attend(cuda_be *b, int layer, int n_segs, hkv_err *err);
int cb_prefill_done(cuda_be *b, int layer, int n_segs, hkv_err *err);
/* Streaming (cuda_prefill_stream.c): create/destroy with the prefill state;
 * cb_pstream_reserve allocates the buffers (1, or 0 when the device has no
 * room: nothing changed); cb_pstream_release frees them stream-ordered;
 * cb_pstream_attend queues segment sg's attention at `layer` over its own
 * keys, the copy's p->res and the far tier's [p->res, sg->pos); cb_pstream_wait
 * returns once the queued copies have read the far tier (before the host may
 * free or rewrite it). */
int cb_pstream_create(cuda_be *b, int64_t keys, int64_t blk, hkv_err *err);
void cb_pstream_destroy(cuda_be *b);
int cb_pstream_reserve(cuda_be *b);
void cb_pstream_release(cuda_be *b);
int cb_pstream_attend(cuda_be *b, int layer, const hkv_seg *sg, const cb_prompt *p, hkv_err *err);
int cb_pstream_wait(cuda_be *b, hkv_err *err);

/* Index builds on the device at prompt end (cuda_index.c): offered to the
 * tiered cache's policies while the backend lives. */
void cb_index_attach(cuda_be *b);
void cb_index_detach(cuda_be *b);

/* The attention op (cuda_attention.c). */
int cb_attention(void *self, int layer, const hkv_seg *segs, int n_segs, int64_t n, hkv_err *err);
/* The backend's flush op: a recorded step's graph launched (cb_graph_end),
 * then the deferred host steps, in layer order (the KV cache is then
 * current). On an error the pending steps are dropped and the mirrors they
 * appended to marked stale, so the next step resyncs. */
int cb_flush(void *self, hkv_err *err);
/* Micro-batch ping-pong (the backend ops attention_begin / attention_end):
 * micro-batch mb's rows [r0, r0 + n) begin (the device's part queued) and
 * end (the host's part, the merge) apart, the other micro-batch's ops in
 * between. cb_settle_halves ends the other micro-batch's open step now (its
 * page-locked results are about to be reallocated). */
int cb_attention_begin(void *self, int mb, int layer, const hkv_seg *segs, int n_segs, int64_t r0,
                       int64_t n, hkv_err *err);
int cb_attention_end(void *self, int mb, hkv_err *err);
int cb_settle_halves(cuda_be *b, hkv_err *err);
/* The host waits for event ev of the step in flight (a layer's QKV rows):
 * polled for b->spin_us, then asleep; counted in host_waits(_slept). */
int cb_wait(cuda_be *b, void *ev, hkv_err *err);

#endif
