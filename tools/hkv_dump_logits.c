/* hkv-dump-logits: write the logits of every position of a token sequence,
 * for checking the engine against the independent reference
 * (tests/model/test_logits.py).
 *
 *   prefill: all tokens through forward calls of up to max_rows rows
 *   decode:  one token per forward call
 *   batch:   three sequences advance together in batched steps, at different
 *            lengths: seq 0 decodes from the first token, seq 1 is prefilled
 *            with the first third, seq 2 with the first half, then all decode.
 *            Row p of the output comes from sequence p % 3, so a batching
 *            bug shows up as a mismatch against the other modes.
 *   prompt:  the first --prefix K tokens through hkv_prefill (so a policy's
 *            own prefill applies, e.g. fastkv's token-selective propagation),
 *            then one token per step; rows before K-1 are NaN. --turn2 S,E
 *            feeds positions [S, E) as a second prompt (a later turn; rows
 *            S..E-2 NaN) and decodes the rest. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "generate.h"

static const char usage[] =
    "usage: hkv-dump-logits -m MODEL --tokens 1,2,3 [--mode prefill|decode|batch|prompt] -o OUT.bin\n"
    "                       [options]\n"
    "\n"
    "Writes little-endian float32 logits [n_tokens][vocab]; with --device cuda, the pipeline's\n"
    "timeline as a JSON line on stdout.\n"
    "\n";

#define MAXTOK 65536

typedef struct dl_opts {
    const char *model, *out, *mode, *tokens;
    long long rows, prefix, turn2[2];
    int n_turn2;
    hkv_exec_cli x;
    hkv_kv_cli kv;
    hkv_device_cli dev;
} dl_opts;

/* --turn2 S,E: exactly two positions, S < E. */
static int parse_turn2(void *base, const char *opt, const char *v, hkv_err *err) {
    dl_opts *o = base;
    o->n_turn2 = 2;
    int rc = hkv_arg_int_list(opt, v, 1, MAXTOK, o->turn2, &o->n_turn2, err);
    if (!rc && (o->n_turn2 != 2 || o->turn2[1] <= o->turn2[0]))
        rc = hkv_seterr(err, HKV_E_INVAL, "--turn2 S,E: two positions, S < E");
    return rc;
}

/* The program's own options; the model, threads/ISA, KV and device groups
 * follow them in dl_uses(). */
static const hkv_opt dl_opts_table[] = {
    {.name = "--tokens", .arg = "LIST", .kind = HKV_OPT_STR, .off = offsetof(dl_opts, tokens),
     .help = "the token ids, comma-separated"},
    {.name = "--out", .short_name = 'o', .arg = "OUT.bin", .kind = HKV_OPT_STR,
     .off = offsetof(dl_opts, out), .help = "where the logits go"},
    {.name = "--mode", .arg = "MODE", .kind = HKV_OPT_STR, .off = offsetof(dl_opts, mode),
     .help = "prefill (default), decode, batch or prompt (see the source's header)"},
    {.name = "--prefix", .arg = "K", .kind = HKV_OPT_INT, .off = offsetof(dl_opts, prefix),
     .lo = 1, .hi = MAXTOK, .help = "prompt mode: the first K tokens through hkv_prefill"},
    {.name = "--turn2", .arg = "S,E", .kind = HKV_OPT_FN, .fn = parse_turn2,
     .help = "prompt mode: positions S..E-1 as a second prompt"},
    {.name = "--rows", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(dl_opts, rows),
     .lo = 1, .hi = 65536, .help = "rows per forward call at most (default: the engine's)"},
    {0},
};

static int dl_uses(dl_opts *o, hkv_opt_use *u) {
    int n = 0;
    u[n++] = (hkv_opt_use){.opts = hkv_model_opts, .base = &o->model};
    u[n++] = (hkv_opt_use){.opts = dl_opts_table, .base = o};
    u[n++] = (hkv_opt_use){.opts = hkv_exec_opts, .base = &o->x};
    u[n++] = (hkv_opt_use){.opts = hkv_kv_opts, .base = &o->kv, .title = "KV cache"};
    u[n++] = (hkv_opt_use){.opts = hkv_device_opts, .base = &o->dev, .title = "Device"};
    return n;
}

int main(int argc, char **argv) {
    hkv_err err;
    hkv_err_clear(&err);
    dl_opts o;
    memset(&o, 0, sizeof o);
    o.mode = "prefill";
    o.turn2[0] = o.turn2[1] = -1;
    hkv_exec_cli_init(&o.x);
    hkv_kv_cli_init(&o.kv);
    hkv_device_cli_init(&o.dev);
    hkv_opt_use uses[8];
    const int n_uses = dl_uses(&o, uses);
    int rc = hkv_opts_parse_prog("hkv-dump-logits", NULL, uses, n_uses, argc, argv, &err);
    if (rc == 1) {
        hkv_opts_help(stdout, usage, uses, n_uses);
        return 0;
    }
    const char *model = o.model, *out_path = o.out, *mode = o.mode, *toks_s = o.tokens;
    const long long prefix = o.prefix, *turn2 = o.turn2;
    const int n_turn2 = o.n_turn2;
    if (!rc && ((!model && !o.dev.synthetic) || !out_path || !toks_s))
        rc = hkv_seterr(&err, HKV_E_INVAL, "need -m MODEL (or --synthetic NAME), --tokens LIST and -o OUT");
    int is_batch = !strcmp(mode, "batch"), is_decode = !strcmp(mode, "decode");
    int is_prompt = !strcmp(mode, "prompt");
    if (!rc && !is_batch && !is_decode && !is_prompt && strcmp(mode, "prefill"))
        rc = hkv_seterr(&err, HKV_E_INVAL, "unknown mode '%s'", mode);
    if (rc) {
        hkv_err_report(&err, stderr);
        return 2;
    }
    long long *ll = malloc(MAXTOK * sizeof *ll);
    int n = MAXTOK;
    int32_t *toks = NULL;
    float *logits = NULL, *outl = NULL;
    hkv_engine *e = NULL;
    if (!ll) return 1;
    if ((rc = hkv_arg_int_list("--tokens", toks_s, 0, 1 << 30, ll, &n, &err))) goto out;
    toks = malloc((size_t)n * sizeof *toks);
    for (int i = 0; i < n; i++) toks[i] = (int32_t)ll[i];

    hkv_engine_params ep;
    hkv_engine_params_default(&ep);
    if ((rc = hkv_device_cli_apply(&o.dev, model, &ep, &err))) goto out;
    ep.n_threads = (int)o.x.threads;
    ep.isa = o.x.isa;
    ep.max_seqs = 3;
    ep.n_ctx = n + 1;
    ep.max_rows = (int)o.rows;
    if ((rc = hkv_kv_cli_apply(&o.kv, &ep, &err))) goto out;
    ep.device_cuda = o.dev.cuda;
    if ((rc = hkv_device_cli_check(&o.dev, model, &ep, 3, ep.n_ctx, &err)) ||
        (rc = hkv_engine_open(&e, &ep, &err)) || (rc = hkv_device_cli_attach(&o.dev, e, &err)))
        goto out;
    const int V = e->model.cfg.vocab;
    logits = malloc((size_t)3 * n * V * sizeof(float));   /* [seq][pos][V] */
    outl = malloc((size_t)n * V * sizeof(float));
    int64_t *lr = malloc((size_t)e->max_rows * sizeof *lr);
    if (!logits || !outl || !lr) {
        free(lr);
        rc = hkv_seterr(&err, HKV_E_NOMEM, "no memory for logits");
        goto out;
    }
    for (int i = 0; i < e->max_rows; i++) lr[i] = i;
    const hkv_kv_ops *ops = e->kv.ops;
    int nseq = is_batch ? 3 : 1;
    for (int s = 0; s < nseq; s++)
        if ((rc = ops->seq_open(e->kv.self, s, n + 1, &err))) goto out_lr;

    /* pre[s]: tokens of seq s that go through prefill. */
    int pre[3] = {n, 0, 0};
    if (is_decode) pre[0] = 0;
    if (is_batch) {
        pre[0] = 0;
        pre[1] = n / 3;
        pre[2] = n / 2;
    }
    if (is_prompt) {
        if (prefix < 1 || prefix > n) {
            rc = hkv_seterr(&err, HKV_E_RANGE, "--prefix %lld: need 1..%d (the token count)", prefix, n);
            goto out_lr;
        }
        pre[0] = 0;   /* the loop below does nothing; decode starts after the prefix */
        for (size_t i = 0; i < (size_t)n * V; i++) logits[i] = NAN;
        if ((rc = hkv_prefill(e, 0, toks, prefix, 0, logits + (size_t)(prefix - 1) * V, &err)))
            goto out_lr;
    }
    int pos[3] = {is_prompt ? (int)prefix : pre[0], pre[1], pre[2]};
    for (int s = 0; s < nseq; s++)
        for (int done = 0; done < pre[s];) {
            int chunk = pre[s] - done < e->max_rows ? pre[s] - done : e->max_rows;
            hkv_seg sg = {.seq = s, .n = chunk, .pos = done, .row = 0,
                          .flags = HKV_SEG_PROMPT | (done + chunk == pre[s] ? HKV_SEG_PROMPT_END : 0)};
            if ((rc = hkv_forward(e, toks + done, chunk, &sg, 1, lr, chunk,
                                  logits + ((size_t)s * n + done) * V, &err)))
                goto out_lr;
            done += chunk;
        }
    /* Batched decode: every sequence with tokens left advances one position. */
    for (;;) {
        if (is_prompt && n_turn2 == 2 && pos[0] == turn2[0] && turn2[1] <= n) {
            if ((rc = hkv_prefill(e, 0, toks + turn2[0], turn2[1] - turn2[0], turn2[0],
                                  logits + (size_t)(turn2[1] - 1) * V, &err)))
                goto out_lr;
            pos[0] = (int)turn2[1];
        }
        int32_t bt[3];
        hkv_seg sg[3];
        int who[3], nb = 0;
        for (int s = 0; s < nseq; s++)
            if (pos[s] < n) {
                bt[nb] = toks[pos[s]];
                sg[nb] = (hkv_seg){.seq = s, .n = 1, .pos = pos[s], .row = nb};
                who[nb++] = s;
            }
        if (!nb) break;
        float *tmp = outl;   /* scratch: nb rows */
        if ((rc = hkv_forward(e, bt, nb, sg, nb, lr, nb, tmp, &err))) goto out_lr;
        for (int b = 0; b < nb; b++) {
            int s = who[b];
            memcpy(logits + ((size_t)s * n + pos[s]) * V, tmp + (size_t)b * V, (size_t)V * sizeof(float));
            pos[s]++;
        }
    }
    for (int p = 0; p < n; p++)
        memcpy(outl + (size_t)p * V, logits + ((size_t)(p % nseq) * n + p) * V, (size_t)V * sizeof(float));
    FILE *f = fopen(out_path, "wb");
    if (!f || fwrite(outl, sizeof(float), (size_t)n * V, f) != (size_t)n * V) {
        rc = hkv_seterr(&err, HKV_E_IO, "cannot write '%s'", out_path);
        if (f) fclose(f);
        goto out_lr;
    }
    if (fclose(f)) rc = hkv_seterr(&err, HKV_E_IO, "cannot write '%s'", out_path);
    if (!rc && o.dev.cuda) {   /* the pipeline's timeline, a JSON line on stdout (tests read it) */
        json_t *o = json_object();
        int bad = 0;
        hkv_device_cli_json(o, e, &bad);
        /* the layers, so that a test can expect its fallbacks per (row, layer) */
        hkv_jset(o, "n_layer", json_integer(e->model.cfg.n_layer), &bad);
        char *js = bad ? NULL : json_dumps(o, JSON_COMPACT);
        if (js) printf("%s\n", js);
        else rc = hkv_seterr(&err, HKV_E_NOMEM, "no memory for the timeline's JSON");
        free(js);
        json_decref(o);
    }
out_lr:
    free(lr);
out:
    if (rc) hkv_err_report(&err, stderr);
    free(ll);
    free(toks);
    free(logits);
    free(outl);
    hkv_engine_close(e);
    return rc ? 1 : 0;
}
