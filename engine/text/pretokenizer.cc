// Pre-tokenizer rules by name; see pretokenizer.h. The regexes are the ones llama.cpp's
// src/llama-vocab.cpp lists per LLAMA_VOCAB_PRE_TYPE (tekken: Hugging Face's original, see the header).
#include "engine/text/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

namespace towers {

namespace {

// GPT-2's regex; several families run it after splitting digits or punctuation off first.
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
// Llama 3's (Hugging Face's "(?i:'s|...)" with the contractions' cases spelled out as llama.cpp does,
// so that e.g. "'ſ" (long s) is not folded into "'s"); Qwen2's differs only in single digits.
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Mistral's tekken (Hugging Face tokenizer.json of Mistral-Nemo): a word is an optional non-letter,
// then upper-case letters followed by lower-case ones (or upper-case only); digits one by one.
constexpr const char* kTekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kDigit = R"(\p{N})";
// CJK ideographs, U+0800..U+4E00 and Hangul, as the DeepSeek tokenizers group them.
constexpr const char* kDeepseekCjk = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";

struct Rules {
  std::string_view name;
  std::vector<std::string_view> aliases;
  std::vector<const char*> stages;
  bool ignore_merges = false;
  bool bos_by_default = false;
};

const std::vector<Rules>& table() {
  static const std::vector<Rules> rules = {
      {"llama-bpe", {"llama3", "llama-v3", "falcon3"}, {kLlama3}, true, true},
      {"dbrx", {"smaug-bpe"}, {kLlama3}},
      {"qwen2", {"qwen3", "deepseek-r1-qwen", "stablelm2", "megrez"}, {kQwen2}},
      {"gpt-2", {"phi-2", "roberta-bpe", "mpt", "olmo", "jais"}, {kGpt2}},
      {"starcoder", {"refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"}, {kDigit, kGpt2}},
      {"falcon", {}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, R"([0-9][0-9][0-9])"}},
      {"deepseek-llm",
       {},
       {R"([\r\n])",
        R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)",
        R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)", R"(\s+$)", kDeepseekCjk, R"(\p{N}+)"}},
      {"deepseek-coder", {}, {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, kDigit}},
      {"tekken", {}, {kTekken}, true, true},
  };
  return rules;
}

const Rules* find_rules(std::string_view name) {
  for (const Rules& r : table()) {
    if (r.name == name || std::find(r.aliases.begin(), r.aliases.end(), name) != r.aliases.end()) return &r;
  }
  return nullptr;
}

// Length of the UTF-8 sequence a lead byte announces (1 for continuation and invalid bytes).
size_t char_len(uint8_t b) {
  return b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : b < 0xF8 ? 4 : 1;
}

struct CodeFree {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};

}  // namespace

struct PreTokenizer::Impl {
  const Rules* rules = nullptr;
  std::vector<std::unique_ptr<pcre2_code, CodeFree>> stages;

  // Appends the words of text[w] under stage re: its matches and the text between them.
  void split_word(const pcre2_code* re, pcre2_match_data* md, std::string_view text, Word w,
                  std::vector<Word>& out) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + w.offset);
    const size_t n = w.length;
    size_t gap = 0, pos = 0;  // [gap, match start) is text between matches
    auto emit = [&](size_t a, size_t b) {
      if (b > a) out.push_back({w.offset + a, b - a});
    };
    while (pos < n) {
      int rc = pcre2_match(re, subject, n, pos, 0, md, nullptr);
      if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
        rc = pcre2_match(re, subject, n, pos, PCRE2_NO_JIT, md, nullptr);  // e.g. JIT stack limit
      }
      if (rc < 0) break;  // no further match (any other error cannot happen with these patterns)
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t s = ov[0], e = ov[1];
      if (s < pos || e > n || e < s) break;  // defensive
      if (e == s) {  // empty match: no word here, search on from the next character
        pos = s + std::min(char_len(uint8_t(subject[s])), n - s);
        continue;
      }
      emit(gap, s);
      emit(s, e);
      gap = pos = e;
    }
    emit(gap, n);
  }
};

PreTokenizer::PreTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

std::string PreTokenizer::supported_names() {
  std::string out;
  for (const Rules& r : table()) {
    if (!out.empty()) out += ", ";
    out += r.name;
    for (size_t i = 0; i < r.aliases.size(); ++i) {
      out += i == 0 ? " (aliases " : ", ";
      out += r.aliases[i];
    }
    if (!r.aliases.empty()) out += ")";
  }
  return out;
}

Result<PreTokenizer> PreTokenizer::create(std::string_view name) {
  const Rules* rules = find_rules(name);
  if (!rules) {
    return Status::Error("unsupported tokenizer.ggml.pre '" + std::string(name) +
                         "' for a gpt2 (byte-level BPE) vocab; supported: " + supported_names());
  }
  auto impl = std::make_unique<Impl>();
  impl->rules = rules;
  for (const char* regex : rules->stages) {
    int errcode = 0;
    PCRE2_SIZE erroff = 0;
    pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(regex), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY,
                                   &errcode, &erroff, nullptr);
    if (!re) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(errcode, msg, sizeof msg);
      return Status::Error("cannot compile the " + std::string(rules->name) + " pre-tokenizer regex '" + regex +
                           "' at " + std::to_string(erroff) + ": " + reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // best effort: the interpreter is the fallback
    impl->stages.emplace_back(re);
  }
  return PreTokenizer(std::move(impl));
}

std::string_view PreTokenizer::name() const { return impl_->rules->name; }
bool PreTokenizer::ignore_merges() const { return impl_->rules->ignore_merges; }
bool PreTokenizer::bos_by_default() const { return impl_->rules->bos_by_default; }

std::vector<PreTokenizer::Word> PreTokenizer::split(std::string_view text) const {
  std::vector<Word> words;
  if (text.empty()) return words;
  words.push_back({0, text.size()});
  std::vector<Word> next;
  for (const auto& stage : impl_->stages) {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(stage.get(), nullptr);
    if (!md) break;  // out of memory: the words so far still cover the text
    next.clear();
    next.reserve(words.size() * 2);
    for (const Word& w : words) impl_->split_word(stage.get(), md, text, w, next);
    pcre2_match_data_free(md);
    words.swap(next);
  }
  return words;
}

}  // namespace towers
