/* Layout of int8-quantised activation rows (hkv_qact) over a caller's
 * buffer: the quantised bytes, then the per-block scales, float sums and
 * int sums, each part 64-byte aligned so vector loads never split lines. */
#include "kernels_impl.h"

static size_t align64(size_t b) { return (b + 63) & ~(size_t)63; }

static int64_t padded_blocks(int64_t cols) { return cols / HKV_WBLOCK; }

size_t hkv_qact_bytes(int64_t cols, int64_t n)
{
    size_t nbp = (size_t)padded_blocks(cols), rows = (size_t)n;
    return align64(rows * nbp * 32) + 3 * align64(rows * nbp * 4);
}

void hkv_qact_view(hkv_qact *a, void *buf, int64_t cols, int64_t n)
{
    size_t nbp = (size_t)padded_blocks(cols), rows = (size_t)n;
    char *p = buf;
    a->cols = cols;
    a->nbp = (int64_t)nbp;
    a->q = (int8_t *)p;
    p += align64(rows * nbp * 32);
    a->d = (float *)p;
    p += align64(rows * nbp * 4);
    a->sx = (float *)p;
    p += align64(rows * nbp * 4);
    a->sa = (int32_t *)p;
}
