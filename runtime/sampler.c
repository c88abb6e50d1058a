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

/* a before b among the candidates: probability descending, then index
 * ascending (a strict total order, so the ranking is unique). */
static inline int ahead(const float *pr, int32_t a, int32_t b) {
    return pr[a] > pr[b] || (pr[a] == pr[b] && a < b);
}

/* Restore the heap below slot i: every slot behind its children (the root
 * the last of the kept candidates). */
static void sift_down(const float *pr, int32_t *h, int k, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, last = i;
        if (l < k && ahead(pr, h[last], h[l])) last = l;
        if (r < k && ahead(pr, h[last], h[r])) last = r;
        if (last == i) return;
        int32_t t = h[i];
        h[i] = h[last];
        h[last] = t;
        i = last;
    }
}

/* The first k of the n tokens in that order into idx[0..k), first to last:
 * a heap of the k best seen, each other token one comparison with the last
 * of them, then heapsort. The whole vocabulary sorted for each token (49152
 * for SmolLM2) took longer than the model's decode step. */
static void rank_candidates(const float *pr, int n, int k, int32_t *idx) {
    for (int i = 0; i < k; i++) idx[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(pr, idx, k, i);
    for (int i = k; i < n; i++)
        if (ahead(pr, i, idx[0])) {
            idx[0] = i;
            sift_down(pr, idx, k, 0);
        }
    for (int end = k - 1; end > 0; end--) {   /* the last kept goes to the end */
        int32_t t = idx[0];
        idx[0] = idx[end];
        idx[end] = t;
        sift_down(pr, idx, end, 0);
    }
}

/* The nucleus rarely holds more than a few dozen tokens: rank 64 first and
 * four times as many while their mass falls short of top_p. */
#define NUCLEUS_FIRST 64

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
    if (s->p.top_k > 0 || s->p.top_p < 1) {
        /* Candidates in descending probability, as many as the truncation
         * can keep: top-k's k, and for top-p the shortest prefix whose mass
         * reaches it (the same prefix a full sort would give). */
        const int k = s->p.top_k > 0 && s->p.top_k < n ? s->p.top_k : n;
        m = k;
        int ranked = s->p.top_p < 1 && k > NUCLEUS_FIRST ? NUCLEUS_FIRST : k;
        for (;;) {
            rank_candidates(s->prob, n, ranked, s->idx);
            if (s->p.top_p >= 1) break;
            double acc = 0;
            int cut = 0;
            for (int i = 0; i < ranked && !cut; i++) {
                acc += s->prob[s->idx[i]];
                if (acc >= s->p.top_p) cut = i + 1;
            }
            if (cut) {
                m = cut;
                break;
            }
            if (ranked == k) break;
            ranked = ranked <= k / 4 ? 4 * ranked : k;
        }
    } else {
        for (int i = 0; i < n; i++) s->idx[i] = i;
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
