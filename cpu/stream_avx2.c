/* Read-only streaming for the bandwidth probe, AVX2: 256-byte steps with
 * eight independent accumulators. */
#include <immintrin.h>

#include "kernels_impl.h"

double hkv_stream_read_avx2(const void *buf, size_t bytes)
{
    const char *p = buf;
    size_t n = bytes / 256;
    __m256i a[8];
    for (int u = 0; u < 8; u++) a[u] = _mm256_setzero_si256();
    for (size_t i = 0; i < n; i++, p += 256)
        for (int u = 0; u < 8; u++)
            a[u] = _mm256_add_epi64(a[u], _mm256_loadu_si256((const __m256i *)(p + 32 * u)));
    for (int u = 1; u < 8; u++) a[0] = _mm256_add_epi64(a[0], a[u]);
    int64_t t[4];
    _mm256_storeu_si256((__m256i *)t, a[0]);
    return (double)(t[0] + t[1] + t[2] + t[3]);
}
