/* Where the forward pass runs: a small op table in the spirit of ggml's
 * backends. runtime/forward.c describes the Llama forward pass once, as a
 * sequence of these ops over named activation buffers; a backend owns the
 * buffers and the weights in its own memory and runs the ops there. The CPU
 * backend (backend_cpu.c) is the host kernels of cpu/; the CUDA backend
 * (pipeline/backend_cuda.c) keeps weights and activations on the device and
 * runs the attention step as the CPU-GPU co-execution pipeline.
 *
 * Ops are issued in order; a backend may run them asynchronously (a device
 * stream) as long as `read` returns the data every earlier op produced.
 * Errors: an op returns an HKV_E_* code with err filled; the forward pass
 * stops at the first. */
#ifndef HKV_BACKEND_H
#define HKV_BACKEND_H

#include <stdint.h>

#include "kv.h"
#include "status.h"

/* Activation buffers, each [max_rows][width]: */
enum hkv_act {
    HKV_ACT_X = 0,   /* hidden state, dim */
    HKV_ACT_XN,      /* normalised hidden state, dim */
    HKV_ACT_QKV,     /* Q | K | V, (n_head + 2 n_head_kv) head_dim */
    HKV_ACT_ATT,     /* attention output, n_head head_dim */
    HKV_ACT_GU,      /* gate | up, 2 ffn */
    HKV_ACT_G,       /* silu(gate) * up, ffn (may share GU's memory) */
    HKV_ACT_TMP,     /* a product's output: rows as wide as the matrix (dim, or vocab) */
    HKV_ACT_COUNT
};

/* Weights by role within a layer (the norms and the output head have no layer). */
enum hkv_wrole {
    HKV_WR_ATTN_NORM = 0,
    HKV_WR_FFN_NORM,
    HKV_WR_OUT_NORM,
    HKV_WR_QKV,       /* [(n_head + 2 n_head_kv) head_dim][dim] */
    HKV_WR_WO,        /* [dim][n_head head_dim] */
    HKV_WR_FFN_IN,    /* gate | up [2 ffn][dim] */
    HKV_WR_DOWN,      /* [dim][ffn] */
    HKV_WR_OUTPUT,    /* [vocab][dim] */
};

typedef struct hkv_backend_ops {
    const char *name;
    /* X[r] = embedding of tokens[r], r < n (ids already validated). */
    int (*embed)(void *self, const int32_t *tokens, int64_t n, hkv_err *err);
    /* dst[i] = src[rows ? rows[i] : i] / rms * w, i < n; w the norm of `role`
     * (and `layer` for the layer norms). */
    int (*rmsnorm)(void *self, int dst, int src, const int64_t *rows, int64_t n, int layer,
                   int role, hkv_err *err);
    /* dst[i] = src[i] W^T for the matrix of (layer, role), i < n. */
    int (*matmul)(void *self, int dst, int src, int64_t n, int layer, int role, hkv_err *err);
    /* QKV rows: add the layer's QKV bias (if any), then rotate Q and K heads
     * of row r at position pos[r]. */
    int (*bias_rope)(void *self, int layer, const int64_t *pos, int64_t n, hkv_err *err);
    /* G[r][j] = silu(GU[r][j]) * GU[r][ffn + j]. */
    int (*swiglu)(void *self, int64_t n, hkv_err *err);
    /* dst[r][:dim] += src[r][:dim] (the residual). */
    int (*add)(void *self, int dst, int src, int64_t n, hkv_err *err);
    /* Optional (NULL: the forward pass calls add, then rmsnorm): x += src as
     * add, then dst = rmsnorm(x) with the norm of (layer, role), the same
     * values, in one pass where the backend can fuse them (the device: one
     * launch instead of two, twice per layer). */
    int (*add_rmsnorm)(void *self, int dst, int x, int src, int64_t n, int layer, int role,
                       hkv_err *err);
    /* ATT = attention of the QKV rows through the KV cache for one layer
     * (hkv_kv_ops.layer_step's contract). */
    int (*attention)(void *self, int layer, const hkv_seg *segs, int n_segs, int64_t n,
                     hkv_err *err);
    /* Optional, all three or none (micro-batch ping-pong, runtime/forward.c):
     * row_base makes the layer ops (rmsnorm, matmul, bias_rope, swiglu, add,
     * add_rmsnorm) work on rows [r0, r0 + n) of every activation, their row
     * i being row r0 + i (pos[] and rows[] are the caller's for those rows);
     * attention_begin queues the device's part of micro-batch mb's (0 or 1)
     * attention over rows [r0, r0 + n), segments with their rows in the
     * batch, and attention_end runs the host's part and merges, so that the
     * other micro-batch's ops can run between them (the caller keeps segs
     * until the end). */
    int (*row_base)(void *self, int64_t r0, hkv_err *err);
    int (*attention_begin)(void *self, int mb, int layer, const hkv_seg *segs, int n_segs,
                           int64_t r0, int64_t n, hkv_err *err);
    int (*attention_end)(void *self, int mb, hkv_err *err);
    /* Optional (NULL: nothing is ever deferred): finish the host-side work of
     * earlier attention ops that the backend let run behind the device (the
     * CUDA backend's host steps of layers whose far tier had nothing to
     * attend), so that the KV cache is current. The forward pass calls it at
     * the end of every layer range, after an error too (err NULL then: the
     * backend cleans up and reports nothing). */
    int (*flush)(void *self, hkv_err *err);
    /* Optional (NULL: never): a decode step's embedding and layers as one
     * recorded graph. Called by hkv_forward before embed, with the step's
     * tokens, positions and segments (rows 0 .. n-1). *mode: 1 when the
     * backend ran the embedding and every layer itself (a graph recorded
     * for this batch shape, replayed), the caller then going on to flush;
     * 2 when the backend records the ops the caller now runs, plainly (no
     * micro-batches), to launch them at flush; 0 when it does neither.
     * After a recording, flush returns HKV_E_UNSUPPORTED when the device
     * refused to record it: nothing of the call ran, and the caller runs
     * it again op by op (the backend records no more). */
    int (*step_graph)(void *self, const int32_t *tokens, const int64_t *pos, const hkv_seg *segs,
                      int n_segs, int64_t n, int *mode, hkv_err *err);
    /* Rows [r0, r0+n) of act (cols wide) to or from host memory, after every
     * earlier op. */
    int (*read)(void *self, int act, int64_t r0, int64_t n, int64_t cols, float *dst, hkv_err *err);
    int (*write)(void *self, int act, int64_t r0, int64_t n, int64_t cols, const float *src,
                 hkv_err *err);
    void (*destroy)(void *self);
} hkv_backend_ops;

typedef struct hkv_backend {
    const hkv_backend_ops *ops;
    void *self;
} hkv_backend;

struct hkv_engine;
/* The host backend over the engine's own workspace and model. */
int hkv_backend_cpu_create(hkv_backend *be, struct hkv_engine *e, hkv_err *err);

#endif
