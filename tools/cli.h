/* Shared pieces of the hetkv command-line tools: strict argument parsing
 * (every value checked, errors name the option) and JSON output. */
#ifndef HKV_CLI_H
#define HKV_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "status.h"

/* Parse whole strings; errors name the option and the accepted range. */
int hkv_arg_int(const char *opt, const char *s, long long lo, long long hi, long long *out,
                hkv_err *err);
int hkv_arg_float(const char *opt, const char *s, double lo, double hi, double *out,
                  hkv_err *err);
/* Sizes like 24G, 512M, 1.5GiB, 4096 (bytes). */
int hkv_arg_size(const char *opt, const char *s, uint64_t *out, hkv_err *err);
/* Comma-separated integers ("1,2,4"); *n in/out: capacity, then count. */
int hkv_arg_int_list(const char *opt, const char *s, long long lo, long long hi, long long *vals,
                     int *n, hkv_err *err);
/* The value following option argv[*i]; error when it is missing. */
int hkv_arg_value(int argc, char **argv, int *i, const char **val, hkv_err *err);

/* JSON string with escapes (UTF-8 passed through, control bytes escaped;
 * invalid UTF-8 bytes become U+FFFD so the output is always valid JSON). */
void hkv_json_str(FILE *f, const char *s, size_t len);

/* Read a whole file (for -f PROMPT_FILE); malloc'd, NUL-terminated. */
int hkv_read_file(const char *path, char **out, size_t *len, hkv_err *err);

/* KV cache options shared by run, bench, eval and hkv-dump-logits:
 *   --kv plain|tiered  --policy NAME  --policy-arg KEY=VALUE (repeatable)
 *   --sink N  --local N  --draft MODEL */
#include "engine.h"
#define HKV_CLI_MAX_PARGS 16
typedef struct hkv_kv_cli {
    const char *kv, *policy;
    const char *draft;          /* --draft MODEL (speckv, specpc) */
    const char *pargs[HKV_CLI_MAX_PARGS];
    int n_pargs;
    long long sink, local;
} hkv_kv_cli;
void hkv_kv_cli_init(hkv_kv_cli *k);
/* 1 when argv[*i] was one of the options (its value consumed), 0 when not,
 * < 0 on error. */
int hkv_kv_cli_parse(hkv_kv_cli *k, int argc, char **argv, int *i, hkv_err *err);
/* Check and apply to engine params. */
int hkv_kv_cli_apply(const hkv_kv_cli *k, hkv_engine_params *ep, hkv_err *err);
extern const char hkv_kv_cli_help[];

/* The subcommands. */
int hkv_cmd_run(int argc, char **argv);
int hkv_cmd_info(int argc, char **argv);
int hkv_cmd_bench(int argc, char **argv);
int hkv_cmd_policies(int argc, char **argv);

#endif
