/* The device and model-source options run, bench, info and plan share:
 * --device cpu|cuda, --gpu-mem SIZE, --synthetic NAME, --synthetic-weights T.
 * With --device cuda the device is queried and the request is planned and
 * admitted (plan/gpu_plan.h) before anything is loaded. */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cuda_backend.h"
#include "device.h"
#include "gguf.h"
#include "gpu_plan.h"
#include "gpu_predict.h"
#include "model.h"
#include "synthetic.h"

void hkv_device_cli_init(hkv_device_cli *d) {
    memset(d, 0, sizeof *d);
    d->synthetic_wtype = HKV_W_Q4;
    d->gemm = -1;
    d->resident = -1;
}

static int parse_device(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    if (strcmp(v, "cpu") && strcmp(v, "cuda"))
        return hkv_seterr(err, HKV_E_INVAL, "--device: '%s' is not cpu or cuda", v);
    ((hkv_device_cli *)base)->cuda = !strcmp(v, "cuda");
    return HKV_OK;
}

static int parse_gpu_mem(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    return hkv_parse_size("--gpu-mem", v, &((hkv_device_cli *)base)->gpu_mem, err);
}

static int parse_host_mem(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    return hkv_parse_size("--host-mem", v, &((hkv_device_cli *)base)->host_mem, err);
}

static int parse_offload_mem(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    return hkv_parse_size("--gpu-offload-mem", v, &((hkv_device_cli *)base)->offload_mem, err);
}

static int parse_gemm(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    static const char *const modes[] = {"split", "fp16", "fp32"};   /* enum hkv_qmat_gemm */
    hkv_device_cli *d = base;
    d->gemm = -2;
    if (!strcmp(v, "auto")) d->gemm = -1;
    for (int k = 0; k < 3; k++)
        if (!strcmp(v, modes[k])) d->gemm = k;
    if (d->gemm == -2)
        return hkv_seterr(err, HKV_E_INVAL, "--gpu-gemm: '%s' is not auto, split, fp16 or fp32", v);
    return HKV_OK;
}

/* 0 asks for no prompt keys on the device: kept as -1 (0 is "not given"). */
static int parse_prompt_keys(void *base, const char *opt, const char *v, hkv_err *err) {
    long long x;
    int rc = hkv_arg_int(opt, v, 0, (long long)1 << 40, &x, err);
    if (!rc) ((hkv_device_cli *)base)->prompt_keys = x ? x : -1;
    return rc;
}

static int parse_spin_us(void *base, const char *opt, const char *v, hkv_err *err) {
    long long x;
    int rc = hkv_arg_int(opt, v, 0, 1000000, &x, err);
    if (!rc) ((hkv_device_cli *)base)->spin_us = x ? (int)x : -1;
    return rc;
}

static int parse_prompt_block(void *base, const char *opt, const char *v, hkv_err *err) {
    long long x;
    int rc = hkv_arg_int(opt, v, 1, (long long)1 << 40, &x, err);
    if (!rc) ((hkv_device_cli *)base)->prompt_block = x;
    return rc;
}

static int parse_resident(void *base, const char *opt, const char *v, hkv_err *err) {
    long long x;
    int rc = hkv_arg_int(opt, v, 0, 1 << 20, &x, err);
    if (!rc) ((hkv_device_cli *)base)->resident = (int)x;
    return rc;
}

static int parse_resident_chunk(void *base, const char *opt, const char *v, hkv_err *err) {
    long long x;
    int rc = hkv_arg_int(opt, v, 1, 1 << 16, &x, err);
    if (!rc) ((hkv_device_cli *)base)->resident_chunk = (int)x;
    return rc;
}

static int parse_resident_rows(void *base, const char *opt, const char *v, hkv_err *err) {
    long long x;
    int rc = hkv_arg_int(opt, v, 1, (long long)1 << 31, &x, err);
    if (!rc) ((hkv_device_cli *)base)->resident_rows = x;
    return rc;
}

static int parse_resident_prefixes(void *base, const char *opt, const char *v, hkv_err *err) {
    long long x;
    int rc = hkv_arg_int(opt, v, 0, 1 << 16, &x, err);
    if (!rc) ((hkv_device_cli *)base)->resident_prefixes = (int)x;
    return rc;
}

static int parse_synthetic(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    hkv_model_config c;
    if (hkv_synthetic_config(v, &c, err)) return hkv_err_prefix(err, "--synthetic");
    ((hkv_device_cli *)base)->synthetic = v;
    return HKV_OK;
}

static int parse_wtype(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    if ((((hkv_device_cli *)base)->synthetic_wtype = hkv_synthetic_wtype_parse(v)) < 0)
        return hkv_seterr(err, HKV_E_INVAL, "--synthetic-weights: '%s' is not q4, q8, f16 or f32", v);
    return HKV_OK;
}

const hkv_opt hkv_device_opts[] = {
    {.name = "--device", .arg = "cpu|cuda", .kind = HKV_OPT_FN, .fn = parse_device,
     .help = "the host path (default) or the GPU: cuda queries the device and\n"
             "admits the batch x context against the GPU memory plan before\n"
             "anything is loaded (hetkv plan prints the plan)"},
    {.name = "--gpu-mem", .arg = "SIZE", .kind = HKV_OPT_FN, .fn = parse_gpu_mem,
     .help = "GPU memory cap, e.g. 24G (default: the device's free memory)"},
    {.name = "--host-mem", .arg = "SIZE", .kind = HKV_OPT_FN, .fn = parse_host_mem,
     .help = "page-locked host memory the far tiers (and host-side index lists)\n"
             "may take, e.g. 64G: a batch x context past it is refused at\n"
             "admission (default: the host's available memory)"},
    {.name = "--gpu-gemm", .arg = "auto|split|fp16|fp32", .kind = HKV_OPT_FN, .fn = parse_gemm,
     .help = "the weight products of more than 8 rows:\n"
             "split (fp16 hi + lo on tensor cores, ~fp32 accuracy, 3x the\n"
             "tensor work), fp16 (one tensor-core pass, ~2^-11 relative),\n"
             "fp32 (CUDA cores); auto: split on A100/H100, fp32 on GeForce\n"
             "parts, where the split would be slower (data-sheet prediction)"},
    {.name = "--gpu-profile", .kind = HKV_OPT_FLAG, .off = offsetof(hkv_device_cli, profile),
     .help = "time every op of the device's forward pass with CUDA events (a\n"
             "few us of host time per op): the JSON timeline gains \"ops\",\n"
             "seconds per op (rmsnorm, qkv, wo, ffn_in, down, head, rope,\n"
             "attention with its wait for the host, swiglu, add, embed, copy)"},
    {.name = "--gpu-lockstep", .kind = HKV_OPT_FLAG, .off = offsetof(hkv_device_cli, lockstep),
     .help = "the host runs every layer's far step before the device goes on,\n"
             "even when no row has far keys (by default such a layer's host\n"
             "step runs behind the device): the baseline for A/B timings"},
    {.name = "--gpu-no-graphs", .kind = HKV_OPT_FLAG, .off = offsetof(hkv_device_cli, no_graphs),
     .help = "queue every op of a decode step on its own (by default a step\n"
             "whose context is all on the device is recorded once per batch\n"
             "size as a CUDA graph and replayed in one launch): the baseline\n"
             "for A/B timings"},
    {.name = "--gpu-pingpong", .kind = HKV_OPT_FLAG, .off = offsetof(hkv_device_cli, pingpong),
     .help = "micro-batch ping-pong: a decode batch of 2+ rows in two halves,\n"
             "one's host far-tier part overlapping the other's device products"},
    {.name = "--gpu-spin-us", .arg = "N", .kind = HKV_OPT_FN, .fn = parse_spin_us,
     .help = "the host's waits for the device inside a step poll for up to N us\n"
             "before sleeping (default 2000; 0: sleep at once, the driver's\n"
             "interrupt waking the thread; under the emulator the default is 0)"},
    {.name = "--gpu-team-spin", .kind = HKV_OPT_FLAG, .off = offsetof(hkv_device_cli, team_spin),
     .help = "the CPU threads wait for the device with the host, spinning, so\n"
             "that each layer's far part starts on an awake team (not one the\n"
             "OpenMP runtime put to sleep): every core busy while the GPU works"},
    {.name = "--gpu-prompt-keys", .arg = "N", .kind = HKV_OPT_FN, .fn = parse_prompt_keys,
     .help = "the most prompt tokens whose K/V the device keeps while a prompt\n"
             "is fed (default: as many as fit); each chunk attends the keys past\n"
             "them from the far tier, streamed through the device in blocks"},
    {.name = "--gpu-prompt-block", .arg = "N", .kind = HKV_OPT_FN, .fn = parse_prompt_block,
     .help = "keys per streamed block (default 4096)"},
    {.name = "--gpu-offload-mem", .arg = "SIZE", .kind = HKV_OPT_FN, .fn = parse_offload_mem,
     .help = "the most GPU memory one prompt-end offload (ctkvr's index build,\n"
             "the eviction policies' window scores) may take; past it the host\n"
             "does that work, counted in the timeline's fallbacks as no_room\n"
             "(default: what is free)"},
    {.name = "--gpu-resident", .arg = "N", .kind = HKV_OPT_FN, .fn = parse_resident,
     .help = "up to N sequences under the policy full keep their whole KV on\n"
             "the device too, so their decode attention runs there (the rest:\n"
             "the far tier on the host). Default: with --policy auto, as many\n"
             "as fit beside the split, the others running ctkvr; else 0"},
    {.name = "--split-overflow", .kind = HKV_OPT_FLAG, .off = offsetof(hkv_device_cli, split_overflow),
     .help = "batch and serve under --policy auto: a request that fits a resident\n"
             "slot runs ctkvr in the split while every slot is busy, instead of\n"
             "waiting for one (the default: on an H200 a split sequence decoded\n"
             "at a tenth of a device one's rate and held the device's sequences\n"
             "to its step; docs/GPU_MEASURED.md). A request no slot can hold\n"
             "runs in the split either way"},
    {.name = "--gpu-resident-chunk", .arg = "N", .kind = HKV_OPT_FN, .fn = parse_resident_chunk,
     .help = "far rows a resident sequence's device copy lags by at most,\n"
             "copied up together; the host attends the tail (default 256)"},
    {.name = "--gpu-resident-rows", .arg = "N", .kind = HKV_OPT_FN, .fn = parse_resident_rows,
     .help = "far rows each resident sequence keeps on the device: its rows\n"
             "past a prefix kept by --gpu-resident-prefixes, else its whole\n"
             "far tier; batch and serve place a request whose prompt and\n"
             "max_tokens need more in the split (default: a whole context, -c\n"
             "less the near tier; batch under --policy auto: sized from the\n"
             "job's requests)"},
    {.name = "--gpu-resident-prefixes", .arg = "N", .kind = HKV_OPT_FN, .fn = parse_resident_prefixes,
     .help = "keep up to N prompt prefixes that resident sequences share (the\n"
             "prefix cache of batch and serve, bench --shared-prefix) once on\n"
             "the device for all of them, a whole context each (default 0)"},
    {.name = "--synthetic", .arg = "NAME", .kind = HKV_OPT_FN, .fn = parse_synthetic,
     .help = "random weights of a real shape instead of -m: llama3-8b,\n"
             "llama3.1-8b, yi-9b, qwen2.5-7b, smollm2-135m (no tokenizer);\n"
             "NAME@L keeps the first L layers (e.g. llama3-8b@2)"},
    {.name = "--synthetic-weights", .arg = "q4|q8|f16|f32", .kind = HKV_OPT_FN, .fn = parse_wtype,
     .help = "their host weight format (default q4)"},
    {0},
};

int hkv_device_cli_parse(hkv_device_cli *d, int argc, char **argv, int *i, hkv_err *err) {
    return hkv_opts_parse_one(hkv_device_opts, d, argc, argv, i, err);
}

int hkv_device_cli_apply(const hkv_device_cli *d, const char *model_path, hkv_engine_params *ep,
                         hkv_err *err) {
    if (model_path && d->synthetic)
        return hkv_seterr(err, HKV_E_INVAL, "give -m MODEL or --synthetic NAME, not both");
    if (!model_path && !d->synthetic)
        return hkv_seterr(err, HKV_E_INVAL, "no model (-m MODEL or --synthetic NAME)");
    ep->model_path = model_path;
    ep->synthetic = d->synthetic;
    ep->synthetic_wtype = d->synthetic_wtype;
    ep->device_cuda = d->cuda;   /* far tier page-locked (run/bench refuse cuda before this today) */
    return HKV_OK;
}

int hkv_cli_model_config(const char *model_path, const char *synthetic, hkv_model_config *cfg,
                         hkv_err *err) {
    if (synthetic) return hkv_synthetic_config(synthetic, cfg, err);
    hkv_gguf *g = NULL;
    int rc = hkv_gguf_open(&g, model_path, err);
    if (!rc) rc = hkv_model_config_read(g, cfg, err);
    hkv_gguf_close(g);
    return rc;
}

int hkv_device_cli_cap(const hkv_device_cli *d, uint64_t *cap, char *desc, size_t desc_cap,
                       hkv_err *err) {
    *cap = 0;
    if (desc_cap) desc[0] = 0;
    if (!d->cuda) {
        if (d->gpu_mem)
            return hkv_seterr(err, HKV_E_INVAL, "--gpu-mem caps the GPU side: it needs --device cuda");
        if (d->host_mem)
            return hkv_seterr(err, HKV_E_INVAL, "--host-mem caps the page-locked far tier: it needs "
                              "--device cuda");
        if (d->gemm >= 0)
            return hkv_seterr(err, HKV_E_INVAL, "--gpu-gemm picks the GPU's products: it needs --device cuda");
        if (d->profile)
            return hkv_seterr(err, HKV_E_INVAL, "--gpu-profile times the GPU's ops: it needs --device cuda");
        if (d->lockstep)
            return hkv_seterr(err, HKV_E_INVAL, "--gpu-lockstep orders the GPU pipeline: it needs --device cuda");
        if (d->pingpong)
            return hkv_seterr(err, HKV_E_INVAL, "--gpu-pingpong splits the GPU pipeline's batch: it needs --device cuda");
        if (d->no_graphs)
            return hkv_seterr(err, HKV_E_INVAL, "--gpu-no-graphs changes how the GPU's steps are queued: it "
                              "needs --device cuda");
        if (d->spin_us || d->team_spin)
            return hkv_seterr(err, HKV_E_INVAL, "%s is how the host waits for the GPU: it needs "
                              "--device cuda", d->spin_us ? "--gpu-spin-us" : "--gpu-team-spin");
        if (d->prompt_keys || d->prompt_block)
            return hkv_seterr(err, HKV_E_INVAL, "--gpu-prompt-keys and --gpu-prompt-block shape the GPU's "
                              "prompt attention: they need --device cuda");
        if (d->offload_mem)
            return hkv_seterr(err, HKV_E_INVAL, "--gpu-offload-mem caps the GPU's prompt-end work: it "
                              "needs --device cuda");
        if (d->resident > 0 || d->resident_chunk || d->resident_rows || d->resident_prefixes)
            return hkv_seterr(err, HKV_E_INVAL, "--gpu-resident and its -chunk, -rows and "
                              "-prefixes keep sequences on the GPU: they need --device cuda");
        return HKV_OK;
    }
    hkv_gpu_device dev[1];
    int n = 0;
    char why[256];
    hkv_gpu_query(dev, 1, &n, why, sizeof why);
    if (n < 1)
        return hkv_seterr(err, HKV_E_DEVICE, "--device cuda: %s%s", why,
                          hkv_gpu_built() ? "" : " (rebuild with nvcc present, or -Dcuda=enabled)");
    char tot[32], fr[32];
    hkv_fmt_bytes((double)dev[0].mem_total, tot, sizeof tot);
    hkv_fmt_bytes((double)dev[0].mem_free, fr, sizeof fr);
    if (d->gpu_mem > dev[0].mem_total) {
        char want[32];
        hkv_fmt_bytes((double)d->gpu_mem, want, sizeof want);
        return hkv_seterr(err, HKV_E_RANGE, "--gpu-mem %s is more than %s has (%s total, %s free)",
                          want, dev[0].name, tot, fr);
    }
    *cap = d->gpu_mem ? d->gpu_mem : dev[0].mem_free;
    snprintf(desc, desc_cap, "%s, %s total, %s free%s", dev[0].name, tot, fr,
             d->gpu_mem ? ", capped by --gpu-mem" : "");
    return HKV_OK;
}

int hkv_device_cli_weight_bytes(const hkv_device_cli *d, const char *model_path,
                                const hkv_model_config *cfg, uint64_t *bytes, const char **name,
                                hkv_err *err) {
    if (d->synthetic) {
        *bytes = hkv_predict_weight_bytes(cfg, d->synthetic_wtype);
        if (name) *name = hkv_predict_wtype_name(d->synthetic_wtype);
        return HKV_OK;
    }
    hkv_gguf *g = NULL;
    int rc = hkv_gguf_open(&g, model_path, err);
    if (rc) return rc;
    *bytes = hkv_model_repacked_bytes(g);
    hkv_gguf_close(g);
    if (name) *name = "repacked";
    return HKV_OK;
}

int hkv_device_cli_check(const hkv_device_cli *d, const char *model_path, const hkv_engine_params *ep,
                         int batch, int64_t n_ctx, hkv_err *err) {
    uint64_t cap;
    char desc[256];
    int rc = hkv_device_cli_cap(d, &cap, desc, sizeof desc, err);
    if (rc || !d->cuda) return rc;
    hkv_model_config cfg;
    if ((rc = hkv_cli_model_config(model_path, d->synthetic, &cfg, err))) return rc;
    if (ep->kv_plain)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "--device cuda plans the tiered cache; --kv plain "
                          "is the host reference only");
    hkv_plan_params pp = {.cfg = &cfg, .batch = batch, .n_ctx = n_ctx > 0 ? n_ctx : cfg.ctx_train,
                          .L_init = ep->tiered.L_init, .L_local = ep->tiered.L_local,
                          .policy = ep->tiered.policy, .args = &ep->tiered.args,
                          .max_rows = ep->max_rows,
                          .index_on_host = hkv_plan_pipeline_index_on_host(ep->tiered.policy),
                          .far_q8 = ep->tiered.far_q8,
                          .resident = d->resident > 0 ? d->resident : 0,
                          .resident_rows = d->resident_rows,
                          /* full with --local N keeps the split (check_near) */
                          .full_split = d->full_split, .shared_rows = d->shared_rows,
                          .resident_prefixes = d->resident > 0 ? d->resident_prefixes : 0};
    if ((rc = hkv_device_cli_weight_bytes(d, model_path, &cfg, &pp.weight_bytes, NULL, err)))
        return rc;
    hkv_plan plan;
    if ((rc = hkv_plan_compute(&pp, &plan, err))) return hkv_err_prefix(err, "--device cuda (%s)", desc);
    if ((rc = hkv_plan_admit(&pp, &plan, cap, err))) return hkv_err_prefix(err, "--device cuda (%s)", desc);
    /* the far tier is page-locked: it must fit in what the host has now */
    const uint64_t avail = hkv_host_mem_free();
    const int capped = d->host_mem && (d->host_mem < avail || !avail);
    if ((rc = hkv_plan_admit_host(&pp, &plan, capped ? d->host_mem : avail, capped, err)))
        return hkv_err_prefix(err, "--device cuda%s", capped ? ", --host-mem" : "");
    return HKV_OK;
}

/* The most sequences of the batch that can keep their whole KV on the
 * device beside the split's plan, in slots of d->resident_rows far rows. */
static int most_resident(hkv_device_cli *d, const char *model_path, hkv_engine_params *ep,
                         int batch, int64_t ctx) {
    int lo = 0, hi = batch;   /* lo fits (0 is the split alone) */
    while (lo < hi) {
        d->resident = (lo + hi + 1) / 2;
        hkv_err tried;
        hkv_err_clear(&tried);
        if (hkv_device_cli_check(d, model_path, ep, batch, ctx, &tried)) hi = d->resident - 1;
        else lo = d->resident;
    }
    return lo;
}

/* Slots sized from a batch job's requests (d->job_rows): a slot of S far
 * rows takes the requests that need at most S, and the cap admits N(S) of
 * them at a time, so the candidate that maximises covered share x
 * min(N, batch) / batch wins (the larger S on a tie: fewer requests in the
 * split). The candidates are the far rows at a few quantiles of the job.
 * Returns N at the chosen size. */
static int size_slots(hkv_device_cli *d, const char *model_path, hkv_engine_params *ep, int batch,
                      int64_t ctx, int64_t *covered) {
    static const double quantiles[] = {1.0, 0.99, 0.95, 0.90, 0.75, 0.50};
    const int64_t n = d->n_job_rows, near = ep->tiered.L_init + ep->tiered.L_local;
    double best = -1;
    int64_t best_rows = 0, prev = -1;
    int best_fit = 0;
    *covered = n;
    for (size_t q = 0; q < sizeof quantiles / sizeof *quantiles; q++) {
        int64_t k = (int64_t)(quantiles[q] * (double)n + 0.999999);   /* requests covered */
        if (k < 1) k = 1;
        if (k > n) k = n;
        int64_t rows = d->job_rows[k - 1] - near;
        if (rows < 1) rows = 1;   /* every request within the near tier: a token slot */
        if (rows >= ctx - near) rows = 0;   /* a whole context */
        if (rows == prev) continue;
        prev = rows;
        while (k < n && (!rows || d->job_rows[k] - near <= rows)) k++;   /* ties are covered too */
        d->resident_rows = rows;
        const int fit = most_resident(d, model_path, ep, batch, ctx);
        const double score = (double)k / (double)n * (double)fit / (double)batch;
        if (score > best) best = score, best_rows = rows, best_fit = fit, *covered = k;
    }
    d->resident_rows = best_rows;   /* 0: a whole context */
    return best_fit;
}

/* Per-sequence placement under auto: the most sequences of the batch that
 * can keep their whole KV on the device beside the split's plan. */
static int place_resident(hkv_device_cli *d, const char *model_path, hkv_engine_params *ep,
                          int batch, int64_t ctx, hkv_err *err) {
    int64_t covered = d->n_job_rows;
    const int lo = d->job_rows && d->n_job_rows > 0 && !d->resident_rows && !d->resident_prefixes
                       ? size_slots(d, model_path, ep, batch, ctx, &covered)
                       : most_resident(d, model_path, ep, batch, ctx);
    d->resident = lo;
    char sized[160] = "";
    const int64_t near = ep->tiered.L_init + ep->tiered.L_local;
    if (lo && d->job_rows && d->resident_rows && d->job_rows[d->n_job_rows - 1] <= near)
        snprintf(sized, sizeof sized, " in slots of 1 far row: every request of the job fits the "
                 "near tier (%lld rows)", (long long)near);
    else if (lo && d->job_rows && d->resident_rows && covered == d->n_job_rows)
        snprintf(sized, sizeof sized, " in slots of %lld far rows, what the job's longest request "
                 "needs", (long long)d->resident_rows);
    else if (lo && d->job_rows && d->resident_rows)
        snprintf(sized, sizeof sized, " in slots of %lld far rows (%lld of the job's %lld requests "
                 "need more and run ctkvr)", (long long)d->resident_rows,
                 (long long)(d->n_job_rows - covered), (long long)d->n_job_rows);
    if (lo)
        fprintf(stderr, "hetkv: --device cuda, policy auto: up to %d of the %d sequences at a time "
                "keep their whole KV on the device (full, as they arrive)%s%s (--gpu-resident N "
                "and --gpu-resident-rows N set it)\n", lo, batch, sized,
                lo >= batch ? ""
                : d->queued && !d->split_overflow
                    ? "; the others wait for a slot, and a request no slot holds runs ctkvr in "
                      "the split (--split-overflow: ctkvr at once rather than wait)"
                    : ", the others run ctkvr in the split");
    return hkv_device_cli_check(d, model_path, ep, batch, ctx, err);
}

int hkv_device_cli_check_near(hkv_device_cli *d, const char *model_path,
                              hkv_engine_params *ep, int local_given, int auto_policy, int batch,
                              int64_t n_ctx, hkv_err *err) {
    const int full = ep->tiered.policy && !strcmp(ep->tiered.policy->name, "full");
    if (d->split_overflow && !d->queued)
        return hkv_seterr(err, HKV_E_INVAL, "--split-overflow is for batch and serve, whose requests "
                          "wait in a queue; run and bench decode their batch together");
    d->full_split = local_given;   /* a named full with --local N runs with a far tier */
    if (d->cuda && !ep->kv_plain && full) {
        hkv_model_config cfg;
        int rc = hkv_cli_model_config(model_path, d->synthetic, &cfg, err);
        if (rc) return rc;
        const int64_t ctx = n_ctx > 0 ? n_ctx : cfg.ctx_train;
        const int local = ep->tiered.L_local;
        hkv_err tried;
        hkv_err_clear(&tried);
        if (ctx - ep->tiered.L_init <= local) {   /* no far tier: dense as it is */
            if (d->resident < 0) d->resident = 0;
            return hkv_device_cli_check(d, model_path, ep, batch, n_ctx, err);
        }
        if (!local_given && ctx - ep->tiered.L_init <= INT_MAX) {
            ep->tiered.L_local = (int)(ctx - ep->tiered.L_init);
            if (!hkv_device_cli_check(d, model_path, ep, batch, ctx, &tried)) {
                fprintf(stderr, "hetkv: --device cuda, policy %s: the near tier holds the whole "
                        "context (%lld rows per sequence and KV head), so attention runs on the "
                        "device alone (--local N keeps the split)\n",
                        auto_policy ? "auto -> full" : "full", (long long)ctx);
                return HKV_OK;
            }
            ep->tiered.L_local = local;   /* does not fit: the split */
        }
        if (auto_policy) {
            ep->tiered.policy = &hkv_policy_ctkvr;
            hkv_policy_args_init(ep->tiered.policy, &ep->tiered.args);
            if (local_given)
                fprintf(stderr, "hetkv: --device cuda, policy auto -> ctkvr: --local %d keeps a far "
                        "tier on the host, so ctkvr selects from it\n", local);
            else
                fprintf(stderr, "hetkv: --device cuda, policy auto -> ctkvr: batch %d x context "
                        "%lld does not fit the device whole (%s), so ctkvr selects from the far "
                        "tier on the host\n", batch, (long long)ctx, tried.msg);
            if (d->resident < 0) return place_resident(d, model_path, ep, batch, ctx, err);
        }
    }
    if (d->resident < 0) d->resident = 0;
    return hkv_device_cli_check(d, model_path, ep, batch, n_ctx, err);
}

int64_t hkv_device_cli_slot_rows(const hkv_device_cli *d) {
    return d->resident_prefixes ? 0 : d->resident_rows;
}

int hkv_device_cli_attach(const hkv_device_cli *d, hkv_engine *e, hkv_err *err) {
    if (!d->cuda) return HKV_OK;
    uint64_t cap;
    char desc[256];
    int rc = hkv_device_cli_cap(d, &cap, desc, sizeof desc, err);
    if (rc) return rc;
    hkv_cuda_params cp = {.device = 0, .gpu_mem = (size_t)cap, .gemm = d->gemm,
                          .profile = d->profile, .lockstep = d->lockstep,
                          .pingpong = d->pingpong, .graphs_off = d->no_graphs,
                          .wait_spin_us = d->spin_us, .team_spin = d->team_spin,
                          .prompt_keys = d->prompt_keys,
                          .prompt_block = d->prompt_block,
                          .offload_mem = (size_t)d->offload_mem,
                          .resident_seqs = d->resident > 0 ? d->resident : 0,
                          .resident_chunk = d->resident_chunk,
                          .resident_rows = d->resident_rows,
                          .resident_prefixes = d->resident_prefixes};
    hkv_backend be;
    if ((rc = hkv_cuda_backend_create(&be, e, &cp, err)))
        return hkv_err_prefix(err, "--device cuda (%s)", desc);
    hkv_engine_set_backend(e, be);
    return HKV_OK;
}

int64_t hkv_device_fallbacks_total(const hkv_pipeline_stats *ps) {
    int64_t n = 0;
    for (int k = HKV_FALLBACK_NONE + 1; k < HKV_FALLBACK_COUNT; k++) n += ps->fallbacks[k];
    return n;
}

void hkv_device_cli_fallbacks(json_t *t, const hkv_pipeline_stats *ps, int *bad) {
    json_t *f = json_object();   /* every reason, zeros too: a reader needs no list of names */
    for (int k = HKV_FALLBACK_NONE + 1; k < HKV_FALLBACK_COUNT; k++)
        hkv_jset(f, hkv_fallback_name(k), json_integer(ps->fallbacks[k]), bad);
    hkv_jset(t, "fallbacks", f, bad);
    hkv_jset(t, "fallbacks_total", json_integer(hkv_device_fallbacks_total(ps)), bad);
}

void hkv_device_cli_timeline(json_t *t, const hkv_pipeline_stats *ps, int prompt_rows, int *bad) {
    hkv_jset(t, "host_deferred_steps", json_integer(ps->host_deferred), bad);
    hkv_jset(t, "pingpong_steps", json_integer(ps->pingpong_steps), bad);
    hkv_jset(t, "graph_steps", json_integer(ps->graph_steps), bad);
    hkv_jset(t, "graph_captures", json_integer(ps->graph_captures), bad);
    hkv_jset(t, "graph_nodes", json_integer(ps->graph_nodes), bad);
    hkv_jset(t, "cpu_busy_s", hkv_jnum(ps->cpu_busy, "%.6f"), bad);
    hkv_jset(t, "cpu_wait_device_s", hkv_jnum(ps->cpu_wait_dev, "%.6f"), bad);
    hkv_jset(t, "host_waits", json_integer(ps->host_waits), bad);
    hkv_jset(t, "host_waits_slept", json_integer(ps->host_waits_slept), bad);
    hkv_jset(t, "device_near_s", hkv_jnum(ps->dev_near, "%.6f"), bad);
    hkv_jset(t, "device_wait_cpu_s", hkv_jnum(ps->dev_wait_cpu, "%.6f"), bad);
    hkv_jset(t, "device_products_s", hkv_jnum(ps->dev_products, "%.6f"), bad);
    hkv_jset(t, "device_total_s", hkv_jnum(ps->dev_total, "%.6f"), bad);
    hkv_jset(t, "bytes_d2h", json_integer((json_int_t)ps->bytes_d2h), bad);
    hkv_jset(t, "bytes_h2d", json_integer((json_int_t)ps->bytes_h2d), bad);
    hkv_jset(t, "near_resyncs", json_integer(ps->near_resyncs), bad);
    hkv_jset(t, "device_recalls", json_integer(ps->recall_rows), bad);
    hkv_jset(t, "recall_resyncs", json_integer(ps->recall_resyncs), bad);
    if (prompt_rows) {
        hkv_jset(t, "prompt_rows_device", json_integer(ps->prompt_rows_dev), bad);
        hkv_jset(t, "prompt_rows_host", json_integer(ps->prompt_rows_host), bad);
        hkv_jset(t, "prompt_rows_streamed", json_integer(ps->prompt_rows_streamed), bad);
        hkv_jset(t, "index_builds_device", json_integer(ps->index_builds_dev), bad);
        hkv_jset(t, "index_builds_host", json_integer(ps->index_builds_host), bad);
        hkv_jset(t, "window_scores_device", json_integer(ps->window_scores_dev), bad);
        hkv_jset(t, "window_scores_host", json_integer(ps->window_scores_host), bad);
    }
    hkv_jset(t, "device_kept_rows", json_integer(ps->keep_rows), bad);
    hkv_jset(t, "kept_resyncs", json_integer(ps->keep_resyncs), bad);
    hkv_jset(t, "device_resident_rows", json_integer(ps->resident_rows), bad);
    hkv_jset(t, "resident_rows_up", json_integer(ps->resident_rows_up), bad);
    hkv_jset(t, "resident_resyncs", json_integer(ps->resident_resyncs), bad);
    hkv_jset(t, "device_resident_prefix_rows", json_integer(ps->resident_prefix_rows), bad);
    hkv_jset(t, "resident_prefix_rows_up", json_integer(ps->resident_prefix_up), bad);
    hkv_jset(t, "resident_prefix_cascades", json_integer(ps->resident_prefix_groups), bad);
    hkv_jset(t, "device_selects", json_integer(ps->device_selects), bad);
    hkv_jset(t, "page_resyncs", json_integer(ps->page_resyncs), bad);
    hkv_device_cli_fallbacks(t, ps, bad);
    int any = 0;   /* "ops" only when --gpu-profile timed more than the products */
    for (int k = 0; k < HKV_DEV_OP_COUNT; k++)
        any |= ps->dev_op[k] > 0 && !(k >= HKV_DEV_OP_QKV && k <= HKV_DEV_OP_HEAD);
    if (!any) return;
    json_t *ops = json_object(), *host = json_object();
    for (int k = 0; k < HKV_DEV_OP_COUNT; k++) {
        hkv_jset(ops, hkv_dev_op_name(k), hkv_jnum(ps->dev_op[k], "%.6f"), bad);
        hkv_jset(host, hkv_dev_op_name(k), hkv_jnum(ps->host_op[k], "%.6f"), bad);
    }
    hkv_jset(t, "ops", ops, bad);
    /* the host's time in each op's call: a step whose sum of these is near its
     * wall time is bound by the host's queueing, not the device */
    hkv_jset(t, "ops_host", host, bad);
}

void hkv_device_cli_json(json_t *o, hkv_engine *e, int *bad) {
    hkv_pipeline_stats ps;
    hkv_err err;
    json_t *d = json_object();
    if (!hkv_backend_is_cuda(&e->be) || hkv_cuda_backend_stats(&e->be, &ps, &err)) {
        hkv_jset(d, "backend", json_string("cpu"), bad);
        hkv_jset(o, "device", d, bad);
        return;
    }
    hkv_jset(d, "backend", json_string(hkv_gpu_backend()), bad);
    json_t *t = json_object();
    hkv_jset(t, "layer_steps", json_integer(ps.layer_steps), bad);
    hkv_jset(t, "decode_rows", json_integer(ps.decode_rows), bad);
    hkv_jset(t, "prompt_rows", json_integer(ps.prompt_rows), bad);
    hkv_device_cli_timeline(t, &ps, 1, bad);
    hkv_jset(d, "timeline", t, bad);
    json_t *m = json_object();
    for (int k = 0; k < HKV_TIER_COUNT && k < 5; k++)
        hkv_jset(m, hkv_tier_name(k), json_integer((json_int_t)ps.dev_tier[k]), bad);
    hkv_jset(m, "peak", json_integer((json_int_t)ps.dev_peak), bad);
    hkv_jset(d, "gpu_memory", m, bad);
    if (!strcmp(hkv_gpu_backend(), "cuda-emu"))
        hkv_jset(d, "note", json_string("CUDA emulator on the CPU: device times measure the emulation "
                                        "and show the pipeline's structure (overlap, waits), not GPU "
                                        "speed"), bad);
    hkv_jset(o, "device", d, bad);
}

void hkv_device_cli_summary(FILE *f, hkv_engine *e) {
    hkv_pipeline_stats ps;
    hkv_err err;
    if (!hkv_backend_is_cuda(&e->be) || hkv_cuda_backend_stats(&e->be, &ps, &err)) return;
    char up[32], down[32], pk[32];
    hkv_fmt_bytes((double)ps.bytes_h2d, up, sizeof up);
    hkv_fmt_bytes((double)ps.bytes_d2h, down, sizeof down);
    hkv_fmt_bytes((double)ps.dev_peak, pk, sizeof pk);
    fprintf(f, "hetkv: %s pipeline: %lld layer steps (%lld decode rows, %lld prompt rows; %lld host "
            "steps behind the device, nothing far; %lld of micro-batches); %lld forward calls "
            "replayed as a graph (%lld recorded); CPU far "
            "attention %.3f s, CPU waiting for the device %.3f s (%lld waits, %lld slept); device near attention %.3f s, "
            "device waiting for the CPU %.3f s, device products %.3f s, device forward calls "
            "%.3f s; copied %s down, %s up; %lld near-tier resyncs; "
            "%lld recalls on the device; prompt attention %lld rows on the device (%lld with "
            "keys streamed from the far tier), %lld on the host; index builds %lld on the device, %lld on the host; kept rows attended on the device "
            "%lld times (%lld copies up); far selections on the device %lld; %lld fallbacks to the "
            "host; device peak %s%s\n",
            hkv_gpu_backend(), (long long)ps.layer_steps,
            (long long)ps.decode_rows, (long long)ps.prompt_rows, (long long)ps.host_deferred,
            (long long)ps.pingpong_steps, (long long)ps.graph_steps, (long long)ps.graph_captures,
            ps.cpu_busy, ps.cpu_wait_dev, (long long)ps.host_waits, (long long)ps.host_waits_slept,
            ps.dev_near, ps.dev_wait_cpu, ps.dev_products, ps.dev_total, down, up,
            (long long)ps.near_resyncs,
            (long long)ps.recall_rows, (long long)ps.prompt_rows_dev,
            (long long)ps.prompt_rows_streamed, (long long)ps.prompt_rows_host, (long long)ps.index_builds_dev,
            (long long)ps.index_builds_host, (long long)ps.keep_rows, (long long)ps.keep_resyncs,
            (long long)ps.device_selects, (long long)hkv_device_fallbacks_total(&ps), pk,
            strcmp(hkv_gpu_backend(), "cuda-emu") ? "" : " (emulated: structure, not GPU speed)");
}
