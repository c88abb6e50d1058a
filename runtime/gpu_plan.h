/* The GPU memory plan: pure arithmetic on shapes, so it runs (and is tested)
 * on machines without a GPU.
 *
 * Given a model shape, the weight dtype on the GPU, a batch, a context, the
 * near tier sizes and a KV policy, it says how many bytes each GPU tier needs
 * (weights, near KV, policy index, workspace), how many bytes of pinned host
 * memory hold the far tier, whether the total fits a cap, and the largest
 * batch that fits. The formulas follow the structures the host code
 * allocates (runtime/kv_tiered.c, index/ctkvr.c, quest.c, snapkv.c) and
 * docs/ARCHITECTURE.md ("GPU memory plan") writes them out. */
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
    int weight_elem_bytes;          /* GPU weight dtype: 2 (fp16, default when 0) */
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
} hkv_plan_params;

/* Bytes per tier. GPU tiers are totals for the whole batch; per_seq_* are
 * one sequence's share. */
typedef struct hkv_plan {
    uint64_t weights;     /* GPU: every matrix in the GPU dtype, norms and biases fp32 */
    uint64_t near;        /* GPU: sinks + local ring per (layer, KV head); full: the whole KV */
    uint64_t index;       /* GPU: policy index (centroids, IVF lists, FIFO, page bounds) */
    uint64_t workspace;   /* GPU: activations for max(max_rows, batch) rows, logits, cuBLAS */
    uint64_t gpu_total;
    uint64_t pinned;      /* host: far tier (K and V for the whole context), and the
                             index lists when index_on_host */
    uint64_t per_seq_near, per_seq_index, per_seq_pinned;
    uint64_t kv_per_token; /* K+V bytes of one token over all layers (fp16) */
    int kv_on_gpu;        /* 1 when the policy keeps the whole KV on the GPU (full) */
} hkv_plan;

/* Fill the plan; errors name a bad shape, a policy without a GPU formula,
 * or a parameter out of range. */
int hkv_plan_compute(const hkv_plan_params *p, hkv_plan *out, hkv_err *err);

/* HKV_OK when plan->gpu_total <= cap; else HKV_E_CAPACITY with
 * "batch B x context N with POLICY needs X (weights W, near N, index I,
 * workspace S) but the cap is C". */
int hkv_plan_admit(const hkv_plan_params *p, const hkv_plan *plan, uint64_t cap, hkv_err *err);

/* Largest batch in [0, max_batch] whose plan fits cap (0: not even one). */
int hkv_plan_max_batch(const hkv_plan_params *p, uint64_t cap, int max_batch, int *out,
                       hkv_err *err);

/* GPU-resident index bytes of one sequence of policy d at context n_ctx
 * (host-resident part in *host when index_on_host; may be NULL). */
int hkv_plan_index_bytes(const hkv_policy_def *d, const hkv_policy_args *a,
                         const hkv_model_config *cfg, int64_t n_ctx, int index_on_host,
                         uint64_t *gpu, uint64_t *host, hkv_err *err);

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
