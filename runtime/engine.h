/* The engine: one loaded model, its tokenizer, the kernel table, the KV
 * backend, pinned threads and the workspace of the forward pass. All state
 * lives here; nothing is global. */
#ifndef HKV_ENGINE_H
#define HKV_ENGINE_H

#include <stdint.h>

#include "backend.h"
#include "host_mem.h"
#include "kernels.h"
#include "kv.h"
#include "kv_tiered_params.h"
#include "model.h"
#include "status.h"
#include "threads.h"
#include "tokenizer.h"

typedef struct hkv_engine_params {
    const char *model_path;
    const char *synthetic;      /* instead of model_path: a synthetic-weight model of a real
                                   shape (model/synthetic.h); it has no tokenizer */
    int synthetic_wtype;        /* its weight type (enum hkv_wtype; default Q4) */
    uint64_t synthetic_seed;
    int n_threads;        /* 0: one per core */
    int isa;              /* enum hkv_isa, or -1 for the best this CPU has */
    int precision;        /* enum hkv_precision: EXACT (default, the reference) or FAST
                             (int8 activations where the CPU has VNNI; kern.precision says
                             what is in effect) */
    int max_seqs;         /* sequences that can be open at once (batch) */
    int64_t n_ctx;        /* per-sequence context; 0: the model's training context */
    int max_rows;         /* tokens per forward call (prefill chunk); 0: 256 */
    int kv_plain;         /* 1: the plain contiguous cache (reference); 0: tiered */
    hkv_tiered_params tiered;   /* near/far sizes and the policy */
    const char *draft_path;     /* a draft model (same tokenizer) for speckv/specpc, or NULL */
    int device_cuda;            /* --device cuda: the tiered cache's far rows are page-locked
                                   (pin_far) and bound to device 0's NUMA node when known */
} hkv_engine_params;

void hkv_engine_params_default(hkv_engine_params *p);

/* Wall-clock seconds spent per stage, accumulated over forward calls. */
typedef struct hkv_fwd_stats {
    double matmul, attn, other;
    int64_t rows;          /* batch rows processed */
    int64_t calls;
} hkv_fwd_stats;

/* Called by hkv_prefill after each chunk: done of n prompt tokens, seconds
 * since the prompt started (a CLI's progress line; NULL: nothing). Nonzero
 * stops the prefill there: hkv_prefill fails with HKV_E_CANCELLED (a CLI
 * taking SIGINT during a long prompt). */
typedef int (*hkv_progress_fn)(void *ud, int64_t done, int64_t n, double elapsed_s);

typedef struct hkv_engine {
    hkv_engine_params p;
    hkv_model model;
    hkv_tokenizer *tok;
    hkv_cpu_kernels kern;
    hkv_kv kv;
    hkv_backend be;        /* where the forward pass runs (runtime/backend.h): the CPU by
                              default; hkv_engine_set_backend installs another */
    hkv_mem_account mem;
    hkv_threads *threads;
    int64_t qkv_rows;      /* (n_head + 2 n_head_kv) head_dim */
    int max_rows;
    /* Workspace, [max_rows][...] each. */
    float *x, *xn, *qkv, *att, *h, *tmp, *mm_ws;
    size_t tmp_floats;    /* tmp's size: R rows of a layer product, or hkv_head_rows of logits */
    float *rope_cs;        /* [max_rows][rope_dim]: cos then sin per row (CPU backend) */
    int64_t *rope_pos;     /* [max_rows]: the positions rope_cs holds, rope_n of them */
    int64_t rope_n;
    int64_t *pos;          /* [max_rows]: each batch row's position in this forward call */
    size_t ws_bytes;
    hkv_fwd_stats stats;
    /* The draft engine (runtime/draft.c) when draft_path is set: plain
     * forward, one sequence, its own memory account. */
    struct hkv_engine *draft;
    hkv_progress_fn prefill_progress;   /* see hkv_progress_fn; set by the caller */
    void *prefill_progress_ud;
} hkv_engine;

/* Load the model and tokenizer, fill the kernel table, pin threads, create
 * the plain KV backend, allocate the workspace. */
/* "hetkv: warning: ..." on stderr when e->p.n_ctx is past the model's trained
 * context (hkv_engine_open calls it; so does a command that sets n_ctx after). */
void hkv_engine_ctx_warn(const hkv_engine *e);
int hkv_engine_open(hkv_engine **out, const hkv_engine_params *p, hkv_err *err);
void hkv_engine_close(hkv_engine *e);

/* Replace the KV backend (the engine destroys the old one and owns the new). */
void hkv_engine_set_kv(hkv_engine *e, hkv_kv kv);

/* Replace the backend (the engine destroys the old one and owns the new). */
void hkv_engine_set_backend(hkv_engine *e, hkv_backend be);

/* One forward pass over n_rows batch rows (n_rows <= max_rows) described by
 * segments. Logits of the rows listed in logit_rows go to
 * logits[n_logits][vocab]. */
int hkv_forward(hkv_engine *e, const int32_t *tokens, int64_t n_rows, const hkv_seg *segs,
                int n_segs, const int64_t *logit_rows, int n_logits, float *logits,
                hkv_err *err);

/* hkv_forward in stages, for drivers that run layers on a subset of the
 * rows (runtime/tsp_prefill.c): embed tokens into the hidden rows e->x
 * [n_rows][dim]; run layers [l0, l1) on e->x (segments as hkv_forward,
 * rows with a pos_list are roped at their listed positions); the output
 * head for rows of e->x. hkv_forward = embed, layers [0, n_layer), head. */
int hkv_forward_embed(hkv_engine *e, const int32_t *tokens, int64_t n_rows, hkv_err *err);
int hkv_forward_layers(hkv_engine *e, int l0, int l1, int64_t n_rows, const hkv_seg *segs,
                       int n_segs, hkv_err *err);
int hkv_forward_head(hkv_engine *e, const int64_t *logit_rows, int n_logits, float *logits,
                     hkv_err *err);
/* X += TMP (a residual), then XN = the norm of (layer, role) of X: one
 * backend op where the backend fuses them (runtime/forward.c). */
int hkv_forward_add_norm(const hkv_backend_ops *o, void *b, int64_t n, int layer, int role,
                         hkv_err *err);
/* Micro-batch ping-pong (runtime/forward_pingpong.c): 1 when the backend
 * offers it and the batch is decode rows only, two or more; then the layers
 * as two halves whose attention steps begin and end apart. */
int hkv_forward_pingpong_ok(const hkv_engine *e, int64_t n_rows, const hkv_seg *segs, int n_segs);
int hkv_forward_layers_pingpong(hkv_engine *e, int l0, int l1, int64_t n_rows, const hkv_seg *segs,
                                int n_segs, hkv_err *err);

/* Wall clock in seconds (monotonic). */
double hkv_now(void);

#endif
