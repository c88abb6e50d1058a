/* hetkv policies: the registered KV policies and their typed parameters. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "policy.h"

static const char *kind_name(int k) {
    return k == HKV_POLICY_SELECTION ? "selection" : k == HKV_POLICY_EVICTION ? "eviction" : "prefill";
}

static const char policies_usage[] =
    "usage: hetkv policies\n\nList the KV policies, their kind and parameters "
    "(use with --policy NAME --policy-arg KEY=VALUE).\n\n";

int hkv_cmd_policies(int argc, char **argv) {
    hkv_err err;
    hkv_err_clear(&err);
    /* No options of its own: the parser still gives -h/--help and the
     * unknown-argument error every command words the same way. */
    int rc = hkv_opts_parse("policies", NULL, 0, argc, argv, &err);
    if (rc == 1) {
        hkv_opts_help(stdout, policies_usage, NULL, 0);
        return 0;
    }
    if (rc) {
        hkv_err_report(&err, stderr);
        return 2;
    }
    const hkv_policy_def *const *all = hkv_policy_list();
    for (int i = 0; all[i]; i++) {
        const hkv_policy_def *d = all[i];
        printf("%-10s %-9s %s\n", d->name, kind_name(d->kind), d->summary ? d->summary : "");
        for (int j = 0; j < d->n_params; j++) {
            const hkv_param_def *p = &d->params[j];
            char dflt[32];
            if (isnan(p->dflt)) snprintf(dflt, sizeof dflt, "derived");
            else snprintf(dflt, sizeof dflt, "%g", p->dflt);
            printf("    %-8s default %-8s range %g..%g  %s\n", p->key, dflt, p->lo, p->hi,
                   p->help ? p->help : "");
        }
    }
    return 0;
}
