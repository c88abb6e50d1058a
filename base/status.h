/* Status codes and the one error/reporting path of hetkv.
 *
 * Every fallible function returns an int: HKV_OK (0) or a negative HKV_E_*
 * code. Functions that can fail on user input also take an hkv_err* where
 * they write a message naming the problem; callers print it with
 * hkv_err_report(). No global state: the message lives in the caller's
 * hkv_err. */
#ifndef HKV_STATUS_H
#define HKV_STATUS_H

#include <stdarg.h>
#include <stdio.h>

/* X-macro so a code, its name and its default text cannot drift apart. */
#define HKV_STATUS_MAP(X)                                                   \
    X(OK,        0,  "success")                                             \
    X(INVAL,    -1,  "invalid argument")                                    \
    X(NOMEM,    -2,  "out of memory")                                       \
    X(IO,       -3,  "input/output error")                                  \
    X(FORMAT,   -4,  "malformed file")                                      \
    X(UNSUPPORTED, -5, "unsupported feature")                               \
    X(RANGE,    -6,  "value out of range")                                  \
    X(NOTFOUND, -7,  "not found")                                           \
    X(CAPACITY, -8,  "does not fit in the memory budget")                   \
    X(DEVICE,   -9,  "device error")                                        \
    X(INTERNAL, -10, "internal error")                                      \
    X(CANCELLED, -11, "cancelled")

enum hkv_status {
#define HKV_X_ENUM(name, val, text) HKV_E_##name = (val),
    HKV_STATUS_MAP(HKV_X_ENUM)
#undef HKV_X_ENUM
};
#define HKV_OK HKV_E_OK

typedef struct hkv_err {
    int code;           /* last HKV_E_* written, HKV_OK if none */
    char msg[768];      /* human-readable, names the problem */
} hkv_err;

const char *hkv_status_name(int code);  /* "INVAL", ... */
const char *hkv_status_text(int code);  /* "invalid argument", ... */

/* Clear an error record (err may be NULL). */
void hkv_err_clear(hkv_err *err);

/* Record code and a printf-style message in err (may be NULL); returns code
 * so callers can write `return hkv_seterr(err, HKV_E_INVAL, "...")`. */
int hkv_seterr(hkv_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int hkv_vseterr(hkv_err *err, int code, const char *fmt, va_list ap);

/* Prefix the existing message with context ("loading model: ..."). */
int hkv_err_prefix(hkv_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Print "hetkv: error: <msg>" (or the code's text) to f. */
void hkv_err_report(const hkv_err *err, FILE *f);
/* Print "hetkv: warning: <msg>" to f: something the run goes on with but the
 * user should know (a context past the model's trained one). */
void hkv_warn(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
