/* CTKVR prompt end (Algorithm 1): centroids and the IVF list build, for
 * each centroid query and KV head the top-rho far keys by max over the
 * group's query heads of q.k.
 *
 * Scores are C x g x n dot products of d (C = 2048, g = 4, n = 128K, d = 128:
 * 1.4e11 multiply-adds per KV head), so they run as fp32 GEMMs (oneDNN sgemm)
 * and are never materialised whole: a task is (KV head, block of centroids);
 * it walks the far keys in chunks, converts each chunk to fp32, multiplies the
 * block's g*cb query rows by it, folds the g rows of each centroid into a
 * max, and keeps a running top-rho per centroid. The running top-rho is a
 * buffer plus a threshold: only scores above it are appended (it starts from
 * a sampled estimate, see sample_thresholds), and a full buffer is cut back
 * to rho by quickselect, which raises the threshold; almost every score is
 * rejected by one compare. Memory per thread is O(cb * (g*chunk + rho)),
 * independent of the far tier's length. */
#include <math.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <string.h>

#include "far_rows.h"
#include "ctkvr_impl.h"

#define BUILD_ROWS 256    /* GEMM rows (centroids x g) per task: enough for sgemm to run near peak */
#define BUILD_MAX_CB 128  /* centroids per task: bounds the running top-rho buffers */
#define BUILD_KEYS 512    /* keys per chunk: the score tile stays in L2 */
#define BUILD_SAMPLE 2048 /* keys sampled for the starting thresholds */

typedef struct build_ws {
    float *qb;      /* [cb*g][d] the block's queries, fp32 */
    float *kf;      /* [nb][d] key chunk, fp32 */
    float *s;       /* [cb*g][nb] scores; row i*g holds centroid i's group max */
    float *bv;      /* [cb][cap] running candidates: scores */
    float *thr;     /* [cb] score a new candidate must beat */
    float *ss;      /* [cb][BUILD_SAMPLE] sampled scores */
    int32_t *bp;    /* [cb][cap] running candidates: positions */
    int32_t *blen;  /* [cb] */
    int32_t *cent;  /* [cb] centroids being built */
    int64_t cap;    /* candidate buffer length */
} build_ws;

/* a before b: the higher score, then the lower position (hkv_topk's tie rule) */
static inline int better(float va, int32_t pa, float vb, int32_t pb)
{
    return va > vb || (va == vb && pa < pb);
}

static inline void swap2(float *v, int32_t *p, int64_t i, int64_t j)
{
    float t = v[i];
    int32_t u = p[i];
    v[i] = v[j], p[i] = p[j];
    v[j] = t, p[j] = u;
}

/* Quickselect in place on (score, position) pairs: afterwards the k best
 * come first and element k-1 is the k-th best. Positions are distinct, so
 * the order is strict; scores are never NaN (the filter's compare rejects
 * them). Faster than hkv_topk here: no index indirection, plain compares. */
static void select_best(float *v, int32_t *p, int64_t n, int64_t k)
{
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;   /* median of three as pivot */
        if (better(v[mid], p[mid], v[lo], p[lo])) swap2(v, p, mid, lo);
        if (better(v[hi], p[hi], v[lo], p[lo])) swap2(v, p, hi, lo);
        if (better(v[hi], p[hi], v[mid], p[mid])) swap2(v, p, hi, mid);
        const float pv = v[mid];
        const int32_t pp = p[mid];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (better(v[i], p[i], pv, pp)) i++;
            while (better(pv, pp, v[j], p[j])) j--;
            if (i <= j) swap2(v, p, i++, j--);
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

/* Cut a candidate buffer back to its best rho and raise its threshold to the
 * worst kept score (a later score equal to it loses: its position is higher). */
static void compact(float *v, int32_t *p, int32_t *len, float *thr, int64_t rho)
{
    select_best(v, p, *len, rho);
    *len = (int32_t)rho;
    *thr = v[rho - 1];
}

/* Fold a centroid's g score rows (stride ld) into the first by max and
 * append the maxima above thr (positions pos0 + k). Blocks of 16 keep the
 * fold and the reject test in registers; almost every block is rejected. */
static void fold_filter(float *row, int g, int64_t ld, int64_t nk, int64_t pos0, float thr,
                        float *v, int32_t *p, int32_t *len)
{
    int32_t n = *len;
    for (int64_t a = 0; a < nk; a += 16) {
        float *r = row + a;
        int any = 0;
        if (nk - a >= 16) {   /* fixed trip counts: the compiler vectorises these */
            for (int j = 1; j < g; j++)
                for (int k = 0; k < 16; k++) r[k] = r[j * ld + k] > r[k] ? r[j * ld + k] : r[k];
            for (int k = 0; k < 16; k++) any |= r[k] > thr;
        } else {
            for (int j = 1; j < g; j++)
                for (int64_t k = 0; k < nk - a; k++) r[k] = r[j * ld + k] > r[k] ? r[j * ld + k] : r[k];
            for (int64_t k = 0; k < nk - a; k++) any |= r[k] > thr;
        }
        if (!any) continue;
        for (int64_t k = 0; k < 16 && a + k < nk; k++)
            if (r[k] > thr) {
                v[n] = r[k];
                p[n++] = (int32_t)(pos0 + a + k);
            }
    }
    *len = n;
}

/* Scores of the loaded centroids (qb, nc of them) against nk keys at far
 * offsets p0, p0 + stride, ...: rows [i*g, i*g + g) of w->s; with fold, their
 * max lands in row i*g. */
static int score_keys(const hkv_cpu_kernels *kern, const hkv_far_view *far, int h, int g,
                      int64_t nc, int64_t p0, int64_t stride, int64_t nk, int64_t nb, int fold,
                      const build_ws *w)
{
    const int d = far->head_dim;
    uint16_t tmp[HKV_Q8_MAX_D];
    for (int64_t r = 0; r < nk; r++)
        hkv_far_k32(kern, far, h, far->lo + p0 + r * stride, tmp, w->kf + r * d);
    /* s[nc*g][nk] = qb[nc*g][d] . kf[nk][d]^T (row-major) */
    if (dnnl_sgemm('N', 'T', nc * g, nk, d, 1.0f, w->qb, d, w->kf, d, 0.0f, w->s, nb) !=
        dnnl_success)
        return HKV_E_INTERNAL;
    for (int64_t i = 0; fold && i < nc; i++) {
        float *row = w->s + i * g * nb;
        for (int j = 1; j < g; j++) {
            const float *o = row + j * nb;
            for (int64_t k = 0; k < nk; k++) row[k] = o[k] > row[k] ? o[k] : row[k];
        }
    }
    return HKV_OK;
}

/* Starting thresholds from a strided sample of ns keys: a score that about
 * rho*ns/n sampled keys beat, lowered by 4 standard deviations of that count
 * (plus 8), so that with near certainty more than rho far keys beat it. The
 * scan then appends about 1.5-2 rho scores per list instead of ~4.5 rho with
 * a threshold that starts at -inf, which made the selections cost more than
 * the GEMMs. The rare list that ends short is rebuilt without the sample. */
static int sample_thresholds(const hkv_cpu_kernels *kern, const hkv_ctkvr_build *b, int h,
                             int64_t nc, int64_t nb, const build_ws *w)
{
    const hkv_far_view *far = b->far;
    const int g = b->n_head / far->n_head_kv;
    const int64_t nfar = far->hi - far->lo, ns = BUILD_SAMPLE, stride = nfar / ns;
    const double mu = (double)b->rho * (double)ns / (double)nfar;
    const int64_t k = (int64_t)ceil(mu + 4.0 * sqrt(mu) + 8.0);
    if (k >= ns) return HKV_OK;   /* thresholds stay -inf */
    for (int64_t r0 = 0; r0 < ns; r0 += nb) {
        int64_t nk = ns - r0 < nb ? ns - r0 : nb;
        int rc = score_keys(kern, far, h, g, nc, stride / 2 + r0 * stride, stride, nk, nb, 1, w);
        if (rc) return rc;
        for (int64_t i = 0; i < nc; i++)
            memcpy(w->ss + i * ns + r0, w->s + i * g * nb, (size_t)nk * sizeof(float));
    }
    for (int64_t i = 0; i < nc; i++) {
        float *a = w->ss + i * ns;
        int32_t *pa = w->bp + i * w->cap;   /* the candidate buffers are still empty */
        for (int64_t r = 0; r < ns; r++) pa[r] = (int32_t)r;
        select_best(a, pa, ns, k);
        w->thr[i] = nextafterf(a[k - 1], -INFINITY);   /* the k-th best itself passes */
    }
    return HKV_OK;
}

/* Lists of the centroids cent[0..nc) (indices into b's queries) for KV head h.
 * Returns how many ended with fewer than rho entries (only possible with
 * sampled thresholds); those are packed at the front of cent, unwritten. */
static int64_t build_lists(const hkv_cpu_kernels *kern, const hkv_ctkvr_build *b, int h,
                           int32_t *cent, int64_t nc, int sample, int64_t nb, const build_ws *w,
                           int *rc)
{
    const hkv_far_view *far = b->far;
    const int d = far->head_dim, g = b->n_head / far->n_head_kv;
    const int64_t nfar = far->hi - far->lo, rho = b->rho, cap = w->cap;
    for (int64_t i = 0; i < nc; i++) {
        kern->f16_to_f32(b->q + cent[i] * b->ldq + (int64_t)h * g * d, w->qb + i * g * d,
                         (int64_t)g * d);
        w->blen[i] = 0;
        w->thr[i] = -INFINITY;
    }
    if (sample && (*rc = sample_thresholds(kern, b, h, nc, nb, w))) return 0;
    for (int64_t p0 = 0; p0 < nfar; p0 += nb) {
        int64_t nk = nfar - p0 < nb ? nfar - p0 : nb;
        if ((*rc = score_keys(kern, far, h, g, nc, p0, 1, nk, nb, 0, w))) return 0;
        for (int64_t i = 0; i < nc; i++) {
            float *v = w->bv + i * cap;
            int32_t *p = w->bp + i * cap;
            if (w->blen[i] + nk > cap) compact(v, p, &w->blen[i], &w->thr[i], rho);
            fold_filter(w->s + i * g * nb, g, nb, nk, far->lo + p0, w->thr[i], v, p, &w->blen[i]);
        }
    }
    int64_t nfail = 0;
    for (int64_t i = 0; i < nc; i++) {
        if (w->blen[i] < rho) {
            cent[nfail++] = cent[i];
            continue;
        }
        float *v = w->bv + i * cap;
        int32_t *p = w->bp + i * cap;
        if (w->blen[i] > rho) compact(v, p, &w->blen[i], &w->thr[i], rho);
        int64_t s = b->slot[(int64_t)h * b->n + cent[i]];
        memcpy(b->ivf + ((int64_t)h * b->n_slots + s) * rho, p, (size_t)rho * sizeof *p);
        b->len[(int64_t)h * b->n_slots + s] = (int32_t)rho;
    }
    return nfail;
}

/* One task: KV head h, centroids [i0, i0 + nc). */
static int build_task(const hkv_cpu_kernels *kern, const hkv_ctkvr_build *b, int h, int64_t i0,
                      int64_t nc, int64_t nb, const build_ws *w)
{
    const int64_t nfar = b->far->hi - b->far->lo;
    int rc = HKV_OK;
    for (int64_t i = 0; i < nc; i++) w->cent[i] = (int32_t)(i0 + i);
    int64_t nfail = build_lists(kern, b, h, w->cent, nc, nfar >= 4 * BUILD_SAMPLE, nb, w, &rc);
    if (!rc && nfail) nfail = build_lists(kern, b, h, w->cent, nfail, 0, nb, w, &rc);
    return rc ? rc : nfail ? HKV_E_INTERNAL : HKV_OK;
}

int hkv_ctkvr_build_lists(const hkv_cpu_kernels *kern, const hkv_ctkvr_build *b,
                          hkv_mem_account *mem, hkv_err *err)
{
    const hkv_far_view *far = b->far;
    const int KH = far->n_head_kv, d = far->head_dim, g = b->n_head / KH;
    const int64_t nfar = far->hi - far->lo, rho = b->rho;
    if (b->n <= 0) return HKV_OK;
    if (nfar <= rho) {   /* every far token is in every list: no scores needed */
        for (int h = 0; h < KH; h++)
            for (int64_t i = 0; i < b->n; i++) {
                int64_t s = b->slot[(int64_t)h * b->n + i];
                int32_t *dst = b->ivf + ((int64_t)h * b->n_slots + s) * rho;
                for (int64_t p = 0; p < nfar; p++) dst[p] = (int32_t)(far->lo + p);
                b->len[(int64_t)h * b->n_slots + s] = (int32_t)nfar;
            }
        return HKV_OK;
    }
    const int64_t nb = BUILD_KEYS;
    int64_t cb = BUILD_ROWS / g;
    if (cb > BUILD_MAX_CB) cb = BUILD_MAX_CB;
    if (cb < 1) cb = 1;
    if (cb > b->n) cb = b->n;
    /* cap >= BUILD_SAMPLE: the sample's positions are sorted in a candidate buffer */
    int64_t cap = rho + (rho > nb ? rho : nb);
    if (cap < BUILD_SAMPLE) cap = BUILD_SAMPLE;
    const int64_t nblk = (b->n + cb - 1) / cb, ntask = (int64_t)KH * nblk;
    int nt = b->n_threads > 0 ? b->n_threads : omp_get_max_threads();
    if (nt > ntask) nt = (int)ntask;
    if (nt < 1) nt = 1;

    const size_t nf =
        (size_t)(cb * g * d + nb * d + cb * g * nb + cb * cap + cb + cb * BUILD_SAMPLE);
    const size_t ni = (size_t)(cb * cap + 2 * cb);
    const size_t per = ((nf + ni) * 4 + 63) & ~(size_t)63;
    char *mem_all = hkv_host_alloc(mem, HKV_TIER_WORKSPACE, per * (size_t)nt, err);
    if (!mem_all) return hkv_err_prefix(err, "ctkvr index build workspace");
    int rc = HKV_OK;
    #pragma omp parallel num_threads(nt)
    {
        char *base = mem_all + per * (size_t)omp_get_thread_num();
        build_ws w;
        float *f = (float *)base;
        w.qb = f, f += cb * g * d;
        w.kf = f, f += nb * d;
        w.s = f, f += cb * g * nb;
        w.bv = f, f += cb * cap;
        w.thr = f, f += cb;
        w.ss = f, f += cb * BUILD_SAMPLE;
        int32_t *ip = (int32_t *)f;
        w.bp = ip, ip += cb * cap;
        w.blen = ip, ip += cb;
        w.cent = ip;
        w.cap = cap;
        #pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < ntask; t++) {
            int h = (int)(t / nblk);
            int64_t i0 = (t % nblk) * cb, nc = b->n - i0 < cb ? b->n - i0 : cb;
            if (build_task(kern, b, h, i0, nc, nb, &w) != HKV_OK) {
                #pragma omp atomic write
                rc = HKV_E_INTERNAL;
            }
        }
    }
    hkv_host_free(mem, HKV_TIER_WORKSPACE, mem_all, per * (size_t)nt);
    if (rc)
        return hkv_seterr(err, rc, "ctkvr index build: oneDNN sgemm failed or a list came out "
                          "short");
    return HKV_OK;
}

/* ---- prompt end (Algorithm 1), see the later-turn rules in ctkvr.c ---------- */

/* Centroids a shared index builds at a time into a buffer (its own rows'
 * lists): bounds the buffer at KH x BUILD_BATCH x rho positions. */
#define BUILD_BATCH 256

/* The lists of n centroid rows q (stride ldq) into ivf/len at slot[h * n +
 * i] of n_slots: on the device when it offers, else here. */
static int build_into(ctkvr *s, int layer, const hkv_far_view *far, const uint16_t *q, int64_t ldq,
                      int64_t n, const int32_t *slot, int32_t *ivf, int32_t *len, int64_t n_slots,
                      hkv_err *err)
{
    hkv_ctkvr_build b = {
        .far = far, .q = q, .ldq = ldq, .n = n, .n_head = s->H, .rho = s->c.rho, .slot = slot,
        .ivf = ivf, .len = len, .n_slots = n_slots, .n_threads = s->n_threads,
    };
    const hkv_far_accel *acc = far->accel && far->accel->top_lists ? far->accel : NULL;
    int fb = HKV_FALLBACK_SHAPE;   /* the host builds unless the device did (a no of the
                                      device is counted there) */
    int rc = HKV_OK;
    if (acc && acc->takes_top_lists(acc, layer, far, n, s->H, s->c.rho, slot, n_slots) ==
                   HKV_FALLBACK_NONE)
        rc = acc->top_lists(acc, layer, far, q, ldq, n, s->H, s->c.rho, slot, ivf, len, n_slots,
                            &fb, err);
    if (!rc && fb != HKV_FALLBACK_NONE) rc = hkv_ctkvr_build_lists(s->kern, &b, s->mem, err);
    return rc;
}

int hkv_ctkvr_prefill_end(void *self, int layer, const hkv_far_view *far,
                          const hkv_query_view *qv, hkv_err *err)
{
    ctkvr *s = self;
    const int H = s->H, KH = s->KH, g = s->g, d = s->d;
    const int64_t C = s->c.C;
    if (layer < 0 || layer >= s->L)
        return hkv_seterr(err, HKV_E_INVAL, "ctkvr: layer %d out of range (%d layers)", layer, s->L);
    if (far->n_head_kv != KH || far->head_dim != d || far->hi < far->lo)
        return hkv_seterr(err, HKV_E_INVAL, "ctkvr: far view of %d KV heads, d=%d, [%lld, %lld) "
                          "does not match the policy (%d KV heads, d=%d)", far->n_head_kv,
                          far->head_dim, (long long)far->lo, (long long)far->hi, KH, d);
    const int64_t qn = qv ? qv->n : 0;
    if (qn > 0 && (!qv->q || qv->ld < (int64_t)H * d))
        return hkv_seterr(err, HKV_E_INVAL, "ctkvr: query view without rows or with stride %lld "
                          "< %d", (long long)qv->ld, H * d);
    ct_layer *ly = &s->lay[layer];
    const int64_t q_end = qn > 0 ? qv->pos0 + qn : ly->q_end;
    int full = !ly->built;
    int64_t first = 0;   /* first row of qv that is new */
    if (!full && !s->c.dcu) {   /* later turn without DCU: keep the index, new tokens are tail */
        ly->q_end = hkv_max64(ly->q_end, q_end);
        return HKV_OK;
    }
    if (!full && qn > 0) first = hkv_max64(0, hkv_min64(qn, ly->q_end - qv->pos0));
    const int64_t m = hkv_min64(qn - first, C), r0 = qn - m;   /* rows r0..qn-1 become centroids */
    if (m == C) full = 1;   /* every slot rewritten: as a first build */
    for (int h = 0; h < KH; h++) {
        ct_head *hd = &ly->kv[h];
        if (full) hd->head = hd->count = 0;
        else hd->count -= (int32_t)hkv_min64(hd->dcu_new, hd->count);   /* reuse select's slots */
        hd->dcu_new = 0;
        hd->dirty = -1;
    }
    ly->version++;   /* the rows change wholesale: a device mirror uploads them again */
    int rc = HKV_OK;
    if (m > 0) {
        /* in place while the store is this instance's alone, else through
         * a buffer of at most BUILD_BATCH centroids into its own rows */
        int direct = !hkv_ctkvr_shared(s);
        for (int h = 0; h < KH; h++) direct &= hkv_ctkvr_own(s, layer, h)->map == NULL;
        const int64_t nb = direct ? m : hkv_min64(m, BUILD_BATCH);
        const size_t bytes = (size_t)KH * m * sizeof(int32_t) + (size_t)d * sizeof(float) +
                             (direct ? 0 : (size_t)KH * nb * (s->c.rho + 2) * sizeof(int32_t));
        int32_t *slot = hkv_host_alloc(s->mem, HKV_TIER_WORKSPACE, bytes, err);
        if (!slot) return hkv_err_prefix(err, "ctkvr prompt end, layer %d", layer);
        float *tmp = (float *)(slot + (size_t)KH * m);
        int32_t *tslot = (int32_t *)(tmp + d), *tlen = tslot + KH * nb, *tivf = tlen + KH * nb;
        for (int h = 0; h < KH && !rc; h++)
            for (int64_t i = 0; i < m; i++) {
                int32_t sl = hkv_ctkvr_fifo_push(&ly->kv[h], C);
                slot[(int64_t)h * m + i] = sl;
                ct_slot w;
                if (hkv_ctkvr_slot_w(s, layer, h, sl, &w)) {
                    rc = hkv_seterr(err, HKV_E_NOMEM, "no memory for the own rows of a shared "
                                    "index");
                    break;
                }
                *w.len = 0;   /* empty until built: a failure stays consistent */
                *w.dyn = 0;
                for (int j = 0; j < g; j++) {
                    s->kern->f16_to_f32(qv->q + (r0 + i) * qv->ld + ((int64_t)h * g + j) * d, tmp, d);
                    hkv_ctkvr_store_unit(s->kern, tmp, d, w.cent + (size_t)j * d);
                }
            }
        if (!rc && far->hi > far->lo) {
            if (direct) {
                rc = build_into(s, layer, far, qv->q + r0 * qv->ld, qv->ld, m, slot, ly->ivf, ly->len,
                                C, err);
            } else {
                for (int64_t i0 = 0; i0 < m && !rc; i0 += nb) {
                    const int64_t n = hkv_min64(nb, m - i0);
                    for (int h = 0; h < KH; h++)
                        for (int64_t i = 0; i < n; i++) tslot[(int64_t)h * n + i] = (int32_t)i;
                    rc = build_into(s, layer, far, qv->q + (r0 + i0) * qv->ld, qv->ld, n, tslot,
                                    tivf, tlen, n, err);
                    for (int h = 0; h < KH && !rc; h++)
                        for (int64_t i = 0; i < n; i++) {
                            ct_slot w;   /* the own row made above */
                            hkv_ctkvr_slot_w(s, layer, h, slot[(int64_t)h * m + i0 + i], &w);
                            const int32_t ln = tlen[(int64_t)h * n + i];
                            memcpy(w.ivf, tivf + ((int64_t)h * n + i) * s->c.rho, (size_t)ln * 4);
                            *w.len = ln;
                        }
                }
            }
        }
        hkv_host_free(s->mem, HKV_TIER_WORKSPACE, slot, bytes);
        if (rc) return hkv_err_prefix(err, "ctkvr prompt end, layer %d", layer);
    }
    /* Without centroids the whole far tier stays tail, so it is still reachable. */
    if (full) ly->indexed_hi = m > 0 ? far->hi : far->lo;
    if (s->c.sketch) hkv_ctkvr_sketch_layer(s, layer, far);   /* the rerank's int8 keys */
    ly->built = 1;
    ly->q_end = q_end;
    return HKV_OK;
}
