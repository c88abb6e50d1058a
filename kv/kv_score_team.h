/* One step's scoring spread over its threads (kv_score_team.c).
 *
 * A batch of one has as many selections as KV heads (8 for Llama-3-8B), so
 * on a 16-thread host half the threads would wait while each of the others
 * reranks one head's candidates alone. A selection publishes its scoring
 * (index/policy.h hkv_score_par) as a job of fixed pieces; it works through
 * them itself, and every thread of the step that has no selection of its
 * own left takes pieces too. The scores are the kernel's, bit for bit,
 * whoever computes which piece: logits do not depend on the thread count. */
#ifndef HKV_KV_SCORE_TEAM_H
#define HKV_KV_SCORE_TEAM_H

#include <stdint.h>

#include "kernels.h"
#include "policy.h"
#include "status.h"

/* A job's rows per piece: 256 fp16 rows of d 128 are 64 KB, some
 * microseconds of one thread's reading against one claim's atomic. 8-bit
 * and 4-bit rows (score_max_i8, _i4) are about a half and a third of those
 * bytes, and score_max_i4 rounds its query to int8 again in every call:
 * HKV_SCORE_PIECE_SKETCH of them a piece. */
#define HKV_SCORE_PIECE 256
#define HKV_SCORE_PIECE_SKETCH 512

struct score_job;
struct score_member;

typedef struct hkv_score_team {
    const hkv_cpu_kernels *kern;
    int n;                          /* threads; thread i publishes in jobs[i] */
    struct score_job *jobs;         /* [n] */
    struct score_member *members;   /* [n] */
    hkv_score_par *par;             /* [n]: thread i's, for its selections */
} hkv_score_team;

/* For n threads (n >= 1); nothing allocated on failure. */
int hkv_score_team_init(hkv_score_team *t, const hkv_cpu_kernels *kern, int n, hkv_err *err);
void hkv_score_team_free(hkv_score_team *t);

/* Thread tid's scorer (NULL with one thread: the kernels directly). */
const hkv_score_par *hkv_score_team_par(const hkv_score_team *t, int tid);

/* Computes one piece of any thread's open job: 1, or 0 when none was
 * waiting. Threads call it wherever they would otherwise spin. */
int hkv_score_team_help(hkv_score_team *t);

/* One turn of a thread's wait for another's work: a pause, and after a few
 * thousand of them a yield of the core, so that a waiter on a machine with
 * more threads than free cores does not burn the time slice of the thread
 * it waits for. spins: the caller's counter, 0 at the wait's start. */
void hkv_spin_wait(unsigned *spins);

#endif
