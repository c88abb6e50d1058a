/* The KV cache and policy options every command shares. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_options.h"
#include "policy.h"

void hkv_kv_cli_init(hkv_kv_cli *k) {
    memset(k, 0, sizeof *k);
    k->sink = -1;
    k->local = -1;
    k->precision = HKV_PREC_EXACT;
}

static int parse_kv(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    if (strcmp(v, "plain") && strcmp(v, "tiered"))
        return hkv_seterr(err, HKV_E_INVAL, "--kv: '%s' is not plain or tiered", v);
    ((hkv_kv_cli *)base)->kv = v;
    return HKV_OK;
}

static int parse_precision(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    if ((((hkv_kv_cli *)base)->precision = hkv_precision_parse(v)) < 0)
        return hkv_seterr(err, HKV_E_INVAL, "--precision: '%s' is not exact or fast", v);
    return HKV_OK;
}

static int parse_far_numa(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    static const char *const names[] = {"auto", "gpu", "spread", "off"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(v, names[i])) {
            ((hkv_kv_cli *)base)->far_numa = i;   /* enum hkv_far_numa's order */
            return HKV_OK;
        }
    return hkv_seterr(err, HKV_E_INVAL, "--far-numa: '%s' is not auto, gpu, spread or off", v);
}

int hkv_far_kv_parse(const char *what, const char *v, int *q8, hkv_err *err) {
    if (strcmp(v, "f16") && strcmp(v, "q8"))
        return hkv_seterr(err, HKV_E_INVAL, "%s: far tier '%s' is not f16 or q8", what, v);
    *q8 = !strcmp(v, "q8");
    return HKV_OK;
}

static int parse_far_kv(void *base, const char *opt, const char *v, hkv_err *err) {
    return hkv_far_kv_parse(opt, v, &((hkv_kv_cli *)base)->far_q8, err);
}

static int parse_policy_arg(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    hkv_kv_cli *k = base;
    if (k->n_pargs >= HKV_CLI_MAX_PARGS)
        return hkv_seterr(err, HKV_E_RANGE, "more than %d --policy-arg options", HKV_CLI_MAX_PARGS);
    k->pargs[k->n_pargs++] = v;
    return HKV_OK;
}

const hkv_opt hkv_kv_opts[] = {
    {.name = "--policy", .arg = "NAME", .kind = HKV_OPT_STR, .off = offsetof(hkv_kv_cli, policy),
     .help = "KV policy: full, oracle, ctkvr, quest, snapkv, rocketkv,\n"
             "fastkv, laq, speckv, specpc, or auto: with --device cuda the whole\n"
             "KV on the device (full, dense) when the cap admits it, else ctkvr\n"
             "with the far tier on the host (the default with --device cuda;\n"
             "full otherwise); 'hetkv policies' lists them with their parameters"},
    {.name = "--policy-arg", .arg = "K=V", .kind = HKV_OPT_FN, .fn = parse_policy_arg,
     .help = "a policy parameter (repeatable)"},
    {.name = "--draft", .arg = "MODEL", .kind = HKV_OPT_STR, .off = offsetof(hkv_kv_cli, draft),
     .help = "draft model for speckv and specpc (a GGUF model sharing the\n"
             "target's tokenizer; the target itself will do)"},
    {.name = "--sink", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(hkv_kv_cli, sink),
     .lo = 0, .hi = 1 << 20, .help = "attention-sink tokens kept near (default 4)"},
    {.name = "--local", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(hkv_kv_cli, local),
     .lo = 1, .hi = 1 << 22, .help = "local window kept near (default 256)"},
    {.name = "--far-numa", .arg = "MODE", .kind = HKV_OPT_FN, .fn = parse_far_numa,
     .help = "on a host with several NUMA nodes: spread (each sequence's far\n"
             "tier on one node, its far work done first by that node's\n"
             "threads), gpu (all on the GPU's node), off (no binding); auto\n"
             "(default): spread on the host path, gpu with --device cuda.\n"
             "One node: nothing to place"},
    {.name = "--far-kv", .arg = "TYPE", .kind = HKV_OPT_FN, .fn = parse_far_kv,
     .help = "the far tier's K and V rows: f16 (default), or q8: int8 with an\n"
             "fp32 scale per 32 values, 0.56x the host memory and the bytes a\n"
             "selected row costs; the near tier stays fp16 (docs/EVAL.md)"},
    {.name = "--kv", .arg = "plain", .kind = HKV_OPT_FN, .fn = parse_kv,
     .help = "the plain contiguous cache instead of the tiered one (reference)"},
    {.name = "--precision", .arg = "P", .kind = HKV_OPT_FN, .fn = parse_precision,
     .help = "exact (default): fp32 activations in every weight product (the\n"
             "reference); fast: Q4/Q8 products on int8 activations quantised\n"
             "per 32, faster batches (AVX2 or AVX512-VNNI, scalar stays exact; SmolLM2:\n"
             "mean KL 1e-2 from exact, docs/HOST_KERNELS.md)"},
    {0},
};

int hkv_kv_cli_auto(const hkv_kv_cli *k) {
    return (!k->kv || strcmp(k->kv, "plain")) && (!k->policy || !strcmp(k->policy, "auto"));
}

int hkv_kv_cli_parse(hkv_kv_cli *k, int argc, char **argv, int *i, hkv_err *err) {
    return hkv_opts_parse_one(hkv_kv_opts, k, argc, argv, i, err);
}

int hkv_kv_cli_apply(const hkv_kv_cli *k, hkv_engine_params *ep, hkv_err *err) {
    ep->precision = k->precision;   /* the engine's kernels, whatever the cache */
    if (k->kv && !strcmp(k->kv, "plain")) {
        if (k->policy || k->n_pargs || k->sink >= 0 || k->local >= 0 || k->draft || k->far_q8)
            return hkv_seterr(err, HKV_E_INVAL, "--kv plain takes no policy, sink, local, draft "
                              "or far-kv options");
        ep->kv_plain = 1;
        return HKV_OK;
    }
    hkv_tiered_params *tp = &ep->tiered;
    tp->far_numa = k->far_numa;
    tp->far_q8 = k->far_q8;
    if (hkv_kv_cli_auto(k) && k->policy) {   /* full until the device's plan decides */
        if (k->n_pargs)
            return hkv_seterr(err, HKV_E_INVAL, "--policy auto picks full or ctkvr itself: name "
                              "the policy to give it --policy-arg");
    } else if (k->policy) {
        const hkv_policy_def *d = hkv_policy_find(k->policy);
        if (!d) {
            char names[256] = "";
            const hkv_policy_def *const *all = hkv_policy_list();
            for (int i = 0; all[i]; i++) {
                strncat(names, i ? ", " : "", sizeof names - strlen(names) - 1);
                strncat(names, all[i]->name, sizeof names - strlen(names) - 1);
            }
            return hkv_seterr(err, HKV_E_INVAL, "unknown policy '%s' (known: %s)", k->policy, names);
        }
        tp->policy = d;
        hkv_policy_args_init(d, &tp->args);
    }
    for (int i = 0; i < k->n_pargs; i++) {
        int rc = hkv_policy_arg_set(tp->policy, &tp->args, k->pargs[i], err);
        if (rc) return rc;
    }
    /* speckv and specpc run the draft model: ask for it before any work */
    if (!k->draft && (tp->policy->prep == HKV_PREP_LOOKAHEAD_DRAFT ||
                      tp->policy->prep == HKV_PREP_COMPRESS_DRAFT))
        return hkv_seterr(err, HKV_E_INVAL, "policy '%s' needs --draft MODEL (a GGUF model sharing "
                          "the target's tokenizer; the target itself will do)", tp->policy->name);
    ep->draft_path = k->draft;
    if (k->sink >= 0) tp->L_init = (int)k->sink;
    if (k->local >= 0) tp->L_local = (int)k->local;
    return HKV_OK;
}
