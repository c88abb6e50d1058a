/* hetkv batch: OpenAI batch JSONL in and out (batch_io.c) and the job
 * runner (cmd_batch.c). */
#ifndef HKV_BATCH_H
#define HKV_BATCH_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "cli.h"
#include "cli_options.h"
#include "scheduler.h"
#include "tokenizer.h"

/* Defaults for fields a request leaves out. */
typedef struct hkv_batch_defaults {
    int max_tokens;        /* --max-tokens: cap when the request gives none */
    int64_t n_ctx;         /* the engine's context: the default is cut to fit it */
    int stop_at_eog;       /* 0 with --ignore-eos */
    int streaming;         /* hetkv serve: body.stream is accepted (the caller reads it) */
} hkv_batch_defaults;

/* One input line on its way through the job. */
typedef struct hkv_batch_item {
    int64_t line;          /* 1-based line of the input file */
    char *custom_id;       /* NULL when the line has none (invalid JSON, missing field) */
    int chat;              /* /v1/chat/completions; else /v1/completions */
    int32_t *prompt;
    int64_t n_prompt;
    char *stop_buf[HKV_SCHED_MAX_STOP];
    hkv_sched_req req;
} hkv_batch_item;

/* Parse and tokenise one request line into it (it->line set by the caller).
 * Errors name the problem (invalid JSON with its column, a missing or
 * ill-typed field, an unsupported value); it->custom_id is set whenever the
 * line had one, so the error line can carry it. */
int hkv_batch_parse(const char *line, size_t len, const hkv_tokenizer *tok,
                    const hkv_batch_defaults *d, hkv_batch_item *it, hkv_err *err);
void hkv_batch_item_free(hkv_batch_item *it);

/* The request body alone (hkv_batch_parse after the line's envelope, and
 * hetkv serve for an HTTP body): the prompt (chat: messages through the
 * model's chat template) tokenised, the sampling fields and stop strings
 * into it->req; seed when the body gives none. Unknown fields are ignored,
 * fields hetkv cannot honour refused. */
int hkv_batch_parse_body(json_t *body, int chat, const hkv_tokenizer *tok,
                         const hkv_batch_defaults *d, uint64_t seed, hkv_batch_item *it,
                         hkv_err *err);

/* What every result line carries besides the request's own. */
typedef struct hkv_batch_meta {
    const char *model;
    const char *policy;    /* "ctkvr rho_p=256" etc. */
    int placed;            /* per-sequence placement (auto on a device): each line says where
                              its request ran, "placement": "device" (full, whole KV on the
                              device) or "split" (the policy, the far tier on the host) */
} hkv_batch_meta;

/* A result line (no trailing newline; caller frees): the completion of a
 * finished request, or an error line (status 400 for the request's own
 * fault, 500 otherwise) with message msg. */
char *hkv_batch_result_line(const hkv_batch_item *it, const hkv_batch_meta *m);
/* The OpenAI response body of a finished request (chat.completion or
 * text_completion, id from it->line, with usage), and an error body
 * {"error": {message, type, param, code}} (code may be NULL); new refs. */
json_t *hkv_batch_completion_body(const hkv_batch_item *it, const char *model);
json_t *hkv_batch_error_body(int status, const char *msg, const char *code);
/* A JSON string of n bytes; bytes that are not UTF-8 (a token boundary can
 * cut a character) and NUL become U+FFFD, one per byte. */
json_t *hkv_json_utf8(const char *s, size_t n);
char *hkv_batch_error_line(int64_t line, const char *custom_id, int status, const char *msg,
                           const hkv_batch_meta *m);

/* The requests of a job's input still to answer: lines 1..n_lines of in,
 * n_req of them requests, those with (line - 1) % shard_n == shard_i in
 * this shard, done[line] set for the lines answered already (may be NULL). */
typedef struct hkv_batch_scan {
    const char *in, *model;
    int64_t n_lines, n_req;
    const char *done;
    long long shard_i, shard_n;
} hkv_batch_scan;

/* The rows (prompt + answer + 1) each of those requests needs under the
 * defaults d, ascending (*rows malloc'd, *n_rows of them): the model's
 * tokenizer alone is loaded, every request tokenised as the job will (chat
 * through the template); lines that do not parse are left out (their error
 * line comes at their turn). batch_rows.c */
int hkv_batch_job_rows(const hkv_batch_scan *sc, const hkv_batch_defaults *d, int64_t **rows,
                       int64_t *n_rows, hkv_err *err);

/* Results already in out_path from an earlier run of the job: a torn last
 * line is cut off (the file truncated to its last newline); done[line] = 1
 * for every input line answered (done has n_lines + 1 entries) and the
 * custom_id each was answered for in ids[line] (malloc'd; NULL when the
 * line had none). A line that is not a result of hetkv batch is an error:
 * the file is not ours to append to. *n_done counts lines answered,
 * *n_torn 1 when a torn line was cut. */
int hkv_batch_scan_output(const char *out_path, int64_t n_lines, char *done, char **ids,
                          int64_t *n_done, int *n_torn, hkv_err *err);

/* The scheduler options batch and serve share (batch_opts.c): --max-batch N,
 * --mem SIZE, --chunk N, -c/--ctx N, --prefix-cache N. */
typedef struct hkv_sched_cli {
    long long max_batch, chunk, ctx;   /* ctx 0: the model's */
    long long prefix_cache;            /* prompt prefixes kept (scheduler.h), 0: none */
    uint64_t mem;                      /* 0: free memory after loading, less 10% */
} hkv_sched_cli;
void hkv_sched_cli_init(hkv_sched_cli *s);
extern const hkv_opt hkv_sched_opts[];
/* The engine's parameters for batch and serve from their shared options:
 * the model, threads and ISA (x); the scheduler's slots (each kept prefix
 * one more), context and chunk (sc); the KV options; then the device's
 * near-tier check, which under --policy auto may give sequences resident
 * slots (dev->queued is set: requests wait in the scheduler's queue). */
int hkv_sched_cli_engine_params(hkv_engine_params *ep, const char *model, const hkv_exec_cli *x,
                                const hkv_sched_cli *sc, const hkv_kv_cli *kv, hkv_device_cli *dev,
                                hkv_err *err);

#endif
