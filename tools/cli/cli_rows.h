/* Rows of measurements in the formats users of llama-bench expect
 * (`hetkv bench -o md|csv|json|jsonl`, cli_rows.c): one flat JSON object per
 * measured point, every row self-describing (model, policy and its
 * parameters, budget, context, batch, threads, ISA, device, the build's git
 * commit, the same run's probe, the date). Field names: docs/BENCH_ROWS.md. */
#ifndef HKV_BENCH_ROWS_H
#define HKV_BENCH_ROWS_H

#include <jansson.h>
#include <stdio.h>

#include "cli_options.h"
#include "status.h"

enum { HKV_ROWS_NONE = 0, HKV_ROWS_MD, HKV_ROWS_CSV, HKV_ROWS_JSON, HKV_ROWS_JSONL };

/* "md", "csv", "json", "jsonl" -> HKV_ROWS_*; error naming the known ones. */
int hkv_rows_format(const char *name, int *fmt, hkv_err *err);
/* The output options bench, eval and plan share: --json (one JSON object on
 * stdout) and -o, --output-format md|csv|json|jsonl (rows; each command's
 * usage says what a row is). base: hkv_output_cli. */
typedef struct hkv_output_cli {
    int json;
    int rows_fmt;   /* HKV_ROWS_*, HKV_ROWS_NONE: not given */
} hkv_output_cli;
extern const hkv_opt hkv_output_opts[];
/* The build's git commit (meson vcs_tag at build time; "unknown" outside a checkout). */
const char *hkv_build_commit(void);
/* The current UTC time as 2026-11-26T03:04:05Z into buf. */
void hkv_rows_date(char *buf, size_t cap);
/* rows: an array of flat objects with the same keys in the same order.
 * md: a table; csv: a header line and one line per row (RFC 4180 quoting,
 * null as an empty field); json: {"rows": [...]}; jsonl: one object a line. */
int hkv_rows_write(FILE *f, int fmt, json_t *rows, hkv_err *err);

#endif
