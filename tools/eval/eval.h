/* hetkv eval: fidelity of KV policies against dense attention, and
 * long-context retrieval tasks, on real text.
 *
 * Pieces (tools/eval/eval_*.c): the configuration specs are the CLI's
 * (tools/cli/cli_configs.c); the text corpus (eval_corpus.c), the fidelity protocol (eval_fidelity.c), the tasks
 * (eval_tasks.c), tables and JSON (eval_report.c); cmd_eval.c parses options
 * and runs them in order. Every piece shares one engine whose tiered cache
 * holds two sequences: 0 keeps a prefilled prompt (policy full), 1 is forked
 * from it for each configuration, so the slow prefill runs once per prompt. */
#ifndef HKV_EVAL_H
#define HKV_EVAL_H

#include <stdint.h>
#include <jansson.h>
#include <stdio.h>

#include "cli.h"
#include "cli_configs.h"
#include "generate.h"
#include "policy.h"

int hkv_cmd_eval(int argc, char **argv);

#define EVAL_MAX_CTX 16
#define EVAL_MAX_NEEDLES 4
#define EVAL_MAX_TURNS 3

/* ---- corpus (eval_corpus.c) ------------------------------------------------ */

typedef struct eval_corpus {
    char sources[1024];      /* the files read, comma-separated */
    int n_files;
    size_t n_bytes;          /* normalised text */
    int32_t *tok;            /* the text's tokens */
    int64_t n_tok;
    uint8_t *sent_end;       /* [n_tok]: 1 when a sentence ends with token i */
} eval_corpus;

/* The default text, or why there is none (before the model loads). */
int eval_corpus_check(const char *paths, hkv_err *err);
/* Read files and directories (comma-separated; NULL: the default text),
 * normalise whitespace, tokenize. */
int eval_corpus_load(eval_corpus *c, const char *paths, const hkv_tokenizer *t, hkv_err *err);
void eval_corpus_free(eval_corpus *c);
extern const char eval_corpus_help[];

/* ---- shared run state (cmd_eval.c) ----------------------------------------- */

typedef struct eval_run {
    hkv_engine *e;
    const eval_corpus *corpus;
    const hkv_config *cfg;
    int n_cfg;
    int64_t cont;            /* teacher-forced tokens (fidelity) */
    int trials;
    int answer_tokens;       /* generated tokens per answer, at most */
    uint64_t seed;
    int verbose;             /* progress lines on stderr */
    float *logits;           /* [vocab] scratch */
    int64_t prefix_chunk;    /* --prefix-chunk (0: off) */
    int64_t fork_ctx;        /* the capacity the last eval_fork gave sequence 1 */
    int staged;              /* the last eval_fork_prep built its index at the last whole chunk */
    char date[32];           /* when the sweep started, UTC: every row's date, so rows
                              * written part by part equal the ones printed at the end */
    hkv_kv kv8;              /* the same cache with an 8-bit far tier, for the configurations
                                with far=q8 (ops NULL: none asks for one) */
} eval_run;

/* Fork sequence 0 into sequence 1 (capacity ctx) under a configuration:
 * the policy builds its index from sequence 0's kept prompt queries. The
 * audit is switched on (recall against the top-audit_k) or off. The INDEX
 * tier bytes sequence 1 holds (kept queries + the policy's index) go to
 * *index_bytes when it is not NULL. */
int eval_fork(eval_run *r, int64_t ctx, const hkv_policy_def *def, const hkv_policy_args *args,
              int audit, int64_t audit_k, int64_t *index_bytes, hkv_err *err);
/* After eval_fork, the prep its policy asks (index/policy.h): laq and
 * speckv run their lookahead on sequence 1 from the prompt and its prefill
 * logits; specpc re-prefills sequence 1 with the draft-compressed prompt.
 * logits: in, the prompt's prefill logits; out, those of the first token
 * (the compressed prompt's for specpc). max_new: output cap of the draft's
 * answer (0: the policy's lookahead). *base: the position sequence 1
 * continues at (n, or the compressed length). */
int eval_fork_prep(eval_run *r, const int32_t *prompt, int64_t n, float *logits, int64_t max_new,
                   int64_t *base, hkv_err *err);


/* ---- fidelity (eval_fidelity.c) -------------------------------------------- */

typedef struct eval_fid_row {
    char label[HKV_SPEC_LEN];
    char describe[256];       /* the policy's own statistics line */
    int64_t budget;
    double recall;            /* of the oracle's top-budget far tokens */
    double rel_err;           /* |o - o_dense| / |o_dense| of the attention output */
    double kl;                /* mean KL(full || config) of the next-token distribution */
    double kl_max;
    double agree;             /* greedy agreement with full */
    double nll;               /* mean negative log-likelihood of the true next token */
    double attended;          /* tokens attended per step and KV head (near + far) */
    double far;               /* far tier size, same samples */
    double ms_tok;            /* decode time per token, audit included */
    double t_index;           /* seconds to fork and build the index */
    int64_t index_bytes;      /* sequence 1's INDEX tier: kept queries + the policy's index */
} eval_fid_row;

typedef struct eval_fid {
    int64_t ctx, n_prompt, n_cont;
    double t_prefill;
    int n_rows;
    eval_fid_row rows[HKV_MAX_CONFIGS];
} eval_fid;

int eval_fidelity(eval_run *r, int64_t ctx, eval_fid *out, hkv_err *err);

/* ---- tasks (eval_tasks.c) --------------------------------------------------- */

enum { EVAL_PASSKEY, EVAL_NEEDLE, EVAL_MULTINEEDLE, EVAL_MULTITURN, EVAL_N_TASKS };
extern const char *const eval_task_names[EVAL_N_TASKS];

/* What one trial asked and what each configuration answered. */
typedef struct eval_trial {
    int n_needles, n_turns;
    char key[EVAL_MAX_NEEDLES][24];      /* city, or "pass key" */
    char value[EVAL_MAX_NEEDLES][16];
    double depth[EVAL_MAX_NEEDLES];      /* where each needle sits, 0..1 of the haystack */
    int ask[EVAL_MAX_TURNS];             /* needle asked in each turn */
    int64_t hay_offset, n_haystack;      /* corpus tokens [off, off + n) hold the needles */
    int64_t n_prompt;
    double t_prefill;
    /* [config][turn]: answer text and whether it holds the value */
    char answer[HKV_MAX_CONFIGS][EVAL_MAX_TURNS][96];
    int ok[HKV_MAX_CONFIGS][EVAL_MAX_TURNS];
} eval_trial;

typedef struct eval_task_row {
    char label[HKV_SPEC_LEN];
    int64_t budget;
    int correct, total;                  /* over trials and turns */
    int turn_correct[EVAL_MAX_TURNS];
    double t_decode;                     /* decode wall time, audit off */
    int64_t n_decode;
} eval_task_row;

typedef struct eval_task_result {
    int task;
    int64_t ctx;
    int n_trials, n_rows;
    eval_task_row rows[HKV_MAX_CONFIGS];
    eval_trial *trials;                  /* [n_trials] */
} eval_task_result;

int eval_task(eval_run *r, int task, int64_t ctx, eval_task_result *out, hkv_err *err);
void eval_task_result_free(eval_task_result *t);

/* ---- output (eval_report.c) ------------------------------------------------- */

void eval_print_fidelity(FILE *f, const eval_fid *x);
/* The run's points as flat rows for hetkv eval -o (eval_rows.c; NULL: out of
 * memory); sweep: the sweep's fingerprint (eval_sweep_id), in every row. */
json_t *eval_rows(const eval_run *r, const char *model, const char *sweep, const eval_fid *fid,
                  int n_fid, const eval_task_result *tasks, int n_tasks);

/* ---- resuming a sweep (eval_resume.c) ---------------------------------------- */

/* --out FILE.jsonl: each part of the sweep (fidelity at a context, a task at a
 * context) appends its rows when it ends; a run that finds rows of the same
 * sweep in FILE skips their parts. */
typedef struct eval_resume {
    char sweep[17];      /* this sweep's fingerprint, 16 hex digits */
    json_t *old;         /* the rows read back (this sweep's) */
    FILE *f;             /* FILE, appended to; NULL: no resuming */
} eval_resume;
/* The fingerprint of what decides a sweep's results: FNV-1a over the parts. */
void eval_sweep_id(char out[17], const char *const *parts, int n);
/* Read back path's rows (a missing file is an empty one; a torn last line,
 * from a run stopped while writing, is dropped) and open it for appending.
 * Rows of another sweep: an error naming the file. */
int eval_resume_open(eval_resume *rs, const char *path, const char *sweep, hkv_err *err);
/* 1 when FILE holds rows of the part (kind, ctx). */
int eval_resume_done(const eval_resume *rs, const char *kind, int64_t ctx);
/* Append rows, one JSON object a line, and flush. */
int eval_resume_append(eval_resume *rs, json_t *rows, hkv_err *err);
void eval_resume_close(eval_resume *rs);
/* One table: configurations down, (task, context) across. */
void eval_print_tasks(FILE *f, const eval_task_result *t, int n);
void eval_print_memory(FILE *f, const hkv_mem_account *m);
/* Everything as one JSON object (--json, --out FILE); a failed allocation
 * sets *bad (hkv_json_emit reports it). */
json_t *eval_json(const eval_run *r, const char *model, const eval_fid *fid, int n_fid,
                  const eval_task_result *tasks, int n_tasks, double t_total, int *bad);

#endif
