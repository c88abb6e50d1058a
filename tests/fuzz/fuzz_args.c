/* Fuzz target: the parsers of user arguments (tools/cli/cli.c, tools/cli/cli_kv.c,
 * index/registry.c). Byte 0 picks the parser (mod 6), bits 3-5 a range or
 * a capacity; the rest is NUL-separated strings:
 *   0 hkv_arg_int        1 hkv_arg_float     2 hkv_arg_size
 *   3 hkv_arg_int_list   4 hkv_policy_arg_set (field 0's first byte picks
 *   the policy, field 1 is KEY=VALUE)   5 hkv_kv_cli_parse over the fields as
 *   argv, then hkv_kv_cli_apply
 *
 * Asserts, besides ASan/UBSan: every failure has a message; hkv_arg_int
 * agrees with a decimal parser written here (accepts exactly the strings it
 * accepts, same value) and stays in [lo, hi]; hkv_arg_size gives digits x
 * unit exactly for plain decimal sizes; lists hold 1..cap values each in
 * range and equal to the reference; a policy argument that is accepted is
 * within its parameter's range (hkv_policy_args_check agrees) and reads
 * back through hkv_policy_arg; options that apply give policy arguments
 * that hkv_policy_args_check accepts. */
#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"
#include "fuzz_common.h"
#include "kv_tiered_params.h"
#include "policy.h"

#define MAX_FIELDS 40

static const long long ranges[8][2] = {
    {0, INT_MAX}, {1, 1 << 22}, {LLONG_MIN, LLONG_MAX}, {-5, 5},
    {0, 1 << 20}, {1, 1}, {-1, 0}, {LLONG_MIN, 0},
};

/* C-locale decimal integer with optional leading white space and sign, as
 * a whole string; 0 when it is not one or does not fit a long long. */
static int ref_int(const char *s, long long *out) {
    while (*s == ' ' || (*s >= '\t' && *s <= '\r')) s++;
    int neg = *s == '-';
    if (*s == '-' || *s == '+') s++;
    if (!isdigit((unsigned char)*s)) return 0;
    long long v = 0;
    for (; isdigit((unsigned char)*s); s++) {
        int d = *s - '0';
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, neg ? -d : d, &v)) return 0;
    }
    if (*s) return 0;
    *out = v;
    return 1;
}

static void arg_int(const char *s, int r) {
    long long v = 0, want;
    hkv_err err = {0};
    int rc = hkv_arg_int("--n", s, ranges[r][0], ranges[r][1], &v, &err);
    hkv_fuzz_check_err(rc, &err, "hkv_arg_int");
    int ok = ref_int(s, &want) && want >= ranges[r][0] && want <= ranges[r][1];
    HKV_FUZZ_CHECK(ok == (rc == HKV_OK), "hkv_arg_int('%s') gave %s, the reference %s", s,
                   hkv_status_name(rc), ok ? "accepts" : "refuses");
    if (ok) HKV_FUZZ_CHECK(v == want, "hkv_arg_int('%s') = %lld, want %lld", s, v, want);
}

static void arg_float(const char *s, int r) {
    double lo = (double)ranges[r][0], hi = (double)ranges[r][1], v = NAN;
    hkv_err err = {0};
    int rc = hkv_arg_float("--x", s, lo, hi, &v, &err);
    hkv_fuzz_check_err(rc, &err, "hkv_arg_float");
    if (rc == HKV_OK) HKV_FUZZ_CHECK(isfinite(v) && v >= lo && v <= hi, "hkv_arg_float('%s') = %g", s, v);
}

static void arg_size(const char *s) {
    uint64_t v = 0;
    hkv_err err = {0};
    int rc = hkv_arg_size("--mem", s, &v, &err);
    hkv_fuzz_check_err(rc, &err, "hkv_arg_size");
    /* plain digits (up to 12) and a unit: the value is exact */
    size_t nd = strspn(s, "0123456789");
    if (nd == 0 || nd > 12) return;
    static const struct { const char *u; uint64_t mul; } units[] = {
        {"", 1}, {"k", 1ull << 10}, {"kib", 1ull << 10}, {"kb", 1ull << 10}, {"m", 1ull << 20},
        {"mib", 1ull << 20}, {"mb", 1ull << 20}, {"g", 1ull << 30}, {"gib", 1ull << 30},
        {"gb", 1ull << 30}, {"t", 1ull << 40}, {"tib", 1ull << 40}, {"tb", 1ull << 40}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(s + nd, units[i].u)) continue;
        uint64_t digits = strtoull(s, NULL, 10), want;
        if (__builtin_mul_overflow(digits, units[i].mul, &want) || want >= (1ull << 53)) return;
        HKV_FUZZ_CHECK(rc == HKV_OK && v == want, "hkv_arg_size('%s') = %llu (%s), want %llu", s,
                       (unsigned long long)v, hkv_status_name(rc), (unsigned long long)want);
        return;
    }
}

static void arg_list(const char *s, int r, int cap) {
    long long vals[16];
    int n = cap;
    hkv_err err = {0};
    int rc = hkv_arg_int_list("--ctx", s, ranges[r][0], ranges[r][1], vals, &n, &err);
    hkv_fuzz_check_err(rc, &err, "hkv_arg_int_list");
    if (rc) return;
    HKV_FUZZ_CHECK(n >= 1 && n <= cap, "list of %d values (cap %d)", n, cap);
    const char *p = s;
    for (int i = 0; i < n; i++) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        char buf[64];
        HKV_FUZZ_CHECK(len > 0 && len < sizeof buf, "value %d of '%s' has length %zu", i, s, len);
        memcpy(buf, p, len);
        buf[len] = '\0';
        long long want;
        HKV_FUZZ_CHECK(ref_int(buf, &want) && want == vals[i] && want >= ranges[r][0] &&
                           want <= ranges[r][1], "value %d of '%s': %lld", i, s, vals[i]);
        p = c ? c + 1 : p + len;
        HKV_FUZZ_CHECK((i == n - 1) == (c == NULL), "'%s' has more values than %d", s, n);
    }
}

static void policy_arg(const hkv_fuzz_fields *f) {
    const hkv_policy_def *const *all = hkv_policy_list();
    int np = 0;
    while (all[np]) np++;
    const hkv_policy_def *d = all[(unsigned char)f->s[0][0] % np];
    const char *kv = f->n > 1 ? f->s[1] : "";
    hkv_policy_args a;
    hkv_policy_args_init(d, &a);
    hkv_err err = {0};
    int rc = hkv_policy_arg_set(d, &a, kv, &err);
    hkv_fuzz_check_err(rc, &err, "hkv_policy_arg_set");
    rc = hkv_policy_args_check(d, &a, &err);
    HKV_FUZZ_CHECK(rc == HKV_OK, "%s: '%s' accepted but the check refuses: %s", d->name, kv, err.msg);
    const char *eq = strchr(kv, '=');
    for (int i = 0; i < d->n_params; i++) {
        if (isnan(a.v[i])) continue;
        const hkv_param_def *p = &d->params[i];
        HKV_FUZZ_CHECK(eq && strlen(p->key) == (size_t)(eq - kv) && !strncmp(p->key, kv, (size_t)(eq - kv)),
                       "%s: '%s' set %s", d->name, kv, p->key);
        HKV_FUZZ_CHECK(a.v[i] >= p->lo && a.v[i] <= p->hi && (!p->is_int || a.v[i] == floor(a.v[i])),
                       "%s: %s=%g outside %g..%g", d->name, p->key, a.v[i], p->lo, p->hi);
        HKV_FUZZ_CHECK(hkv_policy_arg(d, &a, p->key) == a.v[i], "%s: %s does not read back", d->name, p->key);
    }
}

static void kv_cli(const hkv_fuzz_fields *f) {
    hkv_kv_cli k;
    hkv_kv_cli_init(&k);
    hkv_err err = {0};
    int rc = HKV_OK;
    for (int i = 0; i < f->n && rc >= 0; i++) {
        rc = hkv_kv_cli_parse(&k, f->n, f->s, &i, &err);
        HKV_FUZZ_CHECK(rc == 0 || rc == 1 || rc < 0, "parse returned %d", rc);
        if (rc < 0) hkv_fuzz_check_err(rc, &err, "hkv_kv_cli_parse");
    }
    if (rc < 0) return;
    hkv_engine_params ep;
    hkv_engine_params_default(&ep);
    rc = hkv_kv_cli_apply(&k, &ep, &err);
    hkv_fuzz_check_err(rc, &err, "hkv_kv_cli_apply");
    if (rc) return;
    HKV_FUZZ_CHECK(ep.tiered.policy != NULL, "no policy after apply");
    rc = hkv_policy_args_check(ep.tiered.policy, &ep.tiered.args, &err);
    HKV_FUZZ_CHECK(rc == HKV_OK, "applied policy arguments fail the check: %s", err.msg);
    HKV_FUZZ_CHECK(ep.tiered.L_init >= 0 && ep.tiered.L_local >= 1, "sink %d local %d", ep.tiered.L_init,
                   ep.tiered.L_local);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int sel = data[0] % 6, r = (data[0] >> 3) & 7;
    hkv_fuzz_fields f;
    hkv_fuzz_split(data + 1, size - 1, MAX_FIELDS, &f);
    switch (sel) {
    case 0: arg_int(f.s[0], r); break;
    case 1: arg_float(f.s[0], r); break;
    case 2: arg_size(f.s[0]); break;
    case 3: arg_list(f.s[0], r, 1 + (data[0] >> 3) % 16); break;
    case 4: policy_arg(&f); break;
    default: kv_cli(&f); break;
    }
    hkv_fuzz_fields_free(&f);
    return 0;
}
