#include "status.h"

#include <string.h>

const char *hkv_status_name(int code) {
    switch (code) {
#define HKV_X_NAME(name, val, text) case (val): return #name;
        HKV_STATUS_MAP(HKV_X_NAME)
#undef HKV_X_NAME
    }
    return "UNKNOWN";
}

const char *hkv_status_text(int code) {
    switch (code) {
#define HKV_X_TEXT(name, val, text) case (val): return text;
        HKV_STATUS_MAP(HKV_X_TEXT)
#undef HKV_X_TEXT
    }
    return "unknown error";
}

void hkv_err_clear(hkv_err *err) {
    if (!err) return;
    err->code = HKV_OK;
    err->msg[0] = '\0';
}

int hkv_vseterr(hkv_err *err, int code, const char *fmt, va_list ap) {
    if (!err) return code;
    err->code = code;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    return code;
}

int hkv_seterr(hkv_err *err, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    hkv_vseterr(err, code, fmt, ap);
    va_end(ap);
    return code;
}

int hkv_err_prefix(hkv_err *err, const char *fmt, ...) {
    if (!err) return HKV_E_INTERNAL;
    char head[256], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    /* a long cause loses its tail, never the context put before it */
    if (snprintf(err->msg, sizeof err->msg, "%s: %s", head, old) >= (int)sizeof err->msg)
        err->msg[sizeof err->msg - 1] = '\0';
    return err->code;
}

void hkv_err_report(const hkv_err *err, FILE *f) {
    if (!err || err->code == HKV_OK) return;
    fprintf(f, "hetkv: error: %s\n",
            err->msg[0] ? err->msg : hkv_status_text(err->code));
}

void hkv_warn(FILE *f, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(f, "hetkv: warning: %s\n", msg);
}
