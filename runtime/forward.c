/* The Llama-family forward pass over a batch of rows (tokens of one or many
 * sequences), layer by layer:
 *   x = embed(tok)
 *   per layer: xn = rmsnorm(x) * w;  q,k,v = xn Wqkv (+b);  rope(q, k)
 *              att = kv.layer_step(q, k, v);  x += att Wo
 *              xn = rmsnorm(x) * w;  x += (silu(xn Wg) * (xn Wu)) Wd
 *   logits = rmsnorm(x) Wout   (only for the rows asked for) */
#include <math.h>
#include <string.h>
#include <time.h>

#include "engine.h"

double hkv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void rmsnorm(float *o, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) o[i] = x[i] * r * w[i];
}

/* Rotate one head in place with this row's cos/sin table. */
static void rope_head(float *v, const float *cs, int rot, int layout) {
    int half = rot / 2;
    const float *c = cs, *s = cs + half;
    if (layout == HKV_ROPE_PAIRS) {
        for (int i = 0; i < half; i++) {
            float a = v[2 * i], b = v[2 * i + 1];
            v[2 * i] = a * c[i] - b * s[i];
            v[2 * i + 1] = a * s[i] + b * c[i];
        }
    } else {
        for (int i = 0; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * c[i] - b * s[i];
            v[i + half] = a * s[i] + b * c[i];
        }
    }
}

/* y = x W^T for a matrix split into parts laid side by side in y rows. */
static int matmul_parts(hkv_engine *e, const hkv_wmat *parts, int n_parts, const float *x,
                        int64_t n, float *y, int64_t ldy, hkv_err *err) {
    if (n_parts == 1 && parts[0].rows == ldy)
        return hkv_matmul(&e->kern, &parts[0], x, n, y, e->mm_ws) == HKV_OK
                   ? HKV_OK
                   : hkv_seterr(err, HKV_E_INTERNAL, "matrix product failed");
    int64_t off = 0;
    for (int i = 0; i < n_parts; i++) {
        if (hkv_matmul(&e->kern, &parts[i], x, n, e->tmp, e->mm_ws) != HKV_OK)
            return hkv_seterr(err, HKV_E_INTERNAL, "matrix product failed");
        for (int64_t r = 0; r < n; r++)
            memcpy(y + r * ldy + off, e->tmp + r * parts[i].rows, parts[i].rows * sizeof(float));
        off += parts[i].rows;
    }
    return HKV_OK;
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
    const int dim = m->cfg.dim;
#pragma omp parallel for schedule(static) if (n_rows >= 8)
    for (int64_t r = 0; r < n_rows; r++)
        e->kern.dequant_rows(&m->tok_embd, tokens[r], tokens[r] + 1, e->x + r * dim);
    return HKV_OK;
}

int hkv_forward_layers(hkv_engine *e, int l0, int l1, int64_t n_rows, const hkv_seg *segs,
                       int n_segs, hkv_err *err) {
    const hkv_model *m = &e->model;
    const hkv_model_config *c = &m->cfg;
    if (l0 < 0 || l1 > c->n_layer || l0 > l1 || n_rows < 1 || n_rows > e->max_rows)
        return hkv_seterr(err, HKV_E_RANGE, "layers [%d, %d) of %d rows: out of range", l0, l1,
                          (int)n_rows);
    const int dim = c->dim, hd = c->head_dim, H = c->n_head, KH = c->n_head_kv;
    const int64_t qd = (int64_t)H * hd, ld = e->qkv_rows;
    const int rot = c->rope_dim, half = rot / 2;
    double t_mm = 0, t_att = 0, ts;
    int rc;

    /* Each row's rope table (shared by the layers); a segment of selected
     * rows carries each row's original position. */
    for (int i = 0; i < n_segs; i++)
        for (int t = 0; t < segs[i].n; t++) {
            int64_t r = segs[i].row + t;
            float *cs = e->rope_cs + r * rot;
            double pos = (double)(segs[i].pos_list ? segs[i].pos_list[t] : segs[i].pos + t);
            for (int j = 0; j < half; j++) {
                double th = pos * (double)m->rope_inv_freq[j];
                cs[j] = (float)cos(th);
                cs[half + j] = (float)sin(th);
            }
        }

    for (int l = l0; l < l1; l++) {
        const hkv_layer_weights *L = &m->layers[l];
#pragma omp parallel for schedule(static) if (n_rows >= 8)
        for (int64_t r = 0; r < n_rows; r++)
            rmsnorm(e->xn + r * dim, e->x + r * dim, L->attn_norm, dim, c->norm_eps);
        ts = hkv_now();
        if ((rc = matmul_parts(e, L->qkv, L->n_qkv, e->xn, n_rows, e->qkv, ld, err))) return rc;
        t_mm += hkv_now() - ts;
#pragma omp parallel for schedule(static) if (n_rows >= 8)
        for (int64_t r = 0; r < n_rows; r++) {
            float *row = e->qkv + r * ld;
            if (L->bqkv)
                for (int64_t j = 0; j < ld; j++) row[j] += L->bqkv[j];
            for (int h = 0; h < H + KH; h++)
                rope_head(row + (size_t)h * hd, e->rope_cs + r * rot, rot, c->rope_layout);
        }
        ts = hkv_now();
        if ((rc = e->kv.ops->layer_step(e->kv.self, l, segs, n_segs, e->qkv, ld, e->att, qd, err)))
            return hkv_err_prefix(err, "layer %d attention", l);
        t_att += hkv_now() - ts;
        ts = hkv_now();
        if ((rc = matmul_parts(e, &L->wo, 1, e->att, n_rows, e->tmp, dim, err))) return rc;
        t_mm += hkv_now() - ts;
#pragma omp parallel for schedule(static) if (n_rows >= 8)
        for (int64_t r = 0; r < n_rows; r++) {
            float *x = e->x + r * dim;
            const float *y = e->tmp + r * dim;
            for (int i = 0; i < dim; i++) x[i] += y[i];
            rmsnorm(e->xn + r * dim, x, L->ffn_norm, dim, c->norm_eps);
        }
        ts = hkv_now();
        const int64_t F = c->ffn;
        if ((rc = matmul_parts(e, L->ffn_in, L->n_ffn_in, e->xn, n_rows, e->h, 2 * F, err)))
            return rc;
        t_mm += hkv_now() - ts;
        /* SwiGLU, compacted to [n_rows][F] at the front of h for the down GEMM
         * (in place: row r's output never overtakes rows not yet read). */
        for (int64_t r = 0; r < n_rows; r++) {
            const float *gt = e->h + r * 2 * F, *up = gt + F;
            float *o = e->h + r * F;
            for (int64_t j = 0; j < F; j++) {
                float gv = gt[j], u = up[j];
                o[j] = gv / (1.0f + expf(-gv)) * u;
            }
        }
        ts = hkv_now();
        if ((rc = matmul_parts(e, &L->wdown, 1, e->h, n_rows, e->tmp, dim, err))) return rc;
        t_mm += hkv_now() - ts;
#pragma omp parallel for schedule(static) if (n_rows >= 8)
        for (int64_t r = 0; r < n_rows; r++) {
            float *x = e->x + r * dim;
            const float *y = e->tmp + r * dim;
            for (int i = 0; i < dim; i++) x[i] += y[i];
        }
    }

    e->stats.matmul += t_mm;
    e->stats.attn += t_att;
    return HKV_OK;
}

int hkv_forward_head(hkv_engine *e, const int64_t *logit_rows, int n_logits, float *logits,
                     hkv_err *err) {
    const hkv_model *m = &e->model;
    const int dim = m->cfg.dim;
    /* Final norm and the output projection for the requested rows only. */
    for (int i = 0; i < n_logits; i++)
        rmsnorm(e->xn + (int64_t)i * dim, e->x + logit_rows[i] * dim, m->out_norm, dim,
                m->cfg.norm_eps);
    double ts = hkv_now();
    if (n_logits > 0 && hkv_matmul(&e->kern, &m->output, e->xn, n_logits, logits, e->mm_ws))
        return hkv_seterr(err, HKV_E_INTERNAL, "output projection failed");
    e->stats.matmul += hkv_now() - ts;
    return HKV_OK;
}

int hkv_forward(hkv_engine *e, const int32_t *tokens, int64_t n_rows, const hkv_seg *segs,
                int n_segs, const int64_t *logit_rows, int n_logits, float *logits,
                hkv_err *err) {
    int rc = check_batch(e, tokens, n_rows, segs, n_segs, logit_rows, n_logits, err);
    if (rc) return rc;
    double t0 = hkv_now(), mm0 = e->stats.matmul, at0 = e->stats.attn;
    if ((rc = hkv_forward_embed(e, tokens, n_rows, err)) ||
        (rc = hkv_forward_layers(e, 0, e->model.cfg.n_layer, n_rows, segs, n_segs, err)) ||
        (rc = hkv_forward_head(e, logit_rows, n_logits, logits, err)))
        return rc;
    double total = hkv_now() - t0;
    e->stats.other += total - (e->stats.matmul - mm0) - (e->stats.attn - at0);
    e->stats.rows += n_rows;
    e->stats.calls++;
    return HKV_OK;
}
