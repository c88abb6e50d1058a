/* hetkv bench far: the host's far step of one layer at a real shape, alone
 * (issue 35: the host's far part at the host's bandwidth).
 *
 *   hetkv bench far [--ctx 32768,98304] [--batch 1,4] [--configs "ctkvr;ctkvr:sketch=2"]
 *                   [--steps N] [-t THREADS] [--kv-heads 8] [--group 4] [--head-dim 128]
 *
 * Per (context, batch, configuration): B sequences, each its own far tier of
 * one layer (KV heads x ctx rows of fp16 K and V: keys near one of 256
 * cluster directions per head, so the index has structure to find) and its
 * own policy instance, built at prompt end from the last C queries (queries
 * drift along a path near the clusters, as in tests/index). Then `steps`
 * decode steps: every (sequence, KV head) selects its far rows (the policy's
 * select, as the tiered cache calls it) and attends them (attn_sparse), all
 * items of a step in one OpenMP loop, as kv_tiered_attn runs a layer's far
 * part. This is the part the CPU-GPU pipeline leaves the host (the recall's
 * reads included here: on the device path ctkvr recalls on the GPU, so the
 * row also gives the bytes without them). Reported per step: seconds, bytes
 * read (what select counted, its index and scored keys, plus the K and V of
 * the rows attended), their rate against a bandwidth probe of the same run,
 * and what 32 such layers allow in tokens/s. No model, no prefill.
 * --scoring shared,alone: each row also with every selection scoring its
 * rows on its own thread (before kv/kv_score_team.c), side by side. */
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_kernels.h"
#include "cli.h"
#include "host_mem.h"
#include "kernels.h"
#include "kv_score_team.h"
#include "policy.h"

#define FAR_MAXL 8
#define FAR_CLUSTERS 256

typedef struct far_seq {
    uint16_t *k, *v;          /* [KH][n][d] */
    const uint16_t **kp, **vp;
    hkv_policy pol;
    hkv_policy_scratch *ws;   /* [KH]: one per item of a step */
    int32_t *sel;             /* [KH][max_sel] */
    float *out, *lse;         /* [KH][g][d], [KH][g] */
    uint64_t rng;
    hkv_mem_account *mem;
    size_t kv_bytes;          /* of k, and of v */
} far_seq;

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float gauss(uint64_t *s)
{
    double u = ((rnd(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double v = ((rnd(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

/* A query row [H][d] near cluster c of each head (with drift in `state`). */
static void make_query(const float *dir, int KH, int g, int d, uint64_t *s, float *state, float *q)
{
    for (int h = 0; h < KH; h++) {
        const float *c = dir + ((int64_t)h * FAR_CLUSTERS + (int64_t)(rnd(s) % FAR_CLUSTERS)) * d;
        for (int j = 0; j < g; j++) {
            float *qq = q + ((int64_t)h * g + j) * d, *st = state + ((int64_t)h * g + j) * d;
            for (int e = 0; e < d; e++) {
                st[e] = 0.9f * st[e] + 0.3f * gauss(s);
                qq[e] = 2.0f * c[e] + st[e] * 0.5f;
            }
        }
    }
}

static void seq_free(far_seq *q, int KH)
{
    if (q->pol.ops) q->pol.ops->destroy(q->pol.self);
    for (int h = 0; q->ws && h < KH; h++) free(q->ws[h].f), free(q->ws[h].i);
    hkv_host_free(q->mem, HKV_TIER_FAR, q->k, q->kv_bytes);
    hkv_host_free(q->mem, HKV_TIER_FAR, q->v, q->kv_bytes);
    free(q->ws), free(q->kp), free(q->vp), free(q->sel), free(q->out), free(q->lse);
    memset(q, 0, sizeof *q);
}

/* One sequence: its far tier, the policy built over it; 0 or an error code. */
static int seq_make(far_seq *q, const hkv_cpu_kernels *kn, hkv_mem_account *mem, const float *dir,
                    int KH, int g, int d, int64_t n, const hkv_policy_def *def,
                    const hkv_policy_args *args, int threads, uint64_t seed, hkv_err *err)
{
    memset(q, 0, sizeof *q);
    q->rng = seed;
    const int H = KH * g;
    const size_t rows = (size_t)KH * (size_t)n * d;
    q->mem = mem;
    q->kv_bytes = rows * 2;
    q->k = hkv_host_alloc(mem, HKV_TIER_FAR, rows * 2, err);
    q->v = hkv_host_alloc(mem, HKV_TIER_FAR, rows * 2, err);
    q->kp = calloc((size_t)KH, sizeof *q->kp);
    q->vp = calloc((size_t)KH, sizeof *q->vp);
    q->ws = calloc((size_t)KH, sizeof *q->ws);
    if (!q->k || !q->v) return hkv_err_prefix(err, "bench far: a far tier of %lld rows", (long long)n);
    if (!q->kp || !q->vp || !q->ws) return hkv_seterr(err, HKV_E_NOMEM, "bench far: no memory");
    float x[512];
#pragma omp parallel for schedule(static) num_threads(threads) private(x)
    for (int64_t i = 0; i < (int64_t)KH * n; i++) {
        uint64_t s = seed ^ (uint64_t)(i * 0x2545F4914F6CDD1Dull);
        const int h = (int)(i / n);
        const float *c = dir + ((int64_t)h * FAR_CLUSTERS + (int64_t)(rnd(&s) % FAR_CLUSTERS)) * d;
        for (int e = 0; e < d; e++) x[e] = c[e] + 0.35f * gauss(&s);
        kn->f32_to_f16(x, q->k + i * d, d);
        for (int e = 0; e < d; e++) x[e] = gauss(&s);
        kn->f32_to_f16(x, q->v + i * d, d);
    }
    for (int h = 0; h < KH; h++) q->kp[h] = q->k + (size_t)h * n * d, q->vp[h] = q->v + (size_t)h * n * d;
    hkv_policy_env env = {.shape = {1, H, KH, d}, .n_ctx = n + 64, .L_init = 0, .L_local = 1,
                          .kern = kn, .mem = mem, .n_threads = threads};
    int rc = def->create(&q->pol, args, &env, err);
    if (rc) return rc;
    /* prompt end: the last C (queries_wanted) queries */
    int64_t nq = def->queries_wanted ? def->queries_wanted(args, &env) : 0;
    if (nq > n) nq = n;
    uint16_t *qh = malloc((size_t)(nq > 0 ? nq : 1) * H * d * 2);
    float *qf = malloc((size_t)H * d * 4), *st = calloc((size_t)H * d, 4);
    if (!qh || !qf || !st) {
        free(qh), free(qf), free(st);
        return hkv_seterr(err, HKV_E_NOMEM, "bench far: no memory for %lld prompt queries", (long long)nq);
    }
    for (int64_t i = 0; i < nq; i++) {
        make_query(dir, KH, g, d, &q->rng, st, qf);
        kn->f32_to_f16(qf, qh + i * H * d, (int64_t)H * d);
    }
    hkv_far_view fv = {.n_head_kv = KH, .head_dim = d, .lo = 0, .hi = n, .k = q->kp, .v = q->vp, .ld = d};
    hkv_query_view qv = {.n = nq, .pos0 = n - nq, .q = qh, .ld = (int64_t)H * d};
    rc = q->pol.ops->prefill_end ? q->pol.ops->prefill_end(q->pol.self, 0, &fv, &qv, err) : HKV_OK;
    free(qh), free(qf), free(st);
    if (rc) return rc;
    const int64_t ms = q->pol.ops->max_select ? q->pol.ops->max_select(q->pol.self, n) : n;
    q->sel = malloc((size_t)KH * (ms > 0 ? ms : 1) * 4);
    q->out = malloc((size_t)H * d * 4);
    q->lse = malloc((size_t)H * 4);
    if (!q->sel || !q->out || !q->lse) return hkv_seterr(err, HKV_E_NOMEM, "bench far: no memory");
    for (int h = 0; h < KH; h++) {
        hkv_policy_scratch *w = &q->ws[h];
        if (q->pol.ops->scratch_need) q->pol.ops->scratch_need(q->pol.self, n, &w->nf, &w->ni);
        w->f = malloc((size_t)(w->nf + 1) * 4);
        w->i = malloc((size_t)(w->ni + 1) * 4);
        if (!w->f || !w->i) return hkv_seterr(err, HKV_E_NOMEM, "bench far: no memory for scratch");
    }
    return HKV_OK;
}

static const char far_usage[] =
    "usage: hetkv bench far [options]\n\n"
    "The host's far step of one layer (select + sparse attention for every\n"
    "sequence and KV head) on synthetic clustered keys, against a bandwidth probe\n"
    "of the same run (default: Llama-3-8B's 8 KV heads, g 4, d 128).\n\n";

typedef struct far_opts {
    long long ctxs[FAR_MAXL], batches[FAR_MAXL];
    int n_ctx, n_batch;
    long long steps, KH, g, d;
    const char *configs, *scoring;
    hkv_exec_cli x;
} far_opts;

static const hkv_opt far_opts_table[] = {
    {.name = "--ctx", .arg = "LIST", .kind = HKV_OPT_LIST, .off = offsetof(far_opts, ctxs),
     .n_off = offsetof(far_opts, n_ctx), .cap = FAR_MAXL, .lo = 64, .hi = 1 << 24,
     .help = "contexts (default 32768,98304)"},
    {.name = "--batch", .arg = "LIST", .kind = HKV_OPT_LIST, .off = offsetof(far_opts, batches),
     .n_off = offsetof(far_opts, n_batch), .cap = FAR_MAXL, .lo = 1, .hi = 256,
     .help = "sequences per step (default 1,4)"},
    {.name = "--configs", .arg = "SPEC", .kind = HKV_OPT_STR, .off = offsetof(far_opts, configs),
     .help = "';'-separated selection policies, policy:key=val,...\n"
             "(default ctkvr;ctkvr:sketch=2)"},
    {.name = "--steps", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(far_opts, steps),
     .lo = 1, .hi = 100000, .help = "steps timed per row (default 8)"},
    {.name = "--kv-heads", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(far_opts, KH),
     .lo = 1, .hi = 64, .help = "KV heads (default 8)"},
    {.name = "--group", .arg = "G", .kind = HKV_OPT_INT, .off = offsetof(far_opts, g),
     .lo = 1, .hi = 16, .help = "query heads per KV head (default 4)"},
    {.name = "--head-dim", .arg = "D", .kind = HKV_OPT_INT, .off = offsetof(far_opts, d),
     .lo = 32, .hi = 256, .help = "head dimension, a multiple of 32 (default 128)"},
    {.name = "--scoring", .arg = "MODES", .kind = HKV_OPT_STR, .off = offsetof(far_opts, scoring),
     .help = "shared (default: a selection's scoring spread over the threads\n"
             "without one of their own, as the tiered cache runs it), alone\n"
             "(each on its own thread), or shared,alone: both, side by side"},
    {0},
};

/* The kernels are always the AVX512 ones (hkv_cpu_kernels_init falls back
 * on a CPU without): the exec group without --isa. */
static const char *const far_omit[] = {"--isa", NULL};

int hkv_bench_far_main(int argc, char **argv)
{
    hkv_err err;
    hkv_err_clear(&err);
    far_opts o = {.ctxs = {32768, 98304}, .batches = {1, 4}, .n_ctx = 2, .n_batch = 2, .steps = 8,
                  .KH = 8, .g = 4, .d = 128, .configs = "ctkvr;ctkvr:sketch=2", .scoring = "shared"};
    hkv_exec_cli_init(&o.x);
    const hkv_opt_use uses[] = {
        {.opts = far_opts_table, .base = &o},
        {.opts = hkv_exec_opts, .base = &o.x, .omit = far_omit},
    };
    int rc = hkv_opts_parse("bench far", uses, 2, argc, argv, &err);
    if (rc == 1) {
        hkv_opts_help(stdout, far_usage, uses, 2);
        return 0;
    }
    if (!rc && o.d % 32) rc = hkv_seterr(&err, HKV_E_INVAL, "--head-dim %lld: a multiple of 32", o.d);
    int modes[2], n_modes = 0;   /* 1: shared scoring, 0: alone */
    if (!rc) {
        char ms[64];
        snprintf(ms, sizeof ms, "%s", o.scoring);
        for (char *sv = NULL, *m = strtok_r(ms, ",", &sv); m && !rc; m = strtok_r(NULL, ",", &sv)) {
            if (n_modes == 2 || (strcmp(m, "shared") && strcmp(m, "alone")))
                rc = hkv_seterr(&err, HKV_E_INVAL, "--scoring '%s': shared, alone, or both, "
                                "comma-separated", o.scoring);
            else
                modes[n_modes++] = !strcmp(m, "shared");
        }
        if (!rc && !n_modes) rc = hkv_seterr(&err, HKV_E_INVAL, "--scoring: empty");
    }
    if (rc) {
        hkv_err_report(&err, stderr);
        return 2;
    }
    const long long *ctxs = o.ctxs, *batches = o.batches, steps = o.steps, threads = o.x.threads;
    const long long KH = o.KH, g = o.g, d = o.d;
    const int n_ctx = o.n_ctx, n_batch = o.n_batch;
    const char *configs = o.configs;
    if (threads > 0) omp_set_num_threads((int)threads);
    const int T = omp_get_max_threads();
    hkv_cpu_kernels kn;
    hkv_cpu_kernels_init(&kn, HKV_ISA_AVX512);
    hkv_score_team team;
    if ((rc = hkv_score_team_init(&team, &kn, T, &err))) {
        hkv_err_report(&err, stderr);
        return 1;
    }
    const double probe = hkv_bandwidth_probe((size_t)1 << 30, 5);
    printf("bench far: %lld KV heads, g %lld, d %lld; %d threads, %s kernels; probe %.1f GB/s\n", KH, g, d,
           T, hkv_isa_name(kn.isa), probe / 1e9);
    printf("%-34s %7s %5s | %9s %9s %8s %6s | %12s\n", "config", "ctx", "batch", "step ms", "MB/step",
           "GB/s", "probe", "tok/s (x32)");
    float *dir = malloc((size_t)KH * FAR_CLUSTERS * d * 4);
    if (!dir) {
        fprintf(stderr, "hetkv: error: bench far: no memory\n");
        hkv_score_team_free(&team);
        return 1;
    }
    uint64_t s0 = 12345;
    for (int64_t i = 0; i < KH * FAR_CLUSTERS; i++) {
        float *c = dir + i * d;
        double ss = 0;
        for (int e = 0; e < d; e++) c[e] = gauss(&s0), ss += (double)c[e] * c[e];
        for (int e = 0; e < d; e++) c[e] = (float)(c[e] / sqrt(ss / d));   /* |c| = sqrt(d) */
    }
    char spec[1024];
    snprintf(spec, sizeof spec, "%s", configs);
    for (char *save = NULL, *one = strtok_r(spec, ";", &save); one && !rc; one = strtok_r(NULL, ";", &save)) {
        char name[64];
        const char *colon = strchr(one, ':');
        snprintf(name, sizeof name, "%.*s", (int)(colon ? colon - one : (long)strlen(one)), one);
        const hkv_policy_def *def = hkv_policy_find(name);
        hkv_policy_args args;
        if (!def || def->kind != HKV_POLICY_SELECTION) {
            fprintf(stderr, "hetkv: error: bench far: '%s' is not a selection policy\n", name);
            rc = HKV_E_INVAL;
            break;
        }
        hkv_policy_args_init(def, &args);
        char kvs[512];
        snprintf(kvs, sizeof kvs, "%s", colon ? colon + 1 : "");
        for (char *s2 = NULL, *kv = strtok_r(kvs, ",", &s2); kv && !rc; kv = strtok_r(NULL, ",", &s2))
            rc = hkv_policy_arg_set(def, &args, kv, &err);
        if (rc) {
            hkv_err_report(&err, stderr);
            break;
        }
        for (int ci = 0; ci < n_ctx && !rc; ci++)
            for (int bi = 0; bi < n_batch && !rc; bi++)
            for (int mi = 0; mi < n_modes && !rc; mi++) {
                const int shared = modes[mi] && T > 1;
                const int64_t n = ctxs[ci];
                const int B = (int)batches[bi];
                hkv_mem_account mem = {0};
                far_seq *sq = calloc((size_t)B, sizeof *sq);
                if (!sq) rc = hkv_seterr(&err, HKV_E_NOMEM, "bench far: no memory");
                for (int b = 0; b < B && !rc; b++)
                    rc = seq_make(&sq[b], &kn, &mem, dir, (int)KH, (int)g, (int)d, n, def, &args, T,
                                  1000 + 77 * (uint64_t)b + (uint64_t)n, &err);
                float *qs = malloc((size_t)B * KH * g * d * 4), *st = calloc((size_t)B * KH * g * d, 4);
                if (!rc && (!qs || !st)) rc = hkv_seterr(&err, HKV_E_NOMEM, "bench far: no memory");
                double t = 0;
                uint64_t bytes = 0;
                for (long long step = 0; step <= steps && !rc; step++) {
                    for (int b = 0; b < B; b++)
                        make_query(dir, (int)KH, (int)g, (int)d, &sq[b].rng, st + (size_t)b * KH * g * d,
                                   qs + (size_t)b * KH * g * d);
                    uint64_t sb = 0;
                    int fail = 0;
                    const double t0 = omp_get_wtime();
                    int next = 0, done = 0;
                    const int n_it = B * (int)KH;
                    /* items claimed one at a time; with shared scoring a
                     * thread out of items takes pieces of the others' (as
                     * kv/kv_tiered_attn.c runs a layer's far part) */
#pragma omp parallel reduction(+ : sb) reduction(| : fail)
                    {
                        const int tid = omp_get_thread_num();
                        for (int it; (it = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) < n_it;) {
                            far_seq *q = &sq[it / KH];
                            const int h = it % (int)KH;
                            const float *qq = qs + ((size_t)(it / KH) * KH + h) * g * d;
                            hkv_far_view fv = {.n_head_kv = (int)KH, .head_dim = (int)d, .lo = 0,
                                               .hi = n, .k = q->kp, .v = q->vp, .ld = d};
                            hkv_policy_scratch *w = &q->ws[h];
                            const int64_t ms = q->pol.ops->max_select(q->pol.self, n);
                            int32_t *sel = q->sel + (size_t)h * ms;
                            w->bytes = 0;
                            w->par = shared ? hkv_score_team_par(&team, tid) : NULL;
                            const int64_t m = q->pol.ops->select(q->pol.self, 0, h, qq, &fv, sel, w);
                            if (m < 0)
                                fail = 1;
                            else {
                                kn.attn_sparse(qq, (int)g, (int)d, q->kp[h], q->vp[h], d, sel, m,
                                               1.0f / sqrtf((float)d), q->out + (size_t)h * g * d,
                                               q->lse + (size_t)h * g);
                                sb += w->bytes + (uint64_t)m * d * 4;
                            }
                            __atomic_fetch_add(&done, 1, __ATOMIC_RELEASE);
                        }
                        while (shared && __atomic_load_n(&done, __ATOMIC_ACQUIRE) < n_it)
                            hkv_score_team_help(&team);
                    }
                    const double dt = omp_get_wtime() - t0;
                    if (fail) rc = hkv_seterr(&err, HKV_E_INTERNAL, "bench far: a select failed");
                    if (step > 0) t += dt, bytes += sb;   /* the first step warms caches */
                }
                if (!rc) {
                    const double st_s = t / (double)steps, mb = (double)bytes / (double)steps;
                    char label[96];
                    snprintf(label, sizeof label, "%s%s", one, n_modes > 1 && !shared ? " [alone]" : "");
                    printf("%-34s %7lld %5d | %9.3f %9.1f %8.1f %5.0f%% | %12.1f\n", label, (long long)n, B,
                           st_s * 1e3, mb / 1e6, mb / st_s / 1e9, 100 * mb / st_s / probe,
                           B / (32.0 * st_s));
                    fflush(stdout);
                }
                for (int b = 0; b < B; b++) seq_free(&sq[b], (int)KH);
                free(sq), free(qs), free(st);
            }
    }
    free(dir);
    hkv_score_team_free(&team);
    if (rc) {
        hkv_err_report(&err, stderr);
        return 1;
    }
    return 0;
}
