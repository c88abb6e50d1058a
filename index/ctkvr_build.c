/* CTKVR prompt-end list build (Algorithm 1, lines 2-4): for each centroid
 * query and KV head, the top-rho far keys by max over the group's query
 * heads of q.k.
 *
 * Scores are C x g x n dot products (C = 2048, g = 4, n = 128K: 10^12
 * multiply-adds per KV head), so they run as fp32 GEMMs (oneDNN sgemm) and
 * are never materialised whole: a task is (KV head, block of centroids); it
 * walks the far keys in chunks, converts each chunk to fp32, multiplies the
 * block's g*cb query rows by it, folds the g rows of each centroid into a
 * max, and keeps a running top-rho per centroid. The running top-rho is a
 * buffer plus a threshold: only scores above the rho-th best seen so far are
 * appended, and a full buffer is cut back to rho by quickselect, so after
 * the first chunks almost every score is rejected by one compare. Memory per
 * thread is O(cb * (g*chunk + rho)), independent of the far tier's length. */
#include <math.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <string.h>

#include "ctkvr_impl.h"

#define BUILD_ROWS 256    /* GEMM rows (centroids x g) per task: enough for sgemm to run near peak */
#define BUILD_MAX_CB 128  /* centroids per task: bounds the running top-rho buffers */
#define BUILD_KEYS 512    /* keys per chunk: the score tile stays in L2 */

typedef struct build_ws {
    float *qb;      /* [cb*g][d] the block's queries, fp32 */
    float *kf;      /* [nb][d] key chunk, fp32 */
    float *s;       /* [cb*g][nb] scores; row i*g holds centroid i's group max */
    float *bv;      /* [cb][cap] running candidates: scores */
    float *thr;     /* [cb] score a new candidate must beat */
    float *tv;      /* [rho] compaction temporaries */
    int32_t *bp;    /* [cb][cap] running candidates: positions */
    int32_t *blen;  /* [cb] */
    int32_t *keep;  /* [rho] */
    int32_t *scr;   /* [cap] hkv_topk scratch */
    int32_t *ti;    /* [rho] */
} build_ws;

/* Cut a candidate buffer back to its best rho and raise its threshold to the
 * worst kept score (scores equal to it lose, as hkv_topk's tie rule keeps the
 * earlier one). */
static void compact(float *v, int32_t *p, int32_t *len, float *thr, int64_t rho,
                    const build_ws *w)
{
    int64_t m = hkv_topk(v, *len, rho, w->keep, w->scr);
    float lo = INFINITY;
    for (int64_t i = 0; i < m; i++) {
        w->tv[i] = v[w->keep[i]];
        w->ti[i] = p[w->keep[i]];
        if (w->tv[i] < lo) lo = w->tv[i];
    }
    memcpy(v, w->tv, (size_t)m * sizeof *v);
    memcpy(p, w->ti, (size_t)m * sizeof *p);
    *len = (int32_t)m;
    if (m == rho) *thr = lo;
}

/* Append the scores of row[0..nk) above the threshold (positions pos0 + k). */
static void filter_row(const float *row, int64_t nk, int64_t pos0, float thr, float *v,
                       int32_t *p, int32_t *len)
{
    int32_t n = *len;
    for (int64_t a = 0; a < nk; a += 16) {
        int64_t e = nk - a < 16 ? nk - a : 16;
        int any = 0;
        for (int64_t k = 0; k < e; k++) any |= row[a + k] > thr;   /* vectorised reject */
        if (!any) continue;
        for (int64_t k = 0; k < e; k++)
            if (row[a + k] > thr) {
                v[n] = row[a + k];
                p[n++] = (int32_t)(pos0 + a + k);
            }
    }
    *len = n;
}

/* One task: KV head h, centroids [i0, i0 + nc). */
static int build_task(const hkv_cpu_kernels *kern, const hkv_ctkvr_build *b, int h, int64_t i0,
                      int64_t nc, int64_t nb, int64_t cap, const build_ws *w)
{
    const hkv_far_view *far = b->far;
    const int d = far->head_dim, g = b->n_head / far->n_head_kv;
    const int64_t nfar = far->hi - far->lo, M = nc * g, rho = b->rho;
    const uint16_t *K = far->k[h];
    for (int64_t i = 0; i < nc; i++) {
        kern->f16_to_f32(b->q + (i0 + i) * b->ldq + (int64_t)h * g * d, w->qb + i * g * d,
                         (int64_t)g * d);
        w->blen[i] = 0;
        w->thr[i] = -INFINITY;
    }
    for (int64_t p0 = 0; p0 < nfar; p0 += nb) {
        int64_t nk = nfar - p0 < nb ? nfar - p0 : nb;
        for (int64_t r = 0; r < nk; r++)
            kern->f16_to_f32(K + (far->lo + p0 + r) * far->ld, w->kf + r * d, d);
        /* s[M][nk] = qb[M][d] . kf[nk][d]^T (row-major) */
        if (dnnl_sgemm('N', 'T', M, nk, d, 1.0f, w->qb, d, w->kf, d, 0.0f, w->s, nb) !=
            dnnl_success)
            return HKV_E_INTERNAL;
        for (int64_t i = 0; i < nc; i++) {
            float *row = w->s + i * g * nb;
            for (int j = 1; j < g; j++) {
                const float *o = row + j * nb;
                for (int64_t k = 0; k < nk; k++) row[k] = o[k] > row[k] ? o[k] : row[k];
            }
            float *v = w->bv + i * cap;
            int32_t *p = w->bp + i * cap;
            if (w->blen[i] + nk > cap) compact(v, p, &w->blen[i], &w->thr[i], rho, w);
            filter_row(row, nk, far->lo + p0, w->thr[i], v, p, &w->blen[i]);
        }
    }
    for (int64_t i = 0; i < nc; i++) {
        float *v = w->bv + i * cap;
        int32_t *p = w->bp + i * cap;
        if (w->blen[i] > rho) compact(v, p, &w->blen[i], &w->thr[i], rho, w);
        int64_t s = b->slot[(int64_t)h * b->n + i0 + i];
        memcpy(b->ivf + ((int64_t)h * b->n_slots + s) * rho, p, (size_t)w->blen[i] * sizeof *p);
        b->len[(int64_t)h * b->n_slots + s] = w->blen[i];
    }
    return HKV_OK;
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
    int64_t cb = BUILD_ROWS / g;
    if (cb > BUILD_MAX_CB) cb = BUILD_MAX_CB;
    if (cb < 1) cb = 1;
    if (cb > b->n) cb = b->n;
    const int64_t nb = BUILD_KEYS, cap = rho + (rho > nb ? rho : nb);
    const int64_t nblk = (b->n + cb - 1) / cb, ntask = (int64_t)KH * nblk;
    int nt = b->n_threads > 0 ? b->n_threads : omp_get_max_threads();
    if (nt > ntask) nt = (int)ntask;
    if (nt < 1) nt = 1;

    const size_t nf = (size_t)(cb * g * d + nb * d + cb * g * nb + cb * cap + cb + rho);
    const size_t ni = (size_t)(cb * cap + cb + rho + cap + rho);
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
        w.tv = f, f += rho;
        int32_t *ip = (int32_t *)f;
        w.bp = ip, ip += cb * cap;
        w.blen = ip, ip += cb;
        w.keep = ip, ip += rho;
        w.scr = ip, ip += cap;
        w.ti = ip;
        #pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < ntask; t++) {
            int h = (int)(t / nblk);
            int64_t i0 = (t % nblk) * cb, nc = b->n - i0 < cb ? b->n - i0 : cb;
            if (build_task(kern, b, h, i0, nc, nb, cap, &w) != HKV_OK) {
                #pragma omp atomic write
                rc = HKV_E_INTERNAL;
            }
        }
    }
    hkv_host_free(mem, HKV_TIER_WORKSPACE, mem_all, per * (size_t)nt);
    if (rc) return hkv_seterr(err, rc, "ctkvr index build: oneDNN sgemm failed");
    return HKV_OK;
}
