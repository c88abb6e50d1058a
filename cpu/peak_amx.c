/* AMX peak loops for the compute probe (peak.c): tdpbssd (int8, 16 x 16 x 64
 * multiply-adds) and tdpbf16ps (bf16, 16 x 16 x 32) into four independent C
 * tiles, A and B tiles loop-invariant. Compiled with AMX-INT8 and AMX-BF16;
 * called only where the CPU has them and hkv_amx_request granted the tile
 * state. An AMX instruction is 16-64x a vector one, so a loop runs
 * iters / 16 rounds of 16 instructions (peak.c counts the ops accordingly). */
#include <immintrin.h>

#include "amx_tiles.h"
#include "kernels_impl.h"

static double tile_sum(void)
{
    _Alignas(64) float c[16][16];
    _tile_stored(0, c, 64);
    double s = 0;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) s += c[i][j];
    return s;
}

#define ROUND(OP)                                           \
    do {                                                    \
        OP(0, 4, 5); OP(1, 4, 5); OP(2, 4, 5); OP(3, 4, 5); \
    } while (0)

/* One loop per family: four C tiles zeroed, A and B tiles of zeros loaded
 * once (0 x 0: the sums stay 0), iters / 16 rounds of 16 OP. */
#define AMX_PEAK_LOOP(name, OP)                                                                 \
    double name(long iters)                                                                     \
    {                                                                                           \
        _Alignas(64) static const uint8_t zero[16 * 64];                                        \
        hkv_tiles_full(6);                                                                      \
        _tile_zero(0);                                                                          \
        _tile_zero(1);                                                                          \
        _tile_zero(2);                                                                          \
        _tile_zero(3);                                                                          \
        _tile_loadd(4, zero, 64);                                                               \
        _tile_loadd(5, zero, 64);                                                               \
        for (long it = 0; it < iters / 16; it++) {                                              \
            ROUND(OP); ROUND(OP); ROUND(OP); ROUND(OP);                                         \
        }                                                                                       \
        return tile_sum();                                                                      \
    }

AMX_PEAK_LOOP(hkv_peak_loop_amx_bf16, _tile_dpbf16ps)
AMX_PEAK_LOOP(hkv_peak_loop_amx_int8, _tile_dpbssd)
