/* Synthetic-weight models of real shapes, for benchmarks and plans without
 * downloads: a table of shapes (llama3-8b, llama3.1-8b, yi-9b, qwen2.5-7b,
 * smollm2-135m) and an in-memory hkv_model with deterministic random weights.
 *
 * Weights: every matrix entry ~ uniform with mean 0 and standard deviation
 * 1/sqrt(fan_in) (quantised as the chosen format holds it), norms 1, biases
 * N(0, 0.02^2)-like small: each block's output then has O(1) variance, so the
 * residual stream grows about linearly with depth and logits stay finite.
 * There is no tokenizer: such a model is fed token ids (hetkv bench), and
 * hetkv run refuses it (its text would be noise). */
#ifndef HKV_SYNTHETIC_H
#define HKV_SYNTHETIC_H

#include <stdint.h>

#include "model.h"
#include "status.h"

/* Fill cfg with the named shape; HKV_E_NOTFOUND naming the known shapes.
 * "NAME@L" is the shape's first L layers (1 <= L <= its layer count). */
int hkv_synthetic_config(const char *name, hkv_model_config *cfg, hkv_err *err);

/* The known names, NULL-terminated. */
const char *const *hkv_synthetic_names(void);

/* "q4" (default), "q8", "f16", "f32" -> enum hkv_wtype; -1 if unknown. */
int hkv_synthetic_wtype_parse(const char *s);

/* Host bytes the built model holds in weight type wtype (what the builder
 * allocates; no allocation here). */
uint64_t hkv_synthetic_host_bytes(const hkv_model_config *cfg, int wtype);

/* Build the model with random weights of type wtype (enum hkv_wtype) from
 * seed: the same (name, wtype, seed) gives the same weights whatever the
 * thread count. Refuses, before allocating, a model larger than the free
 * host memory. Free with hkv_model_free. */
int hkv_synthetic_build(hkv_model *m, const char *name, int wtype, uint64_t seed, hkv_err *err);

#endif
