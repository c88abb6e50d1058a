/* The FAST products' interleaved weight layout (cpu/kernels.h,
 * hkv_wmat_pack): a Q4/Q8 matrix's rows in groups of g, each block of a
 * group one record of lane-per-row pieces. Plain C: it runs once per matrix
 * at load, at memory speed either way. */
#include "kernels_impl.h"
#include "status.h"

/* A record holds two blocks of a group: their codes (block 2i, then 2i+1),
 * their scales, their mins (Q4); 320 (Q4) or 544 (Q8) bytes at g = 8, so
 * records and groups stay 32-byte aligned and no 32-byte load of codes
 * straddles two lines, in one stream. An odd last block leaves half a
 * record unused (kernels.h: hkv_wpack_record_bytes). */

size_t hkv_wmat_pack_bytes(const hkv_wmat *w, int g)
{
    if (!w || (w->type != HKV_W_Q4 && w->type != HKV_W_Q8) || (g != 8 && g != 16) || w->pack ||
        w->rows <= 0 || w->cols <= 0 || w->cols % HKV_WBLOCK)
        return 0;
    const size_t groups = (size_t)((w->rows + g - 1) / g), records = (size_t)(w->cols / HKV_WBLOCK + 1) / 2;
    return groups * records * hkv_wpack_record_bytes(w->type == HKV_W_Q4, g);
}

int hkv_wmat_pack(const hkv_wmat *src, int g, void *dst, hkv_wmat *out)
{
    if (!hkv_wmat_pack_bytes(src, g) || !dst || ((uintptr_t)dst & 63) || !out || !src->q || !src->scale ||
        (src->type == HKV_W_Q4 && !src->min))
        return HKV_E_INVAL;
    const int q4 = src->type == HKV_W_Q4;
    const int64_t nb = src->cols / HKV_WBLOCK, groups = (src->rows + g - 1) / g;
    const int64_t row_bytes = q4 ? src->cols / 2 : src->cols, blk_bytes = q4 ? 16 : 32;
    const int pieces = (int)(blk_bytes / 4);
    const size_t rec = hkv_wpack_record_bytes(q4, g), group = (size_t)(nb + 1) / 2 * rec;
    memset(dst, 0, hkv_wmat_pack_bytes(src, g));   /* rows past the last, an odd block's half */
    for (int64_t G = 0; G < groups; G++)
        for (int l = 0; l < g && G * g + l < src->rows; l++) {
            const int64_t r = G * g + l;
            const uint8_t *q = (const uint8_t *)src->q + r * row_bytes;
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *p = (uint8_t *)dst + G * group + (size_t)(b / 2) * rec;
                uint8_t *codes = p + (size_t)(b % 2) * pieces * g * 4;
                uint16_t *sc = (uint16_t *)(p + (size_t)2 * pieces * g * 4) + (b % 2) * g, *mn = sc + 2 * g;
                for (int j = 0; j < pieces; j++) memcpy(codes + ((size_t)j * g + l) * 4, q + b * blk_bytes + 4 * j, 4);
                sc[l] = src->scale[r * nb + b];
                if (q4) mn[l] = src->min[r * nb + b];
            }
        }
    *out = *src;
    out->q = dst;
    out->scale = out->min = NULL;
    out->pack = g;
    return HKV_OK;
}
