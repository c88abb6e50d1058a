/* Synthetic-weight models of real shapes (synthetic.h). A constructor path
 * beside hkv_model_load: the same hkv_model, filled from a counter-based
 * random stream instead of a GGUF file. */
#include "synthetic.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_types.h"
#include "host_mem.h"

typedef struct shape {
    const char *name, *title;
    int arch, layers, dim, heads, kv_heads, head_dim, ffn, vocab, ctx, tied;
    float theta, eps;
} shape;

/* Published configs (config.json of each model). llama3.1-8b is llama3-8b
 * with a 128K context; its rope frequency factors are left out (the weights
 * are random, so only the shape matters). */
static const shape shapes[] = {
    {"llama3-8b", "Llama-3-8B (synthetic)", HKV_ARCH_LLAMA, 32, 4096, 32, 8, 128, 14336, 128256,
     8192, 0, 500000.0f, 1e-5f},
    {"llama3.1-8b", "Llama-3.1-8B (synthetic)", HKV_ARCH_LLAMA, 32, 4096, 32, 8, 128, 14336,
     128256, 131072, 0, 500000.0f, 1e-5f},
    {"yi-9b", "Yi-9B (synthetic)", HKV_ARCH_LLAMA, 48, 4096, 32, 4, 128, 11008, 64000, 4096, 0,
     5000000.0f, 1e-6f},
    {"qwen2.5-7b", "Qwen2.5-7B (synthetic)", HKV_ARCH_QWEN2, 28, 3584, 28, 4, 128, 18944, 152064,
     32768, 0, 1000000.0f, 1e-6f},
    {"smollm2-135m", "SmolLM2-135M (synthetic)", HKV_ARCH_LLAMA, 30, 576, 9, 3, 64, 1536, 49152,
     8192, 1, 100000.0f, 1e-5f},
};
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])

const char *const *hkv_synthetic_names(void) {
    static const char *const names[N_SHAPES + 1] = {
        "llama3-8b", "llama3.1-8b", "yi-9b", "qwen2.5-7b", "smollm2-135m", NULL};
    return names;
}

int hkv_synthetic_config(const char *name, hkv_model_config *c, hkv_err *err) {
    memset(c, 0, sizeof *c);
    /* "NAME@L": the shape's first L layers (every width real), for runs that
     * must be short (the CUDA emulator in CI) yet exercise the real sizes. */
    const char *at = name ? strchr(name, '@') : NULL;
    size_t nlen = name ? (at ? (size_t)(at - name) : strlen(name)) : 0;
    long layers = 0;
    if (at) {
        char *end;
        layers = strtol(at + 1, &end, 10);
        if (*end || end == at + 1 || layers < 1)
            return hkv_seterr(err, HKV_E_INVAL, "synthetic model '%s': after '@' give a layer count "
                              "of at least 1", name);
    }
    for (int i = 0; i < N_SHAPES; i++) {
        const shape *s = &shapes[i];
        if (!name || strlen(s->name) != nlen || strncmp(name, s->name, nlen)) continue;
        if (layers > s->layers)
            return hkv_seterr(err, HKV_E_RANGE, "synthetic model '%s': %s has %d layers", name,
                              s->name, s->layers);
        c->arch = s->arch;
        snprintf(c->arch_name, sizeof c->arch_name, "%s", s->arch == HKV_ARCH_QWEN2 ? "qwen2" : "llama");
        if (layers) snprintf(c->name, sizeof c->name, "%s (first %ld layers)", s->title, layers);
        else snprintf(c->name, sizeof c->name, "%s", s->title);
        c->n_layer = layers ? (int)layers : s->layers;
        c->dim = s->dim;
        c->n_head = s->heads;
        c->n_head_kv = s->kv_heads;
        c->head_dim = s->head_dim;
        c->ffn = s->ffn;
        c->vocab = s->vocab;
        c->ctx_train = s->ctx;
        c->rope_dim = s->head_dim;
        c->rope_layout = s->arch == HKV_ARCH_QWEN2 ? HKV_ROPE_NEOX : HKV_ROPE_PAIRS;
        c->rope_base = s->theta;
        c->rope_scale = 1.0f;
        c->norm_eps = s->eps;
        c->qkv_bias = s->arch == HKV_ARCH_QWEN2;
        c->tied_output = s->tied;
        return HKV_OK;
    }
    char known[160] = "";
    for (int i = 0; i < N_SHAPES; i++) {
        strncat(known, i ? ", " : "", sizeof known - strlen(known) - 1);
        strncat(known, shapes[i].name, sizeof known - strlen(known) - 1);
    }
    return hkv_seterr(err, HKV_E_NOTFOUND, "unknown synthetic model '%s' (known: %s)",
                      name ? name : "(none)", known);
}

int hkv_synthetic_wtype_parse(const char *s) {
    if (!s || !strcmp(s, "q4")) return HKV_W_Q4;
    if (!strcmp(s, "q8")) return HKV_W_Q8;
    if (!strcmp(s, "f16")) return HKV_W_F16;
    if (!strcmp(s, "f32")) return HKV_W_F32;
    return -1;
}

/* Bytes of a [rows][cols] matrix in wtype: values plus fp16 scales (and mins). */
static uint64_t mat_bytes(int wtype, uint64_t rows, uint64_t cols) {
    const uint64_t n = rows * cols, blocks = n / HKV_WBLOCK;
    switch (wtype) {
    case HKV_W_F32: return 4 * n;
    case HKV_W_F16: return 2 * n;
    case HKV_W_Q8: return n + 2 * blocks;
    case HKV_W_Q4: return n / 2 + 4 * blocks;
    }
    return 0;
}

uint64_t hkv_synthetic_host_bytes(const hkv_model_config *c, int wtype) {
    const uint64_t dim = (uint64_t)c->dim, hd = (uint64_t)c->head_dim;
    const uint64_t qkv = (uint64_t)(c->n_head + 2 * c->n_head_kv) * hd;
    uint64_t layer = mat_bytes(wtype, qkv, dim) + mat_bytes(wtype, dim, (uint64_t)c->n_head * hd) +
                     mat_bytes(wtype, 2 * (uint64_t)c->ffn, dim) +
                     mat_bytes(wtype, dim, (uint64_t)c->ffn);
    layer += (2 * dim + (c->qkv_bias ? qkv : 0)) * 4;
    uint64_t emb = mat_bytes(wtype, (uint64_t)c->vocab, dim) * (c->tied_output ? 1 : 2);
    return emb + (uint64_t)c->n_layer * layer + dim * 4 + (uint64_t)c->rope_dim / 2 * 4;
}

/* ---- deterministic random stream ----------------------------------------- */

static inline uint64_t mix64(uint64_t z) {   /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* One stream per (matrix, row): independent of how rows are split over threads. */
typedef struct rng { uint64_t s; } rng;
static inline rng rng_at(uint64_t seed, uint64_t mat, uint64_t row) {
    rng r = {mix64(seed ^ mix64(mat * 0x9e3779b97f4a7c15ULL + row + 1))};
    return r;
}
static inline uint64_t rng_next(rng *r) {
    r->s += 0x9e3779b97f4a7c15ULL;
    return mix64(r->s);
}
/* Uniform in [-1, 1). */
static inline float rng_sym(rng *r) { return (float)((double)(rng_next(r) >> 11) * 0x1p-52 - 1.0); }

/* A [rows][cols] matrix whose entries have mean 0 and standard deviation sigma. */
static int mat_random(hkv_model *m, hkv_wmat *w, int wtype, int64_t rows, int64_t cols,
                      float sigma, uint64_t seed, uint64_t id, hkv_err *err) {
    memset(w, 0, sizeof *w);
    w->type = wtype;
    w->rows = rows;
    w->cols = cols;
    const uint64_t n = (uint64_t)rows * (uint64_t)cols, nb = n / HKV_WBLOCK;
    size_t qb = wtype == HKV_W_F32 ? 4 * n : wtype == HKV_W_F16 ? 2 * n : wtype == HKV_W_Q8 ? n : n / 2;
    if (!(w->q = hkv_host_alloc(NULL, HKV_TIER_WEIGHTS, qb, err))) return HKV_E_NOMEM;
    if ((wtype == HKV_W_Q8 || wtype == HKV_W_Q4) &&
        !(w->scale = hkv_host_alloc(NULL, HKV_TIER_WEIGHTS, nb * 2, err)))
        goto fail;
    if (wtype == HKV_W_Q4 && !(w->min = hkv_host_alloc(NULL, HKV_TIER_WEIGHTS, nb * 2, err)))
        goto fail;
    const int64_t bpr = cols / HKV_WBLOCK;
    /* Uniform values: sd of U(-a, a) is a/sqrt(3); of a byte as int8,
     * sqrt((256^2-1)/12); of a nibble 0..15, sqrt((16^2-1)/12). */
    const float a = sigma * sqrtf(3.0f);
    const uint16_t s8 = hkv_f32_to_fp16(sigma / sqrtf(5461.25f));
    const float s4f = sigma / sqrtf(21.25f);
    const uint16_t s4 = hkv_f32_to_fp16(s4f), m4 = hkv_f32_to_fp16(-7.5f * s4f);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        rng g = rng_at(seed, id, (uint64_t)r);
        if (wtype == HKV_W_F32) {
            float *dst = (float *)w->q + r * cols;
            for (int64_t c = 0; c < cols; c++) dst[c] = a * rng_sym(&g);
        } else if (wtype == HKV_W_F16) {
            uint16_t *dst = (uint16_t *)w->q + r * cols;
            for (int64_t c = 0; c < cols; c++) dst[c] = hkv_f32_to_fp16(a * rng_sym(&g));
        } else {
            const int64_t bytes = wtype == HKV_W_Q8 ? cols : cols / 2;
            uint8_t *dst = (uint8_t *)w->q + r * bytes;
            for (int64_t c = 0; c < bytes; c += 8) {
                uint64_t v = rng_next(&g);
                memcpy(dst + c, &v, 8);   /* cols is a multiple of 32: whole words */
            }
            for (int64_t b = 0; b < bpr; b++) {
                w->scale[r * bpr + b] = wtype == HKV_W_Q8 ? s8 : s4;
                if (wtype == HKV_W_Q4) w->min[r * bpr + b] = m4;
            }
        }
    }
    m->weight_bytes += hkv_wmat_bytes(w);
    return HKV_OK;
fail:
    hkv_wmat_free(w);
    return HKV_E_NOMEM;
}

static float *vec_fill(int64_t n, float base, float spread, uint64_t seed, uint64_t id,
                       hkv_err *err) {
    float *v = hkv_host_alloc(NULL, HKV_TIER_WEIGHTS, (size_t)n * sizeof(float), err);
    if (!v) return NULL;
    rng g = rng_at(seed, id, 0);
    for (int64_t i = 0; i < n; i++) v[i] = base + spread * rng_sym(&g);
    return v;
}

int hkv_synthetic_build(hkv_model *m, const char *name, int wtype, uint64_t seed, hkv_err *err) {
    memset(m, 0, sizeof *m);
    int rc = hkv_synthetic_config(name, &m->cfg, err);
    if (rc) return rc;
    if (wtype < HKV_W_F32 || wtype > HKV_W_Q4)
        return hkv_seterr(err, HKV_E_INVAL, "synthetic model: unknown weight type %d", wtype);
    const hkv_model_config *c = &m->cfg;
    const uint64_t need = hkv_synthetic_host_bytes(c, wtype), avail = hkv_host_mem_free();
    if (avail && need > avail) {
        char a[32], b[32];
        hkv_fmt_bytes((double)need, a, sizeof a);
        hkv_fmt_bytes((double)avail, b, sizeof b);
        return hkv_seterr(err, HKV_E_NOMEM, "synthetic model %s needs %s of host memory for its "
                          "weights but %s is available (try --synthetic-weights q4)", name, a, b);
    }
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    if (!m->layers) return hkv_seterr(err, HKV_E_NOMEM, "no memory for %d layers", c->n_layer);
    const int64_t dim = c->dim, qd = (int64_t)c->n_head * c->head_dim;
    const int64_t qkv = qd + 2 * (int64_t)c->n_head_kv * c->head_dim;
    const float s_dim = 1.0f / sqrtf((float)dim);
    uint64_t id = 1;
    if ((rc = mat_random(m, &m->tok_embd, wtype, c->vocab, dim, s_dim, seed, id++, err)) ||
        !(m->out_norm = vec_fill(dim, 1.0f, 0.0f, seed, id++, err)))
        goto fail;
    if (c->tied_output) {
        m->output = m->tok_embd;   /* shares buffers: freed once */
    } else if ((rc = mat_random(m, &m->output, wtype, c->vocab, dim, s_dim, seed, id++, err))) {
        goto fail;
    }
    const int half = c->rope_dim / 2;
    if (!(m->rope_inv_freq = hkv_host_alloc(NULL, HKV_TIER_WEIGHTS, (size_t)half * sizeof(float), err)))
        goto fail;
    for (int i = 0; i < half; i++)
        m->rope_inv_freq[i] = (float)pow((double)c->rope_base, -2.0 * i / c->rope_dim) / c->rope_scale;
    for (int l = 0; l < c->n_layer; l++) {
        hkv_layer_weights *L = &m->layers[l];
        id = 100 + 16 * (uint64_t)l;
        L->n_qkv = L->n_ffn_in = 1;
        if (!(L->attn_norm = vec_fill(dim, 1.0f, 0.0f, seed, id, err)) ||
            !(L->ffn_norm = vec_fill(dim, 1.0f, 0.0f, seed, id + 1, err)) ||
            (rc = mat_random(m, &L->qkv[0], wtype, qkv, dim, s_dim, seed, id + 2, err)) ||
            (rc = mat_random(m, &L->wo, wtype, dim, qd, 1.0f / sqrtf((float)qd), seed, id + 3, err)) ||
            (rc = mat_random(m, &L->ffn_in[0], wtype, 2 * (int64_t)c->ffn, dim, s_dim, seed, id + 4, err)) ||
            (rc = mat_random(m, &L->wdown, wtype, dim, c->ffn, 1.0f / sqrtf((float)c->ffn), seed,
                             id + 5, err)))
            goto fail;
        if (c->qkv_bias && !(L->bqkv = vec_fill(qkv, 0.0f, 0.02f, seed, id + 6, err))) goto fail;
    }
    return HKV_OK;
fail:
    if (!rc) rc = HKV_E_NOMEM;
    hkv_err_prefix(err, "building synthetic model %s", name);
    hkv_model_free(m);
    return rc;
}
