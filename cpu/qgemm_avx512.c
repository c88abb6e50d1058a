/* Products on int8 activations (precision FAST), AVX512-VNNI: the
 * activations are quantised per 32-block once per call (hkv_qact, by
 * hkv_quant_act_avx2, which every FAST table shares), and vpdpbusd
 * multiplies the weights' integers by them, 64 multiply-adds per
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
#include "qgemm_vnni.h"

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

/* qdirect over the interleaved layout (hkv_wmat_pack). */
HKV_VINLINE void qdirect_packed(const hkv_wmat *m, const int q4, const hkv_qact *a, const int T, int64_t r,
                                __mmask16 rmask, float *y, int64_t ldy)
{
    const int64_t nb = m->cols / HKV_WBLOCK;
    const char *g0 = packed_group(m, q4, r);
    __m512 acc[QG_TMAX];
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i W[8];
        __m512 sw, mw;
        packed_prefetch(g0, q4, b);
        packed_block(g0, q4, b, W, &sw, &mw);
        block_mac(W, sw, mw, q4, a, 0, T, b, acc);
    }
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(y + t * ldy + r, rmask, acc[t]);
}

#define QDIRECT_T(q4, T)                                                \
    case T:                                                             \
        if (T > QG_DIRECT) break;                                       \
        if (m->pack) qdirect_packed(m, q4, a, T, r, rmask, y, ldy);     \
        else qdirect(m, q4, a, T, r, nr, rmask, y, ldy);                \
        break;
#define QDIRECT_FN(name, q4)                                                                      \
    static void name(const hkv_wmat *m, const hkv_qact *a, int n, int64_t r, int nr, __mmask16 rmask, \
                     float *y, int64_t ldy)                                                       \
    {                                                                                             \
        switch (n) {                                                                              \
            QDIRECT_T(q4, 1) QDIRECT_T(q4, 2) QDIRECT_T(q4, 3) QDIRECT_T(q4, 4)                   \
            QDIRECT_T(q4, 5) QDIRECT_T(q4, 6) QDIRECT_T(q4, 7) QDIRECT_T(q4, 8)                   \
        default: break;                                                                           \
        }                                                                                         \
    }
QDIRECT_FN(qdirect_q4, 1)
QDIRECT_FN(qdirect_q8, 0)

void hkv_qgemm_avx512vnni(const hkv_wmat *m, const hkv_qact *a, int n, float *y, int64_t ldy,
                          int64_t r0, int64_t r1)
{
    if (m->type != HKV_W_Q4 && m->type != HKV_W_Q8) return;
    if (m->pack && (m->pack != RG || r0 % RG)) return;   /* hkv_matmul refuses these */
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
