#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int hkv_arg_value(int argc, char **argv, int *i, const char **val, hkv_err *err) {
    if (*i + 1 >= argc) return hkv_seterr(err, HKV_E_INVAL, "option %s needs a value", argv[*i]);
    *val = argv[++*i];
    return HKV_OK;
}

int hkv_arg_int(const char *opt, const char *s, long long lo, long long hi, long long *out,
                hkv_err *err) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno)
        return hkv_seterr(err, HKV_E_INVAL, "%s: '%s' is not an integer", opt, s);
    if (v < lo || v > hi)
        return hkv_seterr(err, HKV_E_RANGE, "%s: %lld is out of range (%lld..%lld)", opt, v, lo, hi);
    *out = v;
    return HKV_OK;
}

int hkv_arg_float(const char *opt, const char *s, double lo, double hi, double *out,
                  hkv_err *err) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v))
        return hkv_seterr(err, HKV_E_INVAL, "%s: '%s' is not a number", opt, s);
    if (v < lo || v > hi)
        return hkv_seterr(err, HKV_E_RANGE, "%s: %g is out of range (%g..%g)", opt, v, lo, hi);
    *out = v;
    return HKV_OK;
}

int hkv_arg_size(const char *opt, const char *s, uint64_t *out, hkv_err *err) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0)
        return hkv_seterr(err, HKV_E_INVAL, "%s: '%s' is not a size", opt, s);
    double mul = 1;
    if (*end) {
        const char *u = end;
        if (!strcasecmp(u, "k") || !strcasecmp(u, "kib") || !strcasecmp(u, "kb")) mul = 1024.0;
        else if (!strcasecmp(u, "m") || !strcasecmp(u, "mib") || !strcasecmp(u, "mb")) mul = 1048576.0;
        else if (!strcasecmp(u, "g") || !strcasecmp(u, "gib") || !strcasecmp(u, "gb")) mul = 1073741824.0;
        else if (!strcasecmp(u, "t") || !strcasecmp(u, "tib") || !strcasecmp(u, "tb")) mul = 1099511627776.0;
        else return hkv_seterr(err, HKV_E_INVAL, "%s: unknown unit in '%s' (use K, M, G, T)", opt, s);
    }
    double b = v * mul;
    if (b > 1.8e19) return hkv_seterr(err, HKV_E_RANGE, "%s: '%s' is too large", opt, s);
    *out = (uint64_t)b;
    return HKV_OK;
}

int hkv_arg_int_list(const char *opt, const char *s, long long lo, long long hi, long long *vals,
                     int *n, hkv_err *err) {
    int cap = *n, k = 0;
    const char *p = s;
    char buf[64];
    while (*p) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == 0 || len >= sizeof buf)
            return hkv_seterr(err, HKV_E_INVAL, "%s: bad list '%s'", opt, s);
        if (k >= cap) return hkv_seterr(err, HKV_E_RANGE, "%s: more than %d values", opt, cap);
        memcpy(buf, p, len);
        buf[len] = 0;
        int rc = hkv_arg_int(opt, buf, lo, hi, &vals[k++], err);
        if (rc) return rc;
        p += len + (c ? 1 : 0);
        if (c && !*p) return hkv_seterr(err, HKV_E_INVAL, "%s: bad list '%s'", opt, s);
    }
    if (k == 0) return hkv_seterr(err, HKV_E_INVAL, "%s: empty list", opt);
    *n = k;
    return HKV_OK;
}

int hkv_read_file(const char *path, char **out, size_t *len, hkv_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return hkv_seterr(err, HKV_E_IO, "cannot open '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) {
            fclose(f);
            return hkv_seterr(err, HKV_E_NOMEM, "no memory reading '%s'", path);
        }
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *nb = cap > ((size_t)1 << 34) ? NULL : realloc(buf, 2 * cap + 1);
        if (!nb) free(buf);
        buf = nb;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return hkv_seterr(err, HKV_E_IO, "error reading '%s'", path);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return HKV_OK;
}
