/* Pooling and top-k keep of scored positions on the device: the GPU forms of
 * index/window_scores.c's hkv_ws_pool and hkv_ws_keep, one batch row (a KV
 * head's scores) per block.
 *
 * Keep: scores map to order-preserving 32-bit keys (forced positions to
 * +inf's key); a 4-pass 8-bit radix select finds the key T of the k-th best
 * and how many keys equal to T make the cut; one ordered pass then keeps
 * every key above T and the first such ties by index (hkv_topk's rule: ties
 * to the lower index), writing in index order, so the output ascends
 * without a sort. */
#include <math.h>

#include "gpu_internal.cuh"

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

static __device__ __forceinline__ uint32_t pk_key(float x)
{
    if (x == 0.0f) x = 0.0f;
    const uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static __device__ __forceinline__ int64_t pk_pos(const int32_t *rows, int64_t lo, int64_t i)
{
    return rows ? (int64_t)rows[i] : lo + i;
}

static __device__ __forceinline__ uint32_t pk_key_at(const float *s, const int32_t *rows, int64_t lo,
                                                     int64_t force_from, int64_t i)
{
    return pk_pos(rows, lo, i) >= force_from ? pk_key(INFINITY) : pk_key(s[i]);
}

/* One block per batch row b. */
static __global__ void __launch_bounds__(PK_THREADS)
k_keep(const float *scores, int64_t lds, int64_t n, const int32_t *n_len, const int32_t *rows_all,
       int64_t rows_ld, int64_t lo, int64_t k, int64_t force_from, int32_t *out_all, int64_t out_ld,
       int32_t *n_out)
{
    __shared__ uint32_t hist[256];
    __shared__ uint32_t prefix_s, mask_s;
    __shared__ int64_t krem_s;
    __shared__ int wsel[PK_THREADS / 32];
    const int64_t b = blockIdx.x, nb = n_len ? (int64_t)n_len[b] : n;
    const float *s = scores + b * lds;
    const int32_t *rows = rows_all ? rows_all + b * rows_ld : NULL;
    int32_t *out = out_all + b * out_ld;
    const int64_t m = k < nb ? k : nb;
    const bool all = k >= nb;
    if (threadIdx.x == 0) prefix_s = 0, mask_s = 0, krem_s = m;
    __syncthreads();
    if (!all)
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
            __syncthreads();
            const uint32_t prefix = prefix_s, mask = mask_s;
            for (int64_t i = threadIdx.x; i < nb; i += blockDim.x) {
                const uint32_t u = pk_key_at(s, rows, lo, force_from, i);
                if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1u);
            }
            __syncthreads();
            if (threadIdx.x == 0) {   /* the bin holding the krem-th largest among the matches */
                int64_t cum = 0;
                for (int bin = 255; bin >= 0; bin--) {
                    if (cum + hist[bin] >= krem_s) {
                        prefix_s = prefix | ((uint32_t)bin << shift);
                        mask_s = mask | (255u << shift);
                        krem_s -= cum;
                        break;
                    }
                    cum += hist[bin];
                }
            }
            __syncthreads();
        }
    const uint32_t T = prefix_s;     /* key of the m-th best (unused when all) */
    const int64_t ties = krem_s;     /* keys equal to T that make the cut */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int64_t written = 0, eq_seen = 0;
    for (int64_t b0 = 0; b0 < nb; b0 += blockDim.x) {
        const int64_t i = b0 + threadIdx.x;
        uint32_t u = 0;
        if (i < nb && !all) u = pk_key_at(s, rows, lo, force_from, i);
        const bool eq = i < nb && !all && u == T;
        /* rank of this tie among the ties so far, in index order */
        const uint32_t beq = __ballot_sync(0xffffffffu, eq);
        if (lane == 0) wsel[w] = __popc(beq);
        __syncthreads();
        int64_t eq_before = 0, eq_all = 0;
        for (int j = 0; j < nw; j++) {
            if (j < w) eq_before += wsel[j];
            eq_all += wsel[j];
        }
        __syncthreads();
        const int64_t er = eq_seen + eq_before + __popc(beq & ((1u << lane) - 1u));
        const bool f = i < nb && (all || u > T || (eq && er < ties));
        const uint32_t bf = __ballot_sync(0xffffffffu, f);
        if (lane == 0) wsel[w] = __popc(bf);
        __syncthreads();
        int64_t f_before = 0, f_all = 0;
        for (int j = 0; j < nw; j++) {
            if (j < w) f_before += wsel[j];
            f_all += wsel[j];
        }
        if (f) out[written + f_before + __popc(bf & ((1u << lane) - 1u))] = (int32_t)pk_pos(rows, lo, i);
        written += f_all;
        eq_seen += eq_all;
        __syncthreads();   /* wsel is rewritten next round */
    }
    if (threadIdx.x == 0) n_out[b] = (int32_t)m;
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
