/* hkv_sample against the sampler it replaced, kept here as the reference:
 * the whole vocabulary sorted by probability (descending, ties by index),
 * cut at top-k and at the shortest prefix whose mass reaches top-p. The
 * ranking by a heap must pick the same token for the same seed, over peaked,
 * flat and tied distributions and every kind of truncation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"

typedef struct {
    hkv_sampler_params p;
    uint64_t rng;
    int n;
    float *prob;
    int32_t *idx;
} ref_sampler;

static float ref_rand01(uint64_t *st) {
    *st = *st * 6364136223846793005ULL + 1442695040888963407ULL;
    uint64_t x = *st;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (float)(x >> 40) / (float)(1ULL << 24);
}

static int ref_by_prob_desc(const void *a, const void *b, void *prob) {
    const float *pr = prob;
    float x = pr[*(const int32_t *)a], y = pr[*(const int32_t *)b];
    if (x != y) return x < y ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

static int32_t ref_sample(ref_sampler *s, const float *logits) {
    const int n = s->n;
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
        qsort_r(s->idx, (size_t)n, sizeof *s->idx, ref_by_prob_desc, s->prob);
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
    double r = ref_rand01(&s->rng) * tot, acc = 0;
    for (int i = 0; i < m; i++) {
        acc += s->prob[s->idx[i]];
        if (r < acc) return s->idx[i];
    }
    return s->idx[m - 1];
}

static uint64_t st = 0x9e3779b97f4a7c15ULL;
static double unif(void) {
    st ^= st << 13;
    st ^= st >> 7;
    st ^= st << 17;
    return (double)(st >> 11) / 9007199254740992.0;
}

/* kind 0: peaked (a few large logits), 1: flat, 2: many ties (logits on a
 * coarse grid), 3: one token far ahead */
static void make_logits(float *x, int n, int kind) {
    for (int i = 0; i < n; i++) {
        double u = unif();
        switch (kind) {
        case 0: x[i] = (float)(8 * pow(u, 40) + unif()); break;
        case 1: x[i] = (float)(0.05 * u); break;
        case 2: x[i] = (float)floor(4 * u); break;
        default: x[i] = (float)u; break;
        }
    }
    if (kind == 3) x[n / 2] = 50;
}

int main(void) {
    const int ns[] = {1, 7, 1000, 49152};
    const int ks[] = {0, 1, 2, 40, 100, 1000000};
    const float ps[] = {1.0f, 0.95f, 0.5f, 0.999999f, 1e-6f};
    const float temps[] = {0.7f, 1.5f};
    int cases = 0, fails = 0;
    for (unsigned a = 0; a < sizeof ns / sizeof *ns; a++) {
        const int n = ns[a];
        float *logits = malloc((size_t)n * sizeof *logits);
        ref_sampler r = {.n = n, .prob = malloc((size_t)n * sizeof(float)),
                         .idx = malloc((size_t)n * sizeof(int32_t))};
        for (int kind = 0; kind < 4; kind++)
            for (unsigned b = 0; b < sizeof ks / sizeof *ks; b++)
                for (unsigned c = 0; c < sizeof ps / sizeof *ps; c++)
                    for (unsigned d = 0; d < sizeof temps / sizeof *temps; d++) {
                        hkv_sampler_params p = {temps[d], ks[b], ps[c], 1234 + 7 * b + c};
                        hkv_sampler s;
                        hkv_err err = {0};
                        if (hkv_sampler_init(&s, &p, n, &err) != HKV_OK) {
                            printf("FAIL init n %d: %s\n", n, err.msg);
                            return 1;
                        }
                        r.p = p;
                        r.rng = p.seed * 6364136223846793005ULL + 1442695040888963407ULL;
                        for (int t = 0; t < (n > 1000 ? 4 : 16); t++) {
                            make_logits(logits, n, kind);
                            int32_t got = hkv_sample(&s, logits), want = ref_sample(&r, logits);
                            cases++;
                            if (got != want && fails++ < 10)
                                printf("FAIL n %d kind %d top_k %d top_p %g temp %g draw %d: %d, reference %d\n", n,
                                       kind, p.top_k, (double)p.top_p, (double)p.temp, t, got, want);
                        }
                        hkv_sampler_free(&s);
                    }
        free(logits);
        free(r.prob);
        free(r.idx);
    }
    printf("%d draws, %d differ from the full sort's\n", cases, fails);
    return fails ? 1 : 0;
}
