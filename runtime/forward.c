/* The Llama-family forward pass over a batch of rows (tokens of one or many
 * sequences), layer by layer:
 *   x = embed(tok)
 *   per layer: xn = rmsnorm(x) * w;  q,k,v = xn Wqkv (+b);  rope(q, k)
 *              att = kv.layer_step(q, k, v);  x += att Wo
 *              xn = rmsnorm(x) * w;  x += (silu(xn Wg) * (xn Wu)) Wd
 *   logits = rmsnorm(x) Wout   (only for the rows asked for)
 * once, as ops of the engine's backend (runtime/backend.h): the host
 * kernels, or the device with the CPU-GPU attention pipeline. */
#include <math.h>
#include <string.h>
#include <time.h>

#include "engine.h"

double hkv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int check_batch(const hkv_engine *e, const int32_t *tokens, int64_t n_rows,
                       const hkv_seg *segs, int n_segs, const int64_t *logit_rows, int n_logits,
                       hkv_err *err) {
    if (n_rows < 1 || n_rows > e->max_rows)
        return hkv_seterr(err, HKV_E_RANGE, "batch of %lld rows is out of range (1..%d)",
                          (long long)n_rows, e->max_rows);
    int64_t covered = 0;
    for (int i = 0; i < n_segs; i++) {
        if (segs[i].n < 1 || segs[i].row != covered)
            return hkv_seterr(err, HKV_E_INVAL, "segment %d does not continue the batch rows", i);
        covered += segs[i].n;
    }
    if (covered != n_rows)
        return hkv_seterr(err, HKV_E_INVAL, "segments cover %lld of %lld rows",
                          (long long)covered, (long long)n_rows);
    for (int64_t r = 0; r < n_rows; r++)
        if (tokens[r] < 0 || tokens[r] >= e->model.cfg.vocab)
            return hkv_seterr(err, HKV_E_RANGE, "token id %d is outside the vocabulary (0..%d)",
                              tokens[r], e->model.cfg.vocab - 1);
    if (n_logits < 0 || n_logits > n_rows)
        return hkv_seterr(err, HKV_E_RANGE, "%d logit rows asked of a %lld-row batch", n_logits,
                          (long long)n_rows);
    for (int i = 0; i < n_logits; i++)
        if (logit_rows[i] < 0 || logit_rows[i] >= n_rows)
            return hkv_seterr(err, HKV_E_RANGE, "logit row %lld is outside the batch",
                              (long long)logit_rows[i]);
    return HKV_OK;
}

int hkv_forward_embed(hkv_engine *e, const int32_t *tokens, int64_t n_rows, hkv_err *err) {
    const hkv_model *m = &e->model;
    if (n_rows < 1 || n_rows > e->max_rows)
        return hkv_seterr(err, HKV_E_RANGE, "batch of %lld rows is out of range (1..%d)",
                          (long long)n_rows, e->max_rows);
    for (int64_t r = 0; r < n_rows; r++)
        if (tokens[r] < 0 || tokens[r] >= m->cfg.vocab)
            return hkv_seterr(err, HKV_E_RANGE, "token id %d is outside the vocabulary (0..%d)",
                              tokens[r], m->cfg.vocab - 1);
    return e->be.ops->embed(e->be.self, tokens, n_rows, err);
}

/* X += TMP (a residual), then XN = the norm of (layer, role) of X: one
 * backend op where the backend fuses them. */
int hkv_forward_add_norm(const hkv_backend_ops *o, void *b, int64_t n, int layer, int role,
                         hkv_err *err) {
    if (o->add_rmsnorm) return o->add_rmsnorm(b, HKV_ACT_XN, HKV_ACT_X, HKV_ACT_TMP, n, layer, role, err);
    int rc = o->add(b, HKV_ACT_X, HKV_ACT_TMP, n, err);
    return rc ? rc : o->rmsnorm(b, HKV_ACT_XN, HKV_ACT_X, NULL, n, layer, role, err);
}

/* Each row's position (a segment of selected rows carries its list). */
static void fill_pos(hkv_engine *e, const hkv_seg *segs, int n_segs) {
    for (int i = 0; i < n_segs; i++)
        for (int t = 0; t < segs[i].n; t++)
            e->pos[segs[i].row + t] = segs[i].pos_list ? segs[i].pos_list[t] : segs[i].pos + t;
}

static int layers(hkv_engine *e, int l0, int l1, int64_t n_rows, const hkv_seg *segs, int n_segs,
                  hkv_err *err) {
    const hkv_model_config *c = &e->model.cfg;
    if (l0 < 0 || l1 > c->n_layer || l0 > l1 || n_rows < 1 || n_rows > e->max_rows)
        return hkv_seterr(err, HKV_E_RANGE, "layers [%d, %d) of %d rows: out of range", l0, l1,
                          (int)n_rows);
    const hkv_backend_ops *o = e->be.ops;
    void *b = e->be.self;
    const int64_t n = n_rows;
    double t_mm = 0, t_att = 0, ts;
    int rc;
    fill_pos(e, segs, n_segs);

    /* A layer's last residual is added with the next layer's first norm where
     * the backend fuses them; the range's last layer adds it alone. */
    int pending = 0;
    for (int l = l0; l < l1; l++) {
        if ((rc = pending ? hkv_forward_add_norm(o, b, n, l, HKV_WR_ATTN_NORM, err)
                          : o->rmsnorm(b, HKV_ACT_XN, HKV_ACT_X, NULL, n, l, HKV_WR_ATTN_NORM, err)))
            return rc;
        pending = 0;
        ts = hkv_now();
        if ((rc = o->matmul(b, HKV_ACT_QKV, HKV_ACT_XN, n, l, HKV_WR_QKV, err))) return rc;
        t_mm += hkv_now() - ts;
        if ((rc = o->bias_rope(b, l, e->pos, n, err))) return rc;
        ts = hkv_now();
        if ((rc = o->attention(b, l, segs, n_segs, n, err)))
            return hkv_err_prefix(err, "layer %d attention", l);
        t_att += hkv_now() - ts;
        ts = hkv_now();
        if ((rc = o->matmul(b, HKV_ACT_TMP, HKV_ACT_ATT, n, l, HKV_WR_WO, err))) return rc;
        t_mm += hkv_now() - ts;
        if ((rc = hkv_forward_add_norm(o, b, n, l, HKV_WR_FFN_NORM, err))) return rc;
        ts = hkv_now();
        if ((rc = o->matmul(b, HKV_ACT_GU, HKV_ACT_XN, n, l, HKV_WR_FFN_IN, err))) return rc;
        t_mm += hkv_now() - ts;
        if ((rc = o->swiglu(b, n, err))) return rc;
        ts = hkv_now();
        if ((rc = o->matmul(b, HKV_ACT_TMP, HKV_ACT_G, n, l, HKV_WR_DOWN, err))) return rc;
        t_mm += hkv_now() - ts;
        if (o->add_rmsnorm && l + 1 < l1)
            pending = 1;
        else if ((rc = o->add(b, HKV_ACT_X, HKV_ACT_TMP, n, err)))
            return rc;
    }

    e->stats.matmul += t_mm;
    e->stats.attn += t_att;
    return HKV_OK;
}

/* The layers, then the backend's flush; mode as step_graph's (backend.h):
 * 1 the layers already ran (a graph replayed), 2 plainly (being recorded). */
static int layers_flush(hkv_engine *e, int l0, int l1, int64_t n_rows, const hkv_seg *segs,
                        int n_segs, int mode, hkv_err *err) {
    int rc = HKV_OK;
    if (mode == 1) {
        /* nothing left to queue: the flush below runs the host's part */
    } else if (mode != 2 && hkv_forward_pingpong_ok(e, n_rows, segs, n_segs) && l0 >= 0 &&
               l1 <= e->model.cfg.n_layer && l0 < l1) {
        for (int i = 0; i < n_segs; i++) e->pos[segs[i].row] = segs[i].pos;
        rc = hkv_forward_layers_pingpong(e, l0, l1, n_rows, segs, n_segs, err);
    } else {
        rc = layers(e, l0, l1, n_rows, segs, n_segs, err);
    }
    const hkv_backend_ops *o = e->be.ops;
    if (o->flush) {   /* the host's deferred part: after an error too, reporting the first */
        int rc2 = o->flush(e->be.self, rc ? NULL : err);
        /* (a recording the device refused: the call runs again, hkv_forward) */
        if (!rc || (mode == 2 && rc2 == HKV_E_UNSUPPORTED)) rc = rc2;
    }
    return rc;
}

int hkv_forward_layers(hkv_engine *e, int l0, int l1, int64_t n_rows, const hkv_seg *segs,
                       int n_segs, hkv_err *err) {
    return layers_flush(e, l0, l1, n_rows, segs, n_segs, 0, err);
}

int hkv_forward_head(hkv_engine *e, const int64_t *logit_rows, int n_logits, float *logits,
                     hkv_err *err) {
    if (n_logits < 1) return HKV_OK;
    const hkv_backend_ops *o = e->be.ops;
    void *b = e->be.self;
    /* Final norm and the output projection for the requested rows only, at
     * most hkv_head_rows a call (the logits buffer's rows). */
    double ts = hkv_now();
    int rc = HKV_OK;
    const int vocab = e->model.cfg.vocab;
    const int64_t g = hkv_head_rows(e->max_rows, e->p.max_seqs);
    for (int64_t i = 0; i < n_logits && !rc; i += g) {
        const int m = (int)(n_logits - i < g ? n_logits - i : g);
        if ((rc = o->rmsnorm(b, HKV_ACT_XN, HKV_ACT_X, logit_rows + i, m, 0, HKV_WR_OUT_NORM, err)) ||
            (rc = o->matmul(b, HKV_ACT_TMP, HKV_ACT_XN, m, 0, HKV_WR_OUTPUT, err)) ||
            (rc = o->read(b, HKV_ACT_TMP, 0, m, vocab, logits + i * (int64_t)vocab, err)))
            return hkv_err_prefix(err, "output head");
    }
    e->stats.matmul += hkv_now() - ts;
    return HKV_OK;
}

/* The embedding and every layer of a call, mode as step_graph's. */
static int embed_layers(hkv_engine *e, const int32_t *tokens, int64_t n_rows, const hkv_seg *segs,
                        int n_segs, int mode, hkv_err *err) {
    const hkv_backend_ops *o = e->be.ops;
    int rc = mode == 1 ? HKV_OK : hkv_forward_embed(e, tokens, n_rows, err);
    if (rc) {
        if (mode == 2 && o->flush && o->flush(e->be.self, NULL) == HKV_E_UNSUPPORTED)
            rc = HKV_E_UNSUPPORTED;   /* (the recording refused) */
        return rc;
    }
    return layers_flush(e, 0, e->model.cfg.n_layer, n_rows, segs, n_segs, mode, err);
}

int hkv_forward(hkv_engine *e, const int32_t *tokens, int64_t n_rows, const hkv_seg *segs,
                int n_segs, const int64_t *logit_rows, int n_logits, float *logits,
                hkv_err *err) {
    int rc = check_batch(e, tokens, n_rows, segs, n_segs, logit_rows, n_logits, err);
    if (rc) return rc;
    double t0 = hkv_now(), mm0 = e->stats.matmul, at0 = e->stats.attn;
    const hkv_backend_ops *o = e->be.ops;
    int mode = 0;   /* a decode step the backend replays or records whole (backend.h) */
    if (o->step_graph) {
        fill_pos(e, segs, n_segs);
        if ((rc = o->step_graph(e->be.self, tokens, e->pos, segs, n_segs, n_rows, &mode, err)))
            return rc;
    }
    rc = embed_layers(e, tokens, n_rows, segs, n_segs, mode, err);
    if (rc == HKV_E_UNSUPPORTED && mode == 2) {   /* the recording refused: nothing of it ran */
        hkv_err_clear(err);
        rc = embed_layers(e, tokens, n_rows, segs, n_segs, 0, err);
    }
    if (rc ||
        (rc = hkv_forward_head(e, logit_rows, n_logits, logits, err)))
        return rc;
    double total = hkv_now() - t0;
    e->stats.other += total - (e->stats.matmul - mm0) - (e->stats.attn - at0);
    e->stats.rows += n_rows;
    e->stats.calls++;
    return HKV_OK;
}
