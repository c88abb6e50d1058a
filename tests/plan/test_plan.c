/* The GPU memory plan against hand-computed numbers, the policies' own
 * index allocations, and the size parser. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gpu_plan.h"
#include "kernels.h"
#include "policy.h"
#include "synthetic.h"

#include "../check.h"
#define EQ(a, b) CHECK((unsigned long long)(a) == (unsigned long long)(b), "%s = %llu, want %llu", \
                       #a, (unsigned long long)(a), (unsigned long long)(b))

static hkv_plan_params base(const hkv_model_config *c, const hkv_policy_def *d, int B, int64_t n) {
    hkv_plan_params p = {0};
    p.cfg = c;
    p.batch = B;
    p.n_ctx = n;
    p.L_init = 4;
    p.L_local = 256;
    p.policy = d;
    return p;
}

/* Llama-3-8B by hand: 32 layers, dim 4096, 32/8 heads of 128, ffn 14336, vocab 128256. */
static void llama3_8b(void) {
    hkv_model_config c;
    hkv_err err;
    CHECK(hkv_synthetic_config("llama3-8b", &c, &err) == HKV_OK, "config");
    /* Matrices: embeddings 2*128256*4096 = 1,050,673,152; per layer QKV
     * 6144*4096 + O 4096*4096 + FFN 3*4096*14336 = 218,103,808, times 32
     * = 6,979,321,856; sum 8,029,995,008 (fp16: 16,059,990,016 bytes).
     * Norms 65*4096 = 266,240 floats. */
    EQ(hkv_plan_param_count(&c), 8029995008ULL + 266240ULL);
    EQ(hkv_plan_weight_bytes(&c, 2), 16059990016ULL + 266240ULL * 4);
    CHECK(fabs(hkv_plan_weight_bytes(&c, 2) / 1e9 - 16.06) < 0.005, "weights about 16.06e9");

    hkv_plan o;
    hkv_plan_params p = base(&c, &hkv_policy_full, 1, 32768);
    CHECK(hkv_plan_compute(&p, &o, &err) == HKV_OK, "%s", err.msg);
    EQ(o.kv_per_token, 131072);                     /* 128 KiB */
    EQ(o.near, 4ULL << 30);                         /* 32K full KV = 4 GiB */
    EQ(o.index, 0);
    EQ(o.pinned, 0);
    /* 256 rows x (2*4096 + 6144 + 4096 + 3*14336) floats (X, XN, QKV, ATT,
     * GU, G) + TMP, the larger of 256 rows of 4096 and the head's 256 rows of
     * 128256 logits + 2 partials 32*(128+1) floats + 32 MiB cuBLAS + the products'
     * workspace, largest for down (4096 x 14336): a panel of 2,048 rows
     * (32 MiB / (14336 * 4) = 585, raised to the least, gpu/qmat_panel.h) at
     * 4 bytes a weight, 256 split activation rows of 14336 x 4 bytes and
     * their 256 scales. */
    const unsigned long long prod_ws = 2048ULL * 14336 * 4 + 256ULL * 14336 * 4 + 256 * 4;
    EQ(prod_ws, 132121600ULL);
    const unsigned long long acts = 256ULL * 61440 * 4 + 256ULL * 128256 * 4;
    EQ(acts, 194248704ULL);
    EQ(o.workspace, acts + 33024 + 33554432 + prod_ws);
    EQ(o.gpu_total, o.weights + o.near + o.index + o.workspace);

    /* ctkvr at 32K: C = 2048, rho' = 992, rho = 2480. */
    p = base(&c, &hkv_policy_ctkvr, 1, 32768);
    CHECK(hkv_plan_compute(&p, &o, &err) == HKV_OK, "%s", err.msg);
    EQ(o.near, 260ULL * 131072);
    EQ(o.pinned, 32768ULL * 131072);
    const unsigned long long cent = 32ULL * 2048 * 32 * 128 * 2;       /* 536,870,912 */
    const unsigned long long fifo = 32ULL * 8 * (8 + 2048);
    const unsigned long long ivf = 32ULL * 8 * 2048 * 2480 * 4 + 32ULL * 8 * 2048 * 4;
    EQ(o.index, cent + fifo + ivf);
    /* Candidates handed to the host: C' rho = 4*2480 per KV head. */
    EQ(o.workspace, acts + 33024 + 8ULL * 4 * 2480 * 4 + 33554432 + prod_ws);
    p.index_on_host = 1;
    CHECK(hkv_plan_compute(&p, &o, &err) == HKV_OK, "%s", err.msg);
    EQ(o.index, cent + fifo);
    EQ(o.pinned, 32768ULL * 131072 + ivf);

    /* Largest batch under 24 GiB: full, 16.06e9 + B*(4 GiB + 546,048) +
     * 81,788,928 fits B = 2; at 96K (12 GiB each) none. */
    const uint64_t cap24 = 24ULL << 30;
    int mb;
    p = base(&c, &hkv_policy_full, 1, 32768);
    CHECK(hkv_plan_max_batch(&p, cap24, 4096, &mb, &err) == HKV_OK, "%s", err.msg);
    EQ(mb, 2);
    p.n_ctx = 98304;
    CHECK(hkv_plan_max_batch(&p, cap24, 4096, &mb, &err) == HKV_OK, "%s", err.msg);
    EQ(mb, 0);
    /* ctkvr with the IVF lists on the host: per sequence 34 MB near + 537 MB
     * centroids (+ workspace): 16 sequences at 32K. Check against a direct
     * evaluation of the boundary rather than a constant. */
    p = base(&c, &hkv_policy_ctkvr, 1, 32768);
    p.index_on_host = 1;
    CHECK(hkv_plan_max_batch(&p, cap24, 4096, &mb, &err) == HKV_OK, "%s", err.msg);
    CHECK(mb >= 10, "ctkvr (IVF on host) fits %d at 32K under 24 GiB, want many", mb);
    p.batch = mb;
    CHECK(hkv_plan_compute(&p, &o, &err) == HKV_OK && o.gpu_total <= cap24, "B=%d fits", mb);
    p.batch = mb + 1;
    CHECK(hkv_plan_compute(&p, &o, &err) == HKV_OK && o.gpu_total > cap24, "B=%d does not", mb + 1);

    /* Admission message names every part and the cap. */
    p = base(&c, &hkv_policy_full, 4, 32768);
    CHECK(hkv_plan_compute(&p, &o, &err) == HKV_OK, "%s", err.msg);
    hkv_err_clear(&err);
    CHECK(hkv_plan_admit(&p, &o, cap24, &err) == HKV_E_CAPACITY, "4 x 32K full refused");
    CHECK(strstr(err.msg, "needs") && strstr(err.msg, "weights") && strstr(err.msg, "near") &&
              strstr(err.msg, "index") && strstr(err.msg, "workspace") &&
              strstr(err.msg, "cap is 24.00 GiB"),
          "message: %s", err.msg);
    CHECK(hkv_plan_admit(&p, &o, o.gpu_total, &err) == HKV_OK, "exact fit admitted");
}

/* The plan's index bytes against what each policy really allocates (INDEX
 * tier) for a small shape: the formulas must follow the code. Slack covers
 * the policies' small per-layer bookkeeping structs. */
static void index_vs_policies(void) {
    hkv_cpu_kernels kern;
    hkv_cpu_kernels_init(&kern, HKV_ISA_SCALAR);
    hkv_model_config c = {0};
    c.n_layer = 3, c.dim = 64, c.n_head = 4, c.n_head_kv = 2, c.head_dim = 16, c.ffn = 96, c.vocab = 50;
    const hkv_policy_def *defs[] = {&hkv_policy_ctkvr, &hkv_policy_quest, &hkv_policy_snapkv,
                                    &hkv_policy_full, &hkv_policy_oracle};
    const int64_t ctxs[] = {100, 4096, 20000};
    const char *args[][2] = {{NULL, NULL}, {"C=37", "rho=50"}, {"rho_p=64", NULL}};
    for (size_t di = 0; di < sizeof defs / sizeof defs[0]; di++)
        for (size_t ci = 0; ci < 3; ci++)
            for (size_t ai = 0; ai < 3; ai++) {
                const hkv_policy_def *d = defs[di];
                if (ai && d != &hkv_policy_ctkvr) continue;
                hkv_policy_args a;
                hkv_policy_args_init(d, &a);
                hkv_err err;
                for (int k = 0; k < 2; k++)
                    if (args[ai][k]) CHECK(hkv_policy_arg_set(d, &a, args[ai][k], &err) == HKV_OK, "%s", err.msg);
                hkv_mem_account mem = {0};
                hkv_policy_env env = {.shape = {c.n_layer, c.n_head, c.n_head_kv, c.head_dim},
                                      .n_ctx = ctxs[ci], .L_init = 4, .L_local = 16, .kern = &kern,
                                      .mem = &mem, .n_threads = 1};
                hkv_policy pol = {0};
                CHECK(d->create(&pol, &a, &env, &err) == HKV_OK, "%s create: %s", d->name, err.msg);
                if (d == &hkv_policy_ctkvr) {
                    /* its index is made at the first prompt end (an empty far tier
                     * and one query will do): what the plan counts is then held */
                    static const uint16_t q0[64] = {0};
                    const hkv_far_view fv = {.n_head_kv = c.n_head_kv, .head_dim = c.head_dim,
                                             .lo = 4, .hi = 4, .ld = c.head_dim};
                    const hkv_query_view qv = {.n = 1, .pos0 = 0, .q = q0,
                                               .ld = (int64_t)c.n_head * c.head_dim};
                    CHECK(pol.ops->prefill_end(pol.self, 0, &fv, &qv, &err) == HKV_OK,
                          "ctkvr prompt end: %s", err.msg);
                }
                uint64_t g = 0, h = 0;
                hkv_plan_params pp = {.cfg = &c, .batch = 1, .n_ctx = ctxs[ci], .L_init = 4,
                                      .L_local = 16, .policy = d, .args = &a};
                CHECK(hkv_plan_index_bytes(&pp, &g, &h, &err) == HKV_OK, "%s", err.msg);
                const double got = (double)mem.bytes[HKV_TIER_INDEX], want = (double)g;
                const double slack = 2048 + 512.0 * c.n_layer + 128.0 * c.n_layer * c.n_head_kv;
                CHECK(got >= want && got <= want + slack,
                      "%s ctx %lld args %zu: plan %.0f bytes, allocated %.0f", d->name,
                      (long long)ctxs[ci], ai, want, got);
                EQ(h, 0);
                uint64_t g2 = 0, h2 = 0;   /* the host/GPU split adds up */
                pp.index_on_host = 1;
                CHECK(hkv_plan_index_bytes(&pp, &g2, &h2, &err) == HKV_OK, "split");
                EQ(g2 + h2, g);
                if (pol.ops) pol.ops->destroy(pol.self);
            }
    hkv_err err;
    uint64_t g;
    /* Every registered policy has a formula now; an unknown one is refused by name. */
    const hkv_policy_def none = {.name = "nosuch"};
    hkv_plan_params pn = {.cfg = &c, .batch = 1, .n_ctx = 4096, .L_init = 4, .L_local = 16,
                          .policy = &none};
    CHECK(hkv_plan_index_bytes(&pn, &g, NULL, &err) == HKV_E_UNSUPPORTED && strstr(err.msg, "nosuch"),
          "a policy without a formula is refused by name");
}

static void bad_params(void) {
    hkv_model_config c;
    hkv_err err;
    hkv_synthetic_config("smollm2-135m", &c, &err);
    hkv_plan o;
    hkv_plan_params p = base(&c, NULL, 0, 1024);
    CHECK(hkv_plan_compute(&p, &o, &err) == HKV_E_RANGE && strstr(err.msg, "batch"), "batch 0");
    p = base(&c, NULL, 1, 0);
    CHECK(hkv_plan_compute(&p, &o, &err) == HKV_E_RANGE && strstr(err.msg, "context"), "ctx 0");
    hkv_model_config z = c;
    z.n_head_kv = 2;   /* 9 heads not a multiple of 2 */
    p = base(&z, NULL, 1, 1024);
    CHECK(hkv_plan_compute(&p, &o, &err) == HKV_E_INVAL && strstr(err.msg, "shape"), "bad shape");
    int mb = -1;
    p = base(&c, NULL, 1, 1024);
    CHECK(hkv_plan_max_batch(&p, 1000, 64, &mb, &err) == HKV_OK && mb == 0, "tiny cap: 0 fit");
    /* A monotone search: the answer fits and one more does not. */
    p = base(&c, &hkv_policy_full, 1, 8192);
    const uint64_t cap = 2ULL << 30;
    CHECK(hkv_plan_max_batch(&p, cap, 4096, &mb, &err) == HKV_OK && mb > 0, "smollm2 fits");
    p.batch = mb;
    hkv_plan_compute(&p, &o, &err);
    CHECK(o.gpu_total <= cap, "answer fits");
    p.batch = mb + 1;
    hkv_plan_compute(&p, &o, &err);
    CHECK(o.gpu_total > cap, "answer + 1 does not");
}

static void sizes(void) {
    struct { const char *s; unsigned long long v; } ok[] = {
        {"24G", 24ULL << 30}, {"24GiB", 24ULL << 30}, {"24gb", 24ULL << 30}, {"500M", 500ULL << 20},
        {"1.5T", 3ULL << 39}, {"4096", 4096}, {"0.5K", 512}, {"80g", 80ULL << 30}, {"1b", 1},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint64_t v = 0;
        hkv_err err;
        CHECK(hkv_parse_size("--gpu-mem", ok[i].s, &v, &err) == HKV_OK && v == ok[i].v,
              "'%s' -> %llu (%s)", ok[i].s, (unsigned long long)v, err.msg);
    }
    const char *bad[] = {"", "G", "abc", "-1G", "0", "0G", "24X", "24 G", "1e3", "0x10", "inf",
                         "nan", "2000T", "24G5", ".", "1..5G"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 0;
        hkv_err err;
        hkv_err_clear(&err);
        int rc = hkv_parse_size("--gpu-mem", bad[i], &v, &err);
        CHECK(rc != HKV_OK && strstr(err.msg, "--gpu-mem"), "'%s' rejected (rc %d, %s)", bad[i], rc,
              err.msg);
    }
}

/* full in the split (a near tier shorter than the context: its far tier on
 * the host), resident slots sized by resident_rows beside one prefix slot,
 * and a prompt every sequence shares held once in the page-locked far tier. */
static void shared_and_resident(void) {
    hkv_model_config c;
    hkv_err err;
    CHECK(hkv_synthetic_config("llama3-8b", &c, &err) == HKV_OK, "config");
    hkv_plan o, d;
    hkv_plan_params p = base(&c, &hkv_policy_full, 64, 32768);
    p.full_split = 1;
    CHECK(hkv_plan_compute(&p, &o, &err) == HKV_OK, "%s", err.msg);
    EQ(o.kv_on_gpu, 0);
    EQ(o.near, 64ULL * 260 * 131072);
    EQ(o.pinned, 64ULL * 32768 * 131072);
    hkv_plan_params q = p;
    q.full_split = 0;   /* dense: the whole KV on the device */
    CHECK(hkv_plan_compute(&q, &d, &err) == HKV_OK && d.kv_on_gpu && d.near == 64ULL * 32768 * 131072 &&
              d.pinned == 0,
          "full without full_split is dense");
    q = p;
    q.L_local = 32768;   /* the near tier holds the context: dense whatever full_split says */
    CHECK(hkv_plan_compute(&q, &d, &err) == HKV_OK && d.kv_on_gpu, "full_split with no far tier");
    /* 64 resident slots of 512 rows and one prefix slot of the whole far context */
    p.resident = 64, p.resident_rows = 512, p.resident_prefixes = 1;
    p.shared_rows = 32768 - 64;
    CHECK(hkv_plan_compute(&p, &o, &err) == HKV_OK, "%s", err.msg);
    const unsigned long long far = 32768 - 260;
    EQ(o.resident, (64ULL * 512 + far) * 131072 + 64ULL * (32 * 129 * 4 + 8 * 16));
    EQ(o.shared_pinned, (32768ULL - 64) * 131072);
    EQ(o.pinned, 64ULL * 32768 * 131072 - 63ULL * (32768 - 64) * 131072);
    /* the host's refusal counts the prompt once: 64 tails of 64 rows fit 2 GiB beside it */
    EQ(hkv_plan_admit_host(&p, &o, o.pinned, 0, &err), HKV_OK);
    CHECK(hkv_plan_admit_host(&p, &o, o.pinned - 1, 0, &err) == HKV_E_CAPACITY &&
              strstr(err.msg, "shared prompt held once") && strstr(err.msg, "at most 63 such"),
          "%s", err.msg);
}

int main(void) {
    llama3_8b();
    shared_and_resident();
    index_vs_policies();
    bad_params();
    sizes();
    printf("test_plan: %s (%d failures)\n", fails ? "FAIL" : "ok", fails);
    return fails ? 1 : 0;
}
