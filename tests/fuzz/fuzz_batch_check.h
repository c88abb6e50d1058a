/* Checks shared by fuzz_batch_line and fuzz_batch_body: what a parsed
 * request promises, and that the lines and bodies written for it (results,
 * errors) are valid JSON that carries it. */
#ifndef HKV_FUZZ_BATCH_CHECK_H
#define HKV_FUZZ_BATCH_CHECK_H

#include "batch.h"

/* After hkv_batch_parse / hkv_batch_parse_body returned HKV_OK for body:
 * the item against its ranges and against the body's fields read here. */
void hkv_fuzz_check_item(const hkv_batch_item *it, json_t *body, const hkv_tokenizer *tok,
                         const hkv_batch_defaults *d);
/* Fake the request's output (the prompt's first tokens, their text cut at a
 * token boundary: possibly invalid UTF-8) and check the result line and the
 * completion body written for it. */
void hkv_fuzz_check_result(hkv_batch_item *it, const hkv_tokenizer *tok);
/* The error line for a refused request: valid JSON with its custom_id and
 * the message. */
void hkv_fuzz_check_error_line(const hkv_batch_item *it, const char *msg);
/* s parses as JSON (an object); returns it (caller decrefs). */
json_t *hkv_fuzz_json(const char *s, const char *what);

#endif
