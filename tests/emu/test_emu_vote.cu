/* Warp votes, __activemask, __syncwarp and the warp reduce/match functions of
 * the CUDA emulator against the CUDA C++ Programming Guide:
 *  - "Warp Vote Functions": __ballot_sync(mask, p) has bit N set iff lane N
 *    is in mask and its predicate is non-zero; __any_sync / __all_sync are
 *    non-zero iff the predicate is non-zero for any / all of the lanes in
 *    mask. Lanes outside the mask do not call (they take another branch or
 *    call with their own mask at the same time); partial warps.
 *  - __activemask(): the caller's own bit is set, and only lanes that exist
 *    (a partial warp has no lanes past the block's end).
 *  - "Synchronization Functions", __syncwarp(mask): the lanes in mask wait for
 *    each other, and shared-memory writes before it are visible to the lanes
 *    of the mask after it (lane groups exchanging through shared memory).
 *  - "Warp Reduce Functions" (sm_80+): __reduce_add/min/max_sync with the
 *    unsigned and the int overloads; "Warp Match Functions":
 *    __match_any_sync returns the lanes of mask holding the same value. */
#include <limits.h>
#include <stdint.h>

#include <vector>

#include "emu_test.h"

enum { V_BALLOT, V_ANY, V_ALL, N_VOTES };
static const char *vote_names[N_VOTES] = {"__ballot_sync", "__any_sync", "__all_sync"};

static __device__ int lin_tid(void)
{
    return threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y;
}

/* one vote kind per block; mask 0: the thread does not call */
static __global__ void k_vote(const int *op, const unsigned *mask, const int *pred, unsigned *out)
{
    const int nt = blockDim.x * blockDim.y * blockDim.z;
    const int t = blockIdx.x * nt + lin_tid();
    const unsigned m = mask[t];
    if (!m) return;
    const int p = pred[t];
    unsigned r;
    switch (op[blockIdx.x]) {
    case V_BALLOT: r = __ballot_sync(m, p); break;
    case V_ANY: r = (unsigned)__any_sync(m, p); break;
    default: r = (unsigned)__all_sync(m, p); break;
    }
    out[t] = r;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

enum { MK_ALL, MK_LOW, MK_EVEN_ODD, MK_SINGLE, MK_RANDOM2, MK_ONE_GROUP_ONLY, N_MK };
/* mask of lane l in a warp whose existing lanes are ex; salt varies random ones */
static unsigned vote_mask(int kind, unsigned ex, int lane, uint64_t salt)
{
    const unsigned bit = 1u << lane;
    if (!(ex & bit)) return 0;
    switch (kind) {
    case MK_ALL: return ex;
    case MK_LOW: return (ex & 0xffffu) & bit ? ex & 0xffffu : ex & 0xffff0000u;
    case MK_EVEN_ODD: return ex & ((lane & 1) ? 0xaaaaaaaau : 0x55555555u);
    case MK_SINGLE: return bit;
    case MK_RANDOM2: {
        const unsigned a = (unsigned)mix(salt) & ex;
        return (a & bit) ? a : ex & ~a;
    }
    default: {
        /* only a random subset calls at all; the others skip the vote */
        const unsigned a = ((unsigned)mix(salt + 7) | 1u) & ex;
        return (a & bit) ? a : 0;
    }
    }
}

static void test_votes(void)
{
    const dim3 shapes[] = {dim3(32), dim3(64), dim3(40), dim3(7), dim3(33), dim3(5, 8, 1), dim3(3, 3, 3)};
    int runs = 0;
    for (const dim3 &blk : shapes) {
        const int nt = (int)(blk.x * blk.y * blk.z);
        std::vector<int> ops, pred;
        std::vector<unsigned> mask;
        std::vector<std::string> desc;
        for (int op = 0; op < N_VOTES; op++)
            for (int mk = 0; mk < N_MK; mk++)
                for (int pk = 0; pk < 6; pk++)
                    for (int rep = 0; rep < (mk >= MK_RANDOM2 || pk == 5 ? 8 : 1); rep++) {
                        const int b = (int)ops.size();
                        ops.push_back(op);
                        for (int i = 0; i < nt; i++) {
                            const int wp = i / 32, lane = i % 32;
                            const int in_warp = nt - wp * 32 < 32 ? nt - wp * 32 : 32;
                            const unsigned ex = in_warp == 32 ? 0xffffffffu : (1u << in_warp) - 1;
                            mask.push_back(vote_mask(mk, ex, lane, (uint64_t)b * 131 + wp));
                            /* predicates: all 0; all non-zero (not only 1); lane 0 only; the
                             * warp's last lane only; alternating; random, with large values */
                            const int last = in_warp - 1;
                            int p;
                            switch (pk) {
                            case 0: p = 0; break;
                            case 1: p = (i % 3 == 0) ? 0x100 : (i % 3 == 1) ? INT_MIN : -1; break;
                            case 2: p = lane == 0; break;
                            case 3: p = lane == last ? 0x10000 : 0; break;
                            case 4: p = lane & 1; break;
                            default: p = (mix((uint64_t)b * 977 + i) & 1) ? (int)(mix(i) | 1) : 0; break;
                            }
                            pred.push_back(p);
                        }
                        char d[160];
                        snprintf(d, sizeof d, "%s, block %ux%ux%u, mask kind %d, predicate kind %d (rep %d)",
                                 vote_names[op], blk.x, blk.y, blk.z, mk, pk, rep);
                        desc.push_back(d);
                    }
        const int nb = (int)ops.size();
        const size_t n = (size_t)nb * nt;
        int *d_op, *d_pred;
        unsigned *d_mask, *d_out;
        CUDA_OK(cudaMalloc((void **)&d_op, nb * sizeof(int)));
        CUDA_OK(cudaMalloc((void **)&d_pred, n * sizeof(int)));
        CUDA_OK(cudaMalloc((void **)&d_mask, n * sizeof(unsigned)));
        CUDA_OK(cudaMalloc((void **)&d_out, n * sizeof(unsigned)));
        CUDA_OK(cudaMemcpy(d_op, ops.data(), nb * sizeof(int), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(d_pred, pred.data(), n * sizeof(int), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(d_mask, mask.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemset(d_out, 0x5c, n * sizeof(unsigned)));
        HKV_LAUNCH(k_vote, nb, blk, 0, 0)(d_op, d_mask, d_pred, d_out);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<unsigned> out(n);
        CUDA_OK(cudaMemcpy(out.data(), d_out, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int b = 0; b < nb; b++)
            for (int i = 0; i < nt; i++) {
                const size_t k = (size_t)b * nt + i;
                const unsigned m = mask[k];
                if (!m) {
                    if (out[k] != 0x5c5c5c5cu && bad++ < 5) CHECK(0, "%s: thread %d did not call, yet wrote", desc[b].c_str(), i);
                    continue;
                }
                /* the documented result, from the lanes of this warp named in m */
                unsigned ballot = 0;
                const int base = i / 32 * 32;
                for (int l = 0; l < 32; l++)
                    if ((m & (1u << l)) && pred[(size_t)b * nt + base + l] != 0) ballot |= 1u << l;
                bool ok;
                if (ops[b] == V_BALLOT) ok = out[k] == ballot;
                else if (ops[b] == V_ANY) ok = (out[k] != 0) == (ballot != 0);
                else ok = (out[k] != 0) == (ballot == m);
                if (!ok && bad++ < 5)
                    CHECK(0, "%s: thread %d (mask 0x%08x) got 0x%08x, ballot of the mask 0x%08x", desc[b].c_str(), i,
                          m, out[k], ballot);
            }
        CHECK(bad == 0, "%d wrong vote results for blocks of %u x %u x %u", bad, blk.x, blk.y, blk.z);
        runs += nb;
        cudaFree(d_op);
        cudaFree(d_pred);
        cudaFree(d_mask);
        cudaFree(d_out);
    }
    printf("votes: %d block configurations\n", runs);
}

/* __activemask: each thread, and then only the odd lanes (a divergent branch) */
static __global__ void k_activemask(unsigned *all, unsigned *odd)
{
    const int t = blockIdx.x * blockDim.x * blockDim.y * blockDim.z + lin_tid();
    all[t] = __activemask();
    if (lin_tid() & 1) odd[t] = __activemask();
}

static void test_activemask(void)
{
    const dim3 shapes[] = {dim3(7), dim3(40), dim3(33), dim3(64), dim3(3, 5, 1)};
    for (const dim3 &blk : shapes) {
        const int nt = (int)(blk.x * blk.y * blk.z), nb = 3;
        unsigned *d_all, *d_odd;
        CUDA_OK(cudaMalloc((void **)&d_all, nb * nt * sizeof(unsigned)));
        CUDA_OK(cudaMalloc((void **)&d_odd, nb * nt * sizeof(unsigned)));
        CUDA_OK(cudaMemset(d_odd, 0, nb * nt * sizeof(unsigned)));
        HKV_LAUNCH(k_activemask, nb, blk, 0, 0)(d_all, d_odd);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<unsigned> all(nb * nt), odd(nb * nt);
        CUDA_OK(cudaMemcpy(all.data(), d_all, all.size() * 4, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(odd.data(), d_odd, odd.size() * 4, cudaMemcpyDeviceToHost));
        for (int k = 0; k < nb * nt; k++) {
            const int i = k % nt, wp = i / 32, lane = i % 32;
            const int in_warp = nt - wp * 32 < 32 ? nt - wp * 32 : 32;
            const unsigned ex = in_warp == 32 ? 0xffffffffu : (1u << in_warp) - 1;
            CHECK((all[k] >> lane) & 1, "__activemask of thread %d (block of %d) 0x%08x lacks its own lane", i, nt, all[k]);
            CHECK((all[k] & ~ex) == 0, "__activemask of thread %d (block of %d) 0x%08x names lanes past the warp's %d",
                  i, nt, all[k], in_warp);
            if (i & 1) {
                CHECK((odd[k] >> lane) & 1, "__activemask in a branch: 0x%08x lacks lane %d", odd[k], lane);
                CHECK((odd[k] & ~ex) == 0, "__activemask in a branch: 0x%08x past the warp", odd[k]);
            }
        }
        cudaFree(d_all);
        cudaFree(d_odd);
    }
}

/* __syncwarp(mask): groups of lanes of width g (mask of the group) exchange
 * values through shared memory for R rounds: each lane writes, syncs, reads
 * the next lane of its group, syncs. Without the synchronisation (or with
 * one that does not order memory) a lane reads a stale value. g == 32 uses
 * __syncwarp() without a mask. */
#define SW_ROUNDS 6
static __global__ void k_syncwarp(int g, int *out)
{
    __shared__ int s[64];
    const int t = threadIdx.x, lane = t % 32, base = t / 32 * 32;
    const int gs = lane / g * g;
    const unsigned gm = g == 32 ? 0xffffffffu : ((1u << g) - 1) << gs;
    int v = t * 1000 + blockIdx.x;
    for (int r = 0; r < SW_ROUNDS; r++) {
        s[t] = v;
        if (g == 32) __syncwarp();
        else __syncwarp(gm);
        const int peer = base + gs + (lane - gs + 1) % g;
        v = s[peer] * 3 + r;
        if (g == 32) __syncwarp();
        else __syncwarp(gm);
    }
    out[blockIdx.x * 64 + t] = v;
}

static void test_syncwarp(void)
{
    const int nb = 16;
    for (int g = 1; g <= 32; g *= 2) {
        int *d_out;
        CUDA_OK(cudaMalloc((void **)&d_out, nb * 64 * sizeof(int)));
        HKV_LAUNCH(k_syncwarp, nb, 64, 0, 0)(g, d_out);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<int> out(nb * 64);
        CUDA_OK(cudaMemcpy(out.data(), d_out, out.size() * sizeof(int), cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int b = 0; b < nb; b++) {
            std::vector<int> v(64), s(64);
            for (int t = 0; t < 64; t++) v[t] = t * 1000 + b;
            for (int r = 0; r < SW_ROUNDS; r++) {
                s = v;
                for (int t = 0; t < 64; t++) {
                    const int lane = t % 32, base = t / 32 * 32, gs = lane / g * g;
                    v[t] = (int)((unsigned)s[base + gs + (lane - gs + 1) % g] * 3u + (unsigned)r);
                }
            }
            for (int t = 0; t < 64; t++) bad += out[b * 64 + t] != v[t];
        }
        CHECK(bad == 0, "__syncwarp exchange in groups of %d: %d wrong values", g, bad);
        cudaFree(d_out);
    }
}

/* reduce / match: one kind per block over the whole (possibly partial) warp */
enum { R_ADD_U, R_MIN_U, R_MAX_U, R_ADD_I, R_MIN_I, R_MAX_I, R_MATCH, N_RED };
static const char *red_names[N_RED] = {"__reduce_add_sync(unsigned)", "__reduce_min_sync(unsigned)",
                                       "__reduce_max_sync(unsigned)", "__reduce_add_sync(int)",
                                       "__reduce_min_sync(int)", "__reduce_max_sync(int)", "__match_any_sync"};

static __global__ void k_reduce(int kind, const unsigned *val, unsigned *out)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const int nt = blockDim.x, w0 = threadIdx.x / 32 * 32;
    const int in_warp = nt - w0 < 32 ? nt - w0 : 32;
    const unsigned m = in_warp == 32 ? 0xffffffffu : (1u << in_warp) - 1;
    const unsigned u = val[t];
    const int i = (int)u;
    unsigned r;
    switch (kind) {
    case R_ADD_U: r = __reduce_add_sync(m, u); break;
    case R_MIN_U: r = __reduce_min_sync(m, u); break;
    case R_MAX_U: r = __reduce_max_sync(m, u); break;
    case R_ADD_I: { int x = __reduce_add_sync(m, i); r = (unsigned)x; break; }
    case R_MIN_I: { int x = __reduce_min_sync(m, i); r = (unsigned)x; break; }
    case R_MAX_I: { int x = __reduce_max_sync(m, i); r = (unsigned)x; break; }
    default: r = __match_any_sync(m, u % 5); break;
    }
    out[t] = r;
}

static void test_reduce(void)
{
    const int nts[] = {32, 40, 7};
    const int nb = 8;
    for (int kind = 0; kind < N_RED; kind++)
        for (int nt : nts) {
            std::vector<unsigned> val(nb * nt);
            for (size_t k = 0; k < val.size(); k++) {
                const uint64_t h = mix(k * 31 + kind);
                /* signed-looking values in half the blocks: negative ints */
                val[k] = (k / nt) & 1 ? (unsigned)(int)((int64_t)(h % 2000001) - 1000000) : (unsigned)h;
            }
            unsigned *d_val, *d_out;
            CUDA_OK(cudaMalloc((void **)&d_val, val.size() * 4));
            CUDA_OK(cudaMalloc((void **)&d_out, val.size() * 4));
            CUDA_OK(cudaMemcpy(d_val, val.data(), val.size() * 4, cudaMemcpyHostToDevice));
            HKV_LAUNCH(k_reduce, nb, nt, 0, 0)(kind, d_val, d_out);
            CUDA_OK(cudaGetLastError());
            CUDA_OK(cudaDeviceSynchronize());
            std::vector<unsigned> out(val.size());
            CUDA_OK(cudaMemcpy(out.data(), d_out, out.size() * 4, cudaMemcpyDeviceToHost));
            int bad = 0;
            unsigned first_got = 0, first_want = 0;
            for (int b = 0; b < nb; b++)
                for (int t = 0; t < nt; t++) {
                    const int w0 = t / 32 * 32, in_warp = nt - w0 < 32 ? nt - w0 : 32;
                    const unsigned *v = &val[(size_t)b * nt + w0];
                    unsigned want = 0;
                    if (kind == R_ADD_U || kind == R_ADD_I) {
                        for (int l = 0; l < in_warp; l++) want += v[l];
                    } else if (kind == R_MIN_U) {
                        want = v[0];
                        for (int l = 1; l < in_warp; l++) want = v[l] < want ? v[l] : want;
                    } else if (kind == R_MAX_U) {
                        want = v[0];
                        for (int l = 1; l < in_warp; l++) want = v[l] > want ? v[l] : want;
                    } else if (kind == R_MIN_I || kind == R_MAX_I) {
                        int x = (int)v[0];
                        for (int l = 1; l < in_warp; l++)
                            x = kind == R_MIN_I ? ((int)v[l] < x ? (int)v[l] : x) : ((int)v[l] > x ? (int)v[l] : x);
                        want = (unsigned)x;
                    } else {
                        for (int l = 0; l < in_warp; l++)
                            if (v[l] % 5 == v[t % 32] % 5) want |= 1u << l;
                    }
                    const unsigned got = out[(size_t)b * nt + t];
                    if (got != want && !bad++) first_got = got, first_want = want;
                }
            if (kind == R_MIN_I || kind == R_MAX_I)
                CHECK(bad == 0,
                                    "%s over warps of %d lanes: %d wrong, first 0x%08x (%d), want 0x%08x (%d): the int "
                                    "overload compares as unsigned (gpu/emu/emu_device.h, __reduce_min/max_sync)",
                                    red_names[kind], nt, bad, first_got, (int)first_got, first_want, (int)first_want);
            else
                CHECK(bad == 0, "%s over warps of %d lanes: %d wrong, first 0x%08x (%d), want 0x%08x (%d)",
                      red_names[kind], nt, bad, first_got, (int)first_got, first_want, (int)first_want);
            cudaFree(d_val);
            cudaFree(d_out);
        }
}

int main(void)
{
    test_votes();
    test_activemask();
    test_syncwarp();
    test_reduce();
    return test_report("emu_vote");
}
