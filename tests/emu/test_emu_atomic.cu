/* Atomic functions of the CUDA emulator against the CUDA C++ Programming
 * Guide, "Atomic Functions": each reads the old value at an address, computes
 * the new one and stores it in one indivisible step, returning the old value:
 *   atomicAdd/Sub/Exch/Min/Max/And/Or/Xor (int, unsigned, unsigned long long,
 *   long long where the guide lists them; atomicAdd also float and double),
 *   atomicCAS: (old == compare ? val : old),
 *   atomicInc: ((old >= val) ? 0 : (old + 1)),
 *   atomicDec: (((old == 0) || (old > val)) ? val : (old - 1)).
 * Many threads in many blocks (the emulator runs blocks at the same time on
 * its worker threads) hit the same addresses; the final values and the
 * multisets of returned old values are checked against host computations
 * (for a sum, any order of the additions gives the same integer result; the
 * float and double additions are chosen exact). Shared-memory atomics too. */
#include <limits.h>
#include <stdint.h>

#include <algorithm>
#include <vector>

#include "emu_test.h"

#define NB 64
#define NT 256
#define N (NB * NT)
#define REP 4   /* operations per thread on the contended address */

static uint32_t h32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}
static __device__ uint32_t d_h32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

struct acc {
    int i_add, i_sub, i_min, i_max, i_exch, i_cas;
    unsigned u_add, u_min, u_max, u_and, u_or, u_xor, u_inc, u_dec;
    unsigned long long ull_add, ull_min, ull_max, ull_or, ull_cas;
    long long ll_min, ll_max;
    float f_add;
    double d_add;
    unsigned u_cnt;   /* CAS-loop counter */
};

/* every thread, REP times: the contended operations; olds recorded */
static __global__ void k_atomics(acc *a, int *old_i_add, float *old_f_add, unsigned long long *old_ull,
                                 unsigned *old_inc, unsigned *old_dec, int *old_exch, int *cas_win)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    for (int r = 0; r < REP; r++) {
        const int k = t * REP + r;
        const uint32_t h = d_h32((uint32_t)k);
        old_i_add[k] = atomicAdd(&a->i_add, 1);
        atomicSub(&a->i_sub, (int)(h % 1000) - 500);
        atomicMin(&a->i_min, (int)h);
        atomicMax(&a->i_max, (int)h);
        atomicAdd(&a->u_add, h);
        atomicMin(&a->u_min, h);
        atomicMax(&a->u_max, h);
        atomicAnd(&a->u_and, ~(1u << (h % 32)) | (h & 0xffff0000u));
        atomicOr(&a->u_or, 1u << (k % 32));
        atomicXor(&a->u_xor, h);
        old_inc[k] = atomicInc(&a->u_inc, 1000u);
        old_dec[k] = atomicDec(&a->u_dec, 1000u);
        old_ull[k] = atomicAdd(&a->ull_add, (1ull << 33) + 1ull);
        atomicMin(&a->ull_min, ((unsigned long long)h << 32) | (unsigned)k);
        atomicMax(&a->ull_max, ((unsigned long long)h << 32) | (unsigned)k);
        atomicOr(&a->ull_or, 1ull << (k % 64));
        atomicMin(&a->ll_min, (long long)(int)h * 1000003ll);
        atomicMax(&a->ll_max, (long long)(int)h * 1000003ll);
        old_f_add[k] = atomicAdd(&a->f_add, 1.0f);
        atomicAdd(&a->d_add, ldexp(1.0, -30) * (double)(h % 64));
        old_exch[k] = atomicExch(&a->i_exch, k);
        /* increment through a CAS loop */
        unsigned o = a->u_cnt, seen;
        while ((seen = atomicCAS(&a->u_cnt, o, o + 1)) != o) o = seen;
        /* one winner per slot: only the first CAS from -1 succeeds */
        cas_win[k] = atomicCAS(&a->i_cas, -1, k) == -1;
        atomicCAS(&a->ull_cas, 0xffffffffffffffffull, (unsigned long long)k);
    }
}

/* shared-memory atomics: a block histogram, then added to global */
static __global__ void k_shared_hist(const unsigned *v, int n, unsigned *hist)
{
    __shared__ unsigned sh[64];
    if (threadIdx.x < 64) sh[threadIdx.x] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        atomicAdd(&sh[v[i] % 64], 1u);
    __syncthreads();
    if (threadIdx.x < 64) atomicAdd(&hist[threadIdx.x], sh[threadIdx.x]);
}

/* single operations at edge values: out[i] = old, *p after each in out2 */
static __global__ void k_edges(unsigned *cell, unsigned *out)
{
    /* atomicInc/Dec: each line is (initial, val) */
    const unsigned cases[][2] = {{5, 3}, {3, 3}, {2, 3}, {0, 0}, {7, 0}, {UINT_MAX - 1, UINT_MAX}, {UINT_MAX, UINT_MAX},
                                 {0, UINT_MAX}, {1000, 999}};
    const int nc = sizeof cases / sizeof cases[0];
    for (int i = 0; i < nc; i++) {
        *cell = cases[i][0];
        out[4 * i + 0] = atomicInc(cell, cases[i][1]);
        out[4 * i + 1] = *cell;
        *cell = cases[i][0];
        out[4 * i + 2] = atomicDec(cell, cases[i][1]);
        out[4 * i + 3] = *cell;
    }
}

static void test_contended(void)
{
    acc init;
    memset(&init, 0, sizeof init);
    init.i_sub = 12345;
    init.i_min = INT_MAX;
    init.i_max = INT_MIN;
    init.u_min = UINT_MAX;
    init.u_and = 0xffffffffu;
    init.u_dec = 0;
    init.ull_min = ~0ull;
    init.ll_min = LLONG_MAX;
    init.ll_max = LLONG_MIN;
    init.i_exch = -5;
    init.i_cas = -1;
    init.ull_cas = ~0ull;
    const int K = N * REP;
    acc *d_a;
    int *d_oi, *d_ox, *d_win;
    float *d_of;
    unsigned long long *d_oull;
    unsigned *d_oinc, *d_odec;
    CUDA_OK(cudaMalloc((void **)&d_a, sizeof(acc)));
    CUDA_OK(cudaMalloc((void **)&d_oi, K * sizeof(int)));
    CUDA_OK(cudaMalloc((void **)&d_ox, K * sizeof(int)));
    CUDA_OK(cudaMalloc((void **)&d_win, K * sizeof(int)));
    CUDA_OK(cudaMalloc((void **)&d_of, K * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&d_oull, K * sizeof(unsigned long long)));
    CUDA_OK(cudaMalloc((void **)&d_oinc, K * sizeof(unsigned)));
    CUDA_OK(cudaMalloc((void **)&d_odec, K * sizeof(unsigned)));
    CUDA_OK(cudaMemcpy(d_a, &init, sizeof init, cudaMemcpyHostToDevice));
    HKV_LAUNCH(k_atomics, NB, NT, 0, 0)(d_a, d_oi, d_of, d_oull, d_oinc, d_odec, d_ox, d_win);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    acc g;
    CUDA_OK(cudaMemcpy(&g, d_a, sizeof g, cudaMemcpyDeviceToHost));
    std::vector<int> oi(K), ox(K), win(K);
    std::vector<float> of(K);
    std::vector<unsigned long long> oull(K);
    std::vector<unsigned> oinc(K), odec(K);
    CUDA_OK(cudaMemcpy(oi.data(), d_oi, K * sizeof(int), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(ox.data(), d_ox, K * sizeof(int), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(win.data(), d_win, K * sizeof(int), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(of.data(), d_of, K * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(oull.data(), d_oull, K * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(oinc.data(), d_oinc, K * sizeof(unsigned), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(odec.data(), d_odec, K * sizeof(unsigned), cudaMemcpyDeviceToHost));

    /* the host's account of the same operations */
    long long i_sub = init.i_sub;
    int i_min = INT_MAX, i_max = INT_MIN;
    unsigned u_add = 0, u_min = UINT_MAX, u_max = 0, u_and = 0xffffffffu, u_or = 0, u_xor = 0;
    unsigned long long ull_min = ~0ull, ull_max = 0, ull_or = 0;
    long long ll_min = LLONG_MAX, ll_max = LLONG_MIN;
    double d_add = 0;
    for (int k = 0; k < K; k++) {
        const uint32_t h = h32((uint32_t)k);
        i_sub -= (int)(h % 1000) - 500;
        i_min = std::min(i_min, (int)h);
        i_max = std::max(i_max, (int)h);
        u_add += h;
        u_min = std::min(u_min, h);
        u_max = std::max(u_max, h);
        u_and &= ~(1u << (h % 32)) | (h & 0xffff0000u);
        u_or |= 1u << (k % 32);
        u_xor ^= h;
        const unsigned long long w = ((unsigned long long)h << 32) | (unsigned)k;
        ull_min = std::min(ull_min, w);
        ull_max = std::max(ull_max, w);
        ull_or |= 1ull << (k % 64);
        ll_min = std::min(ll_min, (long long)(int)h * 1000003ll);
        ll_max = std::max(ll_max, (long long)(int)h * 1000003ll);
        d_add += ldexp(1.0, -30) * (double)(h % 64);
    }
    CHECK(g.i_add == K, "atomicAdd(int) total %d, want %d", g.i_add, K);
    CHECK(g.i_sub == (int)i_sub, "atomicSub(int) %d, want %lld", g.i_sub, i_sub);
    CHECK(g.i_min == i_min && g.i_max == i_max, "atomicMin/Max(int) %d %d, want %d %d", g.i_min, g.i_max, i_min, i_max);
    CHECK(g.u_add == u_add, "atomicAdd(unsigned) 0x%08x, want 0x%08x (mod 2^32)", g.u_add, u_add);
    CHECK(g.u_min == u_min && g.u_max == u_max, "atomicMin/Max(unsigned) 0x%08x 0x%08x, want 0x%08x 0x%08x", g.u_min,
          g.u_max, u_min, u_max);
    CHECK(g.u_and == u_and, "atomicAnd 0x%08x, want 0x%08x", g.u_and, u_and);
    CHECK(g.u_or == u_or && u_or == 0xffffffffu, "atomicOr(unsigned) 0x%08x", g.u_or);
    CHECK(g.u_xor == u_xor, "atomicXor 0x%08x, want 0x%08x", g.u_xor, u_xor);
    CHECK(g.ull_add == (unsigned long long)K * ((1ull << 33) + 1ull), "atomicAdd(unsigned long long) %llu", g.ull_add);
    CHECK(g.ull_min == ull_min && g.ull_max == ull_max, "atomicMin/Max(unsigned long long) %llx %llx, want %llx %llx",
          g.ull_min, g.ull_max, ull_min, ull_max);
    CHECK(g.ull_or == ull_or && ull_or == ~0ull, "atomicOr(unsigned long long) %llx", g.ull_or);
    CHECK(g.ll_min == ll_min && g.ll_max == ll_max, "atomicMin/Max(long long) %lld %lld, want %lld %lld", g.ll_min,
          g.ll_max, ll_min, ll_max);
    CHECK(g.f_add == (float)K, "atomicAdd(float) of 1.0 x %d: %.9g", K, g.f_add);
    CHECK(g.d_add == d_add, "atomicAdd(double) %.17g, want %.17g (exact)", g.d_add, d_add);
    CHECK(g.u_cnt == (unsigned)K, "atomicCAS increment loop %u, want %d", g.u_cnt, K);

    /* returned olds of atomicAdd(+1): exactly 0 .. K-1, each once */
    std::vector<int> s = oi;
    std::sort(s.begin(), s.end());
    bool perm = true;
    for (int k = 0; k < K; k++) perm &= s[k] == k;
    CHECK(perm, "atomicAdd(int) returned olds are not 0..%d once each", K - 1);
    std::vector<float> sf = of;
    std::sort(sf.begin(), sf.end());
    perm = true;
    for (int k = 0; k < K; k++) perm &= sf[k] == (float)k;
    CHECK(perm, "atomicAdd(float) returned olds are not 0..%d once each", K - 1);
    std::vector<unsigned long long> su = oull;
    std::sort(su.begin(), su.end());
    perm = true;
    for (int k = 0; k < K; k++) perm &= su[k] == (unsigned long long)k * ((1ull << 33) + 1ull);
    CHECK(perm, "atomicAdd(unsigned long long) returned olds are not the K partial sums");

    /* atomicInc / atomicDec: a counter modulo val + 1 whatever the order:
     * the olds are the sequential sequence's values, as a multiset */
    std::vector<unsigned> want_inc, want_dec;
    unsigned ci = 0, cd = 0;
    for (int k = 0; k < K; k++) {
        want_inc.push_back(ci);
        ci = ci >= 1000u ? 0 : ci + 1;
        want_dec.push_back(cd);
        cd = (cd == 0 || cd > 1000u) ? 1000u : cd - 1;
    }
    CHECK(g.u_inc == ci, "atomicInc final %u, want %u", g.u_inc, ci);
    CHECK(g.u_dec == cd, "atomicDec final %u, want %u", g.u_dec, cd);
    std::sort(oinc.begin(), oinc.end());
    std::sort(want_inc.begin(), want_inc.end());
    std::sort(odec.begin(), odec.end());
    std::sort(want_dec.begin(), want_dec.end());
    CHECK(oinc == want_inc, "atomicInc returned olds differ from the counter's sequence");
    CHECK(odec == want_dec, "atomicDec returned olds differ from the counter's sequence");

    /* atomicExch: the olds and the final value are the initial value and
     * every written value, each exactly once (a chain) */
    std::vector<int> chain = ox;
    chain.push_back(g.i_exch);
    std::sort(chain.begin(), chain.end());
    perm = chain[0] == -5;
    for (int k = 0; k < K; k++) perm &= chain[k + 1] == k;
    CHECK(perm, "atomicExch olds + final are not {-5, 0..%d} once each", K - 1);

    /* atomicCAS from -1: exactly one winner, whose value is stored */
    int winners = 0, who = -1;
    for (int k = 0; k < K; k++)
        if (win[k]) winners++, who = k;
    CHECK(winners == 1, "atomicCAS(-1 -> k): %d winners", winners);
    CHECK(g.i_cas == who, "atomicCAS slot holds %d, the winner was %d", g.i_cas, who);
    CHECK(g.ull_cas < (unsigned long long)K, "atomicCAS(unsigned long long) slot %llx", g.ull_cas);

    cudaFree(d_a);
    cudaFree(d_oi);
    cudaFree(d_ox);
    cudaFree(d_win);
    cudaFree(d_of);
    cudaFree(d_oull);
    cudaFree(d_oinc);
    cudaFree(d_odec);
}

static void test_shared(void)
{
    const int n = 100000;
    std::vector<unsigned> v(n);
    std::vector<unsigned> want(64, 0);
    for (int i = 0; i < n; i++) {
        v[i] = h32((uint32_t)i + 99);
        want[v[i] % 64]++;
    }
    unsigned *d_v, *d_h;
    CUDA_OK(cudaMalloc((void **)&d_v, n * sizeof(unsigned)));
    CUDA_OK(cudaMalloc((void **)&d_h, 64 * sizeof(unsigned)));
    CUDA_OK(cudaMemcpy(d_v, v.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_h, 0, 64 * sizeof(unsigned)));
    HKV_LAUNCH(k_shared_hist, 40, 256, 0, 0)(d_v, n, d_h);
    CUDA_OK(cudaGetLastError());
    std::vector<unsigned> got(64);
    CUDA_OK(cudaMemcpy(got.data(), d_h, 64 * sizeof(unsigned), cudaMemcpyDeviceToHost));
    CHECK(got == want, "shared-memory atomicAdd histogram differs");
    cudaFree(d_v);
    cudaFree(d_h);
}

static void test_edges(void)
{
    unsigned *cell, *out;
    const int nc = 9;
    CUDA_OK(cudaMalloc((void **)&cell, sizeof(unsigned)));
    CUDA_OK(cudaMalloc((void **)&out, 4 * nc * sizeof(unsigned)));
    HKV_LAUNCH(k_edges, 1, 1, 0, 0)(cell, out);
    CUDA_OK(cudaGetLastError());
    std::vector<unsigned> o(4 * nc);
    CUDA_OK(cudaMemcpy(o.data(), out, o.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
    const unsigned cases[][2] = {{5, 3}, {3, 3}, {2, 3}, {0, 0}, {7, 0}, {UINT_MAX - 1, UINT_MAX}, {UINT_MAX, UINT_MAX},
                                 {0, UINT_MAX}, {1000, 999}};
    for (int i = 0; i < nc; i++) {
        const unsigned old = cases[i][0], val = cases[i][1];
        const unsigned inc = (old >= val) ? 0 : (old + 1);
        const unsigned dec = ((old == 0) || (old > val)) ? val : (old - 1);
        CHECK(o[4 * i] == old && o[4 * i + 1] == inc, "atomicInc(old %u, val %u): returned %u, stored %u; want %u", old,
              val, o[4 * i], o[4 * i + 1], inc);
        CHECK(o[4 * i + 2] == old && o[4 * i + 3] == dec, "atomicDec(old %u, val %u): returned %u, stored %u; want %u",
              old, val, o[4 * i + 2], o[4 * i + 3], dec);
    }
    cudaFree(cell);
    cudaFree(out);
}

int main(void)
{
    for (int rep = 0; rep < 3; rep++) test_contended();
    test_shared();
    test_edges();
    return test_report("emu_atomic");
}
