/* nvcuda::wmma in the CUDA emulator (gpu/emu/emu_wmma.h) against the CUDA
 * C++ Programming Guide, "Warp Matrix Functions", for m16n16k16 with half
 * inputs:
 *  - load_matrix_sync(a|b, mptr, ldm): the fragment's layout (row_major:
 *    element (r, c) at mptr[r*ldm + c]; col_major: mptr[c*ldm + r]);
 *    accumulators take the layout as mem_row_major / mem_col_major;
 *  - mma_sync(d, a, b, c): D = A*B + C, here in all four input layout
 *    combinations, with C loaded in either memory layout, D stored in either,
 *    two products chained onto the same accumulator (d == c), padded ldm, two
 *    warps of a block on different matrices, float and half accumulators;
 *  - fill_fragment and elementwise code uniform over x[] work; num_elements is
 *    CUDA's (crt/mma.h: 16 for half matrix_a/b, 8 for accumulators); the
 *    element-to-lane mapping is unspecified, so code assuming one must not
 *    pass: lane-dependent values stored through an accumulator come out as a
 *    permutation that is neither row- nor column-major;
 *  - misuse faults: mptr not 256-bit aligned, ldm not a multiple of 8 (half)
 *    or 4 (float), lanes at different call sites or with different
 *    arguments, an exited or missing lane, a WMMA call meeting __syncwarp,
 *    and non-uniform writes into an input fragment. Each fault makes the
 *    device error sticky until cudaDeviceReset, as every emulator fault does.
 * Expected products are computed on the host in double from the same fp16
 * values; the bound allows a GPU's fp32 accumulation (16 * 2^-24 of the sum
 * of magnitudes per product), not only the emulator's one rounding. */
#include <math.h>
#include <stdint.h>

#include <mma.h>
#include <vector>

#include "emu_test.h"

using namespace nvcuda;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double urand(void)   /* [0, 1) */
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}
/* a random half in [-2, 2] with spread exponents; its value exactly */
static __half rand_half(double *val)
{
    const double x = (urand() * 2 - 1) * ldexp(1.0, (int)(urand() * 6) - 4);
    const __half h = __float2half((float)x);
    *val = __half2float(h);
    return h;
}

/* Sizes: per warp A and B are 16x32 / 32x16 (two k-steps), C and D 16x16. */
enum { LDA = 40, LDB = 40, LDC = 24, LDD = 40, NW = 2 };   /* multiples of 8: half or float */
static const int A_ELEMS = 32 * LDA, B_ELEMS = 32 * LDB, C_ELEMS = 16 * LDC, D_ELEMS = 16 * LDD;

/* D_w = A_w[:, 0:16] B_w[0:16, :] + A_w[:, 16:32] B_w[16:32, :] + C_w for
 * warp w; offsets of the k-step halves follow the layouts. */
template <class LA, class LB, class TC>
static __global__ void k_mma(const __half *A, const __half *B, const TC *C, TC *D, int c_col, int d_col)
{
    const int w = threadIdx.x / 32;
    const bool a_row = std::is_same<LA, wmma::row_major>::value, b_row = std::is_same<LB, wmma::row_major>::value;
    const __half *a = A + w * A_ELEMS, *b = B + w * B_ELEMS;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, LA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, LB> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, TC> acc;
    wmma::load_matrix_sync(acc, C + w * C_ELEMS, LDC, c_col ? wmma::mem_col_major : wmma::mem_row_major);
    for (int ks = 0; ks < 2; ks++) {
        /* A row-major [16][LDA]: columns 16ks..; col-major [32][LDA] by column: rows of memory 16ks.. */
        wmma::load_matrix_sync(fa, a + (a_row ? 16 * ks : 16 * ks * LDA), LDA);
        wmma::load_matrix_sync(fb, b + (b_row ? 16 * ks * LDB : 16 * ks), LDB);
        wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(D + w * D_ELEMS, acc, LDD, d_col ? wmma::mem_col_major : wmma::mem_row_major);
}

template <class T> static double val_of(T x);
template <> double val_of<float>(float x) { return x; }
template <> double val_of<__half>(__half x) { return __half2float(x); }
template <class T> static T make_val(double x, double *exact);
template <> float make_val<float>(double x, double *exact) { *exact = (float)x; return (float)x; }
template <> __half make_val<__half>(double x, double *exact)
{
    __half h = __float2half((float)x);
    *exact = __half2float(h);
    return h;
}

template <class LA, class LB, class TC>
static void test_mma(const char *name)
{
    const bool a_row = std::is_same<LA, wmma::row_major>::value, b_row = std::is_same<LB, wmma::row_major>::value;
    const bool half_acc = std::is_same<TC, __half>::value;
    for (int c_col = 0; c_col < 2; c_col++)
        for (int d_col = 0; d_col < 2; d_col++) {
            std::vector<__half> ha(NW * A_ELEMS, __float2half(NAN)), hb(NW * B_ELEMS, __float2half(NAN));
            std::vector<TC> hc(NW * C_ELEMS), hd(NW * D_ELEMS);
            std::vector<double> ra(NW * 16 * 32), rb(NW * 32 * 16), rc(NW * 256);
            for (int w = 0; w < NW; w++) {
                for (int i = 0; i < 16; i++)
                    for (int k = 0; k < 32; k++) {
                        const size_t off = a_row ? (size_t)i * LDA + k : (size_t)k * LDA + i;
                        ha[w * A_ELEMS + off] = rand_half(&ra[(w * 16 + i) * 32 + k]);
                    }
                for (int k = 0; k < 32; k++)
                    for (int j = 0; j < 16; j++) {
                        const size_t off = b_row ? (size_t)k * LDB + j : (size_t)j * LDB + k;
                        hb[w * B_ELEMS + off] = rand_half(&rb[(w * 32 + k) * 16 + j]);
                    }
                for (int i = 0; i < 16; i++)
                    for (int j = 0; j < 16; j++) {
                        const size_t off = c_col ? (size_t)j * LDC + i : (size_t)i * LDC + j;
                        hc[w * C_ELEMS + off] = make_val<TC>(urand() * 8 - 4, &rc[w * 256 + i * 16 + j]);
                    }
            }
            __half *da, *db;
            TC *dc, *dd;
            CUDA_OK(cudaMalloc((void **)&da, ha.size() * 2));
            CUDA_OK(cudaMalloc((void **)&db, hb.size() * 2));
            CUDA_OK(cudaMalloc((void **)&dc, hc.size() * sizeof(TC)));
            CUDA_OK(cudaMalloc((void **)&dd, hd.size() * sizeof(TC)));
            CUDA_OK(cudaMemcpy(da, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(db, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(dc, hc.data(), hc.size() * sizeof(TC), cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemset(dd, 0xff, hd.size() * sizeof(TC)));   /* NaN: what is not stored stays NaN */
            HKV_LAUNCH((k_mma<LA, LB, TC>), 1, 32 * NW, 0, 0)(da, db, dc, dd, c_col, d_col);
            CUDA_OK(cudaGetLastError());
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(cudaMemcpy(hd.data(), dd, hd.size() * sizeof(TC), cudaMemcpyDeviceToHost));
            int bad = 0, stray = 0;
            double worst = 0;
            for (int w = 0; w < NW; w++) {
                for (int i = 0; i < 16; i++)
                    for (int j = 0; j < 16; j++) {
                        double s = rc[w * 256 + i * 16 + j], mag = fabs(s), s1 = 0;
                        for (int k = 0; k < 32; k++) {
                            const double p = ra[(w * 16 + i) * 32 + k] * rb[(w * 32 + k) * 16 + j];
                            s += p, mag += fabs(p);
                            if (k == 15) s1 = s;   /* the accumulator between the two products */
                        }
                        const size_t off = d_col ? (size_t)j * LDD + i : (size_t)i * LDD + j;
                        const double got = val_of<TC>(hd[w * D_ELEMS + off]);
                        /* fp32 accumulation (two chained products: 2 x 16 terms); a half
                         * accumulator is rounded to half after each product (2^-11 relative) */
                        const double tol = 32 * ldexp(mag, -24) +
                                           (half_acc ? ldexp(fabs(s1) + fabs(s), -11) + ldexp(1, -23) : 0);
                        const double e = fabs(got - s);
                        worst = fmax(worst, e);
                        bad += !(e <= tol);
                    }
                /* the padding columns of D are never written */
                for (int i = 0; i < 16; i++)
                    for (int j = 16; j < LDD; j++) stray += !isnan(val_of<TC>(hd[w * D_ELEMS + i * LDD + j]));
            }
            CHECK(bad == 0 && stray == 0, "%s, C %s, D %s: %d of %d elements off (worst %.3g), %d padding "
                  "elements written", name, c_col ? "col-major" : "row-major", d_col ? "col-major" : "row-major",
                  bad, NW * 256, worst, stray);
            cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dd);
        }
}

/* fill + uniform elementwise arithmetic: acc = 2 * 1.5, a = all ones, so
 * D[i][j] = 3 + sum_k B[k][j]; also lane-dependent values through an
 * accumulator (out2), and num_elements per lane. */
static __global__ void k_fill(const __half *B, float *D, float *out2, int *ne)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc, lanes;
    wmma::fill_fragment(acc, 1.5f);
    for (int i = 0; i < acc.num_elements; i++) acc.x[i] *= 2.0f;
    wmma::fill_fragment(fa, __float2half(1.0f));
    wmma::load_matrix_sync(fb, B, 16);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(D, acc, 16, wmma::mem_row_major);
    for (int i = 0; i < lanes.num_elements; i++) lanes.x[i] = (float)(threadIdx.x * lanes.num_elements + i);
    wmma::store_matrix_sync(out2, lanes, 16, wmma::mem_row_major);
    if (threadIdx.x == 0) {
        ne[0] = fa.num_elements, ne[1] = fb.num_elements, ne[2] = acc.num_elements;
        ne[3] = wmma::fragment<wmma::accumulator, 16, 16, 16, __half>::num_elements;
    }
}

static void test_fill_and_mapping(void)
{
    std::vector<__half> hb(256);
    std::vector<double> rb(256);
    for (int i = 0; i < 256; i++) hb[i] = rand_half(&rb[i]);   /* col-major: B[k][j] at j*16 + k */
    __half *db;
    float *dd, *d2;
    int *dne;
    CUDA_OK(cudaMalloc((void **)&db, 512));
    CUDA_OK(cudaMalloc((void **)&dd, 1024));
    CUDA_OK(cudaMalloc((void **)&d2, 1024));
    CUDA_OK(cudaMalloc((void **)&dne, 16));
    CUDA_OK(cudaMemcpy(db, hb.data(), 512, cudaMemcpyHostToDevice));
    HKV_LAUNCH(k_fill, 1, 32, 0, 0)(db, dd, d2, dne);
    CUDA_OK(cudaDeviceSynchronize());
    float hd[256], h2[256];
    int ne[4];
    CUDA_OK(cudaMemcpy(hd, dd, 1024, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(h2, d2, 1024, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(ne, dne, 16, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            double s = 3, mag = 3;
            for (int k = 0; k < 16; k++) s += rb[j * 16 + k], mag += fabs(rb[j * 16 + k]);
            bad += !(fabs(hd[i * 16 + j] - s) <= 16 * ldexp(mag, -24));
        }
    CHECK(bad == 0, "fill_fragment + uniform scaling + mma: %d of 256 elements off", bad);
    CHECK(ne[0] == 16 && ne[1] == 16 && ne[2] == 8 && ne[3] == 8,
          "num_elements: matrix_a %d, matrix_b %d, float accumulator %d, half accumulator %d (CUDA: 16, 16, 8, 8)",
          ne[0], ne[1], ne[2], ne[3]);
    /* lane l's x[e] = 8l + e: every value once, and not in the order a
     * layout-assuming kernel would expect (row- or column-major by lane) */
    int seen[256] = {0}, perm_ok = 1, row_major = 1, col_major = 1;
    for (int i = 0; i < 256; i++) {
        const int v = (int)h2[i];
        if (v < 0 || v > 255 || h2[i] != v || seen[v]++) perm_ok = 0;
        if (v != i) row_major = 0;
        if (v != (i % 16) * 16 + i / 16) col_major = 0;
    }
    CHECK(perm_ok, "an accumulator's 32 x 8 elements are not a permutation of the 16x16 matrix");
    CHECK(!row_major && !col_major, "the accumulator mapping is a plain row/column order: code relying on it would pass");
    cudaFree(db), cudaFree(dd), cudaFree(d2), cudaFree(dne);
}

/* ---- misuse: each a fault ---- */

enum misuse { M_ALIGN_A, M_LDM_A, M_LDM_C, M_ALIGN_STORE, M_DIVERGE, M_EXITED, M_PARTIAL, M_ARGS,
              M_NONUNIFORM, M_VS_SYNCWARP };

static __global__ void k_misuse(__half *h, float *f, int what)
{
    const int lane = threadIdx.x % 32;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    wmma::fill_fragment(fb, __float2half(1.0f));
    switch (what) {
    case M_ALIGN_A: wmma::load_matrix_sync(fa, h + 8, 16); break;        /* 16 bytes off */
    case M_LDM_A: wmma::load_matrix_sync(fa, h, 12); break;              /* 24 bytes */
    case M_LDM_C: wmma::load_matrix_sync(acc, f, 18, wmma::mem_row_major); break;
    case M_ALIGN_STORE: wmma::store_matrix_sync(f + 4, acc, 16, wmma::mem_row_major); break;
    case M_DIVERGE:
        if (lane < 16) wmma::load_matrix_sync(fa, h, 16);
        else wmma::load_matrix_sync(fa, h, 16);
        break;
    case M_EXITED:
        if (lane == 31) return;
        wmma::load_matrix_sync(fa, h, 16);
        break;
    case M_PARTIAL: wmma::load_matrix_sync(fa, h, 16); break;             /* launched with 16 threads */
    case M_ARGS: wmma::load_matrix_sync(fa, h, lane < 16 ? 16 : 24); break;
    case M_NONUNIFORM:
        wmma::fill_fragment(fa, __float2half(0.0f));
        fa.x[0] = __float2half((float)lane);   /* relies on a layout: the two copies differ */
        wmma::mma_sync(acc, fa, fb, acc);
        break;
    case M_VS_SYNCWARP:
        if (lane < 16) wmma::load_matrix_sync(fa, h, 16);
        else __syncwarp();
        break;
    }
    wmma::store_matrix_sync(f, acc, 16, wmma::mem_row_major);
}

static void expect_fault(int what, int threads, const char *says)
{
    __half *h;
    float *f;
    CUDA_OK(cudaMalloc((void **)&h, 4096));
    CUDA_OK(cudaMalloc((void **)&f, 4096));
    stderr_capture cap;
    cap.begin();
    HKV_LAUNCH(k_misuse, 1, threads, 0, 0)(h, f, what);
    const cudaError_t at_launch = cudaGetLastError();
    const cudaError_t at_sync = cudaDeviceSynchronize();
    const std::string msg = cap.end();
    CHECK(at_launch == cudaSuccess || at_launch == cudaErrorLaunchFailure, "misuse %d: launch gave %s", what,
          cudaGetErrorName(at_launch));
    CHECK(at_sync == cudaErrorLaunchFailure, "misuse %d: the sync returned %s, want cudaErrorLaunchFailure",
          what, cudaGetErrorName(at_sync));
    bool said = false;
    for (std::string alts = says; !said && !alts.empty();) {
        const size_t bar = alts.find('|');
        said = has(msg, alts.substr(0, bar).c_str());
        alts = bar == std::string::npos ? "" : alts.substr(bar + 1);
    }
    CHECK(said && has(msg, "k_misuse"), "misuse %d: the report does not name k_misuse and say \"%s\": \"%s\"",
          what, says, msg.c_str());
    CUDA_IS(cudaErrorLaunchFailure, cudaGetLastError());   /* sticky */
    CUDA_OK(cudaDeviceReset());
    (void)cudaGetLastError();
}

int main(void)
{
    test_mma<wmma::row_major, wmma::row_major, float>("A row, B row, float");
    test_mma<wmma::row_major, wmma::col_major, float>("A row, B col, float");
    test_mma<wmma::col_major, wmma::row_major, float>("A col, B row, float");
    test_mma<wmma::col_major, wmma::col_major, float>("A col, B col, float");
    test_mma<wmma::row_major, wmma::col_major, __half>("A row, B col, half");
    test_mma<wmma::col_major, wmma::row_major, __half>("A col, B row, half");
    test_fill_and_mapping();
    expect_fault(M_ALIGN_A, 32, "not 256-bit");
    expect_fault(M_LDM_A, 32, "ldm 12 is not a multiple of 8");
    expect_fault(M_LDM_C, 32, "ldm 18 is not a multiple of 4");
    expect_fault(M_ALIGN_STORE, 32, "store_matrix_sync");
    expect_fault(M_DIVERGE, 32, "divergent calls in warp");
    expect_fault(M_EXITED, 32, "exited");
    expect_fault(M_PARTIAL, 16, "exited or missing");
    expect_fault(M_ARGS, 32, "disagree");
    expect_fault(M_NONUNIFORM, 32, "differs between lanes");
    expect_fault(M_VS_SYNCWARP, 32, "divergent warp collectives");
    /* and the device works after the resets */
    test_mma<wmma::row_major, wmma::col_major, float>("after the faults");
    return test_report("emu_wmma");
}
