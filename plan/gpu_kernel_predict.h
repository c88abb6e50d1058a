/* A PREDICTION, per kernel, of what the gpu/ kernels move and compute and how long
 * it would take on a device of the data-sheet table (gpu_predict.h): a
 * roofline, not a measurement. No kernel here runs; each formula follows the
 * structure of the kernel it names (grid, tiles, what is read once and what
 * is re-read, which unit does the arithmetic), read off the .cu source.
 *
 *   bytes   read + written from device memory (DRAM). What a kernel re-reads
 *           from L2 (the GEMM path's dequantised panel, the prefill's K/V
 *           tiles shared by the blocks that walk them together, the decode
 *           partials) is reported beside it as l2_bytes, not charged.
 *   flops   per unit: tensor-core fp16 MMA (2 per multiply-add), fp32 FMA on
 *           the CUDA cores (2 per FMA), fp64 (RMSNorm's and the RoPE table's
 *           float64 parts), SFU (expf, exp2f, logf, reciprocal: one per call).
 *   time    max(bytes / achievable bandwidth, flops[u] / achievable rate[u]
 *           for every unit u), at least t_kernel per launch. The achievable
 *           figures are the data sheet's times hkv_predict_params'
 *           efficiencies (mem_eff, compute_eff), times a parallelism share
 *           when the grid is too small to occupy the device (see
 *           hkv_kernel_time).
 *
 * Every figure is a model's estimate and must be shown as a PREDICTION
 * (`hetkv plan --predict DEVICE --kernels`, docs/PREDICTIONS.md). */
#ifndef HKV_GPU_KERNEL_PREDICT_H
#define HKV_GPU_KERNEL_PREDICT_H

#include <stdint.h>

#include "gpu_predict.h"
#include "status.h"

/* The kernels of gpu/ that a decode step or a prompt runs on the device. */
enum hkv_kernel_kind {
    HKV_KN_GEMV = 0,        /* k_qm_gemv_{q4,q8,f16,f32} (qmat.cu), n <= 8 rows */
    HKV_KN_PANEL_GEMM,      /* n > 8: k_qm_dequant per 32 MiB row panel + cuBLAS fp32 GEMM */
    HKV_KN_TC_GEMM,         /* NOT BUILT (the target): one dequantising tensor-core product */
    HKV_KN_ATTN_DECODE,     /* k_attn_decode<VEC> + k_attn_combine when split (attn_decode.cu) */
    HKV_KN_ATTN_MERGE,      /* k_attn_merge: near + far (out, lse) */
    HKV_KN_ATTN_PREFILL,    /* k_attn_prefill_d{64,128,256} (attn_prefill.cu), one chunk */
    HKV_KN_RMSNORM,         /* k_rmsnorm (model_kernels.cu) */
    HKV_KN_ROPE_TABLE,      /* k_rope_table: cos/sin per (row, pair), float64, once a step */
    HKV_KN_ROPE,            /* k_rope: Q and K heads of the QKV rows */
    HKV_KN_SWIGLU,          /* k_swiglu */
    HKV_KN_ADD,             /* k_add: the residual */
    HKV_KN_ADD_RMSNORM,     /* k_add_rmsnorm: a residual add and the next norm in one pass */
    HKV_KN_KV_APPEND,       /* k_kv_append (rows.cu): fp32 K/V rows -> fp16 near tier */
    HKV_KN_COPY_ROWS,       /* k_copy_rows (rows.cu): gather/scatter of fp32 rows */
    HKV_KN_PARTIAL_CLEAR,   /* k_partial_clear (rows.cu): (0, -inf) partials */
    HKV_KN_RECALL_TOP,      /* k_recall_top (recall_top.cu): the built ctkvr recall */
    HKV_KN_CTKVR_RECALL,    /* k_ctkvr_recall (ctkvr_recall.cu): recall + lists -> candidates */
    HKV_KN_WINDOW_SCORES,   /* k_ws_stats + k_ws_lse + k_ws_acc (window_scores.cu) */
    HKV_KN_CTKVR_BUILD,     /* ctkvr's index at prompt end, one layer: k_build_cent, then per
                               (KV head, centroid block) k_build_scores_mma + k_build_select
                               (ctkvr_build.cu, ctkvr_scores_mma.cu) */
    HKV_KN_COUNT
};

/* Arithmetic units. */
enum { HKV_KU_TENSOR = 0, HKV_KU_FP32 = 1, HKV_KU_FP64 = 2, HKV_KU_SFU = 3, HKV_KU_COUNT = 4 };

/* What bounds a predicted time. */
enum { HKV_KB_MEMORY = 0, HKV_KB_COMPUTE = 1, HKV_KB_LAUNCH = 2 };

/* A kernel's shape. Fields a kind does not use are ignored. */
typedef struct hkv_kshape {
    int kind;             /* enum hkv_kernel_kind */
    int wtype;            /* products: enum hkv_wtype of W */
    int64_t rows, cols;   /* products: W is rows x cols (y = x W^T) */
    int64_t n;            /* activation rows: products, norms, rope, swiglu, add, append,
                             copies, merge; the recall's (row, KV head) rows are n x KH */
    int64_t width;        /* elements per row: rmsnorm/add (dim), swiglu (ffn), copy_rows */
    int H, KH, d;         /* heads, KV heads, head size: attention, rope, append, recall */
    int rot;              /* rope: rotated dims per head (0: d) */
    int n_seq;            /* decode attention: sequences */
    int64_t keys;         /* decode: rows attended per (sequence, KV head); window scores:
                             keys scored per KV head */
    int gather;           /* decode: rows through an index list (the near ring) */
    int n_split;          /* decode: key-range splits; 0: the kernels' own choice
                             (hkv_kernel_decode_splits at split_rows) */
    int64_t split_rows;   /* decode, n_split 0: the max_rows the caller passes (0: keys) */
    int64_t nq, p0;       /* prefill: queries of the chunk, keys before it */
    int64_t C, Cp, rho;   /* recall, build: centroids, recalled lists, list length */
    int64_t cand;         /* ctkvr recall: candidates written per (sequence, KV head) */
    int64_t far;          /* ctkvr recall: far-tier rows (bitmap words); build: keys ranked */
    int64_t window;       /* window scores: window rows (tokens) */
    int64_t ws_bytes;     /* ctkvr build: the score workspace (centroids a launch) */
} hkv_kshape;

/* What the kernel moves and computes, per call (all launches of the call). */
typedef struct hkv_kcost {
    const char *name;       /* the __global__ function(s), e.g. "k_qm_gemv_q4" */
    const char *file;       /* "gpu/qmat.cu" */
    int built;              /* 0: a target kernel that does not exist yet */
    double bytes_read, bytes_written;   /* DRAM */
    double bytes;           /* their sum */
    double l2_bytes;        /* re-read traffic assumed served by L2 (not charged) */
    double flops[HKV_KU_COUNT];   /* per unit (SFU: operations) */
    double useful_flops;    /* prefill: the FlashAttention papers' count (4 d per query x
                               visible key); else flops of the main unit */
    int unit;               /* the unit that does the main arithmetic */
    int64_t launches;       /* kernel launches of the call */
    int serial;             /* 1: the launches alternate a memory-bound and a compute-bound
                               kernel (dequantise a panel, then its GEMM), so the two
                               roofline terms add, each launch at least t_kernel */
    int64_t blocks;         /* blocks of the largest launch (the parallelism) */
    int n_split;            /* decode: splits used */
} hkv_kcost;

/* Efficiencies: hkv_predict_params' conventions (gpu_predict.h). */
typedef struct hkv_keff {
    double mem_eff;         /* of mem_gbs for streaming kernels (predict default 0.8) */
    double attn_eff;        /* of mem_gbs for decode attention; 0: mem_eff */
    double gemv_row_cost;   /* a GEMV of n rows takes 1 + this x (n - 1) times its roofline */
    double compute_eff;     /* of each unit's peak (predict default 0.7) */
    double t_kernel;        /* s: least time of one launch (predict default 4 us) */
    double sat_frac;        /* share of the SMs whose blocks saturate DRAM (default 0.25) */
} hkv_keff;

/* The time of one call on a device. */
typedef struct hkv_ktime {
    double bw;              /* achievable bytes/s for this grid */
    double rate[HKV_KU_COUNT];   /* achievable per unit */
    double t_mem, t_unit[HKV_KU_COUNT], t_roof, t_launch, t_s;
    double ai;              /* main-unit flops per DRAM byte */
    int bound;              /* HKV_KB_* */
    int bound_unit;         /* when compute-bound: which unit */
} hkv_ktime;

/* A kernel's shape, cost and time together. */
typedef struct hkv_kpred {
    hkv_kshape shape;
    hkv_kcost cost;
    hkv_ktime time;
} hkv_kpred;

/* The efficiencies of p (mem_eff, attn_eff, gemv_row_cost, compute_eff, t_kernel),
 * sat_frac 0.25. */
void hkv_keff_from_params(const hkv_predict_params *p, hkv_keff *e);

/* The split count gpu/attn_decode.cu's hkv_gpu_attn_decode_splits picks (the
 * same rule, restated in C so that a build without CUDA predicts it). */
int hkv_kernel_decode_splits(int sm_count, int n_seq, int n_head, int n_head_kv, int64_t max_rows);

/* Bytes and flops of one call of s on dev (the device matters for the split
 * count and for what L2 holds). Errors: a bad shape. */
int hkv_kernel_cost(const hkv_kshape *s, const hkv_device_spec *dev, hkv_kcost *c, hkv_err *err);

/* The roofline time of c on dev under e. */
int hkv_kernel_time(const hkv_kcost *c, const hkv_device_spec *dev, const hkv_keff *e,
                    hkv_ktime *t, hkv_err *err);

/* Both. */
int hkv_kernel_predict(const hkv_kshape *s, const hkv_device_spec *dev, const hkv_keff *e,
                       hkv_kpred *out, hkv_err *err);

/* "tensor fp16", "fp32", "fp64", "SFU"; "memory", "compute", "launch". */
const char *hkv_kernel_unit_name(int unit);
const char *hkv_kernel_bound_name(int bound);

/* One row of the per-kernel table of a configuration: a kernel as the step
 * (or the prompt) runs it, with how many calls it makes. */
typedef struct hkv_kstep_row {
    const char *what;       /* "QKV product", "near attention", ... */
    const char *phase;      /* "layer" (x n_layer per step), "step", "prompt" */
    int64_t calls;          /* per step (layer rows: n_layer) or per prompt */
    hkv_kpred k;            /* one call */
} hkv_kstep_row;

/* The device kernels of one decode step of p's configuration (policy full:
 * the whole KV attended; ctkvr: the near tier, the recall and the merge) in
 * the pipeline `mode` (HKV_PRED_BUILT: the products as built; TARGET: the
 * tensor-core product and the device-side ctkvr recall), then the causal
 * prefill attention of one n_ctx prompt in chunks of p->max_rows (0: 256).
 * Writes up to cap rows; *n gets the count. */
int hkv_kernel_step_rows(const hkv_predict_params *p, int mode, hkv_kstep_row *rows, int cap,
                         int *n, hkv_err *err);

#endif
