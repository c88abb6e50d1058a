#include "engine.h"

#include <stdlib.h>
#include <string.h>

#include "draft.h"
#include "gguf.h"
#include "kv_tiered.h"
#include "synthetic.h"

void hkv_engine_params_default(hkv_engine_params *p) {
    memset(p, 0, sizeof *p);
    p->isa = -1;
    p->max_seqs = 1;
    p->synthetic_wtype = HKV_W_Q4;
    hkv_tiered_params_default(&p->tiered);
}

static size_t ws_floats_for(const hkv_model *m) {
    size_t best = hkv_matmul_ws_floats(&m->output);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const hkv_layer_weights *L = &m->layers[l];
        const hkv_wmat *all[] = {&L->qkv[0], &L->qkv[1], &L->qkv[2], &L->wo,
                                 &L->ffn_in[0], &L->ffn_in[1], &L->wdown};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (all[i]->q) {
                size_t f = hkv_matmul_ws_floats(all[i]);
                if (f > best) best = f;
            }
    }
    return best;
}

static int alloc_workspace(hkv_engine *e, hkv_err *err) {
    const hkv_model_config *c = &e->model.cfg;
    const size_t R = (size_t)e->max_rows;
    /* tmp: a product's rows, densely: R rows of the widest layer product (it
     * also stages split Q/K/V and gate/up parts), or the head's logits */
    int64_t widest_part = c->dim;
    if (widest_part < 2 * (int64_t)c->ffn) widest_part = 2 * (int64_t)c->ffn;
    if (widest_part < e->qkv_rows) widest_part = e->qkv_rows;
    size_t tmp_n = R * (size_t)widest_part;
    const size_t logits_n = (size_t)hkv_head_rows(e->max_rows, e->p.max_seqs) * (size_t)c->vocab;
    if (tmp_n < logits_n) tmp_n = logits_n;
    e->tmp_floats = tmp_n;
    struct { float **p; size_t n; } bufs[] = {
        {&e->x, R * c->dim},
        {&e->xn, R * c->dim},
        {&e->qkv, R * e->qkv_rows},
        {&e->att, R * (size_t)c->n_head * c->head_dim},
        {&e->h, R * 2 * (size_t)c->ffn},
        {&e->tmp, tmp_n},
        {&e->rope_cs, R * (size_t)c->rope_dim},
        {&e->mm_ws, ws_floats_for(&e->model) + 16},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        size_t bytes = bufs[i].n * sizeof(float);
        *bufs[i].p = hkv_host_alloc(&e->mem, HKV_TIER_WORKSPACE, bytes, err);
        if (!*bufs[i].p) return HKV_E_NOMEM;
        e->ws_bytes += bytes;
    }
    const size_t pb = R * sizeof(int64_t);
    if (!(e->pos = hkv_host_alloc(&e->mem, HKV_TIER_WORKSPACE, pb, err)) ||
        !(e->rope_pos = hkv_host_alloc(&e->mem, HKV_TIER_WORKSPACE, pb, err)))
        return HKV_E_NOMEM;
    e->ws_bytes += 2 * pb;
    return HKV_OK;
}

void hkv_engine_ctx_warn(const hkv_engine *e) {
    const hkv_model_config *c = &e->model.cfg;
    if (c->ctx_train > 0 && e->p.n_ctx > c->ctx_train)
        hkv_warn(stderr, "context %lld is past %s's trained context of %d tokens: positions beyond "
                 "it were never trained and its output there may be poor (hetkv eval refuses it)",
                 (long long)e->p.n_ctx, c->name, c->ctx_train);
}

int hkv_engine_open(hkv_engine **out, const hkv_engine_params *p, hkv_err *err) {
    *out = NULL;
    if (!p->model_path == !p->synthetic)
        return hkv_seterr(err, HKV_E_INVAL, p->synthetic ? "give a model file or a synthetic model, "
                          "not both" : "no model file given");
    if (p->max_seqs < 1 || p->max_seqs > 4096)
        return hkv_seterr(err, HKV_E_RANGE, "batch of %d sequences is out of range (1..4096)",
                          p->max_seqs);
    if (p->max_rows < 0 || p->max_rows > 65536)
        return hkv_seterr(err, HKV_E_RANGE, "rows per forward %d out of range (1..65536)",
                          p->max_rows);
    if (p->n_ctx < 0 || p->n_ctx > ((int64_t)1 << 31))
        return hkv_seterr(err, HKV_E_RANGE, "context %lld is out of range", (long long)p->n_ctx);
    hkv_engine *e = calloc(1, sizeof *e);
    if (!e) return hkv_seterr(err, HKV_E_NOMEM, "no memory for the engine");
    e->p = *p;
    hkv_gguf *g = NULL;
    int rc;
    if ((rc = hkv_threads_init(&e->threads, p->n_threads, err))) goto fail;
    int isa = hkv_cpu_kernels_init(&e->kern, p->isa < 0 ? HKV_ISA_AVX512 : p->isa);
    (void)isa;
    hkv_cpu_kernels_set_precision(&e->kern, p->precision);   /* FAST only where qgemm exists */
    if (p->synthetic) {   /* random weights of a real shape, no tokenizer */
        if ((rc = hkv_synthetic_build(&e->model, p->synthetic, p->synthetic_wtype,
                                      p->synthetic_seed, err)))
            goto fail;
    } else if ((rc = hkv_gguf_open(&g, p->model_path, err)) ||
               (rc = hkv_model_load(&e->model, g, err))) {
        goto fail;
    }
    /* FAST products on the host read the weights interleaved (no transposes
     * per block, one stream per group); a device backend uploads rows. */
    if (!p->device_cuda && e->kern.precision == HKV_PREC_FAST && e->kern.qgemm_pack &&
        (rc = hkv_model_pack(&e->model, e->kern.qgemm_pack, err)))
        goto fail;
    e->mem.bytes[HKV_TIER_WEIGHTS] = e->mem.peak[HKV_TIER_WEIGHTS] = e->model.weight_bytes;
    if (g && (rc = hkv_tokenizer_load(&e->tok, g, err))) {
        hkv_err_prefix(err, "loading tokenizer");
        goto fail;
    }
    hkv_gguf_close(g);
    g = NULL;
    const hkv_model_config *c = &e->model.cfg;
    if (!e->p.n_ctx) e->p.n_ctx = c->ctx_train;
    hkv_engine_ctx_warn(e);
    e->qkv_rows = (int64_t)(c->n_head + 2 * c->n_head_kv) * c->head_dim;
    e->max_rows = p->max_rows ? p->max_rows : 256;
    if (e->max_rows < p->max_seqs) e->max_rows = p->max_seqs;
    if ((rc = alloc_workspace(e, err))) goto fail;
    hkv_kv_shape shape = {c->n_layer, c->n_head, c->n_head_kv, c->head_dim};
    if (p->device_cuda) {   /* the GPU reads far rows by DMA: page-locked, near its node */
        e->p.tiered.pin_far = 1;
        e->p.tiered.pin_numa_node = hkv_pinned_gpu_numa_node(0);
    }
    e->p.tiered.numa = hkv_threads_numa(e->threads);   /* --far-numa's nodes */
    rc = p->kv_plain ? hkv_kv_plain_create(&e->kv, &shape, p->max_seqs, &e->kern, &e->mem, err)
                     : hkv_kv_tiered_create(&e->kv, &shape, p->max_seqs, &e->p.tiered, &e->kern,
                                            &e->mem, err);
    if (rc) goto fail;
    if ((rc = hkv_backend_cpu_create(&e->be, e, err))) goto fail;
    if (p->draft_path && (rc = hkv_draft_open(e, err))) goto fail;
    *out = e;
    return HKV_OK;
fail:
    hkv_gguf_close(g);
    hkv_engine_close(e);
    return rc;
}

void hkv_engine_set_kv(hkv_engine *e, hkv_kv kv) {
    if (e->kv.ops) e->kv.ops->destroy(e->kv.self);
    e->kv = kv;
}

void hkv_engine_set_backend(hkv_engine *e, hkv_backend be) {
    if (e->be.ops) e->be.ops->destroy(e->be.self);
    e->be = be;
}

void hkv_engine_close(hkv_engine *e) {
    if (!e) return;
    /* The backend first: a device backend still reads the KV cache. */
    if (e->be.ops) e->be.ops->destroy(e->be.self);
    hkv_engine_close(e->draft);
    if (e->kv.ops) e->kv.ops->destroy(e->kv.self);
    float *bufs[] = {e->x, e->xn, e->qkv, e->att, e->h, e->tmp, e->rope_cs, e->mm_ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(e->pos);
    free(e->rope_pos);
    hkv_tokenizer_free(e->tok);
    hkv_model_free(&e->model);
    hkv_threads_free(e->threads);
    free(e);
}
