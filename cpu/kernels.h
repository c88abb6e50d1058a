/* Host kernels: weight formats, GEMV/GEMM, fp16 attention pieces.
 *
 * The kernels know nothing about models or policies. Every kernel that has
 * vector variants is reached through an hkv_cpu_kernels table filled for one
 * ISA (hkv_cpu_kernels_init), so the same binary runs AVX-512, AVX2 or scalar
 * code and tests can force each level.
 *
 * Threading: hkv_matmul is parallel inside (OpenMP over output rows).
 * Attention pieces are single-threaded; callers run them inside their own
 * parallel loop over (sequence, KV head). Kernels never allocate: gemv,
 * attn_dense, attn_sparse and score_max use up to 60 KB of stack,
 * attn_causal about 200 KB (flash-attention tiles), so threads that call
 * them need stacks of at least 256 KB (OpenMP and pthread defaults are MBs).
 * Vector levels cover d % 16 == 0 up to 256; other head sizes run the
 * scalar code in every table. */
#ifndef HKV_CPU_KERNELS_H
#define HKV_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "isa.h"

/* ---- weight matrices, repacked at load ---------------------------------- */

enum hkv_wtype {
    HKV_W_F32 = 0,   /* float  q[rows][cols] */
    HKV_W_F16 = 1,   /* uint16 q[rows][cols] (IEEE half) */
    HKV_W_Q8 = 2,    /* int8   q[rows][cols], fp16 scale[rows][cols/32]: w = scale*q */
    HKV_W_Q4 = 3,    /* uint8  q[rows][cols/2], fp16 scale and min[rows][cols/32]:
                      * w = scale*q + min; in block b of a row, byte j (0..15) holds
                      * element 32b+j in its low nibble and 32b+j+16 in its high nibble
                      * (the GGUF Q4_0/Q4_1 nibble order) */
};
#define HKV_WBLOCK 32

typedef struct hkv_wmat {
    int type;            /* enum hkv_wtype */
    int64_t rows;        /* output features */
    int64_t cols;        /* input features; a multiple of 32 for Q8/Q4 */
    void *q;             /* see enum hkv_wtype; 64-byte aligned */
    uint16_t *scale;     /* Q8/Q4 */
    uint16_t *min;       /* Q4 */
    int pack;            /* 0: the rows above; else Q4/Q8 interleaved for the FAST
                          * products, groups of `pack` rows (hkv_wmat_pack): q holds
                          * codes, scales and mins, scale and min are NULL */
} hkv_wmat;

/* Bytes one full pass over the matrix reads. */
size_t hkv_wmat_bytes(const hkv_wmat *w);

/* The FAST products' interleaved layout (cpu/wpack.c). Rows in groups of g
 * (the lanes of the kernel's vectors: 8 at 256 bits, 16 at 512); a group is one
 * stretch of records, each record two blocks (2i, 2i + 1; an odd last
 * block leaves half of one unused):
 *   codes   per block, Q4: 4, Q8: 8 pieces of g x 4 bytes; piece j, lane
 *           l = bytes 4j..4j+3 of row G*g+l's block (its 16 Q4 or 32 Q8 bytes)
 *   scales  per block, g fp16 (lane l's)
 *   mins    Q4: per block, g fp16
 * Rows past `rows` in the last group are zeros. What a row-layout kernel
 * transposes per 8 rows and block is laid out once at load, and the
 * hardware prefetcher follows one stream instead of 8-16 rows x 2-3 arrays;
 * records (Q4 / Q8: 320 / 544 bytes at g = 8, 640 / 1088 at 16) keep
 * every vector load of codes inside a line. Only qgemm reads it, and only the table whose qgemm_pack
 * is g (hkv_matmul refuses the rest). */
size_t hkv_wmat_pack_bytes(const hkv_wmat *w, int g);   /* 0: not packable */
/* One record's bytes (two blocks of g rows: codes, scales, mins), and where
 * row r's group starts in a matrix interleaved in groups of g. */
static inline size_t hkv_wpack_record_bytes(int q4, int g) { return 2 * (size_t)g * (q4 ? 20 : 34); }
static inline const char *hkv_wpack_group(const hkv_wmat *m, int q4, int g, int64_t r) {
    return (const char *)m->q +
           (size_t)(r / g) * (size_t)((m->cols / HKV_WBLOCK + 1) / 2) * hkv_wpack_record_bytes(q4, g);
}
/* Interleave src (Q4/Q8, rows layout) into dst (hkv_wmat_pack_bytes, 64-byte
 * aligned) and describe it in out (q = dst). HKV_E_INVAL if src cannot be
 * packed in groups of g (8 or 16). */
int hkv_wmat_pack(const hkv_wmat *src, int g, void *dst, hkv_wmat *out);

/* ---- int8 activations (precision "fast") ------------------------------- */

/* Activation rows quantised per 32-block to int8 with a float scale, for
 * the int8 dot-product products (qgemm). Block b of a row is q*d with
 * q in [-127, 127], d = max|x| / 127 over the block (0 for an all-zero
 * block). q keeps the elements in their natural order (the VNNI kernel
 * broadcasts 4 consecutive bytes to all lanes); hkv_qact_at reads one. */
typedef struct hkv_qact {
    int64_t cols;    /* elements per row, a multiple of 32 */
    int64_t nbp;     /* blocks per row (cols / 32): the stride of d, sx, sa */
    int8_t *q;       /* [n][cols] */
    float *d;        /* [n][nbp] block scales */
    float *sx;       /* [n][nbp] sum of the block's float activations (Q4's min term) */
    int32_t *sa;     /* [n][nbp] 128 * sum of the block's q (Q8's offset correction) */
} hkv_qact;

/* Bytes hkv_qact_view needs for n rows of cols (64-byte aligned parts). */
size_t hkv_qact_bytes(int64_t cols, int64_t n);
/* Lay out a hkv_qact for n rows over buf (64-byte aligned, hkv_qact_bytes). */
void hkv_qact_view(hkv_qact *a, void *buf, int64_t cols, int64_t n);

/* Element c of row i, as the int8 the kernel multiplies. */
static inline int hkv_qact_at(const hkv_qact *a, int64_t i, int64_t c)
{
    return a->q[i * a->nbp * 32 + c];
}

/* ---- the dispatch table -------------------------------------------------- */

typedef struct hkv_cpu_kernels {
    int isa;   /* enum hkv_isa these entries were built for */

    /* y[i][r] = sum_c W[r][c] x[i][c] for i < n (n <= HKV_GEMV_MAX_N), r in
     * [r0, r1). x rows are cols long, y rows are ldy long. Single-threaded;
     * hkv_matmul splits rows over threads. */
    void (*gemv)(const hkv_wmat *w, const float *x, int n, float *y, int64_t ldy,
                 int64_t r0, int64_t r1);

    /* As gemv, with each activation row's sum formed in the same order
     * whatever n is: a row's result does not depend on the other rows. */
    void (*gemv_fixed)(const hkv_wmat *w, const float *x, int n, float *y, int64_t ldy,
                       int64_t r0, int64_t r1);

    /* 0 (init's default): hkv_matmul as below. 1: hkv_matmul runs every n
     * through gemv_fixed (groups of HKV_GEMV_MAX_N rows, never sgemm), so
     * each output row depends on its input row alone: batch-invariant decode
     * (runtime/scheduler.c sets it around decode steps). */
    int batch_invariant;

    /* Precision of hkv_matmul on Q4/Q8 weights: HKV_PREC_EXACT (init's
     * default) multiplies fp32 activations (gemv / sgemm above);
     * HKV_PREC_FAST quantises the activations per 32-block to int8 and runs
     * qgemm (each product within sum_b (d_b / 2) sum_j |scale q_j| of
     * exact; on SmolLM2 the logits' mean KL from exact is 1e-2). Set it with
     * hkv_cpu_kernels_set_precision, which keeps EXACT where qgemm is NULL. */
    int precision;

    /* Fast path (AVX512-VNNI or AMX on the AVX-512 table, vpmaddubsw or
     * AVX-VNNI on the AVX2 one; NULL on scalar and on AVX-512 without VNNI,
     * where hkv_matmul stays exact). quant_act: rows [i0, i1) of x (cols each, a multiple of 32)
     * into a. qgemm: y[i][r] = sum_c W[r][c] a[i][c] for i < n, r in
     * [r0, r1), Q4/Q8 weights only. Any n (tiles of tokens inside); each
     * row's result is formed in the same order whatever n and r0..r1 are,
     * so a token's output does not depend on its neighbours
     * (batch-invariant by construction). Single-threaded. */
    void (*quant_act)(const float *x, int64_t i0, int64_t i1, const hkv_qact *a);
    /* qgemm runs 16-token tiles on AMX (1) or vpdpbusd only (0); the
     * results are the same bits (hkv_cpu_kernels_set_amx). */
    void (*qgemm)(const hkv_wmat *w, const hkv_qact *a, int n, float *y, int64_t ldy,
                  int64_t r0, int64_t r1);
    int amx;
    /* Rows per group of the interleaved layout (hkv_wmat_pack) this qgemm
     * reads without transposing: 8 on the AVX2 table, 16 on AVX-512 (VNNI
     * and AMX), 0 where it reads rows only. qgemm takes either layout; with a packed matrix r0 is a multiple
     * of it. */
    int qgemm_pack;
    /* 1 where qgemm is the AVX2 table's AVX-VNNI build (vpdpbusd at 256
     * bits), 0 for vpmaddubsw or the AVX-512 kernels: the same bits. */
    int avxvnni;

    /* Dequantise rows [r0, r1) of W to float dst[r1-r0][cols]. */
    void (*dequant_rows)(const hkv_wmat *w, int64_t r0, int64_t r1, float *dst);

    /* Dense attention of g query heads over n keys/values (fp16 rows of d,
     * row stride ld elements). q is [g][d]; logits are scale * q.k.
     * Writes out[g][d] (softmax-weighted V) and lse[g] (natural log).
     * n == 0 gives out = 0 and lse = -inf. Each head's out and lse are
     * formed with the same arithmetic whatever g and wherever the head sits
     * in q: the shared-prefix cascade (kv/kv_tiered_cascade.c) stacks many
     * rows' heads in one call and relies on it (tests/cpu/test_attn.c). */
    void (*attn_dense)(const float *q, int g, int d, const uint16_t *k, const uint16_t *v,
                       int64_t ld, int64_t n, float scale, float *out, float *lse);

    /* As attn_dense over the rows idx[0..n) of k and v. */
    void (*attn_sparse)(const float *q, int g, int d, const uint16_t *k, const uint16_t *v,
                        int64_t ld, const int32_t *idx, int64_t n, float scale,
                        float *out, float *lse);

    /* Causal block for prefill: nq query tokens, query i at position p0+i sees
     * keys [0, p0+i]. q is [nq][g][d] with query-token stride ldq floats,
     * out likewise with stride ldo, lse [nq][g]. Keys/values rows 0..p0+nq-1. */
    void (*attn_causal)(const float *q, int64_t ldq, int nq, int g, int d, int64_t p0,
                        const uint16_t *k, const uint16_t *v, int64_t ld, float scale,
                        float *out, int64_t ldo, float *lse);

    /* attn_causal in fewer bits, used at precision FAST
     * (hkv_attn_causal_for): on AMX-BF16 tiles where the CPU has them and
     * the OS granted them (attn_causal_amx.c: Q, K, V and the probabilities
     * in bf16, sums in fp32), else in 16-bit fixed point with exact int32
     * sums (attn_causal_i16.inc: AVX2, AVX-VNNI, AVX512-VNNI). NULL on
     * the scalar table and on AVX-512 without VNNI. */
    void (*attn_causal_fast)(const float *q, int64_t ldq, int nq, int g, int d, int64_t p0,
                             const uint16_t *k, const uint16_t *v, int64_t ld, float scale,
                             float *out, int64_t ldo, float *lse);

    /* Rerank scores: s[i] = max over the g heads of q_h . k[idx[i]] (unscaled). */
    void (*score_max)(const float *q, int g, int d, const uint16_t *k, int64_t ld,
                      const int32_t *idx, int64_t n, float *s);

    /* score_max over int8 key sketches: s[i] = max over the g heads of q_h .
     * k~[idx[i]], where k~ is row idx[i] of k (d int8 codes, stride ld, d a
     * multiple of HKV_SKETCH_GROUP) with each group of HKV_SKETCH_GROUP codes
     * times its scale, scale[idx[i] * (d / HKV_SKETCH_GROUP) + group]. Each
     * dot product is formed in fp32; the ctkvr rerank bounds the sketch's
     * error around it (index/ctkvr.c). */
    void (*score_max_i8)(const float *q, int g, int d, const int8_t *k, int64_t ld,
                         const float *scale, const int32_t *idx, int64_t n, float *s);
    /* score_max_i8 over 4-bit codes: row idx[i] of k holds d / 2 bytes
     * (stride ld bytes), element 2c the low nibble of byte c and 2c + 1 its
     * high one, each the value nibble - 8; scales as score_max_i8's. The
     * query is rounded to int8 per head and group and each group's product
     * formed exactly in integers (cpu/sketch_i4.h gives the definition):
     * every level gives the same bits, and a row's score does not depend on
     * where it sits in a call. */
    void (*score_max_i4)(const float *q, int g, int d, const uint8_t *k, int64_t ld,
                         const float *scale, const int32_t *idx, int64_t n, float *s);

    /* fp16 <-> f32 rows (round to nearest even, as F16C does). */
    void (*f16_to_f32)(const uint16_t *src, float *dst, int64_t n);
    void (*f32_to_f16)(const float *src, uint16_t *dst, int64_t n);
    /* int8 codes times their group's scale (scale[i / HKV_SKETCH_GROUP]) to
     * fp16, n a multiple of HKV_SKETCH_GROUP: the 8-bit far tier's rows as
     * the fp16 kernels read them (index/far_rows.h). The product is formed
     * in fp32 and rounded once, so every level gives the same bits. */
    void (*q8_to_f16)(const int8_t *c, const float *scale, int64_t n, uint16_t *dst);
    /* attn_sparse over 8-bit rows (rows idx[0..n), or 0..n-1 when idx is
     * NULL): K and V codes with stride ld, scales ks / vs d / HKV_SKETCH_GROUP
     * a row; each element read as fp16(code x scale), q8_to_f16's value, in
     * the vector tile without a staging copy (d <= 256, as the tier takes). */
    void (*attn_q8)(const float *q, int g, int d, const int8_t *k, const float *ks,
                    const int8_t *v, const float *vs, int64_t ld, const int32_t *idx, int64_t n,
                    float scale, float *out, float *lse);

    /* y[i] = exp(x[i]), the exp the attention kernels use. Vector levels:
     * within 2 ulp of expf on [-87.33, 88.37], larger inputs clamp to
     * exp(88.37), smaller ones (and -inf) give exactly 0. Scalar: expf. */
    void (*exp)(const float *x, float *y, int64_t n);
} hkv_cpu_kernels;

/* Codes per scale of the int8 key sketches (score_max_i8). */
#define HKV_SKETCH_GROUP 32

/* The prefill's causal attention at the table's precision. */
#define hkv_attn_causal_for(t) \
    ((t)->precision == HKV_PREC_FAST && (t)->attn_causal_fast ? (t)->attn_causal_fast : (t)->attn_causal)

#define HKV_GEMV_MAX_N 8

enum hkv_precision { HKV_PREC_EXACT = 0, HKV_PREC_FAST = 1 };

/* Set t->precision; FAST only where the table has qgemm (AVX2, or
 * AVX-512 with VNNI), else EXACT. Returns the precision in effect. */
int hkv_cpu_kernels_set_precision(hkv_cpu_kernels *t, int precision);
/* FAST products on AMX tiles (on = 1, init's choice where AMX-INT8 is
 * granted) or on vpdpbusd alone (0, for A/B timings): the same results.
 * Returns t->amx. */
int hkv_cpu_kernels_set_amx(hkv_cpu_kernels *t, int on);
const char *hkv_precision_name(int precision);
/* "exact" | "fast"; -1 if unknown. */
int hkv_precision_parse(const char *s);

/* Fill the table for isa (clamped to what this CPU supports: asking for
 * AVX-512 on an AVX2 machine gives AVX2). Returns the level used. */
int hkv_cpu_kernels_init(hkv_cpu_kernels *t, int isa);

/* ---- ISA-independent pieces --------------------------------------------- */

/* Exact merge of two partials over disjoint key sets, in place into a:
 * h heads of d. lse = -inf marks an empty partial. */
void hkv_attn_merge(float *out_a, float *lse_a, const float *out_b, const float *lse_b,
                    int h, int d);

/* Indices of the k largest of s[0..n) into idx (unordered); returns
 * min(k, n). Ties broken towards the lower index. scratch holds
 * HKV_TOPK_SCRATCH(n) int32 (n 8-byte ranks, aligned inside it). */
#define HKV_TOPK_SCRATCH(n) (2 * (int64_t)(n) + 2)
int64_t hkv_topk(const float *s, int64_t n, int64_t k, int32_t *idx, int32_t *scratch);
/* The same set, its indices ascending, by radix select (faster; cpu/topk.c);
 * scratch holds n int32. */
int64_t hkv_topk_asc(const float *s, int64_t n, int64_t k, int32_t *idx, int32_t *scratch);

/* Matrix product y[n][rows] = x[n][cols] W^T, parallel over rows (OpenMP).
 * Small n runs the table's gemv; large n dequantises row panels into ws and
 * calls oneDNN's sgemm. With t->precision FAST and Q4/Q8 weights, every n
 * runs qgemm instead: the activations quantised into ws (64 rows at a
 * time), the rows of W split evenly over the threads. ws must hold
 * hkv_matmul_ws_floats(w) floats (NULL is fine for n <= HKV_GEMV_MAX_N or
 * F32 weights in EXACT precision, never for Q4/Q8 in FAST); the size depends
 * on omp_get_max_threads(), so ask again after changing the thread count.
 * Returns HKV_OK, or HKV_E_INVAL for bad arguments (Q8/Q4 with cols not a
 * multiple of 32, missing ws), HKV_E_INTERNAL if oneDNN fails. */
int hkv_matmul(const hkv_cpu_kernels *t, const hkv_wmat *w, const float *x, int64_t n,
               float *y, float *ws);
size_t hkv_matmul_ws_floats(const hkv_wmat *w);

/* Products of np matrices with the same cols on one x, side by side in y:
 * y[i][off_p + r] = (x[i] . part p's row r), off_p the rows of the parts
 * before p, y rows ldy >= their sum apart (QKV, gate|up). In FAST (every
 * part Q4/Q8) x is quantised once and one parallel region runs all parts'
 * rows; otherwise hkv_matmul per part (ws: hkv_matmul_ws_floats of the
 * largest part) into y directly where one part fills y's rows, else staged
 * through stage (n * the largest part's rows floats). Each output is the
 * bits hkv_matmul gives. */
int hkv_matmul_parts(const hkv_cpu_kernels *t, const hkv_wmat *parts, int np, const float *x,
                     int64_t n, float *y, int64_t ldy, float *ws, float *stage);

/* Memory-bandwidth probe: read-only streaming over a buffer of `bytes` with
 * all OpenMP threads, best of `reps`. Returns bytes/second, or 0 on failure. */
double hkv_bandwidth_probe(size_t bytes, int reps);

/* Gather probe: the far tier's read pattern, rows of row_bytes at random
 * positions taken in ascending order (a rerank's candidates, one in eight
 * rows), each prefetched 64 rows ahead into L2 as the kernels do, over a
 * buffer of `bytes` on all OpenMP threads, best of `reps`. Returns the rows'
 * bytes/second, or 0 on failure: the ceiling of a step whose reads are
 * gathers, which a stream probe overstates (no thread keeps as many misses
 * in flight for scattered rows as for one stream). */
double hkv_gather_probe(size_t bytes, int row_bytes, int reps);

#endif
