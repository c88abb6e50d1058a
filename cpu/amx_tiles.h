/* AMX tile configuration shared by the tile kernels (qgemm_amx.c,
 * attn_causal_amx.c, peak_amx.c): ldtilecfg's 64-byte operand, palette 1.
 * The configuration is per thread, so every kernel loads its own on entry. */
#ifndef HKV_CPU_AMX_TILES_H
#define HKV_CPU_AMX_TILES_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

typedef struct hkv_tilecfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} hkv_tilecfg;

/* Tiles 0 .. n-1 as 16 rows of 64 bytes (a full C, A or B tile). */
static inline void hkv_tiles_full(int n)
{
    hkv_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < n; t++) c.rows[t] = 16, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

#endif
