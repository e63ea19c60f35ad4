// Real vocabularies for tests, loaded once per process: a GGUF's tokenizer (e.g. stories260K's
// SentencePiece vocab) or a Hugging Face tokenizer.json converted to a vocab GGUF (Llama 3's byte-level
// BPE). nullptr, with a SKIP message, when the shared data is absent.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "engine/gguf/gguf.h"
#include "engine/text/tokenizer.h"
#include "engine/text/vocab_import.h"
#include "test_support.h"

namespace towers::test {

namespace detail {
struct LoadedVocab {
  std::shared_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
};
inline const Tokenizer* load_vocab(const std::string& key, const std::filesystem::path& gguf) {
  static std::map<std::string, LoadedVocab> cache;
  if (auto it = cache.find(key); it != cache.end()) return it->second.tok.get();
  auto f = GgufFile::open(gguf.string());
  REQUIRE_MESSAGE(f.ok(), f.error());
  LoadedVocab l;
  l.file = f.value();
  auto t = Tokenizer::from_gguf(*l.file);
  REQUIRE_MESSAGE(t.ok(), t.error());
  l.tok = std::move(t.value());
  return (cache[key] = std::move(l)).tok.get();
}
}  // namespace detail

// The tokenizer of shared/<rel> (a model or vocab GGUF).
inline const Tokenizer* shared_gguf_vocab(const std::string& rel) {
  auto p = shared_file(rel);
  if (p.empty()) return nullptr;
  return detail::load_vocab(rel, p);
}

// shared/<json_rel> (tokenizer.json, BPE) converted with tokenizer.ggml.pre = pre, written once per
// build tree as test-tmp/<file_tag>-<pre>.gguf (each test executable passes its own tag).
inline const Tokenizer* shared_hf_vocab(const std::string& json_rel, const std::string& pre,
                                        const std::string& file_tag) {
  auto json = shared_file(json_rel);
  if (json.empty()) return nullptr;
  const auto gguf = temp_dir() / (file_tag + "-" + pre + ".gguf");
  if (!std::filesystem::exists(gguf)) {
    GgufWriter w;
    HfVocabOptions opt;
    opt.pre = pre;
    auto n = add_hf_bpe_tokenizer(w, json.string(), opt);
    REQUIRE_MESSAGE(n.ok(), n.error());
    Status s = w.write(gguf.string());
    REQUIRE_MESSAGE(s.ok(), s.message());
  }
  return detail::load_vocab(json_rel + "#" + pre, gguf);
}

}  // namespace towers::test
