/* The pieces of the int8 products (precision FAST) that the AVX512-VNNI
 * kernel (qgemm_avx512.c) and the AMX one (qgemm_amx.c) share: 16 rows
 * decoded to lane-per-row vectors, and the per-block fp32 scaling every
 * path runs in the same order, which keeps the paths bitwise equal.
 * Internal to those two files; compiled with AVX512-VNNI. */
#ifndef HKV_QGEMM_VNNI_H
#define HKV_QGEMM_VNNI_H

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
#define QG_DIRECT 8   /* up to this many tokens: no pass buffer (qdirect); n = 8 on 4096 columns 0.93-0.96x the buffered time */
#endif
_Static_assert(QG_DIRECT >= 0 && QG_DIRECT <= 8, "QDIRECT covers T = 1..8");
/* Software prefetch of the next 16-row group (the same offsets 16 rows on,
 * one group's bytes ahead: a group is one contiguous stretch of the
 * matrix) as each line of this one is loaded: hardware prefetchers lose
 * track of 16-48 interleaved row streams. Prefetches past the matrix end
 * touch nothing (they never fault). */
#ifndef QG_PREFETCH
#define QG_PREFETCH 1
#endif
/* Into L2, not L1: more lines in flight per core, and a group ahead of
 * 4096-column rows is more than L1 holds. Llama-3-8B's shape (4 layers, batch
 * 1, 2 threads, AVX-512): 21.8 -> 35.0 tok/s; SmolLM2 127 -> 166. */
#define QG_PF_HINT _MM_HINT_T1
#ifndef QG_PF_GROUPS
#define QG_PF_GROUPS 1   /* how many groups ahead */
#endif
_Static_assert(QG_T >= 1 && QG_T <= QG_TMAX, "QTILE covers T = 1..12");

#define HKV_VINLINE static inline __attribute__((always_inline))

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
        if (QG_PREFETCH && l < 8) _mm_prefetch(pf + 64 * l, QG_PF_HINT);
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
        if (QG_PREFETCH) _mm_prefetch(pf + 64 * l, QG_PF_HINT);
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

/* ---- the interleaved layout (hkv_wmat_pack, groups of 16) ----------------
 * Records of two blocks: their codes as block_vectors makes them (Q4: 4
 * vectors a block, Q8: 8, signed), then their 16 scales and 16 mins a
 * block; 640 (Q4) or 1088 (Q8) bytes, so every load is 64-byte aligned. */
#define QG_REC2(q4) ((int)hkv_wpack_record_bytes(q4, RG))
HKV_VINLINE const char *packed_group(const hkv_wmat *m, const int q4, int64_t r)
{
    return hkv_wpack_group(m, q4, RG, r);
}

/* Software prefetch of the packed stream, QG_PPF bytes past block b's half
 * record, into L2 (as qgemm_avx2.inc's). */
#ifndef QG_PPF
#define QG_PPF 8192
#endif
HKV_VINLINE void packed_prefetch(const char *g0, const int q4, int64_t b)
{
    if (QG_PPF <= 0) return;
    const char *p = g0 + b * (QG_REC2(q4) / 2) + QG_PPF;
    for (int o = 0; o < QG_REC2(q4) / 2; o += 64) _mm_prefetch(p + o, QG_PF_HINT);
}

/* Block b of the group at g0: its 8 vectors (lane l = elements 4k..4k+3
 * of row l, unsigned), scale and min. */
HKV_VINLINE void packed_block(const char *g0, const int q4, int64_t b, __m512i W[8], __m512 *sw, __m512 *mw)
{
    const int nv = q4 ? 4 : 8, odd = (int)(b & 1);
    const char *p = g0 + (b >> 1) * QG_REC2(q4), *c = p + odd * 64 * nv, *sc = p + 128 * nv + 32 * odd;
    const __m512i m4 = _mm512_set1_epi8(0x0f), flip = _mm512_set1_epi8((char)0x80);
    if (q4) {
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const __m512i o = _mm512_load_si512((const void *)(c + 64 * j));
            W[j] = _mm512_and_si512(o, m4);
            W[4 + j] = _mm512_and_si512(_mm512_srli_epi32(o, 4), m4);
        }
    } else {
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) W[j] = _mm512_xor_si512(_mm512_load_si512((const void *)(c + 64 * j)), flip);
    }
    *sw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)sc));
    *mw = q4 ? _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(sc + 64))) : _mm512_setzero_ps();
}

static inline void decode_group(const hkv_wmat *m, int64_t r, int nr, int64_t b0, int nbc, qgroup *g)
{
    const int64_t nb = m->cols / HKV_WBLOCK;
    const int q4 = m->type == HKV_W_Q4, step = q4 ? 4 : 2;
    __m512i O[16];
    if (m->pack) {
        const char *g0 = packed_group(m, q4, r);
        for (int bb = 0; bb < nbc; bb++) {
            packed_prefetch(g0, q4, b0 + bb);
            packed_block(g0, q4, b0 + bb, g->w[bb], &g->sw[bb], &g->mw[bb]);
        }
        return;
    }
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

/* The fp32 step of one block for token tok, is = its exact integer sums
 * (lane l: row l): acc += float(is) * (sw * dx) (Q8: is less the offset's
 * 128 * sum(q); Q4: then acc += min * sum(x)). Every path (VNNI tiles,
 * direct, AMX) runs this, so a (row, token) sees the same ops whichever
 * path and neighbours it had. */
HKV_VINLINE __m512 block_scale(__m512i is, __m512 sw, __m512 mw, const int q4, const hkv_qact *a,
                               int64_t tok, int64_t blk, __m512 acc)
{
    const int64_t so = tok * (a->cols / HKV_WBLOCK) + blk;
    if (!q4) is = _mm512_sub_epi32(is, _mm512_set1_epi32(a->sa[so]));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(sw, _mm512_set1_ps(a->d[so])), acc);
    if (q4) acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(a->sx[so]), acc);
    return acc;
}

/* One block (absolute index blk) of 16 rows for tokens t0..t0+T-1: the
 * integer sums by vpdpbusd (each token's 4 bytes broadcast), then
 * block_scale. */
HKV_VINLINE void block_mac(const __m512i w[8], __m512 sw, __m512 mw, const int q4, const hkv_qact *a,
                           int64_t t0, const int T, int64_t blk, __m512 acc[QG_TMAX])
{
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
    for (int t = 0; t < T; t++) acc[t] = block_scale(is[t], sw, mw, q4, a, t0 + t, blk, acc[t]);
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

#endif
