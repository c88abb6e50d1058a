/* One step's scoring spread over its threads: the jobs, their claims and the
 * helpers (kv_score_team.h).
 *
 * A job lives in its publisher's slot. Its claim word packs a generation
 * (bits 40..63), the piece count (20..39) and the next piece (0..19): a
 * helper's compare-and-swap succeeds only on the job it read, so a helper
 * that read a finished job's word cannot take a piece of the slot's next
 * job. The publisher reuses its slot only after every claimed piece is done
 * (done == pieces), and a helper reads the job's arguments between its
 * claim and its done, so the arguments it reads are the job's it claimed. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "kv_score_team.h"

#define WORD_BITS 20
#define WORD_MASK ((UINT64_C(1) << WORD_BITS) - 1)

typedef struct score_job {
    _Alignas(64) uint64_t word;   /* generation | pieces | next piece */
    int64_t done;                 /* pieces computed */
    /* the arguments, written by the publisher before the word */
    const float *q;
    int g, d;
    const uint16_t *k;
    const int8_t *k8;             /* score_max_i8's rows (k NULL) */
    const uint8_t *k4;            /* score_max_i4's rows (k and k8 NULL) */
    const float *scale;
    int64_t ld, n;
    const int32_t *idx;
    float *s;
} score_job;

typedef struct score_member {
    hkv_score_team *team;
    int tid;
} score_member;

void hkv_spin_wait(unsigned *spins) {
    if (++*spins < 4096) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    } else {
        sched_yield();
    }
}

static int64_t piece_rows(const score_job *j) {
    return j->k ? HKV_SCORE_PIECE : HKV_SCORE_PIECE_SKETCH;
}

static void run_piece(const hkv_cpu_kernels *kn, const score_job *j, int64_t piece) {
    const int64_t rows = piece_rows(j), a = piece * rows;
    const int64_t m = j->n - a < rows ? j->n - a : rows;
    const int32_t *idx = j->idx ? j->idx + a : NULL;
    const int64_t row0 = j->idx ? 0 : a;   /* rows a.. when the rows are contiguous */
    if (j->k)
        kn->score_max(j->q, j->g, j->d, j->k + row0 * j->ld, j->ld, idx, m, j->s + a);
    else if (j->k8)
        kn->score_max_i8(j->q, j->g, j->d, j->k8 + row0 * j->ld, j->ld,
                         j->scale + row0 * (j->d / HKV_SKETCH_GROUP), idx, m, j->s + a);
    else
        kn->score_max_i4(j->q, j->g, j->d, j->k4 + row0 * j->ld, j->ld,
                         j->scale + row0 * (j->d / HKV_SKETCH_GROUP), idx, m, j->s + a);
}

/* Takes one piece of j and computes it: 1, or 0 when none is left. */
static int take_piece(const hkv_cpu_kernels *kn, score_job *j) {
    uint64_t w = __atomic_load_n(&j->word, __ATOMIC_ACQUIRE);
    for (;;) {
        const uint64_t next = w & WORD_MASK, pieces = (w >> WORD_BITS) & WORD_MASK;
        if (next >= pieces) return 0;
        if (__atomic_compare_exchange_n(&j->word, &w, w + 1, 1, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            run_piece(kn, j, (int64_t)next);
            __atomic_fetch_add(&j->done, 1, __ATOMIC_RELEASE);
            return 1;
        }
    }
}

int hkv_score_team_help(hkv_score_team *t) {
    for (int i = 0; i < t->n; i++)
        if (take_piece(t->kern, &t->jobs[i])) return 1;
    return 0;
}

/* Publishes the job in the caller's slot, works on it, and returns when
 * every piece is done (helping other jobs while the last pieces finish). */
static void run_job(const hkv_score_par *p, score_job *args) {
    const score_member *m = p->ctx;
    hkv_score_team *t = m->team;
    const int64_t pieces = (args->n + piece_rows(args) - 1) / piece_rows(args);
    score_job *j = &t->jobs[m->tid];
    if (pieces < 2 || pieces > (int64_t)WORD_MASK) {   /* one piece, or absurdly many: alone */
        for (int64_t i = 0; i < pieces; i++) run_piece(t->kern, args, i);
        return;
    }
    const uint64_t gen = (__atomic_load_n(&j->word, __ATOMIC_RELAXED) >> (2 * WORD_BITS)) + 1;
    j->q = args->q, j->g = args->g, j->d = args->d, j->k = args->k, j->k8 = args->k8;
    j->k4 = args->k4;
    j->scale = args->scale, j->ld = args->ld, j->n = args->n, j->idx = args->idx, j->s = args->s;
    __atomic_store_n(&j->done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&j->word, gen << (2 * WORD_BITS) | (uint64_t)pieces << WORD_BITS,
                     __ATOMIC_RELEASE);
    while (take_piece(t->kern, j)) {}
    unsigned spins = 0;
    while (__atomic_load_n(&j->done, __ATOMIC_ACQUIRE) < pieces)
        if (!hkv_score_team_help(t)) hkv_spin_wait(&spins);
}

static void par_score_max(const hkv_score_par *p, const float *q, int g, int d, const uint16_t *k,
                          int64_t ld, const int32_t *idx, int64_t n, float *s) {
    score_job a = {.q = q, .g = g, .d = d, .k = k, .ld = ld, .idx = idx, .n = n, .s = s};
    run_job(p, &a);
}

static void par_score_max_i8(const hkv_score_par *p, const float *q, int g, int d,
                             const int8_t *k, int64_t ld, const float *scale,
                             const int32_t *idx, int64_t n, float *s) {
    score_job a = {.q = q, .g = g, .d = d, .k8 = k, .scale = scale, .ld = ld, .idx = idx,
                   .n = n, .s = s};
    run_job(p, &a);
}

static void par_score_max_i4(const hkv_score_par *p, const float *q, int g, int d,
                             const uint8_t *k, int64_t ld, const float *scale,
                             const int32_t *idx, int64_t n, float *s) {
    score_job a = {.q = q, .g = g, .d = d, .k4 = k, .scale = scale, .ld = ld, .idx = idx,
                   .n = n, .s = s};
    run_job(p, &a);
}

int hkv_score_team_init(hkv_score_team *t, const hkv_cpu_kernels *kern, int n, hkv_err *err) {
    memset(t, 0, sizeof *t);
    if (n < 1) return hkv_seterr(err, HKV_E_INVAL, "a scoring team of %d threads", n);
    t->kern = kern, t->n = n;
    t->jobs = aligned_alloc(64, (size_t)n * sizeof *t->jobs);
    t->members = calloc((size_t)n, sizeof *t->members);
    t->par = calloc((size_t)n, sizeof *t->par);
    if (!t->jobs || !t->members || !t->par) {
        hkv_score_team_free(t);
        return hkv_seterr(err, HKV_E_NOMEM, "no memory for a scoring team of %d threads", n);
    }
    memset(t->jobs, 0, (size_t)n * sizeof *t->jobs);
    for (int i = 0; i < n; i++) {
        t->members[i] = (score_member){t, i};
        t->par[i] = (hkv_score_par){.score_max = par_score_max,
                                    .score_max_i8 = par_score_max_i8,
                                    .score_max_i4 = par_score_max_i4, .ctx = &t->members[i]};
    }
    return HKV_OK;
}

void hkv_score_team_free(hkv_score_team *t) {
    free(t->jobs);
    free(t->members);
    free(t->par);
    memset(t, 0, sizeof *t);
}

const hkv_score_par *hkv_score_team_par(const hkv_score_team *t, int tid) {
    return t->n > 1 && tid >= 0 && tid < t->n ? &t->par[tid] : NULL;
}
