/* SpecPC's prompt compression by the draft model (index/specpc.c has the
 * policy entry and its parameters; notes Part B.3). */
#ifndef HKV_SPECPC_H
#define HKV_SPECPC_H

#include <stdint.h>

#include "engine.h"
#include "policy.h"

/* The draft (e->draft) prefills the prompt; the attention weights of its
 * last `window` queries over every prompt key, in layers >= skip_layers,
 * weighted by linspace(0, 1, window) along the window, max over heads,
 * queries and layers, give one score per token; hkv_specpc_select turns the
 * scores into kept positions. keep (room for n) receives the kept positions
 * ascending, *n_keep = min(C, n); a prompt of at most C tokens is kept whole
 * without running the draft. */
int hkv_specpc_compress(hkv_engine *e, const hkv_policy_def *def, const hkv_policy_args *a,
                        const int32_t *prompt, int64_t n, int32_t *keep, int64_t *n_keep,
                        hkv_err *err);

/* From scores r[n] (>= 0): max-pool smoothing with `kernel` (zero padding,
 * (k-1)/2 left, the rest right), the top C in rank order (score desc, then
 * position asc), each expanded by `neighbors` offsets -(nb-1)/2 .. nb-1-(nb-1)/2
 * taken by |offset| (clamped to the prompt), after the last `window`
 * positions (latest first); duplicates dropped, truncated to C, sorted ascending into keep
 * (room for C). Workspace from mem. Returns the count (< 0: HKV_E_NOMEM). */
int64_t hkv_specpc_select(const float *r, int64_t n, int64_t C, int64_t window, int kernel,
                          int neighbors, int32_t *keep, hkv_mem_account *mem, hkv_err *err);

#endif
