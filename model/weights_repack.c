/* Repacking GGUF tensors into the host kernels' weight formats (cpu/kernels.h).
 *
 * Exact where the kernel format can hold the GGUF values: F32, F16, Q8_0 (Q8),
 * Q4_0 and Q4_1 (Q4). Q4_K becomes Q4 with each 32-element sub-block's scale
 * and min (d*sc, dmin*m) rounded to fp16. Every other dequantisable type goes
 * to F16. `approx` tells the caller when a repack rounded. */
#include <stdlib.h>
#include <string.h>

#include "ggml_types.h"
#include "host_mem.h"
#include "model.h"

static size_t wmat_q_bytes(int type, int64_t rows, int64_t cols) {
    switch (type) {
    case HKV_W_F32: return (size_t)rows * cols * 4;
    case HKV_W_F16: return (size_t)rows * cols * 2;
    case HKV_W_Q8: return (size_t)rows * cols;
    case HKV_W_Q4: return (size_t)rows * cols / 2;
    }
    return 0;
}

static int wmat_alloc(hkv_wmat *w, int type, int64_t rows, int64_t cols, hkv_err *err) {
    memset(w, 0, sizeof *w);
    w->type = type;
    w->rows = rows;
    w->cols = cols;
    if ((type == HKV_W_Q8 || type == HKV_W_Q4) && cols % HKV_WBLOCK)
        return hkv_seterr(err, HKV_E_FORMAT, "matrix with %lld columns cannot be blocked by %d",
                          (long long)cols, HKV_WBLOCK);
    w->q = hkv_host_alloc(NULL, HKV_TIER_WEIGHTS, wmat_q_bytes(type, rows, cols), err);
    if (!w->q) return HKV_E_NOMEM;
    size_t nsc = (size_t)rows * (cols / HKV_WBLOCK) * sizeof(uint16_t);
    if (type == HKV_W_Q8 || type == HKV_W_Q4) {
        w->scale = hkv_host_alloc(NULL, HKV_TIER_WEIGHTS, nsc, err);
        if (!w->scale) goto fail;
    }
    if (type == HKV_W_Q4) {
        w->min = hkv_host_alloc(NULL, HKV_TIER_WEIGHTS, nsc, err);
        if (!w->min) goto fail;
    }
    return HKV_OK;
fail:
    hkv_wmat_free(w);
    return HKV_E_NOMEM;
}

int hkv_wmat_type_for_gguf(int ggml_type) {
    switch (ggml_type) {
    case HKV_GGML_F32: return HKV_W_F32;
    case HKV_GGML_F16: return HKV_W_F16;
    case HKV_GGML_Q8_0: return HKV_W_Q8;
    case HKV_GGML_Q4_0:
    case HKV_GGML_Q4_1:
    case HKV_GGML_Q4_K: return HKV_W_Q4;
    case HKV_GGML_BF16: return HKV_W_F32;
    default: return HKV_W_F16;
    }
}

uint64_t hkv_model_repacked_bytes(const hkv_gguf *g) {
    uint64_t total = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const hkv_gguf_tensor *t = &g->tensors[i];
        int64_t rows = 1, cols = t->ne[0];
        for (int d = 1; d < t->n_dims; d++) rows *= t->ne[d];
        if (t->n_dims < 2 || rows == 1) {   /* norms, biases: fp32 */
            total += (uint64_t)cols * 4;
            continue;
        }
        hkv_wmat w = {.type = hkv_wmat_type_for_gguf(t->type), .rows = rows, .cols = cols};
        total += hkv_wmat_bytes(&w);
    }
    return total;
}

void hkv_wmat_free(hkv_wmat *w) {
    if (!w) return;
    free(w->q);
    free(w->scale);
    free(w->min);
    memset(w, 0, sizeof *w);
}

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* Q4_K sub-block j (0..7) scale and min, 6 bits each, packed in 12 bytes. */
static void q4k_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void repack_q4_row(int type, const uint8_t *src, int64_t cols, uint8_t *q, uint16_t *sc,
                          uint16_t *mn) {
    int64_t nb = cols / 32;
    if (type == HKV_GGML_Q4_0 || type == HKV_GGML_Q4_1) {
        int bsz = type == HKV_GGML_Q4_0 ? 18 : 20;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = src + b * bsz;
            uint16_t d = rd16(blk);
            sc[b] = d;
            /* Q4_0 is d*(q-8) = d*q + (-8d); -8d is exact in fp16 (power of two). */
            mn[b] = type == HKV_GGML_Q4_1 ? rd16(blk + 2)
                                          : hkv_f32_to_fp16(-8.0f * hkv_fp16_to_f32(d));
            memcpy(q + b * 16, blk + (bsz - 16), 16);
        }
        return;
    }
    /* Q4_K: super-blocks of 256 = 8 sub-blocks of 32. In each 32-byte chunk the
     * low nibbles are sub-block 2c and the high nibbles sub-block 2c+1; our
     * format wants byte j = elem j | elem j+16 << 4 within each sub-block. */
    for (int64_t s = 0; s < cols / 256; s++) {
        const uint8_t *blk = src + s * 144;
        float d = hkv_fp16_to_f32(rd16(blk)), dmin = hkv_fp16_to_f32(rd16(blk + 2));
        const uint8_t *scales = blk + 4, *qs = blk + 16;
        for (int sb = 0; sb < 8; sb++) {
            int scv, mv;
            q4k_scale_min(sb, scales, &scv, &mv);
            int64_t b = s * 8 + sb;
            sc[b] = hkv_f32_to_fp16(d * (float)scv);
            mn[b] = hkv_f32_to_fp16(-dmin * (float)mv);
            const uint8_t *chunk = qs + (sb / 2) * 32;
            int shift = (sb & 1) * 4;
            for (int j = 0; j < 16; j++) {
                uint8_t lo = (chunk[j] >> shift) & 0xF, hi = (chunk[j + 16] >> shift) & 0xF;
                q[b * 16 + j] = (uint8_t)(lo | hi << 4);
            }
        }
    }
}

int hkv_wmat_from_gguf(hkv_wmat *w, const hkv_gguf_tensor *t, int *approx, hkv_err *err) {
    memset(w, 0, sizeof *w);
    *approx = 0;
    if (t->n_dims > 2 || t->ne[2] != 1 || t->ne[3] != 1)
        return hkv_seterr(err, HKV_E_FORMAT, "tensor '%.*s' is not a matrix", (int)t->name.len,
                          t->name.ptr);
    int64_t cols = t->ne[0], rows = t->ne[1];
    size_t srow = hkv_ggml_row_bytes(t->type, cols);
    hkv_ggml_type_info ti = hkv_ggml_type_get(t->type);
    if (!srow || !ti.name)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "tensor '%.*s' has unusable type %d",
                          (int)t->name.len, t->name.ptr, t->type);
    const uint8_t *src = t->data;
    int rc;
    switch (t->type) {
    case HKV_GGML_F32:
    case HKV_GGML_F16:
        if ((rc = wmat_alloc(w, t->type == HKV_GGML_F32 ? HKV_W_F32 : HKV_W_F16, rows, cols, err)))
            return rc;
        memcpy(w->q, src, srow * rows);
        return HKV_OK;
    case HKV_GGML_Q8_0:
        if ((rc = wmat_alloc(w, HKV_W_Q8, rows, cols, err))) return rc;
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *row = src + r * srow;
            for (int64_t b = 0; b < cols / 32; b++) {
                w->scale[r * (cols / 32) + b] = rd16(row + b * 34);
                memcpy((int8_t *)w->q + r * cols + b * 32, row + b * 34 + 2, 32);
            }
        }
        return HKV_OK;
    case HKV_GGML_Q4_0:
    case HKV_GGML_Q4_1:
    case HKV_GGML_Q4_K:
        if ((rc = wmat_alloc(w, HKV_W_Q4, rows, cols, err))) return rc;
        for (int64_t r = 0; r < rows; r++)
            repack_q4_row(t->type, src + r * srow, cols, (uint8_t *)w->q + r * cols / 2,
                          w->scale + r * (cols / 32), w->min + r * (cols / 32));
        *approx = t->type == HKV_GGML_Q4_K;
        return HKV_OK;
    default:
        break;
    }
    if (!ti.can_dequant)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "tensor '%.*s': type %s cannot be dequantised",
                          (int)t->name.len, t->name.ptr, ti.name);
    /* BF16 is exact in F32; the rest round to F16. */
    int dst = t->type == HKV_GGML_BF16 ? HKV_W_F32 : HKV_W_F16;
    if ((rc = wmat_alloc(w, dst, rows, cols, err))) return rc;
    float *tmp = malloc((size_t)cols * sizeof(float));
    if (!tmp) {
        hkv_wmat_free(w);
        return hkv_seterr(err, HKV_E_NOMEM, "no memory for a %lld-float row", (long long)cols);
    }
    for (int64_t r = 0; r < rows; r++) {
        if ((rc = hkv_ggml_dequant_row(t->type, src + r * srow, tmp, cols))) {
            free(tmp);
            hkv_wmat_free(w);
            return hkv_seterr(err, rc, "tensor '%.*s': dequantisation failed", (int)t->name.len,
                              t->name.ptr);
        }
        if (dst == HKV_W_F32)
            memcpy((float *)w->q + r * cols, tmp, (size_t)cols * 4);
        else
            for (int64_t c = 0; c < cols; c++)
                ((uint16_t *)w->q)[r * cols + c] = hkv_f32_to_fp16(tmp[c]);
    }
    free(tmp);
    *approx = dst == HKV_W_F16;
    return HKV_OK;
}

int hkv_wmat_concat(hkv_wmat *out, const hkv_wmat *parts, int n, hkv_err *err) {
    int64_t rows = 0, cols = parts[0].cols;
    for (int i = 0; i < n; i++) {
        if (parts[i].type != parts[0].type || parts[i].cols != cols)
            return hkv_seterr(err, HKV_E_INVAL, "cannot stack matrices of different types or widths");
        rows += parts[i].rows;
    }
    int rc = wmat_alloc(out, parts[0].type, rows, cols, err);
    if (rc) return rc;
    size_t qoff = 0, soff = 0;
    for (int i = 0; i < n; i++) {
        size_t qb = wmat_q_bytes(parts[i].type, parts[i].rows, cols);
        memcpy((uint8_t *)out->q + qoff, parts[i].q, qb);
        qoff += qb;
        size_t nsc = (size_t)parts[i].rows * (cols / HKV_WBLOCK);
        if (out->scale) memcpy(out->scale + soff, parts[i].scale, nsc * 2);
        if (out->min) memcpy(out->min + soff, parts[i].min, nsc * 2);
        soff += nsc;
    }
    return HKV_OK;
}
