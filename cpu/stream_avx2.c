/* Read-only streaming for the bandwidth probe, AVX2: 256-byte steps with
 * eight independent accumulators and software prefetch 4 KB ahead. */
#include <immintrin.h>

#include "kernels_impl.h"

#ifndef HKV_STREAM_PREFETCH
#define HKV_STREAM_PREFETCH 4096   /* as the GEMV: the probe is the best read loop we have */
#endif

double hkv_stream_read_avx2(const void *buf, size_t bytes)
{
    const char *p = buf;
    size_t n = bytes / 256;
    __m256i a[8];
    for (int u = 0; u < 8; u++) a[u] = _mm256_setzero_si256();
    for (size_t i = 0; i < n; i++, p += 256) {
        for (int u = 0; u < 4; u++) _mm_prefetch(p + HKV_STREAM_PREFETCH + 64 * u, _MM_HINT_T0);
        for (int u = 0; u < 8; u++)
            a[u] = _mm256_add_epi64(a[u], _mm256_loadu_si256((const __m256i *)(p + 32 * u)));
    }
    for (int u = 1; u < 8; u++) a[0] = _mm256_add_epi64(a[0], a[u]);
    uint64_t t[4];   /* unsigned: the lanes' sum wraps, a signed one would overflow */
    _mm256_storeu_si256((__m256i *)t, a[0]);
    return (double)(t[0] + t[1] + t[2] + t[3]);
}
