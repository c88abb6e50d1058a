/* The GPU memory plan: pure arithmetic on shapes, so it runs (and is tested)
 * on machines without a GPU.
 *
 * Given a model shape, the weight dtype on the GPU, a batch, a context, the
 * near tier sizes and a KV policy, it says how many bytes each GPU tier needs
 * (weights, near KV, policy index, workspace), how many bytes of pinned host
 * memory hold the far tier, whether the total fits a cap, and the largest
 * batch that fits. The formulas follow the structures the host code
 * allocates (kv/kv_tiered.c, kv_tiered_tsp.c, index/ctkvr.c, quest.c,
 * snapkv.c, rocketkv.c, keepset.c (laq, speckv), fastkv.c; specpc runs
 * `full` over its compressed prompt) and docs/GPU_PLAN.md ("GPU memory
 * plan") writes them out.
 *
 * Eviction policies (snapkv, rocketkv, laq, speckv, fastkv) keep the K/V
 * rows of their kept set on the GPU beside the near tier: those rows are
 * what every decode step attends, so they count in `near`. The whole far
 * tier still sits in pinned host memory, as kv_tiered.c reserves it: the
 * prompt is written there before any selection, and laq's re-selection,
 * rocketkv mt=1 and later turns read it again. */
#ifndef HKV_GPU_PLAN_H
#define HKV_GPU_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "policy.h"
#include "status.h"

/* cuBLAS's recommended workspace on Hopper (32 MiB). */
#define HKV_PLAN_CUBLAS_WS ((uint64_t)32 << 20)

typedef struct hkv_plan_params {
    const hkv_model_config *cfg;
    uint64_t weight_bytes;          /* the weights as the device holds them (a Q4 model in its
                                       repacked format: hkv_predict_weight_bytes,
                                       hkv_model_repacked_bytes); 0: every matrix in fp16 */
    int batch;                      /* sequences decoded together (>= 1) */
    int64_t n_ctx;                  /* context per sequence */
    int L_init, L_local;            /* near tier: sinks + local ring */
    const hkv_policy_def *policy;   /* NULL: full */
    const hkv_policy_args *args;    /* NULL: the policy's defaults */
    int max_rows;                   /* rows per forward call (prefill chunk); 0: 256 */
    int index_on_host;              /* 1: the policy's large lists (ctkvr IVF, snapkv kept
                                       sets) live in pinned host memory; only what the GPU
                                       reads every step (centroids, page bounds) stays */
    uint64_t cublas_ws;             /* 0: HKV_PLAN_CUBLAS_WS */
    const hkv_model_config *draft;  /* speckv/specpc's draft shape; NULL: the target's own */
    int64_t n_gen;                  /* of n_ctx, tokens generated after the prompt (specpc
                                       keeps C prompt tokens + these); 0: none */
    int far_q8;                     /* the far tier in 8 bits (--far-kv q8) */
    int resident;                   /* of the batch, sequences whose whole far tier the device
                                       keeps too (pipeline/cuda_resident.c: `full` sequences
                                       placed whole under --policy auto, --gpu-resident) */
    int64_t resident_rows;          /* far rows each of them keeps (0: the whole far context) */
    int resident_prefixes;          /* shared prefixes kept once for them, a whole far
                                       context each */
    int64_t shared_rows;            /* first rows of the context every sequence of the batch
                                       shares by reference (kv/kv_prefix.h: bench
                                       --shared-prefix): their far tier held once */
    int full_split;                 /* 1: `full` with a near tier shorter than the context runs
                                       in the split, as the pipeline does (its far tier on the
                                       host, the host attending it); 0: full is dense */
} hkv_plan_params;

/* Bytes per tier. GPU tiers are totals for the whole batch; per_seq_* are
 * one sequence's share. */
typedef struct hkv_plan {
    uint64_t weights;     /* GPU: params' weight_bytes, or every matrix fp16, norms and
                             biases fp32 */
    uint64_t near;        /* GPU: sinks + local ring per (layer, KV head), plus an eviction
                             policy's kept rows; full and specpc: the whole (compressed) KV */
    uint64_t index;       /* GPU: policy index (centroids, IVF lists, FIFO, page bounds) */
    uint64_t workspace;   /* GPU: activations for max(max_rows, batch) rows, logits, cuBLAS;
                             fastkv: the prompt's hidden rows while it is cut (one prefill) */
    uint64_t draft;       /* GPU, once per batch: speckv/specpc's draft weights (fp16; none
                             when the target is its own draft), one sequence's draft KV
                             over the prompt, its activations */
    uint64_t shared_pinned;   /* of pinned, the shared rows' far tier (held once) */
    uint64_t resident;    /* GPU: the resident sequences' far rows (fp16 K and V for the
                             context past the near tier) and their attention partials */
    uint64_t gpu_total;
    uint64_t pinned;      /* host: far tier (K and V for the whole context), the
                             index lists when index_on_host, ctkvr's key sketches */
    uint64_t per_seq_near, per_seq_index, per_seq_pinned;
    uint64_t per_seq_kept; /* of per_seq_near: the kept set's K/V rows (eviction policies) */
    uint64_t kv_per_token; /* K+V bytes of one token over all layers (fp16) */
    uint64_t far_per_token; /* the same in the far tier's format (fp16, or 8-bit: 0.56x) */
    int kv_on_gpu;        /* 1 when the policy keeps the whole KV on the GPU (full) */
} hkv_plan;

/* Fill the plan; errors name a bad shape, a policy without a GPU formula,
 * or a parameter out of range. */
int hkv_plan_compute(const hkv_plan_params *p, hkv_plan *out, hkv_err *err);

/* HKV_OK when plan->gpu_total <= cap; else HKV_E_CAPACITY with
 * "batch B x context N with POLICY needs X (weights W, near N, index I,
 * workspace S) but the cap is C". */
int hkv_plan_admit(const hkv_plan_params *p, const hkv_plan *plan, uint64_t cap, hkv_err *err);

/* HKV_OK when plan->pinned (the far tiers, and the index lists kept on the
 * host) fits in avail bytes of host memory (avail 0: unknown, not checked;
 * capped: avail is the user's cap, not what the host has);
 * else HKV_E_CAPACITY naming what each sequence needs and what the host has.
 * Page-locked memory cannot be paged out: a far tier past the host's memory
 * fails partway through a prompt, so it is refused before anything loads. */
int hkv_plan_admit_host(const hkv_plan_params *p, const hkv_plan *plan, uint64_t avail,
                        int capped, hkv_err *err);

/* Largest batch in [0, max_batch] whose plan fits cap (0: not even one). */
int hkv_plan_max_batch(const hkv_plan_params *p, uint64_t cap, int max_batch, int *out,
                       hkv_err *err);

/* GPU-resident index bytes of one sequence of p->policy at p->n_ctx (with
 * p->L_init + p->L_local near rows), host-resident part in *host (host may
 * be NULL): the lists when p->index_on_host, and ctkvr's key sketches,
 * which only the host reads. The sum is what the policy (and, for
 * fastkv, the tiered cache's propagated-position lists) allocates in the
 * INDEX tier, less a few small bookkeeping structs. */
int hkv_plan_index_bytes(const hkv_plan_params *p, uint64_t *gpu, uint64_t *host, hkv_err *err);

/* Far tokens an eviction policy keeps per (layer, KV head) at p->n_ctx
 * (0 for the others): their K/V rows are GPU-resident. */
int64_t hkv_plan_kept_rows(const hkv_plan_params *p);
/* Where the pipeline keeps policy d's large lists (index_on_host): ctkvr's IVF
 * lists on the host, where its rerank reads them (pipeline/cuda_recall.c:
 * the device recalls the centroids only); every other index on the GPU. */
static inline int hkv_plan_pipeline_index_on_host(const hkv_policy_def *d) {
    return d == &hkv_policy_ctkvr;
}

/* The parameters the plan resolved for policy d at n_ctx, as text
 * ("ctkvr C=2048 rho=2480 rho'=992"). */
void hkv_plan_describe(const hkv_policy_def *d, const hkv_policy_args *a, int64_t n_ctx,
                       char *buf, size_t cap);

/* Weight bytes on the GPU with elem-byte matrices (fp16: 2). */
uint64_t hkv_plan_weight_bytes(const hkv_model_config *cfg, int elem_bytes);
/* Parameters of the model (matrices, embeddings, norms, biases). */
uint64_t hkv_plan_param_count(const hkv_model_config *cfg);

/* Sizes: "24G", "24GiB", "24GB", "500M", "1.5T", "4096" (bytes). Binary
 * units (K = 1024). Rejects garbage, negative, zero, and anything above
 * 1 PiB, naming `what` in the message. */
int hkv_parse_size(const char *what, const char *s, uint64_t *out, hkv_err *err);

#endif
