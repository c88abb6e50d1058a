/* cli_rows.h: the measured points as md, csv, json or jsonl, written
 * through jansson (numbers as JSON writes them, so every format agrees). */
#include <stddef.h>
#include <string.h>
#include <time.h>

#include "cli_rows.h"
#include "hkv_commit.h"

int hkv_rows_format(const char *name, int *fmt, hkv_err *err) {
    static const char *names[] = {"md", "csv", "json", "jsonl"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, names[i])) return *fmt = HKV_ROWS_MD + i, HKV_OK;
    return hkv_seterr(err, HKV_E_INVAL, "-o: unknown format '%s' (md, csv, json, jsonl)", name);
}

static int parse_rows_format(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    return hkv_rows_format(v, &((hkv_output_cli *)base)->rows_fmt, err);
}

const hkv_opt hkv_output_opts[] = {
    {.name = "--json", .kind = HKV_OPT_FLAG, .off = offsetof(hkv_output_cli, json),
     .help = "one JSON object on stdout"},
    {.name = "--output-format", .short_name = 'o', .arg = "F", .kind = HKV_OPT_FN,
     .fn = parse_rows_format,
     .help = "md, csv, json or jsonl: one self-describing row per measured\n"
             "point on stdout, as the usage above says (docs/BENCH_ROWS.md)"},
    {0},
};

const char *hkv_build_commit(void) { return HKV_BUILD_COMMIT; }

void hkv_rows_date(char *buf, size_t cap) {
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* One value as text: strings raw, numbers and literals as JSON writes them. */
static char *value_text(json_t *v) {
    if (json_is_string(v)) return strdup(json_string_value(v));
    if (!v || json_is_null(v)) return strdup("");
    return json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(6));
}

static void csv_field(FILE *f, const char *s) {
    if (!strpbrk(s, ",\"\n\r")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void md_field(FILE *f, const char *s) {
    for (; *s; s++) {   /* a pipe would end the cell */
        if (*s == '|') fputc('\\', f);
        fputc(*s == '\n' ? ' ' : *s, f);
    }
}

int hkv_rows_write(FILE *f, int fmt, json_t *rows, hkv_err *err) {
    if (!json_is_array(rows)) return hkv_seterr(err, HKV_E_INTERNAL, "rows: not an array");
    const size_t n = json_array_size(rows);
    if (fmt == HKV_ROWS_JSON || fmt == HKV_ROWS_JSONL) {
        if (fmt == HKV_ROWS_JSON) {
            json_t *o = json_pack("{s:O}", "rows", rows);
            char *t = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
            json_decref(o);
            if (!t) return hkv_seterr(err, HKV_E_NOMEM, "no memory for the rows' JSON");
            fprintf(f, "%s\n", t);
            free(t);
        }
        for (size_t i = 0; fmt == HKV_ROWS_JSONL && i < n; i++) {
            char *t = json_dumps(json_array_get(rows, i), JSON_COMPACT | JSON_REAL_PRECISION(6));
            if (!t) return hkv_seterr(err, HKV_E_NOMEM, "no memory for a row's JSON");
            fprintf(f, "%s\n", t);
            free(t);
        }
        return HKV_OK;
    }
    if (!n) return HKV_OK;
    json_t *first = json_array_get(rows, 0);
    const char *key;
    json_t *v;
    int k = 0;
    json_object_foreach(first, key, v) {   /* the header: the first row's keys, in order */
        (void)v;
        if (fmt == HKV_ROWS_CSV) {
            if (k) fputc(',', f);
            csv_field(f, key);
        } else {
            fputs(k ? " " : "| ", f);
            md_field(f, key);
            fputs(" |", f);
        }
        k++;
    }
    fputc('\n', f);
    if (fmt == HKV_ROWS_MD) {
        for (int i = 0; i < k; i++) fputs(i ? "---|" : "|---|", f);
        fputc('\n', f);
    }
    for (size_t i = 0; i < n; i++) {
        json_t *row = json_array_get(rows, i);
        int c = 0;
        json_object_foreach(first, key, v) {
            char *t = value_text(json_object_get(row, key));
            if (!t) return hkv_seterr(err, HKV_E_NOMEM, "no memory for a row");
            if (fmt == HKV_ROWS_CSV) {
                if (c) fputc(',', f);
                csv_field(f, t);
            } else {
                fputs(c ? " " : "| ", f);
                md_field(f, t);
                fputs(" |", f);
            }
            free(t);
            c++;
        }
        fputc('\n', f);
    }
    return HKV_OK;
}
