/* hetkv batch: an offline job of OpenAI batch request lines, run with
 * continuous batching (runtime/scheduler.h), written as OpenAI batch result
 * lines, resumable after a kill. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "batch.h"
#include "batch_mpi.h"
#include "cli.h"
#include "hash.h"

static const char batch_usage[] =
    "usage: hetkv batch -m MODEL -i IN.jsonl -o OUT.jsonl [options]\n"
    "\n"
    "Run OpenAI batch request lines (/v1/chat/completions, /v1/completions) with\n"
    "continuous batching; each result line is written whole and synced, and the same\n"
    "command run again skips the requests already answered (docs/BATCH.md).\n"
    "\n"
    "Under MPI (mpirun -n K hetkv batch ..., or srun; built with Open MPI) the job\n"
    "spreads over K processes: rank 0 reads the input, hands requests to the ranks\n"
    "as they ask for them, decodes its own share and writes every result; -i and -o\n"
    "need only exist where rank 0 runs, the model on every machine; -t and --max-batch\n"
    "apply to each rank.\n"
    "\n";

typedef struct batch_opts {
    const char *model, *in, *out;
    long long max_tokens, shard_i, shard_n;
    int quiet, json, ignore_eos, no_invariant, no_mpi;
    hkv_sched_cli sc;
    hkv_exec_cli x;
    hkv_kv_cli kv;
    hkv_device_cli dev;
} batch_opts;

static int parse_shard(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    batch_opts *o = base;
    char *slash = strchr(v, '/'), ib[32];
    if (!slash || slash - v >= (long)sizeof ib)
        return hkv_seterr(err, HKV_E_INVAL, "--shard: '%s' is not I/N", v);
    memcpy(ib, v, (size_t)(slash - v));
    ib[slash - v] = 0;
    int rc = hkv_arg_int("--shard N", slash + 1, 1, 1 << 20, &o->shard_n, err);
    return rc ? rc : hkv_arg_int("--shard I", ib, 0, o->shard_n - 1, &o->shard_i, err);
}

/* batch's own options; the groups it shares follow them in batch_uses(). */
static const hkv_opt batch_opts_table[] = {
    {.name = "--input", .short_name = 'i', .arg = "PATH", .kind = HKV_OPT_STR,
     .off = offsetof(batch_opts, in), .help = "request lines (JSONL)"},
    {.name = "--output", .short_name = 'o', .arg = "PATH", .kind = HKV_OPT_STR,
     .off = offsetof(batch_opts, out), .help = "result lines (JSONL), appended to when it exists"},
    {.name = "--max-tokens", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(batch_opts, max_tokens),
     .lo = 1, .hi = 1 << 24, .help = "max_tokens of a request that gives none (default 256)"},
    {.name = "--shard", .arg = "I/N", .kind = HKV_OPT_FN, .fn = parse_shard,
     .help = "run only input lines l with (l - 1) % N == I (I in 0..N-1): one\n"
             "of N jobs of an array, each with its own -o"},
    {.name = "--ignore-eos", .kind = HKV_OPT_FLAG, .off = offsetof(batch_opts, ignore_eos),
     .help = "do not stop at end-of-generation tokens"},
    {.name = "--no-invariant", .kind = HKV_OPT_FLAG, .off = offsetof(batch_opts, no_invariant),
     .help = "decode with the unrolled GEMV whose rounding depends on how many\n"
             "sequences are in the step (faster at small batches; greedy\n"
             "outputs may then differ with --max-batch)"},
    {.name = "--no-mpi", .kind = HKV_OPT_FLAG, .off = offsetof(batch_opts, no_mpi),
     .help = "under mpirun or srun, do not join the other ranks (each rank is\n"
             "then a job of its own: give each its --shard and -o)"},
    {.name = "--quiet", .short_name = 'q', .kind = HKV_OPT_FLAG, .off = offsetof(batch_opts, quiet),
     .help = "no progress on stderr"},
    {.name = "--json", .kind = HKV_OPT_FLAG, .off = offsetof(batch_opts, json),
     .help = "a JSON summary on stdout at the end"},
    {0},
};

static int batch_uses(batch_opts *o, hkv_opt_use *u) {
    int n = 0;
    u[n++] = (hkv_opt_use){.opts = hkv_model_opts, .base = &o->model};
    u[n++] = (hkv_opt_use){.opts = batch_opts_table, .base = o};
    u[n++] = (hkv_opt_use){.opts = hkv_sched_opts, .base = &o->sc};
    u[n++] = (hkv_opt_use){.opts = hkv_exec_opts, .base = &o->x};
    u[n++] = (hkv_opt_use){.opts = hkv_kv_opts, .base = &o->kv, .title = "KV cache"};
    u[n++] = (hkv_opt_use){.opts = hkv_device_opts, .base = &o->dev, .title = "Device"};
    return n;
}

static int parse(int argc, char **argv, batch_opts *o, hkv_err *err) {
    memset(o, 0, sizeof *o);
    o->max_tokens = 256;
    o->shard_n = 1;
    hkv_sched_cli_init(&o->sc);
    hkv_exec_cli_init(&o->x);
    hkv_kv_cli_init(&o->kv);
    hkv_device_cli_init(&o->dev);
    hkv_opt_use uses[8];
    int rc = hkv_opts_parse("batch", uses, batch_uses(o, uses), argc, argv, err);
    if (rc) return rc;
    if (o->dev.synthetic)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "batch: --synthetic models have no tokenizer to "
                          "read requests or write text");
    if (!o->model) return hkv_seterr(err, HKV_E_INVAL, "batch: no model (-m MODEL)");
    if (!o->in) return hkv_seterr(err, HKV_E_INVAL, "batch: no input (-i IN.jsonl)");
    if (!o->out) return hkv_seterr(err, HKV_E_INVAL, "batch: no output (-o OUT.jsonl)");
    return HKV_OK;
}

typedef struct job {
    batch_opts *o;
    hkv_engine *e;
    hkv_batch_meta meta;
    hkv_batch_defaults dflt;
    int fd;                       /* output, O_APPEND */
    int io_rc;                    /* first write failure */
    hkv_err io_err;
    int64_t total, skipped, done, errors, in_flight;
    int64_t prompt_toks, gen_toks;
    int64_t on_device;             /* answered requests placed whole on the device */
    double t0, last_progress;
    int tty;
    char policy[256];
    /* MPI: the worker ranks' wants (rank 0), or this worker's */
    hkv_mpi *mpi;
    int64_t *demand;              /* [size]: requests each worker asked for and has not had */
    int64_t *by_rank;             /* [size]: requests each rank answered this run */
    int workers_left;             /* workers that have not said goodbye */
    int64_t w_steps, w_rows;      /* the workers' decode steps and rows */
    int64_t line, line_err, line_ptoks, line_gtoks;   /* a worker's line being sent */
} job;

static int worker(const job *j) { return j->mpi && j->mpi->active && j->mpi->rank > 0; }

/* One result line, whole, then synced: a kill at any point leaves complete
 * lines and at most one torn last line, which the next run cuts off. */
static void write_line(job *j, char *s) {
    if (!s) {
        if (!j->io_rc) j->io_rc = hkv_seterr(&j->io_err, HKV_E_NOMEM, "no memory for a result line");
        return;
    }
    if (worker(j)) {   /* a worker's lines go to rank 0, which writes them */
        if (!j->io_rc) {
            int64_t h[4] = {j->line, j->line_err, j->line_ptoks, j->line_gtoks};
            j->io_rc = hkv_mpi_send(j->mpi, 0, HKV_MPI_RESULT, h, s, strlen(s), &j->io_err);
        }
        free(s);
        return;
    }
    size_t n = strlen(s);
    s[n] = '\n';   /* json_dumps leaves the NUL's byte ours; put it back below */
    size_t off = 0;
    while (off < n + 1 && !j->io_rc) {
        ssize_t w = write(j->fd, s + off, n + 1 - off);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) j->io_rc = hkv_seterr(&j->io_err, HKV_E_IO, "%s: %s", j->o->out, strerror(errno));
        else off += (size_t)w;
    }
    s[n] = 0;
    if (!j->io_rc && fsync(j->fd) != 0 && errno != EINVAL)
        j->io_rc = hkv_seterr(&j->io_err, HKV_E_IO, "%s: fsync: %s", j->o->out, strerror(errno));
    free(s);
}

static void error_line(job *j, int64_t line, const char *cid, int code, const char *msg) {
    int status = code == HKV_E_NOMEM || code == HKV_E_INTERNAL || code == HKV_E_IO ||
                 code == HKV_E_DEVICE ? 500 : 400;
    j->line = line, j->line_err = 1, j->line_ptoks = j->line_gtoks = 0;
    write_line(j, hkv_batch_error_line(line, cid, status, msg, &j->meta));
    j->done++;
    j->errors++;
}

static void progress(job *j, int final) {
    if (j->o->quiet) return;
    double now = hkv_now(), el = now - j->t0;
    if (!final && now - j->last_progress < (j->tty ? 0.5 : 10.0)) return;
    j->last_progress = now;
    int64_t left = j->total - j->skipped - j->done;
    double rate = el > 0 ? j->done / el : 0;
    char eta[32] = "?";
    if (rate > 0) snprintf(eta, sizeof eta, "%.0fs", left / rate);
    fprintf(stderr, "%shetkv batch: %lld/%lld done (%lld from an earlier run), %lld errors, "
            "%lld running, prompt %.1f tok/s, generated %.1f tok/s, ETA %s%s",
            j->tty ? "\r" : "", (long long)(j->done + j->skipped), (long long)j->total,
            (long long)j->skipped, (long long)j->errors, (long long)j->in_flight,
            el > 0 ? j->prompt_toks / el : 0, el > 0 ? j->gen_toks / el : 0, eta,
            j->tty && !final ? "   " : "\n");
    fflush(stderr);
}

static void on_done(void *ud, hkv_sched_req *r) {
    job *j = ud;
    hkv_batch_item *it = r->user;
    j->in_flight--;
    if (r->status) {
        error_line(j, it->line, it->custom_id, r->status, r->err.msg);
    } else {
        j->line = it->line, j->line_err = 0, j->line_ptoks = r->n_prompt, j->line_gtoks = r->n_out;
        write_line(j, hkv_batch_result_line(it, &j->meta));
        j->done++;
        j->prompt_toks += r->n_prompt;
        j->gen_toks += r->n_out;
        j->on_device += r->resident;
    }
    hkv_batch_item_free(it);
    free(it);
}

/* A request the scheduler dropped unfinished (the job stopped): its item is
 * freed; the rerun answers it. */
static void on_drop(void *ud, hkv_sched_req *r) {
    (void)ud;
    hkv_batch_item *it = r->user;
    hkv_batch_item_free(it);
    free(it);
}

static int blank(const char *s, ssize_t n);

/* The custom_ids met so far, by input line: a hash set (open addressing
 * over line numbers), so checking a job of N lines for repeats is O(N). */
typedef struct idset {
    char **of_line;       /* [n_lines + 1] */
    int64_t *slot;        /* line numbers, 0 = empty */
    size_t mask;
} idset;

static int idset_init(idset *t, int64_t n_lines) {
    size_t n = 16;
    while (n < 2 * (size_t)(n_lines + 1)) n *= 2;
    t->mask = n - 1;
    t->of_line = calloc((size_t)n_lines + 1, sizeof *t->of_line);
    t->slot = calloc(n, sizeof *t->slot);
    return t->of_line && t->slot ? HKV_OK : HKV_E_NOMEM;
}

static void idset_free(idset *t, int64_t n_lines) {
    for (int64_t k = 0; t->of_line && k <= n_lines; k++) free(t->of_line[k]);
    free(t->of_line);
    free(t->slot);
}

/* The earlier line holding id, else 0 after recording id (owned) for line. */
static int64_t idset_add(idset *t, char *id, int64_t line) {
    size_t i = (size_t)hkv_fnv1a_str(HKV_FNV1A_INIT_V0, id) & t->mask;
    for (; t->slot[i]; i = (i + 1) & t->mask)
        if (!strcmp(t->of_line[t->slot[i]], id)) {
            free(id);
            return t->slot[i];
        }
    t->slot[i] = line;
    t->of_line[line] = id;
    return 0;
}

/* Lines of the input (a last line without a newline counts) and, of them,
 * the requests (lines not blank). */
static int in_shard(const batch_opts *o, int64_t line) { return (line - 1) % o->shard_n == o->shard_i; }

static int count_lines(const batch_opts *o, const char *path, int64_t *n, int64_t *n_req,
                       hkv_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return hkv_seterr(err, HKV_E_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0;
    ssize_t r;
    *n = *n_req = 0;
    while ((r = getline(&buf, &cap, f)) > 0) {
        ++*n;
        *n_req += !blank(buf, r) && in_shard(o, *n);
    }
    free(buf);
    fclose(f);
    return HKV_OK;
}

static int blank(const char *s, ssize_t n) {
    for (ssize_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

/* Rank 0, --policy auto on a device: the rows the job's requests need, so
 * that the resident slots are sized for them (o->dev.job_rows). Under MPI
 * the other ranks do not read the input, so every rank keeps its slots as
 * given (a whole context by default) and the size the job needs is said. */
static int size_from_job(batch_opts *o, const hkv_mpi *mpi, int64_t n_lines, int64_t n_req,
                         const char *done, int64_t **rows, int64_t *n_rows, hkv_err *err) {
    hkv_model_config cfg;
    int rc = hkv_cli_model_config(o->model, NULL, &cfg, err);
    if (rc) return rc;
    const int64_t n_ctx = o->sc.ctx > 0 ? o->sc.ctx : cfg.ctx_train;   /* as hkv_engine_open */
    const hkv_batch_defaults d = {(int)o->max_tokens, n_ctx, !o->ignore_eos, 0};
    const hkv_batch_scan sc = {o->in, o->model, n_lines, n_req, done, o->shard_i, o->shard_n};
    if ((rc = hkv_batch_job_rows(&sc, &d, rows, n_rows, err)) || !*n_rows) return rc;
    if (!mpi->active) {
        o->dev.job_rows = *rows, o->dev.n_job_rows = *n_rows;
    } else if (!o->quiet) {
        hkv_engine_params ep;   /* the near tier's rows */
        hkv_engine_params_default(&ep);
        if ((rc = hkv_kv_cli_apply(&o->kv, &ep, err))) return rc;
        const int64_t far = (*rows)[*n_rows - 1] - ep.tiered.L_init - ep.tiered.L_local;
        fprintf(stderr, "hetkv batch: under MPI the resident slots keep a whole context each (the "
                "other ranks do not read the input); this job's longest request has %lld far "
                "rows: --gpu-resident-rows %lld sizes the slots for it\n",
                (long long)(far > 1 ? far : 1), (long long)(far > 1 ? far : 1));
    }
    return HKV_OK;
}

/* Read input lines into the scheduler until it holds enough work for the
 * next steps (the whole file is never in memory). */
/* Rank 0: the worker that asked for the most requests, -1 when none waits. */
static int wanting(const job *j) {
    int best = -1;
    if (!j->demand) return -1;
    for (int w = 1; w < j->mpi->size; w++)
        if (j->demand[w] > 0 && (best < 0 || j->demand[w] > j->demand[best])) best = w;
    return best;
}

/* Rank 0: the workers' messages that are waiting. */
static int service(job *j, hkv_err *err) {
    for (;;) {
        hkv_mpi_msg m;
        int r = hkv_mpi_poll(j->mpi, 0, &m, err);
        if (r <= 0) return r;
        switch (m.tag) {
        case HKV_MPI_WANT: j->demand[m.src] += m.hdr[0] > 0 ? m.hdr[0] : 0; break;
        case HKV_MPI_RESULT:
            j->in_flight--;
            j->errors += m.hdr[1] != 0;
            if (!m.hdr[1]) j->prompt_toks += m.hdr[2], j->gen_toks += m.hdr[3];
            j->done++;
            j->by_rank[m.src]++;
            if (m.text) write_line(j, m.text);   /* takes the text */
            m.text = NULL;
            break;
        case HKV_MPI_BYE:
            j->workers_left--;
            j->w_steps += m.hdr[0], j->w_rows += m.hdr[1];
            break;
        default:
            hkv_mpi_msg_free(&m);
            return hkv_seterr(err, HKV_E_INTERNAL, "MPI message %d from rank %d: unknown to rank 0",
                              m.tag, m.src);
        }
        hkv_mpi_msg_free(&m);
    }
}

static void nap(void) { nanosleep(&(struct timespec){0, 1000000}, NULL); }

/* A worker rank: ask rank 0 for requests while there is room, decode, send
 * the result lines back (write_line), say goodbye when rank 0 has no more. */
static int work(job *j, hkv_sched *s, const sigset_t *stop_set, int *stop_sig, hkv_err *err) {
    int64_t wanted = 0;
    int nomore = 0, rc = HKV_OK;
    while (!j->io_rc) {
        if ((*stop_sig = hkv_cli_signal_pending(stop_set))) return HKV_OK;
        /* its free slots and one more (a refill waits for rank 0's next step,
         * which can be a prefill chunk); no deeper queue: requests not yet
         * started belong with whichever rank frees a slot first */
        const int64_t room = j->o->sc.max_batch + 1 - hkv_sched_pending(s) - wanted;
        if (!nomore && !wanted && room > 0) {
            int64_t h[4] = {room, 0, 0, 0};
            if ((rc = hkv_mpi_send(j->mpi, 0, HKV_MPI_WANT, h, NULL, 0, err))) return rc;
            wanted = room;
        }
        hkv_mpi_msg m;
        int r;
        while ((r = hkv_mpi_poll(j->mpi, 0, &m, err)) > 0) {
            if (m.tag == HKV_MPI_NOMORE) {
                nomore = 1;
            } else if (m.tag == HKV_MPI_WORK && m.text) {
                wanted--;
                hkv_batch_item *it = calloc(1, sizeof *it);
                if (!it) {
                    hkv_mpi_msg_free(&m);
                    return hkv_seterr(err, HKV_E_NOMEM, "no memory for a request");
                }
                it->line = m.hdr[0];
                hkv_err perr;
                hkv_err_clear(&perr);
                int prc = hkv_batch_parse(m.text, m.len, j->e->tok, &j->dflt, it, &perr);
                if (!prc) prc = hkv_sched_submit(s, &it->req, &perr);
                if (prc) {
                    error_line(j, it->line, it->custom_id, prc, perr.msg);
                    hkv_batch_item_free(it);
                    free(it);
                } else {
                    j->in_flight++;
                }
            } else {
                hkv_mpi_msg_free(&m);
                return hkv_seterr(err, HKV_E_INTERNAL, "MPI message %d from rank %d: unknown to a "
                                  "worker", m.tag, m.src);
            }
            hkv_mpi_msg_free(&m);
        }
        if (r < 0) return r;
        if (hkv_sched_pending(s)) {
            if ((rc = hkv_sched_step(s, err))) return rc;
        } else if (nomore) {
            hkv_sched_stats st = {0};
            hkv_sched_get_stats(s, &st);
            int64_t h[4] = {st.steps, st.decode_rows, 0, 0};
            return hkv_mpi_send(j->mpi, 0, HKV_MPI_BYE, h, NULL, 0, err);
        } else {
            nap();
        }
    }
    *err = j->io_err;   /* a result line that could not be sent: its message */
    return j->io_rc;
}

static int feed(job *j, hkv_sched *s, FILE *in, int64_t *lineno, char *done, char **ids,
                idset *seen, int *eof, hkv_err *err) {
    char *buf = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = HKV_OK;
    /* One process keeps a queue of one batch behind the running one. Under
     * MPI rank 0 takes no more than its slots, so the rest is there for the
     * workers when they ask (the first ask comes after their model load). */
    const int64_t local = j->demand ? j->o->sc.max_batch : 2 * j->o->sc.max_batch;
    while (!*eof && (hkv_sched_pending(s) < local || wanting(j) > 0) && !j->io_rc) {
        if ((n = getline(&buf, &cap, in)) < 0) {
            *eof = 1;
            break;
        }
        int64_t ln = ++*lineno;
        if (blank(buf, n) || !in_shard(j->o, ln)) continue;
        hkv_batch_item *it = calloc(1, sizeof *it);
        if (!it) {
            rc = hkv_seterr(err, HKV_E_NOMEM, "no memory for a request");
            break;
        }
        it->line = ln;
        hkv_err perr;
        hkv_err_clear(&perr);
        int prc = hkv_batch_parse(buf, (size_t)n, j->e->tok, &j->dflt, it, &perr);
        if (done[ln]) {   /* answered by an earlier run: it must be the same request */
            const char *was = ids[ln];
            if ((was || it->custom_id) && (!was || !it->custom_id || strcmp(was, it->custom_id))) {
                rc = hkv_seterr(err, HKV_E_INVAL, "%s answers line %lld for custom_id '%s' but "
                                "the input has '%s' there: the output belongs to another input",
                                j->o->out, (long long)ln, was ? was : "(none)",
                                it->custom_id ? it->custom_id : "(none)");
            }
            if (it->custom_id) idset_add(seen, it->custom_id, ln), it->custom_id = NULL;
            hkv_batch_item_free(it);
            free(it);
            if (rc) break;
            continue;
        }
        if (!prc) {   /* custom_ids are unique within a job */
            char *id = strdup(it->custom_id);
            int64_t was = id ? idset_add(seen, id, ln) : -1;
            if (was < 0) prc = hkv_seterr(&perr, HKV_E_NOMEM, "no memory");
            else if (was) prc = hkv_seterr(&perr, HKV_E_INVAL, "custom_id '%s' repeats line %lld's",
                                           it->custom_id, (long long)was);
        }
        const int w = prc ? -1 : wanting(j);
        if (w > 0) {   /* a worker asked: the line goes there, its result comes back */
            int64_t h[4] = {ln, 0, 0, 0};
            rc = hkv_mpi_send(j->mpi, w, HKV_MPI_WORK, h, buf, (size_t)n, err);
            hkv_batch_item_free(it);
            free(it);
            if (rc) break;
            j->demand[w]--;
            j->in_flight++;
            continue;
        }
        if (!prc) prc = hkv_sched_submit(s, &it->req, &perr);
        if (prc) {
            error_line(j, ln, it->custom_id, prc, perr.msg);
            hkv_batch_item_free(it);
            free(it);
            continue;
        }
        j->in_flight++;
    }
    free(buf);
    return rc;
}

static void summary(job *j, hkv_sched *s, const char *how) {
    hkv_sched_stats st = {0};
    if (s) hkv_sched_get_stats(s, &st);
    st.steps += j->w_steps, st.decode_rows += j->w_rows;   /* every rank's */
    double el = hkv_now() - j->t0;
    if (!j->o->quiet) {
        fprintf(stderr, "hetkv batch: %s: %lld requests answered this run (%lld errors), %lld "
                "earlier, %lld of %lld left; %.1f s, %.2f requests/s, prompt %lld tokens (%.1f "
                "tok/s), generated %lld tokens (%.1f tok/s), %lld decode steps of %.1f sequences\n",
                how, (long long)j->done, (long long)j->errors,
                (long long)j->skipped, (long long)(j->total - j->skipped - j->done),
                (long long)j->total, el, el > 0 ? j->done / el : 0, (long long)j->prompt_toks,
                el > 0 ? j->prompt_toks / el : 0, (long long)j->gen_toks,
                el > 0 ? j->gen_toks / el : 0, (long long)st.steps,
                st.steps ? (double)st.decode_rows / st.steps : 0);
        if (j->o->sc.prefix_cache) {
            char saved[32];
            hkv_fmt_bytes((double)st.prefix_saved_bytes, saved, sizeof saved);
            fprintf(stderr, "hetkv batch: prefix cache: %lld requests started from a kept prefix, "
                    "%lld prompt tokens not prefilled; %lld prefixes kept, %lld replaced; %s of KV "
                    "shared rather than copied; %lld took the kept index\n",
                    (long long)st.prefix_hits, (long long)st.prefix_tokens,
                    (long long)st.prefix_stored, (long long)st.prefix_evicted, saved,
                    (long long)st.prefix_index_hits);
        }
    }
    if (j->o->json) {   /* through jansson: the policy text comes from the command line */
        json_t *o = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:I, s:I, s:f, s:f, s:I, "
                              "s:f, s:f, s:f, s:I, s:s, s:i}",
                              "status", how, "requests", (json_int_t)j->total,
                              "answered", (json_int_t)j->done, "errors", (json_int_t)j->errors,
                              "earlier", (json_int_t)j->skipped,
                              "left", (json_int_t)(j->total - j->skipped - j->done), "wall_s", el,
                              "requests_per_s", el > 0 ? j->done / el : 0.0,
                              "prompt_tokens", (json_int_t)j->prompt_toks,
                              "generated_tokens", (json_int_t)j->gen_toks,
                              "prompt_tok_s", el > 0 ? j->prompt_toks / el : 0.0,
                              "generated_tok_s", el > 0 ? j->gen_toks / el : 0.0,
                              "decode_steps", (json_int_t)st.steps,
                              "mean_decode_batch", st.steps ? (double)st.decode_rows / st.steps : 0.0,
                              "prefill_s", st.t_prefill, "decode_s", st.t_decode,
                              "max_batch", (json_int_t)j->o->sc.max_batch, "policy", j->policy,
                              "ranks", j->mpi ? j->mpi->size : 1);
        if (o && j->by_rank) {   /* the answers of each rank: rank 0's own are the rest */
            json_t *a = json_array();
            int64_t others = 0;
            for (int r = 1; r < j->mpi->size; r++) others += j->by_rank[r];
            json_array_append_new(a, json_integer(j->done - others));
            for (int r = 1; r < j->mpi->size; r++) json_array_append_new(a, json_integer(j->by_rank[r]));
            json_object_set_new(o, "answered_by_rank", a);
        }
        if (o)   /* what the KV took at most: a shared prefix is held once */
            json_object_set_new(o, "kv_peak_bytes",
                                json_pack("{s:I, s:I, s:I}", "near",
                                          (json_int_t)j->e->mem.peak[HKV_TIER_NEAR], "far",
                                          (json_int_t)j->e->mem.peak[HKV_TIER_FAR], "index",
                                          (json_int_t)j->e->mem.peak[HKV_TIER_INDEX]));
        if (o && j->o->dev.cuda) {   /* the pipeline's timeline, device memory */
            int bad = 0;
            hkv_device_cli_json(o, j->e, &bad);
        }
        if (o && j->meta.placed)   /* per-sequence placement (auto on a device) */
            json_object_set_new(o, "placement",
                                json_pack("{s:i, s:I, s:I, s:I}", "resident_max", j->o->dev.resident,
                                          "device", (json_int_t)j->on_device, "split",
                                          (json_int_t)(j->done - j->on_device), "waited",
                                          (json_int_t)st.resident_waits));
        if (o && j->o->sc.prefix_cache)
            json_object_set_new(o, "prefix_cache",
                                json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I}", "hits",
                                          (json_int_t)st.prefix_hits, "reused_tokens",
                                          (json_int_t)st.prefix_tokens, "stored",
                                          (json_int_t)st.prefix_stored, "evicted",
                                          (json_int_t)st.prefix_evicted, "bytes",
                                          (json_int_t)st.prefix_bytes, "saved_bytes",
                                          (json_int_t)st.prefix_saved_bytes, "fork_s",
                                          st.t_prefix_fork, "index_builds",
                                          (json_int_t)st.prefix_index_builds, "index_hits",
                                          (json_int_t)st.prefix_index_hits));
        char *txt = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
        if (txt) puts(txt);
        free(txt);
        json_decref(o);
    }
}

static void policy_text(const batch_opts *o, char *buf, size_t cap) {
    snprintf(buf, cap, "%s", o->kv.kv && !strcmp(o->kv.kv, "plain") ? "plain" :
             o->kv.policy ? o->kv.policy : "full");
    for (int i = 0; i < o->kv.n_pargs; i++) {
        size_t l = strlen(buf);
        snprintf(buf + l, cap - l, " %s", o->kv.pargs[i]);
    }
}

int hkv_cmd_batch(int argc, char **argv) {
    hkv_err err;
    hkv_err_clear(&err);
    batch_opts o;
    int rc = parse(argc, argv, &o, &err);
    if (rc == 1) {
        hkv_opt_use uses[8];
        hkv_opts_help(stdout, batch_usage, uses, batch_uses(&o, uses));
        return 0;
    }
    if (rc) {
        hkv_err_report(&err, stderr);
        return 2;
    }
    hkv_mpi mpi;
    if ((rc = hkv_mpi_start(&mpi, !o.no_mpi, &err))) {
        hkv_err_report(&err, stderr);
        return 1;
    }
    job j = {.o = &o, .fd = -1, .mpi = &mpi};
    const int is_worker = worker(&j);
    if (is_worker) o.quiet = 1, o.json = 0;   /* rank 0 speaks for the job */
    hkv_sched *s = NULL;
    FILE *in = NULL;
    char *done = NULL, **ids = NULL;
    idset seen = {0};
    int64_t n_lines = 0, n_req = 0, lineno = 0, *job_rows = NULL, n_job_rows = 0;
    int interrupted = 0, stop_sig = 0;
    sigset_t stop_set;   /* blocked from here on, in this thread and every one it starts */
    hkv_cli_block_stop_signals(&stop_set);
    if (is_worker) goto engine;   /* the files are rank 0's */
    if (mpi.active) {
        if (!(j.demand = calloc((size_t)mpi.size, sizeof *j.demand)) ||
            !(j.by_rank = calloc((size_t)mpi.size, sizeof *j.by_rank))) {
            rc = hkv_seterr(&err, HKV_E_NOMEM, "no memory for %d ranks", mpi.size);
            goto out;
        }
        j.workers_left = mpi.size - 1;
    }
    if ((rc = count_lines(&o, o.in, &n_lines, &n_req, &err))) goto out;
    done = calloc((size_t)n_lines + 1, 1);
    ids = calloc((size_t)n_lines + 1, sizeof *ids);
    if (!done || !ids || idset_init(&seen, n_lines)) {
        rc = hkv_seterr(&err, HKV_E_NOMEM, "no memory for %lld lines", (long long)n_lines);
        goto out;
    }
    int torn = 0;
    if ((rc = hkv_batch_scan_output(o.out, n_lines, done, ids, &j.skipped, &torn, &err))) goto out;
    if (torn && !o.quiet) fprintf(stderr, "hetkv batch: %s: cut a torn last line\n", o.out);
    if (!(in = fopen(o.in, "rb"))) {
        rc = hkv_seterr(&err, HKV_E_IO, "%s: %s", o.in, strerror(errno));
        goto out;
    }
    if ((j.fd = open(o.out, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) < 0) {
        rc = hkv_seterr(&err, HKV_E_IO, "%s: %s", o.out, strerror(errno));
        goto out;
    }
    if (o.dev.cuda && hkv_kv_cli_auto(&o.kv) && o.dev.resident < 0 && !o.dev.resident_rows &&
        !o.dev.resident_prefixes && (rc = size_from_job(&o, &mpi, n_lines, n_req, done, &job_rows,
                                                        &n_job_rows, &err)))
        goto out;

engine:;
    hkv_engine_params ep;
    if ((rc = hkv_sched_cli_engine_params(&ep, o.model, &o.x, &o.sc, &o.kv, &o.dev, &err))) goto out;
    const int placed = hkv_kv_cli_auto(&o.kv) && o.dev.resident > 0;
    if (hkv_kv_cli_auto(&o.kv)) o.kv.policy = ep.tiered.policy->name;   /* what auto picked */
    if ((rc = hkv_engine_open(&j.e, &ep, &err)) || (rc = hkv_device_cli_attach(&o.dev, j.e, &err)))
        goto out;
    policy_text(&o, j.policy, sizeof j.policy);
    j.meta = (hkv_batch_meta){j.e->model.cfg.name, j.policy, placed};
    j.dflt = (hkv_batch_defaults){(int)o.max_tokens, j.e->p.n_ctx, !o.ignore_eos, 0};

    hkv_sched_params sp;
    hkv_sched_params_default(&sp);
    sp.max_batch = (int)o.sc.max_batch;
    sp.prefix_slots = (int)o.sc.prefix_cache;
    sp.chunk = o.sc.chunk;
    sp.resident = placed ? o.dev.resident : 0;   /* per-sequence placement (auto) */
    sp.resident_rows = placed ? hkv_device_cli_slot_rows(&o.dev) : 0;
    sp.resident_wait = placed && !o.dev.split_overflow;
    sp.batch_invariant = !o.no_invariant;
    if (o.sc.mem) {
        sp.mem_budget = o.sc.mem;
    } else {   /* what is free now that the weights are in, less a margin */
        size_t fr = hkv_host_mem_free();
        sp.mem_budget = fr ? (uint64_t)(fr - fr / 10) : 0;
    }
    sp.on_done = on_done;
    sp.on_drop = on_drop;
    sp.ud = &j;
    if ((rc = hkv_sched_create(&s, j.e, &sp, &err))) goto out;


    j.total = n_req;
    j.tty = isatty(2);
    j.t0 = j.last_progress = hkv_now();
    int eof = 0, nomore_sent = 0;
    if (is_worker) {
        rc = work(&j, s, &stop_set, &stop_sig, &err);
        interrupted = stop_sig != 0;
    }
    for (; !is_worker;) {
        if (mpi.active && (rc = service(&j, &err))) break;
        if ((rc = feed(&j, s, in, &lineno, done, ids, &seen, &eof, &err))) break;
        for (int w = 1; mpi.active && eof && !nomore_sent && !rc && w < mpi.size; w++)
            rc = hkv_mpi_send(&mpi, w, HKV_MPI_NOMORE, NULL, NULL, 0, &err);
        if (rc) break;
        nomore_sent |= eof;
        if (j.io_rc) break;
        if ((stop_sig = hkv_cli_signal_pending(&stop_set))) {
            interrupted = 1;
            break;
        }
        if (!hkv_sched_pending(s)) {
            if (eof && !j.workers_left) break;
            if (eof) nap();   /* the workers' last results */
            continue;
        }
        if ((rc = hkv_sched_step(s, &err))) break;
        progress(&j, 0);
    }
    progress(&j, 1);
    if (!rc && j.io_rc) {
        rc = j.io_rc;
        err = j.io_err;
    }
    if (!is_worker)
        summary(&j, s, interrupted ? "interrupted" : rc ? "stopped by an error" : "finished");
    if (interrupted && !o.quiet)
        fprintf(stderr, "hetkv batch: stopped by signal %d; run the same command again to finish\n",
                stop_sig);
out:
    if (rc && mpi.active) hkv_err_prefix(&err, "rank %d of %d", mpi.rank, mpi.size);
    if (rc) hkv_err_report(&err, stderr);
    hkv_sched_free(s);   /* requests still in flight are dropped: the rerun answers them */
    if (j.fd >= 0) close(j.fd);
    if (in) fclose(in);
    for (int64_t k = 0; ids && k <= n_lines; k++) free(ids[k]);
    idset_free(&seen, n_lines);
    free(ids);
    free(done);
    free(job_rows);
    free(j.demand);
    free(j.by_rank);
    hkv_engine_close(j.e);
    /* A failed or interrupted rank ends every rank (what is written stays;
     * the rerun finishes the job); a finished one waits for the others. */
    const int code = rc ? 1 : interrupted ? 128 + stop_sig : 0;
    hkv_mpi_stop(&mpi, code);
    return code;
}
