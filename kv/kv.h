/* The one interface between the model and the KV cache.
 *
 * The forward pass hands a KV backend, per layer, the whole batch's Q, K, V
 * rows (after RoPE) and gets back the attention output. The backend decides
 * where K and V live and which keys each query attends to: the plain
 * contiguous cache here, or the tiered near/far cache with a policy (full,
 * oracle, ctkvr, ...) from index/. The model code never changes. */
#ifndef HKV_KV_H
#define HKV_KV_H

#include <stdint.h>

#include "host_mem.h"
#include "kernels.h"
#include "kv_shape.h"
#include "status.h"

/* A run of n consecutive tokens of one sequence in a batch: positions
 * pos .. pos+n-1, batch rows row .. row+n-1. A prefill chunk is one segment
 * with many tokens; a decode step has one single-token segment per sequence. */
typedef struct hkv_seg {
    int32_t seq;
    int32_t n;
    int64_t pos;
    int64_t row;
    int32_t flags;      /* HKV_SEG_* */
    /* NULL: positions pos .. pos+n-1. Else row t is at position pos_list[t],
     * strictly ascending, pos == pos_list[0]: a prompt segment of selected
     * rows (token-selective propagation, runtime/tsp_prefill.c). The tiered
     * cache writes them at those positions and from then on treats the
     * layer's unwritten positions below the last one as absent; the plain
     * cache rejects such segments. */
    const int64_t *pos_list;
} hkv_seg;

/* Segment flags. A segment of a prompt is processed as prefill; the one that
 * completes the prompt lets policies build their index. A segment without
 * flags and n == 1 is a decode step. */
#define HKV_SEG_PROMPT 1
#define HKV_SEG_PROMPT_END 2
/* Far-only steps (layer_step_far) of a prompt segment whose attention the
 * caller computes itself (the device, over its own copy of the prompt's
 * K/V): K/V are stored as usual, the rows get the empty partial (out 0,
 * lse -inf). */
#define HKV_SEG_STORE_ONLY 4

/* The parts of the decode rows' selection done elsewhere (the device,
 * pipeline/) for one far-only layer step; for batch row r and KV head h,
 * at = r * n_head_kv + h:
 *   recall   (n may be NULL): n[at] entries at slot + at*ld and score +
 *            at*ld (n[at] < 0: none, the sequence's policy recalls on the
 *            host). What they are is the policy's business (index/policy.h,
 *            hkv_recalled);
 *   far_from (may be NULL): far_from[at] >= 0: the caller attends the
 *            policy's kept set (policy.h, hkv_kept_set) itself and the host
 *            attends the far positions [far_from[at], hi) only, the rest of
 *            what select would return; < 0: select as usual;
 *   sel      (sel_n may be NULL): sel_n[at] >= 0: the caller selected, as
 *            the policy's select would (policy.h, hkv_page_table), the
 *            far positions sel + at*sel_ld, sel_n[at] of them: the host
 *            attends those. */
typedef struct hkv_recall_rows {
    const int32_t *slot;
    const float *score;
    const int32_t *n;
    int64_t ld;
    const int64_t *far_from;
    const int32_t *sel;
    const int32_t *sel_n;
    int64_t sel_ld;
} hkv_recall_rows;

/* seq_share's flags. */
#define HKV_SHARE_INDEX 1u

struct hkv_kv_far_ops;

typedef struct hkv_kv_ops {
    const char *name;
    /* Make room for sequence `seq` (0 <= seq < max_seqs) of up to n_ctx
     * tokens. Fails with HKV_E_CAPACITY / HKV_E_NOMEM before anything else is
     * touched when it will not fit. */
    int (*seq_open)(void *self, int seq, int64_t n_ctx, hkv_err *err);
    void (*seq_close)(void *self, int seq);
    /* Copy the tokens stored for src into dst (open, with room): forks a
     * shared prompt (benchmarks, parallel sampling). dst shares no memory
     * with src; its policy's index is copied from src's where the policy
     * can (index/policy.h, fork: same policy and arguments, src's prompt
     * just ended), else built from the copied rows. */
    int (*seq_copy)(void *self, int dst, int src, hkv_err *err);
    /* dst (open, with room) holds src's first n tokens (n <= seq_len(src)),
     * with src's rows shared by reference rather than copied where the
     * cache can (kv_prefix.h: the whole pages below n): dst and src then
     * read the same memory for those positions, held once. With
     * HKV_SHARE_INDEX, where src's prompt ended at n (its length), dst is
     * as seq_copy leaves it: its policy starts from src's index, held by
     * reference where the policy can (index/policy.h, fork). Otherwise
     * dst's n tokens are a prompt not yet ended: its own prompt end builds
     * its index. Where the rows cannot be shared (the tiered cache's far
     * tier page-locked for a CUDA device, which reads it) they are copied,
     * with the same result. NULL for a cache that only copies (seq_copy). */
    int (*seq_share)(void *self, int dst, int src, int64_t n, unsigned flags, hkv_err *err);
    /* Tokens stored so far for seq. */
    int64_t (*seq_len)(void *self, int seq);
    /* Drop every token of seq at positions >= n (n <= seq_len): the next
     * segment starts at n. Lookahead (runtime/lookahead.c) decodes a few
     * tokens to learn from their queries, then rewinds to the prompt end. */
    int (*seq_rewind)(void *self, int seq, int64_t n, hkv_err *err);
    /* One layer for the whole batch: qkv rows hold [Q (n_head·d) | K | V
     * (n_head_kv·d each)] with stride ld_qkv floats; K and V are appended at
     * the segments' positions, then each query row attends causally; out rows
     * ([n_head·d], stride ld_out) receive the attention output. */
    int (*layer_step)(void *self, int layer, const hkv_seg *segs, int n_segs,
                      const float *qkv, int64_t ld_qkv, float *out, int64_t ld_out,
                      hkv_err *err);
    /* As layer_step, for a caller that attends the near tier itself (the
     * device, pipeline/): decode rows get only the far partial, prompt rows
     * the whole attention as layer_step gives it; every row's log-sum-exp
     * goes to lse[row * n_head + head] (-inf: no key, out 0), so the caller's
     * near partial merges exactly. rec (may be NULL): the device's recall
     * for decode rows whose policy has a device part. NULL for a cache
     * without a near tier. */
    int (*layer_step_far)(void *self, int layer, const hkv_seg *segs, int n_segs,
                          const float *qkv, int64_t ld_qkv, float *out, int64_t ld_out,
                          float *lse, const hkv_recall_rows *rec, hkv_err *err);
    void (*destroy)(void *self);
    /* The far tier and its policies (kv_far.h) for the device pipeline and
     * the scheduler; NULL for a cache without one. */
    const struct hkv_kv_far_ops *far;
} hkv_kv_ops;

typedef struct hkv_kv {
    const hkv_kv_ops *ops;
    void *self;
} hkv_kv;

/* The plain cache: per sequence and layer, contiguous fp16 K[kv_head][n_ctx][d]
 * and V likewise, dense attention over everything. */
int hkv_kv_plain_create(hkv_kv *kv, const hkv_kv_shape *shape, int max_seqs,
                        const hkv_cpu_kernels *kern, hkv_mem_account *mem, hkv_err *err);

#endif
