/* Kept sets per (layer, KV head) chosen by window scores (keepset.h). */
#include <math.h>
#include <string.h>

#include "keepset.h"

int hkv_keepset_init(hkv_keepset *k, const hkv_policy_env *env, int64_t budget, const char *who,
                     hkv_err *err) {
    const hkv_kv_shape *sh = &env->shape;
    memset(k, 0, sizeof *k);
    if (!env->kern || sh->n_layer < 1 || sh->n_head_kv < 1 || sh->head_dim < 1 ||
        sh->n_head < sh->n_head_kv || sh->n_head % sh->n_head_kv)
        return hkv_seterr(err, HKV_E_INVAL, "%s: bad shape (%d layers, %d heads, %d KV heads, d=%d) "
                          "or no kernels", who, sh->n_layer, sh->n_head, sh->n_head_kv, sh->head_dim);
    k->kern = env->kern, k->mem = env->mem, k->n_threads = env->n_threads;
    k->L = sh->n_layer, k->KH = sh->n_head_kv, k->H = sh->n_head, k->d = sh->head_dim;
    k->budget = env->n_ctx > 0 && budget > env->n_ctx ? env->n_ctx : budget;
    if (k->budget < 1) k->budget = 1;
    k->lo = env->L_init;
    k->kept_b = (size_t)k->L * k->KH * (size_t)k->budget * 4;
    k->n_kept_b = (size_t)k->L * k->KH * sizeof(int64_t);
    k->sel_hi_b = k->scored_b = (size_t)k->L * sizeof(int64_t);
    k->done_b = (size_t)k->L * sizeof(int);
    if (!(k->kept = hkv_host_alloc(k->mem, HKV_TIER_INDEX, k->kept_b, err)) ||
        !(k->n_kept = hkv_host_calloc(k->mem, HKV_TIER_INDEX, k->n_kept_b, err)) ||
        !(k->sel_hi = hkv_host_calloc(k->mem, HKV_TIER_INDEX, k->sel_hi_b, err)) ||
        !(k->scored = hkv_host_calloc(k->mem, HKV_TIER_INDEX, k->scored_b, err)) ||
        !(k->done = hkv_host_calloc(k->mem, HKV_TIER_INDEX, k->done_b, err))) {
        hkv_keepset_free(k);
        return hkv_err_prefix(err, "%s kept sets (budget %lld)", who, (long long)budget);
    }
    return HKV_OK;
}

void hkv_keepset_free(hkv_keepset *k) {
    if (!k) return;
    if (k->kept) hkv_host_free(k->mem, HKV_TIER_INDEX, k->kept, k->kept_b);
    if (k->n_kept) hkv_host_free(k->mem, HKV_TIER_INDEX, k->n_kept, k->n_kept_b);
    if (k->sel_hi) hkv_host_free(k->mem, HKV_TIER_INDEX, k->sel_hi, k->sel_hi_b);
    if (k->scored) hkv_host_free(k->mem, HKV_TIER_INDEX, k->scored, k->scored_b);
    if (k->done) hkv_host_free(k->mem, HKV_TIER_INDEX, k->done, k->done_b);
    memset(k, 0, sizeof *k);
}

int hkv_keepset_check(const hkv_keepset *k, int layer, const hkv_far_view *far, const char *who,
                      hkv_err *err) {
    if (layer < 0 || layer >= k->L || far->n_head_kv != k->KH || far->head_dim != k->d ||
        far->hi < far->lo)
        return hkv_seterr(err, HKV_E_INVAL, "%s: layer %d of %d, far view of %d KV heads, d=%d, "
                          "[%lld, %lld) does not match the policy (%d KV heads, d=%d)", who, layer,
                          k->L, far->n_head_kv, far->head_dim, (long long)far->lo,
                          (long long)far->hi, k->KH, k->d);
    return HKV_OK;
}

int hkv_keepset_select(hkv_keepset *k, int layer, const hkv_far_view *far,
                       const hkv_query_view *qv, int reduce_max, int kernel, int64_t force_from,
                       hkv_err *err) {
    const int64_t n = far->hi - far->lo, B = k->budget;
    int32_t *kept = k->kept + (size_t)layer * k->KH * B;
    int64_t *nk = k->n_kept + (size_t)layer * k->KH;
    int rc = HKV_OK;
    if (n <= B || qv->n <= 0) {   /* all of it, or (no window) the most recent */
        int64_t m = n <= B ? n : B;
        for (int h = 0; h < k->KH; h++) {
            for (int64_t i = 0; i < m; i++) kept[h * B + i] = (int32_t)(far->hi - m + i);
            nk[h] = m;
        }
    } else {
        /* scores [KH][n], then per head: pool (2n floats), top-k (2n int32) */
        const size_t bytes = (size_t)n * 4 * ((size_t)k->KH + 4);
        float *sc = hkv_host_alloc(k->mem, HKV_TIER_WORKSPACE, bytes, err);
        if (!sc) return hkv_err_prefix(err, "scores of %lld far tokens", (long long)n);
        float *tmp = sc + (size_t)k->KH * n;
        int32_t *idx = (int32_t *)(tmp + 2 * n), *scr = idx + n;
        hkv_ws_job job = {.far = far, .qv = qv, .n_head = k->H, .out = sc, .ld_out = n,
                          .n_threads = k->n_threads, .reduce_max = reduce_max};
        rc = hkv_ws_window_scores(k->kern, &job, k->mem, err);
        for (int h = 0; !rc && h < k->KH; h++) {
            float *sh = sc + (int64_t)h * n;
            hkv_ws_pool(sh, n, kernel, 0, tmp);
            nk[h] = hkv_ws_keep(sh, NULL, far->lo, n, B, force_from, kept + h * B, idx, scr);
        }
        hkv_host_free(k->mem, HKV_TIER_WORKSPACE, sc, bytes);
    }
    k->sel_hi[layer] = far->hi;
    k->scored[layer] = n;
    k->version++;
    k->done[layer] = !rc;
    k->lo = far->lo;
    return rc;
}

int64_t hkv_keepset_pick(const hkv_keepset *k, int layer, int kvh, const hkv_far_view *far,
                         int32_t *out) {
    int64_t c = 0, from = far->lo;
    if (k->done[layer]) {
        const int32_t *kp = k->kept + ((size_t)layer * k->KH + kvh) * k->budget;
        const int64_t m = k->n_kept[(size_t)layer * k->KH + kvh];
        for (int64_t i = 0; i < m; i++)
            if (kp[i] >= far->lo && kp[i] < far->hi) out[c++] = kp[i];
        from = k->sel_hi[layer] > far->lo ? k->sel_hi[layer] : far->lo;
    }
    for (int64_t p = from; p < far->hi; p++) out[c++] = (int32_t)p;
    return c;
}

int hkv_keepset_takes(const hkv_keepset *k, int layer) {
    return layer >= 0 && layer < k->L && k->done[layer] ? HKV_FALLBACK_NONE
                                                        : HKV_FALLBACK_BEFORE_SELECTION;
}

int hkv_keepset_kept(const hkv_keepset *k, int layer, hkv_kept_set *out) {
    if (layer < 0 || layer >= k->L || !k->done[layer]) return HKV_E_INVAL;
    const size_t at = (size_t)layer * k->KH;
    *out = (hkv_kept_set){.pos = k->kept + at * k->budget, .n = k->n_kept + at, .ld = k->budget,
                          .from = k->sel_hi[layer], .version = k->version};
    return HKV_OK;
}

int64_t hkv_keepset_max_select(const hkv_keepset *k, int64_t n_far) {
    if (n_far <= 0) return 0;
    int64_t shi = INT64_MAX;   /* the layer with the most tokens past its selection */
    for (int l = 0; l < k->L; l++) {
        if (!k->done[l]) return n_far;
        if (k->sel_hi[l] < shi) shi = k->sel_hi[l];
    }
    int64_t post = k->lo + n_far - shi, m = k->budget + (post > 0 ? post : 0);
    return m < n_far ? m : n_far;
}

void hkv_keepset_stats(const hkv_keepset *k, int *layers, double *kept, double *scored) {
    double kk = 0, ss = 0;
    int n = 0;
    for (int l = 0; l < k->L; l++) {
        if (!k->done[l]) continue;
        n++;
        ss += (double)k->scored[l];
        for (int h = 0; h < k->KH; h++) kk += (double)k->n_kept[(size_t)l * k->KH + h] / k->KH;
    }
    *layers = n;
    *kept = n ? kk / n : 0;
    *scored = n ? ss / n : 0;
}
