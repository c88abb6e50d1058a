/* Products on int8 activations (precision FAST), AVX512-VNNI: the
 * activations are quantised per 32-block once per call (hkv_qact), and
 * vpdpbusd multiplies the weights' integers by them, 64 multiply-adds per
 * instruction where the fp32 GEMV does 16.
 *
 * Lanes are rows: 16 consecutive rows are decoded together, a block of
 * them becoming 8 vectors whose int32 lane l holds 4 weights of row l
 * (elements 4k..4k+3 of the block in vector k), and each token's 4
 * matching activation bytes are broadcast to all lanes by vpdpbusd's own
 * {1to16} memory operand. Eight vpdpbusd give a block's integer dot
 * product for 16 rows and one token; the scales then apply lane-wise:
 *   acc += float(isum) * (sw * dx)        (+ Q4: acc += min * sum(x))
 * 3-4 fp32 ops per 8 vpdpbusd, whatever the row length. The lane-per-block
 * layout used before (lane l = block l of one row) needed a reduction of
 * 16 lanes per (row, token) and wasted the dead lanes of a row's last
 * group: on SmolLM2's 576-column rows (18 blocks) it ran at 11% of the
 * int8 peak; measured side by side in bench/cpu_kernels.md.
 *
 * Decoding (16 rows x 64 bytes loaded, a 16 x 16 dword transpose, Q4's
 * nibbles split, Q8 offset to unsigned; the block scales transposed to
 * 16-row float vectors the same way) runs once per 16 rows and CB blocks
 * into a 20 KB buffer in L1, and every tile of tokens reuses it, so at
 * n = 64 it costs under one op per (token, block).
 *
 * Signedness: vpdpbusd multiplies unsigned (the register) by signed (the
 * broadcast) bytes. Q4 nibbles are 0..15, already unsigned. Q8 weights are
 * offset to w + 128 (an xor of the sign bit) and the quantiser's
 * 128 * sum(q) per block (hkv_qact.sa) is subtracted in int32: exact.
 * Q4's min term uses the block's float sum of the unquantised activations
 * (hkv_qact.sx): min * sum(x), so only the scale term sees quantisation.
 *
 * Batch invariance: a (row, token) accumulator sees the same operations in
 * the same order (blocks in order, one exact integer sum and the same fp32
 * ops per block) whatever row group, token tile or number of tokens it
 * sits in; between passes of CB blocks it waits in y, stored and reloaded
 * exactly.
 *
 * Compiled with AVX512-VNNI; reached only through the table, which has it
 * only where hkv_isa_detect saw VNNI. */
#include <immintrin.h>
#include <string.h>

#include "kernels_impl.h"

#define RG 16   /* rows per group: one per int32 lane */
#ifndef QG_CB
#define QG_CB 32
#endif
#ifndef QG_T
#define QG_T 8     /* tokens per tile: T int32 and T float accumulators, the independent
                    * vpdpbusd chains that cover its latency */
#endif
#define QG_TMAX 12
#ifndef QG_DIRECT
#define QG_DIRECT 2   /* up to this many tokens: no pass buffer (qdirect) */
#endif
_Static_assert(QG_DIRECT >= 0 && QG_DIRECT <= 4, "QDIRECT covers T = 1..4");
/* Software prefetch of the next 16-row group (the same offsets 16 rows on,
 * one group's bytes ahead: a group is one contiguous stretch of the
 * matrix) as each line of this one is loaded: hardware prefetchers lose
 * track of 16-48 interleaved row streams. Prefetches past the matrix end
 * touch nothing (they never fault). */
#ifndef QG_PREFETCH
#define QG_PREFETCH 1
#endif
#ifndef QG_PF_GROUPS
#define QG_PF_GROUPS 1   /* how many groups ahead */
#endif
_Static_assert(QG_T >= 1 && QG_T <= QG_TMAX, "QTILE covers T = 1..12");

#define HKV_VINLINE static inline __attribute__((always_inline))

/* ---- quantisation -------------------------------------------------------- */

void hkv_quant_act_avx512vnni(const float *x, int64_t i0, int64_t i1, const hkv_qact *a)
{
    const int64_t cols = a->cols, nb = cols / HKV_WBLOCK;
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (int64_t i = i0; i < i1; i++) {
        const float *xr = x + i * cols;
        int8_t *q = a->q + i * cols;
        float *d = a->d + i * nb, *sx = a->sx + i * nb;
        int32_t *sa = a->sa + i * nb;
        for (int64_t b = 0; b < nb; b++) {
            __m512 v0 = _mm512_loadu_ps(xr + b * 32), v1 = _mm512_loadu_ps(xr + b * 32 + 16);
            float amax = _mm512_reduce_max_ps(
                _mm512_max_ps(_mm512_and_ps(v0, absmask), _mm512_and_ps(v1, absmask)));
            /* below 1e-30 (or NaN) the block quantises to zero: 127 / amax
             * would overflow; the min term still gets the exact sum */
            const int live = amax >= 1e-30f;
            const float id = live ? 127.0f / amax : 0.0f;
            /* round to nearest even (MXCSR default), as rintf */
            __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
            __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
            q0 = _mm512_max_epi32(_mm512_min_epi32(q0, hi), lo);
            q1 = _mm512_max_epi32(_mm512_min_epi32(q1, hi), lo);
            _mm_storeu_si128((__m128i *)(q + b * 32), _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(q + b * 32 + 16), _mm512_cvtepi32_epi8(q1));
            d[b] = live ? amax / 127.0f : 0.0f;
            sx[b] = _mm512_reduce_add_ps(_mm512_add_ps(v0, v1));
            sa[b] = 128 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        }
    }
}

/* ---- 16 rows to lane-per-row vectors ------------------------------------- */

/* o[i] lane l = dword i of r[l]: unpack 32, unpack 64 (4 x 4 inside each
 * 128-bit lane), then the 128-bit lanes 4 x 4 across registers; 64 ops. */
HKV_VINLINE void transpose16(const __m512i r[16], __m512i o[16])
{
    __m512i t[16], u[16];
#pragma GCC unroll 16
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* u[4i+j], 128-bit lane L = dword 4L+j of rows 4i..4i+3 */
#pragma GCC unroll 16
    for (int i = 0; i < 4; i++) {
        u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
#pragma GCC unroll 16
    for (int j = 0; j < 4; j++) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44);
        const __m512i v1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xee);
        const __m512i v2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44);
        const __m512i v3 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xee);
        o[0 + j] = _mm512_shuffle_i32x4(v0, v2, 0x88);
        o[4 + j] = _mm512_shuffle_i32x4(v0, v2, 0xdd);
        o[8 + j] = _mm512_shuffle_i32x4(v1, v3, 0x88);
        o[12 + j] = _mm512_shuffle_i32x4(v1, v3, 0xdd);
    }
}

/* Blocks [b0, b0 + nbc) of rows r..r+nr-1 (nr <= 16; lanes past nr are
 * never stored), decoded. */
typedef struct qgroup {
    __m512i w[QG_CB][8];   /* block b, vector k: lane l = elements 4k..4k+3 of row l, unsigned */
    __m512 sw[QG_CB];      /* lane l = row l's block scale */
    __m512 mw[QG_CB];      /* Q4: row l's block min */
} qgroup;

/* 16 fp16 per row (the first n of them) to float, transposed: o[i] lane l
 * = row l's i-th. p is at block b of the group's first row. */
HKV_VINLINE void scales16(const uint16_t *p, int64_t ld, int64_t b, int nr, int n, __m512 *dst)
{
    const __mmask16 mk = (__mmask16)((1u << n) - 1);
    __m512i r[16], o[16];
    /* the next group's scales, in address order: 16 rows of ld, 32 bytes a
     * row per call */
    const char *pf = (const char *)(p + 16 * QG_PF_GROUPS * ld - b) + b * 32;
#pragma GCC unroll 16
    for (int l = 0; l < 16; l++) {
        if (QG_PREFETCH && l < 8) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);
        r[l] = l < nr ? _mm512_castps_si512(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, p + l * ld)))
                      : _mm512_setzero_si512();
    }
    transpose16(r, o);
    for (int i = 0; i < n; i++) dst[i] = _mm512_castsi512_ps(o[i]);
}

/* Rows r..r+nr-1 from block b: 64 bytes each (Q4: blocks b..b+3, Q8:
 * b..b+1; nbl of them live), transposed: O[i] lane l = dword i of row l's
 * 64 bytes (Q8 already offset to unsigned). */
HKV_VINLINE void load_rows(const hkv_wmat *m, const int q4, int64_t r, int nr, int64_t b, int nbl,
                           __m512i O[16])
{
    const int64_t rs = q4 ? m->cols / 2 : m->cols;   /* bytes a row */
    const char *q = (const char *)m->q + r * rs + b * (q4 ? 16 : 32);
    const __mmask16 mk = (__mmask16)((1u << ((q4 ? 4 : 8) * nbl)) - 1);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512i R[16];
    /* the next group's 16 x 64 bytes at these blocks, in address order (its
     * rows one after another: a load_rows call per 64 bytes of a row covers
     * the group exactly) */
    const char *pf = (const char *)m->q + (r + 16 * QG_PF_GROUPS) * rs + b * (q4 ? 16 : 32) * 16;
#pragma GCC unroll 16
    for (int l = 0; l < 16; l++) {
        if (QG_PREFETCH) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);
        R[l] = l < nr ? _mm512_maskz_loadu_epi32(mk, q + l * rs) : _mm512_setzero_si512();
        if (!q4) R[l] = _mm512_xor_si512(R[l], flip);
    }
    transpose16(R, O);
}

/* The 8 vectors of block L of a load_rows result: lane l = elements
 * 4k..4k+3 of row l's block, unsigned. Q4 dword j holds elements 4j.. in
 * its low nibbles and 16+4j.. in its high ones. */
HKV_VINLINE void block_vectors(const __m512i O[16], const int q4, int L, __m512i W[8])
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    if (q4) {
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            W[j] = _mm512_and_si512(O[4 * L + j], m4);
            W[4 + j] = _mm512_and_si512(_mm512_srli_epi32(O[4 * L + j], 4), m4);
        }
    } else {
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) W[j] = O[8 * L + j];
    }
}

static void decode_group(const hkv_wmat *m, int64_t r, int nr, int64_t b0, int nbc, qgroup *g)
{
    const int64_t nb = m->cols / HKV_WBLOCK;
    const int q4 = m->type == HKV_W_Q4, step = q4 ? 4 : 2;
    __m512i O[16];
    for (int bb = 0; bb < nbc; bb += step) {
        const int nbl = nbc - bb < step ? nbc - bb : step;
        load_rows(m, q4, r, nr, b0 + bb, nbl, O);
        for (int L = 0; L < nbl; L++) block_vectors(O, q4, L, g->w[bb + L]);
    }
    for (int bb = 0; bb < nbc; bb += 16) {
        const int n = nbc - bb < 16 ? nbc - bb : 16;
        scales16(m->scale + r * nb + b0 + bb, nb, b0 + bb, nr, n, g->sw + bb);
        if (q4) scales16(m->min + r * nb + b0 + bb, nb, b0 + bb, nr, n, g->mw + bb);
    }
}

/* ---- the tile: 16 rows x T tokens over a decoded pass --------------------- */

HKV_VINLINE int32_t act4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* One block (absolute index blk) of 16 rows for tokens t0..t0+T-1: the
 * exact integer sums, then acc[t] += float(isum) * (sw * dx) (Q8: isum less
 * the offset's 128 * sum(q); Q4: then acc[t] += min * sum(x)). Every path
 * runs this, so a (row, token) sees the same ops whatever the path. */
HKV_VINLINE void block_mac(const __m512i w[8], __m512 sw, __m512 mw, const int q4, const hkv_qact *a,
                           int64_t t0, const int T, int64_t blk, __m512 acc[QG_TMAX])
{
    const int64_t nb = a->cols / HKV_WBLOCK;
    const int8_t *aq = a->q + t0 * a->cols + blk * 32;
    __m512i is[QG_TMAX];
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) is[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const __m512i wk = w[k];
#pragma GCC unroll 16
        for (int t = 0; t < T; t++)
            is[t] = _mm512_dpbusd_epi32(is[t], wk, _mm512_set1_epi32(act4(aq + t * a->cols + 4 * k)));
    }
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) {
        const int64_t so = (t0 + t) * nb + blk;
        if (!q4) is[t] = _mm512_sub_epi32(is[t], _mm512_set1_epi32(a->sa[so]));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[t]), _mm512_mul_ps(sw, _mm512_set1_ps(a->d[so])), acc[t]);
        if (q4) acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a->sx[so]), acc[t]);
    }
}

/* Tokens t0..t0+T-1 over blocks b0..b0+nbc-1 of a decoded pass: acc[t]
 * lane l is (row r+l, token t0+t), continued from y when b0 > 0. */
HKV_VINLINE void qtile(const qgroup *g, const int q4, const hkv_qact *a, int64_t t0, const int T,
                       int64_t b0, int nbc, int64_t r, __mmask16 rmask, float *y, int64_t ldy)
{
    __m512 acc[QG_TMAX];
#pragma GCC unroll 16
    for (int t = 0; t < T; t++)
        acc[t] = b0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(rmask, y + (t0 + t) * ldy + r);
    for (int b = 0; b < nbc; b++) block_mac(g->w[b], g->sw[b], g->mw[b], q4, a, t0, T, b0 + b, acc);
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(y + (t0 + t) * ldy + r, rmask, acc[t]);
}

/* A few tokens (T <= QG_DIRECT): each block multiplied as it is
 * transposed, in registers, with no pass buffer to write and reread (at
 * n = 1 that traffic is most of the work besides the loads). */
HKV_VINLINE void qdirect(const hkv_wmat *m, const int q4, const hkv_qact *a, const int T, int64_t r,
                         int nr, __mmask16 rmask, float *y, int64_t ldy)
{
    const int64_t nb = m->cols / HKV_WBLOCK;
    const int step = q4 ? 4 : 2;
    __m512 acc[QG_TMAX], sw[16], mw[16];
    __m512i O[16], W[8];
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b16 = 0; b16 < nb; b16 += 16) {
        const int n16 = nb - b16 < 16 ? (int)(nb - b16) : 16;
        scales16(m->scale + r * nb + b16, nb, b16, nr, n16, sw);
        if (q4) scales16(m->min + r * nb + b16, nb, b16, nr, n16, mw);
        for (int bb = 0; bb < n16; bb += step) {
            const int nbl = n16 - bb < step ? n16 - bb : step;
            load_rows(m, q4, r, nr, b16 + bb, nbl, O);
            for (int L = 0; L < nbl; L++) {
                block_vectors(O, q4, L, W);
                block_mac(W, sw[bb + L], mw[bb + L], q4, a, 0, T, b16 + bb + L, acc);
            }
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(y + t * ldy + r, rmask, acc[t]);
}

#define QTILE_T(q4, T) \
    case T: if (T <= QG_T) qtile(g, q4, a, t0, T, b0, nbc, r, rmask, y, ldy); break;

#define QTILE_FN(name, q4)                                                                       \
    static void name(const qgroup *g, const hkv_qact *a, int64_t t0, int nt, int64_t b0, int nbc, \
                     int64_t r, __mmask16 rmask, float *y, int64_t ldy)                          \
    {                                                                                            \
        switch (nt) {                                                                            \
            QTILE_T(q4, 1) QTILE_T(q4, 2) QTILE_T(q4, 3) QTILE_T(q4, 4) QTILE_T(q4, 5)           \
            QTILE_T(q4, 6) QTILE_T(q4, 7) QTILE_T(q4, 8) QTILE_T(q4, 9) QTILE_T(q4, 10)          \
            QTILE_T(q4, 11) QTILE_T(q4, 12)                                                      \
        default: break;                                                                          \
        }                                                                                        \
    }
QTILE_FN(qtile_q4, 1)
QTILE_FN(qtile_q8, 0)

#define QDIRECT_T(q4, T) \
    case T: if (T <= QG_DIRECT) qdirect(m, q4, a, T, r, nr, rmask, y, ldy); break;
#define QDIRECT_FN(name, q4)                                                                      \
    static void name(const hkv_wmat *m, const hkv_qact *a, int n, int64_t r, int nr, __mmask16 rmask, \
                     float *y, int64_t ldy)                                                       \
    {                                                                                             \
        switch (n) { QDIRECT_T(q4, 1) QDIRECT_T(q4, 2) QDIRECT_T(q4, 3) QDIRECT_T(q4, 4) default: break; } \
    }
QDIRECT_FN(qdirect_q4, 1)
QDIRECT_FN(qdirect_q8, 0)

void hkv_qgemm_avx512vnni(const hkv_wmat *m, const hkv_qact *a, int n, float *y, int64_t ldy,
                          int64_t r0, int64_t r1)
{
    if (m->type != HKV_W_Q4 && m->type != HKV_W_Q8) return;
    const int q4 = m->type == HKV_W_Q4;
    const int64_t nb = m->cols / HKV_WBLOCK;
    qgroup g __attribute__((aligned(64)));
    for (int64_t r = r0; r < r1; r += RG) {
        const int nr = r1 - r < RG ? (int)(r1 - r) : RG;
        const __mmask16 rmask = (__mmask16)((1u << nr) - 1);
        if (n <= QG_DIRECT) {
            (q4 ? qdirect_q4 : qdirect_q8)(m, a, n, r, nr, rmask, y, ldy);
            continue;
        }
        for (int64_t b0 = 0; b0 < nb; b0 += QG_CB) {
            const int nbc = nb - b0 < QG_CB ? (int)(nb - b0) : QG_CB;
            decode_group(m, r, nr, b0, nbc, &g);
            for (int64_t t0 = 0; t0 < n; t0 += QG_T) {
                const int nt = n - t0 < QG_T ? (int)(n - t0) : QG_T;
                (q4 ? qtile_q4 : qtile_q8)(&g, a, t0, nt, b0, nbc, r, rmask, y, ldy);
            }
        }
    }
}
