/* hetkv plan: the GPU memory plan (plan/gpu_plan.h) per GPU memory cap,
 * context and KV policy, and the largest batch that fits; with --batch, the
 * admission check run/bench do under --device cuda. Needs no GPU.
 * With --predict DEVICE: a PREDICTION of decode speed on that device from
 * its data sheet and the host's probed bandwidth (plan/gpu_predict.h). */
#include <omp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_rows.h"
#include "cli.h"
#include "device.h"
#include "cli_configs.h"
#include "gpu_plan.h"
#include "gpu_kernel_predict.h"
#include "gpu_predict.h"
#include "plan_terms.h"
#include "kernels.h"
#include "synthetic.h"
#include "threads.h"

static const char plan_usage[] =
    "usage: hetkv plan (--synthetic NAME | -m MODEL) (--gpu-mem LIST | --device cuda) [options]\n"
    "\n"
    "Bytes the GPU side needs (the weights as --device cuda holds them: a synthetic model\n"
    "in --synthetic-weights' format, q4 by default, a GGUF repacked; near tier, policy index,\n"
    "workspace) and the pinned host bytes of the far tier, per sequence, and the largest\n"
    "batch under each cap: what --device cuda admits.\n"
    "Arithmetic on the model's shape only: no weights are loaded, no GPU is needed.\n"
    "\n"
    "-m MODEL: only its metadata is read. Rows (-o): the JSON's rows flattened, one\n"
    "self-describing row per (config, context, cap or batch).\n"
    "\n";

#define MAXL 16

typedef struct row {
    uint64_t cap;
    long long ctx;
    char label[HKV_SPEC_LEN];
    int on_host;
    hkv_plan one;          /* batch 1 */
    int max_batch;
    hkv_plan at_max;       /* at max_batch (zeros when 0) */
    int host_bound;        /* max_batch limited by --host-mem */
    int admitted;          /* --batch: 1 fits, 0 refused */
    char refusal[sizeof(((hkv_err *)0)->msg)];
} row;

static int parse_caps(const char *s, uint64_t *caps, int *n, hkv_err *err) {
    char buf[256];
    if (strlen(s) >= sizeof buf) return hkv_seterr(err, HKV_E_INVAL, "--gpu-mem: list too long");
    snprintf(buf, sizeof buf, "%s", s);
    *n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n >= MAXL) return hkv_seterr(err, HKV_E_RANGE, "--gpu-mem: more than %d caps", MAXL);
        int rc = hkv_parse_size("--gpu-mem", t, &caps[(*n)++], err);
        if (rc) return rc;
    }
    if (!*n) return hkv_seterr(err, HKV_E_INVAL, "--gpu-mem: empty list");
    return HKV_OK;
}

/* plan's options as parsed (the shared groups' structs among them). */
typedef struct plan_opts {
    const char *model, *policies, *configs, *where, *draft, *predict, *batch_str, *pipeline;
    const char *pred_only;   /* the first predict-only option given */
    long long ctxs[MAXL], sink, local, max_rows, gen;
    int n_ctx, n_caps, kernels, far_q8;
    double host_gbs, mem_eff, attn_eff, host_eff, cand_frac, wake_us, kernel_us, gemv_row_cost,
        trip_us, core_us;
    long long host_cores;
    const char *calibration;   /* --calibration: bench/predict_fit.py's terms */
    uint64_t caps[MAXL], host_cap;
    hkv_output_cli out;
    hkv_device_cli dev;
} plan_opts;

/* A list here, not the single cap of run/bench: declared before the
 * device group, so it is the one plan parses. */
static int parse_gpu_mem_list(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    plan_opts *o = base;
    return parse_caps(v, o->caps, &o->n_caps, err);
}

static int parse_index(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    plan_opts *o = base;
    o->where = v;
    if (strcmp(v, "auto") && strcmp(v, "gpu") && strcmp(v, "host") && strcmp(v, "both"))
        return hkv_seterr(err, HKV_E_INVAL, "--index: '%s' is not auto, gpu, host or both", v);
    return HKV_OK;
}

static int parse_host_mem(void *base, const char *opt, const char *v, hkv_err *err) {
    return hkv_parse_size(opt, v, &((plan_opts *)base)->host_cap, err);
}

static int parse_pipeline(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    ((plan_opts *)base)->pipeline = v;
    if (strcmp(v, "built") && strcmp(v, "target") && strcmp(v, "both"))
        return hkv_seterr(err, HKV_E_INVAL, "--pipeline: '%s' is not built, target or both", v);
    return HKV_OK;
}

static int parse_far_kv(void *base, const char *opt, const char *v, hkv_err *err) {
    return hkv_far_kv_parse(opt, v, &((plan_opts *)base)->far_q8, err);
}

/* A row's label: the policy as planned, and the far tier's format when it
 * is the 8-bit one. */
static void far_describe(const hkv_policy_def *d, const hkv_policy_args *a, int64_t ctx, int far_q8,
                         char *label, size_t cap) {
    hkv_plan_describe(d, a, ctx, label, cap);
    const size_t n = strlen(label);
    if (far_q8 && d != &hkv_policy_full) snprintf(label + n, cap - n, " far=q8");
}

static const hkv_opt plan_opts_table[] = {
    {.name = "--gpu-mem", .arg = "LIST", .kind = HKV_OPT_FN, .fn = parse_gpu_mem_list,
     .help = "GPU memory caps, e.g. 24G,48G"},
    {.name = "--ctx", .arg = "LIST", .kind = HKV_OPT_LIST, .off = offsetof(plan_opts, ctxs),
     .n_off = offsetof(plan_opts, n_ctx), .cap = MAXL, .lo = 1, .hi = (double)(1LL << 31),
     .help = "contexts per sequence (default 32768,98304)"},
    {.name = "--policy", .arg = "LIST", .kind = HKV_OPT_STR, .off = offsetof(plan_opts, policies),
     .help = "policies by name (default full,ctkvr)"},
    {.name = "--configs", .arg = "SPEC", .kind = HKV_OPT_STR, .off = offsetof(plan_opts, configs),
     .help = "policies with arguments, ';'-separated as hetkv eval:\n"
             "\"full;ctkvr;ctkvr:C=512\" (instead of --policy)"},
    {.name = "--index", .arg = "WHERE", .kind = HKV_OPT_FN, .fn = parse_index,
     .help = "auto (default): where --device cuda puts it, ctkvr's IVF lists in\n"
             "pinned host memory and every other index on the GPU; gpu: every\n"
             "index on the GPU; host: the large lists (ctkvr IVF, snapkv kept\n"
             "sets) in pinned host memory; both: gpu and host rows"},
    {.name = "--host-mem", .arg = "SIZE", .kind = HKV_OPT_FN, .fn = parse_host_mem,
     .help = "also cap the pinned host memory (far tier) the batch may use"},
    {.name = "--sink", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(plan_opts, sink),
     .lo = 0, .hi = 1 << 20, .help = "sink tokens in the near tier (default 4)"},
    {.name = "--local", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(plan_opts, local),
     .lo = 1, .hi = 1 << 22, .help = "local window in the near tier (default 256)"},
    {.name = "--far-kv", .arg = "TYPE", .kind = HKV_OPT_FN, .fn = parse_far_kv,
     .help = "the far tier's rows: f16 (default) or q8 (int8, a scale per 32)"},
    {.name = "--max-rows", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(plan_opts, max_rows),
     .lo = 1, .hi = 65536, .help = "rows per forward call, sizes the workspace (default 256)"},
    {.name = "--draft", .arg = "NAME|PATH", .kind = HKV_OPT_STR, .off = offsetof(plan_opts, draft),
     .help = "speckv/specpc's draft: a synthetic shape or a GGUF file (default:\n"
             "the target is its own draft)"},
    {.name = "--gen", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(plan_opts, gen),
     .lo = 0, .hi = (double)(1LL << 30),
     .help = "of each context, tokens generated after the prompt (specpc keeps\n"
             "C prompt tokens + these; default 0)"},
    {.name = "--batch", .arg = "N", .kind = HKV_OPT_STR, .off = offsetof(plan_opts, batch_str),
     .help = "admission check of N sequences: exit 1, naming what was needed\n"
             "and what was available, when any row does not fit"},
    {0},
};

static const hkv_opt plan_predict_table[] = {
    {.name = "--predict", .arg = "DEV", .kind = HKV_OPT_STR, .off = offsetof(plan_opts, predict),
     .help = "rtx4090, h100, h200, h100-pcie or a100: per policy (full, ctkvr), context\n"
             "and batch, the bytes each side moves per decode step, the step time,\n"
             "tokens/s and the wait fractions of the pipeline as built and of its\n"
             "target design; whether it fits (the plan above). Every figure is a\n"
             "prediction (docs/PREDICTIONS.md). --batch then takes a list (default\n"
             "1,4,16), --gpu-mem one cap (default the device's memory), --index\n"
             "defaults to host, --gen N counts decoded tokens (ctkvr's tail)"},
    {0},
};

/* The options that belong to --predict (pred_only names the first given). */
static const hkv_opt plan_predict_only[] = {
    {.name = "--host-gbs", .arg = "X", .kind = HKV_OPT_FLOAT, .off = offsetof(plan_opts, host_gbs),
     .lo = 1e-3, .hi = 1e5, .help = "host read bandwidth in GB/s instead of running the probe"},
    {.name = "--mem-eff", .arg = "F", .kind = HKV_OPT_FLOAT, .off = offsetof(plan_opts, mem_eff),
     .lo = 1e-3, .hi = 1, .help = "achievable share of the device's memory bandwidth (default 0.8)"},
    {.name = "--attn-eff", .arg = "F", .kind = HKV_OPT_FLOAT, .off = offsetof(plan_opts, attn_eff),
     .lo = 1e-3, .hi = 1,
     .help = "the same share for the decode attention alone (default: --mem-eff's;\n"
             "bench/predict_fit.py fits it to a GPU run's rows)"},
    {.name = "--host-eff", .arg = "F", .kind = HKV_OPT_FLOAT, .off = offsetof(plan_opts, host_eff),
     .lo = 1e-3, .hi = 1,
     .help = "share of the probed host bandwidth the CPU kernels reach (default\n"
             "0.8 for recall and rerank, 0.55 for sparse attention)"},
    {.name = "--cand-frac", .arg = "F", .kind = HKV_OPT_FLOAT, .off = offsetof(plan_opts, cand_frac),
     .lo = 1e-3, .hi = 1,
     .help = "ctkvr: unique candidates as a share of C' x rho (default 1: lists\n"
             "without overlap, an upper bound on the rerank's reads)"},
    {.name = "--host-wake-us", .arg = "US", .kind = HKV_OPT_FLOAT, .off = offsetof(plan_opts, wake_us),
     .lo = 1e-3, .hi = 1e5,
     .help = "the split's per-layer round trip beyond its work: the host's wake on\n"
             "the device's event and the team's fork (default 15; bench kernels\n"
             "--device cuda --only sync measures the wake)"},
    {.name = "--kernel-us", .arg = "US", .kind = HKV_OPT_FLOAT, .off = offsetof(plan_opts, kernel_us),
     .lo = 1e-3, .hi = 1e5,
     .help = "least time of one kernel launched op by op, its queueing by the host\n"
             "included (default 4)"},
    {.name = "--gemv-row-cost", .arg = "F", .kind = HKV_OPT_FLOAT,
     .off = offsetof(plan_opts, gemv_row_cost), .lo = 0, .hi = 16,
     .help = "each row of a Q4 GEMV past the first adds F of its one-row time\n"
             "(default 0, the roofline; the GPU runs measured about 0.25)"},
    {.name = "--trip-us", .arg = "US", .kind = HKV_OPT_FLOAT, .off = offsetof(plan_opts, trip_us),
     .lo = 0, .hi = 1e6,
     .help = "the built split's round trip per layer beyond the work the model\n"
             "prices: the device's recall latency, waits where neither side\n"
             "works (default 0; bench/predict_fit.py fits it and the terms\n"
             "above to a GPU run's rows)"},
    {.name = "--host-core-us", .arg = "US", .kind = HKV_OPT_FLOAT, .off = offsetof(plan_opts, core_us),
     .lo = 1e-3, .hi = 1e6,
     .help = "one core's far work of one (sequence, KV head) in a layer, its rows\n"
             "cached, in us (hetkv bench far -t 1 --warm: step ms x 1000 / (batch\n"
             "x KV heads)); the host's far part then takes at least that x items /\n"
             "--host-cores, however fast its memory (default: no such ceiling)"},
    {.name = "--host-cores", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(plan_opts, host_cores),
     .lo = 1, .hi = 4096,
     .help = "cores the host's far part runs on, for --host-core-us (default: this\n"
             "machine's physical cores)"},
    {.name = "--calibration", .arg = "FILE", .kind = HKV_OPT_STR,
     .off = offsetof(plan_opts, calibration),
     .help = "the measured terms above from bench/predict_fit.py's predict_fit.json\n"
             "(fitted to a GPU run's rows); a term's flag given as well wins"},
    {.name = "--pipeline", .arg = "WHICH", .kind = HKV_OPT_FN, .fn = parse_pipeline,
     .help = "built, target or both (default)"},
    {.name = "--kernels", .kind = HKV_OPT_FLAG, .off = offsetof(plan_opts, kernels),
     .help = "per kernel instead: bytes, FLOPs (and which unit), arithmetic\n"
             "intensity, bound and time of each device kernel of one decode\n"
             "step and of one prompt's prefill attention, as Markdown tables\n"
             "(or --json); --pipeline defaults to built"},
    {0},
};

/* A calibration file's terms, where no flag gave the term. */
static void apply_terms(plan_opts *o, const hkv_pred_terms *t) {
    if (!(o->mem_eff > 0)) o->mem_eff = t->mem_eff;
    if (!(o->attn_eff > 0)) o->attn_eff = t->attn_eff;
    if (o->gemv_row_cost < 0) o->gemv_row_cost = t->gemv_row_cost;
    if (!(o->kernel_us > 0)) o->kernel_us = t->kernel_us;
    if (!(o->host_eff > 0)) o->host_eff = t->host_eff;
    if (!(o->wake_us > 0)) o->wake_us = t->host_wake_us;
    if (o->trip_us < 0) o->trip_us = t->trip_us;
}

static int plan_uses(plan_opts *o, hkv_opt_use *u) {
    int n = 0;
    u[n++] = (hkv_opt_use){.opts = hkv_model_opts, .base = &o->model};
    u[n++] = (hkv_opt_use){.opts = plan_opts_table, .base = o};
    u[n++] = (hkv_opt_use){.opts = hkv_output_opts, .base = &o->out};
    u[n++] = (hkv_opt_use){.opts = plan_predict_table, .base = o,
                           .title = "PREDICTION of decode speed on a GPU from its data sheet (no GPU "
                                    "used or needed)"};
    u[n++] = (hkv_opt_use){.opts = plan_predict_only, .base = o, .first = &o->pred_only};
    static const char *const dev_omit[] = {"--host-mem", NULL};   /* plan's own, above */
    u[n++] = (hkv_opt_use){.opts = hkv_device_opts, .base = &o->dev, .omit = dev_omit,
                           .title = "Device and model source (--synthetic-weights: the weights' "
                                    "format on the device under --predict)"};
    return n;
}

static void fmt(uint64_t b, char *s) { hkv_fmt_bytes((double)b, s, 32); }

/* ---- --predict ------------------------------------------------------------------ */

typedef struct pred_opts {
    const char *device;
    uint64_t cap, host_cap;
    const long long *ctxs, *batches;
    int n_ctx, n_batch;
    const hkv_config *cfg;
    int n_cfg;
    int sink, local, max_rows, index_on_host, wtype, json, kernels, pingpong, far_q8;
    long long gen;
    double host_gbs, mem_eff, attn_eff, host_eff, cand_frac, wake_us, kernel_us, gemv_row_cost,
        trip_us, core_us;
    int host_cores;
    const char *pipeline;
    const char *calibration;          /* the terms' file, or NULL */
    const hkv_pred_terms *terms;      /* what it said */
} pred_opts;

typedef struct pred_row {
    char label[HKV_SPEC_LEN];
    long long ctx, batch;
    hkv_prediction pr;
} pred_row;

static const char *const mode_names[HKV_PRED_MODES] = {"built", "target"};

#define NUM(o, k, v, fmt) hkv_jset(o, k, hkv_jnum(v, fmt), bad)
#define INT(o, k, v) hkv_jset(o, k, json_integer((json_int_t)(v)), bad)

/* One pipeline's predicted step; step_ms and tok_s null where it does not
 * fit, cpu_wait_frac where there is no host part. */
static json_t *json_mode(const hkv_predict_mode *m, int fits, int has_host, int *bad) {
    json_t *o = json_object();
    hkv_jset(o, "step_ms", fits ? hkv_jnum(m->step_s * 1e3, "%.4f") : json_null(), bad);
    hkv_jset(o, "tok_s", fits ? hkv_jnum(m->tok_s, "%.3f") : json_null(), bad);
    hkv_jset(o, "dev_bytes", hkv_jint(m->dev_bytes), bad);
    hkv_jset(o, "dev_weight_bytes", hkv_jint(m->dev_weight_bytes), bad);
    hkv_jset(o, "dev_kv_bytes", hkv_jint(m->dev_kv_bytes), bad);
    hkv_jset(o, "dev_index_bytes", hkv_jint(m->dev_index_bytes), bad);
    hkv_jset(o, "pcie_down_bytes", hkv_jint(m->pcie_down_bytes), bad);
    hkv_jset(o, "pcie_up_bytes", hkv_jint(m->pcie_up_bytes), bad);
    hkv_jset(o, "host_bytes", hkv_jint(m->host_bytes), bad);
    hkv_jset(o, "host_index_bytes", hkv_jint(m->host_index_bytes), bad);
    hkv_jset(o, "host_rerank_bytes", hkv_jint(m->host_rerank_bytes), bad);
    hkv_jset(o, "host_attn_bytes", hkv_jint(m->host_attn_bytes), bad);
    NUM(o, "dev_busy_ms", m->dev_busy_s * 1e3, "%.4f");
    NUM(o, "dev_products_ms", m->dev_products_s * 1e3, "%.4f");
    NUM(o, "dev_attn_ms", m->dev_attn_s * 1e3, "%.4f");
    NUM(o, "host_busy_ms", m->host_busy_s * 1e3, "%.4f");
    NUM(o, "pcie_ms", m->pcie_s * 1e3, "%.4f");
    NUM(o, "dev_wait_frac", m->dev_wait_frac, "%.4f");
    hkv_jset(o, "cpu_wait_frac", has_host ? hkv_jnum(m->cpu_wait_frac, "%.4f") : json_null(), bad);
    NUM(o, "host_gbs_balance", m->host_gbs_balance, "%.2f");
    INT(o, "kernels", m->kernels);
    hkv_jset(o, "schedule", json_string(m->pingpong ? "ping-pong" : "serial"), bad);
    return o;
}

static const char *mode_desc(int mi) {
    return mi == HKV_PRED_BUILT
               ? "the pipeline as built: ctkvr's centroid recall on the device (C' slots go down), "
                 "the lists, rerank and attention on the host; products are the "
                 "dequantising GEMV for batch <= 8 (8-row GEMVs up to 32) and 32 MiB dequantised "
                 "fp32 panels + fp32 cuBLAS GEMMs above 32; only the device's near attention "
                 "overlaps the CPU's far work (with --gpu-pingpong: two micro-batches from batch 2)"
               : "the target design: ctkvr's recall and list union on the device (candidate ids go "
                 "down), "
                 "memory-bound products at any batch (tensor cores), two micro-batches in ping-pong "
                 "when that beats the serial order (weights read once per half)";
}

/* The shape of a kernel row in words. */
static void kshape_desc(const hkv_kstep_row *r, char *b, size_t n) {
    const hkv_kshape *s = &r->k.shape;
    switch (s->kind) {
    case HKV_KN_GEMV:
    case HKV_KN_PANEL_GEMM:
    case HKV_KN_TC_GEMM:
        snprintf(b, n, "W %lld x %lld %s, %lld rows", (long long)s->rows, (long long)s->cols,
                 hkv_predict_wtype_name(s->wtype), (long long)s->n);
        break;
    case HKV_KN_ATTN_DECODE:
        snprintf(b, n, "%d seq x %d/%d heads of %d, %lld keys%s, %d split%s", s->n_seq, s->H, s->KH,
                 s->d, (long long)s->keys, s->gather ? " (indexed)" : "", r->k.cost.n_split,
                 r->k.cost.n_split > 1 ? "s" : "");
        break;
    case HKV_KN_ATTN_PREFILL:
        snprintf(b, n, "%lld-token prompt, %d/%d heads of %d, %lld-query chunks", (long long)s->nq,
                 s->H, s->KH, s->d, (long long)s->n);
        break;
    case HKV_KN_RECALL_TOP:
    case HKV_KN_CTKVR_RECALL:
        snprintf(b, n, "%lld rows x %d KV heads, C %lld, C' %lld%s", (long long)s->n, s->KH,
                 (long long)s->C, (long long)s->Cp, s->kind == HKV_KN_CTKVR_RECALL ? ", lists" : "");
        break;
    case HKV_KN_CTKVR_BUILD:
        snprintf(b, n, "C %lld x %d KV heads over %lld keys, rho %lld", (long long)s->C, s->KH,
                 (long long)s->far, (long long)s->rho);
        break;
    case HKV_KN_ROPE_TABLE:
        snprintf(b, n, "%lld rows x %d pairs", (long long)s->n, (s->rot > 0 ? s->rot : s->d) / 2);
        break;
    case HKV_KN_ROPE:
    case HKV_KN_KV_APPEND:
    case HKV_KN_PARTIAL_CLEAR:
    case HKV_KN_ATTN_MERGE:
        snprintf(b, n, "%lld rows, %d heads of %d", (long long)s->n,
                 s->kind == HKV_KN_ROPE ? s->H + s->KH : s->kind == HKV_KN_KV_APPEND ? s->KH : s->H, s->d);
        break;
    default:
        snprintf(b, n, "%lld rows x %lld", (long long)s->n, (long long)s->width);
    }
}

/* The prediction parameters every configuration of a --predict table shares. */
static void pred_base(const pred_opts *o, const hkv_model_config *mc, const hkv_device_spec *dev,
                      double host_gbs, hkv_predict_params *base) {
    hkv_predict_defaults(base);
    base->cfg = mc;
    base->dev = dev;
    base->wtype = o->wtype;
    base->n_gen = o->gen;
    base->L_init = o->sink;
    base->L_local = o->local;
    base->index_on_host = o->index_on_host;
    base->pingpong = o->pingpong;
    base->far_q8 = o->far_q8;
    base->gpu_cap = o->cap;
    base->host_cap = o->host_cap;
    base->max_rows = o->max_rows;
    base->host_gbs = host_gbs;
    if (o->mem_eff > 0) base->mem_eff = o->mem_eff;
    if (o->attn_eff > 0) base->attn_eff = o->attn_eff;
    if (o->host_eff > 0) base->host_eff_scan = base->host_eff_attn = o->host_eff;
    if (o->cand_frac > 0) base->cand_frac = o->cand_frac;
    if (o->wake_us > 0) base->t_host = o->wake_us * 1e-6;
    if (o->kernel_us > 0) base->t_kernel = o->kernel_us * 1e-6;
    if (o->gemv_row_cost >= 0) base->gemv_row_cost = o->gemv_row_cost;
    if (o->trip_us >= 0) base->t_trip = o->trip_us * 1e-6;
    if (o->core_us > 0) base->host_core_s = o->core_us * 1e-6, base->host_cores = o->host_cores;
}

/* One kernel row of the --kernels tables. */
static json_t *json_krow(const hkv_kstep_row *r, int *bad) {
    const hkv_kcost *c = &r->k.cost;
    const hkv_ktime *t = &r->k.time;
    char sh[160];
    kshape_desc(r, sh, sizeof sh);
    json_t *o = json_object();
    hkv_jset(o, "prediction", json_true(), bad);
    hkv_jset(o, "what", hkv_jstr(r->what), bad);
    hkv_jset(o, "kernel", hkv_jstr(c->name), bad);
    hkv_jset(o, "file", hkv_jstr(c->file), bad);
    hkv_jset(o, "built", json_boolean(c->built), bad);
    hkv_jset(o, "shape", hkv_jstr(sh), bad);
    hkv_jset(o, "phase", hkv_jstr(r->phase), bad);
    INT(o, "calls", r->calls);
    INT(o, "launches", c->launches);
    hkv_jset(o, "bytes_read", hkv_jint(c->bytes_read), bad);
    hkv_jset(o, "bytes_written", hkv_jint(c->bytes_written), bad);
    hkv_jset(o, "l2_bytes", hkv_jint(c->l2_bytes), bad);
    hkv_jset(o, "flops_tensor", hkv_jint(c->flops[HKV_KU_TENSOR]), bad);
    hkv_jset(o, "flops_fp32", hkv_jint(c->flops[HKV_KU_FP32]), bad);
    hkv_jset(o, "flops_fp64", hkv_jint(c->flops[HKV_KU_FP64]), bad);
    hkv_jset(o, "sfu_ops", hkv_jint(c->flops[HKV_KU_SFU]), bad);
    hkv_jset(o, "useful_flops", hkv_jint(c->useful_flops), bad);
    hkv_jset(o, "unit", json_string(hkv_kernel_unit_name(c->unit)), bad);
    NUM(o, "ai", t->ai, "%.4f");
    hkv_jset(o, "bound", json_string(hkv_kernel_bound_name(t->bound)), bad);
    hkv_jset(o, "bound_unit", json_string(hkv_kernel_unit_name(t->bound_unit)), bad);
    NUM(o, "t_mem_us", t->t_mem * 1e6, "%.4f");
    NUM(o, "t_compute_us", (t->t_roof > t->t_mem ? t->t_roof : 0) * 1e6, "%.4f");
    NUM(o, "us", t->t_s * 1e6, "%.4f");
    return o;
}

/* --predict DEV --kernels: the per-kernel roofline of each configuration. */
static int plan_kernels(const pred_opts *o, const hkv_model_config *mc, hkv_err *err) {
    const hkv_device_spec *dev = hkv_device_spec_find(o->device, err);
    if (!dev) return err->code;
    hkv_predict_params base;
    /* the host's bandwidth changes no kernel figure; ctkvr's parameters are
     * resolved through hkv_predict, which wants one */
    pred_base(o, mc, dev, o->host_gbs > 0 ? o->host_gbs : 1, &base);
    hkv_keff ke;
    hkv_keff_from_params(&base, &ke);
    const int show[HKV_PRED_MODES] = {strcmp(o->pipeline, "target") != 0,
                                      !strcmp(o->pipeline, "target") || !strcmp(o->pipeline, "both")};
    enum { CAP = 32 };
    hkv_kstep_row rows[CAP];
    int jb = 0, *bad = &jb;   /* --json: the object, its tables added below */
    json_t *jo = NULL, *tables = NULL;
    if (o->json) {
        jo = json_object();
        tables = json_array();
        hkv_jset(jo, "prediction", json_true(), bad);
        hkv_jset(jo, "note", json_string("PREDICTION per kernel: a roofline from the device's data "
                                         "sheet and the kernels' structure; no GPU was used"), bad);
        hkv_jset(jo, "device", hkv_jstr(dev->name), bad);
        hkv_jset(jo, "source", hkv_jstr(dev->source), bad);
        json_t *a = json_object();
        NUM(a, "mem_eff", ke.mem_eff, "%.3f");
        NUM(a, "attn_eff", ke.attn_eff > 0 ? ke.attn_eff : ke.mem_eff, "%.3f");
        NUM(a, "compute_eff", ke.compute_eff, "%.3f");
        NUM(a, "t_kernel_us", ke.t_kernel * 1e6, "%.2f");
        NUM(a, "sat_frac", ke.sat_frac, "%.3f");
        hkv_jset(jo, "assumptions", a, bad);
        hkv_jset(jo, "model", hkv_jstr(mc->name), bad);
        hkv_jset(jo, "weights", json_string(hkv_predict_wtype_name(base.wtype)), bad);
    } else {
        printf("PREDICTION per kernel, not a measurement: no GPU was used; a roofline from the data "
               "sheet of %s (%.0f GB/s x %.2f; fp16 tensor %.1f, fp32 %.1f, fp64 %.2f TFLOPS, SFU %.2f "
               "Tops, x %.2f; %d SMs; L2 %.0f MiB), each launch at least %.0f us, a grid under %.2f "
               "of the SMs reaching that share of the bandwidth\n",
               dev->label, dev->mem_gbs, ke.mem_eff, dev->tensor_tflops, dev->fp32_tflops,
               dev->fp64_tflops, dev->sfu_tops, ke.compute_eff, dev->sms, dev->l2_mib,
               ke.t_kernel * 1e6, ke.sat_frac);
        printf("PREDICTION data sheet: %s\n", dev->source);
    }
    int rc = HKV_OK;
    for (int pi = 0; pi < o->n_cfg && !rc; pi++)
        for (int xi = 0; xi < o->n_ctx && !rc; xi++)
            for (int bi = 0; bi < o->n_batch && !rc; bi++)
                for (int mi = 0; mi < HKV_PRED_MODES && !rc; mi++) {
                    if (!show[mi]) continue;
                    hkv_policy_args args = o->cfg[pi].args;
                    hkv_predict_params pp = base;
                    pp.policy = o->cfg[pi].def;
                    pp.args = &args;
                    pp.batch = (int)o->batches[bi];
                    pp.n_ctx = o->ctxs[xi];
                    pp.far_q8 |= o->cfg[pi].far_q8;
                    char label[HKV_SPEC_LEN];
                    far_describe(pp.policy, &args, pp.n_ctx, pp.far_q8, label, sizeof label);
                    int n = 0;
                    if ((rc = hkv_kernel_step_rows(&pp, mi, rows, CAP, &n, err))) break;
                    double step_us = 0;
                    for (int i = 0; i < n; i++)
                        if (strcmp(rows[i].phase, "prompt")) step_us += rows[i].calls * rows[i].k.time.t_s * 1e6;
                    if (o->json) {
                        json_t *tb = json_object(), *ra = json_array();
                        hkv_jset(tb, "prediction", json_true(), bad);
                        hkv_jset(tb, "policy", hkv_jstr(label), bad);
                        INT(tb, "ctx", pp.n_ctx);
                        INT(tb, "batch", pp.batch);
                        hkv_jset(tb, "pipeline", json_string(mode_names[mi]), bad);
                        NUM(tb, "step_kernels_us", step_us, "%.3f");
                        for (int i = 0; i < n; i++) hkv_jpush(ra, json_krow(&rows[i], bad), bad);
                        hkv_jset(tb, "rows", ra, bad);
                        hkv_jpush(tables, tb, bad);
                        continue;
                    }
                    printf("\nPREDICTION %s, %s, context %lld, batch %lld, pipeline \"%s\" on %s; "
                           "per call unless marked; the decode step's kernels sum to %.1f us "
                           "(PREDICTED)\n\n", mc->name, label, (long long)pp.n_ctx, (long long)pp.batch,
                           mode_names[mi], dev->name, step_us);
                    printf("| kernel (what) | shape | calls | PREDICTED MB moved | PREDICTED GFLOP "
                           "(unit) | PREDICTED FLOP/B | PREDICTED bound | PREDICTED us/call | "
                           "PREDICTED us total |\n|---|---|--:|--:|--:|--:|---|--:|--:|\n");
                    for (int i = 0; i < n; i++) {
                        const hkv_kstep_row *r = &rows[i];
                        const hkv_kcost *c = &r->k.cost;
                        const hkv_ktime *t = &r->k.time;
                        char sh[160], bound[48];
                        kshape_desc(r, sh, sizeof sh);
                        if (t->bound == HKV_KB_COMPUTE)
                            snprintf(bound, sizeof bound, "compute (%s)", hkv_kernel_unit_name(t->bound_unit));
                        else
                            snprintf(bound, sizeof bound, "%s", hkv_kernel_bound_name(t->bound));
                        printf("| `%s`%s (%s) | %s | %lld/%s | %.3f | %.4g (%s) | %.2f | %s | %.2f | %.1f |\n",
                               c->name, c->built ? "" : " NOT BUILT", r->what, sh, (long long)r->calls,
                               r->phase, c->bytes / 1e6, c->flops[c->unit] / 1e9,
                               hkv_kernel_unit_name(c->unit), t->ai, bound, t->t_s * 1e6,
                               r->calls * t->t_s * 1e6);
                    }
                }
    if (o->json) {
        hkv_jset(jo, "tables", tables, bad);
        return rc ? (json_decref(jo), rc) : hkv_json_emit(stdout, jo, jb, err);
    }
    if (rc) return rc;
        printf("\nPREDICTION columns: MB = 1e6 bytes of device memory read + written per call; GFLOP "
               "on the unit named (tensor fp16: 2 per MMA multiply-add, including the hi/lo "
               "splits' repeats); FLOP/B their ratio; calls per decode step (layer kernels: n_layer "
               "times) or per prompt (the prefill row: all its chunks, a layer a call; ctkvr's index "
               "build: a layer a call); us/call = "
               "max(bytes / bandwidth, FLOPs / rate of each unit, launches x %.0f us)\n",
               ke.t_kernel * 1e6);
    return HKV_OK;
}

static int plan_predict(const pred_opts *o, const hkv_model_config *mc, hkv_err *err) {
    const hkv_device_spec *dev = hkv_device_spec_find(o->device, err);
    if (!dev) return err->code;
    int any_ct = 0;
    for (int i = 0; i < o->n_cfg; i++) {
        if (o->cfg[i].def != &hkv_policy_full && o->cfg[i].def != &hkv_policy_ctkvr)
            return hkv_seterr(err, HKV_E_UNSUPPORTED, "--predict: no speed model for policy '%s' "
                              "(models exist for full and ctkvr)", o->cfg[i].def->name);
        any_ct |= o->cfg[i].def == &hkv_policy_ctkvr;
    }
    double hgbs = o->host_gbs;
    const char *hsrc = "given with --host-gbs";
    char hsrc_buf[160];
    if (any_ct && !(hgbs > 0)) {   /* the host's read bandwidth, measured now */
        const int reps = 5;
        double bps = hkv_bandwidth_probe((size_t)512 << 20, reps);
        if (!(bps > 0))
            return hkv_seterr(err, HKV_E_INTERNAL, "--predict: the bandwidth probe failed; give "
                              "the host's read bandwidth with --host-gbs X");
        hgbs = bps / 1e9;
        snprintf(hsrc_buf, sizeof hsrc_buf, "measured by hkv_bandwidth_probe in this run (%d "
                 "threads, 512 MiB, best of %d)", omp_get_max_threads(), reps);
        hsrc = hsrc_buf;
    }
    hkv_predict_params base;
    pred_base(o, mc, dev, hgbs, &base);

    const int n = o->n_cfg * o->n_ctx * o->n_batch;
    pred_row *rows = calloc((size_t)n, sizeof *rows);
    if (!rows) return hkv_seterr(err, HKV_E_NOMEM, "--predict: no memory for the table");
    int nr = 0, rc = HKV_OK;
    for (int pi = 0; pi < o->n_cfg && !rc; pi++)
        for (int xi = 0; xi < o->n_ctx && !rc; xi++) {
            /* A budget written in the spec resolves per context as in the plan table. */
            hkv_policy_args args = o->cfg[pi].args;
            int64_t budget, far = o->ctxs[xi] - o->sink - o->local;
            char key[40] = "";
            if (o->cfg[pi].budget_key) snprintf(key, sizeof key, "%s=", o->cfg[pi].budget_key);
            if (key[0] && strstr(o->cfg[pi].spec, key) &&
                (rc = hkv_config_resolve(&o->cfg[pi], o->ctxs[xi], far > 0 ? far : 0, &args, &budget,
                                          NULL, 0, err)))
                break;
            for (int bi = 0; bi < o->n_batch && !rc; bi++) {
                pred_row *r = &rows[nr++];
                hkv_predict_params pp = base;
                pp.policy = o->cfg[pi].def;
                pp.args = &args;
                pp.batch = (int)o->batches[bi];
                pp.n_ctx = o->ctxs[xi];
                pp.far_q8 |= o->cfg[pi].far_q8;
                r->ctx = o->ctxs[xi];
                r->batch = o->batches[bi];
                far_describe(pp.policy, &args, pp.n_ctx, pp.far_q8, r->label, sizeof r->label);
                rc = hkv_predict(&pp, &r->pr, err);
            }
        }
    if (rc) {
        free(rows);
        return rc;
    }
    const int show[HKV_PRED_MODES] = {strcmp(o->pipeline, "target") != 0,
                                      strcmp(o->pipeline, "built") != 0};
    const hkv_predict_params *bp = &base;
    const uint64_t cap = rows[0].pr.cap;
    if (o->json) {
        int jb = 0, *bad = &jb;
        json_t *jo = json_object(), *d = json_object(), *a = json_object(), *ra = json_array();
        hkv_jset(jo, "prediction", json_true(), bad);
        hkv_jset(jo, "note", json_string("PREDICTION from the device's data sheet, the model's shape and "
                                         "the host's read bandwidth; no GPU was used and nothing here is "
                                         "a measurement of one"), bad);
        hkv_jset(d, "name", hkv_jstr(dev->name), bad);
        hkv_jset(d, "label", hkv_jstr(dev->label), bad);
        INT(d, "mem_bytes", dev->mem_bytes);
        NUM(d, "mem_gbs", dev->mem_gbs, "%.1f");
        hkv_jset(d, "pcie", hkv_jstr(dev->pcie), bad);
        NUM(d, "pcie_gbs", dev->pcie_gbs, "%.1f");
        NUM(d, "tensor_tflops", dev->tensor_tflops, "%.1f");
        NUM(d, "fp32_tflops", dev->fp32_tflops, "%.1f");
        INT(d, "sms", dev->sms);
        hkv_jset(d, "source", hkv_jstr(dev->source), bad);
        hkv_jset(jo, "device", d, bad);
        hkv_jset(jo, "host_gbs", any_ct ? hkv_jnum(hgbs, "%.2f") : json_null(), bad);
        hkv_jset(jo, "host_gbs_from", hkv_jstr(any_ct ? hsrc : "not used (no CPU part)"), bad);
        NUM(a, "mem_eff", bp->mem_eff, "%.3f");
        NUM(a, "attn_eff", bp->attn_eff > 0 ? bp->attn_eff : bp->mem_eff, "%.3f");
        NUM(a, "pcie_eff", bp->pcie_eff, "%.3f");
        NUM(a, "compute_eff", bp->compute_eff, "%.3f");
        NUM(a, "host_eff_scan", bp->host_eff_scan, "%.3f");
        NUM(a, "host_eff_attn", bp->host_eff_attn, "%.3f");
        NUM(a, "cand_frac", bp->cand_frac, "%.3f");
        NUM(a, "t_kernel_us", bp->t_kernel * 1e6, "%.2f");
        NUM(a, "t_copy_us", bp->t_copy * 1e6, "%.2f");
        NUM(a, "t_host_us", bp->t_host * 1e6, "%.2f");
        NUM(a, "gemv_row_cost", bp->gemv_row_cost, "%.4f");
        NUM(a, "t_trip_us", bp->t_trip * 1e6, "%.2f");
        hkv_jset(a, "host_core_us", bp->host_core_s > 0 ? hkv_jnum(bp->host_core_s * 1e6, "%.3f") : json_null(),
                 bad);
        hkv_jset(a, "host_cores", bp->host_core_s > 0 ? json_integer(bp->host_cores) : json_null(), bad);
        hkv_jset(a, "calibration", o->calibration ? hkv_jstr(o->calibration) : json_null(), bad);
        if (o->calibration) {
            hkv_jset(a, "calibration_device", hkv_jstr(o->terms->device), bad);
            hkv_jset(a, "calibration_commits", hkv_jstr(o->terms->commits), bad);
        }
        hkv_jset(jo, "assumptions", a, bad);
        hkv_jset(jo, "model", hkv_jstr(mc->name), bad);
        hkv_jset(jo, "weights", json_string(hkv_predict_wtype_name(bp->wtype)), bad);
        INT(jo, "gpu_weight_bytes", rows[0].pr.gpu_weights);
        INT(jo, "sink", o->sink);
        INT(jo, "local", o->local);
        INT(jo, "gen", o->gen);
        hkv_jset(jo, "index_on", json_string(o->index_on_host ? "host" : "gpu"), bad);
        INT(jo, "cap", cap);
        for (int i = 0; i < nr; i++) {
            const pred_row *r = &rows[i];
            json_t *x = json_object();
            hkv_jset(x, "prediction", json_true(), bad);
            hkv_jset(x, "policy", hkv_jstr(r->label), bad);
            INT(x, "ctx", r->ctx);
            INT(x, "batch", r->batch);
            hkv_jset(x, "fits", json_boolean(r->pr.fits), bad);
            INT(x, "gpu_bytes", r->pr.plan.gpu_total);
            INT(x, "pinned_bytes", r->pr.plan.pinned);
            if (!r->pr.fits) hkv_jset(x, "refusal", hkv_jstr(r->pr.refusal), bad);
            if (r->pr.has_host) {
                INT(x, "candidates", r->pr.candidates);
                INT(x, "selected", r->pr.selected);
                hkv_jset(x, "rerank", json_boolean(r->pr.rerank), bad);
            }
            for (int mi = 0; mi < HKV_PRED_MODES; mi++)
                if (show[mi])
                    hkv_jset(x, mode_names[mi], json_mode(&r->pr.mode[mi], r->pr.fits, r->pr.has_host, bad),
                             bad);
            hkv_jpush(ra, x, bad);
        }
        hkv_jset(jo, "rows", ra, bad);
        free(rows);
        return hkv_json_emit(stdout, jo, jb, err);
    }
    char cp[32], wb[32];
    hkv_fmt_bytes((double)cap, cp, sizeof cp);
    hkv_fmt_bytes((double)rows[0].pr.gpu_weights, wb, sizeof wb);
    printf("PREDICTION, not a measurement: no GPU was used; figures come from a data sheet, the "
           "model's shape and the host's bandwidth\n");
    printf("PREDICTION device %s = %s: %.0f GB/s x %.2f (decode attention x %.2f), %s %.1f GB/s "
           "each way x %.2f, fp16 tensor %.1f TFLOPS dense, fp32 %.1f TFLOPS (x %.2f), %d SMs\n",
           dev->name, dev->label, dev->mem_gbs, bp->mem_eff,
           bp->attn_eff > 0 ? bp->attn_eff : bp->mem_eff, dev->pcie, dev->pcie_gbs, bp->pcie_eff,
           dev->tensor_tflops, dev->fp32_tflops, bp->compute_eff, dev->sms);
    printf("PREDICTION data sheet: %s\n", dev->source);
    if (any_ct)
        printf("PREDICTION host read bandwidth %.1f GB/s, %s; CPU kernels at %.2f (recall, rerank) and "
               "%.2f (sparse attention) of it; ctkvr candidates %.2f of C' x rho\n", hgbs, hsrc,
               bp->host_eff_scan, bp->host_eff_attn, bp->cand_frac);
    else
        printf("PREDICTION host bandwidth not used: no policy with a CPU part\n");
    if (any_ct && bp->host_core_s > 0)
        printf("PREDICTION host cores: %d, each %.1f us for one sequence and KV head's far work of a "
               "layer (--host-core-us): the host's far part takes at least that x items / cores\n",
               bp->host_cores, bp->host_core_s * 1e6);
    printf("PREDICTION model %s: %d layers, %d/%d heads of %d; device weights %s (%s); near tier %d + "
           "%d; cap %s; per kernel %.0f us, per copy %.0f us, host wake per layer %.0f us%s\n",
           mc->name, mc->n_layer, mc->n_head, mc->n_head_kv, mc->head_dim,
           hkv_predict_wtype_name(bp->wtype), wb, o->sink, o->local, cp, bp->t_kernel * 1e6,
           bp->t_copy * 1e6, bp->t_host * 1e6, o->gen ? "" : "; right after the prompt (--gen 0)");
    if (o->calibration)
        printf("PREDICTION terms from %s, fitted by bench/predict_fit.py on %s rows of commit %s, "
               "carried here as they are\n", o->calibration, o->terms->device,
               o->terms->commits[0] ? o->terms->commits : "(not recorded)");
    if (bp->gemv_row_cost > 0 || bp->t_trip > 0 || bp->attn_eff > 0)
        printf("PREDICTION measured terms: decode attention x %.2f, each GEMV row past the first "
               "+%.2f of its time, the built split's round trip +%.0f us a layer\n",
               bp->attn_eff > 0 ? bp->attn_eff : bp->mem_eff, bp->gemv_row_cost, bp->t_trip * 1e6);
    for (int mi = 0; mi < HKV_PRED_MODES; mi++) {
        if (!show[mi]) continue;
        printf("\nPREDICTION pipeline \"%s\": %s. full: the whole KV on the device, no CPU part.\n",
               mode_names[mi], mode_desc(mi));
        printf("PREDICTION %-32s %7s %5s %-4s| %9s %9s %8s | %9s %9s | %8s %8s%s\n", "policy", "context",
               "batch", "fits", "device GB", "PCIe MB", "host GB", "step ms", "tok/s", "dev idle",
               "CPU idle", mi == HKV_PRED_TARGET ? " | host GB/s to balance  schedule" : "");
        for (int i = 0; i < nr; i++) {
            const pred_row *r = &rows[i];
            const hkv_predict_mode *m = &r->pr.mode[mi];
            char ms[32] = "-", ts[32] = "-", dw[16] = "-", cw[16] = "-", hb[16] = "-", bal[24] = "-";
            if (r->pr.fits) {
                snprintf(ms, sizeof ms, "%.2f", m->step_s * 1e3);
                snprintf(ts, sizeof ts, "%.1f", m->tok_s);
                snprintf(dw, sizeof dw, "%.0f%%", m->dev_wait_frac * 100);
                if (r->pr.has_host) snprintf(cw, sizeof cw, "%.0f%%", m->cpu_wait_frac * 100);
            }
            if (r->pr.has_host) {
                snprintf(hb, sizeof hb, "%.3f", m->host_bytes / 1e9);
                if (m->host_gbs_balance > 0) snprintf(bal, sizeof bal, "%.1f", m->host_gbs_balance);
            }
            printf("           %-32s %7lld %5lld %-4s| %9.3f %9.3f %8s | %9s %9s | %8s %8s", r->label,
                   r->ctx, r->batch, r->pr.fits ? "yes" : "NO", m->dev_bytes / 1e9,
                   (m->pcie_down_bytes + m->pcie_up_bytes) / 1e6, hb, ms, ts, dw, cw);
            if (mi == HKV_PRED_TARGET)
                printf(" | %21s  %s", bal, r->pr.has_host ? (m->pingpong ? "ping-pong" : "serial") : "-");
            printf("\n");
        }
    }
    printf("\nPREDICTION columns: bytes per decode step for the whole batch (device: weights + K/V "
           "attended + index read there; PCIe: both ways; host: index + rerank keys + selected K/V, "
           "1 GB = 1e9 B); dev idle: share of the step the device waits for PCIe and the CPU; CPU "
           "idle: share the CPU waits for the device\n");
    for (int i = 0; i < nr; i++)
        if (!rows[i].pr.fits)
            printf("PREDICTION does not fit: %s\n", rows[i].pr.refusal);
    free(rows);
    return HKV_OK;
}

int hkv_cmd_plan(int argc, char **argv) {
    hkv_err err;
    hkv_err_clear(&err);
    plan_opts o = {.policies = "full,ctkvr", .where = "auto", .ctxs = {32768, 98304}, .n_ctx = 2,
                   .sink = 4, .local = 256, .max_rows = 256, .gemv_row_cost = -1, .trip_us = -1};
    hkv_device_cli_init(&o.dev);
    hkv_opt_use uses[8];
    const int n_uses = plan_uses(&o, uses);
    int rc = hkv_opts_parse("plan", uses, n_uses, argc, argv, &err);
    if (rc == 1) {
        hkv_opts_help(stdout, plan_usage, uses, n_uses);
        return 0;
    }
    if (!rc && o.out.rows_fmt == HKV_ROWS_JSON) o.out.json = 1;   /* the one JSON object, as bench and eval */
    else if (!rc && o.out.rows_fmt) return hkv_plan_rows(argc, argv, o.out.rows_fmt);
    hkv_pred_terms terms = {0};
    if (!rc && o.calibration && !(rc = hkv_pred_terms_load(o.calibration, &terms, &err)))
        apply_terms(&o, &terms);
    /* the names the planning code below was written with */
    const char *model = o.model, *policies = o.policies, *configs = o.configs, *where = o.where;
    const char *draft = o.draft, *predict = o.predict, *batch_str = o.batch_str;
    const char *pipeline = o.pipeline, *pred_only = o.pred_only;
    long long *ctxs = o.ctxs, sink = o.sink, local = o.local, max_rows = o.max_rows, batch = 0;
    long long gen = o.gen, batches[MAXL] = {1, 4, 16};
    int n_batch = 3;
    double host_gbs = o.host_gbs, mem_eff = o.mem_eff, host_eff = o.host_eff, cand_frac = o.cand_frac;
    int n_ctx = o.n_ctx, n_caps = o.n_caps, json = o.out.json, kernels = o.kernels;
    uint64_t *caps = o.caps, host_cap = o.host_cap;
    hkv_device_cli dc = o.dev;
    if (!rc && batch_str) {
        if (predict) {
            n_batch = MAXL;
            rc = hkv_arg_int_list("--batch", batch_str, 1, 1 << 20, batches, &n_batch, &err);
        } else {
            rc = hkv_arg_int("--batch", batch_str, 1, 1 << 20, &batch, &err);
        }
    }
    if (!rc && pred_only && !predict)
        rc = hkv_seterr(&err, HKV_E_INVAL, "%s belongs to --predict DEVICE", pred_only);
    if (!rc && predict) {
        if (dc.cuda)
            rc = hkv_seterr(&err, HKV_E_INVAL, "--predict models a device from its data sheet; it "
                            "does not take --device cuda");
        else if (draft)
            rc = hkv_seterr(&err, HKV_E_INVAL, "--predict: --draft does not apply (policies full "
                            "and ctkvr)");
        else if (n_caps > 1)
            rc = hkv_seterr(&err, HKV_E_INVAL, "--predict takes one --gpu-mem cap, not %d", n_caps);
        else if (!strcmp(where, "both"))
            rc = hkv_seterr(&err, HKV_E_INVAL, "--predict: --index gpu or host, not both");
        else if (!hkv_device_spec_find(predict, &err))
            rc = err.code;
        else if (o.host_cores > 0 && !(o.core_us > 0))
            rc = hkv_seterr(&err, HKV_E_INVAL, "--host-cores: the cores of --host-core-us's "
                            "ceiling; give both");
    }
    if (!rc && predict && o.core_us > 0 && !(o.host_cores > 0)) {   /* this machine's cores */
        hkv_topo_info ti;
        if ((rc = hkv_topo_query(&ti, &err)) == HKV_OK) o.host_cores = ti.n_cores > 0 ? ti.n_cores : 1;
    }
    if (!rc && !model == !dc.synthetic)
        rc = hkv_seterr(&err, HKV_E_INVAL, model ? "plan: give -m MODEL or --synthetic NAME, not both"
                                                 : "plan: no model (-m MODEL or --synthetic NAME)");
    if (!rc && !n_caps && !dc.cuda && !predict)
        rc = hkv_seterr(&err, HKV_E_INVAL, "plan: no cap (--gpu-mem SIZE[,SIZE...] or --device cuda)");
    if (!rc && strchr(policies, ':'))
        rc = hkv_seterr(&err, HKV_E_INVAL, "--policy takes names; give arguments with --configs "
                        "\"ctkvr:C=512;full\"");
    if (rc) {
        hkv_err_report(&err, stderr);
        return 2;
    }
    char spec[512], dev_desc[256] = "";
    if (!configs) {   /* "full,ctkvr" -> "full;ctkvr" */
        snprintf(spec, sizeof spec, "%s", policies);
        for (char *c = spec; *c; c++)
            if (*c == ',') *c = ';';
        configs = spec;
    }
    hkv_config cfg[HKV_MAX_CONFIGS];
    int n_cfg = 0;
    hkv_model_config mc, dmc;
    row *rows = NULL;
    if ((rc = hkv_configs_parse(configs, cfg, &n_cfg, HKV_MAX_CONFIGS, &err)) ||
        (rc = hkv_cli_model_config(model, dc.synthetic, &mc, &err)))
        goto out;
    /* --draft: a synthetic shape by name, else a GGUF file's metadata. */
    if (draft && hkv_synthetic_config(draft, &dmc, &err) != HKV_OK &&
        (rc = hkv_cli_model_config(draft, NULL, &dmc, &err))) {
        hkv_err_prefix(&err, "--draft '%s' (a synthetic shape or a GGUF file)", draft);
        goto out;
    }
    if (draft && dmc.vocab != mc.vocab) {
        rc = hkv_seterr(&err, HKV_E_INVAL, "--draft %s has a vocabulary of %d, the target %d: a "
                        "draft must share the target's tokenizer", draft, dmc.vocab, mc.vocab);
        goto out;
    }
    for (int i = 0; i < n_ctx && !rc; i++)
        if (gen >= ctxs[i])
            rc = hkv_seterr(&err, HKV_E_RANGE, "--gen %lld leaves no prompt in a context of %lld",
                            gen, ctxs[i]);
    if (rc) goto out;
    if (predict) {
        pred_opts po = {.device = predict, .cap = n_caps ? caps[0] : 0, .host_cap = host_cap,
                        .ctxs = ctxs, .n_ctx = n_ctx, .batches = batches, .n_batch = n_batch,
                        .cfg = cfg, .n_cfg = n_cfg, .sink = (int)sink, .local = (int)local,
                        .max_rows = (int)max_rows, .gen = gen,
                        .index_on_host = strcmp(where, "gpu") != 0,
                        .wtype = dc.synthetic_wtype, .host_gbs = host_gbs, .mem_eff = mem_eff,
                        .attn_eff = o.attn_eff,
                        .host_eff = host_eff, .cand_frac = cand_frac,
                        .wake_us = o.wake_us, .kernel_us = o.kernel_us,
                        .gemv_row_cost = o.gemv_row_cost, .trip_us = o.trip_us,
                        .core_us = o.core_us, .host_cores = (int)o.host_cores,
                        .calibration = o.calibration, .terms = &terms,
                        .pipeline = pipeline ? pipeline : kernels ? "built" : "both",
                        .json = json, .kernels = kernels, .pingpong = dc.pingpong,
                        .far_q8 = o.far_q8};
        rc = kernels ? plan_kernels(&po, &mc, &err) : plan_predict(&po, &mc, &err);
        goto out;
    }
    if (dc.cuda) {   /* the device's free memory, or each --gpu-mem checked against it */
        hkv_device_cli one = dc;
        for (int i = 0; i < (n_caps ? n_caps : 1) && !rc; i++) {
            one.gpu_mem = n_caps ? caps[i] : 0;
            uint64_t c;
            if (!(rc = hkv_device_cli_cap(&one, &c, dev_desc, sizeof dev_desc, &err))) caps[i] = c;
        }
        if (rc) goto out;
        if (!n_caps) n_caps = 1;
    }
    int n_place = !strcmp(where, "both") ? 2 : 1;
    uint64_t wbytes = 0;   /* the weights as --device cuda holds them, as its admission counts */
    const char *wname = "fp16";
    if ((rc = hkv_device_cli_weight_bytes(&dc, model, &mc, &wbytes, &wname, &err))) goto out;
    int nr = 0, refused = 0;
    rows = calloc((size_t)n_caps * n_ctx * n_cfg * n_place, sizeof *rows);
    if (!rows) {
        rc = hkv_seterr(&err, HKV_E_NOMEM, "plan: no memory for the table");
        goto out;
    }
    for (int ci = 0; ci < n_caps; ci++)
        for (int xi = 0; xi < n_ctx; xi++)
            for (int pi = 0; pi < n_cfg; pi++)
                for (int wi = 0; wi < n_place; wi++) {
                    int on_host = n_place == 2       ? wi
                                  : !strcmp(where, "auto") ? hkv_plan_pipeline_index_on_host(cfg[pi].def)
                                                           : !strcmp(where, "host");
                    hkv_policy_args args;
                    int64_t budget;
                    int64_t far = ctxs[xi] - sink - local;
                    row *r = &rows[nr];
                    memset(r, 0, sizeof *r);
                    if ((rc = hkv_config_resolve(&cfg[pi], ctxs[xi], far > 0 ? far : 0, &args,
                                                  &budget, NULL, 0, &err)))
                        goto out;
                    far_describe(cfg[pi].def, &args, ctxs[xi], o.far_q8 || cfg[pi].far_q8,
                                 r->label, sizeof r->label);
                    hkv_plan_params pp = {.cfg = &mc, .batch = 1, .n_ctx = ctxs[xi],
                                          .L_init = (int)sink, .L_local = (int)local,
                                          .policy = cfg[pi].def, .args = &args,
                                          .max_rows = (int)max_rows, .index_on_host = on_host,
                                          .draft = draft ? &dmc : NULL, .n_gen = gen,
                                          .far_q8 = o.far_q8 || cfg[pi].far_q8,
                                          .weight_bytes = wbytes};
                    if ((rc = hkv_plan_compute(&pp, &r->one, &err))) goto out;
                    /* Placement only matters to policies with lists that can move. */
                    if (wi == 1 && r->one.index == rows[nr - 1].one.index &&
                        r->one.pinned == rows[nr - 1].one.pinned)
                        continue;
                    r->cap = caps[ci];
                    r->ctx = ctxs[xi];
                    r->on_host = on_host;
                    if ((rc = hkv_plan_max_batch(&pp, r->cap, 1 << 20, &r->max_batch, &err))) goto out;
                    if (host_cap && r->one.per_seq_pinned &&
                        (uint64_t)r->max_batch > host_cap / r->one.per_seq_pinned) {
                        r->max_batch = (int)(host_cap / r->one.per_seq_pinned);
                        r->host_bound = 1;
                    }
                    if (r->max_batch > 0) {
                        pp.batch = r->max_batch;
                        if ((rc = hkv_plan_compute(&pp, &r->at_max, &err))) goto out;
                    }
                    if (batch) {
                        hkv_plan pb;
                        hkv_err e2;
                        hkv_err_clear(&e2);
                        pp.batch = (int)batch;
                        if ((rc = hkv_plan_compute(&pp, &pb, &err))) goto out;
                        r->admitted = hkv_plan_admit(&pp, &pb, r->cap, &e2) == HKV_OK;
                        if (r->admitted && host_cap && pb.pinned > host_cap) {
                            char need[32], hc[32];
                            fmt(pb.pinned, need), fmt(host_cap, hc);
                            hkv_seterr(&e2, HKV_E_CAPACITY, "batch %lld x context %lld with %s needs "
                                       "%s of pinned host memory for the far tier but --host-mem "
                                       "is %s", batch, r->ctx, r->label, need, hc);
                            r->admitted = 0;
                        }
                        snprintf(r->refusal, sizeof r->refusal, "%s", e2.msg);
                        refused += !r->admitted;
                    }
                    nr++;
                }
    char w[32], kv[32];
    fmt(rows[0].one.weights, w);
    fmt(rows[0].one.kv_per_token, kv);
    if (json) {
        int jb = 0, *bad = &jb;
        json_t *jo = json_object(), *ra = json_array();
        hkv_jset(jo, "model", hkv_jstr(mc.name), bad);
        INT(jo, "layers", mc.n_layer);
        INT(jo, "heads", mc.n_head);
        INT(jo, "kv_heads", mc.n_head_kv);
        INT(jo, "head_dim", mc.head_dim);
        INT(jo, "params", hkv_plan_param_count(&mc));
        INT(jo, "gpu_weight_bytes", rows[0].one.weights);
        hkv_jset(jo, "gpu_weights", json_string(wname), bad);
        INT(jo, "kv_bytes_per_token", rows[0].one.kv_per_token);
        INT(jo, "sink", sink);
        INT(jo, "local", local);
        hkv_jset(jo, "device", hkv_jstr(dev_desc), bad);
        /* which GPU backend the device is, when one was asked (cuda / cuda-emu) */
        hkv_jset(jo, "backend", json_string(dc.cuda ? hkv_gpu_backend() : "none"), bad);
        for (int i = 0; i < nr; i++) {
            const row *r = &rows[i];
            json_t *x = json_object();
            INT(x, "cap", r->cap);
            INT(x, "ctx", r->ctx);
            hkv_jset(x, "config", hkv_jstr(r->label), bad);
            hkv_jset(x, "index_on", json_string(r->on_host ? "host" : "gpu"), bad);
            INT(x, "near_per_seq", r->one.per_seq_near);
            INT(x, "index_per_seq", r->one.per_seq_index);
            INT(x, "pinned_per_seq", r->one.per_seq_pinned);
            INT(x, "workspace_batch1", r->one.workspace);
            INT(x, "max_batch", r->max_batch);
            hkv_jset(x, "host_bound", json_boolean(r->host_bound), bad);
            INT(x, "gpu_at_max", r->at_max.gpu_total);
            INT(x, "pinned_at_max", r->at_max.pinned);
            INT(x, "kept_per_seq", r->one.per_seq_kept);
            INT(x, "draft", r->one.draft);
            if (batch) {
                INT(x, "batch", batch);
                hkv_jset(x, "fits", json_boolean(r->admitted), bad);
                if (!r->admitted) hkv_jset(x, "refusal", hkv_jstr(r->refusal), bad);
            }
            hkv_jpush(ra, x, bad);
        }
        hkv_jset(jo, "rows", ra, bad);
        if ((rc = hkv_json_emit(stdout, jo, jb, &err))) goto out;
    } else {
        printf("%s: %d layers, %d/%d heads of %d, %.2fB parameters; GPU weights (%s) %s; "
               "KV %s per token; near tier %lld + %lld\n",
               mc.name, mc.n_layer, mc.n_head, mc.n_head_kv, mc.head_dim,
               (double)hkv_plan_param_count(&mc) / 1e9, wname, w, kv, sink, local);
        if (dev_desc[0]) printf("device: %s\n", dev_desc);
        printf("%-10s %8s  %-32s %-5s| %-10s %-10s %-10s | %9s %-10s %-10s\n", "cap", "context",
               "policy", "index", "near/seq", "index/seq", "pinned/seq", "max batch", "GPU used",
               "pinned");
        for (int i = 0; i < nr; i++) {
            const row *r = &rows[i];
            char c[32], n[32], x[32], p[32], g[32], pm[32];
            fmt(r->cap, c), fmt(r->one.per_seq_near, n), fmt(r->one.per_seq_index, x);
            fmt(r->one.per_seq_pinned, p), fmt(r->at_max.gpu_total, g), fmt(r->at_max.pinned, pm);
            printf("%-10s %8lld  %-32s %-5s| %-10s %-10s %-10s | %8d%s %-10s %-10s\n", c, r->ctx,
                   r->label, r->on_host ? "host" : "gpu", n, x, p, r->max_batch, r->host_bound ? "h" : " ",
                   r->max_batch ? g : "-", r->max_batch ? pm : "-");
        }
        int any_kept = 0, any_draft = 0;
        for (int i = 0; i < nr; i++) any_kept |= rows[i].one.per_seq_kept > 0, any_draft |= rows[i].one.draft > 0;
        if (any_kept)
            printf("(eviction policies: near/seq includes the kept set's K/V rows, GPU-resident)\n");
        if (any_draft) {
            for (int i = 0; i < nr; i++)
                if (rows[i].one.draft && rows[i].cap == rows[0].cap && (i == 0 || rows[i].ctx != rows[i - 1].ctx ||
                                          strcmp(rows[i].label, rows[i - 1].label))) {
                    char dd[32];
                    fmt(rows[i].one.draft, dd);
                    printf("(%s at %lld: + %s once for the draft %s: its prompt KV and "
                           "activations%s)\n", rows[i].label, rows[i].ctx, dd,
                           draft ? dmc.name : "(the target itself, weights shared; --draft NAME|PATH "
                           "for another)", draft ? ", weights" : "");
                }
        }
        if (gen) printf("(of each context, %lld tokens generated after the prompt)\n", gen);
        int any_host_bound = 0;
        for (int i = 0; i < nr; i++) any_host_bound |= rows[i].host_bound;
        if (any_host_bound) {
            char hc[32];
            fmt(host_cap, hc);
            printf("(h: the batch is limited by --host-mem %s, not by the GPU cap)\n", hc);
        }
        if (batch)
            for (int i = 0; i < nr; i++)
                if (!rows[i].admitted) fprintf(stderr, "hetkv: refused: %s\n", rows[i].refusal);
    }
    if (refused) {
        rc = HKV_E_CAPACITY;
        hkv_seterr(&err, rc, "plan: %d of %d rows cannot admit a batch of %lld (see above)", refused,
                   nr, batch);
    }
out:
    if (rc) hkv_err_report(&err, stderr);
    free(rows);
    return rc ? 1 : 0;
}
