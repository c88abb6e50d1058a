/* The layer matrices and the output head in the FAST products' interleaved
 * layout (cpu/kernels.h, hkv_wmat_pack), for an engine whose products all
 * run in that precision on a table that reads it. One matrix at a time, so
 * the peak is the weights plus the largest matrix. */
#include <stdlib.h>

#include "host_mem.h"
#include "model.h"

/* w packed in place; keep != 0: the rows stay (the tied head's buffers are
 * the embeddings', which the lookup reads by row). */
static int pack_one(hkv_model *m, hkv_wmat *w, int g, int keep, hkv_err *err)
{
    const size_t pb = hkv_wmat_pack_bytes(w, g);
    if (!pb) return HKV_OK;   /* F32/F16, or already packed: read as it is */
    void *buf = hkv_host_alloc(NULL, HKV_TIER_WEIGHTS, pb, err);
    if (!buf) return hkv_err_prefix(err, "packing the weights for the fast products");
    hkv_wmat out;
    if (hkv_wmat_pack(w, g, buf, &out) != HKV_OK) {
        free(buf);
        return hkv_seterr(err, HKV_E_INTERNAL, "packing a %lld x %lld matrix in groups of %d", (long long)w->rows,
                          (long long)w->cols, g);
    }
    const size_t before = hkv_wmat_bytes(w);
    if (!keep) hkv_wmat_free(w);
    m->weight_bytes += pb - (keep ? 0 : before);
    *w = out;
    return HKV_OK;
}

int hkv_model_pack(hkv_model *m, int g, hkv_err *err)
{
    int rc;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        hkv_layer_weights *L = &m->layers[l];
        for (int i = 0; i < L->n_qkv; i++)
            if ((rc = pack_one(m, &L->qkv[i], g, 0, err))) return rc;
        for (int i = 0; i < L->n_ffn_in; i++)
            if ((rc = pack_one(m, &L->ffn_in[i], g, 0, err))) return rc;
        if ((rc = pack_one(m, &L->wo, g, 0, err)) || (rc = pack_one(m, &L->wdown, g, 0, err))) return rc;
    }
    return pack_one(m, &m->output, g, m->output.q == m->tok_embd.q, err);
}
