/* mma.sync.m16n8k16 (f16 in, f32 accumulate) and ldmatrix.x4 (plain and
 * .trans) in the CUDA emulator (gpu/emu/emu_mma.h, through
 * gpu/mma_frag.cuh) against the fragment layouts of the PTX ISA, "Matrix
 * Fragments for mma.m16n8k16 with floating point type" and "Warp-level
 * matrix load instruction: ldmatrix", restated here from the ISA in the
 * test's own code (gid = lane / 4, tig = lane % 4):
 *  - each lane builds its A, B and C registers from row-major matrices in
 *    global memory, two products are chained onto one accumulator, and D
 *    comes back through the C layout: D = A0 B0 + A1 B1 + C on the host in
 *    double from the same halves, within fp32 accumulation error;
 *  - ldmatrix.x4 over four 8x8 matrices of distinct values in shared memory
 *    at a padded row stride (each lane giving its own row's address): every
 *    register of every lane holds the two halves the ISA names, plain and
 *    transposed;
 *  - misuse faults: a row address not 16-byte aligned, a missing lane,
 *    lanes at different call sites. */
#include <math.h>
#include <stdint.h>

#include "emu_test.h"
#include "mma_frag.cuh"

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static double urand(void)   /* [0, 1) */
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static uint32_t two(const __half *m, int ld, int r, int c)   /* (r, c) low, (r, c + 1) high */
{
    uint16_t lo, hi;
    memcpy(&lo, m + r * ld + c, 2);
    memcpy(&hi, m + r * ld + c + 1, 2);
    return (uint32_t)lo | (uint32_t)hi << 16;
}
static uint32_t two_col(const __half *m, int ld, int r, int c)   /* (r, c) low, (r + 1, c) high */
{
    uint16_t lo, hi;
    memcpy(&lo, m + r * ld + c, 2);
    memcpy(&hi, m + (r + 1) * ld + c, 2);
    return (uint32_t)lo | (uint32_t)hi << 16;
}

/* A [2][16][16], B [2][16][8] row-major (k by n), C and D [16][8] */
static __global__ void k_mma(const __half *A, const __half *B, const float *C, float *D)
{
    const int lane = threadIdx.x, gid = lane / 4, tig = lane % 4;
    float d[4];
    for (int i = 0; i < 4; i++) d[i] = C[(gid + 8 * (i >> 1)) * 8 + 2 * tig + (i & 1)];
    for (int s = 0; s < 2; s++) {
        const __half *a = A + s * 256, *b = B + s * 128;
        uint32_t ra[4], rb[2];
        for (int i = 0; i < 4; i++) ra[i] = two(a, 16, gid + 8 * (i & 1), 2 * tig + 8 * (i >> 1));
        for (int i = 0; i < 2; i++) rb[i] = two_col(b, 8, 2 * tig + 8 * i, gid);
        hkv_mma16816(d, ra, rb);
    }
    for (int i = 0; i < 4; i++) D[(gid + 8 * (i >> 1)) * 8 + 2 * tig + (i & 1)] = d[i];
}

enum { LDS = 24 };   /* shared row stride in halves: 8 values and padding, 16-byte rows */

/* Four 8x8 matrices M[j][r][c] = j * 64 + r * 8 + c (as halves, exact) at
 * rows j*8 + r of a padded shared array; out[lane][trans][4] the registers */
static __global__ void k_ldsm(uint32_t *out)
{
    __shared__ __align__(16) __half sm[32 * LDS];
    const int lane = threadIdx.x;
    for (int c = 0; c < LDS; c++) sm[lane * LDS + c] = __float2half((float)(c < 8 ? lane * 8 + c : -1));
    __syncwarp();
    uint32_t r[4], t[4];
    hkv_ldsm_x4(r, sm + lane * LDS);   /* lane l: row l % 8 of matrix l / 8 */
    hkv_ldsm_x4_t(t, sm + lane * LDS);
    for (int j = 0; j < 4; j++) out[lane * 8 + j] = r[j], out[lane * 8 + 4 + j] = t[j];
}

enum misuse { M_ALIGN, M_PARTIAL, M_DIVERGE };

static __global__ void k_misuse(int what)
{
    __shared__ __align__(16) __half sm[32 * LDS];
    const int lane = threadIdx.x % 32;
    for (int c = 0; c < LDS; c++) sm[lane * LDS + c] = __float2half(0.0f);
    __syncwarp(what == M_PARTIAL ? 0xffffu : 0xffffffffu);
    uint32_t r[4], b[2] = {0, 0};
    float d[4] = {0, 0, 0, 0};
    switch (what) {
    case M_ALIGN: hkv_ldsm_x4(r, sm + lane * LDS + (lane == 5 ? 1 : 0)); break;   /* 2 bytes off */
    case M_PARTIAL: hkv_ldsm_x4(r, sm + lane * LDS); break;   /* launched with 16 threads */
    case M_DIVERGE:
        r[0] = r[1] = r[2] = r[3] = 0;
        if (lane < 16) hkv_mma16816(d, r, b);
        else hkv_mma16816(d, r, b);
        break;
    }
}

static void expect_fault(int what, int threads, const char *says)
{
    stderr_capture cap;
    cap.begin();
    HKV_LAUNCH(k_misuse, 1, threads, 0, 0)(what);
    (void)cudaGetLastError();
    const cudaError_t at_sync = cudaDeviceSynchronize();
    const std::string msg = cap.end();
    CHECK(at_sync == cudaErrorLaunchFailure, "misuse %d: the sync returned %s, want cudaErrorLaunchFailure",
          what, cudaGetErrorName(at_sync));
    CHECK(has(msg, says) && has(msg, "k_misuse"), "misuse %d: the report does not name k_misuse and say "
          "\"%s\": \"%s\"", what, says, msg.c_str());
    CUDA_OK(cudaDeviceReset());
}

int main(void)
{
    /* products */
    __half hA[512], hB[256];
    double vA[512], vB[256];
    float hC[128], hD[128];
    for (int i = 0; i < 512; i++) {
        hA[i] = __float2half((float)((urand() * 2 - 1) * ldexp(1.0, (int)(urand() * 6) - 3)));
        vA[i] = __half2float(hA[i]);
    }
    for (int i = 0; i < 256; i++) {
        hB[i] = __float2half((float)((urand() * 2 - 1) * ldexp(1.0, (int)(urand() * 6) - 3)));
        vB[i] = __half2float(hB[i]);
    }
    for (int i = 0; i < 128; i++) hC[i] = (float)(urand() * 4 - 2);
    __half *dA, *dB;
    float *dC, *dD;
    CUDA_OK(cudaMalloc((void **)&dA, sizeof hA));
    CUDA_OK(cudaMalloc((void **)&dB, sizeof hB));
    CUDA_OK(cudaMalloc((void **)&dC, sizeof hC));
    CUDA_OK(cudaMalloc((void **)&dD, sizeof hD));
    CUDA_OK(cudaMemcpy(dA, hA, sizeof hA, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dB, hB, sizeof hB, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dC, hC, sizeof hC, cudaMemcpyHostToDevice));
    HKV_LAUNCH(k_mma, 1, 32, 0, 0)(dA, dB, dC, dD);
    CUDA_OK(cudaMemcpy(hD, dD, sizeof hD, cudaMemcpyDeviceToHost));
    int bad = 0;
    double worst = 0;
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            double want = hC[r * 8 + n], mag = fabs(want);
            for (int s = 0; s < 2; s++)
                for (int k = 0; k < 16; k++) {
                    const double p = vA[s * 256 + r * 16 + k] * vB[s * 128 + k * 8 + n];
                    want += p, mag += fabs(p);
                }
            const double err = fabs(hD[r * 8 + n] - want);
            worst = fmax(worst, err / mag);
            bad += err > 40 * ldexp(mag, -24);
        }
    CHECK(!bad, "mma.m16n8k16: %d of 128 outputs off (worst %.3g of the magnitudes)", bad, worst);

    /* ldmatrix */
    uint32_t *dout, out[32 * 8];
    CUDA_OK(cudaMalloc((void **)&dout, sizeof out));
    HKV_LAUNCH(k_ldsm, 1, 32, 0, 0)(dout);
    CUDA_OK(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int l = 0; l < 32; l++)
        for (int j = 0; j < 4; j++) {
            const int a = l / 4, b = 2 * (l % 4);
            /* plain: (row a, cols b, b+1); trans: (rows b, b+1, col a) */
            const int p0 = j * 64 + a * 8 + b, p1 = p0 + 1, t0 = j * 64 + b * 8 + a, t1 = t0 + 8;
            const uint32_t r = out[l * 8 + j], t = out[l * 8 + 4 + j];
            __half h[4];
            memcpy(&h[0], &r, 4);
            memcpy(&h[2], &t, 4);
            wrong += __half2float(h[0]) != p0 || __half2float(h[1]) != p1 ||
                     __half2float(h[2]) != t0 || __half2float(h[3]) != t1;
        }
    CHECK(!wrong, "ldmatrix.x4 (plain and .trans): %d of 128 lane registers hold other elements", wrong);

    expect_fault(M_ALIGN, 32, "not 16-byte aligned");
    expect_fault(M_PARTIAL, 16, "exited or missing");
    expect_fault(M_DIVERGE, 32, "divergent calls in warp");
    return test_report("emu_mma");
}
