/* Per-kernel roofline PREDICTION (gpu_kernel_predict.h). Each cost function
 * restates one kernel of gpu/ as it is written: its grid, what each block
 * reads and writes, what it computes on which unit. Where the source leaves a
 * choice to the hardware (what L2 keeps), the assumption is written where it
 * is made. */
#include "gpu_kernel_predict.h"

#include <math.h>
#include <string.h>

#include "kernels.h"
#include "qmat_panel.h"   /* the GEMM path's panel rows, as qmat.cu sizes them */

/* ---- constants restated from gpu/ (keep in step with the .cu files) ------------ */

enum {
    QM_WARPS = 8,            /* qmat_gemv.cu: GEMV output rows per block */
    QM_MAXN = HKV_QMAT_GEMV_MAX_ROWS, /* qmat_gemv.cu: GEMV activation rows per call */
    ATT_WARPS = 8,           /* attn_common.cuh: query heads per decode block */
    ATT_TILE = 32,           /* attn_common.cuh: keys per tile */
    DECODE_MAX_SPLIT = 32,   /* gpu_kernels.h HKV_GPU_DECODE_MAX_SPLIT */
    MK_THREADS = 256,        /* model_kernels.cu, rows.cu: threads per block */
    PF_CH = 16,              /* attn_prefill.cu: keys per softmax chunk */
    WS_CHUNK = 4096,         /* window_scores.cu: keys per pass-1 block */
};

/* The prefill kernels' tiles: warps per block (BM = 16 W rows), keys per
 * K/V tile, blocks per SM from docs/PTXAS.md (registers limit it, the same
 * on sm_89 and sm_90). d <= 128: attn_prefill_mma.cu (mma.sync, 4 warps;
 * 3 blocks for d64, 2 for d128), which the pipeline runs on sm_80 and up
 * with 16-byte K/V rows; d256: attn_prefill.cu pf_cfg<256> (WMMA, 4). */
static void pf_cfg(int d, int *D, int *W, int *BN, int *per_sm) {
    if (d <= 64) *D = 64, *W = 4, *BN = 64, *per_sm = 3;
    else if (d <= 128) *D = 128, *W = 4, *BN = 32, *per_sm = 2;
    else *D = 256, *W = 2, *BN = 32, *per_sm = 4;
}

int hkv_kernel_decode_splits(int sm_count, int n_seq, int n_head, int n_head_kv, int64_t max_rows) {
    if (sm_count < 1 || n_seq < 1 || n_head_kv < 1 || n_head < n_head_kv || max_rows < 1) return 1;
    const int64_t g = n_head / n_head_kv;
    const int64_t blocks = (int64_t)n_seq * n_head_kv * ((g + ATT_WARPS - 1) / ATT_WARPS);
    /* two waves of blocks; no split under two tiles (attn_decode.cu) */
    int64_t want = (2 * (int64_t)sm_count + blocks - 1) / blocks;
    const int64_t most = max_rows / (2 * ATT_TILE);
    if (want > most) want = most;
    if (want > DECODE_MAX_SPLIT) want = DECODE_MAX_SPLIT;
    return want < 1 ? 1 : (int)want;
}

void hkv_keff_from_params(const hkv_predict_params *p, hkv_keff *e) {
    memset(e, 0, sizeof *e);
    e->mem_eff = p->mem_eff;
    e->attn_eff = p->attn_eff;
    e->gemv_row_cost = p->gemv_row_cost;
    e->compute_eff = p->compute_eff;
    e->t_kernel = p->t_kernel;
    /* FlashInfer's decode benchmark: 32 of 108 (A100) or 128 (RTX 4090) SMs
     * saturate the memory bandwidth when the kernel is not compute-bound
     * (https://flashinfer.ai/2024/02/02/introduce-flashinfer.html) */
    e->sat_frac = 0.25;
}

const char *hkv_kernel_unit_name(int u) {
    switch (u) {
    case HKV_KU_TENSOR: return "tensor fp16";
    case HKV_KU_FP32: return "fp32";
    case HKV_KU_FP64: return "fp64";
    case HKV_KU_SFU: return "SFU";
    default: return "?";
    }
}

const char *hkv_kernel_bound_name(int b) {
    return b == HKV_KB_MEMORY ? "memory" : b == HKV_KB_COMPUTE ? "compute" : b == HKV_KB_LAUNCH ? "launch" : "?";
}

static double wbytes(int wtype, int64_t rows, int64_t cols) {
    hkv_wmat w = {.type = wtype, .rows = rows, .cols = cols};
    return (double)hkv_wmat_bytes(&w);
}

/* fp32 flops the dequantisation spends per weight: Q4 one FMA (s*q + min),
 * Q8 one multiply, fp16 a conversion (not arithmetic), fp32 none. */
static double dq_flops(int wtype) { return wtype == HKV_W_Q4 ? 2 : wtype == HKV_W_Q8 ? 1 : 0; }

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ---- the kernels ---------------------------------------------------------------- */

/* y[n][rows] = x[n][cols] W^T, n <= 8: one warp per output row reads its row
 * of W once for all n; x is re-read by every warp (from L2: it is n x cols x
 * 4 bytes, at most 8 x 14336 x 4 = 459 KB). */
static void c_gemv(const hkv_kshape *s, hkv_kcost *c) {
    static const char *names[] = {"k_qm_gemv_f32", "k_qm_gemv_f16", "k_qm_gemv_q8", "k_qm_gemv_q4"};
    c->name = names[s->wtype], c->file = "gpu/qmat_gemv.cu";
    const double x = (double)s->n * s->cols * 4, y = (double)s->n * s->rows * 4;
    c->bytes_read = wbytes(s->wtype, s->rows, s->cols) + x;
    c->bytes_written = y;
    c->l2_bytes = x * (double)(cdiv(s->rows, QM_WARPS) - 1);
    c->flops[HKV_KU_FP32] = 2.0 * s->n * s->rows * s->cols + dq_flops(s->wtype) * s->rows * s->cols;
    c->unit = HKV_KU_FP32;
    c->launches = 1;
    c->blocks = cdiv(s->rows, QM_WARPS);
}

/* n > 8 (and the F32 path at any n): per panel of pr rows (32 MiB of fp32, at
 * least 128 rows) k_qm_dequant writes the panel into the workspace and an
 * fp32 cuBLAS GEMM (CUBLAS_COMPUTE_32F: CUDA cores, no tensor cores) reads it
 * back. The panel is re-read at once, so it is charged to L2 while it fits
 * in half of it; F32 weights go to cuBLAS as they are.
 *
 * Where the tensor cores' fp16 rate is over 3x the fp32 rate (A100, H100:
 * qmat.cu's hkv_gpu_tensor_split_pays picks it there by compute capability,
 * the same devices) the panel is the fp16 hi/lo split instead: the same 4
 * bytes per weight in the workspace, the activations split once (read 4,
 * write 4 bytes each), two GEMMs doing 3x the product's work on the tensor
 * cores (hi x hi, then the correction over twice the columns), one pass to
 * unscale y. */
static int split_pays(const hkv_device_spec *dev) {
    return dev && dev->tensor_tflops > 3 * dev->fp32_tflops;
}

static void c_panel(const hkv_kshape *s, const hkv_device_spec *dev, hkv_kcost *c) {
    const int split = split_pays(dev);
    c->name = split ? "k_qm_dequant_split + k_qm_xsplit + 2 cuBLAS fp16 GEMMs + k_qm_yscale"
              : s->wtype == HKV_W_F32 ? "cuBLAS SGEMM" : "k_qm_dequant + cuBLAS SGEMM";
    c->file = "gpu/qmat.cu";
    const double x = (double)s->n * s->cols * 4, y = (double)s->n * s->rows * 4;
    const double mm = 2.0 * s->n * s->rows * s->cols;
    c->unit = HKV_KU_FP32;
    if (split) {
        const int64_t pr = hkv_qmat_panel_rows(s->rows, s->cols);
        const int64_t np = cdiv(s->rows, pr);
        const double panel = (double)pr * s->cols * 4, all = (double)s->rows * s->cols * 4;
        const int in_l2 = dev->l2_mib > 0 ? panel <= dev->l2_mib * 1048576.0 / 2 : 1;
        c->unit = HKV_KU_TENSOR;
        c->bytes_read = wbytes(s->wtype, s->rows, s->cols) + 2 * x + y + (in_l2 ? 0 : all);
        c->bytes_written = 2 * y + x + (in_l2 ? 0 : all);
        c->l2_bytes = (in_l2 ? 2 * all : 0) + x * (double)(np - 1);
        c->flops[HKV_KU_TENSOR] = 3 * mm;
        c->flops[HKV_KU_FP32] = (dq_flops(s->wtype) + 2) * s->rows * s->cols + 4.0 * s->n * s->cols;
        c->launches = 2 + 3 * np;
        c->serial = 1;
        c->blocks = cdiv(pr, 128) * cdiv(s->n, 128);
        if (c->blocks < pr) c->blocks = pr;
        return;
    }
    if (s->wtype == HKV_W_F32) {
        c->bytes_read = wbytes(HKV_W_F32, s->rows, s->cols) + x;
        c->bytes_written = y;
        c->flops[HKV_KU_FP32] = mm;
        c->launches = 1;
        c->blocks = cdiv(s->rows, 128) * cdiv(s->n, 128);   /* cuBLAS tiles of ~128 x 128 */
        return;
    }
    const int64_t pr = hkv_qmat_panel_rows(s->rows, s->cols);
    const int64_t np = cdiv(s->rows, pr);
    const double panel = (double)pr * s->cols * 4, all = (double)s->rows * s->cols * 4;
    const int in_l2 = dev && dev->l2_mib > 0 ? panel <= dev->l2_mib * 1048576.0 / 2 : 1;
    c->bytes_read = wbytes(s->wtype, s->rows, s->cols) + x + (in_l2 ? 0 : all);
    c->bytes_written = y + (in_l2 ? 0 : all);
    c->l2_bytes = (in_l2 ? 2 * all : 0) + x * (double)(np - 1);
    c->flops[HKV_KU_FP32] = mm + dq_flops(s->wtype) * s->rows * s->cols;
    c->launches = 2 * np;
    c->serial = 1;
    c->blocks = cdiv(pr, 128) * cdiv(s->n, 128);
    if (c->blocks < pr) c->blocks = pr;   /* the dequantisation: one block per row */
}

/* The target's product (not built): weights read once, dequantised in
 * registers, the multiply-adds on tensor cores at any batch. */
static void c_tc_gemm(const hkv_kshape *s, hkv_kcost *c) {
    c->name = "(target) dequantising tensor-core GEMM", c->file = "not built";
    c->built = 0;
    const double x = (double)s->n * s->cols * 4, y = (double)s->n * s->rows * 4;
    c->bytes_read = wbytes(s->wtype, s->rows, s->cols) + x;
    c->bytes_written = y;
    c->flops[HKV_KU_TENSOR] = 2.0 * s->n * s->rows * s->cols;
    c->flops[HKV_KU_FP32] = dq_flops(s->wtype) * s->rows * s->cols;
    c->unit = HKV_KU_TENSOR;
    c->launches = 1;
    c->blocks = cdiv(s->rows, 64) * cdiv(s->n, 64);
}

/* k_attn_decode: a block per (sequence, KV head, group of <= 8 query heads,
 * split); its K/V tiles of 32 rows go through shared memory once for the
 * group; lane j scores key j (d FMAs), then every lane adds d/32 dims of p V
 * per key (d FMAs per query head and key); expf twice per (query head, key):
 * the key's weight and (per lane, per tile) the rescale. Split: each block
 * writes its partial (out, lse), k_attn_combine reads them back. */
static int c_decode(const hkv_kshape *s, const hkv_device_spec *dev, hkv_kcost *c, hkv_err *err) {
    if (s->n_seq < 1 || s->KH < 1 || s->H < s->KH || s->H % s->KH || s->d < 1 || s->keys < 0)
        return hkv_seterr(err, HKV_E_INVAL, "kernel predict: decode attention shape (%d sequences, "
                          "%d/%d heads of %d, %lld keys)", s->n_seq, s->H, s->KH, s->d,
                          (long long)s->keys);
    const int g = s->H / s->KH, gy = (int)cdiv(g, ATT_WARPS);
    int split = s->n_split;
    if (split < 1)
        split = hkv_kernel_decode_splits(dev ? dev->sms : 1, s->n_seq, s->H, s->KH,
                                         s->split_rows > 0 ? s->split_rows : (s->keys ? s->keys : 1));
    if (split > DECODE_MAX_SPLIT)
        return hkv_seterr(err, HKV_E_RANGE, "kernel predict: %d decode splits (1..%d)", split,
                          DECODE_MAX_SPLIT);
    const double pairs = (double)s->n_seq * s->KH, qrows = (double)s->n_seq * s->H;
    const double part = qrows * (s->d + 1) * 4;   /* (out, lse) of every query head */
    c->name = split > 1 ? "k_attn_decode + k_attn_combine" : "k_attn_decode";
    c->file = "gpu/attn_decode.cu";
    c->n_split = split;
    /* K and V fp16 once per y-block of the group (g <= 8: once), the lengths,
     * the index list when gathered, the query rows */
    c->bytes_read = pairs * gy * s->keys * s->d * 4.0 + pairs * 4 + (s->gather ? pairs * s->keys * 4 : 0) +
                    qrows * s->d * 4;
    c->bytes_written = part;
    c->flops[HKV_KU_FP32] = qrows * s->keys * 4.0 * s->d;
    c->flops[HKV_KU_SFU] = qrows * s->keys * 2.0;
    c->unit = HKV_KU_FP32;
    c->launches = 1;
    c->blocks = (int64_t)pairs * gy * split;
    if (split > 1) {
        /* the partials: written by the splits, read back by the combine (L2
         * at this size: n_split x rows x (d + 1) x 4, 4.2 MB at B = 16, 32
         * splits, 32 heads of 128 ... still charged: they leave the SM) */
        c->bytes_written += split * part;
        c->bytes_read += split * part;
        c->flops[HKV_KU_FP32] += qrows * split * 2.0 * s->d;
        c->flops[HKV_KU_SFU] += qrows * (32 + 2);   /* expf per lane, log, reciprocal */
        c->launches = 2;
    }
    c->useful_flops = c->flops[HKV_KU_FP32];
    return HKV_OK;
}

/* k_attn_merge: a warp per row reads both (out, lse), writes the merged one. */
static void c_merge(const hkv_kshape *s, hkv_kcost *c) {
    c->name = "k_attn_merge", c->file = "gpu/attn_decode.cu";
    const double rows = (double)s->n * s->H;
    c->bytes_read = rows * 2.0 * (s->d + 1) * 4;
    c->bytes_written = rows * (s->d + 1) * 4;
    c->flops[HKV_KU_FP32] = rows * 3.0 * s->d;
    c->flops[HKV_KU_SFU] = rows * 4;   /* two expf, log1pf, a reciprocal */
    c->unit = HKV_KU_FP32;
    c->launches = 1;
    c->blocks = (int64_t)cdiv((int64_t)rows, 8);
}

/* The prefill over one chunk: nq queries at positions p0.., keys [0,
 * p0 + t] for query t. Rows of a block are (token, group head) pairs, BM =
 * 16 W of them; warp w owns 16 rows and walks keys up to its last row's
 * diagonal. d <= 128 (k_attn_prefill_mma<D>): BN-key tiles, all of a tile
 * computed (the diagonal masked), per tile 2 D/16 x BN/8 MMAs for S (Q hi
 * and lo) and 2 BN/16 x D/8 for P V (P hi and lo), each m16n8k16 = 4096
 * flops: 128 D BN. d256 (k_attn_prefill_d256, WMMA): 16-key chunks of 4 D/16
 * m16n16k16 = 8192 flops, the same 128 D a key. The softmax's exp2f per S
 * element and per row rescale on the SFU. The block's K/V tiles (up to its
 * last row's key) pass through shared memory once per block.
 * DRAM: the blocks of one KV head are consecutive in the grid and start
 * together, walking the same keys in step, so a tile one of them fetches
 * serves the others from L2: K/V are charged once per resident set of
 * blocks of the head (at least once), an assumption. */
static int c_prefill(const hkv_kshape *s, const hkv_device_spec *dev, hkv_kcost *c, hkv_err *err) {
    if (s->nq < 1 || s->p0 < 0 || s->KH < 1 || s->H < s->KH || s->H % s->KH || s->d < 32 ||
        s->d > 256 || s->d % 32)
        return hkv_seterr(err, HKV_E_INVAL, "kernel predict: prefill shape (%lld queries at %lld, "
                          "%d/%d heads of %d)", (long long)s->nq, (long long)s->p0, s->H, s->KH, s->d);
    int D, W, BN, per_sm;
    pf_cfg(s->d, &D, &W, &BN, &per_sm);
    static const char *names[] = {"k_attn_prefill_mma<64>", "k_attn_prefill_mma<128>",
                                  "k_attn_prefill_d256"};
    c->name = names[D == 64 ? 0 : D == 128 ? 1 : 2];
    c->file = D == 256 ? "gpu/attn_prefill.cu" : "gpu/attn_prefill_mma.cu";
    const int step = D == 256 ? PF_CH : BN;   /* keys a warp computes at a time */
    const int64_t g = s->H / s->KH, BM = 16 * W, R = s->nq * g;
    const int64_t bx = cdiv(R, BM), warps = cdiv(R, 16);
    /* steps per warp: its last row's key, p0 + (row / g), over the step */
    double chunks = 0, kv_keys = 0;
    for (int64_t w = 0; w < warps; w++) {
        int64_t last = 16 * w + 15;
        if (last > R - 1) last = R - 1;
        chunks += (double)((s->p0 + last / g) / step + 1);
    }
    for (int64_t b = 0; b < bx; b++) {   /* tiles of keys [0, kend) per block */
        int64_t last = b * BM + BM - 1;
        if (last > R - 1) last = R - 1;
        kv_keys += (double)(cdiv(s->p0 + last / g + 1, BN) * BN);
    }
    c->flops[HKV_KU_TENSOR] = s->KH * chunks * 128.0 * D * step;   /* hi/lo for S and P V */
    /* exp2f per S element and one rescale factor per row and step */
    c->flops[HKV_KU_SFU] = s->KH * chunks * (16.0 * step + 16);
    /* Q split into hi/lo, P into hi/lo, the row max/sum: ~8 fp32 ops per
     * S element and 4 per Q element */
    c->flops[HKV_KU_FP32] = s->KH * chunks * 16.0 * step * 8 + (double)R * s->KH * s->d * 4;
    c->unit = HKV_KU_TENSOR;
    /* useful: 4 d per (query head, visible key), causal */
    c->useful_flops = 4.0 * s->d * s->H * ((double)s->nq * s->p0 + (double)s->nq * (s->nq + 1) / 2);
    const double kv_issued = s->KH * kv_keys * s->d * 4.0;
    const double kv_once = s->KH * (double)(s->p0 + s->nq) * s->d * 4.0;
    const int64_t resident = (int64_t)(dev ? dev->sms : 1) * per_sm;
    const double share = (double)(bx < resident ? bx : resident);
    double kv_dram = kv_issued / share;
    if (kv_dram < kv_once) kv_dram = kv_once;
    c->bytes_read = (double)s->nq * s->H * s->d * 4 + kv_dram;
    c->bytes_written = (double)s->nq * s->H * (s->d + 1) * 4;
    c->l2_bytes = kv_issued - kv_dram + (double)bx * s->KH * BM * s->d * 4 - (double)s->nq * s->H * s->d * 4;
    if (c->l2_bytes < 0) c->l2_bytes = 0;
    c->launches = 1;
    c->blocks = bx * s->KH;
    return HKV_OK;
}

/* Element-wise and row kernels (model_kernels.cu, rows.cu). */
static void c_small(const hkv_kshape *s, hkv_kcost *c) {
    const double n = (double)s->n, w = (double)s->width;
    const int rot = s->rot > 0 ? s->rot : s->d;
    c->unit = HKV_KU_FP32;
    c->launches = 1;
    switch (s->kind) {
    case HKV_KN_RMSNORM:   /* one block per row; sum of squares in float64 */
        c->name = "k_rmsnorm", c->file = "gpu/model_kernels.cu";
        c->bytes_read = n * w * 4 + w * 4;
        c->bytes_written = n * w * 4;
        c->flops[HKV_KU_FP64] = n * w * 2;
        c->flops[HKV_KU_FP32] = n * w * 2;
        c->flops[HKV_KU_SFU] = n;   /* the reciprocal square root (float64 sqrt: counted here) */
        c->blocks = s->n;
        break;
    case HKV_KN_ADD_RMSNORM:   /* k_rmsnorm's pass with the residual read and x written back */
        c->name = "k_add_rmsnorm", c->file = "gpu/model_kernels.cu";
        c->bytes_read = n * w * 8 + w * 4;
        c->bytes_written = n * w * 8;
        c->flops[HKV_KU_FP64] = n * w * 2;
        c->flops[HKV_KU_FP32] = n * w * 3;
        c->flops[HKV_KU_SFU] = n;
        c->blocks = s->n;
        break;
    case HKV_KN_ROPE_TABLE:   /* sincos in float64 per (row, pair); ~40 fp64 flops each (a
                                 range reduction and two polynomials: an estimate) */
        c->name = "k_rope_table", c->file = "gpu/model_kernels.cu";
        c->bytes_read = n * 8 + rot / 2 * 4.0;
        c->bytes_written = n * rot * 4.0;
        c->flops[HKV_KU_FP64] = n * rot / 2 * 40.0;
        c->unit = HKV_KU_FP64;
        c->blocks = cdiv(s->n * rot / 2, MK_THREADS);
        break;
    case HKV_KN_ROPE: {   /* a thread per (row, Q or K head, pair): a table lookup, 4 mul + 2 add */
        const double heads = (double)s->H + s->KH;
        c->name = "k_rope", c->file = "gpu/model_kernels.cu";
        c->bytes_read = n * heads * rot * 4 + n * rot * 4.0;
        c->bytes_written = n * heads * rot * 4;
        c->flops[HKV_KU_FP32] = n * heads * rot / 2 * 6.0;
        c->blocks = cdiv((int64_t)(n * heads * rot / 2), MK_THREADS);
        break;
    }
    case HKV_KN_SWIGLU:   /* g / (1 + expf(-g)) * u: expf and a division on the SFU */
        c->name = "k_swiglu", c->file = "gpu/model_kernels.cu";
        c->bytes_read = n * w * 8;
        c->bytes_written = n * w * 4;
        c->flops[HKV_KU_FP32] = n * w * 4;
        c->flops[HKV_KU_SFU] = n * w * 2;
        c->blocks = cdiv((int64_t)(n * w), MK_THREADS);
        break;
    case HKV_KN_ADD:
        c->name = "k_add", c->file = "gpu/model_kernels.cu";
        c->bytes_read = n * w * 8;
        c->bytes_written = n * w * 4;
        c->flops[HKV_KU_FP32] = n * w;
        c->blocks = cdiv((int64_t)(n * w), MK_THREADS);
        break;
    case HKV_KN_KV_APPEND:   /* K and V of n rows: fp32 in, fp16 (RNE) out, a slot each */
        c->name = "k_kv_append", c->file = "gpu/rows.cu";
        c->bytes_read = n * s->KH * s->d * 2.0 * 4 + n * 8;
        c->bytes_written = n * s->KH * s->d * 2.0 * 2;
        c->blocks = cdiv((int64_t)(n * s->KH * s->d * 2), MK_THREADS);
        break;
    case HKV_KN_COPY_ROWS:
        c->name = "k_copy_rows", c->file = "gpu/rows.cu";
        c->bytes_read = n * w * 4 + n * 4;
        c->bytes_written = n * w * 4;
        c->blocks = cdiv((int64_t)(n * w), MK_THREADS);
        break;
    case HKV_KN_PARTIAL_CLEAR:
        c->name = "k_partial_clear", c->file = "gpu/rows.cu";
        c->bytes_written = n * s->H * (s->d + 1) * 4.0;
        c->blocks = cdiv((int64_t)(n * s->H * (s->d + 1)), MK_THREADS);
        break;
    }
    if (c->blocks < 1) c->blocks = 1;
}

/* Centroid recall, two launches: blocks of 32 centroids per (row, KV head)
 * score the C fp16 unit centroids of its group (g d FMAs each, max over the
 * group) into a score workspace (C x 4 B, re-read C' times by the arg-max
 * passes: L2); then a block per (row, KV head) either writes the top C'
 * slots and cosines (k_recall_top, built) or ORs the C' lists (rho ids
 * each) and the tail into a bitmap over the far tier and compacts it into
 * candidate ids (k_ctkvr_recall, the target). The grid is the scoring's. */
static void c_recall(const hkv_kshape *s, hkv_kcost *c) {
    const double items = (double)s->n * s->KH, g = (double)s->H / s->KH;
    const double cent = (double)s->C * g * s->d * 2, q = g * s->d * 4, sc = (double)s->C * 4;
    c->unit = HKV_KU_FP32;
    c->launches = 2;
    c->blocks = (int64_t)items * cdiv(s->C > 0 ? s->C : 1, 32);
    c->flops[HKV_KU_FP32] = items * ((double)s->C * g * s->d * 2 + g * s->d * 2 + (double)s->Cp * s->C);
    c->flops[HKV_KU_SFU] = items * g;
    if (s->kind == HKV_KN_RECALL_TOP) {
        c->name = "k_recall_top", c->file = "gpu/recall_top.cu";
        c->bytes_read = items * (cent + q + 8 + 16);   /* table row, FIFO */
        c->bytes_written = items * (sc + (double)s->Cp * 8 + 4);
        c->l2_bytes = items * sc * (double)s->Cp;
    } else {
        const double words = (double)cdiv(s->far > 0 ? s->far : 1, 32) * 4;
        c->name = "k_ctkvr_recall", c->file = "gpu/ctkvr_recall.cu";
        c->bytes_read = items * (cent + q + (double)s->Cp * s->rho * 4 + (double)s->C * 4 + 8);
        c->bytes_written = items * (sc + (double)s->cand * 4 + 4);
        c->l2_bytes = items * (sc * (double)s->Cp + 3 * words);   /* bitmap: zero, OR, scan */
    }
}

/* ctkvr's index build of one layer (pipeline/cuda_index.c): centroids
 * (C x H rows of d, read and written once), then per KV head and block of
 * cb centroids (what the workspace holds: cb x far x 4 B) the tensor-core
 * scores, 64 x 64 (centroid, key) tiles over the group's g query heads at
 * the kernel's padded head size (64 or 128), written once as fp32, and one
 * select block per centroid that reads its row 6 times (4 radix digits,
 * the keys above the cut, the ties) and writes rho ids. A key tile is read
 * by each of the cb / 64 centroid blocks, and a query block by each key
 * block: L2. The scores are compute-bound and the select memory-bound, one
 * after the other per block of centroids: serial. */
static void c_build(const hkv_kshape *s, hkv_kcost *c) {
    const double g = (double)s->H / s->KH, far = (double)s->far, C = (double)s->C;
    const int D = s->d <= 64 ? 64 : 128;
    int64_t cb = s->ws_bytes > 0 ? s->ws_bytes / (s->far * 4) : s->C;
    if (cb < 1) cb = 1;
    if (cb > s->C) cb = s->C;
    const double launches = (double)s->KH * cdiv(s->C, cb);
    const double keys = s->KH * far * s->d * 2, qs = C * s->H * s->d * 2, sc = s->KH * C * far * 4;
    c->name = "k_build_scores_mma + k_build_select";
    c->file = "gpu/ctkvr_scores_mma.cu, gpu/ctkvr_build.cu";
    c->unit = HKV_KU_TENSOR;
    c->serial = 1;
    c->launches = 1 + 2 * (int64_t)launches;
    c->blocks = cdiv(s->far, 64) * cdiv(cb, 64);
    c->flops[HKV_KU_TENSOR] = 2.0 * s->KH * C * g * far * D;
    c->bytes_read = keys * launches / s->KH + 2 * qs + 6 * sc;
    c->bytes_written = qs + sc + s->KH * C * ((double)s->rho + 1) * 4;
    c->l2_bytes = keys * (double)cdiv(cb, 64) + qs * (double)cdiv(s->far, 64);
}

/* Window scores (prompt end of snapkv, rocketkv, fastkv, laq, speckv): pass 1
 * a block per (4096-key chunk, window row x group head, KV head) scores its
 * chunk, pass 2 a thread per key re-scores every visible window row. Every
 * window row re-reads the KV head's keys in both passes; they are charged to
 * DRAM once per pass when the head's keys fit half of L2, else per row. */
static void c_window(const hkv_kshape *s, const hkv_device_spec *dev, hkv_kcost *c) {
    const double g = (double)s->H / s->KH, rows = (double)s->window * g;
    const double khead = (double)s->keys * s->d * 2;
    const int fits = dev && dev->l2_mib > 0 ? khead <= dev->l2_mib * 1048576.0 / 2 : 1;
    const double issued = 2 * s->KH * rows * khead;
    c->name = "k_ws_stats + k_ws_lse + k_ws_acc", c->file = "gpu/window_scores.cu";
    c->bytes_read = (fits ? 2 * s->KH * khead : issued) + rows * s->KH * s->d * 2;
    c->bytes_written = (double)s->KH * s->keys * 4 + rows * s->KH * cdiv(s->keys, WS_CHUNK) * 8;
    c->l2_bytes = fits ? issued - 2 * s->KH * khead : 0;
    c->flops[HKV_KU_FP32] = 2 * s->KH * rows * (double)s->keys * 2 * s->d;
    c->flops[HKV_KU_SFU] = 2 * s->KH * rows * (double)s->keys;
    c->unit = HKV_KU_FP32;
    c->launches = 3;
    c->blocks = (int64_t)(cdiv(s->keys, WS_CHUNK) * rows * s->KH);
}

int hkv_kernel_cost(const hkv_kshape *s, const hkv_device_spec *dev, hkv_kcost *c, hkv_err *err) {
    memset(c, 0, sizeof *c);
    if (!s) return hkv_seterr(err, HKV_E_INVAL, "kernel predict: no shape");
    c->built = 1;
    c->n_split = 1;
    switch (s->kind) {
    case HKV_KN_GEMV:
    case HKV_KN_PANEL_GEMM:
    case HKV_KN_TC_GEMM:
        if (s->rows < 1 || s->cols < 1 || s->n < 1 || s->wtype < HKV_W_F32 || s->wtype > HKV_W_Q4 ||
            (s->wtype >= HKV_W_Q8 && s->cols % HKV_WBLOCK))
            return hkv_seterr(err, HKV_E_INVAL, "kernel predict: product %lld x %lld (type %d) over "
                              "%lld rows", (long long)s->rows, (long long)s->cols, s->wtype,
                              (long long)s->n);
        if (s->kind == HKV_KN_GEMV && s->n > QM_MAXN)
            return hkv_seterr(err, HKV_E_RANGE, "kernel predict: the GEMV takes at most %d rows, "
                              "not %lld (gpu/qmat.cu takes the panel path)", QM_MAXN, (long long)s->n);
        if (s->kind == HKV_KN_GEMV) c_gemv(s, c);
        else if (s->kind == HKV_KN_PANEL_GEMM) c_panel(s, dev, c);
        else c_tc_gemm(s, c);
        break;
    case HKV_KN_ATTN_DECODE: {
        int rc = c_decode(s, dev, c, err);
        if (rc) return rc;
        break;
    }
    case HKV_KN_ATTN_PREFILL: {
        int rc = c_prefill(s, dev, c, err);
        if (rc) return rc;
        break;
    }
    case HKV_KN_ATTN_MERGE:
    case HKV_KN_RMSNORM:
    case HKV_KN_ROPE_TABLE:
    case HKV_KN_ROPE:
    case HKV_KN_SWIGLU:
    case HKV_KN_ADD:
    case HKV_KN_ADD_RMSNORM:
    case HKV_KN_KV_APPEND:
    case HKV_KN_COPY_ROWS:
    case HKV_KN_PARTIAL_CLEAR:
        if (s->n < 1 || ((s->kind == HKV_KN_RMSNORM || s->kind == HKV_KN_SWIGLU || s->kind == HKV_KN_ADD ||
                          s->kind == HKV_KN_ADD_RMSNORM || s->kind == HKV_KN_COPY_ROWS) && s->width < 1) ||
            ((s->kind == HKV_KN_ATTN_MERGE || s->kind == HKV_KN_ROPE || s->kind == HKV_KN_KV_APPEND ||
              s->kind == HKV_KN_PARTIAL_CLEAR || s->kind == HKV_KN_ROPE_TABLE) &&
             (s->d < 1 || (s->kind != HKV_KN_ROPE_TABLE && s->H < 1 && s->KH < 1))))
            return hkv_seterr(err, HKV_E_INVAL, "kernel predict: kernel %d over %lld rows of %lld "
                              "(head size %d)", s->kind, (long long)s->n, (long long)s->width, s->d);
        if (s->kind == HKV_KN_ATTN_MERGE) c_merge(s, c);
        else c_small(s, c);
        break;
    case HKV_KN_RECALL_TOP:
    case HKV_KN_CTKVR_RECALL:
        if (s->n < 1 || s->KH < 1 || s->H < s->KH || s->H % s->KH || s->d < 1 || s->C < 1 || s->Cp < 1 ||
            (s->kind == HKV_KN_CTKVR_RECALL && (s->rho < 1 || s->cand < 0)))
            return hkv_seterr(err, HKV_E_INVAL, "kernel predict: recall shape (%lld rows, C %lld, "
                              "C' %lld, rho %lld)", (long long)s->n, (long long)s->C, (long long)s->Cp,
                              (long long)s->rho);
        c_recall(s, c);
        break;
    case HKV_KN_WINDOW_SCORES:
        if (s->window < 1 || s->keys < 1 || s->KH < 1 || s->H < s->KH || s->H % s->KH || s->d < 1)
            return hkv_seterr(err, HKV_E_INVAL, "kernel predict: window scores shape (%lld rows, "
                              "%lld keys)", (long long)s->window, (long long)s->keys);
        c_window(s, dev, c);
        break;
    case HKV_KN_CTKVR_BUILD:
        if (s->KH < 1 || s->H < s->KH || s->H % s->KH || s->d < 1 || s->C < 1 || s->rho < 1 ||
            s->far < 1 || s->ws_bytes < 0)
            return hkv_seterr(err, HKV_E_INVAL, "kernel predict: index build shape (C %lld over "
                              "%lld keys, rho %lld)", (long long)s->C, (long long)s->far,
                              (long long)s->rho);
        c_build(s, c);
        break;
    default:
        return hkv_seterr(err, HKV_E_INVAL, "kernel predict: unknown kernel kind %d", s->kind);
    }
    c->bytes = c->bytes_read + c->bytes_written;
    if (s->kind != HKV_KN_ATTN_PREFILL && s->kind != HKV_KN_ATTN_DECODE)
        c->useful_flops = c->flops[c->unit];
    return HKV_OK;
}

/* Achievable rates: the sheet's peak times the efficiency, times a
 * parallelism share. Memory: FlashInfer observes that a quarter to a third
 * of the SMs saturate DRAM, so a grid of b blocks reaches min(1, b /
 * (sat_frac x SMs)) of it (a block per SM assumed). Arithmetic is SM-local:
 * min(1, b / SMs) of each unit's peak. A launch costs at least t_kernel
 * (hkv_predict_params' convention: the floor includes the launch; in a busy
 * stream the next launch overlaps the running kernel). */
int hkv_kernel_time(const hkv_kcost *c, const hkv_device_spec *dev, const hkv_keff *e, hkv_ktime *t,
                    hkv_err *err) {
    memset(t, 0, sizeof *t);
    if (!c || !dev || !e || !(e->mem_eff > 0 && e->mem_eff <= 1) ||
        !(e->compute_eff > 0 && e->compute_eff <= 1) || e->t_kernel < 0 ||
        !(e->sat_frac > 0 && e->sat_frac <= 1) || dev->sms < 1 || !(dev->mem_gbs > 0))
        return hkv_seterr(err, HKV_E_INVAL, "kernel predict: no cost, no device or bad efficiencies");
    const double blocks = c->blocks > 0 ? (double)c->blocks : 1;
    const double pm = fmin(1.0, blocks / fmax(1.0, e->sat_frac * dev->sms));
    const double pc = fmin(1.0, blocks / dev->sms);
    const double peak[HKV_KU_COUNT] = {dev->tensor_tflops * 1e12, dev->fp32_tflops * 1e12,
                                       dev->fp64_tflops * 1e12, dev->sfu_tops * 1e12};
    t->bw = dev->mem_gbs * 1e9 * e->mem_eff * pm;
    t->t_mem = c->bytes / t->bw;
    double tc = 0;
    t->bound_unit = c->unit;
    for (int u = 0; u < HKV_KU_COUNT; u++) {
        t->rate[u] = peak[u] * e->compute_eff * pc;
        /* a unit the sheet gives no figure for is never a bound */
        t->t_unit[u] = c->flops[u] > 0 && t->rate[u] > 0 ? c->flops[u] / t->rate[u] : 0;
        if (t->t_unit[u] > tc) tc = t->t_unit[u], t->bound_unit = u;
    }
    t->t_roof = fmax(t->t_mem, tc);
    t->t_launch = (double)c->launches * e->t_kernel;
    t->t_s = fmax(t->t_roof, t->t_launch);
    if (c->serial && c->launches >= 2) {   /* np x (dequantise, then GEMM) */
        const double np = (double)(c->launches / 2);
        t->t_roof = t->t_mem + tc;
        t->t_s = np * (fmax(e->t_kernel, t->t_mem / np) + fmax(e->t_kernel, tc / np));
    }
    t->ai = c->bytes > 0 ? c->flops[c->unit] / c->bytes : 0;
    t->bound = t->t_launch >= t->t_roof && t->t_launch > 0 ? HKV_KB_LAUNCH
               : tc > t->t_mem                              ? HKV_KB_COMPUTE
                                                            : HKV_KB_MEMORY;
    return HKV_OK;
}

int hkv_kernel_predict(const hkv_kshape *s, const hkv_device_spec *dev, const hkv_keff *e,
                       hkv_kpred *out, hkv_err *err) {
    memset(out, 0, sizeof *out);
    if (s) out->shape = *s;
    int rc = hkv_kernel_cost(s, dev, &out->cost, err);
    hkv_keff ea;
    if (e && s && s->kind == HKV_KN_ATTN_DECODE && e->attn_eff > 0) {
        ea = *e;   /* the decode attention at its own measured share */
        ea.mem_eff = e->attn_eff;
        e = &ea;
    }
    if (!rc) rc = hkv_kernel_time(&out->cost, dev, e, &out->time, err);
    if (!rc && s->kind == HKV_KN_GEMV && s->n > 1 && e->gemv_row_cost > 0)
        out->time.t_s *= 1 + e->gemv_row_cost * (s->n - 1);   /* measured, not the roofline's */
    return rc;
}

/* ---- the kernels of a step --------------------------------------------------------- */

typedef struct rowset {
    hkv_kstep_row *r;
    int cap, n;
    const hkv_device_spec *dev;
    const hkv_keff *e;
} rowset;

static int add(rowset *rs, const char *what, const char *phase, int64_t calls, const hkv_kshape *s,
               hkv_err *err) {
    if (rs->n >= rs->cap)
        return hkv_seterr(err, HKV_E_RANGE, "kernel predict: more than %d rows", rs->cap);
    hkv_kstep_row *r = &rs->r[rs->n];
    int rc = hkv_kernel_predict(s, rs->dev, rs->e, &r->k, err);
    if (rc) return rc;
    r->what = what, r->phase = phase, r->calls = calls;
    rs->n++;
    return HKV_OK;
}

/* A weight product over B rows as pipeline/cuda_backend.c runs it: the
 * GEMV up to 8 rows, 8-row GEMVs (and one for the rest) up to
 * HKV_QMAT_GEMV_CHUNKED_ROWS, the panel GEMM above; TARGET: one
 * tensor-core kernel. */
static int add_product(rowset *rs, const char *what, const char *phase, int64_t calls, int mode,
                       int wtype, int64_t rows, int64_t cols, int B, hkv_err *err) {
    hkv_kshape s = {.kind = HKV_KN_TC_GEMM, .wtype = wtype, .rows = rows, .cols = cols, .n = B};
    if (mode == HKV_PRED_TARGET) return add(rs, what, phase, calls, &s, err);
    if (wtype == HKV_W_F32 || B > HKV_QMAT_GEMV_CHUNKED_ROWS) {
        s.kind = HKV_KN_PANEL_GEMM;
        return add(rs, what, phase, calls, &s, err);
    }
    s.kind = HKV_KN_GEMV;
    const int full = B / QM_MAXN, rest = B % QM_MAXN;
    int rc = HKV_OK;
    if (full) {
        s.n = QM_MAXN;
        rc = add(rs, what, phase, calls * full, &s, err);
    }
    if (!rc && rest) {
        s.n = rest;
        rc = add(rs, what, phase, calls, &s, err);
    }
    return rc;
}

int hkv_kernel_step_rows(const hkv_predict_params *p, int mode, hkv_kstep_row *rows, int cap, int *n,
                         hkv_err *err) {
    *n = 0;
    if (!p || !p->cfg || !p->dev || p->batch < 1 || p->n_ctx < 1 || (mode != HKV_PRED_BUILT && mode != HKV_PRED_TARGET))
        return hkv_seterr(err, HKV_E_INVAL, "kernel predict: no configuration");
    const hkv_model_config *c = p->cfg;
    const hkv_policy_def *pol = p->policy ? p->policy : &hkv_policy_full;
    const int is_ct = pol == &hkv_policy_ctkvr;
    if (pol != &hkv_policy_full && !is_ct)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "--predict: no speed model for policy '%s' "
                          "(models exist for full and ctkvr)", pol->name);
    hkv_keff e;
    hkv_keff_from_params(p, &e);
    rowset rs = {.r = rows, .cap = cap, .dev = p->dev, .e = &e};
    const int B = p->batch, L = c->n_layer, H = c->n_head, KH = c->n_head_kv, d = c->head_dim;
    const int64_t dim = c->dim, qkv = (int64_t)(H + 2 * KH) * d, qd = (int64_t)H * d;
    const int64_t R0 = (int64_t)p->L_init + p->L_local;
    const int64_t near = is_ct ? (p->n_ctx < R0 ? p->n_ctx : R0) : p->n_ctx;
    int rc = HKV_OK;
    const struct {
        const char *what;
        int64_t rows, cols;
    } mats[] = {{"QKV product", qkv, dim}, {"O product", dim, qd}, {"gate/up product", 2 * (int64_t)c->ffn, dim},
                {"down product", dim, c->ffn}};
    hkv_kshape s;
    for (int i = 0; i < 4 && !rc; i++)
        rc = add_product(&rs, mats[i].what, "layer", L, mode, p->wtype, mats[i].rows, mats[i].cols, B,
                         err);
    /* the forward pass fuses each residual add with the norm after it
     * (runtime/forward.c add_norm): the first layer's norm and the last
     * layer's add stay alone */
    if (!rc) {
        s = (hkv_kshape){.kind = HKV_KN_RMSNORM, .n = B, .width = dim};
        rc = add(&rs, "RMSNorm (first layer's)", "step", 1, &s, err);
    }
    if (!rc) {
        s = (hkv_kshape){.kind = HKV_KN_ADD_RMSNORM, .n = B, .width = dim};
        rc = add(&rs, "residual add + RMSNorm (x2)", "layer", 2LL * L - 1, &s, err);
    }
    if (!rc) {
        s = (hkv_kshape){.kind = HKV_KN_ROPE, .n = B, .H = H, .KH = KH, .d = d, .rot = c->rope_dim};
        rc = add(&rs, "RoPE (Q and K)", "layer", L, &s, err);
    }
    if (!rc) {
        s = (hkv_kshape){.kind = HKV_KN_ROPE_TABLE, .n = B, .d = d, .rot = c->rope_dim};
        rc = add(&rs, "RoPE table", "step", 1, &s, err);
    }
    if (!rc) {
        s = (hkv_kshape){.kind = HKV_KN_SWIGLU, .n = B, .width = c->ffn};
        rc = add(&rs, "SwiGLU", "layer", L, &s, err);
    }
    if (!rc) {
        s = (hkv_kshape){.kind = HKV_KN_ADD, .n = B, .width = dim};
        rc = add(&rs, "residual add (last layer's)", "step", 1, &s, err);
    }
    if (!rc) {
        s = (hkv_kshape){.kind = HKV_KN_KV_APPEND, .n = B, .H = H, .KH = KH, .d = d};
        rc = add(&rs, "K/V append", "layer", L, &s, err);
    }
    if (!rc) {
        s = (hkv_kshape){.kind = HKV_KN_COPY_ROWS, .n = B, .width = qd};
        rc = add(&rs, "Q gather, out scatter (x2)", "layer", 2LL * L, &s, err);
    }
    if (!rc) {
        s = (hkv_kshape){.kind = HKV_KN_COPY_ROWS, .n = B, .width = H};
        rc = add(&rs, "lse scatter", "layer", L, &s, err);
    }
    if (!rc) {
        /* full: the whole context, the split chosen for it; ctkvr: the near
         * ring through its index list, split as the pipeline asks (max_rows
         * = the near tier) */
        s = (hkv_kshape){.kind = HKV_KN_ATTN_DECODE, .n_seq = B, .H = H, .KH = KH, .d = d, .keys = near,
                         .gather = is_ct, .split_rows = is_ct ? R0 : p->n_ctx};
        rc = add(&rs, is_ct ? "near attention (sinks + window)" : "decode attention (whole KV)", "layer",
                 L, &s, err);
    }
    if (!rc && is_ct) {
        s = (hkv_kshape){.kind = HKV_KN_PARTIAL_CLEAR, .n = B, .H = H, .d = d};
        rc = add(&rs, "partials cleared", "layer", L, &s, err);
        if (!rc) {
            s = (hkv_kshape){.kind = HKV_KN_ATTN_MERGE, .n = B, .H = H, .d = d};
            rc = add(&rs, "merge near + far", "layer", L, &s, err);
        }
        if (!rc) {
            hkv_prediction o;
            if ((rc = hkv_predict(p, &o, err))) return rc;
            s = (hkv_kshape){.kind = mode == HKV_PRED_BUILT ? HKV_KN_RECALL_TOP : HKV_KN_CTKVR_RECALL,
                             .n = B, .H = H, .KH = KH, .d = d, .C = o.C, .Cp = o.Cp, .rho = o.rho,
                             .cand = o.candidates, .far = o.far_rows};
            rc = add(&rs, mode == HKV_PRED_BUILT ? "ctkvr recall (top C' slots)"
                                                 : "ctkvr recall + lists (candidates)",
                     "layer", L, &s, err);
        }
    }
    if (!rc)   /* the output head */
        rc = add_product(&rs, "output head", "step", 1, mode, p->wtype, c->vocab, dim, B, err);
    if (!rc) {   /* one sequence's prompt, causal, in chunks of max_rows, all layers */
        const int64_t chunk = p->max_rows > 0 ? p->max_rows : 256;
        hkv_kstep_row sum;
        memset(&sum, 0, sizeof sum);
        int64_t nch = 0;
        double ts = 0;
        for (int64_t p0 = 0; p0 < p->n_ctx && !rc; p0 += chunk, nch++) {
            const int64_t nq = p->n_ctx - p0 < chunk ? p->n_ctx - p0 : chunk;
            s = (hkv_kshape){.kind = HKV_KN_ATTN_PREFILL, .H = H, .KH = KH, .d = d, .nq = nq, .p0 = p0};
            hkv_kpred k;
            if ((rc = hkv_kernel_predict(&s, p->dev, &e, &k, err))) break;
            if (!nch) sum.k = k;   /* name, unit, the first chunk's grid */
            else {
                sum.k.cost.bytes_read += k.cost.bytes_read;
                sum.k.cost.bytes_written += k.cost.bytes_written;
                sum.k.cost.bytes += k.cost.bytes;
                sum.k.cost.l2_bytes += k.cost.l2_bytes;
                for (int u = 0; u < HKV_KU_COUNT; u++) sum.k.cost.flops[u] += k.cost.flops[u];
                sum.k.cost.useful_flops += k.cost.useful_flops;
                sum.k.cost.launches += k.cost.launches;
                sum.k.time.t_mem += k.time.t_mem;
                sum.k.time.t_launch += k.time.t_launch;
                for (int u = 0; u < HKV_KU_COUNT; u++) sum.k.time.t_unit[u] += k.time.t_unit[u];
            }
            ts += k.time.t_s;
        }
        if (rc) return rc;
        /* the prompt's chunks, summed: the time is the sum of each chunk's */
        hkv_ktime *t = &sum.k.time;
        double tc = 0;
        for (int u = 0; u < HKV_KU_COUNT; u++)
            if (t->t_unit[u] > tc) tc = t->t_unit[u], t->bound_unit = u;
        t->t_roof = fmax(t->t_mem, tc);
        t->t_s = ts;
        t->ai = sum.k.cost.bytes > 0 ? sum.k.cost.flops[sum.k.cost.unit] / sum.k.cost.bytes : 0;
        t->bound = t->t_launch >= t->t_roof ? HKV_KB_LAUNCH : tc > t->t_mem ? HKV_KB_COMPUTE : HKV_KB_MEMORY;
        sum.k.shape.nq = p->n_ctx;   /* the whole prompt ... */
        sum.k.shape.p0 = 0;
        sum.k.shape.n = chunk;       /* ... in chunks of this many queries */
        sum.what = "prefill attention, one prompt of n_ctx (chunks of max_rows)";
        sum.phase = "prompt";
        sum.calls = L;
        if (rs.n >= rs.cap) return hkv_seterr(err, HKV_E_RANGE, "kernel predict: more than %d rows", cap);
        rs.r[rs.n++] = sum;
    }
    if (!rc && is_ct) {   /* ctkvr: the prompt's index, every layer, once a sequence */
        hkv_prediction o;
        if ((rc = hkv_predict(p, &o, err))) return rc;
        if (o.far_rows > o.rho) {   /* else every far row is in every list: no scores */
            /* the workspace pipeline/cuda_index.c gives the build without a cap */
            s = (hkv_kshape){.kind = HKV_KN_CTKVR_BUILD, .H = H, .KH = KH, .d = d, .C = o.C,
                             .rho = o.rho, .far = o.far_rows, .ws_bytes = (int64_t)256 << 20};
            rc = add(&rs, "ctkvr index build, one prompt", "prompt", L, &s, err);
        }
    }
    *n = rs.n;
    return rc;
}
