/* Next-token sampling: greedy, temperature, top-k, top-p, seeded. */
#ifndef HKV_SAMPLER_H
#define HKV_SAMPLER_H

#include <stdint.h>

#include "status.h"

typedef struct hkv_sampler_params {
    float temp;       /* 0: greedy */
    int top_k;        /* 0: off */
    float top_p;      /* 1: off */
    uint64_t seed;
} hkv_sampler_params;

typedef struct hkv_sampler {
    hkv_sampler_params p;
    uint64_t rng;         /* PCG-style state; one sampler per sequence */
    int n_vocab;
    float *prob;          /* [n_vocab] */
    int32_t *idx;         /* [n_vocab] */
} hkv_sampler;

/* Rejects temp < 0, top_k < 0, top_p outside (0, 1]. */
int hkv_sampler_init(hkv_sampler *s, const hkv_sampler_params *p, int n_vocab, hkv_err *err);
void hkv_sampler_free(hkv_sampler *s);
/* Pick a token from logits[n_vocab] (logits are not modified). */
int32_t hkv_sample(hkv_sampler *s, const float *logits);
/* Index of the largest logit (lowest index on ties). */
int32_t hkv_argmax(const float *logits, int n);

#endif
