/* Pooling and top-k keep of scored positions on the device: the GPU forms of
 * index/window_scores.c's hkv_ws_pool and hkv_ws_keep, one batch row (a KV
 * head's scores) per block.
 *
 * Keep: keep_core.cuh's radix select and ordered pass (forced positions
 * as +inf; ties to the lower index, hkv_topk's rule), the output ascending
 * without a sort. */
#include <math.h>

#include "gpu_internal.cuh"
#include "keep_core.cuh"

extern "C" {
#include "gpu_kernels.h"
}

#define PK_THREADS 512

/* grid (blocks over i, batch rows). Max: over [i-r, i+r] clipped; avg: the
 * window's sum (zero padding) / kernel, in float64 as the host's running sum. */
static __global__ void k_pool(const float *in, int64_t ld_in, float *out, int64_t ld_out, int64_t n,
                              const int32_t *n_len, int kernel, int avg)
{
    const int64_t b = blockIdx.y, nb = n_len ? (int64_t)n_len[b] : n;
    const int64_t r = kernel / 2;
    const float *s = in + b * ld_in;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nb;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t a = i - r < 0 ? 0 : i - r, e = i + r < nb - 1 ? i + r : nb - 1;
        if (avg) {
            double acc = 0;
            for (int64_t j = a; j <= e; j++) acc += s[j];
            out[b * ld_out + i] = (float)(acc / kernel);
        } else {
            float m = s[a];
            for (int64_t j = a + 1; j <= e; j++) m = s[j] > m ? s[j] : m;
            out[b * ld_out + i] = m;
        }
    }
}

/* One block per batch row b. */
static __global__ void __launch_bounds__(PK_THREADS)
k_keep(const float *scores, int64_t lds, int64_t n, const int32_t *n_len, const int32_t *rows_all,
       int64_t rows_ld, int64_t lo, int64_t k, int64_t force_from, int32_t *out_all, int64_t out_ld,
       int32_t *n_out)
{
    const int64_t b = blockIdx.x, nb = n_len ? (int64_t)n_len[b] : n;
    kc_keep(scores + b * lds, nb, 1, nb, rows_all ? rows_all + b * rows_ld : NULL, lo, k, force_from,
            out_all + b * out_ld);
    if (threadIdx.x == 0) n_out[b] = (int32_t)(k < nb ? k : nb);
}

extern "C" int hkv_gpu_pool(const float *in, int64_t ld_in, float *out, int64_t ld_out, int n_batch,
                            int64_t n, const int32_t *n_len, int kernel, int avg, void *stream,
                            hkv_err *err)
{
    if (!in || !out || in == out || n_batch < 0 || n_batch > 65535 || n < 0 || ld_in < n ||
        ld_out < n || kernel < 1 || !(kernel & 1) || (avg != 0 && avg != 1))
        return hkv_seterr(err, HKV_E_INVAL, "gpu pool: bad arguments (%d rows of %lld, kernel %d "
                          "(odd), avg %d, in and out distinct)", n_batch, (long long)n, kernel, avg);
    if (!n || !n_batch) return HKV_OK;
    dim3 grid(hkv_grid1(n, 256) > 4096 ? 4096u : hkv_grid1(n, 256), (unsigned)n_batch);
    HKV_LAUNCH(k_pool, grid, 256, 0, hkv_stream(stream))(
        in, ld_in, out, ld_out, n, n_len, kernel, avg);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

extern "C" int hkv_gpu_keep(const float *s, int64_t lds, int n_batch, int64_t n,
                            const int32_t *n_len, const int32_t *rows, int64_t rows_ld, int64_t lo,
                            int64_t k, int64_t force_from, int32_t *out, int64_t out_ld,
                            int32_t *n_out, void *stream, hkv_err *err)
{
    if (!s || !out || !n_out || n_batch < 0 || n_batch > 2147483647 || n < 0 ||
        n > 2147483647 || lds < n || (rows && rows_ld < n) || k < 0 ||
        out_ld < (k < n ? k : n) || lo < 0 || (!rows && lo + n > 2147483647))
        return hkv_seterr(err, HKV_E_INVAL, "gpu keep: bad arguments (%d rows of %lld scores, k "
                          "%lld, out_ld %lld)", n_batch, (long long)n, (long long)k,
                          (long long)out_ld);
    if (!n_batch) return HKV_OK;
    HKV_LAUNCH(k_keep, (unsigned)n_batch, PK_THREADS, 0, hkv_stream(stream))(
        s, lds, n, n_len, rows, rows_ld, lo, k, force_from, out, out_ld, n_out);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}
