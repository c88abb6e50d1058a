/* cublasGemmEx / cublasGemmStridedBatchedEx of the CUDA emulator against the
 * cuBLAS reference: C = alpha op(A) op(B) + beta C, column-major, op(X) = X
 * (CUBLAS_OP_N) or X^T (CUBLAS_OP_T, and CUBLAS_OP_C, which for real data is
 * the transpose), A and B fp16 (or bf16), C fp32 (or fp16), CUBLAS_COMPUTE_32F.
 * All op combinations, odd m/n/k (1, 7, 33) and k = 0, leading dimensions
 * larger than needed (the padding of A and B holds NaN: it must not be read;
 * the rows of C past m hold a sentinel: they must not be written), alpha and
 * beta not 0 or 1, beta = 0 with C holding NaN ("C does not have to be a valid
 * input"); results in the handle's stream. The reference is a float64 sum of
 * the exactly decoded inputs; the tolerance is the fp32 accumulation bound
 * (k + 4) * 2^-23 * (|alpha| sum |a b| + |beta c|) (and half an fp16 ulp more
 * for an fp16 C). Argument errors give CUBLAS_STATUS_INVALID_VALUE:
 * m, n, k < 0, lda < max(1, rows of op(A) as stored), ldb likewise,
 * ldc < max(1, m), alpha or beta NULL. */
#include <math.h>
#include <stdint.h>

#include <vector>

#include "emu_test.h"

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return rs;
}
static double half_val(uint16_t h)
{
    const int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp((double)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp((double)(1024 + m), e - 25);
    return (h & 0x8000) ? -v : v;
}
static double bf16_val(uint16_t b)
{
    const int e = (b >> 7) & 255, m = b & 127;
    double v = e == 0 ? ldexp((double)m, -133) : e == 255 ? (m ? NAN : INFINITY) : ldexp((double)(128 + m), e - 134);
    return (b & 0x8000) ? -v : v;
}
/* a random half or bf16 in +-[1/4, 4) */
static uint16_t rnd_half(void) { return (uint16_t)((rnd() & 0x8000) | ((13 + rnd() % 4) << 10) | (rnd() & 0x3ff)); }
static uint16_t rnd_bf16(void) { return (uint16_t)((rnd() & 0x8000) | ((125 + rnd() % 4) << 7) | (rnd() & 0x7f)); }

struct gemm_case {
    cublasOperation_t ta, tb;
    int m, n, k, lda, ldb, ldc;
    float alpha, beta;
    cudaDataType ab, c;   /* input and output types */
};

static const char *op_name(cublasOperation_t o) { return o == CUBLAS_OP_N ? "N" : o == CUBLAS_OP_T ? "T" : "C"; }

/* Runs one GEMM, returns the number of wrong elements. */
static int run_case(cublasHandle_t h, cudaStream_t s, const gemm_case &g, int batch = 1)
{
    const bool na = g.ta == CUBLAS_OP_N, nb = g.tb == CUBLAS_OP_N;
    const int ar = na ? g.m : g.k, ac = na ? g.k : g.m;   /* A as stored: ar x ac */
    const int br = nb ? g.k : g.n, bc = nb ? g.n : g.k;
    const size_t sa = (size_t)g.lda * (ac ? ac : 1), sb = (size_t)g.ldb * (bc ? bc : 1), sc = (size_t)g.ldc * g.n;
    const uint16_t nan16 = g.ab == CUDA_R_16F ? 0x7e00 : 0x7fc0;
    std::vector<uint16_t> A(sa * batch, nan16), B(sb * batch, nan16);
    for (int t = 0; t < batch; t++) {
        for (int j = 0; j < ac; j++)
            for (int i = 0; i < ar; i++) A[t * sa + (size_t)j * g.lda + i] = g.ab == CUDA_R_16F ? rnd_half() : rnd_bf16();
        for (int j = 0; j < bc; j++)
            for (int i = 0; i < br; i++) B[t * sb + (size_t)j * g.ldb + i] = g.ab == CUDA_R_16F ? rnd_half() : rnd_bf16();
    }
    auto val = [&](uint16_t x) { return g.ab == CUDA_R_16F ? half_val(x) : bf16_val(x); };
    const float sentinel = 12345.0f;
    std::vector<float> C0(sc * batch, sentinel);
    for (size_t t = 0; t < (size_t)batch; t++)
        for (int j = 0; j < g.n; j++)
            for (int i = 0; i < g.m; i++)
                C0[t * sc + (size_t)j * g.ldc + i] = g.beta == 0.0f ? NAN : (float)((double)(rnd() % 2001) / 250.0 - 4.0);
    /* C as the output type */
    std::vector<uint16_t> C0h(sc * batch);
    if (g.c == CUDA_R_16F)
        for (size_t i = 0; i < C0.size(); i++) {
            /* exact halves for the initial C: quarter steps in [-4, 4] and the sentinel */
            const float v = C0[i];
            uint16_t hb = 0;
            if (v == sentinel) hb = 0x7222;   /* 12560, any fixed value */
            else if (isnan(v)) hb = 0x7e00;
            else {
                /* v is a multiple of 1/250: use the nearest quarter, exactly representable */
                const double q = nearbyint(v * 4) / 4;
                C0[i] = (float)q;
                double a = fabs(q);
                int e = 0;
                if (a == 0) hb = 0;
                else {
                    while (a >= 2) a /= 2, e++;
                    while (a < 1) a *= 2, e--;
                    hb = (uint16_t)(((e + 15) << 10) | (int)((a - 1) * 1024));
                }
                if (q < 0) hb |= 0x8000;
            }
            C0h[i] = hb;
        }
    uint16_t *dA, *dB;
    void *dC;
    const size_t cbytes = sc * batch * (g.c == CUDA_R_32F ? 4 : 2);
    CUDA_OK(cudaMalloc((void **)&dA, A.size() * 2));
    CUDA_OK(cudaMalloc((void **)&dB, B.size() * 2));
    CUDA_OK(cudaMalloc(&dC, cbytes));
    CUDA_OK(cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dB, B.data(), B.size() * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dC, g.c == CUDA_R_32F ? (const void *)C0.data() : (const void *)C0h.data(), cbytes,
                       cudaMemcpyHostToDevice));
    cublasStatus_t st;
    if (batch == 1)
        st = cublasGemmEx(h, g.ta, g.tb, g.m, g.n, g.k, &g.alpha, dA, g.ab, g.lda, dB, g.ab, g.ldb, &g.beta, dC, g.c,
                          g.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    else
        st = cublasGemmStridedBatchedEx(h, g.ta, g.tb, g.m, g.n, g.k, &g.alpha, dA, g.ab, g.lda, (long long)sa, dB,
                                        g.ab, g.ldb, (long long)sb, &g.beta, dC, g.c, g.ldc, (long long)sc, batch,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    CHECK(st == CUBLAS_STATUS_SUCCESS, "GemmEx %s%s m %d n %d k %d: %s", op_name(g.ta), op_name(g.tb), g.m, g.n, g.k,
          cublasGetStatusName(st));
    CUDA_OK(cudaStreamSynchronize(s));
    std::vector<float> C(sc * batch);
    std::vector<uint16_t> Ch(sc * batch);
    if (g.c == CUDA_R_32F) CUDA_OK(cudaMemcpy(C.data(), dC, cbytes, cudaMemcpyDeviceToHost));
    else {
        CUDA_OK(cudaMemcpy(Ch.data(), dC, cbytes, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < Ch.size(); i++) C[i] = (float)half_val(Ch[i]);
    }
    int bad = 0;
    for (int t = 0; t < batch; t++)
        for (int j = 0; j < g.n; j++)
            for (int i = 0; i < g.ldc; i++) {
                const size_t ci = t * sc + (size_t)j * g.ldc + i;
                if (i >= g.m) {   /* padding rows: untouched */
                    const bool same = g.c == CUDA_R_32F ? C[ci] == sentinel : Ch[ci] == C0h[ci];
                    if (!same && bad++ < 3) CHECK(0, "GemmEx wrote C(%d, %d) in the ldc padding", i, j);
                    continue;
                }
                double acc = 0, mag = 0;
                for (int l = 0; l < g.k; l++) {
                    const double a = val(A[t * sa + (na ? (size_t)l * g.lda + i : (size_t)i * g.lda + l)]);
                    const double b = val(B[t * sb + (nb ? (size_t)j * g.ldb + l : (size_t)l * g.ldb + j)]);
                    acc += a * b;
                    mag += fabs(a * b);
                }
                double want = g.alpha * acc, scale = fabs(g.alpha) * mag;
                if (g.beta != 0.0f) {
                    want += g.beta * (double)C0[ci];
                    scale += fabs(g.beta * (double)C0[ci]);
                }
                double tol = (g.k + 4) * ldexp(scale, -23) + 1e-30;
                if (g.c == CUDA_R_16F) tol += fabs(want) * ldexp(1.0, -11) + ldexp(1.0, -25);
                const double got = C[ci];
                if (!(fabs(got - want) <= tol) && bad++ < 3)
                    CHECK(0, "GemmEx %s%s m %d n %d k %d lda %d ldb %d ldc %d alpha %g beta %g batch %d/%d: C(%d,%d) = "
                          "%.9g, want %.9g +- %.2g", op_name(g.ta), op_name(g.tb), g.m, g.n, g.k, g.lda, g.ldb, g.ldc,
                          g.alpha, g.beta, t, batch, i, j, got, want, tol);
            }
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
    return bad;
}

static void test_shapes(cublasHandle_t h, cudaStream_t s)
{
    const int dims[] = {1, 7, 33};
    const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T};
    int cases = 0, bad_cases = 0;
    for (cublasOperation_t ta : ops)
        for (cublasOperation_t tb : ops)
            for (int m : dims)
                for (int n : dims)
                    for (int k : dims) {
                        gemm_case g;
                        g.ta = ta, g.tb = tb, g.m = m, g.n = n, g.k = k;
                        g.lda = (ta == CUBLAS_OP_N ? m : k) + 3;
                        g.ldb = (tb == CUBLAS_OP_N ? k : n) + 5;
                        g.ldc = m + 2;
                        g.alpha = 0.75f, g.beta = -1.25f;
                        g.ab = CUDA_R_16F, g.c = CUDA_R_32F;
                        bad_cases += run_case(h, s, g) != 0;
                        cases++;
                    }
    CHECK(bad_cases == 0, "%d of %d shapes wrong", bad_cases, cases);
    /* tight leading dimensions, beta = 0 over a NaN C, alpha = 1 */
    for (cublasOperation_t ta : ops)
        for (cublasOperation_t tb : ops) {
            gemm_case g{ta, tb, 33, 7, 33, 0, 0, 33, 1.0f, 0.0f, CUDA_R_16F, CUDA_R_32F};
            g.lda = ta == CUBLAS_OP_N ? g.m : g.k;
            g.ldb = tb == CUBLAS_OP_N ? g.k : g.n;
            CHECK(run_case(h, s, g) == 0, "beta = 0 with NaN in C (%s%s)", op_name(ta), op_name(tb));
        }
    /* k = 0: C = beta C */
    {
        gemm_case g{CUBLAS_OP_N, CUBLAS_OP_N, 7, 7, 0, 7, 1, 9, 0.75f, -1.25f, CUDA_R_16F, CUDA_R_32F};
        CHECK(run_case(h, s, g) == 0, "k = 0");
    }
    /* fp16 output, bf16 inputs, a larger square */
    {
        gemm_case g{CUBLAS_OP_T, CUBLAS_OP_N, 33, 33, 7, 9, 8, 35, 0.5f, 0.25f, CUDA_R_16F, CUDA_R_16F};
        CHECK(run_case(h, s, g) == 0, "fp16 C");
        gemm_case b{CUBLAS_OP_N, CUBLAS_OP_T, 7, 33, 33, 8, 40, 8, 1.5f, -0.5f, CUDA_R_16BF, CUDA_R_32F};
        CHECK(run_case(h, s, b) == 0, "bf16 A and B");
        gemm_case l{CUBLAS_OP_N, CUBLAS_OP_N, 96, 80, 130, 100, 131, 97, 0.75f, -1.25f, CUDA_R_16F, CUDA_R_32F};
        CHECK(run_case(h, s, l) == 0, "96 x 80 x 130");
    }
    /* strided batched */
    {
        gemm_case g{CUBLAS_OP_T, CUBLAS_OP_T, 7, 33, 7, 10, 34, 9, -0.75f, 1.5f, CUDA_R_16F, CUDA_R_32F};
        CHECK(run_case(h, s, g, 3) == 0, "strided batched, 3");
    }
    /* CUBLAS_OP_C: for real data the transpose (cuBLAS accepts N, T and C) */
    {
        uint16_t *d;
        float *c;
        CUDA_OK(cudaMalloc((void **)&d, 64 * 2));
        CUDA_OK(cudaMalloc((void **)&c, 64 * 4));
        CUDA_OK(cudaMemset(d, 0, 64 * 2));
        const float one = 1.0f, zero = 0.0f;
        const cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_C, CUBLAS_OP_C, 2, 2, 2, &one, d, CUDA_R_16F, 2, d,
                                               CUDA_R_16F, 2, &zero, c, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F,
                                               CUBLAS_GEMM_DEFAULT);
        CUDA_OK(cudaStreamSynchronize(s));
        cudaFree(d);
        cudaFree(c);
        CHECK(st == CUBLAS_STATUS_SUCCESS,
                            "cublasGemmEx with CUBLAS_OP_C: %s, want success (the transpose for real data; "
                            "gpu/emu/emu_cublas.cc, check)", cublasGetStatusName(st));
        if (st == CUBLAS_STATUS_SUCCESS) {
            gemm_case g{CUBLAS_OP_C, CUBLAS_OP_N, 7, 7, 33, 36, 33, 7, 0.75f, -1.25f, CUDA_R_16F, CUDA_R_32F};
            CHECK(run_case(h, s, g) == 0, "CUBLAS_OP_C on A");
            gemm_case b{CUBLAS_OP_N, CUBLAS_OP_C, 7, 7, 33, 7, 8, 7, 0.75f, -1.25f, CUDA_R_16F, CUDA_R_32F};
            CHECK(run_case(h, s, b) == 0, "CUBLAS_OP_C on B");
        }
    }
    printf("cublasGemmEx: %d shapes x op combinations and the special cases\n", cases);
}

static void test_invalid(cublasHandle_t h)
{
    uint16_t *dA, *dB;
    float *dC;
    CUDA_OK(cudaMalloc((void **)&dA, 64 * 64 * 2));
    CUDA_OK(cudaMalloc((void **)&dB, 64 * 64 * 2));
    CUDA_OK(cudaMalloc((void **)&dC, 64 * 64 * 4));
    CUDA_OK(cudaMemset(dC, 0, 64 * 64 * 4));
    const float one = 1.0f, zero = 0.0f;
    struct bad {
        cublasOperation_t ta, tb;
        int m, n, k, lda, ldb, ldc;
        const char *what;
    } const B[] = {
        {CUBLAS_OP_N, CUBLAS_OP_N, 7, 7, 7, 6, 7, 7, "lda < m (A not transposed)"},
        {CUBLAS_OP_T, CUBLAS_OP_N, 7, 7, 9, 8, 9, 7, "lda < k (A transposed)"},
        {CUBLAS_OP_N, CUBLAS_OP_N, 7, 7, 9, 7, 8, 7, "ldb < k (B not transposed)"},
        {CUBLAS_OP_N, CUBLAS_OP_T, 7, 9, 7, 7, 8, 7, "ldb < n (B transposed)"},
        {CUBLAS_OP_N, CUBLAS_OP_N, 7, 7, 7, 7, 7, 6, "ldc < m"},
        {CUBLAS_OP_N, CUBLAS_OP_N, -1, 7, 7, 7, 7, 7, "m < 0"},
        {CUBLAS_OP_N, CUBLAS_OP_N, 7, -1, 7, 7, 7, 7, "n < 0"},
        {CUBLAS_OP_N, CUBLAS_OP_N, 7, 7, -1, 7, 7, 7, "k < 0"},
        {CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, 0, 1, 1, "lda = 0 (< max(1, m))"},
        /* 3: within the enum's range of values (0..3), but no operation */
        {(cublasOperation_t)3, CUBLAS_OP_N, 7, 7, 7, 7, 7, 7, "an unknown operation"},
    };
    for (const bad &b : B) {
        const cublasStatus_t st = cublasGemmEx(h, b.ta, b.tb, b.m, b.n, b.k, &one, dA, CUDA_R_16F, b.lda, dB,
                                               CUDA_R_16F, b.ldb, &zero, dC, CUDA_R_32F, b.ldc, CUBLAS_COMPUTE_32F,
                                               CUBLAS_GEMM_DEFAULT);
        CHECK(st == CUBLAS_STATUS_INVALID_VALUE, "%s: %s, want CUBLAS_STATUS_INVALID_VALUE", b.what,
              cublasGetStatusName(st));
    }
    /* alpha or beta NULL */
    cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 7, 7, 7, nullptr, dA, CUDA_R_16F, 7, dB, CUDA_R_16F,
                                     7, &zero, dC, CUDA_R_32F, 7, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    CHECK(st == CUBLAS_STATUS_INVALID_VALUE, "alpha NULL: %s", cublasGetStatusName(st));
    st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 7, 7, 7, &one, dA, CUDA_R_16F, 7, dB, CUDA_R_16F, 7, nullptr, dC,
                      CUDA_R_32F, 7, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    CHECK(st == CUBLAS_STATUS_INVALID_VALUE, "beta NULL: %s", cublasGetStatusName(st));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> c(64 * 64);
    CUDA_OK(cudaMemcpy(c.data(), dC, c.size() * 4, cudaMemcpyDeviceToHost));
    int touched = 0;
    for (float v : c) touched += v != 0.0f;
    CHECK(touched == 0, "refused GEMMs wrote %d elements of C", touched);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
}

int main(void)
{
    cublasHandle_t h;
    CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS, "cublasCreate");
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cublasSetStream(h, s) == CUBLAS_STATUS_SUCCESS, "cublasSetStream");
    cudaStream_t got = nullptr;
    CHECK(cublasGetStream(h, &got) == CUBLAS_STATUS_SUCCESS && got == s, "cublasGetStream");
    test_shapes(h, s);
    test_invalid(h);
    CHECK(cublasDestroy(h) == CUBLAS_STATUS_SUCCESS, "cublasDestroy");
    CUDA_OK(cudaStreamDestroy(s));
    return test_report("emu_cublas");
}
