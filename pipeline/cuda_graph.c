/* The decode step replayed whole: one CUDA graph per batch shape.
 *
 * Why: a decode step whose context is all on the device (`full` with the
 * whole KV near, or sequences still inside their near window) is about a
 * dozen launches a layer (some 20 when an H100 measured it), 400-600 for an
 * 8B model, and the host took 4.5-6 us to queue each there
 * (docs/GPU_MEASURED.md): at batch 1 the host's
 * queueing, not the device, bounds such a step. For a given batch size the
 * step's operations are the same every time; what changes (the tokens,
 * their positions, where each new K/V row goes, how many near rows each
 * sequence attends) the kernels read from small device arrays. So the first
 * step of a batch shape is recorded (stream capture) while its ops run as
 * usual, and a later step writes those arrays' page-locked copies, launches
 * the graph once and does each layer's host bookkeeping (cb_defer_note)
 * without queueing anything. The host's part of each layer (its K/V rows
 * into the tiered cache) stays outside the graph and waits for that layer's
 * event node, as it waits for the same event queued op by op; the head
 * (its rows differ from call to call) runs after the graph as before.
 *
 * A step is replayed or recorded only when every layer's host step would be
 * deferred anyway: decode rows only, row i the i-th segment's one token,
 * each sequence's policy without a device part and its whole context in
 * the near tier, every layer's mirror current; not lockstep, not profiled
 * (the profile times each op), the batch's QKV rows of every layer in their
 * own page-locked slots. Anything else runs op by op, as it did. */
#include <string.h>

#include "cuda_backend_impl.h"
#include "kv_far.h"

/* The step's inputs, the only uploads a recorded step may make. */
static const int in_ids[] = {UP_TOK, UP_POS, UP_DST, UP_ROWS, UP_NROWS, UP_IDX};
#define N_IN ((int)(sizeof in_ids / sizeof in_ids[0]))

int cb_graph_create(cuda_be *b, int off, hkv_err *err) {
    cb_graph *g = &b->gr;
    g->off = off;
    if (off) return HKV_OK;
    const size_t R = (size_t)b->max_rows, S = (size_t)b->max_seqs, KH = (size_t)b->KH;
    const size_t cap[UP_COUNT] = {[UP_TOK] = R * 4, [UP_POS] = R * 8, [UP_DST] = R * 8,
                                  [UP_ROWS] = S * 4, [UP_NROWS] = S * KH * 4, [UP_IDX] = S * KH * 4};
    size_t at = 0;
    for (int i = 0; i < N_IN; i++) {
        const int id = in_ids[i];
        g->in_off[id] = at;
        g->in_cap[id] = cap[id];
        at += (cap[id] + 63) & ~(size_t)63;
    }
    int rc;
    if ((rc = hkv_pinned_alloc(&g->h_in, &b->e->mem, NULL, HKV_TIER_WORKSPACE, at, -1,
                               HKV_PIN_REQUIRE, err)))
        return hkv_err_prefix(err, "page-locked inputs of the replayed decode step");
    return hkv_gpu_event_create(&g->in_ev, err);
}

void cb_graph_destroy(cuda_be *b) {
    cb_graph *g = &b->gr;
    if (g->capturing) hkv_gpu_capture_abort(b->st);
    g->capturing = 0;
    for (int i = 0; i < CB_GRAPHS; i++) hkv_gpu_graph_free(g->slot[i].g);
    memset(g->slot, 0, sizeof g->slot);
    hkv_gpu_event_destroy(g->in_ev);
    g->in_ev = NULL;
    hkv_pinned_free(&g->h_in, &b->e->mem, NULL);
}

static int eligible(cuda_be *b, const hkv_seg *segs, int n_segs, int64_t n) {
    if (b->gr.off || b->lockstep || b->profile || n < 1 || n_segs != n || n > b->max_seqs ||
        (int64_t)b->NL * n > b->qkv_rows || b->df_count || b->half[0].open || b->half[1].open ||
        b->r0)
        return 0;
    hkv_kv *kv = &b->e->kv;
    for (int i = 0; i < n_segs; i++) {
        const hkv_seg *sg = &segs[i];
        if (sg->n != 1 || sg->row != i || sg->pos_list || sg->seq < 0 || sg->seq >= b->max_seqs ||
            (sg->flags & (HKV_SEG_PROMPT | HKV_SEG_PROMPT_END | HKV_SEG_STORE_ONLY)) ||
            sg->pos + 1 > b->NR)
            return 0;
        hkv_policy pol = {0};
        if (hkv_kv_seq_instance(kv, sg->seq, NULL, &pol, NULL)) return 0;
        if (pol.ops && (pol.ops->recall_table || pol.ops->kept_set || pol.ops->page_table ||
                        pol.ops->cand_table))
            return 0;
        const uint64_t ep = hkv_kv_seq_epoch(kv, sg->seq);
        for (int l = 0; l < b->NL; l++) {
            const int64_t m = (int64_t)sg->seq * b->NL + l;
            if (b->m_len[m] != sg->pos || b->m_epoch[m] != ep) return 0;
        }
    }
    return 1;
}

/* The recorded step's host state as if it had not run: nothing it
 * recorded reached the device, so each mirror still holds the tokens
 * before the step's (as eligible() found). */
static void undo(cuda_be *b) {
    b->stats = b->gr.stats0;
    for (int i = 0; i < UP_COUNT; i++) b->up_len[i] = 0;
    for (int j = 0; j < b->df_count; j++) {
        const int l = b->df_layer[j];
        b->ev_pending[l] = 0;
        for (int i = 0; i < b->df_nsegs; i++)
            b->m_len[(int64_t)b->df_segs[i].seq * b->NL + l] = b->df_segs[i].pos;
    }
}

/* Launch slot sl's graph after its inputs are in h_in; the call's end
 * follows it on the stream. */
static int launch(cuda_be *b, cb_graph_slot *sl, hkv_err *err) {
    cb_graph *g = &b->gr;
    int rc;
    if ((rc = hkv_gpu_graph_launch(sl->g, b->st, err)) ||
        (rc = hkv_gpu_event_record(g->in_ev, b->st, err)) || (rc = cb_call_end(b, err)))
        return rc;
    sl->used = ++g->clock;
    b->stats.graph_steps++;
    b->stats.graph_nodes += (int64_t)hkv_gpu_graph_nodes(sl->g);
    return HKV_OK;
}

static int replay(cuda_be *b, cb_graph_slot *sl, const int32_t *tokens, const int64_t *pos,
                  const hkv_seg *segs, int n_segs, int64_t n, hkv_err *err) {
    cb_graph *g = &b->gr;
    const int NL = b->NL;
    int rc, n_dec = 0, n_slow = 0;
    for (int l = 0; l < NL; l++)   /* the last call's timeline, before it is recorded again */
        if ((rc = cb_layer_settle(b, 0, l, err))) return rc;
    b->cur_half = 0;
    if ((rc = cb_decode_rows(b, 0, segs, n_segs, 0, n, &n_dec, &n_slow, err))) return rc;
    if (n_dec != n || n_slow)
        return hkv_seterr(err, HKV_E_INTERNAL, "a replayed decode step of %lld rows found %d "
                          "decode rows and %d stale mirrors", (long long)n, n_dec, n_slow);
    const void *src[UP_COUNT] = {[UP_TOK] = tokens, [UP_POS] = pos, [UP_DST] = b->h_dst,
                                 [UP_ROWS] = b->h_rows, [UP_NROWS] = b->h_nrows,
                                 [UP_IDX] = b->h_idx};
    const size_t KH = (size_t)b->KH, len[UP_COUNT] = {
        [UP_TOK] = (size_t)n * 4, [UP_POS] = (size_t)n * 8, [UP_DST] = (size_t)n * 8,
        [UP_ROWS] = (size_t)n * 4, [UP_NROWS] = (size_t)n * KH * 4, [UP_IDX] = (size_t)n * KH * 4};
    uint64_t bytes = 0;
    for (int i = 0; i < N_IN; i++) {
        const int id = in_ids[i];
        if (sl->in_len[id] != len[id])
            return hkv_seterr(err, HKV_E_INTERNAL, "the recorded decode step of %lld rows uploads "
                              "%zu bytes of input %d; its replay has %zu", (long long)n,
                              sl->in_len[id], id, len[id]);
        memcpy((char *)g->h_in.p + g->in_off[id], src[id], len[id]);
        bytes += len[id];
    }
    if ((rc = cb_call_start(b, err)) || (rc = launch(b, sl, err))) {
        for (int i = 0; i < UP_COUNT; i++) b->up_len[i] = 0;
        return rc;
    }
    for (int i = 0; i < N_IN; i++) cb_up_remember(b, in_ids[i], src[in_ids[i]], len[in_ids[i]]);
    /* every layer's step as att_begin counts a deferred one */
    for (int l = 0; l < NL; l++) cb_defer_note(b, l, segs, n_segs, n);
    b->stats.decode_rows += (int64_t)n * NL;
    b->stats.layer_steps += NL;
    b->stats.bytes_d2h += (uint64_t)NL * (uint64_t)n * (uint64_t)b->qkv_w * 4;
    b->stats.bytes_h2d += bytes;
    return HKV_OK;
}

int cb_graph_step(void *self, const int32_t *tokens, const int64_t *pos, const hkv_seg *segs,
                  int n_segs, int64_t n, int *mode, hkv_err *err) {
    cuda_be *b = self;
    cb_graph *g = &b->gr;
    *mode = 0;
    if (!eligible(b, segs, n_segs, n)) return HKV_OK;
    const int inv = b->e->kern.batch_invariant != 0;
    cb_graph_slot *sl = NULL;
    for (int i = 0; i < CB_GRAPHS && !sl; i++)
        if (g->slot[i].g && g->slot[i].n == n && g->slot[i].inv == inv) sl = &g->slot[i];
    int rc;
    if ((rc = hkv_gpu_event_sync(g->in_ev, err))) return rc;   /* the last launch read h_in */
    if (sl) {
        if ((rc = replay(b, sl, tokens, pos, segs, n_segs, n, err))) return rc;
        *mode = 1;
        return HKV_OK;
    }
    /* Record this one: the earlier calls' timeline harvested first (not
     * while recording), its call started outside the graph (the timer's
     * events alternate between calls), its inputs' copies the graph's. */
    for (int hi = 0; hi < 2; hi++)
        for (int l = 0; l < b->NL; l++)
            if ((rc = cb_layer_settle(b, hi, l, err))) return rc;
    if ((rc = cb_call_start(b, err))) return rc;
    g->stats0 = b->stats;
    for (int i = 0; i < UP_COUNT; i++) b->up_len[i] = 0, g->in_len[i] = 0;
    hkv_err e2 = {0};
    if (hkv_gpu_capture_begin(b->st, &e2)) {   /* no recording here: op by op, as with graphs off */
        g->off = 1;
        hkv_warn(stderr, "the device could not begin recording a decode step as a CUDA graph (%s); "
                 "every step queues its ops one by one from now on", e2.msg);
        return HKV_OK;
    }
    g->capturing = 1;
    g->cap_n = n, g->cap_inv = inv;
    *mode = 2;
    return HKV_OK;
}

int cb_graph_stage(cuda_be *b, int id, void *dev, const void *src, size_t bytes, hkv_err *err) {
    cb_graph *g = &b->gr;
    if (id < 0 || !g->in_cap[id] || bytes > g->in_cap[id])
        return hkv_seterr(err, HKV_E_INTERNAL, "an upload (%d, %zu bytes) inside a recorded decode "
                          "step is not one of its inputs", id, bytes);
    if (g->in_len[id])   /* (cb_stage skips the same bytes again) */
        return hkv_seterr(err, HKV_E_INTERNAL, "input %d of a recorded decode step uploaded twice "
                          "with different bytes", id);
    char *h = (char *)g->h_in.p + g->in_off[id];
    memcpy(h, src, bytes);
    int rc = hkv_gpu_upload(dev, h, bytes, b->st, err);
    if (rc) return rc;
    g->in_len[id] = bytes;
    b->stats.bytes_h2d += bytes;
    cb_up_remember(b, id, src, bytes);
    return HKV_OK;
}

int cb_graph_end(cuda_be *b, int ok, hkv_err *err) {
    cb_graph *g = &b->gr;
    g->capturing = 0;
    const int refused = hkv_gpu_capturing(b->st) == 2;
    hkv_gpu_graph *x = NULL;
    hkv_err e2 = {0};
    int rc = ok && !refused ? hkv_gpu_capture_end(b->st, &x, &e2) : HKV_E_INTERNAL;
    if (rc) {   /* nothing of the step ran */
        if (!x) hkv_gpu_capture_abort(b->st);
        undo(b);
        if (!refused && !ok) return HKV_E_INTERNAL;   /* an op's own error, reported by the caller */
        /* the driver refused to record an op: the caller runs the step again, op by op */
        g->off = 1;
        hkv_warn(stderr, "the device could not record the %lld-row decode step as a CUDA graph "
                 "(%s); every step queues its ops one by one from now on", (long long)g->cap_n,
                 e2.code ? e2.msg : "an operation was refused while recording");
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "the decode step could not be recorded");
    }
    cb_graph_slot *sl = &g->slot[0];   /* a free slot, else the least recently used */
    for (int i = 0; i < CB_GRAPHS; i++) {
        if (!g->slot[i].g) {
            sl = &g->slot[i];
            break;
        }
        if (g->slot[i].used < sl->used) sl = &g->slot[i];
    }
    hkv_gpu_graph_free(sl->g);   /* (a launch in flight completes first) */
    *sl = (cb_graph_slot){.g = x, .n = g->cap_n, .inv = g->cap_inv};
    memcpy(sl->in_len, g->in_len, sizeof sl->in_len);
    if ((rc = launch(b, sl, err))) {
        undo(b);
        return rc;
    }
    b->stats.graph_captures++;
    return HKV_OK;
}
