// Tokenizers read from GGUF metadata (llama.cpp's tokenizer.ggml.* keys), reproducing llama.cpp's ids:
//   - "llama": SentencePiece (BPE by piece score, llama.cpp's llm_tokenizer_spm): dummy "▁" prefix,
//     spaces → "▁", bigrams merged by highest score, byte fallback to <0xXX> tokens (then <unk>).
//   - "gpt2": byte-level BPE (GPT-2 bytes→unicode mapping), the words of the pre-tokenizer
//     tokenizer.ggml.pre names (engine/text/pretokenizer.h: llama-bpe, qwen2/qwen3, gpt-2, starcoder,
//     smollm, command-r, deepseek-llm, deepseek-coder, falcon, mpt, refact, tekken, ...), then merges by
//     rank. A missing pre is taken as llama-bpe (and kind() says so).
// Control/user-defined/unknown token texts are split out of the input before tokenizing (longest
// token first, like llama.cpp): user-defined ones always, control/unknown ones only with parse_special.
// Phi-3 vocabs (general.name "phi-3"/"phi3", or SentencePiece of architecture phi3): a special token
// also takes the whitespace after it (llama.cpp's rstrip; not <unk>, <s>, <|endoftext|>).
//
// Loading validates everything (array types and lengths, token types, ids in range, duplicate tokens,
// merges) and returns a Status naming the key; encode/decode never crash, whatever the bytes.
// Encoding is const and thread-safe.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/gguf/gguf.h"
#include "engine/base/status.h"

namespace towers {

// tokenizer.ggml.token_type values.
enum class TokenType : uint8_t {
  Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

class Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const GgufFile& file);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // add_bos: prepend BOS if the vocab has one (callers normally pass add_bos_default()).
  // parse_special: recognise control/unknown token texts (e.g. "<|eot_id|>") in text; user-defined
  // token texts are always recognised (llama.cpp and Hugging Face do the same).
  // Never appends EOS (add_eos_default() is exposed for callers that want it).
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const;

  // The bytes this token stands for: "▁" → space (SPM), byte-level chars → raw bytes (BPE),
  // <0xAB> → that byte. Control and unknown tokens give "" unless special is set (then their text);
  // user-defined tokens give their text; unused/undefined tokens give "". Out-of-range ids give "".
  // May be an incomplete UTF-8 sequence (byte tokens); use Detokenizer for text.
  std::string token_to_piece(int32_t id, bool special = false) const;
  std::string_view token_text(int32_t id) const;  // raw vocab string ("" when out of range)
  TokenType token_type(int32_t id) const;          // Undefined when out of range
  float token_score(int32_t id) const;             // 0 when out of range or no scores
  int32_t token_id(std::string_view text) const;   // exact vocab lookup, -1 when absent

  int32_t n_vocab() const;
  // -1 when absent. SPM vocabs without the keys default to llama.cpp's 1/2/0 when those slots hold
  // <s>, </s>, <unk>. eot: when tokenizer.ggml.eot_token_id is absent, the first present of
  // <|eot_id|>, <|im_end|>, <end_of_turn>, <|end|>, <EOT>, <｜end▁of▁sentence｜>, <|endoftext|>,
  // <|end_of_text|> other than eos.
  int32_t bos() const;
  int32_t eos() const;
  int32_t eot() const;
  int32_t eom() const;
  int32_t unk() const;
  int32_t pad() const;
  // eos, eot, eom, and tokens with llama.cpp's end-of-generation texts (<|eot_id|>, <|im_end|>,
  // <|endoftext|>, <|end_of_text|>, <|eom_id|>, <end_of_turn>, <|end|>, ...).
  bool is_end_of_generation(int32_t id) const;
  bool add_bos_default() const;  // tokenizer.ggml.add_bos_token, default: SPM and llama-bpe true, qwen2 false
  bool add_eos_default() const;
  bool is_spm() const;
  // Whether Detokenizer drops the leading space of a text's first non-empty piece (SentencePiece with
  // add_space_prefix).
  bool strips_leading_space() const;
  // "llama (SentencePiece)", "gpt2 (byte-level BPE, pre=llama-bpe)", ...
  std::string_view kind() const;
  std::string_view chat_template() const;  // tokenizer.chat_template, "" when absent

  // Whole-sequence decode, same rules as Detokenizer fed every id then flushed.
  std::string decode(std::span<const int32_t> ids, bool special = false) const;

  struct Impl;

 private:
  Tokenizer();
  std::unique_ptr<Impl> impl_;
  friend class Detokenizer;
};

// Streaming detokenizer: feed ids one by one, get back only complete valid UTF-8. Incomplete multi-byte
// sequences are held back until complete; bytes that can never become valid are replaced by U+FFFD
// (one per maximal ill-formed subpart) as soon as that is certain, and an incomplete tail by one U+FFFD
// at flush(). For SentencePiece vocabs with add_space_prefix, the single leading space of the first
// non-empty piece (the dummy prefix, also after BOS) is dropped, so decode(encode(s)) == s.
// No clean-up of spaces before punctuation (llama.cpp's clean_spaces is not applied).
class Detokenizer {
 public:
  explicit Detokenizer(const Tokenizer& tokenizer, bool special = false);
  std::string feed(int32_t id);
  std::string flush();
  void reset();  // start a new text (the leading-space rule applies again)
  size_t held_bytes() const { return pending_.size(); }  // fed but not yet returned (incomplete UTF-8)

 private:
  const Tokenizer& tok_;
  bool special_;
  bool strip_space_;
  bool at_start_ = true;
  std::string pending_;
};

// Valid UTF-8 from arbitrary bytes: ill-formed subparts become U+FFFD (WHATWG / Unicode "maximal
// subpart" practice), so valid input is returned unchanged.
std::string sanitize_utf8(std::string_view bytes);
bool is_valid_utf8(std::string_view bytes);

}  // namespace towers
