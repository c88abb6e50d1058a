/* What a batch job's requests need, read before the engine starts: the rows
 * (prompt + answer + 1) each one takes, so that per-sequence placement
 * (--policy auto with --device cuda) can size the device's resident slots
 * for this job rather than for a whole context (tools/cli/cli_device.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"

static int cmp_i64(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int hkv_batch_job_rows(const hkv_batch_scan *sc, const hkv_batch_defaults *d, int64_t **rows,
                       int64_t *n_rows, hkv_err *err) {
    *rows = NULL;
    *n_rows = 0;
    hkv_tokenizer *tok = NULL;
    int rc = hkv_tokenizer_load_file(&tok, sc->model, err);
    if (rc) return hkv_err_prefix(err, "sizing the job's resident slots");
    FILE *f = fopen(sc->in, "rb");
    int64_t *out = malloc((size_t)(sc->n_req > 0 ? sc->n_req : 1) * sizeof *out);
    if (!f || !out) {
        rc = f ? hkv_seterr(err, HKV_E_NOMEM, "no memory for %lld requests' rows", (long long)sc->n_req)
               : hkv_seterr(err, HKV_E_IO, "%s: cannot be read again", sc->in);
        goto out;
    }
    char *buf = NULL;
    size_t cap = 0;
    ssize_t len;
    int64_t line = 0, n = 0;
    while ((len = getline(&buf, &cap, f)) > 0) {
        ++line;
        if ((line - 1) % sc->shard_n != sc->shard_i || (sc->done && line <= sc->n_lines && sc->done[line]))
            continue;
        hkv_batch_item it;
        memset(&it, 0, sizeof it);
        it.line = line;
        hkv_err perr;
        hkv_err_clear(&perr);
        /* a line that does not parse is answered with its error at its turn */
        if (!hkv_batch_parse(buf, (size_t)len, tok, d, &it, &perr) && n < sc->n_req)
            out[n++] = it.req.n_prompt + it.req.n_predict + 1;
        hkv_batch_item_free(&it);
    }
    free(buf);
    qsort(out, (size_t)n, sizeof *out, cmp_i64);
    *rows = out, *n_rows = n;
    out = NULL;
out:
    if (f) fclose(f);
    free(out);
    hkv_tokenizer_free(tok);
    return rc;
}
