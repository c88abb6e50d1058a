/* One option table: each command-line option declared once (its names, its
 * value, where the value goes, its help), in groups the commands share;
 * the parser and --help are generated from the tables (cli_options.c). */
#ifndef HKV_CLI_OPTIONS_H
#define HKV_CLI_OPTIONS_H

#include <stddef.h>
#include <stdio.h>

#include "status.h"

/* What an option's value is and how it is stored at base + off. */
enum hkv_opt_kind {
    HKV_OPT_FLAG,    /* no value: int set to 1 */
    HKV_OPT_STR,     /* const char *, the argument itself */
    HKV_OPT_INT,     /* long long in lo..hi (hkv_arg_int) */
    HKV_OPT_FLOAT,   /* double in lo..hi (hkv_arg_float) */
    HKV_OPT_SIZE,    /* uint64_t, 24G, 512M (hkv_arg_size) */
    HKV_OPT_LIST,    /* long long[cap] in lo..hi, its count an int at base + n_off */
    HKV_OPT_FN,      /* fn parses the value (fn with no arg: a flag with an effect) */
};

/* The parser of an option whose value no kind above covers. opt: the name as
 * typed (errors name it); val: NULL for an option without an argument. */
typedef int (*hkv_opt_fn)(void *base, const char *opt, const char *val, hkv_err *err);

typedef struct hkv_opt {
    const char *name;      /* "--threads" */
    char short_name;       /* 't' for -t; 0: none */
    const char *arg;       /* the value's name in --help ("N"); NULL: no value */
    int kind;              /* enum hkv_opt_kind */
    size_t off;            /* where the value goes: offsetof in the group's struct */
    double lo, hi;         /* INT, FLOAT, LIST: the accepted range (exact to 2^53) */
    hkv_opt_fn fn;         /* HKV_OPT_FN */
    size_t n_off;          /* LIST: offsetof its count (int) */
    int cap;               /* LIST: most values */
    const char *help;      /* lines separated by '\n', shown from column 24 */
} hkv_opt;

/* One group as a command takes it: the table and the struct it fills. */
typedef struct hkv_opt_use {
    const hkv_opt *opts;   /* ends with an entry whose name is NULL */
    void *base;            /* the struct the offsets point into */
    const char *title;     /* --help's heading ("KV cache"); NULL: none */
    const char **first;    /* NULL, or set to the first of the group's options given */
    /* Options of a shared group this command does not take (eval and the
     * KV group's --policy): NULL-terminated names, left out of the parser
     * and --help; given anyway, the error is "NAME: omit_why" (or, with no
     * omit_why, the unknown-option one). */
    const char *const *omit;
    const char *omit_why;
} hkv_opt_use;

/* Parse argv[1..]: every argument must be an option of one of the uses,
 * tried in order (a command's own table first overrides a group's option of
 * the same name), or -h/--help, which every command takes. 0: parsed; 1:
 * -h/--help met (the options before it parsed, none after it); < 0: an error
 * naming the option. prog and cmd name the program and its command in the
 * unknown-option error ("run: unknown option '--x' (see hetkv run --help)");
 * cmd NULL for a program without commands ("hkv-dump-logits: unknown
 * option '--x' (see hkv-dump-logits --help)"). cmd may hold a space
 * ("bench far"). */
int hkv_opts_parse_prog(const char *prog, const char *cmd, const hkv_opt_use *uses, int n_uses,
                        int argc, char **argv, hkv_err *err);
/* hkv_opts_parse_prog for a command of hetkv. */
int hkv_opts_parse(const char *cmd, const hkv_opt_use *uses, int n_uses, int argc, char **argv,
                   hkv_err *err);
/* argv[*i] against one table: 1 it was one (its value consumed, *i moved
 * on), 0 it was not, < 0 an error. */
int hkv_opts_parse_one(const hkv_opt *opts, void *base, int argc, char **argv, int *i,
                       hkv_err *err);
/* usage, then each use's options under its heading, -h/--help after the
 * untitled ones; an option a use before it declared, or one the use omits,
 * is left out, as the parser never reaches it. */
void hkv_opts_help(FILE *f, const char *usage, const hkv_opt_use *uses, int n_uses);
/* One table's options, as in hkv_opts_help. */
void hkv_opts_help_table(FILE *f, const hkv_opt *opts);

/* The groups every command may take (cli_options.c, cli_kv.c, cli_device.c).
 * hkv_model_opts: -m, --model PATH, base: a const char *.
 * hkv_exec_opts: -t, --threads N; --isa NAME, base: hkv_exec_cli. */
extern const hkv_opt hkv_model_opts[];
typedef struct hkv_exec_cli {
    long long threads;     /* 0: one per core */
    int isa;               /* enum hkv_isa, -1: the best */
} hkv_exec_cli;
void hkv_exec_cli_init(hkv_exec_cli *x);
extern const hkv_opt hkv_exec_opts[];
/* hkv_sampling_opts: --temp T, --top-k K, --top-p P, --seed S. */
typedef struct hkv_sampling_cli {
    double temp;           /* NaN: not given (the command's default) */
    long long top_k, seed;
    double top_p;
} hkv_sampling_cli;
void hkv_sampling_cli_init(hkv_sampling_cli *s);
extern const hkv_opt hkv_sampling_opts[];

#endif
