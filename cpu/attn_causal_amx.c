/* Causal attention for prefill on AMX-BF16 tiles: precision FAST's
 * attn_causal where the CPU has AMX-BF16 and the OS granted the tile state
 * (kernels.c). Q, K, V and the probabilities are rounded to bf16, every
 * product sums in fp32; the softmax stays fp32 (vf_exp). The exact path's
 * fp32 kernel (attn_causal_simd.inc) stays the reference.
 *
 * Why: the fp32 kernel runs about 130 GFLOP/s a core, half the FMA peak,
 * and at 8K tokens the prompt's attention is most of a prefill. One
 * tdpbf16ps is 16 x 16 x 32 multiply-adds.
 *
 * Layout: a query tile is 16 rows (row m = token * gh + head, so the heads
 * of a token share every K/V tile). Per block of 32 keys:
 *   S[16][32] = Q K^T   two C tiles; A = Q rows (bf16, scaled), B = K in
 *                       the pair layout (row r: dims 2r, 2r+1 of 16 keys);
 *   online softmax      per row, fp32, through memory; the row maxima and
 *                       sums through the shuffle trees of simd_avx512.h,
 *                       whose association is the same for every row, so a
 *                       row's result does not depend on which rows share
 *                       its tile (batch and chunking invariance);
 *   O[16][d] += P V     A = P rows (bf16), B = V in the pair layout (row
 *                       r: keys 2r, 2r+1 of 16 columns); O in fp32 memory,
 *                       rescaled only in rows whose maximum moved.
 * K and V are repacked SB keys at a time and used by every query tile of a
 * group (up to 128 rows at d 64), which repays the repacking. About 120 KB
 * of stack at d 128 (kernels.h: 200 KB is the contract). */
#include <immintrin.h>
#include <math.h>

#include "amx_tiles.h"
#include "kernels_impl.h"
#include "simd_avx512.h"

#define QT 16             /* query rows a tile */
#define KBLK 32           /* keys a block */
#define SB 128            /* keys repacked at a time */
#define OT_FLOATS 8192    /* a group's O state: rows x d floats (32 KB) */
#define MAX_D 128         /* larger heads: the fp32 kernel */

/* 32 floats (lo: elements 0..15, hi: 16..31) to 32 bf16, in order. */
HKV_VINLINE __m512i to_bf16(vf lo, vf hi) { return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); }

/* x[i][c] <- x[c][i] for a 16 x 16 matrix of 32-bit words: for each bit b,
 * the words whose row and column differ in b trade places. */
static const int32_t tr_lo[4][16] = {   /* (c & s) ? 16 + (c ^ s) : c, s = 1 << b */
    {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30},
    {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
    {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
    {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
};
static const int32_t tr_hi[4][16] = {   /* (c & s) ? 16 + c : c ^ s */
    {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31},
    {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
    {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
    {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
};

static void transpose16_epi32(__m512i x[16])
{
    for (int b = 0; b < 4; b++) {
        const int s = 1 << b;
        const __m512i il = _mm512_loadu_si512(tr_lo[b]), ih = _mm512_loadu_si512(tr_hi[b]);
        for (int i = 0; i < 16; i++) {
            if (i & s) continue;
            const __m512i a = x[i], c = x[i | s];
            x[i] = _mm512_permutex2var_epi32(a, il, c);
            x[i | s] = _mm512_permutex2var_epi32(a, ih, c);
        }
    }
}

/* Keys [k0, k0 + SB) repacked, zero past kend:
 *   kt[(g16 * nkd + kd) * 512 ...]: 16 keys x dims kd*32.. in pairs (B tile);
 *   vv[(jb * nc + c) * 512 ...]: 32 keys x columns c*16.. in pairs (B tile). */
static void repack(const uint16_t *k, const uint16_t *v, int64_t ld, int d, int64_t k0,
                   int64_t kend, uint16_t *kt, uint16_t *vv)
{
    const int nkd = d / 32, nc = d / 16;
    const int64_t nk = kend - k0 < SB ? kend - k0 : SB;
    const int nblk = (int)((nk + KBLK - 1) / KBLK);
    for (int g16 = 0; g16 < 2 * nblk; g16++)
        for (int kd = 0; kd < nkd; kd++) {
            __m512i x[16];
            for (int n = 0; n < 16; n++) {
                const int64_t key = k0 + g16 * 16 + n;
                if (key < kend) {
                    const uint16_t *r = k + key * ld + kd * 32;
                    x[n] = to_bf16(vf_load_f16(r), vf_load_f16(r + 16));
                } else {
                    x[n] = _mm512_setzero_si512();
                }
            }
            transpose16_epi32(x);
            uint16_t *dst = kt + (size_t)(g16 * nkd + kd) * 512;
            for (int r = 0; r < 16; r++) _mm512_store_si512(dst + r * 32, x[r]);
        }
    _Alignas(64) int16_t il[32];
    for (int i = 0; i < 16; i++) il[2 * i] = (int16_t)i, il[2 * i + 1] = (int16_t)(16 + i);
    const __m512i inter = _mm512_load_si512(il);
    for (int jb = 0; jb < nblk; jb++)
        for (int r = 0; r < 16; r++) {
            const int64_t a = k0 + jb * KBLK + 2 * r, b = a + 1;
            for (int c = 0; c < nc; c++) {
                vf va = a < kend ? vf_load_f16(v + a * ld + c * 16) : vf_zero();
                vf vb = b < kend ? vf_load_f16(v + b * ld + c * 16) : vf_zero();
                __m512i w = _mm512_permutexvar_epi16(inter, to_bf16(va, vb));
                _mm512_store_si512(vv + (size_t)(jb * nc + c) * 512 + r * 32, w);
            }
        }
}

/* One 32-key block (keys kb0.., repacked at kt/vv) for query tile t. */
static void tile_block(int d, const uint16_t *qa, const uint16_t *kt, const uint16_t *vv,
                       int64_t kb0, const int64_t *pos, int masked, float *mrun, float *lsum,
                       float *ot)
{
    const int nkd = d / 32, nc = d / 16;
    _Alignas(64) float st[QT][KBLK];
    _Alignas(64) uint16_t pa[QT][KBLK];
    _Alignas(64) float mnew[QT];

    _tile_zero(0);
    _tile_zero(1);
    for (int kd = 0; kd < nkd; kd++) {
        _tile_loadd(2, qa + kd * 512, 64);
        _tile_loadd(3, kt + (size_t)kd * 512, 64);
        _tile_dpbf16ps(0, 2, 3);
        _tile_loadd(3, kt + (size_t)(nkd + kd) * 512, 64);
        _tile_dpbf16ps(1, 2, 3);
    }
    _tile_stored(0, &st[0][0], KBLK * 4);
    _tile_stored(1, &st[0][16], KBLK * 4);

    static const float lane[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const vf neg_inf = vf_set1(-INFINITY), kp0 = vf_add(vf_load(lane), vf_set1((float)kb0)),
             kp1 = vf_add(kp0, vf_set1(16.0f));
    vf rm[QT];
    for (int m = 0; m < QT; m++) {
        vf s0 = vf_load(st[m]), s1 = vf_load(st[m] + 16);
        if (masked) {   /* keys past the row's position out */
            const vf pm = vf_set1((float)pos[m]);
            s0 = vf_select_gt(kp0, pm, neg_inf, s0);
            s1 = vf_select_gt(kp1, pm, neg_inf, s1);
            vf_store(st[m], s0);
            vf_store(st[m] + 16, s1);
        }
        rm[m] = vf_max(s0, s1);
    }
    const vf mold = vf_load(mrun), mn = vf_max(mold, vf_reduce_max_vl(rm));
    const vf corr = vf_exp(vf_sub(mold, mn));   /* 0 on the first block: mold is -inf */
    vf_store(mrun, mn);
    vf_store(mnew, mn);
    for (int m = 0; m < QT; m++) {
        const vf mm = vf_set1(mnew[m]);
        const vf e0 = vf_exp(vf_sub(vf_load(st[m]), mm)), e1 = vf_exp(vf_sub(vf_load(st[m] + 16), mm));
        rm[m] = vf_add(e0, e1);
        _mm512_store_si512(pa[m], to_bf16(e0, e1));
    }
    vf_store(lsum, vf_fma(vf_load(lsum), corr, vf_reduce_vl(rm)));
    __mmask16 moved = _mm512_cmp_ps_mask(corr, vf_set1(1.0f), _CMP_NEQ_UQ);
    if (moved) {
        _Alignas(64) float cr[QT];
        vf_store(cr, corr);
        for (int m = 0; m < QT; m++) {
            if (!(moved >> m & 1)) continue;
            const vf cm = vf_set1(cr[m]);
            for (int c = 0; c < d; c += 16) vf_store(ot + m * d + c, vf_mul(vf_load(ot + m * d + c), cm));
        }
    }
    _tile_loadd(2, &pa[0][0], KBLK * 2);
    for (int c = 0; c < nc; c++) {
        _tile_loadd(4, ot + c * 16, d * 4);
        _tile_loadd(3, vv + (size_t)c * 512, 64);
        _tile_dpbf16ps(4, 2, 3);
        _tile_stored(4, ot + c * 16, d * 4);
    }
}

/* Tokens t0 .. t0 + tn of heads h0 .. h0 + gh (gh * tn rows, at most
 * OT_FLOATS / d). */
static void group(const float *q, int64_t ldq, int t0, int tn, int h0, int gh, int g, int d,
                  int64_t p0, const uint16_t *k, const uint16_t *v, int64_t ld, float scale,
                  float *out, int64_t ldo, float *lse)
{
    const int rows = tn * gh, nt = (rows + QT - 1) / QT, nkd = d / 32, nc = d / 16;
    _Alignas(64) uint16_t qa[OT_FLOATS];   /* nt x nkd x 512: the padded rows x d */
    _Alignas(64) float ot[OT_FLOATS];
    _Alignas(64) uint16_t kt[SB / 16 * (MAX_D / 32) * 512];
    _Alignas(64) uint16_t vv[SB / KBLK * (MAX_D / 16) * 512];
    _Alignas(64) float mrun[OT_FLOATS / 32], lsum[OT_FLOATS / 32];
    int64_t pos[OT_FLOATS / 32];

    for (int R = 0; R < nt * QT; R++) {
        const int r = R < rows ? R : rows - 1;   /* padding rows: zero query, last position */
        const int tok = t0 + r / gh, h = h0 + r % gh;
        pos[R] = p0 + tok;
        mrun[R] = -INFINITY;
        lsum[R] = 0.0f;
        const float *qr = q + (int64_t)tok * ldq + (int64_t)h * d;
        const vf sv = vf_set1(R < rows ? scale : 0.0f);
        for (int kd = 0; kd < nkd; kd++) {
            uint16_t *dst = qa + (size_t)((R / QT) * nkd + kd) * 512 + (R % QT) * 32;
            _mm512_store_si512(dst, to_bf16(vf_mul(vf_load(qr + kd * 32), sv),
                                            vf_mul(vf_load(qr + kd * 32 + 16), sv)));
        }
        for (int c = 0; c < d; c += 16) vf_store(ot + (size_t)R * d + c, vf_zero());
    }
    const int64_t kend = p0 + t0 + tn;   /* keys the group can see */
    for (int64_t sb = 0; sb < kend; sb += SB) {
        repack(k, v, ld, d, sb, kend, kt, vv);
        for (int t = 0; t < nt; t++) {
            const int64_t pmin = pos[t * QT], pmax = pos[t * QT + QT - 1];
            for (int jb = 0; jb < SB / KBLK; jb++) {
                const int64_t kb0 = sb + jb * KBLK;
                if (kb0 > pmax) break;
                tile_block(d, qa + (size_t)t * nkd * 512, kt + (size_t)(2 * jb) * nkd * 512,
                           vv + (size_t)jb * nc * 512, kb0, pos + t * QT, kb0 + KBLK - 1 > pmin,
                           mrun + t * QT, lsum + t * QT, ot + (size_t)t * QT * d);
            }
        }
    }
    for (int R = 0; R < rows; R++) {
        const int tok = t0 + R / gh, h = R % gh;
        float *o = out + (int64_t)tok * ldo + (int64_t)(h0 + h) * d;
        const vf inv = vf_set1(1.0f / lsum[R]);
        for (int c = 0; c < d; c += 16) vf_store(o + c, vf_mul(vf_load(ot + (size_t)R * d + c), inv));
        lse[(int64_t)tok * g + h0 + h] = mrun[R] + logf(lsum[R]);
    }
}

void hkv_attn_causal_amxbf16(const float *q, int64_t ldq, int nq, int g, int d, int64_t p0,
                             const uint16_t *k, const uint16_t *v, int64_t ld, float scale,
                             float *out, int64_t ldo, float *lse)
{
    if (d % 32 != 0 || d > MAX_D || (int64_t)nq * g < QT) {   /* too few rows for a tile */
        hkv_attn_causal_avx512(q, ldq, nq, g, d, p0, k, v, ld, scale, out, ldo, lse);
        return;
    }
    hkv_tiles_full(5);   /* tmm0, 1: S; tmm2: A (Q or P); tmm3: B (K or V pairs); tmm4: an O tile */
    const int max_rows = OT_FLOATS / d / QT * QT;   /* padded to whole tiles */
    for (int h0 = 0; h0 < g; h0 += QT) {
        const int gh = g - h0 < QT ? g - h0 : QT;
        const int per = max_rows / gh;
        for (int t0 = 0; t0 < nq; t0 += per)
            group(q, ldq, t0, nq - t0 < per ? nq - t0 : per, h0, gh, g, d, p0, k, v, ld, scale, out, ldo,
                  lse);
    }
}
