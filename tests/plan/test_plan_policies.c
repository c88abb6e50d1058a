/* The GPU plan of rocketkv, laq, speckv, specpc and fastkv: the index
 * formulas against what each policy really allocates in the INDEX tier
 * (rocketkv after its stage 1 ran on every layer; fastkv's propagated-position
 * lists after a real token-selective prefill on a synthetic model), the near
 * tier with the kept rows, specpc's dense compressed KV, the draft, and the
 * largest-batch search for every policy. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "generate.h"
#include "gpu_plan.h"
#include "kernels.h"
#include "policy.h"
#include "synthetic.h"

#include "../check.h"
#define EQ(a, b) CHECK((unsigned long long)(a) == (unsigned long long)(b), "%s = %llu, want %llu", \
                       #a, (unsigned long long)(a), (unsigned long long)(b))

static uint64_t rng = 88172645463325252ULL;
static float urand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2 - 1);
}

enum { LI = 4, LL = 16 };   /* the near tier of these checks */

/* Small per-instance structs (policy state, per-layer records) the formulas
 * leave out. */
static double slack_of(const hkv_model_config *c) {
    return 2048 + 512.0 * c->n_layer + 128.0 * c->n_layer * c->n_head_kv;
}

static void set_args(const hkv_policy_def *d, hkv_policy_args *a, const char *s1, const char *s2) {
    hkv_err err;
    hkv_policy_args_init(d, a);
    if (s1) CHECK(hkv_policy_arg_set(d, a, s1, &err) == HKV_OK, "%s: %s", s1, err.msg);
    if (s2) CHECK(hkv_policy_arg_set(d, a, s2, &err) == HKV_OK, "%s: %s", s2, err.msg);
}

/* Policies whose index exists from create(): laq, speckv, specpc, fastkv
 * (a prompt it does not cut). */
static void create_time(const hkv_cpu_kernels *kern, const hkv_model_config *c) {
    const hkv_policy_def *defs[] = {&hkv_policy_laq, &hkv_policy_speckv, &hkv_policy_specpc,
                                    &hkv_policy_fastkv};
    const int64_t ctxs[] = {100, 4096, 20000};
    const char *args[][2] = {{NULL, NULL}, {"budget=37", NULL}, {"budget=5000", NULL}};
    for (size_t di = 0; di < 4; di++)
        for (size_t ci = 0; ci < 3; ci++)
            for (size_t ai = 0; ai < 3; ai++) {
                const hkv_policy_def *d = defs[di];
                if (ai && d == &hkv_policy_specpc) continue;
                hkv_policy_args a;
                set_args(d, &a, args[ai][0], d == &hkv_policy_fastkv ? "tsp_len=16777216" : NULL);
                hkv_err err;
                hkv_mem_account mem = {0};
                hkv_policy_env env = {.shape = {c->n_layer, c->n_head, c->n_head_kv, c->head_dim},
                                      .n_ctx = ctxs[ci], .L_init = LI, .L_local = LL, .kern = kern,
                                      .mem = &mem, .n_threads = 1};
                hkv_policy pol = {0};
                CHECK(d->create(&pol, &a, &env, &err) == HKV_OK, "%s create: %s", d->name, err.msg);
                hkv_plan_params pp = {.cfg = c, .batch = 1, .n_ctx = ctxs[ci], .L_init = LI,
                                      .L_local = LL, .policy = d, .args = &a};
                uint64_t g = 0, h = 0, g2 = 0, h2 = 0;
                CHECK(hkv_plan_index_bytes(&pp, &g, &h, &err) == HKV_OK, "%s", err.msg);
                const double got = (double)mem.bytes[HKV_TIER_INDEX];
                CHECK(got >= (double)g && got <= (double)g + slack_of(c),
                      "%s ctx %lld args %zu: plan %llu bytes, allocated %.0f", d->name,
                      (long long)ctxs[ci], ai, (unsigned long long)g, got);
                EQ(h, 0);
                pp.index_on_host = 1;
                CHECK(hkv_plan_index_bytes(&pp, &g2, &h2, &err) == HKV_OK, "split");
                EQ(g2 + h2, g);
                if (d != &hkv_policy_specpc) CHECK(h2 > 0, "%s: the kept sets can move to the host", d->name);
                if (pol.ops) pol.ops->destroy(pol.self);
            }
}

/* ctkvr's key sketches (int8 and 4-bit) on the host beside its index: the
 * plan's host part against what create() allocates, with the lists on the
 * device (h: the sketches alone) and on the host (h: lists + sketches). */
static void ctkvr_sketches(const hkv_cpu_kernels *kern) {
    hkv_model_config c = {0};
    c.n_layer = 2, c.dim = 128, c.n_head = 4, c.n_head_kv = 2, c.head_dim = 64, c.ffn = 96, c.vocab = 50;
    const char *sk[] = {NULL, "sketch=1", "sketch=3"};
    uint64_t host[3] = {0};
    for (int si = 0; si < 3; si++) {
        hkv_policy_args a;
        set_args(&hkv_policy_ctkvr, &a, sk[si], NULL);
        hkv_err err;
        hkv_mem_account mem = {0};
        hkv_policy_env env = {.shape = {c.n_layer, c.n_head, c.n_head_kv, c.head_dim}, .n_ctx = 4096,
                              .L_init = LI, .L_local = LL, .kern = kern, .mem = &mem, .n_threads = 1};
        hkv_policy pol = {0};
        CHECK(hkv_policy_ctkvr.create(&pol, &a, &env, &err) == HKV_OK, "ctkvr %s: %s",
              sk[si] ? sk[si] : "", err.msg);
        hkv_plan_params pp = {.cfg = &c, .batch = 1, .n_ctx = 4096, .L_init = LI, .L_local = LL,
                              .policy = &hkv_policy_ctkvr, .args = &a};
        uint64_t g = 0, h = 0, g2 = 0, h2 = 0;
        CHECK(hkv_plan_index_bytes(&pp, &g, &h, &err) == HKV_OK, "%s", err.msg);
        const double got = (double)mem.bytes[HKV_TIER_INDEX];
        CHECK(got >= (double)(g + h) && got <= (double)(g + h) + slack_of(&c),
              "ctkvr %s: plan %llu + %llu bytes, allocated %.0f", sk[si] ? sk[si] : "",
              (unsigned long long)g, (unsigned long long)h, got);
        pp.index_on_host = 1;
        CHECK(hkv_plan_index_bytes(&pp, &g2, &h2, &err) == HKV_OK && g2 + h2 == g + h && h2 > h,
              "ctkvr %s: the lists move to the host, the sketches stay there", sk[si] ? sk[si] : "");
        host[si] = h;
        if (pol.ops) pol.ops->destroy(pol.self);
    }
    /* 2 layers x 2 KV heads x 4096 rows x (64 or 32 code bytes + 2 scales x 4) */
    EQ(host[0], 0);
    EQ(host[1], 2ULL * 2 * 4096 * (64 + 8));
    EQ(host[2], 2ULL * 2 * 4096 * (32 + 8));
}

/* rocketkv allocates its lists at stage 1: run prefill_end on every layer
 * over random keys and queries, then compare. */
static void rocketkv_stage1(const hkv_cpu_kernels *kern, const hkv_model_config *c) {
    const int64_t ctxs[] = {100, 4096, 20000};
    const char *args[][2] = {{NULL, NULL}, {"budget=64", NULL}, {"split=0.5", "budget=200"}, {"mt=1", NULL}};
    const int KH = c->n_head_kv, H = c->n_head, d = c->head_dim;
    for (size_t ci = 0; ci < 3; ci++) {
        const int64_t n = ctxs[ci];
        uint16_t *k = malloc((size_t)KH * n * d * 2), *v = malloc((size_t)KH * n * d * 2);
        uint16_t *q = malloc((size_t)128 * H * d * 2);
        float *tmp = malloc((size_t)n * d * sizeof(float));
        for (int h = 0; h < KH; h++) {
            for (int64_t i = 0; i < n * d; i++) tmp[i] = urand();
            kern->f32_to_f16(tmp, k + (size_t)h * n * d, n * d);
            kern->f32_to_f16(tmp, v + (size_t)h * n * d, n * d);
        }
        for (int64_t i = 0; i < (int64_t)128 * H * d; i++) tmp[i % (n * d)] = urand();
        kern->f32_to_f16(tmp, q, n * d < 128 * H * d ? n * d : 128 * H * d);
        const uint16_t *kp[8], *vp[8];
        for (int h = 0; h < KH; h++) kp[h] = k + (size_t)h * n * d, vp[h] = v + (size_t)h * n * d;
        for (size_t ai = 0; ai < 4; ai++) {
            hkv_policy_args a;
            set_args(&hkv_policy_rocketkv, &a, args[ai][0], args[ai][1]);
            hkv_err err;
            hkv_mem_account mem = {0};
            hkv_policy_env env = {.shape = {c->n_layer, H, KH, d}, .n_ctx = n, .L_init = LI,
                                  .L_local = LL, .kern = kern, .mem = &mem, .n_threads = 1};
            hkv_policy pol = {0};
            CHECK(hkv_policy_rocketkv.create(&pol, &a, &env, &err) == HKV_OK, "create: %s", err.msg);
            const int64_t w = hkv_policy_rocketkv.queries_wanted(&a, &env);
            hkv_far_view far = {.n_head_kv = KH, .head_dim = d, .lo = LI, .hi = n - LL, .k = kp,
                                .v = vp, .ld = d};
            hkv_query_view qv = {.n = w < n ? w : n, .q = q, .ld = (int64_t)H * d};
            qv.pos0 = n - qv.n;
            for (int l = 0; l < c->n_layer; l++)
                CHECK(pol.ops->prefill_end(pol.self, l, &far, &qv, &err) == HKV_OK, "stage 1: %s", err.msg);
            hkv_plan_params pp = {.cfg = c, .batch = 1, .n_ctx = n, .L_init = LI, .L_local = LL,
                                  .policy = &hkv_policy_rocketkv, .args = &a};
            uint64_t g = 0, h = 0, g2 = 0, h2 = 0;
            CHECK(hkv_plan_index_bytes(&pp, &g, &h, &err) == HKV_OK, "%s", err.msg);
            const double got = (double)mem.bytes[HKV_TIER_INDEX];
            CHECK(got >= (double)g && got <= (double)g + slack_of(c),
                  "rocketkv ctx %lld args %zu: plan %llu bytes, allocated %.0f", (long long)n, ai,
                  (unsigned long long)g, got);
            pp.index_on_host = 1;
            CHECK(hkv_plan_index_bytes(&pp, &g2, &h2, &err) == HKV_OK && g2 + h2 == g && h2 > 0,
                  "rocketkv split %llu + %llu vs %llu", (unsigned long long)g2,
                  (unsigned long long)h2, (unsigned long long)g);
            pol.ops->destroy(pol.self);
        }
        free(k), free(v), free(q), free(tmp);
    }
}

/* fastkv's propagated positions: a real token-selective prefill of a
 * synthetic smollm2-135m (30 layers, TSP layer 14) over 300 tokens cut to
 * 64: the policy's list and the cache's lists of the 15 later layers. */
static void fastkv_tsp(void) {
    const int64_t n = 300;
    hkv_engine_params ep;
    hkv_engine_params_default(&ep);
    ep.synthetic = "smollm2-135m";
    ep.n_threads = 2;
    ep.max_seqs = 1;
    ep.n_ctx = n;
    ep.tiered.L_init = LI;
    ep.tiered.L_local = LL;
    ep.tiered.policy = &hkv_policy_fastkv;
    set_args(&hkv_policy_fastkv, &ep.tiered.args, "tsp_len=64", "budget=40");
    hkv_engine *e = NULL;
    hkv_err err;
    if (hkv_engine_open(&e, &ep, &err) != HKV_OK) {
        CHECK(0, "engine: %s", err.msg);
        return;
    }
    CHECK(e->kv.ops->seq_open(e->kv.self, 0, n, &err) == HKV_OK, "open: %s", err.msg);
    const size_t before = e->mem.bytes[HKV_TIER_INDEX];
    int32_t *toks = malloc((size_t)n * sizeof *toks);
    for (int64_t i = 0; i < n; i++) toks[i] = (int32_t)((i * 7919 + 13) % e->model.cfg.vocab);
    float *logits = malloc((size_t)e->model.cfg.vocab * sizeof(float));
    CHECK(hkv_prefill(e, 0, toks, n, 0, logits, &err) == HKV_OK, "prefill: %s", err.msg);
    const size_t tsp = e->mem.bytes[HKV_TIER_INDEX] - before;
    hkv_plan_params pp = {.cfg = &e->model.cfg, .batch = 1, .n_ctx = n, .L_init = LI,
                          .L_local = LL, .policy = &hkv_policy_fastkv, .args = &ep.tiered.args};
    uint64_t cut = 0, whole = 0;
    CHECK(hkv_plan_index_bytes(&pp, &cut, NULL, &err) == HKV_OK, "%s", err.msg);
    hkv_policy_args no_cut = ep.tiered.args;
    CHECK(hkv_policy_arg_set(&hkv_policy_fastkv, &no_cut, "tsp_len=16777216", &err) == HKV_OK, "arg");
    pp.args = &no_cut;
    CHECK(hkv_plan_index_bytes(&pp, &whole, NULL, &err) == HKV_OK, "%s", err.msg);
    /* 300 int32 (the policy's list) + 15 layers x 300 int32 (the cache's). */
    EQ(cut - whole, 300ULL * 4 * 16);
    EQ(tsp, cut - whole);
    /* The cut prompt's hidden rows are a prefill workspace of the plan. */
    hkv_plan o1, o2;
    pp.args = &ep.tiered.args;
    CHECK(hkv_plan_compute(&pp, &o1, &err) == HKV_OK, "%s", err.msg);
    pp.args = &no_cut;
    CHECK(hkv_plan_compute(&pp, &o2, &err) == HKV_OK, "%s", err.msg);
    EQ(o1.workspace - o2.workspace, 300ULL * 576 * 4);
    free(toks);
    free(logits);
    hkv_engine_close(e);
}

/* Near, kept rows, pinned far and draft on Llama-3-8B at 32K, by hand. */
static void llama3_8b(void) {
    hkv_model_config c;
    hkv_err err;
    CHECK(hkv_synthetic_config("llama3-8b", &c, &err) == HKV_OK, "config");
    const uint64_t kv = 131072, near = 260 * kv, n = 32768;
    hkv_plan o;
    hkv_plan_params p = {.cfg = &c, .batch = 1, .n_ctx = n, .L_init = 4, .L_local = 256};
    const hkv_policy_def *evict[] = {&hkv_policy_snapkv, &hkv_policy_laq, &hkv_policy_speckv,
                                     &hkv_policy_fastkv};
    const uint64_t look[] = {0, 8, 64, 0};
    for (int i = 0; i < 4; i++) {   /* default budget at 32K: 992 */
        p.policy = evict[i];
        CHECK(hkv_plan_compute(&p, &o, &err) == HKV_OK, "%s", err.msg);
        EQ(o.per_seq_kept, 992 * kv);
        EQ(o.near, near + 992 * kv);
        EQ(o.pinned, (n + look[i]) * kv);
        EQ(o.kv_on_gpu, 0);
    }
    /* A budget above the far tier keeps it whole: n - 260 rows. */
    hkv_policy_args a;
    set_args(&hkv_policy_snapkv, &a, "budget=100000", NULL);
    p.policy = &hkv_policy_snapkv, p.args = &a;
    CHECK(hkv_plan_compute(&p, &o, &err) == HKV_OK, "%s", err.msg);
    EQ(o.near, n * kv);
    /* rocketkv: stage-1 capacity S / c^r, c = S / 2k, r = 0.2 + 0.06 log2 c. */
    p.policy = &hkv_policy_rocketkv, p.args = NULL;
    CHECK(hkv_plan_compute(&p, &o, &err) == HKV_OK, "%s", err.msg);
    const double cr = 32768.0 / 1984.0, r = fmin(0.2 + 0.06 * log2(cr), 0.8);
    const uint64_t cap = (uint64_t)(32768.0 / pow(cr, r));
    EQ(o.per_seq_kept, cap * kv);
    EQ(o.near, near + cap * kv);
    EQ(o.pinned, n * kv);
    EQ(o.draft, 0);
    /* specpc: C = 1024 prompt tokens + the generated ones, dense, no far tier;
     * the target drafts for itself (weights shared): its prompt KV and
     * activations once. */
    p.policy = &hkv_policy_specpc;
    p.n_gen = 100;
    CHECK(hkv_plan_compute(&p, &o, &err) == HKV_OK, "%s", err.msg);
    EQ(o.near, 1124 * kv);
    EQ(o.pinned, 0);
    EQ(o.index, 0);
    EQ(o.kv_on_gpu, 1);
    const uint64_t act = 256ULL * (2 * 4096 + 6144 + 4096 + 2 * 14336) * 4 + 128256ULL * 4;
    EQ(o.draft, (n - 100) * kv + act);
    EQ(o.gpu_total, o.weights + o.near + o.index + o.workspace + o.draft);
    /* speckv with a 2-layer draft of the same width: its weights count. */
    hkv_model_config dc = c;
    dc.n_layer = 2;
    p.policy = &hkv_policy_speckv, p.n_gen = 0, p.draft = &dc;
    CHECK(hkv_plan_compute(&p, &o, &err) == HKV_OK, "%s", err.msg);
    EQ(o.draft, hkv_plan_weight_bytes(&dc, 2) + (n + 64) * (kv / 16) + act);
    p.n_gen = n;
    CHECK(hkv_plan_compute(&p, &o, &err) == HKV_E_RANGE && strstr(err.msg, "generated"), "gen >= ctx");
    p.n_gen = 0, p.draft = NULL;

    /* The largest batch for every policy: it fits and one more does not. */
    const char *names[] = {"full", "oracle", "ctkvr", "quest", "snapkv", "rocketkv", "laq",
                           "speckv", "specpc", "fastkv"};
    const uint64_t caps[] = {24ULL << 30, 48ULL << 30};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        for (int ci = 0; ci < 2; ci++)
            for (int host = 0; host < 2; host++) {
                const hkv_policy_def *d = hkv_policy_find(names[i]);
                CHECK(d != NULL, "%s registered", names[i]);
                if (!d) continue;
                hkv_plan_params q = {.cfg = &c, .batch = 1, .n_ctx = n, .L_init = 4, .L_local = 256,
                                     .policy = d, .index_on_host = host};
                int mb = -1;
                CHECK(hkv_plan_max_batch(&q, caps[ci], 1 << 20, &mb, &err) == HKV_OK, "%s: %s",
                      names[i], err.msg);
                if (mb > 0) {
                    q.batch = mb;
                    CHECK(hkv_plan_compute(&q, &o, &err) == HKV_OK && o.gpu_total <= caps[ci],
                          "%s: B=%d fits", names[i], mb);
                }
                q.batch = mb + 1;
                CHECK(hkv_plan_compute(&q, &o, &err) == HKV_OK && o.gpu_total > caps[ci],
                      "%s: B=%d does not fit", names[i], mb + 1);
                if (!strcmp(names[i], "snapkv") && ci == 0)
                    CHECK(mb > 16, "snapkv at 32K under 24 GiB fits many (%d)", mb);
            }
}

int main(void) {
    hkv_cpu_kernels kern;
    hkv_cpu_kernels_init(&kern, HKV_ISA_SCALAR);
    hkv_model_config c = {0};
    c.n_layer = 3, c.dim = 64, c.n_head = 4, c.n_head_kv = 2, c.head_dim = 16, c.ffn = 96, c.vocab = 50;
    create_time(&kern, &c);
    ctkvr_sketches(&kern);
    rocketkv_stage1(&kern, &c);
    llama3_8b();
    fastkv_tsp();
    printf("test_plan_policies: %s (%d failures)\n", fails ? "FAIL" : "ok", fails);
    return fails ? 1 : 0;
}
