/* Shared by the gpu kernel tests: open a device or skip (exit 77, meson's
 * "skipped") with the reason, and device buffers that end the test with a
 * message when CUDA fails. Include after ../cpu/util.h (CHECK, RNG, fp16). */
#ifndef HKV_TEST_GPU_H
#define HKV_TEST_GPU_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "gpu_kernels.h"

#define GPU_SKIP 77

static inline void gpu_die(const char *what, const hkv_err *err)
{
    fprintf(stderr, "FAIL: %s: %s\n", what, err && err->msg[0] ? err->msg : "(no message)");
    exit(1);
}

/* The context on device 0, or exit 77 saying why there is none. Without a
 * device, context creation must still fail cleanly with a message (checked
 * here, so the skip path tests something too). */
static inline hkv_gpu_ctx *gpu_test_open(const char *name)
{
    hkv_gpu_device devs[8];
    int n = 0;
    char why[256] = "";
    hkv_gpu_query(devs, 8, &n, why, sizeof why);
    hkv_err err;
    hkv_err_clear(&err);
    hkv_gpu_ctx *ctx = NULL;
    int rc = hkv_gpu_ctx_create(&ctx, 0, NULL, 0, &err);
    if (n == 0) {
        if (rc == HKV_OK || ctx || !err.msg[0]) {
            fprintf(stderr, "FAIL: %s: no device reported, yet the context %s\n", name,
                    rc == HKV_OK ? "was created" : "failed without a message");
            exit(1);
        }
        printf("%s: SKIP: no CUDA device: %s (context creation fails cleanly: %s)\n", name, why,
               err.msg);
        exit(GPU_SKIP);
    }
    if (rc) gpu_die("creating the GPU context on a present device", &err);
    printf("%s: device 0: %s, cc %d.%d, %d SMs, %.1f GiB\n", name, devs[0].name, devs[0].cc_major,
           devs[0].cc_minor, devs[0].sm_count, devs[0].mem_total / 1073741824.0);
    return ctx;
}

/* Device copy of a host buffer (WORKSPACE tier); bytes may be 0 (1 byte then). */
static inline void *gpu_put(hkv_gpu_ctx *ctx, const void *src, size_t bytes)
{
    hkv_err err;
    hkv_err_clear(&err);
    void *p = hkv_gpu_alloc(ctx, HKV_TIER_WORKSPACE, bytes ? bytes : 1, &err);
    if (!p) gpu_die("device allocation", &err);
    if (src && bytes && hkv_gpu_upload(p, src, bytes, hkv_gpu_ctx_stream(ctx), &err))
        gpu_die("upload", &err);
    return p;
}

/* Device buffer of n floats plus HKV_TEST_GUARD guards, all NaN (0xff bytes). */
static inline float *gpu_poisoned(hkv_gpu_ctx *ctx, size_t n)
{
    hkv_err err;
    hkv_err_clear(&err);
    size_t b = (n + HKV_TEST_GUARD) * sizeof(float);
    float *p = (float *)hkv_gpu_alloc(ctx, HKV_TIER_WORKSPACE, b, &err);
    if (!p) gpu_die("device allocation", &err);
    if (hkv_gpu_memset(p, 0xff, b, hkv_gpu_ctx_stream(ctx), &err)) gpu_die("memset", &err);
    return p;
}

static inline void gpu_get(hkv_gpu_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    hkv_err err;
    hkv_err_clear(&err);
    void *s = hkv_gpu_ctx_stream(ctx);
    if (hkv_gpu_download(dst, src, bytes, s, &err) || hkv_gpu_sync(s, &err))
        gpu_die("download / kernel execution", &err);
}

/* Free a buffer from gpu_put / gpu_poisoned (bytes as asked there). */
static inline void gpu_drop(hkv_gpu_ctx *ctx, void *p, size_t bytes)
{
    hkv_gpu_free(ctx, HKV_TIER_WORKSPACE, p, bytes ? bytes : 1);
}

/* A kernel call that must succeed. */
#define GPU_OK(call)                                                               \
    do {                                                                           \
        hkv_err e_;                                                                \
        hkv_err_clear(&e_);                                                        \
        hkv_err *err = &e_;                                                        \
        if ((call) != HKV_OK) gpu_die(#call, err);                                 \
    } while (0)

/* Attention: compare one head's (out, lse) to the reference; returns 1 if within
 * max|out - ref| <= 1e-4 max|ref| and |lse - ref| <= 1e-4 max(1, |ref|) (the
 * cpu kernels' bounds); worst gets the larger relative error. */
static inline int gpu_head_ok(const float *o, float l, const double *ro, double rl, int d, double *worst)
{
    double mx = 0, e = 0;
    for (int c = 0; c < d; c++) mx = fmax(mx, fabs(ro[c]));
    for (int c = 0; c < d; c++) {
        if (isnan(o[c])) return 0;
        e = fmax(e, fabs(o[c] - ro[c]));
    }
    if (rl == -INFINITY) return l == -INFINITY && e == 0;
    double el = fabs(l - rl) / fmax(1, fabs(rl));
    e = mx > 0 ? e / mx : e;
    *worst = fmax(*worst, fmax(e, el));
    return e <= 1e-4 && el <= 1e-4;
}

#endif
