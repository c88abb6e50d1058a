/* Continuous batching (scheduler.h). */
#include "far_rows.h"
#include "scheduler.h"

#include <stdlib.h>
#include <string.h>

#include "gpu_plan.h"
#include "kv_far.h"
#include "lookahead.h"

enum { SLOT_FREE = 0, SLOT_PREFILL, SLOT_DECODE };

typedef struct slot {
    int state;
    hkv_sched_req *r;
    int64_t fed;          /* prompt tokens prefilled */
    int64_t base;         /* where decode continues: the prompt length or what specpc kept */
    int64_t cap;          /* capacity the sequence was opened with */
    uint64_t order;       /* admission order: prefill oldest first */
    int whole;            /* the policy's prep takes the whole prompt in one step */
    const hkv_policy_def *def;   /* the policy it runs (its request's, or placed), and args */
    hkv_policy_args args;
    int opened;           /* its KV is open: at its first prefill, not at admission, so a
                             request waiting for its turn holds no memory yet and can still
                             start from a prefix kept meanwhile */
    size_t text_cap;
    hkv_sampler smp;
    int smp_ok;
} slot;

/* A kept prompt prefix (the prefix cache): its KV in engine slot
 * max_batch + k, as of `len` tokens, a whole number of chunks. */
typedef struct prefix_entry {
    int used;
    int32_t *tok;                 /* the prefix's tokens */
    int64_t len, cap, q_keep;     /* its tokens, the slot's capacity, queries its ring keeps */
    const hkv_policy_def *def;
    hkv_policy_args args;
    uint64_t bytes, last_use;
} prefix_entry;

struct hkv_sched {
    hkv_engine *e;
    hkv_sched_params p;
    const hkv_policy_def *def0;   /* the engine's policy when the scheduler was made */
    hkv_policy_args args0;
    slot *slots;
    hkv_sched_req *head, *tail;   /* waiting, first come first served */
    int n_queued, n_running;
    uint64_t reserved, admitted;
    float *logits;                /* [max_batch][vocab] */
    int32_t *toks;
    hkv_seg *segs;
    int64_t *lrows;
    int *rows;                    /* decode row -> slot */
    prefix_entry *pfx;            /* [prefix_slots] */
    uint64_t pfx_clock;
    hkv_sched_stats st;
};

void hkv_sched_params_default(hkv_sched_params *p) {
    memset(p, 0, sizeof *p);
    p->max_batch = 1;
    p->batch_invariant = 1;
}

static int64_t chunk_of(const hkv_sched *s) {
    int64_t c = s->p.chunk > 0 ? s->p.chunk : 256;
    return c < s->e->max_rows ? c : s->e->max_rows;
}

/* The policy request r runs and its arguments (the scheduler's default, or
 * its own with defaults filled in). */
static const hkv_policy_def *req_policy(const hkv_sched *s, const hkv_sched_req *r,
                                        hkv_policy_args *a) {
    if (!r->policy) {
        *a = s->args0;
        return s->def0;
    }
    if (r->policy_args) *a = *r->policy_args;
    else hkv_policy_args_init(r->policy, a);
    return r->policy;
}

/* The policy slot i's request runs: set at admission (placement). */
static const hkv_policy_def *slot_policy(const hkv_sched *s, int i, hkv_policy_args *a) {
    *a = s->slots[i].args;
    return s->slots[i].def;
}

/* Requests placed whole on the device now, slot i's aside. */
static int resident_running(const hkv_sched *s, int i) {
    int n = 0;
    for (int j = 0; j < s->p.max_batch; j++)
        n += j != i && s->slots[j].state != SLOT_FREE && s->slots[j].r && s->slots[j].r->resident;
    return n;
}

/* Whether request r's far rows under full (its prompt and answer past the
 * near tier) fit one resident slot. */
static int fits_resident(const hkv_sched *s, const hkv_sched_req *r) {
    if (s->p.resident_rows <= 0) return 1;
    const hkv_near_window w = hkv_kv_near_window(&s->e->kv);
    return r->n_prompt + r->n_predict + 1 - (w.L_init + w.L_local) <= s->p.resident_rows;
}

static int64_t req_capacity(const hkv_sched *s, const hkv_sched_req *r) {
    hkv_policy_args a;
    const hkv_policy_def *def = req_policy(s, r, &a);
    return hkv_prep_prompt_len_of(def, &a, r->n_prompt) + r->n_predict + 1 +
           hkv_lookahead_room_of(s->e, def, &a);
}

int64_t hkv_sched_capacity(const hkv_engine *e, const hkv_sched_req *r) {
    /* the engine's policy: slot 0 stands for it */
    return hkv_prep_prompt_len(e, 0, r->n_prompt) + r->n_predict + 1 + hkv_lookahead_room(e, 0);
}

uint64_t hkv_sched_kv_bytes(const hkv_engine *e, int64_t cap) {
    hkv_policy_args args;
    const hkv_policy_def *def = hkv_kv_seq_policy(&e->kv, 0, &args);
    return hkv_sched_kv_bytes_of(e, def, &args, cap);
}

uint64_t hkv_sched_kv_bytes_of(const hkv_engine *e, const hkv_policy_def *def,
                               const hkv_policy_args *argp, int64_t cap) {
    const hkv_model_config *c = &e->model.cfg;
    const uint64_t L = (uint64_t)c->n_layer, KH = (uint64_t)c->n_head_kv, d = (uint64_t)c->head_dim;
    const uint64_t row = L * KH * d * 2 * 2;   /* K and V, fp16, every layer and KV head */
    if (!hkv_kv_has_far(&e->kv)) return row * (uint64_t)cap;
    const hkv_near_window w = hkv_kv_near_window(&e->kv);
    hkv_policy_args args;
    if (argp) args = *argp;
    else if (def) hkv_policy_args_init(def, &args);
    hkv_policy_env env = {.shape = {c->n_layer, c->n_head, c->n_head_kv, c->head_dim},
                          .n_ctx = cap, .L_init = w.L_init, .L_local = w.L_local,
                          .kern = &e->kern};
    int64_t q_keep = e->p.tiered.keep_queries;
    if (def && def->queries_wanted) {
        int64_t w = def->queries_wanted(&args, &env);
        if (w > q_keep) q_keep = w;
    }
    if (q_keep > cap) q_keep = cap;
    /* the far tier holds every position, in its format (fp16 or 8-bit) */
    const uint64_t far_row = L * KH * 2 * hkv_far_row_bytes((int)d, e->p.tiered.far_q8);
    uint64_t bytes = row * (uint64_t)(w.L_init + w.L_local) + far_row * (uint64_t)cap +
                     L * (uint64_t)q_keep * (uint64_t)c->n_head * d * 2;
    hkv_plan_params pp = {.cfg = c, .batch = 1, .n_ctx = cap, .L_init = w.L_init, .far_q8 = e->p.tiered.far_q8,
                          .L_local = w.L_local, .policy = def, .args = &args};
    uint64_t g = 0, h = 0;
    hkv_err err;
    if (def && hkv_plan_index_bytes(&pp, &g, &h, &err) == HKV_OK) bytes += g + h;
    return bytes;
}

int hkv_sched_create(hkv_sched **out, hkv_engine *e, const hkv_sched_params *p, hkv_err *err) {
    *out = NULL;
    if (p->max_batch < 1 || p->max_batch > e->p.max_seqs)
        return hkv_seterr(err, HKV_E_RANGE, "scheduler: a batch of %d does not fit the engine's "
                          "%d sequence slots", p->max_batch, e->p.max_seqs);
    if (p->prefix_slots < 0 || p->prefix_slots > e->p.max_seqs - p->max_batch)
        return hkv_seterr(err, HKV_E_RANGE, "scheduler: %d kept prefixes beside a batch of %d do "
                          "not fit the engine's %d sequence slots", p->prefix_slots, p->max_batch,
                          e->p.max_seqs);
    hkv_sched *s = calloc(1, sizeof *s);
    if (!s) return hkv_seterr(err, HKV_E_NOMEM, "no memory for the scheduler");
    s->e = e;
    s->p = *p;
    /* the policy requests run unless they name their own */
    s->def0 = hkv_kv_seq_policy(&e->kv, 0, &s->args0);
    const size_t B = (size_t)p->max_batch, V = (size_t)e->model.cfg.vocab;
    s->slots = calloc(B, sizeof *s->slots);
    s->logits = malloc(B * V * sizeof(float));
    s->toks = malloc(B * sizeof(int32_t));
    s->segs = malloc(B * sizeof(hkv_seg));
    s->lrows = malloc(B * sizeof(int64_t));
    s->rows = malloc(B * sizeof(int));
    s->pfx = p->prefix_slots ? calloc((size_t)p->prefix_slots, sizeof *s->pfx) : NULL;
    if (!s->slots || !s->logits || !s->toks || !s->segs || !s->lrows || !s->rows ||
        (p->prefix_slots && !s->pfx)) {
        hkv_sched_free(s);
        return hkv_seterr(err, HKV_E_NOMEM, "no memory for a scheduler of %d sequences",
                          p->max_batch);
    }
    *out = s;
    return HKV_OK;
}

void hkv_sched_free(hkv_sched *s) {
    if (!s) return;
    for (int i = 0; s->slots && i < s->p.max_batch; i++) {
        slot *sl = &s->slots[i];
        if (sl->state == SLOT_FREE) continue;
        s->e->kv.ops->seq_close(s->e->kv.self, i);
        if (sl->smp_ok) hkv_sampler_free(&sl->smp);
        if (s->p.on_drop && sl->r) s->p.on_drop(s->p.ud, sl->r);
    }
    for (hkv_sched_req *r = s->head, *next; r; r = next) {   /* on_drop may free r */
        next = r->next_;
        r->next_ = NULL;
        if (s->p.on_drop) s->p.on_drop(s->p.ud, r);
    }
    for (int k = 0; s->pfx && k < s->p.prefix_slots; k++)
        if (s->pfx[k].used) {
            s->e->kv.ops->seq_close(s->e->kv.self, s->p.max_batch + k);
            free(s->pfx[k].tok);
        }
    free(s->pfx);
    free(s->slots);
    free(s->logits);
    free(s->toks);
    free(s->segs);
    free(s->lrows);
    free(s->rows);
    free(s);
}

void hkv_sched_req_clear(hkv_sched_req *r) {
    free(r->out);
    free(r->text);
    r->out = NULL;
    r->text = NULL;
    r->n_out = 0;
    r->text_len = 0;
}

int hkv_sched_pending(const hkv_sched *s) { return s->n_queued + s->n_running; }
int hkv_sched_running(const hkv_sched *s) { return s->n_running; }
void hkv_sched_get_stats(const hkv_sched *s, hkv_sched_stats *st) { *st = s->st; }

int hkv_sched_submit(hkv_sched *s, hkv_sched_req *r, hkv_err *err) {
    hkv_engine *e = s->e;
    if (r->n_prompt < 1 || !r->prompt) return hkv_seterr(err, HKV_E_INVAL, "the prompt is empty");
    if (r->n_predict < 1) return hkv_seterr(err, HKV_E_INVAL, "max_tokens %d: at least 1", r->n_predict);
    if (r->n_stop < 0 || r->n_stop > HKV_SCHED_MAX_STOP)
        return hkv_seterr(err, HKV_E_INVAL, "%d stop strings: at most %d", r->n_stop,
                          HKV_SCHED_MAX_STOP);
    hkv_sampler probe;
    int rc = hkv_sampler_init(&probe, &r->sp, e->model.cfg.vocab, err);
    if (rc) return rc;
    hkv_sampler_free(&probe);
    int64_t need = r->n_prompt + r->n_predict;
    if (need > e->p.n_ctx)
        return hkv_seterr(err, HKV_E_CAPACITY, "the request needs %lld tokens of context (prompt "
                          "%lld + max_tokens %d) but the context is %lld", (long long)need,
                          (long long)r->n_prompt, r->n_predict, (long long)e->p.n_ctx);
    if (r->policy && r->policy != s->def0 && r->policy->prep != HKV_PREP_NONE)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "policy %s prepares the prompt (a lookahead, a "
                          "draft, token-selective prefill): only the engine's own policy may, "
                          "a request may name another policy without preparation",
                          r->policy->name);
    if (r->policy && !hkv_kv_has_far(&e->kv))
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "a request's policy needs the tiered KV cache");
    if (r->policy && r->policy_args && (rc = hkv_policy_args_check(r->policy, r->policy_args, err)))
        return rc;
    int64_t cap = req_capacity(s, r);
    hkv_policy_args pa;
    const hkv_policy_def *pdef = req_policy(s, r, &pa);
    uint64_t bytes = hkv_sched_kv_bytes_of(e, pdef, &pa, cap);
    if (s->p.mem_budget && bytes > s->p.mem_budget) {
        char a[32], b[32];
        hkv_fmt_bytes((double)bytes, a, sizeof a);
        hkv_fmt_bytes((double)s->p.mem_budget, b, sizeof b);
        return hkv_seterr(err, HKV_E_CAPACITY, "the request's KV cache (%lld tokens) needs %s but "
                          "the memory budget is %s: it can never fit", (long long)cap, a, b);
    }
    memset(&r->out, 0, sizeof *r - offsetof(hkv_sched_req, out));
    r->kv_bytes = bytes;
    r->t_submit = hkv_now();
    if (s->tail) s->tail->next_ = r;
    else s->head = r;
    s->tail = r;
    s->n_queued++;
    return HKV_OK;
}

/* Close slot i's sequence and give back its KV reservation. */
static void release(hkv_sched *s, int i) {
    slot *sl = &s->slots[i];
    s->e->kv.ops->seq_close(s->e->kv.self, i);
    if (sl->smp_ok) hkv_sampler_free(&sl->smp);
    s->reserved -= sl->r->kv_bytes;
    s->n_running--;
}

static void finish(hkv_sched *s, int i, int status, const hkv_err *err) {
    slot *sl = &s->slots[i];
    hkv_sched_req *r = sl->r;
    release(s, i);
    r->status = status;
    if (status && err) r->err = *err;
    if (r->n_out > 0) r->t_decode = hkv_now() - (r->t_submit + r->t_first);
    memset(sl, 0, sizeof *sl);
    if (s->p.on_done) s->p.on_done(s->p.ud, r);
}

/* Append tok's text; a stop string in the text ends the request there. */
static int append_token(hkv_sched *s, slot *sl, int32_t tok) {
    hkv_sched_req *r = sl->r;
    r->out[r->n_out++] = tok;
    if (s->p.on_token) s->p.on_token(s->p.ud, r, tok);
    char piece[256];
    int n = hkv_token_to_piece(s->e->tok, tok, 0, piece, sizeof piece);
    if (n > 0) {
        if (r->text_len + (size_t)n + 1 > sl->text_cap) {
            size_t nc = 2 * (sl->text_cap + (size_t)n) + 64;
            char *nb = realloc(r->text, nc);
            if (!nb) return HKV_E_NOMEM;
            r->text = nb;
            sl->text_cap = nc;
        }
        memcpy(r->text + r->text_len, piece, (size_t)n);
        size_t from = r->text_len;
        r->text_len += (size_t)n;
        r->text[r->text_len] = 0;
        for (int k = 0; k < r->n_stop; k++) {
            size_t m = strlen(r->stop[k]);
            if (!m || m > r->text_len) continue;
            /* a match may start in earlier text and end in this piece */
            size_t lo = from + 1 > m ? from + 1 - m : 0;
            char *hit = strstr(r->text + lo, r->stop[k]);
            if (hit) {
                r->text_len = (size_t)(hit - r->text);
                r->text[r->text_len] = 0;
                return HKV_STOP_STRING;
            }
        }
    }
    return hkv_gen_stop_after(s->e, r->stop_at_eog, tok, r->n_out, r->n_predict);
}

/* The first token from the prompt's last logits; the sequence decodes next. */
static void first_token(hkv_sched *s, int i, const float *logits) {
    slot *sl = &s->slots[i];
    hkv_sched_req *r = sl->r;
    int32_t t = hkv_sample(&sl->smp, logits);
    r->t_first = hkv_now() - r->t_submit;
    int stop = append_token(s, sl, t);
    if (stop < 0) {
        hkv_err e2;
        hkv_seterr(&e2, HKV_E_NOMEM, "no memory for the output text");
        finish(s, i, HKV_E_NOMEM, &e2);
    } else if (stop) {
        r->finish = stop;
        finish(s, i, HKV_OK, NULL);
    } else {
        sl->state = SLOT_DECODE;
    }
}

/* Queries the sequence's ring keeps for its prompt end (kv_tiered.c's
 * q_keep): a copy's ring is taken over only when both keep as many. */
static int64_t ring_of(const hkv_sched *s, const hkv_policy_def *def, const hkv_policy_args *a,
                       int64_t cap) {
    const hkv_engine *e = s->e;
    if (!hkv_kv_has_far(&e->kv)) return 0;
    const hkv_model_config *c = &e->model.cfg;
    const hkv_near_window w = hkv_kv_near_window(&e->kv);
    hkv_policy_env env = {.shape = {c->n_layer, c->n_head, c->n_head_kv, c->head_dim},
                          .n_ctx = cap, .L_init = w.L_init, .L_local = w.L_local,
                          .kern = &e->kern};
    int64_t q = e->p.tiered.keep_queries;
    if (def && def->queries_wanted) {
        const int64_t want = def->queries_wanted(a, &env);
        if (want > q) q = want;
    }
    return q < cap ? q : cap;
}

/* 1 when slot i's policy shares its index with the sequences that start
 * with its prompt (index/policy.h, fork: ctkvr). */
static int index_shared(hkv_engine *e, int i) {
    const hkv_policy_def *def;
    hkv_policy pol;
    hkv_err err;
    return hkv_kv_has_far(&e->kv) && hkv_kv_seq_instance(&e->kv, i, &def, &pol, &err) == HKV_OK &&
           pol.ops && pol.ops->fork;
}

static void prefix_drop(hkv_sched *s, int k) {
    prefix_entry *x = &s->pfx[k];
    s->e->kv.ops->seq_close(s->e->kv.self, s->p.max_batch + k);
    s->reserved -= x->bytes;
    s->st.prefix_entries--;
    s->st.prefix_bytes -= x->bytes;
    free(x->tok);
    memset(x, 0, sizeof *x);
}

/* Drops the least recently used kept prefix: 1, or 0 when none is kept. */
static int prefix_evict_lru(hkv_sched *s) {
    int k = -1;
    for (int j = 0; j < s->p.prefix_slots; j++)
        if (s->pfx[j].used && (k < 0 || s->pfx[j].last_use < s->pfx[k].last_use)) k = j;
    if (k < 0) return 0;
    prefix_drop(s, k);
    s->st.prefix_evicted++;
    return 1;
}

/* The kept prefix slot i's request may start from with the most tokens,
 * *n of them: the same policy, an entry shorter than the prompt, and the
 * tokens they have in common in whole chunks (the boundaries the request
 * would use itself), with either rings of one size or a rest of the prompt
 * long enough to refill the ring. -1: none. */
static int prefix_find(const hkv_sched *s, int i, int64_t *n) {
    const slot *sl = &s->slots[i];
    const hkv_sched_req *r = sl->r;
    hkv_policy_args a;
    const hkv_policy_def *def = slot_policy(s, i, &a);
    const int64_t ring = ring_of(s, def, &a, sl->cap), c = chunk_of(s);
    int best = -1;
    *n = 0;
    for (int k = 0; k < s->p.prefix_slots; k++) {
        const prefix_entry *x = &s->pfx[k];
        if (!x->used || x->def != def || memcmp(&x->args, &a, sizeof a) || x->len >= r->n_prompt)
            continue;
        int64_t m = 0;
        while (m < x->len && x->tok[m] == r->prompt[m]) m++;
        m = m / c * c;
        if (m <= *n || (x->q_keep != ring && ring > r->n_prompt - m)) continue;
        best = k;
        *n = m;
    }
    return best;
}

/* Keep slot i's prompt as of now (sl->fed tokens, whole chunks) unless an
 * entry holds it already; replaces the least recently used entry, and
 * gives up quietly (the cache is an optimisation) when the KV does not fit
 * the budget or a copy fails. */

/* dst from src's KV: shared by reference where the cache can (kv.h,
 * seq_share), else copied. The far-tier bytes the sharing released are
 * counted as saved and leave dst's request's reservation, so admission
 * counts the shared rows once. */
static int prefix_fork(hkv_sched *s, int dst, int src, int64_t n, unsigned flags, hkv_err *err) {
    hkv_engine *e = s->e;
    const hkv_kv_ops *ops = e->kv.ops;
    if (!ops->seq_share) {   /* the plain cache: a copy */
        int rc = ops->seq_copy(e->kv.self, dst, src, err);
        return rc || n == ops->seq_len(e->kv.self, src) ? rc : ops->seq_rewind(e->kv.self, dst, n, err);
    }
    const size_t before = e->mem.bytes[HKV_TIER_FAR];
    int rc = ops->seq_share(e->kv.self, dst, src, n, flags, err);
    const size_t after = e->mem.bytes[HKV_TIER_FAR];
    if (rc || after >= before) return rc;
    const uint64_t saved = before - after;
    s->st.prefix_saved_bytes += saved;
    hkv_sched_req *r = dst < s->p.max_batch ? s->slots[dst].r : NULL;
    if (r) {
        const uint64_t cut = saved < r->kv_bytes ? saved : r->kv_bytes;
        r->kv_bytes -= cut;
        s->reserved -= cut;
    }
    return HKV_OK;
}

static void prefix_store(hkv_sched *s, int i) {
    hkv_engine *e = s->e;
    slot *sl = &s->slots[i];
    hkv_sched_req *r = sl->r;
    hkv_policy_args a;
    const hkv_policy_def *def = slot_policy(s, i, &a);
    for (int j = 0; j < s->p.prefix_slots; j++) {
        const prefix_entry *x = &s->pfx[j];
        if (x->used && x->def == def && !memcmp(&x->args, &a, sizeof a) && x->len == sl->fed &&
            !memcmp(x->tok, r->prompt, (size_t)x->len * sizeof *x->tok))
            return;   /* kept already */
    }
    int k = -1;   /* a free entry, or the least recently used one's */
    for (int pass = 0; k < 0 && pass < 2; pass++) {
        if (pass) prefix_evict_lru(s);
        for (int j = 0; k < 0 && j < s->p.prefix_slots; j++)
            if (!s->pfx[j].used) k = j;
    }
    if (s->p.mem_budget && s->reserved + r->kv_bytes > s->p.mem_budget) return;
    prefix_entry *x = &s->pfx[k];
    const int q = s->p.max_batch + k;
    hkv_err err;
    hkv_err_clear(&err);
    if (!(x->tok = malloc((size_t)sl->fed * sizeof *x->tok))) return;
    if ((def && hkv_kv_has_far(&e->kv) && hkv_kv_set_policy(&e->kv, q, def, &a, &err)) ||
        e->kv.ops->seq_open(e->kv.self, q, sl->cap, &err)) {
        free(x->tok);
        x->tok = NULL;
        return;
    }
    /* by reference where the cache can: the request's own rows become the
     * shared prefix, which the entry and the request then read in place */
    if (prefix_fork(s, q, i, sl->fed, HKV_SHARE_INDEX, &err)) {
        e->kv.ops->seq_close(e->kv.self, q);
        free(x->tok);
        x->tok = NULL;
        return;
    }
    memcpy(x->tok, r->prompt, (size_t)sl->fed * sizeof *x->tok);
    x->used = 1, x->len = sl->fed, x->cap = sl->cap, x->q_keep = ring_of(s, def, &a, sl->cap);
    x->def = def, x->args = a, x->bytes = r->kv_bytes, x->last_use = ++s->pfx_clock;
    s->reserved += x->bytes;
    s->st.prefix_stored++;
    s->st.prefix_entries++;
    s->st.prefix_bytes += x->bytes;
}

/* Slot i's request starts from the kept prefix it has most tokens in common
 * with, if any (then only the rest of its prompt is prefilled). Asked when
 * its prefill starts, not at admission: prompts are prefilled one at a time,
 * so requests admitted together over one document find the prefix that the
 * first of them kept. */
static int prefix_start(hkv_sched *s, int i, hkv_err *err) {
    slot *sl = &s->slots[i];
    int64_t n;
    const int k = s->p.prefix_slots && !sl->whole && sl->fed == 0 ? prefix_find(s, i, &n) : -1;
    if (k < 0) return HKV_OK;
    const double t0 = hkv_now();
    /* the kept index only where the request would have built its own: at
     * its last whole chunk (prefill_step), so its tokens are the same
     * whether it found the prefix or not */
    const unsigned flags = n == (sl->r->n_prompt - 1) / chunk_of(s) * chunk_of(s) ? HKV_SHARE_INDEX : 0;
    int rc = prefix_fork(s, i, s->p.max_batch + k, n, flags, err);
    s->st.t_prefix_fork += hkv_now() - t0;
    if (rc) return rc;
    sl->fed = n;
    s->pfx[k].last_use = ++s->pfx_clock;
    s->st.prefix_hits++;
    s->st.prefix_tokens += n;
    if (flags && index_shared(s->e, i)) s->st.prefix_index_hits++;
    return HKV_OK;
}

static void admit(hkv_sched *s) {
    hkv_engine *e = s->e;
    for (int i = 0; i < s->p.max_batch && s->head; i++) {
        slot *sl = &s->slots[i];
        if (sl->state != SLOT_FREE) continue;
        hkv_sched_req *r = s->head;
        /* kept prefixes are a cache: they make room for a request */
        while (s->p.mem_budget && s->reserved + r->kv_bytes > s->p.mem_budget &&
               prefix_evict_lru(s)) {}
        if (s->p.mem_budget && s->reserved + r->kv_bytes > s->p.mem_budget) break;   /* waits */
        /* waits for a resident slot rather than run in the split (queue order kept) */
        if (s->p.resident_wait && s->p.resident && !r->policy && fits_resident(s, r) &&
            resident_running(s, i) >= s->p.resident) {
            s->st.resident_waits += !r->waited_;   /* once a request */
            r->waited_ = 1;
            break;
        }
        s->head = r->next_;
        if (!s->head) s->tail = NULL;
        r->next_ = NULL;
        s->n_queued--;
        s->n_running++;
        s->reserved += r->kv_bytes;
        memset(sl, 0, sizeof *sl);
        sl->r = r;
        sl->state = SLOT_PREFILL;
        sl->order = ++s->admitted;
        sl->cap = req_capacity(s, r);
        sl->def = req_policy(s, r, &sl->args);
        /* placement: whole on the device while it has room for another */
        r->resident = !r->policy && sl->def && s->p.resident > resident_running(s, i) &&
                      fits_resident(s, r);
        if (r->resident) {
            sl->def = &hkv_policy_full;
            hkv_policy_args_init(sl->def, &sl->args);
        }
        r->t_admit = hkv_now();
        hkv_err err;
        hkv_err_clear(&err);
        int rc = HKV_E_NOMEM;
        if (!(r->out = malloc((size_t)(r->n_predict + 1) * sizeof(int32_t))) ||
            (rc = hkv_sampler_init(&sl->smp, &r->sp, e->model.cfg.vocab, &err))) {
            if (rc == HKV_E_NOMEM) hkv_seterr(&err, rc, "no memory for the request's output");
            sl->state = SLOT_PREFILL;
            finish(s, i, rc, &err);
            continue;
        }
        sl->smp_ok = 1;
        /* every slot is given its request's policy (the default's too: the
         * slot may have run another request's) */
        if (sl->def && hkv_kv_has_far(&e->kv) &&
            (rc = hkv_kv_set_policy(&e->kv, i, sl->def, &sl->args, &err))) {
            finish(s, i, rc, &err);
            continue;
        }
        hkv_policy_args args;
        const hkv_policy_def *def = hkv_kv_seq_policy(&e->kv, i, &args);
        sl->whole = def && def->prep != HKV_PREP_NONE;
    }
}

/* Slot i's KV, before its first prefill: opened, then started from a kept
 * prefix where one has whole chunks in common with its prompt. */
static int slot_open(hkv_sched *s, int i, hkv_err *err) {
    slot *sl = &s->slots[i];
    int rc = s->e->kv.ops->seq_open(s->e->kv.self, i, sl->cap, err);
    if (rc) return rc;   /* (closing a slot that failed to open is harmless) */
    sl->opened = 1;
    return prefix_start(s, i, err);
}

static int decode_step(hkv_sched *s, hkv_err *err) {
    hkv_engine *e = s->e;
    int n = 0;
    for (int i = 0; i < s->p.max_batch; i++) {
        slot *sl = &s->slots[i];
        if (sl->state != SLOT_DECODE) continue;
        hkv_sched_req *r = sl->r;
        s->toks[n] = r->out[r->n_out - 1];
        s->segs[n] = (hkv_seg){.seq = i, .n = 1, .pos = sl->base + r->n_out - 1, .row = n};
        s->lrows[n] = n;
        s->rows[n++] = i;
    }
    if (!n) return HKV_OK;
    double t0 = hkv_now();
    const int inv = e->kern.batch_invariant;
    e->kern.batch_invariant = s->p.batch_invariant;
    int rc = hkv_forward(e, s->toks, n, s->segs, n, s->lrows, n, s->logits, err);
    e->kern.batch_invariant = inv;
    s->st.t_decode += hkv_now() - t0;
    if (rc) return hkv_err_prefix(err, "decode step of %d sequences", n);
    s->st.steps++;
    s->st.decode_rows += n;
    s->st.n_gen_tokens += n;
    const size_t V = (size_t)e->model.cfg.vocab;
    for (int a = 0; a < n; a++) {
        slot *sl = &s->slots[s->rows[a]];
        int32_t t = hkv_sample(&sl->smp, s->logits + a * V);
        int stop = append_token(s, sl, t);
        if (stop < 0) {
            hkv_err e2;
            hkv_seterr(&e2, HKV_E_NOMEM, "no memory for the output text");
            finish(s, s->rows[a], HKV_E_NOMEM, &e2);
        } else if (stop) {
            sl->r->finish = stop;
            finish(s, s->rows[a], HKV_OK, NULL);
        }
    }
    return HKV_OK;
}

/* Prefill the oldest prefilling sequence's next chunk (or, for a policy with
 * a whole-prompt prep, its whole prompt); returns tokens fed, 0 if none. */
static int64_t prefill_one(hkv_sched *s) {
    hkv_engine *e = s->e;
    int best = -1;
    for (int i = 0; i < s->p.max_batch; i++)
        if (s->slots[i].state == SLOT_PREFILL &&
            (best < 0 || s->slots[i].order < s->slots[best].order))
            best = i;
    if (best < 0) return 0;
    slot *sl = &s->slots[best];
    hkv_sched_req *r = sl->r;
    hkv_err err;
    hkv_err_clear(&err);
    int64_t rc0;
    if (!sl->opened && (rc0 = slot_open(s, best, &err))) {
        finish(s, best, (int)rc0, &err);
        return 0;
    }
    float *lg = s->logits;   /* free between decode steps */
    double t0 = hkv_now();
    int64_t fed, rc;
    if (sl->whole) {
        rc = hkv_prefill_prep(e, best, r->prompt, r->n_prompt, lg, sl->cap - r->n_prompt,
                              r->n_predict, &sl->base, &err);
        fed = r->n_prompt;
        sl->fed = r->n_prompt;
    } else {
        int64_t c = chunk_of(s);
        /* fixed boundaries [kC, (k+1)C): the same whatever else is in flight */
        fed = r->n_prompt - sl->fed < c ? r->n_prompt - sl->fed : c;
        rc = hkv_prefill_chunk(e, best, r->prompt, r->n_prompt, 0, sl->fed, fed, lg, &err);
        sl->fed += fed;
        sl->base = r->n_prompt;
        /* the prompt as of its last whole chunk before the end: kept, with
         * the index of a policy that shares its index built there (its
         * prompt's rest is a later turn), whether it is kept or not */
        if (!rc && s->p.prefix_slots && sl->fed < r->n_prompt &&
            sl->fed == (r->n_prompt - 1) / c * c) {
            if (index_shared(e, best) && (rc = hkv_kv_prompt_end(&e->kv, best, &err)) == HKV_OK)
                s->st.prefix_index_builds++;
            if (!rc) prefix_store(s, best);
        }
    }
    double dt = hkv_now() - t0;
    r->t_prefill += dt;
    s->st.t_prefill += dt;
    s->st.n_prompt_tokens += fed;
    if (rc) {
        hkv_err_prefix(&err, "prefill");
        finish(s, best, (int)rc, &err);
    } else if (sl->fed == r->n_prompt) {
        first_token(s, best, lg);
    }
    return fed;
}

int hkv_sched_cancel(hkv_sched *s, hkv_sched_req *r) {
    for (hkv_sched_req **pp = &s->head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->next_) {
        if (*pp != r) continue;
        *pp = r->next_;
        if (s->tail == r) s->tail = prev;
        r->next_ = NULL;
        s->n_queued--;
        return HKV_OK;
    }
    for (int i = 0; i < s->p.max_batch; i++) {
        slot *sl = &s->slots[i];
        if (sl->state == SLOT_FREE || sl->r != r) continue;
        release(s, i);
        memset(sl, 0, sizeof *sl);
        return HKV_OK;
    }
    return HKV_E_NOTFOUND;
}

int hkv_sched_step(hkv_sched *s, hkv_err *err) {
    admit(s);
    int rc = decode_step(s, err);
    if (rc) return rc;
    /* about one chunk of prompt tokens per step, in whole chunks */
    for (int64_t used = 0; used < chunk_of(s);) {
        int64_t f = prefill_one(s);
        if (!f) break;
        used += f;
        admit(s);   /* a prompt that finished at once frees its slot */
    }
    return HKV_OK;
}
