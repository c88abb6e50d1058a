/* Checker for dequant_ref.py: hkv_ggml_dequant_row and the half/bf16
 * conversions against gguf-py's numpy results, read from DIR.
 *
 * Exact (bitwise) equality is expected everywhere: ggml's formulas need only
 * int->float conversions and one or two float multiplies/adds per element,
 * evaluated in the same order by both sides, and this build does not fuse
 * multiply-adds. The one exception is NaN: numpy may convert halves with the
 * CPU's F16C instructions, which quiet a signalling NaN, while we keep the
 * bits; so a NaN only has to come back as a NaN of the same sign. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_types.h"
#include "status.h"

static void *slurp(const char *dir, const char *name, size_t *size) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(n > 0 ? (size_t)n : 1);
    if (p && n > 0 && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *size = n > 0 ? (size_t)n : 0;
    return p;
}

static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* 1 when got matches want under the rule in the file comment. */
static int same(float got, float want) {
    if (isnan(want)) return isnan(got) && signbit(got) == signbit(want);
    return bits(got) == bits(want);
}

static int check_floats(const char *what, const float *got, const float *want, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (same(got[i], want[i])) continue;
        if (bad++ < 5)
            fprintf(stderr, "  %s[%zu]: got %.9g (0x%08x), want %.9g (0x%08x)\n", what, i,
                    got[i], bits(got[i]), want[i], bits(want[i]));
    }
    if (bad) fprintf(stderr, "FAIL %s: %zu of %zu values differ\n", what, bad, n);
    else printf("ok   %s: %zu values bit-identical\n", what, n);
    return bad != 0;
}

static int check_type(const char *dir, const char *name, int type, size_t n) {
    char fq[64], ff[64];
    snprintf(fq, sizeof fq, "%s.q", name);
    snprintf(ff, sizeof ff, "%s.f32", name);
    size_t nq = 0, nf = 0;
    uint8_t *q = slurp(dir, fq, &nq);
    float *want = slurp(dir, ff, &nf);
    float *got = malloc(n * sizeof *got + 1);
    int fail = 1;
    if (!q || !want || !got) goto out;
    if (nf != n * 4 || nq != hkv_ggml_row_bytes(type, (int64_t)n)) {
        fprintf(stderr, "FAIL %s: file sizes %zu/%zu do not match %zu elements\n", name, nq, nf, n);
        goto out;
    }
    for (size_t i = 0; i < n; i++) got[i] = NAN; /* poison */
    /* dequantise in rows of varying length to cover the row loop */
    hkv_ggml_type_info ti = hkv_ggml_type_get(type);
    size_t done = 0, row_blocks = 1;
    while (done < n) {
        size_t m = row_blocks * (size_t)ti.block_size;
        if (m > n - done) m = n - done;
        size_t off = done / (size_t)ti.block_size * (size_t)ti.type_size;
        int rc = hkv_ggml_dequant_row(type, q + off, got + done, (int64_t)m);
        if (rc != HKV_OK) {
            fprintf(stderr, "FAIL %s: dequant_row returned %s\n", name, hkv_status_name(rc));
            goto out;
        }
        done += m;
        row_blocks = row_blocks % 7 + 1;
    }
    fail = check_floats(name, got, want, n);
out:
    free(q);
    free(want);
    free(got);
    return fail;
}

static int check_conversions(const char *dir) {
    int fail = 0;
    size_t n = 0, nin = 0, n16 = 0, nbf = 0;
    float *all = slurp(dir, "fp16_all.f32", &n);
    if (!all || n != 65536 * 4) {
        free(all);
        fprintf(stderr, "FAIL fp16_all.f32 missing or short\n");
        return 1;
    }
    float *got = malloc(65536 * sizeof *got);
    if (!got) return 1;
    for (uint32_t h = 0; h < 65536; h++) got[h] = hkv_fp16_to_f32((uint16_t)h);
    fail |= check_floats("fp16_to_f32 (all 65536)", got, all, 65536);
    free(got);
    free(all);

    uint32_t *in = slurp(dir, "f32_conv.in", &nin);
    uint16_t *w16 = slurp(dir, "f32_to_fp16.out", &n16);
    uint16_t *wbf = slurp(dir, "f32_to_bf16.out", &nbf);
    size_t cnt = nin / 4, bad16 = 0, badbf = 0;
    if (!in || !w16 || !wbf || n16 != cnt * 2 || nbf != cnt * 2) {
        fprintf(stderr, "FAIL conversion files missing or inconsistent\n");
        fail = 1;
        cnt = 0;
    }
    for (size_t i = 0; i < cnt; i++) {
        float f;
        memcpy(&f, &in[i], 4);
        uint16_t h = hkv_f32_to_fp16(f), b = hkv_f32_to_bf16(f);
        /* NaN: see the file comment; also our NaNs are always quiet */
        int ok16 = isnan(f) ? (h & 0x7e00u) == 0x7e00u && (h >> 15) == (in[i] >> 31) : h == w16[i];
        if (!ok16 && bad16++ < 5)
            fprintf(stderr, "  f32_to_fp16(0x%08x) = 0x%04x, want 0x%04x\n", in[i], h, w16[i]);
        if (b != wbf[i] && badbf++ < 5)
            fprintf(stderr, "  f32_to_bf16(0x%08x) = 0x%04x, want 0x%04x\n", in[i], b, wbf[i]);
    }
    if (cnt) {
        printf("%s f32_to_fp16: %zu of %zu differ\n", bad16 ? "FAIL" : "ok  ", bad16, cnt);
        printf("%s f32_to_bf16: %zu of %zu differ\n", badbf ? "FAIL" : "ok  ", badbf, cnt);
    }
    free(in);
    free(w16);
    free(wbf);
    return fail || bad16 || badbf;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR (data written by dequant_ref.py)\n", argv[0]);
        return 2;
    }
    size_t n = 0;
    char *man = slurp(argv[1], "manifest.txt", &n);
    if (!man) return 1;
    char *text = realloc(man, n + 1);
    if (!text) return 1;
    text[n] = '\0';
    int fail = 0, seen[HKV_GGML_TYPE_LIMIT] = {0};
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char name[32];
        int type;
        unsigned long long cnt;
        if (sscanf(line, "%31s %d %llu", name, &type, &cnt) != 3 || type < 0 ||
            type >= HKV_GGML_TYPE_LIMIT) {
            fprintf(stderr, "bad manifest line: %s\n", line);
            fail = 1;
            continue;
        }
        seen[type] = 1;
        fail |= check_type(argv[1], name, type, (size_t)cnt);
    }
    free(text);
    /* every type we claim to dequantise must have been compared */
    for (int t = 0; t < HKV_GGML_TYPE_LIMIT; t++) {
        hkv_ggml_type_info ti = hkv_ggml_type_get(t);
        if (ti.name && ti.can_dequant && !seen[t]) {
            fprintf(stderr, "FAIL %s: can_dequant but no reference data\n", ti.name);
            fail = 1;
        }
    }
    fail |= check_conversions(argv[1]);
    return fail ? 1 : 0;
}
