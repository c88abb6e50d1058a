/* y[n][rows] = x[n][cols] W^T over the repacked weight formats.
 *
 * n <= HKV_GEMV_MAX_N (decode): the table's GEMV over static chunks of rows,
 * one contiguous weight stream per thread.
 * Larger n (prefill): W is dequantised panel by panel into ws and handed to
 * oneDNN's sgemm. Two schedules, measured in bench/cpu_kernels.md:
 *   HKV_MM_SHARED_PANEL: all threads dequantise one large panel, then one
 *     oneDNN call (threaded inside oneDNN) multiplies it;
 *   HKV_MM_THREAD_PANEL: each thread dequantises its own panels and calls
 *     oneDNN single-threaded (oneDNN runs serially inside a parallel region),
 *     panels handed out dynamically.
 * hkv_matmul uses the thread panels: equal on one thread, 1.1-1.5x faster
 * on two (n = 512, Q4, 576..14336), and no shared barrier per panel, so a
 * thread slowed by a busy core does not stall the others. ws is sized for
 * it: hkv_matmul_ws_floats = panel rows * cols * omp_get_max_threads(). */
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "kernels_impl.h"
#include "status.h"
#include "work_split.h"

#define HKV_MM_DEFAULT HKV_MM_THREAD_PANEL

#define GEMV_CHUNK_ROWS 64                    /* static chunks for the GEMV path */
#define SHARED_PANEL_FLOATS (4u << 20)       /* 16 MB of dequantised weights */
/* Thread panels of 256 rows: oneDNN re-packs all of x for every panel, so
 * short panels on long rows cost (4096x14336 at 64-row panels: 70 GFLOP/s,
 * at 256: 100). Capped at 16 MB per thread for very long rows. */
#define THREAD_PANEL_ROWS 256
#define THREAD_PANEL_FLOATS (4u << 20)

static int64_t panel_rows(const hkv_wmat *w, size_t floats)
{
    int64_t p = (int64_t)(floats / (size_t)w->cols);
    if (p >= 16) p &= ~(int64_t)15;          /* whole 16-row groups for the sgemm kernel */
    if (p < 1) p = 1;
    return p < w->rows ? p : w->rows;
}

static int64_t thread_panel_rows(const hkv_wmat *w);

static size_t ws_floats_for(const hkv_wmat *w, int mode)
{
    if (w->type == HKV_W_F32 || w->rows <= 0 || w->cols <= 0) return 0;
    if (mode == HKV_MM_SHARED_PANEL)
        return (size_t)panel_rows(w, SHARED_PANEL_FLOATS) * (size_t)w->cols;
    return (size_t)thread_panel_rows(w) * (size_t)w->cols * (size_t)omp_get_max_threads();
}

/* Precision FAST quantises QMM_CHUNK activation rows at a time into ws:
 * bounded whatever n is, and 64 rows of 14336 columns (0.9 MB) stay in L2. */
#define QMM_CHUNK 64

static size_t q8_ws_floats(const hkv_wmat *w)
{
    if (w->type != HKV_W_Q4 && w->type != HKV_W_Q8) return 0;
    return (hkv_qact_bytes(w->cols, QMM_CHUNK) + 63) / sizeof(float) + 16;   /* + alignment */
}

size_t hkv_matmul_ws_floats(const hkv_wmat *w)
{
    size_t a = ws_floats_for(w, HKV_MM_DEFAULT), b = q8_ws_floats(w);
    return a > b ? a : b;
}

static int matmul_q8_parts(const hkv_cpu_kernels *t, const hkv_wmat *parts, int np, const float *x,
                           int64_t n, float *y, int64_t ldy, float *ws);

static int sgemm_rows(const float *x, int64_t n, const float *wrows, int64_t nr, int64_t cols,
                      float *y, int64_t ldy)
{
    /* row-major: y[n][nr] = x[n][cols] * wrows[nr][cols]^T */
    dnnl_status_t st = dnnl_sgemm('N', 'T', n, nr, cols, 1.0f, x, cols, wrows, cols, 0.0f, y, ldy);
    return st == dnnl_success ? HKV_OK : HKV_E_INTERNAL;
}

static int matmul_shared(const hkv_cpu_kernels *t, const hkv_wmat *w, const float *x, int64_t n,
                         float *y, float *ws)
{
    const int64_t rows = w->rows, cols = w->cols;
    if (w->type == HKV_W_F32) return sgemm_rows(x, n, w->q, rows, cols, y, rows);
    const int64_t p = panel_rows(w, SHARED_PANEL_FLOATS);
    for (int64_t r0 = 0; r0 < rows; r0 += p) {
        int64_t nr = rows - r0 < p ? rows - r0 : p;
        #pragma omp parallel for schedule(static)
        for (int64_t g = 0; g < (nr + 15) / 16; g++) {
            int64_t a = r0 + 16 * g, b = a + 16 < r0 + nr ? a + 16 : r0 + nr;
            t->dequant_rows(w, a, b, ws + (a - r0) * cols);
        }
        int rc = sgemm_rows(x, n, ws, nr, cols, y + r0, rows);
        if (rc != HKV_OK) return rc;
    }
    return HKV_OK;
}

/* Rows per thread panel: at most THREAD_PANEL_FLOATS, and small enough that
 * every thread gets several panels (dynamic schedule balances them). */
static int64_t thread_panel_rows(const hkv_wmat *w)
{
    int64_t p = panel_rows(w, THREAD_PANEL_FLOATS);
    if (p > THREAD_PANEL_ROWS) p = THREAD_PANEL_ROWS;
    int64_t even = (w->rows + 4 * omp_get_max_threads() - 1) / (4 * omp_get_max_threads());
    even = (even + 15) & ~(int64_t)15;
    return even < p ? even : p;
}

static int matmul_thread(const hkv_cpu_kernels *t, const hkv_wmat *w, const float *x, int64_t n,
                         float *y, float *ws)
{
    const int64_t rows = w->rows, cols = w->cols;
    const int64_t p = thread_panel_rows(w);
    const int64_t npanels = (rows + p - 1) / p;
    int rc = HKV_OK;
    #pragma omp parallel
    {
        float *mine = w->type == HKV_W_F32 ? NULL : ws + (size_t)omp_get_thread_num() * p * cols;
        #pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < npanels; i++) {
            int64_t r0 = i * p, nr = rows - r0 < p ? rows - r0 : p;
            const float *src = (const float *)w->q + r0 * cols;
            if (mine) {
                t->dequant_rows(w, r0, r0 + nr, mine);
                src = mine;
            }
            if (sgemm_rows(x, n, src, nr, cols, y + r0, rows) != HKV_OK) {
                #pragma omp atomic write
                rc = HKV_E_INTERNAL;
            }
        }
    }
    return rc;
}

size_t hkv_matmul_mode_ws_floats(const hkv_wmat *w, int mode) { return ws_floats_for(w, mode); }

/* A packed matrix (hkv_wmat_pack) runs only where this table's FAST
 * products read its layout. */
static int packed_fast(const hkv_cpu_kernels *t, const hkv_wmat *w)
{
    return t->precision == HKV_PREC_FAST && t->qgemm && t->qgemm_pack == w->pack &&
           (w->type == HKV_W_Q4 || w->type == HKV_W_Q8);
}

int hkv_matmul_mode(const hkv_cpu_kernels *t, const hkv_wmat *w, const float *x, int64_t n,
                    float *y, float *ws, int mode)
{
    if (!t || !w || !x || !y || n < 0 || w->rows < 0 || w->cols <= 0 || w->type < HKV_W_F32 ||
        w->type > HKV_W_Q4)
        return HKV_E_INVAL;
    if ((w->type == HKV_W_Q8 || w->type == HKV_W_Q4) && w->cols % HKV_WBLOCK != 0)
        return HKV_E_INVAL;
    if (w->pack && !packed_fast(t, w)) return HKV_E_INVAL;   /* only qgemm reads the interleaved layout */
    if (n == 0 || w->rows == 0) return HKV_OK;
    if (t->precision == HKV_PREC_FAST && t->qgemm && (w->type == HKV_W_Q4 || w->type == HKV_W_Q8)) {
        /* any n, batch-invariant or not: qgemm's rows never depend on n */
        if (!ws) return HKV_E_INVAL;
        return matmul_q8_parts(t, w, 1, x, n, y, w->rows, ws);
    }
    if (n <= HKV_GEMV_MAX_N || (t->batch_invariant && n <= INT32_MAX)) {
        /* batch-invariant: gemv_fixed over groups of 8 rows, weights streamed
         * once per group, each row's sum in an order independent of n */
        void (*gemv)(const hkv_wmat *, const float *, int, float *, int64_t, int64_t, int64_t) =
            t->batch_invariant ? t->gemv_fixed : t->gemv;
        const int64_t rows = w->rows, nchunks = (rows + GEMV_CHUNK_ROWS - 1) / GEMV_CHUNK_ROWS;
        #pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < nchunks; c++) {
            int64_t r0 = c * GEMV_CHUNK_ROWS;
            int64_t r1 = r0 + GEMV_CHUNK_ROWS < rows ? r0 + GEMV_CHUNK_ROWS : rows;
            gemv(w, x, (int)n, y, rows, r0, r1);
        }
        return HKV_OK;
    }
    if (w->type != HKV_W_F32 && !ws) return HKV_E_INVAL;
    return mode == HKV_MM_THREAD_PANEL ? matmul_thread(t, w, x, n, y, ws)
                                       : matmul_shared(t, w, x, n, y, ws);
}

int hkv_matmul(const hkv_cpu_kernels *t, const hkv_wmat *w, const float *x, int64_t n, float *y,
               float *ws)
{
    return hkv_matmul_mode(t, w, x, n, y, ws, HKV_MM_DEFAULT);
}

/* Groups [g0, g1) of the parts' concatenation (16-row groups; the parts
 * share cols, so a group is the same work in each). */
static void q8_groups(const hkv_cpu_kernels *t, const hkv_wmat *parts, int np, const hkv_qact *a,
                      int64_t ni, float *yc, int64_t ldy, int64_t g0, int64_t g1)
{
    int64_t gbase = 0, off = 0;
    for (int p = 0; p < np && gbase < g1; p++) {
        const int64_t pg = (parts[p].rows + 15) / 16;
        const int64_t lo = g0 > gbase ? g0 - gbase : 0, hi = g1 - gbase < pg ? g1 - gbase : pg;
        if (lo < hi) {
            const int64_t r1 = 16 * hi < parts[p].rows ? 16 * hi : parts[p].rows;
            t->qgemm(&parts[p], a, (int)ni, yc + off, ldy, 16 * lo, r1);
        }
        gbase += pg;
        off += parts[p].rows;
    }
}

/* Precision FAST over one or several parts sharing x: per chunk of tokens
 * one quantisation and one parallel region; the threads split the parts'
 * groups (cpu/work_split.h: each its own contiguous stretch of weight bytes,
 * stealing chunks of the others' at the end). A few tokens are quantised
 * before the region (well under a microsecond each), which spares the
 * barrier a split quantisation needs: at batch 1 a layer runs 4 products,
 * and barriers showed as a tenth of the step. */
#define QUANT_SERIAL_MAX 4
#define SPLIT_CHUNK_BYTES 32768   /* ~1-2 µs of one core's stream: a CAS each is noise */
static int matmul_q8_parts(const hkv_cpu_kernels *t, const hkv_wmat *parts, int np, const float *x,
                           int64_t n, float *y, int64_t ldy, float *ws)
{
    const int64_t cols = parts[0].cols;
    int64_t groups = 0;
    for (int p = 0; p < np; p++) groups += (parts[p].rows + 15) / 16;
    const int64_t gbytes = 16 * cols * (parts[0].type == HKV_W_Q4 ? 5 : 9) / 8;   /* ~ per group */
    const int64_t chunk = SPLIT_CHUNK_BYTES / gbytes > 1 ? SPLIT_CHUNK_BYTES / gbytes : 1;
    const int nr = omp_get_max_threads();
    hkv_split_range ranges[nr];
    void *buf = (void *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
    for (int64_t i0 = 0; i0 < n; i0 += QMM_CHUNK) {
        const int64_t ni = n - i0 < QMM_CHUNK ? n - i0 : QMM_CHUNK;
        hkv_qact a;
        hkv_qact_view(&a, buf, cols, ni);
        const float *xc = x + i0 * cols;
        float *yc = y + i0 * ldy;
        const int serial = ni <= QUANT_SERIAL_MAX;
        if (serial) t->quant_act(xc, 0, ni, &a);
        hkv_split_init(ranges, nr, groups);
        #pragma omp parallel
        {
            const int nt = omp_get_num_threads(), me = omp_get_thread_num();
            if (!serial) {
                t->quant_act(xc, ni * me / nt, ni * (me + 1) / nt, &a);
                #pragma omp barrier
            }
            int64_t g0, g1;
            while (hkv_split_next(ranges, me, nr, chunk, &g0, &g1))
                q8_groups(t, parts, np, &a, ni, yc, ldy, g0, g1);
        }
    }
    return HKV_OK;
}

int hkv_matmul_parts(const hkv_cpu_kernels *t, const hkv_wmat *parts, int np, const float *x,
                     int64_t n, float *y, int64_t ldy, float *ws, float *stage)
{
    if (!t || !parts || np < 1 || !x || !y || n < 0) return HKV_E_INVAL;
    int64_t sum = 0;
    int fast = t->precision == HKV_PREC_FAST && t->qgemm && ws;
    for (int p = 0; p < np; p++) {
        if (parts[p].pack && !packed_fast(t, &parts[p])) return HKV_E_INVAL;
        sum += parts[p].rows;
        fast = fast && (parts[p].type == HKV_W_Q4 || parts[p].type == HKV_W_Q8) &&
               parts[p].cols == parts[0].cols && parts[p].cols % HKV_WBLOCK == 0 && parts[p].rows >= 0;
    }
    if (ldy < sum) return HKV_E_INVAL;
    if (n == 0) return HKV_OK;
    if (fast) return matmul_q8_parts(t, parts, np, x, n, y, ldy, ws);
    if (np == 1 && ldy == parts[0].rows) return hkv_matmul(t, &parts[0], x, n, y, ws);
    if (!stage) return HKV_E_INVAL;
    int64_t off = 0;
    for (int p = 0; p < np; p++) {
        int rc = hkv_matmul(t, &parts[p], x, n, stage, ws);
        if (rc != HKV_OK) return rc;
        for (int64_t r = 0; r < n; r++)
            memcpy(y + r * ldy + off, stage + r * parts[p].rows, (size_t)parts[p].rows * sizeof(float));
        off += parts[p].rows;
    }
    return HKV_OK;
}
