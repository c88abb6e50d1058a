/* The weight GEMM path's panels (gpu/qmat.cu): how many weight rows are
 * dequantised into the workspace per cuBLAS call, in one place for the
 * kernel, the per-kernel predictions (plan/gpu_kernel_predict.c) and the
 * memory plan (plan/gpu_plan.c). Plain C: included by nvcc and the host.
 *
 * Why 32 MiB: each panel is one cuBLAS GEMM of panel rows x n activation
 * rows, run one after another on the stream. With 4 MiB (256 rows at 4096
 * columns) an H100 ran Llama-3-8B's gate+up (28672 x 4096) as 112 GEMMs of
 * 256 x n output, a few 128 x 128 tiles each on a 132-SM card: 64 and 512
 * activation rows took about the same time (1.24 vs 1.51 ms in fp16, 2.29
 * vs 2.74 ms split; bench kernels --device cuda, 2026-11-26,
 * docs/GPU_MEASURED.md), the mark of a fixed per-panel cost. 2,048 rows at
 * 4096 columns give 16 x 4 tiles at n = 512 and 14 panels; a panel no longer
 * fits half an H100's L2, which costs one more write and read of it (about
 * 0.3 ms for gate+up at 3 TB/s, predicted) against GEMMs filling the card. */
#ifndef HKV_QMAT_PANEL_H
#define HKV_QMAT_PANEL_H

#include <stdint.h>

#define HKV_QMAT_PANEL_BYTES ((int64_t)32 << 20)   /* panel target: 4 bytes a weight */
/* ... but at least this many rows (or the whole matrix). A wide matrix's
 * 32 MiB are few rows: Llama-3-8B's down projection (4096 x 14336) was 7
 * panels of 585 rows, each GEMM of 585 x 512 outputs 20 tiles of 128 x 128
 * on a 132-SM card, and it ran at a quarter of gate+up's rate (60 TFLOP/s
 * fp16, 23 split at 512 rows; H100, docs/GPU_MEASURED.md). 2,048 rows give
 * it gate+up's tile count; its panel is then 117 MB, beyond the L2 (one more
 * write and read of the matrix a call, ~0.15 ms on an H100: PREDICTION). */
#define HKV_QMAT_PANEL_MIN_ROWS 2048
/* split/fp16 GEMMs: activation rows a chunk. Each chunk is one GEMM per panel
 * (its tiles: panel rows / 128 x chunk rows / 128) and dequantises every
 * panel again: 2,048 (a streamed prompt's chunk, hetkv run's default at 16K
 * and more) gives 4x the tiles of 512 and a quarter of the dequantisation
 * passes, for 2,048 x cols x 4 bytes of split activations (117 MB at
 * 14,336 columns). */
#define HKV_QMAT_XCHUNK 2048
#define HKV_QMAT_GEMV_MAX_ROWS 8                   /* calls of up to this many rows: the GEMV, no panel */
/* Products of up to this many rows (decode batches) run as GEMVs of 8 rows
 * each: measured on an H100 (2026-11-26), the Q4 GEMV did gate+up
 * (28672 x 4096) for 8 rows in 0.114 ms, the panel GEMM path 1.2-2.3 ms for
 * 64 rows with 4 MiB panels; with 32 MiB panels it is predicted at 0.47 ms
 * for 16 rows (plan --predict h100 --kernels), so 4 GEMVs (0.46 ms) break
 * even at 32 rows. Not yet measured with 32 MiB panels. */
#define HKV_QMAT_GEMV_CHUNKED_ROWS 32
#define HKV_QMAT_ALIGN 256                         /* workspace parts start on this (cuBLAS operands) */

/* Weight rows per panel of a rows x cols matrix. */
static inline int64_t hkv_qmat_panel_rows(int64_t rows, int64_t cols)
{
    int64_t pr = cols > 0 ? HKV_QMAT_PANEL_BYTES / (cols * 4) : rows;
    if (pr < HKV_QMAT_PANEL_MIN_ROWS) pr = HKV_QMAT_PANEL_MIN_ROWS;
    return pr > rows ? rows : pr;
}

#endif
