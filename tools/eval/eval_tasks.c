/* Long-context retrieval tasks for hetkv eval, on the corpus text.
 *
 *   passkey      one pass key (5 digits) at a depth, stated twice as in the
 *                passkey-retrieval setup ("The pass key is: N. Remember it.
 *                N is the pass key.")
 *   needle       one "special magic number" (7 digits) for a city at a depth
 *   multineedle  four city needles spread over the haystack; one is asked
 *                (trial t asks needle t mod 4, so the asked depth moves)
 *   multiturn    four city needles; three questions in turn over the same
 *                context: turn 1 is prefilled with the haystack, each later
 *                question is appended as a new prompt segment after the
 *                previous answer (the conversation as the chat template
 *                renders it), so a policy's index must serve prompts it was
 *                not built for: what ctkvr's dynamic centroid update is for.
 *
 * Trials differ in haystack text (a different stretch of the corpus), needle
 * values and depths, all drawn from --seed. The prompt goes through the
 * model's chat template; the assistant turn starts with an answer prefix
 * ("The pass key mentioned in the provided text is:"), as in RULER, so the
 * answer is the number itself. The colon forms matter on a 135M model:
 * without them SmolLM2-135M under full attention answered 2 of 4 pass keys
 * at 1K with prose about keys; with them 4 of 4. Greedy decoding, at most
 * --answer-tokens tokens, stop at end of generation; an answer is correct
 * when its text contains the value. Each trial's prompt is prefilled once (sequence 0, dense) and forked
 * per configuration with the audit off, so decode times are clean. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"

const char *const eval_task_names[EVAL_N_TASKS] = {"passkey", "needle", "multineedle", "multiturn"};

static const char *const cities[] = {
    "Lisbon", "Nairobi", "Oslo", "Lima", "Hanoi", "Cairo", "Dublin", "Quito",
    "Tbilisi", "Osaka", "Montreal", "Seville", "Krakow", "Bergen", "Perth", "Mumbai",
    "Santiago", "Helsinki", "Accra", "Denver", "Vienna", "Manila", "Geneva", "Tunis",
};
#define N_CITIES ((int)(sizeof cities / sizeof cities[0]))

/* Marks where the haystack goes in the rendered template; control bytes
 * cannot occur in the template or the questions. */
#define HAY "\x01HAYSTACK\x01"
#define MAX_PROMPT_PIECE 4096

typedef struct rng { uint64_t s; } rng;

static uint64_t rng_next(rng *r) {   /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static int64_t rng_range(rng *r, int64_t lo, int64_t hi) {   /* [lo, hi] */
    return lo + (int64_t)(rng_next(r) % (uint64_t)(hi - lo + 1));
}

/* ---- what a trial asks --------------------------------------------------- */

static void make_trial(int task, int t, int T, uint64_t seed, int64_t ctx, eval_trial *tr) {
    memset(tr, 0, sizeof *tr);
    rng r = {seed ^ ((uint64_t)task << 48) ^ ((uint64_t)t << 32) ^ (uint64_t)ctx};
    double depth = T > 1 ? 0.1 + 0.8 * t / (T - 1) : 0.5;
    tr->n_turns = 1;
    if (task == EVAL_PASSKEY) {
        tr->n_needles = 1;
        snprintf(tr->key[0], sizeof tr->key[0], "pass key");
        snprintf(tr->value[0], sizeof tr->value[0], "%lld", (long long)rng_range(&r, 10000, 99999));
        tr->depth[0] = depth;
        return;
    }
    tr->n_needles = task == EVAL_NEEDLE ? 1 : 4;
    int first = (int)rng_range(&r, 0, N_CITIES - 1);
    for (int j = 0; j < tr->n_needles; j++) {
        /* distinct cities: consecutive entries from a random start */
        snprintf(tr->key[j], sizeof tr->key[j], "%s", cities[(first + 5 * j) % N_CITIES]);
        snprintf(tr->value[j], sizeof tr->value[j], "%lld", (long long)rng_range(&r, 1000000, 9999999));
        tr->depth[j] = tr->n_needles == 1 ? depth
                                          : (j + 0.5) / tr->n_needles + (rng_range(&r, -80, 80) / 1000.0);
    }
    if (task == EVAL_MULTINEEDLE) tr->ask[0] = t % tr->n_needles;
    if (task == EVAL_MULTITURN) {
        tr->n_turns = EVAL_MAX_TURNS;
        for (int j = 0; j < tr->n_turns; j++) tr->ask[j] = (t + 3 * j + 1) % tr->n_needles;
    }
}

static void texts(int task, const eval_trial *tr, int turn, char *question, char *prefix, size_t cap) {
    if (task == EVAL_PASSKEY) {
        snprintf(question, cap, "What is the pass key mentioned in the provided text?");
        snprintf(prefix, cap, "The pass key mentioned in the provided text is:");
        return;
    }
    const char *k = tr->key[tr->ask[turn]];
    snprintf(question, cap, "What is the special magic number for %s mentioned in the provided text?", k);
    snprintf(prefix, cap, "The special magic number for %s mentioned in the provided text is", k);
}

static void needle_text(int task, const eval_trial *tr, int j, char *buf, size_t cap) {
    if (task == EVAL_PASSKEY)
        snprintf(buf, cap, " The pass key is: %s. Remember it. %s is the pass key.", tr->value[j], tr->value[j]);
    else
        snprintf(buf, cap, " One of the special magic numbers for %s is: %s.", tr->key[j], tr->value[j]);
}

static const char *intro(int task) {
    return task == EVAL_PASSKEY
               ? "There is an important piece of information hidden inside a lot of irrelevant text. "
                 "Find it and memorize it. I will quiz you about the important information there."
               : "Some special magic numbers are hidden within the following text. Make sure to "
                 "memorize them. I will quiz you about the numbers afterwards.";
}

/* ---- the conversation as text ---------------------------------------------- */

typedef struct convo {
    hkv_chat_msg msg[2 * EVAL_MAX_TURNS];
    char user0[MAX_PROMPT_PIECE];
    char q[EVAL_MAX_TURNS][256], pre[EVAL_MAX_TURNS][256];
    char ans[EVAL_MAX_TURNS][256];     /* answer prefix + the generated text */
} convo;

/* The rendered conversation after the haystack, through turn `turn`'s
 * assistant opening and answer prefix (malloc'd); *head gets the part
 * before the haystack when asked. */
static int render_after(const hkv_tokenizer *tk, convo *cv, int turn, char **head, char **tail,
                        hkv_err *err) {
    int n = 0;
    for (int j = 0; j <= turn; j++) {
        cv->msg[n++] = (hkv_chat_msg){"user", j ? cv->q[j] : cv->user0};
        if (j < turn) cv->msg[n++] = (hkv_chat_msg){"assistant", cv->ans[j]};
    }
    char *text = NULL;
    int rc = hkv_chat_apply(tk, cv->msg, n, 1, &text, err);
    if (rc) return rc;
    char *h = strstr(text, HAY);
    if (!h) {
        free(text);
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "the chat template lost the haystack marker");
    }
    const char *after = h + strlen(HAY);
    size_t la = strlen(after), lp = strlen(cv->pre[turn]);
    *tail = malloc(la + lp + 1);
    if (head) *head = strndup(text, (size_t)(h - text));
    if (!*tail || (head && !*head)) {
        free(text);
        return hkv_seterr(err, HKV_E_NOMEM, "no memory for the prompt text");
    }
    memcpy(*tail, after, la);
    memcpy(*tail + la, cv->pre[turn], lp + 1);
    free(text);
    return HKV_OK;
}

static int tokenize_alloc(const hkv_tokenizer *tk, const char *s, int bos, int special, int32_t **out,
                          int64_t *n, hkv_err *err) {
    size_t len = strlen(s);
    *out = malloc((len + 8) * sizeof **out);
    if (!*out) return hkv_seterr(err, HKV_E_NOMEM, "no memory for tokens");
    return hkv_tokenize(tk, s, len, bos, special, *out, (int64_t)len + 8, n, err);
}

/* ---- the prompt ----------------------------------------------------------- */

/* Haystack of the corpus with the needles inserted after sentence ends near
 * their depths; the full turn-1 prompt goes to *prompt (malloc'd). */
static int build_prompt(eval_run *r, int task, int64_t ctx, uint64_t hseed, eval_trial *tr, convo *cv,
                        char **tail0, int32_t **prompt, int64_t *n_prompt, hkv_err *err) {
    const hkv_tokenizer *tk = r->e->tok;
    const eval_corpus *c = r->corpus;
    snprintf(cv->user0, sizeof cv->user0, "%s\n\n" HAY "\n\n%s", intro(task), cv->q[0]);
    char *head = NULL;
    int32_t *th = NULL, *tt = NULL, *tn[EVAL_MAX_NEEDLES] = {0};
    int64_t nh = 0, nt = 0, nn[EVAL_MAX_NEEDLES] = {0}, n_needle = 0;
    int rc = render_after(tk, cv, 0, &head, tail0, err);
    if (!rc) rc = tokenize_alloc(tk, head, hkv_tokenizer_add_bos(tk), 1, &th, &nh, err);
    if (!rc) rc = tokenize_alloc(tk, *tail0, 0, 1, &tt, &nt, err);
    for (int j = 0; !rc && j < tr->n_needles; j++) {
        char nb[256];
        needle_text(task, tr, j, nb, sizeof nb);
        rc = tokenize_alloc(tk, nb, 0, 0, &tn[j], &nn[j], err);
        n_needle += nn[j];
    }
    /* Room for the answers and, in multi-turn, the later questions: each
     * later turn's segment is measured by rendering the conversation with
     * empty answers (tokens of turn j's tail less turn j-1's), plus slack
     * for tokenization at the seams. */
    int64_t reserve = (int64_t)r->answer_tokens * tr->n_turns, prev = nt;
    for (int j = 1; !rc && j < tr->n_turns; j++) {
        char *tj = NULL;
        int32_t *tkj = NULL;
        int64_t nj = 0;
        snprintf(cv->ans[j - 1], sizeof cv->ans[j - 1], "%s", cv->pre[j - 1]);
        rc = render_after(tk, cv, j, NULL, &tj, err);
        if (!rc) rc = tokenize_alloc(tk, tj, 0, 1, &tkj, &nj, err);
        reserve += nj - prev + 8;
        prev = nj;
        free(tj);
        free(tkj);
    }
    int64_t H = ctx - nh - nt - n_needle - reserve;
    if (!rc && H < 256)
        rc = hkv_seterr(err, HKV_E_RANGE, "context %lld leaves only %lld haystack tokens for %s",
                        (long long)ctx, (long long)H, eval_task_names[task]);
    if (!rc && c->n_tok < H + 1024)
        rc = hkv_seterr(err, HKV_E_RANGE, "%s at context %lld needs %lld corpus tokens; the corpus "
                        "has %lld", eval_task_names[task], (long long)ctx, (long long)H + 1024,
                        (long long)c->n_tok);
    if (!rc && !(*prompt = malloc((size_t)(nh + H + n_needle + nt) * sizeof **prompt)))
        rc = hkv_seterr(err, HKV_E_NOMEM, "no memory for the prompt");
    if (!rc) {
        rng rg = {hseed};
        int64_t off = rng_range(&rg, 0, c->n_tok - H - 512);
        for (int64_t i = off; i < off + 512; i++)   /* start at a sentence */
            if (c->sent_end[i]) {
                off = i + 1;
                break;
            }
        tr->hay_offset = off;
        tr->n_haystack = H;
        /* Needles in depth order; each after a sentence end near its depth. */
        int idx[EVAL_MAX_NEEDLES];
        for (int j = 0; j < tr->n_needles; j++) idx[j] = j;
        for (int a = 1; a < tr->n_needles; a++)
            for (int b = a; b > 0 && tr->depth[idx[b]] < tr->depth[idx[b - 1]]; b--) {
                int s = idx[b]; idx[b] = idx[b - 1]; idx[b - 1] = s;
            }
        int64_t n = 0, h = 0;
        memcpy(*prompt, th, (size_t)nh * sizeof *th);
        n = nh;
        for (int a = 0; a < tr->n_needles; a++) {
            int j = idx[a];
            int64_t at = (int64_t)llround(tr->depth[j] * H), best = -1;
            if (at < h) at = h;
            for (int64_t i = at; i < H && i < at + 400 && best < 0; i++)
                if (i > 0 && c->sent_end[off + i - 1]) best = i;
            for (int64_t i = at; i > h && best < 0; i--)
                if (c->sent_end[off + i - 1]) best = i;
            if (best < 0) best = at;
            memcpy(*prompt + n, c->tok + off + h, (size_t)(best - h) * sizeof **prompt);
            n += best - h;
            h = best;
            tr->depth[j] = (double)h / H;
            memcpy(*prompt + n, tn[j], (size_t)nn[j] * sizeof **prompt);
            n += nn[j];
        }
        memcpy(*prompt + n, c->tok + off + h, (size_t)(H - h) * sizeof **prompt);
        n += H - h;
        memcpy(*prompt + n, tt, (size_t)nt * sizeof *tt);
        *n_prompt = n + nt;
    }
    free(head);
    free(th);
    free(tt);
    for (int j = 0; j < EVAL_MAX_NEEDLES; j++) free(tn[j]);
    return rc;
}

/* ---- answering ------------------------------------------------------------- */

/* Greedy decode on sequence 1 from the logits in r->logits: tokens go to
 * out (room for answer_tokens); the last one is never fed back, so the
 * sequence holds *pos tokens afterwards. */
static int greedy(eval_run *r, int64_t *pos, int32_t *out, int *n_out, eval_task_row *row,
                  hkv_err *err) {
    hkv_engine *e = r->e;
    const int V = e->model.cfg.vocab;
    int n = 0;
    for (;;) {
        int32_t t = hkv_argmax(r->logits, V);
        out[n++] = t;
        if (hkv_tokenizer_is_eog(e->tok, t) || n >= r->answer_tokens) break;
        hkv_seg sg = {.seq = 1, .n = 1, .pos = *pos, .row = 0, .flags = 0};
        int64_t lr = 0;
        double a = hkv_now();
        int rc = hkv_forward(e, &t, 1, &sg, 1, &lr, 1, r->logits, err);
        row->t_decode += hkv_now() - a;
        row->n_decode++;
        if (rc) return rc;
        (*pos)++;
    }
    *n_out = n;
    return HKV_OK;
}

/* Append the text of toks to *s (realloc'd). */
static int append_text(const hkv_tokenizer *tk, char **s, const int32_t *toks, int n, hkv_err *err) {
    size_t l = strlen(*s), cap = l + 64 * (size_t)n + 1;
    char *ns = realloc(*s, cap);
    if (!ns) return hkv_seterr(err, HKV_E_NOMEM, "no memory for an answer");
    *s = ns;
    int64_t w = n ? hkv_detokenize(tk, toks, n, 0, ns + l, cap - l) : 0;
    if (w < 0) return hkv_seterr(err, (int)w, "cannot decode an answer");
    return HKV_OK;
}

/* One configuration through every turn of a trial (sequence 0 prefilled). */
static int answer_all(eval_run *r, int ci, eval_trial *tr, convo *cv, const char *tail0,
                      const float *first, int64_t base, int64_t ctx, eval_task_row *row,
                      hkv_err *err) {
    hkv_engine *e = r->e;
    const hkv_tokenizer *tk = e->tok;
    int32_t out[256];
    int64_t pos = base;   /* n_prompt, or what specpc kept of it */
    char *fed = strdup(tail0);   /* everything after the haystack that the sequence holds */
    int32_t *seg = NULL;
    int rc = fed ? HKV_OK : hkv_seterr(err, HKV_E_NOMEM, "no memory");
    memcpy(r->logits, first, (size_t)e->model.cfg.vocab * sizeof *first);
    for (int turn = 0; !rc && turn < tr->n_turns; turn++) {
        if (turn) {
            /* The next question: the conversation rendered through this turn,
             * less what the sequence already holds, as a new prompt segment. */
            char *tail = NULL;
            int64_t ns = 0;
            if ((rc = render_after(tk, cv, turn, NULL, &tail, err))) break;
            size_t lf = strlen(fed);
            if (strncmp(tail, fed, lf)) {
                free(tail);
                rc = hkv_seterr(err, HKV_E_UNSUPPORTED, "the chat template renders an earlier "
                                "turn differently from what was fed; cannot append turn %d", turn + 1);
                break;
            }
            if ((rc = tokenize_alloc(tk, tail + lf, 0, 1, &seg, &ns, err))) {
                free(tail);
                break;
            }
            free(fed);
            fed = tail;
            if (pos + ns + r->answer_tokens > ctx) {
                rc = hkv_seterr(err, HKV_E_INTERNAL, "turn %d does not fit the context %lld", turn + 1,
                                (long long)ctx);
                break;
            }
            if ((rc = hkv_prefill(e, 1, seg, ns, pos, r->logits, err))) break;
            pos += ns;
            free(seg);
            seg = NULL;
        }
        int n = 0;
        if ((rc = greedy(r, &pos, out, &n, row, err))) break;
        int n_text = n - (hkv_tokenizer_is_eog(tk, out[n - 1]) ? 1 : 0);
        char *ans = calloc(1, 1);
        if (!ans || (rc = append_text(tk, &ans, out, n_text, err))) {
            free(ans);
            if (!rc) rc = hkv_seterr(err, HKV_E_NOMEM, "no memory");
            break;
        }
        const char *want = tr->value[tr->ask[turn]];
        int ok = strstr(ans, want) != NULL;
        tr->ok[ci][turn] = ok;
        snprintf(tr->answer[ci][turn], sizeof tr->answer[ci][turn], "%s", ans);
        snprintf(cv->ans[turn], sizeof cv->ans[turn], "%s%s", cv->pre[turn], ans);
        free(ans);
        row->correct += ok;
        row->turn_correct[turn] += ok;
        row->total++;
        rc = append_text(tk, &fed, out, n - 1, err);   /* the last token was not fed */
    }
    free(seg);
    free(fed);
    return rc;
}

static int run_trial(eval_run *r, int task, int t, int64_t ctx, eval_task_result *res, hkv_err *err) {
    hkv_engine *e = r->e;
    const hkv_kv_ops *ops = e->kv.ops;
    const int near = e->p.tiered.L_init + e->p.tiered.L_local;
    eval_trial *tr = &res->trials[t];
    make_trial(task, t, r->trials, r->seed, ctx, tr);
    convo *cv = calloc(1, sizeof *cv);
    float *first = malloc((size_t)e->model.cfg.vocab * sizeof *first);
    float *first_c = malloc((size_t)e->model.cfg.vocab * sizeof *first);   /* per configuration */
    int32_t *prompt = NULL;
    char *tail0 = NULL;
    int rc = cv && first && first_c ? HKV_OK : hkv_seterr(err, HKV_E_NOMEM, "no memory for a trial");
    for (int j = 0; !rc && j < tr->n_turns; j++) texts(task, tr, j, cv->q[j], cv->pre[j], sizeof cv->q[j]);
    uint64_t hseed = r->seed ^ 0x5851f42d4c957f2dULL * (uint64_t)(1 + task * 64 + t) ^ (uint64_t)ctx;
    if (!rc) rc = build_prompt(r, task, ctx, hseed, tr, cv, &tail0, &prompt, &tr->n_prompt, err);
    ops->seq_close(e->kv.self, 1);
    ops->seq_close(e->kv.self, 0);
    if (!rc) rc = ops->seq_open(e->kv.self, 0, ctx, err);
    double t0 = hkv_now();
    if (!rc) rc = hkv_prefill(e, 0, prompt, tr->n_prompt, 0, first, err);
    tr->t_prefill = hkv_now() - t0;
    for (int ci = 0; !rc && ci < r->n_cfg; ci++) {
        eval_task_row *row = &res->rows[ci];
        hkv_policy_args args;
        rc = hkv_config_resolve(&r->cfg[ci], ctx, tr->n_prompt - near, &args, &row->budget, row->label,
                                 sizeof row->label, err);
        if (!rc) rc = eval_fork(r, ctx, r->cfg[ci].def, &args, 0, row->budget > 0 ? row->budget : 1, NULL, err);
        int64_t base = tr->n_prompt;
        if (!rc) memcpy(first_c, first, (size_t)e->model.cfg.vocab * sizeof *first);
        if (!rc) rc = eval_fork_prep(r, prompt, tr->n_prompt, first_c, r->answer_tokens, &base, err);
        if (!rc) rc = answer_all(r, ci, tr, cv, tail0, first_c, base, ctx, row, err);
    }
    if (!rc && r->verbose) {
        fprintf(stderr, "eval: %s at %lld, trial %d/%d (%lld prompt tokens, prefill %.1f s):", eval_task_names[task],
                (long long)ctx, t + 1, r->trials, (long long)tr->n_prompt, tr->t_prefill);
        for (int ci = 0; ci < r->n_cfg; ci++) {
            fputc(' ', stderr);
            for (int j = 0; j < tr->n_turns; j++) fputc(tr->ok[ci][j] ? '+' : '-', stderr);
        }
        fputc('\n', stderr);
    }
    ops->seq_close(e->kv.self, 1);
    ops->seq_close(e->kv.self, 0);
    free(cv);
    free(first);
    free(first_c);
    free(prompt);
    free(tail0);
    return rc;
}

int eval_task(eval_run *r, int task, int64_t ctx, eval_task_result *out, hkv_err *err) {
    memset(out, 0, sizeof *out);
    out->task = task;
    out->ctx = ctx;
    out->n_rows = r->n_cfg;
    if (!(out->trials = calloc((size_t)r->trials, sizeof *out->trials)))
        return hkv_seterr(err, HKV_E_NOMEM, "no memory for %d trials", r->trials);
    for (int t = 0; t < r->trials; t++) {
        int rc = run_trial(r, task, t, ctx, out, err);
        if (rc) return hkv_err_prefix(err, "%s at context %lld, trial %d", eval_task_names[task],
                                      (long long)ctx, t + 1);
        out->n_trials = t + 1;
    }
    return HKV_OK;
}

void eval_task_result_free(eval_task_result *t) {
    free(t->trials);
    t->trials = NULL;
}
