/* Fuzz target: the two writers that put untrusted text (prompts, generated
 * bytes cut at token boundaries, error messages quoting input) into JSON:
 * hkv_json_text with NUL kept (tools/cli/cli_json.c, `--json` output, written
 * as hkv_json_emit writes it) and hkv_json_utf8 (tools/batch/batch_io.c, batch
 * result lines and serve bodies).
 *
 * Asserts, besides ASan/UBSan: both always give valid JSON (jansson reads
 * it back) whose string is the input with every byte that does not start a
 * valid UTF-8 sequence replaced by U+FFFD, one per byte (the reference
 * below is written apart from both); hkv_json_text keeps NUL as \u0000,
 * hkv_json_utf8 replaces it too (jansson refuses \u0000 when it reads its
 * lines back without JSON_ALLOW_NUL, as hkv_batch_scan_output does). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "cli.h"
#include "fuzz_common.h"

/* Length of the valid UTF-8 sequence at s (strict), 0 if none. */
static size_t seq_len(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    size_t k;
    uint32_t cp;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) { k = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { k = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { k = 4; cp = c & 0x07; }
    else return 0;
    if (k > n) return 0;
    for (size_t j = 1; j < k; j++) {
        if ((s[j] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[j] & 0x3F);
    }
    if ((k == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return k;
}

/* The input as the writers must give it back; nul_ok: NUL stays NUL. */
static char *expected(const uint8_t *s, size_t n, int nul_ok, size_t *out_n) {
    char *e = malloc(3 * n + 1);
    if (!e) abort();
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = seq_len(s + i, n - i);
        if (k && (s[i] || nul_ok)) {
            memcpy(e + o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(e + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    *out_n = o;
    return e;
}

static void check_same(const char *json, size_t len, const char *want, size_t want_n, const char *who) {
    json_error_t je;
    json_t *v = json_loadb(json, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    HKV_FUZZ_CHECK(v && json_is_string(v), "%s wrote invalid JSON (%s): %.200s", who, v ? "not a string" : je.text,
                   json);
    HKV_FUZZ_CHECK(json_string_length(v) == want_n && !memcmp(json_string_value(v), want, want_n),
                   "%s: the string read back differs from the input (%zu bytes, want %zu)", who,
                   json_string_length(v), want_n);
    json_decref(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t en;
    char *want = expected(data, size, 1, &en);
    json_t *t = hkv_json_text((const char *)data, size, 1);
    HKV_FUZZ_CHECK(t && json_is_string(t), "hkv_json_text gave no string");
    char *buf = json_dumps(t, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(15));
    HKV_FUZZ_CHECK(buf != NULL, "hkv_json_text's string does not dump");
    check_same(buf, strlen(buf), want, en, "hkv_json_text");
    free(buf);
    json_decref(t);
    free(want);

    want = expected(data, size, 0, &en);
    json_t *j = hkv_json_utf8((const char *)data, size);
    HKV_FUZZ_CHECK(j && json_is_string(j), "hkv_json_utf8 gave no string");
    char *s = json_dumps(j, JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
    HKV_FUZZ_CHECK(s != NULL, "hkv_json_utf8's string does not dump");
    check_same(s, strlen(s), want, en, "hkv_json_utf8");
    free(s);
    json_decref(j);
    free(want);
    return 0;
}
