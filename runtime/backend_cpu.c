/* The CPU backend: the forward pass's ops on the host kernels of cpu/
 * (hkv_cpu_kernels, hkv_matmul), over the engine's workspace. Row loops
 * that are cheap per row run in parallel only for batches of 8 rows or more
 * (below that the fork costs more than the work). */
#include <math.h>
#include <string.h>

#include "backend.h"
#include "engine.h"

static float *act_ptr(hkv_engine *e, int act) {
    switch (act) {
    case HKV_ACT_X: return e->x;
    case HKV_ACT_XN: return e->xn;
    case HKV_ACT_QKV: return e->qkv;
    case HKV_ACT_ATT: return e->att;
    case HKV_ACT_GU:
    case HKV_ACT_G: return e->h;   /* swiglu compacts in place */
    case HKV_ACT_TMP: return e->tmp;
    default: return NULL;
    }
}

static int64_t act_width(const hkv_engine *e, int act) {
    const hkv_model_config *c = &e->model.cfg;
    switch (act) {
    case HKV_ACT_X:
    case HKV_ACT_XN: return c->dim;
    case HKV_ACT_QKV: return e->qkv_rows;
    case HKV_ACT_ATT: return (int64_t)c->n_head * c->head_dim;
    case HKV_ACT_GU: return 2 * (int64_t)c->ffn;
    case HKV_ACT_G: return c->ffn;
    default: return 0;   /* TMP: as wide as the last product */
    }
}

static const float *norm_of(const hkv_engine *e, int layer, int role) {
    if (role == HKV_WR_OUT_NORM) return e->model.out_norm;
    const hkv_layer_weights *L = &e->model.layers[layer];
    return role == HKV_WR_ATTN_NORM ? L->attn_norm : role == HKV_WR_FFN_NORM ? L->ffn_norm : NULL;
}

/* The parts of a matrix role (QKV and gate|up may be stored as parts). */
static int parts_of(const hkv_engine *e, int layer, int role, const hkv_wmat **p) {
    if (role == HKV_WR_OUTPUT) {
        *p = &e->model.output;
        return 1;
    }
    const hkv_layer_weights *L = &e->model.layers[layer];
    switch (role) {
    case HKV_WR_QKV: *p = L->qkv; return L->n_qkv;
    case HKV_WR_WO: *p = &L->wo; return 1;
    case HKV_WR_FFN_IN: *p = L->ffn_in; return L->n_ffn_in;
    case HKV_WR_DOWN: *p = &L->wdown; return 1;
    default: return 0;
    }
}

static void rmsnorm_row(float *o, const float *x, const float *w, int n, float eps) {
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

static int c_embed(void *self, const int32_t *tokens, int64_t n, hkv_err *err) {
    hkv_engine *e = self;
    const int dim = e->model.cfg.dim;
    (void)err;
#pragma omp parallel for schedule(static) if (n >= 8)
    for (int64_t r = 0; r < n; r++)
        e->kern.dequant_rows(&e->model.tok_embd, tokens[r], tokens[r] + 1, e->x + r * dim);
    return HKV_OK;
}

static int c_rmsnorm(void *self, int dst, int src, const int64_t *rows, int64_t n, int layer,
                     int role, hkv_err *err) {
    hkv_engine *e = self;
    const int dim = e->model.cfg.dim;
    const float *w = norm_of(e, layer, role);
    float *o = act_ptr(e, dst);
    const float *x = act_ptr(e, src);
    if (!w || !o || !x) return hkv_seterr(err, HKV_E_INVAL, "rmsnorm: bad buffer or weight role");
#pragma omp parallel for schedule(static) if (n >= 8)
    for (int64_t i = 0; i < n; i++)
        rmsnorm_row(o + i * dim, x + (rows ? rows[i] : i) * dim, w, dim, e->model.cfg.norm_eps);
    return HKV_OK;
}

static int c_matmul(void *self, int dst, int src, int64_t n, int layer, int role, hkv_err *err) {
    hkv_engine *e = self;
    const hkv_wmat *parts = NULL;
    int np = parts_of(e, layer, role, &parts);
    float *y = act_ptr(e, dst);
    const float *x = act_ptr(e, src);
    if (!np || !y || !x) return hkv_seterr(err, HKV_E_INVAL, "matmul: bad buffer or weight role");
    int64_t ldy = 0;
    for (int i = 0; i < np; i++) ldy += parts[i].rows;
    if (dst == HKV_ACT_TMP && (size_t)n * (size_t)ldy > e->tmp_floats)
        return hkv_seterr(err, HKV_E_RANGE, "matmul: %lld rows of %lld outputs do not fit the "
                          "product buffer (the head takes at most %lld rows a call)", (long long)n,
                          (long long)ldy, (long long)hkv_head_rows(e->max_rows, e->p.max_seqs));
    /* Parts side by side in y's rows (QKV, gate|up): in FAST one
     * quantisation and one parallel region for all; else each staged
     * through tmp (y != tmp). One part: hkv_matmul into y. */
    return hkv_matmul_parts(&e->kern, parts, np, x, n, y, ldy, e->mm_ws, e->tmp) == HKV_OK
               ? HKV_OK
               : hkv_seterr(err, HKV_E_INTERNAL, "matrix product failed");
}

static int c_bias_rope(void *self, int layer, const int64_t *pos, int64_t n, hkv_err *err) {
    hkv_engine *e = self;
    const hkv_model *m = &e->model;
    const hkv_model_config *c = &m->cfg;
    const int hd = c->head_dim, H = c->n_head, KH = c->n_head_kv, rot = c->rope_dim, half = rot / 2;
    const int64_t ld = e->qkv_rows;
    const float *b = m->layers[layer].bqkv;
    (void)err;
    /* Each row's cos/sin table, in double as positions grow large; kept
     * across the layers of one call (same positions). */
    if (n != e->rope_n || memcmp(pos, e->rope_pos, (size_t)n * sizeof *pos)) {
        for (int64_t r = 0; r < n; r++) {
            float *cs = e->rope_cs + r * rot;
            for (int j = 0; j < half; j++) {
                double th = (double)pos[r] * (double)m->rope_inv_freq[j];
                cs[j] = (float)cos(th);
                cs[half + j] = (float)sin(th);
            }
        }
        memcpy(e->rope_pos, pos, (size_t)n * sizeof *pos);
        e->rope_n = n;
    }
#pragma omp parallel for schedule(static) if (n >= 8)
    for (int64_t r = 0; r < n; r++) {
        float *row = e->qkv + r * ld;
        if (b)
            for (int64_t j = 0; j < ld; j++) row[j] += b[j];
        for (int h = 0; h < H + KH; h++)
            rope_head(row + (size_t)h * hd, e->rope_cs + r * rot, rot, c->rope_layout);
    }
    return HKV_OK;
}

/* silu(g) * u of a row, in place over its gate half. Exact precision:
 * libm's expf, as the CUDA backend's SwiGLU, so that under the emulator the
 * CPU and device paths agree bit for bit (a 2-ulp exp flips ctkvr's near-ties
 * there). Fast: the kernel table's vector exp (within 2 ulp of expf): libm's
 * on one thread was ~5% of a batch-1 step and ~15% of a 1K prefill. */
static void swiglu_row(const hkv_cpu_kernels *kn, float *gt, const float *up, int64_t F) {
    if (kn->precision != HKV_PREC_FAST) {
        for (int64_t j = 0; j < F; j++) gt[j] = gt[j] / (1.0f + expf(-gt[j])) * up[j];
        return;
    }
    float e[256];
    for (int64_t j0 = 0; j0 < F; j0 += 256) {
        const int64_t nj = F - j0 < 256 ? F - j0 : 256;
        for (int64_t j = 0; j < nj; j++) e[j] = -gt[j0 + j];
        kn->exp(e, e, nj);
        for (int64_t j = 0; j < nj; j++) gt[j0 + j] = gt[j0 + j] / (1.0f + e[j]) * up[j0 + j];
    }
}

static int c_swiglu(void *self, int64_t n, hkv_err *err) {
    hkv_engine *e = self;
    const int64_t F = e->model.cfg.ffn;
    (void)err;
#pragma omp parallel for schedule(static) if (n >= 8)
    for (int64_t r = 0; r < n; r++) swiglu_row(&e->kern, e->h + r * 2 * F, e->h + r * 2 * F + F, F);
    /* compact [n][2F] to [n][F] in order: row r's output never overtakes
     * rows not yet moved */
    for (int64_t r = 1; r < n; r++) memmove(e->h + r * F, e->h + r * 2 * F, (size_t)F * sizeof(float));
    return HKV_OK;
}

static int c_add(void *self, int dst, int src, int64_t n, hkv_err *err) {
    hkv_engine *e = self;
    const int dim = e->model.cfg.dim;
    float *x = act_ptr(e, dst);
    const float *y = act_ptr(e, src);
    if (!x || !y) return hkv_seterr(err, HKV_E_INVAL, "add: bad buffer");
#pragma omp parallel for schedule(static) if (n >= 8)
    for (int64_t r = 0; r < n; r++)
        for (int i = 0; i < dim; i++) x[r * dim + i] += y[r * dim + i];
    return HKV_OK;
}

static int c_attention(void *self, int layer, const hkv_seg *segs, int n_segs, int64_t n,
                       hkv_err *err) {
    hkv_engine *e = self;
    (void)n;
    const int64_t qd = (int64_t)e->model.cfg.n_head * e->model.cfg.head_dim;
    return e->kv.ops->layer_step(e->kv.self, layer, segs, n_segs, e->qkv, e->qkv_rows, e->att, qd,
                                 err);
}

static int c_copy(hkv_engine *e, int act, int64_t r0, int64_t n, int64_t cols, float *host,
                  int to_host, hkv_err *err) {
    float *a = act_ptr(e, act);
    int64_t w = act_width(e, act);
    if (!w) w = cols;
    if (!a || cols < 1 || cols > w || r0 < 0 || n < 0 || r0 + n > e->max_rows ||
        (act == HKV_ACT_TMP && (size_t)(r0 + n) * (size_t)w > e->tmp_floats))
        return hkv_seterr(err, HKV_E_RANGE, "rows %lld..%lld of buffer %d (%lld wide) out of range",
                          (long long)r0, (long long)(r0 + n), act, (long long)cols);
    for (int64_t r = 0; r < n; r++) {
        float *row = a + (r0 + r) * w;
        if (to_host) memcpy(host + r * cols, row, (size_t)cols * sizeof(float));
        else memcpy(row, host + r * cols, (size_t)cols * sizeof(float));
    }
    return HKV_OK;
}

static int c_read(void *self, int act, int64_t r0, int64_t n, int64_t cols, float *dst, hkv_err *err) {
    return c_copy(self, act, r0, n, cols, dst, 1, err);
}

static int c_write(void *self, int act, int64_t r0, int64_t n, int64_t cols, const float *src,
                   hkv_err *err) {
    return c_copy(self, act, r0, n, cols, (float *)src, 0, err);
}

static void c_destroy(void *self) { (void)self; }   /* the engine owns what it uses */

static const hkv_backend_ops cpu_ops = {
    .name = "cpu",
    .embed = c_embed,
    .rmsnorm = c_rmsnorm,
    .matmul = c_matmul,
    .bias_rope = c_bias_rope,
    .swiglu = c_swiglu,
    .add = c_add,
    .attention = c_attention,
    .read = c_read,
    .write = c_write,
    .destroy = c_destroy,
};

int hkv_backend_cpu_create(hkv_backend *be, struct hkv_engine *e, hkv_err *err) {
    (void)err;
    be->ops = &cpu_ops;
    be->self = e;
    return HKV_OK;
}
