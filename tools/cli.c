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

/* Length of a valid UTF-8 sequence at s (<= n bytes), 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (len == 2 && c < 0xC2) return 0;
    if (len == 3 && c == 0xE0 && s[1] < 0xA0) return 0;
    if (len == 3 && c == 0xED && s[1] >= 0xA0) return 0;   /* surrogates */
    if (len == 4 && (c > 0xF4 || (c == 0xF0 && s[1] < 0x90) || (c == 0xF4 && s[1] >= 0x90)))
        return 0;
    return len;
}

void hkv_json_str(FILE *f, const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc((int)c, f);
            i++;
        } else if (c == '\n') { fputs("\\n", f); i++; }
        else if (c == '\t') { fputs("\\t", f); i++; }
        else if (c == '\r') { fputs("\\r", f); i++; }
        else if (c < 0x20 || c == 0x7f) { fprintf(f, "\\u%04x", c); i++; }
        else {
            size_t l = utf8_len(s + i, n - i);
            if (!l) {
                fputs("\\ufffd", f);
                i++;
            } else {
                fwrite(s + i, 1, l, f);
                i += l;
            }
        }
    }
    fputc('"', f);
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
