/* Window scores, pooling, per-head top-k and RocketKV's budget split: the
 * pieces snapkv.c and rocketkv.c share (see window_scores.h).
 *
 * The window scores are w*g*n dot products per KV head (w = 32..128 window
 * queries, g heads, n far keys): at 128K keys that is 10^10 multiply-adds
 * per layer, so they run as fp32 GEMMs (oneDNN sgemm, as ctkvr's list
 * build) over chunks of keys converted from fp16. The softmax needs each
 * window query's normaliser over every key before any weight is known, so a
 * task (KV head, block of keys) runs twice: pass 1 folds its block into a
 * running (max, sum) per query row, the blocks are merged into a
 * log-sum-exp per row, pass 2 recomputes the scores and adds
 * exp(s - lse) into the block's outputs. Twice the GEMM work instead of a
 * [w*g][n] score matrix (256 MiB per layer at 128K keys, 32 heads). */
#include <math.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>

#include "far_rows.h"
#include "window_scores.h"

#define WS_KEYS 256     /* keys per GEMM chunk: the [w*g][256] score tile stays in L2 */
#define WS_BLOCK 4096   /* keys per task: enough tasks to spread a few KV heads over cores */

/* ---- window scores ------------------------------------------------------------ */

typedef struct ws_task { int h; int64_t x0, nx; } ws_task;

typedef struct ws_thread {
    float *qb;     /* [R][d] the head's window queries, fp32 */
    float *kf;     /* [WS_KEYS][d] a chunk of keys, fp32 */
    float *s;      /* [R][WS_KEYS] scaled scores */
    float *e;      /* [WS_KEYS] */
    int64_t *pos;  /* [WS_KEYS] positions of the chunk */
    int32_t *nv;   /* [w] keys of the chunk each window row may see */
} ws_thread;

static inline int64_t pos_of(const hkv_ws_job *j, int h, int64_t x)
{
    return j->rows ? j->rows[h][x] : j->far->lo + x;
}

static void load_queries(const hkv_cpu_kernels *kern, const hkv_ws_job *j, int h, int g,
                         float *qb)
{
    const int d = j->far->head_dim;
    for (int64_t r = 0; r < j->qv->n; r++)
        kern->f16_to_f32(j->qv->q + r * j->qv->ld + (int64_t)h * g * d, qb + r * g * d,
                         (int64_t)g * d);
}

/* Scores of the chunk [x0, x0 + nk) of head h: w->s row r*g + jj; w->nv[r]
 * = how many of the chunk's keys window row r sees (positions ascend). */
static int chunk(const hkv_cpu_kernels *kern, const hkv_ws_job *j, int h, int g, int64_t x0,
                 int64_t nk, const ws_thread *w)
{
    const hkv_far_view *far = j->far;
    const int d = far->head_dim;
    const int64_t W = j->qv->n, R = W * g;
    for (int64_t r = 0; r < nk; r++) {
        w->pos[r] = pos_of(j, h, x0 + r);
        uint16_t tmp[HKV_Q8_MAX_D];
        hkv_far_k32(kern, far, h, w->pos[r], tmp, w->kf + r * d);
    }
    const float scale = 1.0f / sqrtf((float)d);
    if (dnnl_sgemm('N', 'T', R, nk, d, scale, w->qb, d, w->kf, d, 0.0f, w->s, WS_KEYS) !=
        dnnl_success)
        return HKV_E_INTERNAL;
    int64_t c = 0;
    for (int64_t r = 0; r < W; r++) {   /* window rows ascend in position, so does c */
        const int64_t qpos = j->qv->pos0 + r;
        while (c < nk && w->pos[c] <= qpos) c++;
        w->nv[r] = (int32_t)c;
    }
    return HKV_OK;
}

/* Pass 1: (max, sum of exp(s - max)) per window row over the task's keys. */
static int pass1(const hkv_cpu_kernels *kern, const hkv_ws_job *j, int g, const ws_task *t,
                 float *m, float *l, const ws_thread *w)
{
    const int64_t R = j->qv->n * g;
    for (int64_t r = 0; r < R; r++) m[r] = -INFINITY, l[r] = 0;
    for (int64_t x = 0; x < t->nx; x += WS_KEYS) {
        const int64_t nk = t->nx - x < WS_KEYS ? t->nx - x : WS_KEYS;
        int rc = chunk(kern, j, t->h, g, t->x0 + x, nk, w);
        if (rc) return rc;
        for (int64_t r = 0; r < R; r++) {
            const int64_t nv = w->nv[r / g];
            const float *s = w->s + r * WS_KEYS;
            if (nv == 0) continue;
            float mx = s[0];
            for (int64_t k = 1; k < nv; k++) mx = s[k] > mx ? s[k] : mx;
            for (int64_t k = 0; k < nv; k++) w->e[k] = s[k] - mx;
            kern->exp(w->e, w->e, nv);
            double sum = 0;
            for (int64_t k = 0; k < nv; k++) sum += w->e[k];
            if (mx > m[r]) {
                l[r] = (float)(l[r] * exp((double)m[r] - mx) + sum);
                m[r] = mx;
            } else {
                l[r] = (float)(l[r] + sum * exp((double)mx - m[r]));
            }
        }
    }
    return HKV_OK;
}

/* Pass 2: out[x] += exp(s - lse_r) over the task's keys and every row. */
static int pass2(const hkv_cpu_kernels *kern, const hkv_ws_job *j, int g, const ws_task *t,
                 const float *lse, const ws_thread *w)
{
    const int64_t R = j->qv->n * g;
    float *out = j->out + (int64_t)t->h * j->ld_out + t->x0;
    memset(out, 0, (size_t)t->nx * sizeof *out);
    for (int64_t x = 0; x < t->nx; x += WS_KEYS) {
        const int64_t nk = t->nx - x < WS_KEYS ? t->nx - x : WS_KEYS;
        int rc = chunk(kern, j, t->h, g, t->x0 + x, nk, w);
        if (rc) return rc;
        for (int64_t r = 0; r < R; r++) {
            const int64_t nv = w->nv[r / g];
            const float *s = w->s + r * WS_KEYS;
            const float wt = j->q_weight ? j->q_weight[r / g] : 1.0f;
            if (nv == 0 || !isfinite(lse[r]) || wt == 0) continue;
            for (int64_t k = 0; k < nv; k++) w->e[k] = s[k] - lse[r];
            kern->exp(w->e, w->e, nv);
            if (j->reduce_max)
                for (int64_t k = 0; k < nv; k++) {
                    float v = wt * w->e[k];
                    out[x + k] = v > out[x + k] ? v : out[x + k];
                }
            else if (wt == 1.0f)
                for (int64_t k = 0; k < nv; k++) out[x + k] += w->e[k];
            else
                for (int64_t k = 0; k < nv; k++) out[x + k] += wt * w->e[k];
        }
    }
    return HKV_OK;
}

int hkv_ws_window_scores(const hkv_cpu_kernels *kern, const hkv_ws_job *j,
                         hkv_mem_account *mem, hkv_err *err)
{
    const hkv_far_view *far = j->far;
    const int KH = far->n_head_kv, d = far->head_dim;
    if (KH < 1 || j->n_head < KH || j->n_head % KH || d < 1 || (j->qv->n > 0 && !j->qv->q))
        return hkv_seterr(err, HKV_E_INVAL, "window scores: %d query heads over %d KV heads, "
                          "d=%d, %lld window rows", j->n_head, KH, d, (long long)j->qv->n);
    const int g = j->n_head / KH;
    const int64_t W = j->qv->n, R = W * g;
    const hkv_far_accel *acc = far->accel;
    if (W > 0 && acc && acc->window_scores &&   /* a device that takes it (it counts a no) */
        acc->takes_window_scores(acc, j) == HKV_FALLBACK_NONE) {
        int fb = HKV_FALLBACK_NONE;
        const int rc = acc->window_scores(acc, j, &fb, err);
        if (rc || fb == HKV_FALLBACK_NONE) return rc;
    }
    int64_t ntask = 0;
    for (int h = 0; h < KH; h++) {
        int64_t n = j->rows ? j->n_rows[h] : far->hi - far->lo;
        if (W <= 0) memset(j->out + (int64_t)h * j->ld_out, 0, (size_t)(n > 0 ? n : 0) * 4);
        else ntask += (n + WS_BLOCK - 1) / WS_BLOCK;
    }
    if (ntask == 0) return HKV_OK;
    int nt = j->n_threads > 0 ? j->n_threads : omp_get_max_threads();
    if (nt > ntask) nt = (int)ntask;
    if (nt < 1) nt = 1;
    /* shared: tasks, per-task (max, sum), per-head lse; then one area per thread */
    const size_t shared = (size_t)ntask * sizeof(ws_task) + (size_t)ntask * R * 2 * 4 +
                          (size_t)KH * R * 4;
    const size_t per = (((size_t)R * d + (size_t)WS_KEYS * d + (size_t)R * WS_KEYS + WS_KEYS) * 4 +
                        (size_t)WS_KEYS * 8 + (size_t)W * 4 + 63) & ~(size_t)63;
    const size_t bytes = ((shared + 63) & ~(size_t)63) + per * (size_t)nt;
    char *ws = hkv_host_alloc(mem, HKV_TIER_WORKSPACE, bytes, err);
    if (!ws) return hkv_err_prefix(err, "window scores (%lld rows, %lld tasks)", (long long)R,
                                   (long long)ntask);
    ws_task *task = (ws_task *)ws;
    float *pm = (float *)(task + ntask), *pl = pm + ntask * R, *lse = pl + ntask * R;
    char *thr = ws + ((shared + 63) & ~(size_t)63);
    int64_t t = 0;
    for (int h = 0; h < KH; h++) {
        int64_t n = j->rows ? j->n_rows[h] : far->hi - far->lo;
        for (int64_t x = 0; x < n; x += WS_BLOCK)
            task[t++] = (ws_task){h, x, n - x < WS_BLOCK ? n - x : WS_BLOCK};
    }
    int rc = HKV_OK;
    #pragma omp parallel num_threads(nt)
    {
        ws_thread w;   /* int64 first: the area starts 64-byte aligned */
        w.pos = (int64_t *)(thr + per * (size_t)omp_get_thread_num());
        w.nv = (int32_t *)(w.pos + WS_KEYS);
        float *f = (float *)(w.nv + W);
        w.qb = f, f += R * d;
        w.kf = f, f += (int64_t)WS_KEYS * d;
        w.s = f, f += R * WS_KEYS;
        w.e = f;
        int loaded = -1, my_rc = HKV_OK;
        #pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < ntask; i++) {
            if (task[i].h != loaded) load_queries(kern, j, loaded = task[i].h, g, w.qb);
            if (!my_rc) my_rc = pass1(kern, j, g, &task[i], pm + i * R, pl + i * R, &w);
        }
        /* merge each head's blocks into one log-sum-exp per window row */
        #pragma omp for
        for (int h = 0; h < KH; h++)
            for (int64_t r = 0; r < R; r++) {
                double m = -INFINITY, l = 0;
                for (int64_t i = 0; i < ntask; i++) {
                    if (task[i].h != h || !(pl[i * R + r] > 0)) continue;
                    double mi = pm[i * R + r], li = pl[i * R + r];
                    if (mi > m) l = l * exp(m - mi) + li, m = mi;
                    else l += li * exp(mi - m);
                }
                lse[(int64_t)h * R + r] = l > 0 ? (float)(m + log(l)) : -INFINITY;
            }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < ntask; i++) {
            if (task[i].h != loaded) load_queries(kern, j, loaded = task[i].h, g, w.qb);
            if (!my_rc) my_rc = pass2(kern, j, g, &task[i], lse + (int64_t)task[i].h * R, &w);
        }
        if (my_rc) {
            #pragma omp atomic write
            rc = my_rc;
        }
    }
    hkv_host_free(mem, HKV_TIER_WORKSPACE, ws, bytes);
    if (rc) return hkv_seterr(err, rc, "window scores: oneDNN sgemm failed");
    return HKV_OK;
}

/* ---- pooling and keep ------------------------------------------------------------ */

void hkv_ws_pool(float *s, int64_t n, int kernel, int avg, float *tmp)
{
    const int64_t r = kernel / 2;
    if (n <= 0 || r <= 0) return;
    if (avg) {   /* running sum in double: no drift over 10^5 terms */
        double acc = 0;
        for (int64_t i = 0; i < r && i < n; i++) acc += s[i];
        memcpy(tmp, s, (size_t)n * sizeof *s);
        for (int64_t i = 0; i < n; i++) {
            if (i + r < n) acc += tmp[i + r];
            if (i - r - 1 >= 0) acc -= tmp[i - r - 1];
            s[i] = (float)(acc / kernel);
        }
        return;
    }
    /* van Herk / Gil-Werman: in blocks of `kernel`, running maxima from each
     * block's start (pre) and to its end (suf); a clipped window spans at most
     * two adjacent blocks, so its max is max(suf[a], pre[b]). O(n) for any
     * kernel (RocketKV's is 63). */
    float *pre = tmp, *suf = tmp + n;
    for (int64_t b = 0; b < n; b += kernel) {
        int64_t e = b + kernel < n ? b + kernel : n;
        pre[b] = s[b];
        for (int64_t i = b + 1; i < e; i++) pre[i] = s[i] > pre[i - 1] ? s[i] : pre[i - 1];
        suf[e - 1] = s[e - 1];
        for (int64_t i = e - 2; i >= b; i--) suf[i] = s[i] > suf[i + 1] ? s[i] : suf[i + 1];
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t a = i - r < 0 ? 0 : i - r, b = i + r < n ? i + r : n - 1;
        s[i] = a / kernel == b / kernel && a % kernel == 0 ? pre[b]
               : a / kernel == b / kernel                   ? suf[a]
               : (suf[a] > pre[b] ? suf[a] : pre[b]);
    }
}

int64_t hkv_ws_keep(float *s, const int32_t *rows, int64_t lo, int64_t n, int64_t k,
                    int64_t force_from, int32_t *out, int32_t *idx, int32_t *scratch)
{
    if (k <= 0 || n <= 0) return 0;
    for (int64_t i = 0; i < n; i++)
        if ((rows ? rows[i] : lo + i) >= force_from) s[i] = INFINITY;
    int64_t m = hkv_topk_asc(s, n, k, idx, scratch);   /* rows ascend, so positions do */
    for (int64_t i = 0; i < m; i++) out[i] = rows ? rows[idx[i]] : (int32_t)(lo + idx[i]);
    return m;
}

/* ---- RocketKV's budget split -------------------------------------------------------- */

void hkv_rocketkv_split_of(int64_t S, int64_t t, int d, double split_r, hkv_rocketkv_split *o)
{
    if (S < 1) S = 1;
    if (t < 1) t = 1;
    /* k from the budget as given: the code's min(S, t) clamp would halve k
     * for a short prompt, but here S is the prompt alone and generated tokens
     * join the candidates later, so k stays the budget's half */
    o->k = (int64_t)llround((double)t / 2.0);
    if (o->k < 1) o->k = 1;
    if (t > S) t = S;
    o->c = (double)S / (double)t;
    if (o->c < 1) o->c = 1;
    o->r = isnan(split_r) ? fmin(0.2 + 0.06 * log2(o->c), 0.8) : split_r;
    o->capacity = (int64_t)((double)S / pow(o->c, o->r));
    if (o->capacity < 1) o->capacity = 1;
    if (o->capacity > S) o->capacity = S;
    o->c2 = (double)o->capacity / (double)t;
    if (o->c2 < 1) o->c2 = 1;
    int64_t pf = (int64_t)floor(o->c2), ps = (int64_t)ceil(sqrt(o->c2));
    o->page = pf < ps ? pf : ps;
    if (o->page < 1) o->page = 1;
    int64_t dims = (int64_t)llround((double)d * (double)o->page / o->c2);
    o->dims = dims < 1 ? 1 : dims > d ? d : dims;
}
