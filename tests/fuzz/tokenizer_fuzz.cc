// libFuzzer target for the tokenizers on arbitrary bytes (engine/text/tokenizer.h), with small
// vocabularies built here: SentencePiece with byte fallback, and byte-level BPE under the llama-bpe,
// qwen2, tekken, starcoder, falcon and deepseek-llm pre-tokenizers (their regex stages run through
// PCRE2: engine/text/pretokenizer.h). For every input and tokenizer, with and
// without special-token parsing: every id is in the vocabulary; without special tokens the pieces put
// back together are the input (byte fallback and byte-level BPE lose nothing); the streaming
// detokenizer returns valid UTF-8 only and the same text as decode().
#include <iterator>
#include <memory>

#include "engine/gguf/gguf.h"
#include "engine/text/tokenizer.h"
#include "engine/text/vocab_import.h"
#include "fuzz/fuzz_support.h"
#include "token_pieces.h"

using namespace towers;

namespace {
constexpr const char* kTarget = "tokenizer_fuzz";

// A vocabulary as a GGUF holds it, loaded. Token types: 1 normal, 2 unknown, 3 control, 4
// user-defined, 6 byte. storage must outlive the tokenizer.
struct Vocab {
  std::string model, pre;
  std::vector<std::string> tokens, merges;
  std::vector<float> scores;
  std::vector<int32_t> types;
  uint32_t bos = 0, eos = 0;

  void add(std::string piece, int32_t type, float score = 0) {
    tokens.push_back(std::move(piece));
    types.push_back(type);
    scores.push_back(score);
  }
  std::unique_ptr<Tokenizer> load(std::vector<uint8_t>& storage) const {
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    w.set_string("tokenizer.ggml.model", model);
    if (!pre.empty()) w.set_string("tokenizer.ggml.pre", pre);
    w.set_string_array("tokenizer.ggml.tokens", tokens);
    if (model == "llama") w.set_f32_array("tokenizer.ggml.scores", scores);
    w.set_i32_array("tokenizer.ggml.token_type", types);
    if (!merges.empty()) w.set_string_array("tokenizer.ggml.merges", merges);
    w.set_u32("tokenizer.ggml.bos_token_id", bos);
    w.set_u32("tokenizer.ggml.eos_token_id", eos);
    storage = w.to_bytes();
    auto f = GgufFile::from_memory(storage.data(), storage.size());
    if (!f.ok()) fuzz::die(kTarget, "the built vocabulary does not parse: " + f.error());
    auto t = Tokenizer::from_gguf(**f);
    if (!t.ok()) fuzz::die(kTarget, "the built vocabulary does not load: " + t.error());
    return std::move(*t);
  }
};

// SentencePiece: control tokens, a byte-fallback token per byte, pieces with falling scores.
std::unique_ptr<Tokenizer> spm_vocab(std::vector<uint8_t>& storage) {
  Vocab v{.model = "llama", .bos = 1, .eos = 2};
  v.add("<unk>", 2);
  v.add("<s>", 3);
  v.add("</s>", 3);
  char hex[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    v.add(hex, 6);
  }
  float score = -1;
  for (const char* p : {"\xE2\x96\x81", "a", "b", "e", "h", "t", "\xE2\x96\x81" "a", "ab", "th", "he",
                        "\xE2\x96\x81th", "\xE2\x96\x81the", "\xC3\xA9", "\xE6\x88\x91", "\xE2\x96\x81\xE2\x96\x81"}) {
    v.add(p, 1, score -= 0.5f);
  }
  return v.load(storage);
}

// Byte-level BPE: the 256 byte tokens, a few merges, control and user-defined tokens.
std::unique_ptr<Tokenizer> bpe_vocab(const char* pre, std::vector<uint8_t>& storage) {
  Vocab v{.model = "gpt2", .pre = pre};
  for (const std::string& b : byte_level_alphabet()) v.add(b, 1);
  const std::string sp = v.tokens[' '];
  const std::vector<std::pair<std::string, std::string>> merges = {
      {sp, "t"}, {"h", "e"}, {sp + "t", "he"}, {"i", "n"}, {sp, "a"}, {"1", "2"}, {v.tokens[0xC3], v.tokens[0xA9]}};
  for (const auto& [a, b] : merges) {
    v.add(a + b, 1);
    v.merges.push_back(a + " " + b);
  }
  v.bos = static_cast<uint32_t>(v.tokens.size());
  v.add("<|begin_of_text|>", 3);
  v.eos = static_cast<uint32_t>(v.tokens.size());
  v.add("<|eot_id|>", 3);
  v.add("<think>", 4);
  return v.load(storage);
}

void check(const Tokenizer& tok, std::string_view text, const char* name) {
  for (bool special : {false, true}) {
    const auto ids = tok.encode(text, /*add_bos=*/special, special);
    for (int32_t id : ids) {
      if (id < 0 || id >= tok.n_vocab()) fuzz::die(kTarget, std::string(name) + ": an id outside the vocabulary");
    }
    const bool spm_space = tok.is_spm() && text.find("\xE2\x96\x81") != std::string_view::npos;  // SPM's own space
    if (!special && !spm_space && test::raw_pieces(tok, ids) != text) {
      fuzz::die(kTarget, std::string(name) + ": the pieces are not the input");
    }
    Detokenizer d(tok);
    std::string streamed;
    for (int32_t id : ids) {
      std::string chunk = d.feed(id);
      if (!is_valid_utf8(chunk)) fuzz::die(kTarget, std::string(name) + ": the detokenizer returned invalid UTF-8");
      streamed += chunk;
    }
    const std::string tail = d.flush();
    if (!is_valid_utf8(tail)) fuzz::die(kTarget, std::string(name) + ": the detokenizer's flush is invalid UTF-8");
    if (streamed + tail != tok.decode(ids)) fuzz::die(kTarget, std::string(name) + ": streaming differs from decode()");
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static constexpr const char* kPre[] = {"llama-bpe", "qwen2", "tekken", "starcoder", "falcon", "deepseek-llm"};
  static std::vector<uint8_t> spm_storage, bpe_storage[std::size(kPre)];
  static const auto spm = spm_vocab(spm_storage);
  static const auto bpe = [] {
    std::vector<std::unique_ptr<Tokenizer>> v;
    for (size_t i = 0; i < std::size(kPre); ++i) v.push_back(bpe_vocab(kPre[i], bpe_storage[i]));
    return v;
  }();
  const std::string_view text = fuzz::text_of(data, size);
  check(*spm, text, "spm");
  for (size_t i = 0; i < std::size(kPre); ++i) check(*bpe[i], text, kPre[i]);
  return 0;
}
