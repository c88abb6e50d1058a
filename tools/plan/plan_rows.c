/* hetkv plan -o md|csv|jsonl: the --json object's rows, flattened, as the
 * rows of bench and eval (cli_rows.c writes them). Plan prints its JSON in
 * one place per mode (the plan, the prediction, the kernel steps); rather
 * than a second printer per mode, the command runs once more with --json
 * into a temporary file, and each element of its "rows" becomes a row: the
 * object's scalar fields first (model, device, sink, ...), then the row's,
 * nested objects flattened with their key as a prefix ("built_tok_s"), and
 * the build's commit and the date; keys missing from a row are null. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_rows.h"
#include "cli.h"

/* o's scalars and flattened objects into row, prefix + key; arrays are skipped. */
static void flatten(json_t *row, const char *prefix, json_t *o)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        char key[160];
        snprintf(key, sizeof key, "%.80s%.79s", prefix, k);
        if (json_is_object(v)) {
            char p2[168];
            snprintf(p2, sizeof p2, "%s_", key);
            flatten(row, p2, v);
        } else if (!json_is_array(v)) {
            json_object_set(row, key, v);
        }
    }
}

int hkv_plan_rows(int argc, char **argv, int fmt)
{
    hkv_err err;
    hkv_err_clear(&err);
    char **av = malloc((size_t)(argc + 1) * sizeof *av);
    int ac = 0, rc = 0;
    if (!av) return hkv_seterr(&err, HKV_E_NOMEM, "no memory"), hkv_err_report(&err, stderr), 1;
    for (int i = 0; i < argc; i++) {   /* -o F becomes --json */
        if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output-format")) {
            i++;
            av[ac++] = "--json";
        } else {
            av[ac++] = argv[i];
        }
    }
    av[ac] = NULL;
    FILE *tmp = tmpfile();
    int saved = -1;
    fflush(stdout);
    if (!tmp || (saved = dup(STDOUT_FILENO)) < 0 || dup2(fileno(tmp), STDOUT_FILENO) < 0) {
        if (tmp) fclose(tmp);
        if (saved >= 0) close(saved);
        free(av);
        hkv_seterr(&err, HKV_E_IO, "plan -o: no temporary file for the JSON");
        hkv_err_report(&err, stderr);
        return 1;
    }
    rc = hkv_cmd_plan(ac, av);   /* its errors go to stderr, its exit status is ours */
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    free(av);
    rewind(tmp);
    json_error_t je;
    json_t *doc = json_loadf(tmp, JSON_DISABLE_EOF_CHECK, &je);
    fclose(tmp);
    json_t *src = json_object_get(doc, "rows"), *rows = json_array();
    if (!doc || !json_is_array(src) || !rows) {
        json_decref(doc);
        json_decref(rows);
        if (rc) return rc;   /* the plan's own error, already reported */
        hkv_seterr(&err, HKV_E_INTERNAL, "plan -o: no rows in the plan's JSON (%s)", je.text);
        hkv_err_report(&err, stderr);
        return 1;
    }
    char date[32];
    hkv_rows_date(date, sizeof date);
    json_t *keys = json_object();   /* every key, first-seen order */
    size_t i;
    json_t *r;
    json_array_foreach(src, i, r) {
        json_t *row = json_object();
        flatten(row, "", doc);   /* the object's scalars (its rows array is skipped) */
        flatten(row, "", r);
        json_object_set_new(row, "commit", json_string(hkv_build_commit()));
        json_object_set_new(row, "date", json_string(date));
        const char *k;
        json_t *v;
        json_object_foreach(row, k, v) json_object_set(keys, k, json_null());
        json_array_append_new(rows, row);
    }
    json_t *out = json_array();
    json_array_foreach(rows, i, r) {   /* the same keys in the same order in every row */
        json_t *row = json_object();
        const char *k;
        json_t *v;
        json_object_foreach(keys, k, v) {
            json_t *x = json_object_get(r, k);
            json_object_set(row, k, x ? x : json_null());
        }
        json_array_append_new(out, row);
    }
    if (hkv_rows_write(stdout, fmt, out, &err)) hkv_err_report(&err, stderr), rc = rc ? rc : 1;
    json_decref(out);
    json_decref(rows);
    json_decref(keys);
    json_decref(doc);
    return rc;
}
