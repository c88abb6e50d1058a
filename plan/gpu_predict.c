/* A PREDICTION of decode speed on a GPU from data sheets (gpu_predict.h).
 * Every formula below follows what pipeline/cuda_attention.c,
 * pipeline/cuda_backend.c and gpu/qmat.cu do per decode step, or (target)
 * what docs/PIPELINE.md lists as not yet done; docs/PREDICTIONS.md
 * writes the model out and sets its output beside published figures. */
#include "far_rows.h"
#include "gpu_predict.h"
#include "qmat_panel.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gpu_kernel_predict.h"
#include "host_mem.h"
#include "kernels.h"

/* ---- devices ---------------------------------------------------------------- */

/* Memory totals are what nvidia-smi reports for the board; PCIe is the
 * theoretical rate of one direction of the x16 link (Gen4: 16 GT/s x 16
 * lanes x 128/130 / 8 = 31.5 GB/s; Gen5: 63.0 GB/s). */
/* The SFU rate is not on the data sheets: the CUDA C++ Programming Guide's
 * arithmetic-instruction throughput table gives 16 results per clock per SM
 * (exp2, log2, rsqrt, sin, cos) for compute capabilities 8.0 to 9.0, at the
 * boost clock the sheet's fp32 figure implies (fp32 / (SMs x FMA lanes x 2):
 * 2.52 GHz RTX 4090, 1.98 GHz H100 SXM, 1.75 GHz H100 PCIe, 1.41 GHz A100). */
#define SFU_SRC                                                                                   \
    "16 per SM per clock (CUDA C++ Programming Guide, Arithmetic Instructions throughput table, " \
    "https://docs.nvidia.com/cuda/cuda-c-programming-guide/#arithmetic-instructions) at the boost " \
    "clock the fp32 figure implies"

static const hkv_device_spec specs[] = {
    {"rtx4090", "NVIDIA GeForce RTX 4090 24 GB (GDDR6X)", 24564ULL << 20, 1008.0, 31.5,
     "PCIe 4.0 x16", 165.2, 82.6, 128,
     "NVIDIA Ada GPU Architecture whitepaper v2.1, Appendix A, GeForce RTX 4090 (1008 GB/s, "
     "165.2 TFLOPS fp16 tensor with fp32 accumulate dense, 82.6 TFLOPS fp32, 128 SMs): "
     "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf; "
     "fp64 1.29 TFLOPS and L2 72 MB: same appendix; SFU: " SFU_SRC,
     1.29, 5.16, 72.0},
    {"h100", "NVIDIA H100 SXM5 80 GB (HBM3)", 81559ULL << 20, 3350.0, 63.0, "PCIe 5.0 x16", 989.5,
     67.0, 132,
     "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM (3.35 TB/s, 1979 TFLOPS fp16 tensor with "
     "sparsity = 989.5 dense, 67 TFLOPS fp32, PCIe Gen5 128 GB/s both ways): "
     "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet; 132 SMs: "
     "NVIDIA H100 Tensor Core GPU Architecture whitepaper; fp64 34 TFLOPS: the datasheet; L2 "
     "50 MB: the whitepaper; SFU: " SFU_SRC,
     34.0, 4.18, 50.0},
    {"h200", "NVIDIA H200 SXM 141 GB (HBM3e)", 143771ULL << 20, 4800.0, 63.0, "PCIe 5.0 x16",
     989.5, 67.0, 132,
     "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM (141 GB, 4.8 TB/s, 1979 TFLOPS fp16 tensor "
     "with sparsity = 989.5 dense, 67 TFLOPS fp32, PCIe Gen5 128 GB/s both ways): "
     "https://www.nvidia.com/en-us/data-center/h200/; memory: the 143771 MiB nvidia-smi reports; "
     "132 SMs, fp64 34 TFLOPS and L2 50 MB: the H100 SXM's (the same GH100 chip); SFU: " SFU_SRC,
     34.0, 4.18, 50.0},
    {"h100-pcie", "NVIDIA H100 PCIe 80 GB (HBM2e)", 81559ULL << 20, 2000.0, 63.0, "PCIe 5.0 x16",
     756.5, 51.0, 114,
     "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe (2 TB/s, 1513 TFLOPS fp16 tensor with "
     "sparsity = 756.5 dense, 51 TFLOPS fp32, PCIe Gen5 128 GB/s both ways): "
     "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet; 114 SMs: "
     "NVIDIA H100 Tensor Core GPU Architecture whitepaper; fp64 26 TFLOPS: the datasheet; L2 "
     "50 MB: the whitepaper; SFU: " SFU_SRC,
     26.0, 3.19, 50.0},
    {"a100", "NVIDIA A100 SXM4 80 GB (HBM2e)", 81920ULL << 20, 2039.0, 31.5, "PCIe 4.0 x16", 312.0,
     19.5, 108,
     "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM (2039 GB/s, 312 TFLOPS fp16 tensor "
     "dense, 19.5 TFLOPS fp32, PCIe Gen4 64 GB/s both ways): "
     "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
     "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf; 108 SMs: NVIDIA A100 Tensor Core GPU "
     "Architecture whitepaper; fp64 9.7 TFLOPS: the datasheet; L2 40 MB: the whitepaper; SFU: "
     SFU_SRC,
     9.7, 2.44, 40.0},
};
#define N_SPECS ((int)(sizeof specs / sizeof specs[0]))

const hkv_device_spec *hkv_device_specs(int *n) {
    if (n) *n = N_SPECS;
    return specs;
}

const hkv_device_spec *hkv_device_spec_find(const char *name, hkv_err *err) {
    for (int i = 0; name && i < N_SPECS; i++)
        if (!strcmp(name, specs[i].name)) return &specs[i];
    char known[128] = "";
    for (int i = 0; i < N_SPECS; i++) {
        size_t l = strlen(known);
        snprintf(known + l, sizeof known - l, "%s%s", i ? ", " : "", specs[i].name);
    }
    hkv_seterr(err, HKV_E_NOTFOUND, "--predict: no data sheet for device '%s' (known: %s)",
               name ? name : "(none)", known);
    return NULL;
}

/* ---- parameters ------------------------------------------------------------- */

void hkv_predict_defaults(hkv_predict_params *p) {
    memset(p, 0, sizeof *p);
    p->wtype = HKV_W_Q4;
    p->L_init = 4;
    p->L_local = 256;
    p->index_on_host = 1;
    p->mem_eff = 0.8;          /* GEMV-type streaming reads of HBM/GDDR */
    p->pcie_eff = 0.8;         /* 25.2 of 31.5 GB/s (Gen4), 50.4 of 63 (Gen5) */
    p->compute_eff = 0.7;
    p->host_eff_scan = 0.8;    /* bench/RESULTS.md: score_max d=128 g=4 at 74-90% of the probe */
    p->host_eff_attn = 0.55;   /* bench/RESULTS.md: sparse attention d=128 g=4 at 52-61% */
    p->cand_frac = 1.0;
    p->t_kernel = 4e-6;
    p->t_copy = 8e-6;
    p->t_host = 15e-6;
}

const char *hkv_predict_wtype_name(int wtype) {
    switch (wtype) {
    case HKV_W_F32: return "f32";
    case HKV_W_F16: return "f16";
    case HKV_W_Q8: return "q8";
    case HKV_W_Q4: return "q4";
    default: return "?";
    }
}

static double mat_bytes(int wtype, int64_t rows, int64_t cols) {
    hkv_wmat w = {.type = wtype, .rows = rows, .cols = cols};
    return (double)hkv_wmat_bytes(&w);
}

uint64_t hkv_predict_weight_bytes(const hkv_model_config *c, int wtype) {
    const int64_t dim = c->dim, qkv = (int64_t)(c->n_head + 2 * c->n_head_kv) * c->head_dim;
    const int64_t qd = (int64_t)c->n_head * c->head_dim;
    double layer = mat_bytes(wtype, qkv, dim) + mat_bytes(wtype, dim, qd) +
                   mat_bytes(wtype, 2 * (int64_t)c->ffn, dim) + mat_bytes(wtype, dim, c->ffn);
    double emb = mat_bytes(wtype, c->vocab, dim) * (c->tied_output ? 1 : 2);
    double vecs = (double)c->n_layer * (2 * dim + (c->qkv_bias ? qkv : 0)) + dim;
    return (uint64_t)(emb + c->n_layer * layer + vecs * 4);
}

/* ---- the pieces of a step -------------------------------------------------- */

typedef struct ctx {
    const hkv_predict_params *p;
    double bw, pcie, fp32, tensor, hbw;   /* achievable bytes/s and flop/s */
    hkv_keff e;                           /* the same efficiencies, for the kernels */
} ctx;

/* One kernel call from the per-kernel model (gpu_kernel_predict.h): its time,
 * its launches added to *kern, and its DRAM bytes less `counted` (what the
 * caller books as weights, K/V or index bytes) added to *act. A shape the
 * model refuses cannot come from hkv_predict's checked inputs; it costs a
 * launch. */
static double kcall(const ctx *x, const hkv_kshape *s, double counted, double *act, int64_t *kern) {
    hkv_kpred k;
    hkv_err e;
    hkv_err_clear(&e);
    if (hkv_kernel_predict(s, x->p->dev, &x->e, &k, &e)) {
        *kern += 1;
        return x->p->t_kernel;
    }
    *kern += k.cost.launches;
    if (act) *act += fmax(0, k.cost.bytes - counted);
    return k.time.t_s;
}

/* A product y = x W^T over b rows, as built (gpu/qmat.cu): b <= 8 one GEMV
 * kernel reading each weight once (fp32 FMAs), b <= 32 one such GEMV per 8
 * rows (pipeline/cuda_backend.c); b > 32 row panels of 32 MiB of
 * fp32 (at least 128 rows) dequantised into the workspace, each followed by
 * an fp32 cuBLAS GEMM: two launches per panel, one after the other. A
 * panel that fits half the card's L2 is not counted against DRAM; a larger
 * one is written and read back there (gpu_kernel_predict.c, c_panel).
 * Per-kernel model: HKV_KN_GEMV, HKV_KN_PANEL_GEMM. */
static double prod_built(const ctx *x, int64_t rows, int64_t cols, int b, double *act, int64_t *kern) {
    const hkv_predict_params *p = x->p;
    const int gm = HKV_QMAT_GEMV_MAX_ROWS;
    if (b > gm && b <= HKV_QMAT_GEMV_CHUNKED_ROWS) {
        double t = 0;
        for (int r = 0; r < b; r += gm) t += prod_built(x, rows, cols, b - r < gm ? b - r : gm, act, kern);
        return t;
    }
    const hkv_kshape s = {.kind = b <= gm ? HKV_KN_GEMV : HKV_KN_PANEL_GEMM, .wtype = p->wtype,
                          .rows = rows, .cols = cols, .n = b};
    return kcall(x, &s, mat_bytes(p->wtype, rows, cols), act, kern);
}

/* Target: one memory-bound kernel at any batch, tensor cores for the FMAs
 * (HKV_KN_TC_GEMM, not built). */
static double prod_target(const ctx *x, int64_t rows, int64_t cols, int b, double *act, int64_t *kern) {
    const hkv_predict_params *p = x->p;
    const hkv_kshape s = {.kind = HKV_KN_TC_GEMM, .wtype = p->wtype, .rows = rows, .cols = cols, .n = b};
    return kcall(x, &s, mat_bytes(p->wtype, rows, cols), act, kern);
}

typedef double (*prod_fn)(const ctx *, int64_t, int64_t, int, double *, int64_t *);

/* One layer's four products (QKV, O, gate/up, down) over b rows. */
static double layer_dense(const ctx *x, prod_fn f, int b, double *act, int64_t *kern) {
    const hkv_model_config *c = x->p->cfg;
    const int64_t dim = c->dim, qkv = (int64_t)(c->n_head + 2 * c->n_head_kv) * c->head_dim;
    const int64_t qd = (int64_t)c->n_head * c->head_dim;
    return f(x, qkv, dim, b, act, kern) + f(x, dim, qd, b, act, kern) +
           f(x, 2 * (int64_t)c->ffn, dim, b, act, kern) + f(x, dim, c->ffn, b, act, kern);
}

/* One layer's small kernels over b rows (pipeline/cuda_backend.c,
 * cuda_attention.c): two residual adds each fused with a norm, RoPE, SwiGLU, the K/V
 * append (+ the QKV bias), and with a far tier the partials cleared and the
 * merge of near and far. The norms' weights are booked with the layer's. */
static double layer_small(const ctx *x, int b, int far, double *act, int64_t *kern) {
    const hkv_model_config *c = x->p->cfg;
    const int H = c->n_head, KH = c->n_head_kv, d = c->head_dim;
    const int64_t qkv = (int64_t)(H + 2 * KH) * d;
    double t = 0;
    /* each residual add fused with the norm after it (runtime/forward.c
     * add_norm; the first layer's lone norm and the last layer's lone add
     * counted as one more such pass) */
    hkv_kshape s = {.kind = HKV_KN_ADD_RMSNORM, .n = b, .width = c->dim};
    t += kcall(x, &s, (double)c->dim * 4, act, kern);   /* attention's norm */
    t += kcall(x, &s, (double)c->dim * 4, act, kern);   /* the FFN's */
    s = (hkv_kshape){.kind = HKV_KN_ROPE, .n = b, .H = H, .KH = KH, .d = d, .rot = c->rope_dim};
    t += kcall(x, &s, 0, act, kern);
    s = (hkv_kshape){.kind = HKV_KN_SWIGLU, .n = b, .width = c->ffn};
    t += kcall(x, &s, 0, act, kern);
    s = (hkv_kshape){.kind = HKV_KN_KV_APPEND, .n = b, .H = H, .KH = KH, .d = d};
    t += kcall(x, &s, 0, act, kern);
    if (c->qkv_bias) {   /* k_add_bias: an add of a row vector */
        s = (hkv_kshape){.kind = HKV_KN_ADD, .n = b, .width = qkv};
        t += kcall(x, &s, 0, act, kern);
    }
    if (far) {
        s = (hkv_kshape){.kind = HKV_KN_PARTIAL_CLEAR, .n = b, .H = H, .d = d};
        t += kcall(x, &s, 0, act, kern);
        s = (hkv_kshape){.kind = HKV_KN_ATTN_MERGE, .n = b, .H = H, .d = d};
        t += kcall(x, &s, 0, act, kern);
    }
    return t;
}

static double layer_weight_bytes(const hkv_predict_params *p) {
    const hkv_model_config *c = p->cfg;
    const int64_t dim = c->dim, qkv = (int64_t)(c->n_head + 2 * c->n_head_kv) * c->head_dim;
    const int64_t qd = (int64_t)c->n_head * c->head_dim;
    return mat_bytes(p->wtype, qkv, dim) + mat_bytes(p->wtype, dim, qd) +
           mat_bytes(p->wtype, 2 * (int64_t)c->ffn, dim) + mat_bytes(p->wtype, dim, c->ffn) +
           (2.0 * dim + (c->qkv_bias ? qkv : 0)) * 4;
}

/* Attention over `rows` K/V rows per (sequence, KV head) for b sequences
 * (cuda_attention.c near_attend): a decode batch's rows follow each other,
 * so hkv_gpu_attn_decode_split_q reads the queries in the QKV rows and
 * writes out and lse in place (+ its combine when the key range is split;
 * the gather and scatters are for rows apart, not modelled). The near tier
 * goes through its index list and is split as the pipeline asks (max_rows
 * = the near tier); full's whole KV is split for its length. *bytes gets
 * the K/V bytes (booked as KV); the rest goes to *act. */
static double attend(const ctx *x, int b, int64_t rows, int near, double *bytes, double *act,
                     int64_t *kern) {
    const hkv_predict_params *p = x->p;
    const hkv_model_config *c = p->cfg;
    const int H = c->n_head, KH = c->n_head_kv, d = c->head_dim;
    const int gy = (H / KH + 7) / 8;   /* query-head groups of 8 re-read K/V */
    *bytes = (double)b * KH * gy * rows * d * 2 * 2;
    hkv_kshape s = {.kind = HKV_KN_ATTN_DECODE, .n_seq = b, .H = H, .KH = KH, .d = d, .keys = rows,
                    .gather = near, .split_rows = near ? (int64_t)p->L_init + p->L_local : rows};
    return kcall(x, &s, *bytes, act, kern);
}

/* ctkvr's per-(sequence, layer, KV head) bytes. */
typedef struct ct_bytes {
    double cent, lists, ids, rerank, attn;
} ct_bytes;

static void ct_per_head(const hkv_predict_params *p, const hkv_prediction *o, ct_bytes *cb) {
    const hkv_model_config *c = p->cfg;
    const double g = (double)c->n_head / c->n_head_kv, d = c->head_dim;
    cb->cent = o->far_rows > 0 ? o->C * g * d * 2 : 0;       /* recall reads every centroid */
    cb->lists = o->far_rows > 0 ? (double)o->Cp * o->rho * 4 : 0;
    cb->ids = (double)o->candidates * 4;
    const double row = (double)hkv_far_row_bytes((int)d, p->far_q8);   /* fp16 or 8-bit */
    /* the rerank scores the keys' sketches where it has them (sketch=1 also
     * reads the exact keys of the band at its cut: not counted here) */
    const double scored = o->sketch ? (double)hkv_sketch_row_bytes(o->sketch, (int)d) : row;
    cb->rerank = o->rerank ? (double)o->candidates * scored : 0;   /* score_max(_i8, _i4) */
    cb->attn = (double)o->selected * row * 2;                    /* K and V */
}

/* ctkvr's recall on the device for b rows, one layer. built (pipeline/
 * cuda_recall.c): the rewritten centroid rows and FIFOs scattered (two
 * launches), k_recall_top scores every centroid and keeps C' slots; target:
 * the same two scatters and k_ctkvr_recall, which also ORs the C' lists and
 * writes the candidate ids. The centroids (and in the target the lists) are
 * booked as index bytes; the rest goes to *act. */
static double recall_dev(const ctx *x, const hkv_prediction *o, int b, int built, double *act,
                         int64_t *kern) {
    const hkv_model_config *c = x->p->cfg;
    const double items = (double)b * c->n_head_kv, g = (double)c->n_head / c->n_head_kv;
    const double cent = o->far_rows > 0 ? (double)o->C * g * c->head_dim * 2 : 0;
    const double lists = o->far_rows > 0 ? (double)o->Cp * o->rho * 4 : 0;
    *kern += 2;
    if (o->far_rows <= 0 || o->C < 1) {   /* nothing recalled: the kernel returns at once */
        *kern += 1;
        return 3 * x->p->t_kernel;
    }
    const hkv_kshape s = {.kind = built ? HKV_KN_RECALL_TOP : HKV_KN_CTKVR_RECALL, .n = b,
                          .H = c->n_head, .KH = c->n_head_kv, .d = c->head_dim, .C = o->C,
                          .Cp = o->Cp, .rho = o->rho, .cand = o->candidates, .far = o->far_rows};
    return 2 * x->p->t_kernel + kcall(x, &s, items * (cent + (built ? 0 : lists)), act, kern);
}

/* The far work of b sequences in one layer: seconds of the CPU at the probed
 * bandwidth times each kernel's measured share of it, or, where a core's
 * time was measured (host_core_s), at least what the host's cores take to
 * do the work with it cached: a host of few or slow cores beside fast memory
 * (a desktop's 8 cores on DDR5 with the 8-bit tier's decode and the 4-bit
 * sketches' arithmetic) is bound by its cores, not its bytes.
 * lists_on_host: the built pipeline (the device recalls the centroids, the
 * host reads the C' recalled lists); otherwise the host reads the candidate
 * ids the device made from the lists. */
static double host_far(const ctx *x, const ct_bytes *cb, int b, int lists_on_host, double *idx_b,
                       double *rr_b, double *at_b) {
    const hkv_predict_params *p = x->p;
    const double items = (double)b * p->cfg->n_head_kv;
    *idx_b = items * (lists_on_host ? cb->lists : cb->ids);
    *rr_b = items * cb->rerank;
    *at_b = items * cb->attn;
    const double mem = (*idx_b + *rr_b) / (x->hbw * p->host_eff_scan) + *at_b / (x->hbw * p->host_eff_attn);
    return p->host_core_s > 0 ? fmax(mem, items * p->host_core_s / p->host_cores) : mem;
}

/* Bytes host_far charges, in probe-equivalent bytes (for the balance figure). */
static double host_equiv(const hkv_predict_params *p, double idx, double rr, double at) {
    return (idx + rr) / p->host_eff_scan + at / p->host_eff_attn;
}

/* Per step outside the layers: the embedding (token ids staged, rows of the
 * table dequantised), positions staged for RoPE (cached for the later
 * layers), with a far tier the near-tier slots too, and the head (row list
 * staged, gather, RMSNorm, the output product, logits down one row per
 * copy, a sync). */
static double outside_layers(const ctx *x, prod_fn f, int b, int far, hkv_predict_mode *m,
                             double *dev, double *head_s) {
    const hkv_predict_params *p = x->p;
    const hkv_model_config *c = p->cfg;
    const double tk = p->t_kernel, tc = p->t_copy;
    const double emb_rows = mat_bytes(p->wtype, b, c->dim);
    const double logits = (double)b * c->vocab * 4;
    const double up = (double)b * (4 + 4 + 8 + (far ? 8 : 0));   /* ids, rows, pos, slots */
    const int n_up = far ? 4 : 3;
    int64_t k = 0;
    double head = f(x, c->vocab, c->dim, b, &m->dev_act_bytes, &k);
    m->kernels += k + 3;
    m->dev_weight_bytes += emb_rows + mat_bytes(p->wtype, c->vocab, c->dim) + (double)c->dim * 4;
    m->pcie_up_bytes += up;
    m->pcie_down_bytes += logits;
    *dev = fmax(tk, emb_rows / x->bw) + 2 * tk + head;
    *head_s = head;
    double copies = n_up * tc + up / x->pcie + b * tc + logits / x->pcie;
    m->pcie_s += copies;
    return *dev + copies + p->t_host;
}

/* ---- the prediction ---------------------------------------------------------- */

static int resolve_ctkvr(const hkv_predict_params *p, const hkv_policy_args *a, hkv_prediction *o,
                         hkv_err *err) {
    char d[160];
    long long C = 0, rho = 0, rho_p = 0;
    hkv_plan_describe(p->policy, a, p->n_ctx, d, sizeof d);
    if (sscanf(d, "ctkvr C=%lld rho=%lld rho'=%lld", &C, &rho, &rho_p) != 3)
        return hkv_seterr(err, HKV_E_INTERNAL, "predict: cannot read ctkvr's parameters from '%s'", d);
    o->C = C, o->rho = rho, o->rho_p = rho_p;
    o->Cp = (int64_t)hkv_policy_arg(p->policy, a, "Cp");
    o->sketch = (int)hkv_policy_arg(p->policy, a, "sketch");
    const int64_t tail = (int64_t)hkv_policy_arg(p->policy, a, "tail");
    const int dcu = (int)hkv_policy_arg(p->policy, a, "dcu");
    const int64_t F = o->far_rows;
    const int64_t spilled = p->n_gen < F ? p->n_gen : F;   /* decode spill: unindexed */
    const int64_t indexed = F - spilled;
    int64_t listed = (int64_t)llround(p->cand_frac * (double)o->Cp * o->rho);
    if (listed > indexed) listed = indexed;
    o->candidates = listed + (tail < spilled ? tail : spilled);
    o->rerank = !(o->candidates <= o->rho_p && (!dcu || o->candidates <= o->rho));
    o->selected = o->rerank ? (o->candidates < o->rho_p ? o->candidates : o->rho_p) : o->candidates;
    return HKV_OK;
}

/* A ping-pong layer's products and attention: each half's, summed. */
static void halves(const ctx *x, prod_fn f, int B, int64_t near, double *prod_l, double *att_l) {
    double act = 0, kvb = 0;
    int64_t kern = 0;
    const int b1 = (B + 1) / 2, b2 = B / 2;
    *prod_l = layer_dense(x, f, b1, &act, &kern) + layer_dense(x, f, b2, &act, &kern);
    *att_l = attend(x, b1, near, 1, &kvb, &act, &kern) + attend(x, b2, near, 1, &kvb, &act, &kern);
}

static void finish(hkv_predict_mode *m, int b, double host_equiv_bytes, double window) {
    m->dev_bytes = m->dev_weight_bytes + m->dev_kv_bytes + m->dev_index_bytes + m->dev_act_bytes;
    m->host_bytes = m->host_index_bytes + m->host_rerank_bytes + m->host_attn_bytes;
    m->tok_s = m->step_s > 0 ? b / m->step_s : 0;
    m->dev_wait_frac = m->step_s > 0 ? fmax(0, 1 - m->dev_busy_s / m->step_s) : 0;
    m->cpu_wait_frac = m->step_s > 0 ? fmax(0, 1 - m->host_busy_s / m->step_s) : 1;
    m->host_gbs_balance = host_equiv_bytes > 0 && window > 0 ? host_equiv_bytes / window / 1e9 : 0;
}

int hkv_predict(const hkv_predict_params *p, hkv_prediction *o, hkv_err *err) {
    memset(o, 0, sizeof *o);
    const hkv_model_config *c = p ? p->cfg : NULL;
    if (!p || !c || !p->dev)
        return hkv_seterr(err, HKV_E_INVAL, "predict: no model shape or no device spec");
    if (c->n_layer < 1 || c->dim < 1 || c->n_head < 1 || c->n_head_kv < 1 || c->head_dim < 1 ||
        c->ffn < 1 || c->vocab < 1 || c->n_head % c->n_head_kv)
        return hkv_seterr(err, HKV_E_INVAL, "predict: bad model shape (%d layers, %d/%d heads)",
                          c->n_layer, c->n_head, c->n_head_kv);
    if ((p->wtype == HKV_W_Q4 || p->wtype == HKV_W_Q8) && (c->dim % 32 || c->ffn % 32 ||
                                                          (c->n_head * c->head_dim) % 32))
        return hkv_seterr(err, HKV_E_INVAL, "predict: %s weights need input widths that are "
                          "multiples of 32", hkv_predict_wtype_name(p->wtype));
    if (p->wtype < HKV_W_F32 || p->wtype > HKV_W_Q4)
        return hkv_seterr(err, HKV_E_INVAL, "predict: unknown weight type %d", p->wtype);
    const hkv_policy_def *d = p->policy ? p->policy : &hkv_policy_full;
    const int is_ct = d == &hkv_policy_ctkvr;
    if (d != &hkv_policy_full && !is_ct)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "--predict: no speed model for policy '%s' "
                          "(models exist for full and ctkvr)", d->name);
    if (p->batch < 1 || p->n_ctx < 1 || p->L_init < 0 || p->L_local < 1 || p->n_gen < 0 ||
        p->n_gen >= p->n_ctx)
        return hkv_seterr(err, HKV_E_RANGE, "predict: batch %d, context %lld, near %d + %d or "
                          "%lld generated tokens out of range", p->batch, (long long)p->n_ctx,
                          p->L_init, p->L_local, (long long)p->n_gen);
    if (!(p->mem_eff > 0 && p->mem_eff <= 1) || !(p->pcie_eff > 0 && p->pcie_eff <= 1) ||
        !(p->attn_eff >= 0 && p->attn_eff <= 1) ||
        !(p->compute_eff > 0 && p->compute_eff <= 1) ||
        !(p->host_eff_scan > 0 && p->host_eff_scan <= 1) ||
        !(p->host_eff_attn > 0 && p->host_eff_attn <= 1) || !(p->cand_frac > 0 && p->cand_frac <= 1) ||
        p->t_kernel < 0 || p->t_copy < 0 || p->t_host < 0 || !(p->gemv_row_cost >= 0 &&
        p->gemv_row_cost <= 16) || !(p->t_trip >= 0 && p->t_trip <= 1))
        return hkv_seterr(err, HKV_E_RANGE, "predict: efficiencies must lie in (0, 1], latencies "
                          "be >= 0 (the round trip under 1 s) and the GEMV's row cost in [0, 16]");
    if (!(p->host_core_s >= 0 && p->host_core_s <= 1) || (p->host_core_s > 0 && p->host_cores < 1))
        return hkv_seterr(err, HKV_E_RANGE, "predict: a core's far work of %g s needs a host of "
                          "at least one core (got %d) and must lie in [0, 1 s]", p->host_core_s,
                          p->host_cores);
    if (is_ct && !(p->host_gbs > 0))
        return hkv_seterr(err, HKV_E_INVAL, "predict: ctkvr needs the host's read bandwidth "
                          "(measured by the probe or given with --host-gbs), got %g GB/s", p->host_gbs);
    hkv_policy_args dflt;
    const hkv_policy_args *a = p->args;
    if (!a) {
        hkv_policy_args_init(d, &dflt);
        a = &dflt;
    }
    const hkv_device_spec *dv = p->dev;
    ctx x = {.p = p,
                   .bw = dv->mem_gbs * 1e9 * p->mem_eff,
                   .pcie = dv->pcie_gbs * 1e9 * p->pcie_eff,
                   .fp32 = dv->fp32_tflops * 1e12 * p->compute_eff,
                   .tensor = dv->tensor_tflops * 1e12 * p->compute_eff,
                   .hbw = p->host_gbs * 1e9};
    hkv_keff_from_params(p, &x.e);
    const int B = p->batch, L = c->n_layer, KH = c->n_head_kv, H = c->n_head, hd = c->head_dim;
    const int64_t R0 = (int64_t)p->L_init + p->L_local;
    o->has_host = is_ct;
    o->near_rows = is_ct ? (p->n_ctx < R0 ? p->n_ctx : R0) : p->n_ctx;
    o->far_rows = is_ct ? p->n_ctx - o->near_rows : 0;
    int rc;
    if (is_ct && (rc = resolve_ctkvr(p, a, o, err))) return rc;

    /* Does it fit: the plan, with the weights in their repacked format. */
    hkv_plan_params pp = {.cfg = c, .batch = B, .n_ctx = p->n_ctx, .L_init = p->L_init,
                          .L_local = p->L_local, .policy = d, .args = a, .max_rows = p->max_rows,
                          .index_on_host = p->index_on_host, .n_gen = p->n_gen,
                          .far_q8 = p->far_q8, .weight_bytes = hkv_predict_weight_bytes(c, p->wtype)};
    if ((rc = hkv_plan_compute(&pp, &o->plan, err))) return rc;
    o->gpu_weights = o->plan.weights;
    o->cap = p->gpu_cap ? p->gpu_cap : dv->mem_bytes;
    hkv_err e2;
    hkv_err_clear(&e2);
    o->fits = hkv_plan_admit(&pp, &o->plan, o->cap, &e2) == HKV_OK;
    if (o->fits && p->host_cap && o->plan.pinned > p->host_cap) {
        char need[32], hc[32];
        hkv_fmt_bytes((double)o->plan.pinned, need, sizeof need);
        hkv_fmt_bytes((double)p->host_cap, hc, sizeof hc);
        hkv_seterr(&e2, HKV_E_CAPACITY, "batch %d x context %lld needs %s of pinned host memory "
                   "for the far tier but --host-mem is %s", B, (long long)p->n_ctx, need, hc);
        o->fits = 0;
    }
    if (!o->fits) snprintf(o->refusal, sizeof o->refusal, "%s", e2.msg);

    const double tc = p->t_copy;
    const double wl = layer_weight_bytes(p);
    const double qkv_down = (double)B * (H + 2 * KH) * hd * 4;
    const double far_up = (double)B * H * hd * 4 + (double)B * H * 4;
    ct_bytes cb = {0};
    if (is_ct) ct_per_head(p, o, &cb);

    for (int mi = 0; mi < HKV_PRED_MODES; mi++) {
        hkv_predict_mode *m = &o->mode[mi];
        const prod_fn f = mi == HKV_PRED_BUILT ? prod_built : prod_target;
        double out_dev = 0, head_s = 0;
        const double outside = outside_layers(&x, f, B, is_ct, m, &out_dev, &head_s);
        double kvb = 0, layer, dev_l, host_l = 0, equiv = 0, window = 0, act = 0;
        int64_t kern = 0;
        const double dense = layer_dense(&x, f, B, &act, &kern);
        const double att = attend(&x, B, o->near_rows, is_ct, &kvb, &act, &kern);
        double prod_l = dense, att_l = att;   /* per layer; two halves' in ping-pong */
        const double small = layer_small(&x, B, is_ct, &act, &kern);
        m->dev_weight_bytes += L * wl;
        m->dev_kv_bytes = L * kvb;
        if (!is_ct) {   /* the whole KV on the device: no CPU part, no per-layer PCIe */
            dev_l = dense + small + att;
            layer = dev_l;
        } else {
            /* Per layer: QKV down (1 copy), the far (out, lse) up (2 copies);
             * once per step the near-tier slots and positions go up. */
            double ib, rb, ab;
            double down = tc + qkv_down / x.pcie, up = 2 * tc + far_up / x.pcie;
            m->pcie_up_bytes += L * far_up;
            m->pcie_down_bytes += L * qkv_down;
            if (mi == HKV_PRED_BUILT) {
                /* pipeline/cuda_recall.c: the rewritten centroid rows and the
                 * FIFOs go up in one copy (two scatters), the recall reads
                 * every centroid, C' slots and cosines per (row, KV head)
                 * come down beside QKV; the host unions the lists, reranks
                 * and attends */
                const double items = (double)B * KH;
                const double g = (double)H / KH;
                const double rup = items * (g * hd * 2 + 8 + 8);
                const double slots_down = items * ((double)o->Cp * 8 + 4);
                const double recall = recall_dev(&x, o, B, 1, &act, &kern);
                m->dev_index_bytes = L * items * cb.cent;
                m->pcie_up_bytes += L * rup;
                m->pcie_down_bytes += L * slots_down;
                down += 3 * tc + slots_down / x.pcie;
                host_l = host_far(&x, &cb, B, 1, &ib, &rb, &ab);
                dev_l = dense + small + att + recall;
                layer = dense + small + tc + rup / x.pcie + recall + down +
                        fmax(att, p->t_host + host_l) + up + p->t_trip;
                window = 0;   /* only the near attention overlaps: no balance to speak of */
                m->pcie_s += L * (down + up + tc + rup / x.pcie);
                if (p->pingpong && B >= 2) {   /* runtime/forward_pingpong.c, as asked */
                    int64_t k2 = 0;
                    double kv1, i1, r1, a1, act2 = 0, dv[2], hv[2], cv[2];
                    for (int j = 0; j < 2; j++) {   /* each half: its device work, host part, trip */
                        const int bj = j ? B / 2 : (B + 1) / 2;
                        const double itj = (double)bj * KH;
                        dv[j] = layer_dense(&x, f, bj, &act2, &k2) + layer_small(&x, bj, 1, &act2, &k2) +
                                attend(&x, bj, o->near_rows, 1, &kv1, &act2, &k2) +
                                recall_dev(&x, o, bj, 1, &act2, &k2);
                        hv[j] = host_far(&x, &cb, bj, 1, &i1, &r1, &a1);
                        cv[j] = 5 * tc + ((double)bj * (H + 2 * KH) * hd * 4 + itj * ((double)o->Cp * 8 + 4) +
                                          itj * (g * hd * 2 + 16)) / x.pcie +
                                p->t_host + hv[j] + 2 * tc + (double)bj * (H * hd * 4 + H * 4) / x.pcie +
                                p->t_trip;
                    }
                    layer = fmax(fmax(dv[0] + dv[1], hv[0] + hv[1] + 2 * p->t_host),
                                 fmax(dv[0] + cv[0], dv[1] + cv[1]));
                    dev_l = dv[0] + dv[1];
                    kern = k2;
                    act = act2;
                    m->pingpong = 1;
                    halves(&x, f, B, o->near_rows, &prod_l, &att_l);
                    m->dev_weight_bytes += L * wl;   /* the second half reads them again */
                    m->pcie_s += L * 5 * tc;         /* each half's own copies */
                }
            } else {
                /* recall on the device: centroids and the C' lists read there,
                 * candidate ids written and sent down beside QKV */
                const double items = (double)B * KH;
                const double recall = recall_dev(&x, o, B, 0, &act, &kern);
                const double ids_down = items * cb.ids;
                m->dev_index_bytes = L * items * (cb.cent + cb.lists);
                m->pcie_down_bytes += L * ids_down;
                down += tc + ids_down / x.pcie;
                host_l = host_far(&x, &cb, B, 0, &ib, &rb, &ab);
                dev_l = dense + small + att + recall;
                const double serial = dense + small + recall + down + fmax(att, p->t_host + host_l) + up;
                layer = serial;
                window = dev_l;
                m->pcie_s += L * (down + up);
                if (B >= 2) {   /* two micro-batches: weights read once per half */
                    const int b1 = (B + 1) / 2, b2 = B / 2;
                    int64_t k2 = 0;
                    double kv1, kv2, i1, r1, a1, act2 = 0;
                    const double d1 = layer_dense(&x, f, b1, &act2, &k2) + layer_small(&x, b1, 1, &act2, &k2) +
                                      attend(&x, b1, o->near_rows, 1, &kv1, &act2, &k2) +
                                      recall_dev(&x, o, b1, 0, &act2, &k2);
                    const double d2 = layer_dense(&x, f, b2, &act2, &k2) + layer_small(&x, b2, 1, &act2, &k2) +
                                      attend(&x, b2, o->near_rows, 1, &kv2, &act2, &k2) +
                                      recall_dev(&x, o, b2, 0, &act2, &k2);
                    const double h1 = host_far(&x, &cb, b1, 0, &i1, &r1, &a1);
                    const double h2 = host_far(&x, &cb, b2, 0, &i1, &r1, &a1);
                    const double c1 = 2 * tc + (double)b1 * ((H + 2 * KH) * hd * 4 + KH * cb.ids) / x.pcie +
                                      p->t_host + h1 + 2 * tc + (double)b1 * (H * hd * 4 + H * 4) / x.pcie;
                    const double c2 = 2 * tc + (double)b2 * ((H + 2 * KH) * hd * 4 + KH * cb.ids) / x.pcie +
                                      p->t_host + h2 + 2 * tc + (double)b2 * (H * hd * 4 + H * 4) / x.pcie;
                    double pp_l = fmax(fmax(d1 + d2, h1 + h2 + 2 * p->t_host), fmax(d1 + c1, d2 + c2));
                    if (pp_l < serial) {
                        layer = pp_l;
                        dev_l = d1 + d2;
                        window = d1 + d2;
                        kern = k2;
                        act = act2;
                        m->pingpong = 1;
                        halves(&x, f, B, o->near_rows, &prod_l, &att_l);
                        m->dev_weight_bytes += L * wl;   /* the second half reads them again */
                        m->pcie_s += L * 4 * tc;         /* each half's own copies */
                    }
                }
            }
            m->host_index_bytes = L * ib;
            m->host_rerank_bytes = L * rb;
            m->host_attn_bytes = L * ab;
            equiv = host_equiv(p, ib, rb, ab);
        }
        m->kernels += L * kern;
        m->dev_act_bytes += L * act;
        m->dev_busy_s = L * dev_l + out_dev;
        m->dev_products_s = L * prod_l + head_s;
        m->dev_attn_s = L * att_l;
        m->host_busy_s = is_ct ? L * (host_l + (m->pingpong ? 2 : 1) * p->t_host) : 0;
        m->step_s = L * layer + outside;
        finish(m, B, equiv, window);
    }
    return HKV_OK;
}
