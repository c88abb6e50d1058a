/* hetkv plan: the GPU memory plan (runtime/gpu_plan.h) per GPU memory cap,
 * context and KV policy, and the largest batch that fits; with --batch, the
 * admission check run/bench do under --device cuda. Needs no GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "device.h"
#include "eval.h"
#include "gpu_plan.h"
#include "synthetic.h"

static const char plan_usage[] =
    "usage: hetkv plan (--synthetic NAME | -m MODEL) (--gpu-mem LIST | --device cuda) [options]\n"
    "\n"
    "Bytes the GPU side needs (weights in fp16, near tier, policy index, workspace) and the\n"
    "pinned host bytes of the far tier, per sequence, and the largest batch under each cap.\n"
    "Arithmetic on the model's shape only: no weights are loaded, no GPU is needed.\n"
    "\n"
    "  -m, --model PATH      GGUF model (only its metadata is read)\n"
    "      --synthetic NAME  a synthetic shape: llama3-8b, llama3.1-8b, yi-9b, qwen2.5-7b,\n"
    "                        smollm2-135m\n"
    "      --gpu-mem LIST    GPU memory caps, e.g. 24G,48G\n"
    "      --device cuda     cap = the device's free memory (or check --gpu-mem against it)\n"
    "      --ctx LIST        contexts per sequence (default 32768,98304)\n"
    "      --policy LIST     policies by name (default full,ctkvr)\n"
    "      --configs SPEC    policies with arguments, ';'-separated as hetkv eval:\n"
    "                        \"full;ctkvr;ctkvr:C=512\" (instead of --policy)\n"
    "      --index WHERE     gpu (default): every index on the GPU; host: the large lists\n"
    "                        (ctkvr IVF, snapkv kept sets) in pinned host memory; both\n"
    "      --host-mem SIZE   also cap the pinned host memory (far tier) the batch may use\n"
    "      --sink N          sink tokens in the near tier (default 4)\n"
    "      --local N         local window in the near tier (default 256)\n"
    "      --max-rows N      rows per forward call, sizes the workspace (default 256)\n"
    "      --draft NAME|PATH speckv/specpc's draft: a synthetic shape or a GGUF file (default:\n"
    "                        the target is its own draft)\n"
    "      --gen N           of each context, tokens generated after the prompt (specpc keeps\n"
    "                        C prompt tokens + these; default 0)\n"
    "      --batch N         admission check of N sequences: exit 1, naming what was needed\n"
    "                        and what was available, when any row does not fit\n"
    "      --json            one JSON object on stdout\n";

#define MAXL 16

typedef struct row {
    uint64_t cap;
    long long ctx;
    char label[EVAL_SPEC_LEN];
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

static void fmt(uint64_t b, char *s) { hkv_fmt_bytes((double)b, s, 32); }

int hkv_cmd_plan(int argc, char **argv) {
    hkv_err err;
    hkv_err_clear(&err);
    const char *model = NULL, *policies = "full,ctkvr", *configs = NULL, *where = "gpu";
    const char *draft = NULL;
    long long ctxs[MAXL] = {32768, 98304}, sink = 4, local = 256, max_rows = 256, batch = 0, gen = 0;
    int n_ctx = 2, n_caps = 0, json = 0, rc = HKV_OK;
    uint64_t caps[MAXL], host_cap = 0;
    hkv_device_cli dc;
    hkv_device_cli_init(&dc);
    for (int i = 1; i < argc && !rc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "--gpu-mem")) {   /* a list here, not the single cap of run/bench */
            if (!(rc = hkv_arg_value(argc, argv, &i, &v, &err))) rc = parse_caps(v, caps, &n_caps, &err);
            continue;
        }
        int k = hkv_device_cli_parse(&dc, argc, argv, &i, &err);
        if (k < 0) {
            rc = k;
            break;
        }
        if (k == 1) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(plan_usage, stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if ((rc = hkv_arg_value(argc, argv, &i, &v, &err))) {
            break;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            model = v;
        } else if (!strcmp(a, "--ctx")) {
            n_ctx = MAXL;
            rc = hkv_arg_int_list(a, v, 1, 1LL << 31, ctxs, &n_ctx, &err);
        } else if (!strcmp(a, "--policy")) {
            policies = v;
        } else if (!strcmp(a, "--configs")) {
            configs = v;
        } else if (!strcmp(a, "--index")) {
            if (strcmp(v, "gpu") && strcmp(v, "host") && strcmp(v, "both"))
                rc = hkv_seterr(&err, HKV_E_INVAL, "--index: '%s' is not gpu, host or both", v);
            where = v;
        } else if (!strcmp(a, "--host-mem")) {
            rc = hkv_parse_size(a, v, &host_cap, &err);
        } else if (!strcmp(a, "--sink")) {
            rc = hkv_arg_int(a, v, 0, 1 << 20, &sink, &err);
        } else if (!strcmp(a, "--local")) {
            rc = hkv_arg_int(a, v, 1, 1 << 22, &local, &err);
        } else if (!strcmp(a, "--max-rows")) {
            rc = hkv_arg_int(a, v, 1, 65536, &max_rows, &err);
        } else if (!strcmp(a, "--batch")) {
            rc = hkv_arg_int(a, v, 1, 1 << 20, &batch, &err);
        } else if (!strcmp(a, "--draft")) {
            draft = v;
        } else if (!strcmp(a, "--gen")) {
            rc = hkv_arg_int(a, v, 0, 1LL << 30, &gen, &err);
        } else {
            rc = hkv_seterr(&err, HKV_E_INVAL, "plan: unknown option '%s' (see hetkv plan --help)", a);
        }
    }
    if (!rc && !model == !dc.synthetic)
        rc = hkv_seterr(&err, HKV_E_INVAL, model ? "plan: give -m MODEL or --synthetic NAME, not both"
                                                 : "plan: no model (-m MODEL or --synthetic NAME)");
    if (!rc && !n_caps && !dc.cuda)
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
    eval_config cfg[EVAL_MAX_CONFIGS];
    int n_cfg = 0;
    hkv_model_config mc, dmc;
    row *rows = NULL;
    if ((rc = eval_configs_parse(configs, cfg, &n_cfg, EVAL_MAX_CONFIGS, &err)) ||
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
                    int on_host = n_place == 2 ? wi : !strcmp(where, "host");
                    hkv_policy_args args;
                    int64_t budget;
                    int64_t far = ctxs[xi] - sink - local;
                    row *r = &rows[nr];
                    memset(r, 0, sizeof *r);
                    /* A budget written in the spec is resolved as hetkv eval does; without
                     * one the policy's own derived defaults apply (not eval's 3%). */
                    char key[40] = "";
                    if (cfg[pi].budget_key) snprintf(key, sizeof key, "%s=", cfg[pi].budget_key);
                    args = cfg[pi].args;
                    if (key[0] && strstr(cfg[pi].spec, key) &&
                        (rc = eval_config_resolve(&cfg[pi], ctxs[xi], far > 0 ? far : 0, &args,
                                                  &budget, NULL, 0, &err)))
                        goto out;
                    hkv_plan_describe(cfg[pi].def, &args, ctxs[xi], r->label, sizeof r->label);
                    hkv_plan_params pp = {.cfg = &mc, .batch = 1, .n_ctx = ctxs[xi],
                                          .L_init = (int)sink, .L_local = (int)local,
                                          .policy = cfg[pi].def, .args = &args,
                                          .max_rows = (int)max_rows, .index_on_host = on_host,
                                          .draft = draft ? &dmc : NULL, .n_gen = gen};
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
        printf("{\"model\":");
        hkv_json_str(stdout, mc.name, strlen(mc.name));
        printf(",\"layers\":%d,\"heads\":%d,\"kv_heads\":%d,\"head_dim\":%d,\"params\":%llu,"
               "\"gpu_weight_bytes\":%llu,\"kv_bytes_per_token\":%llu,\"sink\":%lld,\"local\":%lld,",
               mc.n_layer, mc.n_head, mc.n_head_kv, mc.head_dim,
               (unsigned long long)hkv_plan_param_count(&mc), (unsigned long long)rows[0].one.weights,
               (unsigned long long)rows[0].one.kv_per_token, sink, local);
        printf("\"device\":");
        hkv_json_str(stdout, dev_desc, strlen(dev_desc));
        /* which GPU backend the device is, when one was asked (cuda / cuda-emu) */
        printf(",\"backend\":\"%s\",\"rows\":[", dc.cuda ? hkv_gpu_backend() : "none");
        for (int i = 0; i < nr; i++) {
            const row *r = &rows[i];
            printf("%s{\"cap\":%llu,\"ctx\":%lld,\"config\":", i ? "," : "", (unsigned long long)r->cap, r->ctx);
            hkv_json_str(stdout, r->label, strlen(r->label));
            printf(",\"index_on\":\"%s\",\"near_per_seq\":%llu,\"index_per_seq\":%llu,"
                   "\"pinned_per_seq\":%llu,\"workspace_batch1\":%llu,\"max_batch\":%d,\"host_bound\":%s,"
                   "\"gpu_at_max\":%llu,\"pinned_at_max\":%llu,\"kept_per_seq\":%llu,"
                   "\"draft\":%llu",
                   r->on_host ? "host" : "gpu", (unsigned long long)r->one.per_seq_near,
                   (unsigned long long)r->one.per_seq_index, (unsigned long long)r->one.per_seq_pinned,
                   (unsigned long long)r->one.workspace, r->max_batch, r->host_bound ? "true" : "false",
                   (unsigned long long)r->at_max.gpu_total, (unsigned long long)r->at_max.pinned,
                   (unsigned long long)r->one.per_seq_kept, (unsigned long long)r->one.draft);
            if (batch) {
                printf(",\"batch\":%lld,\"fits\":%s", batch, r->admitted ? "true" : "false");
                if (!r->admitted) {
                    printf(",\"refusal\":");
                    hkv_json_str(stdout, r->refusal, strlen(r->refusal));
                }
            }
            printf("}");
        }
        printf("]}\n");
    } else {
        printf("%s: %d layers, %d/%d heads of %d, %.2fB parameters; GPU weights (fp16) %s; "
               "KV %s per token; near tier %lld + %lld\n",
               mc.name, mc.n_layer, mc.n_head, mc.n_head_kv, mc.head_dim,
               (double)hkv_plan_param_count(&mc) / 1e9, w, kv, sink, local);
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
        if (host_cap) {
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
