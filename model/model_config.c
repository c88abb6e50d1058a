/* Model hyperparameters from GGUF metadata ({arch}.* keys). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model.h"

static int get_int(const hkv_gguf *g, const char *arch, const char *suffix, int *out,
                   int required, int dflt, hkv_err *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v;
    int rc = hkv_gguf_get_i64(g, key, &v, err);
    if (rc == HKV_E_NOTFOUND && !required) {
        *out = dflt;
        hkv_err_clear(err);
        return HKV_OK;
    }
    if (rc != HKV_OK) return rc;
    if (v < 0 || v > (1 << 30))
        return hkv_seterr(err, HKV_E_RANGE, "metadata key '%s' = %lld is out of range", key,
                          (long long)v);
    *out = (int)v;
    return HKV_OK;
}

static int get_float(const hkv_gguf *g, const char *arch, const char *suffix, float *out,
                     int required, float dflt, hkv_err *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = hkv_gguf_get_f32(g, key, out, err);
    if (rc == HKV_E_NOTFOUND && !required) {
        *out = dflt;
        hkv_err_clear(err);
        return HKV_OK;
    }
    if (rc == HKV_OK && !isfinite(*out))
        return hkv_seterr(err, HKV_E_RANGE, "metadata key '%s' is not finite", key);
    return rc;
}

int hkv_model_config_read(const hkv_gguf *g, hkv_model_config *c, hkv_err *err) {
    memset(c, 0, sizeof *c);
    hkv_str s;
    int rc = hkv_gguf_get_str(g, "general.architecture", &s, err);
    if (rc) return rc;
    if (hkv_str_eq(s, "llama")) {
        c->arch = HKV_ARCH_LLAMA;
        c->rope_layout = HKV_ROPE_PAIRS;
    } else if (hkv_str_eq(s, "qwen2")) {
        c->arch = HKV_ARCH_QWEN2;
        c->rope_layout = HKV_ROPE_NEOX;
        c->qkv_bias = 1;
    } else {
        return hkv_seterr(err, HKV_E_UNSUPPORTED,
                          "architecture '%.*s' is not supported (llama and qwen2 are)",
                          (int)(s.len > 64 ? 64 : s.len), s.ptr);
    }
    snprintf(c->arch_name, sizeof c->arch_name, "%.*s", (int)s.len, s.ptr);
    if (hkv_gguf_get_str(g, "general.name", &s, NULL) == HKV_OK)
        snprintf(c->name, sizeof c->name, "%.*s", (int)(s.len > 90 ? 90 : s.len), s.ptr);
    else
        snprintf(c->name, sizeof c->name, "%s", c->arch_name);

    const char *a = c->arch_name;
    if ((rc = get_int(g, a, "block_count", &c->n_layer, 1, 0, err)) ||
        (rc = get_int(g, a, "embedding_length", &c->dim, 1, 0, err)) ||
        (rc = get_int(g, a, "feed_forward_length", &c->ffn, 1, 0, err)) ||
        (rc = get_int(g, a, "attention.head_count", &c->n_head, 1, 0, err)) ||
        (rc = get_int(g, a, "context_length", &c->ctx_train, 0, 4096, err)) ||
        (rc = get_float(g, a, "attention.layer_norm_rms_epsilon", &c->norm_eps, 1, 0, err)) ||
        (rc = get_float(g, a, "rope.freq_base", &c->rope_base, 0, 10000.0f, err)))
        return rc;
    if ((rc = get_int(g, a, "attention.head_count_kv", &c->n_head_kv, 0, c->n_head, err)))
        return rc;
    if (c->n_layer < 1 || c->dim < 1 || c->n_head < 1 || c->ffn < 1)
        return hkv_seterr(err, HKV_E_FORMAT,
                          "model has a zero size (layers %d, dim %d, heads %d, ffn %d)",
                          c->n_layer, c->dim, c->n_head, c->ffn);
    if (c->n_head_kv < 1 || c->n_head % c->n_head_kv)
        return hkv_seterr(err, HKV_E_FORMAT,
                          "head_count %d is not a multiple of head_count_kv %d", c->n_head,
                          c->n_head_kv);
    int dflt_hd = c->dim % c->n_head ? 0 : c->dim / c->n_head;
    if ((rc = get_int(g, a, "attention.key_length", &c->head_dim, dflt_hd == 0, dflt_hd, err)))
        return rc;
    int vlen;
    if ((rc = get_int(g, a, "attention.value_length", &vlen, 0, c->head_dim, err))) return rc;
    if (vlen != c->head_dim)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "key_length %d != value_length %d",
                          c->head_dim, vlen);
    if (c->head_dim < 2 || c->head_dim > 512 || c->head_dim % 2)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "head dimension %d is not supported",
                          c->head_dim);
    if ((rc = get_int(g, a, "rope.dimension_count", &c->rope_dim, 0, c->head_dim, err)))
        return rc;
    if (c->rope_dim < 2 || c->rope_dim > c->head_dim || c->rope_dim % 2)
        return hkv_seterr(err, HKV_E_FORMAT, "rope.dimension_count %d invalid for head_dim %d",
                          c->rope_dim, c->head_dim);
    if (!(c->rope_base > 0))
        return hkv_seterr(err, HKV_E_FORMAT, "rope.freq_base must be positive");
    if (!(c->norm_eps > 0 && c->norm_eps < 1))
        return hkv_seterr(err, HKV_E_FORMAT, "layer_norm_rms_epsilon %g out of range",
                          (double)c->norm_eps);

    /* Rope scaling: linear is position / factor; others are refused rather
     * than silently ignored. */
    c->rope_scale = 1.0f;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    if (hkv_gguf_get_str(g, key, &s, NULL) == HKV_OK && !hkv_str_eq(s, "none")) {
        if (!hkv_str_eq(s, "linear"))
            return hkv_seterr(err, HKV_E_UNSUPPORTED, "rope scaling '%.*s' is not supported",
                              (int)(s.len > 32 ? 32 : s.len), s.ptr);
        if ((rc = get_float(g, a, "rope.scaling.factor", &c->rope_scale, 1, 1.0f, err)))
            return rc;
        if (!(c->rope_scale > 0))
            return hkv_seterr(err, HKV_E_FORMAT, "rope.scaling.factor must be positive");
    }

    const hkv_gguf_tensor *te = hkv_gguf_find_tensor(g, "token_embd.weight");
    if (!te) return hkv_seterr(err, HKV_E_FORMAT, "tensor 'token_embd.weight' is missing");
    if (te->ne[0] != c->dim || te->ne[1] < 1 || te->ne[1] > (1 << 24))
        return hkv_seterr(err, HKV_E_FORMAT, "token_embd.weight has shape [%lld, %lld], "
                          "expected [%d, vocab]", (long long)te->ne[0], (long long)te->ne[1],
                          c->dim);
    c->vocab = (int)te->ne[1];
    c->tied_output = hkv_gguf_find_tensor(g, "output.weight") == NULL;
    return HKV_OK;
}
