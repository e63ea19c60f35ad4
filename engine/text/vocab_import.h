// Writing a tokenizer into a GGUF: from a Hugging Face tokenizer.json (byte-level BPE), from another
// GGUF's tokenizer.* keys, or generated (a small byte-level BPE vocabulary needing no files).
#pragma once
#include <string>

#include "engine/gguf/gguf.h"
#include "engine/base/status.h"

namespace towers {

struct HfVocabOptions {
  std::string pre = "llama-bpe";  // tokenizer.ggml.pre to record
  int pad_to = 0;                 // append unused "[PAD<i>]" tokens up to this size (0 = none)
  std::string chat_template;      // tokenizer.chat_template to record, if not empty
};

// Reads tokenizer.json (model.type BPE) and sets tokenizer.ggml.* keys on w. Returns the vocab size.
Result<int> add_hf_bpe_tokenizer(GgufWriter& w, const std::string& tokenizer_json_path,
                                 const HfVocabOptions& options);
// Copies every tokenizer.* key of src (e.g. a vocab-only GGUF). Returns the vocab size.
Result<int> copy_gguf_tokenizer(GgufWriter& w, const GgufFile& src);
// A self-contained byte-level BPE vocabulary of exactly n_vocab >= 300 tokens: 256 byte tokens,
// <|begin_of_text|>, <|end_of_text|>, <|eot_id|>, and merges of frequent English letter pairs.
// GPT-2's byte-level alphabet: each byte's printable code point, UTF-8 encoded (byte-level BPE
// vocabularies spell their tokens in it).
std::vector<std::string> byte_level_alphabet();

void add_generated_bpe_tokenizer(GgufWriter& w, int n_vocab, const std::string& chat_template);

}  // namespace towers
