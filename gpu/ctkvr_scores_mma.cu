/* CTKVR index build's scores on mma.sync (sm_80+): for KV head h and a block
 * of nc centroid rows, scores[i][p] = max over the group's query heads j of
 * q_i,j . k_p, the same values ctkvr_build.cu's CUDA-core kernel writes.
 *
 * Why tensor cores: the scores are C x g x n_far dot products of d a KV
 * head and layer (2048 x 4 x 96K x 128 at Llama-3-8B's default budget and
 * 96K: 53 TFLOP over a prompt's 32 layers), and the CUDA-core kernel reads
 * a shared-memory word per two multiply-adds. Both inputs are fp16 already
 * (the prompt's queries and keys), so each product is exact in the fp32
 * accumulator, as in the host's sgemm on the same values converted; only
 * the order of the fp32 additions differs (the build's test holds every
 * list to the host's up to float ties at the rho-th place).
 *
 * A block is 4 warps, 64 centroids by 64 keys; warp w owns centroids
 * 16w..16w+15 against all 64 keys (8 accumulator tiles of m16n8). The key
 * tile is copied once (cp.async); for each query head j of the group the
 * block's 64 centroid rows of head j are copied, S_j = Q_j K^T is formed
 * in registers, and the running max over j stays in registers: no score
 * row of a single head is ever stored. Fragments come by ldmatrix from
 * rows padded to D + 8 halves (the 8 rows of one ldmatrix in distinct
 * banks). Columns d..D are zeros in both operands. Shared memory: (64 + 64)
 * x (D + 8) halves, 35 KB at D = 128. */
#include <math.h>

#include <cuda_pipeline_primitives.h>

#include "gpu_internal.cuh"
#include "mma_frag.cuh"

#define SB_WARPS 4
#define SB_BM (16 * SB_WARPS) /* centroids a block */
#define SB_BN 64              /* keys a block */

static size_t sb_smem_bytes(int D) { return (size_t)(SB_BM + SB_BN) * (D + 8) * 2; }

/* rows [0, n) of 16-byte chunks into dst (LD halves a row): row r from src
 * + r * ld_src, zeros for rows at or past valid and for columns past d */
template <int D>
static __device__ __forceinline__ void sb_load_rows(__half *dst, const uint16_t *src, int64_t ld_src,
                                                    int n, int64_t valid, int d)
{
    constexpr int CH = D / 8, LD = D + 8;
    for (int i = threadIdx.x; i < n * CH; i += SB_WARPS * 32) {
        const int r = i / CH, c = i - r * CH;
        const bool in = r < valid && c * 8 < d;
        __pipeline_memcpy_async(dst + r * LD + c * 8, src + (in ? r * ld_src + c * 8 : 0), 16,
                                in ? 0 : 16);
    }
}

template <int D>
static __global__ void __launch_bounds__(SB_WARPS * 32)
k_build_scores_mma(const uint16_t *__restrict__ q, int64_t ldq, int64_t i0, int64_t nc, int g,
                   int d, int h, const uint16_t *__restrict__ k, int64_t ld, int64_t lo,
                   int64_t nfar, float *__restrict__ scores)
{
#ifdef HKV_MMA_OK
    constexpr int LD = D + 8, KS = D / 16, NT = SB_BN / 8;
    HKV_DYN_SHARED(unsigned char, sb_raw);
    __half *const ks = (__half *)sb_raw;   /* [SB_BN][LD] the block's keys */
    __half *const qs = ks + SB_BN * LD;    /* [SB_BM][LD] its centroids' head j */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
    const int mj = lane >> 3, mi = lane & 7;   /* ldmatrix: this lane's matrix and row */
    const int64_t p0 = (int64_t)blockIdx.x * SB_BN, c0 = (int64_t)blockIdx.y * SB_BM;
    sb_load_rows<D>(ks, k + (lo + p0) * ld, ld, SB_BN, nfar - p0, d);
    const uint16_t *qb = q + (i0 + c0) * ldq + (int64_t)h * g * d;
    float best[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) best[nt][0] = best[nt][1] = best[nt][2] = best[nt][3] = -INFINITY;
    for (int j = 0; j < g; j++) {
        if (j) __syncthreads();   /* every warp is done with head j - 1's rows */
        sb_load_rows<D>(qs, qb + (int64_t)j * d, ldq, SB_BM, nc - c0, d);
        __pipeline_commit();
        __pipeline_wait_prior(0);
        __syncthreads();
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            uint32_t a[4];   /* rows 0-7 / 8-15 (matrix bit 0) x dims 0-7 / 8-15 (bit 1) */
            hkv_ldsm_x4(a, qs + (warp * 16 + (mj & 1) * 8 + mi) * LD + kk * 16 + (mj >> 1) * 8);
#pragma unroll
            for (int nt = 0; nt < NT; nt += 2) {
                uint32_t b[4];   /* keys 8nt.. (b[0..1]) and 8nt+8.. (b[2..3]) x 16 dims */
                hkv_ldsm_x4(b, ks + ((nt + (mj >> 1)) * 8 + mi) * LD + kk * 16 + (mj & 1) * 8);
                hkv_mma16816(s[nt], a, b);
                hkv_mma16816(s[nt + 1], a, b + 2);
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) best[nt][c] = fmaxf(best[nt][c], s[nt][c]);
    }
    /* lane: centroids gid and gid + 8 of the warp's 16, keys 2 tig, 2 tig + 1 of each tile */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t i = c0 + warp * 16 + gid + 8 * r;
        if (i >= nc) continue;
        float *row = scores + i * nfar;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int64_t p = p0 + nt * 8 + 2 * tig + c;
                if (p < nfar) row[p] = best[nt][2 * r + c];
            }
    }
#else
    __trap();   /* built for less than sm_80: hkv_gpu_ctkvr_scores_mma_unfit keeps it from launching */
#endif
}

extern "C" const char *hkv_gpu_ctkvr_scores_mma_unfit(int d, int vec16)
{
    if (d > 128) return "head size above 128";
    if (d % 8) return "head size not a multiple of 8 (rows go in 16-byte copies)";
    if (!vec16) return "query or key rows not 16-byte aligned";
    return hkv_gpu_mma_arch_unfit((const void *)k_build_scores_mma<128>);
}

extern "C" int hkv_gpu_ctkvr_scores_mma(const uint16_t *q, int64_t ldq, int64_t i0, int64_t nc,
                                        int g, int d, int h, const uint16_t *k, int64_t ld,
                                        int64_t lo, int64_t nfar, float *scores, cudaStream_t st,
                                        hkv_err *err)
{
    const int64_t bx = (nfar + SB_BN - 1) / SB_BN, by = (nc + SB_BM - 1) / SB_BM;
    if (bx > 2147483647 || by > 65535)
        return hkv_seterr(err, HKV_E_RANGE, "gpu ctkvr build scores: %lld keys x %lld centroids "
                          "in one launch", (long long)nfar, (long long)nc);
    dim3 grid((unsigned)bx, (unsigned)by);
    if (d <= 64)
        HKV_LAUNCH(k_build_scores_mma<64>, grid, SB_WARPS * 32, sb_smem_bytes(64), st)(
            q, ldq, i0, nc, g, d, h, k, ld, lo, nfar, scores);
    else
        HKV_LAUNCH(k_build_scores_mma<128>, grid, SB_WARPS * 32, sb_smem_bytes(128), st)(
            q, ldq, i0, nc, g, d, h, k, ld, lo, nfar, scores);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}
