/* The device benchmark's weight products: hkv_gpu_qmat_matmul, the entry
 * point the CUDA backend's matmul op calls, on Q4, Q8 and F16 matrices of
 * Llama-3-8B's shapes (random values, uploaded as the backend uploads a
 * model's), for n = 1..8 rows (the dequantising GEMV) and n = 64, 512 in
 * each GEMM mode (dequantised panels + cuBLAS: split, fp16, fp32).
 *
 * Bytes per call: the matrix as stored (codes + scales + mins), x read and
 * y written once (fp32). A call at n <= 8 reads its weights from DRAM: calls
 * rotate through copies of the matrix adding up to the cold set. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_gpu_impl.h"
#include "gpu_forward.h"

typedef struct pr_shape {
    const char *role;
    int64_t rows, cols;
} pr_shape;

/* Llama-3-8B: attention output, stacked QKV, stacked gate+up, down, head */
static const pr_shape shapes[] = {
    {"wo", 4096, 4096}, {"qkv", 6144, 4096}, {"gate+up", 28672, 4096}, {"down", 4096, 14336},
    {"head", 128256, 4096},
};
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static const char *type_name(int t) { return t == HKV_W_Q4 ? "q4" : t == HKV_W_Q8 ? "q8" : "f16"; }
static const char *mode_name(int m)
{
    return m == HKV_QMAT_GEMM_SPLIT ? "split" : m == HKV_QMAT_GEMM_FP16 ? "fp16" : "fp32";
}

/* Host arrays of one type big enough for every shape of the run. */
typedef struct pr_host {
    void *q;
    uint16_t *scale, *min;
} pr_host;

static int host_make(pr_host *h, int type, int64_t elems, hkv_err *err)
{
    const size_t nb = (size_t)elems / HKV_WBLOCK;
    const size_t qb = type == HKV_W_F16 ? 2 * (size_t)elems : type == HKV_W_Q8 ? (size_t)elems
                                                                                : (size_t)elems / 2;
    memset(h, 0, sizeof *h);
    h->q = malloc(qb);
    if (type != HKV_W_F16) h->scale = malloc(nb * 2);
    if (type == HKV_W_Q4) h->min = malloc(nb * 2);
    if (!h->q || (type != HKV_W_F16 && !h->scale) || (type == HKV_W_Q4 && !h->min))
        return hkv_seterr(err, HKV_E_NOMEM, "bench: no host memory for %lld %s weights",
                          (long long)elems, type_name(type));
    bg_fill(h->q, qb, type == HKV_W_F16 ? BG_F16 : BG_U8, 11 + (uint64_t)type);
    /* scales in [0.001, 0.02], mins in [-0.016, -0.008]: Q4 values as a model's */
    for (size_t i = 0; h->scale && i < nb; i++) {
        const uint32_t r = (uint32_t)(i * 2654435761u) >> 12;
        h->scale[i] = (uint16_t)(0x1400 + r % 0x1100);
        if (h->min) h->min[i] = (uint16_t)(0x8000 | (0x2000 + (r >> 4) % 0x800));
    }
    return HKV_OK;
}

static void host_free(pr_host *h)
{
    free(h->q);
    free(h->scale);
    free(h->min);
}

typedef struct pr_call {
    bg *b;
    const hkv_gpu_qmat *w;   /* [copies] */
    const float *x;
    float *y;
    int64_t n;
    void *ws;
    size_t ws_bytes;
} pr_call;

static int pr_fn(void *arg, int copy, hkv_err *err)
{
    const pr_call *c = arg;
    const hkv_gpu_qmat *w = &c->w[copy];
    return hkv_gpu_qmat_matmul(c->b->ctx, w, c->x, w->cols, c->n, c->y, w->rows, c->ws, c->ws_bytes,
                               c->b->st, err);
}

/* The rows of one (type, shape): GEMV at each n, then each GEMM mode at each n. */
static int one_matrix(bg *b, int type, const pr_shape *s, const pr_host *h, const float *x, float *y,
                      const int64_t *gemv_n, int n_gemv, const int64_t *gemm_n, int n_gemm,
                      hkv_err *err)
{
    const hkv_wmat hw = {type, s->rows, s->cols, h->q, h->scale, h->min, 0};
    hkv_gpu_qmat *w = NULL;
    int copies = 0, rc;
    void *ws = NULL;
    size_t ws_bytes = 0;
    if (!(w = calloc(1, sizeof *w))) return hkv_seterr(err, HKV_E_NOMEM, "bench: no host memory");
    if ((rc = hkv_gpu_qmat_upload(b->ctx, &hw, &w[0], b->st, err))) goto out;
    copies = 1;
    const int want = bg_copies(b, (double)w[0].bytes);
    hkv_gpu_qmat *nw = realloc(w, (size_t)want * sizeof *w);
    if (!nw) {
        rc = hkv_seterr(err, HKV_E_NOMEM, "bench: no host memory");
        goto out;
    }
    w = nw;
    for (; copies < want; copies++)
        if ((rc = hkv_gpu_qmat_clone(b->ctx, &w[0], &w[copies], b->st, err))) goto out;
    const int64_t nmax = n_gemm ? gemm_n[n_gemm - 1] : 0;
    for (int m = HKV_QMAT_GEMM_SPLIT; m <= HKV_QMAT_GEMM_FP32; m++) {
        hkv_gpu_qmat t = w[0];
        t.gemm = m;
        size_t need = hkv_gpu_qmat_matmul_ws_bytes(&t, nmax);
        if (need > ws_bytes) ws_bytes = need;
    }
    if (ws_bytes && !(ws = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, ws_bytes, err))) {
        rc = err->code;
        goto out;
    }
    if ((rc = hkv_gpu_sync(b->st, err))) goto out;
    /* n <= 8: the GEMV (Q4: auto, then one, two and four rows per warp), a
     * pass over every copy per rep; then the GEMM modes */
    static const char *const gv_name[] = {"gemv", "gemv r1", "gemv r2", "gemv r4"};
    const int n_gv = n_gemv * (type == HKV_W_Q4 ? 4 : 1);
    for (int i = 0; i < n_gv + 3 * n_gemm && !rc; i++) {
        const int gemm = i >= n_gv;
        const int mode = gemm ? (i - n_gv) / n_gemm : i / n_gemv;
        const int64_t n = gemm ? gemm_n[(i - n_gv) % n_gemm] : gemv_n[i % n_gemv];
        for (int c = 0; c < copies; c++) {
            w[c].gemm = gemm ? mode : w[c].gemm;
            w[c].gemv = gemm ? HKV_QMAT_GEMV_AUTO : mode;
        }
        bg_row r = {.group = "product", .link = BG_DRAM};
        r.bytes = (double)w[0].bytes + 4.0 * n * (s->rows + s->cols);
        r.flops = 2.0 * n * s->rows * s->cols;
        r.unit = !gemm || mode == HKV_QMAT_GEMM_FP32 ? BG_FP32
                 : mode == HKV_QMAT_GEMM_FP16       ? BG_TENSOR
                                                    : BG_TENSOR_SPLIT;
        snprintf(r.kernel, sizeof r.kernel, "%s %s%s", type_name(type), gemm ? "gemm " : gv_name[mode],
                 gemm ? mode_name(mode) : "");
        snprintf(r.shape, sizeof r.shape, "%s %lldx%lld n=%lld", s->role, (long long)s->rows,
                 (long long)s->cols, (long long)n);
        pr_call c = {b, w, x, y, n, ws, ws_bytes};
        if (!(rc = bg_time(b, pr_fn, &c, copies, gemm ? 1 : copies, &r, err)))
            rc = bg_add(b, &r,
                        json_pack("{s:s,s:s,s:I,s:I,s:I,s:s,s:i}", "type", type_name(type), "role",
                                  s->role, "rows", (json_int_t)s->rows, "cols", (json_int_t)s->cols,
                                  "n", (json_int_t)n, "path", gemm ? mode_name(mode) : gv_name[mode],
                                  "copies", copies),
                        err);
    }
out:
    if (rc) hkv_err_prefix(err, "%s %s %lld x %lld", type_name(type), s->role, (long long)s->rows,
                           (long long)s->cols);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, ws, ws_bytes);
    for (int c = 0; c < copies; c++) hkv_gpu_qmat_free(b->ctx, &w[c]);
    free(w);
    return rc;
}

int bg_run_products(bg *b, hkv_err *err)
{
    static const int64_t gemv_all[] = {1, 2, 4, 8}, gemm_all[] = {64, 512};
    static const int64_t gemv_emu[] = {1, 8}, gemm_emu[] = {64};
    static const int types[] = {HKV_W_Q4, HKV_W_Q8, HKV_W_F16};
    /* the emulator: the smallest matrix, two GEMV widths, one GEMM width */
    const int n_shapes = b->emulated ? 1 : N_SHAPES;
    const int64_t *gemv_n = b->emulated ? gemv_emu : gemv_all, *gemm_n = b->emulated ? gemm_emu : gemm_all;
    const int n_gemv = b->emulated ? 1 + 1 : 4, n_gemm = b->emulated ? 1 : 2;
    const int64_t nmax = gemm_n[n_gemm - 1];
    if (!(b->only & (BG_ONLY_Q4 | BG_ONLY_Q8 | BG_ONLY_F16))) return HKV_OK;
    int64_t max_elems = 0, max_rows = 0, max_cols = 0;
    for (int i = 0; i < n_shapes; i++) {
        const int64_t e = shapes[i].rows * shapes[i].cols;
        max_elems = e > max_elems ? e : max_elems;
        max_rows = shapes[i].rows > max_rows ? shapes[i].rows : max_rows;
        max_cols = shapes[i].cols > max_cols ? shapes[i].cols : max_cols;
    }
    const size_t xb = (size_t)nmax * max_cols * 4, yb = (size_t)nmax * max_rows * 4;
    float *x = bg_alloc_random(b, xb, BG_F32, 5, err), *y = NULL;
    int rc = x ? HKV_OK : err->code;
    if (!rc && !(y = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, yb, err))) rc = err->code;
    static const unsigned type_bit[] = {BG_ONLY_Q4, BG_ONLY_Q8, BG_ONLY_F16};
    for (int t = 0; t < 3 && !rc; t++) {
        if (!(b->only & type_bit[t])) continue;
        pr_host h;
        if (!(rc = host_make(&h, types[t], max_elems, err)))
            for (int i = 0; i < n_shapes && !rc; i++)
                rc = one_matrix(b, types[t], &shapes[i], &h, x, y, gemv_n, n_gemv, gemm_n, n_gemm, err);
        host_free(&h);
    }
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, y, yb);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, x, xb);
    return rc;
}
