/* Block barriers of the CUDA emulator against the CUDA C++ Programming Guide,
 * "Synchronization Functions":
 *  - __syncthreads() waits until every thread of the block has reached it, and
 *    all shared (and global) memory accesses made before it are visible to
 *    every thread of the block after it: rounds of producer/consumer exchange
 *    through static __shared__ and dynamic (HKV_DYN_SHARED) shared memory,
 *    each thread reading values written by threads of other warps, in 1-D,
 *    2-D and 3-D blocks up to 1024 threads;
 *  - __syncthreads_count(p) returns the number of threads with p non-zero,
 *    __syncthreads_and(p) non-zero iff p is non-zero for all threads,
 *    __syncthreads_or(p) non-zero iff for any thread, every thread receiving
 *    the same result;
 *  - shared memory is per block ("Thread Hierarchy"): blocks that run at the
 *    same time (the emulator runs blocks on several host threads) do not see
 *    each other's __shared__ variables;
 *  - dynamic shared memory declared with __align__(16) is 16-byte aligned. */
#include <stdint.h>

#include <vector>

#include "emu_test.h"

#define ROUNDS 5

static __device__ int lin_tid(void)
{
    return threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y;
}
static __device__ __host__ int peer_of(int i, int r, int n) { return (int)(((unsigned)i * 7u + 3u + 11u * (unsigned)r) % (unsigned)n); }
/* a permutation of 0..n-1 for every n */
static __device__ __host__ int perm(int i, int r, int n) { return (n - 1 - i + r) % n; }
static __device__ __host__ int step(int v, int r, int i) { return (int)((unsigned)v * 2654435761u + (unsigned)r + (unsigned)i); }

/* static shared memory: 1024 ints, every thread writes its slot, the block
 * syncs, every thread reads another's slot, syncs again */
static __global__ void k_exchange_static(int *out)
{
    __shared__ int s[1024];
    __shared__ unsigned owner;   /* per block: checked against blockIdx */
    const int n = blockDim.x * blockDim.y * blockDim.z, i = lin_tid();
    const unsigned bid = blockIdx.x + blockIdx.y * gridDim.x;
    if (i == 0) owner = bid;
    int v = i + 100000 * (int)bid;
    for (int r = 0; r < ROUNDS; r++) {
        s[i] = v;
        __syncthreads();
        v = step(s[peer_of(i, r, n)], r, i);
        __syncthreads();
    }
    out[bid * n + i] = owner == bid ? v : -1;
}

/* the same through dynamic shared memory: two n-int arrays back to back */
static __global__ void k_exchange_dynamic(int *out, unsigned *misaligned)
{
    HKV_DYN_SHARED(int, dyn);
    const int n = blockDim.x * blockDim.y * blockDim.z, i = lin_tid();
    int *a = dyn, *b = dyn + n;
    if ((uintptr_t)dyn % 16) atomicAdd(misaligned, 1u);
    int v = i + 100000 * (int)blockIdx.x;
    for (int r = 0; r < ROUNDS; r++) {
        int *s = (r & 1) ? b : a;   /* alternating buffers: one barrier per round suffices */
        s[i] = v;
        __syncthreads();
        v = step(s[peer_of(i, r, n)], r, i);
    }
    out[blockIdx.x * n + i] = v;
}

static std::vector<int> host_exchange(int n, int bid)
{
    std::vector<int> v(n), s(n);
    for (int i = 0; i < n; i++) v[i] = i + 100000 * bid;
    for (int r = 0; r < ROUNDS; r++) {
        s = v;
        for (int i = 0; i < n; i++) v[i] = step(s[peer_of(i, r, n)], r, i);
    }
    return v;
}

static void test_exchange(void)
{
    const dim3 shapes[] = {dim3(1024), dim3(16, 16, 1), dim3(8, 4, 4), dim3(32, 32, 1), dim3(7, 5, 3), dim3(1, 1, 64),
                           dim3(2, 3, 1), dim3(1)};
    for (const dim3 &blk : shapes) {
        const int n = (int)(blk.x * blk.y * blk.z);
        const dim3 grid(6, 2);
        const int nb = 12;
        int *d_out;
        unsigned *d_mis;
        CUDA_OK(cudaMalloc((void **)&d_out, (size_t)nb * n * sizeof(int)));
        CUDA_OK(cudaMalloc((void **)&d_mis, sizeof(unsigned)));
        CUDA_OK(cudaMemset(d_mis, 0, sizeof(unsigned)));
        std::vector<int> out((size_t)nb * n);
        for (int dyn = 0; dyn < 2; dyn++) {
            CUDA_OK(cudaMemset(d_out, 0, (size_t)nb * n * sizeof(int)));
            if (!dyn) HKV_LAUNCH(k_exchange_static, grid, blk, 0, 0)(d_out);
            else HKV_LAUNCH(k_exchange_dynamic, nb, blk, 2 * n * sizeof(int), 0)(d_out, d_mis);
            CUDA_OK(cudaGetLastError());
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(cudaMemcpy(out.data(), d_out, out.size() * sizeof(int), cudaMemcpyDeviceToHost));
            int bad = 0;
            for (int b = 0; b < nb; b++) {
                const std::vector<int> want = host_exchange(n, b);
                for (int i = 0; i < n; i++) bad += out[(size_t)b * n + i] != want[i];
            }
            CHECK(bad == 0, "%s shared-memory exchange across __syncthreads, block %ux%ux%u: %d of %d wrong",
                  dyn ? "dynamic" : "static", blk.x, blk.y, blk.z, bad, nb * n);
        }
        unsigned mis = 1;
        CUDA_OK(cudaMemcpy(&mis, d_mis, sizeof mis, cudaMemcpyDeviceToHost));
        CHECK(mis == 0, "dynamic shared memory not 16-byte aligned in %u threads", mis);
        cudaFree(d_out);
        cudaFree(d_mis);
    }
}

/* __syncthreads_count/_and/_or: per round a predicate pattern; every thread
 * records the three results. Between rounds the predicates come from shared
 * memory written before the previous barrier, so the barriers' memory
 * ordering is exercised too. */
#define PAT 6
static __global__ void k_sync_reduce(const int *pred, int *out)
{
    __shared__ int sp[1024];
    const int n = blockDim.x * blockDim.y * blockDim.z, i = lin_tid();
    const int *p = pred + (size_t)blockIdx.x * PAT * n;
    int *o = out + ((size_t)blockIdx.x * n + i) * PAT * 3;
    sp[i] = p[i];
    __syncthreads();
    for (int r = 0; r < PAT; r++) {
        /* thread i's predicate of round r > 0 was written by another thread */
        const int mine = sp[i];
        o[r * 3 + 0] = __syncthreads_count(mine);
        if (r + 1 < PAT) sp[perm(i, r, n)] = p[(r + 1) * n + perm(i, r, n)];
        o[r * 3 + 1] = __syncthreads_and(mine);
        o[r * 3 + 2] = __syncthreads_or(mine);
    }
}

static void test_sync_reduce(void)
{
    const dim3 shapes[] = {dim3(256), dim3(1024), dim3(7, 5, 3), dim3(33), dim3(1), dim3(4, 4, 4)};
    for (const dim3 &blk : shapes) {
        const int n = (int)(blk.x * blk.y * blk.z), nb = 8;
        std::vector<int> pred((size_t)nb * PAT * n);
        uint64_t s = 12345;
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < PAT; r++)
                for (int i = 0; i < n; i++) {
                    s = s * 6364136223846793005ull + 1442695040888963407ull;
                    int v;
                    switch ((r + b) % PAT) {
                    case 0: v = 0; break;                               /* none */
                    case 1: v = (i % 2) ? -7 : 0x40000000; break;        /* all, values other than 1 */
                    case 2: v = i == n - 1; break;                      /* only the last thread */
                    case 3: v = i != n / 2; break;                      /* all but one */
                    case 4: v = (int)(s >> 60) & 1; break;              /* random half */
                    default: v = (s >> 33) % 17 == 0 ? 3 : 0; break;    /* sparse */
                    }
                    pred[((size_t)b * PAT + r) * n + i] = v;
                }
        int *d_pred, *d_out;
        CUDA_OK(cudaMalloc((void **)&d_pred, pred.size() * sizeof(int)));
        CUDA_OK(cudaMalloc((void **)&d_out, pred.size() * 3 * sizeof(int)));
        CUDA_OK(cudaMemcpy(d_pred, pred.data(), pred.size() * sizeof(int), cudaMemcpyHostToDevice));
        HKV_LAUNCH(k_sync_reduce, nb, blk, 0, 0)(d_pred, d_out);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<int> out(pred.size() * 3);
        CUDA_OK(cudaMemcpy(out.data(), d_out, out.size() * sizeof(int), cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < PAT; r++) {
                int cnt = 0;
                for (int i = 0; i < n; i++) cnt += pred[((size_t)b * PAT + r) * n + i] != 0;
                for (int i = 0; i < n; i++) {
                    const int *o = &out[(((size_t)b * n + i) * PAT + r) * 3];
                    const bool ok = o[0] == cnt && (o[1] != 0) == (cnt == n) && (o[2] != 0) == (cnt > 0);
                    if (!ok && bad++ < 3)
                        CHECK(0, "block %ux%ux%u round %d thread %d: count %d and %d or %d; want count %d", blk.x,
                              blk.y, blk.z, r, i, o[0], o[1], o[2], cnt);
                }
            }
        CHECK(bad == 0, "__syncthreads_count/_and/_or in blocks of %ux%ux%u: %d wrong", blk.x, blk.y, blk.z, bad);
        cudaFree(d_pred);
        cudaFree(d_out);
    }
}

int main(void)
{
    test_exchange();
    test_sync_reduce();
    return test_report("emu_barrier");
}
