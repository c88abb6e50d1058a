/* Flash-decoding (hkv_gpu_attn_decode_split) against the float64 reference:
 * the key range of each (sequence, KV head) cut into 1..32 chunks of whole
 * tiles, partials combined exactly. Cases: lengths 0, 1, a tile and around
 * it, long; more splits than the length has tiles (empty splits write the
 * empty partial); contiguous and gathered rows; 16-byte aligned rows (the
 * 128-bit load path) and rows at a 4-byte stride (the 32-bit path); GQA
 * 1..8 with d = 32..256. Outputs poisoned with guards that must stay NaN;
 * the split result must also equal the unsplit kernel's within rounding,
 * and with the queries read in place at a QKV row's stride
 * (hkv_gpu_attn_decode_split_q) the packed queries' result bit for bit.
 * Plus the split count rule and the workspace checks (too small, missing,
 * misaligned, n_split out of range, a bad query stride: each a clear error,
 * nothing written).
 * Bounds as test_gpu_attn.c: per head max|out - ref| <= 1e-4 max|ref|,
 * |lse - ref| <= 1e-4 max(1, |ref|). */
#include "ref.h"
#include "util.h"
#include "gpu_test.h"

typedef struct dcase { int H, KH, d, n_seq, ld_pad, n_split, use_idx; int64_t cap; } dcase;

static void run_case(hkv_gpu_ctx *ctx, const dcase *c, test_rng *rng)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    const int H = c->H, KH = c->KH, d = c->d, g = H / KH, S = c->n_split;
    const int64_t cap = c->cap, ld = d + c->ld_pad, hs = cap * ld, ss = KH * hs;
    const int64_t npair = (int64_t)c->n_seq * KH, rows = (int64_t)c->n_seq * H;
    const int32_t lens[] = {0, 1, 31, 32, 33, (int32_t)cap, (int32_t)(cap * 2 / 3), 97};
    uint16_t *k = malloc(c->n_seq * ss * 2), *v = malloc(c->n_seq * ss * 2);
    for (int64_t i = 0; i < c->n_seq * ss; i++) k[i] = rng_half(rng, -1, 1), v[i] = rng_half(rng, -1, 1);
    float *q = malloc(rows * d * 4);
    for (int64_t i = 0; i < rows * d; i++) q[i] = 2.0f * rng_nonzero(rng, -1, 1);
    int32_t *nr = malloc(npair * 4), *idx = malloc(npair * cap * 4);
    for (int64_t u = 0; u < npair; u++) {
        nr[u] = lens[(u + c->n_seq) % 8] > cap ? (int32_t)cap : lens[(u + c->n_seq) % 8];
        int32_t *ix = idx + u * cap;
        for (int64_t i = 0; i < cap; i++) ix[i] = (int32_t)i;
        for (int64_t i = cap - 1; i > 0; i--) {
            int64_t j = (int64_t)(rng_next(rng) % (uint64_t)(i + 1));
            int32_t t = ix[i];
            ix[i] = ix[j], ix[j] = t;
        }
    }
    uint16_t *dk = gpu_put(ctx, k, c->n_seq * ss * 2), *dv = gpu_put(ctx, v, c->n_seq * ss * 2);
    float *dq = gpu_put(ctx, q, rows * d * 4);
    int32_t *dnr = gpu_put(ctx, nr, npair * 4), *didx = gpu_put(ctx, idx, npair * cap * 4);
    const size_t wsb = hkv_gpu_attn_decode_ws_bytes(c->n_seq, H, d, S);
    void *ws = wsb ? gpu_poisoned(ctx, wsb / 4) : NULL;
    float *dout = gpu_poisoned(ctx, rows * d), *dlse = gpu_poisoned(ctx, rows);
    float *d1 = gpu_poisoned(ctx, rows * d), *dl1 = gpu_poisoned(ctx, rows);
    const float scale = 1.0f / sqrtf((float)d);
    /* use_idx 2: runs, each pair's rows from a start of its own (idx_ld 0), here
     * the pair's own data addressed from the buffer's start (ss 0) */
    int32_t *starts = malloc(npair * 4);
    for (int64_t u = 0; u < npair; u++) starts[u] = (int32_t)((u / KH) * (ss / ld));
    int32_t *dst = gpu_put(ctx, starts, npair * 4);
    const int32_t *ix = c->use_idx == 1 ? didx : c->use_idx == 2 ? dst : NULL;
    const int64_t ix_ld = c->use_idx == 2 ? 0 : cap, call_ss = c->use_idx == 2 ? 0 : ss;
    GPU_OK(hkv_gpu_attn_decode_split(dq, c->n_seq, H, KH, d, dk, dv, ld, hs, call_ss, dnr, ix, ix_ld,
                                     scale, dout, dlse, S, ws, wsb, st, err));
    GPU_OK(hkv_gpu_attn_decode(dq, c->n_seq, H, KH, d, dk, dv, ld, hs, call_ss, dnr, ix, ix_ld, scale,
                               d1, dl1, st, err));
    /* the queries read in place from QKV-like rows (stride (H + 2 KH) d, K
     * and V values between them): the same result, bit for bit */
    const int64_t ldq = (int64_t)(H + 2 * KH) * d;
    float *qs = malloc((size_t)c->n_seq * ldq * 4);
    for (int64_t i = 0; i < c->n_seq * ldq; i++) qs[i] = 1e30f;
    for (int sq = 0; sq < c->n_seq; sq++) memcpy(qs + sq * ldq, q + (int64_t)sq * H * d, (size_t)H * d * 4);
    float *dqs = gpu_put(ctx, qs, c->n_seq * ldq * 4);
    float *d2 = gpu_poisoned(ctx, rows * d), *dl2 = gpu_poisoned(ctx, rows);
    GPU_OK(hkv_gpu_attn_decode_split_q(dqs, ldq, c->n_seq, H, KH, d, dk, dv, ld, hs, call_ss, dnr, ix,
                                       ix_ld, scale, d2, dl2, S, ws, wsb, st, err));
    gpu_drop(ctx, dst, npair * 4);
    free(starts);
    float *out = malloc((rows * d + HKV_TEST_GUARD) * 4), *lse = malloc((rows + HKV_TEST_GUARD) * 4);
    float *o1 = malloc(rows * d * 4), *l1 = malloc(rows * 4);
    gpu_get(ctx, out, dout, (rows * d + HKV_TEST_GUARD) * 4);
    gpu_get(ctx, lse, dlse, (rows + HKV_TEST_GUARD) * 4);
    gpu_get(ctx, o1, d1, rows * d * 4);
    gpu_get(ctx, l1, dl1, rows * 4);
    float *o2 = malloc(rows * d * 4), *l2 = malloc(rows * 4);
    gpu_get(ctx, o2, d2, rows * d * 4);
    gpu_get(ctx, l2, dl2, rows * 4);
    CHECK(!memcmp(o2, out, rows * d * 4) && !memcmp(l2, lse, rows * 4),
          "H=%d KH=%d d=%d seqs %d, %d splits: queries at a stride of %lld differ from the packed "
          "ones", H, KH, d, c->n_seq, S, (long long)ldq);
    gpu_drop(ctx, dqs, c->n_seq * ldq * 4);
    gpu_drop(ctx, d2, (rows * d + HKV_TEST_GUARD) * 4), gpu_drop(ctx, dl2, (rows + HKV_TEST_GUARD) * 4);
    free(qs), free(o2), free(l2);
    double *ro = malloc((size_t)g * d * sizeof *ro), *rl = malloc((size_t)g * sizeof *rl), worst = 0;
    int bad = 0, vs_unsplit = 0;
    for (int s = 0; s < c->n_seq; s++)
        for (int h = 0; h < KH; h++) {
            const int64_t u = (int64_t)s * KH + h;
            ref_attn(q + ((int64_t)s * H + h * g) * d, g, d, k + s * ss + h * hs, v + s * ss + h * hs,
                     ld, c->use_idx == 1 ? idx + u * cap : NULL, nr[u], scale, ro, rl);
            for (int j = 0; j < g; j++) {
                const int64_t qh = (int64_t)s * H + h * g + j;
                bad += !gpu_head_ok(out + qh * d, lse[qh], ro + j * d, rl[j], d, &worst);
                for (int e = 0; e < d; e++)
                    vs_unsplit += !(fabsf(out[qh * d + e] - o1[qh * d + e]) <= 2e-5f);
                vs_unsplit += lse[qh] == -INFINITY ? l1[qh] != -INFINITY
                                                   : !(fabsf(lse[qh] - l1[qh]) <= 2e-5f * fmaxf(1, fabsf(l1[qh])));
            }
        }
    CHECK(bad == 0 && vs_unsplit == 0 && guard_intact(out, rows * d) && guard_intact(lse, rows),
          "split decode H=%d KH=%d d=%d seqs %d ld %lld (%s loads) %s, %d splits: %d heads off the "
          "reference (worst %.3g), %d values off the unsplit kernel", H, KH, d, c->n_seq,
          (long long)ld, ld % 8 ? "32-bit" : "128-bit", c->use_idx == 1 ? "gathered" : c->use_idx == 2 ? "runs from a start" : "contiguous", S,
          bad, worst, vs_unsplit);
    gpu_drop(ctx, dk, c->n_seq * ss * 2), gpu_drop(ctx, dv, c->n_seq * ss * 2);
    gpu_drop(ctx, dq, rows * d * 4), gpu_drop(ctx, dnr, npair * 4), gpu_drop(ctx, didx, npair * cap * 4);
    if (ws) gpu_drop(ctx, ws, (wsb / 4 + HKV_TEST_GUARD) * 4);
    gpu_drop(ctx, dout, (rows * d + HKV_TEST_GUARD) * 4), gpu_drop(ctx, dlse, (rows + HKV_TEST_GUARD) * 4);
    gpu_drop(ctx, d1, (rows * d + HKV_TEST_GUARD) * 4), gpu_drop(ctx, dl1, (rows + HKV_TEST_GUARD) * 4);
    free(k), free(v), free(q), free(nr), free(idx), free(out), free(lse), free(o1), free(l1);
    free(ro), free(rl);
}

/* The split count: two waves of blocks, no split under two tiles, capped. */
static void test_splits_rule(void)
{
    /* Llama-3-8B at batch 1 on an RTX 4090 (128 SMs): 8 blocks, 32K keys */
    CHECK(hkv_gpu_attn_decode_splits(128, 1, 32, 8, 32768) == 32, "8 KV heads, 128 SMs, 32K keys: "
          "%d splits", hkv_gpu_attn_decode_splits(128, 1, 32, 8, 32768));
    /* 260 near rows (4 sinks + 256 local): at most 4 splits of 64 keys */
    CHECK(hkv_gpu_attn_decode_splits(128, 1, 32, 8, 260) == 4, "260 rows: %d splits",
          hkv_gpu_attn_decode_splits(128, 1, 32, 8, 260));
    /* a batch that fills the device already: no split */
    CHECK(hkv_gpu_attn_decode_splits(128, 64, 32, 8, 32768) == 1, "64 x 8 blocks: %d splits",
          hkv_gpu_attn_decode_splits(128, 64, 32, 8, 32768));
    /* 16 sequences: 128 blocks, one wave more wanted */
    CHECK(hkv_gpu_attn_decode_splits(128, 16, 32, 8, 32768) == 2, "16 x 8 blocks: %d splits",
          hkv_gpu_attn_decode_splits(128, 16, 32, 8, 32768));
    CHECK(hkv_gpu_attn_decode_splits(132, 1, 32, 8, 10) == 1, "10 keys: %d splits",
          hkv_gpu_attn_decode_splits(132, 1, 32, 8, 10));
    CHECK(hkv_gpu_attn_decode_splits(0, 1, 32, 8, 1000) == 1 && hkv_gpu_attn_decode_splits(128, 1, 32, 8, 0) == 1,
          "degenerate arguments give one split");
}

/* Misuse: each a clear error before anything is launched. */
static void test_bad_args(hkv_gpu_ctx *ctx)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    const int H = 4, KH = 2, d = 64;
    uint16_t *dk = gpu_put(ctx, NULL, 64 * d * 2 * KH), *dv = gpu_put(ctx, NULL, 64 * d * 2 * KH);
    float *dq = gpu_put(ctx, NULL, H * d * 4), *dout = gpu_poisoned(ctx, H * d), *dl = gpu_poisoned(ctx, H);
    int32_t nr[2] = {64, 64};
    int32_t *dnr = gpu_put(ctx, nr, sizeof nr);
    const size_t need = hkv_gpu_attn_decode_ws_bytes(1, H, d, 4);
    char *ws = gpu_put(ctx, NULL, need + 16);
    struct { int S; void *w; size_t b; const char *what; } bad[] = {
        {4, NULL, 0, "workspace"}, {4, ws, need - 4, "workspace"}, {4, ws + 4, need, "aligned"},
        {0, ws, need, "splits"}, {HKV_GPU_DECODE_MAX_SPLIT + 1, ws, need * 16, "splits"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        hkv_err e;
        hkv_err_clear(&e);
        int rc = hkv_gpu_attn_decode_split(dq, 1, H, KH, d, dk, dv, d, 64 * d, 0, dnr, NULL, 1, 1.0f,
                                           dout, dl, bad[i].S, bad[i].w, bad[i].b, st, &e);
        CHECK(rc == HKV_E_INVAL && strstr(e.msg, bad[i].what), "bad case %zu: rc %d, '%s'", i, rc,
              e.msg);
    }
    for (int i = 0; i < 2; i++) {   /* a query stride under a row, or not a multiple of 4 */
        hkv_err e;
        hkv_err_clear(&e);
        int rc = hkv_gpu_attn_decode_split_q(dq, i ? H * d + 2 : H * d - 4, 1, H, KH, d, dk, dv, d,
                                             64 * d, 0, dnr, NULL, 1, 1.0f, dout, dl, 1, NULL, 0, st,
                                             &e);
        CHECK(rc == HKV_E_INVAL && strstr(e.msg, "q stride"), "bad q stride %d: rc %d, '%s'", i, rc,
              e.msg);
    }
    float o[4 * 64];
    gpu_get(ctx, o, dout, sizeof o);
    int untouched = 1;
    for (int i = 0; i < H * d; i++) untouched &= isnan(o[i]);
    CHECK(untouched, "a refused call wrote its output");
    CHECK(hkv_gpu_attn_decode_ws_bytes(1, H, d, 1) == 0, "one split needs no workspace");
}

int main(void)
{
    hkv_gpu_ctx *ctx = gpu_test_open("gpu_decode_split");
    test_rng rng = {41};
    const dcase cases[] = {
        /* H KH d seqs pad splits idx cap */
        {32, 8, 128, 1, 0, 8, 0, 600},    /* Llama-3-8B's heads, 128-bit loads */
        {32, 8, 128, 1, 8, 32, 1, 600},   /* 32 splits of a tile, gathered */
        {9, 3, 64, 3, 2, 4, 0, 300},      /* 4-byte rows: the 32-bit path */
        {9, 3, 64, 3, 0, 5, 1, 300},
        {4, 4, 256, 2, 0, 3, 0, 200},
        {2, 1, 32, 4, 0, 32, 0, 97},      /* more splits than tiles: empty splits */
        {16, 2, 64, 2, 0, 2, 1, 1000},    /* g = 8: a full block of warps */
        {32, 8, 128, 3, 0, 4, 2, 700},    /* the near tier's form: a start per pair (idx_ld 0) */
        {9, 3, 64, 2, 8, 1, 2, 300},
        {24, 2, 64, 1, 0, 6, 0, 500},     /* g = 12: two warp groups (grid y) */
        {8, 2, 128, 2, 0, 1, 0, 300},     /* one split: the unsplit path through the same door */
        {16, 2, 256, 1, 0, 3, 1, 200},    /* d = 256, g = 8: two blocks of 4 heads (grid y) */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(ctx, &cases[i], &rng);
    test_splits_rule();
    test_bad_args(ctx);
    hkv_gpu_ctx_destroy(ctx);
    return test_report("gpu_decode_split");
}
