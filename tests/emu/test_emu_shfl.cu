/* Warp shuffles of the CUDA emulator against the CUDA C++ Programming Guide,
 * "Warp Shuffle Functions", lane by lane:
 *  - __shfl_sync(mask, var, srcLane, width): the value of the lane srcLane
 *    modulo width within the caller's width-wide subsection;
 *  - __shfl_up_sync(..., delta, width): lane - delta, except that the lower
 *    delta lanes of each subsection keep their own value (no wrap);
 *  - __shfl_down_sync(..., delta, width): lane + delta, the upper delta lanes
 *    of each subsection keep their own value;
 *  - __shfl_xor_sync(..., laneMask, width): lane ^ laneMask; a subsection may
 *    read from earlier subsections, but a lane that would read from a later
 *    one gets its own value.
 * Warps are made of consecutive linear thread ids x + y*Dx + z*Dx*Dy
 * ("Thread Hierarchy", "SIMT Architecture"), so partial warps (blocks of 40,
 * 7, 33 threads, and 2-D/3-D blocks) and masks that name only some lanes are
 * covered; a configuration is run only where every participating lane's
 * source is in its mask (otherwise the value is undefined: test_emu_fault
 * checks that the emulator stops there). Types: int, float, double, long long
 * (8-byte values must move whole). */
#include <stdint.h>

#include <vector>

#include "emu_test.h"

enum { OP_IDX, OP_UP, OP_DOWN, OP_XOR, N_OPS };
static const char *op_names[N_OPS] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync"};

struct shfl_cfg {
    int op, width, dflt;   /* dflt: call without the width argument (warpSize) */
};

/* One configuration per block; mask[t] == 0: thread t does not take part
 * (it returns at once). */
template <class T>
static __global__ void k_shfl(const shfl_cfg *cfg, const unsigned *mask, const int *arg, const T *val, T *out)
{
    const int nt = blockDim.x * blockDim.y * blockDim.z;
    const int lin = threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y;
    const int t = blockIdx.x * nt + lin;
    const shfl_cfg c = cfg[blockIdx.x];
    const unsigned m = mask[t];
    if (!m) return;
    const T v = val[t];
    T r;
    switch (c.op) {
    case OP_IDX: r = c.dflt ? __shfl_sync(m, v, arg[t]) : __shfl_sync(m, v, arg[t], c.width); break;
    case OP_UP:
        r = c.dflt ? __shfl_up_sync(m, v, (unsigned)arg[t]) : __shfl_up_sync(m, v, (unsigned)arg[t], c.width);
        break;
    case OP_DOWN:
        r = c.dflt ? __shfl_down_sync(m, v, (unsigned)arg[t])
                   : __shfl_down_sync(m, v, (unsigned)arg[t], c.width);
        break;
    default: r = c.dflt ? __shfl_xor_sync(m, v, arg[t]) : __shfl_xor_sync(m, v, arg[t], c.width); break;
    }
    out[t] = r;
}

/* The documented source lane of `lane` (0..31), or -1 for "its own value". */
static int model_src(int op, int lane, int arg, int w)
{
    const int seg = lane / w * w, pos = lane % w;
    switch (op) {
    case OP_IDX: return seg + arg % w;   /* arg >= 0 here: srcLane modulo width */
    case OP_UP: return arg <= pos ? lane - arg : -1;
    case OP_DOWN: return pos + arg < w ? lane + arg : -1;
    default: {
        const int s = lane ^ arg;
        return s >= seg + w ? -1 : s;    /* later subsection: own value; earlier: allowed */
    }
    }
}

/* Distinct values per thread, with bits in both halves of 8-byte types. */
template <class T> static T value_of(int t);
template <> int value_of<int>(int t) { return (int)(0x01000193u * (unsigned)(t + 1)) ^ 0x5a5a5a5a; }
template <> float value_of<float>(int t) { return (float)t * 0.5f - 1000.25f; }
template <> double value_of<double>(int t) { return (double)t * 1.0000000001 + 1e12; }
template <> long long value_of<long long>(int t)
{
    return (long long)(((uint64_t)(t + 7) << 37) ^ (uint64_t)(t * 2654435761u)) * ((t & 1) ? -1 : 1);
}
template <class T> static bool same(T a, T b) { return memcmp(&a, &b, sizeof a) == 0; }
template <class T> static double as_d(T a) { return (double)a; }

struct shape {
    dim3 block;
    const char *name;
};

/* Mask kinds per warp, over the warp's existing lanes `ex`. Each returns the
 * mask of lane l (0: not taking part). */
enum { M_ALL, M_LOW, M_EVEN_ODD, M_TOP, N_MASKS };
static const char *mask_names[N_MASKS] = {"all existing lanes", "lanes 0..15", "even and odd lanes as two groups",
                                          "the highest existing lanes (upper half)"};
static unsigned mask_of(int kind, unsigned ex, int lane)
{
    const unsigned bit = 1u << lane;
    if (!(ex & bit)) return 0;
    switch (kind) {
    case M_ALL: return ex;
    case M_LOW: return (bit & 0xffffu) ? ex & 0xffffu : 0;
    case M_EVEN_ODD: return ex & ((lane & 1) ? 0xaaaaaaaau : 0x55555555u);
    default: {
        /* the upper half of the existing lanes */
        const int n = __builtin_popcount(ex), lo = n / 2;
        unsigned m = 0;
        for (int l = lo; l < n; l++) m |= 1u << l;
        return (bit & m) ? m : 0;
    }
    }
}

/* Per op, the arguments tried (srcLane / delta / laneMask); -1 stands for a
 * per-lane argument (lane * 7 + 3, or lane % 4 for up/down, lane % 8 for xor). */
static std::vector<int> args_for(int op, int w)
{
    switch (op) {
    case OP_IDX: return {0, 1, w - 1, w, w + 3, 31, 37, 63, -1};
    case OP_UP:
    case OP_DOWN: return {0, 1, 2, 3, w - 1, w, w + 1, 16, 31, -1};
    default: return {0, 1, 2, 3, 5, w - 1, w, 16, 31, -1};
    }
}
static int lane_arg(int op, int a, int lane)
{
    if (a >= 0) return a;
    return op == OP_IDX ? lane * 7 + 3 : op == OP_XOR ? lane % 8 : lane % 4;
}

static int total_runs;

template <class T>
static void run_type(const char *tname)
{
    static const shape shapes[] = {{dim3(32), "32"},       {dim3(64), "64"},         {dim3(40), "40 (warp 1: 8 lanes)"},
                                   {dim3(7), "7"},         {dim3(33), "33 (warp 1: 1 lane)"}, {dim3(5, 8, 1), "5x8"},
                                   {dim3(4, 3, 3), "4x3x3"}};
    const int widths[] = {1, 2, 4, 8, 16, 32};
    for (const shape &sh : shapes) {
        const int nt = (int)(sh.block.x * sh.block.y * sh.block.z);
        std::vector<shfl_cfg> cfgs;
        std::vector<unsigned> mask;
        std::vector<int> arg;
        std::vector<T> val;
        std::vector<int> src;   /* expected source thread (block-relative), -1 own */
        std::vector<std::string> desc;
        for (int op = 0; op < N_OPS; op++)
            for (int w : widths)
                for (int a : args_for(op, w))
                    for (int mk = 0; mk < N_MASKS; mk++)
                        for (int dflt = 0; dflt < (w == 32 ? 2 : 1); dflt++) {
                            std::vector<unsigned> bm(nt);
                            std::vector<int> ba(nt), bs(nt, -1);
                            bool valid = true;
                            for (int i = 0; i < nt && valid; i++) {
                                const int wp = i / 32, lane = i % 32;
                                const int in_warp = nt - wp * 32 < 32 ? nt - wp * 32 : 32;
                                const unsigned ex = in_warp == 32 ? 0xffffffffu : (1u << in_warp) - 1;
                                bm[i] = mask_of(mk, ex, lane);
                                ba[i] = lane_arg(op, a, lane);
                                if (!bm[i]) continue;
                                const int s = model_src(op, lane, ba[i], w);
                                if (s >= 0 && !(bm[i] & (1u << s))) valid = false;   /* undefined: not run */
                                bs[i] = s < 0 ? -1 : wp * 32 + s;
                            }
                            if (!valid) continue;
                            const int b = (int)cfgs.size();
                            cfgs.push_back({op, w, dflt});
                            for (int i = 0; i < nt; i++) {
                                mask.push_back(bm[i]);
                                arg.push_back(ba[i]);
                                val.push_back(value_of<T>(b * nt + i));
                                src.push_back(bs[i]);
                            }
                            char d[200];
                            snprintf(d, sizeof d, "%s<%s> width %d%s arg %d, block %s, mask: %s", op_names[op],
                                     tname, w, dflt ? " (default)" : "", a, sh.name, mask_names[mk]);
                            desc.push_back(d);
                        }
        const int nb = (int)cfgs.size();
        const size_t n = (size_t)nb * nt;
        shfl_cfg *d_cfg;
        unsigned *d_mask;
        int *d_arg;
        T *d_val, *d_out;
        CUDA_OK(cudaMalloc((void **)&d_cfg, nb * sizeof(shfl_cfg)));
        CUDA_OK(cudaMalloc((void **)&d_mask, n * sizeof(unsigned)));
        CUDA_OK(cudaMalloc((void **)&d_arg, n * sizeof(int)));
        CUDA_OK(cudaMalloc((void **)&d_val, n * sizeof(T)));
        CUDA_OK(cudaMalloc((void **)&d_out, n * sizeof(T)));
        CUDA_OK(cudaMemcpy(d_cfg, cfgs.data(), nb * sizeof(shfl_cfg), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(d_mask, mask.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(d_arg, arg.data(), n * sizeof(int), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(d_val, val.data(), n * sizeof(T), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemset(d_out, 0xa5, n * sizeof(T)));
        HKV_LAUNCH(k_shfl<T>, nb, sh.block, 0, 0)(d_cfg, d_mask, d_arg, d_val, d_out);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<T> out(n);
        CUDA_OK(cudaMemcpy(out.data(), d_out, n * sizeof(T), cudaMemcpyDeviceToHost));
        T sentinel;
        memset(&sentinel, 0xa5, sizeof sentinel);
        auto want_of = [&](size_t k) -> T {
            return !mask[k] ? sentinel : src[k] < 0 ? val[k] : val[k / nt * nt + src[k]];
        };
        int bad_blocks = 0;
        for (int b = 0; b < nb; b++) {
            int bad_i = -1;
            for (int i = 0; i < nt && bad_i < 0; i++)
                if (!same(out[(size_t)b * nt + i], want_of((size_t)b * nt + i))) bad_i = i;
            const size_t k = (size_t)b * nt + (bad_i < 0 ? 0 : bad_i);
            CHECK(bad_i < 0 || bad_blocks > 5, "%s: thread %d got %.17g, want %.17g", desc[b].c_str(), bad_i,
                  as_d(out[k]), as_d(want_of(k)));
            if (bad_i >= 0) bad_blocks++;
        }
        total_runs += nb;
        cudaFree(d_cfg);
        cudaFree(d_mask);
        cudaFree(d_arg);
        cudaFree(d_val);
        cudaFree(d_out);
    }
}

/* hkv_emu::warp_tree (what gpu_internal.cuh's hkv_warp_sum/max are in an
 * emulator build) against the five __shfl_xor_sync steps it stands for, bit
 * for bit in every lane: values over a wide range of magnitudes and signs,
 * so that any other order of the additions gives other bits. */
template <class T>
static __global__ void k_tree(const T *val, T *tree, T *loop, int op)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const T x = val[t];
    const hkv_emu::warp_op_kind kind = op == 0 ? hkv_emu::W_TREE_FSUM : op == 1 ? hkv_emu::W_TREE_FMAX
                                                                                : hkv_emu::W_TREE_DSUM;
    tree[t] = hkv_emu::warp_tree(HKV_EMU_SITE, kind, x);
    T y = x;
    for (int o = 16; o > 0; o >>= 1) {
        const T z = __shfl_xor_sync(0xffffffffu, y, o);
        y = op == 1 ? (T)fmaxf((float)y, (float)z) : y + z;
    }
    loop[t] = y;
}

template <class T>
static void tree_case(int op, const char *name)
{
    const int n = 8 * 64;   /* 8 blocks of 2 warps */
    std::vector<T> h(n), a(n), b(n);
    uint64_t s = 0x9e3779b97f4a7c15ull + (uint64_t)op;
    for (int i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        const double m = (double)(s >> 11) * 0x1p-53 - 0.5;
        h[i] = (T)(m * ldexp(1.0, (int)(s % 41) - 20));   /* 2^-20 .. 2^20 */
    }
    T *dv, *dt, *dl;
    CUDA_OK(cudaMalloc((void **)&dv, n * sizeof(T)));
    CUDA_OK(cudaMalloc((void **)&dt, n * sizeof(T)));
    CUDA_OK(cudaMalloc((void **)&dl, n * sizeof(T)));
    CUDA_OK(cudaMemcpy(dv, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    HKV_LAUNCH(k_tree<T>, 8, 64, 0, 0)(dv, dt, dl, op);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(a.data(), dt, n * sizeof(T), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(b.data(), dl, n * sizeof(T), cudaMemcpyDeviceToHost));
    int bad = 0, spread = 0;
    for (int i = 0; i < n; i++) {
        bad += memcmp(&a[i], &b[i], sizeof(T)) != 0;
        spread += i % 32 && memcmp(&a[i], &a[i - 1], sizeof(T)) != 0;
    }
    CHECK(bad == 0, "%s: %d of %d lanes differ from the five shuffles", name, bad, n);
    /* the butterfly gives every lane of a warp the same value (+ and fmaxf
     * commute): a tree that handed lanes different values would be wrong */
    CHECK(spread == 0, "%s: lanes of one warp disagree (%d)", name, spread);
    CUDA_OK(cudaFree(dv));
    CUDA_OK(cudaFree(dt));
    CUDA_OK(cudaFree(dl));
}

/* The model itself against the guide's worked examples, so that a wrong
 * model cannot pass silently with a wrong emulator. */
static void model_examples(void)
{
    /* __shfl_sync(.., 2, 16): lanes 0-15 read lane 2, lanes 16-31 lane 18 */
    CHECK(model_src(OP_IDX, 5, 2, 16) == 2 && model_src(OP_IDX, 20, 2, 16) == 18, "idx model");
    /* srcLane 37, width 32: lane 5; srcLane 9, width 8: lane seg + 1 */
    CHECK(model_src(OP_IDX, 0, 37, 32) == 5 && model_src(OP_IDX, 13, 9, 8) == 9, "idx modulo model");
    /* up by 2 in width 8: lanes 8, 9 keep their value, lane 10 reads 8 */
    CHECK(model_src(OP_UP, 8, 2, 8) < 0 && model_src(OP_UP, 9, 2, 8) < 0 && model_src(OP_UP, 10, 2, 8) == 8,
          "up model");
    /* down by 3 in width 4: only lane 0 of each 4 reads lane 3 */
    CHECK(model_src(OP_DOWN, 4, 3, 4) == 7 && model_src(OP_DOWN, 5, 3, 4) < 0, "down model");
    /* xor 4 in width 4: lane 5 reads lane 1 (earlier group), lane 1 keeps its own (later group) */
    CHECK(model_src(OP_XOR, 5, 4, 4) == 1 && model_src(OP_XOR, 1, 4, 4) < 0, "xor model");
}

int main(void)
{
    model_examples();
    run_type<int>("int");
    run_type<float>("float");
    run_type<double>("double");
    run_type<long long>("long long");
    tree_case<float>(0, "hkv_warp_sum");
    tree_case<float>(1, "hkv_warp_max");
    tree_case<double>(2, "hkv_warp_sum_d");
    CHECK(total_runs > 4000, "only %d configurations ran", total_runs);
    printf("emu_shfl: %d block configurations run\n", total_runs);
    return test_report("emu_shfl");
}
