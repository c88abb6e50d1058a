/* Tokenizer from GGUF metadata: byte-level BPE with merges (tokenizer.ggml.model
 * "gpt2": SmolLM2, Llama 3, Qwen2) and SentencePiece-style BPE over scores
 * ("llama": Llama 2, Mistral), special tokens, and chat templates. */
#ifndef HKV_TOKENIZER_H
#define HKV_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "status.h"

typedef struct hkv_tokenizer hkv_tokenizer;

/* Build from the file's tokenizer.ggml.* keys. The tokenizer copies what it
 * needs, so the gguf handle may be closed afterwards. Byte-level BPE needs a
 * known tokenizer.ggml.pre (gpt2/gpt-2/default, smollm/starcoder,
 * llama3/llama-bpe, qwen2; absent means gpt2): any other name, or another
 * tokenizer.ggml.model, is HKV_E_UNSUPPORTED. The tokenizer is read-only
 * once built: one may serve many threads. */
int hkv_tokenizer_load(hkv_tokenizer **out, const hkv_gguf *g, hkv_err *err);
/* The same from a GGUF file, without its weights: what a command reads
 * before the engine loads (to plan for the prompts it will run). */
int hkv_tokenizer_load_file(hkv_tokenizer **out, const char *path, hkv_err *err);
void hkv_tokenizer_free(hkv_tokenizer *t);

int32_t hkv_tokenizer_n_vocab(const hkv_tokenizer *t);
int32_t hkv_tokenizer_bos(const hkv_tokenizer *t);     /* -1 if none */
int32_t hkv_tokenizer_eos(const hkv_tokenizer *t);     /* -1 if none */
int hkv_tokenizer_add_bos(const hkv_tokenizer *t);     /* tokenizer.ggml.add_bos_token (model default) */
/* 1 when generation should stop at tok: eos, eot, eom, and control or
 * user-defined tokens named <|im_end|>, <|eot_id|>, <|eom_id|>, <|end|>,
 * <|endoftext|>, <|end_of_text|>, <end_of_turn>. */
int hkv_tokenizer_is_eog(const hkv_tokenizer *t, int32_t tok);

/* Encode len bytes of UTF-8 text (invalid UTF-8 is kept byte for byte; a
 * byte the vocabulary has no token for (SmolLM2 has none for 0xC0, 0xC1,
 * 0xF1, 0xF2, 0xF5..0xFF and six control bytes) becomes the unknown token, or
 * nothing without one).
 * add_bos: prepend BOS (if the model has one). parse_special: control tokens
 * in the text, like "<|im_start|>", become their ids (longest match first)
 * instead of being split; user-defined tokens (type 4) are matched always, as
 * HF added tokens and sentencepiece user symbols are. SentencePiece models
 * put the "▁" prefix (add_space_prefix) at the start of the text and after
 * each control token, as llama.cpp does. Writes at most cap ids to out and
 * the full count to *n_out; returns HKV_E_RANGE (with *n_out set to the
 * needed count) when cap is short. */
int hkv_tokenize(const hkv_tokenizer *t, const char *text, size_t len, int add_bos,
                 int parse_special, int32_t *out, int64_t cap, int64_t *n_out,
                 hkv_err *err);

/* The bytes of one token as they appear in text (byte-level tokens decoded
 * to raw bytes, SentencePiece "▁" to space, <0xNN> byte tokens to the byte).
 * Control, unknown and unused tokens give their text only when
 * render_special is 1; user-defined tokens always give theirs. Returns the
 * byte count written (may cut a UTF-8 sequence between tokens; the caller
 * concatenates), HKV_E_INVAL for a bad id, HKV_E_RANGE when cap is short. */
int hkv_token_to_piece(const hkv_tokenizer *t, int32_t tok, int render_special,
                       char *buf, size_t cap);

/* Decode a sequence into buf (NUL-terminated); returns bytes written (not
 * counting the NUL), HKV_E_INVAL for a bad id or HKV_E_RANGE when cap is short.
 * SentencePiece models drop the one space the "▁" prefix put at the start, so
 * decode(encode(x)) == x. */
int64_t hkv_detokenize(const hkv_tokenizer *t, const int32_t *toks, int64_t n,
                       int render_special, char *buf, size_t cap);

/* Chat template (copied from the file at load). Recognises the family of the
 * model's tokenizer.chat_template: ChatML (<|im_start|>: SmolLM2, Qwen2),
 * Llama 3 (<|start_header_id|>), Llama 2 (<<SYS>> and [INST]) and Mistral
 * ([INST]); a file without a template gets ChatML. Writes the prompt text
 * for msgs, ending with the assistant turn's opening when add_assistant, into
 * a malloc'd string (caller frees). ChatML templates that print a default
 * system message when the first message is not a system one (SmolLM2) get it
 * here too, its text read from the template; a system message whose content
 * is NULL also asks for that default (and is left out when there is none).
 * The text holds special tokens: tokenize it with parse_special = 1. It never
 * starts with the BOS text, even where the Jinja template prints bos_token:
 * the BOS comes from hkv_tokenize's add_bos (hkv_tokenizer_add_bos), so it is
 * not added twice. An unrecognised template gives HKV_E_UNSUPPORTED. */
typedef struct hkv_chat_msg {
    const char *role;     /* "system", "user", "assistant" */
    const char *content;
} hkv_chat_msg;
int hkv_chat_apply(const hkv_tokenizer *t, const hkv_chat_msg *msgs, int n_msgs,
                   int add_assistant, char **out, hkv_err *err);
/* "chatml", "llama3", "llama2", "mistral", or NULL when hkv_chat_apply would
 * refuse the template. */
const char *hkv_chat_template_family(const hkv_tokenizer *t);

#endif
