/* Loading a Llama-family model: tensors by name, shapes checked against the
 * config, matrices repacked, Q/K/V and gate/up stacked so each is one GEMV. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_types.h"
#include "host_mem.h"

static const hkv_gguf_tensor *need(const hkv_gguf *g, const char *name, int64_t ne0, int64_t ne1,
                                   hkv_err *err) {
    const hkv_gguf_tensor *t = hkv_gguf_find_tensor(g, name);
    if (!t) {
        hkv_seterr(err, HKV_E_FORMAT, "tensor '%s' is missing", name);
        return NULL;
    }
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1) {
        hkv_seterr(err, HKV_E_FORMAT, "tensor '%s' has shape [%lld, %lld, %lld, %lld], expected "
                   "[%lld, %lld]", name, (long long)t->ne[0], (long long)t->ne[1],
                   (long long)t->ne[2], (long long)t->ne[3], (long long)ne0, (long long)ne1);
        return NULL;
    }
    return t;
}

/* A 1-D tensor of n elements dequantised to a float array. */
static int load_vec(const hkv_gguf *g, const char *name, int64_t n, float **out, hkv_err *err) {
    const hkv_gguf_tensor *t = need(g, name, n, 1, err);
    if (!t) return err ? err->code : HKV_E_FORMAT;
    float *v = hkv_host_alloc(NULL, HKV_TIER_WEIGHTS, (size_t)n * sizeof(float), err);
    if (!v) return HKV_E_NOMEM;
    int rc = hkv_ggml_dequant_row(t->type, t->data, v, n);
    if (rc) {
        free(v);
        return hkv_seterr(err, rc, "tensor '%s': cannot dequantise type %d", name, t->type);
    }
    *out = v;
    return HKV_OK;
}

static int load_mat(hkv_model *m, const hkv_gguf *g, const char *name, int64_t cols, int64_t rows,
                    hkv_wmat *w, hkv_err *err) {
    const hkv_gguf_tensor *t = need(g, name, cols, rows, err);
    if (!t) return err ? err->code : HKV_E_FORMAT;
    int approx = 0;
    int rc = hkv_wmat_from_gguf(w, t, &approx, err);
    if (rc) return rc;
    m->n_repacked_f16 += approx;
    m->weight_bytes += hkv_wmat_bytes(w);
    return HKV_OK;
}

/* Stack parts into out[0] when their types agree; otherwise keep them apart. */
static int stack(hkv_wmat *parts, int n, int *n_out, hkv_err *err) {
    for (int i = 1; i < n; i++)
        if (parts[i].type != parts[0].type) {
            *n_out = n;
            return HKV_OK;
        }
    hkv_wmat fused;
    int rc = hkv_wmat_concat(&fused, parts, n, err);
    if (rc) return rc;
    for (int i = 0; i < n; i++) hkv_wmat_free(&parts[i]);
    parts[0] = fused;
    *n_out = 1;
    return HKV_OK;
}

static int load_layer(hkv_model *m, const hkv_gguf *g, int l, hkv_err *err) {
    const hkv_model_config *c = &m->cfg;
    hkv_layer_weights *L = &m->layers[l];
    int64_t qd = (int64_t)c->n_head * c->head_dim, kd = (int64_t)c->n_head_kv * c->head_dim;
    char nm[96];
    int rc;
#define NAME(s) (snprintf(nm, sizeof nm, "blk.%d.%s", l, s), nm)
    if ((rc = load_vec(g, NAME("attn_norm.weight"), c->dim, &L->attn_norm, err)) ||
        (rc = load_vec(g, NAME("ffn_norm.weight"), c->dim, &L->ffn_norm, err)) ||
        (rc = load_mat(m, g, NAME("attn_q.weight"), c->dim, qd, &L->qkv[0], err)) ||
        (rc = load_mat(m, g, NAME("attn_k.weight"), c->dim, kd, &L->qkv[1], err)) ||
        (rc = load_mat(m, g, NAME("attn_v.weight"), c->dim, kd, &L->qkv[2], err)) ||
        (rc = load_mat(m, g, NAME("attn_output.weight"), qd, c->dim, &L->wo, err)) ||
        (rc = load_mat(m, g, NAME("ffn_gate.weight"), c->dim, c->ffn, &L->ffn_in[0], err)) ||
        (rc = load_mat(m, g, NAME("ffn_up.weight"), c->dim, c->ffn, &L->ffn_in[1], err)) ||
        (rc = load_mat(m, g, NAME("ffn_down.weight"), c->ffn, c->dim, &L->wdown, err)))
        return rc;
    if (c->qkv_bias) {
        L->bqkv = hkv_host_alloc(NULL, HKV_TIER_WEIGHTS, (size_t)(qd + 2 * kd) * sizeof(float), err);
        if (!L->bqkv) return HKV_E_NOMEM;
        float *b[3] = {0};
        if ((rc = load_vec(g, NAME("attn_q.bias"), qd, &b[0], err)) ||
            (rc = load_vec(g, NAME("attn_k.bias"), kd, &b[1], err)) ||
            (rc = load_vec(g, NAME("attn_v.bias"), kd, &b[2], err))) {
            for (int i = 0; i < 3; i++) free(b[i]);
            return rc;
        }
        memcpy(L->bqkv, b[0], qd * sizeof(float));
        memcpy(L->bqkv + qd, b[1], kd * sizeof(float));
        memcpy(L->bqkv + qd + kd, b[2], kd * sizeof(float));
        for (int i = 0; i < 3; i++) free(b[i]);
    }
#undef NAME
    if ((rc = stack(L->qkv, 3, &L->n_qkv, err))) return rc;
    return stack(L->ffn_in, 2, &L->n_ffn_in, err);
}

static int load_rope(hkv_model *m, const hkv_gguf *g, hkv_err *err) {
    const hkv_model_config *c = &m->cfg;
    int half = c->rope_dim / 2;
    m->rope_inv_freq = hkv_host_alloc(NULL, HKV_TIER_WEIGHTS, (size_t)half * sizeof(float), err);
    if (!m->rope_inv_freq) return HKV_E_NOMEM;
    for (int i = 0; i < half; i++)
        m->rope_inv_freq[i] = (float)pow((double)c->rope_base, -2.0 * i / c->rope_dim) /
                              c->rope_scale;
    /* Llama 3.1-style frequency factors: theta_i / factor_i. */
    const hkv_gguf_tensor *t = hkv_gguf_find_tensor(g, "rope_freqs.weight");
    if (t) {
        float *f = NULL;
        int rc = load_vec(g, "rope_freqs.weight", half, &f, err);
        if (rc) return rc;
        for (int i = 0; i < half; i++) {
            if (!(f[i] > 0)) {
                free(f);
                return hkv_seterr(err, HKV_E_FORMAT, "rope_freqs.weight[%d] is not positive", i);
            }
            m->rope_inv_freq[i] /= f[i];
        }
        free(f);
    }
    return HKV_OK;
}

int hkv_model_load(hkv_model *m, const hkv_gguf *g, hkv_err *err) {
    memset(m, 0, sizeof *m);
    int rc = hkv_model_config_read(g, &m->cfg, err);
    if (rc) return rc;
    const hkv_model_config *c = &m->cfg;
    /* block_count comes from the file: before allocating per layer, check
     * that the file can hold that many layers (9 tensors each, plus the
     * embeddings and the output norm), so a hostile count cannot ask for
     * gigabytes of layer structs. */
    if ((uint64_t)c->n_layer * 9 + 2 > g->n_tensors)
        return hkv_seterr(err, HKV_E_FORMAT, "loading model: block_count %d needs at least %llu "
                          "tensors (9 per layer), the file has %llu", c->n_layer,
                          (unsigned long long)c->n_layer * 9 + 2, (unsigned long long)g->n_tensors);
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    if (!m->layers) return hkv_seterr(err, HKV_E_NOMEM, "no memory for %d layers", c->n_layer);
    if ((rc = load_mat(m, g, "token_embd.weight", c->dim, c->vocab, &m->tok_embd, err)) ||
        (rc = load_vec(g, "output_norm.weight", c->dim, &m->out_norm, err)) ||
        (rc = load_rope(m, g, err)))
        goto fail;
    if (c->tied_output) {
        m->output = m->tok_embd;   /* shares buffers: freed once */
    } else if ((rc = load_mat(m, g, "output.weight", c->dim, c->vocab, &m->output, err))) {
        goto fail;
    }
    for (int l = 0; l < c->n_layer; l++)
        if ((rc = load_layer(m, g, l, err))) goto fail;
    return HKV_OK;
fail:
    hkv_err_prefix(err, "loading model");
    hkv_model_free(m);
    return rc;
}

void hkv_model_free(hkv_model *m) {
    if (!m) return;
    if (m->layers) {
        for (int l = 0; l < m->cfg.n_layer; l++) {
            hkv_layer_weights *L = &m->layers[l];
            free(L->attn_norm);
            free(L->ffn_norm);
            free(L->bqkv);
            for (int i = 0; i < 3; i++) hkv_wmat_free(&L->qkv[i]);
            for (int i = 0; i < 2; i++) hkv_wmat_free(&L->ffn_in[i]);
            hkv_wmat_free(&L->wo);
            hkv_wmat_free(&L->wdown);
        }
        free(m->layers);
    }
    if (m->output.q != m->tok_embd.q) hkv_wmat_free(&m->output);   /* tied: its own only once packed */
    hkv_wmat_free(&m->tok_embd);
    free(m->out_norm);
    free(m->rope_inv_freq);
    memset(m, 0, sizeof *m);
}
