#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int hkv_sampler_init(hkv_sampler *s, const hkv_sampler_params *p, int n_vocab, hkv_err *err) {
    memset(s, 0, sizeof *s);
    if (!(p->temp >= 0) || p->temp > 100)
        return hkv_seterr(err, HKV_E_RANGE, "temperature %g is out of range (0..100)", (double)p->temp);
    if (p->top_k < 0) return hkv_seterr(err, HKV_E_RANGE, "top-k %d is negative", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return hkv_seterr(err, HKV_E_RANGE, "top-p %g is out of range (0, 1]", (double)p->top_p);
    if (n_vocab < 1) return hkv_seterr(err, HKV_E_INVAL, "empty vocabulary");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = p->seed * 6364136223846793005ULL + 1442695040888963407ULL;
    s->prob = malloc((size_t)n_vocab * sizeof(float));
    s->idx = malloc((size_t)n_vocab * sizeof(int32_t));
    if (!s->prob || !s->idx) {
        hkv_sampler_free(s);
        return hkv_seterr(err, HKV_E_NOMEM, "no memory for the sampler");
    }
    return HKV_OK;
}

void hkv_sampler_free(hkv_sampler *s) {
    free(s->prob);
    free(s->idx);
    s->prob = NULL;
    s->idx = NULL;
}

int32_t hkv_argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Uniform in [0, 1) from a 64-bit LCG with an xorshift output mix. */
static float rand01(uint64_t *st) {
    *st = *st * 6364136223846793005ULL + 1442695040888963407ULL;
    uint64_t x = *st;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (float)(x >> 40) / (float)(1ULL << 24);
}

static int by_prob_desc(const void *a, const void *b, void *prob) {
    const float *pr = prob;
    float x = pr[*(const int32_t *)a], y = pr[*(const int32_t *)b];
    if (x != y) return x < y ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

int32_t hkv_sample(hkv_sampler *s, const float *logits) {
    const int n = s->n_vocab;
    if (s->p.temp == 0 || s->p.top_k == 1) return hkv_argmax(logits, n);
    float mx = logits[hkv_argmax(logits, n)];
    double sum = 0;
    for (int i = 0; i < n; i++) {
        s->prob[i] = expf((logits[i] - mx) / s->p.temp);
        sum += s->prob[i];
    }
    for (int i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / sum);
    int m = n;
    for (int i = 0; i < n; i++) s->idx[i] = i;
    if (s->p.top_k > 0 || s->p.top_p < 1) {
        /* Candidates in descending probability; the sort is only paid for
         * when a truncation is asked for. */
        qsort_r(s->idx, (size_t)n, sizeof *s->idx, by_prob_desc, s->prob);
        if (s->p.top_k > 0 && s->p.top_k < m) m = s->p.top_k;
        if (s->p.top_p < 1) {
            double acc = 0;
            for (int i = 0; i < m; i++) {
                acc += s->prob[s->idx[i]];
                if (acc >= s->p.top_p) {
                    m = i + 1;
                    break;
                }
            }
        }
    }
    double tot = 0;
    for (int i = 0; i < m; i++) tot += s->prob[s->idx[i]];
    double r = rand01(&s->rng) * tot, acc = 0;
    for (int i = 0; i < m; i++) {
        acc += s->prob[s->idx[i]];
        if (r < acc) return s->idx[i];
    }
    return s->idx[m - 1];
}
