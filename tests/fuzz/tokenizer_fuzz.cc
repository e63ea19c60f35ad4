// libFuzzer target for the tokenizers on arbitrary bytes (engine/text/tokenizer.h), with small
// vocabularies built here: SentencePiece with byte fallback, and byte-level BPE under the llama-bpe
// and qwen2 pre-tokenizers (their regexes run through PCRE2). For every input and tokenizer, with and
// without special-token parsing: every id is in the vocabulary; without special tokens the pieces put
// back together are the input (byte fallback and byte-level BPE lose nothing); the streaming
// detokenizer returns valid UTF-8 only and the same text as decode().
#include <memory>

#include "engine/gguf/gguf.h"
#include "engine/text/tokenizer.h"
#include "fuzz/fuzz_support.h"

using namespace towers;

namespace {
constexpr const char* kTarget = "tokenizer_fuzz";

// Token types of GGUF: 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte.
std::unique_ptr<Tokenizer> load(GgufWriter& w, std::vector<uint8_t>& storage) {
  storage = w.to_bytes();
  auto f = GgufFile::from_memory(storage.data(), storage.size());
  if (!f.ok()) fuzz::die(kTarget, "the built vocabulary does not parse: " + f.error());
  auto t = Tokenizer::from_gguf(**f);
  if (!t.ok()) fuzz::die(kTarget, "the built vocabulary does not load: " + t.error());
  return std::move(*t);
}

std::unique_ptr<Tokenizer> spm_vocab() {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {2, 3, 3};
  char hex[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    tokens.push_back(hex);
    scores.push_back(0);
    types.push_back(6);
  }
  const char* pieces[] = {"\xE2\x96\x81", "a", "b", "e", "h", "t", "\xE2\x96\x81" "a", "ab", "th", "he",
                          "\xE2\x96\x81th", "\xE2\x96\x81the", "\xC3\xA9", "\xE6\x88\x91", "\xE2\x96\x81\xE2\x96\x81"};
  float score = -1;
  for (const char* p : pieces) {
    tokens.push_back(p);
    scores.push_back(score -= 0.5f);
    types.push_back(1);
  }
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_f32_array("tokenizer.ggml.scores", scores);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  static std::vector<uint8_t> storage;
  return load(w, storage);
}

// GPT-2's byte-level alphabet: each byte as one code point (printable bytes as themselves).
std::string byte_char(int b) {
  int cp = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
    int n = 0;
    for (int x = 0; x < b; ++x) n += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174);
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

std::unique_ptr<Tokenizer> bpe_vocab(const char* pre, std::vector<uint8_t>& storage) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(byte_char(b));
  const std::string sp = byte_char(' ');
  const std::vector<std::pair<std::string, std::string>> merges = {
      {sp, "t"}, {"h", "e"}, {sp + "t", "he"}, {"i", "n"}, {sp, "a"}, {"1", "2"}, {byte_char(0xC3), byte_char(0xA9)}};
  std::vector<std::string> merge_lines;
  for (const auto& [a, b] : merges) {
    tokens.push_back(a + b);
    merge_lines.push_back(a + " " + b);
  }
  std::vector<int32_t> types(tokens.size(), 1);
  for (const char* special : {"<|begin_of_text|>", "<|eot_id|>"}) {
    tokens.push_back(special);
    types.push_back(3);
  }
  tokens.push_back("<think>");
  types.push_back(4);
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", pre);
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_string_array("tokenizer.ggml.merges", merge_lines);
  w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(tokens.size() - 3));
  w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(tokens.size() - 2));
  return load(w, storage);
}

// The pieces put back together, the SentencePiece dummy-prefix space removed (no UTF-8 repair).
std::string raw_pieces(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string s;
  bool start = true;
  for (int32_t id : ids) {
    std::string p = tok.token_to_piece(id);
    if (p.empty()) continue;
    if (start && tok.is_spm() && p[0] == ' ') p.erase(0, 1);
    start = false;
    s += p;
  }
  return s;
}

void check(const Tokenizer& tok, std::string_view text, const char* name) {
  for (bool special : {false, true}) {
    const auto ids = tok.encode(text, /*add_bos=*/special, special);
    for (int32_t id : ids) {
      if (id < 0 || id >= tok.n_vocab()) fuzz::die(kTarget, std::string(name) + ": an id outside the vocabulary");
    }
    const bool spm_space = tok.is_spm() && text.find("\xE2\x96\x81") != std::string_view::npos;  // SPM's own space
    if (!special && !spm_space && raw_pieces(tok, ids) != text) {
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
  static const auto spm = spm_vocab();
  static std::vector<uint8_t> llama_storage, qwen_storage;
  static const auto llama_bpe = bpe_vocab("llama-bpe", llama_storage);
  static const auto qwen2 = bpe_vocab("qwen2", qwen_storage);
  const std::string_view text = fuzz::text_of(data, size);
  check(*spm, text, "spm");
  check(*llama_bpe, text, "llama-bpe");
  check(*qwen2, text, "qwen2");
  return 0;
}
