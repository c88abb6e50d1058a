/* JSON output of the commands through jansson (cli.h): values as the old
 * printf formats wrote them, and members set with the allocation failure
 * remembered rather than the member silently missing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

json_t *hkv_json_text(const char *s, size_t n, int keep_nul) {
    json_t *j = !keep_nul && n && memchr(s, 0, n) ? NULL : json_stringn(s, n);
    if (j) return j;
    char *b = malloc(3 * n + 1);
    size_t o = 0;
    if (!b) return NULL;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        /* jansson's own check of one sequence: the same rules as the whole string */
        json_t *t = (c || keep_nul) && len && i + (size_t)len <= n ? json_stringn(s + i, (size_t)len)
                                                                    : NULL;
        if (t) {
            memcpy(b + o, s + i, (size_t)len);
            o += (size_t)len;
            i += (size_t)len;
            json_decref(t);
        } else {
            memcpy(b + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    j = json_stringn(b, o);
    free(b);
    return j;
}

json_t *hkv_jstr(const char *s) { return hkv_json_text(s ? s : "", s ? strlen(s) : 0, 0); }

json_t *hkv_jnum(double v, const char *fmt) {
    if (!isfinite(v)) return json_null();   /* json_real refuses NaN and inf */
    char buf[64];
    snprintf(buf, sizeof buf, fmt, v);
    /* what printf wrote without a point or exponent ("%.0f", "%g" of 0) was
     * read as an integer: it stays one */
    if (!strpbrk(buf, ".eE") && fabs(v) < 9e18) return json_integer(strtoll(buf, NULL, 10));
    return json_real(strtod(buf, NULL));
}

json_t *hkv_jint(double v) { return hkv_jnum(v, "%.0f"); }

void hkv_jset(json_t *o, const char *key, json_t *v, int *bad) {
    if (json_object_set_new(o, key, v)) *bad = 1;   /* v is released by jansson */
}

void hkv_jpush(json_t *a, json_t *v, int *bad) {
    if (json_array_append_new(a, v)) *bad = 1;
}

int hkv_json_emit(FILE *f, json_t *o, int bad, hkv_err *err) {
    /* 15 digits give back the value each member was rounded to by hkv_jnum
     * (0.1235, not 0.12350000000000001) */
    char *s = o && !bad ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15))
                        : NULL;
    json_decref(o);
    if (!s) return hkv_seterr(err, HKV_E_NOMEM, "no memory for the JSON output");
    fputs(s, f);
    fputc('\n', f);
    free(s);
    return HKV_OK;
}
