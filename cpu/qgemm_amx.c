/* The int8 products (precision FAST) on AMX tiles, for CPUs with AMX-INT8
 * (Sapphire Rapids and later Xeons): the integer sums of 16 tokens x 16
 * rows x one 32-weight block are one tdpbsud, where vpdpbusd needs 8
 * instructions per token. The weights come from the same decoded pass
 * buffer as the VNNI kernel's (qgemm_vnni.h): a block's 8 lane-per-row
 * vectors are exactly the B tile AMX wants (row k = elements 4k..4k+3 of
 * 16 output rows), and the activations' natural order is the A tile (a
 * token's 32 bytes a row, the token stride apart). The C tile, 16 tokens x
 * 16 rows of int32, goes through memory to the same fp32 step
 * (block_scale) the VNNI path runs, so both give the same bits: the
 * integer sums are exact either way. Whole 16-token tiles only; the last
 * n % 16 tokens, and calls of fewer than 16, run the VNNI tiles.
 *
 * Blocks alternate between two C tiles, so a block's tdpbsud runs while
 * the previous block's sums are scaled.
 *
 * Linux hands out the tile data state only on request
 * (arch_prctl(ARCH_REQ_XCOMP_PERM)): hkv_amx_request (isa.c) makes it
 * before the table takes this kernel. */
#include "amx_tiles.h"
#include "qgemm_vnni.h"

#define TOK 16   /* tokens a tile: the A tile's rows */


/* tmm0, tmm3: C (16 tokens x 16 rows of int32); tmm1: A (16 tokens x 32
 * bytes); tmm2: B (8 rows of 64 bytes: 4 bytes of each of 16 rows). */
static void tiles_config(void)
{
    hkv_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[0] = c.rows[3] = TOK, c.colsb[0] = c.colsb[3] = 64;
    c.rows[1] = TOK, c.colsb[1] = 32;
    c.rows[2] = 8, c.colsb[2] = 64;
    _tile_loadconfig(&c);
}

/* Tokens t0..t0+15 over a decoded pass (blocks b0..b0+nbc-1): acc[t] lane
 * l is (row r+l, token t0+t), continued from y when b0 > 0. */
HKV_VINLINE void amx_tile(const qgroup *g, const int q4, const hkv_qact *a, int64_t t0, int64_t b0,
                          int nbc, int64_t r, __mmask16 rmask, float *y, int64_t ldy)
{
    _Alignas(64) int32_t cs[2][TOK][16];
    __m512 acc[TOK];
#pragma GCC unroll 16
    for (int t = 0; t < TOK; t++)
        acc[t] = b0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(rmask, y + (t0 + t) * ldy + r);
    const int8_t *aq = a->q + t0 * a->cols + b0 * 32;
    for (int b = 0; b <= nbc; b++) {
        if (b < nbc) {   /* block b's sums into C tile b % 2 */
            _tile_loadd(1, aq + b * 32, a->cols);
            _tile_loadd(2, &g->w[b][0], 64);
            if (b & 1) {
                _tile_zero(3);
                _tile_dpbsud(3, 1, 2);
                _tile_stored(3, cs[1], 64);
            } else {
                _tile_zero(0);
                _tile_dpbsud(0, 1, 2);
                _tile_stored(0, cs[0], 64);
            }
        }
        if (b > 0) {   /* block b - 1's fp32 step */
            const int p = b - 1;
            const __m512 sw = g->sw[p], mw = g->mw[p];
#pragma GCC unroll 16
            for (int t = 0; t < TOK; t++)
                acc[t] = block_scale(_mm512_load_si512((const void *)cs[p & 1][t]), sw, mw, q4, a, t0 + t,
                                     b0 + p, acc[t]);
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < TOK; t++) _mm512_mask_storeu_ps(y + (t0 + t) * ldy + r, rmask, acc[t]);
}

void hkv_qgemm_avx512amx(const hkv_wmat *m, const hkv_qact *a, int n, float *y, int64_t ldy,
                         int64_t r0, int64_t r1)
{
    if (m->type != HKV_W_Q4 && m->type != HKV_W_Q8) return;
    if (m->pack && (m->pack != RG || r0 % RG)) return;   /* hkv_matmul refuses these */
    if (n < TOK) {
        hkv_qgemm_avx512vnni(m, a, n, y, ldy, r0, r1);
        return;
    }
    const int q4 = m->type == HKV_W_Q4;
    const int64_t nb = m->cols / HKV_WBLOCK, nfull = n / TOK * TOK;
    qgroup g __attribute__((aligned(64)));
    tiles_config();
    for (int64_t r = r0; r < r1; r += RG) {
        const int nr = r1 - r < RG ? (int)(r1 - r) : RG;
        const __mmask16 rmask = (__mmask16)((1u << nr) - 1);
        for (int64_t b0 = 0; b0 < nb; b0 += QG_CB) {
            const int nbc = nb - b0 < QG_CB ? (int)(nb - b0) : QG_CB;
            decode_group(m, r, nr, b0, nbc, &g);
            for (int64_t t0 = 0; t0 < nfull; t0 += TOK) amx_tile(&g, q4, a, t0, b0, nbc, r, rmask, y, ldy);
            for (int64_t t0 = nfull; t0 < n; t0 += QG_T) {
                const int nt = n - t0 < QG_T ? (int)(n - t0) : QG_T;
                (q4 ? qtile_q4 : qtile_q8)(&g, a, t0, nt, b0, nbc, r, rmask, y, ldy);
            }
        }
    }
    _tile_release();
}
