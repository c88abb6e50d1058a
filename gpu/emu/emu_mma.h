/* PTX's warp-level mma.sync.m16n8k16 (f16 inputs, f32 accumulator) and
 * ldmatrix.m8n8.x4 (.b16, plain and .trans) on the CPU: what
 * gpu/mma_frag.cuh calls in an emulator build in place of its inline PTX.
 *
 * Unlike WMMA's, these fragments have a layout the PTX ISA specifies
 * ("Matrix Fragments for mma.m16n8k16 with floating point type", "Warp-level
 * matrix load instruction: ldmatrix"), and kernels rely on it (the softmax
 * reads its scores in registers, P goes from accumulator to A operand without
 * a round trip), so the emulator implements exactly that layout. With
 * gid = lane / 4 and tig = lane % 4:
 *   A (16x16, row): a[i] (i = 0..3, two halves each, low half first) holds
 *       rows gid (+8 for i = 1, 3), columns 2 tig, 2 tig + 1 (+8 for i = 2, 3);
 *   B (16x8, col): b[i] holds rows (k) 2 tig, 2 tig + 1 (+8 for i = 1),
 *       column (n) gid;
 *   C, D (16x8): c[i] holds row gid (+8 for i = 2, 3), column 2 tig + (i & 1).
 * ldmatrix.x4: lane l gives the address of row l % 8 of matrix l / 8 (16
 * bytes, 16-byte aligned); register j of lane l receives matrix j's halves
 * (row l / 4, columns 2 (l % 4), +1), or with .trans (rows 2 (l % 4), +1,
 * column l / 4).
 *
 * Both are warp collectives (emu_collective.h): all 32 lanes, the same call
 * site. Arithmetic as emu_wmma.h's: products of halves exact, each output C +
 * the 16 products summed in double, rounded once to float; a GPU sums in fp32
 * in its own order, so tests allow fp32 accumulation error. */
#ifndef HKV_EMU_MMA_H
#define HKV_EMU_MMA_H

#include <stdint.h>
#include <string.h>

#include "emu_collective.h"

namespace hkv_emu {
namespace mma {

enum op { OP_MMA16816 = 1, OP_LDSM, OP_LDSM_T };

struct lane_call {
    int op;
    const char *file;
    int line;
    float *d;                /* mma: out (4 floats); may be c */
    const float *c;
    uint32_t a[4], b[2];
    const void *row;         /* ldmatrix: this lane's row address */
    uint32_t *r;             /* ldmatrix: out (4 registers) */
};

static inline const char *op_name(int o)
{
    return o == OP_MMA16816 ? "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
           : o == OP_LDSM ? "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
                          : "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16";
}

static inline float half_of(uint32_t reg, int hi) { return f16_to_f32((uint16_t)(hi ? reg >> 16 : reg)); }

/* D = C + A B for one m16n8k16 tile, in double, each sum in k order and
 * rounded once. Pure arithmetic on the caller's fixed-size arrays, outside
 * ASan's instrumentation: checked, it was a third of gpu_ctkvr's time under
 * ASan, and every index here is a loop bound. */
__attribute__((no_sanitize("address"))) static inline void product16816(
    const double (&A)[16][16], const double (&Bt)[8][16], const float (&C)[16][8], float (&D)[16][8])
{
    for (int row = 0; row < 16; row++)
        for (int col = 0; col < 8; col++) {
            double s = C[row][col];
            for (int k = 0; k < 16; k++) s += A[row][k] * Bt[col][k];
            D[row][col] = (float)s;
        }
}

static inline void perform(lane_call *w, int warp)
{
    (void)warp;
    if (w[0].op == OP_MMA16816) {
        double A[16][16], Bt[8][16];   /* halves are exact in double */
        float C[16][8], D[16][8];
        for (int l = 0; l < 32; l++) {
            const int gid = l / 4, tig = l % 4;
            for (int i = 0; i < 4; i++)
                for (int e = 0; e < 2; e++) {
                    A[gid + 8 * (i & 1)][2 * tig + e + 8 * (i >> 1)] = half_of(w[l].a[i], e);
                    C[gid + 8 * (i >> 1)][2 * tig + (i & 1)] = w[l].c[i];
                }
            for (int i = 0; i < 2; i++)
                for (int e = 0; e < 2; e++) Bt[gid][2 * tig + e + 8 * i] = half_of(w[l].b[i], e);
        }
        product16816(A, Bt, C, D);   /* all of C was read above: d may be c */
        for (int l = 0; l < 32; l++) {
            const int gid = l / 4, tig = l % 4;
            for (int i = 0; i < 4; i++) w[l].d[i] = D[gid + 8 * (i >> 1)][2 * tig + (i & 1)];
        }
        return;
    }
    const int trans = w[0].op == OP_LDSM_T;
    uint16_t M[4][8][8];   /* [matrix][row][col] */
    for (int l = 0; l < 32; l++) memcpy(M[l / 8][l % 8], w[l].row, 16);
    for (int l = 0; l < 32; l++)
        for (int j = 0; j < 4; j++) {
            const int a = l / 4, b = 2 * (l % 4);
            const uint16_t lo = trans ? M[j][b][a] : M[j][a][b], hi = trans ? M[j][b + 1][a] : M[j][a][b + 1];
            w[l].r[j] = (uint32_t)lo | (uint32_t)hi << 16;
        }
}

static inline void mma16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4],
                            const char *file, int line)
{
    lane_call k{};
    k.op = OP_MMA16816, k.file = file, k.line = line, k.d = d, k.c = c;
    memcpy(k.a, a, sizeof k.a);
    memcpy(k.b, b, sizeof k.b);
    warp_collective(k, op_name, perform);
}

static inline void ldsm_x4(uint32_t r[4], const void *row, int trans, const char *file, int line)
{
    lane_call k{};
    k.op = trans ? OP_LDSM_T : OP_LDSM, k.file = file, k.line = line, k.row = row, k.r = r;
    if ((uintptr_t)row % 16)
        faultf("%s at %s:%d: row address %p is not 16-byte aligned", op_name(k.op), file, line, row);
    warp_collective(k, op_name, perform);
}

}  // namespace mma
}  // namespace hkv_emu

#endif
