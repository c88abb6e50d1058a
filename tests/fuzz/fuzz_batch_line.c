/* Fuzz target: one OpenAI batch request line through hkv_batch_parse
 * (tools/batch/batch_io.c), tokenised by the byte-level BPE tokenizer of
 * fuzz_common.h (SmolLM2's with HKV_FUZZ_TOKENIZER set) or, for one input
 * length in four, the SentencePiece one (a Llama 2 model's prompts), then
 * the result or error line hetkv batch would write for it.
 *
 * Asserts, besides ASan/UBSan/LSan: a refused line has an error message and
 * its custom_id whenever the line is an object with a non-empty string
 * custom_id (batch.h's promise, so the error line can carry it), and its
 * error line is valid JSON carrying both; an accepted line has a custom_id,
 * a non-empty prompt of ids in the vocabulary and sampling fields inside
 * their ranges (fuzz_batch_check.c), and its result line is valid JSON
 * with the custom_id, the tokens and the usage. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_batch_check.h"
#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    hkv_fuzz_tokenizers();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const hkv_fuzz_toks *ft = hkv_fuzz_tokenizers();
    const hkv_tokenizer *tok = ft->t[size % 4 == 3 ? 4 : 0];
    hkv_batch_defaults d = {.max_tokens = 256, .n_ctx = 2048, .stop_at_eog = (int)(size & 1),
                            .streaming = 0};
    hkv_batch_item it;
    memset(&it, 0, sizeof it);
    it.line = 7;
    hkv_err err = {0};
    int rc = hkv_batch_parse((const char *)data, size, tok, &d, &it, &err);
    hkv_fuzz_check_err(rc, &err, "hkv_batch_parse");
    /* the custom_id as the line gives it, read here apart from the parser */
    json_t *root = json_loadb((const char *)data, size, 0, NULL);
    const char *cid = json_string_value(json_object_get(root, "custom_id"));
    if (cid && *cid)
        HKV_FUZZ_CHECK(it.custom_id && !strcmp(it.custom_id, cid), "custom_id '%s' not kept (rc %s)",
                       cid, hkv_status_name(rc));
    if (rc == HKV_OK) {
        HKV_FUZZ_CHECK(it.custom_id && *it.custom_id, "accepted without a custom_id");
        hkv_fuzz_check_item(&it, json_object_get(root, "body"), tok, &d);
        hkv_fuzz_check_result(&it, tok);
    } else {
        hkv_fuzz_check_error_line(&it, err.msg);
    }
    json_decref(root);
    hkv_batch_item_free(&it);
    return 0;
}
