/* hetkv bench far: the host's far step of one layer at a real shape, alone
 * (issue 35: the host's far part at the host's bandwidth).
 *
 *   hetkv bench far [--ctx 32768,98304] [--batch 1,4] [--configs "ctkvr;ctkvr:sketch=2"]
 *                   [--steps N] [-t THREADS] [--kv-heads 8] [--group 4] [--head-dim 128]
 *                   [--scoring shared|alone|shared,alone] [--isa ISA] [-o md|csv|json|jsonl]
 *
 * Per (context, batch, configuration): a tiered cache (kv/kv_tiered.h) of one
 * layer with the policy, the code the CPU-GPU pipeline leaves the host. One
 * prompt of ctx rows goes in as the device path stores it (store-only
 * chunks: keys near one of 256 cluster directions per KV head, so the index
 * has structure to find; the last C queries drift along a path near the
 * clusters, as in tests/index), its prompt end builds the policy's index,
 * and B copies of it (seq_copy) decode `steps` steps through layer_step_far:
 * every (sequence, KV head) selects its far rows and attends them, the far
 * pieces and the selections' scoring shared by the threads as the pipeline's
 * host steps run (kv/kv_tiered_attn.c, kv/kv_score_team.c). ctkvr recalls on
 * the host here (on the device path it recalls on the GPU, so the row also
 * gives the bytes without those reads). Reported per step: seconds, bytes
 * read (the cache's counter: the policy's index and scored keys, the K and
 * V of the rows attended), their rate against a bandwidth probe of the same
 * run and against a gather probe (random rows of the keys' size, ascending,
 * prefetched: the pattern of the rerank's reads, whose ceiling the stream
 * probe overstates), and what 32 such layers allow in tokens/s. No model
 * weights.
 * Before each step the threads sweep a buffer of twice the last-level
 * caches (untimed), so that the step starts as a layer does in the
 * pipeline, where the 31 other layers' rows passed through the caches
 * since; one layer's far tier at 32K (134 MB) fits the 300 MiB L3 of the
 * H200 run's host, where a warm bench far read 2x the pipeline's rate.
 * --warm skips the sweep.
 * A policy with a device part (ctkvr's recall) gets it as the pipeline
 * gives it (--recall device, the default): its top C' slots are made
 * before the timed step, as the device makes them (cosine of the unit query
 * heads with the table's unit rows, max over the group, ties to the older
 * slot), and the step runs select_recalled; --recall host times the CPU
 * path's own recall too (at 96K it reads 16.8 MB of centroids a layer, more
 * than the candidates' keys).
 * --scoring shared,alone: each row also with every selection scoring its
 * rows on its own thread, side by side.
 * -t 1 --warm is one core's far step with its rows cached: its ceiling,
 * which plan --predict takes as --host-core-us (step / (batch x KV heads);
 * a host of N such cores does the far part no faster than N of them,
 * whatever its memory); --isa avx2
 * times the kernels a desktop CPU without AVX-512 runs. -o writes the rows
 * (docs/BENCH_ROWS.md, "bench far") on stdout, the table on stderr. */
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_kernels.h"
#include "cli.h"
#include "cli_rows.h"
#include "host_mem.h"
#include "kernels.h"
#include "kv_tiered.h"
#include "peak.h"
#include "policy.h"
#include "threads.h"

#define FAR_MAXL 8
#define FAR_CLUSTERS 256

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

/* Prompt rows [m][(H + 2 KH) d] at positions p0..p0+m of a prompt of n:
 * keys near a cluster of their KV head, values Gaussian, queries (the last
 * nq of the prompt only: the index's; store-only rows attend nothing)
 * drifting near the clusters. */
static void prompt_rows(const float *dir, int KH, int g, int d, int64_t p0, int64_t m, int64_t n,
                        int64_t nq, uint64_t seed, uint64_t *qrng, float *qstate, float *qkv,
                        int threads)
{
    const int H = KH * g;
    const int64_t ld = (int64_t)(H + 2 * KH) * d;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < m; r++) {
        uint64_t s = seed ^ (uint64_t)((p0 + r) * 0x2545F4914F6CDD1Dull);
        float *row = qkv + r * ld, *k = row + (int64_t)H * d, *v = k + (int64_t)KH * d;
        memset(row, 0, (size_t)H * d * sizeof *row);
        for (int h = 0; h < KH; h++) {
            const float *c = dir + ((int64_t)h * FAR_CLUSTERS + (int64_t)(rnd(&s) % FAR_CLUSTERS)) * d;
            for (int e = 0; e < d; e++) k[(int64_t)h * d + e] = c[e] + 0.35f * gauss(&s);
            for (int e = 0; e < d; e++) v[(int64_t)h * d + e] = gauss(&s);
        }
    }
    for (int64_t r = 0; r < m; r++)   /* in order: the drift is a path */
        if (p0 + r >= n - nq) make_query(dir, KH, g, d, qrng, qstate, qkv + r * ld);
}

/* One row of the step: a decode query near the clusters, a new key and value. */
static void decode_row(const float *dir, int KH, int g, int d, uint64_t *rng, float *qstate,
                       float *row)
{
    const int H = KH * g;
    make_query(dir, KH, g, d, rng, qstate, row);
    float *k = row + (int64_t)H * d, *v = k + (int64_t)KH * d;
    for (int h = 0; h < KH; h++) {
        const float *c = dir + ((int64_t)h * FAR_CLUSTERS + (int64_t)(rnd(rng) % FAR_CLUSTERS)) * d;
        for (int e = 0; e < d; e++) k[(int64_t)h * d + e] = c[e] + 0.35f * gauss(rng);
        for (int e = 0; e < d; e++) v[(int64_t)h * d + e] = gauss(rng);
    }
}

/* The device's recall for a step's B rows (NULL rows: the policy has no
 * device part), into r (slot/score [B][KH][k], n [B][KH]). */
typedef struct dev_recall {
    int32_t *slot, *n, *slots, *sel, *tsc;
    float *score, *qn, *cs, *ct;
    int64_t cap_c, cap_k;
    int32_t fifo[2 * 64], dirty[64];   /* per KV head (--kv-heads <= 64) */
} dev_recall;

/* The buffers freed; fifo and dirty kept: a call that grows the buffers has
 * just had recall_table write them (zeroing them there left the first step
 * of every row with an empty FIFO: no centroid recalled, no far row read). */
static void dev_recall_free(dev_recall *r)
{
    free(r->slot), free(r->n), free(r->slots), free(r->sel), free(r->tsc), free(r->score);
    free(r->qn), free(r->cs), free(r->ct);
    r->slot = r->n = r->slots = r->sel = r->tsc = NULL;
    r->score = r->qn = r->cs = r->ct = NULL;
    r->cap_c = r->cap_k = 0;
}

static int device_recall(hkv_kv *kv, const hkv_cpu_kernels *kn, const hkv_seg *segs, int B,
                         const float *qkv, int64_t ld, int KH, int g, int d, dev_recall *r,
                         hkv_recall_rows *out, const hkv_recall_rows **use, hkv_err *err)
{
    const int H = KH * g;
    *use = NULL;
    for (int b = 0; b < B; b++) {
        hkv_policy pol;
        hkv_recall_table t;
        int rc = hkv_kv_seq_instance(kv, segs[b].seq, NULL, &pol, err);
        if (rc) return rc;
        if (!pol.ops->recall_table || !pol.ops->select_recalled) return HKV_OK;
        if ((rc = pol.ops->recall_table(pol.self, 0, &t, r->fifo, r->dirty)))
            return hkv_seterr(err, rc, "bench far: sequence %d's recall table", segs[b].seq);
        if (t.C > r->cap_c || t.k > r->cap_k) {   /* (every copy has the prompt's table size) */
            dev_recall_free(r);
            r->cap_c = t.C, r->cap_k = t.k;
            const size_t C = (size_t)t.C, K = (size_t)t.k;
            if (!(r->slot = malloc((size_t)B * KH * K * 4)) || !(r->score = malloc((size_t)B * KH * K * 4)) ||
                !(r->n = malloc((size_t)B * KH * 4)) || !(r->slots = malloc(C * 4)) ||
                !(r->sel = malloc(K * 4)) || !(r->tsc = malloc((size_t)HKV_TOPK_SCRATCH(C) * 4)) ||
                !(r->qn = malloc((size_t)g * d * 4)) || !(r->cs = malloc(C * 4)) || !(r->ct = malloc(C * 4)))
                return hkv_seterr(err, HKV_E_NOMEM, "bench far: no memory for the recall");
        }
        for (int h = 0; h < KH; h++) {
            const int64_t at = (int64_t)segs[b].row * KH + h, C = t.C;
            const int64_t head = C ? ((r->fifo[2 * h] % C) + C) % C : 0;
            const int64_t cnt = r->fifo[2 * h + 1] < 0 ? 0 : r->fifo[2 * h + 1] > C ? C : r->fifo[2 * h + 1];
            const float *q = qkv + (int64_t)segs[b].row * ld + (int64_t)h * g * d;
            for (int j = 0; j < g; j++) {   /* unit heads: float64 sum of squares, as both sides */
                double ss = 0;
                for (int e = 0; e < d; e++) ss += (double)q[j * d + e] * q[j * d + e];
                const float sc = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
                for (int e = 0; e < d; e++) r->qn[j * d + e] = q[j * d + e] * sc;
            }
            for (int64_t i = 0; i < cnt; i++) r->slots[i] = (int32_t)((head + i) % C);
            for (int j = 0; j < g; j++) {
                kn->score_max(r->qn + j * d, 1, d, t.rows + ((int64_t)h * g + j) * d, (int64_t)H * d,
                              r->slots, cnt, j ? r->ct : r->cs);
                for (int64_t i = 0; j && i < cnt; i++) r->cs[i] = r->ct[i] > r->cs[i] ? r->ct[i] : r->cs[i];
            }
            const int64_t k = hkv_topk(r->cs, cnt, t.k, r->sel, r->tsc);
            for (int64_t i = 0; i < k; i++) {
                r->slot[at * t.k + i] = r->slots[r->sel[i]];
                r->score[at * t.k + i] = r->cs[r->sel[i]];
            }
            r->n[at] = (int32_t)k;
        }
        *out = (hkv_recall_rows){.slot = r->slot, .score = r->score, .n = r->n, .ld = t.k};
    }
    *use = out;
    return HKV_OK;
}

/* Read every cache line of the sweep buffer, all threads: what was cached
 * before is evicted. */
static uint64_t sweep_caches(const uint64_t *buf, size_t bytes, int threads)
{
    const int64_t n = (int64_t)(bytes / 8);
    uint64_t x = 0;
#pragma omp parallel for schedule(static) num_threads(threads) reduction(^ : x)
    for (int64_t i = 0; i < n; i += 8) x ^= buf[i];
    return x;
}

/* One row of the table: a cache of one layer, the prompt stored and its
 * index built, B copies decoding `steps` timed steps (and one warm-up),
 * each after a sweep of the caches unless sweep is NULL. */
static int far_row(const hkv_cpu_kernels *kn, const float *dir, int KH, int g, int d, int64_t n,
                   int B, long long steps, const hkv_policy_def *def, const hkv_policy_args *args,
                   int far_q8, int shared, int threads, int dev_rec, const uint64_t *sweep,
                   size_t sweep_bytes, double idle_s, double *sec, uint64_t *bytes, uint64_t *sink,
                   hkv_err *err)
{
    const int H = KH * g;
    const int64_t ld = (int64_t)(H + 2 * KH) * d, chunk = 4096;
    hkv_tiered_params tp;
    hkv_tiered_params_default(&tp);
    tp.policy = def;
    tp.args = *args;
    tp.score_alone = !shared;
    tp.far_q8 = far_q8;
    const hkv_kv_shape shape = {1, H, KH, d};
    hkv_mem_account mem = {0};
    hkv_kv kv = {0};
    int rc = hkv_kv_tiered_create(&kv, &shape, B + 1, &tp, kn, &mem, err);
    const int64_t cap = n + steps + 2;
    float *qkv = malloc((size_t)chunk * ld * sizeof *qkv);
    float *out = malloc((size_t)chunk * H * d * sizeof *out);
    float *lse = malloc((size_t)chunk * H * sizeof *lse);
    float *qstate = calloc((size_t)(B + 1) * H * d, sizeof *qstate);
    hkv_seg *segs = calloc((size_t)B, sizeof *segs);
    if (!rc && (!qkv || !out || !lse || !qstate || !segs))
        rc = hkv_seterr(err, HKV_E_NOMEM, "bench far: no memory for the rows");
    if (!rc) rc = kv.ops->seq_open(kv.self, 0, cap, err);
    /* as many prompt queries as the policy keeps (seq_open asked it) */
    hkv_policy_env env = {.shape = shape, .n_ctx = cap, .L_init = tp.L_init, .L_local = tp.L_local,
                          .kern = kn, .mem = &mem, .n_threads = threads};
    int64_t nq = def->queries_wanted ? def->queries_wanted(args, &env) : 0;
    uint64_t qrng = 777 + (uint64_t)n;
    for (int64_t p0 = 0; !rc && p0 < n; p0 += chunk) {
        const int64_t m = n - p0 < chunk ? n - p0 : chunk;
        prompt_rows(dir, KH, g, d, p0, m, n, nq, 12345 + (uint64_t)n, &qrng, qstate, qkv, threads);
        hkv_seg sg = {.seq = 0, .pos = p0, .row = 0, .n = (int32_t)m,
                      .flags = HKV_SEG_STORE_ONLY | (p0 + m == n ? HKV_SEG_PROMPT_END : HKV_SEG_PROMPT)};
        rc = kv.ops->layer_step_far(kv.self, 0, &sg, 1, qkv, ld, out, (int64_t)H * d, lse, NULL, err);
    }
    for (int b = 1; !rc && b <= B; b++) {   /* the batch: copies of the prompt */
        if (!(rc = kv.ops->seq_open(kv.self, b, cap, err))) rc = kv.ops->seq_copy(kv.self, b, 0, err);
    }
    *sec = 0, *bytes = 0;
    dev_recall drc = {0};
    hkv_recall_rows rrows;
    for (long long step = 0; step <= steps && !rc; step++) {
        for (int b = 0; b < B; b++) {
            decode_row(dir, KH, g, d, &qrng, qstate + (size_t)(b + 1) * H * d, qkv + b * ld);
            segs[b] = (hkv_seg){.seq = b + 1, .pos = n + step, .row = b, .n = 1};
        }
        const hkv_recall_rows *use = NULL;
        if (dev_rec && (rc = device_recall(&kv, kn, segs, B, qkv, ld, KH, g, d, &drc, &rrows, &use, err)))
            break;
        if (sweep) *sink ^= sweep_caches(sweep, sweep_bytes, threads);
        /* the pipeline's host polls the device's event while the team idles
         * in the OpenMP runtime's wait: past its spin the workers sleep and
         * the step pays their wake */
        for (const double until = omp_get_wtime() + idle_s; idle_s > 0 && omp_get_wtime() < until;) {
        }
        const uint64_t r0 = hkv_kv_tiered_bytes_read(&kv);
        const double t0 = omp_get_wtime();
        rc = kv.ops->layer_step_far(kv.self, 0, segs, B, qkv, ld, out, (int64_t)H * d, lse, use, err);
        const double dt = omp_get_wtime() - t0;
        if (step > 0) *sec += dt, *bytes += hkv_kv_tiered_bytes_read(&kv) - r0;   /* step 0 warms */
    }
    if (kv.ops) kv.ops->destroy(kv.self);
    dev_recall_free(&drc);
    free(qkv), free(out), free(lse), free(qstate), free(segs);
    return rc;
}

static const char far_usage[] =
    "usage: hetkv bench far [options]\n\n"
    "The host's far step of one layer (select + sparse attention for every\n"
    "sequence and KV head) on synthetic clustered keys, against a bandwidth probe\n"
    "of the same run (default: Llama-3-8B's 8 KV heads, g 4, d 128), each step\n"
    "after a sweep of the last-level caches as the pipeline's other layers make.\n\n";

typedef struct far_opts {
    long long ctxs[FAR_MAXL], batches[FAR_MAXL];
    int n_ctx, n_batch;
    long long steps, KH, g, d;
    const char *configs, *scoring, *recall;
    int warm;
    double idle_us;
    hkv_exec_cli x;
    hkv_output_cli out;
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
             "(default ctkvr;ctkvr:sketch=2); far=q8: over the 8-bit far tier"},
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
    {.name = "--recall", .arg = "device|host", .kind = HKV_OPT_STR, .off = offsetof(far_opts, recall),
     .help = "where a policy with a device part recalls (ctkvr's centroids):\n"
             "device (default: made before the timed step, as the pipeline's\n"
             "GPU makes it) or host (the CPU path's recall, timed and counted)"},
    {.name = "--warm", .kind = HKV_OPT_FLAG, .off = offsetof(far_opts, warm),
     .help = "no sweep of the caches before each step: one layer's rows stay\n"
             "cached between steps (in the pipeline 31 other layers evict them)"},
    {.name = "--idle-us", .arg = "US", .kind = HKV_OPT_FLOAT, .off = offsetof(far_opts, idle_us),
     .lo = 0, .hi = 1e6,
     .help = "the calling thread polls US microseconds before each step, the\n"
             "other threads idle, as the pipeline's host waits for the device's\n"
             "rows (default 0: the team comes hot from the sweep); against 0 it\n"
             "times the team's wake (plan --predict --host-wake-us)"},
    {0},
};

/* One measured row (docs/BENCH_ROWS.md, "bench far"). */
static json_t *far_json_row(const char *config, long long ctx, long long batch, int threads,
                            const char *isa, int shared, int dev_rec, int warm, double idle_us,
                            long long KH, long long g, long long d, long long steps, double step_s,
                            double bytes, double probe, double gather, double fma)
{
    char date[32];
    hkv_rows_date(date, sizeof date);
    const double gbs = bytes / step_s / 1e9;
    return json_pack("{s:o, s:I, s:I, s:i, s:s, s:s, s:s, s:b, s:f, s:I, s:I, s:I, s:I, s:f, s:f, "
                     "s:f, s:f, s:o, s:f, s:o, s:o, s:f, s:s, s:s}",
                     "config", hkv_jstr(config), "ctx", (json_int_t)ctx, "batch", (json_int_t)batch,
                     "threads", threads, "isa", isa, "scoring", shared ? "shared" : "alone",
                     "recall", dev_rec ? "device" : "host", "warm", warm, "idle_us", idle_us,
                     "kv_heads", (json_int_t)KH, "group", (json_int_t)g, "head_dim", (json_int_t)d,
                     "steps", (json_int_t)steps, "step_ms", step_s * 1e3, "bytes_per_step", bytes,
                     "gbs", gbs, "frac_of_probe", probe > 0 ? gbs * 1e9 / probe : 0.0,
                     "frac_of_gather", gather > 0 ? json_real(gbs * 1e9 / gather) : json_null(),
                     "probe_gbs", probe / 1e9, "gather_gbs", gather > 0 ? json_real(gather / 1e9) : json_null(),
                     "fma_gflops", fma > 0 ? json_real(fma / 1e9) : json_null(),
                     "tok_s_32_layers", (double)batch / (32.0 * step_s), "commit", hkv_build_commit(),
                     "date", date);
}

int hkv_bench_far_main(int argc, char **argv)
{
    hkv_err err;
    hkv_err_clear(&err);
    far_opts o = {.ctxs = {32768, 98304}, .batches = {1, 4}, .n_ctx = 2, .n_batch = 2, .steps = 8,
                  .KH = 8, .g = 4, .d = 128, .configs = "ctkvr;ctkvr:sketch=2", .scoring = "shared",
                  .recall = "device"};
    hkv_exec_cli_init(&o.x);
    const hkv_opt_use uses[] = {
        {.opts = far_opts_table, .base = &o},
        {.opts = hkv_exec_opts, .base = &o.x},
        {.opts = hkv_output_opts, .base = &o.out},
    };
    int rc = hkv_opts_parse("bench far", uses, 3, argc, argv, &err);
    if (rc == 1) {
        hkv_opts_help(stdout, far_usage, uses, 3);
        return 0;
    }
    const int rows_fmt = o.out.json ? HKV_ROWS_JSON : o.out.rows_fmt;
    FILE *tf = rows_fmt ? stderr : stdout;   /* the table; stdout is the rows' */
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
    if (!rc && strcmp(o.recall, "device") && strcmp(o.recall, "host"))
        rc = hkv_seterr(&err, HKV_E_INVAL, "--recall '%s': device or host", o.recall);
    if (rc) {
        hkv_err_report(&err, stderr);
        return 2;
    }
    const int dev_rec = !strcmp(o.recall, "device");
    const long long *ctxs = o.ctxs, *batches = o.batches, steps = o.steps, threads = o.x.threads;
    const long long KH = o.KH, g = o.g, d = o.d;
    const int n_ctx = o.n_ctx, n_batch = o.n_batch;
    const char *configs = o.configs;
    if (threads > 0) omp_set_num_threads((int)threads);
    const int T = omp_get_max_threads();
    hkv_cpu_kernels kn;
    hkv_cpu_kernels_init(&kn, o.x.isa < 0 ? HKV_ISA_AVX512 : o.x.isa);   /* (the best the CPU has) */
    json_t *rows = rows_fmt ? json_array() : NULL;
    if (rows_fmt && !rows) {
        fprintf(stderr, "hetkv: error: bench far: no memory for the rows\n");
        return 1;
    }

    const double probe = hkv_bandwidth_probe((size_t)1 << 30, 5);
    const double gather = hkv_gather_probe((size_t)1 << 30, (int)(2 * d), 5);
    /* the compute ceiling too: a row far below both probes on a host whose
     * vector units run below their usual rate (a shared or throttled VM)
     * says so in its header rather than looking like a kernel's fault */
    hkv_peak pk = {0};
    const double fma = hkv_compute_peak(&pk, kn.isa, 3) ? 0 : pk.fp32_flops;
    /* twice the last-level caches, at least 64 MiB (512 MiB when hwloc does not say) */
    hkv_topo_info topo;
    size_t sweep_bytes = 0;
    uint64_t *sweep = NULL, sink = 0;
    if (!o.warm) {
        const unsigned long long llc = hkv_topo_query(&topo, NULL) == HKV_OK ? topo.llc_bytes : 0;
        sweep_bytes = llc ? 2 * (size_t)llc : (size_t)512 << 20;
        if (sweep_bytes < ((size_t)64 << 20)) sweep_bytes = (size_t)64 << 20;
        if (!(sweep = malloc(sweep_bytes))) {
            fprintf(stderr, "hetkv: error: bench far: no memory for a %.0f MiB cache sweep "
                    "(--warm runs without one)\n", sweep_bytes / 1048576.0);
            json_decref(rows);
            return 1;
        }
        const int64_t nw = (int64_t)(sweep_bytes / 8);
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < nw; i++) sweep[i] = (uint64_t)i;   /* paged in, by every thread */
    }
    fprintf(tf, "bench far: %lld KV heads, g %lld, d %lld; %d threads, %s kernels; probe %.1f GB/s, "
            "gather probe %.1f GB/s (%lld-byte rows), fp32 FMA peak %.0f GFLOP/s; %s\n", KH, g, d, T,
            hkv_isa_name(kn.isa), probe / 1e9, gather / 1e9, 2 * d, fma / 1e9,
            sweep ? "caches swept before each step" : "caches warm");
    fprintf(tf, "(recall of policies with a device part: %s)\n",
            dev_rec ? "the device's, made before each step as the pipeline's GPU makes it"
                    : "the host's own, timed");
    if (sweep) fprintf(tf, "(sweep: %.0f MiB, twice the last-level caches)\n", sweep_bytes / 1048576.0);
    if (o.idle_us > 0)
        fprintf(tf, "(before each step the calling thread polls %.0f us, the other threads idle, as "
                "the pipeline's host waits for the device: the team's wake is in the step)\n", o.idle_us);
    fprintf(tf, "%-34s %7s %5s | %9s %9s %8s %6s %6s | %12s\n", "config", "ctx", "batch", "step ms",
            "MB/step", "GB/s", "probe", "gather", "tok/s (x32)");
    float *dir = malloc((size_t)KH * FAR_CLUSTERS * d * 4);
    if (!dir) {
        fprintf(stderr, "hetkv: error: bench far: no memory\n");
        free(sweep);
        json_decref(rows);
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
        int far_q8 = 0;   /* far=q8: the 8-bit far tier (not a policy parameter) */
        for (char *s2 = NULL, *kv = strtok_r(kvs, ",", &s2); kv && !rc; kv = strtok_r(NULL, ",", &s2)) {
            if (!strncmp(kv, "far=", 4)) {
                rc = hkv_far_kv_parse("bench far --configs", kv + 4, &far_q8, &err);
                continue;
            }
            rc = hkv_policy_arg_set(def, &args, kv, &err);
        }
        if (rc) {
            hkv_err_report(&err, stderr);
            break;
        }
        for (int ci = 0; ci < n_ctx && !rc; ci++)
            for (int bi = 0; bi < n_batch && !rc; bi++)
            for (int mi = 0; mi < n_modes && !rc; mi++) {
                const int shared = modes[mi] && T > 1;
                double t = 0;
                uint64_t bytes = 0;
                rc = far_row(&kn, dir, (int)KH, (int)g, (int)d, ctxs[ci], (int)batches[bi], steps,
                             def, &args, far_q8, shared, T, dev_rec, sweep, sweep_bytes,
                             o.idle_us * 1e-6, &t, &bytes,
                             &sink, &err);
                if (!rc) {
                    const double st_s = t / (double)steps, mb = (double)bytes / (double)steps;
                    char label[96];
                    snprintf(label, sizeof label, "%s%s", one, n_modes > 1 && !shared ? " [alone]" : "");
                    fprintf(tf, "%-34s %7lld %5lld | %9.3f %9.1f %8.1f %5.0f%% %5.0f%% | %12.1f\n",
                            label, ctxs[ci], batches[bi], st_s * 1e3, mb / 1e6, mb / st_s / 1e9,
                            100 * mb / st_s / probe, gather > 0 ? 100 * mb / st_s / gather : 0.0,
                            (double)batches[bi] / (32.0 * st_s));
                    fflush(tf);
                }
                if (!rc && rows) {
                    json_t *r = far_json_row(one, ctxs[ci], batches[bi], T, hkv_isa_name(kn.isa), shared,
                                             dev_rec, o.warm, o.idle_us, KH, g, d, steps,
                                             t / (double)steps, (double)bytes / (double)steps, probe,
                                             gather, fma);
                    if (!r || json_array_append_new(rows, r))
                        rc = hkv_seterr(&err, HKV_E_NOMEM, "bench far: no memory for a row");
                    else if (rows_fmt == HKV_ROWS_JSONL) {   /* each row as it is measured */
                        json_t *one_row = json_array();
                        if (!one_row || json_array_append(one_row, r))
                            rc = hkv_seterr(&err, HKV_E_NOMEM, "bench far: no memory for a row");
                        else
                            rc = hkv_rows_write(stdout, rows_fmt, one_row, &err);
                        json_decref(one_row);
                        fflush(stdout);
                    }
                }
            }
    }
    free(dir);
    free(sweep);
    if (sink == 1) fprintf(stderr, "\n");   /* (keeps the sweeps' reads) */
    /* the rows measured, also when a later one failed */
    if (rows && rows_fmt != HKV_ROWS_JSONL && json_array_size(rows)) {
        hkv_err werr;
        hkv_err_clear(&werr);
        if (hkv_rows_write(stdout, rows_fmt, rows, &werr) && !rc) rc = 1, err = werr;
    }
    json_decref(rows);
    if (rc) {
        hkv_err_report(&err, stderr);
        return 1;
    }
    return 0;
}
