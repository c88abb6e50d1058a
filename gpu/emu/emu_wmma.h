/* nvcuda::wmma (CUDA C++ Programming Guide, "Warp Matrix Functions") on the
 * CPU, for the m16n16k16 shape with half inputs and a float or half
 * accumulator: what a .cu file gets from <mma.h> in an emulator build
 * (gpu/emu/include/mma.h).
 *
 * Fragments hold what they hold on a GPU, per lane: 16 halves for matrix_a /
 * matrix_b, 8 elements for an accumulator (num_elements as in CUDA's
 * crt/mma.h; a 16x16 input is held twice over the warp). Which matrix
 * element sits in which lane's x[e] is unspecified by CUDA; here it is a fixed
 * scramble (elem_index), different per role and like no hardware's, so code
 * that relies on a layout gives wrong results instead of passing by luck.
 * Elementwise code uniform over the fragment (fill, scale every x[e]) works,
 * as on a GPU. The two copies of an input element must agree when mma_sync
 * reads them: a non-uniform write to x[] of a matrix_a/b fragment faults.
 *
 * load_matrix_sync, store_matrix_sync and mma_sync are warp collectives, as
 * on a GPU (the guide: "must be called by all threads in the warp", with the
 * same mptr, ldm, layout and template parameters). Each lane records its call
 * (kind, call site, arguments, its fragment's address) in a per-warp table;
 * the last lane to arrive checks that all 32 agree, performs the operation for
 * every lane's fragment, and then all meet in a __syncwarp-like collective of
 * the block scheduler (emu_block.cc), so no lane reads a result before it
 * exists and a lane that calls another collective meanwhile is a divergence
 * fault there. fill_fragment is not a collective (crt/mma.h: a loop over x[]).
 *
 * Faults (kernel_fault: the grid stops, the error is sticky): a warp with an
 * exited or missing lane; lanes at different WMMA call sites or disagreeing
 * on pointer, ldm or layout; mptr not 256-bit aligned; ldm not a multiple of
 * 8 (half) or 4 (float) elements (16 bytes); non-uniform input copies.
 *
 * Arithmetic: products of halves are exact, each output element is C + the
 * 16 products summed in double and rounded once (to float, or to half for a
 * half accumulator). A GPU accumulates in fp32 in an unspecified order with
 * its own rounding; tests must allow fp32 accumulation error, as with the
 * fast intrinsics (CUDA_EMU.md). */
#ifndef HKV_EMU_WMMA_H
#define HKV_EMU_WMMA_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <type_traits>

#include "emu_collective.h"

namespace nvcuda {
namespace wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };
}  // namespace wmma
}  // namespace nvcuda

namespace hkv_emu {
namespace wmma {

enum role { R_A, R_B, R_C };
enum op { OP_LOAD = 1, OP_STORE, OP_MMA };

template <class Use> struct use_role;
template <> struct use_role<nvcuda::wmma::matrix_a> { static constexpr int v = R_A; };
template <> struct use_role<nvcuda::wmma::matrix_b> { static constexpr int v = R_B; };
template <> struct use_role<nvcuda::wmma::accumulator> { static constexpr int v = R_C; };
/* 0 row-major, 1 column-major, -1 none (an accumulator: given at load/store) */
template <class L> struct layout_code { static constexpr int v = -2; };
template <> struct layout_code<void> { static constexpr int v = -1; };
template <> struct layout_code<nvcuda::wmma::row_major> { static constexpr int v = 0; };
template <> struct layout_code<nvcuda::wmma::col_major> { static constexpr int v = 1; };

template <class Use, int M, int N, int K, class T, class Layout>
struct alignas(8) frag_base {
    static_assert(M == 16 && N == 16 && K == 16,
                  "the CUDA emulator models only the m16n16k16 WMMA shape");
    static constexpr int role_v = use_role<Use>::v;
    static_assert(role_v == R_C ? ((std::is_same<T, float>::value || std::is_same<T, __half>::value) &&
                                   std::is_same<Layout, void>::value)
                                : (std::is_same<T, __half>::value && layout_code<Layout>::v >= 0),
                  "the CUDA emulator models half matrix_a/matrix_b fragments (row_major or "
                  "col_major) and float or half accumulators (no layout)");
    enum { num_elements = role_v == R_C ? 8 : 16, num_storage_elements = num_elements };
    typedef T element_type;
    typedef T storage_element_type;
    T x[num_elements];
};

/* The matrix element (row * 16 + col of the role's own 16x16 matrix: A[i][k],
 * B[k][j], C[i][j]) that lane's x[e] holds. Odd multipliers mod 256 are
 * bijections, so every element is held once (accumulator) or by exactly two
 * lanes, lane and lane ^ 16 (inputs: 512 slots, slot s and s + 256). */
static inline int elem_index(int r, int lane, int e)
{
    if (r == R_C) return ((lane * 8 + e) * 77 + 29) & 255;
    const int s = lane * 16 + e;
    return r == R_A ? (s * 45 + 7) & 255 : (s * 109 + 91) & 255;
}

/* One lane's call, as the last lane to arrive needs it. */
struct lane_call {
    int op;
    const char *file;
    int line;
    void *frag;              /* load: destination; store: source; mma: d */
    int role, half, layout;  /* of frag (layout: the fragment's, or the load/store argument) */
    const void *mptr;
    unsigned ldm;
    const void *a, *b, *c;   /* mma's inputs */
    int a_layout, b_layout, c_half;
};

static inline const char *op_name(int o)
{
    return o == OP_LOAD ? "nvcuda::wmma::load_matrix_sync"
           : o == OP_STORE ? "nvcuda::wmma::store_matrix_sync" : "nvcuda::wmma::mma_sync";
}

static inline double get(const void *x, int half, int e)
{
    if (half) {
        uint16_t b;
        memcpy(&b, (const char *)x + 2 * e, 2);
        return f16_to_f32(b);
    }
    float f;
    memcpy(&f, (const char *)x + 4 * e, 4);
    return f;
}

/* Offset in elements of logical (row, col) in memory of the given layout. */
static inline size_t mem_off(int layout, int row, int col, unsigned ldm)
{
    return layout == 0 ? (size_t)row * ldm + col : (size_t)col * ldm + row;
}

/* Gathers a 16x16 input matrix from all lanes' fragments; the two copies of
 * an element must agree bit for bit. */
static inline void gather_input(const lane_call *w, int r, int which, double out[256], const char *site_file,
                                int site_line)
{
    int owner[256];
    uint16_t bits[256];
    for (int i = 0; i < 256; i++) owner[i] = -1;
    for (int l = 0; l < 32; l++) {
        const void *x = which == 0 ? w[l].a : w[l].b;
        for (int e = 0; e < 16; e++) {
            const int idx = elem_index(r, l, e);
            uint16_t b;
            memcpy(&b, (const char *)x + 2 * e, 2);
            if (owner[idx] < 0) {
                owner[idx] = l, bits[idx] = b;
                out[idx] = f16_to_f32(b);
            } else if (bits[idx] != b) {
                faultf("%s at %s:%d: element (%d,%d) of the %s fragment differs between lanes %d "
                     "(0x%04x) and %d (0x%04x): elementwise code that relies on the fragment "
                     "layout, which CUDA leaves unspecified", op_name(OP_MMA), site_file, site_line,
                     idx >> 4, idx & 15, r == R_A ? "matrix_a" : "matrix_b", owner[idx],
                     bits[idx], l, b);
            }
        }
    }
}

/* The last lane's work: every lane's call checked against lane 0's, then
 * the operation for the whole warp. */
/* D = C + A B, 16 x 16 x 16 in double, each sum in k order. Pure
 * arithmetic on fixed-size arrays, outside ASan's instrumentation (checked,
 * a sixth of gpu_attn's time under ASan; every index is a loop bound). */
__attribute__((no_sanitize("address"))) static inline void product16(const double *A, const double *B,
                                                                    const double *C, double *D)
{
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            double s = C[i * 16 + j];
            for (int k = 0; k < 16; k++) s += A[i * 16 + k] * B[k * 16 + j];
            D[i * 16 + j] = s;
        }
}

static inline void perform(lane_call *w, int warp)
{
    const lane_call &c0 = w[0];
    for (int l = 1; l < 32; l++) {
        const lane_call &c = w[l];
        if (c.mptr != c0.mptr || c.ldm != c0.ldm || c.layout != c0.layout)
            faultf("%s at %s:%d: lanes of warp %d disagree on its arguments (lane 0: mptr %p ldm %u "
                 "layout %d; lane %d: mptr %p ldm %u layout %d); the guide requires the same for "
                 "all threads of the warp", op_name(c0.op), c0.file, c0.line, warp, c0.mptr, c0.ldm,
                 c0.layout, l, c.mptr, c.ldm, c.layout);
    }
    if (c0.op == OP_LOAD || c0.op == OP_STORE) {
        const int ne = c0.role == R_C ? 8 : 16, sz = c0.half ? 2 : 4;
        for (int l = 0; l < 32; l++)
            for (int e = 0; e < ne; e++) {
                const int idx = elem_index(c0.role, l, e);
                const size_t off = mem_off(c0.layout, idx >> 4, idx & 15, c0.ldm) * sz;
                char *fx = (char *)w[l].frag + (size_t)e * sz;
                if (c0.op == OP_LOAD) memcpy(fx, (const char *)c0.mptr + off, sz);
                else memcpy((char *)c0.mptr + off, fx, sz);
            }
        return;
    }
    double A[256], B[256], C[256];
    gather_input(w, R_A, 0, A, c0.file, c0.line);
    gather_input(w, R_B, 1, B, c0.file, c0.line);
    for (int l = 0; l < 32; l++)
        for (int e = 0; e < 8; e++) C[elem_index(R_C, l, e)] = get(w[l].c, c0.c_half, e);
    double D[256];
    product16(A, B, C, D);
    /* all of C was read above: d may be c */
    for (int l = 0; l < 32; l++)
        for (int e = 0; e < 8; e++) {
            const double v = D[elem_index(R_C, l, e)];
            char *fx = (char *)w[l].frag;
            if (c0.half) {
                const uint16_t b = f64_to_f16_rn(v);
                memcpy(fx + 2 * e, &b, 2);
            } else {
                const float f = (float)v;
                memcpy(fx + 4 * e, &f, 4);
            }
        }
}

/* One lane's part of a WMMA collective. */
inline void collective(const lane_call &call)
{
    if (call.op != OP_MMA) {
        if ((uintptr_t)call.mptr % 32)
            faultf("%s at %s:%d: mptr %p is not 256-bit (32-byte) aligned", op_name(call.op), call.file,
                   call.line, call.mptr);
        if (call.ldm % (call.half ? 8u : 4u))
            faultf("%s at %s:%d: ldm %u is not a multiple of %d elements (16 bytes) for %s",
                   op_name(call.op), call.file, call.line, call.ldm, call.half ? 8 : 4,
                   call.half ? "half" : "float");
    }
    warp_collective(call, op_name, perform);
}

}  // namespace wmma
}  // namespace hkv_emu

namespace nvcuda {
namespace wmma {

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment : public hkv_emu::wmma::frag_base<Use, M, N, K, T, Layout> {};

/* Not a collective: a loop over x[] (crt/mma.h). */
template <class Use, int M, int N, int K, class T, class Layout>
static inline void fill_fragment(fragment<Use, M, N, K, T, Layout> &f,
                                 const typename fragment<Use, M, N, K, T, Layout>::element_type &v)
{
    for (int i = 0; i < fragment<Use, M, N, K, T, Layout>::num_elements; i++) f.x[i] = v;
}

/* matrix_a / matrix_b: the layout is the fragment's */
template <class Use, class Layout>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, __half, Layout> &f, const __half *mptr,
                                    unsigned ldm, const char *file = __builtin_FILE(),
                                    int line = __builtin_LINE())
{
    using F = fragment<Use, 16, 16, 16, __half, Layout>;
    static_assert(F::role_v != hkv_emu::wmma::R_C, "an accumulator load takes a layout_t");
    hkv_emu::wmma::lane_call c{};
    c.op = hkv_emu::wmma::OP_LOAD, c.file = file, c.line = line, c.frag = f.x;
    c.role = F::role_v, c.half = 1, c.layout = hkv_emu::wmma::layout_code<Layout>::v;
    c.mptr = mptr, c.ldm = ldm;
    hkv_emu::wmma::collective(c);
}

template <class T>
static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, T> &f, const T *mptr, unsigned ldm,
                                    layout_t layout, const char *file = __builtin_FILE(),
                                    int line = __builtin_LINE())
{
    hkv_emu::wmma::lane_call c{};
    c.op = hkv_emu::wmma::OP_LOAD, c.file = file, c.line = line, c.frag = f.x;
    c.role = hkv_emu::wmma::R_C, c.half = std::is_same<T, __half>::value;
    c.layout = layout == mem_row_major ? 0 : 1;
    c.mptr = mptr, c.ldm = ldm;
    hkv_emu::wmma::collective(c);
}

template <class T>
static inline void store_matrix_sync(T *mptr, const fragment<accumulator, 16, 16, 16, T> &f, unsigned ldm,
                                     layout_t layout, const char *file = __builtin_FILE(),
                                     int line = __builtin_LINE())
{
    hkv_emu::wmma::lane_call c{};
    c.op = hkv_emu::wmma::OP_STORE, c.file = file, c.line = line, c.frag = (void *)f.x;
    c.role = hkv_emu::wmma::R_C, c.half = std::is_same<T, __half>::value;
    c.layout = layout == mem_row_major ? 0 : 1;
    c.mptr = mptr, c.ldm = ldm;
    hkv_emu::wmma::collective(c);
}

/* D = A B + C; d may be the same fragment as c. */
template <class Td, class La, class Lb, class Tc>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, Td> &d,
                            const fragment<matrix_a, 16, 16, 16, __half, La> &a,
                            const fragment<matrix_b, 16, 16, 16, __half, Lb> &b,
                            const fragment<accumulator, 16, 16, 16, Tc> &c,
                            const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    hkv_emu::wmma::lane_call k{};
    k.op = hkv_emu::wmma::OP_MMA, k.file = file, k.line = line, k.frag = d.x;
    k.role = hkv_emu::wmma::R_C, k.half = std::is_same<Td, __half>::value, k.layout = -1;
    k.a = a.x, k.b = b.x, k.c = c.x;
    k.a_layout = hkv_emu::wmma::layout_code<La>::v, k.b_layout = hkv_emu::wmma::layout_code<Lb>::v;
    k.c_half = std::is_same<Tc, __half>::value;
    hkv_emu::wmma::collective(k);
}

}  // namespace wmma
}  // namespace nvcuda

#endif
