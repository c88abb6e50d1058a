/* A PREDICTION of decode speed on a GPU this machine may not have: arithmetic
 * on a model's shape, a device's data-sheet figures and the host's measured
 * read bandwidth. Nothing here runs on a GPU or measures one; every figure it
 * gives is a model's estimate and must be shown as a prediction
 * (`hetkv plan --predict DEVICE`, docs/PREDICTIONS.md).
 *
 * What it models is one decode step of the CPU-GPU pipeline (pipeline/,
 * docs/PIPELINE.md "The CPU-GPU pipeline"): per layer the device runs the
 * dense products on the weights in their repacked format, appends K/V to its
 * near-tier mirror and attends sinks + local window; QKV rows go down to the
 * host, the CPU selects and attends the far tier, the far (out, lse) comes up
 * and is merged on the device. Two pipelines are predicted:
 *
 *   built   the code as it is: the policy (ctkvr's centroid recall too) runs
 *           on the host; products are the dequantising GEMV for batches <= 8
 *           and, above 8, 32 MiB dequantised fp32 panels each followed by an
 *           fp32 cuBLAS GEMM (gpu/qmat.cu); within a layer only the device's
 *           near attention overlaps the CPU's far work, everything else is
 *           serial (the O projection needs the merged attention).
 *   target  what the design aims at: ctkvr's recall on the device (it reads
 *           the centroids and lists there and sends the candidate ids down),
 *           products memory-bound at any batch (tensor cores for the
 *           arithmetic), and two micro-batches in ping-pong so the device's
 *           dense work of one overlaps the CPU's far work of the other
 *           (weights then read once per micro-batch); the better of that and
 *           the serial order.
 *
 * The policy `full` is predicted as the dense baseline: the whole KV on the
 * device, no CPU part, no per-layer PCIe traffic. Only `full` and `ctkvr`
 * have formulas. Whether a configuration fits the device is the GPU memory
 * plan's verdict (plan/gpu_plan.h, hkv_plan_admit) with the weights in
 * the chosen repacked format instead of the plan's fp16. */
#ifndef HKV_GPU_PREDICT_H
#define HKV_GPU_PREDICT_H

#include <stddef.h>
#include <stdint.h>

#include "gpu_plan.h"
#include "model.h"
#include "policy.h"
#include "status.h"

/* One device from its vendor's data sheet. Rates are peaks; the
 * efficiencies in hkv_predict_params turn them into achievable figures. */
typedef struct hkv_device_spec {
    const char *name;          /* "rtx4090", "h100", "h200", "h100-pcie", "a100" */
    const char *label;         /* "NVIDIA GeForce RTX 4090 24 GB" */
    uint64_t mem_bytes;        /* device memory a process can use (nvidia-smi total) */
    double mem_gbs;            /* DRAM bandwidth, GB/s (1e9 B/s) */
    double pcie_gbs;           /* host link, theoretical GB/s each way */
    const char *pcie;          /* "PCIe 4.0 x16" */
    double tensor_tflops;      /* fp16 tensor cores, dense, fp32 accumulate */
    double fp32_tflops;        /* fp32 FMA on the CUDA cores (no tensor cores) */
    int sms;
    const char *source;        /* the data sheet: document name and URL */
    /* For the per-kernel roofline (gpu_kernel_predict.h); 0: not known, the
     * unit is then never a bound. */
    double fp64_tflops;        /* fp64 FMA on the CUDA cores (no tensor cores) */
    double sfu_tops;           /* SFU operations/s (exp2, rsqrt, sin ...), 1e12 */
    double l2_mib;             /* L2 cache, MiB */
} hkv_device_spec;

/* The table, n entries (immutable). */
const hkv_device_spec *hkv_device_specs(int *n);
/* The spec named `name`; NULL and HKV_E_NOTFOUND naming the known devices. */
const hkv_device_spec *hkv_device_spec_find(const char *name, hkv_err *err);

enum { HKV_PRED_BUILT = 0, HKV_PRED_TARGET = 1, HKV_PRED_MODES = 2 };

typedef struct hkv_predict_params {
    const hkv_model_config *cfg;
    const hkv_device_spec *dev;
    int wtype;                  /* enum hkv_wtype of the device weights (default Q4) */
    int batch;                  /* sequences decoded together, >= 1 */
    int64_t n_ctx;              /* context per sequence at the step */
    int64_t n_gen;              /* of n_ctx, tokens decoded since the prompt (ctkvr's
                                   unindexed tail: min(tail, n_gen) more candidates) */
    int L_init, L_local;        /* near tier */
    const hkv_policy_def *policy;   /* hkv_policy_full or hkv_policy_ctkvr */
    const hkv_policy_args *args;    /* NULL: the policy's defaults */
    int index_on_host;          /* plan placement of ctkvr's lists (centroids stay on
                                   the device either way); the predict default is 1 */
    uint64_t gpu_cap;           /* bytes the configuration must fit; 0: dev->mem_bytes */
    uint64_t host_cap;          /* pinned host bytes the far tier may use; 0: no check */
    int max_rows;               /* plan workspace rows; 0: 256 */
    double host_gbs;            /* host read bandwidth, GB/s (hkv_bandwidth_probe) */
    /* Assumptions (hkv_predict_defaults fills them; 0 means 0 here). */
    double mem_eff;             /* achievable fraction of mem_gbs for streaming reads */
    double attn_eff;            /* the same for the device's decode attention (0: mem_eff):
                                   the GPU runs measured it apart from the products' */
    double pcie_eff;            /* achievable fraction of pcie_gbs */
    double compute_eff;         /* achievable fraction of tensor_tflops / fp32_tflops */
    double host_eff_scan;       /* of host_gbs: centroid scoring and rerank (score_max) */
    double host_eff_attn;       /* of host_gbs: sparse attention over the selection */
    double cand_frac;           /* ctkvr: unique candidates / C' rho (list overlap; 1 = none) */
    double t_kernel;            /* s: least time of one kernel incl. its launch (no graphs) */
    double t_copy;              /* s: latency of one small PCIe copy */
    double t_host;              /* s: per layer, host wake on the event + OpenMP fork/join
                                   (counted in host_busy_s) */
    /* Terms the GPU runs measured that the data sheet does not give (0: none;
     * bench/predict_fit.py fits them to a run's rows, docs/PREDICTIONS.md): */
    double gemv_row_cost;       /* each row of a GEMV past the first adds this share of its
                                   one-row time (the built GEMV re-reads x per row pair) */
    double t_trip;              /* s: per layer of the split, the built round trip beyond
                                   the work the model prices (the device's recall latency,
                                   waits in which neither side works); built pipeline only */
    double host_core_s;         /* s: one core's far work of one (sequence, KV head) in a
                                   layer with its rows cached (bench far -t 1 --warm); with
                                   host_cores a ceiling: the host's far part takes at least
                                   items x host_core_s / host_cores however fast its memory
                                   (0: no ceiling, the bandwidth terms alone) */
    int host_cores;             /* cores the host's far part runs on (host_core_s > 0) */
    int pingpong;               /* built: --gpu-pingpong, two micro-batches from batch 2 */
    int far_q8;                 /* the far tier in 8 bits (--far-kv q8): the rerank's keys
                                   and the attended rows at d + d/8 bytes, not 2 d */
} hkv_predict_params;

/* Zero p, then set the defaults: Q4 weights, near 4 + 256, index on host,
 * mem_eff 0.8 (attn_eff 0: the same), pcie_eff 0.8, compute_eff 0.7, host_eff_scan 0.8,
 * host_eff_attn 0.55, cand_frac 1, t_kernel 4 us, t_copy 8 us, t_host 15 us; the
 * measured terms (gemv_row_cost, t_trip) and the host's compute ceiling
 * (host_core_s) 0. */
void hkv_predict_defaults(hkv_predict_params *p);

/* One pipeline's step. Bytes are per decode step for the whole batch. */
typedef struct hkv_predict_mode {
    double dev_weight_bytes;    /* weights read: layers, output head, embedding rows */
    double dev_kv_bytes;        /* K/V the device attends (near tier; full: the whole KV) */
    double dev_index_bytes;     /* ctkvr recall on the device (target): centroids + lists */
    double dev_act_bytes;       /* activations, partials, workspaces the kernels read and
                                   write (the per-kernel model, gpu_kernel_predict.h) */
    double dev_bytes;           /* sum of the four */
    double pcie_down_bytes;     /* QKV rows, candidate ids (target), logits */
    double pcie_up_bytes;       /* far (out, lse), token ids, positions, near slots */
    double host_index_bytes;    /* ctkvr recall on the host (built): centroids + lists */
    double host_rerank_bytes;   /* candidates' keys */
    double host_attn_bytes;     /* selected tokens' K and V */
    double host_bytes;          /* sum of the three */
    double dev_busy_s, host_busy_s, pcie_s;
    double dev_products_s;      /* of dev_busy_s, the weight products (the layers' and the head's):
                                   the timeline's dev_products_ms measures the same */
    double dev_attn_s;          /* of dev_busy_s, the device's decode attention (full: the whole
                                   KV; the split: sinks + window): the timeline's dev_near_ms */
    double step_s, tok_s;
    double dev_wait_frac;       /* of the step, the device idle waiting for the CPU or PCIe */
    double cpu_wait_frac;       /* of the step, the CPU idle waiting for the device (1: no
                                   CPU part) */
    double host_gbs_balance;    /* target: host GB/s at which the CPU's far work would take
                                   as long as the device's work of the layer (0: no CPU
                                   part, or built, where only the near attention overlaps) */
    int64_t kernels;            /* kernel launches per step */
    int pingpong;               /* two micro-batches: target where they beat the serial order,
                                   built when asked (hkv_predict_params.pingpong) */
} hkv_predict_mode;

typedef struct hkv_prediction {
    int has_host;               /* 0 for full */
    int64_t C, Cp, rho, rho_p;  /* ctkvr as resolved at n_ctx (hkv_plan_describe) */
    int64_t near_rows, far_rows;      /* per sequence */
    int64_t candidates, selected;     /* per (sequence, layer, KV head) */
    int rerank;                 /* 0 when the candidates fit rho' and need no rerank */
    int sketch;                 /* ctkvr's sketch=: the rerank reads key sketches, not far rows */
    uint64_t gpu_weights;       /* resident weight bytes on the device */
    hkv_plan plan;              /* the memory plan, weights replaced by gpu_weights */
    uint64_t cap;
    int fits;                   /* plan admitted under cap (and host_cap) */
    char refusal[sizeof(((hkv_err *)0)->msg)];
    hkv_predict_mode mode[HKV_PRED_MODES];
} hkv_prediction;

/* Predict one configuration. Errors: a bad shape or parameter, a policy
 * without a formula (names full and ctkvr), no device. A configuration that
 * does not fit is not an error: out->fits = 0 and out->refusal says why. */
int hkv_predict(const hkv_predict_params *p, hkv_prediction *out, hkv_err *err);

/* Device bytes of the model's weights in wtype (matrices repacked, norms and
 * biases fp32): what the CUDA backend uploads. */
uint64_t hkv_predict_weight_bytes(const hkv_model_config *cfg, int wtype);

/* "q4", "q8", "f16", "f32" of a wtype. */
const char *hkv_predict_wtype_name(int wtype);

#endif
