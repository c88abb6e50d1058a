/* Shared pieces of the hetkv command-line tools: strict argument parsing
 * (every value checked, errors name the option) and JSON output. */
#ifndef HKV_CLI_H
#define HKV_CLI_H

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "cli_options.h"
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

/* JSON output through jansson (cli_json.c). Trees are built with hkv_jset
 * and hkv_jpush, which note a failed allocation in *bad (jansson would drop
 * the member silently), and written once by hkv_json_emit. */
/* A JSON string of n bytes: bytes that are not UTF-8 (a token boundary can
 * cut a character) become U+FFFD, one per byte, and so does NUL unless
 * keep_nul (then \u0000); NULL only without memory. */
json_t *hkv_json_text(const char *s, size_t n, int keep_nul);
json_t *hkv_jstr(const char *s);   /* hkv_json_text of a C string; NULL: "" */
/* v as printf's fmt ("%.4f") writes it, so the output keeps the precision
 * it had, an integer where that text has no point ("%.0f"); null when v is
 * NaN or infinite (json_real refuses them). */
json_t *hkv_jnum(double v, const char *fmt);
/* A count held in a double (written "%.0f" before): an integer. */
json_t *hkv_jint(double v);
void hkv_jset(json_t *o, const char *key, json_t *v, int *bad);
void hkv_jpush(json_t *a, json_t *v, int *bad);
/* o as one compact line and a newline; takes o. HKV_E_NOMEM when bad, o is
 * NULL or jansson cannot write it. */
int hkv_json_emit(FILE *f, json_t *o, int bad, hkv_err *err);

/* SIGINT and SIGTERM into set, blocked in the calling thread and every
 * thread it starts afterwards (cli_signals.c says why); then taken between
 * steps: the signal pending (and consumed), or 0. */
void hkv_cli_block_stop_signals(sigset_t *set);
int hkv_cli_signal_pending(const sigset_t *set);

/* Read a whole file (for -f PROMPT_FILE); malloc'd, NUL-terminated. */
int hkv_read_file(const char *path, char **out, size_t *len, hkv_err *err);

/* KV cache options shared by run, bench, eval, batch, serve and
 * hkv-dump-logits:
 *   --kv plain|tiered  --policy NAME  --policy-arg KEY=VALUE (repeatable)
 *   --sink N  --local N  --draft MODEL
 * and the products' precision, an engine option every one of them takes:
 *   --precision exact|fast */
#include "engine.h"
#define HKV_CLI_MAX_PARGS 16
typedef struct hkv_kv_cli {
    const char *kv, *policy;
    const char *draft;          /* --draft MODEL (speckv, specpc) */
    const char *pargs[HKV_CLI_MAX_PARGS];
    int n_pargs;
    long long sink, local;
    int precision;              /* enum hkv_precision */
    int far_numa;               /* enum hkv_far_numa (--far-numa) */
    int far_q8;                 /* --far-kv q8 */
} hkv_kv_cli;
void hkv_kv_cli_init(hkv_kv_cli *k);
/* The group's table (base: hkv_kv_cli). */
extern const hkv_opt hkv_kv_opts[];
/* hkv_opts_parse_one over that table: 1 when argv[*i] was one of the
 * options (its value consumed), 0 when not, < 0 on error. */
int hkv_kv_cli_parse(hkv_kv_cli *k, int argc, char **argv, int *i, hkv_err *err);
/* Check and apply to engine params. */
int hkv_kv_cli_apply(const hkv_kv_cli *k, hkv_engine_params *ep, hkv_err *err);
/* 1 when the policy is the runtime's to pick (--policy auto, or none given,
 * on the tiered cache): hkv_device_cli_check_near decides with the plan. */
int hkv_kv_cli_auto(const hkv_kv_cli *k);
/* A far tier's format as written, "f16" or "q8", to *q8 (0 or 1); what
 * names the value in the error (an option or a configuration). */
int hkv_far_kv_parse(const char *what, const char *v, int *q8, hkv_err *err);

/* Device and model-source options shared by run, bench, info and plan
 * (cli_device.c): --device cpu|cuda  --gpu-mem SIZE  --host-mem SIZE  --synthetic NAME
 * --synthetic-weights q4|q8|f16|f32  --gpu-gemm MODE  --gpu-profile. */
typedef struct hkv_device_cli {
    int cuda;                 /* --device cuda */
    uint64_t gpu_mem;         /* --gpu-mem; 0: not given */
    uint64_t host_mem;        /* --host-mem: the page-locked far tier's cap; 0: what the host
                                 has available (MemAvailable) */
    const char *synthetic;    /* --synthetic NAME (checked against the table) */
    int synthetic_wtype;      /* enum hkv_wtype */
    int gemm;                 /* --gpu-gemm: enum hkv_qmat_gemm, -1 auto */
    int profile;              /* --gpu-profile: every backend op timed on the device */
    int lockstep;             /* --gpu-lockstep: no host step deferred (A/B baseline) */
    int pingpong;             /* --gpu-pingpong: micro-batch ping-pong */
    int no_graphs;            /* --gpu-no-graphs: no replayed decode steps (A/B baseline) */
    int spin_us;              /* --gpu-spin-us N: N, or -1 for 0 (sleep at once); 0: not given */
    int team_spin;            /* --gpu-team-spin: the OpenMP team waits with the host, spinning */
    int64_t prompt_keys;      /* --gpu-prompt-keys N: N, or -1 for 0; 0: not given (as many as fit) */
    int64_t prompt_block;     /* --gpu-prompt-block N; 0: not given */
    uint64_t offload_mem;     /* --gpu-offload-mem SIZE; 0: not given */
    int resident;             /* --gpu-resident N: `full` sequences whose whole KV the device
                                 keeps too; -1: not given (hkv_device_cli_check_near picks it
                                 under --policy auto, else 0) */
    int resident_chunk;       /* --gpu-resident-chunk N; 0: not given */
    long long resident_rows;  /* --gpu-resident-rows N: far rows a resident slot holds; 0: all */
    int resident_prefixes;    /* --gpu-resident-prefixes N: shared prefixes kept once; 0: none */
    int split_overflow;       /* --split-overflow: under auto, a request that fits a resident
                                 slot runs ctkvr in the split while every slot is busy (batch,
                                 serve); 0: it waits for a slot */
    int queued;               /* set by batch and serve: requests arrive through the scheduler's
                                 queue, so placement can make them wait for a resident slot */
    long long shared_rows;    /* first rows every sequence shares by reference (bench
                                 --shared-prefix): the plan holds their far tier once */
    int full_split;           /* --local N given: `full` keeps a far tier on the host, planned in
                                 the split; without it full is dense or refused */
    const int64_t *job_rows;  /* rows (prompt + answer + 1) each request of a batch job needs,
                                 ascending, when known before the engine starts (hetkv batch);
                                 NULL: unknown. Placement under auto sizes the resident slots
                                 from them when --gpu-resident-rows is not given */
    int64_t n_job_rows;
} hkv_device_cli;
void hkv_device_cli_init(hkv_device_cli *d);
/* The group's table (base: hkv_device_cli). */
extern const hkv_opt hkv_device_opts[];
/* 1 when argv[*i] was one of the options (value consumed), 0 if not, < 0 on error. */
int hkv_device_cli_parse(hkv_device_cli *d, int argc, char **argv, int *i, hkv_err *err);
/* The model source into engine params: exactly one of model_path and --synthetic. */
int hkv_device_cli_apply(const hkv_device_cli *d, const char *model_path, hkv_engine_params *ep,
                         hkv_err *err);
/* A model's shape without its weights: the synthetic table or GGUF metadata. */
int hkv_cli_model_config(const char *model_path, const char *synthetic, hkv_model_config *cfg,
                         hkv_err *err);
/* The weights' bytes as the device holds them, what its plan admits: a
 * synthetic model's in --synthetic-weights' format, a GGUF's repacked
 * (pipeline/): a Q4 8B model is 4.5 GB, not fp16's 16. *name says which. */
int hkv_device_cli_weight_bytes(const hkv_device_cli *d, const char *model_path,
                                const hkv_model_config *cfg, uint64_t *bytes, const char **name,
                                hkv_err *err);
/* The GPU memory cap: 0 for cpu (--gpu-mem then is an error); for cuda the
 * --gpu-mem value or the device's free memory; no device, or a cap above the
 * device's memory, is an error naming why. desc describes the device. */
int hkv_device_cli_cap(const hkv_device_cli *d, uint64_t *cap, char *desc, size_t desc_cap,
                       hkv_err *err);
/* Before loading anything: HKV_OK for cpu; for cuda, the device, the cap and
 * the plan's admission of batch x n_ctx (n_ctx 0: the model's), then an
 * error either way (the refusal, or: no GPU execution path yet). */
int hkv_device_cli_check(const hkv_device_cli *d, const char *model_path,
                         const hkv_engine_params *ep, int batch, int64_t n_ctx, hkv_err *err);
/* hkv_device_cli_check, after one thing: with --device cuda, the policy
 * full and no --local (local_given 0), the near tier grows to hold the whole
 * context when the plan admits that too, so full attends on the device (the
 * dense baseline, no far tier and no host work per layer); else it stays as
 * it is. Says which on stderr when it grows. With auto (hkv_kv_cli_auto)
 * and --device cuda, a context that does not fit the device whole runs
 * ctkvr in the split instead of full (whose far part would be the host's
 * whole far tier every step), said on stderr; ep->tiered.policy names what
 * was picked. Then, without --gpu-resident, d->resident becomes the most
 * sequences of the batch whose whole KV fits beside the split's plan: the
 * scheduler runs that many of them as `full` on the device (per-sequence
 * placement, hkv_sched_params.resident), the rest under ctkvr. With the
 * job's rows known (d->job_rows) and no --gpu-resident-rows, the slots hold
 * what the job's requests need rather than a whole context: of the slot
 * sizes that cover all, 99, 95, 90, 75 or 50% of the requests, the one that
 * places the most of the job on the device at a time (the share it covers x
 * the share of the batch it admits) becomes d->resident_rows; a request
 * longer than that runs ctkvr (hkv_sched_params.resident_rows). */
int hkv_device_cli_check_near(hkv_device_cli *d, const char *model_path,
                              hkv_engine_params *ep, int local_given, int auto_policy, int batch,
                              int64_t n_ctx, hkv_err *err);
/* The far rows one resident slot holds for a sequence of its own (slots
 * behind a kept prefix hold only the rows past it): what the scheduler
 * checks a placed request against (hkv_sched_params.resident_rows); 0 for
 * a whole context. */
int64_t hkv_device_cli_slot_rows(const hkv_device_cli *d);
/* After hkv_engine_open: with --device cuda, the CUDA backend (weights to
 * the device under the cap) becomes the engine's. */
int hkv_device_cli_attach(const hkv_device_cli *d, hkv_engine *e, hkv_err *err);
/* The pipeline's timeline and device memory as o's "device" member
 * ({"backend":"cpu"} on the CPU backend). */
void hkv_device_cli_json(json_t *o, hkv_engine *e, int *bad);
/* A timeline's members from cpu_busy_s on, the prompt rows and index builds
 * with prompt_rows (run's whole-run timeline; bench's per point has none),
 * and "ops", the device time per backend op (--gpu-profile; absent when no
 * op other than the products was timed). */
struct hkv_pipeline_stats;
void hkv_device_cli_timeline(json_t *t, const struct hkv_pipeline_stats *ps, int prompt_rows,
                             int *bad);
/* "fallbacks": {reason: count} for every reason (index/policy.h, enum
 * hkv_fallback), and "fallbacks_total": the work the device offers that the
 * host did instead. Part of every timeline. */
void hkv_device_cli_fallbacks(json_t *t, const struct hkv_pipeline_stats *ps, int *bad);
/* Their sum. */
int64_t hkv_device_fallbacks_total(const struct hkv_pipeline_stats *ps);
void hkv_device_cli_summary(FILE *f, hkv_engine *e);

/* The subcommands. */
int hkv_cmd_run(int argc, char **argv);
int hkv_cmd_batch(int argc, char **argv);
int hkv_cmd_info(int argc, char **argv);
int hkv_cmd_bench(int argc, char **argv);
int hkv_cmd_policies(int argc, char **argv);
int hkv_cmd_plan(int argc, char **argv);
/* hetkv plan -o md|csv|jsonl (plan_rows.c): the --json rows, flattened; fmt: HKV_ROWS_*. */
int hkv_plan_rows(int argc, char **argv, int fmt);

/* ---- progress lines (cli_progress.c) ---- */

/* A long piece of work's progress on stderr: done of total units, the rate
 * and the time left at it; a line rewritten in place on a terminal (at most
 * twice a second), a line every 10 s in a log, nothing in the first 2 s. */
typedef struct hkv_progress {
    const char *what, *unit;   /* "prefill", "tokens" (NULL: the share done only) */
    double last;               /* elapsed seconds at the last line */
    int tty, shown;
} hkv_progress;
void hkv_progress_init(hkv_progress *p, const char *what, const char *unit);
void hkv_progress_update(hkv_progress *p, double done, double total, double elapsed_s);
/* An hkv_progress_fn (runtime/engine.h) over an hkv_progress *: a prefill's. */
int hkv_progress_prefill(void *ud, int64_t done, int64_t n, double elapsed_s);

#endif
