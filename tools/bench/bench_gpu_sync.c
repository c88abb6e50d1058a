/* The device benchmark's sync rows: how long the host takes to learn that
 * the device is done, asleep on a blocking-sync event (the driver's
 * interrupt wakes it) against polling the event (hkv_gpu_event_wait), for a
 * short kernel alone and for one layer's round trip of the split at batch 1
 * (the far partial up, a kernel, the next QKV rows down). The pipeline waits
 * so once a layer (pipeline/cuda_attention.c), and `plan --predict` counts a
 * host wake per layer (t_host): these rows measure it.
 *
 * Wall-clock rows, unlike the rest: each rep queues its work on an idle
 * stream and waits, and `us` is the median of the host's time from the
 * first call to the wait's return, enq_us of the queueing alone. */
#include <string.h>

#include "bench_gpu_impl.h"
#include "engine.h"   /* hkv_now */
#include "pinned.h"

#define SYNC_REPS 200
#define SYNC_KERNEL_US 20.0   /* stands in for the device's work between the waits */

/* Llama-3-8B at batch 1: the far partial (32 heads x 128 fp32, and an lse a
 * head) up, the QKV rows (6,144 fp32) down. */
#define SYNC_UP_BYTES ((size_t)32 * 128 * 4 + 32 * 4)
#define SYNC_DOWN_BYTES ((size_t)6144 * 4)

typedef struct sync_io {
    void *dev, *host;   /* SYNC_UP_BYTES + SYNC_DOWN_BYTES each */
} sync_io;

/* One rep: the work queued, then the wait (spin_us 0: asleep at once). */
static int sync_rep(bg *b, const sync_io *io, double spin_us, double *wall, double *enq, hkv_err *err)
{
    const double t0 = hkv_now();
    int rc;
    if (io && (rc = hkv_gpu_upload(io->dev, io->host, SYNC_UP_BYTES, b->st, err))) return rc;
    if ((rc = hkv_gpu_spin(SYNC_KERNEL_US, b->st, err))) return rc;
    if (io && (rc = hkv_gpu_download((char *)io->host + SYNC_UP_BYTES, (char *)io->dev + SYNC_UP_BYTES,
                                     SYNC_DOWN_BYTES, b->st, err)))
        return rc;
    if ((rc = hkv_gpu_event_record(b->ev1, b->st, err))) return rc;
    *enq = hkv_now() - t0;
    int slept = 0;
    if ((rc = hkv_gpu_event_wait(b->ev1, spin_us, &slept, err))) return rc;
    *wall = hkv_now() - t0;
    return HKV_OK;
}

/* The pair of rows, asleep and polled, their reps taken in turn so that a
 * drifting machine moves both. */
static int sync_pair(bg *b, const sync_io *io, hkv_err *err)
{
    const int reps = b->emulated ? 5 : b->quick ? SYNC_REPS / 2 : SYNC_REPS;
    double wall[2][SYNC_REPS], enq[2][SYNC_REPS];
    int rc;
    if ((rc = hkv_gpu_sync(b->st, err))) return rc;
    for (int r = 0; r < reps; r++)
        for (int poll = 0; poll < 2; poll++)   /* a poll long enough for any rep, or none */
            if ((rc = sync_rep(b, io, poll ? 1e6 : 0, &wall[poll][r], &enq[poll][r], err))) return rc;
    for (int poll = 0; poll < 2 && !rc; poll++) {
        bg_row row = {.group = "sync", .link = BG_PCIE, .reps = reps,
                      .us = bg_median(wall[poll], reps) * 1e6, .enq_us = bg_median(enq[poll], reps) * 1e6,
                      .bytes = io ? (double)(SYNC_UP_BYTES + SYNC_DOWN_BYTES) : 0};
        snprintf(row.kernel, sizeof row.kernel, "%s %s", io ? "round trip" : "wait",
                 poll ? "polled" : "slept");
        if (io)
            snprintf(row.shape, sizeof row.shape, "%.1f KB up, %.0f us kernel, %.1f KB down",
                     SYNC_UP_BYTES / 1e3, SYNC_KERNEL_US, SYNC_DOWN_BYTES / 1e3);
        else
            snprintf(row.shape, sizeof row.shape, "a %.0f us kernel, its event", SYNC_KERNEL_US);
        rc = bg_add(b, &row,
                    json_pack("{s:s, s:f, s:I, s:I}", "wait", poll ? "poll" : "sleep", "kernel_us",
                              SYNC_KERNEL_US, "up_bytes", (json_int_t)(io ? SYNC_UP_BYTES : 0),
                              "down_bytes", (json_int_t)(io ? SYNC_DOWN_BYTES : 0)),
                    err);
    }
    return rc;
}

int bg_run_sync(bg *b, hkv_err *err)
{
    if (!(b->only & BG_ONLY_SYNC)) return HKV_OK;
    const size_t bytes = SYNC_UP_BYTES + SYNC_DOWN_BYTES;
    sync_io io = {0};
    hkv_pinned hp = {0};
    int rc = hkv_pinned_alloc(&hp, NULL, NULL, HKV_TIER_WORKSPACE, bytes, -1, HKV_PIN_REQUIRE, err);
    if (!rc && !(io.dev = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, bytes, err))) rc = err->code;
    if (!rc) {
        memset(hp.p, 0x3c, bytes);
        io.host = hp.p;
    }
    if (!rc) rc = sync_pair(b, NULL, err);
    if (!rc) rc = sync_pair(b, &io, err);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, io.dev, bytes);
    hkv_pinned_free(&hp, NULL, NULL);
    return rc;
}
