/* Read-only streaming for the bandwidth probe, AVX-512: 512-byte steps with
 * eight independent accumulators and software prefetch 4 KB ahead, the same
 * technique the GEMV uses, so many cache lines are in flight. */
#include <immintrin.h>

#include "kernels_impl.h"

#ifndef HKV_STREAM_PREFETCH
#define HKV_STREAM_PREFETCH 4096   /* bytes ahead; about 5% over none */
#endif

double hkv_stream_read_avx512(const void *buf, size_t bytes)
{
    const char *p = buf;
    size_t n = bytes / 512;
    __m512i a[8];
    for (int u = 0; u < 8; u++) a[u] = _mm512_setzero_si512();
    for (size_t i = 0; i < n; i++, p += 512) {
        for (int u = 0; u < 8; u++) _mm_prefetch(p + HKV_STREAM_PREFETCH + 64 * u, _MM_HINT_T0);
        for (int u = 0; u < 8; u++)
            a[u] = _mm512_add_epi64(a[u], _mm512_loadu_si512((const void *)(p + 64 * u)));
    }
    for (int u = 1; u < 8; u++) a[0] = _mm512_add_epi64(a[0], a[u]);
    /* the sum only keeps the loads alive: lanes added as unsigned (wrapping),
     * where _mm512_reduce_add_epi64's signed + overflows (UBSan) */
    uint64_t t[8], s = 0;
    _mm512_storeu_si512((void *)t, a[0]);
    for (int u = 0; u < 8; u++) s += t[u];
    return (double)s;
}
