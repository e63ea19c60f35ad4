// Byte-level BPE pre-tokenizers: how a text is cut into words before BPE merges, chosen by the GGUF's
// tokenizer.ggml.pre. One table (pretokenizer.cc) maps each name to its split rules: a list of regexes
// applied in order, as llama.cpp's llm_tokenizer_bpe lists them; each regex splits every word the
// previous ones left into its matches and the text between them (also words), so the words always
// concatenate to the input. Matching runs on each word alone (lookarounds and `$` see only that word).
//
// Regexes are PCRE2 with Unicode properties; llama.cpp runs the same expressions through std::regex on
// a text whose non-ASCII characters are collapsed to their category, which gives the same words. The
// exception is `tekken`: llama.cpp adapts Hugging Face's case-aware regex to ASCII case; we run
// Hugging Face's own (\p{Lu}, \p{Ll}, \p{M}), which agrees on ASCII and also splits non-ASCII case
// changes and keeps combining marks with their letter, as Mistral's tokenizer does.
// Bytes that are not valid UTF-8 never match and so end up in words of their own.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/base/status.h"

namespace towers {

class PreTokenizer {
 public:
  struct Word {
    size_t offset, length;  // bytes of the text
  };

  // The rules of tokenizer.ggml.pre `name` (or an alias). Unknown names: an error naming it and
  // listing the supported ones.
  static Result<PreTokenizer> create(std::string_view name);
  // "llama-bpe (aliases llama3, llama-v3, falcon3), qwen2 (aliases ...), ..." for messages and docs.
  static std::string supported_names();

  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  std::string_view name() const;  // canonical name of the rules
  // Whether a word that is itself a vocab token skips merging (llama3 and tekken vocabs: their merges
  // do not rebuild every token).
  bool ignore_merges() const;
  // Whether BOS is added when tokenizer.ggml.add_bos_token does not say (llama.cpp: llama3, tekken).
  bool bos_by_default() const;

  // The words of text, in order, covering it exactly. Thread-safe.
  std::vector<Word> split(std::string_view text) const;

 private:
  struct Impl;
  explicit PreTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace towers
