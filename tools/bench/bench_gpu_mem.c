/* The device benchmark's data and its copy rows: random fills, the
 * device-to-device probe that every DRAM row is a share of, and pinned PCIe
 * copies each way. */
#include <stdlib.h>
#include <string.h>

#include "bench_gpu_impl.h"
#include "pinned.h"

#define FILL_CHUNK ((size_t)1 << 20)
#define STAGE_BYTES ((size_t)64 << 20)   /* host staging of bg_alloc_random */

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill_chunk(unsigned char *p, size_t n, int kind, uint64_t s)
{
    if (kind == BG_U8) {
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            uint64_t r = mix(&s);
            memcpy(p + i, &r, 8);
        }
        for (; i < n; i++) p[i] = (unsigned char)mix(&s);
    } else if (kind == BG_F16) {   /* sign, exponent -1, random mantissa: no subnormals */
        for (size_t i = 0; i + 2 <= n; i += 2) {
            uint16_t h = (uint16_t)((mix(&s) & 0x83ff) | 0x3800);
            memcpy(p + i, &h, 2);
        }
    } else {
        for (size_t i = 0; i + 4 <= n; i += 4) {
            float f = (float)((int64_t)(mix(&s) >> 40) - (1 << 23)) / (float)(1 << 23);
            memcpy(p + i, &f, 4);
        }
    }
}

void bg_fill(void *p, size_t bytes, int kind, uint64_t seed)
{
    const int64_t nc = (int64_t)((bytes + FILL_CHUNK - 1) / FILL_CHUNK);
    #pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nc; c++) {
        const size_t off = (size_t)c * FILL_CHUNK, n = bytes - off < FILL_CHUNK ? bytes - off : FILL_CHUNK;
        fill_chunk((unsigned char *)p + off, n, kind, seed * 0x100000001b3ull + (uint64_t)c);
    }
}

void *bg_alloc_random(bg *b, size_t bytes, int kind, uint64_t seed, hkv_err *err)
{
    void *d = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, bytes, err);
    if (!d) return NULL;
    /* one staging buffer's worth of random data, repeated: the values only
     * need to be ordinary numbers */
    const size_t sb = bytes < STAGE_BYTES ? bytes : STAGE_BYTES;
    void *h = malloc(sb);
    int rc = h ? HKV_OK : hkv_seterr(err, HKV_E_NOMEM, "bench: no host memory for %zu bytes", sb);
    if (h) bg_fill(h, sb, kind, seed);
    for (size_t off = 0; !rc && off < bytes; off += sb)
        rc = hkv_gpu_upload((char *)d + off, h, bytes - off < sb ? bytes - off : sb, b->st, err);
    if (!rc) rc = hkv_gpu_sync(b->st, err);
    free(h);
    if (rc) {
        hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, d, bytes);
        return NULL;
    }
    return d;
}

/* ---- copy rows --------------------------------------------------------------------- */

typedef struct cp_call {
    void *st, *dst;
    const void *src;
    size_t bytes;
    int dir;   /* 0 device to device, 1 host to device, 2 device to host */
} cp_call;

static int cp_fn(void *arg, int copy, hkv_err *err)
{
    const cp_call *c = arg;
    (void)copy;
    if (c->dir == 1) return hkv_gpu_upload(c->dst, c->src, c->bytes, c->st, err);
    if (c->dir == 2) return hkv_gpu_download(c->dst, c->src, c->bytes, c->st, err);
    return hkv_gpu_copy(c->dst, c->src, c->bytes, c->st, err);
}

int bg_run_copies(bg *b, hkv_err *err)
{
    /* the probe: far past L2 (50 MB on an H100/H200), as the products' cold sets */
    const size_t d2d = b->emulated ? (size_t)16 << 20 : b->quick ? (size_t)512 << 20 : (size_t)1 << 30;
    const size_t pcie = b->emulated ? (size_t)8 << 20 : (size_t)256 << 20;
    void *src = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, d2d, err), *dst = NULL;
    hkv_pinned hp = {0};
    int rc = src ? HKV_OK : err->code;
    if (!rc && !(dst = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, d2d, err))) rc = err->code;
    if (!rc) rc = hkv_gpu_memset(src, 0x3c, d2d, b->st, err);
    if (!rc) {
        bg_row r = {.group = "copy", .kernel = "d2d", .link = BG_DRAM, .bytes = 2.0 * d2d};
        snprintf(r.shape, sizeof r.shape, "%zu MiB (read + write)", d2d >> 20);
        cp_call c = {b->st, dst, src, d2d, 0};
        if (!(rc = bg_time(b, cp_fn, &c, 1, 1, &r, err))) {
            b->d2d_gbs = r.us > 0 ? r.bytes / (r.us * 1e3) : 0;
            rc = bg_add(b, &r, json_pack("{s:I}", "size", (json_int_t)d2d), err);
        }
    }
    /* pinned host memory: what the pipeline's per-step copies use */
    if (!rc)
        rc = hkv_pinned_alloc(&hp, NULL, NULL, HKV_TIER_WORKSPACE, pcie, -1, HKV_PIN_REQUIRE, err);
    if (!rc) memset(hp.p, 0x3c, pcie);
    for (int dir = 1; dir <= 2 && !rc; dir++) {
        bg_row r = {.group = "copy", .link = BG_PCIE, .bytes = (double)pcie};
        snprintf(r.kernel, sizeof r.kernel, "%s pinned", dir == 1 ? "h2d" : "d2h");
        snprintf(r.shape, sizeof r.shape, "%zu MiB", pcie >> 20);
        cp_call c = {b->st, dir == 1 ? dst : hp.p, dir == 1 ? hp.p : src, pcie, dir};
        if (!(rc = bg_time(b, cp_fn, &c, 1, 1, &r, err)))
            rc = bg_add(b, &r, json_pack("{s:I}", "size", (json_int_t)pcie), err);
    }
    hkv_pinned_free(&hp, NULL, NULL);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, dst, d2d);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, src, d2d);
    return rc;
}
