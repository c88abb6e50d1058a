/* The table-driven option parser and --help (cli_options.h), and the model,
 * threads and ISA groups.
 *
 * Hand-written rather than getopt_long: the options keep today's syntax
 * exactly (a value is always the next argument, no --name=value, no bundled
 * short options, no reordering of argv), every value is checked by the
 * hkv_arg_* parsers so errors name the option as typed, and the same table
 * drives --help; getopt_long would add syntax the commands never accepted,
 * print its own errors and hold global state (optind). */
#include "cli_options.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cli.h"
#include "isa.h"

/* Does arg name o ("--threads", or "-t" for short_name 't')? */
static int matches(const hkv_opt *o, const char *arg) {
    if (o->short_name && arg[0] == '-' && arg[1] == o->short_name && !arg[2]) return 1;
    return !strcmp(arg, o->name);
}

static int store(const hkv_opt *o, void *base, const char *a, const char *v, hkv_err *err) {
    char *p = (char *)base + o->off;
    switch (o->kind) {
    case HKV_OPT_FLAG: *(int *)p = 1; return HKV_OK;
    case HKV_OPT_STR: *(const char **)p = v; return HKV_OK;
    case HKV_OPT_INT:
        return hkv_arg_int(a, v, (long long)o->lo, (long long)o->hi, (long long *)p, err);
    case HKV_OPT_FLOAT: return hkv_arg_float(a, v, o->lo, o->hi, (double *)p, err);
    case HKV_OPT_SIZE: return hkv_arg_size(a, v, (uint64_t *)p, err);
    case HKV_OPT_LIST: {
        int *n = (int *)((char *)base + o->n_off);
        *n = o->cap;
        return hkv_arg_int_list(a, v, (long long)o->lo, (long long)o->hi, (long long *)p, n, err);
    }
    case HKV_OPT_FN: return o->fn(base, a, v, err);
    default: return hkv_seterr(err, HKV_E_INTERNAL, "%s: no parser for option kind %d", a, o->kind);
    }
}

int hkv_opts_parse_one(const hkv_opt *opts, void *base, int argc, char **argv, int *i,
                       hkv_err *err) {
    const char *a = argv[*i], *v = NULL;
    for (const hkv_opt *o = opts; o->name; o++) {
        if (!matches(o, a)) continue;
        int rc;
        if (o->arg && (rc = hkv_arg_value(argc, argv, i, &v, err))) return rc;
        return (rc = store(o, base, a, v, err)) ? rc : 1;
    }
    return 0;
}

/* Does use u leave the option named name out? */
static int omitted(const hkv_opt_use *u, const char *name) {
    for (const char *const *o = u->omit; o && *o; o++)
        if (!strcmp(*o, name)) return 1;
    return 0;
}

int hkv_opts_parse_prog(const char *prog, const char *cmd, const hkv_opt_use *uses, int n_uses,
                        int argc, char **argv, hkv_err *err) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return 1;
        int u = 0, rc = 0;
        const hkv_opt_use *refused = NULL;   /* a use that omits argv[i] */
        for (; u < n_uses; u++) {
            const hkv_opt *o = uses[u].opts;
            while (o->name && !matches(o, argv[i])) o++;
            if (!o->name) continue;
            if (omitted(&uses[u], o->name)) {   /* a later use may still take it */
                if (!refused) refused = &uses[u];
                continue;
            }
            if (uses[u].first && !*uses[u].first) *uses[u].first = o->name;
            if ((rc = hkv_opts_parse_one(o, uses[u].base, argc, argv, &i, err)) < 0) return rc;
            break;
        }
        if (u < n_uses) continue;
        if (refused && refused->omit_why)
            return hkv_seterr(err, HKV_E_INVAL, "%s: %s", argv[i], refused->omit_why);
        /* "argument" for a word without a dash: none of the commands takes one */
        const char *what = argv[i][0] == '-' ? "option" : "argument";
        if (!cmd)
            return hkv_seterr(err, HKV_E_INVAL, "%s: unknown %s '%s' (see %s --help)", prog, what,
                              argv[i], prog);
        return hkv_seterr(err, HKV_E_INVAL, "%s: unknown %s '%s' (see %s %s --help)", cmd, what,
                          argv[i], prog, cmd);
    }
    return HKV_OK;
}

int hkv_opts_parse(const char *cmd, const hkv_opt_use *uses, int n_uses, int argc, char **argv,
                   hkv_err *err) {
    return hkv_opts_parse_prog("hetkv", cmd, uses, n_uses, argc, argv, err);
}

/* "  -t, --threads N" padded to column 24 (two spaces when longer), then the
 * help's lines, the later ones indented to that column: today's layout. */
static void help_row(FILE *f, const hkv_opt *o) {
    char left[96];
    int n = o->short_name ? snprintf(left, sizeof left, "  -%c, %s", o->short_name, o->name)
                          : snprintf(left, sizeof left, "      %s", o->name);
    if (o->arg && n > 0 && (size_t)n < sizeof left)
        snprintf(left + n, sizeof left - (size_t)n, " %s", o->arg);
    n = (int)strlen(left);
    fprintf(f, "%s%*s", left, n < 24 ? 24 - n : 2, "");
    const char *h = o->help ? o->help : "";
    for (int first = 1;; first = 0) {
        const char *nl = strchr(h, '\n');
        int len = nl ? (int)(nl - h) : (int)strlen(h);
        fprintf(f, "%*s%.*s\n", first ? 0 : 24, "", len, h);
        if (!nl || !nl[1]) break;
        h = nl + 1;
    }
}

/* Was name declared (and not omitted) by a use before u? The parser takes that one. */
static int shadowed(const hkv_opt_use *uses, int u, const hkv_opt *o) {
    for (int k = 0; k < u; k++)
        for (const hkv_opt *p = uses[k].opts; p->name; p++)
            if ((!strcmp(p->name, o->name) || (o->short_name && p->short_name == o->short_name)) &&
                !omitted(&uses[k], p->name))
                return 1;
    return 0;
}

void hkv_opts_help_table(FILE *f, const hkv_opt *opts) {
    for (const hkv_opt *o = opts; o->name; o++) help_row(f, o);
}

void hkv_opts_help(FILE *f, const char *usage, const hkv_opt_use *uses, int n_uses) {
    static const hkv_opt help_opt = {.name = "--help", .short_name = 'h', .help = "this help"};
    fputs(usage, f);
    int help_shown = 0;
    for (int u = 0; u < n_uses; u++) {
        if (uses[u].title && !help_shown) help_row(f, &help_opt), help_shown = 1;
        if (uses[u].title) fprintf(f, "\n%s:\n", uses[u].title);
        for (const hkv_opt *o = uses[u].opts; o->name; o++)
            if (!shadowed(uses, u, o) && !omitted(&uses[u], o->name)) help_row(f, o);
    }
    if (!help_shown) help_row(f, &help_opt);
}

/* ---- the model, threads and ISA groups ---- */

const hkv_opt hkv_model_opts[] = {
    {.name = "--model", .short_name = 'm', .arg = "PATH", .kind = HKV_OPT_STR, .off = 0,
     .help = "GGUF model file"},
    {0},
};

void hkv_exec_cli_init(hkv_exec_cli *x) {
    x->threads = 0;
    x->isa = -1;
}

static int parse_isa(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    hkv_exec_cli *x = base;
    if ((x->isa = hkv_isa_parse(v)) < 0)
        return hkv_seterr(err, HKV_E_INVAL, "--isa: unknown '%s' (scalar, avx2, avx2-novnni, avx512)", v);
    return HKV_OK;
}

const hkv_opt hkv_exec_opts[] = {
    {.name = "--threads", .short_name = 't', .arg = "N", .kind = HKV_OPT_INT,
     .off = offsetof(hkv_exec_cli, threads), .lo = 1, .hi = 4096,
     .help = "CPU threads (default: one per core)"},
    {.name = "--isa", .arg = "NAME", .kind = HKV_OPT_FN, .fn = parse_isa,
     .help = "force kernels: scalar, avx2, avx2-novnni (AVX2 without AVX-VNNI), avx512 (default: best)"},
    {0},
};

void hkv_sampling_cli_init(hkv_sampling_cli *s) {
    s->temp = NAN;
    s->top_k = 40;
    s->top_p = 0.95;
    s->seed = 42;
}

const hkv_opt hkv_sampling_opts[] = {
    {.name = "--temp", .arg = "T", .kind = HKV_OPT_FLOAT, .off = offsetof(hkv_sampling_cli, temp),
     .lo = 0, .hi = 100, .help = "temperature, 0 = greedy (default 0.7 with --chat, else 0)"},
    {.name = "--top-k", .arg = "K", .kind = HKV_OPT_INT, .off = offsetof(hkv_sampling_cli, top_k),
     .lo = 0, .hi = 1 << 24, .help = "keep the K most likely tokens (default 40, 0 = off)"},
    {.name = "--top-p", .arg = "P", .kind = HKV_OPT_FLOAT, .off = offsetof(hkv_sampling_cli, top_p),
     .lo = 1e-6, .hi = 1, .help = "nucleus sampling (default 0.95, 1 = off)"},
    {.name = "--seed", .arg = "S", .kind = HKV_OPT_INT, .off = offsetof(hkv_sampling_cli, seed),
     .lo = 0, .hi = (double)(1LL << 62), .help = "sampling seed (default 42)"},
    {0},
};
