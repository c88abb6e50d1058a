/* Private to tools/bench/bench_gpu*.c: the device benchmark's harness (timing,
 * rows, fills) and its row groups. */
#ifndef HKV_BENCH_GPU_IMPL_H
#define HKV_BENCH_GPU_IMPL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu_ctx.h"
#include "gpu_predict.h"

/* What a row's FLOPs run on, for their share of the data sheet's peak:
 * fp32 CUDA cores, fp16 tensor cores, or the split (3 tensor products per
 * useful one, so against a third of the tensor peak). */
enum bg_unit { BG_NONE = 0, BG_FP32, BG_TENSOR, BG_TENSOR_SPLIT };
/* Which data-sheet bandwidth a row's bytes go against. */
enum bg_link { BG_DRAM = 0, BG_PCIE };

typedef struct bg_row {
    char group[16];      /* copy, product, attn_decode, attn_prefill, policy, sync */
    char kernel[40];     /* "d2d", "q4 gemv", "q4 gemm split", ... */
    char shape[80];      /* for people */
    json_t *params;      /* the shape as JSON members ({"rows":4096,...}); bg_add's */
    double us;           /* device time per call, median of the reps */
    double enq_us;       /* host time to enqueue one call (median) */
    double bytes;        /* what the call must read and write once */
    double flops;        /* 0: not meaningful */
    int unit, link, reps;
} bg_row;

/* --only: the rows to run (the copies always run: they are the probe) */
enum { BG_ONLY_Q4 = 1, BG_ONLY_Q8 = 2, BG_ONLY_F16 = 4, BG_ONLY_ATTENTION = 8, BG_ONLY_POLICY = 16,
       BG_ONLY_SYNC = 32, BG_ONLY_ALL = 63 };

typedef struct bg {
    hkv_gpu_ctx *ctx;
    void *st, *ev0, *ev1;
    int reps, min_reps;        /* timed repetitions: up to reps, at least min_reps */
    int warm;                  /* a warm-up rep first */
    double row_s;              /* device seconds one row's reps should take at most */
    size_t cold_bytes;         /* what memory-bound rows rotate through (>> L2) */
    int quick, emulated, sm_count, json;
    unsigned only;             /* BG_ONLY_* bits: what to run besides the copies */
    const hkv_device_spec *spec;   /* NULL: the device is not in hkv_device_specs() */
    double d2d_gbs;            /* the device-to-device probe of this run */
    bg_row *rows;
    int n_rows, cap_rows;
} bg;

/* One call of the timed work, on copy `copy` of its data. */
typedef int (*bg_call)(void *arg, int copy, hkv_err *err);

/* Times fn: a warm-up rep (b->warm), then up to b->reps reps of per_rep
 * calls (copies taken in turn 0, 1, .., copies - 1, 0, .. across calls and
 * reps), each rep queued behind a spin on the stream (so its launches are
 * all queued before the device reaches it) between two events. Fills
 * row->us (median per call), row->enq_us, row->reps. */
int bg_time(bg *b, bg_call fn, void *arg, int copies, int per_rep, bg_row *row, hkv_err *err);
/* Append a measured row (text mode prints it at once) with its shape as
 * JSON members; takes params (NULL: jansson had no memory, an error). */
int bg_add(bg *b, const bg_row *row, json_t *params, hkv_err *err);

/* The median of v[0..n) (sorts v). */
double bg_median(double *v, int n);
/* How many copies of `bytes` make up b->cold_bytes (at least 1). */
int bg_copies(const bg *b, double bytes);
/* Device memory of `bytes` (WORKSPACE tier) holding random fp16 in
 * +-[0.5, 1) (kind BG_F16), fp32 in [-1, 1) (BG_F32) or bytes (BG_U8). */
enum { BG_U8 = 0, BG_F16, BG_F32 };
void *bg_alloc_random(bg *b, size_t bytes, int kind, uint64_t seed, hkv_err *err);
/* Host fills, OpenMP over chunks (seeded per chunk: the same at any thread count). */
void bg_fill(void *p, size_t bytes, int kind, uint64_t seed);

/* The row groups. bg_run_copies first: it measures b->d2d_gbs. */
int bg_run_copies(bg *b, hkv_err *err);
int bg_run_products(bg *b, hkv_err *err);
int bg_run_attention(bg *b, hkv_err *err);
int bg_run_policy(bg *b, hkv_err *err);
int bg_run_recall(bg *b, hkv_err *err);
int bg_run_build(bg *b, hkv_err *err);
int bg_run_sync(bg *b, hkv_err *err);

#endif
