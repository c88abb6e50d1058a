/* Resuming an eval sweep from its rows file (hetkv eval --out FILE.jsonl):
 * every part of the sweep appends its rows as it ends, so a sweep stopped
 * after hours loses at most the part it was in. Each row carries the sweep's
 * fingerprint; rows of another sweep in the file are refused rather than
 * mixed. Rows are parsed with jansson, one object a line. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "eval.h"
#include "hash.h"

void eval_sweep_id(char out[17], const char *const *parts, int n) {
    uint64_t h = HKV_FNV1A_INIT_V0;
    for (int i = 0; i < n; i++) {
        const char *p = parts[i] ? parts[i] : "";
        h = hkv_fnv1a(h, p, strlen(p));
        h = hkv_fnv1a(h, "\x1f", 1);   /* a separator: ("ab","c") differs from ("a","bc") */
    }
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

int eval_resume_open(eval_resume *rs, const char *path, const char *sweep, hkv_err *err) {
    memset(rs, 0, sizeof *rs);
    snprintf(rs->sweep, sizeof rs->sweep, "%s", sweep);
    if (!(rs->old = json_array())) return hkv_seterr(err, HKV_E_NOMEM, "no memory for the rows");
    FILE *in = fopen(path, "r");
    if (!in && errno != ENOENT) return hkv_seterr(err, HKV_E_IO, "cannot read '%s': %s", path, strerror(errno));
    long line_no = 0;
    off_t good = 0;   /* the end of the last whole line: a torn one after it is cut off */
    int torn_tail = 0;
    for (char *line = NULL; in;) {
        size_t cap = 0;
        ssize_t len = getline(&line, &cap, in);
        if (len < 0) {
            free(line);
            break;
        }
        line_no++;
        const int torn = line[len - 1] != '\n';   /* the last line of a stopped run */
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        free(line);
        line = NULL;
        if (torn) {   /* written up to a stop: dropped, and cut from the file below */
            json_decref(o);
            torn_tail = 1;
            break;
        }
        if (!o || !json_is_object(o)) {
            json_decref(o);
            fclose(in);
            return hkv_seterr(err, HKV_E_FORMAT, "'%s' line %ld is not a row of hetkv eval (%s)",
                              path, line_no, je.text);
        }
        const char *sw = json_string_value(json_object_get(o, "sweep"));
        if (!sw || strcmp(sw, sweep)) {
            hkv_seterr(err, HKV_E_INVAL, "'%s' holds rows of another sweep (line %ld: sweep %s, "
                       "this one %s: another model, configs, contexts' settings, corpus or seed); "
                       "give another file to start one", path, line_no, sw ? sw : "none", sweep);
            json_decref(o);   /* sw is o's: after the message */
            fclose(in);
            return err ? err->code : HKV_E_INVAL;
        }
        json_array_append_new(rs->old, o);
        good = ftello(in);
    }
    if (in) fclose(in);
    if (torn_tail && truncate(path, good))
        return hkv_seterr(err, HKV_E_IO, "cannot cut the torn last line of '%s': %s", path,
                          strerror(errno));
    if (!(rs->f = fopen(path, "a")))
        return hkv_seterr(err, HKV_E_IO, "cannot write '%s': %s", path, strerror(errno));
    return HKV_OK;
}

int eval_resume_done(const eval_resume *rs, const char *kind, int64_t ctx) {
    size_t i;
    json_t *o;
    json_array_foreach(rs->old, i, o) {
        const char *k = json_string_value(json_object_get(o, "kind"));
        if (k && !strcmp(k, kind) && json_integer_value(json_object_get(o, "ctx")) == ctx) return 1;
    }
    return 0;
}

int eval_resume_append(eval_resume *rs, json_t *rows, hkv_err *err) {
    if (!rs->f) return HKV_OK;
    size_t i;
    json_t *o;
    json_array_foreach(rows, i, o) {
        char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!s) return hkv_seterr(err, HKV_E_NOMEM, "no memory for a row");
        fputs(s, rs->f);
        fputc('\n', rs->f);
        free(s);
    }
    if (fflush(rs->f)) return hkv_seterr(err, HKV_E_IO, "cannot write the rows file: %s", strerror(errno));
    return HKV_OK;
}

void eval_resume_close(eval_resume *rs) {
    if (rs->f) fclose(rs->f);
    json_decref(rs->old);
    memset(rs, 0, sizeof *rs);
}
