/* hetkv bench: prefill and decode tokens/s per (context, batch), with the
 * bytes each decode step must read (weights + KV) over the step time, beside
 * a memory-bandwidth probe measured in the same process. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_kernels.h"
#include "peak.h"
#include "cli.h"
#include "cuda_backend.h"
#include "device.h"
#include "cli_configs.h"
#include "policy.h"
#include "cli_rows.h"
#include "generate.h"
#include "kv_tiered.h"
#include "lookahead.h"

static const char bench_usage[] =
    "usage: hetkv bench (-m MODEL | --synthetic NAME) [options]\n"
    "       hetkv bench kernels [--quick] [--hot] [--isa NAME]   (hetkv bench kernels --help)\n"
    "       hetkv bench kernels --device cuda [--quick] [--json]   (the gpu/ kernels on the device)\n"
    "       hetkv bench far [--ctx LIST] [--batch LIST] [--configs SPEC]   (the host's far step of a layer)\n"
    "\n"
    "Prefill a synthetic prompt of each context length once, fork it into B\n"
    "sequences and time batched decode steps. Reports tokens/s, the bytes a\n"
    "step reads (weights + KV) per second, and a bandwidth probe run in the\n"
    "same process.\n"
    "\n"
    "Rows (-o): one per measured point (model, policy and parameters, budget, context,\n"
    "batch, threads, ISA, device, commit, probe, date; docs/BENCH_ROWS.md).\n"
    "\n";

#define MAXL 16

/* bench's options as parsed (the shared groups' structs among them). */
typedef struct bench_opts {
    const char *model, *configs, *budgets;
    long long ctxs[MAXL], batches[MAXL];
    int n_ctx, n_batch, admit_only, cpu_time, shared_prefix;
    long long steps, probe_mib, chunk;
    hkv_exec_cli x;
    hkv_output_cli out;
    hkv_kv_cli kv;
    hkv_device_cli dev;
} bench_opts;

/* Wall time, or (--cpu-time) the process's CPU time, all threads. */
static double bench_clock(int cpu)
{
    if (!cpu) return hkv_now();
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const hkv_opt bench_opts_table[] = {
    {.name = "--ctx", .arg = "LIST", .kind = HKV_OPT_LIST, .off = offsetof(bench_opts, ctxs),
     .n_off = offsetof(bench_opts, n_ctx), .cap = MAXL, .lo = 1, .hi = 1 << 24,
     .help = "context lengths (default 1024,8192)"},
    {.name = "--batch", .arg = "LIST", .kind = HKV_OPT_LIST, .off = offsetof(bench_opts, batches),
     .n_off = offsetof(bench_opts, n_batch), .cap = MAXL, .lo = 1, .hi = 4095,
     .help = "batch sizes (default 1,8)"},
    {.name = "--steps", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(bench_opts, steps),
     .lo = 1, .hi = 100000, .help = "timed decode steps per point (default 32)"},
    {.name = "--chunk", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(bench_opts, chunk),
     .lo = 1, .hi = 65536,
     .help = "prompt rows per forward call of the prefill (default 256); larger\n"
             "chunks feed the device's prompt attention and products more rows"},
    {.name = "--probe-mib", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(bench_opts, probe_mib),
     .lo = 16, .hi = 1 << 20,
     .help = "bandwidth probe buffer (default 1024); compute peaks (int8,\n"
             "bf16, fp32 dot products) are measured beside it"},
    {.name = "--configs", .arg = "SPEC", .kind = HKV_OPT_STR, .off = offsetof(bench_opts, configs),
     .help = "KV policies measured side by side on the same prefilled\n"
             "prompt, ';'-separated policy:key=val,... (as hetkv eval;\n"
             "default: the --policy options, else full). A policy that\n"
             "prefills on its own (fastkv) gets its own fresh prefill,\n"
             "reported as time to first token beside full's"},
    {.name = "--budgets", .arg = "LIST", .kind = HKV_OPT_STR, .off = offsetof(bench_opts, budgets),
     .help = "budgets as a sweep axis, e.g. 1%,3%,10%,1024: every config whose\n"
             "policy takes a budget and sets none is run at each (default\n"
             "configs then: full;ctkvr;quest;snapkv)"},
    {.name = "--cpu-time", .kind = HKV_OPT_FLAG, .off = offsetof(bench_opts, cpu_time),
     .help = "time the prefill and the decode steps in the process's CPU time, not\n"
             "wall time: tokens per CPU-second, steady on a shared machine (with\n"
             "-t 1; more threads add their spin at the joins)"},
    {.name = "--shared-prefix", .kind = HKV_OPT_FLAG, .off = offsetof(bench_opts, shared_prefix),
     .help = "the batch's sequences share the prompt's KV by reference (one copy\n"
             "in host memory, its attention under full read once a step for\n"
             "all of them) instead of each holding a copy; the rows report the\n"
             "KV bytes held either way"},
    {.name = "--admit-only", .kind = HKV_OPT_FLAG, .off = offsetof(bench_opts, admit_only),
     .help = "check that the GPU memory plan admits every configuration at\n"
             "the largest context and batch, then exit (0: admitted, 1: refused,\n"
             "naming what each tier needs); nothing is loaded"},
    {0},
};

static int bench_uses(bench_opts *o, hkv_opt_use *u) {
    int n = 0;
    u[n++] = (hkv_opt_use){.opts = hkv_model_opts, .base = &o->model};
    u[n++] = (hkv_opt_use){.opts = bench_opts_table, .base = o};
    u[n++] = (hkv_opt_use){.opts = hkv_exec_opts, .base = &o->x};
    u[n++] = (hkv_opt_use){.opts = hkv_output_opts, .base = &o->out};
    u[n++] = (hkv_opt_use){.opts = hkv_kv_opts, .base = &o->kv, .title = "KV cache"};
    u[n++] = (hkv_opt_use){.opts = hkv_device_opts, .base = &o->dev, .title = "Device"};
    return n;
}

typedef struct point {
    long long ctx, batch;
    char config[HKV_SPEC_LEN];
    const char *policy;    /* the policy's name */
    const char *spec;      /* the configuration as written ("ctkvr:rho_p=3%") */
    int64_t budget;        /* its resolved budget, tokens; 0: none */
    int dense_full;        /* measured under the full policy: the speedup reference */
    double prefill_tok_s, step_s, decode_tok_s, bytes_per_step, gbs, matmul_frac, attn_frac, vs_full;
    int measured;   /* bytes_per_step counted by the cache (the host path), not a formula */
    double host_bytes_step; /* K/V rows and index bytes the host's attention read a step (the
                             * tiered cache's counter; on the device path: the far part) */
    double ttft_s;         /* time to first token (prefill + first token); < 0: not measured */
    double fork_s;         /* the batch's first sequence: copy of the prompt and policy build */
    double kv_held;        /* host bytes of the near and far tiers with the batch open */
    int shared_prefix;     /* the batch shared the prompt by reference (--shared-prefix) */
    int resident;          /* --policy auto: sequences of the batch placed whole on the device
                              (full in resident slots), the rest the split's ctkvr */
    int far_q8;            /* the batch's far tier was 8-bit (--far-kv q8, a config's far=q8) */
    int has_pl;            /* --device cuda: the pipeline's timeline over the decode steps */
    hkv_pipeline_stats pl;
    int has_pre;           /* and over the shared prefill (where the prompt was attended) */
    hkv_pipeline_stats pre;
} point;

static void synth_prompt(int32_t *t, int64_t n, int vocab) {
    uint64_t s = 0x9e3779b97f4a7c15ULL;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        t[i] = (int32_t)((s >> 33) % (uint64_t)vocab);
    }
}

static size_t model_weight_bytes(const hkv_model *m) {
    size_t b = hkv_wmat_bytes(&m->output);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const hkv_layer_weights *L = &m->layers[l];
        for (int i = 0; i < L->n_qkv; i++) b += hkv_wmat_bytes(&L->qkv[i]);
        for (int i = 0; i < L->n_ffn_in; i++) b += hkv_wmat_bytes(&L->ffn_in[i]);
        b += hkv_wmat_bytes(&L->wo) + hkv_wmat_bytes(&L->wdown);
    }
    return b;
}

/* What every row shares: the run's model, threads, device and probe. */
typedef struct row_ctx {
    const char *model_name, *model_file, *isa, *precision, *device;
    char date[32];
    long long steps, chunk;
    int threads;
    double probe;
    uint64_t gpu_mem;   /* the --gpu-mem cap, bytes; 0: none */
} row_ctx;

/* One measured point as a flat, self-describing row (docs/BENCH_ROWS.md). */
/* The device's and the host's admission of one configuration (NULL: the
 * run's own policy) at a batch: its policy, and its far= format. aside: the
 * prompt's sequence is held beside the batch (its forks' source), so the
 * host and the device hold batch + 1 sequences, counted as one more fork.
 * The configuration's budget is resolved at n_ctx, as its rows run it: ctkvr's
 * IVF lists grow with it (at rho_p 3% of 96K, 15.5 GB a sequence where the
 * default's are 5.4), and the admission before this counted the default's. */
static int bench_admit(const hkv_device_cli *dc, const char *model, const hkv_engine_params *ep,
                       const hkv_config *c, long long batch, int aside, int64_t n_ctx, hkv_err *err) {
    hkv_engine_params cp = *ep;
    int rc;
    if (c) {
        int64_t budget, far = n_ctx - ep->tiered.L_init - ep->tiered.L_local;
        if ((rc = hkv_config_resolve(c, n_ctx, far > 0 ? far : 0, &cp.tiered.args, &budget, NULL, 0,
                                     err)))
            return rc;
        cp.tiered.policy = c->def;
        if (c->far_set) cp.tiered.far_q8 = c->far_q8;   /* its forks' format */
    }
    rc = hkv_device_cli_check(dc, model, &cp, (int)(batch + aside), n_ctx, err);
    if (rc && aside)
        hkv_err_prefix(err, "the prompt's sequence is held beside the batch's %lld fork%s", batch,
                       batch == 1 ? "" : "s");
    return rc;
}

static json_t *point_row(const point *q, const row_ctx *x) {
    const int dense = q->bytes_per_step > 0;
    json_t *r = json_object();
    if (!r) return NULL;
    json_object_set_new(r, "model", json_string(x->model_name));
    json_object_set_new(r, "model_file", json_string(x->model_file));
    json_object_set_new(r, "config", json_string(q->config));
    json_object_set_new(r, "spec", json_string(q->spec));
    json_object_set_new(r, "policy", json_string(q->policy));
    json_object_set_new(r, "budget", q->budget > 0 ? json_integer(q->budget) : json_null());
    json_object_set_new(r, "ctx", json_integer(q->ctx));
    json_object_set_new(r, "batch", json_integer(q->batch));
    json_object_set_new(r, "steps", json_integer(x->steps));
    json_object_set_new(r, "threads", json_integer(x->threads));
    json_object_set_new(r, "isa", json_string(x->isa));
    json_object_set_new(r, "precision", json_string(x->precision));
    json_object_set_new(r, "device", json_string(x->device));
    json_object_set_new(r, "commit", json_string(hkv_build_commit()));
    json_object_set_new(r, "date", json_string(x->date));
    json_object_set_new(r, "probe_gbs", json_real(x->probe / 1e9));
    json_object_set_new(r, "prefill_tok_s", json_real(q->prefill_tok_s));
    json_object_set_new(r, "decode_tok_s", json_real(q->decode_tok_s));
    json_object_set_new(r, "step_ms", json_real(q->step_s * 1e3));
    /* the device path's selection policies: not counted (null, not 0) */
    json_object_set_new(r, "bytes_per_step", dense ? json_real(q->bytes_per_step) : json_null());
    json_object_set_new(r, "bytes_counted", json_boolean(q->measured));
    json_object_set_new(r, "gbs", dense ? json_real(q->gbs) : json_null());
    json_object_set_new(r, "frac_of_probe",
                        dense && x->probe > 0 ? json_real(q->gbs * 1e9 / x->probe) : json_null());
    json_object_set_new(r, "matmul_frac", json_real(q->matmul_frac));
    json_object_set_new(r, "attn_frac", json_real(q->attn_frac));
    json_object_set_new(r, "vs_full", q->vs_full > 0 ? json_real(q->vs_full) : json_null());
    json_object_set_new(r, "ttft_s", q->ttft_s >= 0 ? json_real(q->ttft_s) : json_null());
    json_object_set_new(r, "fork_s", json_real(q->fork_s));
    json_object_set_new(r, "kv_host_bytes", json_real(q->kv_held));
    json_object_set_new(r, "shared_prefix", json_boolean(q->shared_prefix));
    json_object_set_new(r, "resident_seqs", json_integer(q->resident));
    json_object_set_new(r, "far_kv", json_string(q->far_q8 ? "q8" : "f16"));
    json_object_set_new(r, "chunk", json_integer(x->chunk));
    json_object_set_new(r, "gpu_mem", x->gpu_mem > 0 ? json_integer((json_int_t)x->gpu_mem) : json_null());
    /* the host's reads a token, and the tokens/s the probe allows at that rate */
    const double hbt = q->batch > 0 ? q->host_bytes_step / (double)q->batch : 0;
    json_object_set_new(r, "host_bytes_per_step", json_real(q->host_bytes_step));
    json_object_set_new(r, "host_bytes_per_token", json_real(hbt));
    json_object_set_new(r, "host_roofline_tok_s", hbt > 0 ? json_real(x->probe / hbt) : json_null());
    const hkv_pipeline_stats *pl = q->has_pl ? &q->pl : NULL;
    /* the device's timeline per timed decode step (null on the CPU path) */
    const double ns = (double)x->steps;
#define PL(name, expr) json_object_set_new(r, name, pl ? json_real((expr) / ns) : json_null())
    PL("dev_cpu_busy_ms", pl->cpu_busy * 1e3);
    PL("dev_cpu_wait_ms", pl->cpu_wait_dev * 1e3);
    PL("dev_cpu_waits", (double)pl->host_waits);
    PL("dev_cpu_waits_slept", (double)pl->host_waits_slept);
    PL("dev_wait_cpu_ms", pl->dev_wait_cpu * 1e3);
    PL("dev_near_ms", pl->dev_near * 1e3);
    PL("dev_products_ms", pl->dev_products * 1e3);
    PL("dev_total_ms", pl->dev_total * 1e3);
    PL("dev_h2d_mb", pl->bytes_h2d / 1e6);
    PL("dev_d2h_mb", pl->bytes_d2h / 1e6);
#undef PL
    const hkv_pipeline_stats *pp = q->has_pre ? &q->pre : NULL;   /* the shared prefill */
    json_object_set_new(r, "prefill_h2d_gb", pp ? json_real(pp->bytes_h2d / 1e9) : json_null());
    json_object_set_new(r, "prefill_rows_streamed",
                        pp ? json_integer(pp->prompt_rows_streamed) : json_null());
    /* work the device offers done by the host instead, the prefill's and the timed
     * steps' (by reason in the --json timelines) */
    /* timed steps replayed as one CUDA graph (pipeline/cuda_graph.c) */
    json_object_set_new(r, "dev_graph_steps", pl ? json_integer(pl->graph_steps) : json_null());
    json_object_set_new(r, "dev_fallbacks",
                        pl || pp ? json_integer((pl ? hkv_device_fallbacks_total(pl) : 0) +
                                                (pp ? hkv_device_fallbacks_total(pp) : 0))
                                 : json_null());
    return r;
}

int hkv_cmd_bench(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "kernels")) return hkv_bench_kernels_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "far")) return hkv_bench_far_main(argc - 1, argv + 1);
    hkv_err err;
    hkv_err_clear(&err);
    bench_opts o = {.ctxs = {1024, 8192}, .batches = {1, 8}, .n_ctx = 2, .n_batch = 2,
                    .steps = 32, .probe_mib = 1024, .chunk = 256};
    hkv_exec_cli_init(&o.x);
    hkv_kv_cli_init(&o.kv);
    hkv_device_cli_init(&o.dev);
    hkv_opt_use uses[8];
    const int n_uses = bench_uses(&o, uses);
    int rc = hkv_opts_parse("bench", uses, n_uses, argc, argv, &err);
    if (rc == 1) {
        hkv_opts_help(stdout, bench_usage, uses, n_uses);
        return 0;
    }
    /* the names the measuring code below was written with */
    const char *model = o.model, *configs = o.configs, *budgets = o.budgets;
    const long long *ctxs = o.ctxs;
    long long *batches = o.batches;   /* less the batches refused at admission */
    const int n_ctx = o.n_ctx, isa = o.x.isa;
    int n_batch = o.n_batch;
    int json = o.out.json;
    const int rows_fmt = o.out.rows_fmt, admit_only = o.admit_only;
    const long long steps = o.steps, threads = o.x.threads, probe_mib = o.probe_mib, chunk = o.chunk;
    hkv_kv_cli kc = o.kv;
    hkv_device_cli dc = o.dev;
    hkv_config cfg[HKV_MAX_CONFIGS];
    int n_cfg = 0;
    if (!rc && !model && !dc.synthetic)
        rc = hkv_seterr(&err, HKV_E_INVAL, "bench: no model (-m MODEL or --synthetic NAME)");
    if (rc) {
        hkv_err_report(&err, stderr);
        return 2;
    }
    long long max_ctx = 0, max_batch = 0;
    for (int i = 0; i < n_ctx; i++) max_ctx = ctxs[i] > max_ctx ? ctxs[i] : max_ctx;
    for (int i = 0; i < n_batch; i++) max_batch = batches[i] > max_batch ? batches[i] : max_batch;
    /* --shared-prefix: the batch's far tiers hold the prompt once (kv_prefix.h);
     * --local N: a full configuration keeps a far tier on the host */
    dc.shared_rows = o.shared_prefix ? max_ctx : 0;
    dc.full_split = kc.local >= 0;

    hkv_engine_params ep;
    hkv_engine_params_default(&ep);
    if (!rc) rc = hkv_device_cli_apply(&dc, model, &ep, &err);
    ep.n_threads = (int)threads;
    ep.isa = isa;
    ep.max_seqs = (int)max_batch + 1;     /* seq 0 keeps the prefilled prompt */
    ep.n_ctx = max_ctx + steps + 1;
    ep.max_rows = (int)chunk;
    if (!rc) rc = hkv_kv_cli_apply(&kc, &ep, &err);
    if (!rc && configs && (kc.policy || kc.n_pargs || kc.kv))
        rc = hkv_seterr(&err, HKV_E_INVAL, "bench: give --configs or --policy/--kv, not both");
    if (!rc && budgets && !configs) configs = "full;ctkvr;quest;snapkv";
    if (!rc && configs) rc = hkv_configs_parse(configs, cfg, &n_cfg, HKV_MAX_CONFIGS, &err);
    for (int i = 0; !rc && i < n_cfg; i++)   /* a fork's format: the prompt's sequence is one */
        if (cfg[i].far_set && cfg[i].far_q8 != kc.far_q8 && (ep.kv_plain || kc.kv))
            rc = hkv_seterr(&err, HKV_E_INVAL, "bench: '%s': far= needs the tiered cache", cfg[i].spec);
    if (!rc && budgets) rc = hkv_configs_cross_budgets(cfg, &n_cfg, HKV_MAX_CONFIGS, budgets, &err);
    if (!rc && configs) {
        /* Keep as many prompt queries as the hungriest policy builds from. */
        hkv_policy_env env = {.n_ctx = max_ctx + steps + 1};
        for (int i = 0; i < n_cfg; i++)
            if (cfg[i].def->queries_wanted) {
                int64_t w = cfg[i].def->queries_wanted(&cfg[i].args, &env);
                if (w > ep.tiered.keep_queries) ep.tiered.keep_queries = w;
            }
    }
    if (rc) {
        hkv_err_report(&err, stderr);
        return 2;
    }
    /* One configuration at one batch size: the prompt's own sequence is the
     * batch's first, so the device holds B sequences, not B + 1 (a dense
     * baseline whose whole context fits the cap once, not twice). */
    const hkv_policy_def *only = configs ? (n_cfg == 1 ? cfg[0].def : NULL) : ep.tiered.policy;
    const int in_place = !ep.kv_plain && n_batch == 1 && only && only->prep == HKV_PREP_NONE;
    if (in_place) ep.max_seqs = (int)max_batch;
    /* --device cuda and only full measured: the whole context near when it
     * fits (hkv_device_cli_check_near), as run, batch and serve do.
     * --device cuda: the device and the plan's admission of every
     * configuration, before anything is loaded (a refusal wins); cpu: OK.
     * A largest batch that the device or the host cannot hold is refused,
     * named with the reason, and the smaller ones are measured. */
    int all_full = !ep.kv_plain && !strcmp(ep.tiered.policy->name, "full");
    for (int i = 0; configs && i < n_cfg; i++) all_full &= !strcmp(cfg[i].def->name, "full");
    const int local0 = ep.tiered.L_local;
    /* --policy auto on a device: placed as run and batch place (dense when the
     * batch x context fits, else ctkvr in the split and as many sequences at a
     * time as fit whole on the device: the batch's first ones, full) */
    const int placing = !configs && dc.cuda && kc.policy && !strcmp(kc.policy, "auto");
    const int resident_given = dc.resident >= 0;
    /* the largest batch each configuration's plan admits (a config's far=q8
     * holds 0.56x the far tier, so it may run batches the others cannot) */
    long long cfg_max[HKV_MAX_CONFIGS];
    const int n_chk = configs ? n_cfg : 1;
    for (int i = 0; i < n_chk; i++) cfg_max[i] = max_batch;
    for (;;) {
        ep.tiered.L_local = local0;
        if (placing) {   /* each admission from auto's start */
            ep.tiered.policy = &hkv_policy_full;
            hkv_policy_args_init(ep.tiered.policy, &ep.tiered.args);
            if (!resident_given) dc.resident = -1;
        }
        if (all_full)
            rc = hkv_device_cli_check_near(&dc, model, &ep, kc.local >= 0, placing, (int)max_batch,
                                           max_ctx + steps + 1, &err);
        int n_ok = 0;
        hkv_err first;   /* a refusal's reason, for when every configuration is refused */
        hkv_err_clear(&first);
        for (int i = 0; !rc && i < n_chk; i++) {
            int ri = bench_admit(&dc, model, &ep, configs ? &cfg[i] : NULL, max_batch, !in_place,
                                 max_ctx + steps + 1, &err);
            if (ri == HKV_OK) n_ok++;
            else if (ri != HKV_E_CAPACITY) rc = ri;
            else if (!first.code) first = err;
            if (ri != HKV_OK && ri != HKV_E_CAPACITY) break;
            hkv_err_clear(&err);
        }
        if (!rc && !n_ok) rc = HKV_E_CAPACITY, err = first;   /* refused for all: as before */
        for (int i = 0; !rc && n_ok < n_chk && i < n_chk; i++)
            /* refused for some: each of those down to the largest batch it holds */
            while (cfg_max[i] > 0 && bench_admit(&dc, model, &ep, &cfg[i], cfg_max[i], !in_place,
                                                 max_ctx + steps + 1, &err) == HKV_E_CAPACITY) {
                fprintf(stderr, "hetkv bench: batch %lld refused for '%s': %s\n", cfg_max[i],
                        cfg[i].spec, err.msg);
                hkv_err_clear(&err);
                long long next = 0;   /* the next smaller batch asked for */
                for (int b = 0; b < n_batch; b++)
                    if (batches[b] < cfg_max[i] && batches[b] > next) next = batches[b];
                cfg_max[i] = next;
            }
        if (rc != HKV_E_CAPACITY || n_batch == 1) break;
        fprintf(stderr, "hetkv bench: batch %lld refused: %s\n", max_batch, err.msg);
        hkv_err_clear(&err);
        rc = HKV_OK;
        int k = 0;
        for (int i = 0; i < n_batch; i++)
            if (batches[i] != max_batch) batches[k++] = batches[i];
        n_batch = k;
        max_batch = 0;
        for (int i = 0; i < n_batch; i++) max_batch = batches[i] > max_batch ? batches[i] : max_batch;
        for (int i = 0; i < n_chk; i++) cfg_max[i] = max_batch;
        ep.max_seqs = in_place ? (int)max_batch : (int)max_batch + 1;
    }
    if (rc) {
        hkv_err_report(&err, stderr);
        return 1;
    }
    /* auto's split: how many of a batch run whole on the device */
    const int n_resident = placing && ep.tiered.policy != &hkv_policy_full && dc.resident > 0
                               ? dc.resident : 0;
    hkv_policy_args full_args, split_args = ep.tiered.args;
    hkv_policy_args_init(&hkv_policy_full, &full_args);
    if (admit_only) {
        printf("admitted: context %lld, batch %lld, %s%s\n", max_ctx, max_batch,
               dc.cuda ? "--device cuda" : "--device cpu (nothing to plan)",
               in_place ? ", the prompt's sequence decoding in the batch" : "");
        return 0;
    }
    hkv_engine *e = NULL;
    int n_pcfg = configs ? n_cfg : 1;
    point *pts = calloc((size_t)n_ctx * n_batch * n_pcfg, sizeof *pts);
    int32_t *prompt = malloc((size_t)max_ctx * sizeof(int32_t));
    int32_t *toks = malloc((size_t)(max_batch + 1) * sizeof(int32_t));
    hkv_seg *segs = malloc((size_t)(max_batch + 1) * sizeof(hkv_seg));
    float *logits = NULL, *first = NULL, *first_c = NULL;
    int np = 0;
    if (!pts || !prompt || !toks || !segs) {
        rc = hkv_seterr(&err, HKV_E_NOMEM, "no memory for the benchmark");
        goto out;
    }
    if ((rc = hkv_engine_open(&e, &ep, &err)) || (rc = hkv_device_cli_attach(&dc, e, &err))) goto out;
    const hkv_model_config *c = &e->model.cfg;
    logits = malloc((size_t)(max_batch + 1) * c->vocab * sizeof(float));
    first = malloc((size_t)c->vocab * sizeof(float));
    first_c = malloc((size_t)c->vocab * sizeof(float));
    if (!logits || !first || !first_c) {
        rc = hkv_seterr(&err, HKV_E_NOMEM, "no memory for logits");
        goto out;
    }
    if (!json)
        fprintf(stderr, "hetkv bench: %s, %d threads (%s), %s%s kernels, precision %s%s\n", c->name,
                hkv_threads_count(e->threads), hkv_threads_pinned(e->threads) ? "pinned" : "not pinned",
                hkv_isa_name(e->kern.isa), e->kern.avxvnni ? " (AVX-VNNI)" : "",
                hkv_precision_name(e->kern.precision),
                o.cpu_time ? ", prefill and steps in CPU time (tok/s: per CPU-second)" : "");
    double probe = hkv_bandwidth_probe((size_t)probe_mib << 20, 5);
    hkv_peak peak;   /* the compute roofline beside the bandwidth one, same threads */
    hkv_compute_peak(&peak, e->kern.isa, 5);
    const double wbytes = (double)model_weight_bytes(&e->model);
    const hkv_kv_ops *ops = e->kv.ops;
    synth_prompt(prompt, max_ctx, c->vocab);
    row_ctx rx = {.model_name = c->name, .model_file = model ? model : "synthetic",
                  .isa = hkv_isa_name(e->kern.isa), .precision = hkv_precision_name(e->kern.precision),
                  .device = hkv_backend_is_cuda(&e->be) ? hkv_gpu_backend() : "cpu",
                  .steps = steps, .chunk = e->max_rows, .threads = hkv_threads_count(e->threads),
                  .probe = probe, .gpu_mem = dc.cuda ? dc.gpu_mem : 0};
    hkv_rows_date(rx.date, sizeof rx.date);

    for (int ci = 0; ci < n_ctx; ci++) {
        long long L = ctxs[ci];
        /* the batch in place: the prompt's sequence in its configuration's far format */
        if (in_place && configs && cfg[0].far_set &&
            (rc = hkv_kv_set_far_q8(&e->kv, 0, cfg[0].far_q8, &err)))
            goto out;
        if ((rc = ops->seq_open(e->kv.self, 0, L + steps + 1, &err))) goto out;
        if (hkv_backend_is_cuda(&e->be)) hkv_cuda_backend_stats_reset(&e->be);
        double t0 = bench_clock(o.cpu_time);
        hkv_progress pg;   /* a long prompt's progress on stderr */
        hkv_progress_init(&pg, "prefill", "tokens");
        e->prefill_progress = hkv_progress_prefill;
        e->prefill_progress_ud = &pg;
        rc = hkv_prefill(e, 0, prompt, L, 0, logits, &err);
        e->prefill_progress = NULL;
        double t_pre = bench_clock(o.cpu_time) - t0;
        if (rc) goto out;
        hkv_pipeline_stats pre;   /* the prompt's attention: on the device, streamed, on the host */
        const int has_pre = hkv_backend_is_cuda(&e->be) && !hkv_cuda_backend_stats(&e->be, &pre, &err);
        memcpy(first, logits, (size_t)c->vocab * sizeof *first);   /* for the forks' prep */
        int64_t base = L;   /* where the forks continue (specpc: the compressed length) */
        for (int ci2 = 0; ci2 < n_pcfg; ci2++) {
            hkv_policy_args cargs;
            int64_t budget = 0;
            char label[HKV_SPEC_LEN] = "";
            if (configs) {
                int64_t far = L - ep.tiered.L_init - ep.tiered.L_local;
                if ((rc = hkv_config_resolve(&cfg[ci2], L, far > 0 ? far : 0, &cargs, &budget, label,
                                              sizeof label, &err)))
                    goto out;
            } else {
                snprintf(label, sizeof label, "%s",
                         placing ? "auto" : ep.kv_plain ? "plain" : ep.tiered.policy->name);
            }
            for (int bi = 0; bi < n_batch; bi++) {
                long long B = batches[bi];
                if (B > cfg_max[configs ? ci2 : 0]) continue;   /* refused for this one */
                double t_prep = 0;   /* the first fork's prep (lookahead, draft compression) */
                double t_fork = 0;   /* the first sequence's copy and policy build (its index) */
                const int s0 = in_place ? 0 : 1;   /* the batch is sequences s0 .. s0 + B - 1 */
                const int n_res = n_resident < B ? n_resident : (int)B;
                if (in_place && n_res &&
                    (rc = hkv_kv_set_policy(&e->kv, 0, &hkv_policy_full, &full_args, &err)))
                    goto out;
                if (in_place && configs) {
                    double a = hkv_now();
                    if ((rc = hkv_kv_set_policy(&e->kv, 0, cfg[ci2].def, &cargs, &err))) goto out;
                    t_fork = hkv_now() - a;
                }
                /* The batch's later copies from its first where that is the
                 * same policy over the same rows with nothing to prepare:
                 * their index is then copied rather than built again (kv.h
                 * seq_copy), seconds a sequence at 32K+. The first copy's
                 * build is the one timed. */
                const int prep = configs ? cfg[ci2].def->prep : ep.tiered.policy->prep;
                const int from_first = !in_place && !o.shared_prefix && !n_resident &&
                                       prep == HKV_PREP_NONE;
                for (int s = 1; s < s0 + B; s++) {
                    const double f0 = hkv_now();
                    const int src = from_first && s > 1 ? 1 : 0;
                    if (configs && (rc = hkv_kv_set_policy(&e->kv, s, cfg[ci2].def, &cargs, &err)))
                        goto out;
                    if (n_resident && (rc = s - s0 < n_res
                                                ? hkv_kv_set_policy(&e->kv, s, &hkv_policy_full, &full_args, &err)
                                                : hkv_kv_set_policy(&e->kv, s, ep.tiered.policy, &split_args, &err)))
                        goto out;
                    /* a config's far= format: its forks' rows converted from the prompt's */
                    if (configs && hkv_kv_has_far(&e->kv) &&
                        (rc = hkv_kv_set_far_q8(&e->kv, s, cfg[ci2].far_set ? cfg[ci2].far_q8 : -1,
                                                &err)))
                        goto out;
                    if ((rc = ops->seq_open(e->kv.self, s, L + steps + 1 + hkv_lookahead_room(e, s), &err)) ||
                        (rc = o.shared_prefix ? ops->seq_share(e->kv.self, s, 0, ops->seq_len(e->kv.self, 0), HKV_SHARE_INDEX, &err)
                                            : ops->seq_copy(e->kv.self, s, src, &err)))
                        goto out;
                    if (s == 1 && !in_place) t_fork = hkv_now() - f0;
                    /* the policy's prep on the fork (laq/speckv lookahead, specpc compression) */
                    memcpy(first_c, first, (size_t)c->vocab * sizeof *first);
                    double a = hkv_now();
                    if ((rc = hkv_fork_prep(e, s, prompt, L, first_c, 0, &base, &err))) goto out;
                    if (s == 1) t_prep = hkv_now() - a;
                }
                /* A prefill-kind policy (fastkv's token-selective propagation)
                 * processes the prompt itself, so its forks come from its own
                 * fresh prefill of sequence 1, timed as time to first token.
                 * full's (and, without --configs, the policy's own) is the
                 * shared prefill of sequence 0. */
                double ttft = !configs || cfg[ci2].def == &hkv_policy_full ? t_pre : -1, t_own = t_pre;
                if (configs && cfg[ci2].def->prep == HKV_PREP_TSP) {
                    for (int s = 1; s <= B; s++) {
                        ops->seq_close(e->kv.self, s);
                        if ((rc = ops->seq_open(e->kv.self, s, L + steps + 1, &err))) goto out;
                    }
                    double a = hkv_now();
                    if ((rc = hkv_prefill(e, 1, prompt, L, 0, logits, &err))) goto out;
                    (void)hkv_argmax(logits, c->vocab);   /* the first token */
                    ttft = t_own = hkv_now() - a;
                    for (int s = 2; s <= B; s++)
                        if ((rc = ops->seq_copy(e->kv.self, s, 1, &err))) goto out;
                }
                /* laq/speckv: the shared prefill + the lookahead; specpc: its fork's
                 * prep is the whole of it (draft, then the compressed prefill) */
                if (configs && prep == HKV_PREP_NONE && ttft < 0)
                    ttft = t_pre + t_fork;   /* the prompt, then its index (an upper bound
                                              * when the fork's copy of the prompt is in it) */
                if (prep == HKV_PREP_LOOKAHEAD_TARGET || prep == HKV_PREP_LOOKAHEAD_DRAFT)
                    ttft = t_pre + t_prep;
                else if (prep == HKV_PREP_COMPRESS_DRAFT)
                    ttft = t_own = t_prep;
                hkv_fwd_stats before = e->stats;
                double ts = 0;
                const uint64_t kv_read0 = hkv_kv_tiered_bytes_read(&e->kv);
                for (long long st = 0; st < steps + 1; st++) {
                    for (int s = 0; s < B; s++) {
                        toks[s] = prompt[(L + st * 7 + s) % L];
                        segs[s] = (hkv_seg){.seq = s0 + s, .n = 1, .pos = base + st, .row = s};
                    }
                    int64_t lr[4096];
                    for (int s = 0; s < B; s++) lr[s] = s;
                    double a = bench_clock(o.cpu_time);
                    if ((rc = hkv_forward(e, toks, B, segs, (int)B, lr, (int)B, logits, &err))) goto out;
                    if (st > 0) ts += bench_clock(o.cpu_time) - a;   /* first step warms caches */
                    /* the timeline of the timed steps: the first one's mirror
                     * uploads (a prompt's near tier, whole) are not a step's */
                    if (st == 0) hkv_cuda_backend_stats_reset(&e->be);
                }
                point *p = &pts[np];
                p->has_pl = hkv_backend_is_cuda(&e->be) &&
                            !hkv_cuda_backend_stats(&e->be, &p->pl, &err);
                p->has_pre = has_pre;
                if (has_pre) p->pre = pre;
                np++;
                p->kv_held = (double)e->mem.bytes[HKV_TIER_FAR] + (double)e->mem.bytes[HKV_TIER_NEAR];
                p->shared_prefix = o.shared_prefix;
                p->resident = n_res;
                p->far_q8 = hkv_kv_seq_far_q8(&e->kv, s0);
                for (int s = 1; s < s0 + B; s++) ops->seq_close(e->kv.self, s);
                p->ctx = L;
                p->fork_s = t_fork;
                p->batch = B;
                snprintf(p->config, sizeof p->config, "%s", label);
                p->policy = ep.kv_plain ? "plain" : configs ? cfg[ci2].def->name
                          : n_res == B ? "full" : ep.tiered.policy->name;   /* auto: all placed */
                p->budget = configs ? budget : 0;
                p->spec = configs ? cfg[ci2].spec : p->policy;
                p->prefill_tok_s = L / t_own;
                p->ttft_s = ttft;
                p->step_s = ts / steps;
                p->decode_tok_s = B / p->step_s;
                /* Bytes a step reads: the weights, plus on the host path what the
                 * tiered cache counted (the rows attended, near and far, and what
                 * the policy's selection read: hkv_kv_tiered_bytes_read); the plain
                 * cache and the device path (whose near tier and weights are the
                 * GPU's) by the dense formula, for full only. */
                const hkv_policy_def *pdef = configs ? cfg[ci2].def : ep.tiered.policy;
                int dense = ep.kv_plain || pdef == &hkv_policy_full;
                const int cuda = hkv_backend_is_cuda(&e->be);
                double kv = (double)B * c->n_layer * c->n_head_kv * (L + steps / 2.0) * c->head_dim * 2 * 2;
                p->host_bytes_step = ep.kv_plain ? 0 :
                    (double)(hkv_kv_tiered_bytes_read(&e->kv) - kv_read0) / (double)(steps + 1);
                if (!ep.kv_plain && !cuda) kv = p->host_bytes_step;
                p->measured = !ep.kv_plain && !cuda;
                p->bytes_per_step = dense || p->measured ? wbytes + kv : 0;
                p->gbs = p->bytes_per_step / p->step_s / 1e9;
                p->vs_full = 0;
                p->dense_full = dense && !ep.kv_plain;
                for (int j = 0; j < np - 1; j++)
                    if (pts[j].dense_full && pts[j].ctx == L && pts[j].batch == B)
                        p->vs_full = p->decode_tok_s / pts[j].decode_tok_s;
                double dm = e->stats.matmul - before.matmul, da = e->stats.attn - before.attn;
                double dt = dm + da + (e->stats.other - before.other);
                p->matmul_frac = dt > 0 ? dm / dt : 0;
                p->attn_frac = dt > 0 ? da / dt : 0;
                if (!json) {
                    char rd[128] = "";
                    if (p->bytes_per_step > 0)
                        snprintf(rd, sizeof rd, "reads %7.1f MB/step = %6.2f GB/s (%3.0f%% of probe)",
                                 p->bytes_per_step / 1e6, p->gbs, probe > 0 ? 100 * p->gbs * 1e9 / probe : 0);
                    if (!dense && p->vs_full > 0)
                        snprintf(rd + strlen(rd), sizeof rd - strlen(rd), "%s%.2fx full's tokens/s",
                                 rd[0] ? ", " : "", p->vs_full);
                    char held[32];
                    hkv_fmt_bytes(p->kv_held, held, sizeof held);
                    char placed[64] = "";
                    if (placing && ep.tiered.policy == &hkv_policy_full)
                        snprintf(placed, sizeof placed, " (full: dense, the whole KV on the device)");
                    else if (placing)
                        snprintf(placed, sizeof placed, " (%s; %d of %lld whole on the device)",
                                 p->policy, n_res, B);
                    fprintf(stderr, "%-22s ctx %6lld batch %3lld: prefill %7.1f tok/s | decode %7.1f tok/s, "
                            "step %7.2f ms%s%s; matmul %2.0f%%, attention %2.0f%%; KV held %s%s%s\n",
                            label, L, B, p->prefill_tok_s, p->decode_tok_s, p->step_s * 1e3,
                            rd[0] ? ", " : "", rd,
                            100 * p->matmul_frac, 100 * p->attn_frac, held,
                            o.shared_prefix ? " (prompt shared)" : "", placed);
                    if (configs && ttft >= 0) {
                        double ref_ttft = -1;
                        for (int j = 0; j < np - 1; j++)
                            if (pts[j].dense_full && pts[j].ctx == L && pts[j].batch == B) ref_ttft = pts[j].ttft_s;
                        fprintf(stderr, "%-22s ctx %6lld batch %3lld: time to first token %.2f s", label, L, B, ttft);
                        if (cfg[ci2].def->prep == HKV_PREP_TSP && ref_ttft > 0)
                            fprintf(stderr, ", %.2fx faster than full's %.2f s", ref_ttft / ttft, ref_ttft);
                        else if (cfg[ci2].def->prep != HKV_PREP_NONE && ref_ttft > 0)
                            fprintf(stderr, " (full's %.2f s; x%.2f)", ref_ttft, ttft / ref_ttft);
                        fprintf(stderr, "\n");
                    }
                }
                if (rows_fmt == HKV_ROWS_JSONL) {   /* each row as it is measured: a run
                                                      * stopped part-way keeps its rows */
                    json_t *one = json_array(), *r = point_row(p, &rx);
                    if (!one || !r || json_array_append_new(one, r)) {
                        json_decref(one);
                        rc = hkv_seterr(&err, HKV_E_NOMEM, "no memory for a row");
                        goto out;
                    }
                    rc = hkv_rows_write(stdout, rows_fmt, one, &err);
                    json_decref(one);
                    fflush(stdout);
                    if (rc) goto out;
                }
            }
        }
        ops->seq_close(e->kv.self, 0);
    }
    if (rows_fmt == HKV_ROWS_JSON) json = 1;   /* the one JSON object, as --json */
    if (rows_fmt && rows_fmt != HKV_ROWS_JSON && rows_fmt != HKV_ROWS_JSONL) {
        json_t *rows = json_array();
        for (int i = 0; rows && i < np; i++) {
            json_t *r = point_row(&pts[i], &rx);
            if (!r) break;
            json_array_append_new(rows, r);
        }
        if (!rows) rc = hkv_seterr(&err, HKV_E_NOMEM, "no memory for the rows");
        else rc = hkv_rows_write(stdout, rows_fmt, rows, &err);
        json_decref(rows);
    }
    if (json) {
        int bad = 0;
        json_t *o = json_object();
        hkv_jset(o, "model", hkv_jstr(c->name), &bad);
        hkv_jset(o, "threads", json_integer(hkv_threads_count(e->threads)), &bad);
        hkv_jset(o, "isa", json_string(hkv_isa_name(e->kern.isa)), &bad);
        hkv_jset(o, "precision", json_string(hkv_precision_name(e->kern.precision)), &bad);
        hkv_jset(o, "weight_bytes", hkv_jint(wbytes), &bad);
        hkv_jset(o, "probe_gbs", hkv_jnum(probe / 1e9, "%.3f"), &bad);
        hkv_jset(o, "peak_int8_gops", hkv_jnum(peak.int8_ops / 1e9, "%.1f"), &bad);
        hkv_jset(o, "peak_bf16_gflops", hkv_jnum(peak.bf16_flops / 1e9, "%.1f"), &bad);
        hkv_jset(o, "peak_amx_int8_gops", hkv_jnum(peak.amx_int8_ops / 1e9, "%.1f"), &bad);
        hkv_jset(o, "peak_amx_bf16_gflops", hkv_jnum(peak.amx_bf16_flops / 1e9, "%.1f"), &bad);
        hkv_jset(o, "peak_fp32_gflops", hkv_jnum(peak.fp32_flops / 1e9, "%.1f"), &bad);
        json_t *res = json_array();
        for (int i = 0; i < np; i++) {
            const point *q = &pts[i];
            json_t *r = json_object();
            hkv_jset(r, "config", hkv_jstr(q->config), &bad);
            hkv_jset(r, "ctx", json_integer(q->ctx), &bad);
            hkv_jset(r, "batch", json_integer(q->batch), &bad);
            hkv_jset(r, "prefill_tok_s", hkv_jnum(q->prefill_tok_s, "%.2f"), &bad);
            hkv_jset(r, "decode_tok_s", hkv_jnum(q->decode_tok_s, "%.2f"), &bad);
            hkv_jset(r, "step_ms", hkv_jnum(q->step_s * 1e3, "%.3f"), &bad);
            hkv_jset(r, "bytes_per_step", hkv_jint(q->bytes_per_step), &bad);
            hkv_jset(r, "gbs", hkv_jnum(q->gbs, "%.3f"), &bad);
            hkv_jset(r, "frac_of_probe", hkv_jnum(probe > 0 ? q->gbs * 1e9 / probe : 0, "%.3f"), &bad);
            hkv_jset(r, "matmul_frac", hkv_jnum(q->matmul_frac, "%.3f"), &bad);
            hkv_jset(r, "attn_frac", hkv_jnum(q->attn_frac, "%.3f"), &bad);
            hkv_jset(r, "vs_full", hkv_jnum(q->vs_full, "%.3f"), &bad);
            hkv_jset(r, "ttft_s", q->ttft_s >= 0 ? hkv_jnum(q->ttft_s, "%.4f") : json_null(), &bad);
            hkv_jset(r, "host_bytes_per_step", hkv_jint(q->host_bytes_step), &bad);
            if (q->has_pl) {   /* the pipeline over this point's decode steps */
                json_t *t = json_object();
                hkv_jset(t, "steps", json_integer(steps), &bad);
                hkv_device_cli_timeline(t, &q->pl, 0, &bad);
                hkv_jset(r, "timeline", t, &bad);
            }
            if (q->has_pre) {   /* the shared prefill: where its (prompt row, layer)s were attended */
                json_t *t = json_object();
                hkv_jset(t, "prompt_rows_device", json_integer(q->pre.prompt_rows_dev), &bad);
                hkv_jset(t, "prompt_rows_streamed", json_integer(q->pre.prompt_rows_streamed), &bad);
                hkv_jset(t, "prompt_rows_host", json_integer(q->pre.prompt_rows_host), &bad);
                hkv_jset(t, "index_builds_device", json_integer(q->pre.index_builds_dev), &bad);
                hkv_jset(t, "index_builds_host", json_integer(q->pre.index_builds_host), &bad);
                hkv_jset(t, "window_scores_device", json_integer(q->pre.window_scores_dev), &bad);
                hkv_jset(t, "window_scores_host", json_integer(q->pre.window_scores_host), &bad);
                hkv_device_cli_fallbacks(t, &q->pre, &bad);
                hkv_jset(t, "bytes_h2d", json_integer((json_int_t)q->pre.bytes_h2d), &bad);
                hkv_jset(t, "bytes_d2h", json_integer((json_int_t)q->pre.bytes_d2h), &bad);
                hkv_jset(r, "prefill_timeline", t, &bad);
            }
            hkv_jpush(res, r, &bad);
        }
        hkv_jset(o, "results", res, &bad);
        hkv_pinned_account pin;   /* page-locked far tier over the run: 0 without a CUDA device */
        hkv_kv_tiered_pinned(&e->kv, &pin);
        hkv_jset(o, "far_pinned_peak", json_integer((json_int_t)pin.peak), &bad);
        hkv_jset(o, "far_peak", json_integer((json_int_t)e->mem.peak[HKV_TIER_FAR]), &bad);
        hkv_device_cli_json(o, e, &bad);
        rc = hkv_json_emit(stdout, o, bad, &err);
    } else {
        fprintf(stderr, "bandwidth probe: %.2f GB/s (read, %d threads, %lld MiB); compute peaks: int8 %.0f GOP/s, "
                "bf16 %.0f GFLOP/s, fp32 %.0f GFLOP/s, AMX int8 %.0f GOP/s, AMX bf16 %.0f GFLOP/s "
                "(0: not on this CPU)\n", probe / 1e9, hkv_threads_count(e->threads), probe_mib,
                peak.int8_ops / 1e9, peak.bf16_flops / 1e9, peak.fp32_flops / 1e9,
                peak.amx_int8_ops / 1e9, peak.amx_bf16_flops / 1e9);
        hkv_device_cli_summary(stderr, e);
    }
out:
    if (rc) hkv_err_report(&err, stderr);
    free(pts);
    free(prompt);
    free(toks);
    free(segs);
    free(logits);
    free(first);
    free(first_c);
    hkv_engine_close(e);
    return rc ? 1 : 0;
}
