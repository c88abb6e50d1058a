/* Shared pieces of the libFuzzer harnesses (tests/fuzz, docs/FUZZING.md):
 * checks that abort (so libFuzzer keeps the input), splitting an input into
 * NUL-separated fields, and the tokenizers built once per process.
 *
 * Input formats (tests/fuzz/make_seeds.py writes seeds in them):
 *   fuzz_gguf        the bytes of a GGUF file
 *   fuzz_tokenizer   byte 0: bits 0-2 the tokenizer (index mod hkv_fuzz_toks.n),
 *                    bit 3 add_bos, bit 4 parse_special, bit 5 ids mode; then
 *                    the text, or in ids mode little-endian int32 token ids;
 *                    bit 6: the input's own vocabulary (fuzz_tokenizer.c)
 *   fuzz_chat        byte 0: bits 0-2 the template (fuzz_chat.c), bit 3
 *                    add_assistant, bit 4 an empty system content means NULL;
 *                    then NUL-separated fields: [template,] role, content, ...
 *   fuzz_args        byte 0: the parser (fuzz_args.c); then NUL-separated strings
 *   fuzz_batch_line  one JSONL request line
 *   fuzz_batch_body  one request body (JSON)
 *   fuzz_json_text   raw bytes */
#ifndef HKV_FUZZ_COMMON_H
#define HKV_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "tokenizer.h"

/* A broken promise: print it and abort, which libFuzzer reports as a crash. */
#define HKV_FUZZ_CHECK(cond, ...)                                                   \
    do {                                                                           \
        if (!(cond)) hkv_fuzz_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);        \
    } while (0)
_Noreturn void hkv_fuzz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Every failure must name its problem: rc < 0 with a message, or HKV_OK. */
void hkv_fuzz_check_err(int rc, const hkv_err *err, const char *what);

/* The input split at NUL bytes into at most max fields, each a malloc'd
 * NUL-terminated copy (the input itself is not NUL-terminated). */
typedef struct hkv_fuzz_fields {
    char **s;
    size_t *len;
    int n;
} hkv_fuzz_fields;
void hkv_fuzz_split(const uint8_t *data, size_t size, int max, hkv_fuzz_fields *f);
void hkv_fuzz_fields_free(hkv_fuzz_fields *f);

/* The tokenizers, built once: [0] byte-level BPE from $HKV_FUZZ_TOKENIZER
 * (e.g. models/SmolLM2-135M-Instruct.Q4_1.gguf) or tests/fuzz/data/tok_bpe.gguf
 * as the file says, [1..3] the same vocabulary under the gpt2, llama3 and
 * qwen2 pre-tokenizers, [4] SentencePiece from tests/fuzz/data/tok_spm.gguf.
 * Exits the process when a file is missing or does not load. */
#define HKV_FUZZ_NTOK 5
typedef struct hkv_fuzz_toks {
    hkv_tokenizer *t[HKV_FUZZ_NTOK];
    const char *name[HKV_FUZZ_NTOK];
    int spm[HKV_FUZZ_NTOK];      /* 1: SentencePiece */
    int n;
} hkv_fuzz_toks;
const hkv_fuzz_toks *hkv_fuzz_tokenizers(void);

/* A whole file (the seed models); exits on failure. */
uint8_t *hkv_fuzz_read_file(const char *path, size_t *len);

#endif
