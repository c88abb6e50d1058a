/* Configuration specs for the sweeping commands (eval, bench, plan):
 * "policy:key=val,key=val;..." with the budget allowed as a share of the
 * context. Everything is checked here, before the model loads, so a typo
 * costs no prefill. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_configs.h"

/* ρ' ≈ 1%, 3% and 10% of the context for both selection policies; the
 * dcu=0 variant isolates the dynamic centroid update (it matters most once
 * decode and later turns move past the prompt the index was built from). */
const char hkv_default_configs[] =
    "full;oracle:k=1%;oracle:k=3%;oracle:k=10%;ctkvr:rho_p=1%;ctkvr:rho_p=3%;ctkvr:rho_p=10%;"
    "ctkvr:rho_p=3%,dcu=0";

/* The parameter that is "far tokens attended per step and KV head", in the
 * order policies name it; the first the policy has is its budget. */
static const char *const budget_names[] = {"rho_p", "k", "budget", "token_budget", "C", NULL};

static const char *budget_key_of(const hkv_policy_def *d) {
    for (int i = 0; budget_names[i]; i++)
        for (int j = 0; j < d->n_params; j++)
            if (!strcmp(d->params[j].key, budget_names[i])) return d->params[j].key;
    return NULL;
}

static void trim(const char **s, size_t *len) {
    while (*len && (**s == ' ' || **s == '\t')) (*s)++, (*len)--;
    while (*len && ((*s)[*len - 1] == ' ' || (*s)[*len - 1] == '\t')) (*len)--;
}

static int known_policies(char *buf, size_t cap) {
    buf[0] = 0;
    const hkv_policy_def *const *all = hkv_policy_list();
    for (int i = 0; all[i]; i++) {
        strncat(buf, i ? ", " : "", cap - strlen(buf) - 1);
        strncat(buf, all[i]->name, cap - strlen(buf) - 1);
    }
    return 0;
}

/* One "key=val" of config c; a '%' value is allowed for the budget only. */
static int parse_arg(hkv_config *c, const char *kv, size_t len, hkv_err *err) {
    char buf[HKV_SPEC_LEN];
    if (len == 0 || len >= sizeof buf)
        return hkv_seterr(err, HKV_E_INVAL, "--configs: empty or overlong argument in '%s'", c->spec);
    memcpy(buf, kv, len);
    buf[len] = 0;
    char *eq = strchr(buf, '=');
    if (eq && eq - buf == 3 && !strncmp(buf, "far", 3)) {   /* the far tier's format, not the policy's */
        int rc = hkv_far_kv_parse("--configs", eq + 1, &c->far_q8, err);
        if (rc) return hkv_err_prefix(err, "'%s'", c->spec);
        c->far_set = 1;
        size_t el = strlen(c->extra);
        snprintf(c->extra + el, sizeof c->extra - el, "%s%s", el ? "," : "", buf);
        return HKV_OK;
    }
    int is_budget = c->budget_key && eq && (size_t)(eq - buf) == strlen(c->budget_key) &&
                    !strncmp(buf, c->budget_key, (size_t)(eq - buf));
    if (is_budget && eq[1] && eq[strlen(eq) - 1] == '%') {
        char *end;
        eq[strlen(eq) - 1] = 0;
        double pct = strtod(eq + 1, &end);
        if (end == eq + 1 || *end || !isfinite(pct) || pct <= 0 || pct > 100)
            return hkv_seterr(err, HKV_E_RANGE, "--configs '%s': %s=%s%% is not a share in "
                              "(0, 100]%%", c->spec, c->budget_key, eq + 1);
        c->budget_frac = pct / 100.0;
        c->budget_abs = 0;
        return HKV_OK;
    }
    if (eq && eq[1] && eq[strlen(eq) - 1] == '%')
        return hkv_seterr(err, HKV_E_INVAL, "--configs '%s': only the budget (%s) may be a share "
                          "of the context, not '%s'", c->spec,
                          c->budget_key ? c->budget_key : "this policy has none", buf);
    hkv_policy_args probe = c->args;
    int rc = hkv_policy_arg_set(c->def, &probe, buf, err);
    if (rc) return hkv_err_prefix(err, "--configs '%s'", c->spec);
    if (is_budget) {
        c->budget_abs = (int64_t)hkv_policy_arg(c->def, &probe, c->budget_key);
        c->budget_frac = 0;
        return HKV_OK;   /* set per context in resolve, so args never holds it */
    }
    c->args = probe;
    size_t el = strlen(c->extra);
    snprintf(c->extra + el, sizeof c->extra - el, "%s%s", el ? "," : "", buf);
    return HKV_OK;
}

int hkv_configs_parse(const char *spec, hkv_config *out, int *n, int cap, hkv_err *err) {
    *n = 0;
    for (const char *p = spec; *p;) {
        const char *semi = strchr(p, ';');
        size_t len = semi ? (size_t)(semi - p) : strlen(p);
        const char *item = p;
        p += len + (semi ? 1 : 0);
        trim(&item, &len);
        if (!len) continue;   /* "a;;b" and a trailing ';' are harmless */
        if (*n >= cap) return hkv_seterr(err, HKV_E_RANGE, "--configs: more than %d configurations", cap);
        if (len >= HKV_SPEC_LEN)
            return hkv_seterr(err, HKV_E_RANGE, "--configs: '%.*s...' is longer than %d characters",
                              40, item, HKV_SPEC_LEN - 1);
        hkv_config *c = &out[*n];
        memset(c, 0, sizeof *c);
        memcpy(c->spec, item, len);
        const char *colon = memchr(item, ':', len);
        size_t nlen = colon ? (size_t)(colon - item) : len;
        char name[64];
        if (nlen == 0 || nlen >= sizeof name)
            return hkv_seterr(err, HKV_E_INVAL, "--configs: '%s' has no policy name", c->spec);
        memcpy(name, item, nlen);
        name[nlen] = 0;
        if (!(c->def = hkv_policy_find(name))) {
            char known[256];
            known_policies(known, sizeof known);
            return hkv_seterr(err, HKV_E_INVAL, "--configs: unknown policy '%s' in '%s' (known: %s)",
                              name, c->spec, known);
        }
        hkv_policy_args_init(c->def, &c->args);
        c->budget_key = budget_key_of(c->def);
        if (colon) {
            const char *a = colon + 1, *endp = item + len;
            if (a == endp)
                return hkv_seterr(err, HKV_E_INVAL, "--configs: '%s' has ':' but no arguments", c->spec);
            while (a < endp) {
                const char *comma = memchr(a, ',', (size_t)(endp - a));
                size_t al = comma ? (size_t)(comma - a) : (size_t)(endp - a);
                const char *s = a;
                a += al + (comma ? 1 : 0);
                trim(&s, &al);
                int rc = parse_arg(c, s, al, err);
                if (rc) return rc;
                if (comma && a == endp)
                    return hkv_seterr(err, HKV_E_INVAL, "--configs: '%s' ends with ','", c->spec);
            }
        }
        (*n)++;
    }
    if (!*n) return hkv_seterr(err, HKV_E_INVAL, "--configs: no configuration in '%s'", spec);
    return HKV_OK;
}

int hkv_config_resolve(const hkv_config *c, int64_t ctx, int64_t far_tokens,
                        hkv_policy_args *args, int64_t *budget, char *label, size_t cap,
                        hkv_err *err) {
    *args = c->args;
    *budget = 0;
    char bpart[64] = "";
    if (c->budget_key) {
        int64_t b = c->budget_abs;
        if (c->budget_frac > 0) {
            b = (int64_t)llround(c->budget_frac * (double)ctx);
            if (b < 1) b = 1;
            snprintf(bpart, sizeof bpart, " %s=%lld (%g%%)", c->budget_key, (long long)b,
                     c->budget_frac * 100);
        } else if (b > 0) {
            snprintf(bpart, sizeof bpart, " %s=%lld", c->budget_key, (long long)b);
        } else {   /* none given: the policy's own default, what `run --policy` attends */
            const double dflt = hkv_policy_arg(c->def, &c->args, c->budget_key);
            b = isnan(dflt) ? hkv_policy_default_budget(ctx) : (int64_t)dflt;
            if (b > far_tokens) b = far_tokens > 1 ? far_tokens : 1;
            snprintf(bpart, sizeof bpart, " %s=%lld (default)", c->budget_key, (long long)b);
        }
        if (b > far_tokens)
            return hkv_seterr(err, HKV_E_RANGE, "config '%s': budget %s=%lld is larger than the far "
                              "tier at context %lld (%lld tokens beyond the sinks and the local "
                              "window), so it would select everything", c->spec, c->budget_key,
                              (long long)b, (long long)ctx, (long long)far_tokens);
        char kv[96];
        snprintf(kv, sizeof kv, "%s=%lld", c->budget_key, (long long)b);
        int rc = hkv_policy_arg_set(c->def, args, kv, err);
        if (rc) return hkv_err_prefix(err, "config '%s' at context %lld", c->spec, (long long)ctx);
        *budget = b;
    }
    if (label)
        snprintf(label, cap, "%s%s%s%s", c->def->name, bpart, c->extra[0] ? " " : "", c->extra);
    return HKV_OK;
}

int hkv_configs_cross_budgets(hkv_config *cfg, int *n, int cap, const char *budgets, hkv_err *err) {
    if (!budgets || !*budgets) return HKV_OK;
    hkv_config *out = malloc((size_t)cap * sizeof *out);
    if (!out) return hkv_seterr(err, HKV_E_NOMEM, "no memory for %d configurations", cap);
    int m = 0, rc = HKV_OK;
    for (int i = 0; i < *n && !rc; i++) {
        const hkv_config *c = &cfg[i];
        char given[64];
        snprintf(given, sizeof given, "%s=", c->budget_key ? c->budget_key : "");
        if (!c->budget_key || strstr(c->spec, given)) {   /* no budget, or its own: as it is */
            if (m == cap) rc = hkv_seterr(err, HKV_E_RANGE, "--budgets: more than %d configurations", cap);
            else out[m++] = *c;
            continue;
        }
        for (const char *b = budgets; *b && !rc;) {
            const size_t len = strcspn(b, ",");
            char spec[HKV_SPEC_LEN];
            int one = 0, w = snprintf(spec, sizeof spec, "%s:%s=%.*s%s%s", c->def->name, c->budget_key,
                                      (int)len, b, c->extra[0] ? "," : "", c->extra);
            if (!len || w < 0 || (size_t)w >= sizeof spec)
                rc = hkv_seterr(err, HKV_E_INVAL, "--budgets: bad value in '%s'", budgets);
            else if (m == cap)
                rc = hkv_seterr(err, HKV_E_RANGE, "--budgets: more than %d configurations", cap);
            else if (!(rc = hkv_configs_parse(spec, &out[m], &one, 1, err)))
                m += one;
            b += len + (b[len] == ',');
        }
    }
    if (!rc) {
        memcpy(cfg, out, (size_t)m * sizeof *out);
        *n = m;
    }
    free(out);
    return rc;
}
