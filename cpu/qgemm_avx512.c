/* Products on int8 activations (precision FAST), AVX512-VNNI: the
 * activations are quantised per 32-block once per call (hkv_qact), and
 * vpdpbusd multiplies the weights' integers by them, 64 multiply-adds per
 * instruction where the fp32 GEMV does 16, so a batch of tokens is bounded
 * by the weights' bytes, not by the FMAs, up to several times more tokens.
 *
 * Lanes are blocks: a group of 16 consecutive 32-weight blocks of a row is
 * transposed in registers so that int32 lane l of every vector holds 4
 * weights of block l; eight vpdpbusd then give each lane its whole block's
 * integer dot product, and the block scales apply lane-wise as one
 * fp32 FMA per (row, token, 16 blocks): acc += float(isum) * (sw * dx).
 * Scaling per lane rather than per vector is what makes register blocking
 * pay: with the natural layout (two Q8 blocks per vector) every vpdpbusd
 * would need its own convert-and-scale. The transposition (8 shuffles for a
 * Q4 group; 24 ops for Q8, 8 of them two-source permutes) is done once per
 * row and group and reused by the tile's tokens. A last group of 8 or fewer
 * blocks runs on 256-bit vectors (qgroup8).
 *
 * Signedness: vpdpbusd multiplies unsigned by signed bytes. Q4 nibbles are
 * 0..15, already unsigned, with signed activations. Q8 weights are signed:
 * they are offset to w + 128 (an xor of the sign bit), and the quantiser's
 * 128 * sum(q) per block (hkv_qact.sa) is subtracted in int32: exact.
 * Q4's min term uses the block's float sum of the unquantised activations
 * (hkv_qact.sx): min * sum(x), so only the scale term sees quantisation.
 *
 * Batch invariance: a (row, token) accumulator sees the same operations in
 * the same order (groups in order, lanes apart, the same reduction tree)
 * whatever tile or cache block it sits in and however many tokens share
 * the call.
 *
 * Compiled with AVX512-VNNI; reached only through the table, which has it
 * only where hkv_isa_detect saw VNNI. */
#include <immintrin.h>

#include "kernels_impl.h"

#define QG HKV_QACT_GROUP   /* blocks per group: one per int32 lane */
/* Tiles (rows x tokens; -DQ4_R=.. -DQ4_T=.. to try others: Q4 1 x 8 was
 * as fast on 576-column rows and 25% slower on 4096x4096). The loop over a group's 8 vectors is outermost, so
 * the R x T integer accumulators are independent chains (vpdpbusd's 4-5
 * cycle latency at one per cycle needs >= 5), each activation vector loaded
 * once feeds R rows. Registers (32 zmm): Q4 keeps 4 transposed vectors per
 * row and cuts each k's nibbles on the fly: 4R + 2RT + R + 2 <= 32 at 2 x 4.
 * Q8's transposition yields all 8 vectors at once: 8R + 2RT + 2 <= 32 at
 * 1 x 8 (the activation loads, one per vpdpbusd, are within Zen 4's one
 * 512-bit load per cycle). Measured in bench/cpu_kernels.md. */
#ifndef Q4_R
#define Q4_R 2
#define Q4_T 4
#endif
#ifndef Q8_R
#define Q8_R 1
#define Q8_T 8
#endif
#define TILE_RMAX 2
#define TILE_TMAX 8

/* Software prefetch of each row's weights this many bytes ahead, on the
 * first token tile only (later tiles find the row in L1 or L2). n = 1 on a
 * cold 16384x8192 matrix, 1 thread: Q4 0 / 2048 / 4096 / 8192 bytes ahead
 * 6.1 / 7.1 / 5.4 / 5.5 ms (Q8 within noise), as the GEMV's 4 KB. */
#ifndef QGEMM_PREFETCH
#define QGEMM_PREFETCH 4096
#endif

#define HKV_VINLINE static inline __attribute__((always_inline))

/* ---- quantisation -------------------------------------------------------- */

void hkv_quant_act_avx512vnni(const float *x, int64_t i0, int64_t i1, const hkv_qact *a)
{
    const int64_t cols = a->cols, nb = cols / HKV_WBLOCK, nbp = a->nbp;
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (int64_t i = i0; i < i1; i++) {
        const float *xr = x + i * cols;
        int8_t *q = a->q + i * nbp * 32;
        float *d = a->d + i * nbp, *sx = a->sx + i * nbp;
        int32_t *sa = a->sa + i * nbp;
        for (int64_t b = 0; b < nbp; b++) {
            int8_t *qb = q + (b / QG) * 512 + (b % QG) * 4;   /* dword k at qb + 64 k */
            uint32_t wq[8] = {0};
            if (b >= nb) {                                     /* padding block */
                d[b] = sx[b] = 0.0f;
                sa[b] = 0;
            } else {
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
                _mm_storeu_si128((__m128i *)wq, _mm512_cvtepi32_epi8(q0));
                _mm_storeu_si128((__m128i *)(wq + 4), _mm512_cvtepi32_epi8(q1));
                d[b] = live ? amax / 127.0f : 0.0f;
                sx[b] = _mm512_reduce_add_ps(_mm512_add_ps(v0, v1));
                sa[b] = 128 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            }
            for (int k = 0; k < 8; k++) memcpy(qb + 64 * k, &wq[k], 4);
        }
    }
}

/* ---- weight groups to lane-per-block vectors ----------------------------- */

/* vpermt2d indices (generated and checked by simulating the network):
 * Q4, from two registers of 4 blocks x 4 dwords, dwords {0,1} resp. {2,3}
 * of the 8 blocks; Q8, three stages over 8 registers of 2 blocks x 8 dwords
 * (stage s swaps register bit s with lane bit s; the last also puts the
 * lanes in block order). */
static const int32_t q4_ix[16] __attribute__((aligned(64))) =
    {0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29};
static const int32_t q4_iy[16] __attribute__((aligned(64))) =
    {2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31};
static const int32_t q8_idx[3][2][16] __attribute__((aligned(64))) = {
    {{0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30},
     {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}},
    {{0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
     {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}},
    {{0, 8, 1, 9, 2, 10, 3, 11, 16, 24, 17, 25, 18, 26, 19, 27},
     {4, 12, 5, 13, 6, 14, 7, 15, 20, 28, 21, 29, 22, 30, 23, 31}},
};

/* Dword mask covering the first c (0..per) blocks of a register that holds
 * `per` blocks of 16/per dwords each. */
HKV_VINLINE __mmask16 blocks_mask(int c, int per)
{
    if (c <= 0) return 0;
    if (c >= per) return 0xffff;
    return (__mmask16)((1u << (c * (16 / per))) - 1);
}

/* 16 fp16 values (the first nbt of them; the rest 0) to float. */
HKV_VINLINE __m512 load_scales(const uint16_t *p, int nbt)
{
    __m256i h = nbt >= QG ? _mm256_loadu_si256((const __m256i *)p)
                          : _mm256_maskz_loadu_epi16((__mmask16)((1u << nbt) - 1), p);
    return _mm512_cvtph_ps(h);
}

/* Q4 group (16 blocks x 16 bytes at p) to D[m], m < 4: lane l = dword m
 * of block l, i.e. element 4m..4m+3 in the low nibbles and 16+4m.. in the
 * high ones (q4_vec cuts them). */
HKV_VINLINE void q4_group(const uint8_t *p, int nbt, int pf, __m512i D[4])
{
    __m512i Z[4];
#pragma GCC unroll 16
    for (int j = 0; j < 4; j++) {
        if (pf) _mm_prefetch((const char *)p + QGEMM_PREFETCH + 64 * j, _MM_HINT_T0);
        Z[j] = nbt >= QG ? _mm512_loadu_si512((const void *)(p + 64 * j))
                         : _mm512_maskz_loadu_epi32(blocks_mask(nbt - 4 * j, 4), p + 64 * j);
    }
    const __m512i ix = _mm512_load_si512((const void *)q4_ix), iy = _mm512_load_si512((const void *)q4_iy);
    const __m512i x01 = _mm512_permutex2var_epi32(Z[0], ix, Z[1]);
    const __m512i x23 = _mm512_permutex2var_epi32(Z[2], ix, Z[3]);
    const __m512i y01 = _mm512_permutex2var_epi32(Z[0], iy, Z[1]);
    const __m512i y23 = _mm512_permutex2var_epi32(Z[2], iy, Z[3]);
    D[0] = _mm512_shuffle_i64x2(x01, x23, 0x44);
    D[1] = _mm512_shuffle_i64x2(x01, x23, 0xee);
    D[2] = _mm512_shuffle_i64x2(y01, y23, 0x44);
    D[3] = _mm512_shuffle_i64x2(y01, y23, 0xee);
}

/* Vector k < 8 of a Q4 group: lane l = elements 4k..4k+3 of block l as
 * unsigned bytes (low nibbles of D[k] for k < 4, high nibbles of D[k-4]). */
HKV_VINLINE __m512i q4_vec(const __m512i D[4], int k)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    return k < 4 ? _mm512_and_si512(D[k], m4) : _mm512_and_si512(_mm512_srli_epi32(D[k - 4], 4), m4);
}

/* The first two stages of the Q8 network stay inside 128-bit lanes, so they
 * need no two-source permute: stage 0 pairs the even (odd) dwords of A and
 * B (a 32-bit shift and a blend), stage 1 is unpack lo/hi of 64-bit words.
 * Same result as q8_idx[0..1] (kept as the network's definition), on
 * cheaper instructions than vpermt2d. */
HKV_VINLINE void q8_stage(int s, __m512i A, __m512i B, __m512i *o0, __m512i *o1)
{
    if (s == 0) {
        *o0 = _mm512_mask_blend_epi32(0xaaaa, A, _mm512_slli_epi64(B, 32));
        *o1 = _mm512_mask_blend_epi32(0xaaaa, _mm512_srli_epi64(A, 32), B);
    } else if (s == 1) {
        *o0 = _mm512_unpacklo_epi64(A, B);
        *o1 = _mm512_unpackhi_epi64(A, B);
    } else {
        *o0 = _mm512_permutex2var_epi32(A, _mm512_load_si512((const void *)q8_idx[2][0]), B);
        *o1 = _mm512_permutex2var_epi32(A, _mm512_load_si512((const void *)q8_idx[2][1]), B);
    }
}

/* Q8 group (16 blocks x 32 bytes at p) to W[k]: lane l = elements
 * 4k..4k+3 of block l, offset to unsigned (w + 128). */
HKV_VINLINE void q8_group(const int8_t *p, int nbt, int pf, __m512i W[8])
{
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512i Z[8];
#pragma GCC unroll 16
    for (int j = 0; j < 8; j++) {
        if (pf) _mm_prefetch((const char *)p + QGEMM_PREFETCH + 64 * j, _MM_HINT_T0);
        Z[j] = nbt >= QG ? _mm512_loadu_si512((const void *)(p + 64 * j))
                         : _mm512_maskz_loadu_epi32(blocks_mask(nbt - 2 * j, 2), p + 64 * j);
        Z[j] = _mm512_xor_si512(Z[j], flip);
    }
#pragma GCC unroll 16
    for (int s = 0; s < 3; s++) {
        __m512i N[8];
#pragma GCC unroll 16
        for (int j = 0; j < 8; j++) {
            if (j & (1 << s)) continue;
            q8_stage(s, Z[j], Z[j | (1 << s)], &N[j], &N[j | (1 << s)]);
        }
#pragma GCC unroll 16
        for (int j = 0; j < 8; j++) Z[j] = N[j];
    }
#pragma GCC unroll 16
    for (int k = 0; k < 8; k++) W[k] = Z[k];
}

/* ---- the last group's 8 or fewer blocks: 256-bit lanes ------------------- */

/* A row whose blocks do not fill its last group of 16 (576 columns: 18
 * blocks, a group with 2 live lanes) would waste the dead lanes' work; up to
 * 8 blocks there run on 256-bit vectors instead, which cost half on Zen 4
 * (512-bit instructions take both halves of the 256-bit pipes). */

HKV_VINLINE __m256 load_scales8(const uint16_t *p, int nbt)
{
    return _mm256_cvtph_ps(_mm_maskz_loadu_epi16((__mmask8)((1u << nbt) - 1), p));
}

/* Q4: blocks 0..nbt-1 (<= 8) of a group to D[m] (lane l = dword m of block l). */
HKV_VINLINE void q4_half(const uint8_t *p, int nbt, int pf, __m256i D[4])
{
    (void)pf;   /* a last group: the row's next bytes are the next row's, prefetched as it starts */
    const __m512i z0 = _mm512_maskz_loadu_epi32(blocks_mask(nbt, 4), p);
    const __m512i z1 = _mm512_maskz_loadu_epi32(blocks_mask(nbt - 4, 4), p + 64);
    const __m512i x01 = _mm512_permutex2var_epi32(z0, _mm512_load_si512((const void *)q4_ix), z1);
    const __m512i y01 = _mm512_permutex2var_epi32(z0, _mm512_load_si512((const void *)q4_iy), z1);
    D[0] = _mm512_castsi512_si256(x01);
    D[1] = _mm512_extracti64x4_epi64(x01, 1);
    D[2] = _mm512_castsi512_si256(y01);
    D[3] = _mm512_extracti64x4_epi64(y01, 1);
}

HKV_VINLINE __m256i q4_vec8(const __m256i D[4], int k)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    return k < 4 ? _mm256_and_si256(D[k], m4) : _mm256_and_si256(_mm256_srli_epi32(D[k - 4], 4), m4);
}

/* Q8: blocks 0..nbt-1 (<= 8) to W[k] (lane l = elements 4k..4k+3 of block
 * l, offset to unsigned): the Q8 network with registers 4..7 known zero,
 * so its first two stages halve and the last keeps the low 8 lanes. */
HKV_VINLINE void q8_half(const int8_t *p, int nbt, int pf, __m256i W[8])
{
    (void)pf;   /* as q4_half */
    const __m512i flip = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
    __m512i Z[4];
#pragma GCC unroll 16
    for (int j = 0; j < 4; j++)
        Z[j] = _mm512_xor_si512(_mm512_maskz_loadu_epi32(blocks_mask(nbt - 2 * j, 2), p + 64 * j), flip);
    /* dead blocks became 0x80 (= weight 0 + 128) bytes, multiplied by zero activations: harmless */
#pragma GCC unroll 16
    for (int s = 0; s < 2; s++) {
        __m512i N[4];
#pragma GCC unroll 16
        for (int j = 0; j < 4; j++) {
            if (j & (1 << s)) continue;
            q8_stage(s, Z[j], Z[j | (1 << s)], &N[j], &N[j | (1 << s)]);
        }
#pragma GCC unroll 16
        for (int j = 0; j < 4; j++) Z[j] = N[j];
    }
    const __m512i i0 = _mm512_load_si512((const void *)q8_idx[2][0]);
    const __m512i i1 = _mm512_load_si512((const void *)q8_idx[2][1]);
#pragma GCC unroll 16
    for (int j = 0; j < 4; j++) {
        W[j] = _mm512_castsi512_si256(_mm512_permutex2var_epi32(Z[j], i0, zero));
        W[4 + j] = _mm512_castsi512_si256(_mm512_permutex2var_epi32(Z[j], i1, zero));
    }
}

/* ---- the tile: R rows x T tokens over the whole row ----------------------- */

/* One group (nbt live blocks) of rows r..r+R-1 x tokens t0..t0+T-1 into
 * acc[R][T], written once for both widths: W = 512 (16 lanes, any nbt) and
 * W = 256 (8 lanes, a last group of nbt <= 8; its acc starts at zero).
 * DEC4/DEC8 transpose a Q4/Q8 group, VEC4 cuts Q4 vector k, SCALES loads
 * the block scales. */
#define QGROUP_FN(name, W, DEC4, DEC8, VEC4, SCALES)                                          \
    HKV_VINLINE void name(const hkv_wmat *m, const int type, const hkv_qact *a, int64_t t0,    \
                          const int R, const int T, int64_t r, int64_t g, int nbt, int pf,    \
                          __m##W acc[TILE_RMAX][TILE_TMAX])                                   \
    {                                                                                          \
        const int64_t cols = m->cols, nb = cols / HKV_WBLOCK, nbp = a->nbp, as = nbp * 32;    \
        const int8_t *aq = a->q + t0 * as + g * 512;                                           \
        __m##W##i Wv[TILE_RMAX][8];   /* Q4: Wv[rr][0..3] hold the transposed dwords */       \
        _Pragma("GCC unroll 16") for (int rr = 0; rr < R; rr++) {                              \
            if (type == HKV_W_Q4)                                                              \
                DEC4((const uint8_t *)m->q + (r + rr) * (cols / 2) + g * QG * 16, nbt, pf, Wv[rr]); \
            else                                                                               \
                DEC8((const int8_t *)m->q + (r + rr) * cols + g * QG * 32, nbt, pf, Wv[rr]);   \
        }                                                                                      \
        __m##W##i ia[TILE_RMAX][TILE_TMAX];                                                    \
        _Pragma("GCC unroll 16") for (int rr = 0; rr < R; rr++)                                \
            _Pragma("GCC unroll 16") for (int t = 0; t < T; t++) ia[rr][t] = _mm##W##_setzero_si##W(); \
        _Pragma("GCC unroll 16") for (int k = 0; k < 8; k++) {                                 \
            __m##W##i wk[TILE_RMAX];                                                           \
            _Pragma("GCC unroll 16") for (int rr = 0; rr < R; rr++)                            \
                wk[rr] = type == HKV_W_Q4 ? VEC4(Wv[rr], k) : Wv[rr][k];                        \
            _Pragma("GCC unroll 16") for (int t = 0; t < T; t++) {                             \
                const __m##W##i av = _mm##W##_load_si##W((const void *)(aq + t * as + 64 * k)); \
                _Pragma("GCC unroll 16") for (int rr = 0; rr < R; rr++)                        \
                    ia[rr][t] = _mm##W##_dpbusd_epi32(ia[rr][t], wk[rr], av);                  \
            }                                                                                  \
        }                                                                                      \
        /* scale lane-wise: acc += float(isum) * (sw * dx) (+ Q4: min * sum x) */             \
        _Pragma("GCC unroll 16") for (int rr = 0; rr < R; rr++) {                              \
            const int64_t bo = (r + rr) * nb + g * QG;                                         \
            const __m##W sw = SCALES(m->scale + bo, nbt);                                      \
            const __m##W mw = type == HKV_W_Q4 ? SCALES(m->min + bo, nbt) : _mm##W##_setzero_ps(); \
            _Pragma("GCC unroll 16") for (int t = 0; t < T; t++) {                             \
                const int64_t so = (t0 + t) * nbp + g * QG;                                    \
                __m##W##i is = ia[rr][t];                                                      \
                if (type == HKV_W_Q8)                                                          \
                    is = _mm##W##_sub_epi32(is, _mm##W##_load_si##W((const void *)(a->sa + so))); \
                acc[rr][t] = _mm##W##_fmadd_ps(_mm##W##_cvtepi32_ps(is),                       \
                                               _mm##W##_mul_ps(sw, _mm##W##_load_ps(a->d + so)), acc[rr][t]); \
                if (type == HKV_W_Q4)                                                          \
                    acc[rr][t] = _mm##W##_fmadd_ps(mw, _mm##W##_load_ps(a->sx + so), acc[rr][t]); \
            }                                                                                  \
        }                                                                                      \
    }

QGROUP_FN(qgroup, 512, q4_group, q8_group, q4_vec, load_scales)
QGROUP_FN(qgroup8, 256, q4_half, q8_half, q4_vec8, load_scales8)

/* The lane sums of n <= 16 vectors at once, out[j] = sum of v[j]'s lanes:
 * a shuffle tree (45 ops for 16 sums where 16 separate reductions take
 * ~150, which on 576-column rows cost as much as the products). Each
 * vector's lanes are added in the same pairing whatever its position and
 * whatever else is in the tree (lanes i and i+8, then i and i+4, i+2, i+1,
 * as _mm512_reduce_add_ps), so a (row, token) sum does not depend on the
 * tile it sits in. */
HKV_VINLINE void lane_sums(const __m512 *v, int n, float *out)
{
    __m512 x[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) x[j] = j < n ? v[j] : _mm512_setzero_ps();
    __m512 l1[8], l2[4], l3[2];
#pragma GCC unroll 16
    for (int j = 0; j < 8; j++)   /* 128-bit lanes [a_lo+a_hi | b_lo+b_hi]: lanes i + i+8 */
        l1[j] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * j], x[2 * j + 1], 0x44),
                              _mm512_shuffle_f32x4(x[2 * j], x[2 * j + 1], 0xee));
#pragma GCC unroll 16
    for (int j = 0; j < 4; j++)   /* i + i+4: one 128-bit lane per vector */
        l2[j] = _mm512_add_ps(_mm512_shuffle_f32x4(l1[2 * j], l1[2 * j + 1], 0x88),
                              _mm512_shuffle_f32x4(l1[2 * j], l1[2 * j + 1], 0xdd));
#pragma GCC unroll 16
    for (int j = 0; j < 2; j++)   /* i + i+2 */
        l3[j] = _mm512_add_ps(_mm512_shuffle_ps(l2[2 * j], l2[2 * j + 1], 0x44),
                              _mm512_shuffle_ps(l2[2 * j], l2[2 * j + 1], 0xee));
    /* i + i+1 */
    const __m512 l4 = _mm512_add_ps(_mm512_shuffle_ps(l3[0], l3[1], 0x88), _mm512_shuffle_ps(l3[0], l3[1], 0xdd));
    float t[16];
    _mm512_storeu_ps(t, l4);
    /* the lane of l4 that holds vector j's sum (traced by simulating the tree) */
    static const int8_t where[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
#pragma GCC unroll 16
    for (int j = 0; j < n; j++) out[j] = t[where[j]];
}

/* Rows r..r+R-1 x tokens t0..t0+T-1: the full groups, then the last partial
 * one (masked 512-bit above 8 blocks, 256-bit up to 8, added to lanes 0..7);
 * y = the lanes' sum. The same sequence for a (row, token) whatever
 * R, T and the token's place: batch-invariant. */
HKV_VINLINE void qtile(const hkv_wmat *m, const int type, const hkv_qact *a, int64_t t0,
                       const int R, const int T, int64_t r, float *y, int64_t ldy)
{
    const int64_t nb = m->cols / HKV_WBLOCK, nfull = nb / QG;
    const int tail = (int)(nb % QG);
    const int pf = QGEMM_PREFETCH > 0 && t0 == 0;
    __m512 acc[TILE_RMAX][TILE_TMAX];
    __m256 acc8[TILE_RMAX][TILE_TMAX];
#pragma GCC unroll 16
    for (int rr = 0; rr < R; rr++)
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) acc[rr][t] = _mm512_setzero_ps(), acc8[rr][t] = _mm256_setzero_ps();
    for (int64_t g = 0; g < nfull; g++) qgroup(m, type, a, t0, R, T, r, g, QG, pf, acc);
    if (tail > 8) qgroup(m, type, a, t0, R, T, r, nfull, tail, 0, acc);
    else if (tail > 0) qgroup8(m, type, a, t0, R, T, r, nfull, tail, 0, acc8);
    __m512 v[TILE_RMAX * TILE_TMAX];
    float sums[TILE_RMAX * TILE_TMAX];
#pragma GCC unroll 16
    for (int rr = 0; rr < R; rr++)
#pragma GCC unroll 16
        for (int t = 0; t < T; t++)   /* the 256-bit tail's lanes join lanes 0..7 */
            v[rr * T + t] = _mm512_add_ps(acc[rr][t], _mm512_zextps256_ps512(acc8[rr][t]));
    lane_sums(v, R * T, sums);
#pragma GCC unroll 16
    for (int rr = 0; rr < R; rr++)
#pragma GCC unroll 16
        for (int t = 0; t < T; t++) y[(t0 + t) * ldy + r + rr] = sums[rr * T + t];
}

#define QTILE_T(type, R, T, TM) \
    case T: if (T <= TM) qtile(m, type, a, t0, R, T, r, y, ldy); break;

#define QTILE_FN(name, type, R, TM)                                                     \
    static void name(const hkv_wmat *m, const hkv_qact *a, int64_t t0, int nt, int64_t r, \
                     float *y, int64_t ldy)                                             \
    {                                                                                   \
        switch (nt) {                                                                   \
            QTILE_T(type, R, 1, TM) QTILE_T(type, R, 2, TM) QTILE_T(type, R, 3, TM)     \
            QTILE_T(type, R, 4, TM) QTILE_T(type, R, 5, TM) QTILE_T(type, R, 6, TM)     \
            QTILE_T(type, R, 7, TM) QTILE_T(type, R, 8, TM)                             \
        default: break;                                                                 \
        }                                                                               \
    }
QTILE_FN(qtile_q4_r1, HKV_W_Q4, 1, Q4_T)
QTILE_FN(qtile_q4_rn, HKV_W_Q4, Q4_R, Q4_T)
QTILE_FN(qtile_q8_r1, HKV_W_Q8, 1, Q8_T)
QTILE_FN(qtile_q8_rn, HKV_W_Q8, Q8_R, Q8_T)
_Static_assert(Q4_T <= TILE_TMAX && Q8_T <= TILE_TMAX && TILE_TMAX == 8, "QTILE_FN covers T = 1..8");
_Static_assert(Q4_R <= TILE_RMAX && Q8_R <= TILE_RMAX && TILE_RMAX <= 2, "rows: R or 1 at the end");

/* Cache blocking of the driver: tokens in blocks whose quantised
 * activations stay in L1 while a block of rows whose weights stay in L2
 * runs over them. Without it a 576-column Q8 row (the SmolLM2 output head)
 * streamed all 64 tokens' activations (~60 KB) from L2 per row: 120 GOP/s
 * at n = 16, 87 at n = 64. The order changes no sum (tiles are
 * independent). */
#ifndef QGEMM_L1_ACT_BYTES
#define QGEMM_L1_ACT_BYTES (20 * 1024)
#endif
#ifndef QGEMM_L2_W_BYTES
#define QGEMM_L2_W_BYTES (384 * 1024)
#endif

void hkv_qgemm_avx512vnni(const hkv_wmat *m, const hkv_qact *a, int n, float *y, int64_t ldy,
                          int64_t r0, int64_t r1)
{
    if (m->type != HKV_W_Q4 && m->type != HKV_W_Q8) return;
    const int q4 = m->type == HKV_W_Q4;
    const int R = q4 ? Q4_R : Q8_R, T = q4 ? Q4_T : Q8_T;
    const int64_t nb = m->cols / HKV_WBLOCK;
    const int64_t tok_bytes = a->nbp * (32 + 12), row_bytes = q4 ? nb * 20 : nb * 34;
    int64_t tb = QGEMM_L1_ACT_BYTES / tok_bytes / T * T, rb = QGEMM_L2_W_BYTES / row_bytes / R * R;
    if (tb < T) tb = T;
    if (rb < R) rb = R;
    for (int64_t b0 = r0; b0 < r1; b0 += rb) {
        const int64_t b1 = b0 + rb < r1 ? b0 + rb : r1;
        for (int64_t k0 = 0; k0 < n; k0 += tb) {
            const int64_t k1 = k0 + tb < n ? k0 + tb : n;
            for (int64_t r = b0; r < b1; r += R) {
                const int full = b1 - r >= R;   /* else the last rows one at a time */
                for (int64_t rr = r; rr < (full ? r + 1 : b1); rr++)
                    for (int64_t t0 = k0; t0 < k1; t0 += T) {
                        const int nt = k1 - t0 < T ? (int)(k1 - t0) : T;
                        if (q4) (full ? qtile_q4_rn : qtile_q4_r1)(m, a, t0, nt, rr, y, ldy);
                        else (full ? qtile_q8_rn : qtile_q8_r1)(m, a, t0, nt, rr, y, ldy);
                    }
            }
        }
    }
}
